//! The interval loop on a scripted kernel: a real detector and a real store in a temporary
//! directory, time driven by the test, no root, no BPF, no sleeps.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bpf::{
    CaptureCounters, CaptureError, CaptureLimits, CaptureRecord, Counters, ProgStats, ReadError,
    ServiceHist, ServiceSpec, Snapshot,
};
use capture::pwru::{PwruConfig, SessionRequest, SessionState, SessionStatus};
use capture::CaptureConfig;
use detector::{Detector, DetectorConfig, Thresholds};
use model::Sample;
use model::{Histogram, Probe};
use storage::{CaptureState, IncidentState, PwruState, SampleFilter, Store, StoreConfig};

use super::interval::{DaemonCore, Now};
use super::kernel::Kernel;
use super::lock;
use super::pwru::{self, PwruStarter, SessionNews};
use crate::config::{ApiConfig, Config, DaemonConfig};

const SERVICE: &str = "web";
const SLOT: u32 = 3;
const PORT: u16 = 8080;
const HOT: Probe = Probe::TcpSocketRead;
const QUIET_NS: u64 = 50_000;
const SLOW_NS: u64 = 5_000_000;
const PER_INTERVAL: u64 = 1000;

/// What the scripted kernel holds and what was done to it.
#[derive(Default)]
struct KernelState {
    cumulative: BTreeMap<(String, Probe), Histogram>,
    /// Services the next snapshot reports as retired (their cgroup is gone).
    retire_next: Vec<String>,
    fail_next_snapshot: bool,
    /// Report only the histograms that changed since the last snapshot, as the real
    /// kernel side does (`ProbeSet::snapshot_changed`); `reported` is what it saw then.
    only_changed: bool,
    reported: BTreeMap<(String, Probe), Histogram>,
    capture_fails: bool,
    armed: HashMap<u32, Vec<(Probe, u64)>>,
    disarmed: Vec<u32>,
    flight: BTreeMap<(u32, Probe), u64>,
    records: Vec<CaptureRecord>,
    counters: CaptureCounters,
    /// The service the traffic counts toward (`SERVICE` when `None`).
    traffic_service: Option<&'static str>,
    /// Per-CPU histograms, for those the test spreads over CPUs ([`FakeKernel::traffic_on_cpu`]).
    per_cpu: BTreeMap<(String, Probe), Vec<Histogram>>,
    /// driver-to-completion per device, cumulative, as every snapshot reports it.
    devices: Vec<bpf::DeviceHist>,
}

#[derive(Clone, Default)]
struct FakeKernel(Arc<Mutex<KernelState>>);

impl FakeKernel {
    fn state(&self) -> std::sync::MutexGuard<'_, KernelState> {
        lock(&self.0)
    }

    /// `n` packets of `ns` at `probe` of the service, this interval.
    fn traffic(&self, probe: Probe, ns: u64, n: u64) {
        let mut st = self.state();
        let service = st.traffic_service.unwrap_or(SERVICE);
        let h = st
            .cumulative
            .entry((service.to_owned(), probe))
            .or_default();
        h.record_n(ns, n);
    }

    /// `n` packets of `ns` at `probe` of the service on `cpu` (of `cpus`), this interval.
    fn traffic_on_cpu(&self, probe: Probe, cpu: usize, cpus: usize, ns: u64, n: u64) {
        self.traffic(probe, ns, n);
        let mut st = self.state();
        let service = st.traffic_service.unwrap_or(SERVICE);
        let per_cpu = st
            .per_cpu
            .entry((service.to_owned(), probe))
            .or_insert_with(|| vec![Histogram::new(); cpus]);
        per_cpu[cpu].record_n(ns, n);
    }

    /// A capture record read from the ring (armed capture counts as emitted).
    fn record(&self, flight: bool, sample: Sample) {
        let mut st = self.state();
        if !flight {
            st.counters.emitted += 1;
        }
        st.records.push(CaptureRecord {
            service_slot: SLOT,
            flight,
            sample,
        });
    }
}

/// The slot the scripted kernel gives a service: the catch-alls' fixed ones, `SLOT` for
/// `SERVICE`, and one past those for any other.
fn fake_slot(service: &str) -> u32 {
    match service {
        "host" => bpf::HOST_SLOT,
        "other" => bpf::OTHER_SLOT,
        SERVICE => SLOT,
        _ => SLOT + 1,
    }
}

impl Kernel for FakeKernel {
    fn snapshot(&mut self) -> Result<Snapshot, ReadError> {
        let mut st = self.state();
        if std::mem::take(&mut st.fail_next_snapshot) {
            return Err(ReadError::Clock(std::io::Error::other("scripted failure")));
        }
        let hists = st
            .cumulative
            .iter()
            .filter(|(key, hist)| !st.only_changed || st.reported.get(*key) != Some(*hist))
            .map(|((service, probe), hist)| ServiceHist {
                service: service.clone(),
                slot: fake_slot(service),
                probe: *probe,
                hist: hist.clone(),
            })
            .collect();
        st.reported = st.cumulative.clone();
        Ok(Snapshot {
            hists,
            devices: st.devices.clone(),
            counters: Counters::default(),
            retired: std::mem::take(&mut st.retire_next),
        })
    }

    fn per_cpu_hist(
        &mut self,
        slot: u32,
        probe: Probe,
    ) -> Result<Option<Vec<Histogram>>, ReadError> {
        let st = self.state();
        Ok(st
            .per_cpu
            .iter()
            .find(|((service, p), _)| fake_slot(service) == slot && *p == probe)
            .map(|(_, h)| h.clone()))
    }

