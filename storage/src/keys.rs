//! Big-endian composite keys: byte order equals numeric order, so time ranges within an
//! incident or a history stream are contiguous range scans.

use model::Probe;

use crate::error::{Result, StoreError};

pub use model::MAX_SERVICE_LEN;

/// Check a service name for use in keys and records.
pub(crate) fn check_service(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_SERVICE_LEN {
        "is longer than 128 bytes"
    } else if name.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(StoreError::BadServiceName {
        name: name.chars().take(MAX_SERVICE_LEN).collect(),
        reason,
    })
}

pub(crate) fn incident(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

pub(crate) fn u64_at(key: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = key.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

/// `incident | time_ns | seq`.
pub(crate) fn sample(incident: u64, time_ns: u64, seq: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&incident.to_be_bytes());
    k[8..16].copy_from_slice(&time_ns.to_be_bytes());
    k[16..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// `incident | seq`.
pub(crate) fn pwru(incident: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&incident.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// `service_len | service | probe_id`: a baseline's key and the middle of a history key.
/// The service must have passed [`check_service`].
pub(crate) fn service_probe(service: &str, probe: Probe) -> Vec<u8> {
    let mut k = Vec::with_capacity(service.len() + 2);
    // check_service caps the length at 128, so it fits a byte.
    k.push(service.len() as u8);
    k.extend_from_slice(service.as_bytes());
    k.push(probe.id() as u8);
    k
}

/// Parse [`service_probe`] from the start of `key`; returns the bytes consumed too.
pub(crate) fn parse_service_probe(key: &[u8]) -> Option<(String, Probe, usize)> {
    let len = usize::from(*key.first()?);
    let name = std::str::from_utf8(key.get(1..1 + len)?).ok()?;
    let probe = Probe::from_id(u32::from(*key.get(1 + len)?))?;
    Some((name.to_string(), probe, len + 2))
}

/// History stream prefix: `level | service_len | service | probe_id`.
pub(crate) fn history_stream(level: u8, service: &str, probe: Probe) -> Vec<u8> {
    let mut k = vec![level];
    k.extend(service_probe(service, probe));
    k
}

/// Full history key: stream prefix then `start_ns`.
pub(crate) fn history(level: u8, service: &str, probe: Probe, start_ns: u64) -> Vec<u8> {
    let mut k = history_stream(level, service, probe);
    k.extend_from_slice(&start_ns.to_be_bytes());
    k
}

/// Parse a history key into `(level, service, probe, start_ns)`.
pub(crate) fn parse_history(key: &[u8]) -> Option<(u8, String, Probe, u64)> {
    let level = *key.first()?;
    let (service, probe, used) = parse_service_probe(key.get(1..)?)?;
    let start = u64_at(key, 1 + used)?;
    (key.len() == 1 + used + 8).then_some((level, service, probe, start))
}

/// The smallest key greater than every key starting with `prefix` (`None`: no such key).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_keys_sort_by_incident_then_time() {
        let a = sample(1, 500, 9);
        let b = sample(1, 1_000, 0);
        let c = sample(2, 0, 0);
        assert!(a < b && b < c);
        assert_eq!(u64_at(&b, 8), Some(1_000));
    }

    #[test]
    fn history_keys_round_trip_and_sort_by_time_within_a_stream() {
        let k1 = history(1, "web", Probe::TcpSocketRead, 10);
        let k2 = history(1, "web", Probe::TcpSocketRead, 256);
        assert!(k1 < k2);
        assert_eq!(
            parse_history(&k2),
            Some((1, "web".to_string(), Probe::TcpSocketRead, 256))
        );
        let stream = history_stream(1, "web", Probe::TcpSocketRead);
        assert!(k2.starts_with(&stream));
        // A longer service name sharing the prefix is a different stream.
        assert!(!history(1, "webx", Probe::TcpSocketRead, 0).starts_with(&stream));
        assert_eq!(parse_history(&k2[..k2.len() - 1]), None);
    }

    #[test]
    fn prefix_end_is_past_every_extension() {
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff]), None);
    }

    #[test]
    fn service_names_are_checked() {
        check_service("web-frontend").unwrap();
        assert!(check_service("").is_err());
        assert!(check_service(&"x".repeat(129)).is_err());
        assert!(check_service("a\nb").is_err());
    }
}
