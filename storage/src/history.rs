//! Histogram history: per (service, probe) interval histograms at several resolutions.
//!
//! Each recorded interval is merged into the point of every level that contains its start
//! (`floor(start / resolution) * resolution`), so coarser levels are downsampled by merging
//! as the data arrives and no background job is needed. A read picks the finest level
//! whose retention still covers the start of the range asked for.
//!
//! The records' bytes are `history_chunk.rs`'s, the chunks being filled
//! `history_buffer.rs`'s; this module records, writes and reads them for the store.

use std::time::Duration;

use model::{Histogram, Probe};
use serde::Serialize;

use crate::codec::{self, HISTORY_CHUNK_VERSION};
use crate::config::HistoryLevel;
use crate::engine::T;
use crate::error::{Result, StoreError};
use crate::history_buffer::{HistoryBuffer, COARSE_WRITE_EVERY};
use crate::history_chunk::{
    chunk_span, decode_chunk_fast, decode_record, Chunk, ChunkSeed, Decoded, Stored, CHUNK_POINTS,
};
use crate::keys;
use crate::limits::MAX_BASELINE_BYTES;
use crate::store::Store;

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
#[cfg(any(test, feature = "fixtures"))]
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
    /// Write the series in the detector's replay format (tests: the CLI's history export
    /// has its own writer): one JSON object per point,
    /// `{"ts":"<RFC 3339>","service":..,"probe":..,"interval_ms":..,"buckets":[[i,c],..],
    /// "count":N,"sum_ns":S}`, `ts` being the start of the interval.
    #[cfg(any(test, feature = "fixtures"))]
    pub fn write_jsonl(&self, mut out: impl std::io::Write) -> std::io::Result<()> {
        use std::time::UNIX_EPOCH;
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

/// Records of one write, with their live-byte changes.
#[derive(Default)]
pub(crate) struct Pending {
    batch: sled::Batch,
    added: u64,
    removed: u64,
    /// (service, probe, level, chunk start, record length) written, to mark clean once
    /// stored.
    written: Vec<(String, Probe, u8, u64, usize)>,
}

/// Histograms of one (service, probe) over a time range, sparse and flat: what
/// [`Store::history_sparse_at_level`] reads for a long replay. A week of 10 s points of
/// seven probes held as dense [`Histogram`]s is near a gigabyte (a 2 KiB box each); their
/// non-empty buckets are a small part of that, and reading them allocates nothing per
/// point.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseSeries {
    starts: Vec<u64>,
    counts: Vec<u64>,
    /// End of each point's buckets in `index` and `n`.
    ends: Vec<usize>,
    index: Vec<u16>,
    n: Vec<u64>,
}

impl SparseSeries {
    /// An empty series.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drop every point, keeping the memory for the next read.
    pub fn clear(&mut self) {
        self.starts.clear();
        self.counts.clear();
        self.ends.clear();
        self.index.clear();
        self.n.clear();
    }

    /// Append a point starting at `start` (after every point held) with `count` samples
    /// and its non-empty buckets in increasing index order, as [`Histogram::nonzero`]
    /// yields them.
    pub fn push(
        &mut self,
        start: u64,
        count: u64,
        nonzero: impl IntoIterator<Item = (usize, u64)>,
    ) {
        for (i, c) in nonzero {
            // Bucket indices are below NUM_BUCKETS (272): they fit a u16.
            self.index.push(i as u16);
            self.n.push(c);
        }
        self.starts.push(start);
        self.counts.push(count);
        self.ends.push(self.index.len());
    }

    /// Append a dense histogram.
    pub fn push_histogram(&mut self, start: u64, hist: &Histogram) {
        self.push(start, hist.count(), hist.nonzero());
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when the series holds no point.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Start of point `i`, ns since the epoch.
    pub fn start(&self, i: usize) -> u64 {
        self.starts[i]
    }

    /// Sample count of point `i`.
    pub fn count(&self, i: usize) -> u64 {
        self.counts[i]
    }

    /// The non-empty buckets of point `i`, `(index, count)` in increasing index order.
    pub fn buckets(&self, i: usize) -> impl Iterator<Item = (usize, u64)> + '_ {
        let from = if i == 0 { 0 } else { self.ends[i - 1] };
        let to = self.ends[i];
        self.index[from..to]
            .iter()
            .zip(&self.n[from..to])
            .map(|(&i, &c)| (usize::from(i), c))
    }

