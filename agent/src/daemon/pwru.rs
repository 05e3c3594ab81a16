//! pwru sessions for incidents, each run on a worker: its lines go to the store as they
//! come; its outcome goes back to the interval loop, the only writer of incident records.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bpf::kernel_functions::KernelFunctions;

use capture::pwru::{
    PwruConfig, PwruLine, SessionManager, SessionRequest, SessionState, SessionStatus,
};
use model::{Flow, Probe, Transport};
use storage::{PwruRecord, PwruState, PwruStatus, Store};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::lock;
use model::unix_ns;

/// Lines buffered between pwru's reader and the store.
const LINE_BUFFER: usize = 1024;
/// Lines per store write.
const BATCH: usize = 128;
/// Lines wait at most this long before they are written.
const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// What a session's task tells the interval loop, the only writer of incident records.
pub(super) enum SessionNews {
    /// The kernel check chose the functions pwru traces (before pwru starts).
    Chosen {
        /// The incident the session runs for.
        incident: u64,
        /// One line: the chosen functions and the dropped ones with why.
        summary: String,
    },
    /// The session ended (or never ran).
    Finished(Box<Finished>),
}

/// How a session ended, for the incident's record.
pub(super) struct Finished {
    /// The incident it ran for.
    pub(super) incident: u64,
    /// What the session manager reported.
    pub(super) status: SessionStatus,
    /// Lines stored with the incident.
    pub(super) stored: u64,
    /// Lines that could not be stored.
    pub(super) store_errors: u64,
}

/// Incidents waiting at most: one per service in practice (a service has one incident
/// open at a time), so this only bounds a host with that many services slowed at once.
const MAX_WAITING: usize = 16;

/// The one session slot's queue. A request that finds another incident's session running
/// waits, while its incident stays open, and starts when a session that held the slot
/// ends: the slowdown that is still going on gets its trace instead of none.
#[derive(Default)]
pub(super) struct SessionQueue {
    /// The flows each request in flight named, by incident, to ask again with.
    in_flight: HashMap<u64, Vec<Flow>>,
    /// Oldest first.
    waiting: VecDeque<Waiting>,
    /// Stopping: nothing waits any more.
    closed: bool,
}

/// An incident waiting for the slot.
pub(super) struct Waiting {
    /// The incident.
    pub(super) incident: u64,
    /// The flows its request named.
    flows: Vec<Flow>,
    /// Why it could not start (the session that held the slot).
    pub(super) busy: String,
}

/// What a session's end means for the queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum QueueVerdict {
    /// The request found the slot taken and its incident is open: it waits (not an end).
    Waits,
    /// The request is over; `freed` when its session had held the slot, so a waiting
    /// incident may start now.
    Ended { freed: bool },
}

impl SessionQueue {
    /// A session was asked for `incident` on `flows`.
    pub(super) fn requested(&mut self, incident: u64, flows: &[Flow]) {
        self.in_flight.insert(incident, flows.to_vec());
    }

    /// A request ended as `done` says; `open` whether its incident is still open.
    pub(super) fn finished(&mut self, done: &Finished, open: bool) -> QueueVerdict {
        let flows = self.in_flight.remove(&done.incident);
        let state = done.status.state;
        if state == SessionState::SkippedBusy
            && open
            && !self.closed
            && self.waiting.len() < MAX_WAITING
        {
            self.waiting.push_back(Waiting {
                incident: done.incident,
                flows: flows.unwrap_or_default(),
                busy: done.status.reason.clone(),
            });
            return QueueVerdict::Waits;
        }
        let freed = matches!(
            state,
            SessionState::Ok
                | SessionState::Failed
                | SessionState::Timeout
                | SessionState::NotReady
        );
        QueueVerdict::Ended { freed }
    }

    /// The oldest waiting incident, taken off the queue with the flows to ask for.
    pub(super) fn next(&mut self) -> Option<(u64, Vec<Flow>)> {
        self.waiting.pop_front().map(|w| (w.incident, w.flows))
    }

