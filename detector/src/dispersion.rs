//! How clustered one key's exceedances of each watched quantile are in normal times.
//!
//! The exact binomial test counts a window's samples above the baseline's quantile bucket as
//! if each packet were slow on its own. Real tails are not like that: one scheduler hiccup
//! or one busy burst of the reader delays every packet queued at that moment, so slow packets
//! arrive in clusters, and a window holding one such cluster looks, packet by packet, far
//! more surprising than it is. A 2-CPU host running nginx measured it: clusters of 3 to 10
//! reads over 500 µs a few times a minute, each making a p99.9 "shift" with a p-value of
//! 1e-9 (docs/detector.md, "Clustered tails").
//!
//! So each key learns, per quantile and over the intervals its baseline learns from, how
//! much more an interval's exceedance count varies than the binomial the test assumes. It
//! keeps that as the correlation `rho` of two samples of one interval (the beta-binomial
//! model: variance `n p (1 - p) (1 + (n - 1) rho)`), not as a plain variance ratio, because
//! the ratio grows with the interval's size: a key that learnt on thousands of fast reads a
//! second and is then tested on fifty slow ones must not weigh those fifty as if they were
//! thousands ([`Dispersion::rho`], [`factor`]). `rho` is 0 for independent packets; for rare
//! clustered events `1 + (n - 1) rho` is about the mean cluster size. The test then weighs a
//! window's evidence as that many times fewer independent samples. A factor is never below
//! 1, so the correction only ever makes the test stricter, and Holm's guarantee still holds.

use std::time::{Duration, SystemTime};

use crate::baseline::Cumulative;

/// The binomial variance (in squared samples) a quantile's intervals must have added up
/// before its factor is used: about ten expected exceedances at a far quantile. Less says
/// too little about clustering; the factor is 1 until then.
const MIN_VARIANCE: f64 = 10.0;

/// Learnt intervals before a factor is used: the first ones after the warm-up also follow
/// the baseline still settling (its quantile buckets move), which is no clustering.
const MIN_INTERVALS: u32 = 60;

/// The largest factor: a tail so clustered would otherwise hide even a shift fifty times
/// its usual burst.
const MAX_FACTOR: f64 = 50.0;

/// How many samples weigh as one independent sample in a window whose intervals hold
/// `interval_size` samples on average (weighted by their samples), given `rho`: between 1
/// and `MAX_FACTOR`.
pub(crate) fn factor(rho: f64, interval_size: f64) -> f64 {
    (1.0 + rho * (interval_size - 1.0).max(0.0)).clamp(1.0, MAX_FACTOR)
}

/// One quantile's faded sums over learnt intervals: of each interval's exceedances `x`
/// (samples above the baseline's quantile bucket) and sample count `n`.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    x: f64,
    n: f64,
    xx: f64,
    xn: f64,
    nn: f64,
}

impl Sums {
    fn of(x: u64, n: u64) -> Sums {
        let (x, n) = (x as f64, n as f64);
        Sums {
            x,
            n,
            xx: x * x,
            xn: x * n,
            nn: n * n,
        }
    }

    fn fade(&mut self, by: f64) {
        for v in [
            &mut self.x,
            &mut self.n,
            &mut self.xx,
            &mut self.xn,
            &mut self.nn,
        ] {
            *v *= by;
        }
    }

    fn add(&mut self, o: &Sums) {
        self.x += o.x;
        self.n += o.n;
        self.xx += o.xx;
        self.xn += o.xn;
        self.nn += o.nn;
    }

    /// The moment estimate of `rho`, and the binomial variance it rests on, with `p` the
    /// intervals' own share above the bucket. Their own share, not the baseline's: a
    /// baseline that learnt a slow start (a service started during a fault) expects more
    /// exceedances than quiet intervals have, and that gap is no clustering.
    fn rho(&self) -> (f64, f64) {
        if self.n <= 0.0 {
            return (0.0, 0.0);
        }
        let p = self.x / self.n;
        let pq = p * (1.0 - p);
        let squared = self.xx - 2.0 * p * self.xn + p * p * self.nn;
        let variance = self.n * pq;
        // Sum over intervals of n (n - 1): the pairs of samples within one interval.
        let pairs = self.nn - self.n;
        if pq <= 0.0 || pairs <= 0.0 {
            return (0.0, variance);
        }
        (
            ((squared - variance) / (pq * pairs)).clamp(0.0, 1.0),
            variance,
        )
    }
}

/// The per-quantile dispersion of one (service, probe) key. Not stored with the baseline: a
/// restarted daemon relearns it within seconds on a busy key (factor 1 until then).
#[derive(Debug, Clone, Default)]
pub(crate) struct Dispersion {
    /// `(q as bits, sums)`, one per quantile ever noted.
    sums: Vec<(u64, Sums)>,
    /// This interval's figures per quantile, folded in by `learn` or dropped by `hold`.
    pending: Vec<(u64, Sums)>,
    last: Option<SystemTime>,
    /// Intervals learnt, up to `MIN_INTERVALS`.
    intervals: u32,
}

