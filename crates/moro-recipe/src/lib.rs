//! moro-recipe: moro.yaml, the recipe file.
//!
//! Pure: text in, text out, no files, environment or network. The crate owns
//!
//! - the data model ([`Recipe`] and its sections, [`choices`] for the named values),
//! - reading ([`parse`], [`parse_bytes`]) with one-line errors that name the field, line and
//!   column ([`RecipeError`]),
//! - writing ([`to_yaml`]) in a form YAML 1.1 readers (PyYAML) load to the same values,
//! - conversion to and from the engine's [`moro_core::job::Job`] ([`Recipe::to_job`],
//!   [`Recipe::from_job`]),
//! - with the `schema` feature, the JSON schema of moro.yaml ([`json_schema`]), committed as
//!   `moro.schema.json` at the repository root.
//!
//! Every call into the YAML library lives in the private `yaml` module.
//!
//! ```
//! let recipe = moro_recipe::parse("model:\n  base: Qwen/Qwen2.5-1.5B\n  quantization: nf4\n")?;
//! let job = recipe.to_job()?;
//! assert_eq!(job.method, moro_core::job::Method::QuantizedAdapters);
//! let text = moro_recipe::to_yaml(&recipe, "made by hand");
//! assert_eq!(moro_recipe::parse(&text)?, recipe);
//! # Ok::<(), moro_recipe::RecipeError>(())
//! ```

pub mod choices;
mod convert;
mod error;
mod recipe;
#[cfg(feature = "schema")]
mod schema;
mod validate;
mod yaml;

pub use convert::{TrainingExtras, job_error, job_field_path};
pub use error::{RecipeError, RecipeErrorKind};
pub use recipe::{
    Components, DataSection, HardwareSection, LibraryVersions, ModelSection, ParallelSection,
    PredictionSection, Recipe, TargetModules, TrainingSection,
};
#[cfg(feature = "schema")]
pub use schema::json_schema;
pub use validate::{MAX_GPUS, MAX_GRAD_ACCUM, MAX_LORA_RANK};
pub use yaml::{SCHEMA_LINE, parse, parse_bytes, to_yaml};

/// Where the JSON schema of moro.yaml is published (the `$schema` of written recipes).
pub const SCHEMA_URL: &str =
    "https://raw.githubusercontent.com/moro-dev/moro/main/moro.schema.json";
