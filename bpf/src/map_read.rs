//! Reading the probes' maps: the one error type of every read, and the decoding of map
//! bytes into the BTF-generated types. Below the loader and the histogram readers, which
//! all use it.

/// Why reading the probes' maps failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A map lookup failed.
    #[error("reading BPF map {map}: {source}")]
    Map {
        /// The map.
        map: &'static str,
        /// The libbpf error.
        source: libbpf_rs::Error,
    },
    /// A map returned data of an unexpected size.
    #[error("BPF map {map} returned {got} bytes, expected {expected}")]
    Size {
        /// The map.
        map: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// A histogram from the kernel was inconsistent.
    #[error("histogram from the kernel: {0}")]
    Hist(#[from] model::hist::HistError),
    /// Reading the TAI offset failed.
    #[error("reading the TAI offset: {0}")]
    Clock(std::io::Error),
}

/// A value of a BTF-generated plain-data type from map bytes.
pub(crate) fn decode<T: Copy + Default>(map: &'static str, bytes: &[u8]) -> Result<T, ReadError> {
    let expected = std::mem::size_of::<T>();
    if bytes.len() != expected {
        return Err(ReadError::Size {
            map,
            got: bytes.len(),
            expected,
        });
    }
    let mut value = T::default();
    // SAFETY: T is a repr(C) integer-only type generated from the BPF object's BTF (or a
    // plain integer), so any bytes of its size are a valid value; sizes were checked.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            (&mut value as *mut T).cast::<u8>(),
            expected,
        );
    }
    Ok(value)
}
