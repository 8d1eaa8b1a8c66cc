//! `gpt_neox` (Pythia, StableLM-alpha, GPT-NeoX-20B): fused `query_key_value` H → 3H,
//! `dense` H → H (both biased when `attention_bias`, default true), MLP
//! `dense_h_to_4h` H → I and `dense_4h_to_h` I → H (always biased), LayerNorm
//! `input_layernorm` + `post_attention_layernorm` per layer and `final_layer_norm`;
//! separate `embed_in` / `embed_out` (GPTNeoXConfig: tie_word_embeddings defaults to false).

use super::ArchError;
use super::cfg::{Cfg, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `gpt_neox` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let intermediate = c.dim("intermediate_size", MAX_INTERMEDIATE)?;
    let layers = c.dim("num_hidden_layers", MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    // MHA only: the "num_key_value_heads" key does not exist for GPT-NeoX.
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_attention_heads",
        None,
        None,
    )?;
    let bias = c.bool_or("attention_bias", true)?;
    let attn = vec![
        Linear::new(
            "query_key_value",
            hidden,
            3 * hidden,
            bias,
            LinearRole::Attention,
        ),
        Linear::new("dense", hidden, hidden, bias, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new("dense_h_to_4h", hidden, intermediate, true, LinearRole::Mlp),
        Linear::new("dense_4h_to_h", intermediate, hidden, true, LinearRole::Mlp),
    ];
    common::build(Plan {
        model_type: "gpt_neox".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 2048)?,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: true,
        attn,
        layer_other: 4 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        final_norm: 2 * hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
