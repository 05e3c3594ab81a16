//! The `tailtrap` command: a thin front end; each subcommand lives in its own module under
//! `cmd/` with its `Args` and `run()`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod allocator;
mod api;
mod cli;
mod cmd;
mod config;
mod daemon;
#[cfg(test)]
mod fixtures;
mod metrics;
mod otlp;
mod output;
mod source;

#[derive(Parser)]
#[command(
    name = "tailtrap",
    version,
    about = "Receive-path latency: always-on histograms, tail-shift detection, deep capture"
)]
#[derive(Debug)]
struct Cli {
    /// `--config`, `--socket`, `--db`, `--json`, `-v`: anywhere on the command line.
    #[command(flatten)]
    global: cli::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon: measure, detect, capture, serve the local API.
    Run(cmd::run::Args),
    /// Check a configuration file, or print the built-in defaults.
    #[command(subcommand)]
    Config(cmd::config::Command),
    /// The daemon's probes, services, latency against baseline, incidents, capture and cost.
    Status(cmd::status::Args),
    /// List incidents, show one (`incidents show ID`) or mark one (`incidents mark ID real`).
    Incidents(cmd::incidents::Args),
    /// An incident's slow-SKB samples.
    Samples(cmd::samples::Args),
    /// An incident's pwru session and output.
    Pwru(cmd::pwru::Args),
    /// One incident as a JSON document (`tailtrap export ID > incident.json`).
    Export(cmd::export::Args),
    /// Load the probes and print live latency histograms per service and probe.
    Hist(cmd::hist::Args),
    /// A service's stored histogram history, in the replay format or summarised.
    History(cmd::history::Args),
    /// Replay a service's stored history with candidate detector settings and compare.
    Tune(cmd::tune::Args),
    /// Run the detector over a recorded histogram series (JSON Lines) and print incidents.
    Replay(cmd::replay::Args),
    /// Write a synthetic histogram series from a scenario file, for trying detector settings.
    Simulate(cmd::simulate::Args),
    /// Inspect the local database.
    #[command(subcommand)]
    Db(cmd::db::Command),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cmd::completions::Args),
    /// Print the manual page, or write every page into a directory (for packaging).
    #[command(hide = true)]
    Man(cmd::man::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon may execute itself again here (glibc reads this setting only at start).
    let thread_caches =
        matches!(cli.command, Command::Run(_)).then(allocator::turn_off_thread_caches);
    init_logging(cli.global.verbose);
    if let Some(how) = thread_caches {
        allocator::report_thread_caches(&how);
        allocator::fix_mmap_threshold();
        allocator::limit_arenas();
        allocator::start_trimming();
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tailtrap: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run the command, after refusing the global options it does not take.
fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    use cli::{Opt, READ};
    let g = cli.global;
    // -v also makes the retrieval commands say whether they used the API or the database.
    let verbose = g.verbose > 0;
    let (target, json) = (&g.target, g.json);
    match cli.command {
        Command::Run(args) => {
            g.allow("tailtrap run", &[Opt::Config])?;
            cmd::run::run(args, target)
        }
        Command::Config(c) => {
            let takes: &[Opt] = match c {
                cmd::config::Command::Check { .. } => &[Opt::Config],
                cmd::config::Command::Defaults => &[],
            };
            g.allow(&format!("tailtrap config {}", c.name()), takes)?;
            cmd::config::run(c, target)
        }
        Command::Status(args) => {
            g.allow("tailtrap status", READ)?;
            cmd::status::run(args, target, json, verbose)
        }
        Command::Incidents(args) => {
            g.allow("tailtrap incidents", READ)?;
            cmd::incidents::run(args, target, json, verbose)
        }
        Command::Samples(args) => {
            g.allow("tailtrap samples", READ)?;
            cmd::samples::run(args, target, json, verbose)
        }
        Command::Pwru(args) => {
            g.allow("tailtrap pwru", READ)?;
            cmd::pwru::run(args, target, json, verbose)
        }
        Command::Export(args) => {
            // Always JSON: `--json` is taken and changes nothing.
            g.allow("tailtrap export", READ)?;
            cmd::export::run(args, target, verbose)
        }
        Command::Hist(args) => {
            g.allow("tailtrap hist", &[Opt::Config, Opt::Json])?;
            cmd::hist::run(args, target, json)
        }
        Command::History(args) => {
            g.allow("tailtrap history", READ)?;
            cmd::history::run(args, target, json, verbose)
        }
        Command::Tune(args) => {
            g.allow("tailtrap tune", READ)?;
            cmd::tune::run(args, target, json, verbose)
        }
        Command::Replay(args) => {
            g.allow("tailtrap replay", &[Opt::Config, Opt::Json])?;
            cmd::replay::run(args, target, json)
        }
        Command::Simulate(args) => {
            g.allow("tailtrap simulate", &[])?;
            cmd::simulate::run(args)
        }
        Command::Db(c) => {
            g.allow("tailtrap db check", &[Opt::Config, Opt::Db, Opt::Json])?;
            cmd::db::run(c, target, json)
        }
        Command::Completions(args) => {
            g.allow("tailtrap completions", &[])?;
            cmd::completions::run(args)
        }
        Command::Man(args) => {
            g.allow("tailtrap man", &[])?;
            cmd::man::run(args)
        }
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "info",
        // tailtrap's own crates only: the storage engine's debug output is pages long.
        1 => "info,tailtrap=debug,bpf=debug,detector=debug,capture=debug,storage=debug",
        _ => "debug,tailtrap=trace,bpf=trace,detector=trace,capture=trace,storage=trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    // Under systemd the journal stamps each line itself.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        fmt.without_time().init();
    } else {
        fmt.init();
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{dispatch, Cli};

    /// What `args` parse to, every field shown.
    fn parsed(args: &[&str]) -> String {
        let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?} refused: {e}"));
        format!("{cli:?}")
    }

    /// Each group: one command line with its global options in every position, before the
    /// command, between a command and its subcommand, among and after the arguments.
    #[test]
    fn the_global_options_go_anywhere_on_the_command_line() {
        let groups: &[&[&[&str]]] = &[
            &[
                &["tailtrap", "--config", "/f.toml", "incidents", "show", "4"],
                &["tailtrap", "incidents", "--config", "/f.toml", "show", "4"],
                &["tailtrap", "incidents", "show", "--config", "/f.toml", "4"],
                &["tailtrap", "incidents", "show", "4", "--config", "/f.toml"],
            ],
            &[
                &[
                    "tailtrap",
                    "--json",
                    "-v",
                    "--db",
                    "/db",
                    "incidents",
                    "--socket",
                    "/s",
                    "mark",
                    "4",
                    "real",
                ],
                &[
                    "tailtrap",
                    "incidents",
                    "mark",
                    "4",
                    "real",
                    "--socket",
                    "/s",
                    "--db",
                    "/db",
                    "-v",
                    "--json",
                ],
                &[
                    "tailtrap",
                    "-v",
                    "incidents",
                    "--json",
                    "mark",
                    "--db",
                    "/db",
                    "4",
                    "--socket",
                    "/s",
                    "real",
                ],
            ],
            &[
                &[
                    "tailtrap",
                    "--json",
                    "--db",
                    "/db",
                    "incidents",
                    "--since",
                    "2026-11-28T10:00:00Z",
                ],
                &[
                    "tailtrap",
                    "incidents",
                    "--since",
                    "2026-11-28T10:00:00Z",
                    "--json",
                    "--db",
                    "/db",
                ],
            ],
            &[
                &["tailtrap", "--json", "status"],
                &["tailtrap", "status", "--json"],
            ],
            &[
                &[
                    "tailtrap", "--socket", "/s", "--json", "samples", "3", "--limit", "5",
                ],
                &[
                    "tailtrap", "samples", "--json", "3", "--limit", "5", "--socket", "/s",
                ],
            ],
            &[
                &["tailtrap", "--db", "/db", "pwru", "3", "--json"],
                &["tailtrap", "pwru", "--db", "/db", "--json", "3"],
            ],
            &[
                &["tailtrap", "--config", "/f.toml", "export", "3"],
                &["tailtrap", "export", "3", "--config", "/f.toml"],
            ],
            &[
                &[
                    "tailtrap",
                    "--json",
                    "history",
                    "web",
                    "--since",
                    "2026-11-28T10:00:00Z",
                ],
                &[
                    "tailtrap",
                    "history",
                    "web",
                    "--since",
                    "2026-11-28T10:00:00Z",
                    "--json",
                ],
            ],
            &[
                &[
                    "tailtrap",
                    "--db",
                    "/db",
                    "tune",
                    "web",
                    "--sweep",
                    "min_ratio=2,3",
                ],
                &[
                    "tailtrap",
                    "tune",
                    "web",
                    "--sweep",
                    "min_ratio=2,3",
                    "--db",
                    "/db",
                ],
            ],
            &[
                &["tailtrap", "--db", "/db", "--json", "db", "check"],
                &["tailtrap", "db", "--db", "/db", "check", "--json"],
                &["tailtrap", "db", "check", "--json", "--db", "/db"],
            ],
            &[
                &["tailtrap", "--config", "/f.toml", "config", "check"],
                &["tailtrap", "config", "--config", "/f.toml", "check"],
                &["tailtrap", "config", "check", "--config", "/f.toml"],
            ],
            &[
                &["tailtrap", "--config", "/f.toml", "run"],
                &["tailtrap", "run", "--config", "/f.toml"],
            ],
            &[
                &[
                    "tailtrap", "--json", "--config", "/f.toml", "hist", "--count", "2",
                ],
                &[
                    "tailtrap", "hist", "--count", "2", "--config", "/f.toml", "--json",
                ],
            ],
            &[
                &["tailtrap", "--config", "/f.toml", "--json", "replay", "-"],
                &["tailtrap", "replay", "--json", "-", "--config", "/f.toml"],
            ],
        ];
        for group in groups {
            let first = parsed(group[0]);
            for (flag, value) in [("--config", "/f.toml"), ("--db", "/db"), ("--socket", "/s")] {
                if group[0].contains(&flag) {
                    assert!(first.contains(value), "{:?}: {first}", group[0]);
                }
            }
            assert_eq!(
                first.contains("json: true"),
                group[0].contains(&"--json"),
                "{first}"
            );
            for args in &group[1..] {
                assert_eq!(parsed(args), first, "{args:?} against {:?}", group[0]);
            }
        }
    }

    /// A global option a command has no use for is refused by name, before the command
    /// does anything.
    #[test]
    fn a_command_refuses_a_global_option_it_does_not_take() {
        for (args, refused) in [
            (&["tailtrap", "--socket", "/s", "hist"][..], "--socket"),
            (&["tailtrap", "simulate", "x.toml", "--json"], "--json"),
            (&["tailtrap", "--db", "/db", "completions", "bash"], "--db"),
            (
                &["tailtrap", "config", "defaults", "--config", "/f.toml"],
                "--config",
            ),
            (&["tailtrap", "run", "--db", "/db"], "--db"),
            (&["tailtrap", "replay", "-", "--socket", "/s"], "--socket"),
        ] {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let err = dispatch(cli).expect_err("refused").to_string();
            assert!(
                err.starts_with(&format!("{refused} means nothing to")),
                "{args:?}: {err}"
            );
        }
    }
}
