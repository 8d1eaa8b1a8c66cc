//! Resident bytes per GPU under data, tensor and pipeline parallelism, DeepSpeed ZeRO and
//! FSDP (memory-anatomy §9).
//!
//! One GPU is the case `data_parallel = tensor_parallel = pipeline = 1`, no sharding.

use crate::job::{Job, Method, Offload, Sharding};
use crate::model::ModelSpec;

use super::Regime;
use super::optimizer;
use super::weights::{adapter_kv_cache_bytes, added_params, base_weight_bytes, grad_params};

/// Per-GPU resident memory and communication buffers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sharded {
    /// Base weights held by this GPU (its shard, or all of them).
    pub weights: u64,
    /// Adapter weights.
    pub adapters: u64,
    /// Gradients held at the end of backward.
    pub grads: u64,
    /// Gradients already produced when the last layer's backward runs (full FT: lm_head).
    pub head_grads: u64,
    /// FSDP, full fine-tuning: the root unit's gradient as autograd assembles it at the end
    /// of backward ([`fsdp_root_grad`]); 0 otherwise.
    pub root_grad_assembly: u64,
    /// FSDP, full fine-tuning: the root unit's share of `grads`, which its reduce-scatter
    /// makes only after that assembly (until then it is not in `.grad`); 0 otherwise.
    pub root_grads: u64,
    /// FSDP: the root unit as gathered (the whole unit, beside the local shard), from
    /// forward to the end of backward (part of `gathered_params`); 0 otherwise.
    pub gathered_root: u64,
    /// Optimizer states (and fp32 master weights) on this GPU.
    pub states_on_gpu: u64,
    /// Temporaries of the optimizer step.
    pub step_transient: u64,
    /// Communication buffers during the step (ZeRO-1/2 all-gather of updated params).
    pub step_comm: u64,
    /// Reduce buckets (DeepSpeed) / DDP buckets alive in forward and backward.
    pub comm_buffers: u64,
    /// Buffers that exist only during backward: DeepSpeed ZeRO-1/2's contiguous-gradient
    /// `ipg_buffer`s, allocated at the start of every `backward()` and released after it
    /// (`stage_1_and_2.py` `backward` / `_release_ipg_buffers`).
    pub backward_buffers: u64,
    /// FSDP: a unit's gradient as autograd assembles it (its pieces and their
    /// concatenation), in the layers' backward only — not yet in the loss's.
    pub unit_grad_assembly: u64,
    /// Parameters gathered from other shards (ZeRO-3 / FSDP units, current + prefetched).
    pub gathered_params: u64,
    /// Parameters gathered at the end of forward and in the loss's backward: ZeRO-3 keeps
    /// lm_head's from its forward to its backward ([`zero3_live_params`]); otherwise
    /// `gathered_params`.
    pub gathered_at_loss: u64,
    /// Host memory for offloaded states / params, per GPU process (rank).
    pub host_bytes: u64,
    /// Optimizer-state bytes in CUDA managed memory (bitsandbytes paged optimizers) on this
    /// GPU: nvidia-smi shows them when resident, `memory_allocated` does not.
    pub paged_states: u64,
    /// FSDP1 keeps every recomputed layer input, and the gradient accumulated into it,
    /// until the end of backward ([`fsdp1_holds_recomputed_inputs`]).
    pub holds_recomputed_inputs: bool,
    /// Tensor-parallel degree (activations and logits are split by it).
    pub tp: u64,
    /// FSDP: what this rank allocates on FSDP's own streams ([`super::streams`]); `None`
    /// otherwise.
    pub fsdp_streams: Option<FsdpStreams>,
}

/// The blocks an FSDP rank allocates on the streams FSDP gathers and reduces on, by size
/// ([`super::streams`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsdpStreams {
    /// The implementation (FSDP1's unshard stream holds the gathered units; FSDP2's copy-in
    /// stream only each unit's all-gather output).
    pub api: crate::job::FsdpApi,
    /// One layer unit as gathered.
    pub unit: u64,
    /// The root unit as gathered (0 when it is not gathered apart).
    pub root: u64,
    /// Layer units on this rank (its pipeline stage's).
    pub units: u64,
    /// One layer unit's sharded gradient as kept in `.grad`.
    pub unit_grad: u64,
    /// The root unit's sharded gradient (0 for PEFT: the root is frozen).
    pub root_grad: u64,
    /// Bytes per element of the gradient as kept, and of the reduce-scatter output it is
    /// cast from when FSDP's mixed precision reduces in another dtype (bf16 reduced, fp32
    /// kept); `None` when the output is the gradient itself.
    pub cast_from: Option<(u64, u64)>,
    /// Gradients are copied to the host after their reduce-scatter (CPU offload).
    pub grads_to_host: bool,
    /// FSDP1's mixed precision casts a unit's shard to the gather dtype before its
    /// all-gather, on the pre-unshard stream (`FlatParamHandle._use_low_precision_shard`:
    /// `_mp_shard`); `false` when the shard is stored in that dtype.
    pub low_precision_shards: bool,
    /// FSDP1 under CPU offload copies a unit's shard from the host before its all-gather
    /// and keeps the copy until the unit reshards (`FlatParamHandle.pre_unshard`:
    /// `flat_param_to`): the gathered sizes above are without it.
    pub offloaded_shards: bool,
    /// Ranks a unit is sharded over.
    pub group: u64,
}

