//! A training step as the allocator sees it: the ordered allocations and frees of named
//! tensors, over loading and two optimizer steps ([`step::trace`]).
//!
//! Replaying a trace through [`crate::caching_allocator::CachingAllocator`] gives its
//! allocated and reserved peaks ([`Trace::replay`]); an estimate reads them while the step
//! is traced and keeps no event ([`step::levels`]). `moro estimate --trace FILE` writes a
//! trace as JSON lines ([`TraceEvent`]), and `crates/moro-core/tests/step_trace.rs` holds
//! moro's traces to the allocation sequences of the real step recorded on fake CUDA tensors
//! (`calibration/step_events.py`).

mod boft;
mod chunked_nll;
mod decoder_layer;
mod delta_weight;
mod dora;
mod fused_linear_ce;
pub mod generate;
mod levels;
mod params;
mod shapes;
pub mod step;

use serde::Serialize;

use crate::caching_allocator::round_size;
use crate::job::{Job, JobError};
use crate::model::ModelSpec;

pub use levels::{AllocatorModel, BackendReplayer, PhasePeaks, Replayer};

use super::{Backend, Component, DeviceProfile, Phase, PhaseBytes, Regime};

/// The step trace of `job` on `model` ([`step::trace`]), or its generation's
/// ([`generate::trace`]): `None` where neither models the job yet.
///
/// # Errors
/// The job is invalid for the model ([`Job::validate`]).
pub fn for_job<'m>(
    model: &'m ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) -> Result<Option<Trace<'m>>, JobError> {
    job.validate(model)?;
    let job: &Job = &super::with_prompt_tokens(job);
    let regime = Regime::resolve(model, job);
    if generate::models(model, job, &regime, device) {
        return Ok(generate::trace(model, job, &regime, device));
    }
    Ok(step::trace(model, job, &regime, device))
}

/// The trace of `job` trained on micro-batches of `lengths` tokens in that order
/// ([`step::trace_over_lengths`]): `None` where the step trace does not model the job.
///
/// # Errors
/// The job is invalid for the model ([`Job::validate`]).
pub fn over_lengths<'m>(
    model: &'m ModelSpec,
    job: &Job,
    device: &DeviceProfile,
    lengths: &[u64],
) -> Result<Option<Trace<'m>>, JobError> {
    job.validate(model)?;
    let (prompted, lengths) = super::with_prompt_tokens_over(job, lengths);
    let regime = Regime::resolve(model, &prompted);
    Ok(step::trace_over_lengths(
        model, &prompted, &regime, device, &lengths,
    ))
}

/// Whether an event makes a tensor or releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `malloc`: the tensor's storage is made.
    Alloc,
    /// `free`: the last reference to it is dropped.
    Free,
}

/// One allocation or free. A free repeats what its allocation said of the tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceEvent<'m> {
    /// Made or released.
    pub op: Op,
    /// The tensor, numbered in the order of allocation.
    pub tensor: u32,
    /// What it is (`weight`, `lora_A`, `grad`, `exp_avg`, `saved`, `logits`, ...).
    pub name: &'static str,
    /// The module it belongs to (`q_proj`, `lm_head`, ...), where it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<&'m str>,
    /// The decoder layer, where it belongs to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<u32>,
    /// Which part of the breakdown it counts in.
    pub component: Component,
    /// The moment of the step that made it.
    pub phase: Phase,
    /// The training step (0: loading; 1 and 2: the steps).
    pub step: u8,
    /// Bytes requested.
    pub bytes: u64,
    /// Bytes per element.
    pub dtype_bytes: u8,
    /// The CUDA stream it is made on (0: the compute stream).
    pub stream: u32,
}

