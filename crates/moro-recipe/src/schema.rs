//! The JSON schema of moro.yaml, generated from the [`Recipe`] types (feature `schema`).
//!
//! The repository commits the output as `moro.schema.json`; a test fails when it is stale
//! (`UPDATE_SCHEMA=1 cargo test -p moro-recipe --features schema` rewrites it).

use crate::recipe::Recipe;

/// The JSON schema of moro.yaml, pretty-printed, ending in a newline.
#[must_use]
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(Recipe);
    let mut s = serde_json::to_string_pretty(&schema).unwrap_or_else(|e| {
        // A schema is plain JSON values; serializing it cannot fail. Return valid JSON anyway.
        format!("{{\"$comment\": \"schema generation failed: {e}\"}}")
    });
    s.push('\n');
    s
}
