//! `glm4_moe` (GLM-4.5, GLM-4.6): grouped-query attention and a DeepSeek-style MoE
//! (transformers 5.24 `models/glm4_moe/modeling_glm4_moe.py`).
//!
//! - Attention (`Glm4MoeAttention`): `q_proj`, `k_proj`, `v_proj` with bias
//!   `attention_bias`, `o_proj` without; with `use_qk_norm`, RMSNorm `q_norm` and `k_norm`
//!   over `head_dim` each. Partial rotary embeddings have no parameters.
//! - MLP: layers below `first_k_dense_replace` are a dense gated MLP of `intermediate_size`;
//!   the others (`Glm4MoeMoE`) hold the router `gate` (`Glm4MoeTopkRouter.weight`, E × H, kept
//!   in fp32; its `e_score_correction_bias` is a buffer, not a parameter), the routed experts
//!   stacked as `gate_up_proj` / `down_proj` of `moe_intermediate_size` (`Glm4MoeExperts`),
//!   and `shared_experts`, one gated MLP of `moe_intermediate_size · n_shared_experts`.
//! - The multi-token-prediction layers of the checkpoints (`num_nextn_predict_layers`) are not
//!   built by transformers, so they are not counted.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_EXPERTS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, LinearRole, ModelSpec, MoeSpec, NormKind};

/// Parses a `glm4_moe` config; absent keys take `Glm4MoeConfig`'s defaults.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_or("hidden_size", 4096, MAX_HIDDEN)?;
    let intermediate = c.dim_or("intermediate_size", 10944, MAX_INTERMEDIATE)?;
    let layers = c.dim_or("num_hidden_layers", 46, MAX_LAYERS)?;
    let vocab = c.dim_or("vocab_size", 151_552, MAX_VOCAB)?;
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        None,
        None,
    )?;
    let bias = c.bool_or("attention_bias", false)?;
    let qk_norm = c.bool_or("use_qk_norm", false)?;
    let experts = c.dim_or("n_routed_experts", 128, MAX_EXPERTS)?;
    let top_k = c.dim_or("num_experts_per_tok", 8, MAX_EXPERTS)?;
    common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
    let moe_i = c.dim_or("moe_intermediate_size", 1408, MAX_INTERMEDIATE)?;
    let shared = c.uint_or("n_shared_experts", 1, MAX_EXPERTS)?;
    let shared_i = cfg::mul(moe_i, shared, "n_shared_experts")?;
    let first_dense = c.uint_or("first_k_dense_replace", 1, MAX_LAYERS)?;
    let linears = common::moe_linears(hidden, experts, top_k, moe_i, shared_i);
    let moe = MoeSpec {
        num_experts: experts,
        experts_per_token: top_k,
        num_shared_experts: shared,
        expert_intermediate_size: moe_i,
        shared_intermediate_size: shared_i,
        first_dense_layers: first_dense.min(layers),
    };
    let kinds = common::all_full(c, layers)?
        .into_iter()
        .zip(0u64..)
        .map(|(a, i)| (a, i >= first_dense))
        .collect();
    let mut spec = common::build(Plan {
        model_type: "glm4_moe".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // Glm4MoeConfig: tie_word_embeddings defaults to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 131_072)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: false,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, bias, false),
        // input_layernorm, post_attention_layernorm, and q_norm / k_norm over head_dim.
        layer_other: 2 * hidden + if qk_norm { 2 * heads.hd } else { 0 },
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe: Some((moe, linears, 0)),
        kinds,
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;
    spec.qk_norm = qk_norm;
    Ok(spec)
}
