//! Detector settings: the `[detector]` table of the daemon's TOML config file.
//!
//! Every key has a default (see [`DetectorConfig::default`] and docs/detector.md). Per-service
//! overrides live in `[detector.services.<name>]` with the same keys; static ceilings (SLOs) are
//! `[[detector.slo]]` entries. Bad values are rejected while parsing, with the key, the line and
//! the reason.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use model::Probe;

/// Settings of the detector (the `[detector]` table). The threshold keys here are the
/// defaults for every service; `[detector.services.<name>]` overrides them per service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectorConfig {
    /// Family-wise false-alarm probability per interval: the exact binomial tests of one
    /// interval (all services, probes, quantiles) are Holm-corrected to this level.
    #[serde(deserialize_with = "de::probability")]
    pub significance: f64,
    /// Watched quantiles, each in (0, 1).
    #[serde(deserialize_with = "de::quantiles")]
    pub quantiles: Vec<f64>,
    /// Smallest observed/baseline ratio of a quantile that counts as a shift (>= 1).
    #[serde(deserialize_with = "de::ratio")]
    pub min_ratio: f64,
    /// Smallest absolute growth of a quantile that counts as a shift.
    #[serde(with = "humantime_serde")]
    pub min_delta: Duration,
    /// Shortest evaluation window (the most recent intervals).
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "de::positive_duration"
    )]
    pub window: Duration,
    /// The window grows up to this long to gather `min_samples`.
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "de::positive_duration"
    )]
    pub max_window: Duration,
    /// Fewest samples a window must hold to be tested at all.
    #[serde(deserialize_with = "de::at_least_one")]
    pub min_samples: u64,
    /// Half-life of the baseline's memory: older intervals weigh half as much per half-life.
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "de::positive_duration"
    )]
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
    #[serde(deserialize_with = "de::count_1_u32")]
    pub close_after: u32,
    /// After an incident closes, no new one opens for the service during this time.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// An incident open this long is closed and the service's baselines start learning
    /// afresh: the shift has become the new normal (a deploy, new hardware).
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "de::positive_duration"
    )]
    pub max_incident: Duration,
    /// Per-service overrides, keyed by service name.
    pub services: BTreeMap<String, ThresholdOverrides>,
    /// Static ceilings: a quantile above `max` is always an incident.
    pub slo: Vec<Slo>,
}

/// The thresholds in force for one service (the defaults with its overrides applied); see
/// the keys of [`DetectorConfig`] for what each means.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Thresholds {
    pub quantiles: Vec<f64>,
    pub min_ratio: f64,
    pub min_delta: Duration,
    pub window: Duration,
    pub max_window: Duration,
    pub min_samples: u64,
    pub half_life: Duration,
    pub warmup_samples: u64,
    pub warmup_time: Duration,
    pub open_after: u32,
    pub open_window: u32,
    pub close_after: u32,
    pub cooldown: Duration,
    pub max_incident: Duration,
}

/// Per-service overrides: the threshold keys of [`DetectorConfig`], each optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThresholdOverrides {
    /// See [`DetectorConfig::quantiles`].
    #[serde(
        deserialize_with = "de::opt_quantiles",
        skip_serializing_if = "Option::is_none"
    )]
    pub quantiles: Option<Vec<f64>>,
    /// See [`DetectorConfig::min_ratio`].
    #[serde(
        deserialize_with = "de::opt_ratio",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_ratio: Option<f64>,
    /// See [`DetectorConfig::min_delta`].
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_delta: Option<Duration>,
    /// See [`DetectorConfig::window`].
    #[serde(
        serialize_with = "humantime_serde::option::serialize",
        deserialize_with = "de::opt_positive_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub window: Option<Duration>,
    /// See [`DetectorConfig::max_window`].
    #[serde(
        serialize_with = "humantime_serde::option::serialize",
        deserialize_with = "de::opt_positive_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_window: Option<Duration>,
    /// See [`DetectorConfig::min_samples`].
    #[serde(
        deserialize_with = "de::opt_at_least_one",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_samples: Option<u64>,
    /// See [`DetectorConfig::half_life`].
    #[serde(
        serialize_with = "humantime_serde::option::serialize",
        deserialize_with = "de::opt_positive_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub half_life: Option<Duration>,
    /// See [`DetectorConfig::warmup_samples`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_samples: Option<u64>,
    /// See [`DetectorConfig::warmup_time`].
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub warmup_time: Option<Duration>,
    /// See [`DetectorConfig::open_after`].
    #[serde(
        deserialize_with = "de::opt_count_1_64",
        skip_serializing_if = "Option::is_none"
    )]
    pub open_after: Option<u32>,
    /// See [`DetectorConfig::open_window`].
    #[serde(
        deserialize_with = "de::opt_count_1_64",
        skip_serializing_if = "Option::is_none"
    )]
    pub open_window: Option<u32>,
    /// See [`DetectorConfig::close_after`].
    #[serde(
        deserialize_with = "de::opt_count_1_u32",
        skip_serializing_if = "Option::is_none"
    )]
    pub close_after: Option<u32>,
    /// See [`DetectorConfig::cooldown`].
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub cooldown: Option<Duration>,
    /// See [`DetectorConfig::max_incident`].
    #[serde(
        serialize_with = "humantime_serde::option::serialize",
        deserialize_with = "de::opt_positive_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_incident: Option<Duration>,
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
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "de::positive_duration"
    )]
    pub max: Duration,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            significance: 1e-4,
            quantiles: vec![0.5, 0.9, 0.99, 0.999],
            min_ratio: 1.25,
            min_delta: Duration::from_micros(20),
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
            services: BTreeMap::new(),
            slo: Vec::new(),
        }
    }
}

