//! How a candidate setting's replayed incidents compare with the incidents the daemon
//! recorded and the operator's verdicts on them (`tailtrap tune`): which recorded ones it
//! keeps, which false alarms it drops, and, for the settings in force, why a recorded
//! incident may not be reproduced.

use std::time::SystemTime;

use model::{unix_ns, Verdict};
use serde::Serialize;

use crate::event::Incident;

/// An incident the daemon recorded, as scoring needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Its stored id.
    pub id: u64,
    /// When it opened and closed (`None`: still open), ns since the epoch.
    pub opened_ns: u64,
    /// When it closed, ns (`None`: open at the end of the range).
    pub closed_ns: Option<u64>,
    /// The operator's verdict, if given.
    pub verdict: Option<Verdict>,
    /// The daemon stopped while it was open.
    pub interrupted: bool,
}

/// How one recorded incident fared under a candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Match {
    /// The recorded incident.
    pub id: u64,
    /// The operator's verdict on it.
    pub verdict: Option<Verdict>,
    /// A replayed incident overlaps it.
    pub kept: bool,
    /// Seconds from the recorded opening to the replayed one's (negative: earlier).
    pub delay_s: Option<f64>,
}

/// One candidate against the recorded incidents.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// Incidents the candidate's replay opened.
    pub incidents: usize,
    /// Recorded incidents it reproduced, and those it did not.
    pub kept: usize,
    /// Recorded incidents it did not reproduce.
    pub missed: usize,
    /// Of those marked real: kept, and how many there are.
    pub real_kept: usize,
    /// Recorded incidents marked real.
    pub real: usize,
    /// Of those marked false alarms: dropped, and how many there are.
    pub false_alarms_dropped: usize,
    /// Recorded incidents marked false alarms.
    pub false_alarms: usize,
    /// Of those marked expected: dropped, and how many there are.
    pub expected_dropped: usize,
    /// Recorded incidents marked expected.
    pub expected: usize,
    /// Time the replay spent with an incident open, seconds.
    pub time_in_incident_s: f64,
    /// One per recorded incident, in their order.
    pub matches: Vec<Match>,
}

/// Score one candidate's `replayed` incidents. A recorded incident is kept when a replayed
/// one overlaps it, `slack_ns` (one point of history) allowed on each side; an incident
/// still open counts until `end_ns`.
pub fn score(replayed: &[Incident], recorded: &[Recorded], slack_ns: u64, end_ns: u64) -> Score {
    let ns = |t: SystemTime| unix_ns(t);
    let span = |i: &Incident| (ns(i.opened_at), i.closed_at.map_or(end_ns, ns));
    let mut score = Score {
        incidents: replayed.len(),
        kept: 0,
        missed: 0,
        real_kept: 0,
        real: 0,
        false_alarms_dropped: 0,
        false_alarms: 0,
        expected_dropped: 0,
        expected: 0,
        time_in_incident_s: replayed
            .iter()
            .map(|i| {
                let (o, c) = span(i);
                c.saturating_sub(o)
            })
            .sum::<u64>() as f64
            / 1e9,
        matches: Vec::with_capacity(recorded.len()),
    };
    for r in recorded {
        let (ro, rc) = (r.opened_ns, r.closed_ns.unwrap_or(end_ns).max(r.opened_ns));
        let hit = replayed.iter().find(|i| {
            let (o, c) = span(i);
            o <= rc.saturating_add(slack_ns) && c.saturating_add(slack_ns) >= ro
        });
        let kept = hit.is_some();
        if kept {
            score.kept += 1;
        } else {
            score.missed += 1;
        }
        match r.verdict {
            Some(Verdict::Real) => {
                score.real += 1;
                score.real_kept += usize::from(kept);
            }
            Some(Verdict::FalseAlarm) => {
                score.false_alarms += 1;
                score.false_alarms_dropped += usize::from(!kept);
            }
            Some(Verdict::Expected) => {
                score.expected += 1;
                score.expected_dropped += usize::from(!kept);
            }
            None => {}
        }
        score.matches.push(Match {
            id: r.id,
            verdict: r.verdict,
            kept,
            delay_s: hit.map(|i| (ns(i.opened_at) as f64 - ro as f64) / 1e9),
        });
    }
    score
}

/// Why the settings in force may not reproduce a recorded incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissReason {
    /// The daemon stopped while it was open.
    Interrupted,
    /// The history has a gap before it (`(last point before, first after)`, ns): the daemon
    /// restarted and resumed from its saved baseline, which a replay does not.
    AfterGap(u64, u64),
    /// No gap: the settings were reloaded in the range, or it opened within the replay's
    /// warm-up.
    ReloadOrWarmup,
}

