//! Storage work the interval loop hands off so that an interval never waits for the disk:
//! history and baseline writes on one thread, fed in order through a bounded queue, and
//! retention and rotation on another. When the writer falls behind, whole intervals of
//! history are dropped and counted rather than queued without bound.
//!
//! Sample batches go to a thread of their own, so a burst of captured samples never waits
//! behind history; what became of each batch comes back to the loop, which counts it with
//! its incidents (the loop owns the incident records). An incident is opened on the loop
//! (its id is needed at once, before its samples are queued); every later change of its
//! record goes through the sample thread's queue ([`SampleQueue`]), in order with the
//! samples, so the loop never waits on the engine (an engine reopen holds it 11-70 ms).
//! The fsync that makes an opened or closed incident durable runs on a fourth thread,
//! asked for without waiting ([`FlushSoon`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use model::{Histogram, Probe, Sample};
use storage::{HistoryPoint, Store};

use super::standing::Standing;

use model::unix_ns;

/// Intervals of history the writer may be behind (each holds every (service, probe)
/// histogram of one interval: ~1 MiB at 64 services × 7 probes).
const QUEUE: usize = 4;

/// Sample batches the sample thread may be behind: one per interval with capture armed,
/// plus an incident's pre-trigger batch; at the rate limit's 2000 samples/s and a 1 s
/// interval, about a minute of capture.
const SAMPLE_QUEUE: usize = 64;

/// What became of one batch of samples, for the counts kept with its incidents.
pub(super) struct SamplesWritten {
    /// `(incident, samples)` in the batch.
    pub(super) per_incident: Vec<(u64, u64)>,
    /// The incidents' pre-trigger samples (taken from the flight recorder at opening).
    pub(super) pre_trigger: bool,
    /// Stored; otherwise refused by the store or dropped because the thread was behind.
    pub(super) stored: bool,
}

impl SamplesWritten {
    fn of(samples: &[Sample], pre_trigger: bool, stored: bool) -> SamplesWritten {
        let mut per_incident: Vec<(u64, u64)> = Vec::new();
        for s in samples {
            match per_incident.iter_mut().find(|(id, _)| *id == s.incident) {
                Some((_, n)) => *n += 1,
                None => per_incident.push((s.incident, 1)),
            }
        }
        SamplesWritten {
            per_incident,
            pre_trigger,
            stored,
        }
    }
}

enum SampleJob {
    Batch {
        samples: Vec<Sample>,
        pre_trigger: bool,
    },
    /// An incident's record, changed; `durable`: flush soon after (opening, closing);
    /// `new`: first stored now (numbered by the loop, which does not wait on the store).
    Record {
        record: Box<storage::Incident>,
        durable: bool,
        new: bool,
    },
    /// Answered once every earlier batch is written.
    #[cfg(test)]
    Barrier(mpsc::Sender<()>),
}

/// One interval's histograms: `(service, probe, histogram)`.
pub(super) type Rows = Vec<(String, Probe, Histogram)>;

enum Job {
    History {
        start_ns: u64,
        rows: Rows,
    },
    /// Services whose cgroup is gone: write what is buffered for them, then forget them.
    Forget(Vec<String>),
    Baselines(Vec<(String, Probe, Vec<u8>)>),
    /// Answered once every earlier job is done.
    #[cfg(test)]
    Barrier(mpsc::Sender<()>),
}

/// Asks the flush thread to make what was just written durable, without waiting for it.
#[derive(Clone)]
pub(super) struct FlushSoon(Option<SyncSender<()>>);

impl FlushSoon {
    /// Request a flush; one already pending covers this one too (it has not started yet,
    /// so it will see everything written before now).
    pub(super) fn request(&self) {
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(());
        }
    }
}

/// The sample thread's queue: sample batches, and the incidents' changed records behind
/// the samples sent before them. Shared by the writer and the incidents; the writer closes
/// it when the thread stops.
#[derive(Clone)]
pub(super) struct SampleQueue(Arc<Mutex<Option<SyncSender<SampleJob>>>>);

