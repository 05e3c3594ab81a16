//! The reference programs of the probe-cost bench (`bpf/src/bpf/floor.bpf.c`) as a
//! libbpf-rs skeleton: empty programs and clock reads on the hooks tailtrap's probes use,
//! to measure a probe's cost against. A crate of its own, a dev-dependency of `bpf`, so that
//! only the bench and the `reference_programs` example build them, never the product.
//! `bpf/benches/support/reference.rs` loads them.

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    unreachable_pub,
    missing_docs
)]
mod floor_skel {
    include!(concat!(env!("OUT_DIR"), "/floor.skel.rs"));
}

pub use floor_skel::{FloorSkel, FloorSkelBuilder, OpenFloorSkel};
