//! `tailtrap db ...`: look at the local database directly (when no daemon holds it).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use storage::{CheckReport, Store};

use crate::output::{fmt_bytes, print_json, table};
use crate::source::Target;

/// Database subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Check the database: records per tree, undecodable records, size on disk.
    /// Exits 1 when undecodable records were found (queries skip them).
    Check(CheckArgs),
}

/// Arguments of `tailtrap db check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {}

/// Run a `tailtrap db` subcommand.
pub fn run(cmd: Command, target: &Target, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Check(CheckArgs {}) => {
            // `--db`, else the configuration's (`--config`, else the default file).
            let db = match target.db_path() {
                Some(db) => db.to_owned(),
                None => crate::config::load(target.config_path())?.daemon.db,
            };
            check(&db, json)
        }
    }
}

fn check(db: &Path, json: bool) -> anyhow::Result<ExitCode> {
    // A locked database yields the store's own message, which names the holder and says to
    // query through the daemon.
    let (store, copy) = Store::open_existing_or_copy(db)?;
    if let Some(copy) = copy {
        crate::source::say_copy(db, &copy);
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} checking {msg} records read")
            .context("progress template")?,
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let report = store
        .check(|n| bar.set_message(n.to_string()))
        .with_context(|| format!("checking {}", db.display()))?;
    bar.finish_and_clear();

    if json {
        print_json(&report)?;
    } else {
        print_report(&report);
    }
    Ok(if report.undecodable > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print_report(r: &CheckReport) {
    let mut t = table(["tree", "records", "undecodable", "bytes"]);
    for tree in &r.trees {
        t.add_row([
            tree.tree.to_string(),
            tree.records.to_string(),
            tree.undecodable.to_string(),
            fmt_bytes(tree.bytes),
        ]);
    }
    println!("{t}");
    let mut s = table(["summary", ""]);
    let rows = [
        ("database", r.path.clone()),
        (
            "schema version",
            format!(
                "{} (this build: {})",
                r.schema_version, r.supported_schema_version
            ),
        ),
        ("live data", fmt_bytes(r.live_bytes)),
        (
            "size on disk",
            format!(
                "{} ({:.1}x the live data)",
                fmt_bytes(r.size_on_disk),
                r.amplification
            ),
        ),
        (
            "incidents",
            format!(
                "{} open, {} closed, {} interrupted",
                r.incidents_open, r.incidents_closed, r.incidents_interrupted
            ),
        ),
        ("undecodable records", r.undecodable.to_string()),
        (
            "damaged databases moved aside",
            r.stats.corruption_recoveries.to_string(),
        ),
        ("rotations", r.stats.rotations.to_string()),
    ];
    for (k, v) in rows {
        s.add_row([k.to_string(), v]);
    }
    println!("{s}");
    if r.undecodable > 0 {
        println!(
            "{} undecodable records: every query skips them; the rest of the data is usable.",
            r.undecodable
        );
    }
}