/// Whether the strategy is DeepSpeed's (16-bit model, fp32 master weights in the partitions,
/// no autocast: `native_amp` is False for DEEPSPEED).
#[must_use]
pub const fn is_deepspeed(s: Sharding) -> bool {
    matches!(s, Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3)
}

impl Sharded {
    /// Resident bytes of `job` per GPU.
    #[must_use]
    #[allow(clippy::too_many_lines)]
    pub fn new(model: &ModelSpec, job: &Job, r: &Regime) -> Self {
        let p = &job.parallel;
        let tp = p.tensor_parallel.max(1);
        let pp = p.pipeline.max(1);
        let split = tp * pp;
        let n = p.data_parallel.max(1);
        let total = model.total_params();
        let h = model.hidden_size;
        let full = job.method == Method::Full;
        let tb = optimizer::trainable_bytes(job, r);
        // Parameters with gradients (and optimizer states).
        let trainable = if full {
            super::regime::full_trainable_params(model, job)
        } else {
            grad_params(model, job)
        };
        let base = base_weight_bytes(model, job, r) / split;
        let adapters = if job.method.is_peft() {
            (added_params(model, job) * r.adapter_bytes
                + adapter_kv_cache_bytes(model, job.adapter.method, r.adapter_bytes)
                + super::weights::peft_buffers(model, job))
                / split
        } else {
            0
        };
        // Optimizer states, once: (inside PyTorch's allocator, paged), whole model.
        let (states_all, paged_all) = optimizer::states(model, job, r);
        let states = states_all / split;
        let paged_states = if job.method == Method::Inference
            || !job.optimizer.is_paged()
            || !matches!(p.offload, Offload::None)
        {
            0
        } else {
            paged_all / optimizer::shard_divisor(job)
        };
        let mut grads = trainable * tb / split;
        let mut step_transient = optimizer::step_transient(model, job, r) / split;
        // lm_head's gradient (an encoder's: pooler and classifier) exists from the loss
        // backward on.
        let mut head_grads = match (&model.encoder, full) {
            (_, false) => 0,
            (Some(enc), true) => enc.head_params(h) * tb / tp,
            (None, true) => model.vocab_size * h * tb / tp,
        };
        if job.optimizer_in_backward {
            // Each parameter is stepped and its gradient freed in its post-accumulate-grad
            // hook (torchtune `register_optim_in_bwd_hooks`): one parameter's gradient, and
            // one parameter's step temporaries, at a time.
            let largest = optimizer::trainable_tensors(model, job)
                .iter()
                .map(|t| t.numel)
                .max()
                .unwrap_or(0);
            grads = grads.min(largest * tb / split);
            head_grads = head_grads.min(grads);
            // foreach AdamW's sqrt copy now covers one tensor; Adafactor's figure is already
            // per tensor.
            if job.optimizer == crate::job::Optimizer::AdamwTorch {
                step_transient = step_transient.min(largest * tb / split);
            }
        }
        let layer_params = model
            .layers
            .iter()
            .map(crate::model::LayerGroup::layer_params)
            .max()
            .unwrap_or(0)
            / tp;
        // Bytes of one layer as stored (at most 2 B per parameter: units are gathered in
        // 16-bit), and its trainable share.
        let layers = model.num_layers.max(1);
        let non_layer = total.saturating_sub(model.layer_params());
        // bitsandbytes' 4-bit quantization states are not parameters: FSDP neither flattens
        // nor gathers them (they stay whole on every rank: `RankParts::replicated`).
        let base_all = base_weight_bytes(model, job, r)
            .saturating_sub(super::weights::bnb4_quant_state_bytes(model, job));
        let layer_bytes_all =
            base_all.saturating_sub(non_layer * r.frozen_bytes.max(r.param_bytes));
        let unit_bytes = (layer_bytes_all / layers).min(layer_params * 2) / tp;
        let unit_trainable = if full {
            0
        } else {
            trainable * tb / layers / tp
        };
        let mut s = Self {
            weights: base,
            adapters,
            grads,
            head_grads,
            root_grad_assembly: 0,
            root_grads: 0,
            gathered_root: 0,
            unit_grad_assembly: 0,
            states_on_gpu: states,
            step_transient,
            step_comm: 0,
            comm_buffers: 0,
            backward_buffers: 0,
            gathered_params: 0,
            gathered_at_loss: 0,
            host_bytes: 0,
            paged_states,
            holds_recomputed_inputs: false,
            tp,
            fsdp_streams: None,
        };
        if job.method == Method::Inference {
            return s;
        }
        let sharding = p.sharding;
        if n == 1 && sharding == Sharding::None {
            return s;
        }
        // DeepSpeed's "auto" reduce bucket as the HF integration fills it: h·h elements
        // (`integrations/deepspeed.py`), 16-bit.
        let bucket = p.reduce_bucket.unwrap_or(h * h) * 2;
        match sharding {
            Sharding::None => {
                // DDP keeps gradient buckets; with `gradient_as_bucket_view=False` (default)
                // they are a second copy of all gradients.
                if r.ddp_bucket_copy {
                    s.comm_buffers = grads;
                }
            }
            Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3 => {
                // DeepSpeed: 16-bit params and grads; the partitions hold fp32 master
                // weights (4), fp32 gradient partitions (4) and Adam states (8):
                // `estimate_zero2_model_states_mem_needs`: `2 * total_params +
                // int(18 * total_params / total_gpus)`; ZeRO-3:
                // `largest_layer_memory + 18·P/N`.
                let states_fp32 = if full {
                    deepspeed_state_bytes(model, job, r) + trainable * (4 + 4)
                } else {
                    states + trainable * 4
                } / split;
                let p16 = if full { total * 2 / split } else { base };
                let g16 = trainable * 2 / split;
                let offload_opt = !matches!(p.offload, Offload::None);
                let offload_params =
                    matches!(p.offload, Offload::OptimizerAndParams) && sharding == Sharding::Zero3;
                // No stage keeps fp32 gradients between steps: the optimizer step makes them
                // (per parameter group, or per ZeRO-3 sub-group) and frees them
                // ([`zero12_step_transient`], [`zero3_step_transient`]). `states_fp32`
                // counts them for full fine-tuning only.
                let fp32_grads = if full { trainable * 4 / split } else { 0 };
                let states_on_gpu = if offload_opt {
                    0
                } else {
                    states_fp32.saturating_sub(fp32_grads) / n
                };
                // DeepSpeed's engine casts the whole module to its 16-bit dtype
                // (`_configure_distributed_model`: `self.module.half()` / `.bfloat16()`), the
                // adapters included; their fp32 copies are the partitions' master weights.
                // ZeRO-3 partitions them like every other parameter.
                s.adapters = if full {
                    0
                } else if job.precision == crate::job::Precision::Fp32 {
                    adapters
                } else {
                    (added_params(model, job) * 2
                        + adapter_kv_cache_bytes(model, job.adapter.method, 2))
                        / split
                };
                if sharding == Sharding::Zero3 {
                    s.adapters /= n;
                }
                match sharding {
                    Sharding::Zero1 => {
                        s.weights = p16;
                        s.grads = g16;
                        s.states_on_gpu = states_on_gpu;
                        s.backward_buffers = bucket;
                        s.step_comm = bucket;
                    }
                    Sharding::Zero2 => {
                        s.weights = p16;
                        s.grads = g16 / n;
                        s.states_on_gpu = states_on_gpu;
                        // contiguous_gradients' `ipg_buffer` + overlap_comm's second one,
                        // during backward; the reduced gradient partition persists.
                        s.backward_buffers = 2 * bucket;
                        s.comm_buffers = g16 / n;
                        s.step_comm = bucket;
                    }
                    _ => {
                        s.weights = if offload_params { 0 } else { p16 / n };
                        s.grads = g16 / n;
                        s.states_on_gpu = states_on_gpu;
                        s.comm_buffers = bucket;
                        // One rank gathers nothing: with a single partition
                        // `all_gather_coalesced` returns `_no_gather_coalesced`, which points
                        // each parameter at its partition (`partition_parameters.py`) — a
                        // copy only when the partition was offloaded to the host.
                        if n > 1 || offload_params {
                            let live = zero3_live_params(model, job, r);
                            s.gathered_params = live.in_layers;
                            s.gathered_at_loss = live.at_loss;
                        }
                    }
                }
                s.head_grads = match (&model.encoder, full) {
                    (_, false) => 0,
                    (Some(enc), true) => enc.head_params(h) * 2 / tp / n,
                    (None, true) => model.vocab_size * h * 2 / tp / n,
                };
                s.step_transient = match (sharding, offload_opt) {
                    (_, true) => 0,
                    (Sharding::Zero3, false) => zero3_step_transient(model, job),
                    (_, false) => zero12_step_transient(model, job),
                };
                if offload_opt {
                    // Per rank, DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs`
                    // divided by the ranks sharing the host: the partition's fp32 master
                    // weights, fp32 gradients and Adam's two moments (16 B per trainable
                    // parameter; `18` with offloaded 16-bit params), times its
                    // `additional_buffer_factor` 1.5 (pinned staging buffers). With ZeRO-3
                    // parameter offload the frozen weights' partition (as loaded: 16-bit, or
                    // fp32 for an fp32 model) lives there too. The full copy every process
                    // loads before ZeRO-1/2 partitions (`4 * num_gpus_per_node`) is a
                    // start-up transient and not counted.
                    let params = if offload_params {
                        if full { total * 2 / split } else { base }
                    } else {
                        0
                    };
                    s.host_bytes = (trainable * 16 / split + params) * 3 / 2 / n;
                }
            }
            Sharding::FsdpFullShard | Sharding::FsdpShardGradOp | Sharding::FsdpHybridShard => {
                // HYBRID_SHARD fully shards within a node and replicates across nodes: the
                // group is one node's data-parallel ranks (`Parallel::hybrid_shard_group`).
                let group = if sharding == Sharding::FsdpHybridShard {
                    p.hybrid_shard_group()
                } else {
                    n
                };
                let offload = !matches!(p.offload, Offload::None);
                // Under FSDP's MixedPrecision (accelerate's bf16/fp16) a full fine-tune's
                // units are gathered, and their gradients computed and reduce-scattered, in
                // 16-bit; the sharded fp32 gradient is made from the reduced one
                // (`_reduce_grad`: `_cast_grad_to_param_dtype`). fp32 jobs stay fp32.
                let gather_bytes = if job.precision == crate::job::Precision::Fp32 {
                    4
                } else {
                    2
                };
                // Flat parameters in their load dtype, sharded; FSDP's MixedPrecision
                // all-gathers a unit in bf16. The all-gathered unit holds the layer as stored:
                // bf16 under FSDP's MixedPrecision, or the packed 4-bit storage for QLoRA
                // (quant storage dtype).
                match sharding {
                    Sharding::FsdpShardGradOp => {
                        s.weights = base + adapters;
                    }
                    _ => {
                        // 4-bit quantization states are not parameters: not sharded.
                        let states = super::weights::bnb4_quant_state_bytes(model, job) / tp;
                        s.weights = if offload {
                            states
                        } else {
                            (base.saturating_sub(states) + adapters) / group + states
                        };
                    }
                }
                s.adapters = 0;
                s.grads = grads / group;
                let lightning = job.stack.profile().fsdp == crate::stack::FsdpWrap::Lightning;
                if lightning && job.grad_accum > 1 {
                    // litgpt accumulates under `fabric.no_backward_sync` (FSDP `no_sync`):
                    // "FSDP will accumulate the full model gradients (instead of gradient
                    // shards)" (torch FSDP docs). Lightning sets `use_orig_params=True`, and a
                    // Block's flat parameter mixing frozen and LoRA weights requires grad as a
                    // whole (pytorch/pytorch#104690), so every Block holds an unsharded
                    // gradient in the param dtype, frozen weights included.
                    let blocks = model.layer_params() / tp;
                    let pb = if full { r.param_bytes } else { r.frozen_bytes };
                    s.grads = blocks * pb
                        + if full {
                            grads.saturating_sub(model.layer_params() * tb / tp)
                        } else {
                            0
                        };
                    // The root unit (embeddings, head) stays unsharded from forward to
                    // backward.
                    s.weights +=
                        base.saturating_sub(model.layer_params() * pb / tp) * (group - 1) / group;
                } else if sharding != Sharding::FsdpShardGradOp {
                    // The root unit (embeddings, final norm, lm_head) is never resharded after
                    // forward (torch 2.4 `_runtime_utils.py` `_post_forward_reshard`:
                    // `free_unsharded_flat_param = not state._is_root and …`); its backward
                    // runs at both ends of the backward pass (lm_head first, the embedding
                    // last), so it stays gathered throughout. Frozen under PEFT, it has no
                    // AccumulateGrad hook, and its post-backward reshard-only hook waits on
                    // forward inputs that require grad, which the root has none of (token
                    // ids): only `_catch_all_reshard` in `_post_backward_final_callback` frees
                    // it. So it is gathered from forward to backward's end (the rank traces
                    // of `validation/oracle-traces/fsdp-*` list it unsharded at the peak,
                    // full and PEFT, with CPU offload too: FSDP1 and FSDP2's in
                    // `fsdp-offload.jsonl`, `fsdp-llama-3.2-1b.jsonl`). Gathered in the
                    // MixedPrecision dtype (16-bit) for full fine-tuning; as loaded under
                    // PEFT: the root is never quantized. The all-gather fills a new buffer of
                    // the whole unit (`_alloc_storage(unsharded_flat_param)`; FSDP2's
                    // all-gather output), the local shard kept beside it.
                    let bytes = if full {
                        gather_bytes
                    } else {
                        r.unquantized_bytes
                    };
                    s.gathered_root = non_layer * bytes / tp;
                }
                let root_gathered = s.gathered_root;
                // FSDP1 under CPU offload moves a unit's shard to the GPU before its
                // all-gather (torch 2.15 `_flat_param.py` `pre_unshard`:
                // `flat_param_to(self.device)`, on the pre-unshard stream), and the copy stays
                // the flat parameter's data until the unit reshards (`_use_sharded_flat_param`
                // points it back at the host shard): each gathered unit, the root too, holds
                // its shard beside it (`validation/oracle-traces/fsdp-offload.jsonl`). With a
                // mixed-precision cast the shard is cast instead, and that copy is freed after
                // the all-gather (`_free_low_precision_sharded_param`).
                let cast = tb > gather_bytes && !(lightning && job.grad_accum > 1);
                let fsdp1 = p.fsdp == crate::job::FsdpApi::Fsdp1;
                let shard_copies = offload && fsdp1 && !(full && cast);
                let unit_held = if shard_copies {
                    s.gathered_root += s.gathered_root / group;
                    unit_bytes + unit_bytes / group
                } else {
                    unit_bytes
                };
                // Layer units gathered while a layer's backward is at its widest (the MLP's):
                // the running one and the one prefetched for the next layer
                // (`BackwardPrefetch.BACKWARD_PRE`), except where PEFT's adapters are units of
                // their own under FSDP1. There the handle before a layer's in the execution
                // order is an adapter unit, so BACKWARD_PRE prefetches that, and the next layer
                // is gathered only when its own pre-backward hook fires, after the MLP's
                // backward (torch 2.15 `_runtime_utils.py` `_prefetch_handle`,
                // `_get_handle_to_prefetch`; the tiny QLoRA rank's events in
                // `validation/oracle-traces/fsdp-tiny-events.jsonl` order them so).
                let peft_units_apart = !full && !lightning && fsdp1;
                let layer_units = if peft_units_apart { 1 } else { 2 };
                s.gathered_params = layer_units * unit_held + s.gathered_root;
                // At the loss one layer unit is gathered beside the root: the last layer's,
                // prefetched for its backward (FSDP1 `BACKWARD_PRE`, torchtune's FSDP2; the
                // rank traces of `validation/oracle-traces/fsdp-world-8.jsonl` list it on the
                // unshard stream at the loss's peak, accelerate's FSDP2 none).
                s.gathered_at_loss = s.gathered_root + unit_held;
                s.states_on_gpu = if offload { 0 } else { states / group };
                // A unit's gradient as autograd assembles it, in backward only: its modules
                // run on views of the flat parameter (`_use_unsharded_views`: `torch.split`,
                // then `.view`s), so the flat parameter's gradient comes out of one
                // `SplitWithSizesBackward`, which waits for every view's gradient and
                // concatenates them: at the end of a unit's backward its pieces and their
                // concatenation coexist, before the post-backward hook reduce-scatters (or,
                // under `no_sync`, accumulates) it. The whole unit for full fine-tuning,
                // 16-bit under FSDP's mixed precision; for PEFT under Lightning
                // (`use_orig_params=True`, frozen and LoRA weights in one flat parameter that
                // requires grad as a whole, pytorch/pytorch#104690) the whole unit too, in
                // the param dtype; else the adapters' share.
                s.comm_buffers = 0;
                s.unit_grad_assembly = 2 * if full {
                    layer_params * 2
                } else if lightning {
                    layer_params * r.frozen_bytes
                } else {
                    unit_trainable
                };
                if full {
                    // lm_head's gradient waits, unsharded, for the rest of the root unit's.
                    let (piece, assembly) = fsdp_root_grad(model, gather_bytes, tp);
                    s.head_grads = piece;
                    s.root_grad_assembly = assembly;
                    // Under litgpt's `no_sync` accumulation every unit's gradient is already
                    // whole in `.grad`: no reduce-scatter to wait for.
                    if !(lightning && job.grad_accum > 1) {
                        s.root_grads = non_layer * tb / tp / group;
                    }
                } else {
                    s.head_grads = head_grads / group;
                }
                s.step_transient = step_transient / group;
                s.holds_recomputed_inputs = fsdp1_holds_recomputed_inputs(job);
                // The reduced gradient is cast to the parameter's dtype when FSDP's mixed
                // precision reduces in 16 bits and the trainable weights are fp32
                // (`_cast_grad_to_param_dtype`; FSDP2 `_cast_and_view_sharded_grads`).
                let unit_grad = if full {
                    layer_params * tb / group
                } else {
                    unit_trainable / group
                };
                s.fsdp_streams = Some(FsdpStreams {
                    api: p.fsdp,
                    unit: unit_bytes,
                    root: root_gathered,
                    units: layers / pp,
                    unit_grad,
                    root_grad: s.root_grads,
                    cast_from: cast.then_some((tb, gather_bytes)),
                    grads_to_host: offload,
                    low_precision_shards: full && cast && fsdp1,
                    offloaded_shards: shard_copies,
                    group,
                });
                if offload {
                    s.host_bytes = (base + adapters + states + grads) / group;
                }
            }
        }
        s
    }
}

