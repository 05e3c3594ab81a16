//! Why an interval began late. The interval loop's wake-up (from the tick's scheduled
//! time to the start of its work) is split into the time the loop was still busy with
//! something else (a pwru session's news, a reload), the time its thread was ready but
//! waited for a CPU (the kernel's run-queue wait of that thread), and the rest: the
//! runtime's timer thread not run in time, a page fault or a lock. Logged when late enough
//! to matter, so that a late minute in the status can be read against the host's load.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// A wake-up at least this late is logged (half the 100 ms the soak allows an interval).
pub(super) const LOGGED_WAKEUP: Duration = Duration::from_millis(50);

/// What the loop did between ticks, and how long the loop's thread waited for a CPU.
pub(super) struct WakeupWatch {
    /// `/proc/thread-self/schedstat` of the loop's thread, opened on it; `None` where the
    /// kernel has no scheduler statistics.
    schedstat: Option<File>,
    /// The thread's run-queue wait (ns) when the loop last became idle.
    waited_at_idle: Option<u64>,
    /// When the loop last finished a piece of work, and which.
    idle_since: Instant,
    last_work: &'static str,
}

/// A late wake-up, split by cause.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct LateWakeup {
    pub late: Duration,
    /// Of `late`, the loop still busy with `busy_with`.
    pub busy: Duration,
    pub busy_with: &'static str,
    /// The loop's thread ready to run but waiting for a CPU, since the loop went idle
    /// (`None`: not known).
    pub waited_for_cpu: Option<Duration>,
}

impl WakeupWatch {
    /// Call on the loop's own thread.
    pub(super) fn new() -> WakeupWatch {
        let schedstat = File::open("/proc/thread-self/schedstat").ok();
        let mut w = WakeupWatch {
            schedstat,
            waited_at_idle: None,
            idle_since: Instant::now(),
            last_work: "start-up",
        };
        w.idle("start-up");
        w
    }

    /// The loop finished `work` and waits for the next event.
    pub(super) fn idle(&mut self, work: &'static str) {
        self.idle_since = Instant::now();
        self.last_work = work;
        self.waited_at_idle = self.run_queue_wait();
    }

    /// A tick scheduled for `scheduled` began its work at `began`: the split of the delay
    /// when it reaches [`LOGGED_WAKEUP`].
    pub(super) fn tick(&mut self, scheduled: Instant, began: Instant) -> Option<LateWakeup> {
        let late = began.saturating_duration_since(scheduled);
        if late < LOGGED_WAKEUP {
            return None;
        }
        let waited_for_cpu = match (self.waited_at_idle, self.run_queue_wait()) {
            (Some(then), Some(now)) => Some(Duration::from_nanos(now.saturating_sub(then))),
            _ => None,
        };
        Some(LateWakeup {
            late,
            busy: self
                .idle_since
                .saturating_duration_since(scheduled)
                .min(late),
            busy_with: self.last_work,
            waited_for_cpu,
        })
    }

    /// The thread's total run-queue wait, ns (the second field of schedstat).
    fn run_queue_wait(&self) -> Option<u64> {
        let file = self.schedstat.as_ref()?;
        let mut buf = [0u8; 96];
        let n = file.read_at(&mut buf, 0).ok()?;
        parse_run_queue_wait(buf.get(..n)?)
    }
}

/// The second of schedstat's three numbers: `on-CPU ns, run-queue wait ns, timeslices`.
fn parse_run_queue_wait(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text)
        .ok()?
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

impl LateWakeup {
    /// Log it, at info: not an error, but the reason for a late minute in the status.
    pub(super) fn log(&self) {
        // To a tenth of a millisecond: the scheduler's own granularity is coarser.
        let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        let (late_ms, loop_busy_ms, busy_with) = (ms(self.late), ms(self.busy), self.busy_with);
        match self.waited_for_cpu {
            Some(waited) => tracing::info!(
                late_ms,
                loop_busy_ms,
                busy_with,
                waited_for_cpu_ms = ms(waited),
                "interval began late"
            ),
            None => tracing::info!(late_ms, loop_busy_ms, busy_with, "interval began late"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_its_second_number() {
        assert_eq!(
            parse_run_queue_wait(b"710285691 241599069 4203\n"),
            Some(241599069)
        );
        assert_eq!(parse_run_queue_wait(b"0 0 1\n"), Some(0));
        assert_eq!(parse_run_queue_wait(b"12\n"), None);
        assert_eq!(parse_run_queue_wait(b"a b c"), None);
    }

    #[test]
    fn a_wakeup_is_split_into_busy_waiting_and_the_rest() {
        let mut w = WakeupWatch::new();
        let scheduled = Instant::now();
        // On time: nothing to say.
        assert_eq!(
            w.tick(scheduled, scheduled + Duration::from_millis(3)),
            None
        );
        // The loop was busy with pwru news until 30 ms after the tick was due.
        w.idle("pwru news");
        w.idle_since = scheduled + Duration::from_millis(30);
        let late = w
            .tick(scheduled, scheduled + Duration::from_millis(80))
            .unwrap();
        assert_eq!(late.late, Duration::from_millis(80));
        assert_eq!(late.busy, Duration::from_millis(30));
        assert_eq!(late.busy_with, "pwru news");
        // This thread's own scheduler statistics, where the kernel has them.
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(late.waited_for_cpu.is_some());
        }
        // Idle since before the tick was due: none of the delay was the loop's own work.
        w.idle("interval");
        w.idle_since = scheduled - Duration::from_millis(900);
        let late = w
            .tick(scheduled, scheduled + Duration::from_millis(60))
            .unwrap();
        assert_eq!(late.busy, Duration::ZERO);
    }
}
