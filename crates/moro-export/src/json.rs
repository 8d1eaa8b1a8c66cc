//! JSON writer of the exports (two-space indent, keys in insertion order).

use crate::value::{Value, float_text};

/// Writes `value` as pretty JSON with a trailing newline.
#[must_use]
pub fn to_json(value: &Value) -> String {
    let mut out = String::with_capacity(1024);
    write(&mut out, value, 0);
    out.push('\n');
    out
}

fn write(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(f) => out.push_str(&float_text(*f)),
        Value::Str(s) => out.push_str(&string(s)),
        Value::List(items) if items.is_empty() => out.push_str("[]"),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.extend(std::iter::repeat_n(' ', indent + 2));
                write(out, item, indent + 2);
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent));
            out.push(']');
        }
        Value::Map(m) if m.is_empty() => out.push_str("{}"),
        Value::Map(m) => {
            out.push('{');
            for (i, (k, v)) in m.0.iter().enumerate() {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.extend(std::iter::repeat_n(' ', indent + 2));
                out.push_str(&string(k));
                out.push_str(": ");
                write(out, v, indent + 2);
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', indent));
            out.push('}');
        }
    }
}

/// A JSON string literal (also a valid Python string literal).
#[must_use]
pub fn string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Map;

    #[test]
    fn pretty_and_ordered() {
        let mut z = Map::new();
        z.set("stage", 3_u64);
        let mut m = Map::new();
        m.set("zero_optimization", z);
        m.set("train_batch_size", "auto");
        m.set("lr", 1e-5);
        let text = to_json(&Value::Map(m));
        assert_eq!(
            text,
            "{\n  \"zero_optimization\": {\n    \"stage\": 3\n  },\n  \"train_batch_size\": \"auto\",\n  \"lr\": 0.00001\n}\n"
        );
        let back: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(back["zero_optimization"]["stage"], 3);
    }
}
