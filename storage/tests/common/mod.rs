//! Helpers shared by the storage integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::ffi::OsStr;
use std::io::BufRead;
use std::process::Command;

use model::Probe;
use storage::{NewIncident, SampleFilter, Store};

pub const T0: u64 = 1_790_000_000_000_000_000;
pub const SEC: u64 = 1_000_000_000;

pub fn new_incident(service: &str, opened_ns: u64) -> NewIncident {
    NewIncident {
        service: service.to_string(),
        probes: vec![Probe::TcpSocketRead],
        opened_ns,
        evidence_json: r#"{"quantile":0.99,"observed_ns":21000000}"#.to_string(),
        stages_json: r#"{"stage":"application-read"}"#.to_string(),
    }
}

/// Samples stored for incident `id`.
#[allow(clippy::unwrap_used)] // a test helper: a failed read fails the test
pub fn sample_count(s: &Store, id: u64) -> u64 {
    s.sample_summary(id, &SampleFilter::default())
        .unwrap()
        .count
}

/// A stored value's envelope: version byte, CRC32C of version and payload (big-endian),
/// payload. Written here rather than by the store, to make records as earlier builds did.
pub fn envelope(version: u8, payload: &[u8]) -> Vec<u8> {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[version]), payload);
    let mut out = vec![version];
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// sled below the store; its I/O threads let go of a dropped database's lock a moment late.
#[allow(clippy::unwrap_used)] // a test helper: a database that does not open fails the test
pub fn open_raw(path: &std::path::Path) -> sled::Db {
    for _ in 0..150 {
        match sled::open(path) {
            Ok(db) => return db,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    sled::open(path).unwrap()
}

/// This test executable again, to run only `test` (ignored or not) as a child process,
/// with `env` set to `value` so that the test knows to play the child's part.
#[allow(clippy::unwrap_used)] // a test helper: failing to find itself fails the test
pub fn rerun_as_child(test: &str, env: &str, value: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        test,
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(env, value);
    cmd
}

/// Read a child's lines until one contains `marker`; panics, naming `child`, if the
/// output ends first.
#[allow(clippy::unwrap_used)] // a test helper: a failed read fails the test
pub fn wait_for_line(out: &mut impl BufRead, marker: &str, child: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "{child} ended early");
        if line.contains(marker) {
            return;
        }
    }
}

/// A small tmpfs, unmounted when dropped (needs root).
pub struct SmallFs(std::path::PathBuf);

#[allow(clippy::unwrap_used)] // a test helper: a failed mount fails the test
impl SmallFs {
    pub fn mount(dir: &std::path::Path, size: &str) -> SmallFs {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs (needs root)");
        SmallFs(dir.to_path_buf())
    }

    /// `mount -o remount,<options>`.
    pub fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -o remount,{options}");
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
