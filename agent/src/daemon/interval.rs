//! The interval loop without its runtime: histograms → deltas → history and detector →
//! incident records, capture and pwru requests, status. Time comes in as arguments and the
//! kernel and pwru sit behind traits, so the loop runs in tests on scripted data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use capture::pwru::{IncidentScope, SessionRequest};
use detector::{Detector, Event};
use model::Sample;
use model::{Histogram, Probe};
use storage::{CaptureState, CaptureStatus, PwruState, PwruStatus, Store};

use super::capture::CaptureController;
use super::cause::Causes;
use super::host_wide::{self, HostWide};
use super::incidents::Incidents;
use super::kernel::Kernel;
use super::live::LoopStatus;
use super::lock;
use super::nic_stamps::NicStamps;
use super::pwru::{self, Finished, PwruStarter, QueueVerdict, SessionNews, SessionQueue};
use super::standing::Standing;
use super::writer::{SamplesWritten, Writer};
use crate::api::{DeviceLatencyRow, KernelCounters, LatencyRow, NoticeRow};
use crate::config::Config;
use crate::metrics::Cumulative;
use model::unix_ns;

/// How many intervals between two reads of the BPF programs' run-time statistics (the read
/// walks every BPF program on the host).
const PROG_STATS_EVERY: u64 = 10;

/// An interval taking longer than this is logged with the time of each of its phases, so
/// an operator (or the soak) sees whether the kernel read, storage or the detector held it.
const SLOW_INTERVAL: Duration = Duration::from_millis(100);

/// Where one interval spent its time: a handful of named marks, checked at the end.
struct Phases {
    began: Instant,
    last: Instant,
    marks: [(&'static str, Duration); 10],
    len: usize,
}

impl Phases {
    fn start() -> Phases {
        let now = Instant::now();
        Phases {
            began: now,
            last: now,
            marks: [("", Duration::ZERO); 10],
            len: 0,
        }
    }

    /// The phase called `name` ended now.
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        if let Some(slot) = self.marks.get_mut(self.len) {
            *slot = (name, now - self.last);
            self.len += 1;
        }
        self.last = now;
    }

    /// Warn with the breakdown when the interval was slow.
    fn warn_if_slow(&self, interval: u64) {
        let total = self.last - self.began;
        if total < SLOW_INTERVAL {
            return;
        }
        let phases = self.marks[..self.len]
            .iter()
            .filter(|(_, d)| *d >= Duration::from_millis(1))
            .map(|(name, d)| format!("{name} {} ms", d.as_millis()))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            interval,
            took_ms = total.as_millis() as u64,
            phases = %phases,
            "slow interval"
        );
    }
}

/// The moment an interval ends, on both clocks: the wall clock for records, the monotonic
/// one for spans.
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    /// Wall-clock time.
    pub(super) wall: SystemTime,
    /// Monotonic time.
    pub(super) mono: Instant,
}

