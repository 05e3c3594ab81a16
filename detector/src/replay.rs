//! The replay interchange format (JSON Lines, one interval of one (service, probe) per line)
//! and [`Replayer`], which feeds such a series through the same [`Detector`] API the daemon
//! uses. Format reference: docs/replay-format.md.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::engine::Detector;
use crate::event::{Event, Incident, Notice};
use model::hist::Histogram;
use model::Probe;

/// One line of a replay file: the histogram of one (service, probe) over one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// End of the interval.
    pub ts: SystemTime,
    /// Service name.
    pub service: String,
    /// Probe.
    pub probe: Probe,
    /// Length of the interval, ms (informational; the detector times windows by `ts`).
    pub interval_ms: u64,
    /// The interval's latency histogram.
    pub hist: Histogram,
}

/// Why a line was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not JSON, a missing or unknown field, or a field of the wrong type.
    #[error("{0}")]
    Json(String),
    /// `ts` is not an RFC 3339 time.
    #[error("ts {ts:?} is not an RFC 3339 time: {reason}")]
    Time {
        /// The text given.
        ts: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `service` is empty.
    #[error("service is empty")]
    EmptyService,
    /// `probe` names no probe.
    #[error("{0}")]
    Probe(String),
    /// `interval_ms` is 0.
    #[error("interval_ms must be at least 1")]
    ZeroInterval,
    /// Buckets or count are inconsistent.
    #[error(transparent)]
    Histogram(#[from] model::hist::HistError),
    /// The line's time is before the previous line's.
    #[error("ts {ts} is before the previous line's {previous}: lines must be in time order")]
    OutOfOrder {
        /// This line's time.
        ts: String,
        /// The previous line's time.
        previous: String,
    },
    /// The same (service, probe) appears twice with the same `ts`.
    #[error("{service}/{probe} appears twice at {ts}")]
    Duplicate {
        /// Service.
        service: String,
        /// Probe.
        probe: Probe,
        /// Time.
        ts: String,
    },
}

/// Wire form of a line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    ts: String,
    service: String,
    probe: String,
    interval_ms: u64,
    buckets: Vec<(u64, u64)>,
    count: u64,
    sum_ns: u64,
}

impl Record {
    /// Parse and check one line.
    pub fn parse(line: &str) -> Result<Record, RecordError> {
        let l: Line = serde_json::from_str(line).map_err(|e| RecordError::Json(e.to_string()))?;
        let ts = parse_rfc3339(&l.ts).map_err(|reason| RecordError::Time {
            ts: l.ts.clone(),
            reason,
        })?;
        if l.service.is_empty() {
            return Err(RecordError::EmptyService);
        }
        let probe: Probe = l.probe.parse().map_err(RecordError::Probe)?;
        if l.interval_ms == 0 {
            return Err(RecordError::ZeroInterval);
        }
        let hist = Histogram::from_sparse(l.buckets, l.count, l.sum_ns)?;
        Ok(Record {
            ts,
            service: l.service,
            probe,
            interval_ms: l.interval_ms,
            hist,
        })
    }

    /// The record as one JSON line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        let line = Line {
            ts: format_time(self.ts),
            service: self.service.clone(),
            probe: self.probe.name().to_string(),
            interval_ms: self.interval_ms,
            buckets: self.hist.nonzero().map(|(i, c)| (i as u64, c)).collect(),
            count: self.hist.count(),
            sum_ns: self.hist.sum_ns(),
        };
        // A struct of strings and integers always serialises.
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// RFC 3339 in UTC, with as many fractional digits as needed.
pub fn format_time(t: SystemTime) -> String {
    humantime::format_rfc3339(t).to_string()
}

