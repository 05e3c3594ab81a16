//! `tailtrap replay FILE`: run the detector over a recorded histogram series (JSON Lines, see
//! docs/replay-format.md) and print the incidents it finds.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use detector::event::Incident;
use detector::replay::{format_time, Record, Replayer};
use detector::{Detector, DetectorConfig};
use serde::Serialize;

use crate::cmd::shared::{progress, replayed_incidents};
use crate::source::Target;

/// Arguments of `tailtrap replay`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The series: JSON Lines, one interval of one (service, probe) per line; `-` reads stdin.
    file: PathBuf,
    /// The global `--config`: detector settings from its `[detector]` table.
    #[arg(skip)]
    config: Option<PathBuf>,
    /// The global `--json`: one JSON object per incident instead of a table.
    #[arg(skip)]
    json: bool,
    /// Count bad lines and go on (reported at the end) instead of stopping at the first.
    #[arg(long)]
    skip_bad: bool,
}

/// One incident as `--json` prints it.
#[derive(Serialize)]
struct IncidentLine<'a> {
    service: &'a str,
    probes: Vec<&'static str>,
    opened_at: String,
    closed_at: Option<String>,
    quantile: f64,
    baseline_ns: f64,
    observed_ns: f64,
    p_value: Option<f64>,
    stage: Option<&'a str>,
}

impl<'a> From<&'a Incident> for IncidentLine<'a> {
    fn from(i: &'a Incident) -> Self {
        IncidentLine {
            service: &i.service,
            probes: i.probes.iter().map(|p| p.name()).collect(),
            opened_at: format_time(i.opened_at),
            closed_at: i.closed_at.map(format_time),
            quantile: i.headline.quantile,
            baseline_ns: i.headline.baseline.value_ns,
            observed_ns: i.headline.observed.value_ns,
            p_value: i.headline.p_value,
            stage: i.stage.as_ref().map(|s| s.verdict.as_str()),
        }
    }
}

