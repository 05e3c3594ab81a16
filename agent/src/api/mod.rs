//! The daemon's local API: HTTP/JSON on a unix socket. `server` serves it from the daemon,
//! `client` reads it from the CLI, and `query` answers the read endpoints from a [`Store`],
//! so the CLI gives the same answers when it opens the database itself. docs/api.md lists
//! the endpoints.

pub mod client;
pub mod limits;
pub mod query;
pub mod server;

#[cfg(test)]
mod fuzz;

use std::collections::BTreeMap;
use std::path::PathBuf;

use capture::pwru::Prerequisites;
use model::Probe;
use serde::{Deserialize, Serialize};
use storage::{Incident, IncidentVerdict, SampleSummary};

/// `GET /v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    /// The daemon itself.
    pub daemon: DaemonInfo,
    /// Each probe and how it is attached.
    pub probes: Vec<ProbeRow>,
    /// Kernel features the probes stand in for on this kernel (empty on 6.1 and newer).
    #[serde(default)]
    pub missing_kernel_features: Vec<MissingFeatureRow>,
    /// Configured services (empty: grouped by cgroup automatically).
    pub services: Vec<String>,
    /// Last interval's quantiles per (service, probe) against the learned baseline.
    pub latency: Vec<LatencyRow>,
    /// Incidents open now.
    pub open_incidents: Vec<OpenIncident>,
    /// In-kernel capture.
    pub capture: CaptureReport,
    /// Kernel-side probe counters since the probes were loaded.
    pub kernel_counters: KernelCounters,
    /// pwru: what the start-up check found, and whether a session runs now.
    pub pwru: PwruReport,
    /// BPF run time per program.
    pub bpf_cost: Vec<ProgCost>,
    /// The daemon process's CPU and memory.
    pub process: ProcessStats,
    /// The database.
    pub store: StoreReport,
    /// Incidents opened since start, per (service, stage).
    #[serde(default)]
    pub incidents_opened: Vec<OpenedCount>,
    /// Incidents closed since start with a cause verdict, per (service, cause).
    #[serde(default)]
    pub incident_causes: Vec<CauseCount>,
    /// Incidents exported over OTLP (`None`: `[otlp]` is off).
    #[serde(default)]
    pub otlp: Option<crate::otlp::OtlpReport>,
}

/// How many incidents of a service opened with a stage verdict since the daemon started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenedCount {
    /// Service.
    pub service: String,
    /// Stage verdict when the incident opened (`unknown` without one).
    pub stage: String,
    /// Incidents.
    pub count: u64,
}

/// How many incidents of a service closed with a cause verdict since the daemon started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CauseCount {
    /// Service.
    pub service: String,
    /// Cause verdict (`cpu-wait`, `throttled`, ..., `no-clear-cause`; docs/detector.md).
    pub cause: String,
    /// Incidents.
    pub count: u64,
}

/// Facts about the running daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonInfo {
    /// tailtrap's version.
    pub version: String,
    /// Process id.
    pub pid: u32,
    /// Start time, ns since the epoch.
    pub started_ns: u64,
    /// The detector interval.
    #[serde(with = "humantime_serde")]
    pub interval: std::time::Duration,
    /// Where the configuration came from.
    pub config: String,
    /// Database directory.
    pub db: PathBuf,
    /// API socket.
    pub socket: PathBuf,
    /// Intervals run since start.
    pub intervals: u64,
    /// Intervals whose histograms could not be read or stored.
    pub interval_errors: u64,
    /// The last SIGHUP reload, if any since start.
    #[serde(default)]
    pub last_reload: Option<ReloadOutcome>,
    /// How long the last interval's work took, ns.
    #[serde(default)]
    pub last_interval_ns: u64,
    /// The longest any interval of the last 10 s took from its scheduled tick to the end
    /// of its work, ns: how late the daemon was lately (API load, storage, pwru).
    #[serde(default)]
    pub worst_interval_ns: u64,
    /// Of that, the part before the work began: the longest any tick of the last 10 s
    /// waited to be run, ns. Close to `worst_interval_ns`: the host kept the daemon off
    /// the CPU, or the loop was busy elsewhere; far below it: the interval's own work.
    #[serde(default)]
    pub worst_wakeup_ns: u64,
    /// Where `GET /metrics` is served (`None`: metrics are off).
    #[serde(default)]
    pub metrics_listen: Option<String>,
}

/// What a SIGHUP reload did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    /// When, ns since the epoch.
    pub at_ns: u64,
    /// True when the file was applied; false when it was refused and the running
    /// configuration stayed.
    pub applied: bool,
    /// What was applied, or why the file was refused (naming the file, line and key).
    pub message: String,
    /// Tables changed in the file that take effect only at the next start.
    pub restart_needed: Vec<String>,
}

