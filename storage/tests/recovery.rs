//! Failure handling against real databases and processes: damaged files, undecodable
//! records, a lock held by another process.
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

mod common;

use std::io::{BufReader, Write};
use std::path::Path;
use std::process::Stdio;

use common::{envelope, new_incident, open_raw, rerun_as_child, wait_for_line, SEC, T0};
use model::fixtures::sample;
use storage::{SampleFilter, Store, StoreConfig, StoreError};

const CHILD_ENV: &str = "TAILTRAP_STORAGE_TEST_LOCK_HOLDER";
const READY: &str = "lock-holder-ready";

fn fill(path: &Path) -> u64 {
    let s = Store::open(path, StoreConfig::default()).unwrap();
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    let batch: Vec<_> = (0..3000).map(|i| sample(inc.id, i, T0 + i)).collect();
    s.put_samples(&batch).unwrap();
    s.flush().unwrap();
    inc.id
}

/// Overwrite the head of the data file and a stretch in its middle: wherever the live
/// pages happen to lie, some of them are hit.
fn damage(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = bytes.len();
    bytes[..64].fill(0xab);
    bytes[n / 4..n / 2].fill(0xab);
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn damaged_database_is_moved_aside_and_a_fresh_one_started() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    fill(&path);
    damage(&path.join("db"));

    // Read-only opening reports the damage and changes nothing.
    match Store::open_existing(&path) {
        Err(StoreError::Corrupt { path: p, .. }) => assert_eq!(p, path),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(_) => panic!("damaged database opened without complaint"),
    }
    assert!(path.join("db").exists());

    // The daemon's opening recovers: old directory kept aside, fresh store usable, counted.
    let s = Store::open(&path, StoreConfig::default()).unwrap();
    let aside = s.open_report().moved_aside.clone().expect("moved aside");
    assert!(aside.join("db").exists(), "old data kept for inspection");
    assert!(aside
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("db.corrupt-"));
    assert_eq!(s.stats().corruption_recoveries, 1);
    let inc = s.open_incident(&new_incident("web", T0 + SEC)).unwrap();
    s.put_samples(&[sample(inc.id, 0, T0 + SEC)]).unwrap();
    drop(s);

    // Next start is normal and remembers the recovery.
    let s = Store::open(&path, StoreConfig::default()).unwrap();
    assert_eq!(s.open_report().moved_aside, None);
    assert_eq!(s.stats().corruption_recoveries, 1);
    assert_eq!(
        s.sample_summary(inc.id, &SampleFilter::default())
            .unwrap()
            .count,
        1
    );
}

#[test]
fn damaged_config_file_is_handled_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    fill(&path);
    let conf = path.join("conf");
    let mut bytes = std::fs::read(&conf).unwrap();
    for b in bytes.iter_mut().take(16) {
        *b ^= 0xff;
    }
    std::fs::write(&conf, bytes).unwrap();
    let s = Store::open(&path, StoreConfig::default()).unwrap();
    assert!(s.open_report().moved_aside.is_some());
}

