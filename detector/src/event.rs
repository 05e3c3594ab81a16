//! What the detector reports: incidents, the evidence behind them, and which stage grew.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use model::Probe;

/// A change of an incident, in the order they happen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", content = "incident", rename_all = "snake_case")]
pub enum Event {
    /// A service's tail moved: enough hot windows among the recent ones.
    Opened(Incident),
    /// More probes became hot, or the shift grew by half again since the last event.
    Updated(Incident),
    /// Enough consecutive cool windows; `closed_at` is set.
    Closed(Incident),
    /// A shift met the opening rules but is below `incident_ratio` and has not lasted
    /// `notice_for`: shown in status, /metrics and the log, never alerted on. Sent once per
    /// shift; if it grows or persists, an Opened event follows.
    Noticed(Notice),
}

impl Event {
    /// The incident as of this event (`None` for a notice).
    pub fn incident(&self) -> Option<&Incident> {
        match self {
            Event::Opened(i) | Event::Updated(i) | Event::Closed(i) => Some(i),
            Event::Noticed(_) => None,
        }
    }
}

/// A small shift, seen and let be (see [`Event::Noticed`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    /// The service.
    pub service: String,
    /// Start of the first hot window of the shift.
    #[serde(with = "humantime_serde")]
    pub first_hot_at: SystemTime,
    /// End of the interval that met the opening rules.
    #[serde(with = "humantime_serde")]
    pub noticed_at: SystemTime,
    /// The strongest shift at that point.
    pub headline: Evidence,
    /// Which stage grew, at the headline's quantile.
    pub stage: Option<StageAttribution>,
}

/// One incident: a service whose tail latency moved. At most one is open per service, so
/// `(service, opened_at)` identifies it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// The service.
    pub service: String,
    /// Every probe that was hot at some point of the incident, in path order.
    pub probes: Vec<Probe>,
    /// Start of the first hot window that led to the opening.
    #[serde(with = "humantime_serde")]
    pub first_hot_at: SystemTime,
    /// End of the interval whose window made the incident open.
    #[serde(with = "humantime_serde")]
    pub opened_at: SystemTime,
    /// End of the interval of the latest evidence.
    #[serde(with = "humantime_serde")]
    pub updated_at: SystemTime,
    /// When it closed (`None` while open).
    #[serde(with = "humantime_serde", default)]
    pub closed_at: Option<SystemTime>,
    /// Why it closed (`None` while open).
    #[serde(default)]
    pub close_reason: Option<CloseReason>,
    /// The strongest shift: the hot (probe, quantile) with the largest ratio.
    pub headline: Evidence,
    /// The latest evidence of each hot probe.
    pub evidence: Vec<Evidence>,
    /// Which stage grew, at the headline's quantile (when the path has data to compare).
    pub stage: Option<StageAttribution>,
}

impl Incident {
    /// The stage its time went to, `-` when none could be attributed.
    pub fn stage_name(&self) -> &str {
        self.stage.as_ref().map_or("-", |s| s.verdict.as_str())
    }

    /// What identifies this incident in every event about it.
    pub fn key(&self) -> IncidentKey {
        IncidentKey {
            service: self.service.clone(),
            opened_at: self.opened_at,
        }
    }
}

/// The identity of an incident: its service and when it opened (at most one is open per
/// service, and `opened_at` never changes after the Opened event).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IncidentKey {
    /// The service.
    pub service: String,
    /// When it opened.
    pub opened_at: SystemTime,
}

/// Why an incident closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CloseReason {
    /// `close_after` consecutive cool windows: latency went back to its baseline.
    Recovered,
    /// Open for `max_incident`: the shift is taken as the new normal and the service's
    /// baselines learn afresh (warm-up included).
    NewNormal,
}

/// Why a probe is hot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceKind {
    /// The quantile moved against the learned baseline (significant, large enough).
    Shift,
    /// The quantile is above a configured static ceiling (`baseline` is the ceiling).
    Slo,
}

/// A latency value with the bucket bounds it is known within.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Point estimate (interpolated inside the bucket), ns.
    pub value_ns: f64,
    /// Inclusive lower bound of its bucket, ns.
    pub lower_ns: u64,
    /// Exclusive upper bound of its bucket, ns.
    pub upper_ns: u64,
}

/// The figures behind one hot (probe, quantile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The probe.
    pub probe: Probe,
    /// The quantile tested, e.g. 0.99.
    pub quantile: f64,
    /// Learned shift or static ceiling.
    pub kind: EvidenceKind,
    /// The baseline's value of the quantile (the ceiling for an SLO).
    pub baseline: Estimate,
    /// The window's value of the quantile.
    pub observed: Estimate,
    /// `observed / baseline`.
    pub ratio: f64,
    /// Exact binomial p-value of the exceedances (before the Holm correction; `None` for an
    /// SLO, which needs no test).
    pub p_value: Option<f64>,
    /// Samples in the window.
    pub window_samples: u64,
    /// Window samples in buckets above the baseline's quantile bucket.
    pub exceedances: u64,
    /// Exceedances the baseline predicts for this many samples.
    pub expected_exceedances: f64,
    /// Effective (decayed) number of samples in the baseline.
    pub baseline_samples: f64,
    /// Start of the window.
    #[serde(with = "humantime_serde")]
    pub window_start: SystemTime,
}

