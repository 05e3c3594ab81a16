//! How the process's memory follows what the store writes (issue 13, "RSS flat"): writes
//! what the daemon writes in the soak (`tests/soak/run.sh`), compressed in time, and prints
//! RSS once a simulated minute.
//!
//! `cargo run --release -p storage --example sled_rss -- [--minutes N] [--every M]
//!  [--rate SAMPLES_PER_S] [--cache-bytes N] [--max-bytes N] [--services N] [--retention-every M]
//!  [--prefill MIB] [--dir PATH] [--rotate yes]`
//!
//! Each simulated second writes one interval of history (every service × every probe); in
//! the first minute of every `--every` minutes an incident is open and each second also
//! writes a batch of `--rate` samples, as capture does. Retention and rotation run every
//! `--retention-every` simulated minutes (10, the daemon's default), and the heap is
//! trimmed before each reading, as in the daemon. At the
//! end the store is dropped and opened again, to show what of the growth was the engine's
//! and what opening costs (`--rotate yes`: then rotated, with its peak RSS).
//! `--prefill MIB` first stores a closed incident of that many MiB of samples and restarts
//! the store, to time engine reopens on a large database. Every store call is timed: the
//! calls that reopened the engine (flush, drop, open) are counted and their times printed,
//! and a reader thread reports its slowest read (what any other thread waits meanwhile).
//!
//! `--raw MIB [--value-bytes N] [--touch K] [--cache-bytes N] [--reopen-every M] [--keep K]`
//! instead drives sled alone: `MIB` MiB of `N`-byte values under increasing keys (as sample
//! chunks are), each read back `K` times after it is written, RSS and heap printed after
//! each MiB; then the engine is dropped and reopened. `--reopen-every M` also drops and
//! reopens it after every `M` MiB, as the store's recycling does, and `--keep K` removes
//! what is older than the last `K` MiB written, as retention does: whether reopens alone
//! leave memory behind.
//!
//! `SLED_RSS_LEVELS=N` keeps only the `N` finest history levels (1: the 1 s level alone, so
//! no coarse chunk is rewritten each minute).
//!
//! With `SLED_RSS_EXIT_LIVE=1` it exits before dropping the store at the end, so that
//! `heaptrack` lists what the store still holds as leaked. glibc's tunables apply as usual
//! (`MALLOC_MMAP_THRESHOLD_=131072` is what the daemon sets, see `agent/src/main.rs`).
#![allow(clippy::unwrap_used)] // an experiment aborts on any failure

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::{Histogram, Probe, Sample};
use storage::{HistoryPoint, Store, StoreConfig};

// The integration tests' incident and clock constants, so the example writes what they do.
#[path = "../tests/common/mod.rs"]
mod common;
use common::{SEC, T0};

struct Args {
    minutes: u64,
    every: u64,
    retention_every: u64,
    rate: u64,
    cache_bytes: Option<u64>,
    max_bytes: Option<u64>,
    services: usize,
    dir: Option<PathBuf>,
    raw_mib: Option<u64>,
    value_bytes: usize,
    touch: u64,
    prefill_mib: u64,
    reopen_every: u64,
    keep_mib: u64,
    rotate: bool,
}

