//! Sample chunks: the samples tree holds one record per run of up to [`SAMPLES_PER_CHUNK`]
//! samples of one incident from one batch, not one record per sample. sled's cost per key
//! dominated batched writes, and each key also carried its own page overhead on disk.
//!
//! A chunk's key is `incident | time of its first sample | sequence number of its first
//! sample`; its value is a [`SAMPLE_CHUNK_VERSION`] envelope around the samples in time
//! order, each sample with its skb address, its reader's wait and its RX queue, compressed
//! (envelope version 6, below). Compressed chunks of samples without the RX queue (version
//! 5) or without the reader's wait either (version 4), uncompressed ones (version 3), chunks
//! of version 2 (samples without the address either) and records of schema 1 (one such
//! sample each, envelope version 1) are still read; the samples of the last two have no
//! address, those of the last four no reader's wait, and those of all five no RX queue. A
//! sample's sequence number is `batch id << 20 | chunk number in the batch << 8 |
//! index in the chunk`, so the chunk holding a sample is found from the sequence number
//! alone.

use model::Sample;

use crate::codec::{
    self, DecodeError, SAMPLE_CHUNK_V2, SAMPLE_CHUNK_V3, SAMPLE_CHUNK_V4, SAMPLE_CHUNK_V5,
    SAMPLE_CHUNK_VERSION,
};
use crate::error::{Result, StoreError};
use crate::keys;
use crate::layout::sample::{SampleV1, SampleV3, SampleV5, SampleV6, SamplesV6};

/// Samples per chunk record (a power of two: the low bits of a sequence number).
pub(crate) const SAMPLES_PER_CHUNK: usize = 256;
const INDEX_BITS: u32 = SAMPLES_PER_CHUNK.trailing_zeros();
/// Bits of a sequence number below the batch id.
pub(crate) const BATCH_INDEX_BITS: u32 = 20;
/// Most chunks one batch can fill.
const MAX_CHUNKS_PER_BATCH: usize = 1 << (BATCH_INDEX_BITS - INDEX_BITS);
/// Cap on one encoded sample, bytes (a sample has no variable-length field that could
/// reach it; the cap guards the chunk cap below).
const MAX_SAMPLE_BYTES: usize = 1024;
/// Cap on one encoded chunk record, bytes.
pub(crate) const MAX_CHUNK_BYTES: usize = SAMPLES_PER_CHUNK * MAX_SAMPLE_BYTES;
/// Encoded size of a typical sample, for sizing buffers.
const TYPICAL_SAMPLE_BYTES: usize = 112;

/// The sequence number of the first sample of the chunk holding sample `seq`.
pub(crate) fn chunk_start(seq: u64) -> u64 {
    seq & !((SAMPLES_PER_CHUNK as u64) - 1)
}

/// One chunk record ready to insert.
pub(crate) struct EncodedChunk {
    pub(crate) key: [u8; 24],
    pub(crate) value: Vec<u8>,
}

/// Split a batch into chunk records: grouped by incident, each group in time order (a
/// stable sort, so equal times keep the batch's order), cut every [`SAMPLES_PER_CHUNK`].
pub(crate) fn encode_batch(batch_id: u64, samples: &[Sample]) -> Result<Vec<EncodedChunk>> {
    let mut order: Vec<&Sample> = samples.iter().collect();
    order.sort_by_key(|s| (s.incident, s.time_ns));
    let mut chunks = Vec::with_capacity(samples.len() / SAMPLES_PER_CHUNK + 1);
    let mut rest = &order[..];
    while let Some(first) = rest.first() {
        let same_incident = rest
            .iter()
            .take(SAMPLES_PER_CHUNK)
            .take_while(|s| s.incident == first.incident)
            .count();
        let (chunk, tail) = rest.split_at(same_incident);
        rest = tail;
        if chunks.len() == MAX_CHUNKS_PER_BATCH {
            return Err(StoreError::TooLarge {
                kind: "sample batch (chunks)",
                size: MAX_CHUNKS_PER_BATCH + 1,
                max: MAX_CHUNKS_PER_BATCH,
            });
        }
        let seq = (batch_id << BATCH_INDEX_BITS) | ((chunks.len() as u64) << INDEX_BITS);
        let value = encode_compressed(chunk)?;
        chunks.push(EncodedChunk {
            key: keys::sample(first.incident, first.time_ns, seq),
            value,
        });
    }
    Ok(chunks)
}

