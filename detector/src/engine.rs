//! The detector: baselines and windows per (service, probe), the tests of each interval, and
//! the incident state machine per service.
//!
//! The pieces of an interval's evaluation ([`Shift`], [`judge`], [`Machine`], [`stage`]) are
//! shared with [`crate::sweep::Sweep`], which replays one history under many settings at once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use crate::baseline::{Baseline, BaselineError, Cumulative};
use crate::config::{DetectorConfig, Slo, Thresholds};
use crate::dispersion::Dispersion;
use crate::event::{
    attribute, CloseReason, Estimate, Event, Evidence, EvidenceKind, Incident, Notice,
    StageAttribution,
};
use crate::stats::{binomial_upper_tail, holm, upper_tail_exceeds};
use crate::window::{Reach, Snapshot, Window};
use model::hist::{bucket_index, bucket_lower, bucket_upper, Histogram, QuantileEstimate};
use model::Probe;

/// An Updated event is sent when the headline ratio grows by this factor since the last event.
const UPDATE_RATIO_STEP: f64 = 1.5;

/// A shift this many times stronger (headline ratio) than the incident that started the
/// cooldown opens an incident during it: a real fault right after a small one must not wait
/// out the cooldown behind it (issue 32: a 1.5x blip's cooldown held back a 202x CPU-quota
/// incident for 37 s). It still needs `open_after` hot windows, like any opening.
pub(crate) const COOLDOWN_BREAKTHROUGH: f64 = 4.0;

/// Hysteresis: an open incident counts a window as still shifted (not cool) when a quantile
/// has a p-value of at most `HOLD_P_VALUE` (no multiple-test correction: the question is
/// whether this known shift persists) and at least `HOLD_FRACTION` of `min_ratio - 1` and of
/// `min_delta`. Without it a shift hovering at the bar (a slow ramp's start, a quiet
/// service's p99) would close and reopen the incident.
const HOLD_FRACTION: f64 = 0.5;
/// See [`HOLD_FRACTION`].
pub(crate) const HOLD_P_VALUE: f64 = 0.01;

/// Learns per-(service, probe) baselines and turns interval histograms into incidents.
///
/// Per interval: call [`Detector::observe`] for every (service, probe) histogram of the
/// interval, then [`Detector::end_interval`] once.
#[derive(Debug)]
pub struct Detector {
    config: DetectorConfig,
    services: BTreeMap<String, ServiceState>,
    last_end: Option<SystemTime>,
}

#[derive(Debug)]
struct ServiceState {
    thresholds: Thresholds,
    keys: BTreeMap<Probe, KeyState>,
    machine: Machine,
}

#[derive(Debug)]
struct KeyState {
    baseline: Baseline,
    /// How clustered the key's exceedances are; learns and holds with the baseline.
    dispersion: Dispersion,
    /// Recent intervals; `observe` adds to it directly.
    window: Window,
    /// Whether the window held enough samples at the last evaluation.
    evaluated: bool,
    /// Observed since the last `end_interval`: its newest interval is still to be learnt.
    fresh: bool,
}

/// The incident state machine of one service: what it decides from each interval's hot
/// evidence, given its thresholds (which the caller keeps).
#[derive(Debug, Clone, Default)]
pub(crate) struct Machine {
    /// Recent window evaluations, newest last: (window start, how hot).
    recent: Vec<(SystemTime, Heat)>,
    cool_streak: u32,
    incident: Option<Incident>,
    /// The small shift being noticed (never while an incident is open).
    notice: Option<Notice>,
    /// Headline ratio of the last event, to rate-limit updates.
    reported_ratio: f64,
    cooldown_until: Option<SystemTime>,
    /// Headline ratio of the incident whose close started the cooldown, at its strongest.
    cooldown_ratio: f64,
}

/// How hot one window evaluation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Heat {
    Cool,
    /// Hot, but every shift is below `incident_ratio` or `incident_delta`.
    Notice,
    /// Hot at incident size (or over a static ceiling).
    Incident,
}

impl Heat {
    fn of(t: &Thresholds, hot: &[Evidence]) -> Heat {
        if hot.is_empty() {
            Heat::Cool
        } else if t.notice_for.is_zero()
            || hot
                .iter()
                .any(|e| e.kind == EvidenceKind::Slo || (reaches_ratio(t, e) && adds_delta(t, e)))
        {
            Heat::Incident
        } else {
            Heat::Notice
        }
    }
}

/// Whether a notice's shift may become an incident by lasting `notice_for`: it reaches
/// `incident_ratio` or adds `incident_delta`, at a quantile that has reached
/// `notice_floor`. A shift below both ratio and delta (on a real host: nginx's p50
/// 80 µs -> 101 µs, x1.3 adding 21 µs, for a minute at a time), or one that stays below
/// the floor (ip-start's p99.9 8 µs -> 33 µs, x4 for four minutes), stays a notice however
/// long it lasts.
fn lasting_matters(t: &Thresholds, e: &Evidence) -> bool {
    (reaches_ratio(t, e) || adds_delta(t, e))
        && e.observed.value_ns >= t.notice_floor.as_nanos() as f64
}

/// The shift reaches `incident_ratio`.
fn reaches_ratio(t: &Thresholds, e: &Evidence) -> bool {
    e.ratio >= t.incident_ratio
}

/// The shift adds at least `incident_delta` to its quantile.
fn adds_delta(t: &Thresholds, e: &Evidence) -> bool {
    e.observed.value_ns - e.baseline.value_ns >= t.incident_delta.as_nanos() as f64
}

/// One test of one (service, probe, quantile) in the current interval.
struct Test {
    service: usize,
    evidence: Evidence,
}

impl Detector {
    /// A detector with no history.
    pub fn new(config: DetectorConfig) -> Self {
        Detector {
            config,
            services: BTreeMap::new(),
            last_end: None,
        }
    }

    /// Record the histogram of one (service, probe) for the current interval (the interval
    /// ending at `ts`, normally the `ts` then given to [`Detector::end_interval`]). Several
    /// calls for the same key and `ts` add up.
    pub fn observe(&mut self, ts: SystemTime, service: &str, probe: Probe, interval: &Histogram) {
        let start = interval_start(self.last_end, ts);
        let key = self.key_mut(service, probe, ts);
        key.window.push(start, ts, interval);
        key.fresh = true;
    }

