//! MLX's training step: `mlx_lm.lora` (mlx-lm 0.32 `tuner/trainer.py`, mlx 0.32;
//! docs/mlx-memory.md).
//!
//! MLX builds the step as a lazy graph: a forward array lives while a backward node still
//! needs it (each primitive's `vjp` names what it keeps), and `mx.get_peak_memory()` counts
//! live buffers only, without MLX's cache and without any context. The kept set below is
//! read from the vjps; what MLX's breadth-first evaluation keeps on top of it in one layer's
//! backward, and the unfused loss's logits copies, were traced with mlx-lm's own trainer on
//! MLX's CPU backend with Metal's kernels' vjps (`calibration/mlx_trace.py`,
//! `validation/oracle-traces/mlx.jsonl`).

use super::{Component, Phase, PhaseBytes, Regime};
use crate::job::{AffineQuant, Job, Method};
use crate::model::{LinearRole, ModelSpec};

/// Bytes per token and per element of `h + I` that one layer's backward keeps in flight
/// under MLX's evaluation, beside the kept arrays: the layer's cotangents, the fp32 cotangents
/// of its adapters' branches and independent branches evaluated side by side (`eval_impl`
/// builds its tape breadth-first, up to `MLX_BFS_MAX_WIDTH` = 20 arrays wide). Traced, not
/// derived: about ten fp32 arrays of the layer's widths, whatever the adapted modules, on
/// Qwen3-0.6B, Qwen2.5-0.5B and Llama-3.2-1B shapes (`validation/oracle-traces/mlx.jsonl`).
pub const LAYER_BACKWARD_BYTES: u64 = 40;

/// The same while the loss's buffers are alive: the traces whose vocabulary makes the loss
/// the peak hold eight such arrays there.
pub const AT_LOSS_BYTES: u64 = 32;

/// Logits-sized (`b·s·V`, 16-bit) arrays alive in the backward of `nn.losses.cross_entropy`
/// without the fused kernel (mlx before 0.32.2, or not on a GPU): the kept shifted logits,
/// `softmax` of them, its product with the cotangent and `take_along_axis`'s scattered
/// gradient (traced: 3.99 at 151,936 − 4,096 vocabulary entries).
pub const UNFUSED_LOSS_COPIES: u64 = 4;

/// From mlx 0.32.2 a GPU computes the loss with `mx.fast.cross_entropy`, whose vjp keeps the
/// logits and whose fused backward kernel writes only their gradient
/// (`CrossEntropy::vjp`: `{logits, targets, loss, cotangent}` in, one array out).
pub const FUSED_LOSS_COPIES: u64 = 2;

/// Bytes of the base model's weights as MLX holds them: with affine quantization every
/// Linear and embedding whose input width the group size divides is quantized
/// (`mlx_lm.utils.quantize_model`: `weight.shape[-1] % group_size == 0`), lm_head included,
/// scales and biases in the model's dtype; norms and biases stay 16-bit.
#[must_use]
pub fn weight_bytes(model: &ModelSpec, q: AffineQuant, r: &Regime) -> u64 {
    let p = r.frozen_bytes;
    let quantizable = |cols: u64| cols.is_multiple_of(q.group_size);
    let mut bytes = 0u64;
    let mut numel = 0u64;
    for (layers, l) in model.linears() {
        if quantizable(l.in_features) {
            bytes += layers * l.count * q.bytes(l.out_features, l.in_features, p);
            numel += layers * l.count * l.weight_numel();
        }
    }
    let (v, h) = (model.vocab_size, model.hidden_size);
    let tables = if model.tie_word_embeddings { 1 } else { 2 };
    if quantizable(h) {
        bytes += tables * q.bytes(v, h, p);
        numel += tables * v * h;
    }
    bytes + model.total_params().saturating_sub(numel) * p
}

/// Layers that train: the last `num_layers` (`model.layers[-num_layers:]`).
#[must_use]
pub fn trained_layers(model: &ModelSpec, job: &Job) -> u64 {
    job.adapted_layers
        .unwrap_or(model.num_layers)
        .min(model.num_layers)
}

