//! Reading the per-CPU histogram map every interval at the least cost: one buffer kept
//! between reads, only the entries in use, CPUs summed straight from the kernel's words,
//! and each entry's total count and sum compared with what the previous read saw, so that a
//! histogram that did not move costs nothing further.

use model::hist::NUM_BUCKETS;

use crate::map_read::ReadError;

/// Words of one histogram value: the bucket counts, then the sum of latencies.
pub(crate) const WORDS: usize = NUM_BUCKETS + 1;
/// Bytes of one CPU's value. A multiple of 8, so also the kernel's per-CPU stride.
const VALUE_BYTES: usize = WORDS * 8;

/// Most bytes of values one batched lookup fills. The buffer lives as long as the probes,
/// so it is bounded: with many CPUs one entry alone is `CPUs x 2 KiB`, and the whole map
/// would be tens of MiB.
const BATCH_BYTES: usize = 1 << 20;

/// The CPU-summed words of one entry.
pub(crate) type Sums = [u64; WORDS];

/// What reading the histogram map needs to keep between reads.
pub(crate) struct HistReader {
    cpus: usize,
    /// Filled by the kernel (words, so they are summed without a copy); reused, since
    /// allocating (and faulting in) megabytes every interval was a good part of the read's
    /// cost.
    values: Vec<u64>,
    keys: Vec<u32>,
    /// Per entry read so far, its total count and sum of latencies as the last read took
    /// them (zero before). Counts only grow (a slot is zeroed only through
    /// [`HistReader::zeroed`]), so equal totals mean equal buckets: comparing two words
    /// instead of 273 was a tenth of the daemon's CPU.
    last: Vec<Totals>,
    /// Whether the kernel reads a per-CPU array in batches (5.10 does not: one lookup per
    /// entry instead).
    batched: bool,
}

/// An entry's total count over its buckets and its sum of latencies.
type Totals = (u64, u64);

fn totals(sums: &Sums) -> Totals {
    let count = sums[..NUM_BUCKETS]
        .iter()
        .fold(0u64, |acc, &n| acc.saturating_add(n));
    (count, sums[NUM_BUCKETS])
}

impl HistReader {
    pub(crate) fn new(cpus: usize) -> HistReader {
        HistReader {
            cpus: cpus.max(1),
            values: Vec::new(),
            keys: Vec::new(),
            last: Vec::new(),
            batched: true,
        }
    }

    /// Read entry by entry, as where the kernel has no batched lookup.
    pub(crate) fn read_one_by_one(&mut self) {
        self.batched = false;
    }

    /// Find out whether the kernel reads `map` in batches, and read it entry by entry from
    /// now on if not. Returns whether it does.
    pub(crate) fn check_batched(&mut self, map: &libbpf_rs::MapMut<'_>) -> Result<bool, ReadError> {
        let per_entry = self.cpus * WORDS;
        let mut keys = [0u32; 1];
        let mut values = vec![0u64; per_entry];
        match lookup_batch(map, None, &mut keys, &mut values, 1, per_entry) {
            Ok(_) => self.batched = true,
            Err(e) if batch_unsupported(&e) => self.batched = false,
            Err(e) => return Err(e),
        }
        Ok(self.batched)
    }

    /// Read entries `0..entries` of the per-CPU histogram `map` and call `each` with every
    /// entry's index, its sums over CPUs and whether they differ from the sums kept. `each`
    /// returns whether it took the entry: only then are its sums kept for the next read
    /// (an entry passed over, say of a slot not named yet, is still changed next time).
    pub(crate) fn read(
        &mut self,
        map: &libbpf_rs::MapMut<'_>,
        entries: u32,
        mut each: impl FnMut(u32, &Sums, bool) -> Result<bool, ReadError>,
    ) -> Result<(), ReadError> {
        let per_entry = self.cpus * WORDS;
        let batch = (BATCH_BYTES / (self.cpus * VALUE_BYTES)).clamp(1, (entries as usize).max(1));
        if self.keys.len() < batch {
            self.keys.resize(batch, 0);
            self.values.resize(batch * per_entry, 0);
        }
        if self.last.len() < entries as usize {
            // Never shrunk: the entries past a smaller prefix keep their last totals.
            self.last.resize(entries as usize, (0, 0));
        }
        if !self.batched {
            for key in 0..entries {
                let words = &mut self.values[..per_entry];
                lookup_one(map, key, words)?;
                visit(&mut self.last, key, words, &mut each)?;
            }
            return Ok(());
        }
        let mut done = 0u32;
        let mut after: Option<u32> = None;
        while done < entries {
            // `batch` is at most `entries`, a u32.
            let want = (entries - done).min(batch as u32);
            let (got, last_key) = lookup_batch(
                map,
                after,
                &mut self.keys,
                &mut self.values,
                want,
                per_entry,
            )?;
            for (key, bytes) in self
                .keys
                .iter()
                .zip(self.values.chunks_exact(per_entry))
                .take(got as usize)
            {
                visit(&mut self.last, *key, bytes, &mut each)?;
            }
            done += got;
            if got < want {
                break; // the map ended
            }
            after = Some(last_key);
        }
        Ok(())
    }

