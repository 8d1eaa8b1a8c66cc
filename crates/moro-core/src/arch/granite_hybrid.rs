//! `granitemoehybrid`: IBM Granite 4.0's hybrid decoder (transformers 5.25
//! `models/granitemoehybrid/modeling_granitemoehybrid.py`, `configuration_granitemoehybrid.py`).
//!
//! - `layer_types` names each layer `"mamba"` or `"attention"` (absent: every layer Mamba-2,
//!   `GraniteMoeHybridConfig.__post_init__`).
//! - A Mamba-2 layer (`GraniteMoeHybridMambaLayer`): `in_proj` `H → 2·E·H + 2·g·n + heads`
//!   and `out_proj` `E·H → H` (bias `mamba_proj_bias`), a depthwise `conv1d` over
//!   `E·H + 2·g·n` channels (`mamba_d_conv` taps, bias `mamba_conv_bias`), `dt_bias`,
//!   `A_log` and `D` per head, the gated norm's weight (`E·H`).
//! - An attention layer: `q_proj`/`k_proj`/`v_proj`/`o_proj` with `attention_bias`, head
//!   width `hidden_size / num_attention_heads`; RoPE only with
//!   `position_embedding_type: "rope"` (none in the Granite 4.0 checkpoints).
//! - Every layer: `input_layernorm`, `post_attention_layernorm`, the `shared_mlp`
//!   (`input_linear` `H → 2·S`, `output_linear` `S → H`, `shared_intermediate_size`) and,
//!   with `num_local_experts > 0`, routed experts: a router weight `experts × H` applied by
//!   `F.linear` and stacked `gate_up_proj` / `down_proj` run through `grouped_mm`.
//!
//! `GraniteMoeHybridConfig` defaults: 32 layers, hidden 4,096, vocabulary 32,000, 8 experts
//! top-2 of 11,008, shared 1,024; Mamba 128 heads, 256 states, 1 group, 4 taps, expand 2,
//! chunk 256, head width `expand · H / heads`; untied lm_head.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS};
use super::cfg::{MAX_HEAD_DIM, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{
    AttentionKind, Dtype, Linear, LinearRole, ModelSpec, MoeSpec, NormKind, SsmSpec,
};

/// Largest Mamba state size or convolution width accepted.
const MAX_SSM: u64 = 1 << 16;

/// Parses a `granitemoehybrid` config.
pub(crate) fn parse(c: &Cfg<'_>) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim_or("hidden_size", 4096, MAX_HIDDEN)?;
    let layers = c.dim_or("num_hidden_layers", 32, MAX_LAYERS)?;
    let vocab = c.dim_or("vocab_size", 32_000, MAX_VOCAB)?;
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        None,
        None,
    )?;
    let attention_bias = c.bool_or("attention_bias", false)?;
    let ssm = ssm_spec(c, hidden)?;
    let proj_bias = c.bool_or("mamba_proj_bias", false)?;
    let conv_bias = c.bool_or("mamba_conv_bias", true)?;
    let experts = c.uint_or("num_local_experts", 8, MAX_EXPERTS)?;
    let shared = c.dim_or("shared_intermediate_size", 1024, MAX_INTERMEDIATE)?;
    let kinds = layer_kinds(c, layers)?;

    let role = if experts > 0 {
        LinearRole::SharedExpert
    } else {
        LinearRole::Mlp
    };
    let shared_mlp = vec![
        Linear::new("input_linear", hidden, 2 * shared, false, role),
        Linear::new("output_linear", shared, hidden, false, role),
    ];
    let moe = if experts > 0 {
        let top_k = c.dim_or("num_experts_per_tok", 2, MAX_EXPERTS)?;
        common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
        let expert_i = c.dim_or("intermediate_size", 11_008, MAX_INTERMEDIATE)?;
        let mut linears = vec![common::router(hidden, experts)];
        linears.extend(common::routed_experts(
            ["gate_proj", "up_proj", "down_proj"],
            hidden,
            expert_i,
            experts,
            top_k,
        ));
        linears.extend(shared_mlp.iter().cloned());
        let spec = MoeSpec {
            num_experts: experts,
            experts_per_token: top_k,
            num_shared_experts: 1,
            expert_intermediate_size: expert_i,
            shared_intermediate_size: shared,
            first_dense_layers: 0,
        };
        Some((spec, linears, 0))
    } else {
        None
    };

    let mut spec = common::build(Plan {
        model_type: "granitemoehybrid".to_owned(),
        hidden,
        intermediate: shared,
        heads,
        vocab,
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 2048)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias: false,
        attn: common::qkvo(hidden, heads, attention_bias, attention_bias),
        // input_layernorm + post_attention_layernorm.
        layer_other: 2 * hidden,
        dense_mlp: shared_mlp,
        moe,
        kinds: kinds.iter().map(|k| (*k, experts > 0)).collect(),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })?;

    // The Mamba-2 layers: the mixer's Linears replace q/k/v/o, and its convolution, per-head
    // vectors and gated-norm weight join the norms.
    let mixer = [
        Linear::new(
            "in_proj",
            hidden,
            ssm.in_proj_width(),
            proj_bias,
            LinearRole::Attention,
        ),
        Linear::new(
            "out_proj",
            ssm.inner(),
            hidden,
            proj_bias,
            LinearRole::Attention,
        ),
    ];
    let channels = ssm.conv_channels();
    let conv =
        cfg::mul(channels, ssm.conv_kernel, "mamba_d_conv")? + if conv_bias { channels } else { 0 };
    let mixer_other = conv + 3 * ssm.heads + ssm.inner();
    for g in &mut spec.layers {
        if g.attention == AttentionKind::Recurrent {
            g.linears.retain(|l| l.role != LinearRole::Attention);
            g.linears.splice(0..0, mixer.iter().cloned());
            g.other_params = cfg::add(g.other_params, mixer_other, "mamba_d_conv")?;
        }
    }
    spec.ssm = Some(ssm);
    Ok(spec)
}

