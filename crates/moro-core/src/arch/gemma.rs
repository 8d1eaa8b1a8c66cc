//! `gemma`, `gemma2`, `gemma3_text` and `gemma3` (whose text model is read from
//! `text_config`).
//!
//! All are Llama-style (`q_proj`..`o_proj`, GeGLU `gate_proj`/`up_proj`/`down_proj`, RMSNorm
//! weight of H), with the lm_head tied by default and `head_dim` 256 by default.
//! - Gemma: `input_layernorm` + `post_attention_layernorm` (2 norms per layer).
//! - Gemma 2: 4 norms per layer (input, post-attention, pre-feedforward, post-feedforward);
//!   layers alternate sliding (even index) / full (`Gemma2DecoderLayer`:
//!   `is_sliding = not bool(layer_idx % 2)`), window `sliding_window` (default 4096).
//! - Gemma 3: Gemma 2's 4 norms plus `q_norm`/`k_norm` over head_dim; layer i slides unless
//!   (i+1) % `sliding_window_pattern` == 0 (default 6: five local layers then one global),
//!   or as an explicit `layer_types` says.
//!
//! Multimodal `gemma3` configs list only the text keys that differ from `Gemma3TextConfig`'s
//! defaults, so absent text keys take those defaults (docs/model-params.md, "Gemma 3 vocab":
//! vocab 262208, hidden 2304, intermediate 9216, 26 layers, 8 heads, 4 KV heads, head_dim
//! 256, context 131072, window 4096, pattern 6, tied). Only the text model is counted (the
//! SigLIP tower and projector, ~417M, are not).

use super::ArchError;
use super::cfg::{Cfg, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, LinearRole, ModelSpec, NormKind};

/// `Gemma3TextConfig` defaults (transformers 4.50+), used for absent `gemma3`/`gemma3_text`
/// keys.
mod gemma3_defaults {
    pub(super) const VOCAB: u64 = 262_208;
    pub(super) const HIDDEN: u64 = 2304;
    pub(super) const INTERMEDIATE: u64 = 9216;
    pub(super) const LAYERS: u64 = 26;
    pub(super) const HEADS: u64 = 8;
    pub(super) const KV_HEADS: u64 = 4;
    pub(super) const CONTEXT: u64 = 131_072;
    pub(super) const WINDOW: u64 = 4096;
    pub(super) const PATTERN: u64 = 6;
}

/// Parses a `gemma`, `gemma2` or `gemma3_text` config, or a multimodal `gemma3` one (its
/// `text_config` and the SigLIP tower, [`super::vision::gemma3`]).
pub(crate) fn parse(top: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    if model_type == "gemma3" {
        // Gemma3Config: a missing text_config means an all-default Gemma3TextConfig.
        let empty = serde_json::Map::new();
        let text = top.opt_object("text_config")?.unwrap_or(&empty);
        let c = Cfg::nested(text, "text_config");
        // dtype and tying live at the top level of multimodal configs; the text part's own
        // keys win when present.
        let dtype = if c.has_dtype() {
            c.dtype_or(Dtype::Bf16)?
        } else {
            top.dtype_or(Dtype::Bf16)?
        };
        let tie = c.bool_or(
            "tie_word_embeddings",
            top.bool_or("tie_word_embeddings", true)?,
        )?;
        let mut spec = text_model(&c, "gemma3_text", dtype, tie)?;
        spec.vision = Some(super::vision::gemma3(top, spec.hidden_size)?);
        spec.model_type = "gemma3".to_owned();
        return Ok(spec);
    }
    let dtype = top.dtype_or(Dtype::Bf16)?;
    // GemmaConfig / Gemma2Config / Gemma3TextConfig: tie_word_embeddings defaults to true.
    let tie = top.bool_or("tie_word_embeddings", true)?;
    text_model(top, model_type, dtype, tie)
}

