//! The daemon's local API: HTTP/JSON on a unix socket. `server` serves it from the daemon,
//! `client` reads it from the CLI, and `query` answers the read endpoints from a [`Store`],
//! so the CLI gives the same answers when it opens the database itself. docs/api.md lists
//! the endpoints.

pub mod client;
pub mod limits;
pub mod query;
mod query_error;
pub mod server;
pub mod timelines;

#[cfg(test)]
mod fuzz;

use std::collections::BTreeMap;
use std::path::PathBuf;

use capture::pwru::Prerequisites;
use model::Probe;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use storage::{
    CaptureStatus, Incident, IncidentBundle, IncidentCause, IncidentCounters, IncidentPage,
    IncidentState, IncidentVerdict, PwruRecord, PwruStatus, SampleSummary,
};

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
    /// Small shifts noticed since start (below `incident_ratio`, not yet lasting
    /// `notice_for`): per service, how many and the latest. Not incidents, never alerted.
    #[serde(default)]
    pub notices: Vec<NoticeCount>,
    /// Incidents exported over OTLP (`None`: `[otlp]` is off).
    #[serde(default)]
    pub otlp: Option<crate::otlp::OtlpReport>,
    /// Hardware RX stamping per interface (empty with `hw_rx_timestamps = "off"`).
    #[serde(default)]
    pub nic_stamps: Vec<NicStampRow>,
    /// driver-to-completion per device in the last interval (empty while the probe does
    /// not run or no hardware device has transmitted).
    #[serde(default)]
    pub device_latency: Vec<DeviceLatencyRow>,
}

/// One device's driver-to-completion in the last interval: transmit-queue time that is the
/// driver's and the NIC's, whichever service sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceLatencyRow {
    /// Interface name (`ifindex N in netns M` outside the daemon's namespace).
    pub device: String,
    /// Completions timed in the last interval.
    pub count: u64,
    /// Interval median, ns.
    pub p50_ns: Option<f64>,
    /// Interval p99, ns.
    pub p99_ns: Option<f64>,
    /// Interval p99.9, ns.
    pub p999_ns: Option<f64>,
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

/// One small shift the detector noticed and let be (docs/detector.md, "Notices").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoticeRow {
    /// Service.
    pub service: String,
    /// When it met the opening rules (Unix ns).
    pub noticed_ns: u64,
    /// The strongest shift then: probe, quantile and ratio to the baseline.
    pub probe: String,
    /// Quantile, e.g. 0.99.
    pub quantile: f64,
    /// Observed / baseline at that quantile.
    pub ratio: f64,
    /// Stage verdict, when the path had data to compare.
    pub stage: Option<String>,
}

/// Notices of one service since the daemon started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoticeCount {
    /// How many.
    pub count: u64,
    /// The latest.
    pub latest: NoticeRow,
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
    /// nic-to-stack: hardware stamps from a device without a clock offset, skipped.
    #[serde(default)]
    pub nic_stamp_no_clock: u64,
    /// nic-to-stack: converted stamps out of bounds (a clock stepped), skipped.
    #[serde(default)]
    pub nic_stamp_out_of_bounds: u64,
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
            nic_stamp_no_clock: c.nic_stamp_no_clock,
            nic_stamp_out_of_bounds: c.nic_stamp_out_of_bounds,
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

