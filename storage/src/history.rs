//! Histogram history: per (service, probe) interval histograms at several resolutions.
//!
//! Each recorded interval is merged into the point of every level that contains its start
//! (`floor(start / resolution) * resolution`), so coarser levels are downsampled by merging
//! as the data arrives and no background job is needed. A read picks the finest level
//! whose retention still covers the start of the range asked for.

use std::collections::HashMap;
use std::time::Duration;

use model::{Histogram, Probe};
use serde::Serialize;

use crate::codec;
use crate::error::{Result, StoreError};
use crate::keys;
use crate::layout::common::HistogramV1;
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

/// Points per history record (a *chunk*) at every level: a record of level `l` covers
/// `CHUNK_POINTS × resolution(l)` from a start aligned to that span. One record per point
/// made sled's per-insert work most of the daemon's CPU and every history read walk one
/// key per point.
pub(crate) const CHUNK_POINTS: u64 = 60;

/// The span of one chunk at a level of resolution `res_ns`.
pub(crate) fn chunk_span(res_ns: u64) -> u64 {
    res_ns.max(1).saturating_mul(CHUNK_POINTS)
}

/// The coarser levels' unfinished chunks are written every this many finest chunks (and
/// when complete, at [`Store::flush`] and at close), not at every one: each write of such
/// a chunk pulls its whole leaf (up to 16 older chunks) into sled's memory, and these
/// rewrites were much of what went through the engine and of its reopens (the soak's
/// figures: docs/reliability.md, "Coarse chunks"). After a crash the coarser levels lack
/// up to this many finest chunks' points; the next open adds them back from the finest
/// level (`history_rebuild.rs`).
pub(crate) const COARSE_WRITE_EVERY: u64 = 10;

/// Envelope version of a history chunk (`Vec<(offset ns, HistogramV1)>`, see
/// `crate::layout`); version-1 history records hold one point each (a `HistogramV1`,
/// written before chunks) and stay readable.
pub(crate) const HISTORY_CHUNK_VERSION: u8 = 2;
/// Cap on a chunk record: its points are capped one by one at [`MAX_HISTORY_BYTES`].
pub(crate) const MAX_HISTORY_CHUNK_BYTES: usize = CHUNK_POINTS as usize * MAX_HISTORY_BYTES;

/// The history chunks this store is filling, one per (service, probe, level), written to
/// the tree when a newer chunk starts, when the finest level moves into a new chunk (its
/// own chunks then, and the coarser levels' as [`COARSE_WRITE_EVERY`] says), at
/// [`Store::flush`] and when the store closes. Reads merge them in, so what
/// was recorded is readable at once. The store is the only writer of its history (the
/// database lock).
#[derive(Default)]
pub(crate) struct HistoryBuffer {
    epoch: u64,
    streams: HashMap<String, Vec<StreamBuf>>,
    /// Start of the finest level's chunk of the newest batch.
    period: Option<u64>,
    /// `period` when the coarser levels' unfinished chunks were last written.
    coarse_written: Option<u64>,
}

struct StreamBuf {
    probe: Probe,
    level: u8,
    /// Start of the newest record of the stream in the tree, once looked up (`Some(None)`:
    /// none); a chunk later than it needs no read.
    newest: Option<Option<u64>>,
    chunk: Option<Chunk>,
}

/// Length of the record stored under a chunk's key, for the live-byte count.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    Absent,
    Len(usize),
    /// Records may have been removed since (retention, rotation): look when writing.
    Unknown,
}

/// One chunk being filled: completed points already encoded, the newest still merging.
pub(crate) struct Chunk {
    start: u64,
    /// Completed points in time order, each `offset ns from start (varint) | histogram`.
    done: Vec<u8>,
    done_n: u64,
    /// Start of the last completed point.
    done_last: Option<u64>,
    open: Option<(u64, Histogram)>,
    /// Changed since last written.
    dirty: bool,
    stored: Stored,
}

impl Chunk {
    /// Whether an interval starting at `now_ns` lies past the chunk's span, at a level of
    /// `(resolution, span)`: the chunk can take no more points.
    fn complete_at(&self, (res, span): (u64, u64), now_ns: u64) -> bool {
        self.start.saturating_add(span) <= now_ns - now_ns % res
    }
}

