//! A history chunk record: the points of one stream (service, probe, level) over
//! [`CHUNK_POINTS`] intervals, `version | CRC | postcard Vec<(offset ns, HistogramV1)>`.
//! How a chunk is filled and written ([`Chunk`]), and how stored history records are read
//! back: whole ([`decode_record`]), counted ([`record_points`]), or in the sparse form
//! without a dense histogram per point ([`Decoded`], for the long replay reads).

use model::Histogram;
use serde::Serialize;

use crate::codec::{self, HISTORY_CHUNK_VERSION};
use crate::error::{Result, StoreError};
use crate::layout::common::HistogramV1;
use crate::limits::MAX_HISTORY_BYTES;

/// Points per history record (a *chunk*) at every level: a record of level `l` covers
/// `CHUNK_POINTS × resolution(l)` from a start aligned to that span. One record per point
/// made sled's per-insert work most of the daemon's CPU and every history read walk one
/// key per point.
pub(crate) const CHUNK_POINTS: u64 = 60;

/// The span of one chunk at a level of resolution `res_ns`.
pub(crate) fn chunk_span(res_ns: u64) -> u64 {
    res_ns.max(1).saturating_mul(CHUNK_POINTS)
}

/// Cap on a chunk record: its points are capped one by one at [`MAX_HISTORY_BYTES`].
pub(crate) const MAX_HISTORY_CHUNK_BYTES: usize = CHUNK_POINTS as usize * MAX_HISTORY_BYTES;

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
    pub(crate) start: u64,
    /// Completed points in time order, each `offset ns from start (varint) | histogram`.
    done: Vec<u8>,
    done_n: u64,
    /// Start of the last completed point.
    done_last: Option<u64>,
    open: Option<(u64, Histogram)>,
    /// Changed since last written.
    pub(crate) dirty: bool,
    pub(crate) stored: Stored,
}

impl Chunk {
    /// Whether an interval starting at `now_ns` lies past the chunk's span, at a level of
    /// `(resolution, span)`: the chunk can take no more points.
    pub(crate) fn complete_at(&self, (res, span): (u64, u64), now_ns: u64) -> bool {
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
    pub(crate) fn points(&self) -> Vec<(u64, Histogram)> {
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

/// A chunk's points as decoded by [`ChunkSeed`]: each point's bucket pairs are a range of
/// one shared buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// Offset from the chunk's start, count, sum, end of its pairs in `pairs`.
    pub(crate) points: Vec<(u64, u64, u64, usize)>,
    pub(crate) pairs: Vec<(u64, u64)>,
}

impl Decoded {
    pub(crate) fn clear(&mut self) {
        self.points.clear();
        self.pairs.clear();
    }

    /// Point `k`'s pairs.
    pub(crate) fn pairs(&self, k: usize) -> &[(u64, u64)] {
        let from = if k == 0 { 0 } else { self.points[k - 1].3 };
        &self.pairs[from..self.points[k].3]
    }

    /// Whether [`Histogram`]'s decoding would accept point `k`, and whether its pairs are
    /// already what [`Histogram::nonzero`] would give back (increasing, none empty).
    pub(crate) fn check(&self, k: usize) -> (bool, bool) {
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
pub(crate) fn decode_chunk_fast(payload: &[u8], out: &mut Decoded) -> bool {
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
pub(crate) struct ChunkSeed<'a>(pub(crate) &'a mut Decoded);

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

/// A history record of an earlier build: one point.
#[cfg(test)]
pub(crate) fn version_1_point(h: &Histogram) -> Vec<u8> {
    let frozen = HistogramV1::from(h);
    codec::encode_as(codec::RECORD_VERSION, "history", &frozen, 1 << 16, 64).unwrap()
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
}