/// One probe's attachment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeRow {
    /// The probe.
    pub probe: Probe,
    /// How it is attached (`tp_btf skb_copy_datagram_iovec`, `disabled`, ...).
    pub method: String,
    /// Why the preferred method was refused, when this is a fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A kernel feature the probes lack on this kernel and what stands in for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingFeatureRow {
    /// The feature.
    pub feature: String,
    /// The first mainline kernel that has it.
    pub since: String,
    /// What the probes do instead.
    pub stand_in: String,
    /// What that costs in accuracy or CPU.
    pub cost: String,
    /// Why it counts as missing.
    pub why: String,
}

impl From<&bpf::MissingFeature> for MissingFeatureRow {
    fn from(m: &bpf::MissingFeature) -> MissingFeatureRow {
        MissingFeatureRow {
            feature: m.feature.to_owned(),
            since: m.since.to_owned(),
            stand_in: m.stand_in.to_owned(),
            cost: m.cost.to_owned(),
            why: m.why.clone(),
        }
    }
}

/// Quantiles of one (service, probe) in the last interval and in the baseline, ns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyRow {
    /// Service.
    pub service: String,
    /// Probe.
    pub probe: Probe,
    /// Samples in the last interval.
    pub count: u64,
    /// Interval median.
    pub p50_ns: Option<f64>,
    /// Interval p99.
    pub p99_ns: Option<f64>,
    /// Baseline median (`None` while warming up).
    pub baseline_p50_ns: Option<f64>,
    /// Baseline p99 (`None` while warming up).
    pub baseline_p99_ns: Option<f64>,
    /// Interval p99.9.
    #[serde(default)]
    pub p999_ns: Option<f64>,
    /// Baseline p99.9 (`None` while warming up).
    #[serde(default)]
    pub baseline_p999_ns: Option<f64>,
}

/// An incident that is open now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenIncident {
    /// Stored id.
    pub id: u64,
    /// Service.
    pub service: String,
    /// Hot probes.
    pub probes: Vec<Probe>,
    /// When it opened, ns since the epoch.
    pub opened_ns: u64,
    /// Headline, e.g. `tcp-socket-read p99 120µs -> 21.0ms (175x)`.
    pub headline: String,
    /// Stage verdict, e.g. `application read delay`.
    pub stage: Option<String>,
    /// Cause verdict so far, e.g. `cpu-wait` (`None`: not decided yet).
    #[serde(default)]
    pub cause: Option<String>,
    /// Its sentence with figures.
    #[serde(default)]
    pub cause_summary: Option<String>,
    /// The host-wide incident this one is part of (docs/detector.md, "Host-wide incidents").
    #[serde(default)]
    pub part_of: Option<u64>,
}

/// In-kernel capture state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureReport {
    /// Whether in-kernel capture can be armed by this daemon.
    pub available: bool,
    /// One line about the state.
    pub state: String,
    /// Services armed now.
    #[serde(default)]
    pub armed: Vec<String>,
    /// Samples the flight recorder holds now.
    #[serde(default)]
    pub flight_samples: u64,
    /// Record counts since capture started.
    #[serde(default)]
    pub counters: CaptureCounts,
    /// The reader-wait split of slow reads (scheduler hooks): following readers now,
    /// ready (attached only while armed), or unavailable and why.
    #[serde(default)]
    pub reader_wait: String,
}

/// Capture records since capture started: the kernel's counts per recorder (armed capture,
/// flight recorder) and the records lost between the reader thread and the daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureCounts {
    /// The kernel's counts (same JSON fields: `emitted`, `ring_full`, `rate_limited` and their
    /// `flight_` counterparts).
    #[serde(flatten)]
    pub kernel: bpf::CaptureCounters,
    /// Records read from the ring buffer but lost before the daemon took them.
    pub user_space_lost: u64,
}

/// The probes' kernel-side counters.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct KernelCounters {
    /// Samples lost because the histogram map was full.
    pub map_full_drops: u64,
    /// skbs without a timestamp.
    pub zero_tstamp: u64,
    /// Timestamps in the future.
    pub future_tstamp: u64,
    /// Reads skipped as head-of-line blocked.
    pub hol_excluded: u64,
    /// Samples counted to `other` over the auto-service limit.
    pub auto_overflow: u64,
    /// Auto-service slots freed because their cgroup was gone.
    #[serde(default)]
    pub auto_freed: u64,
}

impl From<bpf::Counters> for KernelCounters {
    fn from(c: bpf::Counters) -> Self {
        KernelCounters {
            map_full_drops: c.map_full_drops,
            zero_tstamp: c.zero_tstamp,
            future_tstamp: c.future_tstamp,
            hol_excluded: c.hol_excluded,
            auto_overflow: c.auto_overflow,
            auto_freed: c.auto_freed,
        }
    }
}

