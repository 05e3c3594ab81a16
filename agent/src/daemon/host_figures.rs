//! What the cause verdicts read from the host besides the probes' maps: the readers' and
//! ksoftirqd's scheduler statistics (/proc/PID/task/*/schedstat), the CPU holders
//! (/proc/PID/stat), the softnet counters (/proc/net/softnet_stat), the CPUs' softirq time
//! (/proc/stat) and a cgroup's CPU throttling (cpu.stat, v2 or v1). Each read is a handful of
//! small files, done per open incident a few times, never per packet or for every service.
//! A file that cannot be read is a figure left out, never an error of the loop.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Nanoseconds per USER_HZ tick (/proc/stat and /proc/PID/stat count in ticks).
fn ns_per_tick() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        1_000_000_000 / hz as u64
    } else {
        10_000_000
    }
}

/// A thread's schedstat: time on CPU and time runnable waiting for one, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SchedTimes {
    pub on_cpu_ns: u64,
    pub run_wait_ns: u64,
}

/// Per thread of process `pid`, its schedstat. Empty when the process is gone or the kernel
/// keeps no schedstat (CONFIG_SCHED_INFO off).
pub(super) fn process_sched(pid: u32) -> HashMap<u32, SchedTimes> {
    let mut out = HashMap::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(t) = read_schedstat(&task.path().join("schedstat")) {
            out.insert(tid, t);
        }
    }
    out
}

fn read_schedstat(path: &Path) -> Option<SchedTimes> {
    let text = fs::read_to_string(path).ok()?;
    let mut f = text.split_ascii_whitespace();
    Some(SchedTimes {
        on_cpu_ns: f.next()?.parse().ok()?,
        run_wait_ns: f.next()?.parse().ok()?,
    })
}

/// The growth of a process's threads' times between two reads (threads born since count
/// from zero; threads gone are left out).
pub(super) fn sched_growth(
    before: &HashMap<u32, SchedTimes>,
    after: &HashMap<u32, SchedTimes>,
) -> SchedTimes {
    let mut sum = SchedTimes::default();
    for (tid, a) in after {
        let b = before.get(tid).copied().unwrap_or_default();
        sum.on_cpu_ns += a.on_cpu_ns.saturating_sub(b.on_cpu_ns);
        sum.run_wait_ns += a.run_wait_ns.saturating_sub(b.run_wait_ns);
    }
    sum
}

/// A process as /proc/PID/stat shows it: its command, the CPU it last ran on and its CPU
/// time so far (ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcStat {
    pub comm: String,
    pub cpu: u32,
    pub cpu_ns: u64,
}

/// Most processes one scan reads: a bound on the cost on hosts with very many.
const MAX_PROCESSES: usize = 20_000;

/// Every process's stat, by pid (kernel threads included: ksoftirqd is one).
pub(super) fn all_processes() -> HashMap<u32, ProcStat> {
    let mut out = HashMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return out;
    };
    let tick = ns_per_tick();
    for entry in dir.flatten().take(MAX_PROCESSES + 64) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(s) = read_proc_stat(&entry.path().join("stat"), tick) {
            out.insert(pid, s);
        }
        if out.len() >= MAX_PROCESSES {
            break;
        }
    }
    out
}

/// Parse /proc/PID/stat: `pid (comm) state ...`; comm may hold spaces and parentheses, so
/// fields are counted after the last `)`. utime and stime are fields 14 and 15, the last
/// CPU field 39.
fn read_proc_stat(path: &Path, tick: u64) -> Option<ProcStat> {
    let text = fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
    // rest[0] is field 3 (state).
    let field = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let ticks = field(14)?.saturating_add(field(15)?);
    Some(ProcStat {
        comm,
        cpu: u32::try_from(field(39)?).ok()?,
        cpu_ns: ticks.saturating_mul(tick),
    })
}

/// One CPU's softnet counters and softirq time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct CpuNet {
    pub processed: u64,
    pub dropped: u64,
    pub squeezed: u64,
    pub softirq_ns: u64,
}