/// A rejected config: where, which key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {}{reason}", line.map(|l| format!(", line {l}")).unwrap_or_default(), key.as_ref().map(|k| format!("key `{k}`: ")).unwrap_or_default())]
pub struct ConfigError {
    /// The file (or other origin) the text came from.
    pub origin: String,
    /// 1-based line of the offending key or value, when known.
    pub line: Option<usize>,
    /// Dotted path of the offending key, when known (e.g. `detector.services.web.min_ratio`).
    pub key: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// The whole daemon config file; only `[detector]` is read here.
#[derive(Deserialize)]
struct DaemonFile {
    #[serde(default)]
    detector: DetectorConfig,
}

impl DetectorConfig {
    /// Parse a whole daemon config file and return its `[detector]` table (defaults when the
    /// table is absent). Other top-level tables are ignored: the daemon checks those.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<DetectorConfig, ConfigError> {
        let file: DaemonFile = parse_toml(text, origin)?;
        let cfg = file.detector;
        cfg.validate().map_err(|(key, reason)| ConfigError {
            origin: origin.to_string(),
            line: locate_key(text, &key),
            key: Some(key),
            reason,
        })?;
        Ok(cfg)
    }

    /// The thresholds in force for `service`: the defaults with its overrides applied.
    pub(crate) fn thresholds(&self, service: &str) -> Thresholds {
        let mut t = self.base_thresholds();
        if let Some(o) = self.services.get(service) {
            o.apply(&mut t);
        }
        t
    }

    fn base_thresholds(&self) -> Thresholds {
        Thresholds {
            quantiles: self.quantiles.clone(),
            min_ratio: self.min_ratio,
            min_delta: self.min_delta,
            window: self.window,
            max_window: self.max_window,
            min_samples: self.min_samples,
            half_life: self.half_life,
            warmup_samples: self.warmup_samples,
            warmup_time: self.warmup_time,
            open_after: self.open_after,
            open_window: self.open_window,
            close_after: self.close_after,
            cooldown: self.cooldown,
            max_incident: self.max_incident,
        }
    }

    /// Checks that span several keys (single values are checked while parsing). Returns the
    /// dotted key and the reason.
    fn validate(&self) -> Result<(), (String, String)> {
        check_thresholds(&self.base_thresholds(), "detector")?;
        for name in self.services.keys() {
            let prefix = format!("detector.services.{}", toml_key(name));
            check_thresholds(&self.thresholds(name), &prefix)?;
        }
        Ok(())
    }
}

impl ThresholdOverrides {
    fn apply(&self, t: &mut Thresholds) {
        if let Some(v) = &self.quantiles {
            t.quantiles.clone_from(v);
        }
        macro_rules! set {
            ($($f:ident),*) => { $(if let Some(v) = self.$f { t.$f = v; })* };
        }
        set!(
            min_ratio,
            min_delta,
            window,
            max_window,
            min_samples,
            half_life,
            warmup_samples,
            warmup_time,
            open_after,
            open_window,
            close_after,
            cooldown,
            max_incident
        );
    }
}

fn check_thresholds(t: &Thresholds, prefix: &str) -> Result<(), (String, String)> {
    if t.open_after > t.open_window {
        return Err((
            format!("{prefix}.open_after"),
            format!(
                "open_after ({}) must not exceed open_window ({})",
                t.open_after, t.open_window
            ),
        ));
    }
    if t.window > t.max_window {
        return Err((
            format!("{prefix}.max_window"),
            format!(
                "max_window ({}) must not be shorter than window ({})",
                humantime::format_duration(t.max_window),
                humantime::format_duration(t.window)
            ),
        ));
    }
    Ok(())
}

/// Quote a TOML key only when it needs it.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

