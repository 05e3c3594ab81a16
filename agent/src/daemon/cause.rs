//! The cause verdict of each open incident: figures taken when it opens, again a few
//! intervals later and then every few intervals while it stays open, and a last time when
//! it closes; the detector's [`diagnosis`](detector::diagnosis) decides from their growth.
//! Costs: one per-CPU lookup of one histogram entry, a few small /proc and cgroup files, one
//! scan of /proc/PID/stat and one netlink dump of the devices' per-queue counters per
//! decision, for open incidents only.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use detector::diagnosis::{
    self, Cause, CauseInput, CauseKind, CpuSoftirq, Holder, ReaderTimes, RxDevice, RxQueueInput,
    RxQueueSlow, SlowReadHolder, SlowReadWaits,
};
use model::{Flow, Histogram, Probe, Sample, SampleFlags};

use super::host_figures::{self, CpuNet, CpuStat, ProcStat, SchedTimes};
use super::kernel::Kernel;
use crate::metrics::Cumulative;

/// Intervals after the opening before the first verdict: the window needs packets.
const FIRST_AFTER: u64 = 3;
/// Intervals between verdicts while the incident stays open.
const EVERY: u64 = 5;
/// Slow packets are those at least this many times the baseline's value at the quantile
/// that shifted (a baseline's own tail is spread over every CPU).
const SLOW_FACTOR: f64 = 2.0;
/// Reader processes followed per incident, and holders named.
const MAX_READERS: usize = 8;
const MAX_HOLDERS: usize = 3;
/// (device, RX queue) pairs followed per incident, and distinct flows counted per queue:
/// bounds on what a flood of samples can make an incident hold.
const MAX_RX_QUEUES: usize = 512;
const MAX_QUEUE_FLOWS: usize = 64;

/// Open incidents' figures at their opening, by incident id.
#[derive(Default)]
pub(super) struct Causes {
    open: HashMap<u64, Tracked>,
}

/// What an incident's verdicts judge: the stage that grew, as the detector attributed it.
struct Target {
    /// The stage's name, as operators read it.
    stage: Option<String>,
    /// Probe at the end of the stage.
    probe: Probe,
    /// Probe at the start of the read stage (socket enqueue), when the stage is the read.
    enqueued: Option<Probe>,
    /// The baseline's value at the stage's end, ns.
    baseline_ns: f64,
}

impl Target {
    fn of(inc: &detector::Incident) -> Target {
        match &inc.stage {
            Some(s) => {
                let row = s.stages.iter().find(|r| r.stage == s.stage);
                let read = s.stage.to.is_read();
                Target {
                    stage: Some(s.stage.name()),
                    probe: s.stage.to,
                    enqueued: if read { s.stage.from } else { None },
                    baseline_ns: row.map_or(inc.headline.baseline.value_ns, |r| r.baseline_ns),
                }
            }
            None => Target {
                stage: None,
                probe: inc.headline.probe,
                enqueued: None,
                baseline_ns: inc.headline.baseline.value_ns,
            },
        }
    }
}

struct Tracked {
    service: String,
    /// The service's slot in the probes' maps (`None`: it has none, as a host-wide incident).
    slot: Option<u32>,
    /// The stage judged (its name), when the detector attributed one.
    stage: Option<String>,
    probe: Probe,
    /// Probe at the start of the read stage (socket enqueue), when the stage is the read.
    enqueued: Option<Probe>,
    slow_ns: u64,
    opened: Instant,
    intervals: u64,
    per_cpu: Option<Vec<Histogram>>,
    cumulative: HashMap<Probe, Histogram>,
    net: HashMap<u32, CpuNet>,
    processes: HashMap<u32, ProcStat>,
    /// Reader tgid → what its threads did since it was first seen.
    readers: HashMap<u32, Reader>,
    reader_cpus: HashSet<u32>,
    /// Per CPU, slow samples taken outside a process's context since the opening, and how
    /// many of them its ksoftirqd processed.
    softirq_samples: HashMap<u32, (u64, u64)>,
    /// The reader-wait split summed over the slow reads that carry it, and the run-queue
    /// time of the slow reads each task held the CPU before (pid → comm, ns).
    slow_reads: SlowReadWaits,
    slow_read_holders: HashMap<u32, (String, u64)>,
    /// Slow-packet samples at the stage's probe since the opening, and those of them that
    /// carry an RX queue, per (netns, ifindex, queue): how many, and their flows.
    slow_at_probe: u64,
    rx_slow: HashMap<(u32, u32, u16), (u64, HashSet<Flow>)>,
    /// The (netns, ifindex, queue) any of the service's samples since the opening came in
    /// on.
    rx_seen: BTreeSet<(u32, u32, u16)>,
    /// The devices' RX packets per (ifindex, queue) at the opening (this namespace's).
    queue_packets: Option<HashMap<(u32, u16), u64>>,
    /// The last clear verdict: kept when later figures, diluted by the quiet intervals
    /// before the closing, are mixed.
    clear: Option<Cause>,
}

