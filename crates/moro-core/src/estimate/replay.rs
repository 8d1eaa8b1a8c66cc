//! A one-GPU training step as the estimate reads it off its step trace
//! ([`super::trace::step`]): the phases and their components (the allocated level and the
//! breakdown) for every job the trace models, and, for full fine-tunes, QLoRA and DoRA, the
//! trace replayed through [`crate::caching_allocator::CachingAllocator`] for the reserve.
//!
//! A full fine-tune's optimizer creates its states lazily, in the first `step()`, after the
//! backward freed the activations and the loss's buffers: the states take those blocks and
//! split them, and the second forward's activations and logits no longer find whole blocks
//! of their size, so the allocator `cudaMalloc`s new segments. No ratio of the churn
//! captures that (`calibration/README.md`: replaying the real step's allocation sequence,
//! traced on fake tensors, reproduced the H200's reserved peaks; moro's ratio was 1.7 to
//! 5.7 GiB under for the full fine-tunes). The fragmentation used is the replay's reserved
//! peak minus the trace's allocated peak. `crates/moro-core/tests/replay.rs` holds it to
//! the H200's full fine-tunes.
//!
//! DoRA jobs are replayed too: every forward and recompute makes weight-sized temporaries
//! per adapted module (the identity, `lora_B(lora_A(eye))`, fp32 copies of both weights:
//! [`super::trace`]'s `dora`), whose segments, made early, smaller tensors split later.
//! Plain LoRA's reserve stays the ratio's: its replay is 2.4 % over the H200's LoRA run.

use crate::job::{Job, Method};
use crate::model::ModelSpec;

use super::trace::{generate, step};
use super::{Backend, DeviceProfile, PhaseBytes, Regime};

/// The micro-batches of a step [`step`] traces at most: PEFT, full fine-tuning.
pub const REPLAYED_MICRO_BATCHES: [u64; 2] = [2, 4];

/// Whether [`step`] replays `job` for its reserve: a full fine-tune, QLoRA or DoRA job the
/// step trace models.
#[must_use]
pub fn models(model: &ModelSpec, job: &Job, r: &Regime) -> bool {
    (job.method == Method::Full
        || job.method == Method::QuantizedAdapters
        || job.method.is_peft() && job.adapter.dora)
        && step::models(model, job, r)
}

/// A training step as its trace gives it ([`step`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayedStep {
    /// Each phase's largest live total and its components ([`super::trace::Trace::phases`]):
    /// the estimate's allocated level and breakdown.
    pub phases: Vec<PhaseBytes>,
    /// The replayed fragmentation, reserved peak − allocated peak, where [`models`] is
    /// true; else 0 (the reserve stays the ratio's).
    pub fragmentation: u64,
    /// The replay alone sets the reserve ([`replay_sets_reserve`]).
    pub reserve_from_replay: bool,
    /// Wholly free segments the replay leaves cached at its reserved peak beyond what the
    /// job needs ([`super::trace::Replayed::needed`]): a generation's outgrown cache
    /// blocks, which PyTorch returns only when memory runs short.
    pub idle_cache: u64,
}

/// The trace of two training steps of `job` on one GPU ([`step::trace`]): its phases, and
/// the fragmentation of its replay where [`models`] is true; `None` where the trace does not
/// model the job.
///
/// Each step traces at most [`REPLAYED_MICRO_BATCHES`] of its micro-batches: from the
/// second (PEFT) or the fourth (full fine-tuning) on, a micro-batch finds the cache as the
/// one before left it and makes the same requests, so later ones add nothing
/// (`tests/replay.rs`: 8 and 16 micro-batches replay to the same bytes as the cap).
#[must_use]
pub fn step(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> Option<ReplayedStep> {
    traced(model, job, r, device, true)
}

/// [`step`] without the replay, a fraction of its cost: the trace's phases, and no
/// fragmentation. Where the layers are traced op by op the replay's fragmentation is the
/// whole reserve and only adds to it, so an estimate read off this is a floor under one read
/// off [`step`]: what does not fit on it cannot fit.
#[must_use]
pub fn step_floor(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> Option<ReplayedStep> {
    traced(model, job, r, device, false)
}

fn traced(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    replay: bool,
) -> Option<ReplayedStep> {
    if generate::models(model, job, r, device) {
        return generation(model, job, r, device, replay);
    }
    let cap = REPLAYED_MICRO_BATCHES[usize::from(job.method == Method::Full)];
    let capped;
    let job = if job.grad_accum > cap {
        capped = Job {
            grad_accum: cap,
            ..job.clone()
        };
        &capped
    } else {
        job
    };
    let reserve_from_replay = replay_sets_reserve(model, job, r, device);
    let replay = replay && (reserve_from_replay || models(model, job, r));
    let levels = step::levels(model, job, r, device, replay)?;
    // The allocated peak is the largest phase's ([`step::Levels::phases`]).
    let allocated = levels
        .phases
        .iter()
        .map(PhaseBytes::total)
        .max()
        .unwrap_or(0);
    let fragmentation = levels
        .replayed
        .map_or(0, |x| x.reserved.saturating_sub(allocated));
    Some(ReplayedStep {
        phases: levels.phases,
        fragmentation,
        reserve_from_replay,
        idle_cache: 0,
    })
}

/// A generation's phases off its trace ([`generate`]), and where `replay` the reserve it
/// needs (the segments holding a block at the replay's worst moment) and the wholly free
/// ones a GPU with room to spare keeps beyond that: the replay alone sets the reserve.
fn generation(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    replay: bool,
) -> Option<ReplayedStep> {
    let (phases, replayed) = generate::levels(model, job, r, device, replay)?;
    let allocated = phases.iter().map(PhaseBytes::total).max().unwrap_or(0);
    let (fragmentation, idle_cache) = replayed.map_or((0, 0), |x| {
        (
            x.needed.saturating_sub(allocated),
            x.reserved.saturating_sub(x.needed),
        )
    });
    Some(ReplayedStep {
        phases,
        fragmentation,
        reserve_from_replay: true,
        idle_cache,
    })
}

/// Whether the replay of `job`'s step trace alone sets its reserve: where the layers are
/// traced op by op, and on MPS for every job the trace models (no ratio of CUDA's cache
/// describes its heaps).
#[must_use]
pub fn replay_sets_reserve(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> bool {
    step::op_by_op(model, job, r) || device.backend == Backend::Mps && step::models(model, job, r)
}
