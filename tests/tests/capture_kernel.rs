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
        // What the cause verdict reads: the slow reads' waits summed (cause.rs). One read
        // of 19 in a 6.12 guest under emulation split only 0.3 ms of its 25 ms (why is not
        // known; the other 18 held 86 % off CPU together): a single read may not show
        // it, the reads together must, and most reads on their own.
        assert!(
            off >= latency / 2,
            "a sleeping reader's waits are mostly off CPU: {off} of {latency} ns"
        );
        let mostly_off = split
            .iter()
            .filter(|r| r.sample.reader_wait.unwrap().off_cpu_ns >= r.sample.latency_ns / 2)
            .count();
        assert!(
            mostly_off * 4 >= split.len() * 3,
            "{mostly_off} of {} reads mostly off CPU: {split:#?}",
            split.len()
        );
        // Never more than the delay it splits.
        for r in &split {
            let (s, w) = (&r.sample, r.sample.reader_wait.unwrap());
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

/// A multi-queue TUN device (`IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE`) in the host's
/// namespace, one file per queue: a packet written to queue `k`'s file enters the stack as
/// received on RX queue `k` (the driver records it in the skb). Addressed `10.201.N.1/24`;
/// the device goes away with its last file.
struct MultiQueueTun {
    name: String,
    queues: Vec<std::fs::File>,
    local: Ipv4Addr,
    peer: Ipv4Addr,
    ifindex: u32,
}

impl MultiQueueTun {
    /// `None` when the kernel has no TUN driver (no `/dev/net/tun`).
    fn create(queues: usize) -> Option<MultiQueueTun> {
        use std::os::fd::AsRawFd;
        const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
        const IFF_TUN: libc::c_short = 0x0001;
        const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
        const IFF_NO_PI: libc::c_short = 0x1000;
        let name = format!("ttq{}", std::process::id() % 100_000);
        let mut files = Vec::new();
        for _ in 0..queues {
            let file = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
            {
                Ok(f) => f,
                Err(e) if files.is_empty() => {
                    eprintln!("no TUN device here (/dev/net/tun: {e})");
                    return None;
                }
                Err(e) => panic!("/dev/net/tun: {e}"),
            };
            // struct ifreq: the name, then the flags (a short) in the union.
            let mut ifreq = [0u8; 40];
            ifreq[..name.len()].copy_from_slice(name.as_bytes());
            let flags = IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE;
            ifreq[16..18].copy_from_slice(&flags.to_ne_bytes());
            // SAFETY: TUNSETIFF reads and writes a struct ifreq, 40 bytes on x86-64.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, ifreq.as_mut_ptr()) };
            assert_eq!(
                r,
                0,
                "TUNSETIFF {name}: {}",
                std::io::Error::last_os_error()
            );
            files.push(file);
        }
        let net = std::process::id() % 250 + 1;
        let local = Ipv4Addr::new(10, 201, net as u8, 1);
        let peer = Ipv4Addr::new(10, 201, net as u8, 2);
        ip(&["addr", "add", &format!("{local}/24"), "dev", &name]);
        ip(&["link", "set", &name, "up"]);
        let ifindex = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Some(MultiQueueTun {
            name,
            queues: files,
            local,
            peer,
            ifindex,
        })
    }

    /// A UDP datagram from the peer (`sport`) to the local address (`dport`), written to
    /// queue `queue`: it comes in on that RX queue.
    fn send_udp(&mut self, queue: usize, sport: u16, dport: u16) {
        use std::io::Write;
        let payload = [0x5au8; 32];
        let udp_len = 8 + payload.len();
        let total = 20 + udp_len;
        let mut p = Vec::with_capacity(total);
        p.extend_from_slice(&[
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0x40,
            0,
            64,
            17,
        ]);
        p.extend_from_slice(&[0, 0]); // header checksum, below
        p.extend_from_slice(&self.peer.octets());
        p.extend_from_slice(&self.local.octets());
        let sum = p
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        let sum = !((sum & 0xffff) + (sum >> 16)) as u16;
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&(udp_len as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]); // no UDP checksum (IPv4 allows it)
        p.extend_from_slice(&payload);
        self.queues[queue].write_all(&p).unwrap();
    }
}

