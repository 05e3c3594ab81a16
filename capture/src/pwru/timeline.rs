//! Per-packet timelines: a captured slow sample joined with the pwru events of its packet.
//!
//! pwru prints one event per function an skb passes, keyed by the skb's address, with
//! `--timestamp current` times (CLOCK_MONOTONIC ns). A sample knows its flow, when its
//! packet arrived (`time - latency`, the skb's receive timestamp) and when the probe fired.
//! The join: group pwru events by skb address into passes (an address is reused once the
//! skb is freed, so a release, a receive entry point or a long gap starts a new pass).
//! A sample that knows its skb's address takes the pass of that address whose first event
//! lies between the packet's arrival and the probe: an exact match. A sample without one
//! (tcp-socket-read on fentry hooks `tcp_recv_timestamp`, which has no skb; samples stored
//! before the address was captured), or whose address pwru did not trace, falls back to
//! the flow: the passes of its flow (its local end, and its remote end where the sample
//! knows it) starting in that window, the one that started closest to the arrival.

use std::collections::HashMap;

use model::Flow;
use serde::{Deserialize, Serialize};

/// A pause between two events of one address longer than this means the address was
/// freed and reused by another packet.
const PASS_GAP_NS: u64 = 1_000_000_000;
/// Functions that end an skb's life: the next event of its address is another packet.
const RELEASES: [&str; 7] = [
    "consume_skb",
    "__kfree_skb",
    "skb_attempt_defer_free",
    "__consume_stateless_skb",
    "kfree_skb_reason",
    "sk_skb_reason_drop",
    "kfree_skbmem",
];
/// Where a received packet enters the traced path: an skb seen here starts a new packet.
const ENTRIES: [&str; 2] = ["ip_rcv_core", "ip6_rcv_core"];
/// Slack around the packet's arrival and the probe time: the receive timestamp is taken a
/// little before the first traced function, and clocks are converted.
const SLACK_NS: u64 = 2_000_000;

/// One pwru event, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePoint {
    /// pwru's `time` (CLOCK_MONOTONIC ns).
    pub mono_ns: u64,
    /// The skb address.
    pub skb: u64,
    /// The packet's flow at the event, when pwru printed a tuple.
    pub flow: Option<Flow>,
    /// The kernel function.
    pub func: String,
}

/// One step of a packet's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The kernel function.
    pub func: String,
    /// Wall time of the event, ns since the epoch.
    pub time_ns: u64,
    /// Signed ns from the packet's arrival (its receive timestamp) to the event.
    pub since_arrival_ns: i64,
}

/// A sample's packet as pwru saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// The skb address (hex in JSON: 64-bit integers lose digits in many JSON readers).
    #[serde(serialize_with = "hex", deserialize_with = "from_hex")]
    pub skb: u64,
    /// Its events in time order.
    pub steps: Vec<Step>,
}

fn hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

fn from_hex<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let text = String::deserialize(d)?;
    let digits = text.strip_prefix("0x").unwrap_or(&text);
    u64::from_str_radix(digits, 16)
        .map_err(|e| serde::de::Error::custom(format!("skb {text:?}: {e}")))
}

/// What is known of a sample for the join.
#[derive(Debug, Clone, Copy)]
pub struct SampleKey {
    /// Its flow (remote → local).
    pub flow: Flow,
    /// When the probe fired, wall ns.
    pub time_ns: u64,
    /// Probe time minus the packet's receive timestamp, ns.
    pub latency_ns: u64,
    /// The skb's address, when the probe had one.
    pub skb: Option<u64>,
}

/// The events of one session, grouped for joining.
#[derive(Debug, Default)]
pub struct Passes {
    /// Passes by the flow's local end (transport, address, port), each as (flow, start
    /// mono ns, skb, events in time order): a read on an unconnected UDP socket knows only
    /// its own end, so the remote end is matched only where the sample has it.
    by_local: HashMap<(model::Transport, std::net::IpAddr, u16), Vec<Pass>>,
}

type Pass = (Flow, u64, u64, Vec<TracePoint>);