/// Stretches without any point longer than two points, `(last point before, first after)`
/// in ns, from the points' times `seen` in order: the daemon was not running (or not
/// recording) then.
pub fn gaps(seen: &[u64], resolution_ns: u64) -> Vec<(u64, u64)> {
    seen.windows(2)
        .filter(|w| w[1] > w[0].saturating_add(2 * resolution_ns))
        .map(|w| (w[0], w[1]))
        .collect()
}

/// Why `r`, which the settings in force did not reproduce, may have been missed.
pub fn why_missed(r: &Recorded, gaps: &[(u64, u64)]) -> MissReason {
    if r.interrupted {
        return MissReason::Interrupted;
    }
    match gaps.iter().rev().find(|&&(_, after)| after <= r.opened_ns) {
        Some(&(before, after)) => MissReason::AfterGap(before, after),
        None => MissReason::ReloadOrWarmup,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::{Duration, UNIX_EPOCH};

    use model::Probe;

    use super::*;
    use crate::event::{Estimate, Evidence, EvidenceKind};

    const S: u64 = 1_000_000_000;

    fn replayed(open_s: u64, close_s: Option<u64>) -> Incident {
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let value = |ns: f64| Estimate {
            value_ns: ns,
            lower_ns: 0,
            upper_ns: u64::MAX,
        };
        let headline = Evidence {
            probe: Probe::TcpSocketRead,
            quantile: 0.99,
            kind: EvidenceKind::Shift,
            baseline: value(1e5),
            observed: value(1e6),
            ratio: 10.0,
            p_value: Some(1e-9),
            window_samples: 1000,
            exceedances: 100,
            expected_exceedances: 10.0,
            baseline_samples: 1e4,
            window_start: at(open_s),
        };
        Incident {
            service: "web".into(),
            probes: vec![Probe::TcpSocketRead],
            first_hot_at: at(open_s),
            opened_at: at(open_s),
            updated_at: at(open_s),
            closed_at: close_s.map(at),
            close_reason: None,
            headline: headline.clone(),
            evidence: vec![headline],
            stage: None,
        }
    }

    fn recorded(id: u64, open_s: u64, close_s: Option<u64>, verdict: Option<Verdict>) -> Recorded {
        Recorded {
            id,
            opened_ns: open_s * S,
            closed_ns: close_s.map(|c| c * S),
            verdict,
            interrupted: false,
        }
    }

    #[test]
    fn overlaps_within_one_point_keep_a_recorded_incident_and_verdicts_are_counted() {
        let out = [replayed(100, Some(130)), replayed(500, None)];
        let rec = [
            recorded(1, 95, Some(120), Some(Verdict::Real)),
            // Ends 10 s before the replayed one opens: kept only with 10 s of slack.
            recorded(2, 80, Some(90), Some(Verdict::FalseAlarm)),
            recorded(3, 300, Some(310), Some(Verdict::Expected)),
            recorded(4, 590, None, None),
        ];
        let s = score(&out, &rec, 10 * S, 600 * S);
        assert_eq!((s.incidents, s.kept, s.missed), (2, 3, 1));
        assert_eq!((s.real_kept, s.real), (1, 1));
        assert_eq!((s.false_alarms_dropped, s.false_alarms), (0, 1));
        assert_eq!((s.expected_dropped, s.expected), (1, 1));
        assert_eq!(s.time_in_incident_s, 130.0);
        let delays: Vec<_> = s.matches.iter().map(|m| m.delay_s).collect();
        assert_eq!(delays, [Some(5.0), Some(20.0), None, Some(-90.0)]);
        // With less slack the false alarm is dropped.
        let s = score(&out, &rec, 5 * S, 600 * S);
        assert_eq!((s.false_alarms_dropped, s.kept), (1, 2));
    }

    #[test]
    fn a_miss_is_explained_by_the_last_gap_before_it() {
        let seen = [10, 20, 30, 80, 90, 200, 210];
        let g = gaps(&seen, 10);
        assert_eq!(g, [(30, 80), (90, 200)]);
        let mut r = recorded(1, 0, None, None);
        r.opened_ns = 205;
        assert_eq!(why_missed(&r, &g), MissReason::AfterGap(90, 200));
        r.opened_ns = 25;
        assert_eq!(why_missed(&r, &g), MissReason::ReloadOrWarmup);
        r.interrupted = true;
        assert_eq!(why_missed(&r, &g), MissReason::Interrupted);
    }
}