/// pwru's state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PwruReport {
    /// Sessions are switched on in the configuration.
    pub enabled: bool,
    /// The start-up prerequisite check.
    pub prerequisites: Prerequisites,
    /// The check is overridden by `daemon.pwru_ignore_prerequisites`.
    pub prerequisites_ignored: bool,
    /// A session is running now.
    pub busy: bool,
    /// Sessions ended since start, by final state (`ok`, `failed`, `timeout`, ...).
    #[serde(default)]
    pub sessions: BTreeMap<String, u64>,
}

/// BPF run time of one program.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProgCost {
    /// Program name.
    pub program: String,
    /// Where it is attached.
    pub attach_point: String,
    /// Probes it serves.
    pub probes: Vec<Probe>,
    /// Runs.
    pub run_cnt: u64,
    /// Total run time, ns (0 unless `kernel.bpf_stats_enabled` is 1).
    pub run_time_ns: u64,
}

/// CPU and memory of the daemon process.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ProcessStats {
    /// User CPU time, seconds.
    pub cpu_user_s: f64,
    /// System CPU time, seconds.
    pub cpu_system_s: f64,
    /// CPU time over wall time since start, percent of one CPU.
    pub cpu_percent: f64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// Bytes allocated from the allocator's arenas, read at start and after each heap trim
    /// (every 30 s): RSS minus this, the binary's pages and the mapped blocks' resident
    /// part is slack the allocator holds. Absent with other allocators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_arena_bytes: Option<u64>,
    /// Bytes of blocks the allocator mapped on their own (large allocations), at its last
    /// trim; counted whole, though pages never written are not resident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_mapped_bytes: Option<u64>,
    /// glibc's per-thread caches were seen off at start (the daemon turns them off: see
    /// docs/operations.md); absent when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_thread_caches_off: Option<bool>,
}

/// Database figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StoreReport {
    /// Live data, bytes.
    pub live_bytes: u64,
    /// Files on disk, bytes.
    pub size_on_disk: u64,
    /// Failed writes since start.
    pub write_errors: u64,
    /// Of those, full-disk errors.
    pub disk_full_errors: u64,
    /// Records skipped as undecodable.
    pub undecodable_records: u64,
    /// The storage engine failed (a full disk, a file system gone read-only) and writes are
    /// refused until it reopens (tried every 10 s once the directory takes writes).
    #[serde(default)]
    pub engine_failed: bool,
    /// What made the engine fail, while it is failed.
    #[serde(default)]
    pub engine_failure: Option<String>,
    /// Times the engine was reopened to free its memory (`storage.cache_bytes`).
    #[serde(default)]
    pub engine_reopens: u64,
    /// The live-data budget (`storage.max_bytes`).
    #[serde(default)]
    pub max_bytes: u64,
    /// Intervals of history dropped because the storage writer was behind (a slow disk).
    #[serde(default)]
    pub dropped_history_intervals: u64,
    /// Captured samples dropped because the sample writer was behind.
    #[serde(default)]
    pub dropped_samples: u64,
}

impl From<storage::StoreStats> for StoreReport {
    fn from(s: storage::StoreStats) -> Self {
        StoreReport {
            live_bytes: s.live_bytes,
            size_on_disk: s.size_on_disk,
            write_errors: s.write_errors,
            disk_full_errors: s.disk_full_errors,
            undecodable_records: s.undecodable_records,
            engine_failed: s.engine_failed,
            engine_failure: s.engine_failure,
            engine_reopens: s.engine_reopens,
            max_bytes: 0,
            dropped_history_intervals: 0,
            dropped_samples: 0,
        }
    }
}

/// `GET /v1/incidents/{id}`: the incident and the summary of its samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IncidentView {
    /// The stored incident.
    pub incident: Incident,
    /// Its samples, summarised.
    pub summary: SampleSummary,
    /// The operator's verdict, if one was given (`tailtrap incidents mark`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<IncidentVerdict>,
}

/// `GET /v1/history`: one service's stored histogram history at one resolution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryAnswer {
    /// The service.
    pub service: String,
    /// Width of each point.
    #[serde(with = "humantime_serde")]
    pub resolution: std::time::Duration,
    /// The range asked for, ns since the epoch (inclusive).
    pub from_ns: u64,
    /// End of the range.
    pub to_ns: u64,
    /// One series per probe with points in the range, in probe order.
    pub series: Vec<ProbeHistory>,
}

/// The points of one probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeHistory {
    /// The probe.
    pub probe: Probe,
    /// `(start ns since the epoch, histogram)` in time order; empty points are absent.
    pub points: Vec<(u64, model::Histogram)>,
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, for humans.
    pub error: String,
}
