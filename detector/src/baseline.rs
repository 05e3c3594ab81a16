//! A learned reference distribution of one (service, probe): bucket weights that decay with a
//! half-life, so the baseline follows slow change but lags a ramp long enough to flag it.

use std::time::{Duration, SystemTime};

use model::hist::{bucket_lower, bucket_upper, QuantileEstimate, MAX_BUCKET, NUM_BUCKETS};

#[cfg(test)]
mod golden_tests;
mod layout;

use layout::{BaselineV1, FORMAT_VERSION};

/// A saved baseline could not be restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BaselineError {
    /// The bytes were written by another (newer or older) format.
    #[error("baseline format version {0} is not supported (expected {FORMAT_VERSION})")]
    Version(u8),
    /// The bytes are empty, truncated or corrupt.
    #[error("corrupt baseline: {0}")]
    Corrupt(String),
}

/// Decayed bucket weights plus the times that warm-up needs.
#[derive(Debug, Clone)]
pub(crate) struct Baseline {
    weights: Box<[f64; NUM_BUCKETS]>,
    total: f64,
    /// Buckets outside `span.0..span.1` hold exactly 0: decay and running sums skip them
    /// (adding or scaling a 0 changes nothing, so the results are bit-identical).
    span: (usize, usize),
    first_seen: SystemTime,
    last_update: SystemTime,
}

/// The last decay factor computed: (step, half-life, factor), as bits of their f64.
#[derive(Debug, Default)]
pub(crate) struct DecayMemo(Option<(u64, u64, f64)>);

impl Baseline {
    pub(crate) fn new(now: SystemTime) -> Self {
        Baseline {
            weights: Box::new([0.0; NUM_BUCKETS]),
            total: 0.0,
            span: (0, 0),
            first_seen: now,
            last_update: now,
        }
    }

    /// Decay by the time elapsed since the last update, then add the interval's
    /// `(bucket, count)` pairs.
    pub(crate) fn learn(
        &mut self,
        now: SystemTime,
        interval: impl Iterator<Item = (usize, u64)>,
        half_life: Duration,
    ) {
        self.learn_memo(now, interval, half_life, &mut DecayMemo::default());
    }

    /// [`Self::learn`], taking the decay factor from `memo` when it was computed for the
    /// same step and half-life (a sweep's baselines mostly decay alike each interval, and
    /// `powf` is a good part of learning).
    pub(crate) fn learn_memo(
        &mut self,
        now: SystemTime,
        interval: impl Iterator<Item = (usize, u64)>,
        half_life: Duration,
        memo: &mut DecayMemo,
    ) {
        let dt = now
            .duration_since(self.last_update)
            .unwrap_or(Duration::ZERO)
            .as_secs_f64();
        if dt > 0.0 && self.total > 0.0 {
            let hl = half_life.as_secs_f64();
            let keep = match memo.0 {
                Some((d, h, k)) if d == dt.to_bits() && h == hl.to_bits() => k,
                _ => {
                    let k = 0.5f64.powf(dt / hl);
                    memo.0 = Some((dt.to_bits(), hl.to_bits(), k));
                    k
                }
            };
            for w in &mut self.weights[self.span.0..self.span.1] {
                *w *= keep;
            }
            self.total *= keep;
        }
        for (i, c) in interval {
            if let Some(w) = self.weights.get_mut(i) {
                *w += c as f64;
                self.total += c as f64;
                self.widen(i);
            }
        }
        self.last_update = self.last_update.max(now);
    }

    /// Frozen: time passes without decay, so a long incident does not age the baseline.
    pub(crate) fn hold(&mut self, now: SystemTime) {
        self.last_update = self.last_update.max(now);
    }

    /// Effective (decayed) number of samples.
    pub(crate) fn weight(&self) -> f64 {
        self.total
    }

    pub(crate) fn is_warm(&self, now: SystemTime, min_weight: u64, min_age: Duration) -> bool {
        self.total >= min_weight.max(1) as f64
            && now
                .duration_since(self.first_seen)
                .unwrap_or(Duration::ZERO)
                >= min_age
    }

