//! Operators' verdicts on incidents (`tailtrap incidents mark`).
//!
//! A verdict is its own small record in the meta tree, keyed by the incident id, not a field
//! of the incident record: the daemon rewrites an open incident's record from its own copy
//! (capture and pwru counters), which would silently drop a verdict set meanwhile, and
//! incident records written by older builds stay exactly as they were. Retention deletes
//! the verdict with its incident.

use crate::engine::T;
use crate::error::{Result, StoreError};
use crate::keys;
use crate::model::IncidentVerdict;
use crate::store::Store;

/// Key prefix of verdict records in the meta tree (`verdict/` + big-endian id).
const PREFIX: &[u8] = b"verdict/";

/// Longest note kept, bytes.
pub const MAX_NOTE_BYTES: usize = 4096;

fn key(id: u64) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(&keys::incident(id));
    k
}

impl Store {
    /// Store the operator's verdict on incident `id`, replacing an earlier one. Durable on
    /// return.
    pub fn mark_incident(&self, id: u64, verdict: &IncidentVerdict) -> Result<()> {
        self.require_incident(id)?;
        if verdict.note.len() > MAX_NOTE_BYTES {
            return Err(StoreError::TooLarge {
                kind: "verdict note",
                size: verdict.note.len(),
                max: MAX_NOTE_BYTES,
            });
        }
        self.meta_put(&key(id), verdict)?;
        self.flush_records()
    }

    /// The verdict on incident `id`, if one was given.
    pub fn verdict(&self, id: u64) -> Result<Option<IncidentVerdict>> {
        self.meta_get(&key(id))
    }

    /// Remove incident `id`'s verdict; returns the bytes freed.
    pub(crate) fn remove_verdict(&self, id: u64) -> Result<u64> {
        self.remove(T::Meta, &key(id))
    }
}