impl Tracked {
    /// An incident's tracking as it opens, before any figure is read: what its verdicts
    /// judge, and nothing gathered yet.
    fn new(service: String, slot: Option<u32>, target: Target, opened: Instant) -> Tracked {
        Tracked {
            service,
            slot,
            stage: target.stage,
            probe: target.probe,
            enqueued: target.enqueued,
            slow_ns: (target.baseline_ns * SLOW_FACTOR).max(1.0) as u64,
            opened,
            intervals: 0,
            per_cpu: None,
            cumulative: HashMap::new(),
            net: HashMap::new(),
            processes: HashMap::new(),
            readers: HashMap::new(),
            reader_cpus: HashSet::new(),
            softirq_samples: HashMap::new(),
            slow_reads: SlowReadWaits::default(),
            slow_read_holders: HashMap::new(),
            slow_at_probe: 0,
            rx_slow: HashMap::new(),
            rx_seen: BTreeSet::new(),
            queue_packets: None,
            clear: None,
        }
    }
}

/// A reading process followed: its threads' schedstat as last read, the growth summed up
/// to then (read every interval, so threads that come and go, one per connection, keep what
/// they did), and its cgroup's throttling counters when first seen.
struct Reader {
    last: HashMap<u32, SchedTimes>,
    grown: SchedTimes,
    throttle: Option<CpuStat>,
}

impl Reader {
    fn new(pid: u32, last: HashMap<u32, SchedTimes>) -> Reader {
        Reader {
            last,
            grown: SchedTimes::default(),
            throttle: host_figures::throttling_of(pid),
        }
    }

    /// Add what its threads did since the last read; false when the process is gone.
    fn follow(&mut self, pid: u32) -> bool {
        let now = host_figures::process_sched(pid);
        if now.is_empty() {
            return false;
        }
        let g = host_figures::sched_growth(&self.last, &now);
        self.grown.on_cpu_ns += g.on_cpu_ns;
        self.grown.run_wait_ns += g.run_wait_ns;
        self.last = now;
        true
    }
}

impl Causes {
    /// Incident `id` opened: take the figures its verdicts grow from.
    pub(super) fn opened<K: Kernel>(
        &mut self,
        id: u64,
        inc: &detector::Incident,
        slot: Option<u32>,
        kernel: &mut K,
        cumulative: &Cumulative,
        now: Instant,
    ) {
        let mut t = Tracked::new(inc.service.clone(), slot, Target::of(inc), now);
        t.per_cpu = slot
            .map(|slot| kernel.per_cpu_hist(slot, t.probe))
            .transpose()
            .map_err(|e| tracing::debug!(incident = id, error = %e, "per-CPU histogram not read"))
            .ok()
            .flatten()
            .flatten();
        t.net = host_figures::cpu_net();
        t.processes = host_figures::all_processes();
        t.queue_packets = rx_queues::packets();
        t.cumulative = t
            .probes()
            .filter_map(|p| Some((p, cumulative_of(cumulative, &t.service, p)?)))
            .collect();
        self.open.insert(id, t);
    }

    /// Incident `id` was updated: when the stage that grew is another one now, its verdicts
    /// judge that stage from here on, from figures taken now. The earlier stage's readers,
    /// CPUs and samples say nothing about it, and its last clear verdict is no longer kept
    /// over a mixed one.
    pub(super) fn updated<K: Kernel>(
        &mut self,
        id: u64,
        inc: &detector::Incident,
        kernel: &mut K,
        cumulative: &Cumulative,
        now: Instant,
    ) {
        let Some(t) = self.open.get(&id) else {
            return;
        };
        let slot = t.slot;
        let target = Target::of(inc);
        if (t.probe, t.enqueued) == (target.probe, target.enqueued) {
            return;
        }
        tracing::info!(
            incident = id,
            service = %inc.service,
            stage = target.stage.as_deref().unwrap_or(""),
            "cause verdicts follow the incident's new stage"
        );
        self.opened(id, inc, slot, kernel, cumulative, now);
    }

