//! The daemon config file's probe sections: `[probes]` (with `[probes.enable]` and
//! `[probes.filters]`) and `[[services]]`. Unknown keys are errors naming file, line and
//! key. The other top-level tables belong to other parts of tailtrap and are passed over.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use capture::pwru::PwruConfig;
use detector::DetectorConfig;
use model::Probe;
use serde::{Deserialize, Serialize};
use storage::StoreConfig;

/// A config error with its place: `FILE, line N: key `a.b`: reason`.
#[derive(Debug)]
pub struct ConfigError {
    origin: String,
    line: Option<usize>,
    key: Option<String>,
    reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.origin)?;
        if let Some(line) = self.line {
            write!(f, ", line {line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    probes: ProbesTable,
    #[serde(default)]
    services: Vec<ServiceTable>,
    // Checked by `DetectorConfig::from_toml_str`, which reads the same text.
    #[serde(default, rename = "detector")]
    _detector: serde::de::IgnoredAny,
    #[serde(default)]
    storage: StoreConfig,
    #[serde(default)]
    capture: CaptureConfig,
    #[serde(default)]
    pwru: PwruConfig,
    #[serde(default)]
    daemon: DaemonConfig,
    #[serde(default)]
    api: ApiConfig,
    #[serde(default)]
    metrics: crate::metrics::MetricsConfig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbesTable {
    #[serde(default)]
    enable: BTreeMap<Probe, bool>,
    #[serde(default = "default_true")]
    hol_filter: bool,
    #[serde(default = "default_auto_limit")]
    auto_service_limit: u32,
    #[serde(default)]
    filters: FiltersTable,
}

impl Default for ProbesTable {
    fn default() -> Self {
        Self {
            enable: BTreeMap::new(),
            hol_filter: true,
            auto_service_limit: bpf::DEFAULT_AUTO_SERVICE_LIMIT,
            filters: FiltersTable::default(),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FiltersTable {
    #[serde(default)]
    pids: Vec<u32>,
    #[serde(default)]
    cgroups: Vec<PathBuf>,
    #[serde(default)]
    ifindexes: Vec<u32>,
    #[serde(default)]
    netns: Vec<u32>,
    #[serde(default)]
    min_queue_len: u32,
    #[serde(default)]
    sample_one_in: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceTable {
    name: String,
    #[serde(default)]
    cgroup: Option<PathBuf>,
    #[serde(default)]
    ports: Vec<u16>,
}

fn default_true() -> bool {
    true
}

fn default_auto_limit() -> u32 {
    bpf::DEFAULT_AUTO_SERVICE_LIMIT
}

/// The whole daemon configuration, every table checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where it came from: the file, or `embedded defaults`.
    pub origin: String,
    /// `[probes]` and `[[services]]`.
    pub probes: bpf::ProbeConfig,
    /// `[detector]`.
    pub detector: DetectorConfig,
    /// `[storage]`.
    pub storage: StoreConfig,
    /// `[capture]`.
    pub capture: CaptureConfig,
    /// `[pwru]`.
    pub pwru: PwruConfig,
    /// `[daemon]`.
    pub daemon: DaemonConfig,
    /// `[api]`.
    pub api: ApiConfig,
    /// `[metrics]`.
    pub metrics: crate::metrics::MetricsConfig,
}

/// Where the daemon looks for its configuration when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/tailtrap/tailtrap.toml";

/// The defaults, as a commented configuration file (`tailtrap config defaults`). A test
/// checks that it parses to exactly the built-in defaults.
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// The `[daemon]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// How often the histograms are read and the detector runs.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The database directory.
    pub db: PathBuf,
    /// How often the detector's baselines are saved (also at shutdown).
    #[serde(with = "humantime_serde")]
    pub baseline_save_every: Duration,
    /// How often retention and the size budget are enforced.
    #[serde(with = "humantime_serde")]
    pub retention_every: Duration,
    /// Run the configured pwru binary even when the prerequisite check says pwru cannot work
    /// here (for a stand-in executable in tests; the real pwru traces nothing then).
    pub pwru_ignore_prerequisites: bool,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            interval: Duration::from_secs(1),
            db: PathBuf::from("/var/lib/tailtrap/db"),
            baseline_save_every: Duration::from_secs(60),
            retention_every: Duration::from_secs(600),
            pwru_ignore_prerequisites: false,
        }
    }
}

/// The `[api]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// The unix socket the daemon serves its HTTP/JSON API on (created mode 0600).
    pub socket: PathBuf,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            socket: PathBuf::from("/run/tailtrap/api.sock"),
        }
    }
}

