//! Probe cost as users run it: loopback TCP and UDP ping-pong to two configured services (one
//! matched by its local ports, one by its cgroup) with BPF run-time statistics on; per probe
//! program the ns per call next to two reference programs on the same hook measured in the
//! same window: an empty one (the floor: what merely being called costs), and one that only
//! reads the stamp the probe reads and the clock it is in (the clock floor: what any latency
//! probe must pay). The ratio is to the empty floor; the default row also shows the cost
//! above the clock floor.
//!
//! Phases, each measured in both attach orders (a trampoline runs the most recently attached
//! program first, and the first one pays more on fentry): the figures are geometric means
//! over the two orders, so neither side gets the first-position discount.
//! - `no services`: auto-grouping by cgroup, capture off (the cheapest configuration);
//! - `services`: the two services, capture off;
//! - `+ flight`: the two services with the flight recorder on for every slot, as the daemon
//!   runs once baselines exist (the default row);
//! - `armed`: as `+ flight`, and armed capture on both services with every sample over its
//!   threshold, held to the default 2000 records/s by the rate limit;
//! - `flight, no ip ports`: as `+ flight` with `[probes] ip_start_ports = false` (ip-start
//!   reads no IP header and counts everything as host);
//! - `flight, ports only`: as `+ flight` with the port service only: without a cgroup rule
//!   the socket probes look the port up directly instead of through the socket-storage cache;
//! - `flight, 5.10 stand-ins`: as `+ flight` with `[probes] kernel_features = "baseline"`,
//!   what a 5.10 kernel runs (docs/probes.md).
//!
//! `cargo bench -p bpf --bench probe_cost` as root. `TAILTRAP_BENCH_SECS` sets each phase's
//! duration (default 3). kernel.bpf_stats_enabled is switched on for the run and restored.
//! tests/bench/probe-cost-vm.sh runs it on the stock kernels under qemu.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bpf::{CaptureControl, CaptureLimits, CaptureReader, ProbeConfig, ProbeSet, ServiceSpec};
use libbpf_rs::skel::Skel;
use model::Probe;

#[path = "support/reference.rs"]
mod reference;
mod support;
use reference::Reference;
use support::{StatsEnabled, MESSAGE, STATS_SYSCTL};

/// Flight-recorder threshold: the lookup is paid, nothing is slow enough to be recorded.
const FLIGHT_NS: u64 = 1_000_000_000;
/// Slots given flight thresholds: host, other and the two services.
const SLOTS: u32 = 4;
/// The bench's cgroup (relative to the cgroup2 mount), the cgroup service's.
const CGROUP: &str = "tailtrap-probe-cost";

/// Capture state of a phase.
#[derive(Clone, Copy, PartialEq)]
enum Capture {
    Off,
    Flight,
    Armed,
}

/// Load-time configurations.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// No services: auto-grouping by cgroup.
    Auto,
    /// The two services.
    Services,
    /// The two services, `ip_start_ports = false`.
    NoIpStartPorts,
    /// One service matched by its ports only: no cgroup rule, so no socket-storage cache.
    PortsOnly,
    /// The two services with the stand-ins of a 5.10 kernel (`kernel_features =
    /// "baseline"`): the clock from MONOTONIC plus an offset, services by a cgroup-keyed
    /// map instead of socket storage.
    Baseline,
}

/// A phase: a load-time configuration and a capture state.
struct PhaseSpec {
    name: &'static str,
    load: Load,
    capture: Capture,
}

