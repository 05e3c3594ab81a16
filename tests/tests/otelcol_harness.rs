//! The OTLP test harness against itself: the real collector of `tests/otelcol/` receives
//! an OTLP/HTTP JSON log request sent with `curl`, and `log_records()` gives back the record
//! with its attributes, resource and scope; a restart keeps the ports and what arrived
//! before. With TLS from `make_test_pki`: plain HTTP to the TLS port is refused, HTTPS
//! trusting the test CA works, over HTTP and gRPC; with mutual TLS a client without the
//! client certificate is refused.
//!
//! Before the product's OTLP tests rely on this harness, these show that it sees what a
//! collector really decoded (so an empty list means nothing arrived, not a broken reader).
//!
//! Needs the collector binary (`TAILTRAP_OTELCOL`, else `tests/otelcol/build.sh` builds it:
//! Go 1.26+, minutes the first time), `curl` and `openssl`. No root.
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use tailtrap_tests::{
    any_value, attr, make_test_pki, resource_attr, OtelCollector, OtelCollectorOpts, OtelTls,
    ScratchDir,
};

/// One log record with a resource and scope, as OTLP/HTTP JSON.
fn log_request(message: &str) -> Value {
    let kv = |k: &str, v: Value| json!({ "key": k, "value": v });
    json!({
        "resourceLogs": [{
            "resource": { "attributes": [
                kv("service.name", json!({ "stringValue": "tailtrap-harness" })),
            ]},
            "scopeLogs": [{
                "scope": { "name": "tailtrap.harness", "version": "1" },
                "logRecords": [{
                    "timeUnixNano": "1700000000000000000",
                    "severityNumber": 13,
                    "severityText": "WARN",
                    "body": { "stringValue": message },
                    "attributes": [
                        kv("tailtrap.service", json!({ "stringValue": "web" })),
                        kv("tailtrap.p99_us", json!({ "intValue": "4242" })),
                        kv("tailtrap.ratio", json!({ "doubleValue": 1.5 })),
                        kv("tailtrap.open", json!({ "boolValue": true })),
                        kv("tailtrap.probes", json!({ "arrayValue": { "values": [
                            { "stringValue": "tcp-start" }, { "intValue": "7" },
                        ]}})),
                    ],
                }],
            }],
        }],
    })
}

/// `curl` POSTing `body` as JSON to `url` with `extra` arguments; its output (the HTTP
/// status on stdout, `000` when no HTTP answer came).
fn post_json(dir: &Path, url: &str, body: &Value, extra: &[&str]) -> Output {
    let file = dir.join("request.json");
    std::fs::write(&file, body.to_string()).unwrap();
    Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("cannot run curl")
}

fn status(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// An empty OTLP/gRPC logs export (a zero-length protobuf message in a gRPC frame) sent with
/// curl over HTTP/2: the `grpc-status` trailer the server answered, or curl's failure.
fn grpc_export(dir: &Path, url: &str, extra: &[&str]) -> Result<String, String> {
    let frame = dir.join("grpc-frame");
    std::fs::write(&frame, [0u8; 5]).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "20"])
        .args(["-H", "Content-Type: application/grpc", "-H", "TE: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", frame.display()))
        .args(extra)
        .arg(format!(
            "{url}/opentelemetry.proto.collector.logs.v1.LogsService/Export"
        ))
        .output()
        .expect("cannot run curl");
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "curl {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    text.lines()
        .find_map(|l| l.strip_prefix("grpc-status:").map(|s| s.trim().to_owned()))
        .ok_or_else(|| format!("no grpc-status in {text:?}"))
}

fn wait_for(c: &OtelCollector, n: usize) -> Vec<Value> {
    c.wait_log_records(Duration::from_secs(20), &format!("{n} log records"), |r| {
        r.len() >= n
    })
    .unwrap()
}

#[test]
#[ignore = "needs the OpenTelemetry Collector of tests/otelcol (TAILTRAP_OTELCOL, else tests/otelcol/build.sh builds it with Go 1.26+): run with --include-ignored"]
fn http_json_logs_arrive_with_attributes_and_survive_a_restart() {
    let dir = ScratchDir::new("otelcol-plain").unwrap();
    let mut c = OtelCollector::start(dir.path(), OtelCollectorOpts::default()).unwrap();
    assert!(c.grpc_endpoint().starts_with("http://127.0.0.1:"));
    assert!(c.http_endpoint().starts_with("http://127.0.0.1:"));
    assert_ne!(c.grpc_addr(), c.http_addr());

    let url = format!("{}/v1/logs", c.http_endpoint());
    let out = post_json(dir.path(), &url, &log_request("first"), &[]);
    assert_eq!(status(&out), "200", "{out:?}\ncollector log:\n{}", c.log());
    let records = wait_for(&c, 1);
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(any_value(&r["body"]), Some(json!("first")));
    assert_eq!(r["severityText"], "WARN");
    assert_eq!(r["severityNumber"], 13);
    assert_eq!(attr(r, "tailtrap.service"), Some(json!("web")));
    assert_eq!(attr(r, "tailtrap.p99_us"), Some(json!(4242)));
    assert_eq!(attr(r, "tailtrap.ratio"), Some(json!(1.5)));
    assert_eq!(attr(r, "tailtrap.open"), Some(json!(true)));
    assert_eq!(attr(r, "tailtrap.probes"), Some(json!(["tcp-start", 7])));
    assert_eq!(attr(r, "absent"), None);
    assert_eq!(
        resource_attr(r, "service.name"),
        Some(json!("tailtrap-harness"))
    );
    assert_eq!(r["scope"]["name"], "tailtrap.harness");

    // The gRPC port speaks OTLP too (an empty export is accepted).
    assert_eq!(
        grpc_export(dir.path(), &c.grpc_endpoint(), &["--http2-prior-knowledge"]),
        Ok("0".to_owned())
    );

    // Stopped, the ports refuse; restarted, the same ports accept again and the output
    // keeps what came before.
    let (grpc, http) = (c.grpc_addr(), c.http_addr());
    c.stop().unwrap();
    assert!(!c.is_running());
    assert!(TcpStream::connect(http).is_err(), "{http} still accepts");
    assert!(TcpStream::connect(grpc).is_err(), "{grpc} still accepts");
    c.restart().unwrap();
    assert_eq!((c.grpc_addr(), c.http_addr()), (grpc, http));
    let out = post_json(dir.path(), &url, &log_request("second"), &[]);
    assert_eq!(status(&out), "200", "{out:?}\ncollector log:\n{}", c.log());
    let records = wait_for(&c, 2);
    let bodies: Vec<_> = records.iter().map(|r| any_value(&r["body"])).collect();
    assert_eq!(bodies, [Some(json!("first")), Some(json!("second"))]);
}

