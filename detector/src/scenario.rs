//! Synthetic histogram series from a scenario file: per service a latency distribution per
//! probe, a request rate with an optional daily swing, and labelled anomalies.
//!
//! Fast by construction: each interval's bucket counts are drawn directly (Poisson per
//! bucket, from the distribution's CDF at the bucket bounds), never sample by sample, so a
//! service-week at 1 s intervals takes seconds. The same seed gives the same series.

use std::f64::consts::{PI, SQRT_2};
use std::time::{Duration, SystemTime};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson};
use serde::{Deserialize, Deserializer};
use statrs::function::erf::erfc;

use crate::event::Incident;
use crate::replay::Record;
use model::hist::{bucket_lower, bucket_mid, Histogram, MAX_BUCKET, NUM_BUCKETS};
use model::Probe;

/// A scenario: what to simulate, for how long, and which anomalies to inject.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Random seed; the same seed gives the same series.
    #[serde(default)]
    pub seed: u64,
    /// Time of the first interval's start (RFC 3339).
    #[serde(deserialize_with = "de_time")]
    pub start: SystemTime,
    /// Length of the series.
    #[serde(deserialize_with = "de_positive")]
    pub duration: Duration,
    /// Length of one interval (default 1 s).
    #[serde(default = "one_second", deserialize_with = "de_positive")]
    pub interval: Duration,
    /// The simulated services.
    pub services: Vec<ServiceSpec>,
    /// Injected anomalies.
    #[serde(default)]
    pub anomalies: Vec<Anomaly>,
}

/// One simulated service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Service name.
    pub name: String,
    /// Mean requests (samples) per second.
    #[serde(deserialize_with = "de_non_negative")]
    pub rate: f64,
    /// Daily swing of the rate as a fraction of it, in [0, 1): 0.5 means ±50%.
    #[serde(default, deserialize_with = "de_swing")]
    pub diurnal_swing: f64,
    /// Period of the swing (default 24 h).
    #[serde(default = "one_day", deserialize_with = "de_positive")]
    pub diurnal_period: Duration,
    /// Offset into the period where the rate peaks.
    #[serde(default, with = "humantime_serde")]
    pub peak_at: Duration,
    /// The probes this service reports, each with its latency distribution.
    pub probes: Vec<ProbeSpec>,
}

/// The latency at one probe: a mixture of components.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// The probe.
    pub probe: Probe,
    /// Mixture components (weights are normalised).
    pub latency: Vec<Component>,
}

/// A mixture component of a latency distribution.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawComponent")]
pub enum Component {
    /// Log-normal: `median` and `sigma` (of the log).
    LogNormal {
        /// Relative weight in the mixture.
        weight: f64,
        /// Median latency.
        median: Duration,
        /// Standard deviation of ln(latency).
        sigma: f64,
    },
    /// Pareto tail: latency >= `scale`, tail index `alpha`.
    Pareto {
        /// Relative weight in the mixture.
        weight: f64,
        /// Smallest value.
        scale: Duration,
        /// Tail index (smaller is heavier).
        alpha: f64,
    },
}

/// [`Component`] as written, checked by `TryFrom` so errors carry the line.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum RawComponent {
    LogNormal {
        weight: f64,
        #[serde(with = "humantime_serde")]
        median: Duration,
        sigma: f64,
    },
    Pareto {
        weight: f64,
        #[serde(with = "humantime_serde")]
        scale: Duration,
        alpha: f64,
    },
}

impl TryFrom<RawComponent> for Component {
    type Error = String;
    fn try_from(raw: RawComponent) -> Result<Self, String> {
        let c = match raw {
            RawComponent::LogNormal {
                weight,
                median,
                sigma,
            } => Component::LogNormal {
                weight,
                median,
                sigma,
            },
            RawComponent::Pareto {
                weight,
                scale,
                alpha,
            } => Component::Pareto {
                weight,
                scale,
                alpha,
            },
        };
        c.check()?;
        Ok(c)
    }
}

