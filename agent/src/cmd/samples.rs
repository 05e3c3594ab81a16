//! `tailtrap samples ID [--probe P] [--flow 'dport=443 saddr=10.0.0.5'] [--min-latency 2ms]
//! [--limit N]`: an incident's slow-SKB samples.

use std::process::ExitCode;
use std::time::Duration;

use model::Probe;

use crate::api::query::SamplesParams;
use crate::output::{fmt_ns, fmt_time, print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap samples`.
#[derive(clap::Args)]
pub struct Args {
    /// The incident id.
    id: u64,
    /// Only this probe (e.g. `tcp-socket-read`).
    #[arg(long, value_parser = parse_probe)]
    probe: Option<Probe>,
    /// Only flows matching all of these `key=value` words: saddr, daddr, sport, dport,
    /// proto (e.g. `'dport=443 saddr=10.0.0.5'`).
    #[arg(long, value_parser = check_flow)]
    flow: Option<String>,
    /// Only samples at least this slow (e.g. `2ms`).
    #[arg(long, value_parser = humantime::parse_duration)]
    min_latency: Option<Duration>,
    /// At most this many, oldest first.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: Target,
}

fn parse_probe(s: &str) -> Result<Probe, String> {
    Probe::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Probe::ALL.iter().map(|p| p.name()).collect();
        format!("unknown probe {s:?} (one of {})", names.join(", "))
    })
}

fn check_flow(s: &str) -> Result<String, String> {
    s.parse::<storage::FlowFilter>()?;
    Ok(s.to_owned())
}

/// Run `tailtrap samples`.
pub fn run(args: Args, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(&args.target, verbose).await?;
        let params = SamplesParams {
            probe: args.probe,
            flow: args.flow,
            min_latency_ns: args
                .min_latency
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            after_time_ns: None,
            after_seq: None,
            limit: args.limit,
        };
        let page = source.samples(args.id, &params).await?;
        if args.json {
            print_json(&page)?;
            return Ok(ExitCode::SUCCESS);
        }
        if page.samples.is_empty() {
            println!("no samples of incident {} match", args.id);
            return Ok(ExitCode::SUCCESS);
        }
        let mut t = table([
            "time", "probe", "latency", "flow", "process", "cpu", "queue", "flags",
        ]);
        for s in &page.samples {
            let process = match s.pid {
                Some(pid) => format!("{} [{pid}]", s.comm),
                None => "-".into(),
            };
            let queue = s
                .socket_queue
                .map_or_else(|| "-".into(), |q| format!("{} skbs, {} B", q.skbs, q.bytes));
            t.add_row([
                fmt_time(s.time_ns),
                s.probe.to_string(),
                fmt_ns(s.latency_ns as f64),
                s.flow.to_string(),
                process,
                s.cpu.to_string(),
                queue,
                s.flags.names().collect::<Vec<_>>().join(","),
            ]);
        }
        println!("{t}");
        if page.next.is_some() {
            println!("(more samples: raise --limit)");
        }
        Ok(ExitCode::SUCCESS)
    })
}
