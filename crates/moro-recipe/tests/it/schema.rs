//! moro.schema.json at the repository root is generated from the types and must be current.

use std::path::PathBuf;

fn schema_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../moro.schema.json")
}

#[test]
fn committed_schema_is_current() {
    let want = moro_recipe::json_schema();
    let path = schema_path();
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &want).expect("write moro.schema.json");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "moro.schema.json is missing or stale; regenerate it with\n  \
         UPDATE_SCHEMA=1 cargo test -p moro-recipe --features schema --test it schema\n\
         and commit the result"
    );
}

#[test]
fn schema_describes_moro_yaml() {
    let schema: serde_json::Value = serde_json::from_str(&moro_recipe::json_schema()).unwrap();
    assert_eq!(schema["$id"], moro_recipe::SCHEMA_URL);
    assert_eq!(
        schema["additionalProperties"], false,
        "unknown top-level keys are errors"
    );
    assert_eq!(schema["required"], serde_json::json!(["model"]));
    let props = schema["properties"].as_object().unwrap();
    for key in [
        "name",
        "version",
        "model",
        "training",
        "parallel",
        "hardware",
        "prediction",
    ] {
        assert!(props.contains_key(key), "{key}");
    }
    let defs = schema["$defs"].as_object().unwrap();
    let training = &defs["TrainingSection"];
    assert_eq!(training["additionalProperties"], false);
    assert_eq!(training["properties"]["micro_batch_size"]["minimum"], 1);
    let optimizers = defs["Optimizer"].to_string();
    assert!(optimizers.contains("\"adamw_8bit\""), "{optimizers}");
    assert!(defs["Quantization"].to_string().contains("\"nf4-dq\""));
    assert!(defs["TargetModules"].to_string().contains("all-linear"));
}
