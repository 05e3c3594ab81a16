//! `tailtrap history SERVICE`: the stored histogram history of one service, in the replay
//! format (docs/replay-format.md) so it can be saved, shared or fed to `tailtrap replay`, or
//! summarised per probe over time buckets for humans (`--summary`, `--json`).

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use model::{Histogram, Probe};
use serde::Serialize;

use crate::api::HistoryAnswer;
use crate::cmd::shared::history_read::{read, records, Range};
use crate::output::{fmt_ns, fmt_time, print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap history`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    range: Range,
    /// Only this probe.
    #[arg(long)]
    probe: Option<Probe>,
    /// A table of quantiles over time buckets instead of the replay-format lines.
    #[arg(long)]
    summary: bool,
    /// Time buckets of the summary.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1000))]
    buckets: u32,
}

/// The default range when neither `--since` nor `--from` is given.
const DEFAULT_SPAN: Duration = Duration::from_secs(6 * 3600);

/// Run `tailtrap history`.
pub fn run(args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(target, verbose).await?;
        let params = args.range.params(args.probe, DEFAULT_SPAN);
        let h = read(&source, &params).await?;
        if json {
            print_json(&summarise(&h, args.buckets))?;
        } else if args.summary {
            print_summary(&summarise(&h, args.buckets));
        } else {
            let mut out = io::BufWriter::new(io::stdout().lock());
            for r in records(h) {
                writeln!(out, "{}", r.to_json_line())?;
            }
            out.flush()?;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The summary `--json` prints.
#[derive(Debug, Serialize)]
struct Summary {
    service: String,
    #[serde(with = "humantime_serde")]
    resolution: Duration,
    from: String,
    to: String,
    probes: Vec<ProbeSummary>,
}

#[derive(Debug, Serialize)]
struct ProbeSummary {
    probe: Probe,
    points: usize,
    buckets: Vec<Bucket>,
}

/// One time bucket of one probe: the merged histogram's quantiles.
#[derive(Debug, Serialize)]
struct Bucket {
    from: String,
    to: String,
    count: u64,
    p50_ns: Option<f64>,
    p99_ns: Option<f64>,
    p999_ns: Option<f64>,
}

fn summarise(h: &HistoryAnswer, buckets: u32) -> Summary {
    let span = h.to_ns.saturating_sub(h.from_ns).max(1);
    let n = u64::from(buckets.max(1));
    let width = span.div_ceil(n).max(1);
    let probes = h
        .series
        .iter()
        .map(|s| {
            let mut merged: Vec<Histogram> = vec![Histogram::new(); n as usize];
            for (start, hist) in &s.points {
                let i = (start.saturating_sub(h.from_ns) / width).min(n - 1) as usize;
                merged[i].merge(hist);
            }
            let buckets = merged
                .iter()
                .enumerate()
                .filter(|(_, m)| !m.is_empty())
                .map(|(i, m)| {
                    let from = h.from_ns + i as u64 * width;
                    let q = |q: f64| m.quantile(q).map(|e| e.value_ns);
                    Bucket {
                        from: fmt_time(from),
                        to: fmt_time((from + width).min(h.to_ns)),
                        count: m.count(),
                        p50_ns: q(0.5),
                        p99_ns: q(0.99),
                        p999_ns: q(0.999),
                    }
                })
                .collect();
            ProbeSummary {
                probe: s.probe,
                points: s.points.len(),
                buckets,
            }
        })
        .collect();
    Summary {
        service: h.service.clone(),
        resolution: h.resolution,
        from: fmt_time(h.from_ns),
        to: fmt_time(h.to_ns),
        probes,
    }
}

fn print_summary(s: &Summary) {
    println!(
        "{} from {} to {} at {} resolution",
        s.service,
        s.from,
        s.to,
        humantime::format_duration(s.resolution)
    );
    let mut t = table(["probe", "from", "to", "samples", "p50", "p99", "p99.9"]);
    let ns = |v: Option<f64>| v.map_or_else(|| "-".into(), fmt_ns);
    for p in &s.probes {
        for b in &p.buckets {
            t.add_row([
                p.probe.to_string(),
                b.from.clone(),
                b.to.clone(),
                b.count.to_string(),
                ns(b.p50_ns),
                ns(b.p99_ns),
                ns(b.p999_ns),
            ]);
        }
    }
    println!("{t}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProbeHistory;
    use detector::replay::Record;
    use std::time::UNIX_EPOCH;

    fn hist(v: u64, n: u64) -> Histogram {
        let mut h = Histogram::new();
        h.record_n(v, n);
        h
    }

    #[test]
    fn records_are_stamped_with_their_end_in_time_then_probe_order() {
        let s = 1_000_000_000u64;
        let h = HistoryAnswer {
            service: "web".into(),
            resolution: Duration::from_secs(10),
            from_ns: 0,
            to_ns: 100 * s,
            series: vec![
                ProbeHistory {
                    probe: Probe::TcpSocketRead,
                    points: vec![(0, hist(1000, 2)), (10 * s, hist(2000, 1))],
                },
                ProbeHistory {
                    probe: Probe::IpStart,
                    points: vec![(10 * s, hist(500, 3))],
                },
            ],
        };
        let sum = summarise(&h, 2);
        assert_eq!(sum.probes.len(), 2);
        assert_eq!(sum.probes[1].buckets.len(), 1);
        assert_eq!(sum.probes[1].buckets[0].count, 3);
        let r = records(h);
        let got: Vec<(u64, Probe, u64)> = r
            .iter()
            .map(|r| {
                let ts = r.ts.duration_since(UNIX_EPOCH).unwrap().as_secs();
                (ts, r.probe, r.hist.count())
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (10, Probe::TcpSocketRead, 2),
                (20, Probe::IpStart, 3),
                (20, Probe::TcpSocketRead, 1)
            ]
        );
        assert!(r.iter().all(|r| r.interval_ms == 10_000));
        // Every line reads back as the same record.
        for rec in &r {
            assert_eq!(&Record::parse(&rec.to_json_line()).unwrap(), rec);
        }
    }
}
