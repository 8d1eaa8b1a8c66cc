//! `gemma3n_text` and `gemma3n`: Gemma 3n (transformers 5.25
//! `models/gemma3n/modeling_gemma3n.py`, `configuration_gemma3n.py`).
//!
//! The text model (`Gemma3nTextModel`):
//! - `embed_tokens` (V · h, tied to lm_head), `embed_tokens_per_layer`
//!   (`vocab_size_per_layer_input` · L · p), `per_layer_model_projection` (h → L · p),
//!   `per_layer_projection_norm` (p), `altup_projections` and `altup_unembed_projections`
//!   (`altup_num_inputs` − 1 Linears h → h each), the final `norm`.
//! - Per layer: `q_proj`, `k_proj`, `v_proj`, `o_proj` (the last `num_kv_shared_layers`
//!   have no `k_proj`, `v_proj`, `k_norm`: they reuse another layer's keys and values),
//!   `q_norm`/`k_norm` over a head, a gated MLP of the layer's `intermediate_size`, four
//!   norms, AltUp (`correct_output_scale` h, `correction_coefs` A → A, `prediction_coefs`
//!   A → A², `modality_router` h → A, `router_norm` h), LAuReL (`linear_left` h → r,
//!   `linear_right` r → h, `post_laurel_norm` h), `per_layer_input_gate` (h → p),
//!   `per_layer_projection` (p → h), `post_per_layer_input_norm` h. No biases.
//!
//! The multimodal `gemma3n` adds a MobileNetV5 vision tower (timm), a USM audio encoder
//! and their embedders: counted from [`TOWERS`], the towers transformers builds for the
//! released configurations; images and audio are not modelled (refused by name).

use serde_json::Value;

use super::ArchError;
use super::cfg::MAX_VOCAB;
use super::cfg::{self, Cfg, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS};
use super::common::{self, Heads, Plan};
use crate::model::{
    AttentionKind, Dtype, Gemma3nGroup, Gemma3nSpec, LayerGroup, Linear, LinearRole, ModelSpec,
    NormKind,
};

/// Parameters of the released Gemma 3n towers and embedders, by vision architecture and
/// audio width: (`vision_config.architecture`, `audio_config.hidden_size`, parameters of
/// `vision_tower` + `audio_tower` + `embed_vision` + `embed_audio`), summed `numel` of
/// `Gemma3nForConditionalGeneration(Gemma3nConfig())` on the meta device (transformers 5.25,
/// timm 1.0.31): 294,126,912 + 681,348,640 + 4,460,544 + 3,345,408.
const TOWERS: &[(&str, u64, u64)] = &[("mobilenetv5_300m_enc", 1536, 983_281_504)];

/// Parses a `gemma3n_text` config, or a `gemma3n` one's `text_config` with its towers.
pub(crate) fn parse(top: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    if model_type == "gemma3n" {
        let empty = serde_json::Map::new();
        let text = top.opt_object("text_config")?.unwrap_or(&empty);
        let mut spec = text_model(&Cfg::nested(text, "text_config"))?;
        let arch = top
            .opt_object("vision_config")?
            .and_then(|v| v.get("architecture"))
            .and_then(Value::as_str)
            .unwrap_or("mobilenetv5_300m_enc");
        let audio = top
            .opt_object("audio_config")?
            .and_then(|a| a.get("hidden_size"))
            .and_then(Value::as_u64)
            .unwrap_or(1536);
        let Some(&(_, _, towers)) = TOWERS.iter().find(|(a, w, _)| *a == arch && *w == audio)
        else {
            return Err(top.err(
                "vision_config.architecture",
                format!(
                    "`{arch}` with a {audio}-wide audio encoder is not a Gemma 3n tower moro \
                     counts (mobilenetv5_300m_enc with 1536 is)"
                ),
            ));
        };
        spec.final_norm_params = cfg::add(spec.final_norm_params, towers, "vision_config")?;
        spec.model_type = "gemma3n".to_owned();
        return Ok(spec);
    }
    text_model(top)
}

