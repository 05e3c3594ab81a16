//! Golden baselines: `detector/tests/golden/baseline-v*.bin` hold the bytes of a saved
//! baseline of every format version ever written ([`Baseline::to_bytes`]: a version byte,
//! then postcard), made from the fixed value below. The daemon stores these bytes and
//! hands them back after an upgrade: these tests decode each with today's code and check
//! every field, and check that today's encoding of the fixed value is the newest file's
//! bytes. A field added to a saved type fails them until a new frozen version is added
//! (docs/storage.md, "Changing a stored type").
//!
//! Written by `TAILTRAP_WRITE_GOLDEN=1 cargo test -p detector --lib -- --ignored
//! write_golden_baselines`, only ever for a file that does not exist yet: a format once
//! written stays as its file says.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use model::hist::{bucket_lower, NUM_BUCKETS};

use super::Baseline;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn golden(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---- the fixed value: every field set, none to its default -------------------------------

/// Non-zero weights by bucket, in bucket order: a decayed fraction, a weight too small to
/// print and a large one, spanning buckets 3 to 250 (the span is not the whole range).
const WEIGHTS: [(usize, f64); 5] = [
    (3, 0.5),
    (17, 0.1),
    (131, 1234.25),
    (200, 1e-300),
    (250, 7.0e15),
];

/// Times as stored (f64 seconds), chosen to come back to the nanosecond.
fn first_seen() -> SystemTime {
    UNIX_EPOCH + Duration::new(1_790_000_000, 250_000_000)
}

fn last_update() -> SystemTime {
    UNIX_EPOCH + Duration::new(1_790_003_600, 500_000_000)
}

fn weights() -> Box<[f64; NUM_BUCKETS]> {
    let mut w = Box::new([0.0; NUM_BUCKETS]);
    for (i, v) in WEIGHTS {
        w[i] = v;
    }
    w
}

/// The total a restore computes: the weights added in bucket order.
fn total() -> f64 {
    0.5 + 0.1 + 1234.25 + 1e-300 + 7.0e15
}

fn baseline() -> Baseline {
    Baseline {
        weights: weights(),
        total: total(),
        span: (3, 251),
        first_seen: first_seen(),
        last_update: last_update(),
    }
}

/// Makes a golden file's bytes.
type Make = fn() -> Vec<u8>;

/// Every golden file and how it is made.
fn files() -> Vec<(&'static str, Make)> {
    vec![("baseline-v1.bin", || baseline().to_bytes())]
}

#[test]
#[ignore = "writes golden files; TAILTRAP_WRITE_GOLDEN=1 to run"]
fn write_golden_baselines() {
    model::fixtures::write_missing_golden(&dir(), &files());
}

#[test]
fn golden_baselines_decode_to_their_values() {
    let b = Baseline::from_bytes(&golden("baseline-v1.bin")).unwrap();
    let Baseline {
        weights: w,
        total: t,
        span,
        first_seen: first,
        last_update: last,
    } = b;
    // Bit for bit, every bucket (the empty ones 0).
    let bits = |w: &[f64]| w.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&w[..]), bits(&weights()[..]));
    assert_eq!(t.to_bits(), total().to_bits());
    assert_eq!(span, (3, 251));
    assert_eq!(first, first_seen());
    assert_eq!(last, last_update());
    // A weight's bucket index means these latencies: a changed bucket scheme would give
    // every saved baseline another meaning without failing to decode.
    let lower: Vec<u64> = WEIGHTS.iter().map(|&(i, _)| bucket_lower(i)).collect();
    assert_eq!(lower, [3, 18, 360_448, 134_217_728, 10_737_418_240]);
}

#[test]
fn todays_encoding_of_the_fixed_value_is_the_golden_bytes() {
    for (name, make) in files() {
        assert_eq!(
            make(),
            golden(name),
            "{name}: today's encoding differs from the golden file"
        );
    }
}
