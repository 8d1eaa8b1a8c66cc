//! A vision-language model's image side of a step: the tokens images add to the language
//! model's sequence, and what the vision tower holds while it runs.
//!
//! The tower runs first (transformers 5.24 `get_image_features`, then `masked_scatter` of
//! the features into `inputs_embeds`). Frozen, with `pixel_values` that need no gradient,
//! autograd records none of it: only its forward working set exists, before the language
//! model's activations. When it trains (its weights, or adapters in it) its saved tensors
//! stay alive through the language model's backward, until the tower's own backward at the
//! end; under gradient checkpointing its blocks checkpoint too (they are
//! `GradientCheckpointingLayer`s). The tower's layers are a pre-norm transformer, so their
//! saved bytes come from the same op-by-op rules as a decoder layer's
//! ([`super::activations`]), over the tower's patches.

use std::borrow::Cow;

use super::Regime;
use super::activations::Activations;
use crate::job::{Job, Method, Padding, VisionTraining};
use crate::model::{LayerGroup, Linear, LinearRole, ModelSpec};
use crate::vision::{ImageTokens, VisionSpec};

/// The job the language model runs: the images' tokens added to every sequence, and, where
/// images make transformers build a 4-D attention mask ([`VisionSpec::image_attention_mask`]),
/// the attention of a masked batch.
#[must_use]
pub fn with_image_tokens<'a>(model: &ModelSpec, job: &'a Job) -> Cow<'a, Job> {
    match &model.vision {
        Some(v) if job.images.per_sample > 0 => Cow::Owned(Job {
            seq_len: job.seq_len + v.added_tokens(&job.images),
            padding: if v.image_attention_mask
                && job.padding == Padding::Packed
                && job.stack.profile().transformers_modules
            {
                Padding::Padded
            } else {
                job.padding
            },
            ..job.clone()
        }),
        _ => Cow::Borrowed(job),
    }
}

/// What the tower adds to a step, for one GPU's micro-batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VisionStep {
    /// The tower's forward working set when autograd records none of it.
    pub forward_transient: u64,
    /// Tensors the tower and projector save for backward (checkpoints only under gradient
    /// checkpointing), alive from the forward to the tower's backward.
    pub saved: u64,
    /// One tower block's saved tensors, recomputed at its backward under checkpointing.
    pub one_layer: u64,
    /// One tower block's backward transients.
    pub backward_transient: u64,
    /// The batch's `pixel_values`, alive for the whole step.
    pub pixels: u64,
}

/// Whether anything in the tower needs a gradient.
#[must_use]
pub fn tower_trains(model: &ModelSpec, job: &Job) -> bool {
    match job.vision {
        VisionTraining::Frozen => false,
        VisionTraining::Trained => job.method == Method::Full,
        VisionTraining::Adapted => model
            .linears()
            .any(|(_, l)| l.role == LinearRole::Vision && job.adapts(l)),
    }
}

/// Whether autograd records the tower's forward: when something in it trains, and also
/// when a frozen tower's output is made to require grad. transformers 5's
/// `gradient_checkpointing_enable` calls `enable_input_require_grads` for every model whose
/// `main_input_name` is `input_ids` (PEFT or not), which hooks the input embeddings of every
/// `PreTrainedModel` inside (transformers 5.24 `modeling_utils.py`), the vision tower's patch
/// embedding among them (`SiglipVisionModel.get_input_embeddings`: `patch_embedding`): the
/// frozen tower's blocks then checkpoint and run their backward.
#[must_use]
pub fn tower_recorded(model: &ModelSpec, job: &Job) -> bool {
    tower_trains(model, job)
        || (job.gradient_checkpointing
            && job.stack.profile().transformers_modules
            && job.versions.transformers.is_none_or(|t| t >= (5, 0)))
}

