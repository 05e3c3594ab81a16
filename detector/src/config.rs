//! Detector settings: the `[detector]` table of the daemon's TOML config file.
//!
//! Every key has a default (see [`Thresholds::default`] and docs/detector.md). The threshold
//! keys are defined once, in [`Thresholds`]: at the top of `[detector]` they are the defaults
//! of every service, and `[detector.services.<name>]` overrides some of them for one service
//! (the override is merged over the defaults and read as [`Thresholds`] again, so it is
//! checked by the same code). Static ceilings (SLOs) are `[[detector.slo]]` entries.

use std::collections::BTreeMap;
use std::time::Duration;

use model::config::{key_segment, KeyProblem, Validate};
use serde::de::{DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use model::Probe;

/// The commented defaults of `[detector]`, part of `tailtrap config defaults`.
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// Settings of the detector (the `[detector]` table): the significance level, the default
/// thresholds, per-service overrides and static ceilings. In the file the threshold keys sit
/// directly in `[detector]`, next to `significance`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DetectorConfig {
    /// Family-wise false-alarm probability per interval: the exact binomial tests of one
    /// interval (all services, probes, quantiles) are Holm-corrected to this level.
    pub significance: f64,
    /// The thresholds of every service without an override.
    #[serde(flatten)]
    pub defaults: Thresholds,
    /// Per-service overrides, keyed by service name: some threshold keys, as written in
    /// `[detector.services.<name>]`; [`Thresholds::with_overrides`] applies them.
    pub services: BTreeMap<String, toml::Table>,
    /// Static ceilings: a quantile above `max` is always an incident.
    pub slo: Vec<Slo>,
}

/// The thresholds in force for a service: the keys of `[detector]` (and of
/// `[detector.services.<name>]`) that decide when a shift becomes an incident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Watched quantiles, each in (0, 1).
    #[serde(deserialize_with = "de::quantiles")]
    pub quantiles: Vec<f64>,
    /// Smallest observed/baseline ratio of a quantile that counts as a shift (>= 1).
    #[serde(deserialize_with = "de::ratio")]
    pub min_ratio: f64,
    /// Smallest absolute growth of a quantile that counts as a shift.
    #[serde(with = "humantime_serde")]
    pub min_delta: Duration,
    /// A shift whose strongest ratio stays below this is a notice, not an incident, until it
    /// has lasted `notice_for` (>= 1; at or below `min_ratio` every shift is an incident).
    /// Real hosts have short 1.3-2x tail wobbles that nobody should be paged for.
    #[serde(deserialize_with = "de::ratio")]
    pub incident_ratio: f64,
    /// ... or whose growth stays below this (tens of microseconds more at p90 is a wobble
    /// on a busy host, not a cause of slow requests).
    #[serde(with = "humantime_serde")]
    pub incident_delta: Duration,
    /// How long a notice-sized shift must last to become an incident (0: at once).
    #[serde(with = "humantime_serde")]
    pub notice_for: Duration,
    /// ... and the level its quantile must have reached for lasting to count: a p99.9 of
    /// ip-start moving from 8 µs to 33 µs for minutes is real and slows no request.
    #[serde(with = "humantime_serde")]
    pub notice_floor: Duration,
    /// Shortest evaluation window (the most recent intervals).
    #[serde(with = "de::positive_duration")]
    pub window: Duration,
    /// The window grows up to this long to gather `min_samples`.
    #[serde(with = "de::positive_duration")]
    pub max_window: Duration,
    /// Fewest samples a window must hold to be tested at all.
    #[serde(deserialize_with = "de::at_least_one")]
    pub min_samples: u64,
    /// Half-life of the baseline's memory: older intervals weigh half as much per half-life.
    #[serde(with = "de::positive_duration")]
    pub half_life: Duration,
    /// Baseline weight (samples, decayed) needed before any incident can open.
    pub warmup_samples: u64,
    /// Time since the first interval before any incident can open.
    #[serde(with = "humantime_serde")]
    pub warmup_time: Duration,
    /// M: an incident opens after this many hot windows ...
    #[serde(deserialize_with = "de::count_1_64")]
    pub open_after: u32,
    /// N: ... among this many most recent windows (at most 64).
    #[serde(deserialize_with = "de::count_1_64")]
    pub open_window: u32,
    /// K: an open incident closes after this many consecutive cool windows.
    #[serde(deserialize_with = "de::at_least_one")]
    pub close_after: u32,
    /// After an incident closes, no new one opens for the service during this time.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// An incident open this long is closed and the service's baselines start learning
    /// afresh: the shift has become the new normal (a deploy, new hardware).
    #[serde(with = "de::positive_duration")]
    pub max_incident: Duration,
}

