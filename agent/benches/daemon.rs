//! Daemon cost benchmark (needs root): the real `tailtrap run` with 1 and with 64 configured
//! services, loopback TCP traffic to every service, CPU time per interval and resident
//! memory read from its own status report, and the cost of a Prometheus scrape of
//! `/metrics` (the first after an interval renders it, later ones reuse it). Prints tables;
//! asserts nothing.
//!
//! `cargo bench -p tailtrap --bench daemon` (TAILTRAP_BENCH_SECS sets the run length, 20 s
//! by default). With TAILTRAP_BENCH_PERF=PREFIX the measured window of each run is profiled
//! with `perf record -e cpu-clock -g` into PREFIX-<services>.data (`perf report -i ...`);
//! TAILTRAP_BENCH_BIN=PATH measures another build's `tailtrap` (e.g. main's, for a
//! before/after pair run back to back); TAILTRAP_BENCH_SERVICES=64 runs only that
//! configuration (default `1,64`). TAILTRAP_BENCH_PERF_CALL_GRAPH=dwarf attributes allocator and libc time to its callers
//! (the default, frame pointers, loses them).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The daemon to measure: this build's, or TAILTRAP_BENCH_BIN (another build's binary,
/// to compare two versions back to back under the same conditions).
fn tailtrap() -> PathBuf {
    std::env::var_os("TAILTRAP_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tailtrap")))
}

struct Run {
    services: usize,
    intervals: u64,
    cpu_s: f64,
    user_s: f64,
    rss_bytes: u64,
    reads_per_s: f64,
    scrape: Scrape,
}

/// `/metrics` figures: median times of a rendering scrape and of a cached one, sizes.
#[derive(Default)]
struct Scrape {
    render: Duration,
    cached: Duration,
    text_bytes: usize,
    openmetrics_bytes: usize,
    series: usize,
}

/// One GET of `/metrics`: elapsed time and body size (the headers' size is negligible).
fn scrape_once(addr: &str, accept: Option<&str>) -> (Duration, String) {
    let t = Instant::now();
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (t.elapsed(), String::new());
    };
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
    );
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (t.elapsed(), body)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn measure_scrapes(addr: &str, interval: Duration) -> Scrape {
    let mut render = Vec::new();
    let mut cached = Vec::new();
    let mut out = Scrape::default();
    for _ in 0..10 {
        // A new interval: the first scrape renders.
        std::thread::sleep(interval + Duration::from_millis(50));
        let (t, body) = scrape_once(addr, None);
        render.push(t);
        out.text_bytes = body.len();
        out.series = body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        for _ in 0..5 {
            cached.push(scrape_once(addr, None).0);
        }
    }
    out.openmetrics_bytes = scrape_once(addr, Some("application/openmetrics-text"))
        .1
        .len();
    out.render = median(render);
    out.cached = median(cached);
    out
}

/// Echo servers on loopback, one per service, and a client thread per server.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Load {
    fn ports(n: usize) -> (Vec<TcpListener>, Vec<u16>) {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let ports = listeners
            .iter()
            .map(|l| l.local_addr().expect("addr").port())
            .collect();
        (listeners, ports)
    }

    fn start(listeners: Vec<TcpListener>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for l in listeners {
            let port = l.local_addr().expect("addr").port();
            std::thread::spawn(move || {
                while let Ok((mut s, _)) = l.accept() {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 64];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 || s.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            });
            let flag = stop.clone();
            threads.push(std::thread::spawn(move || {
                let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
                    return 0;
                };
                let mut n = 0u64;
                let mut buf = [0u8; 64];
                while !flag.load(Ordering::Relaxed) {
                    if c.write_all(&buf[..32]).is_err() || c.read_exact(&mut buf[..32]).is_err() {
                        break;
                    }
                    n += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                n
            }));
        }
        Load { stop, threads }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap_or(0))
            .sum()
    }
}

