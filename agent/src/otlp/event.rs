//! What one incident event says, as plain data: built on the interval loop from the
//! incident's record (and the detector's view while it is open), turned into an OTLP log
//! record only by the exporter's task.

use std::time::SystemTime;

use model::unix_ns;
use storage::{IncidentState, PwruState};

use model::quantile_name;

/// Why an event is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The incident opened.
    Opened,
    /// Its stage verdict or its set of hot probes changed.
    Changed,
    /// It closed (recovered, new normal) or was interrupted by the daemon's stop.
    Closed,
    /// Its pwru session ended (or was skipped).
    PwruEnded,
}

impl EventKind {
    /// The log record's event name.
    pub fn event_name(self) -> &'static str {
        match self {
            EventKind::Opened => "tailtrap.incident.opened",
            EventKind::Changed => "tailtrap.incident.changed",
            EventKind::Closed => "tailtrap.incident.closed",
            EventKind::PwruEnded => "tailtrap.incident.pwru_ended",
        }
    }

    /// A short word for the event id.
    fn word(self) -> &'static str {
        match self {
            EventKind::Opened => "opened",
            EventKind::Changed => "changed",
            EventKind::Closed => "closed",
            EventKind::PwruEnded => "pwru-ended",
        }
    }
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A list of strings.
    List(Vec<String>),
}

/// One event about one incident.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// When, ns since the epoch (the incident's own time: opened, closed, session end).
    pub time_ns: u64,
    /// Stable across retries and restarts of the export: `<host id>/<incident>/<kind>/<time>`.
    pub id: String,
    /// One line for people.
    pub body: String,
    /// `tailtrap.*` attributes.
    pub attributes: Vec<(&'static str, Value)>,
}

impl Event {
    /// The event `kind` of `record`, with the detector's view when the incident is open
    /// (else the evidence stored with the record). `host_id` makes the id unique in a fleet.
    pub fn new(
        kind: EventKind,
        record: &storage::Incident,
        detail: Option<&detector::Incident>,
        host_id: &str,
        now: SystemTime,
    ) -> Event {
        let stored;
        let detail = match detail {
            Some(d) => Some(d),
            None => {
                stored = serde_json::from_str::<detector::Incident>(&record.evidence_json).ok();
                stored.as_ref()
            }
        };
        let time_ns = match kind {
            EventKind::Opened => record.opened_ns,
            EventKind::Closed => record.closed_ns.unwrap_or_else(|| unix_ns(now)),
            EventKind::Changed => detail.map_or_else(|| unix_ns(now), |d| unix_ns(d.updated_at)),
            EventKind::PwruEnded => record.pwru.ended_ns.unwrap_or_else(|| unix_ns(now)),
        };
        let id = format!("{host_id}/{}/{}/{time_ns}", record.id, kind.word());
        let mut a: Vec<(&'static str, Value)> = vec![
            ("tailtrap.event.id", Value::Str(id.clone())),
            ("tailtrap.incident.id", Value::Int(int(record.id))),
            ("tailtrap.incident.state", Value::Str(state(record.state))),
            ("tailtrap.service", Value::Str(record.service.clone())),
            (
                "tailtrap.probes",
                Value::List(record.probes.iter().map(|p| p.name().to_owned()).collect()),
            ),
            (
                "tailtrap.incident.opened_at",
                Value::Str(crate::output::fmt_time(record.opened_ns)),
            ),
            (
                "tailtrap.evidence",
                Value::Str(format!(
                    "tailtrap export {} (on this host; `tailtrap incidents show {}` for a summary)",
                    record.id, record.id
                )),
            ),
        ];
        let mut body = format!("incident {} on {}", record.id, record.service);
        if let Some(d) = detail {
            let h = &d.headline;
            let stage = d.stage.as_ref().map(|s| s.verdict.clone());
            a.extend([
                ("tailtrap.headline", Value::Str(d.headline.describe())),
                ("tailtrap.probe", Value::Str(h.probe.name().to_owned())),
                ("tailtrap.quantile", Value::Str(quantile_name(h.quantile))),
                (
                    "tailtrap.latency.baseline_ns",
                    Value::Float(h.baseline.value_ns),
                ),
                (
                    "tailtrap.latency.observed_ns",
                    Value::Float(h.observed.value_ns),
                ),
                ("tailtrap.latency.ratio", Value::Float(h.ratio)),
                ("tailtrap.window.samples", Value::Int(int(h.window_samples))),
            ]);
            if let Some(s) = &stage {
                a.push(("tailtrap.stage", Value::Str(s.clone())));
            }
            body = format!(
                "{body}: {}{}",
                d.headline.describe(),
                stage.map(|s| format!(", {s}")).unwrap_or_default()
            );
        }
        let c = &record.capture;
        a.extend([
            (
                "tailtrap.capture.state",
                Value::Str(format!("{:?}", c.state).to_lowercase()),
            ),
            ("tailtrap.capture.emitted", Value::Int(int(c.emitted))),
            ("tailtrap.capture.stored", Value::Int(int(c.stored))),
            ("tailtrap.capture.dropped", Value::Int(int(c.dropped))),
            (
                "tailtrap.capture.rate_limited",
                Value::Int(int(c.rate_limited)),
            ),
        ]);
        match kind {
            EventKind::Opened => body = format!("opened {body}"),
            EventKind::Changed => body = format!("changed {body}"),
            EventKind::Closed => {
                let lasted = record
                    .closed_ns
                    .unwrap_or(time_ns)
                    .saturating_sub(record.opened_ns);
                a.push((
                    "tailtrap.incident.duration_s",
                    Value::Float(lasted as f64 / 1e9),
                ));
                if let Some(why) = detail.and_then(|d| d.close_reason) {
                    let why = serde_json::to_value(why)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    a.push(("tailtrap.incident.close_reason", Value::Str(why)));
                }
                let verb = if record.state == IncidentState::Interrupted {
                    "interrupted"
                } else {
                    "closed"
                };
                body = format!("{verb} {body}");
            }
            EventKind::PwruEnded => {
                let p = &record.pwru;
                a.extend([
                    ("tailtrap.pwru.state", Value::Str(pwru_state(p.state))),
                    ("tailtrap.pwru.lines", Value::Int(int(p.lines_stored))),
                    ("tailtrap.pwru.message", Value::Str(p.message.clone())),
                ]);
                body = format!(
                    "pwru session {} for {body} ({} lines)",
                    pwru_state(p.state),
                    p.lines_stored
                );
            }
        }
        Event {
            kind,
            time_ns,
            id,
            body,
            attributes: a,
        }
    }
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn state(s: IncidentState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{s:?}").to_lowercase())
}

fn pwru_state(s: PwruState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{s:?}").to_lowercase())
}
