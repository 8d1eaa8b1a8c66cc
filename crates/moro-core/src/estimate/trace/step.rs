//! One GPU's training step, tensor by tensor: the parameters in `named_parameters` order,
//! then two optimizer steps of forward, loss, backward and `optimizer.step()`.
//!
//! Sizes follow the estimator: gradients and optimizer states per trainable tensor
//! ([`optimizer`]); the loss's buffers in the order transformers' `ForCausalLMLoss` makes
//! and drops them (10 B per logit at the end of the forward, 12 at its backward, as
//! [`super::super::loss::Loss`] counts them). A layer's saved tensors:
//!
//! - **full fine-tuning**: listed by shape ([`layer_tensors`], [`encoder_tensors`]), each
//!   Linear one tensor of weight and bias, the layer's gradients made before its two
//!   backward temporaries. This is the sequence whose replay was checked against the H200's
//!   full fine-tunes (`crates/moro-core/tests/replay.rs`). PyTorch keeps a bias apart, and
//!   listing it apart moves BERT-large's replayed fragmentation from 1.2 to 0.2 GiB (the
//!   V100 rows of the HF docs measure about 1.2): which cached block a request just over a
//!   power of two finds decides it, and that is not yet modelled.
//! - **LoRA and QLoRA**: the saved bytes of [`Activations`] cut into the shapes a decoder
//!   layer saves ([`saved_tensors`]), RMSNorm's fp32 temporaries, the backward's
//!   temporaries before the layer's gradients, which come in the reverse of the forward's
//!   module order; bitsandbytes' dequantized weight in every quantized matmul.
//!
//! `crates/moro-core/tests/step_trace.rs` holds both to allocation sequences of the real
//! step recorded on fake CUDA tensors (`calibration/step_events.py`).
//!
//! Modelled: one GPU without sharding or tensor parallelism, a dense text decoder or a
//! BERT-style encoder, on a stack whose profile replays steps (`hf`, `trl`); full
//! fine-tuning, LoRA and QLoRA (bitsandbytes 4-bit) with PEFT's plain LoRA; AdamW (torch
//! foreach or fused, bitsandbytes 8-bit); the standard loss; eager layers. [`models`] says
//! which jobs.

use crate::job::{Job, LossImpl, Method, Optimizer, PeftKind, Quantization, Sharding};
use crate::model::{LayerGroup, Linear, ModelSpec};

use super::super::activations::Activations;
use super::super::optimizer::{self, Trainable};
use super::super::regime::grad_bytes;
use super::super::{Component, DeviceProfile, Phase, Regime, weights};
use super::{Builder, Tensor, Trace};