/// Deserialize TOML text, turning errors into [`ConfigError`] with line and key path. Shared
/// with the scenario files.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
) -> Result<T, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ConfigError {
            origin: origin.to_string(),
            line,
            key: (path != "." && !path.is_empty()).then_some(path),
            reason: inner.message().trim().to_string(),
        }
    })
}

/// Best-effort line of a dotted key (`a.b.c`): the `c = ...` line inside table `[a.b]`.
fn locate_key(text: &str, dotted: &str) -> Option<usize> {
    let (table, key) = dotted.rsplit_once('.')?;
    let mut current = String::new();
    let mut table_line = None;
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(h) = l.strip_prefix('[') {
            current = h
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .replace(' ', "");
            if current == table {
                table_line = Some(n + 1);
            }
            continue;
        }
        if current == table {
            if let Some(rest) = l.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return Some(n + 1);
                }
            }
        }
    }
    table_line
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

    fn is_at_least_one(n: &u64) -> Result<(), String> {
        if *n >= 1 {
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

    fn is_count_1_u32(n: &u32) -> Result<(), String> {
        if *n >= 1 {
            Ok(())
        } else {
            Err("must be at least 1".into())
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

    pub fn opt_quantiles<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
        check(d, |v: &Vec<f64>| is_quantile_list(v)).map(Some)
    }

    pub fn ratio<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        check(d, is_ratio)
    }

    pub fn opt_ratio<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        check(d, is_ratio).map(Some)
    }

    pub fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        check(d, is_at_least_one)
    }

    pub fn opt_at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        check(d, is_at_least_one).map(Some)
    }

    pub fn count_1_64<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        check(d, is_count_1_64)
    }

    pub fn opt_count_1_64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        check(d, is_count_1_64).map(Some)
    }

    pub fn count_1_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        check(d, is_count_1_u32)
    }

    pub fn opt_count_1_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        check(d, is_count_1_u32).map(Some)
    }

    pub fn positive_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v: Duration = humantime_serde::deserialize(d)?;
        if v.is_zero() {
            return Err(D::Error::custom("duration must be longer than zero"));
        }
        Ok(v)
    }

    pub fn opt_positive_duration<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        positive_duration(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults_and_other_tables_are_ignored() {
        let cfg = DetectorConfig::from_toml_str("", "t.toml").unwrap();
        assert_eq!(cfg, DetectorConfig::default());
        let text = "[daemon]\ninterval = \"1s\"\nwhatever = 3\n";
        let cfg = DetectorConfig::from_toml_str(text, "t.toml").unwrap();
        assert_eq!(cfg, DetectorConfig::default());
    }

    #[test]
    fn overrides_and_slos_parse() {
        let text = r#"
[detector]
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
        let cfg = DetectorConfig::from_toml_str(text, "t.toml").unwrap();
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
        assert_eq!(DetectorConfig::from_toml_str(&text, "d").unwrap(), cfg);
    }

    fn err(text: &str) -> ConfigError {
        DetectorConfig::from_toml_str(text, "/etc/tailtrap/tailtrap.toml").unwrap_err()
    }

    #[test]
    fn bad_values_name_key_line_and_reason() {
        let e = err("[detector]\nquantiles = [0.5, 1.5]\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert_eq!(e.key.as_deref(), Some("detector.quantiles"), "{e}");
        assert!(e.reason.contains("outside (0, 1)"), "{e}");
        assert!(
            e.to_string()
                .starts_with("/etc/tailtrap/tailtrap.toml, line 2: key `detector.quantiles`"),
            "{e}"
        );

        let e = err("[detector]\n\n[detector.services.web]\nmin_ratio = 0.8\n");
        assert_eq!(e.line, Some(4), "{e}");
        assert_eq!(e.key.as_deref(), Some("detector.services.web.min_ratio"));
        assert!(e.reason.contains(">= 1"), "{e}");

        let e = err("[detector]\nwindow = \"soon\"\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert_eq!(e.key.as_deref(), Some("detector.window"));

        let e = err("[detector]\nfrobnicate = 1\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.reason.contains("frobnicate"), "{e}");

        let e = err("[[detector.slo]]\nprobe = \"tcp-read\"\nquantile = 0.99\nmax = \"5ms\"\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.reason.contains("tcp-read"), "{e}");
    }

    #[test]
    fn cross_key_checks_name_the_key() {
        let e = err("[detector]\n\n[detector.services.db]\nopen_after = 6\n");
        assert_eq!(e.key.as_deref(), Some("detector.services.db.open_after"));
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.reason.contains("must not exceed open_window (5)"), "{e}");

        let e = err("[detector]\nmax_window = \"2s\"\n");
        assert_eq!(e.key.as_deref(), Some("detector.max_window"));
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let e = err("[detector]\nmin_ratio = = 2\n");
        assert_eq!(e.line, Some(2), "{e}");
    }
}
