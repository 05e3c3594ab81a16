//! Probe cost: loopback TCP and UDP ping-pong with BPF run-time statistics on, then per
//! probe program the calls and ns per call, next to an empty program on the same hook
//! measured in the same run (the floor: what merely being called costs), and the ratio.
//!
//! `cargo bench -p bpf --bench probe_cost` as root. `TAILTRAP_BENCH_SECS` sets the load
//! duration (default 5). kernel.bpf_stats_enabled is switched on for the run and restored.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};

#[allow(clippy::all, clippy::pedantic, clippy::unwrap_used, unreachable_pub)]
mod floor_skel {
    include!(concat!(env!("OUT_DIR"), "/floor.skel.rs"));
}

mod support;
use support::{StatsEnabled, MESSAGE, STATS_SYSCTL};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("probe_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let secs: f64 = std::env::var("TAILTRAP_BENCH_SECS")
        .ok()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5.0);
    let _stats =
        StatsEnabled::new().map_err(|e| format!("enabling {STATS_SYSCTL} (run as root): {e}"))?;
    let probes = bpf::ProbeSet::load(&bpf::ProbeConfig::default(), &mut |_| {})?;
    let attach_points: HashSet<String> = probes
        .prog_stats()
        .into_iter()
        .map(|s| s.attach_point)
        .collect();

    // The floor: an empty program on each hook a probe program uses.
    let mut storage = MaybeUninit::uninit();
    let mut open = floor_skel::FloorSkelBuilder::default().open(&mut storage)?;
    for mut prog in open.open_object_mut().progs_mut() {
        let wanted = attach_points.contains(prog.section().to_string_lossy().as_ref());
        prog.set_autoload(wanted);
    }
    let floor = open.load()?;
    let mut floor_links = Vec::new();
    let mut floor_ids: HashMap<u32, String> = HashMap::new();
    for prog in floor.object().progs_mut() {
        if !prog.autoload() {
            continue;
        }
        floor_links.push(prog.attach()?);
        let id = libbpf_rs::Program::id_from_fd(prog.as_fd())?;
        floor_ids.insert(id, prog.section().to_string_lossy().into_owned());
    }

    let before_probe = probes.prog_stats();
    let before_floor = floor_stats(&floor_ids);
    let (tcp_round_trips, udp_round_trips) = ping_pong(Duration::from_secs_f64(secs))?;
    let after_probe = probes.prog_stats();
    let after_floor = floor_stats(&floor_ids);

    println!(
        "probe cost: {secs:.1} s of loopback ping-pong ({tcp_round_trips} TCP, {udp_round_trips} UDP round trips of {} bytes); kernel {}",
        MESSAGE.len(),
        kernel_release()
    );
    println!(
        "{:<26} {:<32} {:<40} {:>9} {:>8} {:>8} {:>6}",
        "program", "attach point", "probes", "calls", "ns/call", "floor", "ratio"
    );
    for after in &after_probe {
        let before = before_probe.iter().find(|b| b.program == after.program);
        let calls = after.run_cnt - before.map_or(0, |b| b.run_cnt);
        let time = after.run_time_ns - before.map_or(0, |b| b.run_time_ns);
        let probe_ns = per_call(time, calls);
        let floor = after_floor.get(&after.attach_point).map(|(t, n)| {
            let (t0, n0) = before_floor
                .get(&after.attach_point)
                .copied()
                .unwrap_or((0, 0));
            per_call(t - t0, n - n0)
        });
        let probes: Vec<&str> = after.probes.iter().map(|p| p.name()).collect();
        let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let ratio = match (probe_ns, floor.flatten()) {
            (Some(p), Some(f)) if f > 0.0 => format!("{:.2}", p / f),
            _ => "-".to_owned(),
        };
        println!(
            "{:<26} {:<32} {:<40} {:>9} {:>8} {:>8} {:>6}",
            after.program,
            after.attach_point,
            probes.join(", "),
            calls,
            fmt(probe_ns),
            fmt(floor.flatten()),
            ratio
        );
    }
    drop(floor_links);
    Ok(())
}

fn per_call(time_ns: u64, calls: u64) -> Option<f64> {
    (calls > 0).then(|| time_ns as f64 / calls as f64)
}

/// (run_time_ns, run_cnt) per attach point of the floor programs.
fn floor_stats(ids: &HashMap<u32, String>) -> HashMap<String, (u64, u64)> {
    libbpf_rs::query::ProgInfoIter::default()
        .filter_map(|info| {
            let section = ids.get(&info.id)?;
            Some((section.clone(), (info.run_time_ns, info.run_cnt)))
        })
        .collect()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// TCP and UDP echo over loopback, one client each, until `duration` has passed. Returns
/// the round trips done.
fn ping_pong(duration: Duration) -> std::io::Result<(u64, u64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let tcp_addr = listener.local_addr()?;
    let udp_server = UdpSocket::bind("127.0.0.1:0")?;
    let udp_addr = udp_server.local_addr()?;
    udp_server.set_read_timeout(Some(Duration::from_millis(200)))?;
    let deadline = Instant::now() + duration;

    let tcp_echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        let mut buf = [0u8; MESSAGE.len()];
        while conn.read_exact(&mut buf).is_ok() {
            conn.write_all(&buf)?;
        }
        Ok(())
    });
    let udp_echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            if let Ok((n, from)) = udp_server.recv_from(&mut buf) {
                udp_server.send_to(&buf[..n], from)?;
            }
        }
        Ok(())
    });
    let udp_client = std::thread::spawn(move || -> std::io::Result<u64> {
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while Instant::now() < deadline {
            sock.send_to(&MESSAGE, udp_addr)?;
            if sock.recv_from(&mut buf).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    });
    let mut conn = TcpStream::connect(tcp_addr)?;
    conn.set_nodelay(true)?;
    let mut buf = [0u8; MESSAGE.len()];
    let mut tcp = 0;
    while Instant::now() < deadline {
        conn.write_all(&MESSAGE)?;
        conn.read_exact(&mut buf)?;
        tcp += 1;
    }
    drop(conn);
    let joined = |r: std::thread::Result<std::io::Result<()>>| {
        r.unwrap_or_else(|_| Err(std::io::Error::other("echo thread panicked")))
    };
    joined(tcp_echo.join())?;
    joined(udp_echo.join())?;
    let udp = udp_client
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("client thread panicked")))?;
    Ok((tcp, udp))
}