impl Now {
    /// Now, read from the clocks.
    pub(super) fn read() -> Now {
        Now {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }
}

/// Shortest time between retention passes asked for because the store is over its size
/// budget (a pass that cannot bring it under, everything left being too young, is not
/// repeated every interval).
const OVER_BUDGET_RETENTION_GAP: Duration = Duration::from_secs(30);

/// Everything the interval loop owns.
pub(super) struct DaemonCore<K, P> {
    config: Config,
    kernel: K,
    capture: CaptureController,
    detector: Detector,
    store: Arc<Store>,
    incidents: Incidents,
    pwru: P,
    /// Requests in flight and incidents waiting for the one session slot.
    pwru_queue: SessionQueue,
    deltas: Deltas,
    /// The open incidents' cause verdicts.
    causes: Causes,
    /// Host-wide incidents over the per-service ones.
    host_wide: HostWide,
    status: Arc<Mutex<LoopStatus>>,
    /// History, baselines, retention and rotation, off the loop.
    writer: Writer,
    intervals: u64,
    last_baseline_save: Instant,
    last_retention: Instant,
    /// The sample writer refusing batches (logged when it starts and ends).
    samples_behind: Standing,
    /// Hardware RX stamping per interface and the PTP clocks' offsets.
    nic_stamps: NicStamps,
}

/// Interval histograms from cumulative ones.
#[derive(Default)]
struct Deltas {
    /// Cumulative histograms of the previous interval. Each interval builds a new map from
    /// the snapshot's histograms (moved in, not copied) and swaps it in here, so a reader
    /// holding the `Arc` (the metrics listener) never blocks or copies.
    prev: Arc<Cumulative>,
    /// Retired services (cgroup gone) the detector keeps until their incident closes.
    retiring: Vec<String>,
    /// driver-to-completion per device as of the previous interval, cumulative.
    devices: Arc<Vec<bpf::DeviceHist>>,
    /// Each service's slot in the probes' maps, as its histograms came with it (a slot
    /// changes owner only after its service is retired).
    slots: HashMap<String, u32>,
}

impl<K: Kernel, P: PwruStarter> DaemonCore<K, P> {
    /// A loop on `kernel` (capture is taken over now) with `detector`'s baselines as they
    /// are; `now` starts the baseline-save and retention periods.
    pub(super) fn new(
        config: Config,
        mut kernel: K,
        detector: Detector,
        store: Arc<Store>,
        pwru: P,
        now: Instant,
    ) -> Self {
        let capture = CaptureController::start(&mut kernel, &config.capture);
        let config_hw_rx = config.probes.hw_rx_timestamps;
        let writer = Writer::start(store.clone());
        DaemonCore {
            incidents: Incidents::new(store.clone(), writer.flush_soon(), writer.records()),
            writer,
            config,
            kernel,
            capture,
            detector,
            store,
            pwru,
            pwru_queue: SessionQueue::default(),
            deltas: Deltas::default(),
            causes: Causes::default(),
            host_wide: HostWide::default(),
            status: Arc::new(Mutex::new(LoopStatus::default())),
            intervals: 0,
            last_baseline_save: now,
            last_retention: now,
            samples_behind: Standing::default(),
            nic_stamps: NicStamps::new(config_hw_rx),
        }
    }

    /// The running configuration.
    pub(super) fn config(&self) -> &Config {
        &self.config
    }

    /// What the loop reports, shared with the API.
    pub(super) fn status(&self) -> Arc<Mutex<LoopStatus>> {
        self.status.clone()
    }

    /// The cumulative histograms as of the last interval, shared: a reader keeps its `Arc`
    /// while the loop swaps in the next interval's map.
    pub(super) fn cumulative(&self) -> Arc<Cumulative> {
        self.deltas.prev.clone()
    }

    /// driver-to-completion per device as of the last interval, cumulative.
    pub(super) fn device_cumulative(&self) -> Arc<Vec<bpf::DeviceHist>> {
        self.deltas.devices.clone()
    }

    /// Wait for the storage writer to catch up (tests run intervals back to back).
    #[cfg(test)]
    pub(super) fn sync_storage(&mut self) {
        self.writer.sync();
        self.count_written_samples();
    }

    /// Wait until the incident records changed so far are stored (tests read them from
    /// the store).
    #[cfg(test)]
    pub(super) fn sync_records(&self) {
        self.writer.sync();
    }

    /// Send incident events to the OTLP export from now on.
    pub(super) fn set_outbox(&mut self, outbox: crate::otlp::Outbox) {
        self.incidents.set_outbox(outbox);
    }

    /// The pwru side.
    pub(super) fn pwru_mut(&mut self) -> &mut P {
        &mut self.pwru
    }