    /// Cover bucket `i` in the span of possibly non-zero weights.
    fn widen(&mut self, i: usize) {
        if self.span.0 == self.span.1 {
            self.span = (i, i + 1);
        } else {
            self.span = (self.span.0.min(i), self.span.1.max(i + 1));
        }
    }

    /// Cumulative weights, for repeated quantile look-ups in one evaluation.
    pub(crate) fn cumulative(&self) -> Cumulative {
        let mut out = Cumulative {
            cum: [0.0; NUM_BUCKETS],
        };
        self.cumulative_into(&mut out);
        out
    }

    /// [`Self::cumulative`] written over `out`: the same sums, without a 2 KiB array
    /// zeroed and copied each time (a sweep does this per probe and group every interval).
    pub(crate) fn cumulative_into(&self, out: &mut Cumulative) {
        let (lo, hi) = self.span;
        let cum = &mut out.cum;
        cum[..lo].fill(0.0);
        let mut acc = 0.0;
        for (slot, &w) in cum[lo..hi].iter_mut().zip(&self.weights[lo..hi]) {
            acc += w;
            *slot = acc;
        }
        cum[hi..].fill(acc);
    }

    /// Quantile as the daemon wants it for capture thresholds.
    pub(crate) fn quantile(&self, q: f64) -> Option<QuantileEstimate> {
        let c = self.cumulative();
        let (bucket, value_ns) = c.quantile(q)?;
        Some(QuantileEstimate {
            q,
            bucket,
            value_ns,
            lower_ns: bucket_lower(bucket),
            upper_ns: bucket_upper(bucket),
        })
    }

    /// The saved form: [`FORMAT_VERSION`], then postcard of the baseline's frozen layout
    /// (`layout.rs`), never of the live type.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION];
        // Serialising plain numbers into a Vec cannot fail.
        out.extend(postcard::to_allocvec(&BaselineV1::from(self)).unwrap_or_default());
        out
    }

    /// A baseline saved by [`Self::to_bytes`] of this build or an earlier one.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, BaselineError> {
        let (&version, body) = bytes
            .split_first()
            .ok_or_else(|| BaselineError::Corrupt("empty".into()))?;
        let corrupt = |e: postcard::Error| BaselineError::Corrupt(e.to_string());
        match version {
            1 => postcard::from_bytes::<BaselineV1>(body)
                .map_err(corrupt)?
                .try_into(),
            other => Err(BaselineError::Version(other)),
        }
    }
}

/// [`Baseline::cumulative_into`] for several baselines, up to [`SIDE_BY_SIDE`] at a time:
/// each running sum still adds its weights one by one in bucket order (the same sums, bit
/// for bit), but the sums advance side by side. One sum alone waits on each addition's
/// latency; a sweep does one per baseline group and probe every interval.
#[derive(Default)]
pub(crate) struct CumulativeBatch<'a> {
    jobs: [Option<(&'a Baseline, &'a mut Cumulative)>; SIDE_BY_SIDE],
    held: usize,
}

/// Running sums advanced together by [`CumulativeBatch`].
const SIDE_BY_SIDE: usize = 4;

impl<'a> CumulativeBatch<'a> {
    /// Sum `baseline`'s weights into `out` (now or at [`Self::finish`]).
    pub(crate) fn push(&mut self, baseline: &'a Baseline, out: &'a mut Cumulative) {
        self.jobs[self.held] = Some((baseline, out));
        self.held += 1;
        if self.held == SIDE_BY_SIDE {
            self.run();
        }
    }

    /// Sum what is left.
    pub(crate) fn finish(mut self) {
        self.run();
    }

