//! tailtrap's deep capture: the records of slow SKBs caught in the kernel (`sample`) and
//! bounded pwru sessions scoped to an incident's flows (`pwru`).
#![deny(missing_docs)]

pub mod pwru;
pub mod sample;
