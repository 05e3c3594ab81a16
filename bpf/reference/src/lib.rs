//! The reference programs of the probe-cost bench (`bpf/src/bpf/floor.bpf.c`: empty
//! programs and clock reads on the hooks tailtrap's probes use, to measure a probe's cost
//! against), and the test program of nic-to-stack's stamp conversion, as libbpf-rs
//! skeletons. A crate of its own, a dev-dependency of `bpf`, so that only the bench, the
//! tests and the `reference_programs` example build them, never the product.
//! `bpf/benches/support/reference.rs` loads them.

/// A module holding the libbpf-rs skeleton `$file` that build.rs generated into OUT_DIR,
/// with the lints generated code does not follow allowed.
macro_rules! skeleton {
    ($(#[$attr:meta])* $vis:vis mod $name:ident = $file:literal) => {
        $(#[$attr])*
        #[allow(
            clippy::all,
            clippy::pedantic,
            clippy::unwrap_used,
            unreachable_pub,
            missing_docs
        )]
        $vis mod $name {
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

skeleton!(mod floor_skel = "floor.skel.rs");

pub use floor_skel::{FloorSkel, FloorSkelBuilder, OpenFloorSkel};

skeleton!(
    /// nic-to-stack's stamp conversion (`bpf/src/bpf/nic_stamp.bpf.h`) in a `syscall` program
    /// that `bpf/tests/nic_stamp_conversion.rs` runs on its cases with `BPF_PROG_RUN`.
    pub mod nic_stamp_check = "nic_stamp_check.skel.rs"
);
