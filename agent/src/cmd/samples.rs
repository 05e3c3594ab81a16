//! `tailtrap samples ID [--probe P] [--flow 'dport=443 saddr=10.0.0.5'] [--min-latency 2ms]
//! [--limit N] [--by-time]`: an incident's slow-SKB samples, slowest first.

use std::process::ExitCode;
use std::time::Duration;

use model::Probe;

use crate::api::query::{SampleOrder, SamplesParams};
use crate::cmd::shared::timelines::print_slowest_timelines;
use crate::output::{fmt_ns, fmt_time, print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap samples`.
#[derive(clap::Args, Debug)]
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
    /// At most this many, slowest first (with `--by-time`, oldest first).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// In time order, oldest first, instead of slowest first.
    #[arg(long)]
    by_time: bool,
    /// Only samples with a pwru timeline (their packet was traced by the incident's
    /// pwru session).
    #[arg(long)]
    with_timeline: bool,
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
pub fn run(args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(target, verbose).await?;
        let params = SamplesParams {
            probe: args.probe,
            flow: args.flow,
            min_latency_ns: args
                .min_latency
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            after_time_ns: None,
            after_seq: None,
            after_latency_ns: None,
            order: if args.by_time {
                SampleOrder::Time
            } else {
                SampleOrder::Slowest
            },
            limit: args.limit,
            with_timeline: args.with_timeline,
        };
        // The API's answer, joined there: `--json` prints it as it came.
        let page = source.samples(args.id, &params).await?;
        if json {
            print_json(&page)?;
            return Ok(ExitCode::SUCCESS);
        }
        if page.samples.is_empty() {
            println!("no samples of incident {} match", args.id);
            return Ok(ExitCode::SUCCESS);
        }
        let mut t = table([
            "#",
            "time",
            "probe",
            "latency",
            "flow",
            "process",
            "cpu",
            "rx queue",
            "queue",
            "reader wait",
            "flags",
            "pwru",
        ]);
        for (i, joined) in page.samples.iter().enumerate() {
            let (s, timeline) = (&joined.sample, &joined.pwru_timeline);
            let process = match s.pid {
                Some(pid) => format!("{} [{pid}]", s.comm),
                None => "-".into(),
            };
            let queue = s
                .socket_queue
                .map_or_else(|| "-".into(), |q| format!("{} skbs, {} B", q.skbs, q.bytes));
            let pwru = timeline.as_ref().map_or_else(
                || "-".to_owned(),
                |t| format!("{} events, skb {:#x}", t.steps.len(), t.skb),
            );
            t.add_row([
                (i + 1).to_string(),
                fmt_time(s.time_ns),
                s.probe.to_string(),
                fmt_ns(s.latency_ns as f64),
                s.flow.to_string(),
                process,
                s.cpu.to_string(),
                rx_queue_text(s),
                queue,
                reader_wait_text(s),
                s.flags.names().collect::<Vec<_>>().join(","),
                pwru,
            ]);
        }
        println!("{t}");
        if page.next.is_some() {
            println!("(more samples: raise --limit)");
        }
        println!("\n{}", page.pwru_timelines.note);
        print_slowest_timelines(&page.samples, |i| format!("sample #{}", i + 1));
        Ok(ExitCode::SUCCESS)
    })
}

/// `if 4 rx-3`: the device (its index in the sample's namespace) and the RX queue the
/// packet came in on; `-` where the driver recorded none.
fn rx_queue_text(s: &model::Sample) -> String {
    s.rx_queue
        .map_or_else(|| "-".into(), |q| format!("if {} rx-{q}", s.ifindex))
}

/// `runq 81 %, off 4 %, cpu held by sh [88]`: where the reader was while the packet
/// waited; `-` without the split.
fn reader_wait_text(s: &model::Sample) -> String {
    let Some(w) = &s.reader_wait else {
        return "-".into();
    };
    let share = |ns: u64| {
        if s.latency_ns == 0 {
            0.0
        } else {
            ns as f64 * 100.0 / s.latency_ns as f64
        }
    };
    let mut text = format!(
        "runq {:.0} %, off {:.0} %",
        share(w.runq_ns),
        share(w.off_cpu_ns)
    );
    if let Some(h) = w.cpu_holder.filter(|h| h.pid != 0 && w.runq_ns > 0) {
        text.push_str(&format!(", cpu held by {} [{}]", h.comm, h.pid));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rx_queue_column_names_the_device_and_queue_or_shows_none() {
        let mut s = model::fixtures::sample(1, 0, 1_000);
        assert_eq!(rx_queue_text(&s), "-");
        s.rx_queue = Some(0);
        s.ifindex = 4;
        assert_eq!(rx_queue_text(&s), "if 4 rx-0");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["rx_queue"], 0);
        s.rx_queue = None;
        assert_eq!(
            serde_json::to_value(&s).unwrap()["rx_queue"],
            serde_json::Value::Null
        );
    }
}
