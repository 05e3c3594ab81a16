//! Incidents to OpenTelemetry (`[otlp]`): each opening, change of stage or probes, closing
//! and pwru session end goes to a collector as an OTLP log record, so a fleet's incidents
//! land where its operators already look. Off by default; docs/operations.md ("OpenTelemetry").
//!
//! The interval loop only pushes an [`Event`] into a bounded in-memory queue (a short
//! mutex, never I/O). A task of its own exports from the queue's front, in order, with the
//! OpenTelemetry project's OTLP exporter; an event leaves the queue only once the collector
//! accepted it, so a collector that is down or slow costs the loop nothing, and events wait
//! for it. When the queue is full, the oldest event is dropped and counted. Delivery is at
//! least once: an export whose answer was lost is sent again, with the same
//! `tailtrap.event.id` to deduplicate on. Everything stays in the local store regardless.

mod config;
mod event;
mod transport;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub use config::OtlpConfig;
pub use event::{Event, EventKind};

/// Events per export request: a burst (a host-wide slowdown opening one incident per
/// service) goes in a few requests, and a request stays far below collectors' size limits.
const MAX_BATCH: usize = 128;
/// The wait after a failed export doubles from this...
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// ...up to this.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What `tailtrap status` and `/metrics` show of the export.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OtlpReport {
    /// Where records go (the URL exported to).
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    pub protocol: String,
    /// Events waiting for the collector.
    pub queued: u64,
    /// `otlp.queue_size`.
    pub capacity: u64,
    /// Events the collector accepted since start.
    pub sent: u64,
    /// Events dropped, oldest first, because the queue was full.
    pub dropped: u64,
    /// Export requests that failed (refused, timed out, TLS, rejected).
    pub failed_exports: u64,
    /// Since when every export failed, ns since the epoch; `None` while exports succeed.
    pub failing_since_ns: Option<u64>,
    /// The latest failure's error.
    pub last_error: Option<String>,
    /// When the collector last accepted events, ns since the epoch.
    pub last_sent_ns: Option<u64>,
}

/// One queued event with its place in the sequence (which survives drops at the front).
struct Queued {
    seq: u64,
    /// When it was queued, for the record's observed time.
    queued_at: SystemTime,
    event: Event,
}

#[derive(Default)]
struct Queue {
    events: VecDeque<Queued>,
    next_seq: u64,
    capacity: usize,
}

/// State shared by the loop's [`Outbox`] and the export task.
struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    stopping: AtomicBool,
    report: Mutex<OtlpReport>,
    /// Names this host in event ids (`host.id`).
    host_id: String,
}

/// Where the interval loop puts events; cheap to clone, never blocks on the network.
#[derive(Clone)]
pub struct Outbox {
    shared: Arc<Shared>,
}

impl Outbox {
    /// The host's id, for [`Event::new`].
    pub fn host_id(&self) -> &str {
        &self.shared.host_id
    }

    /// Queue `event`; when the queue is full the oldest waiting event is dropped.
    pub fn send(&self, event: Event) {
        let mut dropped = false;
        {
            let mut q = lock(&self.shared.queue);
            if q.events.len() >= q.capacity {
                q.events.pop_front();
                dropped = true;
            }
            let seq = q.next_seq;
            q.next_seq += 1;
            q.events.push_back(Queued {
                seq,
                queued_at: SystemTime::now(),
                event,
            });
        }
        if dropped {
            let mut r = lock(&self.shared.report);
            r.dropped += 1;
            // The first drop, then one line per 1000 while exports keep failing.
            if r.dropped == 1 || r.failing_since_ns.is_some() && r.dropped % 1000 == 1 {
                tracing::warn!(
                    dropped = r.dropped,
                    capacity = r.capacity,
                    "the OTLP queue is full: the oldest incident events are dropped (they \
                     stay in the local store); raise otlp.queue_size or fix the collector"
                );
            }
        }
        self.shared.wake.notify_one();
    }

    /// An outbox with no export task behind it: the daemon loop's tests read what it was
    /// given with [`Outbox::take_all`].
    #[cfg(test)]
    pub fn detached(capacity: usize) -> Outbox {
        Outbox {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    capacity,
                    ..Queue::default()
                }),
                wake: Notify::new(),
                stopping: AtomicBool::new(false),
                report: Mutex::new(OtlpReport {
                    capacity: capacity as u64,
                    ..OtlpReport::default()
                }),
                host_id: "test-host".into(),
            }),
        }
    }

    /// Everything queued, in order, emptying the queue.
    #[cfg(test)]
    pub fn take_all(&self) -> Vec<Event> {
        lock(&self.shared.queue)
            .events
            .drain(..)
            .map(|q| q.event)
            .collect()
    }

    /// The export's figures now.
    pub fn report(&self) -> OtlpReport {
        let queued = lock(&self.shared.queue).events.len() as u64;
        let mut r = lock(&self.shared.report).clone();
        r.queued = queued;
        r
    }
}

/// The export task and its outbox.
pub struct Exporter {
    outbox: Outbox,
    task: tokio::task::JoinHandle<()>,
}

