//! Why the packets waited: a cause verdict for an incident, decided from figures the daemon
//! gathers over the incident's window (per-CPU histograms from the probes' maps, the
//! readers' scheduler statistics, the cgroup's CPU throttling, the softnet counters, the
//! RX queues of the slow packets captured and the devices' own per-queue counters).
//! Pure: the daemon reads the kernel and /proc, this only decides.
//!
//! A wrong verdict is worse than none, so each verdict needs its evidence to be clear and
//! dominant (the thresholds below); otherwise the verdict is [`CauseKind::NoClearCause`]
//! with the figures, so an operator can still read them. docs/detector.md, "Cause
//! verdicts", says what each verdict means and what evidence it needs.

use model::{fmt_ns, Histogram};
use serde::{Deserialize, Serialize};

/// Fewest slow packets over the window before the per-CPU spread says anything.
const MIN_SLOW_PACKETS: u64 = 20;
/// The CPUs named hold at least this share of the slow packets...
const CONCENTRATED_SLOW_SHARE: f64 = 0.8;
/// ... at most this share of all the service's packets at that probe ...
const CONCENTRATED_ALL_SHARE: f64 = 0.6;
/// ... and their tail is at least this many times the other CPUs'.
const CONCENTRATED_TAIL_RATIO: f64 = 4.0;
/// The quantile the per-CPU tails are compared at.
const CPU_TAIL_QUANTILE: f64 = 0.99;
/// A cgroup throttled in at least this share of its CPU periods (and at least
/// [`MIN_THROTTLED_PERIODS`] of them) is named.
const THROTTLED_SHARE: f64 = 0.2;
const MIN_THROTTLED_PERIODS: u64 = 3;
/// Share of the read delay the readers spent runnable but not running, for "waiting for a CPU".
const CPU_WAIT_SHARE: f64 = 0.5;
/// Share of the read delay the readers spent on CPU, for "busy elsewhere".
const BUSY_SHARE: f64 = 0.6;
/// The readers were on CPU or runnable for at most this share of the read delay: "off CPU".
/// Their on-CPU time includes the reads themselves, which under emulation (10-30x slower
/// code) came to 16 % of the delay of a reader sleeping 20 ms before each read.
const OFF_CPU_MAX_ACTIVE_SHARE: f64 = 0.3;
/// Softirq pressure on the CPUs that handled the packets: time squeezes per second, share of
/// the window the CPU spent in softirq, share of it ksoftirqd ran.
const SQUEEZE_PER_SEC: f64 = 10.0;
const SOFTIRQ_SHARE: f64 = 0.3;
const KSOFTIRQD_SHARE: f64 = 0.2;
/// Slow packets processed in ksoftirqd: at least this share of at least
/// [`MIN_SOFTIRQ_SAMPLES`] slow samples of the CPU.
const KSOFTIRQD_SAMPLE_SHARE: f64 = 0.5;
const MIN_SOFTIRQ_SAMPLES: u64 = 10;
/// The slow packets captured at the stage's probe are concentrated on an RX queue when at
/// least [`MIN_SLOW_PACKETS`] of them carry one and the queues named (at most a quarter of
/// the device's, at least one) hold [`CONCENTRATED_SLOW_SHARE`] of them all. For the
/// verdict, those queues also carry at most [`CONCENTRATED_ALL_SHARE`] of the device's
/// packets by its own counters, with packets on at least two of its queues, the slow
/// packets on them come from at least this many flows...
const MIN_QUEUE_FLOWS: u64 = 3;
/// ... and the service's captured packets came in on at least this many other queues of
/// the device: its traffic is not all hashed or steered to the queues named.
const MIN_OTHER_SERVICE_QUEUES: usize = 1;
/// Slow reads with the reader-wait split (scheduler tracepoints) needed before it is used in
/// place of the readers' schedstat: it covers each slow packet's own wait, not the whole
/// interval, so it is the better evidence once there are a few.
const MIN_SPLIT_READS: u64 = 5;

/// What a verdict says, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CauseKind {
    /// The reading threads' cgroup ran out of CPU quota (cpu.max / cfs_quota_us).
    Throttled,
    /// The readers were runnable but waited for a CPU (contention, a noisy neighbour).
    CpuWait,
    /// The readers were on CPU doing something else while the data waited.
    ReaderBusy,
    /// The readers were off CPU (sleeping or blocked) while the data waited.
    ReaderOffCpu,
    /// The receive softirq ran late: deferred to ksoftirqd, out of budget, or dropping.
    Softirq,
    /// The slow packets concentrate on few CPUs while the others are fine.
    OneCpu,
    /// The slow packets came in on few RX queues of a device whose packets are spread over
    /// its queues.
    OneRxQueue,
    /// The figures are mixed or missing: no verdict.
    NoClearCause,
}

impl CauseKind {
    /// The name used in stored records, the API and the `cause` metric label.
    pub fn name(self) -> &'static str {
        match self {
            CauseKind::Throttled => "throttled",
            CauseKind::CpuWait => "cpu-wait",
            CauseKind::ReaderBusy => "reader-busy",
            CauseKind::ReaderOffCpu => "reader-off-cpu",
            CauseKind::Softirq => "softirq",
            CauseKind::OneCpu => "one-cpu",
            CauseKind::OneRxQueue => "one-rx-queue",
            CauseKind::NoClearCause => "no-clear-cause",
        }
    }
}

impl std::fmt::Display for CauseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything the verdict is drawn from, over one window of an incident.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CauseInput {
    /// Length of the window, ns.
    pub window_ns: u64,
    /// Whether the stage that grew is the application's read (socket queue to read).
    pub read_stage: bool,
    /// The service's histogram at the stage's probe on each CPU over the window, by CPU.
    pub per_cpu: Vec<Histogram>,
    /// Packets at or above this latency are the slow ones (the baseline's tail), ns.
    pub slow_ns: u64,
    /// Total time the service's packets waited between socket queue and read, ns.
    pub read_delay_ns: Option<u64>,
    /// The reading processes' scheduler figures (from their threads' schedstat).
    pub readers: Option<ReaderTimes>,
    /// The service cgroup's CPU throttling over the window.
    pub throttle: Option<Throttle>,
    /// Softirq figures of the CPUs that handled the service's packets.
    pub softirq: Vec<CpuSoftirq>,
    /// The reader-wait split of the slow reads captured (kernels with task storage).
    pub slow_reads: Option<SlowReadWaits>,
    /// The RX queues the slow packets captured came in on, and their devices' counters.
    #[serde(default)]
    pub rx_queues: Option<RxQueueInput>,
}

