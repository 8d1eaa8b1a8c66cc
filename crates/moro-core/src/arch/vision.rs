//! `vision_config` → [`VisionSpec`]: the towers and projectors of the supported
//! vision-language models, module by module as transformers 5.24 builds them.
//!
//! - SigLIP (`siglip_vision_model`, Gemma 3): `patch_embedding` Conv2d(3, h, p) with bias,
//!   `position_embedding` of (image / p)² rows, per layer `layer_norm1`/`layer_norm2`
//!   (LayerNorm), `q_proj`/`k_proj`/`v_proj`/`out_proj` with bias, `fc1`/`fc2` with bias,
//!   `post_layernorm`; no head (`vision_use_head: false`). Gemma 3's projector is a bare
//!   `mm_input_projection_weight` (h_v × h) and `mm_soft_emb_norm` (RMSNorm h_v), after a
//!   4 × 4 average pool (`Gemma3MultiModalProjector`).
//! - CLIP (`clip_vision_model`, LLaVA): `class_embedding` (h), `patch_embedding` without
//!   bias, `position_embedding` of (image / p)² + 1 rows, `pre_layrnorm`, the same layers as
//!   SigLIP, `post_layernorm`; LLaVA's `linear_1` (h_v → h) and `linear_2` (h → h) with
//!   bias (`multimodal_projector_bias`, default true).
//! - Qwen2-VL: `patch_embed.proj` Conv3d(3, e, (2, p, p)) without bias, per block
//!   `norm1`/`norm2` (LayerNorm), `attn.qkv` and `attn.proj` with bias, `mlp.fc1`/`mlp.fc2`
//!   (e · `mlp_ratio`) with bias; `merger`: `ln_q` LayerNorm(e), `mlp.0` Linear(4e, 4e) and
//!   `mlp.2` Linear(4e, h) with bias.
//! - Qwen2.5-VL: the same with RMSNorm `norm1`/`norm2`/`ln_q` and a gated MLP
//!   (`gate_proj`, `up_proj`, `down_proj`, with bias); the merger ends at `out_hidden_size`.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_HEADS, MAX_LAYERS};
use crate::model::{AttentionKind, LayerGroup, Linear, LinearRole, NormKind};
use crate::vision::{ImageTokens, VisionSpec};

/// Largest accepted tower hidden size (SigLIP-so400m: 1152; InternViT-6B: 3200).
const MAX_VISION_HIDDEN: u64 = 1 << 16;
/// Largest accepted tower MLP width.
const MAX_VISION_INTERMEDIATE: u64 = 1 << 18;
/// Largest accepted processor image side.
const MAX_IMAGE: u64 = 1 << 14;

fn linear(name: &str, i: u64, o: u64) -> Linear {
    Linear::new(name, i, o, true, LinearRole::Vision)
}

fn block(count: u64, linears: Vec<Linear>, norm_params: u64) -> Vec<LayerGroup> {
    vec![LayerGroup {
        count,
        linears,
        other_params: norm_params,
        attention: AttentionKind::Full,
        moe: false,
    }]
}

/// The `vision_config` object, empty when absent (the tower's class defaults apply).
fn vision_config<'a>(top: &Cfg<'a>) -> Result<Cfg<'a>, ArchError> {
    static EMPTY: std::sync::LazyLock<serde_json::Map<String, serde_json::Value>> =
        std::sync::LazyLock::new(serde_json::Map::new);
    Ok(Cfg::nested(
        top.opt_object("vision_config")?.unwrap_or(&EMPTY),
        "vision_config",
    ))
}

struct Tower {
    hidden: u64,
    intermediate: u64,
    layers: u64,
    heads: u64,
}

