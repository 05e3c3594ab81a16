//! Probe cases that only make sense inside the qemu guests of the VM runner
//! (`TAILTRAP_IN_VM=1`): they change guest-wide clock and qdisc state, or depend on a stock
//! kernel's layout. Each is `#[ignore]`d and named `vm_only_*`: the VM runner runs them
//! with `--include-ignored`; a host run leaves them out with `--skip vm_only_`, and one that
//! does not fails in [`require_vm`] rather than touching the host's clock.

// Tests may unwrap: a panic with the error is the report.
#![allow(clippy::unwrap_used)]

mod probes_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bpf::ProbeConfig;
use model::Probe;
use probes_support::{all_services, attached, client, load, q, server};
use tailtrap_tests::{require_vm, run_client, Netns, Proto, TcpServer, UdpServer, VethPair};

const MS: u64 = 1_000_000;

/// Loopback and veth TCP/UDP, then every attached probe must report sub-second latencies
/// and almost no future stamps.
fn traffic_gives_sane_latencies(context: &str) {
    let mut probes = load(&ProbeConfig::default());
    let ns = Netns::new("tt-vm").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    // A queue on the host's end, so that qdisc-sojourn (which times devices with one) has
    // packets to check the clock on.
    veth.set_root_qdisc(&["pfifo"]).unwrap();
    for (peer, netns) in [
        (SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), None),
        (SocketAddr::from((veth.peer_v4, 0)), Some(&ns)),
    ] {
        let tcp = TcpServer::spawn(server(peer, netns, None, Duration::ZERO)).unwrap();
        let udp = UdpServer::spawn(server(peer, netns, None, Duration::ZERO)).unwrap();
        run_client(client(tcp.addr(), None, Proto::Tcp, 50)).unwrap();
        run_client(client(udp.addr(), None, Proto::Udp, 50)).unwrap();
    }
    let snapshot = probes.snapshot().unwrap();
    let mut samples = 0;
    // Loopback and veth are not hardware devices: their transmits are not timed to a
    // completion (probes_send.rs checks that clock on the guest's NIC).
    for probe in attached(&probes)
        .into_iter()
        .filter(|p| *p != Probe::DriverToCompletion)
    {
        let h = all_services(&snapshot, probe);
        assert!(h.count() > 0, "{context}: {probe} has no samples");
        // Under software emulation the guest is slow, but not 100 ms per packet; a wrong
        // clock shows up as seconds (a TAI offset) or decades (REALTIME vs MONOTONIC).
        let p99 = q(&h, 0.99);
        assert!(p99.upper_ns <= 100 * MS, "{context}: {probe} p99 {p99:?}");
        samples += h.count();
    }
    let future = snapshot.counters.future_tstamp;
    assert!(
        future * 100 <= samples,
        "{context}: {future} future stamps against {samples} samples"
    );
    println!(
        "{context}: {samples} samples, counters {:?}",
        snapshot.counters
    );
}

#[test]
#[ignore = "VM only: a stock kernel's skb timestamp layout; run by tests/vm/run-vm-tests.sh"]
fn vm_only_the_kernels_timestamp_layout_gives_sane_latencies() {
    let kernel = require_vm();
    // 6.1 has the 1-bit mono_delivery_time, 6.12 the 2-bit tstamp_type.
    traffic_gives_sane_latencies(&format!("kernel {kernel}"));
}

/// Sets the kernel's TAI offset (whole seconds) and returns the previous one.
fn set_tai_offset(seconds: i32) -> i32 {
    // SAFETY: timex is plain data; reading first, then ADJ_TAI with `constant` set.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    assert!(unsafe { libc::adjtimex(&mut tx) } >= 0);
    let previous = tx.tai;
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = libc::ADJ_TAI;
    tx.constant = libc::c_long::from(seconds);
    assert!(
        unsafe { libc::adjtimex(&mut tx) } >= 0,
        "adjtimex(ADJ_TAI): {}",
        std::io::Error::last_os_error()
    );
    previous
}

/// Puts the TAI offset back when the test ends, even by panic.
struct RestoreTai(i32);

