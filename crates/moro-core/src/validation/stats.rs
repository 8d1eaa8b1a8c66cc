//! Summary statistics of relative errors.

use serde::Serialize;

/// Summary statistics of signed relative errors.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Rows compared.
    pub n: usize,
    /// Median of |error|.
    pub median_abs: f64,
    /// Mean of |error|.
    pub mean_abs: f64,
    /// 90th percentile of |error|.
    pub p90_abs: f64,
    /// Share of rows under-predicted by more than 5 %.
    pub under_5pct_share: f64,
}

/// Statistics of signed relative errors (`(predicted - measured) / measured`).
#[must_use]
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
pub fn stats(errors: &[f64]) -> Stats {
    if errors.is_empty() {
        return Stats::default();
    }
    let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let n = abs.len();
    let pct = |p: f64| {
        // nearest-rank percentile
        let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
        abs[rank - 1]
    };
    let median = if n % 2 == 1 {
        abs[n / 2]
    } else {
        (abs[n / 2 - 1] + abs[n / 2]) / 2.0
    };
    Stats {
        n,
        median_abs: median,
        mean_abs: abs.iter().sum::<f64>() / n as f64,
        p90_abs: pct(0.9),
        under_5pct_share: errors.iter().filter(|e| **e < -0.05).count() as f64 / n as f64,
    }
}
