//! The exposition of one snapshot, written with prometheus-client's encoder (OpenMetrics
//! text), and its Prometheus 0.0.4 text form for scrapers that do not ask for OpenMetrics.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use model::hist::{bucket_index, NUM_BUCKETS};
use model::{Histogram, Probe};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{Data, Format};

/// Largest power of two (in ns) used as an `le` bound: 2^34 ns ≈ 17.2 s, as netstacklat's
/// ebpf_exporter configuration (exp2 buckets 0..=34, ns to seconds).
pub(super) const MAX_LE_EXP: u32 = 34;

/// ns per second.
const NS: f64 = 1e9;

/// Render `data` in `format`.
pub(super) fn render(data: &Arc<Data>, format: Format) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(View(data.clone())));
    // About 80 bytes a line; the histograms are most of it.
    let mut out = String::with_capacity(4096 + data.hists.len() * 40 * 80);
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        // Writing to a String cannot fail; the collector itself returns no other error.
        tracing::error!("metrics: encoding failed");
    }
    match format {
        Format::OpenMetrics => out,
        Format::Text => to_text_format(&out),
    }
}

/// The metric family name netstacklat's ebpf_exporter configuration gives a probe.
pub(super) fn netstacklat_name(probe: Probe) -> &'static str {
    probe.netstacklat_metric().0
}

fn netstacklat_help(probe: Probe) -> &'static str {
    probe.netstacklat_metric().1
}

/// `(le in seconds, observations in (previous le, le])` for the power-of-two bounds, then
/// `+Inf`. Every power of two is a bucket edge of tailtrap's scheme, so the counts are
/// exact: bound 2^k ns counts every latency below 2^k ns.
pub(super) fn le_buckets(h: &Histogram) -> Vec<(f64, u64)> {
    let counts = h.buckets();
    let mut out = Vec::with_capacity(MAX_LE_EXP as usize + 2);
    let mut from = 0usize;
    for k in 0..=MAX_LE_EXP {
        let to = bucket_index(1u64 << k);
        let n = counts[from..to]
            .iter()
            .fold(0u64, |a, &c| a.saturating_add(c));
        out.push(((1u64 << k) as f64 / NS, n));
        from = to;
    }
    let rest = counts[from..NUM_BUCKETS]
        .iter()
        .fold(0u64, |a, &c| a.saturating_add(c));
    out.push((f64::INFINITY, rest));
    out
}

/// Writes the families of one snapshot.
#[derive(Debug)]
struct View(Arc<Data>);

type Labels<'a> = Vec<(&'a str, &'a str)>;

/// One family: name (for counters without `_total`), help, type.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
}

const fn family(name: &'static str, help: &'static str, kind: MetricType) -> Family {
    Family { name, help, kind }
}

/// Encode a family of gauges or counters from `(labels, value)` rows; nothing when empty.
fn values<'a>(
    enc: &mut DescriptorEncoder,
    f: Family,
    rows: impl IntoIterator<Item = (Labels<'a>, f64)>,
) -> fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(f.name, f.help, None, f.kind)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            sample(&mut m, &f.kind, v)?;
        } else {
            sample(&mut m.encode_family(&labels)?, &f.kind, v)?;
        }
    }
    Ok(())
}

/// One value; counts (whole numbers below 2^53) are written as integers.
fn sample(m: &mut MetricEncoder, kind: &MetricType, v: f64) -> fmt::Result {
    let whole = v >= 0.0 && v.fract() == 0.0 && v < 9.0e15;
    match (kind, whole) {
        (MetricType::Counter, true) => m.encode_counter::<NoLabelSet, _, u64>(&(v as u64), None),
        (MetricType::Counter, false) => m.encode_counter::<NoLabelSet, _, f64>(&v, None),
        (_, true) => m.encode_gauge(&(v as u64)),
        (_, false) => m.encode_gauge(&v),
    }
}

/// One unlabelled sample.
fn single(enc: &mut DescriptorEncoder, f: Family, v: f64) -> fmt::Result {
    values(enc, f, [(Vec::new(), v)])
}

/// An info family: one series per label set, value 1.
fn info<'a>(
    enc: &mut DescriptorEncoder,
    name: &'static str,
    help: &'static str,
    rows: impl IntoIterator<Item = Labels<'a>>,
) -> fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Info)?;
    for labels in rows {
        m.encode_info(&labels)?;
    }
    Ok(())
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / NS
}

