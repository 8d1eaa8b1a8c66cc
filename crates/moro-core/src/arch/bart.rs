//! `bart`: BART's encoder-decoder (transformers 5.25 `models/bart/modeling_bart.py`,
//! `configuration_bart.py`).
//!
//! - `shared`: the token embedding (V · d), read by both stacks and tied to lm_head
//!   (`tie_word_embeddings`, default true); `final_logits_bias` is a buffer.
//! - Each stack: `embed_positions` (`max_position_embeddings` + 2 rows: BART's offset) and
//!   `layernorm_embedding`.
//! - Per encoder layer (`BartEncoderLayer`, post-norm): `self_attn` (`q_proj`, `k_proj`,
//!   `v_proj`, `out_proj`, d → d with bias), `self_attn_layer_norm`, `fc1` (d →
//!   `encoder_ffn_dim`) and `fc2` with bias, `final_layer_norm`.
//! - Per decoder layer (`BartDecoderLayer`): the same self-attention and its norm, then
//!   `encoder_attn` (the same four Linears; k and v read the encoder's output) and
//!   `encoder_attn_layer_norm`, then `fc1`, `fc2`, `final_layer_norm`.
//!
//! `BartConfig` defaults (bart-large): d 1,024, 12 + 12 layers, 16 heads, feed-forward 4,096,
//! vocabulary 50,265, 1,024 positions, dropout 0.1, no attention or activation dropout.

use serde_json::Value;

use super::ArchError;
use super::cfg::{self, Cfg, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS};
use super::common::{self, Heads, Plan};
use crate::model::{
    AttentionKind, Dtype, FeedForward, Linear, LinearRole, ModelSpec, NormKind, Seq2SeqFamily,
    Seq2SeqSpec,
};

/// Whether the dropout probability `key` (default `default`) is above 0.
fn dropout(c: &Cfg<'_>, key: &str, default: f64) -> Result<bool, ArchError> {
    let p = match c.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::Number(n)) => n.as_f64().unwrap_or(default),
        Some(_) => return Err(c.err(key, "must be a number")),
    };
    if !(0.0..1.0).contains(&p) {
        return Err(c.err(key, format!("must be in [0, 1), got {p}")));
    }
    Ok(p > 0.0)
}

/// Parses a `bart` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let d = c.dim_or("d_model", 1024, MAX_HIDDEN)?;
    let enc_layers = c.dim_or("encoder_layers", 12, MAX_LAYERS)?;
    let dec_layers = c.dim_or("decoder_layers", 12, MAX_LAYERS)?;
    let heads = c.dim_or("encoder_attention_heads", 16, MAX_HEADS)?;
    let dec_heads = c.dim_or("decoder_attention_heads", 16, MAX_HEADS)?;
    let d_ff = c.dim_or("encoder_ffn_dim", 4096, MAX_INTERMEDIATE)?;
    let dec_ff = c.dim_or("decoder_ffn_dim", 4096, MAX_INTERMEDIATE)?;
    if dec_heads != heads || dec_ff != d_ff {
        return Err(c.err(
            "decoder_ffn_dim",
            "differs from the encoder's (or decoder_attention_heads does): moro models \
             BART stacks of one shape",
        ));
    }
    if d % heads != 0 {
        return Err(c.err(
            "encoder_attention_heads",
            format!("({heads}) must divide d_model ({d})"),
        ));
    }
    match c.opt_str("activation_function")?.unwrap_or("gelu") {
        "gelu" => {}
        other => {
            return Err(c.err(
                "activation_function",
                format!("`{other}` is not modelled (gelu is)"),
            ));
        }
    }
    let vocab = c.dim_or("vocab_size", 50_265, cfg::MAX_VOCAB)?;
    let positions = c.dim_or("max_position_embeddings", 1024, cfg::MAX_POSITIONS)?;
    let attention = || {
        vec![
            Linear::new("q_proj", d, d, true, LinearRole::Attention),
            Linear::new("k_proj", d, d, true, LinearRole::Attention),
            Linear::new("v_proj", d, d, true, LinearRole::Attention),
            Linear::new("out_proj", d, d, true, LinearRole::Attention),
        ]
    };
    let ff = vec![
        Linear::new("fc1", d, d_ff, true, LinearRole::Mlp),
        Linear::new("fc2", d_ff, d, true, LinearRole::Mlp),
    ];
    let mut decoder = attention();
    decoder.extend(attention());
    decoder.extend(ff.iter().cloned());
    let mut spec = common::build(Plan {
        model_type: "bart".to_owned(),
        hidden: d,
        intermediate: d_ff,
        heads: Heads {
            nh: heads,
            kv: heads,
            hd: d / heads,
        },
        vocab,
        tie: c.bool_or("tie_word_embeddings", true)?,
        position_embeddings: 0,
        max_positions: positions,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        attn: attention(),
        // `self_attn_layer_norm` and `final_layer_norm`, weight and bias.
        layer_other: 4 * d,
        dense_mlp: ff,
        moe: None,
        kinds: common::dense(vec![
            AttentionKind::Full;
            usize::try_from(enc_layers).unwrap_or(0)
        ]),
        mla: None,
        // Each stack's `embed_positions` (2 rows of offset) and `layernorm_embedding`.
        final_norm: cfg::add(
            cfg::mul(2 * (positions + 2), d, "max_position_embeddings")?,
            4 * d,
            "d_model",
        )?,
        load_dtype: c.dtype_or(Dtype::F32)?,
    })
    .map_err(|e| match e {
        ArchError::Field { field, problem } if field == "num_hidden_layers" => {
            c.err("encoder_layers", problem)
        }
        other => other,
    })?;
    // Three LayerNorms per decoder layer, weight and bias.
    common::push_decoder_stack(&mut spec, c, decoder, 6 * d, dec_layers, "decoder_layers")?;
    spec.seq2seq = Some(Seq2SeqSpec {
        encoder_layers: enc_layers,
        decoder_layers: dec_layers,
        feed_forward: FeedForward::Gelu,
        d_ff,
        dropout: dropout(c, "dropout", 0.1)?,
        scale_decoder_outputs: false,
        family: Seq2SeqFamily::Bart,
        activation_dropout: dropout(c, "activation_dropout", 0.0)?,
        per_layer_bias: false,
    });
    Ok(spec)
}