fn local_end(f: &Flow) -> (model::Transport, std::net::IpAddr, u16) {
    (f.transport, f.dst, f.dport)
}

impl Passes {
    /// Group `points` (any order) into passes per skb address.
    pub fn new(points: impl IntoIterator<Item = TracePoint>) -> Self {
        let mut by_skb: HashMap<u64, Vec<TracePoint>> = HashMap::new();
        for p in points {
            by_skb.entry(p.skb).or_default().push(p);
        }
        let mut by_local: HashMap<_, Vec<Pass>> = HashMap::new();
        for (skb, mut events) in by_skb {
            events.sort_by_key(|p| p.mono_ns);
            let mut pass: Vec<TracePoint> = Vec::new();
            let mut flush = |pass: &mut Vec<TracePoint>| {
                let flow = pass.iter().find_map(|p| p.flow.map(canonical));
                if let (Some(flow), Some(first)) = (flow, pass.first()) {
                    let start = first.mono_ns;
                    by_local.entry(local_end(&flow)).or_default().push((
                        flow,
                        start,
                        skb,
                        std::mem::take(pass),
                    ));
                } else {
                    pass.clear();
                }
            };
            for e in events {
                // A new packet in a reused skb: after the skb was released, at a receive
                // entry point, or after a long pause.
                let new_packet = pass.last().is_some_and(|l| {
                    RELEASES.contains(&l.func.as_str())
                        || ENTRIES.contains(&e.func.as_str())
                        || e.mono_ns.saturating_sub(l.mono_ns) > PASS_GAP_NS
                });
                if new_packet {
                    flush(&mut pass);
                }
                pass.push(e);
            }
            flush(&mut pass);
        }
        for v in by_local.values_mut() {
            v.sort_by_key(|(_, start, _, _)| *start);
        }
        Passes { by_local }
    }

    /// Whether no event had a flow.
    pub fn is_empty(&self) -> bool {
        self.by_local.is_empty()
    }

    /// The timeline of `sample`'s packet, with pwru's monotonic times turned into wall
    /// times by `wall_minus_mono_ns` (CLOCK_REALTIME − CLOCK_MONOTONIC).
    pub fn timeline(&self, sample: &SampleKey, wall_minus_mono_ns: i64) -> Option<Timeline> {
        let arrival_wall = sample.time_ns.saturating_sub(sample.latency_ns);
        let to_mono =
            |wall: u64| u64::try_from(i128::from(wall) - i128::from(wall_minus_mono_ns)).ok();
        let arrival = to_mono(arrival_wall)?;
        let probe = to_mono(sample.time_ns)?;
        let want = canonical(sample.flow);
        let passes = self.by_local.get(&local_end(&want))?;
        let lo = arrival.saturating_sub(SLACK_NS);
        let hi = probe.saturating_add(SLACK_NS);
        let remote_ok = |f: &Flow| {
            (want.src.is_unspecified() || f.src == want.src)
                && (want.sport == 0 || f.sport == want.sport)
        };
        let in_window = |start: &u64| (lo..=hi).contains(start);
        let exact = sample.skb.and_then(|addr| {
            passes
                .iter()
                .filter(|(_, start, skb, _)| *skb == addr && in_window(start))
                .min_by_key(|(_, start, _, _)| start.abs_diff(arrival))
        });
        let (_, _, skb, events) = match exact {
            Some(pass) => pass,
            None => passes
                .iter()
                .filter(|(f, start, _, _)| remote_ok(f) && in_window(start))
                .min_by_key(|(_, start, _, _)| start.abs_diff(arrival))?,
        };
        let steps = events
            .iter()
            .map(|e| {
                let wall = i128::from(e.mono_ns) + i128::from(wall_minus_mono_ns);
                Step {
                    func: e.func.clone(),
                    time_ns: u64::try_from(wall).unwrap_or(0),
                    since_arrival_ns: i64::try_from(wall - i128::from(arrival_wall))
                        .unwrap_or(i64::MAX),
                }
            })
            .collect();
        Some(Timeline { skb: *skb, steps })
    }
}

