//! The daemon's `/metrics` listener on its own: a bad `[metrics] listen` stops the start
//! before anything is loaded, and scrapers that hang or flood do not slow the interval loop.
//!
//! Needs root and the `tailtrap` binary of the same build (`cargo build -p tailtrap`).
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tailtrap_tests::{cli_json, http_get, tailtrap_bin, Daemon, DaemonConfig, ScratchDir};

fn config(dir: &Path, listen: &str) -> std::path::PathBuf {
    DaemonConfig::new(dir)
        .metrics_keys(&format!("listen = \"{listen}\""))
        .write()
        .unwrap()
}

/// `tailtrap run --config <path>`, which must fail: its stderr.
fn refused_start(path: &Path) -> String {
    let out = Command::new(tailtrap_bin())
        .args(["run", "--config"])
        .arg(path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

#[test]
fn a_bad_listen_address_stops_the_start_before_anything_is_loaded() {
    let scratch = ScratchDir::new("metrics-bad").unwrap();
    let dir = scratch.path();

    let path = config(dir, "localhost:http");
    let stderr = refused_start(&path);
    assert!(
        stderr.contains(&format!(
            "{}, line 9: key `metrics.listen`: ",
            path.display()
        )),
        "{stderr}"
    );

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let path = config(dir, &addr.to_string());
    let stderr = refused_start(&path);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(&format!("key `metrics.listen`: cannot listen on {addr}: ")),
        "{stderr}"
    );
    // Not half-started: no database, no API socket, no probes loaded.
    assert!(!dir.join("db").exists(), "{stderr}");
    assert!(!dir.join("api.sock").exists(), "{stderr}");
    assert!(!stderr.contains("probe"), "{stderr}");
}

/// Ten seconds of 50 connections that never send a byte and four threads scraping as fast
/// as they can: the interval loop keeps its pace, and a normal scrape still answers.
// Host tier only (timing under qemu's software emulation says nothing about the daemon):
// tests/vm/run-vm-tests.sh leaves this executable out (HOST_ONLY).
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn hanging_and_flooding_scrapers_do_not_slow_the_interval_loop() {
    let scratch = ScratchDir::new("metrics-flood").unwrap();
    let dir = scratch.path();
    let path = config(dir, "127.0.0.1:0");
    let daemon = Daemon::start(&path, dir, &[]).unwrap();
    daemon.wait_for_api(&path, Duration::from_secs(60));
    let status = || cli_json(&path, &["status", "--json"]).0;
    let addr: SocketAddr = status()["daemon"]["metrics_listen"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let first = http_get(addr, "/metrics", None, Duration::from_secs(5)).unwrap();
    assert_eq!(first.status, 200);

    let idle: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..4)
        .map(|i| {
            let (stop, scrapes) = (stop.clone(), scrapes.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if i == 0 {
                        // Half a request, then gone.
                        if let Ok(mut s) = TcpStream::connect(addr) {
                            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
                        }
                    } else if http_get(addr, "/metrics", None, Duration::from_secs(5))
                        .is_ok_and(|a| a.status == 200)
                    {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();

    let before = status()["daemon"]["intervals"].as_u64().unwrap();
    let t0 = Instant::now();
    let mut slowest_scrape = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(10) {
        let t = Instant::now();
        let a = http_get(addr, "/metrics", None, Duration::from_secs(5)).unwrap();
        assert_eq!(a.status, 200);
        slowest_scrape = slowest_scrape.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = status()["daemon"]["intervals"].as_u64().unwrap();
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
    let ran = after - before;
    let expected = elapsed.as_secs_f64() / 0.2;
    eprintln!(
        "{ran} intervals in {elapsed:?} (expected {expected:.0}); {} flood scrapes; slowest \
         scrape {slowest_scrape:?}",
        scrapes.load(Ordering::Relaxed)
    );
    assert!(
        ran as f64 >= 0.8 * expected,
        "the interval loop fell behind: {ran} intervals in {elapsed:?}; log:\n{}",
        daemon.log()
    );
    assert!(scrapes.load(Ordering::Relaxed) > 20);
    assert!(
        slowest_scrape < Duration::from_secs(2),
        "{slowest_scrape:?}"
    );

    // The idle connections were closed by the daemon (header timeout), not left open.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 1];
        let n = std::io::Read::read(&mut s, &mut buf).unwrap_or(0);
        assert_eq!(n, 0, "an idle connection got data");
    }
}
