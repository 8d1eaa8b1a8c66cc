//! FSDP's own streams: what a rank allocates on the streams FSDP gathers and reduces on,
//! and what their pools keep cached that the compute stream cannot use.
//!
//! PyTorch's caching allocator hands a cached block only to a request on the stream that
//! allocated it ([`crate::caching_allocator`]). FSDP1 gathers each unit into a buffer made on
//! its unshard stream and reduce-scatters on its post-backward stream, where it also makes the
//! sharded gradient that `.grad` keeps (torch 2.15 `fsdp/_runtime_utils.py`: `_unshard` runs
//! `handle.unshard()` under `state._unshard_stream`; `_post_backward_hook` runs `_reduce_grad`
//! under `state._post_backward_stream`, whose `_get_reduce_scatter_tensors` makes the output
//! and `_cast_grad_to_param_dtype` its fp32 copy). FSDP2 makes each unit's all-gather output on
//! its copy-in stream and copies the parameters out on the compute stream; it makes the
//! reduce-scatter output and the sharded gradient cast from it on its reduce-scatter stream
//! (`fsdp/_fully_shard/_fsdp_collectives.py`: `foreach_all_gather`, `foreach_reduce`).
//!
//! So after the optimizer step, `zero_grad(set_to_none=True)` frees the gradients into the
//! reduce-scatter stream's pool, where the next forward cannot reuse them, and the gathered
//! units' blocks stay with the all-gather stream through the optimizer step. What those pools
//! reserve beyond what is live at a moment adds to that moment's reserved level.

use crate::caching_allocator::{CachingAllocator, Handle, Stream};
use crate::job::{FsdpApi, Job};

use super::Phase;
use super::parallel::{FsdpStreams, Sharded};

/// Bytes of one of FSDP's streams: live at a moment, and reserved by its pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pool {
    /// Allocated on this stream and live at the moment.
    pub live: u64,
    /// Reserved by the stream's pool over the step (segments it `cudaMalloc`ed).
    pub reserved: u64,
}

impl Pool {
    /// Reserved and not live: blocks only this stream can use.
    #[must_use]
    pub const fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.live)
    }
}

/// FSDP's side streams at one moment of the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SideStreams {
    /// FSDP1's unshard stream, FSDP2's all-gather copy-in stream.
    pub all_gather: Pool,
    /// FSDP1's pre-unshard stream, where its mixed precision casts each shard to the
    /// gather dtype (nothing lives there between gathers) or, under CPU offload, copies it
    /// from the host (kept while its unit is gathered).
    pub pre_unshard: Pool,
    /// FSDP1's post-backward stream, FSDP2's reduce-scatter stream.
    pub reduce_scatter: Pool,
}

impl SideStreams {
    /// Reserved by the pools and not live at the moment.
    #[must_use]
    pub const fn cached(&self) -> u64 {
        self.all_gather.cached() + self.pre_unshard.cached() + self.reduce_scatter.cached()
    }
}

/// FSDP's streams over a step of one rank: what each pool reserves, replayed once, from
/// which each moment's [`SideStreams`] is read ([`Self::at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    st: FsdpStreams,
    all_gather: u64,
    pre_unshard: u64,
    reduce_scatter: u64,
}

impl Streams {
    /// The pools of `par`'s FSDP streams; `None` for a job FSDP does not shard.
    #[must_use]
    pub fn of(par: &Sharded) -> Option<Self> {
        let st = par.fsdp_streams?;
        Some(Self {
            st,
            all_gather: all_gather_reserved(&st),
            pre_unshard: pre_unshard_reserved(&st),
            reduce_scatter: reduce_scatter_reserved(&st),
        })
    }

    /// The streams at `phase`; `at_root` says the end of backward is the root unit's
    /// backward (the layers resharded), not the first layer's.
    #[must_use]
    pub fn at(&self, par: &Sharded, job: &Job, phase: Phase, at_root: bool) -> SideStreams {
        let st = &self.st;
        let (gathered, grads) = live(par, st, job, phase, at_root);
        // Under CPU offload each gathered unit holds its shard's copy beside it, made on the
        // pre-unshard stream: a `1 / (group + 1)` share of what is gathered.
        let copies = if st.offloaded_shards {
            gathered / (st.group.max(1) + 1)
        } else {
            0
        };
        SideStreams {
            all_gather: Pool {
                live: gathered - copies,
                reserved: self.all_gather,
            },
            pre_unshard: Pool {
                live: copies,
                reserved: self.pre_unshard,
            },
            reduce_scatter: Pool {
                live: grads,
                reserved: self.reduce_scatter,
            },
        }
    }
}