/// Whether FSDP1 keeps each layer's recomputed input alive from that layer's backward to
/// the end of backward.
///
/// A PEFT job wrapped by the HF Trainer (`_fsdp_qlora_plugin_updates`: PEFT's
/// `fsdp_auto_wrap_policy`, the LoRA Linears in units of their own) leaves each decoder
/// layer's flat parameter frozen, so FSDP1's pre-forward registers a reshard-only hook on
/// the unit's inputs that require grad (torch `_runtime_utils.py`
/// `_register_post_backward_reshard_only_hook`: `register_multi_grad_hook(inp_tensors, …)`,
/// kept in `flat_param._post_backward_hook_state`). When a reentrant checkpoint wraps the
/// unit ([`crate::job::Versions::reentrant_checkpoint_wraps_layer_unit`]) that input is the
/// recompute's detached leaf (`CheckpointFunction.backward`: `detach_variable(inputs)`),
/// and the hook's closure holds its `AccumulateGrad` node (`register_multi_grad_hook`:
/// `grad_fns = list(map(_get_grad_fn_or_grad_acc, tensors))`), which holds the leaf: the
/// checkpoint it views and the gradient accumulated into its `.grad` stay until FSDP's
/// final callback removes the hook (`_finalize_params`: `_post_backward_hook_state[-1]
/// .remove()`). Rank traces with transformers 4.48 (`validation/oracle-traces/
/// fsdp-transformers-4.48.jsonl`) hold one checkpoint and one gradient per finished layer.
#[must_use]
pub fn fsdp1_holds_recomputed_inputs(job: &Job) -> bool {
    let profile = job.stack.profile();
    job.method.is_peft()
        && job.adapter.method == crate::job::PeftKind::Lora
        && job.gradient_checkpointing
        && profile.transformers_modules
        && profile.fsdp == crate::stack::FsdpWrap::PerUnit
        && job.versions.reentrant_checkpoint_wraps_layer_unit()
}

