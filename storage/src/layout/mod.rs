//! Frozen layouts: the types whose postcard encoding *is* a stored record's bytes.
//!
//! postcard writes no field names or lengths of structs: a record decodes only into a type
//! with exactly the fields, in exactly the order and of exactly the types, it was written
//! from. So the store never encodes or decodes a live type (`model::Sample`,
//! [`crate::Incident`], ...) directly: each layout ever written is a plain type here, all
//! the way down (no live type inside), named after the first record version that wrote it,
//! with a conversion from and to the live type. Changing a live type then cannot move a
//! stored byte: the exhaustive conversions stop compiling, and the golden files
//! (`storage/tests/golden/`, tests in `golden_tests.rs` and `tests/upgrade.rs`) fail.
//! docs/storage.md, "Changing a stored type", says what to do then.
//!
//! - [`common`]: the leaf types several records share (probe, flow, socket queue, histogram).
//! - [`incident`]: incident records (envelope versions 1 and 2), pwru records and verdicts
//!   (envelope version 1).
//! - [`sample`]: samples of one-sample records (version 1) and chunks (versions 2 to 6).
//!
//! Tests: `fingerprint` checks that each live type still has its layout's fields, by
//! name and order; `golden_tests` decodes a golden file of every layout and checks that
//! today's encoding of the current layouts is their bytes.
//!
//! A frozen type is never edited once a build wrote it; a new layout is a new type.

/// `From` both ways between a live enum and its frozen layout, whose variants are the
/// same, by name and without data. Both matches are exhaustive: a variant added to the
/// live enum is a compile error until its layout has it (a new type).
macro_rules! same_variants {
    ($live:ident <-> $frozen:ident { $($variant:ident),+ $(,)? }) => {
        impl From<$live> for $frozen {
            fn from(v: $live) -> $frozen {
                match v {
                    $($live::$variant => $frozen::$variant,)+
                }
            }
        }

        impl From<$frozen> for $live {
            fn from(v: $frozen) -> $live {
                match v {
                    $($frozen::$variant => $live::$variant,)+
                }
            }
        }
    };
}

pub(crate) mod common;
#[cfg(test)]
mod fingerprint;
pub(crate) mod incident;
pub(crate) mod sample;

use crate::codec::Record;

/// Types whose postcard encoding is fixed by postcard's own (stable, 1.0) wire format:
/// integers, strings, byte and string lists. Meta values and baselines (opaque bytes)
/// are stored as these.
macro_rules! stored_as_itself {
    ($($t:ty),*) => {$(
        impl Record for $t {
            type Frozen = $t;
            fn freeze(&self) -> $t {
                self.clone()
            }
            fn thaw(frozen: $t) -> Result<$t, String> {
                Ok(frozen)
            }
        }
    )*};
}

stored_as_itself!(u32, u64, Vec<u8>, Vec<String>);