/// A version 6 chunk: the envelope around `sample count | uncompressed length` (postcard
/// varints) and the lz4 block of the samples' postcard encoding ([`SampleV6`]s; version 5
/// and 4 chunks, the same of [`SampleV5`]s and [`SampleV3`]s, are still read). Samples of
/// one incident repeat
/// their flow, cgroup, process and nearby times: the block is 4-6 times smaller, on disk
/// and in what sled keeps in memory of recent writes.
fn encode_compressed(chunk: &[&Sample]) -> Result<Vec<u8>> {
    let kind = "sample chunk";
    let mut raw = Vec::with_capacity(2 + chunk.len() * TYPICAL_SAMPLE_BYTES);
    raw = postcard::to_extend(&SamplesV6(chunk), raw)
        .map_err(|source| StoreError::Encode { kind, source })?;
    if raw.len() > MAX_CHUNK_BYTES {
        return Err(StoreError::TooLarge {
            kind,
            size: raw.len(),
            max: MAX_CHUNK_BYTES,
        });
    }
    let mut out = Vec::with_capacity(
        codec::HEADER + 20 + lz4_flex::block::get_maximum_output_size(raw.len()),
    );
    out.extend_from_slice(&[SAMPLE_CHUNK_VERSION, 0, 0, 0, 0]);
    let mut out = postcard::to_extend(&(chunk.len(), raw.len()), out)
        .map_err(|source| StoreError::Encode { kind, source })?;
    out.extend_from_slice(&lz4_flex::block::compress(&raw));
    codec::seal(kind, out, MAX_STORED_CHUNK_BYTES)
}

/// Cap on a stored compressed (version 4, 5 or 6) chunk: the largest block lz4 can make of
/// a full chunk.
const MAX_STORED_CHUNK_BYTES: usize =
    codec::HEADER + 20 + (MAX_CHUNK_BYTES / 255) + 16 + MAX_CHUNK_BYTES;

/// The sample count and the decompressed block of a compressed chunk of `version` (4, 5
/// or 6). The claimed lengths are checked before anything is allocated for them, so a damaged
/// record whose checksum happens to match cannot ask for more memory than a full chunk.
fn decompress(version: u8, value: &[u8]) -> Result<(usize, Vec<u8>), DecodeError> {
    let payload = codec::verify_as(version, value)?;
    let bad = |why: String| DecodeError::Payload(why);
    let ((count, raw_len), block) = postcard::take_from_bytes::<(usize, usize)>(payload)
        .map_err(|e| bad(format!("chunk header: {e}")))?;
    if raw_len > MAX_CHUNK_BYTES || count > SAMPLES_PER_CHUNK {
        return Err(bad(format!(
            "chunk claims {count} samples in {raw_len} bytes, over the caps of \
             {SAMPLES_PER_CHUNK} and {MAX_CHUNK_BYTES}"
        )));
    }
    let raw =
        lz4_flex::block::decompress(block, raw_len).map_err(|e| bad(format!("lz4 block: {e}")))?;
    if raw.len() != raw_len {
        return Err(bad(format!(
            "lz4 block gave {} bytes, the header says {raw_len}",
            raw.len()
        )));
    }
    Ok((count, raw))
}

