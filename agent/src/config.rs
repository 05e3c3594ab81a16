//! The daemon's configuration file, read once: one TOML parse, then each top-level table
//! deserialized and checked by the crate that owns it — `[probes]` and `[[services]]` by
//! `bpf`, `[detector]` by `detector`, `[storage]` by `storage`, `[capture]` and `[pwru]` by
//! `capture`, `[daemon]` and `[api]` here. Owners report problems by key
//! ([`KeyProblem`]); this module alone turns a key into a line of the file, and reports
//! every problem of the file at once ([`ConfigError`]).
//!
//! Where a new key goes: into the owner's table struct (checked by its deserializer, or in
//! its [`Validate`] impl when a rule spans keys), with its commented default in the owner's
//! `defaults.toml` (a test fails without it) and its line in docs/operations.md (or the doc
//! it points to). A new table owned here: a struct below, one field in [`Config`], one
//! `tables.read("name")` line in [`parse`] and its defaults in `defaults.toml`; a table
//! owned by another crate also adds that crate's snippet to [`DEFAULTS`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capture::pwru::PwruConfig;
use capture::CaptureConfig;
use detector::DetectorConfig;
use model::config::{KeyProblem, Validate};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use storage::StoreConfig;

/// The whole daemon configuration, every table checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// Where it came from: the file, or `embedded defaults`.
    #[serde(skip)]
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
    /// `[otlp]`.
    pub otlp: crate::otlp::OtlpConfig,
}

/// Where the daemon looks for its configuration when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/tailtrap/tailtrap.toml";

/// The commented defaults of every table, each snippet kept by the table's owner; `tailtrap
/// config defaults` prints them in this order. A test checks that each parses to its
/// owner's defaults and names every key.
pub const DEFAULTS: [&str; 6] = [
    include_str!("defaults.toml"),
    bpf::DEFAULTS_TOML,
    detector::DEFAULTS_TOML,
    capture::DEFAULTS_TOML,
    storage::DEFAULTS_TOML,
    capture::pwru::DEFAULTS_TOML,
];

/// The defaults as one commented configuration file.
pub fn defaults_toml() -> String {
    DEFAULTS.join("\n")
}

/// A configuration that cannot be used: the file could not be read, or it has problems
/// (all of them, each with its line and key when known).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    // The cause is the error's source: anyhow prints it after the message, once.
    #[error("reading config {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text has problems; one line each when shown.
    #[error("{}", lines(origin, problems).join("\n"))]
    Invalid {
        /// The file, or another name for the text.
        origin: String,
        /// Every problem, in the order of their lines.
        problems: Vec<Problem>,
    },
}

/// One problem of a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key from the file's root (`services[1].ports`), when known.
    pub key: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl ConfigError {
    /// One line per problem, `FILE, line N: key `a.b`: reason`.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ConfigError::Read { path, source } => {
                vec![format!("reading config {}: {source}", path.display())]
            }
            ConfigError::Invalid { origin, problems } => lines(origin, problems),
        }
    }
}

fn lines(origin: &str, problems: &[Problem]) -> Vec<String> {
    problems
        .iter()
        .map(|p| {
            let mut s = origin.to_owned();
            if let Some(line) = p.line {
                s += &format!(", line {line}");
            }
            if let Some(key) = &p.key {
                s += &format!(": key `{key}`");
            }
            s + ": " + &p.reason
        })
        .collect()
}

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

impl Validate for DaemonConfig {
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = Vec::new();
        if self.interval < Duration::from_millis(10) || self.interval > Duration::from_secs(60) {
            problems.push(KeyProblem::new(
                "interval",
                format!(
                    "{} is outside 10ms..=60s",
                    humantime::format_duration(self.interval)
                ),
            ));
        }
        for (key, v) in [
            ("baseline_save_every", self.baseline_save_every),
            ("retention_every", self.retention_every),
        ] {
            if v < self.interval {
                problems.push(KeyProblem::new(
                    key,
                    "must not be shorter than daemon.interval",
                ));
            }
        }
        problems.extend(absolute("db", &self.db));
        problems
    }
}