/// The RX queues of the incident's slow packets, from its slow-packet samples (the queue
/// the receiving driver recorded in each skb), and what the devices count per queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RxQueueInput {
    /// Slow-packet samples at the stage's probe since the opening, with a queue or not.
    pub slow_samples: u64,
    /// Those that carry a queue, per (device, queue).
    pub queues: Vec<RxQueueSlow>,
    /// The devices they came in on.
    pub devices: Vec<RxDevice>,
}

/// Slow-packet samples that came in on one RX queue of one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RxQueueSlow {
    /// The device's interface index (in `netns_ino`).
    pub ifindex: u32,
    /// Its network namespace's inode.
    pub netns_ino: u32,
    /// The RX queue.
    pub queue: u16,
    /// Slow packets captured on it.
    pub slow: u64,
    /// Distinct flows among them.
    pub flows: u64,
}

/// A device the slow packets came in on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RxDevice {
    /// Its interface index.
    pub ifindex: u32,
    /// Its network namespace's inode.
    pub netns_ino: u32,
    /// Its name, when it is in the daemon's network namespace.
    pub name: Option<String>,
    /// Its RX queues (`/sys/class/net/NAME/queues/rx-*`), when known.
    pub rx_queues: Option<u32>,
    /// Packets it received on each RX queue over the window, by its own counters (the
    /// kernel's per-queue statistics, netdev netlink `qstats`), `(queue, packets)`; `None`
    /// where the kernel or the driver keeps none.
    pub queue_packets: Option<Vec<(u16, u64)>>,
    /// The RX queues any of the service's captured packets came in on since the opening
    /// (slow or not: every packet over the capture threshold).
    pub service_queues: Vec<u16>,
}

/// Slow packets captured concentrated on few RX queues of one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RxQueueSpread {
    /// The device: its name, or `ifindex N` when it is in another namespace.
    pub device: String,
    /// Its interface index.
    pub ifindex: u32,
    /// The queues named, most slow packets first.
    pub queues: Vec<u16>,
    /// Their share of the slow packets captured at the stage's probe (those without a
    /// queue included).
    pub slow_share: f64,
    /// Slow packets captured at the stage's probe.
    pub slow_samples: u64,
    /// Distinct flows among the slow packets on the queues named.
    pub flows: u64,
    /// The queues' share of the device's packets over the window, by its own counters;
    /// `None` where it keeps none per queue.
    pub device_share: Option<f64>,
    /// The device's queues that received packets over the window, by its counters.
    pub device_queues_with_packets: Option<usize>,
    /// The device's RX queues, when known.
    pub device_queues: Option<u32>,
    /// Other queues of the device the service's captured packets came in on.
    pub service_other_queues: usize,
}

/// Where the reading threads were while the slow packets waited for them, summed over the
/// slow reads that carry the split (each from the packet's arrival to its read).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowReadWaits {
    /// Slow reads summed.
    pub reads: u64,
    /// Their latencies, ns.
    pub latency_ns: u64,
    /// Runnable but waiting for a CPU, ns.
    pub runq_ns: u64,
    /// Off CPU (sleeping, blocked), ns.
    pub off_cpu_ns: u64,
    /// CPUs the slow reads ran on.
    pub cpus: Vec<u32>,
    /// The tasks the readers took their CPU back from after waiting, longest wait first.
    pub holders: Vec<SlowReadHolder>,
}

/// A task a slow reader took its CPU back from after waiting in the run queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowReadHolder {
    /// Its pid (tgid).
    pub pid: u32,
    /// Its thread's command name.
    pub comm: String,
    /// Run-queue time of the slow reads whose wait ended with it giving the CPU back, ns.
    pub runq_ns: u64,
    /// This is tailtrap itself.
    pub tailtrap: bool,
}

/// The readers' time over the window, summed over their threads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReaderTimes {
    /// The reading processes (tgids seen in the slow read samples).
    pub pids: Vec<u32>,
    /// Their command name (of the first).
    pub comm: String,
    /// Time on CPU, ns.
    pub on_cpu_ns: u64,
    /// Time runnable but waiting for a CPU, ns.
    pub run_wait_ns: u64,
    /// CPUs the slow reads ran on.
    pub cpus: Vec<u32>,
    /// Who else ran on those CPUs over the window, most CPU first.
    pub holders: Vec<Holder>,
}

/// A process that held one of the readers' CPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// Its pid (tgid).
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// CPU time it used over the window, ns.
    pub on_cpu_ns: u64,
    /// This is tailtrap itself.
    pub tailtrap: bool,
}

/// A cgroup's CPU quota and throttling over the window (cpu.stat, v1 or v2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Throttle {
    /// The cgroup's path.
    pub cgroup: String,
    /// Its quota as configured, e.g. `10000 100000` (cpu.max) or `max`.
    pub quota: String,
    /// CPU periods elapsed.
    pub periods: u64,
    /// Periods in which it was throttled.
    pub throttled_periods: u64,
    /// Time throttled, ns.
    pub throttled_ns: u64,
}

/// One CPU's receive softirq figures over the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSoftirq {
    /// The CPU.
    pub cpu: u32,
    /// The service's packets it handled at the stage's probe.
    pub packets: u64,
    /// NET_RX rounds that ran out of budget or time (softnet_stat's time_squeeze).
    pub squeezed: u64,
    /// Packets dropped for a full backlog (softnet_stat's dropped).
    pub dropped: u64,
    /// Time the CPU spent in softirq, ns (/proc/stat).
    pub softirq_ns: u64,
    /// Time its ksoftirqd thread ran, ns.
    pub ksoftirqd_ns: Option<u64>,
    /// The incident's slow-packet samples taken on it outside a process's context.
    #[serde(default)]
    pub slow_samples: u64,
    /// Of those, the ones its ksoftirqd thread processed (not at interrupt exit).
    #[serde(default)]
    pub in_ksoftirqd: u64,
}