/// The samples of a compressed chunk: version 6 ([`SampleV6`]), version 5 ([`SampleV5`], no
/// RX queue) or version 4 ([`SampleV3`], no reader's wait either).
fn decode_compressed(value: &[u8]) -> Result<Vec<Sample>, DecodeError> {
    let bad = |e: postcard::Error| DecodeError::Payload(e.to_string());
    let (count, samples) = match value.first() {
        Some(&SAMPLE_CHUNK_V4) => {
            let (count, raw) = decompress(SAMPLE_CHUNK_V4, value)?;
            (
                count,
                thaw(postcard::from_bytes::<Vec<SampleV3<'_>>>(&raw).map_err(bad)?)?,
            )
        }
        Some(&SAMPLE_CHUNK_V5) => {
            let (count, raw) = decompress(SAMPLE_CHUNK_V5, value)?;
            (
                count,
                thaw(postcard::from_bytes::<Vec<SampleV5<'_>>>(&raw).map_err(bad)?)?,
            )
        }
        _ => {
            let (count, raw) = decompress(SAMPLE_CHUNK_VERSION, value)?;
            (
                count,
                thaw(postcard::from_bytes::<Vec<SampleV6<'_>>>(&raw).map_err(bad)?)?,
            )
        }
    };
    if samples.len() != count {
        return Err(DecodeError::Payload(format!(
            "chunk holds {} samples, the header says {count}",
            samples.len()
        )));
    }
    Ok(samples)
}

/// Decode a stored samples record: a chunk, or a record of an earlier layout (kept
/// readable so an upgrade loses nothing).
pub(crate) fn decode(value: &[u8]) -> Result<Vec<Sample>, DecodeError> {
    match value.first() {
        Some(&codec::RECORD_VERSION) => thaw(vec![codec::decode_borrowed_as::<SampleV1<'_>>(
            codec::RECORD_VERSION,
            value,
        )?]),
        Some(&SAMPLE_CHUNK_V2) => thaw(codec::decode_borrowed_as::<Vec<SampleV1<'_>>>(
            SAMPLE_CHUNK_V2,
            value,
        )?),
        Some(&SAMPLE_CHUNK_V3) => thaw(codec::decode_borrowed_as::<Vec<SampleV3<'_>>>(
            SAMPLE_CHUNK_V3,
            value,
        )?),
        _ => decode_compressed(value),
    }
}

/// Frozen samples as live ones; one that has no live equivalent (a command name too long)
/// makes the record undecodable, as it did when the live type was decoded directly.
fn thaw<F>(frozen: Vec<F>) -> Result<Vec<Sample>, DecodeError>
where
    Sample: TryFrom<F, Error = String>,
{
    frozen
        .into_iter()
        .map(|f| Sample::try_from(f).map_err(DecodeError::Payload))
        .collect()
}

/// Whether a stored samples record is a chunk (of any layout), not a one-sample record.
pub(crate) fn is_chunk(value: &[u8]) -> bool {
    matches!(
        value.first(),
        Some(&v) if v == SAMPLE_CHUNK_VERSION
            || v == SAMPLE_CHUNK_V5
            || v == SAMPLE_CHUNK_V4
            || v == SAMPLE_CHUNK_V3
            || v == SAMPLE_CHUNK_V2
    )
}

/// How many samples a stored record holds, without decoding them: a chunk's length prefix,
/// 1 for an intact one-sample record of the earlier layout, 0 for a damaged record.
pub(crate) fn sample_count(value: &[u8]) -> u64 {
    let chunk = match value.first() {
        Some(&SAMPLE_CHUNK_V2) => codec::verify_as(SAMPLE_CHUNK_V2, value),
        Some(&SAMPLE_CHUNK_V3) => codec::verify_as(SAMPLE_CHUNK_V3, value),
        Some(&SAMPLE_CHUNK_V4) => codec::verify_as(SAMPLE_CHUNK_V4, value),
        Some(&SAMPLE_CHUNK_V5) => codec::verify_as(SAMPLE_CHUNK_V5, value),
        _ => codec::verify_as(SAMPLE_CHUNK_VERSION, value),
    };
    if let Ok(payload) = chunk {
        // postcard writes a sequence's length first, as a varint usize; a compressed
        // chunk's header (versions 4 to 6) starts with the same count.
        return postcard::take_from_bytes::<usize>(payload).map_or(0, |(n, _)| n as u64);
    }
    u64::from(codec::verify_as(codec::RECORD_VERSION, value).is_ok())
}

#[cfg(test)]
mod tests {
    use model::{Comm, CpuHolder, ReaderWait};