/// The tower's share of `job`'s training step (`job` as given, before
/// [`with_image_tokens`]).
#[must_use]
pub fn step(model: &ModelSpec, job: &Job, r: &Regime) -> VisionStep {
    let Some(v) = &model.vision else {
        return VisionStep::default();
    };
    // Pan-and-scan's crops go through the tower as images of their own.
    let images = job.micro_batch_size * job.images.per_sample * (1 + v.crops(&job.images));
    if images == 0 {
        return VisionStep::default();
    }
    let shape = v.tokens.shape(job.images.width, job.images.height);
    let patches = shape.tower_tokens;
    let tokens = images * patches;
    // The tower's sequences: one per image, or one per tile (Llama 4).
    let passes = images * shape.tower_passes.max(1);
    let per_pass = patches / shape.tower_passes.max(1);
    let b = r.compute_bytes;
    let h = v.hidden_size;
    // One block at a time, the wider of its attention's and its MLP's working sets (the
    // MLP's intermediate two for a gated one); eager attention's fp32 scores and their
    // probabilities per image. [DERIVED]
    let mlp = if v.gated_mlp { 3 } else { 2 } * v.intermediate_size;
    let eager = if job.attention == crate::job::Attention::Eager {
        passes * v.num_heads * per_pass * per_pass * (4 + b)
    } else {
        0
    };
    // A rotary tower (Qwen-VL) is widest at its RoPE: q and k cast to fp32, their products
    // with cos and sin, `rotate_half`'s `cat` and the sum (six fp32 h-wide tensors), beside
    // the fused qkv output and two copies of the stream (traced, `vlm-prefill.jsonl`).
    let rope = if v.rotary { b * 5 * h + 24 * h } else { 0 };
    // A block's widest moment: its attention's (the stream, the normed input, q, k, v and the
    // output) or its MLP's (the stream, the normed input and the intermediate).
    let block = b * (6 * h).max(2 * h + mlp);
    let forward_transient = tokens * block.max(rope) + eager;
    // The processor's `pixel_values`, fp32, held by the batch for the whole step: Qwen-VL's
    // `temporal_patch_size` copies of every patch, the others one resized image each.
    let pixels = images
        * match v.tokens {
            ImageTokens::Dynamic { .. } => patches * v.patch_pixels(),
            ImageTokens::Pixtral { .. } => 3 * shape.resized.0 * shape.resized.1,
            ImageTokens::Fixed { image_size, .. } => 3 * image_size * image_size,
            ImageTokens::Tiled { tile_size, .. } | ImageTokens::Split { tile_size, .. } => {
                3 * tile_size * tile_size * shape.tower_passes
            }
            ImageTokens::CrossTiles {
                tile_size,
                max_tiles,
                ..
            } => 3 * tile_size * tile_size * max_tiles,
        }
        * 4;
    // Mllama's tower (`MllamaVisionModel.forward`) keeps every block's output in
    // `encoder_states` until it returns, then stacks the chosen ones (`torch.stack`), copies
    // them out of their padding and concatenates them with the last (`torch.cat`): its widest
    // moment is a late block's working set or that end, beside every kept output. Its
    // attention mask, `(1 - aspect_ratio_mask)` over every pair of positions, is one `T²`
    // tensor an image, read by every block.
    let forward_transient = if v.blocks_checkpoint {
        forward_transient
    } else {
        let layers: u64 = v.layers.iter().map(|g| g.count).sum();
        // The chosen layers' outputs: the projector reads the last one and them.
        let chosen = v
            .projector
            .first()
            .map_or(0, |l| (l.in_features / h.max(1)).saturating_sub(1));
        let end = (3 * chosen + 1) * tokens * h * b;
        tokens * h * b * layers + images * per_pass * per_pass * b + forward_transient.max(end)
    };
    // Mllama's language model: the projected vision states its cross-attention layers read
    // (kept by the layers' checkpoints, or saved by trainable k and v projections), and the
    // cross-attention mask `(b, 1, S, V)` every such layer's SDPA saves.
    let cross_states = v.cross_states_per_image() * images;
    let cross = if cross_states > 0 {
        let kept = job.gradient_checkpointing || job.method == Method::Full;
        let states = if kept {
            cross_states * model.hidden_size * b
        } else {
            0
        };
        states + job.seq_len * cross_states * b
    } else {
        0
    };
    if !tower_recorded(model, job) {
        return VisionStep {
            forward_transient,
            pixels,
            saved: cross,
            ..VisionStep::default()
        };
    }
    let tower = tower_model(v);
    let mut tower_job = Job {
        micro_batch_size: passes,
        seq_len: per_pass,
        padding: Padding::Packed,
        ..job.clone()
    };
    if !tower_trains(model, job) {
        // Recorded but frozen: no adapter in it, and no weight that needs its input (a full
        // fine-tune of the language model leaves the tower's weights frozen).
        tower_job.adapter.targets = crate::job::Targets::Names(Vec::new());
        if tower_job.method == Method::Full {
            tower_job.method = Method::Adapters;
        }
    }
    if !v.blocks_checkpoint {
        // Plain `nn.Module` blocks: every one saved whole.
        tower_job.gradient_checkpointing = false;
    }
    let acts = Activations::new(&tower, &tower_job, r, 1);
    // Mllama, recorded: the patch embedding's output, the two position embeddings' sums, the
    // padded copy (saved by `layernorm_pre`), the last local block's output (saved by
    // `layernorm_post`), and the attention mask every block's SDPA saves.
    let unsaved_blocks = if v.blocks_checkpoint {
        0
    } else {
        5 * tokens * h * b + images * per_pass * per_pass * b
    };
    let projector = if cross_states > 0 {
        // One frozen Linear saves nothing; a trained one its input.
        if tower_trains(model, job) {
            cross_states * v.projector.iter().map(|l| l.in_features).sum::<u64>() * b
        } else {
            0
        }
    } else {
        projector_saved(v, images, tokens, b)
    };
    VisionStep {
        forward_transient,
        pixels,
        saved: acts.all_layers() + projector + unsaved_blocks + cross,
        one_layer: acts.one_layer,
        backward_transient: acts.layer_backward_transient,
    }
}

