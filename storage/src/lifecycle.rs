//! The daemon's store from open to close: the steps that span the store itself
//! (`store.rs`) and its history (`history.rs`, `history_rebuild.rs`). Here, above both,
//! so that the store never calls up into the history built on it.

use std::path::Path;

use crate::config::StoreConfig;
use crate::error::Result;
use crate::store::{HistoryRebuild, Store};

impl Store {
    /// Open (or create) the database at `path` for the daemon: a damaged database is moved
    /// aside and a fresh one started, incidents left open by the previous run are marked
    /// interrupted, and a pid file is written next to the directory so others can name the
    /// lock holder.
    pub fn open(path: impl AsRef<Path>, cfg: StoreConfig) -> Result<Store> {
        let store = Store::open_repaired(path, cfg)?;
        // Best effort: a database whose history cannot be completed still opens.
        let rebuilt = store.rebuild_coarse_history().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "coarse history levels not completed");
            HistoryRebuild::default()
        });
        store.finish_open(rebuilt)
    }

    /// Make everything written so far durable. Opening and closing incidents flush by
    /// themselves; sample and pwru writes are flushed by the engine every `flush_every`
    /// (≤ 1 s) or by this call; history chunks being filled in memory are written by this
    /// call (and when complete, see [`Store::record_history_batch`]).
    ///
    /// Each flush also bumps a generation number in the database and, once the engine
    /// confirms, records it in a small file beside the engine's own. sled 0.34 can come
    /// back from damaged log segments silently missing data; finding a generation lower
    /// than the file's at the next open exposes that as damage.
    ///
    /// After an engine I/O failure (a full disk, a file system gone read-only), sled refuses
    /// all further work; a flush (or [`Store::recover`]) reopens it from its files once the
    /// directory takes a write again, so the store recovers once space is back.
    pub fn flush(&self) -> Result<()> {
        // History chunks being filled are written first. A failure is counted and logged
        // but does not fail the flush: incidents must still be made durable.
        self.flush_after(|| {
            if let Err(e) = self.write_history_buffer() {
                tracing::warn!(error = %e, "buffered history could not be written");
            }
        })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close(|store| {
            if let Err(e) = store.write_history_buffer() {
                tracing::error!(error = %e, "the last history chunks could not be written");
            }
        });
    }
}
