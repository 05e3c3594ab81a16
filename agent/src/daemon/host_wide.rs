//! One incident per host-wide cause. When incidents of several services open in the same
//! stage within a few seconds (a CPU-starved host, a softirq or NIC fault), the daemon opens
//! one more incident, of the service `host-wide`, that lists them; incidents of that stage
//! opening while it is open join it, and it closes when the last of them closes. The
//! per-service incidents stay as they are (their samples, pwru traces and verdicts are
//! theirs); status and `/metrics` mark them `part_of` the host-wide one, so the shipped alert
//! fires once for it rather than once per service. `host-wide` is a reserved service name,
//! distinct from `host` (the traffic of no declared service).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use model::Probe;
use serde::{Deserialize, Serialize};

use crate::api::OpenIncident;

/// The name of host-wide incidents' service.
pub(crate) const HOST_WIDE: &str = "host-wide";
/// Services whose incidents open in one stage within [`WITHIN`] that make a host-wide one.
const MIN_SERVICES: usize = 2;
/// How close together their openings must be.
const WITHIN: Duration = Duration::from_secs(5);

/// What a host-wide incident's `evidence_json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostWideEvidence {
    /// The stage the services' incidents share.
    pub stage: String,
    /// The per-service incidents, in the order they opened.
    pub members: Vec<Member>,
}

/// A per-service incident in a host-wide one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Member {
    /// Its id.
    pub id: u64,
    /// Its service.
    pub service: String,
    /// When it opened, ns since the epoch.
    pub opened_ns: u64,
    /// Whether it has closed.
    #[serde(default)]
    pub closed: bool,
}

struct Recent {
    member: Member,
    stage: String,
    probes: Vec<Probe>,
    at: Instant,
}

/// A host-wide incident while open: its record and members.
struct Group {
    record: storage::Incident,
    evidence: HostWideEvidence,
}

/// What the loop must store after a change.
pub(super) enum Change {
    /// Open this host-wide incident (to be numbered by the store), of these members.
    Open(storage::NewIncident),
    /// Store this host-wide record again (a member joined or closed; closed when all have).
    Write(Box<storage::Incident>),
}

/// Per-service incidents that opened lately, and the open host-wide incidents.
#[derive(Default)]
pub(super) struct HostWide {
    recent: VecDeque<Recent>,
    groups: Vec<Group>,
    /// The evidence of the one being opened, until the store numbered it.
    pending: Option<HostWideEvidence>,
}

impl HostWide {
    /// Incident `id` of `service` opened in `stage` (`None`: no stage was named, which
    /// joins nothing).
    pub(super) fn opened(
        &mut self,
        id: u64,
        service: &str,
        stage: Option<&str>,
        probes: &[Probe],
        opened_ns: u64,
        now: Instant,
    ) -> Option<Change> {
        let stage = stage?;
        if service == HOST_WIDE {
            return None;
        }
        let member = Member {
            id,
            service: service.to_owned(),
            opened_ns,
            closed: false,
        };
        if let Some(g) = self.groups.iter_mut().find(|g| g.evidence.stage == stage) {
            g.evidence.members.push(member);
            merge_probes(&mut g.record.probes, probes);
            g.record.evidence_json = json(&g.evidence);
            return Some(Change::Write(Box::new(g.record.clone())));
        }
        self.recent
            .retain(|r| now.saturating_duration_since(r.at) <= WITHIN);
        self.recent.push_back(Recent {
            member,
            stage: stage.to_owned(),
            probes: probes.to_vec(),
            at: now,
        });
        let same: Vec<&Recent> = self.recent.iter().filter(|r| r.stage == stage).collect();
        let mut services: Vec<&str> = same.iter().map(|r| r.member.service.as_str()).collect();
        services.sort_unstable();
        services.dedup();
        if services.len() < MIN_SERVICES {
            return None;
        }
        let mut probes = Vec::new();
        for r in &same {
            merge_probes(&mut probes, &r.probes);
        }
        let evidence = HostWideEvidence {
            stage: stage.to_owned(),
            members: same.iter().map(|r| r.member.clone()).collect(),
        };
        // It opens when it is recognised: with the incident that completes it (its members'
        // own openings are listed in its evidence), so the fleet's events stay in time order.
        self.recent.retain(|r| r.stage != stage);
        let new = storage::NewIncident {
            service: HOST_WIDE.to_owned(),
            probes,
            opened_ns,
            evidence_json: json(&evidence),
            stages_json: json(&stage),
        };
        self.pending = Some(evidence);
        Some(Change::Open(new))
    }

    /// The store numbered the host-wide incident [`Change::Open`] asked for.
    pub(super) fn numbered(&mut self, record: storage::Incident) {
        if let Some(evidence) = self.pending.take() {
            tracing::info!(
                incident = record.id,
                stage = %evidence.stage,
                services = %evidence.members.iter().map(|m| m.service.as_str()).collect::<Vec<_>>().join(","),
                "host-wide incident opened"
            );
            self.groups.push(Group { record, evidence });
        }
    }

    /// Incident `id` closed at `closed_ns`: its host-wide incident closes with its last
    /// member.
    pub(super) fn closed(&mut self, id: u64, closed_ns: u64) -> Option<Change> {
        self.recent.retain(|r| r.member.id != id);
        let at = self
            .groups
            .iter()
            .position(|g| g.evidence.members.iter().any(|m| m.id == id))?;
        let g = &mut self.groups[at];
        for m in g.evidence.members.iter_mut().filter(|m| m.id == id) {
            m.closed = true;
        }
        g.record.evidence_json = json(&g.evidence);
        if g.evidence.members.iter().all(|m| m.closed) {
            let mut g = self.groups.remove(at);
            g.record.state = storage::IncidentState::Closed;
            g.record.closed_ns = Some(closed_ns);
            g.record.counters.intervals = 0;
            tracing::info!(incident = g.record.id, "host-wide incident closed");
            return Some(Change::Write(Box::new(g.record)));
        }
        Some(Change::Write(Box::new(g.record.clone())))
    }

