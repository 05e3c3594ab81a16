use std::path::PathBuf;

/// The directory cargo put this test binary's package binaries in (`target/<profile>`):
/// test executables live in its `deps/` subdirectory.
fn target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    Some(if dir.ends_with("deps") {
        dir.parent()?.to_path_buf()
    } else {
        dir.to_path_buf()
    })
}

fn locate(name: &str, override_var: &str, hint: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(override_var) {
        return PathBuf::from(path);
    }
    let path = target_dir().map(|d| d.join(name));
    match path {
        Some(path) if path.is_file() => path,
        _ => panic!("cannot find the `{name}` binary next to this test's target directory ({hint}; or set {override_var})"),
    }
}

/// The agent's `tailtrap` binary of the same build (`target/<profile>/tailtrap`), for CLI
/// end-to-end tests; `TAILTRAP_BIN` overrides.
///
/// # Panics
/// When it is not there: build it first with `cargo build --bins`.
pub fn tailtrap_bin() -> PathBuf {
    locate("tailtrap", "TAILTRAP_BIN", "run `cargo build --bins` first")
}

/// The `tailtrap-traffic` helper of the same build; `TAILTRAP_TRAFFIC_BIN` overrides.
/// Cargo builds it with this crate's tests, where it is also
/// `env!("CARGO_BIN_EXE_tailtrap-traffic")`.
///
/// # Panics
/// When it is not there (a test binary of another package that did not build it).
pub fn traffic_bin() -> PathBuf {
    locate(
        "tailtrap-traffic",
        "TAILTRAP_TRAFFIC_BIN",
        "build it with `cargo build -p tailtrap-tests --bins`",
    )
}

/// The kernel release when running under the VM runner (`TAILTRAP_IN_VM=1`, which sets
/// `TAILTRAP_KERNEL`), `None` on the host.
pub fn vm_kernel() -> Option<String> {
    if std::env::var_os("TAILTRAP_IN_VM").is_some_and(|v| v == "1") {
        std::env::var("TAILTRAP_KERNEL").ok()
    } else {
        None
    }
}

/// The kernel release for a VM-only test (named `vm_only_*`, `#[ignore]`d): these change
/// guest-wide state (the TAI offset, qdiscs) or need what only the stock kernels of the VM
/// tier are known to have (fentry, netem).
///
/// # Panics
/// Outside the VM runner, so that `--include-ignored` on a host fails loudly instead of
/// changing the host or passing without testing anything; leave these tests out on a host
/// with `--skip vm_only_`.
pub fn require_vm() -> String {
    vm_kernel().unwrap_or_else(|| {
        panic!(
            "VM-only test: run it with tests/vm/run-vm-tests.sh (TAILTRAP_IN_VM=1), \
             or leave it out here with `--skip vm_only_`"
        )
    })
}

/// The guest's emulated NIC (QEMU's e1000e, the VM runner's `VM_NIC`), its driver loaded:
/// the interface's name, waited for up to 30 s.
///
/// # Panics
/// When the driver does not load or no e1000e interface appears.
pub fn guest_nic() -> String {
    let status = std::process::Command::new("modprobe")
        .arg("e1000e")
        .status()
        .expect("running modprobe");
    assert!(status.success(), "modprobe e1000e: {status}");
    let names = || -> Vec<String> {
        std::fs::read_dir("/sys/class/net")
            .map(|dir| {
                dir.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let since = std::time::Instant::now();
    loop {
        let found = names().into_iter().find(|n| {
            std::fs::read_link(format!("/sys/class/net/{n}/device/driver"))
                .is_ok_and(|d| d.ends_with("e1000e"))
        });
        match found {
            Some(n) => return n,
            None if since.elapsed() < std::time::Duration::from_secs(30) => {
                std::thread::sleep(std::time::Duration::from_millis(200))
            }
            None => panic!(
                "no e1000e interface (the VM runner's VM_NIC): {:?}",
                names()
            ),
        }
    }
}

/// The attach method the probes are expected to use here, from `TAILTRAP_EXPECT_ATTACH`
/// (the VM runner sets `fentry`; `None` when unset, e.g. on the development host where the
/// kernel decides).
pub fn expected_attach() -> Option<String> {
    std::env::var("TAILTRAP_EXPECT_ATTACH")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The pwru stand-in (`capture/tests/fake-pwru/pwru`), with its list of the functions pwru
/// would select on this kernel made beforehand. The stand-in makes that list from the
/// kernel's BTF when it first runs (a Python pass over every type, cached per kernel
/// release); in a guest under software emulation that alone took longer than the daemon's
/// 1 min attach timeout (5.10, 2026-11-28), so the first session failed as "not ready" for
/// a reason of the test bed, not of tailtrap.
pub fn fake_pwru() -> PathBuf {
    static WARM: std::sync::Once = std::sync::Once::new();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../capture/tests/fake-pwru");
    WARM.call_once(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let tmp = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        // The stand-in's own cache file (see its "Functions selected" block).
        let list = tmp.join(format!("fake-pwru-skb-functions.{}", release.trim()));
        if std::fs::metadata(&list).is_ok_and(|m| m.len() > 0) {
            return;
        }
        let part = list.with_extension(format!("warm.{}", std::process::id()));
        let made = std::fs::File::create(&part).and_then(|out| {
            std::process::Command::new(dir.join("skb-functions"))
                .stdout(out)
                .status()
        });
        // Failing here leaves the stand-in to make the list itself, as before.
        match made {
            Ok(s) if s.success() => {
                let _ = std::fs::rename(&part, &list);
            }
            _ => {
                let _ = std::fs::remove_file(&part);
            }
        }
    });
    dir.join("pwru")
}