/// A root daemon must not write wherever its working directory happens to be.
fn absolute(key: &str, p: &Path) -> Option<KeyProblem> {
    (!p.is_absolute()).then(|| KeyProblem::new(key, format!("{p:?} must be an absolute path")))
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

impl Validate for ApiConfig {
    fn validate(&self) -> Vec<KeyProblem> {
        absolute("socket", &self.socket).into_iter().collect()
    }
}

/// The configuration file at `path`, or the embedded defaults when `path` is the default
/// location and no file is there.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
    let (path, explicit) = match path {
        Some(p) => (p, true),
        None => (Path::new(DEFAULT_PATH), false),
    };
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, &path.display().to_string()),
        Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
            parse("", "embedded defaults")
        }
        Err(source) => Err(ConfigError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Read the probe settings of a config file.
pub fn load_probe_config(path: &Path) -> Result<bpf::ProbeConfig, ConfigError> {
    Ok(load(Some(path))?.probes)
}

/// Parse the probe settings from config text; `origin` names it in errors.
#[cfg(test)]
fn parse_probe_config(text: &str, origin: &str) -> Result<bpf::ProbeConfig, ConfigError> {
    parse(text, origin).map(|c| c.probes)
}

/// Parse and check a whole configuration; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let mut tables = Tables::parse(text, origin)?;
    let mut probes: bpf::ProbeConfig = tables.deserialize("probes");
    probes.services = tables.deserialize("services");
    // Its rules span both tables, so its keys already start at the file's root.
    tables.problems.extend(probes.validate());
    let config = Config {
        origin: origin.to_owned(),
        probes,
        detector: tables.read("detector"),
        storage: tables.read("storage"),
        capture: tables.read("capture"),
        pwru: tables.read("pwru"),
        daemon: tables.read("daemon"),
        api: tables.read("api"),
        metrics: tables.read("metrics"),
        otlp: tables.read("otlp"),
    };
    tables.finish(true)?;
    Ok(config)
}

/// Read and check one table of config text, passing the others over (for commands that
/// borrow one table of the daemon's file).
pub fn parse_table<T>(text: &str, origin: &str, name: &'static str) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Default + Validate,
{
    let mut tables = Tables::parse(text, origin)?;
    let table = tables.read(name);
    tables.finish(false)?;
    Ok(table)
}

/// The file's top-level tables, handed out one by one, and the problems found so far.
struct Tables<'a> {
    text: &'a str,
    origin: &'a str,
    root: toml::Table,
    read: Vec<&'static str>,
    problems: Vec<KeyProblem>,
}

impl<'a> Tables<'a> {
    fn parse(text: &'a str, origin: &'a str) -> Result<Tables<'a>, ConfigError> {
        let root = toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Invalid {
            origin: origin.to_owned(),
            problems: vec![Problem {
                line: e
                    .span()
                    .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
                key: None,
                reason: e.message().trim().to_owned(),
            }],
        })?;
        Ok(Tables {
            text,
            origin,
            root,
            read: Vec::new(),
            problems: Vec::new(),
        })
    }

    /// Table `name`, deserialized and checked by its owner; the defaults when it is absent
    /// or unreadable (the problem is kept), so the other tables are still checked.
    fn read<T: DeserializeOwned + Default + Validate>(&mut self, name: &'static str) -> T {
        let table: T = self.deserialize(name);
        let problems = table.validate().into_iter().map(|p| p.under(name));
        self.problems.extend(problems);
        table
    }

    /// Table `name` deserialized by its owner, without its rules.
    fn deserialize<T: DeserializeOwned + Default>(&mut self, name: &'static str) -> T {
        self.read.push(name);
        let Some(value) = self.root.remove(name) else {
            return T::default();
        };
        model::config::deserialize(value).unwrap_or_else(|p| {
            self.problems.push(p.under(name));
            T::default()
        })
    }

    /// Every problem with its line, or Ok when there are none. With `whole_file`, tables
    /// nobody read are problems too.
    fn finish(mut self, whole_file: bool) -> Result<(), ConfigError> {
        if whole_file {
            let expected: Vec<String> = self.read.iter().map(|t| format!("`{t}`")).collect();
            for name in self.root.keys() {
                self.problems.push(KeyProblem::new(
                    model::config::key_segment(name),
                    format!(
                        "unknown field `{name}`, expected one of {}",
                        expected.join(", ")
                    ),
                ));
            }
        }
        if self.problems.is_empty() {
            return Ok(());
        }
        let mut problems: Vec<Problem> = self
            .problems
            .into_iter()
            .map(|p| Problem {
                line: line_of(self.text, &p.key),
                key: (!p.key.is_empty()).then_some(p.key),
                reason: p.reason,
            })
            .collect();
        // In file order; problems without a line last.
        problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
        Err(ConfigError::Invalid {
            origin: self.origin.to_owned(),
            problems,
        })
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Name(String),
    Index(usize),
}

