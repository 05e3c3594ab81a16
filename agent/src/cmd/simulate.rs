//! `tailtrap simulate SCENARIO.toml`: write a synthetic histogram series (the replay format)
//! from a scenario file, to try detector settings with `tailtrap replay`.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use detector::scenario::Scenario;
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `tailtrap simulate`.
#[derive(clap::Args)]
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
    let text = std::fs::read_to_string(&args.scenario).with_context(|| format!("reading {name}"))?;
    let scenario = Scenario::from_toml_str(&text, &name)?;
    let sink: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        ),
        None => Box::new(io::stdout().lock()),
    };
    let mut out = BufWriter::new(sink);

    let progress = if io::stderr().is_terminal() {
        let bar = ProgressBar::new(scenario.intervals());
        bar.set_style(
            ProgressStyle::with_template("simulating {pos}/{len} intervals {wide_bar} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let written = write_series(&scenario, &mut out, &progress);
    progress.finish_and_clear();
    match written {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e).context("writing the series"),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

fn write_series(scenario: &Scenario, out: &mut impl Write, progress: &ProgressBar) -> io::Result<()> {
    for interval in scenario.generate() {
        for rec in &interval {
            out.write_all(rec.to_json_line().as_bytes())?;
            out.write_all(b"\n")?;
        }
        progress.inc(1);
    }
    out.flush()
}
