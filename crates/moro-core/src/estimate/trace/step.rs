//! One GPU's training step, tensor by tensor: the parameters in `named_parameters` order,
//! then two optimizer steps of forward, loss, backward and `optimizer.step()`.
//!
//! Sizes follow the estimator: gradients and optimizer states per trainable tensor
//! ([`optimizer`]); the loss's buffers in the order transformers' `ForCausalLMLoss` makes
//! and drops them (10 B per logit at the end of the forward, 12 at its backward, as
//! [`super::super::loss::Loss`] counts them). A layer's saved tensors:
//!
//! - **a decoder layer**: the saved bytes of [`Activations`] cut into the shapes it saves
//!   ([`saved_tensors`]); for LoRA and QLoRA, RMSNorm's fp32 temporaries too. A full
//!   fine-tune's layer gradients come before its two backward temporaries. Cut this way,
//!   the replays of the H200's full fine-tunes are where a hand-listed Llama layer put them
//!   (`crates/moro-core/tests/replay.rs`), and the allocated peak follows every
//!   architecture [`Activations`] models (Qwen3's `q_norm`/`k_norm`, a bf16-mixed residual
//!   stream), within 0.7 % of the fake-tensor oracle's full fine-tunes.
//! - **a BERT-style encoder's full fine-tune**: listed by shape ([`encoder_tensors`]), each
//!   Linear one tensor of weight and bias. PyTorch keeps a bias apart, and listing it apart
//!   moves BERT-large's replayed fragmentation from 1.2 to 0.2 GiB (the V100 rows of the HF
//!   docs measure about 1.2): which cached block a request just over a power of two finds
//!   decides it, and that is not yet modelled.
//! - **op by op** ([`decoder_layer`]): LoRA, QLoRA, IA³, prompt tuning and bf16 full
//!   fine-tunes of Llama-style layers, where [`op_by_op`] says so.
//! - **LoRA and QLoRA** otherwise: the backward's temporaries before the layer's gradients, which
//!   come in the reverse of the forward's module order; bitsandbytes' dequantized weight in
//!   every quantized matmul; with DoRA, each adapted module's forward (`trace/dora.rs`) in
//!   the forward and the recompute.
//!
//! `crates/moro-core/tests/step_trace.rs` holds both to allocation sequences of the real
//! step recorded on fake CUDA tensors (`calibration/step_events.py`).
//!
//! Modelled: one GPU without sharding or tensor parallelism, a dense text decoder or a
//! BERT-style encoder (not an encoder-decoder), on a stack whose profile replays steps
//! (`hf`, `trl`); full fine-tuning, LoRA and QLoRA (bitsandbytes 4-bit) with PEFT's plain
//! LoRA, DoRA, IA³, VeRA, LoHa, LoKr, OFT, LN, prompt and prefix tuning on an unquantized base; AdamW (torch foreach or fused, bitsandbytes 8-bit);
//! the standard loss, TRL's chunked loss (`trace/chunked_nll.rs`) or Liger's fused linear
//! cross-entropy (its other kernels through the saved bytes); eager layers. [`models`] says
//! which jobs.

use crate::job::{Job, LossImpl, Method, Optimizer, PeftKind, Quantization, Sharding};
use crate::model::{LayerGroup, ModelSpec};

use super::super::activations::Activations;
use super::super::optimizer::{self, Trainable};
use super::super::regime::grad_bytes;
use super::super::{Component, DeviceProfile, Phase, PhaseBytes, Regime, weights};
use super::boft::{self, BoftModule};
use super::chunked_nll::ChunkedNll;
use super::decoder_layer::{self, DecoderLayer, Grads, Kept, Mode};
use super::delta_weight::{self, DeltaModule};
use super::dora::{self, DoraModule};
use super::fused_linear_ce::FusedLinearCe;
use super::params::{Param, params};
use super::shapes::{attention_maps, encoder_tensors, saved_tensors};
use super::{Builder, Replayed, Tensor, Trace};

/// Whether [`trace`] models `job` on `model`.
#[must_use]
pub fn models(model: &ModelSpec, job: &Job, r: &Regime) -> bool {
    let peft_ok = match job.method {
        Method::Full => true,
        Method::Adapters | Method::QuantizedAdapters => {
            let method_ok = match job.adapter.method {
                PeftKind::Lora => !job.adapter.dora || job.quantization == Quantization::None,
                // lit-gpt's adapters are not PEFT's.
                PeftKind::LlamaAdapter | PeftKind::AdapterV2 => false,
                // The rest of PEFT's methods on an unquantized model: the layers' saved
                // tensors are the formulas' ([`Activations`]): IA³'s and VeRA's vectors,
                // AdaLoRA's dividend (its rank allocation after each optimizer step:
                // [`Step::allocate_ranks`]), LoHa's, LoKr's, OFT's and BOFT's weight-sized
                // tensors (LoHa's and LoKr's ΔW and BOFT's rotation built in each forward,
                // `trace/delta_weight.rs`, `trace/boft.rs`), LN tuning's norm copies, prompt
                // and prefix tuning's embedding over the prompt's tokens too
                // ([`super::super::with_prompt_tokens`]; prefix tuning's keys and values
                // among the saved tensors; prompt tuning's frozen layers op by op where
                // [`decoder_layer`] models them).
                _ => {
                    !job.adapter.dora
                        && job.method == Method::Adapters
                        && job.quantization == Quantization::None
                }
            };
            method_ok
                && model.encoder.is_none()
                && matches!(
                    job.quantization,
                    Quantization::None
                        | Quantization::Nf4
                        | Quantization::Nf4Dq
                        | Quantization::Fp4
                        | Quantization::Fp4Dq
                )
                && !r.quantize_lm_head
                && (r.frozen_bytes <= 2 || !r.autocast)
        }
        Method::Inference => false,
    };
    peft_ok
        && job.stack.profile().step_replay
        && job.stack.profile().runtime == crate::stack::Runtime::Torch
        && job.parallel.gpus() == 1
        && job.parallel.sharding == Sharding::None
        && model.moe.is_none()
        && model.seq2seq.is_none()
        && model.vision.is_none()
        && !model.has_recurrent_mixer()
        && model.gemma3n.is_none()
        && !job.optimizer_in_backward
        && !job.compile
        && !job.activation_offload
        && !job.unsloth_kernels()
        && job.adapted_layers.is_none()
        && match &model.encoder {
            Some(_) => !job.gradient_checkpointing && job.liger == crate::job::Liger::default(),
            None => matches!(
                r.loss,
                LossImpl::Standard | LossImpl::Fused | LossImpl::ChunkedNll
            ),
        }
        && (matches!(
            job.optimizer,
            Optimizer::AdamwTorch | Optimizer::AdamwTorchFused | Optimizer::Adamw8bit
        )
            // bitsandbytes' paged AdamW keeps its large states in managed memory; traced for
            // adapters, whose states are small (a full fine-tune's 8-bit states are traced
            // unpaged only, +7.7 % over on the H200).
            || (job.optimizer.is_paged() && job.method != Method::Full))
}