/// IPv4-mapped addresses as IPv4, so a dual-stack socket's sample meets pwru's tuple.
fn canonical(f: Flow) -> Flow {
    Flow {
        src: f.src.to_canonical(),
        dst: f.dst.to_canonical(),
        ..f
    }
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC now, ns: turns pwru's `--timestamp current` times into
/// wall times (valid for sessions since the last boot, barring a clock step since).
pub fn wall_minus_mono_ns() -> Option<i64> {
    let real = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME).ok()?;
    let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    let ns = |t: nix::sys::time::TimeSpec| {
        i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
    };
    i64::try_from(ns(real) - ns(mono)).ok()
}

/// How far a line may reach tailtrap after pwru stamped it and still vouch for the
/// offset read now: pwru's output is line-buffered into a pipe, so seconds is generous.
const MAX_DELIVERY_NS: i128 = 10_000_000_000;

/// Where the offset that turns pwru's times into wall-clock times came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockOffset {
    /// The clocks read now agree with the stored lines: the session ran in this boot.
    Now(i64),
    /// The lines cannot have been stamped in this boot (the machine restarted since, or its
    /// clock was stepped): the offset is the smallest gap between a line's arrival at
    /// tailtrap and pwru's stamp on it, so times are late by at most that line's delivery.
    FromLines(i64),
}

impl ClockOffset {
    /// CLOCK_REALTIME − CLOCK_MONOTONIC for the session's boot, ns.
    pub fn ns(self) -> i64 {
        match self {
            ClockOffset::Now(o) | ClockOffset::FromLines(o) => o,
        }
    }
}

