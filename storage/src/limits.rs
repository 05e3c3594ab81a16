//! Size caps of stored records, below the store so that the modules encoding records
//! (history chunks and baselines, the golden tests) need not import it.

/// Caps on encoded record sizes, bytes: a record over its cap is refused, never truncated.
pub(crate) const MAX_INCIDENT_BYTES: usize = 1 << 20;
pub(crate) const MAX_PWRU_BYTES: usize = 64 << 10;
pub(crate) const MAX_HISTORY_BYTES: usize = 16 << 10;
pub(crate) const MAX_BASELINE_BYTES: usize = 1 << 20;
