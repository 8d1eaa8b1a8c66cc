//! The safety margin a candidate keeps free: the device-level upper bound's ([`crate::bound`]).

use crate::bound::{JobClass, Table};
use crate::estimate::Estimate;
use crate::job::Job;
use crate::validation::Metric;

/// Smallest safety margin kept free, whatever the prediction ([`crate::bound::DEVICE_FLOOR_BYTES`]).
pub const MARGIN_FLOOR_BYTES: u64 = crate::bound::DEVICE_FLOOR_BYTES;

/// The safety margin of an estimate of `job`: what its device-level upper bound adds
/// ([`crate::bound`]: 95 % of measured runs like it lie under the bound), and never less
/// than [`MARGIN_FLOOR_BYTES`]. A configuration fits when `peak + margin ≤ usable memory`.
#[must_use]
pub fn margin_bytes(est: &Estimate, job: &Job) -> u64 {
    Table::builtin()
        .upper_of(est, job)
        .device
        .saturating_sub(est.peak_device_bytes)
}

/// The rule behind [`margin_bytes`], in words (for recipe headers and `--help`), with the band
/// the bound of the device level (or of `from`, the level that set it) comes from.
#[must_use]
pub fn margin_rule(class: JobClass, from: Metric) -> String {
    let band = Table::builtin().band(from, class);
    format!(
        "fits when the upper bound is within the usable memory: the bound is the predicted {} \
         peak + {}.{}% (and at least 512 MiB over the device peak), at or above {}% of measured \
         runs like this one ({}: {} runs from {} sources)",
        from.as_str(),
        band.upper_permille / 10,
        band.upper_permille % 10,
        band.coverage_percent,
        band.regime,
        band.runs,
        band.sources
    )
}