/// A capture threshold: a quantile of the service's learned baseline at the probe, or a
/// fixed latency. Written `"p99"`, `"p99.9"` or a duration such as `"2ms"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Threshold {
    /// The baseline's value of this quantile, in (0, 1).
    Quantile(f64),
    /// A fixed latency.
    Latency(Duration),
}

impl std::str::FromStr for Threshold {
    type Err = String;
    fn from_str(s: &str) -> Result<Threshold, String> {
        if let Some(pct) = s.strip_prefix('p') {
            let q = pct
                .parse::<f64>()
                .ok()
                // Through whole millionths of a percent, so "p99.9" is exactly 0.999.
                .map(|p| (p * 1e6).round() / 1e8)
                .filter(|q| *q > 0.0 && *q < 1.0)
                .ok_or_else(|| format!("{s:?} is not a quantile like \"p99\" or \"p99.9\""))?;
            return Ok(Threshold::Quantile(q));
        }
        match humantime::parse_duration(s) {
            Ok(d) if !d.is_zero() => Ok(Threshold::Latency(d)),
            _ => Err(format!(
                "{s:?} is neither a quantile (\"p99\") nor a latency (\"2ms\")"
            )),
        }
    }
}

impl TryFrom<String> for Threshold {
    type Error = String;
    fn try_from(s: String) -> Result<Threshold, String> {
        s.parse()
    }
}

impl From<Threshold> for String {
    fn from(t: Threshold) -> String {
        t.to_string()
    }
}

impl std::fmt::Display for Threshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Threshold::Quantile(q) => write!(f, "p{}", q * 100.0),
            Threshold::Latency(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// The `[capture]` table: in-kernel capture of slow SKBs during incidents, and the flight
/// recorder that keeps the seconds before one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Arm capture when an incident opens.
    pub enabled: bool,
    /// Record SKBs slower than this at the incident's hot probes.
    pub threshold: Threshold,
    /// Keep one record in N slow SKBs (1: all).
    pub sample_one_in: u32,
    /// In-kernel token bucket: records per second at most, all services together.
    pub rate_limit: u32,
    /// Disarm after this long even if the incident is still open.
    #[serde(with = "humantime_serde")]
    pub max_time: Duration,
    /// Disarm after this many samples of one incident.
    pub max_samples: u64,
    /// Flight recorder: always on, records SKBs slower than this.
    pub flight_threshold: Threshold,
    /// Flight recorder: records per second at most.
    pub flight_rate: u32,
    /// Flight recorder: how far back it keeps samples.
    #[serde(with = "humantime_serde")]
    pub flight_window: Duration,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            enabled: true,
            threshold: Threshold::Quantile(0.99),
            sample_one_in: 1,
            rate_limit: 2000,
            max_time: Duration::from_secs(120),
            max_samples: 20_000,
            flight_threshold: Threshold::Quantile(0.999),
            flight_rate: 20,
            flight_window: Duration::from_secs(120),
        }
    }
}

/// Text of the configuration file at `path`, or the embedded defaults when `path` is the
/// default location and no file is there.
pub fn load(path: Option<&Path>) -> anyhow::Result<Config> {
    let (path, explicit) = match path {
        Some(p) => (p, true),
        None => (Path::new(DEFAULT_PATH), false),
    };
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse(&text, &path.display().to_string())?),
        Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(parse("", "embedded defaults")?)
        }
        Err(e) => Err(anyhow::anyhow!("reading config {}: {e}", path.display())),
    }
}

/// Read the probe settings of a config file.
pub fn load_probe_config(path: &Path) -> anyhow::Result<bpf::ProbeConfig> {
    Ok(load(Some(path))?.probes)
}

/// Parse the probe settings from config text; `origin` names it in errors.
#[cfg(test)]
fn parse_probe_config(text: &str, origin: &str) -> Result<bpf::ProbeConfig, ConfigError> {
    parse(text, origin).map(|c| c.probes)
}

