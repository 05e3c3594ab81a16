//! What `GET /v1/status` reports: what the daemon set up ([`Live`]) and what the interval
//! loop saw last ([`LoopStatus`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use bpf::ProbeSet;
use capture::pwru::{Prerequisites, SessionManager};
use storage::{Store, StoreStats};

use super::lock;
use crate::api::NicStampRow;

use crate::api::{
    CaptureReport, CauseCount, DaemonInfo, DeviceLatencyRow, KernelCounters, LatencyRow,
    MissingFeatureRow, NoticeCount, NoticeRow, OpenIncident, OpenedCount, ProbeRow, ProcessStats,
    ProgCost, PwruReport, ReloadOutcome, StatusReport, StoreReport,
};
use crate::config::Config;

/// The daemon's set-up as the API shows it.
pub(super) struct Live {
    daemon: DaemonInfo,
    started: SystemTime,
    probes: Vec<ProbeRow>,
    missing_features: Vec<MissingFeatureRow>,
    services: Vec<String>,
    pwru: (Prerequisites, bool, SessionManager),
    pwru_enabled: bool,
    /// `storage.max_bytes`.
    store_budget: u64,
    /// The OTLP export's queue and figures, when `[otlp]` is on.
    otlp: Option<crate::otlp::Outbox>,
}

/// What the interval loop updates.
pub(super) struct LoopStatus {
    /// Intervals run.
    pub(super) intervals: u64,
    /// Intervals whose probes could not be read.
    pub(super) interval_errors: u64,
    /// The last interval's quantiles per (service, probe).
    pub(super) latency: Vec<LatencyRow>,
    /// Incidents open now.
    pub(super) open_incidents: Vec<OpenIncident>,
    /// The kernel's event counters.
    pub(super) kernel_counters: KernelCounters,
    /// In-kernel capture.
    pub(super) capture: CaptureReport,
    /// The BPF programs' cost, read now and then.
    pub(super) bpf_cost: Vec<ProgCost>,
    /// How long the last interval's work took, ns (set by whoever runs the loop: the loop
    /// itself only sees the times it is given).
    pub(super) last_interval_ns: u64,
    /// The longest of the last 10 s from a scheduled tick to the end of its work, ns.
    pub(super) worst_interval_ns: u64,
    /// The longest of the last 10 s from a scheduled tick to the start of its work, ns.
    pub(super) worst_wakeup_ns: u64,
    /// Incidents opened since start by (service, stage verdict at opening).
    opened: BTreeMap<(String, String), u64>,
    /// Incidents closed since start by (service, cause verdict).
    causes: BTreeMap<(String, String), u64>,
    /// Small shifts noticed since start, per service: how many and the latest.
    notices: BTreeMap<String, (u64, NoticeRow)>,
    /// pwru sessions ended since start by final state.
    pwru_sessions: BTreeMap<String, u64>,
    /// Intervals of history the storage writer dropped while behind.
    pub(super) dropped_history_intervals: u64,
    /// Samples the sample writer dropped while behind.
    pub(super) dropped_samples: u64,
    /// Hardware RX stamping per interface.
    pub(super) nic_stamps: Vec<NicStampRow>,
    /// driver-to-completion per device in the last interval.
    pub(super) device_latency: Vec<DeviceLatencyRow>,
}

impl Default for LoopStatus {
    fn default() -> Self {
        LoopStatus {
            intervals: 0,
            interval_errors: 0,
            latency: Vec::new(),
            open_incidents: Vec::new(),
            kernel_counters: KernelCounters::default(),
            capture: CaptureReport {
                available: false,
                state: "starting".into(),
                armed: Vec::new(),
                flight_samples: 0,
                counters: Default::default(),
                reader_wait: String::new(),
            },
            bpf_cost: Vec::new(),
            last_interval_ns: 0,
            worst_interval_ns: 0,
            worst_wakeup_ns: 0,
            opened: BTreeMap::new(),
            causes: BTreeMap::new(),
            notices: BTreeMap::new(),
            pwru_sessions: BTreeMap::new(),
            dropped_history_intervals: 0,
            dropped_samples: 0,
            nic_stamps: Vec::new(),
            device_latency: Vec::new(),
        }
    }
}

