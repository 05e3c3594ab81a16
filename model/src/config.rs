//! What the crates that own a configuration table report about it: problems named by key.
//!
//! Each table of tailtrap's config file is deserialized by the crate that owns it, which
//! then checks the rules spanning several keys in [`Validate::validate`]. Both report a
//! [`KeyProblem`]; the agent alone turns keys into file lines.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, MapAccess};
use serde::{Deserialize, Deserializer};

/// One thing wrong with a configuration table: the dotted key it is at (relative to the
/// value that was checked, e.g. `history[2]` or `services.web.min_ratio`; empty for the
/// value itself) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key `{key}`: {reason}")]
pub struct KeyProblem {
    /// Dotted key path, TOML-quoted where a segment needs it; `[i]` for array elements.
    pub key: String,
    /// What is wrong, for a person.
    pub reason: String,
}

impl KeyProblem {
    /// A problem at `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        KeyProblem {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The same problem seen from the table enclosing the checked value: `prefix.key`.
    #[must_use]
    pub fn under(mut self, prefix: &str) -> Self {
        self.key = join(prefix, &self.key);
        self
    }
}

/// Join a key path and a relative one; array indices (`[2]`) attach without a dot.
pub fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else if key.is_empty() {
        prefix.to_owned()
    } else if key.starts_with('[') {
        format!("{prefix}{key}")
    } else {
        format!("{prefix}.{key}")
    }
}

/// Problems on one line, `; ` between them (for a log line or an error's message).
pub fn joined(problems: &[KeyProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// `name` as one segment of a dotted key: bare when TOML allows it, quoted otherwise.
pub fn key_segment(name: &str) -> Cow<'_, str> {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(format!("{name:?}"))
    }
}

/// The checks of a configuration table that go beyond one value (single values are best
/// checked while deserializing, so the problem names the value's own key).
pub trait Validate {
    /// Every problem found, keyed relative to the table; empty when the table is fine.
    fn validate(&self) -> Vec<KeyProblem> {
        Vec::new()
    }
}

/// Deserialize `T` from `d`; a failure becomes a problem at the key where it happened.
pub fn deserialize<'de, T, D>(d: D) -> Result<T, KeyProblem>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    serde_path_to_error::deserialize(d).map_err(|e| {
        let key = path_key(e.path());
        // The first line only: deserializers add where the error was (`in `key``, a
        // position), which the key says already.
        let reason = e.into_inner().to_string();
        let reason = reason.lines().next().unwrap_or_default().trim().to_owned();
        KeyProblem::new(key, reason)
    })
}

/// For a hand-written map visitor that has read a key and found it wrong: fail with `err`
/// while reading that key's value, so the error's path names the key.
pub fn fail_at_value<'de, A: MapAccess<'de>, T>(
    map: &mut A,
    err: impl std::fmt::Display,
) -> Result<T, A::Error> {
    map.next_value_seed(Fail(err.to_string(), std::marker::PhantomData))
}

struct Fail<T>(String, std::marker::PhantomData<T>);

impl<'de, T> DeserializeSeed<'de> for Fail<T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, _: D) -> Result<T, D::Error> {
        Err(serde::de::Error::custom(self.0))
    }
}

fn path_key(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    path.iter()
        .fold(String::new(), |key, segment| match segment {
            Segment::Seq { index } => format!("{key}[{index}]"),
            Segment::Map { key: k } => join(&key, &key_segment(k)),
            Segment::Enum { variant } => join(&key, &key_segment(variant)),
            Segment::Unknown => join(&key, "?"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        a: Vec<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        b: u8,
    }

    #[test]
    fn problems_name_the_key_path() {
        let v = serde_json::json!({ "a": [{ "b": 1 }, { "b": 300 }] });
        let p = deserialize::<T, _>(v).unwrap_err();
        assert_eq!(p.key, "a[1].b");
        assert!(p.reason.contains("300"), "{p}");
        let reason = p.reason.clone();
        assert_eq!(
            p.under("t").to_string(),
            format!("key `t.a[1].b`: {reason}")
        );
        let p = deserialize::<Vec<Inner>, _>(serde_json::json!([{ "c": 1 }])).unwrap_err();
        assert_eq!(p.under("s").key, "s[0].c");
    }

    #[test]
    fn segments_are_quoted_when_needed() {
        assert_eq!(key_segment("web-1_a"), "web-1_a");
        assert_eq!(key_segment("my svc"), "\"my svc\"");
        assert_eq!(key_segment(""), "\"\"");
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("x", ""), "x");
    }
}
