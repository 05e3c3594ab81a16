//! `tailtrap db ...` (being built; see the storage issue).

use std::process::ExitCode;

/// Database subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Check the database: records per tree, undecodable records, size on disk.
    Check,
}

/// Run a `tailtrap db` subcommand.
pub fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tailtrap db` is not built yet")
}
