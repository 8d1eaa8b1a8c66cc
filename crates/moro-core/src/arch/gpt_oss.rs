//! `gpt_oss`: OpenAI's gpt-oss (transformers 5.24 `models/gpt_oss/modeling_gpt_oss.py`).
//!
//! - Attention: `q_proj`/`k_proj`/`v_proj`/`o_proj` with a bias (`attention_bias`, default
//!   true), one learned sink logit per head (`sinks`), alternating sliding (128 tokens) and
//!   full layers (`layer_types`; absent: layer i slides when i is even, `GptOssConfig`).
//! - Every MLP is a mixture of experts without a shared expert: `GptOssTopKRouter` holds a
//!   weight `E × H` and a bias `E` and calls `F.linear` itself; `GptOssExperts` holds
//!   `gate_up_proj` `E × H × 2I` with `gate_up_proj_bias` `E × 2I` and `down_proj`
//!   `E × I × H` with `down_proj_bias` `E × H`, run through `grouped_mm`. None of them is an
//!   `nn.Linear` ([`WeightLayout::Stacked`]).
//! - RMSNorm `input_layernorm`, `post_attention_layernorm` and the final `norm`, kept in
//!   fp32 (`_keep_in_fp32_modules`).
//!
//! `GptOssConfig` defaults: 36 layers, 128 experts, top-4, vocabulary 201,088, hidden and
//! expert width 2,880, 64 query and 8 KV heads of 64, context 131,072, untied lm_head.

use super::ArchError;
use super::cfg::{Cfg, MAX_EXPERTS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{
    Dtype, ExpertGate, Linear, LinearRole, ModelSpec, MoeSpec, NormKind, WeightLayout,
};

/// Parses a `gpt_oss` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_or("hidden_size", 2880, MAX_HIDDEN)?;
    let intermediate = c.dim_or("intermediate_size", 2880, MAX_INTERMEDIATE)?;
    let layers = c.dim_or("num_hidden_layers", 36, MAX_LAYERS)?;
    let vocab = c.dim_or("vocab_size", 201_088, MAX_VOCAB)?;
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        Some(8),
        Some(64),
    )?;
    let bias = c.bool_or("attention_bias", true)?;
    let experts = if c.has("num_local_experts") {
        c.dim("num_local_experts", MAX_EXPERTS)?
    } else {
        c.dim_or("num_experts", 128, MAX_EXPERTS)?
    };
    let top_k = c.dim_or("num_experts_per_tok", 4, MAX_EXPERTS)?;
    common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
    let window = common::sliding_window(c, Some(128))?;
    let attention = common::pattern(c, layers, window, |i| i % 2 == 0)?;

    let fused = |name: &str, i: u64, o: u64, role: LinearRole| Linear {
        count: experts,
        active: if role == LinearRole::Expert { top_k } else { 1 },
        layout: WeightLayout::Stacked,
        ..Linear::new(name, i, o, true, role)
    };
    let router = Linear {
        count: 1,
        ..fused("router", hidden, experts, LinearRole::Router)
    };
    let moe_linears = vec![
        router,
        fused("gate_up_proj", hidden, 2 * intermediate, LinearRole::Expert),
        fused("down_proj", intermediate, hidden, LinearRole::Expert),
    ];
    let moe = MoeSpec {
        num_experts: experts,
        experts_per_token: top_k,
        num_shared_experts: 0,
        expert_intermediate_size: intermediate,
        shared_intermediate_size: 0,
        first_dense_layers: 0,
    };

    let mut spec = common::build(Plan {
        model_type: "gpt_oss".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 131_072)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: true,
        attn: common::qkvo(hidden, heads, bias, bias),
        // input_layernorm + post_attention_layernorm, and the per-head sinks.
        layer_other: 2 * hidden + heads.nh,
        dense_mlp: Vec::new(),
        moe: Some((moe, moe_linears, 0)),
        kinds: attention.into_iter().map(|a| (a, true)).collect(),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;
    spec.attention_sinks = true;
    spec.fp32_norms = true;
    spec.expert_gate = Some(ExpertGate::ClampedSwiglu);
    spec.mxfp4_experts = c
        .opt_object("quantization_config")?
        .and_then(|q| q.get("quant_method"))
        .and_then(serde_json::Value::as_str)
        == Some("mxfp4");
    Ok(spec)
}