    /// Samples of open incidents: the readers to follow are the processes that read slow
    /// packets, their CPUs those of the samples taken since the opening (not the flight
    /// recorder's from before it, `before_opening`).
    pub(super) fn samples(&mut self, samples: &[Sample], before_opening: bool) {
        for s in samples {
            let Some(t) = self.open.get_mut(&s.incident) else {
                continue;
            };
            if !before_opening {
                t.note_rx_queue(s);
            }
            if !s.probe.is_read() {
                if !before_opening && s.pid.is_none() {
                    let e = t.softirq_samples.entry(s.cpu).or_default();
                    e.0 += 1;
                    if s.flags.contains(SampleFlags::KSOFTIRQD) {
                        e.1 += 1;
                    }
                }
                continue;
            }
            let Some(pid) = s.pid else { continue };
            if !before_opening {
                t.reader_cpus.insert(s.cpu);
            }
            if let Some(w) = &s.reader_wait {
                let r = &mut t.slow_reads;
                r.reads += 1;
                r.latency_ns = r.latency_ns.saturating_add(s.latency_ns);
                r.runq_ns = r.runq_ns.saturating_add(w.runq_ns);
                r.off_cpu_ns = r.off_cpu_ns.saturating_add(w.off_cpu_ns);
                if !r.cpus.contains(&s.cpu) {
                    r.cpus.push(s.cpu);
                }
                // The idle task (pid 0) held no CPU from anyone.
                if let Some(h) = w.cpu_holder.filter(|h| h.pid != 0) {
                    let e = t
                        .slow_read_holders
                        .entry(h.pid)
                        .or_insert_with(|| (h.comm.as_str().to_owned(), 0));
                    e.1 = e.1.saturating_add(w.runq_ns);
                }
            }
            if t.readers.len() < MAX_READERS && !t.readers.contains_key(&pid) {
                // A process already gone (or a kernel without schedstat) says nothing: it
                // must not count as a reader that never ran.
                let sched = host_figures::process_sched(pid);
                if !sched.is_empty() {
                    t.readers.insert(pid, Reader::new(pid, sched));
                }
            }
        }
    }

    /// One interval passed: the verdicts due now, by incident id.
    pub(super) fn interval<K: Kernel>(
        &mut self,
        kernel: &mut K,
        cumulative: &Cumulative,
        now: Instant,
    ) -> Vec<(u64, Cause)> {
        let mut due = Vec::new();
        for (&id, t) in &mut self.open {
            if t.opened == now {
                continue; // opened in this interval: its window starts now
            }
            t.intervals += 1;
            t.readers.retain(|&pid, r| r.follow(pid));
            if t.intervals == FIRST_AFTER
                || (t.intervals > FIRST_AFTER && (t.intervals - FIRST_AFTER) % EVERY == 0)
            {
                due.push(id);
            }
        }
        if due.is_empty() {
            return Vec::new();
        }
        // One scan of the processes and the CPUs for every verdict of this interval.
        let processes = host_figures::all_processes();
        let net = host_figures::cpu_net();
        due.into_iter()
            .filter_map(|id| {
                let t = self.open.get_mut(&id)?;
                let cause = t.decide(kernel, cumulative, &processes, &net, now);
                Some((id, t.keep_clear(cause)?))
            })
            .collect()
    }

    /// Incident `id` closed: its last verdict, if it was followed.
    pub(super) fn closed<K: Kernel>(
        &mut self,
        id: u64,
        kernel: &mut K,
        cumulative: &Cumulative,
        now: Instant,
    ) -> Option<Cause> {
        let mut t = self.open.remove(&id)?;
        if t.intervals < FIRST_AFTER {
            // Too short a window to say anything: the verdict stays undecided.
            return None;
        }
        t.readers.retain(|&pid, r| r.follow(pid));
        let processes = host_figures::all_processes();
        let net = host_figures::cpu_net();
        let cause = t.decide(kernel, cumulative, &processes, &net, now);
        // The closing verdict is the last clear one if these figures are mixed.
        t.keep_clear(cause.clone()).or(t.clear).or(Some(cause))
    }
}

fn cumulative_of(c: &Cumulative, service: &str, probe: Probe) -> Option<Histogram> {
    c.get(&(service.to_owned(), probe)).map(|h| (**h).clone())
}

impl Tracked {
    /// `cause` if it is worth storing: a clear verdict (kept as the last clear one), or
    /// "no clear cause" while no clear verdict was given yet; `None` keeps the stored one.
    fn keep_clear(&mut self, cause: Cause) -> Option<Cause> {
        if cause.kind != CauseKind::NoClearCause {
            self.clear = Some(cause.clone());
            return Some(cause);
        }
        self.clear.is_none().then_some(cause)
    }

    /// The RX queue `s` came in on, and whether it was one of the slow packets at the
    /// stage's probe.
    fn note_rx_queue(&mut self, s: &Sample) {
        let slow = s.probe == self.probe && s.latency_ns >= self.slow_ns;
        if slow {
            self.slow_at_probe += 1;
        }
        let Some(queue) = s.rx_queue else {
            return;
        };
        let key = (s.netns_ino, s.ifindex, queue);
        if self.rx_seen.len() < MAX_RX_QUEUES {
            self.rx_seen.insert(key);
        }
        if !slow || (self.rx_slow.len() >= MAX_RX_QUEUES && !self.rx_slow.contains_key(&key)) {
            return;
        }
        let (n, flows) = self.rx_slow.entry(key).or_default();
        *n += 1;
        if flows.len() < MAX_QUEUE_FLOWS {
            flows.insert(s.flow);
        }
    }

