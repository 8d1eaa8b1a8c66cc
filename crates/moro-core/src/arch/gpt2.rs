//! `gpt2` and `gpt_bigcode` (SantaCoder, StarCoder): learned position embeddings `wpe`
//! (`n_positions` · H), LayerNorm `ln_1`/`ln_2` per layer and `ln_f`, biased `Conv1D`/Linear
//! `c_attn` (fused qkv), `c_proj`, and MLP `c_fc` (H → `n_inner`, default 4H) / `c_proj`.
//! GPTBigCode with `multi_query` (its default) has one shared K/V head: `c_attn` is
//! H → H + 2·hd. Both tie lm_head to `wte` (their config default).
//!
//! dtype: GPT-2's `config.json` has no `torch_dtype` and its checkpoint is fp32, so an absent
//! dtype means fp32 for `gpt2` (and `gpt_bigcode`, also published in fp32); other
//! `model_type`s default to bf16.

use super::ArchError;
use super::cfg::{
    Cfg, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB,
};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `gpt2` or `gpt_bigcode` config (GPT-2 key names, with the `hidden_size` /
/// `num_hidden_layers` / `num_attention_heads` aliases transformers maps onto them).
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_any(&["n_embd", "hidden_size"], MAX_HIDDEN)?;
    let layers = c.dim_any(&["n_layer", "num_hidden_layers"], MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    let positions = c.dim_or("n_positions", 1024, MAX_POSITIONS)?;
    let inner = c.dim_or("n_inner", 4 * hidden, MAX_INTERMEDIATE)?;
    let mqa = model_type == "gpt_bigcode" && c.bool_or("multi_query", true)?;
    let nh = c.dim_any(&["n_head", "num_attention_heads"], MAX_HEADS)?;
    // Head dim is always n_embd / n_head here (no head_dim key in these configs).
    if hidden % nh != 0 {
        return Err(c.err("n_head", format!("({nh}) must divide n_embd ({hidden})")));
    }
    let heads = Heads {
        nh,
        kv: if mqa { 1 } else { nh },
        hd: hidden / nh,
    };
    let qkv_out = hidden + 2 * heads.kv_width();
    let attn = vec![
        Linear::new("c_attn", hidden, qkv_out, true, LinearRole::Attention),
        Linear::new("c_proj", hidden, hidden, true, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new("c_fc", hidden, inner, true, LinearRole::Mlp),
        Linear::new("c_proj", inner, hidden, true, LinearRole::Mlp),
    ];
    common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate: inner,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", true)?,
        position_embeddings: positions,
        max_positions: positions,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        attn,
        // ln_1 + ln_2, LayerNorm weight and bias.
        layer_other: 4 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        final_norm: 2 * hidden,
        load_dtype: c.dtype_or(Dtype::F32)?,
    })
}