#[test]
#[ignore = "needs the OpenTelemetry Collector of tests/otelcol (TAILTRAP_OTELCOL, else tests/otelcol/build.sh builds it with Go 1.26+): run with --include-ignored"]
fn tls_refuses_plain_text_and_mutual_tls_refuses_clients_without_a_certificate() {
    let dir = ScratchDir::new("otelcol-tls").unwrap();
    let pki = make_test_pki(&dir.path().join("pki")).unwrap();
    let cacert = pki.ca_cert.display().to_string();
    let client_cert = pki.client_cert.display().to_string();
    let client_key = pki.client_key.display().to_string();

    // Server TLS only.
    let tls_dir = dir.path().join("tls");
    std::fs::create_dir(&tls_dir).unwrap();
    let tls = OtelTls {
        cert_file: pki.server_cert.clone(),
        key_file: pki.server_key.clone(),
        client_ca_file: None,
    };
    let c = OtelCollector::start(
        &tls_dir,
        OtelCollectorOpts {
            tls: Some(tls.clone()),
            ..OtelCollectorOpts::default()
        },
    )
    .unwrap();
    assert!(c.http_endpoint().starts_with("https://127.0.0.1:"));
    assert!(c.grpc_endpoint().starts_with("https://127.0.0.1:"));
    let plain = format!("http://{}/v1/logs", c.http_addr());
    let out = post_json(&tls_dir, &plain, &log_request("plain"), &[]);
    assert!(
        !status(&out).starts_with('2'),
        "plain HTTP to the TLS port was accepted: {out:?}"
    );
    let url = format!("{}/v1/logs", c.http_endpoint());
    let out = post_json(&tls_dir, &url, &log_request("untrusted"), &[]);
    assert!(
        !out.status.success(),
        "HTTPS without trusting the test CA worked: {out:?}"
    );
    let out = post_json(&tls_dir, &url, &log_request("tls"), &["--cacert", &cacert]);
    assert_eq!(status(&out), "200", "{out:?}\ncollector log:\n{}", c.log());
    // As `localhost` too: the certificate names both.
    let by_name = url.replace("127.0.0.1", "localhost");
    let out = post_json(
        &tls_dir,
        &by_name,
        &log_request("tls"),
        &["--cacert", &cacert],
    );
    assert_eq!(status(&out), "200", "{out:?}\ncollector log:\n{}", c.log());
    assert_eq!(
        grpc_export(
            &tls_dir,
            &c.grpc_endpoint(),
            &["--http2", "--cacert", &cacert]
        ),
        Ok("0".to_owned())
    );
    let records = wait_for(&c, 2);
    assert!(
        records
            .iter()
            .all(|r| any_value(&r["body"]) == Some(json!("tls"))),
        "{records:#?}"
    );

    // Mutual TLS.
    let mtls_dir = dir.path().join("mtls");
    std::fs::create_dir(&mtls_dir).unwrap();
    let m = OtelCollector::start(
        &mtls_dir,
        OtelCollectorOpts {
            tls: Some(OtelTls {
                client_ca_file: Some(pki.ca_cert.clone()),
                ..tls
            }),
            ..OtelCollectorOpts::default()
        },
    )
    .unwrap();
    let url = format!("{}/v1/logs", m.http_endpoint());
    let out = post_json(
        &mtls_dir,
        &url,
        &log_request("anonymous"),
        &["--cacert", &cacert],
    );
    assert!(
        !status(&out).starts_with('2'),
        "mutual TLS accepted a client without a certificate: {out:?}"
    );
    assert_ne!(
        grpc_export(
            &mtls_dir,
            &m.grpc_endpoint(),
            &["--http2", "--cacert", &cacert]
        ),
        Ok("0".to_owned()),
        "mutual TLS on gRPC accepted a client without a certificate"
    );
    let with_cert = [
        "--cacert",
        &cacert,
        "--cert",
        &client_cert,
        "--key",
        &client_key,
    ];
    let out = post_json(&mtls_dir, &url, &log_request("mutual"), &with_cert);
    assert_eq!(status(&out), "200", "{out:?}\ncollector log:\n{}", m.log());
    let mut grpc_args = vec!["--http2"];
    grpc_args.extend(with_cert);
    assert_eq!(
        grpc_export(&mtls_dir, &m.grpc_endpoint(), &grpc_args),
        Ok("0".to_owned())
    );
    let records = wait_for(&m, 1);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(any_value(&records[0]["body"]), Some(json!("mutual")));
}