/// Bytes one trained layer keeps for backward per token, and per sequence (the `s × s`
/// attention arrays), without checkpointing.
///
/// - `fast.rms_norm`'s vjp keeps its input (`RMSNormVJP` from `{x, w, cotangent}`): the
///   layer's input and the residual after attention, `p·h` each; with q/k norms their inputs
///   too (`p·(a·d + k·d)`).
/// - `fast.rope` keeps nothing (`RoPE::vjp` rotates the cotangent back).
/// - Attention trains through the unfused fallback (`ScaledDotProductAttention::use_fallback`:
///   "faster for training on Metal"): `q·scale`, k and v for the two matmuls, the bf16
///   softmax output (`p·a·s²` per sequence) and the `[s, s]` causal mask for `where`.
/// - SwiGLU's product keeps gate and up (`p·I` each; one `p·I` for a plain MLP).
/// - LoRA: `x @ lora_a` promotes x to the fp32 of the adapter (`matmul`: `astype(a,
///   out_type)`), whose matmul keeps it (4 B per input element, one copy per distinct input
///   once `mx.compile` merges equal nodes, one per module under dropout, plus its mask), and
///   the fp32 `x @ lora_a` (`4·r`) for `lora_b`'s gradient.
/// - Full fine-tuning: the 16-bit inputs of every weight's gradient instead (the normed
///   input, attention output, normed residual and MLP activation).
#[must_use]
pub fn layer_kept(model: &ModelSpec, job: &Job, r: &Regime) -> (u64, u64) {
    let p = r.frozen_bytes;
    let h = model.hidden_size;
    let (qw, kvw) = (model.q_width(), model.kv_width());
    let i = model.intermediate_size;
    let mlp = if model.gated_mlp { 2 * i } else { i };
    let mut per_token = p * (2 * h + qw + 2 * kvw + mlp);
    if model.qk_norm {
        per_token += p * (qw + kvw);
    }
    if job.method == Method::Full {
        per_token += p * (2 * h + qw + i);
    } else {
        let mut sources: Vec<u64> = Vec::new();
        let mut modules = 0u64;
        for (_, l) in model.linears() {
            if !job.adapts(l) {
                continue;
            }
            modules += l.count;
            // Modules reading the same tensor share one fp32 copy: those reading the layer's
            // normed input (q, k, v) or the normed residual (gate, up), the attention output
            // (o) and the MLP activation (down).
            let source = match l.role {
                LinearRole::Attention if l.in_features == h => 0,
                LinearRole::Attention => 1,
                _ if l.in_features == h => 2,
                _ => 3,
            };
            if job.adapter.dropout > 0.0 {
                per_token += 5 * l.in_features;
            } else if !sources.contains(&source) {
                sources.push(source);
                per_token += 4 * l.in_features;
            }
        }
        per_token += 4 * job.adapter.rank * modules;
        if job.adapter.dora {
            // DoRA (`tuner/dora.py` `DoRALinear.__call__`): `(m / denom) · out` keeps each
            // adapted module's unscaled output for the magnitude's gradient.
            per_token += p * adapted_shapes(model, job).0;
        }
    }
    let s = job.seq_len;
    let per_sequence = (p * model.num_heads + 1) * s * s;
    (per_token, per_sequence)
}

/// The adapted Linears of one layer: the sum of their output widths and of their weights'
/// elements, and the largest weight.
fn adapted_shapes(model: &ModelSpec, job: &Job) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    for (_, l) in model.linears().filter(|(_, l)| job.adapts(l)) {
        out.0 += l.count * l.out_features;
        out.1 += l.count * l.weight_numel();
        out.2 = out.2.max(l.weight_numel());
    }
    out
}

/// What DoRA adds per trained layer and to the step, in bytes: on a quantized base
/// `w = self._dequantized_weight()` feeds `x @ w.T`, whose vjp keeps the dequantized weight
/// of every adapted Linear (`p` per element); and the weight norm's `adapted = w + (scale ·
/// lora_bᵀ) @ lora_aᵀ` is built in fp32 (the fp32 adapters promote `w`): the copy, the
/// product and the sum of the largest adapted weight are in flight (`4` bytes each).
#[must_use]
pub fn dora_bytes(model: &ModelSpec, job: &Job, r: &Regime) -> (u64, u64) {
    if !job.adapter.dora || job.method == Method::Full {
        return (0, 0);
    }
    let (_, numel, largest) = adapted_shapes(model, job);
    let kept = if job.quantization.mlx().is_some() {
        r.frozen_bytes * numel
    } else {
        0
    };
    (kept, 3 * 4 * largest)
}

/// Optimizer arrays per parameter, each `zeros_like(parameter)` (mlx 0.32
/// `optimizers.py`): Adam and AdamW keep `m` and `v`; `SGD.init_single` always keeps `v`.
const fn state_arrays(job: &Job) -> u64 {
    match job.optimizer {
        crate::job::Optimizer::Sgd | crate::job::Optimizer::SgdMomentum => 1,
        _ => 2,
    }
}