/// What an anomaly does over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// Full effect from start to end.
    Step,
    /// Effect grows linearly from none at the start to full at the end, then stops.
    Ramp,
    /// A step meant to be short (seconds).
    Burst,
}

/// An injected anomaly: latency `x` becomes `factor * x + add` for the chosen probes and
/// components of one service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anomaly {
    /// The service it hits.
    pub service: String,
    /// Step, ramp or burst.
    pub kind: AnomalyKind,
    /// Offset from the scenario start.
    #[serde(with = "humantime_serde")]
    pub start: Duration,
    /// How long it lasts.
    #[serde(deserialize_with = "de_positive")]
    pub duration: Duration,
    /// Latency multiplier (default 1).
    #[serde(default = "one", deserialize_with = "de_positive_f64")]
    pub factor: f64,
    /// Latency added (default 0).
    #[serde(default, with = "humantime_serde")]
    pub add: Duration,
    /// Probes hit (default: all of the service's). Probes are cumulative, so a delay in an
    /// early stage should list the later probes too.
    #[serde(default)]
    pub probes: Vec<Probe>,
    /// Indices of the mixture components hit (default: all).
    #[serde(default)]
    pub components: Vec<usize>,
    /// Request-rate multiplier while active (default 1).
    #[serde(default = "one", deserialize_with = "de_non_negative")]
    pub rate_factor: f64,
    /// A name for reports.
    #[serde(default)]
    pub label: String,
}

fn one() -> f64 {
    1.0
}
fn one_second() -> Duration {
    Duration::from_secs(1)
}
fn one_day() -> Duration {
    Duration::from_secs(86_400)
}

fn de_time<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let s = String::deserialize(d)?;
    crate::replay::parse_rfc3339(&s).map_err(serde::de::Error::custom)
}

fn de_positive<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v: Duration = humantime_serde::deserialize(d)?;
    if v.is_zero() {
        return Err(serde::de::Error::custom("must be longer than zero"));
    }
    Ok(v)
}

fn de_non_negative<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(serde::de::Error::custom(format!("{v} must be >= 0")));
    }
    Ok(v)
}

fn de_positive_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if !(v.is_finite() && v > 0.0) {
        return Err(serde::de::Error::custom(format!("{v} must be > 0")));
    }
    Ok(v)
}

fn de_swing<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if !(0.0..1.0).contains(&v) {
        return Err(serde::de::Error::custom(format!("{v} is outside [0, 1)")));
    }
    Ok(v)
}

/// A rejected scenario file: where, which key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {}{reason}", line.map(|l| format!(", line {l}")).unwrap_or_default(), key.as_ref().map(|k| format!("key `{k}`: ")).unwrap_or_default())]
pub struct ScenarioError {
    /// The file (or other origin) the text came from.
    pub origin: String,
    /// 1-based line of the offending key or value, when known.
    pub line: Option<usize>,
    /// Dotted path of the offending key, when known (e.g. `services[0].rate`).
    pub key: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// Deserialize TOML text, turning errors into [`ScenarioError`] with line and key path.
fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
) -> Result<T, ScenarioError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ScenarioError {
            origin: origin.to_string(),
            line,
            key: (path != "." && !path.is_empty()).then_some(path),
            reason: inner.message().trim().to_string(),
        }
    })
}