/// Slow packets concentrated on few CPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSpread {
    /// The CPUs named, most slow packets first.
    pub cpus: Vec<u32>,
    /// Their share of the slow packets.
    pub slow_share: f64,
    /// Their share of all the service's packets at the probe.
    pub all_share: f64,
    /// Slow packets over all CPUs.
    pub slow_packets: u64,
    /// Tail (p99) on the CPUs named, ns.
    pub tail_named_ns: f64,
    /// Tail (p99) on the other CPUs with packets, ns.
    pub tail_others_ns: f64,
    /// How many other CPUs had packets.
    pub others: usize,
}

/// A verdict with its sentence and figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    /// The verdict.
    pub kind: CauseKind,
    /// The operator's sentence, with figures.
    pub summary: String,
    /// What it was drawn from.
    pub figures: CauseFigures,
}

/// The figures behind a verdict (stored with the incident as JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CauseFigures {
    /// Window length, ns.
    pub window_ns: u64,
    /// Per-CPU spread of the slow packets, when it was concentrated.
    pub cpu_spread: Option<CpuSpread>,
    /// Share of the read delay the readers waited for a CPU.
    pub run_wait_share: Option<f64>,
    /// Share of the read delay the readers were on CPU.
    pub on_cpu_share: Option<f64>,
    /// Total read delay, ns.
    pub read_delay_ns: Option<u64>,
    /// The readers.
    pub readers: Option<ReaderTimes>,
    /// The cgroup's throttling.
    pub throttle: Option<Throttle>,
    /// Softirq figures per CPU that handled the packets.
    pub softirq: Vec<CpuSoftirq>,
    /// The slow reads' own split, when it decided the shares above (absent in verdicts
    /// stored before it existed).
    #[serde(default)]
    pub slow_reads: Option<SlowReadWaits>,
    /// RX queues the slow packets captured concentrated on (absent in verdicts stored
    /// before it existed, and where they did not concentrate).
    #[serde(default)]
    pub rx_queue_spread: Option<RxQueueSpread>,
    /// The stage judged, by name: the incident's stage when the verdict was decided
    /// (absent in verdicts stored before it existed, and where no stage was attributed).
    #[serde(default)]
    pub stage: Option<String>,
}

/// Decide the verdict for `input`. Order: the reader's own figures first for a read stage
/// (throttling, then waiting for a CPU, busy, off CPU), then a concentration on few CPUs,
/// then on few RX queues and softirq pressure for the earlier stages; otherwise no clear
/// cause.
pub fn decide(input: &CauseInput) -> Cause {
    let spread = cpu_spread(&input.per_cpu, input.slow_ns);
    let rx_spread = input.rx_queues.as_ref().and_then(rx_queue_spread);
    // Each slow packet's own wait where enough reads carry it; else the readers' whole
    // interval against the service's read delay.
    let split = input
        .slow_reads
        .as_ref()
        .filter(|w| w.reads >= MIN_SPLIT_READS && w.latency_ns > 0);
    let (wait_share, on_share) = match (split, &input.readers, input.read_delay_ns) {
        (Some(w), _, _) => {
            let d = w.latency_ns as f64;
            let on = w.latency_ns.saturating_sub(w.runq_ns + w.off_cpu_ns);
            (
                Some((w.runq_ns as f64 / d).min(1.0)),
                Some((on as f64 / d).min(1.0)),
            )
        }
        (None, Some(r), Some(d)) if d > 0 => (
            Some((r.run_wait_ns as f64 / d as f64).min(1.0)),
            Some((r.on_cpu_ns as f64 / d as f64).min(1.0)),
        ),
        _ => (None, None),
    };
    let figures = CauseFigures {
        window_ns: input.window_ns,
        cpu_spread: spread.clone(),
        run_wait_share: wait_share,
        on_cpu_share: on_share,
        read_delay_ns: input.read_delay_ns,
        readers: input.readers.clone(),
        throttle: input.throttle.clone(),
        softirq: input.softirq.clone(),
        slow_reads: split.cloned(),
        rx_queue_spread: rx_spread.clone(),
        stage: None,
    };
    let verdict = |kind, summary| Cause {
        kind,
        summary,
        figures: figures.clone(),
    };
    if input.read_stage {
        if let Some(t) = &input.throttle {
            if t.periods >= MIN_THROTTLED_PERIODS
                && t.throttled_periods as f64 >= THROTTLED_SHARE * t.periods as f64
            {
                return verdict(
                    CauseKind::Throttled,
                    format!(
                        "reader throttled by its cgroup's CPU quota (cpu.max {}; throttled in {} of {} periods, {} in all)",
                        t.quota,
                        t.throttled_periods,
                        t.periods,
                        fmt_ns(t.throttled_ns as f64)
                    ),
                );
            }
        }
        if let (Some(wait), Some(on)) = (wait_share, on_share) {
            let who = input
                .readers
                .as_ref()
                .map_or_else(|| "pids unknown".into(), readers_text);
            if wait >= CPU_WAIT_SHARE {
                let with = holder_text(split, input.readers.as_ref());
                return verdict(
                    CauseKind::CpuWait,
                    format!(
                        "reader runnable but waiting for a CPU {:.0} % of the delay{with}",
                        wait * 100.0,
                    ),
                );
            }
            if on >= BUSY_SHARE {
                return verdict(
                    CauseKind::ReaderBusy,
                    format!(
                        "reader busy: on CPU {:.0} % of the delay, not reading ({who})",
                        on * 100.0,
                    ),
                );
            }
            if wait + on <= OFF_CPU_MAX_ACTIVE_SHARE {
                return verdict(
                    CauseKind::ReaderOffCpu,
                    format!(
                        "reader not reading: {:.0} % of the delay off CPU, sleeping or blocked ({who})",
                        (1.0 - wait - on) * 100.0,
                    ),
                );
            }
        }
    }
    if let Some(s) = &spread {
        let mut text = spread_text(s);
        if let Some(q) = &rx_spread {
            text.push_str(&format!(
                "; {:.0} % of the slow packets captured came in on {}",
                q.slow_share * 100.0,
                queue_list(q)
            ));
        }
        return verdict(CauseKind::OneCpu, text);
    }
    if !input.read_stage {
        if let Some(q) = rx_spread.as_ref().filter(|q| names_rx_queue(q)) {
            return verdict(CauseKind::OneRxQueue, rx_queue_text(q));
        }
        if let Some(text) = softirq_text(&input.softirq, input.window_ns) {
            return verdict(CauseKind::Softirq, text);
        }
    }
    verdict(CauseKind::NoClearCause, mixed_text(&figures))
}

