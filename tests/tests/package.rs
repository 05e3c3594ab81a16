//! The Debian package (`scripts/package`) installed into a clean Debian bookworm root made by
//! debootstrap (no compiler, no libelf-dev, no systemd: `tests/package/debroot.sh`): its
//! files and modes, the binary on a host without the build tools, the man pages, completions
//! and unit; then the upgrade path with the real daemon running inside the root on this
//! kernel, and remove/purge.
//!
//! The package is `TAILTRAP_DEB` when set (scripts/test's `package` step builds it once),
//! else `scripts/package` builds it (a release build). The "previous version" of the upgrade
//! test is `TAILTRAP_DEB_PREV` when set; otherwise the same binary repackaged as
//! `<version>-0~prev` with a changed conffile, standing for a release whose defaults differ.
//!
//! Each command in the root runs through `unshare --mount` with proc, sys and dev mounted in
//! its own mount namespace, so nothing stays mounted when it ends and the root is deleted
//! with the test. Needs root, debootstrap (first run), and the Debian archive for
//! `apt-get update` and the package's dependencies.
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tailtrap_tests::{
    baselines_warm, poll_until, EchoServer, LoopingClient, Proto, ScratchDir, SLOW_READER_DETECTOR,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package under test: `TAILTRAP_DEB`, else built by `scripts/package` into `dir`.
fn package_deb(dir: &Path) -> PathBuf {
    if let Some(deb) = std::env::var_os("TAILTRAP_DEB").filter(|v| !v.is_empty()) {
        return PathBuf::from(deb);
    }
    let out = run(Command::new(repo().join("scripts/package"))
        .arg("-o")
        .arg(dir)
        .stderr(Stdio::inherit()));
    PathBuf::from(stdout(&out).lines().last().unwrap().trim())
}

/// A field of the package's control file.
fn deb_field(deb: &Path, field: &str) -> String {
    stdout(&run(Command::new("dpkg-deb")
        .arg("--field")
        .arg(deb)
        .arg(field)))
    .trim()
    .to_owned()
}

/// A clean Debian root unpacked from the cached debootstrap tar, inside a scratch directory.
struct DebRoot {
    _scratch: ScratchDir,
    path: PathBuf,
}

/// Mounts what programs in the root need, in the mount namespace `unshare` made for this one
/// command, then runs it chrooted: the mounts end with it.
const ENTER: &str = r#"r=$1; shift
mount -t proc proc "$r/proc" && mount --rbind /sys "$r/sys" && mount --rbind /dev "$r/dev" &&
exec chroot "$r" "$@""#;

impl DebRoot {
    fn new(name: &str) -> DebRoot {
        let tar = stdout(&run(
            Command::new(repo().join("tests/package/debroot.sh")).stderr(Stdio::inherit())
        ));
        let scratch = ScratchDir::new(&format!("debroot-{name}")).unwrap();
        let path = scratch.path().join("root");
        std::fs::create_dir(&path).unwrap();
        run(Command::new("tar")
            .args(["--numeric-owner", "-xf", tar.trim(), "-C"])
            .arg(&path));
        // Name resolution for apt, as on this host.
        std::fs::copy("/etc/resolv.conf", path.join("etc/resolv.conf")).unwrap();
        DebRoot {
            _scratch: scratch,
            path,
        }
    }

    /// `args` run as root inside the root, with a plain environment plus `env`.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            ENTER,
            "sh",
        ])
        .arg(&self.path)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .envs(env.iter().copied());
        cmd
    }

    /// Run `args` in the root; it must succeed.
    fn run(&self, args: &[&str]) -> Output {
        run(&mut self.command(args, &[]))
    }

    /// A path inside the root, as seen from the host.
    fn host_path(&self, path: &str) -> PathBuf {
        self.path.join(path.trim_start_matches('/'))
    }

    /// Copy `deb` into the root's /tmp; its path there.
    fn copy_in(&self, deb: &Path) -> String {
        let name = deb.file_name().unwrap().to_str().unwrap();
        std::fs::copy(deb, self.host_path("/tmp").join(name)).unwrap();
        format!("/tmp/{name}")
    }

    /// `apt-get install` of a package file, its dependencies from the Debian archive; an
    /// installed conffile the operator changed is kept (what `--force-confold` answers).
    fn apt_install(&self, deb: &Path) -> Output {
        let inside = self.copy_in(deb);
        self.run(&[
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
            &inside,
        ])
    }

    fn installed_version(&self) -> Option<String> {
        let out = self
            .command(
                &["dpkg-query", "-W", "-f", "${Status} ${Version}", "tailtrap"],
                &[],
            )
            .output()
            .unwrap();
        let text = stdout(&out);
        text.strip_prefix("install ok installed ")
            .map(str::to_owned)
    }
}

