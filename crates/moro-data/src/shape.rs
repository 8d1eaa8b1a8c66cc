//! The common fine-tuning dataset shapes, recognised from a row's keys, and each row turned
//! into a [`Sample`] the tokenizer measures. The field names are the ones TRL
//! (`trl/data_utils.py`, 0.2x: `messages`, `prompt`/`completion`, `prompt`/`chosen`/`rejected`,
//! `text`), LLaMA-Factory (`data/converter.py`: alpaca `instruction`/`input`/`output`/`system`,
//! sharegpt `conversations` of `from`/`value`) and axolotl read.

use serde_json::{Map, Value, json};

/// How the rows of a dataset are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// One text field, trained on whole (language modelling).
    Text { field: String },
    /// `instruction`, optional `input` and `system`, `output` (Stanford Alpaca).
    Alpaca,
    /// A list of `{"from", "value"}` turns (ShareGPT; `human`/`gpt`/`system`/…).
    ShareGpt { field: String },
    /// A list of OpenAI-style `{"role", "content"}` messages, tool calls included.
    Messages { field: String },
    /// `prompt` and `completion`, strings or message lists.
    PromptCompletion,
    /// `chosen` and `rejected` (with or without `prompt`), strings or message lists.
    Preference,
}

impl Shape {
    /// The names `--format` takes.
    pub const NAMES: &'static [&'static str] = &[
        "text",
        "alpaca",
        "sharegpt",
        "messages",
        "prompt-completion",
        "preference",
    ];

    /// The shape `--format NAME` (and `--field`) ask for.
    pub fn from_name(name: &str, field: Option<&str>) -> Option<Self> {
        let f = |default: &str| field.unwrap_or(default).to_owned();
        Some(match name.to_ascii_lowercase().replace('_', "-").as_str() {
            "text" => Self::Text { field: f("text") },
            "alpaca" => Self::Alpaca,
            "sharegpt" => Self::ShareGpt {
                field: f("conversations"),
            },
            "messages" | "openai" | "chatml" => Self::Messages {
                field: f("messages"),
            },
            "prompt-completion" | "completion" => Self::PromptCompletion,
            "preference" | "dpo" => Self::Preference,
            _ => return None,
        })
    }

    /// The shape a row's keys show, or `None` when they show none. With `field`, a row whose
    /// `field` is a string is text and a list of turns is a conversation.
    pub fn detect(row: &Value, field: Option<&str>) -> Option<Self> {
        let obj = row.as_object()?;
        if let Some(field) = field {
            return match obj.get(field)? {
                Value::String(_) => Some(Self::Text {
                    field: field.to_owned(),
                }),
                Value::Array(turns) => Some(conversation_shape(turns, field)),
                _ => None,
            };
        }
        let has = |k: &str| obj.contains_key(k);
        if has("chosen") && has("rejected") {
            return Some(Self::Preference);
        }
        if has("prompt") && has("completion") {
            return Some(Self::PromptCompletion);
        }
        for key in ["messages", "conversations", "conversation"] {
            if let Some(Value::Array(turns)) = obj.get(key) {
                return Some(conversation_shape(turns, key));
            }
        }
        if has("instruction") && has("output") {
            return Some(Self::Alpaca);
        }
        if matches!(obj.get("text"), Some(Value::String(_))) {
            return Some(Self::Text {
                field: "text".to_owned(),
            });
        }
        None
    }

    /// The shape as the report prints it.
    pub fn describe(&self) -> String {
        match self {
            Self::Text { field } => format!("text (field `{field}`)"),
            Self::Alpaca => "alpaca (instruction / input / output)".to_owned(),
            Self::ShareGpt { field } => format!("ShareGPT conversations (field `{field}`)"),
            Self::Messages { field } => format!("chat messages (field `{field}`)"),
            Self::PromptCompletion => "prompt / completion".to_owned(),
            Self::Preference => "preference pairs (prompt / chosen / rejected)".to_owned(),
        }
    }

    /// The short name (`--format`'s).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Text { .. } => "text",
            Self::Alpaca => "alpaca",
            Self::ShareGpt { .. } => "sharegpt",
            Self::Messages { .. } => "messages",
            Self::PromptCompletion => "prompt-completion",
            Self::Preference => "preference",
        }
    }

    /// The row as a sample of this shape, or why it is not one.
    pub fn sample(&self, row: &Value) -> Result<Sample, String> {
        let obj = row
            .as_object()
            .ok_or_else(|| format!("a row is a JSON object, not {}", kind(row)))?;
        match self {
            Self::Text { field } => Ok(Sample::Text(string_field(obj, field)?.to_owned())),
            Self::Alpaca => Ok(Sample::Instruction {
                system: optional_string(obj, "system")?.map(str::to_owned),
                instruction: string_field(obj, "instruction")?.to_owned(),
                input: optional_string(obj, "input")?
                    .unwrap_or_default()
                    .to_owned(),
                output: string_field(obj, "output")?.to_owned(),
            }),
            Self::ShareGpt { field } => {
                let turns = list_field(obj, field)?;
                let messages = turns
                    .iter()
                    .enumerate()
                    .map(|(i, t)| sharegpt_turn(t).map_err(|e| format!("`{field}`[{i}]: {e}")))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Sample::Conversation {
                    messages,
                    tools: tools(obj)?,
                })
            }
            Self::Messages { field } => {
                let messages = list_field(obj, field)?;
                for (i, m) in messages.iter().enumerate() {
                    check_message(m).map_err(|e| format!("`{field}`[{i}]: {e}"))?;
                }
                Ok(Sample::Conversation {
                    messages: messages.clone(),
                    tools: tools(obj)?,
                })
            }
            Self::PromptCompletion => Ok(Sample::PromptCompletion {
                prompt: part(obj, "prompt")?,
                completion: part(obj, "completion")?,
            }),
            Self::Preference => {
                let chosen = part(obj, "chosen")?;
                let rejected = part(obj, "rejected")?;
                match obj.get("prompt") {
                    Some(_) => Ok(Sample::Preference {
                        prompt: part(obj, "prompt")?,
                        chosen,
                        rejected,
                    }),
                    None => implicit_prompt(chosen, rejected),
                }
            }
        }
    }
}

