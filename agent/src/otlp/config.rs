//! The `[otlp]` table: where incidents go as OpenTelemetry log records, and how.
//!
//! Everything that can be known before the first export is checked here, so `tailtrap
//! config check` and the start name a bad endpoint, header or TLS file by its key; what
//! only the collector can tell (refused connection, untrusted certificate) is a counted,
//! logged failure at run time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use model::config::{KeyProblem, Validate};
use serde::{Deserialize, Serialize};

/// The wire protocol to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// OTLP over gRPC (collector port 4317).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (collector port 4318, path `/v1/logs`).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl Protocol {
    /// As the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// The `[otlp]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Send incident events to `endpoint`.
    pub enabled: bool,
    /// The collector: `http://` or `https://`, host and port. For `http/protobuf` a URL
    /// without a path gets `/v1/logs`; one with a path is used as it is.
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    pub protocol: Protocol,
    /// Headers (gRPC metadata) sent with every export, e.g. an authorization token.
    pub headers: BTreeMap<String, String>,
    /// Extra resource attributes naming this host in the fleet (`deployment.environment`,
    /// `k8s.cluster.name`, ...), beside the ones tailtrap sets.
    pub resource_attributes: BTreeMap<String, String>,
    /// How long one export may take before it counts as failed.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Events kept while the collector cannot take them; beyond, the oldest are dropped
    /// (and counted).
    pub queue_size: usize,
    /// PEM CA certificates that sign the collector's certificate (`https://` endpoints);
    /// empty: the system's trust store.
    pub tls_ca_file: PathBuf,
    /// PEM client certificate (chain) for mutual TLS; with `tls_key_file`.
    pub tls_cert_file: PathBuf,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: PathBuf,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: false,
            endpoint: "http://127.0.0.1:4317".into(),
            protocol: Protocol::Grpc,
            headers: BTreeMap::new(),
            resource_attributes: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            queue_size: 4096,
            tls_ca_file: PathBuf::new(),
            tls_cert_file: PathBuf::new(),
            tls_key_file: PathBuf::new(),
        }
    }
}

/// The largest `queue_size`: events are a few KiB each, so this bounds the queue near
/// 100 MiB even for a collector gone for days.
pub const MAX_QUEUE: usize = 65_536;

/// Attributes tailtrap sets itself; a configured one of the same name is refused rather
/// than silently winning or losing.
const OWN_RESOURCE_ATTRIBUTES: [&str; 6] = [
    "service.name",
    "service.version",
    "host.name",
    "host.id",
    "os.type",
    "os.version",
];

impl OtlpConfig {
    /// The endpoint as a URI (checked by [`Validate`]).
    pub(crate) fn uri(&self) -> Result<http::Uri, String> {
        let uri: http::Uri = self
            .endpoint
            .parse()
            .map_err(|e| format!("{:?} is not a URL: {e}", self.endpoint))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            Some(other) => {
                return Err(format!(
                    "{:?}: the scheme must be http or https, not {other}",
                    self.endpoint
                ))
            }
            None => {
                return Err(format!(
                    "{:?} has no scheme: write http://HOST:PORT or https://HOST:PORT",
                    self.endpoint
                ))
            }
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(format!("{:?} names no host", self.endpoint));
        }
        Ok(uri)
    }

    /// Whether the endpoint is `https://`.
    pub(crate) fn is_tls(&self) -> bool {
        self.uri().is_ok_and(|u| u.scheme_str() == Some("https"))
    }

    /// Where records are sent: for HTTP a base URL gets the logs path, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` does.
    pub(crate) fn export_url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        match (self.protocol, self.uri()) {
            (Protocol::HttpProtobuf, Ok(u)) if matches!(u.path(), "" | "/") => {
                format!("{base}/v1/logs")
            }
            _ => self.endpoint.clone(),
        }
    }
}

impl Validate for OtlpConfig {
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = Vec::new();
        if let Err(e) = self.uri() {
            problems.push(KeyProblem::new("endpoint", e));
        }
        if self.timeout < Duration::from_millis(100) || self.timeout > Duration::from_secs(300) {
            problems.push(KeyProblem::new(
                "timeout",
                format!(
                    "{} is outside 100ms..=5m",
                    humantime::format_duration(self.timeout)
                ),
            ));
        }
        if self.queue_size == 0 || self.queue_size > MAX_QUEUE {
            problems.push(KeyProblem::new(
                "queue_size",
                format!("{} is outside 1..={MAX_QUEUE}", self.queue_size),
            ));
        }
        for (name, value) in &self.headers {
            let key = format!("headers.{}", model::config::key_segment(name));
            // gRPC metadata keys are lowercase; HTTP accepts them too.
            if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()) {
                problems.push(KeyProblem::new(
                    key,
                    "a header name must be lowercase (gRPC metadata requires it)",
                ));
            } else if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                problems.push(KeyProblem::new(key, "not a valid header name"));
            } else if http::HeaderValue::from_str(value).is_err() {
                problems.push(KeyProblem::new(
                    key,
                    "the value has characters a header cannot carry",
                ));
            }
        }
        for name in self.resource_attributes.keys() {
            if OWN_RESOURCE_ATTRIBUTES.contains(&name.as_str()) || name.is_empty() {
                problems.push(KeyProblem::new(
                    format!("resource_attributes.{}", model::config::key_segment(name)),
                    format!(
                        "tailtrap sets this one itself (it sets {})",
                        OWN_RESOURCE_ATTRIBUTES.join(", ")
                    ),
                ));
            }
        }
        problems.extend(self.tls_problems());
        problems
    }
}

