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
    /// Functions taking a `struct sk_buff *` that a packet tracer follows for this probe.
    /// Equal to `functions` except where the hooked function has no skb parameter.
    pub skb_functions: &'static [&'static str],
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

    /// The kernel functions and tracepoint behind this probe.
    pub const fn hooks(self) -> KernelHooks {
        const fn same(functions: &'static [&'static str], tp: Option<&'static str>) -> KernelHooks {
            KernelHooks {
                functions,
                tracepoint: tp,
                skb_functions: functions,
            }
        }
        match self {
            Probe::IpStart => same(&["ip_rcv_core", "ip6_rcv_core"], Some("netif_receive_skb")),
            Probe::TcpStart => same(&["tcp_v4_rcv", "tcp_v6_rcv"], Some("tcp_probe")),
            Probe::UdpStart => same(&["udp_rcv", "udpv6_rcv"], None),
            Probe::TcpSocketEnqueued => same(&["tcp_queue_rcv"], Some("sk_data_ready")),
            Probe::UdpSocketEnqueued => {
                same(&["__udp_enqueue_schedule_skb"], Some("sk_data_ready"))
            }
            // tcp_recv_timestamp takes no skb: the copy of a segment to the reader stands in.
            Probe::TcpSocketRead => KernelHooks {
                functions: &["tcp_recv_timestamp"],
                tracepoint: Some("skb_copy_datagram_iovec"),
                skb_functions: &["skb_copy_datagram_iter"],
            },
            Probe::UdpSocketRead => same(&["skb_consume_udp"], None),
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
    fn packet_tracers_follow_the_hooked_functions_where_they_carry_an_skb() {
        for p in Probe::ALL {
            let h = p.hooks();
            assert!(!h.functions.is_empty(), "{p}");
            if p == Probe::TcpSocketRead {
                assert_eq!(h.skb_functions, ["skb_copy_datagram_iter"]);
            } else {
                assert_eq!(h.skb_functions, h.functions, "{p}");
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
