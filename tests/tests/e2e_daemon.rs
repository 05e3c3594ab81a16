//! End to end: the real `tailtrap run` daemon with a test configuration (short interval
//! and warm-up, private database and socket), real TCP services on loopback, the pwru
//! stand-in, and the retrieval CLI through the API and through the database.
//!
//! Needs root and the `tailtrap` binary of the same build (`cargo build -p tailtrap`).
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use tailtrap_tests::{
    baselines_warm, cli, cli_json, config_check, fake_pwru, require_vm, tailtrap_bin, vm_kernel,
    Daemon, DaemonConfig, EchoServer, LoopingClient, Proto, ScratchDir, SLOW_READER_DETECTOR,
};

/// The pwru session's deadline, a bound only: sessions end at their output limit, well
/// before it. The stand-in is a bash script, which under qemu's software emulation, or on a
/// busy machine, takes seconds just to start.
fn pwru_deadline() -> Duration {
    if vm_kernel().is_some() {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(30)
    }
}

/// The pwru stand-in of the capture crate (honours pwru 1.0.12's CLI, prints real JSON).
fn incidents_of(config: &Path, service: &str) -> Vec<Value> {
    let (v, _) = cli_json(config, &["incidents", "--json", "--service", service]);
    v["incidents"].as_array().cloned().unwrap_or_default()
}

fn id_of(incident: &Value) -> u64 {
    incident["id"].as_u64().unwrap()
}

/// The stored samples of incident `id`.
fn samples_of(config: &Path, id: u64) -> Vec<Value> {
    let (v, _) = cli_json(
        config,
        &["samples", &id.to_string(), "--json", "--limit", "10000"],
    );
    v["samples"].as_array().cloned().unwrap_or_default()
}

#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn tcp_slow_reader_opens_an_incident_with_pwru_lines_that_survive_a_daemon_kill() {
    slow_reader_scenario(Proto::Tcp);
}

/// udp-socket-read exists only as fentry: BTF tracepoints have no stand-in for it, so this
/// runs where fentry is known to work, the stock kernels of the VM tier.
#[test]
#[ignore = "VM only: udp-socket-read needs fentry (stock kernel); run by tests/vm/run-vm-tests.sh"]
fn vm_only_udp_slow_reader_opens_an_incident_with_pwru_lines_that_survive_a_daemon_kill() {
    require_vm();
    slow_reader_scenario(Proto::Udp);
}