/// Whether [`trace`] follows `job`'s decoder layers op by op ([`decoder_layer`]): its replay
/// is then the reserve.
#[must_use]
pub fn op_by_op(model: &ModelSpec, job: &Job, r: &Regime) -> bool {
    models(model, job, r) && decoder_layer::models(model, job, r)
}

/// Gradients made during backward: the first micro-batch's become `.grad`; a later one's
/// is a fresh tensor `AccumulateGrad` adds in place and drops.
pub(super) fn make_grads<'m>(
    b: &mut Builder<'m>,
    ps: &[Param<'m>],
    which: impl Iterator<Item = usize>,
    grads: &mut [Option<Tensor<'m>>],
    gb: u64,
) -> Vec<Tensor<'m>> {
    let mut fresh = Vec::new();
    for j in which {
        let p = &ps[j];
        if !p.trainable {
            continue;
        }
        let t = b.alloc_in("grad", p.module, p.layer, Component::Gradients, p.numel, gb);
        match grads[j] {
            None => grads[j] = Some(t),
            Some(_) => fresh.push(t),
        }
    }
    fresh
}

/// The trace of two training steps of `job` on one GPU, or `None` where [`models`] is
/// false. `device` gives the cuBLAS workspaces, made at the first matmul of the forward
/// and of the backward and kept.
#[must_use]
pub fn trace<'m>(
    model: &'m ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> Option<Trace<'m>> {
    let (b, op_by_op) = recorded(model, job, r, device, Builder::with_capacity)?;
    let mut t = b.finish();
    t.op_by_op = op_by_op;
    Some(t)
}

/// What an estimate reads off a step's [`trace`]: its phases, and its replay's peaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// [`Trace::phases`].
    pub phases: Vec<PhaseBytes>,
    /// [`Trace::replay`], where asked for.
    pub replayed: Option<Replayed>,
}

/// The [`Levels`] of the step [`trace`] gives, replayed where `replay`, read as its events
/// are made: no event is kept, so the cost is the events' and the replay's alone.
#[must_use]
pub fn levels(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    replay: bool,
) -> Option<Levels> {
    let (b, _) = recorded(model, job, r, device, |events| {
        Builder::reading(device.backend, replay, events / 2)
    })?;
    let (phases, replayed) = b.finish_reading();
    Some(Levels { phases, replayed })
}

/// Records two steps of `job`, every micro-batch `seq_len` tokens long
/// ([`recorded_over_lengths`]), into the builder `make` gives for about so many events;
/// whether the layers were traced op by op.
fn recorded<'m>(
    model: &'m ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    make: impl FnOnce(usize) -> Builder<'m>,
) -> Option<(Builder<'m>, bool)> {
    let micro_batches = usize::try_from(job.grad_accum.max(1)).unwrap_or(1);
    recorded_over_lengths(
        model,
        job,
        r,
        device,
        &vec![job.seq_len; 2 * micro_batches],
        make,
    )
}

/// The replay of `job` trained on micro-batches of `lengths` tokens, in that order: loading,
/// then `job.grad_accum` of them to each optimizer step (the last step takes what is left).
/// A trainer that pads each batch to its own longest sample (`DataCollatorWithPadding`,
/// TRL without packing) runs such a sequence; `None` where [`models`] is false or a length
/// is 0 or there are none.
///
/// The cache keeps what a longer batch outgrew: `reserved` climbs over a run while
/// `needed` (the segments holding a tensor) stays near one batch's. docs/memory-anatomy.md
/// §17 has what a replay of shuffled batches shows.
#[must_use]
pub fn replay_over_lengths(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    lengths: &[u64],
) -> Option<Replayed> {
    recorded_over_lengths(model, job, r, device, lengths, |events| {
        Builder::reading(device.backend, true, events / 2)
    })?
    .0
    .finish_reading()
    .1
}

/// The events [`replay_over_lengths`] replays.
#[must_use]
pub fn trace_over_lengths<'m>(
    model: &'m ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    lengths: &[u64],
) -> Option<Trace<'m>> {
    recorded_over_lengths(model, job, r, device, lengths, Builder::with_capacity)
        .map(|(b, _)| b.finish())
}

/// Records loading and one micro-batch per length into the builder `make` gives for about
/// so many events; whether the layers were traced op by op.
fn recorded_over_lengths<'m>(
    model: &'m ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    lengths: &[u64],
    make: impl FnOnce(usize) -> Builder<'m>,
) -> Option<(Builder<'m>, bool)> {
    let first = *lengths.first()?;
    if !models(model, job, r) || lengths.contains(&0) {
        return None;
    }
    let mut distinct: Vec<u64> = lengths.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let jobs: Vec<Job> = distinct
        .iter()
        .map(|&seq_len| Job {
            seq_len,
            ..job.clone()
        })
        .collect();
    let steps: Vec<Step> = jobs
        .iter()
        .map(|j| Step::new(model, j, r, device))
        .collect();
    let step_of = |len: u64| &steps[distinct.binary_search(&len).unwrap_or(0)];
    let loading = step_of(first);
    // Room for the events one layer makes per micro-batch (up to 64 traced coarsely; op by
    // op with checkpointing about 720 for LoRA, 890 for QLoRA), and a few per parameter
    // (loading, gradients, states): the vector then rarely grows.
    let layers = usize::try_from(model.num_layers).unwrap_or(0);
    let per_layer = if loading.ops.is_some() { 1024 } else { 64 };
    let mut b = make(loading.ps.len() * 8 + layers * lengths.len() * per_layer);
    loading.load(&mut b);
    let mut held = Held {
        grads: vec![None; loading.ps.len()],
        states: Vec::new(),
        cublas: Vec::new(),
        importance: Vec::new(),
    };
    let accum = usize::try_from(job.grad_accum.max(1)).unwrap_or(1);
    for (i, batches) in lengths.chunks(accum).enumerate() {
        // Events are labelled step 1, then 2: the optimizer's states are made once.
        let step = if i == 0 { 1 } else { 2 };
        for &len in batches {
            step_of(len).micro_batch(&mut b, &mut held, step);
        }
        step_of(batches[batches.len() - 1]).optimizer_step(&mut b, &mut held, step);
    }
    Some((b, loading.ops.is_some()))
}

