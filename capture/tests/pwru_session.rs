//! The session manager driven against the pwru stand-in (tests/fake-pwru/pwru), one test
//! per way a real pwru session ends. The stand-in honours pwru 1.0.12's CLI and replays
//! real captures, so argv, stdout and stderr handling are exercised end to end.
#![allow(clippy::unwrap_used)] // tests: a failed setup step should panic right there

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capture::pwru::{
    FilterFuncs, ManagerConfig, NetnsFilter, PcapFilter, Prerequisites, Protocol, SessionLimits,
    SessionManager, SessionRequest, SessionState, SessionStatus,
};
use tokio::sync::mpsc;

mod common;
use common::{fake_pwru, run_collecting};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/pwru")
        .join(name)
}

/// A scratch directory with a `pwru` wrapper that runs the stand-in in `mode` (set per
/// wrapper, so parallel tests do not share environment variables), logs its argv and
/// writes its pid (the wrapper execs, so it is the stand-in's).
struct Rig {
    dir: tempfile::TempDir,
}

impl Rig {
    fn new(mode: &str, fixture: &str) -> Rig {
        Rig::new_in(mode, fixture, &std::env::temp_dir(), "")
    }

    /// `extra` is more shell `export` lines for the stand-in.
    fn new_in(mode: &str, fixture: &str, parent: &Path, extra: &str) -> Rig {
        let dir = tempfile::tempdir_in(parent).unwrap();
        let wrapper = dir.path().join("pwru");
        let script = format!(
            "#!/bin/sh\necho $$ >'{}'\nexport FAKE_PWRU_MODE={mode}\nexport FAKE_PWRU_FIXTURE='{}'\n\
             export FAKE_PWRU_STARTUP=0.2\nexport FAKE_PWRU_LINE_DELAY=0.002\n\
             export FAKE_PWRU_ARGV_LOG='{}'\n{extra}exec '{}' \"$@\"\n",
            dir.path().join("pid").display(),
            testdata(fixture).display(),
            dir.path().join("argv.log").display(),
            fake_pwru().display(),
        );
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Rig { dir }
    }

    fn manager(&self) -> SessionManager {
        SessionManager::new(self.dir.path().join("pwru"), self.config())
    }

    fn config(&self) -> ManagerConfig {
        ManagerConfig {
            runtime_dir: self.dir.path().join("run"),
            ..ManagerConfig::default()
        }
    }