fn tower_dims(v: &Cfg<'_>, defaults: (u64, u64, u64, u64)) -> Result<Tower, ArchError> {
    let hidden = v.dim_or("hidden_size", defaults.0, MAX_VISION_HIDDEN)?;
    let intermediate = v.dim_or("intermediate_size", defaults.1, MAX_VISION_INTERMEDIATE)?;
    let layers = v.dim_or("num_hidden_layers", defaults.2, MAX_LAYERS)?;
    let heads = v.dim_or("num_attention_heads", defaults.3, MAX_HEADS)?;
    if hidden % heads != 0 {
        return Err(v.err(
            "num_attention_heads",
            format!("does not divide hidden_size {hidden}"),
        ));
    }
    Ok(Tower {
        hidden,
        intermediate,
        layers,
        heads,
    })
}

/// The SigLIP / CLIP encoder layers (`q_proj`, `k_proj`, `v_proj`, `out_proj`, `fc1`,
/// `fc2`, two LayerNorms).
fn vit_layers(t: &Tower) -> Vec<LayerGroup> {
    vit_layers_named(t, "out_proj")
}

/// [`vit_layers`] with the attention's output projection named `out` (Llama 4: `o_proj`).
fn vit_layers_named(t: &Tower, out: &str) -> Vec<LayerGroup> {
    let h = t.hidden;
    block(
        t.layers,
        vec![
            linear("q_proj", h, h),
            linear("k_proj", h, h),
            linear("v_proj", h, h),
            linear(out, h, h),
            linear("fc1", h, t.intermediate),
            linear("fc2", t.intermediate, h),
        ],
        4 * h,
    )
}

fn image_geometry(v: &Cfg<'_>, image: u64, patch: u64) -> Result<(u64, u64), ArchError> {
    let image = v.dim_or("image_size", image, MAX_IMAGE)?;
    let patch = v.dim_or("patch_size", patch, MAX_IMAGE)?;
    if image % patch != 0 {
        return Err(v.err("patch_size", format!("does not divide image_size {image}")));
    }
    Ok((image, patch))
}

/// A SigLIP / CLIP `vision_config`'s tower dimensions (hidden, MLP, layers, heads defaults),
/// image and patch sides, and input channels.
fn vit(
    top: &Cfg<'_>,
    dims: (u64, u64, u64, u64),
    geometry: (u64, u64),
) -> Result<(Tower, u64, u64, u64), ArchError> {
    let v = vision_config(top)?;
    let t = tower_dims(&v, dims)?;
    let (image, patch) = image_geometry(&v, geometry.0, geometry.1)?;
    let channels = v.dim_or("num_channels", 3, 16)?;
    Ok((t, image, patch, channels))
}

/// Gemma 3's SigLIP tower and projector (`Gemma3Config.vision_config`, defaults
/// `SiglipVisionConfig`'s; `mm_tokens_per_image` 256).
pub(crate) fn gemma3(top: &Cfg<'_>, text_hidden: u64) -> Result<VisionSpec, ArchError> {
    let (t, image, patch, channels) = vit(top, (768, 3072, 12, 12), (224, 16))?;
    let h = t.hidden;
    let side = image / patch;
    let tokens = top.dim_or("mm_tokens_per_image", 256, side * side)?;
    let pooled_side = tokens.isqrt();
    if pooled_side * pooled_side != tokens || side % pooled_side != 0 {
        return Err(top.err(
            "mm_tokens_per_image",
            format!("is not a square that divides the {side} × {side} patch grid"),
        ));
    }
    Ok(VisionSpec {
        model_type: "siglip_vision_model".to_owned(),
        hidden_size: h,
        intermediate_size: t.intermediate,
        num_heads: t.heads,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        rotary: false,
        layers: vit_layers(&t),
        // patch_embedding (weight and bias), position_embedding, post_layernorm.
        embedding_params: channels * patch * patch * h + h + side * side * h + 2 * h,
        projector: Vec::new(),
        // mm_input_projection_weight and mm_soft_emb_norm.
        projector_other_params: cfg::mul(h, text_hidden, "vision_config.hidden_size")? + h,
        idle_params: 0,
        tokens: ImageTokens::Fixed {
            image_size: image,
            patch_size: patch,
            class_tokens: 0,
            // `Gemma3Processor.full_image_sequence`: "\n\n", <start_of_image>, the soft
            // tokens, <end_of_image>, "\n\n" (each "\n\n" one token).
            sequence_tokens: tokens + 4,
        },
        flash_attention: false,
        image_attention_mask: true,
        blocks_checkpoint: true,
        pan_and_scan: Some(crate::vision::PanAndScan {
            min_crop: 256,
            max_crops: 4,
            min_ratio_tenths: 12,
        }),
    })
}

