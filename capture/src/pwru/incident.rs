//! The pwru session an incident asks for: its protocol from the hot probes, its local ports
//! from the service's configuration or else from the slow samples, its peers from the
//! dominant flows, and its network namespace when the service lives in another one.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use model::{Flow, Probe};

use super::config::PwruConfig;
use super::request::{NetnsFilter, PcapFilter, Protocol, RequestError, SessionRequest};

/// Most local ports taken from samples for a filter.
const MAX_SAMPLE_PORTS: usize = 4;

/// What is known of an incident when its session is requested.
#[derive(Debug, Clone, Copy)]
pub struct IncidentScope<'a> {
    /// The service (the session manager's cooldown key).
    pub service: &'a str,
    /// The incident's hot probes.
    pub probes: &'a [Probe],
    /// The service's configured local ports (empty: taken from `flows`).
    pub ports: &'a [u16],
    /// The directory of the service's configured cgroup (absolute: the cgroup2 mount
    /// joined with the configured path); the caller resolves the mount.
    pub cgroup_dir: Option<&'a Path>,
    /// The flows of the incident's slow samples, dominant ones first or not: they are counted.
    pub flows: &'a [Flow],
}

/// Why an incident gets no session request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IncidentRequestError {
    /// `[pwru] enabled = false`.
    #[error("pwru sessions are off ([pwru] enabled = false)")]
    Disabled,
    /// No usable filter: no configured ports and none in the samples, or bad values.
    #[error("no session: {0} (no ports configured and no samples captured)")]
    NoFilter(RequestError),
}

impl SessionRequest {
    /// The session for an incident under `config`.
    pub fn for_incident(
        config: &PwruConfig,
        scope: &IncidentScope<'_>,
    ) -> Result<SessionRequest, IncidentRequestError> {
        if !config.enabled() {
            return Err(IncidentRequestError::Disabled);
        }
        let ports = incident_ports(scope.ports, scope.flows);
        let send_side = !scope.probes.is_empty() && scope.probes.iter().all(|p| p.is_send());
        // Probes before the transport layer (ip-start, nic-to-stack) say nothing of it:
        // the slow packets' flows do.
        let transport_known = scope
            .probes
            .iter()
            .any(|p| matches!(p.path(), model::Path::Tcp | model::Path::Udp));
        let protocol = if send_side || (!transport_known && !scope.flows.is_empty()) {
            Protocol::of_flows(scope.flows)
        } else {
            Protocol::of_probes(scope.probes)
        };
        let mut filter = PcapFilter::from_flows(protocol, &ports, scope.flows, config.max_peers())
            .map_err(IncidentRequestError::NoFilter)?;
        if send_side {
            filter = filter.outbound();
        }
        let mut request = SessionRequest::new(scope.service, filter)
            .with_filter_funcs(config.filter_funcs(scope.probes))
            .with_limits(config.limits());
        if let Some(netns) = scope.cgroup_dir.and_then(NetnsFilter::of_cgroup) {
            request = request.with_netns(netns);
        }
        Ok(request)
    }
}

/// The configured ports, or for a service known by its cgroup alone the first few local
/// ports its slow samples hit.
fn incident_ports(configured: &[u16], flows: &[Flow]) -> Vec<u16> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let mut ports = Vec::new();
    for f in flows {
        if ports.len() == MAX_SAMPLE_PORTS {
            break;
        }
        if f.dport != 0 && !ports.contains(&f.dport) {
            ports.push(f.dport);
        }
    }
    ports
}

impl Protocol {
    /// The protocol most of `flows` use: a send probe is on both protocols' path, so a
    /// send-side incident's protocol is its slow packets'. TCP when none is known.
    pub fn of_flows(flows: &[Flow]) -> Protocol {
        let udp = flows
            .iter()
            .filter(|f| f.transport == model::Transport::Udp)
            .count();
        let tcp = flows
            .iter()
            .filter(|f| f.transport == model::Transport::Tcp)
            .count();
        if udp > tcp {
            Protocol::Udp
        } else {
            Protocol::Tcp
        }
    }

    /// TCP unless every hot probe is on the UDP path (ip-start is on both).
    pub fn of_probes(probes: &[Probe]) -> Protocol {
        let udp = |p: &Probe| p.path() == model::Path::Udp;
        let tcp = |p: &Probe| p.path() == model::Path::Tcp;
        if probes.iter().any(udp) && !probes.iter().any(tcp) {
            Protocol::Udp
        } else {
            Protocol::Tcp
        }
    }
}

impl NetnsFilter {
    /// The network namespace of the first process in the cgroup directory `cgroup_dir`,
    /// when it differs from this process's own; `None` when it is the same or cannot be
    /// read.
    pub fn of_cgroup(cgroup_dir: &Path) -> Option<NetnsFilter> {
        foreign_netns(cgroup_dir).map(NetnsFilter::inode)
    }
}

