//! A training step as the allocator sees it: the ordered allocations and frees of named
//! tensors, over loading and two optimizer steps ([`step::trace`]).
//!
//! Replaying a trace through [`CachingAllocator`] gives its allocated and reserved peaks
//! ([`Trace::replay`]); `moro estimate --trace FILE` writes one as JSON lines
//! ([`TraceEvent`]), and `crates/moro-core/tests/step_trace.rs` holds moro's traces to the
//! allocation sequences of the real step recorded on fake CUDA tensors
//! (`calibration/step_events.py`).

mod chunked_nll;
mod decoder_layer;
mod dora;
mod params;
mod shapes;
pub mod step;

use serde::Serialize;

use crate::caching_allocator::{CachingAllocator, Handle, Stream, round_size};
use crate::job::{Job, JobError};
use crate::model::ModelSpec;

use super::{Component, DeviceProfile, Phase, PhaseBytes, Regime};

/// The step trace of `job` on `model` ([`step::trace`]): `None` where the trace does not
/// model the job yet ([`step::models`]).
///
/// # Errors
/// The job is invalid for the model ([`Job::validate`]).
pub fn for_job<'m>(
    model: &'m ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) -> Result<Option<Trace<'m>>, JobError> {
    job.validate(model)?;
    let regime = Regime::resolve(model, job);
    Ok(step::trace(model, job, &regime, device))
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
/// the names, a third of its size (the replay of a 70B step streams 140,000 of them).
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

/// A step's events in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trace<'m> {
    /// Allocations and frees with what they name ([`step::trace`]; empty in a trace made
    /// for the levels alone, [`step::lean_trace`]).
    pub events: Vec<TraceEvent<'m>>,
    /// The same allocations and frees as the levels and the replay read them.
    #[serde(skip)]
    pub lean: Vec<Event>,
    /// The decoder layers are traced op by op (LoRA or QLoRA on a Llama-style layer, `step`'s
    /// `decoder_layer`), not as their saved bytes cut into shapes.
    #[serde(skip)]
    pub op_by_op: bool,
}

/// More than the variants of [`Component`] and of [`Phase`]: their slots in a table.
const SLOTS: usize = 16;
const _: () =
    assert!((Component::CudaContext as usize) < SLOTS && (Phase::Decode as usize) < SLOTS);

/// The peaks of a trace replayed through the allocator model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// The largest total of live blocks (each request rounded as the allocator rounds it).
    pub allocated: u64,
    /// The largest total of `cudaMalloc`ed segments.
    pub reserved: u64,
}

