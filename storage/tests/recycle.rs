//! The engine is closed and reopened once `cache_bytes` have gone through it, to free what
//! sled 0.34 keeps in memory whatever its cache size (docs/reliability.md, "RSS"). Nothing
//! written may be lost or changed by that, with readers and writers at work meanwhile.
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{new_incident, sample_count, SEC, T0};
use model::fixtures::sample;
use model::{Histogram, Probe};
use storage::{HistoryPoint, Store, StoreConfig};

/// The smallest engine budget: every ~20 batches below reopen the engine.
fn cfg() -> StoreConfig {
    StoreConfig {
        cache_bytes: 1 << 20,
        min_free_bytes: 0,
        ..StoreConfig::default()
    }
}

fn hist(i: u64) -> Histogram {
    let mut h = Histogram::new();
    h.record(1000 + i);
    h.record(70_000);
    h
}

/// Incidents of 50 000 samples each in the first test: enough that the samples tree is
/// larger than one window of the long passes (4 MiB), so that they reopen the engine.
const INCIDENTS: u64 = 4;

#[test]
fn reopening_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let s = Store::open(&path, cfg()).unwrap();
    let mut ids = Vec::new();
    let mut seconds = 0u64;
    for k in 0..INCIDENTS {
        let mut inc = s
            .open_incident(&new_incident("web", T0 + k * 600 * SEC))
            .unwrap();
        for b in 0..100u64 {
            let batch: Vec<_> = (0..500)
                .map(|i| sample(inc.id, b * 500 + i, T0 + k * 600 * SEC + b * SEC + i))
                .collect();
            s.put_samples(&batch).unwrap();
            let h = hist(seconds);
            let points = [HistoryPoint {
                service: "web",
                probe: Probe::TcpSocketRead,
                hist: &h,
            }];
            assert!(s
                .record_history_batch(T0 + seconds * SEC, &points)
                .unwrap()
                .is_empty());
            seconds += 1;
        }
        s.close_incident(&mut inc, T0 + k * 600 * SEC + 120 * SEC)
            .unwrap();
        ids.push(inc.id);
    }
    // Writes the history chunks being filled, which the count below must include.
    s.flush().unwrap();
    let stats = s.stats();
    assert!(
        stats.engine_reopens >= 3,
        "{} reopens for {} samples",
        stats.engine_reopens,
        INCIDENTS * 50_000
    );
    assert_eq!(stats.write_errors, 0);
    for id in &ids {
        assert_eq!(sample_count(&s, *id), 50_000);
    }
    let history = s
        .history_at_level(0, "web", Probe::TcpSocketRead, 0, u64::MAX)
        .unwrap()
        .points;
    assert_eq!(history.len() as u64, seconds);
    let live = stats.live_bytes;
    drop(s);

    // What a fresh open counts and reads is what the store acknowledged.
    let s = Store::open(&path, cfg()).unwrap();
    assert_eq!(s.stats().live_bytes, live);
    for id in &ids {
        assert_eq!(sample_count(&s, *id), 50_000);
        assert!(s.incident(*id).unwrap().unwrap().closed_ns.is_some());
    }
    // Opening read everything in windows (`cache_bytes`, at least 4 MiB); so do the check,
    // rotation's copy and retention's deletes, reopening the engine between windows:
    // nothing may be missed, met twice or lost across those reopens.
    let reopens = s.stats().engine_reopens;
    let report = s.check(|_| {}).unwrap();
    assert_eq!(report.undecodable, 0);
    assert_eq!(report.samples, INCIDENTS * 50_000);
    assert_eq!(report.live_bytes, live);
    assert!(
        s.stats().engine_reopens > reopens,
        "a check of {live} bytes in 4 MiB windows with a {} byte cache reopened nothing",
        cfg().cache_bytes
    );
    let rotated = s.rotate().unwrap();
    assert_eq!(rotated.live_bytes, live);
    assert_eq!(rotated.dropped_records, 0);
    for id in &ids {
        assert_eq!(sample_count(&s, *id), 50_000);
    }
    let report = s.check(|_| {}).unwrap();
    assert_eq!(report.samples, INCIDENTS * 50_000);
    // What was copied, and the rotation counter now stored beside it.
    assert!(report.live_bytes > live && report.live_bytes < live + 64);
    assert_eq!(s.stats().live_bytes, report.live_bytes);
    let reopens = s.stats().engine_reopens;
    let rep = s.enforce_retention(T0 + 31 * 24 * 3600 * SEC).unwrap();
    assert_eq!(rep.incidents, INCIDENTS);
    assert_eq!(rep.samples, INCIDENTS * 50_000);
    assert!(s.stats().engine_reopens > reopens);
    for id in &ids {
        assert!(s.incident(*id).unwrap().is_none());
    }
    // Past every level's keep: the history went too.
    assert!(s
        .history_at_level(0, "web", Probe::TcpSocketRead, 0, u64::MAX)
        .unwrap()
        .points
        .is_empty());
    let report = s.check(|_| {}).unwrap();
    assert_eq!(report.samples, 0);
    assert_eq!(report.live_bytes, s.stats().live_bytes);
}

