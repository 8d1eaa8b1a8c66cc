//! HF `config.json` bytes → [`ModelSpec`], one adapter per `model_type` (decoders, the
//! BERT-style encoders `bert` / `roberta`, and the encoder-decoders `t5` / `mt5`).
//!
//! Each adapter mirrors the module tree transformers (or, for `qwen`, the checkpoint's
//! own remote code) instantiates for that `model_type`: every `nn.Linear`/`Conv1D` with its
//! real module name, every norm and bias, and the config class's defaults for absent keys.
//! Counts are checked to the parameter against `docs/model-params.md` (tests/params.rs).
//!
//! Sizes are validated (positive, bounded, heads dividing evenly) and every product is
//! recounted with checked arithmetic, so hostile or corrupt configs give an [`ArchError`]
//! naming the field instead of a panic or an overflow.

mod bart;
mod bert;
mod bloom;
mod cfg;
mod closest;
mod common;
mod deepseek;
mod falcon;
mod gemma;
mod gemma3n;
mod glm4_moe;
mod gpt2;
mod gpt_neox;
mod gpt_oss;
mod granite_hybrid;
mod llama;
mod llama4;
mod olmo2;
mod phi;
mod phi3;
mod qwen1;
mod qwen2;
mod qwen3_next;
mod stablelm;
mod t5;
mod vision;
mod vlm;

use serde_json::Value;

use crate::model::ModelSpec;

/// A config that cannot be turned into a [`ModelSpec`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchError {
    /// Not JSON, or not an object.
    #[error("config.json is not valid JSON: {0}")]
    Json(String),
    /// A required field is missing or has the wrong type.
    #[error("config.json: field `{field}` {problem}")]
    Field {
        /// The field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The `model_type` is not supported.
    #[error(
        "unsupported model_type `{model_type}`{}; supported: {supported}",
        closest.as_ref().map_or_else(String::new, |c| format!(" (the closest supported is `{c}`)"))
    )]
    Unsupported {
        /// The config's model_type.
        model_type: String,
        /// The supported type nearest it by name, when one is near.
        closest: Option<String>,
        /// Comma-separated supported types.
        supported: String,
    },
}

/// Every `model_type` [`parse_config`] accepts.
pub const SUPPORTED: &[&str] = &[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gemma3n",
    "gemma3n_text",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "llava",
    "mistral3",
    "idefics3",
    "mllama",
    "smolvlm",
    "phi3",
    "deepseek_v2",
    "deepseek_v3",
    "glm4_moe",
    "gpt_oss",
    "llama4",
    "llama4_text",
    "olmo2",
    "olmo3",
    "smollm3",
    "granite",
    "granitemoehybrid",
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "falcon",
    "phi",
    "stablelm",
    "qwen",
    "bloom",
    "bert",
    "roberta",
    "bart",
    "t5",
    "mt5",
    "umt5",
];

/// Parses a HF `config.json`.
///
/// # Errors
/// [`ArchError::Json`] when the bytes are not a JSON object, [`ArchError::Unsupported`] for
/// an unknown `model_type`, [`ArchError::Field`] for a missing, mistyped or absurd field.
pub fn parse_config(bytes: &[u8]) -> Result<ModelSpec, ArchError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ArchError::Json(e.to_string()))?;
    let Value::Object(map) = &value else {
        return Err(ArchError::Json("the top level is not an object".to_owned()));
    };
    let c = cfg::Cfg::new(map);
    let model_type = c
        .opt_str("model_type")?
        .ok_or_else(|| c.err("model_type", "is missing"))?;
    let mut spec = by_type(&c, model_type)?;
    spec.prequantized = prequantized(&c)?;
    Ok(spec)
}

/// The bitsandbytes storage a `quantization_config` declares (transformers 5.24
/// `BitsAndBytesConfig`: `load_in_4bit` with `bnb_4bit_quant_type` nf4 or fp4 and
/// `bnb_4bit_use_double_quant`, or `load_in_8bit`); `None` without one or for other methods.
fn prequantized(c: &cfg::Cfg<'_>) -> Result<Option<crate::job::Quantization>, ArchError> {
    use crate::job::Quantization;
    let Some(q) = c.opt_object("quantization_config")? else {
        return Ok(None);
    };
    let q = cfg::Cfg::nested(q, "quantization_config");
    if q.opt_str("quant_method")? != Some("bitsandbytes") {
        return Ok(None);
    }
    if q.bool_or("load_in_8bit", false)? {
        return Ok(Some(Quantization::Int8));
    }
    if !q.bool_or("load_in_4bit", false)? {
        return Ok(None);
    }
    let double = q.bool_or("bnb_4bit_use_double_quant", false)?;
    Ok(Some(
        match (q.opt_str("bnb_4bit_quant_type")?.unwrap_or("fp4"), double) {
            ("nf4", true) => Quantization::Nf4Dq,
            ("nf4", false) => Quantization::Nf4,
            ("fp4", true) => Quantization::Fp4Dq,
            ("fp4", false) => Quantization::Fp4,
            (other, _) => {
                return Err(q.err(
                    "bnb_4bit_quant_type",
                    format!("`{other}` is not nf4 or fp4"),
                ));
            }
        },
    ))
}

fn by_type(c: &cfg::Cfg<'_>, model_type: &str) -> Result<ModelSpec, ArchError> {
    let c = *c;
    match model_type {
        "llama" | "mistral" | "mixtral" | "smollm3" | "granite" => llama::parse(&c, model_type),
        "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => qwen2::parse(&c, model_type),
        "gemma" | "gemma2" | "gemma3" | "gemma3_text" => gemma::parse(&c, model_type),
        "qwen2_vl" | "qwen2_5_vl" => vlm::qwen_vl(&c, model_type),
        "qwen3_vl" | "qwen3_vl_moe" => vlm::qwen3_vl(&c, model_type),
        "llava" => vlm::llava(&c),
        "mllama" => vlm::mllama(&c),
        "mistral3" => vlm::mistral3(&c),
        "idefics3" | "smolvlm" => vlm::idefics3(&c, model_type),
        "phi3" => phi3::parse(&c),
        "deepseek_v2" | "deepseek_v3" => deepseek::parse(&c, model_type),
        "glm4_moe" => glm4_moe::parse(&c),
        "qwen3_next" => qwen3_next::parse(&c),
        "gpt_oss" => gpt_oss::parse(&c),
        "gemma3n" | "gemma3n_text" => gemma3n::parse(&c, model_type),
        "granitemoehybrid" => granite_hybrid::parse(&c),
        "llama4" | "llama4_text" => llama4::parse(&c, model_type),
        "olmo2" | "olmo3" => olmo2::parse(&c, model_type),
        "gpt2" | "gpt_bigcode" => gpt2::parse(&c, model_type),
        "gpt_neox" => gpt_neox::parse(&c),
        // Falcon's original remote-code checkpoints say RefinedWeb / RefinedWebModel.
        "falcon" | "RefinedWeb" | "RefinedWebModel" => falcon::parse(&c),
        "phi" => phi::parse(&c),
        "stablelm" => stablelm::parse(&c),
        "qwen" => qwen1::parse(&c),
        "bloom" => bloom::parse(&c),
        "bert" | "roberta" => bert::parse(&c, model_type),
        "t5" | "mt5" | "umt5" => t5::parse(&c, model_type),
        "bart" => bart::parse(&c),
        other => Err(ArchError::Unsupported {
            model_type: other.to_owned(),
            closest: closest::closest_supported(other, SUPPORTED).map(str::to_owned),
            supported: SUPPORTED.join(", "),
        }),
    }
}
