//! What to load: per-probe switches, services, filters — the `[probes]` and `[[services]]`
//! tables of the config file, with the rules they must follow.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use model::config::{KeyProblem, Validate};
use model::Probe;
use serde::de::value::StrDeserializer;
use serde::de::{IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// Auto-grouped services at most, unless configured otherwise.
pub const DEFAULT_AUTO_SERVICE_LIMIT: u32 = 64;

/// The commented defaults of `[probes]` and `[[services]]`, part of `tailtrap config
/// defaults`; a test checks they parse to [`ProbeConfig::default`].
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// Probe configuration, as the `[probes]` and `[[services]]` config sections give it.
///
/// It deserializes from the `[probes]` table; `services` comes from `[[services]]`,
/// deserialized as a `Vec<ServiceSpec>` on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeConfig {
    /// Per-probe on/off; probes missing from the map are on.
    #[serde(rename = "enable", deserialize_with = "probe_switches")]
    pub enabled: BTreeMap<Probe, bool>,
    /// Configured services; empty means auto-grouping by socket cgroup.
    #[serde(skip)]
    pub services: Vec<ServiceSpec>,
    /// With no configured services: cgroups tracked as their own service before the rest
    /// go to `other`.
    pub auto_service_limit: u32,
    /// Which traffic is measured at all.
    pub filters: Filters,
    /// Skip head-of-line-blocked reads at tcp-socket-read.
    pub hol_filter: bool,
    /// Attribute ip-start samples to services by port (one read of the IP header per
    /// packet, the largest part of ip-start's cost); off: ip-start counts everything as
    /// `host`.
    pub ip_start_ports: bool,
    /// Give packets that arrive with their sender's delivery time (TCP over loopback or a
    /// veth) a receive stamp at netif_rx, so ip-start measures them.
    pub first_hook_stamps: bool,
    /// Use the kernel's features where it has them, or the stand-ins of 5.10 everywhere.
    pub kernel_features: KernelFeatureMode,
    /// Hardware RX stamps (docs/probes.md, "NIC hardware stamps"): use them where a
    /// device already stamps, turn stamping on, or leave the devices alone.
    pub hw_rx_timestamps: HwRxStamps,
    /// Measure every receive stage from the NIC's hardware stamp (converted to the system
    /// clock) for packets that carry one, instead of from the kernel's software stamp: each
    /// stage then includes nic-to-stack's time.
    pub hw_stamp_origin: bool,
    /// Override the histogram map's entry count (normally service slots x probes).
    #[serde(skip)]
    pub hist_map_entries: Option<u32>,
    /// Why nic-to-stack cannot measure on this host, as the daemon found its devices at
    /// load (no device has a PTP hardware clock): the stage is then not set up, and its
    /// histograms take no map memory. Not a configuration key.
    #[serde(skip)]
    pub nic_to_stack_unavailable: Option<String>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            enabled: BTreeMap::new(),
            services: Vec::new(),
            auto_service_limit: DEFAULT_AUTO_SERVICE_LIMIT,
            filters: Filters::default(),
            hol_filter: true,
            ip_start_ports: true,
            first_hook_stamps: true,
            kernel_features: KernelFeatureMode::Detect,
            hw_rx_timestamps: HwRxStamps::Use,
            hw_stamp_origin: false,
            hist_map_entries: None,
            nic_to_stack_unavailable: None,
        }
    }
}

/// `[probes] hw_rx_timestamps`: RX stamping is a device-wide setting that PTP daemons own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HwRxStamps {
    /// Use hardware stamps where a device already makes them (`"use"`, the default).
    Use,
    /// Turn RX stamping on (`rx_filter` all) on devices that can, and put it back as it was
    /// when the daemon stops (`"enable"`).
    Enable,
    /// Neither look at nor touch the devices (`"off"`).
    Off,
}

/// `[probes] kernel_features`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelFeatureMode {
    /// Find out what the kernel has (`"detect"`, the default).
    Detect,
    /// Use every stand-in that a 5.10 kernel needs, whatever the kernel has (`"baseline"`):
    /// to compare their accuracy and cost with the real features.
    Baseline,
}

/// `[probes.enable]`, read by hand so that an unknown probe name is reported at its own
/// key (serde's paths lose map keys that are enums).
fn probe_switches<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Probe, bool>, D::Error> {
    struct Switches;
    impl<'de> Visitor<'de> for Switches {
        type Value = BTreeMap<Probe, bool>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a table of probe names and true or false")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut switches = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                let name: StrDeserializer<'_, A::Error> = name.as_str().into_deserializer();
                match Probe::deserialize(name) {
                    Ok(probe) => {
                        switches.insert(probe, map.next_value()?);
                    }
                    Err(e) => return model::config::fail_at_value(&mut map, e),
                }
            }
            Ok(switches)
        }
    }
    d.deserialize_map(Switches)
}

