//! Capture cost and throughput, one run, loopback TCP ping-pong to a configured service:
//! - ns per probe call with capture disarmed, with the flight recorder on, armed with
//!   nothing slow enough, and armed emitting under the default 2000/s limit; ratios against
//!   disarmed (BPF run-time statistics);
//! - ring-buffer records per second with no rate limit, and how many were lost;
//! - time of the arm() call and from its return to the first record in user space.
//!
//! `cargo bench -p bpf --bench capture_cost` as root. `TAILTRAP_BENCH_SECS` sets each
//! phase's duration (default 3). kernel.bpf_stats_enabled is switched on and restored.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bpf::{
    capture_counters, CaptureControl, CaptureCounters, CaptureError, CaptureLimits, CaptureReader,
    ProbeConfig, ProbeSet, ServiceSpec,
};
use model::Probe;

const NEVER_NS: u64 = 10_000_000_000;

mod support;
use support::{StatsEnabled, MESSAGE};

fn main() -> ExitCode {
    support::main("capture_cost", run)
}

/// One measured phase: (program -> (run_time_ns, run_cnt)) deltas and round trips.
struct Phase {
    name: &'static str,
    stats: BTreeMap<String, (u64, u64)>,
    round_trips: u64,
    counters: CaptureCounters,
    received: u64,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let phase_len = support::phase_len()?;
    let _stats = StatsEnabled::new()?;

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let config = ProbeConfig {
        services: vec![ServiceSpec {
            name: "bench".into(),
            cgroup: None,
            ports: vec![port],
        }],
        ..ProbeConfig::default()
    };
    let mut set = ProbeSet::load(&config, &mut |_| {})?;
    let slot = set
        .service_slot("bench")?
        .ok_or("service bench has no slot")?;
    let mut control = CaptureControl::new(&mut set, &CaptureLimits::default())?;
    let reader = CaptureReader::start(&mut set)?;
    let traffic = Traffic::start(listener)?;
    // RX timestamping switches on from a workqueue; let it settle before measuring.
    std::thread::sleep(Duration::from_millis(300));

    let all = |ns: u64| -> Vec<(Probe, u64)> { Probe::ALL.iter().map(|&p| (p, ns)).collect() };
    let unlimited = CaptureLimits {
        rate_limit: u32::MAX,
        ..CaptureLimits::default()
    };
    let mut run = |name, setup: &dyn Fn(&mut CaptureControl, &mut ProbeSet) -> Setup| {
        measure(
            name,
            &mut set,
            &mut control,
            &reader,
            &traffic,
            phase_len,
            setup,
        )
    };
    let phases = vec![
        run("disarmed", &|_, _| Ok(()))?,
        run("flight on", &|c, s| {
            c.set_flight_thresholds(s, slot, &all(NEVER_NS))
        })?,
        run("armed, none slow", &|c, s| {
            c.set_flight_thresholds(s, slot, &all(0))?;
            c.arm(s, slot, &all(NEVER_NS))
        })?,
        run("armed, 2000/s", &|c, s| c.arm(s, slot, &all(1)))?,
        run("armed, no limit", &|c, s| c.set_limits(s, &unlimited))?,
    ];
    control.disarm(&mut set, slot)?;

    // Arm latency: traffic flowing, nothing armed, then arm and wait for the first record.
    while reader.records().try_recv().is_ok() {}
    let mut arm_calls = Vec::new();
    let mut first_records = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        control.arm(&mut set, slot, &[(Probe::TcpSocketRead, 1)])?;
        let armed = Instant::now();
        reader.records().recv_timeout(Duration::from_secs(2))?;
        first_records.push(armed.elapsed());
        arm_calls.push(armed - t0);
        control.disarm(&mut set, slot)?;
        std::thread::sleep(Duration::from_millis(20));
        while reader.records().try_recv().is_ok() {}
    }
    traffic.stop();

    report(
        &phases,
        phase_len,
        &arm_calls,
        &first_records,
        reader.overflow(),
    );
    Ok(())
}

type Setup = Result<(), CaptureError>;

/// Let the previous phase's records drain, apply `setup`, then measure for `len`.
fn measure(
    name: &'static str,
    set: &mut ProbeSet,
    control: &mut CaptureControl,
    reader: &CaptureReader,
    traffic: &Traffic,
    len: Duration,
    setup: &dyn Fn(&mut CaptureControl, &mut ProbeSet) -> Setup,
) -> Result<Phase, Box<dyn std::error::Error>> {
    // Leftovers of the previous phase: stop emitting, wait until the reader has gone quiet.
    let mode = control.armed().clone();
    control.disarm_all(set)?;
    while reader
        .records()
        .recv_timeout(Duration::from_millis(50))
        .is_ok()
    {}
    for ((slot, probe), ns) in mode {
        control.arm(set, slot, &[(probe, ns)])?;
    }
    setup(control, set)?;
    let before = prog_times(set);
    let counters_before = capture_counters(set)?;
    let trips_before = traffic.round_trips.load(Ordering::Relaxed);
    let deadline = Instant::now() + len;
    let mut received = 0;
    while Instant::now() < deadline {
        if reader
            .records()
            .recv_timeout(Duration::from_millis(10))
            .is_ok()
        {
            received += 1;
        }
    }
    let trips = traffic.round_trips.load(Ordering::Relaxed) - trips_before;
    let after = prog_times(set);
    let counters_after = capture_counters(set)?;
    // Records the phase emitted that are still on their way to user space.
    let emitted = counters_after.emitted + counters_after.flight_emitted
        - counters_before.emitted
        - counters_before.flight_emitted;
    while received < emitted
        && reader
            .records()
            .recv_timeout(Duration::from_millis(100))
            .is_ok()
    {
        received += 1;
    }
    let stats = support::phase_stats(after, |prog| before.get(prog).copied());
    Ok(Phase {
        name,
        stats,
        round_trips: trips,
        counters: diff(&counters_after, &counters_before),
        received,
    })
}

