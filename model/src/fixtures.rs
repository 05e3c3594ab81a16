//! Sample builders for tests and benchmarks of every crate (cargo feature `fixtures`), so a
//! new field of [`Sample`] is filled in one place; the one setting of every crate's
//! property tests ([`fuzz_config`]); and the one writer of every crate's golden files
//! ([`write_missing_golden`]).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use crate::{Comm, Flow, Probe, Sample, SampleFlags, SocketQueue, Transport};

/// A TCP sample of `incident` at `time_ns` whose fields vary with `i`, so filters and
/// summaries have something to tell: every 4th is at tcp-socket-enqueued (the others at
/// tcp-socket-read), the source cycles over 10.0.0.1-5 and ports 40000-40006, `tcp_seq` is
/// `i`, and the first ten (`i < 10`) are marked pre-trigger.
pub fn sample(incident: u64, i: u64, time_ns: u64) -> Sample {
    Sample {
        time_ns,
        incident,
        probe: if i % 4 == 0 {
            Probe::TcpSocketEnqueued
        } else {
            Probe::TcpSocketRead
        },
        latency_ns: 1_000_000 + (i % 100) * 100_000,
        flow: Flow {
            transport: Transport::Tcp,
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, (i % 5) as u8 + 1)),
            sport: 40_000 + (i % 7) as u16,
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)),
            dport: 8080,
        },
        cgroup_id: 77,
        pid: Some(1000 + (i % 3) as u32),
        comm: Comm::from_kernel(b"server\0"),
        cpu: (i % 2) as u32,
        ifindex: 2,
        netns_ino: 4026531840,
        skb_len: 1448,
        socket_queue: Some(SocketQueue {
            bytes: 2896,
            skbs: 2,
            rmem_alloc: 4608,
            rcvbuf: 131072,
        }),
        tcp_seq: Some(i as u32),
        flags: if i < 10 {
            SampleFlags::PRE_TRIGGER
        } else {
            SampleFlags::empty()
        },
        skb: Some(0xffff_8880_0400_0000 + (i << 8)),
        reader_wait: None,
        rx_queue: None,
    }
}

/// The settings of a property test: `TAILTRAP_FUZZ_CASES` cases (`tests/fuzz/run.sh` sets
/// it high), else `default`, a budget that keeps CI quick; no failure files written into
/// the source tree.
#[cfg(feature = "fixtures")]
pub fn fuzz_config(default: u32) -> proptest::test_runner::Config {
    let cases = std::env::var("TAILTRAP_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// Writes those of `files` (a name and what makes its bytes) that `dir` lacks, when
/// `TAILTRAP_WRITE_GOLDEN` is set: the body of every crate's ignored `write_golden_*` test.
/// A golden file is what some build wrote: never replaced.
#[allow(clippy::unwrap_used)] // a test helper: a failed write fails the test
pub fn write_missing_golden<M: Fn() -> Vec<u8>>(dir: &Path, files: &[(&str, M)]) {
    if std::env::var_os("TAILTRAP_WRITE_GOLDEN").is_none() {
        return;
    }
    std::fs::create_dir_all(dir).unwrap();
    for (name, make) in files {
        let path = dir.join(name);
        if !path.exists() {
            std::fs::write(&path, make()).unwrap();
        }
    }
}