impl OtlpConfig {
    fn tls_problems(&self) -> Vec<KeyProblem> {
        let set = |p: &Path| !p.as_os_str().is_empty();
        let (ca, cert, key) = (
            set(&self.tls_ca_file),
            set(&self.tls_cert_file),
            set(&self.tls_key_file),
        );
        let mut problems = Vec::new();
        if (ca || cert || key) && self.uri().is_ok() && !self.is_tls() {
            problems.push(KeyProblem::new(
                "endpoint",
                "TLS files are given but the endpoint is http://: write https:// to use them",
            ));
        }
        if cert != key {
            let missing = if cert {
                "tls_key_file"
            } else {
                "tls_cert_file"
            };
            problems.push(KeyProblem::new(
                missing,
                "mutual TLS needs both tls_cert_file and tls_key_file",
            ));
        }
        // Read now, so a wrong path or a file that is not PEM stops `config check` and the
        // start, not the first export an hour later.
        if ca {
            if let Err(e) = read_certs(&self.tls_ca_file) {
                problems.push(KeyProblem::new("tls_ca_file", e));
            }
        }
        if cert {
            if let Err(e) = read_certs(&self.tls_cert_file) {
                problems.push(KeyProblem::new("tls_cert_file", e));
            }
        }
        if key {
            if let Err(e) = read_key(&self.tls_key_file) {
                problems.push(KeyProblem::new("tls_key_file", e));
            }
        }
        problems
    }
}

/// The PEM text of a certificate file that holds at least one certificate.
pub(crate) fn read_certs(path: &Path) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| format!("{}: not a PEM certificate: {e}", path.display()))?;
        n += 1;
    }
    if n == 0 {
        return Err(format!(
            "{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(pem)
}

/// The PEM text of a private key file.
pub(crate) fn read_key(path: &Path) -> Result<Vec<u8>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("{}: no PEM private key: {e}", path.display()))?;
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(f: impl FnOnce(&mut OtlpConfig)) -> Vec<String> {
        let mut c = OtlpConfig::default();
        f(&mut c);
        c.validate().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(problems(|_| {}), Vec::<String>::new());
    }

    #[test]
    fn a_bad_endpoint_is_named() {
        let p = problems(|c| c.endpoint = "collector:4317".into());
        assert!(p[0].starts_with("key `endpoint`"), "{p:?}");
        let p = problems(|c| c.endpoint = "ftp://collector:4317".into());
        assert!(p[0].contains("scheme must be http or https"), "{p:?}");
        let p = problems(|c| c.endpoint = "not a url".into());
        assert!(p[0].contains("not a URL"), "{p:?}");
    }

    #[test]
    fn http_gets_the_logs_path_unless_it_has_one() {
        let mut c = OtlpConfig {
            protocol: Protocol::HttpProtobuf,
            endpoint: "http://c:4318".into(),
            ..OtlpConfig::default()
        };
        assert_eq!(c.export_url(), "http://c:4318/v1/logs");
        c.endpoint = "http://c:4318/".into();
        assert_eq!(c.export_url(), "http://c:4318/v1/logs");
        c.endpoint = "http://c:4318/otlp/v1/logs".into();
        assert_eq!(c.export_url(), "http://c:4318/otlp/v1/logs");
        c.protocol = Protocol::Grpc;
        c.endpoint = "http://c:4317".into();
        assert_eq!(c.export_url(), "http://c:4317");
    }

    #[test]
    fn tls_files_are_read_and_checked_at_validation() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap_or_else(|e| panic!("{e}"));
        let p = problems(|c| {
            c.endpoint = "https://c:4317".into();
            c.tls_ca_file = not_pem.clone();
        });
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("tls_ca_file") && p[0].contains("no PEM certificate"));
        let p = problems(|c| {
            c.endpoint = "https://c:4317".into();
            c.tls_ca_file = dir.path().join("missing.pem");
        });
        assert!(p[0].contains("No such file"), "{p:?}");
        // A certificate without its key, and TLS files with a plain endpoint.
        let p = problems(|c| c.tls_cert_file = not_pem.clone());
        assert!(p.iter().any(|p| p.contains("write https://")), "{p:?}");
        assert!(
            p.iter().any(|p| p.starts_with("key `tls_key_file`")),
            "{p:?}"
        );
    }

    #[test]
    fn headers_and_attributes_are_checked() {
        let p = problems(|c| {
            c.headers.insert("Authorization".into(), "x".into());
        });
        assert!(p[0].contains("lowercase"), "{p:?}");
        let p = problems(|c| {
            c.headers.insert("x-token".into(), "a\nb".into());
        });
        assert!(p[0].contains("headers.x-token"), "{p:?}");
        let p = problems(|c| {
            c.resource_attributes.insert("host.name".into(), "x".into());
        });
        assert!(p[0].contains("sets this one itself"), "{p:?}");
    }

    #[test]
    fn queue_and_timeout_bounds() {
        assert_eq!(problems(|c| c.queue_size = 0).len(), 1);
        assert_eq!(problems(|c| c.queue_size = MAX_QUEUE + 1).len(), 1);
        assert_eq!(problems(|c| c.timeout = Duration::ZERO).len(), 1);
    }
}
