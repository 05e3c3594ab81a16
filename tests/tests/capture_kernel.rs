//! In-kernel capture of slow SKBs on the running kernel: arming a service, the records'
//! contents, silence while disarmed, the rate limit. Root.

// Tests may unwrap: a panic with the error is the report.
#![allow(clippy::unwrap_used)]

// Shared with the probe tests; capture uses part of it.
#[allow(dead_code)]
mod probes_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bpf::{
    capture_counters, AttachMethod, CaptureControl, CaptureLimits, CaptureReader, CaptureRecord,
    ProbeConfig, ProbeSet,
};
use model::{Probe, Transport};
use probes_support::{client, load, server, service};
use tailtrap_tests::{run_client, Cgroup, Proto, TcpServer};

const MS: u64 = 1_000_000;
const SLOW_READ: Duration = Duration::from_millis(20);

/// A 20 ms reader in its own cgroup, configured as service "slow" by cgroup and port.
fn slow_service(name: &str) -> (Cgroup, TcpServer, ProbeSet) {
    let cgroup = Cgroup::create(name).unwrap();
    let srv = TcpServer::spawn(server(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        None,
        Some(&cgroup),
        SLOW_READ,
    ))
    .unwrap();
    let config = ProbeConfig {
        services: vec![service("slow", Some(&cgroup), &[srv.addr().port()])],
        ..ProbeConfig::default()
    };
    let set = load(&config);
    (cgroup, srv, set)
}

