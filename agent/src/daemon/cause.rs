//! The cause verdict of each open incident: figures taken when it opens, again a few
//! intervals later and then every few intervals while it stays open, and a last time when
//! it closes; the detector's [`diagnosis`](detector::diagnosis) decides from their growth.
//! Costs: one per-CPU lookup of one histogram entry, a few small /proc and cgroup files and
//! one scan of /proc/PID/stat per decision, for open incidents only.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use detector::diagnosis::{
    self, Cause, CauseInput, CauseKind, CpuSoftirq, Holder, ReaderTimes, SlowReadHolder,
    SlowReadWaits,
};
use model::{Histogram, Probe, Sample, SampleFlags};

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

/// Open incidents' figures at their opening, by incident id.
#[derive(Default)]
pub(super) struct Causes {
    open: HashMap<u64, Tracked>,
}

struct Tracked {
    service: String,
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
    /// The last clear verdict: kept when later figures, diluted by the quiet intervals
    /// before the closing, are mixed.
    clear: Option<Cause>,
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
        kernel: &mut K,
        cumulative: &Cumulative,
        now: Instant,
    ) {
        let (probe, enqueued, baseline_ns) = match &inc.stage {
            Some(s) => {
                let row = s.stages.iter().find(|r| r.stage == s.stage);
                let read = matches!(s.stage.to, Probe::TcpSocketRead | Probe::UdpSocketRead);
                (
                    s.stage.to,
                    if read { s.stage.from } else { None },
                    row.map_or(inc.headline.baseline.value_ns, |r| r.baseline_ns),
                )
            }
            None => (inc.headline.probe, None, inc.headline.baseline.value_ns),
        };
        let mut t = Tracked {
            service: inc.service.clone(),
            probe,
            enqueued,
            slow_ns: (baseline_ns * SLOW_FACTOR).max(1.0) as u64,
            opened: now,
            intervals: 0,
            per_cpu: kernel
                .per_cpu_hist(&inc.service, probe)
                .map_err(
                    |e| tracing::debug!(incident = id, error = %e, "per-CPU histogram not read"),
                )
                .ok()
                .flatten(),
            cumulative: HashMap::new(),
            net: host_figures::cpu_net(),
            processes: host_figures::all_processes(),
            readers: HashMap::new(),
            reader_cpus: HashSet::new(),
            softirq_samples: HashMap::new(),
            slow_reads: SlowReadWaits::default(),
            slow_read_holders: HashMap::new(),
            clear: None,
        };
        t.cumulative = t
            .probes()
            .filter_map(|p| Some((p, cumulative_of(cumulative, &t.service, p)?)))
            .collect();
        self.open.insert(id, t);
    }

    /// Samples of open incidents: the readers to follow are the processes that read slow
    /// packets, their CPUs those of the samples taken since the opening (not the flight
    /// recorder's from before it, `before_opening`).
    pub(super) fn samples(&mut self, samples: &[Sample], before_opening: bool) {
        for s in samples {
            let Some(t) = self.open.get_mut(&s.incident) else {
                continue;
            };
            if !matches!(s.probe, Probe::TcpSocketRead | Probe::UdpSocketRead) {
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
        let per_cpu = match (
            &self.per_cpu,
            kernel.per_cpu_hist(&self.service, self.probe),
        ) {
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
        let softirq = per_cpu
            .iter()
            .enumerate()
            .filter(|(_, h)| h.count() > 0)
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
        diagnosis::decide(&CauseInput {
            window_ns,
            read_stage: self.enqueued.is_some(),
            per_cpu,
            slow_ns: self.slow_ns,
            read_delay_ns,
            readers,
            throttle,
            softirq,
            slow_reads: self.slow_reads_split(),
        })
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
