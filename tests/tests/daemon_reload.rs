//! SIGHUP against the real `tailtrap run`: a file with a bad value, a file with a rule
//! broken across services and a missing file are each refused with an error naming the file
//! (and the line and key), while the daemon keeps running with its services; a good file
//! then adds a service at once and says that its `[storage]` and `[capture]` changes wait
//! for a restart (the capture restarted with the new probes keeps its running settings).
//! `tailtrap status` shows the last reload's outcome.
//! Finally the daemon stops cleanly on SIGTERM.
//!
//! Needs root and the `tailtrap` binary of the same build (`cargo build -p tailtrap`).
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tailtrap_tests::{cli, cli_json, Daemon, DaemonConfig, ScratchDir};

/// The deadline of every wait: loading the probes again takes a moment, much longer under
/// qemu's software emulation (the VM runner) or on a busy host (builds, VMs).
const WAIT: Duration = Duration::from_secs(90);

/// Ports of the services (nothing needs to listen on them).
const ALPHA_PORT: u16 = 47_101;
const BETA_PORT: u16 = 47_102;

/// A daemon configuration in `dir`: `services` as `(name, port)`, `[storage] flush_every`,
/// and `daemon_extra` appended to the `[daemon]` table.
fn config_text(
    dir: &Path,
    services: &[(&str, u16)],
    flush_every: &str,
    daemon_extra: &str,
) -> String {
    services
        .iter()
        .fold(DaemonConfig::new(dir), |c, (name, port)| {
            c.service(name, *port)
        })
        .daemon_keys(daemon_extra)
        .table(&format!("[storage]\nflush_every = \"{flush_every}\""))
        .text()
}

/// The 1-based line of `text` that is exactly `line`, the `nth` (0-based) such line.
fn line_number(text: &str, line: &str, nth: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim() == line)
        .nth(nth)
        .map(|(n, _)| n + 1)
        .unwrap_or_else(|| panic!("no line {line:?} (#{nth}) in:\n{text}"))
}

/// The daemon's status through its API (never the database).
fn status(client: &Path) -> Value {
    let (v, how) = cli_json(client, &["status", "--json"]);
    assert!(
        how.contains("daemon's API"),
        "status not from the API: {how}"
    );
    v
}

/// Send SIGHUP and wait until the log, past what it held before, contains `marker`;
/// the log's new part.
fn hup_until(daemon: &Daemon, marker: &str) -> String {
    let before = daemon.log().len();
    daemon.signal(Signal::SIGHUP).unwrap();
    daemon.wait_for(WAIT, &format!("{marker:?} in the log after SIGHUP"), || {
        let log = daemon.log();
        let new = log.get(before..).unwrap_or_default();
        new.contains(marker).then(|| new.to_owned())
    })
}