/// JSON text stored with a record (the store keeps it opaque) as the JSON it holds, for
/// the answers: `null` for none (an empty text), and the text as a JSON string when it
/// does not parse (never so for what this daemon writes).
pub fn stored_json(text: &str) -> Value {
    if text.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// An incident as every answer carries it (`GET /v1/incidents`, `/v1/incidents/{id}`, the
/// export, `tailtrap incidents --json`): the stored record, with what the store keeps as
/// JSON text (`evidence_json`, `stages_json`, the cause's `figures_json`) given as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncidentAnswer {
    /// Stored id.
    pub id: u64,
    /// The service it concerns.
    pub service: String,
    /// The probes whose tail moved.
    pub probes: Vec<Probe>,
    /// When it opened, ns since the epoch.
    pub opened_ns: u64,
    /// When it closed (or when an interrupted one was last known open).
    pub closed_ns: Option<u64>,
    /// Where it stands.
    pub state: IncidentState,
    /// The detector's incident (a host-wide incident's own evidence: its members), stored
    /// as `evidence_json`.
    pub evidence: Value,
    /// The stage attribution (`null` without one), stored as `stages_json`.
    pub stages: Value,
    /// In-kernel capture status.
    pub capture: CaptureStatus,
    /// pwru session status.
    pub pwru: PwruStatus,
    /// Other counters.
    pub counters: IncidentCounters,
    /// Why the packets waited (`None`: not decided yet).
    pub cause: Option<CauseAnswer>,
}

/// An incident's cause verdict as the answers carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CauseAnswer {
    /// `cpu-wait`, `throttled`, ..., `no-clear-cause` (docs/detector.md).
    pub kind: String,
    /// The operator's sentence with its figures.
    pub summary: String,
    /// The figures the verdict was drawn from, stored as `figures_json`.
    pub figures: Value,
    /// When it was last decided, ns since the epoch.
    pub decided_ns: u64,
}

impl From<IncidentCause> for CauseAnswer {
    fn from(c: IncidentCause) -> Self {
        CauseAnswer {
            figures: stored_json(&c.figures_json),
            kind: c.kind,
            summary: c.summary,
            decided_ns: c.decided_ns,
        }
    }
}

impl From<Incident> for IncidentAnswer {
    fn from(i: Incident) -> Self {
        IncidentAnswer {
            evidence: stored_json(&i.evidence_json),
            stages: stored_json(&i.stages_json),
            id: i.id,
            service: i.service,
            probes: i.probes,
            opened_ns: i.opened_ns,
            closed_ns: i.closed_ns,
            state: i.state,
            capture: i.capture,
            pwru: i.pwru,
            counters: i.counters,
            cause: i.cause.map(CauseAnswer::from),
        }
    }
}

/// `GET /v1/incidents`: a page of incidents, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncidentList {
    /// The incidents, newest first.
    pub incidents: Vec<IncidentAnswer>,
    /// Pass as `before_id` for the next page; `None` on the last.
    pub next_before_id: Option<u64>,
    /// Operators' verdicts on the incidents of this page that have one, by incident id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub verdicts: BTreeMap<u64, IncidentVerdict>,
}

impl From<IncidentPage> for IncidentList {
    fn from(p: IncidentPage) -> Self {
        IncidentList {
            incidents: p.incidents.into_iter().map(IncidentAnswer::from).collect(),
            next_before_id: p.next_before_id,
            verdicts: p.verdicts,
        }
    }
}

/// `GET /v1/incidents/{id}/export` and `tailtrap export`: one incident with everything
/// stored about it.
#[derive(Debug, Clone, Serialize)]
pub struct ExportAnswer {
    /// Format marker for readers of the file: [`ExportAnswer::FORMAT`].
    pub format: &'static str,
    /// The incident.
    pub incident: IncidentAnswer,
    /// The operator's verdict, if one was given (`tailtrap incidents mark`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<IncidentVerdict>,
    /// Summary of all its samples.
    pub summary: SampleSummary,
    /// All its samples, in time order.
    pub samples: Vec<model::Sample>,
    /// All its pwru records, in order.
    pub pwru: Vec<PwruRecord>,
}

impl ExportAnswer {
    /// The export's format: `/2` since the incident's evidence, stages and cause figures
    /// are JSON rather than JSON text (`evidence_json`, ... in `/1`).
    pub const FORMAT: &'static str = "tailtrap-incident/2";
}

impl From<IncidentBundle> for ExportAnswer {
    fn from(b: IncidentBundle) -> Self {
        ExportAnswer {
            format: Self::FORMAT,
            incident: b.incident.into(),
            verdict: b.verdict,
            summary: b.summary,
            samples: b.samples,
            pwru: b.pwru,
        }
    }
}