    use super::*;
    use crate::layout::sample::{sample_bytes_before, samples_v3_bytes, samples_v5_bytes};

    fn sample(incident: u64, time_ns: u64) -> Sample {
        model::fixtures::sample(incident, time_ns, time_ns)
    }

    /// [`sample`] with a reader's wait: every third with the CPU's holder, every third
    /// without one, every third none at all.
    fn waited(incident: u64, time_ns: u64) -> Sample {
        let reader_wait = match time_ns % 3 {
            0 => Some(ReaderWait {
                runq_ns: 1_000 + time_ns,
                off_cpu_ns: 2_000_000 + time_ns,
                cpu_holder: Some(CpuHolder {
                    pid: 4000 + (time_ns % 7) as u32,
                    comm: Comm::try_from("stress-ng-cpu").unwrap(),
                }),
            }),
            1 => Some(ReaderWait {
                runq_ns: 0,
                off_cpu_ns: 3_000 + time_ns,
                cpu_holder: None,
            }),
            _ => None,
        };
        // Every fourth without an RX queue; queue 0 and the largest among the others.
        let rx_queue = match time_ns % 4 {
            0 => Some(0),
            1 => Some(41),
            2 => Some(u16::MAX - 1),
            _ => None,
        };
        Sample {
            reader_wait,
            rx_queue,
            ..sample(incident, time_ns)
        }
    }

    /// `samples` without their RX queue, as layouts before it read them.
    fn without_queue(samples: &[Sample]) -> Vec<Sample> {
        samples
            .iter()
            .map(|s| Sample {
                rx_queue: None,
                ..s.clone()
            })
            .collect()
    }

    /// `samples` without their reader's wait (nor RX queue), as layouts before it read
    /// them.
    fn without_wait(samples: &[Sample]) -> Vec<Sample> {
        without_queue(samples)
            .into_iter()
            .map(|s| Sample {
                reader_wait: None,
                ..s
            })
            .collect()
    }

    #[test]
    fn batches_split_by_incident_and_size_in_time_order() {
        // 600 samples of incident 1 given newest first, 3 of incident 2 in between.
        let mut batch: Vec<Sample> = (0..600).rev().map(|t| waited(1, t)).collect();
        batch.insert(100, sample(2, 7));
        batch.insert(5, sample(2, 3));
        batch.insert(300, sample(2, 7));
        let chunks = encode_batch(5, &batch).unwrap();
        let decoded: Vec<Vec<Sample>> = chunks.iter().map(|c| decode(&c.value).unwrap()).collect();
        let sizes: Vec<usize> = decoded.iter().map(Vec::len).collect();
        assert_eq!(sizes, [256, 256, 88, 3]);
        let times: Vec<u64> = decoded[..3].concat().iter().map(|s| s.time_ns).collect();
        assert_eq!(times, (0..600).collect::<Vec<_>>());
        let want: Vec<Sample> = (0..600).map(|t| waited(1, t)).collect();
        assert_eq!(decoded[..3].concat(), want);
        let inc2: Vec<u64> = decoded[3].iter().map(|s| s.time_ns).collect();
        assert_eq!(inc2, [3, 7, 7]);
        for (n, (c, d)) in chunks.iter().zip(&decoded).enumerate() {
            assert_eq!(c.value[0], SAMPLE_CHUNK_VERSION);
            let seq = keys::u64_at(&c.key, 16).unwrap();
            assert_eq!(seq, (5 << BATCH_INDEX_BITS) | (n as u64 * 256));
            assert_eq!(chunk_start(seq + 255), seq);
            assert_eq!(keys::u64_at(&c.key, 0), Some(d[0].incident));
            assert_eq!(keys::u64_at(&c.key, 8), Some(d[0].time_ns));
            assert_eq!(sample_count(&c.value), d.len() as u64);
        }
    }

