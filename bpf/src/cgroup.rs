//! cgroup2 paths and ids. A cgroup's id (what BPF sees as `cgroup->kn->id`) is the inode
//! number of its directory in the cgroup2 file system.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where cgroup2 is mounted: the first `cgroup2` entry of /proc/self/mountinfo, else the
/// usual /sys/fs/cgroup.
pub(crate) fn cgroup2_mount() -> PathBuf {
    fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|line| {
                // "... mount-point options - fstype source super-options"
                let (left, right) = line.split_once(" - ")?;
                let fstype = right.split_whitespace().next()?;
                (fstype == "cgroup2").then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
            })
        })
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"))
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
    fn root_cgroup_round_trips() {
        let mount = cgroup2_mount();
        let id = cgroup_id(&mount, Path::new("")).unwrap();
        assert_eq!(CgroupNames::new(mount).name(id), "/");
    }

    #[test]
    fn missing_cgroup_is_an_error() {
        assert!(cgroup_id(&cgroup2_mount(), Path::new("no/such/tailtrap-cgroup")).is_err());
    }
}
