//! What reading one large incident costs the host (issue 32: reading tailtrap during an
//! incident must not become its cause). A database with one closed incident of 17 000
//! samples, then the commands an operator runs on it, each five times, with the CPU time
//! (user + system) of the CLI process: directly on the database (daemon stopped) and, when
//! run as root, through a running daemon's API, with the daemon's own CPU time for the same
//! command beside it. Prints a table of medians; asserts nothing.
//!
//! `cargo bench -p tailtrap --bench reads` (TAILTRAP_BENCH_SAMPLES sets the sample count).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use storage::{NewIncident, Store, StoreConfig};

fn tailtrap() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tailtrap"))
}

/// CPU time (user + system) of process `pid` so far, from /proc/PID/stat.
fn cpu_of(pid: u32) -> Duration {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    let Some(rest) = text.rfind(')').and_then(|i| text.get(i + 2..)) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |n: usize| {
        f.get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis((ticks(14) + ticks(15)) * 1000 / hz)
}

/// Run `args` and return the child's CPU time (from wait4's rusage) and its output size.
// wait4 reaps the child (Child::wait would not hand over its rusage).
#[allow(clippy::zombie_processes)]
fn run(config: &Path, args: &[&str]) -> (Duration, usize) {
    let mut child = Command::new(tailtrap())
        .args(args)
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tailtrap runs");
    let err = child.stderr.take();
    let mut out = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        use std::io::Read;
        let _ = o.read_to_end(&mut out);
    }
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, status and usage are valid for writes.
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if status != 0 {
        let mut text = String::new();
        if let Some(mut e) = err {
            use std::io::Read;
            let _ = e.read_to_string(&mut text);
        }
        panic!("tailtrap {args:?} failed: {text}");
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(usage.ru_utime) + tv(usage.ru_stime), out.len())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn fill(db: &Path, samples: u64) -> u64 {
    let store = Store::open(db, StoreConfig::default()).expect("store opens");
    let opened_ns = 1_790_000_000_000_000_000u64;
    let mut inc = store
        .open_incident(&NewIncident {
            service: "web".into(),
            probes: vec![model::Probe::TcpSocketRead],
            opened_ns,
            evidence_json: "{}".into(),
            stages_json: "null".into(),
        })
        .expect("incident stored");
    let batch: Vec<model::Sample> = (0..samples)
        .map(|i| model::fixtures::sample(inc.id, i, opened_ns + i * 1_000_000))
        .collect();
    for chunk in batch.chunks(256) {
        store.put_samples(chunk).expect("samples stored");
    }
    inc.capture.stored = samples;
    store
        .close_incident(&mut inc, opened_ns + samples * 1_000_000)
        .expect("closed");
    store.flush().expect("flushed");
    inc.id
}

fn main() {
    let samples: u64 = std::env::var("TAILTRAP_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(17_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("db");
    let id = fill(&db, samples).to_string();
    let config = dir.path().join("tailtrap.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\ninterval = \"1s\"\ndb = \"{}\"\n\n[api]\nsocket = \"{}\"\n\n[metrics]\nenabled = false\n\n[pwru]\nenabled = false\n",
            db.display(),
            dir.path().join("api.sock").display()
        ),
    )
    .expect("config written");
    let commands: Vec<(&str, Vec<&str>)> = vec![
        ("incidents show ID", vec!["incidents", "show", &id]),
        ("samples ID (first page)", vec!["samples", &id]),
        ("samples ID --by-time", vec!["samples", &id, "--by-time"]),
        (
            "samples ID --json --limit all",
            vec!["samples", &id, "--json", "--limit", "100000"],
        ),
        ("export ID", vec!["export", &id]),
    ];
    println!("one incident of {samples} samples; CPU time, median of 5 runs");
    println!(
        "{:<32} {:>12} {:>12} {:>12} {:>12}",
        "command", "direct CLI", "via API: CLI", "daemon", "output"
    );
    let daemon = if unsafe { libc::geteuid() } == 0 {
        let child = Command::new(tailtrap())
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        child
    } else {
        None
    };
    let mut rows = Vec::new();
    // Direct first (the daemon holds the database once it runs): measured before it starts.
    let direct: Vec<Duration> = if daemon.is_none() {
        commands
            .iter()
            .map(|(_, a)| median((0..5).map(|_| run(&config, a).0).collect()))
            .collect()
    } else {
        Vec::new()
    };
    rows.extend(direct.iter().copied().map(Some));
    let mut api = Vec::new();
    if let Some(d) = &daemon {
        // Wait for its API.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) && !dir.path().join("api.sock").exists() {
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_secs(2));
        for (_, a) in &commands {
            let mut cli = Vec::new();
            let mut own = Vec::new();
            let mut size = 0;
            for _ in 0..5 {
                let before = cpu_of(d.id());
                let (c, s) = run(&config, a);
                own.push(cpu_of(d.id()).saturating_sub(before));
                cli.push(c);
                size = s;
            }
            api.push((median(cli), median(own), size));
        }
    }
    for (i, (name, a)) in commands.iter().enumerate() {
        let size = api.get(i).map(|r| r.2).unwrap_or_else(|| run(&config, a).1);
        let fmt =
            |d: Option<Duration>| d.map_or_else(|| "-".into(), |d| format!("{} ms", d.as_millis()));
        println!(
            "{:<32} {:>12} {:>12} {:>12} {:>10} KiB",
            name,
            fmt(rows.get(i).copied().flatten()),
            fmt(api.get(i).map(|r| r.0)),
            fmt(api.get(i).map(|r| r.1)),
            size / 1024
        );
    }
    if let Some(mut d) = daemon {
        // SAFETY: d is our child.
        unsafe { libc::kill(d.id() as libc::pid_t, libc::SIGTERM) };
        let _ = d.wait();
        // Then the direct figures, with the daemon gone.
        println!("direct (daemon stopped):");
        for (name, a) in &commands {
            let c = median((0..5).map(|_| run(&config, a).0).collect());
            println!("{:<32} {:>12}", name, format!("{} ms", c.as_millis()));
        }
    }
    println!("(CPU time in 10 ms ticks for the daemon; the CLI's from its rusage)");
}
