//! Running pwru: one session at a time, bounded in time and output, always reaped.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use super::busy;
use super::event::PwruLine;
use super::prereq::Prerequisites;
use super::request::SessionRequest;
use super::stderr::{AttachReport, StderrLog};

/// Longest stdout line kept (pwru's JSON events are a few hundred bytes).
const MAX_LINE_BYTES: usize = 64 * 1024;
/// How long to wait for the output pipes to close once pwru has exited (a grandchild
/// holding them must not hold the session open).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// pwru's nice value: an ordinary user's, whatever the daemon's own.
const PWRU_NICE: i32 = 0;
/// How often the ready file is looked for while pwru attaches.
const READY_POLL: Duration = Duration::from_millis(100);

/// Settings shared by every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// Minimum time between the starts of two sessions for the same service.
    pub cooldown: Duration,
    /// Directory for pwru's ready files (created 0700 if missing).
    pub runtime_dir: PathBuf,
    /// While the prerequisites fail, they are checked again at a session request at most
    /// this often.
    pub prereq_recheck: Duration,
}

impl Default for ManagerConfig {
    /// 10 min cooldown, ready files in /run/tailtrap.
    fn default() -> Self {
        ManagerConfig {
            cooldown: Duration::from_secs(600),
            runtime_dir: PathBuf::from("/run/tailtrap"),
            prereq_recheck: Duration::from_secs(60),
        }
    }
}

/// How a session ended (or why it never started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionState {
    /// pwru attached, traced and exited cleanly (output limit, deadline or stop request).
    Ok,
    /// pwru could not start, failed to attach, attached nothing, or exited with an error.
    Failed,
    /// pwru attached and traced, but had to be killed after ignoring SIGTERM.
    Timeout,
    /// pwru had not attached its probes (no ready file) within the attach timeout, so it
    /// was stopped before tracing anything: a slow start, not a hang.
    NotReady,
    /// Not run: the service had a session less than the cooldown ago.
    SkippedCooldown,
    /// Not run: another session was running.
    SkippedBusy,
    /// Not run: pwru cannot run here now (its prerequisites are not met, none of the
    /// functions asked for is traced on this kernel, or tailtrap is stopping).
    Unavailable,
}

impl SessionState {
    /// The kebab-case name used in JSON and tables.
    pub const fn name(self) -> &'static str {
        match self {
            SessionState::Ok => "ok",
            SessionState::Failed => "failed",
            SessionState::Timeout => "timeout",
            SessionState::NotReady => "not-ready",
            SessionState::SkippedCooldown => "skipped-cooldown",
            SessionState::SkippedBusy => "skipped-busy",
            SessionState::Unavailable => "unavailable",
        }
    }
}

impl std::fmt::Display for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What became of one session request: the incident's pwru status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// The service the session was for.
    pub service: String,
    /// The outcome.
    pub state: SessionState,
    /// One line for humans explaining the outcome.
    pub reason: String,
    /// The command run (program first); empty when nothing was run.
    pub argv: Vec<String>,
    /// pwru's exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended pwru, when one did.
    pub signal: Option<i32>,
    /// The last lines of pwru's stderr, progress bars removed.
    pub stderr_tail: Vec<String>,
    /// What stderr said about attaching.
    pub attach: AttachReport,
    /// When pwru was started.
    #[serde(with = "humantime_serde::option")]
    pub started: Option<SystemTime>,
    /// When pwru created its ready file, i.e. had attached its probes (to the clock tick).
    /// None when it never did before being stopped.
    #[serde(with = "humantime_serde::option")]
    pub ready: Option<SystemTime>,
    /// When tailtrap sent SIGTERM (deadline or stop request).
    #[serde(with = "humantime_serde::option")]
    pub sigterm: Option<SystemTime>,
    /// When tailtrap sent SIGKILL (SIGTERM ignored for the grace period).
    #[serde(with = "humantime_serde::option")]
    pub sigkill: Option<SystemTime>,
    /// When pwru was reaped (or the request was turned down).
    #[serde(with = "humantime_serde::option")]
    pub ended: Option<SystemTime>,
    /// stdout lines read (each delivered as a [`PwruLine`]).
    pub lines_captured: u64,
    /// Of those, lines that did not parse as pwru events.
    pub lines_unparsed: u64,
}

