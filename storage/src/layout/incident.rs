//! Frozen layouts of the incidents tree (envelope version 2, [`IncidentV2`]; version 1,
//! [`IncidentV1`], still read), the pwru tree and the verdicts in the meta tree (envelope
//! version 1). Never edited: a change is a new type and envelope version.

use serde::{Deserialize, Serialize};

use super::common::{FlowV1, ProbeV1};
use crate::codec::{self, DecodeError, Record, INCIDENT_RECORD_VERSION, RECORD_VERSION};
use crate::model::{
    CaptureState, CaptureStatus, Incident, IncidentCause, IncidentCounters, IncidentState,
    IncidentVerdict, PwruRecord, PwruState, PwruStatus,
};
use model::Verdict;

/// [`IncidentState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum IncidentStateV1 {
    Open,
    Closed,
    Interrupted,
}

/// [`CaptureState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum CaptureStateV1 {
    NotArmed,
    Armed,
    Disarmed,
    Failed,
}

/// [`CaptureStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CaptureStatusV1 {
    state: CaptureStateV1,
    emitted: u64,
    dropped: u64,
    rate_limited: u64,
    stored: u64,
    pre_trigger: u64,
    message: String,
}

/// [`PwruState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum PwruStateV1 {
    NotRun,
    Running,
    Done,
    Failed,
}

/// [`PwruStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PwruStatusV1 {
    state: PwruStateV1,
    exit_status: Option<i32>,
    signal: Option<i32>,
    stderr_tail: String,
    started_ns: Option<u64>,
    ended_ns: Option<u64>,
    lines_stored: u64,
    message: String,
}

/// [`IncidentCounters`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IncidentCountersV1 {
    intervals: u64,
    store_errors: u64,
}

/// [`Incident`]: the incidents tree's records before causes (envelope version 1); the
/// fields [`IncidentV2`] starts with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IncidentV1 {
    id: u64,
    service: String,
    probes: Vec<ProbeV1>,
    opened_ns: u64,
    closed_ns: Option<u64>,
    state: IncidentStateV1,
    evidence_json: String,
    stages_json: String,
    capture: CaptureStatusV1,
    pwru: PwruStatusV1,
    counters: IncidentCountersV1,
}

/// [`IncidentCause`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IncidentCauseV1 {
    kind: String,
    summary: String,
    figures_json: String,
    decided_ns: u64,
}

/// [`Incident`]: the incidents tree's records since incidents carry the daemon's cause
/// verdict (envelope version 2): [`IncidentV1`]'s fields, then the cause. postcard writes
/// the nested [`IncidentV1`]'s fields in place, so the bytes are those of the same fields
/// written one by one (the golden files pin them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IncidentV2 {
    v1: IncidentV1,
    cause: Option<IncidentCauseV1>,
}

impl Record for Incident {
    type Frozen = IncidentV2;
    const VERSION: u8 = INCIDENT_RECORD_VERSION;

    fn freeze(&self) -> IncidentV2 {
        // Destructured, here and below: a field added to a live type is a compile error
        // until it has a place in a (new) frozen layout.
        let Incident {
            id,
            service,
            probes,
            opened_ns,
            closed_ns,
            state,
            evidence_json,
            stages_json,
            capture,
            pwru,
            counters,
            cause,
        } = self;
        IncidentV2 {
            v1: IncidentV1 {
                id: *id,
                service: service.clone(),
                probes: probes.iter().map(|&p| p.into()).collect(),
                opened_ns: *opened_ns,
                closed_ns: *closed_ns,
                state: (*state).into(),
                evidence_json: evidence_json.clone(),
                stages_json: stages_json.clone(),
                capture: freeze_capture(capture),
                pwru: freeze_pwru(pwru),
                counters: freeze_counters(counters),
            },
            cause: cause.as_ref().map(freeze_cause),
        }
    }

    fn thaw(f: IncidentV2) -> Result<Incident, String> {
        Ok(f.v1.thaw(f.cause.map(thaw_cause)))
    }

    /// Version 1 records: [`IncidentV1`], written before causes (`cause: None`).
    fn decode_older(version: u8, bytes: &[u8]) -> Result<Incident, DecodeError> {
        match version {
            RECORD_VERSION => Ok(codec::decode_as::<IncidentV1>(RECORD_VERSION, bytes)?.into()),
            v => Err(DecodeError::Version(v)),
        }
    }
}

impl IncidentV1 {
    /// The live incident of these fields and of `cause`, which a later layout adds.
    fn thaw(self, cause: Option<IncidentCause>) -> Incident {
        Incident {
            id: self.id,
            service: self.service,
            probes: self.probes.into_iter().map(Into::into).collect(),
            opened_ns: self.opened_ns,
            closed_ns: self.closed_ns,
            state: self.state.into(),
            evidence_json: self.evidence_json,
            stages_json: self.stages_json,
            capture: thaw_capture(self.capture),
            pwru: thaw_pwru(self.pwru),
            counters: thaw_counters(self.counters),
            cause,
        }
    }
}

/// A record of the layout before causes: not decided (`None`).
impl From<IncidentV1> for Incident {
    fn from(f: IncidentV1) -> Incident {
        f.thaw(None)
    }
}

