//! Prometheus metrics: `GET /metrics` on a TCP listener of its own (`[metrics]`).
//!
//! The interval loop publishes, once per interval, the status report `tailtrap status`
//! shows and the cumulative histograms it already keeps (shared through an `Arc`, not
//! copied). A scrape only renders that snapshot, at most once per interval and format: it
//! never reads BPF maps or the database, and it holds the shared state just long enough to
//! clone an `Arc`. docs/metrics.md lists the metrics.

mod encode;
mod http;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, OnceLock};

use hyper::body::Bytes;
use model::{Histogram, Probe};
use serde::{Deserialize, Serialize};

use crate::api::StatusReport;

pub use http::serve;

/// The default port: outside 9100–9999, the range of Prometheus' exporter port list (full,
/// and home of node_exporter's 9100 and ebpf_exporter's 9435), and not a registered
/// service in /etc/services.
pub const DEFAULT_PORT: u16 = 10435;

/// The `[metrics]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve `GET /metrics`.
    pub enabled: bool,
    /// Address and port to listen on; beyond loopback is allowed (and logged).
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
        }
    }
}

// An unparsable `listen` is refused while the table is read; a taken port only at bind.
impl model::config::Validate for MetricsConfig {}

/// Bind the metrics listener when enabled. Called before anything else starts, so a bad
/// address stops the daemon before it loads or serves anything; the error names the
/// configuration's `origin` and the key.
pub fn bind(config: &MetricsConfig, origin: &str) -> anyhow::Result<Option<TcpListener>> {
    if !config.enabled {
        return Ok(None);
    }
    let listener = TcpListener::bind(config.listen).map_err(|e| {
        anyhow::anyhow!(
            "{origin}: key `metrics.listen`: cannot listen on {}: {e}",
            config.listen
        )
    })?;
    // tokio takes it over later; it must not block then.
    listener
        .set_nonblocking(true)
        .map_err(|e| anyhow::anyhow!("{origin}: key `metrics.listen`: {e}"))?;
    if !config.listen.ip().is_loopback() {
        tracing::warn!(listen = %config.listen, "metrics are served beyond loopback, without authentication");
    }
    Ok(Some(listener))
}

/// The cumulative histograms by (service, probe), as the interval loop keeps them (shared:
/// one that did not change in an interval passes to the next map without a copy).
pub type Cumulative = HashMap<(String, Probe), Arc<Histogram>>;

/// What the interval loop hands to scrapers.
#[derive(Debug)]
pub struct Data {
    /// The status report of the interval, exactly as `GET /v1/status` would build it.
    pub report: StatusReport,
    /// The cumulative histograms after the interval.
    pub hists: Arc<Cumulative>,
    /// driver-to-completion per device, cumulative, after the interval.
    pub devices: Arc<Vec<bpf::DeviceHist>>,
}

/// One published interval and its renderings, made by the first scrape that asks.
#[derive(Debug)]
struct Snapshot {
    data: Arc<Data>,
    text: OnceLock<Bytes>,
    openmetrics: OnceLock<Bytes>,
}

/// The exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// The Content-Type of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The latest snapshot, shared between the interval loop and the listener.
#[derive(Debug, Default)]
pub struct Shared {
    current: Mutex<Option<Arc<Snapshot>>>,
}

impl Shared {
    /// Replace the snapshot (once per interval).
    pub fn publish(&self, data: Data) {
        let next = Arc::new(Snapshot {
            data: Arc::new(data),
            text: OnceLock::new(),
            openmetrics: OnceLock::new(),
        });
        // The previous snapshot is dropped after the lock is released.
        let _previous = self.lock().replace(next);
    }

