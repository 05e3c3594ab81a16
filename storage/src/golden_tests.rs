//! Golden records: `storage/tests/golden/records/*.bin` hold one stored value of every
//! layout ever written (envelope included), made from the fixed values below. These tests
//! decode each with today's code and compare every field, and encode the values of the
//! layouts this build writes and compare the bytes: a field added to a stored type, or
//! to any type inside one, fails them until a new frozen version is added
//! (docs/storage.md, "Changing a stored type").
//!
//! Written by `TAILTRAP_WRITE_GOLDEN=1 cargo test -p storage --lib -- --ignored
//! write_golden_records`, only ever for a file that does not exist yet: a layout once
//! written stays as its file says.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use model::{
    Comm, CpuHolder, Flow, Histogram, Probe, ReaderWait, Sample, SampleFlags, SocketQueue,
    Transport,
};

use crate::codec::{
    self, Record, HISTORY_CHUNK_VERSION, INCIDENT_RECORD_VERSION, RECORD_VERSION, SAMPLE_CHUNK_V3,
    SAMPLE_CHUNK_V4, SAMPLE_CHUNK_V5, SAMPLE_CHUNK_VERSION,
};
use crate::history_chunk::{decode_record, record_points, Chunk, Stored};
use crate::layout::sample::{sample_bytes_before, samples_v3_bytes, samples_v5_bytes};
use crate::limits::{MAX_BASELINE_BYTES, MAX_INCIDENT_BYTES, MAX_PWRU_BYTES};
use crate::{
    chunk, CaptureState, CaptureStatus, Incident, IncidentCause, IncidentCounters, IncidentState,
    IncidentVerdict, PwruRecord, PwruState, PwruStatus,
};
use model::Verdict;

const T: u64 = 1_790_000_000_123_456_789;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/records")
}

fn golden(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---- the fixed values: every field set, none to its default -----------------------------

fn incident() -> Incident {
    Incident {
        id: 4242,
        service: "checkout".into(),
        probes: vec![Probe::UdpSocketEnqueued, Probe::TcpSocketRead],
        opened_ns: T,
        closed_ns: Some(T + 61),
        state: IncidentState::Interrupted,
        evidence_json: r#"{"q":0.99}"#.into(),
        stages_json: r#"{"stage":"softirq"}"#.into(),
        capture: CaptureStatus {
            state: CaptureState::Disarmed,
            emitted: 1,
            dropped: 2,
            rate_limited: 3,
            stored: 4,
            pre_trigger: 5,
            message: "disarmed: time cap".into(),
        },
        pwru: PwruStatus {
            state: PwruState::Failed,
            exit_status: Some(-2),
            signal: Some(9),
            stderr_tail: "killed".into(),
            started_ns: Some(T + 6),
            ended_ns: Some(T + 7),
            lines_stored: 8,
            message: "pwru was killed".into(),
        },
        counters: IncidentCounters {
            intervals: 9,
            store_errors: 10,
        },
        cause: Some(IncidentCause {
            kind: "one-cpu".into(),
            summary: "one CPU: cpu 1 has 94 % of slow packets".into(),
            figures_json: r#"{"cpu":1,"share":0.94}"#.into(),
            decided_ns: T + 13,
        }),
    }
}

/// [`incident`] as the layout before causes reads it.
fn incident_without_cause() -> Incident {
    Incident {
        cause: None,
        ..incident()
    }
}

fn v6(last: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last))
}

fn pwru() -> PwruRecord {
    PwruRecord {
        incident: 4242,
        seq: 17,
        received_ns: T + 11,
        pwru_time_ns: Some(123_456),
        func: "tcp_v6_rcv".into(),
        skb: 0xffff_8880_0000_1200,
        flow: Some(Flow {
            transport: Transport::Tcp,
            src: v6(2),
            sport: 443,
            dst: v6(1),
            dport: 51000,
        }),
        raw: r#"{"func":"tcp_v6_rcv"}"#.into(),
    }
}

fn verdict() -> IncidentVerdict {
    IncidentVerdict {
        verdict: Verdict::FalseAlarm,
        note: "a deploy".into(),
        marked_ns: T + 12,
    }
}

fn baseline() -> Vec<u8> {
    b"\x02opaque detector baseline".to_vec()
}

fn moved_aside() -> Vec<String> {
    vec!["/var/lib/tailtrap/db.corrupt-2026-01-02T03:04:05Z".into()]
}