/// LEB128, as postcard encodes integers and sequence lengths.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_point(out: &mut Vec<u8>, offset: u64, hist: &Histogram) -> Result<()> {
    put_varint(out, offset);
    let wire = SparseWire {
        buckets: Nonzero(hist),
        count: hist.count(),
        sum_ns: hist.sum_ns(),
    };
    let buf = std::mem::take(out);
    *out = postcard::to_extend(&wire, buf).map_err(|source| StoreError::Encode {
        kind: "history",
        source,
    })?;
    Ok(())
}

/// The points of a stored history record under a key starting at `key_start`: a chunk
/// (version 2) or one point (version 1, before chunks).
pub(crate) fn decode_record(
    key_start: u64,
    value: &[u8],
) -> std::result::Result<Vec<(u64, Histogram)>, codec::DecodeError> {
    let thaw = |h: HistogramV1| Histogram::try_from(h).map_err(codec::DecodeError::Payload);
    if value.first() == Some(&HISTORY_CHUNK_VERSION) {
        let points: Vec<(u64, HistogramV1)> = codec::decode_as(HISTORY_CHUNK_VERSION, value)?;
        points
            .into_iter()
            .map(|(off, h)| Ok((key_start.saturating_add(off), thaw(h)?)))
            .collect()
    } else {
        let h: HistogramV1 = codec::decode_as(codec::RECORD_VERSION, value)?;
        Ok(vec![(key_start, thaw(h)?)])
    }
}

/// How many points a history record holds, without decoding them (0 when damaged).
pub(crate) fn record_points(value: &[u8]) -> u64 {
    match value.first() {
        Some(&HISTORY_CHUNK_VERSION) => codec::verify_as(HISTORY_CHUNK_VERSION, value)
            .ok()
            .and_then(|p| postcard::take_from_bytes::<u64>(p).ok())
            .map_or(0, |(n, _)| n),
        _ => u64::from(codec::verify_as(codec::RECORD_VERSION, value).is_ok()),
    }
}

impl Chunk {
    pub(crate) fn empty(start: u64, stored: Stored) -> Chunk {
        Chunk {
            start,
            done: Vec::new(),
            done_n: 0,
            done_last: None,
            open: None,
            dirty: false,
            stored,
        }
    }

    /// Merge `hist` into the point at `at` (within the chunk). A `whole` point (the finest
    /// level, where one interval is one point) is encoded at once instead of copied and
    /// kept open; another interval for it later takes the slower way.
    pub(crate) fn add(&mut self, at: u64, hist: &Histogram, whole: bool) -> Result<()> {
        self.dirty = true;
        if whole && self.open.is_none() && self.done_last.is_none_or(|d| d < at) {
            put_point(&mut self.done, at - self.start, hist)?;
            self.done_n += 1;
            self.done_last = Some(at);
            return Ok(());
        }
        match &mut self.open {
            Some((t, h)) if *t == at => {
                h.merge(hist);
                return Ok(());
            }
            Some((t, _)) if *t < at => {
                if let Some((t, h)) = self.open.take() {
                    put_point(&mut self.done, t - self.start, &h)?;
                    self.done_n += 1;
                    self.done_last = Some(t);
                }
            }
            Some(_) => return self.add_out_of_order(at, hist),
            None if self.done_last.is_some_and(|d| d >= at) => {
                return self.add_out_of_order(at, hist)
            }
            None => {}
        }
        self.open = Some((at, hist.clone()));
        Ok(())
    }

    /// A point at or before one already completed (a clock stepped back, a backfill):
    /// rebuild the chunk from its points.
    fn add_out_of_order(&mut self, at: u64, hist: &Histogram) -> Result<()> {
        let mut points = self.points();
        match points.iter_mut().find(|(t, _)| *t == at) {
            Some((_, h)) => h.merge(hist),
            None => points.push((at, hist.clone())),
        }
        points.sort_by_key(|(t, _)| *t);
        self.set_points(points)
    }

    pub(crate) fn set_points(&mut self, mut points: Vec<(u64, Histogram)>) -> Result<()> {
        self.done.clear();
        self.done_n = 0;
        self.done_last = None;
        self.open = points.pop();
        for (t, h) in &points {
            put_point(&mut self.done, t - self.start, h)?;
            self.done_n += 1;
            self.done_last = Some(*t);
        }
        Ok(())
    }

