//! The real `tailtrap run` daemon as a child process, and the `tailtrap` CLI, for end-to-end
//! tests: a scratch directory for the config, database, socket and logs; a guard that
//! kills the daemon on drop; bounded polling that shows the daemon's log when it times out.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::bins::tailtrap_bin;
use crate::error::{Error, Result};

/// A `[detector]` table, as a string literal, that opens an incident within seconds: a
/// 2 s warm-up of 300 samples, 1 s windows of at least 40 samples growing to 4 s, closing
/// after 5 quiet windows, a 1 s cooldown. `min_delta` and `quantiles` (TOML text) are what
/// the test is about. A literal, so that a test can `concat!` more detector tables to it.
#[macro_export]
macro_rules! fast_detector {
    (min_delta = $min_delta:literal, quantiles = $quantiles:literal) => {
        concat!(
            "[detector]\nmin_delta = \"",
            $min_delta,
            "\"\nquantiles = ",
            $quantiles,
            r#"
warmup_time = "2s"
warmup_samples = 300
min_samples = 40
window = "1s"
max_window = "4s"
close_after = 5
cooldown = "1s"
"#
        )
    };
}

/// The `[detector]` table of the daemon tests that inject a 20 ms slow reader: fast
/// warm-up and windows so an incident opens within seconds ([`fast_detector!`]).
///
/// A shared test machine moves fast loopback reads by a millisecond now and then, so
/// `min_delta` is 5 ms. The 20 ms reader moves the body of the distribution; under qemu's
/// software emulation a quiet service's p99.9 (a handful of samples per window) jumps by tens
/// of ms on its own, so these tests watch the body quantiles (tail sensitivity is the
/// detector's own scenario tests).
pub const SLOW_READER_DETECTOR: &str = fast_detector!(min_delta = "5ms", quantiles = "[0.5, 0.9]");

/// How often [`Daemon::wait_for`] and [`Daemon::wait_exit`] look again.
const POLL: Duration = Duration::from_millis(200);

