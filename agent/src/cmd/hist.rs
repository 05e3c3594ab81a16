//! `tailtrap hist`: load the probes and print per-interval latency histograms per service
//! and probe until Ctrl-C or `--count` intervals.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use bpf::{AttachMethod, Attachment, ProbeSet, Snapshot};
use model::hist::QuantileEstimate;
use model::{Histogram, Probe};
use serde::Serialize;

use crate::output::{fmt_ns, table};
use crate::source::Target;

/// Quantiles shown per row.
const QUANTILES: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p99.9")];
/// The bar shows one cell per power of two from 2^BAR_FIRST_LOG2 ns (256 ns) to 2^BAR_LAST_LOG2
/// (~1.07 s); values outside fall into the end cells.
const BAR_FIRST_LOG2: i32 = 8;
const BAR_LAST_LOG2: i32 = 30;
const BAR_LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Arguments of `tailtrap hist`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Length of one interval (e.g. `1s`, `500ms`).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Stop after this many intervals (default: run until Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) {
        return Err("the interval must be at least 10ms".into());
    }
    Ok(d)
}

/// Run `tailtrap hist`.
pub fn run(args: Args, target: &Target, json: bool) -> anyhow::Result<ExitCode> {
    let mut config = match target.config_path() {
        Some(path) => crate::config::load_probe_config(path)?,
        None => bpf::ProbeConfig::default(),
    };
    config.nic_to_stack_unavailable =
        crate::daemon::nic_to_stack_unavailable(config.hw_rx_timestamps);
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    spinner.enable_steady_tick(Duration::from_millis(100));
    let loaded = ProbeSet::load(&config, &mut |step| {
        spinner.set_message(step.to_owned());
        tracing::debug!("{step}");
    });
    spinner.finish_and_clear();
    let mut probes = loaded.context("cannot start the probes")?;

    let mut out = std::io::stdout().lock();
    if !json {
        print_attachments(&mut out, probes.attachments())?;
    }
    // Once, on stderr: the stand-ins hold for the whole run, and stdout stays one table (or
    // one JSON object) per interval.
    for m in probes.missing_features() {
        eprintln!("note: {m}");
    }
    let mut prev: HashMap<(String, Probe), Histogram> = HashMap::new();
    let mut prev_devices: HashMap<(u32, u32), Histogram> = HashMap::new();
    let mut prev_time = Instant::now();
    let mut done = 0u64;
    while args.count.is_none_or(|n| done < n) {
        std::thread::sleep(args.interval);
        probes.refresh_clock()?;
        let snapshot = probes.snapshot()?;
        let now = Instant::now();
        let rows = interval_rows(&snapshot, &mut prev);
        let devices = device_rows(&snapshot, &mut prev_devices);
        let elapsed = now.duration_since(prev_time);
        prev_time = now;
        if json {
            let line = IntervalJson {
                time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                interval_s: elapsed.as_secs_f64(),
                attachments: probes.attachments(),
                hists: rows.iter().map(RowJson::from).collect(),
                devices: devices
                    .iter()
                    .map(|r| DeviceJson {
                        device: &r.service,
                        row: RowJson {
                            service: "",
                            ..RowJson::from(r)
                        },
                    })
                    .collect(),
                counters: snapshot.counters,
            };
            serde_json::to_writer(&mut out, &line)?;
            writeln!(out)?;
        } else {
            print_interval(&mut out, &rows, &snapshot, probes.attachments(), elapsed)?;
            print_devices(&mut out, &devices, probes.attachments())?;
        }
        out.flush()?;
        done += 1;
    }
    Ok(ExitCode::SUCCESS)
}

/// One (service, probe) histogram of the last interval.
struct Row {
    service: String,
    probe: Probe,
    hist: Histogram,
}

/// Interval deltas of the cumulative snapshot; remembers the snapshot for the next call.
fn interval_rows(snapshot: &Snapshot, prev: &mut HashMap<(String, Probe), Histogram>) -> Vec<Row> {
    let hists = snapshot.hists.iter().map(|sh| {
        let key = (sh.service.clone(), sh.probe);
        (key, &sh.service, sh.probe, &sh.hist)
    });
    deltas(hists, prev)
}

