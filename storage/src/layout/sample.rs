//! Frozen layouts of the samples tree. A sample's command name is borrowed from the
//! buffer it is read from (and from the live sample when written), so neither way
//! allocates per sample. Never edited: a change is a new type and chunk version.

use model::{Comm, CpuHolder, ReaderWait, Sample, SampleFlags};
use serde::{Deserialize, Serialize};

use super::common::{FlowV1, ProbeV1, SocketQueueV1};

/// A sample before it carried its skb address: one-sample records (envelope version 1,
/// schema 1) and version 2 chunks; the fields every later layout starts with.
///
/// The later layouts hold it as their first field: postcard writes a nested struct's
/// fields in place, with nothing around them, so their bytes are those of the same
/// fields written one by one (the golden files pin them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

impl SampleV1<'_> {
    /// The live sample of these fields and of those a later layout adds after them
    /// (`None` where the layout has none).
    fn thaw(
        self,
        skb: Option<u64>,
        reader_wait: Option<ReaderWaitV1<'_>>,
        rx_queue: Option<u16>,
    ) -> Result<Sample, String> {
        Ok(Sample {
            time_ns: self.time_ns,
            incident: self.incident,
            probe: self.probe.into(),
            latency_ns: self.latency_ns,
            flow: self.flow.into(),
            cgroup_id: self.cgroup_id,
            pid: self.pid,
            comm: Comm::try_from(self.comm).map_err(|e| e.to_string())?,
            cpu: self.cpu,
            ifindex: self.ifindex,
            netns_ino: self.netns_ino,
            skb_len: self.skb_len,
            socket_queue: self.socket_queue.map(Into::into),
            tcp_seq: self.tcp_seq,
            // Bits of a newer build are dropped, not refused: the rest is still evidence.
            flags: SampleFlags::from_bits_truncate(self.flags),
            skb,
            reader_wait: reader_wait.map(ReaderWait::try_from).transpose()?,
            rx_queue,
        })
    }
}

impl TryFrom<SampleV1<'_>> for Sample {
    type Error = String;
    fn try_from(s: SampleV1<'_>) -> Result<Sample, String> {
        s.thaw(None, None, None)
    }
}

/// A sample with its skb address: the samples of version 3 chunks (uncompressed) and of
/// version 4 chunks (the lz4 block's content). [`SampleV1`]'s fields, then the address.
/// Only read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SampleV3<'a> {
    #[serde(borrow)]
    v1: SampleV1<'a>,
    skb: Option<u64>,
}

impl TryFrom<SampleV3<'_>> for Sample {
    type Error = String;
    fn try_from(s: SampleV3<'_>) -> Result<Sample, String> {
        s.v1.thaw(s.skb, None, None)
    }
}

/// A sample with how its reader waited: the samples of version 5 chunks (the lz4 block's
/// content). [`SampleV3`]'s fields, then the reader's wait. Only read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SampleV5<'a> {
    #[serde(borrow)]
    v1: SampleV1<'a>,
    skb: Option<u64>,
    #[serde(borrow)]
    reader_wait: Option<ReaderWaitV1<'a>>,
}

/// [`ReaderWait`], first stored in [`SampleV5`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReaderWaitV1<'a> {
    runq_ns: u64,
    off_cpu_ns: u64,
    #[serde(borrow)]
    cpu_holder: Option<CpuHolderV1<'a>>,
}

/// [`CpuHolder`], its command name borrowed as a sample's is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CpuHolderV1<'a> {
    pid: u32,
    comm: &'a str,
}

impl TryFrom<SampleV5<'_>> for Sample {
    type Error = String;
    fn try_from(s: SampleV5<'_>) -> Result<Sample, String> {
        s.v1.thaw(s.skb, s.reader_wait, None)
    }
}

/// A sample with the RX queue it came in on: the samples of version 6 chunks (the lz4
/// block's content). [`SampleV5`]'s fields, then the RX queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SampleV6<'a> {
    #[serde(borrow)]
    v1: SampleV1<'a>,
    skb: Option<u64>,
    #[serde(borrow)]
    reader_wait: Option<ReaderWaitV1<'a>>,
    rx_queue: Option<u16>,
}