    /// Point `i` as a dense histogram (its sum of latencies is not kept: 0).
    pub fn histogram(&self, i: usize) -> Histogram {
        let pairs = self.buckets(i).map(|(b, c)| (b as u64, c));
        // Pushed from valid histograms: the pairs are in range and add up to the count.
        Histogram::from_sparse(pairs, self.counts[i], 0).unwrap_or_default()
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

/// Where a read of one stream at one level begins ([`Store::read_start`]).
struct ReadStart {
    /// The level's index, as keys hold it.
    lvl: u8,
    /// The start of the point containing the read's first time.
    first: u64,
    /// The key time of the first record to read ([`Store::first_record_start`]).
    from: u64,
    /// The stream's chunk being filled in memory: its start and its points in the read's
    /// range. It supersedes its stored record (it was read in when started).
    buffered: Option<(u64, Vec<(u64, Histogram)>)>,
}

impl Store {
    /// Record one interval's histogram for (service, probe), starting at `start_ns`, into
    /// every history level. Durable within `flush_every`. For tests and benchmarks (the
    /// `fixtures` feature): the daemon records whole intervals, [`Store::record_history_batch`].
    #[cfg(any(test, feature = "fixtures"))]
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

    /// `(resolution, chunk span)` in ns of each history level, finest first.
    pub(crate) fn history_levels(&self) -> Vec<(u64, u64)> {
        self.cfg
            .history
            .iter()
            .map(|l| {
                let res = nanos(l.resolution).max(1);
                (res, chunk_span(res))
            })
            .collect()
    }

    /// Write what is buffered for `service`, which is gone (a removed cgroup), and forget
    /// it: its stored history stays. A later write of the same name reads back first.
    pub fn forget_history_writer(&self, service: &str) {
        let mut buf = self.history_write.lock().unwrap_or_else(|e| e.into_inner());
        let eng = self.engine();
        self.sync_history_epoch(&mut buf);
        let tree = eng.tree(T::History);
        let mut pending = Pending::default();
        let mut staged = Ok(());
        if let Some(list) = buf.streams.get(service) {
            for s in list {
                if let Some(c) = s.chunk.as_ref().filter(|c| c.dirty) {
                    staged =
                        staged.and(self.stage(&mut pending, tree, service, s.probe, s.level, c));
                }
            }
        }
        let r = staged.and_then(|()| self.apply_pending(tree, &mut buf, pending));
        if let Err(e) = r {
            tracing::warn!(%service, error = %e, "history of a removed service not stored");
        }
        buf.streams.remove(service);
    }

    /// Record one interval's histograms, all starting at `start_ns`, into every history
    /// level. They are merged into the chunks in memory (readable at once) and written
    /// when the finest level's chunk is complete (coarser levels: see
    /// [`COARSE_WRITE_EVERY`]), at [`Store::flush`] or when the store closes: a crash
    /// loses at most the last `CHUNK_POINTS` finest intervals of the finest level.
    ///
    /// `Err` when nothing was stored (low disk space, engine failure) or when writing the
    /// completed chunks failed; otherwise the points refused one by one (a bad service
    /// name, over the size cap), by index into `points`, the others being recorded.
    /// Several points of one (service, probe) add up.
    pub fn record_history_batch(
        &self,
        start_ns: u64,
        points: &[HistoryPoint<'_>],
    ) -> Result<Vec<(usize, StoreError)>> {
        let r = self.record_history_locked(start_ns, points);
        // Outside the history and engine locks, which recycling must not be under.
        self.maybe_recycle();
        r
    }

    fn record_history_locked(
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
        let mut ok: Vec<usize> = Vec::with_capacity(points.len());
        for (i, p) in points.iter().enumerate() {
            if let Err(e) = keys::check_service(p.service) {
                refused.push((i, e));
                continue;
            }
            // No size check per point: a histogram's encoding is bounded by its bucket
            // count (under 4 KiB, the cap is 16 KiB); a chunk is checked when written.
            ok.push(i);
        }
        let levels = self.history_levels();
        let Some(&(_, span0)) = levels.first() else {
            return Ok(refused);
        };

        let mut buf = self.history_write.lock().unwrap_or_else(|e| e.into_inner());
        // Under the engine guard: a rotation or reopen bumps the epoch before it starts.
        let eng = self.engine();
        self.sync_history_epoch(&mut buf);
        let tree = eng.tree(T::History);
        let mut failed: Option<StoreError> = None;

        // The finest level moved on: write its chunks, the coarser ones that are complete
        // (or not written for COARSE_WRITE_EVERY finest chunks), and let go of the
        // complete ones.
        let period = start_ns - start_ns % span0;
        if buf.period.is_some_and(|p| period > p) {
            let coarse_due = buf.coarse_written.is_none_or(|w| {
                period >= w.saturating_add(COARSE_WRITE_EVERY.saturating_mul(span0))
            });
            if coarse_due {
                buf.coarse_written = Some(period);
            }
            let mut pending = Pending::default();
            let mut staged = Ok(());
            for (service, list) in &buf.streams {
                for s in list {
                    let due = |c: &&Chunk| {
                        let complete = levels
                            .get(usize::from(s.level))
                            .is_none_or(|&level| c.complete_at(level, start_ns));
                        c.dirty && (s.level == 0 || coarse_due || complete)
                    };
                    if let Some(c) = s.chunk.as_ref().filter(due) {
                        staged = staged.and(self.stage(
                            &mut pending,
                            tree,
                            service,
                            s.probe,
                            s.level,
                            c,
                        ));
                    }
                }
            }
            if let Err(e) = staged.and_then(|()| self.apply_pending(tree, &mut buf, pending)) {
                // The complete chunks are dropped all the same (memory stays bounded);
                // the write error is counted.
                failed = Some(e);
            }
            for s in buf.streams.values_mut().flatten() {
                let level = levels
                    .get(usize::from(s.level))
                    .copied()
                    .unwrap_or((1, CHUNK_POINTS));
                if let Some(c) = s.chunk.take_if(|c| c.complete_at(level, start_ns)) {
                    if c.stored != Stored::Absent {
                        if let Some(newest) = &mut s.newest {
                            *newest = Some(newest.map_or(c.start, |n| n.max(c.start)));
                        }
                    }
                }
            }
        }
        buf.period = Some(buf.period.map_or(period, |p| p.max(period)));

        let mut pending = Pending::default();
        for &i in &ok {
            let p = &points[i];
            let list = buf.service(p.service);
            for (level, &(res, span)) in levels.iter().enumerate() {
                // The level index fits a byte: config validation caps the number of levels.
                let lvl = level as u8;
                let at = start_ns - start_ns % res;
                let cstart = at - at % span;
                let s = HistoryBuffer::stream(list, p.probe, lvl);
                if let Some(c) = s.chunk.take_if(|c| c.start != cstart) {
                    // Another chunk of the stream (a gap, a clock step, a backfill).
                    if c.dirty {
                        if let Err(e) = self.stage(&mut pending, tree, p.service, p.probe, lvl, &c)
                        {
                            failed = Some(e);
                        }
                    }
                    if let Some(newest) = &mut s.newest {
                        *newest = Some(newest.map_or(c.start, |n| n.max(c.start)));
                    }
                }
                if s.chunk.is_none() {
                    let key = keys::history(lvl, p.service, p.probe, cstart);
                    let newest = match s.newest {
                        Some(n) => n,
                        None => {
                            // First chunk of the stream here: find its newest record once.
                            let stream = &key[..key.len() - 8];
                            let last = match tree.scan_prefix(stream).next_back().transpose() {
                                Ok(l) => l,
                                Err(e) => return self.counted(Err(e.into())),
                            };
                            let n = last
                                .and_then(|(k, _)| keys::parse_history(&k))
                                .map(|(_, _, _, t)| t);
                            s.newest = Some(n);
                            n
                        }
                    };
                    let chunk = if newest.is_some_and(|n| cstart <= n) {
                        // A chunk written before (an earlier run, a flush): continue it.
                        self.stored_chunk(tree, &key, cstart)?
                    } else {
                        Chunk::empty(cstart, Stored::Absent)
                    };
                    s.chunk = Some(chunk);
                }
                if let Some(c) = &mut s.chunk {
                    c.add(at, p.hist, level == 0)?;
                }
            }
        }
        if let Err(e) = self.apply_pending(tree, &mut buf, pending) {
            failed = Some(e);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        refused.sort_by_key(|(i, _)| *i);
        Ok(refused)
    }

    /// Write every buffered history chunk that changed since it was last written; they
    /// stay buffered. Part of [`Store::flush`].
    pub(crate) fn write_history_buffer(&self) -> Result<()> {
        let mut buf = self.history_write.lock().unwrap_or_else(|e| e.into_inner());
        let eng = self.engine();
        self.sync_history_epoch(&mut buf);
        let tree = eng.tree(T::History);
        let mut pending = Pending::default();
        for (service, list) in &buf.streams {
            for s in list {
                if let Some(c) = s.chunk.as_ref().filter(|c| c.dirty) {
                    self.stage(&mut pending, tree, service, s.probe, s.level, c)?;
                }
            }
        }
        self.apply_pending(tree, &mut buf, pending)
    }

    fn sync_history_epoch(&self, buf: &mut HistoryBuffer) {
        let epoch = self.history_epoch.load(std::sync::atomic::Ordering::SeqCst);
        if buf.epoch != epoch {
            buf.forget_tree();
            buf.epoch = epoch;
        }
    }

    /// The chunk stored under `key` (starting at `cstart`), to be continued; an empty one
    /// when there is none. A damaged record is counted and replaced rather than kept.
    pub(crate) fn stored_chunk(&self, tree: &sled::Tree, key: &[u8], cstart: u64) -> Result<Chunk> {
        let mut chunk = Chunk::empty(cstart, Stored::Absent);
        if let Some(v) = self.counted(tree.get(key).map_err(StoreError::from))? {
            chunk.stored = Stored::Len(v.len());
            match decode_record(cstart, &v) {
                Ok(points) => chunk.set_points(points)?,
                Err(_) => {
                    self.counters
                        .undecodable
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        Ok(chunk)
    }

    /// Add `chunk`'s record to `pending`.
    pub(crate) fn stage(
        &self,
        pending: &mut Pending,
        tree: &sled::Tree,
        service: &str,
        probe: Probe,
        level: u8,
        chunk: &Chunk,
    ) -> Result<()> {
        let value = chunk.encode();
        if matches!(value, Err(StoreError::TooLarge { .. })) {
            self.counters
                .oversized
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let value = self.counted(value)?;
        let key = keys::history(level, service, probe, chunk.start);
        let old = match chunk.stored {
            Stored::Absent => None,
            Stored::Len(l) => Some(l),
            Stored::Unknown => self
                .counted(tree.get(&key).map_err(StoreError::from))?
                .map(|v| v.len()),
        };
        pending.added += (key.len() + value.len()) as u64;
        pending.removed += old.map_or(0, |l| (key.len() + l) as u64);
        pending
            .written
            .push((service.to_owned(), probe, level, chunk.start, value.len()));
        pending.batch.insert(key, value);
        Ok(())
    }

    /// Store `pending` in one atomic write; the chunks it holds are then clean.
    pub(crate) fn apply_pending(
        &self,
        tree: &sled::Tree,
        buf: &mut HistoryBuffer,
        pending: Pending,
    ) -> Result<()> {
        if pending.written.is_empty() {
            return Ok(());
        }
        self.counted(tree.apply_batch(pending.batch).map_err(StoreError::from))?;
        self.live_add(T::History, pending.added, Some(pending.removed));
        for (service, probe, level, start, len) in pending.written {
            let Some(list) = buf.streams.get_mut(&service) else {
                continue;
            };
            for s in list
                .iter_mut()
                .filter(|s| s.probe == probe && s.level == level)
            {
                if let Some(c) = s.chunk.as_mut().filter(|c| c.start == start) {
                    c.dirty = false;
                    c.stored = Stored::Len(len);
                }
            }
        }
        Ok(())
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
        let ReadStart {
            lvl,
            first,
            from,
            buffered,
        } = self.read_start((level, l), (service, probe), since_ns, until_ns)?;
        let tree = self.tree_outside(T::History);
        let start = keys::history(lvl, service, probe, from);
        let end = keys::history(lvl, service, probe, until_ns);
        let mut points: Vec<(u64, Histogram)> = Vec::new();
        for item in tree.range(start..=end) {
            let (k, v) = item?;
            let Some((_, _, _, t)) = keys::parse_history(&k) else {
                continue;
            };
            if buffered.as_ref().is_some_and(|(b, _)| *b == t) {
                continue;
            }
            match decode_record(t, &v) {
                Ok(ps) => points.extend(
                    ps.into_iter()
                        .filter(|(t, _)| (first..=until_ns).contains(t)),
                ),
                Err(e) => {
                    self.counters
                        .undecodable
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(tree = "history", key = ?k, error = %e, "skipping undecodable record");
                }
            }
        }
        if let Some((_, b)) = buffered {
            points.extend(b);
        }
        // Points of one start from several records (per-point records of an earlier
        // build beside a chunk) add up.
        points.sort_by_key(|(t, _)| *t);
        let mut merged: Vec<(u64, Histogram)> = Vec::with_capacity(points.len());
        for (t, h) in points {
            match merged.last_mut() {
                Some((lt, lh)) if *lt == t => lh.merge(&h),
                _ => merged.push((t, h)),
            }
        }
        Ok(HistorySeries {
            service: service.to_string(),
            probe,
            resolution: l.resolution,
            points: merged,
        })
    }

    /// [`Store::history_at_level`] in sparse form: the same points, with the same
    /// non-empty buckets and counts, decoded straight from the chunks. A stream whose
    /// records need merging (a point in several records, per-point records of an earlier
    /// build, a chunk still buffered) is read the dense way and converted.
    pub fn history_sparse_at_level(
        &self,
        level: usize,
        service: &str,
        probe: Probe,
        since_ns: u64,
        until_ns: u64,
    ) -> Result<SparseSeries> {
        let mut out = SparseSeries::new();
        self.history_sparse_into(level, service, probe, since_ns, until_ns, &mut out)?;
        Ok(out)
    }

    /// [`Store::history_sparse_at_level`] into `out` (cleared first), reusing its memory:
    /// a long range read slice by slice stays in a few megabytes.
    pub fn history_sparse_into(
        &self,
        level: usize,
        service: &str,
        probe: Probe,
        since_ns: u64,
        until_ns: u64,
        out: &mut SparseSeries,
    ) -> Result<()> {
        out.clear();
        keys::check_service(service)?;
        let Some(l) = self.cfg.history.get(level) else {
            // The dense read names the error.
            return self
                .history_at_level(level, service, probe, since_ns, until_ns)
                .map(|_| ());
        };
        let start = self.read_start((level, l), (service, probe), since_ns, until_ns)?;
        let range = (start.from, start.first, until_ns);
        if start.buffered.is_none() && self.sparse_chunks(start.lvl, service, probe, range, out)? {
            return Ok(());
        }
        out.clear();
        let dense = self.history_at_level(level, service, probe, since_ns, until_ns)?;
        for (t, h) in &dense.points {
            out.push_histogram(*t, h);
        }
        Ok(())
    }

    /// Where a read of the `(service, probe)` stream at history level `level` (`l`, its
    /// settings) from `since_ns` to `until_ns` begins: the dense and the sparse reads start
    /// alike.
    fn read_start(
        &self,
        (level, l): (usize, &HistoryLevel),
        (service, probe): (&str, Probe),
        since_ns: u64,
        until_ns: u64,
    ) -> Result<ReadStart> {
        let res = nanos(l.resolution).max(1);
        // The point containing `since_ns` starts before it, and its chunk before that.
        let first = since_ns - since_ns % res;
        // The level index fits a byte: config validation caps the number of levels.
        let lvl = level as u8;
        let from = self.first_record_start(lvl, service, probe, first, res)?;
        let buffered = self
            .history_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .points_of(service, probe, lvl, first, until_ns);
        Ok(ReadStart {
            lvl,
            first,
            from,
            buffered,
        })
    }

    /// Where a read of a stream from `first` must start: the aligned start of the chunk
    /// holding `first` at today's resolution, or the key of the record at or before
    /// `first` when that is earlier. Chunks written under a longer resolution (the config
    /// changed since) start before today's aligned start and would be missed otherwise.
    fn first_record_start(
        &self,
        lvl: u8,
        service: &str,
        probe: Probe,
        first: u64,
        res: u64,
    ) -> Result<u64> {
        let aligned = first - first % chunk_span(res);
        let tree = self.tree_outside(T::History);
        let lo = keys::history(lvl, service, probe, 0);
        let hi = keys::history(lvl, service, probe, first);
        let before = match tree.range(lo..=hi).next_back() {
            Some(item) => keys::parse_history(&item?.0).map(|(_, _, _, t)| t),
            None => None,
        };
        Ok(before.map_or(aligned, |t| t.min(aligned)))
    }

    /// The stored chunks of a stream, sparse, when every record is a chunk and their points
    /// come in strictly increasing time (so nothing needs merging), into `out`; false
    /// otherwise. `range`: the first chunk's start, the first point's, the last point's.
    fn sparse_chunks(
        &self,
        lvl: u8,
        service: &str,
        probe: Probe,
        range: (u64, u64, u64),
        out: &mut SparseSeries,
    ) -> Result<bool> {
        let (from, first, until_ns) = range;
        let tree = self.tree_outside(T::History);
        let start = keys::history(lvl, service, probe, from);
        let end = keys::history(lvl, service, probe, until_ns);
        let mut last: Option<u64> = None;
        let mut chunk = Decoded::default();
        for item in tree.range(start..=end) {
            let (k, v) = item?;
            let Some((_, _, _, key_start)) = keys::parse_history(&k) else {
                continue;
            };
            if v.first() != Some(&HISTORY_CHUNK_VERSION) {
                return Ok(false);
            }
            let decoded = codec::verify_as(HISTORY_CHUNK_VERSION, &v).and_then(|payload| {
                chunk.clear();
                if !decode_chunk_fast(payload, &mut chunk) {
                    chunk.clear();
                    let mut de = postcard::Deserializer::from_bytes(payload);
                    serde::de::DeserializeSeed::deserialize(ChunkSeed(&mut chunk), &mut de)
                        .map_err(|e| codec::DecodeError::Payload(e.to_string()))?;
                }
                // A point Histogram would refuse makes the whole record undecodable, as
                // there.
                match (0..chunk.points.len()).all(|k| chunk.check(k).0) {
                    true => Ok(()),
                    false => Err(codec::DecodeError::Payload("invalid histogram".into())),
                }
            });
            if let Err(e) = decoded {
                self.counters
                    .undecodable
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(tree = "history", key = ?k, error = %e, "skipping undecodable record");
                continue;
            }
            for k in 0..chunk.points.len() {
                let (off, count, sum, _) = chunk.points[k];
                let t = key_start.saturating_add(off);
                if !(first..=until_ns).contains(&t) {
                    continue;
                }
                if last.is_some_and(|l| l >= t) {
                    return Ok(false);
                }
                last = Some(t);
                let pairs = chunk.pairs(k);
                if chunk.check(k).1 {
                    out.push(t, count, pairs.iter().map(|&(i, c)| (i as usize, c)));
                } else {
                    // Repeated or empty buckets: as the dense histogram would give them.
                    match Histogram::from_sparse(pairs.iter().copied(), count, sum) {
                        Ok(h) => out.push_histogram(t, &h),
                        Err(_) => return Ok(false),
                    }
                }
            }
        }
        Ok(true)
    }

    /// Every (service, probe) with history at history level `level` (finest first).
    pub fn history_streams_at(&self, level: usize) -> Result<Vec<(String, Probe)>> {
        let Ok(level) = u8::try_from(level) else {
            return Ok(Vec::new());
        };
        let mut streams: Vec<(String, Probe)> = self
            .history_stream_keys(level)?
            .into_iter()
            .filter_map(|p| keys::parse_service_probe(&p[1..]).map(|(s, pr, _)| (s, pr)))
            .collect();
        // Streams whose first chunk is not written yet.
        let buffered = self
            .history_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .streams_at(level);
        if !buffered.is_empty() {
            streams.extend(buffered);
            // In key order, as stored.
            streams.sort_by_cached_key(|(s, p)| keys::service_probe(s, *p));
            streams.dedup();
        }
        Ok(streams)
    }

    /// Every (service, probe) with history at the finest level (tests: the `fixtures`
    /// feature).
    #[cfg(any(test, feature = "fixtures"))]
    pub fn history_streams(&self) -> Result<Vec<(String, Probe)>> {
        self.history_streams_at(0)
    }

    /// Stream prefixes (`level | service | probe`) present at `level`, found by skipping
    /// from one stream to the next instead of reading every point.
    pub(crate) fn history_stream_keys(&self, level: u8) -> Result<Vec<Vec<u8>>> {
        let tree = self.tree_outside(T::History);
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
        let value = self.encode("baseline", &snapshot.to_vec(), MAX_BASELINE_BYTES)?;
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
    use crate::history_chunk::version_1_point;

    /// Every level's sparse read, over the whole range and over slices, gives the dense
    /// read's points: buffered, after reopening (from the chunks), and around a point
    /// stored twice (one record per point beside its chunk) or an undecodable record.
    #[test]
    fn sparse_reads_give_the_dense_points() {
        use crate::{Store, StoreConfig};
        const SEC: u64 = 1_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_700_000_000 * SEC;
        let hist = |i: u64| {
            let mut h = Histogram::new();
            h.record_n(50_000 + i * 1000, 100 + i % 7);
            h.record_n(3_000_000, i % 3);
            h.record_n(u64::MAX, u64::from(i % 50 == 0) * (1 << 40));
            h
        };
        let write = |store: &Store| {
            for i in 0..2000 {
                // A gap: the daemon was down.
                if (700..760).contains(&i) {
                    continue;
                }
                store
                    .record_history("web", Probe::IpStart, t0 + i * SEC, &hist(i))
                    .unwrap();
            }
        };
        let same = |store: &Store| {
            for level in 0..store.config().history.len() {
                for (since, until) in [
                    (t0, t0 + 2000 * SEC),
                    (t0 + 333 * SEC + 5, t0 + 1234 * SEC),
                    (t0 + 1999 * SEC, t0 + 5000 * SEC),
                ] {
                    let dense = store
                        .history_at_level(level, "web", Probe::IpStart, since, until)
                        .unwrap();
                    let mut want = SparseSeries::new();
                    for (t, h) in &dense.points {
                        want.push_histogram(*t, h);
                    }
                    let got = store
                        .history_sparse_at_level(level, "web", Probe::IpStart, since, until)
                        .unwrap();
                    assert_eq!(got, want, "level {level} from {since} to {until}");
                    assert!(!got.is_empty());
                    for i in 0..got.len() {
                        assert_eq!(
                            got.histogram(i).nonzero().collect::<Vec<_>>(),
                            dense.points[i].1.nonzero().collect::<Vec<_>>()
                        );
                    }
                }
            }
        };
        {
            let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
            write(&store);
            same(&store);
        }
        let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
        same(&store);
        // A point also stored as a record of its own (an earlier build's) adds up.
        let tree = store.engine().tree(T::History).clone();
        let at = t0 + 1500 * SEC;
        tree.insert(
            keys::history(0, "web", Probe::IpStart, at),
            version_1_point(&hist(1)),
        )
        .unwrap();
        same(&store);
        // A damaged chunk is skipped by both.
        let t = t0 + 600 * SEC;
        let key = keys::history(0, "web", Probe::IpStart, t - t % chunk_span(SEC));
        let mut bad = tree.get(&key).unwrap().unwrap().to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0x55;
        tree.insert(key, bad).unwrap();
        same(&store);
    }
}

#[cfg(test)]
mod coarse_writes {
    use super::*;
    use crate::{Store, StoreConfig};

    const SEC: u64 = 1_000_000_000;

    /// Points of each stored record of `level` (what a crash would leave), by chunk start.
    fn stored(store: &Store, level: u8) -> Vec<(u64, usize)> {
        let tree = store.engine().tree(T::History).clone();
        tree.scan_prefix(keys::history_stream(level, "web", Probe::IpStart))
            .map(|kv| {
                let (k, v) = kv.unwrap();
                let (_, _, _, start) = keys::parse_history(&k).unwrap();
                (start, decode_record(start, &v).unwrap().len())
            })
            .collect()
    }

    #[test]
    fn unfinished_coarse_chunks_are_written_every_ten_minutes_and_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("db"), StoreConfig::default()).unwrap();
        // At the start of an hour: the 10 s level's chunks end every 10 minutes, the
        // 1 min level's after the hour.
        let t0 = 1_700_002_800 * SEC;
        assert_eq!(t0 % (3600 * SEC), 0);
        let mut h = Histogram::new();
        h.record_n(40_000, 3);
        let mut seen = Vec::new();
        for minute in 0..25u64 {
            for s in 0..60 {
                store
                    .record_history("web", Probe::IpStart, t0 + (minute * 60 + s) * SEC, &h)
                    .unwrap();
                if s == 0 {
                    // The first interval of a minute wrote what was due at its boundary.
                    seen.push((
                        minute,
                        stored(&store, 0).len(),
                        stored(&store, 1),
                        stored(&store, 2),
                    ));
                }
            }
            // Whatever is on disk, a read sees every point recorded.
            let all = store
                .history_at_level(2, "web", Probe::IpStart, t0, t0 + 3600 * SEC)
                .unwrap();
            assert_eq!(all.points.len() as u64, minute + 1);
        }
        let ten = 600 * SEC;
        for (minute, finest, mid, coarse) in seen {
            // The 1 s level: every complete minute.
            assert_eq!(finest as u64, minute, "minute {minute}");
            // The 1 min level's hour: written at minute 1, then every 10 minutes.
            let last_write = match minute {
                0 => None,
                m => Some(1 + (m - 1) / 10 * 10),
            };
            let want: Vec<(u64, usize)> =
                last_write.map(|w| (t0, w as usize)).into_iter().collect();
            assert_eq!(coarse, want, "1 min level at minute {minute}");
            // The 10 s level: each complete 10 minutes in full, the unfinished one as of
            // the last coarse write.
            let mut want = Vec::new();
            for c in 0..minute / 10 {
                want.push((t0 + c * ten, 60));
            }
            if let Some(w) = last_write.filter(|w| w / 10 == minute / 10 && w % 10 != 0) {
                want.push((t0 + w / 10 * ten, (w % 10 * 6) as usize));
            }
            assert_eq!(mid, want, "10 s level at minute {minute}");
        }
        // A flush (the daemon's stop) writes them all.
        store.flush().unwrap();
        assert_eq!(stored(&store, 2), vec![(t0, 25)]);
        assert_eq!(stored(&store, 1).last(), Some(&(t0 + 2 * ten, 30)));
    }
}