fn foreign_netns(cgroup_dir: &Path) -> Option<u32> {
    let procs = std::fs::read_to_string(cgroup_dir.join("cgroup.procs")).ok()?;
    let pid: u32 = procs.lines().next()?.trim().parse().ok()?;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok()?.ino();
    let ours = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
    (theirs != ours).then(|| u32::try_from(theirs).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::Transport;

    fn flow(t: Transport, src: &str, dport: u16) -> Flow {
        Flow {
            transport: t,
            src: src.parse().unwrap(),
            sport: 40000,
            dst: "10.0.0.1".parse().unwrap(),
            dport,
        }
    }

    fn scope<'a>(probes: &'a [Probe], ports: &'a [u16], flows: &'a [Flow]) -> IncidentScope<'a> {
        IncidentScope {
            service: "web",
            probes,
            ports,
            cgroup_dir: None,
            flows,
        }
    }

    #[test]
    fn protocol_follows_the_hot_probes() {
        assert_eq!(Protocol::of_probes(&[Probe::UdpSocketRead]), Protocol::Udp);
        assert_eq!(
            Protocol::of_probes(&[Probe::IpStart, Probe::UdpStart]),
            Protocol::Udp
        );
        assert_eq!(Protocol::of_probes(&[Probe::TcpSocketRead]), Protocol::Tcp);
        assert_eq!(Protocol::of_probes(&[Probe::IpStart]), Protocol::Tcp);
        assert_eq!(
            Protocol::of_probes(&[Probe::UdpStart, Probe::TcpStart]),
            Protocol::Tcp
        );
    }

    #[test]
    fn a_send_side_incident_follows_its_packets_out_with_their_protocol() {
        let flows = [
            flow(Transport::Udp, "10.0.0.5", 5353),
            flow(Transport::Udp, "10.0.0.5", 5353),
        ];
        let r = SessionRequest::for_incident(
            &PwruConfig::default(),
            &scope(&[Probe::QdiscSojourn], &[], &flows),
        )
        .unwrap();
        assert_eq!(
            r.filter().expression(),
            "udp and src port 5353 and src host 10.0.0.1 and dst host 10.0.0.5"
        );
        assert!(r
            .filter_funcs()
            .names()
            .iter()
            .any(|f| f == "dev_hard_start_xmit"));
    }

    #[test]
    fn an_early_stage_incident_takes_its_protocol_from_the_slow_packets() {
        let flows = [flow(Transport::Udp, "10.0.0.5", 5353)];
        for probes in [
            &[Probe::NicToStack][..],
            &[Probe::IpStart, Probe::NicToStack],
        ] {
            let r =
                SessionRequest::for_incident(&PwruConfig::default(), &scope(probes, &[], &flows))
                    .unwrap();
            assert!(
                r.filter().expression().starts_with("udp and "),
                "{probes:?}: {}",
                r.filter().expression()
            );
            assert!(r
                .filter_funcs()
                .names()
                .iter()
                .any(|f| f == "napi_gro_receive"));
        }
    }

    #[test]
    fn configured_ports_win_over_samples() {
        let flows = [flow(Transport::Tcp, "10.0.0.5", 8080)];
        let r = SessionRequest::for_incident(
            &PwruConfig::default(),
            &scope(&[Probe::TcpSocketRead], &[9000], &flows),
        )
        .unwrap();
        assert_eq!(r.service(), "web");
        // The sample's port is not the service's: its peer does not narrow the filter.
        assert_eq!(r.filter().expression(), "tcp and dst port 9000");
        assert_eq!(
            r.filter_funcs(),
            &PwruConfig::default().filter_funcs(&[Probe::TcpSocketRead])
        );
    }

    #[test]
    fn a_cgroup_service_takes_its_ports_and_peers_from_samples() {
        let mut flows = vec![flow(Transport::Udp, "10.0.0.5", 0)];
        for port in [53, 5353, 53, 1, 2, 3] {
            flows.push(flow(Transport::Udp, "10.0.0.5", port));
        }
        let r = SessionRequest::for_incident(
            &PwruConfig::default(),
            &scope(&[Probe::UdpSocketRead], &[], &flows),
        )
        .unwrap();
        // Port 0 is skipped, duplicates once, at most four ports.
        assert_eq!(r.filter().local_ports(), [53, 5353, 1, 2]);
        assert_eq!(r.filter().protocol(), Protocol::Udp);
        assert_eq!(
            r.filter().remote_addrs(),
            ["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    #[test]
    fn refusals_say_why() {
        let e = SessionRequest::for_incident(
            &PwruConfig::default(),
            &scope(&[Probe::TcpSocketRead], &[], &[]),
        )
        .unwrap_err();
        assert_eq!(e, IncidentRequestError::NoFilter(RequestError::NoPorts));
        assert_eq!(
            e.to_string(),
            "no session: a pwru session needs at least one local port \
             (no ports configured and no samples captured)"
        );
        let off: PwruConfig = toml::from_str("enabled = false").unwrap();
        let e = SessionRequest::for_incident(&off, &scope(&[Probe::TcpSocketRead], &[80], &[]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "pwru sessions are off ([pwru] enabled = false)"
        );
    }

    #[test]
    fn own_namespace_is_not_foreign() {
        // A cgroup directory whose first process is this one: same namespace.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(NetnsFilter::of_cgroup(dir.path()), None);
        // No readable process list: no filter either.
        assert_eq!(NetnsFilter::of_cgroup(&dir.path().join("gone")), None);
    }
}
