//! The honest upper bound on an estimate: how far a measurement can lie above moro's
//! prediction, learned from measured runs with the source (one script, one set of versions)
//! as the unit.
//!
//! [`fit`] turns measured points into a [`Table`] of regime cells; [`Table::band`] picks, for
//! a job's [`JobClass`] and a level, the most specific cell that has data from at least
//! [`MIN_SOURCES`] sources, and [`Table::upper`] scales a predicted peak by it. The table
//! moro ships (`data/error_model.json`, [`Table::builtin`]) is refitted from
//! `validation/` by a test that fails when it goes stale; [`evaluate`] scores a table by
//! leaving one source out at a time. The method is in `docs/error-model.md`.

pub mod evaluate;
pub mod fit;

use serde::{Deserialize, Serialize};

use crate::estimate::Estimate;
use crate::job::{Job, Method, Sharding, Stack};
use crate::validation::Metric;

pub use evaluate::{Evaluation, RegimeScore, evaluate, evaluation, leave_one_source_out};
pub use fit::{Point, fit};

/// Fewest sources a cell needs before its bound is used; coarser cells and then
/// [`DEFAULT_UPPER_PERMILLE`] stand in below it.
pub const MIN_SOURCES: usize = 3;

/// Share of measured runs the bound is meant to cover.
pub const COVERAGE: f64 = 0.95;

/// The bound where no cell has [`MIN_SOURCES`] sources, per mille above the prediction: one
/// GPU, sharded. Wider than any fitted cell (`docs/error-model.md`).
pub const DEFAULT_UPPER_PERMILLE: [u64; 2] = [150, 400];

/// Least the device-level bound lies above the prediction, whatever the measured runs say.
/// The CUDA context alone varies by 0.45 GiB between lazy and eager kernel loading (0.47 vs
/// 0.92 GiB on an A100, see [`crate::estimate::DeviceProfile::cuda_context_bytes`]), and
/// desktop GPUs share memory with the display server; 512 MiB covers the first and most of
/// the second.
pub const DEVICE_FLOOR_BYTES: u64 = 512 * crate::units::MIB;

/// What decides a job's error regime: the stack, the method and whether the model is split
/// over GPUs (a sharding engine, tensor or pipeline parallelism). Plain data parallelism runs
/// the one-GPU job on each GPU, with its gradient buckets and NCCL buffers modelled: it is
/// one-GPU for the error model (no measured run is plain DDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobClass {
    /// Training stack.
    pub stack: Stack,
    /// Method (the other PEFT methods are [`Method::Adapters`] jobs: they group with LoRA).
    pub method: Method,
    /// A sharding engine (DeepSpeed ZeRO, FSDP; even on one GPU), tensor or pipeline
    /// parallelism.
    pub sharded: bool,
}

impl JobClass {
    /// The class of a job.
    #[must_use]
    pub fn of(job: &Job) -> Self {
        Self {
            stack: job.stack,
            method: job.method,
            sharded: job.parallel.sharding != Sharding::None
                || job.parallel.tensor_parallel > 1
                || job.parallel.pipeline > 1,
        }
    }
}

/// A cell of the error model: the regime it covers (a `None` field pools every value) and
/// the bound fitted on its points.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Level measured; `None`: all levels pooled.
    pub level: Option<Metric>,
    /// Sharded or one GPU (always set).
    pub sharded: bool,
    /// Stack; `None`: all stacks.
    pub stack: Option<Stack>,
    /// Method; `None`: all methods.
    pub method: Option<Method>,
    /// Sources with points in the cell.
    pub sources: usize,
    /// Points (measured runs) in the cell.
    pub runs: usize,
    /// Mean source offset of `ln(measured / predicted)`, ×10⁴, rounded.
    pub offset_e4: i64,
    /// Spread of the source offsets, ×10⁴, rounded.
    pub between_e4: u64,
    /// Spread of the runs around their source's offset, ×10⁴, rounded.
    pub within_e4: u64,
    /// The bound, per mille above the prediction (never negative: the bound is never
    /// under the prediction).
    pub upper_permille: u64,
}

impl Cell {
    fn matches(&self, level: Metric, class: JobClass) -> bool {
        self.sharded == class.sharded
            && self.level.is_none_or(|l| l == level)
            && self.stack.is_none_or(|s| s == class.stack)
            && self.method.is_none_or(|m| m == class.method)
    }

