//! Python source for the script exports (TRL, Unsloth): literals and keyword-argument calls,
//! one argument per line so the scripts read like hand-written ones.

use crate::value::{Value, float_text};

/// A Python expression: a literal [`Value`] or verbatim code (`torch.bfloat16`).
#[derive(Debug, Clone, PartialEq)]
pub enum Py {
    /// A literal.
    Lit(Value),
    /// Code written as is.
    Code(String),
}

impl<T: Into<Value>> From<T> for Py {
    fn from(v: T) -> Self {
        Self::Lit(v.into())
    }
}

/// Verbatim code.
pub fn code(s: impl Into<String>) -> Py {
    Py::Code(s.into())
}

/// A call `name(\n    key=value,\n    ...\n)` at `indent`, with positional `args` first.
#[must_use]
pub fn call(name: &str, args: &[Py], kwargs: &[(&str, Py)], indent: usize) -> String {
    let pad = " ".repeat(indent + 4);
    let mut out = format!("{name}(\n");
    for a in args {
        out.push_str(&format!("{pad}{},\n", expr(a)));
    }
    for (k, v) in kwargs {
        out.push_str(&format!("{pad}{k}={},\n", expr(v)));
    }
    out.push_str(&" ".repeat(indent));
    out.push(')');
    out
}

/// An expression's source.
#[must_use]
pub fn expr(p: &Py) -> String {
    match p {
        Py::Code(c) => c.clone(),
        Py::Lit(v) => literal(v),
    }
}

/// A Python literal.
#[must_use]
pub fn literal(v: &Value) -> String {
    match v {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => float_text(*f),
        Value::Str(s) => crate::json::string(s),
        Value::List(items) => {
            let parts: Vec<String> = items.iter().map(literal).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Map(m) => {
            let parts: Vec<String> =
                m.0.iter()
                    .map(|(k, v)| format!("{}: {}", crate::json::string(k), literal(v)))
                    .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_one_kwarg_per_line() {
        let s = call(
            "LoraConfig",
            &[],
            &[
                ("r", 16_u64.into()),
                ("target_modules", Value::from(vec!["q_proj"]).into()),
            ],
            0,
        );
        assert_eq!(
            s,
            "LoraConfig(\n    r=16,\n    target_modules=[\"q_proj\"],\n)"
        );
        assert_eq!(literal(&Value::Bool(false)), "False");
        assert_eq!(expr(&code("torch.bfloat16")), "torch.bfloat16");
    }
}
