//! The daemon's allocator settings, on the real binary: glibc's per-thread caches are off
//! when it runs (it executes itself again with the tunable set, keeping its pid), an
//! operator's own setting is left as given, its threads share two arenas, and the heap
//! figures reach the status.
//!
//! Needs root and the `tailtrap` binary of the same build (`cargo build -p tailtrap`).
#![allow(clippy::unwrap_used)] // test code: a failed step should panic with its context

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tailtrap_tests::{cli_json, Daemon, DaemonConfig, ScratchDir};

fn config(dir: &Path) -> PathBuf {
    DaemonConfig::new(dir).without_metrics().write().unwrap()
}

/// The daemon's status once its heap figures are in (read as the trimming thread starts).
fn status_with_heap(daemon: &Daemon, config: &Path) -> Value {
    daemon.wait_for_api(config, Duration::from_secs(60));
    daemon.wait_for(Duration::from_secs(90), "the heap figures", || {
        let (s, _) = cli_json(config, &["status", "--json"]);
        s["process"]["heap_arena_bytes"].is_u64().then_some(s)
    })
}

/// glibc's thread arenas in process `pid`: each is a read-write anonymous mapping at an
/// address aligned to its 64 MiB reservation (the main heap is `[heap]`).
fn thread_arenas(pid: u32) -> usize {
    const ARENA_ALIGN: u64 = 64 << 20;
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let start = f
                .first()
                .and_then(|r| r.split('-').next())
                .and_then(|a| u64::from_str_radix(a, 16).ok());
            f.len() == 5 && f[1] == "rw-p" && start.is_some_and(|a| a % ARENA_ALIGN == 0)
        })
        .count()
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn the_daemon_runs_without_glibcs_per_thread_caches_unless_told_otherwise() {
    let scratch = ScratchDir::new("allocator").unwrap();
    let dir = scratch.path();
    let config = config(dir);

    // Started as an operator would, with other tunables of their own.
    let other = ("GLIBC_TUNABLES", OsStr::new("glibc.malloc.check=0"));
    let mut daemon = Daemon::start(&config, dir, &[other]).unwrap();
    let pid = daemon.pid();
    let s = status_with_heap(&daemon, &config);
    assert_eq!(s["process"]["heap_thread_caches_off"], true, "{s}");
    assert_eq!(s["daemon"]["pid"], pid, "the same process, executed again");
    // Under its own name still (executed through /proc/self/exe, the kernel would call it
    // `exe`), so that ps, top and pgrep find it.
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(name.trim_end(), "tailtrap", "the process's name");
    let arena = s["process"]["heap_arena_bytes"].as_u64().unwrap();
    let rss = s["process"]["rss_bytes"].as_u64().unwrap();
    assert!(arena > 0 && arena < rss, "heap {arena} B, RSS {rss} B");
    assert!(s["process"]["heap_mapped_bytes"].is_u64(), "{s}");
    // The second execution's environment, as it started (its children get the operator's
    // again: faults.rs checks pwru's). glibc's loader may cut GLIBC_TUNABLES up in place
    // as it reads it, so the tunables are looked for one by one.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    let vars: Vec<&str> = environ.split('\0').collect();
    assert!(
        vars.contains(&"TAILTRAP_GIVEN_GLIBC_TUNABLES=glibc.malloc.check=0")
            && environ.contains("glibc.malloc.check=0")
            && environ.contains("glibc.malloc.tcache_count=0"),
        "the second execution's environment: {vars:?}"
    );
    // Its threads share two arenas (the main heap and one more): glibc would give most of
    // its threads one each.
    assert!(
        thread_arenas(pid) <= 1,
        "{} thread arenas in {}",
        thread_arenas(pid),
        std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
    );
    daemon.kill().unwrap();

    // An operator's own setting of the caches is left alone, and said so.
    let own = ("GLIBC_TUNABLES", OsStr::new("glibc.malloc.tcache_count=7"));
    let daemon = Daemon::start(&config, dir, &[own]).unwrap();
    let s = status_with_heap(&daemon, &config);
    assert_eq!(s["process"]["heap_thread_caches_off"], false, "{s}");
    assert!(
        daemon
            .log()
            .contains("glibc's per-thread caches as GLIBC_TUNABLES sets them"),
        "{}",
        daemon.log()
    );
}
