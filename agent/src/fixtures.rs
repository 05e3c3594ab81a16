//! Records the unit tests of several modules build.

use model::Probe;
use storage::{CaptureStatus, Incident, IncidentCounters, IncidentState, PwruStatus};

/// Incident `id` of `web` as stored once closed: nothing captured, no pwru, no cause.
pub fn closed_incident(id: u64, probes: Vec<Probe>, opened_ns: u64, closed_ns: u64) -> Incident {
    Incident {
        id,
        service: "web".into(),
        probes,
        opened_ns,
        closed_ns: Some(closed_ns),
        state: IncidentState::Closed,
        evidence_json: String::new(),
        stages_json: String::new(),
        capture: CaptureStatus::default(),
        pwru: PwruStatus::default(),
        counters: IncidentCounters::default(),
        cause: None,
    }
}
