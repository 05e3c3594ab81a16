//! `tailtrap run`: the daemon. Every interval it reads the probes' histograms, stores their
//! history, feeds the detector and acts on its events: an opened incident is stored with
//! its evidence and gets a pwru session; a closed one is closed in the store. It serves the
//! local API meanwhile, and answers SIGTERM/SIGINT (clean stop) and SIGHUP (reload).
//!
//! This module runs the process (runtime, signals, API, systemd); the interval loop itself
//! is [`interval::DaemonCore`], on the kernel behind [`kernel::Kernel`], with capture in
//! [`capture`], incident records in [`incidents`] and pwru sessions in [`pwru`].

mod capture;
mod cause;
mod host_figures;
pub(crate) mod host_wide;
mod incidents;
mod interval;
mod kernel;
mod live;
mod nic_stamps;
pub(crate) use nic_stamps::nic_to_stack_unavailable;
mod pwru;
mod reload;
mod standing;
#[cfg(test)]
mod tests;
mod wakeup;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ::capture::pwru::{Prerequisites, SessionManager};
use anyhow::Context;
use bpf::ProbeSet;
use detector::Detector;
use sd_notify::NotifyState;
use storage::Store;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::api::server::{self, AppState};
use crate::config::{self, Config};
use crate::metrics;
use crate::otlp;
use interval::{DaemonCore, Now};
use kernel::BpfKernel;
use live::Live;
use pwru::{PwruSessions, SessionNews};

/// How long start-up waits for another process (a CLI reading the database) to let go of
/// the database lock.
const STORE_LOCK_WAIT: Duration = Duration::from_secs(10);
/// How long shutdown waits for a running pwru session to be reaped after asking it to stop
/// (on top of its kill grace).
const PWRU_STOP_SLACK: Duration = Duration::from_secs(5);
/// How long shutdown waits for the collector to take the last incident events.
const OTLP_STOP_WAIT: Duration = Duration::from_secs(3);

