//! Scoring an error model: how many measured runs each bound covers, and how far above them
//! it lies, in-sample and with each source left out of the fit that bounds it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Table, fit, fit::Point};

/// Coverage of the bound over the runs of one regime.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegimeScore {
    /// The regime in words (`one GPU`, `sharded, reserved level`, `one GPU, hf, qlora`).
    pub regime: String,
    /// Runs scored.
    pub runs: usize,
    /// Sources among them.
    pub sources: usize,
    /// Share of runs whose measurement is at or under its bound.
    pub coverage: f64,
    /// Median of bound / measured.
    pub ratio_median: f64,
}

/// In-sample and left-out-source scores side by side.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evaluation {
    /// Bounds from the table fitted on every source.
    pub in_sample: Vec<RegimeScore>,
    /// Bounds for each source from a table fitted on the others only.
    pub leave_one_source_out: Vec<RegimeScore>,
}

/// The regimes a point is scored in: all runs of its sharding, by level, by stack and method.
fn groups(p: &Point) -> Vec<String> {
    let (class, level) = (p.class, p.level);
    let gpus = if class.sharded { "sharded" } else { "one GPU" };
    vec![
        gpus.to_owned(),
        format!("{gpus}, {} level", level.as_str()),
        format!(
            "{gpus}, {}, {}",
            class.stack.as_str(),
            class.method.as_str()
        ),
    ]
}

/// Scores bounds: `bound(i)` is the bound of `points[i]` at its level.
#[allow(clippy::cast_precision_loss)]
fn score(
    points: &[Point],
    bound: impl Fn(usize) -> u64,
    groups: impl Fn(&Point) -> Vec<String>,
) -> Vec<RegimeScore> {
    let mut by: BTreeMap<String, Vec<(usize, bool, f64)>> = BTreeMap::new();
    for (i, p) in points.iter().enumerate() {
        let b = bound(i);
        let ratio = b as f64 / p.measured.max(1) as f64;
        for g in groups(p) {
            by.entry(g).or_default().push((i, p.measured <= b, ratio));
        }
    }
    by.into_iter()
        .map(|(regime, v)| {
            let mut ratios: Vec<f64> = v.iter().map(|x| x.2).collect();
            ratios.sort_by(f64::total_cmp);
            let n = ratios.len();
            let ratio_median = if n % 2 == 1 {
                ratios[n / 2]
            } else {
                f64::midpoint(ratios[n / 2 - 1], ratios[n / 2])
            };
            let sources: std::collections::BTreeSet<&str> =
                v.iter().map(|x| points[x.0].source.as_str()).collect();
            RegimeScore {
                regime,
                runs: n,
                sources: sources.len(),
                coverage: v.iter().filter(|x| x.1).count() as f64 / n as f64,
                ratio_median,
            }
        })
        .collect()
}

/// Scores `table`'s bounds on all of `points` together (`None` for no points).
#[must_use]
pub fn overall(points: &[Point], table: &Table) -> Option<RegimeScore> {
    score(
        points,
        |i| table.upper_at(points[i].level, points[i].class, points[i].levels),
        |_| vec!["all".to_owned()],
    )
    .pop()
}

/// Scores `table`'s bounds on `points`.
#[must_use]
pub fn evaluate(points: &[Point], table: &Table) -> Vec<RegimeScore> {
    score(
        points,
        |i| table.upper_at(points[i].level, points[i].class, points[i].levels),
        groups,
    )
}

/// Scores each source's runs against a table fitted without that source.
#[must_use]
pub fn leave_one_source_out(points: &[Point]) -> Vec<RegimeScore> {
    let mut tables: BTreeMap<&str, Table> = BTreeMap::new();
    for s in fit::sources(points) {
        let others: Vec<Point> = points.iter().filter(|p| p.source != s).cloned().collect();
        tables.insert(s, fit(&others));
    }
    score(
        points,
        |i| {
            let p = &points[i];
            tables[p.source.as_str()].upper_at(p.level, p.class, p.levels)
        },
        groups,
    )
}

/// Both scores.
#[must_use]
pub fn evaluation(points: &[Point], table: &Table) -> Evaluation {
    Evaluation {
        in_sample: evaluate(points, table),
        leave_one_source_out: leave_one_source_out(points),
    }
}
