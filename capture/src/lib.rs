//! tailtrap's deep capture: the records of slow SKBs caught in the kernel (`sample`), the
//! flight recorder and per-incident capture limits (`recorder`), and bounded pwru sessions
//! scoped to an incident's flows (`pwru`).
#![deny(missing_docs)]

pub mod pwru;
pub mod recorder;
pub mod sample;
