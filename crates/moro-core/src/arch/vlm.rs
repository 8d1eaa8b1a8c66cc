//! Vision-language configs whose language model is another supported decoder: Qwen2-VL and
//! Qwen2.5-VL (a Qwen2 decoder), LLaVA (its `text_config`'s decoder), Idefics3 and SmolVLM
//! (a Llama decoder). Gemma 3's
//! multimodal config lives with Gemma ([`super::gemma`]).

use serde_json::{Map, Value};

use super::cfg::Cfg;
use super::{ArchError, llama, qwen2, vision};
use crate::model::ModelSpec;

/// `qwen2_vl` / `qwen2_5_vl`: the decoder from `text_config` (transformers ≥ 4.53 configs)
/// or the top level (the released ones), tying and dtype from the top level when the text
/// part does not say.
pub(crate) fn qwen_vl(top: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let mut merged = Map::new();
    let c = match top.opt_object("text_config")? {
        Some(text) => {
            merged.clone_from(text);
            inherit(top, &mut merged, INHERITED);
            Cfg::nested(&merged, "text_config")
        }
        None => *top,
    };
    let mut spec = qwen2::parse(&c, "qwen2")?;
    spec.vision = Some(vision::qwen_vl(top, model_type, spec.hidden_size)?);
    spec.model_type = model_type.to_owned();
    Ok(spec)
}

/// `llava`: the `text_config` decoder (Llama or Mistral; keys it omits take that config
/// class's defaults, as `LlavaConfig` builds it) and a CLIP tower.
pub(crate) fn llava(top: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let empty = Map::new();
    let mut text = top.opt_object("text_config")?.unwrap_or(&empty).clone();
    let text_type = match text.get("model_type").and_then(Value::as_str) {
        None => "llama".to_owned(),
        Some(t @ ("llama" | "mistral")) => t.to_owned(),
        Some(other) => {
            return Err(top.err(
                "text_config.model_type",
                format!("`{other}` is not a supported LLaVA language model (llama, mistral)"),
            ));
        }
    };
    if text_type == "llama" {
        llama_defaults(&mut text);
    }
    inherit(
        top,
        &mut text,
        &["tie_word_embeddings", "torch_dtype", "dtype"],
    );
    let c = Cfg::nested(&text, "text_config");
    let mut spec = llama::parse(&c, &text_type)?;
    spec.vision = Some(vision::llava(top, spec.hidden_size)?);
    spec.model_type = "llava".to_owned();
    Ok(spec)
}

/// `mistral3` (Mistral Small 3.1): the `text_config`'s Mistral decoder and a Pixtral tower
/// ([`vision::pixtral`]). `Mistral3Config.tie_word_embeddings` defaults to true in
/// transformers 5.24, and the released config does not say, so the model transformers builds
/// from it ties lm_head to the embedding (23.34B; the checkpoint's own lm_head makes 24.01B).
pub(crate) fn mistral3(top: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let empty = Map::new();
    let mut text = top.opt_object("text_config")?.unwrap_or(&empty).clone();
    match text.get("model_type").and_then(Value::as_str) {
        None | Some("mistral") => {}
        Some(other) => {
            return Err(top.err(
                "text_config.model_type",
                format!("`{other}` is not a supported Mistral 3 language model (mistral)"),
            ));
        }
    }
    let tie = top.bool_or("tie_word_embeddings", true)?;
    text.insert("tie_word_embeddings".to_owned(), Value::Bool(tie));
    inherit(top, &mut text, INHERITED);
    let c = Cfg::nested(&text, "text_config");
    let mut spec = llama::parse(&c, "mistral")?;
    spec.vision = Some(vision::pixtral(top, spec.hidden_size)?);
    spec.model_type = "mistral3".to_owned();
    Ok(spec)
}

/// `qwen3_vl` / `qwen3_vl_moe`: the `text_config`'s Qwen3 (or Qwen3-MoE) decoder and the
/// Qwen3-VL tower ([`vision::qwen3_vl`]). The text config's `model_type`
/// (`qwen3_vl_text`, `qwen3_vl_moe_text`) is read as Qwen3's.
pub(crate) fn qwen3_vl(top: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let empty = Map::new();
    let mut text = top.opt_object("text_config")?.unwrap_or(&empty).clone();
    inherit(top, &mut text, INHERITED);
    let c = Cfg::nested(&text, "text_config");
    let text_type = if model_type == "qwen3_vl_moe" {
        "qwen3_moe"
    } else {
        "qwen3"
    };
    let mut spec = qwen2::parse(&c, text_type)?;
    spec.vision = Some(vision::qwen3_vl(top, model_type)?);
    spec.model_type = model_type.to_owned();
    Ok(spec)
}

