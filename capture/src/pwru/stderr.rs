//! pwru's stderr: a bounded tail for the operator, and what it says about attaching.
//!
//! pwru writes slog lines (`2026/11/20 23:50:40 INFO Attached ignored=9`) mixed with a
//! progress bar that is redrawn in place (`9 / 9 [----] 100.00% ? p/s`), separated by `\r`
//! on a terminal and glued to the next log line when captured. The bar is stripped, but its
//! total is kept: it is the number of functions pwru tried to attach, which is how a run
//! that "attached" with every function ignored is told apart from a working one.

use std::collections::VecDeque;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// Lines kept in the tail.
const TAIL_LINES: usize = 40;
/// Longest line kept; longer ones are cut (pwru's lines are ~200 characters).
const MAX_LINE: usize = 1000;
/// Longest run without a line break before it is treated as a line anyway.
const MAX_PENDING: usize = 64 * 1024;

/// One redraw of the progress bar: `done / total [bar] pct% rate p/s`, or `done [bar] ...`
/// when the total is unknown.
static BAR: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern: compiling it cannot fail at run time once the tests pass.
    #[allow(clippy::unwrap_used)]
    Regex::new(r"(?:\d+ / (\d+)|\d+) \[[-_>=]*\] (?:[0-9.]+|\?)% (?:[0-9.]+|\?) p/s").unwrap()
});

/// What pwru's stderr said about attaching its probes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachReport {
    /// `kprobe` or `kprobe-multi`, from `Attaching kprobes via=…`.
    pub backend: Option<String>,
    /// Functions pwru tried to attach: the attach progress bar's total or, when stderr
    /// showed no bar, the number of functions requested.
    pub attempted: Option<u32>,
    /// Functions it skipped, from `Attached ignored=N`.
    pub ignored: Option<u32>,
    /// Whether it reached `Listening for events..`.
    pub listening: bool,
}

impl AttachReport {
    /// pwru said it attached but ignored every function it tried: it will never print an
    /// event although it runs, creates its ready file and exits 0.
    pub fn all_ignored(&self) -> bool {
        matches!((self.attempted, self.ignored), (Some(a), Some(i)) if a > 0 && i >= a)
    }
}

/// Accumulates stderr bytes into a bounded tail of clean lines and an [`AttachReport`].
#[derive(Debug, Default)]
pub(crate) struct StderrLog {
    pending: Vec<u8>,
    tail: VecDeque<String>,
    attach: AttachReport,
    attached_seen: bool,
    last_error: Option<String>,
}

impl StderrLog {
    /// Feed a chunk as read from the pipe.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                self.flush_segment();
            } else {
                self.pending.push(b);
                if self.pending.len() >= MAX_PENDING {
                    self.flush_segment();
                }
            }
        }
    }

    /// The stream ended: take the unterminated rest as a line.
    pub(crate) fn finish(&mut self) {
        self.flush_segment();
    }

    pub(crate) fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    pub(crate) fn attach(&self) -> &AttachReport {
        &self.attach
    }

    /// The last `ERROR` line, without its timestamp.
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    fn flush_segment(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let seg = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        // Bars drawn before "Attached" count the functions being attached; later ones
        // (detaching) do not.
        if !self.attached_seen {
            if let Some(total) = BAR
                .captures_iter(&seg)
                .filter_map(|c| c.get(1)?.as_str().parse::<u32>().ok())
                .last()
            {
                self.attach.attempted = Some(total);
            }
        }
        let text = BAR.replace_all(&seg, "");
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        self.note(text);
        let mut line = text.to_owned();
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    fn note(&mut self, line: &str) {
        let msg = slog_message(line);
        if let Some(rest) = msg.strip_prefix("INFO Attaching kprobes via=") {
            self.attach.backend = Some(rest.trim().to_owned());
        } else if let Some(rest) = msg.strip_prefix("INFO Attached ignored=") {
            self.attached_seen = true;
            self.attach.ignored = rest.trim().parse().ok();
        } else if msg.starts_with("INFO Listening for events") {
            self.attach.listening = true;
        } else if msg.starts_with("ERROR ") {
            self.last_error = Some(msg.to_owned());
        }
    }
}

