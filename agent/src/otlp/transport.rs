//! The wire: events made into OTLP log records and sent with the OpenTelemetry project's
//! exporter (`opentelemetry-otlp`), over gRPC (tonic) or HTTP/protobuf (hyper), with TLS by
//! rustls. This file alone knows the OpenTelemetry crates' types.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use opentelemetry_sdk::Resource;

use super::config::{read_certs, read_key, OtlpConfig, Protocol};
use super::event::{Event, EventKind, Value};

/// What names this host to the fleet, read once at start.
pub(super) struct HostFacts {
    pub(super) host_name: String,
    /// `/etc/machine-id` (stable across reboots and renames), else the host name.
    pub(super) host_id: String,
    /// The kernel release.
    pub(super) kernel: String,
}

impl HostFacts {
    pub(super) fn read() -> HostFacts {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        };
        let host_name = read("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into());
        let host_id = read("/etc/machine-id")
            .or_else(|| read("/var/lib/dbus/machine-id"))
            .unwrap_or_else(|| host_name.clone());
        HostFacts {
            host_id,
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
            host_name,
        }
    }
}

/// An exporter with the resource and scope every record carries.
pub(super) struct Transport {
    exporter: opentelemetry_otlp::LogExporter,
    /// Makes the SDK's log records (it has no processors: records go nowhere by themselves).
    provider: SdkLoggerProvider,
    scope: InstrumentationScope,
    timeout: Duration,
}

impl Transport {
    pub(super) fn new(config: &OtlpConfig, host: &HostFacts) -> anyhow::Result<Transport> {
        let mut exporter = match config.protocol {
            Protocol::Grpc => grpc(config)?,
            Protocol::HttpProtobuf => http(config)?,
        };
        let version = env!("CARGO_PKG_VERSION");
        let mut attributes = vec![
            KeyValue::new("service.name", "tailtrap"),
            KeyValue::new("service.version", version),
            KeyValue::new("host.name", host.host_name.clone()),
            KeyValue::new("host.id", host.host_id.clone()),
            KeyValue::new("os.type", "linux"),
            KeyValue::new("os.version", host.kernel.clone()),
        ];
        attributes.extend(
            config
                .resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        );
        let resource = Resource::builder_empty()
            .with_attributes(attributes)
            .build();
        exporter.set_resource(&resource);
        Ok(Transport {
            exporter,
            provider: SdkLoggerProvider::builder().build(),
            scope: InstrumentationScope::builder("tailtrap")
                .with_version(version)
                .build(),
            timeout: config.timeout,
        })
    }

    /// Send `events` in one request; the error is one line for the log and status.
    pub(super) async fn export(
        &mut self,
        events: &[(u64, SystemTime, Event)],
    ) -> Result<(), String> {
        let logger = self.provider.logger("tailtrap");
        let records: Vec<SdkLogRecord> = events
            .iter()
            .map(|(_, queued_at, e)| {
                let mut r = logger.create_log_record();
                fill(&mut r, e, *queued_at);
                r
            })
            .collect();
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            records.iter().map(|r| (r, &self.scope)).collect();
        // The exporter has its own timeout; this one guards against a transport that
        // ignores it, so the task never hangs.
        match tokio::time::timeout(
            self.timeout + Duration::from_secs(1),
            self.exporter.export(LogBatch::new(&refs)),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(one_line(&e.to_string())),
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(self.timeout)
            )),
        }
    }
}

/// An event as an OTLP log record.
fn fill(r: &mut SdkLogRecord, e: &Event, queued_at: SystemTime) {
    r.set_event_name(e.kind.event_name());
    r.set_timestamp(UNIX_EPOCH + Duration::from_nanos(e.time_ns));
    r.set_observed_timestamp(queued_at);
    let (number, text) = match e.kind {
        EventKind::Opened | EventKind::Changed => (Severity::Warn, "WARN"),
        EventKind::Closed | EventKind::PwruEnded => (Severity::Info, "INFO"),
    };
    r.set_severity_number(number);
    r.set_severity_text(text);
    r.set_body(AnyValue::from(e.body.clone()));
    for (key, value) in &e.attributes {
        let v = match value {
            Value::Str(s) => AnyValue::from(s.clone()),
            Value::Int(i) => AnyValue::Int(*i),
            Value::Float(f) => AnyValue::Double(*f),
            Value::List(l) => AnyValue::ListAny(Box::new(
                l.iter().map(|s| AnyValue::from(s.clone())).collect(),
            )),
        };
        r.add_attribute(*key, v);
    }
}