    fn argv_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("argv.log"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The kill grace of most tests: the stand-in (bash) handles SIGTERM in milliseconds on an
/// idle machine, but a busy one can take seconds to run it, and only
/// `hang_on_term_is_killed_and_reaped` is about the kill.
const GRACE: Duration = Duration::from_secs(20);

/// A deadline for sessions that are meant to reach it with the stand-in attached: its
/// start takes 0.2 s here, but seconds on a busy machine.
const DEADLINE_MS: u64 = 5_000;

fn request(service: &str, port: u16, deadline_ms: u64, limit: u64) -> SessionRequest {
    request_with_grace(service, port, deadline_ms, limit, GRACE)
}

fn request_with_grace(
    service: &str,
    port: u16,
    deadline_ms: u64,
    limit: u64,
    grace: Duration,
) -> SessionRequest {
    let peer: IpAddr = "127.0.0.1".parse().unwrap();
    let filter = PcapFilter::new(Protocol::Tcp, &[port], &[peer]).unwrap();
    SessionRequest::new(service, filter)
        .with_limits(SessionLimits::new(Duration::from_millis(deadline_ms), grace, limit).unwrap())
}

fn no_progress_bars(status: &SessionStatus) {
    assert!(
        status.stderr_tail.iter().all(|l| !l.contains("p/s")),
        "{:#?}",
        status.stderr_tail
    );
}

#[tokio::test]
async fn ok_stops_at_output_limit() {
    let rig = Rig::new("ok", "tcpmeta612.jsonl");
    let mgr = rig.manager();
    let (st, lines) = run_collecting(&mgr, request("web", 9000, 20_000, 5)).await;
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    assert_eq!(
        st.reason,
        "pwru exited by itself after 5 lines (output limit 5)"
    );
    assert_eq!((st.exit_code, st.signal), (Some(0), None));
    assert_eq!((st.lines_captured, st.lines_unparsed), (5, 0));
    assert!(st.ready.is_some() && st.sigterm.is_none() && st.sigkill.is_none());
    assert!(st.started <= st.ready && st.ready <= st.ended);
    assert_eq!(st.attach.ignored, Some(0));
    let rows = st.rows();
    assert_eq!(rows[0], ("state", "ok".to_owned()));
    assert_eq!(rows[2], ("exit", "exit status 0".to_owned()));
    assert!(rows[4].1.contains("(+"), "ready row {:?}", rows[4]);
    assert_eq!(rows[5], ("SIGTERM", "-".to_owned()));
    assert_eq!(rows[8], ("lines", "5 (0 unparsed)".to_owned()));
    assert!(
        rows[9]
            .1
            .ends_with(" --filter-track-skb 'tcp and dst port 9000 and src host 127.0.0.1'"),
        "{}",
        rows[9].1
    );
    assert!(st
        .stderr_tail
        .iter()
        .any(|l| l.ends_with("INFO Printed events, exiting program.. count=5")));
    no_progress_bars(&st);

    // The lines arrive in order, raw and parsed, exactly as in the capture.
    let fixture = std::fs::read_to_string(testdata("tcpmeta612.jsonl")).unwrap();
    let expected: Vec<&str> = fixture.lines().take(5).collect();
    let raws: Vec<&str> = lines.iter().map(|l| l.raw.as_str()).collect();
    assert_eq!(raws, expected);
    assert_eq!(
        lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    let first = lines[0].event.as_ref().unwrap();
    assert_eq!(first.func, "ip_rcv_core");
    assert_eq!(first.caller.as_deref(), Some("ip_rcv"));
    assert_eq!(first.time_ns, Some(65717667547));
    assert_eq!(first.tuple.as_ref().unwrap().dport, 9000);

    // The stand-in received exactly the argv the status reports, and no ready file is left.
    assert_eq!(rig.argv_log(), st.argv[1..]);
    assert_eq!(
        st.argv.last().map(String::as_str),
        Some("tcp and dst port 9000 and src host 127.0.0.1")
    );
    assert_eq!(
        std::fs::read_dir(rig.dir.path().join("run"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn ok_stops_at_deadline_with_sigterm() {
    let rig = Rig::new("ok", "udpmeta612.jsonl");
    let (st, lines) = run_collecting(&rig.manager(), request("dns", 9001, DEADLINE_MS, 5000)).await;
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    assert!(
        st.reason
            .starts_with("traced for the 5s deadline after attaching; pwru stopped cleanly on SIGTERM after 15 lines"),
        "{}",
        st.reason
    );
    assert_eq!(st.exit_code, Some(0));
    assert!(st.sigterm.is_some() && st.sigkill.is_none());
    assert_eq!(lines.len(), 15);
    assert_eq!(st.lines_captured, 15);
    let last = st.stderr_tail.last().unwrap();
    assert!(last.ends_with("INFO Detaching kprobes..."), "{last}");
    no_progress_bars(&st);
}

#[tokio::test]
async fn all_ignored_is_failed_despite_exit_0() {
    let rig = Rig::new("all-ignored", "tcp612.jsonl");
    let req = request("web", 9000, DEADLINE_MS, 100).with_filter_funcs(
        FilterFuncs::new(["tcp_v4_rcv", "tcp_queue_rcv", "udp_rcv", "tcp_data_queue"]).unwrap(),
    );
    let (st, lines) = run_collecting(&rig.manager(), req).await;
    assert_eq!(st.state, SessionState::Failed, "{st:#?}");
    assert_eq!(st.exit_code, Some(0));
    assert!(st.ready.is_some());
    assert!(st.attach.all_ignored());
    // Four functions pwru selects (on any kernel with BTF); all reported ignored.
    assert_eq!((st.attach.attempted, st.attach.ignored), (Some(4), Some(4)));
    assert_eq!(st.attach.backend.as_deref(), Some("kprobe"));
    assert!(
        st.reason
            .starts_with("pwru attached with all 4 functions ignored"),
        "{}",
        st.reason
    );
    assert!(lines.is_empty());
}

#[tokio::test]
async fn all_ignored_without_progress_bar() {
    let parent = tempfile::tempdir().unwrap();
    let rig = Rig::new_in(
        "all-ignored",
        "tcp612.jsonl",
        parent.path(),
        "export FAKE_PWRU_NO_BAR=1\n",
    );
    let req = request("web", 9000, DEADLINE_MS, 100)
        .with_filter_funcs(FilterFuncs::new(["tcp_v4_rcv", "tcp_queue_rcv", "udp_rcv"]).unwrap());
    let (st, _) = run_collecting(&rig.manager(), req).await;
    assert_eq!(st.state, SessionState::Failed, "{st:#?}");
    assert_eq!((st.attach.attempted, st.attach.ignored), (Some(3), Some(3)));
    assert!(st
        .stderr_tail
        .iter()
        .any(|l| l.ends_with("INFO Attached ignored=3")));
}

#[tokio::test]
async fn no_kprobes_fails_to_start() {
    let rig = Rig::new("no-kprobes", "tcp612.jsonl");
    let (st, lines) = run_collecting(&rig.manager(), request("web", 9000, 5000, 100)).await;
    assert_eq!(st.state, SessionState::Failed, "{st:#?}");
    assert_eq!(st.exit_code, Some(1));
    assert_eq!(st.ready, None);
    assert_eq!(
        st.reason,
        "pwru failed to start: it ended with exit status 1 before becoming ready: \
         ERROR Failed to run pwru error=\"Cannot find a matching kernel function\""
    );
    assert_eq!(st.stderr_tail.len(), 2);
    assert!(lines.is_empty());
    assert!(st.sigterm.is_none());
}

#[tokio::test]
async fn bad_filter_fails_to_start() {
    let rig = Rig::new("bad-filter", "tcp612.jsonl");
    let (st, _) = run_collecting(&rig.manager(), request("web", 9000, 5000, 100)).await;
    assert_eq!(st.state, SessionState::Failed, "{st:#?}");
    assert_eq!(st.exit_code, Some(1));
    assert!(
        st.reason
            .contains("pcap_compile 'tcp and dst port 9000 and src host 127.0.0.1'"),
        "{}",
        st.reason
    );
}

#[tokio::test]
async fn hang_on_term_is_killed_and_reaped() {
    let rig = Rig::new("hang-on-term", "tcp612.jsonl");
    let req = request_with_grace("web", 9000, DEADLINE_MS, 5000, Duration::from_millis(500));
    let (st, lines) = run_collecting(&rig.manager(), req).await;
    assert_eq!(st.state, SessionState::Timeout, "{st:#?}");
    assert_eq!((st.exit_code, st.signal), (None, Some(9)));
    assert!(st.sigterm.is_some() && st.sigkill.is_some());
    assert!(st.sigterm < st.sigkill);
    let rows = st.rows();
    assert_eq!(rows[2], ("exit", "signal 9".to_owned()));
    assert!(rows[6].1.contains("(+"), "SIGKILL row {:?}", rows[6]);
    assert_eq!(
        st.reason,
        format!(
            "pwru traced, then it ignored SIGTERM for 500ms and was killed; {} lines captured",
            lines.len()
        )
    );
    assert!(!lines.is_empty());
    assert!(st
        .stderr_tail
        .iter()
        .any(|l| l.ends_with("INFO Received signal, exiting program..")));
}

#[tokio::test]
async fn not_ready_by_the_attach_timeout_is_not_ready() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    // Startup takes 0.2 s in the stand-in; a 100 ms attach timeout stops it mid-attach,
    // where pwru still creates its ready file (early612.stderr) but too late to count. The
    // deadline (tracing time) is long and plays no part.
    let mut req = request("web", 9000, DEADLINE_MS, 5000);
    let limits = req
        .limits()
        .with_attach_timeout(Duration::from_millis(100))
        .unwrap();
    req = req.with_limits(limits);
    let (st, lines) = run_collecting(&rig.manager(), req).await;
    assert_eq!(st.state, SessionState::NotReady, "{st:#?}");
    // How the stand-in ends depends on whether its SIGTERM handler was installed yet when
    // the signal came (a busy machine starts bash slowly): both are a clean stop.
    let prefix = "pwru was not ready (probes not attached) within the 100ms attach timeout, so \
                  it traced nothing; stopped with SIGTERM, ";
    assert!(
        st.reason == format!("{prefix}exit status 0") || st.reason == format!("{prefix}signal 15"),
        "{}",
        st.reason
    );
    // The stand-in creates its ready file on the way out; too late to count.
    assert_eq!(st.ready, None);
    assert!(lines.is_empty());
}

/// Finding 3 of issue 9: a pwru still attaching at the timeout that then ignores SIGTERM
/// is reported as not ready (what happened first), with the kill said too.
#[tokio::test]
async fn slow_attach_then_ignored_sigterm_is_not_ready() {
    let parent = tempfile::tempdir().unwrap();
    let rig = Rig::new_in(
        "hang-on-term",
        "tcp612.jsonl",
        parent.path(),
        "export FAKE_PWRU_STARTUP=30\n",
    );
    let mut req = request_with_grace("web", 9000, DEADLINE_MS, 5000, Duration::from_millis(500));
    let limits = req
        .limits()
        // Long enough for the stand-in to install its SIGTERM-ignoring handler on a busy
        // machine; pwru itself stays unready for 30 s.
        .with_attach_timeout(Duration::from_secs(3))
        .unwrap();
    req = req.with_limits(limits);
    let (st, lines) = run_collecting(&rig.manager(), req).await;
    assert_eq!(st.state, SessionState::NotReady, "{st:#?}");
    assert_eq!(
        st.reason,
        "pwru was not ready (probes not attached) within the 3s attach timeout, so it \
         traced nothing; it ignored SIGTERM for 500ms and was killed"
    );
    assert!(st.sigkill.is_some() && lines.is_empty());
}

/// The deadline is tracing time: it counts from readiness, not from the start.
#[tokio::test]
async fn the_deadline_counts_from_readiness() {
    let parent = tempfile::tempdir().unwrap();
    let rig = Rig::new_in(
        "ok",
        "udpmeta612.jsonl",
        parent.path(),
        "export FAKE_PWRU_STARTUP=1.5\nexport FAKE_PWRU_LINE_DELAY=0.05\n",
    );
    // Attaching takes 1.5 s, longer than the 1 s deadline: with the deadline counted from
    // the start it would end not ready.
    let (st, lines) = run_collecting(&rig.manager(), request("dns", 9001, 1_000, 5000)).await;
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    let (ready, term) = (st.ready.unwrap(), st.sigterm.unwrap());
    let traced = term.duration_since(ready).unwrap();
    assert!(traced >= Duration::from_millis(900), "{traced:?}");
    assert!(!lines.is_empty());
}

/// A pwru file that is open for writing when the session starts (an operator's `cp` over
/// it, or a child forked by another thread of this very test process while a wrapper was
/// written) makes exec fail with ETXTBSY for a moment; the check and the start wait it out.
#[tokio::test]
async fn a_binary_briefly_open_for_writing_still_starts() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    let bin = rig.dir.path().join("pwru");
    let writer = std::fs::OpenOptions::new().write(true).open(&bin).unwrap();
    let release = |writer: std::fs::File| {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            drop(writer);
        })
    };
    let released = release(writer);
    let checked = Prerequisites::check(Some(&bin)).await;
    assert!(
        !checked.summary.starts_with("bad binary"),
        "{}",
        checked.summary
    );
    released.join().unwrap();

    let writer = std::fs::OpenOptions::new().write(true).open(&bin).unwrap();
    let released = release(writer);
    let (st, _) = run_collecting(&rig.manager(), request("web", 9000, DEADLINE_MS, 5)).await;
    released.join().unwrap();
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
}

/// Issue 9, finding 4: a failed start-up check is repeated when a session is requested, so
/// one `--version` that timed out does not disable pwru for the daemon's life.
#[tokio::test]
async fn a_failed_prerequisite_check_is_repeated_at_the_next_request() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    let mut stale = Prerequisites::check(Some(&rig.dir.path().join("pwru"))).await;
    let fresh_summary = stale.summary.clone();
    stale.status = capture::pwru::PrereqStatus::BadBinary;
    stale.summary = "bad-binary: `pwru --help` gave no answer within 5s".to_owned();
    let config = ManagerConfig {
        prereq_recheck: Duration::ZERO,
        ..rig.config()
    };
    let mgr = SessionManager::from_prerequisites(&stale, config);
    let (st, _) = run_collecting(&mgr, request("web", 9000, DEADLINE_MS, 5)).await;
    if fresh_summary.starts_with("usable") {
        // A host where pwru can run: the new check lets the session through.
        assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    } else {
        // This host lacks something else (kprobes, root): the reason is the new check's.
        assert_eq!(st.state, SessionState::Unavailable, "{st:#?}");
        assert_eq!(st.reason, fresh_summary);
    }
    // With the default interval the stale verdict stands until a minute has passed.
    let mgr = SessionManager::from_prerequisites(&stale, rig.config());
    let (st, _) = run_collecting(&mgr, request("web", 9000, DEADLINE_MS, 5)).await;
    assert_eq!(st.reason, stale.summary);
}

/// A session asked for is busy before its task claims the slot, and a reservation does
/// not make its own session skip.
#[tokio::test]
async fn a_reserved_session_is_busy_before_it_runs() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    let mgr = rig.manager();
    assert!(!mgr.is_busy());
    let reservation = mgr.reserve();
    assert!(mgr.is_busy(), "asked for, not started yet");
    let (st, _) = run_collecting(&mgr, request("web", 9000, DEADLINE_MS, 5)).await;
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    assert!(mgr.is_busy(), "still reserved until its owner drops it");
    drop(reservation);
    assert!(!mgr.is_busy());
}

#[tokio::test]
async fn one_at_a_time_and_close() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    let mgr = rig.manager();
    let first = {
        let mgr = mgr.clone();
        tokio::spawn(async move { run_collecting(&mgr, request("web", 9000, 60_000, 5000)).await })
    };
    // Once it has attached (its ready file exists), try a second session for another
    // service.
    let run_dir = rig.dir.path().join("run");
    let attached = tokio::time::timeout(Duration::from_secs(30), async {
        while !std::fs::read_dir(&run_dir).is_ok_and(|mut d| d.next().is_some()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(attached.await.is_ok(), "the first session never attached");
    assert!(mgr.is_busy());
    let (busy, _) = run_collecting(&mgr, request("api", 8080, 5000, 10)).await;
    assert_eq!(busy.state, SessionState::SkippedBusy);
    assert_eq!(busy.reason, "the pwru session for \"web\" is still running");
    assert!(busy.argv.is_empty() && busy.started.is_none());

    assert!(mgr.close());
    let (st, lines) = first.await.unwrap();
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    assert_eq!(
        st.reason,
        format!(
            "stopped by tailtrap; pwru exited cleanly after {} lines",
            lines.len()
        )
    );
    assert!(!mgr.is_busy());
    assert!(!mgr.close());
}

/// A session asked for just before a shutdown must not start pwru after it.
#[tokio::test]
async fn a_closed_manager_starts_no_session() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    let mgr = rig.manager();
    let reservation = mgr.reserve();
    assert!(!mgr.close(), "nothing was running yet");
    let (st, lines) = run_collecting(&mgr, request("web", 9000, DEADLINE_MS, 5)).await;
    assert_eq!(st.state, SessionState::Unavailable, "{st:#?}");
    assert_eq!(st.reason, "tailtrap is stopping: no new pwru session");
    assert!(st.argv.is_empty() && st.started.is_none() && lines.is_empty());
    drop(reservation);
    assert!(!mgr.is_busy());
}

#[tokio::test]
async fn cooldown_is_per_service() {
    let rig = Rig::new("ok", "tcp612.jsonl");
    let mgr = rig.manager();
    let (st, _) = run_collecting(&mgr, request("web", 9000, 5000, 2)).await;
    assert_eq!(st.state, SessionState::Ok);
    let (again, _) = run_collecting(&mgr, request("web", 9000, 5000, 2)).await;
    assert_eq!(again.state, SessionState::SkippedCooldown);
    // How long ago depends on how fast the machine ran the first session.
    assert!(
        again
            .reason
            .starts_with("cooldown: the last session for \"web\" started ")
            && again.reason.contains(" ago; next allowed in 9m"),
        "{}",
        again.reason
    );
    let (other, _) = run_collecting(&mgr, request("api", 8080, 5000, 2)).await;
    assert_eq!(other.state, SessionState::Ok);

    // A zero cooldown lets the same service run again at once.
    let mgr = SessionManager::new(
        rig.dir.path().join("pwru"),
        ManagerConfig {
            cooldown: Duration::ZERO,
            ..rig.config()
        },
    );
    for _ in 0..2 {
        assert_eq!(
            run_collecting(&mgr, request("web", 9000, 5000, 2))
                .await
                .0
                .state,
            SessionState::Ok
        );
    }
}

#[tokio::test]
async fn unavailable_on_this_kernel() {
    // The real prerequisite check on this host, with the stand-in as binary.
    let prereq = Prerequisites::check(Some(&fake_pwru())).await;
    let rig = Rig::new("ok", "tcp612.jsonl");
    let mgr = SessionManager::from_prerequisites(&prereq, rig.config());
    let (st, lines) = run_collecting(&mgr, request("web", 9000, 5000, 2)).await;
    if prereq.is_usable() {
        assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    } else {
        assert_eq!(st.state, SessionState::Unavailable);
        assert_eq!(st.reason, prereq.summary);
        assert!(lines.is_empty() && st.argv.is_empty());
    }
}

#[tokio::test]
async fn missing_binary_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mgr = SessionManager::new(
        dir.path().join("no-such-pwru"),
        ManagerConfig {
            runtime_dir: dir.path().join("run"),
            ..ManagerConfig::default()
        },
    );
    let (st, _) = run_collecting(&mgr, request("web", 9000, 5000, 2)).await;
    assert_eq!(st.state, SessionState::Failed);
    assert!(st.reason.starts_with("cannot start "), "{}", st.reason);
    assert!(
        st.reason.contains("No such file or directory"),
        "{}",
        st.reason
    );
    assert!(!mgr.is_busy());
}

#[tokio::test]
async fn output_is_drained_when_nobody_listens() {
    let rig = Rig::new("ok", "tcp61.jsonl");
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    let st = rig
        .manager()
        .run(request("web", 9000, 20_000, 52), tx)
        .await;
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    assert_eq!(st.lines_captured, 52);
}

#[tokio::test]
async fn netns_and_functions_reach_pwru() {
    let rig = Rig::new("ok", "udp61.jsonl");
    let filter = PcapFilter::new(Protocol::Udp, &[9001, 53], &[]).unwrap();
    let req = SessionRequest::new("dns", filter)
        .with_netns(NetnsFilter::of_pid(std::process::id()))
        .with_filter_funcs(FilterFuncs::new(["udp_rcv", "skb_consume_udp"]).unwrap())
        .with_limits(
            SessionLimits::new(Duration::from_secs(10), Duration::from_secs(1), 3).unwrap(),
        );
    let (st, lines) = run_collecting(&rig.manager(), req.clone()).await;
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    assert_eq!(lines.len(), 3);
    let log = rig.argv_log();
    let ready = log[4].clone();
    assert!(ready.starts_with(&rig.dir.path().join("run").display().to_string()));
    // pwru gets the request's argv as built (request.rs's argv tests pin its every word),
    // with the session's own ready file.
    let expected: Vec<String> = req
        .argv(Path::new(&ready))
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(log, expected);
    let after = |flag: &str| {
        let at = log.iter().position(|a| a == flag)?;
        log.get(at + 1).map(String::as_str)
    };
    assert_eq!(after("--filter-func"), Some("^(udp_rcv|skb_consume_udp)$"));
    let netns = format!("/proc/{}/ns/net", std::process::id());
    assert_eq!(after("--filter-netns"), Some(netns.as_str()));
    assert_eq!(
        log.last().map(String::as_str),
        Some("udp and (dst port 9001 or dst port 53)")
    );
    // The stand-in counts the functions it was given as attempted.
    assert_eq!(st.attach.attempted, Some(2));
}

#[tokio::test]
async fn every_capture_replays_and_parses() {
    let dir = std::fs::read_dir(testdata("")).unwrap();
    let mut files: Vec<PathBuf> = dir
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 10);
    for file in files {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let expected = std::fs::read_to_string(&file).unwrap();
        let n = expected.lines().count() as u64;
        let rig = Rig::new("ok", &name);
        let (st, lines) = run_collecting(&rig.manager(), request("web", 9000, 20_000, n)).await;
        assert_eq!(st.state, SessionState::Ok, "{name}: {st:#?}");
        assert_eq!((st.lines_captured, st.lines_unparsed), (n, 0), "{name}");
        for (l, raw) in lines.iter().zip(expected.lines()) {
            assert_eq!(l.raw, raw);
            let e = l
                .event
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: {:?}", l.error));
            assert!(e.skb > 0 && !e.func.is_empty());
            // The meta captures carry time and caller on every line, the others on none.
            assert_eq!(e.time_ns.is_some(), name.contains("meta"), "{name}: {raw}");
            assert_eq!(e.caller.is_some(), name.contains("meta"), "{name}: {raw}");
        }
    }
}