/// One allocation or free as the levels and the replay read it: [`TraceEvent`] without
/// the names ([`TraceEvent::lean`]), a third of its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Bytes requested.
    pub bytes: u64,
    /// The tensor, numbered in the order of allocation.
    pub tensor: u32,
    /// The CUDA stream it is made on (0: the compute stream).
    pub stream: u32,
    /// Made or released.
    pub op: Op,
    /// Which part of the breakdown it counts in.
    pub component: Component,
    /// The moment of the step that made it.
    pub phase: Phase,
}

impl TraceEvent<'_> {
    /// The event as the levels and the replay read it.
    #[must_use]
    pub const fn lean(&self) -> Event {
        Event {
            bytes: self.bytes,
            tensor: self.tensor,
            stream: self.stream,
            op: self.op,
            component: self.component,
            phase: self.phase,
        }
    }
}

/// A step's events in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trace<'m> {
    /// Allocations and frees with what they name.
    pub events: Vec<TraceEvent<'m>>,
    /// The decoder layers are traced op by op (LoRA or QLoRA on a Llama-style layer, `step`'s
    /// `decoder_layer`), not as their saved bytes cut into shapes.
    #[serde(skip)]
    pub op_by_op: bool,
}

/// The peaks of a trace replayed through the allocator model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// The largest total of live blocks (each request rounded as the allocator rounds it).
    pub allocated: u64,
    /// The largest total of `cudaMalloc`ed segments.
    pub reserved: u64,
    /// The largest total of segments holding an allocated block: the reserved peak where
    /// memory runs short and wholly free segments are returned
    /// ([`crate::caching_allocator::CachingAllocator::peak_needed`]).
    pub needed: u64,
}

impl Trace<'_> {
    /// The largest total of live tensors, each rounded as the allocator rounds requests
    /// (`round_size`), and the index of the event that reached it.
    #[must_use]
    pub fn peak(&self) -> (u64, usize) {
        let mut live = 0u64;
        let mut peak = (0, 0);
        for (i, e) in self.events.iter().enumerate() {
            match e.op {
                Op::Alloc => {
                    live += round_size(e.bytes);
                    if live > peak.0 {
                        peak = (live, i);
                    }
                }
                Op::Free => live -= round_size(e.bytes),
            }
        }
        peak
    }

    /// Bytes of each component live at the allocated peak ([`Self::peak`]): the largest
    /// of [`Self::phases`].
    #[must_use]
    pub fn components_at_peak(&self) -> Vec<(Component, u64)> {
        self.phases()
            .into_iter()
            .max_by_key(PhaseBytes::total)
            .map(|p| p.components)
            .unwrap_or_default()
    }

    /// Each phase's largest live total with the components live then, in the order the
    /// phases first appear: the estimate's phases read off the trace ([`PhasePeaks`]).
    #[must_use]
    pub fn phases(&self) -> Vec<PhaseBytes> {
        let mut peaks = PhasePeaks::default();
        for e in &self.events {
            peaks.on(&e.lean());
        }
        peaks.finish()
    }

    /// Replays the trace through CUDA's caching allocator model ([`Replayer`]).
    #[must_use]
    pub fn replay(&self) -> Replayed {
        let mut r = Replayer::<crate::caching_allocator::CachingAllocator>::with_capacity(
            self.events.len() / 2 + 1,
        );
        for e in &self.events {
            r.on(&e.lean());
        }
        r.peaks()
    }
}

/// A tensor made by a [`Builder`]: what its free repeats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tensor<'m> {
    id: u32,
    name: &'static str,
    module: Option<&'m str>,
    layer: Option<u32>,
    component: Component,
    bytes: u64,
    dtype_bytes: u8,
}

/// What a builder reads off the events as they come, instead of keeping them.
#[derive(Debug)]
struct Reading {
    peaks: PhasePeaks,
    replayer: Option<BackendReplayer>,
}

/// Writes a trace: the current phase and step, and numbered tensors.
#[derive(Debug, Default)]
pub(crate) struct Builder<'m> {
    events: Vec<TraceEvent<'m>>,
    /// Where set, the events are read as they come ([`Self::reading`]) and not kept.
    reading: Option<Reading>,
    next: u32,
    phase: Option<Phase>,
    step: u8,
}

