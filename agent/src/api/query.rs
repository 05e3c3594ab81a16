//! The read endpoints' parameters and answers, computed from a [`Store`]: the daemon's API
//! and the CLI's direct database access share them.

use model::Probe;
use serde::{Deserialize, Serialize};
use storage::{
    FlowFilter, IncidentQuery, IncidentState, PwruRecord, SampleCursor, SampleFilter, SamplePage,
    Store, StoreError,
};

use std::time::Duration;

use model::Verdict;
use storage::IncidentVerdict;

pub use super::query_error::QueryError;
use super::timelines::{join_timelines, JoinedSample, TimelineSummary};
use super::{ExportAnswer, HistoryAnswer, IncidentList, IncidentView, ProbeHistory};

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
    /// ... and `next.seq` ...
    pub after_seq: Option<u64>,
    /// ... and, slowest first, `next.latency_ns`.
    pub after_latency_ns: Option<u64>,
    /// Page size (0: the maximum).
    pub limit: usize,
    /// `time` (the default: oldest first) or `slowest` (slowest first).
    pub order: SampleOrder,
    /// Only samples with a pwru timeline: the join runs over a whole page (the maximum),
    /// then the first `limit` with a timeline are kept.
    pub with_timeline: bool,
}

/// The answer of `GET /v1/incidents/{id}/samples`: a page of samples, each with its pwru
/// timeline, and how many of them got one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplesAnswer {
    /// The samples.
    pub samples: Vec<JoinedSample>,
    /// Pass as `after_*` for the next page; `None` when this was the last.
    pub next: Option<SampleCursor>,
    /// The join with the stored pwru lines.
    pub pwru_timelines: TimelineSummary,
}

/// The order of a samples page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleOrder {
    /// Oldest first.
    #[default]
    Time,
    /// Slowest first; equal latencies oldest first.
    Slowest,
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

/// A page of incidents, newest first.
pub fn incidents(store: &Store, p: &IncidentsParams) -> Result<IncidentList, QueryError> {
    Ok(IncidentList::from(store.incidents(&IncidentQuery {
        since_ns: p.since_ns,
        until_ns: None,
        service: p.service.clone(),
        state: p.state,
        before_id: p.before_id,
        limit: p.limit,
    })?))
}

/// One incident with its sample summary.
pub fn incident(store: &Store, id: u64) -> Result<IncidentView, QueryError> {
    let incident = store.incident(id)?.ok_or(QueryError::NotFound(id))?;
    let summary = store.sample_summary(id, &SampleFilter::default())?;
    let verdict = store.verdict(id)?;
    Ok(IncidentView {
        incident: incident.into(),
        summary,
        verdict,
    })
}

/// A page of an incident's samples joined with the pwru lines that traced their packets.
pub fn samples(store: &Store, id: u64, p: &SamplesParams) -> Result<SamplesAnswer, QueryError> {
    let limit = if p.with_timeline { 0 } else { p.limit };
    let page = sample_page(store, id, &SamplesParams { limit, ..p.clone() })?;
    let (joined, pwru_timelines) = join_timelines(store, id, &page.samples)?;
    let mut samples: Vec<JoinedSample> = page
        .samples
        .into_iter()
        .zip(joined)
        .map(|(sample, pwru_timeline)| JoinedSample {
            sample,
            pwru_timeline,
        })
        .collect();
    if p.with_timeline {
        samples.retain(|s| s.pwru_timeline.is_some());
        samples.truncate(if p.limit == 0 { usize::MAX } else { p.limit });
    }
    Ok(SamplesAnswer {
        samples,
        next: page.next,
        pwru_timelines,
    })
}