    #[test]
    fn the_readers_wait_is_stored_field_by_field() {
        let batch: Vec<Sample> = (0..3).map(|t| waited(1, 30 + t)).collect();
        let got = decode(&encode_batch(1, &batch).unwrap().remove(0).value).unwrap();
        assert_eq!(got, batch);
        let holder = got[0].reader_wait.unwrap();
        assert_eq!((holder.runq_ns, holder.off_cpu_ns), (1_030, 2_000_030));
        let cpu = holder.cpu_holder.unwrap();
        assert_eq!((cpu.pid, cpu.comm.as_str()), (4002, "stress-ng-cpu"));
        let none = got[1].reader_wait.unwrap();
        assert_eq!(
            (none.runq_ns, none.off_cpu_ns, none.cpu_holder),
            (0, 3_031, None)
        );
        assert_eq!(got[2].reader_wait, None);
    }

    #[test]
    fn the_rx_queue_is_stored_and_version_5_chunks_read_none() {
        let batch: Vec<Sample> = (0..4).map(|t| waited(1, 40 + t)).collect();
        let got = decode(&encode_v6(&batch)).unwrap();
        assert_eq!(got, batch);
        let queues: Vec<Option<u16>> = got.iter().map(|s| s.rx_queue).collect();
        assert_eq!(queues, [Some(0), Some(41), Some(u16::MAX - 1), None]);
        // A version 5 chunk of the same samples (as the build before wrote them) reads
        // every other field as written and no RX queue.
        let v5 = compressed_v5(&without_queue(&batch));
        assert_eq!(v5[0], SAMPLE_CHUNK_V5);
        let old = decode(&v5).unwrap();
        assert_eq!(old, without_queue(&batch));
        assert!(old.iter().all(|s| s.rx_queue.is_none()));
        assert_eq!(old[0].reader_wait, batch[0].reader_wait);
        assert_eq!(old[3].skb, batch[3].skb);
    }

    #[test]
    fn counts_of_old_and_damaged_records() {
        // The layout before the skb address: today's without its last three fields
        // (`None` each, three trailing 0 bytes).
        let before = Sample {
            skb: None,
            reader_wait: None,
            ..sample(1, 1)
        };
        let payload = sample_bytes_before(&before, 3);
        let mut old = vec![codec::RECORD_VERSION];
        let crc = crc32c::crc32c_append(crc32c::crc32c(&old), &payload);
        old.extend_from_slice(&crc.to_be_bytes());
        old.extend_from_slice(&payload);
        assert_eq!(sample_count(&old), 1);
        assert_eq!(decode(&old).unwrap(), vec![before]);
        assert!(!is_chunk(&old));
        let mut unknown = old.clone();
        unknown[0] = 9;
        assert_eq!(decode(&unknown), Err(DecodeError::Version(9)));
        for make in [encode_v6, compressed_v5, compressed_v4] {
            let mut chunk = make(&[sample(1, 1), sample(1, 2)]);
            assert_eq!(sample_count(&chunk), 2);
            let last = chunk.len() - 1;
            chunk[last] ^= 1;
            assert_eq!(sample_count(&chunk), 0);
            assert_eq!(decode(&chunk), Err(DecodeError::Checksum));
        }
    }

    /// A chunk as this build writes it (version 6).
    fn encode_v6(samples: &[Sample]) -> Vec<u8> {
        let mut chunks = encode_batch(1, samples).unwrap();
        assert_eq!(chunks.len(), 1);
        chunks.remove(0).value
    }

    /// A version 3 chunk, as builds before compression wrote them (no reader's wait).
    fn uncompressed(samples: &[Sample]) -> Vec<u8> {
        let mut out = vec![SAMPLE_CHUNK_V3, 0, 0, 0, 0];
        out.extend(samples_v3_bytes(samples));
        codec::seal("test", out, MAX_CHUNK_BYTES).unwrap()
    }

    /// A version 4 chunk, as builds before the reader's wait wrote them.
    fn compressed_v4(samples: &[Sample]) -> Vec<u8> {
        let raw = samples_v3_bytes(samples);
        let block = lz4_flex::block::compress(&raw);
        sealed_as(SAMPLE_CHUNK_V4, (samples.len(), raw.len()), &block)
    }

    /// A version 5 chunk, as builds before the RX queue wrote them.
    fn compressed_v5(samples: &[Sample]) -> Vec<u8> {
        let raw = samples_v5_bytes(samples);
        let block = lz4_flex::block::compress(&raw);
        sealed_as(SAMPLE_CHUNK_V5, (samples.len(), raw.len()), &block)
    }

