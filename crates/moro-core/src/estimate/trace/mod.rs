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

/// A step's events in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trace<'m> {
    /// Allocations and frees.
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
    /// phases first appear: the estimate's phases read off the trace. An allocation is made
    /// in the phase it names; a peak is always reached at an allocation.
    #[must_use]
    pub fn phases(&self) -> Vec<PhaseBytes> {
        let mut live: Vec<(Component, u64)> = Vec::new();
        let mut total = 0u64;
        let mut out: Vec<PhaseBytes> = Vec::new();
        let mut best: Vec<u64> = Vec::new();
        for e in &self.events {
            let b = round_size(e.bytes);
            let slot = match live.iter_mut().find(|x| x.0 == e.component) {
                Some(x) => x,
                None => {
                    live.push((e.component, 0));
                    live.last_mut().expect("just pushed")
                }
            };
            match e.op {
                Op::Alloc => {
                    slot.1 += b;
                    total += b;
                }
                Op::Free => {
                    slot.1 -= b;
                    total -= b;
                    continue;
                }
            }
            let i = match out.iter().position(|p| p.phase == e.phase) {
                Some(i) => i,
                None => {
                    out.push(PhaseBytes {
                        phase: e.phase,
                        components: Vec::new(),
                    });
                    best.push(0);
                    out.len() - 1
                }
            };
            if total > best[i] {
                best[i] = total;
                out[i].components.clear();
                out[i]
                    .components
                    .extend(live.iter().filter(|c| c.1 > 0).copied());
            }
        }
        out
    }

    /// Replays the trace through [`CachingAllocator`].
    #[must_use]
    pub fn replay(&self) -> Replayed {
        let mut a = CachingAllocator::new();
        let mut handles: Vec<Option<Handle>> = Vec::with_capacity(self.events.len() / 2 + 1);
        for e in &self.events {
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
    next: u32,
    phase: Option<Phase>,
    step: u8,
}

impl<'m> Builder<'m> {
    /// A builder with room for `events` events.
    pub(crate) fn with_capacity(events: usize) -> Self {
        Self {
            events: Vec::with_capacity(events),
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
        self.events.push(TraceEvent {
            op,
            tensor: t.id,
            name: t.name,
            module: t.module,
            layer: t.layer,
            component: t.component,
            phase: self.phase.unwrap_or(Phase::Load),
            step: self.step,
            bytes: t.bytes,
            dtype_bytes: t.dtype_bytes,
            stream: 0,
        });
    }

    pub(crate) fn finish(self) -> Trace<'m> {
        Trace {
            events: self.events,
            op_by_op: false,
        }
    }
}
