//! Samples joined with the pwru lines that traced their packets: part of the samples
//! answer, so the API, the CLI's `--json` and the CLI's tables show the same join.

use capture::pwru::{
    clock_offset, wall_minus_mono_ns, ClockOffset, Passes, SampleKey, Timeline, TracePoint,
};
use model::Sample;
use serde::{Deserialize, Serialize};
use storage::{IncidentQuery, PwruRecord, Store};

use super::query_error::QueryError;
use crate::output::fmt_time;

/// A sample and, when pwru traced its packet, the packet's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinedSample {
    /// The sample, its fields at the top level of the object.
    #[serde(flatten)]
    pub sample: Sample,
    /// The pwru events of its packet from its arrival to the probe (`null`: none).
    pub pwru_timeline: Option<Timeline>,
}

/// How many samples of the answer got a timeline, and why the others did not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineSummary {
    /// Samples joined (before the `with_timeline` filter).
    pub samples: usize,
    /// Of those, samples with a timeline.
    pub with_timeline: usize,
    /// The operator's sentence.
    pub note: String,
}

/// Each sample's pwru timeline and the summary: the join with the pwru lines of the
/// incident's session and of overlapping sessions of its service.
pub(crate) fn join_timelines(
    store: &Store,
    id: u64,
    samples: &[Sample],
) -> Result<(Vec<Option<Timeline>>, TimelineSummary), QueryError> {
    let lines = session_lines(store, id, samples)?;
    let offset = clock_offset(
        lines
            .iter()
            .filter_map(|r| Some((r.received_ns, r.pwru_time_ns?))),
        wall_minus_mono_ns(),
    );
    let joined = join(samples, &lines, offset);
    let with_timeline = joined.iter().filter(|t| t.is_some()).count();
    let summary = TimelineSummary {
        samples: samples.len(),
        with_timeline,
        note: timeline_note(with_timeline, samples.len(), &lines, offset),
    };
    Ok((joined, summary))
}

/// Every stored pwru line of incident `id`, page by page.
fn all_pwru_lines(store: &Store, id: u64) -> Result<Vec<PwruRecord>, QueryError> {
    let mut out: Vec<PwruRecord> = Vec::new();
    loop {
        let page = store.pwru_records(id, out.last().map(|r| r.seq), 0)?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

/// The pwru lines that may hold the samples' packets: the incident's own session's, and
/// those of the service's other incidents whose session ran while these samples were
/// taken (an incident that closes and reopens while one session runs gets no session of
/// its own, skipped for the service's cooldown; that session traced its packets all the
/// same).
fn session_lines(
    store: &Store,
    id: u64,
    samples: &[Sample],
) -> Result<Vec<PwruRecord>, QueryError> {
    let mut lines = all_pwru_lines(store, id)?;
    let (Some(first), Some(last)) = (
        samples.iter().map(|s| s.time_ns).min(),
        samples.iter().map(|s| s.time_ns).max(),
    ) else {
        return Ok(lines);
    };
    let Some(incident) = store.incident(id)? else {
        return Ok(lines);
    };
    let others = store.incidents(&IncidentQuery {
        service: Some(incident.service),
        ..IncidentQuery::default()
    })?;
    for other in others.incidents {
        let p = &other.pwru;
        let overlaps = match (p.started_ns, p.ended_ns) {
            (Some(a), Some(b)) => a <= last && b >= first,
            (Some(a), None) => a <= last,
            _ => false,
        };
        if other.id != id && p.lines_stored > 0 && overlaps {
            lines.extend(all_pwru_lines(store, other.id)?);
        }
    }
    Ok(lines)
}

/// Each sample's pwru timeline, when its packet is among the traced ones.
fn join(
    samples: &[Sample],
    lines: &[PwruRecord],
    offset: Option<ClockOffset>,
) -> Vec<Option<Timeline>> {
    let passes = Passes::new(lines.iter().filter_map(|r| {
        Some(TracePoint {
            mono_ns: r.pwru_time_ns?,
            skb: r.skb,
            flow: r.flow,
            func: r.func.clone(),
        })
    }));
    samples
        .iter()
        .map(|s| {
            let key = SampleKey {
                flow: s.flow,
                time_ns: s.time_ns,
                latency_ns: s.latency_ns,
                skb: s.skb,
            };
            offset.and_then(|o| passes.timeline(&key, o.ns()))
        })
        .collect()
}

/// How many samples got a timeline, and why the others did not.
fn timeline_note(
    with: usize,
    of: usize,
    lines: &[PwruRecord],
    offset: Option<ClockOffset>,
) -> String {
    if lines.is_empty() {
        return "pwru timelines: none (no pwru lines stored for this incident)".to_owned();
    }
    let first = lines
        .iter()
        .find_map(|r| r.pwru_time_ns.map(|_| r.received_ns));
    let last = lines
        .iter()
        .rev()
        .find_map(|r| r.pwru_time_ns.map(|_| r.received_ns));
    let span = match (first, last) {
        (Some(a), Some(b)) => format!(" (pwru events from {} to {})", fmt_time(a), fmt_time(b)),
        _ => String::new(),
    };
    let clock = clock_remark(offset);
    format!(
        "pwru timelines: {with} of {of} samples; a sample gets one when pwru traced its \
         packet (its skb address, else its flow) with a first event between the packet's arrival \
         and the probe{span}. \
         Samples taken before the session attached or after it ended have none.{clock}"
    )
}

/// What the note says about the clock offset when it is not the one read now.
fn clock_remark(offset: Option<ClockOffset>) -> &'static str {
    match offset {
        Some(ClockOffset::FromLines(_)) => {
            " The session ran in an earlier boot (or before a clock step): pwru's times were \
             placed on the wall clock by the lines' arrival, so they may be late by up to the \
             fastest line's delivery (usually milliseconds)."
        }
        Some(ClockOffset::Now(_)) => "",
        None => " The clocks could not be read: no timelines.",
    }
}