/// One row, ready to be rendered and counted.
#[derive(Debug, Clone, PartialEq)]
pub enum Sample {
    Text(String),
    Instruction {
        system: Option<String>,
        instruction: String,
        input: String,
        output: String,
    },
    /// Messages as the chat template receives them (`role`, `content`, `tool_calls`, …);
    /// the completion is the last assistant turn.
    Conversation {
        messages: Vec<Value>,
        tools: Option<Value>,
    },
    PromptCompletion {
        prompt: Part,
        completion: Part,
    },
    Preference {
        prompt: Part,
        chosen: Part,
        rejected: Part,
    },
}

/// A prompt or a completion: plain text, or messages for the chat template.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Messages(Vec<Value>),
}

fn conversation_shape(turns: &[Value], field: &str) -> Shape {
    let sharegpt = turns
        .first()
        .and_then(Value::as_object)
        .is_some_and(|t| t.contains_key("from") && t.contains_key("value"));
    let field = field.to_owned();
    if sharegpt {
        Shape::ShareGpt { field }
    } else {
        Shape::Messages { field }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn string_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(v) => Err(format!("`{key}` is {}, not a string", kind(v))),
        None => Err(format!("no `{key}` field")),
    }
}

fn optional_string<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("`{key}` is {}, not a string", kind(v))),
    }
}

fn list_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a Vec<Value>, String> {
    match obj.get(key) {
        Some(Value::Array(a)) if a.is_empty() => Err(format!("`{key}` is an empty list")),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(format!("`{key}` is {}, not a list of turns", kind(v))),
        None => Err(format!("no `{key}` field")),
    }
}

fn part(obj: &Map<String, Value>, key: &str) -> Result<Part, String> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(Part::Text(s.clone())),
        Some(Value::Array(messages)) => {
            for (i, m) in messages.iter().enumerate() {
                check_message(m).map_err(|e| format!("`{key}`[{i}]: {e}"))?;
            }
            Ok(Part::Messages(messages.clone()))
        }
        Some(v) => Err(format!("`{key}` is {}, not a string or messages", kind(v))),
        None => Err(format!("no `{key}` field")),
    }
}

fn check_message(m: &Value) -> Result<(), String> {
    let obj = m
        .as_object()
        .ok_or_else(|| format!("a message is an object, not {}", kind(m)))?;
    match obj.get("role") {
        Some(Value::String(_)) => Ok(()),
        Some(v) => Err(format!("`role` is {}, not a string", kind(v))),
        None => Err("a message has no `role`".to_owned()),
    }
}

/// A ShareGPT turn as a message; the roles as LLaMA-Factory's `SharegptDatasetConverter`
/// maps them.
fn sharegpt_turn(turn: &Value) -> Result<Value, String> {
    let obj = turn
        .as_object()
        .ok_or_else(|| format!("a turn is an object, not {}", kind(turn)))?;
    let from = string_field(obj, "from")?;
    let value = string_field(obj, "value")?;
    let role = match from {
        "human" | "user" => "user",
        "gpt" | "assistant" | "bot" | "model" => "assistant",
        "system" => "system",
        "function_call" => "assistant",
        "observation" | "tool" | "function" => "tool",
        other => return Err(format!("unknown speaker `{other}`")),
    };
    Ok(json!({"role": role, "content": value}))
}

/// The row's `tools` (LLaMA-Factory keeps them as a JSON string).
fn tools(obj: &Map<String, Value>) -> Result<Option<Value>, String> {
    match obj.get("tools") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => serde_json::from_str(s)
            .map(Some)
            .map_err(|e| format!("`tools` is a string that is not JSON: {e}")),
        Some(v @ Value::Array(_)) => Ok(Some(v.clone())),
        Some(v) => Err(format!("`tools` is {}, not a list", kind(v))),
    }
}

/// A pair without `prompt`: the shared beginning is the prompt (TRL's
/// `extract_prompt`, `trl/data_utils.py`).
fn implicit_prompt(chosen: Part, rejected: Part) -> Result<Sample, String> {
    match (chosen, rejected) {
        (Part::Messages(c), Part::Messages(r)) => {
            let n = c.iter().zip(&r).take_while(|(a, b)| a == b).count();
            Ok(Sample::Preference {
                prompt: Part::Messages(c[..n].to_vec()),
                chosen: Part::Messages(c[n..].to_vec()),
                rejected: Part::Messages(r[n..].to_vec()),
            })
        }
        (Part::Text(c), Part::Text(r)) => {
            let n: usize = c
                .char_indices()
                .zip(r.chars())
                .take_while(|((_, a), b)| a == b)
                .last()
                .map_or(0, |((i, a), _)| i + a.len_utf8());
            Ok(Sample::Preference {
                prompt: Part::Text(c[..n].to_owned()),
                chosen: Part::Text(c[n..].to_owned()),
                rejected: Part::Text(r[n..].to_owned()),
            })
        }
        _ => Err("`chosen` and `rejected` are not both strings or both messages".to_owned()),
    }
}
