//! The store's write and query paths against a real sled database.
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

mod common;

use std::time::Duration;

use common::{new_incident, SEC, T0};
use model::fixtures::sample;
use model::{Histogram, Probe, Sample};
use storage::{
    FlowFilter, IncidentQuery, IncidentState, PwruRecord, PwruState, PwruStatus, SampleFilter,
    Store, StoreConfig, StoreError,
};

fn open(dir: &tempfile::TempDir) -> Store {
    Store::open(dir.path().join("db"), StoreConfig::default()).unwrap()
}

#[test]
fn incidents_get_increasing_ids_and_survive_reopen_closed_or_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, w) = {
        let s = open(&dir);
        let mut a = s.open_incident(&new_incident("web", T0)).unwrap();
        let mut b = s.open_incident(&new_incident("db", T0 + SEC)).unwrap();
        assert!(b.id > a.id);
        b.capture.emitted = 12;
        s.close_incident(&mut b, T0 + 5 * SEC).unwrap();
        // `a`'s session runs; `w` waits for it to end.
        a.pwru.state = PwruState::Running;
        a.pwru.message = "requested: tcp and dst port 80".into();
        s.update_incident(&a).unwrap();
        let mut w = s.open_incident(&new_incident("api", T0 + 2 * SEC)).unwrap();
        w.pwru.state = PwruState::Running;
        w.pwru.message = format!(
            "{}the pwru session for \"web\" is running",
            PwruStatus::WAITING
        );
        assert!(w.pwru.is_waiting() && !a.pwru.is_waiting());
        s.update_incident(&w).unwrap();
        assert!(s.open_report().interrupted.is_empty());
        (a.id, b.id, w.id)
    };
    let s = open(&dir);
    // `a` and `w` were still open when the store went away.
    assert_eq!(s.open_report().interrupted, vec![a, w]);
    let ia = s.incident(a).unwrap().unwrap();
    assert_eq!(ia.state, IncidentState::Interrupted);
    // Nothing of the previous run goes on: no state says it does.
    assert_eq!(ia.pwru.state, PwruState::Failed);
    assert!(ia
        .pwru
        .message
        .starts_with("tailtrap stopped while pwru ran"));
    let iw = s.incident(w).unwrap().unwrap();
    assert_eq!(iw.pwru.state, PwruState::NotRun);
    assert!(
        iw.pwru
            .message
            .starts_with("skipped-busy: tailtrap stopped while this incident waited"),
        "{}",
        iw.pwru.message
    );
    let ib = s.incident(b).unwrap().unwrap();
    assert_eq!(ib.state, IncidentState::Closed);
    assert_eq!(ib.closed_ns, Some(T0 + 5 * SEC));
    assert_eq!(ib.capture.emitted, 12);
    // Ids keep growing across restarts.
    let c = s.open_incident(&new_incident("web", T0 + 9 * SEC)).unwrap();
    assert!(c.id > b);
}

/// The daemon numbers an incident on its interval loop and stores it later, from its
/// storage thread: ids never repeat, whatever order the records are stored in, whether one
/// is never stored, and after a restart.
#[test]
fn numbered_incidents_stored_later_or_never_keep_ids_unique() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let first = s.open_incident(&new_incident("web", T0)).unwrap();
    let a = s.number_incident(&new_incident("web", T0 + SEC)).unwrap();
    let lost = s
        .number_incident(&new_incident("web", T0 + 2 * SEC))
        .unwrap();
    let c = s
        .number_incident(&new_incident("db", T0 + 3 * SEC))
        .unwrap();
    assert_eq!(
        [a.id, lost.id, c.id],
        [first.id + 1, first.id + 2, first.id + 3]
    );
    assert!(
        s.incident(a.id).unwrap().is_none(),
        "numbering stores nothing"
    );
    // Stored newest first; `lost` never (a crash before its write).
    s.put_new_incident(&c).unwrap();
    s.put_new_incident(&a).unwrap();
    assert_eq!(s.incident(a.id).unwrap().unwrap(), a);
    assert_eq!(s.incident(c.id).unwrap().unwrap().service, "db");
    assert!(s.incident(lost.id).unwrap().is_none());
    let d = s.open_incident(&new_incident("web", T0 + 4 * SEC)).unwrap();
    assert_eq!(
        d.id,
        c.id + 1,
        "the id never stored is not used again in this run"
    );
    s.flush().unwrap();
    let e = s
        .number_incident(&new_incident("web", T0 + 5 * SEC))
        .unwrap();
    drop(s);
    // A clean restart continues right after the last id handed out, stored or not
    // (`sigkill_loses_nothing_acknowledged` in crash.rs: after a crash too, with a gap).
    let s = open(&dir);
    let f = s.open_incident(&new_incident("web", T0 + 6 * SEC)).unwrap();
    assert_eq!(f.id, e.id + 1);
    assert_eq!(
        s.number_incident(&new_incident("web", T0)).unwrap().id,
        f.id + 1
    );
}