    /// The slow packets' RX queues and their devices, with each device's own per-queue
    /// counts over the window where this namespace's kernel keeps them (`now`).
    fn rx_queues(&self, now: Option<&HashMap<(u32, u16), u64>>) -> Option<RxQueueInput> {
        if self.rx_slow.is_empty() {
            return None;
        }
        let mut queues: Vec<RxQueueSlow> = self
            .rx_slow
            .iter()
            .map(
                |(&(netns_ino, ifindex, queue), (slow, flows))| RxQueueSlow {
                    ifindex,
                    netns_ino,
                    queue,
                    slow: *slow,
                    flows: flows.len() as u64,
                },
            )
            .collect();
        queues.sort_by_key(|q| (q.netns_ino, q.ifindex, q.queue));
        let here = rx_queues::own_netns();
        let mut devices: Vec<(u32, u32)> =
            queues.iter().map(|q| (q.netns_ino, q.ifindex)).collect();
        devices.dedup();
        let devices = devices
            .into_iter()
            .map(|(netns_ino, ifindex)| {
                // Names and counters are this namespace's: a device elsewhere is known by
                // its index only.
                let local = here == Some(netns_ino) && ifindex != 0;
                let name = local.then(|| rx_queues::name_of(ifindex)).flatten();
                RxDevice {
                    ifindex,
                    netns_ino,
                    rx_queues: name.as_deref().and_then(rx_queues::rx_queue_count),
                    queue_packets: local
                        .then(|| rx_queues::growth(self.queue_packets.as_ref()?, now?, ifindex))
                        .flatten(),
                    name,
                    service_queues: self
                        .rx_seen
                        .range((netns_ino, ifindex, 0)..=(netns_ino, ifindex, u16::MAX))
                        .map(|&(_, _, q)| q)
                        .collect(),
                }
            })
            .collect();
        Some(RxQueueInput {
            slow_samples: self.slow_at_probe,
            queues,
            devices,
        })
    }

    fn probes(&self) -> impl Iterator<Item = Probe> {
        std::iter::once(self.probe).chain(self.enqueued)
    }

    fn growth(&self, cumulative: &Cumulative, probe: Probe) -> Option<Histogram> {
        let now = cumulative_of(cumulative, &self.service, probe)?;
        Some(match self.cumulative.get(&probe) {
            Some(before) => now.delta_since(before).hist,
            None => now,
        })
    }

    fn decide<K: Kernel>(
        &self,
        kernel: &mut K,
        cumulative: &Cumulative,
        processes: &HashMap<u32, ProcStat>,
        net: &HashMap<u32, CpuNet>,
        now: Instant,
    ) -> Cause {
        let window_ns = u64::try_from(now.saturating_duration_since(self.opened).as_nanos())
            .unwrap_or(u64::MAX);
        let after = self
            .slot
            .map(|slot| kernel.per_cpu_hist(slot, self.probe))
            .transpose()
            .map(Option::flatten);
        let per_cpu = match (&self.per_cpu, after) {
            (Some(before), Ok(Some(after))) => after
                .iter()
                .enumerate()
                .map(|(cpu, h)| match before.get(cpu) {
                    Some(b) => h.delta_since(b).hist,
                    None => h.clone(),
                })
                .collect(),
            _ => Vec::new(),
        };
        let read_delay_ns = self.enqueued.and_then(|enq| {
            let read = self.growth(cumulative, self.probe)?;
            let queued = self.growth(cumulative, enq)?;
            let per_packet = read.mean_ns()? - queued.mean_ns().unwrap_or(0.0);
            Some((per_packet.max(0.0) * read.count() as f64) as u64)
        });
        let readers = self.readers(processes);
        let throttle = self.readers.values().find_map(|r| {
            let before = r.throttle.as_ref()?;
            let pid_dir_now = read_again(before)?;
            Some(host_figures::throttle_growth(before, &pid_dir_now))
        });
        // The receive softirq and RX queues explain received packets only: a send stage
        // gets neither (its one-CPU spread still applies).
        let receive = !self.probe.is_send();
        let softirq = per_cpu
            .iter()
            .enumerate()
            .filter(|(_, h)| receive && h.count() > 0)
            .map(|(cpu, h)| {
                let cpu = u32::try_from(cpu).unwrap_or(u32::MAX);
                let before = self.net.get(&cpu).copied().unwrap_or_default();
                let after = net.get(&cpu).copied().unwrap_or_default();
                CpuSoftirq {
                    cpu,
                    packets: h.count(),
                    squeezed: after.squeezed.saturating_sub(before.squeezed),
                    dropped: after.dropped.saturating_sub(before.dropped),
                    softirq_ns: after.softirq_ns.saturating_sub(before.softirq_ns),
                    ksoftirqd_ns: ksoftirqd_growth(&self.processes, processes, cpu),
                    slow_samples: self.softirq_samples.get(&cpu).map_or(0, |s| s.0),
                    in_ksoftirqd: self.softirq_samples.get(&cpu).map_or(0, |s| s.1),
                }
            })
            .collect();
        let mut cause = diagnosis::decide(&CauseInput {
            window_ns,
            read_stage: self.enqueued.is_some(),
            per_cpu,
            slow_ns: self.slow_ns,
            read_delay_ns,
            readers,
            throttle,
            softirq,
            slow_reads: self.slow_reads_split(),
            // The devices' counters are dumped only when some slow packet carries a queue.
            rx_queues: (receive && !self.rx_slow.is_empty())
                .then(|| self.rx_queues(rx_queues::packets().as_ref()))
                .flatten(),
        });
        cause.figures.stage = self.stage.clone();
        cause
    }

