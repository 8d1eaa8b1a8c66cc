//! moro-export: a moro.yaml [`Recipe`] in the formats of the trainers people run.
//!
//! Pure: recipe (and optionally the model's architecture) in, file contents out. The CLI
//! (`moro recipe export`) does the writing. Each format is one function of the recipe:
//!
//! | format | files |
//! | --- | --- |
//! | `axolotl` | axolotl YAML (+ DeepSpeed JSON for ZeRO) |
//! | `llamafactory` | LLaMA-Factory YAML (+ DeepSpeed JSON, or accelerate YAML for FSDP) |
//! | `trl` | a runnable TRL `SFTTrainer` script with the `trl sft` equivalent (+ DeepSpeed / accelerate) |
//! | `hf-trainer` | `TrainingArguments` JSON (+ DeepSpeed / accelerate) |
//! | `unsloth` | a runnable Unsloth script (+ DeepSpeed / accelerate) |
//! | `deepspeed` | DeepSpeed JSON (HF-integration `"auto"` values) |
//! | `accelerate` | accelerate config YAML (+ DeepSpeed JSON for ZeRO) |
//!
//! Every setting a format cannot express is returned in [`Export::warnings`]; none is dropped
//! silently. The key lists the exports are tested against live in `data/trainer-keys/`.

mod formats;
pub mod json;
mod plan;
pub mod python;
pub mod value;
pub mod yaml;

use std::fmt;

use moro_core::model::ModelSpec;
use moro_recipe::{Recipe, RecipeError};
use serde::Serialize;

pub use plan::default_output_dir;
pub use value::{Map, Value};

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// axolotl YAML.
    Axolotl,
    /// LLaMA-Factory YAML.
    Llamafactory,
    /// TRL SFTTrainer script.
    Trl,
    /// HF `TrainingArguments` JSON.
    HfTrainer,
    /// Unsloth script.
    Unsloth,
    /// DeepSpeed config JSON.
    Deepspeed,
    /// accelerate config YAML.
    Accelerate,
    /// `mlx_lm.lora` config YAML.
    Mlx,
}

impl Format {
    /// Every format.
    pub const ALL: [Self; 8] = [
        Self::Axolotl,
        Self::Llamafactory,
        Self::Trl,
        Self::HfTrainer,
        Self::Unsloth,
        Self::Deepspeed,
        Self::Accelerate,
        Self::Mlx,
    ];

    /// The name on the command line.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Axolotl => "axolotl",
            Self::Llamafactory => "llamafactory",
            Self::Trl => "trl",
            Self::HfTrainer => "hf-trainer",
            Self::Unsloth => "unsloth",
            Self::Deepspeed => "deepspeed",
            Self::Accelerate => "accelerate",
            Self::Mlx => "mlx",
        }
    }

    /// Parses a name (also `llama-factory`, `hf`, `transformers`, `ds`).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "axolotl" => Self::Axolotl,
            "llamafactory" | "llama-factory" | "llama_factory" => Self::Llamafactory,
            "trl" => Self::Trl,
            "hf-trainer" | "hf" | "transformers" | "hf_trainer" => Self::HfTrainer,
            "unsloth" => Self::Unsloth,
            "deepspeed" | "ds" => Self::Deepspeed,
            "accelerate" => Self::Accelerate,
            "mlx" | "mlx-lm" | "mlx_lm" => Self::Mlx,
            _ => return None,
        })
    }

    /// The main file's default name.
    #[must_use]
    pub const fn default_file_name(self) -> &'static str {
        match self {
            Self::Axolotl => "axolotl.yaml",
            Self::Llamafactory => "llamafactory.yaml",
            Self::Trl => "train_trl.py",
            Self::HfTrainer => "training_args.json",
            Self::Unsloth => "train_unsloth.py",
            Self::Deepspeed => plan::DS_CONFIG_NAME,
            Self::Accelerate => plan::ACCELERATE_CONFIG_NAME,
            Self::Mlx => "mlx_lora.yaml",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to export.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// File name of the main file (the launch command and `moro run` refer to it). Default:
    /// [`Format::default_file_name`].
    pub main_file_name: Option<String>,
}

/// One file of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportFile {
    /// File name (no directory); companions are referred to by this name from the main file.
    pub name: String,
    /// Full text.
    pub content: String,
}

/// The result of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Export {
    /// The format.
    pub format: Format,
    /// The main file first, then companions (DeepSpeed JSON, accelerate YAML).
    pub files: Vec<ExportFile>,
    /// What the format cannot express, one line each.
    pub warnings: Vec<String>,
    /// The command that starts training, run from the directory the files are in.
    pub launch: String,
}

impl Export {
    /// The main file.
    #[must_use]
    pub fn main_file(&self) -> Option<&ExportFile> {
        self.files.first()
    }
}

/// Why a recipe cannot be exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportError {
    /// moro.yaml field path, when one field is at fault.
    pub field: Option<String>,
    /// What is wrong, one line.
    pub message: String,
}

impl ExportError {
    pub(crate) fn field(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ExportError {}

impl From<RecipeError> for ExportError {
    fn from(e: RecipeError) -> Self {
        Self {
            field: e.field,
            message: e.message,
        }
    }
}

/// Exports `recipe` as `format`. With `model` (the recipe's base model architecture), LoRA
/// targets are checked against its Linear layers, `all-linear` is spelled out where a format
/// needs names, and the FSDP wrap class and chat template are filled in.
///
/// # Errors
/// An invalid recipe (naming the field), an inference recipe, or a format that cannot express
/// the recipe at all (`deepspeed` without a ZeRO strategy).
pub fn export(
    format: Format,
    recipe: &Recipe,
    model: Option<&ModelSpec>,
    options: &Options,
) -> Result<Export, ExportError> {
    let main = options
        .main_file_name
        .clone()
        .unwrap_or_else(|| format.default_file_name().to_owned());
    let plan = plan::Plan::new(recipe, model)?;
    if format != Format::Trl {
        plan.require_lora(format.as_str())?;
    }
    let mut out = match format {
        Format::Axolotl => formats::axolotl(&plan, &main),
        Format::Llamafactory => formats::llamafactory(&plan, &main),
        Format::Trl => formats::trl(&plan, &main),
        Format::HfTrainer => formats::hf_trainer(&plan, &main),
        Format::Unsloth => formats::unsloth(&plan, &main),
        Format::Deepspeed => formats::deepspeed(&plan, &main),
        Format::Accelerate => formats::accelerate(&plan, &main),
        Format::Mlx => formats::mlx(&plan, &main),
    }?;
    let mut warnings = plan.warnings.clone();
    warnings.append(&mut out.warnings);
    let mut seen = std::collections::HashSet::new();
    warnings.retain(|w| seen.insert(w.clone()));
    Ok(Export {
        format,
        files: out.files,
        warnings,
        launch: out.launch,
    })
}