/// What the projector saves for backward when it sits between trained parts: a leading
/// norm's fp32 input (Qwen-VL's `ln_q`, Gemma 3's `mm_soft_emb_norm`: the projector's
/// non-Linear parameters), each Linear's input, and the activation's input between the two
/// Linears (the first one's output). The Linears read `patches · h / in` rows: every patch
/// (LLaVA), or merged patches (Qwen-VL's merger, `in` = merge² · h). Gemma 3's projector has
/// no Linear: its 4 × 4 average pool saves every patch, then the norm and the bare projection
/// weight read the pooled tokens. [DERIVED]
fn projector_saved(v: &VisionSpec, images: u64, patches: u64, b: u64) -> u64 {
    let h = v.hidden_size;
    let norm = |rows: u64| {
        if v.projector_other_params > 0 {
            4 * rows * h
        } else {
            0
        }
    };
    match (v.projector.first(), v.tokens) {
        (Some(first), _) => {
            let rows = patches * h / first.in_features.max(1);
            let inputs: u64 = v.projector.iter().map(|l| l.in_features).sum();
            norm(patches) + rows * b * (inputs + first.out_features)
        }
        (
            None,
            ImageTokens::Fixed {
                sequence_tokens, ..
            },
        ) => {
            // The soft tokens: the full image sequence less its four boundary tokens.
            let pooled = images * sequence_tokens.saturating_sub(4);
            patches * h * b + norm(pooled) + pooled * h * b
        }
        (
            None,
            ImageTokens::Dynamic { .. }
            | ImageTokens::Tiled { .. }
            | ImageTokens::Split { .. }
            | ImageTokens::Pixtral { .. }
            | ImageTokens::CrossTiles { .. },
        ) => norm(patches),
    }
}

/// The tower as a decoder-shaped [`ModelSpec`] whose layers the activation rules walk: its
/// Linears take attention and MLP roles by name.
fn tower_model(v: &VisionSpec) -> ModelSpec {
    let layers = v
        .layers
        .iter()
        .map(|g| LayerGroup {
            linears: g.linears.iter().map(reroled).collect(),
            ..g.clone()
        })
        .collect::<Vec<_>>();
    let num_layers = layers.iter().map(|g| g.count).sum();
    ModelSpec {
        model_type: v.model_type.clone(),
        hidden_size: v.hidden_size,
        intermediate_size: v.intermediate_size,
        num_layers,
        num_heads: v.num_heads,
        num_kv_heads: v.num_heads,
        head_dim: v.hidden_size / v.num_heads.max(1),
        vocab_size: 0,
        tie_word_embeddings: true,
        position_embeddings: 0,
        max_position_embeddings: 0,
        norm: v.norm,
        gated_mlp: v.gated_mlp,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        moe: None,
        mla: None,
        layers,
        final_norm_params: 0,
        load_dtype: crate::model::Dtype::Bf16,
        encoder: None,
        logit_softcapping: false,
        attn_softcapping: false,
        rope_by_concat: false,
        qk_norm: false,
        attention_sinks: false,
        experts_see_every_token: false,
        fp32_norms: false,
        mxfp4_experts: false,
        expert_gate: None,
        seq2seq: None,
        vision: None,
        prequantized: None,
        ssm: None,
        gated_delta_net: None,
        attention_output_gate: false,
        gemma3n: None,
    }
}

fn reroled(l: &Linear) -> Linear {
    let role = match l.name.as_str() {
        "fc1" | "fc2" | "linear_fc1" | "linear_fc2" | "gate_proj" | "up_proj" | "down_proj" => {
            LinearRole::Mlp
        }
        _ => LinearRole::Attention,
    };
    Linear { role, ..l.clone() }
}