    /// Every point, decoded.
    fn points(&self) -> Vec<(u64, Histogram)> {
        let mut payload = Vec::with_capacity(self.done.len() + 10);
        put_varint(&mut payload, self.done_n);
        payload.extend_from_slice(&self.done);
        // Encoded here from valid histograms: it decodes.
        let mut points: Vec<(u64, Histogram)> =
            postcard::from_bytes::<Vec<(u64, HistogramV1)>>(&payload)
                .ok()
                .and_then(|v| {
                    v.into_iter()
                        .map(|(off, h)| Some((self.start + off, Histogram::try_from(h).ok()?)))
                        .collect()
                })
                .unwrap_or_default();
        points.extend(self.open.clone());
        points
    }

    /// The chunk's record.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let n = self.done_n + u64::from(self.open.is_some());
        let mut out = Vec::with_capacity(codec::HEADER + 10 + self.done.len() + 512);
        out.extend_from_slice(&[HISTORY_CHUNK_VERSION, 0, 0, 0, 0]);
        put_varint(&mut out, n);
        out.extend_from_slice(&self.done);
        if let Some((t, h)) = &self.open {
            put_point(&mut out, t - self.start, h)?;
        }
        codec::seal("history chunk", out, MAX_HISTORY_CHUNK_BYTES)
    }
}

impl HistoryBuffer {
    /// The streams of `service`.
    fn service(&mut self, service: &str) -> &mut Vec<StreamBuf> {
        if !self.streams.contains_key(service) {
            self.streams.insert(service.to_owned(), Vec::new());
        }
        self.streams.get_mut(service).expect("inserted above")
    }

    fn stream(list: &mut Vec<StreamBuf>, probe: Probe, level: u8) -> &mut StreamBuf {
        let at = match list
            .iter()
            .position(|s| s.probe == probe && s.level == level)
        {
            Some(i) => i,
            None => {
                list.push(StreamBuf {
                    probe,
                    level,
                    newest: None,
                    chunk: None,
                });
                list.len() - 1
            }
        };
        &mut list[at]
    }

    /// Records were removed or the engine replaced: what is known of the tree is stale.
    fn forget_tree(&mut self) {
        for s in self.streams.values_mut().flatten() {
            s.newest = None;
            if let Some(c) = &mut s.chunk {
                c.stored = Stored::Unknown;
            }
        }
    }

    /// Let go of the chunks of `level` that retention deletes when stored: those that can
    /// hold no point from `cut_ns` on (`reach`: how long after its start a chunk's newest
    /// point can start). A chunk still buffered past its level's retention would otherwise
    /// be read back and, when changed since last written, written again by the next flush,
    /// undoing retention: retention deletes only stored records.
    pub(crate) fn drop_expired(&mut self, level: u8, reach: u64, cut_ns: u64) {
        for s in self.streams.values_mut().flatten() {
            if s.level == level {
                s.chunk.take_if(|c| c.start.saturating_add(reach) < cut_ns);
            }
        }
    }

    /// The buffered points of a stream from `since` to `until`, with the start of the
    /// buffered chunk (whose stored record they supersede).
    pub(crate) fn points_of(
        &self,
        service: &str,
        probe: Probe,
        level: u8,
        since: u64,
        until: u64,
    ) -> Option<(u64, Vec<(u64, Histogram)>)> {
        let s = self
            .streams
            .get(service)?
            .iter()
            .find(|s| s.probe == probe && s.level == level)?;
        let c = s.chunk.as_ref()?;
        let mut points = c.points();
        points.retain(|(t, _)| (since..=until).contains(t));
        Some((c.start, points))
    }

    /// Streams (service, probe) with a buffered chunk at `level`.
    pub(crate) fn streams_at(&self, level: u8) -> Vec<(String, Probe)> {
        self.streams
            .iter()
            .flat_map(|(service, list)| {
                list.iter()
                    .filter(move |s| s.level == level && s.chunk.is_some())
                    .map(move |s| (service.clone(), s.probe))
            })
            .collect()
    }
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

/// A chunk's points as decoded by [`ChunkSeed`]: each point's bucket pairs are a range of
/// one shared buffer.
#[derive(Debug, Default, PartialEq, Eq)]
struct Decoded {
    /// Offset from the chunk's start, count, sum, end of its pairs in `pairs`.
    points: Vec<(u64, u64, u64, usize)>,
    pairs: Vec<(u64, u64)>,
}

impl Decoded {
    fn clear(&mut self) {
        self.points.clear();
        self.pairs.clear();
    }