impl SessionStatus {
    /// `(item, value)` rows for `tailtrap incidents show` / `tailtrap pwru`.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let time = |t: Option<SystemTime>| {
            t.map_or_else(
                || "-".to_owned(),
                |t| humantime::format_rfc3339_millis(t).to_string(),
            )
        };
        // Offsets from the start make the timeline readable at a glance.
        let at = |t: Option<SystemTime>| match (self.started, t) {
            (Some(s), Some(t)) => {
                let d = t.duration_since(s).unwrap_or_default();
                let ms = Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                format!("{} (+{})", time(Some(t)), humantime::format_duration(ms))
            }
            _ => time(t),
        };
        let exit = match (self.exit_code, self.signal) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "-".to_owned(),
        };
        vec![
            ("state", self.state.name().to_owned()),
            ("reason", self.reason.clone()),
            ("exit", exit),
            ("started", time(self.started)),
            ("ready", at(self.ready)),
            ("SIGTERM", at(self.sigterm)),
            ("SIGKILL", at(self.sigkill)),
            ("ended", at(self.ended)),
            (
                "lines",
                format!("{} ({} unparsed)", self.lines_captured, self.lines_unparsed),
            ),
            ("command", shell_words(&self.argv)),
        ]
    }

    /// A session that did not run because pwru cannot run here now; `reason` says why.
    pub fn unavailable(service: &str, reason: String) -> Self {
        Self::not_run(service, SessionState::Unavailable, reason)
    }

    /// A session that did not run (`state` says which way: skipped or unavailable).
    pub fn not_run(service: &str, state: SessionState, reason: String) -> Self {
        SessionStatus {
            service: service.to_owned(),
            state,
            reason,
            argv: Vec::new(),
            exit_code: None,
            signal: None,
            stderr_tail: Vec::new(),
            attach: AttachReport::default(),
            started: None,
            ready: None,
            sigterm: None,
            sigkill: None,
            ended: Some(SystemTime::now()),
            lines_captured: 0,
            lines_unparsed: 0,
        }
    }
}

/// Runs pwru sessions: at most one at a time, at most one per service per cooldown.
/// Cheap to clone; clones share the same slot and cooldowns.
#[derive(Debug, Clone)]
pub struct SessionManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The binary, or why sessions cannot run here.
    binary: Mutex<Binary>,
    config: ManagerConfig,
    slot: Mutex<Slot>,
    next_id: AtomicU64,
    /// Sessions asked for and not yet over (see [`SessionManager::reserve`]).
    reserved: AtomicUsize,
}

/// The binary to run and, for a manager made from a failed prerequisite check, when to
/// check again: a check that timed out on a busy host must not disable pwru for good.
#[derive(Debug)]
struct Binary {
    result: Result<PathBuf, String>,
    /// What to check (the binary the check found, or PATH) and when it was last checked.
    recheck: Option<(Option<PathBuf>, Instant)>,
}

#[derive(Debug, Default)]
struct Slot {
    /// The running session's service and stop signal.
    running: Option<(String, Arc<Notify>)>,
    /// Last start per service.
    last_start: HashMap<String, Instant>,
    /// Set by [`SessionManager::close`]: no session starts any more.
    closed: bool,
}

/// Frees the slot however the session ends (including cancellation of `run`).
struct SlotGuard {
    inner: Arc<Inner>,
}

/// A session asked for and not over yet; see [`SessionManager::reserve`].
#[derive(Debug)]
pub struct Reservation {
    inner: Arc<Inner>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.reserved.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        lock(&self.inner.slot).running = None;
    }
}