    fn prog_stats(&self) -> Vec<ProgStats> {
        Vec::new()
    }

    fn start_capture(&mut self, _: &CaptureLimits) -> Result<(), CaptureError> {
        if self.state().capture_fails {
            return Err(CaptureError::Thread(std::io::Error::other(
                "no ring buffer",
            )));
        }
        Ok(())
    }

    fn arm(&mut self, slot: u32, thresholds: &[(Probe, u64)]) -> Result<(), CaptureError> {
        // As the real one: arming adds to (or replaces per probe) what the slot has armed.
        let mut st = self.state();
        let armed = st.armed.entry(slot).or_default();
        for &(p, ns) in thresholds {
            armed.retain(|&(q, _)| q != p);
            armed.push((p, ns));
        }
        Ok(())
    }

    fn disarm(&mut self, slot: u32) -> Result<(), CaptureError> {
        let mut st = self.state();
        st.armed.remove(&slot);
        st.disarmed.push(slot);
        Ok(())
    }

    fn set_flight(&mut self, slot: u32, thresholds: &[(Probe, u64)]) -> Result<(), CaptureError> {
        let mut st = self.state();
        for &(p, ns) in thresholds {
            st.flight.insert((slot, p), ns);
        }
        Ok(())
    }

    fn reader_wait(&self) -> Result<bool, String> {
        Ok(!self.state().armed.is_empty())
    }

    fn set_nic_clocks(&mut self, _clocks: &[bpf::NicClock]) -> Result<bool, ReadError> {
        Ok(false)
    }

    fn capture_counters(&mut self) -> Result<CaptureCounters, CaptureError> {
        Ok(self.state().counters)
    }

    fn take_records(&mut self, out: &mut Vec<CaptureRecord>) {
        out.append(&mut self.state().records);
    }

    fn capture_overflow(&self) -> u64 {
        0
    }
}

/// Session requests handed out, by incident.
#[derive(Clone, Default)]
struct FakePwru(Arc<Mutex<Vec<(u64, SessionRequest)>>>);

impl PwruStarter for FakePwru {
    fn start(&mut self, incident: u64, request: SessionRequest) {
        lock(&self.0).push((incident, request));
    }
}

/// The loop, its kernel, store and pwru, and the test's clock (one second per interval).
struct Harness {
    core: DaemonCore<FakeKernel, FakePwru>,
    kernel: FakeKernel,
    pwru: FakePwru,
    store: Arc<Store>,
    wall: SystemTime,
    mono: Instant,
    _dir: tempfile::TempDir,
}

fn config() -> Config {
    Config {
        origin: "test".into(),
        probes: bpf::ProbeConfig {
            services: vec![ServiceSpec {
                name: SERVICE.into(),
                cgroup: None,
                ports: vec![PORT],
            }],
            ..Default::default()
        },
        // Short windows and warm-up so a scenario takes a few dozen intervals.
        detector: DetectorConfig {
            defaults: Thresholds {
                window: Duration::from_secs(1),
                max_window: Duration::from_secs(10),
                min_samples: 100,
                warmup_samples: 2000,
                warmup_time: Duration::from_secs(5),
                open_after: 2,
                open_window: 3,
                close_after: 2,
                cooldown: Duration::from_secs(5),
                ..Thresholds::default()
            },
            ..DetectorConfig::default()
        },
        storage: StoreConfig::default(),
        capture: CaptureConfig::default(),
        pwru: PwruConfig::default(),
        daemon: DaemonConfig {
            baseline_save_every: Duration::from_secs(5),
            ..DaemonConfig::default()
        },
        api: ApiConfig::default(),
        metrics: crate::metrics::MetricsConfig::default(),
        otlp: crate::otlp::OtlpConfig::default(),
    }
}

impl Harness {
    fn new(kernel: FakeKernel) -> Harness {
        Harness::with_config(kernel, config())
    }

    fn with_config(kernel: FakeKernel, config: Config) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path().join("db"), config.storage.clone()).unwrap());
        let detector = Detector::new(config.detector.clone());
        let pwru = FakePwru::default();
        let mono = Instant::now();
        let core = DaemonCore::new(
            config,
            kernel.clone(),
            detector,
            store.clone(),
            pwru.clone(),
            mono,
        );
        Harness {
            core,
            kernel,
            pwru,
            store,
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            mono,
            _dir: dir,
        }
    }

    fn now_ns(&self) -> u64 {
        model::unix_ns(self.wall)
    }

    /// One interval of `ns` packets at the hot probe (and quiet ones at tcp-start).
    fn tick(&mut self, ns: u64) {
        self.interval_only(ns);
        // Intervals here come back to back, not a second apart: let the writer keep up.
        self.core.sync_storage();
    }

    /// [`Harness::tick`] without waiting for the storage threads.
    fn interval_only(&mut self, ns: u64) {
        self.kernel.traffic(Probe::TcpStart, 10_000, PER_INTERVAL);
        self.kernel.traffic(HOT, ns, PER_INTERVAL);
        self.run_interval();
    }

    /// One interval of whatever traffic the kernel holds.
    fn run_interval(&mut self) {
        let start = self.wall;
        self.wall += Duration::from_secs(1);
        self.mono += Duration::from_secs(1);
        self.core.interval(
            start,
            Now {
                wall: self.wall,
                mono: self.mono,
            },
        );
    }

    fn open_ids(&self) -> Vec<u64> {
        let status = self.core.status();
        let ids = lock(&status).open_incidents.iter().map(|o| o.id).collect();
        ids
    }

    /// Quiet until the baselines are warm (no incident meanwhile).
    fn warm_up(&mut self) {
        for _ in 0..8 {
            self.tick(QUIET_NS);
        }
        assert!(self.open_ids().is_empty());
    }

    /// Quiet intervals, at most `max`, until no incident is open.
    fn quiet_until_closed(&mut self, max: usize) {
        for _ in 0..max {
            self.tick(QUIET_NS);
            if self.open_ids().is_empty() {
                break;
            }
        }
        assert!(self.open_ids().is_empty(), "the incident did not close");
    }

    /// Slow intervals until an incident opens; its id.
    fn slow_until_open(&mut self) -> u64 {
        for _ in 0..5 {
            self.tick(SLOW_NS);
            if let [id] = self.open_ids()[..] {
                return id;
            }
        }
        panic!("no incident opened");
    }

    fn incident(&self, id: u64) -> storage::Incident {
        // Record changes reach the store through the sample thread.
        self.core.sync_records();
        self.store.incident(id).unwrap().expect("incident stored")
    }
}

