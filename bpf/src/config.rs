//! What to load: per-probe switches, services, filters.

use std::collections::BTreeMap;
use std::path::PathBuf;

use model::Probe;

/// Auto-grouped services at most, unless configured otherwise.
pub const DEFAULT_AUTO_SERVICE_LIMIT: u32 = 64;

/// Probe configuration, as the `[probes]` and `[[services]]` config sections give it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Per-probe on/off; probes missing from the map are on.
    pub enabled: BTreeMap<Probe, bool>,
    /// Configured services; empty means auto-grouping by socket cgroup.
    pub services: Vec<ServiceSpec>,
    /// With no configured services: cgroups tracked as their own service before the rest
    /// go to `other`.
    pub auto_service_limit: u32,
    /// Which traffic is measured at all.
    pub filters: Filters,
    /// Skip head-of-line-blocked reads at tcp-socket-read.
    pub hol_filter: bool,
    /// Override the histogram map's entry count (normally service slots x probes).
    pub hist_map_entries: Option<u32>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            enabled: BTreeMap::new(),
            services: Vec::new(),
            auto_service_limit: DEFAULT_AUTO_SERVICE_LIMIT,
            filters: Filters::default(),
            hol_filter: true,
            hist_map_entries: None,
        }
    }
}

impl ProbeConfig {
    /// Whether `probe` is switched on.
    pub fn is_enabled(&self, probe: Probe) -> bool {
        self.enabled.get(&probe).copied().unwrap_or(true)
    }
}

/// A service: sockets in a cgroup (or below it), sockets on local ports, or both (either
/// matches). Probes that run before socket lookup can only use the ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Name in histograms and output; not `host` or `other`.
    pub name: String,
    /// cgroup path relative to the cgroup2 mount, e.g. `system.slice/nginx.service`.
    pub cgroup: Option<PathBuf>,
    /// Local TCP/UDP ports.
    pub ports: Vec<u16>,
}

/// netstacklat's filters. Empty lists mean "all"; each list filter applies at the probes
/// that know its subject (see docs/probes.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    /// Process ids (thread group ids); applies to the read probes.
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
