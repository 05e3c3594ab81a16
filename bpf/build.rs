//! Builds the BPF object and its libbpf-rs skeleton into OUT_DIR, and the host build of the
//! bucket function that `tests/bucket_agreement.rs` compares with `detector::hist`.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const BPF_DIR: &str = "src/bpf";
const SOURCES: [&str; 14] = [
    "tailtrap.h",
    "bucket.h",
    "counter.bpf.h",
    "hist.bpf.h",
    "clock.bpf.h",
    "ip.bpf.h",
    "sample.bpf.h",
    "service.bpf.h",
    "filter.bpf.h",
    "hol.bpf.h",
    "capture.bpf.h",
    "vmlinux.h",
    "probes.bpf.c",
    "floor.bpf.c",
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    // probes: the product; floor: empty programs for the probe-cost benchmark.
    for name in ["probes", "floor"] {
        SkeletonBuilder::new()
            .source(format!("{BPF_DIR}/{name}.bpf.c"))
            // cpu v3: atomic fetch-and-add with a result (auto-service slots); kernels >= 5.12.
            .clang_args(["-I", BPF_DIR, "-mcpu=v3", "-Wall", "-Werror"])
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

    for f in SOURCES {
        println!("cargo:rerun-if-changed={BPF_DIR}/{f}");
    }
    println!("cargo:rerun-if-changed=tests/shim/bucket_shim.c");
}
