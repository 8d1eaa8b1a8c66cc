//! The image side of a vision-language model: its vision tower, the projector into the
//! language model, and how many tokens one image becomes.
//!
//! Rules follow transformers 5.24: Gemma 3 (`Gemma3Processor`, `SiglipVisionModel`,
//! `Gemma3MultiModalProjector`), LLaVA (`LlavaProcessor`, `CLIPVisionModel`,
//! `LlavaMultiModalProjector`), Qwen2-VL and Qwen2.5-VL (`Qwen2VLImageProcessor`
//! `smart_resize`, `Qwen2VisionTransformerPretrainedModel`,
//! `Qwen2_5_VisionTransformerPretrainedModel`).

use serde::{Deserialize, Serialize};

use crate::model::{LayerGroup, Linear, NormKind};

/// The vision tower and projector of a vision-language model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VisionSpec {
    /// The tower's `model_type` (`siglip_vision_model`, `clip_vision_model`, `qwen2_vl`,
    /// `qwen2_5_vl`).
    pub model_type: String,
    /// Tower hidden size.
    pub hidden_size: u64,
    /// Tower MLP intermediate size.
    pub intermediate_size: u64,
    /// Tower attention heads.
    pub num_heads: u64,
    /// Tower norm kind.
    pub norm: NormKind,
    /// Gated (SwiGLU) tower MLP (Qwen2.5-VL) instead of fc1/fc2.
    pub gated_mlp: bool,
    /// Rotary position embedding on the tower's q and k (Qwen-VL's 2-D RoPE).
    pub rotary: bool,
    /// The tower's blocks (`layers` / `blocks`).
    pub layers: Vec<LayerGroup>,
    /// Tower parameters outside the blocks: patch and position embeddings, class embedding,
    /// pre- and post-norms.
    pub embedding_params: u64,
    /// The projector's Linears (LLaVA's `linear_1`/`linear_2`, Qwen-VL's merger MLP).
    pub projector: Vec<Linear>,
    /// Projector parameters outside Linears (norms; Gemma 3's `mm_input_projection_weight`,
    /// a bare parameter).
    pub projector_other_params: u64,
    /// Parameters the forward never reaches (Qwen3-VL's deepstack mergers past a cut tower's
    /// last layer): held with the weights, but with no gradient and so no optimizer state
    /// (`torch.optim` skips a parameter whose `.grad` is `None`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub idle_params: u64,
    /// How an image becomes tokens.
    pub tokens: ImageTokens,
    /// Whether the multimodal model runs FlashAttention: Gemma 3's does not
    /// (`Gemma3ForConditionalGeneration._supports_flash_attn = False`: FlashAttention drops
    /// the bidirectional mask over image tokens).
    pub flash_attention: bool,
    /// Whether the language model attends bidirectionally within each image's tokens, so
    /// that transformers builds a 4-D attention mask for every batch with images, as for a
    /// padded batch (Gemma 3: `token_type_ids` → `create_masks_for_vision_model`): SDPA then
    /// runs its mem-efficient kernel with K and V repeated to every query head.
    pub image_attention_mask: bool,
    /// Whether the tower's blocks are `GradientCheckpointingLayer`s that checkpoint under
    /// gradient checkpointing. Mllama's `MllamaVisionEncoderLayer` is a plain `nn.Module`:
    /// a recorded tower saves every block whole.
    #[serde(default = "yes")]
    pub blocks_checkpoint: bool,
    /// The processor's pan-and-scan, where it has one (Gemma 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pan_and_scan: Option<PanAndScan>,
}

const fn yes() -> bool {
    true
}

const fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the processor turns one image into placeholder tokens and tower patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ImageTokens {
    /// Every image is resized to one square size (Gemma 3: 896 px; LLaVA-1.5: 336 px).
    Fixed {
        /// Side of the resized image in pixels.
        image_size: u64,
        /// Tower patch side in pixels.
        patch_size: u64,
        /// Extra tower positions (CLIP's class token).
        class_tokens: u64,
        /// Tokens the processor inserts in place of the text's one image placeholder,
        /// placeholder included (Gemma 3: "\n\n", `<start_of_image>`, 256 soft tokens,
        /// `<end_of_image>`, "\n\n"; LLaVA: 576 `<image>`).
        sequence_tokens: u64,
    },
    /// Qwen-VL's dynamic resolution: `smart_resize` to multiples of `patch · merge` within
    /// `[min_pixels, max_pixels]`, one tower patch per `patch²` pixels, one token per
    /// `merge²` patches.
    Dynamic {
        /// Patch side (14).
        patch_size: u64,
        /// Spatial merge (2).
        merge_size: u64,
        /// `min_pixels` of the processor.
        min_pixels: u64,
        /// `max_pixels` of the processor.
        max_pixels: u64,
    },
    /// Pixtral's resize (`PixtralImageProcessor`, Mistral Small 3.1): scaled down to fit a
    /// `longest_edge` square, each side then rounded up to whole token cells of
    /// `patch_size · merge_size` pixels; one tower patch per `patch_size²` pixels, one token
    /// per cell, and an `[IMG_BREAK]` after each row (the last one `[IMG_END]`).
    Pixtral {
        /// Tower patch side (14).
        patch_size: u64,
        /// The projector's patch merge (2).
        merge_size: u64,
        /// The processor's `longest_edge` (1540).
        longest_edge: u64,
    },
    /// Llama 4's tiles (`Llama4ImageProcessor`): the image is resized without distortion
    /// onto the best-fitting canvas of at most `max_tiles` square tiles (`get_best_fit` over
    /// `find_supported_resolutions`, [`best_fit_tiles`]); a split image gets one more,
    /// global tile. The tower runs each tile alone, its patches plus a class token; pixel
    /// shuffle leaves `(tile / patch)² / downsample` tokens a tile (144).
    Tiled {
        /// Tile side in pixels (336).
        tile_size: u64,
        /// Tower patch side (14).
        patch_size: u64,
        /// Patches merged into one token by pixel shuffle (`round(1 / ratio²)`: 4).
        downsample: u64,
        /// `max_patches` of the processor (16).
        max_tiles: u64,
    },
    /// Idefics3 and SmolVLM (`Idefics3ImageProcessor`, `SmolVLMImageProcessor`): the image
    /// is resized to a longest edge of `longest_edge`, then up to multiples of the tile and
    /// split into `rows × cols` tiles of `tile_size`, plus a global tile ([`split_tiles`]);
    /// an image no larger than a tile is one tile. Each tile is one tower pass of
    /// `(tile / patch)²` patches and `tokens_per_tile` tokens after the connector's pixel
    /// shuffle.
    Split {
        /// Tile side (`max_image_size.longest_edge`, the tower's `image_size`).
        tile_size: u64,
        /// Tower patch side.
        patch_size: u64,
        /// Tokens a tile becomes (`image_seq_len`).
        tokens_per_tile: u64,
        /// `size.longest_edge` of the processor (4 tiles in the released checkpoints).
        longest_edge: u64,
    },
    /// Llama 3.2 Vision (`MllamaImageProcessor`, `MllamaVisionModel`): the image is split
    /// into tiles of `tile_size` and padded with empty tiles to `max_tiles` (the
    /// `pixel_values` of every image hold them all); the tower runs the image's tiles as one
    /// sequence of `max_tiles` × ((tile / patch)² + 1) positions, each tile padded to a
    /// multiple of 8; the language model reads the result through its cross-attention
    /// layers, so the sequence keeps just the prompt's `<|image|>` token.
    CrossTiles {
        /// Tile side in pixels (560).
        tile_size: u64,
        /// Tower patch side (14).
        patch_size: u64,
        /// `max_image_tiles` of the processor, `max_num_tiles` of the tower (4).
        max_tiles: u64,
    },
}

/// The images of one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Images {
    /// Images per sample (0: text only).
    pub per_sample: u64,
    /// Width in pixels before the processor resizes it.
    pub width: u64,
    /// Height in pixels.
    pub height: u64,
    /// Gemma 3's pan-and-scan (`do_pan_and_scan=True`): an image of an exaggerated aspect
    /// ratio also goes in as crops ([`PanAndScan`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pan_and_scan: bool,
}