/// The package's files: (path, mode) for the ones whose mode matters, checked in the .deb and
/// after installation.
const FILES: &[(&str, u32)] = &[
    ("/usr/bin/tailtrap", 0o755),
    ("/lib/systemd/system/tailtrap.service", 0o644),
    ("/etc/tailtrap/tailtrap.toml", 0o644),
    ("/usr/share/man/man1/tailtrap.1.gz", 0o644),
    ("/usr/share/man/man1/tailtrap-status.1.gz", 0o644),
    ("/usr/share/man/man1/tailtrap-incidents-show.1.gz", 0o644),
    ("/usr/share/bash-completion/completions/tailtrap", 0o644),
    ("/usr/share/zsh/vendor-completions/_tailtrap", 0o644),
    ("/usr/share/fish/vendor_completions.d/tailtrap.fish", 0o644),
    ("/usr/share/doc/tailtrap/copyright", 0o644),
    ("/usr/share/doc/tailtrap/changelog.Debian.gz", 0o644),
    ("/usr/share/doc/tailtrap/operations.md", 0o644),
];

#[test]
#[ignore = "needs root, debootstrap and the Debian archive: run as root with --include-ignored"]
fn the_package_installs_on_a_clean_debian_without_build_tools() {
    let scratch = ScratchDir::new("package-deb").unwrap();
    let deb = package_deb(scratch.path());
    let version = deb_field(&deb, "Version");
    let upstream = version.rsplit_once('-').unwrap().0.to_owned();

    // The .deb itself: every file root-owned, with its mode; nothing from the build tree.
    let listing = stdout(&run(Command::new("dpkg-deb").arg("-c").arg(&deb)));
    for (path, mode) in FILES {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!(".{path}")))
            .unwrap_or_else(|| panic!("{path} not in the package:\n{listing}"));
        let want = if *mode == 0o755 {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert!(line.starts_with(want), "{line}");
    }
    for line in listing.lines() {
        assert!(line.contains(" root/root "), "not root-owned: {line}");
    }
    let depends = deb_field(&deb, "Depends");
    for lib in ["libc6", "libelf1", "zlib1g"] {
        assert!(depends.contains(lib), "Depends: {depends}");
    }
    for tool in ["libbpf", "clang", "llvm", "-dev"] {
        assert!(!depends.contains(tool), "Depends: {depends}");
    }
    let conffiles = stdout(&run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles")));
    assert_eq!(conffiles, "/etc/tailtrap/tailtrap.toml\n");

    // Into a root that never had the build tools.
    let root = DebRoot::new("install");
    for tool in [
        "clang",
        "libelf-dev",
        "zlib1g-dev",
        "build-essential",
        "gcc",
    ] {
        let out = root
            .command(&["dpkg-query", "-W", "-f", "${Status}", tool], &[])
            .output()
            .unwrap();
        assert!(
            !stdout(&out).contains("install ok installed"),
            "{tool} is installed in the clean root"
        );
    }
    let started = Instant::now();
    root.run(&["apt-get", "update", "-q"]);
    eprintln!("apt-get update in the root: {:?}", started.elapsed());
    root.apt_install(&deb);
    assert_eq!(root.installed_version().as_deref(), Some(version.as_str()));
    assert!(
        !root.host_path("/usr/bin/clang").exists()
            && !root.host_path("/usr/include/libelf.h").exists(),
        "installing tailtrap pulled in build tools"
    );

    // The installed files and their modes, as dpkg lists them.
    let listed = stdout(&root.run(&["dpkg", "-L", "tailtrap"]));
    for (path, mode) in FILES {
        assert!(
            listed.lines().any(|l| l == *path),
            "dpkg -L has no {path}:\n{listed}"
        );
        let meta = std::fs::metadata(root.host_path(path)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, *mode, "{path}");
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "{path}");
    }
    let conffiles = stdout(&root.run(&["dpkg-query", "-W", "-f", "${Conffiles}", "tailtrap"]));
    assert!(
        conffiles.contains("/etc/tailtrap/tailtrap.toml"),
        "{conffiles}"
    );
    // The state directory: made by postinst, owner only.
    let state = std::fs::metadata(root.host_path("/var/lib/tailtrap")).unwrap();
    assert!(state.is_dir());
    assert_eq!(state.permissions().mode() & 0o7777, 0o700);
    // Enabled (the links deb-systemd-helper makes without a running systemd), not started.
    assert!(root
        .host_path("/etc/systemd/system/multi-user.target.wants/tailtrap.service")
        .symlink_metadata()
        .is_ok());
    root.run(&["dpkg", "--verify", "tailtrap"]);

    // The binary on this host without build tools: every library found, none of libbpf.
    let ldd = stdout(&root.run(&["ldd", "/usr/bin/tailtrap"]));
    eprintln!("ldd /usr/bin/tailtrap in the clean root:\n{ldd}");
    assert!(!ldd.contains("not found"), "{ldd}");
    assert!(!ldd.contains("libbpf"), "{ldd}");
    assert!(ldd.contains("libelf"), "{ldd}");
    let v = stdout(&root.run(&["tailtrap", "--version"]));
    assert_eq!(v.trim(), format!("tailtrap {upstream}"));

    // The conffile is the commented defaults, and a valid configuration.
    let defaults = stdout(&root.run(&["tailtrap", "config", "defaults"]));
    let conffile = std::fs::read_to_string(root.host_path("/etc/tailtrap/tailtrap.toml")).unwrap();
    assert_eq!(conffile, defaults);
    root.run(&["tailtrap", "config", "check", "/etc/tailtrap/tailtrap.toml"]);

    // Completions: what the binary prints, installed where each shell looks.
    for (shell, path) in [
        ("bash", "/usr/share/bash-completion/completions/tailtrap"),
        ("zsh", "/usr/share/zsh/vendor-completions/_tailtrap"),
        ("fish", "/usr/share/fish/vendor_completions.d/tailtrap.fish"),
    ] {
        let printed = stdout(&root.run(&["tailtrap", "completions", shell]));
        assert!(printed.contains("incidents"), "{shell}: {printed}");
        assert_eq!(
            std::fs::read_to_string(root.host_path(path)).unwrap(),
            printed,
            "{path}"
        );
    }

    // Man pages render without warnings (the host's man; the root has none).
    let pages: Vec<String> = listed
        .lines()
        .filter(|l| l.starts_with("/usr/share/man/man1/") && l.ends_with(".1.gz"))
        .map(str::to_owned)
        .collect();
    assert!(pages.len() >= 15, "{pages:?}");
    for page in &pages {
        let out = run(Command::new("man")
            .args(["--warnings", "-l"])
            .arg(root.host_path(page))
            .env("MANWIDTH", "80"));
        let text = stdout(&out);
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(warnings.trim().is_empty(), "{page}: {warnings}");
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "{page}: {text}"
        );
    }
    let top = stdout(&run(Command::new("man")
        .arg("-l")
        .arg(root.host_path("/usr/share/man/man1/tailtrap.1.gz"))));
    assert!(
        top.contains("tailtrap-status(1)") && top.contains("/etc/tailtrap/tailtrap.toml"),
        "{top}"
    );

    // The installed unit passes systemd's own check, by the root's systemd (a host running
    // the daemon has it; the clean root does not, hence installed now, after the checks
    // above that the package's own dependencies suffice).
    let unit =
        std::fs::read_to_string(root.host_path("/lib/systemd/system/tailtrap.service")).unwrap();
    assert!(
        unit.contains("\nExecStart=/usr/bin/tailtrap run --config /etc/tailtrap/tailtrap.toml\n"),
        "{unit}"
    );
    assert!(unit.contains("\nType=notify\n"), "{unit}");
    root.run(&[
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "systemd",
    ]);
    // man-db is not in the root: the pages were rendered above.
    let verify = root
        .command(
            &[
                "systemd-analyze",
                "verify",
                "--man=no",
                "/lib/systemd/system/tailtrap.service",
            ],
            &[],
        )
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

