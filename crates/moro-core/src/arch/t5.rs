//! `t5` and `mt5`: encoder-decoder models (T5, FLAN-T5, T0, mT5, mT0).
//!
//! transformers 5.25 `models/t5/modeling_t5.py` (`models/mt5` is a copy of it):
//!
//! - `shared`: the token embedding (V · d), read by both stacks;
//! - per encoder `T5Block`: `T5LayerSelfAttention` (`layer_norm` d, `SelfAttention.q`, `k`,
//!   `v` d → n and `o` n → d, no biases; n = `num_heads · d_kv`) and `T5LayerFF`
//!   (`layer_norm` d; `DenseReluDense.wi` d → `d_ff` and `wo` back, or for `gated-*`
//!   `wi_0`, `wi_1` and `wo`);
//! - per decoder `T5Block`: the same self-attention, then `T5LayerCrossAttention`
//!   (`layer_norm` d, `EncDecAttention.q`, `k`, `v`, `o`: k and v read the encoder's output),
//!   then the feed-forward;
//! - the first block of each stack has `relative_attention_bias` (`num_buckets` · heads);
//! - each stack's `final_layer_norm` (d), and `lm_head` (d → V).
//!
//! `T5Config.__post_init__` (and `MT5Config`'s) forces `tie_word_embeddings = True`, but
//! `from_pretrained` leaves `lm_head` untied when the checkpoint holds it with other values
//! (`PreTrainedModel.tie_weights`), as every T5 v1.1, FLAN-T5 and mT5 checkpoint does and
//! says with `tie_word_embeddings: false`: the config's own key decides here. A T5 config
//! without it (T5 v1.0) ties and scales the decoder output by `d_model ** -0.5`
//! (`scale_decoder_outputs`); mT5 never scales. Defaults are the config classes'.

use serde_json::Value;

use super::ArchError;
use super::cfg::{self, Cfg, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, FeedForward, Linear, LinearRole, ModelSpec, NormKind, Seq2SeqSpec};

/// Largest `relative_attention_num_buckets` accepted.
const MAX_BUCKETS: u64 = 1 << 16;