/// Run the daemon until SIGTERM or SIGINT.
pub fn run(config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let started = SystemTime::now();
    let config = config::load(config_path.as_deref())?;
    // Bound before anything is loaded or served: a bad `metrics.listen` (unparsable is
    // caught by the config, taken here) stops the start with one error naming the key.
    let metrics_listener = metrics::bind(&config.metrics, &config.origin)?;
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
            .run(signals, metrics_listener)
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

/// The running daemon: the interval loop and what serves and reloads it.
struct Daemon {
    core: DaemonCore<BpfKernel, PwruSessions>,
    /// The file reloads read.
    config_path: Option<PathBuf>,
    store: Arc<Store>,
    live: Arc<Mutex<Live>>,
    /// Ends of pwru sessions, for the incidents' records.
    pwru_news: mpsc::Receiver<SessionNews>,
    /// What the metrics listener serves, when `[metrics]` is enabled.
    metrics: Option<Arc<metrics::Shared>>,
    /// Incident events to a collector, when `[otlp]` is enabled.
    otlp: Option<otlp::Exporter>,
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
            tracing::error!(
                db = %config.daemon.db.display(),
                moved_to = %aside.display(),
                "the database was damaged: it was moved aside (nothing deleted) and a \
                 fresh one started. Inspect the old one with `tailtrap db check --db {}`; \
                 docs/operations.md (damaged database) says how to recover",
                aside.display()
            );
        }
        let rebuilt = report.history_rebuilt;
        if rebuilt.points > 0 {
            tracing::info!(
                points = rebuilt.points,
                streams = rebuilt.streams,
                "the last run stopped uncleanly: the coarser history levels were completed \
                 from the finest one"
            );
        }
        let store = Arc::new(store);
        let probes = load_probes(&config.probes)?;
        let detector = restore_baselines(&config, &store)?;
        let prereq = Prerequisites::check(config.pwru.binary()).await;
        let ignore = config.daemon.pwru_ignore_prerequisites;
        let manager = match (&prereq.binary, ignore) {
            (Some(binary), true) => {
                SessionManager::new(binary.clone(), config.pwru.manager_config())
            }
            _ => SessionManager::from_prerequisites(&prereq, config.pwru.manager_config()),
        };
        if !config.pwru.enabled() {
            // Nothing will run: whatever the check found is not the operator's problem.
            tracing::debug!(status = %prereq.status, summary = %prereq.summary, "pwru sessions are off");
        } else if prereq.is_usable() || ignore {
            tracing::info!(
                status = %prereq.status,
                ignored = ignore,
                summary = %prereq.summary,
                "pwru prerequisites"
            );
        } else {
            tracing::warn!(
                status = %prereq.status,
                summary = %prereq.summary,
                fix = prereq.status.fix(),
                "pwru prerequisites not met: no sessions until a later check passes"
            );
        }
        if prereq.is_usable() || ignore {
            pwru::warm_kernel_functions(&config.pwru);
        }
        let (pwru_news_tx, pwru_news) = mpsc::channel(16);
        let live = Arc::new(Mutex::new(Live::new(
            &config,
            &probes,
            (prereq, ignore, manager.clone()),
            started,
        )));
        let pwru = PwruSessions::new(manager, store.clone(), pwru_news_tx);
        let kernel = BpfKernel::new(probes);
        let exporter = if config.otlp.enabled {
            let e = otlp::Exporter::start(&config.otlp).context("starting the OTLP export")?;
            lock(&live).set_otlp(e.outbox());
            Some(e)
        } else {
            None
        };
        let mut core = DaemonCore::new(
            config,
            kernel,
            detector,
            store.clone(),
            pwru,
            Instant::now(),
        );
        if let Some(e) = &exporter {
            core.set_outbox(e.outbox());
        }
        Ok(Daemon {
            core,
            config_path,
            store,
            live,
            pwru_news,
            metrics: None,
            otlp: exporter,
        })
    }

    async fn run(
        mut self,
        mut signals: Signals,
        metrics_listener: Option<std::net::TcpListener>,
    ) -> anyhow::Result<()> {
        let config = self.core.config();
        let socket = server::bind(&config.api.socket).await?;
        let state = Arc::new(AppState {
            store: self.store.clone(),
            status: Box::new({
                let (live, status, store) =
                    (self.live.clone(), self.core.status(), self.store.clone());
                move || live::status_report(&live, &status, &store)
            }),
        });
        let api = server::ApiRuntime::start(socket, state)?;
        tracing::info!(socket = %config.api.socket.display(), "API listening");
        let metrics = metrics_listener.map(|l| self.start_metrics(l));
        let config = self.core.config();

        let mut ticker = tokio::time::interval(config.daemon.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate
        let mut last_tick = SystemTime::now();
        let mut lateness = RecentMax::default();
        let mut wakeups = RecentMax::default();
        let mut watch = wakeup::WakeupWatch::new();
        // sled keeps pages its segment cleaner read in memory, unseen by the store's own
        // counts: the heap tells. From here, so that start-up's own growth (the probes,
        // the detector's baselines) is not taken for the engine's.
        self.store
            .watch_heap(Box::new(crate::allocator::heap_reading));
        notify(&[NotifyState::Ready]);
        tracing::info!(interval = %humantime::format_duration(config.daemon.interval), "ready");

        let why = loop {
            tokio::select! {
                scheduled = ticker.tick() => {
                    let began = Instant::now();
                    let scheduled = scheduled.into_std();
                    // Split before the work, whose own waits are not the wake-up's.
                    let late_wakeup = watch.tick(scheduled, began);
                    let now = Now::read();
                    self.core.interval(last_tick, now);
                    let took = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                    // Late by the wake-up alone (the thread not run, or the loop busy with
                    // something else), and in all, with the interval's own work.
                    let woke = nanos(began.saturating_duration_since(scheduled));
                    let late = nanos(scheduled.elapsed());
                    if let Some(w) = late_wakeup {
                        w.log();
                    }
                    let status = self.core.status();
                    let mut status = lock(&status);
                    status.last_interval_ns = took;
                    status.worst_interval_ns = lateness.push(late);
                    status.worst_wakeup_ns = wakeups.push(woke);
                    drop(status);
                    self.publish_metrics();
                    last_tick = now.wall;
                    notify(&[NotifyState::Watchdog]);
                    watch.idle("the interval before");
                }
                Some(news) = self.pwru_news.recv() => {
                    self.core.pwru_news(news);
                    watch.idle("a pwru session's news");
                }
                _ = signals.hup.recv() => {
                    notify(&[NotifyState::Reloading]);
                    self.reload();
                    notify(&[NotifyState::Ready]);
                    watch.idle("a reload");
                }
                _ = signals.term.recv() => break "SIGTERM",
                _ = signals.int.recv() => break "SIGINT",
            }
        };
        tracing::info!(signal = why, "stopping");
        notify(&[NotifyState::Stopping]);
        self.core.stop_pwru_waiting();
        let wait = self.core.config().pwru.limits().kill_grace() + PWRU_STOP_SLACK;
        self.core.pwru_mut().stop(wait).await;
        while let Ok(news) = self.pwru_news.try_recv() {
            self.core.pwru_news(news);
        }
        self.core.stop(Now::read());
        // The stop's own events (incidents interrupted) get a short chance to leave.
        if let Some(e) = self.otlp.take() {
            e.stop(self.core.config().otlp.timeout.min(OTLP_STOP_WAIT))
                .await;
        }
        if let Some(m) = metrics {
            m.abort();
        }
        // The socket file goes with the aborted server task; the probes detach on drop.
        api.stop().await;
        drop(self.core);
        tracing::info!("stopped");
        Ok(())
    }
}