    /// One interval from `start` to `now`: histograms → deltas → history and detector →
    /// incident events, capture, status, and the periodic saves.
    pub(super) fn interval(&mut self, start: SystemTime, now: Now) {
        self.intervals += 1;
        let intervals = self.intervals;
        let mut phases = Phases::start();
        let snapshot = match self.kernel.snapshot() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "reading the probes failed");
                lock(&self.status).interval_errors += 1;
                return;
            }
        };
        phases.mark("kernel snapshot");
        let start_ns = unix_ns(start);
        let mut rows = Vec::new();
        let counters = snapshot.counters;
        let retired = snapshot.retired;
        let device_latency = self.deltas.devices(snapshot.devices);
        let mut cumulative = Cumulative::with_capacity(snapshot.hists.len());
        for sh in snapshot.hists {
            // The newest slot of a name: a cgroup recreated under the same path gets a new one.
            match self.deltas.slots.get_mut(&sh.service) {
                Some(slot) => *slot = sh.slot,
                None => {
                    self.deltas.slots.insert(sh.service.clone(), sh.slot);
                }
            }
            let key = (sh.service, sh.probe);
            if let Some(delta) = self.deltas.next(&key, &sh.hist) {
                self.detector.observe(now.wall, &key.0, key.1, &delta);
                rows.push((key.0.clone(), key.1, delta));
            }
            cumulative.insert(key, Arc::new(sh.hist));
        }
        self.deltas.replace(cumulative, &retired);
        phases.mark("deltas");
        let retired_slots: Vec<(String, u32)> = retired
            .iter()
            .filter_map(|s| Some((s.clone(), self.deltas.slots.remove(s)?)))
            .collect();
        self.capture
            .forget_services(&mut self.kernel, &retired_slots);
        let events = self.detector.end_interval(now.wall);
        let gone = retired.clone();
        self.forget_retired(retired, &rows);
        phases.mark("detector");
        let latency = rows
            .iter()
            .map(|(service, probe, h)| self.latency_row(service, *probe, h))
            .collect();
        let drained = self.capture.drain(&mut self.kernel, now.mono, now.wall);
        phases.mark("capture drain");
        self.count_written_samples();
        for event in events {
            match event {
                Event::Opened(inc) => self.opened(inc, now),
                Event::Updated(inc) => self.updated(inc, now),
                Event::Noticed(notice) => self.noticed(notice),
                Event::Closed(inc) => {
                    if let Some(id) = self.incidents.id_of(&inc.key()) {
                        let cause =
                            self.causes
                                .closed(id, &mut self.kernel, &self.deltas.prev, now.mono);
                        if let Some(cause) = cause {
                            self.set_cause(id, &inc.service, cause, now.wall, true);
                        }
                        self.finish_capture(id, "the incident closed");
                        self.stop_waiting(id, "the incident closed before that session ended");
                        let closed_ns = unix_ns(inc.closed_at.unwrap_or(now.wall));
                        if let Some(change) = self.host_wide.closed(id, closed_ns) {
                            self.apply_host_wide(change);
                        }
                    }
                    self.incidents.closed(inc);
                }
            }
        }
        self.causes.samples(&drained.samples, false);
        for (id, cause) in self
            .causes
            .interval(&mut self.kernel, &self.deltas.prev, now.mono)
        {
            let service = self.incidents.service_of(id).unwrap_or_default();
            self.set_cause(id, &service, cause, now.wall, false);
        }
        phases.mark("incident writes and causes");
        self.store_samples(drained.samples, false);
        for (incident, why) in drained.over {
            self.finish_capture(incident, &why);
        }
        phases.mark("samples queued");
        let slots = &self.deltas.slots;
        self.capture.update_flight(
            &mut self.kernel,
            &self.detector,
            rows.iter()
                .filter_map(|(s, p, _)| Some((s.as_str(), *slots.get(s)?, *p))),
            intervals,
        );
        // The writer stores the history, then forgets the services gone (in that order).
        self.writer.history(start_ns, rows);
        self.writer.forget(gone);
        let prog_stats = (intervals % PROG_STATS_EVERY == 1).then(|| self.kernel.prog_stats());
        // Built before taking the lock: it reads a BPF map, and scrapes and status requests
        // wait on that lock.
        let capture = self.capture.report(&mut self.kernel);
        let mut nic_stamps = self.nic_stamps.refresh(now.wall);
        if let Some(rows) = &mut nic_stamps {
            // The offsets were read again (or a device changed): nic-to-stack converts
            // with them from now on, and drops the devices that stopped stamping.
            let timed = match self.kernel.set_nic_clocks(&self.nic_stamps.clocks()) {
                Ok(runs) => runs,
                Err(e) => {
                    tracing::warn!(error = %e, "the NIC clocks could not be handed to the probes");
                    false
                }
            };
            self.nic_stamps.mark_timed(rows, timed);
        }
        {
            let mut status = lock(&self.status);
            status.intervals = intervals;
            status.latency = latency;
            status.kernel_counters = KernelCounters::from(counters);
            status.device_latency = device_latency;
            status.open_incidents = self.incidents.open_summaries();
            self.host_wide.annotate(&mut status.open_incidents);
            status.capture = capture;
            if let Some(rows) = nic_stamps {
                status.nic_stamps = rows;
            }
            status.dropped_history_intervals = self.writer.dropped();
            status.dropped_samples = self.writer.dropped_samples();
            if let Some(stats) = prog_stats {
                status.set_prog_stats(stats);
            }
        }
        phases.mark("flight and status");
        if elapsed(self.last_baseline_save, now.mono) >= self.config.daemon.baseline_save_every {
            self.save_baselines(now.mono);
            phases.mark("baseline save");
        }
        let since_retention = elapsed(self.last_retention, now.mono);
        // Over its size budget the store is trimmed now, not at the next period: a burst
        // of samples into a small budget would otherwise stay over it for up to
        // `retention_every`.
        let over_budget = since_retention >= OVER_BUDGET_RETENTION_GAP && self.store.over_budget();
        if since_retention >= self.config.daemon.retention_every || over_budget {
            self.last_retention = now.mono;
            // Retention and rotation read and rewrite much of the database: on their
            // own thread.
            self.writer.retention(now.wall);
        }
        phases.warn_if_slow(intervals);
    }

    /// Services whose cgroup is gone (their last interval is recorded): the detector
    /// forgets them, or once their open incident has closed. Their history stays stored.
    fn forget_retired(&mut self, retired: Vec<String>, rows: &[(String, Probe, Histogram)]) {
        let retiring = &mut self.deltas.retiring;
        // One still waiting that has data again is a new cgroup under the same name: live.
        retiring.retain(|s| !rows.iter().any(|(r, _, _)| r == s));
        retiring.extend(retired);
        let detector = &mut self.detector;
        retiring.retain(|s| !detector.forget(s));
    }

    fn latency_row(&self, service: &str, probe: Probe, h: &Histogram) -> LatencyRow {
        let base = |q| {
            self.detector
                .baseline_quantile(service, probe, q)
                .map(|e| e.value_ns)
        };
        LatencyRow {
            service: service.to_owned(),
            probe,
            count: h.count(),
            p50_ns: h.quantile(0.5).map(|e| e.value_ns),
            p99_ns: h.quantile(0.99).map(|e| e.value_ns),
            baseline_p50_ns: base(0.5),
            baseline_p99_ns: base(0.99),
            p999_ns: h.quantile(0.999).map(|e| e.value_ns),
            baseline_p999_ns: base(0.999),
        }
    }

    /// A small shift: logged and counted for status and /metrics, nothing armed or stored.
    fn noticed(&mut self, n: detector::Notice) {
        let h = &n.headline;
        let stage = n.stage.as_ref().map(|s| s.verdict.clone());
        tracing::info!(
            service = %n.service,
            probe = h.probe.name(),
            quantile = h.quantile,
            ratio = format!("{:.2}", h.ratio),
            stage = stage.as_deref().unwrap_or("-"),
            "shift noticed: not an incident unless it reaches incident_ratio and incident_delta or lasts notice_for"
        );
        lock(&self.status).count_notice(NoticeRow {
            service: n.service.clone(),
            noticed_ns: unix_ns(n.noticed_at),
            probe: h.probe.name().to_owned(),
            quantile: h.quantile,
            ratio: h.ratio,
            stage,
        });
    }

    /// An open incident's evidence changed: its capture covers its new hot probes, its
    /// verdicts follow its stage.
    fn updated(&mut self, inc: detector::Incident, now: Now) {
        let Some(id) = self.incidents.id_of(&inc.key()) else {
            return;
        };
        match self
            .capture
            .widen(&mut self.kernel, &self.detector, id, &inc)
        {
            Ok(Some(armed)) => {
                let thresholds = armed.thresholds_text();
                tracing::info!(incident = id, service = %inc.service, thresholds = %thresholds, "capture widened");
                self.incidents.update(id, |r| {
                    if r.capture.state == CaptureState::Armed {
                        r.capture.message = format!("armed at {thresholds}");
                    }
                });
            }
            Ok(None) => {}
            Err(why) => {
                tracing::warn!(incident = id, service = %inc.service, reason = %why, "capture not widened");
            }
        }
        self.causes
            .updated(id, &inc, &mut self.kernel, &self.deltas.prev, now.mono);
        self.incidents.updated(inc);
    }

    /// An incident opened: store it, arm capture for its hot probes, store the flight
    /// recorder's samples as pre-trigger, and ask for pwru on the flows they show.
    fn opened(&mut self, inc: detector::Incident, now: Now) {
        let Some(id) = self.incidents.opened(inc.clone()) else {
            return;
        };
        // Counted here rather than from the open list so an incident that opens and
        // closes between two reads of the status still counts; stage as at opening.
        let stage = inc.stage.as_ref().map(|s| s.verdict.clone());
        lock(&self.status).count_opened(&inc.service, stage.clone());
        if let Some(change) = self.host_wide.opened(
            id,
            &inc.service,
            stage.as_deref(),
            &inc.probes,
            unix_ns(inc.opened_at),
            now.mono,
        ) {
            self.apply_host_wide(change);
        }
        let slot = self.deltas.slots.get(&inc.service).copied();
        let armed = self.capture.arm(
            &mut self.kernel,
            &self.detector,
            id,
            &inc,
            slot,
            now.mono,
            now.wall,
        );
        let (status, pre) = match armed {
            Ok(armed) => {
                let thresholds = armed.thresholds_text();
                tracing::info!(incident = id, service = %inc.service, thresholds = %thresholds, pre_trigger = armed.pre_trigger.len(), "capture armed");
                let status = CaptureStatus {
                    state: CaptureState::Armed,
                    message: format!("armed at {thresholds}"),
                    ..Default::default()
                };
                (status, armed.pre_trigger)
            }
            Err(why) => {
                // Capture off or unavailable on this kernel is a standing fact shown in
                // status, not news for every incident.
                if matches!(why, super::capture::ArmError::Unavailable(_)) {
                    tracing::debug!(incident = id, service = %inc.service, reason = %why, "capture not armed");
                } else {
                    tracing::warn!(incident = id, service = %inc.service, reason = %why, "capture not armed");
                }
                let status = CaptureStatus {
                    state: CaptureState::NotArmed,
                    message: why.to_string(),
                    ..Default::default()
                };
                (status, Vec::new())
            }
        };
        self.incidents.update(id, |r| r.capture = status);
        self.causes.opened(
            id,
            &inc,
            slot,
            &mut self.kernel,
            &self.deltas.prev,
            now.mono,
        );
        self.causes.samples(&pre, true);
        let flows: Vec<model::Flow> = pre.iter().map(|s| s.flow).collect();
        self.store_samples(pre, true);
        self.request_pwru(id, &inc, &flows, now.wall);
    }

    /// Store what changed of a host-wide incident.
    fn apply_host_wide(&mut self, change: host_wide::Change) {
        match change {
            host_wide::Change::Open(new) => {
                let stage = serde_json::from_str::<String>(&new.stages_json).ok();
                if let Some(mut record) = self.incidents.open_other(new) {
                    lock(&self.status).count_opened(host_wide::HOST_WIDE, stage);
                    // Its evidence, samples and traces are its members'.
                    let see = "none of its own: see its member incidents";
                    record.capture.message = see.into();
                    record.pwru.message = see.into();
                    self.incidents.write_other(record.clone());
                    self.host_wide.numbered(record);
                }
            }
            host_wide::Change::Write(record) => self.incidents.write_other(*record),
        }
    }

    /// Store incident `id`'s cause verdict; the last one (at closing) is also counted for
    /// `/metrics`.
    fn set_cause(
        &mut self,
        id: u64,
        service: &str,
        cause: detector::diagnosis::Cause,
        now: SystemTime,
        last: bool,
    ) {
        tracing::info!(incident = id, service = %service, cause = %cause.kind, summary = %cause.summary, "cause verdict");
        if last {
            lock(&self.status).count_cause(service, cause.kind.name());
        }
        let figures_json = serde_json::to_string(&cause.figures).unwrap_or_default();
        let stored = storage::IncidentCause {
            kind: cause.kind.name().to_owned(),
            summary: cause.summary,
            figures_json,
            decided_ns: unix_ns(now),
        };
        self.incidents.set_cause(id, stored);
    }

    /// Ask for the incident's pwru session, or record why there is none.
    fn request_pwru(
        &mut self,
        id: u64,
        inc: &detector::Incident,
        flows: &[model::Flow],
        now: SystemTime,
    ) {
        let spec = self
            .config
            .probes
            .services
            .iter()
            .find(|s| s.name == inc.service);
        let cgroup_dir = spec.and_then(|s| s.cgroup.as_deref()).and_then(|c| {
            let rel = c.strip_prefix("/").unwrap_or(c);
            bpf::cgroup2_mount().map(|m| m.join(rel))
        });
        let scope = IncidentScope {
            service: &inc.service,
            probes: &inc.probes,
            ports: spec.map_or(&[], |s| s.ports.as_slice()),
            cgroup_dir: cgroup_dir.as_deref(),
            flows,
        };
        // The session's task checks the functions against the kernel (see
        // `pwru::choose_functions`): reading the kernel's BTF must not hold up the loop.
        match SessionRequest::for_incident(&self.config.pwru, &scope) {
            Ok(request) => {
                let filter = request.filter().expression();
                tracing::debug!(incident = id, %filter, "pwru session requested");
                self.pwru_queue.requested(id, flows);
                self.incidents.update(id, |r| {
                    r.pwru.state = PwruState::Running;
                    r.pwru.started_ns = Some(unix_ns(now));
                    r.pwru.message = format!("requested: {filter}");
                });
                self.pwru.start(id, request);
            }
            Err(e) => self
                .incidents
                .update(id, |r| r.pwru.message = e.to_string()),
        }
    }

    /// News from a pwru session's task.
    pub(super) fn pwru_news(&mut self, news: SessionNews) {
        match news {
            SessionNews::Chosen { incident, summary } => self.pwru_chosen(incident, &summary),
            SessionNews::Finished(done) => self.pwru_finished(*done),
        }
    }

    /// The kernel check chose a session's functions: keep the choice with its incident.
    fn pwru_chosen(&mut self, incident: u64, summary: &str) {
        self.incidents.update(incident, |r| {
            if r.pwru.state == PwruState::Running && !r.pwru.message.contains("; functions") {
                r.pwru.message.push_str("; ");
                r.pwru.message.push_str(summary);
            }
        });
    }

    /// A pwru session ended: record its status with its incident (open or not), or, when
    /// the slot was taken and the incident is open, let it wait; start a waiting one when
    /// this session freed the slot.
    fn pwru_finished(&mut self, done: Finished) {
        let open = self.incidents.open_detail(done.incident).is_some();
        let freed = match self.pwru_queue.finished(&done, open) {
            QueueVerdict::Waits => {
                tracing::info!(
                    incident = done.incident,
                    busy = %done.status.reason,
                    "pwru session waits for the running one to end"
                );
                self.incidents.update(done.incident, |r| {
                    r.pwru.state = PwruState::Running;
                    r.pwru.message = format!(
                        "{}{}; this incident's session starts when it ends, if the incident \
                         is still open",
                        PwruStatus::WAITING,
                        done.status.reason
                    );
                });
                return;
            }
            QueueVerdict::Ended { freed } => freed,
        };
        lock(&self.status).pwru_finished(done.status.state.name());
        let status = pwru::status_of(&done.status, done.stored);
        // Unmet prerequisites are a standing condition, logged by the pwru check itself.
        if done.status.state == capture::pwru::SessionState::Unavailable {
            tracing::debug!(
                incident = done.incident,
                reason = %done.status.reason,
                "pwru session ended"
            );
        } else {
            tracing::info!(
                incident = done.incident,
                state = %done.status.state,
                lines = done.stored,
                reason = %done.status.reason,
                "pwru session ended"
            );
        }
        self.incidents.update(done.incident, |record| {
            // Keep the kernel check's choice of functions (`pwru_chosen`) with the outcome.
            let functions = record
                .pwru
                .message
                .split_once("; functions")
                .map(|(_, f)| f.to_owned());
            record.pwru = status;
            if let Some(f) = functions {
                record.pwru.message.push_str("; functions");
                record.pwru.message.push_str(&f);
            }
            record.counters.store_errors += done.store_errors;
        });
        self.incidents.pwru_ended(done.incident);
        if freed {
            self.start_waiting();
        }
    }

    /// The slot is free: ask for the session of the oldest waiting incident still open.
    fn start_waiting(&mut self) {
        while let Some((id, flows)) = self.pwru_queue.next() {
            // A closing incident leaves the queue (`stop_waiting`); checked all the same.
            if let Some(inc) = self.incidents.open_detail(id).cloned() {
                self.request_pwru(id, &inc, &flows, SystemTime::now());
                return;
            }
        }
    }

    /// `incident` no longer waits for the slot (`why`): it ends as skipped, with the
    /// session that held the slot.
    fn stop_waiting(&mut self, incident: u64, why: &str) {
        if let Some(w) = self.pwru_queue.incident_closed(incident) {
            self.record_not_waiting(w, why);
        }
    }

    fn record_not_waiting(&mut self, w: pwru::Waiting, why: &str) {
        lock(&self.status).pwru_finished(capture::pwru::SessionState::SkippedBusy.name());
        self.incidents.update(w.incident, |r| {
            r.pwru.state = PwruState::NotRun;
            r.pwru.message = format!("skipped-busy: {}; {why}", w.busy);
        });
        self.incidents.pwru_ended(w.incident);
    }

    /// Shutdown, before pwru stops: no incident waits for a session any more.
    pub(super) fn stop_pwru_waiting(&mut self) {
        for w in self.pwru_queue.close() {
            self.record_not_waiting(w, "tailtrap stopped before that session ended");
        }
    }

    /// Disarm the incident's capture and record why with it.
    fn finish_capture(&mut self, incident: u64, why: &str) {
        match self.capture.disarm(&mut self.kernel, incident) {
            Ok(Some(d)) => {
                tracing::info!(incident, service = %d.service, samples = d.samples, reason = why, "capture disarmed");
                self.incidents.update(incident, |r| {
                    r.capture.state = CaptureState::Disarmed;
                    r.capture.emitted = d.counters.emitted;
                    r.capture.dropped = d.counters.ring_full;
                    r.capture.rate_limited = d.counters.rate_limited;
                    r.capture.message = format!("disarmed: {why}");
                });
            }
            Ok(None) => {}
            Err(e) => tracing::error!(incident, error = %e, "disarming capture failed"),
        }
    }

    /// Disarm every armed incident, recording `why`.
    fn disarm_all(&mut self, why: &str) {
        for incident in self.capture.armed_incidents() {
            self.finish_capture(incident, why);
        }
    }

    /// Queue samples for the sample writer; a batch it had no room for is counted as a
    /// store error with its incidents at once.
    fn store_samples(&mut self, samples: Vec<Sample>, pre_trigger: bool) {
        if samples.is_empty() {
            return;
        }
        let n = samples.len();
        if let Some(dropped) = self.writer.samples(samples, pre_trigger) {
            if self.samples_behind.begins() {
                tracing::warn!(samples = n, "the sample writer is behind: samples dropped");
            } else {
                tracing::debug!(samples = n, "the sample writer is behind: samples dropped");
            }
            self.count_samples(dropped);
        } else if self.samples_behind.ends() {
            tracing::info!("the sample writer caught up");
        }
    }

    /// Count the sample batches written since the last interval with their incidents.
    fn count_written_samples(&mut self) {
        for written in self.writer.samples_written() {
            self.count_samples(written);
        }
    }

    fn count_samples(&mut self, w: SamplesWritten) {
        for (id, n) in w.per_incident {
            self.incidents.update(id, |r| {
                if w.stored {
                    r.capture.stored += n;
                    if w.pre_trigger {
                        r.capture.pre_trigger += n;
                    }
                } else {
                    r.counters.store_errors += n;
                }
            });
        }
    }

    /// Hand every baseline to the writer.
    pub(super) fn save_baselines(&mut self, now: Instant) {
        self.last_baseline_save = now;
        self.writer.baselines(self.detector.save_baselines());
    }

    /// New probes (a reload): disarm on the old ones, take capture over on the new ones
    /// under `config`'s capture settings, and count deltas afresh (the new maps start at 0).
    pub(super) fn replace_kernel(&mut self, mut kernel: K, config: &Config) {
        self.disarm_all("the probes were reloaded");
        self.capture = CaptureController::start(&mut kernel, &config.capture);
        self.kernel = kernel;
        self.deltas.prev = Arc::default();
    }

    /// A reload's configuration: the detector's settings apply at once, baselines kept.
    pub(super) fn reconfigure(&mut self, config: Config) {
        self.detector.reconfigure(config.detector.clone());
        self.config = config;
    }

    /// Shutdown, once pwru has stopped: disarm, mark open incidents interrupted, write
    /// what the writer has queued and the baselines, and flush.
    pub(super) fn stop(&mut self, now: Now) {
        self.disarm_all("the daemon is stopping");
        // The last samples' counts belong in the records closed next.
        self.writer.finish_samples();
        self.count_written_samples();
        self.incidents.interrupt_open(unix_ns(now.wall));
        for record in self.host_wide.take_open() {
            self.incidents.interrupt_other(record, unix_ns(now.wall));
        }
        self.last_baseline_save = now.mono;
        self.writer.finish(self.detector.save_baselines());
        let dropped = self.writer.dropped();
        if dropped > 0 {
            tracing::warn!(
                dropped_intervals = dropped,
                "intervals of history were dropped while the storage writer was behind"
            );
        }
        if let Err(e) = self.store.flush() {
            tracing::error!(error = %e, "final flush failed");
        }
    }
}