fn prog_times(set: &ProbeSet) -> BTreeMap<String, (u64, u64)> {
    set.prog_stats()
        .into_iter()
        .map(|s| (s.program, (s.run_time_ns, s.run_cnt)))
        .collect()
}

fn diff(a: &CaptureCounters, b: &CaptureCounters) -> CaptureCounters {
    CaptureCounters {
        emitted: a.emitted - b.emitted,
        ring_full: a.ring_full - b.ring_full,
        rate_limited: a.rate_limited - b.rate_limited,
        flight_emitted: a.flight_emitted - b.flight_emitted,
        flight_ring_full: a.flight_ring_full - b.flight_ring_full,
        flight_rate_limited: a.flight_rate_limited - b.flight_rate_limited,
    }
}

fn report(
    phases: &[Phase],
    len: Duration,
    arm_calls: &[Duration],
    first_records: &[Duration],
    overflow: u64,
) {
    println!(
        "capture cost: {:.1} s per phase of loopback TCP ping-pong to one service; kernel {}",
        len.as_secs_f64(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    );
    let Some(base) = phases.first() else {
        return;
    };
    print!("{:<28}", "ns/call (ratio to disarmed)");
    for p in phases {
        print!(" {:>20}", p.name);
    }
    println!();
    for (prog, &(t0, n0)) in &base.stats {
        if n0 == 0 {
            continue;
        }
        let base_ns = t0 as f64 / n0 as f64;
        print!("{prog:<28}");
        for p in phases {
            let cell = match p.stats.get(prog) {
                Some(&(t, n)) if n > 0 => {
                    let ns = t as f64 / n as f64;
                    format!("{ns:.0} ({:.2})", ns / base_ns)
                }
                _ => "-".into(),
            };
            print!(" {cell:>20}");
        }
        println!();
    }
    let secs = len.as_secs_f64();
    println!();
    println!(
        "{:<18} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "phase", "round trips/s", "emitted/s", "received/s", "ring full", "rate limited"
    );
    for p in phases {
        let c = &p.counters;
        println!(
            "{:<18} {:>12.0} {:>12.0} {:>12.0} {:>12} {:>12}",
            p.name,
            p.round_trips as f64 / secs,
            (c.emitted + c.flight_emitted) as f64 / secs,
            p.received as f64 / secs,
            c.ring_full + c.flight_ring_full,
            c.rate_limited + c.flight_rate_limited
        );
    }
    println!("records lost in user space (channel full): {overflow}");
    println!();
    println!(
        "arm() call: median {:?}, max {:?}; arm() return to first record read: median {:?}, max {:?} ({} trials)",
        median(arm_calls),
        arm_calls.iter().max().copied().unwrap_or_default(),
        median(first_records),
        first_records.iter().max().copied().unwrap_or_default(),
        first_records.len()
    );
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// A TCP echo ping-pong over loopback until stopped, counting round trips.
struct Traffic {
    running: Arc<AtomicBool>,
    round_trips: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(listener: TcpListener) -> std::io::Result<Traffic> {
        let addr = listener.local_addr()?;
        let running = Arc::new(AtomicBool::new(true));
        let round_trips = Arc::new(AtomicU64::new(0));
        let echo = std::thread::spawn(move || {
            if let Ok((mut conn, _)) = listener.accept() {
                let mut buf = [0u8; MESSAGE.len()];
                while conn.read_exact(&mut buf).is_ok() && conn.write_all(&buf).is_ok() {}
            }
        });
        let mut conn = TcpStream::connect(addr)?;
        conn.set_nodelay(true)?;
        let (run, trips) = (running.clone(), round_trips.clone());
        let client = std::thread::spawn(move || {
            let mut buf = [0u8; MESSAGE.len()];
            while run.load(Ordering::Relaxed) {
                if conn.write_all(&MESSAGE).is_err() || conn.read_exact(&mut buf).is_err() {
                    break;
                }
                trips.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(Traffic {
            running,
            round_trips,
            threads: vec![client, echo],
        })
    }

    fn stop(self) {
        self.running.store(false, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}