/// LLaVA's CLIP tower and projector (`LlavaConfig`; `vision_feature_select_strategy`
/// `default` drops the class token: (image / patch)² placeholder tokens per image).
pub(crate) fn llava(top: &Cfg<'_>, text_hidden: u64) -> Result<VisionSpec, ArchError> {
    // LlavaConfig's default vision_config: CLIP ViT-L/14 at 336 px.
    let (t, image, patch, channels) = vit(top, (1024, 4096, 24, 16), (336, 14))?;
    let h = t.hidden;
    let side = image / patch;
    let full = match top.opt_str("vision_feature_select_strategy")? {
        None | Some("default") => false,
        Some("full") => true,
        Some(other) => {
            return Err(top.err(
                "vision_feature_select_strategy",
                format!("`{other}` is not `default` or `full`"),
            ));
        }
    };
    let bias = top.bool_or("multimodal_projector_bias", true)?;
    Ok(VisionSpec {
        model_type: "clip_vision_model".to_owned(),
        hidden_size: h,
        intermediate_size: t.intermediate,
        num_heads: t.heads,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        rotary: false,
        layers: vit_layers(&t),
        // class_embedding, patch_embedding (no bias), position_embedding (patches + 1),
        // pre_layrnorm, post_layernorm.
        embedding_params: h + channels * patch * patch * h + (side * side + 1) * h + 4 * h,
        projector: vec![
            Linear::new("linear_1", h, text_hidden, bias, LinearRole::Vision),
            Linear::new(
                "linear_2",
                text_hidden,
                text_hidden,
                bias,
                LinearRole::Vision,
            ),
        ],
        projector_other_params: 0,
        idle_params: 0,
        tokens: ImageTokens::Fixed {
            image_size: image,
            patch_size: patch,
            class_tokens: 1,
            sequence_tokens: side * side + u64::from(full),
        },
        flash_attention: true,
        image_attention_mask: false,
        blocks_checkpoint: true,
        pan_and_scan: None,
    })
}

