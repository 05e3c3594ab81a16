//! The pwru stand-in itself: it must accept exactly the options real pwru 1.0.12 lists in
//! its help (plus the hidden `--ready-file`) and refuse others the way pflag does, or the
//! session tests would prove nothing about the real command line.
#![allow(clippy::unwrap_used)] // tests: a failed setup step should panic right there

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fake_pwru() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-pwru/pwru")
}

fn real_help() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/pwru/pwru-help.txt"),
    )
    .unwrap()
}

fn run(args: &[&str]) -> Output {
    Command::new(fake_pwru()).args(args).output().unwrap()
}

/// `(flag, takes a value)` for every option in the real help text.
fn real_options() -> Vec<(String, bool)> {
    real_help()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().filter(|w| *w != "-h,");
            let flag = words.next()?.strip_prefix("--")?.to_owned();
            // A type word (string, uint, strings, mark[/mask], ...) follows value options;
            // the description of boolean ones starts with a lowercase verb.
            let next = words.next().unwrap_or("");
            let takes_value = matches!(
                next,
                "string" | "strings" | "uint" | "uint8" | "uint32" | "int" | "mark[/mask]"
            );
            Some((flag, takes_value))
        })
        .collect()
}

#[test]
fn accepts_every_real_option() {
    let options = real_options();
    assert_eq!(options.len(), 45, "{options:?}");
    for (flag, takes_value) in options {
        let flag = format!("--{flag}");
        let mut args = vec![flag.as_str()];
        if takes_value {
            args.push("1");
        }
        // Parsing happens first; --version then exits before any tracing.
        args.push("--version");
        let out = run(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // --help wins over --version and prints the usage instead.
        let expected = if flag == "--help" {
            ""
        } else {
            "pwru v1.0.12\n"
        };
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{args:?}");
    }
    // The hidden flag tailtrap relies on, in both pflag forms.
    assert!(run(&["--ready-file", "/x", "--version"]).status.success());
    assert!(run(&["--ready-file=/x", "--version"]).status.success());
}

#[test]
fn refuses_like_pflag() {
    let cases: [(&[&str], &str); 5] = [
        (&["--bogus", "tcp"], "unknown flag: --bogus"),
        (&["-x", "tcp"], "unknown shorthand flag: 'x' in -x"),
        (&["tcp", "--filter-func"], "flag needs an argument: --filter-func"),
        (
            &["--output-limit-lines", "ten", "tcp"],
            "invalid argument \"ten\" for \"--output-limit-lines\" flag: strconv.ParseUint: parsing \"ten\": invalid syntax",
        ),
        (
            &["--output-json=maybe", "tcp"],
            "invalid argument \"maybe\" for \"--output-json\" flag: strconv.ParseBool: parsing \"maybe\": invalid syntax",
        ),
    ];
    for (args, first_line) in cases {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let mut lines = err.lines();
        assert_eq!(lines.next(), Some(first_line), "{args:?}");
        // Then the usage, as pwru prints it.
        assert!(lines.next().unwrap().starts_with("Usage: "), "{args:?}");
    }
}

#[test]
fn help_is_the_real_help() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let real = real_help();
    let fake = String::from_utf8_lossy(&out.stderr);
    // Only the program name in the first line differs.
    assert_eq!(
        fake.lines().skip(1).collect::<Vec<_>>(),
        real.lines().skip(1).collect::<Vec<_>>()
    );
    assert_eq!(
        fake.lines().next().unwrap(),
        format!("Usage: {} [options] [pcap-filter]", fake_pwru().display())
    );
}

#[test]
fn requires_a_pcap_filter() {
    let out = run(&["--output-json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no pcap filter given"));
}