/// A directory under the system's temporary directory, emptied when created and removed
/// on drop: `tailtrap-e2e-<name>-<pid>`.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Create (or empty) the directory for `name`, unique to this test process.
    pub fn new(name: &str) -> Result<ScratchDir> {
        let dir = std::env::temp_dir().join(format!("tailtrap-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(Error::io(format!("cannot create {}", dir.display())))?;
        Ok(ScratchDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tailtrap run` process; killed (SIGKILL) and reaped on drop if still running.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Start `tailtrap run --config <config>` with `RUST_LOG=info` and the extra `env`;
    /// stdout is discarded, stderr (the log) goes to a new file in `dir`, readable while it
    /// runs through [`Daemon::log`].
    pub fn start(config: &Path, dir: &Path, env: &[(&str, &OsStr)]) -> Result<Daemon> {
        static STARTS: AtomicU64 = AtomicU64::new(0);
        let log = dir.join(format!(
            "daemon-{}.log",
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let stderr = std::fs::File::create(&log)
            .map_err(Error::io(format!("cannot create {}", log.display())))?;
        let child = Command::new(tailtrap_bin())
            .args(["run", "--config"])
            .arg(config)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(Error::io("cannot start `tailtrap run`"))?;
        Ok(Daemon { child, log })
    }

    /// Everything the daemon has logged so far (empty if the file cannot be read).
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (a zombie not reaped yet), without reaping it.
    fn exited(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())) {
            // The state follows the command name in parentheses, which may hold spaces.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            Err(_) => true,
        }
    }

    /// Send `signal` to the daemon.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        // Linux pids are at most 2^22.
        let pid = self.pid() as i32;
        kill(Pid::from_raw(pid), signal).map_err(|e| Error::Io {
            context: format!("cannot send {signal} to the daemon ({pid})"),
            source: e.into(),
        })
    }

    /// Whether the process has not exited yet (an exited one is reaped).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL the daemon and reap it.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        self.child
            .kill()
            .map_err(Error::io("cannot kill the daemon"))?;
        self.child
            .wait()
            .map_err(Error::io("cannot reap the daemon"))
    }

    /// Wait up to `timeout` for the daemon to exit; its exit status, `None` if it still
    /// runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(Error::io("cannot wait for the daemon"))?
            {
                return Ok(Some(status));
            }
            if start.elapsed() >= timeout {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// Poll `f` every 200 ms until it returns `Some`, and return that.
    ///
    /// # Panics
    /// When `timeout` passes first, naming `what` and showing the daemon's log.
    pub fn wait_for<T>(&self, timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
        poll_until(timeout, what, || self.log(), f)
    }

    /// Wait until `tailtrap status --json --config <config>` succeeds through the daemon's
    /// API (not from the database).
    ///
    /// # Panics
    /// When `timeout` passes first (see [`Daemon::wait_for`]).
    pub fn wait_for_api(&self, config: &Path, timeout: Duration) {
        self.wait_for(timeout, "the daemon's API", || {
            // A daemon that exited (a refused configuration) will never answer.
            assert!(
                !self.exited(),
                "the daemon exited instead of serving its API; its log:\n{}",
                self.log()
            );
            let out = cli(config, &["status", "--json"]);
            let text = String::from_utf8_lossy(&out.stderr);
            (out.status.success() && text.contains("daemon's API")).then_some(())
        });
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `f` every 200 ms until it returns `Some`, and return that: how the tests wait on a
/// daemon, whichever way it was started.
///
/// # Panics
/// When `timeout` passes first, naming `what` and showing the daemon's log (`log()`).
pub fn poll_until<T>(
    timeout: Duration,
    what: &str,
    log: impl Fn() -> String,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}; daemon log:\n{}",
            log()
        );
        std::thread::sleep(POLL);
    }
}

/// Run `tailtrap config check <config>`.
///
/// # Panics
/// When the binary cannot be run (see [`tailtrap_bin`]).
pub fn config_check(config: &Path) -> Output {
    Command::new(tailtrap_bin())
        .args(["config", "check"])
        .arg(config)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tailtrap config check: {e}"))
}

/// Run `tailtrap -v <args> --config <config>`; `-v` makes it say on stderr whether it read
/// the daemon's API or the database.
///
/// # Panics
/// When the binary cannot be run (see [`tailtrap_bin`]).
pub fn cli(config: &Path, args: &[&str]) -> Output {
    Command::new(tailtrap_bin())
        .arg("-v")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tailtrap {args:?}: {e}"))
}

/// Run the CLI as [`cli`] does and parse its JSON stdout; also its stderr, which says API
/// or database.
///
/// # Panics
/// When the command fails or its output is not JSON.
pub fn cli_json(config: &Path, args: &[&str]) -> (Value, String) {
    let out = cli(config, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "tailtrap {args:?} failed: {stderr}{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tailtrap {args:?}: not JSON ({e}): {:?}", out.stdout));
    (v, stderr)
}

/// Whether a `tailtrap status --json` report shows a learned p99 baseline at `probe` for
/// every one of `services`: what the daemon tests wait for before injecting a slowdown.
pub fn baselines_warm(status: &Value, probe: &str, services: &[&str]) -> bool {
    services.iter().all(|svc| {
        status["latency"].as_array().is_some_and(|rows| {
            rows.iter().any(|r| {
                r["service"] == *svc && r["probe"] == probe && r["baseline_p99_ns"].is_number()
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is the detector TOML the tests mean: the test's keys and the fast timing.
    #[test]
    fn the_slow_reader_detector_holds_its_keys_and_the_fast_timing() {
        let value: toml::Table = SLOW_READER_DETECTOR.parse().unwrap();
        let detector = value["detector"].as_table().unwrap();
        assert_eq!(detector["min_delta"].as_str(), Some("5ms"));
        assert_eq!(detector["quantiles"].as_array().unwrap().len(), 2);
        assert_eq!(detector["warmup_time"].as_str(), Some("2s"));
        assert_eq!(detector["cooldown"].as_str(), Some("1s"));
        assert_eq!(detector.len(), 9, "{detector:?}");
    }
}