/// `text` (a configuration) with `key = value` set in `[table]`: the key's line replaced where
/// it is (its comment goes), else added under the table's header.
fn set_key(text: &str, table: &str, key: &str, value: &str) -> String {
    let header = format!("[{table}]");
    let mut out = Vec::new();
    let mut current = String::new();
    let mut done = false;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            current = trimmed.split('#').next().unwrap().trim().to_owned();
        }
        let is_key = trimmed
            .split_once('=')
            .is_some_and(|(k, _)| k.trim() == key && !trimmed.starts_with('#'));
        if current == header && is_key && !done {
            out.push(format!("{key} = {value}"));
            done = true;
            // A value spanning lines (an array) ends at its closing bracket.
            if trimmed.contains('[') && !trimmed.contains(']') {
                for rest in lines.by_ref() {
                    if rest.trim_start().starts_with(']') {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(line.to_owned());
        if current == header && trimmed.starts_with('[') && !done && lines.peek().is_none() {
            out.push(format!("{key} = {value}"));
            done = true;
        }
    }
    assert!(done, "no key {key} in [{table}]");
    out.join("\n") + "\n"
}

/// The previous version: `TAILTRAP_DEB_PREV`, else `deb`'s own binary packaged by
/// `scripts/package` as `<version>-0~prev`, its conffile changed as a release with other
/// defaults would have it (so the upgrade meets a conffile changed on both sides).
fn previous_deb(deb: &Path, dir: &Path) -> PathBuf {
    if let Some(prev) = std::env::var_os("TAILTRAP_DEB_PREV").filter(|v| !v.is_empty()) {
        return PathBuf::from(prev);
    }
    let version = deb_field(deb, "Version");
    let upstream = version.rsplit_once('-').unwrap().0;
    let unpacked = dir.join("new");
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&unpacked));
    let out = run(Command::new(repo().join("scripts/package"))
        .arg("--binary")
        .arg(unpacked.join("usr/bin/tailtrap"))
        .args(["--version", &format!("{upstream}-0~prev"), "-o"])
        .arg(dir)
        .stderr(Stdio::inherit()));
    let prev = PathBuf::from(stdout(&out).lines().last().unwrap().trim());
    // Its conffile as an older release's: one default differs from the new package's.
    let tree = dir.join("prev-tree");
    run(Command::new("dpkg-deb").arg("-R").arg(&prev).arg(&tree));
    let conf = tree.join("etc/tailtrap/tailtrap.toml");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, set_key(&text, "daemon", "retention_every", "\"5m\"")).unwrap();
    // etc/ is not in DEBIAN/md5sums: dpkg checks conffiles by their own hashes.
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&tree)
        .arg(&prev));
    prev
}

