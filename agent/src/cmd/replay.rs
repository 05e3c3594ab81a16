//! `tailtrap replay` (being built; see its issue).

use std::process::ExitCode;

/// Arguments of `tailtrap replay`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `tailtrap replay`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tailtrap replay` is not built yet")
}