    /// Mark the open per-service incidents that are part of a host-wide one, and add the
    /// open host-wide incidents to `open`.
    pub(super) fn annotate(&self, open: &mut Vec<OpenIncident>) {
        for o in open.iter_mut() {
            o.part_of = self
                .groups
                .iter()
                .find(|g| g.evidence.members.iter().any(|m| m.id == o.id))
                .map(|g| g.record.id);
        }
        for g in &self.groups {
            let services: Vec<&str> = g
                .evidence
                .members
                .iter()
                .map(|m| m.service.as_str())
                .collect();
            open.push(OpenIncident {
                id: g.record.id,
                service: HOST_WIDE.to_owned(),
                probes: g.record.probes.clone(),
                opened_ns: g.record.opened_ns,
                headline: format!(
                    "{} services in {}: {}",
                    services.len(),
                    g.evidence.stage,
                    services.join(", ")
                ),
                stage: Some(g.evidence.stage.clone()),
                cause: None,
                cause_summary: None,
                part_of: None,
            });
        }
        open.sort_by_key(|o| o.id);
    }

    /// Open host-wide incidents' records (shutdown marks them interrupted).
    pub(super) fn take_open(&mut self) -> Vec<storage::Incident> {
        self.recent.clear();
        self.groups.drain(..).map(|g| g.record).collect()
    }
}

fn merge_probes(into: &mut Vec<Probe>, probes: &[Probe]) {
    for p in probes {
        if !into.contains(p) {
            into.push(*p);
        }
    }
    into.sort_unstable();
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(
        h: &mut HostWide,
        id: u64,
        service: &str,
        stage: &str,
        at: Instant,
    ) -> Option<Change> {
        h.opened(
            id,
            service,
            Some(stage),
            &[Probe::TcpSocketRead],
            id * 10,
            at,
        )
    }

    #[test]
    fn two_services_in_one_stage_within_seconds_make_one_host_wide_incident() {
        let t0 = Instant::now();
        let mut h = HostWide::default();
        assert!(opened(&mut h, 1, "web", "application read delay", t0).is_none());
        // Another stage, or the same service again: not host-wide.
        assert!(opened(&mut h, 2, "py", "IP layer", t0).is_none());
        let Some(Change::Open(new)) = opened(
            &mut h,
            3,
            "py",
            "application read delay",
            t0 + Duration::from_secs(2),
        ) else {
            panic!("no host-wide incident");
        };
        assert_eq!(new.service, HOST_WIDE);
        assert_eq!(
            new.opened_ns, 30,
            "opened with the incident that completed it"
        );
        let ev: HostWideEvidence = serde_json::from_str(&new.evidence_json).unwrap();
        assert_eq!(ev.members.iter().map(|m| m.id).collect::<Vec<_>>(), [1, 3]);
        let mut record = storage::Incident {
            id: 9,
            service: new.service,
            probes: new.probes,
            opened_ns: new.opened_ns,
            closed_ns: None,
            state: storage::IncidentState::Open,
            evidence_json: new.evidence_json,
            stages_json: new.stages_json,
            capture: Default::default(),
            pwru: Default::default(),
            counters: Default::default(),
            cause: None,
        };
        h.numbered(record.clone());
        // A third service joins the open one.
        let Some(Change::Write(r)) = opened(&mut h, 4, "db", "application read delay", t0) else {
            panic!("did not join");
        };
        record = *r;
        assert!(record.evidence_json.contains("\"db\""));
        // Status: members point at it, and it is listed.
        let mut open: Vec<OpenIncident> = [1u64, 3, 4]
            .iter()
            .map(|&id| OpenIncident {
                id,
                service: "s".into(),
                probes: vec![],
                opened_ns: 0,
                headline: String::new(),
                stage: None,
                cause: None,
                cause_summary: None,
                part_of: None,
            })
            .collect();
        h.annotate(&mut open);
        assert!(open
            .iter()
            .filter(|o| o.id != 9)
            .all(|o| o.part_of == Some(9)));
        let hw = open.iter().find(|o| o.id == 9).unwrap();
        assert_eq!(
            hw.headline,
            "3 services in application read delay: web, py, db"
        );
        // It closes with its last member.
        for id in [1, 3] {
            let Some(Change::Write(r)) = h.closed(id, 100) else {
                panic!()
            };
            assert_eq!(r.state, storage::IncidentState::Open);
        }
        let Some(Change::Write(r)) = h.closed(4, 100) else {
            panic!()
        };
        assert_eq!(r.state, storage::IncidentState::Closed);
        assert_eq!(r.closed_ns, Some(100));
        assert!(h.closed(2, 100).is_none());
    }

    #[test]
    fn openings_further_apart_than_the_window_stay_per_service() {
        let t0 = Instant::now();
        let mut h = HostWide::default();
        assert!(opened(&mut h, 1, "web", "IP layer", t0).is_none());
        assert!(opened(
            &mut h,
            2,
            "py",
            "IP layer",
            t0 + WITHIN + Duration::from_secs(1)
        )
        .is_none());
    }
}