/// Mistral 3's Pixtral tower and projector (transformers 5.25 `PixtralVisionModel`,
/// `Mistral3MultiModalProjector`; `PixtralVisionConfig` defaults): `patch_conv` Conv2d(3, h,
/// p) without bias, `ln_pre` RMSNorm, per layer `attention_norm`/`ffn_norm` (RMSNorm),
/// `q_proj`/`k_proj`/`v_proj`/`o_proj` and a gated MLP, all without bias, a 2-D RoPE; the
/// projector's RMSNorm, `patch_merger.merging_layer` (h · merge² → h, no bias), `linear_1`
/// (h → the text's hidden size) and `linear_2`, with bias when `multimodal_projector_bias`.
/// The processor scales images into a square of the tower's `image_size` (1540 for Mistral
/// Small 3.1, its `preprocessor_config.json` `longest_edge`).
pub(crate) fn pixtral(top: &Cfg<'_>, text_hidden: u64) -> Result<VisionSpec, ArchError> {
    let v = vision_config(top)?;
    let t = tower_dims(&v, (1024, 4096, 24, 16))?;
    let h = t.hidden;
    let image = v.dim_or("image_size", 1024, MAX_IMAGE)?;
    let patch = v.dim_or("patch_size", 16, MAX_IMAGE)?;
    let channels = v.dim_or("num_channels", 3, 16)?;
    let merge = top.dim_or("spatial_merge_size", 2, 64)?;
    let bias = top.bool_or("multimodal_projector_bias", false)?;
    let plain = |name: &str, i: u64, o: u64| Linear::new(name, i, o, false, LinearRole::Vision);
    Ok(VisionSpec {
        model_type: "pixtral".to_owned(),
        hidden_size: h,
        intermediate_size: t.intermediate,
        num_heads: t.heads,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        rotary: true,
        layers: block(
            t.layers,
            vec![
                plain("q_proj", h, h),
                plain("k_proj", h, h),
                plain("v_proj", h, h),
                plain("o_proj", h, h),
                plain("gate_proj", h, t.intermediate),
                plain("up_proj", h, t.intermediate),
                plain("down_proj", t.intermediate, h),
            ],
            2 * h,
        ),
        // patch_conv (no bias), ln_pre.
        embedding_params: channels * patch * patch * h + h,
        projector: vec![
            plain(
                "merging_layer",
                cfg::mul(h, merge * merge, "spatial_merge_size")?,
                h,
            ),
            Linear::new("linear_1", h, text_hidden, bias, LinearRole::Vision),
            Linear::new(
                "linear_2",
                text_hidden,
                text_hidden,
                bias,
                LinearRole::Vision,
            ),
        ],
        // The projector's RMSNorm.
        projector_other_params: h,
        idle_params: 0,
        tokens: ImageTokens::Pixtral {
            patch_size: patch,
            merge_size: merge,
            longest_edge: image,
        },
        flash_attention: true,
        image_attention_mask: false,
        blocks_checkpoint: true,
        pan_and_scan: None,
    })
}

/// Qwen3-VL's tower and mergers (transformers 5.25 `Qwen3VLVisionModel`; `Qwen3VLVisionConfig`
/// defaults): `patch_embed.proj` Conv3d(3, h, (2, p, p)) with bias, a learned `pos_embed` of
/// `num_position_embeddings` rows, per block `norm1`/`norm2` (LayerNorm), `attn.qkv` and
/// `attn.proj` and `mlp.linear_fc1`/`linear_fc2` with bias; the `merger` (LayerNorm(h), then
/// `linear_fc1` (4h → 4h) and `linear_fc2` (4h → `out_hidden_size`) on each 2 × 2 group) and
/// one more merger per `deepstack_visual_indexes` entry (its LayerNorm over 4h), whose outputs
/// the language model adds to its first layers' image positions. The processor is Qwen2-VL's
/// `smart_resize` with the released `preprocessor_config.json` of every Qwen3-VL checkpoint:
/// patch 16, `shortest_edge` 65,536 and `longest_edge` 16,777,216 pixels.
pub(crate) fn qwen3_vl(top: &Cfg<'_>, model_type: &str) -> Result<VisionSpec, ArchError> {
    let v = vision_config(top)?;
    let layers = v.dim_or("depth", 27, MAX_LAYERS)?;
    let hidden = v.dim_or("hidden_size", 1152, MAX_VISION_HIDDEN)?;
    let intermediate = v.dim_or("intermediate_size", 4304, MAX_VISION_INTERMEDIATE)?;
    let heads = v.dim_or("num_heads", 16, MAX_HEADS)?;
    let patch = v.dim_or("patch_size", 16, MAX_IMAGE)?;
    let merge = v.dim_or("spatial_merge_size", 2, 64)?;
    let temporal = v.dim_or("temporal_patch_size", 2, 64)?;
    let channels = v.dim_or("in_channels", 3, 16)?;
    let out = v.dim_or("out_hidden_size", 3584, MAX_VISION_HIDDEN)?;
    let positions = v.dim_or("num_position_embeddings", 2304, 1 << 24)?;
    let taps = v.uint_list("deepstack_visual_indexes")?;
    let deepstack = u64::try_from(taps.len()).unwrap_or(0);
    // A merger runs only where its tower layer exists (`Qwen3VLVisionModel.forward` checks
    // `layer_num in deepstack_visual_indexes`); a cut tower keeps the others as parameters.
    let firing = u64::try_from(taps.iter().filter(|&&i| i < layers).count()).unwrap_or(0);
    if hidden % heads != 0 {
        return Err(v.err("num_heads", format!("does not divide the width {hidden}")));
    }
    let merged = cfg::mul(hidden, merge * merge, "vision_config.spatial_merge_size")?;
    let mut projector = Vec::new();
    for _ in 0..=firing {
        projector.push(linear("linear_fc1", merged, merged));
        projector.push(linear("linear_fc2", merged, out));
    }
    let idle = (deepstack - firing) * (2 * merged + merged * merged + merged + merged * out + out);
    Ok(VisionSpec {
        model_type: model_type.to_owned(),
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_heads: heads,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        rotary: true,
        layers: block(
            layers,
            vec![
                linear("qkv", hidden, 3 * hidden),
                linear("proj", hidden, hidden),
                linear("linear_fc1", hidden, intermediate),
                linear("linear_fc2", intermediate, hidden),
            ],
            4 * hidden,
        ),
        embedding_params: channels * temporal * patch * patch * hidden
            + hidden
            + positions * hidden,
        projector,
        // The merger's LayerNorm(h) and each running deepstack merger's LayerNorm(4h).
        projector_other_params: 2 * hidden + firing * 2 * merged,
        idle_params: idle,
        tokens: ImageTokens::Dynamic {
            patch_size: patch,
            merge_size: merge,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
        },
        flash_attention: true,
        image_attention_mask: false,
        blocks_checkpoint: true,
        pan_and_scan: None,
    })
}