const PHASES: [PhaseSpec; 7] = [
    PhaseSpec {
        name: "no services",
        load: Load::Auto,
        capture: Capture::Off,
    },
    PhaseSpec {
        name: "services",
        load: Load::Services,
        capture: Capture::Off,
    },
    PhaseSpec {
        name: "+ flight",
        load: Load::Services,
        capture: Capture::Flight,
    },
    PhaseSpec {
        name: "armed",
        load: Load::Services,
        capture: Capture::Armed,
    },
    PhaseSpec {
        name: "flight, no ip ports",
        load: Load::NoIpStartPorts,
        capture: Capture::Flight,
    },
    PhaseSpec {
        name: "flight, ports only",
        load: Load::PortsOnly,
        capture: Capture::Flight,
    },
    PhaseSpec {
        name: "flight, 5.10 stand-ins",
        load: Load::Baseline,
        capture: Capture::Flight,
    },
];
/// The row users run by default (the daemon once baselines exist).
const DEFAULT_PHASE: usize = 2;
const ARMED_PHASE: usize = 3;

/// Which side is attached first.
#[derive(Clone, Copy)]
enum Order {
    FloorFirst,
    ProbesFirst,
}

/// (run_time_ns, run_cnt) deltas of one phase in one order.
#[derive(Default)]
struct Measured {
    /// program -> (attach point, probes, time, calls)
    probes: BTreeMap<String, (String, String, u64, u64)>,
    /// (attach point, reference) -> (time, calls)
    floor: HashMap<(String, Reference), (u64, u64)>,
    tcp: u64,
    udp: u64,
    records: u64,
}

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
        .unwrap_or(3.0);
    let len = Duration::from_secs_f64(secs);
    let _stats =
        StatsEnabled::new().map_err(|e| format!("enabling {STATS_SYSCTL} (run as root): {e}"))?;
    // Sockets take their cgroup when created: move in first, then start the traffic.
    let cgroup = BenchCgroup::enter()?;
    let traffic = Traffic::start()?;
    let services = vec![
        ServiceSpec {
            name: "by-port".into(),
            cgroup: None,
            ports: vec![traffic.tcp_port, traffic.udp_port],
        },
        ServiceSpec {
            name: "by-cgroup".into(),
            cgroup: Some(PathBuf::from(CGROUP)),
            ports: vec![],
        },
    ];
    let with_services = ProbeConfig {
        services,
        ..ProbeConfig::default()
    };
    let without = ProbeConfig::default();
    let no_ip_ports = ProbeConfig {
        ip_start_ports: false,
        ..with_services.clone()
    };
    let ports_only = ProbeConfig {
        services: with_services.services[..1].to_vec(),
        ..ProbeConfig::default()
    };
    let baseline = ProbeConfig {
        kernel_features: bpf::KernelFeatureMode::Baseline,
        ..with_services.clone()
    };

    let mut storage = MaybeUninit::uninit();
    let floor = reference::load(
        &mut storage,
        &with_services,
        &[Reference::Empty, Reference::Clock],
    )?;

    // results[phase] = one Measured per order
    let mut results: Vec<Vec<Measured>> = PHASES.iter().map(|_| Vec::new()).collect();
    for order in [Order::FloorFirst, Order::ProbesFirst] {
        for load in [
            Load::Auto,
            Load::Services,
            Load::NoIpStartPorts,
            Load::PortsOnly,
            Load::Baseline,
        ] {
            let config = match load {
                Load::Auto => &without,
                Load::Services => &with_services,
                Load::NoIpStartPorts => &no_ip_ports,
                Load::PortsOnly => &ports_only,
                Load::Baseline => &baseline,
            };
            let mut floor_links = Vec::new();
            let attach_floor = |links: &mut Vec<libbpf_rs::Link>| -> Result<_, String> {
                let mut ids = HashMap::new();
                for prog in floor.object().progs_mut() {
                    if !prog.autoload() {
                        continue;
                    }
                    links.push(prog.attach().map_err(|e| e.to_string())?);
                    let id =
                        libbpf_rs::Program::id_from_fd(prog.as_fd()).map_err(|e| e.to_string())?;
                    let kind = Reference::of(&prog.name().to_string_lossy());
                    ids.insert(id, (prog.section().to_string_lossy().into_owned(), kind));
                }
                Ok(ids)
            };
            let (mut set, floor_ids) = match order {
                Order::FloorFirst => {
                    let ids = attach_floor(&mut floor_links)?;
                    (ProbeSet::load(config, &mut |_| {})?, ids)
                }
                Order::ProbesFirst => {
                    let set = ProbeSet::load(config, &mut |_| {})?;
                    (set, attach_floor(&mut floor_links)?)
                }
            };
            let mut control = CaptureControl::new(&mut set, &CaptureLimits::default())?;
            let reader = CaptureReader::start(&mut set)?;
            // RX timestamping switches on from a workqueue; let it settle.
            std::thread::sleep(Duration::from_millis(300));
            for (i, phase) in PHASES.iter().enumerate() {
                if phase.load != load {
                    continue;
                }
                set_capture(&mut control, &mut set, phase.capture)?;
                results[i].push(measure(&set, &floor_ids, &traffic, &reader, len)?);
            }
            control.disarm_all(&mut set)?;
            drop(reader);
            drop(floor_links);
            drop(set);
        }
    }
    traffic.stop();
    drop(cgroup);
    report(&results, secs);
    Ok(())
}

