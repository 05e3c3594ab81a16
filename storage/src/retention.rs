//! Space: retention by age per kind, the total size budget, and rotation into a fresh
//! database when sled's files grow far beyond the live data.

use std::fs;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;

use crate::chunk;
use crate::codec;
use crate::engine::{Engine, T};
use crate::error::{Result, StoreError};
use crate::history_chunk;
use crate::keys;
use crate::model::{Incident, IncidentState};
use crate::paths::{sibling, timestamp, unused_sibling};
use crate::store::{Store, META_ROTATIONS};
use crate::windows;

/// What one retention pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetentionReport {
    /// Incidents deleted (with their samples and pwru records).
    pub incidents: u64,
    /// Samples deleted.
    pub samples: u64,
    /// pwru records deleted.
    pub pwru: u64,
    /// History points deleted.
    pub history_points: u64,
    /// Live bytes freed.
    pub bytes_freed: u64,
    /// Live data is still over the budget (only open incidents and baselines are left).
    pub still_over_budget: bool,
}

/// Outcome of a rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RotationReport {
    /// On-disk size before, bytes.
    pub size_before: u64,
    /// On-disk size after, bytes.
    pub size_after: u64,
    /// Live bytes copied.
    pub live_bytes: u64,
    /// Records not copied because they failed their checksum.
    pub dropped_records: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Longest step by which the oldest history is trimmed when over budget.
const HISTORY_TRIM_STEP: u64 = 3600 * 1_000_000_000;
/// Shortest step: the finest level's chunk at its default resolution.
const HISTORY_TRIM_MIN_STEP: u64 = 60 * 1_000_000_000;

/// How much of the oldest history one trimming step deletes: an eighth of what is kept,
/// between a minute and an hour. A fixed hour deleted all of a young store's history at
/// once (40 minutes of it, for a 2 MiB budget), where a few minutes were enough.
fn history_trim_step(oldest_ns: u64, now_ns: u64) -> u64 {
    (now_ns.saturating_sub(oldest_ns) / 8).clamp(HISTORY_TRIM_MIN_STEP, HISTORY_TRIM_STEP)
}

impl Store {
    /// Delete what is past its age, then, while live data is over `max_bytes`, the oldest
    /// closed incidents and then the oldest history. Open incidents are never deleted.
    pub fn enforce_retention(&self, now_ns: u64) -> Result<RetentionReport> {
        let mut rep = RetentionReport::default();
        let cfg = self.cfg.clone();
        let incident_cut = now_ns.saturating_sub(nanos(cfg.incident_keep));
        let sample_cut = now_ns.saturating_sub(nanos(cfg.sample_keep));
        let pwru_cut = now_ns.saturating_sub(nanos(cfg.pwru_keep));

        // Incidents oldest first; ids grow with opening time.
        let incidents = self.scan::<Incident>(T::Incidents, ..)?;
        for (_, inc) in &incidents {
            let Some(ended) = ended_ns(inc) else { continue };
            if ended < incident_cut {
                self.delete_incident(inc.id, &mut rep)?;
            } else {
                if ended < sample_cut {
                    rep.samples +=
                        self.delete_prefix(T::Samples, &keys::incident(inc.id), &mut rep)?;
                }
                if ended < pwru_cut {
                    rep.pwru += self.delete_prefix(T::Pwru, &keys::incident(inc.id), &mut rep)?;
                }
            }
        }
        if !self.orphans_checked.load(Ordering::Relaxed) {
            self.delete_orphans(&mut rep)?;
            self.orphans_checked.store(true, Ordering::Relaxed);
        }

        for (level, l) in cfg.history.iter().enumerate() {
            let cut = now_ns.saturating_sub(nanos(l.keep));
            rep.history_points += self.trim_history(level as u8, cut, false, &mut rep)?;
        }

        if self.over_budget() {
            for (_, inc) in &incidents {
                if !self.over_budget() {
                    break;
                }
                if ended_ns(inc).is_some() && self.incident_exists(inc.id)? {
                    // Routine at the budget: the daemon says when incidents went.
                    tracing::debug!(
                        incident = inc.id,
                        "over the size budget: deleting the oldest closed incident"
                    );
                    self.delete_incident(inc.id, &mut rep)?;
                }
            }
        }
        while self.over_budget() {
            let Some(oldest) = self.oldest_history_ns()? else {
                break;
            };
            let cut = oldest.saturating_add(history_trim_step(oldest, now_ns));
            tracing::debug!(
                before_ns = cut,
                "over the size budget: deleting the oldest history"
            );
            for level in 0..cfg.history.len() {
                rep.history_points += self.trim_history(level as u8, cut, true, &mut rep)?;
            }
        }
        // No reopen forced here: a reopen after each pass raised RSS for good (a fresh
        // engine's allocations, the old one's memory not handed back), by more than the
        // leaves the pass paged in (docs/reliability.md, "The soak said the same, louder").
        // What it deleted counts toward `cache_bytes` like any write.
        self.maybe_recycle();
        rep.still_over_budget = self.over_budget();
        // At every pass while it lasts (30 s apart): the daemon says when it begins and ends.
        if rep.still_over_budget {
            tracing::debug!(
                live_bytes = self.live_bytes(),
                budget = cfg.max_bytes,
                "live data over the size budget with only open incidents and baselines left"
            );
        }
        Ok(rep)
    }

