//! `deepseek_v2` and `deepseek_v3`: multi-head latent attention plus DeepSeekMoE.
//!
//! Attention (`DeepseekV2Attention` / `DeepseekV3Attention`): when `q_lora_rank` is null,
//! `q_proj` H → nh·(nope+rope); otherwise `q_a_proj` H → q_lora (bias `attention_bias`),
//! RMSNorm `q_a_layernorm` (q_lora) and `q_b_proj` q_lora → nh·(nope+rope).
//! `kv_a_proj_with_mqa` H → kv_lora + rope (bias `attention_bias`), RMSNorm
//! `kv_a_layernorm` (kv_lora), `kv_b_proj` kv_lora → nh·(nope + v), `o_proj` nh·v → H.
//! `num_key_value_heads` plays no part (MLA).
//!
//! MLP: layer i is MoE when `n_routed_experts` is set, i ≥ `first_k_dense_replace` and
//! i % `moe_layer_freq` == 0 (the checkpoints' `modeling_deepseek.py`); otherwise a dense
//! gated MLP of `intermediate_size`. A MoE layer holds the router `gate` (H → E, no bias),
//! E experts `gate_proj`/`up_proj`/`down_proj` of `moe_intermediate_size`, one shared MLP of
//! `moe_intermediate_size · n_shared_experts`, and with `topk_method: noaux_tc` (V3) an
//! E-element `e_score_correction_bias`. Counting rules: docs/model-params.md.

use super::ArchError;
use super::cfg::{
    self, Cfg, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB,
};
use super::common::{self, Heads, Plan};
use crate::model::{Dtype, Linear, LinearRole, MlaSpec, ModelSpec, MoeSpec, NormKind};

/// Parses a `deepseek_v2` or `deepseek_v3` config. Absent keys take the
/// `DeepseekV2Config` / `DeepseekV3Config` defaults.
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let v3 = model_type == "deepseek_v3";
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let intermediate = c.dim("intermediate_size", MAX_INTERMEDIATE)?;
    let layers = c.dim("num_hidden_layers", MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    let nh = c.dim("num_attention_heads", cfg::MAX_HEADS)?;
    // `q_lora_rank: null` (V2-Lite) means a full q projection; both configs default to 1536.
    let q_lora = match c.get("q_lora_rank") {
        None if c.has_key("q_lora_rank") => None,
        None => Some(1536),
        Some(_) => Some(c.dim("q_lora_rank", MAX_HIDDEN)?),
    };
    let kv_lora = c.dim_or("kv_lora_rank", 512, MAX_HIDDEN)?;
    let rope = c.dim_or("qk_rope_head_dim", 64, MAX_HEAD_DIM)?;
    let nope = c.dim_or("qk_nope_head_dim", 128, MAX_HEAD_DIM)?;
    let v_dim = c.dim_or("v_head_dim", 128, MAX_HEAD_DIM)?;
    let bias = c.bool_or("attention_bias", false)?;
    let qk = nope + rope;

    let role = LinearRole::Attention;
    let mut attn = Vec::new();
    let mut layer_other = 2 * hidden; // input_layernorm + post_attention_layernorm
    match q_lora {
        Some(r) => {
            attn.push(Linear::new("q_a_proj", hidden, r, bias, role));
            attn.push(Linear::new("q_b_proj", r, nh * qk, false, role));
            layer_other += r; // q_a_layernorm
        }
        None => attn.push(Linear::new("q_proj", hidden, nh * qk, false, role)),
    }
    attn.push(Linear::new(
        "kv_a_proj_with_mqa",
        hidden,
        kv_lora + rope,
        bias,
        role,
    ));
    attn.push(Linear::new(
        "kv_b_proj",
        kv_lora,
        nh * (nope + v_dim),
        false,
        role,
    ));
    attn.push(Linear::new("o_proj", nh * v_dim, hidden, bias, role));
    layer_other += kv_lora; // kv_a_layernorm

    let experts = c.uint_or("n_routed_experts", if v3 { 256 } else { 0 }, MAX_EXPERTS)?;
    let first_dense = c.uint_or("first_k_dense_replace", if v3 { 3 } else { 0 }, MAX_LAYERS)?;
    let freq = c.dim_or("moe_layer_freq", 1, MAX_LAYERS)?;
    let moe = if experts > 0 {
        let top_k = if v3 {
            c.dim_or("num_experts_per_tok", 8, MAX_EXPERTS)?
        } else {
            c.dim("num_experts_per_tok", MAX_EXPERTS)?
        };
        common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
        let moe_i = c.dim_or(
            "moe_intermediate_size",
            if v3 { 2048 } else { 1407 },
            MAX_INTERMEDIATE,
        )?;
        let shared = c.uint_or("n_shared_experts", u64::from(v3), MAX_EXPERTS)?;
        let shared_i = cfg::mul(moe_i, shared, "n_shared_experts")?;
        let linears = common::moe_linears(hidden, experts, top_k, moe_i, shared_i);
        let default_method = if v3 { "noaux_tc" } else { "greedy" };
        let correction = c.opt_str("topk_method")?.unwrap_or(default_method) == "noaux_tc";
        let spec = MoeSpec {
            num_experts: experts,
            experts_per_token: top_k,
            num_shared_experts: shared,
            expert_intermediate_size: moe_i,
            shared_intermediate_size: shared_i,
            first_dense_layers: first_dense.min(layers),
        };
        Some((spec, linears, if correction { experts } else { 0 }))
    } else {
        None
    };
    let is_moe = |i: u64| moe.is_some() && i >= first_dense && i.is_multiple_of(freq);
    let kinds = common::all_full(c, layers)?
        .into_iter()
        .zip(0u64..)
        .map(|(a, i)| (a, is_moe(i)))
        .collect();

    common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate,
        // MLA: every query head has its own decompressed K/V; head_dim is the q/k head width.
        heads: Heads { nh, kv: nh, hd: qk },
        vocab,
        // DeepseekV2Config / DeepseekV3Config: tie_word_embeddings defaults to false.
        tie: c.bool_or("tie_word_embeddings", false)?,
        position_embeddings: 0,
        max_positions: common::max_positions(c, &["max_position_embeddings"], 2048)?,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: bias,
        o_bias: bias,
        mlp_bias: false,
        attn,
        layer_other,
        dense_mlp: common::gated_mlp(hidden, intermediate, false, LinearRole::Mlp),
        moe,
        kinds,
        mla: Some(MlaSpec {
            q_lora_rank: q_lora,
            kv_lora_rank: kv_lora,
            qk_rope_head_dim: rope,
            qk_nope_head_dim: nope,
            v_head_dim: v_dim,
        }),
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