/// Whether [`trace`] models `job` on `model`.
#[must_use]
pub fn models(model: &ModelSpec, job: &Job, r: &Regime) -> bool {
    let peft_ok = match job.method {
        Method::Full => true,
        Method::Lora | Method::Qlora => {
            job.peft == PeftKind::Lora
                && !job.lora.dora
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
        && model.vision.is_none()
        && !job.optimizer_in_backward
        && !job.compile
        && !job.activation_offload
        && !job.unsloth_kernels()
        && job.adapted_layers.is_none()
        && job.liger == crate::job::Liger::default()
        && match &model.encoder {
            Some(_) => !job.gradient_checkpointing,
            None => matches!(r.loss, LossImpl::Standard),
        }
        && matches!(
            job.optimizer,
            Optimizer::AdamwTorch | Optimizer::AdamwTorchFused | Optimizer::Adamw8bit
        )
}

/// A parameter as the step sees it.
struct Param<'m> {
    name: &'static str,
    module: Option<&'m str>,
    layer: Option<u64>,
    numel: u64,
    /// Bytes per element as stored.
    dtype_bytes: u64,
    trainable: bool,
    /// A matmul weight (autocast keeps a 16-bit copy of a trainable fp32 one).
    linear: bool,
    /// The token embedding (bitsandbytes 8-bit: 32-bit states under the HF Trainer).
    embedding: bool,
}

/// The model's parameters in `named_parameters` order: the embedding (and an encoder's
/// position and token-type tables and their LayerNorm), each layer's Linears (PEFT: the
/// base weight, then `lora_A` and `lora_B`) and then its norms, the final norm, lm_head
/// when untied (an encoder's pooler and classifier instead). A 4-bit base weight is its
/// packed `uint8` storage followed by its quantization state (absmax and, double quantized,
/// their own codes).
#[allow(clippy::too_many_lines)]
fn params<'m>(model: &'m ModelSpec, job: &Job, r: &Regime) -> Vec<Param<'m>> {
    let h = model.hidden_size;
    let full = job.method == Method::Full;
    // What is not a quantized Linear: trainable weights, frozen ones, or upcast to fp32 by
    // PEFT's kbit preparation.
    let plain = if full {
        r.param_bytes
    } else {
        r.unquantized_bytes
    };
    let frozen = if full { r.param_bytes } else { r.frozen_bytes };
    let outside = |name: &'static str, numel: u64, linear: bool| Param {
        name,
        module: None,
        layer: None,
        numel,
        dtype_bytes: plain,
        trainable: full,
        linear,
        embedding: false,
    };
    let mut out = vec![Param {
        embedding: true,
        ..outside("embed_tokens", model.vocab_size * h, false)
    }];
    if let Some(enc) = &model.encoder {
        out.push(outside(
            "position_embeddings",
            model.position_embeddings * h,
            false,
        ));
        out.push(outside(
            "token_type_embeddings",
            enc.type_vocab_size * h,
            false,
        ));
        out.push(outside("embeddings.LayerNorm", 2 * h, false));
    }
    let quantized = job.quantization != Quantization::None && !full;
    let mut index = 0;
    for g in &model.layers {
        for _ in 0..g.count {
            for l in &g.linears {
                for _ in 0..l.count {
                    push_linear(&mut out, job, r, l, index, quantized, frozen, plain);
                }
            }
            let norms = g.other_params / h.max(1);
            for _ in 0..norms {
                out.push(Param {
                    layer: Some(index),
                    ..outside("norm", h, false)
                });
            }
            index += 1;
        }
    }
    if let Some(enc) = &model.encoder {
        out.push(outside("pooler", h * h + h, true));
        out.push(outside(
            "classifier",
            h * enc.num_labels + enc.num_labels,
            true,
        ));
        return out;
    }
    out.push(outside("final_norm", h, false));
    if !model.tie_word_embeddings {
        out.push(Param {
            module: Some("lm_head"),
            ..outside("weight", model.vocab_size * h, true)
        });
    }
    out
}

/// One Linear's parameters: its weight (packed and quantization state when 4-bit), its
/// bias (with the weight in a full fine-tune, see the module's notes), and its LoRA pair
/// when adapted.
#[allow(clippy::too_many_arguments)]
fn push_linear<'m>(
    out: &mut Vec<Param<'m>>,
    job: &Job,
    r: &Regime,
    l: &'m Linear,
    layer: u64,
    quantized: bool,
    frozen: u64,
    plain: u64,
) {
    let full = job.method == Method::Full;
    let of = |name: &'static str, numel: u64, dtype_bytes: u64, trainable: bool| Param {
        name,
        module: Some(l.name.as_str()),
        layer: Some(layer),
        numel,
        dtype_bytes,
        trainable,
        linear: true,
        embedding: false,
    };
    let n = l.weight_numel();
    if quantized && job.is_module(l) {
        let stored = weights::quantized_linear_bytes(l, job.quantization);
        out.push(of("weight (4-bit)", n.div_ceil(2), 1, false));
        out.push(of(
            "quant_state",
            stored.saturating_sub(n.div_ceil(2)),
            1,
            false,
        ));
    } else {
        out.push(of(
            "weight",
            if full { l.params() } else { n },
            frozen,
            full,
        ));
    }
    if l.bias && !full {
        out.push(Param {
            linear: false,
            ..of("bias", l.out_features, plain, full)
        });
    }
    if job.method.is_peft() && job.adapts(l) {
        let rank = job.lora.rank;
        out.push(of("lora_A", rank * l.in_features, r.adapter_bytes, true));
        out.push(of("lora_B", l.out_features * rank, r.adapter_bytes, true));
    }
}