/// What every moment of the step reads: the job's shapes, the parameters and what each
/// layer saves.
struct Step<'m, 'j> {
    model: &'m ModelSpec,
    job: &'j Job,
    r: &'j Regime,
    ps: Vec<Param<'m>>,
    /// Each decoder layer's parameters, a range of `ps`.
    ranges: Vec<std::ops::Range<usize>>,
    /// Each layer's saved tensors: the saved bytes ([`Activations`]) cut into shapes; an
    /// encoder full fine-tune's listed by shape ([`encoder_tensors`]).
    saved_by_layer: Vec<Vec<u64>>,
    /// Eager attention's score-sized tensors of a decoder layer ([`attention_maps`]).
    maps: Vec<u64>,
    acts: Activations,
    /// Tokens of a micro-batch.
    t: u64,
    /// Bytes per element of the matmuls' outputs: 16-bit under autocast or in a 16-bit
    /// model, else fp32.
    e: u64,
    full: bool,
    /// Bytes per element of gradients.
    gb: u64,
    encoder: bool,
    /// RMSNorm's fp32 temporaries are traced (PEFT jobs, transformers' RMSNorm).
    rms: bool,
    /// Liger's fused linear cross-entropy ([`LossImpl::Fused`]): its chunk buffers, made
    /// and dropped in the forward; no logits.
    fused_chunk: Option<u64>,
    /// Liger's fused linear cross-entropy tensor by tensor, after the final norm op by op.
    fused: Option<FusedLinearCe>,
    /// TRL's `chunked_nll` ([`LossImpl::ChunkedNll`]): no logits, 256-token chunks.
    chunked: Option<ChunkedNll>,
    /// A 4-bit matmul's dequantized weight.
    dequant: u64,
    /// Each layer's DoRA, LoHa or LoKr modules in forward order ([`ModuleForward`]);
    /// empty for other methods.
    modules_by_layer: Vec<Vec<ModuleForward>>,
    /// An fp32 lm_head's 16-bit copy under autocast (frozen, or a full fine-tune's).
    head_copy: u64,
    /// The decoder layers op by op ([`decoder_layer`]), where it models them.
    ops: Option<DecoderLayer>,
    /// The final norm is traced op by op too (a 16-bit stream into transformers' own loss),
    /// and where its weight trains, that weight's index: its gradient is made in the norm's
    /// backward, not with [`Self::firsts`].
    final_norm: Option<Option<usize>>,
    /// The parameters whose gradients the loss's backward makes (lm_head's, or the tied
    /// embedding's; an encoder's pooler and classifier).
    heads: Vec<usize>,
    /// The ones made last (the final norm and the embedding; an encoder's embedding tables
    /// and their LayerNorm).
    firsts: Vec<usize>,
    tied: bool,
    cublas_bytes: u64,
}

/// One adapted module's own forward, made between its layer's saved tensors.
#[derive(Debug, Clone, Copy)]
enum ModuleForward {
    /// DoRA's weight norm and result ([`dora::module_forward`]).
    Dora(DoraModule),
    /// LoHa's or LoKr's ΔW ([`delta_weight::module_forward`]).
    Delta(DeltaModule),
    /// BOFT's rotation ([`boft::module_forward`]).
    Boft(BoftModule),
}

impl ModuleForward {
    /// `keeps_graph`: the forward records what autograd saves.
    fn emit<'m>(&self, b: &mut Builder<'m>, layer: u64, keeps_graph: bool) {
        match self {
            Self::Dora(m) => dora::module_forward(b, m, layer, keeps_graph),
            Self::Delta(m) => delta_weight::module_forward(b, m, layer, keeps_graph),
            Self::Boft(m) => boft::module_forward(b, m, layer, keeps_graph),
        }
    }
}

/// What the step holds from one moment to the next.
struct Held<'m> {
    grads: Vec<Option<Tensor<'m>>>,
    states: Vec<Tensor<'m>>,
    cublas: Vec<Tensor<'m>>,
    /// AdaLoRA's importance, its smoothed copy and its uncertainty, three a `lora_`
    /// parameter ([`Step::allocate_ranks`]).
    importance: Vec<Tensor<'m>>,
}

/// What the forward leaves for the backward.
struct Forward<'m> {
    input_ids: Tensor<'m>,
    labels: Tensor<'m>,
    saved: Vec<Vec<Tensor<'m>>>,
    /// What each layer's op-level forward keeps ([`decoder_layer`]); empty otherwise.
    kept: Vec<Kept<'m>>,
    head_saved: Vec<Tensor<'m>>,
    /// What the op-level final norm keeps for its backward.
    final_norm: Option<Kept<'m>>,
    logprobs: Option<Tensor<'m>>,
    softcap: Option<Tensor<'m>>,
    /// Liger's fused loss: the input's gradient, made in the forward.
    flce: Option<Tensor<'m>>,
    /// TRL's chunked loss: the gathered hidden states its chunks keep.
    gathered: Option<Tensor<'m>>,
}

impl<'m, 'j> Step<'m, 'j> {
    /// One micro-batch: forward, loss, backward.
    fn micro_batch(&self, b: &mut Builder<'m>, held: &mut Held<'m>, step: u8) {
        let fwd = self.forward(b, held, step);
        let ([dhidden, labels, input_ids], saved, kept) = self.loss_backward(b, held, step, fwd);
        let dinput = self.layers_backward(b, held, step, saved, kept, dhidden);
        let rest = dinput.into_iter().chain([labels, input_ids]);
        self.backward_end(b, held, step, rest);
    }

