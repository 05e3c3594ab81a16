//! cgroup2 paths and ids. A cgroup's id (what BPF sees as `cgroup->kn->id`) is the inode
//! number of its directory in the cgroup2 file system.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the cgroup2 hierarchy is mounted, from /proc/self/mountinfo: `/sys/fs/cgroup`
/// when cgroup2 is mounted there (a unified host), else the first cgroup2 mount (e.g.
/// `/sys/fs/cgroup/unified` on a hybrid host); `None` without any.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mount_in(&info).map(PathBuf::from)
}

/// The choice of [`cgroup2_mount`] in the text of a mountinfo file.
fn cgroup2_mount_in(mountinfo: &str) -> Option<&str> {
    let mut mounts = mountinfo.lines().filter_map(|line| {
        // "id parent major:minor root mount-point options... - fstype source super-options"
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        (fstype == "cgroup2").then(|| left.split_whitespace().nth(4))?
    });
    let first = mounts.next()?;
    if first == DEFAULT_MOUNT {
        return Some(first);
    }
    Some(mounts.find(|m| *m == DEFAULT_MOUNT).unwrap_or(first))
}

/// The usual place of cgroup2.
const DEFAULT_MOUNT: &str = "/sys/fs/cgroup";

/// [`cgroup2_mount`], or the usual `/sys/fs/cgroup` when mountinfo names none, so the
/// loader's errors still name the directories it looked for.
pub(crate) fn cgroup2_mount_or_default() -> PathBuf {
    cgroup2_mount().unwrap_or_else(|| PathBuf::from(DEFAULT_MOUNT))
}

/// The id of the cgroup at `rel` (relative to `mount`).
pub(crate) fn cgroup_id(mount: &Path, rel: &Path) -> io::Result<u64> {
    let path = mount.join(rel.strip_prefix("/").unwrap_or(rel));
    let meta = fs::metadata(&path)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a cgroup directory", path.display()),
        ));
    }
    Ok(meta.ino())
}

/// Finds cgroup paths by id, remembering what it found.
#[derive(Debug)]
pub(crate) struct CgroupNames {
    mount: PathBuf,
    /// id -> (name, directory when it was found).
    known: HashMap<u64, (String, Option<PathBuf>)>,
}

impl CgroupNames {
    pub(crate) fn new(mount: PathBuf) -> Self {
        Self {
            mount,
            known: HashMap::new(),
        }
    }

    /// A readable name of cgroup `id` (see [`readable`]) from its path relative to the
    /// mount (`/` for the root), or `cgroup:<id>` when it no longer exists.
    pub(crate) fn name(&mut self, id: u64) -> String {
        if let Some((name, _)) = self.known.get(&id) {
            return name.clone();
        }
        let path = find_by_ino(&self.mount, id);
        let name = path
            .as_ref()
            .map(|p| match p.strip_prefix(&self.mount) {
                Ok(rel) if rel.as_os_str().is_empty() => "/".to_owned(),
                Ok(rel) => readable(&rel.display().to_string()),
                Err(_) => p.display().to_string(),
            })
            .unwrap_or_else(|| format!("cgroup:{id}"));
        self.known.insert(id, (name.clone(), path));
        name
    }

    /// Whether cgroup `id` no longer exists: its directory, as found when it was named, is
    /// gone or is another cgroup now (one `stat`, no walk of the tree). A cgroup never
    /// named, or not found when named, counts as gone.
    pub(crate) fn gone(&self, id: u64) -> bool {
        match self.known.get(&id) {
            Some((_, Some(path))) => fs::metadata(path).map_or(true, |m| m.ino() != id),
            _ => true,
        }
    }

    /// Drop what is remembered of cgroup `id` (it is gone).
    pub(crate) fn forget(&mut self, id: u64) {
        self.known.remove(&id);
    }
}

/// The name an auto-grouped service gets from its cgroup path (relative to the mount):
/// - a container: `docker:<id>`, `containerd:<id>`, `crio:<id>` or `podman:<id>` (the id's
///   first 12 hex digits), prefixed with `k8s:<pod uid>/` inside a Kubernetes pod;
/// - a Kubernetes pod's own cgroup: `k8s:<pod uid>`;
/// - a system unit: its unit name (`system.slice/nginx.service` -> `nginx.service`);
/// - anything else: the path itself, which is unique.
///
/// Container and pod ids are unique, and system units unique by name, so two live cgroups
/// never share a name.
pub(crate) fn readable(rel: &str) -> String {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let pod = parts.iter().find_map(|p| pod_uid(p));
    let container = parts.last().and_then(|p| container_id(p));
    match (pod, container) {
        (Some(pod), Some(c)) => format!("k8s:{pod}/{c}"),
        (Some(pod), None) if parts.last().is_some_and(|p| pod_uid(p).is_some()) => {
            format!("k8s:{pod}")
        }
        (None, Some(c)) => c,
        _ => match parts.as_slice() {
            ["system.slice", unit] if unit.ends_with(".service") || unit.ends_with(".scope") => {
                (*unit).to_owned()
            }
            _ => rel.to_owned(),
        },
    }
}

