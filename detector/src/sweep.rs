//! One service's recorded series replayed under many candidate settings at once (what
//! `tailtrap tune` does), with the incidents each candidate's own replay would give.
//!
//! Replaying N candidates one by one repeats most of the work N times. An interval's
//! evaluation has three layers, and a candidate shares each with the other candidates
//! equal in that layer's keys:
//!
//! 1. windows: `window`, `max_window` and `min_samples` decide which intervals a window
//!    sums. Candidates equal in these share the windows, their sums and running sums.
//! 2. baselines: `half_life`, `warmup_samples`, `warmup_time` and the baselines' past
//!    decide the baseline running sums, the quantile look-ups and the figures of the
//!    binomial test of each quantile, whose exact p-value is computed at most once an
//!    interval, when the first candidate needs it.
//! 3. each candidate: `quantiles`, `min_ratio` and `min_delta` choose its tests, whether
//!    the exact test is run at all, Holm's correction and the verdicts; `open_after`,
//!    `open_window`, `close_after`, `cooldown` and `max_incident` drive its state machine.
//!
//! The baselines' past is not a setting: a service's baselines stop learning while its
//! incident is open or its newest window was hot, and start afresh when an incident reaches
//! `max_incident`. So candidates that decide differently stop sharing baselines: a group
//! splits at the first interval its members would learn differently (each part keeping an
//! identical copy of the baselines), and parts never merge back. Every candidate thus sees,
//! bit for bit, the baselines of its own replay, and gets the incidents of one
//! [`Detector`](crate::Detector) with its settings (tests/sweep.rs checks this). Most of
//! a history is quiet, so candidates usually share most of it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use model::Probe;

use crate::baseline::{Baseline, Cumulative, CumulativeBatch, DecayMemo};
use crate::config::{Slo, Thresholds};
use crate::dispersion::Dispersion;
use crate::engine::{
    applies, interval_start, judge, reach, renews_baselines, slo_evidence, stage, Bars, KeyView,
    Machine, Shift, Verdict, HOLD_P_VALUE,
};
use crate::event::{Event, Evidence, Incident};
use crate::replay::{interval_ended, mark_fed, RecordError};
use crate::stats::holm_into;
use crate::window::{Reach, Window};

/// Replays one service's series under several [`Thresholds`] at once.
///
/// Feed every (probe, interval) record in time order with [`Sweep::push`], then call
/// [`Sweep::finish`] for each candidate's incidents.
#[derive(Debug)]
pub struct Sweep {
    service: String,
    significance: f64,
    slo: Vec<Slo>,
    cands: Vec<Cand>,
    /// Every quantile some candidate tests, each once.
    quantiles: Vec<f64>,
    windows: Vec<WindowGroup>,
    bases: Vec<BaseGroup>,
    last_end: Option<SystemTime>,
    /// The interval being fed, and the probes fed for it (bit `probe.id()`).
    current: Option<SystemTime>,
    seen: u32,
    /// Buffers reused every interval.
    scratch: Scratch,
}

#[derive(Debug, Default)]
struct Scratch {
    /// A candidate's tests: probe, index of the shift in its baseline stats, p-value.
    tests: Vec<(Probe, usize, f64)>,
    p_values: Vec<f64>,
    order: Vec<usize>,
    significant: Vec<bool>,
    /// Per candidate: what its baselines do at the end of the interval.
    learning: Vec<Learning>,
}

#[derive(Debug)]
struct Cand {
    t: Thresholds,
    bars: Bars,
    machine: Machine,
    /// Index of its baseline group.
    base: usize,
    incidents: Vec<Incident>,
}

/// What a candidate's baselines do at the end of an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Learning {
    Learn,
    Hold,
    /// Start afresh (an incident became the new normal), then learn.
    Renew,
}

/// Windows shared by the candidates with one reach.
#[derive(Debug)]
struct WindowGroup {
    reach: Reach,
    keys: BTreeMap<Probe, WindowKey>,
}

