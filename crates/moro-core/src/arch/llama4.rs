//! `llama4_text` and the language model of `llama4`: Meta's Llama 4 (transformers 5.25
//! `models/llama4/modeling_llama4.py`, `configuration_llama4.py`).
//!
//! - Attention: `q_proj`/`k_proj`/`v_proj`/`o_proj` (`attention_bias`, default false);
//!   RoPE layers normalize q and k with a weightless RMSNorm (`use_qk_norm`); every
//!   `no_rope_layer_interval`-th layer (4) has no RoPE and scales its queries instead. Those
//!   layers attend to the whole context; the others to chunks of `attention_chunk_size`
//!   (8,192) tokens (`layer_types`), and their KV cache keeps one chunk, as a sliding
//!   window's does (transformers `get_layer_types_and_kwargs`: a `chunked_attention` layer
//!   is a `DynamicSlidingWindowLayer` of `attention_chunk_size`).
//! - The MoE layers (`moe_layers`, else every `interleave_moe_layer_step`-th: 1 for Scout,
//!   2 for Maverick) hold a router `nn.Linear` H→E, the experts as two stacked parameters
//!   (`Llama4TextExperts`: `gate_up_proj` E × H × 2I and `down_proj` E × I × H, never
//!   `nn.Linear`), and a shared expert (`shared_expert.gate_proj`/`up_proj`/`down_proj`,
//!   H → I). `Llama4TextMoe.forward` runs every expert on every token, scaled by its
//!   sigmoid router score (zero outside the token's top-k): `hidden_states.repeat(E, 1)`,
//!   then one `bmm` per stack ([`ModelSpec::experts_see_every_token`]). The other layers
//!   are a gated MLP of `intermediate_size_mlp`.
//! - RMSNorm `input_layernorm`, `post_attention_layernorm` and the final `norm`.
//!
//! `Llama4TextConfig` defaults (Llama-4-Scout-17B-16E): 48 layers, hidden 5,120, expert and
//! shared width 8,192, dense width 16,384, 40 query and 8 KV heads of 128, 16 experts, top-1,
//! vocabulary 202,048, context 131,072, untied lm_head.

use serde_json::Map;