impl Deltas {
    /// The interval's histogram of a key from its cumulative one; None when the interval
    /// saw nothing. The cumulative one goes to [`Deltas::replace`].
    fn next(&mut self, key: &(String, Probe), cumulative: &Histogram) -> Option<Histogram> {
        let delta = match self.prev.get(key) {
            Some(p) => cumulative.delta_since(p).hist,
            None => cumulative.clone(),
        };
        (!delta.is_empty()).then_some(delta)
    }

    /// The devices' interval rows from their cumulative histograms, which become the
    /// previous ones. A device new to the map (or back after it was deleted) counts from zero.
    fn devices(&mut self, now: Vec<bpf::DeviceHist>) -> Vec<DeviceLatencyRow> {
        let rows = now
            .iter()
            .filter_map(|d| {
                let prev = self
                    .devices
                    .iter()
                    .find(|p| (p.ifindex, p.netns) == (d.ifindex, d.netns));
                let delta = match prev {
                    Some(p) => d.hist.delta_since(&p.hist).hist,
                    None => d.hist.clone(),
                };
                (!delta.is_empty()).then(|| DeviceLatencyRow {
                    device: d.device.clone(),
                    count: delta.count(),
                    p50_ns: delta.quantile(0.5).map(|e| e.value_ns),
                    p99_ns: delta.quantile(0.99).map(|e| e.value_ns),
                    p999_ns: delta.quantile(0.999).map(|e| e.value_ns),
                })
            })
            .collect();
        self.devices = Arc::new(now);
        rows
    }

    /// This interval's cumulative histograms become the previous ones. Keys the snapshot
    /// lacks (unchanged since the last read) keep their last histogram, shared rather
    /// than copied, so a key that moves again counts from there; the `retired` services'
    /// keys go (their slots restart from zero for the next owner).
    fn replace(&mut self, mut next: Cumulative, retired: &[String]) {
        for (key, h) in self.prev.iter() {
            if !next.contains_key(key) {
                next.insert(key.clone(), h.clone());
            }
        }
        if !retired.is_empty() {
            next.retain(|(service, _), _| !retired.contains(service));
        }
        self.prev = Arc::new(next);
    }
}

fn elapsed(since: Instant, now: Instant) -> Duration {
    now.saturating_duration_since(since)
}