fn args() -> Args {
    let mut a = Args {
        minutes: 30,
        every: 5,
        retention_every: 10,
        rate: 1000,
        cache_bytes: None,
        max_bytes: None,
        services: 1,
        dir: None,
        raw_mib: None,
        value_bytes: 28 << 10,
        touch: 0,
        prefill_mib: 0,
        reopen_every: 0,
        keep_mib: 0,
        rotate: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--minutes" => a.minutes = value.parse().unwrap(),
            "--every" => a.every = value.parse().unwrap(),
            "--retention-every" => a.retention_every = value.parse().unwrap(),
            "--rate" => a.rate = value.parse().unwrap(),
            "--cache-bytes" => a.cache_bytes = Some(value.parse().unwrap()),
            "--max-bytes" => a.max_bytes = Some(value.parse().unwrap()),
            "--services" => a.services = value.parse().unwrap(),
            "--dir" => a.dir = Some(PathBuf::from(value)),
            "--raw" => a.raw_mib = Some(value.parse().unwrap()),
            "--value-bytes" => a.value_bytes = value.parse().unwrap(),
            "--touch" => a.touch = value.parse().unwrap(),
            "--prefill" => a.prefill_mib = value.parse().unwrap(),
            "--reopen-every" => a.reopen_every = value.parse().unwrap(),
            "--keep" => a.keep_mib = value.parse().unwrap(),
            "--rotate" => a.rotate = value == "yes",
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// A `/proc/self/status` figure in MiB (`field` is e.g. `VmRSS:`).
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    kib / 1024.0
}

/// Resident memory after giving freed heap back, as the daemon's trim thread does.
fn rss_mib() -> f64 {
    // SAFETY: malloc_trim only returns free pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    status_mib("VmRSS:")
}

/// Start a new peak for [`peak_mib`].
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// The highest RSS since [`reset_peak`] (VmHWM).
fn peak_mib() -> f64 {
    status_mib("VmHWM:")
}

/// Bytes held allocated, MiB, by glibc's count: in its arenas (what of RSS is live heap
/// rather than allocator slack, binary or stacks), and in blocks mapped on their own
/// (sled's page-table blocks are among them: 1 MiB each, mostly never touched, so mostly
/// not resident).
fn heap_mib() -> (f64, f64) {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    (mib(info.uordblks), mib(info.hblkhd))
}

/// RSS with its anonymous and file-backed parts, and glibc's count of what is allocated.
fn print_memory(label: &str) {
    let rss = rss_mib();
    let (arena, mapped) = heap_mib();
    println!(
        "{label}: RSS {rss:.1} MiB (anonymous {:.1}, file {:.1}), heap allocated {arena:.2} MiB in arenas, {mapped:.1} MiB mapped",
        status_mib("RssAnon:"),
        status_mib("RssFile:")
    );
}

fn histogram(second: u64, probe: usize) -> Histogram {
    let mut h = Histogram::new();
    for i in 0..50 {
        h.record(10_000 + (second * 7 + probe as u64 * 13 + i * 1_000) % 2_000_000);
    }
    h
}

/// Times of store calls: those that reopened the engine, and the others.
#[derive(Default)]
struct Calls {
    reopens: Vec<Duration>,
    slowest_other: Duration,
    minute_max: Duration,
}

impl Calls {
    fn time<R>(&mut self, store: &Store, f: impl FnOnce() -> R) -> R {
        let before = store.stats().engine_reopens;
        let started = Instant::now();
        let r = f();
        let took = started.elapsed();
        if store.stats().engine_reopens > before {
            self.reopens.push(took);
        } else {
            self.slowest_other = self.slowest_other.max(took);
        }
        self.minute_max = self.minute_max.max(took);
        r
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Store a closed incident of `mib` MiB of samples, long before the simulated run.
fn prefill(dir: &std::path::Path, cfg: &StoreConfig, mib: u64) {
    let store = Store::open(dir, cfg.clone()).unwrap();
    let opened = T0 - 2 * 86_400 * SEC;
    let mut inc = store
        .open_incident(&common::new_incident("web", opened))
        .unwrap();
    let started = Instant::now();
    let mut seq = 0u64;
    while store.stats().live_bytes < mib << 20 {
        let batch: Vec<Sample> = (0..4096)
            .map(|_| {
                seq += 1;
                model::fixtures::sample(inc.id, seq, opened + seq * 1_000)
            })
            .collect();
        store.put_samples(&batch).unwrap();
    }
    store
        .close_incident(&mut inc, opened + seq * 1_000)
        .unwrap();
    let s = store.stats();
    println!(
        "prefilled {seq} samples in {:.1?}: live {} B, disk {} B, {} reopens",
        started.elapsed(),
        s.live_bytes,
        s.size_on_disk,
        s.engine_reopens
    );
}

/// sled alone, configured as the store configures it.
fn raw(a: &Args, dir: &std::path::Path) {
    let cache = a.cache_bytes.unwrap_or(StoreConfig::default().cache_bytes);
    let open = || {
        sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .cache_capacity(cache)
            .flush_every_ms(Some(500))
            .open()
            .unwrap()
    };
    println!(
        "raw sled: cache_capacity {cache}, {} B values, each read back {} times",
        a.value_bytes, a.touch
    );
    println!("mib_written,rss_mib,arena_mib,mapped_mib,reopens");
    let mut db = open();
    let mut tree = db.open_tree("samples").unwrap();
    let per_mib = ((1u64 << 20) / a.value_bytes as u64).max(1);
    let mut key = 0u64;
    let mut reopens = 0;
    let (arena, mapped) = heap_mib();
    println!("0,{:.1},{arena:.2},{mapped:.1},0", rss_mib());
    for mib in 1..=a.raw_mib.unwrap_or(0) {
        for _ in 0..per_mib {
            key += 1;
            tree.insert(key.to_be_bytes(), vec![(key % 251) as u8; a.value_bytes])
                .unwrap();
            for _ in 0..a.touch {
                tree.get(key.to_be_bytes()).unwrap();
            }
            if a.keep_mib > 0 && key > a.keep_mib * per_mib {
                tree.remove((key - a.keep_mib * per_mib).to_be_bytes())
                    .unwrap();
            }
        }
        if a.reopen_every > 0 && mib % a.reopen_every == 0 {
            db.flush().unwrap();
            drop(tree);
            drop(db);
            db = open();
            tree = db.open_tree("samples").unwrap();
            reopens += 1;
        }
        storage_release_retired();
        let rss = rss_mib();
        let (arena, mapped) = heap_mib();
        println!("{mib},{rss:.1},{arena:.2},{mapped:.1},{reopens}");
    }
    drop(tree);
    drop(db);
    println!("dropped: RSS {:.1} MiB", rss_mib());
    let started = Instant::now();
    let db = open();
    println!(
        "reopened in {:?}: RSS {:.1} MiB",
        started.elapsed(),
        rss_mib()
    );
    drop(db);
}

/// What the store does after its writes: hand this thread's retired sled memory on.
fn storage_release_retired() {
    crossbeam_epoch::pin().flush();
}

fn main() {
    // RUST_LOG=storage=info prints each reopen's flush, drop and open times.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let a = args();
    let tmp = tempfile::tempdir().unwrap();
    if a.raw_mib.is_some() {
        let dir = a.dir.clone().unwrap_or_else(|| tmp.path().join("raw"));
        raw(&a, &dir);
        return;
    }
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().join("db"));
    let mut cfg = StoreConfig::default();
    if let Some(c) = a.cache_bytes {
        cfg.cache_bytes = c;
    }
    if let Some(m) = a.max_bytes {
        cfg.max_bytes = m;
    }
    if let Ok(n) = std::env::var("SLED_RSS_LEVELS") {
        cfg.history
            .truncate(n.parse().expect("SLED_RSS_LEVELS: a number of levels"));
    }
    println!(
        "cache_bytes {} max_bytes {} rate {} samples/s services {} dir {}",
        cfg.cache_bytes,
        cfg.max_bytes,
        a.rate,
        a.services,
        dir.display()
    );
    if a.prefill_mib > 0 {
        prefill(&dir, &cfg, a.prefill_mib);
    }
    print_memory("before open");
    let started = Instant::now();
    let store = Arc::new(Store::open(&dir, cfg.clone()).unwrap());
    println!(
        "opened in {:?}: RSS {:.1} MiB, live {} B, disk {} B",
        started.elapsed(),
        rss_mib(),
        store.stats().live_bytes,
        store.size_on_disk().unwrap()
    );
    // Another thread takes the engine lock every 2 ms: what it waits is what readers and
    // writers wait while a reopen holds it.
    let stop = Arc::new(AtomicBool::new(false));
    let slowest_read_us = Arc::new(AtomicU64::new(0));
    let reader = {
        let (store, stop, slowest) = (store.clone(), stop.clone(), slowest_read_us.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                store.readable().unwrap();
                slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let reopens_at_start = store.stats().engine_reopens;
    let mut calls = Calls::default();
    let services: Vec<String> = (0..a.services).map(|i| format!("svc-{i}")).collect();
    let mut open: Option<storage::Incident> = None;
    let mut seq = 0u64;
    let wall = Instant::now();
    println!(
        "minute,rss_mib,arena_mib,mapped_mib,live_bytes,disk_bytes,wall_s,reopens,slowest_call_ms"
    );
    for minute in 1..=a.minutes {
        for s in 0..60 {
            let second = (minute - 1) * 60 + s;
            let now = T0 + second * SEC;
            let hists: Vec<(usize, Probe, Histogram)> = (0..services.len())
                .flat_map(|i| {
                    Probe::ALL
                        .iter()
                        .enumerate()
                        .map(move |(p, probe)| (i, *probe, histogram(second, p)))
                })
                .collect();
            let points: Vec<HistoryPoint<'_>> = hists
                .iter()
                .map(|(i, probe, hist)| HistoryPoint {
                    service: &services[*i],
                    probe: *probe,
                    hist,
                })
                .collect();
            calls.time(&store, || store.record_history_batch(now, &points).unwrap());

            let in_incident = (minute - 1) % a.every == 1;
            if in_incident && open.is_none() {
                open = Some(calls.time(&store, || {
                    store
                        .open_incident(&common::new_incident("web", now))
                        .unwrap()
                }));
            }
            if !in_incident {
                if let Some(mut inc) = open.take() {
                    calls.time(&store, || store.close_incident(&mut inc, now).unwrap());
                }
            }
            if let Some(inc) = &open {
                let batch: Vec<Sample> = (0..a.rate)
                    .map(|i| {
                        seq += 1;
                        model::fixtures::sample(inc.id, seq, now + i * (SEC / a.rate.max(1)))
                    })
                    .collect();
                calls.time(&store, || store.put_samples(&batch).unwrap());
            }
        }
        if minute % a.retention_every.max(1) == 0 {
            calls.time(&store, || {
                store.enforce_retention(T0 + minute * 60 * SEC).unwrap();
                store.maybe_rotate().unwrap();
            });
        }
        println!(
            "{minute},{:.1},{:.2},{:.1},{},{},{:.1},{},{:.1}",
            rss_mib(),
            heap_mib().0,
            heap_mib().1,
            store.stats().live_bytes,
            store.size_on_disk().unwrap(),
            wall.elapsed().as_secs_f64(),
            store.stats().engine_reopens - reopens_at_start,
            ms(std::mem::take(&mut calls.minute_max))
        );
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let mut r = calls.reopens.clone();
    r.sort();
    let pct = |q: f64| {
        r.get(((r.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| ms(*d))
    };
    println!(
        "reopens: {} in {} simulated minutes; calls that reopened: median {:.1} ms, p90 {:.1} ms, \
         max {:.1} ms; slowest other call {:.1} ms; slowest read of another thread {:.1} ms",
        r.len(),
        a.minutes,
        pct(0.5),
        pct(0.9),
        pct(1.0),
        ms(calls.slowest_other),
        slowest_read_us.load(Ordering::Relaxed) as f64 / 1e3
    );
    let store = Arc::into_inner(store).unwrap();
    if std::env::var_os("SLED_RSS_EXIT_LIVE").is_some() {
        // What the store holds now is what a heap profiler reports as leaked.
        std::process::exit(0);
    }
    drop(store);
    print_memory("store dropped");
    if let Some(secs) = std::env::var_os("SLED_RSS_PAUSE").and_then(|s| s.into_string().ok()) {
        // Time to read /proc/PID/smaps with nothing of the store open.
        eprintln!("pausing {secs} s, pid {}", std::process::id());
        std::thread::sleep(Duration::from_secs(secs.parse().unwrap()));
    }
    let started = Instant::now();
    reset_peak();
    let store = Store::open(&dir, cfg).unwrap();
    println!(
        "reopened in {:?}: RSS {:.1} MiB (peak {:.1} MiB), live {} B",
        started.elapsed(),
        rss_mib(),
        peak_mib(),
        store.stats().live_bytes
    );
    if a.rotate {
        let started = Instant::now();
        reset_peak();
        let rep = store.rotate().unwrap();
        println!(
            "rotated in {:?}: {} live bytes copied, disk {} -> {} B; RSS {:.1} MiB (peak {:.1} MiB)",
            started.elapsed(),
            rep.live_bytes,
            rep.size_before,
            rep.size_after,
            rss_mib(),
            peak_mib()
        );
    }
}
