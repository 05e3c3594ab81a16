use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// Directory under the cgroup2 mount that holds every test cgroup.
const PARENT: &str = "tailtrap-test";

/// A cgroup2 group `<mount>/tailtrap-test/<name>-<pid>`, removed on drop.
///
/// Sockets are charged to the cgroup of the process that creates them, at creation; the
/// traffic helpers join a cgroup before opening their socket (see
/// [`ServerOpts`](crate::ServerOpts)).
#[derive(Debug)]
pub struct Cgroup {
    mount: PathBuf,
    rel: String,
    id: u64,
}

impl Cgroup {
    /// Creates the group; fails if this process already has one of that name. Empty groups
    /// left behind by test processes that died are removed on the way.
    pub fn create(name: &str) -> Result<Cgroup> {
        let mount = bpf::cgroup2_mount().ok_or(Error::NoCgroup2)?;
        let parent = mount.join(PARENT);
        fs::create_dir_all(&parent)
            .map_err(Error::io(format!("cannot create {}", parent.display())))?;
        remove_stale(&parent);
        let rel = format!("{PARENT}/{name}-{}", std::process::id());
        let path = mount.join(&rel);
        fs::create_dir(&path).map_err(Error::io(format!(
            "cannot create cgroup {}",
            path.display()
        )))?;
        let meta =
            fs::metadata(&path).map_err(Error::io(format!("cannot stat {}", path.display())))?;
        // A cgroup's id is its kernfs node id, which is what stat reports as the inode.
        Ok(Cgroup {
            mount,
            rel,
            id: meta.ino(),
        })
    }

    /// The cgroup id, as `bpf_get_current_cgroup_id()` and socket cgroup ids report it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The path relative to the cgroup2 mount, as tailtrap's service config takes it
    /// (e.g. `tailtrap-test/web-1234`).
    pub fn rel_path(&self) -> &str {
        &self.rel
    }

    /// The absolute directory of the group.
    pub fn path(&self) -> PathBuf {
        self.mount.join(&self.rel)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let path = self.path();
        // rmdir fails while processes remain: move them to the root group, which may hold
        // processes whatever controllers are enabled.
        let root_procs = self.mount.join("cgroup.procs");
        for attempt in 0..50 {
            if let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = fs::write(&root_procs, pid);
                }
            }
            match fs::remove_dir(&path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                // Exiting processes leave the group a moment after they were killed.
                Err(_) if attempt < 49 => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => eprintln!(
                    "tailtrap-tests: cannot remove cgroup {}: {e}",
                    path.display()
                ),
            }
        }
    }
}

/// Removes `<name>-<pid>` groups whose process is gone; a group still holding processes
/// refuses rmdir and stays.
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.rsplit_once('-'))
            .map(|(_, pid)| pid)
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir(entry.path());
        }
    }
}