impl SampleQueue {
    /// The thread's sender, none once it stopped.
    fn sender(&self) -> Option<SyncSender<SampleJob>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queue `job` without waiting; handed back when the thread is behind or stopped.
    fn try_send(&self, job: SampleJob) -> Result<(), SampleJob> {
        match self.sender() {
            None => Err(job),
            Some(tx) => tx.try_send(job).map_err(|e| match e {
                TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
            }),
        }
    }

    /// Queue `record` for storing; handed back when it cannot be queued, for the caller to
    /// store itself: a record change is never dropped.
    pub(super) fn record(
        &self,
        record: Box<storage::Incident>,
        durable: bool,
    ) -> Result<(), Box<storage::Incident>> {
        self.send_record(record, durable, false)
    }

    /// Queue a newly numbered incident's first record (stored durably, before any of its
    /// samples, which are queued after it); handed back when the queue is full or closed.
    pub(super) fn new_record(
        &self,
        record: Box<storage::Incident>,
    ) -> Result<(), Box<storage::Incident>> {
        self.send_record(record, true, true)
    }

    fn send_record(
        &self,
        record: Box<storage::Incident>,
        durable: bool,
        new: bool,
    ) -> Result<(), Box<storage::Incident>> {
        match self.try_send(SampleJob::Record {
            record,
            durable,
            new,
        }) {
            Ok(()) => Ok(()),
            Err(SampleJob::Record { record, .. }) => Err(record),
            Err(_) => unreachable!("a record was sent"),
        }
    }

    fn close(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The storage threads and their queues.
pub(super) struct Writer {
    jobs: Option<SyncSender<Job>>,
    retention: Option<SyncSender<SystemTime>>,
    flush: Option<SyncSender<()>>,
    threads: Vec<JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
    samples: SampleQueue,
    sample_thread: Option<JoinHandle<()>>,
    written: Receiver<SamplesWritten>,
    dropped_samples: AtomicU64,
    /// The last baselines were not queued (the writer behind): said once until they are.
    baselines_behind: AtomicBool,
}

impl Writer {
    /// Start the threads on `store`.
    pub(super) fn start(store: Arc<Store>) -> Writer {
        let dropped = Arc::new(AtomicU64::new(0));
        let (jobs, rx) = mpsc::sync_channel(QUEUE);
        // One pending request is enough: a pass covers everything due.
        let (retention, retention_rx) = mpsc::sync_channel(1);
        let mut threads = Vec::new();
        let s = store.clone();
        match std::thread::Builder::new()
            .name("tailtrap-store".into())
            .spawn(move || write_loop(&s, rx))
        {
            Ok(t) => threads.push(t),
            Err(e) => tracing::error!(error = %e, "cannot start the storage writer thread"),
        }
        // Opening and closing incidents ask for a flush here: an fsync can take seconds on
        // a busy disk, and the interval loop must not wait for it.
        let (flush, flush_rx) = mpsc::sync_channel::<()>(1);
        let s = store.clone();
        // Not joined at finish: the incident records hold handles to it until the loop is
        // dropped, and the loop's own final flush covers what it would have flushed.
        if let Err(e) = std::thread::Builder::new()
            .name("tailtrap-flush".into())
            .spawn(move || {
                for () in flush_rx {
                    if let Err(e) = s.flush_records() {
                        // While the engine is down the store has said so once.
                        if s.engine_failed() {
                            tracing::debug!(error = %e, "flushing the store failed");
                        } else {
                            tracing::error!(error = %e, "flushing the store failed");
                        }
                    }
                }
            })
        {
            tracing::error!(error = %e, "cannot start the flush thread");
        }
        let (samples, samples_rx) = mpsc::sync_channel(SAMPLE_QUEUE);
        // Unbounded, but never longer than the batches queued: the loop takes every
        // outcome each interval.
        let (written_tx, written) = mpsc::channel();
        let s = store.clone();
        let flush_closed = FlushSoon(Some(flush.clone()));
        let sample_thread = match std::thread::Builder::new()
            .name("tailtrap-samples".into())
            .spawn(move || sample_loop(&s, samples_rx, &written_tx, &flush_closed))
        {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the sample writer thread");
                None
            }
        };
        match std::thread::Builder::new()
            .name("tailtrap-retention".into())
            .spawn(move || retention_loop(&store, retention_rx))
        {
            Ok(t) => threads.push(t),
            Err(e) => tracing::error!(error = %e, "cannot start the retention thread"),
        }
        let samples = SampleQueue(Arc::new(Mutex::new(
            sample_thread.is_some().then_some(samples),
        )));
        Writer {
            jobs: Some(jobs),
            retention: Some(retention),
            flush: Some(flush),
            threads,
            dropped,
            samples,
            sample_thread,
            written,
            dropped_samples: AtomicU64::new(0),
            baselines_behind: AtomicBool::new(false),
        }
    }

    /// Queue samples for storing (their incidents are in the store already). When the
    /// thread is behind, the batch is dropped and its outcome (not stored) is returned at
    /// once; otherwise it arrives later through [`Writer::samples_written`].
    pub(super) fn samples(
        &self,
        samples: Vec<Sample>,
        pre_trigger: bool,
    ) -> Option<SamplesWritten> {
        let n = samples.len() as u64;
        let refused = match self.samples.try_send(SampleJob::Batch {
            samples,
            pre_trigger,
        }) {
            Ok(()) => None,
            Err(SampleJob::Batch {
                samples,
                pre_trigger,
            }) => Some(SamplesWritten::of(&samples, pre_trigger, false)),
            Err(_) => unreachable!("a batch was sent"),
        };
        if refused.is_some() {
            self.dropped_samples.fetch_add(n, Ordering::Relaxed);
        }
        refused
    }

    /// The outcomes of the batches written since the last call.
    pub(super) fn samples_written(&self) -> Vec<SamplesWritten> {
        self.written.try_iter().collect()
    }

    /// Write the samples still queued and stop their thread (shutdown: their counts go
    /// into the incident records before those are closed).
    pub(super) fn finish_samples(&mut self) {
        self.samples.close();
        if let Some(t) = self.sample_thread.take() {
            if t.join().is_err() {
                tracing::error!("the sample writer thread panicked");
            }
        }
    }

    /// Queue an interval's history; dropped (and counted) when the writer is behind.
    pub(super) fn history(&self, start_ns: u64, rows: Rows) {
        if rows.is_empty() {
            return;
        }
        if !self.send(Job::History { start_ns, rows }) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // The first drop and then one line per hundred.
            if n % 100 == 1 {
                tracing::warn!(
                    dropped_intervals = n,
                    "the storage writer is behind: an interval's history was dropped"
                );
            }
        }
    }

