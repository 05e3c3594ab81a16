//! tailtrap's local store: incidents, slow-SKB samples, pwru output, histogram history and
//! detector baselines in one embedded sled database, made safe to stop abruptly.
//!
//! - Fixed trees with big-endian composite keys, so time ranges are range scans.
//! - Every value is `version byte | CRC32C | postcard`; a value that fails to decode is
//!   skipped and counted, never a panic.
//! - Opening and closing incidents flush at once; other writes within `flush_every` (≤ 1 s).
//! - Incidents left open by a crash are marked interrupted at the next open; a database the
//!   engine reports damaged is moved aside and a fresh one started.
//! - Retention by age per kind, a size budget, and rotation when sled's files bloat.
//!
//! No sled type appears in this API: the engine can be replaced without touching callers.
//! Operator documentation: docs/storage.md.
#![deny(missing_docs)]

mod check;
mod chunk;
mod codec;
mod config;
mod engine;
mod error;
#[cfg(test)]
mod golden_tests;
mod heap_watch;
mod history;
mod history_buffer;
mod history_chunk;
mod history_rebuild;
mod keys;
mod layout;
mod lifecycle;
mod limits;
mod lock;
mod model;
mod paths;
mod query;
mod retention;
mod store;
mod verdict;
mod windows;

pub use crate::model::{
    CaptureState, CaptureStatus, Incident, IncidentCause, IncidentCounters, IncidentState,
    IncidentVerdict, NewIncident, PwruRecord, PwruState, PwruStatus,
};
pub use check::{CheckReport, TreeCheck};
pub use config::{HistoryLevel, StoreConfig, DEFAULTS_TOML, MAX_HISTORY_LEVELS};
pub use error::{LockHolder, Result, StoreError};
pub use heap_watch::{HeapProbe, HeapReading};
pub use history::{HistoryPoint, HistorySeries, SparseSeries};
pub use keys::MAX_SERVICE_LEN;
pub use query::{
    FlowCount, FlowFilter, IncidentBundle, IncidentPage, IncidentQuery, LatencyQuantiles,
    ProcessCount, SampleCursor, SampleFilter, SamplePage, SampleSummary, MAX_PAGE,
};
pub use retention::{RetentionReport, RotationReport};
pub use store::{
    HistoryRebuild, OpenReport, Store, StoreStats, INCIDENT_ID_RESERVE, MAX_SAMPLE_BATCH,
    RECOVER_EVERY, SCHEMA_VERSION,
};
pub use verdict::MAX_NOTE_BYTES;
