//! Upgrade path: `golden/db-schema5/` is a database written by the code before the stored
//! layouts were frozen (schema 5), with records of every earlier layout that still decodes
//! added below the store (one-sample records of schema 1, version 2 and 3 sample chunks, a
//! version 1 history point). Today's store opens a copy, reads back every incident,
//! sample, pwru line, verdict, baseline and history point as the values below, writes to
//! it again (a new incident, retention, a rotation) and checks it with [`Store::check`],
//! what `tailtrap db check` prints.
//!
//! The directory is never rewritten by today's code: it stands for the users' databases.
//! It was made with `TAILTRAP_WRITE_GOLDEN=1 cargo test -p storage --test upgrade --
//! --ignored write_golden_database` (see docs/storage.md, "Changing a stored type").
#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use common::{envelope, open_raw, SEC, T0};
use model::{
    Comm, CpuHolder, Flow, Histogram, Probe, ReaderWait, Sample, SampleFlags, SocketQueue,
    Transport, Verdict,
};
use storage::{
    CaptureState, CaptureStatus, Incident, IncidentCause, IncidentCounters, IncidentQuery,
    IncidentState, IncidentVerdict, NewIncident, PwruRecord, PwruState, PwruStatus, SampleFilter,
    Store, StoreConfig,
};

const GOLDEN_DB: &str = "tests/golden/db-schema5";
const MIN: u64 = 60 * SEC;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN_DB)
}

// ---- the values stored -------------------------------------------------------------------