fn sample(time_ns: u64, latency_ns: u64, src: &str) -> Sample {
    // The shared builder with what this scenario checks: the hot probe, the latency, the peer
    // and the service's port; no pre-trigger flag (the daemon sets it).
    let mut s = model::fixtures::sample(0, 10, time_ns);
    s.probe = HOT;
    s.latency_ns = latency_ns;
    s.flow.src = src.parse::<IpAddr>().unwrap();
    s.flow.dst = "10.0.0.1".parse().unwrap();
    s.flow.dport = PORT;
    s
}

/// The baseline's p99 bucket bound of the quiet traffic: what capture arms at.
fn quiet_p99_upper() -> u64 {
    let mut h = Histogram::new();
    h.record_n(QUIET_NS, PER_INTERVAL);
    h.quantile(0.99).unwrap().upper_ns
}

#[test]
fn an_incident_opens_captures_asks_for_pwru_and_closes() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.warm_up();
    // The flight recorder follows the warm baseline at the service's slot.
    assert!(kernel.state().flight.contains_key(&(SLOT, HOT)));

    // The flight recorder saw a few slow packets just before.
    for src in ["10.0.0.5", "10.0.0.5", "10.0.0.6"] {
        kernel.record(true, sample(h.now_ns(), SLOW_NS, src));
    }
    let id = h.slow_until_open();

    // Stored, with the hot probe in its headline.
    let rec = h.incident(id);
    assert_eq!(rec.service, SERVICE);
    assert_eq!(rec.state, IncidentState::Open);
    assert!(rec.probes.contains(&HOT), "{:?}", rec.probes);
    let status = h.core.status();
    let headline = lock(&status).open_incidents[0].headline.clone();
    assert!(headline.starts_with("tcp-socket-read "), "{headline}");

    // Armed at the baseline's p99 at the hot probe, on the service's slot.
    let armed = kernel.state().armed.get(&SLOT).cloned().expect("armed");
    assert_eq!(armed, [(HOT, quiet_p99_upper())]);
    assert_eq!(rec.capture.state, CaptureState::Armed);
    assert!(rec
        .capture
        .message
        .starts_with("armed at tcp-socket-read ≥ "));
    assert_eq!(rec.capture.pre_trigger, 3);

    // pwru asked for the service's port and the dominant peers.
    let requests = lock(&h.pwru.0).clone();
    assert_eq!(requests.len(), 1);
    let (for_id, request) = &requests[0];
    assert_eq!(*for_id, id);
    assert_eq!(
        request.filter().expression(),
        "tcp and dst port 8080 and dst host 10.0.0.1 and (src host 10.0.0.5 or src host 10.0.0.6)"
    );
    // The loop hands the request on unchecked: its session's task checks the functions
    // against the kernel (here the real one), so that reading BTF never holds up the loop.
    let asked = request.filter_funcs().names().to_vec();
    let drop_points = ["kfree_skb_reason", "sk_skb_reason_drop"];
    assert!(
        drop_points.iter().all(|d| asked.iter().any(|n| n == d)),
        "{asked:?}"
    );
    let rec = h.incident(id);
    assert_eq!(
        rec.pwru.message,
        format!("requested: {}", request.filter().expression())
    );
    assert_eq!(rec.pwru.state, PwruState::Running);
    // Only functions pwru selects on this kernel (BTF rule) are kept.
    let choice = pwru::choose_functions(request.clone()).expect("functions left");
    let names = choice.request.filter_funcs().names();
    assert!(names.iter().any(|n| n == "tcp_v4_rcv"), "{names:?}");
    assert!(names.iter().all(|n| asked.contains(n)), "{names:?}");
    // A kernel has one of the two drop points as a traceable function, never both.
    assert_eq!(
        names
            .iter()
            .filter(|n| drop_points.contains(&n.as_str()))
            .count(),
        1,
        "{names:?}"
    );
    h.core.pwru_news(SessionNews::Chosen {
        incident: id,
        summary: choice.summary.clone(),
    });
    let rec = h.incident(id);
    assert!(
        rec.pwru.message.ends_with(&format!("; {}", choice.summary))
            && choice.summary.starts_with("functions: "),
        "{}",
        rec.pwru.message
    );
    assert_eq!(rec.pwru.state, PwruState::Running);

    // Armed samples are stored and counted with the incident.
    for _ in 0..4 {
        kernel.record(false, sample(h.now_ns(), SLOW_NS, "10.0.0.5"));
    }
    h.tick(SLOW_NS);
    let rec = h.incident(id);
    assert_eq!(rec.capture.stored, 7);
    let page = h
        .store
        .samples(id, &SampleFilter::default(), None, 100)
        .unwrap();
    assert_eq!(page.samples.len(), 7);

    // Quiet again: closed, disarmed with the reason.
    h.quiet_until_closed(6);
    let rec = h.incident(id);
    assert_eq!(rec.state, IncidentState::Closed);
    assert_eq!(rec.capture.state, CaptureState::Disarmed);
    assert_eq!(rec.capture.message, "disarmed: the incident closed");
    assert_eq!(rec.capture.emitted, 4);
    assert_eq!(kernel.state().disarmed, [SLOT]);
    assert!(kernel.state().armed.is_empty());

    // The session's outcome comes after the close and keeps the functions chosen.
    h.core.pwru_news(session_ended(
        id,
        SessionStatus::unavailable(SERVICE, "no binary".into()),
    ));
    let rec = h.incident(id);
    assert_eq!(rec.state, IncidentState::Closed);
    assert_eq!(rec.pwru.state, PwruState::NotRun);
    assert_eq!(
        rec.pwru.message,
        format!("unavailable: no binary; {}", choice.summary)
    );

    // Baselines went to the store on the way.
    let saved = h.store.baselines().unwrap();
    assert!(
        saved.iter().any(|(s, p, _)| s == SERVICE && *p == HOT),
        "baselines not saved"
    );
}

