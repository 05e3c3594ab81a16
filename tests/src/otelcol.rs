//! A real OpenTelemetry Collector for OTLP tests: the distribution of `tests/otelcol/`
//! (the OTLP receiver over gRPC and HTTP, optionally with TLS or mutual TLS, and the file
//! exporter), on loopback ports, with its configuration, output and log in a scratch
//! directory. What it received is read back from the file exporter's JSON lines, so a test
//! checks what a real collector decoded, not what a stand-in believes OTLP to be.
//!
//! Also [`make_test_pki`]: a throw-away CA with a server and a client certificate, made
//! with `openssl`, for the TLS cases of both the collector and tailtrap's exporter.

use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Map, Value};

use crate::bins::vm_kernel;
use crate::cmd::run;
use crate::error::{Error, Result};

/// How often the waits here look again.
const POLL: Duration = Duration::from_millis(100);

/// The collector binary: `TAILTRAP_OTELCOL`, else what `tests/otelcol/build.sh` builds (or
/// finds in its cache), so that a plain `cargo test` works where Go is installed.
///
/// `scripts/test` builds it in its `otelcol` step and sets `TAILTRAP_OTELCOL` for the host
/// step; when that build failed it sets the variable empty, and this fails at once instead of
/// building again inside a test's time.
pub fn otelcol_binary() -> Result<PathBuf> {
    match std::env::var_os("TAILTRAP_OTELCOL") {
        Some(p) if p.is_empty() => Err(Error::Traffic(
            "TAILTRAP_OTELCOL is empty: scripts/test leaves it so when its otelcol step could \
             not build the collector (see test-logs/otelcol.log in the target directory, or \
             run tests/otelcol/build.sh)"
                .into(),
        )),
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::Traffic(format!(
                    "TAILTRAP_OTELCOL={}: no such file (tests/otelcol/build.sh prints the path)",
                    p.display()
                )))
            }
        }
        None => build_otelcol(),
    }
}

