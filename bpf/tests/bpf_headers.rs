//! Every `src/bpf/*.bpf.h` compiles on its own includes: a translation unit that includes
//! only that header passes `clang -fsyntax-only` with the flags build.rs gives the BPF
//! build. A header that leans on whatever its includer happened to include before it
//! fails here, naming the header and clang's error.
#![allow(clippy::unwrap_used)] // tests may unwrap, helpers included

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_rs::libbpf_sys::API_HEADERS;

/// The flags build.rs passes to clang for the skeletons, one per line.
const BUILD_CLANG_ARGS: &str = include_str!(concat!(env!("OUT_DIR"), "/bpf_clang_args.txt"));

/// libbpf's API headers (`<bpf/bpf_helpers.h>` …) on disk, as libbpf-cargo provides them to
/// the skeleton build; returns the directory to pass with -I.
fn libbpf_headers() -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bpf_headers_libbpf");
    let dir = root.join("bpf");
    fs::create_dir_all(&dir).unwrap();
    for (name, contents) in API_HEADERS {
        fs::write(dir.join(name), contents).unwrap();
    }
    root
}

fn bpf_headers(manifest: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(manifest.join("src/bpf"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bpf.h"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_bpf_header_compiles_on_its_own_includes() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libbpf = libbpf_headers();
    let headers = bpf_headers(manifest);
    assert!(
        headers.len() >= 5,
        "found only {headers:?} in src/bpf: wrong directory?"
    );

    let mut failures = Vec::new();
    for header in &headers {
        let output = Command::new("clang")
            // build.rs's -I is relative to the package directory.
            .current_dir(manifest)
            .args(["-target", "bpf", "-O2", "-fsyntax-only"])
            .args(BUILD_CLANG_ARGS.lines())
            .arg("-I")
            .arg(&libbpf)
            .arg(write_unit(header))
            .output()
            .expect("running clang (a build dependency of the BPF skeleton)");
        if !output.status.success() {
            failures.push(format!(
                "{header} does not compile on its own includes:\n{}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The one-line unit for `header`, written under the test's scratch directory.
fn write_unit(header: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bpf_headers_units");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{header}.c"));
    fs::write(&path, format!("#include \"{header}\"\n")).unwrap();
    path
}
