//! A real Prometheus server for metrics tests (Debian's `prometheus` package), on a free
//! loopback port with its configuration and database in a scratch directory, plus a
//! minimal HTTP/1.1 GET for scraping and querying.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{Error, Result};

/// An answer of [`http_get`].
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The `Content-Type` header, empty when absent.
    pub content_type: String,
    /// The body.
    pub body: String,
}

/// `GET path` from `addr` with an optional `Accept` header, reading until the server
/// closes (`Connection: close`); every step bounded by `timeout`.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
    timeout: Duration,
) -> Result<HttpAnswer> {
    let context = format!("GET http://{addr}{path}");
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(Error::io(context.clone()))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(Error::io(context.clone()))?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .map_err(Error::io(context.clone()))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(Error::io(context.clone()))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Traffic(format!("{context}: no header end in {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::Traffic(format!("{context}: bad status line in {head:?}")))?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(HttpAnswer {
        status,
        content_type,
        body,
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Percent-encoding for a URL query value.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A free loopback port (bound and released: a small race, fine for tests).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(Error::io("binding a free port"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(Error::io("reading a free port"))
}

/// The `prometheus` binary: `PROMETHEUS_BIN`, else the first on PATH.
///
/// # Panics
/// When there is none (scripts/test installs Debian's `prometheus` package).
pub fn prometheus_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PROMETHEUS_BIN") {
        return PathBuf::from(p);
    }
    find_on_path("prometheus").unwrap_or_else(|| {
        panic!("no `prometheus` on PATH: install Debian's `prometheus` package (scripts/test does), or set PROMETHEUS_BIN")
    })
}

/// The first executable `name` on PATH.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A Prometheus server scraping one target every second; killed on drop.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Prometheus {
    /// Start Prometheus in `dir` (configuration, database, log) scraping `target` as job
    /// `tailtrap` every second and loading `rule_files`; waits until it is ready.
    pub fn start(dir: &Path, target: SocketAddr, rule_files: &[PathBuf]) -> Result<Prometheus> {
        let config = dir.join("prometheus.yml");
        let rules: String = rule_files
            .iter()
            .map(|r| format!("  - {:?}\n", r.display().to_string()))
            .collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n{rules}\
                 scrape_configs:\n  - job_name: tailtrap\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .map_err(Error::io(format!("cannot write {}", config.display())))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let log = dir.join("prometheus.log");
        let stderr = std::fs::File::create(&log)
            .map_err(Error::io(format!("cannot create {}", log.display())))?;
        let child = Command::new(prometheus_bin())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(Error::io("cannot start prometheus"))?;
        let p = Prometheus { child, addr, log };
        let start = Instant::now();
        loop {
            let ready = http_get(addr, "/-/ready", None, Duration::from_secs(2))
                .is_ok_and(|a| a.status == 200);
            if ready {
                return Ok(p);
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(Error::Traffic(format!(
                    "prometheus not ready after 60 s; its log:\n{}",
                    p.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Where its HTTP API listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /api/v1/<endpoint>?<params>`; the `data` of a successful answer, or the
    /// error Prometheus gave (a PromQL parse error names the expression's problem).
    pub fn api(&self, endpoint: &str, params: &[(&str, &str)]) -> Result<Value> {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", url_encode(v)))
            .collect();
        let path = format!("/api/v1/{endpoint}?{}", query.join("&"));
        let a = http_get(self.addr, &path, None, Duration::from_secs(10))?;
        let v: Value = serde_json::from_str(&a.body).map_err(|e| {
            Error::Traffic(format!("prometheus {path}: not JSON ({e}): {}", a.body))
        })?;
        if v["status"] != "success" {
            return Err(Error::Traffic(format!("prometheus {path}: {v}")));
        }
        Ok(v["data"].clone())
    }

    /// An instant query; the result vector (or scalar) as JSON.
    pub fn query(&self, expr: &str) -> Result<Value> {
        Ok(self.api("query", &[("query", expr)])?["result"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