    /// Entry `key`'s value on each CPU, indexed by CPU: one plain lookup of one entry, for
    /// naming the CPU a slow service's packets concentrate on (done per open incident, not
    /// per interval for every entry, so it costs the loop nothing otherwise).
    pub(crate) fn read_per_cpu(
        &self,
        map: &libbpf_rs::MapMut<'_>,
        key: u32,
    ) -> Result<Vec<Sums>, ReadError> {
        let mut words = vec![0u64; self.cpus * WORDS];
        lookup_one(map, key, &mut words)?;
        Ok(words
            .chunks_exact(WORDS)
            .map(|cpu| {
                let mut sums = [0u64; WORDS];
                sums.copy_from_slice(cpu);
                sums
            })
            .collect())
    }

    /// Forget what was read: the next read finds every entry with data changed.
    pub(crate) fn forget(&mut self) {
        self.last.clear();
    }

    /// The kernel's entry `index` was set to zero (a freed slot): the next read compares
    /// with that.
    pub(crate) fn zeroed(&mut self, index: u32) {
        if let Some(last) = self.last.get_mut(index as usize) {
            *last = (0, 0);
        }
    }
}

/// Sum entry `key`'s per-CPU `words`, hand the sums to `each` with whether their totals
/// differ from those in `last`, and keep the totals there if `each` took them. A `key` past
/// `last` is not an entry of this read.
fn visit(
    last: &mut [Totals],
    key: u32,
    words: &[u64],
    each: &mut impl FnMut(u32, &Sums, bool) -> Result<bool, ReadError>,
) -> Result<(), ReadError> {
    let Some(kept) = last.get_mut(key as usize) else {
        return Ok(());
    };
    let mut sums = [0u64; WORDS];
    sum_cpus(words, &mut sums);
    let now = totals(&sums);
    let changed = now != *kept;
    if each(key, &sums, changed)? && changed {
        *kept = now;
    }
    Ok(())
}

/// Add up the per-CPU values of one entry (`CPUs x WORDS` words, as the kernel hands them
/// over) word by word, saturating like the histograms themselves.
fn sum_cpus(words: &[u64], sums: &mut Sums) {
    for cpu in words.chunks_exact(WORDS) {
        for (total, &word) in sums.iter_mut().zip(cpu) {
            *total = total.saturating_add(word);
        }
    }
}

/// The kernel has no batched lookup for this map type (ENOTSUPP, or EOPNOTSUPP).
fn batch_unsupported(e: &ReadError) -> bool {
    const ENOTSUPP: i32 = 524; // the kernel's own, not in libc
    match e {
        ReadError::Map { source, .. } => {
            let text = source.to_string();
            [ENOTSUPP, libc::EOPNOTSUPP]
                .iter()
                .any(|n| text.contains(&format!("os error {n})")))
        }
        _ => false,
    }
}

/// One entry's per-CPU value (`per_entry` words) by a plain lookup.
fn lookup_one(map: &libbpf_rs::MapMut<'_>, key: u32, words: &mut [u64]) -> Result<(), ReadError> {
    use libbpf_rs::libbpf_sys;
    use std::os::fd::{AsFd, AsRawFd};

    // SAFETY: words holds one entry's per-CPU value, CPUs x WORDS u64 words, which is
    // what the kernel writes for a per-CPU array of this value size; key is a u32 like the
    // array's key.
    let ret = unsafe {
        libbpf_sys::bpf_map_lookup_elem(
            map.as_fd().as_raw_fd(),
            (&raw const key).cast(),
            words.as_mut_ptr().cast(),
        )
    };
    if ret < 0 {
        return Err(ReadError::Map {
            map: "hists",
            source: libbpf_rs::Error::from_raw_os_error(-ret),
        });
    }
    Ok(())
}