fn lock_binary(m: &Mutex<Binary>) -> MutexGuard<'_, Binary> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock(m: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    // A panic while holding this lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SessionManager {
    /// A manager running `binary`, trusting the caller that pwru can work here
    /// (e.g. a stand-in binary in tests).
    pub fn new(binary: PathBuf, config: ManagerConfig) -> Self {
        Self::with_binary(Ok(binary), config)
    }

    /// A manager for what [`Prerequisites::check`] found: when pwru is not usable, every
    /// request ends as [`SessionState::Unavailable`] with the check's summary as reason.
    /// While the check fails, it is repeated when a session is requested (at most once a
    /// minute), so a transient failure (a `--version` that timed out on a busy host) does
    /// not disable pwru for the daemon's life; each failure is logged at WARN with the fix.
    pub fn from_prerequisites(prereq: &Prerequisites, config: ManagerConfig) -> Self {
        match (&prereq.binary, prereq.is_usable()) {
            (Some(b), true) => Self::with_binary(Ok(b.clone()), config),
            _ => {
                let m = Self::with_binary(Err(prereq.summary.clone()), config);
                lock_binary(&m.inner.binary).recheck =
                    Some((prereq.binary.clone(), Instant::now()));
                m
            }
        }
    }

    fn with_binary(binary: Result<PathBuf, String>, config: ManagerConfig) -> Self {
        SessionManager {
            inner: Arc::new(Inner {
                binary: Mutex::new(Binary {
                    result: binary,
                    recheck: None,
                }),
                config,
                slot: Mutex::new(Slot::default()),
                next_id: AtomicU64::new(1),
                reserved: AtomicUsize::new(0),
            }),
        }
    }

    /// Whether a session is running now, or was asked for and has not ended yet.
    pub fn is_busy(&self) -> bool {
        self.inner.reserved.load(Ordering::SeqCst) > 0 || lock(&self.inner.slot).running.is_some()
    }

    /// Count a session as asked for from now until the returned guard is dropped: hold it
    /// from the request to the end of [`SessionManager::run`], so that [`is_busy`] says yes
    /// before the task running the session has claimed the slot (on a loaded host a status
    /// read in that gap saw pwru idle while a session was about to start).
    ///
    /// [`is_busy`]: SessionManager::is_busy
    pub fn reserve(&self) -> Reservation {
        self.inner.reserved.fetch_add(1, Ordering::SeqCst);
        Reservation {
            inner: self.inner.clone(),
        }
    }

    /// Shutdown: ask the running session, if any, to end now (SIGTERM, then SIGKILL after
    /// its grace period; its `run` call returns once pwru is reaped), and turn down every
    /// later one (`unavailable`), so that a session asked for just before the shutdown
    /// cannot start pwru after it. Returns whether one was running.
    pub fn close(&self) -> bool {
        let mut slot = lock(&self.inner.slot);
        slot.closed = true;
        match &slot.running {
            Some((_, n)) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// Run one session for `request`, sending each stdout line to `lines` as it arrives,
    /// and return its status once pwru has been reaped. Returns at once with a skipped or
    /// unavailable status when the session may not run.
    ///
    /// Keep draining `lines`: a full channel stalls the reading, then pwru's writes, and a
    /// stalled pwru may only end at the deadline with SIGKILL. If the receiver is dropped
    /// instead, the output is still read (so pwru never blocks) and counted.
    pub async fn run(
        &self,
        request: SessionRequest,
        lines: mpsc::Sender<PwruLine>,
    ) -> SessionStatus {
        let binary = match self.binary().await {
            Ok(b) => b,
            Err(why) => {
                return SessionStatus::not_run(request.service(), SessionState::Unavailable, why)
            }
        };
        let (guard, stop) = match self.claim(request.service()) {
            Ok(claimed) => claimed,
            Err(status) => return *status,
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let status = supervise(&binary, &self.inner.config, id, &request, &stop, lines).await;
        drop(guard);
        match status.state {
            // The daemon logs each session's end with its incident.
            SessionState::Ok => tracing::debug!(
                service = %status.service, lines = status.lines_captured, reason = %status.reason,
                "pwru session ok"
            ),
            state => tracing::warn!(
                service = %status.service, %state, reason = %status.reason, "pwru session did not succeed"
            ),
        }
        status
    }

    /// The binary, after checking the prerequisites again when the last check failed more
    /// than [`ManagerConfig::prereq_recheck`] ago.
    async fn binary(&self) -> Result<PathBuf, String> {
        let due = {
            let b = lock_binary(&self.inner.binary);
            match (&b.result, &b.recheck) {
                (Err(_), Some((what, at))) if at.elapsed() >= self.inner.config.prereq_recheck => {
                    Some(what.clone())
                }
                _ => None,
            }
        };
        if let Some(what) = due {
            let prereq = Prerequisites::check(what.as_deref()).await;
            let mut b = lock_binary(&self.inner.binary);
            match (&prereq.binary, prereq.is_usable()) {
                (Some(path), true) => {
                    tracing::info!(summary = %prereq.summary, "pwru prerequisites met on a new check");
                    b.result = Ok(path.clone());
                    b.recheck = None;
                }
                _ => {
                    // A standing condition: said at start (and whenever it changes), not at
                    // every incident's recheck.
                    if b.result.as_ref().err() == Some(&prereq.summary) {
                        tracing::debug!(
                            summary = %prereq.summary,
                            "pwru prerequisites still not met; sessions stay unavailable"
                        );
                    } else {
                        tracing::warn!(
                            status = %prereq.status, summary = %prereq.summary, fix = prereq.status.fix(),
                            "pwru prerequisites still not met, for another reason now; sessions stay unavailable"
                        );
                    }
                    b.result = Err(prereq.summary.clone());
                    b.recheck = Some((what, Instant::now()));
                }
            }
        }
        lock_binary(&self.inner.binary).result.clone()
    }

    /// Take the slot for `service`, or say why not.
    fn claim(&self, service: &str) -> Result<(SlotGuard, Arc<Notify>), Box<SessionStatus>> {
        let cooldown = self.inner.config.cooldown;
        let mut slot = lock(&self.inner.slot);
        if slot.closed {
            return Err(Box::new(SessionStatus::unavailable(
                service,
                "tailtrap is stopping: no new pwru session".to_owned(),
            )));
        }
        if let Some((busy_with, _)) = &slot.running {
            return Err(Box::new(SessionStatus::not_run(
                service,
                SessionState::SkippedBusy,
                format!("the pwru session for {busy_with:?} is still running"),
            )));
        }
        let now = Instant::now();
        slot.last_start
            .retain(|_, started| now.duration_since(*started) < cooldown);
        if let Some(started) = slot.last_start.get(service) {
            let ago = now.duration_since(*started);
            return Err(Box::new(SessionStatus::not_run(
                service,
                SessionState::SkippedCooldown,
                format!(
                    "cooldown: the last session for {service:?} started {} ago; next allowed in {}",
                    human(ago),
                    human(cooldown.saturating_sub(ago))
                ),
            )));
        }
        let stop = Arc::new(Notify::new());
        slot.running = Some((service.to_owned(), stop.clone()));
        // The cooldown counts from the start, so failing starts are not retried in a loop.
        slot.last_start.insert(service.to_owned(), now);
        Ok((
            SlotGuard {
                inner: self.inner.clone(),
            },
            stop,
        ))
    }
}

/// The argv as one line an operator can paste into a shell (for display only: tailtrap
/// itself never runs pwru through a shell).
fn shell_words(argv: &[String]) -> String {
    let plain = |a: &str| {
        !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c))
    };
    argv.iter()
        .map(|a| {
            if plain(a) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whole seconds are enough for humans reading a reason.
fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// Why pwru was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopCause {
    /// Not ready within the attach timeout.
    AttachTimeout,
    /// The tracing time after readiness is over.
    Deadline,
    Requested,
}

async fn supervise(
    binary: &Path,
    config: &ManagerConfig,
    id: u64,
    request: &SessionRequest,
    stop: &Notify,
    lines: mpsc::Sender<PwruLine>,
) -> SessionStatus {
    let limits = request.limits();
    let ready_file = config
        .runtime_dir
        .join(format!("pwru-{}-{id}.ready", std::process::id()));
    let args = request.argv(&ready_file);
    let mut status = SessionStatus::not_run(request.service(), SessionState::Failed, String::new());
    status.ended = None;
    status.argv = std::iter::once(binary.as_os_str())
        .chain(args.iter().map(|a| a.as_os_str()))
        .map(|a| a.to_string_lossy().into_owned())
        .collect();

    if let Err(e) = prepare_runtime_dir(&config.runtime_dir, &ready_file).await {
        status.reason = format!(
            "cannot prepare {} for the ready file: {e}",
            config.runtime_dir.display()
        );
        status.ended = Some(SystemTime::now());
        return status;
    }

    let mut cmd = Command::new(binary);
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at the daemon's terminal must not end pwru
        // behind the manager's back; the manager signals it itself.
        .process_group(0)
        // If this future is dropped mid-session, pwru must not outlive it.
        .kill_on_drop(true);
    // Nor if tailtrap itself dies (SIGKILL, OOM) outside a systemd unit whose cgroup would
    // take pwru down with it: pwru with sparse traffic never reaches its output limit.
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec; it only makes three
    // async-signal-safe system calls (prctl, getppid, setpriority) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            // The parent may have died between fork and prctl.
            if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            // The daemon runs above ordinary work (the unit's Nice=-5) to sample on time;
            // pwru is heavy while it runs and gets an ordinary user's priority instead.
            // Failure leaves it at the daemon's: not worth failing the session for.
            nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, PWRU_NICE);
            Ok(())
        });
    }
    let t0 = Instant::now();
    status.started = Some(SystemTime::now());
    let mut child = match busy::spawn(&mut cmd).await {
        Ok(c) => c,
        Err(e) => {
            status.reason = format!("cannot start {}: {e}", binary.display());
            status.ended = Some(SystemTime::now());
            return status;
        }
    };
    tracing::info!(service = request.service(), filter = %request.filter().expression(), "pwru session started");

    let counts = Arc::new(LineCounts::default());
    let stdout_task = child.stdout.take().map(|out| {
        let counts = counts.clone();
        let limit = limits.output_limit_lines();
        tokio::spawn(read_stdout(BufReader::new(out), lines, counts, limit))
    });
    let stderr_log = Arc::new(std::sync::Mutex::new(StderrLog::default()));
    let stderr_task = child.stderr.take().map(|mut err| {
        let log = stderr_log.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                match err.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => log
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(&buf[..n]),
                }
            }
        })
    });

    let ending = wait_bounded(&mut child, t0, limits, stop, &ready_file).await;
    status.sigterm = ending.term_at;
    status.sigkill = ending.kill_at;

    for task in [stdout_task, stderr_task].into_iter().flatten() {
        join_or_abort(task).await;
    }
    status.ended = Some(SystemTime::now());
    {
        let mut log = stderr_log.lock().unwrap_or_else(|e| e.into_inner());
        log.finish();
        status.stderr_tail = log.tail();
        status.attach = log.attach().clone();
    }
    // Without a progress bar to count them (stderr cut, another pwru version), the
    // functions asked for bound what pwru can have tried: ignoring that many is all.
    if status.attach.attempted.is_none() && status.attach.ignored.is_some() {
        status.attach.attempted = u32::try_from(request.filter_funcs().names().len()).ok();
    }
    status.lines_captured = counts.read.load(Ordering::Relaxed);
    status.lines_unparsed = counts.unparsed.load(Ordering::Relaxed);

    // The ready file's mtime is when pwru finished attaching (to the clock tick: file
    // times are coarse, which is why readiness itself is decided by existence).
    let ready = tokio::fs::metadata(&ready_file)
        .await
        .ok()
        .and_then(|m| m.modified().ok());
    // pwru creates the file even when stopped mid-attach, so with a SIGTERM only a file
    // that existed when it was sent counts.
    let ready_in_time = match ending.cause {
        Some(_) => ending.ready_before_term,
        None => ready.is_some(),
    };
    status.ready = ready.filter(|_| ready_in_time);
    if let Err(e) = tokio::fs::remove_file(&ready_file).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %ready_file.display(), error = %e, "cannot remove pwru ready file");
        }
    }

    match ending.exit {
        Ok(exit) => {
            status.exit_code = exit.code();
            status.signal = exit.signal();
            let last_error = stderr_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_error()
                .map(str::to_owned);
            let (state, reason) = classify(
                &status,
                exit,
                ready_in_time,
                ending.cause,
                limits,
                last_error.as_deref(),
            );
            status.state = state;
            status.reason = reason;
        }
        Err(e) => {
            status.state = SessionState::Failed;
            status.reason = format!("lost track of pwru: {e}");
        }
    }
    status
}

