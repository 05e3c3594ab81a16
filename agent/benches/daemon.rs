//! Daemon cost benchmark (needs root): the real `tailtrap run` with 1 and with 64 configured
//! services, loopback TCP traffic to every service, CPU time per interval and resident
//! memory read from its own status report. Prints a table; asserts nothing.
//!
//! `cargo bench -p tailtrap --bench daemon` (TAILTRAP_BENCH_SECS sets the run length, 20 s
//! by default).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TAILTRAP: &str = env!("CARGO_BIN_EXE_tailtrap");

struct Run {
    services: usize,
    intervals: u64,
    cpu_s: f64,
    rss_bytes: u64,
    reads_per_s: f64,
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
    let out = Command::new(TAILTRAP)
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
        "[daemon]\ninterval = \"1s\"\ndb = \"{d}/db-{services}\"\n[api]\nsocket = \"{d}/api-{services}.sock\"\n[pwru]\nenabled = false\n",
        d = dir.display()
    );
    for (i, p) in ports.iter().enumerate() {
        config.push_str(&format!("[[services]]\nname = \"svc{i}\"\nports = [{p}]\n"));
    }
    let path = dir.join(format!("bench-{services}.toml"));
    std::fs::write(&path, config).expect("write config");
    let mut daemon: Child = Command::new(TAILTRAP)
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
    std::thread::sleep(Duration::from_secs(secs));
    let after = status(&path).expect("status");
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
        rss_bytes: after["process"]["rss_bytes"].as_u64().unwrap_or(0),
        reads_per_s: reads as f64 / elapsed,
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
    let runs: Vec<Run> = [1usize, 64].iter().map(|&n| run(n, secs, &dir)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    println!("daemon cost, {secs} s per run, 1 s interval, loopback TCP ping-pong per service");
    println!(
        "{:>8} {:>9} {:>16} {:>10} {:>12} {:>10}",
        "services", "intervals", "CPU/interval", "RSS", "reads/s", "vs 1 svc"
    );
    let base = runs
        .first()
        .map_or(1.0, |r| r.cpu_s / r.intervals.max(1) as f64);
    for r in &runs {
        let per = r.cpu_s / r.intervals.max(1) as f64;
        println!(
            "{:>8} {:>9} {:>13.2} ms {:>7.1} MiB {:>12.0} {:>9.2}x",
            r.services,
            r.intervals,
            per * 1e3,
            r.rss_bytes as f64 / (1 << 20) as f64,
            r.reads_per_s,
            per / base
        );
    }
}
