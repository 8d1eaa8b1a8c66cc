//! The error model moro ships (`data/error_model.json`) against the measured sets it is
//! fitted on: it must be what fitting them gives today (refit with `MORO_BLESS=1`), and its
//! bounds must cover the runs of each source when that source is left out of the fit.

use moro_core::bound::{self, Point, RegimeScore, Table};
use moro_core::validation::{CatalogModels, points, validate};

/// The measured sets: published runs, the H200 calibration runs, the fake-CUDA traces.
const SETS: [&str; 4] = [
    "measured.jsonl",
    "h200/measured.jsonl",
    "h200/settings.jsonl",
    "oracle.jsonl",
];

fn all_points() -> Vec<Point> {
    SETS.iter()
        .flat_map(|file| {
            let path = format!("{}/../../validation/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            points(&validate(&text, &CatalogModels, false).rows)
        })
        .collect()
}

fn print(title: &str, scores: &[RegimeScore]) {
    eprintln!("{title}");
    for s in scores {
        eprintln!(
            "  {:<32} {:>4} runs {:>3} sources  coverage {:>5.1} %  bound/measured {:.4}",
            s.regime,
            s.runs,
            s.sources,
            s.coverage * 100.0,
            s.ratio_median
        );
    }
}

#[test]
fn shipped_table_is_the_fit_of_the_measured_sets() {
    let fitted = bound::fit(&all_points());
    let path = format!("{}/data/error_model.json", env!("CARGO_MANIFEST_DIR"));
    let text = serde_json::to_string_pretty(&fitted).unwrap() + "\n";
    if std::env::var_os("MORO_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let shipped: Table = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        shipped == fitted,
        "data/error_model.json is stale: the estimator or validation/ changed. Refit with \
         `MORO_BLESS=1 cargo test -p moro-core --test error_model` and review the diff.\n{text}"
    );
    assert_eq!(Table::builtin(), &shipped);
}

/// Leave one source out: each source's runs are bounded by a table fitted on the others.
/// Every regime with at least three sources (a stack and method, a level, or all of one
/// GPU or of several) is covered on 95 % of its runs or more; the median bound is at most
/// 10 % above the measurement on one GPU, 20 % on several.
#[test]
fn bounds_hold_for_sources_left_out() {
    let pts = all_points();
    let shipped = bound::evaluate(&pts, Table::builtin());
    let loso = bound::leave_one_source_out(&pts);
    print("in-sample", &shipped);
    print("leave one source out", &loso);
    for s in loso.iter().filter(|s| s.sources >= 3) {
        assert!(s.coverage >= 0.95, "{}: {:.3}", s.regime, s.coverage);
    }
    let one_gpu = loso.iter().find(|s| s.regime == "one GPU").unwrap();
    assert!(one_gpu.ratio_median <= 1.10, "{}", one_gpu.ratio_median);
    let sharded = loso.iter().find(|s| s.regime == "sharded").unwrap();
    assert!(sharded.ratio_median <= 1.20, "{}", sharded.ratio_median);
}

/// Every job gets a band, and a regime with no measured runs says so instead of a narrow
/// guess.
#[test]
fn regimes_without_runs_are_named() {
    use moro_core::bound::JobClass;
    use moro_core::job::Method;
    use moro_core::job::Stack;
    use moro_core::validation::Metric;
    let empty = Table {
        coverage: 0.95,
        cells: vec![],
    };
    let class = JobClass {
        stack: Stack::Torchtune,
        method: Method::QuantizedAdapters,
        sharded: true,
    };
    let band = empty.band(Metric::Reserved, class);
    assert!(band.regime.contains("no measured runs"), "{}", band.regime);
    assert_eq!(band.upper_permille, bound::DEFAULT_UPPER_PERMILLE[1]);
    let shipped = Table::builtin().band(Metric::Device, class);
    assert!(shipped.sources >= 3, "{shipped:?}");
}
