//! `tailtrap run`: the daemon. Every interval it reads the probes' histograms, stores their
//! history, feeds the detector and acts on its events: an opened incident is stored with
//! its evidence and gets a pwru session; a closed one is closed in the store. It serves the
//! local API meanwhile, and answers SIGTERM/SIGINT (clean stop) and SIGHUP (reload).

mod incidents;
mod inkernel;
mod live;
mod pwru;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use bpf::ProbeSet;
use capture::pwru::{Prerequisites, SessionManager};
use detector::{Detector, Event};
use model::{Histogram, Probe};
use sd_notify::NotifyState;
use storage::Store;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::api::server::{self, AppState};
use crate::api::{CaptureReport, KernelCounters, LatencyRow, ReloadOutcome};
use crate::config::{self, Config};
use incidents::Incidents;
pub(crate) use incidents::{headline, quantile_name};
use inkernel::Capture;
use live::Live;

/// How many intervals between two reads of the BPF programs' run-time statistics (the read
/// walks every BPF program on the host).
const PROG_STATS_EVERY: u64 = 10;
/// How many intervals between two updates of the flight recorder's thresholds from the
/// baselines (each is a map write per service and probe).
const FLIGHT_UPDATE_EVERY: u64 = 10;
/// How long start-up waits for another process (a CLI reading the database) to let go of
/// the database lock.
const STORE_LOCK_WAIT: Duration = Duration::from_secs(10);
/// How long shutdown waits for a running pwru session to be reaped after asking it to stop
/// (on top of its kill grace).
const PWRU_STOP_SLACK: Duration = Duration::from_secs(5);