/// Run `tailtrap replay`.
pub fn run(mut args: Args, target: &Target, json: bool) -> anyhow::Result<ExitCode> {
    args.config = target.config_path().map(Into::into);
    args.json = json;
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            crate::config::parse_table::<DetectorConfig>(
                &text,
                &path.display().to_string(),
                "detector",
            )?
        }
        None => DetectorConfig::default(),
    };
    let name = args.file.display().to_string();
    let (input, len): (Box<dyn Read>, Option<u64>) = if name == "-" {
        (Box::new(io::stdin().lock()), None)
    } else {
        let f = File::open(&args.file).with_context(|| format!("opening {name}"))?;
        let len = f.metadata().ok().map(|m| m.len());
        (Box::new(f), len)
    };
    let progress = progress::bar(
        len,
        "{spinner} replaying {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}",
    );
    let replayed = replay(
        BufReader::new(progress.wrap_read(input)),
        &name,
        config,
        args.skip_bad,
    );
    progress.finish_and_clear();
    let Replayed {
        incidents,
        notices,
        lines,
        bad,
        first_bad,
    } = replayed?;

    let stdout = io::stdout();
    let mut out = stdout.lock();
    if args.json {
        for i in &incidents {
            serde_json::to_writer(&mut out, &IncidentLine::from(i))?;
            writeln!(out)?;
        }
    } else if incidents.is_empty() {
        writeln!(out, "no incidents in {lines} lines")?;
    } else {
        writeln!(out, "{}", replayed_incidents::table(&incidents))?;
    }
    if !args.json && notices > 0 {
        writeln!(
            out,
            "{notices} smaller shift(s) noticed, not incidents (below incident_ratio, \
             shorter than notice_for)"
        )?;
    }
    out.flush()?;
    if bad > 0 {
        eprintln!(
            "tailtrap: skipped {bad} bad line(s) of {lines}; first: {}",
            first_bad.unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What a replay found.
struct Replayed {
    incidents: Vec<Incident>,
    /// Small shifts noticed and let be (below `incident_ratio`, shorter than `notice_for`).
    notices: usize,
    /// Non-blank lines read.
    lines: u64,
    /// Lines skipped as bad (only with `skip_bad`).
    bad: u64,
    /// The first bad line's message.
    first_bad: Option<String>,
}

/// Feed every line of `input` through a detector built from `config`. A bad line stops the
/// replay with `name:line: reason`, or with `skip_bad` is counted and skipped.
fn replay(
    input: impl BufRead,
    name: &str,
    config: DetectorConfig,
    skip_bad: bool,
) -> anyhow::Result<Replayed> {
    let mut replayer = Replayer::new(Detector::new(config));
    let mut lines = 0u64;
    let mut bad = 0u64;
    let mut first_bad: Option<String> = None;
    for (n, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("reading {name} at line {}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        lines += 1;
        let fed = Record::parse(&line).and_then(|rec| replayer.push(&rec));
        if let Err(e) = fed {
            let msg = format!("{name}:{}: {e}", n + 1);
            if !skip_bad {
                bail!("{msg} (use --skip-bad to skip bad lines)");
            }
            bad += 1;
            first_bad.get_or_insert(msg);
        }
    }
    replayer.end();
    let notices = replayer.notices().len();
    let (incidents, _) = replayer.finish();
    Ok(Replayed {
        incidents,
        notices,
        lines,
        bad,
        first_bad,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use detector::scenario::Scenario;

    /// Three hours of one service, its read latency five times slower for ten minutes
    /// after two hours (`tailtrap tune`'s tests use it too).
    const SCENARIO: &str = include_str!("../../testdata/step.toml");

    fn series() -> String {
        let sc = Scenario::from_toml_str(SCENARIO, "t.toml").unwrap();
        let mut text = String::new();
        for rec in sc.generate().flatten() {
            text.push_str(&rec.to_json_line());
            text.push('\n');
        }
        text
    }

    #[test]
    fn a_simulated_step_comes_back_as_one_incident() {
        let text = series();
        let r = replay(text.as_bytes(), "s.jsonl", DetectorConfig::default(), false).unwrap();
        assert_eq!(r.lines, 3 * 3600);
        assert_eq!(r.incidents.len(), 1);
        let line = serde_json::to_value(IncidentLine::from(&r.incidents[0])).unwrap();
        assert_eq!(line["service"], "web");
        assert_eq!(line["probes"][0], "tcp-socket-read");
        assert!(line["opened_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-01-05T02:00:0"));
        assert!(line["closed_at"].as_str().is_some());
        assert!(
            line["observed_ns"].as_f64().unwrap() > 3.0 * line["baseline_ns"].as_f64().unwrap()
        );
        // Field order as documented in docs/replay-format.md.
        let text = serde_json::to_string(&IncidentLine::from(&r.incidents[0])).unwrap();
        let order = [
            "service",
            "probes",
            "opened_at",
            "closed_at",
            "quantile",
            "baseline_ns",
            "observed_ns",
            "p_value",
            "stage",
        ];
        let at: Vec<usize> = order
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn bad_lines_stop_the_replay_or_are_counted() {
        let mut text = series();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.insert(3, "{\"ts\": 1}");
        lines.insert(7, "");
        text = lines.join("\n");
        let err = replay(text.as_bytes(), "s.jsonl", DetectorConfig::default(), false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("s.jsonl:4: "), "{err}");
        assert!(err.contains("--skip-bad"), "{err}");
        let r = replay(text.as_bytes(), "s.jsonl", DetectorConfig::default(), true).unwrap();
        assert_eq!((r.bad, r.lines), (1, 3 * 3600 + 1));
        assert_eq!(r.incidents.len(), 1, "the bad line changed nothing");
        assert!(r.first_bad.unwrap().starts_with("s.jsonl:4: "));
    }
}
