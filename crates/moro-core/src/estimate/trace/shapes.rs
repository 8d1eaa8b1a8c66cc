//! What a layer saves for backward, as tensors of the shapes the step trace allocates
//! ([`super::step`]).

use crate::job::Job;
use crate::model::ModelSpec;

use super::super::Regime;

/// A decoder layer's saved bytes cut into the tensors it saves, in the order it saves them:
/// the attention block's RMSNorm keeps its fp32 upcast of the input, then hidden-wide
/// tensors (normalized input, q, k, v, the rotary copies, the attention output, LoRA's
/// input casts), the MLP block's norm its upcast, the MLP's four intermediate-wide tensors
/// (gate and up outputs, the activation, the product), and the rest, the last one smaller.
/// `e`: bytes per element of the layer's matmul outputs. `maps`: eager attention's
/// score-sized tensors ([`attention_maps`]), saved after q, k and v.
pub(super) fn saved_tensors(
    bytes: u64,
    t: u64,
    model: &ModelSpec,
    e: u64,
    maps: &[u64],
) -> Vec<u64> {
    let mut rest = bytes;
    let mut score_sized = Vec::new();
    for &m in maps {
        if m <= rest {
            rest -= m;
            score_sized.push(m);
        }
    }
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
    out.extend(score_sized);
    out.extend(norms.get(1));
    out.extend(mlp);
    out.extend(after);
    if tail > 0 {
        out.push(tail);
    }
    out
}

/// The score-sized tensors eager attention saves per decoder layer (transformers 5.25
/// `eager_attention_forward`): `softmax(.., dtype=float32)`'s output, kept by its
/// backward, and its cast to the query's dtype, kept by the product with `v`; Gemma 2's
/// soft cap adds `tanh`'s output. The same bytes `Activations` counts for them.
pub(super) fn attention_maps(model: &ModelSpec, job: &Job, attn_b: u64) -> Vec<u64> {
    if job.attention != crate::job::Attention::Eager || model.attention_sinks {
        return Vec::new();
    }
    let scores = job.micro_batch_size * model.num_heads * job.seq_len * job.seq_len;
    let mut v = vec![4 * scores, attn_b * scores];
    if model.attn_softcapping {
        v.insert(0, attn_b * scores);
    }
    v
}

/// The tensors a post-LN encoder layer (transformers `BertLayer`) saves, per token, in the
/// dtypes `activations::encoder_layer_bytes` counts them: the layer input (or, under
/// autocast, q/k/v's three 16-bit casts of it); eager attention's q, k, v copies, softmax
/// output, dropout mask and dropped probabilities (SDPA: q, k, v, output); the context copy;
/// each sublayer's dropout mask and LayerNorm input; the intermediate's input cast; GELU's
/// input and output.
pub(super) fn encoder_tensors(model: &ModelSpec, job: &Job, r: &Regime) -> Vec<u64> {
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