/// A Kubernetes pod's uid from its cgroup's name: `kubepods-burstable-pod<uid>.slice`
/// (systemd driver, `_` for `-`) or `pod<uid>` (cgroupfs driver).
fn pod_uid(part: &str) -> Option<String> {
    let rest = part.strip_suffix(".slice").unwrap_or(part);
    let uid = &rest[rest.rfind("pod")? + 3..];
    let uid = uid.replace('_', "-");
    let ok = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    ok.then_some(uid)
}

/// `<runtime>:<first 12 hex digits>` from a container's cgroup name: `docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope` (systemd driver) or
/// the bare 64-digit id (cgroupfs driver, under `docker/` or a pod).
fn container_id(part: &str) -> Option<String> {
    let (runtime, id) = match part.strip_suffix(".scope") {
        Some(scope) => {
            let (prefix, id) = scope.rsplit_once('-')?;
            let runtime = match prefix {
                "docker" => "docker",
                "cri-containerd" => "containerd",
                "crio" => "crio",
                "libpod" => "podman",
                _ => return None,
            };
            (runtime, id)
        }
        None => ("container", part),
    };
    let ok = id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit());
    ok.then(|| format!("{runtime}:{}", &id[..12]))
}

fn find_by_ino(dir: &Path, ino: u64) -> Option<PathBuf> {
    let meta = fs::metadata(dir).ok()?;
    if meta.ino() == ino {
        return Some(dir.to_path_buf());
    }
    for entry in fs::read_dir(dir).ok()?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some(found) = find_by_ino(&entry.path(), ino) {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_prefers_the_usual_place_else_the_first_cgroup2() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(hybrid), Some("/sys/fs/cgroup/unified"));
        let two = "50 1 0:40 / /run/other rw - cgroup2 cgroup2 rw\n\
                   51 1 0:40 / /sys/fs/cgroup rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(two), Some("/sys/fs/cgroup"));
        assert_eq!(
            cgroup2_mount_in("31 23 0:28 / /sys rw - sysfs sysfs rw\n"),
            None
        );
    }

    #[test]
    fn auto_service_names_are_readable() {
        let id = "4f2c1a9be0d7c3a6b5e4f1029384756afedcba9876543210fedcba9876543210";
        let uid = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901";
        let cases = [
            ("system.slice/nginx.service", "nginx.service".to_owned()),
            (
                &format!("system.slice/docker-{id}.scope"),
                "docker:4f2c1a9be0d7".into(),
            ),
            (&format!("docker/{id}"), "container:4f2c1a9be0d7".into()),
            (
                &format!(
                    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
                     cri-containerd-{id}.scope",
                    uid.replace('-', "_")
                ),
                format!("k8s:{uid}/containerd:4f2c1a9be0d7"),
            ),
            (
                &format!("kubepods/besteffort/pod{uid}/{id}"),
                format!("k8s:{uid}/container:4f2c1a9be0d7"),
            ),
            (
                &format!("kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_")),
                format!("k8s:{uid}"),
            ),
            (
                &format!("machine.slice/libpod-{id}.scope"),
                "podman:4f2c1a9be0d7".into(),
            ),
            // Not recognised: the path, which is unique.
            (
                "user.slice/user-1000.slice/app.slice/foo.service",
                "user.slice/user-1000.slice/app.slice/foo.service".into(),
            ),
            ("tailtrap-test/one", "tailtrap-test/one".into()),
            // A scope that is no container: its unit name.
            (
                &format!("system.slice/docker-{}.scope", &id[..20]),
                format!("docker-{}.scope", &id[..20]),
            ),
        ];
        for (path, want) in cases {
            assert_eq!(readable(path), want, "{path}");
        }
    }

    #[test]
    fn root_cgroup_round_trips() {
        let mount = cgroup2_mount_or_default();
        let id = cgroup_id(&mount, Path::new("")).unwrap();
        let mut names = CgroupNames::new(mount);
        assert_eq!(names.name(id), "/");
        assert!(!names.gone(id));
    }

    #[test]
    fn a_removed_cgroup_is_gone() {
        let mount = cgroup2_mount_or_default();
        let dir = mount.join(format!("tailtrap-gone-{}", std::process::id()));
        if fs::create_dir(&dir).is_err() {
            return; // not root, or no cgroup2: nothing to test here
        }
        let id = cgroup_id(&mount, dir.strip_prefix(&mount).unwrap()).unwrap();
        let mut names = CgroupNames::new(mount);
        names.name(id);
        assert!(!names.gone(id));
        fs::remove_dir(&dir).unwrap();
        assert!(names.gone(id));
        names.forget(id);
        assert!(names.known.is_empty());
    }

    #[test]
    fn missing_cgroup_is_an_error() {
        assert!(cgroup_id(
            &cgroup2_mount_or_default(),
            Path::new("no/such/tailtrap-cgroup")
        )
        .is_err());
    }
}
