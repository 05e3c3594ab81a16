//! Storage benchmarks (not tests): `cargo bench -p storage --bench store`.
//!
//! Prints one table: batched sample writes per second, reading an incident of 10k samples
//! with its summary from a 1 GiB store, reading one service-day of 10 s history, and
//! on-disk bytes per sample. The 1 GiB store is built once under /tmp and reused
//! (`TAILTRAP_BENCH_DIR` overrides the place; delete it to rebuild).
//!
//! Figures of the one-record-per-sample layout (schema 1), for comparison, are in
//! docs/storage.md; that write path is gone, so it is not measured here.
#![allow(clippy::unwrap_used)] // a benchmark aborts on any failure

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use model::{Histogram, Probe, Sample};
use storage::{HistoryLevel, NewIncident, SampleFilter, Store, StoreConfig};

const T0: u64 = 1_790_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;
const BATCH: u64 = 1000;
const INCIDENT_SAMPLES: u64 = 10_000;
const BIG_STORE_BYTES: u64 = 1 << 30;

fn sample(incident: u64, i: u64) -> Sample {
    model::fixtures::sample(incident, i, T0 + incident * 3600 * SEC + i * 97_000)
}

fn new_incident(opened_ns: u64) -> NewIncident {
    NewIncident {
        service: "web".into(),
        probes: vec![Probe::TcpSocketRead],
        opened_ns,
        evidence_json: r#"{"quantile":0.99,"baseline_ns":900000,"observed_ns":21000000}"#.into(),
        stages_json: r#"{"stage":"application-read"}"#.into(),
    }
}

/// Write `n` samples to one incident in batches, then flush; returns (wall, CPU) time of
/// the store's work (the samples are built beforehand).
fn write_samples(store: &Store, incident: u64, n: u64) -> (Duration, Duration) {
    let batches: Vec<Vec<Sample>> = (0..n)
        .step_by(BATCH as usize)
        .map(|i| {
            (i..(i + BATCH).min(n))
                .map(|k| sample(incident, k))
                .collect()
        })
        .collect();
    timed(1, || {
        for b in &batches {
            store.put_samples(b).unwrap();
        }
        store.flush().unwrap();
    })
}

/// CPU time of this process, all threads (sled works in background threads too), from
/// /proc/self/stat in USER_HZ (100/s) ticks. The machine may be shared: CPU time shows what
/// the work costs, wall time what it took here.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    Duration::from_millis((f[0] + f[1]) * 10)
}

/// Wall and CPU time of `runs` calls of `f`, per call.
fn timed(runs: u32, mut f: impl FnMut()) -> (Duration, Duration) {
    let (wall, cpu) = (Instant::now(), cpu_time());
    for _ in 0..runs {
        f();
    }
    (wall.elapsed() / runs, (cpu_time() - cpu) / runs)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Named after the schema version: a store built by an earlier layout is not reused.
fn big_store_dir() -> PathBuf {
    std::env::var_os("TAILTRAP_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!(
                "/tmp/tailtrap-bench-1g-schema{}",
                storage::SCHEMA_VERSION
            ))
        })
}

fn big_config() -> StoreConfig {
    StoreConfig {
        max_bytes: 4 << 30,
        ..StoreConfig::default()
    }
}

/// Build (or reuse) a store of at least 1 GiB on disk made of 10k-sample incidents.
fn big_store(dir: &Path) -> (Store, (Duration, Duration), bool) {
    let done = dir.join("complete");
    let path = dir.join("db");
    let reused = done.exists();
    if !reused {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let store = Store::open(&path, big_config()).unwrap();
        eprintln!("building the 1 GiB store in {} (once)...", dir.display());
        let mut k = 0u64;
        while store.size_on_disk().unwrap() < BIG_STORE_BYTES {
            let mut inc = store
                .open_incident(&new_incident(T0 + k * 3600 * SEC))
                .unwrap();
            write_samples(&store, inc.id, INCIDENT_SAMPLES);
            store
                .close_incident(&mut inc, T0 + k * 3600 * SEC + 120 * SEC)
                .unwrap();
            k += 1;
            if k % 50 == 0 {
                eprintln!(
                    "  {k} incidents, {} MiB on disk",
                    store.size_on_disk().unwrap() >> 20
                );
            }
        }
        drop(store);
        std::fs::write(&done, b"").unwrap();
    }
    let mut store = None;
    let open_time = timed(1, || {
        store = Some(Store::open(&path, big_config()).unwrap())
    });
    (store.unwrap(), open_time, reused)
}

