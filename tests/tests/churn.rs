//! Container churn: the real `tailtrap run` daemon groups sockets by cgroup (no services
//! configured, `auto_service_limit = 64`) while 500 cgroups come and go in waves of 20,
//! each with an echo server under traffic. Slots of removed cgroups must be freed and
//! reused: every live cgroup gets its own service, nothing lands in `other`, and the
//! daemon's memory and BPF map entries stay bounded.
//!
//! Needs root and the `tailtrap` binary of the same build (`cargo build -p tailtrap`).
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use tailtrap_tests::{
    cli, cli_json, rss_kib, vm_kernel, Cgroup, Daemon, DaemonConfig, ScratchDir, ServerOpts,
    TcpServer,
};

/// Waves in CI; `TAILTRAP_CHURN_WAVES=N` runs a longer churn (e.g. 250 for 5 000 cgroups) to
/// see whether memory levels off, and `TAILTRAP_CHURN_CACHE_BYTES=N` sets the daemon's
/// `storage.cache_bytes` (to tell sled's page cache from other growth).
const WAVES: usize = 25;
const PER_WAVE: usize = 20;
const LIMIT: usize = 64;

/// Short echo exchanges against every address, round robin, until stopped: the traffic of
/// a wave. The client sockets live in the test's own cgroup (one more auto service).
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(addrs: Vec<SocketAddr>, exchanges: Arc<AtomicU64>) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 100];
            while !flag.load(Ordering::Relaxed) {
                for addr in &addrs {
                    let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_secs(1)) else {
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    for _ in 0..5 {
                        if s.write_all(&buf).is_err() || s.read_exact(&mut buf).is_err() {
                            break;
                        }
                        exchanges.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Entries of the BPF map `name` (bpftool, when installed); `None` when bpftool is missing
/// or several maps have that name (another tailtrap loaded at the same time).
fn map_entries(name: &str) -> Option<usize> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "name", name])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let entries = v.as_array()?;
    // Several maps of that name come as one object per map, each with its elements.
    if entries.iter().any(|e| e.get("elements").is_some()) {
        return None;
    }
    Some(entries.len())
}

