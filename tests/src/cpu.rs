//! Real CPU causes for the cause-verdict tests: a process pinned to a CPU, a CPU hog, and a
//! cgroup with a small CPU quota (v2 `cpu.max` where the cpu controller is on the unified
//! hierarchy, else v1 `cpu.cfs_quota_us`).

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::error::{Error, Result};

/// Pin every thread of process `pid` to `cpu`.
pub fn pin(pid: u32, cpu: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)
        .map_err(|e| Error::Setup(format!("cpu {cpu}: {e}")))?;
    let tasks = fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(Error::io(format!("cannot list the threads of {pid}")))?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        sched_setaffinity(Pid::from_raw(tid), &set)
            .map_err(|e| Error::Setup(format!("pinning thread {tid} to cpu {cpu}: {e}")))?;
    }
    Ok(())
}

/// A busy loop in its own process (a shell spinning), killed on drop.
#[derive(Debug)]
pub struct Hog(Child);

impl Hog {
    /// Starts spinning, pinned to `cpu` when given.
    pub fn spawn(cpu: Option<usize>) -> Result<Hog> {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(Error::io("cannot start a CPU hog (sh)"))?;
        let hog = Hog(child);
        if let Some(cpu) = cpu {
            pin(hog.pid(), cpu)?;
        }
        Ok(hog)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cgroup with a CPU quota; its processes go back to the root group and it is removed on
/// drop.
#[derive(Debug)]
pub struct CpuQuota {
    dir: PathBuf,
    root: PathBuf,
}

impl CpuQuota {
    /// A new group allowed `quota` of CPU time every `period`.
    pub fn create(name: &str, quota: Duration, period: Duration) -> Result<CpuQuota> {
        let (q, p) = (quota.as_micros(), period.as_micros());
        let leaf = format!("tailtrap-quota-{name}-{}", std::process::id());
        if let Some(v2) = bpf::cgroup2_mount().filter(|m| {
            fs::read_to_string(m.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        }) {
            // The root's subtree must hand the cpu controller down.
            let _ = fs::write(v2.join("cgroup.subtree_control"), "+cpu");
            let dir = v2.join(&leaf);
            fs::create_dir_all(&dir)
                .map_err(Error::io(format!("cannot create {}", dir.display())))?;
            let g = CpuQuota { dir, root: v2 };
            g.write("cpu.max", &format!("{q} {p}"))?;
            return Ok(g);
        }
        let v1 = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
            .into_iter()
            .map(PathBuf::from)
            .find(|m| m.join("cpu.cfs_quota_us").exists())
            .ok_or_else(|| Error::Setup("no cgroup with the cpu controller (v2 or v1)".into()))?;
        let dir = v1.join(&leaf);
        fs::create_dir_all(&dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
        let g = CpuQuota { dir, root: v1 };
        g.write("cpu.cfs_period_us", &p.to_string())?;
        g.write("cpu.cfs_quota_us", &q.to_string())?;
        Ok(g)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(Error::io(format!(
            "cannot write {value:?} to {}",
            path.display()
        )))
    }

    /// Move process `pid` (all its threads) into the group.
    pub fn add(&self, pid: u32) -> Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The group's directory.
    pub fn path(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        for attempt in 0..50 {
            if let Ok(procs) = fs::read_to_string(self.dir.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = fs::write(self.root.join("cgroup.procs"), pid);
                }
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) if attempt < 49 => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => eprintln!("tailtrap-tests: cannot remove {}: {e}", self.dir.display()),
            }
        }
    }
}
