//! Names beside the database directory: its pid file, a damaged database moved aside,
//! rotation's fresh and old directories, a read-only database's copy.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// `<path>.<suffix>` beside the database directory.
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".");
    s.push(suffix);
    PathBuf::from(s)
}

/// Like [`sibling`], with `-2`, `-3`, ... appended until the name is free.
pub(crate) fn unused_sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut candidate = sibling(path, suffix);
    let mut n = 2;
    while candidate.exists() {
        candidate = sibling(path, &format!("{suffix}-{n}"));
        n += 1;
    }
    candidate
}

/// A file-name-safe UTC timestamp, e.g. `20261121T010203Z`.
pub(crate) fn timestamp() -> String {
    let t = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    t.chars().filter(|c| *c != '-' && *c != ':').collect()
}
