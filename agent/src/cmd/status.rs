//! `tailtrap status`: the daemon's probes, services, latency against baseline, open
//! incidents, capture, pwru, BPF cost and its own CPU and memory.

use std::process::ExitCode;
use std::time::SystemTime;

use storage::IncidentState;

use crate::api::query::IncidentsParams;
use crate::api::StatusReport;
use crate::output::{fmt_bytes, fmt_ns, fmt_span, fmt_time, print_json, table};
use crate::source::{block_on, Source, Target};
use model::unix_ns;

/// Arguments of `tailtrap status`: only the global options.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Run `tailtrap status`.
pub fn run(_args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(target, verbose).await?;
        match source.status().await? {
            Some(report) if json => print_json(&report)?,
            Some(report) => print_report(&report),
            None => {
                // No daemon: what the database says is still open.
                let open = source
                    .incidents(&IncidentsParams {
                        state: Some(IncidentState::Open),
                        ..IncidentsParams::default()
                    })
                    .await?;
                if json {
                    print_json(&serde_json::json!({
                        "daemon_running": false,
                        "open_incidents": open.incidents,
                    }))?;
                } else {
                    println!("daemon: not running (read the database directly)");
                    println!("open incidents in the database: {}", open.incidents.len());
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn opt_ns(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), fmt_ns)
}

fn print_report(r: &StatusReport) {
    let now = unix_ns(SystemTime::now());
    let d = &r.daemon;
    let mut t = table(["daemon", ""]);
    t.add_row([
        "running".to_owned(),
        format!(
            "pid {}, version {}, up {} (since {})",
            d.pid,
            d.version,
            fmt_span(now.saturating_sub(d.started_ns)),
            fmt_time(d.started_ns)
        ),
    ]);
    t.add_row([
        "interval".to_owned(),
        format!(
            "{} ({} run, {} failed)",
            humantime::format_duration(d.interval),
            d.intervals,
            d.interval_errors
        ),
    ]);
    t.add_row(["config".to_owned(), d.config.clone()]);
    if let Some(r) = &d.last_reload {
        let what = if r.applied {
            let mut m = format!("applied at {}: {}", fmt_time(r.at_ns), r.message);
            if !r.restart_needed.is_empty() {
                m += &format!(
                    "; changes to [{}] need a restart",
                    r.restart_needed.join("], [")
                );
            }
            m
        } else {
            format!(
                "REFUSED at {}, running configuration kept: {}",
                fmt_time(r.at_ns),
                r.message
            )
        };
        t.add_row(["last reload".to_owned(), what]);
    }
    t.add_row(["database".to_owned(), d.db.display().to_string()]);
    t.add_row([
        "process".to_owned(),
        format!(
            "CPU {:.2}% of one core ({:.1}s user, {:.1}s system), RSS {}{}{}",
            r.process.cpu_percent,
            r.process.cpu_user_s,
            r.process.cpu_system_s,
            fmt_bytes(r.process.rss_bytes),
            match (r.process.heap_arena_bytes, r.process.heap_mapped_bytes) {
                (Some(arena), Some(mapped)) => format!(
                    " (heap allocated: {} in arenas, {} mapped)",
                    fmt_bytes(arena),
                    fmt_bytes(mapped)
                ),
                _ => String::new(),
            },
            match r.process.heap_thread_caches_off {
                Some(false) => "; glibc's per-thread caches on",
                _ => "",
            }
        ),
    ]);
    t.add_row([
        "store".to_owned(),
        format!(
            "{} live, {} on disk, {} write errors ({} disk full){}{}",
            fmt_bytes(r.store.live_bytes),
            fmt_bytes(r.store.size_on_disk),
            r.store.write_errors,
            r.store.disk_full_errors,
            if r.store.dropped_history_intervals + r.store.dropped_samples > 0 {
                format!(
                    "; writers behind: {} history intervals and {} samples dropped",
                    r.store.dropped_history_intervals, r.store.dropped_samples
                )
            } else {
                String::new()
            },
            if r.store.engine_failed {
                format!(
                    "; ENGINE FAILED ({}): writes refused until it reopens, tried every 10 s",
                    r.store.engine_failure.as_deref().unwrap_or("cause unknown")
                )
            } else {
                String::new()
            }
        ),
    ]);
    t.add_row([
        "services".to_owned(),
        if r.services.is_empty() {
            "grouped by cgroup automatically".to_owned()
        } else {
            r.services.join(", ")
        },
    ]);
    println!("{t}");

    let refused = r.probes.iter().any(|p| p.refused.is_some());
    let mut t = if refused {
        table(["probe", "attach method", "preferred method refused because"])
    } else {
        table(["probe", "attach method"])
    };
    for p in &r.probes {
        let mut row = vec![p.probe.to_string(), p.method.clone()];
        if refused {
            row.push(p.refused.clone().unwrap_or_default());
        }
        t.add_row(row);
    }
    println!("{t}");

    if !r.missing_kernel_features.is_empty() {
        let mut t = table(["kernel lacks", "since", "stand-in", "what it costs"]);
        for m in &r.missing_kernel_features {
            t.add_row([
                m.feature.clone(),
                m.since.clone(),
                m.stand_in.clone(),
                m.cost.clone(),
            ]);
        }
        println!("{t}");
    }

    print_nic_stamps(&r.nic_stamps);

    if r.latency.is_empty() {
        println!("no samples in the last interval");
    } else {
        let mut t = table([
            "service",
            "probe",
            "count",
            "p50",
            "baseline p50",
            "p99",
            "baseline p99",
        ]);
        for l in &r.latency {
            t.add_row([
                l.service.clone(),
                l.probe.to_string(),
                l.count.to_string(),
                opt_ns(l.p50_ns),
                opt_ns(l.baseline_p50_ns),
                opt_ns(l.p99_ns),
                opt_ns(l.baseline_p99_ns),
            ]);
        }
        println!("{t}");
    }
    if !r.device_latency.is_empty() {
        let mut t = table([
            "device",
            "driver-to-completion count",
            "p50",
            "p99",
            "p99.9",
        ]);
        for d in &r.device_latency {
            t.add_row([
                d.device.clone(),
                d.count.to_string(),
                opt_ns(d.p50_ns),
                opt_ns(d.p99_ns),
                opt_ns(d.p999_ns),
            ]);
        }
        println!("{t}");
    }

    if r.open_incidents.is_empty() {
        println!("open incidents: none");
    } else {
        let mut t = table(["open incident", "service", "opened", "headline", "stage"]);
        for i in &r.open_incidents {
            t.add_row([
                i.id.to_string(),
                i.service.clone(),
                fmt_time(i.opened_ns),
                i.headline.clone(),
                i.stage.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        println!("{t}");
    }
    if !r.notices.is_empty() {
        let mut t = table([
            "noticed (not incidents)",
            "count",
            "latest",
            "shift",
            "stage",
        ]);
        for n in &r.notices {
            let l = &n.latest;
            t.add_row([
                l.service.clone(),
                n.count.to_string(),
                fmt_time(l.noticed_ns),
                format!("{} p{} x{:.2}", l.probe, l.quantile * 100.0, l.ratio),
                l.stage.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        println!("{t}");
    }

    let c = &r.kernel_counters;
    let mut t = table(["capture and counters", ""]);
    t.add_row(["in-kernel capture".to_owned(), r.capture.state.clone()]);
    if !r.capture.reader_wait.is_empty() {
        t.add_row([
            "reader-wait split".to_owned(),
            r.capture.reader_wait.clone(),
        ]);
    }
    t.add_row([
        "probe counters".to_owned(),
        format!(
            "map-full drops {}, zero stamps {}, future stamps {}, head-of-line excluded {}, auto-service overflow {}, auto slots freed {}",
            c.map_full_drops, c.zero_tstamp, c.future_tstamp, c.hol_excluded, c.auto_overflow, c.auto_freed
        ),
    ]);
    if c.nic_stamp_no_clock + c.nic_stamp_out_of_bounds > 0 {
        t.add_row([
            "NIC stamps skipped".to_owned(),
            format!(
                "no clock offset for the device {}, out of bounds {}",
                c.nic_stamp_no_clock, c.nic_stamp_out_of_bounds
            ),
        ]);
    }
    println!("{t}");

    let mut t = table(["pwru", ""]);
    t.add_row([
        "sessions".to_owned(),
        match (r.pwru.enabled, r.pwru.busy) {
            (false, _) => "off in the configuration".to_owned(),
            (true, true) => "on; one is running now".to_owned(),
            (true, false) => "on; none running".to_owned(),
        },
    ]);
    for (item, value) in r.pwru.prerequisites.rows() {
        t.add_row([item.to_owned(), value]);
    }
    if r.pwru.prerequisites_ignored {
        t.add_row([
            "override".to_owned(),
            "daemon.pwru_ignore_prerequisites: sessions run whatever the check says".to_owned(),
        ]);
    }
    println!("{t}");

    if let Some(o) = &r.otlp {
        let mut t = table(["OTLP export", ""]);
        t.add_row([
            "collector".to_owned(),
            format!("{} ({})", o.endpoint, o.protocol),
        ]);
        t.add_row([
            "events".to_owned(),
            format!(
                "{} sent{}, {} queued of {}, {} dropped from a full queue",
                o.sent,
                o.last_sent_ns
                    .map(|ns| format!(" (last at {})", fmt_time(ns)))
                    .unwrap_or_default(),
                o.queued,
                o.capacity,
                o.dropped
            ),
        ]);
        t.add_row([
            "exports".to_owned(),
            match o.failing_since_ns {
                Some(since) => format!(
                    "FAILING since {} ({} failed requests): {}",
                    fmt_time(since),
                    o.failed_exports,
                    o.last_error.as_deref().unwrap_or("?")
                ),
                None => format!("working ({} failed requests since start)", o.failed_exports),
            },
        ]);
        println!("{t}");
    }

    if !r.bpf_cost.is_empty() {
        let stats_on = r.bpf_cost.iter().any(|p| p.run_time_ns > 0);
        let mut t = table(["BPF program", "attached at", "probes", "runs", "ns per run"]);
        for p in &r.bpf_cost {
            t.add_row([
                p.program.clone(),
                p.attach_point.clone(),
                p.probes
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                p.run_cnt.to_string(),
                if stats_on && p.run_cnt > 0 {
                    format!("{:.0}", p.run_time_ns as f64 / p.run_cnt as f64)
                } else {
                    "-".into()
                },
            ]);
        }
        println!("{t}");
        if !stats_on {
            println!("(run time per call: `sysctl kernel.bpf_stats_enabled=1` turns the kernel's accounting on)");
        }
    }
}

/// Hardware RX stamping: a row per interface with a PTP clock; the others, which cannot
/// stamp received packets, one line per reason (a host has hundreds of veths).
fn print_nic_stamps(rows: &[crate::api::NicStampRow]) {
    let (with_clock, without): (Vec<_>, Vec<_>) = rows.iter().partition(|n| n.phc.is_some());
    if !with_clock.is_empty() {
        let mut t = table([
            "interface",
            "hardware RX stamps",
            "rx_filter",
            "clock",
            "offset to system",
            "read",
            "nic-to-stack",
        ]);
        for n in with_clock {
            let offset = match (n.offset_ns, &n.offset_error) {
                (Some(o), _) => format!(
                    "{}{} ±{} ({})",
                    if o < 0 { "-" } else { "" },
                    fmt_ns(o.unsigned_abs() as f64),
                    fmt_ns(n.offset_uncertainty_ns.unwrap_or(0) as f64),
                    n.offset_method.as_deref().unwrap_or("?")
                ),
                (None, Some(e)) => format!("not read: {e}"),
                (None, None) => "-".into(),
            };
            t.add_row([
                n.interface.clone(),
                n.state.clone()
                    + if n.enabled_by_tailtrap {
                        " (turned on by tailtrap)"
                    } else {
                        ""
                    },
                n.rx_filter.clone().unwrap_or_else(|| "-".into()),
                n.phc.clone().unwrap_or_default(),
                offset,
                n.offset_read_ns.map_or_else(|| "-".into(), fmt_time),
                if n.timed_by_nic_to_stack {
                    "timed"
                } else {
                    "not timed"
                }
                .into(),
            ]);
        }
        println!("{t}");
    }
    let mut by_reason: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for n in without {
        let reason = n
            .summary
            .split_once(": ")
            .map_or(n.summary.as_str(), |(_, why)| why);
        by_reason.entry(reason).or_default().push(&n.interface);
    }
    for (reason, names) in by_reason {
        println!("no hardware RX stamps on {}: {reason}", names.join(", "));
    }
}
