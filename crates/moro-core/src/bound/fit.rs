//! Fitting the error model: a per-source offset plus the spread within sources, robust to
//! the odd source, with a small-sample widening (`docs/error-model.md`).

use std::collections::{BTreeMap, BTreeSet};

use super::{COVERAGE, Cell, JobClass, MIN_SOURCES, Table};
use crate::job::{Method, Stack};
use crate::validation::Metric;

/// One measured run against moro's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The source (script and setup) the run came from: runs of one source share errors.
    pub source: String,
    /// The job's regime.
    pub class: JobClass,
    /// Level measured.
    pub level: Metric,
    /// Measured bytes.
    pub measured: u64,
    /// Predicted bytes at that level.
    pub predicted: u64,
    /// Predicted bytes at every level: allocated, reserved, device (what a level's bound,
    /// never under a lower level's, is computed from: [`Table::upper_levels`]).
    pub levels: [u64; 3],
}

impl Point {
    /// `ln(measured / predicted)`: above 0 when moro is under.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn log_ratio(&self) -> f64 {
        (self.measured.max(1) as f64 / self.predicted.max(1) as f64).ln()
    }
}

/// Robust spreads this many scale units from the median are pulled in to it before the mean
/// and spreads are taken (winsorizing; Huber's constant is 1.345, 2 keeps more of the tail).
pub const WINSOR: f64 = 2.0;

/// Scale floor of the winsorizing, in log units: runs of one source that agree to the byte
/// (one script, fake tensors) are not a zero spread.
const MIN_SCALE: f64 = 0.005;

/// Which of (level, stack, method) a cell pins, in the order [`Table::cell`] falls back
/// through: the job's own regime; its stack at its level; its level on every stack;
/// everything of its sharding. (Falling back to the stack at every level before the level on
/// every stack covered fewer left-out runs: 93 % at the device level, 91 % reserved.)
pub const FALLBACK: [(bool, bool, bool); 4] = [
    (true, true, true),
    (true, true, false),
    (true, false, false),
    (false, false, false),
];

/// The cells a point of `class` at `level` belongs to ([`FALLBACK`]).
fn keys(class: JobClass, level: Metric) -> [CellKey; 4] {
    FALLBACK.map(|(l, s, m)| {
        (
            l.then_some(level),
            class.sharded,
            s.then_some(class.stack),
            m.then_some(class.method),
        )
    })
}

type CellKey = (Option<Metric>, bool, Option<Stack>, Option<Method>);

/// Fits a table on `points`: every cell with points from at least [`MIN_SOURCES`] sources.
///
/// In a cell, each source's offset is the median of its runs' `ln(measured / predicted)`;
/// the offsets, and the runs' deviations from their source's offset, are winsorized at
/// [`WINSOR`] robust units (1.4826 × the median absolute deviation); then with `S` sources,
/// mean offset `μ`, between-source spread `τ` (sample standard deviation) and within-source
/// spread `σ` (root mean square), the bound for a run of a new source is
/// `μ + t(0.95, S − 1) · √(τ² (1 + 1/S) + σ²)`: a one-sided prediction interval for a new
/// source's run, with Student's t for the few sources a cell has.
#[must_use]
pub fn fit(points: &[Point]) -> Table {
    let mut groups: BTreeMap<CellKey, BTreeMap<&str, Vec<f64>>> = BTreeMap::new();
    for p in points {
        for k in keys(p.class, p.level) {
            groups
                .entry(k)
                .or_default()
                .entry(p.source.as_str())
                .or_default()
                .push(p.log_ratio());
        }
    }
    let mut cells: Vec<Cell> = groups
        .into_iter()
        .filter(|(_, by_source)| by_source.len() >= MIN_SOURCES)
        .map(|((level, sharded, stack, method), by_source)| {
            cell(level, sharded, stack, method, &by_source)
        })
        .collect();
    cells.sort_by_key(|c| {
        (
            std::cmp::Reverse(
                c.level.is_some() as u8 + c.stack.is_some() as u8 + c.method.is_some() as u8,
            ),
            c.sharded,
            c.level,
            c.stack,
            c.method,
        )
    });
    Table {
        coverage: COVERAGE,
        cells,
    }
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
fn cell(
    level: Option<Metric>,
    sharded: bool,
    stack: Option<Stack>,
    method: Option<Method>,
    by_source: &BTreeMap<&str, Vec<f64>>,
) -> Cell {
    let offsets: Vec<f64> = by_source.values().map(|v| median(v)).collect();
    let deviations: Vec<f64> = by_source
        .values()
        .flat_map(|v| {
            let m = median(v);
            v.iter().map(move |x| x - m)
        })
        .collect();
    let offsets = winsorize(&offsets);
    let deviations = winsorize(&deviations);
    let s = offsets.len() as f64;
    let mu = offsets.iter().sum::<f64>() / s;
    let tau = (offsets.iter().map(|o| (o - mu).powi(2)).sum::<f64>() / (s - 1.0)).sqrt();
    let sigma = (deviations.iter().map(|d| d * d).sum::<f64>() / deviations.len() as f64).sqrt();
    let q = mu + t95(offsets.len() - 1) * (tau * tau * (1.0 + 1.0 / s) + sigma * sigma).sqrt();
    let upper = ((q.exp() - 1.0) * 1000.0).ceil().max(0.0) as u64;
    let e4 = |x: f64| (x * 1e4).round();
    let runs = by_source.values().map(Vec::len).sum();
    Cell {
        level,
        sharded,
        stack,
        method,
        sources: offsets.len(),
        runs,
        offset_e4: e4(mu) as i64,
        between_e4: e4(tau) as u64,
        within_e4: e4(sigma) as u64,
        upper_permille: upper,
    }
}

/// The median (mean of the middle two for an even count); 0 for none.
fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        f64::midpoint(s[n / 2 - 1], s[n / 2])
    }
}