#[test]
fn undecodable_records_are_skipped_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let id = fill(&path);
    // Damage values the way a torn write or bit flip would, below the store's API. The
    // 3000 samples are 12 chunk records: 11 of 256 samples, then 184.
    {
        let db = open_raw(&path);
        let samples = db.open_tree("samples").unwrap();
        let keys: Vec<_> = samples.iter().keys().map(|k| k.unwrap()).collect();
        assert_eq!(keys.len(), 12);
        for k in [&keys[0], &keys[5]] {
            let mut v = samples.get(k).unwrap().unwrap().to_vec();
            let last = v.len() - 1;
            v[last] ^= 0x01;
            samples.insert(k, v).unwrap();
        }
        samples.insert(&keys[10], &b"\x02\x00"[..]).unwrap();
        // An intact one-sample record of schema 1 (version byte 1) and an intact chunk of
        // version 2, both of samples without the skb address: still read, address `None`.
        let mut key = id.to_be_bytes().to_vec();
        key.extend_from_slice(&(T0 + 5).to_be_bytes());
        key.extend_from_slice(&1u64.to_be_bytes());
        samples
            .insert(key, envelope(1, &old_layout(&sample(id, 0, T0 + 5))))
            .unwrap();
        let mut chunk = vec![3u8]; // postcard's varint length of the sequence
        for i in 0..3 {
            chunk.extend(old_layout(&sample(id, 0, T0 + 3000 + i)));
        }
        let mut key = id.to_be_bytes().to_vec();
        key.extend_from_slice(&(T0 + 3000).to_be_bytes());
        key.extend_from_slice(&(7u64 << 20).to_be_bytes());
        samples.insert(key, envelope(2, &chunk)).unwrap();
        // An uncompressed chunk of version 3 (schema 4), with skb addresses: still read.
        let mut v3 = vec![2u8];
        for i in 0..2 {
            v3.extend(v3_layout(&sample(id, 1, T0 + 4000 + i)));
        }
        let mut key = id.to_be_bytes().to_vec();
        key.extend_from_slice(&(T0 + 4000).to_be_bytes());
        key.extend_from_slice(&(8u64 << 20).to_be_bytes());
        samples.insert(key, envelope(3, &v3)).unwrap();
        db.flush().unwrap();
    }
    let s = Store::open(&path, StoreConfig::default()).unwrap();
    let sum = s.sample_summary(id, &SampleFilter::default()).unwrap();
    assert_eq!(sum.count, 3000 - 3 * 256 + 6);
    assert_eq!(s.stats().undecodable_records, 3);
    // Paging one by one crosses chunks, the schema-1 record and the version-2 and -3
    // chunks, each sample once; the samples of the first two have no skb address.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.samples(id, &SampleFilter::default(), after, 1).unwrap();
        for x in &page.samples {
            let old = x.time_ns == T0 + 5 || (T0 + 3000..T0 + 4000).contains(&x.time_ns);
            assert_eq!(x.skb.is_none(), old, "{x:?}");
        }
        seen.extend(page.samples.iter().map(|x| (x.time_ns, x.tcp_seq)));
        match page.next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), 3000 - 3 * 256 + 6);
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 3000 - 3 * 256 + 6);
    let report = s.check(|_| {}).unwrap();
    let samples = report.trees.iter().find(|t| t.tree == "samples").unwrap();
    assert_eq!((samples.records, samples.undecodable), (15, 3));
    assert_eq!(report.samples, 3000 - 3 * 256 + 6);
    assert_eq!(report.undecodable, 3);
    assert_eq!(report.incidents_interrupted, 1);
    // Retention counts samples, not records: the intact old record is one sample, the
    // damaged ones none.
    drop(s);
    let s = Store::open(
        &path,
        StoreConfig {
            incident_keep: std::time::Duration::from_secs(1),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let mut inc = s.incident(id).unwrap().unwrap();
    s.close_incident(&mut inc, T0 + SEC).unwrap();
    let rep = s.enforce_retention(T0 + 10 * SEC).unwrap();
    assert_eq!((rep.incidents, rep.samples), (1, 3000 - 3 * 256 + 6));
    let report = s.check(|_| {}).unwrap();
    let samples = report.trees.iter().find(|t| t.tree == "samples").unwrap();
    assert_eq!(samples.records, 0);
}

/// A sample in the layout before the skb address: the live sample's postcard encoding
/// (which has the stored layout's fields, in its order) without its last three fields
/// (`skb`, `reader_wait` and `rx_queue` `None` encode as one trailing 0 byte each).
fn old_layout(s: &model::Sample) -> Vec<u8> {
    let mut bytes = v3_layout(&model::Sample {
        skb: None,
        ..s.clone()
    });
    assert_eq!(bytes.pop(), Some(0));
    bytes
}

/// A sample in the layout of version 3 and 4 chunks (with the skb address, before the
/// reader's wait and the RX queue): the live sample's encoding without its last two
/// fields.
fn v3_layout(s: &model::Sample) -> Vec<u8> {
    let mut bytes = postcard::to_allocvec(&model::Sample {
        reader_wait: None,
        rx_queue: None,
        ..s.clone()
    })
    .unwrap();
    assert_eq!(bytes.pop(), Some(0));
    assert_eq!(bytes.pop(), Some(0));
    bytes
}

/// The child role: open the store, say so, hold it until stdin closes.
fn lock_holder_child(path: &str) {
    let s = Store::open(path, StoreConfig::default()).unwrap();
    // The harness may have printed a partial line already: the marker is found anywhere.
    println!("{READY}");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(s);
}

#[test]
fn locked_database_names_the_holder_process() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        lock_holder_child(&path);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut child = rerun_as_child("locked_database_names_the_holder_process", CHILD_ENV, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    wait_for_line(&mut out, READY, "the lock holder");

    for attempt in [
        Store::open(&path, StoreConfig::default()).err(),
        Store::open_existing(&path).err(),
    ] {
        match attempt {
            Some(StoreError::Locked { path: p, holder }) => {
                assert_eq!(p, path);
                let holder = holder.expect("holder found");
                assert_eq!(holder.pid, child.id());
                let comm = std::fs::read_to_string(format!("/proc/{}/comm", child.id())).unwrap();
                assert_eq!(holder.comm.as_deref(), Some(comm.trim_end()));
                let msg = StoreError::Locked {
                    path: p,
                    holder: Some(holder),
                }
                .to_string();
                assert!(msg.contains(&format!("process {}", child.id())), "{msg}");
                assert!(msg.contains("through the daemon"), "{msg}");
            }
            other => panic!("expected Locked, got {other:?}"),
        }
    }
    // The pid file the holder wrote names it as well.
    let pid_file = dir.path().join("db.pid");
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().trim(),
        child.id().to_string()
    );

    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(!pid_file.exists(), "holder removes its pid file on close");
    // Released: opening works now.
    Store::open(&path, StoreConfig::default()).unwrap();
}

