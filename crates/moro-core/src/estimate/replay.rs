//! The fragmentation of a full fine-tune's training steps, from the order and sizes of their
//! allocations replayed through [`CachingAllocator`].
//!
//! A full fine-tune's optimizer creates its states lazily, in the first `step()`, after the
//! backward freed the activations and the loss's buffers: the states take those blocks and
//! split them, and the second forward's activations and logits no longer find whole blocks
//! of their size, so the allocator `cudaMalloc`s new segments. No ratio of the churn
//! captures that (`calibration/README.md`: replaying the real step's allocation sequence,
//! traced on fake tensors, reproduced the H200's reserved peaks; moro's ratio was 1.7 to
//! 5.7 GiB under for the full fine-tunes). This module generates the sequence at tensor
//! granularity from the model's shapes — every parameter, its gradient and its states in
//! `named_parameters` order, a decoder layer's saved tensors, the standard loss's logits
//! buffers — and replays two steps. The result used is the replay's reserved peak minus
//! its allocated peak: the fragmentation, added on top of moro's per-op allocated peak.
//!
//! Modelled: one GPU, full fine-tuning on the `hf` / `trl` stacks with an AdamW (foreach,
//! fused, or bitsandbytes 8-bit), of a dense decoder with the standard loss, or of a
//! BERT-style encoder without checkpointing (`encoder_tensors`). On the 9 full
//! fine-tunes of `validation/h200/` the replayed fragmentation is 1.2 to 6.8 GiB against
//! 1.0 to 8.4 GiB measured (moro's ratio: 1.0 to 2.0 GiB).

use crate::caching_allocator::{CachingAllocator, Handle};
use crate::job::{Job, LossImpl, Method, Optimizer, Sharding};
use crate::model::{LayerGroup, ModelSpec};

use super::Regime;
use super::regime::grad_bytes;

/// Whether [`step_fragmentation`] models `job`.
#[must_use]
pub fn models(model: &ModelSpec, job: &Job, r: &Regime) -> bool {
    job.method == Method::Full
        && job.stack.profile().step_replay
        && job.parallel.gpus() == 1
        && job.parallel.sharding == Sharding::None
        && model.moe.is_none()
        && !job.optimizer_in_backward
        && match &model.encoder {
            // Encoders without checkpointing: with it, the replay comes out 10–16 % over
            // the HF docs' BERT-large rows (`hf-docs-perf-train-gpu-one-003/005/009`), whose
            // recompute it does not yet describe.
            Some(_) => !job.gradient_checkpointing,
            None => matches!(r.loss, LossImpl::Standard),
        }
        && matches!(
            job.optimizer,
            Optimizer::AdamwTorch | Optimizer::AdamwTorchFused | Optimizer::Adamw8bit
        )
}

/// One parameter: its elements, and whether the layer holding it is a decoder layer
/// (`Some(index)`) or not.
struct Param {
    numel: u64,
    layer: Option<usize>,
    /// A Linear's weight (autocast keeps a 16-bit copy of it), not a norm.
    linear: bool,
}