impl<'m> Builder<'m> {
    /// A builder that keeps the events, with their names, with room for `events` of them.
    pub(crate) fn with_capacity(events: usize) -> Self {
        Self {
            events: Vec::with_capacity(events),
            ..Self::default()
        }
    }

    /// A builder that keeps no event but reads each as it comes: the phases' peaks, and the
    /// replay where `replay`, with room for `tensors` tensors, both as `backend` allocates.
    pub(crate) fn reading(backend: Backend, replay: bool, tensors: usize) -> Self {
        Self {
            reading: Some(Reading {
                peaks: PhasePeaks::on_backend(backend),
                replayer: replay.then(|| BackendReplayer::with_capacity(backend, tensors)),
            }),
            ..Self::default()
        }
    }

    /// Later events happen at `phase` of training step `step`.
    pub(crate) const fn at(&mut self, phase: Phase, step: u8) {
        self.phase = Some(phase);
        self.step = step;
    }

    /// Makes a tensor of `numel` elements of `dtype_bytes` each.
    pub(crate) fn alloc(
        &mut self,
        name: &'static str,
        component: Component,
        numel: u64,
        dtype_bytes: u64,
    ) -> Tensor<'m> {
        self.alloc_in(name, None, None, component, numel, dtype_bytes)
    }

    /// Makes a tensor that belongs to a module or a layer.
    pub(crate) fn alloc_in(
        &mut self,
        name: &'static str,
        module: Option<&'m str>,
        layer: Option<u64>,
        component: Component,
        numel: u64,
        dtype_bytes: u64,
    ) -> Tensor<'m> {
        let t = Tensor {
            id: self.next,
            name,
            module,
            layer: layer.and_then(|l| u32::try_from(l).ok()),
            component,
            bytes: numel.saturating_mul(dtype_bytes),
            dtype_bytes: u8::try_from(dtype_bytes).unwrap_or(u8::MAX),
        };
        self.next += 1;
        self.push(Op::Alloc, &t);
        t
    }

    /// Makes a tensor of `bytes` that is released at once: a temporary between two
    /// allocations that outlive it.
    pub(crate) fn transient(&mut self, name: &'static str, layer: Option<u64>, bytes: u64) {
        let t = self.alloc_in(name, None, layer, Component::Transients, bytes, 1);
        self.free(t);
    }

    /// Releases `t`.
    pub(crate) fn free(&mut self, t: Tensor<'m>) {
        self.push(Op::Free, &t);
    }

    /// Makes one of a PEFT module's tensors in decoder layer `layer`, or nothing for 0 bytes
    /// (what the forward saves is made with the layer's saved tensors instead).
    pub(crate) fn module_tensor(
        &mut self,
        name: &'static str,
        layer: Option<u64>,
        bytes: u64,
    ) -> Option<Tensor<'m>> {
        (bytes > 0).then(|| self.alloc_in(name, None, layer, Component::Transients, bytes, 1))
    }

    /// Releases the tensors of `ts` that [`Self::module_tensor`] made.
    pub(crate) fn free_made(&mut self, ts: &[Option<Tensor<'m>>]) {
        for &t in ts.iter().flatten() {
            self.free(t);
        }
    }

    /// Releases every tensor of `ts`.
    pub(crate) fn free_all(&mut self, ts: Vec<Tensor<'m>>) {
        for t in ts {
            self.free(t);
        }
    }

    fn push(&mut self, op: Op, t: &Tensor<'m>) {
        let phase = self.phase.unwrap_or(Phase::Load);
        if let Some(r) = &mut self.reading {
            let e = Event {
                bytes: t.bytes,
                tensor: t.id,
                stream: 0,
                op,
                component: t.component,
                phase,
            };
            r.peaks.on(&e);
            if let Some(replayer) = &mut r.replayer {
                replayer.on(&e);
            }
            return;
        }
        self.events.push(TraceEvent {
            op,
            tensor: t.id,
            name: t.name,
            module: t.module,
            layer: t.layer,
            component: t.component,
            phase,
            step: self.step,
            bytes: t.bytes,
            dtype_bytes: t.dtype_bytes,
            stream: 0,
        });
    }

    /// What a [`Self::reading`] builder read: the phases, and the replay's peaks.
    pub(crate) fn finish_reading(self) -> (Vec<PhaseBytes>, Option<Replayed>) {
        match self.reading {
            Some(r) => (r.peaks.finish(), r.replayer.map(|x| x.peaks())),
            None => (Vec::new(), None),
        }
    }

    pub(crate) fn finish(self) -> Trace<'m> {
        Trace {
            events: self.events,
            op_by_op: false,
        }
    }
}