    /// Point `k`'s pairs.
    fn pairs(&self, k: usize) -> &[(u64, u64)] {
        let from = if k == 0 { 0 } else { self.points[k - 1].3 };
        &self.pairs[from..self.points[k].3]
    }

    /// Whether [`Histogram`]'s decoding would accept point `k`, and whether its pairs are
    /// already what [`Histogram::nonzero`] would give back (increasing, none empty).
    fn check(&self, k: usize) -> (bool, bool) {
        let mut total: u64 = 0;
        let mut canonical = true;
        let mut prev: Option<u64> = None;
        for &(i, c) in self.pairs(k) {
            if i >= model::hist::NUM_BUCKETS as u64 {
                return (false, false);
            }
            total = match total.checked_add(c) {
                Some(t) => t,
                None => return (false, false),
            };
            canonical &= c != 0 && prev.is_none_or(|p| p < i);
            prev = Some(i);
        }
        (total == self.points[k].1, canonical)
    }
}

/// One LEB128 varint at `*at`, read as postcard reads a `u64` (or a `usize` on 64 bits):
/// at most 10 bytes, the 10th at most 1, overlong forms accepted. `None` where postcard
/// would fail.
#[inline(always)]
fn take_varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let first = *buf.get(*at)?;
    *at += 1;
    if first < 0x80 {
        return Some(u64::from(first));
    }
    let mut out = u64::from(first & 0x7f);
    for i in 1..10 {
        let b = *buf.get(*at)?;
        *at += 1;
        out |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return (i < 9 || b <= 1).then_some(out);
        }
    }
    None
}

/// [`ChunkSeed`]'s decoding written out by hand for the layout postcard gives a chunk
/// (`n`, then per point: offset, pair count, pairs, count, sum; all varints): the same
/// points for every payload it accepts, at a fraction of the cost (serde's per-element
/// calls were about a seventh of a week's `tune`). `false` when it cannot read the payload
/// (`out` then holds a part): the serde path reads it again and names the error.
fn decode_chunk_fast(payload: &[u8], out: &mut Decoded) -> bool {
    let mut at = 0usize;
    let Some(n) = take_varint(payload, &mut at) else {
        return false;
    };
    for _ in 0..n {
        let (Some(off), Some(pairs)) =
            (take_varint(payload, &mut at), take_varint(payload, &mut at))
        else {
            return false;
        };
        for _ in 0..pairs {
            match (take_varint(payload, &mut at), take_varint(payload, &mut at)) {
                (Some(i), Some(c)) => out.pairs.push((i, c)),
                _ => return false,
            }
        }
        let (Some(count), Some(sum)) =
            (take_varint(payload, &mut at), take_varint(payload, &mut at))
        else {
            return false;
        };
        out.points.push((off, count, sum, out.pairs.len()));
    }
    true
}

/// Decodes a chunk's payload (what `Vec<(u64, Histogram)>` decodes, through the same serde
/// calls) into a reused [`Decoded`], without a vector or a dense histogram per point.
struct ChunkSeed<'a>(&'a mut Decoded);

impl<'de> serde::de::DeserializeSeed<'de> for ChunkSeed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ChunkSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a history chunk")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        while seq.next_element_seed(PointSeed(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

/// One `(offset, histogram)` of a chunk.
struct PointSeed<'a>(&'a mut Decoded);

impl<'de> serde::de::DeserializeSeed<'de> for PointSeed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_tuple(2, self)
    }
}

impl<'de> serde::de::Visitor<'de> for PointSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a history point")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        use serde::de::Error;
        let off: u64 = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(0, &"an offset and a histogram"))?;
        let (count, sum) = seq
            .next_element_seed(HistSeed(&mut self.0.pairs))?
            .ok_or_else(|| A::Error::invalid_length(1, &"an offset and a histogram"))?;
        let end = self.0.pairs.len();
        self.0.points.push((off, count, sum, end));
        Ok(())
    }
}

