//! Who holds the database: a pid file beside the directory, and `/proc/locks`.
//!
//! sled takes an exclusive `flock` on `<dir>/db`; a second opener only learns "could not
//! acquire lock". To tell the operator which process to talk to, `/proc/locks` is searched
//! for the lock on that file's inode, with the pid file as a fallback (e.g. when the holder
//! is in another pid namespace and shows up as pid 0 or not at all).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{LockHolder, Result, StoreError};
use crate::paths::sibling;

/// Path of the pid file for the database at `db`.
pub(crate) fn pid_file(db: &Path) -> PathBuf {
    sibling(db, "pid")
}

pub(crate) fn write_pid_file(db: &Path) -> Result<PathBuf> {
    let p = pid_file(db);
    fs::write(&p, format!("{}\n", std::process::id()))
        .map_err(|e| StoreError::io(format!("writing pid file {}", p.display()), e))?;
    Ok(p)
}

/// Remove the pid file if it is still ours (a newer owner may have rewritten it).
pub(crate) fn remove_pid_file(p: &Path) {
    let ours = fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        == Some(std::process::id());
    if ours {
        let _ = fs::remove_file(p);
    }
}

/// The process holding the lock on the database at `db`, if it can be found.
pub(crate) fn holder(db: &Path) -> Option<LockHolder> {
    let pid = from_proc_locks(&db.join("db")).or_else(|| from_pid_file(db))?;
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string());
    Some(LockHolder { pid, comm })
}

fn from_pid_file(db: &Path) -> Option<u32> {
    let pid: u32 = fs::read_to_string(pid_file(db)).ok()?.trim().parse().ok()?;
    // A stale file from a dead process names nobody.
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

fn from_proc_locks(file: &Path) -> Option<u32> {
    let meta = fs::metadata(file).ok()?;
    let locks = fs::read_to_string("/proc/locks").ok()?;
    find_flock_holder(
        &locks,
        dev_major(meta.dev()),
        dev_minor(meta.dev()),
        meta.ino(),
    )
}

/// Linux `dev_t` split (glibc's `gnu_dev_major`/`gnu_dev_minor`).
fn dev_major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)
}

fn dev_minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & !0xff)
}

/// Find the pid of a FLOCK on `major:minor:inode` in `/proc/locks` text, whose lines read
/// `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF` (device numbers in hex).
fn find_flock_holder(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Blocked waiters are shown as "1: -> FLOCK ..."; skip them.
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = f.get(4)?.parse().ok()?;
        let mut id = f.get(5)?.split(':');
        let maj = u64::from_str_radix(id.next()?, 16).ok()?;
        let min = u64::from_str_radix(id.next()?, 16).ok()?;
        let i: u64 = id.next()?.parse().ok()?;
        (maj == major && min == minor && i == ino && pid != 0).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_locks() {
        let text = "1: POSIX  ADVISORY  WRITE 77 fd:01:5678 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 999 fd:01:5678 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 4321 fd:01:9999 0 EOF\n";
        assert_eq!(find_flock_holder(text, 0xfd, 1, 5678), Some(1234));
        assert_eq!(find_flock_holder(text, 0xfd, 1, 9999), Some(4321));
        assert_eq!(find_flock_holder(text, 0xfd, 2, 5678), None);
    }

    #[test]
    fn dev_split_matches_the_kernel_encoding() {
        // makedev(0xfd, 1) with glibc's encoding, and a large minor.
        assert_eq!((dev_major(0xfd01), dev_minor(0xfd01)), (0xfd, 1));
        let dev = (0x123u64 << 8) | 0x45 | (0x6u64 << 12 << 8);
        assert_eq!(dev_major(dev), 0x123);
        assert_eq!(dev_minor(dev), 0x645);
    }
}