/// Run `tests/otelcol/build.sh`: the cached binary's path at once, or minutes of building.
/// Under the VM runner only a cached binary will do (`--cached-only`): compiling in the
/// guest would take longer than its time limit.
fn build_otelcol() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("otelcol/build.sh");
    let args: &[&str] = if vm_kernel().is_some() {
        &["--cached-only"]
    } else {
        &[]
    };
    let command = format!("{} {}", script.display(), args.join(" "));
    let out = Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io(format!("cannot run {command}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if !out.status.success() {
        return Err(Error::Command {
            command,
            status: out.status.to_string(),
            stderr,
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Traffic(format!(
            "{command} printed {stdout:?}, not the path of a binary; its stderr: {stderr}"
        )))
    }
}

/// TLS for both OTLP protocols of the receiver (PEM files).
#[derive(Debug, Clone)]
pub struct OtelTls {
    /// The server certificate.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// What [`OtelCollector::start`] runs.
#[derive(Debug, Clone, Default)]
pub struct OtelCollectorOpts {
    /// The OTLP/gRPC port on 127.0.0.1; 0 picks a free one.
    pub grpc_port: u16,
    /// The OTLP/HTTP port on 127.0.0.1; 0 picks a free one.
    pub http_port: u16,
    /// TLS on both ports; plain text when `None`.
    pub tls: Option<OtelTls>,
    /// Also accept metrics, written to `otlp-metrics.json` (else the receiver takes logs
    /// only).
    pub metrics: bool,
}

/// A running collector; killed (SIGKILL) and reaped on drop.
///
/// One per directory: its configuration is `otelcol.yaml`, its log `otelcol.log` (kept
/// across [`OtelCollector::restart`]), what it received `otlp-logs.json` and
/// `otlp-metrics.json`, appended to across restarts.
pub struct OtelCollector {
    child: Option<Child>,
    binary: PathBuf,
    config: PathBuf,
    log: PathBuf,
    logs_file: PathBuf,
    metrics_file: PathBuf,
    grpc: SocketAddr,
    http: SocketAddr,
    tls: bool,
}

impl OtelCollector {
    /// Start the collector in `dir` (created if missing) and wait until both ports accept
    /// connections.
    pub fn start(dir: &Path, opts: OtelCollectorOpts) -> Result<OtelCollector> {
        let binary = otelcol_binary()?;
        std::fs::create_dir_all(dir)
            .map_err(Error::io(format!("cannot create {}", dir.display())))?;
        let (grpc_port, http_port) = pick_ports(opts.grpc_port, opts.http_port)?;
        let grpc = SocketAddr::from(([127, 0, 0, 1], grpc_port));
        let http = SocketAddr::from(([127, 0, 0, 1], http_port));
        let logs_file = dir.join("otlp-logs.json");
        let metrics_file = dir.join("otlp-metrics.json");
        let config = dir.join("otelcol.yaml");
        let text = config_text(&opts, grpc, http, &logs_file, &metrics_file)?;
        std::fs::write(&config, text)
            .map_err(Error::io(format!("cannot write {}", config.display())))?;
        let mut c = OtelCollector {
            child: None,
            binary,
            config,
            log: dir.join("otelcol.log"),
            logs_file,
            metrics_file,
            grpc,
            http,
            tls: opts.tls.is_some(),
        };
        c.spawn()?;
        Ok(c)
    }

    /// Start the process on the configuration written by `start` and wait for its ports.
    fn spawn(&mut self) -> Result<()> {
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(Error::io(format!("cannot open {}", self.log.display())))?;
        let stdout = stderr
            .try_clone()
            .map_err(Error::io(format!("cannot open {}", self.log.display())))?;
        let child = Command::new(&self.binary)
            .arg(format!("--config={}", self.config.display()))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(Error::io(format!("cannot start {}", self.binary.display())))?;
        self.child = Some(child);
        // Start-up is well under a second here; under the VM tier's software emulation a
        // Go binary of this size takes far longer.
        let limit = if vm_kernel().is_some() {
            Duration::from_secs(300)
        } else {
            Duration::from_secs(60)
        };
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_wait()? {
                return Err(Error::Traffic(format!(
                    "otelcol exited ({status}) before listening on {} and {}; its log:\n{}",
                    self.grpc,
                    self.http,
                    self.log()
                )));
            }
            let up = |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok();
            if up(&self.grpc) && up(&self.http) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::Traffic(format!(
                    "otelcol not listening on {} and {} after {limit:?}; its log:\n{}",
                    self.grpc,
                    self.http,
                    self.log()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(child) => child
                .try_wait()
                .map_err(Error::io("cannot wait for otelcol")),
            None => Ok(None),
        }
    }

    /// Whether the process runs (false after [`OtelCollector::stop`] or when it died).
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && matches!(self.try_wait(), Ok(None))
    }

    /// Stop it as a service manager would: SIGTERM, then wait for it to flush and exit
    /// (SIGKILL after 30 s, which is an error). The ports are free afterwards.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child
            .try_wait()
            .map_err(Error::io("cannot wait for otelcol"))?
            .is_some()
        {
            return Ok(());
        }
        // Linux pids are at most 2^22.
        let pid = child.id() as i32;
        kill(Pid::from_raw(pid), Signal::SIGTERM).map_err(|e| Error::Io {
            context: format!("cannot send SIGTERM to otelcol ({pid})"),
            source: e.into(),
        })?;
        let start = Instant::now();
        loop {
            if child
                .try_wait()
                .map_err(Error::io("cannot wait for otelcol"))?
                .is_some()
            {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Traffic(format!(
                    "otelcol did not exit within 30 s of SIGTERM (killed); its log:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Stop it if it runs, then start it again with the same configuration on the same
    /// ports; what it wrote before stays in the output files.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn()
    }

    /// The OTLP/gRPC endpoint: `http://127.0.0.1:PORT`, `https://` with TLS.
    pub fn grpc_endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.grpc)
    }

    /// The OTLP/HTTP endpoint (without `/v1/logs`): `http://127.0.0.1:PORT`, `https://`
    /// with TLS.
    pub fn http_endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.http)
    }

    fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    /// The OTLP/gRPC listening address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// The OTLP/HTTP listening address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The file exporter's output for logs (JSON lines, one export request each).
    pub fn logs_file(&self) -> &Path {
        &self.logs_file
    }

    /// The file exporter's output for metrics (with [`OtelCollectorOpts::metrics`]).
    pub fn metrics_file(&self) -> &Path {
        &self.metrics_file
    }

    /// Its log (stderr) so far, over all starts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every log record received so far, in order, each the OTLP JSON `logRecord` with two
    /// keys added: `resource` (its resource, with `attributes`) and `scope` (its
    /// instrumentation scope: `name`, `version`, `attributes`). Read with [`attr`],
    /// [`resource_attr`] and [`any_value`].
    ///
    /// The exporter flushes every 100 ms, so a record shows up shortly after it was
    /// accepted; poll (or use [`OtelCollector::wait_log_records`]).
    pub fn log_records(&self) -> Result<Vec<Value>> {
        flatten(
            &self.logs_file,
            &["resourceLogs", "scopeLogs", "logRecords"],
        )
    }

    /// Every metric received so far (with [`OtelCollectorOpts::metrics`]), each the OTLP
    /// JSON `metric` with its `resource` and `scope` added as in
    /// [`OtelCollector::log_records`].
    pub fn metrics(&self) -> Result<Vec<Value>> {
        flatten(
            &self.metrics_file,
            &["resourceMetrics", "scopeMetrics", "metrics"],
        )
    }

    /// Poll [`OtelCollector::log_records`] until `done` accepts them, and return them; an
    /// error naming `what`, with the records and the collector's log, after `timeout`.
    pub fn wait_log_records(
        &self,
        timeout: Duration,
        what: &str,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Result<Vec<Value>> {
        let start = Instant::now();
        loop {
            let records = self.log_records()?;
            if done(&records) {
                return Ok(records);
            }
            if start.elapsed() > timeout {
                return Err(Error::Traffic(format!(
                    "timed out after {timeout:?} waiting for {what}; the collector has {} \
                     log records: {}\nits log:\n{}",
                    records.len(),
                    Value::from(records),
                    self.log()
                )));
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for OtelCollector {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The requested ports, free ones for the zeros; distinct. The listeners are held until
/// both are chosen so that the kernel cannot hand out the same port twice.
fn pick_ports(grpc: u16, http: u16) -> Result<(u16, u16)> {
    let mut held = Vec::new();
    let mut pick = |want: u16, other: u16| -> Result<u16> {
        if want != 0 {
            return Ok(want);
        }
        loop {
            let l = TcpListener::bind("127.0.0.1:0").map_err(Error::io("binding a free port"))?;
            let port = l
                .local_addr()
                .map_err(Error::io("reading a free port"))?
                .port();
            held.push(l);
            if port != other {
                return Ok(port);
            }
        }
    };
    let grpc = pick(grpc, http)?;
    let http = pick(http, grpc)?;
    drop(held);
    if grpc == http {
        return Err(Error::Traffic(format!(
            "otelcol: the gRPC and HTTP ports are both {grpc}"
        )));
    }
    Ok((grpc, http))
}

/// The collector's configuration. YAML is a superset of JSON, so it is written as JSON,
/// which quotes every path correctly.
fn config_text(
    opts: &OtelCollectorOpts,
    grpc: SocketAddr,
    http: SocketAddr,
    logs_file: &Path,
    metrics_file: &Path,
) -> Result<String> {
    let protocol = |addr: SocketAddr| {
        let mut p = json!({ "endpoint": addr.to_string() });
        if let Some(tls) = &opts.tls {
            let mut t = json!({
                "cert_file": tls.cert_file.display().to_string(),
                "key_file": tls.key_file.display().to_string(),
            });
            if let Some(ca) = &tls.client_ca_file {
                t["client_ca_file"] = ca.display().to_string().into();
            }
            p["tls"] = t;
        }
        p
    };
    // Append: a restart must not truncate what arrived before it. A short flush interval:
    // tests poll the file.
    let file = |path: &Path| {
        json!({
            "path": path.display().to_string(),
            "format": "json",
            "append": true,
            "flush_interval": "100ms",
        })
    };
    let mut exporters = json!({ "file/logs": file(logs_file) });
    let mut pipelines = json!({
        "logs": { "receivers": ["otlp"], "exporters": ["file/logs"] },
    });
    if opts.metrics {
        exporters["file/metrics"] = file(metrics_file);
        pipelines["metrics"] = json!({ "receivers": ["otlp"], "exporters": ["file/metrics"] });
    }
    let config = json!({
        "receivers": {
            "otlp": { "protocols": { "grpc": protocol(grpc), "http": protocol(http) } },
        },
        "exporters": exporters,
        "service": {
            // Its own metrics would listen on port 8888, shared by every collector running.
            "telemetry": { "metrics": { "level": "none" }, "logs": { "level": "info" } },
            "pipelines": pipelines,
        },
    });
    serde_json::to_string_pretty(&config)
        .map_err(|e| Error::Traffic(format!("otelcol configuration: {e}")))
}

/// The file exporter's complete lines in `file` (none when it does not exist yet), each an
/// export request, flattened along `path` (resource list, scope list, item list) with each
/// item's `resource` and `scope` attached.
fn flatten(file: &Path, path: &[&str; 3]) -> Result<Vec<Value>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Io {
                context: format!("cannot read {}", file.display()),
                source: e,
            })
        }
    };
    // A line still being written has no newline yet.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    let [resources, scopes, items] = *path;
    let mut out = Vec::new();
    for line in complete.lines().filter(|l| !l.trim().is_empty()) {
        let request: Value = serde_json::from_str(line).map_err(|e| {
            Error::Traffic(format!(
                "{}: a line is not JSON ({e}): {line}",
                file.display()
            ))
        })?;
        for r in request[resources].as_array().into_iter().flatten() {
            let resource = r.get("resource").cloned().unwrap_or_else(|| json!({}));
            for s in r[scopes].as_array().into_iter().flatten() {
                let scope = s.get("scope").cloned().unwrap_or_else(|| json!({}));
                for item in s[items].as_array().into_iter().flatten() {
                    let mut item = item.as_object().cloned().unwrap_or_default();
                    item.insert("resource".into(), resource.clone());
                    item.insert("scope".into(), scope.clone());
                    out.push(Value::Object(item));
                }
            }
        }
    }
    Ok(out)
}

/// The attribute `key` of a record (or anything with OTLP JSON `attributes`), as a plain
/// JSON value (see [`any_value`]).
pub fn attr(record: &Value, key: &str) -> Option<Value> {
    find_attr(&record["attributes"], key)
}

/// The resource attribute `key` of a record of [`OtelCollector::log_records`].
pub fn resource_attr(record: &Value, key: &str) -> Option<Value> {
    find_attr(&record["resource"]["attributes"], key)
}

fn find_attr(attributes: &Value, key: &str) -> Option<Value> {
    attributes
        .as_array()?
        .iter()
        .find(|kv| kv["key"] == key)
        .and_then(|kv| any_value(&kv["value"]))
}

/// An OTLP JSON `AnyValue` as a plain JSON value: a string, a number (`intValue`, which
/// OTLP JSON writes as a string, becomes an integer), a bool, an array (`arrayValue`), an
/// object (`kvlistValue`); `bytesValue` stays base64 text. `None` for an empty value or
/// anything else.
pub fn any_value(v: &Value) -> Option<Value> {
    let o = v.as_object()?;
    if let Some(s) = o.get("stringValue") {
        return Some(s.clone());
    }
    if let Some(i) = o.get("intValue") {
        return match i {
            Value::String(s) => s.parse::<i64>().ok().map(Value::from),
            other => Some(other.clone()),
        };
    }
    if let Some(d) = o.get("doubleValue") {
        return Some(d.clone());
    }
    if let Some(b) = o.get("boolValue") {
        return Some(b.clone());
    }
    if let Some(a) = o.get("arrayValue") {
        let values = a["values"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        return Some(Value::Array(
            values
                .iter()
                .map(|v| any_value(v).unwrap_or(Value::Null))
                .collect(),
        ));
    }
    if let Some(kv) = o.get("kvlistValue") {
        let values = kv["values"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut m = Map::new();
        for kv in values {
            if let Some(k) = kv["key"].as_str() {
                m.insert(k.to_owned(), any_value(&kv["value"]).unwrap_or(Value::Null));
            }
        }
        return Some(Value::Object(m));
    }
    o.get("bytesValue").cloned()
}

/// PEM files of [`make_test_pki`].
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA certificate, to trust (`--cacert`, `client_ca_file`).
    pub ca_cert: PathBuf,
    /// The CA's key.
    pub ca_key: PathBuf,
    /// A server certificate for `127.0.0.1`, `::1` and `localhost` (subjectAltName),
    /// signed by the CA.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// A client certificate (CN `tailtrap-test-client`) signed by the CA, for mutual TLS.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

/// A fresh CA with a server and a client certificate in `dir` (`ca.crt`, `server.crt`,
/// `client.crt` and their `.key`s), made with `openssl` (P-256 keys, valid 30 days).
///
/// Certificates as strict verifiers want them (Go's crypto/tls, rustls/webpki): the CA
/// marked as one, the leaves with subjectAltName and extended key usage, so that a failure
/// in a TLS test is about what the test checks, not about a sloppy certificate.
pub fn make_test_pki(dir: &Path) -> Result<TestPki> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
    let f = |name: &str| dir.join(name);
    let s = |p: &Path| p.display().to_string();
    let pki = TestPki {
        ca_cert: f("ca.crt"),
        ca_key: f("ca.key"),
        server_cert: f("server.crt"),
        server_key: f("server.key"),
        client_cert: f("client.crt"),
        client_key: f("client.key"),
    };
    // Our own openssl configuration: the system's default one adds extensions of its own.
    let cnf = f("openssl.cnf");
    std::fs::write(
        &cnf,
        "[req]\n\
         distinguished_name = dn\n\
         prompt = no\n\
         [dn]\n\
         CN = unused\n\
         [ca]\n\
         basicConstraints = critical, CA:TRUE\n\
         keyUsage = critical, keyCertSign, cRLSign\n\
         subjectKeyIdentifier = hash\n\
         [server]\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature\n\
         extendedKeyUsage = serverAuth\n\
         subjectAltName = IP:127.0.0.1, IP:::1, DNS:localhost\n\
         subjectKeyIdentifier = hash\n\
         authorityKeyIdentifier = keyid\n\
         [client]\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature\n\
         extendedKeyUsage = clientAuth\n\
         subjectAltName = DNS:tailtrap-test-client\n\
         subjectKeyIdentifier = hash\n\
         authorityKeyIdentifier = keyid\n",
    )
    .map_err(Error::io(format!("cannot write {}", cnf.display())))?;
    let key_args = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-noenc",
    ];
    run(
        "openssl",
        &[
            &[
                "req",
                "-x509",
                "-config",
                &s(&cnf),
                "-extensions",
                "ca",
                "-subj",
                "/CN=tailtrap test CA",
                "-days",
                "30",
                "-keyout",
                &s(&pki.ca_key),
                "-out",
                &s(&pki.ca_cert),
            ][..],
            &key_args[..],
        ]
        .concat(),
    )?;
    for (section, cn, cert, key, serial) in [
        (
            "server",
            "localhost",
            &pki.server_cert,
            &pki.server_key,
            "2",
        ),
        (
            "client",
            "tailtrap-test-client",
            &pki.client_cert,
            &pki.client_key,
            "3",
        ),
    ] {
        let csr = f(&format!("{section}.csr"));
        run(
            "openssl",
            &[
                &[
                    "req",
                    "-new",
                    "-config",
                    &s(&cnf),
                    "-subj",
                    &format!("/CN={cn}"),
                    "-keyout",
                    &s(key),
                    "-out",
                    &s(&csr),
                ][..],
                &key_args[..],
            ]
            .concat(),
        )?;
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &s(&csr),
                "-CA",
                &s(&pki.ca_cert),
                "-CAkey",
                &s(&pki.ca_key),
                "-set_serial",
                serial,
                "-days",
                "30",
                "-extfile",
                &s(&cnf),
                "-extensions",
                section,
                "-out",
                &s(cert),
            ],
        )?;
    }
    Ok(pki)
}
