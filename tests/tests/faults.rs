//! Reliability of the real daemon under load and faults (issue 13), with a real TCP service
//! whose application read slows down so that an incident opens, capture arms and a pwru
//! stand-in session runs:
//! - 64 concurrent API clients listing incidents and paging samples while the incident is
//!   open: every response complete, no interval late by more than 20 ms;
//! - SIGKILL of the daemon during that incident with pwru running: no pwru survives, the
//!   dead daemon's BPF programs, maps and links are gone, nothing is pinned, and the restart
//!   marks the incident interrupted with its capture and pwru states closed with a reason,
//!   with every record acknowledged before the kill readable.
//!
//! `TAILTRAP_LOAD_SECS` sets the load's length (default 10 s; tests/soak/api-load.sh runs
//! it for 60). Needs root and the `tailtrap` binary of the same build.
#![allow(clippy::unwrap_used)] // test code: a failed step should panic with its context

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tailtrap_tests::{
    baselines_warm, cli_json, fake_pwru, Daemon, DaemonConfig, LoopingClient, Proto, ScratchDir,
    ServerOpts, TcpServer, SLOW_READER_DETECTOR,
};

/// One `GET` on a fresh connection: the status code and the body, checked complete against
/// its Content-Length.
fn get(socket: &Path, target: &str) -> Result<(u16, Value), String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&resp[..split]).to_lowercase();
    let body = &resp[split + 4..];
    let code: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status")?;
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or("no content-length")?;
    if body.len() != length {
        return Err(format!("incomplete: {} of {length} bytes", body.len()));
    }
    let v = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    Ok((code, v))
}

/// BPF object ids (programs, maps, links) the process holds, from its fdinfo.
fn bpf_ids(pid: u32) -> BTreeSet<(&'static str, u32)> {
    let mut ids = BTreeSet::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            for (key, kind) in [
                ("prog_id:", "prog"),
                ("map_id:", "map"),
                ("link_id:", "link"),
            ] {
                if let Some(v) = line.strip_prefix(key) {
                    if let Ok(id) = v.trim().parse() {
                        ids.insert((kind, id));
                    }
                }
            }
        }
    }
    ids
}

/// Whether the kernel still has the BPF object (BPF_*_GET_FD_BY_ID).
fn bpf_object_exists(kind: &str, id: u32) -> bool {
    let cmd = match kind {
        "prog" => 13,
        "map" => 14,
        _ => 30,
    };
    let attr = [id, 0, 0, 0];
    // SAFETY: the attr buffer is valid for its size; a returned fd is closed at once.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd >= 0 {
        // SAFETY: fd was just returned to us and is not used elsewhere.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT)
}

/// The daemon's worst interval lateness over `secs` (at least 10): its status reports the
/// worst of the last 10 s, read every 10 s.
fn worst_lateness(socket: &Path, secs: u64) -> u64 {
    let mut worst = 0;
    let start = Instant::now();
    while start.elapsed() + Duration::from_secs(5) < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(10));
        let (code, s) = get(socket, "/v1/status").unwrap();
        assert_eq!(code, 200, "{s}");
        let late = s["daemon"]["worst_interval_ns"].as_u64().unwrap();
        // The wake-up is a part of the lateness, measured on the same ticks.
        let wakeup = s["daemon"]["worst_wakeup_ns"].as_u64().unwrap();
        assert!(wakeup <= late, "wake-up {wakeup} ns of lateness {late} ns");
        worst = worst.max(late);
    }
    worst
}

