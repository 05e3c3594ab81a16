//! In-kernel capture of slow SKBs: arming per (service, probe) thresholds, the rate limits,
//! and the ring-buffer reader that turns kernel records into [`model::Sample`]s.
//!
//! The BPF side (`src/bpf/capture.bpf.h`) compares each sample with one `.bss` word, the
//! lowest threshold set, before any capture work: a sample below every threshold (with the
//! flight recorder on, nearly all of them) or with nothing set costs that one compare.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapHandle, RingBufferBuilder};
use model::{
    Comm, CpuHolder, Flow, Probe, ReaderWait, Sample, SampleFlags, SocketQueue, Transport,
};
use serde::{Deserialize, Serialize};

use crate::loader::ProbeSet;
use crate::skel::types;

// The record is read as the BTF-generated type; its size is the kernel's.
const RECORD_BYTES: usize = std::mem::size_of::<types::tt_capture_record>();
const _: () = assert!(RECORD_BYTES == 184, "tt_capture_record layout changed");
const _: () = assert!(std::mem::size_of::<types::tt_capture_threshold>() == 16);

/// Service slots that can be armed: the kernel's `TT_CAPTURE_MAX_SLOTS`, from the skeleton.
const MAX_SLOTS: u32 = types::tt_capture_limit::TT_CAPTURE_MAX_SLOTS.0;
/// Bursts the rate limits let through at once, as a share of one second of their rate.
const BURST: Duration = Duration::from_millis(100);
/// Records that may wait between the reader thread and the consumer: about half a minute
/// at the default rate limits, for a consumer that stalls.
const CHANNEL_RECORDS: usize = 65_536;
/// How often the reader thread looks at its stop flag and drains the ring while it is not
/// woken (the probes wake it once a batch is waiting): the longest a record waits.
const POLL: Duration = Duration::from_millis(100);

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Why a capture operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A limit or threshold is out of range.
    #[error("capture setting: {0}")]
    Config(String),
    /// A BPF map operation failed.
    #[error("{stage}: {source}")]
    Bpf {
        /// What was being done.
        stage: &'static str,
        /// The libbpf error.
        source: libbpf_rs::Error,
    },
    /// The BPF object has no `.bss` (never the case for the shipped object).
    #[error("the BPF object has no .bss section")]
    NoBss,
    /// Starting the reader thread failed.
    #[error("starting the capture reader thread: {0}")]
    Thread(std::io::Error),
    /// An operation on capture before capture was set up on the probe set (for users that
    /// hold the probe set and its capture together).
    #[error("in-kernel capture was not started on these probes")]
    NotStarted,
}

/// Rate limits and sampling of capture, all applied in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLimits {
    /// Armed capture: records per second at most, all services together.
    pub rate_limit: u32,
    /// Armed capture: keep one slow SKB in N (1: all).
    pub sample_one_in: u32,
    /// Flight recorder: records per second at most.
    pub flight_rate: u32,
}

impl Default for CaptureLimits {
    fn default() -> Self {
        CaptureLimits {
            rate_limit: 2000,
            sample_one_in: 1,
            flight_rate: 20,
        }
    }
}

/// Capture counters kept in the kernel, summed over CPUs, since the probes were loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureCounters {
    /// Armed-capture records written to the ring buffer.
    pub emitted: u64,
    /// Armed-capture records lost because the ring buffer was full.
    pub ring_full: u64,
    /// Slow SKBs not recorded because of the armed-capture rate limit.
    pub rate_limited: u64,
    /// Flight-recorder records written to the ring buffer.
    pub flight_emitted: u64,
    /// Flight-recorder records lost because the ring buffer was full.
    pub flight_ring_full: u64,
    /// Slow SKBs not recorded because of the flight recorder's rate limit.
    pub flight_rate_limited: u64,
}

/// One slow SKB from the ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRecord {
    /// Service slot it was attributed to ([`ProbeSet::service_name`] names it).
    pub service_slot: u32,
    /// Emitted by the flight recorder (not by armed capture).
    pub flight: bool,
    /// The record; `incident` is 0 until the consumer assigns it.
    pub sample: Sample,
}

/// Arms and disarms capture. Keeps what is armed, so the kernel's mode word is exact.
#[derive(Debug, Default)]
pub struct CaptureControl {
    armed: BTreeMap<(u32, Probe), u64>,
    flight: BTreeMap<(u32, Probe), u64>,
}

