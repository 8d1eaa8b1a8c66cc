//! HF `config.json` bytes → [`ModelSpec`], one adapter per `model_type`.

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
    #[error("unsupported model_type `{model_type}`; supported: {supported}")]
    Unsupported {
        /// The config's model_type.
        model_type: String,
        /// Comma-separated supported types.
        supported: String,
    },
}

/// Parses a HF `config.json`.
///
/// # Errors
/// See [`ArchError`].
pub fn parse_config(_bytes: &[u8]) -> Result<ModelSpec, ArchError> {
    Err(ArchError::Json("not implemented yet".into()))
}