#[derive(Debug)]
struct WindowKey {
    window: Window,
    /// The window held `min_samples` at this interval's evaluation.
    evaluated: bool,
    /// Observed since the last interval ended.
    fresh: bool,
    /// Running sums of the evaluated window.
    cum: Box<Cumulative>,
    /// The evaluated window's quantiles, in the order of [`Sweep::quantiles`].
    observed: Vec<Option<(usize, f64)>>,
    /// Their buckets, where the next look-ups start.
    hints: Vec<usize>,
}

/// Baselines shared by candidates with the same learning settings and, so far, the same
/// learning decisions.
#[derive(Debug, Clone)]
struct BaseGroup {
    window: usize,
    half_life: Duration,
    warmup_samples: u64,
    warmup_time: Duration,
    baselines: BTreeMap<Probe, Baseline>,
    /// Each baseline's clustering of exceedances, over every quantile some candidate tests
    /// (each quantile's is independent of the others, so a candidate sees its own replay's).
    dispersions: BTreeMap<Probe, Dispersion>,
    /// This interval's figures per probe, filled before the candidates judge.
    stats: BTreeMap<Probe, BaseStats>,
}

#[derive(Debug, Clone)]
struct BaseStats {
    /// Evaluated and warm: the shift tests apply.
    tested: bool,
    weight: f64,
    cum: Box<Cumulative>,
    /// `cum` holds the baseline's running sums as they are now: a baseline that only held
    /// since is not summed again.
    cum_current: bool,
    /// The tests asked for so far this interval, by quantile.
    shifts: Vec<ShiftSlot>,
    /// Per quantile of [`Sweep::quantiles`], the baseline's bucket at the last look-up:
    /// where the next one starts ([`Cumulative::quantile_near`]).
    hints: Vec<usize>,
}

#[derive(Debug, Clone)]
struct ShiftSlot {
    q: f64,
    shift: Option<Shift>,
    /// Its p-value, once a candidate ran the test.
    exact: Option<f64>,
}

impl Sweep {
    /// A sweep of `service` under each of `candidates` (the service's whole thresholds),
    /// with the detector's `significance` and static ceilings.
    pub fn new(service: &str, significance: f64, slo: &[Slo], candidates: &[Thresholds]) -> Self {
        let mut windows: Vec<WindowGroup> = Vec::new();
        let mut bases: Vec<BaseGroup> = Vec::new();
        let mut cands = Vec::with_capacity(candidates.len());
        for t in candidates {
            let r = reach(t);
            let same_reach = |g: &WindowGroup| {
                let g = g.reach;
                (g.window, g.max_window, g.min_samples) == (r.window, r.max_window, r.min_samples)
            };
            let window = match windows.iter().position(same_reach) {
                Some(w) => w,
                None => {
                    windows.push(WindowGroup {
                        reach: r,
                        keys: BTreeMap::new(),
                    });
                    windows.len() - 1
                }
            };
            let learns_alike = |g: &BaseGroup| {
                (g.window, g.half_life, g.warmup_samples, g.warmup_time)
                    == (window, t.half_life, t.warmup_samples, t.warmup_time)
            };
            let base = match bases.iter().position(learns_alike) {
                Some(b) => b,
                None => {
                    bases.push(BaseGroup {
                        window,
                        half_life: t.half_life,
                        warmup_samples: t.warmup_samples,
                        warmup_time: t.warmup_time,
                        baselines: BTreeMap::new(),
                        dispersions: BTreeMap::new(),
                        stats: BTreeMap::new(),
                    });
                    bases.len() - 1
                }
            };
            cands.push(Cand {
                t: t.clone(),
                bars: Bars::of(t),
                machine: Machine::default(),
                base,
                incidents: Vec::new(),
            });
        }
        let mut quantiles: Vec<f64> = Vec::new();
        for q in candidates.iter().flat_map(|t| &t.quantiles) {
            if !quantiles.iter().any(|u| u.to_bits() == q.to_bits()) {
                quantiles.push(*q);
            }
        }
        Sweep {
            quantiles,
            service: service.to_string(),
            significance,
            slo: slo
                .iter()
                .filter(|s| s.service.as_deref().is_none_or(|n| n == service))
                .cloned()
                .collect(),
            cands,
            windows,
            bases,
            last_end: None,
            current: None,
            seen: 0,
            scratch: Scratch::default(),
        }
    }