/// `GET /v1/incidents/{id}`: the incident and the summary of its samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IncidentView {
    /// The stored incident.
    pub incident: IncidentAnswer,
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

/// One interface's hardware RX stamping, as status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicStampRow {
    /// Interface name.
    pub interface: String,
    /// Whether received packets are stamped in hardware now, in a word: `on`, `off`
    /// (the device can, but its `rx_filter` is none), `unsupported`, `no-phc`, `error`.
    pub state: String,
    /// The operator's sentence: "no hardware RX stamps on eth0: ...", or what is used.
    pub summary: String,
    /// The device's PTP clock (`/dev/ptpN`), when it has one.
    pub phc: Option<String>,
    /// The RX filter set now (`none`, `all`, `ptpv2-event`, ...), when the driver says.
    pub rx_filter: Option<String>,
    /// Whether tailtrap turned RX stamping on (`hw_rx_timestamps = "enable"`); it is put
    /// back when the daemon stops.
    #[serde(default)]
    pub enabled_by_tailtrap: bool,
    /// The PHC's offset to the system clock (CLOCK_REALTIME − PHC), ns, as last read.
    pub offset_ns: Option<i64>,
    /// Half the narrowest bracket of the system reads around the PHC read, ns (0 for a
    /// cross-timestamp).
    pub offset_uncertainty_ns: Option<u64>,
    /// How the offset was read: `precise`, `extended`, `plain`.
    pub offset_method: Option<String>,
    /// When the offset was read, ns since the epoch.
    pub offset_read_ns: Option<u64>,
    /// Why the offset could not be read, when it could not.
    pub offset_error: Option<String>,
    /// The probes hold this device's clock: nic-to-stack times its stamped packets (set
    /// once the kernel took the offset, each interval).
    #[serde(default)]
    pub timed_by_nic_to_stack: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(evidence: &str, stages: &str, figures: Option<&str>) -> Incident {
        Incident {
            id: 7,
            service: "web".into(),
            probes: vec![Probe::TcpSocketRead],
            opened_ns: 1,
            closed_ns: None,
            state: IncidentState::Open,
            evidence_json: evidence.into(),
            stages_json: stages.into(),
            capture: CaptureStatus::default(),
            pwru: PwruStatus::default(),
            counters: IncidentCounters::default(),
            cause: figures.map(|f| IncidentCause {
                kind: "one-cpu".into(),
                summary: "one CPU".into(),
                figures_json: f.into(),
                decided_ns: 2,
            }),
        }
    }

    /// The stored JSON texts become JSON values under names without `_json`; an empty
    /// text is `null`, and text that is not JSON stays a string rather than being lost.
    #[test]
    fn an_incident_answer_carries_json_not_json_text() {
        let a = IncidentAnswer::from(stored(
            r#"{"headline":{"ratio":3.5}}"#,
            r#""application read delay""#,
            Some(r#"{"cpu":1,"share":0.94}"#),
        ));
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["evidence"]["headline"]["ratio"], 3.5, "{v}");
        assert_eq!(v["stages"], "application read delay", "{v}");
        assert_eq!(v["cause"]["figures"]["share"], 0.94, "{v}");
        assert_eq!(v["cause"]["kind"], "one-cpu", "{v}");
        let text = v.to_string();
        assert!(!text.contains("_json"), "{text}");
        // What the answer carries reads back as it was written.
        assert_eq!(serde_json::from_value::<IncidentAnswer>(v).unwrap(), a);

        let a = IncidentAnswer::from(stored("", "null", None));
        assert_eq!(
            (a.evidence, a.stages, a.cause),
            (Value::Null, Value::Null, None)
        );
        let a = IncidentAnswer::from(stored("{truncated", "", Some("")));
        assert_eq!(a.evidence, Value::String("{truncated".into()));
        assert_eq!(a.cause.map(|c| c.figures), Some(Value::Null));
    }
}