use super::ArchError;
use super::cfg::{Cfg, MAX_EXPERTS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{
    AttentionKind, Dtype, Linear, LinearRole, ModelSpec, MoeSpec, NormKind, WeightLayout,
};

/// Parses a `llama4_text` config, or a `llama4` one: its `text_config` and its vision
/// tower ([`super::vision::llama4`]).
pub(crate) fn parse(top: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    if model_type != "llama4" {
        return text_model(top);
    }
    let empty = Map::new();
    let text = top.opt_object("text_config")?.unwrap_or(&empty);
    let mut spec = text_model(&Cfg::nested(text, "text_config"))?;
    spec.vision = Some(super::vision::llama4(top, spec.hidden_size)?);
    spec.model_type = "llama4".to_owned();
    Ok(spec)
}

fn text_model(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_or("hidden_size", 5120, MAX_HIDDEN)?;
    let expert_i = c.dim_or("intermediate_size", 8192, MAX_INTERMEDIATE)?;
    let dense_i = c.dim_or("intermediate_size_mlp", 16_384, MAX_INTERMEDIATE)?;
    let layers = c.dim_or("num_hidden_layers", 48, MAX_LAYERS)?;
    let vocab = c.dim_or("vocab_size", 202_048, MAX_VOCAB)?;
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        Some(8),
        Some(128),
    )?;
    let bias = c.bool_or("attention_bias", false)?;
    let experts = c.dim_or("num_local_experts", 16, MAX_EXPERTS)?;
    let top_k = c.dim_or("num_experts_per_tok", 1, MAX_EXPERTS)?;
    common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
    let step = c.dim_or("interleave_moe_layer_step", 1, MAX_LAYERS)?;
    let listed = c.uint_list("moe_layers")?;
    let sparse = |i: u64| {
        if c.has("moe_layers") {
            listed.contains(&i)
        } else {
            (i + 1).is_multiple_of(step)
        }
    };

    let stacked = |name: &str, i: u64, o: u64| Linear {
        count: experts,
        active: top_k,
        layout: WeightLayout::Stacked,
        ..Linear::new(name, i, o, false, LinearRole::Expert)
    };
    let mut moe_linears = vec![Linear::new(
        "router",
        hidden,
        experts,
        false,
        LinearRole::Router,
    )];
    moe_linears.push(stacked("gate_up_proj", hidden, 2 * expert_i));
    moe_linears.push(stacked("down_proj", expert_i, hidden));
    moe_linears.extend(common::gated_mlp(
        hidden,
        expert_i,
        false,
        LinearRole::SharedExpert,
    ));
    let first_dense = (0..layers).take_while(|&i| !sparse(i)).count();
    let moe = MoeSpec {
        num_experts: experts,
        experts_per_token: top_k,
        num_shared_experts: 1,
        expert_intermediate_size: expert_i,
        shared_intermediate_size: expert_i,
        first_dense_layers: u64::try_from(first_dense).unwrap_or(0),
    };

    let mut spec = common::build(Plan {
        model_type: "llama4_text".to_owned(),
        hidden,
        intermediate: dense_i,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 131_072)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, bias, bias),
        // input_layernorm + post_attention_layernorm; the q/k norm has no weight.
        layer_other: 2 * hidden,
        dense_mlp: common::gated_mlp(hidden, dense_i, false, LinearRole::Mlp),
        moe: Some((moe, moe_linears, 0)),
        kinds: attention_kinds(c, layers)?
            .into_iter()
            .zip(0..)
            .map(|(a, i)| (a, sparse(i)))
            .collect(),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;
    spec.qk_norm = c.bool_or("use_qk_norm", true)?;
    spec.experts_see_every_token = true;
    Ok(spec)
}

/// Each layer's attention: `layer_types` when given, else chunked on the RoPE layers
/// (`no_rope_layers[i]` set, by default every layer but each `no_rope_layer_interval`-th)
/// when `attention_chunk_size` is set (`Llama4TextConfig.__post_init__`).
fn attention_kinds(c: &Cfg<'_>, layers: u64) -> Result<Vec<AttentionKind>, ArchError> {
    let chunk = if c.has_key("attention_chunk_size") {
        c.opt_dim("attention_chunk_size", super::cfg::MAX_POSITIONS)?
    } else {
        Some(8192)
    };
    let chunked = |window: Option<u64>| match window {
        Some(window) => Ok(AttentionKind::Sliding { window }),
        None => Err(c.err(
            "layer_types",
            "names chunked_attention but attention_chunk_size is null",
        )),
    };
    if let Some(types) = c.opt_str_list("layer_types")? {
        if types.len() as u64 != layers {
            return Err(c.err(
                "layer_types",
                format!("has {} entries for {layers} layers", types.len()),
            ));
        }
        return types
            .iter()
            .map(|t| match *t {
                "full_attention" => Ok(AttentionKind::Full),
                "chunked_attention" => chunked(chunk),
                other => Err(c.err(
                    "layer_types",
                    format!("`{other}` is not full_attention or chunked_attention"),
                )),
            })
            .collect();
    }
    let interval = c.dim_or("no_rope_layer_interval", 4, MAX_LAYERS)?;
    let listed = c.uint_list("no_rope_layers")?;
    (0..layers)
        .map(|i| {
            let rope = if listed.is_empty() {
                !(i + 1).is_multiple_of(interval)
            } else {
                listed.get(usize::try_from(i).unwrap_or(usize::MAX)) == Some(&1)
            };
            match (rope, chunk) {
                (true, Some(window)) => Ok(AttentionKind::Sliding { window }),
                _ => Ok(AttentionKind::Full),
            }
        })
        .collect()
}