/// The ids of the first page of incidents `q` lists.
fn listed(s: &Store, q: &IncidentQuery) -> Vec<u64> {
    s.incidents(q)
        .unwrap()
        .incidents
        .iter()
        .map(|i| i.id)
        .collect()
}

#[test]
fn incident_listing_filters_and_pages_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let mut ids = Vec::new();
    for i in 0..7u64 {
        let svc = if i % 2 == 0 { "web" } else { "db" };
        let mut inc = s
            .open_incident(&new_incident(svc, T0 + i * 100 * SEC))
            .unwrap();
        if i < 5 {
            s.close_incident(&mut inc, T0 + i * 100 * SEC + 10 * SEC)
                .unwrap();
        }
        ids.push(inc.id);
    }
    let web = IncidentQuery {
        service: Some("web".into()),
        ..Default::default()
    };
    assert_eq!(listed(&s, &web), vec![ids[6], ids[4], ids[2], ids[0]]);

    let open = IncidentQuery {
        state: Some(IncidentState::Open),
        ..Default::default()
    };
    assert_eq!(listed(&s, &open), vec![ids[6], ids[5]]);

    // Incidents still going on at or after since: closed ones that ended before are out.
    let recent = IncidentQuery {
        since_ns: Some(T0 + 305 * SEC),
        until_ns: Some(T0 + 450 * SEC),
        ..Default::default()
    };
    assert_eq!(listed(&s, &recent), vec![ids[4], ids[3]]);

    // Paging walks everything exactly once.
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = s
            .incidents(&IncidentQuery {
                before_id: before,
                limit: 3,
                ..Default::default()
            })
            .unwrap();
        seen.extend(page.incidents.iter().map(|i| i.id));
        match page.next_before_id {
            Some(n) => before = Some(n),
            None => break,
        }
    }
    let mut all = ids.clone();
    all.reverse();
    assert_eq!(seen, all);
}

#[test]
fn samples_filter_page_and_summarise() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    let other = s.open_incident(&new_incident("db", T0)).unwrap();
    let batch: Vec<_> = (0..1000)
        .map(|i| sample(inc.id, i, T0 + i * 1_000_000))
        .collect();
    s.put_samples(&batch).unwrap();
    s.put_samples(&[sample(other.id, 0, T0)]).unwrap();

    let all = SampleFilter::default();
    let sum = s.sample_summary(inc.id, &all).unwrap();
    assert_eq!(sum.count, 1000);
    assert_eq!(sum.pre_trigger, 10);
    let lat = sum.latency.unwrap();
    // Latencies are 1 ms + (i % 100) * 0.1 ms, ten of each.
    assert_eq!(lat.max, 1_000_000 + 99 * 100_000);
    assert_eq!(lat.p50, 1_000_000 + 49 * 100_000);
    assert_eq!(lat.p99, 1_000_000 + 98 * 100_000);
    assert_eq!(sum.cpus, vec![(0, 500), (1, 500)]);
    assert_eq!(sum.top_processes.len(), 3);
    assert_eq!(sum.top_processes.iter().map(|p| p.count).sum::<u64>(), 1000);
    assert_eq!(sum.top_flows.len(), 10);
    assert!(sum.top_flows.windows(2).all(|w| w[0].count >= w[1].count));
    assert_eq!(
        sum.probes,
        vec![(Probe::TcpSocketEnqueued, 250), (Probe::TcpSocketRead, 750)]
    );
    assert_eq!(sum.first_ns, Some(T0));
    assert_eq!(sum.last_ns, Some(T0 + 999 * 1_000_000));

    // Filters: probe, flow, minimum latency, time range.
    let f = SampleFilter {
        probe: Some(Probe::TcpSocketRead),
        flow: "saddr=10.0.0.2 dport=8080".parse::<FlowFilter>().unwrap(),
        min_latency_ns: Some(5_000_000),
        since_ns: Some(T0 + 100 * 1_000_000),
        until_ns: Some(T0 + 899 * 1_000_000),
    };
    let page = s.samples(inc.id, &f, None, 0).unwrap();
    let expect: Vec<u64> = (100..900)
        .filter(|i| i % 4 != 0 && i % 5 == 1 && (i % 100) >= 40)
        .collect();
    assert_eq!(page.samples.len(), expect.len());
    for (got, i) in page.samples.iter().zip(&expect) {
        assert_eq!(got.tcp_seq, Some(*i as u32));
        assert!(f.matches(got));
    }
    assert_eq!(
        s.sample_summary(inc.id, &f).unwrap().count,
        expect.len() as u64
    );

    // Paging returns every sample once, in time order.
    let mut n = 0;
    let mut after = None;
    let mut last_time = 0;
    loop {
        let page = s.samples(inc.id, &all, after, 64).unwrap();
        for x in &page.samples {
            assert!(x.time_ns >= last_time);
            last_time = x.time_ns;
            assert_eq!(x.incident, inc.id);
        }
        n += page.samples.len();
        match page.next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    assert_eq!(n, 1000);

    // Unknown incident: an error, for writes and reads alike.
    assert!(matches!(
        s.put_samples(&[sample(999, 0, T0)]),
        Err(StoreError::NoSuchIncident(999))
    ));
    assert!(matches!(
        s.samples(999, &all, None, 10),
        Err(StoreError::NoSuchIncident(999))
    ));
}