impl Daemon {
    /// Serve `/metrics` on `listener` from what [`Daemon::publish_metrics`] hands over.
    fn start_metrics(
        &mut self,
        listener: std::net::TcpListener,
    ) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        let addr = listener.local_addr().ok().map(|a| a.to_string());
        tracing::info!(listen = addr.as_deref().unwrap_or("?"), "metrics listening");
        lock(&self.live).set_metrics_listen(addr);
        let shared = Arc::new(metrics::Shared::default());
        self.metrics = Some(shared.clone());
        // Scrapes before the first interval get the start-up figures, not a 503.
        self.publish_metrics();
        tokio::spawn(metrics::serve(listener, shared))
    }

    /// Hand the interval's status report and cumulative histograms (the loop's own map,
    /// shared through an `Arc`, not copied) to the metrics listener; rendering waits for
    /// a scrape.
    fn publish_metrics(&self) {
        let Some(shared) = &self.metrics else {
            return;
        };
        let report = live::status_report(&self.live, &self.core.status(), &self.store);
        shared.publish(metrics::Data {
            report,
            hists: self.core.cumulative(),
            devices: self.core.device_cumulative(),
        });
    }
}

/// A detector with the baselines saved in the store.
fn restore_baselines(config: &Config, store: &Store) -> anyhow::Result<Detector> {
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
    Ok(detector)
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

fn load_probes(config: &bpf::ProbeConfig) -> anyhow::Result<ProbeSet> {
    let config = bpf::ProbeConfig {
        nic_to_stack_unavailable: nic_stamps::nic_to_stack_unavailable(config.hw_rx_timestamps),
        ..config.clone()
    };
    let probes = ProbeSet::load(&config, &mut |step| tracing::debug!("{step}"))
        .context("cannot start the probes")?;
    for m in probes.missing_features() {
        tracing::warn!(
            feature = m.feature,
            since = m.since,
            stand_in = m.stand_in,
            cost = m.cost,
            why = %m.why,
            "kernel feature missing: using a stand-in"
        );
    }
    for a in probes.attachments() {
        match &a.refused {
            Some(why) => {
                tracing::info!(probe = %a.probe, method = %a.method, refused = %why, "probe (fallback)")
            }
            None => tracing::info!(probe = %a.probe, method = %a.method, "probe"),
        }
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

/// The largest value pushed within the last [`RecentMax::WINDOW`]: how late intervals
/// were lately (a bounded queue; one entry per interval).
#[derive(Default)]
struct RecentMax(std::collections::VecDeque<(Instant, u64)>);

impl RecentMax {
    const WINDOW: Duration = Duration::from_secs(10);

    fn push(&mut self, v: u64) -> u64 {
        let now = Instant::now();
        while self
            .0
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > Self::WINDOW)
        {
            self.0.pop_front();
        }
        self.0.push_back((now, v));
        self.0.iter().map(|(_, v)| *v).max().unwrap_or(v)
    }
}
