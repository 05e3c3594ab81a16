//! The probes against real traffic on the running kernel (tp_btf on the development host,
//! fentry/fexit on stock kernels under qemu; `TAILTRAP_EXPECT_ATTACH` says which). Root.

// Tests may unwrap: a panic with the error is the report.
#![allow(clippy::unwrap_used)]

mod probes_support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use bpf::{AttachMethod, LoadError, ProbeConfig};
use model::Probe;
use probes_support::{all_services, attached, client, hist, load, q, server, service};
use tailtrap_tests::{
    run_client, tailtrap_bin, Cgroup, Netns, Proto, TcpServer, UdpServer, VethPair,
};

const MS: u64 = 1_000_000;

/// TCP and UDP to `peers` (servers in `netns`), then every attached probe must have samples.
fn every_attached_probe_sees(peers: &[SocketAddr], netns: Option<&Netns>) {
    every_attached_probe_sees_with(load(&ProbeConfig::default()), peers, netns);
}

fn every_attached_probe_sees_with(
    mut probes: bpf::ProbeSet,
    peers: &[SocketAddr],
    netns: Option<&Netns>,
) -> bpf::Snapshot {
    for &peer in peers {
        let tcp = TcpServer::spawn(server(peer, netns, None, Duration::ZERO)).unwrap();
        let udp = UdpServer::spawn(server(peer, netns, None, Duration::ZERO)).unwrap();
        let t = run_client(client(tcp.addr(), None, Proto::Tcp, 100)).unwrap();
        let u = run_client(client(udp.addr(), None, Proto::Udp, 100)).unwrap();
        assert_eq!(
            (t.replies, u.replies),
            (100, 100),
            "traffic to {peer} failed"
        );
    }
    let snapshot = probes.snapshot().unwrap();
    let attached = attached(&probes);
    assert!(
        attached.contains(&Probe::IpStart),
        "{:?}",
        probes.attachments()
    );
    // Loopback and veth have no queue (noqueue): nothing sojourns there, and qdisc-sojourn
    // times only devices with a qdisc; nor are they hardware devices, whose transmits
    // driver-to-completion times (probes_send.rs).
    for probe in attached
        .into_iter()
        .filter(|p| !matches!(p, Probe::QdiscSojourn | Probe::DriverToCompletion))
    {
        let h = all_services(&snapshot, probe);
        assert!(h.count() > 0, "{probe}: no samples; {snapshot:#?}");
        // Receive-path latencies of an idle test machine are far below a second: a wrong
        // clock or layout would show seconds or years.
        assert!(
            q(&h, 0.5).upper_ns < 1_000 * MS,
            "{probe}: p50 {:?}",
            q(&h, 0.5)
        );
    }
    snapshot
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn loopback_tcp_and_udp_v4_and_v6_reach_every_attached_probe() {
    every_attached_probe_sees(
        &[
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, 0)),
        ],
        None,
    );
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn veth_into_a_netns_v4_and_v6_reaches_every_attached_probe() {
    let ns = Netns::new("tt-probes").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    every_attached_probe_sees(
        &[
            SocketAddr::from((veth.peer_v4, 0)),
            SocketAddr::from((veth.peer_v6, 0)),
        ],
        Some(&ns),
    );
}