/// With `[otlp]` on, the loop hands the outbox an event per opening, closing and pwru end
/// of each incident, in that order, and one for an incident the stop interrupts.
#[test]
fn incident_events_reach_the_otlp_outbox_in_order() {
    use crate::otlp::{EventKind, Outbox};
    let mut h = Harness::new(FakeKernel::default());
    let outbox = Outbox::detached(64);
    h.core.set_outbox(outbox.clone());
    h.warm_up();
    let id = h.slow_until_open();
    h.quiet_until_closed(6);
    h.core.pwru_news(session_ended(
        id,
        SessionStatus::unavailable(SERVICE, "no binary".into()),
    ));
    let events = outbox.take_all();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Opened, EventKind::Closed, EventKind::PwruEnded]
    );
    for e in &events {
        assert!(e.id.starts_with(&format!("test-host/{id}/")), "{}", e.id);
        assert!(e.body.contains(SERVICE), "{}", e.body);
    }
    let stage = |e: &crate::otlp::Event| {
        e.attributes
            .iter()
            .find(|(k, _)| *k == "tailtrap.stage")
            .map(|(_, v)| v.clone())
    };
    assert!(stage(&events[0]).is_some(), "{:?}", events[0]);

    // An incident open at the stop ends as interrupted, and says so.
    let second = h.slow_until_open();
    assert_ne!(second, id);
    let stop = h.wall + Duration::from_secs(1);
    h.core.stop(Now {
        wall: stop,
        mono: h.mono,
    });
    let events = outbox.take_all();
    let last = events.last().expect("events");
    assert_eq!(last.kind, EventKind::Closed);
    assert!(
        last.body.starts_with("interrupted incident"),
        "{}",
        last.body
    );
}

/// The catch-alls are services like any other for capture: an incident on `host` (traffic
/// no declared service claims) or `other` (auto services beyond the limit) arms their fixed
/// slots, though the kernel has no named slot for them.
#[test]
fn incidents_on_host_and_other_arm_capture() {
    for (service, slot) in [("host", bpf::HOST_SLOT), ("other", bpf::OTHER_SLOT)] {
        let kernel = FakeKernel::default();
        kernel.state().traffic_service = Some(service);
        let mut h = Harness::new(kernel.clone());
        h.warm_up();
        let id = h.slow_until_open();
        let rec = h.incident(id);
        assert_eq!(rec.service, service);
        assert_eq!(rec.capture.state, CaptureState::Armed, "{service}: {rec:?}");
        let armed = kernel.state().armed.get(&slot).cloned();
        assert_eq!(armed, Some(vec![(HOT, quiet_p99_upper())]), "{service}");
        assert!(
            rec.capture
                .message
                .starts_with("armed at tcp-socket-read ≥ "),
            "{service}: {}",
            rec.capture.message
        );
    }
}

#[test]
fn without_capture_the_incident_is_stored_with_the_reason() {
    let kernel = FakeKernel::default();
    kernel.state().capture_fails = true;
    let mut h = Harness::new(kernel.clone());
    h.warm_up();
    let id = h.slow_until_open();
    let rec = h.incident(id);
    assert_eq!(rec.capture.state, CaptureState::NotArmed);
    assert_eq!(
        rec.capture.message,
        "in-kernel capture unavailable: starting the capture reader thread: no ring buffer"
    );
    assert!(kernel.state().armed.is_empty());
    // Without samples, pwru still gets the configured port.
    let requests = lock(&h.pwru.0).clone();
    assert_eq!(requests[0].1.filter().expression(), "tcp and dst port 8080");
    let status = h.core.status();
    assert!(!lock(&status).capture.available);
}

