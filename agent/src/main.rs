//! The `tailtrap` command: a thin front end; each subcommand lives in its own module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tailtrap",
    version,
    about = "Receive-path latency: histograms, tail-shift detection, deep capture"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
