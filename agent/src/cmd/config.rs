//! `tailtrap config check FILE` and `tailtrap config defaults`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Configuration subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Check a configuration file: every table, key and value.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Print the built-in defaults as a commented configuration file.
    Defaults,
}

/// Run a `tailtrap config` subcommand.
pub fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Check { file } => {
            let config = match crate::config::load(Some(&file)) {
                Ok(config) => config,
                // Every problem of the file, one line each.
                Err(e) => {
                    for line in e.lines() {
                        eprintln!("tailtrap: error: {line}");
                    }
                    return Ok(ExitCode::FAILURE);
                }
            };
            let services = config.probes.services.len();
            println!(
                "{}: ok ({} configured service{}{})",
                file.display(),
                services,
                if services == 1 { "" } else { "s" },
                if services == 0 {
                    ", sockets grouped by cgroup"
                } else {
                    ""
                }
            );
        }
        Command::Defaults => print!("{}", crate::config::defaults_toml()),
    }
    Ok(ExitCode::SUCCESS)
}
