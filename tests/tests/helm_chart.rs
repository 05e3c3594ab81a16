//! The Helm chart (`packaging/kubernetes/tailtrap`) without a cluster: `helm lint`, `helm
//! template` with the defaults and with every option on, every rendered object decoded
//! strictly into Kubernetes' own API types (k8s.io/api, the Prometheus operator's types
//! for the monitors) by `tests/k8svalidate`, and the rendered TOML checked by `tailtrap
//! config check`. A misspelt field must fail the validation.
//!
//! helm and the validator are built from the Go module proxy by
//! `tests/k8svalidate/build.sh` (cached; `TAILTRAP_K8S_TOOLS` from scripts/test), hence
//! `#[ignore]` like the other tests that need more than `cargo test` brings.
// Test code: a failed step should panic with its context.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tailtrap_tests::{
    chart_dir, helm, helm_template, k8s_validate, object, tailtrap_bin, ScratchDir,
};

/// Every option of the chart on, and a configuration that sets keys the chart owns.
const ALL_ON: &str = r#"
image:
  repository: registry.example/tailtrap
  tag: "0.1.0-test"
imagePullSecrets:
  - name: regcred
metrics:
  port: 10436
  podMonitor:
    enabled: true
    labels: {release: prometheus}
  serviceMonitor:
    enabled: true
    labels: {release: prometheus}
pwru:
  hostPath: /usr/local/bin/pwru
priorityClassName: system-node-critical
podAnnotations: {example.com/team: net}
podLabels: {team: net}
serviceAccount:
  annotations: {example.com/owner: net}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/arch, operator: In, values: [amd64]}
config: |
  [daemon]
  interval = "2s"
  db = "/elsewhere/db"
  [metrics]
  listen = "127.0.0.1:1"
  [[services]]
  name = "web"
  cgroup = "kubepods.slice"
  ports = [80, 443]
  [detector]
  min_ratio = 2.5
  [otlp.resource_attributes]
  "k8s.cluster.name" = "eu-1"
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

