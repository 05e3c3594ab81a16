//! Property tests of the replay input (`tailtrap replay` reads these lines from files users
//! hand it): any line gives a record or an error, never a panic or a hang, and whatever parses
//! can be fed to the detector in any order without a panic.
//!
//! The case budget is small in CI; `tests/fuzz/run.sh` runs the same properties with
//! `TAILTRAP_FUZZ_CASES` set high.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::{Duration, Instant};

use detector::replay::{Record, Replayer};
use detector::{Detector, DetectorConfig};
use model::fixtures::fuzz_config;
use proptest::prelude::*;

/// One parse may take this long before it counts as a hang: generous, as the long fuzz runs
/// niced beside builds and a starved case once took 3 s of wall time.
const HANG: Duration = Duration::from_secs(10);

const VALID: &str = r#"{"ts":"2026-11-20T10:00:00Z","service":"web","probe":"tcp-socket-read","interval_ms":1000,"buckets":[[3,5],[40,2]],"count":7,"sum_ns":123456}"#;

/// A replay line that is almost right: valid JSON with hostile values.
fn line() -> impl Strategy<Value = String> {
    let ts = prop_oneof![
        Just("2026-11-20T10:00:00Z".to_string()),
        Just("1969-12-31T23:59:59+23:59".to_string()),
        Just("9999-12-31T23:59:59-23:59".to_string()),
        "[0-9:TZ+.-]{0,40}",
        ".{0,12}",
    ];
    let probe = prop_oneof![
        Just("tcp-socket-read".to_string()),
        Just("ip-start".to_string()),
        "[a-z-]{0,20}",
    ];
    let buckets = prop::collection::vec((any::<u64>(), any::<u64>()), 0..8);
    let small = prop::collection::vec((0u64..300, 0u64..1000), 0..8);
    (
        ts,
        ".{0,20}",
        probe,
        any::<u64>(),
        prop_oneof![buckets, small],
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(ts, service, probe, interval_ms, buckets, count, sum_ns)| {
                let count = if count % 2 == 0 {
                    buckets.iter().fold(0u64, |a, (_, c)| a.wrapping_add(*c))
                } else {
                    count
                };
                serde_json::json!({
                    "ts": ts, "service": service, "probe": probe, "interval_ms": interval_ms,
                    "buckets": buckets, "count": count, "sum_ns": sum_ns,
                })
                .to_string()
            },
        )
}

/// A valid line with some bytes replaced, cut, or repeated.
fn mutated() -> impl Strategy<Value = String> {
    (
        prop::collection::vec((0..VALID.len(), any::<u8>()), 0..6),
        0..=VALID.len(),
        0usize..4,
    )
        .prop_map(|(flips, cut, repeat)| {
            let mut b = VALID.as_bytes().to_vec();
            for (i, v) in flips {
                b[i] = v;
            }
            b.truncate(cut.max(1));
            let s = String::from_utf8_lossy(&b).into_owned();
            s.repeat(repeat.max(1))
        })
}

fn parse_in_time(text: &str) -> Option<Record> {
    let start = Instant::now();
    let r = Record::parse(text);
    assert!(start.elapsed() < HANG, "parsing took {:?}", start.elapsed());
    r.ok()
}

/// Found by these properties: a negative offset carried 9999-12-31 past year 9999, which
/// parsed but panicked when printed back.
#[test]
fn a_time_past_year_9999_is_refused() {
    let line = VALID.replace("2026-11-20T10:00:00Z", "9999-12-31T23:59:59-23:59");
    let e = Record::parse(&line).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("after 9999"), "{e}");
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn fuzz_replay_arbitrary_text_is_refused_or_parsed(text in ".{0,300}") {
        parse_in_time(&text);
    }

    #[test]
    fn fuzz_replay_mutated_lines_never_panic(text in mutated()) {
        parse_in_time(&text);
    }

    #[test]
    fn fuzz_replay_hostile_values_feed_the_detector(lines in prop::collection::vec(line(), 1..12)) {
        let mut replayer = Replayer::new(Detector::new(DetectorConfig::default()));
        for text in &lines {
            if let Some(rec) = parse_in_time(text) {
                // Out of order and duplicates are errors; anything else is observed.
                let _ = replayer.push(&rec);
                // A parsed record prints back to a line that parses to the same record.
                let again = Record::parse(&rec.to_json_line()).unwrap();
                prop_assert_eq!(again.to_json_line(), rec.to_json_line());
            }
        }
        let _ = replayer.finish();
    }
}