/// The line that best places `key` (`a.b`, `services[1].ports`, `x."quoted name".y`): the
/// header or `key = ...` line defining the longest part of it. Best effort: TOML written
/// as inline tables places at the enclosing key.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let want = key_path(key)?;
    let is_prefix = |defined: &[Seg]| defined.len() <= want.len() && want.starts_with(defined);
    let mut table: Vec<Seg> = Vec::new();
    let mut arrays: HashMap<Vec<String>, usize> = HashMap::new();
    let mut best: Option<(usize, usize)> = None;
    for (n, line) in text.lines().enumerate() {
        let l = line.trim_start();
        let defined = if let Some(rest) = l.strip_prefix("[[") {
            let (names, _) = dotted(rest)?;
            let count = arrays.entry(names.clone()).or_default();
            table = names.into_iter().map(Seg::Name).collect();
            table.push(Seg::Index(*count));
            *count += 1;
            table.clone()
        } else if let Some(rest) = l.strip_prefix('[') {
            let Some((names, _)) = dotted(rest) else {
                continue;
            };
            table = names.into_iter().map(Seg::Name).collect();
            table.clone()
        } else {
            match dotted(l) {
                Some((names, rest)) if rest.trim_start().starts_with('=') => {
                    let mut k = table.clone();
                    k.extend(names.into_iter().map(Seg::Name));
                    k
                }
                _ => continue,
            }
        };
        if is_prefix(&defined) && best.is_none_or(|(len, _)| defined.len() > len) {
            best = Some((defined.len(), n + 1));
        }
    }
    best.map(|(_, line)| line)
}

/// A problem's key as path steps.
fn key_path(key: &str) -> Option<Vec<Seg>> {
    let mut path = Vec::new();
    let mut rest = key;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let (index, r) = r.split_once(']')?;
            path.push(Seg::Index(index.parse().ok()?));
            rest = r;
        } else {
            let r = rest.strip_prefix('.').unwrap_or(rest);
            let (name, r) = one_key(r)?;
            path.push(Seg::Name(name));
            rest = r;
        }
    }
    Some(path)
}

/// The dotted key at the start of `s` (`a."b c".d`), and what follows it.
fn dotted(s: &str) -> Option<(Vec<String>, &str)> {
    let mut names = Vec::new();
    let mut rest = s;
    loop {
        let (name, r) = one_key(rest.trim_start())?;
        names.push(name);
        rest = r.trim_start();
        match rest.strip_prefix('.') {
            Some(r) => rest = r,
            None => return Some((names, rest)),
        }
    }
}