impl LoopStatus {
    /// An incident of `service` opened, with this stage verdict (`unknown` without one).
    pub(super) fn count_opened(&mut self, service: &str, stage: Option<String>) {
        let stage = stage.unwrap_or_else(|| "unknown".into());
        *self.opened.entry((service.to_owned(), stage)).or_default() += 1;
    }

    /// A small shift of `service` was noticed (not an incident).
    pub(super) fn count_notice(&mut self, latest: NoticeRow) {
        let entry = self
            .notices
            .entry(latest.service.clone())
            .or_insert_with(|| (0, latest.clone()));
        entry.0 += 1;
        entry.1 = latest;
    }

    /// An incident of `service` closed with this cause verdict.
    pub(super) fn count_cause(&mut self, service: &str, cause: &str) {
        *self
            .causes
            .entry((service.to_owned(), cause.to_owned()))
            .or_default() += 1;
    }

    /// A pwru session ended in `state`.
    pub(super) fn pwru_finished(&mut self, state: &str) {
        *self.pwru_sessions.entry(state.to_owned()).or_default() += 1;
    }

    /// The programs' run-time statistics.
    pub(super) fn set_prog_stats(&mut self, stats: Vec<bpf::ProgStats>) {
        self.bpf_cost = stats
            .into_iter()
            .map(|s| ProgCost {
                program: s.program,
                attach_point: s.attach_point,
                probes: s.probes,
                run_cnt: s.run_cnt,
                run_time_ns: s.run_time_ns,
            })
            .collect();
    }
}

impl Live {
    /// `pwru`: the start-up check, whether it is overridden, and the session manager.
    /// `started`: when the process started (CPU use is averaged from there).
    pub(super) fn new(
        config: &Config,
        probes: &ProbeSet,
        pwru: (Prerequisites, bool, SessionManager),
        started: SystemTime,
    ) -> Live {
        let mut live = Live {
            daemon: DaemonInfo {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                pid: std::process::id(),
                started_ns: model::unix_ns(started),
                interval: config.daemon.interval,
                config: config.origin.clone(),
                db: config.daemon.db.clone(),
                socket: config.api.socket.clone(),
                intervals: 0,
                interval_errors: 0,
                last_reload: None,
                last_interval_ns: 0,
                worst_interval_ns: 0,
                worst_wakeup_ns: 0,
                metrics_listen: None,
            },
            started,
            probes: Vec::new(),
            missing_features: Vec::new(),
            services: Vec::new(),
            pwru,
            pwru_enabled: config.pwru.enabled(),
            store_budget: config.storage.max_bytes,
            otlp: None,
        };
        live.set_probes(config, probes);
        live
    }

    /// After a (re)load of the probes.
    pub(super) fn set_probes(&mut self, config: &Config, probes: &ProbeSet) {
        self.missing_features = probes
            .missing_features()
            .iter()
            .map(MissingFeatureRow::from)
            .collect();
        self.probes = probes
            .attachments()
            .iter()
            .map(|a| ProbeRow {
                probe: a.probe,
                method: a.method.to_string(),
                refused: a.refused.clone(),
            })
            .collect();
        self.services = config
            .probes
            .services
            .iter()
            .map(|s| s.name.clone())
            .collect();
    }

    /// Where `GET /metrics` is served (`None`: metrics are off).
    pub(super) fn set_metrics_listen(&mut self, addr: Option<String>) {
        self.daemon.metrics_listen = addr;
    }

    /// The OTLP export whose figures the report shows.
    pub(super) fn set_otlp(&mut self, outbox: crate::otlp::Outbox) {
        self.otlp = Some(outbox);
    }