    /// Feed one record of the service: the interval ending at `ts` of `probe`, as its
    /// non-empty `(bucket, count)` pairs (as [`model::Histogram::nonzero`] yields them) and
    /// sample count. Records of one interval share a
    /// `ts`; a later `ts` ends the interval before. A record out of time order or repeated
    /// is refused and changes nothing.
    pub fn push(
        &mut self,
        ts: SystemTime,
        probe: Probe,
        nonzero: &[(usize, u64)],
        count: u64,
    ) -> Result<(), RecordError> {
        if let Some(ended) = interval_ended(self.current, ts)? {
            self.end_interval(ended);
            self.seen = 0;
        }
        mark_fed(&mut self.seen, &self.service, probe, ts)?;
        self.current = Some(ts);
        let start = interval_start(self.last_end, ts);
        for g in &mut self.windows {
            let key = g.keys.entry(probe).or_insert_with(|| WindowKey {
                window: Window::default(),
                evaluated: false,
                fresh: false,
                cum: Box::new(Cumulative::new(std::iter::empty())),
                observed: Vec::new(),
                hints: Vec::new(),
            });
            key.window
                .push_buckets(start, ts, nonzero.iter().copied(), count);
            key.fresh = true;
        }
        for g in &mut self.bases {
            g.baselines
                .entry(probe)
                .or_insert_with(|| Baseline::new(ts));
        }
        Ok(())
    }

    /// End the last interval; every candidate's incidents (in candidate order, each in
    /// opening order; those still open have no `closed_at`).
    pub fn finish(mut self) -> Vec<Vec<Incident>> {
        if let Some(cur) = self.current.take() {
            self.end_interval(cur);
        }
        self.cands.into_iter().map(|c| c.incidents).collect()
    }

    /// How many baseline groups the candidates form now: the replays that were not shared.
    pub fn baseline_groups(&self) -> usize {
        self.bases.len()
    }