/// Set by `pwru_dies_with_tailtrap` for the child process it kills.
const ORPHAN_DIR_ENV: &str = "TAILTRAP_TEST_ORPHAN_DIR";

/// The "tailtrap" that gets SIGKILLed: `pwru_dies_with_tailtrap` run again as a child
/// process, with `ORPHAN_DIR_ENV` set. (Not a test of its own: an ignored one would run,
/// and fail, under `--include-ignored`.)
async fn session_in_doomed_process(dir: PathBuf) {
    // Inside the parent's directory, which the parent removes: this process dies uncleanly.
    // A pwru that prints nothing (no traffic): a closed pipe would not stop it either.
    let rig = Rig::new_in("all-ignored", "tcp612.jsonl", &dir, "");
    let mgr = SessionManager::new(
        rig.dir.path().join("pwru"),
        ManagerConfig {
            runtime_dir: dir.join("run"),
            ..ManagerConfig::default()
        },
    );
    // Tell the parent where the stand-in's pid will appear, then run until killed.
    std::fs::write(
        dir.join("rig"),
        rig.dir.path().as_os_str().as_encoded_bytes(),
    )
    .unwrap();
    let (st, _) = run_collecting(&mgr, request("web", 9000, 60_000, 5000)).await;
    panic!("the session should not have ended: {st:#?}");
}

