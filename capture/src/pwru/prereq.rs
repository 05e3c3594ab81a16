//! Can pwru run here? The binary, its version and flags, and the kernel features it needs.

use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::process::Command;

use super::busy;

/// Flags tailtrap passes that `pwru --help` must list (`--ready-file` is hidden, so it is
/// not checked; pwru has had it since long before `--output-json`).
const REQUIRED_FLAGS: [&str; 8] = [
    "--output-json",
    "--output-limit-lines",
    "--filter-func",
    "--filter-netns",
    "--timestamp",
    "--output-meta",
    "--output-tuple",
    "--output-caller",
];

/// How long `pwru --version` / `--help` may take. A hang guard, not a speed requirement:
/// on a loaded host (when incidents happen) starting a process can take seconds, and a
/// binary judged bad here stays so until the next check. Both probes together stay well
/// inside systemd's default start timeout (90 s); the daemon reports READY after them.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The one-word verdict of a prerequisite check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrereqStatus {
    /// Sessions can run.
    Usable,
    /// No pwru binary at the configured path or on PATH.
    MissingBinary,
    /// A binary is there but is not a pwru tailtrap can drive (version or flags).
    BadBinary,
    /// Not running as root (pwru needs CAP_BPF, CAP_PERFMON and more; tailtrap expects root).
    NotRoot,
    /// The kernel has no kprobes: pwru attaches nothing.
    NoKprobes,
    /// tracefs's `available_filter_functions` cannot be read: pwru cannot tell which
    /// functions are traceable.
    NoTracefs,
}

impl PrereqStatus {
    /// The kebab-case name used in JSON and tables.
    pub const fn name(self) -> &'static str {
        match self {
            PrereqStatus::Usable => "usable",
            PrereqStatus::MissingBinary => "missing-binary",
            PrereqStatus::BadBinary => "bad-binary",
            PrereqStatus::NotRoot => "not-root",
            PrereqStatus::NoKprobes => "no-kprobes",
            PrereqStatus::NoTracefs => "no-tracefs",
        }
    }
}

impl PrereqStatus {
    /// What an operator does about this verdict (empty for `usable`).
    pub const fn fix(self) -> &'static str {
        match self {
            PrereqStatus::Usable => "",
            PrereqStatus::MissingBinary => {
                "install pwru 1.0.12 (docs/pwru.md) and set [pwru] binary to its absolute path"
            }
            PrereqStatus::BadBinary => {
                "check that `<binary> --version` prints pwru v1.0.12 promptly; a busy host can \
                 time the check out, it is repeated at the next session request"
            }
            PrereqStatus::NotRoot => "run tailtrap as root",
            PrereqStatus::NoKprobes => "use a kernel built with CONFIG_KPROBES",
            PrereqStatus::NoTracefs => "mount tracefs: mount -t tracefs nodev /sys/kernel/tracing",
        }
    }
}

impl fmt::Display for PrereqStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the kernel can attach many kprobes in one link (pwru's faster backend).
/// A hint only: pwru falls back to plain kprobes without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KprobeMulti {
    /// The kernel has fprobe (`register_fprobe` in kallsyms), which kprobe-multi needs.
    Likely,
    /// No fprobe: pwru will use one kprobe per function.
    No,
    /// kallsyms could not be read.
    Unknown,
}

/// The state of tracefs's traceable-function list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum TracefsState {
    /// Readable at `path`.
    Readable {
        /// The `available_filter_functions` file read.
        path: PathBuf,
    },
    /// Present but not readable (this kernel refuses function tracing, or permissions).
    Unreadable {
        /// The file tried.
        path: PathBuf,
        /// The error.
        error: String,
    },
    /// Neither /sys/kernel/tracing nor /sys/kernel/debug/tracing has the file.
    NotMounted,
}

/// The result of checking pwru's prerequisites, for `status` and the session manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prerequisites {
    /// The verdict.
    pub status: PrereqStatus,
    /// One line saying what was found and, when unusable, why.
    pub summary: String,
    /// The binary found (configured path, or the first `pwru` on PATH).
    pub binary: Option<PathBuf>,
    /// Its version as `pwru --version` printed it (`v1.0.12`).
    pub version: Option<String>,
    /// Flags tailtrap needs that `pwru --help` did not list.
    pub missing_flags: Vec<String>,
    /// Whether the kernel exposes the kprobe PMU.
    pub kprobes: bool,
    /// Whether kprobe-multi is likely available.
    pub kprobe_multi: KprobeMulti,
    /// The traceable-function list.
    pub tracefs: TracefsState,
    /// Whether tailtrap runs as root.
    pub root: bool,
}