    /// The exposition of the latest snapshot (`None` before the first one), rendered once
    /// per snapshot and format.
    pub fn render(&self, format: Format) -> Option<Bytes> {
        let snapshot = self.lock().clone()?;
        let cell = match format {
            Format::Text => &snapshot.text,
            Format::OpenMetrics => &snapshot.openmetrics,
        };
        Some(
            cell.get_or_init(|| Bytes::from(encode::render(&snapshot.data, format)))
                .clone(),
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Snapshot>>> {
        // Only an Arc is kept here: usable after a panic elsewhere.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        CaptureReport, CauseCount, DaemonInfo, KernelCounters, LatencyRow, OpenIncident,
        OpenedCount, ProbeRow, ProcessStats, PwruReport, StoreReport,
    };
    use crate::config;

    #[test]
    fn config_defaults_and_errors_name_the_key() {
        let c = config::parse("", "t").unwrap();
        assert_eq!(c.metrics, MetricsConfig::default());
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:10435");
        let c = config::parse("[metrics]\nenabled = false\nlisten = \"[::]:9999\"\n", "t").unwrap();
        assert!(!c.metrics.enabled);
        assert_eq!(c.metrics.listen.port(), 9999);
        let e = config::parse("[metrics]\nlisten = \"localhost\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f.toml, line 2: key `metrics.listen`: "),
            "{e}"
        );
        let e = config::parse("[metrics]\nlisten_on = 1\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.listen_on"), "{e}");
    }

