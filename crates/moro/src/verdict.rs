//! Judging a job against memory on its upper bound ([`moro_core::bound`]): the bound on each
//! level, the band it comes from, and one of three verdicts, in words and as JSON.

use moro_core::bound::{Band, JobClass, Table, Upper, Verdict};
use moro_core::estimate::Estimate;
use moro_core::job::Job;
use serde::Serialize;

use crate::output::gib;

/// An estimate's bound and, given memory, its verdict.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Judged {
    /// The bound on the device level, the one a job is judged on.
    pub(crate) peak_upper_bytes: u64,
    /// The bound on each level.
    pub(crate) upper: Upper,
    /// Where the device-level bound comes from (the band of [`Upper::device_from`]).
    pub(crate) band: Band,
    /// fits / uncertain / does_not_fit, when memory is known.
    pub(crate) verdict: Option<Verdict>,
}

/// Judges `est` of `job` against `memory` bytes per GPU (when known).
pub(crate) fn judge(est: &Estimate, job: &Job, memory: Option<u64>) -> Judged {
    let table = Table::builtin();
    let upper = table.upper_of(est, job);
    Judged {
        peak_upper_bytes: upper.device,
        band: table.band(upper.device_from, JobClass::of(job)),
        verdict: memory.map(|m| Verdict::of(est.peak_device_bytes, upper.device, m)),
        upper,
    }
}

/// `95 % of measured runs like this one (hf, qlora, one GPU, device level: 57 runs from 3
/// sources)`.
pub(crate) fn band_text(band: &Band) -> String {
    format!(
        "{} % of measured runs like this one ({}: {} runs from {} sources)",
        band.coverage_percent, band.regime, band.runs, band.sources
    )
}

/// The verdict in a sentence, for a GPU named `on` with `memory` bytes.
pub(crate) fn verdict_text(j: &Judged, est: &Estimate, on: &str, memory: u64) -> String {
    let peak = est.peak_device_bytes;
    match j
        .verdict
        .unwrap_or(Verdict::of(peak, j.peak_upper_bytes, memory))
    {
        Verdict::Fits => format!(
            "fits on {on} ({} GiB): predicted {} GiB, bound {} GiB ({} %), {} GiB to spare",
            gib(memory),
            gib(peak),
            gib(j.peak_upper_bytes),
            j.band.coverage_percent,
            gib(memory - j.peak_upper_bytes)
        ),
        Verdict::Uncertain => format!(
            "uncertain on {on} ({} GiB): predicted {} GiB fits, but its bound {} GiB ({} %) does \
             not; a job {} GiB smaller is safe (`moro recipe generate` finds one)",
            gib(memory),
            gib(peak),
            gib(j.peak_upper_bytes),
            j.band.coverage_percent,
            gib(j.peak_upper_bytes - memory)
        ),
        Verdict::DoesNotFit => format!(
            "does NOT fit on {on} ({} GiB): predicted {} GiB, {} GiB over",
            gib(memory),
            gib(peak),
            gib(peak - memory)
        ),
    }
}
