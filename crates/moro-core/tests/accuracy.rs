//! moro's predictions against independent figures: published measurements
//! (`validation/measured.jsonl`) and the fake-CUDA oracle's allocation traces
//! (`validation/oracle.jsonl`, converted by `validation/oracle_to_rows.py`).

use moro_core::validation::{CatalogModels, Report, Status, validate};

fn report(file: &str) -> Report {
    let path = format!("{}/../../validation/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    validate(&text, &CatalogModels, false)
}

fn print_summary(name: &str, r: &Report) {
    let s = &r.summary;
    eprintln!(
        "{name}: covered {}/{} ({:.0}%), median {:.1}%, p90 {:.1}%, under>5% {:.0}%, oom ok {} missed {}",
        s.covered,
        s.rows,
        s.coverage * 100.0,
        s.overall.median_abs * 100.0,
        s.overall.p90_abs * 100.0,
        s.overall.under_5pct_share * 100.0,
        s.oom_ok,
        s.oom_missed
    );
}

/// The oracle runs the real HF training step on fake tensors: moro's per-op model must
/// reproduce it almost exactly (cuBLAS workspaces, which the oracle cannot see, are the
/// main difference).
#[test]
fn oracle_traces_are_reproduced() {
    let r = report("oracle.jsonl");
    print_summary("oracle", &r);
    let s = &r.summary;
    assert!(s.covered >= 120, "covered {}", s.covered);
    assert!(
        s.overall.median_abs <= 0.01,
        "median {}",
        s.overall.median_abs
    );
    assert!(s.overall.p90_abs <= 0.03, "p90 {}", s.overall.p90_abs);
    assert!(
        s.overall.under_5pct_share <= 0.0,
        "under {}",
        s.overall.under_5pct_share
    );
}

/// Regression guard on the published measurements: the figures reached so far must not get
/// worse. (The bar is `measured_rows_meet_the_bar` below.)
#[test]
fn measured_rows_do_not_regress() {
    let r = report("measured.jsonl");
    print_summary("measured", &r);
    let s = &r.summary;
    assert!(s.coverage >= 0.80, "coverage {}", s.coverage);
    assert!(
        s.overall.median_abs <= 0.04,
        "median {}",
        s.overall.median_abs
    );
    assert!(s.overall.p90_abs <= 0.17, "p90 {}", s.overall.p90_abs);
    assert!(
        s.overall.under_5pct_share <= 0.30,
        "under {}",
        s.overall.under_5pct_share
    );
    // Every OOM row moro covers must be predicted not to fit, except the ones listed with
    // their reason in the closing note.
    assert!(s.oom_missed <= 3, "oom missed {}", s.oom_missed);
}

/// The bar of issue 2 §7: ≥ 85 % of high/medium rows covered, median |error| ≤ 6 %,
/// p90 ≤ 15 %, at most 10 % of rows under-predicted by more than 5 %.
#[test]
#[ignore = "not met yet: see the closing note of issue 2 for the figures and what is off"]
fn measured_rows_meet_the_bar() {
    let r = report("measured.jsonl");
    print_summary("measured", &r);
    let s = &r.summary;
    assert!(s.coverage >= 0.85, "coverage {}", s.coverage);
    assert!(
        s.overall.median_abs <= 0.06,
        "median {}",
        s.overall.median_abs
    );
    assert!(s.overall.p90_abs <= 0.15, "p90 {}", s.overall.p90_abs);
    assert!(
        s.overall.under_5pct_share <= 0.10,
        "under {}",
        s.overall.under_5pct_share
    );
}

/// Every row is either predicted or skipped with a reason; no row is silently dropped.
#[test]
fn every_row_is_accounted_for() {
    let r = report("measured.jsonl");
    for row in &r.rows {
        if row.status == Status::Skipped {
            assert!(
                row.reason.as_deref().is_some_and(|s| !s.is_empty()),
                "{}",
                row.id
            );
        } else {
            assert!(row.predicted_bytes.is_some(), "{}", row.id);
        }
    }
}
