//! Helpers more than one command uses, so that commands never import each other.

pub mod history_read;
pub mod progress;
pub mod pwru_status;
pub mod replayed_incidents;
pub mod since;
pub mod timelines;