/// Run the daemon until SIGTERM or SIGINT.
pub fn run(config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let started = SystemTime::now();
    let config = config::load(config_path.as_deref())?;
    // Reloads read the file the daemon started from and require it: without this, a
    // default file deleted after start would reload as the embedded defaults, silently
    // dropping every service.
    let config_path = config_path.or_else(|| {
        let default = Path::new(config::DEFAULT_PATH);
        default.exists().then(|| default.to_path_buf())
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name("tailtrap-worker")
        .build()
        .context("starting the async runtime")?;
    // The probe set is not Send: the interval loop runs on this thread, the API and pwru
    // sessions on the workers.
    runtime.block_on(async {
        // Before anything slow: a signal during start-up must not kill the process
        // unhandled; it is acted on once the loop runs.
        let signals = Signals::install()?;
        Daemon::start(config, config_path, started)
            .await?
            .run(signals)
            .await
    })
}

/// The signals the daemon answers.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }
}

/// Everything the interval loop owns.
struct Daemon {
    config: Config,
    config_path: Option<PathBuf>,
    probes: ProbeSet,
    /// In-kernel capture, when it could be set up (else why not).
    capture: Result<Capture, String>,
    /// Service slots by name, for arming (slots never change while a probe set lives).
    slots: HashMap<String, u32>,
    /// Keys whose flight-recorder threshold is set.
    flight_set: std::collections::HashSet<(String, Probe)>,
    detector: Detector,
    store: Arc<Store>,
    live: Arc<Mutex<Live>>,
    /// Cumulative histograms of the previous interval, for deltas.
    prev: HashMap<(String, Probe), Histogram>,
    incidents: Incidents,
    /// Ends of pwru sessions, for the incidents' records.
    pwru_done: mpsc::Receiver<pwru::Finished>,
    /// Services whose history could not be stored, warned about once.
    history_warned: Vec<String>,
    last_baseline_save: Instant,
    last_retention: Instant,
    intervals: u64,
}

impl Daemon {
    /// Open the store, load the probes, restore baselines and check pwru; nothing is
    /// served yet.
    async fn start(
        config: Config,
        config_path: Option<PathBuf>,
        started: SystemTime,
    ) -> anyhow::Result<Daemon> {
        tracing::info!(config = %config.origin, db = %config.daemon.db.display(), "starting");
        let store = open_store(&config).await?;
        let report = store.open_report();
        if let Some(aside) = &report.moved_aside {
            tracing::warn!(moved_to = %aside.display(), "the database was damaged: moved aside, started a fresh one");
        }
        let store = Arc::new(store);
        let mut probes = load_probes(&config.probes)?;
        let capture = start_capture(&mut probes, &config);
        let mut detector = Detector::new(config.detector.clone());
        let mut restored = 0usize;
        for (service, probe, bytes) in store.baselines().context("reading saved baselines")? {
            match detector.restore_baseline(&service, probe, &bytes) {
                Ok(()) => restored += 1,
                Err(e) => {
                    tracing::warn!(%service, %probe, error = %e, "saved baseline not usable; learning anew")
                }
            }
        }
        tracing::info!(baselines = restored, "baselines restored");
        let prereq = Prerequisites::check(config.pwru.binary()).await;
        let ignore = config.daemon.pwru_ignore_prerequisites;
        let manager = match (&prereq.binary, ignore) {
            (Some(binary), true) => {
                SessionManager::new(binary.clone(), config.pwru.manager_config())
            }
            _ => SessionManager::from_prerequisites(&prereq, config.pwru.manager_config()),
        };
        tracing::info!(
            status = %prereq.status,
            ignored = ignore,
            summary = %prereq.summary,
            "pwru prerequisites"
        );
        let (pwru_done_tx, pwru_done) = mpsc::channel(16);
        let incidents = Incidents::new(store.clone(), manager.clone(), pwru_done_tx);
        let live = Arc::new(Mutex::new(Live::new(
            &config,
            &probes,
            (prereq, ignore, manager),
            started,
        )));
        let now = Instant::now();
        Ok(Daemon {
            incidents,
            pwru_done,
            config,
            config_path,
            probes,
            capture,
            slots: HashMap::new(),
            flight_set: Default::default(),
            detector,
            store,
            live,
            prev: HashMap::new(),
            history_warned: Vec::new(),
            last_baseline_save: now,
            last_retention: now,
            intervals: 0,
        })
    }

    async fn run(mut self, mut signals: Signals) -> anyhow::Result<()> {
        let socket = server::bind(&self.config.api.socket).await?;
        let state = Arc::new(AppState {
            store: self.store.clone(),
            status: Box::new({
                let live = self.live.clone();
                let store = self.store.clone();
                move || lock(&live).report(&store)
            }),
        });
        let api = tokio::spawn(server::serve(socket, state));
        tracing::info!(socket = %self.config.api.socket.display(), "API listening");

        let mut ticker = tokio::time::interval(self.config.daemon.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate
        let mut last_tick = SystemTime::now();
        notify(&[NotifyState::Ready]);
        tracing::info!(interval = %humantime::format_duration(self.config.daemon.interval), "ready");

        let why = loop {
            tokio::select! {
                _ = ticker.tick() => {
                    let now = SystemTime::now();
                    self.interval(last_tick, now);
                    last_tick = now;
                    notify(&[NotifyState::Watchdog]);
                }
                Some(done) = self.pwru_done.recv() => self.incidents.pwru_finished(done),
                _ = signals.hup.recv() => {
                    notify(&[NotifyState::Reloading]);
                    self.reload();
                    notify(&[NotifyState::Ready]);
                }
                _ = signals.term.recv() => break "SIGTERM",
                _ = signals.int.recv() => break "SIGINT",
            }
        };
        tracing::info!(signal = why, "stopping");
        notify(&[NotifyState::Stopping]);
        self.incidents
            .stop_pwru(
                &mut self.pwru_done,
                self.config.pwru.limits().kill_grace() + PWRU_STOP_SLACK,
            )
            .await;
        self.disarm_all("the daemon is stopping");
        self.incidents.interrupt_open(unix_ns(SystemTime::now()));
        self.save_baselines();
        if let Err(e) = self.store.flush() {
            tracing::error!(error = %e, "final flush failed");
        }
        api.abort();
        // The socket file goes with the aborted server task; the probes detach on drop.
        let _ = api.await;
        drop(self.probes);
        tracing::info!("stopped");
        Ok(())
    }

    /// One interval: histograms -> deltas -> history and detector -> incident events.
    fn interval(&mut self, start: SystemTime, end: SystemTime) {
        self.intervals += 1;
        let snapshot = match self
            .probes
            .refresh_clock()
            .and_then(|()| self.probes.snapshot())
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "reading the probes failed");
                lock(&self.live).interval_errors += 1;
                return;
            }
        };
        let start_ns = unix_ns(start);
        let mut rows = Vec::new();
        for sh in &snapshot.hists {
            let key = (sh.service.clone(), sh.probe);
            let delta = match self.prev.get(&key) {
                Some(p) => sh.hist.delta_since(p).hist,
                None => sh.hist.clone(),
            };
            self.prev.insert(key, sh.hist.clone());
            if delta.is_empty() {
                continue;
            }
            if let Err(e) = self
                .store
                .record_history(&sh.service, sh.probe, start_ns, &delta)
            {
                if !self.history_warned.contains(&sh.service) {
                    tracing::warn!(service = %sh.service, error = %e, "history not stored for this service");
                    self.history_warned.push(sh.service.clone());
                }
            }
            self.detector.observe(end, &sh.service, sh.probe, &delta);
            rows.push((sh.service.clone(), sh.probe, delta));
        }
        let events = self.detector.end_interval(end);
        let latency = rows
            .iter()
            .map(|(service, probe, h)| {
                let base = |q| {
                    self.detector
                        .baseline_quantile(service, *probe, q)
                        .map(|e| e.value_ns)
                };
                LatencyRow {
                    service: service.clone(),
                    probe: *probe,
                    count: h.count(),
                    p50_ns: h.quantile(0.5).map(|e| e.value_ns),
                    p99_ns: h.quantile(0.99).map(|e| e.value_ns),
                    baseline_p50_ns: base(0.5),
                    baseline_p99_ns: base(0.99),
                }
            })
            .collect();
        let drained = match &mut self.capture {
            Ok(c) => Some(c.drain(&self.config.capture)),
            Err(_) => None,
        };
        for event in events {
            match event {
                Event::Opened(inc) => self.opened(inc),
                Event::Closed(inc) => {
                    let id = self
                        .incidents
                        .open_summaries()
                        .into_iter()
                        .find(|o| o.service == inc.service)
                        .map(|o| o.id);
                    if let Some(slot) = id.and_then(|id| self.capture.as_ref().ok()?.slot_of(id)) {
                        self.finish_capture(slot, "the incident closed");
                    }
                    self.incidents.handle(Event::Closed(inc));
                }
                other => self.incidents.handle(other),
            }
        }
        if let Some(d) = drained {
            self.store_samples(&d.samples, false);
            for (slot, why) in d.over {
                self.finish_capture(slot, &why);
            }
        }
        self.update_flight_thresholds(&rows, self.intervals % FLIGHT_UPDATE_EVERY == 0);
        let prog_stats = (self.intervals % PROG_STATS_EVERY == 1).then(|| self.probes.prog_stats());
        {
            let mut live = lock(&self.live);
            live.intervals = self.intervals;
            live.latency = latency;
            live.kernel_counters = KernelCounters::from(snapshot.counters);
            live.open_incidents = self.incidents.open_summaries();
            live.capture = capture_report(&self.capture);
            if let Some(stats) = prog_stats {
                live.set_prog_stats(stats);
            }
        }
        if self.last_baseline_save.elapsed() >= self.config.daemon.baseline_save_every {
            self.save_baselines();
        }
        if self.last_retention.elapsed() >= self.config.daemon.retention_every {
            self.last_retention = Instant::now();
            self.enforce_retention();
        }
    }

    /// An incident opened: store it, arm capture for its hot probes, store the flight
    /// recorder's samples as pre-trigger, and start pwru on the flows they show.
    fn opened(&mut self, inc: detector::Incident) {
        let Some(id) = self.incidents.opened(inc.clone()) else {
            return;
        };
        let mut pre = Vec::new();
        let status = match self.arm(id, &inc) {
            Ok((samples, thresholds)) => {
                pre = samples;
                tracing::info!(incident = id, service = %inc.service, thresholds = %thresholds, pre_trigger = pre.len(), "capture armed");
                storage::CaptureStatus {
                    state: storage::CaptureState::Armed,
                    message: format!("armed at {thresholds}"),
                    ..Default::default()
                }
            }
            Err(why) => {
                tracing::warn!(incident = id, service = %inc.service, reason = %why, "capture not armed");
                storage::CaptureStatus {
                    state: storage::CaptureState::NotArmed,
                    message: why,
                    ..Default::default()
                }
            }
        };
        self.incidents.update(id, |r| r.capture = status);
        self.store_samples(&pre, true);
        let flows: Vec<model::Flow> = pre.iter().map(|s| s.flow).collect();
        self.incidents
            .start_pwru(&inc.service, &flows, &self.config);
    }

    /// Arm the incident's hot probes; the pre-trigger samples and the thresholds as text.
    fn arm(
        &mut self,
        id: u64,
        inc: &detector::Incident,
    ) -> Result<(Vec<model::Sample>, String), String> {
        let cfg = &self.config.capture;
        let Ok(capture) = &mut self.capture else {
            return Err(match &self.capture {
                Err(why) => why.clone(),
                Ok(_) => String::new(),
            });
        };
        let slot = service_slot(&mut self.probes, &mut self.slots, &inc.service)
            .ok_or_else(|| format!("service {:?} has no slot in the probes", inc.service))?;
        let thresholds: Vec<(Probe, u64)> = inc
            .probes
            .iter()
            .filter_map(|&p| {
                Capture::threshold_ns(cfg.threshold, &self.detector, &inc.service, p)
                    .map(|ns| (p, ns))
            })
            .collect();
        if thresholds.is_empty() {
            return Err(format!(
                "no threshold: the hot probes' baselines give no {}",
                cfg.threshold
            ));
        }
        let text = thresholds
            .iter()
            .map(|(p, ns)| format!("{p} ≥ {}", crate::output::fmt_ns(*ns as f64)))
            .collect::<Vec<_>>()
            .join(", ");
        let pre = capture
            .arm(&mut self.probes, slot, id, &inc.service, &thresholds)
            .map_err(|e| format!("arming failed: {e}"))?;
        Ok((pre, text))
    }

    /// Disarm a slot and record why with its incident.
    fn finish_capture(&mut self, slot: u32, why: &str) {
        let Ok(capture) = &mut self.capture else {
            return;
        };
        match capture.disarm(&mut self.probes, slot) {
            Ok(Some((armed, delta))) => {
                let incident = armed.capture.incident();
                tracing::info!(incident, service = %armed.service, samples = armed.capture.samples(), reason = why, "capture disarmed");
                self.incidents.update(incident, |r| {
                    r.capture.state = storage::CaptureState::Disarmed;
                    r.capture.emitted = delta.emitted;
                    r.capture.dropped = delta.ring_full;
                    r.capture.rate_limited = delta.rate_limited;
                    r.capture.message = format!("disarmed: {why}");
                });
            }
            Ok(None) => {}
            Err(e) => tracing::error!(slot, error = %e, "disarming capture failed"),
        }
    }

    fn disarm_all(&mut self, why: &str) {
        let slots: Vec<u32> = match &self.capture {
            Ok(c) => c.armed().map(|(s, _)| *s).collect(),
            Err(_) => Vec::new(),
        };
        for slot in slots {
            self.finish_capture(slot, why);
        }
    }

    /// Store samples and count them with their incidents.
    fn store_samples(&mut self, samples: &[model::Sample], pre_trigger: bool) {
        if samples.is_empty() {
            return;
        }
        let mut per: HashMap<u64, u64> = HashMap::new();
        for s in samples {
            *per.entry(s.incident).or_default() += 1;
        }
        let result = self.store.put_samples(samples);
        if let Err(e) = &result {
            tracing::warn!(samples = samples.len(), error = %e, "samples not stored");
        }
        for (id, n) in per {
            let ok = result.is_ok();
            self.incidents.update(id, |r| {
                if ok {
                    r.capture.stored += n;
                    if pre_trigger {
                        r.capture.pre_trigger += n;
                    }
                } else {
                    r.counters.store_errors += n;
                }
            });
        }
    }

    /// The flight recorder follows each service's baseline at every probe seen: a key gets
    /// its threshold as soon as its baseline is warm, and all are refreshed when `refresh`.
    fn update_flight_thresholds(&mut self, rows: &[(String, Probe, Histogram)], refresh: bool) {
        let Ok(capture) = &mut self.capture else {
            return;
        };
        for (service, probe, _) in rows {
            let key = (service.clone(), *probe);
            if !refresh && self.flight_set.contains(&key) {
                continue;
            }
            let Some(slot) = service_slot(&mut self.probes, &mut self.slots, service) else {
                continue;
            };
            if let Some(ns) = Capture::threshold_ns(
                self.config.capture.flight_threshold,
                &self.detector,
                service,
                *probe,
            ) {
                match capture.set_flight(&mut self.probes, slot, &[(*probe, ns)]) {
                    Ok(()) => {
                        self.flight_set.insert(key);
                    }
                    Err(e) => {
                        tracing::warn!(%service, %probe, error = %e, "flight recorder threshold not set")
                    }
                }
            }
        }
    }

    fn save_baselines(&mut self) {
        self.last_baseline_save = Instant::now();
        let mut failed = 0usize;
        let baselines = self.detector.save_baselines();
        for (service, probe, bytes) in &baselines {
            if self.store.put_baseline(service, *probe, bytes).is_err() {
                failed += 1;
            }
        }
        if failed > 0 {
            tracing::warn!(
                failed,
                total = baselines.len(),
                "some baselines could not be saved"
            );
        } else {
            tracing::debug!(saved = baselines.len(), "baselines saved");
        }
    }

    fn enforce_retention(&self) {
        match self.store.enforce_retention(unix_ns(SystemTime::now())) {
            Ok(r) if r.incidents + r.samples + r.pwru + r.history_points > 0 => tracing::info!(
                incidents = r.incidents,
                samples = r.samples,
                pwru = r.pwru,
                history_points = r.history_points,
                "retention removed old records"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "retention failed"),
        }
        match self.store.maybe_rotate() {
            Ok(Some(r)) => tracing::info!(
                size_before = r.size_before,
                size_after = r.size_after,
                "database rotated"
            ),
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "database rotation failed"),
        }
    }

    /// SIGHUP: re-read the file; apply services and detector settings, keeping baselines.
    /// The outcome is logged and shown by `tailtrap status`.
    fn reload(&mut self) {
        let outcome = match self.try_reload() {
            Ok(needs_restart) => {
                if !needs_restart.is_empty() {
                    tracing::warn!(tables = ?needs_restart, "reload: changes to these tables take effect at the next start");
                }
                tracing::info!(
                    services = self.config.probes.services.len(),
                    "reloaded services and detector settings; baselines kept"
                );
                ReloadOutcome {
                    at_ns: unix_ns(SystemTime::now()),
                    applied: true,
                    message: "services and detector settings applied; baselines kept".into(),
                    restart_needed: needs_restart.into_iter().map(str::to_owned).collect(),
                }
            }
            Err(message) => {
                tracing::error!(error = %message, "reload refused; the running configuration stays");
                ReloadOutcome {
                    at_ns: unix_ns(SystemTime::now()),
                    applied: false,
                    message,
                    restart_needed: Vec::new(),
                }
            }
        };
        lock(&self.live).set_reload(outcome);
    }

    /// Apply the configuration file; returns the tables whose changes need a restart, or
    /// why nothing was applied.
    fn try_reload(&mut self) -> Result<Vec<&'static str>, String> {
        let new = config::load(self.config_path.as_deref()).map_err(|e| format!("{e:#}"))?;
        // Restart-only tables keep their running values, also for the capture that
        // starts with new probes.
        let kept = Config {
            storage: self.config.storage.clone(),
            capture: self.config.capture.clone(),
            pwru: self.config.pwru.clone(),
            daemon: self.config.daemon.clone(),
            api: self.config.api.clone(),
            ..new.clone()
        };
        if new.probes != self.config.probes {
            match load_probes(&new.probes) {
                Ok(mut probes) => {
                    self.disarm_all("the probes were reloaded");
                    self.capture = start_capture(&mut probes, &kept);
                    self.slots.clear();
                    self.flight_set.clear();
                    self.probes = probes;
                    // Counts restart from zero in the new maps.
                    self.prev.clear();
                    lock(&self.live).set_probes(&kept, &self.probes);
                }
                Err(e) => {
                    return Err(format!("the new probe settings failed to load: {e:#}"));
                }
            }
        }
        self.detector.reconfigure(new.detector.clone());
        let needs_restart: Vec<&'static str> = [
            ("storage", new.storage != self.config.storage),
            ("capture", new.capture != self.config.capture),
            ("pwru", new.pwru != self.config.pwru),
            ("daemon", new.daemon != self.config.daemon),
            ("api", new.api != self.config.api),
        ]
        .into_iter()
        .filter_map(|(t, changed)| changed.then_some(t))
        .collect();
        self.config = kept;
        Ok(needs_restart)
    }
}

