//! Pieces both probe benchmarks need: their main and phase length, BPF run-time statistics
//! switched on for the run and read per phase, and the payload of the loopback ping-pong.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

/// The sysctl that turns the kernel's BPF run-time accounting on.
pub const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// The ping-pong message: small, so the cost measured is per packet, not per byte.
pub const MESSAGE: [u8; 64] = [0x5a; 64];

/// Turns BPF run-time statistics on; puts the previous setting back on drop, so a benchmark
/// never leaves the kernel paying for statistics.
pub struct StatsEnabled(String);

impl StatsEnabled {
    /// Switch statistics on, remembering the previous setting. Fails unless run as root.
    pub fn new() -> Result<Self, String> {
        let switch_on = || {
            let previous = std::fs::read_to_string(STATS_SYSCTL)?;
            std::fs::write(STATS_SYSCTL, "1")?;
            Ok::<_, std::io::Error>(Self(previous))
        };
        switch_on().map_err(|e| format!("enabling {STATS_SYSCTL} (run as root): {e}"))
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(STATS_SYSCTL, self.0.trim()) {
            eprintln!("could not restore {STATS_SYSCTL}: {e}");
        }
    }
}

/// A benchmark's `main`: runs `run`, and on an error says so under the bench's name and fails.
pub fn main(bench: &str, run: impl FnOnce() -> Result<(), Box<dyn Error>>) -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{bench}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How long each measured phase runs: `TAILTRAP_BENCH_SECS` seconds, 3 by default.
pub fn phase_len() -> Result<Duration, Box<dyn Error>> {
    let secs: f64 = std::env::var("TAILTRAP_BENCH_SECS")
        .ok()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(3.0);
    Ok(Duration::from_secs_f64(secs))
}

/// Each program's (run time in ns, run count) over a phase: its reading `after` less its
/// reading before (`before`; none: the phase had all of it).
pub fn phase_stats<K, C>(
    after: impl IntoIterator<Item = (K, (u64, u64))>,
    before: impl Fn(&K) -> Option<(u64, u64)>,
) -> C
where
    C: FromIterator<(K, (u64, u64))>,
{
    after
        .into_iter()
        .map(|(program, (t, n))| {
            let (t0, n0) = before(&program).unwrap_or((0, 0));
            (program, (t - t0, n - n0))
        })
        .collect()
}