/// `v` with values beyond [`WINSOR`] robust units of its median pulled in to that distance.
fn winsorize(v: &[f64]) -> Vec<f64> {
    let m = median(v);
    let mad: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    let scale = (1.4826 * median(&mad)).max(MIN_SCALE);
    let (lo, hi) = (m - WINSOR * scale, m + WINSOR * scale);
    v.iter().map(|x| x.clamp(lo, hi)).collect()
}

/// One-sided 95 % quantile of Student's t with `df` degrees of freedom (standard tables).
fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771,
        1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706,
        1.703, 1.701, 1.699, 1.697,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        31..=60 => 1.684,
        61..=120 => 1.671,
        _ => 1.645,
    }
}

/// The sources of `points`, in order.
#[must_use]
pub fn sources(points: &[Point]) -> BTreeSet<&str> {
    points.iter().map(|p| p.source.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(source: &str, measured: u64) -> Point {
        Point {
            source: source.into(),
            class: JobClass {
                stack: Stack::Hf,
                method: Method::Adapters,
                sharded: false,
            },
            level: Metric::Allocated,
            measured,
            predicted: 1000,
            levels: [1000; 3],
        }
    }

    /// Three sources of one run each, 0 %, +10 % and −10 % off, by hand: offsets
    /// ln(1), ln(1.1), ln(0.9) → μ = −0.00335, τ = 0.10038 (no winsorizing: MAD scale
    /// 0.141), σ = 0; q = μ + 2.920 · τ · √(4/3) = 0.3351 → bound +39.81 %, 399 ‰.
    #[test]
    fn three_sources_by_hand() {
        let t = fit(&[point("a", 1000), point("b", 1100), point("c", 900)]);
        let c = &t.cells[0];
        assert_eq!((c.sources, c.runs), (3, 3));
        assert_eq!(c.offset_e4, -34);
        assert_eq!(c.between_e4, 1004);
        assert_eq!(c.within_e4, 0);
        assert_eq!(c.upper_permille, 399);
    }

    /// Fewer than three sources make no cell; a source with many runs counts once.
    #[test]
    fn sources_are_the_unit() {
        let many: Vec<Point> = (0..50)
            .map(|_| point("a", 1000))
            .chain([point("b", 1000)])
            .collect();
        assert!(fit(&many).cells.is_empty());
    }

    #[test]
    fn winsorizing_pulls_in_the_outlier() {
        let w = winsorize(&[0.0, 0.01, -0.01, 0.02, 2.0]);
        assert!(w[4] < 0.1, "{w:?}");
    }
}
