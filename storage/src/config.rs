//! Store settings: flush cadence, retention per kind, size budget, history resolutions.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use model::config::{KeyProblem, Validate};

/// One resolution of the histogram history: intervals are merged into `resolution`-wide
/// points kept for `keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryLevel {
    /// Width of one stored point.
    #[serde(with = "humantime_serde")]
    pub resolution: Duration,
    /// How long points at this resolution are kept.
    #[serde(with = "humantime_serde")]
    pub keep: Duration,
}

/// The commented defaults of `[storage]`, part of `tailtrap config defaults`.
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// Settings of the store (the `[storage]` table). Every field has a default; see
/// docs/storage.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// How often the engine flushes in the background: the bound on how long an
    /// acknowledged sample batch can stay volatile. Must be at most 1 s.
    #[serde(with = "humantime_serde")]
    pub flush_every: Duration,
    /// Closed incidents (with their samples and pwru records) older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub incident_keep: Duration,
    /// Samples of closed incidents older than this are deleted (the incident stays).
    #[serde(with = "humantime_serde")]
    pub sample_keep: Duration,
    /// pwru records of closed incidents older than this are deleted (the incident stays).
    #[serde(with = "humantime_serde")]
    pub pwru_keep: Duration,
    /// History resolutions, finest first; each resolution a multiple of the previous one.
    pub history: Vec<HistoryLevel>,
    /// Budget for the live data, bytes. Over it, the oldest closed incidents go first, then
    /// the oldest history.
    pub max_bytes: u64,
    /// Rotate into a fresh database when the on-disk size exceeds this many times the live
    /// data (and `rotate_min_bytes`).
    pub max_amplification: f64,
    /// Never rotate a database smaller than this on disk, nor one within
    /// `max_amplification` × `max_bytes` (whichever is smaller).
    pub rotate_min_bytes: u64,
    /// The engine's memory, bytes: sled's page cache, and how much may go through the
    /// engine (written, removed or read) before the store reopens it to free what sled
    /// keeps regardless of its cache's size; also how far the process's heap may grow
    /// since the engine opened, when the store watches it (`Store::watch_heap`).
    pub cache_bytes: u64,
    /// Free space to leave on the database's file system, bytes: below it, samples, pwru
    /// lines and history are refused (counted as disk-full errors) while incidents can
    /// still be opened and closed. sled recovers badly from a write that hits a full disk,
    /// so tailtrap stops short of it. 0 turns the check off.
    pub min_free_bytes: u64,
}

/// Passes over whole trees read at least this much between two engine reopens: each
/// reopen costs tens of ms, so smaller windows made opening a large database several
/// times slower for a peak memory barely lower, and only for as long as the pass
/// (docs/reliability.md, "Long passes: bounded by windows").
const PASS_WINDOW_MIN_BYTES: u64 = 4 << 20;

impl StoreConfig {
    /// How much a pass over a whole tree (opening's check, `db check`, rotation, deleting
    /// an incident's records, trimming history) reads between two engine reopens:
    /// `cache_bytes`, at least [`PASS_WINDOW_MIN_BYTES`].
    pub(crate) fn pass_window_bytes(&self) -> u64 {
        self.cache_bytes.max(PASS_WINDOW_MIN_BYTES)
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        StoreConfig {
            flush_every: Duration::from_millis(500),
            incident_keep: Duration::from_secs(30 * DAY),
            sample_keep: Duration::from_secs(30 * DAY),
            pwru_keep: Duration::from_secs(30 * DAY),
            history: vec![
                HistoryLevel {
                    resolution: Duration::from_secs(1),
                    keep: Duration::from_secs(6 * 3600),
                },
                HistoryLevel {
                    resolution: Duration::from_secs(10),
                    keep: Duration::from_secs(3 * DAY),
                },
                HistoryLevel {
                    resolution: Duration::from_secs(60),
                    keep: Duration::from_secs(30 * DAY),
                },
            ],
            max_bytes: 1 << 30,
            max_amplification: 4.0,
            rotate_min_bytes: 256 << 20,
            // The trade-off: RSS swings by about this much between reopens, and each
            // reopen stalls the engine's writers for tens of ms. In soaks side by side
            // 512 KiB gave the lowest mean RSS at no measurable CPU, and 256 KiB only
            // reopened more often (docs/reliability.md, "Per-thread caches", "A smaller
            // engine").
            cache_bytes: 512 << 10,
            min_free_bytes: 128 << 20,
        }
    }
}

