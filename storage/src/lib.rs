//! tailtrap's local store (being built; see the storage issue).
#![deny(missing_docs)]
