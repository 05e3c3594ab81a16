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
//!   what a 5.10 kernel runs (docs/probes.md);
//! - `flight, no send side`: as `+ flight` with both send probes off: the receive probes'
//!   cost without the send side, beside the default row's with it (the send side's own
//!   programs, `send_dev_queue` and `send_xmit`, are rows of the table like the others);
//! - `flight, lo pfifo`: as `+ flight` with a pfifo qdisc on loopback for the phase (removed
//!   after): loopback has no queue by default, which the send side skips, while a NIC's
//!   traffic passes a qdisc, which it stamps and times.
//! - `flight, NIC stamping`: as `+ flight` with `[probes] hw_stamp_origin = true` and
//!   loopback's clock handed to nic-to-stack as if it stamped: every receive probe then
//!   looks for a hardware stamp on every packet (none carries one), the most a host with a
//!   stamping NIC pays for packets the NIC did not stamp. The `+ flight` row is what every
//!   other host pays for the stage (one load and a compare at ip-start).
//!
//! Scheduler hooks: armed capture also attaches the reader-wait split's programs on
//! `sched_switch` and `sched_wakeup` (reader_wait.bpf.h; kernels with task storage), and
//! disarming detaches them. Their empty floors are attached only in the armed phase, on the
//! same side of them as the other floors in each order (a tracepoint runs its programs in
//! attach order), so the armed row times each hook next to its floor in one window while
//! the ping-pong threads are followed (their slow reads are recorded). A second table gives
//! per phase their ns/call, both hooks' ns per context switch on the host, and for the
//! disarmed phases that they were not attached: `following_readers()` false and no run of
//! a program of theirs anywhere on the host during the window.
//!
//! `cargo bench -p bpf --bench probe_cost` as root. `TAILTRAP_BENCH_SECS` sets each phase's
//! duration (default 3). kernel.bpf_stats_enabled is switched on for the run and restored.
//! tests/bench/probe-cost-vm.sh runs it on the stock kernels under qemu.

use std::collections::{BTreeMap, HashMap, HashSet};
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
use libbpf_rs::Link;
use model::Probe;

#[path = "support/reference.rs"]
mod reference;
mod support;
use reference::{FloorSkel, Reference};
use support::{StatsEnabled, MESSAGE};

/// Flight-recorder threshold: the lookup is paid, nothing is slow enough to be recorded.
const FLIGHT_NS: u64 = 1_000_000_000;
/// Slots given flight thresholds: host, other and the two services.
const SLOTS: u32 = 4;
/// The first service's slot (after host and other).
const FIRST_SERVICE: u32 = 2;
/// The kernel keeps this many characters of a program's name (BPF_OBJ_NAME_LEN - 1).
const PROG_NAME_LEN: usize = 15;
/// The target of the scheduler hooks while armed: ns/call ÷ floor.
const SCHED_HOOK_LIMIT: f64 = 2.0;
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
    /// The two services, the send probes off.
    NoSendSide,
    /// The two services, `hw_stamp_origin = true`, loopback's clock live (see the phase).
    NicStamping,
}

/// A phase: a load-time configuration and a capture state.
struct PhaseSpec {
    name: &'static str,
    load: Load,
    capture: Capture,
    /// A qdisc (pfifo) on loopback for the phase: loopback has none by default, and the
    /// send side times a device with a queue differently (docs/probes.md).
    lo_queue: bool,
}

