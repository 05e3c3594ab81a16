//! `tailtrap simulate` (being built; see its issue).

use std::process::ExitCode;

/// Arguments of `tailtrap simulate`.
#[derive(clap::Args)]
pub struct Args {}

/// Run `tailtrap simulate`.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tailtrap simulate` is not built yet")
}
