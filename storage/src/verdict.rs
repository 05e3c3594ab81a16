//! Operators' verdicts on incidents (`tailtrap incidents mark`).
//!
//! A verdict is its own small record in the meta tree, keyed by the incident id, not a field
//! of the incident record: the daemon rewrites an open incident's record from its own copy
//! (capture and pwru counters), which would silently drop a verdict set meanwhile, and
//! incident records written by older builds stay exactly as they were. Retention deletes
//! the verdict with its incident.

use model::Verdict;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::keys;
use crate::store::{Store, T};

/// Key prefix of verdict records in the meta tree (`verdict/` + big-endian id).
const PREFIX: &[u8] = b"verdict/";

/// A verdict with the operator's note and when it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentVerdict {
    /// The verdict.
    pub verdict: Verdict,
    /// Free text (may be empty).
    pub note: String,
    /// When it was given, ns since the epoch.
    pub marked_ns: u64,
}

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
        if !self.incident_exists(id)? {
            return Err(StoreError::NoSuchIncident(id));
        }
        if verdict.note.len() > MAX_NOTE_BYTES {
            return Err(StoreError::TooLarge {
                kind: "verdict note",
                size: verdict.note.len(),
                max: MAX_NOTE_BYTES,
            });
        }
        self.meta_put(&key(id), verdict)?;
        self.flush_with(false)
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