fn status(config: &Path) -> Option<serde_json::Value> {
    let out = Command::new(tailtrap())
        .args(["status", "--json", "--config"])
        .arg(config)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

fn run(services: usize, secs: u64, dir: &Path) -> Run {
    let (listeners, ports) = Load::ports(services);
    let mut config = format!(
        "[daemon]\ninterval = \"1s\"\ndb = \"{d}/db-{services}\"\n[api]\nsocket = \"{d}/api-{services}.sock\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n[pwru]\nenabled = false\n",
        d = dir.display()
    );
    for (i, p) in ports.iter().enumerate() {
        config.push_str(&format!("[[services]]\nname = \"svc{i}\"\nports = [{p}]\n"));
    }
    let path = dir.join(format!("bench-{services}.toml"));
    std::fs::write(&path, config).expect("write config");
    let mut daemon: Child = Command::new(tailtrap())
        .args(["run", "--config"])
        .arg(&path)
        .stderr(Stdio::null())
        .spawn()
        .expect("start the daemon");
    let start = Instant::now();
    while status(&path).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Start-up (loading and verifying BPF) is not what is measured.
    let before = status(&path).expect("status");
    let load = Load::start(listeners);
    let t0 = Instant::now();
    let perf = std::env::var("TAILTRAP_BENCH_PERF").ok().map(|prefix| {
        let call_graph =
            std::env::var("TAILTRAP_BENCH_PERF_CALL_GRAPH").unwrap_or_else(|_| "fp".into());
        Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                "997",
                "--call-graph",
            ])
            .arg(call_graph)
            .arg("-p")
            .arg(daemon.id().to_string())
            .arg("-o")
            .arg(format!("{prefix}-{services}.data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start perf record")
    });
    std::thread::sleep(Duration::from_secs(secs));
    let after = status(&path).expect("status");
    if let Some(mut perf) = perf {
        let _ = Command::new("kill")
            .args(["-INT", &perf.id().to_string()])
            .status();
        let _ = perf.wait();
    }
    let scrape = after["daemon"]["metrics_listen"]
        .as_str()
        .map(|addr| measure_scrapes(addr, Duration::from_secs(1)))
        .unwrap_or_default();
    let reads = load.finish();
    let elapsed = t0.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status();
    let _ = daemon.wait();
    let cpu = |v: &serde_json::Value| {
        v["process"]["cpu_user_s"].as_f64().unwrap_or(0.0)
            + v["process"]["cpu_system_s"].as_f64().unwrap_or(0.0)
    };
    let intervals = |v: &serde_json::Value| v["daemon"]["intervals"].as_u64().unwrap_or(0);
    Run {
        services,
        intervals: intervals(&after) - intervals(&before),
        cpu_s: cpu(&after) - cpu(&before),
        user_s: after["process"]["cpu_user_s"].as_f64().unwrap_or(0.0)
            - before["process"]["cpu_user_s"].as_f64().unwrap_or(0.0),
        rss_bytes: after["process"]["rss_bytes"].as_u64().unwrap_or(0),
        reads_per_s: reads as f64 / elapsed,
        scrape,
    }
}

fn main() {
    // `cargo bench` passes --bench; anything else (e.g. `cargo test --benches`) only builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let secs = std::env::var("TAILTRAP_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir: PathBuf = std::env::temp_dir().join(format!("tailtrap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    // TAILTRAP_BENCH_SERVICES=64 measures only that configuration (e.g. for a long window
    // covering the per-minute history write).
    let counts: Vec<usize> = std::env::var("TAILTRAP_BENCH_SERVICES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 64]);
    let runs: Vec<Run> = counts.iter().map(|&n| run(n, secs, &dir)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    println!("daemon cost, {secs} s per run, 1 s interval, loopback TCP ping-pong per service");
    println!(
        "{:>8} {:>9} {:>16} {:>12} {:>10} {:>12} {:>10}",
        "services", "intervals", "CPU/interval", "user/interval", "RSS", "reads/s", "vs 1 svc"
    );
    let base = runs
        .first()
        .map_or(1.0, |r| r.cpu_s / r.intervals.max(1) as f64);
    for r in &runs {
        let per = r.cpu_s / r.intervals.max(1) as f64;
        let user = r.user_s / r.intervals.max(1) as f64;
        println!(
            "{:>8} {:>9} {:>13.2} ms {:>9.2} ms {:>7.1} MiB {:>12.0} {:>9.2}x",
            r.services,
            r.intervals,
            per * 1e3,
            user * 1e3,
            r.rss_bytes as f64 / (1 << 20) as f64,
            r.reads_per_s,
            per / base
        );
    }
    println!();
    println!("GET /metrics (median of 10 rendering and 50 cached scrapes, text format)");
    println!(
        "{:>8} {:>10} {:>10} {:>12} {:>13} {:>8}",
        "services", "render", "cached", "text", "openmetrics", "series"
    );
    for r in &runs {
        let s = &r.scrape;
        println!(
            "{:>8} {:>7.2} ms {:>7.2} ms {:>8.1} KiB {:>9.1} KiB {:>8}",
            r.services,
            s.render.as_secs_f64() * 1e3,
            s.cached.as_secs_f64() * 1e3,
            s.text_bytes as f64 / 1024.0,
            s.openmetrics_bytes as f64 / 1024.0,
            s.series
        );
    }
}
