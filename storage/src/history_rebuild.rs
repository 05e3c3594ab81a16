//! After a crash, the coarser history levels are completed from the finest one.
//!
//! The coarser levels' unfinished chunks are written every [`COARSE_WRITE_EVERY`] finest
//! chunks, the finest level's every chunk (both in one atomic batch), so a crash leaves
//! the coarser levels up to that many minutes behind the finest. The finest level holds
//! those intervals for hours, the coarser ones for days: without this pass, each crash
//! would leave a hole of up to ten minutes in the long-range history once the finest
//! level's copy expires.
//!
//! A coarser level's newest point `P` holds the finest points from its start up to where
//! the level was last written. Adding the finest points from `P`'s start one by one until
//! they equal `P` (every bucket, count and sum) finds that place; the finest points after
//! it are what the level lacks, and are merged into it. A level that was written when
//! the store last closed finds nothing after its newest point, so the pass is a no-op
//! after a clean stop, and done twice it finds nothing the second time. A stream whose
//! points do not add up (a changed level configuration, records removed) is left as is.
//!
//! [`COARSE_WRITE_EVERY`]: crate::history_buffer::COARSE_WRITE_EVERY

use std::collections::btree_map::{BTreeMap, Entry};

use model::{Histogram, Probe};

use crate::engine::T;
use crate::error::Result;
use crate::history::Pending;
use crate::history_buffer::COARSE_WRITE_EVERY;
use crate::history_chunk::{decode_record, Chunk};
use crate::keys;
use crate::store::{HistoryRebuild, Store};

impl Store {
    /// Complete every coarser history level from the finest one (see the module doc).
    /// Run at open, before anything is recorded.
    pub(crate) fn rebuild_coarse_history(&self) -> Result<HistoryRebuild> {
        let mut done = HistoryRebuild::default();
        let levels = self.history_levels();
        let Some(&(_, span0)) = levels.first() else {
            return Ok(done);
        };
        if levels.len() < 2 {
            return Ok(done);
        }
        // The writer's lock order: its buffer, then the engine.
        let mut buf = self.history_write.lock().unwrap_or_else(|e| e.into_inner());
        let eng = self.engine();
        let tree = eng.tree(T::History);
        for (service, probe) in self.counted(finest_streams(tree))? {
            for (level, &(res, span)) in levels.iter().enumerate().skip(1) {
                // The level index fits a byte: config validation caps the number of levels.
                let lvl = level as u8;
                let coarse = keys::history_stream(lvl, &service, probe);
                let Some((key, value)) = self.counted(
                    tree.scan_prefix(&coarse)
                        .next_back()
                        .transpose()
                        .map_err(Into::into),
                )?
                else {
                    continue;
                };
                let Some((_, _, _, cstart)) = keys::parse_history(&key) else {
                    continue;
                };
                let Ok(stored) = decode_record(cstart, &value) else {
                    continue;
                };
                let Some((newest, newest_hist)) = stored.into_iter().max_by_key(|(t, _)| *t) else {
                    continue;
                };
                // The finest points from the newest coarse point's start on. A crash leaves
                // the coarser levels at most COARSE_WRITE_EVERY finest chunks behind, so
                // finest records past that are not a crash's gap: reading stops there.
                let from = newest - newest % span0;
                let limit = newest
                    .saturating_add(res)
                    .saturating_add(COARSE_WRITE_EVERY.saturating_add(1).saturating_mul(span0));
                let (finest, beyond) =
                    self.counted(finest_points(tree, &service, probe, from, limit))?;
                let finest: Vec<_> = finest.into_iter().filter(|(t, _)| *t >= newest).collect();
                let covered = covered_prefix(&finest, newest + res, &newest_hist);
                let Some(covered) = covered.filter(|_| !beyond) else {
                    done.inconsistent += 1;
                    tracing::warn!(
                        %service, %probe, level,
                        "coarse history does not add up from the finest level; left as is"
                    );
                    continue;
                };
                let missing = &finest[covered..];
                if missing.is_empty() {
                    continue;
                }
                let pending =
                    self.stage_merged(tree, &service, probe, lvl, (res, span), missing)?;
                self.apply_pending(tree, &mut buf, pending)?;
                done.points += missing.len() as u64;
                done.streams += 1;
            }
        }
        Ok(done)
    }