fn text_model(
    c: &Cfg<'_>,
    model_type: &str,
    dtype: Dtype,
    tie: bool,
) -> Result<ModelSpec, ArchError> {
    use gemma3_defaults as d;
    let v3 = model_type == "gemma3_text";
    let v2 = model_type == "gemma2";
    let (hidden, intermediate, layers, vocab) = if v3 {
        (
            c.dim_or("hidden_size", d::HIDDEN, MAX_HIDDEN)?,
            c.dim_or("intermediate_size", d::INTERMEDIATE, MAX_INTERMEDIATE)?,
            c.dim_or("num_hidden_layers", d::LAYERS, MAX_LAYERS)?,
            c.dim_or("vocab_size", d::VOCAB, MAX_VOCAB)?,
        )
    } else {
        (
            c.dim("hidden_size", MAX_HIDDEN)?,
            c.dim("intermediate_size", MAX_INTERMEDIATE)?,
            c.dim("num_hidden_layers", MAX_LAYERS)?,
            c.dim("vocab_size", MAX_VOCAB)?,
        )
    };
    let heads = if v3 && !c.has("num_attention_heads") {
        // Default 8 heads; KV heads default 4 (they must divide the query heads).
        let kv = c.dim_or("num_key_value_heads", d::KV_HEADS, d::HEADS)?;
        if !d::HEADS.is_multiple_of(kv) {
            return Err(c.err("num_key_value_heads", format!("({kv}) must divide 8")));
        }
        common::Heads {
            nh: d::HEADS,
            kv,
            hd: c.dim_or("head_dim", 256, super::cfg::MAX_HEAD_DIM)?,
        }
    } else {
        // GemmaConfig defaults KV heads to 16, Gemma2/Gemma3 to 4; head_dim to 256 for all.
        let kv_default = if v2 || v3 { 4 } else { 16 };
        let kv_default = if c.has("num_key_value_heads") {
            None
        } else {
            Some(kv_default)
        };
        common::heads(
            c,
            hidden,
            &["num_attention_heads"],
            "num_key_value_heads",
            kv_default,
            Some(256),
        )?
    };
    let bias = c.bool_or("attention_bias", false)?;

    let attention = if v3 {
        let window = common::sliding_window(c, Some(d::WINDOW))?;
        let p = c.dim_or("sliding_window_pattern", d::PATTERN, MAX_LAYERS)?;
        common::pattern(c, layers, window, |i| (i + 1) % p != 0)?
    } else if v2 {
        let window = common::sliding_window(c, Some(4096))?;
        common::pattern(c, layers, window, |i| i % 2 == 0)?
    } else {
        common::all_full(c, layers)?
    };
    let default_context = if v3 { d::CONTEXT } else { 8192 };
    // Norms per layer: 2 (Gemma) or 4 (Gemma 2/3), plus Gemma 3's q_norm and k_norm.
    let layer_other = if v3 {
        4 * hidden + 2 * heads.hd
    } else if v2 {
        4 * hidden
    } else {
        2 * hidden
    };

    // Gemma2Config defaults `final_logit_softcapping` to 30.0, Gemma3TextConfig to None; a
    // JSON null switches it off (`Gemma2ForCausalLM.forward`: `if
    // self.config.final_logit_softcapping is not None`).
    let softcap_default = v2 && !c.has_key("final_logit_softcapping");
    let logit_softcapping = softcap_default || c.has("final_logit_softcapping");
    let mut spec = common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        tie,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], default_context)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, bias, bias),
        layer_other,
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe: None,
        kinds: common::dense(attention),
        mla: None,
        final_norm: hidden,
        load_dtype: dtype,
    })?;
    spec.logit_softcapping = logit_softcapping;
    // Gemma2Config defaults `attn_logit_softcapping` to 50.0; Gemma 3 has none.
    spec.attn_softcapping =
        v2 && (!c.has_key("attn_logit_softcapping") || c.has("attn_logit_softcapping"));
    spec.fp32_norms = true;
    // Gemma 3's `q_norm` and `k_norm` (transformers 5.24 `Gemma3Attention.forward`).
    spec.qk_norm = v3;
    Ok(spec)
}
