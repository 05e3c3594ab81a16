//! What `/proc` says about a process, for the tests that watch the daemon's resources.

/// The resident set size of process `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
///
/// # Panics
/// When the process is gone or its status has no `VmRSS` line (a kernel thread).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}