/// ip-start's histogram of a TCP service served from `ns` over a veth (its segments carry
/// the sender's departure time), with `first_hook_stamps` as given.
fn ip_start_of_tcp_over_veth(first_hook_stamps: bool) -> model::Histogram {
    let ns = Netns::new("tt-first-stamp").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    let tcp = TcpServer::spawn(server(
        SocketAddr::from((veth.peer_v4, 0)),
        Some(&ns),
        None,
        Duration::ZERO,
    ))
    .unwrap();
    let config = ProbeConfig {
        services: vec![service("pod", None, &[tcp.addr().port()])],
        first_hook_stamps,
        ..ProbeConfig::default()
    };
    let mut probes = load(&config);
    if !attached(&probes).contains(&Probe::IpStart) {
        return model::Histogram::new();
    }
    let stats = run_client(client(tcp.addr(), None, Proto::Tcp, 200)).unwrap();
    assert_eq!(stats.replies, 200);
    let snapshot = probes.snapshot().unwrap();
    hist(&snapshot, "pod", Probe::IpStart)
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn tcp_over_a_veth_is_measured_at_ip_start_from_netif_rx() {
    // The server's segments reach the host's socket with the sender's departure time; the
    // netif_rx stamp makes them measurable at ip-start (the driver and softirq stage).
    let h = ip_start_of_tcp_over_veth(true);
    // Before 5.18 the kernel clears the stamp when the packet changes namespace and stamps
    // it at netif_rx itself, once RX timestamping is on (a workqueue, after the first
    // packets): some segments, not necessarily all.
    let expected = if kernel_at_least(5, 18) { 200 } else { 1 };
    assert!(
        h.count() >= expected,
        "ip-start saw {} of the pod's segments",
        h.count()
    );
    // Backlog to softirq on an idle test machine: far below a second. A stamp of another
    // clock would show seconds or years.
    assert!(q(&h, 0.5).upper_ns < 100 * MS, "p50 {:?}", q(&h, 0.5));
    // Switched off, ip-start cannot measure them (as before the netif_rx stamp), on kernels
    // that keep the sender's departure time across the veth (5.18 on: mono_delivery_time);
    // older ones clear it when the packet changes namespace, and stamp it at netif_rx.
    let off = ip_start_of_tcp_over_veth(false);
    if kernel_at_least(5, 18) {
        assert_eq!(off.count(), 0, "{off:?}");
    }
}

/// The running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn a_reader_sleeping_20ms_shows_in_tcp_socket_read_but_not_tcp_start() {
    let tcp = TcpServer::spawn(server(
        (Ipv4Addr::LOCALHOST, 0).into(),
        None,
        None,
        Duration::from_millis(20),
    ))
    .unwrap();
    let config = ProbeConfig {
        services: vec![service("slow", None, &[tcp.addr().port()])],
        ..ProbeConfig::default()
    };
    let mut probes = load(&config);
    let stats = run_client(client(tcp.addr(), None, Proto::Tcp, 40)).unwrap();
    assert_eq!(stats.replies, 40);
    let snapshot = probes.snapshot().unwrap();

    let read = hist(&snapshot, "slow", Probe::TcpSocketRead);
    assert!(read.count() >= 40, "{read:?}");
    // A read comes 20 ms after the reader's previous write, minus the client's turnaround,
    // so single reads may be a little under 20 ms: the mean is exact, and the p50 bucket
    // must reach into the 18-40 ms range.
    let mean = read.mean_ns().unwrap();
    assert!(
        (18.0 * MS as f64..=40.0 * MS as f64).contains(&mean),
        "tcp-socket-read mean {mean} ns: {read:?}"
    );
    let p50 = q(&read, 0.5);
    assert!(
        p50.upper_ns > 18 * MS && p50.lower_ns < 40 * MS,
        "tcp-socket-read p50 {p50:?}"
    );
    let start = hist(&snapshot, "slow", Probe::TcpStart);
    assert!(start.count() >= 40, "{start:?}");
    assert!(
        q(&start, 0.5).upper_ns <= MS,
        "tcp-start p50 {:?}",
        q(&start, 0.5)
    );
}

const LOCALHOST_V4: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// Two TCP services on loopback, each in a cgroup of its own (`<prefix>-slow`,
/// `<prefix>-fast`): "slow", whose reader sleeps 20 ms before each read, and "fast", which
/// answers at once.
struct SlowAndFast {
    // The servers first: killed before their cgroups are removed.
    slow: TcpServer,
    fast: TcpServer,
    cg_slow: Cgroup,
    cg_fast: Cgroup,
}

impl SlowAndFast {
    fn spawn(prefix: &str) -> SlowAndFast {
        let cg_slow = Cgroup::create(&format!("{prefix}-slow")).unwrap();
        let cg_fast = Cgroup::create(&format!("{prefix}-fast")).unwrap();
        let slow = TcpServer::spawn(server(
            LOCALHOST_V4,
            None,
            Some(&cg_slow),
            Duration::from_millis(20),
        ))
        .unwrap();
        let fast =
            TcpServer::spawn(server(LOCALHOST_V4, None, Some(&cg_fast), Duration::ZERO)).unwrap();
        SlowAndFast {
            slow,
            fast,
            cg_slow,
            cg_fast,
        }
    }

    /// "slow" matched by its cgroup only, "fast" by its port and `more_fast_ports` only.
    fn services(&self, more_fast_ports: &[u16]) -> Vec<bpf::ServiceSpec> {
        let fast_ports = [&[self.fast.addr().port()], more_fast_ports].concat();
        vec![
            service("slow", Some(&self.cg_slow), &[]),
            service("fast", None, &fast_ports),
        ]
    }

