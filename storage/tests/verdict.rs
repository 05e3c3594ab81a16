//! Operators' verdicts on incidents and history reads at a chosen level, against a real
//! sled database.
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

mod common;

use std::time::Duration;

use common::{new_incident, SEC, T0};
use model::{Histogram, Probe, Verdict};
use storage::{IncidentQuery, IncidentVerdict, Store, StoreConfig, StoreError, MAX_NOTE_BYTES};

fn open(dir: &tempfile::TempDir, cfg: StoreConfig) -> Store {
    Store::open(dir.path().join("db"), cfg).unwrap()
}

fn verdict(v: Verdict, note: &str) -> IncidentVerdict {
    IncidentVerdict {
        verdict: v,
        note: note.into(),
        marked_ns: T0 + 100 * SEC,
    }
}

#[test]
fn a_verdict_is_kept_with_its_incident_and_deleted_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (old, marked) = {
        let s = open(&dir, StoreConfig::default());
        // An incident stored before any verdict existed, then one that gets marked.
        let mut old = s.open_incident(&new_incident("web", T0)).unwrap();
        s.close_incident(&mut old, T0 + SEC).unwrap();
        let mut m = s
            .open_incident(&new_incident("web", T0 + 10 * SEC))
            .unwrap();
        s.mark_incident(m.id, &verdict(Verdict::Real, "first look"))
            .unwrap();
        s.mark_incident(m.id, &verdict(Verdict::FalseAlarm, "batch job"))
            .unwrap();
        // The daemon rewriting the incident from its own copy keeps the verdict.
        m.capture.emitted = 5;
        s.close_incident(&mut m, T0 + 20 * SEC).unwrap();
        (old.id, m.id)
    };
    let s = open(&dir, StoreConfig::default());
    assert_eq!(s.verdict(old).unwrap(), None);
    assert_eq!(
        s.verdict(marked).unwrap(),
        Some(verdict(Verdict::FalseAlarm, "batch job"))
    );
    let page = s.incidents(&IncidentQuery::default()).unwrap();
    assert_eq!(page.incidents.len(), 2);
    assert_eq!(page.verdicts.len(), 1);
    assert_eq!(page.verdicts[&marked].verdict, Verdict::FalseAlarm);
    let bundle = s.export_incident(marked).unwrap();
    assert_eq!(bundle.verdict.unwrap().note, "batch job");
    assert!(s.export_incident(old).unwrap().verdict.is_none());

    assert!(matches!(
        s.mark_incident(999, &verdict(Verdict::Real, "")),
        Err(StoreError::NoSuchIncident(999))
    ));
    let long = "x".repeat(MAX_NOTE_BYTES + 1);
    assert!(matches!(
        s.mark_incident(marked, &verdict(Verdict::Real, &long)),
        Err(StoreError::TooLarge { .. })
    ));
    assert!(s
        .check(|_| {})
        .unwrap()
        .trees
        .iter()
        .all(|t| t.undecodable == 0));

    // Retention deletes the verdict with its incident.
    drop(s);
    let cfg = StoreConfig {
        incident_keep: Duration::from_secs(1),
        ..StoreConfig::default()
    };
    let s = open(&dir, cfg);
    let rep = s.enforce_retention(T0 + 3600 * SEC).unwrap();
    assert_eq!(rep.incidents, 2);
    assert_eq!(s.verdict(marked).unwrap(), None);
}

#[test]
fn history_reads_at_the_level_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, StoreConfig::default());
    let start = T0 - T0 % (60 * SEC);
    let mut h = Histogram::new();
    h.record(1000);
    for i in 0..90u64 {
        s.record_history("web", Probe::TcpSocketRead, start + i * SEC, &h)
            .unwrap();
    }
    let now = start + 90 * SEC;
    let per_level: Vec<(Duration, usize, u64)> = (0..3)
        .map(|level| {
            let series = s
                .history_at_level(level, "web", Probe::TcpSocketRead, start, now)
                .unwrap();
            let count = series.points.iter().map(|p| p.1.count()).sum();
            (series.resolution, series.points.len(), count)
        })
        .collect();
    assert_eq!(
        per_level,
        vec![
            (Duration::from_secs(1), 90, 90),
            (Duration::from_secs(10), 9, 90),
            (Duration::from_secs(60), 2, 90)
        ]
    );
    assert_eq!(
        s.history_streams_at(2).unwrap(),
        vec![("web".to_string(), Probe::TcpSocketRead)]
    );
    assert!(matches!(
        s.history_at_level(3, "web", Probe::TcpSocketRead, start, now),
        Err(StoreError::Config { .. })
    ));
}