/// Gemma 3's pan-and-scan (transformers 5.25 `Gemma3ImageProcessor.pan_and_scan`, the
/// processor's defaults `Gemma3ProcessorKwargs`): an image whose longer side is at least
/// `min_ratio` times the shorter is also cut along its longer side into `round(ratio)`
/// crops (2 to `max_crops`, each at least `min_crop` pixels), each resized and encoded like
/// the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PanAndScan {
    /// `pan_and_scan_min_crop_size` (256).
    pub min_crop: u64,
    /// `pan_and_scan_max_num_crops` (4).
    pub max_crops: u64,
    /// `pan_and_scan_min_ratio_to_activate` (1.2), in tenths.
    pub min_ratio_tenths: u64,
}

impl PanAndScan {
    /// Crops of a `width × height` image, 0 when pan-and-scan leaves it whole.
    #[must_use]
    pub fn crops(&self, width: u64, height: u64) -> u64 {
        let (long, short) = (width.max(height), width.min(height).max(1));
        if 10 * long < self.min_ratio_tenths * short {
            return 0;
        }
        // `int(floor(long / short + 0.5))`, then at most `floor(long / min_crop)`.
        let n = ((2 * long + short) / (2 * short))
            .min(long / self.min_crop.max(1))
            .clamp(2, self.max_crops.max(2));
        // Each crop at least `min_crop` on its shorter side.
        if long.div_ceil(n).min(short) < self.min_crop {
            return 0;
        }
        n
    }
}

/// Text tokens `Gemma3Processor` adds around an image's pan-and-scan crops: "Here is the
/// original image … and here are some crops to help you see better" and the spaces between
/// the crops (Gemma 3's tokenizer: 16 + one per crop).
const PAN_AND_SCAN_TEXT_TOKENS: u64 = 16;

/// Largest image side moro accepts, in pixels.
pub const MAX_IMAGE_SIDE: u64 = 1 << 16;
/// Most images one sample may carry.
pub const MAX_IMAGES_PER_SAMPLE: u64 = 1 << 10;

/// Reads an image size written `WIDTHxHEIGHT` (`1280x720`; `×` and `X` also), the one
/// spelling of flags, moro.yaml and the web page.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_image_size(s: &str) -> Result<(u64, u64), String> {
    let t = s.trim();
    let parts: Vec<&str> = t.split(['x', 'X', '×']).collect();
    let [w, h] = parts.as_slice() else {
        return Err(format!("`{s}` is not WIDTHxHEIGHT (e.g. 1280x720)"));
    };
    let side = |v: &str, what: &str| -> Result<u64, String> {
        let n: u64 = v
            .trim()
            .parse()
            .map_err(|_| format!("the {what} `{v}` in `{s}` is not a whole number of pixels"))?;
        if n == 0 || n > MAX_IMAGE_SIDE {
            return Err(format!(
                "the {what} must be between 1 and {MAX_IMAGE_SIDE} pixels, got {n}"
            ));
        }
        Ok(n)
    };
    Ok((side(w, "width")?, side(h, "height")?))
}

/// One image as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageShape {
    /// Positions the tower runs over (patches, plus class tokens), in all its passes.
    pub tower_tokens: u64,
    /// Sequences the tower runs the image as (Llama 4: one per tile; else 1).
    pub tower_passes: u64,
    /// Tokens the image adds to the language model's sequence, beyond the one placeholder
    /// the text already holds.
    pub added_tokens: u64,
    /// The processor's resized width and height.
    pub resized: (u64, u64),
}

