//! The one table of incidents a replay opened (`replay`, `tune --show`).

use detector::event::Incident;
use detector::replay::format_time;

use crate::output::fmt_ns;

/// One row per incident: its headline shift, when it opened and closed, and its stage.
pub fn table(incidents: &[Incident]) -> comfy_table::Table {
    let mut t = crate::output::table([
        "service", "probes", "opened", "closed", "quantile", "baseline", "observed", "ratio",
        "p-value", "stage",
    ]);
    for i in incidents {
        let h = &i.headline;
        t.add_row([
            i.service.clone(),
            i.probes
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(" "),
            format_time(i.opened_at),
            i.closed_at.map_or("open".into(), format_time),
            format!("p{}", h.quantile * 100.0),
            fmt_ns(h.baseline.value_ns),
            fmt_ns(h.observed.value_ns),
            format!("x{:.2}", h.ratio),
            h.p_value.map_or("SLO".into(), fmt_p),
            i.stage.as_ref().map_or("-".into(), |s| s.verdict.clone()),
        ]);
    }
    t
}

/// p-values below f64's range print as a bound rather than a misleading 0.
fn fmt_p(p: f64) -> String {
    if p < f64::MIN_POSITIVE {
        "<1e-308".into()
    } else {
        format!("{p:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_p_values_print_as_a_bound() {
        assert_eq!(fmt_p(0.0), "<1e-308");
        assert_eq!(fmt_p(2.5e-7), "2.5e-7");
    }
}