    /// Close the interval ending at `ts`: test every window, advance every service's state
    /// machine and learn. Returns the incident changes, in service order.
    pub fn end_interval(&mut self, ts: SystemTime) -> Vec<Event> {
        self.last_end = Some(ts);

        // 1. Windows and tests.
        let mut tests: Vec<Test> = Vec::new();
        let mut slo_hits: Vec<Test> = Vec::new();
        for (si, (name, svc)) in self.services.iter_mut().enumerate() {
            let t = &svc.thresholds;
            let bars = Bars::of(t);
            for (&probe, key) in svc.keys.iter_mut() {
                let evaluated = key.window.evaluate(ts, reach(t));
                key.evaluated = evaluated.is_some();
                if let Some(snap) = evaluated {
                    let window_cum = Cumulative::from_counts(&snap.buckets);
                    let weight = key.baseline.weight();
                    for slo in self.config.slo.iter().filter(|s| applies(s, name, probe)) {
                        if let Some(e) = slo_evidence(slo, snap, &window_cum, weight) {
                            slo_hits.push(Test {
                                service: si,
                                evidence: e,
                            });
                        }
                    }
                    if key.baseline.is_warm(ts, t.warmup_samples, t.warmup_time) {
                        let base_cum = key.baseline.cumulative();
                        for &q in &t.quantiles {
                            if let Some(s) = Shift::new(q, snap, &window_cum, &base_cum) {
                                let s = s.clustered(key.dispersion.rho(q), snap);
                                let p = if s.worth_testing(bars) {
                                    s.p_value(self.config.significance)
                                } else {
                                    1.0
                                };
                                tests.push(Test {
                                    service: si,
                                    evidence: s.evidence(probe, p, weight),
                                });
                            }
                        }
                        // What this interval adds to the key's clustering, learnt if the
                        // baseline learns it.
                        if key.fresh {
                            if let Some(newest) = key.window.newest() {
                                key.dispersion.note(&base_cum, newest, &t.quantiles);
                            }
                        }
                    }
                }
            }
        }

        // 2. Significance over the whole interval, then the size of the shift.
        let p_values: Vec<f64> = tests
            .iter()
            .map(|t| t.evidence.p_value.unwrap_or(1.0))
            .collect();
        let significant = holm(&p_values, self.config.significance);
        let bars: Vec<Bars> = self
            .services
            .values()
            .map(|s| Bars::of(&s.thresholds))
            .collect();
        let mut hot: Vec<Vec<Evidence>> = vec![Vec::new(); self.services.len()];
        let mut holding = vec![false; self.services.len()];
        for (test, sig) in tests.into_iter().zip(significant) {
            let t = bars[test.service];
            let e = &test.evidence;
            let delta = e.observed.value_ns - e.baseline.value_ns;
            match judge(t, e.ratio, delta, e.p_value, sig) {
                Verdict::Hot => hot[test.service].push(test.evidence),
                Verdict::Holding => holding[test.service] = true,
                Verdict::Cool => {}
            }
        }
        for test in slo_hits {
            hot[test.service].push(test.evidence);
        }

        // 3. State machines and learning.
        let mut events = Vec::new();
        let per_service = hot.into_iter().zip(holding);
        for ((name, svc), (hot, holding)) in self.services.iter_mut().zip(per_service) {
            let ServiceState {
                thresholds: t,
                keys,
                machine,
            } = svc;
            let r = reach(t);
            let view = |p: Probe| keys.get(&p).map(|k| (&k.window, k.evaluated, &k.baseline));
            let event = machine.step(name, t, ts, hot, holding, &|h| stage(ts, h, r, &view));
            if let Some(ev) = event {
                if renews_baselines(&ev) {
                    for key in keys.values_mut() {
                        key.baseline = Baseline::new(ts);
                        key.dispersion = Dispersion::default();
                    }
                }
                events.push(ev);
            }
            let frozen = machine.frozen();
            for key in keys.values_mut() {
                match key.window.newest() {
                    Some(buckets) if key.fresh && !frozen => {
                        key.baseline.learn(ts, buckets, t.half_life);
                        key.dispersion.learn(ts, t.half_life);
                    }
                    _ => {
                        key.baseline.hold(ts);
                        key.dispersion.hold(ts);
                    }
                }
                key.fresh = false;
            }
        }
        events
    }

    /// Replace the settings (SIGHUP), keeping baselines, windows and open incidents.
    pub fn reconfigure(&mut self, config: DetectorConfig) {
        for (name, svc) in self.services.iter_mut() {
            svc.thresholds = config.thresholds(name);
        }
        self.config = config;
    }

    /// The warm baseline's estimate of quantile `q` (e.g. a capture threshold); `None` while
    /// the key is unknown or still warming up.
    pub fn baseline_quantile(
        &self,
        service: &str,
        probe: Probe,
        q: f64,
    ) -> Option<QuantileEstimate> {
        let svc = self.services.get(service)?;
        let key = svc.keys.get(&probe)?;
        let now = self.last_end?;
        let t = &svc.thresholds;
        if !key.baseline.is_warm(now, t.warmup_samples, t.warmup_time) {
            return None;
        }
        key.baseline.quantile(q)
    }

    /// Every baseline as opaque bytes (a version byte, then postcard), to store and hand back
    /// to [`Detector::restore_baseline`] after a restart.
    pub fn save_baselines(&self) -> Vec<(String, Probe, Vec<u8>)> {
        let mut out = Vec::new();
        for (name, svc) in &self.services {
            for (&probe, key) in &svc.keys {
                out.push((name.clone(), probe, key.baseline.to_bytes()));
            }
        }
        out
    }

    /// Resume a saved baseline (replacing any learned since start-up). Warm-up counts from
    /// when the baseline was first created, so a warm baseline stays warm.
    pub fn restore_baseline(
        &mut self,
        service: &str,
        probe: Probe,
        bytes: &[u8],
    ) -> Result<(), BaselineError> {
        let baseline = Baseline::from_bytes(bytes)?;
        let now = self.last_end.unwrap_or(SystemTime::UNIX_EPOCH);
        self.key_mut(service, probe, now).baseline = baseline;
        Ok(())
    }

    /// Forget a service that is gone (its windows and baselines; stored history is not the
    /// detector's). A service with an open incident is kept until the incident closes, so
    /// the incident is not lost; returns whether it was forgotten.
    pub fn forget(&mut self, service: &str) -> bool {
        match self.services.get(service) {
            Some(svc) if svc.machine.incident.is_some() => false,
            Some(_) => {
                self.services.remove(service);
                true
            }
            None => true,
        }
    }

    /// The incidents open now.
    pub fn open_incidents(&self) -> Vec<Incident> {
        self.services
            .values()
            .filter_map(|s| s.machine.incident.clone())
            .collect()
    }

    /// Approximate heap bytes held per (service, probe) key, averaged (benchmark figure).
    pub fn bytes_per_key(&self) -> usize {
        let mut keys = 0usize;
        let mut bytes = 0usize;
        for svc in self.services.values() {
            for key in svc.keys.values() {
                keys += 1;
                bytes += std::mem::size_of::<KeyState>()
                    + std::mem::size_of::<[f64; model::hist::NUM_BUCKETS]>()
                    + key.window.heap_bytes();
            }
        }
        bytes.checked_div(keys).unwrap_or(0)
    }

