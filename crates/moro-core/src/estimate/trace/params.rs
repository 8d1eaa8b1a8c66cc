//! The parameters of a step's model as the trace lists them ([`super::step`]).

use crate::job::{Job, Method, PeftKind, Quantization};
use crate::model::{Linear, ModelSpec};

use super::super::{Regime, weights};

/// A parameter as the step sees it.
pub(super) struct Param<'m> {
    pub(super) name: &'static str,
    pub(super) module: Option<&'m str>,
    pub(super) layer: Option<u64>,
    pub(super) numel: u64,
    /// Bytes per element as stored.
    pub(super) dtype_bytes: u64,
    pub(super) trainable: bool,
    /// A matmul weight (autocast keeps a 16-bit copy of a trainable fp32 one).
    pub(super) linear: bool,
    /// The token embedding (bitsandbytes 8-bit: 32-bit states under the HF Trainer).
    pub(super) embedding: bool,
    /// PEFT's own, after the model's (VeRA's shared buffers, prompt and prefix tuning's
    /// embeddings): trainable ones get their gradient when the backward ends.
    pub(super) peft_extra: bool,
}

/// The model's parameters in `named_parameters` order: the embedding (and an encoder's
/// position and token-type tables and their LayerNorm), each layer's Linears (PEFT: the
/// base weight, then `lora_A` and `lora_B`; Qwen3's q and k norms after `o_proj`) and then
/// its norms, the final norm, lm_head
/// when untied (an encoder's pooler and classifier instead). A 4-bit base weight is its
/// packed `uint8` storage followed by its quantization state (absmax and, double quantized,
/// their own codes).
#[allow(clippy::too_many_lines)]
pub(super) fn params<'m>(model: &'m ModelSpec, job: &Job, r: &Regime) -> Vec<Param<'m>> {
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
        peft_extra: false,
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
            // Qwen3's per-head q and k norms follow `o_proj` (`self_attn`'s parameters).
            let qk_norms = if model.qk_norm { 2 * model.head_dim } else { 0 };
            for l in &g.linears {
                for _ in 0..l.count {
                    push_linear(&mut out, model, job, r, l, index, quantized, frozen, plain);
                }
                if qk_norms > 0 && l.name == "o_proj" {
                    for name in ["q_norm", "k_norm"] {
                        out.push(Param {
                            layer: Some(index),
                            ..outside(name, model.head_dim, false)
                        });
                    }
                }
            }
            let norms = g.other_params.saturating_sub(qk_norms) / h.max(1);
            for _ in 0..norms {
                out.push(Param {
                    layer: Some(index),
                    ..outside("norm", h, false)
                });
                push_ln_copy(&mut out, job, r, Some(index), h);
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
    push_ln_copy(&mut out, job, r, None, h);
    if !model.tie_word_embeddings {
        out.push(Param {
            module: Some("lm_head"),
            ..outside("weight", model.vocab_size * h, true)
        });
    }
    // VeRA's random A and B, shared by every adapted Linear: frozen fp32 buffers
    // ([`weights::vera_buffers`]).
    let vera = weights::vera_buffers(model, job);
    if vera > 0 {
        out.push(Param {
            dtype_bytes: 4,
            peft_extra: true,
            ..outside("vera_A and vera_B", vera / 4, false)
        });
    }
    // BOFT's permutations, one fp32 buffer per adapted Linear, where the trainer moved them
    // to the GPU ([`weights::boft_permutations`]); buffers come after the parameters.
    for bytes in weights::boft_permutations(model, job) {
        out.push(Param {
            dtype_bytes: 4,
            peft_extra: true,
            ..outside("boft_P", bytes / 4, false)
        });
    }
    // Prompt tuning's `PromptEmbedding` and prefix tuning's `PrefixEncoder`: the
    // `prompt_encoder` PEFT registers after the base model ([`weights::lora_tensors`]).
    if job.method.is_peft() && job.adapter.method.uses_virtual_tokens() {
        let numel: u64 = weights::lora_tensors(model, job)
            .iter()
            .map(|&(n, (a, b))| n * a * b)
            .sum();
        out.push(Param {
            dtype_bytes: r.adapter_bytes,
            trainable: true,
            peft_extra: true,
            embedding: true,
            ..outside("prompt_encoder", numel, false)
        });
    }
    out
}

/// LN tuning's trainable copy of a norm (`LNTuningLayer.update_layer`: `deepcopy(layer)`,
/// registered after the norm's own weight), in the norm's dtype ([`Regime::adapter_bytes`]).
fn push_ln_copy(out: &mut Vec<Param<'_>>, job: &Job, r: &Regime, layer: Option<u64>, h: u64) {
    if job.method.is_peft() && job.adapter.method == PeftKind::LnTuning {
        out.push(Param {
            name: "ln_tuning_layers",
            module: None,
            layer,
            numel: h,
            dtype_bytes: r.adapter_bytes,
            trainable: true,
            linear: false,
            embedding: false,
            peft_extra: false,
        });
    }
}

/// One Linear's parameters: its weight (packed and quantization state when 4-bit), its
/// bias (with the weight in a full fine-tune, see the module's notes), and its LoRA pair
/// when adapted.
#[allow(clippy::too_many_arguments)]
fn push_linear<'m>(
    out: &mut Vec<Param<'m>>,
    model: &ModelSpec,
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
        peft_extra: false,
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
    if job.method.is_peft() && job.adapter.method.uses_targets() && job.adapts(l) {
        for (name, (rows, cols)) in weights::adapter_tensors(model, job, l) {
            out.push(of(name, rows * cols, r.adapter_bytes, true));
        }
    }
}