impl CaptureControl {
    /// Take over capture on `set`: apply `limits`, clear every threshold, nothing armed.
    pub fn new(set: &mut ProbeSet, limits: &CaptureLimits) -> Result<Self, CaptureError> {
        let control = CaptureControl::default();
        control.set_limits(set, limits)?;
        let map = &set.skel_mut().maps.capture_thresholds;
        let zero = [0u8; 16];
        for idx in 0..MAX_SLOTS * types::tt_probe::TT_NUM_PROBES.0 {
            map.update(&idx.to_ne_bytes(), &zero, MapFlags::ANY)
                .map_err(bpf_err("clearing the capture thresholds"))?;
        }
        control.write_mode(set)?;
        Ok(control)
    }

    /// Change the rate limits and sampling; takes effect at once.
    pub fn set_limits(
        &self,
        set: &mut ProbeSet,
        limits: &CaptureLimits,
    ) -> Result<(), CaptureError> {
        let armed = gcra(limits.rate_limit, "rate_limit")?;
        let flight = gcra(limits.flight_rate, "flight_rate")?;
        if limits.sample_one_in == 0 {
            return Err(CaptureError::Config(
                "sample_one_in must be at least 1".into(),
            ));
        }
        let bss = bss(set)?;
        bss.capture_one_in = limits.sample_one_in;
        (bss.armed_interval_ns, bss.armed_burst_ns) = armed;
        (bss.flight_interval_ns, bss.flight_burst_ns) = flight;
        Ok(())
    }

    /// Arm capture for a service slot: record SKBs at or above each probe's threshold (ns).
    /// Probes not listed stay as they were.
    pub fn arm(
        &mut self,
        set: &mut ProbeSet,
        slot: u32,
        thresholds: &[(Probe, u64)],
    ) -> Result<(), CaptureError> {
        self.put_thresholds(set, slot, thresholds, |c, probe, ns| {
            if ns == 0 {
                return Err(CaptureError::Config(format!(
                    "threshold of {probe} must be above 0 ns"
                )));
            }
            c.armed.insert((slot, probe), ns);
            Ok(())
        })?;
        self.write_mode(set)
    }

    /// Stop armed capture for a service slot (the flight recorder carries on).
    pub fn disarm(&mut self, set: &mut ProbeSet, slot: u32) -> Result<(), CaptureError> {
        let probes: Vec<Probe> = self
            .armed
            .keys()
            .filter(|(s, _)| *s == slot)
            .map(|(_, p)| *p)
            .collect();
        // Mode first: the kernel stops looking before the thresholds go.
        for &p in &probes {
            self.armed.remove(&(slot, p));
        }
        self.write_mode(set)?;
        for p in probes {
            self.write_threshold(set, slot, p)?;
        }
        Ok(())
    }

    /// Stop armed capture for every service.
    pub fn disarm_all(&mut self, set: &mut ProbeSet) -> Result<(), CaptureError> {
        let slots: Vec<u32> = self.armed.keys().map(|(s, _)| *s).collect();
        for slot in slots {
            self.disarm(set, slot)?;
        }
        Ok(())
    }

    /// Set the flight recorder's thresholds (ns) for a service slot; `0` switches a probe off.
    pub fn set_flight_thresholds(
        &mut self,
        set: &mut ProbeSet,
        slot: u32,
        thresholds: &[(Probe, u64)],
    ) -> Result<(), CaptureError> {
        self.put_thresholds(set, slot, thresholds, |c, probe, ns| {
            if ns == 0 {
                c.flight.remove(&(slot, probe));
            } else {
                c.flight.insert((slot, probe), ns);
            }
            Ok(())
        })?;
        self.write_mode(set)
    }

    /// Record each of a slot's `thresholds` with `put`, then write that probe's armed and
    /// flight thresholds to the kernel, one probe at a time.
    fn put_thresholds(
        &mut self,
        set: &mut ProbeSet,
        slot: u32,
        thresholds: &[(Probe, u64)],
        mut put: impl FnMut(&mut Self, Probe, u64) -> Result<(), CaptureError>,
    ) -> Result<(), CaptureError> {
        check_slot(slot)?;
        for &(probe, ns) in thresholds {
            put(self, probe, ns)?;
            self.write_threshold(set, slot, probe)?;
        }
        Ok(())
    }

    /// Whether armed capture is on for a service slot.
    pub fn is_armed(&self, slot: u32) -> bool {
        self.armed.keys().any(|(s, _)| *s == slot)
    }