impl ImageTokens {
    /// The resize, tower length and sequence tokens of one `width × height` image.
    #[must_use]
    pub fn shape(&self, width: u64, height: u64) -> ImageShape {
        match *self {
            Self::Fixed {
                image_size,
                patch_size,
                class_tokens,
                sequence_tokens,
            } => {
                let side = image_size / patch_size.max(1);
                ImageShape {
                    tower_tokens: side * side + class_tokens,
                    tower_passes: 1,
                    added_tokens: sequence_tokens.saturating_sub(1),
                    resized: (image_size, image_size),
                }
            }
            Self::Dynamic {
                patch_size,
                merge_size,
                min_pixels,
                max_pixels,
            } => {
                let factor = patch_size * merge_size;
                let (h, w) = smart_resize(height, width, factor, min_pixels, max_pixels);
                let patches = (h / patch_size) * (w / patch_size);
                ImageShape {
                    tower_tokens: patches,
                    tower_passes: 1,
                    added_tokens: (patches / (merge_size * merge_size)).saturating_sub(1),
                    resized: (w, h),
                }
            }
            Self::Pixtral {
                patch_size,
                merge_size,
                longest_edge,
            } => {
                let cell = (patch_size * merge_size).max(1);
                let (w, h) = pixtral_resize(width, height, longest_edge, cell);
                let (rows, cols) = (h / cell, w / cell);
                let p = patch_size.max(1);
                ImageShape {
                    tower_tokens: (h / p) * (w / p),
                    tower_passes: 1,
                    added_tokens: (rows * (cols + 1)).saturating_sub(1),
                    resized: (w, h),
                }
            }
            Self::Split {
                tile_size,
                patch_size,
                tokens_per_tile,
                longest_edge,
            } => {
                let (rows, cols) = split_tiles(width, height, tile_size, longest_edge);
                let tiles = rows * cols;
                let side = tile_size / patch_size.max(1);
                let passes = if tiles > 0 { tiles + 1 } else { 1 };
                // `_prompt_split_image`: per tile <fake_token_around_image>, <row_i_col_j>
                // and its tokens; "\n" after each row; then "\n", the global tile between
                // <fake_token_around_image><global-img> and <fake_token_around_image>. The
                // last row's "\n" and the global's are one "\n\n" token in the BPE
                // vocabularies these models use. A single tile is the global part alone.
                let split = if tiles > 0 {
                    tiles * (tokens_per_tile + 2) + rows
                } else {
                    0
                };
                ImageShape {
                    tower_tokens: passes * side * side,
                    tower_passes: passes,
                    added_tokens: split + tokens_per_tile + 3 - 1,
                    resized: if tiles > 0 {
                        (cols * tile_size, rows * tile_size)
                    } else {
                        (tile_size, tile_size)
                    },
                }
            }
            Self::CrossTiles {
                tile_size,
                patch_size,
                max_tiles,
            } => {
                let side = tile_size / patch_size.max(1);
                ImageShape {
                    tower_tokens: max_tiles * (side * side + 1).next_multiple_of(8),
                    tower_passes: 1,
                    added_tokens: 0,
                    resized: (tile_size, tile_size),
                }
            }
            Self::Tiled {
                tile_size,
                patch_size,
                downsample,
                max_tiles,
            } => {
                let (rows, cols) = best_fit_tiles(height, width, tile_size, max_tiles);
                let tiles = rows * cols;
                let passes = if tiles > 1 { tiles + 1 } else { 1 };
                let side = tile_size / patch_size.max(1);
                let per_tile = side * side / downsample.max(1);
                // `Llama4Processor._prompt_split_image`: <|image_start|>, each tile's patches
                // with a <|tile_x_separator|> between tiles of a row and a
                // <|tile_y_separator|> after each row, then <|image|>, the global tile's
                // patches and <|image_end|>; the text's <|image|> placeholder is replaced.
                let split = if tiles > 1 {
                    tiles * per_tile + rows * (cols - 1) + rows
                } else {
                    0
                };
                ImageShape {
                    tower_tokens: passes * (side * side + 1),
                    tower_passes: passes,
                    added_tokens: split + per_tile + 2,
                    resized: (cols * tile_size, rows * tile_size),
                }
            }
        }
    }
}

