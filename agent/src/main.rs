//! The `tailtrap` command: a thin front end; each subcommand lives in its own module under
//! `cmd/` with its `Args` and `run()`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod config;
#[allow(dead_code)] // used by the subcommands as they land
mod output;

#[derive(Parser)]
#[command(
    name = "tailtrap",
    version,
    about = "Receive-path latency: always-on histograms, tail-shift detection, deep capture"
)]
struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the probes and print live latency histograms per service and probe.
    Hist(cmd::hist::Args),
    /// Run the detector over a recorded histogram series (JSON Lines) and print incidents.
    Replay(cmd::replay::Args),
    /// Write a synthetic histogram series from a scenario file, for trying detector settings.
    Simulate(cmd::simulate::Args),
    /// Inspect the local database.
    #[command(subcommand)]
    Db(cmd::db::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Hist(args) => cmd::hist::run(args),
        Command::Replay(args) => cmd::replay::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Db(c) => cmd::db::run(c),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tailtrap: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