/// A static ceiling: quantile `quantile` of `probe` above `max` is always an incident, learned
/// baseline or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// The service it applies to; absent means every service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The probe whose latency is bounded.
    pub probe: Probe,
    /// The bounded quantile, in (0, 1).
    #[serde(deserialize_with = "de::quantile")]
    pub quantile: f64,
    /// The ceiling.
    #[serde(with = "de::positive_duration")]
    pub max: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            quantiles: vec![0.5, 0.9, 0.99, 0.999, 0.9999],
            min_ratio: 1.25,
            min_delta: Duration::from_micros(20),
            incident_ratio: 2.0,
            incident_delta: Duration::from_micros(200),
            notice_for: Duration::from_secs(60),
            notice_floor: Duration::from_micros(100),
            window: Duration::from_secs(5),
            max_window: Duration::from_secs(60),
            min_samples: 500,
            half_life: Duration::from_secs(3600),
            warmup_samples: 5000,
            warmup_time: Duration::from_secs(600),
            open_after: 3,
            open_window: 5,
            close_after: 10,
            cooldown: Duration::from_secs(60),
            max_incident: Duration::from_secs(12 * 3600),
        }
    }
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            significance: DEFAULT_SIGNIFICANCE,
            defaults: Thresholds::default(),
            services: BTreeMap::new(),
            slo: Vec::new(),
        }
    }
}

const DEFAULT_SIGNIFICANCE: f64 = 1e-4;

impl Thresholds {
    /// These thresholds with `overrides` (threshold keys and values, as in
    /// `[detector.services.<name>]`) put over them, read and checked as [`Thresholds`]
    /// again. The problem's key is relative to `overrides`.
    pub fn with_overrides(&self, overrides: &toml::Table) -> Result<Thresholds, KeyProblem> {
        let mut merged = match toml::Value::try_from(self) {
            Ok(toml::Value::Table(t)) => t,
            Ok(_) | Err(_) => return Err(KeyProblem::new("", "the defaults do not serialise")),
        };
        // Every threshold is a scalar or a list: a shallow merge replaces whole values.
        merged.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        model::config::deserialize(toml::Value::Table(merged))
    }
}

impl Thresholds {
    /// These thresholds for a replay of history recorded at `interval` (the daemon's) and
    /// read back at a coarser `resolution`, so that the counted keys keep meaning time:
    /// `open_after` of `open_window` and `close_after` count window evaluations, one per
    /// point, so they are scaled by `interval / resolution` (rounded so a shift still has to
    /// last at least as long, never below 1). Every other key is already a duration or a
    /// sample count and is kept. A resolution no coarser than `interval` changes nothing.
    pub fn at_resolution(&self, interval: Duration, resolution: Duration) -> Thresholds {
        if resolution <= interval || interval.is_zero() {
            return self.clone();
        }
        let factor = interval.as_secs_f64() / resolution.as_secs_f64();
        let scale_up = |n: u32| ((f64::from(n) * factor).ceil() as u32).max(1);
        let open_window = ((f64::from(self.open_window) * factor).round() as u32).max(1);
        Thresholds {
            open_window,
            open_after: scale_up(self.open_after).min(open_window),
            close_after: scale_up(self.close_after),
            ..self.clone()
        }
    }
}

impl Validate for Thresholds {
    /// The rules between keys (single values are checked while parsing).
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = Vec::new();
        if self.open_after > self.open_window {
            problems.push(KeyProblem::new(
                "open_after",
                format!(
                    "open_after ({}) must not exceed open_window ({})",
                    self.open_after, self.open_window
                ),
            ));
        }
        if self.window > self.max_window {
            problems.push(KeyProblem::new(
                "max_window",
                format!(
                    "max_window ({}) must not be shorter than window ({})",
                    humantime::format_duration(self.max_window),
                    humantime::format_duration(self.window)
                ),
            ));
        }
        problems
    }
}

