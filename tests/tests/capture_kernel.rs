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
use tailtrap_tests::{pin, run_client, Cgroup, Hog, Proto, TcpServer};

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

/// The reader-wait split where the kernel has task storage (5.11+), none where it has not.
/// Records of a thread's first slow read carry none: it is followed from then on.
fn reads_with_wait<'a>(set: &ProbeSet, records: &'a [CaptureRecord]) -> Vec<&'a CaptureRecord> {
    let with: Vec<&CaptureRecord> = records
        .iter()
        .filter(|r| r.sample.probe == Probe::TcpSocketRead && r.sample.reader_wait.is_some())
        .collect();
    if let Err(why) = set.reader_wait() {
        assert!(with.is_empty(), "no split expected ({why}): {with:#?}");
    }
    with
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn a_sleeping_readers_slow_reads_are_split_as_off_cpu() {
    let (_cgroup, srv, mut set) = slow_service("tt-capture-off-cpu");
    let slot = set.service_slot("slow").unwrap().unwrap();
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default()).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    assert!(!set.following_readers(), "hooks attached before arming");
    control
        .arm(&mut set, slot, &[(Probe::TcpSocketRead, 10 * MS)])
        .unwrap();
    assert_eq!(set.following_readers(), set.reader_wait().is_ok());

    let stats = run_client(client(srv.addr(), None, Proto::Tcp, 20)).unwrap();
    assert_eq!(stats.replies, 20);
    let records = drain(&reader, Duration::from_millis(500));
    let split = reads_with_wait(&set, &records);
    if set.reader_wait().is_ok() {
        // The thread sleeps 20 ms before each read: the packets wait for a sleeper.
        let off: u64 = split
            .iter()
            .map(|r| r.sample.reader_wait.unwrap().off_cpu_ns)
            .sum();
        let latency: u64 = split.iter().map(|r| r.sample.latency_ns).sum();
        eprintln!(
            "{} slow reads split: off CPU {off} of {latency} ns",
            split.len()
        );
        assert!(split.len() >= 10, "expected most reads split: {records:#?}");
        for r in &split {
            let (s, w) = (&r.sample, r.sample.reader_wait.unwrap());
            assert!(
                w.off_cpu_ns >= s.latency_ns / 2,
                "a sleeping reader's wait is mostly off CPU: {s:?}"
            );
            assert!(w.runq_ns + w.off_cpu_ns <= s.latency_ns, "{s:?}");
        }
    }
    control.disarm(&mut set, slot).unwrap();
    assert!(
        !set.following_readers(),
        "hooks still attached after disarming"
    );
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn a_reader_sharing_its_cpu_with_hogs_waits_in_the_run_queue() {
    let cgroup = Cgroup::create("tt-capture-runq").unwrap();
    let srv = TcpServer::spawn(server(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        None,
        Some(&cgroup),
        Duration::ZERO,
    ))
    .unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = cpus - 1;
    pin(srv.pid(), cpu).unwrap();
    let hogs: Vec<Hog> = (0..3).map(|_| Hog::spawn(Some(cpu)).unwrap()).collect();
    let config = ProbeConfig {
        services: vec![service("busy", Some(&cgroup), &[srv.addr().port()])],
        ..ProbeConfig::default()
    };
    let mut set = load(&config);
    let slot = set.service_slot("busy").unwrap().unwrap();
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default()).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    control
        .arm(&mut set, slot, &[(Probe::TcpSocketRead, MS / 2)])
        .unwrap();

    let stats = run_client(client(srv.addr(), None, Proto::Tcp, 1000)).unwrap();
    assert_eq!(stats.replies, 1000);
    let records = drain(&reader, Duration::from_millis(500));
    let hog_pids: Vec<u32> = hogs.iter().map(Hog::pid).collect();
    drop(hogs);
    let split = reads_with_wait(&set, &records);
    if set.reader_wait().is_err() {
        return;
    }
    assert!(split.len() >= 5, "expected slow reads split: {records:#?}");
    // The reader never sleeps on purpose: its packets wait for the CPU the hogs hold.
    let latency: u64 = split.iter().map(|r| r.sample.latency_ns).sum();
    let runq: u64 = split
        .iter()
        .map(|r| r.sample.reader_wait.unwrap().runq_ns)
        .sum();
    eprintln!(
        "{} of {} slow reads split: run queue {runq} of {latency} ns",
        split.len(),
        records.len()
    );
    assert!(
        runq >= latency / 2,
        "run-queue share {runq} of {latency} ns: {split:#?}"
    );
    let held_by_hog = split
        .iter()
        .filter_map(|r| r.sample.reader_wait.unwrap().cpu_holder)
        .filter(|h| hog_pids.contains(&h.pid))
        .count();
    assert!(
        held_by_hog > 0,
        "no hog named as the CPU's holder: {split:#?}"
    );
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