/// A histogram's sparse form: its pairs appended to the shared buffer; gives count, sum.
struct HistSeed<'a>(&'a mut Vec<(u64, u64)>);

impl<'de> serde::de::DeserializeSeed<'de> for HistSeed<'_> {
    type Value = (u64, u64);
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<(u64, u64), D::Error> {
        d.deserialize_struct("SparseHistogram", &["buckets", "count", "sum_ns"], self)
    }
}

impl<'de> serde::de::Visitor<'de> for HistSeed<'_> {
    type Value = (u64, u64);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a sparse histogram")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(u64, u64), A::Error> {
        use serde::de::Error;
        let missing = |i| A::Error::invalid_length(i, &"buckets, count and sum");
        seq.next_element_seed(PairsSeed(self.0))?
            .ok_or_else(|| missing(0))?;
        let count: u64 = seq.next_element()?.ok_or_else(|| missing(1))?;
        let sum: u64 = seq.next_element()?.ok_or_else(|| missing(2))?;
        Ok((count, sum))
    }
}

/// A histogram's `[index, count]` pairs, appended.
struct PairsSeed<'a>(&'a mut Vec<(u64, u64)>);

impl<'de> serde::de::DeserializeSeed<'de> for PairsSeed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for PairsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("bucket pairs")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        while let Some(pair) = seq.next_element::<(u64, u64)>()? {
            self.0.push(pair);
        }
        Ok(())
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
        let res = nanos(l.resolution).max(1);
        // The point containing `since_ns` starts before it, and its chunk before that.
        let first = since_ns - since_ns % res;
        // The level index fits a byte: config validation caps the number of levels.
        let lvl = level as u8;
        let from = self.first_record_start(lvl, service, probe, first, res)?;
        // The buffered chunk supersedes its stored record (it was read in when started).
        let buffered = self
            .history_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .points_of(service, probe, lvl, first, until_ns);
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
        let res = nanos(l.resolution).max(1);
        let first = since_ns - since_ns % res;
        let lvl = level as u8;
        let from = self.first_record_start(lvl, service, probe, first, res)?;
        let buffered = self
            .history_write
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .points_of(service, probe, lvl, first, until_ns)
            .is_some();
        if !buffered && self.sparse_chunks(lvl, service, probe, (from, first, until_ns), out)? {
            return Ok(());
        }
        out.clear();
        let dense = self.history_at_level(level, service, probe, since_ns, until_ns)?;
        for (t, h) in &dense.points {
            out.push_histogram(*t, h);
        }
        Ok(())
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
        let value = self.encode(
            "baseline",
            &snapshot.to_vec(),
            crate::store::MAX_BASELINE_BYTES,
        )?;
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

    /// A history record of an earlier build: one point.
    fn version_1_point(h: &Histogram) -> Vec<u8> {
        let frozen = HistogramV1::from(h);
        codec::encode_as(codec::RECORD_VERSION, "history", &frozen, 1 << 16, 64).unwrap()
    }

    fn wire(h: &Histogram) -> SparseWire<'_> {
        SparseWire {
            buckets: Nonzero(h),
            count: h.count(),
            sum_ns: h.sum_ns(),
        }
    }

    /// The stored form is `HistogramV1`'s, which `put_point` writes without building one.
    #[test]
    fn borrowed_wire_form_encodes_like_the_frozen_histogram() {
        let mut h = Histogram::new();
        assert_eq!(
            postcard::to_allocvec(&wire(&h)).unwrap(),
            postcard::to_allocvec(&HistogramV1::from(&h)).unwrap()
        );
        for v in [0, 1, 17, 999, 50_000, 1 << 40, u64::MAX] {
            h.record_n(v, v % 1000 + 1);
        }
        assert_eq!(
            postcard::to_allocvec(&wire(&h)).unwrap(),
            postcard::to_allocvec(&HistogramV1::from(&h)).unwrap()
        );
        assert_eq!(
            serde_json::to_string(&wire(&h)).unwrap(),
            serde_json::to_string(&h).unwrap()
        );
    }

    #[test]
    fn chunk_record_is_postcard_of_its_points_in_and_out_of_order() {
        let mut c = Chunk::empty(1000, Stored::Absent);
        let h = |v: u64| {
            let mut h = Histogram::new();
            h.record_n(v, v % 7 + 1);
            h
        };
        let adds = [
            (1000, 5),
            (1001, 70_000),
            (1001, 9),
            (1003, 1 << 33),
            (1002, 4),
        ];
        let mut whole = Chunk::empty(1000, Stored::Absent);
        for (t, v) in adds {
            c.add(t, &h(v), false).unwrap();
            whole.add(t, &h(v), true).unwrap();
        }
        assert_eq!(whole.points(), c.points());
        let mut second = h(70_000);
        second.merge(&h(9));
        let expected = vec![
            (1000, h(5)),
            (1001, second),
            (1002, h(4)),
            (1003, h(1 << 33)),
        ];
        assert_eq!(c.points(), expected);
        let record = c.encode().unwrap();
        assert_eq!(record_points(&record), 4);
        assert_eq!(decode_record(1000, &record).unwrap(), expected);
        let offsets: Vec<(u64, HistogramV1)> = expected
            .iter()
            .map(|(t, h)| (t - 1000, HistogramV1::from(h)))
            .collect();
        assert_eq!(
            codec::verify(&record).unwrap(),
            postcard::to_allocvec(&offsets).unwrap()
        );
        let one = version_1_point(&h(5));
        assert_eq!(record_points(&one), 1);
        assert_eq!(decode_record(77, &one).unwrap(), vec![(77, h(5))]);
    }

    /// The hand-written chunk decoding reads what the serde one reads, and nothing it
    /// refuses: real chunks, every truncation and every one-byte change of one, and the
    /// varint forms at postcard's limits.
    #[test]
    fn fast_chunk_decoding_agrees_with_serde() {
        let serde_way = |payload: &[u8]| {
            let mut d = Decoded::default();
            let mut de = postcard::Deserializer::from_bytes(payload);
            serde::de::DeserializeSeed::deserialize(ChunkSeed(&mut d), &mut de)
                .ok()
                .map(|()| d)
        };
        let fast_way = |payload: &[u8]| {
            let mut d = Decoded::default();
            decode_chunk_fast(payload, &mut d).then_some(d)
        };
        let mut c = Chunk::empty(0, Stored::Absent);
        for t in 0..60u64 {
            let mut h = Histogram::new();
            h.record_n(40_000 + t * 977, 1 + t * t * t * 1000);
            h.record_n(u64::MAX, t % 5);
            h.record_n(3, 1 << (t % 64).min(62));
            c.add(t * 10, &h, true).unwrap();
        }
        let record = c.encode().unwrap();
        let payload = codec::verify(&record).unwrap().to_vec();
        let whole = fast_way(&payload).expect("a chunk decodes");
        assert_eq!(Some(&whole), serde_way(&payload).as_ref());
        assert_eq!(whole.points.len(), 60);
        let mut checked = 0;
        for cut in 0..payload.len() {
            let fast = fast_way(&payload[..cut]);
            assert!(
                fast.is_none() || fast == serde_way(&payload[..cut]),
                "cut {cut}"
            );
        }
        for at in 0..payload.len() {
            for flip in [0x01u8, 0x7f, 0x80, 0xff] {
                let mut bad = payload.clone();
                bad[at] ^= flip;
                if let Some(f) = fast_way(&bad) {
                    assert_eq!(Some(f), serde_way(&bad), "byte {at} ^ {flip:#x}");
                    checked += 1;
                }
            }
        }
        assert!(
            checked > payload.len(),
            "most changes still decode: {checked}"
        );
        // One point, offset and pair written overlong, the count at u64::MAX (10 bytes),
        // then the same with a 10th byte too large.
        let max = [0xffu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        let mut edge = vec![1u8, 0x85, 0x00, 1, 0x81, 0x80, 0x00, 2];
        edge.extend_from_slice(&max);
        edge.push(0);
        let got = fast_way(&edge).expect("postcard's limits");
        assert_eq!(got.points, vec![(5, u64::MAX, 0, 1)]);
        assert_eq!(Some(got), serde_way(&edge));
        let mut over = edge.clone();
        over[8 + 9] = 0x02;
        assert_eq!((fast_way(&over), serde_way(&over)), (None, None));
    }

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
