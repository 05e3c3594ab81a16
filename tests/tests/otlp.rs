//! Incidents to a real OpenTelemetry Collector (`[otlp]`, docs/operations.md): the
//! collector of `tests/otelcol/` (OTLP receiver, file exporter) takes what the daemon sends
//! and the test reads back what it decoded.
//!
//! - over gRPC: an incident's opening arrives with its resource and attributes; the
//!   collector stopped for 30 s while incidents open and close: the events wait (status and
//!   `/metrics` say so), and after its restart every one arrives, in order, once;
//! - over HTTP/protobuf with mutual TLS: a client without its certificate is a counted,
//!   logged failure (the daemon keeps running); with it, the events arrive;
//! - `tailtrap config check` names a bad endpoint or TLS file by its key.
//!
//! Needs root (the daemon's probes) and the collector binary (`TAILTRAP_OTELCOL`, or built
//! by tests/otelcol/build.sh). Host tier only.
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tailtrap_tests::{
    attr, baselines_warm, cli_json, config_check, http_get, make_test_pki, resource_attr, Daemon,
    DaemonConfig, LoopingClient, OtelCollector, OtelCollectorOpts, OtelTls, Proto, ScratchDir,
    ServerOpts, TcpServer, SLOW_READER_DETECTOR,
};

const READ_PROBE: &str = "tcp-socket-read";
const SLOW: Duration = Duration::from_millis(20);

/// A daemon watching one TCP service on loopback, with `otlp` as its `[otlp]` table.
fn config(dir: &Path, port: u16, otlp: &str) -> PathBuf {
    DaemonConfig::new(dir)
        .service("web", port)
        .table(&format!("[otlp]\nenabled = true\n{otlp}"))
        .table(SLOW_READER_DETECTOR)
        .write()
        .unwrap()
}

fn status(config: &Path) -> Value {
    cli_json(config, &["status", "--json"]).0
}

/// The daemon up with the service's baselines warm (fast reads meanwhile).
fn warm_daemon(config: &Path, dir: &Path) -> Daemon {
    let daemon = Daemon::start(config, dir, &[]).unwrap();
    daemon.wait_for_api(config, Duration::from_secs(60));
    daemon.wait_for(Duration::from_secs(180), "warm baselines", || {
        baselines_warm(&status(config), READ_PROBE, &["web"]).then_some(())
    });
    daemon
}

fn open_incidents(config: &Path) -> usize {
    status(config)["open_incidents"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Slow the application's reads until an incident is open.
fn open_one(daemon: &Daemon, config: &Path, server: &TcpServer) {
    server.set_read_delay(SLOW).unwrap();
    daemon.wait_for(Duration::from_secs(60), "an incident to open", || {
        (open_incidents(config) > 0).then_some(())
    });
}

/// Fast reads again until no incident is open.
fn close_all(daemon: &Daemon, config: &Path, server: &TcpServer) {
    server.set_read_delay(Duration::ZERO).unwrap();
    daemon.wait_for(Duration::from_secs(60), "the incidents to close", || {
        (open_incidents(config) == 0).then_some(())
    });
}

fn str_attr(record: &Value, key: &str) -> Option<String> {
    attr(record, key).and_then(|v| v.as_str().map(str::to_owned))
}

fn event_name(record: &Value) -> String {
    record["eventName"].as_str().unwrap_or_default().to_owned()
}

/// The records of `name` for the daemon's service.
fn events<'a>(records: &'a [Value], name: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| {
            event_name(r) == name && str_attr(r, "tailtrap.service").as_deref() == Some("web")
        })
        .collect()
}

