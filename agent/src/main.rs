//! The `tailtrap` command: a thin front end; each subcommand lives in its own module under
//! `cmd/` with its `Args` and `run()`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod api;
mod cmd;
mod config;
mod daemon;
mod metrics;
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    // -v also makes the retrieval commands say whether they used the API or the database.
    let verbose = cli.verbose > 0;
    if matches!(cli.command, Command::Run(_)) {
        allocator::fix_mmap_threshold();
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

/// glibc malloc behaviour for the long-running daemon.
///
/// glibc keeps freed memory inside its heaps: only a free stretch at the top of an arena
/// goes back to the kernel, past a trim threshold it raises on its own up to 64 MiB. The
/// daemon frees a lot in bursts (an incident's samples and pwru output encoded and handed to
/// sled, the BTF parse of the first pwru session), and those holes stayed resident: in a
/// soak, one `malloc_trim` gave back 5.6 of 39.4 MiB of anonymous memory, and RSS ran about
/// 5 MiB lower with this thread (docs/reliability.md, "RSS"). `malloc_trim(0)` returns
/// every whole free page of every arena; it took 0.1 to 0.3 ms in the soak (1.6 ms at most).
mod allocator {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    use std::time::{Duration, Instant};

    /// How often free pages go back to the kernel: often enough that RSS follows the live
    /// heap from minute to minute, rare enough that the cost does not matter.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    const TRIM_EVERY: Duration = Duration::from_secs(30);

    /// Above this size an allocation gets pages of its own from the kernel, which go back
    /// whole when it is freed. It is glibc's starting value; setting it also stops glibc
    /// from raising it, up to 32 MiB, each time such a block is freed. Left dynamic, after
    /// the first freed sled buffer or sample batch the same sizes were carved from the heap
    /// and left holes there: in `storage/examples/sled_rss` at the soak's write rate
    /// (`--minutes 120 --rate 200`, two runs each) RSS grew 7.6 → 19.5 MiB from minute 10
    /// to 120 without this setting and 7.6 → 13.1 MiB with it.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

    /// Fix glibc's mmap threshold (see [`MMAP_THRESHOLD`]); before any thread starts.
    pub(crate) fn fix_mmap_threshold() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes a tunable of the allocator; it is called before the
        // daemon starts any thread.
        if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) } != 1 {
            tracing::warn!("cannot fix glibc's mmap threshold; RSS may grow");
        }
    }

    /// Start the thread that trims the heap. Failing to start it only loses the trimming.
    pub(crate) fn start_trimming() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Err(e) = std::thread::Builder::new()
            .name("tailtrap-trim".into())
            .spawn(trim_loop)
        {
            tracing::warn!(error = %e, "cannot start the heap trimming thread; RSS may grow");
        }
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn trim_loop() {
        loop {
            std::thread::sleep(TRIM_EVERY);
            let started = Instant::now();
            // SAFETY: malloc_trim only returns free pages to the kernel; it takes each
            // arena's lock itself and touches no memory that is in use.
            let released = unsafe { libc::malloc_trim(0) };
            tracing::trace!(
                released = released != 0,
                took_us = started.elapsed().as_micros() as u64,
                "heap trimmed"
            );
        }
    }
}