    /// [`Detector::end_interval`](crate::Detector::end_interval) for every candidate.
    fn end_interval(&mut self, ts: SystemTime) {
        self.last_end = Some(ts);

        // 1. Windows, once per reach.
        for g in &mut self.windows {
            for key in g.keys.values_mut() {
                key.evaluated = match key.window.evaluate(ts, g.reach) {
                    Some(snap) => {
                        key.cum.set_counts(&snap.buckets);
                        key.observed.clear();
                        key.hints.resize(self.quantiles.len(), usize::MAX);
                        for (&q, hint) in self.quantiles.iter().zip(&mut key.hints) {
                            key.observed.push(key.cum.quantile_near(q, hint));
                        }
                        true
                    }
                    None => false,
                };
            }
        }

        // 2. Baseline running sums, once per baseline group; the tests are filled lazily.
        let mut sums = CumulativeBatch::default();
        for g in &mut self.bases {
            let windows = &self.windows[g.window].keys;
            for (&probe, baseline) in &g.baselines {
                let stats = g.stats.entry(probe).or_insert_with(|| BaseStats {
                    tested: false,
                    weight: 0.0,
                    cum: Box::new(Cumulative::new(std::iter::empty())),
                    cum_current: false,
                    shifts: Vec::new(),
                    hints: Vec::new(),
                });
                stats.shifts.clear();
                stats.weight = baseline.weight();
                stats.tested = windows.get(&probe).is_some_and(|k| k.evaluated)
                    && baseline.is_warm(ts, g.warmup_samples, g.warmup_time);
            }
            // The running sums of every probe (and group) side by side; done before any
            // candidate reads them (`finish` below).
            for (probe, stats) in g.stats.iter_mut() {
                if stats.tested && !stats.cum_current {
                    if let Some(baseline) = g.baselines.get(probe) {
                        sums.push(baseline, &mut stats.cum);
                        stats.cum_current = true;
                    }
                }
            }
        }
        sums.finish();
        for g in &mut self.bases {
            let windows = &self.windows[g.window].keys;
            for (probe, stats) in &g.stats {
                let newest = windows
                    .get(probe)
                    .filter(|k| k.fresh)
                    .and_then(|k| k.window.newest());
                if let (true, Some(newest)) = (stats.tested, newest) {
                    g.dispersions.entry(*probe).or_default().note(
                        &stats.cum,
                        newest,
                        &self.quantiles,
                    );
                }
            }
        }

        // 3. Each candidate's tests, verdicts and state machine.
        let s = &mut self.scratch;
        let significance = self.significance;
        s.learning.clear();
        for cand in &mut self.cands {
            let group = &mut self.bases[cand.base];
            let windows = &self.windows[group.window];
            let t = &cand.t;
            s.tests.clear();
            let mut slo_hits: Vec<Evidence> = Vec::new();
            for (&probe, key) in &windows.keys {
                if !key.evaluated {
                    continue;
                }
                let snap = key.window.evaluated();
                let Some(stats) = group.stats.get_mut(&probe) else {
                    continue;
                };
                for slo in self.slo.iter().filter(|s| applies(s, &self.service, probe)) {
                    slo_hits.extend(slo_evidence(slo, snap, &key.cum, stats.weight));
                }
                if !stats.tested {
                    continue;
                }
                for &q in &t.quantiles {
                    let at = match stats
                        .shifts
                        .iter()
                        .position(|s| s.q.to_bits() == q.to_bits())
                    {
                        Some(at) => at,
                        None => {
                            let qi = quantile_index(&self.quantiles, q);
                            // A quantile no window looked up has no hint kept.
                            let mut no_hint = usize::MAX;
                            if stats.hints.len() < self.quantiles.len() {
                                stats.hints.resize(self.quantiles.len(), usize::MAX);
                            }
                            let rho = group.dispersions.get(&probe).map_or(0.0, |d| d.rho(q));
                            let shift = Shift::with_window_quantile(
                                q,
                                snap,
                                &key.cum,
                                qi.and_then(|i| key.observed.get(i).copied().flatten()),
                                &stats.cum,
                                qi.map_or(&mut no_hint, |i| &mut stats.hints[i]),
                            )
                            .map(|s| s.clustered(rho, snap));
                            stats.shifts.push(ShiftSlot {
                                q,
                                shift,
                                exact: None,
                            });
                            stats.shifts.len() - 1
                        }
                    };
                    let slot = &mut stats.shifts[at];
                    let Some(shift) = slot.shift else { continue };
                    let p = if shift.worth_testing(cand.bars) {
                        *slot
                            .exact
                            .get_or_insert_with(|| shift.p_value(significance))
                    } else {
                        1.0
                    };
                    s.tests.push((probe, at, p));
                }
            }
            s.p_values.clear();
            s.p_values.extend(s.tests.iter().map(|&(_, _, p)| p));
            holm_into(
                &s.p_values,
                self.significance,
                &mut s.order,
                &mut s.significant,
            );
            let mut hot: Vec<Evidence> = Vec::new();
            let mut holding = false;
            for (&(probe, at, p), &sig) in s.tests.iter().zip(&s.significant) {
                // Neither significant nor holding: `judge` says cool (most tests).
                if !sig && p > HOLD_P_VALUE {
                    continue;
                }
                let Some(stats) = group.stats.get(&probe) else {
                    continue;
                };
                let Some(shift) = stats.shifts[at].shift else {
                    continue;
                };
                match judge(cand.bars, shift.ratio, shift.delta(), Some(p), sig) {
                    Verdict::Hot => hot.push(shift.evidence(probe, p, stats.weight)),
                    Verdict::Holding => holding = true,
                    Verdict::Cool => {}
                }
            }
            hot.extend(slo_hits);

            let group = &self.bases[cand.base];
            let view = |p: Probe| -> KeyView<'_> {
                let key = windows.keys.get(&p)?;
                Some((&key.window, key.evaluated, group.baselines.get(&p)?))
            };
            let r = windows.reach;
            let event = cand.machine.step(&self.service, t, ts, hot, holding, &|h| {
                stage(ts, h, r, &view)
            });
            let renew = event.as_ref().is_some_and(renews_baselines);
            if let Some(ev) = event {
                absorb(&mut cand.incidents, ev);
            }
            s.learning.push(if renew {
                Learning::Renew
            } else if cand.machine.frozen() {
                Learning::Hold
            } else {
                Learning::Learn
            });
        }

