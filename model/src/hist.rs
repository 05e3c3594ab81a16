//! Log-linear latency histograms: the one bucket scheme of tailtrap.
//!
//! Latency is in nanoseconds. There are [`NUM_BUCKETS`] buckets, 8 per power of two:
//! - `v < 16`: bucket `v` (exact);
//! - `v >= 16`: with `k = floor(log2 v)`, bucket `8*(k-2) + ((v >> (k-3)) & 7)`;
//! - indices past [`MAX_BUCKET`] are clamped to it (values from `15 * 2^32` ns up, ~64 s).
//!
//! Bucket `i >= 8` covers `[(8+j) * 2^(k-3), (9+j) * 2^(k-3))` with `k = i/8 + 2`, `j = i%8`,
//! so its width is at most 1/8 of its lower bound and a midpoint estimate is within 6.25%.
//! The BPF side mirrors this in `bpf/src/bpf/bucket.h`; `bpf/tests/bucket_agreement.rs`
//! checks both agree.
//! The interchange files (replay JSON Lines, storage) carry bucket indices of this scheme, so
//! it must never change.

use serde::{Deserialize, Serialize};

/// Number of buckets in every histogram.
pub const NUM_BUCKETS: usize = 272;
/// Index of the last bucket; it also holds every clamped value.
pub const MAX_BUCKET: usize = NUM_BUCKETS - 1;
/// Sub-buckets per power of two.
pub const SUB_BUCKETS: usize = 8;

/// Bucket index of a latency in ns.
pub const fn bucket_index(v: u64) -> usize {
    if v < 16 {
        return v as usize;
    }
    let k = 63 - v.leading_zeros() as u64;
    let idx = 8 * (k - 2) + ((v >> (k - 3)) & 7);
    if idx > MAX_BUCKET as u64 {
        MAX_BUCKET
    } else {
        idx as usize
    }
}

/// Smallest value (ns) that lands in bucket `i`. `i` must be `< NUM_BUCKETS`.
pub const fn bucket_lower(i: usize) -> u64 {
    if i < 16 {
        return i as u64;
    }
    let k = (i / 8 + 2) as u32;
    let j = (i % 8) as u64;
    (8 + j) << (k - 3)
}

/// First value (ns) past bucket `i` (exclusive bound). The last bucket is open-ended and
/// reports `u64::MAX`.
pub const fn bucket_upper(i: usize) -> u64 {
    if i >= MAX_BUCKET {
        return u64::MAX;
    }
    bucket_lower(i + 1)
}

/// A representative value for bucket `i`: its midpoint (its lower bound for the open last one).
pub fn bucket_mid(i: usize) -> f64 {
    if i >= MAX_BUCKET {
        return bucket_lower(MAX_BUCKET) as f64;
    }
    let lo = bucket_lower(i) as f64;
    let hi = bucket_upper(i) as f64;
    // Buckets below 16 hold one integer value each: that value is exact.
    if i < 16 {
        lo
    } else {
        (lo + hi) / 2.0
    }
}

/// A latency histogram: bucket counts plus the exact count and sum.
///
/// Serialised sparsely as `{"buckets": [[index, count], ...], "count": N, "sum_ns": S}`, the
/// shape the replay format uses; deserialising checks indices and that counts add up.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SparseHistogram", into = "SparseHistogram")]
pub struct Histogram {
    buckets: Box<[u64; NUM_BUCKETS]>,
    count: u64,
    sum_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("sum_ns", &self.sum_ns)
            .field("buckets", &self.nonzero().collect::<Vec<_>>())
            .finish()
    }
}

/// Result of [`Histogram::delta_since`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// What was added between the two snapshots.
    pub hist: Histogram,
    /// A counter went backwards (map recreated, agent restarted): `hist` is the whole newer
    /// snapshot, which is the best estimate of the interval.
    pub reset: bool,
}

/// A quantile estimate with the bounds of the bucket it fell in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuantileEstimate {
    /// The quantile asked for, in (0, 1].
    pub q: f64,
    /// Bucket index holding the quantile.
    pub bucket: usize,
    /// Point estimate (bucket midpoint), ns.
    pub value_ns: f64,
    /// Inclusive lower bound of the bucket, ns.
    pub lower_ns: u64,
    /// Exclusive upper bound of the bucket, ns (`u64::MAX` for the open last bucket).
    pub upper_ns: u64,
}

