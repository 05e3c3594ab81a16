//! Self-checks of the test helpers against the real kernel: namespaces, veth pairs, netem,
//! cgroups and the traffic helper. Those creating namespaces, links or cgroups need root
//! and are `#[ignore]`d (run as root with `--include-ignored`); netem is VM-only.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tailtrap_tests::{
    require_vm, run_client, traffic_bin, Cgroup, ClientOpts, ClientStats, Netns, Proto, ServerOpts,
    TcpServer, UdpServer, VethPair,
};

#[test]
#[ignore = "needs root (namespaces, links, cgroups): run as root with --include-ignored"]
fn tcp_and_udp_round_trip_across_a_veth_into_a_netns_v4_and_v6() {
    let ns = Netns::new("tt-selfcheck").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    for peer in [
        SocketAddr::from((veth.peer_v4, 0)),
        SocketAddr::from((veth.peer_v6, 0)),
    ] {
        let tcp = TcpServer::spawn(ServerOpts::at(peer).in_netns(&ns)).unwrap();
        assert_eq!(tcp.addr().ip(), peer.ip());
        let stats = run_client(ClientOpts::new(tcp.addr(), Proto::Tcp, 20)).unwrap();
        assert_eq!(
            (stats.sent, stats.replies, stats.deadline_hit),
            (20, 20, false),
            "{stats:?}"
        );

        let udp = UdpServer::spawn(ServerOpts::at(peer).in_netns(&ns)).unwrap();
        let stats = run_client(ClientOpts::new(udp.addr(), Proto::Udp, 20)).unwrap();
        assert_eq!(
            (stats.sent, stats.replies, stats.lost),
            (20, 20, 0),
            "{stats:?}"
        );
    }
    // The servers listen only inside the namespace: from the host, the peer address is
    // reachable through the veth, but nothing listens on the host's own end.
    let tcp = TcpServer::spawn(ServerOpts::at((veth.peer_v4, 0).into()).in_netns(&ns)).unwrap();
    let wrong = SocketAddr::from((veth.host_v4, tcp.addr().port()));
    assert!(run_client(ClientOpts::new(wrong, Proto::Tcp, 1)).is_err());
}

#[test]
#[ignore = "needs root (namespaces, links, cgroups): run as root with --include-ignored"]
fn client_in_a_netns_reaches_a_server_on_the_host() {
    let ns = Netns::new("tt-selfcheck").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    let tcp = TcpServer::spawn(ServerOpts::at((veth.host_v6, 0).into())).unwrap();
    let stats = run_client(ClientOpts::new(tcp.addr(), Proto::Tcp, 5).in_netns(&ns)).unwrap();
    assert_eq!(stats.replies, 5);
}

#[test]
#[ignore = "needs root (namespaces, links, cgroups): run as root with --include-ignored"]
fn veth_pairs_get_distinct_addresses_and_vanish_on_drop() {
    let ns = Netns::new("tt-selfcheck").unwrap();
    let a = VethPair::new(&ns).unwrap();
    let b = VethPair::new(&ns).unwrap();
    assert_ne!(a.host_v4, b.host_v4);
    assert_ne!(a.host_v6, b.host_v6);
    assert_ne!(a.host_ifindex, b.host_ifindex);
    let index =
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", a.host_ifname)).unwrap();
    assert_eq!(index.trim().parse::<u32>().unwrap(), a.host_ifindex);
    let name = a.host_ifname.clone();
    drop(a);
    assert!(!Path::new("/sys/class/net").join(name).exists());

    let ns_name = ns.name().to_string();
    drop(b);
    drop(ns);
    assert!(!Path::new("/run/netns").join(ns_name).exists());
}

