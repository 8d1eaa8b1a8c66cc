//! `qwen` (Qwen-1: Qwen-1.8B/7B/14B/72B and their Chat/Int4 variants), from the
//! checkpoints' own `modeling_qwen.py` (remote code): RMSNorm `ln_1`/`ln_2` per layer and
//! `ln_f`; attention `c_attn` H → 3·nh·`kv_channels` WITH bias and `c_proj` back to H
//! (bias iff not `no_bias`, default true → none); MLP `w1`, `w2` (H → `intermediate_size`/2
//! each, the SwiGLU pair) and `c_proj` (`intermediate_size`/2 → H). Untied `wte`/`lm_head`.
//! Check: Qwen-7B gives 7,721,324,544 parameters.

use super::ArchError;
use super::cfg::{
    Cfg, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB,
};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `qwen` (Qwen-1) config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let ff = c.dim("intermediate_size", MAX_INTERMEDIATE)?;
    if ff % 2 != 0 {
        return Err(c.err(
            "intermediate_size",
            format!("({ff}) must be even (it is split in two)"),
        ));
    }
    let half = ff / 2;
    let layers = c.dim("num_hidden_layers", MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    let nh = c.dim("num_attention_heads", MAX_HEADS)?;
    let hd = match c.opt_dim("kv_channels", MAX_HEAD_DIM)? {
        Some(hd) => hd,
        None if hidden % nh == 0 => hidden / nh,
        None => {
            return Err(c.err(
                "num_attention_heads",
                format!("({nh}) must divide hidden_size ({hidden})"),
            ));
        }
    };
    let heads = Heads { nh, kv: nh, hd };
    let bias = !c.bool_or("no_bias", true)?;
    let attn = vec![
        Linear::new("c_attn", hidden, 3 * heads.q(), true, LinearRole::Attention),
        Linear::new("c_proj", heads.q(), hidden, bias, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new("w1", hidden, half, bias, LinearRole::Mlp),
        Linear::new("w2", hidden, half, bias, LinearRole::Mlp),
        Linear::new("c_proj", half, hidden, bias, LinearRole::Mlp),
    ];
    common::build(Plan {
        model_type: "qwen".to_owned(),
        hidden,
        intermediate: half,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings", "seq_length"], 8192)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: true,
        o_bias: bias,
        mlp_bias: bias,
        attn,
        layer_other: 2 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        final_norm: hidden,
        load_dtype: qwen_dtype(c)?,
    })
}

/// Qwen-1 configs carry boolean `bf16`/`fp16`/`fp32` flags (all false = auto, meaning the
/// stored bf16) and sometimes `torch_dtype`; `torch_dtype` wins.
fn qwen_dtype(c: &Cfg<'_>) -> Result<Dtype, ArchError> {
    if c.has_dtype() {
        return c.dtype_or(Dtype::Bf16);
    }
    if c.bool_or("fp32", false)? {
        Ok(Dtype::F32)
    } else if c.bool_or("fp16", false)? {
        Ok(Dtype::F16)
    } else {
        Ok(Dtype::Bf16)
    }
}