    fn key_mut(&mut self, service: &str, probe: Probe, now: SystemTime) -> &mut KeyState {
        // Looked up before `entry`, which would allocate the name on every call.
        if !self.services.contains_key(service) {
            let state = ServiceState {
                thresholds: self.config.thresholds(service),
                keys: BTreeMap::new(),
                machine: Machine::default(),
            };
            self.services.insert(service.to_owned(), state);
        }
        let Some(svc) = self.services.get_mut(service) else {
            unreachable!("inserted above")
        };
        svc.keys.entry(probe).or_insert_with(|| KeyState {
            baseline: Baseline::new(now),
            dispersion: Dispersion::default(),
            window: Window::default(),
            evaluated: false,
            fresh: false,
        })
    }
}

/// Whether `event` closes an incident as the new normal: the service's baselines then
/// start afresh (warm-up included).
pub(crate) fn renews_baselines(event: &Event) -> bool {
    matches!(event, Event::Closed(inc) if inc.close_reason == Some(CloseReason::NewNormal))
}

impl Machine {
    /// Whether the baselines must not learn this interval: an incident is open, or the
    /// newest window was hot (a shift must not teach the baseline before it opens).
    pub(crate) fn frozen(&self) -> bool {
        self.incident.is_some() || self.recent.last().is_some_and(|&(_, h)| h != Heat::Cool)
    }

    /// Advance the state machine by one window evaluation. `stage` attributes a headline
    /// to a stage (only called when an incident opens or is updated). A Closed event with
    /// [`CloseReason::NewNormal`] asks the caller to renew the baselines.
    pub(crate) fn step(
        &mut self,
        name: &str,
        t: &Thresholds,
        ts: SystemTime,
        mut hot: Vec<Evidence>,
        holding: bool,
        stage: &dyn Fn(&Evidence) -> Option<StageAttribution>,
    ) -> Option<Event> {
        let window_start = hot.iter().map(|e| e.window_start).min().unwrap_or(ts);
        self.recent.push((window_start, Heat::of(t, &hot)));
        let keep = t.open_window as usize;
        if self.recent.len() > keep {
            let excess = self.recent.len() - keep;
            self.recent.drain(..excess);
        }
        // The strongest evidence per probe.
        hot.sort_by(|a, b| a.probe.cmp(&b.probe).then(b.ratio.total_cmp(&a.ratio)));
        hot.dedup_by_key(|e| e.probe);

        if let Some(mut inc) = self.incident.take() {
            if ts.duration_since(inc.opened_at).unwrap_or_default() >= t.max_incident {
                return Some(self.close(inc, ts, CloseReason::NewNormal, t.cooldown));
            }
            if hot.is_empty() && holding {
                // Still shifted, just below the opening bar: neither cool nor news.
                self.cool_streak = 0;
                self.incident = Some(inc);
                return None;
            }
            if hot.is_empty() {
                self.cool_streak += 1;
                if self.cool_streak >= t.close_after {
                    return Some(self.close(inc, ts, CloseReason::Recovered, t.cooldown));
                }
                self.incident = Some(inc);
                return None;
            }
            let Some(headline) = strongest(t, &hot) else {
                self.incident = Some(inc);
                return None;
            };
            self.cool_streak = 0;
            let grew = hot.iter().any(|e| !inc.probes.contains(&e.probe));
            // A window where only a smaller kind of shift is hot (an ip-start p99.9 of
            // tens of µs) never takes the headline from the shift that made the incident.
            let (new_tier, old_tier) = (tier(t, &headline), tier(t, &inc.headline));
            let stronger = new_tier > old_tier
                || (new_tier == old_tier
                    && headline.ratio >= self.reported_ratio * UPDATE_RATIO_STEP);
            let mut probes: BTreeSet<Probe> = inc.probes.iter().copied().collect();
            probes.extend(hot.iter().map(|e| e.probe));
            inc.probes = probes.into_iter().collect();
            inc.updated_at = ts;
            if grew || stronger {
                if new_tier >= old_tier {
                    inc.stage = stage(&headline);
                    inc.headline = headline;
                }
                inc.evidence = hot;
                self.reported_ratio = inc.headline.ratio;
                self.incident = Some(inc.clone());
                return Some(Event::Updated(inc));
            }
            self.incident = Some(inc);
            return None;
        }

        let Some(headline) = strongest(t, &hot) else {
            // A notice ends like an incident would close; it sends nothing.
            if self.notice.is_some() && !holding {
                self.cool_streak += 1;
                if self.cool_streak >= t.close_after {
                    self.notice = None;
                    self.cool_streak = 0;
                }
            } else {
                self.cool_streak = 0;
            }
            return None;
        };
        self.cool_streak = 0;
        if self.cooldown_until.is_some_and(|c| ts < c)
            && headline.ratio < self.cooldown_ratio * COOLDOWN_BREAKTHROUGH
        {
            return None;
        }
        let windows = |at_least: Heat| {
            self.recent
                .iter()
                .filter(move |&&(_, h)| h == at_least || h == Heat::Incident)
        };
        // Opening time and headline follow the incident-sized shift, not the wobble that
        // may have come before it; a small shift that persists opens from its own start.
        let first_hot_at = if windows(Heat::Incident).count() >= t.open_after as usize {
            windows(Heat::Incident)
                .next()
                .map_or(window_start, |&(s, _)| s)
        } else if let Some(n) = self.notice.as_ref().filter(|n| {
            ts.duration_since(n.first_hot_at).unwrap_or_default() >= t.notice_for
                && hot.iter().any(|e| lasting_matters(t, e))
        }) {
            n.first_hot_at
        } else {
            if self.notice.is_some() || windows(Heat::Notice).count() < t.open_after as usize {
                return None;
            }
            let first_hot_at = windows(Heat::Notice)
                .next()
                .map_or(window_start, |&(s, _)| s);
            let notice = Notice {
                service: name.to_string(),
                first_hot_at,
                noticed_at: ts,
                stage: stage(&headline),
                headline,
            };
            self.notice = Some(notice.clone());
            return Some(Event::Noticed(notice));
        };
        self.notice = None;
        let inc = Incident {
            service: name.to_string(),
            probes: hot.iter().map(|e| e.probe).collect(),
            first_hot_at,
            opened_at: ts,
            updated_at: ts,
            closed_at: None,
            close_reason: None,
            stage: stage(&headline),
            headline,
            evidence: hot,
        };
        self.reported_ratio = inc.headline.ratio;
        self.incident = Some(inc.clone());
        Some(Event::Opened(inc))
    }

    fn close(
        &mut self,
        mut inc: Incident,
        ts: SystemTime,
        reason: CloseReason,
        cooldown: Duration,
    ) -> Event {
        inc.closed_at = Some(ts);
        inc.close_reason = Some(reason);
        self.cooldown_until = Some(ts + cooldown);
        self.cooldown_ratio = self.reported_ratio.max(inc.headline.ratio);
        self.recent.clear();
        self.cool_streak = 0;
        Event::Closed(inc)
    }
}

/// A (probe) key as stage attribution reads it: its window, whether the window was
/// evaluated this interval, and its baseline.
pub(crate) type KeyView<'a> = Option<(&'a Window, bool, &'a Baseline)>;