/// History written by a build before chunks (schema 3: one record per point) stays
/// readable, is continued by the chunk that covers it and expires by age like the rest.
#[test]
fn per_point_history_of_an_older_build_reads_beside_chunks() {
    use model::{Histogram, Probe};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(Store::open(&path, StoreConfig::default()).unwrap());
    // At the start of an hour, so every coarse level has one chunk.
    let minute = T0 - T0 % (3600 * SEC);
    let hist = |v: u64| {
        let mut h = Histogram::new();
        h.record(v);
        h
    };
    let key = |level: u8, t: u64| {
        let mut k = vec![level, 3];
        k.extend_from_slice(b"web");
        k.push(Probe::TcpSocketRead.id() as u8);
        k.extend_from_slice(&t.to_be_bytes());
        k
    };
    {
        let db = open_raw(&path);
        let history = db.open_tree("history").unwrap();
        let mut coarse = Histogram::new();
        for i in 0..5 {
            let h = hist(1000 + i);
            let v = envelope(1, &postcard::to_allocvec(&h).unwrap());
            history.insert(key(0, minute + i * SEC), v).unwrap();
            coarse.merge(&h);
        }
        let v = envelope(1, &postcard::to_allocvec(&coarse).unwrap());
        history.insert(key(1, minute), v.clone()).unwrap();
        history.insert(key(2, minute), v).unwrap();
        let meta = db.open_tree("meta").unwrap();
        meta.insert(
            "schema",
            envelope(1, &postcard::to_allocvec(&3u32).unwrap()),
        )
        .unwrap();
        db.flush().unwrap();
    }
    let s = Store::open(&path, StoreConfig::default()).unwrap();
    assert_eq!(s.schema_version().unwrap(), storage::SCHEMA_VERSION);
    // The new build goes on from second 5 into the next minute.
    for i in 5..65 {
        s.record_history(
            "web",
            Probe::TcpSocketRead,
            minute + i * SEC,
            &hist(2000 + i),
        )
        .unwrap();
    }
    let check_levels = |s: &Store| {
        let fine = s
            .history_at_level(0, "web", Probe::TcpSocketRead, 0, u64::MAX)
            .unwrap();
        let times: Vec<u64> = fine.points.iter().map(|(t, _)| *t).collect();
        let expected: Vec<u64> = (0..65).map(|i| minute + i * SEC).collect();
        assert_eq!(times, expected);
        assert!(fine.points.iter().all(|(_, h)| h.count() == 1));
        assert_eq!(fine.points[3].1, hist(1003));
        assert_eq!(fine.points[64].1, hist(2064));
        let minutes = s
            .history_at_level(2, "web", Probe::TcpSocketRead, 0, u64::MAX)
            .unwrap();
        let counts: Vec<(u64, u64)> = minutes
            .points
            .iter()
            .map(|(t, h)| (*t, h.count()))
            .collect();
        assert_eq!(counts, vec![(minute, 60), (minute + 60 * SEC, 5)]);
    };
    check_levels(&s);
    drop(s);
    let s = Store::open(&path, StoreConfig::default()).unwrap();
    check_levels(&s);
    let report = s.check(|_| {}).unwrap();
    assert_eq!(report.undecodable, 0);
    let history = report.trees.iter().find(|t| t.tree == "history").unwrap();
    // Fine level: the chunk of the first minute (which took in the old record at its
    // start), four old records beside it, the chunk of the next minute; one chunk each
    // at the coarse levels (the 10 s level's chunks span 10 minutes).
    assert_eq!(history.records, 6 + 1 + 1);
    drop(s);
    // A chunk expires with its newest point; the old records with theirs.
    let s = Store::open(
        &path,
        StoreConfig {
            history: vec![storage::HistoryLevel {
                resolution: std::time::Duration::from_secs(1),
                keep: std::time::Duration::from_secs(30),
            }],
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let rep = s.enforce_retention(minute + 90 * SEC).unwrap();
    assert_eq!(
        rep.history_points, 60,
        "the first minute's 60 points, not the next"
    );
    let left = s
        .history_at_level(0, "web", Probe::TcpSocketRead, 0, u64::MAX)
        .unwrap();
    assert_eq!(left.points.len(), 5);
}
