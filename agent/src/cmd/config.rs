//! `tailtrap config check FILE` and `tailtrap config defaults`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::source::Target;

/// Configuration subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Check a configuration file: every table, key and value.
    Check {
        /// The file (or give it with `--config`).
        file: Option<PathBuf>,
    },
    /// Print the built-in defaults as a commented configuration file.
    Defaults,
}

impl Command {
    /// The subcommand's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Check { .. } => "check",
            Command::Defaults => "defaults",
        }
    }
}

/// Run a `tailtrap config` subcommand.
pub fn run(cmd: Command, target: &Target) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Check { file } => {
            let file = match (file, target.config_path()) {
                (Some(file), None) => file,
                (None, Some(config)) => config.to_owned(),
                (Some(file), Some(config)) if file == config => file,
                (Some(file), Some(config)) => anyhow::bail!(
                    "two files to check: {} and --config {}; give one",
                    file.display(),
                    config.display()
                ),
                (None, None) => {
                    anyhow::bail!("which file? `tailtrap config check FILE` (or `--config FILE`)")
                }
            };
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