const PHASES: [PhaseSpec; 10] = [
    PhaseSpec {
        name: "no services",
        load: Load::Auto,
        capture: Capture::Off,
        lo_queue: false,
    },
    PhaseSpec {
        name: "services",
        load: Load::Services,
        capture: Capture::Off,
        lo_queue: false,
    },
    PhaseSpec {
        name: "+ flight",
        load: Load::Services,
        capture: Capture::Flight,
        lo_queue: false,
    },
    PhaseSpec {
        name: "armed",
        load: Load::Services,
        capture: Capture::Armed,
        lo_queue: false,
    },
    PhaseSpec {
        name: "flight, no ip ports",
        load: Load::NoIpStartPorts,
        capture: Capture::Flight,
        lo_queue: false,
    },
    PhaseSpec {
        name: "flight, ports only",
        load: Load::PortsOnly,
        capture: Capture::Flight,
        lo_queue: false,
    },
    PhaseSpec {
        name: "flight, 5.10 stand-ins",
        load: Load::Baseline,
        capture: Capture::Flight,
        lo_queue: false,
    },
    PhaseSpec {
        name: "flight, no send side",
        load: Load::NoSendSide,
        capture: Capture::Flight,
        lo_queue: false,
    },
    PhaseSpec {
        name: "flight, lo pfifo",
        load: Load::Services,
        capture: Capture::Flight,
        lo_queue: true,
    },
    PhaseSpec {
        name: "flight, NIC stamping",
        load: Load::NicStamping,
        capture: Capture::Flight,
        lo_queue: false,
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
    /// program -> (attach point, probes, time, calls); the reader-wait hooks while attached
    probes: BTreeMap<String, (String, String, u64, u64)>,
    /// (attach point, reference) -> (time, calls)
    floor: HashMap<(String, Reference), (u64, u64)>,
    tcp: u64,
    udp: u64,
    records: u64,
    /// Records carrying the reader-wait split (their thread was followed).
    split_records: u64,
    /// Context switches on the host (`ctxt` of /proc/stat).
    switches: u64,
    /// `following_readers()` at the window's start and at its end.
    following: (bool, bool),
    /// Runs of any program named as a reader-wait hook, host-wide (any process's).
    hook_runs: u64,
}

/// What armed capture attaches besides the probes.
struct Hooks {
    /// (program, attach point) of the programs attached only while capture is armed: the
    /// reader-wait split's scheduler hooks. Empty when the kernel cannot follow readers.
    armed: Vec<(String, String)>,
    /// Why the kernel cannot follow readers.
    unavailable: Option<String>,
}

impl Hooks {
    /// Load the probes with `config`, list their programs, arm capture (nothing reaches
    /// the threshold) and list what was added; then drop them.
    fn learn(config: &ProbeConfig) -> Result<Hooks, Box<dyn std::error::Error>> {
        let mut set = ProbeSet::load(config, &mut |_| {})?;
        let disarmed = set.prog_stats();
        let mut control = CaptureControl::new(&mut set, &CaptureLimits::default())?;
        // No sample reaches u64::MAX ns: armed, and nothing is recorded.
        control.arm(&mut set, FIRST_SERVICE, &[(Probe::ALL[0], u64::MAX)])?;
        let armed = set
            .prog_stats()
            .into_iter()
            .filter(|s| !disarmed.iter().any(|d| d.program == s.program))
            .map(|s| (s.program, s.attach_point))
            .collect();
        control.disarm_all(&mut set)?;
        Ok(Hooks {
            armed,
            unavailable: set.reader_wait().err().map(str::to_owned),
        })
    }

    fn armed_names(&self) -> Vec<String> {
        self.armed.iter().map(|(name, _)| name.clone()).collect()
    }
}

fn main() -> ExitCode {
    support::main("probe_cost", run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let len = support::phase_len()?;
    let _stats = StatsEnabled::new()?;
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
    let no_send_side = ProbeConfig {
        enabled: [(Probe::SendToQdisc, false), (Probe::QdiscSojourn, false)].into(),
        ..with_services.clone()
    };
    let nic_stamping = ProbeConfig {
        hw_stamp_origin: true,
        ..with_services.clone()
    };

    let mut storage = MaybeUninit::uninit();
    let floor = reference::load(
        &mut storage,
        &with_services,
        &[Reference::Empty, Reference::Clock],
    )?;
    // The hooks armed capture adds get empty floors of their own, attached in the armed
    // phase only.
    let hooks = Hooks::learn(&with_services)?;
    let hook_names = hooks.armed_names();
    let sched_points: HashSet<String> = hooks.armed.iter().map(|(_, p)| p.clone()).collect();
    let mut sched_storage = MaybeUninit::uninit();
    let sched_floor = reference::load_on(&mut sched_storage, &sched_points, &[Reference::Empty])?;

    // results[phase] = one Measured per order
    let mut results: Vec<Vec<Measured>> = PHASES.iter().map(|_| Vec::new()).collect();
    for order in [Order::FloorFirst, Order::ProbesFirst] {
        for load in [
            Load::Auto,
            Load::Services,
            Load::NoIpStartPorts,
            Load::PortsOnly,
            Load::Baseline,
            Load::NoSendSide,
            Load::NicStamping,
        ] {
            let config = match load {
                Load::Auto => &without,
                Load::Services => &with_services,
                Load::NoIpStartPorts => &no_ip_ports,
                Load::PortsOnly => &ports_only,
                Load::Baseline => &baseline,
                Load::NoSendSide => &no_send_side,
                Load::NicStamping => &nic_stamping,
            };
            // Attached and detached with the senders held (see Traffic::pause).
            let mut held = Some(traffic.pause());
            let mut floor_links = Vec::new();
            let attach_probe_floors = |links: &mut Vec<Link>| attach_floor(&floor, links);
            let (mut set, floor_ids) = match order {
                Order::FloorFirst => {
                    let ids = attach_probe_floors(&mut floor_links)?;
                    (ProbeSet::load(config, &mut |_| {})?, ids)
                }
                Order::ProbesFirst => {
                    let set = ProbeSet::load(config, &mut |_| {})?;
                    (set, attach_probe_floors(&mut floor_links)?)
                }
            };
            if load == Load::NicStamping {
                // Loopback (ifindex 1) as a stamping device with a clock 37 s ahead.
                let lo = bpf::NicClock {
                    ifindex: 1,
                    stamping: true,
                    offset: Some((-37_000_000_000, 500)),
                };
                if !set.set_nic_clocks(&[lo])? {
                    return Err("nic-to-stack did not take the clock".into());
                }
            }
            let mut control = CaptureControl::new(&mut set, &CaptureLimits::default())?;
            let reader = CaptureReader::start(&mut set)?;
            // RX timestamping switches on from a workqueue; let it settle.
            std::thread::sleep(Duration::from_millis(300));
            for (i, phase) in PHASES.iter().enumerate() {
                if phase.load != load {
                    continue;
                }
                // Arming attaches the scheduler hooks: their floors go on the same side.
                let mut sched_links = Vec::new();
                let mut ids = floor_ids.clone();
                let mut attach_sched = |links: &mut Vec<Link>| {
                    attach_floor(&sched_floor, links).map(|sched| ids.extend(sched))
                };
                match (phase.capture, order) {
                    (Capture::Armed, Order::FloorFirst) => {
                        attach_sched(&mut sched_links)?;
                        set_capture(&mut control, &mut set, phase.capture)?;
                    }
                    (Capture::Armed, Order::ProbesFirst) => {
                        set_capture(&mut control, &mut set, phase.capture)?;
                        attach_sched(&mut sched_links)?;
                    }
                    _ => set_capture(&mut control, &mut set, phase.capture)?,
                }
                let lo_queue = phase.lo_queue.then(LoQueue::add).transpose()?;
                drop(held.take());
                results[i].push(measure(&set, &ids, &hook_names, &traffic, &reader, len)?);
                held = Some(traffic.pause());
                drop(lo_queue);
                drop(sched_links);
            }
            control.disarm_all(&mut set)?;
            drop(reader);
            drop(floor_links);
            drop(set);
            drop(held);
        }
    }
    traffic.stop();
    drop(cgroup);
    report(&results, &hooks, len.as_secs_f64());
    Ok(())
}

/// Attach the loaded reference programs; their ids -> (attach point, kind).
fn attach_floor(
    floor: &FloorSkel<'_>,
    links: &mut Vec<Link>,
) -> Result<HashMap<u32, (String, Reference)>, String> {
    let mut ids = HashMap::new();
    for prog in floor.object().progs_mut() {
        if !prog.autoload() {
            continue;
        }
        let section = prog.section().to_string_lossy().into_owned();
        links.push(
            prog.attach()
                .map_err(|e| format!("attaching {section}: {e}"))?,
        );
        let id = libbpf_rs::Program::id_from_fd(prog.as_fd()).map_err(|e| e.to_string())?;
        let kind = Reference::of(&prog.name().to_string_lossy());
        ids.insert(id, (section, kind));
    }
    Ok(ids)
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
        for slot in FIRST_SERVICE..SLOTS {
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
    hook_names: &[String],
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
    let following_before = set.following_readers();
    let runs_before = runs_named(hook_names);
    let switches_before = context_switches()?;
    let deadline = Instant::now() + len;
    let (mut records, mut split_records) = (0, 0);
    while Instant::now() < deadline {
        if let Ok(r) = reader.records().recv_timeout(Duration::from_millis(10)) {
            records += 1;
            split_records += u64::from(r.sample.reader_wait.is_some());
        }
    }
    let after = set_counters(set);
    let floor_after = floor_stats(floor_ids);
    let following_after = set.following_readers();
    let runs_after = runs_named(hook_names);
    let switches = context_switches()?.saturating_sub(switches_before);
    let (tcp1, udp1) = traffic.counts();
    let probes = after
        .into_iter()
        .map(|(prog, (point, probes, t, n))| {
            let (t0, n0) = before.get(&prog).map_or((0, 0), |b| (b.2, b.3));
            (prog, (point, probes, t - t0, n - n0))
        })
        .collect();
    let floor = support::phase_stats(floor_after, |point| floor_before.get(point).copied());
    Ok(Measured {
        probes,
        floor,
        tcp: tcp1 - tcp0,
        udp: udp1 - udp0,
        records,
        split_records,
        switches,
        following: (following_before, following_after),
        hook_runs: runs_after
            .iter()
            .map(|(id, n)| n.saturating_sub(runs_before.get(id).copied().unwrap_or(0)))
            .sum(),
    })
}

/// run_cnt per program id of every program on the host named as one of `names`.
fn runs_named(names: &[String]) -> HashMap<u32, u64> {
    let short = |n: &String| n.chars().take(PROG_NAME_LEN).collect::<String>();
    let names: Vec<String> = names.iter().map(short).collect();
    libbpf_rs::query::ProgInfoIter::default()
        .filter(|info| names.iter().any(|n| *n == *info.name.to_string_lossy()))
        .map(|info| (info.id, info.run_cnt))
        .collect()
}

/// Context switches on the host since boot (`ctxt` of /proc/stat).
fn context_switches() -> Result<u64, String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    stat.lines()
        .find_map(|l| l.strip_prefix("ctxt "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "no ctxt line in /proc/stat".into())
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

fn report(results: &[Vec<Measured>], hooks: &Hooks, secs: f64) {
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
    let sched_misses = report_sched(results, hooks, secs);
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
    if hooks.armed.is_empty() {
        return;
    }
    if sched_misses.is_empty() {
        println!(
            "target met: scheduler hooks ≤ {SCHED_HOOK_LIMIT}× floor (armed row), detached when disarmed"
        );
    } else {
        println!("target missed: scheduler hooks ≤ {SCHED_HOOK_LIMIT}× floor (armed row), detached when disarmed:");
        for m in sched_misses {
            println!("  {m}");
        }
    }
}

/// Per order of one phase: (hook ns/call, empty floor ns/call) of a scheduler hook.
fn hook_pairs(runs: &[Measured], program: &str) -> Vec<(f64, f64)> {
    runs.iter()
        .filter_map(|m| {
            let (point, _, t, n) = m.probes.get(program)?;
            let (ft, fn_) = m.floor.get(&(point.clone(), Reference::Empty))?;
            Some((per_call(*t, *n)?, per_call(*ft, *fn_)?))
        })
        .collect()
}

/// The scheduler hooks' table; returns the missed targets.
fn report_sched(results: &[Vec<Measured>], hooks: &Hooks, secs: f64) -> Vec<String> {
    let mut misses = Vec::new();
    println!("scheduler hooks (reader-wait split), per context switch: attached only while capture is armed");
    if hooks.armed.is_empty() {
        println!(
            "none on this kernel: {}",
            hooks
                .unavailable
                .as_deref()
                .unwrap_or("armed capture attached nothing")
        );
        return misses;
    }
    println!("each cell: ns/call (hook ÷ floor), geometric mean over both attach orders; floor: an empty program on the same hook");
    println!("ns/switch: both hooks' run time per context switch on the host (sched_wakeup runs included)");
    println!();
    const DETACHED: &str = "not attached (0 ns)";
    let width = |name: &str| name.len().max(DETACHED.len());
    print!("{:<22}", "phase");
    for (prog, _) in &hooks.armed {
        print!(" {prog:>w$} {:>7}", "floor", w = width(prog));
    }
    println!(
        " {:>10} {:>11} {:>12}",
        "ns/switch", "switches/s", "TCP trips/s"
    );
    let per_s = |runs: &[Measured], f: &dyn Fn(&Measured) -> u64| -> f64 {
        runs.iter().map(f).sum::<u64>() as f64 / (secs * runs.len().max(1) as f64)
    };
    let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    for (spec, runs) in PHASES.iter().zip(results) {
        let armed = spec.capture == Capture::Armed;
        let attached = !runs.is_empty() && runs.iter().all(|m| m.following == (true, true));
        // Detached: not following, the set lists none of the hooks, and no program named as
        // one ran anywhere on the host in the window.
        let detached = !runs.is_empty()
            && runs.iter().all(|m| {
                m.following == (false, false)
                    && m.hook_runs == 0
                    && hooks.armed.iter().all(|(p, _)| !m.probes.contains_key(p))
            });
        print!("{:<22}", spec.name);
        if detached {
            for (prog, _) in &hooks.armed {
                print!(" {DETACHED:>w$} {:>7}", "-", w = width(prog));
            }
            print!(" {:>10}", "0");
        } else if attached {
            let mut per_switch = Vec::new();
            for m in runs {
                let time: u64 = hooks
                    .armed
                    .iter()
                    .filter_map(|(p, _)| m.probes.get(p).map(|e| e.2))
                    .sum();
                per_switch.extend(per_call(time, m.switches));
            }
            for (prog, _) in &hooks.armed {
                let pr = hook_pairs(runs, prog);
                let ns = geomean(&pr.iter().map(|p| p.0).collect::<Vec<_>>());
                let floor = geomean(&pr.iter().map(|p| p.1).collect::<Vec<_>>());
                let ratio = geomean(&pr.iter().map(|p| p.0 / p.1).collect::<Vec<_>>());
                let cell = match (ns, ratio) {
                    (Some(n), Some(r)) => format!("{n:.1} ({r:.2})"),
                    (Some(n), None) => format!("{n:.1}"),
                    _ => "-".into(),
                };
                print!(" {cell:>w$} {:>7}", fmt(floor), w = width(prog));
                if armed {
                    match ratio {
                        Some(r) if r > SCHED_HOOK_LIMIT => {
                            misses.push(format!("{prog}: {r:.3} > {SCHED_HOOK_LIMIT}"));
                        }
                        Some(_) => {}
                        None => misses.push(format!("{prog}: no floor measured beside it")),
                    }
                }
            }
            print!(" {:>10}", fmt(geomean(&per_switch)));
        } else {
            for (prog, _) in &hooks.armed {
                print!(" {:>w$} {:>7}", "?", "-", w = width(prog));
            }
            print!(" {:>10}", "?");
        }
        println!(
            " {:>11.0} {:>12.0}",
            per_s(runs, &|m| m.switches),
            per_s(runs, &|m| m.tcp)
        );
        if armed && !attached {
            misses.push(format!(
                "{}: the hooks were not attached while armed",
                spec.name
            ));
        }
        if !armed && !detached {
            let runs_seen: u64 = runs.iter().map(|m| m.hook_runs).sum();
            misses.push(format!(
                "{}: disarmed, yet the hooks were attached or ran ({runs_seen} runs host-wide)",
                spec.name
            ));
        }
        if armed {
            let split = per_s(runs, &|m| m.split_records);
            println!(
                "{:<22} records with the reader-wait split: {split:.0}/s of {:.0}/s ({})",
                "",
                per_s(runs, &|m| m.records),
                if split > 0.0 {
                    "the readers were followed"
                } else {
                    "no reader was followed"
                }
            );
        }
    }
    misses
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
    /// Senders hold off while set, and count themselves in `idle` once they do.
    paused: Arc<AtomicBool>,
    idle: Arc<AtomicU64>,
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
        let paused = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicU64::new(0));
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
        let hold = Hold(paused.clone(), idle.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; MESSAGE.len()];
            while run.load(Ordering::Relaxed) {
                hold.wait(&run);
                if conn.write_all(&MESSAGE).is_err() || conn.read_exact(&mut buf).is_err() {
                    break;
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
        let sock = UdpSocket::bind("127.0.0.1:0")?;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let (run, count) = (running.clone(), udp.clone());
        let hold = Hold(paused.clone(), idle.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while run.load(Ordering::Relaxed) {
                hold.wait(&run);
                if sock.send_to(&MESSAGE, udp_addr).is_ok() && sock.recv_from(&mut buf).is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        Ok(Traffic {
            tcp_port: tcp_addr.port(),
            udp_port: udp_addr.port(),
            running,
            paused,
            idle,
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

    /// Hold the two senders between round trips until the guard drops: programs are
    /// attached and detached with no packet in flight. Under qemu's software emulation,
    /// patching a call site that a packet is passing killed the guest (an int3 left at
    /// tcp_v4_rcv+5); on real hardware it only keeps the phases' edges out of the figures.
    fn pause(&self) -> Paused<'_> {
        self.paused.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.idle.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        Paused(self)
    }

    fn stop(self) {
        self.running.store(false, Ordering::Relaxed);
        self.paused.store(false, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Senders held by [`Traffic::pause`] until this drops.
struct Paused<'a>(&'a Traffic);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.paused.store(false, Ordering::SeqCst);
    }
}

/// A sender's side of the pause: `(paused, idle senders)`.
struct Hold(Arc<AtomicBool>, Arc<AtomicU64>);

impl Hold {
    fn wait(&self, running: &AtomicBool) {
        if !self.0.load(Ordering::SeqCst) {
            return;
        }
        self.1.fetch_add(1, Ordering::SeqCst);
        while self.0.load(Ordering::SeqCst) && running.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.1.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A pfifo root qdisc on loopback while alive (`tc qdisc replace`, then `del`).
struct LoQueue;

impl LoQueue {
    fn add() -> Result<LoQueue, String> {
        tc(&["qdisc", "replace", "dev", "lo", "root", "pfifo"])?;
        Ok(LoQueue)
    }
}

impl Drop for LoQueue {
    fn drop(&mut self) {
        let _ = tc(&["qdisc", "del", "dev", "lo", "root"]);
    }
}

fn tc(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("tc")
        .args(args)
        .output()
        .map_err(|e| format!("running tc: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "tc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