/// Idefics3's and SmolVLM's SigLIP tower and connector (transformers 5.25
/// `Idefics3VisionTransformer`, `Idefics3Connector`; `Idefics3VisionConfig` defaults):
/// `patch_embedding` Conv2d(3, h, p) with bias, `position_embedding` of (image / patch)²
/// rows, SigLIP layers, `post_layernorm`; the connector's pixel shuffle by `scale_factor`
/// (default 2) and `modality_projection.proj` (h · scale² → the text's hidden size, no
/// bias). The processor resizes to a longest edge of four tiles (the released
/// `preprocessor_config.json` files: 4 × 364 for Idefics3, 4 × 384 and 4 × 512 for SmolVLM)
/// and splits into tiles of the tower's `image_size`.
pub(crate) fn idefics3(top: &Cfg<'_>, text_hidden: u64) -> Result<VisionSpec, ArchError> {
    let v = vision_config(top)?;
    let t = tower_dims(&v, (1152, 3072, 12, 16))?;
    // The strided convolution drops a remainder: `num_patches_per_side = image_size //
    // patch_size` (SmolVLM: 384 px in patches of 14, 27 a side).
    let image = v.dim_or("image_size", 224, MAX_IMAGE)?;
    let patch = v.dim_or("patch_size", 32, MAX_IMAGE)?;
    if patch > image {
        return Err(v.err("patch_size", format!("exceeds image_size {image}")));
    }
    let channels = v.dim_or("num_channels", 3, 16)?;
    let h = t.hidden;
    let side = image / patch;
    let scale = top.dim_or("scale_factor", 2, 64)?;
    if side % scale != 0 {
        return Err(top.err(
            "scale_factor",
            format!("does not divide the {side} × {side} patch grid"),
        ));
    }
    let shuffled = cfg::mul(h, scale * scale, "scale_factor")?;
    Ok(VisionSpec {
        model_type: "idefics3_vision".to_owned(),
        hidden_size: h,
        intermediate_size: t.intermediate,
        num_heads: t.heads,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        rotary: false,
        layers: vit_layers(&t),
        // patch_embedding (weight and bias), position_embedding, post_layernorm.
        embedding_params: channels * patch * patch * h + h + side * side * h + 2 * h,
        projector: vec![Linear::new(
            "proj",
            shuffled,
            text_hidden,
            false,
            LinearRole::Vision,
        )],
        projector_other_params: 0,
        idle_params: 0,
        tokens: ImageTokens::Split {
            tile_size: image,
            patch_size: patch,
            tokens_per_tile: side * side / (scale * scale),
            longest_edge: 4 * image,
        },
        flash_attention: true,
        image_attention_mask: false,
        blocks_checkpoint: true,
        pan_and_scan: None,
    })
}

