//! `qwen3_next`: Qwen3-Next's hybrid decoder (transformers 5.25
//! `models/qwen3_next/modeling_qwen3_next.py`, `configuration_qwen3_next.py`).
//!
//! - `layer_types` names each layer `"linear_attention"` or `"full_attention"` (absent: every
//!   fourth layer full, `Qwen3NextConfig`).
//! - A linear-attention layer (`Qwen3NextGatedDeltaNet`): `in_proj_qkvz` `H → 2·K + 2·V` and
//!   `in_proj_ba` `H → 2·value heads`, a depthwise `conv1d` over `2·K + V` channels without
//!   bias, `dt_bias` and `A_log` per value head, the gated norm's weight (one value head),
//!   `out_proj` `V → H`; K = key heads × key width, V = value heads × value width.
//! - A full-attention layer (`Qwen3NextAttention`): `q_proj` twice as wide as the queries
//!   (the output gate beside them), `k_proj`, `v_proj`, `o_proj` with `attention_bias`, and
//!   `q_norm` / `k_norm` over a head.
//! - Every layer: `input_layernorm` and `post_attention_layernorm` (zero-centred RMSNorm,
//!   `output * (1 + weight.float())`), and a MoE block where layer i ∉ `mlp_only_layers` and
//!   (i + 1) % `decoder_sparse_step` = 0 with `num_experts` > 0 (router weight, stacked
//!   experts, a `shared_expert` and its `shared_expert_gate` H → 1), else a dense gated MLP.
//!
//! `Qwen3NextConfig` defaults (Qwen3-Next-80B-A3B): 48 layers, hidden 2,048, 16 query and 2
//! KV heads of 256, 512 experts top-10 of 512 and a shared one of 512, linear attention 16
//! key and 32 value heads of 128, 4 taps, vocabulary 151,936, untied lm_head.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS};
use super::cfg::{MAX_HEAD_DIM, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{
    AttentionKind, Dtype, GatedDeltaNetSpec, Linear, LinearRole, ModelSpec, MoeSpec, NormKind,
};

/// Tokens per chunk of transformers' torch `torch_chunk_gated_delta_rule` (its default).
const CHUNK: u64 = 64;

/// Parses a `qwen3_next` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_or("hidden_size", 2048, MAX_HIDDEN)?;
    let intermediate = c.dim_or("intermediate_size", 5632, MAX_INTERMEDIATE)?;
    let layers = c.dim_or("num_hidden_layers", 48, MAX_LAYERS)?;
    let vocab = c.dim_or("vocab_size", 151_936, MAX_VOCAB)?;
    let nh = c.dim_or("num_attention_heads", 16, MAX_HEADS)?;
    let kv = c.dim_or("num_key_value_heads", 2, MAX_HEADS)?;
    if kv > nh || !nh.is_multiple_of(kv) {
        return Err(c.err(
            "num_key_value_heads",
            format!("({kv}) must divide the number of query heads ({nh})"),
        ));
    }
    let hd = c.dim_or("head_dim", 256, MAX_HEAD_DIM)?;
    let heads = common::Heads { nh, kv, hd };
    let bias = c.bool_or("attention_bias", false)?;
    let gdn = GatedDeltaNetSpec {
        key_heads: c.dim_or("linear_num_key_heads", 16, MAX_HEADS)?,
        value_heads: c.dim_or("linear_num_value_heads", 32, MAX_HEADS)?,
        key_head_dim: c.dim_or("linear_key_head_dim", 128, MAX_HEAD_DIM)?,
        value_head_dim: c.dim_or("linear_value_head_dim", 128, MAX_HEAD_DIM)?,
        conv_kernel: c.dim_or("linear_conv_kernel_dim", 4, 1 << 10)?,
        chunk: CHUNK,
    };
    if !gdn.value_heads.is_multiple_of(gdn.key_heads) {
        return Err(c.err(
            "linear_num_value_heads",
            format!(
                "({}) must be a multiple of linear_num_key_heads ({})",
                gdn.value_heads, gdn.key_heads
            ),
        ));
    }
    let kinds = layer_kinds(c, layers)?;
    let experts = c.uint_or("num_experts", 512, MAX_EXPERTS)?;
    let step = c.dim_or("decoder_sparse_step", 1, MAX_LAYERS)?;
    let dense_only = c.uint_list("mlp_only_layers")?;
    let sparse = |i: u64| experts > 0 && !dense_only.contains(&i) && (i + 1).is_multiple_of(step);
    let moe = if experts > 0 {
        let top_k = c.dim_or("num_experts_per_tok", 10, MAX_EXPERTS)?;
        common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
        let moe_i = c.dim_or("moe_intermediate_size", 512, MAX_INTERMEDIATE)?;
        let shared_i = c.dim_or("shared_expert_intermediate_size", 512, MAX_INTERMEDIATE)?;
        let mut linears = common::moe_linears(hidden, experts, top_k, moe_i, shared_i);
        linears.push(Linear::new(
            "shared_expert_gate",
            hidden,
            1,
            false,
            LinearRole::Router,
        ));
        let spec = MoeSpec {
            num_experts: experts,
            experts_per_token: top_k,
            num_shared_experts: 1,
            expert_intermediate_size: moe_i,
            shared_intermediate_size: shared_i,
            first_dense_layers: (0..layers).take_while(|i| !sparse(*i)).count() as u64,
        };
        Some((spec, linears, 0))
    } else {
        None
    };
    let q = Linear::new("q_proj", hidden, 2 * heads.q(), bias, LinearRole::Attention);
    let mut attn = common::qkvo(hidden, heads, bias, bias);
    attn[0] = q;

    let mut spec = common::build(Plan {
        model_type: "qwen3_next".to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 32_768)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        attn,
        // input_layernorm + post_attention_layernorm, q_norm + k_norm.
        layer_other: 2 * hidden + 2 * hd,
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe,
        kinds: kinds
            .iter()
            .zip(0u64..)
            .map(|(k, i)| (*k, sparse(i)))
            .collect(),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;

    // The linear-attention layers: the mixer's Linears replace q/k/v/o, and its convolution,
    // per-head vectors and gated-norm weight replace q_norm and k_norm.
    let mixer = [
        Linear::new(
            "in_proj_qkvz",
            hidden,
            2 * gdn.key_dim() + 2 * gdn.value_dim(),
            false,
            LinearRole::Attention,
        ),
        Linear::new(
            "in_proj_ba",
            hidden,
            2 * gdn.value_heads,
            false,
            LinearRole::Attention,
        ),
        Linear::new(
            "out_proj",
            gdn.value_dim(),
            hidden,
            false,
            LinearRole::Attention,
        ),
    ];
    let conv = cfg::mul(
        gdn.conv_channels(),
        gdn.conv_kernel,
        "linear_conv_kernel_dim",
    )?;
    let mixer_other = conv + 2 * gdn.value_heads + gdn.value_head_dim;
    for g in &mut spec.layers {
        if g.attention == AttentionKind::Recurrent {
            g.linears.retain(|l| l.role != LinearRole::Attention);
            g.linears.splice(0..0, mixer.iter().cloned());
            g.other_params = g.other_params - 2 * hd + mixer_other;
        }
    }
    spec.gated_delta_net = Some(gdn);
    spec.qk_norm = true;
    spec.fp32_norms = true;
    spec.attention_output_gate = true;
    Ok(spec)
}

/// Each layer's mixer from `layer_types`, every fourth layer full attention without it
/// (`Qwen3NextConfig.__post_init__`: `full_attention_interval` 4).
fn layer_kinds(c: &Cfg<'_>, layers: u64) -> Result<Vec<AttentionKind>, ArchError> {
    if let Some(listed) =
        common::hybrid_layer_types(c, layers, &["linear_attention"], &["full_attention"])?
    {
        return Ok(listed);
    }
    let interval = c.dim_or("full_attention_interval", 4, MAX_LAYERS)?;
    Ok((0..layers)
        .map(|i| {
            if (i + 1).is_multiple_of(interval) {
                AttentionKind::Full
            } else {
                AttentionKind::Recurrent
            }
        })
        .collect())
}