/// driver-to-completion per device in the interval (the service column names the device).
fn device_rows(snapshot: &Snapshot, prev: &mut HashMap<(u32, u32), Histogram>) -> Vec<Row> {
    let hists = snapshot.devices.iter().map(|d| {
        let key = (d.ifindex, d.netns);
        (key, &d.device, Probe::DriverToCompletion, &d.hist)
    });
    let rows = deltas(hists, prev);
    prev.retain(|key, _| {
        snapshot
            .devices
            .iter()
            .any(|d| (d.ifindex, d.netns) == *key)
    });
    rows
}

/// The rows of the histograms that moved since `prev`, which then holds these.
fn deltas<'a, K: std::hash::Hash + Eq>(
    hists: impl Iterator<Item = (K, &'a String, Probe, &'a Histogram)>,
    prev: &mut HashMap<K, Histogram>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (key, name, probe, hist) in hists {
        let delta = match prev.get(&key) {
            Some(p) => hist.delta_since(p).hist,
            None => hist.clone(),
        };
        prev.insert(key, hist.clone());
        if !delta.is_empty() {
            rows.push(Row {
                service: name.clone(),
                probe,
                hist: delta,
            });
        }
    }
    rows
}

fn short_method(attachments: &[Attachment], probe: Probe) -> &'static str {
    match attachments
        .iter()
        .find(|a| a.probe == probe)
        .map(|a| &a.method)
    {
        Some(AttachMethod::Fentry { .. }) => "fentry",
        Some(AttachMethod::TpBtf { .. }) => "tp_btf",
        _ => "-",
    }
}

fn print_attachments(out: &mut impl Write, attachments: &[Attachment]) -> std::io::Result<()> {
    let mut t = table(["probe", "attach method"]);
    for a in attachments {
        t.add_row([a.probe.to_string(), a.method.to_string()]);
    }
    writeln!(out, "{t}")
}

fn fmt_quantile(q: Option<QuantileEstimate>) -> String {
    match q {
        None => "-".into(),
        Some(q) if q.upper_ns == u64::MAX => format!("≥{}", fmt_ns(q.lower_ns as f64)),
        Some(q) => format!(
            "{} [{}, {})",
            fmt_ns(q.value_ns),
            fmt_ns(q.lower_ns as f64),
            fmt_ns(q.upper_ns as f64)
        ),
    }
}

/// One cell per power of two, height relative to the row's fullest cell.
fn bar(hist: &Histogram) -> String {
    let cells = (BAR_LAST_LOG2 - BAR_FIRST_LOG2 + 1) as usize;
    let mut counts = vec![0u64; cells];
    for (k, c) in hist.to_log2() {
        let cell = (k.clamp(BAR_FIRST_LOG2, BAR_LAST_LOG2) - BAR_FIRST_LOG2) as usize;
        counts[cell] += c;
    }
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    counts
        .iter()
        .map(|&c| {
            if c == 0 {
                BAR_LEVELS[0]
            } else {
                // Any sample shows at least the lowest block.
                let level = 1 + (c * (BAR_LEVELS.len() as u64 - 2) / max) as usize;
                BAR_LEVELS[level.min(BAR_LEVELS.len() - 1)]
            }
        })
        .collect()
}

fn print_interval(
    out: &mut impl Write,
    rows: &[Row],
    snapshot: &Snapshot,
    attachments: &[Attachment],
    elapsed: Duration,
) -> std::io::Result<()> {
    let t = rows_table("service", rows, attachments);
    let c = snapshot.counters;
    writeln!(
        out,
        "── {} ({:.2}s) ──",
        humantime::format_rfc3339_seconds(SystemTime::now()),
        elapsed.as_secs_f64()
    )?;
    if rows.is_empty() {
        writeln!(out, "no samples in this interval")?;
    } else {
        writeln!(out, "{t}")?;
    }
    writeln!(
        out,
        "since start: map-full drops {}, zero stamps {}, future stamps {}, head-of-line excluded {}, auto-service overflow {}",
        c.map_full_drops, c.zero_tstamp, c.future_tstamp, c.hol_excluded, c.auto_overflow
    )
}