fn new_incident(service: &str, probes: Vec<Probe>, opened_ns: u64) -> NewIncident {
    NewIncident {
        service: service.into(),
        probes,
        opened_ns,
        evidence_json: format!(r#"{{"service":"{service}","observed_ns":21000000}}"#),
        stages_json: format!(r#"{{"stage":"{service}-read"}}"#),
    }
}

/// Incident 1: closed, every status field set.
fn web_status(inc: &mut Incident) {
    inc.capture = CaptureStatus {
        state: CaptureState::Disarmed,
        emitted: 11,
        dropped: 12,
        rate_limited: 13,
        stored: 14,
        pre_trigger: 15,
        message: "disarmed: sample cap 20000 reached".into(),
    };
    inc.pwru = PwruStatus {
        state: PwruState::Done,
        exit_status: Some(3),
        signal: Some(15),
        stderr_tail: "attached 42 probes".into(),
        started_ns: Some(T0 + 2 * SEC),
        ended_ns: Some(T0 + 40 * SEC),
        lines_stored: 4,
        message: "done".into(),
    };
    inc.counters = IncidentCounters {
        intervals: 21,
        store_errors: 22,
    };
}

/// Incident 2: left open with capture armed and pwru running, so the next start marks
/// it interrupted.
fn db_status(inc: &mut Incident) {
    inc.capture = CaptureStatus {
        state: CaptureState::Armed,
        emitted: 31,
        dropped: 32,
        rate_limited: 33,
        stored: 34,
        pre_trigger: 35,
        message: "armed".into(),
    };
    inc.pwru = PwruStatus {
        state: PwruState::Running,
        exit_status: None,
        signal: None,
        stderr_tail: String::new(),
        started_ns: Some(T0 + 3 * SEC),
        ended_ns: None,
        lines_stored: 0,
        message: "running".into(),
    };
    inc.counters = IncidentCounters {
        intervals: 41,
        store_errors: 0,
    };
}

/// Incident 3: closed, pwru failed.
fn cache_status(inc: &mut Incident) {
    inc.capture = CaptureStatus {
        state: CaptureState::Failed,
        emitted: 0,
        dropped: 0,
        rate_limited: 0,
        stored: 5,
        pre_trigger: 1,
        message: "arming failed: no BTF".into(),
    };
    inc.pwru = PwruStatus {
        state: PwruState::Failed,
        exit_status: Some(1),
        signal: None,
        stderr_tail: "error: no such function".into(),
        started_ns: Some(T0 + 4 * SEC),
        ended_ns: Some(T0 + 5 * SEC),
        lines_stored: 0,
        message: "pwru exited 1".into(),
    };
    inc.counters = IncidentCounters {
        intervals: 51,
        store_errors: 52,
    };
}

/// The incidents as today's store must read them from the golden database (after its
/// open marked incident 2 interrupted).
fn expected_incidents() -> Vec<Incident> {
    let base = |id, n: NewIncident| Incident {
        id,
        service: n.service,
        probes: n.probes,
        opened_ns: n.opened_ns,
        closed_ns: None,
        state: IncidentState::Open,
        evidence_json: n.evidence_json,
        stages_json: n.stages_json,
        capture: CaptureStatus::default(),
        pwru: PwruStatus::default(),
        counters: IncidentCounters::default(),
        cause: None,
    };
    let mut web = base(
        1,
        new_incident(
            "web",
            vec![Probe::TcpSocketRead, Probe::UdpSocketEnqueued],
            T0,
        ),
    );
    web_status(&mut web);
    web.state = IncidentState::Closed;
    web.closed_ns = Some(T0 + 90 * SEC);
    let mut db = base(2, new_incident("db", vec![Probe::IpStart], T0 + SEC));
    db_status(&mut db);
    db.state = IncidentState::Interrupted;
    db.capture.state = CaptureState::Disarmed;
    db.capture.message = "disarmed: tailtrap stopped while capture was armed".into();
    db.pwru.state = PwruState::Failed;
    db.pwru.message =
        "tailtrap stopped while pwru ran; the lines stored until then are kept".into();
    let mut cache = base(
        3,
        new_incident(
            "cache",
            vec![Probe::UdpSocketRead, Probe::TcpStart],
            T0 + 2 * SEC,
        ),
    );
    cache_status(&mut cache);
    cache.state = IncidentState::Closed;
    cache.closed_ns = Some(T0 + 3 * SEC);
    vec![web, db, cache]
}

/// Samples of incident 1 (stored as version 4 chunks): 300 of the shared fixture, two
/// chunks, and three with the fields the fixture leaves alone.
fn web_samples() -> Vec<Sample> {
    let mut out: Vec<Sample> = (0..300)
        .map(|i| model::fixtures::sample(1, i, T0 + 10 * SEC + i * 1_000))
        .collect();
    out.extend(odd_samples(1, T0 + 20 * SEC));
    out
}

/// Samples whose every field differs from the fixture's: UDP over IPv6, no process, no
/// socket, no sequence number, no skb, other protocols and flags.
fn odd_samples(incident: u64, t: u64) -> Vec<Sample> {
    let v6 = |last| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last));
    vec![
        Sample {
            time_ns: t,
            incident,
            probe: Probe::UdpSocketRead,
            latency_ns: 7_654_321,
            flow: Flow {
                transport: Transport::Udp,
                src: v6(5),
                sport: 5353,
                dst: v6(1),
                dport: 53,
            },
            cgroup_id: 0,
            pid: None,
            comm: Comm::default(),
            cpu: 7,
            ifindex: 0,
            netns_ino: 4026532000,
            skb_len: 512,
            socket_queue: None,
            tcp_seq: None,
            flags: SampleFlags::SUBSAMPLED | SampleFlags::HOL_SUSPECT,
            skb: None,
            reader_wait: None,
            rx_queue: None,
        },
        Sample {
            time_ns: t + 1,
            incident,
            probe: Probe::IpStart,
            latency_ns: 1,
            flow: Flow {
                transport: Transport::Other(47),
                src: IpAddr::V4(Ipv4Addr::new(192, 168, 7, 9)),
                sport: 0,
                dst: IpAddr::V4(Ipv4Addr::new(192, 168, 7, 1)),
                dport: 0,
            },
            cgroup_id: u64::MAX,
            pid: Some(u32::MAX),
            comm: Comm::try_from("123456789012345").unwrap(),
            cpu: 255,
            ifindex: 9,
            netns_ino: 1,
            skb_len: 65535,
            socket_queue: Some(SocketQueue {
                bytes: 1,
                skbs: 2,
                rmem_alloc: 3,
                rcvbuf: 4,
            }),
            tcp_seq: Some(u32::MAX),
            flags: SampleFlags::PRE_TRIGGER | SampleFlags::SUBSAMPLED,
            skb: Some(u64::MAX),
            reader_wait: None,
            rx_queue: None,
        },
        Sample {
            time_ns: t + 2,
            incident,
            probe: Probe::UdpStart,
            latency_ns: u64::MAX,
            flow: Flow {
                transport: Transport::Udp,
                src: IpAddr::V4(Ipv4Addr::new(10, 9, 8, 7)),
                sport: 1,
                dst: IpAddr::V4(Ipv4Addr::new(10, 9, 8, 6)),
                dport: 65535,
            },
            cgroup_id: 12345,
            pid: Some(0),
            comm: Comm::try_from("résumé").unwrap(),
            cpu: 0,
            ifindex: 3,
            netns_ino: 4026531840,
            skb_len: 0,
            socket_queue: Some(SocketQueue {
                bytes: 0,
                skbs: 0,
                rmem_alloc: 0,
                rcvbuf: 212992,
            }),
            tcp_seq: None,
            flags: SampleFlags::empty(),
            skb: Some(0xffff_8880_1234_5600),
            reader_wait: None,
            rx_queue: None,
        },
    ]
}

