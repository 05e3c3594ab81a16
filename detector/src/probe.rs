//! The receive-path probe points, named as in the netstacklat paper.

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
    fn paths_are_consistent() {
        for p in Probe::ALL {
            if let Some(prev) = p.previous() {
                assert!(prev.path() == Path::Ip || prev.path() == p.path());
                assert!(prev.id() < p.id());
            }
        }
    }
}