    /// The slow reads' own split, with the tasks that held their CPUs, longest wait first.
    fn slow_reads_split(&self) -> Option<SlowReadWaits> {
        if self.slow_reads.reads == 0 {
            return None;
        }
        let me = std::process::id();
        let mut w = self.slow_reads.clone();
        w.cpus.sort_unstable();
        w.holders = self
            .slow_read_holders
            .iter()
            .map(|(&pid, (comm, runq_ns))| SlowReadHolder {
                pid,
                comm: comm.clone(),
                runq_ns: *runq_ns,
                tailtrap: pid == me || comm == "tailtrap",
            })
            .collect();
        w.holders
            .sort_by(|a, b| b.runq_ns.cmp(&a.runq_ns).then(a.pid.cmp(&b.pid)));
        w.holders.truncate(MAX_HOLDERS);
        Some(w)
    }

    /// The readers' times since each was first seen, and who else ran on their CPUs.
    fn readers(&self, processes: &HashMap<u32, ProcStat>) -> Option<ReaderTimes> {
        // Followed every interval; one that exited was dropped then (its time is unknown,
        // not zero).
        let mut pids: Vec<u32> = self.readers.keys().copied().collect();
        if pids.is_empty() {
            return None;
        }
        pids.sort_unstable();
        let mut times = SchedTimes::default();
        for r in self.readers.values() {
            times.on_cpu_ns += r.grown.on_cpu_ns;
            times.run_wait_ns += r.grown.run_wait_ns;
        }
        let mut cpus: Vec<u32> = self.reader_cpus.iter().copied().collect();
        cpus.sort_unstable();
        let me = std::process::id();
        let mut holders: Vec<Holder> = processes
            .iter()
            .filter(|(pid, p)| cpus.contains(&p.cpu) && !self.readers.contains_key(pid))
            .filter_map(|(&pid, p)| {
                let before = self.processes.get(&pid).map_or(0, |b| b.cpu_ns);
                let used = p.cpu_ns.saturating_sub(before);
                (used > 0).then(|| Holder {
                    pid,
                    comm: p.comm.clone(),
                    on_cpu_ns: used,
                    // The daemon, and its CLI reading it (`tailtrap incidents`, `export`):
                    // reading tailtrap during an incident must not become its cause unseen.
                    tailtrap: pid == me || p.comm == "tailtrap",
                })
            })
            .collect();
        holders.sort_by(|a, b| b.on_cpu_ns.cmp(&a.on_cpu_ns).then(a.pid.cmp(&b.pid)));
        holders.truncate(MAX_HOLDERS);
        let comm = pids
            .first()
            .and_then(|p| processes.get(p))
            .map(|p| p.comm.clone())
            .unwrap_or_default();
        Some(ReaderTimes {
            pids,
            comm,
            on_cpu_ns: times.on_cpu_ns,
            run_wait_ns: times.run_wait_ns,
            cpus,
            holders,
        })
    }
}

/// The same cgroup's counters now.
fn read_again(before: &CpuStat) -> Option<CpuStat> {
    host_figures::cpu_stat_at(&before.dir)
}

