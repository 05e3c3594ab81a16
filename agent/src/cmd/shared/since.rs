//! `--since`: a span back from now or an RFC 3339 time.

use std::time::SystemTime;

/// `6h` (that long ago) or an RFC 3339 time, as ns since the epoch.
pub fn parse_since(s: &str) -> Result<u64, String> {
    let t = match humantime::parse_duration(s) {
        Ok(d) => SystemTime::now()
            .checked_sub(d)
            .ok_or_else(|| format!("{s} reaches before 1970"))?,
        Err(_) => humantime::parse_rfc3339_weak(s).map_err(|_| {
            format!("{s:?} is neither a span like `6h` nor a time like `2026-11-21T10:00:00Z`")
        })?,
    };
    Ok(model::unix_ns(t))
}