/// Parse an RFC 3339 time, with `Z` or a numeric offset such as `+02:00`.
pub fn parse_rfc3339(s: &str) -> Result<SystemTime, String> {
    let bytes = s.as_bytes();
    // A numeric offset is the last six characters: sign, HH, ':', MM.
    if s.len() > 6 && s.is_char_boundary(s.len() - 6) && matches!(bytes[s.len() - 6], b'+' | b'-') {
        let (base, off) = s.split_at(s.len() - 6);
        let sign = &off[..1];
        let (hh, mm) = off[1..]
            .split_once(':')
            .ok_or_else(|| format!("bad offset {off:?}"))?;
        let hours: u64 = hh.parse().map_err(|_| format!("bad offset {off:?}"))?;
        let minutes: u64 = mm.parse().map_err(|_| format!("bad offset {off:?}"))?;
        if hours > 23 || minutes > 59 {
            return Err(format!("bad offset {off:?}"));
        }
        let local = humantime::parse_rfc3339(&format!("{base}Z")).map_err(|e| e.to_string())?;
        let shift = Duration::from_secs(hours * 3600 + minutes * 60);
        // Local time minus a positive offset is UTC.
        let utc = if sign == "+" {
            local.checked_sub(shift)
        } else {
            local.checked_add(shift)
        };
        let utc = utc
            .filter(|t| *t >= UNIX_EPOCH)
            .ok_or_else(|| "before 1970".to_string())?;
        // A negative offset can carry 9999-12-31 past what RFC 3339 (and format_time) can
        // write: found by tests/fuzz_replay.rs, where printing such a time panicked.
        if utc > latest_rfc3339() {
            return Err("after 9999-12-31T23:59:59Z".to_string());
        }
        return Ok(utc);
    }
    humantime::parse_rfc3339(s).map_err(|e| e.to_string())
}

/// The last instant RFC 3339 can write (9999-12-31T23:59:59.999999999Z).
fn latest_rfc3339() -> SystemTime {
    UNIX_EPOCH + Duration::new(253_402_300_799, 999_999_999)
}

/// The order both replays ([`Replayer`] and [`Sweep`](crate::sweep::Sweep)) take records
/// in: a record at `ts` after `current`, the interval being fed, ends that interval
/// (returned); one before it is refused.
pub(crate) fn interval_ended(
    current: Option<SystemTime>,
    ts: SystemTime,
) -> Result<Option<SystemTime>, RecordError> {
    match current {
        Some(cur) if ts < cur => Err(RecordError::OutOfOrder {
            ts: format_time(ts),
            previous: format_time(cur),
        }),
        Some(cur) if ts > cur => Ok(Some(cur)),
        _ => Ok(None),
    }
}

/// Mark `probe` fed in `fed` (the service's probes fed this interval, bit `probe.id()`),
/// refusing a second record of it.
pub(crate) fn mark_fed(
    fed: &mut u32,
    service: &str,
    probe: Probe,
    ts: SystemTime,
) -> Result<(), RecordError> {
    let bit = probe.bit();
    if *fed & bit != 0 {
        return Err(RecordError::Duplicate {
            service: service.to_string(),
            probe,
            ts: format_time(ts),
        });
    }
    *fed |= bit;
    Ok(())
}

/// Feeds records, grouped by `ts`, through a [`Detector`] and collects the incidents.
#[derive(Debug)]
pub struct Replayer {
    detector: Detector,
    current: Option<SystemTime>,
    /// Probes seen per service in the current interval (bit `probe.id()`).
    seen: HashMap<String, u32>,
    incidents: Vec<Incident>,
    notices: Vec<Notice>,
}

impl Replayer {
    /// Replay into `detector` (fresh, or with restored baselines).
    pub fn new(detector: Detector) -> Self {
        Replayer {
            detector,
            current: None,
            seen: HashMap::new(),
            incidents: Vec::new(),
            notices: Vec::new(),
        }
    }

    /// Feed one record. Records of one interval share a `ts`; a later `ts` ends the interval
    /// before. A record out of time order or repeated is refused and changes nothing.
    pub fn push(&mut self, rec: &Record) -> Result<(), RecordError> {
        if let Some(ended) = interval_ended(self.current, rec.ts)? {
            let events = self.detector.end_interval(ended);
            self.absorb(events);
            self.seen.values_mut().for_each(|bits| *bits = 0);
        }
        let fed = match self.seen.get_mut(&rec.service) {
            Some(bits) => bits,
            None => self.seen.entry(rec.service.clone()).or_default(),
        };
        mark_fed(fed, &rec.service, rec.probe, rec.ts)?;
        self.current = Some(rec.ts);
        self.detector
            .observe(rec.ts, &rec.service, rec.probe, &rec.hist);
        Ok(())
    }

