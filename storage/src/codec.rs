//! Value envelope: `version byte | CRC32C (big-endian) | postcard payload`.
//!
//! The CRC covers the version byte and the payload, so a torn or bit-flipped value is caught
//! before postcard sees it; postcard alone would happily decode some garbage.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::error::{Result, StoreError};

/// Version of the envelope and of the record layouts inside it, for every tree but samples
/// (and history chunks) and every record but incidents.
pub(crate) const RECORD_VERSION: u8 = 1;
/// Version of the incidents tree's records: incidents with the daemon's cause verdict
/// (`IncidentV2`). Version 1 records (`IncidentV1`, [`RECORD_VERSION`]: no cause) are
/// still read.
pub(crate) const INCIDENT_RECORD_VERSION: u8 = 2;
/// Version of the samples tree's records: a chunk of samples per record, each with its skb
/// address, its reader's wait and its RX queue (`SampleV6`), lz4-compressed. Version 5
/// chunks (the same without the RX queue), version 4 chunks (without the reader's wait
/// either), version 3 chunks (those uncompressed), version 2 chunks (samples without the
/// address either) and version 1 records (one such sample each) are still read.
pub(crate) const SAMPLE_CHUNK_VERSION: u8 = 6;
/// Sample chunks written before samples carried their RX queue (`SampleV5`, compressed).
pub(crate) const SAMPLE_CHUNK_V5: u8 = 5;
/// Sample chunks written before samples carried their reader's wait (`SampleV3`,
/// compressed).
pub(crate) const SAMPLE_CHUNK_V4: u8 = 4;
/// Sample chunks written before they were compressed.
pub(crate) const SAMPLE_CHUNK_V3: u8 = 3;
/// Sample chunks written before samples carried the skb address.
pub(crate) const SAMPLE_CHUNK_V2: u8 = 2;
/// Envelope version of a history chunk (`Vec<(offset ns, HistogramV1)>`, see the `layout`
/// module); version-1 history records hold one point each (a `HistogramV1`, written before
/// chunks) and stay readable.
pub(crate) const HISTORY_CHUNK_VERSION: u8 = 2;
pub(crate) const HEADER: usize = 5;

/// A live type stored through a frozen one: the layout this build writes, its envelope
/// version, and the conversions. Records of older layouts are read by
/// [`Record::decode_older`] (incidents: envelope version 1), or by the code that knows
/// their version (the samples and history trees, whose envelope versions name their
/// layout). The frozen layouts and their conversions are the `layout` module's.
pub(crate) trait Record: Sized {
    /// The frozen type of the layout this build writes.
    type Frozen: Serialize + DeserializeOwned;
    /// The envelope version this build writes the record with (and reads as `Frozen`).
    const VERSION: u8 = RECORD_VERSION;
    /// The value as it is stored.
    fn freeze(&self) -> Self::Frozen;
    /// The stored value as the live type; `Err` (why) when it has no live equivalent.
    fn thaw(frozen: Self::Frozen) -> Result<Self, String>;
    /// A whole envelope (`bytes`, header included) of `version`, not [`Record::VERSION`],
    /// as the live type: the layouts earlier builds wrote. No older layout by default.
    fn decode_older(version: u8, bytes: &[u8]) -> Result<Self, DecodeError> {
        let _ = bytes;
        Err(DecodeError::Version(version))
    }
}

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
            DecodeError::Version(v) => write!(f, "record version {v} not read here"),
            DecodeError::Checksum => f.write_str("checksum mismatch"),
            DecodeError::Payload(e) => write!(f, "payload: {e}"),
        }
    }
}

fn crc(version: u8, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&[version]), payload)
}

/// Encode `value` as its frozen layout into an envelope of its version ([`Record::VERSION`]:
/// [`RECORD_VERSION`] but for incidents), refusing anything over `max` bytes.
pub(crate) fn encode<R: Record>(kind: &'static str, value: &R, max: usize) -> Result<Vec<u8>> {
    // Room for a typical small record, so the buffer is allocated once.
    encode_as(R::VERSION, kind, &value.freeze(), max, 128)
}

/// Encode `value`, a frozen layout (of the `layout` module), into an envelope of `version`,
/// refusing anything over `max` bytes; `capacity` is the expected size (one allocation
/// when right).
pub(crate) fn encode_as<T: Serialize>(
    version: u8,
    kind: &'static str,
    value: &T,
    max: usize,
    capacity: usize,
) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(&[version, 0, 0, 0, 0]);
    let mut out =
        postcard::to_extend(value, out).map_err(|source| StoreError::Encode { kind, source })?;
    if out.len() > max {
        return Err(StoreError::TooLarge {
            kind,
            size: out.len(),
            max,
        });
    }
    let sum = crc(version, &out[HEADER..]);
    out[1..HEADER].copy_from_slice(&sum.to_be_bytes());
    Ok(out)
}

