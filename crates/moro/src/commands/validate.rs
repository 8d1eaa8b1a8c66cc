//! `moro validate FILE.jsonl`: predictions against measured runs.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::validation::{self, CatalogModels, Stats, Status};

use crate::error::user;
use crate::output::{Table, json, stdout};

/// Arguments of `moro validate`.
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Measured rows, one JSON object per line (validation/README.md has the schema); several
    /// files are validated as one set (the bound's left-out-source figures pool their
    /// sources).
    #[arg(required = true)]
    pub(crate) files: Vec<std::path::PathBuf>,
    /// Print `{"rows": [...], "summary": {...}}`.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also compare rows marked `confidence: low`.
    #[arg(long)]
    pub(crate) include_low: bool,
    /// Show how one row was predicted: the job it was read as and the full breakdown.
    #[arg(long, value_name = "ID")]
    pub(crate) explain: Option<String>,
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

fn stats_line(name: &str, s: &Stats) -> Vec<String> {
    vec![
        name.to_owned(),
        s.n.to_string(),
        format!("{:.1}%", s.median_abs * 100.0),
        format!("{:.1}%", s.mean_abs * 100.0),
        format!("{:.1}%", s.p90_abs * 100.0),
        format!("{:.0}%", s.under_5pct_share * 100.0),
    ]
}

pub(crate) fn run(args: &ValidateArgs) -> Result<ExitCode> {
    let mut text = String::new();
    for file in &args.files {
        let t = std::fs::read_to_string(file)
            .map_err(|e| user(format!("cannot read `{}`: {e}", file.display())))?;
        text.push_str(&t);
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(id) = &args.explain {
        return explain(&text, id, args.json);
    }
    let report = validation::validate(&text, &CatalogModels, args.include_low);
    if args.json {
        stdout(&json(&report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(
        &[
            "id",
            "method",
            "level",
            "predicted GiB",
            "measured GiB",
            "error",
            "at most GiB",
            "naive",
            "status",
        ],
        &[false, false, false, true, true, true, true, true, false],
    );
    let g = |b: Option<u64>| b.map_or_else(|| "-".to_owned(), crate::output::gib);
    for r in &report.rows {
        if r.status == Status::Skipped {
            continue;
        }
        t.row(vec![
            r.id.clone(),
            r.method.unwrap_or("-").to_owned(),
            r.metric.map_or("-".to_owned(), |m| m.as_str().to_owned()),
            g(r.predicted_bytes),
            g(r.measured_bytes),
            r.error.map_or_else(|| "-".into(), pct),
            g(r.predicted_upper_bytes),
            r.naive_error.map_or_else(|| "-".into(), pct),
            format!("{:?}", r.status).to_ascii_lowercase(),
        ]);
    }
    let mut out = t.render();
    out.push_str("\nskipped:\n");
    for r in report.rows.iter().filter(|r| r.status == Status::Skipped) {
        out.push_str(&format!(
            "  {}: {}\n",
            r.id,
            r.reason.as_deref().unwrap_or("")
        ));
    }
    let s = &report.summary;
    out.push_str(&format!(
        "\ncovered {} of {} rows ({:.0}%), OOM rows right {} / missed {}\n\n",
        s.covered,
        s.rows,
        s.coverage * 100.0,
        s.oom_ok,
        s.oom_missed
    ));
    let mut st = Table::new(
        &[
            "group",
            "rows",
            "median |err|",
            "mean |err|",
            "p90 |err|",
            "under >5%",
        ],
        &[false, true, true, true, true, true],
    );
    st.row(stats_line("moro (all)", &s.overall));
    st.row(stats_line("naive formula", &s.naive));
    for (k, v) in &s.by_method {
        st.row(stats_line(&format!("method {k}"), v));
    }
    for (k, v) in &s.by_stack {
        st.row(stats_line(&format!("stack {k}"), v));
    }
    for (k, v) in &s.by_source {
        st.row(stats_line(&format!("source {k}"), v));
    }
    out.push_str(&st.render());
    out.push_str(&format!(
        "\nupper bound (95 %): covers {:.1} % of compared rows, median bound / measured {:.3}\n",
        s.upper_coverage * 100.0,
        s.upper_ratio_median
    ));
    out.push_str(&bound_table(&s.upper_by_regime).render());
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// The bound's coverage by regime, with the shipped table and with each source left out.
fn bound_table(e: &moro_core::bound::Evaluation) -> Table {
    let mut t = Table::new(
        &[
            "regime",
            "rows",
            "sources",
            "covered",
            "bound/measured",
            "covered, source left out",
            "bound/measured, left out",
        ],
        &[false, true, true, true, true, true, true],
    );
    for (a, b) in e.in_sample.iter().zip(&e.leave_one_source_out) {
        t.row(vec![
            a.regime.clone(),
            a.runs.to_string(),
            a.sources.to_string(),
            format!("{:.1}%", a.coverage * 100.0),
            format!("{:.3}", a.ratio_median),
            format!("{:.1}%", b.coverage * 100.0),
            format!("{:.3}", b.ratio_median),
        ]);
    }
    t
}

fn explain(text: &str, id: &str, as_json: bool) -> Result<ExitCode> {
    let x = validation::explain(text, &CatalogModels, id)
        .map_err(|e| user(format!("row `{id}`: {e}")))?;
    let predicted = x.row.metric.of(&x.estimate);
    #[allow(clippy::cast_precision_loss)]
    let error = (!x.row.oom).then(|| {
        (predicted as f64 - x.row.measured_bytes as f64) / x.row.measured_bytes.max(1) as f64
    });
    if as_json {
        let doc = serde_json::json!({
            "row": x.row,
            "predicted_bytes": predicted,
            "error": error,
            "estimate": x.estimate,
        });
        stdout(&json(&doc)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let model = crate::resolve::Resolved {
        id: x.row.model_id.clone(),
        source: if x.row.model_overrides.is_some() {
            "the catalog, with the row's model_overrides".into()
        } else {
            "the catalog".into()
        },
        spec: x.model,
        stored: None,
    };
    let mut out =
        crate::commands::estimate::render(&model, &x.job, &x.estimate, None, &x.profile, None);
    let level = x.row.metric.as_str();
    match error {
        Some(e) => out.push_str(&format!(
            "\nrow     measured {} GiB at the {level} level; predicted {} GiB ({})\n",
            crate::output::gib(x.row.measured_bytes),
            crate::output::gib(predicted),
            pct(e)
        )),
        None => out.push_str(&format!(
            "\nrow     ran out of memory on a {} GiB GPU; predicted device total {} GiB\n",
            x.row
                .gpu_memory_bytes
                .map_or_else(|| "?".into(), crate::output::gib),
            crate::output::gib(x.estimate.peak_device_bytes)
        )),
    }
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}