/// The Mamba-2 mixer's shape, validated as `GraniteMoeHybridConfig.validate_architecture`
/// does (`mamba_n_heads · mamba_d_head = mamba_expand · hidden_size`).
fn ssm_spec(c: &Cfg<'_>, hidden: u64) -> Result<SsmSpec, ArchError> {
    let heads = c.dim_or("mamba_n_heads", 128, MAX_HEADS)?;
    let expand = c.dim_or("mamba_expand", 2, 64)?;
    let inner = cfg::mul(expand, hidden, "mamba_expand")?;
    let head_dim = match c.get("mamba_d_head").and_then(serde_json::Value::as_str) {
        Some("auto") => inner / heads,
        _ if c.has("mamba_d_head") => c.dim("mamba_d_head", MAX_HEAD_DIM)?,
        _ => inner / heads,
    };
    if heads * head_dim != inner {
        return Err(c.err(
            "mamba_d_head",
            format!("({head_dim}) × mamba_n_heads ({heads}) must equal mamba_expand × hidden_size ({inner})"),
        ));
    }
    let groups = c.dim_or("mamba_n_groups", 1, MAX_HEADS)?;
    if heads % groups != 0 {
        return Err(c.err(
            "mamba_n_groups",
            format!("({groups}) must divide mamba_n_heads ({heads})"),
        ));
    }
    Ok(SsmSpec {
        heads,
        head_dim,
        state: c.dim_or("mamba_d_state", 256, MAX_SSM)?,
        groups,
        conv_kernel: c.dim_or("mamba_d_conv", 4, MAX_SSM)?,
        chunk: c.dim_or("mamba_chunk_size", 256, MAX_SSM)?,
    })
}

/// Each layer's mixer from `layer_types` (`"mamba"` / `"linear_attention"` or
/// `"attention"`), every layer Mamba-2 without it.
fn layer_kinds(c: &Cfg<'_>, layers: u64) -> Result<Vec<AttentionKind>, ArchError> {
    let listed = common::hybrid_layer_types(
        c,
        layers,
        &["mamba", "linear_attention"],
        &["attention", "full_attention"],
    )?;
    Ok(listed.unwrap_or_else(|| (0..layers).map(|_| AttentionKind::Recurrent).collect()))
}