/// If tailtrap is SIGKILLed mid-session (outside a systemd unit), pwru must not run on:
/// the parent-death signal delivers SIGTERM to it.
#[test]
fn pwru_dies_with_tailtrap() {
    if let Some(dir) = std::env::var_os(ORPHAN_DIR_ENV) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(session_in_doomed_process(PathBuf::from(dir)));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "pwru_dies_with_tailtrap", "--nocapture"])
        .env(ORPHAN_DIR_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready_dir = dir.path().join("run");
    let child_id = child.id();
    // Generous: starting a test binary and bash takes seconds on a busy machine.
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        for _ in 0..1500 {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_pid(child_id);
        panic!("gave up waiting for {what}");
    };
    // pwru is attached once its ready file exists.
    wait_for("the ready file", &|| {
        std::fs::read_dir(&ready_dir).is_ok_and(|mut d| d.next().is_some())
    });
    let rig = PathBuf::from(std::fs::read_to_string(dir.path().join("rig")).unwrap());
    let pid: i32 = std::fs::read_to_string(rig.join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));

    child.kill().unwrap();
    child.wait().unwrap();
    for _ in 0..1500 {
        if !alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_pid(pid.unsigned_abs());
    panic!("pwru (pid {pid}) still runs 30 s after tailtrap died");
}

