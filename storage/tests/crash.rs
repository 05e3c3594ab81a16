//! Crash test: a child process writes incidents, samples and history continuously; the
//! parent SIGKILLs it at random moments, 50 times. After each kill the store reopens and
//! every record the child acknowledged as flushed must be there and decode.
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{new_incident, rerun_as_child, wait_for_line, SEC, T0};
use model::fixtures::sample;
use model::{Histogram, Probe};
use rand::Rng;
use storage::{IncidentState, SampleFilter, Store, StoreConfig};

const CHILD_ENV: &str = "TAILTRAP_STORAGE_CRASH_WRITER";
const ACK: &str = "ACK ";
const KILLS: usize = 50;

/// Acknowledgements parsed from the child's output.
#[derive(Default)]
struct Acked {
    /// incident -> highest sample count acknowledged flushed
    samples: BTreeMap<u64, u64>,
    closed: BTreeSet<u64>,
    /// (service, start_ns) history points acknowledged flushed
    history: Vec<u64>,
    /// The highest incident id handed out (stored or not).
    numbered: u64,
}

fn ack(line: &str) {
    let mut out = std::io::stdout().lock();
    // A newline first: the test harness may have left a partial line on stdout.
    writeln!(out, "\n{ACK}{line}").unwrap();
    out.flush().unwrap();
}

/// The writer child: runs until killed.
fn writer(path: &Path) {
    let store = Store::open(path, StoreConfig::default()).unwrap();
    let mut rng = rand::rng();
    let mut hist_t = T0 + rng.random_range(0..1_000_000) * SEC;
    ack("ready");
    loop {
        let mut inc = store.open_incident(&new_incident("web", T0)).unwrap();
        // open_incident is durable when it returns.
        ack(&format!("samples {} 0", inc.id));
        // An id handed out and never stored (the daemon's storage thread not there yet)
        // must not be handed out again after the kill.
        let spare = store.number_incident(&new_incident("web", T0)).unwrap();
        ack(&format!("numbered {}", spare.id));
        let mut n = 0u64;
        for _ in 0..rng.random_range(1..8) {
            let size = rng.random_range(1..60);
            let batch: Vec<_> = (n..n + size).map(|i| sample(inc.id, i, T0 + i)).collect();
            store.put_samples(&batch).unwrap();
            n += size;
            let mut h = Histogram::new();
            h.record(n * 1000);
            store
                .record_history("web", Probe::TcpSocketRead, hist_t, &h)
                .unwrap();
            hist_t += SEC;
            // Pace the writer a little: the kills land anywhere all the same, and the
            // parent's full re-check after each of 50 kills stays quick.
            std::thread::sleep(Duration::from_millis(rng.random_range(0..4)));
            if rng.random_bool(0.5) {
                store.flush().unwrap();
                ack(&format!("samples {} {n}", inc.id));
                ack(&format!("history {}", hist_t - SEC));
            }
        }
        if rng.random_bool(0.7) {
            store.close_incident(&mut inc, T0 + n).unwrap();
            ack(&format!("closed {}", inc.id));
        }
    }
}

fn parse(line: &str, acked: &mut Acked) {
    let Some(at) = line.find(ACK) else { return };
    let words: Vec<&str> = line[at + ACK.len()..].split_whitespace().collect();
    match words.as_slice() {
        ["samples", id, n] => {
            let (id, n): (u64, u64) = (id.parse().unwrap(), n.parse().unwrap());
            let e = acked.samples.entry(id).or_default();
            *e = (*e).max(n);
        }
        ["closed", id] => {
            acked.closed.insert(id.parse().unwrap());
        }
        ["history", t] => acked.history.push(t.parse().unwrap()),
        ["numbered", id] => acked.numbered = acked.numbered.max(id.parse().unwrap()),
        _ => {}
    }
}

#[test]
fn sigkill_loses_nothing_acknowledged() {
    if let Ok(p) = std::env::var(CHILD_ENV) {
        writer(Path::new(&p));
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rng = rand::rng();
    let mut acked = Acked::default();
    let mut total_samples_checked = 0u64;
    let mut gaps = Vec::new();
    for round in 0..KILLS {
        let mut child = rerun_as_child("sigkill_loses_nothing_acknowledged", CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        // Wait until the child has the store open, then let it write for a random while.
        wait_for_line(&mut out, "ACK ready", &format!("round {round}: the writer"));
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut l = String::new();
            while out.read_line(&mut l).unwrap_or(0) > 0 {
                // Only complete lines count: a line cut by the kill was never acknowledged.
                if l.ends_with('\n') {
                    lines.push(l.clone());
                }
                l.clear();
            }
            lines
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(10..200)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        for l in reader.join().unwrap() {
            parse(&l, &mut acked);
        }

        let store = Store::open(&path, StoreConfig::default()).unwrap();
        assert_eq!(
            store.open_report().moved_aside,
            None,
            "round {round}: database damaged by the kill"
        );
        for (&id, &n) in &acked.samples {
            let inc = store
                .incident(id)
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: acknowledged incident {id} missing"));
            if acked.closed.contains(&id) {
                assert_eq!(
                    inc.state,
                    IncidentState::Closed,
                    "round {round}: incident {id}"
                );
            } else {
                assert_ne!(
                    inc.state,
                    IncidentState::Open,
                    "round {round}: incident {id}"
                );
            }
            let page = store
                .samples(id, &SampleFilter::default(), None, 0)
                .unwrap();
            let seqs: BTreeSet<u32> = page.samples.iter().filter_map(|s| s.tcp_seq).collect();
            for i in 0..n {
                assert!(
                    seqs.contains(&(i as u32)),
                    "round {round}: incident {id} lost acknowledged sample {i} of {n}"
                );
            }
            total_samples_checked += n;
        }
        for &t in &acked.history {
            let series = store.history("web", Probe::TcpSocketRead, t, t, t).unwrap();
            assert_eq!(
                series.points.len(),
                1,
                "round {round}: history point {t} missing"
            );
        }
        assert_eq!(store.stats().undecodable_records, 0, "round {round}");
        let next = store.number_incident(&new_incident("web", T0)).unwrap().id;
        let handed_out = acked
            .numbered
            .max(acked.samples.keys().max().copied().unwrap_or(0));
        assert!(
            next > handed_out,
            "round {round}: incident id {next} handed out again after the kill"
        );
        gaps.push(next - handed_out - 1);
        acked.numbered = next;
        drop(store);
    }
    eprintln!(
        "crash test: {KILLS} SIGKILLs, {} incidents, {} acknowledged samples re-checked, {} history points, \
         incident ids skipped after a kill: at most {}, {:.1} s",
        acked.samples.len(),
        total_samples_checked,
        acked.history.len(),
        gaps.iter().max().unwrap_or(&0),
        started.elapsed().as_secs_f64()
    );
    // At most the reserve, plus one id the kill may have cut off before its
    // acknowledgement.
    assert!(
        gaps.iter().all(|&g| g <= storage::INCIDENT_ID_RESERVE + 1),
        "{gaps:?}"
    );
    assert!(
        acked.samples.len() >= KILLS,
        "the child wrote too little to test anything"
    );
}