/// Three samples of one incident in time order whose fields differ from each other and
/// from their defaults between them: the reader's wait with the CPU's holder, without
/// one, and none; RX queue 0, none, and the highest the kernel can record.
fn samples() -> Vec<Sample> {
    let mut a = model::fixtures::sample(4242, 3, T + 100);
    a.comm = Comm::try_from("nginx: worker").unwrap_or_default();
    a.flags = SampleFlags::PRE_TRIGGER | SampleFlags::HOL_SUSPECT;
    a.reader_wait = Some(ReaderWait {
        runq_ns: 1_234_567,
        off_cpu_ns: 89_000_001,
        cpu_holder: Some(CpuHolder {
            pid: 31337,
            comm: Comm::try_from("stress-ng-cpu").unwrap_or_default(),
        }),
    });
    a.rx_queue = Some(0);
    let b = Sample {
        time_ns: T + 200,
        incident: 4242,
        probe: Probe::UdpSocketRead,
        latency_ns: 987_654_321,
        flow: Flow {
            transport: Transport::Udp,
            src: v6(7),
            sport: 5353,
            dst: v6(8),
            dport: 53,
        },
        cgroup_id: 0,
        pid: None,
        comm: Comm::default(),
        cpu: 3,
        ifindex: 0,
        netns_ino: 4026532001,
        skb_len: 77,
        socket_queue: None,
        tcp_seq: None,
        flags: SampleFlags::SUBSAMPLED,
        skb: None,
        reader_wait: Some(ReaderWait {
            runq_ns: 0,
            off_cpu_ns: u64::MAX,
            cpu_holder: None,
        }),
        rx_queue: None,
    };
    let c = Sample {
        time_ns: T + 300,
        incident: 4242,
        probe: Probe::IpStart,
        latency_ns: u64::MAX,
        flow: Flow {
            transport: Transport::Other(132),
            src: IpAddr::V4(Ipv4Addr::new(172, 16, 0, 9)),
            sport: 0,
            dst: IpAddr::V4(Ipv4Addr::new(172, 16, 0, 1)),
            dport: 0,
        },
        cgroup_id: u64::MAX,
        pid: Some(u32::MAX),
        comm: Comm::try_from("ksoftirqd/3").unwrap_or_default(),
        cpu: u32::MAX,
        ifindex: 12,
        netns_ino: u32::MAX,
        skb_len: u32::MAX,
        socket_queue: Some(SocketQueue {
            bytes: 10,
            skbs: 20,
            rmem_alloc: 30,
            rcvbuf: 40,
        }),
        tcp_seq: Some(0),
        flags: SampleFlags::empty(),
        skb: Some(u64::MAX),
        reader_wait: None,
        rx_queue: Some(u16::MAX - 1),
    };
    vec![a, b, c]
}

/// [`samples`] as the layout before the RX queue reads them (chunk version 5).
fn samples_without_queue() -> Vec<Sample> {
    samples()
        .into_iter()
        .map(|s| Sample {
            rx_queue: None,
            ..s
        })
        .collect()
}

/// [`samples`] as layouts before the reader's wait read them (chunk versions 3 and 4).
fn samples_without_wait() -> Vec<Sample> {
    samples_without_queue()
        .into_iter()
        .map(|s| Sample {
            reader_wait: None,
            ..s
        })
        .collect()
}

/// [`samples`] as layouts before the skb address read them (neither field).
fn samples_without_skb() -> Vec<Sample> {
    samples_without_wait()
        .into_iter()
        .map(|s| Sample { skb: None, ..s })
        .collect()
}

fn hist(seed: u64) -> Histogram {
    let mut h = Histogram::new();
    h.record_n(5 + seed, seed + 1);
    h.record(1_000_000 * seed + 17);
    h.record(u64::MAX / 2);
    h
}

/// A history chunk's points: its start is the first's.
fn history_points() -> Vec<(u64, Histogram)> {
    vec![
        (T, hist(1)),
        (T + 1_000_000_000, hist(2)),
        (T + 59_000_000_000, hist(3)),
    ]
}

// ---- today's encoding of the layouts this build writes ----------------------------------

fn encode_incident() -> Vec<u8> {
    codec::encode("incident", &incident(), MAX_INCIDENT_BYTES).unwrap()
}

fn encode_pwru() -> Vec<u8> {
    codec::encode("pwru", &pwru(), MAX_PWRU_BYTES).unwrap()
}

