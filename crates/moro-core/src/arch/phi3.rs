//! `phi3` (Phi-3, Phi-3.5, Phi-4): a Llama-style decoder with fused projections
//! (transformers `Phi3Attention.qkv_proj`: H → nh·hd + 2·kv·hd; `Phi3MLP.gate_up_proj`:
//! H → 2I, `down_proj`: I → H), no biases, RMSNorm `input_layernorm` +
//! `post_attention_layernorm`, final `norm`. The parameter count equals the unfused one.
//! `sliding_window` (Phi-3-mini-4k: 2047), when set, applies to every layer.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `phi3` config.
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
    let qkv_out = cfg::add(heads.q(), 2 * heads.kv_width(), "num_key_value_heads")?;
    let attn = vec![
        Linear::new("qkv_proj", hidden, qkv_out, false, LinearRole::Attention),
        Linear::new("o_proj", heads.q(), hidden, false, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new(
            "gate_up_proj",
            hidden,
            2 * intermediate,
            false,
            LinearRole::Mlp,
        ),
        Linear::new("down_proj", intermediate, hidden, false, LinearRole::Mlp),
    ];
    // Phi3Config: sliding_window defaults to none.
    let window = common::sliding_window(c, None)?;
    let attention = common::uniform(c, layers, window)?;
    let mut spec = common::build(Plan {
        model_type: "phi3".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // Phi3Config: tie_word_embeddings defaults to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 4096)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        attn,
        layer_other: 2 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(attention),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;
    spec.rope_by_concat = true;
    Ok(spec)
}