/// Incident 3's samples by the layout they were written in: a one-sample record of
/// schema 1, a version 2 chunk of two, a version 3 chunk of three (the first two layouts
/// have no skb address: `None`).
fn cache_samples() -> [Vec<Sample>; 3] {
    let no_skb = |mut s: Sample| {
        s.skb = None;
        s
    };
    let at = |i, t| model::fixtures::sample(3, i, t);
    let [a, b, c] = <[Sample; 3]>::try_from(odd_samples(3, T0 + 2 * SEC + 300)).unwrap();
    [
        vec![no_skb(at(3, T0 + 2 * SEC + 100))],
        vec![no_skb(at(4, T0 + 2 * SEC + 200)), no_skb(b)],
        vec![a, c, at(11, T0 + 2 * SEC + 400)],
    ]
}

fn pwru_records() -> Vec<PwruRecord> {
    let flows = [
        Some(model::fixtures::sample(1, 1, 0).flow),
        Some(odd_samples(1, 0)[0].flow),
        None,
        Some(odd_samples(1, 0)[1].flow),
    ];
    flows
        .into_iter()
        .enumerate()
        .map(|(i, flow)| {
            let seq = i as u64;
            PwruRecord {
                incident: 1,
                seq,
                received_ns: T0 + 30 * SEC + seq,
                pwru_time_ns: (seq != 2).then_some(1_000_000 + seq),
                func: ["ip_rcv_core", "tcp_v4_rcv", "udp_rcv", "skb_consume_udp"][i].into(),
                skb: 0xffff_8880_0400_0000 + seq,
                flow,
                raw: format!(r#"{{"func":"f{seq}","skb":"0x{seq:x}"}}"#),
            }
        })
        .collect()
}

fn verdicts() -> [(u64, IncidentVerdict); 2] {
    [
        (
            1,
            IncidentVerdict {
                verdict: Verdict::Real,
                note: "seen by the on-call".into(),
                marked_ns: T0 + 100 * SEC,
            },
        ),
        (
            3,
            IncidentVerdict {
                verdict: Verdict::FalseAlarm,
                note: "deploy".into(),
                marked_ns: T0 + 101 * SEC,
            },
        ),
    ]
}

fn baselines() -> Vec<(String, Probe, Vec<u8>)> {
    vec![
        ("db".into(), Probe::IpStart, b"\x01db baseline".to_vec()),
        ("web".into(), Probe::TcpSocketRead, (0..=255u8).collect()),
    ]
}

/// The 1 s history of web/tcp-socket-read at second `i`.
fn hist(i: u64) -> Histogram {
    let mut h = Histogram::new();
    h.record_n(1_000 + i * 997, i + 1);
    h.record(2_000_000 + i);
    if i % 3 == 0 {
        h.record(40_000_000_000 + i);
    }
    h
}

/// Seconds of web/tcp-socket-read history: a full 1 s chunk and part of the next.
const WEB_SECONDS: u64 = 75;

/// The version 1 history point (one record per point, before chunks) of cache/udp-start.
fn old_point() -> (u64, Histogram) {
    let mut h = Histogram::new();
    h.record_n(123_456, 4);
    h.record(9);
    (T0 + 5 * SEC, h)
}

// ---- the generator -----------------------------------------------------------------------

/// Writes `golden/db-schema5/` (run by hand; see the module's documentation). Never run
/// it with a build that writes a new layout: the directory must stay what earlier builds
/// wrote.
#[test]
#[ignore = "writes the golden database; TAILTRAP_WRITE_GOLDEN=1 to run"]
fn write_golden_database() {
    if std::env::var_os("TAILTRAP_WRITE_GOLDEN").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    {
        let s = Store::open(&dir, StoreConfig::default()).unwrap();
        let mut web = s
            .open_incident(&new_incident(
                "web",
                vec![Probe::TcpSocketRead, Probe::UdpSocketEnqueued],
                T0,
            ))
            .unwrap();
        let mut db = s
            .open_incident(&new_incident("db", vec![Probe::IpStart], T0 + SEC))
            .unwrap();
        let mut cache = s
            .open_incident(&new_incident(
                "cache",
                vec![Probe::UdpSocketRead, Probe::TcpStart],
                T0 + 2 * SEC,
            ))
            .unwrap();
        web_status(&mut web);
        db_status(&mut db);
        cache_status(&mut cache);
        for inc in [&web, &db, &cache] {
            s.update_incident(inc).unwrap();
        }
        s.close_incident(&mut web, T0 + 90 * SEC).unwrap();
        s.close_incident(&mut cache, T0 + 3 * SEC).unwrap();
        s.put_samples(&web_samples()).unwrap();
        s.put_pwru(&pwru_records()).unwrap();
        for (id, v) in verdicts() {
            s.mark_incident(id, &v).unwrap();
        }
        for (service, probe, bytes) in baselines() {
            s.put_baseline(&service, probe, &bytes).unwrap();
        }
        for i in 0..WEB_SECONDS {
            s.record_history("web", Probe::TcpSocketRead, T0 + i * SEC, &hist(i))
                .unwrap();
        }
        s.flush().unwrap();
    }
    write_older_layouts(&dir);
    // What an earlier build wrote is never replaced; a new layout gets a new directory.
    let out = golden_dir();
    assert!(!out.exists(), "{} exists: not replaced", out.display());
    copy_dir(&dir, &out);
}

/// Records of the layouts earlier builds wrote, put below the store as those builds did.
fn write_older_layouts(dir: &Path) {
    let db = open_raw(dir);
    let samples = db.open_tree("samples").unwrap();
    let [one, v2, v3] = cache_samples();
    // The live sample's encoding has the stored layouts' fields in their order; the
    // layouts below end before its reader's wait and its RX queue (the last two fields,
    // `None` each: one 0 byte).
    let before_wait = |s: &Sample| {
        assert_eq!((s.reader_wait, s.rx_queue), (None, None));
        let mut bytes = postcard::to_allocvec(s).unwrap();
        assert_eq!(bytes.pop(), Some(0));
        assert_eq!(bytes.pop(), Some(0));
        bytes
    };
    // Schema 1: one record per sample, the sample without its skb address either (the
    // field before, `None`: one 0 byte), envelope version 1.
    let mut payload = before_wait(&one[0]);
    assert_eq!(payload.pop(), Some(0));
    samples
        .insert(sample_key(&one[0], 7), envelope(1, &payload))
        .unwrap();
    // Version 2: a chunk of such samples.
    let mut payload = postcard::to_allocvec(&v2.len()).unwrap();
    for s in &v2 {
        let mut one = before_wait(s);
        assert_eq!(one.pop(), Some(0));
        payload.extend(one);
    }
    samples
        .insert(sample_key(&v2[0], 8 << 20), envelope(2, &payload))
        .unwrap();
    // Version 3: the samples with their address, uncompressed.
    let mut payload = postcard::to_allocvec(&v3.len()).unwrap();
    for s in &v3 {
        payload.extend(before_wait(s));
    }
    samples
        .insert(sample_key(&v3[0], 9 << 20), envelope(3, &payload))
        .unwrap();
    // History before chunks: one version 1 record per point, keyed by its start.
    let (start, h) = old_point();
    let mut key = vec![0u8, 5];
    key.extend_from_slice(b"cache");
    key.push(Probe::UdpStart.id() as u8);
    key.extend_from_slice(&start.to_be_bytes());
    db.open_tree("history")
        .unwrap()
        .insert(key, envelope(1, &postcard::to_allocvec(&h).unwrap()))
        .unwrap();
    db.flush().unwrap();
}

fn sample_key(s: &Sample, seq: u64) -> Vec<u8> {
    [s.incident, s.time_ns, seq]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

// ---- the test ----------------------------------------------------------------------------

/// Everything the golden database holds, as today's store reads it.
fn check_everything(s: &Store, history_1s: bool) {
    let page = s.incidents(&IncidentQuery::default()).unwrap();
    let mut got: Vec<Incident> = page.incidents.into_iter().filter(|i| i.id <= 3).collect();
    got.sort_by_key(|i| i.id);
    assert_eq!(got, expected_incidents());
    for inc in expected_incidents() {
        assert_eq!(s.incident(inc.id).unwrap(), Some(inc));
    }

    let mut want = web_samples();
    want.sort_by_key(|s| s.time_ns);
    assert_eq!(all_samples(s, 1), want);
    let mut want: Vec<Sample> = cache_samples().concat();
    want.sort_by_key(|s| s.time_ns);
    assert_eq!(all_samples(s, 3), want);
    assert_eq!(all_samples(s, 2), []);

    assert_eq!(s.pwru_records(1, None, 100).unwrap(), pwru_records());
    for (id, v) in verdicts() {
        assert_eq!(s.verdict(id).unwrap(), Some(v));
    }
    assert_eq!(s.verdict(2).unwrap(), None);
    assert_eq!(s.baselines().unwrap(), baselines());

    let web = |level| {
        // Before the first second (the first minute starts before it) to before the
        // second written by the test.
        s.history_at_level(level, "web", Probe::TcpSocketRead, T0 - MIN, T0 + 2 * MIN)
            .unwrap()
            .points
    };
    if history_1s {
        let want: Vec<(u64, Histogram)> =
            (0..WEB_SECONDS).map(|i| (T0 + i * SEC, hist(i))).collect();
        assert_eq!(web(0), want);
    }
    // The coarser levels: each point the merge of the seconds within it.
    for (level, width) in [(1, 10 * SEC), (2, MIN)] {
        let mut want: Vec<(u64, Histogram)> = Vec::new();
        for i in 0..WEB_SECONDS {
            let t = T0 + i * SEC;
            let start = t - t % width;
            match want.last_mut() {
                Some((s, h)) if *s == start => h.merge(&hist(i)),
                _ => want.push((start, hist(i))),
            }
        }
        assert_eq!(web(level), want, "level {level}");
    }
    if history_1s {
        let cache = s
            .history_at_level(0, "cache", Probe::UdpStart, T0, T0 + 60 * SEC)
            .unwrap();
        assert_eq!(cache.points, vec![old_point()]);
    }
}

fn all_samples(s: &Store, incident: u64) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = s
            .samples(incident, &SampleFilter::default(), after, 1000)
            .unwrap();
        out.extend(page.samples);
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    out.sort_by_key(|s| s.time_ns);
    out
}

fn assert_clean(s: &Store, samples: u64) {
    let report = s.check(|_| {}).unwrap();
    assert_eq!(report.undecodable, 0, "{report:#?}");
    assert_eq!(report.samples, samples, "{report:#?}");
    assert_eq!(s.stats().undecodable_records, 0);
}

#[test]
fn a_database_of_the_earlier_build_opens_reads_writes_and_checks_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    copy_dir(&golden_dir(), &dir);
    let before = web_samples().len() + cache_samples().concat().len();

    let s = Store::open(&dir, StoreConfig::default()).unwrap();
    assert_eq!(s.open_report().interrupted, vec![2]);
    assert_eq!(s.open_report().moved_aside, None);
    check_everything(&s, true);
    assert_clean(&s, before as u64);

    // Written again: a new incident with samples, pwru and a verdict, more history.
    let mut four = s
        .open_incident(&new_incident("web", vec![Probe::TcpStart], T0 + 200 * SEC))
        .unwrap();
    assert_eq!(four.id, 4);
    let new = new_samples();
    s.put_samples(&new).unwrap();
    let mut line = pwru_records().remove(0);
    line.incident = 4;
    s.put_pwru(std::slice::from_ref(&line)).unwrap();
    s.close_incident(&mut four, T0 + 210 * SEC).unwrap();
    let verdict = IncidentVerdict {
        verdict: Verdict::Expected,
        note: String::new(),
        marked_ns: T0 + 220 * SEC,
    };
    s.mark_incident(4, &verdict).unwrap();
    s.record_history("web", Probe::TcpSocketRead, T0 + 300 * SEC, &hist(300))
        .unwrap();
    s.flush().unwrap();
    check_everything(&s, true);
    assert_eq!(s.incident(4).unwrap(), Some(four.clone()));
    assert_eq!(all_samples(&s, 4), new);
    check_reader_waits(&all_samples(&s, 4));
    check_rx_queues(&all_samples(&s, 4));
    assert_eq!(s.pwru_records(4, None, 10).unwrap(), vec![line.clone()]);
    assert_eq!(s.verdict(4).unwrap(), Some(verdict.clone()));
    let total = (before + new.len()) as u64;
    assert_clean(&s, total);

    // Every record copied into a fresh database, then retention past the 1 s level's
    // 6 h: the incidents and the coarser history stay.
    s.rotate().unwrap();
    check_everything(&s, true);
    s.enforce_retention(T0 + 7 * 3600 * SEC).unwrap();
    check_everything(&s, false);
    // The golden seconds and the one written above (still in the store's write buffer).
    let fine = |s: &Store| {
        s.history_at_level(0, "web", Probe::TcpSocketRead, T0, T0 + 10 * MIN)
            .unwrap()
            .points
    };
    assert_eq!(fine(&s), []);
    assert_clean(&s, total);
    drop(s);
    // Today's samples went into a version 6 chunk; the earlier builds' records, through
    // the rotation, stay as they were written.
    assert_eq!(
        sample_record_versions(&dir),
        vec![(1, 4), (1, 4), (3, 1), (3, 2), (3, 3), (4, 6)]
    );

    // And what was written reads back after a restart.
    let s = Store::open(&dir, StoreConfig::default()).unwrap();
    assert_eq!(s.open_report().interrupted, Vec::<u64>::new());
    check_everything(&s, false);
    assert_eq!(fine(&s), []);
    assert_eq!(s.incident(4).unwrap(), Some(four));
    assert_eq!(all_samples(&s, 4), new);
    check_reader_waits(&all_samples(&s, 4));
    check_rx_queues(&all_samples(&s, 4));
    assert_eq!(s.pwru_records(4, None, 10).unwrap(), vec![line]);
    assert_eq!(s.verdict(4).unwrap(), Some(verdict));
    assert_clean(&s, total);
}

