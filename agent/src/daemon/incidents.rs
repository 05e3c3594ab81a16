//! The incidents' records in the store: opened, updated and closed as the detector says,
//! changed as capture and pwru report, and found again by the detector's identity of an
//! incident (never by its service alone).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use detector::IncidentKey;
use storage::{CaptureState, IncidentState, NewIncident, PwruState, Store};

use super::writer::{self, FlushSoon, SampleQueue};
use crate::api::OpenIncident;
use crate::otlp::{Event, EventKind, Outbox};
use model::unix_ns;

/// Closed records kept for the changes that still come after closing (pwru's and
/// capture's outcome), so that a change starts from the loop's own copy rather than from a
/// store that may not have written the close yet. When an incident closes, the records
/// nothing changes any more (see [`can_forget`]) go, so the list does not grow with every
/// incident of a long run; at most this many stay.
const RECENTLY_CLOSED: usize = 64;

/// How long a settled closed record stays: changes to it may still wait in the sample
/// thread's queue (about a minute of capture) and the close itself in the flush thread's.
const CLOSED_GRACE: Duration = Duration::from_secs(120);

/// Nothing will change a closed record any more: its capture is not armed, no pwru
/// session runs or waits for it, and it closed [`CLOSED_GRACE`] before `now_ns`.
fn can_forget(record: &storage::Incident, now_ns: u64) -> bool {
    let grace = u64::try_from(CLOSED_GRACE.as_nanos()).unwrap_or(u64::MAX);
    record.capture.state != CaptureState::Armed
        && record.pwru.state != PwruState::Running
        && record
            .closed_ns
            .is_some_and(|closed| now_ns.saturating_sub(closed) >= grace)
}

/// The open incidents, by the detector's key.
pub(super) struct Incidents {
    store: Arc<Store>,
    /// Opening and closing are made durable by the flush thread, not on the loop.
    flush: FlushSoon,
    /// Changed records go to the store through the sample thread.
    records: SampleQueue,
    open: HashMap<IncidentKey, Open>,
    closed: VecDeque<storage::Incident>,
    /// Where incident events go when `[otlp]` is on.
    outbox: Option<Outbox>,
}

struct Open {
    record: storage::Incident,
    detail: detector::Incident,
}

impl Incidents {
    pub(super) fn new(store: Arc<Store>, flush: FlushSoon, records: SampleQueue) -> Incidents {
        Incidents {
            store,
            flush,
            records,
            open: HashMap::new(),
            closed: VecDeque::new(),
            outbox: None,
        }
    }

    /// Send incident events to `outbox` from now on.
    pub(super) fn set_outbox(&mut self, outbox: Outbox) {
        self.outbox = Some(outbox);
    }

    /// Tell the fleet (OTLP), when configured: the queue takes it without waiting.
    fn announce(
        outbox: Option<&Outbox>,
        kind: EventKind,
        record: &storage::Incident,
        detail: Option<&detector::Incident>,
    ) {
        if let Some(o) = outbox {
            o.send(Event::new(
                kind,
                record,
                detail,
                o.host_id(),
                SystemTime::now(),
            ));
        }
    }

    /// A pwru session of incident `id` ended (or will not run): say so with its outcome,
    /// as its record now has it.
    pub(super) fn pwru_ended(&self, id: u64) {
        let Some(outbox) = &self.outbox else {
            return;
        };
        if let Some(o) = self.open.values().find(|o| o.record.id == id) {
            Self::announce(
                Some(outbox),
                EventKind::PwruEnded,
                &o.record,
                Some(&o.detail),
            );
        } else if let Some(r) = self.closed.iter().find(|r| r.id == id) {
            Self::announce(Some(outbox), EventKind::PwruEnded, r, None);
        }
    }