impl Trace<'_> {
    /// The largest total of live tensors, each rounded as the allocator rounds requests
    /// (`round_size`), and the index of the event that reached it.
    #[must_use]
    pub fn peak(&self) -> (u64, usize) {
        let mut live = 0u64;
        let mut peak = (0, 0);
        for (i, e) in self.lean.iter().enumerate() {
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
    /// phases first appear: the estimate's phases read off the trace. An allocation is made
    /// in the phase it names; a peak is always reached at an allocation (the first time,
    /// where it is reached again).
    #[must_use]
    pub fn phases(&self) -> Vec<PhaseBytes> {
        // One pass finds each phase's peak, a second reads the components off it.
        let mut live = [0u64; SLOTS];
        let mut total = 0u64;
        let mut best: Vec<(Phase, u64, usize)> = Vec::new();
        let mut slot_of_phase = [usize::MAX; SLOTS];
        let mut components: Vec<Component> = Vec::new();
        for (i, e) in self.lean.iter().enumerate() {
            let b = round_size(e.bytes);
            let c = e.component as usize;
            match e.op {
                Op::Alloc => {
                    if live[c] == 0 && !components.contains(&e.component) {
                        components.push(e.component);
                    }
                    live[c] += b;
                    total += b;
                }
                Op::Free => {
                    live[c] -= b;
                    total -= b;
                    continue;
                }
            }
            let p = e.phase as usize;
            if slot_of_phase[p] == usize::MAX {
                slot_of_phase[p] = best.len();
                best.push((e.phase, 0, i));
            }
            let slot = &mut best[slot_of_phase[p]];
            if total > slot.1 {
                slot.1 = total;
                slot.2 = i;
            }
        }
        let mut at: Vec<(usize, usize)> = best.iter().enumerate().map(|(k, b)| (b.2, k)).collect();
        at.sort_unstable();
        let mut out: Vec<PhaseBytes> = best
            .iter()
            .map(|b| PhaseBytes {
                phase: b.0,
                components: Vec::new(),
            })
            .collect();
        let mut live = [0u64; SLOTS];
        let mut next = at.iter().peekable();
        for (i, e) in self.lean.iter().enumerate() {
            let Some(&&(peak_at, _)) = next.peek() else {
                break;
            };
            let b = round_size(e.bytes);
            match e.op {
                Op::Alloc => live[e.component as usize] += b,
                Op::Free => live[e.component as usize] -= b,
            }
            while let Some(&&(j, k)) = next.peek() {
                if j != i {
                    break;
                }
                out[k].components = components
                    .iter()
                    .map(|&c| (c, live[c as usize]))
                    .filter(|c| c.1 > 0)
                    .collect();
                next.next();
            }
            debug_assert!(peak_at >= i);
        }
        out
    }

    /// Replays the trace through [`CachingAllocator`].
    #[must_use]
    pub fn replay(&self) -> Replayed {
        let mut a = CachingAllocator::new();
        let mut handles: Vec<Option<Handle>> = Vec::with_capacity(self.lean.len() / 2 + 1);
        for e in &self.lean {
            let i = e.tensor as usize;
            match e.op {
                Op::Alloc => {
                    if handles.len() <= i {
                        handles.resize(i + 1, None);
                    }
                    handles[i] = Some(a.malloc_on(Stream(e.stream), e.bytes));
                }
                Op::Free => {
                    if let Some(h) = handles.get_mut(i).and_then(Option::take) {
                        a.free(h);
                    }
                }
            }
        }
        Replayed {
            allocated: a.peak_allocated(),
            reserved: a.peak_reserved(),
        }
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

/// Writes a trace: the current phase and step, and numbered tensors.
#[derive(Debug, Default)]
pub(crate) struct Builder<'m> {
    events: Vec<TraceEvent<'m>>,
    lean: Vec<Event>,
    /// Whether to keep the named events too.
    named: bool,
    next: u32,
    phase: Option<Phase>,
    step: u8,
}

impl<'m> Builder<'m> {
    /// A builder with room for `events` events, which keeps their names where `named`.
    pub(crate) fn with_capacity(events: usize, named: bool) -> Self {
        Self {
            events: Vec::with_capacity(if named { events } else { 0 }),
            lean: Vec::with_capacity(events),
            named,
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

    /// Releases every tensor of `ts`.
    pub(crate) fn free_all(&mut self, ts: Vec<Tensor<'m>>) {
        for t in ts {
            self.free(t);
        }
    }

    fn push(&mut self, op: Op, t: &Tensor<'m>) {
        let phase = self.phase.unwrap_or(Phase::Load);
        self.lean.push(Event {
            bytes: t.bytes,
            tensor: t.id,
            stream: 0,
            op,
            component: t.component,
            phase,
        });
        if !self.named {
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

    pub(crate) fn finish(self) -> Trace<'m> {
        Trace {
            events: self.events,
            lean: self.lean,
            op_by_op: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Weights, then a forward whose live total peaks twice at the same height (the first
    /// counts), then a backward that peaks higher after the forward's components changed.
    fn small_step(named: bool) -> Trace<'static> {
        let mut b = Builder::with_capacity(16, named);
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
        b.finish()
    }

    /// Each phase's peak and the components then, by hand: loading 10 MiB of weights; the
    /// forward's first 20 MiB (weights, 4 MiB saved, 6 MiB of logits), not the second
    /// (weights, 10 MiB saved); the backward's 25 MiB (weights, 6 MiB saved, 9 MiB of
    /// gradients).
    #[test]
    fn phases_are_read_off_each_phases_first_peak() {
        let t = small_step(false);
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

    /// A lean trace is the named one without the names: the same events, in order.
    #[test]
    fn a_lean_trace_has_the_named_traces_events() {
        let (lean, named) = (small_step(false), small_step(true));
        assert!(lean.events.is_empty());
        assert_eq!(lean.lean, named.lean);
        assert_eq!(named.events.len(), named.lean.len());
        for (e, l) in named.events.iter().zip(&named.lean) {
            assert_eq!(
                (e.op, e.tensor, e.bytes, e.component, e.phase, e.stream),
                (l.op, l.tensor, l.bytes, l.component, l.phase, l.stream)
            );
        }
    }
}
