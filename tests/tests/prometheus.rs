//! tailtrap in a real Prometheus: the daemon with two TCP services on loopback, Debian's
//! `prometheus` scraping it every second (free port, scratch directory, the packaged alert
//! and fleet rules loaded), checked through Prometheus' HTTP API: the netstacklat-compatible
//! histograms per service, p99 against `tailtrap status`, the incident gauge during and
//! after an injected slowdown, the alert, every fleet rule evaluated without error, every
//! PromQL expression of the host and fleet Grafana dashboards. `promtool` checks a scrape
//! and runs the rules' unit tests.
//!
//! Needs root, the `tailtrap` binary of the same build, and `prometheus` + `promtool`
//! (Debian's `prometheus` package; scripts/test installs it). Host tier only.
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tailtrap_tests::{
    baselines_warm, cli_json, find_on_path, http_get, Daemon, DaemonConfig, LoopingClient, Netns,
    Prometheus, Proto, ScratchDir, ServerOpts, SinkStream, TcpServer, UdpServer, VethPair,
    SLOW_READER_DETECTOR,
};

const READ_PROBE: &str = "tcp-socket-read";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The value of a one-element instant-query result.
fn single_value(result: &Value) -> Option<f64> {
    let r = result.as_array()?;
    if r.len() != 1 {
        return None;
    }
    r[0]["value"][1].as_str()?.parse().ok()
}

