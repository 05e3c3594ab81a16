//! tailtrap's detector: per-service tail baselines and tail-shift detection over
//! [`model::Histogram`]s, plus the replay format and the scenario generator used to try it.
//! Pure computation: no BPF, no sockets, no files.
//!
//! The daemon builds a [`Detector`] from a [`DetectorConfig`] (the `[detector]` table of its
//! config file), calls [`Detector::observe`] for each (service, probe) histogram of an
//! interval and [`Detector::end_interval`] once per interval, and acts on the returned
//! [`Event`]s. [`replay::Replayer`] drives the same API from a recorded series;
//! [`sweep::Sweep`] replays one service's series under many settings at once.
#![deny(missing_docs)]

mod baseline;
pub mod candidates;
pub mod config;
pub mod diagnosis;
mod dispersion;
mod engine;
pub mod event;
pub mod replay;
pub mod scenario;
pub mod scoring;
mod stats;
pub mod sweep;
mod window;

pub use baseline::BaselineError;
pub use config::{DetectorConfig, Thresholds, DEFAULTS_TOML};
pub use engine::Detector;
pub use event::{Event, Incident, IncidentKey, Notice};
pub use scenario::ScenarioError;