/// `bytes`, or 0 where the forward `saved` it: a module's tensor made with its layer's
/// saved tensors instead ([`Builder::module_tensor`]).
pub(crate) const fn unless_saved(saved: bool, bytes: u64) -> u64 {
    if saved { 0 } else { bytes }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Weights, then a forward whose live total peaks twice at the same height (the first
    /// counts), then a backward that peaks higher after the forward's components changed.
    fn small_step(b: Builder<'static>) -> Builder<'static> {
        let mut b = b;
        b.at(Phase::Load, 0);
        let _w = b.alloc("weight", Component::Weights, 10 * MIB, 1);
        b.at(Phase::ForwardEnd, 1);
        let x = b.alloc("saved", Component::Activations, 4 * MIB, 1);
        let l = b.alloc("logits", Component::LogitsLoss, 6 * MIB, 1);
        b.free(l);
        let y = b.alloc("saved", Component::Activations, 6 * MIB, 1);
        b.at(Phase::LayerBackward, 1);
        b.free(x);
        let g = b.alloc("grad", Component::Gradients, 9 * MIB, 1);
        b.free(g);
        b.free(y);
        b
    }

    /// Each phase's peak and the components then, by hand: loading 10 MiB of weights; the
    /// forward's first 20 MiB (weights, 4 MiB saved, 6 MiB of logits), not the second
    /// (weights, 10 MiB saved); the backward's 25 MiB (weights, 6 MiB saved, 9 MiB of
    /// gradients).
    #[test]
    fn phases_are_read_off_each_phases_first_peak() {
        let t = small_step(Builder::with_capacity(16)).finish();
        let p = t.phases();
        let by_phase: Vec<(Phase, Vec<(Component, u64)>)> =
            p.into_iter().map(|p| (p.phase, p.components)).collect();
        assert_eq!(
            by_phase,
            [
                (Phase::Load, vec![(Component::Weights, 10 * MIB)]),
                (
                    Phase::ForwardEnd,
                    vec![
                        (Component::Weights, 10 * MIB),
                        (Component::Activations, 4 * MIB),
                        (Component::LogitsLoss, 6 * MIB),
                    ]
                ),
                (
                    Phase::LayerBackward,
                    vec![
                        (Component::Weights, 10 * MIB),
                        (Component::Activations, 6 * MIB),
                        (Component::Gradients, 9 * MIB),
                    ]
                ),
            ]
        );
        assert_eq!(t.peak(), (25 * MIB, 6));
    }

    /// A builder that reads the events as they come finds what the stored trace gives.
    #[test]
    fn reading_the_events_as_they_come_is_reading_the_trace() {
        let t = small_step(Builder::with_capacity(16)).finish();
        assert_eq!(t.events.len(), 9, "every event kept, by hand");
        let (phases, replayed) =
            small_step(Builder::reading(Backend::Cuda, true, 4)).finish_reading();
        assert_eq!(phases, t.phases());
        assert_eq!(replayed, Some(t.replay()));
        let (_, none) = small_step(Builder::reading(Backend::Cuda, false, 4)).finish_reading();
        assert_eq!(none, None);
    }
}
