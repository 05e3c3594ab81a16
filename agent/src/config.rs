//! The daemon config file's probe sections: `[probes]` (with `[probes.enable]` and
//! `[probes.filters]`) and `[[services]]`. Unknown keys are errors naming file, line and
//! key. The other top-level tables belong to other parts of tailtrap and are passed over.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use detector::Probe;
use serde::Deserialize;

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
    // Reserved for the detector, storage, capture, pwru, daemon and API settings.
    #[serde(default, rename = "detector")]
    _detector: serde::de::IgnoredAny,
    #[serde(default, rename = "storage")]
    _storage: serde::de::IgnoredAny,
    #[serde(default, rename = "capture")]
    _capture: serde::de::IgnoredAny,
    #[serde(default, rename = "pwru")]
    _pwru: serde::de::IgnoredAny,
    #[serde(default, rename = "daemon")]
    _daemon: serde::de::IgnoredAny,
    #[serde(default, rename = "api")]
    _api: serde::de::IgnoredAny,
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

/// Read the probe settings of a config file.
pub fn load_probe_config(path: &Path) -> anyhow::Result<bpf::ProbeConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading config {}: {e}", path.display()))?;
    Ok(parse_probe_config(&text, &path.display().to_string())?)
}

/// Parse the probe settings from config text; `origin` names it in errors.
pub fn parse_probe_config(text: &str, origin: &str) -> Result<bpf::ProbeConfig, ConfigError> {
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
    let at_key = |key: String, reason: String| ConfigError {
        origin: origin.to_owned(),
        line: line_of(text, &key),
        key: Some(key),
        reason,
    };
    let p = file.probes;
    if p.auto_service_limit == 0 {
        return Err(at_key(
            "probes.auto_service_limit".into(),
            "must be at least 1".into(),
        ));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut port_owner: BTreeMap<u16, &str> = BTreeMap::new();
    for (i, s) in file.services.iter().enumerate() {
        let key = |k: &str| format!("services[{i}].{k}");
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
        services: file
            .services
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
anything = "is for the detector to judge"
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
