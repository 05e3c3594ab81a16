//! Frozen leaf types shared by several records. Never edited: a change is a new type.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use model::{Flow, Histogram, Probe, SocketQueue, Transport};
use serde::{Deserialize, Serialize};

/// [`Probe`] as every record stores it: the variant's index, in this order.
///
/// The one frozen type that may grow, and only at its end: a record stores the index, so
/// every byte written before a variant was appended keeps its meaning (pinned by
/// `probe_indexes_never_move` below), and the records holding it keep their versions.
/// Schema 9 appended the send probes, schema 10 nic-to-stack and driver-to-completion; an
/// older build refuses a database of a newer schema, so it never meets an index it lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ProbeV1 {
    IpStart,
    TcpStart,
    UdpStart,
    TcpSocketEnqueued,
    UdpSocketEnqueued,
    TcpSocketRead,
    UdpSocketRead,
    // Schema 9.
    SendToQdisc,
    QdiscSojourn,
    // Schema 10.
    NicToStack,
    DriverToCompletion,
}

impl From<Probe> for ProbeV1 {
    fn from(p: Probe) -> ProbeV1 {
        match p {
            Probe::IpStart => ProbeV1::IpStart,
            Probe::TcpStart => ProbeV1::TcpStart,
            Probe::UdpStart => ProbeV1::UdpStart,
            Probe::TcpSocketEnqueued => ProbeV1::TcpSocketEnqueued,
            Probe::UdpSocketEnqueued => ProbeV1::UdpSocketEnqueued,
            Probe::TcpSocketRead => ProbeV1::TcpSocketRead,
            Probe::UdpSocketRead => ProbeV1::UdpSocketRead,
            Probe::SendToQdisc => ProbeV1::SendToQdisc,
            Probe::QdiscSojourn => ProbeV1::QdiscSojourn,
            Probe::NicToStack => ProbeV1::NicToStack,
            Probe::DriverToCompletion => ProbeV1::DriverToCompletion,
        }
    }
}

impl From<ProbeV1> for Probe {
    fn from(p: ProbeV1) -> Probe {
        match p {
            ProbeV1::IpStart => Probe::IpStart,
            ProbeV1::TcpStart => Probe::TcpStart,
            ProbeV1::UdpStart => Probe::UdpStart,
            ProbeV1::TcpSocketEnqueued => Probe::TcpSocketEnqueued,
            ProbeV1::UdpSocketEnqueued => Probe::UdpSocketEnqueued,
            ProbeV1::TcpSocketRead => Probe::TcpSocketRead,
            ProbeV1::UdpSocketRead => Probe::UdpSocketRead,
            ProbeV1::SendToQdisc => Probe::SendToQdisc,
            ProbeV1::QdiscSojourn => Probe::QdiscSojourn,
            ProbeV1::NicToStack => Probe::NicToStack,
            ProbeV1::DriverToCompletion => Probe::DriverToCompletion,
        }
    }
}

/// [`Transport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TransportV1 {
    Tcp,
    Udp,
    Other(u8),
}

/// An IP address as serde's binary form of [`IpAddr`] writes it: the family's index,
/// then the octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum IpAddrV1 {
    V4([u8; 4]),
    V6([u8; 16]),
}

impl From<IpAddr> for IpAddrV1 {
    fn from(a: IpAddr) -> IpAddrV1 {
        match a {
            IpAddr::V4(a) => IpAddrV1::V4(a.octets()),
            IpAddr::V6(a) => IpAddrV1::V6(a.octets()),
        }
    }
}

impl From<IpAddrV1> for IpAddr {
    fn from(a: IpAddrV1) -> IpAddr {
        match a {
            IpAddrV1::V4(o) => IpAddr::V4(Ipv4Addr::from(o)),
            IpAddrV1::V6(o) => IpAddr::V6(Ipv6Addr::from(o)),
        }
    }
}

/// [`Flow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FlowV1 {
    pub(crate) transport: TransportV1,
    pub(crate) src: IpAddrV1,
    pub(crate) sport: u16,
    pub(crate) dst: IpAddrV1,
    pub(crate) dport: u16,
}