same_variants!(IncidentState <-> IncidentStateV1 { Open, Closed, Interrupted });
same_variants!(CaptureState <-> CaptureStateV1 { NotArmed, Armed, Disarmed, Failed });
same_variants!(PwruState <-> PwruStateV1 { NotRun, Running, Done, Failed });
same_variants!(Verdict <-> VerdictV1 { Real, FalseAlarm, Expected });

fn freeze_capture(capture: &CaptureStatus) -> CaptureStatusV1 {
    let CaptureStatus {
        state,
        emitted,
        dropped,
        rate_limited,
        stored,
        pre_trigger,
        message,
    } = capture;
    CaptureStatusV1 {
        state: (*state).into(),
        emitted: *emitted,
        dropped: *dropped,
        rate_limited: *rate_limited,
        stored: *stored,
        pre_trigger: *pre_trigger,
        message: message.clone(),
    }
}

fn thaw_capture(c: CaptureStatusV1) -> CaptureStatus {
    CaptureStatus {
        state: c.state.into(),
        emitted: c.emitted,
        dropped: c.dropped,
        rate_limited: c.rate_limited,
        stored: c.stored,
        pre_trigger: c.pre_trigger,
        message: c.message,
    }
}

fn freeze_pwru(pwru: &PwruStatus) -> PwruStatusV1 {
    let PwruStatus {
        state,
        exit_status,
        signal,
        stderr_tail,
        started_ns,
        ended_ns,
        lines_stored,
        message,
    } = pwru;
    PwruStatusV1 {
        state: (*state).into(),
        exit_status: *exit_status,
        signal: *signal,
        stderr_tail: stderr_tail.clone(),
        started_ns: *started_ns,
        ended_ns: *ended_ns,
        lines_stored: *lines_stored,
        message: message.clone(),
    }
}

fn thaw_pwru(p: PwruStatusV1) -> PwruStatus {
    PwruStatus {
        state: p.state.into(),
        exit_status: p.exit_status,
        signal: p.signal,
        stderr_tail: p.stderr_tail,
        started_ns: p.started_ns,
        ended_ns: p.ended_ns,
        lines_stored: p.lines_stored,
        message: p.message,
    }
}

fn freeze_counters(counters: &IncidentCounters) -> IncidentCountersV1 {
    let IncidentCounters {
        intervals,
        store_errors,
    } = counters;
    IncidentCountersV1 {
        intervals: *intervals,
        store_errors: *store_errors,
    }
}

fn thaw_counters(c: IncidentCountersV1) -> IncidentCounters {
    IncidentCounters {
        intervals: c.intervals,
        store_errors: c.store_errors,
    }
}

fn freeze_cause(cause: &IncidentCause) -> IncidentCauseV1 {
    let IncidentCause {
        kind,
        summary,
        figures_json,
        decided_ns,
    } = cause;
    IncidentCauseV1 {
        kind: kind.clone(),
        summary: summary.clone(),
        figures_json: figures_json.clone(),
        decided_ns: *decided_ns,
    }
}

fn thaw_cause(c: IncidentCauseV1) -> IncidentCause {
    IncidentCause {
        kind: c.kind,
        summary: c.summary,
        figures_json: c.figures_json,
        decided_ns: c.decided_ns,
    }
}

/// [`PwruRecord`]: the pwru tree's records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PwruRecordV1 {
    incident: u64,
    seq: u64,
    received_ns: u64,
    pwru_time_ns: Option<u64>,
    func: String,
    skb: u64,
    flow: Option<FlowV1>,
    raw: String,
}

impl Record for PwruRecord {
    type Frozen = PwruRecordV1;

    fn freeze(&self) -> PwruRecordV1 {
        let PwruRecord {
            incident,
            seq,
            received_ns,
            pwru_time_ns,
            func,
            skb,
            flow,
            raw,
        } = self;
        PwruRecordV1 {
            incident: *incident,
            seq: *seq,
            received_ns: *received_ns,
            pwru_time_ns: *pwru_time_ns,
            func: func.clone(),
            skb: *skb,
            flow: flow.map(Into::into),
            raw: raw.clone(),
        }
    }

    fn thaw(f: PwruRecordV1) -> Result<PwruRecord, String> {
        Ok(PwruRecord {
            incident: f.incident,
            seq: f.seq,
            received_ns: f.received_ns,
            pwru_time_ns: f.pwru_time_ns,
            func: f.func,
            skb: f.skb,
            flow: f.flow.map(Into::into),
            raw: f.raw,
        })
    }
}

/// [`Verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum VerdictV1 {
    Real,
    FalseAlarm,
    Expected,
}

/// [`IncidentVerdict`]: `verdict/ | id` records of the meta tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IncidentVerdictV1 {
    verdict: VerdictV1,
    note: String,
    marked_ns: u64,
}

impl Record for IncidentVerdict {
    type Frozen = IncidentVerdictV1;

    fn freeze(&self) -> IncidentVerdictV1 {
        let IncidentVerdict {
            verdict,
            note,
            marked_ns,
        } = self;
        IncidentVerdictV1 {
            verdict: (*verdict).into(),
            note: note.clone(),
            marked_ns: *marked_ns,
        }
    }

    fn thaw(f: IncidentVerdictV1) -> Result<IncidentVerdict, String> {
        Ok(IncidentVerdict {
            verdict: f.verdict.into(),
            note: f.note,
            marked_ns: f.marked_ns,
        })
    }
}