/// `tailtrap config check` on the ConfigMap's TOML; the TOML itself.
fn check_config(objects: &[Value], dir: &Path) -> String {
    let toml = object(objects, "ConfigMap")["data"]["tailtrap.toml"]
        .as_str()
        .expect("the ConfigMap holds tailtrap.toml")
        .to_owned();
    let file = write(dir, "tailtrap.toml", &toml);
    let out = Command::new(tailtrap_bin())
        .args(["config", "check", &file])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tailtrap config check refused the chart's TOML:\n{}\n{toml}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn container(objects: &[Value]) -> &Value {
    &object(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
}

fn caps(objects: &[Value]) -> Vec<&str> {
    container(objects)["securityContext"]["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect()
}

#[test]
#[ignore = "needs helm and k8svalidate (tests/k8svalidate/build.sh: Go and the module proxy once): run with --include-ignored"]
fn defaults_lint_render_and_decode_strictly() {
    let dir = ScratchDir::new("helm-defaults").unwrap();
    let lint = helm(&["lint", "--strict", chart_dir().to_str().unwrap()]).unwrap();
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let objects = k8s_validate(&helm_template(&[]).unwrap()).unwrap();
    assert_eq!(
        kinds(&objects),
        ["ConfigMap", "DaemonSet", "ServiceAccount"]
            .map(String::from)
            .into(),
        "{objects:#?}"
    );
    let ds = object(&objects, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], Value::Null, "hostPID only with pwru");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["tolerations"][0]["operator"], "Exists");
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    let c = container(&objects);
    assert_eq!(c["securityContext"]["privileged"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert!(
        !caps(&objects).contains(&"SYS_ADMIN"),
        "{:?}",
        caps(&objects)
    );
    assert_eq!(c["image"], "tailtrap:0.1.0");
    assert_eq!(c["ports"][0]["containerPort"], 10435);
    let mounts: BTreeSet<&str> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for want in [
        "/etc/tailtrap",
        "/var/lib/tailtrap",
        "/run/tailtrap",
        "/sys/fs/cgroup",
        "/sys/kernel/btf",
        "/sys/kernel/tracing",
    ] {
        assert!(mounts.contains(want), "{want} not mounted: {mounts:?}");
    }
    assert!(c["resources"]["limits"]["memory"].is_string());

    let toml = check_config(&objects, dir.path());
    assert!(toml.contains("listen = \"0.0.0.0:10435\""), "{toml}");
    assert!(toml.contains("db = \"/var/lib/tailtrap/db\""), "{toml}");
    assert!(
        toml.contains("socket = \"/run/tailtrap/api.sock\""),
        "{toml}"
    );
}

#[test]
#[ignore = "needs helm and k8svalidate (tests/k8svalidate/build.sh: Go and the module proxy once): run with --include-ignored"]
fn every_option_on_lints_renders_and_decodes_strictly() {
    let dir = ScratchDir::new("helm-all-on").unwrap();
    let values = write(dir.path(), "values.yaml", ALL_ON);
    let lint = helm(&[
        "lint",
        "--strict",
        chart_dir().to_str().unwrap(),
        "-f",
        &values,
    ])
    .unwrap();
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let objects = k8s_validate(&helm_template(&["-f", &values]).unwrap()).unwrap();
    assert_eq!(
        kinds(&objects),
        [
            "ConfigMap",
            "DaemonSet",
            "PodMonitor",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
        .map(String::from)
        .into()
    );
    let pod = &object(&objects, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(caps(&objects).contains(&"SYS_ADMIN"));
    let c = container(&objects);
    assert_eq!(c["image"], "registry.example/tailtrap:0.1.0-test");
    assert_eq!(c["ports"][0]["containerPort"], 10436);
    assert!(c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["mountPath"] == "/usr/local/bin/pwru"));
    // The monitors scrape the port by its name, which the pod declares.
    assert_eq!(
        object(&objects, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"],
        c["ports"][0]["name"]
    );
    assert_eq!(object(&objects, "Service")["spec"]["clusterIP"], "None");
    assert_eq!(
        object(&objects, "ServiceMonitor")["metadata"]["labels"]["release"],
        "prometheus"
    );

    // The user's keys are kept; those the chart owns follow its mounts and values.
    let toml = check_config(&objects, dir.path());
    for want in [
        "interval = \"2s\"",
        "db = \"/var/lib/tailtrap/db\"",
        "listen = \"0.0.0.0:10436\"",
        "binary = \"/usr/local/bin/pwru\"",
        "min_ratio = 2.5",
        "ports = [80, 443]",
        "\"k8s.cluster.name\" = \"eu-1\"",
        "[[services]]",
    ] {
        assert!(toml.contains(want), "{want:?} missing from\n{toml}");
    }
    assert!(!toml.contains("/elsewhere"), "{toml}");
}

#[test]
#[ignore = "needs helm and k8svalidate (tests/k8svalidate/build.sh: Go and the module proxy once): run with --include-ignored"]
fn misspelt_fields_are_rejected() {
    let rendered = helm_template(&[]).unwrap();
    // A field the type does not have, and one in the wrong case (encoding/json alone would
    // take `hostnetwork` for `hostNetwork`).
    for (from, to, field) in [
        (
            "hostNetwork: true",
            "hostNetwork: true\n      hostNetwrok: true",
            "hostNetwrok",
        ),
        ("hostNetwork: true", "hostnetwork: true", "hostnetwork"),
        (
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem: true\n            readOnlyRootFilesystem: true",
            "readOnlyRootFilesystem",
        ),
    ] {
        assert!(rendered.contains(from));
        let bad = rendered.replacen(from, to, 1);
        let err = k8s_validate(&bad).expect_err(&format!("{field} was accepted"));
        assert!(err.to_string().contains(field), "{field}: {err}");
    }

    // A misspelling in the values, copied into the DaemonSet by toYaml.
    let rendered =
        helm_template(&["--set", "updateStrategy.rollingUpdate.maxUnavialable=1"]).unwrap();
    let err = k8s_validate(&rendered).expect_err("maxUnavialable was accepted");
    assert!(err.to_string().contains("maxUnavialable"), "{err}");

    // A misspelt tailtrap key renders (helm does not know tailtrap's keys) but fails
    // tailtrap's own check, which the daemon runs at start.
    let dir = ScratchDir::new("helm-bad-key").unwrap();
    let values = write(
        dir.path(),
        "v.yaml",
        "config: |\n  [daemon]\n  intervall = \"1s\"\n",
    );
    let objects = k8s_validate(&helm_template(&["-f", &values]).unwrap()).unwrap();
    let file = write(
        dir.path(),
        "t.toml",
        object(&objects, "ConfigMap")["data"]["tailtrap.toml"]
            .as_str()
            .unwrap(),
    );
    let out = Command::new(tailtrap_bin())
        .args(["config", "check", &file])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("intervall"));

    // TOML that does not parse stops the rendering with the chart's message.
    let values = write(dir.path(), "v2.yaml", "config: |\n  [daemon\n");
    let err = helm_template(&["-f", &values]).expect_err("broken TOML rendered");
    assert!(
        err.to_string().contains("values.config is not valid TOML"),
        "{err}"
    );
}