    /// Samples as a version 6 chunk's block holds them, uncompressed.
    fn plain(samples: &[Sample]) -> Vec<u8> {
        let refs: Vec<&Sample> = samples.iter().collect();
        postcard::to_allocvec(&SamplesV6(&refs)).unwrap()
    }

    /// A compressed chunk's envelope of `version` around `header` and `block`, its
    /// checksum right.
    fn sealed_as(version: u8, header: (usize, usize), block: &[u8]) -> Vec<u8> {
        let mut out = postcard::to_extend(&header, vec![version, 0, 0, 0, 0]).unwrap();
        out.extend_from_slice(block);
        codec::seal("test", out, usize::MAX).unwrap()
    }

    /// [`sealed_as`] of this build's version.
    fn sealed(header: (usize, usize), block: &[u8]) -> Vec<u8> {
        sealed_as(SAMPLE_CHUNK_VERSION, header, block)
    }

    #[test]
    fn chunks_are_compressed_and_older_ones_still_read() {
        let batch: Vec<Sample> = (0..256).map(|t| waited(1, 1_000_000 + t * 977)).collect();
        let chunk = encode_v6(&batch);
        assert_eq!(chunk[0], SAMPLE_CHUNK_VERSION);
        assert_eq!(decode(&chunk).unwrap(), batch);
        assert_eq!(sample_count(&chunk), 256);
        assert!(is_chunk(&chunk));
        // The layouts before the RX queue read their samples without one, those before the
        // reader's wait without that either.
        let older = without_wait(&batch);
        let v5 = compressed_v5(&without_queue(&batch));
        let v4 = compressed_v4(&older);
        let v3 = uncompressed(&older);
        // The same samples uncompressed.
        let raw = plain(&batch).len();
        assert!(
            chunk.len() * 2 < raw,
            "compressed {} bytes, uncompressed {raw}",
            chunk.len(),
        );
        for (v, old, want) in [
            (SAMPLE_CHUNK_V5, v5, without_queue(&batch)),
            (SAMPLE_CHUNK_V4, v4, older.clone()),
            (SAMPLE_CHUNK_V3, v3, older.clone()),
        ] {
            assert_eq!(old[0], v);
            assert_eq!(decode(&old).unwrap(), want, "version {v}");
            assert_eq!(sample_count(&old), 256, "version {v}");
            assert!(is_chunk(&old), "version {v}");
            assert_eq!(
                codec::verify(&old).map(<[u8]>::len),
                Ok(old.len() - codec::HEADER),
                "version {v}"
            );
        }
        assert_eq!(
            codec::verify(&chunk).map(<[u8]>::len),
            Ok(chunk.len() - codec::HEADER)
        );
    }

    #[test]
    fn a_compressed_chunk_whose_header_lies_is_an_error_not_an_allocation() {
        let batch: Vec<Sample> = (0..3).map(|t| waited(1, t)).collect();
        for (version, raw, want) in [
            (SAMPLE_CHUNK_VERSION, plain(&batch), batch.clone()),
            (
                SAMPLE_CHUNK_V5,
                samples_v5_bytes(&without_queue(&batch)),
                without_queue(&batch),
            ),
            (
                SAMPLE_CHUNK_V4,
                samples_v3_bytes(&without_wait(&batch)),
                without_wait(&batch),
            ),
        ] {
            let block = lz4_flex::block::compress(&raw);
            assert_eq!(
                decode(&sealed_as(version, (3, raw.len()), &block)).unwrap(),
                want
            );
            for (header, block, why) in [
                ((3, 1 << 40), &block[..], "over the caps"),
                ((1000, raw.len()), &block[..], "over the caps"),
                ((2, raw.len()), &block[..], "the header says 2"),
                ((3, raw.len() + 7), &block[..], "the header says"),
                ((3, raw.len()), &block[..block.len() - 3], "lz4 block"),
                ((3, raw.len()), &[0xff, 0xff, 0xff][..], "lz4 block"),
            ] {
                match decode(&sealed_as(version, header, block)) {
                    Err(DecodeError::Payload(e)) => {
                        assert!(e.contains(why), "v{version} {header:?}: {e}")
                    }
                    other => panic!("v{version} {header:?}: {other:?}"),
                }
            }
        }
    }

