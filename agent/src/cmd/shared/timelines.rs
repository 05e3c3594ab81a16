//! The pwru timelines of the slowest samples, printed under a samples table (`samples`,
//! `incidents show`); the join itself is the API's (`crate::api::timelines`).

use capture::pwru::Timeline;

use crate::api::timelines::JoinedSample;
use crate::output::{fmt_ns, fmt_time, table};

/// Timelines printed under the samples table (the slowest samples first).
pub(crate) const TIMELINES_SHOWN: usize = 3;

/// The timelines of the slowest joined samples, each under a line naming its sample
/// (`name` gets the sample's index).
pub(crate) fn print_slowest_timelines(samples: &[JoinedSample], name: impl Fn(usize) -> String) {
    for (i, timeline) in slowest_joined(samples) {
        let s = &samples[i].sample;
        println!(
            "\n{} ({}, {} at {}), skb {:#x}:",
            name(i),
            s.flow,
            fmt_ns(s.latency_ns as f64),
            s.probe,
            timeline.skb
        );
        let mut t = table(["since arrival", "function", "time"]);
        for step in &timeline.steps {
            t.add_row([
                format!("{:+.3} ms", step.since_arrival_ns as f64 / 1e6),
                step.func.clone(),
                fmt_time(step.time_ns),
            ]);
        }
        println!("{t}");
    }
}

/// Indices and timelines of the slowest joined samples, slowest first (at most
/// [`TIMELINES_SHOWN`]).
pub(crate) fn slowest_joined(samples: &[JoinedSample]) -> Vec<(usize, &Timeline)> {
    let mut shown: Vec<(usize, &Timeline, u64)> = samples
        .iter()
        .enumerate()
        .filter_map(|(i, j)| Some((i, j.pwru_timeline.as_ref()?, j.sample.latency_ns)))
        .collect();
    shown.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    shown
        .into_iter()
        .take(TIMELINES_SHOWN)
        .map(|(i, t, _)| (i, t))
        .collect()
}