    /// Stage `points` (finest-level points, in time order) merged into level `lvl` of
    /// (service, probe), chunk by chunk, for one atomic write through the writer's own
    /// staging.
    fn stage_merged(
        &self,
        tree: &sled::Tree,
        service: &str,
        probe: Probe,
        lvl: u8,
        (res, span): (u64, u64),
        points: &[(u64, Histogram)],
    ) -> Result<Pending> {
        let mut chunks: BTreeMap<u64, Chunk> = BTreeMap::new();
        for (t, hist) in points {
            let at = t - t % res;
            let cstart = at - at % span;
            let chunk = match chunks.entry(cstart) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let key = keys::history(lvl, service, probe, cstart);
                    e.insert(self.stored_chunk(tree, &key, cstart)?)
                }
            };
            chunk.add(at, hist, false)?;
        }
        let mut pending = Pending::default();
        for chunk in chunks.values() {
            self.stage(&mut pending, tree, service, probe, lvl, chunk)?;
        }
        Ok(pending)
    }
}

/// Every (service, probe) with records at the finest level: one seek per stream.
fn finest_streams(tree: &sled::Tree) -> Result<Vec<(String, Probe)>> {
    let mut out = Vec::new();
    let mut from = vec![0u8];
    while let Some((key, _)) = tree.range(from.clone()..).next().transpose()? {
        let Some((0, service, probe, _)) = keys::parse_history(&key) else {
            break;
        };
        let stream = keys::history_stream(0, &service, probe);
        out.push((service, probe));
        match keys::prefix_end(&stream) {
            Some(end) => from = end,
            None => break,
        }
    }
    Ok(out)
}

/// The finest level's points of (service, probe) in chunks starting in `from..limit`, in
/// time order (undecodable records are skipped), and whether the stream has records from
/// `limit` on.
fn finest_points(
    tree: &sled::Tree,
    service: &str,
    probe: Probe,
    from: u64,
    limit: u64,
) -> Result<(Vec<(u64, Histogram)>, bool)> {
    let stream = keys::history_stream(0, service, probe);
    let start = keys::history(0, service, probe, from);
    let mut points = Vec::new();
    let records = match keys::prefix_end(&stream) {
        Some(end) => tree.range(start..end),
        None => tree.range(start..),
    };
    for record in records {
        let (key, value) = record?;
        let Some((_, _, _, cstart)) = keys::parse_history(&key) else {
            continue;
        };
        if cstart >= limit {
            return Ok((points, true));
        }
        if let Ok(p) = decode_record(cstart, &value) {
            points.extend(p);
        }
    }
    points.sort_by_key(|(t, _)| *t);
    Ok((points, false))
}

/// How many of `finest` (points from the coarse point's start, in time order) the coarse
/// point `target` already holds: the shortest run starting before `until` that adds up to
/// it exactly. `None` when none does.
fn covered_prefix(finest: &[(u64, Histogram)], until: u64, target: &Histogram) -> Option<usize> {
    let mut sum = Histogram::new();
    if sum == *target {
        return Some(0);
    }
    for (i, (t, h)) in finest.iter().enumerate() {
        if *t >= until {
            break;
        }
        sum.merge(h);
        if sum.count() == target.count() && sum == *target {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[u64]) -> Histogram {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        h
    }

    #[test]
    fn the_covered_prefix_is_where_the_points_add_up_to_the_coarse_one() {
        let finest = vec![
            (10, hist(&[1_000])),
            (11, hist(&[2_000, 3_000])),
            (12, hist(&[])),
            (13, hist(&[4_000])),
        ];
        let mut target = hist(&[1_000]);
        target.merge(&hist(&[2_000, 3_000]));
        assert_eq!(covered_prefix(&finest, 20, &target), Some(2));
        // Nothing written yet for the point: everything is missing.
        assert_eq!(covered_prefix(&finest, 20, &Histogram::new()), Some(0));
        // All of it.
        let mut all = target.clone();
        all.merge(&hist(&[4_000]));
        assert_eq!(covered_prefix(&finest, 20, &all), Some(4));
        // Points past the coarse point's end are not its own.
        assert_eq!(covered_prefix(&finest, 13, &all), None);
        // Same count, other values: not the same intervals.
        assert_eq!(
            covered_prefix(&finest, 20, &hist(&[1_000, 2_000, 9_000])),
            None
        );
    }
}