fn grpc(config: &OtlpConfig) -> anyhow::Result<opentelemetry_otlp::LogExporter> {
    let mut headers = http::HeaderMap::new();
    for (k, v) in &config.headers {
        headers.insert(
            http::HeaderName::from_bytes(k.as_bytes()).context("otlp.headers")?,
            http::HeaderValue::from_str(v).context("otlp.headers")?,
        );
    }
    let mut builder = opentelemetry_otlp::LogExporter::builder()
        .with_tonic()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(config.timeout)
        .with_metadata(MetadataMap::from_headers(headers));
    if config.is_tls() {
        let mut tls = ClientTlsConfig::new();
        tls = if config.tls_ca_file.as_os_str().is_empty() {
            tls.with_native_roots()
        } else {
            // Only the configured CA: a private collector's certificate is not vouched for
            // by a public root.
            tls.ca_certificate(Certificate::from_pem(
                read_certs(&config.tls_ca_file).map_err(anyhow::Error::msg)?,
            ))
        };
        if !config.tls_cert_file.as_os_str().is_empty() {
            tls = tls.identity(Identity::from_pem(
                read_certs(&config.tls_cert_file).map_err(anyhow::Error::msg)?,
                read_key(&config.tls_key_file).map_err(anyhow::Error::msg)?,
            ));
        }
        builder = builder.with_tls_config(tls);
    }
    builder
        .build()
        .map_err(|e| anyhow::anyhow!("key `otlp.endpoint`: {e}"))
}

fn http(config: &OtlpConfig) -> anyhow::Result<opentelemetry_otlp::LogExporter> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(rustls_client(config)?)
        .https_or_http()
        .enable_http1()
        .build();
    let client = opentelemetry_http::hyper::HyperClient::new(connector, config.timeout, None);
    opentelemetry_otlp::LogExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(client)
        .with_endpoint(config.export_url())
        .with_timeout(config.timeout)
        .with_headers(config.headers.clone().into_iter().collect())
        .build()
        .map_err(|e| anyhow::anyhow!("key `otlp.endpoint`: {e}"))
}

/// rustls for the HTTP transport: the configured CA (else the system's roots) and the
/// client certificate when mutual TLS is configured.
fn rustls_client(config: &OtlpConfig) -> anyhow::Result<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    if config.tls_ca_file.as_os_str().is_empty() {
        // Only needed for https://; a host without a trust store still exports over http.
        if config.is_tls() {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            anyhow::ensure!(
                added > 0,
                "key `otlp.tls_ca_file`: the endpoint is https:// and this host has no \
                 trusted CA certificates; name the collector's CA in otlp.tls_ca_file"
            );
        }
    } else {
        let pem = read_certs(&config.tls_ca_file).map_err(anyhow::Error::msg)?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| anyhow::anyhow!("key `otlp.tls_ca_file`: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| anyhow::anyhow!("key `otlp.tls_ca_file`: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    if config.tls_cert_file.as_os_str().is_empty() {
        return Ok(builder.with_no_client_auth());
    }
    let chain_pem = read_certs(&config.tls_cert_file).map_err(anyhow::Error::msg)?;
    let chain = CertificateDer::pem_slice_iter(&chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("key `otlp.tls_cert_file`: {e}"))?;
    let key_pem = read_key(&config.tls_key_file).map_err(anyhow::Error::msg)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| anyhow::anyhow!("key `otlp.tls_key_file`: {e}"))?;
    builder
        .with_client_auth_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("key `otlp.tls_cert_file`: {e}"))
}

/// Transport errors nest their causes over several lines; status and the log want one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