impl Scenario {
    /// Parse and check a scenario file.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = parse_toml(text, origin)?;
        s.check().map_err(|(key, reason)| ScenarioError {
            origin: origin.to_string(),
            line: None,
            key: Some(key),
            reason,
        })?;
        Ok(s)
    }

    fn check(&self) -> Result<(), (String, String)> {
        if self.interval < Duration::from_millis(1) {
            return Err(("interval".into(), "must be at least 1ms".into()));
        }
        if self.services.is_empty() {
            return Err(("services".into(), "at least one service is needed".into()));
        }
        for (si, s) in self.services.iter().enumerate() {
            let at = format!("services[{si}]");
            if s.name.is_empty() {
                return Err((format!("{at}.name"), "must not be empty".into()));
            }
            if self.services[..si].iter().any(|o| o.name == s.name) {
                return Err((format!("{at}.name"), format!("{:?} appears twice", s.name)));
            }
            if s.probes.is_empty() {
                return Err((
                    format!("{at}.probes"),
                    "at least one probe is needed".into(),
                ));
            }
            for (pi, p) in s.probes.iter().enumerate() {
                let at = format!("{at}.probes[{pi}]");
                if s.probes[..pi].iter().any(|o| o.probe == p.probe) {
                    return Err((format!("{at}.probe"), format!("{} appears twice", p.probe)));
                }
                if p.latency.is_empty() {
                    return Err((format!("{at}.latency"), "at least one component".into()));
                }
            }
        }
        for (ai, a) in self.anomalies.iter().enumerate() {
            let at = format!("anomalies[{ai}]");
            let Some(s) = self.services.iter().find(|s| s.name == a.service) else {
                return Err((
                    format!("{at}.service"),
                    format!("no service {:?}", a.service),
                ));
            };
            for p in &a.probes {
                if !s.probes.iter().any(|sp| sp.probe == *p) {
                    return Err((
                        format!("{at}.probes"),
                        format!("{} has no probe {p}", s.name),
                    ));
                }
            }
            let hit = s
                .probes
                .iter()
                .filter(|sp| a.probes.is_empty() || a.probes.contains(&sp.probe));
            for sp in hit {
                if let Some(c) = a.components.iter().find(|&&c| c >= sp.latency.len()) {
                    return Err((
                        format!("{at}.components"),
                        format!("{} of {} has no component {c}", sp.probe, s.name),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Number of intervals in the series.
    pub fn intervals(&self) -> u64 {
        (self.duration.as_nanos() / self.interval.as_nanos().max(1)) as u64
    }

    /// When an anomaly is active: `[start, end)` as absolute times.
    pub fn anomaly_span(&self, a: &Anomaly) -> (SystemTime, SystemTime) {
        let s = self.start + a.start;
        (s, s + a.duration)
    }

    /// The series, one interval (all services and probes) per item.
    pub fn generate(&self) -> Generator<'_> {
        let caches = self
            .services
            .iter()
            .map(|s| s.probes.iter().map(|_| None).collect())
            .collect();
        Generator {
            scenario: self,
            rng: ChaCha8Rng::seed_from_u64(self.seed),
            next: 0,
            caches,
        }
    }
}

/// How a detector run did against a scenario's labelled anomalies.
#[derive(Debug, Clone)]
pub struct Score {
    /// One per anomaly, in file order.
    pub outcomes: Vec<Outcome>,
    /// Incidents that opened during no anomaly (nor within the grace after one).
    pub false_incidents: usize,
    /// Service-time without any anomaly (the exposure for false incidents).
    pub quiet_time: Duration,
}

/// Whether and how fast one anomaly was detected.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The anomaly's label.
    pub label: String,
    /// Its service.
    pub service: String,
    /// Time from its start to the incident opening; `None` when missed.
    pub delay: Option<Duration>,
    /// The matching incident's stage verdict.
    pub verdict: Option<String>,
}

impl Scenario {
    /// Match incidents to anomalies: an incident detects an anomaly of its service when it
    /// opens between the anomaly's start and `grace` after its end.
    pub fn score(&self, incidents: &[Incident], grace: Duration) -> Score {
        let mut used = vec![false; incidents.len()];
        let mut outcomes = Vec::new();
        for a in &self.anomalies {
            let (start, end) = self.anomaly_span(a);
            let hit = incidents.iter().enumerate().find(|(_, i)| {
                i.service == a.service && i.opened_at >= start && i.opened_at <= end + grace
            });
            if let Some((n, _)) = hit {
                used[n] = true;
            }
            outcomes.push(Outcome {
                label: a.label.clone(),
                service: a.service.clone(),
                delay: hit.and_then(|(_, i)| i.opened_at.duration_since(start).ok()),
                verdict: hit.and_then(|(_, i)| i.stage.as_ref().map(|s| s.verdict.clone())),
            });
        }
        let anomalous: Duration = self.anomalies.iter().map(|a| a.duration + grace).sum();
        let total = self.duration * self.services.len() as u32;
        Score {
            outcomes,
            false_incidents: used.iter().filter(|u| !**u).count(),
            quiet_time: total.saturating_sub(anomalous),
        }
    }
}

impl Component {
    fn check(&self) -> Result<(), String> {
        let (weight, ok) = match *self {
            Component::LogNormal {
                weight,
                median,
                sigma,
            } => (
                weight,
                !median.is_zero() && sigma.is_finite() && sigma > 0.0,
            ),
            Component::Pareto {
                weight,
                scale,
                alpha,
            } => (weight, !scale.is_zero() && alpha.is_finite() && alpha > 0.0),
        };
        if !(weight.is_finite() && weight > 0.0) {
            return Err(format!("weight {weight} must be > 0"));
        }
        if !ok {
            return Err("median/scale must be > 0 and sigma/alpha > 0".into());
        }
        Ok(())
    }

    fn weight(&self) -> f64 {
        match *self {
            Component::LogNormal { weight, .. } | Component::Pareto { weight, .. } => weight,
        }
    }

    /// P(X <= v) for `X = factor * base + add`.
    fn cdf(&self, v: f64, factor: f64, add: f64) -> f64 {
        let x = (v - add) / factor;
        if x <= 0.0 {
            return 0.0;
        }
        match *self {
            Component::LogNormal { median, sigma, .. } => {
                let z = (x.ln() - (median.as_nanos() as f64).ln()) / (sigma * SQRT_2);
                0.5 * erfc(-z)
            }
            Component::Pareto { scale, alpha, .. } => {
                let xm = scale.as_nanos() as f64;
                if x < xm {
                    0.0
                } else {
                    1.0 - (xm / x).powf(alpha)
                }
            }
        }
    }
}

/// Buckets with at least this probability are drawn one by one; the rest are pooled.
const DENSE_P: f64 = 1e-4;

/// Bucket probabilities for one distribution state, split for fast drawing.
#[derive(Debug)]
struct BucketLaw {
    /// The per-component `(factor, add)` this was computed for.
    key: Vec<(u64, u64)>,
    dense: Vec<(usize, f64)>,
    /// Pooled rare buckets with their cumulative probability.
    sparse: Vec<(usize, f64)>,
    sparse_total: f64,
}

impl BucketLaw {
    fn new(key: Vec<(u64, u64)>, comps: &[Component], effects: &[(f64, f64)]) -> Self {
        let total_w: f64 = comps.iter().map(Component::weight).sum();
        let cdf = |v: f64| -> f64 {
            comps
                .iter()
                .zip(effects)
                .map(|(c, &(f, a))| c.weight() / total_w * c.cdf(v, f, a))
                .sum()
        };
        let mut dense = Vec::new();
        let mut sparse = Vec::new();
        let mut acc = 0.0;
        let mut below = 0.0;
        for i in 0..NUM_BUCKETS {
            let upper = if i == MAX_BUCKET {
                1.0
            } else {
                cdf(bucket_lower(i + 1) as f64)
            };
            let p = (upper - below).max(0.0);
            below = upper;
            if p >= DENSE_P {
                dense.push((i, p));
            } else if p > 0.0 {
                acc += p;
                sparse.push((i, acc));
            }
        }
        BucketLaw {
            key,
            dense,
            sparse,
            sparse_total: acc,
        }
    }

    fn draw(&self, rng: &mut ChaCha8Rng, lambda: f64, counts: &mut [u64; NUM_BUCKETS]) {
        for &(i, p) in &self.dense {
            counts[i] += poisson(rng, lambda * p);
        }
        // Poisson splitting: the pooled rare buckets get a Poisson total, placed one by one.
        let k = poisson(rng, lambda * self.sparse_total);
        for _ in 0..k {
            let u = rng.random::<f64>() * self.sparse_total;
            let j = self.sparse.partition_point(|&(_, c)| c < u);
            if let Some(&(i, _)) = self.sparse.get(j).or(self.sparse.last()) {
                counts[i] += 1;
            }
        }
    }
}

fn poisson(rng: &mut ChaCha8Rng, mean: f64) -> u64 {
    if mean <= 0.0 || !mean.is_finite() {
        return 0;
    }
    match Poisson::new(mean) {
        Ok(d) => d.sample(rng) as u64,
        Err(_) => 0,
    }
}

/// Iterator over the intervals of a scenario; see [`Scenario::generate`].
#[derive(Debug)]
pub struct Generator<'a> {
    scenario: &'a Scenario,
    rng: ChaCha8Rng,
    next: u64,
    /// Per service, per probe: the bucket law last used (recomputed when anomalies change).
    caches: Vec<Vec<Option<BucketLaw>>>,
}

impl Iterator for Generator<'_> {
    type Item = Vec<Record>;

    fn next(&mut self) -> Option<Vec<Record>> {
        let sc = self.scenario;
        if self.next >= sc.intervals() {
            return None;
        }
        let k = self.next;
        self.next += 1;
        let offset = sc.interval * k as u32;
        let mid = offset + sc.interval / 2;
        let end = sc.start + offset + sc.interval;
        let secs = sc.interval.as_secs_f64();
        let mut out = Vec::new();
        for (si, svc) in sc.services.iter().enumerate() {
            let phase =
                (mid.as_secs_f64() - svc.peak_at.as_secs_f64()) / svc.diurnal_period.as_secs_f64();
            let mut rate = svc.rate * (1.0 + svc.diurnal_swing * (2.0 * PI * phase).cos());
            let active: Vec<(&Anomaly, f64)> = sc
                .anomalies
                .iter()
                .filter(|a| a.service == svc.name)
                .filter_map(|a| progress(a, mid).map(|p| (a, p)))
                .collect();
            for (a, _) in &active {
                rate *= a.rate_factor;
            }
            for (pi, ps) in svc.probes.iter().enumerate() {
                let effects = effects(ps, &active);
                let key: Vec<(u64, u64)> = effects
                    .iter()
                    .map(|&(f, a)| (f.to_bits(), a.to_bits()))
                    .collect();
                let slot = &mut self.caches[si][pi];
                if slot.as_ref().is_none_or(|law| law.key != key) {
                    *slot = Some(BucketLaw::new(key, &ps.latency, &effects));
                }
                let mut counts = [0u64; NUM_BUCKETS];
                if let Some(law) = slot.as_ref() {
                    law.draw(&mut self.rng, rate * secs, &mut counts);
                }
                let sum_ns: f64 = counts
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| c as f64 * bucket_mid(i))
                    .sum();
                let hist = Histogram::from_dense(&counts, sum_ns as u64).unwrap_or_default();
                out.push(Record {
                    ts: end,
                    service: svc.name.clone(),
                    probe: ps.probe,
                    interval_ms: sc.interval.as_millis().max(1) as u64,
                    hist,
                });
            }
        }
        Some(out)
    }
}