fn set_capture(
    control: &mut CaptureControl,
    set: &mut ProbeSet,
    capture: Capture,
) -> Result<(), bpf::CaptureError> {
    let all = |ns: u64| -> Vec<(Probe, u64)> { Probe::ALL.iter().map(|&p| (p, ns)).collect() };
    let flight = if capture == Capture::Off {
        0
    } else {
        FLIGHT_NS
    };
    for slot in 0..SLOTS {
        control.set_flight_thresholds(set, slot, &all(flight))?;
    }
    if capture == Capture::Armed {
        // Every sample is over 1 ns: the rate limit decides what is recorded.
        for slot in 2..SLOTS {
            control.arm(set, slot, &all(1))?;
        }
    } else {
        control.disarm_all(set)?;
    }
    Ok(())
}

fn measure(
    set: &ProbeSet,
    floor_ids: &HashMap<u32, (String, Reference)>,
    traffic: &Traffic,
    reader: &CaptureReader,
    len: Duration,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let set_counters = |s: &ProbeSet| {
        s.prog_stats()
            .into_iter()
            .map(|p| {
                let probes: Vec<&str> = p.probes.iter().map(|p| p.name()).collect();
                (
                    p.program,
                    (p.attach_point, probes.join(", "), p.run_time_ns, p.run_cnt),
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    while reader.records().try_recv().is_ok() {}
    let (tcp0, udp0) = traffic.counts();
    let before = set_counters(set);
    let floor_before = floor_stats(floor_ids);
    let deadline = Instant::now() + len;
    let mut records = 0;
    while Instant::now() < deadline {
        if reader
            .records()
            .recv_timeout(Duration::from_millis(10))
            .is_ok()
        {
            records += 1;
        }
    }
    let after = set_counters(set);
    let floor_after = floor_stats(floor_ids);
    let (tcp1, udp1) = traffic.counts();
    let probes = after
        .into_iter()
        .map(|(prog, (point, probes, t, n))| {
            let (t0, n0) = before.get(&prog).map_or((0, 0), |b| (b.2, b.3));
            (prog, (point, probes, t - t0, n - n0))
        })
        .collect();
    let floor = floor_after
        .into_iter()
        .map(|(point, (t, n))| {
            let (t0, n0) = floor_before.get(&point).copied().unwrap_or((0, 0));
            (point, (t - t0, n - n0))
        })
        .collect();
    Ok(Measured {
        probes,
        floor,
        tcp: tcp1 - tcp0,
        udp: udp1 - udp0,
        records,
    })
}

fn per_call(time_ns: u64, calls: u64) -> Option<f64> {
    (calls > 0).then(|| time_ns as f64 / calls as f64)
}

fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty() && v.iter().all(|x| *x > 0.0))
        .then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// Per order of one phase: (probe ns/call, floor ns/call, clock floor ns/call) of a program.
fn pairs(runs: &[Measured], program: &str) -> Vec<(f64, f64, f64)> {
    runs.iter()
        .filter_map(|m| {
            let (point, _, t, n) = m.probes.get(program)?;
            let p = per_call(*t, *n)?;
            let reference = |kind| {
                let (t, n) = m.floor.get(&(point.clone(), kind))?;
                per_call(*t, *n)
            };
            Some((
                p,
                reference(Reference::Empty)?,
                reference(Reference::Clock)?,
            ))
        })
        .collect()
}

fn report(results: &[Vec<Measured>], secs: f64) {
    println!(
        "probe cost: kernel {}, {secs:.1} s per phase and attach order, loopback TCP+UDP ping-pong of {} bytes",
        kernel_release(),
        MESSAGE.len()
    );
    println!("each cell: ns/call (probe ÷ floor), geometric mean over both attach orders");
    println!("floor: an empty program; clock: reads the stamp and its clock (what any latency probe pays)");
    println!("over clock: the default row's ns/call above the clock floor (what tailtrap adds)");
    println!();
    let Some(default_runs) = results.get(DEFAULT_PHASE) else {
        return;
    };
    let programs: Vec<(String, String, String)> = default_runs
        .first()
        .map(|m| {
            m.probes
                .iter()
                .map(|(prog, (point, probes, _, _))| (prog.clone(), point.clone(), probes.clone()))
                .collect()
        })
        .unwrap_or_default();
    print!(
        "{:<26} {:<30} {:>7} {:>7}",
        "program", "attach point", "floor", "clock"
    );
    for p in &PHASES {
        print!(" {:>19}", p.name);
    }
    println!(" {:>12} {:>10}", "armed÷flight", "over clock");
    let mut misses = Vec::new();
    for (prog, point, probes) in &programs {
        let default_pairs = pairs(default_runs, prog);
        let floor: Vec<f64> = default_pairs.iter().map(|p| p.1).collect();
        let clock: Vec<f64> = default_pairs.iter().map(|p| p.2).collect();
        let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        print!(
            "{prog:<26} {point:<30} {:>7} {:>7}",
            fmt(geomean(&floor)),
            fmt(geomean(&clock))
        );
        let mut ns_of = Vec::new();
        for (i, runs) in results.iter().enumerate() {
            let pr = pairs(runs, prog);
            let ns = geomean(&pr.iter().map(|p| p.0).collect::<Vec<_>>());
            let ratio = geomean(&pr.iter().map(|p| p.0 / p.1).collect::<Vec<_>>());
            ns_of.push(ns);
            let cell = match (ns, ratio) {
                (Some(n), Some(r)) => format!("{n:.1} ({r:.2})"),
                _ => "-".into(),
            };
            print!(" {cell:>19}");
            if i == DEFAULT_PHASE {
                if let Some(r) = ratio {
                    let limit = if probes.contains("ip-start") {
                        1.5
                    } else {
                        2.0
                    };
                    if r > limit {
                        misses.push(format!("{prog} ({probes}): {r:.2} > {limit}"));
                    }
                }
            }
        }
        let armed = match (ns_of.get(ARMED_PHASE), ns_of.get(DEFAULT_PHASE)) {
            (Some(Some(a)), Some(Some(d))) => {
                let r = a / d;
                if r > 1.3 {
                    misses.push(format!("{prog} armed: {r:.2} > 1.3 × flight"));
                }
                format!("{r:.2}")
            }
            _ => "-".into(),
        };
        // Arithmetic mean of the differences: a difference can be negative.
        let over: Vec<f64> = default_pairs.iter().map(|p| p.0 - p.2).collect();
        let over = (!over.is_empty()).then(|| over.iter().sum::<f64>() / over.len() as f64);
        println!(" {armed:>12} {:>10}   {probes}", fmt(over));
    }
    println!();
    println!(
        "{:<20} {:>12} {:>12} {:>12}",
        "phase", "TCP trips/s", "UDP trips/s", "records/s"
    );
    let total = |runs: &[Measured], f: &dyn Fn(&Measured) -> u64| -> f64 {
        runs.iter().map(f).sum::<u64>() as f64 / (secs * runs.len().max(1) as f64)
    };
    for (spec, runs) in PHASES.iter().zip(results) {
        println!(
            "{:<20} {:>12.0} {:>12.0} {:>12.0}",
            spec.name,
            total(runs, &|m| m.tcp),
            total(runs, &|m| m.udp),
            total(runs, &|m| m.records)
        );
    }
    println!();
    if misses.is_empty() {
        println!(
            "targets met: ip-start ≤ 1.5× floor, other probes ≤ 2×, armed ≤ 1.3× (default row)"
        );
    } else {
        println!("targets missed:");
        for m in misses {
            println!("  {m}");
        }
    }
}

/// (run_time_ns, run_cnt) per attach point and kind of the reference programs.
fn floor_stats(
    ids: &HashMap<u32, (String, Reference)>,
) -> HashMap<(String, Reference), (u64, u64)> {
    libbpf_rs::query::ProgInfoIter::default()
        .filter_map(|info| {
            let key = ids.get(&info.id)?;
            Some((key.clone(), (info.run_time_ns, info.run_cnt)))
        })
        .collect()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// A cgroup of its own for the bench process; moves back and removes it on drop.
struct BenchCgroup {
    dir: PathBuf,
    previous: PathBuf,
}

impl BenchCgroup {
    fn enter() -> Result<BenchCgroup, String> {
        let mount = bpf::cgroup2_mount().ok_or("no cgroup2 mount")?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/');
        let previous = mount.join(rel);
        let dir = mount.join(CGROUP);
        if !dir.exists() {
            std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .map_err(|e| format!("moving into {}: {e}", dir.display()))?;
        Ok(BenchCgroup { dir, previous })
    }
}

impl Drop for BenchCgroup {
    fn drop(&mut self) {
        let back = std::fs::write(
            self.previous.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        if back.is_err() || std::fs::remove_dir(&self.dir).is_err() {
            eprintln!("could not remove {}", self.dir.display());
        }
    }
}

/// TCP and UDP echo ping-pong over loopback, one client each, until stopped.
struct Traffic {
    tcp_port: u16,
    udp_port: u16,
    running: Arc<AtomicBool>,
    tcp: Arc<AtomicU64>,
    udp: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start() -> std::io::Result<Traffic> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let tcp_addr = listener.local_addr()?;
        let udp_server = UdpSocket::bind("127.0.0.1:0")?;
        let udp_addr = udp_server.local_addr()?;
        udp_server.set_read_timeout(Some(Duration::from_millis(200)))?;
        let running = Arc::new(AtomicBool::new(true));
        let (tcp, udp) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut threads = Vec::new();
        threads.push(std::thread::spawn(move || {
            if let Ok((mut conn, _)) = listener.accept() {
                let mut buf = [0u8; MESSAGE.len()];
                while conn.read_exact(&mut buf).is_ok() && conn.write_all(&buf).is_ok() {}
            }
        }));
        let run = running.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while run.load(Ordering::Relaxed) {
                if let Ok((n, from)) = udp_server.recv_from(&mut buf) {
                    let _ = udp_server.send_to(&buf[..n], from);
                }
            }
        }));
        let mut conn = TcpStream::connect(tcp_addr)?;
        conn.set_nodelay(true)?;
        let (run, count) = (running.clone(), tcp.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; MESSAGE.len()];
            while run.load(Ordering::Relaxed) {
                if conn.write_all(&MESSAGE).is_err() || conn.read_exact(&mut buf).is_err() {
                    break;
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let (run, count) = (running.clone(), udp.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while run.load(Ordering::Relaxed) {
                if sock.send_to(&MESSAGE, udp_addr).is_ok() && sock.recv_from(&mut buf).is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        Ok(Traffic {
            tcp_port: tcp_addr.port(),
            udp_port: udp_addr.port(),
            running,
            tcp,
            udp,
            threads,
        })
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.tcp.load(Ordering::Relaxed),
            self.udp.load(Ordering::Relaxed),
        )
    }

    fn stop(self) {
        self.running.store(false, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}
