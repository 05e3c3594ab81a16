//! The clang flags of every BPF object of this package, shared by `build.rs` (the probes)
//! and `reference/build.rs` (the probe-cost bench's reference programs), which include this
//! file by path.

use std::env;

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

/// The flags, with `bpf_dir` (the BPF sources, relative to the package directory) as the
/// include path. The -D is passed although libbpf-cargo would add the same one, so that
/// tests/bpf_headers.rs can compile each header with exactly these flags.
pub fn clang_args(bpf_dir: &str) -> Vec<String> {
    vec![
        "-I".to_owned(),
        bpf_dir.to_owned(),
        format!("-D__TARGET_ARCH_{}", target_arch()),
        // cpu v3: 32-bit jumps and ALU (5.1+). Its atomics with a result (5.12+) must not
        // appear: 5.10's verifier refuses a program holding one even on a dead path.
        "-mcpu=v3".to_owned(),
        "-Wall".to_owned(),
        "-Werror".to_owned(),
    ]
}
