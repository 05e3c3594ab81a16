//! `tailtrap run`: the daemon (see `crate::daemon`).

use std::process::ExitCode;

use crate::source::Target;

/// Arguments of `tailtrap run`: only the global `--config` (default:
/// /etc/tailtrap/tailtrap.toml, or the built-in defaults when it does not exist).
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Run the daemon until SIGTERM or SIGINT.
pub fn run(_args: Args, target: &Target) -> anyhow::Result<ExitCode> {
    crate::daemon::run(target.config_path().map(Into::into))?;
    Ok(ExitCode::SUCCESS)
}
