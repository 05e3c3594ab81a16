//! The evaluation window of one (service, probe): the most recent intervals, kept sparse.
//!
//! A window covers the intervals that ended within the last `window`; when those hold fewer
//! than `min_samples` it reaches further back, up to `max_window`. Busy services therefore get
//! short windows (fast detection) and quiet ones long windows (enough samples for a test).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::hist::{Histogram, NUM_BUCKETS};

/// One interval: when it started and ended, and its non-empty buckets.
#[derive(Debug, Clone)]
struct Interval {
    start: SystemTime,
    end: SystemTime,
    count: u64,
    /// `(bucket, count)`; a count above `u32::MAX` is split over repeated entries.
    buckets: Box<[(u16, u32)]>,
}

/// A window summed up for testing.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Dense bucket counts over the window.
    pub buckets: [u64; NUM_BUCKETS],
    /// Samples in the window.
    pub count: u64,
    /// Start of the oldest interval in the window.
    pub start: SystemTime,
}

/// Recent intervals, newest last.
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    intervals: VecDeque<Interval>,
}

impl Window {
    /// Add an interval; a second histogram for the same interval end adds up with the first.
    pub(crate) fn push(&mut self, start: SystemTime, end: SystemTime, hist: &Histogram) {
        if let Some(last) = self.intervals.back_mut().filter(|iv| iv.end == end) {
            let mut merged = Histogram::new();
            for &(i, c) in last.buckets.iter() {
                merged.record_n(crate::hist::bucket_lower(usize::from(i)), u64::from(c));
            }
            merged.merge(hist);
            let start = last.start;
            self.intervals.pop_back();
            self.push(start, end, &merged);
            return;
        }
        let mut buckets = Vec::new();
        for (i, c) in hist.nonzero() {
            let mut left = c;
            while left > 0 {
                let part = left.min(u64::from(u32::MAX));
                buckets.push((i as u16, part as u32));
                left -= part;
            }
        }
        self.intervals.push_back(Interval {
            start,
            end,
            count: hist.count(),
            buckets: buckets.into_boxed_slice(),
        });
    }

    /// Sum the window ending at `now`, dropping intervals no later window can need. `None`
    /// when the window holds fewer than `min_samples`.
    pub(crate) fn evaluate(
        &mut self,
        now: SystemTime,
        window: Duration,
        max_window: Duration,
        min_samples: u64,
    ) -> Option<Snapshot> {
        let age = |iv: &Interval| now.duration_since(iv.end).unwrap_or(Duration::ZERO);
        while self
            .intervals
            .front()
            .is_some_and(|iv| age(iv) >= max_window)
        {
            self.intervals.pop_front();
        }
        // Walk back from the newest interval: take everything younger than `window`, then
        // older intervals only while samples are still short.
        let mut count = 0u64;
        let mut first = self.intervals.len();
        for (i, iv) in self.intervals.iter().enumerate().rev() {
            if age(iv) >= window && count >= min_samples {
                break;
            }
            count += iv.count;
            first = i;
        }
        // A later window never reaches further back than this one (it only gains samples
        // and time), so older intervals can go when this one is complete.
        if count >= min_samples {
            self.intervals.drain(..first);
            first = 0;
        }
        if count < min_samples {
            return None;
        }
        let mut buckets = [0u64; NUM_BUCKETS];
        for iv in self.intervals.iter().skip(first) {
            for &(i, c) in iv.buckets.iter() {
                buckets[usize::from(i)] += u64::from(c);
            }
        }
        let start = self.intervals.get(first).map_or(now, |iv| iv.start);
        Some(Snapshot {
            buckets,
            count,
            start,
        })
    }

    /// `(bucket, count)` of the interval ending at `end`, if it was pushed.
    pub(crate) fn interval_ending(
        &self,
        end: SystemTime,
    ) -> Option<impl Iterator<Item = (usize, u64)> + '_> {
        self.intervals.back().filter(|iv| iv.end == end).map(|iv| {
            iv.buckets
                .iter()
                .map(|&(i, c)| (usize::from(i), u64::from(c)))
        })
    }

    /// Approximate heap bytes held, for the memory figure of the benchmark.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.intervals.capacity() * std::mem::size_of::<Interval>()
            + self
                .intervals
                .iter()
                .map(|iv| iv.buckets.len() * std::mem::size_of::<(u16, u32)>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

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
        let snap = w
            .evaluate(t(20), Duration::from_secs(5), Duration::from_secs(60), 500)
            .unwrap();
        assert_eq!(snap.count, 5000);
        assert_eq!(snap.start, t(15));
        assert_eq!(w.intervals.len(), 5, "older intervals are dropped");

        let mut w = Window::default();
        for s in 1..=100 {
            w.push(t(s - 1), t(s), &hist(10));
        }
        let snap = w
            .evaluate(t(100), Duration::from_secs(5), Duration::from_secs(60), 500)
            .unwrap();
        assert_eq!(snap.count, 500, "grows to 50 intervals of 10 samples");
        assert_eq!(snap.start, t(50));
        // max_window caps it: 30 s hold only 300 samples
        assert!(w
            .evaluate(t(100), Duration::from_secs(5), Duration::from_secs(30), 500)
            .is_none());
    }

    #[test]
    fn two_pushes_for_one_interval_add_up() {
        let mut w = Window::default();
        w.push(t(0), t(1), &hist(300));
        w.push(t(0), t(1), &hist(200));
        let snap = w
            .evaluate(t(1), Duration::from_secs(5), Duration::from_secs(60), 1)
            .unwrap();
        assert_eq!(snap.count, 500);
        assert_eq!(
            w.interval_ending(t(1))
                .map(|it| it.map(|(_, c)| c).sum::<u64>()),
            Some(500)
        );
        assert!(w.interval_ending(t(2)).is_none());
    }

    #[test]
    fn huge_counts_are_kept_exactly() {
        let mut w = Window::default();
        let n = u64::from(u32::MAX) * 2 + 7;
        w.push(t(0), t(1), &hist(n));
        let snap = w
            .evaluate(t(1), Duration::from_secs(5), Duration::from_secs(60), 1)
            .unwrap();
        assert_eq!(snap.count, n);
        assert_eq!(snap.buckets.iter().sum::<u64>(), n);
    }
}
