//! The batched history write stores exactly what one write per point stores.

mod common;

use common::{SEC, T0};
use model::{Histogram, Probe};
use storage::{HistoryPoint, Store, StoreConfig, StoreError};

fn hist(values: &[u64]) -> Histogram {
    let mut h = Histogram::new();
    for v in values {
        h.record(*v);
    }
    h
}

fn every_level(s: &Store, service: &str, probe: Probe) -> Vec<Vec<(u64, Histogram)>> {
    (0..StoreConfig::default().history.len())
        .map(|level| {
            s.history_at_level(level, service, probe, 0, u64::MAX)
                .expect("history reads back")
                .points
        })
        .collect()
}

#[test]
fn batch_matches_one_write_per_point() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::open(a_dir.path(), StoreConfig::default()).unwrap();
    let b = Store::open(b_dir.path(), StoreConfig::default()).unwrap();
    let start = T0 - T0 % (60 * SEC);
    let streams = [
        ("web", Probe::TcpSocketRead),
        ("web", Probe::IpStart),
        ("db", Probe::TcpSocketRead),
    ];
    for i in 0..25u64 {
        let hists: Vec<Histogram> = (0..streams.len() as u64)
            .map(|k| hist(&[1000 * (k + 1) + i, 70_000]))
            .collect();
        let points: Vec<HistoryPoint<'_>> = streams
            .iter()
            .zip(&hists)
            .map(|(&(service, probe), hist)| HistoryPoint {
                service,
                probe,
                hist,
            })
            .collect();
        let ts = start + i * 7 * SEC;
        assert!(a.record_history_batch(ts, &points).unwrap().is_empty());
        for p in &points {
            b.record_history(p.service, p.probe, ts, p.hist).unwrap();
        }
    }
    for (service, probe) in streams {
        let got = every_level(&a, service, probe);
        assert_eq!(got, every_level(&b, service, probe));
        assert_eq!(got[0].len(), 25, "one fine point per interval");
        assert_eq!(got[2].len(), 3, "minutes 0, 1 and 2");
    }
    assert_eq!(a.stats().live_bytes, b.stats().live_bytes);

    // What was merged in memory is what is on disk: a reopened store reads the same, and a
    // coarse point is the sum of its intervals.
    let written: Vec<_> = streams
        .iter()
        .map(|&(s, p)| every_level(&a, s, p))
        .collect();
    drop(a);
    let a = Store::open(a_dir.path(), StoreConfig::default()).unwrap();
    for (&(service, probe), before) in streams.iter().zip(&written) {
        assert_eq!(&every_level(&a, service, probe), before);
    }
    let minute: Histogram = written[0][0]
        .iter()
        .filter(|(t, _)| *t < start + 60 * SEC)
        .fold(Histogram::new(), |mut m, (_, h)| {
            m.merge(h);
            m
        });
    assert_eq!(written[0][2][0], (start, minute));
}

#[test]
fn batch_adds_up_repeated_streams_and_refuses_bad_points_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), StoreConfig::default()).unwrap();
    let (one, two) = (hist(&[1000]), hist(&[2000, 3000]));
    let bad = "no\nnewlines".to_owned();
    let points = [
        HistoryPoint {
            service: "web",
            probe: Probe::IpStart,
            hist: &one,
        },
        HistoryPoint {
            service: &bad,
            probe: Probe::IpStart,
            hist: &one,
        },
        HistoryPoint {
            service: "web",
            probe: Probe::IpStart,
            hist: &two,
        },
    ];
    let refused = s.record_history_batch(T0, &points).unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0, 1);
    assert!(
        matches!(refused[0].1, StoreError::BadServiceName { .. }),
        "{:?}",
        refused[0].1
    );
    let mut both = one.clone();
    both.merge(&two);
    for level in every_level(&s, "web", Probe::IpStart) {
        assert_eq!(level.len(), 1);
        assert_eq!(level[0].1, both);
    }
}

#[test]
fn points_written_before_a_reopen_or_out_of_order_are_merged_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let h = hist(&[5000]);
    let at = |i: u64| T0 - T0 % (60 * SEC) + i * SEC;
    {
        let s = Store::open(dir.path(), StoreConfig::default()).unwrap();
        for i in 0..5 {
            s.record_history("web", Probe::IpStart, at(i), &h).unwrap();
        }
    }
    let s = Store::open(dir.path(), StoreConfig::default()).unwrap();
    // The newest point again, an older one (a clock stepped back), then new ones.
    for i in [4, 2, 5, 6, 2] {
        s.record_history("web", Probe::IpStart, at(i), &h).unwrap();
    }
    let fine = &every_level(&s, "web", Probe::IpStart)[0];
    let counts: Vec<(u64, u64)> = fine.iter().map(|(t, h)| (*t, h.count())).collect();
    let expected: Vec<(u64, u64)> = [(0, 1), (1, 1), (2, 3), (3, 1), (4, 2), (5, 1), (6, 1)]
        .iter()
        .map(|&(i, n)| (at(i), n))
        .collect();
    assert_eq!(counts, expected);
    for level in &every_level(&s, "web", Probe::IpStart)[1..] {
        assert_eq!(level.len(), 1);
        assert_eq!(level[0].1.count(), 10);
    }
    // A reopened store merges into the coarse points already there.
    drop(s);
    let s = Store::open(dir.path(), StoreConfig::default()).unwrap();
    s.record_history("web", Probe::IpStart, at(7), &h).unwrap();
    assert_eq!(every_level(&s, "web", Probe::IpStart)[2][0].1.count(), 11);
}

/// Chunks written under one resolution stay readable after the config changes it: a chunk
/// of the old (longer) span that starts before the read's aligned chunk start is still found.
#[test]
fn a_resolution_changed_in_the_config_still_reads_the_old_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let level = |secs| StoreConfig {
        history: vec![storage::HistoryLevel {
            resolution: std::time::Duration::from_secs(secs),
            keep: std::time::Duration::from_secs(30 * 86_400),
        }],
        ..StoreConfig::default()
    };
    // 10 s points: one chunk spans 600 s.
    let start = T0 - T0 % (600 * SEC);
    {
        let s = Store::open(dir.path(), level(10)).unwrap();
        for i in 0..60u64 {
            s.record_history(
                "web",
                Probe::TcpSocketRead,
                start + i * 10 * SEC,
                &hist(&[1000 + i]),
            )
            .unwrap();
        }
        s.flush().unwrap();
    }
    // Now 1 s points: a chunk spans 60 s, so the read's aligned start for a point late in
    // the old chunk lies after the old chunk's key.
    let s = Store::open(dir.path(), level(1)).unwrap();
    let since = start + 500 * SEC;
    let until = start + 600 * SEC - 1;
    let dense = s
        .history_at_level(0, "web", Probe::TcpSocketRead, since, until)
        .unwrap();
    let want: Vec<u64> = (50..60u64).map(|i| start + i * 10 * SEC).collect();
    assert_eq!(
        dense.points.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        want
    );
    let sparse = s
        .history_sparse_at_level(0, "web", Probe::TcpSocketRead, since, until)
        .unwrap();
    assert_eq!(sparse.len(), want.len());
}