fn kill_pid(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
    }
}

/// Running (not gone, not a zombie waiting for its new parent to reap it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The daemon runs at the unit's Nice=-5 to sample on time; pwru must not inherit that.
#[tokio::test]
#[ignore = "needs root (CAP_SYS_NICE to raise priority): run as root with --include-ignored"]
async fn pwru_runs_at_an_ordinary_priority_whatever_the_daemons() {
    let parent = tempfile::tempdir().unwrap();
    let nice_file = parent.path().join("nice");
    let rig = Rig::new_in(
        "ok",
        "tcpmeta612.jsonl",
        parent.path(),
        &format!("nice >'{}'\n", nice_file.display()),
    );
    // Linux keeps nice per thread, and this current-thread runtime spawns from this thread.
    // SAFETY: setpriority/getpriority on the calling thread; no memory involved.
    let before = unsafe {
        let before = nix::libc::getpriority(nix::libc::PRIO_PROCESS, 0);
        assert_eq!(nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, -5), 0);
        before
    };
    let (st, _) = run_collecting(&rig.manager(), request("web", 9000, 20_000, 5)).await;
    // SAFETY: as above.
    unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, before) };
    assert_eq!(st.state, SessionState::Ok, "{st:#?}");
    let nice = std::fs::read_to_string(&nice_file).unwrap();
    assert_eq!(nice.trim(), "0", "pwru's nice value");
}