impl Exporter {
    /// Build the exporter for `config` and start its task (on the current tokio runtime).
    /// Fails only for what the configuration check could not see (e.g. a certificate
    /// rustls refuses); an unreachable collector is a runtime failure, counted.
    pub fn start(config: &OtlpConfig) -> anyhow::Result<Exporter> {
        let host = transport::HostFacts::read();
        let transport = transport::Transport::new(config, &host)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                capacity: config.queue_size,
                ..Queue::default()
            }),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            report: Mutex::new(OtlpReport {
                endpoint: config.export_url(),
                protocol: config.protocol.name().to_owned(),
                capacity: config.queue_size as u64,
                ..OtlpReport::default()
            }),
            host_id: host.host_id.clone(),
        });
        tracing::info!(
            endpoint = %config.export_url(),
            protocol = config.protocol.name(),
            host_id = %host.host_id,
            "incidents are exported over OTLP"
        );
        let task = tokio::spawn(run(shared.clone(), transport));
        Ok(Exporter {
            outbox: Outbox { shared },
            task,
        })
    }

    /// Where the loop puts events.
    pub fn outbox(&self) -> Outbox {
        self.outbox.clone()
    }

    /// Send what is queued for at most `wait` (the last events of a stop: incidents
    /// interrupted), then stop; what is still queued then is left to the local store.
    pub async fn stop(self, wait: Duration) {
        self.outbox.shared.stopping.store(true, Ordering::SeqCst);
        self.outbox.shared.wake.notify_one();
        let mut task = self.task;
        if tokio::time::timeout(wait, &mut task).await.is_err() {
            task.abort();
            let left = lock(&self.outbox.shared.queue).events.len();
            if left > 0 {
                tracing::warn!(
                    events = left,
                    "stopping with incident events the collector has not taken (they stay in the local store)"
                );
            }
        }
    }
}

/// The export task: the queue's front, in order, until told to stop.
async fn run(shared: Arc<Shared>, mut transport: transport::Transport) {
    let mut retry = RETRY_FIRST;
    loop {
        let batch: Vec<(u64, SystemTime, Event)> = {
            let q = lock(&shared.queue);
            q.events
                .iter()
                .take(MAX_BATCH)
                .map(|e| (e.seq, e.queued_at, e.event.clone()))
                .collect()
        };
        let stopping = shared.stopping.load(Ordering::SeqCst);
        let Some(&(last_seq, _, _)) = batch.last() else {
            if stopping {
                return;
            }
            shared.wake.notified().await;
            continue;
        };
        match transport.export(&batch).await {
            Ok(()) => {
                let n = {
                    let mut q = lock(&shared.queue);
                    // The front may have been dropped meanwhile (queue full): remove up to
                    // the last event sent, whatever is left of the batch.
                    let before = q.events.len();
                    while q.events.front().is_some_and(|e| e.seq <= last_seq) {
                        q.events.pop_front();
                    }
                    before - q.events.len()
                };
                let mut r = lock(&shared.report);
                r.sent += batch.len() as u64;
                r.last_sent_ns = Some(model::unix_ns(SystemTime::now()));
                if let Some(since) = r.failing_since_ns.take() {
                    tracing::info!(
                        failed_for = %humantime::format_duration(Duration::from_secs(
                            model::unix_ns(SystemTime::now()).saturating_sub(since) / 1_000_000_000
                        )),
                        "OTLP export works again: queued incident events are being sent"
                    );
                }
                tracing::debug!(events = batch.len(), removed = n, "OTLP export");
                retry = RETRY_FIRST;
            }
            Err(e) => {
                {
                    let mut r = lock(&shared.report);
                    r.failed_exports += 1;
                    r.last_error = Some(e.clone());
                    if r.failing_since_ns.is_none() {
                        r.failing_since_ns = Some(model::unix_ns(SystemTime::now()));
                        tracing::warn!(
                            endpoint = %r.endpoint,
                            error = %e,
                            "OTLP export failing: incident events wait in the queue and are \
                             retried (logged again when it works)"
                        );
                    } else {
                        tracing::debug!(error = %e, "OTLP export failed again");
                    }
                }
                if stopping {
                    return;
                }
                // Wait before retrying, but not through a stop.
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = async {
                        while !shared.stopping.load(Ordering::SeqCst) {
                            shared.wake.notified().await;
                        }
                    } => {}
                }
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain queue and figures: keep using them after a panic elsewhere.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(capacity: usize) -> Outbox {
        Outbox::detached(capacity)
    }

    fn event(n: u64) -> Event {
        Event {
            kind: EventKind::Opened,
            time_ns: n,
            id: format!("h/{n}/opened/{n}"),
            body: String::new(),
            attributes: Vec::new(),
        }
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts_it() {
        let o = outbox(3);
        for n in 0..5 {
            o.send(event(n));
        }
        let kept: Vec<u64> = lock(&o.shared.queue)
            .events
            .iter()
            .map(|e| e.event.time_ns)
            .collect();
        assert_eq!(kept, [2, 3, 4]);
        let r = o.report();
        assert_eq!((r.queued, r.dropped, r.capacity), (3, 2, 3));
    }

    #[test]
    fn events_of_one_incident_have_stable_distinct_ids() {
        let record = crate::fixtures::closed_incident(
            7,
            vec![model::Probe::TcpSocketRead],
            1_000,
            5_000_000_000,
        );
        let now = SystemTime::now();
        let opened = Event::new(EventKind::Opened, &record, None, "m", now);
        let closed = Event::new(EventKind::Closed, &record, None, "m", now);
        assert_eq!(opened.id, "m/7/opened/1000");
        assert_eq!(closed.id, "m/7/closed/5000000000");
        // Built again later (a retry builds from the queue, but a rebuild must agree too).
        assert_eq!(
            Event::new(EventKind::Closed, &record, None, "m", SystemTime::now()).id,
            closed.id
        );
        let duration = closed
            .attributes
            .iter()
            .find(|(k, _)| *k == "tailtrap.incident.duration_s")
            .map(|(_, v)| v.clone());
        assert_eq!(duration, Some(event::Value::Float(5.0 - 1e-6)));
        assert!(
            closed.body.starts_with("closed incident 7 on web"),
            "{}",
            closed.body
        );
    }
}