#[test]
fn a_failed_read_counts_an_interval_error_and_the_loop_goes_on() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.tick(QUIET_NS);
    kernel.state().fail_next_snapshot = true;
    h.tick(QUIET_NS);
    h.tick(QUIET_NS);
    let status = h.core.status();
    let status = lock(&status);
    assert_eq!(status.interval_errors, 1);
    assert_eq!(status.intervals, 3);
    // The failed interval's packets show up in the next delta.
    let row = status
        .latency
        .iter()
        .find(|r| r.probe == HOT)
        .expect("a latency row");
    assert_eq!(row.count, 2 * PER_INTERVAL);
}

#[test]
fn a_retired_service_keeps_its_last_interval_and_is_forgotten() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.tick(QUIET_NS);
    kernel.state().retire_next = vec![SERVICE.to_owned()];
    h.tick(QUIET_NS);
    // The last interval is reported (and stored) like any other ...
    let status = h.core.status();
    let row_count = |status: &Arc<Mutex<super::live::LoopStatus>>| {
        lock(status)
            .latency
            .iter()
            .find(|r| r.probe == HOT)
            .map(|r| r.count)
    };
    assert_eq!(row_count(&status), Some(PER_INTERVAL));
    // ... then its cumulative state is gone.
    assert!(h.core.cumulative().keys().all(|(s, _)| s != SERVICE));
    // The slot restarts from zero for its next owner, here under the same name: its first
    // interval counts from zero, not from the old owner's totals.
    kernel.state().cumulative.clear();
    h.tick(QUIET_NS);
    assert_eq!(row_count(&status), Some(PER_INTERVAL));
}

#[test]
fn histograms_left_out_of_a_snapshot_as_unchanged_keep_their_totals() {
    let kernel = FakeKernel::default();
    kernel.state().only_changed = true;
    let mut h = Harness::new(kernel.clone());
    h.tick(QUIET_NS);
    let status = h.core.status();
    let rows = |status: &Arc<Mutex<super::live::LoopStatus>>| {
        let mut rows: Vec<(Probe, u64)> = lock(status)
            .latency
            .iter()
            .map(|r| (r.probe, r.count))
            .collect();
        rows.sort();
        rows
    };
    assert_eq!(
        rows(&status),
        [(Probe::TcpStart, PER_INTERVAL), (HOT, PER_INTERVAL)]
    );
    // An interval where only tcp-start moved: the hot probe's histogram is not read, it
    // has no row, and its total stays published.
    kernel.traffic(Probe::TcpStart, 10_000, 1);
    h.run_interval();
    assert_eq!(rows(&status), [(Probe::TcpStart, 1)]);
    let published = h.core.cumulative();
    assert_eq!(published[&(SERVICE.to_owned(), HOT)].count(), PER_INTERVAL);
    // Nothing moved: no rows, nothing lost.
    h.run_interval();
    assert!(rows(&status).is_empty());
    assert_eq!(h.core.cumulative().len(), 2);
    // When it moves again its interval counts from the total kept.
    h.tick(QUIET_NS);
    assert_eq!(
        rows(&status),
        [(Probe::TcpStart, PER_INTERVAL), (HOT, PER_INTERVAL)]
    );
    assert_eq!(
        h.core.cumulative()[&(SERVICE.to_owned(), HOT)].count(),
        2 * PER_INTERVAL
    );
}

#[test]
fn devices_get_interval_rows_from_their_cumulative_completions() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    let device = |name: &str, ifindex: u32, ns: u64, n: u64| {
        let mut hist = Histogram::new();
        hist.record_n(ns, n);
        bpf::DeviceHist {
            device: name.into(),
            ifindex,
            netns: 1,
            hist,
        }
    };
    kernel.state().devices = vec![device("eth0", 2, 70_000, 10)];
    h.tick(QUIET_NS);
    let status = h.core.status();
    let rows = |status: &Arc<Mutex<super::live::LoopStatus>>| {
        lock(status)
            .device_latency
            .iter()
            .map(|r| (r.device.clone(), r.count))
            .collect::<Vec<_>>()
    };
    assert_eq!(rows(&status), [("eth0".to_owned(), 10)]);
    // 25 more on eth0 and a second device: each row is its interval, not its total.
    let mut eth0 = device("eth0", 2, 70_000, 10);
    eth0.hist.record_n(2_000_000, 25);
    kernel.state().devices = vec![eth0, device("eth1", 3, 90_000, 4)];
    h.tick(QUIET_NS);
    assert_eq!(
        rows(&status),
        [("eth0".to_owned(), 25), ("eth1".to_owned(), 4)]
    );
    let p50 = lock(&status).device_latency[0].p50_ns.unwrap_or(0.0);
    assert!((1_500_000.0..2_500_000.0).contains(&p50), "{p50}");
    // Idle devices have no row; the published totals stay.
    h.tick(QUIET_NS);
    assert!(rows(&status).is_empty());
    let published = h.core.device_cumulative();
    assert_eq!(published.iter().map(|d| d.hist.count()).sum::<u64>(), 39);
}

#[test]
fn the_published_cumulative_histograms_are_the_last_snapshot() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.tick(QUIET_NS);
    let first = h.core.cumulative();
    h.tick(SLOW_NS);
    let published = h.core.cumulative();
    let expected: BTreeMap<_, _> = kernel.state().cumulative.clone();
    let got: BTreeMap<_, _> = published
        .iter()
        .map(|(k, v)| (k.clone(), (**v).clone()))
        .collect();
    assert_eq!(got, expected);
    // A reader's earlier Arc is left as it was: the loop swaps maps, it does not write.
    assert_eq!(first[&(SERVICE.to_owned(), HOT)].count(), PER_INTERVAL);
    assert_eq!(
        published[&(SERVICE.to_owned(), HOT)].count(),
        2 * PER_INTERVAL
    );
}

