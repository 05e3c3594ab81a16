//! The history chunks a store is filling, in memory until written (see [`HistoryBuffer`]);
//! `history.rs` records into them, writes them and merges them into reads.

use std::collections::HashMap;

use model::{Histogram, Probe};

use crate::history_chunk::{Chunk, Stored};

/// The coarser levels' unfinished chunks are written every this many finest chunks (and
/// when complete, at `Store::flush` and at close), not at every one: each write of such
/// a chunk pulls its whole leaf (up to 16 older chunks) into sled's memory, and these
/// rewrites were much of what went through the engine and of its reopens (the soak's
/// figures: docs/reliability.md, "Coarse chunks"). After a crash the coarser levels lack
/// up to this many finest chunks' points; the next open adds them back from the finest
/// level (`history_rebuild.rs`).
pub(crate) const COARSE_WRITE_EVERY: u64 = 10;

/// The history chunks this store is filling, one per (service, probe, level), written to
/// the tree when a newer chunk starts, when the finest level moves into a new chunk (its
/// own chunks then, and the coarser levels' as [`COARSE_WRITE_EVERY`] says), at
/// `Store::flush` and when the store closes. Reads merge them in, so what was recorded is
/// readable at once. The store is the only writer of its history (the database lock).
#[derive(Default)]
pub(crate) struct HistoryBuffer {
    pub(crate) epoch: u64,
    pub(crate) streams: HashMap<String, Vec<StreamBuf>>,
    /// Start of the finest level's chunk of the newest batch.
    pub(crate) period: Option<u64>,
    /// `period` when the coarser levels' unfinished chunks were last written.
    pub(crate) coarse_written: Option<u64>,
}

pub(crate) struct StreamBuf {
    pub(crate) probe: Probe,
    pub(crate) level: u8,
    /// Start of the newest record of the stream in the tree, once looked up (`Some(None)`:
    /// none); a chunk later than it needs no read.
    pub(crate) newest: Option<Option<u64>>,
    pub(crate) chunk: Option<Chunk>,
}

impl HistoryBuffer {
    /// The streams of `service`.
    pub(crate) fn service(&mut self, service: &str) -> &mut Vec<StreamBuf> {
        if !self.streams.contains_key(service) {
            self.streams.insert(service.to_owned(), Vec::new());
        }
        self.streams.get_mut(service).expect("inserted above")
    }

    pub(crate) fn stream(list: &mut Vec<StreamBuf>, probe: Probe, level: u8) -> &mut StreamBuf {
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
    pub(crate) fn forget_tree(&mut self) {
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
