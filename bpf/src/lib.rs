//! tailtrap's BPF receive-path probes and their loader.
#![deny(missing_docs)]