/// One `BPF_MAP_LOOKUP_BATCH` of up to `count` entries, starting after key `after` (from
/// the first without one). Returns how many entries it filled and the last key read.
fn lookup_batch(
    map: &libbpf_rs::MapMut<'_>,
    after: Option<u32>,
    keys: &mut [u32],
    values: &mut [u64],
    count: u32,
    per_entry: usize,
) -> Result<(u32, u32), ReadError> {
    use libbpf_rs::libbpf_sys;
    use std::os::fd::{AsFd, AsRawFd};

    let map_err = |source| ReadError::Map {
        map: "hists",
        source,
    };
    if keys.len() < count as usize || values.len() < count as usize * per_entry {
        return Err(ReadError::Size {
            map: "hists",
            got: values.len() * 8,
            expected: count as usize * per_entry * 8,
        });
    }
    let mut in_batch = after.unwrap_or(0);
    let mut out_batch = 0u32;
    let mut filled = count;
    let opts = libbpf_sys::bpf_map_batch_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
        ..Default::default()
    };
    let in_ptr: *mut u32 = match after {
        Some(_) => &raw mut in_batch,
        None => std::ptr::null_mut(),
    };
    // SAFETY: keys holds at least `count` u32 keys and values at least `count` per-CPU
    // values of `per_entry` words (checked above), the most the kernel writes for `count`;
    // in_batch and out_batch are u32 like the array's key.
    let ret = unsafe {
        libbpf_sys::bpf_map_lookup_batch(
            map.as_fd().as_raw_fd(),
            in_ptr.cast(),
            (&raw mut out_batch).cast(),
            keys.as_mut_ptr().cast(),
            values.as_mut_ptr().cast(),
            &mut filled,
            &opts,
        )
    };
    // ENOENT: the batch reached the end of the map.
    if ret < 0 && ret != -libc::ENOENT {
        return Err(map_err(libbpf_rs::Error::from_raw_os_error(-ret)));
    }
    Ok((filled.min(count), out_batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-CPU values as the kernel hands them over, from (bucket, count) per CPU and sums.
    fn values(cpus: &[(&[(usize, u64)], u64)]) -> Vec<u64> {
        let mut out = Vec::new();
        for (buckets, sum) in cpus {
            let mut words = [0u64; WORDS];
            for &(i, n) in *buckets {
                words[i] = n;
            }
            words[NUM_BUCKETS] = *sum;
            out.extend(words);
        }
        out
    }

    #[test]
    fn cpus_are_summed_word_by_word_and_saturate() {
        let bytes = values(&[
            (&[(0, 1), (5, 2), (271, u64::MAX)], 10),
            (&[(5, 3), (271, 7)], 20),
        ]);
        let mut sums = [0u64; WORDS];
        sum_cpus(&bytes, &mut sums);
        assert_eq!(sums[0], 1);
        assert_eq!(sums[5], 5);
        assert_eq!(sums[271], u64::MAX);
        assert_eq!(sums[NUM_BUCKETS], 30);
        assert_eq!(sums.iter().filter(|&&w| w != 0).count(), 4);
    }

    /// Visit entry `key` with `bytes`, taking it or not: (changed, count in bucket 0).
    fn seen(last: &mut [Totals], key: u32, bytes: &[u64], take: bool) -> Option<(bool, u64)> {
        let mut out = None;
        visit(last, key, bytes, &mut |_, sums, changed| {
            out = Some((changed, sums[0]));
            Ok(take)
        })
        .unwrap();
        out
    }

    #[test]
    fn an_entry_is_changed_only_when_a_sum_moved_since_it_was_taken() {
        let mut last = vec![(0, 0); 2];
        let untouched = values(&[(&[], 0), (&[], 0)]);
        assert_eq!(seen(&mut last, 0, &untouched, true), Some((false, 0)));
        // A sample of 0 ns moves a count but not the sum of latencies.
        let one = values(&[(&[(0, 1)], 0), (&[], 0)]);
        // Passed over: still a change at the next read.
        assert_eq!(seen(&mut last, 1, &one, false), Some((true, 1)));
        assert_eq!(seen(&mut last, 1, &one, true), Some((true, 1)));
        assert_eq!(seen(&mut last, 1, &one, true), Some((false, 1)));
        // The same total from the other CPU is no change either.
        let moved = values(&[(&[], 0), (&[(0, 1)], 0)]);
        assert_eq!(seen(&mut last, 1, &moved, true), Some((false, 1)));
        let more = values(&[(&[(0, 1)], 0), (&[(9, 1)], 20)]);
        assert_eq!(seen(&mut last, 1, &more, true), Some((true, 1)));
        assert_eq!(last[1], (2, 20));
        // Past the entries kept: not an entry of the read.
        assert_eq!(seen(&mut last, 2, &more, true), None);
    }

    #[test]
    fn the_layout_is_the_kernels() {
        assert_eq!(VALUE_BYTES, crate::HIST_VALUE_BYTES);
        assert_eq!(VALUE_BYTES % 8, 0);
    }
}