#[test]
fn history_and_baselines_written_off_the_loop_are_all_stored_at_stop() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    let first = h.now_ns();
    // Across a minute boundary: one chunk of 1 s points completes, the next is part-filled.
    for _ in 0..75 {
        h.tick(QUIET_NS);
    }
    h.core.stop(Now {
        wall: h.wall,
        mono: h.mono,
    });
    let fine = h
        .store
        .history_at_level(0, SERVICE, HOT, first, h.now_ns())
        .unwrap();
    assert_eq!(fine.points.len(), 75);
    assert!(fine.points.iter().all(|(_, p)| p.count() == PER_INTERVAL));
    assert!(h.store.baseline(SERVICE, HOT).unwrap().is_some());
}

#[test]
fn samples_still_queued_at_a_stop_are_stored_and_counted_with_the_interrupted_incident() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.warm_up();
    let id = h.slow_until_open();
    let before = h.incident(id).capture.stored;
    for _ in 0..5 {
        kernel.record(false, sample(h.now_ns(), SLOW_NS, "10.0.0.5"));
    }
    // The interval queues the batch; the stop comes before another interval counts it.
    h.interval_only(SLOW_NS);
    h.core.stop(Now {
        wall: h.wall,
        mono: h.mono,
    });
    let rec = h.incident(id);
    assert_eq!(rec.state, IncidentState::Interrupted);
    assert_eq!(rec.capture.stored, before + 5);
    let page = h
        .store
        .samples(id, &SampleFilter::default(), None, 100)
        .unwrap();
    assert_eq!(page.samples.len() as u64, rec.capture.stored);
}

/// A store over its size budget is trimmed within half a minute, not at the next retention
/// period (an hour here): a burst into a small budget must not stay over it that long.
#[test]
fn a_store_over_its_budget_is_trimmed_before_the_retention_period() {
    let mut config = config();
    config.daemon.retention_every = Duration::from_secs(3600);
    config.storage.max_bytes = 1 << 20;
    let mut h = Harness::with_config(FakeKernel::default(), config);
    // A closed incident whose samples alone are over the budget.
    let opened = h.now_ns();
    let mut old = h
        .store
        .open_incident(&storage::NewIncident {
            service: "old".into(),
            probes: vec![HOT],
            opened_ns: opened,
            evidence_json: "{}".into(),
            stages_json: "{}".into(),
        })
        .unwrap();
    for batch in 0..100u64 {
        let samples: Vec<Sample> = (batch * 1000..(batch + 1) * 1000)
            .map(|i| model::fixtures::sample(old.id, i, opened + i))
            .collect();
        h.store.put_samples(&samples).unwrap();
        if h.store.over_budget() {
            break;
        }
    }
    h.store.close_incident(&mut old, opened + 1).unwrap();
    assert!(h.store.over_budget());

    // Not before the 30 s gap (the loop does not ask every interval)...
    for _ in 0..29 {
        h.tick(QUIET_NS);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(h.store.over_budget(), "trimmed before the 30 s gap");
    // ...then at once, on the retention thread: the oldest closed incident goes.
    h.tick(QUIET_NS);
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.store.incident(old.id).unwrap().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        h.store.incident(old.id).unwrap().is_none(),
        "not trimmed 30 s after the gap: {:?}",
        h.store.stats()
    );
    assert!(!h.store.over_budget());
}

/// `incident`'s session ended as `status` says, nothing stored.
fn session_ended(incident: u64, status: SessionStatus) -> SessionNews {
    SessionNews::Finished(Box::new(pwru::Finished {
        incident,
        status,
        stored: 0,
        store_errors: 0,
    }))
}

/// What another incident's session reports when it ends (`state`), for the queue tests.
fn other_session_ended(state: SessionState) -> SessionNews {
    // No such incident: its record is not this test's concern.
    session_ended(
        999,
        SessionStatus {
            state,
            ..SessionStatus::unavailable("db", "the other service's session".into())
        },
    )
}

/// `incident`'s request found the slot taken by the `db` service's session.
fn found_busy(incident: u64) -> SessionNews {
    session_ended(
        incident,
        SessionStatus::not_run(
            SERVICE,
            SessionState::SkippedBusy,
            "the pwru session for \"db\" is still running".into(),
        ),
    )
}

/// An incident whose session finds another incident's session running waits for it while
/// it stays open, and gets its session once that one ends; closing ends the wait, with why.
#[test]
fn a_session_that_finds_the_slot_taken_waits_while_its_incident_is_open() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.warm_up();
    let id = h.slow_until_open();
    let asked = |h: &Harness| lock(&h.pwru.0).clone();
    assert_eq!(asked(&h).len(), 1);

    h.core.pwru_news(found_busy(id));
    let rec = h.incident(id);
    assert!(rec.pwru.is_waiting(), "{}", rec.pwru.message);
    assert_eq!(
        rec.pwru.message,
        "waiting: the pwru session for \"db\" is still running; this incident's session \
         starts when it ends, if the incident is still open"
    );
    // A request that never held the slot frees nothing.
    h.core
        .pwru_news(other_session_ended(SessionState::SkippedCooldown));
    h.core
        .pwru_news(other_session_ended(SessionState::Unavailable));
    assert_eq!(asked(&h).len(), 1);

    // The other session ends: this incident's is asked for again, on the same flows.
    h.core.pwru_news(other_session_ended(SessionState::Timeout));
    let requests = asked(&h);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].0, id);
    assert_eq!(
        requests[1].1.filter().expression(),
        requests[0].1.filter().expression()
    );
    let rec = h.incident(id);
    assert!(!rec.pwru.is_waiting());
    assert!(
        rec.pwru.message.starts_with("requested: "),
        "{}",
        rec.pwru.message
    );

    // Taken again (a newer incident's request got there first): it waits again; the
    // incident closes before the slot frees, so it ends skipped, saying why.
    h.core.pwru_news(found_busy(id));
    assert!(h.incident(id).pwru.is_waiting());
    h.quiet_until_closed(8);
    let rec = h.incident(id);
    assert_eq!(rec.pwru.state, PwruState::NotRun);
    assert_eq!(
        rec.pwru.message,
        "skipped-busy: the pwru session for \"db\" is still running; the incident closed \
         before that session ended"
    );
    // Nothing waits: the next end starts nothing, and a closed incident's busy request
    // is final.
    h.core.pwru_news(other_session_ended(SessionState::Ok));
    h.core.pwru_news(found_busy(id));
    assert_eq!(asked(&h).len(), 2);
    assert_eq!(h.incident(id).pwru.state, PwruState::NotRun);
}