/// Parse and check a whole configuration; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let file: File =
        serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            ConfigError {
                origin: origin.to_owned(),
                line: inner
                    .span()
                    .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
                key: (path != "." && !path.is_empty()).then_some(path),
                reason: inner.message().trim().to_owned(),
            }
        })?;
    let detector = DetectorConfig::from_toml_str(text, origin).map_err(|e| ConfigError {
        origin: e.origin,
        line: e.line,
        key: e.key,
        reason: e.reason,
    })?;
    let at_key = |key: String, reason: String| ConfigError {
        origin: origin.to_owned(),
        line: line_of(text, &key),
        key: Some(key),
        reason,
    };
    if let Err(e) = file.storage.validate() {
        let (key, reason) = match e {
            storage::StoreError::Config { key, reason } => (format!("storage.{key}"), reason),
            other => ("storage".to_owned(), other.to_string()),
        };
        return Err(at_key(key, reason));
    }
    check_daemon(&file.daemon, &file.api).map_err(|(k, r)| at_key(k, r))?;
    check_capture(&file.capture).map_err(|(k, r)| at_key(k, r))?;
    let probes = check_probes(file.probes, file.services, &at_key)?;
    Ok(Config {
        origin: origin.to_owned(),
        probes,
        detector,
        storage: file.storage,
        capture: file.capture,
        pwru: file.pwru,
        daemon: file.daemon,
        api: file.api,
        metrics: file.metrics,
    })
}

fn check_daemon(d: &DaemonConfig, api: &ApiConfig) -> Result<(), (String, String)> {
    if d.interval < Duration::from_millis(10) || d.interval > Duration::from_secs(60) {
        return Err((
            "daemon.interval".into(),
            format!(
                "{} is outside 10ms..=60s",
                humantime::format_duration(d.interval)
            ),
        ));
    }
    for (key, v) in [
        ("daemon.baseline_save_every", d.baseline_save_every),
        ("daemon.retention_every", d.retention_every),
    ] {
        if v < d.interval {
            return Err((
                key.into(),
                "must not be shorter than daemon.interval".into(),
            ));
        }
    }
    // A root daemon must not write wherever its working directory happens to be.
    for (key, p) in [("daemon.db", &d.db), ("api.socket", &api.socket)] {
        if !p.is_absolute() {
            return Err((key.into(), format!("{p:?} must be an absolute path")));
        }
    }
    Ok(())
}

fn check_capture(c: &CaptureConfig) -> Result<(), (String, String)> {
    let positive = [
        ("capture.sample_one_in", u64::from(c.sample_one_in)),
        ("capture.rate_limit", u64::from(c.rate_limit)),
        ("capture.max_samples", c.max_samples),
        ("capture.flight_rate", u64::from(c.flight_rate)),
    ];
    for (key, v) in positive {
        if v == 0 {
            return Err((key.into(), "must be at least 1".into()));
        }
    }
    for (key, v) in [
        ("capture.max_time", c.max_time),
        ("capture.flight_window", c.flight_window),
    ] {
        if v.is_zero() {
            return Err((key.into(), "must be longer than zero".into()));
        }
    }
    Ok(())
}

