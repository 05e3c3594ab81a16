//! Property test of stored records with flipped bytes: a database whose records (any tree,
//! any record) had bytes flipped, cut or replaced below the store's API opens, and every read
//! the daemon and the CLI make answers (possibly with fewer records, counted as undecodable)
//! without a panic or a hang. `tests/fuzz/run.sh` runs it with `TAILTRAP_FUZZ_CASES` high.
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{new_incident, open_raw, SEC, T0};
use model::fixtures::fuzz_config;
use model::fixtures::sample;
use model::{Comm, CpuHolder, Histogram, Probe, ReaderWait, Sample};
use proptest::prelude::*;
use storage::{IncidentQuery, PwruRecord, SampleFilter, Store, StoreConfig};

/// Every kind of record: incidents (one open, one closed), sample chunks (samples with and
/// without the reader's wait and the RX queue), pwru lines, history at every level, a baseline.
fn fill(path: &Path) {
    let s = Store::open(path, StoreConfig::default()).unwrap();
    let open = s.open_incident(&new_incident("web", T0)).unwrap();
    let mut closed = s.open_incident(&new_incident("db", T0 + SEC)).unwrap();
    s.close_incident(&mut closed, T0 + 2 * SEC).unwrap();
    for inc in [open.id, closed.id] {
        let batch: Vec<_> = (0..300)
            .map(|i| Sample {
                reader_wait: (i % 2 == 0).then(|| ReaderWait {
                    runq_ns: 1_000 * i,
                    off_cpu_ns: 50_000 + i,
                    cpu_holder: (i % 4 == 0).then(|| CpuHolder {
                        pid: 900 + i as u32,
                        comm: Comm::from_kernel(b"stress-ng\0"),
                    }),
                }),
                rx_queue: (i % 3 == 0).then_some((i % 8) as u16),
                ..sample(inc, i, T0 + i)
            })
            .collect();
        s.put_samples(&batch).unwrap();
        let pwru: Vec<_> = (0..5)
            .map(|seq| PwruRecord {
                incident: inc,
                seq,
                received_ns: T0,
                pwru_time_ns: Some(seq),
                func: "ip_rcv_core".into(),
                skb: 0xffff_8880_0000_0000 + seq,
                flow: None,
                raw: format!(r#"{{"func":"ip_rcv_core","n":{seq}}}"#),
            })
            .collect();
        s.put_pwru(&pwru).unwrap();
    }
    let mut h = Histogram::new();
    for v in [1_000, 50_000, 2_000_000] {
        h.record(v);
    }
    for i in 0..5 {
        s.record_history("web", Probe::TcpSocketRead, T0 + i * SEC, &h)
            .unwrap();
    }
    s.put_baseline("web", Probe::TcpSocketRead, b"opaque baseline")
        .unwrap();
    s.flush().unwrap();
}

/// One damage to one record: which tree and record (indices wrap), and what is done.
#[derive(Debug, Clone)]
enum Damage {
    /// XOR these (position, mask) pairs into the value.
    Flip(Vec<(usize, u8)>),
    /// Keep only the first bytes.
    Cut(usize),
    /// Replace the value by arbitrary bytes.
    Replace(Vec<u8>),
    /// Add a record under an arbitrary key.
    Insert(Vec<u8>, Vec<u8>),
}

fn damage() -> impl Strategy<Value = (usize, usize, Damage)> {
    let d = prop_oneof![
        prop::collection::vec((any::<usize>(), 1u8..=255), 1..4).prop_map(Damage::Flip),
        any::<usize>().prop_map(Damage::Cut),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Damage::Replace),
        (
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(k, v)| Damage::Insert(k, v)),
    ];
    (any::<usize>(), any::<usize>(), d)
}

fn apply(path: &Path, damages: &[(usize, usize, Damage)]) {
    let db = open_raw(path);
    let mut names: Vec<_> = db.tree_names();
    names.sort();
    for (t, r, d) in damages {
        let tree = db.open_tree(&names[t % names.len()]).unwrap();
        if let Damage::Insert(k, v) = d {
            tree.insert(k.as_slice(), v.as_slice()).unwrap();
            continue;
        }
        let keys: Vec<_> = tree.iter().keys().map(|k| k.unwrap()).collect();
        if keys.is_empty() {
            continue;
        }
        let key = &keys[r % keys.len()];
        let mut v = tree.get(key).unwrap().unwrap().to_vec();
        match d {
            Damage::Flip(flips) => {
                for (i, m) in flips {
                    if !v.is_empty() {
                        let n = v.len();
                        v[i % n] ^= m;
                    }
                }
            }
            Damage::Cut(n) => v.truncate(n % (v.len() + 1)),
            Damage::Replace(b) => v = b.clone(),
            Damage::Insert(..) => unreachable!(),
        }
        tree.insert(key, v).unwrap();
    }
    db.flush().unwrap();
}

/// Everything the API, the CLI and the daemon's start read.
fn read_everything(s: &Store) {
    let page = s.incidents(&IncidentQuery::default());
    let ids: Vec<u64> = match page {
        Ok(p) => p.incidents.iter().map(|i| i.id).chain([1, 2, 99]).collect(),
        Err(_) => vec![1, 2, 99],
    };
    for id in ids {
        let _ = s.incident(id);
        let _ = s.sample_summary(id, &SampleFilter::default());
        let mut after = None;
        for _ in 0..100 {
            match s.samples(id, &SampleFilter::default(), after, 64) {
                Ok(p) => match p.next {
                    Some(c) => after = Some(c),
                    None => break,
                },
                Err(_) => break,
            }
        }
        let _ = s.pwru_records(id, None, 0);
        let _ = s.export_incident(id);
    }
    let _ = s.history_streams();
    let _ = s.history("web", Probe::TcpSocketRead, 0, u64::MAX, T0 + 10 * SEC);
    let _ = s.baselines();
    let _ = s.check(|_| {});
    let _ = s.stats();
}

proptest! {
    #![proptest_config(fuzz_config(24))]

    #[test]
    fn fuzz_stored_records_with_flipped_bytes(damages in prop::collection::vec(damage(), 1..6)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        fill(&path);
        apply(&path, &damages);
        let start = Instant::now();
        // The CLI's read-only opening and the daemon's opening.
        if let Ok(s) = Store::open_existing(&path) {
            read_everything(&s);
        }
        let s = Store::open(&path, StoreConfig::default()).unwrap();
        read_everything(&s);
        // The daemon carries on writing into a damaged database.
        let inc = s.open_incident(&new_incident("web", T0 + 20 * SEC)).unwrap();
        s.put_samples(&[sample(inc.id, 0, T0 + 20 * SEC)]).unwrap();
        prop_assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    }
}
