//! Builds the BPF object and its libbpf-rs skeleton into OUT_DIR, and the host build of the
//! bucket function that `tests/bucket_agreement.rs` compares with `model::hist`.

use std::env;
use std::fs;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const BPF_DIR: &str = "src/bpf";

#[path = "clang_args.rs"]
mod clang_args;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    // tests/bpf_headers.rs compiles each header with exactly these flags (read from
    // OUT_DIR; relative paths, like cargo, from the package directory).
    let clang_args = clang_args::clang_args(BPF_DIR);
    fs::write(out.join("bpf_clang_args.txt"), clang_args.join("\n"))
        .expect("writing bpf_clang_args.txt to OUT_DIR");

    // probes: the product; features: what the kernel offers, loaded before it. (floor.bpf.c,
    // the probe-cost bench's reference programs, is built by the bpf-reference crate in
    // reference/, a dev-dependency: never for the product.)
    for name in ["probes", "features"] {
        SkeletonBuilder::new()
            .source(format!("{BPF_DIR}/{name}.bpf.c"))
            .clang_args(&clang_args)
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .expect("building a BPF skeleton (needs clang and libelf; see docs/probes.md)");
    }

    // Only the bucket agreement test links this (by name); nothing else references it.
    cc::Build::new()
        .file("tests/shim/bucket_shim.c")
        .include(BPF_DIR)
        .cargo_metadata(false)
        .compile("tailtrap_bucket_shim");
    println!("cargo:rustc-link-search=native={}", out.display());

    // The directory, not a list of its files: a header added to it and missing from a list
    // left stale skeletons behind (cargo rescans a directory's files for changes).
    println!("cargo:rerun-if-changed={BPF_DIR}");
    println!("cargo:rerun-if-changed=tests/shim/bucket_shim.c");
}