/// Samples today's build writes into the upgraded database (incident 4): the shared
/// fixture's, the first two with the reader's wait (with the CPU's holder, without one),
/// the rest without; the first and the third with an RX queue (3, and 0), the rest
/// without.
fn new_samples() -> Vec<Sample> {
    let mut new: Vec<Sample> = (0..10)
        .map(|i| model::fixtures::sample(4, i, T0 + 200 * SEC + i))
        .collect();
    new[0].reader_wait = Some(ReaderWait {
        runq_ns: 2_500_000,
        off_cpu_ns: 17_000_000_001,
        cpu_holder: Some(CpuHolder {
            pid: 4321,
            comm: Comm::try_from("stress-ng-cpu").unwrap(),
        }),
    });
    new[1].reader_wait = Some(ReaderWait {
        runq_ns: 0,
        off_cpu_ns: u64::MAX,
        cpu_holder: None,
    });
    new[0].rx_queue = Some(3);
    new[2].rx_queue = Some(0);
    new
}

/// [`new_samples`]' RX queues as read back.
fn check_rx_queues(got: &[Sample]) {
    let queues: Vec<Option<u16>> = got.iter().map(|s| s.rx_queue).collect();
    let mut want = vec![None; 10];
    want[0] = Some(3);
    want[2] = Some(0);
    assert_eq!(queues, want);
}