/// transformers 5.25 `models/pixtral/image_processing_pil_pixtral.py`
/// `get_resize_output_image_size`: an image larger than `longest` on a side is scaled by
/// `max(h, w) / longest` (floored, in IEEE doubles as Python), then each side is rounded up to
/// whole `cell`s (`_num_image_tokens`). `(width, height)`.
#[must_use]
pub fn pixtral_resize(width: u64, height: u64, longest: u64, cell: u64) -> (u64, u64) {
    #[allow(clippy::cast_precision_loss)]
    let f = |x: u64| x as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let floor = |x: f64| x.floor().max(0.0) as u64;
    let (mut w, mut h) = (width.max(1), height.max(1));
    let ratio = (f(h) / f(longest.max(1))).max(f(w) / f(longest.max(1)));
    if ratio > 1.0 {
        h = floor(f(h) / ratio);
        w = floor(f(w) / ratio);
    }
    let cell = cell.max(1);
    (
        w.max(1).div_ceil(cell) * cell,
        h.max(1).div_ceil(cell) * cell,
    )
}

/// transformers 5.25 `models/idefics3/image_processing_pil_idefics3.py`: the resize to a
/// longest edge of `longest_edge` (`_resize_output_size_rescale_to_max_len`, the other side
/// rounded up to even, then `_resize_output_size_scale_below_upper_bound` at 4,096), then
/// `resize_for_vision_encoder` to multiples of `tile`, then `split_images`: `(rows, cols)`
/// of tiles, `(0, 0)` when the image fits one tile. In the same IEEE doubles as Python.
#[must_use]
pub fn split_tiles(width: u64, height: u64, tile: u64, longest_edge: u64) -> (u64, u64) {
    #[allow(clippy::cast_precision_loss)]
    let f = |x: u64| x as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let int = |x: f64| x.max(0.0) as u64;
    let (mut w, mut h) = (width.max(1), height.max(1));
    // Rescale to the longest edge (up or down), the other side even.
    let aspect = f(w) / f(h);
    if w >= h {
        w = longest_edge;
        h = int(f(w) / aspect);
        h += h % 2;
    } else {
        h = longest_edge;
        w = int(f(h) * aspect);
        w += w % 2;
    }
    let (mut w, mut h) = (w.max(1), h.max(1));
    // Below the absolute maximum.
    let cap = 4096;
    let aspect = f(w) / f(h);
    if w >= h && w > cap {
        w = cap;
        h = int(f(w) / aspect).max(1);
    } else if h > w && h > cap {
        h = cap;
        w = int(f(h) * aspect).max(1);
    }
    // Up to multiples of the tile.
    let t = tile.max(1);
    let aspect = f(w) / f(h);
    let (w, h) = if w >= h {
        let w2 = w.div_ceil(t) * t;
        (w2, int(f(w2) / aspect).div_ceil(t) * t)
    } else {
        let h2 = h.div_ceil(t) * t;
        (int(f(h2) * aspect).div_ceil(t) * t, h2)
    };
    if h > t || w > t {
        ((h - t) / t + 1, (w - t) / t + 1)
    } else {
        (0, 0)
    }
}

