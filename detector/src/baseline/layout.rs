//! Frozen layouts of a saved baseline: the types whose postcard encoding, after the format
//! version byte, *is* what [`Baseline::to_bytes`] writes and the store keeps across
//! upgrades.
//!
//! postcard writes no field names: saved bytes decode only into a type with exactly the
//! fields, in exactly the order and of exactly the types, they were written from. So a
//! baseline is never encoded from the live [`Baseline`]: each layout ever written is a
//! plain type here, all the way down (numbers, no live type inside), named after the
//! format version that wrote it, with conversions from and to the live type that
//! destructure it. A field added to [`Baseline`] does not compile until it has a place
//! (stored in a new layout, or derived on restore like `total` and `span`); the golden
//! files (`detector/tests/golden/`, `golden_tests.rs`) fail when a layout's bytes move.
//! docs/storage.md, "Changing a stored type", says what to do.
//!
//! A frozen type is never edited once a build wrote it: a new layout is a new type and a
//! new [`FORMAT_VERSION`], and the old one stays, read by [`Baseline::from_bytes`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use model::hist::NUM_BUCKETS;
use serde::{Deserialize, Serialize};

use super::{Baseline, BaselineError};

/// Version byte in front of every baseline this build saves: its layout is [`BaselineV1`].
pub(crate) const FORMAT_VERSION: u8 = 1;

/// Format version 1: the non-zero weights as `(bucket index, weight)` in bucket order
/// (indices of `model::hist`'s bucket scheme), the times as seconds since the epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct BaselineV1 {
    pub(super) weights: Vec<(u16, f64)>,
    pub(super) first_seen_s: f64,
    pub(super) last_update_s: f64,
}

/// The live [`Baseline`]'s fields that [`BaselineV1`] accounts for, in order; the
/// fingerprint test below fails when the live type's fields differ.
#[cfg(test)]
const LIVE_FIELDS_V1: [&str; 5] = ["weights", "total", "span", "first_seen", "last_update"];

impl From<&Baseline> for BaselineV1 {
    fn from(b: &Baseline) -> BaselineV1 {
        // Destructured: a field added to the live type is a compile error here.
        // `total` and `span` are not stored: a restore adds them up from the weights.
        let Baseline {
            weights,
            total: _,
            span: _,
            first_seen,
            last_update,
        } = b;
        BaselineV1 {
            weights: weights
                .iter()
                .enumerate()
                .filter(|(_, &w)| w > 0.0)
                .map(|(i, &w)| (i as u16, w))
                .collect(),
            first_seen_s: epoch_secs(*first_seen),
            last_update_s: epoch_secs(*last_update),
        }
    }
}

impl TryFrom<BaselineV1> for Baseline {
    type Error = BaselineError;

    fn try_from(saved: BaselineV1) -> Result<Baseline, BaselineError> {
        let BaselineV1 {
            weights,
            first_seen_s,
            last_update_s,
        } = saved;
        let mut b = Baseline {
            weights: Box::new([0.0; NUM_BUCKETS]),
            total: 0.0,
            span: (0, 0),
            first_seen: from_epoch_secs(first_seen_s)?,
            last_update: from_epoch_secs(last_update_s)?,
        };
        for (i, w) in weights {
            let slot = b
                .weights
                .get_mut(usize::from(i))
                .ok_or_else(|| BaselineError::Corrupt(format!("bucket {i} out of range")))?;
            if !(w.is_finite() && w >= 0.0) {
                return Err(BaselineError::Corrupt(format!("bucket {i} weight {w}")));
            }
            *slot = w;
            b.total += w;
            b.widen(usize::from(i));
        }
        Ok(b)
    }
}

fn epoch_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn from_epoch_secs(s: f64) -> Result<SystemTime, BaselineError> {
    Duration::try_from_secs_f64(s)
        .map(|d| UNIX_EPOCH + d)
        .map_err(|_| BaselineError::Corrupt(format!("time {s}")))
}

/// Test-time check that the live [`Baseline`] still has exactly the fields its current
/// layout was made from, by name and order. The live type has no serde derive (its
/// weights are a 272-bucket array), so the names come from its derived `Debug`: each
/// field is one line at the first indent of the pretty form. A field added to the live
/// type fails this even where its conversion was made to compile by ignoring it (`..`).
#[cfg(test)]
mod fingerprint {
    use std::fmt::Debug;
    use std::time::UNIX_EPOCH;

    use super::{Baseline, LIVE_FIELDS_V1};

    /// The top-level field names of `value`'s derived `Debug`.
    fn fields(value: &impl Debug) -> Vec<String> {
        format!("{value:#?}")
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("    ")?;
                let (name, _) = rest.split_once(": ")?;
                let ident =
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                ident.then(|| name.to_owned())
            })
            .collect()
    }

    #[test]
    fn the_live_baseline_has_the_fields_of_its_frozen_layout() {
        let live = fields(&Baseline::new(UNIX_EPOCH));
        assert_eq!(
            live, LIVE_FIELDS_V1,
            "the live Baseline no longer matches the fields its saved layout was made from; \
             add a new frozen version (docs/storage.md, \"Changing a stored type\")"
        );
    }

    /// The check itself: a field more, nested values and a renamed field are told apart.
    #[test]
    fn a_field_added_to_a_live_type_is_reported() {
        #[derive(Debug)]
        #[allow(dead_code)] // only its Debug form is looked at
        struct Inner {
            deep: u8,
        }
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Live {
            a: [f64; 2],
            b: Inner,
            added: Option<u32>,
        }
        let got = fields(&Live {
            a: [0.0; 2],
            b: Inner { deep: 1 },
            added: Some(3),
        });
        assert_eq!(got, ["a", "b", "added"]);
    }
}
