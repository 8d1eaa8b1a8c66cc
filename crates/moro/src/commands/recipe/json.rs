//! The `--json` documents of `recipe generate` and `recipe check`.

use moro_core::job::Job;
use moro_core::search::Candidate;
use moro_recipe::Recipe;
use serde::Serialize;

use super::alternatives::Alternatives;
use super::target::layout_of;
use super::text::describe;

#[derive(Debug, Serialize)]
pub(super) struct CandidateJson {
    configuration: String,
    gpus: u64,
    strategy: String,
    job: Job,
    peak_device_bytes: u64,
    /// The upper bound on the device peak, which "fits" is judged on.
    peak_upper_bytes: u64,
    margin_bytes: u64,
    headroom_bytes: i64,
    /// fits / uncertain / does_not_fit on the GPU's usable memory.
    verdict: moro_core::bound::Verdict,
    /// Host RAM per GPU process for offloaded states.
    host_bytes: u64,
    /// Host RAM per node (its GPU processes together).
    host_bytes_per_node: u64,
}

impl CandidateJson {
    pub(super) fn of(c: &Candidate) -> Self {
        Self {
            configuration: describe(&c.job),
            gpus: c.job.parallel.gpus(),
            strategy: layout_of(&c.job).strategy_text(),
            job: c.job.clone(),
            peak_device_bytes: c.estimate.peak_device_bytes,
            peak_upper_bytes: c.upper_bytes(),
            margin_bytes: c.margin_bytes,
            headroom_bytes: c.headroom_bytes,
            verdict: c.verdict(),
            host_bytes: c.estimate.host_bytes,
            host_bytes_per_node: c.host_bytes_per_node(),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct GenerateJson<'a> {
    pub(super) model: &'a str,
    pub(super) hardware: String,
    pub(super) usable_bytes: u64,
    pub(super) objective: &'static str,
    pub(super) margin_rule: String,
    pub(super) fits: bool,
    pub(super) output: Option<String>,
    pub(super) recipe: Option<&'a Recipe>,
    pub(super) best: Option<CandidateJson>,
    pub(super) runners_up: Vec<CandidateJson>,
    pub(super) closest: Option<CandidateJson>,
    pub(super) short_by_bytes: u64,
    pub(super) alternatives: Option<Alternatives>,
    pub(super) evaluated: usize,
}

#[derive(Debug, Serialize)]
pub(super) struct CheckJson<'a> {
    pub(super) file: &'a str,
    pub(super) model: &'a str,
    pub(super) hardware: String,
    pub(super) configuration: String,
    pub(super) usable_bytes: u64,
    pub(super) peak_allocated_bytes: u64,
    pub(super) peak_reserved_bytes: u64,
    pub(super) peak_device_bytes: u64,
    pub(super) margin_bytes: u64,
    pub(super) margin_rule: String,
    pub(super) headroom_bytes: i64,
    /// The upper bound on each level, the band it comes from and the verdict.
    #[serde(flatten)]
    pub(super) bound: crate::verdict::Judged,
    pub(super) fits: bool,
    pub(super) fits_without_margin: bool,
    pub(super) recorded_peak_device_bytes: Option<u64>,
}