/// Samples of a version 5 chunk (as the build before the RX queue wrote them) for incident
/// 3: the reader's wait with and without the CPU's holder, and none.
fn v5_samples() -> Vec<Sample> {
    let mut out: Vec<Sample> = (0..3)
        .map(|i| model::fixtures::sample(3, 20 + i, T0 + 2 * SEC + 500 + i))
        .collect();
    out[0].reader_wait = Some(ReaderWait {
        runq_ns: 7_000,
        off_cpu_ns: 11_000_000,
        cpu_holder: Some(CpuHolder {
            pid: 99,
            comm: Comm::try_from("hog").unwrap(),
        }),
    });
    out[1].reader_wait = Some(ReaderWait {
        runq_ns: 1,
        off_cpu_ns: 0,
        cpu_holder: None,
    });
    out
}

/// `samples` as a version 5 chunk record: the live encoding of each (its fields in the
/// stored layouts' order) without its RX queue (the last field, `None`: one 0 byte),
/// lz4-compressed behind the count and the length.
fn v5_chunk(samples: &[Sample]) -> Vec<u8> {
    let mut raw = postcard::to_allocvec(&samples.len()).unwrap();
    for s in samples {
        assert_eq!(s.rx_queue, None);
        let mut one = postcard::to_allocvec(s).unwrap();
        assert_eq!(one.pop(), Some(0));
        raw.extend(one);
    }
    let mut payload = postcard::to_allocvec(&(samples.len(), raw.len())).unwrap();
    payload.extend(lz4_flex::block::compress(&raw));
    envelope(5, &payload)
}