    /// The armed thresholds: (slot, probe) -> ns.
    pub fn armed(&self) -> &BTreeMap<(u32, Probe), u64> {
        &self.armed
    }

    fn write_threshold(
        &self,
        set: &mut ProbeSet,
        slot: u32,
        probe: Probe,
    ) -> Result<(), CaptureError> {
        let idx = slot * types::tt_probe::TT_NUM_PROBES.0 + probe.id();
        let armed = self.armed.get(&(slot, probe)).copied().unwrap_or(0);
        let flight = self.flight.get(&(slot, probe)).copied().unwrap_or(0);
        let mut value = [0u8; 16];
        value[..8].copy_from_slice(&armed.to_ne_bytes());
        value[8..].copy_from_slice(&flight.to_ne_bytes());
        set.skel_mut()
            .maps
            .capture_thresholds
            .update(&idx.to_ne_bytes(), &value, MapFlags::ANY)
            .map_err(bpf_err("setting a capture threshold"))
    }

    fn write_mode(&self, set: &mut ProbeSet) -> Result<(), CaptureError> {
        let mut mode = 0;
        if !self.armed.is_empty() {
            mode |= types::tt_capture_mode::TT_CAPTURE_MODE_ARMED.0;
        }
        if !self.flight.is_empty() {
            mode |= types::tt_capture_mode::TT_CAPTURE_MODE_FLIGHT.0;
        }
        // The lowest threshold set: the probes compare a sample with it before any lookup.
        let min = self
            .armed
            .values()
            .chain(self.flight.values())
            .copied()
            .min()
            .unwrap_or(0);
        let bss = bss(set)?;
        bss.capture_mode = mode;
        bss.capture_min_ns = min;
        // The scheduler hooks cost every context switch: attached only while armed.
        set.follow_readers(!self.armed.is_empty());
        Ok(())
    }
}

/// The kernel's capture counters, summed over CPUs.
pub fn capture_counters(set: &mut ProbeSet) -> Result<CaptureCounters, CaptureError> {
    // Capture's counters share the probes' counter array, at their own indexes.
    let map = &set.skel_mut().maps.counters;
    let read = |c: types::tt_counter| -> Result<u64, CaptureError> {
        let per_cpu = map
            .lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf_err("reading the capture counters"))?
            .unwrap_or_default();
        Ok(per_cpu
            .iter()
            .filter_map(|v| v.as_slice().try_into().ok().map(u64::from_ne_bytes))
            .fold(0u64, u64::saturating_add))
    };
    use types::tt_counter as C;
    Ok(CaptureCounters {
        emitted: read(C::TT_CAPTURE_ARMED_EMITTED)?,
        ring_full: read(C::TT_CAPTURE_ARMED_RING_FULL)?,
        rate_limited: read(C::TT_CAPTURE_ARMED_RATE_LIMITED)?,
        flight_emitted: read(C::TT_CAPTURE_FLIGHT_EMITTED)?,
        flight_ring_full: read(C::TT_CAPTURE_FLIGHT_RING_FULL)?,
        flight_rate_limited: read(C::TT_CAPTURE_FLIGHT_RATE_LIMITED)?,
    })
}

/// The records the reader thread has handed over, oldest first; at most a bound of them
/// wait, the rest are counted as overflow.
///
/// An unbounded channel with a count of what waits, not `sync_channel(bound)`: that one
/// allocates every slot up front, and as records cycle through the slots all of them
/// (12 MiB at 65 536) become resident for the daemon's life, while the channel usually
/// holds one interval's few records.
#[derive(Debug)]
pub struct Records {
    rx: Receiver<CaptureRecord>,
    waiting: Arc<AtomicUsize>,
}

/// The reader thread's end of [`Records`].
struct RecordSender {
    tx: Sender<CaptureRecord>,
    waiting: Arc<AtomicUsize>,
    bound: usize,
}

fn record_channel(bound: usize) -> (RecordSender, Records) {
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = Arc::new(AtomicUsize::new(0));
    (
        RecordSender {
            tx,
            waiting: waiting.clone(),
            bound,
        },
        Records { rx, waiting },
    )
}

