//! `bert` and `roberta`: post-LN encoders fine-tuned with a sequence-classification head.
//!
//! transformers `models/bert/modeling_bert.py` (and `models/roberta/modeling_roberta.py`,
//! "Copied from transformers.models.bert.modeling_bert" for every layer module):
//!
//! - `BertEmbeddings`: `word_embeddings` (V · H), `position_embeddings`
//!   (`max_position_embeddings` · H), `token_type_embeddings` (`type_vocab_size` · H), a
//!   `LayerNorm` (weight and bias) and dropout;
//! - per `BertLayer`: `BertSelfAttention` `query`, `key`, `value` (H → H, biased),
//!   `BertSelfOutput` `dense` (H → H, biased) + `LayerNorm`, `BertIntermediate` `dense`
//!   (H → I, biased) + `hidden_act`, `BertOutput` `dense` (I → H, biased) + `LayerNorm`;
//! - `BertForSequenceClassification`: `BertPooler.dense` (H → H, biased, tanh) and
//!   `classifier` (H → `num_labels`, biased). `RobertaForSequenceClassification` builds the
//!   model with `add_pooling_layer=False` and its `RobertaClassificationHead` has `dense`
//!   (H → H) and `out_proj` (H → `num_labels`): the same parameter count.
//!
//! The MLM/pre-training heads are not modelled: moro fine-tunes encoders for classification.
//! Config defaults are `BertConfig`'s (`configuration_bert.py`): `type_vocab_size` 2,
//! dropout 0.1, `max_position_embeddings` 512; `PretrainedConfig` gives `num_labels` 2.
//! BERT checkpoints have no `torch_dtype` and are fp32.

use serde_json::Value;

use super::ArchError;
use super::cfg::{
    self, Cfg, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB,
};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, EncoderSpec, Linear, LinearRole, ModelSpec, NormKind};

/// Largest `num_labels` accepted (a classification head, not a vocabulary).
const MAX_LABELS: u64 = 1 << 20;

/// Whether a dropout probability key is above 0 (absent: `default`).
fn dropout_on(c: &Cfg<'_>, key: &str, default: f64) -> Result<bool, ArchError> {
    let p = match c.get(key) {
        None => default,
        Some(Value::Number(n)) => n.as_f64().unwrap_or(default),
        Some(_) => return Err(c.err(key, "must be a number")),
    };
    if !(0.0..1.0).contains(&p) {
        return Err(c.err(key, format!("must be in [0, 1), got {p}")));
    }
    Ok(p > 0.0)
}

/// `num_labels`, else the length of `id2label`, else 2 (`PretrainedConfig.__init__`).
fn num_labels(c: &Cfg<'_>) -> Result<u64, ArchError> {
    if let Some(n) = c.opt_dim("num_labels", MAX_LABELS)? {
        return Ok(n);
    }
    match c.get("id2label") {
        Some(Value::Object(m)) if !m.is_empty() => {
            u64::try_from(m.len()).map_err(|_| c.err("id2label", "is too long"))
        }
        _ => Ok(2),
    }
}

/// Parses a `bert` or `roberta` config.
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    if c.bool_or("is_decoder", false)? || c.bool_or("add_cross_attention", false)? {
        return Err(c.err(
            "is_decoder",
            "BERT used as a decoder (causal LM / cross-attention) is not modelled",
        ));
    }
    if let Some(kind) = c.opt_str("position_embedding_type")?
        && kind != "absolute"
    {
        return Err(c.err(
            "position_embedding_type",
            format!("`{kind}` is not modelled (only `absolute`)"),
        ));
    }
    let hidden = c.dim_or("hidden_size", 768, MAX_HIDDEN)?;
    let layers = c.dim_or("num_hidden_layers", 12, MAX_LAYERS)?;
    let nh = c.dim_or("num_attention_heads", 12, MAX_HEADS)?;
    if hidden % nh != 0 {
        return Err(c.err(
            "num_attention_heads",
            format!("({nh}) must divide hidden_size ({hidden})"),
        ));
    }
    let inter = c.dim_or("intermediate_size", 3072, MAX_INTERMEDIATE)?;
    let vocab = c.dim_or(
        "vocab_size",
        if model_type == "roberta" {
            50265
        } else {
            30522
        },
        MAX_VOCAB,
    )?;
    let positions = c.dim_or("max_position_embeddings", 512, MAX_POSITIONS)?;
    let type_vocab = c.uint_or("type_vocab_size", 2, MAX_VOCAB)?;
    let heads = Heads {
        nh,
        kv: nh,
        hd: hidden / nh,
    };
    // PEFT sees `attention.self.query`/`key`/`value` and three modules ending in `dense`
    // (`attention.output.dense`, `intermediate.dense`, `output.dense`): a target "dense"
    // matches all three, as PEFT's suffix match does.
    let attn = vec![
        Linear::new("query", hidden, hidden, true, LinearRole::Attention),
        Linear::new("key", hidden, hidden, true, LinearRole::Attention),
        Linear::new("value", hidden, hidden, true, LinearRole::Attention),
        Linear::new("dense", hidden, hidden, true, LinearRole::Attention),
    ];
    let mlp = vec![
        Linear::new("dense", hidden, inter, true, LinearRole::Mlp),
        Linear::new("dense", inter, hidden, true, LinearRole::Mlp),
    ];
    let encoder = EncoderSpec {
        type_vocab_size: type_vocab,
        num_labels: num_labels(c)?,
        hidden_dropout: dropout_on(c, "hidden_dropout_prob", 0.1)?,
        attention_dropout: dropout_on(c, "attention_probs_dropout_prob", 0.1)?,
        pooler_reads_view: model_type == "bert",
    };
    let mut spec = common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate: inter,
        heads,
        vocab,
        // No lm_head: the classification head is counted in `EncoderSpec`.
        tie: false,
        position_embeddings: positions,
        max_positions: positions,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        attn,
        // attention.output.LayerNorm + output.LayerNorm, weight and bias each.
        layer_other: 4 * hidden,
        dense_mlp: mlp,
        moe: None,
        kinds: common::dense(common::all_full(c, layers)?),
        mla: None,
        // embeddings.LayerNorm (weight and bias): the only norm outside the layers.
        final_norm: 2 * hidden,
        load_dtype: c.dtype_or(Dtype::F32)?,
    })?;
    // `build` counted an lm_head of V·H (tie = false); the encoder has none. Recount the
    // whole model with checked arithmetic, the encoder's extra parameters included.
    let extra = cfg::add(
        cfg::mul(type_vocab, hidden, "type_vocab_size")?,
        cfg::add(
            cfg::mul(hidden, hidden + 1, "hidden_size")?,
            cfg::mul(hidden + 1, encoder.num_labels, "num_labels")?,
            "num_labels",
        )?,
        "num_labels",
    )?;
    cfg::add(spec.total_params(), extra, "num_labels")?;
    spec.encoder = Some(encoder);
    Ok(spec)
}