    /// The small shifts noticed so far (not incidents; see [`Event::Noticed`]), in order.
    /// The last interval's count only once it has ended: call [`Replayer::end`] first.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// End the last interval (idempotent): its events are absorbed.
    pub fn end(&mut self) {
        if let Some(cur) = self.current.take() {
            let events = self.detector.end_interval(cur);
            self.absorb(events);
        }
    }

    /// End the last interval. Returns every incident in opening order (those still open have
    /// no `closed_at`) and the detector, e.g. to save its baselines.
    pub fn finish(mut self) -> (Vec<Incident>, Detector) {
        self.end();
        (self.incidents, self.detector)
    }

    fn absorb(&mut self, events: Vec<Event>) {
        for ev in events {
            match ev {
                Event::Opened(inc) => self.incidents.push(inc),
                Event::Noticed(n) => self.notices.push(n),
                Event::Updated(inc) | Event::Closed(inc) => {
                    if let Some(slot) = self
                        .incidents
                        .iter_mut()
                        .rev()
                        .find(|i| i.service == inc.service && i.opened_at == inc.opened_at)
                    {
                        *slot = inc;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"ts":"2026-01-05T00:00:01Z","service":"web","probe":"tcp-socket-read","interval_ms":1000,"buckets":[[100,3],[120,1]],"count":4,"sum_ns":40000}"#;

    #[test]
    fn a_line_round_trips() {
        let r = Record::parse(LINE).unwrap();
        assert_eq!(r.probe, Probe::TcpSocketRead);
        assert_eq!(r.hist.count(), 4);
        assert_eq!(r.to_json_line(), LINE);
    }

    #[test]
    fn bucket_examples_of_the_format_doc_hold() {
        use model::hist::{bucket_index, bucket_lower, bucket_upper};
        assert_eq!(bucket_index(1_000), 63);
        assert_eq!((bucket_lower(63), bucket_upper(63)), (960, 1024));
        assert_eq!(bucket_index(1_000_000), 143);
        assert_eq!(bucket_index(1_000_000_000), 222);
    }

    #[test]
    fn offsets_are_honoured() {
        let a = parse_rfc3339("2026-01-05T02:00:01+02:00").unwrap();
        let b = parse_rfc3339("2026-01-05T00:00:01Z").unwrap();
        let c = parse_rfc3339("2026-01-04T23:30:01.000-00:30").unwrap();
        assert_eq!(a, b);
        assert_eq!(c, b);
        assert!(parse_rfc3339("2026-01-05T00:00:01+25:00").is_err());
        assert!(parse_rfc3339("yesterday").is_err());
    }

    #[test]
    fn bad_lines_say_why() {
        let cases = [
            (LINE.replace("\"count\":4", "\"count\":5"), "does not equal"),
            (LINE.replace("[120,1]", "[999,1]"), "out of range"),
            (LINE.replace("tcp-socket-read", "tcp-read"), "unknown probe"),
            (LINE.replace("\"web\"", "\"\""), "service is empty"),
            (LINE.replace("1000,", "0,"), "interval_ms"),
            (LINE.replace("2026-01-05T", "2026-01-05 T"), "RFC 3339"),
            (LINE.replace("\"sum_ns\"", "\"sum\""), "unknown field"),
            (LINE[..40].to_string(), "EOF"),
        ];
        for (line, want) in cases {
            let err = Record::parse(&line).unwrap_err().to_string();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn order_and_duplicates_are_checked() {
        let mut rp = Replayer::new(Detector::new(Default::default()));
        let r = Record::parse(LINE).unwrap();
        rp.push(&r).unwrap();
        assert!(matches!(rp.push(&r), Err(RecordError::Duplicate { .. })));
        let mut later = r.clone();
        later.ts += Duration::from_secs(1);
        rp.push(&later).unwrap();
        assert!(matches!(rp.push(&r), Err(RecordError::OutOfOrder { .. })));
        let (incidents, _) = rp.finish();
        assert!(incidents.is_empty());
    }
}