/// Per CPU, the softnet counters (/proc/net/softnet_stat: hex columns processed, dropped,
/// time_squeeze, ...; the CPU's number is column 13 on kernels that print it, else the
/// line's position) and softirq time (/proc/stat's seventh column).
pub(super) fn cpu_net() -> HashMap<u32, CpuNet> {
    let mut out: HashMap<u32, CpuNet> = HashMap::new();
    if let Ok(text) = fs::read_to_string("/proc/net/softnet_stat") {
        for (line_no, line) in text.lines().enumerate() {
            let cols: Vec<u64> = line
                .split_ascii_whitespace()
                .filter_map(|c| u64::from_str_radix(c, 16).ok())
                .collect();
            if cols.len() < 3 {
                continue;
            }
            let cpu = cols
                .get(12)
                .and_then(|&c| u32::try_from(c).ok())
                .unwrap_or(u32::try_from(line_no).unwrap_or(u32::MAX));
            let e = out.entry(cpu).or_default();
            e.processed = cols[0];
            e.dropped = cols[1];
            e.squeezed = cols[2];
        }
    }
    if let Ok(text) = fs::read_to_string("/proc/stat") {
        let tick = ns_per_tick();
        for line in text.lines() {
            let mut f = line.split_ascii_whitespace();
            let Some(cpu) = f
                .next()
                .and_then(|n| n.strip_prefix("cpu"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(softirq) = f.nth(6).and_then(|v| v.parse::<u64>().ok()) {
                out.entry(cpu).or_default().softirq_ns = softirq.saturating_mul(tick);
            }
        }
    }
    out
}

/// A cgroup's throttling counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CpuStat {
    /// The cgroup directory the figures are of.
    pub dir: PathBuf,
    /// Its quota as configured.
    pub quota: String,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// The CPU throttling counters of the nearest cgroup of process `pid` (itself or an
/// ancestor) that has a CPU quota; `None` when none has one or nothing could be read.
pub(super) fn throttling_of(pid: u32) -> Option<CpuStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        // `0::/path` (v2) or `N:cpu,cpuacct:/path` (v1).
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            if let Some(s) = nearest_with_quota(Path::new("/sys/fs/cgroup"), rel, read_v2) {
                return Some(s);
            }
            if let Some(s) = nearest_with_quota(Path::new("/sys/fs/cgroup/unified"), rel, read_v2) {
                return Some(s);
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            for mount in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
                if let Some(s) = nearest_with_quota(Path::new(mount), rel, read_v1) {
                    return Some(s);
                }
            }
        }
    }
    None
}

/// The cgroup at `root/rel` or its nearest ancestor whose `read` finds a quota.
fn nearest_with_quota(
    root: &Path,
    rel: &str,
    read: fn(&Path) -> Option<CpuStat>,
) -> Option<CpuStat> {
    let mut dir = root.join(rel);
    loop {
        if let Some(s) = read(&dir) {
            return Some(s);
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return None;
        }
    }
}

fn stat_fields(dir: &Path) -> Option<HashMap<String, u64>> {
    let text = fs::read_to_string(dir.join("cpu.stat")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect(),
    )
}

/// The throttling counters of the cgroup at `dir` (v2 or v1), as [`throttling_of`] found it.
pub(super) fn cpu_stat_at(dir: &Path) -> Option<CpuStat> {
    read_v2(dir).or_else(|| read_v1(dir))
}

/// cgroup v2: `cpu.max` is `max 100000` without a quota.
fn read_v2(dir: &Path) -> Option<CpuStat> {
    let quota = fs::read_to_string(dir.join("cpu.max")).ok()?;
    let quota = quota.trim().to_owned();
    if quota.starts_with("max") {
        return None;
    }
    let f = stat_fields(dir)?;
    Some(CpuStat {
        dir: dir.to_owned(),
        quota,
        periods: *f.get("nr_periods")?,
        throttled_periods: *f.get("nr_throttled")?,
        throttled_ns: f.get("throttled_usec")?.saturating_mul(1000),
    })
}

