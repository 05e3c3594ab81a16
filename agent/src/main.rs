//! The `tailtrap` command: a thin front end; each subcommand lives in its own module under
//! `cmd/` with its `Args` and `run()`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod allocator;
mod api;
mod cmd;
mod config;
mod daemon;
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
struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
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
    init_logging(cli.verbose);
    // -v also makes the retrieval commands say whether they used the API or the database.
    let verbose = cli.verbose > 0;
    if let Some(how) = thread_caches {
        allocator::report_thread_caches(&how);
        allocator::fix_mmap_threshold();
        allocator::limit_arenas();
        allocator::start_trimming();
    }
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Config(c) => cmd::config::run(c),
        Command::Status(args) => cmd::status::run(args, verbose),
        Command::Incidents(args) => cmd::incidents::run(args, verbose),
        Command::Samples(args) => cmd::samples::run(args, verbose),
        Command::Pwru(args) => cmd::pwru::run(args, verbose),
        Command::Export(args) => cmd::export::run(args, verbose),
        Command::Hist(args) => cmd::hist::run(args),
        Command::History(args) => cmd::history::run(args, verbose),
        Command::Tune(args) => cmd::tune::run(args, verbose),
        Command::Replay(args) => cmd::replay::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Db(c) => cmd::db::run(c),
        Command::Completions(args) => cmd::completions::run(args),
        Command::Man(args) => cmd::man::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tailtrap: error: {e:#}");
            ExitCode::FAILURE
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

    use super::Cli;

    #[test]
    fn the_target_options_go_anywhere_on_the_command_line() {
        for args in [
            &["tailtrap", "incidents", "--config", "/f.toml", "show", "4"][..],
            &["tailtrap", "incidents", "show", "4", "--config", "/f.toml"],
            &["tailtrap", "incidents", "--db", "/db", "mark", "4", "real"],
            &[
                "tailtrap",
                "incidents",
                "--json",
                "--socket",
                "/s",
                "show",
                "4",
            ],
        ] {
            assert!(Cli::try_parse_from(args).is_ok(), "{args:?} refused");
        }
    }
}