        // 4. Learning: a group whose members disagree splits, each part with a copy.
        for gi in 0..self.bases.len() {
            let mut first: Option<Learning> = None;
            let mut parts: Vec<(Learning, usize)> = Vec::new();
            for (cand, &how) in self.cands.iter_mut().zip(&s.learning) {
                if cand.base != gi {
                    continue;
                }
                match first {
                    None => first = Some(how),
                    Some(f) if f == how => {}
                    Some(_) => {
                        let part = match parts.iter().find(|&&(l, _)| l == how) {
                            Some(&(_, part)) => part,
                            None => {
                                let copy = self.bases[gi].clone();
                                self.bases.push(copy);
                                parts.push((how, self.bases.len() - 1));
                                self.bases.len() - 1
                            }
                        };
                        cand.base = part;
                    }
                }
            }
            let keys = &self.windows[self.bases[gi].window].keys;
            if let Some(how) = first {
                learn(&mut self.bases[gi], keys, how, ts);
            }
            for (how, part) in parts {
                learn(&mut self.bases[part], keys, how, ts);
            }
        }
        for g in &mut self.windows {
            for key in g.keys.values_mut() {
                key.fresh = false;
            }
        }
    }
}

/// Where `q` is among the quantiles some candidate tests.
fn quantile_index(quantiles: &[f64], q: f64) -> Option<usize> {
    quantiles.iter().position(|u| u.to_bits() == q.to_bits())
}

/// The end of an interval for one baseline group: what the detector does after its state
/// machine steps.
fn learn(group: &mut BaseGroup, keys: &BTreeMap<Probe, WindowKey>, how: Learning, ts: SystemTime) {
    if how == Learning::Renew {
        for b in group.baselines.values_mut() {
            *b = Baseline::new(ts);
        }
        group.dispersions.clear();
        for stats in group.stats.values_mut() {
            stats.cum_current = false;
        }
    }
    let mut memo = DecayMemo::default();
    for (probe, b) in group.baselines.iter_mut() {
        let key = keys.get(probe);
        let dispersion = group.dispersions.get_mut(probe);
        match key.and_then(|k| k.window.newest().filter(|_| k.fresh)) {
            Some(buckets) if how != Learning::Hold => {
                b.learn_memo(ts, buckets, group.half_life, &mut memo);
                if let Some(d) = dispersion {
                    d.learn(ts, group.half_life);
                }
                if let Some(stats) = group.stats.get_mut(probe) {
                    stats.cum_current = false;
                }
            }
            // Holding changes no weight: the running sums stay valid.
            _ => {
                b.hold(ts);
                if let Some(d) = dispersion {
                    d.hold(ts);
                }
            }
        }
    }
}

/// Keep a candidate's incidents up to date with one event, as [`crate::replay::Replayer`]
/// does.
fn absorb(incidents: &mut Vec<Incident>, ev: Event) {
    match ev {
        Event::Opened(inc) => incidents.push(inc),
        Event::Noticed(_) => {}
        Event::Updated(inc) | Event::Closed(inc) => {
            if let Some(slot) = incidents
                .iter_mut()
                .rev()
                .find(|i| i.opened_at == inc.opened_at)
            {
                *slot = inc;
            }
        }
    }
}
