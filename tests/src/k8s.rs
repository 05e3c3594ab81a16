//! The Helm chart (`packaging/kubernetes/tailtrap`) and the container image for tests:
//! `helm` and the strict validator `k8svalidate` built by `tests/k8svalidate/build.sh`, the
//! chart rendered and decoded into Kubernetes' own API types, and the image archive made by
//! `scripts/image`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::error::{Error, Result};

/// The repository's root (the parent of this crate's directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the repository")
        .to_path_buf()
}

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("packaging/kubernetes/tailtrap")
}

/// The output of a finished command, or [`Error::Command`] with its stderr.
fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io(format!("cannot run {what}")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: what.to_owned(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A path from an environment variable that `scripts/test` sets, or `None` when unset; an
/// empty value (the step that makes it failed) is an error naming `step`.
fn env_path(var: &str, step: &str) -> Result<Option<PathBuf>> {
    match std::env::var_os(var) {
        Some(p) if p.is_empty() => Err(Error::Traffic(format!(
            "{var} is empty: scripts/test leaves it so when its {step} step failed (see \
             test-logs/{step}.log in the target directory)"
        ))),
        Some(p) => {
            let p = PathBuf::from(p);
            if p.exists() {
                Ok(Some(p))
            } else {
                Err(Error::Traffic(format!(
                    "{var}={}: no such file",
                    p.display()
                )))
            }
        }
        None => Ok(None),
    }
}

/// The directory holding `helm` and `k8svalidate`: `TAILTRAP_K8S_TOOLS`, else what
/// `tests/k8svalidate/build.sh` prints (the cached build at once, or minutes of building).
pub fn k8s_tools() -> Result<PathBuf> {
    if let Some(p) = env_path("TAILTRAP_K8S_TOOLS", "helm")? {
        return Ok(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8svalidate/build.sh");
    let stdout = output(&mut Command::new(&script), &script.display().to_string())?;
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}

/// `helm` of [`k8s_tools`].
pub fn helm_bin() -> Result<PathBuf> {
    Ok(k8s_tools()?.join("helm"))
}

/// Run helm with `args`; its stdout.
pub fn helm(args: &[&str]) -> Result<String> {
    let helm = helm_bin()?;
    output(
        Command::new(&helm).args(args),
        &format!("helm {}", args.join(" ")),
    )
}

/// `helm template tailtrap <chart> --namespace monitoring <extra...>`: the rendered YAML.
pub fn helm_template(extra: &[&str]) -> Result<String> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "tailtrap",
        chart.to_str().expect("a UTF-8 path"),
        "--namespace",
        "monitoring",
    ];
    args.extend_from_slice(extra);
    helm(&args)
}

/// Decode rendered YAML strictly into Kubernetes' API types with `k8svalidate`: the
/// objects as it prints them (`apiVersion`, `kind`, `name`, `object`), or its complaints.
pub fn k8s_validate(rendered: &str) -> Result<Vec<Value>> {
    let tool = k8s_tools()?.join("k8svalidate");
    let dir = std::env::temp_dir().join(format!("tailtrap-k8svalidate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
    // One file per call: tests run in parallel threads of one process.
    let file = tempfile_in(&dir, rendered)?;
    let out = output(
        Command::new(&tool).arg(&file),
        &format!("k8svalidate {}", file.display()),
    );
    let _ = std::fs::remove_file(&file);
    let objects: Value = serde_json::from_str(&out?)
        .map_err(|e| Error::Traffic(format!("k8svalidate printed no JSON array: {e}")))?;
    Ok(objects.as_array().cloned().unwrap_or_default())
}

fn tempfile_in(dir: &Path, text: &str) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let file = dir.join(format!(
        "rendered-{}.yaml",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&file, text).map_err(Error::io(format!("cannot write {}", file.display())))?;
    Ok(file)
}

/// The one object of `kind` among validated objects.
///
/// # Panics
/// When there is not exactly one.
pub fn object<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    &found[0]["object"]
}

/// The OCI archive of tailtrap's image: `TAILTRAP_IMAGE`, else built now by
/// `scripts/image` (a release build of tailtrap first: minutes when cold).
pub fn image_archive() -> Result<PathBuf> {
    if let Some(p) = env_path("TAILTRAP_IMAGE", "image")? {
        return Ok(p);
    }
    let script = repo_root().join("scripts/image");
    let stdout = output(&mut Command::new(&script), &script.display().to_string())?;
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}