impl<'a> From<&'a Sample> for SampleV6<'a> {
    fn from(s: &'a Sample) -> SampleV6<'a> {
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
            reader_wait,
            rx_queue,
        } = s;
        SampleV6 {
            v1: SampleV1 {
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
            },
            skb: *skb,
            reader_wait: reader_wait.as_ref().map(Into::into),
            rx_queue: *rx_queue,
        }
    }
}

impl TryFrom<SampleV6<'_>> for Sample {
    type Error = String;
    fn try_from(s: SampleV6<'_>) -> Result<Sample, String> {
        s.v1.thaw(s.skb, s.reader_wait, s.rx_queue)
    }
}

impl<'a> From<&'a ReaderWait> for ReaderWaitV1<'a> {
    fn from(w: &'a ReaderWait) -> ReaderWaitV1<'a> {
        let ReaderWait {
            runq_ns,
            off_cpu_ns,
            cpu_holder,
        } = w;
        ReaderWaitV1 {
            runq_ns: *runq_ns,
            off_cpu_ns: *off_cpu_ns,
            cpu_holder: cpu_holder.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<ReaderWaitV1<'_>> for ReaderWait {
    type Error = String;
    fn try_from(w: ReaderWaitV1<'_>) -> Result<ReaderWait, String> {
        Ok(ReaderWait {
            runq_ns: w.runq_ns,
            off_cpu_ns: w.off_cpu_ns,
            cpu_holder: w.cpu_holder.map(CpuHolder::try_from).transpose()?,
        })
    }
}

impl<'a> From<&'a CpuHolder> for CpuHolderV1<'a> {
    fn from(h: &'a CpuHolder) -> CpuHolderV1<'a> {
        let CpuHolder { pid, comm } = h;
        CpuHolderV1 {
            pid: *pid,
            comm: comm.as_str(),
        }
    }
}

impl TryFrom<CpuHolderV1<'_>> for CpuHolder {
    type Error = String;
    fn try_from(h: CpuHolderV1<'_>) -> Result<CpuHolder, String> {
        Ok(CpuHolder {
            pid: h.pid,
            comm: Comm::try_from(h.comm).map_err(|e| e.to_string())?,
        })
    }
}

/// Samples written as a sequence of [`SampleV6`] without collecting them first.
pub(crate) struct SamplesV6<'a>(pub(crate) &'a [&'a Sample]);

impl Serialize for SamplesV6<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|&x| SampleV6::from(x)))
    }
}

/// One sample as a layout before [`SampleV6`] holds it: [`SampleV6`]'s encoding without
/// its last `dropped` fields (each `None`, one 0 byte): 1 for [`SampleV5`] (no RX queue),
/// 2 for [`SampleV3`] (no reader's wait either), 3 for [`SampleV1`] (no skb address
/// either). For tests that make the records of earlier builds; the fields dropped must be
/// `None`.
#[cfg(test)]
pub(crate) fn sample_bytes_before(s: &Sample, dropped: usize) -> Vec<u8> {
    let mut one = postcard::to_allocvec(&SampleV6::from(s)).expect("a sample encodes");
    for field in ["rx_queue", "reader_wait", "skb"].iter().take(dropped) {
        assert_eq!(
            one.pop(),
            Some(0),
            "{field} of a layout that has none: {s:?}"
        );
    }
    one
}

/// Samples as a layout before [`SampleV6`] holds them in a chunk: their count, then each
/// as [`sample_bytes_before`] makes it.
#[cfg(test)]
fn samples_bytes_before(samples: &[Sample], dropped: usize) -> Vec<u8> {
    let mut out = postcard::to_allocvec(&samples.len()).expect("a length encodes");
    for s in samples {
        out.extend(sample_bytes_before(s, dropped));
    }
    out
}

/// Samples as the layout of version 5 chunks holds them (a sequence of [`SampleV5`]), as
/// builds before the RX queue wrote them. `samples` must have no RX queue.
#[cfg(test)]
pub(crate) fn samples_v5_bytes(samples: &[Sample]) -> Vec<u8> {
    samples_bytes_before(samples, 1)
}

/// Samples as the layout of version 3 and 4 chunks holds them (a sequence of [`SampleV3`]),
/// as builds before the reader's wait wrote them. `samples` must have neither a reader's
/// wait nor an RX queue.
#[cfg(test)]
pub(crate) fn samples_v3_bytes(samples: &[Sample]) -> Vec<u8> {
    samples_bytes_before(samples, 2)
}
