//! tailtrap's deep capture: the flight recorder and per-incident capture limits
//! (`recorder`) for the slow-SKB records ([`model::Sample`]) caught in the kernel, and
//! bounded pwru sessions scoped to an incident's flows (`pwru`). [`CaptureConfig`] is the
//! `[capture]` configuration table.
#![deny(missing_docs)]

mod config;
pub mod pwru;
pub mod recorder;

pub use config::{CaptureConfig, Threshold, DEFAULTS_TOML};