/// Create the runtime directory (0700: only root looks at ready files) and clear a stale
/// ready file so an old one cannot pass for readiness.
async fn prepare_runtime_dir(dir: &Path, ready_file: &Path) -> std::io::Result<()> {
    if !dir.is_dir() {
        tokio::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .await?;
    }
    match tokio::fs::remove_file(ready_file).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// How the wait for pwru ended.
struct Ending {
    exit: std::io::Result<ExitStatus>,
    /// What made us send SIGTERM, if we did.
    cause: Option<StopCause>,
    term_at: Option<SystemTime>,
    kill_at: Option<SystemTime>,
    /// Whether the ready file existed when SIGTERM was sent.
    ready_before_term: bool,
}

/// Wait for pwru to exit, sending SIGTERM when it is not ready by the attach timeout, at
/// the deadline counted from readiness, or on a stop request, and SIGKILL after the grace
/// period.
async fn wait_bounded(
    child: &mut Child,
    t0: Instant,
    limits: super::request::SessionLimits,
    stop: &Notify,
    ready_file: &Path,
) -> Ending {
    let attach_by = tokio::time::Instant::from_std(t0 + limits.attach_timeout());
    // Until pwru is ready, its ready file is looked for this often.
    let mut poll = tokio::time::interval(READY_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ready_at: Option<tokio::time::Instant> = None;
    let mut e = Ending {
        exit: Ok(ExitStatus::from_raw(0)),
        cause: None,
        term_at: None,
        kill_at: None,
        ready_before_term: false,
    };
    let mut kill_deadline = None;
    loop {
        // Next timer: the attach timeout, or once ready the deadline, until SIGTERM; then
        // the end of the grace period; then none.
        let next = match (e.term_at, e.kill_at) {
            (None, _) => Some(ready_at.map_or(attach_by, |r| r + limits.deadline())),
            (Some(_), None) => kill_deadline,
            (Some(_), Some(_)) => None,
        };
        let watching = e.term_at.is_none() && ready_at.is_none();
        let term_cause = tokio::select! {
            exit = child.wait() => {
                e.exit = exit;
                return e;
            }
            _ = poll.tick(), if watching => {
                if ready_file.exists() {
                    ready_at = Some(tokio::time::Instant::now());
                }
                continue;
            }
            _ = sleep_until_opt(next) => {
                if e.term_at.is_some() {
                    if let Err(err) = child.start_kill() {
                        tracing::warn!(error = %err, "cannot SIGKILL pwru");
                    }
                    e.kill_at = Some(SystemTime::now());
                    continue;
                }
                if ready_at.is_some() || ready_file.exists() {
                    StopCause::Deadline
                } else {
                    StopCause::AttachTimeout
                }
            }
            _ = stop.notified(), if e.term_at.is_none() => StopCause::Requested,
        };
        // Checked before signalling: the question is whether pwru was attached when we
        // decided to stop it, not whether it created the file on its way out.
        e.ready_before_term = ready_at.is_some() || ready_file.exists();
        e.cause = Some(term_cause);
        e.term_at = Some(terminate(child));
        kill_deadline = Some(tokio::time::Instant::now() + limits.kill_grace());
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGTERM pwru (it detaches its probes and exits 0 on it).
fn terminate(child: &Child) -> SystemTime {
    // `id()` is None only once the child has been reaped, and we have not reaped it yet.
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGTERM) {
            tracing::warn!(pid, error = %e, "cannot SIGTERM pwru");
        }
    }
    SystemTime::now()
}

async fn join_or_abort(task: JoinHandle<()>) {
    let abort = task.abort_handle();
    if tokio::time::timeout(DRAIN_TIMEOUT, task).await.is_err() {
        abort.abort();
        tracing::warn!("pwru's output pipes stayed open after it exited; stopped reading");
    }
}

#[derive(Debug, Default)]
struct LineCounts {
    read: AtomicU64,
    unparsed: AtomicU64,
}

/// Read stdout line by line, parse and deliver each. Lines past `limit` (pwru stops by
/// itself there) are read and dropped so a misbehaving pwru cannot flood the incident.
async fn read_stdout<R: AsyncBufRead + Unpin>(
    mut out: R,
    sink: mpsc::Sender<PwruLine>,
    counts: Arc<LineCounts>,
    limit: u64,
) {
    let mut buf = Vec::new();
    let mut sink = Some(sink);
    let mut seq = 0u64;
    loop {
        match read_line_bounded(&mut out, &mut buf).await {
            Ok(false) | Err(_) => break,
            Ok(true) => {}
        }
        if seq >= limit {
            continue;
        }
        let raw = String::from_utf8_lossy(&buf).into_owned();
        let line = PwruLine::new(seq, SystemTime::now(), raw);
        seq += 1;
        counts.read.fetch_add(1, Ordering::Relaxed);
        if line.event.is_none() {
            counts.unparsed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(s) = &sink {
            if s.send(line).await.is_err() {
                // Nobody listens any more; keep draining so pwru is never blocked on us.
                sink = None;
            }
        }
    }
}

/// Read one line into `buf` (without the newline, `\r` trimmed, at most
/// [`MAX_LINE_BYTES`]; the rest of a longer line is discarded). False at end of stream.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<bool> {
    buf.clear();
    let mut any = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(any);
        }
        any = true;
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        r.consume(used);
        if done {
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return Ok(true);
        }
    }
}