/// One bare or quoted key at the start of `s`, and what follows it.
fn one_key(s: &str) -> Option<(String, &str)> {
    if let Some(r) = s.strip_prefix('"') {
        let mut name = String::new();
        let mut chars = r.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Some((name, &r[i + 1..])),
                '\\' => name.push(chars.next()?.1),
                c => name.push(c),
            }
        }
        None
    } else if let Some(r) = s.strip_prefix('\'') {
        let (name, r) = r.split_once('\'')?;
        Some((name.to_owned(), r))
    } else {
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(s.len());
        (end > 0).then(|| (s[..end].to_owned(), &s[end..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::Probe;

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
        let from_text = parse(&defaults_toml(), "defaults.toml").unwrap();
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
        assert_eq!(c.detector.defaults.warmup_time, Duration::from_secs(5));
        assert_eq!(c.storage.flush_every, Duration::from_millis(200));
        assert_eq!(
            c.capture.threshold,
            capture::Threshold::Latency(Duration::from_millis(3))
        );
        assert_eq!(
            c.capture.flight_threshold,
            capture::Threshold::Quantile(0.995)
        );
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
                "[storage]\ncache_bytes = 65536\n",
                "c, line 2: key `storage.cache_bytes`: must be at least 256 KiB",
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

    fn problems(text: &str) -> Vec<String> {
        parse(text, "c").unwrap_err().lines()
    }

    #[test]
    fn every_problem_of_the_file_is_reported() {
        let text = "[api]\nsocket = \"/run/a.sock\"\n\n[daemon]\ninterval = \"1ms\"\n\n[detector]\nmin_ratio = 0.5\n";
        assert_eq!(
            problems(text),
            [
                "c, line 5: key `daemon.interval`: 1ms is outside 10ms..=60s",
                "c, line 8: key `detector.min_ratio`: ratio 0.5 must be a number >= 1",
            ]
        );
        // The same with the rule-breaking service port that issue 8 started from.
        let text = "[[services]]\nname = \"a\"\nports = [0]\n\n[detector]\nmin_ratio = 0.5\n";
        let p = problems(text);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("c, line 3: key `services[0].ports`: port 0"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("c, line 6: key `detector.min_ratio`"),
            "{p:?}"
        );
    }

    #[test]
    fn a_type_error_and_a_rule_error_in_other_tables_are_both_reported() {
        let text = "[storage]\nmax_bytes = \"lots\"\n\n[capture]\nrate_limit = 0\n\n[probes]\nhol_fliter = true\n";
        let p = problems(text);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[0].starts_with("c, line 2: key `storage.max_bytes`: invalid type"),
            "{p:?}"
        );
        assert_eq!(
            p[1],
            "c, line 5: key `capture.rate_limit`: must be at least 1"
        );
        assert!(
            p[2].starts_with("c, line 8: key `probes.hol_fliter`: unknown field"),
            "{p:?}"
        );
    }

    #[test]
    fn unknown_keys_and_tables_are_reported_with_the_rest() {
        let p = problems("[probs]\nx = 1\n\n[daemon]\nintervall = \"1s\"\n[api]\nsocket = \"a\"\n");
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[0].starts_with("c, line 1: key `probs`: unknown field `probs`, expected one of `probes`, `services`"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("c, line 5: key `daemon.intervall`: unknown field"),
            "{p:?}"
        );
        assert!(p[2].starts_with("c, line 7: key `api.socket`"), "{p:?}");
    }

    // Moved from the detector, which no longer knows lines.
    fn detector_err(text: &str) -> Problem {
        match parse(text, "/etc/tailtrap/tailtrap.toml").unwrap_err() {
            ConfigError::Invalid { mut problems, .. } => problems.remove(0),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn detector_values_name_key_line_and_reason() {
        let err = parse(
            "[detector]\nquantiles = [0.5, 1.5]\n",
            "/etc/tailtrap/tailtrap.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("/etc/tailtrap/tailtrap.toml, line 2: key `detector.quantiles`"),
            "{err}"
        );
        let e = detector_err("[detector]\nquantiles = [0.5, 1.5]\n");
        assert!(e.reason.contains("outside (0, 1)"), "{e:?}");

        let e = detector_err("[detector]\n\n[detector.services.web]\nmin_ratio = 0.8\n");
        assert_eq!(e.line, Some(4), "{e:?}");
        assert_eq!(e.key.as_deref(), Some("detector.services.web.min_ratio"));
        assert!(e.reason.contains(">= 1"), "{e:?}");

        let e = detector_err("[detector]\nwindow = \"soon\"\n");
        assert_eq!(e.line, Some(2), "{e:?}");
        assert_eq!(e.key.as_deref(), Some("detector.window"));

        let e = detector_err("[detector]\nfrobnicate = 1\n");
        assert_eq!(e.line, Some(2), "{e:?}");
        assert!(e.reason.contains("frobnicate"), "{e:?}");

        let e = detector_err(
            "[[detector.slo]]\nprobe = \"tcp-read\"\nquantile = 0.99\nmax = \"5ms\"\n",
        );
        assert_eq!(e.line, Some(2), "{e:?}");
        assert!(e.reason.contains("tcp-read"), "{e:?}");

        let e = detector_err("[detector.services.\"my web\"]\nopen_after = 6\n");
        assert_eq!(
            e.key.as_deref(),
            Some("detector.services.\"my web\".open_after")
        );
        assert_eq!(e.line, Some(2), "{e:?}");
    }

    #[test]
    fn detector_cross_key_checks_name_the_key() {
        let e = detector_err("[detector]\n\n[detector.services.db]\nopen_after = 6\n");
        assert_eq!(e.key.as_deref(), Some("detector.services.db.open_after"));
        assert_eq!(e.line, Some(4), "{e:?}");
        assert!(
            e.reason.contains("must not exceed open_window (5)"),
            "{e:?}"
        );

        let e = detector_err("[detector]\nmax_window = \"2s\"\n");
        assert_eq!(e.key.as_deref(), Some("detector.max_window"));
        assert_eq!(e.line, Some(2), "{e:?}");
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let e = detector_err("[detector]\nmin_ratio = = 2\n");
        assert_eq!(e.line, Some(2), "{e:?}");
        assert_eq!(e.key, None);
    }

    #[test]
    fn one_table_can_be_read_alone() {
        let text = "[daemon]\nwhatever = 3\n\n[detector]\nmin_ratio = 2.0\n";
        let d: DetectorConfig = parse_table(text, "t", "detector").unwrap();
        assert_eq!(d.defaults.min_ratio, 2.0);
        let e = parse_table::<DetectorConfig>("[detector]\nmin_ratio = 0\n", "t", "detector")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t, line 2: key `detector.min_ratio`"), "{e}");
        assert_eq!(
            parse_table::<DetectorConfig>("", "t", "detector").unwrap(),
            DetectorConfig::default()
        );
    }

    #[test]
    fn lines_of_keys() {
        let text =
            "[a]\nx = 1\n[[s]]\nname = 1\n[[s]]\nname = 2\nports = [1]\n[a.\"b c\"]\ny = 2\n";
        assert_eq!(line_of(text, "a.x"), Some(2));
        assert_eq!(line_of(text, "a.z"), Some(1));
        assert_eq!(line_of(text, "s[1].name"), Some(6));
        assert_eq!(line_of(text, "s[1].ports[0]"), Some(7));
        assert_eq!(line_of(text, "s[0]"), Some(3));
        assert_eq!(line_of(text, "a.\"b c\".y"), Some(9));
        assert_eq!(line_of(text, "nowhere"), None);
    }

    /// Every leaf key of `v` (empty tables and arrays are leaves too), as paths.
    fn leaf_keys(v: &toml::Value, path: Vec<String>, out: &mut Vec<(Vec<String>, bool)>) {
        match v {
            toml::Value::Table(t) if !t.is_empty() => {
                for (k, v) in t {
                    let mut p = path.clone();
                    p.push(k.clone());
                    leaf_keys(v, p, out);
                }
            }
            toml::Value::Table(_) => out.push((path, true)),
            toml::Value::Array(a) => out.push((path, a.is_empty())),
            _ => out.push((path, false)),
        }
    }

    #[test]
    fn each_owners_defaults_parse_to_its_defaults_and_name_every_key() {
        let built_in = parse("", "").unwrap();
        let all = toml::Value::try_from(&built_in).unwrap();
        let mut covered = Vec::new();
        for snippet in DEFAULTS {
            let parsed = parse(snippet, "").unwrap_or_else(|e| panic!("{e}\n{snippet}"));
            assert_eq!(parsed, built_in, "{snippet}");
            let tables: toml::Table = toml::from_str(snippet).unwrap();
            let root = toml::Value::Table(tables.clone());
            for name in tables.keys() {
                covered.push(name.clone());
                let mut keys = Vec::new();
                leaf_keys(&all[name.as_str()], vec![name.clone()], &mut keys);
                for (key, empty) in keys {
                    let set = key
                        .iter()
                        .try_fold(&root, |v, k| v.get(k.as_str()))
                        .is_some();
                    // An empty map or list has no value to show: a commented example
                    // naming it documents it.
                    let named = empty && key.last().is_some_and(|k| snippet.contains(k.as_str()));
                    assert!(
                        set || named,
                        "key {} has no line in:\n{snippet}",
                        key.join(".")
                    );
                }
            }
        }
        for name in all.as_table().unwrap().keys() {
            assert!(covered.contains(name), "no defaults snippet has [{name}]");
        }
    }
}