impl DetectorConfig {
    /// The thresholds in force for `service`: the defaults with its overrides applied.
    /// An override [`Validate::validate`] would refuse leaves the defaults in force.
    pub fn thresholds(&self, service: &str) -> Thresholds {
        self.services
            .get(service)
            .and_then(|o| self.defaults.with_overrides(o).ok())
            .unwrap_or_else(|| self.defaults.clone())
    }
}

impl Validate for DetectorConfig {
    /// The defaults' rules, and each override read over the defaults and checked the same
    /// way. Keys are relative to `[detector]`.
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = self.defaults.validate();
        for (name, overrides) in &self.services {
            let prefix = format!("services.{}", key_segment(name));
            match self.defaults.with_overrides(overrides) {
                // A rule the defaults already break is reported once, at the defaults.
                Ok(t) => problems.extend(
                    t.validate()
                        .into_iter()
                        .filter(|p| !problems.contains(p))
                        .map(|p| p.under(&prefix))
                        .collect::<Vec<_>>(),
                ),
                Err(p) => problems.push(p.under(&prefix)),
            }
        }
        problems
    }
}

/// `[detector]` holds `significance`, `services` and `slo` next to the threshold keys: the
/// map is read once, those three taken aside and the rest handed to [`Thresholds`], so every
/// error still names its own key.
impl<'de> Deserialize<'de> for DetectorConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(DetectorVisitor)
    }
}

struct DetectorVisitor;

impl<'de> Visitor<'de> for DetectorVisitor {
    type Value = DetectorConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the [detector] table")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DetectorConfig, A::Error> {
        let mut aside = Aside::default();
        let defaults =
            Thresholds::deserialize(serde::de::value::MapAccessDeserializer::new(Split {
                map: &mut map,
                aside: &mut aside,
            }))?;
        Ok(DetectorConfig {
            significance: aside.significance.unwrap_or(DEFAULT_SIGNIFICANCE),
            defaults,
            services: aside.services,
            slo: aside.slo,
        })
    }
}

/// The keys of `[detector]` that are not thresholds.
#[derive(Default)]
struct Aside {
    significance: Option<f64>,
    services: BTreeMap<String, toml::Table>,
    slo: Vec<Slo>,
}