/// A refused reload: the daemon still runs, answers through its API with the services it
/// had, and logged one refusal whose error contains `error`.
fn assert_refused(daemon: &mut Daemon, client: &Path, error: &str, services: &Value) {
    let new = hup_until(daemon, "reload refused; the running configuration stays");
    let refusal = new.lines().find(|l| l.contains("reload refused")).unwrap();
    assert!(
        refusal.contains(error),
        "the refusal does not say {error:?}:\n{refusal}"
    );
    assert_eq!(new.matches("reload refused").count(), 1, "{new}");
    assert!(!new.contains("reloaded services"), "{new}");
    assert!(daemon.running(), "the daemon exited:\n{}", daemon.log());
    let s = status(client);
    assert_eq!(
        &s["services"], services,
        "services changed by a refused reload"
    );
    // Status shows the refusal too, for whoever did not watch the log.
    let last = &s["daemon"]["last_reload"];
    assert_eq!(last["applied"], false, "{last}");
    assert!(
        last["message"].as_str().unwrap().contains(error),
        "status does not say {error:?}: {last}"
    );
    assert!(daemon.running(), "the daemon exited:\n{}", daemon.log());
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn sighup_refuses_bad_files_keeping_the_running_config_and_applies_a_good_one() {
    let scratch = ScratchDir::new("reload").unwrap();
    let dir = scratch.path();
    let config = dir.join("tailtrap.toml");
    let shown = config.display().to_string();
    // The CLI reads the daemon's file for the socket; it gets its own, which stays valid.
    let client = dir.join("client.toml");
    std::fs::write(
        &client,
        format!(
            "[daemon]\ndb = \"{dir}/db\"\n\n[api]\nsocket = \"{dir}/api.sock\"\n",
            dir = dir.display()
        ),
    )
    .unwrap();

    let alpha = [("alpha", ALPHA_PORT)];
    let both = [("alpha", ALPHA_PORT), ("beta", BETA_PORT)];
    std::fs::write(&config, config_text(dir, &alpha, "500ms", "")).unwrap();
    let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&client, WAIT);
    let first = status(&client);
    let services = json!(["alpha"]);
    assert_eq!(first["services"], services);
    assert_eq!(first["pwru"]["enabled"], false);
    assert_eq!(first["daemon"]["pid"], daemon.pid());

    // A bad value (an integer where a duration is expected), next to a new service that
    // must not be applied either.
    let text = config_text(dir, &both, "500ms", "baseline_save_every = 60");
    std::fs::write(&config, &text).unwrap();
    let line = line_number(&text, "baseline_save_every = 60", 0);
    assert_refused(
        &mut daemon,
        &client,
        &format!("{shown}, line {line}: key `daemon.baseline_save_every`: invalid type"),
        &services,
    );

    // Well-formed TOML breaking a rule across services: one port for two of them.
    let text = config_text(
        dir,
        &[("alpha", ALPHA_PORT), ("beta", ALPHA_PORT)],
        "500ms",
        "",
    );
    std::fs::write(&config, &text).unwrap();
    let line = line_number(&text, &format!("ports = [{ALPHA_PORT}]"), 1);
    assert_refused(
        &mut daemon,
        &client,
        &format!(
            "{shown}, line {line}: key `services[1].ports`: port {ALPHA_PORT} already belongs to service"
        ),
        &services,
    );

    // No file at all.
    std::fs::remove_file(&config).unwrap();
    assert_refused(
        &mut daemon,
        &client,
        &format!("reading config {shown}: "),
        &services,
    );

    // A good file: a new service, and restart-only changes to [storage] and [capture].
    // The capture restarts with the new probes but keeps its running settings.
    let capture_before = first["capture"]["state"].as_str().unwrap().to_owned();
    assert!(
        !capture_before.contains("enabled = false"),
        "{capture_before}"
    );
    let mut text = config_text(dir, &both, "1s", "");
    text.push_str("\n[capture]\nenabled = false\n");
    std::fs::write(&config, text).unwrap();
    let before = daemon.log().len();
    daemon.signal(Signal::SIGHUP).unwrap();
    daemon.wait_for(WAIT, "status to list the new service", || {
        (status(&client)["services"] == json!(["alpha", "beta"])).then_some(())
    });
    let new = daemon.wait_for(WAIT, "the reload's log lines", || {
        let log = daemon.log();
        let new = log.get(before..).unwrap_or_default();
        new.contains("reloaded services and detector settings")
            .then(|| new.to_owned())
    });
    assert!(!new.contains("reload refused"), "{new}");
    assert!(!new.contains("failed to load"), "{new}");
    let reloaded = new
        .lines()
        .find(|l| l.contains("reloaded services and detector settings"))
        .unwrap();
    assert!(reloaded.contains("services=2"), "{reloaded}");
    let warning = new
        .lines()
        .find(|l| l.contains("take effect at the next start"))
        .unwrap_or_else(|| panic!("no restart warning for the [storage] change:\n{new}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("\"storage\""), "{warning}");
    assert!(warning.contains("\"capture\""), "{warning}");
    for unchanged in ["\"daemon\"", "\"api\"", "\"pwru\""] {
        assert!(!warning.contains(unchanged), "{unchanged} in {warning}");
    }
    assert!(daemon.running(), "the daemon exited:\n{}", daemon.log());
    let after = status(&client);
    assert_eq!(after["daemon"]["pid"], daemon.pid());
    assert!(
        !after["probes"].as_array().unwrap().is_empty(),
        "no probes after the reload: {after}"
    );
    let capture_after = after["capture"]["state"].as_str().unwrap();
    assert!(
        !capture_after.contains("enabled = false"),
        "a restart-only [capture] change was applied by the reload: {capture_after}"
    );
    let last = &after["daemon"]["last_reload"];
    assert_eq!(last["applied"], true, "{last}");
    assert_eq!(
        last["restart_needed"],
        json!(["storage", "capture"]),
        "{last}"
    );
    // Humans see it in the table.
    let table = cli(&client, &["status"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("last reload") && table.contains("need a restart"),
        "{table}"
    );

    // A clean stop.
    daemon.signal(Signal::SIGTERM).unwrap();
    let exit = daemon
        .wait_exit(WAIT)
        .unwrap()
        .unwrap_or_else(|| panic!("still running {:?} after SIGTERM:\n{}", WAIT, daemon.log()));
    let log = daemon.log();
    assert!(exit.success(), "{exit:?}:\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("stopping") && l.contains("SIGTERM")),
        "{log}"
    );
    assert!(log.lines().any(|l| l.ends_with("stopped")), "{log}");
    assert!(
        !dir.join("api.sock").exists(),
        "the socket file outlived the daemon"
    );
    // Once stopped, no daemon answers: the CLI falls back to the database.
    let out = cli(&client, &["status", "--json"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reading the database"),
        "{out:?}"
    );
}