/// Stopping ends every wait with why, and no session starts after it.
#[test]
fn stopping_ends_the_wait_for_a_session() {
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    h.warm_up();
    let id = h.slow_until_open();
    h.core.pwru_news(found_busy(id));
    assert!(h.incident(id).pwru.is_waiting());
    h.core.stop_pwru_waiting();
    let rec = h.incident(id);
    assert_eq!(rec.pwru.state, PwruState::NotRun);
    assert!(
        rec.pwru
            .message
            .ends_with("; tailtrap stopped before that session ended"),
        "{}",
        rec.pwru.message
    );
    h.core.pwru_news(other_session_ended(SessionState::Ok));
    assert_eq!(lock(&h.pwru.0).len(), 1);
}

/// Issue 32, item 3, on the scripted kernel: one CPU of four carries a quarter of the
/// service's packets and every slow one; the incident's cause names it, with figures.
/// Spread over every CPU instead, the same shift names no CPU.
#[test]
fn a_slow_cpu_is_named_in_the_cause_and_an_even_spread_is_not() {
    const CPUS: usize = 4;
    fn interval(h: &mut Harness, kernel: &FakeKernel, slow_on: &[usize]) {
        kernel.traffic(Probe::TcpStart, 10_000, PER_INTERVAL);
        for cpu in 0..CPUS {
            let ns = if slow_on.contains(&cpu) {
                SLOW_NS
            } else {
                QUIET_NS
            };
            kernel.traffic_on_cpu(HOT, cpu, CPUS, ns, PER_INTERVAL / CPUS as u64);
        }
        h.run_interval();
        h.core.sync_storage();
    }
    fn incident_with_cause(slow_on: &[usize]) -> storage::Incident {
        let kernel = FakeKernel::default();
        let mut h = Harness::new(kernel.clone());
        for _ in 0..8 {
            interval(&mut h, &kernel, &[]);
        }
        assert!(h.open_ids().is_empty());
        let mut id = None;
        for _ in 0..5 {
            interval(&mut h, &kernel, slow_on);
            if let [open] = h.open_ids()[..] {
                id = Some(open);
                break;
            }
        }
        let id = id.expect("no incident opened");
        // Open, undecided until the window has a few intervals.
        assert_eq!(h.incident(id).cause, None);
        let status = h.core.status();
        assert_eq!(lock(&status).open_incidents[0].cause, None);
        for _ in 0..3 {
            interval(&mut h, &kernel, slow_on);
        }
        let status = h.core.status();
        let rec = h.incident(id);
        let cause = rec.cause.expect("a cause after three intervals");
        assert_eq!(
            lock(&status).open_incidents[0].cause.as_deref(),
            Some(cause.kind.as_str())
        );
        let figures: serde_json::Value = serde_json::from_str(&cause.figures_json).unwrap();
        assert!(
            figures["window_ns"].as_u64().unwrap() >= 3_000_000_000,
            "{figures}"
        );
        h.incident(id)
    }

    let one = incident_with_cause(&[2]);
    let cause = one.cause.unwrap();
    assert_eq!(cause.kind, "one-cpu", "{}", cause.summary);
    assert!(
        cause
            .summary
            .starts_with("one CPU: cpu 2: 100 % of slow packets, 25 % of all packets; p99 "),
        "{}",
        cause.summary
    );
    assert!(
        cause.summary.ends_with(" on the other 3"),
        "{}",
        cause.summary
    );

    let even = incident_with_cause(&[0, 1, 2, 3]);
    let cause = even.cause.unwrap();
    assert_eq!(cause.kind, "no-clear-cause", "{}", cause.summary);
}