/// Open the database; a CLI reading it directly holds the lock for a moment, so a locked
/// database is retried for a while before giving up.
async fn open_store(config: &Config) -> anyhow::Result<Store> {
    let deadline = Instant::now() + STORE_LOCK_WAIT;
    loop {
        match Store::open(&config.daemon.db, config.storage.clone()) {
            Err(storage::StoreError::Locked { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => {
                return r.with_context(|| {
                    format!("opening the database {}", config.daemon.db.display())
                })
            }
        }
    }
}

fn start_capture(probes: &mut ProbeSet, config: &Config) -> Result<Capture, String> {
    if !config.capture.enabled {
        return Err("in-kernel capture is off ([capture] enabled = false)".into());
    }
    Capture::start(probes, &config.capture).map_err(|e| {
        tracing::warn!(error = %e, "in-kernel capture unavailable");
        format!("in-kernel capture unavailable: {e}")
    })
}

/// A service's slot, remembered once found.
fn service_slot(
    probes: &mut ProbeSet,
    slots: &mut HashMap<String, u32>,
    service: &str,
) -> Option<u32> {
    if let Some(&s) = slots.get(service) {
        return Some(s);
    }
    let slot = probes.service_slot(service).ok().flatten()?;
    slots.insert(service.to_owned(), slot);
    Some(slot)
}

fn capture_report(capture: &Result<Capture, String>) -> CaptureReport {
    match capture {
        Ok(c) => {
            let armed: Vec<String> = c
                .armed()
                .map(|(_, a)| {
                    format!(
                        "{} (incident {}, {} samples)",
                        a.service,
                        a.capture.incident(),
                        a.capture.samples()
                    )
                })
                .collect();
            CaptureReport {
                available: true,
                state: format!(
                    "{}; flight recorder holds {} samples; {} records lost in user space",
                    if armed.is_empty() {
                        "disarmed".to_owned()
                    } else {
                        format!("armed for {}", armed.join(", "))
                    },
                    c.flight_len(),
                    c.overflow()
                ),
            }
        }
        Err(why) => CaptureReport {
            available: false,
            state: why.clone(),
        },
    }
}

fn load_probes(config: &bpf::ProbeConfig) -> anyhow::Result<ProbeSet> {
    let probes = ProbeSet::load(config, &mut |step| tracing::debug!("{step}"))
        .context("cannot start the probes")?;
    for a in probes.attachments() {
        tracing::info!(probe = %a.probe, method = %a.method, "probe");
    }
    Ok(probes)
}

/// Tell systemd, when running under it (no-op otherwise).
fn notify(state: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded data is plain status figures: keep using it after a panic elsewhere.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// ns since the Unix epoch.
pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