    /// The cell's place in [`fit::FALLBACK`] (0: the most specific).
    fn rank(&self) -> usize {
        let pins = (
            self.level.is_some(),
            self.stack.is_some(),
            self.method.is_some(),
        );
        fit::FALLBACK
            .iter()
            .position(|p| *p == pins)
            .unwrap_or(fit::FALLBACK.len())
    }

    /// The regime in words: `hf, qlora, one GPU, device level`.
    #[must_use]
    pub fn describe(&self) -> String {
        regime_words(self.level, self.sharded, self.stack, self.method)
    }
}

/// A regime in words (a `None` field: pooled over every value).
fn regime_words(
    level: Option<Metric>,
    sharded: bool,
    stack: Option<Stack>,
    method: Option<Method>,
) -> String {
    let mut parts: Vec<&str> = Vec::new();
    parts.extend(stack.map(Stack::as_str));
    parts.extend(method.map(Method::as_str));
    parts.push(if sharded { "sharded" } else { "one GPU" });
    let level = level.map_or("all levels".to_owned(), |l| format!("{} level", l.as_str()));
    format!("{}, {level}", parts.join(", "))
}

/// The error model: every cell with enough sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Share of runs each bound is meant to cover.
    pub coverage: f64,
    /// The cells, most specific first ([`fit::FALLBACK`]).
    pub cells: Vec<Cell>,
}

/// The band a bound comes from, for output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Band {
    /// Share of measured runs like this one the bound is fitted to cover (0.95).
    pub coverage: f64,
    /// The same, per cent.
    pub coverage_percent: u64,
    /// The regime in words, and why a coarser one stands in when it does.
    pub regime: String,
    /// Measured runs behind it.
    pub runs: usize,
    /// Sources (scripts, setups) behind it.
    pub sources: usize,
    /// The bound per mille above the prediction.
    pub upper_permille: u64,
}

/// A prediction with its bound on all three levels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Upper {
    /// Bound on `torch.cuda.max_memory_allocated`.
    pub allocated: u64,
    /// Bound on `torch.cuda.max_memory_reserved`.
    pub reserved: u64,
    /// Bound on what nvidia-smi shows: the level a job is judged on.
    pub device: u64,
    /// The level whose band sets the device bound: a lower level's when its runs spread
    /// wider (the device peak is never under the reserved one).
    pub device_from: Metric,
}

const BUILTIN_JSON: &str = include_str!("../../data/error_model.json");

