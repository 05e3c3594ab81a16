//! The statistics behind a "hot" window: an exact one-sided binomial test and Holm's
//! step-down correction for the many tests of one interval.

use statrs::distribution::{Binomial, Discrete, DiscreteCDF};

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

/// Whether P(X >= x) for X ~ Binomial(n, p) is certainly above `level`: the first terms
/// of that tail (one pmf, then each term from the last by the pmf's ratio) already sum past
/// it with a 5% margin, far beyond the rounding of this sum or of [`binomial_upper_tail`].
/// `false` means "not shown", not "below". A few products instead of the incomplete beta
/// function: most tests of a quiet service end here.
pub(crate) fn upper_tail_exceeds(n: u64, p: f64, x: u64, level: f64) -> bool {
    /// Terms summed at most: near the mean one term is already a few percent.
    const TERMS: u64 = 16;
    let target = level * 1.05;
    if x == 0 {
        return 1.0 > target;
    }
    if x > n || !(p > 0.0 && p < 1.0) {
        return false;
    }
    let Ok(b) = Binomial::new(p, n) else {
        return false;
    };
    let odds = p / (1.0 - p);
    let mut term = b.pmf(x);
    let mut sum = term;
    let mut k = x;
    while sum <= target && k < n && k - x < TERMS && term > 0.0 {
        term *= (n - k) as f64 / (k + 1) as f64 * odds;
        k += 1;
        sum += term;
    }
    sum.is_finite() && sum > target
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
    significant.clear();
    significant.resize(m, false);
    // The smallest p-value is compared first, with alpha / m: when none passes that, none
    // is significant and the sort can be skipped (the usual quiet interval).
    let first_bar = alpha / m as f64;
    if !p_values.iter().any(|&p| p <= first_bar) {
        return;
    }
    order.clear();
    order.extend(0..m);
    order.sort_by(|&a, &b| p_values[a].total_cmp(&p_values[b]));
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
    fn the_cheap_bound_only_claims_what_the_exact_tail_confirms() {
        let mut shown = 0;
        for n in [1u64, 2, 5, 10, 30, 100, 500, 2_000, 10_000, 60_000] {
            for p in [1e-4, 1e-3, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9] {
                let mean = n as f64 * p;
                let sd = (mean * (1.0 - p)).sqrt().max(1.0);
                for dev in [-2.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0] {
                    let x = (mean + dev * sd).round().clamp(0.0, n as f64 + 1.0) as u64;
                    let exact = binomial_upper_tail(n, p, x);
                    for level in [1e-4, 0.01, 0.05] {
                        if upper_tail_exceeds(n, p, x, level) {
                            shown += 1;
                            assert!(exact > level, "n={n} p={p} x={x} level={level}: {exact}");
                        }
                    }
                }
            }
        }
        assert!(
            shown > 500,
            "the bound decides most cases near the mean: {shown}"
        );
        // A window of 10 000 with 1% expected above the baseline's p99 bucket: 105 is no
        // evidence, and the bound says so without the exact tail.
        assert!(upper_tail_exceeds(10_000, 0.01, 105, 0.01));
        assert!(!upper_tail_exceeds(10_000, 0.01, 140, 0.01));
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
