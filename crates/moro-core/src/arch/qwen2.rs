//! `qwen2`, `qwen2_moe`, `qwen3`, `qwen3_moe`: Llama-style decoders with Qwen's specifics.
//!
//! - Qwen2 / Qwen2-MoE: q, k, v carry a bias, o does not (`Qwen2Attention` hard-codes it;
//!   the configs have no `attention_bias` key; Qwen2-MoE has `qkv_bias`, default true).
//! - Qwen3 / Qwen3-MoE: no qkv bias (`attention_bias`, default false) but per-layer RMSNorm
//!   `q_norm` and `k_norm` over `head_dim` (+2·hd per layer).
//! - Sliding window: only when `use_sliding_window` (default false), on layers with index
//!   ≥ `max_window_layers` (default 28), window `sliding_window` (default 4096); an explicit
//!   `layer_types` list wins (transformers ≥ 4.53).
//! - MoE: layer i is sparse when i ∉ `mlp_only_layers` and (i+1) % `decoder_sparse_step` == 0
//!   (transformers `Qwen2MoeDecoderLayer` / `Qwen3MoeDecoderLayer`); router `gate` (Linear
//!   H→E, no bias) and experts `gate_proj`/`up_proj`/`down_proj` of `moe_intermediate_size`.
//!   Qwen2-MoE adds one `shared_expert` of `shared_expert_intermediate_size` and a
//!   `shared_expert_gate` Linear H→1.

use super::ArchError;
use super::cfg::{Cfg, MAX_EXPERTS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, MoeSpec, NormKind};

/// Parses a `qwen2`, `qwen2_moe`, `qwen3` or `qwen3_moe` config.
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let qwen3 = model_type.starts_with("qwen3");
    let sparse = model_type.ends_with("_moe");
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let intermediate = c.dim("intermediate_size", MAX_INTERMEDIATE)?;
    let layers = c.dim("num_hidden_layers", MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    // Qwen3Config defaults head_dim to 128; the others derive it from hidden / heads.
    let hd_default = (model_type == "qwen3").then_some(128);
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        None,
        hd_default,
    )?;
    let qkv_bias = match model_type {
        "qwen2" => true,
        "qwen2_moe" => c.bool_or("qkv_bias", true)?,
        _ => c.bool_or("attention_bias", false)?,
    };
    // Qwen3 uses `attention_bias` for o_proj too; Qwen2 never biases o_proj.
    let o_bias = qwen3 && qkv_bias;

    let window = if c.bool_or("use_sliding_window", false)? {
        common::sliding_window(c, Some(4096))?
    } else {
        None
    };
    let max_window_layers = c.uint_or("max_window_layers", 28, u64::MAX)?;
    let attention = common::pattern(c, layers, window, |i| i >= max_window_layers)?;

    let moe = if sparse {
        moe_block(c, model_type, hidden, layers)?
    } else {
        None
    };
    let kinds = attention
        .into_iter()
        .zip(0u64..)
        .map(|(a, i)| (a, moe.as_ref().is_some_and(|m| m.sparse(i))))
        .collect();

    let mut spec = common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // All four configs default tie_word_embeddings to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 32768)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias,
        o_bias,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, qkv_bias, o_bias),
        // input_layernorm + post_attention_layernorm; Qwen3 adds q_norm + k_norm (head_dim).
        layer_other: 2 * hidden + if qwen3 { 2 * heads.hd } else { 0 },
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe: moe.map(|m| (m.spec, m.linears, 0)),
        kinds,
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;
    spec.qk_norm = qwen3;
    Ok(spec)
}

/// The resolved MoE block and its layer placement.
struct Moe {
    spec: MoeSpec,
    linears: Vec<Linear>,
    step: u64,
    dense_only: Vec<u64>,
}

impl Moe {
    /// Whether layer `i` is sparse.
    fn sparse(&self, i: u64) -> bool {
        !self.dense_only.contains(&i) && (i + 1).is_multiple_of(self.step)
    }
}

/// Reads the MoE keys with `Qwen2MoeConfig` / `Qwen3MoeConfig` defaults
/// (60 experts, top-4, 1408, shared 5632 / 128 experts, top-8, 768, no shared).
/// `num_experts: 0` means no sparse layer at all (transformers checks `num_experts > 0`).
fn moe_block(
    c: &Cfg<'_>,
    model_type: &str,
    hidden: u64,
    layers: u64,
) -> Result<Option<Moe>, ArchError> {
    let qwen2 = model_type == "qwen2_moe";
    let experts = c.uint_or("num_experts", if qwen2 { 60 } else { 128 }, MAX_EXPERTS)?;
    if experts == 0 {
        return Ok(None);
    }
    let top_k = c.dim_or(
        "num_experts_per_tok",
        if qwen2 { 4 } else { 8 },
        MAX_EXPERTS,
    )?;
    common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
    let moe_i = c.dim_or(
        "moe_intermediate_size",
        if qwen2 { 1408 } else { 768 },
        MAX_INTERMEDIATE,
    )?;
    let shared_i = if qwen2 {
        c.uint_or("shared_expert_intermediate_size", 5632, MAX_INTERMEDIATE)?
    } else {
        0
    };
    let step = c.dim_or("decoder_sparse_step", 1, MAX_LAYERS)?;
    let dense_only = c.uint_list("mlp_only_layers")?;
    let mut linears = common::moe_linears(hidden, experts, top_k, moe_i, shared_i);
    if shared_i > 0 {
        linears.push(Linear::new(
            "shared_expert_gate",
            hidden,
            1,
            false,
            LinearRole::Router,
        ));
    }
    let first_dense = (0..layers)
        .take_while(|i| dense_only.contains(i) || (i + 1) % step != 0)
        .count();
    Ok(Some(Moe {
        spec: MoeSpec {
            num_experts: experts,
            experts_per_token: top_k,
            num_shared_experts: u64::from(shared_i > 0),
            expert_intermediate_size: moe_i,
            shared_intermediate_size: shared_i,
            first_dense_layers: u64::try_from(first_dense).unwrap_or(0),
        },
        linears,
        step,
        dense_only,
    }))
}
