//! Helpers shared by the storage integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use model::Probe;
use storage::{NewIncident, SampleFilter, Store};

pub const T0: u64 = 1_790_000_000_000_000_000;
pub const SEC: u64 = 1_000_000_000;

pub fn new_incident(service: &str, opened_ns: u64) -> NewIncident {
    NewIncident {
        service: service.to_string(),
        probes: vec![Probe::TcpSocketRead],
        opened_ns,
        evidence_json: r#"{"quantile":0.99,"observed_ns":21000000}"#.to_string(),
        stages_json: r#"{"stage":"application-read"}"#.to_string(),
    }
}

/// Samples stored for incident `id`.
#[allow(clippy::unwrap_used)] // a test helper: a failed read fails the test
pub fn sample_count(s: &Store, id: u64) -> u64 {
    s.sample_summary(id, &SampleFilter::default())
        .unwrap()
        .count
}