/// Every page of `filter`'s samples of `incident`, `limit` at a time.
fn all_pages(s: &Store, incident: u64, filter: &SampleFilter, limit: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = s.samples(incident, filter, after, limit).unwrap();
        assert!(page.samples.len() <= limit);
        ids.extend(page.samples.iter().map(|x| u64::from(x.tcp_seq.unwrap())));
        match page.next {
            Some(c) => after = Some(c),
            None => return ids,
        }
    }
}

/// Two batches of `incident`'s samples interleaved in time, in time order each: A,
/// samples 0..700 at `T0 + i * 10` (three chunks); B, 700..1000 at times inside A's span,
/// 5 ns after each of A's first 300.
fn interleaved_batches(incident: u64) -> (Vec<Sample>, Vec<Sample>) {
    let a = (0..700u64)
        .map(|i| sample(incident, i, T0 + i * 10))
        .collect();
    let b = (700..1000u64)
        .map(|i| sample(incident, i, T0 + 5 + (i - 700) * 10))
        .collect();
    (a, b)
}

#[test]
fn paging_crosses_chunks_and_batches_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    // Batch A given newest first (stored in time order, three chunks); batch C:
    // 1000..1001, late.
    let (mut a, b) = interleaved_batches(inc.id);
    a.reverse();
    s.put_samples(&a).unwrap();
    s.put_samples(&b).unwrap();
    s.put_samples(&[sample(inc.id, 1000, T0 + 100_000)])
        .unwrap();

    let all = SampleFilter::default();
    // Page sizes that end mid-chunk, on a chunk boundary, and past everything.
    for limit in [1, 97, 256, 5000] {
        let mut ids = all_pages(&s, inc.id, &all, limit);
        // Chunks in order of their first sample's time, each in time order: A's first
        // (T0), B's first (T0 + 5), A's second (T0 + 2560), B's second, A's third, C.
        let expect: Vec<u64> = (0..256)
            .chain(700..956)
            .chain(256..512)
            .chain(956..1000)
            .chain(512..700)
            .chain(1000..1001)
            .collect();
        assert_eq!(ids, expect, "page size {limit}");
        ids.dedup();
        assert_eq!(ids.len(), 1001);
    }

    // Time range and latency filters apply to samples inside chunks, not whole chunks.
    let f = SampleFilter {
        since_ns: Some(T0 + 3000),
        until_ns: Some(T0 + 3500),
        min_latency_ns: Some(1_000_000 + 50 * 100_000),
        ..SampleFilter::default()
    };
    let got = all_pages(&s, inc.id, &f, 7);
    let in_range = |i: u64, t: u64| (T0 + 3000..=T0 + 3500).contains(&t) && i % 100 >= 50;
    // The range falls inside A's second and B's second chunks.
    let expect: Vec<u64> = (256..512)
        .filter(|&i| in_range(i, T0 + i * 10))
        .chain((956..1000).filter(|&i| in_range(i, T0 + 5 + (i - 700) * 10)))
        .collect();
    assert!(!expect.is_empty());
    assert_eq!(got, expect);
    assert_eq!(
        s.sample_summary(inc.id, &f).unwrap().count,
        expect.len() as u64
    );

    // The export bundle is in time order across batches.
    let bundle = s.export_incident(inc.id).unwrap();
    assert_eq!(bundle.samples.len(), 1001);
    assert!(bundle
        .samples
        .windows(2)
        .all(|w| w[0].time_ns <= w[1].time_ns));
}

