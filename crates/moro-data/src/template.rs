//! A chat template rendered as transformers renders it (`transformers/utils/chat_template_utils.py`,
//! 5.x `_compile_jinja_template`): an immutable sandbox with `trim_blocks` and `lstrip_blocks`,
//! loop controls, `raise_exception`, `strftime_now` and a `tojson` that is Python's
//! `json.dumps(..., ensure_ascii=False)`; Python's string and dict methods through
//! minijinja-contrib's `pycompat`; `None`/`True`/`False` printed as Python prints them.

use minijinja::value::{Kwargs, Serde, Value as Jv, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};
use serde_json::Value;

/// Template steps one render may take before it is stopped (a template that loops forever).
const FUEL: u64 = 50_000_000;

/// The calendar day `strftime_now` prints (the caller's "today"; fixed in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Date {
    pub year: i32,
    pub month: u8,
    pub day: u8,
}

/// The special tokens a template can name (`bos_token`, `eos_token`, …), as
/// `tokenizer_config.json` gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub unk: Option<String>,
    pub pad: Option<String>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    special: SpecialTokens,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`, or says why it does not compile.
    pub fn new(source: &str, special: SpecialTokens, today: Date) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: String| {
            strftime(today, &format)
        });
        env.add_template_owned("chat", without_generation_tags(source))
            .map_err(|e| describe(&e))?;
        Ok(Self { env, special })
    }

    /// The conversation as text, with the generation prompt after it when asked.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let template = self.env.get_template("chat").map_err(|e| describe(&e))?;
        let s = &self.special;
        let messages = normalized(messages);
        let ctx = minijinja::context! {
            messages => Jv::from(Serde(&messages)),
            tools => tools.map(|t| Jv::from(Serde(t))),
            add_generation_prompt => add_generation_prompt,
            bos_token => s.bos.clone().unwrap_or_default(),
            eos_token => s.eos.clone().unwrap_or_default(),
            unk_token => s.unk.clone().unwrap_or_default(),
            pad_token => s.pad.clone().unwrap_or_default(),
        };
        template.render(ctx).map_err(|e| describe(&e))
    }
}

/// The messages as transformers hands them to the template (`tokenization_utils_base.py`
/// `apply_chat_template`, 5.x): keys whose value is `null` dropped, and a message's reasoning
/// under `reasoning_content` and `thinking` whichever of `reasoning_content`, `thinking`,
/// `reasoning` it came as (`_alias_reasoning_fields`).
fn normalized(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let Value::Object(obj) = m else {
                return m.clone();
            };
            let mut out: serde_json::Map<String, Value> = obj
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let reasoning = ["reasoning_content", "thinking", "reasoning"]
                .iter()
                .find_map(|k| out.get(*k).cloned());
            if let Some(r) = reasoning {
                if !out.contains_key("thinking") {
                    out.shift_insert(0, "thinking".to_owned(), r.clone());
                }
                out.insert("reasoning_content".to_owned(), r);
            }
            Value::Object(out)
        })
        .collect()
}

fn describe(e: &Error) -> String {
    if e.kind() == ErrorKind::InvalidOperation
        && let Some(detail) = e.detail()
        && let Some(message) = detail.strip_prefix(RAISED)
    {
        return format!("the chat template raised: {message}");
    }
    let place = e
        .line()
        .map(|l| format!(" (template line {l})"))
        .unwrap_or_default();
    match e.detail() {
        Some(d) => format!("the chat template failed: {}: {d}{place}", e.kind()),
        None => format!("the chat template failed: {}{place}", e.kind()),
    }
}

const RAISED: &str = "raise_exception: ";

fn raise_exception(message: String) -> Result<Jv, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// transformers' `{% generation %}` marks the assistant's tokens for `return_assistant_tokens_mask`
/// and prints nothing itself; the tags are dropped, what they enclose is kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let body = start + 2;
        let Some(len) = rest[body..].find("%}") else {
            break;
        };
        let tag = &rest[body..body + len];
        let word = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if word != "generation" && word != "endgeneration" {
            out.push_str(&rest[start..body + len + 2]);
        }
        rest = &rest[body + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Prints values as Jinja2 under Python does: `None`, `True`, `False`; the rest as minijinja.
fn python_formatter(
    out: &mut Output<'_>,
    state: &mut State<'_, '_>,
    value: &Jv,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.write_str("None").map_err(Error::from),
        ValueKind::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// The widest `tojson` indent rendered. Chat templates indent by 2 or 4; a template that
/// asks for billions of spaces per level (found by fuzzing) would fill memory before the
/// engine's fuel runs out, so it is refused.
const MAX_INDENT: usize = 64;

/// `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
fn tojson(value: &Jv, kwargs: Kwargs) -> Result<Jv, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    if let Some(n) = indent.filter(|&n| n > MAX_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent {n} is wider than {MAX_INDENT} spaces"),
        ));
    }
    let mut v = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort_keys == Some(true) {
        sort(&mut v);
    }
    let mut out = String::new();
    python_dumps(&v, indent, 0, &mut out);
    Ok(Jv::from_safe_string(out))
}

fn sort(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.sort_keys();
            m.values_mut().for_each(sort);
        }
        Value::Array(a) => a.iter_mut().for_each(sort),
        _ => {}
    }
}

