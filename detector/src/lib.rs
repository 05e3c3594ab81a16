//! tailtrap's detector: latency histograms and (soon) per-service tail baselines and
//! tail-shift detection. Pure computation: no BPF, no sockets, no files.
#![deny(missing_docs)]

pub mod hist;
pub mod probe;

pub use hist::Histogram;
pub use probe::Probe;