/// A database holding a version 5 chunk (samples with their reader's wait, before the RX
/// queue) beside today's version 6 ones: the old chunk reads field by field with no RX
/// queue, today's with theirs, through a rotation and a restart, and `db check` is clean.
#[test]
fn a_version_5_chunk_reads_with_no_rx_queue_beside_version_6_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    copy_dir(&golden_dir(), &dir);
    let old = v5_samples();
    {
        let db = open_raw(&dir);
        db.open_tree("samples")
            .unwrap()
            .insert(sample_key(&old[0], 10 << 20), v5_chunk(&old))
            .unwrap();
        db.flush().unwrap();
    }
    let before = web_samples().len() + cache_samples().concat().len() + old.len();
    let s = Store::open(&dir, StoreConfig::default()).unwrap();
    let mut four = s
        .open_incident(&new_incident("web", vec![Probe::TcpStart], T0 + 200 * SEC))
        .unwrap();
    let new = new_samples();
    s.put_samples(&new).unwrap();
    s.close_incident(&mut four, T0 + 210 * SEC).unwrap();
    s.flush().unwrap();
    let total = (before + new.len()) as u64;
    let check = |s: &Store| {
        let got: Vec<Sample> = all_samples(s, 3)
            .into_iter()
            .filter(|x| x.time_ns >= old[0].time_ns)
            .collect();
        assert_eq!(got, old);
        assert!(got.iter().all(|x| x.rx_queue.is_none()), "{got:?}");
        let w = got[0].reader_wait.unwrap();
        assert_eq!((w.runq_ns, w.off_cpu_ns), (7_000, 11_000_000));
        let holder = w.cpu_holder.unwrap();
        assert_eq!((holder.pid, holder.comm.as_str()), (99, "hog"));
        assert_eq!(got[1].reader_wait.unwrap().cpu_holder, None);
        assert_eq!(got[2].reader_wait, None);
        assert_eq!(all_samples(s, 4), new);
        check_rx_queues(&all_samples(s, 4));
        assert_clean(s, total);
    };
    check(&s);
    s.rotate().unwrap();
    check(&s);
    drop(s);
    assert_eq!(
        sample_record_versions(&dir),
        vec![(1, 4), (1, 4), (3, 1), (3, 2), (3, 3), (3, 5), (4, 6)]
    );
    let s = Store::open(&dir, StoreConfig::default()).unwrap();
    check(&s);
}

