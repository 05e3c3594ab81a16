//! `tailtrap samples ID [--probe P] [--flow 'dport=443 saddr=10.0.0.5'] [--min-latency 2ms]
//! [--limit N] [--by-time]`: an incident's slow-SKB samples, slowest first.

use std::process::ExitCode;
use std::time::Duration;

use capture::pwru::{
    clock_offset, wall_minus_mono_ns, ClockOffset, Passes, SampleKey, Timeline, TracePoint,
};
use model::Probe;
use storage::PwruRecord;

use crate::api::query::{IncidentsParams, PwruParams, SampleOrder, SamplesParams};
use crate::output::{fmt_ns, fmt_time, print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap samples`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The incident id.
    id: u64,
    /// Only this probe (e.g. `tcp-socket-read`).
    #[arg(long, value_parser = parse_probe)]
    probe: Option<Probe>,
    /// Only flows matching all of these `key=value` words: saddr, daddr, sport, dport,
    /// proto (e.g. `'dport=443 saddr=10.0.0.5'`).
    #[arg(long, value_parser = check_flow)]
    flow: Option<String>,
    /// Only samples at least this slow (e.g. `2ms`).
    #[arg(long, value_parser = humantime::parse_duration)]
    min_latency: Option<Duration>,
    /// At most this many, slowest first (with `--by-time`, oldest first).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// In time order, oldest first, instead of slowest first.
    #[arg(long)]
    by_time: bool,
    /// Only samples with a pwru timeline (their packet was traced by the incident's
    /// pwru session).
    #[arg(long)]
    with_timeline: bool,
}

fn parse_probe(s: &str) -> Result<Probe, String> {
    Probe::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Probe::ALL.iter().map(|p| p.name()).collect();
        format!("unknown probe {s:?} (one of {})", names.join(", "))
    })
}

fn check_flow(s: &str) -> Result<String, String> {
    s.parse::<storage::FlowFilter>()?;
    Ok(s.to_owned())
}

/// Run `tailtrap samples`.
pub fn run(args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(target, verbose).await?;
        let params = SamplesParams {
            probe: args.probe,
            flow: args.flow,
            min_latency_ns: args
                .min_latency
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            after_time_ns: None,
            after_seq: None,
            after_latency_ns: None,
            order: if args.by_time {
                SampleOrder::Time
            } else {
                SampleOrder::Slowest
            },
            // The timeline filter applies after the join: take a whole page first.
            limit: if args.with_timeline { 0 } else { args.limit },
        };
        let mut page = source.samples(args.id, &params).await?;
        let (mut joined, note) = timelines(&source, args.id, &page.samples).await?;
        let with_timeline = joined.iter().filter(|t| t.is_some()).count();
        let of = page.samples.len();
        if args.with_timeline {
            let kept: Vec<(model::Sample, Option<Timeline>)> = page
                .samples
                .into_iter()
                .zip(joined)
                .filter(|(_, t)| t.is_some())
                .take(args.limit)
                .collect();
            (page.samples, joined) = kept.into_iter().unzip();
        }
        if json {
            let mut v = serde_json::to_value(&page)?;
            if let Some(samples) = v.get_mut("samples").and_then(|s| s.as_array_mut()) {
                for (s, t) in samples.iter_mut().zip(&joined) {
                    s["pwru_timeline"] = serde_json::to_value(t)?;
                }
            }
            v["pwru_timelines"] = serde_json::json!({
                "samples": of,
                "with_timeline": with_timeline,
                "note": note,
            });
            print_json(&v)?;
            return Ok(ExitCode::SUCCESS);
        }
        if page.samples.is_empty() {
            println!("no samples of incident {} match", args.id);
            return Ok(ExitCode::SUCCESS);
        }
        let mut t = table([
            "#",
            "time",
            "probe",
            "latency",
            "flow",
            "process",
            "cpu",
            "rx queue",
            "queue",
            "reader wait",
            "flags",
            "pwru",
        ]);
        for (i, (s, timeline)) in page.samples.iter().zip(&joined).enumerate() {
            let process = match s.pid {
                Some(pid) => format!("{} [{pid}]", s.comm),
                None => "-".into(),
            };
            let queue = s
                .socket_queue
                .map_or_else(|| "-".into(), |q| format!("{} skbs, {} B", q.skbs, q.bytes));
            let pwru = timeline.as_ref().map_or_else(
                || "-".to_owned(),
                |t| format!("{} events, skb {:#x}", t.steps.len(), t.skb),
            );
            t.add_row([
                (i + 1).to_string(),
                fmt_time(s.time_ns),
                s.probe.to_string(),
                fmt_ns(s.latency_ns as f64),
                s.flow.to_string(),
                process,
                s.cpu.to_string(),
                rx_queue_text(s),
                queue,
                reader_wait_text(s),
                s.flags.names().collect::<Vec<_>>().join(","),
                pwru,
            ]);
        }
        println!("{t}");
        if page.next.is_some() {
            println!("(more samples: raise --limit)");
        }
        println!("\n{note}");
        print_slowest_timelines(&page.samples, &joined, |i| format!("sample #{}", i + 1));
        Ok(ExitCode::SUCCESS)
    })
}

/// `if 4 rx-3`: the device (its index in the sample's namespace) and the RX queue the
/// packet came in on; `-` where the driver recorded none.
fn rx_queue_text(s: &model::Sample) -> String {
    s.rx_queue
        .map_or_else(|| "-".into(), |q| format!("if {} rx-{q}", s.ifindex))
}

/// `runq 81 %, off 4 %, cpu held by sh [88]`: where the reader was while the packet
/// waited; `-` without the split.
fn reader_wait_text(s: &model::Sample) -> String {
    let Some(w) = &s.reader_wait else {
        return "-".into();
    };
    let share = |ns: u64| {
        if s.latency_ns == 0 {
            0.0
        } else {
            ns as f64 * 100.0 / s.latency_ns as f64
        }
    };
    let mut text = format!(
        "runq {:.0} %, off {:.0} %",
        share(w.runq_ns),
        share(w.off_cpu_ns)
    );
    if let Some(h) = w.cpu_holder.filter(|h| h.pid != 0 && w.runq_ns > 0) {
        text.push_str(&format!(", cpu held by {} [{}]", h.comm, h.pid));
    }
    text
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rx_queue_column_names_the_device_and_queue_or_shows_none() {
        let mut s = model::fixtures::sample(1, 0, 1_000);
        assert_eq!(rx_queue_text(&s), "-");
        s.rx_queue = Some(0);
        s.ifindex = 4;
        assert_eq!(rx_queue_text(&s), "if 4 rx-0");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["rx_queue"], 0);
        s.rx_queue = None;
        assert_eq!(
            serde_json::to_value(&s).unwrap()["rx_queue"],
            serde_json::Value::Null
        );
    }
}
