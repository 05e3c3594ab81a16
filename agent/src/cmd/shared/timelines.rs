//! Samples joined with the pwru lines that traced their packets (`samples`, `incidents
//! show`).

use capture::pwru::{
    clock_offset, wall_minus_mono_ns, ClockOffset, Passes, SampleKey, Timeline, TracePoint,
};
use storage::PwruRecord;

use crate::api::query::{IncidentsParams, PwruParams};
use crate::output::{fmt_ns, fmt_time, table};
use crate::source::Source;

/// Timelines printed under the samples table (the slowest samples first).
pub(crate) const TIMELINES_SHOWN: usize = 3;

/// The timelines of the slowest joined samples, each under a line naming its sample
/// (`name` gets the sample's index).
pub(crate) fn print_slowest_timelines(
    samples: &[model::Sample],
    joined: &[Option<Timeline>],
    name: impl Fn(usize) -> String,
) {
    for (i, timeline) in slowest_joined(samples, joined) {
        let s = &samples[i];
        println!(
            "\n{} ({}, {} at {}), skb {:#x}:",
            name(i),
            s.flow,
            fmt_ns(s.latency_ns as f64),
            s.probe,
            timeline.skb
        );
        let mut t = table(["since arrival", "function", "time"]);
        for step in &timeline.steps {
            t.add_row([
                format!("{:+.3} ms", step.since_arrival_ns as f64 / 1e6),
                step.func.clone(),
                fmt_time(step.time_ns),
            ]);
        }
        println!("{t}");
    }
}

/// Indices and timelines of the slowest joined samples, slowest first (at most
/// [`TIMELINES_SHOWN`]).
pub(crate) fn slowest_joined<'a>(
    samples: &[model::Sample],
    joined: &'a [Option<Timeline>],
) -> Vec<(usize, &'a Timeline)> {
    let mut shown: Vec<(usize, &Timeline, u64)> = joined
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.as_ref().map(|t| (i, t, samples[i].latency_ns)))
        .collect();
    shown.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    shown
        .into_iter()
        .take(TIMELINES_SHOWN)
        .map(|(i, t, _)| (i, t))
        .collect()
}

/// Each sample's pwru timeline and the note on how many got one: the join with the pwru
/// lines of the incident's session and of overlapping sessions of its service.
pub(crate) async fn timelines(
    source: &Source,
    id: u64,
    samples: &[model::Sample],
) -> anyhow::Result<(Vec<Option<Timeline>>, String)> {
    let lines = session_lines(source, id, samples).await?;
    let offset = clock_offset(
        lines
            .iter()
            .filter_map(|r| Some((r.received_ns, r.pwru_time_ns?))),
        wall_minus_mono_ns(),
    );
    let joined = join(samples, &lines, offset);
    let with = joined.iter().filter(|t| t.is_some()).count();
    let note = timeline_note(with, samples.len(), &lines, offset);
    Ok((joined, note))
}

/// Every stored pwru line of the incident, page by page.
pub(crate) async fn all_pwru_lines(source: &Source, id: u64) -> anyhow::Result<Vec<PwruRecord>> {
    let mut out: Vec<PwruRecord> = Vec::new();
    loop {
        let page = source
            .pwru(
                id,
                &PwruParams {
                    after_seq: out.last().map(|r| r.seq),
                    limit: 0,
                },
            )
            .await?;
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
async fn session_lines(
    source: &Source,
    id: u64,
    samples: &[model::Sample],
) -> anyhow::Result<Vec<PwruRecord>> {
    let mut lines = all_pwru_lines(source, id).await?;
    let (Some(first), Some(last)) = (
        samples.iter().map(|s| s.time_ns).min(),
        samples.iter().map(|s| s.time_ns).max(),
    ) else {
        return Ok(lines);
    };
    let service = source.incident(id).await?.incident.service;
    let page = source
        .incidents(&IncidentsParams {
            service: Some(service),
            limit: 0,
            ..IncidentsParams::default()
        })
        .await?;
    for other in page.incidents {
        let p = &other.pwru;
        let overlaps = match (p.started_ns, p.ended_ns) {
            (Some(a), Some(b)) => a <= last && b >= first,
            (Some(a), None) => a <= last,
            _ => false,
        };
        if other.id != id && p.lines_stored > 0 && overlaps {
            lines.extend(all_pwru_lines(source, other.id).await?);
        }
    }
    Ok(lines)
}

/// Each sample's pwru timeline, when its packet is among the traced ones.
fn join(
    samples: &[model::Sample],
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
