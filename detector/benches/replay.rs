//! Replay throughput and memory: `cargo bench -p detector --bench replay`.
//!
//! Runs a simulated service-week (scenarios/week.toml: 4 probes, 1 s intervals) through the
//! detector twice over: once fed the generated histograms directly, once through the JSON
//! Lines text of `tailtrap replay` (serialise, parse, feed). Prints interval-histograms per
//! second for each, the generator's own rate, memory per (service, probe) key, and the
//! scenario's recall and false incidents. Then 256 keys (64 services x 4 probes) for the
//! memory figure at scale.

use std::time::Duration;

/// CPU time this thread has run: the first field of /proc/thread-self/schedstat (ns). The
/// machine may be shared, so CPU time, not wall time, is the honest cost; wall time is the
/// fallback where schedstat is missing.
struct Clock {
    wall: std::time::Instant,
}

impl Clock {
    fn new() -> Self {
        Clock {
            wall: std::time::Instant::now(),
        }
    }

    fn now(&self) -> Duration {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .map_or_else(|| self.wall.elapsed(), Duration::from_nanos)
    }
}

use detector::replay::{Record, Replayer};
use detector::scenario::Scenario;
use detector::{Detector, DetectorConfig};

fn main() {
    let week = Scenario::from_toml_str(include_str!("../scenarios/week.toml"), "week.toml")
        .expect("week.toml parses");

    let mut generate = Duration::ZERO;
    let mut direct = Duration::ZERO;
    let mut via_json = Duration::ZERO;
    let mut histograms = 0u64;
    let mut json_bytes = 0usize;
    let mut rp_direct = Replayer::new(Detector::new(DetectorConfig::default()));
    let mut rp_json = Replayer::new(Detector::new(DetectorConfig::default()));
    let mut gen = week.generate();
    let clock = Clock::new();
    let wall = std::time::Instant::now();
    // Hour-long batches keep the clock reads (a file read each) out of the figures.
    loop {
        let t0 = clock.now();
        let batch: Vec<Vec<Record>> = gen.by_ref().take(3600).collect();
        let t1 = clock.now();
        if batch.is_empty() {
            break;
        }
        for rec in batch.iter().flatten() {
            rp_direct.push(rec).expect("in order");
        }
        let t2 = clock.now();
        let lines: Vec<String> = batch.iter().flatten().map(Record::to_json_line).collect();
        let t3 = clock.now();
        for line in &lines {
            let rec = Record::parse(line).expect("own output parses");
            rp_json.push(&rec).expect("in order");
        }
        let t4 = clock.now();
        generate += t1 - t0;
        direct += t2 - t1;
        via_json += t4 - t3;
        histograms += batch.iter().map(Vec::len).sum::<usize>() as u64;
        json_bytes += lines.iter().map(|l| l.len() + 1).sum::<usize>();
    }
    let (incidents, detector) = rp_direct.finish();
    let (incidents_json, _) = rp_json.finish();
    assert_eq!(incidents.len(), incidents_json.len(), "both paths agree");

    let rate = |d: Duration| histograms as f64 / d.as_secs_f64();
    println!("service-week replay ({histograms} interval-histograms, 4 probes, 1 s intervals)");
    println!(
        "(CPU time of the benchmark thread; the whole run took {:.0}s of wall time)",
        wall.elapsed().as_secs_f64()
    );
    println!(
        "{:<34} {:>12} {:>16} {:>8}",
        "path", "CPU", "histograms/s", "ratio"
    );
    for (name, d) in [
        ("detector (observe + end_interval)", direct),
        ("JSON Lines parse + detector", via_json),
        ("scenario generator", generate),
    ] {
        println!(
            "{name:<34} {:>11.2}s {:>16.0} {:>8.2}",
            d.as_secs_f64(),
            rate(d),
            d.as_secs_f64() / direct.as_secs_f64()
        );
    }
    println!(
        "JSON Lines: {:.0} MB for the week, {:.0} bytes per line",
        json_bytes as f64 / 1e6,
        json_bytes as f64 / histograms as f64
    );
    let saved: usize = detector
        .save_baselines()
        .iter()
        .map(|(_, _, b)| b.len())
        .sum();
    println!(
        "memory per (service, probe) key: {} bytes live, {} bytes saved baseline",
        detector.bytes_per_key(),
        saved / detector.save_baselines().len().max(1)
    );

    let score = week.score(&incidents, Duration::from_secs(65));
    println!("\n{:<24} {:>8}  verdict", "anomaly", "delay");
    for o in &score.outcomes {
        let delay = o
            .delay
            .map_or("missed".into(), |d| format!("{}s", d.as_secs()));
        println!(
            "{:<24} {:>8}  {}",
            o.label,
            delay,
            o.verdict.as_deref().unwrap_or("-")
        );
    }
    println!(
        "false incidents: {} in {:.1} quiet service-days",
        score.false_incidents,
        score.quiet_time.as_secs_f64() / 86_400.0
    );

    // Memory at scale: 64 services x 4 probes for ten minutes.
    let mut text = String::from("seed = 9\nstart = \"2026-01-05T00:00:00Z\"\nduration = \"10m\"\n");
    for s in 0..64 {
        text.push_str(&format!("[[services]]\nname = \"svc{s}\"\nrate = 500\n"));
        for p in [
            "ip-start",
            "tcp-start",
            "tcp-socket-enqueued",
            "tcp-socket-read",
        ] {
            text.push_str(&format!(
                "[[services.probes]]\nprobe = \"{p}\"\nlatency = [{{ kind = \"log-normal\", weight = 1, median = \"50us\", sigma = 0.5 }}]\n"
            ));
        }
    }
    let many = Scenario::from_toml_str(&text, "64 services").expect("generated scenario");
    let mut rp = Replayer::new(Detector::new(DetectorConfig::default()));
    let mut gen = many.generate();
    let mut fed = 0u64;
    let mut took = Duration::ZERO;
    loop {
        let batch: Vec<Vec<Record>> = gen.by_ref().take(60).collect();
        if batch.is_empty() {
            break;
        }
        let t0 = clock.now();
        for rec in batch.iter().flatten() {
            rp.push(rec).expect("in order");
        }
        took += clock.now() - t0;
        fed += batch.iter().map(Vec::len).sum::<usize>() as u64;
    }
    let (_, detector) = rp.finish();
    println!(
        "\n64 services x 4 probes: {} bytes per key, {:.0} histograms/s, {:.2} ms per 1 s interval",
        detector.bytes_per_key(),
        fed as f64 / took.as_secs_f64(),
        took.as_secs_f64() * 1e3 / many.intervals() as f64
    );
}