/// Where the kernel facts are read; the real system in production, a scratch tree in tests.
#[derive(Debug, Clone)]
pub(crate) struct SystemPaths {
    pub(crate) kprobe_pmu: PathBuf,
    pub(crate) tracefs_lists: [PathBuf; 2],
    pub(crate) kallsyms: PathBuf,
}

impl Default for SystemPaths {
    fn default() -> Self {
        SystemPaths {
            kprobe_pmu: "/sys/bus/event_source/devices/kprobe".into(),
            tracefs_lists: [
                "/sys/kernel/tracing/available_filter_functions".into(),
                "/sys/kernel/debug/tracing/available_filter_functions".into(),
            ],
            kallsyms: "/proc/kallsyms".into(),
        }
    }
}

impl Prerequisites {
    /// Check everything: `configured` is the binary from the configuration, if any (else
    /// `pwru` is looked up on PATH). Runs `pwru --version` and `pwru --help` (5 s each at
    /// most) and reads sysfs, tracefs and kallsyms.
    pub async fn check(configured: Option<&Path>) -> Prerequisites {
        let path_var = std::env::var_os("PATH").unwrap_or_default();
        check_with(configured, &path_var, &SystemPaths::default()).await
    }

    /// Whether sessions can run.
    pub fn is_usable(&self) -> bool {
        self.status == PrereqStatus::Usable
    }

    /// `(item, value)` rows for the pwru part of `tailtrap status`.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
        vec![
            ("pwru", self.status.name().to_owned()),
            (
                "pwru binary",
                self.binary
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |b| b.display().to_string()),
            ),
            (
                "pwru version",
                self.version.clone().unwrap_or_else(|| "-".into()),
            ),
            ("kprobes", yes_no(self.kprobes)),
            (
                "kprobe-multi",
                match self.kprobe_multi {
                    KprobeMulti::Likely => "likely",
                    KprobeMulti::No => "no",
                    KprobeMulti::Unknown => "unknown",
                }
                .to_owned(),
            ),
            (
                "tracefs functions",
                match &self.tracefs {
                    TracefsState::Readable { path } => format!("readable ({})", path.display()),
                    TracefsState::Unreadable { path, error } => {
                        format!("unreadable ({}: {error})", path.display())
                    }
                    TracefsState::NotMounted => "not mounted".to_owned(),
                },
            ),
            ("root", yes_no(self.root)),
            ("pwru verdict", self.summary.clone()),
        ]
    }
}

