//! Pieces both probe benchmarks need: BPF run-time statistics switched on for the run, and the
//! payload of the loopback ping-pong.

/// The sysctl that turns the kernel's BPF run-time accounting on.
pub const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// The ping-pong message: small, so the cost measured is per packet, not per byte.
pub const MESSAGE: [u8; 64] = [0x5a; 64];

/// Turns BPF run-time statistics on; puts the previous setting back on drop, so a benchmark
/// never leaves the kernel paying for statistics.
pub struct StatsEnabled(String);

impl StatsEnabled {
    /// Switch statistics on, remembering the previous setting.
    pub fn new() -> std::io::Result<Self> {
        let previous = std::fs::read_to_string(STATS_SYSCTL)?;
        std::fs::write(STATS_SYSCTL, "1")?;
        Ok(Self(previous))
    }
}

impl Drop for StatsEnabled {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(STATS_SYSCTL, self.0.trim()) {
            eprintln!("could not restore {STATS_SYSCTL}: {e}");
        }
    }
}
