//! End to end: tuning on a real daemon's recorded history. The `tailtrap run` daemon (1 s
//! interval, short warm-up) watches a TCP service on loopback; its reader is slowed down
//! until an incident opens, then runs fast again. Then `history` round-trips through
//! `replay` to the same incidents, `tune` keeps the incident with the settings in force and
//! drops it with a stricter `min_ratio`, and an incident marked a false alarm is counted
//! as dropped. Finally the history reads the same from the database once the daemon stops.
//!
//! Needs root and the `tailtrap` binary of the same build (`cargo build -p tailtrap`).
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use serde_json::Value;
use tailtrap_tests::{
    baselines_warm, cli, cli_json, config_check, Daemon, DaemonConfig, LoopingClient, Proto,
    ScratchDir, ServerOpts, TcpServer, SLOW_READER_DETECTOR,
};

const READ_PROBE: &str = "tcp-socket-read";

fn incidents(config: &Path) -> Vec<Value> {
    let (v, _) = cli_json(config, &["incidents", "--json", "--service", "slow"]);
    v["incidents"].as_array().cloned().unwrap_or_default()
}

fn secs(rfc3339: &str) -> f64 {
    humantime::parse_rfc3339_weak(rfc3339.trim_end_matches('Z'))
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn ns_secs(ns: &Value) -> f64 {
    ns.as_u64().unwrap() as f64 / 1e9
}

/// `<command> slow --since <since> --resolution 1s <more>`: every history and tune call of
/// the test reads the same stretch of "slow"'s 1 s history, the whole run.
fn over_the_run<'a>(command: &'a str, since: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    [
        &[command, "slow", "--since", since, "--resolution", "1s"],
        more,
    ]
    .concat()
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn history_replays_to_the_recorded_incidents_and_tune_compares_settings() {
    let scratch = ScratchDir::new("tune").unwrap();
    let dir = scratch.path();
    let slow = TcpServer::spawn(ServerOpts::loopback()).unwrap();
    // The 1 s interval is the history's finest resolution, so the replay sees exactly the
    // intervals the daemon saw. Detector settings as in e2e_daemon.rs (see there why).
    let config = DaemonConfig::new(dir)
        .interval("1s")
        .service("slow", slow.addr().port())
        .table(SLOW_READER_DETECTOR)
        .write()
        .unwrap();
    let check = config_check(&config);
    assert!(check.status.success(), "{check:?}");

    let started = SystemTime::now();
    let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let traffic = LoopingClient::start(slow.addr(), Proto::Tcp);
    daemon.wait_for(Duration::from_secs(60), "a warm baseline", || {
        let (s, _) = cli_json(&config, &["status", "--json"]);
        baselines_warm(&s, READ_PROBE, &["slow"]).then_some(())
    });
    // Machine noise may open incidents first (see e2e_daemon.rs); they are replayed too.
    let before: Vec<u64> = daemon.wait_for(Duration::from_secs(60), "no open incident", || {
        let all = incidents(&config);
        all.iter()
            .all(|i| i["state"] == "closed")
            .then(|| all.iter().map(|i| i["id"].as_u64().unwrap()).collect())
    });

    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    let incident = daemon.wait_for(Duration::from_secs(30), "an incident", || {
        incidents(&config)
            .into_iter()
            .find(|i| !before.contains(&i["id"].as_u64().unwrap()))
    });
    let id = incident["id"].as_u64().unwrap();
    slow.set_read_delay(Duration::ZERO).unwrap();
    daemon.wait_for(Duration::from_secs(60), "the incident to close", || {
        let (v, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
        (v["incident"]["state"] == "closed").then_some(())
    });
    // A quiet stretch after it.
    std::thread::sleep(Duration::from_secs(5));
    drop(traffic);
    let recorded = incidents(&config);
    let evidence = incident["evidence"].clone();
    let ratio = evidence["headline"]["ratio"].as_f64().unwrap();

    // history (through the API) -> replay: the same incidents, opened within one interval.
    let since = format!("{}s", started.elapsed().unwrap().as_secs() + 60);
    let history = cli(&config, &over_the_run("history", &since, &[]));
    assert!(history.status.success(), "{history:?}");
    assert!(String::from_utf8_lossy(&history.stderr).contains("daemon's API"));
    let series = dir.join("slow.jsonl");
    std::fs::write(&series, &history.stdout).unwrap();
    let lines = String::from_utf8_lossy(&history.stdout).lines().count();
    assert!(lines > 20, "{lines} history lines");
    let replay = cli(&config, &["replay", series.to_str().unwrap(), "--json"]);
    assert!(replay.status.success(), "{replay:?}");
    let replayed: Vec<Value> = String::from_utf8_lossy(&replay.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    eprintln!(
        "recorded {} incident(s), replay found {}",
        recorded.len(),
        replayed.len()
    );
    // Same opening interval ± 1 (the bound) on 1 s history whose points sit on whole
    // seconds while the daemon's intervals do not: up to 1 s of alignment on top, so < 2 s.
    for r in &recorded {
        let opened = ns_secs(&r["opened_ns"]);
        let hit = replayed
            .iter()
            .find(|p| (secs(p["opened_at"].as_str().unwrap()) - opened).abs() < 2.0);
        assert!(
            hit.is_some(),
            "recorded incident {} (opened {opened}) not replayed: {replayed:#?}",
            r["id"]
        );
        assert!(hit.unwrap()["probes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| r["probes"].as_array().unwrap().contains(p)));
    }
    assert_eq!(
        replayed.len(),
        recorded.len(),
        "{replayed:#?}\n{recorded:#?}"
    );

    // The operator calls it a false alarm (through the API); show and export carry it.
    let mark = cli(
        &config,
        &[
            "incidents",
            "mark",
            &id.to_string(),
            "false-alarm",
            "--note",
            "test load",
        ],
    );
    assert!(mark.status.success(), "{mark:?}");
    let (view, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert_eq!(view["verdict"]["verdict"], "false-alarm");
    assert_eq!(view["verdict"]["note"], "test load");
    let bad = cli(&config, &["incidents", "mark", &id.to_string(), "maybe"]);
    assert!(!bad.status.success());

    // tune: the settings in force keep it, a min_ratio above its shift drops it.
    let strict = format!("min_ratio={}", (ratio * 2.0).ceil());
    let sweep = format!("min_ratio=1.25,{}", (ratio * 2.0).ceil());
    let (tune, _) = cli_json(
        &config,
        &over_the_run(
            "tune",
            &since,
            &["--sweep", &sweep, "--show", "0", "--json"],
        ),
    );
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&tune["candidates"]).unwrap()
    );
    assert!(tune["baseline"].as_str().unwrap().starts_with("fresh"));
    let rows = tune["candidates"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let fate = |row: &Value| {
        row["matches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(fate(&rows[0])["kept"], true);
    assert!(fate(&rows[0])["delay_s"].as_f64().unwrap().abs() < 2.0);
    assert_eq!(rows[0]["missed"], 0, "{rows:#?}");
    assert_eq!(tune["not_reproduced"], serde_json::json!([]));
    assert_eq!(fate(&rows[2])["kept"], false);
    assert_eq!(rows[2]["false_alarms_dropped"], 1);
    assert_eq!(rows[2]["false_alarms"], 1);
    assert_eq!(rows[0]["false_alarms_dropped"], 0);
    // Same headline probe as the daemon's.
    let shown = tune["shown"]["incidents"].as_array().unwrap();
    let opened = ns_secs(&incident["opened_ns"]);
    let twin = shown
        .iter()
        .find(|s| (secs(s["opened_at"].as_str().unwrap()) - opened).abs() < 2.0)
        .unwrap();
    assert_eq!(twin["headline_probe"], evidence["headline"]["probe"]);
    // The table, as an operator reads it (shown with --nocapture), and the block to paste.
    let table = cli(&config, &over_the_run("tune", &since, &["--set", &strict]));
    assert!(table.status.success(), "{table:?}");
    eprintln!("{}", String::from_utf8_lossy(&table.stdout));
    let emit = cli(
        &config,
        &over_the_run("tune", &since, &["--set", &strict, "--emit"]),
    );
    assert!(emit.status.success(), "{emit:?}");
    let block = String::from_utf8_lossy(&emit.stdout).into_owned();
    assert!(block.starts_with("[detector.services.slow]\n"), "{block}");
    let mut pasted = std::fs::read_to_string(&config).unwrap();
    pasted.push('\n');
    pasted.push_str(&block);
    let pasted_path = dir.join("pasted.toml");
    std::fs::write(&pasted_path, pasted).unwrap();
    let check = config_check(&pasted_path);
    assert!(check.status.success(), "{check:?}\n{block}");

    // Bad input: one line, exit != 0.
    for args in [
        vec!["tune", "nosuch", "--since", &since],
        vec!["tune", "slow", "--since", &since, "--set", "min_ration=2"],
        vec!["tune", "slow", "--since", &since, "--set", "min_ratio=0.5"],
        vec!["history", "slow", "--from", "1m", "--to", "2m"],
    ] {
        let out = cli(&config, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        let error_lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(error_lines.len(), 1, "{args:?}: {err}");
    }

    // Offline: the database gives the same history once the daemon is gone.
    daemon.signal(Signal::SIGTERM).unwrap();
    daemon.wait_exit(Duration::from_secs(120)).unwrap().unwrap();
    let offline = cli(&config, &over_the_run("history", &since, &[]));
    assert!(offline.status.success(), "{offline:?}");
    assert!(String::from_utf8_lossy(&offline.stderr).contains("reading the database"));
    let offline = String::from_utf8_lossy(&offline.stdout).into_owned();
    for line in String::from_utf8_lossy(&history.stdout).lines() {
        assert!(offline.contains(line), "missing offline: {line}");
    }
    // Marking works offline too, and replaces the earlier verdict.
    let mark = cli(&config, &["incidents", "mark", &id.to_string(), "real"]);
    assert!(mark.status.success(), "{mark:?}");
    let (view, how) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert!(how.contains("reading the database"), "{how}");
    assert_eq!(view["verdict"]["verdict"], "real");
    let export = cli(&config, &["export", &id.to_string()]);
    let doc: Value = serde_json::from_slice(&export.stdout).unwrap();
    assert_eq!(doc["verdict"]["verdict"], "real");
    let (summary, _) = cli_json(&config, &over_the_run("history", &since, &["--json"]));
    assert!(summary["probes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["probe"] == READ_PROBE));
}