impl RecordSender {
    /// Hand `record` over unless `bound` records wait already (or the consumer is gone).
    fn try_send(&self, record: CaptureRecord) -> bool {
        // One sender: the count can only fall between this check and the increment.
        if self.waiting.load(Ordering::Acquire) >= self.bound {
            return false;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(record).is_err() {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }
}

impl Records {
    fn took(&self, r: CaptureRecord) -> CaptureRecord {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        r
    }

    /// The next record, if one waits.
    pub fn try_recv(&self) -> Result<CaptureRecord, TryRecvError> {
        self.rx.try_recv().map(|r| self.took(r))
    }

    /// The next record, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<CaptureRecord, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).map(|r| self.took(r))
    }

    /// Every record waiting now.
    pub fn try_iter(&self) -> impl Iterator<Item = CaptureRecord> + '_ {
        self.rx.try_iter().map(|r| self.took(r))
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads the capture ring buffer on its own thread and hands records over a channel.
/// Dropping it stops the thread.
#[derive(Debug)]
pub struct CaptureReader {
    records: Records,
    stop: Arc<AtomicBool>,
    overflow: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl CaptureReader {
    /// Start reading `set`'s capture ring buffer.
    pub fn start(set: &mut ProbeSet) -> Result<CaptureReader, CaptureError> {
        // An fd of our own: the thread must not borrow the skeleton.
        let ring = MapHandle::try_from(&set.skel_mut().maps.capture_ring)
            .map_err(bpf_err("opening the capture ring buffer"))?;
        let (tx, records) = record_channel(CHANNEL_RECORDS);
        let stop = Arc::new(AtomicBool::new(false));
        let overflow = Arc::new(AtomicU64::new(0));
        let (thread_stop, thread_overflow) = (stop.clone(), overflow.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("capture-ring".into())
            .spawn(move || read_ring(&ring, &tx, &thread_stop, &thread_overflow, &ready_tx))
            .map_err(CaptureError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                let _ = thread.join();
                return Err(CaptureError::Bpf {
                    stage: "setting up the capture ring buffer",
                    source,
                });
            }
            Err(_) => {
                let _ = thread.join();
                return Err(CaptureError::Thread(std::io::Error::other(
                    "the reader thread ended before reading",
                )));
            }
        }
        Ok(CaptureReader {
            records,
            stop,
            overflow,
            thread: Some(thread),
        })
    }

    /// The records read so far, in ring order.
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// Records dropped in user space because the consumer fell behind by more than the
    /// channel holds.
    pub fn overflow(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }
}

impl Drop for CaptureReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_ring(
    ring: &MapHandle,
    tx: &RecordSender,
    stop: &AtomicBool,
    overflow: &AtomicU64,
    ready: &std::sync::mpsc::Sender<Result<(), libbpf_rs::Error>>,
) {
    let mut builder = RingBufferBuilder::new();
    let built = builder
        .add(ring, |bytes: &[u8]| {
            // A record of another size cannot come from this object: skip it.
            if let Some(record) = decode_record(bytes) {
                if !tx.try_send(record) {
                    overflow.fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        })
        .map(|_| ());
    let rb = match built.and_then(|()| builder.build()) {
        Ok(rb) => rb,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    // The receiver lives in CaptureReader, whose drop sets `stop`: no other way out.
    while !stop.load(Ordering::Relaxed) {
        rb.poll_raw(POLL);
        // The probes wake the reader per batch, not per record: take what a quiet ring
        // holds at each timeout too.
        rb.consume_raw();
    }
}

/// A kernel record as a sample (incident 0).
/// A sender's name, read when its record is drained (within the interval): the transmit
/// that made the record often runs in another task's context. Empty once it has exited.
fn process_comm(pid: u32) -> Comm {
    std::fs::read(format!("/proc/{pid}/comm")).map_or_else(
        |_| Comm::default(),
        |raw| Comm::from_kernel(raw.strip_suffix(b"\n").unwrap_or(&raw)),
    )
}

fn decode_record(bytes: &[u8]) -> Option<CaptureRecord> {
    if bytes.len() < RECORD_BYTES {
        return None;
    }
    // SAFETY: tt_capture_record is a repr(C) integer-only type generated from the object's
    // BTF, so any bytes of its size are a valid value; the length was checked and
    // read_unaligned copes with the ring's 8-byte alignment either way.
    let r: types::tt_capture_record =
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<types::tt_capture_record>()) };
    let probe = Probe::from_id(r.probe)?;
    let has = |f: types::tt_capture_flag| r.flags & f.0 != 0;
    use types::tt_capture_flag as F;
    let (src, dst) = match r.family {
        AF_INET => (
            IpAddr::V4(Ipv4Addr::new(
                r.saddr[0], r.saddr[1], r.saddr[2], r.saddr[3],
            )),
            IpAddr::V4(Ipv4Addr::new(
                r.daddr[0], r.daddr[1], r.daddr[2], r.daddr[3],
            )),
        ),
        AF_INET6 => (
            IpAddr::V6(Ipv6Addr::from(r.saddr)),
            IpAddr::V6(Ipv6Addr::from(r.daddr)),
        ),
        _ => (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::UNSPECIFIED.into()),
    };
    let mut flags = SampleFlags::empty();
    if has(F::TT_CAPTURE_F_HOL_SUSPECT) {
        flags.insert(SampleFlags::HOL_SUSPECT);
    }
    if has(F::TT_CAPTURE_F_SUBSAMPLED) {
        flags.insert(SampleFlags::SUBSAMPLED);
    }
    if has(F::TT_CAPTURE_F_KSOFTIRQD) {
        flags.insert(SampleFlags::KSOFTIRQD);
    }
    let process = has(F::TT_CAPTURE_F_PROCESS);
    let sender = has(F::TT_CAPTURE_F_SENDER);
    Some(CaptureRecord {
        service_slot: r.service,
        flight: has(F::TT_CAPTURE_F_FLIGHT),
        sample: Sample {
            time_ns: r.time_ns,
            incident: 0,
            probe,
            latency_ns: r.latency_ns,
            flow: Flow {
                transport: Transport::from_ip_proto(r.ip_proto),
                src,
                sport: r.sport,
                dst,
                dport: r.dport,
            },
            cgroup_id: r.cgroup_id,
            pid: (process || sender).then_some(r.pid),
            comm: if process {
                Comm::from_kernel(&r.comm)
            } else if sender {
                process_comm(r.pid)
            } else {
                Comm::default()
            },
            cpu: r.cpu,
            ifindex: r.ifindex,
            netns_ino: r.netns_ino,
            skb_len: r.skb_len,
            socket_queue: has(F::TT_CAPTURE_F_SOCKET).then_some(SocketQueue {
                bytes: r.queue_bytes,
                skbs: r.queue_skbs,
                rmem_alloc: r.rmem_alloc,
                rcvbuf: r.rcvbuf,
            }),
            tcp_seq: has(F::TT_CAPTURE_F_TCP_SEQ).then_some(r.tcp_seq),
            flags,
            skb: (r.skb_addr != 0).then_some(r.skb_addr),
            reader_wait: has(F::TT_CAPTURE_F_READER_WAIT).then(|| ReaderWait {
                runq_ns: r.runq_ns,
                off_cpu_ns: r.off_cpu_ns,
                cpu_holder: has(F::TT_CAPTURE_F_CPU_HOLDER).then(|| CpuHolder {
                    pid: r.holder_pid,
                    comm: Comm::from_kernel(&r.holder_comm),
                }),
            }),
            rx_queue: has(F::TT_CAPTURE_F_RX_QUEUE).then_some(r.rx_queue),
        },
    })
}

/// GCRA parameters (interval, burst) of a records-per-second limit.
fn gcra(per_second: u32, key: &str) -> Result<(u64, u64), CaptureError> {
    if per_second == 0 {
        return Err(CaptureError::Config(format!(
            "{key} must be at least 1 record/s"
        )));
    }
    let interval = 1_000_000_000 / u64::from(per_second);
    Ok((interval, BURST.as_nanos() as u64))
}

fn check_slot(slot: u32) -> Result<(), CaptureError> {
    if slot >= MAX_SLOTS {
        return Err(CaptureError::Config(format!(
            "service slot {slot} is beyond the {MAX_SLOTS} slots capture can arm"
        )));
    }
    Ok(())
}

fn bss(set: &mut ProbeSet) -> Result<&mut types::bss, CaptureError> {
    set.skel_mut()
        .maps
        .bss_data
        .as_deref_mut()
        .ok_or(CaptureError::NoBss)
}

fn bpf_err(stage: &'static str) -> impl Fn(libbpf_rs::Error) -> CaptureError {
    move |source| CaptureError::Bpf { stage, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u64) -> CaptureRecord {
        CaptureRecord {
            service_slot: 1,
            flight: false,
            sample: model::fixtures::sample(0, i, 1_000 + i),
        }
    }

    /// The kernel's flag word as the sample's flags: an ip-start record the CPU's ksoftirqd
    /// processed is marked, with no process.
    #[test]
    fn a_record_processed_in_ksoftirqd_is_marked() {
        use types::tt_capture_flag as F;
        let mut r = types::tt_capture_record {
            probe: Probe::IpStart.id(),
            family: AF_INET,
            latency_ns: 7_000_000,
            flags: F::TT_CAPTURE_F_KSOFTIRQD.0 | F::TT_CAPTURE_F_FLIGHT.0,
            ..Default::default()
        };
        // SAFETY: a repr(C) integer-only type viewed as its bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts((&raw const r).cast::<u8>(), RECORD_BYTES) };
        let rec = decode_record(bytes).expect("decodes");
        assert!(rec.flight);
        assert!(rec.sample.flags.contains(SampleFlags::KSOFTIRQD));
        assert_eq!(rec.sample.flags.names().collect::<Vec<_>>(), ["ksoftirqd"]);
        assert_eq!(rec.sample.pid, None);
        r.flags = F::TT_CAPTURE_F_PROCESS.0;
        // SAFETY: as above.
        let bytes =
            unsafe { std::slice::from_raw_parts((&raw const r).cast::<u8>(), RECORD_BYTES) };
        let rec = decode_record(bytes).expect("decodes");
        assert!(!rec.sample.flags.contains(SampleFlags::KSOFTIRQD));
    }

    /// A send-side record names its sender by pid, and the name comes from /proc.
    #[test]
    fn a_senders_record_carries_its_pid_and_name() {
        use types::tt_capture_flag as F;
        let r = types::tt_capture_record {
            probe: Probe::QdiscSojourn.id(),
            family: AF_INET,
            pid: std::process::id(),
            flags: F::TT_CAPTURE_F_SENDER.0,
            ..Default::default()
        };
        // SAFETY: a repr(C) integer-only type viewed as its bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts((&raw const r).cast::<u8>(), RECORD_BYTES) };
        let rec = decode_record(bytes).expect("decodes");
        assert_eq!(rec.sample.pid, Some(std::process::id()));
        let own = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        assert_eq!(rec.sample.comm.as_str(), own.trim_end());
        assert!(!rec.sample.comm.is_empty());
        // Without the flag the pid field is not the sample's.
        let r = types::tt_capture_record { flags: 0, ..r };
        // SAFETY: as above.
        let bytes =
            unsafe { std::slice::from_raw_parts((&raw const r).cast::<u8>(), RECORD_BYTES) };
        assert_eq!(decode_record(bytes).expect("decodes").sample.pid, None);
    }

    /// The RX queue is the sample's only where the kernel recorded one (the flag), queue 0
    /// included.
    #[test]
    fn a_records_rx_queue_is_kept_only_where_the_kernel_recorded_one() {
        use types::tt_capture_flag as F;
        let mut r = types::tt_capture_record {
            probe: Probe::IpStart.id(),
            family: AF_INET,
            ifindex: 4,
            rx_queue: 0,
            flags: F::TT_CAPTURE_F_RX_QUEUE.0,
            ..Default::default()
        };
        for (flags, queue, want) in [
            (F::TT_CAPTURE_F_RX_QUEUE.0, 0, Some(0)),
            (F::TT_CAPTURE_F_RX_QUEUE.0, 3, Some(3)),
            (F::TT_CAPTURE_F_RX_QUEUE.0, u16::MAX - 1, Some(u16::MAX - 1)),
            (0, 3, None),
        ] {
            r.flags = flags;
            r.rx_queue = queue;
            // SAFETY: a repr(C) integer-only type viewed as its bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts((&raw const r).cast::<u8>(), RECORD_BYTES) };
            let rec = decode_record(bytes).expect("decodes");
            assert_eq!(rec.sample.rx_queue, want, "flags {flags:#x} queue {queue}");
            assert_eq!(rec.sample.ifindex, 4);
        }
    }

    #[test]
    fn the_record_channel_holds_its_bound_and_frees_room_as_records_are_taken() {
        let (tx, rx) = record_channel(3);
        let sent: Vec<bool> = (0..5).map(|i| tx.try_send(record(i))).collect();
        assert_eq!(sent, [true, true, true, false, false]);
        assert_eq!(rx.len(), 3);
        assert_eq!(rx.try_recv().map(|r| r.sample.tcp_seq), Ok(Some(0)));
        assert!(tx.try_send(record(5)));
        assert!(!tx.try_send(record(6)));
        let seqs: Vec<_> = rx.try_iter().map(|r| r.sample.tcp_seq).collect();
        assert_eq!(seqs, [Some(1), Some(2), Some(5)]);
        assert!(rx.is_empty());
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Timeout)
        );
        drop(rx);
        assert!(!tx.try_send(record(7)), "no consumer: nothing is queued");
    }
}