fn sample_page(store: &Store, id: u64, p: &SamplesParams) -> Result<SamplePage, QueryError> {
    let flow = match &p.flow {
        Some(f) => f
            .parse::<FlowFilter>()
            .map_err(|e| QueryError::BadRequest(format!("flow: {e}")))?,
        None => FlowFilter::default(),
    };
    let after = match (p.order, p.after_time_ns, p.after_seq, p.after_latency_ns) {
        (_, None, None, None) => None,
        (SampleOrder::Time, Some(time_ns), Some(seq), None) => Some(SampleCursor {
            time_ns,
            seq,
            latency_ns: None,
        }),
        (SampleOrder::Slowest, time_ns, Some(seq), Some(latency_ns)) => Some(SampleCursor {
            time_ns: time_ns.unwrap_or(0),
            seq,
            latency_ns: Some(latency_ns),
        }),
        (SampleOrder::Time, ..) => {
            return Err(QueryError::BadRequest(
                "in time order, after_time_ns and after_seq go together (no after_latency_ns)"
                    .into(),
            ))
        }
        (SampleOrder::Slowest, ..) => {
            return Err(QueryError::BadRequest(
                "slowest first, after_latency_ns and after_seq go together".into(),
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
    Ok(match p.order {
        SampleOrder::Time => store.samples(id, &filter, after, p.limit)?,
        SampleOrder::Slowest => store.slowest_samples(id, &filter, after, p.limit)?,
    })
}

/// A page of an incident's pwru lines.
pub fn pwru(store: &Store, id: u64, p: &PwruParams) -> Result<Vec<PwruRecord>, QueryError> {
    Ok(store.pwru_records(id, p.after_seq, p.limit)?)
}

/// Everything about one incident as one JSON document.
pub fn export(store: &Store, id: u64) -> Result<Vec<u8>, QueryError> {
    let bundle = ExportAnswer::from(store.export_incident(id)?);
    serde_json::to_vec_pretty(&bundle)
        .map_err(|e| QueryError::Store(StoreError::Engine(format!("encoding the export: {e}"))))
}

/// Parameters of `GET /v1/history`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryParams {
    /// The service (required).
    pub service: String,
    /// Only this probe (default: every probe with history).
    pub probe: Option<Probe>,
    /// Start of the range, ns since the epoch (inclusive).
    pub from_ns: u64,
    /// End of the range, ns since the epoch (inclusive; 0: now).
    pub to_ns: u64,
    /// Resolution, ms: one of the stored levels (default: the finest whose retention
    /// reaches `from_ns`).
    pub resolution_ms: Option<u64>,
}

/// Parameters of `POST /v1/incidents/{id}/verdict`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkParams {
    /// `real`, `false-alarm` or `expected`.
    pub verdict: Verdict,
    /// Free text.
    #[serde(default)]
    pub note: String,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One service's history, every probe (or one), at one resolution.
pub fn history(store: &Store, p: &HistoryParams, now_ns: u64) -> Result<HistoryAnswer, QueryError> {
    let plan = history_plan(store, p, now_ns)?;
    let mut series = Vec::new();
    let mut resolution = Duration::ZERO;
    for probe in plan.probes {
        let s = store.history_at_level(plan.level, &p.service, probe, p.from_ns, plan.to_ns)?;
        resolution = s.resolution;
        if !s.points.is_empty() {
            series.push(ProbeHistory {
                probe,
                points: s.points,
            });
        }
    }
    Ok(HistoryAnswer {
        service: p.service.clone(),
        resolution,
        from_ns: p.from_ns,
        to_ns: plan.to_ns,
        series,
    })
}

/// What a history read of `p` covers: checked, before any point is read.
pub struct HistoryPlan {
    /// Index of the history level read (finest first).
    pub level: usize,
    /// The service's probes with history at that level, in probe order.
    pub probes: Vec<Probe>,
    /// End of the range (`p.to_ns`, or now when 0).
    pub to_ns: u64,
}

/// The level and probes [`history`] reads for `p`, or why it cannot (`tailtrap tune`
/// reads the same points its own way).
pub fn history_plan(
    store: &Store,
    p: &HistoryParams,
    now_ns: u64,
) -> Result<HistoryPlan, QueryError> {
    let to_ns = if p.to_ns == 0 { now_ns } else { p.to_ns };
    if p.service.is_empty() {
        return Err(QueryError::BadRequest("service is required".into()));
    }
    if p.from_ns >= to_ns {
        return Err(QueryError::BadRequest(format!(
            "empty time range: from {} is not before to {}",
            crate::output::fmt_time(p.from_ns),
            crate::output::fmt_time(to_ns)
        )));
    }
    let levels = &store.config().history;
    let level = match p.resolution_ms {
        Some(ms) => levels
            .iter()
            .position(|l| l.resolution == Duration::from_millis(ms))
            .ok_or_else(|| {
                let have: Vec<String> = levels
                    .iter()
                    .map(|l| humantime::format_duration(l.resolution).to_string())
                    .collect();
                QueryError::BadRequest(format!(
                    "no history is kept at a resolution of {} (kept: {})",
                    humantime::format_duration(Duration::from_millis(ms)),
                    have.join(", ")
                ))
            })?,
        None => levels
            .iter()
            .position(|l| now_ns.saturating_sub(nanos(l.keep)) <= p.from_ns)
            .unwrap_or(levels.len().saturating_sub(1)),
    };
    let streams = store.history_streams_at(level)?;
    if streams.is_empty() {
        return Err(QueryError::Missing(
            "the database holds no histogram history at that resolution (the daemon records it every interval)".into(),
        ));
    }
    let mut probes: Vec<Probe> = streams
        .iter()
        .filter(|(s, _)| *s == p.service)
        .map(|&(_, probe)| probe)
        .filter(|probe| p.probe.is_none_or(|want| want == *probe))
        .collect();
    probes.sort();
    if probes.is_empty() {
        let mut services: Vec<&str> = streams.iter().map(|(s, _)| s.as_str()).collect();
        services.dedup();
        let what = match p.probe {
            Some(probe) => format!("service {:?} probe {probe}", p.service),
            None => format!("service {:?}", p.service),
        };
        return Err(QueryError::Missing(format!(
            "no history for {what} (services with history: {})",
            services.join(", ")
        )));
    }
    Ok(HistoryPlan {
        level,
        probes,
        to_ns,
    })
}

/// Store the operator's verdict on incident `id`.
pub fn mark(
    store: &Store,
    id: u64,
    p: &MarkParams,
    now_ns: u64,
) -> Result<IncidentVerdict, QueryError> {
    if p.note.len() > storage::MAX_NOTE_BYTES {
        return Err(QueryError::BadRequest(format!(
            "the note is {} bytes; at most {} are kept",
            p.note.len(),
            storage::MAX_NOTE_BYTES
        )));
    }
    let v = IncidentVerdict {
        verdict: p.verdict,
        note: p.note.clone(),
        marked_ns: now_ns,
    };
    store.mark_incident(id, &v)?;
    Ok(v)
}