/// Llama 4's tower, pixel-shuffle adapter and projector (transformers 5.25
/// `Llama4VisionModel`, `Llama4VisionPixelShuffleMLP`, `Llama4MultiModalProjector`;
/// `Llama4VisionConfig` defaults): `patch_embedding.linear` (channels · patch² → h, no
/// bias), `class_embedding`, `positional_embedding_vlm` of (image / patch)² + 1 rows,
/// `layernorm_pre`/`layernorm_post`; per layer `q_proj`/`k_proj`/`v_proj`/`o_proj` and
/// `fc1`/`fc2` with bias, two LayerNorms, a 2-D RoPE; the adapter's `fc1`
/// (`intermediate_size` → `projector_input_dim`) and `fc2` (`projector_output_dim` square),
/// without bias; `multi_modal_projector.linear_1` (`vision_output_dim` → the text's hidden
/// size, no bias). The processor tiles images of `image_size` (336 for Scout) up to 16
/// tiles (`Llama4ImageProcessor.max_patches`).
pub(crate) fn llama4(top: &Cfg<'_>, text_hidden: u64) -> Result<VisionSpec, ArchError> {
    let (t, image, patch, channels) = vit(top, (768, 5632, 34, 16), (448, 14))?;
    let v = vision_config(top)?;
    let h = t.hidden;
    let side = image / patch;
    let ratio = match v.get("pixel_shuffle_ratio") {
        None => 0.5,
        Some(x) => x
            .as_f64()
            .filter(|r| *r > 0.0 && *r <= 1.0)
            .ok_or_else(|| v.err("pixel_shuffle_ratio", "is not a number in (0, 1]"))?,
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let downsample = (1.0 / (ratio * ratio)).round() as u64;
    if side * side % downsample != 0 {
        return Err(v.err(
            "pixel_shuffle_ratio",
            format!("leaves a fraction of a token from {side} × {side} patches"),
        ));
    }
    let dim = |key: &str, default: u64| v.dim_or(key, default, MAX_VISION_INTERMEDIATE);
    let adapter_in = dim("projector_input_dim", 4096)?;
    let adapter_out = dim("projector_output_dim", 4096)?;
    let output = dim("vision_output_dim", 7680)?;
    let layers = vit_layers_named(&t, "o_proj");
    let plain = |name: &str, i: u64, o: u64| Linear::new(name, i, o, false, LinearRole::Vision);
    Ok(VisionSpec {
        model_type: "llama4_vision_model".to_owned(),
        hidden_size: h,
        intermediate_size: t.intermediate,
        num_heads: t.heads,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        rotary: true,
        layers,
        embedding_params: channels * patch * patch * h + h + (side * side + 1) * h + 4 * h,
        projector: vec![
            plain("fc1", t.intermediate, adapter_in),
            plain("fc2", adapter_out, adapter_out),
            plain("linear_1", output, text_hidden),
        ],
        projector_other_params: 0,
        idle_params: 0,
        tokens: ImageTokens::Tiled {
            tile_size: image,
            patch_size: patch,
            downsample,
            max_tiles: 16,
        },
        flash_attention: true,
        image_attention_mask: false,
        blocks_checkpoint: true,
        pan_and_scan: None,
    })
}

/// Qwen2-VL's and Qwen2.5-VL's tower and merger (`vision_config`), and their processors'
/// resizing: `min_pixels` 3136 (4 tokens) and `max_pixels` 12,845,056 (16,384 tokens), the
/// values of the released checkpoints' `preprocessor_config.json` and the Qwen2.5-VL model
/// card (the image processor class alone defaults `max_pixels` to 1,003,520).
pub(crate) fn qwen_vl(
    top: &Cfg<'_>,
    model_type: &str,
    text_hidden: u64,
) -> Result<VisionSpec, ArchError> {
    let v = vision_config(top)?;
    let v25 = model_type == "qwen2_5_vl";
    let layers = v.dim_or("depth", 32, MAX_LAYERS)?;
    let heads = v.dim_or("num_heads", 16, MAX_HEADS)?;
    let patch = v.dim_or("patch_size", 14, MAX_IMAGE)?;
    let merge = v.dim_or("spatial_merge_size", 2, 64)?;
    let temporal = v.dim_or("temporal_patch_size", 2, 64)?;
    let channels = v.dim_any(&["in_channels", "in_chans"], 16).unwrap_or(3);
    let (hidden, intermediate, out) = if v25 {
        (
            v.dim_or("hidden_size", 1280, MAX_VISION_HIDDEN)?,
            v.dim_or("intermediate_size", 3420, MAX_VISION_INTERMEDIATE)?,
            v.dim_or("out_hidden_size", text_hidden, MAX_VISION_HIDDEN)?,
        )
    } else {
        let e = v.dim_or("embed_dim", 1280, MAX_VISION_HIDDEN)?;
        let ratio = v.dim_or("mlp_ratio", 4, 64)?;
        (
            e,
            e * ratio,
            v.dim_or("hidden_size", text_hidden, MAX_VISION_HIDDEN)?,
        )
    };
    if hidden % heads != 0 {
        return Err(v.err("num_heads", format!("does not divide the width {hidden}")));
    }
    let (norm, norm_params) = if v25 {
        (NormKind::RmsNorm, hidden)
    } else {
        (NormKind::LayerNorm, 2 * hidden)
    };
    let mlp = if v25 {
        vec![
            linear("gate_proj", hidden, intermediate),
            linear("up_proj", hidden, intermediate),
            linear("down_proj", intermediate, hidden),
        ]
    } else {
        vec![
            linear("fc1", hidden, intermediate),
            linear("fc2", intermediate, hidden),
        ]
    };
    let mut linears = vec![
        linear("qkv", hidden, 3 * hidden),
        linear("proj", hidden, hidden),
    ];
    linears.extend(mlp);
    let merged = hidden * merge * merge;
    Ok(VisionSpec {
        model_type: model_type.to_owned(),
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_heads: heads,
        norm,
        gated_mlp: v25,
        rotary: true,
        layers: block(layers, linears, 2 * norm_params),
        embedding_params: channels * temporal * patch * patch * hidden,
        projector: vec![
            linear("mlp.0", merged, merged),
            linear("mlp.2", merged, out),
        ],
        projector_other_params: norm_params,
        idle_params: 0,
        tokens: ImageTokens::Dynamic {
            patch_size: patch,
            merge_size: merge,
            min_pixels: 3136,
            max_pixels: 12_845_056,
        },
        flash_attention: true,
        image_attention_mask: false,
        blocks_checkpoint: true,
        pan_and_scan: None,
    })
}

/// Llama 3.2 Vision's tower and projector (transformers 5.25 `MllamaVisionModel`,
/// `MllamaVisionConfig` defaults but the released 560-pixel tiles): `patch_embedding`
/// Conv2d(3, h, p) without bias, `class_embedding` (h), `gated_positional_embedding` (a gate,
/// (image / p)² + 1 rows, and a `tile_embedding` of `max_num_tiles` × those rows per aspect
/// ratio, plus one), `pre_tile_positional_embedding` and `post_tile_positional_embedding` (a
/// gate and `max_num_tiles` × h per aspect ratio, plus one), `layernorm_pre` and
/// `layernorm_post`; `num_hidden_layers` local and `num_global_layers` global blocks, each
/// `q_proj`/`k_proj`/`v_proj`/`o_proj` without bias, `fc1`/`fc2` with bias and two LayerNorms,
/// the global ones with `gate_attn` and `gate_ffn`; `multi_modal_projector`, one Linear
/// (`vision_output_dim` → the text's hidden size) with bias. The blocks are plain
/// `nn.Module`s: they do not checkpoint.
pub(crate) fn mllama(top: &Cfg<'_>, text_hidden: u64) -> Result<VisionSpec, ArchError> {
    let v = vision_config(top)?;
    let h = v.dim_or("hidden_size", 1280, MAX_VISION_HIDDEN)?;
    let intermediate = v.dim_or("intermediate_size", 5120, MAX_VISION_INTERMEDIATE)?;
    let local = v.dim_or("num_hidden_layers", 32, MAX_LAYERS)?;
    let global = v.uint_or("num_global_layers", 8, MAX_LAYERS)?;
    let heads = v.dim_or("attention_heads", 16, MAX_HEADS)?;
    if h % heads != 0 {
        return Err(v.err(
            "attention_heads",
            format!("does not divide hidden_size {h}"),
        ));
    }
    let (image, patch) = image_geometry(&v, 448, 14)?;
    let channels = v.dim_or("num_channels", 3, 16)?;
    let tiles = v.dim_or("max_num_tiles", 4, 64)?;
    let ratios = match v.get("supported_aspect_ratios") {
        None => 8,
        Some(serde_json::Value::Array(a)) => u64::try_from(a.len()).unwrap_or(u64::MAX),
        Some(_) => return Err(v.err("supported_aspect_ratios", "is not a list")),
    };
    let output = v.dim_or("vision_output_dim", 7680, MAX_VISION_INTERMEDIATE)?;
    let side = image / patch;
    let positions = side * side + 1;
    let plain = |name: &str, i: u64, o: u64| Linear::new(name, i, o, false, LinearRole::Vision);
    let linears = vec![
        plain("q_proj", h, h),
        plain("k_proj", h, h),
        plain("v_proj", h, h),
        plain("o_proj", h, h),
        linear("fc1", h, intermediate),
        linear("fc2", intermediate, h),
    ];
    let mut layers = block(local, linears.clone(), 4 * h);
    if global > 0 {
        // `gate_attn` and `gate_ffn`.
        layers.extend(block(global, linears, 4 * h + 2));
    }
    let tile_embedding = (ratios + 1) * tiles * positions * h;
    let aspect_embeddings = 2 * ((ratios + 1) * tiles * h + 1);
    Ok(VisionSpec {
        model_type: "mllama_vision_model".to_owned(),
        hidden_size: h,
        intermediate_size: intermediate,
        num_heads: heads,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        rotary: false,
        layers,
        embedding_params: channels * patch * patch * h
            + h
            + 1
            + positions * h
            + tile_embedding
            + aspect_embeddings
            + 4 * h,
        projector: vec![Linear::new(
            "multi_modal_projector",
            output,
            text_hidden,
            true,
            LinearRole::Vision,
        )],
        projector_other_params: 0,
        idle_params: 0,
        tokens: ImageTokens::CrossTiles {
            tile_size: image,
            patch_size: patch,
            max_tiles: tiles,
        },
        // `MllamaPreTrainedModel._supports_flash_attn = False`: it builds 4-D masks.
        flash_attention: false,
        image_attention_mask: false,
        blocks_checkpoint: false,
        pan_and_scan: None,
    })
}