    /// Any reader's wait: either time, a holder or none, any pid and command name.
    fn any_reader_wait() -> impl proptest::strategy::Strategy<Value = Option<ReaderWait>> {
        use proptest::prelude::*;
        let holder = (any::<u32>(), "[a-z0-9/:é -]{0,7}").prop_map(|(pid, comm)| CpuHolder {
            pid,
            comm: Comm::try_from(comm.as_str()).unwrap(),
        });
        proptest::option::of(
            (any::<u64>(), any::<u64>(), proptest::option::of(holder)).prop_map(
                |(runq_ns, off_cpu_ns, cpu_holder)| ReaderWait {
                    runq_ns,
                    off_cpu_ns,
                    cpu_holder,
                },
            ),
        )
    }

    proptest::proptest! {
        #![proptest_config(model::fixtures::fuzz_config(256))]

        /// The checksum catches flipped bytes; this is what decompression gets if a damaged
        /// record's checksum matched anyway: any header and block, a real block cut or
        /// overwritten, of either compressed version. An error or samples, never a panic
        /// or an allocation past the cap.
        #[test]
        fn fuzz_compressed_chunks_behind_a_matching_checksum(
            count in 0usize..600,
            raw_len in proptest::prop_oneof![0usize..100_000, proptest::prelude::any::<usize>()],
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
            cut in 0usize..64,
            at in 0usize..4096,
            version in proptest::sample::select(vec![
                SAMPLE_CHUNK_V4,
                SAMPLE_CHUNK_V5,
                SAMPLE_CHUNK_VERSION,
            ]),
        ) {
            let _ = decode(&sealed_as(version, (count, raw_len), &junk));
            let batch: Vec<Sample> = (0..40).map(|t| waited(1, t)).collect();
            let raw = match version {
                SAMPLE_CHUNK_V4 => samples_v3_bytes(&without_wait(&batch)),
                SAMPLE_CHUNK_V5 => samples_v5_bytes(&without_queue(&batch)),
                _ => plain(&batch),
            };
            let mut block = lz4_flex::block::compress(&raw);
            block.truncate(block.len().saturating_sub(cut));
            if !junk.is_empty() && !block.is_empty() {
                let i = at % block.len();
                block[i] ^= junk[0] | 1;
            }
            let _ = decode(&sealed_as(version, (count, raw_len), &block));
            let _ = decode(&sealed_as(version, (40, raw.len()), &block));
            let _ = decode(&sealed((40, raw.len()), &block));
        }

        /// Any reader's wait and RX queue are read back as they were written.
        #[test]
        fn any_readers_wait_and_rx_queue_round_trip(
            waits in proptest::collection::vec(
                (any_reader_wait(), proptest::option::of(proptest::prelude::any::<u16>())),
                1..8,
            ),
        ) {
            let batch: Vec<Sample> = waits
                .into_iter()
                .enumerate()
                .map(|(t, (reader_wait, rx_queue))| Sample {
                    reader_wait,
                    rx_queue,
                    ..sample(1, t as u64)
                })
                .collect();
            let chunk = encode_v6(&batch);
            proptest::prop_assert_eq!(sample_count(&chunk), batch.len() as u64);
            proptest::prop_assert_eq!(decode(&chunk).unwrap(), batch);
        }
    }

    #[test]
    fn a_batch_filling_too_many_chunks_is_refused() {
        // One sample per incident: every sample is a chunk of its own.
        let batch: Vec<Sample> = (0..=MAX_CHUNKS_PER_BATCH as u64)
            .map(|i| sample(i, 0))
            .collect();
        assert!(matches!(
            encode_batch(1, &batch),
            Err(StoreError::TooLarge { max, .. }) if max == MAX_CHUNKS_PER_BATCH
        ));
    }
}
