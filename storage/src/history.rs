//! Histogram history: per (service, probe) interval histograms at several resolutions.
//!
//! Each recorded interval is merged into the point of every level that contains its start
//! (`floor(start / resolution) * resolution`), so coarser levels are downsampled by merging
//! as the data arrives and no background job is needed. A read picks the finest level
//! whose retention still covers the start of the range asked for.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use model::{Histogram, Probe};
use serde::Serialize;

use crate::codec;
use crate::error::{Result, StoreError};
use crate::keys;
use crate::store::{Store, MAX_HISTORY_BYTES, T};

/// Histograms of one (service, probe) over a time range at one resolution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistorySeries {
    /// The service.
    pub service: String,
    /// The probe.
    pub probe: Probe,
    /// Width of each point.
    #[serde(with = "humantime_serde")]
    pub resolution: Duration,
    /// `(start ns since the epoch, histogram)` in time order; intervals without data are
    /// absent.
    pub points: Vec<(u64, Histogram)>,
}

/// One line of the replay JSON Lines format (see docs/storage.md and the detector's docs).
#[derive(Serialize)]
struct ReplayLine<'a> {
    ts: String,
    service: &'a str,
    probe: Probe,
    interval_ms: u64,
    #[serde(flatten)]
    hist: &'a Histogram,
}

impl HistorySeries {
    /// Write the series in the detector's replay format: one JSON object per point,
    /// `{"ts":"<RFC 3339>","service":..,"probe":..,"interval_ms":..,"buckets":[[i,c],..],
    /// "count":N,"sum_ns":S}`, `ts` being the start of the interval.
    pub fn write_jsonl(&self, mut out: impl Write) -> std::io::Result<()> {
        let interval_ms = u64::try_from(self.resolution.as_millis()).unwrap_or(u64::MAX);
        for (start, hist) in &self.points {
            let line = ReplayLine {
                ts: humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(*start))
                    .to_string(),
                service: &self.service,
                probe: self.probe,
                interval_ms,
                hist,
            };
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What this store knows of each (service, probe, level) it wrote: the start of the
/// newest point that exists (as written, or as found once by a read), and that point's
/// stored length and histogram once it holds more than one interval. A later point is
/// then known to be absent and a cached one is merged without being read and decoded
/// back: at the default levels, of three reads per (service, probe) and interval about
/// one in ten is left. The store is the only writer of its history (the database lock);
/// the cache is dropped whenever a history record is removed, the engine is swapped or a
/// batch is not stored (`epoch` follows the store's history epoch).
#[derive(Default)]
pub(crate) struct HistoryCache {
    epoch: u64,
    points: HashMap<String, Vec<Newest>>,
}

struct Newest {
    probe: Probe,
    level: u8,
    /// No point of the stream starts later.
    start: u64,
    /// Stored length and histogram of the point at `start`, when kept.
    value: Option<(usize, Histogram)>,
}

/// What the cache says of one point.
enum Known {
    /// Nothing is known: read it.
    Unknown,
    /// Later than every existing point of its stream.
    Absent,
    /// The stored length and histogram (taken out; [`HistoryCache::wrote`] puts the merge
    /// back).
    Stored(usize, Histogram),
}

impl HistoryCache {
    fn entry(&mut self, service: &str, probe: Probe, level: u8) -> Option<&mut Newest> {
        self.points
            .get_mut(service)?
            .iter_mut()
            .find(|c| c.probe == probe && c.level == level)
    }

    fn lookup(&mut self, service: &str, probe: Probe, level: u8, start: u64) -> Known {
        match self.entry(service, probe, level) {
            Some(c) if start > c.start => Known::Absent,
            Some(c) if start == c.start => match c.value.take() {
                Some((len, h)) => Known::Stored(len, h),
                None => Known::Unknown,
            },
            _ => Known::Unknown,
        }
    }

    /// Whether the stream's newest point is known.
    fn knows(&mut self, service: &str, probe: Probe, level: u8) -> bool {
        self.entry(service, probe, level).is_some()
    }

    /// The point at `start` was written (its merged histogram and stored length if worth
    /// keeping); `newest` is the stream's newest existing start when just read.
    fn wrote(
        &mut self,
        service: &str,
        probe: Probe,
        level: u8,
        start: u64,
        newest: Option<u64>,
        value: Option<(usize, Histogram)>,
    ) {
        let newest = newest.unwrap_or(start).max(start);
        if let Some(c) = self.entry(service, probe, level) {
            if start >= c.start {
                c.start = start;
                c.value = value;
            }
            return;
        }
        // Unknown until now: only `newest` (read from the tree) may start the entry.
        let value = if start == newest { value } else { None };
        let entry = Newest {
            probe,
            level,
            start: newest,
            value,
        };
        match self.points.get_mut(service) {
            Some(list) => list.push(entry),
            None => {
                self.points.insert(service.to_owned(), vec![entry]);
            }
        }
    }
}

/// [`Histogram`]'s wire form (`model`'s sparse histogram: `[index, count]` pairs, count,
/// sum), borrowed; a test checks it encodes to the same bytes.
#[derive(Serialize)]
struct SparseWire<'a> {
    buckets: Nonzero<'a>,
    count: u64,
    sum_ns: u64,
}

struct Nonzero<'a>(&'a Histogram);