    /// `incident` closed: it no longer waits. Its entry, if it waited.
    pub(super) fn incident_closed(&mut self, incident: u64) -> Option<Waiting> {
        let at = self.waiting.iter().position(|w| w.incident == incident)?;
        self.waiting.remove(at)
    }

    /// Stopping: no incident waits from now on; those that did.
    pub(super) fn close(&mut self) -> Vec<Waiting> {
        self.closed = true;
        self.waiting.drain(..).collect()
    }
}

/// Where the interval loop hands the session an incident asks for.
pub(super) trait PwruStarter {
    /// Start a session for `incident`; its end comes back as a [`Finished`].
    fn start(&mut self, incident: u64, request: SessionRequest);
}

/// The real sessions: the session manager runs them on the runtime's workers (pwru's
/// parent-death signal is tied to the thread that spawns it, and workers live as long as
/// the daemon).
pub(super) struct PwruSessions {
    manager: SessionManager,
    store: Arc<Store>,
    sessions: JoinSet<()>,
    news: mpsc::Sender<SessionNews>,
}

impl PwruSessions {
    pub(super) fn new(
        manager: SessionManager,
        store: Arc<Store>,
        news: mpsc::Sender<SessionNews>,
    ) -> PwruSessions {
        PwruSessions {
            manager,
            store,
            sessions: JoinSet::new(),
            news,
        }
    }