/// FSDP's root unit (embeddings, final norm, lm_head) under full fine-tuning: (lm_head's
/// gradient, alive from the loss's backward to the end; the assembly's peak at the end).
///
/// FSDP (v1) runs a unit's modules on views of its flat parameter
/// (`FlatParamHandle._use_unsharded_views`: `torch.split` of the unsharded flat parameter,
/// then `.view`s), so autograd reaches the flat parameter through one
/// `SplitWithSizesBackward`, which runs when every view's gradient has arrived and
/// concatenates them into a new flat gradient. For the root those are lm_head's, computed
/// in the loss's backward, and the embedding's, computed last: lm_head's waits in
/// autograd's input buffer through the whole backward, unsharded, and at the end the
/// pieces (one root's worth) and their concatenation (another) coexist, before the
/// post-backward hook reduce-scatters it. A tied embedding is one view whose two gradients
/// autograd sums first. Bytes over `tp` tensor-parallel ranks, at `gb` bytes per gradient
/// element.
#[must_use]
pub fn fsdp_root_grad(model: &ModelSpec, gb: u64, tp: u64) -> (u64, u64) {
    let tp = tp.max(1);
    let root = model.total_params().saturating_sub(model.layer_params());
    let head = if model.encoder.is_some() {
        0
    } else {
        model.vocab_size * model.hidden_size
    };
    (head * gb / tp, 2 * root * gb / tp)
}

