//! The probe points: the receive path's, named as in the netstacklat paper, and the send
//! path's; and the one table of the kernel functions and tracepoints behind each.

use serde::{Deserialize, Serialize};

/// A measurement point. Each receive probe measures `now - skb->tstamp`, so later receive
/// probes include the time spent at earlier ones (latencies are cumulative along a path).
/// The send probes have no kernel stamp to subtract: each times its own interval, and
/// neither includes the other (see docs/probes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Probe {
    /// IP layer entry (ip_rcv_core / ip6_rcv_core).
    IpStart,
    /// TCP layer entry (tcp_v4_rcv / tcp_v6_rcv).
    TcpStart,
    /// UDP layer entry (udp_rcv / udpv6_rcv).
    UdpStart,
    /// Segment queued on the TCP socket (tcp_queue_rcv).
    TcpSocketEnqueued,
    /// Datagram queued on the UDP socket (__udp_enqueue_schedule_skb).
    UdpSocketEnqueued,
    /// Data read by the application from a TCP socket (tcp_recv_timestamp).
    TcpSocketRead,
    /// Datagram read by the application from a UDP socket (skb_consume_udp).
    UdpSocketRead,
    /// Send side: from the application's send call (tcp_sendmsg / udp_sendmsg /
    /// udpv6_sendmsg) to each of that call's packets reaching the device layer
    /// (__dev_queue_xmit). Packets the kernel sends later (TCP waiting for its window,
    /// pacing or small-queue limits) and the wait for send-buffer space are not counted:
    /// that time is the network's and the peer's.
    SendToQdisc,
    /// Send side: from the device layer (__dev_queue_xmit) to the driver's transmit call:
    /// the time a packet sat in the device's queueing discipline (qdisc).
    QdiscSojourn,
    /// Receive side, before the kernel's software stamp: from the NIC's hardware RX stamp
    /// (converted to the system clock with the device's PHC offset) to the software stamp
    /// the kernel takes once the driver hands the packet up. Measured at ip-start, only for
    /// packets a device stamped in hardware.
    NicToStack,
    /// Send side: from the driver's transmit call (net_dev_start_xmit) to the packet's
    /// release once the device sent it (TX completion: the driver frees it, `consume_skb`),
    /// on hardware devices only: a virtual device's "release" is another path's.
    DriverToCompletion,
}

/// Which protocol path a probe lies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// Shared by both paths (before the transport layer).
    Ip,
    /// TCP receive path.
    Tcp,
    /// UDP receive path.
    Udp,
    /// Send path (TCP and UDP). Its probes time separate intervals, not cumulative ones.
    Send,
    /// The NIC's part of the receive path (hardware stamp to software stamp): its own
    /// interval, before every receive probe's.
    Nic,
}

/// Where a probe hooks into the kernel. The BPF loader attaches to these and the pwru
/// sessions follow them, so there is one table rather than a copy per user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelHooks {
    /// Kernel functions hooked with fentry/fexit, one BPF program each (IPv4 before IPv6).
    pub functions: &'static [&'static str],
    /// The BTF tracepoint (tp_btf) standing in where the kernel refuses trampolines.
    pub tracepoint: Option<&'static str>,
    /// The functions pwru follows for this probe's stage, each with a `struct sk_buff *`
    /// parameter pwru can select (not `const`): the receive function, the queueing
    /// function, and for the read stages the functions that consume or free the skb once
    /// the reader took it (so the time from queueing to consumption shows per packet).
    /// Candidates: names the running kernel lacks or cannot trace are dropped before a
    /// session starts.
    pub pwru_functions: &'static [&'static str],
}

impl Probe {
    /// Every probe, in path order (ip-start first, reads last).
    pub const ALL: [Probe; 11] = [
        Probe::IpStart,
        Probe::TcpStart,
        Probe::UdpStart,
        Probe::TcpSocketEnqueued,
        Probe::UdpSocketEnqueued,
        Probe::TcpSocketRead,
        Probe::UdpSocketRead,
        Probe::SendToQdisc,
        Probe::QdiscSojourn,
        Probe::NicToStack,
        Probe::DriverToCompletion,
    ];