/// CPU time of `ksoftirqd/<cpu>` between two scans.
fn ksoftirqd_growth(
    before: &HashMap<u32, ProcStat>,
    after: &HashMap<u32, ProcStat>,
    cpu: u32,
) -> Option<u64> {
    let name = format!("ksoftirqd/{cpu}");
    let (pid, now) = after.iter().find(|(_, p)| p.comm == name)?;
    let was = before.get(pid).map_or(0, |p| p.cpu_ns);
    Some(now.cpu_ns.saturating_sub(was))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(probe: Probe, slow_ns: u64) -> Tracked {
        let target = Target {
            stage: None,
            probe,
            enqueued: None,
            baseline_ns: 0.0,
        };
        Tracked {
            slow_ns,
            ..Tracked::new("web".into(), None, target, Instant::now())
        }
    }

    /// An ip-start sample of incident 1 on device 2 of namespace 9.
    fn sample(i: u64, latency_ns: u64, rx_queue: Option<u16>) -> Sample {
        Sample {
            probe: Probe::IpStart,
            latency_ns,
            ifindex: 2,
            netns_ino: 9,
            rx_queue,
            pid: None,
            ..model::fixtures::sample(1, i, 1_000 + i)
        }
    }

    #[test]
    fn the_slow_packets_rx_queues_are_counted_at_the_stages_probe_since_the_opening() {
        let mut causes = Causes::default();
        causes.open.insert(1, tracked(Probe::IpStart, 1_000_000));
        let mut batch: Vec<Sample> = Vec::new();
        // Slow on queue 3, each from its own flow (the fixture's source address and port
        // cycle over 5 and 7).
        batch.extend((0..25).map(|i| sample(i, 5_000_000, Some(3))));
        // Not slow: only says the service's packets also come in on queue 1.
        batch.extend((0..10).map(|i| sample(i, 10_000, Some(1))));
        // Slow without a queue: counted among the slow packets.
        batch.extend((0..5).map(|i| sample(i, 5_000_000, None)));
        // Another probe: not the stage's.
        batch.push(Sample {
            probe: Probe::TcpSocketRead,
            ..sample(0, 9_000_000, Some(5))
        });
        causes.samples(&batch, false);
        // The flight recorder's, from before the opening: left out.
        causes.samples(&[sample(0, 5_000_000, Some(7))], true);
        let t = &causes.open[&1];
        let input = t.rx_queues(None).expect("queue figures");
        assert_eq!(input.slow_samples, 30);
        let queues: Vec<(u16, u64, u64)> = input
            .queues
            .iter()
            .map(|q| (q.queue, q.slow, q.flows))
            .collect();
        assert_eq!(queues, [(3, 25, 25)]);
        assert_eq!(input.devices.len(), 1);
        let d = &input.devices[0];
        assert_eq!((d.ifindex, d.netns_ino), (2, 9));
        assert_eq!(d.service_queues, [1, 3, 5]);
        // Not this namespace's device: no name, no counters.
        assert_eq!((d.name.as_deref(), d.queue_packets.as_ref()), (None, None));
        let c = diagnosis::decide(&CauseInput {
            window_ns: 5_000_000_000,
            rx_queues: Some(input),
            ..Default::default()
        });
        assert_eq!(c.kind, CauseKind::NoClearCause);
        assert_eq!(
            c.summary,
            "no clear cause (83 % of the slow packets captured came in on ifindex 2 rx-3 \
             (ifindex 2's packets per queue unknown))"
        );
    }

    #[test]
    fn no_queue_figures_without_a_slow_packet_that_carries_a_queue() {
        let mut t = tracked(Probe::IpStart, 1_000_000);
        t.note_rx_queue(&sample(0, 5_000_000, None));
        t.note_rx_queue(&sample(1, 10, Some(2)));
        assert_eq!(t.slow_at_probe, 1);
        assert!(t.rx_queues(None).is_none());
    }
}

/// The receiving devices as this namespace's kernel knows them: names and queue counts from
/// sysfs, RX packets per queue from the netdev netlink family's per-queue statistics
/// (`qstats-get`, Linux 6.10+, in the drivers that keep them). Read per decision of an
/// open incident whose slow packets carry an RX queue, never per packet.
mod rx_queues {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;

    /// The daemon's network namespace inode (samples carry theirs).
    pub(super) fn own_netns() -> Option<u32> {
        let ino = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
        u32::try_from(ino).ok()
    }

    /// The name of interface `ifindex` of this namespace.
    pub(super) fn name_of(ifindex: u32) -> Option<String> {
        std::fs::read_dir("/sys/class/net")
            .ok()?
            .flatten()
            .find(|dev| {
                std::fs::read_to_string(dev.path().join("ifindex"))
                    .ok()
                    .and_then(|t| t.trim().parse::<u32>().ok())
                    == Some(ifindex)
            })
            .and_then(|dev| dev.file_name().into_string().ok())
    }

    /// How many RX queues device `name` has.
    pub(super) fn rx_queue_count(name: &str) -> Option<u32> {
        let n = std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
            .ok()?
            .flatten()
            .filter(|q| q.file_name().to_str().is_some_and(|n| n.starts_with("rx-")))
            .count();
        u32::try_from(n).ok().filter(|&n| n > 0)
    }