/// Optimizer-state bytes DeepSpeed keeps for the whole job: the optimizer runs on its fp32
/// master partitions for full fine-tuning (states in fp32 where they follow the parameter's
/// dtype; bitsandbytes' 8-bit states stay 8-bit), as computed for PEFT (the adapters').
#[must_use]
pub fn deepspeed_state_bytes(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    if job.method == Method::Full {
        optimizer::trainable_tensors(model, job)
            .iter()
            .map(|t| {
                let (on, paged) = optimizer::state_bytes(t, job.optimizer, 4, r);
                on + paged
            })
            .sum()
    } else {
        optimizer::states(model, job, r).0
    }
}

/// DeepSpeed's `sub_group_size` default, 1e9 elements (`zero/config.py`
/// `sub_group_size: int = Field(1e9)`; HF's ZeRO-3 templates and Qwen's
/// `ds_config_zero3.json` set the same).
pub const ZERO3_SUB_GROUP_SIZE: u64 = 1_000_000_000;

/// Elements of each trainable parameter's partition on one rank, in `named_parameters` order
/// (embedding, each layer's Linears, lm_head): the order ZeRO-3 fills its sub-groups in.
/// Norms and biases are left out (a few thousand elements against a 1e9 sub-group).
#[must_use]
pub fn zero3_partitions(model: &ModelSpec, job: &Job) -> Vec<u64> {
    let p = &job.parallel;
    let div = p.data_parallel.max(1) * p.tensor_parallel.max(1) * p.pipeline.max(1);
    let mut out = Vec::new();
    if job.method == Method::Full {
        let h = model.hidden_size;
        out.push(model.vocab_size * h);
        for g in &model.layers {
            for _ in 0..g.count {
                for l in &g.linears {
                    let copies = l.count.max(1);
                    out.extend(std::iter::repeat_n(l.params() / copies, copies as usize));
                }
            }
        }
        if !model.tie_word_embeddings {
            out.push(model.vocab_size * h);
        }
    } else {
        for t in optimizer::trainable_tensors(model, job) {
            out.extend(std::iter::repeat_n(t.numel, t.copies as usize));
        }
    }
    for x in &mut out {
        *x = x.div_ceil(div);
    }
    out
}