impl Drop for MultiQueueTun {
    fn drop(&mut self) {
        // Closing the queues' files removes the (non-persistent) device.
        self.queues.clear();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.name])
            .output();
    }
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Records carry the RX queue the receiving driver recorded in the skb: a multi-queue TUN
/// device records the queue each packet was written to (drivers/net/tun.c,
/// `skb_record_rx_queue`), at every probe of the packet's path, the read included; the
/// loopback device records none.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn records_carry_the_rx_queue_the_driver_recorded() {
    use std::net::UdpSocket;
    const QUEUES: usize = 4;
    const PER_QUEUE: u16 = 5;
    let Some(mut tun) = MultiQueueTun::create(QUEUES) else {
        return;
    };
    // One socket per queue: queue k's packets go to on_tun[k]'s port (an unconnected
    // socket's records have the local end only).
    let on_tun: Vec<UdpSocket> = (0..QUEUES)
        .map(|_| UdpSocket::bind((tun.local, 0)).unwrap())
        .collect();
    let tun_ports: Vec<u16> = on_tun
        .iter()
        .map(|s| s.local_addr().unwrap().port())
        .collect();
    let on_lo = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let lo_port = on_lo.local_addr().unwrap().port();
    let mut ports = tun_ports.clone();
    ports.push(lo_port);
    let config = ProbeConfig {
        services: vec![service("rxq", None, &ports)],
        ..ProbeConfig::default()
    };
    let mut set = load(&config);
    let slot = set.service_slot("rxq").unwrap().unwrap();
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default()).unwrap();
    let reader = CaptureReader::start(&mut set).unwrap();
    // 1 ns: every packet of the service at every probe is recorded.
    let all: Vec<(Probe, u64)> = Probe::ALL.iter().map(|&p| (p, 1)).collect();
    control.arm(&mut set, slot, &all).unwrap();

    for (k, &port) in tun_ports.iter().enumerate() {
        for _ in 0..PER_QUEUE {
            tun.send_udp(k, 40_000 + k as u16, port);
        }
    }
    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    for _ in 0..PER_QUEUE {
        sender
            .send_to(b"over loopback", on_lo.local_addr().unwrap())
            .unwrap();
    }
    let mut buf = [0u8; 256];
    for sock in on_tun.iter().chain([&on_lo]) {
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        for _ in 0..PER_QUEUE {
            sock.recv_from(&mut buf).expect("a datagram");
        }
    }
    let records = drain(&reader, Duration::from_millis(500));
    control.disarm_all(&mut set).unwrap();

    let tun_records: Vec<&CaptureRecord> = records
        .iter()
        .filter(|r| tun_ports.contains(&r.sample.flow.dport))
        .collect();
    let lo_records: Vec<&CaptureRecord> = records
        .iter()
        .filter(|r| r.sample.flow.dport == lo_port)
        .collect();
    let probes = |rs: &[&CaptureRecord]| {
        let mut p: Vec<Probe> = rs.iter().map(|r| r.sample.probe).collect();
        p.sort_by_key(|p| p.id());
        p.dedup();
        p
    };
    eprintln!(
        "{} records from the TUN device at {:?}, {} over loopback at {:?}",
        tun_records.len(),
        probes(&tun_records),
        lo_records.len(),
        probes(&lo_records)
    );
    assert!(
        probes(&tun_records).contains(&Probe::IpStart),
        "no ip-start record of the TUN packets: {records:#?}"
    );
    assert!(
        !lo_records.is_empty(),
        "no record over loopback: {records:#?}"
    );
    for r in &lo_records {
        assert_eq!(r.sample.rx_queue, None, "loopback records no queue: {r:?}");
    }
    let mut seen = [0usize; QUEUES];
    for r in &tun_records {
        let s = &r.sample;
        let k = tun_ports.iter().position(|&p| p == s.flow.dport).unwrap();
        if s.socket_queue.is_none() {
            // From the packet's headers (the probes before the socket).
            assert_eq!(s.flow.src, std::net::IpAddr::V4(tun.peer), "{s:?}");
            assert_eq!(s.flow.sport, 40_000 + k as u16, "{s:?}");
        }
        // Where the probe has the skb; the packet's own queue, queue 0 included.
        if s.skb.is_some() {
            assert_eq!(s.rx_queue, Some(k as u16), "written to queue {k}: {s:?}");
            assert_eq!(s.ifindex, tun.ifindex, "{s:?}");
            seen[k] += 1;
        }
    }
    assert!(
        seen.iter().all(|&n| n > 0),
        "records with an skb per queue {seen:?}: {tun_records:#?}"
    );
}
