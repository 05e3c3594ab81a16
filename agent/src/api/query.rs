//! The read endpoints' parameters and answers, computed from a [`Store`]: the daemon's API
//! and the CLI's direct database access share them.

use model::Probe;
use serde::{Deserialize, Serialize};
use storage::{
    FlowFilter, IncidentPage, IncidentQuery, IncidentState, PwruRecord, SampleCursor, SampleFilter,
    SamplePage, Store, StoreError,
};

use super::IncidentView;

/// Parameters of `GET /v1/incidents` (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IncidentsParams {
    /// Only incidents still going on at or after this time, ns since the epoch.
    pub since_ns: Option<u64>,
    /// Only this service.
    pub service: Option<String>,
    /// Only this state (`open`, `closed`, `interrupted`).
    pub state: Option<IncidentState>,
    /// Paging: incidents with a smaller id than this.
    pub before_id: Option<u64>,
    /// Page size (0: the maximum).
    pub limit: usize,
}

/// Parameters of `GET /v1/incidents/{id}/samples` (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplesParams {
    /// Only this probe.
    pub probe: Option<Probe>,
    /// Only flows matching this filter (`dport=443 saddr=10.0.0.5`).
    pub flow: Option<String>,
    /// Only samples at least this slow, ns.
    pub min_latency_ns: Option<u64>,
    /// Paging: the previous page's `next.time_ns` ...
    pub after_time_ns: Option<u64>,
    /// ... and `next.seq`.
    pub after_seq: Option<u64>,
    /// Page size (0: the maximum).
    pub limit: usize,
}

/// Parameters of `GET /v1/incidents/{id}/pwru` (all optional).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PwruParams {
    /// Paging: records after this line number.
    pub after_seq: Option<u64>,
    /// Page size (0: the maximum).
    pub limit: usize,
}

/// Why a query failed: the caller's fault (bad parameter, unknown id) or the store's.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A parameter is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// No such incident.
    #[error("no incident {0}")]
    NotFound(u64),
    /// The store failed.
    #[error("{0}")]
    Store(StoreError),
}

impl From<StoreError> for QueryError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchIncident(id) => QueryError::NotFound(id),
            other => QueryError::Store(other),
        }
    }
}

/// A page of incidents, newest first.
pub fn incidents(store: &Store, p: &IncidentsParams) -> Result<IncidentPage, QueryError> {
    Ok(store.incidents(&IncidentQuery {
        since_ns: p.since_ns,
        until_ns: None,
        service: p.service.clone(),
        state: p.state,
        before_id: p.before_id,
        limit: p.limit,
    })?)
}

/// One incident with its sample summary.
pub fn incident(store: &Store, id: u64) -> Result<IncidentView, QueryError> {
    let incident = store.incident(id)?.ok_or(QueryError::NotFound(id))?;
    let summary = store.sample_summary(id, &SampleFilter::default())?;
    Ok(IncidentView { incident, summary })
}

/// A page of an incident's samples.
pub fn samples(store: &Store, id: u64, p: &SamplesParams) -> Result<SamplePage, QueryError> {
    let flow = match &p.flow {
        Some(f) => f
            .parse::<FlowFilter>()
            .map_err(|e| QueryError::BadRequest(format!("flow: {e}")))?,
        None => FlowFilter::default(),
    };
    let after = match (p.after_time_ns, p.after_seq) {
        (Some(time_ns), Some(seq)) => Some(SampleCursor { time_ns, seq }),
        (None, None) => None,
        _ => {
            return Err(QueryError::BadRequest(
                "after_time_ns and after_seq go together".into(),
            ))
        }
    };
    let filter = SampleFilter {
        probe: p.probe,
        flow,
        min_latency_ns: p.min_latency_ns,
        since_ns: None,
        until_ns: None,
    };
    Ok(store.samples(id, &filter, after, p.limit)?)
}

/// A page of an incident's pwru lines.
pub fn pwru(store: &Store, id: u64, p: &PwruParams) -> Result<Vec<PwruRecord>, QueryError> {
    Ok(store.pwru_records(id, p.after_seq, p.limit)?)
}

/// Everything about one incident as one JSON document.
pub fn export(store: &Store, id: u64) -> Result<Vec<u8>, QueryError> {
    let bundle = store.export_incident(id)?;
    serde_json::to_vec_pretty(&bundle)
        .map_err(|e| QueryError::Store(StoreError::Engine(format!("encoding the export: {e}"))))
}