impl Collector for View {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let r = &self.0.report;
        let hists = &self.0.hists;
        use MetricType::{Counter, Gauge};

        // netstacklat-compatible histograms, one family per probe, label `service`.
        for probe in Probe::ALL {
            let mut rows: Vec<(&str, &Histogram)> = hists
                .iter()
                .filter(|((_, p), _)| *p == probe)
                .map(|((s, _), h)| (s.as_str(), &**h))
                .collect();
            if rows.is_empty() {
                continue;
            }
            rows.sort_by_key(|(s, _)| *s);
            let mut m = enc.encode_descriptor(
                netstacklat_name(probe),
                netstacklat_help(probe),
                None,
                MetricType::Histogram,
            )?;
            for (service, h) in rows {
                let labels = [("service", service)];
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    secs(h.sum_ns()),
                    h.count(),
                    &le_buckets(h),
                    None,
                )?;
            }
        }

        // driver-to-completion per device: the transmit queue's own share, whoever sent.
        if !self.0.devices.is_empty() {
            let mut m = enc.encode_descriptor(
                "netstack_latency_driver_to_completion_by_device_seconds",
                "Time from the driver taking a packet to its release after transmission, per device (ifindex N in netns M outside the daemon's namespace)",
                None,
                MetricType::Histogram,
            )?;
            for d in self.0.devices.iter() {
                let labels = [("device", d.device.as_str())];
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    secs(d.hist.sum_ns()),
                    d.hist.count(),
                    &le_buckets(&d.hist),
                    None,
                )?;
            }
        }

        // Now against the learned normal.
        let mut latency: Vec<_> = r.latency.iter().collect();
        latency.sort_by(|a, b| (&a.service, a.probe).cmp(&(&b.service, b.probe)));
        let quantiles = |baseline: bool| {
            latency.iter().flat_map(move |row| {
                // `percentile`, not `quantile`: that label belongs to summaries.
                let qs = if baseline {
                    [
                        ("50", row.baseline_p50_ns),
                        ("99", row.baseline_p99_ns),
                        ("99.9", row.baseline_p999_ns),
                    ]
                } else {
                    [
                        ("50", row.p50_ns),
                        ("99", row.p99_ns),
                        ("99.9", row.p999_ns),
                    ]
                };
                qs.into_iter().filter_map(move |(q, v)| {
                    let labels = vec![
                        ("service", row.service.as_str()),
                        ("probe", row.probe.name()),
                        ("percentile", q),
                    ];
                    v.map(|ns| (labels, ns / NS))
                })
            })
        };
        values(
            &mut enc,
            family(
                "tailtrap_interval_latency_seconds",
                "Latency quantile of the last interval per service and probe (bucket midpoint), as tailtrap status shows it",
                Gauge,
            ),
            quantiles(false),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_baseline_latency_seconds",
                "Latency quantile of the learned baseline per service and probe; absent while the baseline warms up",
                Gauge,
            ),
            quantiles(true),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_interval_latency_samples",
                "Packets measured in the last interval per service and probe",
                Gauge,
            ),
            latency.iter().map(|row| {
                (
                    vec![
                        ("service", row.service.as_str()),
                        ("probe", row.probe.name()),
                    ],
                    row.count as f64,
                )
            }),
        )?;

        // Incidents.
        let services: BTreeSet<&str> = r
            .services
            .iter()
            .map(String::as_str)
            .chain(hists.keys().map(|(s, _)| s.as_str()))
            .chain(r.open_incidents.iter().map(|o| o.service.as_str()))
            .collect();
        values(
            &mut enc,
            family(
                "tailtrap_incidents_open",
                "Incidents open now per service (0 or 1)",
                Gauge,
            ),
            services.iter().map(|s| {
                let open = r.open_incidents.iter().filter(|o| o.service == *s).count();
                (vec![("service", *s)], open as f64)
            }),
        )?;
        let ids: Vec<String> = r.open_incidents.iter().map(|o| o.id.to_string()).collect();
        let part_of: Vec<String> = r
            .open_incidents
            .iter()
            .map(|o| o.part_of.map_or_else(String::new, |id| id.to_string()))
            .collect();
        let probes: Vec<String> = r
            .open_incidents
            .iter()
            .map(|o| {
                o.probes
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        info(
            &mut enc,
            "tailtrap_incident_open",
            "An open incident: its id, service, hot probes, stage verdict, cause verdict so far, the host-wide incident it is part of (empty: none) and headline",
            r.open_incidents.iter().enumerate().map(|(i, o)| {
                vec![
                    ("id", ids[i].as_str()),
                    ("service", o.service.as_str()),
                    ("probes", probes[i].as_str()),
                    ("stage", o.stage.as_deref().unwrap_or("unknown")),
                    ("cause", o.cause.as_deref().unwrap_or("undecided")),
                    ("part_of", part_of[i].as_str()),
                    ("headline", o.headline.as_str()),
                ]
            }),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_incidents_opened",
                "Incidents opened since the daemon started, per service and stage verdict",
                Counter,
            ),
            r.incidents_opened.iter().map(|c| {
                (
                    vec![("service", c.service.as_str()), ("stage", c.stage.as_str())],
                    c.count as f64,
                )
            }),
        )?;

        values(
            &mut enc,
            family(
                "tailtrap_incident_causes",
                "Incidents closed since the daemon started, per service and cause verdict",
                Counter,
            ),
            r.incident_causes.iter().map(|c| {
                (
                    vec![("service", c.service.as_str()), ("cause", c.cause.as_str())],
                    c.count as f64,
                )
            }),
        )?;

        values(
            &mut enc,
            family(
                "tailtrap_notices",
                "Small shifts noticed since the daemon started (below incident_ratio, not \
                 incidents), per service",
                Counter,
            ),
            r.notices
                .iter()
                .map(|n| (vec![("service", n.latest.service.as_str())], n.count as f64)),
        )?;

        // Probes.
        let methods: Vec<(&str, &str)> = r
            .probes
            .iter()
            .map(|p| {
                let (kind, detail) = p.method.split_once(' ').unwrap_or((&p.method, ""));
                (kind.trim_end_matches(':'), detail.trim())
            })
            .collect();
        info(
            &mut enc,
            "tailtrap_probe",
            "How each probe is attached: method fentry, tp_btf, within (another probe's programs measure it), disabled or unavailable; detail the attach points or why",
            r.probes.iter().zip(&methods).map(|(p, (kind, detail))| {
                vec![("probe", p.probe.name()), ("method", *kind), ("detail", *detail)]
            }),
        )?;
        let k = &r.kernel_counters;
        for (name, help, v) in [
            (
                "tailtrap_kernel_map_full_drops",
                "Samples lost because the histogram map was full, since the probes were loaded",
                k.map_full_drops,
            ),
            (
                "tailtrap_kernel_zero_tstamp",
                "Packets without a timestamp, since the probes were loaded",
                k.zero_tstamp,
            ),
            (
                "tailtrap_kernel_future_tstamp",
                "Packets with a timestamp in the future, since the probes were loaded",
                k.future_tstamp,
            ),
            (
                "tailtrap_kernel_hol_excluded",
                "TCP reads skipped as head-of-line blocked, since the probes were loaded",
                k.hol_excluded,
            ),
            (
                "tailtrap_kernel_auto_service_overflow",
                "Samples counted to service other over the automatic service limit, since the probes were loaded",
                k.auto_overflow,
            ),
            (
                "tailtrap_kernel_auto_service_freed",
                "Automatic service slots freed because their cgroup was gone, since the probes were loaded",
                k.auto_freed,
            ),
            (
                "tailtrap_kernel_nic_stamp_no_clock",
                "NIC hardware stamps skipped by nic-to-stack because the device's clock offset was not known, since the probes were loaded",
                k.nic_stamp_no_clock,
            ),
            (
                "tailtrap_kernel_nic_stamp_out_of_bounds",
                "NIC hardware stamps skipped by nic-to-stack because they converted to after the kernel's stamp or over 10 s before it, since the probes were loaded",
                k.nic_stamp_out_of_bounds,
            ),
        ] {
            single(&mut enc, family(name, help, Counter), v as f64)?;
        }
        // Only with kernel.bpf_stats_enabled=1 does the kernel count runs and run time.
        let costs: Vec<_> = r
            .bpf_cost
            .iter()
            .filter(|c| c.run_cnt > 0 || c.run_time_ns > 0)
            .collect();
        fn cost_labels(c: &crate::api::ProgCost) -> Labels<'_> {
            vec![
                ("program", c.program.as_str()),
                ("attach_point", c.attach_point.as_str()),
            ]
        }
        values(
            &mut enc,
            family(
                "tailtrap_bpf_program_runs",
                "Runs of each BPF program (counted only while kernel.bpf_stats_enabled=1; refreshed every 10 intervals)",
                Counter,
            ),
            costs.iter().map(|c| (cost_labels(c), c.run_cnt as f64)),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_bpf_program_run_seconds",
                "Run time of each BPF program (counted only while kernel.bpf_stats_enabled=1; refreshed every 10 intervals)",
                Counter,
            ),
            costs.iter().map(|c| (cost_labels(c), secs(c.run_time_ns))),
        )?;

        // Capture.
        let c = &r.capture;
        single(
            &mut enc,
            family(
                "tailtrap_capture_available",
                "In-kernel capture of slow packets can be armed (1) or not (0)",
                Gauge,
            ),
            flag(c.available),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_capture_armed",
                "Capture armed now for the service (1); services not armed are absent",
                Gauge,
            ),
            c.armed.iter().map(|s| (vec![("service", s.as_str())], 1.0)),
        )?;
        let n = &c.counters.kernel;
        let user_space_lost = c.counters.user_space_lost;
        let recorder = |r: &'static str| vec![("recorder", r)];
        values(
            &mut enc,
            family(
                "tailtrap_capture_records_emitted",
                "Slow-packet records the probes emitted, per recorder (armed capture, flight recorder)",
                Counter,
            ),
            [
                (recorder("armed"), n.emitted as f64),
                (recorder("flight"), n.flight_emitted as f64),
            ],
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_capture_records_rate_limited",
                "Slow packets not recorded because of the recorder's rate limit",
                Counter,
            ),
            [
                (recorder("armed"), n.rate_limited as f64),
                (recorder("flight"), n.flight_rate_limited as f64),
            ],
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_capture_records_lost",
                "Slow-packet records lost: reason ring_full in the kernel per recorder, user_queue_full between the reader thread and the daemon",
                Counter,
            ),
            [
                (
                    vec![("recorder", "armed"), ("reason", "ring_full")],
                    n.ring_full as f64,
                ),
                (
                    vec![("recorder", "flight"), ("reason", "ring_full")],
                    n.flight_ring_full as f64,
                ),
                (
                    vec![("recorder", "all"), ("reason", "user_queue_full")],
                    user_space_lost as f64,
                ),
            ],
        )?;
        single(
            &mut enc,
            family(
                "tailtrap_flight_recorder_samples",
                "Samples the flight recorder holds now",
                Gauge,
            ),
            c.flight_samples as f64,
        )?;

        // pwru.
        single(
            &mut enc,
            family(
                "tailtrap_pwru_enabled",
                "pwru sessions are switched on in the configuration",
                Gauge,
            ),
            flag(r.pwru.enabled),
        )?;
        single(
            &mut enc,
            family("tailtrap_pwru_running", "A pwru session runs now", Gauge),
            flag(r.pwru.busy),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_pwru_sessions",
                "pwru sessions ended since start, by final state",
                Counter,
            ),
            r.pwru
                .sessions
                .iter()
                .map(|(state, n)| (vec![("state", state.as_str())], *n as f64)),
        )?;

        // Store.
        let s = &r.store;
        for (f, v) in [
            (
                family("tailtrap_store_live_bytes", "Live data in the database", Gauge),
                s.live_bytes as f64,
            ),
            (
                family(
                    "tailtrap_store_disk_bytes",
                    "The database's files on disk",
                    Gauge,
                ),
                s.size_on_disk as f64,
            ),
            (
                family(
                    "tailtrap_store_budget_bytes",
                    "The live-data budget (storage.max_bytes); over it, retention removes the oldest data",
                    Gauge,
                ),
                s.max_bytes as f64,
            ),
            (
                family(
                    "tailtrap_store_write_errors",
                    "Failed database writes since start (any reason)",
                    Counter,
                ),
                s.write_errors as f64,
            ),
            (
                family(
                    "tailtrap_store_dropped_history_intervals",
                    "Intervals of history dropped because the storage writer was behind (a slow disk)",
                    Counter,
                ),
                s.dropped_history_intervals as f64,
            ),
            (
                family(
                    "tailtrap_store_dropped_samples",
                    "Captured samples dropped because the sample writer was behind (a slow disk)",
                    Counter,
                ),
                s.dropped_samples as f64,
            ),
            (
                family(
                    "tailtrap_store_disk_full_errors",
                    "Database writes refused or failed for lack of disk space (including below storage.min_free_bytes)",
                    Counter,
                ),
                s.disk_full_errors as f64,
            ),
            (
                family(
                    "tailtrap_store_undecodable_records",
                    "Stored records skipped as undecodable",
                    Counter,
                ),
                s.undecodable_records as f64,
            ),
            (
                family(
                    "tailtrap_store_engine_reopens",
                    "Times the storage engine was closed and reopened to give back the memory it kept (storage.cache_bytes went through it)",
                    Counter,
                ),
                s.engine_reopens as f64,
            ),
            (
                family(
                    "tailtrap_store_engine_failed",
                    "The storage engine failed and writes are refused until it reopens (1)",
                    Gauge,
                ),
                flag(s.engine_failed),
            ),
        ] {
            single(&mut enc, f, v)?;
        }

        // The OTLP export of incidents, when `[otlp]` is on.
        if let Some(o) = &r.otlp {
            for (f, v) in [
                (
                    family(
                        "tailtrap_otlp_queue_events",
                        "Incident events waiting for the OTLP collector",
                        Gauge,
                    ),
                    o.queued as f64,
                ),
                (
                    family(
                        "tailtrap_otlp_queue_capacity_events",
                        "The OTLP queue's size (otlp.queue_size); beyond, the oldest events are dropped",
                        Gauge,
                    ),
                    o.capacity as f64,
                ),
                (
                    family(
                        "tailtrap_otlp_events_sent",
                        "Incident events the OTLP collector accepted",
                        Counter,
                    ),
                    o.sent as f64,
                ),
                (
                    family(
                        "tailtrap_otlp_events_dropped",
                        "Incident events dropped from a full OTLP queue (still in the local store)",
                        Counter,
                    ),
                    o.dropped as f64,
                ),
                (
                    family(
                        "tailtrap_otlp_export_failures",
                        "OTLP export requests that failed (refused, timed out, TLS, rejected)",
                        Counter,
                    ),
                    o.failed_exports as f64,
                ),
                (
                    family(
                        "tailtrap_otlp_failing",
                        "1 while every OTLP export fails, since the first failure after a success",
                        Gauge,
                    ),
                    flag(o.failing_since_ns.is_some()),
                ),
            ] {
                single(&mut enc, f, v)?;
            }
        }

        // NIC hardware RX stamps, for the devices with a PTP clock (the others, veths
        // among them, cannot stamp: status lists them, series would only be noise).
        let clocks: Vec<_> = r.nic_stamps.iter().filter(|n| n.phc.is_some()).collect();
        values(
            &mut enc,
            family(
                "tailtrap_nic_hw_rx_stamping",
                "1 while the device stamps received packets in hardware and its clock's offset is known",
                Gauge,
            ),
            clocks.iter().map(|n| {
                (
                    vec![("interface", n.interface.as_str())],
                    flag(n.state == "on" && n.offset_ns.is_some()),
                )
            }),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_nic_phc_offset_seconds",
                "The device's PTP clock offset to the system clock (CLOCK_REALTIME minus PHC) as last read",
                Gauge,
            ),
            clocks.iter().filter_map(|n| {
                Some((
                    vec![("interface", n.interface.as_str())],
                    n.offset_ns? as f64 / NS,
                ))
            }),
        )?;
        values(
            &mut enc,
            family(
                "tailtrap_nic_phc_offset_read_time_seconds",
                "When the device's clock offset was last read, seconds since the Unix epoch",
                Gauge,
            ),
            clocks.iter().filter_map(|n| {
                Some((
                    vec![("interface", n.interface.as_str())],
                    secs(n.offset_read_ns?),
                ))
            }),
        )?;

        // The daemon.
        let d = &r.daemon;
        info(
            &mut enc,
            "tailtrap_build",
            "tailtrap's version",
            [vec![("version", d.version.as_str())]],
        )?;
        for (f, v) in [
            (
                family(
                    "tailtrap_start_time_seconds",
                    "When the daemon started, seconds since the Unix epoch",
                    Gauge,
                ),
                secs(d.started_ns),
            ),
            (
                family(
                    "tailtrap_interval_seconds",
                    "The configured interval (daemon.interval)",
                    Gauge,
                ),
                d.interval.as_secs_f64(),
            ),
            (
                family("tailtrap_intervals", "Intervals run since start", Counter),
                d.intervals as f64,
            ),
            (
                family(
                    "tailtrap_interval_failures",
                    "Intervals whose histograms could not be read",
                    Counter,
                ),
                d.interval_errors as f64,
            ),
            (
                family(
                    "tailtrap_interval_duration_seconds",
                    "How long the last interval's work took",
                    Gauge,
                ),
                secs(d.last_interval_ns),
            ),
            (
                family(
                    "process_cpu_seconds",
                    "User and system CPU time of the daemon",
                    Counter,
                ),
                r.process.cpu_user_s + r.process.cpu_system_s,
            ),
            (
                family(
                    "process_resident_memory_bytes",
                    "Resident memory of the daemon",
                    Gauge,
                ),
                r.process.rss_bytes as f64,
            ),
        ] {
            single(&mut enc, f, v)?;
        }
        // Absent with another allocator, so that no zero reads as a figure.
        let heap = [
            ("arena", r.process.heap_arena_bytes),
            ("mapped", r.process.heap_mapped_bytes),
        ];
        values(
            &mut enc,
            family(
                "tailtrap_heap_allocated_bytes",
                "Bytes the daemon holds allocated, by glibc's count at its last trim: in its \
                 arenas, and in blocks mapped on their own (counted whole, not all resident)",
                Gauge,
            ),
            heap.iter()
                .filter_map(|(kind, v)| v.map(|v| (vec![("kind", *kind)], v as f64))),
        )?;
        Ok(())
    }
}

