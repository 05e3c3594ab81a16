//! tailtrap's OCI image (`scripts/image`) run with podman on this host exactly as the Helm
//! chart's DaemonSet declares it: its capabilities, seccomp profile, user, read-only root,
//! host network and PID settings, volumes and mounts, memory limit and arguments are read
//! from the rendered and strictly validated DaemonSet (`helm template` + `k8svalidate`),
//! so the chart and what was tested cannot drift apart. The chart's configuration file
//! comes from its rendered ConfigMap.
//!
//! Checks: the probes load inside the container, loopback TCP traffic in a test cgroup
//! shows up as its own service, `tailtrap status` answers through the socket in the
//! mounted host directory, `/metrics` answers on the host's network, and a restarted
//! container finds its database (baselines restored). Prints the daemon's RSS, memory
//! cgroup usage and CPU for the chart's resources.
//!
//! Root, podman, and helm from `tests/k8svalidate/build.sh`: `#[ignore]`d, host tier only.
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tailtrap_tests::{
    baselines_warm, cli_json, free_port, helm_template, http_get, image_archive, k8s_validate,
    object, rss_kib, Cgroup, LoopingClient, Proto, ScratchDir, ServerOpts, TcpServer,
    SLOW_READER_DETECTOR,
};

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The container, removed (with SIGKILL) on drop.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time", "0", &self.0])
            .output();
    }
}

impl Container {
    fn logs(&self) -> String {
        let out = Command::new("podman")
            .args(["logs", &self.0])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn pid(&self) -> u32 {
        podman(&["inspect", "--format", "{{.State.Pid}}", &self.0])
            .trim()
            .parse()
            .unwrap()
    }
}

/// Kubernetes' `Mi`/`Gi` quantity as podman's `m`/`g`.
fn podman_memory(q: &str) -> String {
    if let Some(n) = q.strip_suffix("Mi") {
        format!("{n}m")
    } else if let Some(n) = q.strip_suffix("Gi") {
        format!("{n}g")
    } else {
        panic!("memory limit {q}: only Mi and Gi are mapped to podman")
    }
}

/// `podman run` arguments for the DaemonSet's pod: every field of its pod and container
/// that podman can express is mapped, and any other kind of volume or setting this test
/// does not know fails it, so a chart change that the test does not follow is noticed.
fn podman_args(ds: &Value, configmap: &Value, scratch: &Path) -> Vec<String> {
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container per pod");
    assert!(
        pod["initContainers"].is_null(),
        "init containers are not mapped"
    );
    let c = &containers[0];
    let sc = &c["securityContext"];
    let mut args: Vec<String> = vec!["--rm=false".into()];
    let mut flag = |s: &str| args.push(s.to_owned());

    if pod["hostNetwork"] == true {
        flag("--network=host");
    }
    if pod["hostPID"] == true {
        flag("--pid=host");
    }
    assert_ne!(
        sc["privileged"], true,
        "the chart must not ask for privileged"
    );
    if let Some(uid) = sc["runAsUser"].as_i64() {
        flag(&format!("--user={uid}"));
    }
    let drop: Vec<&str> = sc["capabilities"]["drop"]
        .as_array()
        .map(|a| a.iter().map(|c| c.as_str().unwrap()).collect())
        .unwrap_or_default();
    assert_eq!(
        drop,
        ["ALL"],
        "the capabilities are given as drop ALL plus a list"
    );
    flag("--cap-drop=all");
    for cap in sc["capabilities"]["add"].as_array().unwrap() {
        flag(&format!("--cap-add=CAP_{}", cap.as_str().unwrap()));
    }
    if sc["allowPrivilegeEscalation"] == false {
        flag("--security-opt=no-new-privileges");
    }
    match sc["seccompProfile"]["type"].as_str() {
        Some("Unconfined") => flag("--security-opt=seccomp=unconfined"),
        Some("RuntimeDefault") | None => {}
        other => panic!("seccomp profile {other:?} is not mapped"),
    }
    // containerd and CRI-O run containers with runc by default. (Debian 12's crun also
    // refuses this host's hybrid cgroup layout.)
    flag("--runtime=runc");
    // A pod inherits the runtime's limits; podman sets its own (open files 2^20), and
    // raising a limit needs CAP_SYS_RESOURCE, which this test's machine does not give
    // even to root. Open files as this process has them, and a process limit runc could
    // set here.
    flag(&format!("--ulimit=nofile={}", nofile()));
    flag("--ulimit=nproc=32768:32768");
    if sc["readOnlyRootFilesystem"] == true {
        // Kubernetes adds no tmpfs of its own on /run or /tmp; podman would.
        flag("--read-only");
        flag("--read-only-tmpfs=false");
    }
    if let Some(mem) = c["resources"]["limits"]["memory"].as_str() {
        flag(&format!("--memory={}", podman_memory(mem)));
    }
    if let Some(cpu) = c["resources"]["limits"]["cpu"].as_str() {
        flag(&format!("--cpus={cpu}"));
    }

    let mut sources: BTreeMap<&str, PathBuf> = BTreeMap::new();
    for v in pod["volumes"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let source = if let Some(hp) = v.get("hostPath") {
            let path = PathBuf::from(hp["path"].as_str().unwrap());
            match hp["type"].as_str() {
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&path).unwrap(),
                Some("Directory") => assert!(path.is_dir(), "{} is no directory", path.display()),
                Some("File") => assert!(path.is_file(), "{} is no file", path.display()),
                t => panic!("hostPath type {t:?} is not mapped"),
            }
            path
        } else if let Some(cm) = v.get("configMap") {
            assert_eq!(cm["name"], configmap["metadata"]["name"]);
            let dir = scratch.join(format!("configmap-{name}"));
            std::fs::create_dir_all(&dir).unwrap();
            for (file, text) in configmap["data"].as_object().unwrap() {
                std::fs::write(dir.join(file), text.as_str().unwrap()).unwrap();
            }
            dir
        } else {
            panic!("volume {v} is of a kind this test does not map");
        };
        sources.insert(name, source);
    }
    for m in c["volumeMounts"].as_array().unwrap() {
        let source = &sources[m["name"].as_str().unwrap()];
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        args.push(format!(
            "--volume={}:{}{ro}",
            source.display(),
            m["mountPath"].as_str().unwrap()
        ));
    }
    assert!(c["command"].is_null(), "the image's entrypoint runs");
    args.push(c["image"].as_str().unwrap().to_owned());
    args.extend(
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned()),
    );
    args
}

