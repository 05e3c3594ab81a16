//! The `[pwru]` settings as they appear in tailtrap's configuration, checked when loaded.
//!
//! Each key is checked by its own deserializer, so a bad value is reported at its key's
//! line by the configuration loader.

use std::path::{Path, PathBuf};
use std::time::Duration;

use model::config::Validate;
use model::Probe;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use super::request::{
    check_attach_timeout, check_deadline, check_kill_grace, check_output_limit, FilterFuncs,
    SessionLimits, MAX_ADDRS,
};
use super::session::ManagerConfig;

/// The commented defaults of `[pwru]`, part of `tailtrap config defaults`.
pub const DEFAULTS_TOML: &str = include_str!("defaults.toml");

/// pwru settings. Every key has a default, so an empty or missing `[pwru]` table works.
///
/// ```toml
/// [pwru]
/// enabled = true
/// binary = "/usr/local/bin/pwru"   # default: `pwru` on PATH
/// functions = ["tcp_v4_rcv", "tcp_queue_rcv"]   # default: probed functions + drop points
/// attach_timeout = "60s"
/// deadline = "30s"
/// kill_grace = "5s"
/// output_limit_lines = 5000
/// cooldown = "10m"
/// max_peers = 8
/// runtime_dir = "/run/tailtrap"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RawPwruConfig", into = "RawPwruConfig")]
pub struct PwruConfig {
    enabled: bool,
    binary: Option<PathBuf>,
    functions: Option<FilterFuncs>,
    limits: SessionLimits,
    cooldown: Duration,
    max_peers: usize,
    runtime_dir: PathBuf,
}

/// The file form; every field is checked as it is read.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawPwruConfig {
    enabled: bool,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_absolute"
    )]
    binary: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    functions: Option<FilterFuncs>,
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "deadline"
    )]
    deadline: Duration,
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "kill_grace"
    )]
    kill_grace: Duration,
    #[serde(
        serialize_with = "humantime_serde::serialize",
        deserialize_with = "attach_timeout"
    )]
    attach_timeout: Duration,
    #[serde(deserialize_with = "output_limit")]
    output_limit_lines: u64,
    #[serde(with = "humantime_serde")]
    cooldown: Duration,
    #[serde(deserialize_with = "max_peers")]
    max_peers: usize,
    #[serde(deserialize_with = "absolute")]
    runtime_dir: PathBuf,
}

/// A root daemon must not run or write whatever its working directory holds.
fn check_absolute<E: serde::de::Error>(key: &str, p: PathBuf) -> Result<PathBuf, E> {
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(E::custom(format!("{key} {p:?} must be an absolute path")))
    }
}

fn optional_absolute<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    check_absolute("binary", PathBuf::deserialize(d)?).map(Some)
}

fn absolute<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    check_absolute("runtime_dir", PathBuf::deserialize(d)?)
}

fn deadline<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    check_deadline(humantime_serde::deserialize(d)?).map_err(D::Error::custom)
}

fn kill_grace<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    check_kill_grace(humantime_serde::deserialize(d)?).map_err(D::Error::custom)
}

fn attach_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    check_attach_timeout(humantime_serde::deserialize(d)?).map_err(D::Error::custom)
}

fn output_limit<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    check_output_limit(u64::deserialize(d)?).map_err(D::Error::custom)
}

fn max_peers<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n <= MAX_ADDRS {
        Ok(n)
    } else {
        Err(D::Error::custom(format!(
            "max_peers {n} is out of range (0..={MAX_ADDRS})"
        )))
    }
}

impl Default for RawPwruConfig {
    fn default() -> Self {
        PwruConfig::default().into()
    }
}

impl Default for PwruConfig {
    /// Enabled, `pwru` from PATH, default functions and limits, 10 min cooldown, the top 8
    /// peers, ready files in /run/tailtrap.
    fn default() -> Self {
        let manager = ManagerConfig::default();
        PwruConfig {
            enabled: true,
            binary: None,
            functions: None,
            limits: SessionLimits::default(),
            cooldown: manager.cooldown,
            max_peers: 8,
            runtime_dir: manager.runtime_dir,
        }
    }
}

impl From<RawPwruConfig> for PwruConfig {
    fn from(r: RawPwruConfig) -> Self {
        PwruConfig {
            enabled: r.enabled,
            binary: r.binary,
            functions: r.functions,
            limits: SessionLimits::from_checked(r.deadline, r.kill_grace, r.output_limit_lines)
                .with_attach_timeout_checked(r.attach_timeout),
            cooldown: r.cooldown,
            max_peers: r.max_peers,
            runtime_dir: r.runtime_dir,
        }
    }
}