    /// Shutdown: stop a running session, turn down those not started yet, and wait at
    /// most `wait` for every one to end (their outcomes are then in the news channel).
    pub(super) async fn stop(&mut self, wait: Duration) {
        if self.manager.close() {
            tracing::info!("stopping the running pwru session");
        }
        let sessions = &mut self.sessions;
        let joined = tokio::time::timeout(wait, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
        if joined.is_err() {
            tracing::warn!("a pwru session did not end in time; its status stays `running`");
        }
    }
}

impl PwruStarter for PwruSessions {
    fn start(&mut self, incident: u64, request: SessionRequest) {
        let (manager, store, news) = (self.manager.clone(), self.store.clone(), self.news.clone());
        // Busy from now, not only once the task below has claimed the slot.
        let reservation = manager.reserve();
        self.sessions.spawn(async move {
            // Checking the functions may parse the kernel's BTF (seconds on a slow host
            // when the read-ahead has not finished): here, never on the interval loop.
            let service = request.service().to_owned();
            let checked = tokio::task::spawn_blocking(move || choose_functions(request))
                .await
                .unwrap_or_else(|e| {
                    Err(format!("no session: checking pwru's functions failed: {e}"))
                });
            let request = match checked {
                Ok(FunctionChoice { request, summary }) => {
                    // Kept with the incident (`tailtrap incidents show`).
                    tracing::debug!(incident, %summary, "pwru functions chosen");
                    let chosen = SessionNews::Chosen { incident, summary };
                    if news.send(chosen).await.is_err() {
                        return;
                    }
                    request
                }
                Err(why) => {
                    drop(reservation);
                    let finished = Finished {
                        incident,
                        status: SessionStatus::unavailable(&service, why),
                        stored: 0,
                        store_errors: 0,
                    };
                    send_finished(&news, finished).await;
                    return;
                }
            };
            let (tx, mut rx) = mpsc::channel(LINE_BUFFER);
            let run = manager.run(request, tx);
            tokio::pin!(run);
            let mut writer = Writer {
                store,
                incident,
                batch: Vec::with_capacity(BATCH),
                stored: 0,
                errors: 0,
            };
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            let status = loop {
                tokio::select! {
                    Some(line) = rx.recv() => writer.push(line),
                    _ = tick.tick() => writer.flush(),
                    status = &mut run => break status,
                }
            };
            drop(reservation);
            // The sender went away with the finished session: take what is left.
            while let Some(line) = rx.recv().await {
                writer.push(line);
            }
            writer.flush();
            let finished = Finished {
                incident,
                status,
                stored: writer.stored,
                store_errors: writer.errors,
            };
            send_finished(&news, finished).await;
        });
    }
}

async fn send_finished(news: &mpsc::Sender<SessionNews>, finished: Finished) {
    let incident = finished.incident;
    if news
        .send(SessionNews::Finished(Box::new(finished)))
        .await
        .is_err()
    {
        tracing::warn!(
            incident,
            "pwru session ended after the daemon stopped listening"
        );
    }
}

struct Writer {
    store: Arc<Store>,
    incident: u64,
    batch: Vec<PwruRecord>,
    stored: u64,
    errors: u64,
}

impl Writer {
    fn push(&mut self, line: PwruLine) {
        self.batch.push(record(self.incident, line));
        if self.batch.len() >= BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let n = self.batch.len() as u64;
        match self.store.put_pwru(&self.batch) {
            Ok(()) => self.stored += n,
            Err(e) => {
                self.errors += n;
                // While the engine is down the store has said so once.
                if self.store.engine_failed() {
                    tracing::debug!(incident = self.incident, lines = n, error = %e, "pwru lines not stored");
                } else {
                    tracing::warn!(incident = self.incident, lines = n, error = %e, "pwru lines not stored");
                }
            }
        }
        self.batch.clear();
    }
}

/// The stored form of a line: verbatim, with the fields queries use pulled out.
fn record(incident: u64, line: PwruLine) -> PwruRecord {
    let (pwru_time_ns, func, skb, flow) = match line.event {
        Some(e) => (
            e.time_ns,
            e.func,
            e.skb,
            e.tuple.map(|t| Flow {
                transport: Transport::from_ip_proto(t.proto),
                src: t.saddr,
                sport: t.sport,
                dst: t.daddr,
                dport: t.dport,
            }),
        ),
        None => (None, String::new(), 0, None),
    };
    PwruRecord {
        incident,
        seq: line.seq,
        received_ns: unix_ns(line.received),
        pwru_time_ns,
        func,
        skb,
        flow,
        raw: line.raw,
    }
}

/// The incident's pwru status from the session's outcome.
pub(super) fn status_of(s: &SessionStatus, stored: u64) -> PwruStatus {
    let state = match s.state {
        SessionState::Ok => PwruState::Done,
        SessionState::Failed | SessionState::Timeout | SessionState::NotReady => PwruState::Failed,
        SessionState::SkippedBusy | SessionState::SkippedCooldown | SessionState::Unavailable => {
            PwruState::NotRun
        }
    };
    let mut message = format!("{}: {}", s.state, s.reason);
    if let Some((_, command)) = s.rows().into_iter().find(|(k, _)| *k == "command") {
        if !s.argv.is_empty() {
            message.push_str("; command: ");
            message.push_str(&command);
        }
    }
    PwruStatus {
        state,
        exit_status: s.exit_code,
        signal: s.signal,
        stderr_tail: s.stderr_tail.join("\n"),
        started_ns: s.started.map(unix_ns),
        ended_ns: s.ended.map(unix_ns),
        lines_stored: stored,
        message,
    }
}

/// Verdicts for the function names asked about so far. BTF and tracefs do not change while
/// the daemon runs (a module loaded later is not worth a re-read), so the kernel is read
/// once for every name the configuration can ask for (ahead, off the loop) and again only
/// for a name not asked about before; only the asked names are kept.
struct KnownFunctions {
    names: BTreeSet<String>,
    table: Result<KernelFunctions, String>,
}

static KNOWN: Mutex<Option<KnownFunctions>> = Mutex::new(None);

/// The kernel's verdicts for `names` (and every name asked about before).
fn kernel_functions(names: &[String]) -> Result<KernelFunctions, String> {
    let mut known = lock(&KNOWN);
    if let Some(k) = known.as_ref() {
        if names.iter().all(|n| k.names.contains(n)) {
            return k.table.clone();
        }
    }
    let mut all: BTreeSet<String> = known.take().map(|k| k.names).unwrap_or_default();
    all.extend(names.iter().cloned());
    let table = KernelFunctions::load()
        .map(|t| t.keep_only(all.iter().map(String::as_str)))
        .map_err(|e| e.to_string());
    let answer = table.clone();
    *known = Some(KnownFunctions { names: all, table });
    answer
}

/// Read the kernel's verdicts for every function `config` can ask pwru for, on a thread of
/// its own: parsing the kernel's BTF takes a while, and the first incident's request would
/// otherwise pay it on the interval loop.
pub(super) fn warm_kernel_functions(config: &PwruConfig) {
    if !config.enabled() {
        return;
    }
    let mut names: BTreeSet<String> = BTreeSet::new();
    for probe in Probe::ALL {
        names.extend(config.filter_funcs(&[probe]).names().iter().cloned());
    }
    names.extend(config.filter_funcs(&Probe::ALL).names().iter().cloned());
    let names: Vec<String> = names.into_iter().collect();
    if let Err(e) = std::thread::Builder::new()
        .name("tailtrap-btf".into())
        .spawn(move || {
            if let Err(e) = kernel_functions(&names) {
                tracing::debug!(error = %e, "kernel functions for pwru not read ahead");
            }
        })
    {
        tracing::debug!(error = %e, "cannot start the thread reading kernel functions");
    }
}

/// What the kernel check made of a request's functions, for the incident's message.
pub(super) struct FunctionChoice {
    /// The request with only the functions pwru really traces.
    pub(super) request: SessionRequest,
    /// One line: the chosen functions and the dropped ones with why.
    pub(super) summary: String,
}

/// Keep only the functions pwru 1.0.12 would select on this kernel (see
/// [`bpf::kernel_functions`]): a function it skips would only make the trace look
/// complete when it is not. `Err` with why when none is left.
pub(super) fn choose_functions(request: SessionRequest) -> Result<FunctionChoice, String> {
    let names = request.filter_funcs().names().to_vec();
    // A kernel whose functions cannot be read stays so: said at the first session, and
    // when they can be read again, not at every incident's session.
    static UNCHECKED: AtomicBool = AtomicBool::new(false);
    let kernel = match kernel_functions(&names) {
        Ok(k) => {
            if UNCHECKED.swap(false, Ordering::Relaxed) {
                tracing::info!("pwru's functions are checked against the kernel again");
            }
            k
        }
        // Without BTF pwru cannot run at all; its own error will say so.
        Err(e) => {
            if UNCHECKED.swap(true, Ordering::Relaxed) {
                tracing::debug!(error = %e, "cannot check pwru's functions against the kernel");
            } else {
                tracing::warn!(
                    error = %e,
                    "cannot check pwru's functions against the kernel (said again when it can)"
                );
            }
            let summary = format!("functions unchecked ({e})");
            return Ok(FunctionChoice { request, summary });
        }
    };
    let (kept, dropped) = kernel.select(names.iter().map(String::as_str));
    let mut summary = format!("functions: {}", kept.join(","));
    if !dropped.is_empty() {
        let why: Vec<String> = dropped.iter().map(|(n, v)| format!("{n} ({v})")).collect();
        summary.push_str("; dropped: ");
        summary.push_str(&why.join(", "));
    }
    if let Some(e) = kernel.available_error() {
        // pwru itself would select nothing; the prerequisite check reports it too.
        summary.push_str(&format!("; available_filter_functions unreadable: {e}"));
    }
    let Some(funcs) = request.filter_funcs().retain(|n| kept.contains(&n)) else {
        return Err(format!(
            "no session: none of the functions is traced by pwru on this kernel; {summary}"
        ));
    };
    Ok(FunctionChoice {
        request: request.with_filter_funcs(funcs),
        summary,
    })
}