/// The incident opens at the read stage, then the packets turn out to wait before IP, on
/// one CPU: capture arms the new hot probes, and the verdicts judge the new stage from
/// figures taken when it changed (the first, judged for the read, named no CPU).
#[test]
fn when_the_stage_moves_capture_widens_and_the_verdict_follows_it() {
    const CPUS: usize = 4;
    // Every probe's latency on each CPU: (ip-start, tcp-start, tcp-socket-read).
    fn interval(h: &mut Harness, kernel: &FakeKernel, per_cpu: impl Fn(usize) -> [u64; 3]) {
        for cpu in 0..CPUS {
            let [ip, tcp, read] = per_cpu(cpu);
            let n = PER_INTERVAL / CPUS as u64;
            kernel.traffic_on_cpu(Probe::IpStart, cpu, CPUS, ip, n);
            kernel.traffic_on_cpu(Probe::TcpStart, cpu, CPUS, tcp, n);
            kernel.traffic_on_cpu(HOT, cpu, CPUS, read, n);
        }
        h.run_interval();
        h.core.sync_storage();
    }
    let quiet = |_| [5_000, 10_000, QUIET_NS];
    let slow_read = |_| [5_000, 10_000, SLOW_NS];
    let slow_cpu2 = |cpu| {
        if cpu == 2 {
            [SLOW_NS, SLOW_NS + 5_000, SLOW_NS + QUIET_NS]
        } else {
            [5_000, 10_000, QUIET_NS]
        }
    };
    let kernel = FakeKernel::default();
    let mut h = Harness::new(kernel.clone());
    for _ in 0..8 {
        interval(&mut h, &kernel, quiet);
    }
    assert!(h.open_ids().is_empty());
    let mut id = None;
    for _ in 0..5 {
        interval(&mut h, &kernel, slow_read);
        if let [open] = h.open_ids()[..] {
            id = Some(open);
            break;
        }
    }
    let id = id.expect("no incident opened");
    let stage_of = |h: &Harness| {
        let rec = h.incident(id);
        let stages: serde_json::Value = serde_json::from_str(&rec.stages_json).unwrap();
        stages["verdict"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(stage_of(&h), "tcp-start to tcp-socket-read");
    assert_eq!(
        kernel.state().armed[&SLOT]
            .iter()
            .map(|(p, _)| *p)
            .collect::<Vec<_>>(),
        [HOT]
    );
    for _ in 0..3 {
        interval(&mut h, &kernel, slow_read);
    }
    let judged = |h: &Harness| {
        let cause = h.incident(id).cause.expect("a verdict");
        let figures: serde_json::Value = serde_json::from_str(&cause.figures_json).unwrap();
        (
            cause.kind,
            cause.summary,
            figures["stage"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let (_, _, stage) = judged(&h);
    assert_eq!(stage, "tcp-start to tcp-socket-read");

    // Now the wait is before IP, on cpu 2.
    interval(&mut h, &kernel, slow_cpu2);
    assert_eq!(h.open_ids(), [id], "the same incident, updated");
    assert_eq!(stage_of(&h), "driver and softirq (arrival to IP)");
    let mut armed: Vec<Probe> = kernel.state().armed[&SLOT]
        .iter()
        .map(|(p, _)| *p)
        .collect();
    armed.sort();
    assert_eq!(armed, [Probe::IpStart, Probe::TcpStart, HOT]);
    let capture = h.incident(id).capture;
    assert_eq!(capture.state, CaptureState::Armed);
    assert!(
        capture.message.contains("ip-start ≥ "),
        "{}",
        capture.message
    );
    for _ in 0..3 {
        interval(&mut h, &kernel, slow_cpu2);
    }
    let (kind, summary, stage) = judged(&h);
    assert_eq!(stage, "driver and softirq (arrival to IP)");
    assert_eq!(kind, "one-cpu", "{summary}");
    assert!(summary.starts_with("one CPU: cpu 2: "), "{summary}");
}

/// Issue 32, item 5, on the scripted kernel: two services whose read tails shift in the same
/// interval open their own incidents and one host-wide incident listing both; status marks
/// them part of it; it closes with the last of them.
#[test]
fn two_services_shifting_together_open_one_host_wide_incident() {
    let kernel = FakeKernel::default();
    let mut config = config();
    config.probes.services.push(ServiceSpec {
        name: "py".into(),
        cgroup: None,
        ports: vec![9090],
    });
    let mut h = Harness::with_config(kernel.clone(), config);
    let both = |h: &mut Harness, ns: u64| {
        for service in [SERVICE, "py"] {
            kernel.state().traffic_service = Some(service);
            kernel.traffic(Probe::TcpStart, 10_000, PER_INTERVAL);
            kernel.traffic(HOT, ns, PER_INTERVAL);
        }
        h.run_interval();
        h.core.sync_storage();
    };
    for _ in 0..8 {
        both(&mut h, QUIET_NS);
    }
    let mut open = Vec::new();
    for _ in 0..5 {
        both(&mut h, SLOW_NS);
        let status = h.core.status();
        open = lock(&status).open_incidents.clone();
        if open.iter().any(|o| o.service == "host-wide") {
            break;
        }
    }
    let hw = open
        .iter()
        .find(|o| o.service == "host-wide")
        .unwrap_or_else(|| panic!("no host-wide incident: {open:?}"))
        .clone();
    assert_eq!(
        hw.headline, "2 services in tcp-start to tcp-socket-read: py, web",
        "{hw:?}"
    );
    let members: Vec<_> = open.iter().filter(|o| o.service != "host-wide").collect();
    assert_eq!(members.len(), 2, "{open:?}");
    assert!(members.iter().all(|o| o.part_of == Some(hw.id)), "{open:?}");
    let stored = h.incident(hw.id);
    assert_eq!(stored.state, IncidentState::Open);
    assert!(
        stored.evidence_json.contains("\"py\""),
        "{}",
        stored.evidence_json
    );
    // Both recover: every incident closes, the host-wide one last with its members.
    for _ in 0..30 {
        both(&mut h, QUIET_NS);
        if h.open_ids().is_empty() {
            break;
        }
    }
    assert!(h.open_ids().is_empty());
    assert_eq!(h.incident(hw.id).state, IncidentState::Closed);
}
