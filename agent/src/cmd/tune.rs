//! `tailtrap tune SERVICE`: replay a service's stored history through the detector with the
//! settings in force and with candidate settings (`--set`, `--sweep`), and compare what
//! each would have opened with the incidents the daemon recorded and the operator marked.
//! docs/detector.md ("Tuning a service") is the user's guide.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use detector::candidates::{candidates, Candidate};
use detector::event::Incident as Replayed;
use detector::scoring::{self, MissReason, Score};
use detector::sweep::Sweep;
use detector::{DetectorConfig, Thresholds};
use indicatif::ProgressBar;
use model::config::key_segment;
use model::Verdict;
use serde::Serialize;
use storage::{IncidentState, IncidentVerdict};

use crate::api::query::IncidentsParams;
use crate::cmd::shared::history_read::{self as history, Range, SparseHistory};
use crate::cmd::shared::{progress, replayed_incidents};
use crate::output::{fmt_span, fmt_time, print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap tune`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    range: Range,
    /// Set a threshold key of `[detector.services.SERVICE]` in every candidate
    /// (`min_ratio=1.5`, `quantiles=[0.99,0.999]`, `window=10s`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Try each value of a key (`min_ratio=1.5,2,3`); several `--sweep`s form a grid of at
    /// most 64 candidates. A list value is written in brackets: `quantiles=[0.99],[0.999]`.
    #[arg(long, value_name = "KEY=V1,V2,...")]
    sweep: Vec<String>,
    /// List the incidents candidate N (0: the settings in force) would have opened.
    #[arg(long, value_name = "N")]
    show: Option<usize>,
    /// Print the `[detector.services.SERVICE]` block of candidate N (default: the only
    /// candidate) to paste into the configuration.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "-1", allow_negative_numbers = true)]
    emit: Option<i64>,
}

/// Default range: a week back (read at the resolution whose retention reaches it).
const DEFAULT_SPAN: Duration = Duration::from_secs(7 * 86_400);

/// What one candidate's replay opened.
struct Outcome {
    incidents: Vec<Replayed>,
}

/// Replay one service's history under every candidate at once: a [`Sweep`] shares the
/// windows, baselines and tests among candidates whose settings do not change them.
fn replay_all(
    history: &SparseHistory,
    config: &DetectorConfig,
    cands: &[Candidate],
    times: (Duration, Duration),
    progress: &ProgressBar,
) -> anyhow::Result<(Vec<Outcome>, Read)> {
    let (interval, resolution) = times;
    const STEP: u64 = 4096;
    let thresholds: Vec<Thresholds> = cands
        .iter()
        .map(|c| c.thresholds.at_resolution(interval, resolution))
        .collect();
    let mut sweep = Sweep::new(
        &history.service,
        config.significance,
        &config.slo,
        &thresholds,
    );
    // One buffer for every point's non-empty buckets: the sweep reads them once per
    // window group.
    let mut buckets: Vec<(usize, u64)> = Vec::new();
    let (mut done, mut failed) = (0u64, None);
    let mut read = Read {
        seen: Vec::new(),
        probes: 0,
    };
    let mut probes_seen = 0u32;
    history.for_each(|start, probe, series, i| {
        if failed.is_some() {
            return;
        }
        buckets.clear();
        buckets.extend(series.buckets(i));
        let ts = point_end(start, history.resolution);
        read.seen.push(ns(ts));
        probes_seen |= probe.bit();
        if let Err(e) = sweep.push(ts, probe, &buckets, series.count(i)) {
            failed = Some(e);
        }
        done += 1;
        if done % STEP == 0 {
            progress.inc(STEP * cands.len() as u64);
        }
    })?;
    progress.inc(done % STEP * cands.len() as u64);
    if let Some(e) = failed {
        return Err(e).context("replaying the stored history");
    }
    read.probes = probes_seen.count_ones() as usize;
    let outcomes = sweep
        .finish()
        .into_iter()
        .map(|incidents| Outcome { incidents })
        .collect();
    Ok((outcomes, read))
}

/// What a replay read.
struct Read {
    /// When each point was seen (its end, ns), in replay order.
    seen: Vec<u64>,
    /// Probes with at least one point.
    probes: usize,
}

/// Every candidate's row: its incidents scored against the recorded ones.
fn compare_all(
    cands: &[Candidate],
    outcomes: &[Outcome],
    recorded: &[Recorded],
    slack: u64,
    end_ns: u64,
) -> Vec<Row> {
    let recorded: Vec<scoring::Recorded> = recorded.iter().map(Recorded::scored).collect();
    cands
        .iter()
        .zip(outcomes)
        .enumerate()
        .map(|(n, (c, o))| Row {
            candidate: n,
            settings: c.changes.iter().cloned().collect(),
            score: scoring::score(&o.incidents, &recorded, slack, end_ns),
        })
        .collect()
}

/// A recorded incident and its verdict.
#[derive(Debug, Clone, Serialize)]
struct Recorded {
    id: u64,
    opened: String,
    closed: Option<String>,
    state: IncidentState,
    probes: String,
    verdict: Option<Verdict>,
    #[serde(skip)]
    opened_ns: u64,
    #[serde(skip)]
    closed_ns: Option<u64>,
}

impl Recorded {
    fn scored(&self) -> scoring::Recorded {
        scoring::Recorded {
            id: self.id,
            opened_ns: self.opened_ns,
            closed_ns: self.closed_ns,
            verdict: self.verdict,
            interrupted: self.state == IncidentState::Interrupted,
        }
    }
}

/// One row of the comparison: a candidate's settings and its score.
#[derive(Debug, Clone, Serialize)]
struct Row {
    candidate: usize,
    settings: BTreeMap<String, toml::Value>,
    #[serde(flatten)]
    score: Score,
}

fn ns(t: SystemTime) -> u64 {
    model::unix_ns(t)
}

/// The end of the point starting at `start` ns: the time the daemon's detector saw it at.
fn point_end(start: u64, resolution: Duration) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(start) + resolution
}

/// What `--json` prints.
#[derive(Serialize)]
struct Report {
    service: String,
    #[serde(with = "humantime_serde")]
    resolution: Duration,
    #[serde(with = "humantime_serde")]
    daemon_interval: Duration,
    from: String,
    to: String,
    points: usize,
    probes: usize,
    baseline: &'static str,
    scaling: String,
    recorded: Vec<Recorded>,
    candidates: Vec<Row>,
    /// Recorded incidents the settings in force do not reproduce, and the likely reason.
    not_reproduced: Vec<NotReproduced>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shown: Option<Shown>,
    #[serde(skip_serializing_if = "Option::is_none")]
    emitted: Option<String>,
}

/// A recorded incident candidate 0 misses.
#[derive(Serialize)]
struct NotReproduced {
    id: u64,
    why: String,
}

/// `--show N`: a candidate's incidents.
#[derive(Serialize)]
struct Shown {
    candidate: usize,
    incidents: Vec<ShownIncident>,
    /// The same, for the table.
    #[serde(skip)]
    replayed: Vec<Replayed>,
}

#[derive(Serialize)]
struct ShownIncident {
    opened_at: String,
    closed_at: Option<String>,
    probes: String,
    quantile: f64,
    ratio: f64,
    headline_probe: String,
}

const BASELINE: &str = "fresh: learnt from the first point of the range, with the warm-up of the settings tried (the saved baseline is not used: it was learnt after this history and would let the replay see the future)";

/// Run `tailtrap tune`.
pub fn run(args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    let config = crate::config::load(target.config_path())?;
    let service = args.range.service.clone();
    let cands = candidates(&config.detector, &service, &args.set, &args.sweep)?;
    if let Some(n) = args.show.filter(|&n| n >= cands.len()) {
        bail!(
            "--show {n}: there are {} candidates (0 to {})",
            cands.len(),
            cands.len() - 1
        );
    }
    let emit = match args.emit {
        None => None,
        Some(-1) if cands.len() <= 2 => Some(cands.len() - 1),
        Some(-1) => bail!(
            "--emit: {} candidates were tried; say which with --emit N",
            cands.len() - 1
        ),
        Some(n) => match usize::try_from(n).ok().filter(|&n| n < cands.len()) {
            Some(n) => Some(n),
            None => bail!(
                "--emit {n}: there are {} candidates (0 to {})",
                cands.len(),
                cands.len() - 1
            ),
        },
    };
    let interval = config.daemon.interval;
    let (h, recorded_page) = block_on(async {
        let source = Source::open(target, verbose).await?;
        let params = args.range.params(None, DEFAULT_SPAN);
        let page = source
            .incidents(&IncidentsParams {
                since_ns: Some(params.from_ns),
                service: Some(service.clone()),
                state: None,
                before_id: None,
                limit: 0,
            })
            .await?;
        let h = history::read_sparse(source, &params).await?;
        Ok((h, page))
    })?;
    let (from_ns, to_ns, resolution) = (h.from_ns, h.to_ns, h.resolution);
    let slack = u64::try_from(resolution.as_nanos()).unwrap_or(u64::MAX);
    // An estimate: the points are counted as they are read.
    let span_points = to_ns.saturating_sub(from_ns) / slack.max(1) + 1;
    let progress = progress::bar(
        Some(span_points.saturating_mul((h.probes.len() * cands.len()) as u64)),
        "{spinner} replaying {human_pos}/{human_len} points {wide_bar} eta {eta}",
    );
    let replayed = replay_all(
        &h,
        &config.detector,
        &cands,
        (interval, resolution),
        &progress,
    );
    progress.finish_and_clear();
    let (outcomes, read) = replayed?;
    let seen = read.seen;
    if seen.is_empty() {
        return Err(history::no_history(&h));
    }
    let probes = read.probes;
    let end_ns = seen.last().map_or(to_ns, |&t| t).min(to_ns.max(from_ns));
    let first_ns = seen.first().map_or(from_ns, |&t| t);
    let recorded = recorded_in(
        &recorded_page.incidents,
        &recorded_page.verdicts,
        first_ns,
        end_ns,
    );
    let rows = compare_all(&cands, &outcomes, &recorded, slack, end_ns);
    let scaled = cands[0].thresholds.at_resolution(interval, resolution);
    let scaling = if resolution > interval {
        format!(
            "history read at {} for a daemon interval of {}: windows, durations and sample counts are kept; open_after/open_window/close_after count points, scaled to {}/{}/{} for the settings in force",
            humantime::format_duration(resolution),
            humantime::format_duration(interval),
            scaled.open_after,
            scaled.open_window,
            scaled.close_after
        )
    } else {
        format!(
            "history read at {}, the daemon's interval: settings apply unchanged",
            humantime::format_duration(resolution)
        )
    };
    let shown = args.show.map(|n| Shown {
        candidate: n,
        incidents: outcomes[n].incidents.iter().map(shown_incident).collect(),
        replayed: outcomes[n].incidents.clone(),
    });
    let emitted = emit.map(|n| emit_block(&service, &cands[n].overrides));
    let gaps = scoring::gaps(&seen, slack);
    let not_reproduced = rows
        .first()
        .map(|row| {
            row.score
                .matches
                .iter()
                .filter(|m| !m.kept)
                .filter_map(|m| recorded.iter().find(|i| i.id == m.id))
                .map(|i| NotReproduced {
                    id: i.id,
                    why: why_missed(i, &gaps),
                })
                .collect()
        })
        .unwrap_or_default();
    let report = Report {
        service,
        resolution,
        daemon_interval: interval,
        from: fmt_time(first_ns.saturating_sub(slack)),
        to: fmt_time(end_ns),
        points: seen.len(),
        probes,
        baseline: BASELINE,
        scaling,
        recorded,
        candidates: rows,
        not_reproduced,
        shown,
        emitted,
    };
    if json {
        print_json(&report)?;
    } else if let Some(block) = &report.emitted {
        // Only the block, so it can be redirected into a file as it is.
        print!("{block}");
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// Replay every candidate and compare each with the recorded incidents. `times` is the
/// daemon's interval and the history's resolution.
#[cfg(test)]
fn evaluate(
    history: &SparseHistory,
    detector: &DetectorConfig,
    cands: &[Candidate],
    recorded: &[Recorded],
    times: (Duration, Duration),
    end_ns: u64,
    progress: &ProgressBar,
) -> anyhow::Result<(Vec<Outcome>, Vec<Row>)> {
    let (outcomes, _) = replay_all(history, detector, cands, times, progress)?;
    let slack = u64::try_from(times.1.as_nanos()).unwrap_or(u64::MAX);
    let rows = compare_all(cands, &outcomes, recorded, slack, end_ns);
    Ok((outcomes, rows))
}

/// The recorded incidents opened within the replayed range, oldest first.
fn recorded_in(
    incidents: &[crate::api::IncidentAnswer],
    verdicts: &BTreeMap<u64, IncidentVerdict>,
    first_ns: u64,
    end_ns: u64,
) -> Vec<Recorded> {
    let mut out: Vec<Recorded> = incidents
        .iter()
        .filter(|i| i.opened_ns >= first_ns && i.opened_ns <= end_ns)
        .map(|i| Recorded {
            id: i.id,
            opened: fmt_time(i.opened_ns),
            closed: i.closed_ns.map(fmt_time),
            state: i.state,
            probes: model::Probe::names(&i.probes),
            verdict: verdicts.get(&i.id).map(|v| v.verdict),
            opened_ns: i.opened_ns,
            closed_ns: i.closed_ns,
        })
        .collect();
    out.sort_by_key(|r| r.id);
    out
}

fn shown_incident(i: &Replayed) -> ShownIncident {
    ShownIncident {
        opened_at: fmt_time(ns(i.opened_at)),
        closed_at: i.closed_at.map(|c| fmt_time(ns(c))),
        probes: model::Probe::names(&i.probes),
        quantile: i.headline.quantile,
        ratio: i.headline.ratio,
        headline_probe: i.headline.probe.to_string(),
    }
}

/// The `[detector.services.SERVICE]` block holding `overrides`.
fn emit_block(service: &str, overrides: &toml::Table) -> String {
    let body = toml::to_string(overrides).unwrap_or_default();
    format!("[detector.services.{}]\n{body}", key_segment(service))
}

fn settings_text(s: &BTreeMap<String, toml::Value>) -> String {
    if s.is_empty() {
        return "in force".into();
    }
    s.iter()
        .map(|(k, v)| match v {
            toml::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn print_report(r: &Report) {
    println!(
        "{}: {} points of {} probe(s) from {} to {} at {} resolution",
        r.service,
        r.points,
        r.probes,
        r.from,
        r.to,
        humantime::format_duration(r.resolution)
    );
    println!("baseline: {}", r.baseline);
    println!("windows: {}", r.scaling);
    let marked = r.recorded.iter().filter(|i| i.verdict.is_some()).count();
    println!(
        "recorded: {} incidents ({} marked)",
        r.recorded.len(),
        marked
    );
    let mut t = table([
        "#",
        "settings",
        "incidents",
        "recorded kept",
        "missed",
        "real kept",
        "false alarms dropped",
        "expected dropped",
        "delay to open",
        "time in incident",
    ]);
    for row in &r.candidates {
        let (n, sc) = (row.candidate, &row.score);
        let delays: Vec<String> = sc
            .matches
            .iter()
            .filter_map(|m| m.delay_s.map(|d| format!("#{} {d:+.0}s", m.id)))
            .collect();
        t.add_row([
            n.to_string(),
            settings_text(&row.settings),
            sc.incidents.to_string(),
            format!("{}/{}", sc.kept, sc.kept + sc.missed),
            sc.missed.to_string(),
            format!("{}/{}", sc.real_kept, sc.real),
            format!("{}/{}", sc.false_alarms_dropped, sc.false_alarms),
            format!("{}/{}", sc.expected_dropped, sc.expected),
            if delays.is_empty() {
                "-".into()
            } else {
                delays.join(" ")
            },
            fmt_span((sc.time_in_incident_s * 1e9) as u64),
        ]);
    }
    println!("{t}");
    if !r.not_reproduced.is_empty() {
        println!("not reproduced with the settings in force:");
        for n in &r.not_reproduced {
            println!("  #{}: {}", n.id, n.why);
        }
    }
    if let Some(s) = &r.shown {
        println!("\nincidents of candidate {}", s.candidate);
        if s.incidents.is_empty() {
            println!("none");
        } else {
            println!("{}", replayed_incidents::table(&s.replayed));
        }
    }
}

/// Why the settings in force may not reproduce a recorded incident, in words.
fn why_missed(i: &Recorded, gaps: &[(u64, u64)]) -> String {
    match scoring::why_missed(&i.scored(), gaps) {
        MissReason::Interrupted => "the daemon stopped while it was open".into(),
        MissReason::AfterGap(before, after) => format!(
            "the history has a gap from {} to {} before it: the daemon restarted then and resumed from its saved baseline, which the replay does not",
            fmt_time(before),
            fmt_time(after)
        ),
        MissReason::ReloadOrWarmup => "the settings were reloaded (SIGHUP) in the range, or it opened within the replay's warm-up".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::query::{self, HistoryParams};
    use detector::scenario::Scenario;
    use storage::{NewIncident, Store, StoreConfig};

    /// The step scenario `tailtrap replay`'s tests use too (a step at two hours).
    const SCENARIO: &str = include_str!("../../testdata/step.toml");

    const SEC: u64 = 1_000_000_000;

    fn scenario_store(dir: &tempfile::TempDir) -> (Store, u64, u64) {
        let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
        let sc = Scenario::from_toml_str(SCENARIO, "t.toml").unwrap();
        let start = ns(sc.start);
        for interval in sc.generate() {
            for rec in interval {
                let end = ns(rec.ts);
                store
                    .record_history(&rec.service, rec.probe, end - SEC, &rec.hist)
                    .unwrap();
            }
        }
        (store, start, start + 3 * 3600 * SEC)
    }

    /// Tune over the database at `db` (opened here, closed after).
    fn tune_at(
        db: &std::path::Path,
        from: u64,
        to: u64,
        resolution_s: u64,
        sweep: &[&str],
        recorded: &[Recorded],
    ) -> (Vec<Outcome>, Vec<Row>) {
        let p = HistoryParams {
            service: "web".into(),
            probe: None,
            from_ns: from,
            to_ns: to,
            resolution_ms: Some(resolution_s * 1000),
        };
        let store = Store::open(db, StoreConfig::default()).unwrap();
        let h = query::history(&store, &p, to).unwrap();
        assert_eq!(h.resolution, Duration::from_secs(resolution_s));
        let resolution = h.resolution;
        let h = SparseHistory::from(h);
        let config = DetectorConfig::default();
        let sweep: Vec<String> = sweep.iter().map(|s| s.to_string()).collect();
        let cands = candidates(&config, "web", &[], &sweep).unwrap();
        let mut end = 0;
        h.for_each(|start, _, _, _| end = ns(point_end(start, resolution)))
            .unwrap();
        // Read from the database as `tune` does (slice by slice), the same points.
        let source = crate::source::Source::Db(Box::new(store));
        let direct = block_on(history::read_sparse(source, &p)).unwrap();
        let mut a = Vec::new();
        h.for_each(|t, probe, s, i| {
            a.push((t, probe, s.count(i), s.buckets(i).collect::<Vec<_>>()))
        })
        .unwrap();
        let mut b = Vec::new();
        direct
            .for_each(|t, probe, s, i| {
                b.push((t, probe, s.count(i), s.buckets(i).collect::<Vec<_>>()))
            })
            .unwrap();
        assert_eq!(a, b);
        evaluate(
            &h,
            &config,
            &cands,
            recorded,
            (Duration::from_secs(1), resolution),
            end,
            &ProgressBar::hidden(),
        )
        .unwrap()
    }

    #[test]
    fn a_step_is_found_at_every_resolution_and_a_strict_candidate_drops_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, from, to) = scenario_store(&dir);
        let step = from + 2 * 3600 * SEC;
        // The daemon opened one incident on the step; the operator called it a false alarm.
        let inc = store
            .open_incident(&NewIncident {
                service: "web".into(),
                probes: vec![model::Probe::TcpSocketRead],
                opened_ns: step + 3 * SEC,
                evidence_json: String::new(),
                stages_json: String::new(),
            })
            .unwrap();
        let mut closed = inc.clone();
        store.close_incident(&mut closed, step + 610 * SEC).unwrap();
        let recorded = vec![Recorded {
            id: inc.id,
            opened: fmt_time(inc.opened_ns),
            closed: closed.closed_ns.map(fmt_time),
            state: IncidentState::Closed,
            probes: "tcp-socket-read".into(),
            verdict: Some(Verdict::FalseAlarm),
            opened_ns: inc.opened_ns,
            closed_ns: closed.closed_ns,
        }];
        // Reopened, the history is read from its stored chunks (not a buffered one).
        drop(store);
        for res in [1, 10, 60] {
            let db = dir.path().join("db");
            let (outcomes, rows) = tune_at(&db, from, to, res, &["min_ratio=1.25,50"], &recorded);
            assert_eq!(rows.len(), 3, "in force, then two candidates");
            let found = &outcomes[0].incidents;
            assert_eq!(found.len(), 1, "at {res}s: {found:#?}");
            let opened = ns(found[0].opened_at);
            // Opens within a few points of the step's start, windows meaning time.
            assert!(
                opened >= step && opened <= step + 3 * res * SEC + 5 * SEC,
                "at {res}s opened {}s after the step",
                (opened as i64 - step as i64) / SEC as i64
            );
            let closed = ns(found[0].closed_at.unwrap());
            let lasted = (closed - opened) / SEC;
            assert!((500..=1000).contains(&lasted), "at {res}s lasted {lasted}s");
            assert_eq!(rows[0].score.kept, 1);
            assert!(rows[0].score.matches[0].delay_s.unwrap().abs() <= 3.0 * res as f64 + 5.0);
            assert_eq!(rows[1].score.incidents, 1, "min_ratio=1.25 is the default");
            assert_eq!(rows[2].score.incidents, 0, "at {res}s");
            assert_eq!(
                (
                    rows[2].score.false_alarms_dropped,
                    rows[2].score.false_alarms
                ),
                (1, 1)
            );
            assert_eq!(rows[0].score.false_alarms_dropped, 0);
        }
    }

    #[test]
    fn a_history_gap_before_a_missed_incident_is_named_as_a_restart() {
        let seen: Vec<u64> = [1, 2, 3, 50, 51].into_iter().map(|t| t * SEC).collect();
        let g = scoring::gaps(&seen, SEC);
        assert_eq!(g, vec![(3 * SEC, 50 * SEC)]);
        let mut r = Recorded {
            id: 1,
            opened: String::new(),
            closed: None,
            state: IncidentState::Closed,
            probes: String::new(),
            verdict: None,
            opened_ns: 51 * SEC,
            closed_ns: None,
        };
        assert!(why_missed(&r, &g).contains("restarted"));
        r.opened_ns = 2 * SEC;
        assert!(why_missed(&r, &g).contains("reloaded"));
        r.state = IncidentState::Interrupted;
        assert!(why_missed(&r, &g).contains("stopped"));
    }

    #[test]
    fn an_emitted_block_and_bad_ranges_are_refused_with_one_line() {
        let c = DetectorConfig::default();
        let cands = candidates(&c, "web", &["window=10s".into()], &[]).unwrap();
        let block = emit_block("web", &cands[1].overrides);
        assert!(block.starts_with("[detector.services.web]\n"), "{block}");
        let parsed: toml::Table = block.parse().unwrap();
        assert_eq!(
            parsed["detector"]["services"]["web"]["window"].as_str(),
            Some("10s")
        );

        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
        let p = |service: &str, from: u64, to: u64, res: Option<u64>| HistoryParams {
            service: service.into(),
            probe: None,
            from_ns: from,
            to_ns: to,
            resolution_ms: res,
        };
        let now = 2_000 * SEC;
        let e = |p: HistoryParams| query::history(&store, &p, now).unwrap_err().to_string();
        assert!(e(p("web", 0, now, None)).contains("no histogram history"));
        let mut h = model::Histogram::new();
        h.record(1000);
        store
            .record_history("web", model::Probe::IpStart, now - 10 * SEC, &h)
            .unwrap();
        assert!(e(p("api", 0, now, None))
            .contains("no history for service \"api\" (services with history: web)"));
        assert!(e(p("web", now, now, None)).contains("empty time range"));
        assert!(e(p("web", 0, now, Some(5000))).contains("kept: 1s, 10s, 1m"));
    }
}
