//! tailtrap's shared data model: what the crates hand each other along
//! bpf → detector → capture → storage → agent.
//!
//! - [`Probe`] and [`Path`]: the receive-path measurement points, with [`Probe::hooks`], the
//!   one table of the kernel functions and tracepoints behind each ([`KernelHooks`]).
//! - [`hist`]: the log-linear bucket scheme and [`Histogram`], the type the BPF side's
//!   maps are read into and the detector computes on.
//! - [`Sample`] and [`Flow`]: the record of one slow SKB, decoded from the kernel, kept by
//!   the flight recorder, stored per incident.
//!
//! It exists so that these types have one home with no machinery attached: the BPF loader
//! and the store depend on it without pulling in pwru's process handling or the detector's
//! statistics. Plain data and pure functions only; no I/O. [`config`] holds the one type
//! every crate reports configuration problems with. With the `fixtures` feature,
//! [`fixtures`] builds samples for other crates' tests.
#![deny(missing_docs)]

pub mod config;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod hist;
mod probe;
mod sample;
mod verdict;

pub use hist::{HistError, Histogram};
pub use probe::{KernelHooks, Path, Probe};
pub use sample::{
    Comm, CommTooLong, CpuHolder, Flow, ReaderWait, Sample, SampleFlags, SocketQueue, Transport,
    COMM_MAX,
};
pub use verdict::Verdict;

/// Longest service name, bytes: the store keys records by it with one length byte, and the
/// config check refuses longer names up front.
pub const MAX_SERVICE_LEN: usize = 128;

/// `t` as ns since the Unix epoch (0 before it, saturating far after), the time unit every
/// stored record and API answer uses.
pub fn unix_ns(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A quantile as people write it: `p99`, `p99.9`, `p50`.
pub fn quantile_name(q: f64) -> String {
    let pct = q * 100.0;
    // Round away float noise (0.999 * 100 = 99.899999...).
    let pct = (pct * 1000.0).round() / 1000.0;
    format!("p{pct}")
}

/// Format nanoseconds for humans: `850ns`, `12.3µs`, `4.56ms`, `1.20s`.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "-".into();
    }
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e6 {
        format!("{:.1}µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_quantiles_and_times() {
        assert_eq!(quantile_name(0.99), "p99");
        assert_eq!(quantile_name(0.999), "p99.9");
        assert_eq!(quantile_name(0.5), "p50");
        assert_eq!(fmt_ns(850.0), "850ns");
        assert_eq!(fmt_ns(12_340.0), "12.3µs");
        assert_eq!(fmt_ns(4_560_000.0), "4.56ms");
        assert_eq!(fmt_ns(1.2e9), "1.20s");
    }
}