impl Dispersion {
    /// The learnt correlation of two samples of one interval for quantile `q` (0: the
    /// samples are independent, or too little is known yet).
    pub(crate) fn rho(&self, q: f64) -> f64 {
        if self.intervals < MIN_INTERVALS {
            return 0.0;
        }
        let bits = q.to_bits();
        let Some((_, s)) = self.sums.iter().find(|(b, _)| *b == bits) else {
            return 0.0;
        };
        match s.rho() {
            (rho, variance) if variance >= MIN_VARIANCE => rho,
            _ => 0.0,
        }
    }

    /// Note the newest interval (`newest`, its `(bucket, count)` pairs) against the
    /// baseline `base` for every quantile of `quantiles`; `learn` keeps it.
    pub(crate) fn note(
        &mut self,
        base: &Cumulative,
        newest: impl Iterator<Item = (usize, u64)> + Clone,
        quantiles: &[f64],
    ) {
        self.pending.clear();
        let n: u64 = newest.clone().map(|(_, c)| c).sum();
        if n == 0 {
            return;
        }
        for &q in quantiles {
            let Some((bucket, _)) = base.quantile(q) else {
                continue;
            };
            let above: u64 = newest
                .clone()
                .filter(|&(i, _)| i > bucket)
                .map(|(_, c)| c)
                .sum();
            self.pending.push((q.to_bits(), Sums::of(above, n)));
        }
    }

    /// Fold the noted interval in, fading the past with the baseline's `half_life`.
    pub(crate) fn learn(&mut self, now: SystemTime, half_life: Duration) {
        let fade = match self.last {
            Some(last) => {
                let dt = now.duration_since(last).unwrap_or_default().as_secs_f64();
                0.5f64.powf(dt / half_life.as_secs_f64().max(1e-9))
            }
            None => 1.0,
        };
        self.last = Some(now);
        if !self.pending.is_empty() {
            self.intervals = (self.intervals + 1).min(MIN_INTERVALS);
        }
        for (_, s) in &mut self.sums {
            s.fade(fade);
        }
        for (bits, add) in self.pending.drain(..) {
            match self.sums.iter_mut().find(|(b, _)| *b == bits) {
                Some((_, s)) => s.add(&add),
                None => self.sums.push((bits, add)),
            }
        }
    }

    /// The interval is not learnt (the service is hot or its incident open): drop it, and
    /// pause the fading as the baseline does.
    pub(crate) fn hold(&mut self, now: SystemTime) {
        self.pending.clear();
        if self.last.is_some() {
            self.last = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::hist::NUM_BUCKETS;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    /// A baseline with 999 of every 1000 samples in bucket 100 and 1 in bucket 150.
    fn base() -> Cumulative {
        let mut counts = [0u64; NUM_BUCKETS];
        counts[100] = 999_000;
        counts[150] = 1_000;
        Cumulative::from_counts(&counts)
    }

    fn learn_intervals(d: &mut Dispersion, slow_per_interval: impl Fn(u64) -> u64) {
        let b = base();
        for s in 0..600 {
            let slow = slow_per_interval(s);
            let newest = [(100usize, 1000 - slow), (150usize, slow)];
            d.note(&b, newest.iter().copied(), &[0.999]);
            d.learn(t(s), Duration::from_secs(3600));
        }
    }

    #[test]
    fn independent_exceedances_keep_the_test_as_it_was() {
        // One slow sample an interval, as the baseline expects: no over-dispersion.
        let mut d = Dispersion::default();
        learn_intervals(&mut d, |_| 1);
        assert_eq!(d.rho(0.999), 0.0);
        assert_eq!(factor(d.rho(0.999), 1000.0), 1.0);
    }

    #[test]
    fn clustered_exceedances_weigh_as_fewer_samples() {
        // The same one slow sample per interval on average, but as a cluster of 10 every
        // tenth interval: the factor is about the cluster's size.
        let mut d = Dispersion::default();
        learn_intervals(&mut d, |s| if s % 10 == 0 { 10 } else { 0 });
        let f = factor(d.rho(0.999), 1000.0);
        assert!((8.0..=11.0).contains(&f), "factor {f}");
        // Windows of intervals as large as the learnt ones weigh their evidence that much
        // less; windows of much smaller intervals (a key now seeing 10 reads a second)
        // hardly less: the clustering is a share of an interval's samples.
        let small = factor(d.rho(0.999), 10.0);
        assert!((1.0..1.1).contains(&small), "factor {small}");
        // A quantile never noted is tested as before.
        assert_eq!(d.rho(0.99), 0.0);
    }

    #[test]
    fn too_little_evidence_and_held_intervals_change_nothing() {
        let b = base();
        let mut d = Dispersion::default();
        // Intervals with a cluster, but fewer than MIN_INTERVALS of them.
        for s in 0..u64::from(MIN_INTERVALS - 1) {
            d.note(
                &b,
                [(100usize, 990u64), (150usize, 10)].into_iter(),
                &[0.999],
            );
            d.learn(t(s), Duration::from_secs(3600));
        }
        assert_eq!(d.rho(0.999), 0.0);
        // Held intervals (a hot window, an open incident) are never learnt.
        let mut held = Dispersion::default();
        for s in 0..600 {
            held.note(
                &b,
                [(100usize, 990u64), (150usize, 10)].into_iter(),
                &[0.999],
            );
            held.hold(t(s));
        }
        assert_eq!(held.rho(0.999), 0.0);
    }
}