    /// Device `ifindex`'s packets per RX queue between two dumps; `None` when it is in
    /// neither, or a counter went back (the queues were reconfigured: per-queue counts
    /// start again then).
    pub(super) fn growth(
        before: &HashMap<(u32, u16), u64>,
        after: &HashMap<(u32, u16), u64>,
        ifindex: u32,
    ) -> Option<Vec<(u16, u64)>> {
        let mut out = Vec::new();
        for (&(dev, queue), &now) in after {
            if dev != ifindex {
                continue;
            }
            let was = before.get(&(dev, queue)).copied().unwrap_or(0);
            out.push((queue, now.checked_sub(was)?));
        }
        out.sort_unstable();
        (!out.is_empty()).then_some(out)
    }

    const NETLINK_GENERIC: libc::c_int = 16;
    const GENL_ID_CTRL: u16 = 0x10;
    const CTRL_CMD_GETFAMILY: u8 = 3;
    const CTRL_ATTR_FAMILY_ID: u16 = 1;
    const CTRL_ATTR_FAMILY_NAME: u16 = 2;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    /// include/uapi/linux/netdev.h.
    const NETDEV_CMD_QSTATS_GET: u8 = 12;
    const NETDEV_A_QSTATS_IFINDEX: u16 = 1;
    const NETDEV_A_QSTATS_QUEUE_TYPE: u16 = 2;
    const NETDEV_A_QSTATS_QUEUE_ID: u16 = 3;
    const NETDEV_A_QSTATS_SCOPE: u16 = 4;
    const NETDEV_A_QSTATS_RX_PACKETS: u16 = 8;
    const NETDEV_QSTATS_SCOPE_QUEUE: u32 = 1;
    const NETDEV_QUEUE_TYPE_RX: u64 = 0;
    /// Most messages read from one dump: a bound on a kernel that never says done.
    const MAX_READS: usize = 4096;

    /// RX packets per (ifindex, queue) of every device of this namespace whose driver keeps
    /// per-queue statistics; `None` where the kernel has no such request (before 6.10) or
    /// refuses it.
    pub(super) fn packets() -> Option<HashMap<(u32, u16), u64>> {
        let mut sock = socket()?;
        let family = family_id(&mut sock, b"netdev\0")?;
        let mut attrs = Vec::new();
        put_attr(
            &mut attrs,
            NETDEV_A_QSTATS_SCOPE,
            &NETDEV_QSTATS_SCOPE_QUEUE.to_ne_bytes(),
        );
        send(
            &mut sock,
            family,
            NLM_F_REQUEST | NLM_F_DUMP,
            NETDEV_CMD_QSTATS_GET,
            2,
            &attrs,
        )?;
        let mut out = HashMap::new();
        let mut buf = vec![0u8; 64 << 10];
        for _ in 0..MAX_READS {
            let n = sock.read(&mut buf).ok()?;
            for (kind, payload) in messages(buf.get(..n)?) {
                match kind {
                    NLMSG_DONE => return Some(out),
                    NLMSG_ERROR => return None,
                    _ => {}
                }
                let Some(attrs) = payload.get(4..) else {
                    continue;
                };
                let (mut ifindex, mut rx, mut queue, mut packets) = (None, false, None, None);
                for (ty, value) in attributes(attrs) {
                    match ty {
                        NETDEV_A_QSTATS_IFINDEX => ifindex = uint(value),
                        NETDEV_A_QSTATS_QUEUE_TYPE => {
                            rx = uint(value) == Some(NETDEV_QUEUE_TYPE_RX)
                        }
                        NETDEV_A_QSTATS_QUEUE_ID => queue = uint(value),
                        NETDEV_A_QSTATS_RX_PACKETS => packets = uint(value),
                        _ => {}
                    }
                }
                if let (Some(i), true, Some(q), Some(p)) = (ifindex, rx, queue, packets) {
                    if let (Ok(i), Ok(q)) = (u32::try_from(i), u16::try_from(q)) {
                        out.insert((i, q), p);
                    }
                }
            }
        }
        None
    }

