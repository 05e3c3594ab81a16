//! Acting on the detector's events: incident records in the store, pwru sessions.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bpf::cgroup2_mount;
use capture::pwru::{NetnsFilter, PcapFilter, Protocol, SessionManager, SessionRequest};
use detector::Event;
use model::{Flow, Probe};
use storage::{IncidentState, NewIncident, PwruState, Store};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::pwru::{self, Finished};
use super::unix_ns;
use crate::api::OpenIncident;
use crate::config::Config;

/// Most local ports taken from samples for a pwru filter.
const MAX_SAMPLE_PORTS: usize = 4;

/// The open incidents, by service, and the pwru sessions running for any incident.
pub(super) struct Incidents {
    store: Arc<Store>,
    open: HashMap<String, Open>,
    manager: SessionManager,
    pwru_done: mpsc::Sender<Finished>,
    sessions: JoinSet<()>,
}

struct Open {
    record: storage::Incident,
    detail: detector::Incident,
}

impl Incidents {
    pub(super) fn new(
        store: Arc<Store>,
        manager: SessionManager,
        pwru_done: mpsc::Sender<Finished>,
    ) -> Incidents {
        Incidents {
            store,
            open: HashMap::new(),
            manager,
            pwru_done,
            sessions: JoinSet::new(),
        }
    }

    /// Act on an Updated or Closed event (Opened goes through [`Incidents::opened`] and
    /// [`Incidents::start_pwru`]); one log line each.
    pub(super) fn handle(&mut self, event: Event) {
        match event {
            Event::Opened(inc) => {
                self.opened(inc);
            }
            Event::Updated(inc) => self.updated(inc),
            Event::Closed(inc) => self.closed(inc),
        }
    }