impl From<Flow> for FlowV1 {
    fn from(f: Flow) -> FlowV1 {
        // Destructured: a field added to the live type is a compile error here.
        let Flow {
            transport,
            src,
            sport,
            dst,
            dport,
        } = f;
        FlowV1 {
            transport: match transport {
                Transport::Tcp => TransportV1::Tcp,
                Transport::Udp => TransportV1::Udp,
                Transport::Other(p) => TransportV1::Other(p),
            },
            src: src.into(),
            sport,
            dst: dst.into(),
            dport,
        }
    }
}

impl From<FlowV1> for Flow {
    fn from(f: FlowV1) -> Flow {
        Flow {
            transport: match f.transport {
                TransportV1::Tcp => Transport::Tcp,
                TransportV1::Udp => Transport::Udp,
                TransportV1::Other(p) => Transport::Other(p),
            },
            src: f.src.into(),
            sport: f.sport,
            dst: f.dst.into(),
            dport: f.dport,
        }
    }
}

/// [`SocketQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SocketQueueV1 {
    pub(crate) bytes: u32,
    pub(crate) skbs: u32,
    pub(crate) rmem_alloc: u32,
    pub(crate) rcvbuf: u32,
}

impl From<SocketQueue> for SocketQueueV1 {
    fn from(q: SocketQueue) -> SocketQueueV1 {
        let SocketQueue {
            bytes,
            skbs,
            rmem_alloc,
            rcvbuf,
        } = q;
        SocketQueueV1 {
            bytes,
            skbs,
            rmem_alloc,
            rcvbuf,
        }
    }
}

impl From<SocketQueueV1> for SocketQueue {
    fn from(q: SocketQueueV1) -> SocketQueue {
        SocketQueue {
            bytes: q.bytes,
            skbs: q.skbs,
            rmem_alloc: q.rmem_alloc,
            rcvbuf: q.rcvbuf,
        }
    }
}

/// A histogram, sparse: `(bucket index, count)` of the non-empty buckets in index order,
/// the count and the sum. History records: one per point (version 1), a chunk's points
/// (version 2, `Vec<(offset ns, HistogramV1)>`). `history_chunk::put_point` writes the
/// same bytes without building one (a test checks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HistogramV1 {
    pub(crate) buckets: Vec<(u64, u64)>,
    pub(crate) count: u64,
    pub(crate) sum_ns: u64,
}

impl From<&Histogram> for HistogramV1 {
    fn from(h: &Histogram) -> HistogramV1 {
        HistogramV1 {
            buckets: h.nonzero().map(|(i, c)| (i as u64, c)).collect(),
            count: h.count(),
            sum_ns: h.sum_ns(),
        }
    }
}

impl TryFrom<HistogramV1> for Histogram {
    type Error = String;
    fn try_from(h: HistogramV1) -> Result<Histogram, String> {
        Histogram::from_sparse(h.buckets, h.count, h.sum_ns).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each probe's stored byte, forever: appending is the only change allowed.
    #[test]
    fn probe_indexes_never_move() {
        let pinned = [
            (Probe::IpStart, 0u8),
            (Probe::TcpStart, 1),
            (Probe::UdpStart, 2),
            (Probe::TcpSocketEnqueued, 3),
            (Probe::UdpSocketEnqueued, 4),
            (Probe::TcpSocketRead, 5),
            (Probe::UdpSocketRead, 6),
            (Probe::SendToQdisc, 7),
            (Probe::QdiscSojourn, 8),
            (Probe::NicToStack, 9),
            (Probe::DriverToCompletion, 10),
        ];
        assert_eq!(
            pinned.len(),
            Probe::ALL.len(),
            "a new probe needs its pinned byte"
        );
        for (probe, byte) in pinned {
            let bytes = postcard::to_allocvec(&ProbeV1::from(probe)).expect("encodes");
            assert_eq!(bytes, [byte], "{probe}");
            let back: ProbeV1 = postcard::from_bytes(&[byte]).expect("decodes");
            assert_eq!(Probe::from(back), probe);
        }
    }
}