/// Parses a `t5` or `mt5` config.
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    // UMT5 takes mT5's defaults and T5's scaling, and a position bias in every layer.
    let umt5 = model_type == "umt5";
    let mt5 = model_type == "mt5" || umt5;
    let d = c.dim_or("d_model", 512, MAX_HIDDEN)?;
    let d_kv = c.dim_or("d_kv", 64, MAX_HEAD_DIM)?;
    let d_ff = c.dim_or("d_ff", if mt5 { 1024 } else { 2048 }, MAX_INTERMEDIATE)?;
    let enc_layers = c.dim_or("num_layers", if mt5 { 8 } else { 6 }, MAX_LAYERS)?;
    let dec_layers = match c.get("num_decoder_layers") {
        None | Some(Value::Null) => enc_layers,
        Some(_) => c.dim("num_decoder_layers", MAX_LAYERS)?,
    };
    let heads = c.dim_or("num_heads", if mt5 { 6 } else { 8 }, MAX_HEADS)?;
    let buckets = c.dim_or("relative_attention_num_buckets", 32, MAX_BUCKETS)?;
    let bias = cfg::mul(buckets, heads, "relative_attention_num_buckets")?;
    let vocab = c.dim_or(
        "vocab_size",
        if mt5 { 250_112 } else { 32_128 },
        cfg::MAX_VOCAB,
    )?;
    let proj = c
        .opt_str("feed_forward_proj")?
        .unwrap_or(if mt5 { "gated-gelu" } else { "relu" });
    let feed_forward = match proj {
        "relu" => FeedForward::Relu,
        "gated-gelu" => FeedForward::GatedGeluNew,
        other => {
            return Err(c.err(
                "feed_forward_proj",
                format!("`{other}` is not modelled (relu and gated-gelu are)"),
            ));
        }
    };
    let dropout = match c.get("dropout_rate") {
        None => true,
        Some(Value::Number(n)) => {
            let p = n.as_f64().unwrap_or(0.1);
            if !(0.0..1.0).contains(&p) {
                return Err(c.err("dropout_rate", format!("must be in [0, 1), got {p}")));
            }
            p > 0.0
        }
        Some(_) => return Err(c.err("dropout_rate", "must be a number")),
    };
    let said_untied = c.get("tie_word_embeddings") == Some(&Value::Bool(false));
    let tie = !said_untied;
    let n = cfg::mul(heads, d_kv, "num_heads")?;
    let attention = |role| {
        vec![
            Linear::new("q", d, n, false, role),
            Linear::new("k", d, n, false, role),
            Linear::new("v", d, n, false, role),
            Linear::new("o", n, d, false, role),
        ]
    };
    let ff = match feed_forward {
        FeedForward::Relu | FeedForward::Gelu => vec![
            Linear::new("wi", d, d_ff, false, LinearRole::Mlp),
            Linear::new("wo", d_ff, d, false, LinearRole::Mlp),
        ],
        FeedForward::GatedGeluNew => vec![
            Linear::new("wi_0", d, d_ff, false, LinearRole::Mlp),
            Linear::new("wi_1", d, d_ff, false, LinearRole::Mlp),
            Linear::new("wo", d_ff, d, false, LinearRole::Mlp),
        ],
    };
    let mut decoder = attention(LinearRole::Attention);
    decoder.extend(attention(LinearRole::Attention));
    decoder.extend(ff.iter().cloned());
    // `build` assembles and bounds the encoder; the decoder group replaces its layout below.
    let mut spec = common::build(Plan {
        model_type: model_type.to_owned(),
        hidden: d,
        intermediate: d_ff,
        heads: Heads {
            nh: heads,
            kv: heads,
            hd: d_kv,
        },
        vocab,
        tie,
        position_embeddings: 0,
        // Relative positions: no table bounds the context; 512 is what T5 was trained at.
        max_positions: c.uint_or("n_positions", 512, cfg::MAX_POSITIONS)?,
        norm: NormKind::RmsNorm,
        gated_mlp: feed_forward == FeedForward::GatedGeluNew,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        attn: attention(LinearRole::Attention),
        // Two `T5LayerNorm` weights per encoder block (and UMT5's position bias).
        layer_other: 2 * d + if umt5 { bias } else { 0 },
        dense_mlp: ff,
        moe: None,
        kinds: common::dense(common::all_full(c, enc_layers)?),
        mla: None,
        // Each stack's `final_layer_norm` and (T5, mT5) first block's
        // `relative_attention_bias`.
        final_norm: cfg::add(
            2 * d,
            if umt5 { 0 } else { 2 * bias },
            "relative_attention_num_buckets",
        )?,
        load_dtype: c.dtype_or(Dtype::F32)?,
    })
    .map_err(|e| match e {
        // `build` names the decoders' key; T5 calls it `num_layers`.
        ArchError::Field { field, problem } if field == "num_hidden_layers" => {
            c.err("num_layers", problem)
        }
        other => other,
    })?;
    // Three `T5LayerNorm` weights per decoder block (and UMT5's position bias).
    let dec_other = 3 * d + if umt5 { bias } else { 0 };
    common::push_decoder_stack(
        &mut spec,
        c,
        decoder,
        dec_other,
        dec_layers,
        "num_decoder_layers",
    )?;
    spec.seq2seq = Some(Seq2SeqSpec {
        encoder_layers: enc_layers,
        decoder_layers: dec_layers,
        feed_forward,
        d_ff,
        dropout,
        scale_decoder_outputs: (model_type != "mt5") && tie,
        family: crate::model::Seq2SeqFamily::T5,
        activation_dropout: false,
        per_layer_bias: umt5,
    });
    Ok(spec)
}