    fn delete_incident(&self, id: u64, rep: &mut RetentionReport) -> Result<()> {
        rep.samples += self.delete_prefix(T::Samples, &keys::incident(id), rep)?;
        rep.pwru += self.delete_prefix(T::Pwru, &keys::incident(id), rep)?;
        rep.bytes_freed += self.remove_verdict(id)?;
        rep.bytes_freed += self.remove(T::Incidents, &keys::incident(id))?;
        rep.incidents += 1;
        Ok(())
    }

    /// Samples and pwru records whose incident no longer exists are deleted too. An
    /// incident's record goes last when it is deleted, so they are left only by an older
    /// version or a damaged database: the first pass after opening looks, later ones do
    /// not. Looking seeks once per incident into the samples and pwru trees, which pages
    /// in a leaf of sample chunks per stored incident; every ten minutes that held memory
    /// growing with the number of incidents kept (`storage/examples/sled_rss`).
    fn delete_orphans(&self, rep: &mut RetentionReport) -> Result<()> {
        for t in [T::Samples, T::Pwru] {
            let tree = self.tree_outside(t);
            let mut from = Vec::new();
            while let Some(item) = tree.range(from.clone()..).next() {
                let (k, _) = item?;
                let Some(id) = keys::u64_at(&k, 0) else { break };
                let prefix = keys::incident(id);
                if !self.incident_exists(id)? {
                    let n = self.delete_prefix(t, &prefix, rep)?;
                    if t == T::Samples {
                        rep.samples += n;
                    } else {
                        rep.pwru += n;
                    }
                }
                match keys::prefix_end(&prefix) {
                    Some(e) => from = e,
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// Delete every key starting with `prefix`; returns how many records, or for the
    /// samples tree how many samples, went.
    /// In windows, with the engine reopened between them when due: an incident's samples
    /// can be hundreds of MiB, which sled would otherwise hold until the pass ends.
    fn delete_prefix(&self, t: T, prefix: &[u8], rep: &mut RetentionReport) -> Result<u64> {
        let mut n = 0;
        self.for_each_record_in_windows(t, windows::prefixed(prefix), |k, v| {
            rep.bytes_freed += self.remove(t, &k)?;
            n += if t == T::Samples {
                chunk::sample_count(&v)
            } else {
                1
            };
            Ok(())
        })?;
        Ok(n)
    }

    /// Delete history records of `level` whose newest point starts before `cut_ns` (a
    /// chunk expires with its last point), in every stream; with `by_start`, every record
    /// starting before `cut_ns` (the size budget, trimming the oldest). Returns the points
    /// deleted.
    fn trim_history(
        &self,
        level: u8,
        cut_ns: u64,
        by_start: bool,
        rep: &mut RetentionReport,
    ) -> Result<u64> {
        let res = self
            .cfg
            .history
            .get(usize::from(level))
            .map_or(1, |l| nanos(l.resolution).max(1));
        // The newest point a chunk can hold starts this long after the chunk.
        let reach = history_chunk::chunk_span(res) - res;
        if !by_start {
            // Before the stored records: a writer can no longer store the chunk again.
            self.history_write
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drop_expired(level, reach, cut_ns);
        }
        let mut n = 0;
        for stream in self.history_stream_keys(level)? {
            let mut end = stream.clone();
            end.extend_from_slice(&cut_ns.to_be_bytes());
            // In windows, like every long pass: trimming for the budget can delete an
            // eighth of all history at once.
            let range = (Bound::Included(stream.into()), Bound::Excluded(end.into()));
            self.for_each_record_in_windows(T::History, range, |k, v| {
                let chunk = v.first() == Some(&codec::HISTORY_CHUNK_VERSION);
                if chunk && !by_start {
                    let start = keys::parse_history(&k).map_or(0, |(_, _, _, t)| t);
                    if start.saturating_add(reach) >= cut_ns {
                        return Ok(());
                    }
                }
                n += history_chunk::record_points(&v);
                rep.bytes_freed += self.remove(T::History, &k)?;
                Ok(())
            })?;
        }
        Ok(n)
    }

    /// Start of the oldest history point at any level.
    fn oldest_history_ns(&self) -> Result<Option<u64>> {
        let tree = self.tree_outside(T::History);
        let mut oldest: Option<u64> = None;
        for level in 0..self.cfg.history.len() {
            for stream in self.history_stream_keys(level as u8)? {
                if let Some(item) = tree.scan_prefix(&stream).next() {
                    let (k, _) = item?;
                    if let Some((_, _, _, t)) = keys::parse_history(&k) {
                        oldest = Some(oldest.map_or(t, |o| o.min(t)));
                    }
                }
            }
        }
        Ok(oldest)
    }

    /// Rotate when sled's files exceed `max_amplification` times the live data (and
    /// [`rotation_floor`](Self::rotation_floor)); returns what was done, or `None` when not
    /// needed.
    pub fn maybe_rotate(&self) -> Result<Option<RotationReport>> {
        let disk = self.size_on_disk()?;
        let live = self.live_bytes().max(1);
        let limit = (live as f64 * self.cfg.max_amplification) as u64;
        if disk <= self.rotation_floor() || disk <= limit {
            return Ok(None);
        }
        tracing::warn!(
            size_on_disk = disk,
            live_bytes = live,
            "database files are {:.1}x the live data: rotating into a fresh database",
            disk as f64 / live as f64
        );
        self.rotate().map(Some)
    }

    /// Files no larger than this are never rotated: `rotate_min_bytes`, or
    /// `max_amplification` × `max_bytes` when that is smaller, so that the files of a small
    /// budget stay within that many times it instead of growing to the 256 MiB floor.
    pub(crate) fn rotation_floor(&self) -> u64 {
        let budget_bound = (self.cfg.max_bytes as f64 * self.cfg.max_amplification) as u64;
        self.cfg.rotate_min_bytes.min(budget_bound)
    }

    /// Copy every valid record into a fresh database and swap it in place of the current
    /// one (export, import, swap). Writers wait meanwhile; readers keep their snapshot.
    /// On failure the current database stays in use.
    pub fn rotate(&self) -> Result<RotationReport> {
        let mut guard = self.engine_mut();
        let size_before = guard.db.size_on_disk()?;
        guard.db.flush()?;
        let rotations: u64 = guard
            .tree(T::Meta)
            .get(META_ROTATIONS)?
            .and_then(|v| codec::decode(&v).ok())
            .unwrap_or(0);
        let fresh_path = sibling(&self.path, "rotating");
        if fresh_path.exists() {
            fs::remove_dir_all(&fresh_path).map_err(|e| {
                StoreError::io(format!("removing stale {}", fresh_path.display()), e)
            })?;
        }
        let mut dropped = 0u64;
        let mut copied = 0u64;
        {
            // Copied in windows, both engines reopened between them: sled keeps what goes
            // through it until its engine is dropped, so copying in one go held about
            // twice the live data in memory.
            let fresh = Store::open_engine_at(&fresh_path, &self.cfg)?;
            let mut copy = Copy {
                source: guard,
                fresh,
                batch: sled::Batch::default(),
                in_batch: 0,
            };
            for t in T::ALL {
                windows::for_each_record(
                    &mut copy,
                    |c| Box::new(c.source.tree(t).clone()),
                    windows::whole(),
                    self.cfg.pass_window_bytes(),
                    |c| {
                        c.apply(t)?;
                        c.fresh.db.flush()?;
                        Store::reopen_files(&mut c.fresh, &fresh_path, &self.cfg)?;
                        self.reopen_held(&mut c.source)?;
                        Ok::<(), StoreError>(())
                    },
                    |c, k, v| {
                        if codec::verify(&v).is_err() {
                            dropped += 1;
                            return Ok(());
                        }
                        let n = (k.len() + v.len()) as u64;
                        copied += n;
                        c.batch.insert(k, v);
                        c.in_batch += n;
                        if c.in_batch >= BATCH_BYTES {
                            c.apply(t)?;
                        }
                        Ok(())
                    },
                )?;
                copy.apply(t)?;
            }
            let meta = copy.fresh.tree(T::Meta);
            meta.insert(META_ROTATIONS, codec::encode("meta", &(rotations + 1), 64)?)?;
            copy.fresh.db.flush()?;
            guard = copy.source;
        }
        // sled writes files by path (snapshots) until it is fully dropped, so the old engine
        // must be closed before the directories move: a throw-away in-memory engine stands
        // in meanwhile (writers are blocked on the lock anyway).
        let placeholder = Store::temporary_engine()?;
        drop(Store::replace_engine(&mut guard, placeholder));
        let old_path = unused_sibling(&self.path, &format!("pre-rotation-{}", timestamp()));
        let swapped = swap_dirs(&self.path, &fresh_path, &old_path);
        // Whatever happened, a database is at `path` again: the rotated one or the old one.
        match Store::open_engine_at(&self.path, &self.cfg) {
            Ok(engine) => {
                self.reset_live(engine.live);
                drop(Store::replace_engine(&mut guard, engine));
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "reopening the database after rotation failed; writes are refused until the engine is reopened");
                self.mark_failed(&e);
                return Err(e);
            }
        }
        swapped?;
        drop(guard);
        if let Err(e) = fs::remove_dir_all(&old_path) {
            tracing::warn!(path = %old_path.display(), error = %e, "could not remove the pre-rotation database");
        }
        let size_after = self.size_on_disk()?;
        tracing::warn!(
            size_before,
            size_after,
            live_bytes = copied,
            dropped,
            "database rotated"
        );
        Ok(RotationReport {
            size_before,
            size_after,
            live_bytes: copied,
            dropped_records: dropped,
        })
    }
}

/// Move `current` to `aside` and `fresh` to `current`; on failure put `current` back.
fn swap_dirs(
    current: &std::path::Path,
    fresh: &std::path::Path,
    aside: &std::path::Path,
) -> Result<()> {
    fs::rename(current, aside)
        .map_err(|e| StoreError::io(format!("moving {} aside", current.display()), e))?;
    if let Err(e) = fs::rename(fresh, current) {
        if let Err(back) = fs::rename(aside, current) {
            tracing::error!(error = %back, "could not move the old database back");
        }
        return Err(StoreError::io(
            format!("moving the rotated database into {}", current.display()),
            e,
        ));
    }
    Ok(())
}

fn ended_ns(inc: &Incident) -> Option<u64> {
    match inc.state {
        IncidentState::Open => None,
        IncidentState::Closed => Some(inc.closed_ns.unwrap_or(inc.opened_ns)),
        IncidentState::Interrupted => Some(inc.closed_ns.unwrap_or(inc.opened_ns)),
    }
}

/// Rotation's copy: the current engine (held for writing), the fresh one, and the batch
/// being filled for it.
struct Copy<'a> {
    source: std::sync::RwLockWriteGuard<'a, Engine>,
    fresh: Engine,
    batch: sled::Batch,
    /// Bytes of keys and values in `batch`.
    in_batch: u64,
}

/// Rotation writes its copy in batches of about this many bytes (by count, 10 000 sample
/// chunks were 60 MB in memory at once).
const BATCH_BYTES: u64 = 1 << 20;

impl Copy<'_> {
    /// Write the batch to tree `t` of the fresh engine.
    fn apply(&mut self, t: T) -> Result<()> {
        self.fresh
            .tree(t)
            .apply_batch(std::mem::take(&mut self.batch))?;
        self.in_batch = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed store call fails the test

    use super::*;
    use crate::{NewIncident, StoreConfig};

    const T0: u64 = 1_790_000_000_000_000_000;

    fn incident_with_samples(s: &Store, opened_ns: u64) -> u64 {
        let inc = s
            .open_incident(&NewIncident {
                service: "web".into(),
                probes: vec![model::Probe::TcpSocketRead],
                opened_ns,
                evidence_json: "{}".into(),
                stages_json: "{}".into(),
            })
            .unwrap();
        let batch: Vec<_> = (0..50)
            .map(|i| model::fixtures::sample(inc.id, i, opened_ns + i))
            .collect();
        s.put_samples(&batch).unwrap();
        inc.id
    }

    /// Samples stored under `id`, whether or not the incident exists.
    fn samples(s: &Store, id: u64) -> u64 {
        s.tree_outside(T::Samples)
            .scan_prefix(keys::incident(id))
            .map(|item| chunk::sample_count(&item.unwrap().1))
            .sum()
    }

    #[test]
    fn samples_of_a_deleted_incident_go_at_the_first_pass_after_opening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let s = Store::open(&path, StoreConfig::default()).unwrap();
        let kept = incident_with_samples(&s, T0);
        let orphaned = incident_with_samples(&s, T0 + 1_000);
        // What an older version or a damaged database leaves: samples without their incident.
        s.remove(T::Incidents, &keys::incident(orphaned)).unwrap();
        assert_eq!(samples(&s, orphaned), 50);

        let rep = s.enforce_retention(T0 + 2_000).unwrap();
        assert_eq!(rep.samples, 50, "{rep:?}");
        assert_eq!(samples(&s, orphaned), 0);
        assert_eq!(
            samples(&s, kept),
            50,
            "an incident that exists keeps its samples"
        );

        // Later passes of the same store do not look again; a reopened store does.
        let orphaned = incident_with_samples(&s, T0 + 3_000);
        s.remove(T::Incidents, &keys::incident(orphaned)).unwrap();
        assert_eq!(s.enforce_retention(T0 + 4_000).unwrap().samples, 0);
        drop(s);
        let s = Store::open(&path, StoreConfig::default()).unwrap();
        assert_eq!(s.enforce_retention(T0 + 5_000).unwrap().samples, 50);
        assert_eq!(samples(&s, orphaned), 0);
        assert_eq!(samples(&s, kept), 50);
    }
}