fn counter(status: &Value, name: &str) -> u64 {
    status["kernel_counters"][name].as_u64().unwrap_or(0)
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn churning_cgroups_reuse_freed_slots_and_none_land_in_other() {
    let started = Instant::now();
    let scratch = ScratchDir::new("churn").unwrap();
    let dir = scratch.path();
    let storage = std::env::var("TAILTRAP_CHURN_CACHE_BYTES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|n| format!("[storage]\ncache_bytes = {n}"))
        .unwrap_or_default();
    let config = DaemonConfig::new(dir)
        .interval("100ms")
        .without_metrics()
        .table(&format!("[probes]\nauto_service_limit = {LIMIT}"))
        .table(&storage)
        .write()
        .unwrap();
    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    let timeout = if vm_kernel().is_some() {
        Duration::from_secs(120)
    } else {
        Duration::from_secs(30)
    };
    daemon.wait_for_api(&config, timeout);

    let exchanges = Arc::new(AtomicU64::new(0));
    let mut first_wave = String::new();
    let mut rss_after_warmup = 0;
    let mut rss_mid = 0;
    let mut max_entries = 0;
    let waves = std::env::var("TAILTRAP_CHURN_WAVES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n >= 5)
        .unwrap_or(WAVES);
    let mut rss_per_wave = Vec::with_capacity(waves);
    for wave in 0..waves {
        let cgroups: Vec<Cgroup> = (0..PER_WAVE)
            .map(|i| Cgroup::create(&format!("churn-{wave}-{i}")).unwrap())
            .collect();
        let servers: Vec<TcpServer> = cgroups
            .iter()
            .map(|cg| {
                TcpServer::spawn(ServerOpts {
                    cgroup: Some(cg),
                    ..ServerOpts::loopback()
                })
                .unwrap()
            })
            .collect();
        let traffic = Traffic::start(
            servers.iter().map(|s| s.addr()).collect(),
            exchanges.clone(),
        );
        // Every live cgroup shows up under its own name at the server's socket reads.
        let want: BTreeSet<String> = cgroups.iter().map(|c| c.rel_path().to_owned()).collect();
        let mut seen = BTreeSet::new();
        daemon.wait_for(timeout, &format!("wave {wave}'s services"), || {
            let (status, _) = cli_json(&config, &["status", "--json"]);
            for row in status["latency"].as_array().into_iter().flatten() {
                let service = row["service"].as_str().unwrap_or_default();
                assert_ne!(service, "other", "wave {wave}: {row}");
                if row["probe"] == "tcp-socket-read" && want.contains(service) {
                    seen.insert(service.to_owned());
                }
            }
            assert_eq!(counter(&status, "auto_overflow"), 0, "wave {wave}");
            (seen.len() == want.len()).then_some(())
        });
        if let Some(n) = map_entries("auto_cgroups") {
            max_entries = max_entries.max(n);
        }
        if wave == 0 {
            first_wave = cgroups[0].rel_path().to_owned();
        }
        if wave == 4 {
            rss_after_warmup = rss_kib(daemon.pid());
        }
        if wave == waves / 2 {
            rss_mid = rss_kib(daemon.pid());
        }
        rss_per_wave.push(rss_kib(daemon.pid()));
        // Servers first, so the traffic thread's connections fail fast; then the cgroups.
        drop(servers);
        drop(traffic);
        drop(cgroups);
    }

    // Every removed cgroup's slot is freed within a couple of intervals.
    let freed_at_least = (waves * PER_WAVE) as u64;
    let status = daemon.wait_for(timeout, "every churned slot to be freed", || {
        let (status, _) = cli_json(&config, &["status", "--json"]);
        (counter(&status, "auto_freed") >= freed_at_least).then_some(status)
    });
    assert_eq!(counter(&status, "auto_overflow"), 0);
    let rss_end = rss_kib(daemon.pid());
    let every = (waves / 25).max(1);
    let series: Vec<String> = rss_per_wave
        .iter()
        .enumerate()
        .filter(|(i, _)| (i + 1) % every == 0)
        .map(|(i, kib)| format!("{}:{kib}", (i + 1) * PER_WAVE))
        .collect();
    eprintln!("churn: RSS KiB after N cgroups: {}", series.join(" "));
    // No growth with the number of cgroups seen: allow the allocator some slack.
    assert!(
        rss_end <= rss_after_warmup + 8 * 1024,
        "RSS grew from {rss_after_warmup} KiB to {rss_end} KiB"
    );
    assert!(
        max_entries <= LIMIT,
        "auto_cgroups held {max_entries} entries"
    );
    // The removed cgroups' entries are gone (what is left: the test's own cgroup and any
    // other traffic on the machine).
    if let Some(n) = map_entries("auto_cgroups") {
        assert!(n < PER_WAVE, "auto_cgroups still holds {n} entries");
    }
    eprintln!(
        "churn: {} cgroups in {:.1} s, {} exchanges, {} slots freed, RSS {} -> {} -> {} KiB (waves 5, {}, end), \
         auto_cgroups at most {max_entries} entries",
        waves * PER_WAVE,
        started.elapsed().as_secs_f64(),
        exchanges.load(Ordering::Relaxed),
        counter(&status, "auto_freed"),
        rss_after_warmup,
        rss_mid,
        rss_end,
        waves / 2 + 1,
    );

    // The history of a cgroup long gone stays stored.
    daemon.signal(Signal::SIGTERM).unwrap();
    let mut daemon = daemon;
    daemon.wait_exit(timeout).unwrap();
    let out = cli(
        &config,
        &[
            "history",
            &first_wave,
            "--since",
            "1h",
            "--probe",
            "tcp-socket-read",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.stdout.is_empty(),
        "no history kept for {first_wave}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