impl ProbeConfig {
    /// Whether `probe` is switched on.
    pub fn is_enabled(&self, probe: Probe) -> bool {
        self.enabled.get(&probe).copied().unwrap_or(true)
    }
}

/// The rules of `[probes]` and `[[services]]`, checked by the config check and again by
/// [`crate::ProbeSet::load`]. Keys are from the file's root (`probes.…`, `services[i].…`)
/// because the rules span both tables.
impl Validate for ProbeConfig {
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = Vec::new();
        if self.auto_service_limit == 0 {
            problems.push(KeyProblem::new(
                "probes.auto_service_limit",
                "must be at least 1",
            ));
        }
        if self.hist_map_entries == Some(0) {
            problems.push(KeyProblem::new("hist_map_entries", "must be at least 1"));
        }
        // Slots are 16-bit in the kernel's maps.
        if self.services.len() > usize::from(u16::MAX) {
            problems.push(KeyProblem::new("services", "too many services"));
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut port_owner: HashMap<u16, &str> = HashMap::new();
        for (i, s) in self.services.iter().enumerate() {
            let key = |k: &str| format!("services[{i}].{k}");
            if s.name.len() > model::MAX_SERVICE_LEN {
                problems.push(KeyProblem::new(
                    key("name"),
                    format!("longer than {} bytes", model::MAX_SERVICE_LEN),
                ));
            }
            if s.name.is_empty() || ["host", "other", "host-wide"].contains(&s.name.as_str()) {
                problems.push(KeyProblem::new(
                    key("name"),
                    format!("{:?} is reserved or empty", s.name),
                ));
            } else if let Some(first) = seen.insert(&s.name, i) {
                problems.push(KeyProblem::new(
                    key("name"),
                    format!(
                        "service {:?} is already declared as services[{first}]",
                        s.name
                    ),
                ));
            }
            if s.cgroup.is_none() && s.ports.is_empty() {
                problems.push(KeyProblem::new(
                    key("name"),
                    "a service needs a cgroup, ports or both",
                ));
            }
            for &port in &s.ports {
                if port == 0 {
                    problems.push(KeyProblem::new(key("ports"), "port 0 is not a port"));
                } else if let Some(owner) = port_owner.insert(port, &s.name) {
                    problems.push(KeyProblem::new(
                        key("ports"),
                        format!("port {port} already belongs to service {owner:?}"),
                    ));
                }
            }
        }
        problems
    }
}

/// A service: sockets in a cgroup (or below it), sockets on local ports, or both (either
/// matches). Probes that run before socket lookup can only use the ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Name in histograms and output; not `host` or `other`.
    pub name: String,
    /// cgroup path relative to the cgroup2 mount, e.g. `system.slice/nginx.service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// Local TCP/UDP ports.
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// netstacklat's filters. Empty lists mean "all"; each list filter applies at the probes
/// that know its subject (see docs/probes.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Filters {
    /// Process ids (thread group ids); applies to the read probes, and to sent packets
    /// whose send call was seen (by their sender).
    pub pids: Vec<u32>,
    /// cgroup paths relative to the cgroup2 mount; matches the socket's own cgroup.
    pub cgroups: Vec<PathBuf>,
    /// Receiving interface indexes.
    pub ifindexes: Vec<u32>,
    /// Network namespace inode numbers.
    pub netns: Vec<u32>,
    /// Socket probes only count when the receive queue holds at least this many skbs.
    pub min_queue_len: u32,
    /// Keep one sample in N (0 and 1 keep all).
    pub sample_one_in: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn services(list: &[(&str, &[u16])]) -> ProbeConfig {
        ProbeConfig {
            services: list
                .iter()
                .map(|(name, ports)| ServiceSpec {
                    name: (*name).into(),
                    cgroup: None,
                    ports: ports.to_vec(),
                })
                .collect(),
            ..ProbeConfig::default()
        }
    }

    #[test]
    fn every_broken_rule_is_reported() {
        assert!(ProbeConfig::default().validate().is_empty());
        let mut c = services(&[("a", &[80]), ("a", &[80, 0]), ("host", &[1]), ("b", &[])]);
        c.auto_service_limit = 0;
        let keys: Vec<String> = c.validate().into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [
                "probes.auto_service_limit",
                "services[1].name",
                "services[1].ports",
                "services[1].ports",
                "services[2].name",
                "services[3].name"
            ]
        );
    }
}