/// The envelope version of each samples record on disk, by incident in key order (the
/// store closed).
fn sample_record_versions(dir: &Path) -> Vec<(u64, u8)> {
    let db = open_raw(dir);
    let tree = db.open_tree("samples").unwrap();
    tree.iter()
        .map(|r| {
            let (k, v) = r.unwrap();
            (u64::from_be_bytes(k[..8].try_into().unwrap()), v[0])
        })
        .collect()
}

/// [`new_samples`]' readers' waits as read back, field by field.
fn check_reader_waits(got: &[Sample]) {
    assert_eq!(got.len(), 10);
    let wait = got[0].reader_wait.unwrap();
    assert_eq!(wait.runq_ns, 2_500_000);
    assert_eq!(wait.off_cpu_ns, 17_000_000_001);
    let holder = wait.cpu_holder.unwrap();
    assert_eq!(holder.pid, 4321);
    assert_eq!(holder.comm.as_str(), "stress-ng-cpu");
    let wait = got[1].reader_wait.unwrap();
    assert_eq!(wait.runq_ns, 0);
    assert_eq!(wait.off_cpu_ns, u64::MAX);
    assert_eq!(wait.cpu_holder, None);
    assert!(got[2..].iter().all(|s| s.reader_wait.is_none()), "{got:?}");
}