    /// Probe names joined by commas, as logs and tables show a set: `ip-start,tcp-socket-read`.
    pub fn names(probes: &[Probe]) -> String {
        probes
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The probe's name as operators and files use it, e.g. `tcp-socket-read`.
    pub const fn name(self) -> &'static str {
        match self {
            Probe::IpStart => "ip-start",
            Probe::TcpStart => "tcp-start",
            Probe::UdpStart => "udp-start",
            Probe::TcpSocketEnqueued => "tcp-socket-enqueued",
            Probe::UdpSocketEnqueued => "udp-socket-enqueued",
            Probe::TcpSocketRead => "tcp-socket-read",
            Probe::UdpSocketRead => "udp-socket-read",
            Probe::SendToQdisc => "send-to-qdisc",
            Probe::QdiscSojourn => "qdisc-sojourn",
            Probe::NicToStack => "nic-to-stack",
            Probe::DriverToCompletion => "driver-to-completion",
        }
    }

    /// Parse a probe name (`tcp-socket-read`, ...).
    pub fn from_name(s: &str) -> Option<Probe> {
        Probe::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The path this probe is on.
    pub const fn path(self) -> Path {
        match self {
            Probe::IpStart => Path::Ip,
            Probe::TcpStart | Probe::TcpSocketEnqueued | Probe::TcpSocketRead => Path::Tcp,
            Probe::UdpStart | Probe::UdpSocketEnqueued | Probe::UdpSocketRead => Path::Udp,
            Probe::SendToQdisc | Probe::QdiscSojourn | Probe::DriverToCompletion => Path::Send,
            Probe::NicToStack => Path::Nic,
        }
    }

    /// The probe before this one on its path, whose time this one includes (`None` for
    /// ip-start and for the send probes, which each time their own interval).
    pub const fn previous(self) -> Option<Probe> {
        match self {
            Probe::IpStart
            | Probe::SendToQdisc
            | Probe::QdiscSojourn
            | Probe::NicToStack
            | Probe::DriverToCompletion => None,
            Probe::TcpStart | Probe::UdpStart => Some(Probe::IpStart),
            Probe::TcpSocketEnqueued => Some(Probe::TcpStart),
            Probe::UdpSocketEnqueued => Some(Probe::UdpStart),
            Probe::TcpSocketRead => Some(Probe::TcpSocketEnqueued),
            Probe::UdpSocketRead => Some(Probe::UdpSocketEnqueued),
        }
    }

    /// A socket read: the application took the data (the stage where reader verdicts apply).
    pub const fn is_read(self) -> bool {
        match self {
            Probe::TcpSocketRead | Probe::UdpSocketRead => true,
            Probe::IpStart
            | Probe::TcpStart
            | Probe::UdpStart
            | Probe::TcpSocketEnqueued
            | Probe::UdpSocketEnqueued
            | Probe::SendToQdisc
            | Probe::QdiscSojourn
            | Probe::NicToStack
            | Probe::DriverToCompletion => false,
        }
    }

    /// On the send path: the probe's sample is a packet leaving the host.
    pub const fn is_send(self) -> bool {
        matches!(self.path(), Path::Send)
    }

    /// The probe whose kernel programs take this probe's samples: itself, except for
    /// nic-to-stack, which ip-start's programs measure (it has no hook of its own).
    pub const fn measured_by(self) -> Probe {
        match self {
            Probe::NicToStack => Probe::IpStart,
            p => p,
        }
    }

    /// Times an interval of its own rather than the time since the kernel's software
    /// stamp that the later receive probes include: its stage is itself.
    pub const fn is_own_interval(self) -> bool {
        matches!(self.path(), Path::Send | Path::Nic)
    }

    /// The Prometheus histogram family netstacklat's ebpf_exporter configuration gives this
    /// probe, and its help line: `/metrics` uses both, so dashboards built for netstacklat
    /// read tailtrap.
    pub const fn netstacklat_metric(self) -> (&'static str, &'static str) {
        match self {
            Probe::IpStart => (
                "netstack_latency_ip_start_seconds",
                "Time for packets to reach the start of the IP stack, per service",
            ),
            Probe::TcpStart => (
                "netstack_latency_tcp_start_seconds",
                "Time for packets to reach the start of the TCP stack, per service",
            ),
            Probe::UdpStart => (
                "netstack_latency_udp_start_seconds",
                "Time for packets to reach the start of the UDP stack, per service",
            ),
            Probe::TcpSocketEnqueued => (
                "netstack_latency_tcp_sock_enqueued_seconds",
                "Time until packets are queued to a TCP socket, per service",
            ),
            Probe::UdpSocketEnqueued => (
                "netstack_latency_udp_sock_enqueued_seconds",
                "Time until packets are queued to a UDP socket, per service",
            ),
            Probe::TcpSocketRead => (
                "netstack_latency_tcp_sock_read_seconds",
                "Time until packet data is read from a TCP socket, per service",
            ),
            Probe::UdpSocketRead => (
                "netstack_latency_udp_sock_read_seconds",
                "Time until packet data is read from a UDP socket, per service",
            ),
            Probe::SendToQdisc => (
                "netstack_latency_send_to_qdisc_seconds",
                "Time from a send call to its packets reaching the device queue, per service",
            ),
            Probe::QdiscSojourn => (
                "netstack_latency_qdisc_sojourn_seconds",
                "Time packets spent in the device's queueing discipline, per service",
            ),
            Probe::DriverToCompletion => (
                "netstack_latency_driver_to_completion_seconds",
                "Time from the driver's transmit call to the packet's release after transmission (TX completion), per service",
            ),
            Probe::NicToStack => (
                "netstack_latency_nic_to_stack_seconds",
                "Time from the NIC's hardware receive stamp to the kernel's software stamp, per service",
            ),
        }
    }

    /// The kernel functions and tracepoint behind this probe.
    pub const fn hooks(self) -> KernelHooks {
        match self {
            Probe::IpStart => KernelHooks {
                functions: &["ip_rcv_core", "ip6_rcv_core"],
                tracepoint: Some("netif_receive_skb"),
                pwru_functions: &[
                    "ip_rcv_core",
                    "ip_local_deliver",
                    "ip6_rcv_core",
                    "ip6_input",
                ],
            },
            Probe::TcpStart => KernelHooks {
                functions: &["tcp_v4_rcv", "tcp_v6_rcv"],
                tracepoint: Some("tcp_probe"),
                pwru_functions: &["tcp_v4_rcv", "tcp_v6_rcv", "tcp_rcv_established"],
            },
            Probe::UdpStart => KernelHooks {
                functions: &["udp_rcv", "udpv6_rcv"],
                tracepoint: None,
                pwru_functions: &[
                    "udp_rcv",
                    "udp_unicast_rcv_skb",
                    "udp_queue_rcv_one_skb",
                    "udpv6_rcv",
                ],
            },
            Probe::TcpSocketEnqueued => KernelHooks {
                functions: &["tcp_queue_rcv"],
                tracepoint: Some("sk_data_ready"),
                pwru_functions: &["tcp_data_queue", "tcp_queue_rcv"],
            },
            Probe::UdpSocketEnqueued => KernelHooks {
                functions: &["__udp_enqueue_schedule_skb"],
                tracepoint: Some("sk_data_ready"),
                pwru_functions: &["__udp_enqueue_schedule_skb"],
            },
            // skb_copy_datagram_iter (the copy to the reader, whose tracepoint stands in)
            // takes a `const struct sk_buff *`, which pwru never selects; the skb's release
            // after the read marks consumption.
            Probe::TcpSocketRead => KernelHooks {
                functions: &["tcp_recv_timestamp"],
                tracepoint: Some("skb_copy_datagram_iovec"),
                pwru_functions: &[
                    "tcp_eat_recv_skb",
                    "skb_attempt_defer_free",
                    "__kfree_skb",
                    "consume_skb",
                ],
            },
            Probe::UdpSocketRead => KernelHooks {
                functions: &["skb_consume_udp"],
                tracepoint: None,
                pwru_functions: &["skb_consume_udp", "__consume_stateless_skb", "consume_skb"],
            },
            // The call's start and end are hooked (fexit too, so a packet sent after the
            // call is not timed from it; fexit of sk_stream_wait_memory restarts the clock
            // after a wait for buffer space); the packet's time is taken at the device
            // layer's net_dev_queue tracepoint, which no function stands in for.
            Probe::SendToQdisc => KernelHooks {
                functions: &[
                    "tcp_sendmsg",
                    "udp_sendmsg",
                    "udpv6_sendmsg",
                    "sk_stream_wait_memory",
                ],
                tracepoint: None,
                pwru_functions: &[
                    "__tcp_transmit_skb",
                    "__ip_queue_xmit",
                    "ip_output",
                    "ip_finish_output2",
                    "ip6_output",
                    "ip6_finish_output2",
                    "__dev_queue_xmit",
                ],
            },
            // The driver's transmit per packet (xmit_one, netdev_start_xmit) is inlined:
            // only the net_dev_start_xmit tracepoint marks it, on every kernel; the
            // enqueue stamp comes from net_dev_queue.
            Probe::QdiscSojourn => KernelHooks {
                functions: &[],
                tracepoint: Some("net_dev_start_xmit"),
                pwru_functions: &["__dev_queue_xmit", "sch_direct_xmit", "dev_hard_start_xmit"],
            },
            // The release of a transmitted packet: the driver frees it once the device is
            // done (napi_consume_skb, dev_consume_skb_any and consume_skb all mark it with
            // this tracepoint); the transmit stamp comes from net_dev_start_xmit.
            Probe::DriverToCompletion => KernelHooks {
                functions: &[],
                tracepoint: Some("consume_skb"),
                pwru_functions: &["dev_hard_start_xmit", "napi_consume_skb", "consume_skb"],
            },
            // No hook of its own: ip-start's programs read the hardware stamp of the packets
            // they see. pwru follows the driver's hand-over to the stack, where the
            // software stamp is taken.
            Probe::NicToStack => KernelHooks {
                functions: &[],
                tracepoint: None,
                pwru_functions: &[
                    "napi_gro_receive",
                    "netif_receive_skb",
                    "__netif_receive_skb",
                    "netif_rx",
                ],
            },
        }
    }

    /// Stable small number (the index in [`Probe::ALL`]); the BPF side uses the same numbering.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The probe's bit in a set of probes held as a `u32` (`1 << id`).
    pub const fn bit(self) -> u32 {
        const { assert!(Probe::ALL.len() <= 32, "probe sets are u32 bit masks") };
        1 << self.id()
    }

    /// Inverse of [`Probe::id`].
    pub fn from_id(id: u32) -> Option<Probe> {
        Probe::ALL.get(id as usize).copied()
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Probe {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Probe::from_name(s).ok_or_else(|| {
            let names: Vec<_> = Probe::ALL.iter().map(|p| p.name()).collect();
            format!(
                "unknown probe {s:?} (expected one of: {})",
                names.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        for p in Probe::ALL {
            assert_eq!(Probe::from_name(p.name()), Some(p));
            assert_eq!(Probe::from_id(p.id()), Some(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.name())
            );
        }
        assert!("tcp-read".parse::<Probe>().is_err());
    }

    #[test]
    fn every_probe_has_hooks_and_pwru_functions() {
        for p in Probe::ALL {
            let h = p.hooks();
            let hooked = p.measured_by().hooks();
            assert!(
                !hooked.functions.is_empty() || hooked.tracepoint.is_some(),
                "{p}"
            );
            assert_eq!(
                h.functions.is_empty() && h.tracepoint.is_none(),
                p.measured_by() != p,
                "{p}"
            );
            assert!(!h.pwru_functions.is_empty(), "{p}");
            // pwru follows the hooked function wherever it takes a selectable skb;
            // tcp_recv_timestamp and the send calls take none.
            if !h.functions.is_empty() && p != Probe::TcpSocketRead && !p.is_send() {
                assert!(h.pwru_functions.contains(&h.functions[0]), "{p}");
            }
        }
    }

    #[test]
    fn paths_are_consistent() {
        for p in Probe::ALL {
            if let Some(prev) = p.previous() {
                assert!(!p.is_send() && !prev.is_send());
                assert!(prev.path() == Path::Ip || prev.path() == p.path());
                assert!(prev.id() < p.id());
            }
        }
    }
}
