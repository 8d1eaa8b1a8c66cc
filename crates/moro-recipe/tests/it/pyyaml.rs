//! Written recipes read back identically in PyYAML (YAML 1.1), the reader axolotl and
//! LLaMA-Factory use. Skipped, with a note, where python3 or PyYAML is missing.

use std::io::Write;
use std::process::{Command, Stdio};

use moro_recipe::{Recipe, to_yaml};
use serde_json::Value;

use crate::write::HAZARDS;
use crate::{FULL, PRODUCT, ok};

const LOADER: &str = r#"
import json, sys, yaml
def exact(v):
    # Floats travel as repr() text: JSON readers may round the last digit.
    if isinstance(v, float):
        return {"$float": repr(v)}
    if isinstance(v, dict):
        return {k: exact(x) for k, x in v.items()}
    if isinstance(v, list):
        return [exact(x) for x in v]
    return v
docs = json.load(sys.stdin)
out = []
for d in docs:
    try:
        out.append(exact(yaml.safe_load(d)))
    except Exception as e:
        out.append({"__error__": str(e)})
json.dump(out, sys.stdout)
"#;

/// PyYAML's reading of each document, or `None` when PyYAML is not available.
pub fn pyyaml_load(docs: &[String]) -> Option<Vec<Value>> {
    let child = Command::new("python3")
        .args(["-c", LOADER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("note: python3 not found; skipping the PyYAML check");
        return None;
    };
    let input = serde_json::to_vec(docs).expect("json");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("write to python3");
    let out = child.wait_with_output().expect("python3 runs");
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No module named 'yaml'") {
            eprintln!("note: PyYAML not installed (pip install pyyaml); skipping the PyYAML check");
            return None;
        }
        panic!("python3 failed: {err}");
    }
    let docs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("python3 printed JSON");
    Some(docs.into_iter().map(exact_floats).collect())
}

/// Turns `{"$float": "0.1"}` back into an exact `f64`.
fn exact_floats(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            if let (1, Some(Value::String(f))) = (m.len(), m.get("$float")) {
                let x: f64 = f.parse().expect("python float repr");
                return Value::from(x);
            }
            Value::Object(m.into_iter().map(|(k, x)| (k, exact_floats(x))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(exact_floats).collect()),
        other => other,
    }
}

/// Checks PyYAML reads every recipe's YAML as the same values as the recipe itself.
pub fn assert_pyyaml_agrees(recipes: &[Recipe]) {
    let docs: Vec<String> = recipes
        .iter()
        .map(|r| to_yaml(r, "a header\nin two lines"))
        .collect();
    let Some(loaded) = pyyaml_load(&docs) else {
        return;
    };
    for ((r, doc), got) in recipes.iter().zip(&docs).zip(loaded) {
        let want = serde_json::to_value(r).expect("recipe as JSON");
        assert_eq!(got, want, "PyYAML reads this differently:\n{doc}");
    }
}

#[test]
fn pyyaml_reads_written_recipes_identically() {
    let mut recipes = vec![ok(PRODUCT), ok(FULL), ok("model:\n  base: m\n")];
    for s in HAZARDS {
        let mut r = ok(FULL);
        r.name = Some((*s).to_owned());
        r.version = Some((*s).to_owned());
        r.model.base = (*s).to_owned() + "/m";
        r.training.dataset = Some((*s).to_owned());
        if let Some(p) = r.prediction.as_mut() {
            p.components.0.push(((*s).to_owned(), 1));
            p.phase = Some((*s).to_owned());
        }
        r.model.target_modules = Some(moro_recipe::TargetModules::Names(vec![
            (*s).to_owned() + "x",
            "q_proj".into(),
        ]));
        recipes.push(r);
    }
    for f in [2e-4, 1e-10, 0.1, 1.0, 3.0e-7, 123_456.789, 1e20, 5e-324] {
        let mut r = ok(PRODUCT);
        r.training.learning_rate = Some(f);
        r.training.weight_decay = Some(f);
        recipes.push(r);
    }
    assert_pyyaml_agrees(&recipes);
}
