//! cgroup2 paths and ids. A cgroup's id (what BPF sees as `cgroup->kn->id`) is the inode
//! number of its directory in the cgroup2 file system.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the cgroup2 hierarchy is mounted, from /proc/self/mountinfo: `/sys/fs/cgroup`
/// when cgroup2 is mounted there (a unified host), else the first cgroup2 mount (e.g.
/// `/sys/fs/cgroup/unified` on a hybrid host); `None` without any.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mount_in(&info).map(PathBuf::from)
}

/// The choice of [`cgroup2_mount`] in the text of a mountinfo file.
fn cgroup2_mount_in(mountinfo: &str) -> Option<&str> {
    let mut mounts = mountinfo.lines().filter_map(|line| {
        // "id parent major:minor root mount-point options... - fstype source super-options"
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        (fstype == "cgroup2").then(|| left.split_whitespace().nth(4))?
    });
    let first = mounts.next()?;
    if first == DEFAULT_MOUNT {
        return Some(first);
    }
    Some(mounts.find(|m| *m == DEFAULT_MOUNT).unwrap_or(first))
}

/// The usual place of cgroup2.
const DEFAULT_MOUNT: &str = "/sys/fs/cgroup";

/// [`cgroup2_mount`], or the usual `/sys/fs/cgroup` when mountinfo names none, so the
/// loader's errors still name the directories it looked for.
pub(crate) fn cgroup2_mount_or_default() -> PathBuf {
    cgroup2_mount().unwrap_or_else(|| PathBuf::from(DEFAULT_MOUNT))
}

/// The id of the cgroup at `rel` (relative to `mount`).
pub(crate) fn cgroup_id(mount: &Path, rel: &Path) -> io::Result<u64> {
    let path = mount.join(rel.strip_prefix("/").unwrap_or(rel));
    let meta = fs::metadata(&path)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a cgroup directory", path.display()),
        ));
    }
    Ok(meta.ino())
}

/// Finds cgroup paths by id, remembering what it found.
#[derive(Debug)]
pub(crate) struct CgroupNames {
    mount: PathBuf,
    known: HashMap<u64, String>,
}

impl CgroupNames {
    pub(crate) fn new(mount: PathBuf) -> Self {
        Self {
            mount,
            known: HashMap::new(),
        }
    }

    /// Path of cgroup `id` relative to the mount (`/` for the root), or `cgroup:<id>` when
    /// it no longer exists.
    pub(crate) fn name(&mut self, id: u64) -> String {
        if let Some(name) = self.known.get(&id) {
            return name.clone();
        }
        let name = find_by_ino(&self.mount, id)
            .map(|p| match p.strip_prefix(&self.mount) {
                Ok(rel) if rel.as_os_str().is_empty() => "/".to_owned(),
                Ok(rel) => rel.display().to_string(),
                Err(_) => p.display().to_string(),
            })
            .unwrap_or_else(|| format!("cgroup:{id}"));
        self.known.insert(id, name.clone());
        name
    }
}

fn find_by_ino(dir: &Path, ino: u64) -> Option<PathBuf> {
    let meta = fs::metadata(dir).ok()?;
    if meta.ino() == ino {
        return Some(dir.to_path_buf());
    }
    for entry in fs::read_dir(dir).ok()?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some(found) = find_by_ino(&entry.path(), ino) {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_prefers_the_usual_place_else_the_first_cgroup2() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(hybrid), Some("/sys/fs/cgroup/unified"));
        let two = "50 1 0:40 / /run/other rw - cgroup2 cgroup2 rw\n\
                   51 1 0:40 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(two), Some("/sys/fs/cgroup"));
        assert_eq!(
            cgroup2_mount_in("31 23 0:28 / /sys rw - sysfs sysfs rw\n"),
            None
        );
    }

    #[test]
    fn root_cgroup_round_trips() {
        let mount = cgroup2_mount_or_default();
        let id = cgroup_id(&mount, Path::new("")).unwrap();
        assert_eq!(CgroupNames::new(mount).name(id), "/");
    }

    #[test]
    fn missing_cgroup_is_an_error() {
        assert!(cgroup_id(
            &cgroup2_mount_or_default(),
            Path::new("no/such/tailtrap-cgroup")
        )
        .is_err());
    }
}