/// Stage attribution at the headline's quantile along the headline probe's path, up to
/// the deepest probe of that path the service has data for. `key` looks up a probe's key.
pub(crate) fn stage<'a>(
    ts: SystemTime,
    headline: &Evidence,
    reach: Reach,
    key: &dyn Fn(Probe) -> KeyView<'a>,
) -> Option<StageAttribution> {
    let q = headline.quantile;
    // A send probe and nic-to-stack time their own interval (none includes another's):
    // the stage is the probe itself.
    let deepest = Probe::ALL
        .iter()
        .rev()
        .copied()
        .filter(|p| !headline.probe.is_own_interval() && !p.is_own_interval())
        .find(|&p| on_path(p, headline.probe) && key(p).is_some_and(|(_, evaluated, _)| evaluated))
        .unwrap_or(headline.probe);
    let mut chain = vec![deepest];
    while let Some(prev) = chain.last().and_then(|p| p.previous()) {
        chain.push(prev);
    }
    chain.reverse();
    let mut path = Vec::new();
    let mut snap = Snapshot::empty();
    for p in chain {
        let Some((window, _, baseline)) = key(p) else {
            continue;
        };
        if !window.sum(ts, reach, &mut snap) {
            continue;
        }
        let window = Cumulative::from_counts(&snap.buckets);
        let base = baseline.cumulative();
        if let (Some((_, b)), Some((_, o))) = (base.quantile(q), window.quantile(q)) {
            path.push((p, b, o));
        }
    }
    attribute(q, &path)
}

/// Same path, or `p` is the shared ip-start before it.
fn on_path(p: Probe, of: Probe) -> bool {
    use model::Path;
    p.path() == of.path() || p.path() == Path::Ip
}

/// Where the interval ending at `ts` starts: where the last one ended, or at `ts` itself
/// for the first (or after a clock step back), so a window's span never runs backwards.
pub(crate) fn interval_start(last_end: Option<SystemTime>, ts: SystemTime) -> SystemTime {
    last_end.filter(|&s| s < ts).unwrap_or(ts)
}

pub(crate) fn reach(t: &Thresholds) -> Reach {
    Reach {
        window: t.window,
        max_window: t.max_window,
        min_samples: t.min_samples,
    }
}

/// How much a shift matters, for choosing headlines: 2 incident size (or over a ceiling),
/// 1 may open by lasting, 0 neither.
fn tier(t: &Thresholds, e: &Evidence) -> u8 {
    if e.kind == EvidenceKind::Slo || (reaches_ratio(t, e) && adds_delta(t, e)) {
        2
    } else if lasting_matters(t, e) {
        1
    } else {
        0
    }
}

/// The headline among the hot evidence: the strongest ratio among the shifts of incident
/// size (or over a ceiling), else among those that may open by lasting, else of all. A
/// read delay of x2.6 adding 370 µs heads its incident, not the x4 of an ip-start p99.9
/// moving by 25 µs in the same window (a real-traffic incident read "driver and softirq",
/// no clear cause, that way).
fn strongest(t: &Thresholds, hot: &[Evidence]) -> Option<Evidence> {
    let tier = |e: &Evidence| tier(t, e);
    hot.iter()
        .max_by(|a, b| {
            tier(a)
                .cmp(&tier(b))
                .then_with(|| a.ratio.total_cmp(&b.ratio))
        })
        .cloned()
}

pub(crate) fn applies(slo: &Slo, service: &str, probe: Probe) -> bool {
    slo.probe == probe && slo.service.as_deref().is_none_or(|s| s == service)
}

fn estimate(bucket: usize, value_ns: f64) -> Estimate {
    Estimate {
        value_ns,
        lower_ns: bucket_lower(bucket),
        upper_ns: bucket_upper(bucket),
    }
}

/// The size bars of thresholds as the tests compare them, converted once per service or
/// candidate (a Duration's nanoseconds to f64 is a 128-bit conversion, costly per test).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bars {
    min_ratio: f64,
    min_delta_ns: f64,
}

impl Bars {
    pub(crate) fn of(t: &Thresholds) -> Bars {
        Bars {
            min_ratio: t.min_ratio,
            min_delta_ns: t.min_delta.as_nanos() as f64,
        }
    }
}

/// What one test decides for a service with thresholds `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Significant and large enough: the window is hot.
    Hot,
    /// Not hot, but shifted enough to keep an open incident open.
    Holding,
    /// Neither.
    Cool,
}

/// The verdict of a test with `ratio`, absolute growth `delta` (ns) and `p_value`, which
/// Holm's procedure over the interval found `significant` or not.
pub(crate) fn judge(
    t: Bars,
    ratio: f64,
    delta: f64,
    p_value: Option<f64>,
    significant: bool,
) -> Verdict {
    let min_delta = t.min_delta_ns;
    if significant && ratio >= t.min_ratio && delta >= min_delta {
        Verdict::Hot
    } else if p_value.is_some_and(|p| p <= HOLD_P_VALUE)
        && ratio >= 1.0 + (t.min_ratio - 1.0) * HOLD_FRACTION
        && delta >= min_delta * HOLD_FRACTION
    {
        Verdict::Holding
    } else {
        Verdict::Cool
    }
}

/// A quantile is tested only on a window where it stands for at least this many samples
/// beyond it (`count x (1 - q)`): p99.9 from 500 samples (`min_samples`' default), p99.99
/// from 5 000. A smaller window cannot show a shift of that quantile; testing it would only
/// add to the tests Holm's correction divides the significance among.
const MIN_EXPECTED_BEYOND: f64 = 0.5;

/// The figures of the exact binomial test of quantile `q`: how many window samples lie
/// above the baseline's q-bucket, against the share of baseline weight above it. They do
/// not depend on the thresholds; whether the exact test is worth running does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shift {
    q: f64,
    b_bucket: usize,
    b_value: f64,
    o_bucket: usize,
    o_value: f64,
    p0: f64,
    exceedances: u64,
    count: u64,
    start: SystemTime,
    /// How many packets weigh as one independent sample ([`crate::dispersion`]); 1 until
    /// the key has learnt its clustering.
    dispersion: f64,
    /// Observed over baseline value.
    pub ratio: f64,
}

impl Shift {
    /// The test of quantile `q` of the window `snap` (summed in `window`) against the
    /// baseline's running sums `base`; `None` when either is empty.
    pub(crate) fn new(
        q: f64,
        snap: &Snapshot,
        window: &Cumulative,
        base: &Cumulative,
    ) -> Option<Shift> {
        let mut no_hint = usize::MAX;
        Shift::with_window_quantile(q, snap, window, window.quantile(q), base, &mut no_hint)
    }