/// ZeRO-3's sub-groups (DeepSpeed `stage3.py` `_create_fp16_sub_groups`): the whole group
/// when it is at most `sub_group_size`, else parameters taken in order until a sub-group
/// reaches it.
#[must_use]
pub fn zero3_sub_groups(partitions: &[u64]) -> Vec<u64> {
    let total: u64 = partitions.iter().sum();
    if total <= ZERO3_SUB_GROUP_SIZE {
        return vec![total];
    }
    let mut out = Vec::new();
    let mut acc = 0;
    for &x in partitions {
        acc += x;
        if acc >= ZERO3_SUB_GROUP_SIZE {
            out.push(acc);
            acc = 0;
        }
    }
    if acc > 0 {
        out.push(acc);
    }
    out
}

/// The largest temporary of ZeRO-3's optimizer step without optimizer offload, per rank
/// (DeepSpeed v0.11.1 `stage3.py` `step`, each freed before the next):
///
/// - `has_overflow`: `torch.isinf(self.grad_partitions_flat_buffer).any()`, then `isnan`: a
///   bool of every gradient element of the rank;
/// - `get_grad_norm_direct`: `g.double().norm(2)` per gradient partition: 8 bytes per
///   element of the largest one;
/// - `_prepare_fp32_grad_for_sub_group`: `self.flatten(self.averaged_gradients[i])` (16-bit)
///   and its `.to(float32)`, the sub-group's fp32 gradients, alive until
///   `_release_sub_group`: 6 bytes per element of the largest sub-group.
#[must_use]
pub fn zero3_step_transient(model: &ModelSpec, job: &Job) -> u64 {
    let parts = zero3_partitions(model, job);
    let all: u64 = parts.iter().sum();
    let widest = parts.iter().copied().max().unwrap_or(0);
    let group = zero3_sub_groups(&parts).into_iter().max().unwrap_or(0);
    all.max(8 * widest).max(6 * group)
}