/// `promtool ARGS` with `stdin`; its combined output, panicking when it fails.
fn promtool(args: &[&str], stdin: Option<&str>) -> String {
    let bin = find_on_path("promtool").expect("no promtool on PATH (Debian's prometheus package)");
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(repo())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every PromQL expression of the dashboard: panel targets, annotation queries, and the
/// selectors inside template variables' `label_values(...)`.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => out.push(e.clone()),
                        ("query", Value::String(q)) if q.starts_with("label_values(") => {
                            let inner = &q["label_values(".len()..q.rfind(',').unwrap()];
                            out.push(inner.to_owned());
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// A dashboard of packaging/grafana/.
fn dashboard(file: &str) -> Value {
    let path = repo().join("packaging/grafana").join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The expressions of `exprs` that return no data with the dashboards' variables set to
/// `instance` and the service `slow`; panics on one Prometheus refuses.
fn queries_without_data(prom: &Prometheus, exprs: &[String], instance: &str) -> Vec<String> {
    let mut empty = Vec::new();
    for e in exprs {
        let q = e
            .replace("$__rate_interval", "10s")
            .replace("$__range", "5m")
            .replace("$instance", instance)
            .replace("$service", "slow");
        match prom.query(&q) {
            Ok(r) if r.as_array().is_some_and(|a| !a.is_empty()) => {}
            Ok(_) => empty.push(q),
            Err(e) => panic!("dashboard query failed: {e}"),
        }
    }
    empty
}

/// Every link of the fleet dashboard (data links and the dashboard link) opens the host
/// dashboard by its uid and sets only variables it has; at least 3 drill down to a host.
fn check_fleet_links(fleet: &Value, host: &Value) {
    fn urls(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("url", Value::String(u)) => out.push(u.clone()),
                        _ => urls(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| urls(v, out)),
            _ => {}
        }
    }
    let uid = host["uid"].as_str().unwrap();
    let vars: Vec<&str> = host["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    let mut found = Vec::new();
    urls(fleet, &mut found);
    let drill_downs: Vec<&String> = found
        .iter()
        .filter(|u| u.contains("var-instance="))
        .collect();
    assert!(drill_downs.len() >= 3, "{found:?}");
    for u in &found {
        let (path, query) = u.split_once('?').unwrap_or((u, ""));
        assert_eq!(path, format!("/d/{uid}"), "{u}");
        for param in query.split('&') {
            if let Some((name, _)) = param.strip_prefix("var-").and_then(|p| p.split_once('=')) {
                assert!(
                    vars.contains(&name),
                    "{u}: the host dashboard has no {name}"
                );
            }
        }
    }
}

// Host tier only: tests/vm/run-vm-tests.sh leaves this executable out (HOST_ONLY).
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn prometheus_scrapes_histograms_incidents_and_every_dashboard_query() {
    // The packaged rules first: they need nothing running.
    promtool(
        &["check", "rules", "packaging/prometheus/tailtrap-alerts.yml"],
        None,
    );
    promtool(
        &[
            "test",
            "rules",
            "packaging/prometheus/tailtrap-alerts.test.yml",
        ],
        None,
    );
    promtool(
        &["check", "rules", "packaging/prometheus/tailtrap-fleet.yml"],
        None,
    );
    promtool(
        &[
            "test",
            "rules",
            "packaging/prometheus/tailtrap-fleet.test.yml",
        ],
        None,
    );
    let fleet_rules = repo().join("packaging/prometheus/tailtrap-fleet.yml");
    let fleet_rule_count = std::fs::read_to_string(&fleet_rules)
        .unwrap()
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("- record:") || l.starts_with("- alert:")
        })
        .count();
    let host_dashboard = dashboard("tailtrap-dashboard.json");
    let fleet_dashboard = dashboard("tailtrap-fleet-dashboard.json");
    check_fleet_links(&fleet_dashboard, &host_dashboard);

    let scratch = ScratchDir::new("prometheus").unwrap();
    let dir = scratch.path();
    let server = |delay| {
        TcpServer::spawn(ServerOpts {
            read_delay: delay,
            ..ServerOpts::loopback()
        })
        .unwrap()
    };
    let slow = server(Duration::ZERO);
    let quiet = server(Duration::ZERO);
    // The send panel needs packets through a device with a queue (loopback has none):
    // datagrams into a namespace over a veth with an idle pfifo.
    let ns = Netns::new("tt-prom").unwrap();
    let veth = VethPair::new(&ns).unwrap();
    veth.set_root_qdisc(&["pfifo"]).unwrap();
    let sink = UdpServer::spawn_sink(ServerOpts {
        bind: (veth.peer_v4, 0).into(),
        netns: Some(&ns),
        cgroup: None,
        read_delay: Duration::ZERO,
    })
    .unwrap();
    let _queued_traffic = SinkStream::start(
        Proto::Udp,
        sink.addr(),
        None,
        200,
        Duration::from_millis(5),
        Duration::from_secs(600),
    )
    .unwrap();
    let config = DaemonConfig::new(dir)
        .service("slow", slow.addr().port())
        .service("quiet", quiet.addr().port())
        .table(SLOW_READER_DETECTOR)
        .write()
        .unwrap();
    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let status = || cli_json(&config, &["status", "--json"]).0;
    let target: SocketAddr = status()["daemon"]["metrics_listen"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let instance = target.to_string();
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let prom = Prometheus::start(
        &prom_dir,
        target,
        &[
            repo().join("packaging/prometheus/tailtrap-alerts.yml"),
            fleet_rules,
        ],
    )
    .unwrap();
    let wait = |what: &str, secs: u64, f: &mut dyn FnMut() -> bool| {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "timed out waiting for {what}; prometheus log:\n{}\ndaemon log:\n{}",
                prom.log(),
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };

    // Fast reads until both services' baselines are warm.
    let _quiet_traffic = LoopingClient::start(quiet.addr(), Proto::Tcp);
    let _slow_traffic = LoopingClient::start(slow.addr(), Proto::Tcp);
    // Warm-up counts intervals of traffic, not seconds: a starved machine runs fewer of
    // them per second.
    daemon.wait_for(Duration::from_secs(180), "warm baselines", || {
        baselines_warm(&status(), READ_PROBE, &["slow", "quiet"]).then_some(())
    });

    // The histograms, per service, in Prometheus.
    wait("both services' histograms in Prometheus", 30, &mut || {
        ["slow", "quiet"].iter().all(|svc| {
            prom.query(&format!(
                "netstack_latency_tcp_sock_read_seconds_count{{service=\"{svc}\"}} > 0"
            ))
            .ok()
            .and_then(|r| single_value(&r))
            .is_some()
        })
    });
    let buckets = prom
        .query(r#"count by (service) (netstack_latency_tcp_sock_read_seconds_bucket{service=~"slow|quiet"})"#)
        .unwrap();
    for b in buckets.as_array().unwrap() {
        // 2^0 .. 2^34 ns and +Inf, as netstacklat's configuration.
        assert_eq!(b["value"][1], "36", "{buckets}");
    }
    assert_eq!(
        single_value(
            &prom
                .query(r#"tailtrap_incidents_open{service="slow"}"#)
                .unwrap()
        ),
        Some(0.0)
    );

    // `promtool check metrics` on a scrape in the text format.
    let scrape = http_get(target, "/metrics", None, Duration::from_secs(5)).unwrap();
    assert!(
        scrape.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        scrape.content_type
    );
    promtool(&["check", "metrics"], Some(&scrape.body));

    // The application now reads 20 ms late: the incident opens, Prometheus sees it.
    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    wait(
        "tailtrap_incidents_open{service=\"slow\"} = 1",
        60,
        &mut || {
            prom.query(r#"tailtrap_incidents_open{service="slow"}"#)
                .ok()
                .and_then(|r| single_value(&r))
                == Some(1.0)
        },
    );
    // Five seconds of slow reads in the window, then p99 from Prometheus' histogram against
    // `tailtrap status`'s. They cover different spans (Prometheus 5 s, status the last
    // interval), so on a busy machine the extra queueing lands in one and not the other: both
    // must show the slowdown (at or above the 20 ms delay's power-of-two bucket) and agree
    // within one bucket unless both are in that slow range.
    std::thread::sleep(Duration::from_secs(6));
    let s = status();
    let status_p99 = s["latency"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == "slow" && r["probe"] == READ_PROBE)
        .and_then(|r| r["p99_ns"].as_f64())
        .unwrap()
        / 1e9;
    let prom_p99 = single_value(
        &prom
            .query(r#"histogram_quantile(0.99, sum by (le) (rate(netstack_latency_tcp_sock_read_seconds_bucket{service="slow"}[5s])))"#)
            .unwrap(),
    )
    .unwrap();
    eprintln!("p99: status {status_p99:.6} s, Prometheus {prom_p99:.6} s");
    // The power-of-two bucket (2^(k-1), 2^k] ns each falls in.
    let bucket = |s: f64| (s * 1e9).log2().ceil();
    let slow_bucket = bucket(0.020) - 1.0;
    assert!(
        bucket(status_p99) >= slow_bucket && bucket(prom_p99) >= slow_bucket,
        "the 20 ms slowdown missing: status p99 {status_p99} s, Prometheus {prom_p99} s"
    );
    assert!(
        (bucket(status_p99) - bucket(prom_p99)).abs() <= 1.0
            || (status_p99 >= 0.016 && prom_p99 >= 0.016),
        "status p99 {status_p99} s vs Prometheus {prom_p99} s"
    );

    // The packaged alert fires, with the incident's headline and stage.
    wait("the TailtrapIncidentOpen alert", 30, &mut || {
        prom.api("alerts", &[]).is_ok_and(|a| {
            a["alerts"].as_array().is_some_and(|alerts| {
                alerts.iter().any(|al| {
                    al["labels"]["alertname"] == "TailtrapIncidentOpen"
                        && al["labels"]["service"] == "slow"
                        && al["state"] == "firing"
                        && al["annotations"]["headline"]
                            .as_str()
                            .is_some_and(|h| h.starts_with("tcp-socket-read"))
                        && al["annotations"]["stage"] == "application read delay"
                })
            })
        })
    });

    // Every rule of tailtrap-fleet.yml has been evaluated, none with an error.
    wait("every fleet rule evaluated without error", 30, &mut || {
        let groups = prom.api("rules", &[]).unwrap();
        let rules: Vec<&Value> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| {
                g["file"]
                    .as_str()
                    .is_some_and(|f| f.ends_with("tailtrap-fleet.yml"))
            })
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        assert_eq!(rules.len(), fleet_rule_count, "{groups}");
        for r in &rules {
            assert_ne!(r["health"], "err", "fleet rule failed: {r}");
        }
        rules.iter().all(|r| r["health"] == "ok")
    });
    // With the incident open, the fleet counts this host under its stage and service; one
    // host is no fleet: no fleet alert.
    wait(
        "the fleet rules to count the open incident",
        30,
        &mut || {
            [
                r#"stage:tailtrap_hosts_with_open_incident:count{stage="application read delay"}"#,
                r#"stage:tailtrap_hosts_with_open_incident:ratio{stage="application read delay"}"#,
                r#"service:tailtrap_hosts_with_open_incident:count{service="slow"}"#,
            ]
            .iter()
            .all(|q| prom.query(q).ok().and_then(|r| single_value(&r)) == Some(1.0))
        },
    );
    let fleet_alerts = prom
        .query(r#"ALERTS{alertname=~"TailtrapFleet.+"}"#)
        .unwrap();
    assert_eq!(fleet_alerts, Value::Array(Vec::new()), "{fleet_alerts}");

    // Every PromQL expression of both dashboards parses and returns data, with the
    // dashboards' variables set to this daemon and the slow service (its incident is open
    // now).
    for (name, dashboard, at_least) in [
        ("host", &host_dashboard, 20),
        ("fleet", &fleet_dashboard, 15),
    ] {
        let exprs = dashboard_exprs(dashboard);
        assert!(exprs.len() > at_least, "{exprs:?}");
        wait(
            &format!("every {name} dashboard query to return data"),
            30,
            &mut || {
                let empty = queries_without_data(&prom, &exprs, &instance);
                if !empty.is_empty() {
                    eprintln!("still without data: {empty:#?}");
                }
                empty.is_empty()
            },
        );
        eprintln!("{} {name} dashboard expressions return data", exprs.len());
    }

    // The figures of `tailtrap status` and of a scrape of the same interval agree.
    let agree = compare_status_and_scrape(&config, target);
    assert!(
        agree,
        "no status and scrape of the same interval in 50 tries"
    );

    // Fast reads again: the incident closes, the gauge returns to 0.
    slow.set_read_delay(Duration::ZERO).unwrap();
    wait(
        "tailtrap_incidents_open{service=\"slow\"} = 0",
        90,
        &mut || {
            prom.query(r#"tailtrap_incidents_open{service="slow"}"#)
                .ok()
                .and_then(|r| single_value(&r))
                == Some(0.0)
        },
    );
    assert_eq!(
        single_value(
            &prom
                .query(r#"sum(tailtrap_incidents_opened_total{service="slow"})"#)
                .unwrap()
        ),
        Some(1.0)
    );
}

/// Read the status, scrape, read the status again; when all three are of the same interval
/// (the daemon runs 5 a second), check that the scrape shows the status' figures. False when
/// no such triple came in 50 tries.
fn compare_status_and_scrape(config: &Path, target: SocketAddr) -> bool {
    for _ in 0..50 {
        let before = cli_json(config, &["status", "--json"]).0;
        let scrape = http_get(target, "/metrics", None, Duration::from_secs(5))
            .unwrap()
            .body;
        let after = cli_json(config, &["status", "--json"]).0;
        let samples = parse_samples(&scrape);
        let get = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
            samples
                .iter()
                .find(|(n, l, _)| {
                    n == name
                        && labels
                            .iter()
                            .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
                })
                .map(|(_, _, v)| *v)
        };
        let intervals = before["daemon"]["intervals"].as_u64().unwrap();
        if after["daemon"]["intervals"].as_u64() != Some(intervals)
            || get("tailtrap_intervals_total", &[]) != Some(intervals as f64)
        {
            continue;
        }
        let s = &before;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
        for row in s["latency"].as_array().unwrap() {
            let (service, probe) = (
                row["service"].as_str().unwrap(),
                row["probe"].as_str().unwrap(),
            );
            let sp = [("service", service), ("probe", probe)];
            assert_eq!(
                get("tailtrap_interval_latency_samples", &sp),
                row["count"].as_f64(),
                "{service} {probe}"
            );
            for (q, key, base) in [
                ("50", "p50_ns", "baseline_p50_ns"),
                ("99", "p99_ns", "baseline_p99_ns"),
                ("99.9", "p999_ns", "baseline_p999_ns"),
            ] {
                let l = [("service", service), ("probe", probe), ("percentile", q)];
                for (metric, field) in [
                    ("tailtrap_interval_latency_seconds", key),
                    ("tailtrap_baseline_latency_seconds", base),
                ] {
                    match (get(metric, &l), row[field].as_f64()) {
                        (Some(m), Some(ns)) => {
                            assert!(close(m, ns / 1e9), "{metric} {l:?}: {m} vs {ns} ns")
                        }
                        (None, None) => {}
                        other => panic!("{metric} {l:?}: {other:?}"),
                    }
                }
            }
        }
        let open: Vec<&str> = s["open_incidents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["service"].as_str().unwrap())
            .collect();
        for svc in ["slow", "quiet"] {
            let want = if open.contains(&svc) { 1.0 } else { 0.0 };
            assert_eq!(
                get("tailtrap_incidents_open", &[("service", svc)]),
                Some(want)
            );
        }
        for o in s["open_incidents"].as_array().unwrap() {
            let id = o["id"].to_string();
            assert_eq!(
                get(
                    "tailtrap_incident_open_info",
                    &[
                        ("id", id.as_str()),
                        ("headline", o["headline"].as_str().unwrap())
                    ]
                ),
                Some(1.0)
            );
        }
        for c in s["incidents_opened"].as_array().unwrap() {
            let l = [
                ("service", c["service"].as_str().unwrap()),
                ("stage", c["stage"].as_str().unwrap()),
            ];
            assert_eq!(
                get("tailtrap_incidents_opened_total", &l),
                c["count"].as_f64()
            );
        }
        let k = &s["kernel_counters"];
        for (metric, field) in [
            ("tailtrap_kernel_map_full_drops_total", "map_full_drops"),
            ("tailtrap_kernel_zero_tstamp_total", "zero_tstamp"),
            ("tailtrap_kernel_future_tstamp_total", "future_tstamp"),
            ("tailtrap_kernel_hol_excluded_total", "hol_excluded"),
            (
                "tailtrap_kernel_auto_service_overflow_total",
                "auto_overflow",
            ),
            ("tailtrap_kernel_auto_service_freed_total", "auto_freed"),
            (
                "tailtrap_kernel_nic_stamp_no_clock_total",
                "nic_stamp_no_clock",
            ),
            (
                "tailtrap_kernel_nic_stamp_out_of_bounds_total",
                "nic_stamp_out_of_bounds",
            ),
        ] {
            assert_eq!(get(metric, &[]), k[field].as_f64(), "{metric}");
        }
        let c = &s["capture"];
        assert_eq!(
            get("tailtrap_capture_available", &[]),
            Some(if c["available"] == true { 1.0 } else { 0.0 })
        );
        assert_eq!(
            get("tailtrap_flight_recorder_samples", &[]),
            c["flight_samples"].as_f64()
        );
        assert_eq!(
            get(
                "tailtrap_capture_records_emitted_total",
                &[("recorder", "armed")]
            ),
            c["counters"]["emitted"].as_f64()
        );
        assert_eq!(
            get(
                "tailtrap_capture_records_lost_total",
                &[("recorder", "all"), ("reason", "user_queue_full")]
            ),
            c["counters"]["user_space_lost"].as_f64()
        );
        for p in s["probes"].as_array().unwrap() {
            let method = p["method"].as_str().unwrap();
            let kind = method.split([' ', ':']).next().unwrap();
            assert_eq!(
                get(
                    "tailtrap_probe_info",
                    &[("probe", p["probe"].as_str().unwrap()), ("method", kind)]
                ),
                Some(1.0),
                "{method}"
            );
        }
        let st = &s["store"];
        assert_eq!(
            get("tailtrap_store_write_errors_total", &[]),
            st["write_errors"].as_f64()
        );
        for (metric, field) in [
            (
                "tailtrap_store_dropped_history_intervals_total",
                "dropped_history_intervals",
            ),
            ("tailtrap_store_dropped_samples_total", "dropped_samples"),
        ] {
            assert_eq!(get(metric, &[]), st[field].as_f64(), "{metric}");
        }
        assert_eq!(
            get("tailtrap_store_engine_failed", &[]),
            Some(if st["engine_failed"] == true {
                1.0
            } else {
                0.0
            })
        );
        assert_eq!(
            get("tailtrap_store_budget_bytes", &[]),
            st["max_bytes"].as_f64()
        );
        assert_eq!(
            get("tailtrap_interval_failures_total", &[]),
            s["daemon"]["interval_errors"].as_f64()
        );
        assert_eq!(
            get(
                "tailtrap_build_info",
                &[("version", s["daemon"]["version"].as_str().unwrap())]
            ),
            Some(1.0)
        );
        return true;
    }
    false
}

/// One sample line of a scrape: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Every sample line of a text-format scrape.
fn parse_samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap(),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.strip_suffix('}').unwrap())),
            None => (series, Vec::new()),
        };
        out.push((name.to_owned(), labels, value));
    }
    out
}

fn parse_labels(mut s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some((key, rest)) = s.split_once("=\"") {
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((key.trim_start_matches(',').to_owned(), value));
        s = &rest[end..];
    }
    out
}