    /// The queue the incidents' changed records go through (see [`SampleQueue`]).
    pub(super) fn records(&self) -> SampleQueue {
        self.samples.clone()
    }

    /// A handle for asking the flush thread to flush.
    pub(super) fn flush_soon(&self) -> FlushSoon {
        FlushSoon(self.flush.clone())
    }

    /// Intervals of history dropped because the writer was behind.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Samples dropped because the sample thread was behind.
    pub(super) fn dropped_samples(&self) -> u64 {
        self.dropped_samples.load(Ordering::Relaxed)
    }

    /// Forget the services (after their last history, queued before).
    pub(super) fn forget(&self, services: Vec<String>) {
        if services.is_empty() {
            return;
        }
        // Blocks when the queue is full: rare (cgroups going away) and it must not be lost,
        // or the store would keep the service's chunks forever.
        if let Some(tx) = &self.jobs {
            let _ = tx.send(Job::Forget(services));
        }
    }

    /// Queue the baselines for saving; skipped when the writer is behind (the next
    /// period saves them).
    pub(super) fn baselines(&self, baselines: Vec<(String, Probe, Vec<u8>)>) {
        // A standing condition (a slow disk): said when it begins and when it ends.
        if !self.send(Job::Baselines(baselines)) {
            if !self.baselines_behind.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the storage writer is behind: baselines not saved this time (said again \
                     when they are)"
                );
            } else {
                tracing::debug!("the storage writer is still behind: baselines not saved");
            }
        } else if self.baselines_behind.swap(false, Ordering::Relaxed) {
            tracing::info!("the storage writer caught up: baselines queued for saving again");
        }
    }

    /// Ask for a retention pass (and rotation if due) at `now`, unless one is pending.
    pub(super) fn retention(&self, now: SystemTime) {
        if let Some(tx) = &self.retention {
            let _ = tx.try_send(now);
        }
    }

    fn send(&self, job: Job) -> bool {
        match &self.jobs {
            Some(tx) => match tx.try_send(job) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        }
    }

    /// Wait until every job queued so far is done (tests: the loop itself never waits).
    #[cfg(test)]
    pub(super) fn sync(&self) {
        let (tx, rx) = mpsc::channel();
        if let Some(jobs) = &self.jobs {
            if jobs.send(Job::Barrier(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
        let (tx, rx) = mpsc::channel();
        // Out of the lock: the send may wait for room.
        if let Some(samples) = self.samples.sender() {
            if samples.send(SampleJob::Barrier(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }

    /// Write what is queued (the baselines given included), then stop the threads.
    pub(super) fn finish(&mut self, baselines: Vec<(String, Probe, Vec<u8>)>) {
        self.finish_samples();
        if let Some(tx) = self.jobs.take() {
            let _ = tx.send(Job::Baselines(baselines));
        }
        self.retention = None;
        self.flush = None;
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a storage thread panicked");
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.jobs = None;
        self.retention = None;
        self.samples.close();
        for t in self.threads.drain(..).chain(self.sample_thread.take()) {
            let _ = t.join();
        }
    }
}

fn sample_loop(
    store: &Store,
    rx: Receiver<SampleJob>,
    written: &mpsc::Sender<SamplesWritten>,
    flush: &FlushSoon,
) {
    // Failing writes (a full disk) are a standing condition: said when they begin and end.
    let mut failing = Standing::default();
    for job in rx {
        match job {
            SampleJob::Batch {
                samples,
                pre_trigger,
            } => {
                let result = store.put_samples(&samples);
                match &result {
                    // While the engine is down the store has said so once.
                    Err(e) if store.engine_failed() => {
                        tracing::debug!(samples = samples.len(), error = %e, "samples not stored");
                    }
                    Err(e) if failing.begins() => tracing::warn!(
                        samples = samples.len(),
                        error = %e,
                        "samples not stored (the next failures at debug; said when samples are \
                         stored again)"
                    ),
                    Err(e) => {
                        tracing::debug!(samples = samples.len(), error = %e, "samples not stored");
                    }
                    Ok(()) if failing.ends() => tracing::info!("samples are stored again"),
                    Ok(()) => {}
                }
                // The loop is gone only at shutdown, after this thread was joined.
                let _ = written.send(SamplesWritten::of(&samples, pre_trigger, result.is_ok()));
            }
            SampleJob::Record {
                record,
                durable,
                new,
            } => {
                store_record(store, &record, new);
                if durable {
                    flush.request();
                }
            }
            #[cfg(test)]
            SampleJob::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Store an incident record, `new` (first stored now) or changed; a failure is logged
/// (the store counts it).
pub(super) fn store_record(store: &Store, record: &storage::Incident, new: bool) {
    let stored = if new {
        store.put_new_incident(record)
    } else {
        match store.update_incident(record) {
            // Opened while the engine was down: the record (whole, as it is now) is stored
            // at its first change after the engine came back.
            Err(storage::StoreError::NoSuchIncident(_)) => store.put_new_incident(record),
            r => r,
        }
    };
    if let Err(e) = stored {
        // While the engine is down the store has said so once; each record is not news.
        if store.engine_failed() {
            tracing::debug!(incident = record.id, error = %e, "incident record not stored");
        } else {
            tracing::error!(incident = record.id, error = %e, "storing the incident's record failed");
        }
    }
}

fn write_loop(store: &Store, rx: Receiver<Job>) {
    // Services whose history could not be stored, warned about once.
    let mut warned: Vec<String> = Vec::new();
    let mut baselines_failing = Standing::default();
    for job in rx {
        // A failed engine is tried again here (at most every 10 s), so the store recovers
        // once the disk takes writes, not only at the next incident's flush.
        match store.recover() {
            Ok(true) => warned.clear(),
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "the failed storage engine stays failed"),
        }
        match job {
            Job::History { start_ns, rows } => write_history(store, start_ns, &rows, &mut warned),
            Job::Forget(services) => {
                for service in &services {
                    store.forget_history_writer(service);
                }
                warned.retain(|s| !services.contains(s));
            }
            Job::Baselines(baselines) => save_baselines(store, &baselines, &mut baselines_failing),
            #[cfg(test)]
            Job::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Store an interval's histograms as history, in one batch.
fn write_history(store: &Store, start_ns: u64, rows: &Rows, warned: &mut Vec<String>) {
    let points: Vec<HistoryPoint<'_>> = rows
        .iter()
        .map(|(service, probe, hist)| HistoryPoint {
            service,
            probe: *probe,
            hist,
        })
        .collect();
    match store.record_history_batch(start_ns, &points) {
        Ok(refused) => {
            for (i, e) in refused {
                if let Some((service, _, _)) = rows.get(i) {
                    warn_history(warned, service, &e);
                }
            }
        }
        Err(e) => {
            for (service, _, _) in rows {
                warn_history(warned, service, &e);
            }
        }
    }
}

/// Warn that `service`'s history was not stored, once per service.
fn warn_history(warned: &mut Vec<String>, service: &str, e: &storage::StoreError) {
    if !warned.iter().any(|s| s == service) {
        tracing::warn!(%service, error = %e, "history not stored for this service");
        warned.push(service.to_owned());
    }
}

fn save_baselines(store: &Store, baselines: &[(String, Probe, Vec<u8>)], failing: &mut Standing) {
    // Saved every minute: while the engine is down (the store has said so once), each
    // failed save is not news; nor is each failure of a lasting one (a full disk).
    let known = store.engine_failed();
    let failed = baselines
        .iter()
        .filter(|(service, probe, bytes)| store.put_baseline(service, *probe, bytes).is_err())
        .count();
    if failed > 0 && known {
        tracing::debug!(failed, "baselines not saved: the storage engine is down");
    } else if failed > 0 && failing.begins() {
        tracing::warn!(
            failed,
            total = baselines.len(),
            "some baselines could not be saved (said again when they are)"
        );
    } else if failed > 0 {
        tracing::debug!(failed, total = baselines.len(), "baselines not saved");
    } else if failing.ends() {
        tracing::info!(saved = baselines.len(), "baselines are saved again");
    } else {
        tracing::debug!(saved = baselines.len(), "baselines saved");
    }
}

fn retention_loop(store: &Store, rx: Receiver<SystemTime>) {
    let mut over_budget = Standing::default();
    for now in rx {
        retention_pass(store, now, &mut over_budget);
    }
}

/// One retention pass, and rotation when due. Expiry and trimming to the budget are
/// routine (debug) unless they removed incidents; live data left over the budget (only open
/// incidents and baselines left) is a standing condition, said when it begins and ends.
fn retention_pass(store: &Store, now: SystemTime, over_budget: &mut Standing) {
    match store.enforce_retention(unix_ns(now)) {
        Ok(r) => {
            if r.incidents > 0 {
                tracing::info!(
                    incidents = r.incidents,
                    samples = r.samples,
                    pwru = r.pwru,
                    history_points = r.history_points,
                    "retention removed old records"
                );
            } else if r.samples + r.pwru + r.history_points > 0 {
                tracing::debug!(
                    samples = r.samples,
                    pwru = r.pwru,
                    history_points = r.history_points,
                    "retention removed old records"
                );
            }
            let figures = || (store.stats().live_bytes, store.config().max_bytes);
            if !r.still_over_budget {
                if over_budget.ends() {
                    let (live_bytes, budget) = figures();
                    tracing::info!(live_bytes, budget, "live data back under the size budget");
                }
            } else if over_budget.begins() {
                let (live_bytes, budget) = figures();
                tracing::warn!(
                    live_bytes,
                    budget,
                    "live data over the size budget with only open incidents and baselines \
                     left (said again when it is back under)"
                );
            } else {
                let (live_bytes, budget) = figures();
                tracing::debug!(live_bytes, budget, "live data still over the size budget");
            }
        }
        Err(e) => tracing::error!(error = %e, "retention failed"),
    }
    match store.maybe_rotate() {
        Ok(Some(r)) => tracing::info!(
            size_before = r.size_before,
            size_after = r.size_after,
            "database rotated"
        ),
        Ok(None) => {}
        Err(e) => tracing::error!(error = %e, "database rotation failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::{IncidentState, NewIncident, StoreConfig};

    fn opened(store: &Store) -> storage::Incident {
        store
            .open_incident(&NewIncident {
                service: "web".into(),
                probes: vec![Probe::TcpSocketRead],
                opened_ns: 1_700_000_000_000_000_000,
                evidence_json: "{}".into(),
                stages_json: "null".into(),
            })
            .unwrap()
    }

    /// Live data left over the budget by open incidents is said once as it begins (not at
    /// every pass, 30 s apart while it lasts) and once as it ends.
    #[test]
    fn a_store_left_over_its_budget_is_said_once_when_it_begins_and_once_when_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            max_bytes: 1 << 20,
            ..StoreConfig::default()
        };
        let store = Store::open(dir.path().join("db"), config).unwrap();
        let mut open = opened(&store);
        for batch in 0..100u64 {
            let samples: Vec<Sample> = (batch * 1000..(batch + 1) * 1000)
                .map(|i| model::fixtures::sample(open.id, i, open.opened_ns + i))
                .collect();
            store.put_samples(&samples).unwrap();
            if store.over_budget() {
                break;
            }
        }
        assert!(store.over_budget());
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_100);
        let mut over = Standing::default();
        let while_open = super::super::standing::logged(|| {
            for _ in 0..3 {
                retention_pass(&store, at, &mut over);
            }
        });
        let warned = |text: &str| {
            text.lines()
                .filter(|l| l.contains("WARN") && l.contains("over the size budget"))
                .count()
        };
        assert_eq!(warned(&while_open), 1, "{while_open}");
        assert_eq!(
            while_open
                .lines()
                .filter(|l| l.contains("DEBUG") && l.contains("still over the size budget"))
                .count(),
            2,
            "{while_open}"
        );
        assert!(!while_open.contains(" INFO "), "{while_open}");

        // Closed, the incident is trimmed away: the end is said once, with what went.
        let closed_ns = open.opened_ns + 1;
        store.close_incident(&mut open, closed_ns).unwrap();
        let closed = super::super::standing::logged(|| {
            for _ in 0..2 {
                retention_pass(&store, at, &mut over);
            }
        });
        assert_eq!(warned(&closed), 0, "{closed}");
        let infos: Vec<&str> = closed.lines().filter(|l| l.contains("INFO")).collect();
        assert_eq!(infos.len(), 2, "{closed}");
        assert!(
            infos[0].contains("retention removed old records incidents=1"),
            "{closed}"
        );
        assert!(
            infos[1].contains("live data back under the size budget"),
            "{closed}"
        );
    }

    #[test]
    fn record_changes_are_stored_in_order_and_handed_back_once_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path().join("db"), StoreConfig::default()).unwrap());
        let mut writer = Writer::start(store.clone());
        let records = writer.records();
        let mut rec = opened(&store);
        for n in 1..=20 {
            rec.counters.intervals = n;
            records.record(Box::new(rec.clone()), false).unwrap();
        }
        rec.state = IncidentState::Closed;
        rec.closed_ns = Some(1_700_000_001_000_000_000);
        records.record(Box::new(rec.clone()), true).unwrap();
        writer.sync();
        let stored = store.incident(rec.id).unwrap().unwrap();
        assert_eq!(stored.counters.intervals, 20, "the last change wins");
        assert_eq!(stored.state, IncidentState::Closed);

        // Stopped: the change comes back for the caller to store; nothing is dropped.
        writer.finish_samples();
        rec.pwru.message = "after the stop".into();
        let back = records.record(Box::new(rec.clone()), false).unwrap_err();
        assert_eq!(*back, rec);
    }

    #[test]
    fn a_change_to_an_incident_never_stored_stores_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
        // Numbered while the engine was down: its first record was never stored.
        let mut rec = store
            .number_incident(&NewIncident {
                service: "web".into(),
                probes: vec![Probe::TcpSocketRead],
                opened_ns: 1_700_000_000_000_000_000,
                evidence_json: "{}".into(),
                stages_json: "null".into(),
            })
            .unwrap();
        assert!(store.incident(rec.id).unwrap().is_none());
        rec.counters.intervals = 7;
        store_record(&store, &rec, false);
        assert_eq!(store.incident(rec.id).unwrap(), Some(rec));
    }
}
