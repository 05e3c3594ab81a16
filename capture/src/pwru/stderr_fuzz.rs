//! Property tests of the stderr reader: any bytes, in any chunking, leave a bounded tail and
//! never panic. Kept apart from `stderr.rs`, whose private reader they need.
#![allow(clippy::unwrap_used)] // tests may unwrap

use model::fixtures::fuzz_config;
use proptest::prelude::*;

use super::stderr::StderrLog;

/// Pieces pwru's stderr is made of, to be glued in random orders.
const PIECES: &[&str] = &[
    "2026/11/20 23:50:40 INFO Attaching kprobes via=kprobe-multi\n",
    "9 / 9 [------>____] 42.00% ? p/s",
    "4294967296 / 99999999999 [====] 100.00% 1.5 p/s",
    "2026/11/20 23:50:40 INFO Attached ignored=9\n",
    "2026/11/20 23:50:40 INFO Attached ignored=-1\n",
    "2026/11/20 23:50:41 INFO Listening for events..\n",
    "2026/11/20 23:50:42 ERROR failed to attach: operation not permitted\n",
    "\r",
    "\n",
    "é",
];

fn stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::sample::select(PIECES).prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..200),
        // A long run without a line break.
        (1usize..3000).prop_map(|n| vec![b'x'; n]),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn fuzz_pwru_stderr_any_bytes_any_chunks(bytes in stream(), chunk in 1usize..97) {
        let mut log = StderrLog::default();
        for c in bytes.chunks(chunk) {
            log.push(c);
        }
        log.finish();
        let tail = log.tail();
        prop_assert!(tail.len() <= 40);
        prop_assert!(tail.iter().all(|l| l.len() <= 1000 + '…'.len_utf8()));
        let _ = (log.attach().all_ignored(), log.last_error());
    }
}