/// The phases of one `mlx_lm.lora` step.
#[must_use]
pub fn training_phases(model: &ModelSpec, job: &Job, r: &Regime) -> Vec<PhaseBytes> {
    let p = r.frozen_bytes;
    let b = job.micro_batch_size;
    let tokens = b * job.seq_len;
    let h = model.hidden_size;
    let n = trained_layers(model, job);
    let weights = super::weights::base_weight_bytes(model, job, r);
    let trainable = r.trainable_params;
    let (adapters, grad_bytes, states) = if job.method == Method::Full {
        // The trained weights are part of `weights`; Adam's `m` and `v` are
        // `zeros_like(parameter)`: the model's dtype.
        (0, p, state_arrays(job) * p * trainable)
    } else {
        (4 * trainable, 4, state_arrays(job) * 4 * trainable)
    };
    // `grad_accumulation_steps > 1` keeps the summed gradients between steps.
    let accumulated = if job.grad_accum > 1 {
        grad_bytes * trainable
    } else {
        0
    };
    let (per_token, per_sequence) = layer_kept(model, job, r);
    let (dora_kept, dora_norm) = dora_bytes(model, job, r);
    let one_layer = tokens * per_token + b * per_sequence + dora_kept;
    let saved = if job.gradient_checkpointing {
        // `mx.checkpoint` keeps each trained layer's input; the backward recomputes one layer.
        n * p * h * tokens
    } else {
        // The lowest trained layer's input needs no gradient: its norm keeps nothing.
        (n * one_layer).saturating_sub(p * h * tokens)
    };
    // The final norm keeps its input.
    let head = p * h * tokens;
    let logits = p * model.vocab_size * tokens;
    let loss_copies = if job.versions.mlx_fused_cross_entropy() {
        FUSED_LOSS_COPIES
    } else {
        UNFUSED_LOSS_COPIES
    };
    let resident = |extra: Vec<(Component, u64)>| {
        let mut c = vec![
            (Component::Weights, weights),
            (Component::Adapters, adapters),
            (Component::OptimizerStates, states),
        ];
        c.extend(extra);
        c
    };
    let recomputed = if job.gradient_checkpointing {
        one_layer
    } else {
        0
    };
    // The softmax's backward makes two score-sized arrays (`dP = dO·vᵀ`, then
    // `probs · (dP − Σ)`).
    let scores = p * model.num_heads * job.seq_len * job.seq_len * b;
    let width = tokens * (h + model.intermediate_size);
    let in_flight = LAYER_BACKWARD_BYTES * width + 2 * scores + dora_norm;
    let layer_grads = if job.method == Method::Full && n > 0 {
        grad_bytes * trainable / n
    } else {
        0
    };
    vec![
        PhaseBytes {
            phase: Phase::Load,
            components: resident(vec![]),
        },
        PhaseBytes {
            phase: Phase::ForwardEnd,
            components: resident(vec![
                (Component::Gradients, accumulated),
                (Component::Activations, saved + head),
                (Component::LogitsLoss, logits * (loss_copies - 1)),
            ]),
        },
        // The last layer's backward is already in flight beside the loss's buffers: the
        // traces with large vocabularies peak here by that much over the kept set.
        PhaseBytes {
            phase: Phase::LossBackward,
            components: resident(vec![
                (Component::Gradients, accumulated),
                (Component::Activations, saved + head + recomputed),
                (Component::LogitsLoss, logits * loss_copies),
                (Component::Transients, AT_LOSS_BYTES * width + dora_norm),
            ]),
        },
        PhaseBytes {
            phase: Phase::LayerBackward,
            components: resident(vec![
                (Component::Gradients, accumulated.max(layer_grads)),
                (Component::Activations, saved + head + recomputed),
                (Component::Transients, in_flight),
            ]),
        },
        // Each gradient is consumed by its parameter's update as soon as it exists (the
        // step is one compiled graph; a full fine-tune of Qwen3-8B peaked 19 GB below all
        // gradients plus new weights and states on a Mac: docs/mlx-memory.md §6).
        PhaseBytes {
            phase: Phase::OptimizerStep,
            components: resident(vec![(
                Component::Gradients,
                if job.method == Method::Full {
                    accumulated.max(layer_grads)
                } else {
                    grad_bytes * trainable
                },
            )]),
        },
    ]
}
