//! The receive-path probe points, named as in the netstacklat paper, and the one table of
//! the kernel functions and tracepoints behind each.

use serde::{Deserialize, Serialize};

/// A receive-path measurement point. Each measures `now - skb->tstamp`, so later probes
/// include the time spent at earlier ones (latencies are cumulative along a path).
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
    pub const ALL: [Probe; 7] = [
        Probe::IpStart,
        Probe::TcpStart,
        Probe::UdpStart,
        Probe::TcpSocketEnqueued,
        Probe::UdpSocketEnqueued,
        Probe::TcpSocketRead,
        Probe::UdpSocketRead,
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
        }
    }

    /// The probe before this one on its path (`None` for ip-start).
    pub const fn previous(self) -> Option<Probe> {
        match self {
            Probe::IpStart => None,
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
            | Probe::UdpSocketEnqueued => false,
        }
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
        }
    }

    /// Stable small number (the index in [`Probe::ALL`]); the BPF side uses the same numbering.
    pub const fn id(self) -> u32 {
        self as u32
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
            assert!(!h.functions.is_empty(), "{p}");
            assert!(!h.pwru_functions.is_empty(), "{p}");
            // pwru follows the hooked function wherever it takes a selectable skb;
            // tcp_recv_timestamp takes none.
            if p != Probe::TcpSocketRead {
                assert!(h.pwru_functions.contains(&h.functions[0]), "{p}");
            }
        }
    }

    #[test]
    fn paths_are_consistent() {
        for p in Probe::ALL {
            if let Some(prev) = p.previous() {
                assert!(prev.path() == Path::Ip || prev.path() == p.path());
                assert!(prev.id() < p.id());
            }
        }
    }
}