/// Finish an envelope built in place: `out` is the version byte, four bytes of room for
/// the CRC and the payload. Refused when over `max` bytes.
pub(crate) fn seal(kind: &'static str, mut out: Vec<u8>, max: usize) -> Result<Vec<u8>> {
    if out.len() > max {
        return Err(StoreError::TooLarge {
            kind,
            size: out.len(),
            max,
        });
    }
    let sum = crc(out[0], &out[HEADER..]);
    out[1..HEADER].copy_from_slice(&sum.to_be_bytes());
    Ok(out)
}

/// Check the envelope only (a version this build writes, and the CRC), without decoding
/// the payload.
pub(crate) fn verify(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    match bytes.first() {
        // A history chunk's version, and an incident record's, is the same byte as a
        // version-2 sample chunk's.
        Some(&v)
            if v == SAMPLE_CHUNK_VERSION
                || v == SAMPLE_CHUNK_V5
                || v == SAMPLE_CHUNK_V4
                || v == SAMPLE_CHUNK_V3
                || v == SAMPLE_CHUNK_V2
                || v == HISTORY_CHUNK_VERSION
                || v == INCIDENT_RECORD_VERSION =>
        {
            verify_as(v, bytes)
        }
        _ => verify_as(RECORD_VERSION, bytes),
    }
}

/// Check an envelope that must be of `expected` version; returns the payload.
pub(crate) fn verify_as(expected: u8, bytes: &[u8]) -> Result<&[u8], DecodeError> {
    if bytes.len() < HEADER {
        return Err(DecodeError::Short);
    }
    let version = bytes[0];
    if version != expected {
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

/// Decode an envelope of `R`'s version ([`Record::VERSION`]) holding its frozen layout into
/// `R`, or one of an older version `R` still reads ([`Record::decode_older`]: incident
/// records of version 1).
pub(crate) fn decode<R: Record>(bytes: &[u8]) -> Result<R, DecodeError> {
    match bytes.first() {
        Some(&v) if v != R::VERSION && bytes.len() >= HEADER => R::decode_older(v, bytes),
        _ => R::thaw(decode_as(R::VERSION, bytes)?).map_err(DecodeError::Payload),
    }
}

/// Decode an envelope that must be of `version` into `T`, a frozen layout.
pub(crate) fn decode_as<T: DeserializeOwned>(version: u8, bytes: &[u8]) -> Result<T, DecodeError> {
    decode_borrowed_as(version, bytes)
}

/// [`decode_as`] for a layout that borrows from `bytes` (text, without a copy).
pub(crate) fn decode_borrowed_as<'a, T: Deserialize<'a>>(
    version: u8,
    bytes: &'a [u8],
) -> Result<T, DecodeError> {
    let payload = verify_as(version, bytes)?;
    postcard::from_bytes(payload).map_err(|e| DecodeError::Payload(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_detection() {
        let v = (42u64, "hello".to_string());
        let enc = encode_as(RECORD_VERSION, "test", &v, 1024, 16).unwrap();
        assert_eq!(enc[0], RECORD_VERSION);
        let dec = |b: &[u8]| decode_as::<(u64, String)>(RECORD_VERSION, b);
        assert_eq!(dec(&enc).unwrap(), v);

        for i in 0..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x40;
            assert!(dec(&bad).is_err(), "flip at byte {i}");
        }
        assert_eq!(dec(&enc[..3]), Err(DecodeError::Short));
        let mut future = enc.clone();
        future[0] = 9;
        assert_eq!(dec(&future), Err(DecodeError::Version(9)));
    }

    #[test]
    fn each_tree_reads_only_its_own_version_and_verify_accepts_both() {
        let chunk = encode_as(SAMPLE_CHUNK_VERSION, "test", &7u32, 1024, 16).unwrap();
        let plain = encode("test", &7u32, 1024).unwrap();
        assert_eq!(verify(&chunk).unwrap(), verify(&plain).unwrap());
        assert_eq!(
            decode::<u32>(&chunk),
            Err(DecodeError::Version(SAMPLE_CHUNK_VERSION))
        );
        assert_eq!(
            decode_as::<u32>(SAMPLE_CHUNK_VERSION, &plain),
            Err(DecodeError::Version(RECORD_VERSION))
        );
        assert_eq!(decode_as::<u32>(SAMPLE_CHUNK_VERSION, &chunk), Ok(7));
        // Every sample chunk version still read passes the envelope check (rotation copies
        // what passes it, `db check` counts the rest).
        for v in [
            SAMPLE_CHUNK_V5,
            SAMPLE_CHUNK_V4,
            SAMPLE_CHUNK_V3,
            SAMPLE_CHUNK_V2,
        ] {
            let old = encode_as(v, "test", &7u32, 1024, 16).unwrap();
            assert_eq!(verify(&old), verify(&plain), "version {v}");
        }
        let mut bad = chunk.clone();
        bad[5] ^= 1;
        assert_eq!(verify(&bad), Err(DecodeError::Checksum));
    }

    #[test]
    fn valid_envelope_with_wrong_payload_type_is_an_error() {
        let enc = encode("test", &1u32, 1024).unwrap();
        assert!(matches!(
            decode_as::<(u64, String)>(RECORD_VERSION, &enc),
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
