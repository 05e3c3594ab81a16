//! `tailtrap incidents [--since 6h] [--service S] [--open]`, `tailtrap incidents show ID` and
//! `tailtrap incidents mark ID real|false-alarm|expected [--note TEXT]`.

use std::process::ExitCode;
use std::time::SystemTime;

use std::collections::BTreeMap;

use model::Verdict;
use serde::Deserialize;
use storage::{CaptureState, IncidentState, IncidentVerdict, SampleSummary};

use crate::api::query::{IncidentsParams, MarkParams, SamplesParams};
use crate::api::{IncidentAnswer as Incident, IncidentView};
use crate::cmd::shared::pwru_status::{print_pwru_status, pwru_state};
use crate::cmd::shared::since::parse_since;
use crate::cmd::shared::timelines;
use crate::output::{fmt_ns, fmt_span, fmt_time, print_json, quantile_name, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap incidents`.
// The listing's options are refused with `show`/`mark` in `run` rather than by clap's
// `args_conflicts_with_subcommands`, which also refused the global `--config`, `--socket`
// and `--db` before the subcommand.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    show: Option<Show>,
    /// Only incidents going on since this time: a span back from now (`6h`, `2days`) or an
    /// RFC 3339 time.
    #[arg(long, value_parser = parse_since)]
    since: Option<u64>,
    /// Only this service.
    #[arg(long)]
    service: Option<String>,
    /// Only incidents still open.
    #[arg(long)]
    open: bool,
    /// At most this many (newest first) [default: 100].
    #[arg(long)]
    limit: Option<usize>,
}

#[derive(clap::Subcommand, Debug)]
enum Show {
    /// One incident: evidence, stage attribution, sample summary, capture and pwru status.
    Show {
        /// The incident id.
        id: u64,
    },
    /// Record what an incident was: `real`, `false-alarm` or `expected` (a deploy, a batch
    /// job). `tailtrap tune` counts verdicts when comparing settings.
    Mark {
        /// The incident id.
        id: u64,
        /// `real`, `false-alarm` or `expected`.
        verdict: Verdict,
        /// Why, for the next reader.
        #[arg(long, default_value = "")]
        note: String,
    },
}

/// Run `tailtrap incidents`.
pub fn run(args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    if args.show.is_some() {
        let listing = [
            ("--since", args.since.is_some()),
            ("--service", args.service.is_some()),
            ("--open", args.open),
            ("--limit", args.limit.is_some()),
        ];
        if let Some((flag, _)) = listing.iter().find(|(_, given)| *given) {
            anyhow::bail!(
                "{flag} narrows the list of incidents; `incidents show` and `incidents mark` \
                 take one incident id"
            );
        }
    }
    block_on(async move {
        let source = Source::open(target, verbose).await?;
        match args.show {
            Some(Show::Mark { id, verdict, note }) => {
                let v = source.mark(id, &MarkParams { verdict, note }).await?;
                if json {
                    print_json(&v)?;
                } else {
                    println!("incident {id} marked {}", v.verdict);
                }
            }
            Some(Show::Show { id }) => {
                let view = source.incident(id).await?;
                // The slowest samples' pwru timelines, as `tailtrap samples ID` joins them
                // (over the slowest page of samples, the largest the API serves).
                let answer = source
                    .samples(
                        id,
                        &SamplesParams {
                            limit: 0,
                            order: crate::api::query::SampleOrder::Slowest,
                            ..SamplesParams::default()
                        },
                    )
                    .await?;
                let (samples, summary) = (answer.samples, answer.pwru_timelines);
                if json {
                    let mut v = serde_json::to_value(&view)?;
                    let slowest: Vec<serde_json::Value> = timelines::slowest_joined(&samples)
                        .into_iter()
                        .map(|(i, t)| {
                            let s = &samples[i].sample;
                            serde_json::json!({
                                "time_ns": s.time_ns,
                                "probe": s.probe,
                                "latency_ns": s.latency_ns,
                                "flow": s.flow,
                                "pwru_timeline": t,
                            })
                        })
                        .collect();
                    v["pwru_timelines"] = serde_json::json!({
                        "samples": summary.samples,
                        "with_timeline": summary.with_timeline,
                        "note": summary.note,
                        "slowest": slowest,
                    });
                    print_json(&v)?;
                } else {
                    print_show(&view);
                    if !samples.is_empty() {
                        println!("\n{}", summary.note);
                        timelines::print_slowest_timelines(&samples, |i| {
                            format!("sample at {}", fmt_time(samples[i].sample.time_ns))
                        });
                    }
                }
            }
            None => {
                let params = IncidentsParams {
                    since_ns: args.since,
                    service: args.service,
                    state: args.open.then_some(IncidentState::Open),
                    before_id: None,
                    limit: args.limit.unwrap_or(100),
                };
                let page = source.incidents(&params).await?;
                if json {
                    print_json(&page)?;
                } else {
                    print_list(&page.incidents, &page.verdicts);
                    if page.next_before_id.is_some() {
                        println!("(more incidents: raise --limit or narrow with --since)");
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The detector's incident as stored with the record.
fn detail(i: &Incident) -> Option<detector::Incident> {
    detector::Incident::deserialize(&i.evidence).ok()
}

/// The stage a cause verdict judged (verdicts stored before it was recorded have none).
fn judged_stage(c: &crate::api::CauseAnswer) -> Option<String> {
    c.figures.get("stage")?.as_str().map(str::to_owned)
}

fn lasted(i: &Incident) -> String {
    match i.closed_ns {
        Some(c) => fmt_span(c.saturating_sub(i.opened_ns)),
        None => {
            let now = model::unix_ns(SystemTime::now());
            format!("{} so far", fmt_span(now.saturating_sub(i.opened_ns)))
        }
    }
}

fn probe_names(i: &Incident) -> String {
    i.probes
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A host-wide incident's members (`None` for a per-service incident).
fn host_wide(i: &Incident) -> Option<crate::daemon::host_wide::HostWideEvidence> {
    if i.service != crate::daemon::host_wide::HOST_WIDE {
        return None;
    }
    crate::daemon::host_wide::HostWideEvidence::deserialize(&i.evidence).ok()
}

fn print_list(incidents: &[Incident], verdicts: &BTreeMap<u64, IncidentVerdict>) {
    if incidents.is_empty() {
        println!("no incidents");
        return;
    }
    let mut t = table([
        "id", "service", "state", "opened", "lasted", "headline", "stage", "cause", "pwru",
        "verdict",
    ]);
    for i in incidents {
        let d = detail(i);
        t.add_row([
            i.id.to_string(),
            i.service.clone(),
            i.state.to_string(),
            fmt_time(i.opened_ns),
            lasted(i),
            match host_wide(i) {
                Some(hw) => format!(
                    "{} services: {}",
                    hw.members.len(),
                    hw.members
                        .iter()
                        .map(|m| m.service.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => d
                    .as_ref()
                    .map_or_else(|| probe_names(i), |d| d.headline.describe()),
            },
            d.and_then(|d| d.stage)
                .map(|s| s.verdict)
                .or_else(|| host_wide(i).map(|h| h.stage))
                .unwrap_or_else(|| "-".into()),
            i.cause
                .as_ref()
                .map_or_else(|| "-".into(), |c| c.kind.clone()),
            pwru_state(&i.pwru).to_owned(),
            verdicts
                .get(&i.id)
                .map_or_else(|| "-".into(), |v| v.verdict.to_string()),
        ]);
    }
    println!("{t}");
}

fn capture_state(s: CaptureState) -> &'static str {
    match s {
        CaptureState::NotArmed => "not armed",
        CaptureState::Armed => "armed",
        CaptureState::Disarmed => "disarmed",
        CaptureState::Failed => "failed",
    }
}

fn print_show(view: &IncidentView) {
    let i = &view.incident;
    let d = detail(i);
    println!("incident {} — {} — {}", i.id, i.service, i.state);
    let mut t = table(["item", "value"]);
    t.add_row(["service".to_owned(), i.service.clone()]);
    t.add_row(["state".to_owned(), i.state.to_string()]);
    t.add_row(["opened".to_owned(), fmt_time(i.opened_ns)]);
    t.add_row([
        "closed".to_owned(),
        i.closed_ns.map_or_else(|| "-".into(), fmt_time),
    ]);
    t.add_row(["lasted".to_owned(), lasted(i)]);
    t.add_row(["probes".to_owned(), probe_names(i)]);
    if let Some(v) = &view.verdict {
        let note = if v.note.is_empty() {
            String::new()
        } else {
            format!(": {}", v.note)
        };
        t.add_row([
            "verdict".to_owned(),
            format!("{}{note} (marked {})", v.verdict, fmt_time(v.marked_ns)),
        ]);
    }
    if let Some(d) = &d {
        t.add_row(["headline".to_owned(), d.headline.describe()]);
        t.add_row([
            "first hot window".to_owned(),
            humantime::format_rfc3339_seconds(d.first_hot_at).to_string(),
        ]);
        if let Some(s) = &d.stage {
            t.add_row([
                "stage".to_owned(),
                format!("{} (at {})", s.verdict, quantile_name(s.quantile)),
            ]);
        }
    }
    // The cause verdict: a sentence with its figures, or why there is none yet. A verdict
    // judged for a stage the incident has since left says which.
    let current_stage = d
        .as_ref()
        .and_then(|d| d.stage.as_ref())
        .map(|s| s.verdict.as_str());
    t.add_row([
        "cause".to_owned(),
        match &i.cause {
            Some(c) => {
                let judged = judged_stage(c)
                    .filter(|s| Some(s.as_str()) != current_stage)
                    .map(|s| format!("for stage {s}, "))
                    .unwrap_or_default();
                format!(
                    "{}: {} ({judged}decided {})",
                    c.kind,
                    c.summary,
                    fmt_time(c.decided_ns)
                )
            }
            None if i.state == storage::IncidentState::Open => "not decided yet".into(),
            None => "-".into(),
        },
    ]);
    println!("{t}");

    if let Some(hw) = host_wide(i) {
        println!(
            "\nhost-wide: {} services in {} (each incident has its own evidence)",
            hw.members.len(),
            hw.stage
        );
        let mut t = table(["incident", "service", "opened", "state"]);
        for m in &hw.members {
            t.add_row([
                m.id.to_string(),
                m.service.clone(),
                fmt_time(m.opened_ns),
                if m.closed { "closed" } else { "open" }.to_owned(),
            ]);
        }
        println!("{t}");
    }

    if let Some(d) = &d {
        println!("\nevidence");
        let mut t = table([
            "probe", "quantile", "kind", "baseline", "observed", "ratio", "p-value", "samples",
        ]);
        for e in &d.evidence {
            t.add_row([
                e.probe.to_string(),
                quantile_name(e.quantile),
                format!("{:?}", e.kind).to_lowercase(),
                fmt_ns(e.baseline.value_ns),
                fmt_ns(e.observed.value_ns),
                format!("{:.1}x", e.ratio),
                e.p_value.map_or_else(|| "-".into(), |p| format!("{p:.1e}")),
                e.window_samples.to_string(),
            ]);
        }
        println!("{t}");
        if let Some(s) = &d.stage {
            println!("\nstage attribution at {}", quantile_name(s.quantile));
            let mut t = table([
                "stage",
                "baseline",
                "observed",
                "shift",
                "stage's own shift",
            ]);
            for row in &s.stages {
                t.add_row([
                    row.stage.name(),
                    fmt_ns(row.baseline_ns),
                    fmt_ns(row.observed_ns),
                    fmt_ns(row.shift_ns),
                    fmt_ns(row.stage_shift_ns),
                ]);
            }
            println!("{t}");
        }
    }

    print_summary(&view.summary);

    println!("\ncapture");
    let c = &i.capture;
    let mut t = table(["item", "value"]);
    t.add_row(["state".to_owned(), capture_state(c.state).to_owned()]);
    let records = if c.state == CaptureState::Armed {
        // The kernel's counts for the armed period are taken when capture is disarmed.
        format!(
            "{} stored so far ({} pre-trigger); kernel counts follow at disarm",
            c.stored, c.pre_trigger
        )
    } else {
        format!(
            "{} emitted, {} dropped (ring full), {} rate-limited, {} stored ({} pre-trigger)",
            c.emitted, c.dropped, c.rate_limited, c.stored, c.pre_trigger
        )
    };
    t.add_row(["records".to_owned(), records]);
    if !c.message.is_empty() {
        t.add_row(["note".to_owned(), c.message.clone()]);
    }
    println!("{t}");

    print_pwru_status(i);
}

fn print_summary(s: &SampleSummary) {
    println!("\nsamples");
    let mut t = table(["item", "value"]);
    t.add_row([
        "count".to_owned(),
        format!(
            "{} ({} pre-trigger, {} head-of-line suspects)",
            s.count, s.pre_trigger, s.hol_suspect
        ),
    ]);
    if let Some(q) = &s.latency {
        t.add_row([
            "latency".to_owned(),
            format!(
                "p50 {}  p90 {}  p99 {}  max {}",
                fmt_ns(q.p50 as f64),
                fmt_ns(q.p90 as f64),
                fmt_ns(q.p99 as f64),
                fmt_ns(q.max as f64)
            ),
        ]);
    }
    if let (Some(a), Some(b)) = (s.first_ns, s.last_ns) {
        t.add_row([
            "span".to_owned(),
            format!("{} .. {}", fmt_time(a), fmt_time(b)),
        ]);
    }
    if !s.probes.is_empty() {
        t.add_row([
            "probes".to_owned(),
            s.probes
                .iter()
                .map(|(p, n)| format!("{p} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
    }
    if !s.cpus.is_empty() {
        t.add_row([
            "CPUs".to_owned(),
            s.cpus
                .iter()
                .map(|(c, n)| format!("cpu{c} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
    }
    println!("{t}");
    if !s.top_flows.is_empty() {
        let mut t = table(["top flows", "samples", "slowest"]);
        for f in &s.top_flows {
            t.add_row([
                f.flow.to_string(),
                f.count.to_string(),
                fmt_ns(f.max_latency_ns as f64),
            ]);
        }
        println!("{t}");
    }
    if !s.top_processes.is_empty() {
        let mut t = table(["top processes", "pid", "samples"]);
        for p in &s.top_processes {
            t.add_row([p.comm.clone(), p.pid.to_string(), p.count.to_string()]);
        }
        println!("{t}");
    }
}
