//! Builds the reference programs' BPF objects (`../src/bpf/floor.bpf.c` and
//! `nic_stamp_check.bpf.c`, beside the probes whose headers they share) and its libbpf-rs skeleton into OUT_DIR, with the same clang
//! flags as the probes (`../clang_args.rs`).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

#[path = "../clang_args.rs"]
mod clang_args;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bpf_dir = "../src/bpf";
    // floor: the bench's reference programs; nic_stamp_check: nic-to-stack's stamp
    // conversion run on test cases.
    for name in ["floor", "nic_stamp_check"] {
        SkeletonBuilder::new()
            .source(format!("{bpf_dir}/{name}.bpf.c"))
            .clang_args(clang_args::clang_args(bpf_dir))
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .expect("building the reference programs' BPF skeleton (needs clang and libelf)");
    }
    // The directory: floor.bpf.c and every header it includes.
    println!("cargo:rerun-if-changed={bpf_dir}");
}