/// Errors building a histogram from external data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistError {
    /// A bucket index outside `0..NUM_BUCKETS`.
    #[error("bucket index {0} out of range (0..{NUM_BUCKETS})")]
    BucketOutOfRange(u64),
    /// `count` differs from the sum of bucket counts.
    #[error("count {count} does not equal the sum of bucket counts {buckets_sum}")]
    CountMismatch {
        /// The declared count.
        count: u64,
        /// The sum of the bucket counts.
        buckets_sum: u64,
    },
    /// The sum of bucket counts overflowed.
    #[error("bucket counts overflow")]
    Overflow,
    /// The slice given has the wrong length.
    #[error("expected {NUM_BUCKETS} buckets, got {0}")]
    WrongLength(usize),
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            buckets: Box::new([0; NUM_BUCKETS]),
            count: 0,
            sum_ns: 0,
        }
    }

    /// Build from dense bucket counts (e.g. summed from the kernel's per-CPU maps).
    /// `count` is taken as the sum of buckets.
    pub fn from_dense(buckets: &[u64], sum_ns: u64) -> Result<Self, HistError> {
        if buckets.len() != NUM_BUCKETS {
            return Err(HistError::WrongLength(buckets.len()));
        }
        let mut h = Self::new();
        let mut count: u64 = 0;
        for (dst, &c) in h.buckets.iter_mut().zip(buckets) {
            *dst = c;
            count = count.checked_add(c).ok_or(HistError::Overflow)?;
        }
        h.count = count;
        h.sum_ns = sum_ns;
        Ok(h)
    }

    /// Build from sparse `(index, count)` pairs; repeated indices add up.
    pub fn from_sparse(
        pairs: impl IntoIterator<Item = (u64, u64)>,
        count: u64,
        sum_ns: u64,
    ) -> Result<Self, HistError> {
        let mut h = Self::new();
        let mut total: u64 = 0;
        for (i, c) in pairs {
            let slot = usize::try_from(i)
                .ok()
                .and_then(|i| h.buckets.get_mut(i))
                .ok_or(HistError::BucketOutOfRange(i))?;
            *slot = slot.checked_add(c).ok_or(HistError::Overflow)?;
            total = total.checked_add(c).ok_or(HistError::Overflow)?;
        }
        if total != count {
            return Err(HistError::CountMismatch {
                count,
                buckets_sum: total,
            });
        }
        h.count = count;
        h.sum_ns = sum_ns;
        Ok(h)
    }

    /// Add one latency sample.
    pub fn record(&mut self, v_ns: u64) {
        self.record_n(v_ns, 1);
    }

    /// Add `n` samples of the same latency.
    pub fn record_n(&mut self, v_ns: u64, n: u64) {
        let i = bucket_index(v_ns);
        self.buckets[i] = self.buckets[i].saturating_add(n);
        self.count = self.count.saturating_add(n);
        self.sum_ns = self.sum_ns.saturating_add(v_ns.saturating_mul(n));
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of all samples, ns (exact, wrapping only past 584 years of latency).
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// Dense bucket counts.
    pub fn buckets(&self) -> &[u64; NUM_BUCKETS] {
        &self.buckets
    }

    /// `(index, count)` of every non-empty bucket, in index order.
    pub fn nonzero(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c != 0)
            .map(|(i, &c)| (i, c))
    }

    /// True when no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Exact mean latency, ns; `None` when empty.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }

    /// Add another histogram into this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Interval delta between two cumulative snapshots (`self` newer than `prev`).
    /// If any counter went backwards the source was reset; the newer snapshot is returned
    /// whole and `reset` is set.
    pub fn delta_since(&self, prev: &Histogram) -> Delta {
        let went_back = self.count < prev.count
            || self.sum_ns < prev.sum_ns
            || self
                .buckets
                .iter()
                .zip(prev.buckets.iter())
                .any(|(n, p)| n < p);
        if went_back {
            return Delta {
                hist: self.clone(),
                reset: true,
            };
        }
        let mut d = Histogram::new();
        for ((dst, n), p) in d
            .buckets
            .iter_mut()
            .zip(self.buckets.iter())
            .zip(prev.buckets.iter())
        {
            *dst = n - p;
        }
        d.count = self.count - prev.count;
        d.sum_ns = self.sum_ns - prev.sum_ns;
        Delta {
            hist: d,
            reset: false,
        }
    }

    /// Estimate quantile `q` (clamped to (0, 1]): the bucket where the cumulative count first
    /// reaches `ceil(q * count)`. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<QuantileEstimate> {
        if self.count == 0 {
            return None;
        }
        let q = if q.is_nan() {
            1.0
        } else {
            q.clamp(f64::MIN_POSITIVE, 1.0)
        };
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut cum = 0u64;
        for (i, &c) in self.buckets.iter().enumerate() {
            cum += c;
            if cum >= rank {
                return Some(QuantileEstimate {
                    q,
                    bucket: i,
                    value_ns: bucket_mid(i),
                    lower_ns: bucket_lower(i),
                    upper_ns: bucket_upper(i),
                });
            }
        }
        // Unreachable while count equals the bucket sum; fall back to the top bucket.
        Some(QuantileEstimate {
            q,
            bucket: MAX_BUCKET,
            value_ns: bucket_mid(MAX_BUCKET),
            lower_ns: bucket_lower(MAX_BUCKET),
            upper_ns: u64::MAX,
        })
    }

    /// Samples in bucket `first` and above.
    pub fn count_from_bucket(&self, first: usize) -> u64 {
        self.buckets.iter().skip(first).sum()
    }

    /// Samples certainly at or above `v_ns`: those in buckets whose lower bound is `>= v_ns`.
    /// (A bucket straddling `v_ns` is not counted, so this never overstates exceedance.)
    pub fn exceedances(&self, v_ns: u64) -> u64 {
        let i = bucket_index(v_ns);
        let first = if bucket_lower(i) >= v_ns { i } else { i + 1 };
        self.count_from_bucket(first)
    }

    /// Fold the 8 sub-buckets of each power of two: `(k, count)` for `[2^k, 2^(k+1))`, with
    /// `k = -1` standing for the value 0. Exact: no estimation is needed.
    pub fn to_log2(&self) -> Vec<(i32, u64)> {
        let mut out: Vec<(i32, u64)> = Vec::new();
        for (i, c) in self.nonzero() {
            let lo = bucket_lower(i);
            let k = if lo == 0 {
                -1
            } else {
                63 - lo.leading_zeros() as i32
            };
            match out.last_mut() {
                Some((lk, lc)) if *lk == k => *lc += c,
                _ => out.push((k, c)),
            }
        }
        out
    }
}

