//! `olmo2` (OLMo 2) and `olmo3` (OLMo 3): Llama-style projections, but no input norms:
//! RMSNorm `post_attention_layernorm` and `post_feedforward_layernorm` (2H per layer), plus
//! `q_norm` over the full query width nh·hd and `k_norm` over kv·hd (transformers
//! `Olmo2Attention`, `Olmo3Attention`), and a final `norm`. OLMo 3 adds sliding-window
//! attention (`sliding_window`, default 4096) on three layers of every four
//! (`Olmo3Config.layer_types`: sliding unless (i + 1) % 4 == 0); an explicit `layer_types`
//! wins.

use super::ArchError;
use super::cfg::{Cfg, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, LinearRole, ModelSpec, NormKind};

/// Parses an `olmo2` or `olmo3` config.
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
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
    // Olmo2Config: attention_bias defaults to false.
    let bias = c.bool_or("attention_bias", false)?;
    let kinds = if model_type == "olmo3" {
        let window = common::sliding_window(c, Some(4096))?;
        common::pattern(c, layers, window, |i| (i + 1) % 4 != 0)?
    } else {
        common::all_full(c, layers)?
    };
    common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // Olmo2Config: tie_word_embeddings defaults to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 2048)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, bias, bias),
        layer_other: 2 * hidden + heads.q() + heads.kv_width(),
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe: None,
        kinds: common::dense(kinds),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
