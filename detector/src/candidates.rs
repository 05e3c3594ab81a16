//! Candidate settings for replaying a service's history (`tailtrap tune --set/--sweep`):
//! `KEY=VALUE` words read as TOML where they are TOML, a grid of them, each checked as the
//! configuration would check it, with one line naming the word that is wrong.

use model::config::Validate;

use crate::{DetectorConfig, Thresholds};

/// Most candidates one run replays (the product of the `--sweep` lists, times one): each
/// may cost up to a full replay of the history when its settings share nothing.
pub const MAX_CANDIDATES: usize = 64;

/// A candidate setting that cannot be used, in one line naming the word given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CandidateError(pub String);

macro_rules! fail {
    ($($arg:tt)*) => {
        return Err(CandidateError(format!($($arg)*)))
    };
}

/// One setting tried: the service's override table, and the thresholds it gives.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// What differs from the settings in force, as given (`min_ratio=2`); empty for 0.
    pub changes: Vec<(String, toml::Value)>,
    /// The service's whole override table for this candidate (what `--emit` prints).
    pub overrides: toml::Table,
    /// Thresholds in force for the service with this candidate.
    pub thresholds: Thresholds,
}

/// A `KEY=VALUE` word: the value read as TOML when it is TOML (`2`, `[0.99]`, `"5s"`),
/// else as a string (`5s`).
fn parse_assignment(word: &str, flag: &str) -> Result<(String, Vec<toml::Value>), CandidateError> {
    let Some((key, value)) = word.split_once('=') else {
        fail!("{flag} {word:?}: expected KEY=VALUE");
    };
    let key = key.trim();
    if key.is_empty() {
        fail!("{flag} {word:?}: the key is empty");
    }
    let values = if flag == "--sweep" {
        split_values(value)
            .into_iter()
            .map(toml_value)
            .collect::<Vec<_>>()
    } else {
        vec![toml_value(value)]
    };
    if values.is_empty() {
        fail!("{flag} {word:?}: no value");
    }
    Ok((key.to_string(), values))
}

/// `1.5,2,[0.99,0.999],3`: commas split values except inside brackets.
fn split_values(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.retain(|v| !v.is_empty());
    out
}

fn toml_value(s: &str) -> toml::Value {
    format!("v = {s}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(s.to_string()))
}

/// Candidate 0 (the settings in force) and one candidate per point of the `--sweep` grid
/// (each with the `--set` keys); with `--set` only, one candidate.
pub fn candidates(
    config: &DetectorConfig,
    service: &str,
    set: &[String],
    sweep: &[String],
) -> Result<Vec<Candidate>, CandidateError> {
    let in_force = config.services.get(service).cloned().unwrap_or_default();
    let mut base = in_force.clone();
    let mut base_changes = Vec::new();
    for word in set {
        let (key, mut values) = parse_assignment(word, "--set")?;
        let v = values.remove(0);
        base.insert(key.clone(), v.clone());
        base_changes.push((key, v));
    }
    let mut axes: Vec<(String, Vec<toml::Value>)> = Vec::new();
    for word in sweep {
        let (key, values) = parse_assignment(word, "--sweep")?;
        if axes.iter().any(|(k, _)| *k == key) {
            fail!("--sweep {key} is given twice: put all its values in one list");
        }
        axes.push((key, values));
    }
    let grid: usize = axes
        .iter()
        .try_fold(1usize, |n, (_, v)| n.checked_mul(v.len()))
        .unwrap_or(usize::MAX);
    if grid > MAX_CANDIDATES {
        fail!(
            "the sweep grid has {grid} candidates; at most {MAX_CANDIDATES} are replayed in one run (narrow a --sweep list or split the run)"
        );
    }
    let build = |overrides: toml::Table, changes: Vec<(String, toml::Value)>| {
        let thresholds = config.defaults.with_overrides(&overrides).map_err(|p| {
            let word = changes
                .iter()
                .find(|(k, _)| p.key == *k || p.key.starts_with(&format!("{k}[")))
                .map(|(k, v)| format!("{k}={v}"));
            CandidateError(match word {
                Some(w) => format!("{w}: {}", p.reason),
                None if p.key.is_empty() => p.reason.to_string(),
                None => p.to_string(),
            })
        })?;
        if let Some(p) = thresholds.validate().into_iter().next() {
            fail!("{}", p.reason);
        }
        Ok(Candidate {
            changes,
            overrides,
            thresholds,
        })
    };
    let mut out = vec![Candidate {
        changes: Vec::new(),
        overrides: in_force,
        thresholds: config.thresholds(service),
    }];
    if set.is_empty() && sweep.is_empty() {
        return Ok(out);
    }
    for i in 0..grid {
        let mut overrides = base.clone();
        let mut changes = base_changes.clone();
        let mut rest = i;
        for (key, values) in &axes {
            let v = &values[rest % values.len()];
            rest /= values.len();
            overrides.insert(key.clone(), v.clone());
            changes.push((key.clone(), v.clone()));
        }
        out.push(build(overrides, changes)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bad_settings_are_refused_with_one_line_naming_the_word() {
        let c = DetectorConfig::default();
        let err = |set: &[&str], sweep: &[&str]| {
            let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
            let sweep: Vec<String> = sweep.iter().map(|s| s.to_string()).collect();
            candidates(&c, "web", &set, &sweep).unwrap_err().to_string()
        };
        assert!(err(&["min_ration=2"], &[]).contains("min_ration"));
        assert!(err(&["min_ratio=0.5"], &[]).starts_with("min_ratio=0.5: "));
        assert!(err(&["open_after=9"], &[]).contains("open_window"));
        assert!(err(&["min_ratio"], &[]).contains("KEY=VALUE"));
        assert!(err(&["=2"], &[]).contains("the key is empty"));
        assert!(err(&[], &["min_ratio=2", "min_ratio=3"]).contains("given twice"));
        let big = err(
            &[],
            &["min_ratio=1,2,3,4,5,6,7,8,9", "open_after=1,2,3,4,5,6,7,8"],
        );
        assert!(big.contains("72 candidates") && big.contains("64"), "{big}");
    }

    #[test]
    fn a_grid_of_list_values_and_set_keys_gives_one_candidate_per_point() {
        let c = DetectorConfig::default();
        let cands = candidates(
            &c,
            "web",
            &["window=10s".into()],
            &["quantiles=[0.99],[0.5,0.999]".into()],
        )
        .unwrap();
        assert_eq!(cands.len(), 3);
        assert!(
            cands[0].changes.is_empty(),
            "candidate 0 is the settings in force"
        );
        assert_eq!(cands[2].thresholds.quantiles, vec![0.5, 0.999]);
        assert_eq!(cands[1].thresholds.window, Duration::from_secs(10));
        assert_eq!(cands[1].overrides["window"].as_str(), Some("10s"));
        assert_eq!(
            split_values("1.5, 2,[0.99,0.999] ,"),
            ["1.5", "2", "[0.99,0.999]"]
        );
        assert_eq!(toml_value("5s"), toml::Value::String("5s".into()));
        assert_eq!(toml_value("2"), toml::Value::Integer(2));
    }
}