/// cgroup v1: `cpu.cfs_quota_us` is -1 without a quota; throttled_time is in ns.
fn read_v1(dir: &Path) -> Option<CpuStat> {
    let quota: i64 = fs::read_to_string(dir.join("cpu.cfs_quota_us"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if quota < 0 {
        return None;
    }
    let period = fs::read_to_string(dir.join("cpu.cfs_period_us")).ok()?;
    let f = stat_fields(dir)?;
    Some(CpuStat {
        dir: dir.to_owned(),
        quota: format!("{quota} {}", period.trim()),
        periods: *f.get("nr_periods")?,
        throttled_periods: *f.get("nr_throttled")?,
        throttled_ns: *f.get("throttled_time")?,
    })
}

/// The throttling between two reads of the same cgroup.
pub(super) fn throttle_growth(before: &CpuStat, after: &CpuStat) -> detector::diagnosis::Throttle {
    detector::diagnosis::Throttle {
        cgroup: after.dir.display().to_string(),
        quota: after.quota.clone(),
        periods: after.periods.saturating_sub(before.periods),
        throttled_periods: after
            .throttled_periods
            .saturating_sub(before.throttled_periods),
        throttled_ns: after.throttled_ns.saturating_sub(before.throttled_ns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_schedstat_and_a_stat_line() {
        let pid = std::process::id();
        let mine = all_processes();
        let me = mine.get(&pid).expect("this process in /proc");
        assert!(!me.comm.is_empty());
        // A thread that spins a little shows CPU time in schedstat.
        let before = process_sched(pid);
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        let grown = sched_growth(&before, &process_sched(pid));
        assert!(grown.on_cpu_ns >= 10_000_000, "{grown:?}");
    }

    /// What one decision's scan of /proc costs, with this many processes beside the host's
    /// own (prints it; `cargo test -p tailtrap --bin tailtrap -- --ignored scan_cost --nocapture`).
    #[test]
    #[ignore = "a measurement: prints the cost of a scan of /proc with 2 000 more processes"]
    fn scan_cost() {
        use std::process::{Command, Stdio};
        let mut children: Vec<_> = (0..2000)
            .filter_map(|_| {
                Command::new("sleep")
                    .arg("60")
                    .stdout(Stdio::null())
                    .spawn()
                    .ok()
            })
            .collect();
        let mut times = Vec::new();
        let mut n = 0;
        for _ in 0..9 {
            let t = std::time::Instant::now();
            n = all_processes().len();
            let net = cpu_net();
            std::hint::black_box(net);
            times.push(t.elapsed());
        }
        times.sort();
        println!(
            "scan of {n} processes and the CPUs' figures: median {:?}, min {:?}, max {:?}",
            times[4], times[0], times[8]
        );
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[test]
    fn the_cpus_have_softnet_and_softirq_figures() {
        let net = cpu_net();
        assert!(net.contains_key(&0), "{net:?}");
    }

    #[test]
    fn proc_stat_comm_with_spaces_and_parens_parses() {
        let dir = std::env::temp_dir().join(format!("tt-stat-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stat");
        // 52 fields as the kernel writes them; comm "a) b" holds a space and a parenthesis.
        let mut fields: Vec<String> = (4..=52).map(|n| n.to_string()).collect();
        fields[14 - 4] = "30".into(); // utime
        fields[15 - 4] = "12".into(); // stime
        fields[39 - 4] = "1".into(); // processor
        fs::write(&path, format!("77 (a) b) S {}\n", fields.join(" "))).unwrap();
        let s = read_proc_stat(&path, 10_000_000).unwrap();
        assert_eq!(s.comm, "a) b");
        assert_eq!(s.cpu, 1);
        assert_eq!(s.cpu_ns, 420_000_000);
        fs::remove_dir_all(dir).unwrap();
    }

    /// A real quota cgroup (v2 where the cpu controller is there, else v1) with a spinning
    /// process: its throttling is found from the process and grows.
    #[test]
    #[ignore = "needs root: run as root with --include-ignored"]
    fn a_spinning_process_in_a_quota_cgroup_is_found_throttled() {
        use std::process::Command;
        let v2 = Path::new("/sys/fs/cgroup");
        let v2_cpu = fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"));
        let name = format!("tailtrap-quota-test-{}", std::process::id());
        let (root, files): (PathBuf, &[(&str, &str)]) = if v2_cpu {
            let _ = fs::write(v2.join("cgroup.subtree_control"), "+cpu");
            (v2.to_owned(), &[("cpu.max", "2000 20000")])
        } else {
            (
                PathBuf::from("/sys/fs/cgroup/cpu"),
                &[("cpu.cfs_period_us", "20000"), ("cpu.cfs_quota_us", "2000")],
            )
        };
        let dir = root.join(&name);
        fs::create_dir_all(&dir).unwrap();
        for (f, v) in files {
            fs::write(dir.join(f), v).unwrap();
        }
        let mut hog = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        fs::write(dir.join("cgroup.procs"), hog.id().to_string()).unwrap();
        let before = throttling_of(hog.id());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let after = throttling_of(hog.id());
        let _ = hog.kill();
        let _ = hog.wait();
        let _ = fs::remove_dir(&dir);
        let (before, after) = (before.unwrap(), after.unwrap());
        assert_eq!(after.dir, dir);
        assert_eq!(after.quota, "2000 20000");
        let grown = throttle_growth(&before, &after);
        assert!(grown.periods >= 5, "{grown:?}");
        assert!(grown.throttled_periods * 2 >= grown.periods, "{grown:?}");
        assert!(grown.throttled_ns > 0, "{grown:?}");
    }
}