impl Serialize for Nonzero<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.0.nonzero().count()))?;
        for (i, c) in self.0.nonzero() {
            seq.serialize_element(&(i as u64, c))?;
        }
        seq.end()
    }
}

/// One (service, probe) histogram of an interval, for [`Store::record_history_batch`].
#[derive(Debug, Clone, Copy)]
pub struct HistoryPoint<'a> {
    /// The service.
    pub service: &'a str,
    /// The probe.
    pub probe: Probe,
    /// The interval's histogram.
    pub hist: &'a Histogram,
}

impl Store {
    /// Record one interval's histogram for (service, probe), starting at `start_ns`, into
    /// every history level. Durable within `flush_every`.
    pub fn record_history(
        &self,
        service: &str,
        probe: Probe,
        start_ns: u64,
        hist: &Histogram,
    ) -> Result<()> {
        let point = HistoryPoint {
            service,
            probe,
            hist,
        };
        match self.record_history_batch(start_ns, &[point])?.pop() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Drop what the history writer keeps in memory for `service`, which is gone (a removed
    /// cgroup): its stored history stays. A later write of the same name reads back first.
    pub fn forget_history_writer(&self, service: &str) {
        let mut cache = self.history_write.lock().unwrap_or_else(|e| e.into_inner());
        cache.points.remove(service);
    }

    /// Record one interval's histograms, all starting at `start_ns`, into every history
    /// level in one atomic write. Durable within `flush_every`.
    ///
    /// `Err` when nothing was stored (low disk space, engine failure); otherwise the points
    /// refused one by one (a bad service name, over the size cap), by index into `points`,
    /// the others being stored. Several points of one (service, probe) add up.
    pub fn record_history_batch(
        &self,
        start_ns: u64,
        points: &[HistoryPoint<'_>],
    ) -> Result<Vec<(usize, StoreError)>> {
        let mut refused = Vec::new();
        if points.is_empty() {
            return Ok(refused);
        }
        self.writable()?;
        // Once per batch: statvfs per record was a measurable share of the daemon's CPU.
        self.room_for_bulk()?;
        // Points in key order (sled inserts with locality); one (service, probe) given
        // twice is merged first, since the batch would keep only the last value of a key.
        let mut order: Vec<usize> = Vec::with_capacity(points.len());
        // Each point's own encoding, reused for every level where the point is new.
        let mut encoded: Vec<Option<sled::IVec>> = Vec::with_capacity(points.len());
        for (i, p) in points.iter().enumerate() {
            encoded.push(None);
            if let Err(e) = keys::check_service(p.service) {
                refused.push((i, e));
                continue;
            }
            // Refuse before touching anything if even the unmerged histogram is over the cap.
            match self.encode_histogram(p.hist) {
                Ok(v) => encoded[i] = Some(v.into()),
                Err(e) => {
                    refused.push((i, e));
                    continue;
                }
            }
            order.push(i);
        }
        order.sort_by(|&a, &b| {
            let (a, b) = (&points[a], &points[b]);
            (a.service, a.probe).cmp(&(b.service, b.probe))
        });
        let mut merged_dups: Vec<(usize, Histogram)> = Vec::new();
        order.dedup_by(|later, first| {
            let (l, f) = (&points[*later], &points[*first]);
            if (l.service, l.probe) != (f.service, f.probe) {
                return false;
            }
            // The merged histogram is encoded when used.
            encoded[*first] = None;
            match merged_dups.last_mut().filter(|(i, _)| i == first) {
                Some((_, h)) => h.merge(l.hist),
                None => {
                    let mut h = f.hist.clone();
                    h.merge(l.hist);
                    merged_dups.push((*first, h));
                }
            }
            true
        });
        let hist_of = |i: usize| {
            merged_dups
                .iter()
                .find(|(j, _)| *j == i)
                .map_or(points[i].hist, |(_, h)| h)
        };

        // The read-merge-write of every key must not interleave with another history
        // write, or that write's merge could be lost.
        let mut cache = self.history_write.lock().unwrap_or_else(|e| e.into_inner());
        let eng = self.engine();
        // Read under the engine guard: a rotation or reopen bumps it before it can start.
        let epoch = self.history_epoch.load(std::sync::atomic::Ordering::SeqCst);
        if cache.epoch != epoch {
            cache.points.clear();
            cache.epoch = epoch;
        }
        let tree = eng.tree(T::History);
        let mut batch = sled::Batch::default();
        let (mut added, mut removed) = (0u64, 0u64);
        let mut undecodable = 0u64;
        for &i in &order {
            let p = &points[i];
            let hist = hist_of(i);
            // Encoded at most once, and shared by every level that has no point yet.
            let mut fresh: Option<sled::IVec> = encoded[i].take();
            for (level, l) in self.cfg.history.iter().enumerate() {
                let res = nanos(l.resolution).max(1);
                let start = start_ns - start_ns % res;
                // The level index fits a byte: config validation caps the number of levels.
                let key = keys::history(level as u8, p.service, p.probe, start);
                let lvl = level as u8;
                let mut newest = None;
                let (old_len, prev) = match cache.lookup(p.service, p.probe, lvl, start) {
                    Known::Absent => (None, None),
                    Known::Stored(len, h) => (Some(len), Some(h)),
                    Known::Unknown => {
                        let read = tree.get(&key).and_then(|old| {
                            if cache.knows(p.service, p.probe, lvl) {
                                return Ok((old, None));
                            }
                            // First write of the stream here: find its newest point once.
                            let stream = &key[..key.len() - 8];
                            let last = tree.scan_prefix(stream).next_back().transpose()?;
                            let last = last.and_then(|(k, _)| keys::parse_history(&k));
                            Ok((old, Some(last.map_or(0, |(_, _, _, t)| t))))
                        });
                        let old = match read {
                            Ok((old, n)) => {
                                newest = n;
                                old
                            }
                            Err(e) => {
                                // Merges put in the cache above will not be stored.
                                cache.points.clear();
                                return self.counted(Err(e.into()));
                            }
                        };
                        let prev = old
                            .as_ref()
                            .and_then(|o| match codec::decode::<Histogram>(o) {
                                Ok(prev) => Some(prev),
                                // A damaged point is replaced by the new interval
                                // rather than kept.
                                Err(_) => {
                                    undecodable += 1;
                                    None
                                }
                            });
                        (old.map(|o| o.len()), prev)
                    }
                };
                let value = match prev {
                    Some(mut prev) => {
                        prev.merge(hist);
                        match self.encode_histogram(&prev) {
                            Ok(v) => {
                                let v = sled::IVec::from(v);
                                let kept = Some((v.len(), prev));
                                cache.wrote(p.service, p.probe, lvl, start, newest, kept);
                                v
                            }
                            Err(e) => {
                                // The stored point stays as it was.
                                refused.push((i, e));
                                break;
                            }
                        }
                    }
                    None => match &fresh {
                        Some(v) => v.clone(),
                        None => {
                            // Checked against the cap above, so this cannot fail.
                            let v = match self.encode_histogram(hist) {
                                Ok(v) => sled::IVec::from(v),
                                Err(e) => {
                                    cache.points.clear();
                                    return Err(e);
                                }
                            };
                            fresh = Some(v.clone());
                            v
                        }
                    },
                };
                if old_len.is_none() {
                    // A new point: known to exist from now on, its histogram not kept.
                    cache.wrote(p.service, p.probe, lvl, start, newest, None);
                }
                added += (key.len() + value.len()) as u64;
                removed += old_len.map_or(0, |l| (key.len() + l) as u64);
                batch.insert(key, value);
            }
        }
        let r = tree.apply_batch(batch);
        if r.is_err() {
            // The cache now holds merges that were not stored.
            cache.points.clear();
        }
        self.counted(r.map_err(StoreError::from))?;
        if undecodable > 0 {
            self.counters
                .undecodable
                .fetch_add(undecodable, std::sync::atomic::Ordering::Relaxed);
        }
        self.live_add(T::History, added, Some(removed));
        refused.sort_by_key(|(i, _)| *i);
        Ok(refused)
    }

    /// A history value: the bytes `codec::encode` gives for `hist`, written from the
    /// histogram in place (its own `Serialize` goes through an owned sparse copy).
    fn encode_histogram(&self, hist: &Histogram) -> Result<Vec<u8>> {
        let wire = SparseWire {
            buckets: Nonzero(hist),
            count: hist.count(),
            sum_ns: hist.sum_ns(),
        };
        // Room for a histogram of ~40 buckets, one allocation in the common case.
        let r = codec::encode_as(
            codec::RECORD_VERSION,
            "history",
            &wire,
            MAX_HISTORY_BYTES,
            512,
        );
        if matches!(r, Err(StoreError::TooLarge { .. })) {
            self.counters
                .oversized
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.counted(r)
    }

    /// History of (service, probe) from `since_ns` to `until_ns` (inclusive, ns since the
    /// epoch), at the finest level whose retention, counted back from `now_ns`, reaches
    /// `since_ns` (the coarsest level when none does).
    pub fn history(
        &self,
        service: &str,
        probe: Probe,
        since_ns: u64,
        until_ns: u64,
        now_ns: u64,
    ) -> Result<HistorySeries> {
        let levels = &self.cfg.history;
        let level = levels
            .iter()
            .position(|l| now_ns.saturating_sub(nanos(l.keep)) <= since_ns)
            .unwrap_or(levels.len().saturating_sub(1));
        self.history_at_level(level, service, probe, since_ns, until_ns)
    }

    /// History of (service, probe) from `since_ns` to `until_ns` (inclusive) at history
    /// level `level` (an index into [`crate::StoreConfig::history`], finest first), whatever
    /// its retention.
    pub fn history_at_level(
        &self,
        level: usize,
        service: &str,
        probe: Probe,
        since_ns: u64,
        until_ns: u64,
    ) -> Result<HistorySeries> {
        keys::check_service(service)?;
        let Some(l) = self.cfg.history.get(level) else {
            return Err(StoreError::Config {
                key: "history".into(),
                reason: format!(
                    "no history level {level} (there are {})",
                    self.cfg.history.len()
                ),
            });
        };
        let res = nanos(l.resolution).max(1);
        // The point containing `since_ns` starts before it.
        let first = since_ns - since_ns % res;
        // The level index fits a byte: config validation caps the number of levels.
        let start = keys::history(level as u8, service, probe, first);
        let end = keys::history(level as u8, service, probe, until_ns);
        let points = self
            .scan::<Histogram>(T::History, start..=end)?
            .into_iter()
            .filter_map(|(k, h)| keys::parse_history(&k).map(|(_, _, _, t)| (t, h)))
            .collect();
        Ok(HistorySeries {
            service: service.to_string(),
            probe,
            resolution: l.resolution,
            points,
        })
    }

    /// Every (service, probe) with history at history level `level` (finest first).
    pub fn history_streams_at(&self, level: usize) -> Result<Vec<(String, Probe)>> {
        let Ok(level) = u8::try_from(level) else {
            return Ok(Vec::new());
        };
        Ok(self
            .history_stream_keys(level)?
            .into_iter()
            .filter_map(|p| keys::parse_service_probe(&p[1..]).map(|(s, pr, _)| (s, pr)))
            .collect())
    }

    /// Every (service, probe) with history at the finest level.
    pub fn history_streams(&self) -> Result<Vec<(String, Probe)>> {
        Ok(self
            .history_stream_keys(0)?
            .into_iter()
            .filter_map(|p| keys::parse_service_probe(&p[1..]).map(|(s, pr, _)| (s, pr)))
            .collect())
    }

    /// Stream prefixes (`level | service | probe`) present at `level`, found by skipping
    /// from one stream to the next instead of reading every point.
    pub(crate) fn history_stream_keys(&self, level: u8) -> Result<Vec<Vec<u8>>> {
        let tree = self.engine().tree(T::History).clone();
        let mut out = Vec::new();
        let mut from = vec![level];
        let level_end = keys::prefix_end(&[level]);
        loop {
            let next = match &level_end {
                Some(end) => tree.range(from.clone()..end.clone()).next(),
                None => tree.range(from.clone()..).next(),
            };
            let Some(item) = next else { break };
            let (k, _) = item?;
            let Some((_, service, probe, _)) = keys::parse_history(&k) else {
                // A key of unknown shape: step past it.
                from = k.to_vec();
                from.push(0);
                continue;
            };
            let stream = keys::history_stream(level, &service, probe);
            match keys::prefix_end(&stream) {
                Some(e) => from = e,
                None => {
                    out.push(stream);
                    break;
                }
            }
            out.push(stream);
        }
        Ok(out)
    }

    /// Store the detector's baseline snapshot for (service, probe), replacing the previous
    /// one. The bytes are opaque to the store.
    pub fn put_baseline(&self, service: &str, probe: Probe, snapshot: &[u8]) -> Result<()> {
        keys::check_service(service)?;
        let value = self.encode("baseline", &snapshot, crate::store::MAX_BASELINE_BYTES)?;
        self.put(T::Baselines, &keys::service_probe(service, probe), value)
    }

    /// The stored baseline snapshot of (service, probe).
    pub fn baseline(&self, service: &str, probe: Probe) -> Result<Option<Vec<u8>>> {
        keys::check_service(service)?;
        let key = keys::service_probe(service, probe);
        let raw = self.engine().tree(T::Baselines).get(&key)?;
        Ok(raw.and_then(|v| self.decode_counted::<Vec<u8>>(T::Baselines, &key, &v)))
    }

    /// Every stored baseline snapshot.
    pub fn baselines(&self) -> Result<Vec<(String, Probe, Vec<u8>)>> {
        Ok(self
            .scan::<Vec<u8>>(T::Baselines, ..)?
            .into_iter()
            .filter_map(|(k, v)| keys::parse_service_probe(&k).map(|(s, p, _)| (s, p, v)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(h: &Histogram) -> SparseWire<'_> {
        SparseWire {
            buckets: Nonzero(h),
            count: h.count(),
            sum_ns: h.sum_ns(),
        }
    }

    #[test]
    fn borrowed_wire_form_encodes_like_the_histogram() {
        let mut h = Histogram::new();
        assert_eq!(
            postcard::to_allocvec(&wire(&h)).unwrap(),
            postcard::to_allocvec(&h).unwrap()
        );
        for v in [0, 1, 17, 999, 50_000, 1 << 40, u64::MAX] {
            h.record_n(v, v % 1000 + 1);
        }
        assert_eq!(
            postcard::to_allocvec(&wire(&h)).unwrap(),
            postcard::to_allocvec(&h).unwrap()
        );
        assert_eq!(
            serde_json::to_string(&wire(&h)).unwrap(),
            serde_json::to_string(&h).unwrap()
        );
    }
}