    fn new(model: &'m ModelSpec, job: &'j Job, r: &'j Regime, device: &DeviceProfile) -> Self {
        let t = job.micro_batch_size * job.seq_len;
        let full = job.method == Method::Full;
        let encoder = model.encoder.is_some();
        let acts = Activations::new(model, job, r, 1);
        let e = if r.autocast {
            2
        } else {
            r.compute_bytes.min(r.stream_bytes.max(2))
        };
        let ps = params(model, job, r);
        let layers: Vec<&LayerGroup> = model
            .layers
            .iter()
            .flat_map(|g| std::iter::repeat_n(g, usize::try_from(g.count).unwrap_or(0)))
            .collect();
        let n_layers = layers.len().max(1) as u64;
        let boft = super::super::boft::Boft::new(job, r);
        let modules_by_layer = layers
            .iter()
            .map(|g| {
                if !job.method.is_peft() {
                    return Vec::new();
                }
                g.linears
                    .iter()
                    .filter(|l| job.adapts(l))
                    .filter_map(|l| {
                        if job.adapter.dora {
                            Some(ModuleForward::Dora(DoraModule::of(l, job, r, t)))
                        } else if job.adapter.method == PeftKind::Boft {
                            Some(ModuleForward::Boft(BoftModule::of(l, &boft, t)))
                        } else {
                            DeltaModule::of(l, job, r, t).map(ModuleForward::Delta)
                        }
                    })
                    .collect()
            })
            .collect();
        let per_layer = acts.all_layers() / n_layers;
        let maps = if encoder {
            Vec::new()
        } else {
            attention_maps(model, job, e)
        };
        let saved_by_layer: Vec<Vec<u64>> = layers
            .iter()
            .map(|_| {
                if full && encoder {
                    // What the listed shapes leave of [`Activations`]' count, as one more.
                    let mut v: Vec<u64> = encoder_tensors(model, job, r)
                        .into_iter()
                        .map(|bytes| bytes * t)
                        .collect();
                    let rest = per_layer.saturating_sub(v.iter().sum());
                    if rest > 0 {
                        v.push(rest);
                    }
                    v
                } else if job.gradient_checkpointing {
                    saved_tensors(acts.one_layer, t, model, e, &maps)
                } else {
                    saved_tensors(per_layer, t, model, e, &maps)
                }
            })
            .collect();
        let mut ranges: Vec<std::ops::Range<usize>> = vec![0..0; layers.len()];
        for (j, p) in ps.iter().enumerate() {
            if let Some(k) = p.layer.and_then(|k| usize::try_from(k).ok()) {
                let range = &mut ranges[k];
                if range.start == range.end {
                    *range = j..j + 1;
                } else {
                    range.end = j + 1;
                }
            }
        }
        let tied = model.tie_word_embeddings && !encoder;
        // The model's own parameters come before PEFT's.
        let n = ps.len() - ps.iter().rev().take_while(|p| p.peft_extra).count();
        let (heads, mut firsts) = if encoder {
            (vec![n - 2, n - 1], vec![0, 1, 2, 3])
        } else if tied {
            (vec![0], vec![n - 1])
        } else {
            (vec![n - 1], vec![n - 2, 0])
        };
        // A prompt or prefix embedding's gradient is made once every layer's is.
        firsts.extend(n..ps.len());
        let ops = decoder_layer::models(model, job, r)
            .then(|| DecoderLayer::new(model, job, r, device, &ps, &ranges));
        let traces_head = ops.as_ref().is_some_and(DecoderLayer::traces_final_norm)
            && !model.logit_softcapping
            && !job.compile;
        let fused =
            (traces_head && r.loss == LossImpl::Fused && job.liger.fused_linear_cross_entropy)
                .then(|| FusedLinearCe {
                    batch: job.micro_batch_size,
                    tokens: t,
                    hidden: model.hidden_size,
                    vocab: model.vocab_size,
                    input_bytes: r.stream_bytes,
                    weight_bytes: ps[heads[0]].dtype_bytes,
                    autocast: r.autocast,
                })
                .filter(|f| f.models(full));
        // Liger's loss casts lm_head within each chunk where it casts it at all.
        let head_copy = if r.autocast
            && fused.is_none()
            && (r.frozen_fp32_head
                || full && !encoder && r.autocast_weight_copies && r.param_bytes == 4)
        {
            2 * model.vocab_size * model.hidden_size
        } else {
            0
        };
        let final_norm = (traces_head
            && (r.loss == LossImpl::Standard && head_copy == 0 || fused.is_some()))
        .then(|| {
            let weight = ps
                .iter()
                .position(|p| p.name == "final_norm")
                .filter(|&j| ps[j].trainable);
            if let Some(j) = weight {
                firsts.retain(|&f| f != j);
            }
            weight
        });
        let chunked = (r.loss == LossImpl::ChunkedNll && !encoder).then(|| ChunkedNll {
            batch: job.micro_batch_size,
            tokens: t,
            hidden: model.hidden_size,
            vocab: model.vocab_size,
            stream_bytes: r.stream_bytes,
            weight_bytes: ps[heads[0]].dtype_bytes,
            autocast: r.autocast,
            softcap: model.logit_softcapping,
            head_trains: full,
            weight_copy_cached: full && head_copy > 0,
        });
        Self {
            model,
            job,
            r,
            ps,
            ranges,
            saved_by_layer,
            maps,
            acts,
            t,
            e,
            full,
            gb: grad_bytes(job, r),
            encoder,
            rms: model.norm == crate::model::NormKind::RmsNorm && !full && !job.liger.rms_norm,
            chunked,
            fused_chunk: (r.loss == LossImpl::Fused)
                .then(|| super::super::loss::Loss::new(model, job, r, 1).forward_transient),
            fused,
            dequant: weights::dequant_transient(model, job, r),
            modules_by_layer,
            head_copy,
            ops,
            final_norm,
            heads,
            firsts,
            tied,
            cublas_bytes: device.cublas_workspace_bytes,
        }
    }