/// OpenMetrics text to Prometheus text format 0.0.4: no `# EOF` or `# UNIT` lines, counter
/// families named with their `_total` suffix, info families as gauges named `_info`.
pub(super) fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            // Written with the TYPE line that follows, which tells the family's type.
            help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_owned(), "untyped"),
                other => (name.to_owned(), other),
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::hist::bucket_lower;

    #[test]
    fn every_power_of_two_le_is_a_bucket_edge() {
        for k in 0..=MAX_LE_EXP {
            assert_eq!(bucket_lower(bucket_index(1u64 << k)), 1u64 << k, "2^{k}");
        }
    }

    #[test]
    fn le_counts_are_exact() {
        let mut h = Histogram::new();
        for v in [0u64, 1, 2, 3, 4, 1000, 1023, 1024, 1025, 5_000_000, 1 << 40] {
            h.record(v);
        }
        let b = le_buckets(&h);
        assert_eq!(b.len(), MAX_LE_EXP as usize + 2);
        let cum = |le_ns: u64| {
            b.iter()
                .take_while(|(le, _)| *le <= le_ns as f64 / NS)
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        // Bound 2^k counts latencies below 2^k.
        assert_eq!(cum(1), 1);
        assert_eq!(cum(2), 2);
        assert_eq!(cum(4), 4);
        assert_eq!(cum(1024), 7);
        assert_eq!(cum(2048), 9);
        assert_eq!(cum(1 << 23), 10);
        assert_eq!(b.iter().map(|(_, n)| n).sum::<u64>(), h.count());
        assert_eq!(b.last().map(|x| x.1), Some(1));
    }

    #[test]
    fn text_format_names_counters_and_infos_by_their_samples() {
        let om = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total 3\n\
                  # HELP a_build Build.\n# TYPE a_build info\na_build_info{version=\"1\"} 1\n\
                  # HELP a_g G.\n# TYPE a_g gauge\n# UNIT a_g x\na_g 1\n# EOF\n";
        assert_eq!(
            to_text_format(om),
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total 3\n\
             # HELP a_build_info Build.\n# TYPE a_build_info gauge\na_build_info{version=\"1\"} 1\n\
             # HELP a_g G.\n# TYPE a_g gauge\na_g 1\n"
        );
    }
}