    /// [`Shift::new`] with the window's quantile `q` already looked up (`observed`, what
    /// `window.quantile(q)` gives): a sweep shares it among baseline groups. The baseline's
    /// is looked up from bucket `base_hint` ([`Cumulative::quantile_near`]).
    pub(crate) fn with_window_quantile(
        q: f64,
        snap: &Snapshot,
        window: &Cumulative,
        observed: Option<(usize, f64)>,
        base: &Cumulative,
        base_hint: &mut usize,
    ) -> Option<Shift> {
        if (snap.count as f64) * (1.0 - q) < MIN_EXPECTED_BEYOND {
            return None;
        }
        let (b_bucket, b_value) = base.quantile_near(q, base_hint)?;
        let (o_bucket, o_value) = observed?;
        // Add-half smoothing so an empty tail in the baseline does not make any exceedance
        // infinitely surprising.
        let p0 = (base.above(b_bucket) + 0.5) / (base.total() + 1.0);
        Some(Shift {
            q,
            b_bucket,
            b_value,
            o_bucket,
            o_value,
            p0,
            exceedances: window.above(b_bucket).round() as u64,
            count: snap.count,
            start: snap.start,
            dispersion: 1.0,
            ratio: o_value / b_value.max(1.0),
        })
    }

    /// This test with its evidence weighed for a key whose samples within one interval
    /// correlate by `rho` (slow packets in clusters), in a window of `snap`'s intervals.
    pub(crate) fn clustered(self, rho: f64, snap: &Snapshot) -> Shift {
        Shift {
            dispersion: crate::dispersion::factor(rho, snap.interval_size()),
            ..self
        }
    }

    /// Window samples and exceedances as independent samples: divided by the dispersion,
    /// the samples rounded up and the exceedances down, so rounding never adds evidence.
    fn independent(&self) -> (u64, u64) {
        if self.dispersion <= 1.0 {
            return (self.count, self.exceedances);
        }
        (
            (self.count as f64 / self.dispersion).ceil() as u64,
            (self.exceedances as f64 / self.dispersion).floor() as u64,
        )
    }

    /// Observed minus baseline value, ns.
    pub(crate) fn delta(&self) -> f64 {
        self.o_value - self.b_value
    }

    /// The exact test is the costly part; when the shift is too small to count even for an
    /// open incident under `t`, or there are no more exceedances than expected, p = 1
    /// stands in. That is an upper bound of the true p-value, so Holm's guarantee holds.
    pub(crate) fn worth_testing(&self, t: Bars) -> bool {
        let (count, exceedances) = self.independent();
        self.ratio >= 1.0 + (t.min_ratio - 1.0) * HOLD_FRACTION
            && self.delta() >= t.min_delta_ns * HOLD_FRACTION
            && exceedances as f64 > self.p0 * count as f64
    }

    /// The p-value the detector uses: the exact one-sided binomial tail, or 1 when a cheap
    /// bound shows the tail above `max(significance, HOLD_P_VALUE)`. Such a test is
    /// significant at no step of Holm's procedure and moves no other test's step (it sorts
    /// after every smaller p-value either way), and it holds no incident: 1 decides exactly
    /// the same, and a non-hot test's p-value is reported nowhere.
    pub(crate) fn p_value(&self, significance: f64) -> f64 {
        let level = significance.max(HOLD_P_VALUE);
        let (count, exceedances) = self.independent();
        if upper_tail_exceeds(count, self.p0, exceedances, level) {
            1.0
        } else {
            binomial_upper_tail(count, self.p0, exceedances)
        }
    }

    /// The evidence of this test for `probe`, with `p_value` and the baseline's weight.
    pub(crate) fn evidence(&self, probe: Probe, p_value: f64, baseline_weight: f64) -> Evidence {
        Evidence {
            probe,
            quantile: self.q,
            kind: EvidenceKind::Shift,
            baseline: estimate(self.b_bucket, self.b_value),
            observed: estimate(self.o_bucket, self.o_value),
            ratio: self.ratio,
            p_value: Some(p_value),
            window_samples: self.count,
            exceedances: self.exceedances,
            expected_exceedances: self.p0 * self.count as f64,
            baseline_samples: baseline_weight,
            window_start: self.start,
        }
    }
}

