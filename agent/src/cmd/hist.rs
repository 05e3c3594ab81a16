//! `tailtrap hist` (being built; see its issue).

use std::process::ExitCode;

/// Arguments of `tailtrap hist`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `tailtrap hist`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tailtrap hist` is not built yet")
}