/// NIC hardware stamps on a device with a PTP clock (docs/probes.md, "NIC hardware
/// stamps"): the VM runner gives each guest QEMU's e1000e, whose clock answers the offset
/// reads (all but the cross-timestamp) and which takes SIOCSHWTSTAMP, but stamps no packet.
/// With `hw_rx_timestamps = "use"` the daemon leaves the device alone and says stamping is
/// off; with `"enable"` it turns RX stamping on, reads the clock's offset by the next method
/// down, and puts the setting back when it stops, which a third run with `"use"` sees.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored"]
fn vm_only_a_nic_with_a_clock_is_stamped_only_when_enabled_and_put_back_at_stop() {
    require_vm();
    let name = tailtrap_tests::guest_nic();
    let scratch = ScratchDir::new("nic-stamps").unwrap();
    let dir = scratch.path();
    let row_with = |mode: &str, while_running: &dyn Fn(&Daemon, &Path)| -> Value {
        let config = dir.join(format!("tailtrap-{mode}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"
[daemon]
interval = "200ms"
db = "{dir}/db-{mode}"

[api]
socket = "{dir}/api-{mode}.sock"

[probes]
hw_rx_timestamps = "{mode}"

[pwru]
enabled = false
"#,
                dir = dir.display()
            ),
        )
        .unwrap();
        let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
        daemon.wait_for_api(&config, Duration::from_secs(120));
        let row = nic_row(&daemon, &config, &name, |r| {
            r["state"] != "on" || r["timed_by_nic_to_stack"] == true
        });
        // A device with a clock is here: nic-to-stack runs, within ip-start's programs.
        assert_eq!(
            nic_to_stack_method(&config),
            "within ip-start's programs",
            "{mode}"
        );
        let text = cli(&config, &["status"]);
        eprintln!("[{mode}] {row}\n{}", String::from_utf8_lossy(&text.stdout));
        while_running(&daemon, &config);
        daemon.signal(Signal::SIGTERM).unwrap();
        let exit = daemon.wait_exit(Duration::from_secs(60)).unwrap();
        assert!(
            exit.is_some_and(|e| e.success()),
            "{exit:?}\n{}",
            daemon.log()
        );
        row
    };

    let untouched = row_with("use", &|_, _| {});
    assert_eq!(untouched["state"], "off", "{untouched}");
    assert!(
        untouched["phc"]
            .as_str()
            .is_some_and(|p| p.starts_with("/dev/ptp")),
        "{untouched}"
    );
    assert_eq!(untouched["rx_filter"], "none", "{untouched}");
    assert_eq!(
        untouched["summary"],
        format!(
            "no hardware RX stamps on {name}: RX stamping is off (rx_filter none); \
             hw_rx_timestamps = \"enable\" turns it on"
        )
    );
    assert!(untouched["offset_ns"].is_null(), "{untouched}");
    assert_eq!(untouched["timed_by_nic_to_stack"], false, "{untouched}");

    let enabled = row_with("enable", &|_, _| {});
    assert_eq!(enabled["state"], "on", "{enabled}");
    assert_eq!(enabled["enabled_by_tailtrap"], true, "{enabled}");
    assert_eq!(enabled["rx_filter"], "all", "{enabled}");
    // e1000e has no cross-timestamp: the bracketing read.
    assert_eq!(enabled["offset_method"], "extended", "{enabled}");
    assert!(enabled["offset_ns"].is_i64(), "{enabled}");
    // The kernel took its clock: nic-to-stack times the packets it stamps.
    assert_eq!(enabled["timed_by_nic_to_stack"], true, "{enabled}");
    assert!(
        enabled["offset_uncertainty_ns"]
            .as_u64()
            .is_some_and(|u| u < 10_000_000),
        "{enabled}"
    );

    // Put back at stop; then a PTP daemon's doing, seen while tailtrap runs: stamping
    // turned on by someone else is used (and not put back), and its end is seen too.
    let after = row_with("use", &|daemon, config| {
        set_rx_filter(&name, libc::HWTSTAMP_FILTER_ALL as i32);
        let on = nic_row(daemon, config, &name, |r| {
            r["state"] == "on" && !r["offset_read_ns"].is_null()
        });
        assert_eq!(on["enabled_by_tailtrap"], false, "{on}");
        assert_eq!(on["rx_filter"], "all", "{on}");
        nic_row(daemon, config, &name, |r| {
            r["timed_by_nic_to_stack"] == true
        });
        set_rx_filter(&name, libc::HWTSTAMP_FILTER_NONE as i32);
        let off = nic_row(daemon, config, &name, |r| r["state"] == "off");
        assert_eq!(off["timed_by_nic_to_stack"], false, "{off}");
    });
    assert_eq!(after["rx_filter"], "none", "put back at stop: {after}");
    assert_eq!(after["state"], "off", "{after}");
}

/// How status says nic-to-stack is attached.
fn nic_to_stack_method(config: &Path) -> String {
    let (s, _) = cli_json(config, &["status", "--json"]);
    s["probes"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["probe"] == "nic-to-stack"))
        .and_then(|r| r["method"].as_str())
        .unwrap_or_else(|| panic!("no nic-to-stack row: {s}"))
        .to_owned()
}

