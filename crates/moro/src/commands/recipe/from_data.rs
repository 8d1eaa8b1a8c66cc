//! `max_seq_length` sized from a dataset (`recipe generate --dataset`).

use anyhow::Result;

use super::GenerateArgs;
use crate::output::note;
use crate::resolve;

/// `max_seq_length` from a dataset: its lengths and the percentile chosen.
pub(super) struct SizedFromData {
    pub(super) section: moro_recipe::DataSection,
    pub(super) chosen: u64,
    /// The model's context, when the percentile's length is beyond it and was cut to it.
    capped_at: Option<u64>,
    /// The percentile's length before that cut.
    uncapped: u64,
}

impl SizedFromData {
    pub(super) fn header_line(&self) -> String {
        let d = &self.section;
        let sized = match self.capped_at {
            Some(n) => format!(
                "the model's {n} positions, below the p{} of {} ({} tokens)",
                d.percentile, d.path, self.uncapped
            ),
            None => format!("the p{} of {}", d.percentile, d.path),
        };
        format!(
            "max_seq_length {}: {sized}; {} samples, {} longer are truncated. Sort the \
             longest batch first so an out-of-memory shows at step 1, not step 300 (shorter batches \
             after it still fragment the cache by a few percent, within the bound).",
            self.chosen,
            d.samples.unwrap_or(0),
            d.truncated_samples.unwrap_or(0),
        )
    }
}

/// The percentile's length of the dataset, cut to the model's context `positions` (0: not
/// known) when it is longer: a trainer truncates there anyway, and past it the model was not
/// trained.
pub(super) fn size_from_data(
    args: &GenerateArgs,
    path: &std::path::Path,
    positions: u64,
) -> Result<SizedFromData> {
    use moro_data::Permille;
    let p = crate::commands::data::parse_percentile(args.percentile)?;
    let m = crate::commands::data::measure(
        path,
        &args.model,
        &args.data,
        &resolve::HubArgs::default(),
    )?;
    let uncapped = m.at(p).max(1);
    let cap = u32::try_from(positions).unwrap_or(u32::MAX);
    let chosen = if positions > 0 {
        uncapped.min(cap)
    } else {
        uncapped
    };
    let truncated = m.longer_than(chosen);
    let at = |q: Permille| u64::from(m.at(q));
    let section = moro_recipe::DataSection {
        path: path.display().to_string(),
        shape: Some(m.scan.shape.name().to_owned()),
        samples: Some(m.sorted.len() as u64),
        percentile: f64::from(p.tenths()) / 10.0,
        p90_tokens: Some(at(Permille::P90)),
        p95_tokens: Some(at(Permille::P95)),
        p99_tokens: at(Permille::P99),
        max_tokens: m.sorted.last().map(|&l| u64::from(l)),
        truncated_samples: Some(truncated),
    };
    let sized = SizedFromData {
        section,
        chosen: u64::from(chosen),
        capped_at: (chosen < uncapped).then_some(positions),
        uncapped: u64::from(uncapped),
    };
    note(&sized.header_line());
    if m.scan.malformed_count > 0 {
        note(&format!(
            "warning: {} malformed rows of {} not counted (`moro data stats` lists them)",
            m.scan.malformed_count,
            path.display()
        ));
    }
    Ok(sized)
}
