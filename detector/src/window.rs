//! The evaluation window of one (service, probe): the most recent intervals, kept sparse.
//!
//! A window covers the intervals that ended within the last `window`; when those hold fewer
//! than `min_samples` it reaches further back, up to `max_window`. Busy services therefore get
//! short windows (fast detection) and quiet ones long windows (enough samples for a test).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use model::hist::{Histogram, NUM_BUCKETS};

/// One interval: when it started and ended, and its non-empty buckets.
#[derive(Debug, Clone)]
struct Interval {
    start: SystemTime,
    end: SystemTime,
    count: u64,
    /// `(bucket, count)`; a count above `u32::MAX` is split over repeated entries.
    buckets: Vec<(u16, u32)>,
}

/// A window summed up for testing.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// Dense bucket counts over the window.
    pub buckets: [u64; NUM_BUCKETS],
    /// Samples in the window.
    pub count: u64,
    /// The sum of the squares of its intervals' sample counts: with `count`, how large its
    /// intervals are on average, weighted by their samples (what clustering within an
    /// interval scales with).
    pub count_sq: u128,
    /// Start of the oldest interval in the window.
    pub start: SystemTime,
}

impl Snapshot {
    /// A buffer to sum windows into.
    pub(crate) fn empty() -> Self {
        Snapshot {
            buckets: [0; NUM_BUCKETS],
            count: 0,
            count_sq: 0,
            start: UNIX_EPOCH,
        }
    }

    /// The intervals' mean sample count, each interval weighted by its samples.
    pub(crate) fn interval_size(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.count_sq as f64 / self.count as f64
    }

    fn add(&mut self, iv: &Interval) {
        for &(i, c) in &iv.buckets {
            self.buckets[usize::from(i)] += u64::from(c);
        }
        self.count += iv.count;
        self.count_sq += u128::from(iv.count) * u128::from(iv.count);
    }

    /// Take out an interval added before (exact: the sums hold its counts).
    fn remove(&mut self, iv: &Interval) {
        for &(i, c) in &iv.buckets {
            self.buckets[usize::from(i)] -= u64::from(c);
        }
        self.count -= iv.count;
        self.count_sq -= u128::from(iv.count) * u128::from(iv.count);
    }
}

/// How far a window reaches: `window`, grown towards `max_window` to hold `min_samples`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reach {
    pub window: Duration,
    pub max_window: Duration,
    pub min_samples: u64,
}

/// Recent intervals, newest last.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    intervals: VecDeque<Interval>,
    /// The bucket buffer of the last dropped interval, reused by the next push.
    spare: Vec<(u16, u32)>,
    /// Running sum of every interval held (`start` is set when evaluated): a complete
    /// window is all of them once the older ones are dropped, so evaluating needs no
    /// re-summing or copying per interval.
    held: Box<Snapshot>,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            intervals: VecDeque::new(),
            spare: Vec::new(),
            held: Box::new(Snapshot::empty()),
        }
    }
}

impl Window {
    /// Add an interval; a second histogram for the same interval end adds up with the first.
    pub(crate) fn push(&mut self, start: SystemTime, end: SystemTime, hist: &Histogram) {
        self.push_buckets(start, end, hist.nonzero(), hist.count());
    }

    /// [`Window::push`] from the interval's non-empty `(bucket, count)` pairs and its count.
    pub(crate) fn push_buckets(
        &mut self,
        start: SystemTime,
        end: SystemTime,
        nonzero: impl Iterator<Item = (usize, u64)>,
        count: u64,
    ) {
        if let Some(last) = self.intervals.back_mut().filter(|iv| iv.end == end) {
            let mut merged = Histogram::new();
            for &(i, c) in last.buckets.iter() {
                merged.record_n(model::hist::bucket_lower(usize::from(i)), u64::from(c));
            }
            for (i, c) in nonzero {
                merged.record_n(model::hist::bucket_lower(i), c);
            }
            let start = last.start;
            if let Some(iv) = self.intervals.pop_back() {
                self.held.remove(&iv);
            }
            self.push(start, end, &merged);
            return;
        }
        let mut buckets = std::mem::take(&mut self.spare);
        buckets.clear();
        for (i, c) in nonzero {
            let mut left = c;
            while left > 0 {
                let part = left.min(u64::from(u32::MAX));
                buckets.push((i as u16, part as u32));
                left -= part;
            }
        }
        let iv = Interval {
            start,
            end,
            count,
            buckets,
        };
        self.held.add(&iv);
        self.intervals.push_back(iv);
    }

    /// Drop intervals no window ending at `now` or later can need, then return the sum of
    /// the window ending at `now`; `None` when it holds fewer than `min_samples`.
    pub(crate) fn evaluate(&mut self, now: SystemTime, reach: Reach) -> Option<&Snapshot> {
        let (first, complete) = self.reach_back(now, reach);
        // A later window never reaches further back than a complete one (it only gains
        // samples and time), so everything before it can go; past max_window always can.
        let drop = if complete {
            first
        } else {
            self.intervals
                .iter()
                .take_while(|iv| age(now, iv) >= reach.max_window)
                .count()
        };
        for iv in self.intervals.drain(..drop) {
            self.held.remove(&iv);
            self.spare = iv.buckets;
        }
        if !complete {
            return None;
        }
        // Complete: `first` intervals were dropped, so the window is everything held.
        self.held.start = self.intervals.front().map_or(now, |iv| iv.start);
        Some(&self.held)
    }

