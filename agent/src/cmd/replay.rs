//! `tailtrap replay FILE`: run the detector over a recorded histogram series (JSON Lines, see
//! docs/replay-format.md) and print the incidents it finds.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use detector::event::Incident;
use detector::replay::{format_time, Record, Replayer};
use detector::{Detector, DetectorConfig};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::output::{fmt_ns, table};

/// Arguments of `tailtrap replay`.
#[derive(clap::Args)]
pub struct Args {
    /// The series: JSON Lines, one interval of one (service, probe) per line; `-` reads stdin.
    file: PathBuf,
    /// Take detector settings from the `[detector]` table of this config file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// One JSON object per incident instead of a table.
    #[arg(long)]
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
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            DetectorConfig::from_toml_str(&text, &path.display().to_string())?
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
    let progress = progress_bar(len);
    let reader = BufReader::new(progress.wrap_read(input));

    let mut replayer = Replayer::new(Detector::new(config));
    let mut lines = 0u64;
    let mut bad = 0u64;
    let mut first_bad: Option<String> = None;
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading {name} at line {}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        lines += 1;
        let fed = Record::parse(&line).and_then(|rec| replayer.push(&rec));
        if let Err(e) = fed {
            let msg = format!("{name}:{}: {e}", n + 1);
            if !args.skip_bad {
                progress.finish_and_clear();
                bail!("{msg} (use --skip-bad to skip bad lines)");
            }
            bad += 1;
            first_bad.get_or_insert(msg);
        }
    }
    progress.finish_and_clear();
    let (incidents, _) = replayer.finish();

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
        writeln!(out, "{}", incident_table(&incidents))?;
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

fn incident_table(incidents: &[Incident]) -> comfy_table::Table {
    let mut t = table([
        "service", "probes", "opened", "closed", "quantile", "baseline", "observed", "ratio",
        "p-value", "stage",
    ]);
    for i in incidents {
        let h = &i.headline;
        t.add_row([
            i.service.clone(),
            i.probes
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(" "),
            format_time(i.opened_at),
            i.closed_at.map_or("open".into(), format_time),
            format!("p{}", h.quantile * 100.0),
            fmt_ns(h.baseline.value_ns),
            fmt_ns(h.observed.value_ns),
            format!("x{:.2}", h.ratio),
            h.p_value.map_or("SLO".into(), |p| format!("{p:.1e}")),
            i.stage.as_ref().map_or("-".into(), |s| s.verdict.clone()),
        ]);
    }
    t
}

/// A byte-progress bar on stderr, hidden when stderr is not a terminal.
fn progress_bar(len: Option<u64>) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template(
        "{spinner} replaying {bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
