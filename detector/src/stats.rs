//! The statistics behind a "hot" window: an exact one-sided binomial test and Holm's
//! step-down correction for the many tests of one interval.

use statrs::distribution::{Binomial, DiscreteCDF};

/// P(X >= x) for X ~ Binomial(n, p): how surprising `x` exceedances among `n` samples are
/// when each exceeds with probability `p`. One-sided because only growth is an anomaly.
pub(crate) fn binomial_upper_tail(n: u64, p: f64, x: u64) -> f64 {
    if x == 0 {
        return 1.0;
    }
    if x > n {
        return 0.0;
    }
    match Binomial::new(p.clamp(0.0, 1.0), n) {
        // sf(k) is P(X > k), so P(X >= x) is sf(x - 1).
        Ok(b) => b.sf(x - 1),
        Err(_) => 1.0,
    }
}

/// Holm's step-down procedure: which of `p_values` are significant while keeping the
/// family-wise error rate at `alpha`. Uniformly more powerful than Bonferroni, same guarantee.
pub(crate) fn holm(p_values: &[f64], alpha: f64) -> Vec<bool> {
    let mut significant = Vec::new();
    holm_into(p_values, alpha, &mut Vec::new(), &mut significant);
    significant
}

/// [`holm`] into `significant`, with `order` as scratch: a replay calls it every interval
/// and reuses both buffers.
pub(crate) fn holm_into(
    p_values: &[f64],
    alpha: f64,
    order: &mut Vec<usize>,
    significant: &mut Vec<bool>,
) {
    let m = p_values.len();
    order.clear();
    order.extend(0..m);
    order.sort_by(|&a, &b| p_values[a].total_cmp(&p_values[b]));
    significant.clear();
    significant.resize(m, false);
    for (rank, &i) in order.iter().enumerate() {
        if p_values[i] <= alpha / (m - rank) as f64 {
            significant[i] = true;
        } else {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct sum of the binomial pmf, for small n.
    fn tail_by_sum(n: u64, p: f64, x: u64) -> f64 {
        let mut total = 0.0;
        for k in x..=n {
            let mut c = 1.0;
            for j in 0..k {
                c *= (n - j) as f64 / (j + 1) as f64;
            }
            total += c * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32);
        }
        total
    }

    #[test]
    fn upper_tail_matches_the_pmf_sum() {
        for &(n, p, x) in &[
            (20u64, 0.01, 1u64),
            (20, 0.01, 3),
            (50, 0.1, 12),
            (30, 0.5, 15),
        ] {
            let a = binomial_upper_tail(n, p, x);
            let b = tail_by_sum(n, p, x);
            assert!(
                (a - b).abs() < 1e-9 * b.max(1e-12),
                "n={n} p={p} x={x}: {a} vs {b}"
            );
        }
        assert_eq!(binomial_upper_tail(10, 0.3, 0), 1.0);
        assert_eq!(binomial_upper_tail(10, 0.3, 11), 0.0);
        // 1% of 10 000 exceeding is exactly what is expected: no evidence at all
        assert!(binomial_upper_tail(10_000, 0.01, 100) > 0.4);
        // 3% instead of 1% is overwhelming evidence
        assert!(binomial_upper_tail(10_000, 0.01, 300) < 1e-40);
    }

    #[test]
    fn holm_steps_down() {
        // alpha 0.05 over 4 tests: thresholds 0.0125, 0.0167, 0.025, 0.05
        let sig = holm(&[0.01, 0.04, 0.015, 0.5], 0.05);
        assert_eq!(sig, vec![true, false, true, false]);
        // Bonferroni would reject only the first; Holm continues while each passes
        let sig = holm(&[0.012, 0.016, 0.024, 0.049], 0.05);
        assert_eq!(sig, vec![true, true, true, true]);
        assert!(holm(&[], 0.05).is_empty());
    }
}