    /// Store a changed record through the sample thread, or here when it cannot take it.
    fn write(&self, record: storage::Incident, durable: bool) {
        if let Err(record) = self.records.record(Box::new(record), durable) {
            writer::store_record(&self.store, &record, false);
            if durable {
                self.flush.request();
            }
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
        // Numbered here without waiting on the store (an engine reopen holds it for tens
        // of ms); the record is stored by the sample thread ahead of the incident's samples.
        let record = match self.store.number_incident(&new) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(service = %inc.service, error = %e, "incident opened but could not be stored");
                return None;
            }
        };
        if let Err(record) = self.records.new_record(Box::new(record.clone())) {
            writer::store_record(&self.store, &record, true);
            self.flush.request();
        }
        tracing::info!(
            incident = record.id,
            service = %inc.service,
            probes = %model::Probe::names(&inc.probes),
            headline = %inc.headline.describe(),
            stage = %inc.stage_name(),
            "incident opened"
        );
        Self::announce(self.outbox.as_ref(), EventKind::Opened, &record, Some(&inc));
        let id = record.id;
        self.open.insert(
            inc.key(),
            Open {
                record,
                detail: inc,
            },
        );
        Some(id)
    }

    /// Store a new incident the detector did not open (a host-wide one): numbered and
    /// written durably; its record, unless the store refused it.
    pub(super) fn open_other(&mut self, new: NewIncident) -> Option<storage::Incident> {
        let record = match self.store.number_incident(&new) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(service = %new.service, error = %e, "incident opened but could not be stored");
                return None;
            }
        };
        if let Err(record) = self.records.new_record(Box::new(record.clone())) {
            writer::store_record(&self.store, &record, true);
            self.flush.request();
        }
        Self::announce(self.outbox.as_ref(), EventKind::Opened, &record, None);
        Some(record)
    }

    /// Shutdown: an incident the detector did not open, still open, ends interrupted.
    pub(super) fn interrupt_other(&self, mut record: storage::Incident, now_ns: u64) {
        record.state = IncidentState::Interrupted;
        record.closed_ns = Some(now_ns);
        Self::announce(self.outbox.as_ref(), EventKind::Closed, &record, None);
        if let Err(e) = self.store.update_incident(&record) {
            tracing::error!(incident = record.id, error = %e, "marking the incident interrupted failed");
        }
    }

    /// Store a changed record of an incident the detector did not open; the fleet hears of
    /// its closing as of any other incident's.
    pub(super) fn write_other(&self, record: storage::Incident) {
        let durable = record.state != IncidentState::Open;
        if record.state == IncidentState::Closed {
            Self::announce(self.outbox.as_ref(), EventKind::Closed, &record, None);
        }
        self.write(record, durable);
    }

    /// The detector's view of an open incident, by store id.
    pub(super) fn open_detail(&self, id: u64) -> Option<&detector::Incident> {
        self.open
            .values()
            .find(|o| o.record.id == id)
            .map(|o| &o.detail)
    }

    /// The store id of an open incident.
    pub(super) fn id_of(&self, key: &IncidentKey) -> Option<u64> {
        self.open.get(key).map(|o| o.record.id)
    }

    /// Change an incident's record (open or already closed) and store it.
    pub(super) fn update(&mut self, id: u64, f: impl FnOnce(&mut storage::Incident)) {
        let mut loaded;
        let record = if let Some(o) = self.open.values_mut().find(|o| o.record.id == id) {
            &mut o.record
        } else if let Some(r) = self.closed.iter_mut().find(|r| r.id == id) {
            r
        } else {
            // Closed long ago: every change of it was written by now.
            match self.store.incident(id) {
                Ok(Some(r)) => {
                    loaded = r;
                    &mut loaded
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(incident = id, error = %e, "reading the incident failed");
                    return;
                }
            }
        };
        f(record);
        let record = record.clone();
        self.write(record, false);
    }

    /// Incident `id`'s cause verdict, decided now.
    pub(super) fn set_cause(&mut self, id: u64, cause: storage::IncidentCause) {
        self.update(id, |r| r.cause = Some(cause));
    }

    /// The service of open incident `id`.
    pub(super) fn service_of(&self, id: u64) -> Option<String> {
        self.open
            .values()
            .find(|o| o.record.id == id)
            .map(|o| o.record.service.clone())
    }

    /// Let go of the closed records nothing changes any more.
    fn forget_settled(&mut self) {
        let now_ns = unix_ns(SystemTime::now());
        self.closed.retain(|r| !can_forget(r, now_ns));
    }

    /// More probes or a stronger shift: the record follows.
    pub(super) fn updated(&mut self, inc: detector::Incident) {
        let Some(open) = self.open.get_mut(&inc.key()) else {
            return;
        };
        // The fleet hears of a new verdict or a new hot probe, not of every stronger figure.
        let changed = open.record.probes != inc.probes
            || open.detail.stage.as_ref().map(|s| &s.verdict)
                != inc.stage.as_ref().map(|s| &s.verdict);
        open.record.probes = inc.probes.clone();
        open.record.evidence_json = json(&inc);
        open.record.stages_json = json(&inc.stage);
        let record = open.record.clone();
        tracing::info!(
            incident = record.id,
            service = %inc.service,
            probes = %model::Probe::names(&inc.probes),
            headline = %inc.headline.describe(),
            "incident updated"
        );
        if changed {
            Self::announce(
                self.outbox.as_ref(),
                EventKind::Changed,
                &record,
                Some(&inc),
            );
        }
        open.detail = inc;
        self.write(record, false);
    }

    /// The detector closed it: close the record.
    pub(super) fn closed(&mut self, inc: detector::Incident) {
        let Some(mut open) = self.open.remove(&inc.key()) else {
            return;
        };
        let closed_at = inc.closed_at.unwrap_or_else(SystemTime::now);
        open.record.probes = inc.probes.clone();
        open.record.evidence_json = json(&inc);
        open.record.stages_json = json(&inc.stage);
        open.record.counters.intervals = intervals(inc.opened_at, closed_at);
        let id = open.record.id;
        open.record.state = IncidentState::Closed;
        open.record.closed_ns = Some(unix_ns(closed_at));
        self.write(open.record.clone(), true);
        Self::announce(
            self.outbox.as_ref(),
            EventKind::Closed,
            &open.record,
            Some(&inc),
        );
        self.forget_settled();
        if self.closed.len() == RECENTLY_CLOSED {
            self.closed.pop_front();
        }
        self.closed.push_back(open.record);
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
                headline: o.detail.headline.describe(),
                stage: o.detail.stage.as_ref().map(|s| s.verdict.clone()),
                cause: o.record.cause.as_ref().map(|c| c.kind.clone()),
                cause_summary: o.record.cause.as_ref().map(|c| c.summary.clone()),
                part_of: None,
            })
            .collect();
        v.sort_by_key(|o| o.id);
        v
    }

    /// Shutdown: incidents still open end as interrupted at `now_ns` (monitoring stopped,
    /// not the anomaly).
    pub(super) fn interrupt_open(&mut self, now_ns: u64) {
        for (_, mut open) in self.open.drain() {
            open.record.state = IncidentState::Interrupted;
            open.record.closed_ns = Some(now_ns);
            Self::announce(
                self.outbox.as_ref(),
                EventKind::Closed,
                &open.record,
                Some(&open.detail),
            );
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

fn intervals(opened: SystemTime, closed: SystemTime) -> u64 {
    closed.duration_since(opened).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000_000;

    fn closed_at(closed_ns: u64) -> storage::Incident {
        crate::fixtures::closed_incident(1, Vec::new(), 0, closed_ns)
    }

    #[test]
    fn a_closed_record_is_forgotten_only_when_settled_and_past_the_grace() {
        let now = 100 * MIN;
        let mut r = closed_at(now - 3 * MIN);
        assert!(can_forget(&r, now));
        // Closed a minute ago: changes may still be queued for it.
        assert!(!can_forget(&closed_at(now - MIN), now));
        // Capture still armed, or a pwru session running or waiting: more changes come.
        r.capture.state = CaptureState::Armed;
        assert!(!can_forget(&r, now));
        r.capture.state = CaptureState::Disarmed;
        r.pwru.state = PwruState::Running;
        assert!(!can_forget(&r, now));
        r.pwru.state = PwruState::Done;
        assert!(can_forget(&r, now));
        // Never closed (an interrupted record has a time; one without is kept).
        r.closed_ns = None;
        assert!(!can_forget(&r, now));
    }
}