#[test]
fn long_reads_and_reopening_get_along() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(dir.path().join("db"), cfg()).unwrap());
    let big = s.open_incident(&new_incident("web", T0)).unwrap();
    for b in 0..20u64 {
        let batch: Vec<_> = (0..1000)
            .map(|i| sample(big.id, b * 1000 + i, T0 + b * SEC + i))
            .collect();
        s.put_samples(&batch).unwrap();
    }
    // Readers walk the big incident over and over (each walk holds a tree handle) while
    // the writer's batches keep asking for the engine to be reopened.
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut walks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(sample_count(&s, big.id), 20_000);
                    walks += 1;
                }
                walks
            })
        })
        .collect();
    let other = s
        .open_incident(&new_incident("db", T0 + 100 * SEC))
        .unwrap();
    for b in 0..60u64 {
        let batch: Vec<_> = (0..500)
            .map(|i| sample(other.id, b * 500 + i, T0 + (100 + b) * SEC + i))
            .collect();
        s.put_samples(&batch).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    // Reopening waited for a moment without readers, or for the next write after them.
    let batch: Vec<_> = (0..10)
        .map(|i| sample(other.id, 30_000 + i, T0 + 200 * SEC + i))
        .collect();
    s.put_samples(&batch).unwrap();
    s.flush().unwrap();
    assert_eq!(s.stats().write_errors, 0);
    assert!(s.stats().engine_reopens >= 1);
    assert_eq!(sample_count(&s, other.id), 30_010);
    assert_eq!(sample_count(&s, big.id), 20_000);
}

/// sled keeps pages its segment cleaner read back in memory, which no count of the store's
/// own writes sees: a heap that grew `cache_bytes` since the engine opened reopens it too,
/// once per growth, with every record kept.
#[test]
fn a_heap_that_grew_reopens_the_engine_though_few_records_went_through() {
    use std::sync::atomic::AtomicU64;
    use storage::HeapReading;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Opened empty: nothing went through the engine yet.
    drop(Store::open(&path, cfg()).unwrap());
    let s = Store::open(&path, cfg()).unwrap();
    let heap = Arc::new(AtomicU64::new(40 << 20));
    let h = heap.clone();
    s.watch_heap(Box::new(move || {
        Some(HeapReading {
            allocated: h.load(Ordering::Relaxed),
            taken: std::time::Instant::now(),
        })
    }));
    let mut second = 0u64;
    let mut write = |s: &Store| {
        let h = hist(second);
        let points = [HistoryPoint {
            service: "web",
            probe: Probe::TcpSocketRead,
            hist: &h,
        }];
        assert!(s
            .record_history_batch(T0 + second * SEC, &points)
            .unwrap()
            .is_empty());
        second += 1;
    };
    write(&s);
    assert_eq!(s.stats().engine_reopens, 0);
    // Under the budget: nothing.
    heap.store((40 << 20) + (1 << 20) - 1, Ordering::Relaxed);
    write(&s);
    assert_eq!(s.stats().engine_reopens, 0);
    // At the budget: the next write reopens the engine.
    heap.fetch_add(1, Ordering::Relaxed);
    write(&s);
    assert_eq!(s.stats().engine_reopens, 1);
    // The reopened engine's floor is the first reading since, not the old one: the same
    // heap does not reopen it again.
    for _ in 0..5 {
        write(&s);
    }
    assert_eq!(s.stats().engine_reopens, 1);
    heap.fetch_add(1 << 20, Ordering::Relaxed);
    write(&s);
    assert_eq!(s.stats().engine_reopens, 2);
    s.flush().unwrap();
    assert_eq!(s.stats().write_errors, 0);
    let points = s
        .history_at_level(0, "web", Probe::TcpSocketRead, 0, u64::MAX)
        .unwrap()
        .points;
    assert_eq!(points.len() as u64, second);
}