/// A decoder layer's saved bytes cut into the tensors it saves, in the order it saves them:
/// the attention block's RMSNorm keeps its fp32 upcast of the input, then hidden-wide
/// tensors (normalized input, q, k, v, the rotary copies, the attention output, LoRA's
/// input casts), the MLP block's norm its upcast, the MLP's four intermediate-wide tensors
/// (gate and up outputs, the activation, the product), and the rest, the last one smaller.
/// `e`: bytes per element of the layer's matmul outputs.
fn saved_tensors(bytes: u64, t: u64, model: &ModelSpec, e: u64) -> Vec<u64> {
    let mut rest = bytes;
    let mut take = |size: u64, count: usize| -> Vec<u64> {
        let mut out = Vec::new();
        for _ in 0..count {
            if size == 0 || rest < size {
                break;
            }
            out.push(size);
            rest -= size;
        }
        out
    };
    let mlp = take(t * model.intermediate_size * e, 4);
    let norms = take(t * model.hidden_size * 4, 2);
    let hidden = take(t * model.hidden_size * e, usize::MAX);
    let tail = rest;
    let (attention, after) = hidden.split_at(hidden.len() / 2);
    let mut out = Vec::new();
    out.extend(norms.first());
    out.extend(attention);
    out.extend(norms.get(1));
    out.extend(mlp);
    out.extend(after);
    if tail > 0 {
        out.push(tail);
    }
    out
}