#[test]
#[ignore = "VM only: needs netem (stock kernel); run by tests/vm/run-vm-tests.sh"]
fn vm_only_netem_delay_on_the_host_end_slows_the_round_trip() {
    require_vm();
    let ns = Netns::new("tt-selfcheck").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    veth.add_netem(&["delay", "40ms"]).unwrap();
    let tcp = TcpServer::spawn(ServerOpts::at((veth.peer_v4, 0).into()).in_netns(&ns)).unwrap();
    let stats = run_client(ClientOpts::new(tcp.addr(), Proto::Tcp, 5)).unwrap();
    assert_eq!(stats.replies, 5);
    assert!(stats.rtt_p50 >= Duration::from_millis(40), "{stats:?}");
}

/// The server sleeps `d` before every read, so `n` messages sent one after the other's
/// echo take at least `(n - 1) * d`. (Not each round trip: the sleep starts right after the
/// previous read, and a client delayed by a busy machine finds part of it over.)
fn assert_paced(stats: &ClientStats, messages: u32, d: Duration) {
    assert_eq!(stats.replies, u64::from(messages), "{stats:?}");
    assert!(stats.elapsed >= d * (messages - 1), "{stats:?}");
}

#[test]
fn read_delay_applies_and_changes_while_running() {
    let lo = SocketAddr::from(([127, 0, 0, 1], 0));
    let tcp = TcpServer::spawn(ServerOpts {
        read_delay: Duration::from_millis(30),
        ..ServerOpts::at(lo)
    })
    .unwrap();
    let slow = run_client(ClientOpts::new(tcp.addr(), Proto::Tcp, 5)).unwrap();
    assert_paced(&slow, 5, Duration::from_millis(30));

    tcp.set_read_delay(Duration::from_millis(120)).unwrap();
    let slower = run_client(ClientOpts::new(tcp.addr(), Proto::Tcp, 3)).unwrap();
    assert_paced(&slower, 3, Duration::from_millis(120));

    let udp = UdpServer::spawn(ServerOpts::at(lo)).unwrap();
    udp.set_read_delay(Duration::from_millis(50)).unwrap();
    let stats = run_client(ClientOpts::new(udp.addr(), Proto::Udp, 3)).unwrap();
    assert_paced(&stats, 3, Duration::from_millis(50));
}

#[test]
#[ignore = "needs root (namespaces, links, cgroups): run as root with --include-ignored"]
fn server_runs_in_its_cgroup_and_the_cgroup_is_removed_on_drop() {
    let cg = Cgroup::create("selfcheck").unwrap();
    let path = cg.path();
    assert_eq!(
        std::fs::metadata(&path)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap(),
        cg.id()
    );
    assert!(path.ends_with(cg.rel_path()));
    let tcp = TcpServer::spawn(ServerOpts {
        cgroup: Some(&cg),
        ..ServerOpts::loopback()
    })
    .unwrap();
    let membership = std::fs::read_to_string(format!("/proc/{}/cgroup", tcp.pid())).unwrap();
    let expected = format!("0::/{}", cg.rel_path());
    assert!(membership.lines().any(|l| l == expected), "{membership}");
    assert!(
        Cgroup::create("selfcheck").is_err(),
        "a second group of the same name must be refused"
    );

    // A process still inside is moved out rather than blocking the removal.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(path.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    drop(tcp);
    drop(cg);
    assert!(!path.exists());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

#[test]
fn the_located_traffic_binary_is_cargos() {
    let built = Path::new(env!("CARGO_BIN_EXE_tailtrap-traffic"));
    assert_eq!(
        traffic_bin().canonicalize().unwrap(),
        built.canonicalize().unwrap()
    );
}

#[test]
fn sink_mode_reads_without_echoing() {
    let bin = env!("CARGO_BIN_EXE_tailtrap-traffic");
    let mut srv = Command::new(bin)
        .args(["tcp-server", "--bind", "127.0.0.1:0", "--sink"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(srv.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let out = Command::new(bin)
        .args([
            "tcp-client",
            "--target",
            line.trim(),
            "--messages",
            "50",
            "--size",
            "1000",
            "--sink",
        ])
        .output()
        .unwrap();
    srv.kill().unwrap();
    srv.wait().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: tailtrap_tests::ClientStats = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((stats.sent, stats.replies), (50, 0));
}