fn check_probes(
    p: ProbesTable,
    services: Vec<ServiceTable>,
    at_key: &dyn Fn(String, String) -> ConfigError,
) -> Result<bpf::ProbeConfig, ConfigError> {
    let file_services = services;
    if p.auto_service_limit == 0 {
        return Err(at_key(
            "probes.auto_service_limit".into(),
            "must be at least 1".into(),
        ));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut port_owner: BTreeMap<u16, &str> = BTreeMap::new();
    for (i, s) in file_services.iter().enumerate() {
        let key = |k: &str| format!("services[{i}].{k}");
        if s.name.len() > storage::MAX_SERVICE_LEN {
            return Err(at_key(
                key("name"),
                format!("longer than {} bytes", storage::MAX_SERVICE_LEN),
            ));
        }
        if s.name.is_empty() || s.name == "host" || s.name == "other" {
            return Err(at_key(
                key("name"),
                format!("{:?} is reserved or empty", s.name),
            ));
        }
        if let Some(first) = seen.insert(&s.name, i) {
            return Err(at_key(
                key("name"),
                format!(
                    "service {:?} is already declared as services[{first}]",
                    s.name
                ),
            ));
        }
        if s.cgroup.is_none() && s.ports.is_empty() {
            return Err(at_key(
                key("name"),
                "a service needs a cgroup, ports or both".into(),
            ));
        }
        for &port in &s.ports {
            if port == 0 {
                return Err(at_key(key("ports"), "port 0 is not a port".into()));
            }
            if let Some(owner) = port_owner.insert(port, &s.name) {
                return Err(at_key(
                    key("ports"),
                    format!("port {port} already belongs to service {owner:?}"),
                ));
            }
        }
    }
    Ok(bpf::ProbeConfig {
        enabled: p.enable,
        services: file_services
            .into_iter()
            .map(|s| bpf::ServiceSpec {
                name: s.name,
                cgroup: s.cgroup,
                ports: s.ports,
            })
            .collect(),
        auto_service_limit: p.auto_service_limit,
        filters: bpf::Filters {
            pids: p.filters.pids,
            cgroups: p.filters.cgroups,
            ifindexes: p.filters.ifindexes,
            netns: p.filters.netns,
            min_queue_len: p.filters.min_queue_len,
            sample_one_in: p.filters.sample_one_in,
        },
        hol_filter: p.hol_filter,
        hist_map_entries: None,
    })
}

/// Best-effort line of a checked key: `probes.x` is the `x =` line under `[probes]`;
/// `services[i].x` is the `x =` line in the i-th `[[services]]` block.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let (table, index, field) = match key.split_once('.') {
        Some((t, f)) if t.starts_with("services[") => {
            let i: usize = t
                .trim_start_matches("services[")
                .trim_end_matches(']')
                .parse()
                .ok()?;
            ("services", Some(i), f)
        }
        Some((t, f)) => (t, None, f),
        None => return None,
    };
    // `history[2]` is written `history = [...]`.
    let field = field.split('[').next().unwrap_or(field);
    let mut current = String::new();
    let mut services_seen = 0usize;
    let mut block_line = None;
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.starts_with('[') {
            current = l.trim_matches(|c| c == '[' || c == ']').trim().to_owned();
            if l.starts_with("[[") && current == "services" {
                services_seen += 1;
            }
            let here = current == table && index.is_none_or(|i| services_seen == i + 1);
            if here {
                block_line = Some(n + 1);
            }
            continue;
        }
        let in_block = current == table && index.is_none_or(|i| services_seen == i + 1);
        if in_block {
            if let Some(rest) = l.strip_prefix(field) {
                if rest.trim_start().starts_with('=') {
                    return Some(n + 1);
                }
            }
        }
    }
    block_line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let cfg = parse_probe_config("", "t.toml").unwrap();
        assert_eq!(cfg, bpf::ProbeConfig::default());
    }

    #[test]
    fn full_probe_sections_parse() {
        let text = r#"
[probes]
hol_filter = false
auto_service_limit = 8

[probes.enable]
udp-socket-read = false

[probes.filters]
pids = [1, 2]
cgroups = ["system.slice"]
ifindexes = [3]
netns = [4026531840]
min_queue_len = 3
sample_one_in = 10

[[services]]
name = "web"
cgroup = "system.slice/nginx.service"
ports = [80, 443]

[[services]]
name = "dns"
ports = [53]

[detector]
min_ratio = 1.5
"#;
        let cfg = parse_probe_config(text, "t.toml").unwrap();
        assert!(!cfg.hol_filter);
        assert_eq!(cfg.auto_service_limit, 8);
        assert!(!cfg.is_enabled(Probe::UdpSocketRead));
        assert!(cfg.is_enabled(Probe::TcpSocketRead));
        assert_eq!(cfg.filters.pids, vec![1, 2]);
        assert_eq!(cfg.filters.min_queue_len, 3);
        assert_eq!(cfg.filters.sample_one_in, 10);
        assert_eq!(cfg.services.len(), 2);
        assert_eq!(cfg.services[0].ports, vec![80, 443]);
        assert_eq!(
            cfg.services[0].cgroup.as_deref(),
            Some(Path::new("system.slice/nginx.service"))
        );
        assert_eq!(cfg.services[1].cgroup, None);
    }

    #[test]
    fn embedded_defaults_are_the_built_in_defaults() {
        let from_text = parse(DEFAULTS_TOML, "defaults.toml").unwrap();
        let built_in = parse("", "none").unwrap();
        assert_eq!(
            Config {
                origin: String::new(),
                ..from_text
            },
            Config {
                origin: String::new(),
                ..built_in.clone()
            }
        );
        assert_eq!(built_in.detector, DetectorConfig::default());
        assert_eq!(built_in.storage, StoreConfig::default());
        assert_eq!(built_in.pwru, PwruConfig::default());
        assert_eq!(built_in.daemon, DaemonConfig::default());
        assert_eq!(built_in.capture, CaptureConfig::default());
    }

    #[test]
    fn every_table_is_read() {
        let text = r#"
[daemon]
interval = "250ms"
db = "/tmp/tt/db"
pwru_ignore_prerequisites = true

[api]
socket = "/tmp/tt/api.sock"

[detector]
warmup_time = "5s"

[storage]
flush_every = "200ms"

[capture]
threshold = "3ms"
flight_threshold = "p99.5"

[pwru]
binary = "/opt/pwru"
deadline = "5s"
"#;
        let c = parse(text, "t.toml").unwrap();
        assert_eq!(c.daemon.interval, Duration::from_millis(250));
        assert!(c.daemon.pwru_ignore_prerequisites);
        assert_eq!(c.api.socket, Path::new("/tmp/tt/api.sock"));
        assert_eq!(c.detector.warmup_time, Duration::from_secs(5));
        assert_eq!(c.storage.flush_every, Duration::from_millis(200));
        assert_eq!(
            c.capture.threshold,
            Threshold::Latency(Duration::from_millis(3))
        );
        assert_eq!(c.capture.flight_threshold, Threshold::Quantile(0.995));
        assert_eq!(c.pwru.binary(), Some(Path::new("/opt/pwru")));
        assert_eq!(c.pwru.limits().deadline(), Duration::from_secs(5));
    }

    #[test]
    fn errors_of_every_table_name_file_line_and_key() {
        let cases = [
            (
                "[daemon]\ninterval = \"1ms\"\n",
                "c, line 2: key `daemon.interval`: 1ms is outside 10ms..=60s",
            ),
            (
                "[daemon]\ndb = \"var/db\"\n",
                "c, line 2: key `daemon.db`: \"var/db\" must be an absolute path",
            ),
            (
                "[api]\nsocket = \"api.sock\"\n",
                "c, line 2: key `api.socket`",
            ),
            (
                "[daemon]\n\n\nintervall = \"1s\"\n",
                "c, line 4: key `daemon.intervall`: unknown field `intervall`",
            ),
            (
                "[capture]\nthreshold = \"p100\"\n",
                "c, line 2: key `capture.threshold`: \"p100\" is not a quantile",
            ),
            (
                "[capture]\nmax_samples = 0\n",
                "c, line 2: key `capture.max_samples`: must be at least 1",
            ),
            (
                "[storage]\nflush_every = \"2s\"\n",
                "c, line 2: key `storage.flush_every`: 2s is outside (0, 1s]",
            ),
            (
                "[detector]\nmin_ratio = 0.5\n",
                "c, line 2: key `detector.min_ratio`: ratio 0.5 must be a number >= 1",
            ),
            (
                "[pwru]\nmax_peers = 17\n",
                "c, line 2: key `pwru.max_peers`: max_peers 17 is out of range",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text, "c").unwrap_err().to_string();
            assert!(err.starts_with(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn thresholds_read_and_print() {
        for (text, t) in [
            ("p99", Threshold::Quantile(0.99)),
            ("p99.9", Threshold::Quantile(0.999)),
            ("2ms", Threshold::Latency(Duration::from_millis(2))),
        ] {
            let parsed: Threshold = text.parse().unwrap();
            match (parsed, t) {
                (Threshold::Quantile(a), Threshold::Quantile(b)) => {
                    assert!((a - b).abs() < 1e-12)
                }
                (a, b) => assert_eq!(a, b),
            }
        }
        assert!("0ms".parse::<Threshold>().is_err());
        assert!("p0".parse::<Threshold>().is_err());
        assert!("soon".parse::<Threshold>().is_err());
        assert_eq!(
            Threshold::Latency(Duration::from_millis(2)).to_string(),
            "2ms"
        );
    }

    #[test]
    fn unknown_keys_name_file_line_and_key() {
        let err = parse_probe_config("[probes]\nhol_filter = true\nhol_fliter = 1\n", "/x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/x.toml, line 3"), "{err}");
        assert!(err.contains("hol_fliter"), "{err}");

        let err = parse_probe_config("[probes.enable]\ntcp-read = true\n", "/x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("tcp-read"), "{err}");

        let err = parse_probe_config("[[services]]\nname = \"a\"\nport = [1]\n", "/x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3") && err.contains("port"), "{err}");

        let err = parse_probe_config("[probs]\n", "/x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1") && err.contains("probs"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = parse_probe_config("[probes]\nauto_service_limit = 0\n", "c")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "c, line 2: key `probes.auto_service_limit`: must be at least 1"
        );

        let text = "[[services]]\nname = \"a\"\nports = [80]\n\n[[services]]\nname = \"b\"\nports = [80]\n";
        let err = parse_probe_config(text, "c").unwrap_err().to_string();
        assert!(
            err.starts_with("c, line 7: key `services[1].ports`: port 80 already belongs"),
            "{err}"
        );

        let err = parse_probe_config("[[services]]\nname = \"host\"\nports = [1]\n", "c")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("c, line 2: key `services[0].name`"),
            "{err}"
        );

        let err = parse_probe_config("[[services]]\nname = \"a\"\nports = [70000]\n", "c")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 3") && err.contains("services[0].ports"),
            "{err}"
        );
    }
}
