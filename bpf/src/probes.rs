//! Which BPF program implements which probe, per attach method. The program names are
//! this crate's; what each program hooks comes from [`Probe::hooks`], the one table of
//! kernel attach points.

use model::Probe;

/// One way of attaching a probe: the programs to load and what they hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// fentry/fexit programs and their kernel functions.
    Fentry(&'static [(&'static str, &'static str)]),
    /// A tp_btf program and its tracepoint.
    TpBtf(&'static str, &'static str),
}

impl Variant {
    /// `(program, attach target)` pairs of this variant.
    pub(crate) fn targets(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Variant::Fentry(list) => list.to_vec(),
            Variant::TpBtf(prog, tp) => vec![(prog, tp)],
        }
    }

    /// Program names of this variant.
    pub(crate) fn programs(self) -> Vec<&'static str> {
        match self {
            Variant::Fentry(list) => list.iter().map(|(prog, _)| *prog).collect(),
            Variant::TpBtf(prog, _) => vec![prog],
        }
    }
}

/// The attach target of `program` (a kernel function or tracepoint), from the model's
/// table or, for the programs that serve the probes, from [`AUXILIARY`]; `None` for a
/// program of neither.
pub(crate) fn target_of(program: &str) -> Option<&'static str> {
    Probe::ALL
        .iter()
        .find_map(|p| {
            variants(*p)
                .iter()
                .flat_map(|v| v.targets())
                .find_map(|(prog, target)| (prog == program).then_some(target))
        })
        .or_else(|| {
            AUXILIARY
                .iter()
                .find_map(|&(prog, target)| (prog == program).then_some(target))
        })
}

/// The scheduler hooks of the reader-wait split (reader_wait.bpf.h): loaded where the
/// kernel has task storage, attached only while capture is armed.
pub(crate) const READER_WAIT_PROGS: [&str; 2] = ["reader_wait_switch", "reader_wait_wakeup"];

/// The netif_rx stamp of packets that carry a delivery time (first_stamp.bpf.h), for
/// ip-start.
pub(crate) const FIRST_STAMP_PROG: &str = "first_hook_stamp";

/// The device-layer programs of the send probes (send.bpf.h): one notes each packet at
/// net_dev_queue, the other records both send intervals at the driver's transmit (it is
/// qdisc-sojourn's program, and send-to-qdisc's too) and notes the packet for
/// driver-to-completion; loaded when any send probe is.
pub(crate) const SEND_DEVICE_PROGS: [&str; 2] = ["send_dev_queue", "send_xmit"];

/// Programs that serve the probes without being one, and their tracepoints.
pub(crate) const AUXILIARY: [(&str, &str); 4] = [
    (READER_WAIT_PROGS[0], "sched_switch"),
    (READER_WAIT_PROGS[1], "sched_wakeup"),
    (FIRST_STAMP_PROG, "netif_rx"),
    (SEND_DEVICE_PROGS[0], "net_dev_queue"),
];

/// The program shared by tcp-socket-enqueued and udp-socket-enqueued; which of the two it
/// records is set in its read-only data.
pub(crate) const SK_DATA_READY_PROG: &str = "socket_enqueued_tp";