    fn run(&mut self) {
        self.held = 0;
        match std::mem::take(&mut self.jobs) {
            [Some((b0, o0)), Some((b1, o1)), Some((b2, o2)), Some((b3, o3))] => sums(
                [b0, b1, b2, b3],
                [&mut o0.cum, &mut o1.cum, &mut o2.cum, &mut o3.cum],
            ),
            [Some((b0, o0)), Some((b1, o1)), Some((b2, o2)), None] => {
                sums([b0, b1, b2], [&mut o0.cum, &mut o1.cum, &mut o2.cum])
            }
            [Some((b0, o0)), Some((b1, o1)), None, None] => {
                sums([b0, b1], [&mut o0.cum, &mut o1.cum])
            }
            [Some((b0, o0)), None, None, None] => b0.cumulative_into(o0),
            // Filled in order, so this is all empty; any other shape one by one.
            other => {
                for (b, o) in other.into_iter().flatten() {
                    b.cumulative_into(o);
                }
            }
        }
    }
}

/// `N` running sums side by side over the union of their spans. Outside its own span a
/// baseline's weights are exactly 0: adding them leaves a sum as it is (0 before the span,
/// the total after it), which is what `cumulative_into` writes there.
fn sums<const N: usize>(bases: [&Baseline; N], outs: [&mut [f64; NUM_BUCKETS]; N]) {
    let spans = bases.map(|b| b.span);
    let lo = spans
        .iter()
        .filter(|s| s.0 < s.1)
        .map(|s| s.0)
        .min()
        .unwrap_or(0);
    let hi = spans
        .iter()
        .map(|s| s.1)
        .max()
        .unwrap_or(0)
        .min(NUM_BUCKETS);
    let weights = bases.map(|b| &*b.weights);
    let mut outs = outs;
    let mut acc = [0.0f64; N];
    for out in outs.iter_mut() {
        out[..lo].fill(0.0);
    }
    for i in lo..hi {
        for k in 0..N {
            acc[k] += weights[k][i];
            outs[k][i] = acc[k];
        }
    }
    for (out, a) in outs.iter_mut().zip(acc) {
        out[hi..].fill(a);
    }
}

/// Running sums over the buckets of a distribution (counts or decayed weights).
#[derive(Debug, Clone)]
pub(crate) struct Cumulative {
    cum: [f64; NUM_BUCKETS],
}

impl Cumulative {
    /// Running sums of integer counts. Every partial sum below 2^53 is exact in f64 in any
    /// order, so this equals `new` over the counts as f64 while adding integers (fast) and
    /// skipping the empty buckets at both ends.
    pub(crate) fn from_counts(counts: &[u64; NUM_BUCKETS]) -> Self {
        let mut out = Cumulative {
            cum: [0.0; NUM_BUCKETS],
        };
        out.set_counts(counts);
        out
    }

    /// [`Self::from_counts`] written over `self`, in place.
    pub(crate) fn set_counts(&mut self, counts: &[u64; NUM_BUCKETS]) {
        let lo = counts.iter().position(|&c| c != 0).unwrap_or(NUM_BUCKETS);
        self.cum[..lo].fill(0.0);
        let mut acc = 0u64;
        for (slot, &c) in self.cum[lo..].iter_mut().zip(&counts[lo..]) {
            acc = acc.saturating_add(c);
            *slot = acc as f64;
        }
        if acc >= 1 << 53 {
            *self = Cumulative::new(counts.iter().map(|&c| c as f64));
        }
    }

    pub(crate) fn new(weights: impl Iterator<Item = f64>) -> Self {
        let mut cum = [0.0; NUM_BUCKETS];
        let mut acc = 0.0;
        for (slot, w) in cum.iter_mut().zip(weights) {
            acc += w;
            *slot = acc;
        }
        Cumulative { cum }
    }

    pub(crate) fn total(&self) -> f64 {
        self.cum[MAX_BUCKET]
    }

    /// Weight in buckets above `bucket`.
    pub(crate) fn above(&self, bucket: usize) -> f64 {
        self.total() - self.cum[bucket.min(MAX_BUCKET)]
    }