fn encode_verdict() -> Vec<u8> {
    codec::encode("meta", &verdict(), 64 << 10).unwrap()
}

fn encode_baseline() -> Vec<u8> {
    codec::encode("baseline", &baseline(), MAX_BASELINE_BYTES).unwrap()
}

fn encode_moved_aside() -> Vec<u8> {
    codec::encode("meta", &moved_aside(), 64 << 10).unwrap()
}

fn encode_counter() -> Vec<u8> {
    codec::encode("meta", &0x0123_4567_89ab_cdefu64, 64 << 10).unwrap()
}

fn encode_schema() -> Vec<u8> {
    codec::encode("meta", &5u32, 64 << 10).unwrap()
}

fn encode_sample_chunk() -> Vec<u8> {
    chunk::encode_batch(1, &samples()).unwrap().remove(0).value
}

fn encode_history_chunk() -> Vec<u8> {
    let points = history_points();
    let mut c = Chunk::empty(points[0].0, Stored::Absent);
    for (t, h) in &points {
        c.add(*t, h, true).unwrap();
    }
    c.encode().unwrap()
}

/// Layouts no longer written, made as the builds that wrote them did: an incident without
/// its cause is today's encoding without its last byte (`None`), a sample without its
/// address today's without its last three (`None` each: no address, no reader's wait, no
/// RX queue), a version 3 chunk today's samples without their last two, uncompressed, a
/// version 4 chunk the same compressed, a version 5 chunk today's samples without their
/// last byte, compressed, a version 1 history record one histogram.
/// An incident before causes: today's encoding of it without a cause, less its last byte
/// (`None`), in a version 1 envelope.
fn encode_incident_v1() -> Vec<u8> {
    let mut payload = postcard::to_allocvec(&incident_without_cause().freeze()).unwrap();
    assert_eq!(payload.pop(), Some(0));
    envelope(RECORD_VERSION, &payload)
}

/// A sample of the layout before the skb address: today's without its last three fields.
fn sample_v1_bytes(s: &Sample) -> Vec<u8> {
    sample_bytes_before(s, 3)
}

fn encode_sample_v1() -> Vec<u8> {
    envelope(
        codec::RECORD_VERSION,
        &sample_v1_bytes(&samples_without_skb()[0]),
    )
}

fn encode_sample_chunk_v2() -> Vec<u8> {
    let all = samples_without_skb();
    let mut payload = postcard::to_allocvec(&all.len()).unwrap();
    for s in &all {
        payload.extend(sample_v1_bytes(s));
    }
    envelope(codec::SAMPLE_CHUNK_V2, &payload)
}

fn encode_sample_chunk_v3() -> Vec<u8> {
    envelope(SAMPLE_CHUNK_V3, &samples_v3_bytes(&samples_without_wait()))
}

/// A version 4 chunk: [`encode_sample_chunk_v3`]'s samples lz4-compressed behind the
/// sample count and their length.
fn encode_sample_chunk_v4() -> Vec<u8> {
    let all = samples_without_wait();
    let raw = samples_v3_bytes(&all);
    let mut payload = postcard::to_allocvec(&(all.len(), raw.len())).unwrap();
    payload.extend(lz4_flex::block::compress(&raw));
    envelope(SAMPLE_CHUNK_V4, &payload)
}

/// A version 5 chunk: [`samples_without_queue`] lz4-compressed behind the sample count and
/// their length, each sample today's without its last field.
fn encode_sample_chunk_v5() -> Vec<u8> {
    let all = samples_without_queue();
    let raw = samples_v5_bytes(&all);
    let mut payload = postcard::to_allocvec(&(all.len(), raw.len())).unwrap();
    payload.extend(lz4_flex::block::compress(&raw));
    envelope(SAMPLE_CHUNK_V5, &payload)
}

fn encode_history_v1() -> Vec<u8> {
    envelope(
        codec::RECORD_VERSION,
        &postcard::to_allocvec(&hist(4)).unwrap(),
    )
}

fn envelope(version: u8, payload: &[u8]) -> Vec<u8> {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[version]), payload);
    let mut out = vec![version];
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Makes a golden file's bytes.
type Make = fn() -> Vec<u8>;