#[test]
fn slowest_first_pages_every_sample_once_in_latency_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    // Two batches interleaved in time, three chunks and more: latencies 1 ms + (i % 100) x
    // 0.1 ms, ten samples of each, so ties cross chunk and page boundaries.
    let (a, b) = interleaved_batches(inc.id);
    s.put_samples(&a).unwrap();
    s.put_samples(&b).unwrap();
    let latency = |i: u64| 1_000_000 + (i % 100) * 100_000;

    let all = SampleFilter::default();
    let mut first_pages = Vec::new();
    for limit in [13, 256, 5000] {
        let mut ids = Vec::new();
        let mut after = None;
        loop {
            let page = s.slowest_samples(inc.id, &all, after, limit).unwrap();
            assert!(page.samples.len() <= limit);
            ids.extend(page.samples.iter().map(|x| u64::from(x.tcp_seq.unwrap())));
            match page.next {
                Some(c) => {
                    assert!(c.latency_ns.is_some(), "{c:?}");
                    after = Some(c);
                }
                None => break,
            }
        }
        assert!(
            ids.windows(2).all(|w| latency(w[0]) >= latency(w[1])),
            "page size {limit}: not slowest first"
        );
        let mut once = ids.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(
            once.len(),
            1000,
            "page size {limit}: {} distinct",
            once.len()
        );
        first_pages.push(ids);
    }
    // Ties fall in one order whatever the page size.
    assert!(first_pages.windows(2).all(|w| w[0] == w[1]));
    assert!(first_pages[0][..10].iter().all(|&i| i % 100 == 99));

    // Filters apply as in time order.
    let f = SampleFilter {
        min_latency_ns: Some(latency(98)),
        ..SampleFilter::default()
    };
    let page = s.slowest_samples(inc.id, &f, None, 0).unwrap();
    assert_eq!(page.samples.len(), 20);
    assert!(page.next.is_none());
}

fn pwru_record(incident: u64, seq: u64) -> PwruRecord {
    let raw = format!(
        r#"{{"skb":"0xffff888004b338e8","cpu":1,"process":"~/python3.11:467","func":"tcp_v4_rcv","len":60,"tuple":{{"saddr":"127.0.0.1","daddr":"127.0.0.1","sport":56178,"dport":9000,"proto":6}},"n":{seq}}}"#
    );
    PwruRecord {
        incident,
        seq,
        received_ns: T0 + seq,
        pwru_time_ns: Some(65_717_837_751 + seq),
        func: "tcp_v4_rcv".into(),
        skb: 0xffff_8880_04b3_38e8,
        flow: None,
        raw,
    }
}

#[test]
fn pwru_records_in_order_with_paging_and_a_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    let recs: Vec<_> = (0..250).map(|i| pwru_record(inc.id, i)).collect();
    s.put_pwru(&recs).unwrap();
    let first = s.pwru_records(inc.id, None, 100).unwrap();
    assert_eq!(first, recs[..100].to_vec());
    let rest = s.pwru_records(inc.id, Some(99), 0).unwrap();
    assert_eq!(rest, recs[100..].to_vec());

    let mut huge = pwru_record(inc.id, 1000);
    huge.raw = "x".repeat(100_000);
    assert!(matches!(
        s.put_pwru(&[huge]),
        Err(StoreError::TooLarge { kind: "pwru", .. })
    ));
    assert_eq!(s.stats().oversized_records, 1);
    assert_eq!(s.pwru_records(inc.id, None, 0).unwrap().len(), 250);
}

#[test]
fn export_bundle_holds_everything_about_one_incident() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let inc = s.open_incident(&new_incident("web", T0)).unwrap();
    let batch: Vec<_> = (0..30).map(|i| sample(inc.id, i, T0 + i)).collect();
    s.put_samples(&batch).unwrap();
    s.put_pwru(&[pwru_record(inc.id, 0), pwru_record(inc.id, 1)])
        .unwrap();
    let bundle = s.export_incident(inc.id).unwrap();
    assert_eq!(bundle.samples, batch);
    assert_eq!(bundle.pwru.len(), 2);
    assert_eq!(bundle.summary.count, 30);
    let json = serde_json::to_value(&bundle).unwrap();
    assert_eq!(json["incident"]["service"], "web");
    assert_eq!(json["samples"][0]["flags"][0], "pre-trigger");
    assert!(matches!(
        s.export_incident(4242),
        Err(StoreError::NoSuchIncident(4242))
    ));
}

