//! Property tests of the daemon's two text inputs besides the kernel: the config file and the
//! API's request paths and query strings. Any input gives a value or a clear error, never a
//! panic or a hang. `tests/fuzz/run.sh` runs them with `TAILTRAP_FUZZ_CASES` set high.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::fixtures::fuzz_config;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use storage::{NewIncident, Store, StoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::server::{bind, serve, AppState};

/// Values a hostile or careless config might hold.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("18446744073709551616".to_string()),
        Just("9223372036854775807".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("\"99999999999999999y\"".to_string()),
        Just("\"0s\"".to_string()),
        Just("\"\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("true".to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        "[a-z0-9./ :-]{0,30}".prop_map(|s| format!("{s:?}")),
        "[0-9]{1,6}(ns|us|ms|s|m|h|d)".prop_map(|s| format!("{s:?}")),
    ]
}

/// The defaults file with some values replaced, some lines dropped or garbled.
fn config_text() -> impl Strategy<Value = String> {
    let defaults = crate::config::defaults_toml();
    let n = defaults.lines().count();
    (
        prop::collection::vec((0..n, toml_value()), 0..6),
        prop::collection::vec(0..n, 0..3),
        prop::option::of((0..n, ".{0,20}")),
    )
        .prop_map(move |(values, dropped, garbled)| {
            let mut lines: Vec<String> = defaults.lines().map(str::to_owned).collect();
            for (i, v) in values {
                if let Some((key, _)) = lines[i].split_once('=') {
                    lines[i] = format!("{key}= {v}");
                }
            }
            if let Some((i, g)) = garbled {
                lines[i] = g;
            }
            for i in dropped {
                lines[i] = String::new();
            }
            lines.join("\n")
        })
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn fuzz_config_arbitrary_text(text in ".{0,300}") {
        let start = Instant::now();
        let _ = crate::config::parse(&text, "fuzz.toml");
        prop_assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn fuzz_config_hostile_values(text in config_text()) {
        let start = Instant::now();
        match crate::config::parse(&text, "fuzz.toml") {
            Ok(_) => {}
            // Refused: every problem is a line naming the file (what `config check` prints).
            Err(e) => prop_assert!(e.lines().iter().all(|l| l.contains("fuzz.toml"))),
        }
        prop_assert!(start.elapsed() < Duration::from_secs(10));
    }
}

/// A request target: a path from the API's words and hostile ones, and a query string.
fn target() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        prop::sample::select(vec![
            "v1",
            "incidents",
            "samples",
            "pwru",
            "export",
            "status",
            "1",
            "0",
            "-1",
            "..",
            "18446744073709551616",
            "%00",
            "%ff",
            "%2F",
            "",
            "v2",
        ])
        .prop_map(str::to_owned),
        ".{0,12}".prop_map(|s| encode(&s)),
    ];
    let key = prop::sample::select(vec![
        "limit",
        "before_id",
        "since_ns",
        "service",
        "state",
        "probe",
        "flow",
        "min_latency_ns",
        "after_time_ns",
        "after_seq",
        "servce",
        "",
    ]);
    let value = prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "18446744073709551616",
            "open",
            "closed",
            "tcp-socket-read",
            "dport=443 saddr=10.0.0.5",
            "dport=99999",
            "saddr=::1",
            "",
            "%",
        ])
        .prop_map(str::to_owned),
        ".{0,16}".prop_map(|s| encode(&s)),
        any::<u64>().prop_map(|v| v.to_string()),
    ];
    (
        prop::collection::vec(word, 0..5),
        prop::collection::vec((key, value), 0..5),
    )
        .prop_map(|(words, params)| {
            let mut t = format!("/{}", words.join("/"));
            if !params.is_empty() {
                let q: Vec<String> = params
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.replace(' ', "%20")))
                    .collect();
                t = format!("{t}?{}", q.join("&"));
            }
            t
        })
}

/// Percent-encode every byte but the unreserved ones, so the request line stays valid HTTP.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// One request on a fresh connection; the status code and body.
async fn get(socket: &Path, target: &str) -> (u16, Vec<u8>) {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let req = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.unwrap();
    let text = String::from_utf8_lossy(&resp);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line for {target}: {text}"));
    let body = match resp.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => resp[i + 4..].to_vec(),
        None => Vec::new(),
    };
    (code, body)
}

#[test]
fn fuzz_api_paths_and_queries() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path().join("db"), StoreConfig::default()).unwrap());
    let inc = store
        .open_incident(&NewIncident {
            service: "web".into(),
            probes: vec![model::Probe::TcpSocketRead],
            opened_ns: 1_700_000_000_000_000_000,
            evidence_json: "{}".into(),
            stages_json: "null".into(),
        })
        .unwrap();
    let samples: Vec<_> = (0..50)
        .map(|i| model::fixtures::sample(inc.id, i, 1_700_000_000_000_000_000 + i))
        .collect();
    store.put_samples(&samples).unwrap();
    let path = dir.path().join("api.sock");
    let state = Arc::new(AppState {
        store,
        status: Box::new(|| panic!("the status needs a daemon")),
    });
    let socket = rt.block_on(bind(&path)).unwrap();
    let server = rt.spawn(serve(socket, state));
    let mut runner = TestRunner::new(fuzz_config(256));
    let result = runner.run(&target(), |t| {
        // /v1/status needs the daemon; every other target is fair game.
        if t.trim_end_matches('/') == "/v1/status" || t.starts_with("/v1/status?") {
            return Ok(());
        }
        let (code, body) = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), get(&path, &t)).await })
            .map_err(|_| TestCaseError::fail(format!("{t}: no answer in 10 s")))?;
        prop_assert!(
            [200, 400, 404].contains(&code),
            "{t}: {code} {}",
            String::from_utf8_lossy(&body)
        );
        // Our answers are JSON; hyper's own refusals of a malformed request may be empty.
        if !body.is_empty() {
            let v: Result<serde_json::Value, _> = serde_json::from_slice(&body);
            prop_assert!(
                v.is_ok(),
                "{t}: {code} not JSON: {}",
                String::from_utf8_lossy(&body)
            );
            if code != 200 {
                prop_assert!(v.unwrap()["error"].is_string(), "{t}");
            }
        }
        Ok(())
    });
    server.abort();
    result.unwrap();
}
