//! The `[capture]` table: in-kernel capture of slow SKBs while an incident is open, and the
//! always-on flight recorder. The daemon reads it; the kernel side applies it.

use std::time::Duration;

use model::config::{KeyProblem, Validate};
use serde::{Deserialize, Serialize};

/// The commented defaults of `[capture]`, part of `tailtrap config defaults`.
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// A capture threshold: a quantile of the service's learned baseline at the probe, or a
/// fixed latency. Written `"p99"`, `"p99.9"` or a duration such as `"2ms"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Threshold {
    /// The baseline's value of this quantile, in (0, 1).
    Quantile(f64),
    /// A fixed latency.
    Latency(Duration),
}

impl std::str::FromStr for Threshold {
    type Err = String;
    fn from_str(s: &str) -> Result<Threshold, String> {
        if let Some(pct) = s.strip_prefix('p') {
            let q = pct
                .parse::<f64>()
                .ok()
                // Through whole millionths of a percent, so "p99.9" is exactly 0.999.
                .map(|p| (p * 1e6).round() / 1e8)
                .filter(|q| *q > 0.0 && *q < 1.0)
                .ok_or_else(|| format!("{s:?} is not a quantile like \"p99\" or \"p99.9\""))?;
            return Ok(Threshold::Quantile(q));
        }
        match humantime::parse_duration(s) {
            Ok(d) if !d.is_zero() => Ok(Threshold::Latency(d)),
            _ => Err(format!(
                "{s:?} is neither a quantile (\"p99\") nor a latency (\"2ms\")"
            )),
        }
    }
}

impl TryFrom<String> for Threshold {
    type Error = String;
    fn try_from(s: String) -> Result<Threshold, String> {
        s.parse()
    }
}

impl From<Threshold> for String {
    fn from(t: Threshold) -> String {
        t.to_string()
    }
}

impl std::fmt::Display for Threshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Threshold::Quantile(q) => write!(f, "p{}", q * 100.0),
            Threshold::Latency(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// The `[capture]` table: in-kernel capture of slow SKBs during incidents, and the flight
/// recorder that keeps the seconds before one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Arm capture when an incident opens.
    pub enabled: bool,
    /// Record SKBs slower than this at the incident's hot probes.
    pub threshold: Threshold,
    /// Keep one record in N slow SKBs (1: all).
    pub sample_one_in: u32,
    /// In-kernel token bucket: records per second at most, all services together.
    pub rate_limit: u32,
    /// Disarm after this long even if the incident is still open.
    #[serde(with = "humantime_serde")]
    pub max_time: Duration,
    /// Disarm after this many samples of one incident.
    pub max_samples: u64,
    /// Flight recorder: always on, records SKBs slower than this.
    pub flight_threshold: Threshold,
    /// Flight recorder: records per second at most.
    pub flight_rate: u32,
    /// Flight recorder: how far back it keeps samples.
    #[serde(with = "humantime_serde")]
    pub flight_window: Duration,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            enabled: true,
            threshold: Threshold::Quantile(0.99),
            sample_one_in: 1,
            rate_limit: 2000,
            max_time: Duration::from_secs(120),
            max_samples: 20_000,
            flight_threshold: Threshold::Quantile(0.999),
            flight_rate: 20,
            flight_window: Duration::from_secs(120),
        }
    }
}

impl Validate for CaptureConfig {
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = Vec::new();
        let positive = [
            ("sample_one_in", u64::from(self.sample_one_in)),
            ("rate_limit", u64::from(self.rate_limit)),
            ("max_samples", self.max_samples),
            ("flight_rate", u64::from(self.flight_rate)),
        ];
        for (key, v) in positive {
            if v == 0 {
                problems.push(KeyProblem::new(key, "must be at least 1"));
            }
        }
        for (key, v) in [
            ("max_time", self.max_time),
            ("flight_window", self.flight_window),
        ] {
            if v.is_zero() {
                problems.push(KeyProblem::new(key, "must be longer than zero"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(CaptureConfig::default().validate(), []);
        let c = CaptureConfig {
            rate_limit: 0,
            flight_window: Duration::ZERO,
            ..CaptureConfig::default()
        };
        let keys: Vec<String> = c.validate().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["rate_limit", "flight_window"]);
    }

    #[test]
    fn thresholds_read_and_print() {
        for (text, t) in [
            ("p99", Threshold::Quantile(0.99)),
            ("p99.9", Threshold::Quantile(0.999)),
            ("2ms", Threshold::Latency(Duration::from_millis(2))),
        ] {
            let parsed: Threshold = text.parse().unwrap();
            match (parsed, t) {
                (Threshold::Quantile(a), Threshold::Quantile(b)) => {
                    assert!((a - b).abs() < 1e-12)
                }
                (a, b) => assert_eq!(a, b),
            }
        }
        assert!("0ms".parse::<Threshold>().is_err());
        assert!("p0".parse::<Threshold>().is_err());
        assert!("soon".parse::<Threshold>().is_err());
        assert_eq!(
            Threshold::Latency(Duration::from_millis(2)).to_string(),
            "2ms"
        );
    }
}
