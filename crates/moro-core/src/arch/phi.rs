//! `phi` (phi-1, phi-1.5, phi-2; transformers `PhiForCausalLM`): one LayerNorm
//! `input_layernorm` per layer (attention and MLP run in parallel), biased `q_proj`,
//! `k_proj`, `v_proj`, `dense`, MLP `fc1` H → I and `fc2` I → H (biased), optional per-head
//! LayerNorms `q_layernorm`/`k_layernorm` over head_dim (`qk_layernorm`), `final_layernorm`,
//! and an lm_head WITH a bias (V parameters, counted in `final_norm_params`).

use super::ArchError;
use super::cfg::{Cfg, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `phi` config.
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
    let role = LinearRole::Attention;
    let attn = vec![
        Linear::new("q_proj", hidden, heads.q(), true, role),
        Linear::new("k_proj", hidden, heads.kv_width(), true, role),
        Linear::new("v_proj", hidden, heads.kv_width(), true, role),
        Linear::new("dense", heads.q(), hidden, true, role),
    ];
    let mlp = vec![
        Linear::new("fc1", hidden, intermediate, true, LinearRole::Mlp),
        Linear::new("fc2", intermediate, hidden, true, LinearRole::Mlp),
    ];
    // PhiConfig: qk_layernorm defaults to false; each is a LayerNorm(head_dim) with bias.
    let qk_norm = if c.bool_or("qk_layernorm", false)? {
        4 * heads.hd
    } else {
        0
    };
    common::build(Plan {
        model_type: "phi".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // PhiConfig: tie_word_embeddings defaults to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 2048)?,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        attn,
        layer_other: 2 * hidden + qk_norm,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        // final_layernorm (weight + bias) and the lm_head bias.
        final_norm: 2 * hidden + vocab,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
