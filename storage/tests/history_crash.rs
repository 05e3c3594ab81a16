//! A crash between two writes of the coarser history levels: they lag the finest level by
//! up to ten minutes on disk, and the next open completes them from it.
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

mod common;

use std::io::BufReader;
use std::path::Path;
use std::process::Stdio;

use common::{rerun_as_child, wait_for_line, SEC, T0};
use model::{Histogram, Probe};
use storage::{HistoryPoint, Store, StoreConfig};

const CHILD_ENV: &str = "TAILTRAP_STORAGE_HISTORY_CRASH_WRITER";
const MINUTE: u64 = 60 * SEC;
/// Simulated minutes the child records: the coarser levels were last written at the
/// start of minute 21 (every 10 minutes from the first), the finest at minute 25's.
const MINUTES: u64 = 25;
const PROBES: [Probe; 2] = [Probe::TcpSocketRead, Probe::UdpSocketRead];

fn start() -> u64 {
    T0 - T0 % (60 * MINUTE)
}

/// One second's histogram, different from its neighbours' so that sums tell seconds apart.
fn second(i: u64, probe: Probe) -> Histogram {
    let mut h = Histogram::new();
    let base = if probe == Probe::TcpSocketRead {
        1_000
    } else {
        7_000
    };
    h.record_n(base * (i % 53 + 1), i % 7 + 1);
    h
}

/// The child: records `MINUTES` minutes and a few seconds, makes what the store wrote
/// durable without writing the chunks being filled (what the daemon's flusher does between
/// history writes), says so, and waits to be killed.
fn writer(path: &Path) {
    let store = Store::open(path, StoreConfig::default()).unwrap();
    for i in 0..MINUTES * 60 + 5 {
        let hists: Vec<Histogram> = PROBES.iter().map(|&p| second(i, p)).collect();
        let points: Vec<HistoryPoint<'_>> = PROBES
            .iter()
            .zip(&hists)
            .map(|(&probe, hist)| HistoryPoint {
                service: "web",
                probe,
                hist,
            })
            .collect();
        let refused = store
            .record_history_batch(start() + i * SEC, &points)
            .unwrap();
        assert!(refused.is_empty());
    }
    store.flush_records().unwrap();
    println!("\nWRITTEN");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Every point of every level of (web, probe) over the first `MINUTES` minutes.
fn levels(store: &Store, probe: Probe) -> Vec<Vec<(u64, Histogram)>> {
    let until = start() + MINUTES * MINUTE - 1;
    (0..3)
        .map(|level| {
            store
                .history_at_level(level, "web", probe, start(), until)
                .unwrap()
                .points
        })
        .collect()
}

fn total(points: &[(u64, Histogram)]) -> Histogram {
    let mut sum = Histogram::new();
    for (_, h) in points {
        sum.merge(h);
    }
    sum
}

#[test]
fn coarse_levels_lost_in_a_crash_come_back_from_the_finest_at_open() {
    if let Ok(p) = std::env::var(CHILD_ENV) {
        writer(Path::new(&p));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut child = rerun_as_child(
        "coarse_levels_lost_in_a_crash_come_back_from_the_finest_at_open",
        CHILD_ENV,
        &path,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, "WRITTEN", "the writer");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let store = Store::open(&path, StoreConfig::default()).unwrap();
    let rebuilt = store.open_report().history_rebuilt;
    // Minutes 21 to 24 of two coarser levels of two probes.
    assert_eq!(
        (rebuilt.points, rebuilt.streams, rebuilt.inconsistent),
        (4 * 60 * 2 * 2, 2 * 2, 0),
        "{rebuilt:?}"
    );
    let mut before = Vec::new();
    for probe in PROBES {
        let levels = levels(&store, probe);
        let finest = &levels[0];
        assert_eq!(finest.len() as u64, MINUTES * 60, "{probe}: finest level");
        // Each coarser point is exactly the finest points within it, and all are there.
        for (level, res) in [(1, 10 * SEC), (2, MINUTE)] {
            let coarse = &levels[level];
            assert_eq!(
                coarse.len() as u64,
                MINUTES * MINUTE / res,
                "{probe}: level {level}"
            );
            for (t, h) in coarse {
                let within: Vec<_> = finest
                    .iter()
                    .filter(|(f, _)| *f >= *t && *f < t + res)
                    .cloned()
                    .collect();
                assert!(
                    total(&within) == *h,
                    "{probe}: level {level} point at +{} s",
                    (t - start()) / SEC
                );
            }
            assert!(total(coarse) == total(finest), "{probe}: level {level}");
        }
        before.push(levels);
    }
    drop(store);

    // A clean close wrote everything: the next open finds nothing to add.
    let store = Store::open(&path, StoreConfig::default()).unwrap();
    assert_eq!(store.open_report().history_rebuilt, Default::default());
    for (probe, levels_before) in PROBES.iter().zip(&before) {
        assert!(levels(&store, *probe) == *levels_before, "{probe}");
    }
}
