//! tailtrap's deep capture: the flight recorder and per-incident capture limits
//! (`recorder`) for the slow-SKB records ([`model::Sample`]) caught in the kernel, and
//! bounded pwru sessions scoped to an incident's flows (`pwru`).
#![deny(missing_docs)]

pub mod pwru;
pub mod recorder;