impl Drop for RestoreTai {
    fn drop(&mut self) {
        set_tai_offset(self.0);
    }
}

#[test]
#[ignore = "VM only: sets the machine's TAI offset; run by tests/vm/run-vm-tests.sh"]
fn vm_only_a_tai_offset_of_37s_keeps_latencies_sane() {
    require_vm();
    let _restore = RestoreTai(set_tai_offset(37));
    traffic_gives_sane_latencies("TAI offset 37 s");
}

#[test]
#[ignore = "VM only: needs netem (stock kernel); run by tests/vm/run-vm-tests.sh"]
fn vm_only_netem_reordering_is_excluded_from_tcp_socket_read_only_with_the_hol_filter() {
    require_vm();
    let ns = Netns::new("tt-hol").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    // A quarter of the packets go at once, the rest 10 ms later: later segments overtake
    // and wait in the receiver's out-of-order queue.
    veth.add_netem(&["delay", "10ms", "reorder", "25%", "50%"])
        .unwrap();
    // One MSS per packet: a message sent as one GSO packet has nothing to reorder, which
    // made the test depend on how TCP happened to size its packets.
    veth.set_gso_max_segs(1).unwrap();
    let tcp = TcpServer::spawn(server(
        (veth.peer_v4, 0).into(),
        Some(&ns),
        None,
        Duration::ZERO,
    ))
    .unwrap();
    // Two probe sets see the same reads: one with the filter, one without.
    let config = |hol_filter| ProbeConfig {
        hol_filter,
        services: vec![probes_support::service("bulk", None, &[tcp.addr().port()])],
        ..ProbeConfig::default()
    };
    let mut filtered = load(&config(true));
    let mut unfiltered = load(&config(false));
    let mut opts = client(tcp.addr(), None, Proto::Tcp, 40);
    // Several segments per message, so several are in flight to be reordered.
    opts.size = 60_000;
    run_client(opts).unwrap();
    // The server's last reads (the close) may still be going through the two programs, one
    // after the other, when the client returns: a snapshot between them left the sets one
    // read apart (CI, 6.1: 498 against 389 + 110). Let them settle first.
    std::thread::sleep(Duration::from_millis(500));
    let on = filtered.snapshot().unwrap();
    let off = unfiltered.snapshot().unwrap();
    let excluded = on.counters.hol_excluded;
    // hol_excluded counts every socket's reads, so compare it with every service's reads: the
    // client's socket can see reordering too (veth delivers on the sending CPU's backlog), and
    // its excluded reads are not the server's (CI, 6.1: 349 against 272 + 78).
    let on_reads = all_services(&on, Probe::TcpSocketRead);
    let off_reads = all_services(&off, Probe::TcpSocketRead);
    let on_bulk = probes_support::hist(&on, "bulk", Probe::TcpSocketRead).count();
    let off_bulk = probes_support::hist(&off, "bulk", Probe::TcpSocketRead).count();
    println!(
        "filter on: {} reads ({on_bulk} the server's), {excluded} excluded, mean {:?}, \
         counters {:?}; off: {} reads ({off_bulk} the server's), mean {:?}, counters {:?}",
        on_reads.count(),
        on_reads.mean_ns(),
        on.counters,
        off_reads.count(),
        off_reads.mean_ns(),
        off.counters
    );
    assert!(excluded > 0, "no read was judged head-of-line blocked");
    // The reordered direction is the one into the server.
    assert!(
        on_bulk < off_bulk,
        "the server's reads: {on_bulk} with the filter, {off_bulk} without"
    );
    assert_eq!(off.counters.hol_excluded, 0);
    // The unfiltered set counted exactly the reads the filtered one left out...
    assert_eq!(off_reads.count(), on_reads.count() + excluded);
    // ...and those had waited longer than the rest: they include the reordering delay.
    let excluded_mean = (off_reads.sum_ns() - on_reads.sum_ns()) as f64 / excluded as f64;
    let kept_mean = on_reads.mean_ns().unwrap();
    assert!(
        excluded_mean > kept_mean,
        "excluded reads mean {excluded_mean} ns, kept {kept_mean} ns"
    );
}