/// Decide the session's state from how pwru ended.
fn classify(
    status: &SessionStatus,
    exit: ExitStatus,
    ready_in_time: bool,
    cause: Option<StopCause>,
    limits: super::request::SessionLimits,
    last_error: Option<&str>,
) -> (SessionState, String) {
    let lines = status.lines_captured;
    let how = match (exit.code(), exit.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown exit".to_owned(),
    };
    let err = last_error.map(|e| format!(": {e}")).unwrap_or_default();
    let attach = &status.attach;
    if attach.all_ignored() {
        return (
            SessionState::Failed,
            format!(
                "pwru attached with all {} functions ignored (no usable kprobes), so it traced nothing; {how}",
                attach.attempted.unwrap_or(0)
            ),
        );
    }
    let killed = status.sigkill.is_some().then(|| {
        format!(
            "it ignored SIGTERM for {} and was killed",
            humantime::format_duration(limits.kill_grace())
        )
    });
    // Not ready first: a pwru still attaching when stopped is slow, whatever it did with
    // the SIGTERM that stopped it.
    if !ready_in_time {
        return match cause {
            Some(StopCause::AttachTimeout | StopCause::Deadline) => (
                SessionState::NotReady,
                format!(
                    "pwru was not ready (probes not attached) within the {} attach timeout, \
                     so it traced nothing; {}",
                    humantime::format_duration(limits.attach_timeout()),
                    killed.unwrap_or_else(|| format!("stopped with SIGTERM, {how}"))
                ),
            ),
            Some(StopCause::Requested) => (
                SessionState::Failed,
                format!("stopped by tailtrap before pwru was ready; {how}"),
            ),
            None => (
                SessionState::Failed,
                format!("pwru failed to start: it ended with {how} before becoming ready{err}"),
            ),
        };
    }
    if let Some(killed) = killed {
        return (
            SessionState::Timeout,
            format!("pwru traced, then {killed}; {lines} lines captured"),
        );
    }
    if exit.code() != Some(0) {
        return (SessionState::Failed, format!("pwru ended with {how}{err}"));
    }
    let reason = match cause {
        Some(StopCause::Deadline | StopCause::AttachTimeout) => format!(
            "traced for the {} deadline after attaching; pwru stopped cleanly on SIGTERM \
             after {lines} lines",
            humantime::format_duration(limits.deadline())
        ),
        Some(StopCause::Requested) => {
            format!("stopped by tailtrap; pwru exited cleanly after {lines} lines")
        }
        None => format!(
            "pwru exited by itself after {lines} lines (output limit {})",
            limits.output_limit_lines()
        ),
    };
    (SessionState::Ok, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_lines() {
        let mut input: &[u8] = b"a\r\nbb\n\nlast-without-newline";
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while read_line_bounded(&mut input, &mut buf).await.unwrap() {
            got.push(String::from_utf8(buf.clone()).unwrap());
        }
        assert_eq!(got, ["a", "bb", "", "last-without-newline"]);

        let long = vec![b'x'; MAX_LINE_BYTES * 2];
        let mut data = long.clone();
        data.extend_from_slice(b"\nnext\n");
        let mut input: &[u8] = &data;
        assert!(read_line_bounded(&mut input, &mut buf).await.unwrap());
        assert_eq!(buf.len(), MAX_LINE_BYTES);
        assert!(read_line_bounded(&mut input, &mut buf).await.unwrap());
        assert_eq!(buf, b"next");
    }

    #[test]
    fn command_row_is_shell_quoted() {
        let argv = [
            "pwru",
            "--filter-func",
            "^(a|b)$",
            "tcp and port 1",
            "it's",
            "/r/x.ready",
        ]
        .map(String::from);
        assert_eq!(
            shell_words(&argv),
            r"pwru --filter-func '^(a|b)$' 'tcp and port 1' 'it'\''s' /r/x.ready"
        );
    }

    #[test]
    fn state_names_match_serde() {
        for s in [
            SessionState::Ok,
            SessionState::Failed,
            SessionState::Timeout,
            SessionState::SkippedCooldown,
            SessionState::SkippedBusy,
            SessionState::Unavailable,
        ] {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.name())
            );
        }
    }
}