/// Gradients made during backward: the first micro-batch's become `.grad`; a later one's
/// is a fresh tensor `AccumulateGrad` adds in place and drops.
fn make_grads<'m>(
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
#[allow(clippy::too_many_lines)]
pub fn trace<'m>(
    model: &'m ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> Option<Trace<'m>> {
    if !models(model, job, r) {
        return None;
    }
    let t = job.micro_batch_size * job.seq_len;
    let h = model.hidden_size;
    let v = model.vocab_size;
    let full = job.method == Method::Full;
    let gb = grad_bytes(job, r);
    let encoder = model.encoder.is_some();
    let acts = Activations::new(model, job, r, 1);
    // The matmuls' outputs: 16-bit under autocast or in a 16-bit model, else fp32.
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
    let per_layer = acts.all_layers() / n_layers;
    // Each layer's saved tensors: a full fine-tune's listed by shape ([`layer_tensors`],
    // [`encoder_tensors`]); a PEFT job's saved bytes ([`Activations`]) cut into shapes.
    let saved_by_layer: Vec<Vec<u64>> = layers
        .iter()
        .map(|g| {
            if full {
                match &model.encoder {
                    Some(_) => encoder_tensors(model, job, r),
                    None => layer_tensors(model, g, e),
                }
                .into_iter()
                .map(|bytes| bytes * t)
                .collect()
            } else if job.gradient_checkpointing {
                saved_tensors(acts.one_layer, t, model, e)
            } else {
                saved_tensors(per_layer, t, model, e)
            }
        })
        .collect();
    // A layer's forward: what it saves, each RMSNorm's fp32 upcast preceded by the two
    // fp32 temporaries of its statistics (`hidden_states.pow(2)`, then the normalized fp32
    // product its 16-bit cast reads; transformers `LlamaRMSNorm.forward`).
    let upcast = t * h * 4;
    let rms = model.norm == crate::model::NormKind::RmsNorm && !full;
    let layer_forward = |b: &mut Builder<'m>, k: usize, name: &'static str| -> Vec<Tensor<'m>> {
        let layer = Some(k as u64);
        let mut out = Vec::new();
        for &bytes in &saved_by_layer[k] {
            if rms && bytes == upcast {
                b.transient("RMSNorm pow", layer, bytes);
                b.transient("RMSNorm product", layer, bytes);
            }
            out.push(b.alloc_in(name, None, layer, Component::Activations, bytes, 1));
        }
        out
    };
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

    let mut b = Builder::new();
    b.at(Phase::Load, 0);
    for p in &ps {
        let component = if !full && p.trainable {
            Component::Adapters
        } else {
            Component::Weights
        };
        b.alloc_in(p.name, p.module, p.layer, component, p.numel, p.dtype_bytes);
    }
    // Autocast's 16-bit copies of a layer's trainable fp32 matmul weights.
    let copies_of = |b: &mut Builder<'m>, layer: usize| -> Vec<Tensor<'m>> {
        if !(r.autocast && (full && r.autocast_weight_copies || !full && r.adapter_bytes == 4)) {
            return Vec::new();
        }
        if full && r.param_bytes != 4 {
            return Vec::new();
        }
        ps[ranges[layer].clone()]
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
    };
    let dequant = weights::dequant_transient(model, job, r);
    let head_copy = if r.frozen_fp32_head && r.autocast {
        2 * v * h
    } else {
        0
    };
    let mut grads: Vec<Option<Tensor<'m>>> = vec![None; ps.len()];
    let mut states: Vec<Tensor<'m>> = Vec::new();
    let mut cublas: Vec<Tensor<'m>> = Vec::new();
    let tied = model.tie_word_embeddings && !encoder;
    let n = ps.len();
    // The parameters whose gradients the loss's backward makes (lm_head's, or the tied
    // embedding's; an encoder's pooler and classifier), and the ones made last (the final
    // norm and the embedding; an encoder's embedding tables and their LayerNorm).
    let (heads, firsts): (Vec<usize>, Vec<usize>) = if encoder {
        (vec![n - 2, n - 1], vec![0, 1, 2, 3])
    } else if tied {
        (vec![0], vec![n - 1])
    } else {
        (vec![n - 1], vec![n - 2, 0])
    };
    for step in 1..=2u8 {
        for _ in 0..job.grad_accum.max(1) {
            b.at(Phase::ForwardEnd, step);
            let input_ids = b.alloc("input_ids", Component::Activations, t, 8);
            let labels = b.alloc("labels", Component::Activations, t, 8);
            if cublas.is_empty() {
                cublas.push(b.alloc(
                    "cuBLAS workspace (forward)",
                    Component::Transients,
                    device.cublas_workspace_bytes,
                    1,
                ));
            }
            let mut saved: Vec<Vec<Tensor<'m>>> = Vec::with_capacity(layers.len());
            // Under checkpointing nothing saves autocast's copies: the cache drops them when
            // the forward leaves autocast, and the recompute makes its layer's again.
            let mut cached = Vec::new();
            for k in 0..layers.len() {
                let copies = copies_of(&mut b, k);
                let mut s = Vec::new();
                if job.gradient_checkpointing {
                    cached.extend(copies);
                } else {
                    s.extend(copies);
                }
                if dequant > 0 {
                    b.transient("dequantized weight", Some(k as u64), dequant);
                }
                if job.gradient_checkpointing {
                    s.push(b.alloc_in(
                        "checkpoint",
                        None,
                        Some(k as u64),
                        Component::Activations,
                        acts.checkpoint_one,
                        1,
                    ));
                } else {
                    s.extend(layer_forward(&mut b, k, "saved"));
                }
                saved.push(s);
            }
            b.free_all(cached);
            // The final norm and lm_head's inputs (a frozen fp32 head's 16-bit weight copy).
            let mut head_saved = Vec::new();
            if head_copy > 0 {
                head_saved.push(b.alloc_in(
                    "autocast copy",
                    Some("lm_head"),
                    None,
                    Component::Activations,
                    head_copy,
                    1,
                ));
            }
            let head_bytes = if full {
                vec![e * h * t]
            } else {
                saved_tensors(acts.head.saturating_sub(head_copy), t, model, e)
            };
            for bytes in head_bytes {
                head_saved.push(b.alloc("saved (head)", Component::Activations, bytes, 1));
            }
            // transformers `ForCausalLMLoss`: the logits, `logits.float()`, `log_softmax`'s
            // output (saved); the upcast and then the logits are dropped; in backward the
            // nll and log_softmax gradients, then the logits' gradient. An encoder's
            // classification loss is a few bytes a sequence.
            let logit_bytes = if r.autocast { 2 } else { r.compute_bytes };
            let mut logprobs = None;
            let mut softcap = None;
            if !encoder {
                let logits = b.alloc("logits", Component::LogitsLoss, t * v, logit_bytes);
                // Gemma 2's final softcap: `torch.tanh` saves its output until the loss's
                // backward ([`super::super::loss::Loss`]).
                softcap = model
                    .logit_softcapping
                    .then(|| b.alloc("tanh (softcap)", Component::LogitsLoss, t * v, logit_bytes));
                let upcast = (logit_bytes != 4)
                    .then(|| b.alloc("logits.float()", Component::LogitsLoss, t * v, 4));
                logprobs = Some(b.alloc("log_softmax", Component::LogitsLoss, t * v, 4));
                if let Some(u) = upcast {
                    b.free(u);
                }
                b.free(logits);
            }
            b.at(Phase::LossBackward, step);
            let dlogits = logprobs.map(|lp| {
                let nll = b.alloc("nll_loss grad", Component::LogitsLoss, t * v, 4);
                let dls = b.alloc("log_softmax grad", Component::LogitsLoss, t * v, 4);
                b.free(nll);
                b.free(lp);
                let dlogits = b.alloc("logits grad", Component::LogitsLoss, t * v, logit_bytes);
                b.free(dls);
                dlogits
            });
            if let Some(x) = softcap {
                b.free(x);
            }
            if cublas.len() == 1 {
                cublas.push(b.alloc(
                    "cuBLAS workspace (backward)",
                    Component::Transients,
                    device.cublas_workspace_bytes,
                    1,
                ));
            }
            let fresh = make_grads(&mut b, &ps, heads.iter().copied(), &mut grads, gb);
            b.free_all(fresh);
            let dhidden = b.alloc("hidden grad", Component::Transients, t * h, r.stream_bytes);
            if let Some(d) = dlogits {
                b.free(d);
            }
            b.free_all(head_saved);
            // Layers in reverse: the recompute (checkpointing), the layer's gradients, its
            // backward's transients, then its saved tensors freed.
            b.at(Phase::LayerBackward, step);
            for k in (0..layers.len()).rev() {
                let mut rec = Vec::new();
                if job.gradient_checkpointing {
                    rec.extend(layer_forward(&mut b, k, "recomputed"));
                    rec.extend(copies_of(&mut b, k));
                }
                // A full fine-tune's gradients come first, in `named_parameters` order.
                let mut fresh = if full {
                    make_grads(&mut b, &ps, ranges[k].clone(), &mut grads, gb)
                } else {
                    Vec::new()
                };
                // The backward's activation gradients, in the shapes of the layer's tensors.
                let temps: Vec<Tensor<'m>> = if full {
                    // Two MLP-wide temporaries (decoders; an encoder's widest tensor).
                    let w = saved_by_layer[k].iter().copied().max().unwrap_or(0);
                    vec![w; 2]
                } else {
                    saved_tensors(acts.layer_backward_transient, t, model, e)
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
                // Each module's weight gradient follows its input gradient; backward reaches
                // a layer's modules in the reverse of their forward order.
                if !full {
                    fresh = make_grads(&mut b, &ps, ranges[k].clone().rev(), &mut grads, gb);
                }
                if dequant > 0 {
                    b.transient("dequantized weight", Some(k as u64), dequant);
                }
                b.free_all(temps);
                b.free_all(fresh);
                b.free_all(rec);
                b.free_all(saved.pop().unwrap_or_default());
            }
            // The final norm and the embedding (an encoder's tables); a tied embedding sums
            // its two gradients out of place.
            b.at(Phase::BackwardEnd, step);
            let fresh = make_grads(&mut b, &ps, firsts.iter().copied(), &mut grads, gb);
            b.free_all(fresh);
            if tied && full {
                let incoming = b.alloc(
                    "embedding grad (lookup)",
                    Component::Transients,
                    ps[0].numel,
                    gb,
                );
                let sum = b.alloc(
                    "embedding grad (sum)",
                    Component::Gradients,
                    ps[0].numel,
                    gb,
                );
                b.free(incoming);
                if let Some(old) = grads[0].replace(sum) {
                    b.free(old);
                }
            }
            b.free(dhidden);
            b.free(labels);
            b.free(input_ids);
        }
        // The optimizer step: HF's parameter groups (weights with decay, then norms and
        // biases), the states made in the first step; foreach AdamW's `_foreach_sqrt`
        // copies of the second moments.
        b.at(Phase::OptimizerStep, step);
        let norm = |j: usize| !ps[j].linear && ps[j].numel <= 2 * h;
        let order: Vec<usize> = (0..n)
            .filter(|&j| ps[j].trainable && !norm(j))
            .chain((0..n).filter(|&j| ps[j].trainable && norm(j)))
            .collect();
        let pb = optimizer::trainable_bytes(job, r);
        if states.is_empty() {
            for &j in &order {
                let p = &ps[j];
                let tr = Trainable {
                    copies: 1,
                    numel: p.numel,
                    shape: (p.numel, 1),
                    embedding: p.embedding,
                };
                let (bytes, _) = optimizer::state_bytes(&tr, job.optimizer, pb, r);
                states.push(b.alloc_in(
                    "exp_avg",
                    p.module,
                    p.layer,
                    Component::OptimizerStates,
                    bytes / 2,
                    1,
                ));
                states.push(b.alloc_in(
                    "exp_avg_sq",
                    p.module,
                    p.layer,
                    Component::OptimizerStates,
                    bytes - bytes / 2,
                    1,
                ));
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
        // zero_grad(set_to_none=True) (torch ≥ 2.0).
        if !job.versions.zero_grad_keeps_grads() {
            for g in &mut grads {
                if let Some(x) = g.take() {
                    b.free(x);
                }
            }
        }
    }
    Some(b.finish())
}
/// The tensors a post-LN encoder layer (transformers `BertLayer`) saves, per token, in the
/// dtypes `activations::encoder_layer_bytes` counts them: the layer input (or, under
/// autocast, q/k/v's three 16-bit casts of it); eager attention's q, k, v copies, softmax
/// output, dropout mask and dropped probabilities (SDPA: q, k, v, output); the context copy;
/// each sublayer's dropout mask and LayerNorm input; the intermediate's input cast; GELU's
/// input and output.
fn encoder_tensors(model: &ModelSpec, job: &Job, r: &Regime) -> Vec<u64> {
    let h = model.hidden_size;
    let i = model.intermediate_size;
    let a = model.num_heads;
    let seq = job.seq_len;
    let s = r.stream_bytes;
    let o = if r.autocast { 2 } else { s };
    let p = super::super::activations::eager_probs_bytes(r, o);
    let dropout = model.encoder.as_ref().is_some_and(|e| e.hidden_dropout);
    let attention_dropout = model.encoder.as_ref().is_some_and(|e| e.attention_dropout);
    let mut v = if r.autocast {
        vec![2 * h; 3]
    } else {
        vec![s * h]
    };
    match job.attention {
        crate::job::Attention::Eager => {
            v.extend([o * h; 3]);
            v.push(p * a * seq);
            if attention_dropout {
                v.push(a * seq);
                v.push(if r.autocast { 2 } else { p } * a * seq);
            }
        }
        _ => v.extend([o * h; 4]),
    }
    v.push(o * h);
    for _ in 0..2 {
        if dropout {
            v.push(h);
        }
        v.push(s.max(o) * h);
    }
    if r.autocast {
        v.push(2 * h);
    }
    v.extend([o * i, o * i]);
    v
}

/// The tensors a decoder layer saves for backward, per token (HF Llama-style layer, SDPA or
/// flash attention): each RMSNorm's fp32 upcast of its input and its 16-bit normalized output
/// and weighted output; q, k, v and the rotary q and k; the attention output; the MLP's gate
/// and up outputs, the activation and the product. `e` is the activations' bytes.
fn layer_tensors(model: &ModelSpec, g: &LayerGroup, e: u64) -> Vec<u64> {
    let h = model.hidden_size;
    let q = model.num_heads * model.head_dim;
    let kv = model.num_kv_heads * model.head_dim;
    let i = g
        .linears
        .iter()
        .filter(|l| l.in_features == h && l.out_features != h)
        .map(|l| l.out_features)
        .filter(|&w| w != q + 2 * kv && w != q && w != kv)
        .max()
        .unwrap_or(model.intermediate_size);
    let norm = [4 * h, e * h, e * h];
    let mut v = Vec::new();
    v.extend(norm);
    v.extend([e * q, e * kv, e * kv, e * q, e * kv, e * q]);
    v.extend(norm);
    v.extend([e * i; 4]);
    v
}