/// Evidence when the window's quantile is above the SLO's ceiling, else `None`.
pub(crate) fn slo_evidence(
    slo: &Slo,
    snap: &Snapshot,
    window: &Cumulative,
    baseline_weight: f64,
) -> Option<Evidence> {
    let (o_bucket, o_value) = window.quantile(slo.quantile)?;
    let max_ns = slo.max.as_nanos().min(u128::from(u64::MAX)) as u64;
    if o_value <= max_ns as f64 {
        return None;
    }
    let c_bucket = bucket_index(max_ns);
    Some(Evidence {
        probe: slo.probe,
        quantile: slo.quantile,
        kind: EvidenceKind::Slo,
        baseline: Estimate {
            value_ns: max_ns as f64,
            lower_ns: max_ns,
            upper_ns: max_ns,
        },
        observed: estimate(o_bucket, o_value),
        ratio: o_value / (max_ns as f64).max(1.0),
        p_value: None,
        window_samples: snap.count,
        exceedances: window.above(c_bucket).round() as u64,
        expected_exceedances: (1.0 - slo.quantile) * snap.count as f64,
        baseline_samples: baseline_weight,
        window_start: snap.start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    /// 1000 samples spread evenly over [base, 2 * base).
    fn uniform(base_ns: u64) -> Histogram {
        let mut h = Histogram::new();
        for i in 0..1000 {
            h.record(base_ns + i * base_ns / 1000);
        }
        h
    }

    fn config() -> DetectorConfig {
        DetectorConfig {
            defaults: Thresholds {
                window: Duration::from_secs(1),
                max_window: Duration::from_secs(10),
                min_samples: 100,
                warmup_samples: 5000,
                warmup_time: Duration::from_secs(10),
                open_after: 2,
                open_window: 3,
                close_after: 2,
                cooldown: Duration::from_secs(5),
                // These shifts are 100s of µs: judged by their ratio alone (the absolute
                // bar has its own test).
                incident_delta: Duration::ZERO,
                ..Thresholds::default()
            },
            ..DetectorConfig::default()
        }
    }

    /// Feed `hist` for `svc`/tcp-socket-read at second `s`; return the events.
    fn tick(d: &mut Detector, s: u64, svc: &str, hist: &Histogram) -> Vec<Event> {
        d.observe(t(s), svc, Probe::TcpSocketRead, hist);
        d.end_interval(t(s))
    }

    /// Issue 32, item 6: a shift confined to the slowest 0.05 % of a busy service's packets
    /// moves p99.99 and nothing below it. The default quantiles (p99.99 included) open an
    /// incident on it; without p99.99 nothing is seen. A quiet service's windows are too
    /// small for p99.99, which is then not tested at all.
    #[test]
    fn the_far_tail_is_watched_where_the_rate_allows() {
        // 20 000 packets per interval at 100-200 µs; "slow": the 10 slowest at 50 ms.
        let normal = {
            let mut h = Histogram::new();
            for i in 0..20_000u64 {
                h.record(100_000 + i * 100_000 / 20_000);
            }
            h
        };
        let slow = {
            let mut h = Histogram::new();
            for i in 0..19_990u64 {
                h.record(100_000 + i * 100_000 / 20_000);
            }
            h.record_n(50_000_000, 10);
            h
        };
        let run = |quantiles: Vec<f64>| {
            let mut cfg = config();
            cfg.defaults.quantiles = quantiles;
            cfg.defaults.warmup_samples = 100_000;
            let mut d = Detector::new(cfg);
            for s in 1..=30 {
                assert!(tick(&mut d, s, "web", &normal).is_empty(), "second {s}");
            }
            (31..=35)
                .flat_map(|s| tick(&mut d, s, "web", &slow))
                .collect::<Vec<_>>()
        };
        let seen = run(Thresholds::default().quantiles);
        let Some(Event::Opened(inc)) = seen.first() else {
            panic!("{seen:?}")
        };
        assert_eq!(inc.headline.quantile, 0.9999, "{:?}", inc.headline);
        assert!(run(vec![0.5, 0.9, 0.99, 0.999]).is_empty());

        // 1 000 packets a window: p99.99 is not tested (no evidence at it, ever).
        let mut d = Detector::new(config());
        for s in 1..=30 {
            tick(&mut d, s, "web", &uniform(100_000));
        }
        let mut big = uniform(100_000);
        big.record_n(900_000_000, 300);
        let ev: Vec<Event> = (31..=33)
            .flat_map(|s| tick(&mut d, s, "web", &big))
            .collect();
        let Some(Event::Opened(inc)) = ev.first() else {
            panic!("{ev:?}")
        };
        assert!(
            inc.evidence.iter().all(|e| e.quantile < 0.9999),
            "{:?}",
            inc.evidence
        );
    }

    #[test]
    fn warm_up_then_m_of_n_then_k_cool_then_cooldown() {
        let mut d = Detector::new(config());
        let (normal, slow) = (uniform(100_000), uniform(300_000));
        // Not warm yet: the slowest of shifts opens nothing.
        for s in 1..=4 {
            assert!(tick(&mut d, s, "web", &slow).is_empty());
        }
        for s in 5..=20 {
            assert!(tick(&mut d, s, "web", &normal).is_empty(), "second {s}");
        }
        // The first hot window is not enough (2 of 3 needed) ...
        assert!(tick(&mut d, 21, "web", &slow).is_empty());
        // ... the second opens the incident.
        let ev = tick(&mut d, 22, "web", &slow);
        let [Event::Opened(inc)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!(inc.service, "web");
        assert_eq!(inc.probes, vec![Probe::TcpSocketRead]);
        assert_eq!(inc.first_hot_at, t(20), "start of the first hot window");
        assert!(inc.headline.ratio > 2.5, "{:?}", inc.headline);
        assert!(inc.headline.p_value.is_some_and(|p| p < 1e-10));
        assert_eq!(d.open_incidents().len(), 1);
        // One cool window is not enough to close, two are.
        assert!(tick(&mut d, 23, "web", &normal).is_empty());
        let ev = tick(&mut d, 24, "web", &normal);
        let [Event::Closed(inc)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!(inc.closed_at, Some(t(24)));
        assert_eq!(inc.close_reason, Some(CloseReason::Recovered));
        assert!(d.open_incidents().is_empty());
        // Cooldown (5 s): a new shift right away opens nothing ...
        for s in 25..=28 {
            assert!(tick(&mut d, s, "web", &slow).is_empty(), "second {s}");
        }
        // ... after it, it does.
        let ev = tick(&mut d, 29, "web", &slow);
        assert!(matches!(ev.as_slice(), [Event::Opened(_)]), "{ev:?}");
    }

    #[test]
    fn a_much_stronger_shift_breaks_through_the_cooldown() {
        let mut d = Detector::new(config());
        let (normal, blip, fault) = (uniform(100_000), uniform(200_000), uniform(5_000_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        // A 2x blip opens and closes: 5 s of cooldown from second 24.
        let opened: Vec<Event> = (21..=22)
            .flat_map(|s| tick(&mut d, s, "web", &blip))
            .collect();
        let Some(Event::Opened(small)) = opened.first() else {
            panic!("{opened:?}")
        };
        let closed: Vec<Event> = (23..=24)
            .flat_map(|s| tick(&mut d, s, "web", &normal))
            .collect();
        assert!(
            matches!(closed.as_slice(), [Event::Closed(_)]),
            "{closed:?}"
        );
        // Another shift of the blip's size waits out the cooldown ...
        assert!(tick(&mut d, 25, "web", &blip).is_empty());
        assert!(tick(&mut d, 26, "web", &blip).is_empty());
        // ... a fault many times stronger opens within it (the blip's windows were hot too,
        // so open_after is met at once).
        let ev = tick(&mut d, 27, "web", &fault);
        let [Event::Opened(big)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert!(
            big.headline.ratio >= small.headline.ratio * COOLDOWN_BREAKTHROUGH,
            "{:?} vs {:?}",
            big.headline,
            small.headline
        );
    }

    /// Issue 32, item 7: a 1.5x wobble (below incident_ratio 2) is a notice, sent once and
    /// ended silently; if it lasts notice_for it becomes an incident from its own start.
    #[test]
    fn a_small_short_shift_is_a_notice_and_a_lasting_one_an_incident() {
        let mut cfg = config();
        cfg.defaults.notice_for = Duration::from_secs(10);
        let mut d = Detector::new(cfg);
        let (normal, wobble) = (uniform(100_000), uniform(150_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        let ev: Vec<Event> = (21..=25)
            .flat_map(|s| tick(&mut d, s, "web", &wobble))
            .collect();
        let [Event::Noticed(n)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!((n.noticed_at, n.first_hot_at), (t(22), t(20)));
        assert!(n.headline.ratio < 2.0, "{:?}", n.headline);
        assert!(d.open_incidents().is_empty());
        // It ends after close_after cool windows, with nothing sent ...
        let ev: Vec<Event> = (26..=30)
            .flat_map(|s| tick(&mut d, s, "web", &normal))
            .collect();
        assert!(ev.is_empty(), "{ev:?}");
        // ... no cooldown: the next wobble is noticed again, and lasting 10 s it opens.
        let ev: Vec<Event> = (31..=45)
            .flat_map(|s| tick(&mut d, s, "web", &wobble))
            .collect();
        let [Event::Noticed(n), Event::Opened(inc)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!(
            inc.first_hot_at, n.first_hot_at,
            "opens from the shift's start"
        );
        assert_eq!(
            inc.opened_at,
            t(40),
            "notice_for after {:?}",
            n.first_hot_at
        );
    }

    /// A shift below both incident_ratio and incident_delta (x1.5 adding 50 µs under a
    /// 200 µs incident_delta) stays a notice however long it lasts; the same shift adding
    /// 500 µs opens once it lasted notice_for.
    #[test]
    fn a_shift_small_in_ratio_and_in_time_never_becomes_an_incident_by_lasting() {
        let mut cfg = config();
        cfg.defaults.notice_for = Duration::from_secs(10);
        cfg.defaults.incident_delta = Duration::from_micros(200);
        let mut d = Detector::new(cfg);
        let (normal, wobble) = (uniform(100_000), uniform(150_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        let ev: Vec<Event> = (21..=80)
            .flat_map(|s| tick(&mut d, s, "web", &wobble))
            .collect();
        assert!(matches!(ev.as_slice(), [Event::Noticed(_)]), "{ev:?}");
        assert!(d.open_incidents().is_empty());

        let mut cfg = config();
        cfg.defaults.notice_for = Duration::from_secs(10);
        cfg.defaults.incident_delta = Duration::from_micros(200);
        let mut d = Detector::new(cfg);
        let (normal, wobble) = (uniform(1_000_000), uniform(1_500_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        let ev: Vec<Event> = (21..=40)
            .flat_map(|s| tick(&mut d, s, "web", &wobble))
            .collect();
        assert!(
            matches!(ev.as_slice(), [Event::Noticed(_), Event::Opened(_)]),
            "{ev:?}"
        );
    }

    /// A x4 shift that stays below `notice_floor` (a p50 of 15 µs -> 60 µs, as ip-start's
    /// p99.9 8 µs -> 33 µs on a real host) stays a notice however long it lasts; the same x4
    /// reaching 150 µs (and adding less than incident_delta) opens once it lasted notice_for.
    #[test]
    fn a_lasting_shift_below_the_notice_floor_stays_a_notice() {
        let run = |base: u64, floor_us: u64| {
            let mut cfg = config();
            cfg.defaults.notice_for = Duration::from_secs(10);
            cfg.defaults.incident_delta = Duration::from_micros(200);
            cfg.defaults.notice_floor = Duration::from_micros(floor_us);
            let mut d = Detector::new(cfg);
            for s in 1..=20 {
                tick(&mut d, s, "web", &uniform(base));
            }
            (21..=80)
                .flat_map(|s| tick(&mut d, s, "web", &uniform(4 * base)))
                .collect::<Vec<_>>()
        };
        let ev = run(10_000, 100);
        assert!(matches!(ev.as_slice(), [Event::Noticed(_)]), "{ev:?}");
        // The floor alone kept it a notice.
        let ev = run(10_000, 0);
        assert!(
            matches!(ev.as_slice(), [Event::Noticed(_), Event::Opened(_)]),
            "{ev:?}"
        );
        let ev = run(25_000, 100);
        assert!(
            matches!(ev.as_slice(), [Event::Noticed(_), Event::Opened(_)]),
            "{ev:?}"
        );
    }

    /// The headline is the shift that made the incident: tcp-socket-read x2.5 adding
    /// hundreds of µs, not ip-start's x4 of tens of µs in the same windows.
    #[test]
    fn the_headline_is_the_incident_sized_shift_not_the_largest_ratio() {
        let mut cfg = config();
        cfg.defaults.incident_delta = Duration::from_micros(200);
        let mut d = Detector::new(cfg);
        let both = |d: &mut Detector, s: u64, ip: u64, read: u64| {
            d.observe(t(s), "web", Probe::IpStart, &uniform(ip));
            d.observe(t(s), "web", Probe::TcpSocketRead, &uniform(read));
            d.end_interval(t(s))
        };
        for s in 1..=20 {
            both(&mut d, s, 8_000, 200_000);
        }
        let ev: Vec<Event> = (21..=23)
            .flat_map(|s| both(&mut d, s, 32_000, 500_000))
            .collect();
        let [Event::Opened(inc)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!(inc.probes, vec![Probe::IpStart, Probe::TcpSocketRead]);
        assert!(
            inc.evidence
                .iter()
                .any(|e| e.probe == Probe::IpStart && e.ratio > inc.headline.ratio),
            "{:?}",
            inc.evidence
        );
        assert_eq!(
            inc.headline.probe,
            Probe::TcpSocketRead,
            "{:?}",
            inc.headline
        );
        // Then ip-start's small shift alone stays hot, growing: it never takes the headline.
        for s in 24..=25 {
            for e in both(&mut d, s, 48_000, 200_000) {
                if let Event::Updated(u) | Event::Closed(u) = e {
                    assert_eq!(u.headline.probe, Probe::TcpSocketRead, "{:?}", u.headline);
                }
            }
        }
        let open = d.open_incidents();
        assert_eq!(open.len(), 1, "{open:?}");
        assert_eq!(open[0].headline.probe, Probe::TcpSocketRead);
    }

    /// Issue 32, item 7: a wobble, then a real fault: the incident opens as the fault
    /// fills open_after windows, and its opening and headline are the fault's.
    #[test]
    fn an_incident_after_a_notice_opens_at_the_larger_shift() {
        let mut d = Detector::new(config());
        let (normal, wobble, fault) = (uniform(100_000), uniform(150_000), uniform(1_000_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        let ev: Vec<Event> = (21..=25)
            .flat_map(|s| tick(&mut d, s, "web", &wobble))
            .collect();
        assert!(matches!(ev.as_slice(), [Event::Noticed(_)]), "{ev:?}");
        assert!(tick(&mut d, 26, "web", &fault).is_empty(), "one window");
        let ev = tick(&mut d, 27, "web", &fault);
        let [Event::Opened(inc)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!(
            inc.first_hot_at,
            t(25),
            "the fault's first window, not the wobble's"
        );
        assert!(inc.headline.ratio > 5.0, "{:?}", inc.headline);
    }

    /// A x3 shift that adds 200 µs is a notice under a 500 µs `incident_delta`; a x3 shift
    /// adding 2 ms is an incident.
    #[test]
    fn a_shift_adding_little_time_is_a_notice_whatever_its_ratio() {
        let run = |base: u64| {
            let mut cfg = config();
            cfg.defaults.incident_delta = Duration::from_micros(500);
            let mut d = Detector::new(cfg);
            for s in 1..=20 {
                tick(&mut d, s, "web", &uniform(base));
            }
            (21..=22)
                .flat_map(|s| tick(&mut d, s, "web", &uniform(3 * base)))
                .collect::<Vec<_>>()
        };
        let ev = run(100_000);
        assert!(matches!(ev.as_slice(), [Event::Noticed(_)]), "{ev:?}");
        let ev = run(1_000_000);
        assert!(matches!(ev.as_slice(), [Event::Opened(_)]), "{ev:?}");
    }

    /// `notice_for = 0` turns the notice tier off.
    #[test]
    fn without_the_notice_tier_a_small_shift_opens_at_once() {
        let mut cfg = config();
        cfg.defaults.notice_for = Duration::ZERO;
        let mut d = Detector::new(cfg);
        for s in 1..=20 {
            tick(&mut d, s, "web", &uniform(100_000));
        }
        let ev: Vec<Event> = (21..=22)
            .flat_map(|s| tick(&mut d, s, "web", &uniform(150_000)))
            .collect();
        assert!(matches!(ev.as_slice(), [Event::Opened(_)]), "{ev:?}");
    }

    #[test]
    fn forget_drops_a_gone_service_unless_an_incident_is_open() {
        let mut d = Detector::new(config());
        let (normal, slow) = (uniform(100_000), uniform(300_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
            tick(&mut d, s, "db", &normal);
        }
        assert!(d.forget("db"));
        assert!(d
            .baseline_quantile("db", Probe::TcpSocketRead, 0.5)
            .is_none());
        assert!(d.save_baselines().iter().all(|(s, _, _)| s == "web"));
        for s in 21..=22 {
            tick(&mut d, s, "web", &slow);
        }
        assert_eq!(d.open_incidents().len(), 1);
        assert!(!d.forget("web"), "kept while its incident is open");
        assert_eq!(d.open_incidents().len(), 1);
        assert!(d.forget("never-seen"));
    }

    #[test]
    fn baseline_is_frozen_while_an_incident_is_open() {
        let mut d = Detector::new(config());
        let (normal, slow) = (uniform(100_000), uniform(300_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        let before = d
            .baseline_quantile("web", Probe::TcpSocketRead, 0.99)
            .unwrap();
        for s in 21..=60 {
            tick(&mut d, s, "web", &slow);
        }
        assert_eq!(d.open_incidents().len(), 1);
        let during = d
            .baseline_quantile("web", Probe::TcpSocketRead, 0.99)
            .unwrap();
        assert_eq!(before, during);
    }

    #[test]
    fn a_shift_that_stays_becomes_the_new_normal() {
        let mut cfg = config();
        cfg.defaults.max_incident = Duration::from_secs(30);
        let mut d = Detector::new(cfg);
        let (normal, slow) = (uniform(100_000), uniform(300_000));
        for s in 1..=20 {
            tick(&mut d, s, "web", &normal);
        }
        let mut closed = None;
        for s in 21..=80 {
            for ev in tick(&mut d, s, "web", &slow) {
                if let Event::Closed(inc) = ev {
                    closed = Some((s, inc));
                }
            }
        }
        let (s, inc) = closed.expect("closed after max_incident");
        assert_eq!(s, 52, "opened at 22, closed 30 s later");
        assert_eq!(inc.close_reason, Some(CloseReason::NewNormal));
        // The baselines learnt the slow level afresh: no new incident, the median moved.
        assert!(d.open_incidents().is_empty());
        let median = d
            .baseline_quantile("web", Probe::TcpSocketRead, 0.5)
            .unwrap();
        assert!(median.value_ns > 400_000.0, "{median:?}");
    }

    #[test]
    fn learning_does_not_need_identical_timestamps() {
        // A daemon may stamp histograms a little before it closes the interval.
        let mut d = Detector::new(config());
        for s in 1..=20 {
            d.observe(
                t(s) - Duration::from_millis(3),
                "web",
                Probe::TcpSocketRead,
                &uniform(100_000),
            );
            d.end_interval(t(s));
        }
        assert!(d
            .baseline_quantile("web", Probe::TcpSocketRead, 0.5)
            .is_some());
    }

    #[test]
    fn a_quiet_service_stays_quiet_next_to_a_hot_one() {
        let mut d = Detector::new(config());
        let (normal, slow) = (uniform(100_000), uniform(300_000));
        for s in 1..=30 {
            let web = if s > 20 { &slow } else { &normal };
            d.observe(t(s), "web", Probe::TcpSocketRead, web);
            d.observe(t(s), "db", Probe::TcpSocketRead, &normal);
            for ev in d.end_interval(t(s)) {
                assert_eq!(ev.incident().map(|i| i.service.as_str()), Some("web"));
            }
        }
        assert_eq!(d.open_incidents().len(), 1);
    }

    #[test]
    fn an_slo_needs_no_baseline() {
        let mut cfg = config();
        cfg.slo.push(Slo {
            service: None,
            probe: Probe::TcpSocketRead,
            quantile: 0.99,
            max: Duration::from_micros(250),
        });
        let mut d = Detector::new(cfg);
        assert!(tick(&mut d, 1, "web", &uniform(300_000)).is_empty());
        let ev = tick(&mut d, 2, "web", &uniform(300_000));
        let [Event::Opened(inc)] = ev.as_slice() else {
            panic!("{ev:?}")
        };
        assert_eq!(inc.headline.kind, EvidenceKind::Slo);
        assert_eq!(inc.headline.baseline.value_ns, 250_000.0);
        assert!(inc.headline.p_value.is_none());
    }

    #[test]
    fn saved_baselines_resume_warm_and_reconfigure_keeps_them() {
        let mut d = Detector::new(config());
        for s in 1..=20 {
            tick(&mut d, s, "web", &uniform(100_000));
        }
        let saved = d.save_baselines();
        assert_eq!(saved.len(), 1);
        let before = d.baseline_quantile("web", Probe::TcpSocketRead, 0.5);

        let mut fresh = Detector::new(config());
        for (svc, probe, bytes) in &saved {
            fresh.restore_baseline(svc, *probe, bytes).unwrap();
        }
        // Warm at once: two slow intervals open an incident.
        assert!(tick(&mut fresh, 21, "web", &uniform(300_000)).is_empty());
        assert_eq!(tick(&mut fresh, 22, "web", &uniform(300_000)).len(), 1);
        assert_eq!(
            fresh.baseline_quantile("web", Probe::TcpSocketRead, 0.5),
            before
        );

        let mut cfg = config();
        cfg.defaults.min_ratio = 10.0;
        d.reconfigure(cfg);
        assert_eq!(
            d.baseline_quantile("web", Probe::TcpSocketRead, 0.5),
            before
        );
        // A x3 shift is below the new bar.
        for s in 21..=25 {
            assert!(tick(&mut d, s, "web", &uniform(300_000)).is_empty());
        }
        assert!(matches!(
            fresh.restore_baseline("web", Probe::TcpSocketRead, &[9, 9]),
            Err(BaselineError::Version(9))
        ));
    }

    #[test]
    fn events_serialise_as_tagged_json() {
        let mut d = Detector::new(config());
        for s in 1..=20 {
            tick(&mut d, s, "web", &uniform(100_000));
        }
        tick(&mut d, 21, "web", &uniform(300_000));
        let ev = tick(&mut d, 22, "web", &uniform(300_000));
        let json = serde_json::to_string(&ev[0]).unwrap();
        assert!(
            json.starts_with(r#"{"event":"opened","incident":{"service":"web""#),
            "{json}"
        );
        assert!(
            json.contains(r#""opened_at":"2023-11-14T22:13:42Z""#),
            "{json}"
        );
        // serde_json's float parsing is not bit-exact, so compare what is not a float.
        let back: Event = serde_json::from_str(&json).unwrap();
        let (Some(a), Some(b)) = (back.incident(), ev[0].incident()) else {
            panic!("{back:?}")
        };
        assert!(matches!(back, Event::Opened(_)));
        assert_eq!(
            (
                a.opened_at,
                a.first_hot_at,
                &a.probes,
                a.headline.exceedances
            ),
            (
                b.opened_at,
                b.first_hot_at,
                &b.probes,
                b.headline.exceedances
            )
        );
        assert!((a.headline.ratio - b.headline.ratio).abs() < 1e-12);
    }
}
