//! A JSON request body as a command's flags: `{"seq_len": 4096, "gradient_checkpointing":
//! true}` is `--seq-len=4096 --gradient-checkpointing=true`, parsed by the command's own clap
//! arguments, so a setting means what it means on the command line, with the same defaults,
//! spellings and checks.

use clap::{ArgAction, Args, Command, FromArgMatches};
use serde_json::Value;

use super::error::ApiError;

/// Flags a request may not set: no file is written, and the output is always JSON.
const REFUSED: [&str; 4] = ["output", "force", "json", "svg"];

/// `body` parsed as the flags of `A`, with `extra` (such as `--json`) appended.
pub(crate) fn parse<A: Args + FromArgMatches>(
    name: &'static str,
    body: &Value,
    extra: &[&str],
) -> Result<A, ApiError> {
    let command = A::augment_args(Command::new(name).no_binary_name(true));
    let argv = to_argv(&command, body)?;
    let argv = argv
        .into_iter()
        .chain(extra.iter().map(|s| (*s).to_owned()));
    let matches = command
        .try_get_matches_from(argv)
        .map_err(|e| from_clap(&e))?;
    A::from_arg_matches(&matches).map_err(|e| from_clap(&e))
}

/// The flags `body` says, one `--name=value` per field.
fn to_argv(command: &Command, body: &Value) -> Result<Vec<String>, ApiError> {
    let fields = match body {
        Value::Object(m) => m,
        Value::Null => return Ok(Vec::new()),
        _ => {
            return Err(ApiError::bad(
                "the body must be a JSON object of settings",
                None,
            ));
        }
    };
    let mut argv = Vec::with_capacity(fields.len());
    for (key, value) in fields {
        let flag = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| {
                a.get_long() == Some(flag.as_str())
                    || a.get_visible_aliases()
                        .is_some_and(|v| v.contains(&flag.as_str()))
            })
            .filter(|_| !REFUSED.contains(&key.as_str()))
            .ok_or_else(|| unknown(command, key))?;
        let takes_value = arg.get_action().takes_values();
        let text = match value {
            Value::Null => continue,
            Value::Bool(b) if !takes_value => {
                if *b {
                    argv.push(format!("--{flag}"));
                }
                continue;
            }
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            Value::Array(items)
                if matches!(arg.get_action(), ArgAction::Append)
                    || arg.get_value_delimiter().is_some() =>
            {
                items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s.clone()),
                        Value::Number(n) => Ok(n.to_string()),
                        _ => Err(ApiError::bad(
                            format!("field `{key}`: a list of names or numbers"),
                            Some(key),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(",")
            }
            _ => {
                return Err(ApiError::bad(
                    format!("field `{key}`: expected a string, a number or true/false"),
                    Some(key),
                ));
            }
        };
        if !takes_value {
            return Err(ApiError::bad(
                format!("field `{key}`: expected true or false"),
                Some(key),
            ));
        }
        argv.push(format!("--{flag}={text}"));
    }
    Ok(argv)
}

fn unknown(command: &Command, key: &str) -> ApiError {
    let known: Vec<String> = command
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !REFUSED.contains(l))
        .map(|l| l.replace('-', "_"))
        .collect();
    let near = known
        .iter()
        .min_by_key(|k| moro_core::catalog::levenshtein(k, key))
        .filter(|k| moro_core::catalog::levenshtein(k, key) <= 3);
    let mut e = ApiError::bad(format!("unknown field `{key}`"), Some(key));
    e.detail.hint = Some(match near {
        Some(k) => format!("did you mean `{k}`? the fields are: {}", known.join(", ")),
        None => format!("the fields are: {}", known.join(", ")),
    });
    e
}

/// A clap error as one line naming the field (`seq_len`), not the flag.
fn from_clap(e: &clap::Error) -> ApiError {
    use clap::error::{ContextKind, ContextValue};
    let field = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => Some(
            s.trim_start_matches("--")
                .split([' ', '='])
                .next()
                .unwrap_or_default()
                .replace('-', "_"),
        ),
        Some(ContextValue::Strings(v)) => v.first().map(|s| {
            s.trim_start_matches("--")
                .split([' ', '='])
                .next()
                .unwrap_or_default()
                .replace('-', "_")
        }),
        _ => None,
    };
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    let message = match (&field, e.kind()) {
        (Some(f), clap::error::ErrorKind::ValueValidation) => {
            let why = std::error::Error::source(e).map_or(first.clone(), ToString::to_string);
            format!("field `{f}`: {why}")
        }
        (Some(f), _) => format!("field `{f}`: {}", rewrite_flags(&first)),
        (None, _) => rewrite_flags(&first),
    };
    ApiError::bad(message, field.as_deref())
}

/// `'--seq-len <SEQ_LEN>'` in clap's words as `seq_len`.
fn rewrite_flags(s: &str) -> String {
    let mut out = String::new();
    for part in s.split('\'') {
        if let Some(flag) = part.strip_prefix("--") {
            out.push('`');
            out.push_str(
                &flag
                    .split([' ', '='])
                    .next()
                    .unwrap_or_default()
                    .replace('-', "_"),
            );
            out.push('`');
        } else {
            out.push_str(part);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, clap::Parser)]
    struct Demo {
        #[arg(long)]
        seq_len: Option<u64>,
        #[arg(long)]
        dora: bool,
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        gradient_checkpointing: Option<bool>,
        #[arg(long, value_delimiter = ',')]
        target_modules: Option<Vec<String>>,
        #[arg(long)]
        json: bool,
    }

    fn demo(v: Value) -> Result<Demo, ApiError> {
        parse::<Demo>("demo", &v, &[])
    }

    #[test]
    fn fields_become_the_flags_they_name() {
        let d = demo(json!({
            "seq_len": 4096, "dora": true, "gradient_checkpointing": false,
            "target_modules": ["q_proj", "v_proj"]
        }))
        .unwrap();
        assert_eq!(d.seq_len, Some(4096));
        assert!(d.dora);
        assert_eq!(d.gradient_checkpointing, Some(false));
        assert_eq!(d.target_modules.unwrap(), ["q_proj", "v_proj"]);
        assert!(!demo(json!({"dora": false})).unwrap().dora);
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = demo(json!({"seq_len": "long"})).unwrap_err();
        assert_eq!(e.detail.field.as_deref(), Some("seq_len"));
        assert!(
            e.detail.message.starts_with("field `seq_len`"),
            "{}",
            e.detail.message
        );
        let e = demo(json!({"seq_len": -3})).unwrap_err();
        assert_eq!(e.detail.field.as_deref(), Some("seq_len"));
    }

    #[test]
    fn unknown_and_refused_fields_are_errors_with_a_hint() {
        let e = demo(json!({"seq_length": 1})).unwrap_err();
        assert_eq!(e.detail.message, "unknown field `seq_length`");
        assert!(
            e.detail
                .hint
                .unwrap()
                .starts_with("did you mean `seq_len`?")
        );
        let e = demo(json!({"json": true})).unwrap_err();
        assert_eq!(e.detail.message, "unknown field `json`");
        assert!(demo(json!([1])).is_err());
        assert!(demo(json!({"seq_len": {"a": 1}})).is_err());
    }
}
