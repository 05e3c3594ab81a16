//! Which BPF program implements which probe, per attach method.

use detector::Probe;

/// One way of attaching a probe: the programs to load and what they hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// fentry/fexit programs and their kernel functions.
    Fentry(&'static [(&'static str, &'static str)]),
    /// A tp_btf program and its tracepoint.
    TpBtf(&'static str, &'static str),
}

impl Variant {
    /// Program names of this variant.
    pub(crate) fn programs(self) -> Vec<&'static str> {
        match self {
            Variant::Fentry(list) => list.iter().map(|(prog, _)| *prog).collect(),
            Variant::TpBtf(prog, _) => vec![prog],
        }
    }
}

/// The program shared by tcp-socket-enqueued and udp-socket-enqueued; which of the two it
/// records is set in its read-only data.
pub(crate) const SK_DATA_READY_PROG: &str = "socket_enqueued_tp";

/// Attach variants of `probe`, preferred first.
pub(crate) fn variants(probe: Probe) -> &'static [Variant] {
    use Variant::{Fentry, TpBtf};
    match probe {
        Probe::IpStart => &[
            Fentry(&[
                ("ip_start_fentry_v4", "ip_rcv_core"),
                ("ip_start_fentry_v6", "ip6_rcv_core"),
            ]),
            TpBtf("ip_start_tp", "netif_receive_skb"),
        ],
        Probe::TcpStart => &[
            Fentry(&[
                ("tcp_start_fentry_v4", "tcp_v4_rcv"),
                ("tcp_start_fentry_v6", "tcp_v6_rcv"),
            ]),
            TpBtf("tcp_start_tp", "tcp_probe"),
        ],
        Probe::UdpStart => &[Fentry(&[
            ("udp_start_fentry_v4", "udp_rcv"),
            ("udp_start_fentry_v6", "udpv6_rcv"),
        ])],
        Probe::TcpSocketEnqueued => &[
            Fentry(&[("tcp_socket_enqueued_fexit", "tcp_queue_rcv")]),
            TpBtf(SK_DATA_READY_PROG, "sk_data_ready"),
        ],
        Probe::UdpSocketEnqueued => &[
            Fentry(&[("udp_socket_enqueued_fexit", "__udp_enqueue_schedule_skb")]),
            TpBtf(SK_DATA_READY_PROG, "sk_data_ready"),
        ],
        Probe::TcpSocketRead => &[
            Fentry(&[("tcp_socket_read_fentry", "tcp_recv_timestamp")]),
            TpBtf("tcp_socket_read_tp", "skb_copy_datagram_iovec"),
        ],
        Probe::UdpSocketRead => &[Fentry(&[("udp_socket_read_fentry", "skb_consume_udp")])],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_in_the_object_belongs_to_a_probe() {
        use libbpf_rs::skel::{OpenSkel, SkelBuilder};
        use std::collections::BTreeSet;

        let mut storage = std::mem::MaybeUninit::uninit();
        let open = crate::skel::ProbesSkelBuilder::default()
            .open(&mut storage)
            .unwrap();
        let in_object: BTreeSet<String> = open
            .open_object()
            .progs()
            .map(|p| p.name().to_string_lossy().into_owned())
            .collect();
        let in_table: BTreeSet<String> = Probe::ALL
            .iter()
            .flat_map(|p| variants(*p).iter().flat_map(|v| v.programs()))
            .map(str::to_owned)
            .collect();
        assert_eq!(in_object, in_table);
    }
}
