//! Frozen layouts of the samples tree. A sample's command name is borrowed from the
//! buffer it is read from (and from the live sample when written), so neither way
//! allocates per sample. Never edited: a change is a new type and chunk version.

use model::{Comm, Sample, SampleFlags};
use serde::{Deserialize, Serialize};

use super::common::{FlowV1, ProbeV1, SocketQueueV1};

/// A sample before it carried its skb address: one-sample records (envelope version 1,
/// schema 1) and version 2 chunks. Only read.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct SampleV1<'a> {
    time_ns: u64,
    incident: u64,
    probe: ProbeV1,
    latency_ns: u64,
    flow: FlowV1,
    cgroup_id: u64,
    pid: Option<u32>,
    comm: &'a str,
    cpu: u32,
    ifindex: u32,
    netns_ino: u32,
    skb_len: u32,
    socket_queue: Option<SocketQueueV1>,
    tcp_seq: Option<u32>,
    /// [`SampleFlags`]' bits.
    flags: u32,
}

impl TryFrom<SampleV1<'_>> for Sample {
    type Error = String;
    fn try_from(s: SampleV1<'_>) -> Result<Sample, String> {
        Ok(Sample {
            time_ns: s.time_ns,
            incident: s.incident,
            probe: s.probe.into(),
            latency_ns: s.latency_ns,
            flow: s.flow.into(),
            cgroup_id: s.cgroup_id,
            pid: s.pid,
            comm: Comm::try_from(s.comm).map_err(|e| e.to_string())?,
            cpu: s.cpu,
            ifindex: s.ifindex,
            netns_ino: s.netns_ino,
            skb_len: s.skb_len,
            socket_queue: s.socket_queue.map(Into::into),
            tcp_seq: s.tcp_seq,
            // Bits of a newer build are dropped, not refused: the rest is still evidence.
            flags: SampleFlags::from_bits_truncate(s.flags),
            skb: None,
        })
    }
}

/// A sample with its skb address: the samples of version 3 chunks (uncompressed) and of
/// version 4 chunks (the lz4 block's content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SampleV3<'a> {
    time_ns: u64,
    incident: u64,
    probe: ProbeV1,
    latency_ns: u64,
    flow: FlowV1,
    cgroup_id: u64,
    pid: Option<u32>,
    comm: &'a str,
    cpu: u32,
    ifindex: u32,
    netns_ino: u32,
    skb_len: u32,
    socket_queue: Option<SocketQueueV1>,
    tcp_seq: Option<u32>,
    /// [`SampleFlags`]' bits.
    flags: u32,
    skb: Option<u64>,
}

impl<'a> From<&'a Sample> for SampleV3<'a> {
    fn from(s: &'a Sample) -> SampleV3<'a> {
        // Destructured: a field added to the live sample is a compile error here until it
        // has a place in a new layout.
        let Sample {
            time_ns,
            incident,
            probe,
            latency_ns,
            flow,
            cgroup_id,
            pid,
            comm,
            cpu,
            ifindex,
            netns_ino,
            skb_len,
            socket_queue,
            tcp_seq,
            flags,
            skb,
        } = s;
        SampleV3 {
            time_ns: *time_ns,
            incident: *incident,
            probe: (*probe).into(),
            latency_ns: *latency_ns,
            flow: (*flow).into(),
            cgroup_id: *cgroup_id,
            pid: *pid,
            comm: comm.as_str(),
            cpu: *cpu,
            ifindex: *ifindex,
            netns_ino: *netns_ino,
            skb_len: *skb_len,
            socket_queue: socket_queue.map(Into::into),
            tcp_seq: *tcp_seq,
            flags: flags.bits(),
            skb: *skb,
        }
    }
}

impl TryFrom<SampleV3<'_>> for Sample {
    type Error = String;
    fn try_from(s: SampleV3<'_>) -> Result<Sample, String> {
        Ok(Sample {
            time_ns: s.time_ns,
            incident: s.incident,
            probe: s.probe.into(),
            latency_ns: s.latency_ns,
            flow: s.flow.into(),
            cgroup_id: s.cgroup_id,
            pid: s.pid,
            comm: Comm::try_from(s.comm).map_err(|e| e.to_string())?,
            cpu: s.cpu,
            ifindex: s.ifindex,
            netns_ino: s.netns_ino,
            skb_len: s.skb_len,
            socket_queue: s.socket_queue.map(Into::into),
            tcp_seq: s.tcp_seq,
            flags: SampleFlags::from_bits_truncate(s.flags),
            skb: s.skb,
        })
    }
}

/// Samples written as a sequence of [`SampleV3`] without collecting them first.
pub(crate) struct SamplesV3<'a>(pub(crate) &'a [&'a Sample]);

impl Serialize for SamplesV3<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|&x| SampleV3::from(x)))
    }
}