fn hist(values: &[u64]) -> Histogram {
    let mut h = Histogram::new();
    for v in values {
        h.record(*v);
    }
    h
}

#[test]
fn history_is_downsampled_by_merging_and_read_at_the_best_resolution() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    // 120 one-second intervals starting on a minute boundary.
    let start = T0 - T0 % (60 * SEC);
    for i in 0..120u64 {
        s.record_history(
            "web",
            Probe::TcpSocketRead,
            start + i * SEC,
            &hist(&[1000 + i, 5000]),
        )
        .unwrap();
    }
    s.record_history("db", Probe::TcpSocketRead, start, &hist(&[1]))
        .unwrap();
    let now = start + 120 * SEC;

    // Recent range: finest level.
    let fine = s
        .history("web", Probe::TcpSocketRead, start, now, now)
        .unwrap();
    assert_eq!(fine.resolution, Duration::from_secs(1));
    assert_eq!(fine.points.len(), 120);
    assert_eq!(fine.points[7], (start + 7 * SEC, hist(&[1007, 5000])));

    // A range starting 7 h ago is past the 1 s level's 6 h: the 10 s level answers.
    let mid = s
        .history("web", Probe::TcpSocketRead, now - 7 * 3600 * SEC, now, now)
        .unwrap();
    assert_eq!(mid.resolution, Duration::from_secs(10));
    assert_eq!(mid.points.len(), 12);
    let mut expect = Histogram::new();
    for i in 10..20 {
        expect.merge(&hist(&[1000 + i, 5000]));
    }
    assert_eq!(mid.points[1], (start + 10 * SEC, expect));

    // Four days back: the 1 min level.
    let coarse = s
        .history("web", Probe::TcpSocketRead, now - 4 * 86400 * SEC, now, now)
        .unwrap();
    assert_eq!(coarse.resolution, Duration::from_secs(60));
    assert_eq!(coarse.points.len(), 2);
    assert_eq!(coarse.points[0].1.count(), 120);
    assert_eq!(
        coarse.points.iter().map(|p| p.1.count()).sum::<u64>(),
        fine.points.iter().map(|p| p.1.count()).sum::<u64>()
    );

    let mut streams = s.history_streams().unwrap();
    streams.sort();
    assert_eq!(
        streams,
        vec![
            ("db".to_string(), Probe::TcpSocketRead),
            ("web".to_string(), Probe::TcpSocketRead)
        ]
    );

    // Export in the replay JSON Lines format; each line reads back as the same histogram.
    let mut out = Vec::new();
    mid.write_jsonl(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12);
    let first: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(first["service"], "web");
    assert_eq!(first["probe"], "tcp-socket-read");
    assert_eq!(first["interval_ms"], 10_000);
    assert_eq!(first["count"], 20);
    let ts = humantime::parse_rfc3339(first["ts"].as_str().unwrap()).unwrap();
    assert_eq!(
        ts.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
        start + 10 * SEC
    );
    let back: Histogram = serde_json::from_value(first).unwrap();
    assert_eq!(back, mid.points[1].1);
}

#[test]
fn baselines_are_opaque_bytes_per_service_and_probe() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(&dir);
        s.put_baseline("web", Probe::TcpSocketRead, b"v1").unwrap();
        s.put_baseline("web", Probe::TcpSocketRead, b"v2").unwrap();
        s.put_baseline("web", Probe::IpStart, &[0, 255, 7]).unwrap();
        assert!(matches!(
            s.put_baseline("", Probe::IpStart, b"x"),
            Err(StoreError::BadServiceName { .. })
        ));
    }
    let s = open(&dir);
    assert_eq!(
        s.baseline("web", Probe::TcpSocketRead).unwrap(),
        Some(b"v2".to_vec())
    );
    assert_eq!(s.baseline("db", Probe::TcpSocketRead).unwrap(), None);
    assert_eq!(s.baselines().unwrap().len(), 2);
    assert_eq!(s.schema_version().unwrap(), storage::SCHEMA_VERSION);
}