/// Pairs `programs` with the functions `probe` hooks, in order. Evaluated at compile time,
/// so a program list that does not match the model's table fails the build.
const fn fentry<const N: usize>(
    probe: Probe,
    programs: [&'static str; N],
) -> [(&'static str, &'static str); N] {
    let functions = probe.hooks().functions;
    assert!(
        functions.len() == N,
        "one fentry/fexit program per hooked function"
    );
    let mut out = [("", ""); N];
    let mut i = 0;
    while i < N {
        out[i] = (programs[i], functions[i]);
        i += 1;
    }
    out
}

/// `pairs` of (program, kernel function) where several programs hook one function (fentry
/// and fexit); each function must be one `probe` hooks. Evaluated at compile time.
const fn hooked<const N: usize>(
    probe: Probe,
    pairs: [(&'static str, &'static str); N],
) -> [(&'static str, &'static str); N] {
    let functions = probe.hooks().functions;
    let mut i = 0;
    while i < N {
        let mut found = false;
        let mut j = 0;
        while j < functions.len() {
            if same(pairs[i].1, functions[j]) {
                found = true;
            }
            j += 1;
        }
        assert!(found, "a program hooks a function the probe table lacks");
        i += 1;
    }
    pairs
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The tp_btf variant of `probe` with `program` on the model's tracepoint.
const fn tp_btf(probe: Probe, program: &'static str) -> Variant {
    match probe.hooks().tracepoint {
        Some(tracepoint) => Variant::TpBtf(program, tracepoint),
        None => panic!("the probe has no stand-in tracepoint"),
    }
}

const IP_START_FENTRY: [(&str, &str); 2] =
    fentry(Probe::IpStart, ["ip_start_fentry_v4", "ip_start_fentry_v6"]);
const TCP_START_FENTRY: [(&str, &str); 2] = fentry(
    Probe::TcpStart,
    ["tcp_start_fentry_v4", "tcp_start_fentry_v6"],
);
const UDP_START_FENTRY: [(&str, &str); 2] = fentry(
    Probe::UdpStart,
    ["udp_start_fentry_v4", "udp_start_fentry_v6"],
);
const TCP_ENQUEUED_FEXIT: [(&str, &str); 1] =
    fentry(Probe::TcpSocketEnqueued, ["tcp_socket_enqueued_fexit"]);
const UDP_ENQUEUED_FEXIT: [(&str, &str); 1] =
    fentry(Probe::UdpSocketEnqueued, ["udp_socket_enqueued_fexit"]);
const TCP_READ_FENTRY: [(&str, &str); 1] = fentry(Probe::TcpSocketRead, ["tcp_socket_read_fentry"]);
const UDP_READ_FENTRY: [(&str, &str); 1] = fentry(Probe::UdpSocketRead, ["udp_socket_read_fentry"]);

const SEND_TO_QDISC_FENTRY: [(&str, &str); 7] = hooked(
    Probe::SendToQdisc,
    [
        ("send_enter_tcp", "tcp_sendmsg"),
        ("send_enter_udp", "udp_sendmsg"),
        ("send_enter_udp6", "udpv6_sendmsg"),
        ("send_exit_tcp", "tcp_sendmsg"),
        ("send_exit_udp", "udp_sendmsg"),
        ("send_exit_udp6", "udpv6_sendmsg"),
        ("send_wait_memory_exit", "sk_stream_wait_memory"),
    ],
);

const IP_START: &[Variant] = &[
    Variant::Fentry(&IP_START_FENTRY),
    tp_btf(Probe::IpStart, "ip_start_tp"),
];
const TCP_START: &[Variant] = &[
    Variant::Fentry(&TCP_START_FENTRY),
    tp_btf(Probe::TcpStart, "tcp_start_tp"),
];
const UDP_START: &[Variant] = &[Variant::Fentry(&UDP_START_FENTRY)];
const TCP_SOCKET_ENQUEUED: &[Variant] = &[
    Variant::Fentry(&TCP_ENQUEUED_FEXIT),
    tp_btf(Probe::TcpSocketEnqueued, SK_DATA_READY_PROG),
];
const UDP_SOCKET_ENQUEUED: &[Variant] = &[
    Variant::Fentry(&UDP_ENQUEUED_FEXIT),
    tp_btf(Probe::UdpSocketEnqueued, SK_DATA_READY_PROG),
];
const TCP_SOCKET_READ: &[Variant] = &[
    Variant::Fentry(&TCP_READ_FENTRY),
    tp_btf(Probe::TcpSocketRead, "tcp_socket_read_tp"),
];
const UDP_SOCKET_READ: &[Variant] = &[Variant::Fentry(&UDP_READ_FENTRY)];
// No tracepoint marks a send call's start.
const SEND_TO_QDISC: &[Variant] = &[Variant::Fentry(&SEND_TO_QDISC_FENTRY)];
// No function marks the driver's transmit of one packet (see the model's table).
const QDISC_SOJOURN: &[Variant] = &[tp_btf(Probe::QdiscSojourn, SEND_DEVICE_PROGS[1])];
// The release of every skb passes consume_skb's tracepoint; no function stands in for all.
const DRIVER_TO_COMPLETION: &[Variant] = &[tp_btf(Probe::DriverToCompletion, "send_complete")];

/// Attach variants of `probe`, preferred first.
pub(crate) fn variants(probe: Probe) -> &'static [Variant] {
    match probe {
        Probe::IpStart => IP_START,
        Probe::TcpStart => TCP_START,
        Probe::UdpStart => UDP_START,
        Probe::TcpSocketEnqueued => TCP_SOCKET_ENQUEUED,
        Probe::UdpSocketEnqueued => UDP_SOCKET_ENQUEUED,
        Probe::TcpSocketRead => TCP_SOCKET_READ,
        Probe::UdpSocketRead => UDP_SOCKET_READ,
        Probe::SendToQdisc => SEND_TO_QDISC,
        Probe::QdiscSojourn => QDISC_SOJOURN,
        Probe::DriverToCompletion => DRIVER_TO_COMPLETION,
        // ip-start's programs measure it.
        Probe::NicToStack => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    use std::collections::{BTreeMap, BTreeSet};

    /// Program name → the attach target in its ELF section (`fentry/ip_rcv_core` →
    /// `ip_rcv_core`), as compiled from probes.bpf.c.
    fn sections() -> BTreeMap<String, String> {
        let mut storage = std::mem::MaybeUninit::uninit();
        let open = crate::skel::ProbesSkelBuilder::default()
            .open(&mut storage)
            .unwrap();
        open.open_object()
            .progs()
            .map(|p| {
                let section = p.section().to_string_lossy().into_owned();
                let target = section.split_once('/').map_or("", |(_, t)| t).to_owned();
                (p.name().to_string_lossy().into_owned(), target)
            })
            .collect()
    }

    #[test]
    fn every_program_in_the_object_belongs_to_a_probe_or_serves_them() {
        let in_object: BTreeSet<String> = sections().into_keys().collect();
        let in_table: BTreeSet<String> = Probe::ALL
            .iter()
            .flat_map(|p| variants(*p).iter().flat_map(|v| v.programs()))
            .chain(AUXILIARY.iter().map(|(prog, _)| *prog))
            .map(str::to_owned)
            .collect();
        assert_eq!(in_object, in_table);
    }

    /// Sections carry only the attach kind, so the model's table is the one source of
    /// targets; every program gets exactly one target from it.
    #[test]
    fn sections_name_no_target_and_the_table_gives_each_program_one() {
        for (prog, target) in sections() {
            assert_eq!(
                target, "",
                "program {prog}: SEC() names a target; the loader sets it"
            );
            assert!(
                target_of(&prog).is_some(),
                "program {prog} has no target in the table"
            );
        }
        assert_eq!(target_of("ip_start_tp"), Some("netif_receive_skb"));
        assert_eq!(target_of("reader_wait_switch"), Some("sched_switch"));
        assert_eq!(
            target_of("tcp_socket_read_fentry"),
            Some("tcp_recv_timestamp")
        );
    }
}