    /// Bucket holding quantile `q` and a value interpolated linearly inside it (finer than
    /// the bucket midpoint, which matters for ratios close to 1). `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<(usize, f64)> {
        let mut no_hint = NUM_BUCKETS;
        self.quantile_near(q, &mut no_hint)
    }

    /// [`Self::quantile`], looking at bucket `*hint` first and leaving there the bucket
    /// found. The running sums never decrease, so the first bucket whose sum reaches the
    /// rank is one bucket: when the hint's sum reaches it and the one before does not, the
    /// search would end there too. A quantile moves little from one interval to the next,
    /// so a sweep keeps its last bucket as the hint and mostly skips the search.
    pub(crate) fn quantile_near(&self, q: f64, hint: &mut usize) -> Option<(usize, f64)> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let h = *hint;
        let bucket = if h <= MAX_BUCKET && self.cum[h] >= rank && (h == 0 || self.cum[h - 1] < rank)
        {
            h
        } else {
            self.cum.partition_point(|&c| c < rank).min(MAX_BUCKET)
        };
        *hint = bucket;
        let before = if bucket == 0 {
            0.0
        } else {
            self.cum[bucket - 1]
        };
        let inside = self.cum[bucket] - before;
        let lo = bucket_lower(bucket) as f64;
        // Buckets below 16 hold one value; the last bucket is open-ended.
        if bucket < 16 || bucket == MAX_BUCKET || inside <= 0.0 {
            return Some((bucket, lo));
        }
        let hi = bucket_upper(bucket) as f64;
        let frac = ((rank - before) / inside).clamp(0.0, 1.0);
        Some((bucket, lo + frac * (hi - lo)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::hist::{bucket_index, Histogram};
    use std::time::UNIX_EPOCH;

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn hist_at(v: u64, n: u64) -> Histogram {
        let mut h = Histogram::new();
        h.record_n(v, n);
        h
    }

    #[test]
    fn old_data_weighs_half_per_half_life() {
        let mut b = Baseline::new(t(0));
        b.learn(
            t(0),
            hist_at(100_000, 1000).nonzero(),
            Duration::from_secs(60),
        );
        b.learn(
            t(60),
            hist_at(400_000, 1000).nonzero(),
            Duration::from_secs(60),
        );
        // 500 decayed samples at 100 µs against 1000 fresh ones at 400 µs
        assert!((b.weight() - 1500.0).abs() < 1e-6);
        let median = b.quantile(0.5).unwrap();
        assert_eq!(median.bucket, bucket_index(400_000));
        let p30 = b.quantile(0.3).unwrap();
        assert_eq!(p30.bucket, bucket_index(100_000));
    }

    #[test]
    fn hold_does_not_decay() {
        let mut b = Baseline::new(t(0));
        b.learn(
            t(0),
            hist_at(100_000, 1000).nonzero(),
            Duration::from_secs(60),
        );
        b.hold(t(600));
        b.learn(
            t(600),
            hist_at(100_000, 10).nonzero(),
            Duration::from_secs(60),
        );
        assert!((b.weight() - 1010.0).abs() < 1e-6);
    }

    #[test]
    fn warm_up_needs_weight_and_age() {
        let mut b = Baseline::new(t(0));
        b.learn(
            t(1),
            hist_at(1000, 100).nonzero(),
            Duration::from_secs(3600),
        );
        assert!(!b.is_warm(t(1), 50, Duration::from_secs(10)));
        assert!(b.is_warm(t(10), 50, Duration::from_secs(10)));
        assert!(!b.is_warm(t(10), 500, Duration::from_secs(10)));
    }

    #[test]
    fn interpolated_quantile_stays_in_its_bucket() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        let c = Cumulative::new(h.buckets().iter().map(|&c| c as f64));
        for q in [0.5, 0.9, 0.99, 0.999] {
            let (b, v) = c.quantile(q).unwrap();
            assert!(bucket_lower(b) as f64 <= v && v < bucket_upper(b) as f64);
            let truth = q * 1_000_000.0;
            // within the bucket's relative width; the data end inside the p99.9 bucket
            assert!((v - truth).abs() / truth < 0.0625, "q={q}: {v} vs {truth}");
        }
        assert!(Cumulative::new([0.0; 3].into_iter())
            .quantile(0.5)
            .is_none());
    }

    #[test]
    fn bytes_round_trip_and_reject_damage() {
        let mut b = Baseline::new(t(5));
        b.learn(
            t(9),
            hist_at(123_456, 77).nonzero(),
            Duration::from_secs(3600),
        );
        let bytes = b.to_bytes();
        let back = Baseline::from_bytes(&bytes).unwrap();
        assert_eq!(back.weights, b.weights);
        assert_eq!(back.total, b.total);
        assert_eq!(back.first_seen, b.first_seen);
        assert_eq!(back.last_update, b.last_update);

        let mut wrong = bytes.clone();
        wrong[0] = 9;
        assert_eq!(
            Baseline::from_bytes(&wrong).unwrap_err(),
            BaselineError::Version(9)
        );
        assert!(matches!(
            Baseline::from_bytes(&bytes[..bytes.len() - 3]),
            Err(BaselineError::Corrupt(_))
        ));
        assert!(matches!(
            Baseline::from_bytes(&[]),
            Err(BaselineError::Corrupt(_))
        ));
    }

    #[test]
    fn shortcut_sums_equal_the_full_sums_bit_for_bit() {
        let full = |w: &[f64]| Cumulative::new(w.iter().copied()).cum;
        let mut b = Baseline::new(t(0));
        for (step, v) in [
            (0u64, 90_000u64),
            (7, 3_000_000),
            (20, 40_000),
            (33, 250_000),
        ] {
            let mut h = hist_at(v, 997);
            h.record_n(v / 3, 13);
            b.learn(t(step), h.nonzero(), Duration::from_secs(11));
            assert_eq!(b.cumulative().cum, full(&b.weights[..]));
            let mut counts = [0u64; NUM_BUCKETS];
            for (i, c) in h.nonzero() {
                counts[i] = c * (step + 1);
            }
            let as_f64: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
            assert_eq!(Cumulative::from_counts(&counts).cum, full(&as_f64));
        }
        let back = Baseline::from_bytes(&b.to_bytes()).unwrap();
        assert_eq!(back.cumulative().cum, full(&back.weights[..]));
    }

    #[test]
    fn sums_side_by_side_equal_the_sums_one_by_one() {
        // Spans apart, overlapping, nested, empty; weights with fractions (decayed).
        let mut bases = vec![Baseline::new(t(0))];
        for (k, (lo, hi)) in [
            (1_000u64, 9_000u64),
            (40_000, 3_000_000),
            (500_000, 600_000),
            (7, 8),
            (90_000, 90_001),
            (1 << 30, 1 << 40),
            (2_000, 2_000_000_000),
        ]
        .into_iter()
        .enumerate()
        {
            let mut b = Baseline::new(t(0));
            for step in 0..5u64 {
                let mut h = hist_at(lo, 3 + k as u64);
                h.record_n(hi, 1 + step);
                h.record_n((lo + hi) / 2, 17 * step);
                b.learn(t(step * 13), h.nonzero(), Duration::from_secs(7));
            }
            bases.push(b);
        }
        for n in 1..=bases.len() {
            for first in 0..bases.len() {
                let picked: Vec<&Baseline> = bases.iter().cycle().skip(first).take(n).collect();
                let mut outs: Vec<Cumulative> = (0..n)
                    .map(|_| Cumulative::new([7.0; NUM_BUCKETS].into_iter()))
                    .collect();
                let mut batch = CumulativeBatch::default();
                for (b, out) in picked.iter().zip(outs.iter_mut()) {
                    batch.push(b, out);
                }
                batch.finish();
                for (b, out) in picked.iter().zip(&outs) {
                    let bits = |c: &[f64]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&out.cum),
                        bits(&b.cumulative().cum),
                        "{n} from {first}"
                    );
                }
            }
        }
    }
}