/// This process's open-file limit as podman's `soft:hard`.
fn nofile() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit(RLIMIT_NOFILE)");
    format!("{}:{}", lim.rlim_cur, lim.rlim_max)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// `tailtrap status --json` through the daemon's API, polled until `done` accepts it.
fn wait_status(
    config: &Path,
    c: &Container,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let out = Command::new(tailtrap_tests::tailtrap_bin())
            .args(["-v", "status", "--json", "--config"])
            .arg(config)
            .output()
            .unwrap();
        if out.status.success() && String::from_utf8_lossy(&out.stderr).contains("daemon's API") {
            let status: Value = serde_json::from_slice(&out.stdout).unwrap();
            if done(&status) {
                return status;
            }
        }
        let state = podman(&["inspect", "--format", "{{.State.Status}}", &c.0]);
        assert!(
            state.trim() == "running",
            "the container is {state} while waiting for {what}; its log:\n{}",
            c.logs()
        );
        assert!(
            start.elapsed() < timeout,
            "no {what} after {timeout:?}; last status stderr: {}\nthe container's log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
#[ignore = "needs root, podman, the image (scripts/image) and helm (tests/k8svalidate/build.sh): run as root with --include-ignored"]
fn image_runs_as_the_daemonset_declares() {
    let archive = image_archive().unwrap();
    let loaded = podman(&["load", "--input", archive.to_str().unwrap()]);
    let image = loaded
        .lines()
        .find_map(|l| l.split_once("Loaded image").map(|(_, r)| r))
        .and_then(|r| r.split_once(": "))
        .map(|(_, name)| name.trim().to_owned())
        .unwrap_or_else(|| panic!("podman load said {loaded:?}"));
    let (repository, tag) = image.rsplit_once(':').unwrap();

    let scratch = ScratchDir::new("container").unwrap();
    let dir = scratch.path();
    let (state, run) = (dir.join("state"), dir.join("run"));
    let port = free_port().unwrap();
    let values = dir.join("values.yaml");
    // The test's own state and socket directories and a free port; a detector that warms
    // up in seconds so that the restart has baselines to restore.
    let config = format!("[daemon]\ninterval = \"1s\"\n{SLOW_READER_DETECTOR}");
    let values_text = serde_json::json!({
        "image": {"repository": repository, "tag": tag},
        "metrics": {"port": port},
        "hostPaths": {"state": state, "run": run},
        "config": config,
    });
    // JSON is YAML.
    std::fs::write(&values, values_text.to_string()).unwrap();
    let rendered = helm_template(&["-f", values.to_str().unwrap()]).unwrap();
    let objects = k8s_validate(&rendered).unwrap();
    let args = podman_args(
        object(&objects, "DaemonSet"),
        object(&objects, "ConfigMap"),
        dir,
    );
    eprintln!("podman run {}", args.join(" "));

    // The host CLI reads the daemon through the socket in the mounted directory.
    let cli_config = dir.join("cli.toml");
    std::fs::write(
        &cli_config,
        format!(
            "[api]\nsocket = \"{}/api.sock\"\n[daemon]\ndb = \"{}/db\"\n",
            run.display(),
            state.display()
        ),
    )
    .unwrap();

    let cgroup = Cgroup::create("container").unwrap();
    let server = TcpServer::spawn(ServerOpts {
        cgroup: Some(&cgroup),
        ..ServerOpts::loopback()
    })
    .unwrap();
    let service = cgroup.rel_path().to_owned();

    let name = format!("tailtrap-test-{}", std::process::id());
    let _ = Command::new("podman")
        .args(["rm", "--force", "--time", "0", &name])
        .output();
    let mut run_args = vec!["run", "--detach", "--name", &name];
    run_args.extend(args.iter().map(String::as_str));
    // The guard first: a container that was created but failed to start is removed too.
    let container = Container(name.clone());
    podman(&run_args);

    let status = wait_status(
        &cli_config,
        &container,
        Duration::from_secs(90),
        "answer from the daemon's API",
        |_| true,
    );
    let probes = status["probes"].as_array().unwrap();
    let attached: Vec<&Value> = probes
        .iter()
        .filter(|p| {
            let m = p["method"].as_str().unwrap_or_default();
            m.starts_with("fentry") || m.starts_with("fexit") || m.starts_with("tp_btf")
        })
        .collect();
    let read = probes
        .iter()
        .find(|p| p["probe"] == "tcp-socket-read")
        .unwrap();
    assert!(
        !read["method"]
            .as_str()
            .unwrap_or_default()
            .starts_with("unavailable"),
        "{probes:#?}"
    );
    eprintln!(
        "probes attached in the container: {}",
        attached
            .iter()
            .map(|p| format!("{} {}", p["probe"], p["method"]))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let traffic = LoopingClient::start(server.addr(), Proto::Tcp);
    let status = wait_status(
        &cli_config,
        &container,
        Duration::from_secs(120),
        "warm baselines of the test cgroup's service",
        |s| baselines_warm(s, "tcp-socket-read", &[&service]),
    );
    let row = status["latency"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == service.as_str() && r["probe"] == "tcp-socket-read")
        .unwrap();
    eprintln!("service row: {row}");

    // Inside the container too, through the same socket.
    let inside = podman(&["exec", &name, "tailtrap", "status"]);
    assert!(inside.contains(&service), "{inside}");

    let metrics = http_get(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "/metrics",
        None,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains(&format!("service=\"{service}\"")),
        "no series of {service} in /metrics"
    );

    // What the chart's resources are set from: the daemon's RSS, its memory cgroup (which
    // also holds the BPF maps' kernel memory) and its CPU over 20 s of traffic.
    let pid = container.pid();
    let (t0, ticks0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(20));
    let cpu = (cpu_ticks(pid) - ticks0) as f64 / 100.0 / t0.elapsed().as_secs_f64();
    let mem = podman(&["stats", "--no-stream", "--format", "{{.MemUsage}}", &name]);
    eprintln!(
        "measured: RSS {} KiB, memory cgroup {}, CPU {:.1} % of a core",
        rss_kib(pid),
        mem.trim(),
        cpu * 100.0
    );

    // A restart (SIGTERM, then a new start) keeps the database on the host: the baselines
    // saved at the stop are restored, and the service is measured again.
    podman(&["restart", "--time", "45", &name]);
    wait_status(
        &cli_config,
        &container,
        Duration::from_secs(90),
        "the service measured again after the restart",
        |s| {
            s["latency"].as_array().is_some_and(|rows| {
                rows.iter()
                    .any(|r| r["service"] == service.as_str() && r["probe"] == "tcp-socket-read")
            })
        },
    );
    let log = container.logs();
    let restored = log
        .lines()
        .rev()
        .find(|l| l.contains("baselines restored"))
        .unwrap_or_else(|| panic!("no 'baselines restored' line:\n{log}"));
    assert!(
        log.matches("baselines restored").count() >= 2 && !restored.contains("baselines=0"),
        "nothing restored at the second start: {restored}\n{log}"
    );
    eprintln!("after the restart: {restored}");
    drop(traffic);
    let (_, how) = cli_json(&cli_config, &["history", &service, "--summary", "--json"]);
    assert!(how.contains("daemon's API"), "{how}");
    drop(container);
}