pub(crate) async fn check_with(
    configured: Option<&Path>,
    path_var: &OsStr,
    sys: &SystemPaths,
) -> Prerequisites {
    let located = match configured {
        Some(p) if is_executable(p) => Ok(p.to_owned()),
        Some(p) => Err(format!(
            "configured pwru {} is not an executable file",
            p.display()
        )),
        None => find_on_path(path_var).ok_or_else(|| "pwru not found on PATH".to_owned()),
    };
    let mut version = None;
    let mut missing_flags = Vec::new();
    let mut binary_problem = None;
    if let Ok(bin) = &located {
        match run_probe(bin, "--version").await {
            Ok(out) => match parse_version(&out) {
                Some(v) => version = Some(v),
                None => {
                    binary_problem = Some(format!(
                        "{} --version printed {:?}, not \"pwru <version>\"",
                        bin.display(),
                        out.trim()
                    ))
                }
            },
            Err(e) => binary_problem = Some(format!("{} --version: {e}", bin.display())),
        }
        if binary_problem.is_none() {
            match run_probe(bin, "--help").await {
                Ok(help) => {
                    missing_flags = REQUIRED_FLAGS
                        .iter()
                        .filter(|f| !lists_flag(&help, f))
                        .map(|f| (*f).to_owned())
                        .collect();
                    if !missing_flags.is_empty() {
                        binary_problem = Some(format!(
                            "{} {} lacks {} (pwru 1.0.12 or newer has them)",
                            bin.display(),
                            version.as_deref().unwrap_or("?"),
                            missing_flags.join(", ")
                        ));
                    }
                }
                Err(e) => binary_problem = Some(format!("{} --help: {e}", bin.display())),
            }
        }
    }
    // Scanning kallsyms reads ~10 MB: off the async workers.
    let facts = sys.clone();
    let kernel = tokio::task::spawn_blocking(move || {
        (
            facts.kprobe_pmu.exists(),
            kprobe_multi_hint(&facts.kallsyms),
            tracefs_state(&facts.tracefs_lists),
        )
    })
    .await;
    let (kprobes, kprobe_multi, tracefs) = match kernel {
        Ok(k) => k,
        // Only a panic in the closure gets here; report nothing as available.
        Err(_) => (false, KprobeMulti::Unknown, TracefsState::NotMounted),
    };
    let root = nix::unistd::geteuid().is_root();

    let (status, summary) = match (&located, &binary_problem) {
        (Err(why), _) => (
            PrereqStatus::MissingBinary,
            format!("missing binary: {why}"),
        ),
        (Ok(_), Some(why)) => (PrereqStatus::BadBinary, format!("bad binary: {why}")),
        (Ok(bin), None) => {
            let what = format!(
                "pwru {} at {}",
                version.as_deref().unwrap_or("?"),
                bin.display()
            );
            if !root {
                (
                    PrereqStatus::NotRoot,
                    format!("not root: {what} needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)"),
                )
            } else if !kprobes {
                (
                    PrereqStatus::NoKprobes,
                    format!(
                        "no kprobes: {} is absent (kernel without CONFIG_KPROBES), so {what} cannot attach",
                        sys.kprobe_pmu.display()
                    ),
                )
            } else if let TracefsState::Readable { path } = &tracefs {
                let backend = match kprobe_multi {
                    KprobeMulti::Likely => "kprobe-multi likely",
                    KprobeMulti::No => "plain kprobes (no kprobe-multi)",
                    KprobeMulti::Unknown => "kprobe-multi unknown",
                };
                (
                    PrereqStatus::Usable,
                    format!(
                        "usable: {what}, {backend}, function list {}",
                        path.display()
                    ),
                )
            } else {
                let why = match &tracefs {
                    TracefsState::Unreadable { path, error } => {
                        format!("{} is unreadable ({error})", path.display())
                    }
                    _ => {
                        "tracefs is not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing"
                            .to_owned()
                    }
                };
                (
                    PrereqStatus::NoTracefs,
                    format!("no tracefs: {why}, so {what} cannot find traceable functions"),
                )
            }
        }
    };
    Prerequisites {
        status,
        summary,
        binary: located.ok(),
        version,
        missing_flags,
        kprobes,
        kprobe_multi,
        tracefs,
        root,
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(crate) fn find_on_path(path_var: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var)
        .filter(|d| d.is_absolute())
        .map(|d| d.join("pwru"))
        .find(|p| is_executable(p))
}

/// Run `bin arg` and return stdout and stderr together (pwru prints its usage to stderr).
async fn run_probe(bin: &Path, arg: &str) -> Result<String, String> {
    let mut cmd = Command::new(bin);
    cmd.arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = async { busy::spawn(&mut cmd).await?.wait_with_output().await };
    match tokio::time::timeout(PROBE_TIMEOUT, child).await {
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(PROBE_TIMEOUT)
        )),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(out)) => {
            let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&out.stderr));
            Ok(s)
        }
    }
}

/// `pwru v1.0.12\n` -> `v1.0.12`.
fn parse_version(out: &str) -> Option<String> {
    let v = out.lines().next()?.trim().strip_prefix("pwru ")?.trim();
    let digits = v.strip_prefix('v').unwrap_or(v);
    let numeric = digits.split(['.', '-', '+']).next()?;
    (!numeric.is_empty() && numeric.chars().all(|c| c.is_ascii_digit())).then(|| v.to_owned())
}

/// Whether a usage text lists `flag` as an option (not as a substring of a longer one).
fn lists_flag(help: &str, flag: &str) -> bool {
    help.lines().any(|l| {
        l.split_whitespace()
            .any(|w| w.trim_end_matches(',') == flag)
    })
}

fn kprobe_multi_hint(kallsyms: &Path) -> KprobeMulti {
    let Ok(f) = std::fs::File::open(kallsyms) else {
        return KprobeMulti::Unknown;
    };
    let mut found = false;
    for line in BufReader::new(f).lines() {
        let Ok(line) = line else {
            return KprobeMulti::Unknown;
        };
        if line.split_whitespace().nth(2) == Some("register_fprobe") {
            found = true;
            break;
        }
    }
    if found {
        KprobeMulti::Likely
    } else {
        KprobeMulti::No
    }
}

