//! The operator's verdict on an incident (`tailtrap incidents mark`): stored with it, and
//! what `tailtrap tune` scores candidate settings against.

use serde::{Deserialize, Serialize};

/// What the operator says an incident was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// A real problem: detection should keep catching it.
    Real,
    /// Nothing was wrong: detection should not have opened it.
    FalseAlarm,
    /// A real shift, but expected (a deploy, a batch job): not worth a page.
    Expected,
}

impl Verdict {
    /// Name as shown and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            Verdict::Real => "real",
            Verdict::FalseAlarm => "false-alarm",
            Verdict::Expected => "expected",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Verdict {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        [Verdict::Real, Verdict::FalseAlarm, Verdict::Expected]
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!("unknown verdict {s:?} (expected real, false-alarm or expected)")
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_round_trip() {
        for v in [Verdict::Real, Verdict::FalseAlarm, Verdict::Expected] {
            assert_eq!(v.name().parse::<Verdict>().unwrap(), v);
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
        }
        assert!("false"
            .parse::<Verdict>()
            .unwrap_err()
            .contains("false-alarm"));
    }
}