    #[test]
    fn a_taken_port_is_one_error_naming_the_key() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = MetricsConfig {
            enabled: true,
            listen: taken.local_addr().unwrap(),
        };
        let e = bind(&config, "f.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("f.toml: key `metrics.listen`: cannot listen on 127.0.0.1:"),
            "{e}"
        );
        let off = MetricsConfig {
            enabled: false,
            ..config
        };
        assert!(bind(&off, "f.toml").unwrap().is_none());
    }

    async fn report() -> StatusReport {
        StatusReport {
            daemon: DaemonInfo {
                version: "9.9.9".into(),
                pid: 1,
                started_ns: 1_500_000_000_000_000_000,
                interval: std::time::Duration::from_secs(1),
                config: "t".into(),
                db: "/db".into(),
                socket: "/s".into(),
                intervals: 42,
                interval_errors: 1,
                last_reload: None,
                last_interval_ns: 2_500_000,
                worst_interval_ns: 3_000_000,
                worst_wakeup_ns: 1_000_000,
                metrics_listen: None,
            },
            probes: vec![ProbeRow {
                probe: Probe::TcpSocketRead,
                method: "tp_btf skb_copy_datagram_iovec".into(),
                refused: None,
            }],
            missing_kernel_features: Vec::new(),
            services: vec!["web".into(), "idle".into()],
            latency: vec![LatencyRow {
                service: "web".into(),
                probe: Probe::TcpSocketRead,
                count: 10,
                p50_ns: Some(1500.0),
                p99_ns: Some(20_000_000.0),
                baseline_p50_ns: Some(1000.0),
                baseline_p99_ns: None,
                p999_ns: None,
                baseline_p999_ns: None,
            }],
            open_incidents: vec![OpenIncident {
                id: 7,
                service: "web".into(),
                probes: vec![Probe::TcpSocketRead],
                opened_ns: 1,
                headline: "tcp-socket-read p99 1µs -> 20ms (\"20000x\")".into(),
                stage: Some("application read delay".into()),
                cause: Some("cpu-wait".into()),
                cause_summary: Some(
                    "reader runnable but waiting for a CPU 81 % of the delay".into(),
                ),
                part_of: Some(9),
            }],
            capture: CaptureReport {
                available: true,
                state: "armed".into(),
                armed: vec!["web".into()],
                flight_samples: 3,
                counters: Default::default(),
                reader_wait: String::new(),
            },
            kernel_counters: KernelCounters {
                hol_excluded: 5,
                ..Default::default()
            },
            pwru: PwruReport {
                enabled: true,
                prerequisites: capture::pwru::Prerequisites::check(Some(std::path::Path::new(
                    "/nonexistent/pwru",
                )))
                .await,
                prerequisites_ignored: false,
                busy: false,
                sessions: [("ok".to_owned(), 2)].into_iter().collect(),
            },
            bpf_cost: Vec::new(),
            process: ProcessStats::default(),
            store: StoreReport {
                live_bytes: 100,
                max_bytes: 1000,
                engine_reopens: 4,
                ..Default::default()
            },
            incidents_opened: vec![OpenedCount {
                service: "web".into(),
                stage: "application read delay".into(),
                count: 3,
            }],
            incident_causes: vec![CauseCount {
                service: "web".into(),
                cause: "one-cpu".into(),
                count: 2,
            }],
            notices: vec![crate::api::NoticeCount {
                count: 4,
                latest: crate::api::NoticeRow {
                    service: "web".into(),
                    noticed_ns: 5,
                    probe: "tcp-socket-read".into(),
                    quantile: 0.99,
                    ratio: 1.5,
                    stage: None,
                },
            }],
            otlp: Some(crate::otlp::OtlpReport {
                queued: 2,
                capacity: 4096,
                sent: 11,
                dropped: 1,
                failed_exports: 3,
                failing_since_ns: Some(5),
                ..Default::default()
            }),
            nic_stamps: vec![
                nic(
                    "eth0",
                    "on",
                    Some(-36_999_999_588),
                    Some(1_700_000_000_000_000_000),
                ),
                nic("eth1", "off", None, None),
                crate::api::NicStampRow {
                    phc: None,
                    ..nic("veth0", "unsupported", None, None)
                },
            ],
            device_latency: Vec::new(),
        }
    }

    fn nic(
        interface: &str,
        state: &str,
        offset_ns: Option<i64>,
        read_ns: Option<u64>,
    ) -> crate::api::NicStampRow {
        crate::api::NicStampRow {
            interface: interface.into(),
            state: state.into(),
            summary: String::new(),
            phc: Some("/dev/ptp0".into()),
            rx_filter: Some("all".into()),
            enabled_by_tailtrap: false,
            offset_ns,
            offset_uncertainty_ns: offset_ns.map(|_| 500),
            offset_method: offset_ns.map(|_| "extended".into()),
            offset_read_ns: read_ns,
            offset_error: None,
            timed_by_nic_to_stack: offset_ns.is_some(),
        }
    }

    #[tokio::test]
    async fn a_snapshot_renders_the_status_figures_and_the_histograms() {
        let mut h = Histogram::new();
        h.record_n(3_000, 4); // in (2^11, 2^12] ns
        h.record(20_000_000);
        let hists: Cumulative = [(("web".to_owned(), Probe::TcpSocketRead), Arc::new(h))]
            .into_iter()
            .collect();
        let shared = Shared::default();
        assert!(shared.render(Format::Text).is_none());
        let mut sent = Histogram::new();
        sent.record_n(70_000, 3); // in (2^16, 2^17] ns
        let devices = vec![bpf::DeviceHist {
            device: "eth0".into(),
            ifindex: 2,
            netns: 4026531840,
            hist: sent,
        }];
        shared.publish(Data {
            report: report().await,
            hists: Arc::new(hists),
            devices: Arc::new(devices),
        });
        let text = shared.render(Format::Text).unwrap();
        let text = std::str::from_utf8(&text).unwrap();
        for line in [
            "# TYPE netstack_latency_tcp_sock_read_seconds histogram",
            "netstack_latency_tcp_sock_read_seconds_bucket{le=\"0.000002048\",service=\"web\"} 0",
            "netstack_latency_tcp_sock_read_seconds_bucket{le=\"0.000004096\",service=\"web\"} 4",
            "netstack_latency_tcp_sock_read_seconds_bucket{le=\"0.033554432\",service=\"web\"} 5",
            "netstack_latency_tcp_sock_read_seconds_bucket{le=\"+Inf\",service=\"web\"} 5",
            "netstack_latency_tcp_sock_read_seconds_sum{service=\"web\"} 0.020012",
            "netstack_latency_tcp_sock_read_seconds_count{service=\"web\"} 5",
            "# TYPE netstack_latency_driver_to_completion_by_device_seconds histogram",
            "netstack_latency_driver_to_completion_by_device_seconds_bucket{le=\"0.000065536\",device=\"eth0\"} 0",
            "netstack_latency_driver_to_completion_by_device_seconds_bucket{le=\"0.000131072\",device=\"eth0\"} 3",
            "netstack_latency_driver_to_completion_by_device_seconds_count{device=\"eth0\"} 3",
            "tailtrap_interval_latency_seconds{service=\"web\",probe=\"tcp-socket-read\",percentile=\"99\"} 0.02",
            "tailtrap_baseline_latency_seconds{service=\"web\",probe=\"tcp-socket-read\",percentile=\"50\"} 0.000001",
            "tailtrap_interval_latency_samples{service=\"web\",probe=\"tcp-socket-read\"} 10",
            "tailtrap_incidents_open{service=\"idle\"} 0",
            "tailtrap_incidents_open{service=\"web\"} 1",
            "tailtrap_incident_open_info{id=\"7\",service=\"web\",probes=\"tcp-socket-read\",stage=\"application read delay\",cause=\"cpu-wait\",part_of=\"9\",headline=\"tcp-socket-read p99 1µs -> 20ms (\\\"20000x\\\")\"} 1",
            "# TYPE tailtrap_incidents_opened_total counter",
            "tailtrap_incidents_opened_total{service=\"web\",stage=\"application read delay\"} 3",
            "# TYPE tailtrap_incident_causes_total counter",
            "tailtrap_incident_causes_total{service=\"web\",cause=\"one-cpu\"} 2",
            "# TYPE tailtrap_notices_total counter",
            "tailtrap_notices_total{service=\"web\"} 4",
            "tailtrap_probe_info{probe=\"tcp-socket-read\",method=\"tp_btf\",detail=\"skb_copy_datagram_iovec\"} 1",
            "tailtrap_kernel_hol_excluded_total 5",
            "tailtrap_capture_armed{service=\"web\"} 1",
            "tailtrap_flight_recorder_samples 3",
            "tailtrap_pwru_sessions_total{state=\"ok\"} 2",
            "tailtrap_store_budget_bytes 1000",
            "tailtrap_store_engine_reopens_total 4",
            "tailtrap_intervals_total 42",
            "tailtrap_interval_failures_total 1",
            "tailtrap_interval_duration_seconds 0.0025",
            "# TYPE tailtrap_build_info gauge",
            "tailtrap_build_info{version=\"9.9.9\"} 1",
            "tailtrap_otlp_queue_events 2",
            "tailtrap_otlp_queue_capacity_events 4096",
            "tailtrap_otlp_events_sent_total 11",
            "tailtrap_otlp_events_dropped_total 1",
            "tailtrap_otlp_export_failures_total 3",
            "tailtrap_otlp_failing 1",
            "tailtrap_nic_hw_rx_stamping{interface=\"eth0\"} 1",
            "tailtrap_nic_hw_rx_stamping{interface=\"eth1\"} 0",
            "tailtrap_nic_phc_offset_seconds{interface=\"eth0\"} -36.999999588",
            "tailtrap_nic_phc_offset_read_time_seconds{interface=\"eth0\"} 1700000000",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Devices without a clock (veths) make no series.
        assert!(!text.contains("veth0"), "{text}");
        // Absent, not zero, while the baseline warms up.
        assert!(!text.contains("percentile=\"99.9\""));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"));

        let om = shared.render(Format::OpenMetrics).unwrap();
        let om = std::str::from_utf8(&om).unwrap();
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("# TYPE tailtrap_incidents_opened counter\n"));
        assert!(om.contains("# TYPE tailtrap_build info\n"));
        // Rendered once per snapshot: the same bytes again.
        assert_eq!(
            shared.render(Format::OpenMetrics).unwrap().as_ptr(),
            om.as_ptr()
        );
    }
}
