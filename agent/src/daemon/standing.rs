//! Standing conditions in the log. A condition that lasts (a full disk, a store over its
//! budget, a map the kernel refuses) is said once when it starts, at warn, and once when it
//! ends, at info; while it lasts, each repeat is a debug line. An operator reads when it
//! began and when it was over, not one line per interval or per incident; the counters in
//! `status` and `/metrics` count the repeats.

/// Whether a standing condition holds, and so whether a report of it is news.
#[derive(Debug, Default)]
pub(super) struct Standing {
    holds: bool,
}

impl Standing {
    /// The condition holds now: `true` when it did not before (log it at warn), `false`
    /// while it lasts (debug).
    pub(super) fn begins(&mut self) -> bool {
        !std::mem::replace(&mut self.holds, true)
    }

    /// The condition does not hold now: `true` when it did before (log its end at info),
    /// `false` while it stays away.
    pub(super) fn ends(&mut self) -> bool {
        std::mem::replace(&mut self.holds, false)
    }
}

/// What `f` logs on this thread, every level from debug, one line per event without
/// colours or times (`WARN message field=value`).
#[cfg(test)]
pub(super) fn logged(f: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buf
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Said once as it begins and once as it ends, however long it lasts or stays away.
    #[test]
    fn a_standing_condition_is_news_once_when_it_begins_and_once_when_it_ends() {
        let mut s = Standing::default();
        assert!(!s.ends(), "never began: no end to report");
        assert!(s.begins());
        assert!(!s.begins());
        assert!(!s.begins());
        assert!(s.ends());
        assert!(!s.ends());
        assert!(s.begins(), "again: news again");
    }

    #[test]
    fn the_log_of_a_closure_is_captured() {
        let text = logged(|| {
            tracing::warn!(n = 1, "first");
            tracing::debug!("second");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains("first n=1"),
            "{text}"
        );
        assert!(
            lines[1].contains("DEBUG") && lines[1].contains("second"),
            "{text}"
        );
    }
}