fn tracefs_state(lists: &[PathBuf]) -> TracefsState {
    let mut unreadable = None;
    for path in lists {
        let read = std::fs::File::open(path).and_then(|mut f| {
            let mut buf = [0u8; 256];
            f.read(&mut buf)
        });
        match read {
            Ok(n) if n > 0 => return TracefsState::Readable { path: path.clone() },
            Ok(_) => {
                unreadable.get_or_insert(TracefsState::Unreadable {
                    path: path.clone(),
                    error: "empty".into(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                unreadable.get_or_insert(TracefsState::Unreadable {
                    path: path.clone(),
                    error: e.to_string(),
                });
            }
        }
    }
    unreadable.unwrap_or(TracefsState::NotMounted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_pwru() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-pwru/pwru")
    }

    /// A scratch system with kprobes, kprobe-multi and a readable function list.
    fn capable_system(dir: &Path) -> SystemPaths {
        std::fs::create_dir_all(dir.join("kprobe")).unwrap();
        std::fs::write(dir.join("aff"), "tcp_v4_rcv\nudp_rcv\n").unwrap();
        std::fs::write(
            dir.join("kallsyms"),
            "ffffffff81000000 T _stext\nffffffff8123 T register_fprobe\n",
        )
        .unwrap();
        SystemPaths {
            kprobe_pmu: dir.join("kprobe"),
            tracefs_lists: [dir.join("missing"), dir.join("aff")],
            kallsyms: dir.join("kallsyms"),
        }
    }

    #[test]
    fn version_parsing() {
        assert_eq!(parse_version("pwru v1.0.12\n").as_deref(), Some("v1.0.12"));
        assert_eq!(
            parse_version("pwru 1.0.5-dirty").as_deref(),
            Some("1.0.5-dirty")
        );
        assert_eq!(parse_version("pwru version unknown"), None);
        assert_eq!(parse_version("Usage: x"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn help_flags_match_whole_words() {
        let help = include_str!("../../testdata/pwru/pwru-help.txt");
        for f in REQUIRED_FLAGS {
            assert!(lists_flag(help, f), "{f} not found in real help");
        }
        assert!(!lists_flag(help, "--output"));
        assert!(!lists_flag(help, "--ready-file"));
    }

    #[tokio::test]
    #[ignore = "needs root (the scratch system fakes the kernel, not the uid): run as root with --include-ignored"]
    async fn usable_on_a_capable_system() {
        let dir = tempfile::tempdir().unwrap();
        let sys = capable_system(dir.path());
        let p = check_with(Some(&fake_pwru()), OsStr::new(""), &sys).await;
        assert_eq!(p.status, PrereqStatus::Usable, "{}", p.summary);
        assert_eq!(p.version.as_deref(), Some("v1.0.12"));
        assert_eq!(p.kprobe_multi, KprobeMulti::Likely);
        assert!(
            p.summary.starts_with("usable: pwru v1.0.12 at "),
            "{}",
            p.summary
        );
        assert!(p.is_usable());
        let rows = p.rows();
        assert_eq!(rows[0], ("pwru", "usable".to_owned()));
        assert_eq!(rows[2], ("pwru version", "v1.0.12".to_owned()));
        assert_eq!(rows[3], ("kprobes", "yes".to_owned()));
        assert_eq!(
            rows[5],
            (
                "tracefs functions",
                format!("readable ({})", dir.path().join("aff").display())
            )
        );
    }

    #[tokio::test]
    #[ignore = "needs root (the scratch system fakes the kernel, not the uid): run as root with --include-ignored"]
    async fn each_missing_piece_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut sys = capable_system(dir.path());
        let fake = fake_pwru();

        let p = check_with(None, OsStr::new("/nonexistent:relative/dir"), &sys).await;
        assert_eq!(p.status, PrereqStatus::MissingBinary);
        assert_eq!(p.summary, "missing binary: pwru not found on PATH");

        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        let p = check_with(Some(&plain), OsStr::new(""), &sys).await;
        assert_eq!(p.status, PrereqStatus::MissingBinary);
        assert!(
            p.summary.ends_with("plain is not an executable file"),
            "{}",
            p.summary
        );

        // Something executable that is not pwru.
        let p = check_with(Some(Path::new("/bin/true")), OsStr::new(""), &sys).await;
        assert_eq!(p.status, PrereqStatus::BadBinary, "{}", p.summary);

        std::fs::write(dir.path().join("aff"), "").unwrap();
        let p = check_with(Some(&fake), OsStr::new(""), &sys).await;
        assert_eq!(p.status, PrereqStatus::NoTracefs, "{}", p.summary);
        sys.tracefs_lists = [dir.path().join("a"), dir.path().join("b")];
        let p = check_with(Some(&fake), OsStr::new(""), &sys).await;
        assert_eq!(p.tracefs, TracefsState::NotMounted);
        assert_eq!(p.status, PrereqStatus::NoTracefs);

        std::fs::remove_dir(dir.path().join("kprobe")).unwrap();
        let p = check_with(Some(&fake), OsStr::new(""), &sys).await;
        assert_eq!(p.status, PrereqStatus::NoKprobes);
    }

    #[test]
    fn path_lookup_finds_the_first_executable() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("pwru"), "not executable").unwrap();
        std::fs::copy(fake_pwru(), b.join("pwru")).unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        assert_eq!(find_on_path(&path), Some(b.join("pwru")));
    }
}