/// How far into an anomaly `t` is, as its strength in [0, 1]; `None` when inactive. Ramps
/// are quantised to 1/1000 so the bucket law is recomputed at most that often.
fn progress(a: &Anomaly, t: Duration) -> Option<f64> {
    if t < a.start || t >= a.start + a.duration {
        return None;
    }
    Some(match a.kind {
        AnomalyKind::Step | AnomalyKind::Burst => 1.0,
        AnomalyKind::Ramp => {
            let p = (t - a.start).as_secs_f64() / a.duration.as_secs_f64();
            (p * 1000.0).round() / 1000.0
        }
    })
}

/// Per component `(factor, add ns)` from the active anomalies that hit this probe.
fn effects(ps: &ProbeSpec, active: &[(&Anomaly, f64)]) -> Vec<(f64, f64)> {
    let mut out = vec![(1.0, 0.0); ps.latency.len()];
    for (a, p) in active {
        if !a.probes.is_empty() && !a.probes.contains(&ps.probe) {
            continue;
        }
        for (ci, e) in out.iter_mut().enumerate() {
            if a.components.is_empty() || a.components.contains(&ci) {
                e.0 *= 1.0 + (a.factor - 1.0) * p;
                e.1 += a.add.as_nanos() as f64 * p;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
seed = 7
start = "2026-01-05T00:00:00Z"
duration = "20s"

[[services]]
name = "web"
rate = 20000

[[services.probes]]
probe = "tcp-socket-read"
latency = [
  { kind = "log-normal", weight = 0.95, median = "200us", sigma = 0.3 },
  { kind = "pareto", weight = 0.05, scale = "400us", alpha = 2.5 },
]

[[anomalies]]
service = "web"
kind = "step"
start = "10s"
duration = "10s"
factor = 2
"#;

    #[test]
    fn counts_follow_the_distribution_and_the_anomaly() {
        let sc = Scenario::from_toml_str(SMALL, "small.toml").unwrap();
        let intervals: Vec<Vec<Record>> = sc.generate().collect();
        assert_eq!(intervals.len(), 20);
        let mut before = Histogram::new();
        let mut during = Histogram::new();
        for (k, recs) in intervals.iter().enumerate() {
            for r in recs {
                if k < 10 {
                    before.merge(&r.hist)
                } else {
                    during.merge(&r.hist)
                }
            }
        }
        // ~20 000 samples per second
        let per_s = before.count() as f64 / 10.0;
        assert!((per_s - 20_000.0).abs() < 500.0, "{per_s}");
        let m = before.quantile(0.5).unwrap();
        assert!(
            m.lower_ns <= 200_000 + 12_500 && 200_000 - 12_500 < m.upper_ns,
            "{m:?}"
        );
        let m2 = during.quantile(0.5).unwrap();
        let ratio = m2.value_ns / m.value_ns;
        assert!((1.8..2.2).contains(&ratio), "median ratio {ratio}");
    }

    #[test]
    fn same_seed_same_series() {
        let sc = Scenario::from_toml_str(SMALL, "small.toml").unwrap();
        let a: Vec<_> = sc.generate().flatten().map(|r| r.to_json_line()).collect();
        let b: Vec<_> = sc.generate().flatten().map(|r| r.to_json_line()).collect();
        assert_eq!(a, b);
        let other = SMALL.replace("seed = 7", "seed = 8");
        let sc = Scenario::from_toml_str(&other, "o.toml").unwrap();
        let c: Vec<_> = sc.generate().flatten().map(|r| r.to_json_line()).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn bad_scenarios_name_the_key() {
        let e =
            Scenario::from_toml_str(&SMALL.replace("service = \"web\"", "service = \"db\""), "s")
                .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("anomalies[0].service"), "{e}");
        let e =
            Scenario::from_toml_str(&SMALL.replace("rate = 20000", "rate = -1"), "s").unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        assert!(e.reason.contains(">= 0"), "{e}");
        let e =
            Scenario::from_toml_str(&SMALL.replace("alpha = 2.5", "alpha = 0"), "s").unwrap_err();
        assert!(e.key.as_deref().unwrap_or("").contains("latency[1]"), "{e}");
    }
}