/// `idefics3` / `smolvlm`: the `text_config`'s Llama decoder (keys it omits take
/// `LlamaConfig`'s defaults) and a SigLIP tower with a pixel-shuffle connector
/// ([`vision::idefics3`]).
pub(crate) fn idefics3(top: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let empty = Map::new();
    let mut text = top.opt_object("text_config")?.unwrap_or(&empty).clone();
    match text.get("model_type").and_then(Value::as_str) {
        None | Some("llama") => {}
        Some(other) => {
            return Err(top.err(
                "text_config.model_type",
                format!("`{other}` is not a supported Idefics3 language model (llama)"),
            ));
        }
    }
    llama_defaults(&mut text);
    inherit(top, &mut text, INHERITED);
    let c = Cfg::nested(&text, "text_config");
    let mut spec = llama::parse(&c, "llama")?;
    spec.vision = Some(vision::idefics3(top, spec.hidden_size)?);
    spec.model_type = model_type.to_owned();
    Ok(spec)
}

/// `mllama` (Llama 3.2 Vision): the `text_config`'s Llama decoder (keys it omits take
/// `MllamaTextConfig`'s defaults, the 11B shape) whose `cross_attention_layers` are
/// `MllamaCrossAttentionDecoderLayer`s (the same Linears and MLP, plus `q_norm` and `k_norm`
/// over a head and the `cross_attn_attn_gate` and `cross_attn_mlp_gate` scalars), and the
/// tower of [`vision::mllama`]. `embed_tokens` holds `vocab_size + 8` rows (the image and
/// padding tokens), lm_head `vocab_size`: the 8 rows are counted outside the layers, with the
/// final norm.
pub(crate) fn mllama(top: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let empty = Map::new();
    let mut text = top.opt_object("text_config")?.unwrap_or(&empty).clone();
    for (key, value) in [
        ("hidden_size", 4096),
        ("intermediate_size", 14_336),
        ("num_hidden_layers", 40),
        ("num_attention_heads", 32),
        ("num_key_value_heads", 8),
        ("vocab_size", 128_256),
        ("max_position_embeddings", 131_072),
    ] {
        text.entry(key.to_owned()).or_insert(Value::from(value));
    }
    text.remove("model_type");
    inherit(top, &mut text, &["torch_dtype", "dtype"]);
    let c = Cfg::nested(&text, "text_config");
    let cross: Vec<u64> = if c.has_key("cross_attention_layers") {
        c.uint_list("cross_attention_layers")?
    } else {
        vec![3, 8, 13, 18, 23, 28, 33, 38]
    };
    let mut spec = llama::parse(&c, "llama")?;
    let layers = spec.num_layers;
    let mut seen = Vec::new();
    for &i in &cross {
        if i >= layers || seen.contains(&i) {
            return Err(c.err(
                "cross_attention_layers",
                format!("lists layer {i} twice or past the {layers} layers"),
            ));
        }
        seen.push(i);
    }
    let n_cross = u64::try_from(cross.len()).unwrap_or(u64::MAX);
    let hd = spec.head_dim;
    let h = spec.hidden_size;
    if n_cross > 0 {
        let Some(g) = spec.layers.first_mut() else {
            return Err(c.err("num_hidden_layers", "has no layers"));
        };
        g.count -= n_cross;
        let cross_group = crate::model::LayerGroup {
            count: n_cross,
            other_params: g.other_params + 2 * hd + 2,
            attention: crate::model::AttentionKind::Cross,
            ..g.clone()
        };
        spec.layers.retain(|g| g.count > 0);
        spec.layers.push(cross_group);
    }
    spec.final_norm_params += 8 * h;
    spec.vision = Some(vision::mllama(top, h)?);
    spec.model_type = "mllama".to_owned();
    Ok(spec)
}

/// Fills the keys a Llama `text_config` omits with `LlamaConfig`'s defaults (transformers
/// 5.24 `configuration_llama.py`: the 7B shape), as the multimodal config classes build it.
fn llama_defaults(text: &mut Map<String, Value>) {
    for (key, value) in [
        ("hidden_size", 4096),
        ("intermediate_size", 11008),
        ("num_hidden_layers", 32),
        ("num_attention_heads", 32),
        ("vocab_size", 32000),
    ] {
        text.entry(key.to_owned()).or_insert(Value::from(value));
    }
}

/// Keys a multimodal config may hold at its top level for its text part.
const INHERITED: &[&str] = &["tie_word_embeddings", "torch_dtype", "dtype"];

/// Copies `keys` from the top level into the text part where the text part lacks them.
fn inherit(top: &Cfg<'_>, text: &mut Map<String, Value>, keys: &[&str]) {
    for key in keys {
        if let Some(v) = top.get(key) {
            text.entry((*key).to_owned()).or_insert_with(|| v.clone());
        }
    }
}