/// The envelope version of each incident record on disk, by id (the store closed).
fn incident_record_versions(dir: &Path) -> Vec<(u64, u8)> {
    let db = open_raw(dir);
    let tree = db.open_tree("incidents").unwrap();
    tree.iter()
        .map(|r| {
            let (k, v) = r.unwrap();
            (u64::from_be_bytes(k[..8].try_into().unwrap()), v[0])
        })
        .collect()
}

/// An incident the earlier build wrote (a version 1 record, before causes) rewritten by
/// today's daemon with its cause, the whole record as the daemon stores it
/// ([`Store::update_incident`]), reads back with that cause beside the untouched ones
/// (`cause: None`), through a rotation and a restart, and `db check` stays clean.
#[test]
fn an_incident_of_the_earlier_build_rewritten_with_a_cause_reads_back_and_checks_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    copy_dir(&golden_dir(), &dir);
    // What the earlier build wrote: schema 5, every incident a version 1 record.
    assert_eq!(incident_record_versions(&dir), vec![(1, 1), (2, 1), (3, 1)]);
    let samples = (web_samples().len() + cache_samples().concat().len()) as u64;

    let s = Store::open(&dir, StoreConfig::default()).unwrap();
    assert_eq!(s.open_report().interrupted, vec![2]);
    assert_eq!(s.schema_version().unwrap(), storage::SCHEMA_VERSION);
    let mut web = s.incident(1).unwrap().unwrap();
    assert_eq!(web.cause, None);
    let cause = IncidentCause {
        kind: "one-cpu".into(),
        summary: "one CPU: cpu 1 has 94 % of slow packets".into(),
        figures_json: r#"{"cpu":1,"share":0.94}"#.into(),
        decided_ns: T0 + 95 * SEC,
    };
    web.cause = Some(cause.clone());
    s.update_incident(&web).unwrap();
    s.flush().unwrap();

    let mut want = expected_incidents();
    want[0].cause = Some(cause.clone());
    let read_back = |s: &Store| {
        for inc in &want {
            assert_eq!(s.incident(inc.id).unwrap().as_ref(), Some(inc));
        }
        let mut got = s.incidents(&IncidentQuery::default()).unwrap().incidents;
        got.sort_by_key(|i| i.id);
        assert_eq!(got, want);
        assert_clean(s, samples);
    };
    read_back(&s);
    // What the API and the CLI print of it.
    let json = serde_json::to_value(s.incident(1).unwrap().unwrap()).unwrap();
    assert_eq!(json["cause"]["kind"], "one-cpu");
    assert_eq!(json["cause"]["decided_ns"], T0 + 95 * SEC);
    let json = serde_json::to_value(s.incident(3).unwrap().unwrap()).unwrap();
    assert!(json["cause"].is_null(), "{json}");

    // Every record copied into a fresh database (a version 1 incident record included).
    s.rotate().unwrap();
    read_back(&s);
    drop(s);
    // Incident 1 rewritten with its cause and 2 marked interrupted: version 2 records;
    // 3, never written again, stays as the earlier build wrote it.
    assert_eq!(incident_record_versions(&dir), vec![(1, 2), (2, 2), (3, 1)]);

    let s = Store::open(&dir, StoreConfig::default()).unwrap();
    assert_eq!(s.open_report().interrupted, Vec::<u64>::new());
    read_back(&s);
    check_everything_but_incidents(&s);
}

/// [`check_everything`] with incident 1's cause set: its other records as they were.
fn check_everything_but_incidents(s: &Store) {
    let mut want = web_samples();
    want.sort_by_key(|s| s.time_ns);
    assert_eq!(all_samples(s, 1), want);
    assert_eq!(s.pwru_records(1, None, 100).unwrap(), pwru_records());
    for (id, v) in verdicts() {
        assert_eq!(s.verdict(id).unwrap(), Some(v));
    }
    assert_eq!(s.baselines().unwrap(), baselines());
}
