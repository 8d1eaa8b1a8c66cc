//! `bloom` (BLOOM, BLOOMZ; transformers `BloomForCausalLM`): ALiBi (no position table),
//! `word_embeddings` followed by `word_embeddings_layernorm` (2H, counted with the final
//! norm), LayerNorm `input_layernorm` + `post_attention_layernorm` per layer, biased
//! `query_key_value` H → 3H and `dense`, MLP `dense_h_to_4h` H → 4H and `dense_4h_to_h`
//! (biased), final `ln_f`; lm_head tied. Check: bloom-7b1 gives 7,069,016,064 parameters.

use super::ArchError;
use super::cfg::{Cfg, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, Linear, LinearRole, ModelSpec, NormKind};

/// Parses a `bloom` config (`n_embed`/`n_layer`/`n_head` aliases accepted).
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_any(&["hidden_size", "n_embed"], MAX_HIDDEN)?;
    let layers = c.dim_any(&["n_layer", "num_hidden_layers"], MAX_LAYERS)?;
    let nh = c.dim_any(&["n_head", "num_attention_heads"], MAX_HEADS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    if hidden % nh != 0 {
        return Err(c.err(
            "n_head",
            format!("({nh}) must divide hidden_size ({hidden})"),
        ));
    }
    let heads = Heads {
        nh,
        kv: nh,
        hd: hidden / nh,
    };
    let inner = 4 * hidden;
    let attn = vec![
        Linear::new(
            "query_key_value",
            hidden,
            3 * hidden,
            true,
            LinearRole::Attention,
        ),
        Linear::new("dense", hidden, hidden, true, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new("dense_h_to_4h", hidden, inner, true, LinearRole::Mlp),
        Linear::new("dense_4h_to_h", inner, hidden, true, LinearRole::Mlp),
    ];
    common::build(Plan {
        model_type: "bloom".to_owned(),
        hidden,
        intermediate: inner,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", true)?,
        position_embeddings: 0,
        // BLOOM was trained on 2048-token sequences; configs say so in `seq_length` if at all.
        max_positions: common::max_positions(c, &["seq_length", "max_position_embeddings"], 2048)?,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        attn,
        layer_other: 4 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        // word_embeddings_layernorm + ln_f.
        final_norm: 4 * hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
