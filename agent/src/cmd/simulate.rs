//! `tailtrap simulate SCENARIO.toml`: write a synthetic histogram series (the replay format)
//! from a scenario file, to try detector settings with `tailtrap replay`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use detector::scenario::Scenario;
use indicatif::ProgressBar;

use crate::cmd::shared::progress;

/// Arguments of `tailtrap simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The scenario (TOML; see docs/detector.md and detector/scenarios/).
    scenario: PathBuf,
    /// Write the series here instead of to stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Run `tailtrap simulate`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.scenario.display().to_string();
    let text =
        std::fs::read_to_string(&args.scenario).with_context(|| format!("reading {name}"))?;
    let scenario = Scenario::from_toml_str(&text, &name)?;
    let sink: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(File::create(path).with_context(|| format!("creating {}", path.display()))?)
        }
        None => Box::new(io::stdout().lock()),
    };
    let mut out = BufWriter::new(sink);

    let progress = progress::bar(
        Some(scenario.intervals()),
        "simulating {pos}/{len} intervals {wide_bar} eta {eta}",
    );
    let written = write_series(&scenario, &mut out, &progress);
    progress.finish_and_clear();
    match written {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("writing the series"),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

fn write_series(
    scenario: &Scenario,
    out: &mut impl Write,
    progress: &ProgressBar,
) -> io::Result<()> {
    for interval in scenario.generate() {
        for rec in &interval {
            out.write_all(rec.to_json_line().as_bytes())?;
            out.write_all(b"\n")?;
        }
        progress.inc(1);
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use detector::replay::Record;

    #[test]
    fn every_interval_of_every_probe_becomes_a_parseable_line() {
        let text = r#"
seed = 3
start = "2026-01-05T00:00:00Z"
duration = "30s"
interval = "500ms"

[[services]]
name = "web"
rate = 100

[[services.probes]]
probe = "tcp-socket-enqueued"
latency = [{ kind = "log-normal", weight = 1, median = "20us", sigma = 0.3 }]

[[services.probes]]
probe = "tcp-socket-read"
latency = [{ kind = "log-normal", weight = 1, median = "90us", sigma = 0.3 }]
"#;
        let scenario = Scenario::from_toml_str(text, "t.toml").unwrap();
        let mut out = Vec::new();
        write_series(&scenario, &mut out, &ProgressBar::hidden()).unwrap();
        let out = String::from_utf8(out).unwrap();
        let records: Vec<Record> = out.lines().map(|l| Record::parse(l).unwrap()).collect();
        assert_eq!(records.len(), 120, "60 intervals x 2 probes");
        assert!(records.iter().all(|r| r.interval_ms == 500));
        let samples: u64 = records.iter().map(|r| r.hist.count()).sum();
        // 100/s for 30 s on each of 2 probes: 6000 expected, Poisson sd ~77
        assert!((5600..6400).contains(&samples), "{samples}");
    }
}
