//! Builds the BPF object and its libbpf-rs skeleton into OUT_DIR, and the host build of the
//! bucket function that `tests/bucket_agreement.rs` compares with `model::hist`.

use std::env;
use std::fs;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const BPF_DIR: &str = "src/bpf";
const SOURCES: [&str; 18] = [
    "tailtrap.h",
    "bucket.h",
    "counter.bpf.h",
    "hist.bpf.h",
    "clock.bpf.h",
    "cgroup.bpf.h",
    "ip.bpf.h",
    "sample.bpf.h",
    "service.bpf.h",
    "filter.bpf.h",
    "hol.bpf.h",
    "capture.bpf.h",
    "reader_wait.bpf.h",
    "first_stamp.bpf.h",
    "vmlinux.h",
    "probes.bpf.c",
    "floor.bpf.c",
    "features.bpf.c",
];

/// libbpf-cargo's name for the target architecture in `__TARGET_ARCH_*`.
fn target_arch() -> String {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| env::consts::ARCH.into());
    match arch.as_str() {
        "x86_64" => "x86".into(),
        "aarch64" => "arm64".into(),
        "powerpc64" => "powerpc".into(),
        "s390x" => "s390".into(),
        "riscv64" => "riscv".into(),
        "loongarch64" => "loongarch".into(),
        "sparc64" => "sparc".into(),
        "mips64" => "mips".into(),
        _ => arch,
    }
}

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    // The -D is passed here although libbpf-cargo would add the same one, so that
    // tests/bpf_headers.rs can compile each header with exactly these flags (read from
    // OUT_DIR; relative paths, like cargo, from the package directory).
    let clang_args = [
        "-I".to_owned(),
        BPF_DIR.to_owned(),
        format!("-D__TARGET_ARCH_{}", target_arch()),
        // cpu v3: 32-bit jumps and ALU (5.1+). Its atomics with a result (5.12+) must not
        // appear: 5.10's verifier refuses a program holding one even on a dead path.
        "-mcpu=v3".to_owned(),
        "-Wall".to_owned(),
        "-Werror".to_owned(),
    ];
    fs::write(out.join("bpf_clang_args.txt"), clang_args.join("\n"))
        .expect("writing bpf_clang_args.txt to OUT_DIR");

    // probes: the product; features: what the kernel offers, loaded before it; floor:
    // empty programs for the probe-cost benchmark.
    for name in ["probes", "features", "floor"] {
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

    for f in SOURCES {
        println!("cargo:rerun-if-changed={BPF_DIR}/{f}");
    }
    println!("cargo:rerun-if-changed=tests/shim/bucket_shim.c");
}
