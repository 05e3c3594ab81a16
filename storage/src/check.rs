//! `tailtrap db check`: records per tree, undecodable records, size on disk.

use serde::Serialize;

use crate::chunk;
use crate::codec;
use crate::engine::T;
use crate::error::Result;
use crate::history_chunk;
use crate::model::{Incident, IncidentState, PwruRecord};
use crate::store::{Store, StoreStats, SCHEMA_VERSION};
use crate::windows;

/// One tree's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeCheck {
    /// Tree name.
    pub tree: &'static str,
    /// Records in it (for the samples tree: chunks of up to 256 samples).
    pub records: u64,
    /// Records that failed to decode.
    pub undecodable: u64,
    /// Bytes of keys and values.
    pub bytes: u64,
}

/// The result of checking a database.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    /// The database directory.
    pub path: String,
    /// Schema version stored.
    pub schema_version: u32,
    /// Schema version this build writes.
    pub supported_schema_version: u32,
    /// Per tree.
    pub trees: Vec<TreeCheck>,
    /// Samples in the samples tree's decodable chunks.
    pub samples: u64,
    /// Sum of undecodable records over all trees.
    pub undecodable: u64,
    /// Bytes of live keys and values.
    pub live_bytes: u64,
    /// The engine's files, bytes.
    pub size_on_disk: u64,
    /// `size_on_disk / live_bytes`.
    pub amplification: f64,
    /// Incidents by state: open, closed, interrupted.
    pub incidents_open: u64,
    /// Closed incidents.
    pub incidents_closed: u64,
    /// Interrupted incidents.
    pub incidents_interrupted: u64,
    /// The store's counters.
    pub stats: StoreStats,
}

impl Store {
    /// Read every record of every tree and decode it. `progress` is called with the number
    /// of records read so far (for a progress display).
    pub fn check(&self, mut progress: impl FnMut(u64)) -> Result<CheckReport> {
        let mut trees = Vec::new();
        let mut seen = 0u64;
        let (mut open, mut closed, mut interrupted) = (0, 0, 0);
        let mut samples = 0u64;
        for t in T::ALL {
            let mut c = TreeCheck {
                tree: t.name(),
                records: 0,
                undecodable: 0,
                bytes: 0,
            };
            // In windows with the engine reopened between them when due, so that what sled
            // keeps of the pass stays about a window, not the database's size.
            self.for_each_record_in_windows(t, windows::whole(), |k, v| {
                let n = (k.len() + v.len()) as u64;
                self.touch(n);
                c.records += 1;
                c.bytes += n;
                let ok = match t {
                    T::Incidents => match codec::decode::<Incident>(&v) {
                        Ok(i) => {
                            match i.state {
                                IncidentState::Open => open += 1,
                                IncidentState::Closed => closed += 1,
                                IncidentState::Interrupted => interrupted += 1,
                            }
                            true
                        }
                        Err(_) => false,
                    },
                    T::Samples => match chunk::decode(&v) {
                        Ok(chunk) => {
                            samples += chunk.len() as u64;
                            true
                        }
                        Err(_) => false,
                    },
                    T::Pwru => codec::decode::<PwruRecord>(&v).is_ok(),
                    T::History => history_chunk::decode_record(0, &v).is_ok(),
                    T::Baselines => codec::decode::<Vec<u8>>(&v).is_ok(),
                    // Meta values have several types; the envelope check is what applies.
                    T::Meta => codec::verify(&v).is_ok(),
                };
                if !ok {
                    c.undecodable += 1;
                    tracing::warn!(tree = t.name(), key = ?k, "undecodable record");
                }
                seen += 1;
                if seen % 10_000 == 0 {
                    progress(seen);
                }
                Ok(())
            })?;
            trees.push(c);
        }
        progress(seen);
        let live: u64 = trees.iter().map(|t| t.bytes).sum();
        let size_on_disk = self.size_on_disk()?;
        Ok(CheckReport {
            path: self.path().display().to_string(),
            schema_version: self.schema_version()?,
            supported_schema_version: SCHEMA_VERSION,
            samples,
            undecodable: trees.iter().map(|t| t.undecodable).sum(),
            trees,
            live_bytes: live,
            size_on_disk,
            amplification: size_on_disk as f64 / live.max(1) as f64,
            incidents_open: open,
            incidents_closed: closed,
            incidents_interrupted: interrupted,
            stats: self.stats(),
        })
    }
}
