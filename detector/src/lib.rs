//! tailtrap's detector: latency histograms, per-service tail baselines and tail-shift
//! detection, plus the replay format and the scenario generator used to try it. Pure
//! computation: no BPF, no sockets, no files.
#![deny(missing_docs)]

pub mod config;
pub mod hist;
pub mod probe;

pub use config::{ConfigError, DetectorConfig};
pub use hist::Histogram;
pub use probe::Probe;