/// The largest temporary of ZeRO-1/2's optimizer step without offload, per rank (DeepSpeed
/// v0.11.1 `stage_1_and_2.py` `step`, each freed before the next):
///
/// - `has_overflow_partitioned_grads_serial`: `x.float().sum()` per gradient piece of the
///   partition (4 bytes per element of the largest);
/// - `get_grad_norm_direct`: `g.data.double().norm(2)` per piece (8 bytes per element);
/// - per parameter group, `self.flatten(self.averaged_gradients[i]).to(float32)`: the 16-bit
///   flatten and the partition's fp32 gradients (6 bytes per element of the rank's
///   partition), the fp32 ones alive through `_optimizer_step` until
///   `single_partition_of_fp32_groups[i].grad = None`.
///
/// A piece is a parameter's overlap with the rank's contiguous partition: at most the
/// widest parameter, and at most the partition.
#[must_use]
pub fn zero12_step_transient(model: &ModelSpec, job: &Job) -> u64 {
    let p = &job.parallel;
    let n = p.data_parallel.max(1) * p.tensor_parallel.max(1) * p.pipeline.max(1);
    let parts = zero3_partitions(model, job);
    let partition: u64 = parts.iter().sum();
    let widest = parts.iter().copied().max().unwrap_or(0) * n;
    (6 * partition).max(8 * widest.min(partition))
}