/// The status row of interface `name` once `ready` holds (waits up to 60 s).
fn nic_row(daemon: &Daemon, config: &Path, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    daemon.wait_for(Duration::from_secs(60), "the NIC's row", || {
        let (s, _) = cli_json(config, &["status", "--json"]);
        s["nic_stamps"]
            .as_array()?
            .iter()
            .find(|r| r["interface"] == name && ready(r))
            .cloned()
    })
}

/// Set `name`'s RX stamping filter as a PTP daemon would (SIOCSHWTSTAMP, TX off).
fn set_rx_filter(name: &str, rx_filter: i32) {
    let mut cfg = libc::hwtstamp_config {
        flags: 0,
        tx_type: 0,
        rx_filter,
    };
    // SAFETY: plain data; ifreq is zeroed, then its name and data pointer are set.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &b) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = b as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut cfg as *mut libc::hwtstamp_config).cast();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: `req` points at `cfg`, which outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSHWTSTAMP, &mut req) };
    assert_eq!(
        rc,
        0,
        "SIOCSHWTSTAMP on {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// A service whose application reads 20 ms late, next to a quiet one, through the whole
/// incident life cycle and a daemon kill.
fn slow_reader_scenario(proto: Proto) {
    let (name, read_probe) = match proto {
        Proto::Tcp => ("tcp", "tcp-socket-read"),
        Proto::Udp => ("udp", "udp-socket-read"),
    };
    let scratch = ScratchDir::new(name).unwrap();
    let dir = scratch.path();
    let slow = EchoServer::spawn(proto).unwrap();
    let quiet = EchoServer::spawn(proto).unwrap();
    let (slow_port, quiet_port) = (slow.addr().port(), quiet.addr().port());
    let config = DaemonConfig::new(dir)
        .daemon_keys("baseline_save_every = \"1s\"\npwru_ignore_prerequisites = true")
        .service("slow", slow_port)
        .service("quiet", quiet_port)
        .table(SLOW_READER_DETECTOR)
        .table(
            r#"[capture]
# Loopback's fast-read baseline has a long p99.9 (delayed ACKs, connection starts); a fixed
# flight threshold keeps the pre-trigger check about the 20 ms reads.
flight_threshold = "5ms""#,
        )
        .pwru_keys(&format!(
            r#"binary = "{pwru}"
deadline = "{pwru_deadline}s"
# The stand-in stops by itself after this many of its 52 lines: a session takes about a
# second, so a session for another incident rarely keeps this one's busy.
output_limit_lines = 20
# A busy machine can take seconds to run the stand-in's SIGTERM handler (when a session
# does reach its deadline); the grace must not be what the test measures.
kill_grace = "30s"
cooldown = "1s""#,
            pwru_deadline = pwru_deadline().as_secs(),
            pwru = fake_pwru().display(),
        ))
        .write()
        .unwrap();
    let check = config_check(&config);
    assert!(check.status.success(), "{check:?}");

    let interfaces_before = interface_names();
    let daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    check_nic_stamps(&daemon, &config, &interfaces_before);
    let (status, _) = cli_json(&config, &["status", "--json"]);
    assert_eq!(status["services"], serde_json::json!(["slow", "quiet"]));
    assert_eq!(status["pwru"]["prerequisites_ignored"], true);
    // Status names what the kernel lacks: on 5.10 (the VM tier sets TAILTRAP_KERNEL) the
    // stand-ins, each with its cost; from 6.1 on, nothing.
    let lacks: Vec<&str> = status["missing_kernel_features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert!(m["cost"].as_str().is_some_and(|c| !c.is_empty()), "{m}");
            m["feature"].as_str().unwrap_or_default()
        })
        .collect();
    if std::env::var("TAILTRAP_KERNEL").is_ok_and(|k| k.starts_with("5.10.")) {
        assert_eq!(lacks.len(), 4, "{lacks:?}");
    } else {
        assert!(lacks.is_empty(), "{lacks:?}");
    }
    let read_method = status["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["probe"] == read_probe)
        .map(|p| p["method"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    // Where the read probe cannot attach, the scenario has nothing to watch: that is a
    // failure, not a pass (the UDP case runs only where fentry works).
    assert!(
        !read_method.is_empty() && !read_method.starts_with("unavailable"),
        "{read_probe} is {read_method:?}: {status}"
    );

    // Fast reads until both baselines are warm.
    let _quiet_traffic = LoopingClient::start(quiet.addr(), proto);
    let slow_traffic = LoopingClient::start(slow.addr(), proto);
    // Warm-up counts intervals of traffic, not seconds: a starved guest runs fewer of them
    // per second (a CI guest beside two other guests got a third of them).
    daemon.wait_for(Duration::from_secs(180), "warm baselines", || {
        let (s, _) = cli_json(&config, &["status", "--json"]);
        baselines_warm(&s, read_probe, &["slow", "quiet"]).then_some(())
    });

    // A busy machine moves fast loopback reads on its own, which may open incidents on
    // either service before the slowdown: that is the detector doing its job. The slowdown
    // starts once none is open and no pwru session runs; the incident under test is the
    // first one opened after it. Such noise can last: a 5.10 guest beside two builds
    // opened incidents on both services (5 ms to 13 ms of CPU wait) for over a minute.
    let before: Vec<u64> = daemon.wait_for(
        Duration::from_secs(180),
        "no open incident and no pwru session",
        || {
            // Incidents first, pwru last: a session is asked for while its incident is
            // open (on a slow guest, seconds after it opened), so incidents all closed and
            // then pwru idle means no session is coming; the other order could see pwru
            // idle just before a request and the incident closed just after.
            let slow_incidents = incidents_of(&config, "slow");
            let closed = slow_incidents
                .iter()
                .chain(&incidents_of(&config, "quiet"))
                .all(|i| i["state"] == "closed");
            let calm = closed && {
                let (s, _) = cli_json(&config, &["status", "--json"]);
                s["pwru"]["busy"] == false
            };
            calm.then(|| slow_incidents.iter().map(id_of).collect())
        },
    );
    if !before.is_empty() {
        eprintln!("incidents on `slow` before its slowdown (machine noise): {before:?}");
        // Past the pwru cooldown (1 s) of their sessions, so the next one runs.
        std::thread::sleep(Duration::from_secs(1));
    }

    // The application now sleeps 20 ms before each read.
    slow.set_read_delay(Duration::from_millis(20)).unwrap();
    let opened = Instant::now();
    let incident = daemon.wait_for(Duration::from_secs(30), "an incident on `slow`", || {
        incidents_of(&config, "slow")
            .into_iter()
            .find(|i| !before.contains(&id_of(i)))
    });
    eprintln!("incident opened {:?} after the slowdown", opened.elapsed());
    let id = id_of(&incident);
    let probes: Vec<&str> = incident["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(probes.contains(&read_probe), "{probes:?}");

    // `incidents show` through the API: evidence and the stage.
    let (view, how) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert!(how.contains("daemon's API"), "{how}");
    assert_eq!(view["incident"]["service"], "slow");
    let stage = &view["incident"]["stages"];
    assert_eq!(stage["verdict"], "application read delay", "{stage}");
    let evidence = &view["incident"]["evidence"];
    assert_eq!(evidence["headline"]["probe"], read_probe);
    assert!(
        evidence["headline"]["observed"]["value_ns"]
            .as_f64()
            .unwrap()
            > 10e6
    );

    // The pwru stand-in ran with the service's port and its lines are stored.
    let pwru_done = daemon.wait_for(
        Duration::from_secs(30) + pwru_deadline(),
        "the pwru session's end",
        || {
            let (v, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
            (v["incident"]["pwru"]["state"] == "done").then_some(v)
        },
    );
    // The session's own command (stored with it), not the stand-in's argv log: that log
    // holds only the latest session, which may be another incident's.
    let message = pwru_done["incident"]["pwru"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains(&format!(
            "--filter-track-skb '{name} and dst port {slow_port}"
        )),
        "{message}"
    );
    let stored = pwru_done["incident"]["pwru"]["lines_stored"]
        .as_u64()
        .unwrap();
    assert!(stored > 0);
    let (pwru, _) = cli_json(&config, &["pwru", &id.to_string(), "--json"]);
    let lines = pwru["lines"].as_array().unwrap();
    assert_eq!(lines.len() as u64, stored);
    assert!(lines
        .iter()
        .all(|l| l["raw"].as_str().unwrap().starts_with('{')));
    // What an operator sees (shown with --nocapture).
    let show = cli(&config, &["incidents", "show", &id.to_string()]);
    assert!(show.status.success());
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("application read delay"), "{text}");
    eprintln!("$ tailtrap incidents show {id}\n{text}");
    // Samples: the service's port, above the armed threshold, some from before the trigger.
    // They are stored in batches while the incident is open, so they are waited for: the
    // pwru session is no clock for them.
    let is_armed =
        |s: &Value| s["probe"] == read_probe && s["flags"].as_array().is_some_and(|f| f.is_empty());
    let samples = daemon.wait_for(Duration::from_secs(30), "armed samples stored", || {
        let samples = samples_of(&config, id);
        samples.iter().any(is_armed).then_some(samples)
    });
    assert!(samples.iter().all(|s| s["flow"]["dport"] == slow_port));
    // The slowest lead; `--by-time` lists the same samples in stored (time) order.
    let latencies: Vec<u64> = samples
        .iter()
        .filter_map(|s| s["latency_ns"].as_u64())
        .collect();
    assert!(latencies.windows(2).all(|w| w[0] >= w[1]), "{latencies:?}");
    let (by_time, _) = cli_json(
        &config,
        &[
            "samples",
            &id.to_string(),
            "--json",
            "--by-time",
            "--limit",
            "10000",
        ],
    );
    let key = |s: &Value| (s["time_ns"].as_u64(), s["latency_ns"].as_u64());
    let mut a: Vec<_> = samples.iter().map(key).collect();
    let mut b: Vec<_> = by_time["samples"]
        .as_array()
        .map(|l| l.iter().map(key).collect())
        .unwrap_or_default();
    // Samples may have been stored between the two reads.
    b.retain(|k| a.contains(k));
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    let (status, _) = cli_json(&config, &["status", "--json"]);
    assert!(
        samples.iter().any(|s| s["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "pre-trigger"))),
        "no pre-trigger samples; capture: {}; daemon log:\n{}",
        status["capture"],
        daemon.log()
    );
    let armed: Vec<&Value> = samples.iter().filter(|s| is_armed(s)).collect();
    assert!(
        armed
            .iter()
            .all(|s| s["latency_ns"].as_u64().unwrap() > 1_000_000),
        "{armed:?}"
    );

    // Fast reads again: the incident closes.
    slow.set_read_delay(Duration::ZERO).unwrap();
    daemon.wait_for(Duration::from_secs(60), "the incident to close", || {
        let (v, _) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
        (v["incident"]["state"] == "closed").then_some(())
    });
    drop(slow_traffic);
    // The quiet service may have had incidents of its own on a busy machine; what must
    // hold is that the slow service's packets never counted as its: every sample it
    // caught is its own.
    for quiet_incident in incidents_of(&config, "quiet") {
        let quiet_id = id_of(&quiet_incident);
        eprintln!(
            "the quiet service had incident {quiet_id} (machine noise): probes {}, evidence {}",
            quiet_incident["probes"], quiet_incident["evidence"]
        );
        let foreign: Vec<Value> = samples_of(&config, quiet_id)
            .into_iter()
            .filter(|s| s["flow"]["dport"] != quiet_port)
            .collect();
        assert!(
            foreign.is_empty(),
            "incident {quiet_id} of `quiet` holds other ports' samples: {foreign:#?}"
        );
    }

    // SIGKILL: the incident is still there, read from the database directly ...
    let mut daemon = daemon;
    daemon.kill().unwrap();
    let (view, how) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert!(how.contains("reading the database"), "{how}");
    assert_eq!(view["incident"]["state"], "closed");
    let (pwru, _) = cli_json(&config, &["pwru", &id.to_string(), "--json"]);
    assert_eq!(pwru["lines"].as_array().unwrap().len() as u64, stored);
    let export = cli(&config, &["export", &id.to_string()]);
    assert!(export.status.success());
    let doc: Value = serde_json::from_slice(&export.stdout).unwrap();
    assert_eq!(doc["format"], "tailtrap-incident/2");
    assert_eq!(doc["incident"]["id"], id);
    assert!(doc["incident"]["evidence"]["headline"].is_object(), "{doc}");
    assert_eq!(doc["pwru"].as_array().unwrap().len() as u64, stored);

    // ... and through a restarted daemon, which stops cleanly on SIGTERM.
    let mut daemon = Daemon::start(&config, dir, &[]).unwrap();
    daemon.wait_for_api(&config, Duration::from_secs(60));
    let (view, how) = cli_json(&config, &["incidents", "show", &id.to_string(), "--json"]);
    assert!(how.contains("daemon's API"), "{how}");
    assert_eq!(view["incident"]["pwru"]["lines_stored"], stored);
    // The global options anywhere: before the command, and between it and its subcommand.
    for args in [
        &[
            "--config",
            &config.display().to_string(),
            "incidents",
            "show",
            &id.to_string(),
            "--json",
        ][..],
        &[
            "incidents",
            "--json",
            "--config",
            &config.display().to_string(),
            "show",
            &id.to_string(),
        ],
    ] {
        let out = Command::new(tailtrap_bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let same: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(same, view, "{args:?}");
    }
    let log = daemon.log();
    assert!(
        log.contains("baselines restored") && !log.contains("baselines=0"),
        "{log}"
    );
    daemon.signal(Signal::SIGTERM).unwrap();
    let status = daemon
        .wait_exit(Duration::from_secs(120))
        .unwrap()
        .unwrap_or_else(|| panic!("no exit 120 s after SIGTERM: {}", daemon.log()));
    assert!(status.success(), "{status:?}: {}", daemon.log());
    assert!(
        !dir.join("api.sock").exists(),
        "the socket file outlived the daemon"
    );
}

/// Without root or a daemon: the CLI reads a database with its global options anywhere on
/// the command line (the same answer in every order), and its answers carry the stored
/// evidence and stage attribution as JSON, not as JSON text.
#[test]
fn the_cli_takes_its_global_options_anywhere_and_answers_json_all_the_way_down() {
    let scratch = ScratchDir::new("cli-global").unwrap();
    let dir = scratch.path();
    let db = dir.join("db");
    {
        let store = storage::Store::open(&db, storage::StoreConfig::default()).unwrap();
        store
            .open_incident(&storage::NewIncident {
                service: "web".into(),
                probes: vec![model::Probe::TcpSocketRead],
                opened_ns: 1_700_000_000_000_000_000,
                evidence_json: r#"{"headline":{"probe":"tcp-socket-read","ratio":3.5}}"#.into(),
                stages_json: r#"{"verdict":"application read delay"}"#.into(),
            })
            .unwrap();
    }
    // An empty file: the built-in defaults, whatever /etc/tailtrap holds.
    let config = dir.join("tailtrap.toml");
    std::fs::write(&config, "").unwrap();
    let (config, db) = (config.display().to_string(), db.display().to_string());
    let socket = dir.join("no-daemon.sock").display().to_string();
    let run = |args: &[&str]| -> Value {
        let out = Command::new(tailtrap_bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out:?}"))
    };

    let show = [
        &[
            "--config",
            &config,
            "--db",
            &db,
            "--socket",
            &socket,
            "--json",
            "incidents",
            "show",
            "1",
        ][..],
        &[
            "incidents",
            "--config",
            &config,
            "--json",
            "show",
            "--db",
            &db,
            "1",
            "--socket",
            &socket,
        ],
        &[
            "incidents",
            "show",
            "1",
            "--socket",
            &socket,
            "--db",
            &db,
            "--json",
            "--config",
            &config,
        ],
    ]
    .map(run);
    assert_eq!(show[1], show[0]);
    assert_eq!(show[2], show[0]);
    let list = [
        &[
            "--json",
            "--db",
            &db,
            "incidents",
            "--socket",
            &socket,
            "--config",
            &config,
        ][..],
        &[
            "incidents",
            "--json",
            "--db",
            &db,
            "--socket",
            &socket,
            "--config",
            &config,
        ],
    ]
    .map(run);
    assert_eq!(list[1], list[0]);
    let export = run(&[
        "--db", &db, "--socket", &socket, "--config", &config, "export", "1",
    ]);
    assert_eq!(export["format"], "tailtrap-incident/2");

    for incident in [
        &show[0]["incident"],
        &list[0]["incidents"][0],
        &export["incident"],
    ] {
        assert_eq!(incident["evidence"]["headline"]["ratio"], 3.5, "{incident}");
        assert_eq!(
            incident["stages"]["verdict"], "application read delay",
            "{incident}"
        );
        assert!(incident.get("evidence_json").is_none(), "{incident}");
        assert!(incident.get("stages_json").is_none(), "{incident}");
    }

    // A global option the command has no use for is refused by name.
    let out = Command::new(tailtrap_bin())
        .args(["--socket", &socket, "config", "check", &config])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--socket means nothing to `tailtrap config check`"),
        "{stderr}"
    );
}

fn interface_names() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// Status lists hardware RX stamping on every interface there was before the daemon and
/// still is: stamps in use with their clock's offset, or "no hardware RX stamps on <dev>"
/// and why (no device here stamps: neither this host's nor the guests' emulated NICs).
fn check_nic_stamps(daemon: &Daemon, config: &Path, before: &[String]) {
    let rows = daemon.wait_for(
        Duration::from_secs(60),
        "the interfaces' RX stamping",
        || {
            let (s, _) = cli_json(config, &["status", "--json"]);
            s["nic_stamps"]
                .as_array()
                .filter(|rows| !rows.is_empty())
                .cloned()
        },
    );
    let listed: Vec<&str> = rows
        .iter()
        .map(|r| r["interface"].as_str().unwrap())
        .collect();
    let now = interface_names();
    for name in before.iter().filter(|n| now.contains(n)) {
        assert!(listed.contains(&name.as_str()), "{name} missing: {rows:?}");
    }
    for r in &rows {
        let name = r["interface"].as_str().unwrap();
        let summary = r["summary"].as_str().unwrap();
        if r["timed_by_nic_to_stack"] == true {
            assert_eq!(r["state"], "on", "{r}");
        }
        if r["state"] == "on" {
            assert!(r["phc"].is_string() && r["offset_ns"].is_i64(), "{r}");
        } else {
            assert!(
                summary.starts_with(&format!("no hardware RX stamps on {name}: ")),
                "{r}"
            );
            assert!(r["offset_ns"].is_null(), "{r}");
        }
    }
    let text = cli(config, &["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        rows.iter().all(|r| r["state"] == "on") || text.contains("no hardware RX stamps on "),
        "{text}"
    );
    // nic-to-stack runs where some device has a clock, and says why not elsewhere (the
    // development host: no device has a PHC).
    let method = nic_to_stack_method(config);
    if rows.iter().any(|r| r["phc"].is_string()) {
        assert_eq!(method, "within ip-start's programs", "{rows:?}");
    } else {
        assert!(
            method.starts_with(
                "unavailable: no network device here stamps received packets with a PTP hardware clock"
            ),
            "{method}"
        );
    }
}
