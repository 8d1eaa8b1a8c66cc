//! `llama`, `mistral` and `mixtral`: the Llama decoder (transformers `LlamaDecoderLayer`:
//! `q_proj`/`k_proj`/`v_proj`/`o_proj`, `gate_proj`/`up_proj`/`down_proj`, RMSNorm
//! `input_layernorm` + `post_attention_layernorm`, final `norm`), with Mistral's sliding
//! window and Mixtral's sparse MoE block (`block_sparse_moe.gate` + experts `w1`/`w3`/`w2`).

use super::ArchError;
use super::cfg::{Cfg, MAX_EXPERTS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB};
use super::common::{self, Plan};
use crate::model::{Dtype, LinearRole, ModelSpec, MoeSpec, NormKind};

/// Parses a `llama`, `mistral` or `mixtral` config.
pub(crate) fn parse(c: &Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let hidden = c.dim("hidden_size", MAX_HIDDEN)?;
    let intermediate = c.dim("intermediate_size", MAX_INTERMEDIATE)?;
    let layers = c.dim("num_hidden_layers", MAX_LAYERS)?;
    let vocab = c.dim("vocab_size", MAX_VOCAB)?;
    let heads = common::heads(
        c,
        hidden,
        &["num_attention_heads"],
        "num_key_value_heads",
        None,
        None,
    )?;
    // LlamaConfig has `attention_bias`/`mlp_bias` (default false); Mistral/Mixtral have neither
    // and build every projection without bias.
    // SmolLM3 (NoPE on every fourth layer: no parameter or saved tensor differs) and Granite
    // (scalar embedding, residual, attention and logits multipliers: no parameters, no
    // saved tensors) are Llama modules by module (transformers 5.24 `modeling_smollm3.py`,
    // `modeling_granite.py`).
    let llama = matches!(model_type, "llama" | "smollm3" | "granite");
    let attention_bias = llama && c.bool_or("attention_bias", false)?;
    let mlp_bias = llama && c.bool_or("mlp_bias", false)?;
    // Context defaults: LlamaConfig and GraniteConfig 2048; SmolLM3Config 32768;
    // MistralConfig / MixtralConfig 4096 * 32.
    let max_positions = common::max_positions(
        c,
        &["max_position_embeddings"],
        match model_type {
            "llama" | "granite" => 2048,
            "smollm3" => 32768,
            _ => 4096 * 32,
        },
    )?;
    // Sliding window: MistralConfig defaults to 4096 when the key is absent (Mistral 7B v0.1
    // uses it on every layer); MixtralConfig defaults to none; SmolLM3 only with
    // `use_sliding_window`; Llama and Granite have no window.
    let window = match model_type {
        "mistral" => common::sliding_window(c, Some(4096))?,
        "mixtral" => common::sliding_window(c, None)?,
        "smollm3" if c.bool_or("use_sliding_window", false)? => common::sliding_window(c, None)?,
        _ => None,
    };
    let attention = common::uniform(c, layers, window)?;

    let moe = if model_type == "mixtral" {
        // MixtralConfig defaults: 8 local experts, 2 per token.
        let experts = c.dim_or("num_local_experts", 8, MAX_EXPERTS)?;
        let top_k = c.dim_or("num_experts_per_tok", 2, MAX_EXPERTS)?;
        common::check_top_k(c, "num_experts_per_tok", top_k, experts)?;
        let mut linears = vec![common::router(hidden, experts)];
        // MixtralBlockSparseTop2MLP: w1 (gate), w3 (up), w2 (down), no bias.
        linears.extend(common::routed_experts(
            ["w1", "w3", "w2"],
            hidden,
            intermediate,
            experts,
            top_k,
        ));
        let spec = MoeSpec {
            num_experts: experts,
            experts_per_token: top_k,
            num_shared_experts: 0,
            expert_intermediate_size: intermediate,
            shared_intermediate_size: 0,
            first_dense_layers: 0,
        };
        Some((spec, linears, 0))
    } else {
        None
    };
    let is_moe = moe.is_some();

    common::build(Plan {
        model_type: model_type.to_owned(),
        hidden,
        intermediate,
        heads,
        vocab,
        // LlamaConfig / MistralConfig / MixtralConfig / GraniteConfig: tie_word_embeddings
        // defaults to false; SmolLM3Config to true.
        tie: c.bool_or("tie_word_embeddings", model_type == "smollm3")?,
        position_embeddings: 0,
        max_positions,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        mlp_bias,
        attn: common::qkvo(hidden, heads, attention_bias, attention_bias),
        // input_layernorm + post_attention_layernorm (RMSNorm: weight only).
        layer_other: 2 * hidden,
        dense_mlp: common::gated_mlp(hidden, intermediate, mlp_bias, LinearRole::Mlp),
        moe,
        kinds: attention.into_iter().map(|a| (a, is_moe)).collect(),
        mla: None,
        final_norm: hidden,
        load_dtype: c.dtype_or(Dtype::Bf16)?,
    })
}