/// Bytes live on the all-gather and the reduce-scatter stream at `phase`.
fn live(par: &Sharded, st: &FsdpStreams, job: &Job, phase: Phase, at_root: bool) -> (u64, u64) {
    let gathered = match (st.api, phase) {
        // FSDP1 keeps each unit in the buffer its all-gather filled.
        (FsdpApi::Fsdp1, Phase::ForwardEnd | Phase::LossBackward) => par.gathered_at_loss,
        (FsdpApi::Fsdp1, Phase::LayerBackward) => par.gathered_params,
        (FsdpApi::Fsdp1, Phase::BackwardEnd) if at_root => par.gathered_root,
        (FsdpApi::Fsdp1, Phase::BackwardEnd) => par.gathered_params,
        // FSDP2: the prefetched unit's all-gather output, while a layer's backward runs.
        (FsdpApi::Fsdp2, Phase::LayerBackward) => st.unit,
        _ => 0,
    };
    // The sharded gradients the reduce-scatters made and `.grad` keeps. Under CPU offload
    // FSDP1 still keeps each on the GPU (`_saved_grad_shard`, `_accumulate_sharded_grad`)
    // until the final callback hands `.grad` the host copy (`prepare_gradient_for_optim`);
    // FSDP2 frees it once copied.
    let kept_between_steps = job.grad_accum > 1 || job.versions.zero_grad_keeps_grads();
    let grads = match phase {
        Phase::BackwardEnd if !st.grads_to_host || st.api == FsdpApi::Fsdp1 => {
            par.grads.saturating_sub(st.root_grad)
        }
        _ if st.grads_to_host => 0,
        Phase::OptimizerStep => par.grads,
        Phase::ForwardEnd | Phase::LossBackward | Phase::LayerBackward if kept_between_steps => {
            par.grads
        }
        _ => 0,
    };
    (gathered, grads)
}

const SIDE: Stream = Stream(1);

/// The all-gather stream's pool over a step: FSDP1 keeps the root unit gathered and two
/// layer units at once (the running and the prefetched one, `limit_all_gathers`); FSDP2 two
/// all-gather outputs at once. Replayed through the allocator model for its rounding.
fn all_gather_reserved(st: &FsdpStreams) -> u64 {
    let mut a = CachingAllocator::new();
    if st.api == FsdpApi::Fsdp1 && st.root > 0 {
        a.malloc_on(SIDE, st.root);
    }
    two_at_a_time(&mut a, st.unit, st.units);
    a.peak_reserved()
}

/// FSDP1's pre-unshard stream's pool: the root's low-precision shard and those of the two
/// units whose all-gathers may be in flight (each is freed once its all-gather has read
/// it: `_free_low_precision_sharded_param` after a `record_stream` on the unshard stream),
/// or under CPU offload the shards copied from the host, two units' at a time.
fn pre_unshard_reserved(st: &FsdpStreams) -> u64 {
    if !st.low_precision_shards && !st.offloaded_shards {
        return 0;
    }
    let mut a = CachingAllocator::new();
    let group = st.group.max(1);
    if st.root > 0 {
        a.malloc_on(SIDE, st.root / group);
    }
    two_at_a_time(&mut a, st.unit / group, st.units);
    a.peak_reserved()
}

/// `size`-byte blocks for `count` units, two live at a time: the third gather waits for the
/// first unit's free (FSDP1's `limit_all_gathers` rate limiter, `_free_event_queue` of two).
fn two_at_a_time(a: &mut CachingAllocator, size: u64, count: u64) {
    if size == 0 {
        return;
    }
    let mut held: Vec<Handle> = Vec::new();
    for _ in 0..count.clamp(1, 3) {
        if held.len() == 2 {
            a.free(held.remove(0));
        }
        held.push(a.malloc_on(SIDE, size));
    }
}

/// The reduce-scatter stream's pool over a step: each unit's sharded gradient, made in
/// backward and kept to the optimizer step (under CPU offload: to the end of backward, or
/// FSDP2 until its copy to the host),
/// each after a reduce-scatter output in the reduce dtype when it is cast from one.
fn reduce_scatter_reserved(st: &FsdpStreams) -> u64 {
    let mut a = CachingAllocator::new();
    let grads = std::iter::repeat_n(st.unit_grad, usize::try_from(st.units).unwrap_or(0))
        .chain((st.root_grad > 0).then_some(st.root_grad));
    for grad in grads.filter(|&g| g > 0) {
        let output = st
            .cast_from
            .map(|(kept, reduced)| a.malloc_on(SIDE, grad / kept.max(1) * reduced));
        let kept = a.malloc_on(SIDE, grad);
        if let Some(o) = output {
            a.free(o);
        }
        // FSDP2 frees a gradient once it is copied to the host; FSDP1 at the end of
        // backward.
        if st.grads_to_host && st.api == FsdpApi::Fsdp2 {
            a.free(kept);
        }
    }
    a.peak_reserved()
}
