//! `tailtrap run`: the daemon (see `crate::daemon`).

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `tailtrap run`.
#[derive(clap::Args)]
pub struct Args {
    /// Configuration file (default: /etc/tailtrap/tailtrap.toml, or the built-in defaults
    /// when it does not exist).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Run the daemon until SIGTERM or SIGINT.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    crate::daemon::run(args.config)?;
    Ok(ExitCode::SUCCESS)
}