/// transformers 5.25 `models/llama4/image_processing_llama4.py` `get_best_fit` over
/// `find_supported_resolutions(max_tiles, tile)`: the canvas of `rows × cols` tiles (at most
/// `max_tiles`) that upscales a `height × width` image the least without distortion, or,
/// when none can, downscales it the least; among equal scales, the smallest canvas.
/// `(rows, cols)`.
#[must_use]
pub fn best_fit_tiles(height: u64, width: u64, tile: u64, max_tiles: u64) -> (u64, u64) {
    let mut canvases = Vec::new();
    for n in (1..=max_tiles.max(1)).rev() {
        for rows in (1..=n).filter(|r| n.is_multiple_of(*r)) {
            canvases.push((rows, n / rows));
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let scale = |(rows, cols): (u64, u64)| -> f64 {
        let (h, w) = ((rows * tile) as f64, (cols * tile) as f64);
        let (sh, sw) = (h / height.max(1) as f64, w / width.max(1) as f64);
        if sh > sw { sw } else { sh }
    };
    let up = canvases
        .iter()
        .map(|&c| scale(c))
        .filter(|s| *s >= 1.0)
        .fold(f64::INFINITY, f64::min);
    let chosen = if up.is_finite() {
        up
    } else {
        canvases.iter().map(|&c| scale(c)).fold(0.0, f64::max)
    };
    #[allow(clippy::float_cmp)]
    canvases
        .into_iter()
        .filter(|&c| scale(c) == chosen)
        .min_by_key(|&(rows, cols)| rows * cols)
        .unwrap_or((1, 1))
}

/// transformers 5.24 `models/qwen2_vl/image_processing_qwen2_vl.py` `smart_resize`, in the
/// same IEEE doubles (Python's `round` ties to even): `(height, width)`.
#[must_use]
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> (u64, u64) {
    #[allow(clippy::cast_precision_loss)]
    let (hf, wf, ff) = (height as f64, width as f64, factor as f64);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let to_u = |x: f64| x.max(0.0) as u64;
    let mut h_bar = to_u((hf / ff).round_ties_even()) * factor;
    let mut w_bar = to_u((wf / ff).round_ties_even()) * factor;
    if h_bar * w_bar > max_pixels {
        #[allow(clippy::cast_precision_loss)]
        let beta = (hf * wf / max_pixels as f64).sqrt();
        h_bar = factor.max(to_u((hf / beta / ff).floor()) * factor);
        w_bar = factor.max(to_u((wf / beta / ff).floor()) * factor);
    } else if h_bar * w_bar < min_pixels {
        #[allow(clippy::cast_precision_loss)]
        let beta = (min_pixels as f64 / (hf * wf)).sqrt();
        h_bar = to_u((hf * beta / ff).ceil()) * factor;
        w_bar = to_u((wf * beta / ff).ceil()) * factor;
    }
    (h_bar, w_bar)
}

impl VisionSpec {
    /// Parameters of the tower (blocks and embeddings).
    #[must_use]
    pub fn tower_params(&self) -> u64 {
        self.layers
            .iter()
            .map(|g| g.count * g.layer_params())
            .sum::<u64>()
            + self.embedding_params
    }

    /// Parameters of the projector.
    #[must_use]
    pub fn projector_params(&self) -> u64 {
        self.projector.iter().map(Linear::params).sum::<u64>()
            + self.projector_other_params
            + self.idle_params
    }

    /// Tower and projector parameters.
    #[must_use]
    pub fn params(&self) -> u64 {
        self.tower_params() + self.projector_params()
    }

    /// The image size a job gets when it names none: the processor's own square for fixed
    /// resizes, 1024 × 1024 for dynamic resolution (about 1,300 tokens on Qwen-VL).
    #[must_use]
    pub const fn default_image_size(&self) -> (u64, u64) {
        match self.tokens {
            ImageTokens::Fixed { image_size, .. } => (image_size, image_size),
            ImageTokens::Dynamic { .. } | ImageTokens::Pixtral { .. } => (1024, 1024),
            ImageTokens::Tiled { tile_size, .. }
            | ImageTokens::Split { tile_size, .. }
            | ImageTokens::CrossTiles { tile_size, .. } => (tile_size, tile_size),
        }
    }

    /// Vision states one image gives each cross-attention layer of the language model
    /// ([`ImageTokens::CrossTiles`]: every tile's patches and class token, the tower's
    /// padding dropped), 0 for models that put image tokens into the sequence.
    #[must_use]
    pub const fn cross_states_per_image(&self) -> u64 {
        match self.tokens {
            ImageTokens::CrossTiles {
                tile_size,
                patch_size,
                max_tiles,
            } => {
                let side = tile_size / if patch_size == 0 { 1 } else { patch_size };
                max_tiles * (side * side + 1)
            }
            _ => 0,
        }
    }

    /// Values of one `pixel_values` row of a dynamic-resolution tower: channels ×
    /// `temporal_patch_size` × patch² (Qwen-VL: 3 · 2 · 14² = 1,176); 0 for fixed resizes.
    #[must_use]
    pub const fn patch_pixels(&self) -> u64 {
        match self.tokens {
            ImageTokens::Dynamic { patch_size, .. } => 3 * 2 * patch_size * patch_size,
            ImageTokens::Fixed { .. }
            | ImageTokens::Tiled { .. }
            | ImageTokens::Split { .. }
            | ImageTokens::Pixtral { .. }
            | ImageTokens::CrossTiles { .. } => 0,
        }
    }

    /// The images a job gets when it says none: one per sample at
    /// [`Self::default_image_size`].
    #[must_use]
    pub const fn default_images(&self) -> Images {
        let (width, height) = self.default_image_size();
        Images {
            per_sample: 1,
            width,
            height,
            pan_and_scan: false,
        }
    }

    /// Tokens `images` add to one sample's sequence.
    #[must_use]
    pub fn added_tokens(&self, images: &Images) -> u64 {
        if images.per_sample == 0 {
            return 0;
        }
        let added = self.tokens.shape(images.width, images.height).added_tokens;
        let crops = self.crops(images);
        let per_image = if crops > 0 {
            // The image and each crop as a whole image sequence, and the text around them.
            (1 + crops) * (added + 1) - 1 + PAN_AND_SCAN_TEXT_TOKENS + crops
        } else {
            added
        };
        images.per_sample * per_image
    }

    /// Pan-and-scan crops of each of `images` (0 without pan-and-scan).
    #[must_use]
    pub fn crops(&self, images: &Images) -> u64 {
        match (&self.pan_and_scan, images.pan_and_scan) {
            (Some(p), true) => p.crops(images.width, images.height),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixtral's image processor (transformers 5.25 `PixtralImageProcessorPil` with Mistral
    /// Small 3.1's `longest_edge` 1540 and the processor's 28-px cells, run on black RGB
    /// images): the resized size, and the tokens of its rows of `[IMG]`s and breaks.
    #[test]
    fn pixtral_images_follow_its_processor() {
        let mistral = ImageTokens::Pixtral {
            patch_size: 14,
            merge_size: 2,
            longest_edge: 1540,
        };
        for ((w, h), resized, tokens) in [
            ((1540, 1540), (1540, 1540), 3080),
            ((1024, 768), (1036, 784), 1064),
            ((1920, 1080), (1540, 868), 1736),
            ((300, 2000), (252, 1540), 550),
            ((100, 100), (112, 112), 20),
            ((640, 480), (644, 504), 432),
            ((4000, 1000), (1540, 392), 784),
        ] {
            let shape = mistral.shape(w, h);
            assert_eq!(shape.resized, resized, "{w}x{h}");
            assert_eq!(shape.added_tokens, tokens - 1, "{w}x{h}");
            assert_eq!(shape.tower_tokens, (resized.0 / 14) * (resized.1 / 14));
        }
    }

    /// Idefics3's image processor (transformers 5.25 `Idefics3ImageProcessorPil`, run on
    /// black RGB images with the released settings: tiles of 512, 364 and 384 px, a longest
    /// edge of four tiles): the rows and columns of tiles it returns. Small images are
    /// upscaled to the longest edge too.
    #[test]
    fn split_images_follow_idefics3s_processor() {
        for (tile, cases) in [
            (
                512,
                [(4, 4), (3, 4), (3, 4), (4, 1), (4, 4), (3, 4), (1, 4)],
            ),
            (
                364,
                [(4, 4), (3, 4), (3, 4), (4, 1), (4, 4), (3, 4), (1, 4)],
            ),
            (
                384,
                [(4, 4), (3, 4), (3, 4), (4, 1), (4, 4), (3, 4), (1, 4)],
            ),
        ] {
            let sizes = [
                (512, 512),
                (1024, 768),
                (1920, 1080),
                (300, 2000),
                (100, 100),
                (640, 480),
                (4000, 1000),
            ];
            for ((w, h), want) in sizes.into_iter().zip(cases) {
                assert_eq!(split_tiles(w, h, tile, 4 * tile), want, "{w}x{h} at {tile}");
            }
        }
        // SmolVLM-256M: 64 tokens a tile; 3 × 4 tiles and the global one, each tile with its
        // two markers, a newline a row, the global image's three markers.
        let smolvlm = ImageTokens::Split {
            tile_size: 512,
            patch_size: 16,
            tokens_per_tile: 64,
            longest_edge: 2048,
        };
        let shape = smolvlm.shape(1024, 768);
        assert_eq!(shape.added_tokens, 12 * (64 + 2) + 3 + 64 + 3 - 1);
        assert_eq!(shape.tower_passes, 13);
        assert_eq!(shape.tower_tokens, 13 * 32 * 32);
    }

    /// Llama 4's processor, run as transformers 5.25 defines it (`get_best_fit` over
    /// `find_supported_resolutions(16, 336)`, then `Llama4Processor._prompt_split_image`
    /// with 144 patches a tile, each `<|…|>` one token): the canvas in tiles and the tokens
    /// one image adds beyond its `<|image|>` placeholder.
    #[test]
    fn tiled_images_follow_llama4s_processor() {
        let scout = ImageTokens::Tiled {
            tile_size: 336,
            patch_size: 14,
            downsample: 4,
            max_tiles: 16,
        };
        for ((w, h), (rows, cols), added) in [
            ((336, 336), (1, 1), 146),
            ((1024, 768), (3, 4), 1886),
            ((1920, 1080), (3, 5), 2321),
            ((200, 3000), (9, 1), 1451),
            ((4000, 4000), (4, 4), 2466),
            ((640, 480), (2, 2), 726),
            ((100, 100), (1, 1), 146),
            ((5000, 300), (1, 15), 2321),
        ] {
            assert_eq!(best_fit_tiles(h, w, 336, 16), (rows, cols), "{w}x{h}");
            let shape = scout.shape(w, h);
            assert_eq!(shape.added_tokens, added, "{w}x{h}");
            assert_eq!(shape.resized, (cols * 336, rows * 336), "{w}x{h}");
            // Every tile and, when split, the global one: 577 positions each.
            let passes = if rows * cols > 1 { rows * cols + 1 } else { 1 };
            assert_eq!(shape.tower_passes, passes);
            assert_eq!(shape.tower_tokens, passes * 577);
        }
    }

    #[test]
    fn smart_resize_by_hand() {
        // 1024 / 28 = 36.57 → 37 · 28 = 1036 on both sides; 1036² < 12,845,056.
        assert_eq!(smart_resize(1024, 1024, 28, 3136, 12_845_056), (1036, 1036));
        // 4000 × 3000 = 12 M px: rounded 2996 × 4004 = 12.0 M > 1,003,520, so beta =
        // sqrt(12e6 / 1,003,520) = 3.458; 3000 / 3.458 / 28 = 30.98 → 30 · 28 = 840,
        // 4000 / 3.458 / 28 = 41.31 → 41 · 28 = 1148.
        assert_eq!(smart_resize(3000, 4000, 28, 3136, 1_003_520), (840, 1148));
        // 20 × 20 < 3136: beta = sqrt(3136 / 400) = 2.8; 20 · 2.8 / 28 = 2 → 56.
        assert_eq!(smart_resize(20, 20, 28, 3136, 12_845_056), (56, 56));
    }

    #[test]
    fn image_sizes_read_one_way() {
        assert_eq!(parse_image_size("1280x720"), Ok((1280, 720)));
        assert_eq!(parse_image_size(" 896×896 "), Ok((896, 896)));
        assert!(
            parse_image_size("1280")
                .unwrap_err()
                .contains("WIDTHxHEIGHT")
        );
        assert!(parse_image_size("0x720").unwrap_err().contains("width"));
        assert!(parse_image_size("12x-3").unwrap_err().contains("height"));
    }

    #[test]
    fn fixed_images_add_their_sequence() {
        let gemma = ImageTokens::Fixed {
            image_size: 896,
            patch_size: 14,
            class_tokens: 0,
            sequence_tokens: 260,
        };
        let s = gemma.shape(1920, 1080);
        assert_eq!(
            (s.tower_tokens, s.added_tokens, s.resized),
            (4096, 259, (896, 896))
        );
    }
}