/// The RX queues holding most slow packets captured, when few queues of one device hold
/// most of them. Figures only: whether they name the cause is [`names_rx_queue`]'s call.
pub fn rx_queue_spread(input: &RxQueueInput) -> Option<RxQueueSpread> {
    let with_queue: u64 = input.queues.iter().map(|q| q.slow).sum();
    if with_queue < MIN_SLOW_PACKETS || input.slow_samples == 0 {
        return None;
    }
    // The device with the most slow packets; its queues, most first.
    let mut per_device: Vec<((u32, u32), u64)> = Vec::new();
    for q in &input.queues {
        let key = (q.netns_ino, q.ifindex);
        match per_device.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += q.slow,
            None => per_device.push((key, q.slow)),
        }
    }
    per_device.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let &((netns_ino, ifindex), _) = per_device.first()?;
    let device = input
        .devices
        .iter()
        .find(|d| d.ifindex == ifindex && d.netns_ino == netns_ino);
    let mut ranked: Vec<&RxQueueSlow> = input
        .queues
        .iter()
        .filter(|q| q.ifindex == ifindex && q.netns_ino == netns_ino)
        .collect();
    ranked.sort_by(|a, b| b.slow.cmp(&a.slow).then(a.queue.cmp(&b.queue)));
    // At most a quarter of the device's queues (at least one) may be named; where their
    // number is unknown, of the queues seen.
    let seen: std::collections::BTreeSet<u16> = device
        .into_iter()
        .flat_map(|d| {
            d.service_queues
                .iter()
                .copied()
                .chain(d.queue_packets.iter().flatten().map(|&(q, _)| q))
        })
        .chain(ranked.iter().map(|q| q.queue))
        .collect();
    let queues_of_device = device
        .and_then(|d| d.rx_queues)
        .map_or(seen.len(), |n| n as usize);
    let most = (queues_of_device / 4).max(1);
    let (mut named, mut named_slow, mut flows) = (Vec::new(), 0u64, 0u64);
    for q in ranked.iter().take(most) {
        named.push(q.queue);
        named_slow += q.slow;
        flows += q.flows;
        if named_slow as f64 >= CONCENTRATED_SLOW_SHARE * input.slow_samples as f64 {
            break;
        }
    }
    let slow_share = named_slow as f64 / input.slow_samples as f64;
    if slow_share < CONCENTRATED_SLOW_SHARE {
        return None;
    }
    let counted = device.and_then(|d| d.queue_packets.as_ref());
    let device_share = counted.and_then(|per_queue| {
        let all: u64 = per_queue.iter().map(|(_, n)| n).sum();
        let on_named: u64 = per_queue
            .iter()
            .filter(|(q, _)| named.contains(q))
            .map(|(_, n)| n)
            .sum();
        (all > 0).then(|| on_named as f64 / all as f64)
    });
    Some(RxQueueSpread {
        device: device
            .and_then(|d| d.name.clone())
            .unwrap_or_else(|| format!("ifindex {ifindex}")),
        ifindex,
        queues: named.clone(),
        slow_share,
        slow_samples: input.slow_samples,
        flows,
        device_share,
        device_queues_with_packets: counted
            .map(|per_queue| per_queue.iter().filter(|(_, n)| *n > 0).count()),
        device_queues: device.and_then(|d| d.rx_queues),
        service_other_queues: device.map_or(0, |d| {
            d.service_queues
                .iter()
                .filter(|q| !named.contains(q))
                .count()
        }),
    })
}

/// Whether a concentration on few RX queues names the cause: the device spreads its
/// packets over its queues (its own counters say so), the named ones carry few of them,
/// the slow packets on them come from several flows, and the service's packets also come
/// in on other queues (so its traffic is not simply all hashed or steered there).
fn names_rx_queue(q: &RxQueueSpread) -> bool {
    q.device_share
        .is_some_and(|share| share <= CONCENTRATED_ALL_SHARE)
        && q.device_queues_with_packets.is_some_and(|n| n >= 2)
        && q.flows >= MIN_QUEUE_FLOWS
        && q.service_other_queues >= MIN_OTHER_SERVICE_QUEUES
}