    /// `messages` TCP messages to "slow", then to "fast".
    fn exchange(&self, messages: u32) {
        run_client(client(self.slow.addr(), None, Proto::Tcp, messages)).unwrap();
        run_client(client(self.fast.addr(), None, Proto::Tcp, messages)).unwrap();
    }

    /// "slow"'s and "fast"'s tcp-socket-read histograms, each with a sample for every one
    /// of [`SlowAndFast::exchange`]'s `messages`.
    fn reads(
        &self,
        snapshot: &bpf::Snapshot,
        messages: u64,
    ) -> (model::Histogram, model::Histogram) {
        let slow_read = hist(snapshot, "slow", Probe::TcpSocketRead);
        let fast_read = hist(snapshot, "fast", Probe::TcpSocketRead);
        assert!(
            slow_read.count() >= messages && fast_read.count() >= messages,
            "{snapshot:#?}"
        );
        (slow_read, fast_read)
    }
}

/// Without configured services, each of `cgroups` has its own tcp-socket-read histogram,
/// named for it, with at least `messages` samples.
fn grouped_by_cgroup(snapshot: &bpf::Snapshot, cgroups: [&Cgroup; 2], messages: u64) {
    for cg in cgroups {
        let h = hist(snapshot, cg.rel_path(), Probe::TcpSocketRead);
        assert!(h.count() >= messages, "{}: {snapshot:#?}", cg.rel_path());
    }
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn two_services_by_cgroup_and_by_port_get_their_own_histograms() {
    let pair = SlowAndFast::spawn("tt-svc");
    // ip-start does not measure loopback TCP (it arrives there with the sender's departure
    // time): UDP to a second port of "fast" shows its port attribution there.
    let fast_udp = UdpServer::spawn(server(
        LOCALHOST_V4,
        None,
        Some(&pair.cg_fast),
        Duration::ZERO,
    ))
    .unwrap();
    // "slow" is matched by its cgroup only, "fast" by its ports only.
    let config = ProbeConfig {
        services: pair.services(&[fast_udp.addr().port()]),
        ..ProbeConfig::default()
    };
    let mut probes = load(&config);
    pair.exchange(30);
    run_client(client(fast_udp.addr(), None, Proto::Udp, 30)).unwrap();
    let snapshot = probes.snapshot().unwrap();

    let (slow_read, fast_read) = pair.reads(&snapshot, 30);
    // Far apart, so neither can hide the other's samples (10 ms leaves room for slow VMs).
    let (slow_p50, fast_p50) = (q(&slow_read, 0.5), q(&fast_read, 0.5));
    assert!(slow_p50.lower_ns >= 15 * MS, "{slow_p50:?}");
    assert!(fast_p50.upper_ns <= 10 * MS, "{fast_p50:?}");
    // Before socket lookup only ports identify a service: "fast" has a port rule there.
    if attached(&probes).contains(&Probe::IpStart) {
        assert!(hist(&snapshot, "fast", Probe::IpStart).count() >= 30);
        assert_eq!(hist(&snapshot, "slow", Probe::IpStart).count(), 0);
    }
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn without_services_sockets_group_by_their_cgroup_up_to_the_limit() {
    let cg_a = Cgroup::create("tt-auto-a").unwrap();
    let cg_b = Cgroup::create("tt-auto-b").unwrap();
    let localhost = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let a = TcpServer::spawn(server(localhost, None, Some(&cg_a), Duration::ZERO)).unwrap();
    let b = TcpServer::spawn(server(localhost, None, Some(&cg_b), Duration::ZERO)).unwrap();

    let mut probes = load(&ProbeConfig::default());
    run_client(client(a.addr(), None, Proto::Tcp, 20)).unwrap();
    run_client(client(b.addr(), None, Proto::Tcp, 20)).unwrap();
    let snapshot = probes.snapshot().unwrap();
    grouped_by_cgroup(&snapshot, [&cg_a, &cg_b], 20);
    drop(probes);

    // A limit of one: whichever socket cgroup comes first gets the slot, the rest "other".
    let mut probes = load(&ProbeConfig {
        auto_service_limit: 1,
        ..ProbeConfig::default()
    });
    run_client(client(a.addr(), None, Proto::Tcp, 20)).unwrap();
    run_client(client(b.addr(), None, Proto::Tcp, 20)).unwrap();
    let snapshot = probes.snapshot().unwrap();
    let named: std::collections::BTreeSet<&str> = snapshot
        .hists
        .iter()
        .map(|h| h.service.as_str())
        .filter(|s| *s != "host" && *s != "other")
        .collect();
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(hist(&snapshot, "other", Probe::TcpSocketRead).count() > 0);
    assert!(snapshot.counters.auto_overflow > 0);
}

/// The kernel features a 5.10 kernel lacks (see `bpf::MissingFeature`).
const FEATURES_5_10_LACKS: [&str; 4] = [
    "bpf_ktime_get_tai_ns",
    "socket storage in tracing programs",
    "task storage in tracing programs",
    "batched lookups of per-CPU array maps",
];

fn missing(probes: &bpf::ProbeSet) -> Vec<&'static str> {
    probes
        .missing_features()
        .iter()
        .map(|m| m.feature)
        .collect()
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn the_kernels_missing_features_are_those_of_its_version() {
    let probes = load(&ProbeConfig::default());
    // Set by the VM runner; the host kernel (6.18) and the guests from 6.1 on have them all.
    let kernel = std::env::var("TAILTRAP_KERNEL").unwrap_or_default();
    if kernel.starts_with("5.10.") {
        assert_eq!(missing(&probes), FEATURES_5_10_LACKS);
    } else {
        assert_eq!(missing(&probes), Vec::<&str>::new(), "kernel {kernel:?}");
    }
}

/// `kernel_features = "baseline"` runs 5.10's stand-ins on any kernel: the clock from
/// CLOCK_MONOTONIC plus an offset, services resolved per cgroup without socket storage,
/// the histograms read entry by entry. They must measure and attribute as the features do.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn the_stand_ins_of_5_10_measure_and_attribute_like_the_features() {
    let pair = SlowAndFast::spawn("tt-base");
    let baseline = ProbeConfig {
        kernel_features: bpf::KernelFeatureMode::Baseline,
        ..ProbeConfig::default()
    };

    // Configured: "slow" by its cgroup (the per-cgroup map), "fast" by its port.
    let mut probes = load(&ProbeConfig {
        services: pair.services(&[]),
        ..baseline.clone()
    });
    assert_eq!(missing(&probes), FEATURES_5_10_LACKS);
    for m in probes.missing_features() {
        assert!(m.why.contains("baseline") && !m.cost.is_empty(), "{m:?}");
    }
    pair.exchange(30);
    probes.refresh_clock().unwrap();
    let snapshot = probes.snapshot().unwrap();
    let (slow_read, fast_read) = pair.reads(&snapshot, 30);
    // The stand-in clock must agree with the kernel's stamps: the 20 ms sleep shows as
    // such, not as 0 or as the 37 s of TAI - UTC.
    let (slow_p50, fast_p50) = (q(&slow_read, 0.5), q(&fast_read, 0.5));
    assert!(
        slow_p50.lower_ns >= 15 * MS && slow_p50.upper_ns < 1_000 * MS,
        "{slow_p50:?}"
    );
    assert!(fast_p50.upper_ns <= 10 * MS, "{fast_p50:?}");
    assert_eq!(
        snapshot.counters.future_tstamp, 0,
        "{:?}",
        snapshot.counters
    );
    drop(probes);

    // Auto-grouped: the per-cgroup slots without socket storage.
    let mut probes = load(&baseline);
    pair.exchange(20);
    let snapshot = probes.snapshot().unwrap();
    grouped_by_cgroup(&snapshot, [&pair.cg_slow, &pair.cg_fast], 20);
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn a_tiny_histogram_map_reports_drops() {
    let mut probes = load(&ProbeConfig {
        hist_map_entries: Some(1),
        ..ProbeConfig::default()
    });
    let tcp = TcpServer::spawn(server(
        (Ipv4Addr::LOCALHOST, 0).into(),
        None,
        None,
        Duration::ZERO,
    ))
    .unwrap();
    run_client(client(tcp.addr(), None, Proto::Tcp, 50)).unwrap();
    let snapshot = probes.snapshot().unwrap();
    assert!(snapshot.hists.len() <= 1, "{snapshot:#?}");
    assert!(
        snapshot.counters.map_full_drops > 0,
        "{:?}",
        snapshot.counters
    );
}

/// nic-to-stack and hw_stamp_origin with a stamping device's clock in the kernel: every
/// path that reads hardware stamps loads (the verifier takes it on this kernel) and runs
/// for every packet, and packets without a hardware stamp (no device here stamps) are
/// measured as before, with nothing timed at nic-to-stack and nothing counted.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn nic_to_stack_runs_within_ip_start_and_times_only_stamped_packets() {
    let config = ProbeConfig {
        hw_stamp_origin: true,
        ..ProbeConfig::default()
    };
    let mut probes = load(&config);
    let method = |probes: &bpf::ProbeSet| {
        probes
            .attachments()
            .iter()
            .find(|a| a.probe == Probe::NicToStack)
            .unwrap()
            .method
            .clone()
    };
    assert_eq!(
        method(&probes),
        AttachMethod::Within {
            probe: Probe::IpStart
        }
    );
    // Loopback as if it stamped, with a clock 37 s ahead (TAI): the probes now look for a
    // hardware stamp on every packet.
    let lo = bpf::NicClock {
        ifindex: 1,
        stamping: true,
        offset: Some((-37_000_000_000, 500)),
    };
    assert!(probes.set_nic_clocks(&[lo]).unwrap());
    let snapshot = every_attached_probe_sees_with(
        probes,
        &[
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, 0)),
        ],
        None,
    );
    assert_eq!(all_services(&snapshot, Probe::NicToStack).count(), 0);
    let c = snapshot.counters;
    assert_eq!((c.nic_stamp_no_clock, c.nic_stamp_out_of_bounds), (0, 0));

    // Where the daemon found no device with a clock, the stage is unavailable with its
    // reason and takes no clocks; with hw_rx_timestamps = "off" it is disabled.
    let config = ProbeConfig {
        nic_to_stack_unavailable: Some("no device with a PTP clock".into()),
        ..ProbeConfig::default()
    };
    let mut probes = load(&config);
    assert_eq!(
        method(&probes),
        AttachMethod::Unavailable {
            reason: "no device with a PTP clock".into()
        }
    );
    assert!(!probes.set_nic_clocks(&[lo]).unwrap());
    drop(probes);
    let config = ProbeConfig {
        hw_rx_timestamps: bpf::HwRxStamps::Off,
        ..ProbeConfig::default()
    };
    assert_eq!(method(&load(&config)), AttachMethod::Disabled);
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn disabled_probes_stay_off_and_all_disabled_is_an_error() {
    let mut config = ProbeConfig::default();
    config.enabled.insert(Probe::TcpSocketRead, false);
    let probes = load(&config);
    let read = probes
        .attachments()
        .iter()
        .find(|a| a.probe == Probe::TcpSocketRead)
        .unwrap();
    assert_eq!(read.method, AttachMethod::Disabled);
    drop(probes);

    let config = ProbeConfig {
        enabled: Probe::ALL.iter().map(|p| (*p, false)).collect(),
        ..ProbeConfig::default()
    };
    let err = bpf::ProbeSet::load(&config, &mut |_| {}).unwrap_err();
    assert!(matches!(err, LoadError::NothingAttached(_)), "{err}");
    assert!(
        err.to_string().contains("tcp-socket-read: disabled"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn a_missing_service_cgroup_is_named_in_the_error() {
    let config = ProbeConfig {
        services: vec![bpf::ServiceSpec {
            name: "web".into(),
            cgroup: Some("tailtrap-no-such/cgroup".into()),
            ports: vec![],
        }],
        ..ProbeConfig::default()
    };
    let err = bpf::ProbeSet::load(&config, &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LoadError::Cgroup { .. }), "{text}");
    assert!(
        text.contains("service \"web\"") && text.contains("tailtrap-no-such/cgroup"),
        "{text}"
    );
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn tailtrap_hist_prints_one_json_object_per_interval() {
    let out = Command::new(tailtrap_bin())
        .args(["hist", "--json", "--count", "2", "--interval", "300ms"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for line in &lines {
        let attachments = line["attachments"].as_array().unwrap();
        assert_eq!(attachments.len(), Probe::ALL.len());
        assert!(attachments
            .iter()
            .any(|a| a["method"] == "fentry" || a["method"] == "tp_btf"));
        assert!(line["hists"].is_array() && line["counters"]["map_full_drops"].is_u64());
    }
}

#[test]
fn tailtrap_hist_rejects_a_bad_config_with_its_place() {
    let dir = std::env::temp_dir().join(format!("tt-hist-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tailtrap.toml");
    std::fs::write(&file, "[probes]\nhol_filter = true\nsample_one = 3\n").unwrap();
    let out = Command::new(tailtrap_bin())
        .args(["hist", "--count", "1", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}, line 3", file.display())) && stderr.contains("sample_one"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs root (to drop it with setpriv): run as root with --include-ignored"]
fn tailtrap_hist_without_root_says_it_needs_root() {
    // setpriv (util-linux) drops to nobody with no capabilities left.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(tailtrap_bin())
        .args(["hist", "--count", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs root"), "{stderr}");
}
