//! The only YAML writer of the exports (block style, one key per line).
//!
//! Written for YAML 1.1 readers (PyYAML, which axolotl, LLaMA-Factory and accelerate use) and
//! YAML 1.2 readers alike: a string is written plain only when [`plain_is_safe`] holds, which
//! excludes every spelling a YAML 1.1 reader resolves to something else (`yes`, `on`, `y`,
//! `null`, `~`, `3.10`, `0755`, `1e3`, `.inf`, `12:30`, dates); everything else is
//! double-quoted with escapes. Floats always carry a dot and no exponent.

use crate::value::{Map, Value, float_text};

/// Writes `value` (a mapping) as a YAML document, after `header` as `# ` comment lines.
#[must_use]
pub fn to_yaml(value: &Value, header: &[String]) -> String {
    let mut out = String::with_capacity(2048);
    for line in header {
        for l in line.split(is_break) {
            let l = comment_safe(l.trim_end());
            if l.is_empty() {
                out.push_str("#\n");
            } else {
                out.push_str("# ");
                out.push_str(&l);
                out.push('\n');
            }
        }
    }
    match value {
        Value::Map(m) if !m.is_empty() => write_map(&mut out, m, 0),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, m: &Map, indent: usize) {
    for (k, v) in &m.0 {
        push_indent(out, indent);
        out.push_str(&scalar_str(k));
        out.push(':');
        write_value_after_key(out, v, indent);
    }
}

/// Writes what follows `key:` (a space and a scalar, or a newline and a nested block).
fn write_value_after_key(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Map(m) if !m.is_empty() => {
            out.push('\n');
            write_map(out, m, indent + 2);
        }
        Value::List(items) if !items.is_empty() => {
            out.push('\n');
            write_list(out, items, indent + 2);
        }
        other => {
            out.push(' ');
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
}

fn write_list(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        push_indent(out, indent);
        out.push_str("- ");
        match item {
            Value::Map(m) if !m.is_empty() => {
                // First entry on the dash line, the rest aligned under it.
                for (i, (k, v)) in m.0.iter().enumerate() {
                    if i > 0 {
                        push_indent(out, indent + 2);
                    }
                    out.push_str(&scalar_str(k));
                    out.push(':');
                    write_value_after_key(out, v, indent + 2);
                }
            }
            other => {
                out.push_str(&inline(other));
                out.push('\n');
            }
        }
    }
}

fn push_indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// A value on one line: scalars, `[]`, `{}`, and flow collections of double-quoted strings.
fn inline(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => float_text(*f),
        Value::Str(s) => scalar_str(s),
        Value::List(items) => {
            let parts: Vec<String> = items.iter().map(flow_item).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Map(m) => {
            let parts: Vec<String> =
                m.0.iter()
                    .map(|(k, v)| format!("{}: {}", double_quoted(k), flow_item(v)))
                    .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// Inside a flow collection PyYAML ends plain scalars at `,[]{}`: strings are always quoted.
fn flow_item(v: &Value) -> String {
    match v {
        Value::Str(s) => double_quoted(s),
        other => inline(other),
    }
}

/// A string scalar: plain when [`plain_is_safe`], else double-quoted.
#[must_use]
pub fn scalar_str(s: &str) -> String {
    if plain_is_safe(s) {
        s.to_owned()
    } else {
        double_quoted(s)
    }
}

/// Words a YAML 1.1 reader resolves to a boolean or null (compared case-insensitively, which
/// covers every spelling of the YAML 1.1 bool and null types and more).
const RESERVED: &[&str] = &[
    "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~",
];

/// Whether `s` may be written as a plain scalar and read back as the same string by YAML 1.1
/// and 1.2 readers: it starts with an ASCII letter, `_` or `/`, holds only ASCII letters,
/// digits and `_./-`, and is not a reserved word. A plain scalar starting with a letter can
/// be no YAML 1.1 int, float, timestamp or sexagesimal number (those start with a digit, a
/// sign or a dot).
#[must_use]
pub fn plain_is_safe(s: &str) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '_' || first == '/')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
        && !RESERVED.iter().any(|r| r.eq_ignore_ascii_case(s))
}

/// A double-quoted scalar with YAML escapes (control characters, YAML 1.1 line breaks and
/// characters PyYAML does not accept unescaped).
#[must_use]
pub fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if printable(c) => out.push(c),
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Characters PyYAML accepts unescaped inside a scalar (its `printable` set, less the line
/// breaks NEL, LS and PS and the BOM).
fn printable(c: char) -> bool {
    matches!(c, ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

const fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// A comment line PyYAML accepts (non-printable characters become `?`).
fn comment_safe(line: &str) -> String {
    line.chars()
        .map(|c| if c == '\t' || printable(c) { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml11_lookalikes_are_quoted() {
        for s in [
            "yes",
            "No",
            "ON",
            "off",
            "y",
            "N",
            "null",
            "~",
            "true",
            "3.10",
            "0755",
            "1e3",
            "1e-05",
            ".inf",
            "12:30",
            "2024-01-01",
            "",
            " lead",
            "a: b",
            "#x",
            "-x",
            "@x",
            "a b",
            "x#y",
            "0x1F",
            "+1",
            ".5",
        ] {
            assert!(!plain_is_safe(s), "{s:?} must be quoted");
            assert!(scalar_str(s).starts_with('"'), "{s:?}");
        }
        for s in [
            "Qwen/Qwen2.5-0.5B",
            "q_proj",
            "lora",
            "ds_config.json",
            "/data/x.jsonl",
        ] {
            assert!(plain_is_safe(s), "{s:?} may stay plain");
        }
    }

    #[test]
    fn escapes_keep_one_line_and_pyyaml_printable() {
        assert_eq!(double_quoted("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(double_quoted("\u{85}\u{2028}\u{1}"), r#""\x85\u2028\x01""#);
    }

    #[test]
    fn nested_blocks_and_lists_of_maps() {
        let mut d = Map::new();
        d.set("path", "tatsu-lab/alpaca");
        d.set("type", "alpaca");
        let mut root = Map::new();
        root.set("datasets", Value::List(vec![Value::Map(d)]));
        root.set("targets", Value::from(vec!["q_proj", "v_proj"]));
        root.set("mixed_precision", "no");
        root.set("lr", 0.0002);
        root.set("empty", Value::List(vec![]));
        let y = to_yaml(&Value::Map(root), &["made by moro".to_owned()]);
        assert_eq!(
            y,
            "# made by moro\ndatasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n\
             targets:\n  - q_proj\n  - v_proj\nmixed_precision: \"no\"\nlr: 0.0002\nempty: []\n"
        );
    }
}