/// `2026/11/20 23:50:40 INFO x` -> `INFO x` (lines without a timestamp are returned whole).
fn slog_message(line: &str) -> &str {
    let b = line.as_bytes();
    let stamped = b.len() > 20
        && b[4] == b'/'
        && b[7] == b'/'
        && b[10] == b' '
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b' ';
    if stamped {
        line.get(20..).unwrap_or(line)
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_IGNORED: &str = include_str!("../../testdata/pwru/host-all-ignored.stderr");
    const TCP612: &str = include_str!("../../testdata/pwru/tcp612.stderr");
    const NO_KPROBES: &str = include_str!("../../testdata/pwru/host-no-kprobes.stderr");
    const EARLY: &str = include_str!("../../testdata/pwru/early612.stderr");

    fn log_of(text: &str) -> StderrLog {
        let mut l = StderrLog::default();
        // Odd chunk sizes: lines and bars split across reads must still be recognised.
        for chunk in text.as_bytes().chunks(7) {
            l.push(chunk);
        }
        l.finish();
        l
    }

    #[test]
    fn all_ignored_fixture_is_detected() {
        let l = log_of(ALL_IGNORED);
        let a = l.attach();
        assert_eq!(a.backend.as_deref(), Some("kprobe"));
        assert_eq!((a.attempted, a.ignored), (Some(9), Some(9)));
        assert!(a.all_ignored());
        assert!(
            l.tail().iter().all(|t| !t.contains("p/s")),
            "{:?}",
            l.tail()
        );
        assert_eq!(l.tail()[1], "2026/11/20 23:50:40 INFO Attached ignored=9");
    }

    #[test]
    fn working_fixture_is_not_all_ignored() {
        let l = log_of(TCP612);
        let a = l.attach();
        assert_eq!(a.backend.as_deref(), Some("kprobe-multi"));
        // The detach bar (`2 / 2`) comes after "Attached" and must not replace the total.
        assert_eq!((a.attempted, a.ignored), (Some(9), Some(0)));
        assert!(a.listening);
        assert!(!a.all_ignored());
        assert_eq!(l.tail().len(), 5);
        assert_eq!(l.tail()[4], "2026/11/20 23:46:20 INFO Detaching kprobes...");
    }

    #[test]
    fn carriage_return_bars_are_stripped_too() {
        let text = TCP612
            .replace("9 / 9 [", "\r9 / 9 [")
            .replace("p/s2026", "p/s\r2026");
        let l = log_of(&text);
        assert_eq!(l.tail().len(), 5);
        assert_eq!(
            (l.attach().attempted, l.attach().ignored),
            (Some(9), Some(0))
        );
    }

    #[test]
    fn error_and_early_stop() {
        let l = log_of(NO_KPROBES);
        assert_eq!(
            l.last_error(),
            Some("ERROR Failed to run pwru error=\"Cannot find a matching kernel function\"")
        );
        assert!(!l.attach().listening);
        let l = log_of(EARLY);
        assert_eq!(l.attach().attempted, Some(9));
        assert_eq!(l.attach().ignored, None);
        assert!(!l.attach().all_ignored());
        assert!(
            l.tail().iter().all(|t| !t.contains("p/s")),
            "{:?}",
            l.tail()
        );
    }

    #[test]
    fn tail_is_bounded() {
        let mut l = StderrLog::default();
        for i in 0..100 {
            l.push(format!("line {i}\n").as_bytes());
        }
        l.push(&vec![b'x'; MAX_PENDING + 10]);
        l.finish();
        let t = l.tail();
        assert_eq!(t.len(), TAIL_LINES);
        assert_eq!(t[0], "line 62");
        assert!(t[TAIL_LINES - 1].len() <= MAX_LINE + '…'.len_utf8());
    }
}
