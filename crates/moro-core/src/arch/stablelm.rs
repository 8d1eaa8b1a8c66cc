//! `stablelm` (StableLM 2, StableLM-3B-4E1T, StableCode; transformers `StableLmForCausalLM`):
//! Llama-style `q_proj`/`k_proj`/`v_proj` (biased iff `use_qkv_bias`, default false),
//! unbiased `o_proj` and gated `gate_proj`/`up_proj`/`down_proj`, LayerNorm (weight + bias)
//! `input_layernorm` plus `post_attention_layernorm` unless `use_parallel_residual`, optional
//! per-head bias-free LayerNorms over head_dim (`qk_layernorm`: nh·hd + kv·hd), final `norm`.
//! The older `stabilityai/stablelm-base-alpha-*` checkpoints are `gpt_neox`.

use super::ArchError;
use super::cfg::{Cfg, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, LinearRole, ModelSpec, NormKind};

/// Parses a `stablelm` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let intermediate = c.dim("intermediate_size", MAX_INTERMEDIATE)?;
    let layers = c.dim("num_hidden_layers", MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        None,
        None,
    )?;
    let qkv_bias = c.bool_or("use_qkv_bias", false)?;
    let parallel = c.bool_or("use_parallel_residual", false)?;
    let qk_norm = if c.bool_or("qk_layernorm", false)? {
        heads.q() + heads.kv_width()
    } else {
        0
    };
    let norms = if parallel { 2 * hidden } else { 4 * hidden };
    common::build(Plan {
        model_type: "stablelm".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // StableLmConfig: tie_word_embeddings defaults to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 4096)?,
        norm: NormKind::LayerNorm,
        gated_mlp: true,
        qkv_bias,
        o_bias: false,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, qkv_bias, false),
        layer_other: norms + qk_norm,
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        final_norm: 2 * hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