    fn socket() -> Option<std::fs::File> {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a descriptor just returned by socket(2), owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // The kernel answers at once; the timeout only bounds a kernel that does not.
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: SO_RCVTIMEO takes a timeval, given with its size.
        let r = unsafe {
            libc::setsockopt(
                owned.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const timeout).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        (r == 0).then(|| std::fs::File::from(owned))
    }

    /// The generic netlink family id of `name` (NUL-terminated).
    fn family_id(sock: &mut std::fs::File, name: &[u8]) -> Option<u16> {
        let mut attrs = Vec::new();
        put_attr(&mut attrs, CTRL_ATTR_FAMILY_NAME, name);
        send(
            sock,
            GENL_ID_CTRL,
            NLM_F_REQUEST,
            CTRL_CMD_GETFAMILY,
            1,
            &attrs,
        )?;
        let mut buf = vec![0u8; 8 << 10];
        let n = sock.read(&mut buf).ok()?;
        let (kind, payload) = messages(buf.get(..n)?).next()?;
        if kind != GENL_ID_CTRL {
            return None;
        }
        let (_, id) = attributes(payload.get(4..)?).find(|(ty, _)| *ty == CTRL_ATTR_FAMILY_ID)?;
        let id = u16::from_ne_bytes(id.get(..2)?.try_into().ok()?);
        Some(id)
    }

    /// One request: netlink header, generic netlink header (`cmd`, version 1), `attrs`.
    fn send(
        sock: &mut std::fs::File,
        kind: u16,
        flags: u16,
        cmd: u8,
        seq: u32,
        attrs: &[u8],
    ) -> Option<()> {
        let len = u32::try_from(16 + 4 + attrs.len()).ok()?;
        let mut msg = Vec::with_capacity(len as usize);
        msg.extend_from_slice(&len.to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&[cmd, 1, 0, 0]);
        msg.extend_from_slice(attrs);
        sock.write_all(&msg).ok()
    }

    fn put_attr(out: &mut Vec<u8>, ty: u16, value: &[u8]) {
        let len = 4 + value.len();
        out.extend_from_slice(&(len as u16).to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(out.len() + (4 - len % 4) % 4, 0);
    }

    /// The netlink messages in `buf`: (type, payload after the 16-byte header).
    fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
        std::iter::from_fn(move || {
            let len = u32::from_ne_bytes(buf.get(..4)?.try_into().ok()?) as usize;
            let kind = u16::from_ne_bytes(buf.get(4..6)?.try_into().ok()?);
            let payload = buf.get(16..len)?;
            buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
            Some((kind, payload))
        })
    }

    /// The attributes in `buf`: (type without its flag bits, value).
    fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
        std::iter::from_fn(move || {
            let len = usize::from(u16::from_ne_bytes(buf.get(..2)?.try_into().ok()?));
            let ty = u16::from_ne_bytes(buf.get(2..4)?.try_into().ok()?) & 0x3fff;
            let value = buf.get(4..len)?;
            buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
            Some((ty, value))
        })
    }

    /// A netlink `uint`: 4 or 8 bytes.
    fn uint(v: &[u8]) -> Option<u64> {
        match v.len() {
            4 => Some(u64::from(u32::from_ne_bytes(v.try_into().ok()?))),
            8 => Some(u64::from_ne_bytes(v.try_into().ok()?)),
            _ => None,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn messages_and_attributes_parse_and_stop_at_damage() {
            let mut attrs = Vec::new();
            put_attr(&mut attrs, NETDEV_A_QSTATS_IFINDEX, &7u32.to_ne_bytes());
            put_attr(
                &mut attrs,
                NETDEV_A_QSTATS_RX_PACKETS,
                &(1u64 << 40).to_ne_bytes(),
            );
            put_attr(&mut attrs, 0x8000 | NETDEV_A_QSTATS_QUEUE_ID, &[3, 0, 0]);
            let got: Vec<(u16, Vec<u8>)> =
                attributes(&attrs).map(|(t, v)| (t, v.to_vec())).collect();
            assert_eq!(got.len(), 3);
            assert_eq!(uint(&got[0].1), Some(7));
            assert_eq!(uint(&got[1].1), Some(1 << 40));
            assert_eq!(
                (got[2].0, uint(&got[2].1)),
                (NETDEV_A_QSTATS_QUEUE_ID, None)
            );
            // A length past the end ends the walk instead of reading beyond it.
            let mut bad = attrs.clone();
            bad[0] = 200;
            assert_eq!(attributes(&bad).count(), 0);
            let mut msg = 36u32.to_ne_bytes().to_vec();
            msg.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            msg.extend_from_slice(&[0u8; 20]);
            assert_eq!(
                messages(&msg)
                    .map(|(k, p)| (k, p.len()))
                    .collect::<Vec<_>>(),
                [(9, 20)]
            );
            assert_eq!(messages(&msg[..30]).count(), 0);
        }

        #[test]
        fn growth_is_per_queue_and_none_after_a_reset() {
            let before = HashMap::from([((2, 0), 100), ((2, 1), 50), ((3, 0), 9)]);
            let after = HashMap::from([((2, 0), 150), ((2, 1), 80), ((2, 2), 5), ((3, 0), 1)]);
            assert_eq!(
                growth(&before, &after, 2),
                Some(vec![(0, 50), (1, 30), (2, 5)])
            );
            assert_eq!(growth(&before, &after, 3), None);
            assert_eq!(growth(&before, &after, 4), None);
        }

        /// On this host's kernel: a map (possibly empty) where the request exists, `None`
        /// before 6.10; never a panic or a hang.
        #[test]
        fn the_running_kernels_counters_are_read_or_absent() {
            let got = packets();
            eprintln!("per-queue RX packets: {got:?}");
            if let Some(map) = got {
                for &(ifindex, _) in map.keys() {
                    assert!(ifindex > 0);
                }
            }
        }
    }
}
