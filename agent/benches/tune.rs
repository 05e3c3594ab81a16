//! `tailtrap tune` cost: the real binary, reading a scratch database offline, over one
//! service-week of 10 s history and over 6 h of 1 s history, 8 candidates each (plus the
//! settings in force). The history is written through the storage API from a simulated
//! series (detector scenario: diurnal rate, one step anomaly). Prints the CPU time (user +
//! system) and wall time of each run; asserts nothing. Needs no root.
//!
//! `cargo bench -p tailtrap --bench tune` (TAILTRAP_BENCH_PROBES sets the probes per
//! service, 1 to 7, default 3; TAILTRAP_BENCH_DIR keeps the databases).
//! TAILTRAP_BENCH_BEFORE=PATH also runs another build's `tailtrap` (e.g. the last
//! commit's), right before this one on the same database each time, prints both CPU
//! times side by side and whether their `--json` answers are byte-identical.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, UNIX_EPOCH};

use detector::scenario::Scenario;
use nix::sys::resource::{getrusage, UsageWho};
use storage::{Store, StoreConfig};

const TAILTRAP: &str = env!("CARGO_BIN_EXE_tailtrap");

/// A TCP service's probes first (ip-start last: shared with UDP), then UDP's.
const PROBES: [&str; 7] = [
    "tcp-start",
    "tcp-socket-enqueued",
    "tcp-socket-read",
    "ip-start",
    "udp-start",
    "udp-socket-enqueued",
    "udp-socket-read",
];

fn scenario(duration: &str, interval: &str, probes: usize) -> String {
    let mut s = format!(
        r#"
seed = 3
start = "2026-01-05T00:00:00Z"
duration = "{duration}"
interval = "{interval}"

[[services]]
name = "web"
rate = 2000
diurnal_swing = 0.5
"#
    );
    for p in &PROBES[..probes] {
        s.push_str(&format!(
            r#"
[[services.probes]]
probe = "{p}"
latency = [{{ kind = "log-normal", weight = 1, median = "100us", sigma = 0.4 }}, {{ kind = "pareto", weight = 0.01, scale = "1ms", alpha = 2 }}]
"#
        ));
    }
    s.push_str(
        r#"
[[anomalies]]
service = "web"
kind = "step"
start = "3h"
duration = "20m"
factor = 4
"#,
    );
    s
}

/// Write the scenario's series into a fresh database at `dir`; returns the end, ns.
fn build(dir: &Path, text: &str) -> u64 {
    let sc = Scenario::from_toml_str(text, "bench.toml").expect("scenario");
    let store = Store::open(dir, StoreConfig::default()).expect("store");
    let step = u64::try_from(sc.interval.as_nanos()).expect("interval");
    let mut end = 0;
    for interval in sc.generate() {
        for rec in interval {
            let since_epoch = rec.ts.duration_since(UNIX_EPOCH).expect("after 1970");
            let ts = u64::try_from(since_epoch.as_nanos()).expect("before 2554");
            store
                .record_history(&rec.service, rec.probe, ts - step, &rec.hist)
                .expect("history");
            end = ts;
        }
    }
    store.flush().expect("flush");
    end
}

fn children_cpu() -> Duration {
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(u.user_time()) + tv(u.system_time())
}

fn fmt_rfc3339(ns: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
}

/// What one `tailtrap tune` run cost and answered.
struct Run {
    cpu: Duration,
    wall: Duration,
    rows: usize,
    points: u64,
    stdout: Vec<u8>,
}