    /// Store a newly opened incident; its id, unless the store refused it.
    pub(super) fn opened(&mut self, inc: detector::Incident) -> Option<u64> {
        let new = NewIncident {
            service: inc.service.clone(),
            probes: inc.probes.clone(),
            opened_ns: unix_ns(inc.opened_at),
            evidence_json: json(&inc),
            stages_json: json(&inc.stage),
        };
        let record = match self.store.open_incident(&new) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(service = %inc.service, error = %e, "incident opened but could not be stored");
                return None;
            }
        };
        tracing::info!(
            incident = record.id,
            service = %inc.service,
            probes = %probe_list(&inc.probes),
            headline = %headline(&inc),
            stage = %stage(&inc),
            "incident opened"
        );
        let id = record.id;
        self.open.insert(
            inc.service.clone(),
            Open {
                record,
                detail: inc,
            },
        );
        Some(id)
    }

    /// Change an incident's record (open or already closed) and store it.
    pub(super) fn update(&mut self, id: u64, f: impl FnOnce(&mut storage::Incident)) {
        let mut loaded;
        let record = match self.open.values_mut().find(|o| o.record.id == id) {
            Some(o) => &mut o.record,
            None => match self.store.incident(id) {
                Ok(Some(r)) => {
                    loaded = r;
                    &mut loaded
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(incident = id, error = %e, "reading the incident failed");
                    return;
                }
            },
        };
        f(record);
        if let Err(e) = self.store.update_incident(record) {
            tracing::error!(incident = id, error = %e, "storing the incident's status failed");
        }
    }

    fn updated(&mut self, inc: detector::Incident) {
        let Some(open) = self.open.get_mut(&inc.service) else {
            return;
        };
        open.record.probes = inc.probes.clone();
        open.record.evidence_json = json(&inc);
        open.record.stages_json = json(&inc.stage);
        if let Err(e) = self.store.update_incident(&open.record) {
            tracing::error!(incident = open.record.id, error = %e, "storing the incident's update failed");
        }
        tracing::info!(
            incident = open.record.id,
            service = %inc.service,
            probes = %probe_list(&inc.probes),
            headline = %headline(&inc),
            "incident updated"
        );
        open.detail = inc;
    }

    fn closed(&mut self, inc: detector::Incident) {
        let Some(mut open) = self.open.remove(&inc.service) else {
            return;
        };
        let closed_at = inc.closed_at.unwrap_or_else(SystemTime::now);
        open.record.probes = inc.probes.clone();
        open.record.evidence_json = json(&inc);
        open.record.stages_json = json(&inc.stage);
        open.record.counters.intervals = intervals(inc.opened_at, closed_at);
        let id = open.record.id;
        if let Err(e) = self
            .store
            .close_incident(&mut open.record, unix_ns(closed_at))
        {
            tracing::error!(incident = id, error = %e, "closing the incident in the store failed");
        }
        let lasted = closed_at.duration_since(inc.opened_at).unwrap_or_default();
        tracing::info!(
            incident = id,
            service = %inc.service,
            lasted = %humantime::format_duration(Duration::from_secs(lasted.as_secs())),
            "incident closed"
        );
    }

    /// The open incidents, for the status report.
    pub(super) fn open_summaries(&self) -> Vec<OpenIncident> {
        let mut v: Vec<OpenIncident> = self
            .open
            .values()
            .map(|o| OpenIncident {
                id: o.record.id,
                service: o.record.service.clone(),
                probes: o.record.probes.clone(),
                opened_ns: o.record.opened_ns,
                headline: headline(&o.detail),
                stage: o.detail.stage.as_ref().map(|s| s.verdict.clone()),
            })
            .collect();
        v.sort_by_key(|o| o.id);
        v
    }

    /// Start the incident's pwru session when the configuration allows one; the outcome
    /// comes back through [`Incidents::pwru_finished`].
    pub(super) fn start_pwru(&mut self, service: &str, flows: &[Flow], config: &Config) {
        let Some(open) = self.open.get_mut(service) else {
            return;
        };
        let (record, inc) = (&mut open.record, &open.detail);
        Self::request_pwru(
            record,
            inc,
            flows,
            config,
            &self.manager,
            &self.store,
            &mut self.sessions,
            &self.pwru_done,
        );
        if let Err(e) = self.store.update_incident(record) {
            tracing::error!(incident = record.id, error = %e, "storing the incident's status failed");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn request_pwru(
        record: &mut storage::Incident,
        inc: &detector::Incident,
        flows: &[Flow],
        config: &Config,
        manager: &SessionManager,
        store: &Arc<Store>,
        sessions: &mut JoinSet<()>,
        pwru_done: &mpsc::Sender<Finished>,
    ) {
        if !config.pwru.enabled() {
            record.pwru.message = "pwru sessions are off ([pwru] enabled = false)".to_owned();
            return;
        }
        let spec = config
            .probes
            .services
            .iter()
            .find(|s| s.name == inc.service);
        let mut ports = spec.map(|s| s.ports.clone()).unwrap_or_default();
        if ports.is_empty() {
            // A service known by its cgroup alone: the local ports its slow samples hit.
            for f in flows {
                if f.dport != 0 && !ports.contains(&f.dport) && ports.len() < MAX_SAMPLE_PORTS {
                    ports.push(f.dport);
                }
            }
        }
        let filter = match PcapFilter::from_flows(
            protocol_of(&inc.probes),
            &ports,
            flows,
            config.pwru.max_peers(),
        ) {
            Ok(f) => f,
            Err(e) => {
                record.pwru.message =
                    format!("no session: {e} (no ports configured and no samples captured)");
                return;
            }
        };
        let mut request = SessionRequest::new(inc.service.clone(), filter.clone())
            .with_filter_funcs(config.pwru.filter_funcs(&inc.probes))
            .with_limits(config.pwru.limits());
        if let Some(ino) = spec
            .and_then(|s| s.cgroup.as_deref())
            .and_then(foreign_netns)
        {
            request = request.with_netns(NetnsFilter::inode(ino));
        }
        record.pwru.state = PwruState::Running;
        record.pwru.started_ns = Some(unix_ns(SystemTime::now()));
        record.pwru.message = format!("requested: {}", filter.expression());
        pwru::spawn(
            sessions,
            manager.clone(),
            store.clone(),
            record.id,
            request,
            pwru_done.clone(),
        );
    }

    /// A session ended: record its status with its incident (open or not).
    pub(super) fn pwru_finished(&mut self, done: Finished) {
        let status = pwru::status_of(&done.status, done.stored);
        tracing::info!(
            incident = done.incident,
            state = %done.status.state,
            lines = done.stored,
            reason = %done.status.reason,
            "pwru session ended"
        );
        self.update(done.incident, |record| {
            record.pwru = status;
            record.counters.store_errors += done.store_errors;
        });
    }

    /// Shutdown: stop a running session and record its outcome (waiting at most `wait`).
    pub(super) async fn stop_pwru(&mut self, done: &mut mpsc::Receiver<Finished>, wait: Duration) {
        if self.manager.stop() {
            tracing::info!("stopping the running pwru session");
        }
        let sessions = &mut self.sessions;
        let joined = tokio::time::timeout(wait, async {
            while sessions.join_next().await.is_some() {}
        })
        .await;
        if joined.is_err() {
            tracing::warn!("a pwru session did not end in time; its status stays `running`");
        }
        while let Ok(d) = done.try_recv() {
            self.pwru_finished(d);
        }
    }

    /// Shutdown: incidents still open end as interrupted at `now_ns` (monitoring stopped,
    /// not the anomaly).
    pub(super) fn interrupt_open(&mut self, now_ns: u64) {
        for (_, mut open) in self.open.drain() {
            open.record.state = IncidentState::Interrupted;
            open.record.closed_ns = Some(now_ns);
            if let Err(e) = self.store.update_incident(&open.record) {
                tracing::error!(incident = open.record.id, error = %e, "marking the incident interrupted failed");
            } else {
                tracing::info!(incident = open.record.id, service = %open.record.service, "incident interrupted by the stop");
            }
        }
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    // The detector's types are plain data: encoding them cannot fail.
    serde_json::to_string(v).unwrap_or_default()
}

fn probe_list(probes: &[Probe]) -> String {
    probes
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(",")
}

/// `tcp-socket-read p99 120µs -> 21.0ms (175x)`.
pub(crate) fn headline(inc: &detector::Incident) -> String {
    let h = &inc.headline;
    format!(
        "{} {} {} -> {} ({:.1}x)",
        h.probe,
        quantile_name(h.quantile),
        crate::output::fmt_ns(h.baseline.value_ns),
        crate::output::fmt_ns(h.observed.value_ns),
        h.ratio
    )
}

/// `p99`, `p99.9`, `p50`.
pub(crate) fn quantile_name(q: f64) -> String {
    let pct = q * 100.0;
    // Round away float noise (0.999 * 100 = 99.899999...).
    let pct = (pct * 1000.0).round() / 1000.0;
    format!("p{pct}")
}

fn stage(inc: &detector::Incident) -> String {
    inc.stage
        .as_ref()
        .map_or_else(|| "-".to_owned(), |s| s.verdict.clone())
}

fn intervals(opened: SystemTime, closed: SystemTime) -> u64 {
    closed.duration_since(opened).map_or(0, |d| d.as_secs())
}

/// TCP unless every hot probe is on the UDP path.
fn protocol_of(probes: &[Probe]) -> Protocol {
    let udp = |p: &Probe| {
        matches!(
            p,
            Probe::UdpStart | Probe::UdpSocketEnqueued | Probe::UdpSocketRead
        )
    };
    if probes.iter().any(udp) && !probes.iter().any(|p| !udp(p) && *p != Probe::IpStart) {
        Protocol::Udp
    } else {
        Protocol::Tcp
    }
}

/// The network namespace inode of the first process in `cgroup` (relative to the cgroup2
/// mount), when it differs from the daemon's own.
fn foreign_netns(cgroup: &Path) -> Option<u32> {
    let dir = cgroup2_mount()?.join(cgroup.strip_prefix("/").unwrap_or(cgroup));
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    let pid: u32 = procs.lines().next()?.trim().parse().ok()?;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok()?.ino();
    let ours = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
    (theirs != ours).then(|| u32::try_from(theirs).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_follows_the_hot_probes() {
        assert_eq!(protocol_of(&[Probe::UdpSocketRead]), Protocol::Udp);
        assert_eq!(
            protocol_of(&[Probe::IpStart, Probe::UdpStart]),
            Protocol::Udp
        );
        assert_eq!(protocol_of(&[Probe::TcpSocketRead]), Protocol::Tcp);
        assert_eq!(protocol_of(&[Probe::IpStart]), Protocol::Tcp);
        assert_eq!(
            protocol_of(&[Probe::UdpStart, Probe::TcpStart]),
            Protocol::Tcp
        );
    }

    #[test]
    fn quantile_names() {
        assert_eq!(quantile_name(0.99), "p99");
        assert_eq!(quantile_name(0.999), "p99.9");
        assert_eq!(quantile_name(0.5), "p50");
    }

    #[test]
    fn own_namespace_is_not_foreign() {
        // The root cgroup holds processes of the host namespace (or none at all).
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let rel = own.trim().rsplit("::").next().unwrap_or("/").to_owned();
        assert_eq!(foreign_netns(Path::new(&rel)), None);
    }
}