/// DeepSpeed's defaults as the HF integration fills a ZeRO-3 config: the reuse distance
/// (`stage3_max_reuse_distance`, 1e9 elements in DeepSpeed's defaults and HF's templates)
/// and the prefetch bucket (`stage3_prefetch_bucket_size` "auto": `0.9 · h²` elements,
/// transformers `integrations/deepspeed.py`).
const ZERO3_MAX_REUSE_DISTANCE: u64 = 1_000_000_000;

/// Gathered 16-bit parameters of a ZeRO-3 step, per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zero3Live {
    /// While the layers run forward and backward.
    pub in_layers: u64,
    /// At the end of forward and in the loss's backward.
    pub at_loss: u64,
}

/// Parameters ZeRO-3 holds gathered (DeepSpeed `partitioned_param_coordinator.py`):
///
/// - each module fetches only its own parameters (`iter_params(module)`, not recursive) at
///   its pre-forward / pre-backward hook, and the coordinator prefetches the next modules' in
///   the recorded trace up to the prefetch bucket; a mixture-of-experts block is fetched
///   whole (HF marks it a `z3_leaf_module`);
/// - after a module runs, `__params_to_release` keeps its parameters when they recur within
///   the reuse distance of the trace (elements of the modules in between). lm_head's
///   backward follows its forward directly, so lm_head stays gathered through the loss. A
///   module of the `j`-th layer from the end recurs (in its backward, or under
///   checkpointing in its recompute) after the rest of its layer, lm_head twice and the
///   `j − 1` later layers two times (forward, backward) or three (plus the recompute).
///
/// Each gathered parameter is a full copy next to the GPU's partition.
#[must_use]
pub fn zero3_live_params(model: &ModelSpec, job: &Job, r: &Regime) -> Zero3Live {
    let tp = job.parallel.tensor_parallel.max(1);
    let h = model.hidden_size;
    let prefetch = h * h * 9 / 10;
    let head = model.vocab_size * h / tp;
    // Bytes per gathered element: 16-bit (the partitions' fp32 masters are not gathered),
    // fp32 for an fp32 model, or the stored bytes of a quantized layer.
    let full = job.method == Method::Full;
    let dense = if full { r.param_bytes } else { r.frozen_bytes }.min(4);
    let layer_params = model.layer_params().max(1);
    let layer_bytes = base_weight_bytes(model, job, r)
        .saturating_sub(model.total_params().saturating_sub(layer_params) * r.unquantized_bytes);
    let per_elem = |numel: u64| {
        if job.quantization == crate::job::Quantization::None {
            numel * dense
        } else {
            (u128::from(numel) * u128::from(layer_bytes) / u128::from(layer_params))
                .try_into()
                .unwrap_or(u64::MAX)
        }
    };
    // Modules of one layer, in forward order: the experts of a MoE block are one.
    let modules = |g: &crate::model::LayerGroup| -> Vec<u64> {
        let mut out = Vec::new();
        let mut experts = 0;
        for l in &g.linears {
            if l.role == crate::model::LinearRole::Expert {
                experts += l.params();
            } else {
                out.push(l.params() / tp);
            }
        }
        if experts > 0 {
            out.push(experts / tp);
        }
        out
    };
    let largest = model.layers.iter().flat_map(modules).max().unwrap_or(0);
    // Layers from the end, each with its modules.
    let mut from_end: Vec<Vec<u64>> = Vec::new();
    for g in model.layers.iter().rev() {
        for _ in 0..g.count {
            from_end.push(modules(g));
        }
    }
    let passes = if job.gradient_checkpointing { 3 } else { 2 };
    let mut kept = 0u64;
    let mut later = 0u64;
    for layer in &from_end {
        let sum: u64 = layer.iter().sum();
        let base = 2 * head + passes * later;
        if base >= ZERO3_MAX_REUSE_DISTANCE {
            break;
        }
        kept += layer
            .iter()
            .filter(|&&n| base + (sum - n) < ZERO3_MAX_REUSE_DISTANCE)
            .sum::<u64>();
        later += sum;
    }
    let head_bytes = head * r.unquantized_bytes.min(4);
    Zero3Live {
        in_layers: per_elem(largest + prefetch + kept),
        at_loss: head_bytes + per_elem(prefetch + kept),
    }
}