/// The model's parameters in `named_parameters` order: the embedding, each layer's Linears
/// then its norms, the final norm, lm_head when untied.
fn params(model: &ModelSpec) -> Vec<Param> {
    let h = model.hidden_size;
    let outside = |numel: u64| Param {
        numel,
        layer: None,
        linear: false,
    };
    let mut out = vec![outside(model.vocab_size * h)];
    if let Some(enc) = &model.encoder {
        // BERT-style embeddings: position and token-type tables and their LayerNorm.
        out.push(outside(model.position_embeddings * h));
        out.push(outside(enc.type_vocab_size * h));
        out.push(outside(2 * h));
    }
    let mut index = 0;
    for g in &model.layers {
        for _ in 0..g.count {
            for l in &g.linears {
                out.push(Param {
                    numel: l.params(),
                    layer: Some(index),
                    linear: true,
                });
            }
            let norms = g.other_params / h.max(1);
            for _ in 0..norms {
                out.push(Param {
                    numel: h,
                    layer: Some(index),
                    linear: false,
                });
            }
            index += 1;
        }
    }
    if let Some(enc) = &model.encoder {
        // The pooler and the classifier (`BertForSequenceClassification`).
        out.push(Param {
            numel: h * h + h,
            layer: None,
            linear: true,
        });
        out.push(Param {
            numel: h * enc.num_labels + enc.num_labels,
            layer: None,
            linear: true,
        });
        return out;
    }
    out.push(outside(h));
    if !model.tie_word_embeddings {
        out.push(outside(model.vocab_size * h));
    }
    out
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
    let p = super::activations::eager_probs_bytes(r, o);
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

/// The replayed fragmentation (reserved peak − allocated peak) of two training steps of
/// `job` on one GPU, in bytes; 0 where [`models`] is false.
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn step_fragmentation(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    if !models(model, job, r) {
        return 0;
    }
    let t = job.micro_batch_size * job.seq_len;
    let h = model.hidden_size;
    let v = model.vocab_size;
    let pb = r.param_bytes;
    let gb = grad_bytes(job, r);
    // Each of AdamW's two states per element: the parameter's dtype (torch), 1 byte
    // (bitsandbytes 8-bit).
    let sb = if job.optimizer == Optimizer::Adamw8bit {
        1
    } else {
        pb
    };
    let e = if r.autocast {
        2
    } else {
        pb.min(r.compute_bytes.max(2))
    };
    let ps = params(model);
    let layers: Vec<&LayerGroup> = model
        .layers
        .iter()
        .flat_map(|g| std::iter::repeat_n(g, usize::try_from(g.count).unwrap_or(0)))
        .collect();
    // Per layer: its saved tensors (bytes) and the range of its parameters in `ps`.
    let encoder = model.encoder.is_some();
    let tensors: Vec<Vec<u64>> = layers
        .iter()
        .map(|g| {
            if encoder {
                encoder_tensors(model, job, r)
            } else {
                layer_tensors(model, g, e)
            }
            .into_iter()
            .map(|b| b * t)
            .collect()
        })
        .collect();
    let mut ranges: Vec<std::ops::Range<usize>> = vec![0..0; layers.len()];
    for (j, p) in ps.iter().enumerate() {
        if let Some(k) = p.layer {
            let range = &mut ranges[k];
            if range.start == range.end {
                *range = j..j + 1;
            } else {
                range.end = j + 1;
            }
        }
    }
    let mut a = CachingAllocator::new();
    for p in &ps {
        a.malloc(p.numel * pb);
    }
    a.reset_peaks();
    // The allocated peak, noted at the moments it can happen.
    let mut peak = 0u64;
    let mut note = |a: &CachingAllocator| peak = peak.max(a.allocated());
    let mut grads: Vec<Option<Handle>> = vec![None; ps.len()];
    let mut states: Vec<Handle> = Vec::new();
    let cache = |a: &mut CachingAllocator, layer: usize| -> Vec<Handle> {
        if r.autocast && r.autocast_weight_copies {
            ps[ranges[layer].clone()]
                .iter()
                .filter(|p| p.linear)
                .map(|p| a.malloc(p.numel * 2))
                .collect()
        } else {
            Vec::new()
        }
    };
    let free_all = |a: &mut CachingAllocator, hs: Vec<Handle>| {
        for x in hs {
            a.free(x);
        }
    };
    let accumulate = job.grad_accum.max(1);
    let tied = model.tie_word_embeddings && !encoder;
    // The head's gradients, made in the loss's backward: lm_head's (its own parameter, last,
    // or the tied embedding's, first), or an encoder's pooler and classifier. The last ones,
    // made at the end of backward: the final norm and the embedding, or an encoder's
    // embedding tables and their LayerNorm.
    let n = ps.len();
    let (heads, firsts): (Vec<usize>, Vec<usize>) = if encoder {
        (vec![n - 2, n - 1], vec![0, 1, 2, 3])
    } else if tied {
        (vec![0], vec![n - 1])
    } else {
        (vec![n - 1], vec![n - 2, 0])
    };
    for _step in 0..2 {
        for _ in 0..accumulate {
            // Forward: each layer saves its input (checkpointing) or its tensors.
            let mut saved: Vec<Vec<Handle>> = Vec::with_capacity(layers.len());
            let mut copies = Vec::new();
            for (k, layer) in tensors.iter().enumerate() {
                let wc = cache(&mut a, k);
                if job.gradient_checkpointing {
                    saved.push(vec![a.malloc(e * h * t)]);
                    copies.extend(wc);
                } else {
                    let mut s: Vec<Handle> = layer.iter().map(|&b| a.malloc(b)).collect();
                    s.extend(wc);
                    saved.push(s);
                }
            }
            // The autocast cache is cleared when the forward leaves autocast.
            free_all(&mut a, copies);
            // The standard loss: bf16 logits, their fp32 copy, fp32 log-probs; in backward
            // the nll and log_softmax gradients, then the bf16 gradient of the logits. An
            // encoder's classification loss is a few bytes a sequence.
            let last = a.malloc(e * h * t);
            let dlogits = if encoder {
                None
            } else {
                let logits = a.malloc(2 * v * t);
                let upcast = a.malloc(4 * v * t);
                let logprobs = a.malloc(4 * v * t);
                note(&a);
                let nll = a.malloc(4 * v * t);
                let dlogsoftmax = a.malloc(4 * v * t);
                note(&a);
                a.free(nll);
                a.free(logprobs);
                let dlogits = a.malloc(2 * v * t);
                a.free(dlogsoftmax);
                a.free(upcast);
                a.free(logits);
                Some(dlogits)
            };
            let mut fresh = Vec::new();
            for &j in &heads {
                match grads[j] {
                    None => grads[j] = Some(a.malloc(ps[j].numel * gb)),
                    Some(_) => fresh.push(a.malloc(ps[j].numel * gb)),
                }
            }
            free_all(&mut a, fresh);
            let dhidden = a.malloc(e * h * t);
            if let Some(d) = dlogits {
                a.free(d);
            }
            a.free(last);
            // Layers in reverse: recompute (checkpointing), the layer's gradients, its
            // backward's two MLP-wide temporaries, then its tensors freed.
            for (k, layer) in tensors.iter().enumerate().rev() {
                let mut rec: Vec<Handle> = Vec::new();
                if job.gradient_checkpointing {
                    rec = layer.iter().map(|&b| a.malloc(b)).collect();
                    rec.extend(cache(&mut a, k));
                }
                let mut fresh = Vec::new();
                for j in ranges[k].clone() {
                    match grads[j] {
                        None => grads[j] = Some(a.malloc(ps[j].numel * gb)),
                        // A later micro-batch's gradient, added into `.grad` in place.
                        Some(_) => fresh.push(a.malloc(ps[j].numel * gb)),
                    }
                }
                // Decoders: the MLP width; encoders: the widest (eager attention's scores).
                let w = if encoder {
                    layer.iter().copied().max()
                } else {
                    layer.last().copied()
                }
                .unwrap_or(0);
                let t1 = a.malloc(w);
                let t2 = a.malloc(w);
                note(&a);
                a.free(t1);
                a.free(t2);
                free_all(&mut a, fresh);
                free_all(&mut a, rec);
                free_all(&mut a, saved.pop().unwrap_or_default());
            }
            // The final norm and the embedding (an encoder's embedding tables); a tied
            // embedding sums its two gradients out of place.
            let mut fresh = Vec::new();
            for &j in &firsts {
                match grads[j] {
                    None => grads[j] = Some(a.malloc(ps[j].numel * gb)),
                    Some(_) => fresh.push(a.malloc(ps[j].numel * gb)),
                }
            }
            if tied {
                let incoming = a.malloc(ps[0].numel * gb);
                let sum = a.malloc(ps[0].numel * gb);
                note(&a);
                a.free(incoming);
                if let Some(old) = grads[0].replace(sum) {
                    a.free(old);
                }
            }
            free_all(&mut a, fresh);
            a.free(dhidden);
        }
        // The optimizer step: HF's parameter groups (weights with decay, then norms), the
        // states created in the first step; foreach AdamW's `_foreach_sqrt` copies.
        let norm = |j: usize| !ps[j].linear && ps[j].numel <= 2 * h;
        let order: Vec<usize> = (0..ps.len())
            .filter(|&j| !norm(j))
            .chain((0..ps.len()).filter(|&j| norm(j)))
            .collect();
        if states.is_empty() {
            for &j in &order {
                states.push(a.malloc(ps[j].numel * sb));
                states.push(a.malloc(ps[j].numel * sb));
            }
        }
        note(&a);
        if job.optimizer == Optimizer::AdamwTorch {
            let tmp: Vec<Handle> = order.iter().map(|&j| a.malloc(ps[j].numel * sb)).collect();
            note(&a);
            free_all(&mut a, tmp);
        }
        // zero_grad(set_to_none=True) (torch ≥ 2.0).
        if !job.versions.zero_grad_keeps_grads() {
            for g in &mut grads {
                if let Some(x) = g.take() {
                    a.free(x);
                }
            }
        }
    }
    a.peak_reserved().saturating_sub(peak)
}