impl From<PwruConfig> for RawPwruConfig {
    fn from(c: PwruConfig) -> Self {
        RawPwruConfig {
            enabled: c.enabled,
            binary: c.binary,
            functions: c.functions,
            deadline: c.limits.deadline(),
            kill_grace: c.limits.kill_grace(),
            attach_timeout: c.limits.attach_timeout(),
            output_limit_lines: c.limits.output_limit_lines(),
            cooldown: c.cooldown,
            max_peers: c.max_peers,
            runtime_dir: c.runtime_dir,
        }
    }
}

/// Every value is checked while it is read; no rule spans several keys.
impl Validate for PwruConfig {}

impl PwruConfig {
    /// Whether sessions should run at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The configured binary (None: look for `pwru` on PATH).
    pub fn binary(&self) -> Option<&Path> {
        self.binary.as_deref()
    }

    /// The limits of each session.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// How many top remote peers narrow a session's filter (0: the ports alone).
    pub fn max_peers(&self) -> usize {
        self.max_peers
    }

    /// The functions to attach: the configured list, or those behind `hot_probes` (the
    /// probes an incident names) plus the drop points.
    pub fn filter_funcs(&self, hot_probes: &[Probe]) -> FilterFuncs {
        match &self.functions {
            Some(f) => f.clone(),
            None if hot_probes.is_empty() => FilterFuncs::default(),
            None => FilterFuncs::for_probes(hot_probes),
        }
    }

    /// The session manager's settings.
    pub fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            cooldown: self.cooldown,
            runtime_dir: self.runtime_dir.clone(),
            ..ManagerConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parse a file with a `[pwru]` table the way the daemon's configuration loader does.
    fn parse(file: &str) -> Result<PwruConfig, toml::de::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            #[serde(default)]
            pwru: PwruConfig,
        }
        toml::from_str::<File>(file).map(|f| f.pwru)
    }

    #[test]
    fn empty_table_is_the_defaults() {
        for file in ["", "[pwru]\n"] {
            assert_eq!(parse(file).unwrap(), PwruConfig::default());
        }
        let c = PwruConfig::default();
        assert!(c.enabled());
        assert_eq!(c.limits(), SessionLimits::default());
        assert_eq!(c.manager_config(), ManagerConfig::default());
        assert_eq!(c.max_peers(), 8);
        // Round trip through the file form.
        let text = format!("[pwru]\n{}", toml::to_string(&c).unwrap());
        assert_eq!(parse(&text).unwrap(), c);
    }

    #[test]
    fn values_are_checked() {
        let c = parse(
            r#"
            [pwru]
            binary = "/opt/pwru"
            deadline = "10s"
            cooldown = "1h"
            max_peers = 0
            functions = ["tcp_v4_rcv"]
            "#,
        )
        .unwrap();
        assert_eq!(c.binary(), Some(std::path::Path::new("/opt/pwru")));
        assert_eq!(c.limits().deadline(), Duration::from_secs(10));
        assert_eq!(c.manager_config().cooldown, Duration::from_secs(3600));
        assert_eq!(c.filter_funcs(&[Probe::UdpStart]).regex(), "^(tcp_v4_rcv)$");

        let cases = [
            (
                r#"binary = "pwru""#,
                r#"binary "pwru" must be an absolute path"#,
            ),
            (
                r#"runtime_dir = "run""#,
                r#"runtime_dir "run" must be an absolute path"#,
            ),
            ("max_peers = 17", "max_peers 17 is out of range (0..=16)"),
            (
                r#"deadline = "20min""#,
                "deadline 20m is out of range (100ms..=10min)",
            ),
            (
                r#"functions = ["a b"]"#,
                r#"filter function "a b" is not a kernel symbol name"#,
            ),
            (r#"dedline = "1s""#, "unknown field `dedline`"),
        ];
        for (bad, msg) in cases {
            let e = parse(&format!("[pwru]\n{bad}\n")).unwrap_err().to_string();
            assert!(e.contains(msg), "{bad}: {e}");
            // The loader's message points at the key's line.
            assert!(e.starts_with("TOML parse error at line 2, "), "{bad}: {e}");
        }
    }

    #[test]
    fn functions_follow_the_hot_probes() {
        let c = PwruConfig::default();
        assert_eq!(
            c.filter_funcs(&[Probe::TcpSocketRead]).names(),
            [
                "ip_rcv_core",
                "ip_local_deliver",
                "ip6_rcv_core",
                "ip6_input",
                "tcp_v4_rcv",
                "tcp_v6_rcv",
                "tcp_rcv_established",
                "tcp_data_queue",
                "tcp_queue_rcv",
                "tcp_eat_recv_skb",
                "skb_attempt_defer_free",
                "__kfree_skb",
                "consume_skb",
                "kfree_skb_reason",
                "sk_skb_reason_drop"
            ]
        );
        assert_eq!(c.filter_funcs(&[]), FilterFuncs::default());
    }
}