fn metric(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn incidents_reach_a_real_collector_and_wait_out_its_outage() {
    let scratch = ScratchDir::new("otlp-grpc").unwrap();
    let dir = scratch.path();
    let mut collector = OtelCollector::start(&dir.join("otelcol"), {
        std::fs::create_dir_all(dir.join("otelcol")).unwrap();
        OtelCollectorOpts::default()
    })
    .unwrap();
    let server = TcpServer::spawn(ServerOpts::loopback()).unwrap();
    let config = config(
        dir,
        server.addr().port(),
        &format!(
            "endpoint = \"{}\"\nprotocol = \"grpc\"\nqueue_size = 256\ntimeout = \"2s\"\n\
             resource_attributes = {{ \"deployment.environment\" = \"ci\" }}",
            collector.grpc_endpoint()
        ),
    );
    let _traffic = LoopingClient::start(server.addr(), Proto::Tcp);
    let daemon = warm_daemon(&config, dir);

    // An incident opens: its event arrives, decoded by the collector, with what a fleet
    // needs to find and group it.
    open_one(&daemon, &config, &server);
    let records = collector
        .wait_log_records(Duration::from_secs(30), "the opened event", |r| {
            !events(r, "tailtrap.incident.opened").is_empty()
        })
        .unwrap();
    let opened = events(&records, "tailtrap.incident.opened")[0];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for (key, want) in [
        ("service.name", "tailtrap"),
        ("host.name", host.trim()),
        ("os.type", "linux"),
        ("os.version", kernel.trim()),
        ("deployment.environment", "ci"),
    ] {
        assert_eq!(
            resource_attr(opened, key).and_then(|v| v.as_str().map(str::to_owned)),
            Some(want.to_owned()),
            "resource attribute {key}: {opened}"
        );
    }
    assert!(
        resource_attr(opened, "service.version").is_some(),
        "{opened}"
    );
    assert!(resource_attr(opened, "host.id").is_some(), "{opened}");
    assert_eq!(opened["severityText"], "WARN", "{opened}");
    assert_eq!(
        str_attr(opened, "tailtrap.stage").as_deref(),
        Some("application read delay"),
        "{opened}"
    );
    assert_eq!(
        str_attr(opened, "tailtrap.probe").as_deref(),
        Some(READ_PROBE)
    );
    assert!(
        str_attr(opened, "tailtrap.headline").is_some_and(|h| h.starts_with(READ_PROBE)),
        "{opened}"
    );
    let ratio = attr(opened, "tailtrap.latency.ratio").and_then(|v| v.as_f64());
    assert!(ratio.is_some_and(|r| r > 1.0), "{opened}");
    let id = attr(opened, "tailtrap.incident.id")
        .and_then(|v| v.as_i64())
        .unwrap();
    assert_eq!(
        str_attr(opened, "tailtrap.evidence"),
        Some(format!(
            "tailtrap export {id} (on this host; `tailtrap incidents show {id}` for a summary)"
        ))
    );
    // The incident in the store is the one the collector heard of.
    let (shown, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert_eq!(shown["incident"]["service"], "web", "{shown}");

    // The collector goes away for 30 s; incidents keep opening and closing meanwhile.
    close_all(&daemon, &config, &server);
    collector
        .wait_log_records(Duration::from_secs(30), "the first closed event", |r| {
            !events(r, "tailtrap.incident.closed").is_empty()
        })
        .unwrap();
    let before = collector.log_records().unwrap().len();
    collector.stop().unwrap();
    let outage = Instant::now();
    let mut cycles = 0;
    while outage.elapsed() < Duration::from_secs(30) || cycles < 2 {
        open_one(&daemon, &config, &server);
        close_all(&daemon, &config, &server);
        cycles += 1;
    }
    let s = status(&config);
    let otlp = &s["otlp"];
    assert!(otlp["failed_exports"].as_u64().unwrap() > 0, "{otlp}");
    assert!(otlp["failing_since_ns"].is_u64(), "{otlp}");
    assert!(otlp["last_error"].is_string(), "{otlp}");
    let waiting = otlp["queued"].as_u64().unwrap();
    // Each cycle queued an opening and a closing (and maybe changes).
    assert!(waiting >= 2 * cycles, "{cycles} cycles, {otlp}");
    assert_eq!(otlp["dropped"], 0, "{otlp}");
    let listen = s["daemon"]["metrics_listen"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let scrape = http_get(listen, "/metrics", None, Duration::from_secs(5))
        .unwrap()
        .body;
    assert_eq!(
        metric(&scrape, "tailtrap_otlp_failing"),
        Some(1.0),
        "{scrape}"
    );
    assert!(
        metric(&scrape, "tailtrap_otlp_queue_events").is_some_and(|q| q >= 2.0 * cycles as f64),
        "{scrape}"
    );
    // Nothing was lost locally either: every incident of the outage is in the store.
    let stored = cli_json(&config, &["incidents", "--json"]).0;
    let stored_ids: Vec<i64> = stored["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["id"].as_i64())
        .collect();
    assert!(stored_ids.len() as u64 > cycles, "{stored}");

    // Back: what waited arrives, in the order it happened, each event once.
    collector.restart().unwrap();
    daemon.wait_for(Duration::from_secs(60), "the queue to drain", || {
        let o = &status(&config)["otlp"];
        (o["queued"] == 0 && o["failing_since_ns"].is_null()).then_some(())
    });
    let records = collector
        .wait_log_records(Duration::from_secs(10), "the queued events", |r| {
            r.len() as u64 >= before as u64 + waiting
        })
        .unwrap();
    let ids: Vec<String> = records
        .iter()
        .filter_map(|r| str_attr(r, "tailtrap.event.id"))
        .collect();
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "an event arrived twice: {ids:#?}");
    let lifecycle: Vec<(i64, String, u64)> = records
        .iter()
        .filter(|r| {
            matches!(
                event_name(r).as_str(),
                "tailtrap.incident.opened" | "tailtrap.incident.closed"
            )
        })
        .map(|r| {
            (
                attr(r, "tailtrap.incident.id")
                    .and_then(|v| v.as_i64())
                    .unwrap(),
                event_name(r),
                r["timeUnixNano"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    // Every incident in the store opened and closed, as the collector saw it.
    for id in &stored_ids {
        for name in ["tailtrap.incident.opened", "tailtrap.incident.closed"] {
            assert_eq!(
                lifecycle
                    .iter()
                    .filter(|(i, n, _)| i == id && n == name)
                    .count(),
                1,
                "incident {id}: {name} missing or repeated in {lifecycle:#?}"
            );
        }
    }
    // In order: each opening and closing later than the one before it.
    for w in lifecycle.windows(2) {
        assert!(w[0].2 <= w[1].2, "out of order: {lifecycle:#?}");
    }
    let closed = events(&records, "tailtrap.incident.closed");
    let last = closed.last().unwrap();
    assert!(
        attr(last, "tailtrap.incident.duration_s").is_some(),
        "{last}"
    );
    assert_eq!(
        str_attr(last, "tailtrap.incident.state").as_deref(),
        Some("closed")
    );
    drop(daemon);
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn http_with_mutual_tls_fails_loudly_without_its_certificate_and_works_with_it() {
    let scratch = ScratchDir::new("otlp-mtls").unwrap();
    let dir = scratch.path();
    let pki = make_test_pki(&dir.join("pki")).unwrap();
    std::fs::create_dir_all(dir.join("otelcol")).unwrap();
    let collector = OtelCollector::start(
        &dir.join("otelcol"),
        OtelCollectorOpts {
            tls: Some(OtelTls {
                cert_file: pki.server_cert.clone(),
                key_file: pki.server_key.clone(),
                client_ca_file: Some(pki.ca_cert.clone()),
            }),
            ..OtelCollectorOpts::default()
        },
    )
    .unwrap();
    let server = TcpServer::spawn(ServerOpts::loopback()).unwrap();
    let _traffic = LoopingClient::start(server.addr(), Proto::Tcp);
    let common = format!(
        "endpoint = \"{}\"\nprotocol = \"http/protobuf\"\ntimeout = \"2s\"\ntls_ca_file = \"{}\"",
        collector.http_endpoint(),
        pki.ca_cert.display()
    );

    // Without the client certificate the collector refuses the handshake: counted, logged,
    // and the daemon carries on detecting. A queue of one event keeps only the newest.
    let config = config(
        dir,
        server.addr().port(),
        &format!("{common}\nqueue_size = 1"),
    );
    let mut daemon = warm_daemon(&config, dir);
    open_one(&daemon, &config, &server);
    daemon.wait_for(Duration::from_secs(30), "a failed export", || {
        let o = &status(&config)["otlp"];
        (o["failed_exports"].as_u64()? > 0).then_some(())
    });
    let before = status(&config)["daemon"]["intervals"].as_u64().unwrap();
    close_all(&daemon, &config, &server);
    let s = status(&config);
    assert!(s["daemon"]["intervals"].as_u64().unwrap() > before);
    assert!(s["otlp"]["last_error"].is_string(), "{}", s["otlp"]);
    assert_eq!(s["otlp"]["sent"], 0, "{}", s["otlp"]);
    // The opening and the closing were queued: the opening was dropped for the closing.
    assert_eq!(s["otlp"]["queued"], 1, "{}", s["otlp"]);
    assert!(s["otlp"]["dropped"].as_u64().unwrap() >= 1, "{}", s["otlp"]);
    assert!(
        daemon.log().contains("the OTLP queue is full"),
        "{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("OTLP export failing"),
        "{}",
        daemon.log()
    );
    assert!(collector.log_records().unwrap().is_empty());
    daemon.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    daemon.wait_exit(Duration::from_secs(30)).unwrap();

    // With it (and the baselines the first run saved), the events arrive over HTTP.
    let config = self::config(
        dir,
        server.addr().port(),
        &format!(
            "{common}\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            pki.client_cert.display(),
            pki.client_key.display()
        ),
    );
    let daemon = warm_daemon(&config, dir);
    open_one(&daemon, &config, &server);
    let records = collector
        .wait_log_records(Duration::from_secs(30), "the opened event over mTLS", |r| {
            !events(r, "tailtrap.incident.opened").is_empty()
        })
        .unwrap();
    let opened = events(&records, "tailtrap.incident.opened")[0];
    assert_eq!(
        resource_attr(opened, "service.name").and_then(|v| v.as_str().map(str::to_owned)),
        Some("tailtrap".to_owned())
    );
    let o = &status(&config)["otlp"];
    assert!(o["sent"].as_u64().unwrap() >= 1, "{o}");
    assert!(o["failing_since_ns"].is_null(), "{o}");
}

#[test]
fn config_check_names_a_bad_endpoint_or_tls_file() {
    let scratch = ScratchDir::new("otlp-config").unwrap();
    let dir = scratch.path();
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    // (the [otlp] lines, what the error must say, whether the key is on a line of the file)
    for (otlp, want, on_a_line) in [
        (
            "endpoint = \"collector:4317\"".to_owned(),
            "key `otlp.endpoint`",
            true,
        ),
        (
            format!(
                "endpoint = \"https://c:4317\"\ntls_ca_file = \"{}\"",
                not_pem.display()
            ),
            "key `otlp.tls_ca_file`",
            true,
        ),
        (
            format!(
                "endpoint = \"https://c:4317\"\ntls_ca_file = \"{}\"",
                dir.join("missing.pem").display()
            ),
            "No such file",
            true,
        ),
        (
            "endpoint = \"https://c:4317\"\ntls_cert_file = \"/x.pem\"".to_owned(),
            "key `otlp.tls_key_file`",
            false,
        ),
    ] {
        let path = dir.join("bad.toml");
        std::fs::write(&path, format!("[otlp]\nenabled = true\n{otlp}\n")).unwrap();
        let out = config_check(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{otlp}: accepted\n{stdout}");
        assert!(
            stderr.contains(want) || stdout.contains(want),
            "{otlp}: wanted {want:?} in\n{stderr}{stdout}"
        );
        // Named with its file and line.
        assert!(
            !on_a_line
                || stderr.contains(&format!("{}, line ", path.display()))
                || stdout.contains(&format!("{}, line ", path.display())),
            "{stderr}{stdout}"
        );
    }
}