/// Everything the reader has handed over within `wait` after the traffic.
fn drain(reader: &CaptureReader, wait: Duration) -> Vec<CaptureRecord> {
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match reader.records().recv_timeout(left) {
            Ok(r) => out.push(r),
            Err(_) => break,
        }
    }
    out
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn armed_service_records_slow_reads_with_flow_cgroup_and_reader_process() {
    let (cgroup, srv, mut set) = slow_service("tt-capture-armed");
    let slot = set
        .service_slot("slow")
        .unwrap()
        .expect("slot of service slow");
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default()).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    let threshold = 10 * MS;
    control
        .arm(&mut set, slot, &[(Probe::TcpSocketRead, threshold)])
        .unwrap();

    let stats = run_client(client(srv.addr(), None, Proto::Tcp, 20)).unwrap();
    assert_eq!(stats.replies, 20);
    let records = drain(&reader, Duration::from_millis(500));

    let reads: Vec<&CaptureRecord> = records
        .iter()
        .filter(|r| r.sample.probe == Probe::TcpSocketRead)
        .collect();
    assert!(
        reads.len() >= 10,
        "expected most of 20 slow reads, got {records:#?}"
    );
    let task_comms = thread_comms(srv.pid());
    let skb_at_read = set
        .attachments()
        .iter()
        .any(|a| a.probe == Probe::TcpSocketRead && matches!(a.method, AttachMethod::TpBtf { .. }));
    for r in &reads {
        let s = &r.sample;
        assert_eq!(r.service_slot, slot);
        assert!(!r.flight);
        assert_eq!(s.flow.transport, Transport::Tcp);
        assert_eq!(s.flow.dport, srv.addr().port(), "{s:?}");
        assert_eq!(s.flow.dst, srv.addr().ip());
        assert!(s.latency_ns >= threshold, "{s:?}");
        assert_eq!(s.cgroup_id, cgroup.id(), "{s:?}");
        assert_eq!(s.pid, Some(srv.pid()), "{s:?}");
        assert!(
            task_comms.iter().any(|c| c == s.comm.as_str()),
            "comm {:?} is none of the reader's threads {task_comms:?}",
            s.comm
        );
        assert!(s.socket_queue.is_some(), "{s:?}");
        // fentry/tcp_recv_timestamp sees the socket only; tp_btf sees the skb read.
        if skb_at_read {
            assert!(s.tcp_seq.is_some() && s.skb_len > 0, "{s:?}");
            // The address pwru prints: a kernel pointer.
            assert!(s.skb.is_some_and(|a| a >= 0xffff_8000_0000_0000), "{s:?}");
        } else {
            assert!(
                s.tcp_seq.is_none() && s.skb_len == 0 && s.skb.is_none(),
                "{s:?}"
            );
        }
        assert!(s.netns_ino != 0, "{s:?}");
    }
    assert_eq!(set.service_name(slot).unwrap(), "slow");
    let counters = capture_counters(&mut set).unwrap();
    assert!(counters.emitted >= reads.len() as u64, "{counters:?}");
    assert_eq!(counters.ring_full, 0, "{counters:?}");
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn nothing_is_recorded_while_disarmed() {
    let (_cgroup, srv, mut set) = slow_service("tt-capture-disarmed");
    let slot = set.service_slot("slow").unwrap().unwrap();
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default()).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    // Armed and disarmed again: the thresholds must stop mattering.
    control
        .arm(&mut set, slot, &[(Probe::TcpSocketRead, MS)])
        .unwrap();
    control.disarm(&mut set, slot).unwrap();
    assert!(!control.is_armed(slot));

    let stats = run_client(client(srv.addr(), None, Proto::Tcp, 10)).unwrap();
    assert_eq!(stats.replies, 10);
    let records = drain(&reader, Duration::from_millis(300));
    assert!(records.is_empty(), "{records:#?}");
    assert_eq!(capture_counters(&mut set).unwrap().emitted, 0);
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn rate_limit_caps_records_and_counts_the_rest() {
    let (_cgroup, srv, mut set) = slow_service("tt-capture-rate");
    srv.set_read_delay(Duration::ZERO).unwrap();
    let slot = set.service_slot("slow").unwrap().unwrap();
    let limits = CaptureLimits {
        rate_limit: 50,
        ..CaptureLimits::default()
    };
    let mut control = CaptureControl::new(&mut set, &limits).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    // 1 ns: every SKB at every probe of the service qualifies.
    let all: Vec<(Probe, u64)> = Probe::ALL.iter().map(|&p| (p, 1)).collect();
    control.arm(&mut set, slot, &all).unwrap();

    let started = Instant::now();
    let stats = run_client(client(srv.addr(), None, Proto::Tcp, 3000)).unwrap();
    let elapsed = started.elapsed();
    assert_eq!(stats.replies, 3000);
    control.disarm_all(&mut set).unwrap();
    let records = drain(&reader, Duration::from_millis(300));

    // GCRA: one per 20 ms plus a 100 ms burst (6 records), and one interval of slack.
    let allowed = (elapsed.as_secs_f64() * 50.0).ceil() as usize + 7;
    let counters = capture_counters(&mut set).unwrap();
    assert!(
        records.len() <= allowed,
        "{} records in {elapsed:?} (allowed {allowed}); {counters:?}",
        records.len()
    );
    assert!(!records.is_empty());
    assert!(counters.rate_limited > 0, "{counters:?}");
    assert_eq!(counters.emitted, records.len() as u64, "{counters:?}");
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn flight_recorder_uses_its_own_threshold_and_marks_its_records() {
    let (_cgroup, srv, mut set) = slow_service("tt-capture-flight");
    let slot = set.service_slot("slow").unwrap().unwrap();
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default()).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    control
        .set_flight_thresholds(&mut set, slot, &[(Probe::TcpSocketRead, 10 * MS)])
        .unwrap();

    let stats = run_client(client(srv.addr(), None, Proto::Tcp, 10)).unwrap();
    assert_eq!(stats.replies, 10);
    let records = drain(&reader, Duration::from_millis(300));
    assert!(!records.is_empty());
    for r in &records {
        assert!(r.flight, "{r:?}");
        assert_eq!(r.sample.probe, Probe::TcpSocketRead);
        assert!(r.sample.latency_ns >= 10 * MS, "{r:?}");
    }
    let counters = capture_counters(&mut set).unwrap();
    assert_eq!(counters.flight_emitted, records.len() as u64);
    assert_eq!(counters.emitted, 0);
}

/// Command names of a process and its live threads (unnamed threads share the process's).
fn thread_comms(pid: u32) -> Vec<String> {
    let mut comms = vec![std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap()];
    comms.extend(
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()),
    );
    comms.into_iter().map(|c| c.trim_end().to_owned()).collect()
}