    /// The sum the last [`Window::evaluate`] returned, while nothing has been pushed since
    /// (and when it returned one): the same window read again without a borrow held.
    pub(crate) fn evaluated(&self) -> &Snapshot {
        &self.held
    }

    /// Sum the window ending at `now` into `out` without changing anything.
    pub(crate) fn sum(&self, now: SystemTime, reach: Reach, out: &mut Snapshot) -> bool {
        let (first, complete) = self.reach_back(now, reach);
        if !complete {
            return false;
        }
        out.buckets = [0; NUM_BUCKETS];
        out.count = 0;
        out.count_sq = 0;
        for iv in self.intervals.iter().skip(first) {
            for &(i, c) in &iv.buckets {
                out.buckets[usize::from(i)] += u64::from(c);
            }
            out.count += iv.count;
            out.count_sq += u128::from(iv.count) * u128::from(iv.count);
        }
        out.start = self.intervals.get(first).map_or(now, |iv| iv.start);
        true
    }

    /// Index of the oldest interval in the window ending at `now`, and whether the window
    /// holds `min_samples`. Takes everything younger than `window`, then older intervals
    /// (younger than `max_window`) only while samples are short.
    fn reach_back(&self, now: SystemTime, reach: Reach) -> (usize, bool) {
        let mut count = 0u64;
        let mut first = self.intervals.len();
        for (i, iv) in self.intervals.iter().enumerate().rev() {
            let a = age(now, iv);
            if a >= reach.max_window || (a >= reach.window && count >= reach.min_samples) {
                break;
            }
            count += iv.count;
            first = i;
        }
        (first, count >= reach.min_samples)
    }

    /// `(bucket, count)` of the newest interval.
    pub(crate) fn newest(&self) -> Option<impl Iterator<Item = (usize, u64)> + Clone + '_> {
        self.intervals.back().map(|iv| {
            iv.buckets
                .iter()
                .map(|&(i, c)| (usize::from(i), u64::from(c)))
        })
    }

    /// Approximate heap bytes held, for the memory figure of the benchmark.
    pub(crate) fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(u16, u32)>();
        self.intervals.capacity() * std::mem::size_of::<Interval>()
            + self
                .intervals
                .iter()
                .map(|iv| iv.buckets.capacity() * entry)
                .sum::<usize>()
            + self.spare.capacity() * entry
            + std::mem::size_of::<Snapshot>()
    }
}

fn age(now: SystemTime, iv: &Interval) -> Duration {
    now.duration_since(iv.end).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(window: u64, max_window: u64, min_samples: u64) -> Reach {
        Reach {
            window: Duration::from_secs(window),
            max_window: Duration::from_secs(max_window),
            min_samples,
        }
    }

    fn eval(w: &mut Window, now: SystemTime, r: Reach) -> Option<Snapshot> {
        let got = w.evaluate(now, r).cloned();
        // The running sums give what summing the window afresh gives.
        let mut fresh = Snapshot::empty();
        assert_eq!(w.sum(now, r, &mut fresh), got.is_some());
        if let Some(g) = &got {
            assert_eq!(
                (g.buckets, g.count, g.start),
                (fresh.buckets, fresh.count, fresh.start)
            );
        }
        got
    }

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn hist(n: u64) -> Histogram {
        let mut h = Histogram::new();
        h.record_n(50_000, n);
        h
    }

    #[test]
    fn busy_window_is_short_quiet_window_grows() {
        let mut w = Window::default();
        for s in 1..=20 {
            w.push(t(s - 1), t(s), &hist(1000));
        }
        let snap = eval(&mut w, t(20), reach(5, 60, 500)).unwrap();
        assert_eq!(snap.count, 5000);
        assert_eq!(snap.start, t(15));
        assert_eq!(w.intervals.len(), 5, "older intervals are dropped");

        let mut w = Window::default();
        for s in 1..=100 {
            w.push(t(s - 1), t(s), &hist(10));
        }
        let snap = eval(&mut w, t(100), reach(5, 60, 500)).unwrap();
        assert_eq!(snap.count, 500, "grows to 50 intervals of 10 samples");
        assert_eq!(snap.start, t(50));
        // max_window caps it: 30 s hold only 300 samples
        assert!(eval(&mut w, t(100), reach(5, 30, 500)).is_none());
    }

    #[test]
    fn two_pushes_for_one_interval_add_up() {
        let mut w = Window::default();
        w.push(t(0), t(1), &hist(300));
        w.push(t(0), t(1), &hist(200));
        let snap = eval(&mut w, t(1), reach(5, 60, 1)).unwrap();
        assert_eq!(snap.count, 500);
        assert_eq!(
            w.newest().map(|it| it.map(|(_, c)| c).sum::<u64>()),
            Some(500)
        );
    }

    #[test]
    fn huge_counts_are_kept_exactly() {
        let mut w = Window::default();
        let n = u64::from(u32::MAX) * 2 + 7;
        w.push(t(0), t(1), &hist(n));
        let snap = eval(&mut w, t(1), reach(5, 60, 1)).unwrap();
        assert_eq!(snap.count, n);
        assert_eq!(snap.buckets.iter().sum::<u64>(), n);
    }
}