/// The daemon of the package, run inside the root as the unit would (`tailtrap run --config
/// /etc/tailtrap/tailtrap.toml`); SIGKILLed on drop if still running.
struct RootDaemon {
    child: Child,
    log: PathBuf,
}

impl RootDaemon {
    fn start(root: &DebRoot, log: PathBuf) -> RootDaemon {
        // What the unit's RuntimeDirectory= would make.
        let run_dir = root.host_path("/run/tailtrap");
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let child = root
            .command(
                &[
                    "/usr/bin/tailtrap",
                    "run",
                    "--config",
                    "/etc/tailtrap/tailtrap.toml",
                ],
                &[("RUST_LOG", "info")],
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        RootDaemon { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Poll `f` every 200 ms until it returns `Some`; panics with the log when the daemon
    /// exits first or after `timeout`.
    fn wait_for<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut() -> Option<T>,
    ) -> T {
        let (child, log) = (&mut self.child, &self.log);
        let read_log = || std::fs::read_to_string(log).unwrap_or_default();
        poll_until(timeout, what, read_log, || {
            let found = f();
            assert!(
                found.is_some() || matches!(child.try_wait(), Ok(None)),
                "the daemon exited waiting for {what}; its log:\n{}",
                read_log()
            );
            found
        })
    }

    /// SIGTERM (what `systemctl stop` and the upgrade's restart send) and wait for a clean exit.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}:\n{}", self.log());
    }
}

impl Drop for RootDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The packaged CLI in the root, `--json` output parsed; `via` is its stderr's word on where
/// it read (`-v`: the daemon's API or the database).
fn root_cli(root: &DebRoot, args: &[&str]) -> (Value, String) {
    let mut all = vec!["tailtrap", "-v"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", "/etc/tailtrap/tailtrap.toml"]);
    let out = root.run(&all);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tailtrap {args:?}: not JSON ({e}): {}", stdout(&out)));
    (v, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn root_cli_text(root: &DebRoot, args: &[&str]) -> String {
    let mut all = vec!["tailtrap"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", "/etc/tailtrap/tailtrap.toml"]);
    stdout(&root.run(&all))
}

/// What the database holds, read with the CLI: every incident's export (with its samples),
/// and each service's stored 1 s history over `[from, to]`.
fn stored(root: &DebRoot, from: &str, to: &str) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    let (list, _) = root_cli(root, &["incidents", "--json", "--limit", "1000"]);
    for incident in list["incidents"].as_array().unwrap() {
        let id = incident["id"].as_u64().unwrap().to_string();
        all.insert(
            format!("export {id}"),
            root_cli_text(root, &["export", &id]),
        );
    }
    for service in ["slow", "quiet"] {
        all.insert(
            format!("history {service}"),
            root_cli_text(
                root,
                &[
                    "history",
                    service,
                    "--from",
                    from,
                    "--to",
                    to,
                    "--resolution",
                    "1s",
                ],
            ),
        );
    }
    all
}

/// Until the daemon in `root` answers on its API (not the CLI reading the database).
fn wait_api(root: &DebRoot, daemon: &mut RootDaemon) {
    daemon.wait_for(Duration::from_secs(90), "the daemon's API", || {
        let out = root
            .command(
                &[
                    "tailtrap",
                    "-v",
                    "status",
                    "--json",
                    "--config",
                    "/etc/tailtrap/tailtrap.toml",
                ],
                &[],
            )
            .output()
            .unwrap();
        (out.status.success() && String::from_utf8_lossy(&out.stderr).contains("daemon's API"))
            .then_some(())
    });
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[test]
#[ignore = "needs root, BPF, debootstrap and the Debian archive: run as root with --include-ignored"]
fn an_upgrade_keeps_every_incident_and_the_edited_conffile_and_purge_asks_before_deleting_data() {
    let scratch = ScratchDir::new("package-upgrade").unwrap();
    let deb = package_deb(scratch.path());
    let version = deb_field(&deb, "Version");
    let prev = previous_deb(&deb, scratch.path());
    let prev_version = deb_field(&prev, "Version");
    let root = DebRoot::new("upgrade");
    root.run(&["apt-get", "update", "-q"]);
    root.apt_install(&prev);
    assert_eq!(
        root.installed_version().as_deref(),
        Some(prev_version.as_str())
    );

    // The operator's edits: a fast interval and detector, two services, no metrics port
    // clash with the host, no pwru (not installed in the root).
    let slow = EchoServer::spawn(Proto::Tcp).unwrap();
    let quiet = EchoServer::spawn(Proto::Tcp).unwrap();
    let conf_path = root.host_path("/etc/tailtrap/tailtrap.toml");
    let mut conf = std::fs::read_to_string(&conf_path).unwrap();
    conf = set_key(&conf, "daemon", "interval", "\"200ms\"");
    conf = set_key(&conf, "daemon", "baseline_save_every", "\"1s\"");
    conf = set_key(&conf, "metrics", "listen", "\"127.0.0.1:0\"");
    conf = set_key(&conf, "pwru", "enabled", "false");
    conf = set_key(&conf, "capture", "flight_threshold", "\"5ms\"");
    for line in SLOW_READER_DETECTOR.lines().skip(1) {
        let (k, v) = line.split_once('=').unwrap();
        conf = set_key(&conf, "detector", k.trim(), v.trim());
    }
    conf.push_str(&format!(
        "\n# Added by the operator.\n[[services]]\nname = \"slow\"\nports = [{}]\n\n[[services]]\nname = \"quiet\"\nports = [{}]\n",
        slow.addr().port(),
        quiet.addr().port()
    ));
    std::fs::write(&conf_path, &conf).unwrap();
    root.run(&["tailtrap", "config", "check", "/etc/tailtrap/tailtrap.toml"]);

    // The previous version's daemon stores history and an incident with its samples.
    let from = rfc3339(SystemTime::now() - Duration::from_secs(5));
    let mut daemon = RootDaemon::start(&root, scratch.path().join("daemon-prev.log"));
    wait_api(&root, &mut daemon);
    let _quiet_traffic = LoopingClient::start(quiet.addr(), Proto::Tcp);
    let slow_traffic = LoopingClient::start(slow.addr(), Proto::Tcp);
    daemon.wait_for(Duration::from_secs(180), "warm baselines", || {
        let (s, _) = root_cli(&root, &["status", "--json"]);
        baselines_warm(&s, "tcp-socket-read", &["slow", "quiet"]).then_some(())
    });
    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    let id = daemon.wait_for(
        Duration::from_secs(60),
        "an incident on `slow` with samples",
        || {
            let (list, _) = root_cli(&root, &["incidents", "--json", "--service", "slow"]);
            list["incidents"].as_array().unwrap().iter().find_map(|i| {
                let id = i["id"].as_u64().unwrap().to_string();
                let (samples, _) = root_cli(&root, &["samples", &id, "--json"]);
                (samples["samples"].as_array().is_some_and(|s| !s.is_empty())).then_some(id)
            })
        },
    );
    drop(slow_traffic);
    // The old daemon stops as the upgrade's restart stops it.
    daemon.stop();
    let to = rfc3339(SystemTime::now() + Duration::from_secs(1));
    std::thread::sleep(Duration::from_secs(1));
    let before = stored(&root, &from, &to);
    assert!(
        before.contains_key(&format!("export {id}")),
        "{:?}",
        before.keys()
    );
    let history = &before["history slow"];
    assert!(
        history.lines().count() > 10,
        "little history stored: {history}"
    );

    // The new version over it, non-interactively: the edited conffile stays, the new
    // package's version of it is put beside it.
    let out = root.apt_install(&deb);
    assert_eq!(
        root.installed_version().as_deref(),
        Some(version.as_str()),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&conf_path).unwrap(),
        conf,
        "the edited conffile was replaced"
    );
    if std::env::var_os("TAILTRAP_DEB_PREV").is_none() {
        assert!(root
            .host_path("/etc/tailtrap/tailtrap.toml.dpkg-dist")
            .is_file());
    }
    let state = std::fs::metadata(root.host_path("/var/lib/tailtrap")).unwrap();
    assert_eq!(state.permissions().mode() & 0o7777, 0o700);

    // The new daemon starts on the old database and serves all of it.
    let mut daemon = RootDaemon::start(&root, scratch.path().join("daemon-new.log"));
    wait_api(&root, &mut daemon);
    let after = stored(&root, &from, &to);
    for (what, text) in &before {
        assert_eq!(
            after.get(what),
            Some(text),
            "{what} differs after the upgrade"
        );
    }
    let (samples, via) = root_cli(&root, &["samples", &id, "--json", "--limit", "100000"]);
    assert!(via.contains("daemon's API"), "{via}");
    assert!(!samples["samples"].as_array().unwrap().is_empty());
    daemon.stop();

    // Remove keeps the conffile and the data; purge deletes the conffile, keeps the data.
    root.run(&["dpkg", "--remove", "tailtrap"]);
    assert!(!root.host_path("/usr/bin/tailtrap").exists());
    assert!(conf_path.is_file());
    assert!(root.host_path("/var/lib/tailtrap/db").is_dir());
    let purge = root.run(&["dpkg", "--purge", "tailtrap"]);
    assert!(
        !root.host_path("/etc/tailtrap").exists(),
        "/etc/tailtrap left after purge"
    );
    assert!(
        root.host_path("/var/lib/tailtrap/db").is_dir(),
        "purge deleted the data unasked"
    );
    assert!(
        stdout(&purge).contains("TAILTRAP_PURGE_DATA=yes"),
        "{}",
        stdout(&purge)
    );
    assert!(
        !root
            .host_path("/etc/systemd/system/multi-user.target.wants/tailtrap.service")
            .exists()
            && root
                .host_path("/etc/systemd/system/tailtrap.service")
                .symlink_metadata()
                .is_err(),
        "the unit's links outlive the purge"
    );
    // Installed again, it finds its data; purged with the operator's yes, the data goes.
    let inside = root.copy_in(&deb);
    root.run(&["dpkg", "-i", &inside]);
    run(&mut root.command(
        &["dpkg", "--purge", "tailtrap"],
        &[("TAILTRAP_PURGE_DATA", "yes")],
    ));
    assert!(
        !root.host_path("/var/lib/tailtrap").exists(),
        "TAILTRAP_PURGE_DATA=yes kept the data"
    );
    assert!(!root.host_path("/etc/tailtrap").exists());
}