/// The offset for a stored session's lines, given as (received wall ns, pwru monotonic
/// ns) pairs, and `now` from [`wall_minus_mono_ns`]. The offset read now is right only in
/// the boot that ran the session: after a restart the monotonic clock starts again and
/// every pwru time would land hours or days off, so no sample would find its packet.
/// A line can only arrive after it was stamped, so within the session's boot each gap is
/// at least the true offset; the smallest gap bounds it from above.
pub fn clock_offset(
    lines: impl IntoIterator<Item = (u64, u64)>,
    now: Option<i64>,
) -> Option<ClockOffset> {
    let gap = lines
        .into_iter()
        .map(|(received, mono)| i128::from(received) - i128::from(mono))
        .min();
    match (now, gap) {
        // A second below zero: the wall clock may have been slewed forward since.
        (Some(n), Some(g)) if (-1_000_000_000..=MAX_DELIVERY_NS).contains(&(g - i128::from(n))) => {
            Some(ClockOffset::Now(n))
        }
        (_, Some(g)) => i64::try_from(g).ok().map(ClockOffset::FromLines),
        (n, None) => n.map(ClockOffset::Now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::Transport;

    #[test]
    fn the_offset_of_now_is_kept_within_the_sessions_boot_and_replaced_after_a_restart() {
        let now = 1_700_000_000_000_000_000i64;
        // Lines stamped at 5 s and 6 s of monotonic time, delivered 3 ms and 40 ms later.
        let lines = [
            (5_000_000_000u64 + now as u64 + 3_000_000, 5_000_000_000u64),
            (6_000_000_000u64 + now as u64 + 40_000_000, 6_000_000_000u64),
        ];
        assert_eq!(clock_offset(lines, Some(now)), Some(ClockOffset::Now(now)));
        // A reboot a day later: the offset read now is a day larger.
        let later = now + 86_400_000_000_000;
        assert_eq!(
            clock_offset(lines, Some(later)),
            Some(ClockOffset::FromLines(now + 3_000_000))
        );
        // Nothing to check against: the offset read now.
        assert_eq!(clock_offset([], Some(later)), Some(ClockOffset::Now(later)));
        assert_eq!(clock_offset([], None), None);
        // A line stamped seconds after it arrived cannot come from this boot either.
        let early = [(now as u64 + 1_000, 5_000_000_000u64)];
        assert!(matches!(
            clock_offset(early, Some(now)),
            Some(ClockOffset::FromLines(_))
        ));
    }

    fn flow(sport: u16) -> Flow {
        Flow {
            transport: Transport::Udp,
            src: "10.0.0.5".parse().unwrap(),
            sport,
            dst: "10.0.0.1".parse().unwrap(),
            dport: 9000,
        }
    }

    fn point(mono_ns: u64, skb: u64, f: Option<Flow>, func: &str) -> TracePoint {
        TracePoint {
            mono_ns,
            skb,
            flow: f,
            func: func.to_owned(),
        }
    }

    #[test]
    fn the_pass_that_started_nearest_the_arrival_wins() {
        let ms = 1_000_000;
        let f = flow(40000);
        let passes = Passes::new([
            // Packet A arrives at 100 ms, is queued, consumed at 130 ms.
            point(100 * ms + 10_000, 0xa, Some(f), "udp_rcv"),
            point(
                100 * ms + 20_000,
                0xa,
                Some(f),
                "__udp_enqueue_schedule_skb",
            ),
            point(130 * ms, 0xa, None, "skb_consume_udp"),
            // Packet B of the same flow 2 ms later, another address.
            point(102 * ms, 0xb, Some(f), "udp_rcv"),
            // The address 0xa reused 5 s later by another packet of the flow, and right
            // after its release by yet another.
            point(5_100 * ms, 0xa, Some(f), "udp_rcv"),
            point(130 * ms + 50_000, 0xa, Some(f), "ip_rcv_core"),
            // Another flow at the same time.
            point(100 * ms, 0xc, Some(flow(40001)), "udp_rcv"),
        ]);
        // Wall = mono + 1000 s.
        let offset = 1_000_000 * ms as i64;
        let s = SampleKey {
            flow: f,
            time_ns: 1_000_130 * ms,
            latency_ns: 30 * ms,
            skb: None,
        };
        let t = passes.timeline(&s, offset).unwrap();
        assert_eq!(t.skb, 0xa);
        let funcs: Vec<&str> = t.steps.iter().map(|s| s.func.as_str()).collect();
        assert_eq!(
            funcs,
            ["udp_rcv", "__udp_enqueue_schedule_skb", "skb_consume_udp"]
        );
        assert_eq!(t.steps[0].since_arrival_ns, 10_000);
        assert_eq!(t.steps[2].since_arrival_ns, 30 * ms as i64);
        assert_eq!(
            serde_json::to_value(&t).unwrap()["skb"],
            serde_json::json!("0xa")
        );
        // No pass of another flow, none outside the window.
        let other = SampleKey { flow: flow(1), ..s };
        assert!(passes.timeline(&other, offset).is_none());
        // A read on an unconnected socket knows only its own end: the pass of any peer to
        // that end that started nearest the arrival (here the other flow's, at 100 ms).
        let unconnected = SampleKey {
            flow: Flow {
                src: "0.0.0.0".parse().unwrap(),
                sport: 0,
                ..f
            },
            ..s
        };
        assert_eq!(passes.timeline(&unconnected, offset).unwrap().skb, 0xc);
        let later = SampleKey {
            time_ns: 1_003_000 * ms,
            latency_ns: ms,
            ..s
        };
        assert!(passes.timeline(&later, offset).is_none());

        // With the skb address the match is exact: packet B, though A started nearer the
        // arrival; and the unconnected read gets its own packet, not the other flow's.
        let b = SampleKey {
            skb: Some(0xb),
            ..s
        };
        assert_eq!(passes.timeline(&b, offset).unwrap().skb, 0xb);
        let unconnected_a = SampleKey {
            skb: Some(0xa),
            ..unconnected
        };
        let t = passes.timeline(&unconnected_a, offset).unwrap();
        assert_eq!((t.skb, t.steps.len()), (0xa, 3));
        // An address pwru did not trace (or traced outside the window) falls back to the flow.
        let untraced = SampleKey {
            skb: Some(0xdead),
            ..s
        };
        assert_eq!(passes.timeline(&untraced, offset).unwrap().skb, 0xa);
        let reused_later = SampleKey {
            skb: Some(0xa),
            ..later
        };
        assert!(passes.timeline(&reused_later, offset).is_none());
    }
}