fn pinned() -> BTreeSet<PathBuf> {
    std::fs::read_dir("/sys/fs/bpf")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

fn config(dir: &Path, port: u16, pwru: &Path) -> PathBuf {
    DaemonConfig::new(dir)
        .daemon_keys("baseline_save_every = \"1s\"\npwru_ignore_prerequisites = true")
        .without_metrics()
        .service("slow", port)
        .table(SLOW_READER_DETECTOR)
        .table("[capture]\nflight_threshold = \"5ms\"")
        .pwru_keys(&format!(
            r#"binary = "{pwru}"
# The session must still run when the daemon is killed: slow lines, a long deadline.
deadline = "300s"
output_limit_lines = 1000
kill_grace = "30s"
cooldown = "1s""#,
            pwru = pwru.display(),
        ))
        .write()
        .unwrap()
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn api_load_during_an_incident_then_sigkill_with_pwru_running() {
    let scratch = ScratchDir::new("faults").unwrap();
    let dir = scratch.path();
    let slow = TcpServer::spawn(ServerOpts::loopback()).unwrap();
    // The stand-in, one line a second, its pid in a file.
    let pwru = dir.join("pwru");
    std::fs::write(
        &pwru,
        format!(
            "#!/bin/sh\necho $$ >'{}'\nexport FAKE_PWRU_LINE_DELAY=1\nexec '{}' \"$@\"\n",
            dir.join("pwru.pid").display(),
            fake_pwru().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&pwru, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = config(dir, slow.addr().port(), &pwru);
    let socket = dir.join("api.sock");
    let pinned_before = pinned();

    let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let _traffic = LoopingClient::start(slow.addr(), Proto::Tcp);
    daemon.wait_for(Duration::from_secs(60), "a warm baseline", || {
        let (s, _) = cli_json(&config, &["status", "--json"]);
        baselines_warm(&s, "tcp-socket-read", &["slow"]).then_some(())
    });
    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    let id = daemon.wait_for(
        Duration::from_secs(60),
        "an open incident with pwru running",
        || {
            let (v, _) = cli_json(&config, &["incidents", "--json", "--open"]);
            let inc = v["incidents"].as_array()?.first()?.clone();
            (inc["pwru"]["state"] == "running" && dir.join("pwru.pid").exists())
                .then(|| inc["id"].as_u64().unwrap())
        },
    );
    eprintln!("incident {id} open, pwru running");

    // --- The daemon's own lateness on this machine first, without API clients.
    let idle_late_ns = worst_lateness(&socket, 10);
    // --- Then 64 clients for the load's length.
    let secs: u64 = std::env::var("TAILTRAP_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(10);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let slowest = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..64)
        .map(|n| {
            let (stop, ok, bad, slowest) = (stop.clone(), ok.clone(), bad.clone(), slowest.clone());
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                let mut cursor: Option<(u64, u64)> = None;
                while !stop.load(Ordering::Relaxed) {
                    let target = if n % 2 == 0 {
                        "/v1/incidents?limit=50".to_string()
                    } else {
                        match cursor {
                            Some((t, s)) => format!(
                                "/v1/incidents/{id}/samples?limit=100&after_time_ns={t}&after_seq={s}"
                            ),
                            None => format!("/v1/incidents/{id}/samples?limit=100"),
                        }
                    };
                    let start = Instant::now();
                    match get(&socket, &target) {
                        Ok((200, v)) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            if n % 2 == 1 {
                                let next = &v["next"];
                                cursor = next["time_ns"]
                                    .as_u64()
                                    .zip(next["seq"].as_u64());
                            }
                        }
                        Ok((code, v)) => {
                            bad.fetch_add(1, Ordering::Relaxed);
                            errors.push(format!("{target}: {code} {v}"));
                        }
                        Err(e) => {
                            bad.fetch_add(1, Ordering::Relaxed);
                            errors.push(format!("{target}: {e}"));
                        }
                    }
                    let us = start.elapsed().as_micros() as u64;
                    slowest.fetch_max(us, Ordering::Relaxed);
                }
                errors
            })
        })
        .collect();
    let worst_late_ns = worst_lateness(&socket, secs);
    stop.store(true, Ordering::Relaxed);
    let errors: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let (ok, bad) = (ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed));
    eprintln!(
        "api load: 64 clients for {secs} s: {ok} complete responses ({:.0}/s), {bad} bad, \
         slowest {:.1} ms; worst interval lateness {:.1} ms (without clients {:.1} ms)",
        ok as f64 / secs as f64,
        slowest.load(Ordering::Relaxed) as f64 / 1e3,
        worst_late_ns as f64 / 1e6,
        idle_late_ns as f64 / 1e6,
    );
    assert!(
        errors.is_empty(),
        "{} bad responses: {:#?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    assert!(ok > 0);
    // What the clients add. The 20 ms target is checked by tests/soak/api-load.sh
    // (TAILTRAP_LOAD_STRICT=1) on a quiet machine; a shared CI machine running builds and
    // VMs makes intervals late by hundreds of ms on its own (610 ms seen with clients against
    // 243 ms without while builds ran), so CI bounds it loosely.
    let allowed = if std::env::var_os("TAILTRAP_LOAD_STRICT").is_some() {
        20_000_000
    } else {
        1_000_000_000
    };
    assert!(
        worst_late_ns <= idle_late_ns + allowed,
        "an interval was {:.1} ms late under API load, {:.1} ms without",
        worst_late_ns as f64 / 1e6,
        idle_late_ns as f64 / 1e6
    );

    // --- SIGKILL with the incident open and pwru running.
    let (before, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert_eq!(before["incident"]["state"], "open");
    assert_eq!(before["incident"]["pwru"]["state"], "running", "{before}");
    let samples_before = before["summary"]["count"].as_u64().unwrap();
    let (pwru_before, _) = cli_json(&config, &["pwru", &id.to_string(), "--json"]);
    let lines_before = pwru_before["lines"].as_array().unwrap().len();
    let pwru_pid: u32 = std::fs::read_to_string(dir.join("pwru.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        Path::new(&format!("/proc/{pwru_pid}")).exists(),
        "pwru is not running"
    );
    // The daemon ran itself again with glibc's per-thread caches off; its children get the
    // environment it was given (no tunables here), not that of its second execution.
    let environ = std::fs::read(format!("/proc/{pwru_pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        !environ.contains("GLIBC_TUNABLES") && !environ.contains("TAILTRAP_GIVEN"),
        "pwru's environment: {environ}"
    );
    // What the store promises to keep is what it had flushed (within `flush_every`, 500 ms
    // by default): wait past that before the kill, so everything counted above is promised.
    std::thread::sleep(Duration::from_secs(2));
    let held = bpf_ids(daemon.pid());
    assert!(
        held.iter().any(|(k, _)| *k == "prog"),
        "no BPF programs held: {held:?}"
    );
    daemon.kill().unwrap();
    let gone = |what: &str, f: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{what} 10 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    gone("pwru still runs", &|| {
        !Path::new(&format!("/proc/{pwru_pid}")).exists()
    });
    gone("BPF objects of the dead daemon remain", &|| {
        held.iter().all(|(k, id)| !bpf_object_exists(k, *id))
    });
    assert_eq!(pinned(), pinned_before, "objects pinned in /sys/fs/bpf");
    eprintln!(
        "after SIGKILL: pwru {pwru_pid} gone, {} BPF objects gone, nothing pinned",
        held.len()
    );

    // Restart: the incident is interrupted, its capture and pwru states closed with a reason,
    // and everything stored before the kill is there.
    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let (after, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    let inc = &after["incident"];
    assert_eq!(inc["state"], "interrupted", "{after}");
    assert_eq!(inc["pwru"]["state"], "failed", "{after}");
    assert!(
        inc["pwru"]["message"]
            .as_str()
            .unwrap()
            .contains("tailtrap stopped"),
        "{after}"
    );
    assert_ne!(inc["capture"]["state"], "armed", "{after}");
    assert!(after["summary"]["count"].as_u64().unwrap() >= samples_before);
    let (pwru_after, _) = cli_json(&config, &["pwru", &id.to_string(), "--json"]);
    assert!(pwru_after["lines"].as_array().unwrap().len() >= lines_before);
    eprintln!(
        "restart: incident {id} {}, pwru {} ({}), capture {}, {} samples and {} pwru lines kept",
        inc["state"],
        inc["pwru"]["state"],
        inc["pwru"]["message"],
        inc["capture"]["state"],
        after["summary"]["count"],
        pwru_after["lines"].as_array().unwrap().len()
    );
}

/// A damaged database at start: the daemon says what happened and how to recover, keeps the
/// old files, and does not start empty over them silently.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn damaged_database_at_start_is_kept_aside_with_a_recovery_message() {
    let scratch = ScratchDir::new("faults-corrupt").unwrap();
    let dir = scratch.path();
    let config = config(dir, 9, &fake_pwru());
    let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    daemon.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    assert!(daemon.wait_exit(Duration::from_secs(60)).unwrap().is_some());
    // Overwrite the head and a middle stretch of sled's data file.
    let file = dir.join("db/db");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[..64].fill(0xab);
    bytes[n / 4..n / 2].fill(0xab);
    std::fs::write(&file, &bytes).unwrap();

    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let log = daemon.log();
    let line = log
        .lines()
        .find(|l| l.contains("the database was damaged"))
        .unwrap_or_else(|| panic!("no damage message:\n{log}"));
    eprintln!("{line}");
    assert!(line.contains("tailtrap db check --db") && line.contains("docs/operations.md"));
    let aside: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged files are kept aside");
    // Kept, not necessarily byte for byte: sled's own recovery writes to the file while
    // it tries to open it.
    let kept = std::fs::metadata(aside[0].path().join("db")).unwrap().len();
    assert!(kept > 0, "the damaged data file is kept");
}

/// A daemon held off the CPU (SIGSTOP, as a frozen cgroup or a debugger would) says, once
/// it runs again, that its interval began late, by how much, and that neither its own
/// work nor a wait for a CPU was the cause.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn a_daemon_held_off_the_cpu_says_its_interval_began_late_and_why() {
    use nix::sys::signal::Signal;
    let scratch = ScratchDir::new("faults-stopped").unwrap();
    let dir = scratch.path();
    let config = config(dir, 9, &fake_pwru());
    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    daemon.signal(Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    daemon.signal(Signal::SIGCONT).unwrap();
    let line = daemon.wait_for(Duration::from_secs(30), "the late interval's line", || {
        daemon
            .log()
            .lines()
            .find(|l| l.contains("interval began late"))
            .map(str::to_owned)
    });
    eprintln!("{line}");
    let field = |name: &str| -> f64 {
        let at = line
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {line}"));
        let rest = &line[at + name.len() + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        rest[..end]
            .parse()
            .unwrap_or_else(|e| panic!("{name} in {line}: {e}"))
    };
    // The tick was due during the stop (intervals are 200 ms): at least the stop's
    // remainder late, however busy the machine.
    let late = field("late_ms");
    assert!(late >= 350.0, "late by {late} ms: {line}");
    // A stopped thread is not waiting for a CPU, and the loop was idle when it was due.
    assert!(field("loop_busy_ms") < late / 2.0, "{line}");
    assert!(field("waited_for_cpu_ms") < late / 2.0, "{line}");
    assert!(line.contains("busy_with="), "{line}");
}

/// An ext4 file system on a loop device, mounted `errors=remount-ro` as distributions mount
/// their disks; unmounted (and its loop device freed) when dropped.
struct LoopExt4 {
    image: PathBuf,
    mount: PathBuf,
}

impl LoopExt4 {
    fn create(dir: &Path) -> LoopExt4 {
        let fs = LoopExt4 {
            image: dir.join("ext4.img"),
            mount: dir.join("mnt"),
        };
        std::fs::create_dir_all(&fs.mount).unwrap();
        let image = std::fs::File::create(&fs.image).unwrap();
        image.set_len(96 << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F"], &fs.image);
        fs.mount();
        fs
    }

    fn mount(&self) {
        let status = std::process::Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&self.image)
            .arg(&self.mount)
            .status()
            .unwrap();
        assert!(status.success(), "mounting {}", self.image.display());
    }

    fn unmount(&self) {
        run("umount", &[], &self.mount);
    }

    /// Report an ext4 error, as a failing disk or a damaged block would: with
    /// `errors=remount-ro` the kernel turns the file system read-only under its users, and
    /// it stays so until it is unmounted and checked.
    fn fail(&self) {
        let out = std::process::Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.mount)
            .output()
            .unwrap();
        let source = String::from_utf8(out.stdout).unwrap();
        let device = Path::new(source.trim()).file_name().unwrap().to_owned();
        let trigger = Path::new("/sys/fs/ext4")
            .join(device)
            .join("trigger_fs_error");
        std::fs::write(&trigger, "tailtrap test: the disk failed").unwrap();
    }

    /// `e2fsck -fy`, as an operator would before mounting it again.
    fn check(&self) {
        let status = std::process::Command::new("e2fsck")
            .arg("-fy")
            .arg(&self.image)
            .status()
            .unwrap();
        // 0: clean; 1: errors corrected.
        assert!(matches!(status.code(), Some(0 | 1)), "e2fsck: {status}");
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
    }
}

fn run(program: &str, args: &[&str], path: &Path) {
    let status = std::process::Command::new(program)
        .args(args)
        .arg(path)
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        status.success(),
        "{program} {args:?} {}: {status}",
        path.display()
    );
}

/// The database's file system turned read-only by the kernel under a running daemon (an
/// ext4 error with `errors=remount-ro`): writes fail and are counted, one error line says
/// so and what to do, detection goes on, stored records stay readable through the API (the
/// failed engine is kept rather than reopened onto a file system that takes no writes),
/// and the daemon stops cleanly. After the operator's check and a restart, everything
/// acknowledged before the failure is there and writes work again.
#[test]
#[ignore = "needs root and BPF (and a loop device): run as root with --include-ignored"]
fn a_file_system_turned_read_only_under_the_daemon_keeps_detection_and_reads() {
    let scratch = ScratchDir::new("faults-readonly").unwrap();
    let dir = scratch.path();
    let fs = LoopExt4::create(dir);
    let slow = TcpServer::spawn(ServerOpts::loopback()).unwrap();
    let config = config(dir, slow.addr().port(), &fake_pwru());
    // The database on the loop file system, without the free-space reserve (128 MiB, more
    // than the whole file system).
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("db = \"{}/db\"", dir.display()),
        &format!("db = \"{}/db\"", fs.mount.display()),
    ) + "\n[storage]\nmin_free_bytes = 0\n";
    std::fs::write(&config, text).unwrap();
    let status = |config: &Path| cli_json(config, &["status", "--json"]).0;

    let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let _traffic = LoopingClient::start(slow.addr(), Proto::Tcp);
    daemon.wait_for(Duration::from_secs(60), "a warm baseline", || {
        baselines_warm(&status(&config), "tcp-socket-read", &["slow"]).then_some(())
    });
    // An incident, with samples, opened and closed before the failure.
    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    let id = daemon.wait_for(Duration::from_secs(60), "an incident with samples", || {
        let (v, _) = cli_json(&config, &["incidents", "--json", "--open"]);
        let id = v["incidents"].as_array()?.first()?["id"].as_u64()?;
        let (show, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
        (show["summary"]["count"].as_u64()? > 0).then_some(id)
    });
    slow.set_read_delay(Duration::ZERO).unwrap();
    let before = daemon.wait_for(Duration::from_secs(120), "the incident closed", || {
        let (show, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
        (show["incident"]["state"] == "closed").then_some(show)
    });
    let samples_before = before["summary"]["count"].as_u64().unwrap();
    // Acknowledged: flushed within `flush_every`.
    std::thread::sleep(Duration::from_secs(2));

    fs.fail();
    let failed_at = Instant::now();
    let store = daemon.wait_for(Duration::from_secs(60), "writes failing", || {
        let s = status(&config);
        (s["store"]["engine_failed"] == true).then(|| s["store"].clone())
    });
    eprintln!("after the failure: {store}");
    assert!(store["write_errors"].as_u64().unwrap() > 0, "{store}");
    assert!(
        store["engine_failure"]
            .as_str()
            .is_some_and(|f| f.contains("Read-only file system")),
        "{store}"
    );

    // Detection goes on: a new slowdown opens an incident (whose record cannot be stored).
    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    daemon.wait_for(
        Duration::from_secs(60),
        "an incident after the failure",
        || {
            let s = status(&config);
            let open = s["open_incidents"].as_array()?;
            open.iter()
                .any(|i| i["id"].as_u64().is_some_and(|n| n != id))
                .then_some(())
        },
    );
    slow.set_read_delay(Duration::ZERO).unwrap();
    // Past a recovery attempt (every 10 s): the failed engine stays, and reads are answered.
    std::thread::sleep(
        (storage::RECOVER_EVERY + Duration::from_secs(2)).saturating_sub(failed_at.elapsed()),
    );
    let s = status(&config);
    assert_eq!(s["store"]["engine_failed"], true, "{}", s["store"]);
    let (during, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert_eq!(during["incident"]["state"], "closed", "{during}");
    assert_eq!(during["summary"]["count"].as_u64(), Some(samples_before));
    let log = daemon.log();
    let failing: Vec<_> = log
        .lines()
        .filter(|l| l.contains("database writes are failing"))
        .collect();
    assert_eq!(failing.len(), 1, "one error line for the spell:\n{log}");
    assert!(
        failing[0].contains("Read-only file system") && failing[0].contains("docs/operations.md"),
        "{}",
        failing[0]
    );
    eprintln!("{}", failing[0]);
    // Said once, not at every write: what the daemon logged beyond that line and sled's own
    // retries of its periodic fsync.
    let others: Vec<_> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| !l.contains("database writes are failing") && !l.contains("periodic flush"))
        .collect();
    eprintln!("other warnings and errors:\n{}", others.join("\n"));
    // The spell lasted over 60 intervals with an incident capturing: a line per write (or
    // per interval) would be far more.
    assert!(
        others.len() <= 12,
        "{} more warnings and errors during the failure",
        others.len()
    );

    daemon.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let exit = daemon.wait_exit(Duration::from_secs(60)).unwrap();
    assert!(exit.is_some(), "the daemon did not stop on SIGTERM");
    eprintln!(
        "stopped ({:?}); {} writes failed in all",
        exit, s["store"]["write_errors"]
    );

    // Started again before the file system is checked: refused, saying why and what to do.
    let mut early = Daemon::start(&config, dir, &[]).unwrap();
    let exit = early.wait_exit(Duration::from_secs(60)).unwrap();
    assert!(
        exit.is_some_and(|e| !e.success()),
        "a start on the read-only file system: {exit:?}"
    );
    let log = early.log();
    let line = log
        .lines()
        .find(|l| l.starts_with("tailtrap: error:"))
        .unwrap_or_else(|| panic!("no error line:\n{log}"));
    assert!(
        line.contains("takes no writes") && line.contains("Storage faults"),
        "{line}"
    );
    eprintln!("{line}");

    // The operator's recovery: unmount, check, mount, start again.
    fs.unmount();
    fs.check();
    fs.mount();
    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let (after, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert_eq!(after["incident"]["state"], "closed", "{after}");
    assert!(
        after["summary"]["count"].as_u64().unwrap() >= samples_before,
        "{after}"
    );
    // Writes work again: a few intervals of history go through.
    std::thread::sleep(Duration::from_secs(3));
    let store = status(&config)["store"].clone();
    assert_eq!(store["engine_failed"], false, "{store}");
    assert_eq!(store["write_errors"], 0, "{store}");
    eprintln!(
        "after the check and a restart: incident {id} closed with {} samples ({samples_before} \
         before the failure)",
        after["summary"]["count"]
    );
}