/// Wire form of [`Histogram`]: sparse `[index, count]` pairs.
#[derive(Serialize, Deserialize)]
struct SparseHistogram {
    buckets: Vec<(u64, u64)>,
    count: u64,
    sum_ns: u64,
}

impl TryFrom<SparseHistogram> for Histogram {
    type Error = HistError;
    fn try_from(s: SparseHistogram) -> Result<Self, HistError> {
        Histogram::from_sparse(s.buckets, s.count, s.sum_ns)
    }
}

impl From<Histogram> for SparseHistogram {
    fn from(h: Histogram) -> Self {
        SparseHistogram {
            buckets: h.nonzero().map(|(i, c)| (i as u64, c)).collect(),
            count: h.count,
            sum_ns: h.sum_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        for v in 0..16u64 {
            assert_eq!(bucket_index(v), v as usize);
            assert_eq!(bucket_lower(v as usize), v);
            assert_eq!(bucket_upper(v as usize), v + 1);
        }
    }

    #[test]
    fn every_boundary_maps_to_its_bucket() {
        for i in 0..NUM_BUCKETS {
            let lo = bucket_lower(i);
            assert_eq!(bucket_index(lo), i, "lower bound of {i}");
            if i > 0 {
                assert_eq!(bucket_index(lo - 1), i - 1, "value below bucket {i}");
            }
            if i < MAX_BUCKET {
                let hi = bucket_upper(i);
                assert!(hi > lo);
                assert_eq!(bucket_index(hi - 1), i, "last value of {i}");
                // relative width at most 1/8 past the exact range
                if i >= 16 {
                    assert!((hi - lo) * 8 <= lo, "bucket {i} too wide");
                }
            }
        }
    }

    #[test]
    fn formula_examples() {
        assert_eq!(bucket_index(16), 16);
        assert_eq!(bucket_index(17), 16);
        assert_eq!(bucket_index(18), 17);
        assert_eq!(bucket_index(31), 23);
        assert_eq!(bucket_index(32), 24);
        assert_eq!(bucket_index(1000), 8 * 7 + ((1000 >> 6) & 7) as usize);
        assert_eq!(bucket_lower(271), 15 << 32);
    }

    #[test]
    fn clamps_large_values() {
        assert_eq!(bucket_index(1 << 36), MAX_BUCKET);
        assert_eq!(bucket_index(u64::MAX), MAX_BUCKET);
        assert_eq!(bucket_index((15 << 32) - 1), MAX_BUCKET - 1);
        assert_eq!(bucket_upper(MAX_BUCKET), u64::MAX);
    }

    #[test]
    fn log2_merge_matches_power_of_two_buckets() {
        let mut h = Histogram::new();
        let values = [
            0u64,
            1,
            2,
            3,
            7,
            8,
            15,
            16,
            31,
            32,
            1000,
            1023,
            1024,
            5_000_000,
            1 << 40,
        ];
        for &v in &values {
            h.record(v);
        }
        let log2 = h.to_log2();
        let mut expect: Vec<(i32, u64)> = Vec::new();
        for &v in &values {
            let k = if v == 0 {
                -1
            } else {
                63 - v.leading_zeros() as i32
            };
            // clamped values sit in the last bucket, whose power of two is 35
            let k = k.min(35);
            match expect.last_mut() {
                Some((lk, lc)) if *lk == k => *lc += 1,
                _ => expect.push((k, 1)),
            }
        }
        assert_eq!(log2, expect);
    }

    #[test]
    fn quantiles_and_mean() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 1000);
        assert_eq!(h.mean_ns(), Some(500_500.0));
        let p50 = h.quantile(0.5).unwrap();
        assert!(p50.lower_ns <= 500_000 && 500_000 < p50.upper_ns, "{p50:?}");
        let p99 = h.quantile(0.99).unwrap();
        assert!(p99.lower_ns <= 990_000 && 990_000 < p99.upper_ns, "{p99:?}");
        assert!((p99.value_ns - 990_000.0).abs() / 990_000.0 < 0.0625);
        assert_eq!(h.quantile(1.0).unwrap().bucket, bucket_index(1_000_000));
        assert!(Histogram::new().quantile(0.5).is_none());
    }

    #[test]
    fn delta_and_reset() {
        let mut a = Histogram::new();
        a.record(100);
        let mut b = a.clone();
        b.record(5000);
        b.record(5000);
        let d = b.delta_since(&a);
        assert!(!d.reset);
        assert_eq!(d.hist.count(), 2);
        assert_eq!(d.hist.sum_ns(), 10_000);
        assert_eq!(d.hist.buckets()[bucket_index(5000)], 2);
        let d = a.delta_since(&b);
        assert!(d.reset);
        assert_eq!(d.hist, a);
    }

    #[test]
    fn exceedances_never_overstate() {
        let mut h = Histogram::new();
        h.record(999);
        h.record(1000);
        h.record(2000);
        // 1000 shares bucket [960, 1024) with 999: neither is certainly >= 1000
        assert_eq!(h.exceedances(1000), 1);
        assert_eq!(h.exceedances(992), 1);
        assert_eq!(h.exceedances(960), 3);
        assert_eq!(h.exceedances(0), 3);
    }

    #[test]
    fn merge_adds() {
        let mut a = Histogram::new();
        a.record(10);
        let mut b = Histogram::new();
        b.record(20);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.sum_ns(), 30);
    }

    #[test]
    fn sparse_serde_round_trip_and_validation() {
        let mut h = Histogram::new();
        h.record(42);
        h.record_n(1_000_000, 3);
        let s = serde_json::to_string(&h).unwrap();
        assert!(s.contains("\"buckets\":[["), "{s}");
        let back: Histogram = serde_json::from_str(&s).unwrap();
        assert_eq!(back, h);
        let bad = r#"{"buckets":[[5,2]],"count":3,"sum_ns":10}"#;
        let err = serde_json::from_str::<Histogram>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not equal"), "{err}");
        let bad = r#"{"buckets":[[272,1]],"count":1,"sum_ns":10}"#;
        let err = serde_json::from_str::<Histogram>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("out of range"), "{err}");
    }
}