impl Evidence {
    /// One line for logs, tables and alerts: `tcp-socket-read p99 120.0µs -> 21.00ms (175.0x)`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {} -> {} ({:.1}x)",
            self.probe,
            model::quantile_name(self.quantile),
            model::fmt_ns(self.baseline.value_ns),
            model::fmt_ns(self.observed.value_ns),
            self.ratio
        )
    }
}

/// A stage: the span between two probes on a receive path (or up to the first measured
/// probe), or one send probe's own interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    /// Probe at the start of the stage (`None`: from the packet's arrival timestamp).
    pub from: Option<Probe>,
    /// Probe at the end of the stage.
    pub to: Probe,
}

impl Stage {
    /// What operators call this stage.
    pub fn name(&self) -> String {
        use Probe::*;
        match (self.from, self.to) {
            (None, SendToQdisc) => "send queueing (send call to device queue)".into(),
            (None, QdiscSojourn) => "qdisc (device queue to driver)".into(),
            (None, NicToStack) => "NIC to stack (hardware stamp to kernel stamp)".into(),
            (None, DriverToCompletion) => "transmit completion (driver to release)".into(),
            (None, IpStart) => "driver and softirq (arrival to IP)".into(),
            (None, to) => format!("arrival to {to} (earlier probes not measured)"),
            (Some(IpStart), TcpStart | UdpStart) => "IP layer".into(),
            (Some(TcpStart), TcpSocketEnqueued) => "TCP processing".into(),
            (Some(UdpStart), UdpSocketEnqueued) => "UDP processing".into(),
            (Some(TcpSocketEnqueued), TcpSocketRead) | (Some(UdpSocketEnqueued), UdpSocketRead) => {
                "application read delay".into()
            }
            (Some(from), to) => format!("{from} to {to}"),
        }
    }
}

/// Which stage grew most, with the figures per probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageAttribution {
    /// The quantile compared (the headline's).
    pub quantile: f64,
    /// The stage that contributes most of the growth.
    pub stage: Stage,
    /// Its name, e.g. "application read delay".
    pub verdict: String,
    /// One row per measured probe on the path, in path order.
    pub stages: Vec<StageShift>,
}

/// Growth of one stage: how much more the quantile moved at `stage.to` than at `stage.from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageShift {
    /// The stage.
    pub stage: Stage,
    /// Baseline quantile at `stage.to`, ns.
    pub baseline_ns: f64,
    /// Window quantile at `stage.to`, ns.
    pub observed_ns: f64,
    /// `observed_ns - baseline_ns` at `stage.to` (cumulative up to this probe), ns.
    pub shift_ns: f64,
    /// This stage's own growth: `shift_ns` minus the shift at `stage.from`, ns.
    pub stage_shift_ns: f64,
}

/// Per-probe quantile values on a path, probes in path order: `(probe, baseline, observed)`.
pub(crate) fn attribute(quantile: f64, path: &[(Probe, f64, f64)]) -> Option<StageAttribution> {
    let mut stages = Vec::with_capacity(path.len());
    let mut prev: Option<(Probe, f64)> = None;
    for &(probe, base, obs) in path {
        let shift = obs - base;
        let stage_shift = shift - prev.map_or(0.0, |(_, s)| s);
        stages.push(StageShift {
            stage: Stage {
                from: prev.map(|(p, _)| p),
                to: probe,
            },
            baseline_ns: base,
            observed_ns: obs,
            shift_ns: shift,
            stage_shift_ns: stage_shift,
        });
        prev = Some((probe, shift));
    }
    let top = stages
        .iter()
        .max_by(|a, b| a.stage_shift_ns.total_cmp(&b.stage_shift_ns))?;
    Some(StageAttribution {
        quantile,
        stage: top.stage,
        verdict: top.stage.name(),
        stages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Probe::*;

    #[test]
    fn read_delay_when_only_the_read_probe_moved() {
        let a = attribute(
            0.99,
            &[
                (IpStart, 5_000.0, 5_200.0),
                (TcpStart, 8_000.0, 8_100.0),
                (TcpSocketEnqueued, 20_000.0, 21_000.0),
                (TcpSocketRead, 200_000.0, 2_000_000.0),
            ],
        )
        .unwrap();
        assert_eq!(a.verdict, "application read delay");
        assert_eq!(a.stages.len(), 4);
        assert_eq!(a.stages[3].stage_shift_ns, 1_800_000.0 - 1_000.0);
    }

    #[test]
    fn an_early_stage_carries_through_later_probes() {
        // softirq delay of ~1 ms shows at every probe; the stages after it add nothing
        let a = attribute(
            0.9,
            &[
                (IpStart, 5_000.0, 1_005_000.0),
                (UdpStart, 8_000.0, 1_008_000.0),
                (UdpSocketEnqueued, 20_000.0, 1_020_500.0),
                (UdpSocketRead, 50_000.0, 1_050_000.0),
            ],
        )
        .unwrap();
        assert_eq!(
            a.stage,
            Stage {
                from: None,
                to: IpStart
            }
        );
        assert_eq!(a.verdict, "driver and softirq (arrival to IP)");
    }

    #[test]
    fn gaps_in_the_path_are_named_by_their_probes() {
        let a = attribute(0.99, &[(IpStart, 5e3, 5e3), (TcpSocketRead, 1e5, 9e5)]).unwrap();
        assert_eq!(a.verdict, "ip-start to tcp-socket-read");
        assert!(attribute(0.5, &[]).is_none());
    }
}
