//! `falcon` (Falcon 7B/40B/180B; old `RefinedWeb`/`RefinedWebModel` key names accepted:
//! `n_layer`, `n_head`, `n_head_kv`).
//!
//! transformers `FalconAttention.query_key_value`: with `new_decoder_architecture`
//! (40B/180B) H → (nh + 2·kv)·hd; else with `multi_query` (7B; the default) H → H + 2·hd;
//! else H → 3H. `dense` H → H, MLP `dense_h_to_4h` H → `ffn_hidden_size` (default 4H) and
//! `dense_4h_to_h`, all biased iff `bias` (default false). LayerNorms (`FalconDecoderLayer`):
//! new architecture with `num_ln_in_parallel_attn` 2 (its default there): `ln_attn` +
//! `ln_mlp`; otherwise `input_layernorm`, plus `post_attention_layernorm` unless
//! `parallel_attn` (default true). Final `ln_f`. FalconConfig ties lm_head by default.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `falcon` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let layers = c.dim_any(&["num_hidden_layers", "n_layer"], MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    let nh = c.dim_any(&["num_attention_heads", "n_head"], MAX_HEADS)?;
    if hidden % nh != 0 {
        return Err(c.err(
            "num_attention_heads",
            format!("({nh}) must divide hidden_size ({hidden})"),
        ));
    }
    let hd = hidden / nh;
    // The original remote-code 40B/180B configs (`model_type: RefinedWeb`) have no
    // `new_decoder_architecture` key: that code always builds the new layout.
    let refined_web = c.opt_str("model_type")? == Some("RefinedWeb");
    let new_arch = c.bool_or("new_decoder_architecture", refined_web)?;
    let multi_query = c.bool_or("multi_query", true)?;
    let kv = if new_arch {
        let key = if c.has("num_kv_heads") {
            "num_kv_heads"
        } else {
            "n_head_kv"
        };
        let kv = c.dim_or(key, nh, MAX_HEADS)?;
        if kv > nh || nh % kv != 0 {
            return Err(c.err(
                key,
                format!("({kv}) must divide the number of query heads ({nh})"),
            ));
        }
        kv
    } else if multi_query {
        1
    } else {
        nh
    };
    let heads = Heads { nh, kv, hd };
    let qkv_out = cfg::add(heads.q(), 2 * heads.kv_width(), "num_kv_heads")?;
    let bias = c.bool_or("bias", false)?;
    let ffn = c.dim_or("ffn_hidden_size", 4 * hidden, MAX_INTERMEDIATE)?;
    let parallel = c.bool_or("parallel_attn", true)?;
    let norms = if parallel {
        // FalconDecoderLayer sets num_ln_in_parallel_attn to 2 for the new architecture.
        let default = if new_arch { 2 } else { 1 };
        if c.uint_or("num_ln_in_parallel_attn", default, 2)? == 2 {
            2
        } else {
            1
        }
    } else {
        2
    };
    let attn = vec![
        Linear::new(
            "query_key_value",
            hidden,
            qkv_out,
            bias,
            LinearRole::Attention,
        ),
        Linear::new("dense", hidden, hidden, bias, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new("dense_h_to_4h", hidden, ffn, bias, LinearRole::Mlp),
        Linear::new("dense_4h_to_h", ffn, hidden, bias, LinearRole::Mlp),
    ];
    common::build(Plan {
        model_type: "falcon".to_owned(),
        hidden,
        intermediate: ffn,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", true)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 2048)?,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: bias,
        attn,
        layer_other: norms * 2 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        final_norm: 2 * hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