/// Most history levels (the level number is one key byte; a handful is plenty).
pub const MAX_HISTORY_LEVELS: usize = 8;

impl Validate for StoreConfig {
    /// The ranges and the history's shape; single values are checked while parsing.
    fn validate(&self) -> Vec<KeyProblem> {
        let mut problems = Vec::new();
        let mut bad = |key: &str, reason: String| problems.push(KeyProblem::new(key, reason));
        if self.flush_every.is_zero() || self.flush_every > Duration::from_secs(1) {
            bad(
                "flush_every",
                format!(
                    "{} is outside (0, 1s]: acknowledged writes must be durable within 1 s",
                    humantime::format_duration(self.flush_every)
                ),
            );
        }
        for (key, d) in [
            ("incident_keep", self.incident_keep),
            ("sample_keep", self.sample_keep),
            ("pwru_keep", self.pwru_keep),
        ] {
            if d.is_zero() {
                bad(key, "must be longer than zero".into());
            }
        }
        if self.history.is_empty() || self.history.len() > MAX_HISTORY_LEVELS {
            bad(
                "history",
                format!(
                    "needs 1 to {MAX_HISTORY_LEVELS} levels, got {}",
                    self.history.len()
                ),
            );
        }
        let mut prev: Option<&HistoryLevel> = None;
        for (i, level) in self.history.iter().enumerate() {
            let key = format!("history[{i}]");
            if level.resolution < Duration::from_millis(1)
                || level.resolution.subsec_nanos() % 1_000_000 != 0
            {
                bad(
                    &key,
                    "resolution must be a whole number of milliseconds".into(),
                );
            } else if level.keep < level.resolution {
                bad(&key, "keep is shorter than the resolution".into());
            } else if let Some(p) = prev {
                if level.resolution <= p.resolution
                    || level.resolution.as_nanos() % p.resolution.as_nanos() != 0
                {
                    bad(
                        &key,
                        "resolution must be a larger multiple of the previous level's".into(),
                    );
                }
            }
            prev = Some(level);
        }
        if self.max_bytes < 1 << 20 {
            bad("max_bytes", "must be at least 1 MiB".into());
        }
        // Each `cache_bytes` written reopens the engine: a tiny value would reopen it at
        // every write, and 256 KiB already reopened it more often than 512 KiB for no
        // memory saved (docs/reliability.md, "A smaller engine").
        if self.cache_bytes < 256 << 10 {
            bad("cache_bytes", "must be at least 256 KiB".into());
        }
        if !(self.max_amplification.is_finite() && self.max_amplification >= 1.5) {
            bad("max_amplification", "must be a number >= 1.5".into());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(StoreConfig::default().validate(), []);
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut c = StoreConfig {
            flush_every: Duration::from_secs(2),
            ..StoreConfig::default()
        };
        assert!(c.validate()[0].to_string().contains("`flush_every`"));
        c.flush_every = Duration::from_millis(200);
        c.history[1].resolution = Duration::from_secs(7);
        assert!(c.validate()[0].to_string().contains("`history[2]`"));
        c.history[1].resolution = Duration::from_millis(500);
        assert!(c.validate()[0].to_string().contains("`history[1]`"));
    }

    #[test]
    fn cache_bytes_under_256_kib_is_refused() {
        let mut c = StoreConfig {
            cache_bytes: (256 << 10) - 1,
            ..StoreConfig::default()
        };
        let problems = c.validate();
        assert_eq!(problems.len(), 1, "{problems:?}");
        let msg = problems[0].to_string();
        assert!(
            msg.contains("`cache_bytes`") && msg.contains("at least 256 KiB"),
            "{msg}"
        );
        c.cache_bytes = 256 << 10;
        assert_eq!(c.validate(), []);
    }
}