    /// The parameters, in `named_parameters` order.
    fn load(&self, b: &mut Builder<'m>) {
        b.at(Phase::Load, 0);
        for p in &self.ps {
            let component = if !self.full && p.trainable {
                Component::Adapters
            } else {
                Component::Weights
            };
            b.alloc_in(p.name, p.module, p.layer, component, p.numel, p.dtype_bytes);
        }
    }

    /// A layer's forward: what it saves, each RMSNorm's fp32 upcast preceded by the two fp32
    /// temporaries of its statistics (`hidden_states.pow(2)`, then the normalized fp32
    /// product its 16-bit cast reads; transformers `LlamaRMSNorm.forward`).
    ///
    /// A DoRA, LoHa or LoKr layer's modules run between its saved tensors, spread over them
    /// in forward order.
    fn layer_forward(&self, b: &mut Builder<'m>, k: usize, name: &'static str) -> Vec<Tensor<'m>> {
        let layer = Some(k as u64);
        let upcast = self.t * self.model.hidden_size * 4;
        let mut out = Vec::new();
        let saved = &self.saved_by_layer[k];
        let modules = &self.modules_by_layer[k];
        let mut next = 0;
        for (i, &bytes) in saved.iter().enumerate() {
            while next < modules.len() && next * saved.len() / modules.len() <= i {
                modules[next].emit(b, k as u64, true);
                next += 1;
            }
            if self.rms && bytes == upcast {
                b.transient("RMSNorm pow", layer, bytes);
                b.transient("RMSNorm product", layer, bytes);
            }
            out.push(b.alloc_in(name, None, layer, Component::Activations, bytes, 1));
        }
        for m in &modules[next..] {
            m.emit(b, k as u64, true);
        }
        out
    }

    /// A checkpointed layer's forward under `no_grad`: the tensors its recompute will save
    /// are made here too, each freed once the next exists, since nothing keeps them (the
    /// recorded steps make and drop a layer's q, k, v, MLP intermediates and LoRA's input
    /// casts one after the other; `step-events-h200.jsonl`). They leave blocks of their
    /// sizes in the cache, which the H200's LoRA and QLoRA runs reserve: without them the
    /// QLoRA runs' replayed reserve was up to 4.4 % under, with them 1.7 %. A full
    /// fine-tune's forward is not given them yet: cut from its saved bytes they replay the
    /// H200's full fine-tune with checkpointing (`896224463b`) 1.4 GiB under.
    fn checkpointed_forward(&self, b: &mut Builder<'m>, k: usize) {
        let mut previous = None;
        for &bytes in &self.saved_by_layer[k] {
            let t = b.alloc_in(
                "forward temporary",
                None,
                Some(k as u64),
                Component::Transients,
                bytes,
                1,
            );
            if let Some(p) = previous.replace(t) {
                b.free(p);
            }
        }
        if let Some(p) = previous {
            b.free(p);
        }
    }

    /// The gradients of the parameters `which` (the loss's [`Step::heads`], the backward's
    /// last [`Step::firsts`]), a later micro-batch's added in place and dropped.
    fn grads_of(&self, b: &mut Builder<'m>, held: &mut Held<'m>, which: &[usize]) {
        let fresh = make_grads(b, &self.ps, which.iter().copied(), &mut held.grads, self.gb);
        b.free_all(fresh);
    }

    /// Autocast's 16-bit copies of a layer's trainable fp32 matmul weights.
    fn copies_of(&self, b: &mut Builder<'m>, k: usize) -> Vec<Tensor<'m>> {
        let r = self.r;
        let full = self.full;
        if !(r.autocast && (full && r.autocast_weight_copies || !full && r.adapter_bytes == 4)) {
            return Vec::new();
        }
        if full && r.param_bytes != 4 {
            return Vec::new();
        }
        self.ps[self.ranges[k].clone()]
            .iter()
            .filter(|p| p.linear && p.trainable)
            .map(|p| {
                b.alloc_in(
                    "autocast copy",
                    p.module,
                    p.layer,
                    Component::Activations,
                    p.numel,
                    2,
                )
            })
            .collect()
    }

    /// Bytes per element of the logits.
    const fn logit_bytes(&self) -> u64 {
        if self.r.autocast {
            2
        } else {
            self.r.compute_bytes
        }
    }

    /// The forward: the inputs, each layer's saved tensors (its checkpoint under
    /// checkpointing), the head's, and the loss's forward.
    fn forward(&self, b: &mut Builder<'m>, held: &mut Held<'m>, step: u8) -> Forward<'m> {
        let (t, model, job) = (self.t, self.model, self.job);
        b.at(Phase::ForwardEnd, step);
        let input_ids = b.alloc("input_ids", Component::Activations, t, 8);
        let labels = b.alloc("labels", Component::Activations, t, 8);
        // No workspace where there is no cuBLAS (MPS, the oracle's fake tensors).
        if held.cublas.is_empty() && self.cublas_bytes > 0 {
            held.cublas.push(b.alloc(
                "cuBLAS workspace (forward)",
                Component::Transients,
                self.cublas_bytes,
                1,
            ));
        }
        let mut saved: Vec<Vec<Tensor<'m>>> = Vec::with_capacity(self.saved_by_layer.len());
        // Under checkpointing nothing saves autocast's copies: the cache drops them when the
        // forward leaves autocast, and the recompute makes its layer's again.
        let mut cached = Vec::new();
        let mut kept = Vec::new();
        // The op-level layers pass the hidden state from one to the next: the embedding's
        // output, then each layer's, freed once the next layer returns (the first, by the
        // model's forward, after the final norm); under checkpointing each is the next
        // layer's checkpoint.
        let mut hidden = None;
        let mut embedding = None;
        if self.ops.is_some() {
            let e = b.alloc(
                "embedding output",
                Component::Activations,
                t * model.hidden_size,
                self.r.stream_bytes,
            );
            hidden = Some(e);
            if !job.gradient_checkpointing {
                embedding = Some(e);
            }
        }
        for k in 0..self.saved_by_layer.len() {
            if let (Some(ops), Some(input)) = (&self.ops, hidden.take()) {
                let mode = if job.gradient_checkpointing {
                    Mode::NoGrad
                } else {
                    Mode::Grad
                };
                let (mut layer, copies, output) = ops.forward(b, k, mode);
                cached.extend(copies);
                if job.gradient_checkpointing {
                    saved.push(vec![input]);
                } else {
                    if k > 0 {
                        if ops.saves_input() {
                            layer.hold_input(input);
                        } else {
                            b.free(input);
                        }
                    }
                    saved.push(Vec::new());
                }
                kept.push(layer);
                hidden = output;
                continue;
            }
            let copies = self.copies_of(b, k);
            let mut s = Vec::new();
            if job.gradient_checkpointing {
                cached.extend(copies);
            } else {
                s.extend(copies);
            }
            if self.dequant > 0 {
                b.transient("dequantized weight", Some(k as u64), self.dequant);
            }
            if job.gradient_checkpointing {
                for m in &self.modules_by_layer[k] {
                    m.emit(b, k as u64, false);
                }
                if !self.full {
                    self.checkpointed_forward(b, k);
                }
                s.push(b.alloc_in(
                    "checkpoint",
                    None,
                    Some(k as u64),
                    Component::Activations,
                    self.acts.checkpoint_one,
                    1,
                ));
            } else {
                s.extend(self.layer_forward(b, k, "saved"));
            }
            saved.push(s);
        }
        // The final norm and lm_head's inputs (an fp32 head's 16-bit weight copy).
        let mut head_saved = Vec::new();
        // TRL's chunked loss casts lm_head per chunk, except a trainable fp32 one, whose
        // copy autocast caches until the forward leaves it; the head saves no input.
        let chunked = self.chunked.as_ref();
        let head_copy = match chunked {
            Some(c) if !c.weight_copy_cached => 0,
            _ => self.head_copy,
        };
        if head_copy > 0 {
            let copy = b.alloc_in(
                "autocast copy",
                Some("lm_head"),
                None,
                Component::Activations,
                head_copy,
                1,
            );
            if chunked.is_some() {
                cached.push(copy);
            } else {
                head_saved.push(copy);
            }
        }
        let head_input = if chunked.is_some() && self.full {
            2 * model.hidden_size * t
        } else {
            0
        };
        let mut final_norm = None;
        let mut norm_output = None;
        if let Some((mut kept, out)) = self
            .final_norm
            .and(self.ops.as_ref())
            .and_then(|o| o.norm_forward(b))
        {
            // Liger's norm saves the last layer's output itself.
            if self.ops.as_ref().is_some_and(DecoderLayer::saves_input)
                && let Some(x) = hidden.take()
            {
                kept.hold_input(x);
            }
            final_norm = Some(kept);
            norm_output = Some(out);
        } else {
            let head_bytes = saved_tensors(
                self.acts
                    .head
                    .saturating_sub(self.head_copy)
                    .saturating_sub(head_input),
                t,
                model,
                self.e,
                &[],
            );
            for bytes in head_bytes {
                head_saved.push(b.alloc("saved (head)", Component::Activations, bytes, 1));
            }
        }
        // The last layer's output and the embedding's, once the final norm has read them.
        for x in hidden.into_iter().chain(embedding) {
            b.free(x);
        }
        // transformers `ForCausalLMLoss`: the logits, `logits.float()`, `log_softmax`'s output
        // (saved); the upcast and then the logits are dropped. An encoder's classification
        // loss is a few bytes a sequence.
        let tv = t * model.vocab_size;
        let lb = self.logit_bytes();
        let mut logprobs = None;
        let mut softcap = None;
        let mut flce = None;
        let mut gathered = None;
        if let Some(c) = chunked {
            gathered = Some(c.forward(b));
        } else if let Some(f) = self.fused {
            flce = Some(f.forward(b, |b| {
                if self.full {
                    self.grads_of(b, held, &self.heads);
                }
            }));
            // The final norm's output goes as the model's forward returns.
            if let Some(out) = norm_output.take() {
                b.free(out);
            }
        } else if let Some(chunk) = self.fused_chunk {
            // Liger 0.8.5 `ops/fused_linear_cross_entropy.py`: the input's gradient
            // (T·h, the input's dtype) is filled chunk by chunk in the forward, each chunk's
            // logits and their gradient in fp32 made and dropped; a trainable lm_head's
            // weight gradient is accumulated there too and becomes its `.grad`.
            flce = Some(b.alloc(
                "FLCE grad_input",
                Component::LogitsLoss,
                self.t * model.hidden_size,
                2,
            ));
            if self.full {
                self.grads_of(b, held, &self.heads);
            }
            b.transient("FLCE chunk logits", None, chunk);
        } else if !self.encoder {
            let logits = b.alloc("logits", Component::LogitsLoss, tv, lb);
            // Gemma 2's final softcap: `torch.tanh` saves its output until the loss's
            // backward ([`super::super::loss::Loss`]).
            softcap = model
                .logit_softcapping
                .then(|| b.alloc("tanh (softcap)", Component::LogitsLoss, tv, lb));
            let upcast = (lb != 4).then(|| b.alloc("logits.float()", Component::LogitsLoss, tv, 4));
            logprobs = Some(b.alloc("log_softmax", Component::LogitsLoss, tv, 4));
            if let Some(u) = upcast {
                b.free(u);
            }
            // The final norm's output, dropped as the model's forward returns, unless
            // lm_head's matmul saved it for its weight's gradient.
            if let Some(out) = norm_output.take() {
                if self.full {
                    head_saved.push(out);
                } else {
                    b.free(out);
                }
            }
            b.free(logits);
        }
        head_saved.extend(norm_output);
        // Autocast's cache is cleared when the forward leaves autocast, after the loss
        // (transformers `Trainer.compute_loss` runs inside `autocast_smart_context_manager`).
        b.free_all(cached);
        Forward {
            input_ids,
            labels,
            saved,
            kept,
            head_saved,
            final_norm,
            logprobs,
            softcap,
            flce,
            gathered,
        }
    }

    /// The loss's backward (the nll and log_softmax gradients, then the logits'), the head's
    /// gradients and the hidden state's gradient; the head's saved tensors freed. Returns
    /// the hidden state's gradient, the inputs and the layers' saved tensors.
    fn loss_backward(
        &self,
        b: &mut Builder<'m>,
        held: &mut Held<'m>,
        step: u8,
        fwd: Forward<'m>,
    ) -> ([Tensor<'m>; 3], Vec<Vec<Tensor<'m>>>, Vec<Kept<'m>>) {
        let tv = self.t * self.model.vocab_size;
        b.at(Phase::LossBackward, step);
        let dlogits = fwd.logprobs.map(|lp| {
            let nll = b.alloc("nll_loss grad", Component::LogitsLoss, tv, 4);
            let dls = b.alloc("log_softmax grad", Component::LogitsLoss, tv, 4);
            b.free(nll);
            b.free(lp);
            let dlogits = b.alloc("logits grad", Component::LogitsLoss, tv, self.logit_bytes());
            b.free(dls);
            dlogits
        });
        if let Some(x) = fwd.softcap {
            b.free(x);
        }
        if held.cublas.len() == 1 {
            held.cublas.push(b.alloc(
                "cuBLAS workspace (backward)",
                Component::Transients,
                self.cublas_bytes,
                1,
            ));
        }
        let chunked = match (self.chunked.as_ref(), fwd.gathered) {
            (Some(c), Some(g)) => {
                let slot = &mut held.grads[self.heads[0]];
                Some(c.backward(b, g, slot, self.gb))
            }
            _ => None,
        };
        if fwd.flce.is_none() && chunked.is_none() {
            self.grads_of(b, held, &self.heads);
        }
        // Liger's backward returns the gradient its forward made (the loss's own gradient
        // is 1, so it is not rescaled into a new tensor).
        let dhidden = fwd.flce.or(chunked).unwrap_or_else(|| {
            b.alloc(
                "hidden grad",
                Component::Transients,
                self.t * self.model.hidden_size,
                self.r.stream_bytes,
            )
        });
        if let Some(d) = dlogits {
            b.free(d);
        }
        b.free_all(fwd.head_saved);
        let dhidden = match (fwd.final_norm, &self.ops) {
            (Some(mut kept), Some(ops)) => {
                let mut grads = Grads {
                    ps: &self.ps,
                    slots: &mut held.grads,
                    bytes: self.gb,
                };
                let weight = self.final_norm.flatten();
                let d = ops.norm_backward(b, &mut kept, &mut grads, dhidden, weight);
                b.free_all(kept.into_rest());
                d.unwrap_or(dhidden)
            }
            _ => dhidden,
        };
        ([dhidden, fwd.labels, fwd.input_ids], fwd.saved, fwd.kept)
    }

    /// Layers in reverse: the recompute (checkpointing), the layer's gradients and its
    /// backward's transients, then its saved tensors freed.
    fn layers_backward(
        &self,
        b: &mut Builder<'m>,
        held: &mut Held<'m>,
        step: u8,
        mut saved: Vec<Vec<Tensor<'m>>>,
        mut kept: Vec<Kept<'m>>,
        dhidden: Tensor<'m>,
    ) -> Option<Tensor<'m>> {
        b.at(Phase::LayerBackward, step);
        if let Some(ops) = &self.ops {
            let mut dh = Some(dhidden);
            for k in (0..self.saved_by_layer.len()).rev() {
                let mut layer = kept.pop().unwrap_or_default();
                let mut grads = Grads {
                    ps: &self.ps,
                    slots: &mut held.grads,
                    bytes: self.gb,
                };
                let Some(dy) = dh.take() else { break };
                let mut layer_saved = saved.pop().unwrap_or_default();
                // Under checkpointing the backward runs until an op reads a saved tensor,
                // which starts the recompute; the layer's input (its checkpoint) goes once
                // the recomputed tensors have been read.
                let started = if self.job.gradient_checkpointing {
                    let started = ops.start(b, k, &mut grads, dy);
                    layer = ops.forward(b, k, Mode::Recompute).0;
                    for input in layer_saved.drain(..) {
                        layer.hold_checkpoint(input);
                    }
                    started
                } else {
                    None
                };
                dh = ops.backward(b, k, &mut layer, &mut grads, dy, started);
                b.free_all(layer.into_rest());
                b.free_all(layer_saved);
            }
            return dh;
        }
        for k in (0..self.saved_by_layer.len()).rev() {
            let mut rec = Vec::new();
            if self.job.gradient_checkpointing {
                rec.extend(self.layer_forward(b, k, "recomputed"));
                rec.extend(self.copies_of(b, k));
            }
            // A full fine-tune's gradients come first, in `named_parameters` order.
            let mut fresh = if self.full {
                make_grads(
                    b,
                    &self.ps,
                    self.ranges[k].clone(),
                    &mut held.grads,
                    self.gb,
                )
            } else {
                Vec::new()
            };
            // The backward's activation gradients, in the shapes of the layer's tensors.
            let activation_grads = || {
                saved_tensors(
                    self.acts.layer_backward_transient,
                    self.t,
                    self.model,
                    self.e,
                    &self.maps,
                )
            };
            let temps: Vec<Tensor<'m>> = if self.full {
                // Two MLP-wide temporaries (decoders; an encoder's widest tensor), or the
                // activations' gradients where they are more: eager attention's score and
                // probability gradients do not depend on which weights train.
                let w = self.saved_by_layer[k].iter().copied().max().unwrap_or(0);
                let grads = activation_grads();
                if grads.iter().sum::<u64>() > 2 * w {
                    grads
                } else {
                    vec![w; 2]
                }
            } else {
                activation_grads()
            }
            .into_iter()
            .map(|bytes| {
                b.alloc_in(
                    "backward temporary",
                    None,
                    Some(k as u64),
                    Component::Transients,
                    bytes,
                    1,
                )
            })
            .collect();
            // Each module's weight gradient follows its input gradient; backward reaches a
            // layer's modules in the reverse of their forward order.
            if !self.full {
                fresh = make_grads(
                    b,
                    &self.ps,
                    self.ranges[k].clone().rev(),
                    &mut held.grads,
                    self.gb,
                );
            }
            if self.dequant > 0 {
                b.transient("dequantized weight", Some(k as u64), self.dequant);
            }
            b.free_all(temps);
            b.free_all(fresh);
            b.free_all(rec);
            b.free_all(saved.pop().unwrap_or_default());
        }
        Some(dhidden)
    }

    /// The final norm's and the embedding's gradients (an encoder's tables); a tied
    /// embedding sums its two gradients out of place; the hidden state's gradient and the
    /// inputs freed.
    fn backward_end(
        &self,
        b: &mut Builder<'m>,
        held: &mut Held<'m>,
        step: u8,
        rest: impl Iterator<Item = Tensor<'m>>,
    ) {
        b.at(Phase::BackwardEnd, step);
        self.grads_of(b, held, &self.firsts);
        if self.tied && self.full {
            let numel = self.ps[0].numel;
            let incoming = b.alloc(
                "embedding grad (lookup)",
                Component::Transients,
                numel,
                self.gb,
            );
            // The autograd engine adds a tied weight's two gradients in its input buffer,
            // in place when it holds the only reference to a contiguous one
            // (`input_buffer.cpp` `accumulate`): Liger's `grad_weight`, made contiguous by
            // its forward, is (the H200's Liger full fine-tune holds no second copy);
            // lm_head's own gradient is not (the oracle's tied full fine-tunes make a sum).
            if self.fused_chunk.is_some() {
                b.free(incoming);
            } else {
                let sum = b.alloc("embedding grad (sum)", Component::Gradients, numel, self.gb);
                b.free(incoming);
                if let Some(old) = held.grads[0].replace(sum) {
                    b.free(old);
                }
            }
        }
        for x in rest {
            b.free(x);
        }
    }

    /// The optimizer step: HF's parameter groups (weights with decay, then norms and
    /// biases), the states made in the first step; foreach AdamW's `_foreach_sqrt` copies of
    /// the second moments; `zero_grad(set_to_none=True)` (torch ≥ 2.0).
    /// AdaLoRA's `update_and_allocate` after the optimizer step, before `zero_grad` (PEFT
    /// 0.21.2 `tuners/adalora/layer.py` `RankAllocator.update_ipt`): for every `lora_`
    /// parameter in `named_parameters` order, the first call makes `ipt`, `exp_avg_ipt` and
    /// `exp_avg_unc` as zeros; then each is made anew from temporaries and replaces the one
    /// before: `(p * p.grad).abs()`; `β₁ · avg + (1 − β₁) · ipt`; `β₂ · unc + (1 − β₂) ·
    /// (ipt − avg).abs()`. Masking to the budget (`mask_to_budget`, after `tinit` steps)
    /// makes score vectors of the ranks only and is not traced.
    fn allocate_ranks(&self, b: &mut Builder<'m>, held: &mut Held<'m>) {
        let first = held.importance.is_empty();
        let mut k = 0;
        for p in self
            .ps
            .iter()
            .filter(|p| p.trainable && p.name.starts_with("lora_"))
        {
            let (n, e) = (p.numel, p.dtype_bytes);
            let make = |b: &mut Builder<'m>, name| {
                b.alloc_in(name, p.module, p.layer, Component::Transients, n, e)
            };
            let keep = |b: &mut Builder<'m>, name| {
                b.alloc_in(name, p.module, p.layer, Component::OptimizerStates, n, e)
            };
            if first {
                for name in ["ipt", "exp_avg_ipt", "exp_avg_unc"] {
                    held.importance.push(keep(b, name));
                }
            }
            let product = make(b, "p * p.grad");
            let ipt = keep(b, "ipt");
            b.free(product);
            b.free(std::mem::replace(&mut held.importance[k], ipt));
            let (x, y) = (make(b, "β₁ · exp_avg_ipt"), make(b, "(1 − β₁) · ipt"));
            let avg = keep(b, "exp_avg_ipt");
            b.free_all(vec![x, y]);
            b.free(std::mem::replace(&mut held.importance[k + 1], avg));
            let scaled = make(b, "β₂ · exp_avg_unc");
            let difference = make(b, "ipt − exp_avg_ipt");
            let magnitude = make(b, "|ipt − exp_avg_ipt|");
            b.free(difference);
            let weighted = make(b, "(1 − β₂) · |ipt − exp_avg_ipt|");
            b.free(magnitude);
            let unc = keep(b, "exp_avg_unc");
            b.free_all(vec![scaled, weighted]);
            b.free(std::mem::replace(&mut held.importance[k + 2], unc));
            k += 3;
        }
    }

    fn optimizer_step(&self, b: &mut Builder<'m>, held: &mut Held<'m>, step: u8) {
        let (ps, job, r) = (&self.ps, self.job, self.r);
        b.at(Phase::OptimizerStep, step);
        let h = self.model.hidden_size;
        let norm = |j: usize| !ps[j].linear && ps[j].numel <= 2 * h;
        let n = ps.len();
        let order: Vec<usize> = (0..n)
            .filter(|&j| ps[j].trainable && !norm(j))
            .chain((0..n).filter(|&j| ps[j].trainable && norm(j)))
            .collect();
        let pb = optimizer::trainable_bytes(job, r);
        if held.states.is_empty() {
            for &j in &order {
                let p = &ps[j];
                let tr = Trainable {
                    copies: 1,
                    numel: p.numel,
                    shape: (p.numel, 1),
                    embedding: p.embedding,
                };
                // A paged optimizer's large states are managed memory, outside the allocator.
                let (bytes, _) = optimizer::state_bytes(&tr, job.optimizer, pb, r);
                for (name, part) in [("exp_avg", bytes / 2), ("exp_avg_sq", bytes - bytes / 2)] {
                    if part == 0 {
                        continue;
                    }
                    held.states.push(b.alloc_in(
                        name,
                        p.module,
                        p.layer,
                        Component::OptimizerStates,
                        part,
                        1,
                    ));
                }
            }
        }
        if job.optimizer == Optimizer::AdamwTorch {
            let tmp: Vec<Tensor<'m>> = order
                .iter()
                .map(|&j| {
                    b.alloc_in(
                        "exp_avg_sq.sqrt()",
                        ps[j].module,
                        ps[j].layer,
                        Component::Transients,
                        ps[j].numel,
                        pb,
                    )
                })
                .collect();
            b.free_all(tmp);
        }
        if job.method.is_peft() && job.adapter.method == PeftKind::AdaLora {
            self.allocate_ranks(b, held);
        }
        if !job.versions.zero_grad_keeps_grads() {
            for g in &mut held.grads {
                if let Some(x) = g.take() {
                    b.free(x);
                }
            }
        }
    }
}
