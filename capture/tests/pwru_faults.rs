//! A pwru that misbehaves (tests/fake-pwru/pwru's crash, flood, garbage and silent-hang
//! modes): every session ends in a clear state with a reason, its process is reaped, and
//! the manager runs the next session normally. The daemon-level check (a flooding pwru
//! during an incident while intervals keep time) is in tests/tests/faults.rs.
#![allow(clippy::unwrap_used)] // tests: a failed setup step should panic right there

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use capture::pwru::{
    ManagerConfig, PcapFilter, Protocol, PwruLine, SessionLimits, SessionManager, SessionRequest,
    SessionState, SessionStatus,
};

mod common;
use common::{fake_pwru, run_collecting};

/// A scratch directory with a `pwru` wrapper running the stand-in in `mode`; it writes its
/// pid (the wrapper execs, so it is the stand-in's).
struct Rig {
    dir: tempfile::TempDir,
}

impl Rig {
    fn new(mode: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "#!/bin/sh\necho $$ >'{}'\nexport FAKE_PWRU_MODE={mode}\n\
             export FAKE_PWRU_STARTUP=0.2\nexec '{}' \"$@\"\n",
            dir.path().join("pid").display(),
            fake_pwru().display(),
        );
        let wrapper = dir.path().join("pwru");
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Rig { dir }
    }

    fn manager(&self) -> SessionManager {
        // Kept for fields added later.
        #[allow(clippy::needless_update)]
        let config = ManagerConfig {
            runtime_dir: self.dir.path().join("run"),
            cooldown: Duration::ZERO,
            ..ManagerConfig::default()
        };
        SessionManager::new(self.dir.path().join("pwru"), config)
    }

    /// Whether the stand-in's process is gone (reaped, not a zombie).
    fn process_gone(&self) -> bool {
        let pid = std::fs::read_to_string(self.dir.path().join("pid")).unwrap();
        !Path::new(&format!("/proc/{}", pid.trim())).exists()
    }
}

fn request(deadline: Duration, grace: Duration, limit: u64) -> SessionRequest {
    let peer: IpAddr = "127.0.0.1".parse().unwrap();
    let filter = PcapFilter::new(Protocol::Tcp, &[9000], &[peer]).unwrap();
    SessionRequest::new("web", filter)
        .with_limits(SessionLimits::new(deadline, grace, limit).unwrap())
}

/// Run a session, collecting its lines; also how long it took.
async fn run(
    mgr: &SessionManager,
    req: SessionRequest,
) -> (SessionStatus, Vec<PwruLine>, Duration) {
    let start = Instant::now();
    let (status, lines) = run_collecting(mgr, req).await;
    (status, lines, start.elapsed())
}

/// After a fault, the same manager runs a normal session to its end.
async fn next_session_is_normal(mgr: &SessionManager) {
    // The rig's mode is fixed; a session stopped right away shows the manager is free and
    // reaps again: not busy, a terminal state.
    let (st, _, took) = run(
        mgr,
        request(Duration::from_millis(300), Duration::from_secs(1), 1),
    )
    .await;
    assert_ne!(st.state, SessionState::SkippedBusy, "{st:#?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[tokio::test]
async fn a_crashing_pwru_is_a_failed_session_with_its_signal() {
    let rig = Rig::new("crash");
    let mgr = rig.manager();
    let (st, lines, _) = run(
        &mgr,
        request(Duration::from_secs(20), Duration::from_secs(5), 1000),
    )
    .await;
    eprintln!("crash: {:?} {:?}: {}", st.state, st.signal, st.reason);
    assert_eq!(st.state, SessionState::Failed, "{st:#?}");
    assert_eq!(st.signal, Some(11), "{st:#?}");
    assert!(!st.reason.is_empty());
    assert_eq!(lines.len(), 3);
    assert!(rig.process_gone());
    next_session_is_normal(&mgr).await;
}

#[tokio::test]
async fn a_flooding_pwru_delivers_no_more_than_the_output_limit() {
    let rig = Rig::new("flood");
    let mgr = rig.manager();
    let limit = 500;
    let deadline = Duration::from_secs(4);
    let (st, lines, took) = run(&mgr, request(deadline, Duration::from_secs(5), limit)).await;
    eprintln!(
        "flood: {:?} after {took:?}, {} lines captured, {} delivered: {}",
        st.state,
        st.lines_captured,
        lines.len(),
        st.reason
    );
    assert!(
        matches!(st.state, SessionState::Ok | SessionState::Timeout),
        "{st:#?}"
    );
    assert!(!st.reason.is_empty());
    // Nothing past the limit reaches the store, however fast pwru prints; a pwru that
    // ignores its own --output-limit-lines runs (drained) until the deadline stops it.
    assert!(lines.len() as u64 <= limit, "{}", lines.len());
    assert!(took < deadline + Duration::from_secs(10), "{took:?}");
    assert!(rig.process_gone());
    next_session_is_normal(&mgr).await;
}

#[tokio::test]
async fn a_pwru_printing_garbage_keeps_the_lines_raw_and_counts_them_unparsed() {
    let rig = Rig::new("garbage");
    let mgr = rig.manager();
    let (st, lines, _) = run(
        &mgr,
        request(Duration::from_secs(2), Duration::from_secs(5), 1000),
    )
    .await;
    eprintln!(
        "garbage: {:?}, {} lines, {} unparsed: {}",
        st.state,
        lines.len(),
        st.lines_unparsed,
        st.reason
    );
    assert!(!lines.is_empty());
    assert!(lines.iter().all(|l| l.event.is_none() && l.error.is_some()));
    assert_eq!(st.lines_unparsed, st.lines_captured, "{st:#?}");
    assert!(!st.reason.is_empty());
    assert!(rig.process_gone());
    next_session_is_normal(&mgr).await;
}

#[tokio::test]
async fn a_silent_hanging_pwru_is_killed_at_the_deadline() {
    let rig = Rig::new("silent-hang");
    let mgr = rig.manager();
    let grace = Duration::from_millis(500);
    let (st, lines, took) = run(&mgr, request(Duration::from_secs(2), grace, 1000)).await;
    eprintln!("silent-hang: {:?} after {took:?}: {}", st.state, st.reason);
    assert_eq!(st.state, SessionState::Timeout, "{st:#?}");
    assert_eq!(st.signal, Some(9));
    assert!(lines.is_empty());
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(rig.process_gone());
    next_session_is_normal(&mgr).await;
}
