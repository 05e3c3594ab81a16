//! The database directory made read-only under a running store (an operator's chmod, a
//! provisioning tool): writes either go through or fail with counted errors, never a panic
//! or a stall; once writable again the next flush works, and a restart finds every
//! acknowledged record.
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{new_incident, rerun_as_child, sample_count, SmallFs, SEC, T0};
use model::fixtures::sample;
use storage::{Store, StoreConfig};

const CHILD_ENV: &str = "TAILTRAP_STORAGE_READONLY_CHILD";

/// Make the directory read-only (or writable again) for its owner, the child's user.
fn set_writable(dir: &Path, writable: bool) {
    let mode = if writable { 0o755 } else { 0o555 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    // Every file in it too: sled rewrites its config and snapshot files in place.
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = if writable { 0o644 } else { 0o444 };
        if p.is_file() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        }
    }
}

/// The free-space reserve off: this test is about a read-only, not a full, file system.
fn cfg() -> StoreConfig {
    StoreConfig {
        min_free_bytes: 0,
        ..StoreConfig::default()
    }
}

/// The child, running as `nobody` so that permissions bind it: the whole run.
fn child(dir: &Path) {
    let path = dir.join("db");
    let s = Store::open(&path, cfg()).unwrap();
    let first = s.open_incident(&new_incident("web", T0)).unwrap();
    let batch: Vec<_> = (0..100).map(|i| sample(first.id, i, T0 + i)).collect();
    s.put_samples(&batch).unwrap();
    s.flush().unwrap();

    set_writable(dir, false);
    set_writable(&path, false);
    let before = s.stats().write_errors;
    // Writes keep coming, as the daemon's do every interval; each round ends in a flush.
    let start = Instant::now();
    let mut failed_rounds = 0;
    let mut acked = 100;
    for round in 0..10u64 {
        let batch: Vec<_> = (0..50)
            .map(|i| sample(first.id, 1000 + round * 50 + i, T0 + SEC + round * 50 + i))
            .collect();
        let r = s.put_samples(&batch).and_then(|()| s.flush());
        match r {
            Ok(()) => acked += 50,
            Err(e) => {
                failed_rounds += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    let stats = s.stats();
    eprintln!(
        "read-only: {failed_rounds}/10 rounds failed, write_errors +{}, {:?}",
        stats.write_errors - before,
        start.elapsed()
    );
    // sled writes through the files it holds open, so a directory made read-only stops only
    // what needs a new file; whatever failed is counted, whatever was acknowledged is kept.
    assert!(stats.write_errors - before >= failed_rounds, "{stats:?}");
    println!("tailtrap-child: {failed_rounds} of 10 rounds failed, {acked} samples acknowledged");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "failing writes must not stall the caller"
    );

    set_writable(dir, true);
    set_writable(&path, true);
    let start = Instant::now();
    let mut recovered = false;
    while start.elapsed() < Duration::from_secs(30) {
        if s.flush().is_ok() {
            recovered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        recovered,
        "no recovery 30 s after the directory became writable"
    );
    eprintln!("writable again: flush ok after {:?}", start.elapsed());
    s.readable().unwrap();
    assert_eq!(
        sample_count(&s, first.id),
        acked,
        "acknowledged samples lost"
    );
    let second = s.open_incident(&new_incident("db", T0 + 2 * SEC)).unwrap();
    s.put_samples(&[sample(second.id, 0, T0 + 2 * SEC)])
        .unwrap();
    s.flush().unwrap();
    assert_eq!(sample_count(&s, second.id), 1);
    drop(s);
    // A restart finds everything flushed.
    let s = Store::open(&path, cfg()).unwrap();
    assert_eq!(sample_count(&s, first.id), acked);
    assert_eq!(sample_count(&s, second.id), 1);
    println!("tailtrap-child: done");
}

#[test]
#[ignore = "needs root (runs a child as nobody on a directory it owns): run as root with --include-ignored"]
fn read_only_database_counts_failed_writes_and_recovers_when_writable() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nobody = 65534;
    std::os::unix::fs::chown(dir.path(), Some(nobody), Some(nobody)).unwrap();
    let out = rerun_as_child(
        "read_only_database_counts_failed_writes_and_recovers_when_writable",
        CHILD_ENV,
        dir.path(),
    )
    .uid(nobody)
    .gid(nobody)
    .output()
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success() && text.contains("tailtrap-child: done"),
        "{text}"
    );
}

/// A database on a file system mounted read-only (a snapshot, or one the kernel remounted
/// read-only after a disk error) cannot be opened by sled, which opens its files for
/// writing. The CLI's reads then go to a copy in the temporary directory: everything is
/// there, the original is not touched, and the copy is gone once the store is dropped.
#[test]
#[ignore = "needs root (mounts a tmpfs): run as root with --include-ignored"]
fn a_database_on_a_read_only_file_system_is_read_from_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let fs = SmallFs::mount(dir.path(), "32m");
    let path = dir.path().join("db");
    let s = Store::open(&path, cfg()).unwrap();
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    let batch: Vec<_> = (0..300).map(|i| sample(inc.id, i, T0 + i)).collect();
    s.put_samples(&batch).unwrap();
    s.flush().unwrap();
    drop(s);
    let listing = |p: &Path| -> Vec<(String, u64)> {
        let mut files: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| {
                let m = e.metadata().unwrap();
                (e.file_name().to_string_lossy().into_owned(), m.len())
            })
            .collect();
        files.sort();
        files
    };
    fs.remount("ro");
    let before = listing(&path);

    let err = Store::open_existing(&path)
        .err()
        .expect("sled opened a read-only database");
    assert!(err.is_read_only(), "{err}");
    let (s, copy) = Store::open_existing_or_copy(&path).unwrap();
    let copy = copy.expect("read from a copy");
    assert!(copy.starts_with(std::env::temp_dir()), "{}", copy.display());
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the copy is readable by others");
    assert_eq!(s.incident(inc.id).unwrap().unwrap().service, "web");
    assert_eq!(sample_count(&s, inc.id), 300);
    let report = s.check(|_| {}).unwrap();
    assert_eq!((report.samples, report.undecodable), (300, 0), "{report:?}");
    drop(s);
    assert!(!copy.exists(), "the copy {} is left", copy.display());
    assert_eq!(listing(&path), before, "the original changed");
    // On a writable file system the database is opened in place.
    fs.remount("rw");
    let (s, copy) = Store::open_existing_or_copy(&path).unwrap();
    assert!(copy.is_none());
    assert_eq!(sample_count(&s, inc.id), 300);
}