/// The text model of a `gemma3n_text` config (`Gemma3nTextConfig` defaults: the E4B shape).
fn text_model(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let h = c.dim_or("hidden_size", 2048, MAX_HIDDEN)?;
    let layers = c.dim_or("num_hidden_layers", 35, MAX_LAYERS)?;
    let n = usize::try_from(layers).unwrap_or(usize::MAX);
    let vocab = c.dim_or("vocab_size", 262_400, MAX_VOCAB)?;
    let nh = c.dim_or("num_attention_heads", 8, MAX_HEADS)?;
    let kv = c.dim_or("num_key_value_heads", 2, MAX_HEADS)?;
    if kv > nh || !nh.is_multiple_of(kv) {
        return Err(c.err(
            "num_key_value_heads",
            format!("({kv}) must divide the number of query heads ({nh})"),
        ));
    }
    let hd = c.dim_or("head_dim", 256, MAX_HEAD_DIM)?;
    let heads = Heads { nh, kv, hd };
    let ple = c.dim_or("hidden_size_per_layer_input", 256, MAX_HIDDEN)?;
    let ple_vocab = c.dim_or("vocab_size_per_layer_input", 262_144, MAX_VOCAB)?;
    let altup = c.dim_or("altup_num_inputs", 4, 64)?;
    let laurel = c.dim_or("laurel_rank", 64, MAX_HIDDEN)?;
    let shared = c.uint_or("num_kv_shared_layers", 15, layers)?;
    let window = c.dim_or("sliding_window", 512, cfg::MAX_POSITIONS)?;
    let intermediate: Vec<u64> = match c.get("intermediate_size") {
        Some(Value::Array(_)) => c.uint_list("intermediate_size")?,
        _ => vec![c.dim_or("intermediate_size", 16_384, MAX_INTERMEDIATE)?; n],
    };
    if intermediate.len() != n || intermediate.iter().any(|&i| i == 0 || i > MAX_INTERMEDIATE) {
        return Err(c.err(
            "intermediate_size",
            format!("needs one width (1 to {MAX_INTERMEDIATE}) or one per layer ({layers})"),
        ));
    }
    let kinds: Vec<AttentionKind> = match c.opt_str_list("layer_types")? {
        Some(types) if types.len() == n => types
            .into_iter()
            .map(|t| match t {
                "sliding_attention" => Ok(AttentionKind::Sliding { window }),
                "full_attention" => Ok(AttentionKind::Full),
                other => Err(c.err(
                    "layer_types",
                    format!("has \"{other}\"; expected sliding_attention or full_attention"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(types) => {
            return Err(c.err(
                "layer_types",
                format!("has {} entries for {layers} layers", types.len()),
            ));
        }
        None => (0..layers)
            .map(|i| {
                if (i + 1).is_multiple_of(5) {
                    AttentionKind::Full
                } else {
                    AttentionKind::Sliding { window }
                }
            })
            .collect(),
    };
    let sparsity: Vec<bool> = match c.get("activation_sparsity_pattern") {
        None | Some(Value::Null) => (0..layers).map(|i| layers > 10 && i < 10).collect(),
        Some(Value::Number(p)) => vec![p.as_f64().unwrap_or(0.0) > 0.0; n],
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|v| v.as_f64().map(|p| p > 0.0))
            .collect::<Option<_>>()
            .ok_or_else(|| c.err("activation_sparsity_pattern", "has a non-number"))?,
        Some(_) => {
            return Err(c.err(
                "activation_sparsity_pattern",
                format!("needs one value or one per layer ({layers})"),
            ));
        }
    };
    // `kv_sharing_modes`: layers from `L - shared` on reuse; before them, the last layer of
    // each kind stores its keys and values at full length for them.
    let first_shared = layers - shared;
    let stores = |i: u64| {
        shared > 0
            && i < first_shared
            && !(i + 1..first_shared).any(|j| same_kind(kinds[j as usize], kinds[i as usize]))
    };

    let router = |name: &str, i: u64, o: u64| Linear::new(name, i, o, false, LinearRole::Router);
    let mut groups: Vec<(LayerGroup, Gemma3nGroup)> = Vec::new();
    for i in 0..layers {
        let idx = i as usize;
        let flags = Gemma3nGroup {
            kv_shared: i >= first_shared,
            sparse: sparsity[idx],
            stores_kv: stores(i),
        };
        let inter = intermediate[idx];
        let mut linears = vec![Linear::new(
            "q_proj",
            h,
            heads.q(),
            false,
            LinearRole::Attention,
        )];
        if !flags.kv_shared {
            linears.push(Linear::new(
                "k_proj",
                h,
                heads.kv_width(),
                false,
                LinearRole::Attention,
            ));
            linears.push(Linear::new(
                "v_proj",
                h,
                heads.kv_width(),
                false,
                LinearRole::Attention,
            ));
        }
        linears.push(Linear::new(
            "o_proj",
            heads.q(),
            h,
            false,
            LinearRole::Attention,
        ));
        linears.extend(common::gated_mlp(h, inter, false, LinearRole::Mlp));
        linears.extend([
            router("correction_coefs", altup, altup),
            router("prediction_coefs", altup, altup * altup),
            router("modality_router", h, altup),
            router("linear_left", h, laurel),
            router("linear_right", laurel, h),
            router("per_layer_input_gate", h, ple),
            router("per_layer_projection", ple, h),
        ]);
        // Four norms, AltUp's scale and router norm, LAuReL's and the per-layer input's
        // norms; q_norm, and k_norm where the layer has its own keys.
        let other = 8 * h + hd + if flags.kv_shared { 0 } else { hd };
        let kind = kinds[idx];
        if let Some((g, _)) = groups
            .iter_mut()
            .find(|(g, f)| *f == flags && g.attention == kind && g.linears == linears)
        {
            g.count += 1;
            continue;
        }
        groups.push((
            LayerGroup {
                count: 1,
                linears,
                other_params: other,
                attention: kind,
                moe: false,
            },
            flags,
        ));
    }
    // Everything outside the layers but the token embedding.
    let ple_width = cfg::mul(layers, ple, "hidden_size_per_layer_input")?;
    let outside = cfg::mul(ple_vocab, ple_width, "vocab_size_per_layer_input")?
        + h * ple_width
        + ple
        + 2 * (altup - 1) * h * h
        + h;
    let mut spec = common::build(Plan {
        model_type: "gemma3n_text".to_owned(),
        hidden: h,
        intermediate: intermediate.iter().copied().max().unwrap_or(0),
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", true)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 32_768)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        attn: Vec::new(),
        layer_other: 0,
        dense_mlp: Vec::new(),
        moe: None,
        kinds: Vec::new(),
        mla: None,
        final_norm: outside,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;
    let (layer_groups, flags): (Vec<_>, Vec<_>) = groups.into_iter().unzip();
    spec.layers = layer_groups;
    spec.num_layers = layers;
    let total = spec.total_params();
    if total > cfg::MAX_TOTAL_PARAMS {
        return Err(c.err(
            "num_hidden_layers",
            format!("gives {total} parameters, over the 2^50 limit"),
        ));
    }
    spec.qk_norm = true;
    spec.logit_softcapping = c
        .get("final_logit_softcapping")
        .is_none_or(|v| !v.is_null());
    spec.gemma3n = Some(Gemma3nSpec {
        altup,
        laurel_rank: laurel,
        ple,
        ple_vocab,
        groups: flags,
    });
    Ok(spec)
}

/// Whether two layers are of one kind for KV sharing (`layer_types` equal).
fn same_kind(a: AttentionKind, b: AttentionKind) -> bool {
    matches!(
        (a, b),
        (AttentionKind::Full, AttentionKind::Full)
            | (AttentionKind::Sliding { .. }, AttentionKind::Sliding { .. })
    )
}
