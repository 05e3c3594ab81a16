//! Value envelope: `version byte | CRC32C (big-endian) | postcard payload`.
//!
//! The CRC covers the version byte and the payload, so a torn or bit-flipped value is caught
//! before postcard sees it; postcard alone would happily decode some garbage.

use serde::{de::DeserializeOwned, Serialize};

use crate::error::{Result, StoreError};

/// Version of the envelope and of the record layouts inside it.
pub(crate) const RECORD_VERSION: u8 = 1;
const HEADER: usize = 5;

/// Why a stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    Short,
    Version(u8),
    Checksum,
    Payload(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short => f.write_str("shorter than the record header"),
            DecodeError::Version(v) => write!(f, "unknown record version {v}"),
            DecodeError::Checksum => f.write_str("checksum mismatch"),
            DecodeError::Payload(e) => write!(f, "payload: {e}"),
        }
    }
}

fn crc(version: u8, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&[version]), payload)
}

/// Encode `value` into an envelope, refusing anything over `max` bytes.
pub(crate) fn encode<T: Serialize>(kind: &'static str, value: &T, max: usize) -> Result<Vec<u8>> {
    // Room for a typical sample, so the buffer is allocated once.
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&[RECORD_VERSION, 0, 0, 0, 0]);
    let mut out =
        postcard::to_extend(value, out).map_err(|source| StoreError::Encode { kind, source })?;
    if out.len() > max {
        return Err(StoreError::TooLarge {
            kind,
            size: out.len(),
            max,
        });
    }
    let sum = crc(RECORD_VERSION, &out[HEADER..]);
    out[1..HEADER].copy_from_slice(&sum.to_be_bytes());
    Ok(out)
}

/// Check the envelope only (version and CRC), without decoding the payload.
pub(crate) fn verify(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    if bytes.len() < HEADER {
        return Err(DecodeError::Short);
    }
    let version = bytes[0];
    if version != RECORD_VERSION {
        return Err(DecodeError::Version(version));
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&bytes[1..HEADER]);
    let payload = &bytes[HEADER..];
    if u32::from_be_bytes(stored) != crc(version, payload) {
        return Err(DecodeError::Checksum);
    }
    Ok(payload)
}

/// Decode an envelope.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let payload = verify(bytes)?;
    postcard::from_bytes(payload).map_err(|e| DecodeError::Payload(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_detection() {
        let v = (42u64, "hello".to_string());
        let enc = encode("test", &v, 1024).unwrap();
        assert_eq!(enc[0], RECORD_VERSION);
        assert_eq!(decode::<(u64, String)>(&enc).unwrap(), v);

        for i in 0..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x40;
            assert!(decode::<(u64, String)>(&bad).is_err(), "flip at byte {i}");
        }
        assert_eq!(decode::<(u64, String)>(&enc[..3]), Err(DecodeError::Short));
        let mut future = enc.clone();
        future[0] = 9;
        assert_eq!(
            decode::<(u64, String)>(&future),
            Err(DecodeError::Version(9))
        );
    }

    #[test]
    fn valid_envelope_with_wrong_payload_type_is_an_error() {
        let enc = encode("test", &1u8, 1024).unwrap();
        assert!(matches!(
            decode::<(u64, String)>(&enc),
            Err(DecodeError::Payload(_))
        ));
    }

    #[test]
    fn size_cap() {
        let err = encode("big", &vec![0u8; 100], 50).unwrap_err();
        assert!(matches!(
            err,
            StoreError::TooLarge {
                kind: "big",
                max: 50,
                ..
            }
        ));
    }
}