/// Every golden file and how it is made.
fn files() -> Vec<(&'static str, Make)> {
    vec![
        ("incident-v1.bin", encode_incident_v1),
        ("incident-v2.bin", encode_incident),
        ("pwru-v1.bin", encode_pwru),
        ("verdict-v1.bin", encode_verdict),
        ("baseline-v1.bin", encode_baseline),
        ("meta-moved-aside-v1.bin", encode_moved_aside),
        ("meta-counter-v1.bin", encode_counter),
        ("meta-schema-v1.bin", encode_schema),
        ("sample-v1.bin", encode_sample_v1),
        ("sample-chunk-v2.bin", encode_sample_chunk_v2),
        ("sample-chunk-v3.bin", encode_sample_chunk_v3),
        ("sample-chunk-v4.bin", encode_sample_chunk_v4),
        ("sample-chunk-v5.bin", encode_sample_chunk_v5),
        ("sample-chunk-v6.bin", encode_sample_chunk),
        ("history-point-v1.bin", encode_history_v1),
        ("history-chunk-v2.bin", encode_history_chunk),
    ]
}

#[test]
#[ignore = "writes golden files; TAILTRAP_WRITE_GOLDEN=1 to run"]
fn write_golden_records() {
    model::fixtures::write_missing_golden(&dir(), &files());
}

// ---- decoding: every layout to its values -----------------------------------------------