/// Python's `json.dumps` layout: `", "` and `": "` without indent, `","` and newlines with it.
fn python_dumps(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                python_dumps(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                python_dumps(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or_default();
            if f.fract() == 0.0 && f.abs() < 1e16 {
                out.push_str(&format!("{f:.1}"));
            } else {
                out.push_str(&n.to_string());
            }
        }
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `datetime.now().strftime(format)` for the date parts templates use (midnight for the
/// time parts).
fn strftime(d: Date, format: &str) -> String {
    let month = MONTHS[usize::from(d.month.clamp(1, 12)) - 1];
    let weekday = WEEKDAYS[weekday(d)];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let unpadded = spec == Some('-');
        if unpadded {
            spec = chars.next();
        }
        let num = |n: i64, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        match spec {
            Some('Y') => out.push_str(&d.year.to_string()),
            Some('y') => out.push_str(&num(i64::from(d.year % 100), 2)),
            Some('m') => out.push_str(&num(i64::from(d.month), 2)),
            Some('d') => out.push_str(&num(i64::from(d.day), 2)),
            Some('e') => out.push_str(&format!("{:>2}", d.day)),
            Some('B') => out.push_str(month),
            Some('b' | 'h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H' | 'M' | 'S' | 'I') => out.push_str(&num(0, 2)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Monday = 0 (Sakamoto's method).
fn weekday(d: Date) -> usize {
    const T: [i32; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
    let m = i32::from(d.month.clamp(1, 12));
    let y = if m < 3 { d.year - 1 } else { d.year };
    let sunday0 =
        (y + y / 4 - y / 100 + y / 400 + T[(m - 1) as usize] + i32::from(d.day)).rem_euclid(7);
    ((sunday0 + 6) % 7) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DAY: Date = Date {
        year: 2026,
        month: 12,
        day: 2,
    };

    fn render(src: &str, messages: &Value) -> Result<String, String> {
        let t = ChatTemplate::new(src, SpecialTokens::default(), DAY)?;
        t.render(messages.as_array().unwrap(), None, false)
    }

    #[test]
    fn python_json_layout() {
        // json.dumps({"a": [1, 2.0, "é"], "b": {}}) == '{"a": [1, 2.0, "é"], "b": {}}'
        let out = render(
            "{{ messages[0] | tojson }}",
            &json!([{"a": [1, 2.0, "é"], "b": {}}]),
        );
        assert_eq!(out.unwrap(), r#"{"a": [1, 2.0, "é"], "b": {}}"#);
        // json.dumps({"a": [1], "b": "<x>"}, indent=2)
        let out = render(
            "{{ messages[0] | tojson(indent=2) }}",
            &json!([{"a": [1], "b": "<x>"}]),
        );
        assert_eq!(
            out.unwrap(),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": \"<x>\"\n}"
        );
        // An indent of billions of spaces (a fuzzing find) is an error, not a full memory.
        let out = render(
            "{{ messages[0] | tojson(indent=2555555555) }}",
            &json!([{"a": [1]}]),
        );
        assert!(out.unwrap_err().to_string().contains("indent 2555555555"));
    }

    #[test]
    fn python_literals_and_methods() {
        let out = render(
            "{{ none }} {{ true }} {{ messages[0]['content'].strip().upper() }}",
            &json!([{"role": "user", "content": "  hi "}]),
        );
        assert_eq!(out.unwrap(), "None True HI");
    }

    #[test]
    fn raise_exception_is_the_templates_message() {
        let err = render(
            "{{ raise_exception('Only user and assistant roles') }}",
            &json!([]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "the chat template raised: Only user and assistant roles"
        );
    }

    #[test]
    fn strftime_now_prints_the_day() {
        // datetime(2026, 12, 2).strftime("%d %b %Y, %A") == "02 Dec 2026, Wednesday"
        let out = render("{{ strftime_now('%d %b %Y, %A') }}", &json!([]));
        assert_eq!(out.unwrap(), "02 Dec 2026, Wednesday");
    }

    #[test]
    fn generation_tags_are_dropped_keeping_their_content() {
        let out = render("a{% generation %}b{%- endgeneration %}c", &json!([]));
        assert_eq!(out.unwrap(), "abc");
    }

    #[test]
    fn a_tag_that_closes_where_it_opens_is_left_to_the_parser() {
        // Found by the chat_template fuzz target: `{%}` once sliced a string backwards.
        assert_eq!(without_generation_tags("a{%}b"), "a{%}b");
        assert_eq!(without_generation_tags("{% generation %}{%}"), "{%}");
        assert!(render("a{%}b", &json!([])).is_err());
    }

    #[test]
    fn loop_controls_and_trimming() {
        let src = "{% for m in messages %}\n{% if loop.index0 == 1 %}{% break %}{% endif %}\n  {{ m.role }}\n{% endfor %}";
        let out = render(src, &json!([{"role": "a"}, {"role": "b"}]));
        // Jinja2 3.1 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols)
        // renders this as '  a\n': lstrip_blocks strips before block tags only.
        assert_eq!(out.unwrap(), "  a\n");
    }

    #[test]
    fn a_template_that_never_ends_is_stopped() {
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        assert!(render(src, &json!([])).is_err());
    }
}