fn history_day() -> (Duration, Duration, usize) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        history: vec![
            HistoryLevel {
                resolution: Duration::from_secs(10),
                keep: Duration::from_secs(3 * 86_400),
            },
            HistoryLevel {
                resolution: Duration::from_secs(60),
                keep: Duration::from_secs(30 * 86_400),
            },
        ],
        ..StoreConfig::default()
    };
    let store = Store::open(dir.path().join("db"), cfg).unwrap();
    let day_start = T0 - T0 % (86_400 * SEC);
    // A realistic interval: a few thousand packets over ~30 buckets.
    for k in 0..8640u64 {
        let mut h = Histogram::new();
        for j in 0..3000u64 {
            h.record(20_000 + (j * j * 37 + k * 101) % 5_000_000);
        }
        store
            .record_history("web", Probe::TcpSocketRead, day_start + k * 10 * SEC, &h)
            .unwrap();
    }
    store.flush().unwrap();
    let now = day_start + 86_400 * SEC;
    let mut points = 0;
    let (wall, cpu) = timed(20, || {
        let series = store
            .history("web", Probe::TcpSocketRead, day_start, now - 1, now)
            .unwrap();
        assert_eq!(series.resolution, Duration::from_secs(10));
        points = series.points.len();
    });
    (wall, cpu, points)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let mut rows: Vec<[String; 5]> = Vec::new();
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);

    // 1. Batched writes and bytes per sample, on a fresh store.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
    let inc = store.open_incident(&new_incident(T0)).unwrap();
    let n = 500_000;
    let (wall, cpu) = write_samples(&store, inc.id, n);
    let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-6);
    rows.push([
        format!("batched sample writes ({BATCH}/batch, {n} samples, incl. flush)"),
        format!("{:.0}/s", rate(wall)),
        format!("{:.0}/s", rate(cpu)),
        "≥ 100000/s".into(),
        format!("{:.2}x", rate(cpu) / 100_000.0),
    ]);
    let disk = store.size_on_disk().unwrap();
    let live = store.stats().live_bytes;
    rows.push([
        "on-disk bytes per sample (sled files / samples)".into(),
        format!("{:.0} B", disk as f64 / n as f64),
        "-".into(),
        "-".into(),
        format!("live data {:.0} B/sample", live as f64 / n as f64),
    ]);
    drop(store);

    // 2. One incident of 10k samples and its summary, from a 1 GiB store.
    let big = big_store_dir();
    let (store, (open_wall, open_cpu), reused) = big_store(&big);
    let on_disk = store.size_on_disk().unwrap();
    let incidents = store
        .incidents(&storage::IncidentQuery::default())
        .unwrap()
        .incidents;
    let target = incidents[incidents.len() / 2].id;
    let (wall, cpu) = timed(20, || {
        let page = store
            .samples(target, &SampleFilter::default(), None, 10_000)
            .unwrap();
        let summary = store
            .sample_summary(target, &SampleFilter::default())
            .unwrap();
        assert_eq!(page.samples.len() as u64, INCIDENT_SAMPLES);
        assert_eq!(summary.count, INCIDENT_SAMPLES);
    });
    rows.push([
        format!(
            "read incident (10k samples) + summary, {} MiB store{}",
            on_disk >> 20,
            if reused { " (reused)" } else { "" }
        ),
        ms(wall),
        ms(cpu),
        "≤ 100 ms".into(),
        format!("{:.1}x under", 0.1 / cpu.as_secs_f64().max(1e-6)),
    ]);
    rows.push([
        format!(
            "open the {} MiB store (reads every record once)",
            on_disk >> 20
        ),
        format!("{:.2} s", open_wall.as_secs_f64()),
        format!("{:.2} s", open_cpu.as_secs_f64()),
        "-".into(),
        format!("{} incidents", incidents.len()),
    ]);
    drop(store);

    // 3. One service-day of 10 s history.
    let (wall, cpu, points) = history_day();
    rows.push([
        format!("read one service-day of 10 s history ({points} points)"),
        ms(wall),
        ms(cpu),
        "≤ 50 ms".into(),
        format!("{:.1}x under", 0.05 / cpu.as_secs_f64().max(1e-6)),
    ]);

    println!();
    println!("load average during the run: {}", load_average());
    println!("| benchmark | wall | CPU (all threads) | target | ratio to target (CPU) / note |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
    }
}
