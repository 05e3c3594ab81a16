//! Property tests of pwru's stdout lines (the JSON events a session stores): any line gives
//! an event or an error, never a panic or a hang, and a stored line record always keeps the
//! raw text. `tests/fuzz/run.sh` runs them with `TAILTRAP_FUZZ_CASES` set high.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::{Duration, Instant, SystemTime};

use capture::pwru::{PwruEvent, PwruLine};
use model::fixtures::fuzz_config;
use proptest::prelude::*;

/// One parse may take this long before it counts as a hang: generous, as the long fuzz runs
/// niced beside builds and a starved case once took 3 s of wall time.
const HANG: Duration = Duration::from_secs(10);

/// A line as pwru 1.0.12 prints it.
const VALID: &str = r#"{"time":1234567,"skb":"0xffff8880123abc00","cpu":1,"process":"~usr/bin/curl:4242","func":"kfree_skb_reason(SKB_DROP_REASON_NOT_SPECIFIED)","caller_func":"tcp_v4_rcv","netns":4026531840,"iface":"lo:1","len":60,"tuple":{"saddr":"127.0.0.1","daddr":"127.0.0.1","sport":40000,"dport":8080,"proto":6}}"#;

/// Valid JSON objects with pwru's field names and hostile values.
fn event_json() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        ".{0,24}",
        "0x[0-9a-fA-F]{0,20}",
        "[a-z_]{0,12}\\([A-Z_]{0,20}\\)?",
        "[~a-z/]{0,18}:[0-9]{0,12}",
        "[a-z0-9]{0,8}:[0-9-]{0,12}",
    ];
    let addr = prop_oneof![
        Just("127.0.0.1".to_string()),
        Just("::1".to_string()),
        ".{0,16}"
    ];
    (
        text.clone(),
        text.clone(),
        text.clone(),
        text,
        any::<i64>(),
        any::<u64>(),
        (addr.clone(), addr, any::<i32>(), any::<u32>(), any::<i16>()),
        any::<u8>(),
    )
        .prop_map(
            |(skb, func, process, iface, cpu, time, (sa, da, sp, dp, proto), omit)| {
                let mut v = serde_json::json!({
                    "skb": skb, "func": func, "process": process, "iface": iface,
                    "cpu": cpu, "time": time, "netns": cpu, "len": time,
                    "tuple": {"saddr": sa, "daddr": da, "sport": sp, "dport": dp, "proto": proto},
                });
                // Leave some fields out, as pwru does for zero values.
                let obj = v.as_object_mut().unwrap();
                for (bit, key) in [
                    "process", "iface", "tuple", "time", "cpu", "func", "skb", "len",
                ]
                .iter()
                .enumerate()
                {
                    if omit & (1 << bit) != 0 {
                        obj.remove(*key);
                    }
                }
                v.to_string()
            },
        )
}

/// The valid line with bytes replaced or cut.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec((0..VALID.len(), any::<u8>()), 0..8),
        1..=VALID.len(),
    )
        .prop_map(|(flips, cut)| {
            let mut b = VALID.as_bytes().to_vec();
            for (i, v) in flips {
                b[i] = v;
            }
            b.truncate(cut);
            b
        })
}

fn check(raw: String) {
    let start = Instant::now();
    let line = PwruLine::new(7, SystemTime::now(), raw.clone());
    assert!(start.elapsed() < HANG, "parsing took {:?}", start.elapsed());
    assert_eq!(line.raw, raw, "the raw text is kept as printed");
    assert_eq!(line.event.is_some(), line.error.is_none());
    if let Some(e) = &line.event {
        // What parsed survives the JSON form the store and the API use.
        let json = serde_json::to_string(e).unwrap();
        let back: PwruEvent = serde_json::from_str(&json).unwrap();
        assert_eq!(&back, e);
    }
}

#[test]
fn the_reference_line_parses() {
    assert!(PwruEvent::parse(VALID).is_ok());
}

proptest! {
    #![proptest_config(fuzz_config(512))]

    #[test]
    fn fuzz_pwru_arbitrary_text(raw in ".{0,400}") {
        check(raw);
    }

    #[test]
    fn fuzz_pwru_hostile_field_values(raw in event_json()) {
        check(raw);
    }

    #[test]
    fn fuzz_pwru_mutated_lines(bytes in mutated()) {
        check(String::from_utf8_lossy(&bytes).into_owned());
    }
}
