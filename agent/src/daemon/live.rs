//! What `GET /v1/status` reports: what the daemon set up ([`Live`]) and what the interval
//! loop saw last ([`LoopStatus`]).

use std::time::SystemTime;

use bpf::Attachment;
use capture::pwru::{Prerequisites, SessionManager};
use storage::Store;

use crate::api::{
    CaptureReport, DaemonInfo, KernelCounters, LatencyRow, OpenIncident, ProbeRow, ProcessStats,
    ProgCost, PwruReport, ReloadOutcome, StatusReport, StoreReport,
};
use crate::config::Config;

/// The daemon's set-up as the API shows it.
pub(super) struct Live {
    daemon: DaemonInfo,
    started: SystemTime,
    probes: Vec<ProbeRow>,
    services: Vec<String>,
    pwru: (Prerequisites, bool, SessionManager),
    pwru_enabled: bool,
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
            },
            bpf_cost: Vec::new(),
        }
    }
}

impl LoopStatus {
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
        probes: &[Attachment],
        pwru: (Prerequisites, bool, SessionManager),
        started: SystemTime,
    ) -> Live {
        let mut live = Live {
            daemon: DaemonInfo {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                pid: std::process::id(),
                started_ns: super::unix_ns(started),
                interval: config.daemon.interval,
                config: config.origin.clone(),
                db: config.daemon.db.clone(),
                socket: config.api.socket.clone(),
                intervals: 0,
                interval_errors: 0,
                last_reload: None,
            },
            started,
            probes: Vec::new(),
            services: Vec::new(),
            pwru,
            pwru_enabled: config.pwru.enabled(),
        };
        live.set_probes(config, probes);
        live
    }

    /// After a (re)load of the probes.
    pub(super) fn set_probes(&mut self, config: &Config, probes: &[Attachment]) {
        self.probes = probes
            .iter()
            .map(|a| ProbeRow {
                probe: a.probe,
                method: a.method.to_string(),
            })
            .collect();
        self.services = config
            .probes
            .services
            .iter()
            .map(|s| s.name.clone())
            .collect();
    }

    pub(super) fn set_reload(&mut self, outcome: ReloadOutcome) {
        self.daemon.last_reload = Some(outcome);
    }

    /// The full report with the loop's status, the process's and the store's figures read
    /// now.
    pub(super) fn report(&self, status: &LoopStatus, store: &Store) -> StatusReport {
        let mut daemon = self.daemon.clone();
        daemon.intervals = status.intervals;
        daemon.interval_errors = status.interval_errors;
        let (prereq, ignored, manager) = &self.pwru;
        let pwru = PwruReport {
            enabled: self.pwru_enabled,
            prerequisites: prereq.clone(),
            prerequisites_ignored: *ignored,
            busy: manager.is_busy(),
        };
        StatusReport {
            daemon,
            probes: self.probes.clone(),
            services: self.services.clone(),
            latency: status.latency.clone(),
            open_incidents: status.open_incidents.clone(),
            capture: status.capture.clone(),
            kernel_counters: status.kernel_counters,
            pwru,
            bpf_cost: status.bpf_cost.clone(),
            process: process_stats(self.started),
            store: StoreReport::from(store.stats()),
        }
    }
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
    ProcessStats {
        cpu_user_s: user,
        cpu_system_s: system,
        cpu_percent: if wall > 0.0 {
            100.0 * (user + system) / wall
        } else {
            0.0
        },
        rss_bytes: rss_bytes().unwrap_or(0),
    }
}

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