/// Run `bin tune` offline with 8 candidates (or none: the settings in force only).
fn tune(bin: &Path, dir: &Path, from: u64, to: u64, resolution: &str, sweep: bool) -> Run {
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    let out = Command::new(bin)
        .args(["tune", "web", "--json", "--resolution", resolution])
        .args(["--from", &fmt_rfc3339(from), "--to", &fmt_rfc3339(to)])
        .args(if sweep {
            &["--sweep", "min_ratio=1.1,1.25,1.5,2,3,4,6,8"][..]
        } else {
            &[][..]
        })
        .arg("--db")
        .arg(dir.join("db"))
        .arg("--socket")
        .arg(dir.join("no-daemon.sock"))
        .arg("--config")
        .arg(dir.join("none.toml"))
        .output()
        .expect("running tailtrap");
    let wall = t0.elapsed();
    let cpu = children_cpu() - cpu0;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    Run {
        cpu,
        wall,
        rows: v["candidates"].as_array().map_or(0, Vec::len),
        points: v["points"].as_u64().unwrap_or(0),
        stdout: out.stdout,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let probes: usize = std::env::var("TAILTRAP_BENCH_PROBES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .clamp(1, PROBES.len());
    // TAILTRAP_BENCH_DIR keeps the databases there (and reuses them), e.g. to profile or to
    // compare two builds' answers on the same history.
    let kept = std::env::var_os("TAILTRAP_BENCH_DIR").map(std::path::PathBuf::from);
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = kept.as_deref().unwrap_or(temp.path());
    std::fs::create_dir_all(dir).expect("TAILTRAP_BENCH_DIR");
    // An empty config file: the built-in defaults (daemon interval 1 s).
    std::fs::write(dir.join("none.toml"), "").expect("config");
    let before = std::env::var_os("TAILTRAP_BENCH_BEFORE").map(std::path::PathBuf::from);
    println!("tailtrap tune, offline, 8 candidates + the settings in force, {probes} probe(s)");
    if let Some(b) = &before {
        println!("before: {}", b.display());
    }
    println!(
        "{:<40} {:>9} {:>9} {:>9} {:>6} {:>11} {:>10}",
        "history", "points", "cpu", "wall", "rows", "cpu before", "same json"
    );
    for (name, duration, interval, res) in [
        ("one week at 10 s", "7d", "10s", "10s"),
        ("6 h at 1 s", "6h", "1s", "1s"),
    ] {
        let sub = dir.join(format!("{interval}-{probes}"));
        std::fs::create_dir_all(&sub).expect("dir");
        std::fs::write(sub.join("none.toml"), "").expect("config");
        let built = Instant::now();
        let end_file = sub.join("end");
        let end = match std::fs::read_to_string(&end_file)
            .ok()
            .and_then(|s| s.parse().ok())
        {
            Some(end) => end,
            None => {
                let end = build(&sub.join("db"), &scenario(duration, interval, probes));
                std::fs::write(&end_file, end.to_string()).expect("end");
                end
            }
        };
        let span = humantime::parse_duration(duration).expect("span");
        let from = end - u64::try_from(span.as_nanos()).expect("span");
        eprintln!("({name}: database written in {:.1?})", built.elapsed());
        // The settings in force alone: reading plus one replay, to split the cost.
        for (label, sweep) in [("", true), (", in force only", false)] {
            let old = before
                .as_deref()
                .map(|b| tune(b, &sub, from, end, res, sweep));
            let r = tune(Path::new(TAILTRAP), &sub, from, end, res, sweep);
            if let Some(o) = old.as_ref().filter(|o| o.stdout != r.stdout) {
                // Kept for a diff.
                let tag = if sweep { "sweep" } else { "in-force" };
                std::fs::write(sub.join(format!("{tag}-before.json")), &o.stdout).expect("save");
                std::fs::write(sub.join(format!("{tag}-after.json")), &r.stdout).expect("save");
            }
            let (old_cpu, same) = match &old {
                Some(o) => (
                    format!("{:.2}s", o.cpu.as_secs_f64()),
                    if o.stdout == r.stdout { "yes" } else { "NO" },
                ),
                None => ("-".to_string(), "-"),
            };
            println!(
                "{:<40} {:>9} {:>8.2}s {:>8.2}s {:>6} {old_cpu:>11} {same:>10}",
                format!("{name}{label}"),
                r.points,
                r.cpu.as_secs_f64(),
                r.wall.as_secs_f64(),
                r.rows
            );
        }
    }
}