/// `eth0 rx-3` or `eth0 rx-3, rx-5`.
fn queue_list(q: &RxQueueSpread) -> String {
    let queues = q
        .queues
        .iter()
        .map(|n| format!("rx-{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("{} {queues}", q.device)
}

fn rx_queue_text(q: &RxQueueSpread) -> String {
    let what = if q.queues.len() == 1 {
        "one RX queue"
    } else {
        "few RX queues"
    };
    let others = q.service_other_queues;
    format!(
        "{what}: {}: {:.0} % of slow packets ({} flows), {:.0} % of {}'s packets; the service's packets also came in on {} other queue{}",
        queue_list(q),
        q.slow_share * 100.0,
        q.flows,
        q.device_share.unwrap_or(0.0) * 100.0,
        q.device,
        others,
        if others == 1 { "" } else { "s" }
    )
}

/// The queue figures when they did not name the cause: what is known, and what is not.
fn rx_queue_mixed(q: &RxQueueSpread) -> String {
    let device = match q.device_share {
        Some(share) => format!("{:.0} % of {}'s packets", share * 100.0, q.device),
        None => format!("{}'s packets per queue unknown", q.device),
    };
    format!(
        "{:.0} % of the slow packets captured came in on {} ({device})",
        q.slow_share * 100.0,
        queue_list(q)
    )
}

/// The CPUs holding most slow packets, when few hold most of them and their tail stands out.
pub fn cpu_spread(per_cpu: &[Histogram], slow_ns: u64) -> Option<CpuSpread> {
    let slow: Vec<(u32, u64, u64)> = per_cpu
        .iter()
        .enumerate()
        .filter(|(_, h)| h.count() > 0)
        .map(|(cpu, h)| {
            (
                u32::try_from(cpu).unwrap_or(u32::MAX),
                h.exceedances(slow_ns),
                h.count(),
            )
        })
        .collect();
    let slow_total: u64 = slow.iter().map(|c| c.1).sum();
    let all_total: u64 = slow.iter().map(|c| c.2).sum();
    if slow_total < MIN_SLOW_PACKETS || slow.len() < 2 {
        return None;
    }
    let mut ranked = slow.clone();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    // At most a quarter of the CPUs with packets (at least one) may be named.
    let most = (slow.len() / 4).max(1);
    let mut named = Vec::new();
    let (mut named_slow, mut named_all) = (0u64, 0u64);
    for &(cpu, s, a) in ranked.iter().take(most) {
        named.push(cpu);
        named_slow += s;
        named_all += a;
        if named_slow as f64 >= CONCENTRATED_SLOW_SHARE * slow_total as f64 {
            break;
        }
    }
    let slow_share = named_slow as f64 / slow_total as f64;
    let all_share = named_all as f64 / all_total as f64;
    if slow_share < CONCENTRATED_SLOW_SHARE || all_share > CONCENTRATED_ALL_SHARE {
        return None;
    }
    let mut in_named = Histogram::new();
    let mut in_others = Histogram::new();
    for (cpu, h) in per_cpu.iter().enumerate() {
        if named.iter().any(|&c| c as usize == cpu) {
            in_named.merge(h);
        } else {
            in_others.merge(h);
        }
    }
    let tail_named = in_named.quantile(CPU_TAIL_QUANTILE)?.value_ns;
    let tail_others = in_others.quantile(CPU_TAIL_QUANTILE)?.value_ns;
    if tail_named < CONCENTRATED_TAIL_RATIO * tail_others {
        return None;
    }
    Some(CpuSpread {
        cpus: named.clone(),
        slow_share,
        all_share,
        slow_packets: slow_total,
        tail_named_ns: tail_named,
        tail_others_ns: tail_others,
        others: slow.len() - named.len(),
    })
}

fn cpu_list(cpus: &[u32]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn spread_text(s: &CpuSpread) -> String {
    let (what, list) = if s.cpus.len() == 1 {
        ("one CPU: cpu", cpu_list(&s.cpus))
    } else {
        ("few CPUs: cpus", cpu_list(&s.cpus))
    };
    format!(
        "{what} {list}: {:.0} % of slow packets, {:.0} % of all packets; p99 {} vs {} on the other {}",
        s.slow_share * 100.0,
        s.all_share * 100.0,
        fmt_ns(s.tail_named_ns),
        fmt_ns(s.tail_others_ns),
        s.others
    )
}

fn readers_text(r: &ReaderTimes) -> String {
    let pids = r
        .pids
        .iter()
        .take(3)
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let more = if r.pids.len() > 3 { ", …" } else { "" };
    format!("pid {pids}{more} {}", r.comm)
}

/// Who held the readers' CPU, for the cpu-wait verdict. The task a slow reader took its
/// CPU back from is only the last to run before it: on a host where a VM or a batch job
/// took most of the CPU, a short thread woken as often as the reader (tailtrap's own
/// workers, in a real run) was often that last one, and was named although it used a few
/// percent of the CPU. So it is named only when it also used at least half as much of the
/// readers' CPUs as their top user over the window; otherwise the top user is.
fn holder_text(split: Option<&SlowReadWaits>, readers: Option<&ReaderTimes>) -> String {
    let split = split.filter(|w| !w.holders.is_empty());
    let readers = readers.filter(|r| !r.holders.is_empty());
    match (split, readers) {
        (Some(w), Some(r)) => {
            let top_cpu = r.holders[0].on_cpu_ns;
            let last = w.holders[0].pid;
            let confirmed = r
                .holders
                .iter()
                .any(|h| h.pid == last && h.on_cpu_ns.saturating_mul(2) >= top_cpu);
            if confirmed {
                held_by(w)
            } else {
                shared_with(r)
            }
        }
        (Some(w), None) => held_by(w),
        (None, Some(r)) => shared_with(r),
        (None, None) => String::new(),
    }
}

/// ` (cpu 1 shared with pid 4242 stress-ng)`, or nothing when no other process is known.
fn shared_with(r: &ReaderTimes) -> String {
    let Some(top) = r.holders.first() else {
        return String::new();
    };
    let who = if top.tailtrap {
        format!("pid {} {} (tailtrap itself)", top.pid, top.comm)
    } else {
        format!("pid {} {}", top.pid, top.comm)
    };
    let cpus = if r.cpus.len() == 1 { "cpu" } else { "cpus" };
    format!(" ({cpus} {} shared with {who})", cpu_list(&r.cpus))
}

/// ` (cpu 1 held by pid 4242 stress-ng)`: the task the slow readers waited longest behind.
fn held_by(w: &SlowReadWaits) -> String {
    let Some(top) = w.holders.first() else {
        return String::new();
    };
    let itself = if top.tailtrap {
        " (tailtrap itself)"
    } else {
        ""
    };
    let cpus = if w.cpus.len() == 1 { "cpu" } else { "cpus" };
    format!(
        " ({cpus} {} held by pid {} {}{itself})",
        cpu_list(&w.cpus),
        top.pid,
        top.comm
    )
}

fn softirq_text(cpus: &[CpuSoftirq], window_ns: u64) -> Option<String> {
    if window_ns == 0 {
        return None;
    }
    let secs = window_ns as f64 / 1e9;
    let w = window_ns as f64;
    let deferred = |c: &CpuSoftirq| {
        c.ksoftirqd_ns
            .is_some_and(|k| k as f64 >= KSOFTIRQD_SHARE * w)
            || (c.slow_samples >= MIN_SOFTIRQ_SAMPLES
                && c.in_ksoftirqd as f64 >= KSOFTIRQD_SAMPLE_SHARE * c.slow_samples as f64)
    };
    // The CPU with the most packets among those under pressure.
    let pressed = cpus
        .iter()
        .filter(|c| c.packets > 0)
        .filter(|c| {
            c.squeezed as f64 / secs >= SQUEEZE_PER_SEC
                || c.dropped > 0
                || c.softirq_ns as f64 >= SOFTIRQ_SHARE * w
                || deferred(c)
        })
        .max_by_key(|c| c.packets)?;
    let mut parts = Vec::new();
    if pressed.slow_samples >= MIN_SOFTIRQ_SAMPLES {
        parts.push(format!(
            "{:.0} % of its slow packets processed in ksoftirqd",
            pressed.in_ksoftirqd as f64 / pressed.slow_samples as f64 * 100.0
        ));
    }
    if let Some(k) = pressed.ksoftirqd_ns {
        parts.push(format!(
            "ksoftirqd ran {:.0} % of the time",
            k as f64 / w * 100.0
        ));
    }
    parts.push(format!(
        "time squeeze {:.0}/s",
        pressed.squeezed as f64 / secs
    ));
    if pressed.dropped > 0 {
        parts.push(format!("backlog drops {}", pressed.dropped));
    }
    parts.push(format!(
        "softirq {:.0} % of the CPU",
        pressed.softirq_ns as f64 / w * 100.0
    ));
    let what = if deferred(pressed) {
        "softirq deferred to ksoftirqd"
    } else {
        "softirq under pressure"
    };
    Some(format!(
        "{what} on cpu {} ({})",
        pressed.cpu,
        parts.join("; ")
    ))
}

fn mixed_text(f: &CauseFigures) -> String {
    let mut parts = Vec::new();
    if let (Some(w), Some(o)) = (f.run_wait_share, f.on_cpu_share) {
        parts.push(format!(
            "reader waiting for a CPU {:.0} %, on CPU {:.0} %, off CPU {:.0} % of the delay",
            w * 100.0,
            o * 100.0,
            ((1.0 - w - o).max(0.0)) * 100.0
        ));
    }
    if let Some(t) = &f.throttle {
        parts.push(format!(
            "cgroup throttled in {} of {} periods",
            t.throttled_periods, t.periods
        ));
    }
    if let Some(q) = &f.rx_queue_spread {
        parts.push(rx_queue_mixed(q));
    }
    if parts.is_empty() {
        "no clear cause".into()
    } else {
        format!("no clear cause ({})", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    fn hist(values: &[(u64, u64)]) -> Histogram {
        let mut h = Histogram::new();
        for &(v, n) in values {
            h.record_n(v, n);
        }
        h
    }

    #[test]
    fn one_cpu_is_named_when_its_slow_packets_stand_out() {
        // cpu 3 carries 6 % of the packets but nearly all of the slow ones.
        let mut per_cpu = vec![hist(&[(100 * US, 1000)]); 16];
        per_cpu[3] = hist(&[(100 * US, 20), (40 * MS, 60)]);
        let c = decide(&CauseInput {
            window_ns: 5_000 * MS,
            per_cpu,
            slow_ns: MS,
            ..Default::default()
        });
        assert_eq!(c.kind, CauseKind::OneCpu, "{}", c.summary);
        assert!(
            c.summary
                .starts_with("one CPU: cpu 3: 100 % of slow packets"),
            "{}",
            c.summary
        );
        assert!(c.summary.contains("on the other 15"), "{}", c.summary);
    }

    #[test]
    fn slow_packets_spread_over_every_cpu_name_none() {
        let per_cpu = vec![hist(&[(100 * US, 1000), (40 * MS, 30)]); 4];
        assert_eq!(cpu_spread(&per_cpu, MS), None);
        // Slow packets on one CPU that also carries nearly all the traffic: not a bad CPU.
        let per_cpu = vec![
            hist(&[(40 * MS, 500), (100 * US, 5000)]),
            hist(&[(100 * US, 10)]),
        ];
        assert_eq!(cpu_spread(&per_cpu, MS), None);
        // Too few slow packets to say.
        let per_cpu = vec![
            hist(&[(40 * MS, 5), (100 * US, 100)]),
            hist(&[(100 * US, 100)]),
        ];
        assert_eq!(cpu_spread(&per_cpu, MS), None);
    }

    fn readers(on: u64, wait: u64) -> ReaderTimes {
        ReaderTimes {
            pids: vec![4242],
            comm: "nginx".into(),
            on_cpu_ns: on,
            run_wait_ns: wait,
            cpus: vec![1],
            holders: vec![Holder {
                pid: 77,
                comm: "stress-ng".into(),
                on_cpu_ns: 900 * MS,
                tailtrap: false,
            }],
        }
    }

    fn read_input(on: u64, wait: u64) -> CauseInput {
        CauseInput {
            window_ns: 1_000 * MS,
            read_stage: true,
            read_delay_ns: Some(100 * MS),
            readers: Some(readers(on, wait)),
            ..Default::default()
        }
    }

    #[test]
    fn the_readers_schedstat_splits_the_read_delay() {
        let c = decide(&read_input(5 * MS, 81 * MS));
        assert_eq!(c.kind, CauseKind::CpuWait);
        assert_eq!(
            c.summary,
            "reader runnable but waiting for a CPU 81 % of the delay (cpu 1 shared with pid 77 stress-ng)"
        );
        let c = decide(&read_input(2 * MS, 3 * MS));
        assert_eq!(c.kind, CauseKind::ReaderOffCpu);
        assert!(
            c.summary
                .starts_with("reader not reading: 95 % of the delay off CPU"),
            "{}",
            c.summary
        );
        assert_eq!(
            decide(&read_input(70 * MS, 5 * MS)).kind,
            CauseKind::ReaderBusy
        );
        // Mixed: a third each. No verdict, the figures instead.
        let c = decide(&read_input(30 * MS, 35 * MS));
        assert_eq!(c.kind, CauseKind::NoClearCause);
        assert!(
            c.summary
                .contains("waiting for a CPU 35 %, on CPU 30 %, off CPU 35 %"),
            "{}",
            c.summary
        );
    }

    fn split(reads: u64, runq: u64, off: u64) -> SlowReadWaits {
        SlowReadWaits {
            reads,
            latency_ns: reads * 10 * MS,
            runq_ns: runq,
            off_cpu_ns: off,
            cpus: vec![1],
            holders: vec![SlowReadHolder {
                pid: 88,
                comm: "sh".into(),
                runq_ns: runq,
                tailtrap: false,
            }],
        }
    }

    #[test]
    fn the_task_that_ran_last_before_the_reader_is_named_only_if_it_used_the_cpu() {
        // A VM held the reader's CPU; tailtrap's own worker, woken as often as the reader,
        // was the task the reader took its CPU back from in most slow reads.
        let mut input = read_input(2 * MS, 3 * MS);
        let mut waits = split(10, 80 * MS, 10 * MS);
        waits.holders = vec![SlowReadHolder {
            pid: 9,
            comm: "tailtrap-worker".into(),
            runq_ns: 80 * MS,
            tailtrap: true,
        }];
        input.slow_reads = Some(waits);
        input.readers = Some(ReaderTimes {
            holders: vec![
                Holder {
                    pid: 31,
                    comm: "qemu-system-x86".into(),
                    on_cpu_ns: 700 * MS,
                    tailtrap: false,
                },
                Holder {
                    pid: 9,
                    comm: "tailtrap".into(),
                    on_cpu_ns: 30 * MS,
                    tailtrap: true,
                },
            ],
            ..readers(2 * MS, 3 * MS)
        });
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::CpuWait, "{}", c.summary);
        assert!(
            c.summary
                .ends_with("(cpu 1 shared with pid 31 qemu-system-x86)"),
            "{}",
            c.summary
        );
        // When tailtrap did use the CPU as much, it is named, as itself.
        if let Some(r) = input.readers.as_mut() {
            r.holders[1].on_cpu_ns = 600 * MS;
        }
        let c = decide(&input);
        assert!(
            c.summary
                .ends_with("(cpu 1 held by pid 9 tailtrap-worker (tailtrap itself))"),
            "{}",
            c.summary
        );
        // No per-CPU figures: the last task is all there is.
        input.readers = None;
        let c = decide(&input);
        assert!(
            c.summary
                .ends_with("held by pid 9 tailtrap-worker (tailtrap itself))"),
            "{}",
            c.summary
        );
    }

    #[test]
    fn the_slow_reads_own_split_comes_before_the_readers_schedstat() {
        // schedstat over the whole interval says off CPU; the slow packets' own waits were
        // in the run queue behind pid 88.
        let mut input = read_input(2 * MS, 3 * MS);
        input.slow_reads = Some(split(10, 80 * MS, 10 * MS));
        if let Some(r) = input.readers.as_mut() {
            r.holders.push(Holder {
                pid: 88,
                comm: "sh".into(),
                on_cpu_ns: 800 * MS,
                tailtrap: false,
            });
        }
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::CpuWait, "{}", c.summary);
        assert_eq!(
            c.summary,
            "reader runnable but waiting for a CPU 80 % of the delay (cpu 1 held by pid 88 sh)"
        );
        assert_eq!(c.figures.slow_reads, input.slow_reads);
        // Off CPU by the split, no schedstat at all.
        input.readers = None;
        input.slow_reads = Some(split(10, 2 * MS, 90 * MS));
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::ReaderOffCpu, "{}", c.summary);
        // Too few split reads: schedstat decides, and the split is not in the figures.
        input.readers = Some(readers(5 * MS, 81 * MS));
        input.slow_reads = Some(split(MIN_SPLIT_READS - 1, 0, 40 * MS));
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::CpuWait);
        assert!(
            c.summary.ends_with("shared with pid 77 stress-ng)"),
            "{}",
            c.summary
        );
        assert_eq!(c.figures.slow_reads, None);
    }

    #[test]
    fn throttling_comes_before_the_readers_figures() {
        let mut input = read_input(5 * MS, 81 * MS);
        input.throttle = Some(Throttle {
            cgroup: "/sys/fs/cgroup/web".into(),
            quota: "20000 100000".into(),
            periods: 50,
            throttled_periods: 48,
            throttled_ns: 3_900 * MS,
        });
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::Throttled);
        assert_eq!(
            c.summary,
            "reader throttled by its cgroup's CPU quota (cpu.max 20000 100000; throttled in 48 of 50 periods, 3.90s in all)"
        );
        // Throttled in few periods: not the cause.
        input.throttle.as_mut().unwrap().throttled_periods = 2;
        assert_eq!(decide(&input).kind, CauseKind::CpuWait);
    }

    /// Slow packets at ip-start of a service whose packets come in on eth0's 8 queues:
    /// `slow` per queue, each from `flows` flows; the device's own counters, when given,
    /// `packets` per queue; the service's captured packets came in on `service_queues`.
    fn rx_input(
        slow: &[(u16, u64)],
        flows: u64,
        packets: Option<&[(u16, u64)]>,
        service_queues: &[u16],
    ) -> CauseInput {
        let queues: Vec<RxQueueSlow> = slow
            .iter()
            .map(|&(queue, slow)| RxQueueSlow {
                ifindex: 2,
                netns_ino: 4026531840,
                queue,
                slow,
                flows,
            })
            .collect();
        CauseInput {
            window_ns: 5_000 * MS,
            slow_ns: MS,
            rx_queues: Some(RxQueueInput {
                slow_samples: slow.iter().map(|q| q.1).sum(),
                queues,
                devices: vec![RxDevice {
                    ifindex: 2,
                    netns_ino: 4026531840,
                    name: Some("eth0".into()),
                    rx_queues: Some(8),
                    queue_packets: packets.map(<[_]>::to_vec),
                    service_queues: service_queues.to_vec(),
                }],
            }),
            ..Default::default()
        }
    }

    /// eth0's 8 queues with 1000 packets each over the window.
    const EVEN: [(u16, u64); 8] = [
        (0, 1000),
        (1, 1000),
        (2, 1000),
        (3, 1000),
        (4, 1000),
        (5, 1000),
        (6, 1000),
        (7, 1000),
    ];

    #[test]
    fn one_rx_queue_is_named_when_its_slow_packets_stand_out_on_a_spread_device() {
        let input = rx_input(
            &[(3, 47), (1, 2), (5, 1)],
            12,
            Some(&EVEN),
            &[0, 1, 3, 5, 6],
        );
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::OneRxQueue, "{}", c.summary);
        assert_eq!(
            c.summary,
            "one RX queue: eth0 rx-3: 94 % of slow packets (12 flows), 12 % of eth0's packets; \
             the service's packets also came in on 4 other queues"
        );
        let q = c.figures.rx_queue_spread.unwrap();
        assert_eq!((q.queues, q.slow_samples, q.flows), (vec![3], 50, 12));
        assert_eq!(q.device_queues_with_packets, Some(8));
        // Up to a quarter of the device's queues: two of eight.
        let input = rx_input(&[(3, 30), (6, 20), (1, 5)], 4, Some(&EVEN), &[0, 1, 3, 6]);
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::OneRxQueue, "{}", c.summary);
        assert!(
            c.summary
                .starts_with("few RX queues: eth0 rx-3, rx-6: 91 % of slow packets (8 flows), 25 % of eth0's packets;"),
            "{}",
            c.summary
        );
        assert_eq!(kind_name(&c), "one-rx-queue");
    }

    fn kind_name(c: &Cause) -> &'static str {
        c.kind.name()
    }

    #[test]
    fn slow_packets_spread_over_rx_queues_name_none() {
        // Spread evenly over the eight queues.
        let slow: Vec<(u16, u64)> = (0..8).map(|q| (q, 10)).collect();
        let input = rx_input(&slow, 5, Some(&EVEN), &[0, 1, 2, 3, 4, 5, 6, 7]);
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::NoClearCause, "{}", c.summary);
        assert_eq!(c.figures.rx_queue_spread, None);
        // Half on one queue, the rest on three others: the two queues a device of eight
        // may have named hold 70 %, not enough.
        let input = rx_input(
            &[(3, 25), (1, 10), (2, 10), (4, 5)],
            5,
            Some(&EVEN),
            &[1, 3],
        );
        assert_eq!(decide(&input).figures.rx_queue_spread, None);
        // Concentrated, but on the queue that carries most of the device's packets.
        let mut busy = EVEN;
        busy[3].1 = 20_000;
        let input = rx_input(&[(3, 50)], 9, Some(&busy), &[0, 3]);
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::NoClearCause, "{}", c.summary);
        assert_eq!(
            c.summary,
            "no clear cause (100 % of the slow packets captured came in on eth0 rx-3 (74 % of eth0's packets))"
        );
        // Too few slow packets to say.
        let input = rx_input(&[(3, 19)], 9, Some(&EVEN), &[0, 3]);
        assert_eq!(decide(&input).figures.rx_queue_spread, None);
    }

    #[test]
    fn a_queue_is_not_named_without_the_devices_counters_several_flows_or_other_queues() {
        // The device keeps no per-queue counters: the concentration is a figure only.
        let c = decide(&rx_input(&[(3, 48), (1, 2)], 12, None, &[0, 1, 3]));
        assert_eq!(c.kind, CauseKind::NoClearCause, "{}", c.summary);
        assert_eq!(
            c.summary,
            "no clear cause (96 % of the slow packets captured came in on eth0 rx-3 (eth0's packets per queue unknown))"
        );
        assert_eq!(c.figures.rx_queue_spread.unwrap().device_share, None);
        // Every slow packet from one flow or two: a flow's own trouble looks the same.
        let c = decide(&rx_input(&[(3, 50)], 2, Some(&EVEN), &[0, 3]));
        assert_eq!(c.kind, CauseKind::NoClearCause, "{}", c.summary);
        // The service's packets came in on that queue only (its flows hash or are steered
        // there): its own trouble would look the same.
        let c = decide(&rx_input(&[(3, 50)], 12, Some(&EVEN), &[3]));
        assert_eq!(c.kind, CauseKind::NoClearCause, "{}", c.summary);
        // A device whose counters show one queue busy only (no spread to compare with).
        let one: [(u16, u64); 2] = [(3, 500), (0, 0)];
        let c = decide(&rx_input(&[(3, 50)], 12, Some(&one), &[0, 3]));
        assert_eq!(c.kind, CauseKind::NoClearCause, "{}", c.summary);
        // The read stage: a queue cannot delay a packet already in the socket.
        let mut input = rx_input(&[(3, 50)], 12, Some(&EVEN), &[0, 3]);
        input.read_stage = true;
        assert_eq!(decide(&input).kind, CauseKind::NoClearCause);
    }

    #[test]
    fn slow_packets_without_a_queue_name_none() {
        // The driver recorded no queue (loopback, veth): nothing to say about queues.
        let mut input = rx_input(&[], 0, Some(&EVEN), &[]);
        if let Some(q) = input.rx_queues.as_mut() {
            q.slow_samples = 80;
        }
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::NoClearCause);
        assert_eq!(c.summary, "no clear cause");
        // A few with a queue among many without: not most of the slow packets.
        let mut input = rx_input(&[(3, 25)], 12, Some(&EVEN), &[0, 3]);
        if let Some(q) = input.rx_queues.as_mut() {
            q.slow_samples = 80;
        }
        assert_eq!(decide(&input).figures.rx_queue_spread, None);
        // No queue figures at all (an incident decided before they existed).
        assert_eq!(decide(&CauseInput::default()).figures.rx_queue_spread, None);
    }

    #[test]
    fn one_cpu_names_the_rx_queue_its_slow_packets_came_in_on() {
        let mut per_cpu = vec![hist(&[(100 * US, 1000)]); 16];
        per_cpu[3] = hist(&[(100 * US, 20), (40 * MS, 60)]);
        let mut input = rx_input(&[(3, 58), (1, 2)], 12, None, &[1, 3]);
        input.per_cpu = per_cpu;
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::OneCpu, "{}", c.summary);
        assert!(
            c.summary
                .ends_with("; 97 % of the slow packets captured came in on eth0 rx-3"),
            "{}",
            c.summary
        );
    }

    #[test]
    fn softirq_pressure_is_named_for_early_stages_only() {
        let softirq = vec![
            CpuSoftirq {
                cpu: 0,
                packets: 10,
                ..Default::default()
            },
            CpuSoftirq {
                cpu: 1,
                packets: 900,
                squeezed: 6_000,
                dropped: 0,
                softirq_ns: 400 * MS,
                ksoftirqd_ns: Some(450 * MS),
                ..Default::default()
            },
        ];
        let input = CauseInput {
            window_ns: 5_000 * MS,
            softirq: softirq.clone(),
            ..Default::default()
        };
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::Softirq);
        assert!(c.summary.starts_with("softirq under pressure on cpu 1 (ksoftirqd ran 9 % of the time; time squeeze 1200/s"), "{}", c.summary);
        let read = CauseInput {
            read_stage: true,
            ..input
        };
        assert_eq!(decide(&read).kind, CauseKind::NoClearCause);
        // Most slow packets of cpu 1 were processed by its ksoftirqd: deferred.
        let mut input = CauseInput {
            window_ns: 5_000 * MS,
            softirq,
            ..Default::default()
        };
        input.softirq[1].squeezed = 0;
        input.softirq[1].softirq_ns = 0;
        input.softirq[1].slow_samples = 40;
        input.softirq[1].in_ksoftirqd = 34;
        let c = decide(&input);
        assert_eq!(c.kind, CauseKind::Softirq);
        assert!(
            c.summary.starts_with(
                "softirq deferred to ksoftirqd on cpu 1 (85 % of its slow packets processed in ksoftirqd; "
            ),
            "{}",
            c.summary
        );
        assert_eq!(decide(&CauseInput::default()).summary, "no clear cause");
    }
}