#[test]
fn golden_records_decode_to_their_values() {
    let v1 = golden("incident-v1.bin");
    assert_eq!(v1[0], RECORD_VERSION);
    assert_eq!(codec::decode::<Incident>(&v1), Ok(incident_without_cause()));
    let v2 = golden("incident-v2.bin");
    assert_eq!(v2[0], INCIDENT_RECORD_VERSION);
    let got = codec::decode::<Incident>(&v2).unwrap();
    assert_eq!(got, incident());
    let cause = got.cause.unwrap();
    assert_eq!(cause.kind, "one-cpu");
    assert_eq!(cause.summary, "one CPU: cpu 1 has 94 % of slow packets");
    assert_eq!(cause.figures_json, r#"{"cpu":1,"share":0.94}"#);
    assert_eq!(cause.decided_ns, T + 13);
    assert_eq!(
        codec::decode::<PwruRecord>(&golden("pwru-v1.bin")),
        Ok(pwru())
    );
    assert_eq!(
        codec::decode::<IncidentVerdict>(&golden("verdict-v1.bin")),
        Ok(verdict())
    );
    assert_eq!(
        codec::decode::<Vec<u8>>(&golden("baseline-v1.bin")),
        Ok(baseline())
    );
    assert_eq!(
        codec::decode::<Vec<String>>(&golden("meta-moved-aside-v1.bin")),
        Ok(moved_aside())
    );
    assert_eq!(
        codec::decode::<u64>(&golden("meta-counter-v1.bin")),
        Ok(0x0123_4567_89ab_cdef)
    );
    assert_eq!(codec::decode::<u32>(&golden("meta-schema-v1.bin")), Ok(5));

    let no_skb = samples_without_skb();
    assert_eq!(
        chunk::decode(&golden("sample-v1.bin")),
        Ok(vec![no_skb[0].clone()])
    );
    assert_eq!(chunk::decode(&golden("sample-chunk-v2.bin")), Ok(no_skb));
    let v3 = golden("sample-chunk-v3.bin");
    assert_eq!(v3[0], SAMPLE_CHUNK_V3);
    assert_eq!(chunk::decode(&v3), Ok(samples_without_wait()));
    let v4 = golden("sample-chunk-v4.bin");
    assert_eq!(v4[0], SAMPLE_CHUNK_V4);
    assert_eq!(chunk::decode(&v4), Ok(samples_without_wait()));
    let v5 = golden("sample-chunk-v5.bin");
    assert_eq!(v5[0], SAMPLE_CHUNK_V5);
    let got = chunk::decode(&v5).unwrap();
    assert_eq!(got, samples_without_queue());
    assert!(got.iter().all(|s| s.rx_queue.is_none()), "{got:?}");
    let v6 = golden("sample-chunk-v6.bin");
    assert_eq!(v6[0], SAMPLE_CHUNK_VERSION);
    let got = chunk::decode(&v6).unwrap();
    assert_eq!(got, samples());
    // The RX queue, field by field: queue 0, none, the highest.
    assert_eq!(got[0].rx_queue, Some(0));
    assert_eq!(got[1].rx_queue, None);
    assert_eq!(got[2].rx_queue, Some(u16::MAX - 1));
    // The reader's wait, field by field: with the CPU's holder, without, none.
    let wait = got[0].reader_wait.unwrap();
    assert_eq!(wait.runq_ns, 1_234_567);
    assert_eq!(wait.off_cpu_ns, 89_000_001);
    let holder = wait.cpu_holder.unwrap();
    assert_eq!(holder.pid, 31337);
    assert_eq!(holder.comm.as_str(), "stress-ng-cpu");
    let wait = got[1].reader_wait.unwrap();
    assert_eq!(wait.runq_ns, 0);
    assert_eq!(wait.off_cpu_ns, u64::MAX);
    assert_eq!(wait.cpu_holder, None);
    assert_eq!(got[2].reader_wait, None);
    for (name, n) in [
        ("sample-v1.bin", 1),
        ("sample-chunk-v2.bin", 3),
        ("sample-chunk-v3.bin", 3),
        ("sample-chunk-v4.bin", 3),
        ("sample-chunk-v5.bin", 3),
        ("sample-chunk-v6.bin", 3),
    ] {
        assert_eq!(chunk::sample_count(&golden(name)), n, "{name}");
        assert_eq!(chunk::is_chunk(&golden(name)), n == 3, "{name}");
        assert!(codec::verify(&golden(name)).is_ok(), "{name}");
    }

    assert_eq!(
        decode_record(T, &golden("history-point-v1.bin")),
        Ok(vec![(T, hist(4))])
    );
    let chunk = golden("history-chunk-v2.bin");
    assert_eq!(chunk[0], HISTORY_CHUNK_VERSION);
    assert_eq!(decode_record(T, &chunk), Ok(history_points()));
    assert_eq!(record_points(&chunk), 3);
}

// ---- encoding: the layouts written today are the golden bytes ----------------------------

/// A compressed (version 4, 5 or 6) chunk's header and its samples' bytes, decompressed:
/// lz4's choice of matches may change with the library without changing what a chunk
/// holds.
fn chunk_plain(value: &[u8]) -> (usize, usize, Vec<u8>) {
    let payload = codec::verify_as(value[0], value).unwrap();
    let ((count, raw_len), block) = postcard::take_from_bytes::<(usize, usize)>(payload).unwrap();
    let raw = lz4_flex::block::decompress(block, raw_len).unwrap();
    (count, raw_len, raw)
}

#[test]
fn todays_encoding_of_the_fixed_values_is_the_golden_bytes() {
    for (name, make) in files() {
        let want = golden(name);
        let got = make();
        if matches!(
            name,
            "sample-chunk-v4.bin" | "sample-chunk-v5.bin" | "sample-chunk-v6.bin"
        ) {
            assert_eq!(got[0], want[0], "{name}");
            assert_eq!(chunk_plain(&got), chunk_plain(&want), "{name}");
        } else {
            assert_eq!(
                got, want,
                "{name}: today's encoding differs from the golden file"
            );
        }
    }
}

// ---- envelope versions --------------------------------------------------------------------

#[test]
fn incidents_are_written_as_version_2_and_read_as_1_or_2_everything_else_stays_1() {
    let v1 = encode_incident_v1();
    let v2 = encode_incident();
    assert_eq!(v2[0], INCIDENT_RECORD_VERSION);
    for other in [
        encode_pwru(),
        encode_verdict(),
        encode_baseline(),
        encode_moved_aside(),
        encode_counter(),
        encode_schema(),
    ] {
        assert_eq!(other[0], RECORD_VERSION);
    }
    // What `db check` and rotation accept of every tree.
    assert!(codec::verify(&v1).is_ok());
    assert!(codec::verify(&v2).is_ok());
    // Another version of an incident record is refused by its version, not misread.
    assert_eq!(
        codec::decode::<Incident>(&envelope(3, &v2[codec::HEADER..])),
        Err(codec::DecodeError::Version(3))
    );
    assert_eq!(
        codec::decode::<PwruRecord>(&v2),
        Err(codec::DecodeError::Version(INCIDENT_RECORD_VERSION))
    );
    // A damaged record of either version is caught by its checksum.
    for good in [v1, v2] {
        let mut bad = good.clone();
        bad[codec::HEADER + 2] ^= 0x10;
        assert_eq!(
            codec::decode::<Incident>(&bad),
            Err(codec::DecodeError::Checksum)
        );
    }
}