/// The devices' driver-to-completion rows, when any device completed a transmit.
fn print_devices(
    out: &mut impl Write,
    rows: &[Row],
    attachments: &[Attachment],
) -> std::io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(out, "{}", rows_table("device", rows, attachments))
}

fn rows_table(first: &str, rows: &[Row], attachments: &[Attachment]) -> comfy_table::Table {
    let mut header = vec![first, "probe", "via", "count", "mean"];
    header.extend(QUANTILES.iter().map(|(_, name)| *name));
    header.push("log2 histogram 256ns…1s");
    let mut t = table(header);
    for r in rows {
        let mut cells = vec![
            r.service.clone(),
            r.probe.to_string(),
            short_method(attachments, r.probe).to_owned(),
            r.hist.count().to_string(),
            r.hist.mean_ns().map_or_else(|| "-".into(), fmt_ns),
        ];
        cells.extend(
            QUANTILES
                .iter()
                .map(|(q, _)| fmt_quantile(r.hist.quantile(*q))),
        );
        cells.push(format!("|{}|", bar(&r.hist)));
        t.add_row(cells);
    }
    t
}

#[derive(Serialize)]
struct IntervalJson<'a> {
    time: String,
    interval_s: f64,
    attachments: &'a [Attachment],
    hists: Vec<RowJson<'a>>,
    /// driver-to-completion per device.
    devices: Vec<DeviceJson<'a>>,
    counters: bpf::Counters,
}

#[derive(Serialize)]
struct RowJson<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    service: &'a str,
    probe: Probe,
    count: u64,
    mean_ns: Option<f64>,
    quantiles: Vec<QuantileEstimate>,
    hist: &'a Histogram,
}

/// A device's row: its name, then the row's figures (`service` left out).
#[derive(Serialize)]
struct DeviceJson<'a> {
    device: &'a str,
    #[serde(flatten)]
    row: RowJson<'a>,
}

impl<'a> From<&'a Row> for RowJson<'a> {
    fn from(r: &'a Row) -> Self {
        RowJson {
            service: &r.service,
            probe: r.probe,
            count: r.hist.count(),
            mean_ns: r.hist.mean_ns(),
            quantiles: QUANTILES
                .iter()
                .filter_map(|(q, _)| r.hist.quantile(*q))
                .collect(),
            hist: &r.hist,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_marks_occupied_powers_of_two() {
        let mut h = Histogram::new();
        h.record_n(300, 8); // 2^8 cell
        h.record(1 << 20); // 2^20 cell
        h.record(10); // below range: first cell
        let b: Vec<char> = bar(&h).chars().collect();
        assert_eq!(b.len(), (BAR_LAST_LOG2 - BAR_FIRST_LOG2 + 1) as usize);
        assert_eq!(b[0], '█');
        assert_ne!(b[12], ' ');
        assert!(b
            .iter()
            .enumerate()
            .all(|(i, c)| i == 0 || i == 12 || *c == ' '));
    }

    #[test]
    fn rows_are_interval_deltas() {
        let mut h = Histogram::new();
        h.record(1000);
        let snap = |h: &Histogram| Snapshot {
            hists: vec![bpf::ServiceHist {
                service: "host".into(),
                slot: bpf::HOST_SLOT,
                probe: Probe::TcpStart,
                hist: h.clone(),
            }],
            devices: Vec::new(),
            counters: bpf::Counters::default(),
            retired: Vec::new(),
        };
        let mut prev = HashMap::new();
        assert_eq!(interval_rows(&snap(&h), &mut prev)[0].hist.count(), 1);
        assert!(interval_rows(&snap(&h), &mut prev).is_empty());
        h.record_n(2000, 3);
        let rows = interval_rows(&snap(&h), &mut prev);
        assert_eq!(rows[0].hist.count(), 3);
        assert_eq!(rows[0].hist.sum_ns(), 6000);
    }

    #[test]
    fn interval_flag_is_checked() {
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("1ms").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