impl Table {
    /// The table moro ships, fitted on `validation/` (refitted by
    /// `tests/error_model.rs`).
    ///
    /// # Panics
    /// Never for the shipped file (a test parses it).
    #[must_use]
    pub fn builtin() -> &'static Self {
        static T: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
        T.get_or_init(|| serde_json::from_str(BUILTIN_JSON).expect("data/error_model.json parses"))
    }

    /// The most specific cell for `class` at `level` (`None`: no cell has data).
    #[must_use]
    pub fn cell(&self, level: Metric, class: JobClass) -> Option<&Cell> {
        self.cells
            .iter()
            .filter(|c| c.matches(level, class))
            .min_by_key(|c| c.rank())
    }

    /// The band for `class` at `level`.
    #[must_use]
    pub fn band(&self, level: Metric, class: JobClass) -> Band {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let coverage_percent = (self.coverage * 100.0).round() as u64;
        match self.cell(level, class) {
            Some(c) => {
                let regime = if c.rank() == 0 {
                    c.describe()
                } else {
                    format!(
                        "{}; fewer than {MIN_SOURCES} sources for {} {} alone",
                        c.describe(),
                        class.stack.as_str(),
                        class.method.as_str()
                    )
                };
                Band {
                    coverage: self.coverage,
                    coverage_percent,
                    regime,
                    runs: c.runs,
                    sources: c.sources,
                    upper_permille: c.upper_permille,
                }
            }
            None => Band {
                coverage: self.coverage,
                coverage_percent,
                regime: format!(
                    "{} (no measured runs: moro's documented default)",
                    regime_words(
                        Some(level),
                        class.sharded,
                        Some(class.stack),
                        Some(class.method)
                    )
                ),
                runs: 0,
                sources: 0,
                upper_permille: DEFAULT_UPPER_PERMILLE[usize::from(class.sharded)],
            },
        }
    }

    /// The factor (‰) of the band of `class` at `level`, without its words (the search asks
    /// for it once per configuration).
    #[must_use]
    pub fn upper_permille(&self, level: Metric, class: JobClass) -> u64 {
        self.cell(level, class)
            .map_or(DEFAULT_UPPER_PERMILLE[usize::from(class.sharded)], |c| {
                c.upper_permille
            })
    }

    /// `predicted` raised by the band of `class` at `level`.
    #[must_use]
    pub fn upper(&self, level: Metric, class: JobClass, predicted: u64) -> u64 {
        scale_permille(predicted, self.upper_permille(level, class))
    }

    /// The bound on a predicted device peak of a job of `class`, never less than
    /// [`DEVICE_FLOOR_BYTES`] above it: what "fits" is judged on.
    #[must_use]
    pub fn device_upper(&self, class: JobClass, peak_device_bytes: u64) -> u64 {
        self.upper(Metric::Device, class, peak_device_bytes)
            .max(peak_device_bytes.saturating_add(DEVICE_FLOOR_BYTES))
    }

    /// The bounds of an estimate of `job` on all three levels ([`Table::upper_levels`]).
    #[must_use]
    pub fn upper_of(&self, est: &Estimate, job: &Job) -> Upper {
        self.upper_levels(
            JobClass::of(job),
            [
                est.peak_allocated_bytes,
                est.peak_reserved_bytes,
                est.peak_device_bytes,
            ],
        )
    }

    /// The bounds on predictions `[allocated, reserved, device]` of a job of `class`: each
    /// level's band, the device one at least [`DEVICE_FLOOR_BYTES`] above its prediction,
    /// and no level's bound under a lower level's (the device peak is never under the
    /// reserved one, nor that under the allocated one).
    #[must_use]
    pub fn upper_levels(&self, class: JobClass, predicted: [u64; 3]) -> Upper {
        let [a, r, d] = predicted;
        let allocated = self.upper(Metric::Allocated, class, a);
        let reserved_own = self.upper(Metric::Reserved, class, r);
        let reserved = reserved_own.max(allocated);
        let device_own = self.device_upper(class, d);
        let device_from = if device_own >= reserved {
            Metric::Device
        } else if reserved_own >= allocated {
            Metric::Reserved
        } else {
            Metric::Allocated
        };
        Upper {
            allocated,
            reserved,
            device: device_own.max(reserved),
            device_from,
        }
    }

    /// The bound of `upper_levels` at `level`.
    #[must_use]
    pub fn upper_at(&self, level: Metric, class: JobClass, predicted: [u64; 3]) -> u64 {
        let u = self.upper_levels(class, predicted);
        match level {
            Metric::Allocated => u.allocated,
            Metric::Reserved => u.reserved,
            Metric::Device => u.device,
        }
    }
}

/// `bytes × (1000 + permille) / 1000`, rounded up, saturating.
#[must_use]
pub const fn scale_permille(bytes: u64, permille: u64) -> u64 {
    let whole = (bytes / 1000).saturating_mul(1000 + permille);
    let rest = (bytes % 1000 * (1000 + permille)).div_ceil(1000);
    whole.saturating_add(rest)
}

/// Whether a job fits, judged on the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The bound is within the usable memory.
    Fits,
    /// The prediction fits, the bound does not.
    Uncertain,
    /// The prediction itself is over the usable memory.
    DoesNotFit,
}

impl Verdict {
    /// The verdict of a prediction and its bound against `usable` bytes.
    #[must_use]
    pub const fn of(predicted: u64, upper: u64, usable: u64) -> Self {
        if upper <= usable {
            Self::Fits
        } else if predicted <= usable {
            Self::Uncertain
        } else {
            Self::DoesNotFit
        }
    }

    /// In words.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fits => "fits",
            Self::Uncertain => "uncertain",
            Self::DoesNotFit => "does not fit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_by_hand() {
        assert_eq!(scale_permille(1000, 50), 1050);
        assert_eq!(scale_permille(1001, 50), 1052); // 1001 × 1.05 = 1051.05, rounded up
        assert_eq!(scale_permille(u64::MAX, 1000), u64::MAX);
        assert_eq!(scale_permille(0, 400), 0);
    }

    #[test]
    fn verdicts() {
        assert_eq!(Verdict::of(10, 11, 12), Verdict::Fits);
        assert_eq!(Verdict::of(10, 13, 12), Verdict::Uncertain);
        assert_eq!(Verdict::of(13, 14, 12), Verdict::DoesNotFit);
        assert_eq!(Verdict::of(12, 12, 12), Verdict::Fits);
    }
}