/// The `[detector]` map with the [`Aside`] keys taken out as they pass.
struct Split<'a, A> {
    map: &'a mut A,
    aside: &'a mut Aside,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Split<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.map.next_key::<String>()? {
            match key.as_str() {
                "significance" => {
                    self.aside.significance = Some(self.map.next_value_seed(Significance)?);
                }
                "services" => self.aside.services = self.map.next_value()?,
                "slo" => self.aside.slo = self.map.next_value()?,
                _ => {
                    let key: serde::de::value::StrDeserializer<'_, A::Error> =
                        key.as_str().into_deserializer();
                    return match seed.deserialize(key) {
                        Ok(k) => Ok(Some(k)),
                        // Raised while reading the key's value, so the error names the key.
                        Err(e) => model::config::fail_at_value(self.map, e),
                    };
                }
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

struct Significance;

impl<'de> DeserializeSeed<'de> for Significance {
    type Value = f64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<f64, D::Error> {
        de::probability(d)
    }
}

/// Deserializers that check single values, so the error carries the value's position.
mod de {
    use super::*;
    use serde::de::Error;

    fn check<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
        ok: impl Fn(&T) -> Result<(), String>,
    ) -> Result<T, D::Error> {
        let v = T::deserialize(d)?;
        ok(&v).map_err(D::Error::custom)?;
        Ok(v)
    }

    fn is_quantile(q: &f64) -> Result<(), String> {
        if *q > 0.0 && *q < 1.0 {
            Ok(())
        } else {
            Err(format!("quantile {q} is outside (0, 1)"))
        }
    }

    fn is_quantile_list(qs: &[f64]) -> Result<(), String> {
        if qs.is_empty() {
            return Err("at least one quantile is needed".into());
        }
        qs.iter().try_for_each(is_quantile)
    }

    fn is_ratio(r: &f64) -> Result<(), String> {
        if r.is_finite() && *r >= 1.0 {
            Ok(())
        } else {
            Err(format!("ratio {r} must be a number >= 1"))
        }
    }

    fn is_at_least_one<N: PartialOrd + From<u8>>(n: &N) -> Result<(), String> {
        if *n >= N::from(1) {
            Ok(())
        } else {
            Err("must be at least 1".into())
        }
    }

    fn is_count_1_64(n: &u32) -> Result<(), String> {
        if (1..=64).contains(n) {
            Ok(())
        } else {
            Err(format!("{n} is outside 1..=64"))
        }
    }

    pub fn probability<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        check(d, |p: &f64| {
            if *p > 0.0 && *p < 1.0 {
                Ok(())
            } else {
                Err(format!("probability {p} is outside (0, 1)"))
            }
        })
    }

    pub fn quantile<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        check(d, is_quantile)
    }

    pub fn quantiles<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        check(d, |v: &Vec<f64>| is_quantile_list(v))
    }

    pub fn ratio<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        check(d, is_ratio)
    }

    pub fn at_least_one<'de, D, N>(d: D) -> Result<N, D::Error>
    where
        D: Deserializer<'de>,
        N: Deserialize<'de> + PartialOrd + From<u8>,
    {
        check(d, is_at_least_one)
    }

    pub fn count_1_64<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        check(d, is_count_1_64)
    }

    /// A duration written as humantime text that must be longer than zero (`#[serde(with)]`).
    pub mod positive_duration {
        use std::time::Duration;

        use serde::de::Error;
        use serde::Deserializer;

        pub use humantime_serde::serialize;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
            let v: Duration = humantime_serde::deserialize(d)?;
            if v.is_zero() {
                return Err(D::Error::custom("duration must be longer than zero"));
            }
            Ok(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_keys_keep_meaning_time_at_coarser_resolutions() {
        let t = Thresholds {
            open_after: 3,
            open_window: 5,
            close_after: 10,
            ..Thresholds::default()
        };
        let s = Duration::from_secs;
        let counts = |r: Thresholds| (r.open_after, r.open_window, r.close_after);
        assert_eq!(counts(t.at_resolution(s(1), s(1))), (3, 5, 10));
        assert_eq!(counts(t.at_resolution(s(1), s(2))), (2, 3, 5));
        // 10 s points: one hot point is 10 s of shift, more than 3 s of 5.
        assert_eq!(counts(t.at_resolution(s(1), s(10))), (1, 1, 1));
        assert_eq!(counts(t.at_resolution(s(1), s(60))), (1, 1, 1));
        let long = Thresholds {
            open_after: 30,
            open_window: 60,
            close_after: 120,
            ..t.clone()
        };
        assert_eq!(counts(long.at_resolution(s(1), s(10))), (3, 6, 12));
        let r = long.at_resolution(s(1), s(10));
        assert!(r.validate().is_empty());
        assert_eq!(r.window, long.window);
        // A 200 ms daemon read at 1 s.
        assert_eq!(
            counts(t.at_resolution(Duration::from_millis(200), s(1))),
            (1, 1, 2)
        );
    }

    /// Read `[detector]` of a config file the way the daemon does: the table on its own,
    /// then its rules.
    fn parse(text: &str) -> Result<DetectorConfig, Vec<KeyProblem>> {
        let mut file: toml::Table = toml::from_str(text).expect("TOML");
        let table = file
            .remove("detector")
            .unwrap_or(toml::Value::Table(toml::Table::new()));
        let cfg: DetectorConfig = model::config::deserialize(table).map_err(|p| vec![p])?;
        let problems = cfg.validate();
        if problems.is_empty() {
            Ok(cfg)
        } else {
            Err(problems)
        }
    }

    fn err(text: &str) -> KeyProblem {
        parse(text).unwrap_err().remove(0)
    }

    #[test]
    fn empty_table_gives_defaults() {
        assert_eq!(parse("").unwrap(), DetectorConfig::default());
        assert_eq!(
            parse(
                "[detector]
"
            )
            .unwrap(),
            DetectorConfig::default()
        );
    }

    #[test]
    fn overrides_and_slos_parse() {
        let text = r#"
[detector]
significance = 0.001
min_ratio = 1.5
window = "10s"

[detector.services.web]
min_delta = "1ms"
open_after = 2

[[detector.slo]]
service = "web"
probe = "tcp-socket-read"
quantile = 0.99
max = "5ms"
"#;
        let cfg = parse(text).unwrap();
        assert_eq!(cfg.significance, 0.001);
        let web = cfg.thresholds("web");
        assert_eq!(web.min_ratio, 1.5);
        assert_eq!(web.window, Duration::from_secs(10));
        assert_eq!(web.min_delta, Duration::from_millis(1));
        assert_eq!(web.open_after, 2);
        assert_eq!(cfg.thresholds("db").open_after, 3);
        assert_eq!(cfg.slo[0].probe, Probe::TcpSocketRead);
        assert_eq!(cfg.slo[0].max, Duration::from_millis(5));
    }

    #[test]
    fn defaults_round_trip_through_toml() {
        let cfg = DetectorConfig::default();
        let text = format!(
            "[detector]\n{}",
            toml::to_string(&cfg).expect("defaults serialise")
        );
        assert_eq!(parse(&text).unwrap(), cfg);
    }

    #[test]
    fn bad_values_name_key_and_reason() {
        let e = err("[detector]\nquantiles = [0.5, 1.5]\n");
        assert_eq!(e.key, "quantiles", "{e}");
        assert!(e.reason.contains("outside (0, 1)"), "{e}");

        let e = err("[detector]\n\n[detector.services.web]\nmin_ratio = 0.8\n");
        assert_eq!(e.key, "services.web.min_ratio");
        assert!(e.reason.contains(">= 1"), "{e}");

        let e = err("[detector]\nwindow = \"soon\"\n");
        assert_eq!(e.key, "window");

        let e = err("[detector]\nfrobnicate = 1\n");
        assert_eq!(e.key, "frobnicate");
        assert!(e.reason.contains("frobnicate"), "{e}");

        let e = err("[detector.services.web]\nfrobnicate = 1\n");
        assert_eq!(e.key, "services.web.frobnicate");

        let e = err("[detector]\nsignificance = 1.5\n");
        assert_eq!(e.key, "significance");
        assert!(e.reason.contains("outside (0, 1)"), "{e}");

        let e = err("[[detector.slo]]\nprobe = \"tcp-read\"\nquantile = 0.99\nmax = \"5ms\"\n");
        assert_eq!(e.key, "slo[0].probe");
        assert!(e.reason.contains("tcp-read"), "{e}");
    }

    #[test]
    fn cross_key_checks_name_the_key() {
        let e = err("[detector]\n\n[detector.services.db]\nopen_after = 6\n");
        assert_eq!(e.key, "services.db.open_after");
        assert!(e.reason.contains("must not exceed open_window (5)"), "{e}");

        let e = err("[detector]\nmax_window = \"2s\"\n");
        assert_eq!(e.key, "max_window");

        // Broken in the defaults: reported there, not again for every service.
        let p = parse("[detector]\nopen_after = 6\n[detector.services.db]\nwindow = \"1s\"\n")
            .unwrap_err();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].key, "open_after");

        // Every problem, not only the first.
        let p = parse("[detector]\nmax_window = \"2s\"\nopen_after = 6\n").unwrap_err();
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn overrides_merge_over_the_defaults() {
        let base = Thresholds::default();
        let o: toml::Table = toml::from_str("min_ratio = 2\nwindow = \"7s\"").unwrap();
        let t = base.with_overrides(&o).unwrap();
        assert_eq!(t.min_ratio, 2.0);
        assert_eq!(t.window, Duration::from_secs(7));
        assert_eq!(t.quantiles, base.quantiles);
        assert_eq!(base.with_overrides(&toml::Table::new()).unwrap(), base);
        let bad: toml::Table = toml::from_str("open_window = 65").unwrap();
        assert_eq!(base.with_overrides(&bad).unwrap_err().key, "open_window");
    }
}