    pub(super) fn set_reload(&mut self, outcome: ReloadOutcome) {
        self.daemon.last_reload = Some(outcome);
    }

    /// The full report with the loop's status and the process's and the store's figures.
    fn report(
        &self,
        status: &LoopStatus,
        store: StoreStats,
        process: ProcessStats,
    ) -> StatusReport {
        let mut daemon = self.daemon.clone();
        daemon.intervals = status.intervals;
        daemon.interval_errors = status.interval_errors;
        daemon.last_interval_ns = status.last_interval_ns;
        daemon.worst_interval_ns = status.worst_interval_ns;
        daemon.worst_wakeup_ns = status.worst_wakeup_ns;
        let (prereq, ignored, manager) = &self.pwru;
        let pwru = PwruReport {
            enabled: self.pwru_enabled,
            prerequisites: prereq.clone(),
            prerequisites_ignored: *ignored,
            busy: manager.is_busy(),
            sessions: status.pwru_sessions.clone(),
        };
        StatusReport {
            daemon,
            probes: self.probes.clone(),
            missing_kernel_features: self.missing_features.clone(),
            services: self.services.clone(),
            latency: status.latency.clone(),
            open_incidents: status.open_incidents.clone(),
            capture: status.capture.clone(),
            kernel_counters: status.kernel_counters,
            pwru,
            bpf_cost: status.bpf_cost.clone(),
            process,
            store: StoreReport {
                max_bytes: self.store_budget,
                dropped_history_intervals: status.dropped_history_intervals,
                dropped_samples: status.dropped_samples,
                ..StoreReport::from(store)
            },
            incidents_opened: status
                .opened
                .iter()
                .map(|((service, stage), &count)| OpenedCount {
                    service: service.clone(),
                    stage: stage.clone(),
                    count,
                })
                .collect(),
            incident_causes: status
                .causes
                .iter()
                .map(|((service, cause), &count)| CauseCount {
                    service: service.clone(),
                    cause: cause.clone(),
                    count,
                })
                .collect(),
            notices: status
                .notices
                .values()
                .map(|(count, latest)| NoticeCount {
                    count: *count,
                    latest: latest.clone(),
                })
                .collect(),
            otlp: self.otlp.as_ref().map(crate::otlp::Outbox::report),
            nic_stamps: status.nic_stamps.clone(),
            device_latency: status.device_latency.clone(),
        }
    }
}

/// The status report, the process's and the store's figures read now. They are read before
/// either lock is taken: an API thread (nice 10) reading the disk while it held the loop's
/// status lock kept the interval loop waiting for as long as busy clients kept that thread
/// off the CPU.
pub(super) fn status_report(
    live: &Mutex<Live>,
    status: &Mutex<LoopStatus>,
    store: &Store,
) -> StatusReport {
    let store = store.stats();
    let started = lock(live).started;
    let process = process_stats(started);
    let live = lock(live);
    let status = lock(status);
    live.report(&status, store, process)
}

/// CPU time (getrusage) and resident memory (/proc/self/statm) of this process.
fn process_stats(started: SystemTime) -> ProcessStats {
    use nix::sys::resource::{getrusage, UsageWho};
    let (user, system) = match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            (secs(u.user_time()), secs(u.system_time()))
        }
        Err(_) => (0.0, 0.0),
    };
    let wall = started.elapsed().map_or(0.0, |d| d.as_secs_f64());
    let heap = crate::allocator::heap_figures();
    ProcessStats {
        cpu_user_s: user,
        cpu_system_s: system,
        cpu_percent: if wall > 0.0 {
            100.0 * (user + system) / wall
        } else {
            0.0
        },
        rss_bytes: rss_bytes().unwrap_or(0),
        heap_arena_bytes: heap.map(|h| h.arena_in_use),
        heap_mapped_bytes: heap.map(|h| h.mapped_in_use),
        heap_thread_caches_off: crate::allocator::thread_caches_off(),
    }
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
