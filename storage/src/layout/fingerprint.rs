//! Test-time check that every live stored type still has exactly the fields (and enum
//! variants) of the frozen layout it is written as, in the same order: serde tells a
//! deserializer a struct's field names and an enum's variant names, and the tiny
//! deserializer below records them. A field added to a live type therefore fails this
//! test even where its conversion was made to compile by ignoring the field (`..`);
//! the exhaustive conversions already fail to compile when it is not.

use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::common::{FlowV1, HistogramV1, ProbeV1, SocketQueueV1, TransportV1};
use super::incident::{
    CaptureStateV1, CaptureStatusV1, IncidentCauseV1, IncidentCountersV1, IncidentStateV1,
    IncidentV1, IncidentV2, IncidentVerdictV1, PwruRecordV1, PwruStateV1, PwruStatusV1, VerdictV1,
};
use super::sample::{CpuHolderV1, ReaderWaitV1, SampleV1, SampleV6};

/// Records the field or variant names serde asks for, then stops the deserialization.
struct Names<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for Names<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("neither a struct nor an enum"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("names taken"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(variants);
        Err(de::Error::custom("names taken"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        identifier ignored_any
    }
}

/// `T`'s field or variant names, normalised (case, `-` and `_` dropped: live enums are
/// renamed to kebab-case for JSON).
fn names<T: Deserialize<'static>>() -> Vec<String> {
    let mut out = None;
    // Always an error: the names are what it leaves behind.
    let _ = T::deserialize(Names(&mut out));
    out.unwrap_or_default()
        .iter()
        .map(|n| n.to_lowercase().replace(['-', '_'], ""))
        .collect()
}

/// Differences between live types and their frozen layouts, one line each.
fn mismatches(pairs: &[(&str, Vec<String>, Vec<String>)]) -> Vec<String> {
    pairs
        .iter()
        .filter(|(_, live, frozen)| live != frozen || live.is_empty())
        .map(|(name, live, frozen)| format!("{name}: live {live:?}, frozen {frozen:?}"))
        .collect()
}

/// `outer`'s names with `field`'s replaced by `inner`, the names of the struct it holds:
/// a frozen layout that starts with an earlier one holds it as a field, whose fields the
/// live type has in its place.
fn nested(outer: Vec<String>, field: &str, inner: Vec<String>) -> Vec<String> {
    let field = field.replace('_', "");
    assert!(outer.contains(&field), "no field {field} in {outer:?}");
    outer
        .into_iter()
        .flat_map(|n| if n == field { inner.clone() } else { vec![n] })
        .collect()
}

macro_rules! pair {
    ($live:ty, $frozen:ty) => {
        (stringify!($live), names::<$live>(), names::<$frozen>())
    };
    ($live:ty, $frozen:ty, $field:ident: $inner:ty) => {
        (
            stringify!($live),
            names::<$live>(),
            nested(names::<$frozen>(), stringify!($field), names::<$inner>()),
        )
    };
}

#[test]
fn live_stored_types_have_the_fields_of_their_frozen_layouts() {
    use crate::model::*;
    use model::Verdict;
    use model::{CpuHolder, Flow, Histogram, Probe, ReaderWait, Sample, SocketQueue, Transport};
    let pairs = [
        pair!(Sample, SampleV6<'static>, v1: SampleV1<'static>),
        pair!(ReaderWait, ReaderWaitV1<'static>),
        pair!(CpuHolder, CpuHolderV1<'static>),
        pair!(Flow, FlowV1),
        pair!(Transport, TransportV1),
        pair!(SocketQueue, SocketQueueV1),
        pair!(Probe, ProbeV1),
        pair!(Histogram, HistogramV1),
        pair!(Incident, IncidentV2, v1: IncidentV1),
        pair!(IncidentCause, IncidentCauseV1),
        pair!(IncidentState, IncidentStateV1),
        pair!(CaptureStatus, CaptureStatusV1),
        pair!(CaptureState, CaptureStateV1),
        pair!(PwruStatus, PwruStatusV1),
        pair!(PwruState, PwruStateV1),
        pair!(IncidentCounters, IncidentCountersV1),
        pair!(PwruRecord, PwruRecordV1),
        pair!(IncidentVerdict, IncidentVerdictV1),
        pair!(Verdict, VerdictV1),
    ];
    let bad = mismatches(&pairs);
    assert!(
        bad.is_empty(),
        "a live stored type no longer matches the layout it is stored as; add a new \
         frozen version (docs/storage.md, \"Changing a stored type\"):\n{}",
        bad.join("\n")
    );
}

/// The check itself: a type with one field more than its layout is reported.
#[test]
fn a_field_added_to_a_live_type_is_reported() {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)] // only its serde names are looked at
    struct Frozen {
        a: u64,
        b: String,
    }
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Live {
        a: u64,
        b: String,
        added: Option<u32>,
    }
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    enum LiveEnum {
        One,
        Two,
    }
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    enum FrozenEnum {
        One,
    }
    /// [`Frozen`]'s fields held as one, then one more.
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct FrozenNested {
        first: Frozen,
        added: Option<u32>,
    }
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct LiveMore {
        a: u64,
        b: String,
        added: Option<u32>,
        more: u8,
    }
    let bad = mismatches(&[
        pair!(Live, Frozen),
        pair!(Frozen, Frozen),
        pair!(LiveEnum, FrozenEnum),
        pair!(Live, FrozenNested, first: Frozen),
        pair!(LiveMore, FrozenNested, first: Frozen),
    ]);
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(bad[0].contains("added"), "{bad:?}");
    assert!(bad[1].contains("two"), "{bad:?}");
    assert!(bad[2].contains("more"), "{bad:?}");
}
