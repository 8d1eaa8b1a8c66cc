//! The only module that touches the YAML library (serde-saphyr and its parser, granit).
//!
//! Swapping YAML crates means rewriting this file alone. It reads text into a [`Recipe`]
//! (turning the library's errors into one-line [`RecipeError`]s that name the field path,
//! line and column), and writes a [`Recipe`] as YAML that a YAML 1.1 reader (PyYAML, which
//! axolotl and LLaMA-Factory use) loads to the same values: strings such as `yes`, `on`,
//! `3.10`, `0755`, `1e3`, `null` and `~` are quoted, floats carry a dot and a signed exponent.
//!
//! Field paths come from a walk over the parser's events that records where every key and
//! value starts: a library error's position is looked up there, and a value error found after
//! parsing ([`Recipe::validate`]) is positioned at its value.

use std::borrow::Cow;

use serde::{Serialize, Serializer};
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::{DefaultMessageFormatter, MessageFormatter};

use crate::error::{RecipeError, RecipeErrorKind};
use crate::recipe::Recipe;

/// Reads a recipe.
///
/// # Errors
/// Syntax errors, unknown or missing keys, wrong types and invalid values, each with the
/// field path, line and column.
pub fn parse(text: &str) -> Result<Recipe, RecipeError> {
    if !has_content(text) {
        return Err(RecipeError::general(
            RecipeErrorKind::Syntax,
            "the file is empty; expected a mapping with at least `model: {base: ...}`",
        )
        .at(1, 1));
    }
    let options = serde_saphyr::options! { with_snippet: false };
    let recipe: Recipe =
        serde_saphyr::from_str_with_options(text, options).map_err(|e| library_error(text, &e))?;
    recipe.validate().map_err(|e| position(text, e))?;
    Ok(recipe)
}

/// Reads a recipe from bytes that should be UTF-8.
///
/// # Errors
/// As [`parse`], and invalid UTF-8 (with the line and column where it starts).
pub fn parse_bytes(bytes: &[u8]) -> Result<Recipe, RecipeError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse(text.strip_prefix('\u{feff}').unwrap_or(text)),
        Err(e) => {
            let valid = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default();
            let line = valid.matches('\n').count() + 1;
            let column = valid.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Err(
                RecipeError::general(RecipeErrorKind::Syntax, "the file is not valid UTF-8")
                    .at(line as u64, column as u64),
            )
        }
    }
}

/// The `$schema` line every written recipe starts with (editors complete keys from it).
pub const SCHEMA_LINE: &str = concat!(
    "# yaml-language-server: $schema=",
    "https://raw.githubusercontent.com/moro-dev/moro/main/moro.schema.json"
);

/// Writes a recipe: the [`SCHEMA_LINE`], then `header_comment` as `# ` comment lines (one per
/// line of it), then the YAML.
#[must_use]
pub fn to_yaml(recipe: &Recipe, header_comment: &str) -> String {
    let mut out = String::with_capacity(1024);
    out.push_str(SCHEMA_LINE);
    out.push('\n');
    if !header_comment.is_empty() {
        for line in header_comment.split(is_yaml11_break) {
            let line = comment_safe(line.trim_end());
            if line.is_empty() {
                out.push_str("#\n");
            } else if line.starts_with('#') {
                out.push_str(&line);
                out.push('\n');
            } else {
                out.push_str("# ");
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    let options = serde_saphyr::ser_options! {
        // Multi-line strings as escaped double-quoted scalars, never `|`/`>` blocks: simpler
        // for every YAML reader and exact for trailing spaces.
        prefer_block_scalars: false,
    };
    match serde_saphyr::to_string_with_options(recipe, options) {
        Ok(body) => out.push_str(&body),
        // The serializer only fails on options or on types it cannot represent; a Recipe is
        // plain strings, numbers and maps. Keep the file a valid YAML document regardless.
        Err(e) => {
            out.push_str("# moro could not write this recipe: ");
            out.push_str(&comment_safe(&e.to_string()));
            out.push('\n');
        }
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Serializes a list of strings as a flow sequence (`[q_proj, v_proj]`).
///
/// Items that are not plain identifiers are double-quoted: in a flow collection PyYAML ends a
/// plain scalar at any of `,?[]{}`, stricter than YAML 1.2 readers.
pub(crate) fn flow_seq<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    struct Item<'a>(&'a str);
    impl Serialize for Item<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut chars = self.0.chars();
            let identifier = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if identifier {
                // Still quoted by the serializer when YAML 1.1 would read it as a bool/null.
                s.serialize_str(self.0)
            } else {
                serde_saphyr::DoubleQuoted(self.0).serialize(s)
            }
        }
    }
    let items: Vec<Item<'_>> = v.iter().map(|x| Item(x)).collect();
    serde_saphyr::FlowSeq(items).serialize(s)
}

/// Line breaks in YAML 1.1 (PyYAML also breaks lines at NEL, LS and PS).
const fn is_yaml11_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// Makes a comment line printable for PyYAML, which rejects non-printable characters
/// anywhere in the stream, comments included.
fn comment_safe(line: &str) -> String {
    line.chars()
        .map(|c| {
            let printable = matches!(c, '\t' | ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
                || c >= '\u{10000}';
            if printable && c != '\u{feff}' { c } else { '?' }
        })
        .collect()
}

/// Whether the text holds anything but blanks and comments.
fn has_content(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start_matches([' ', '\t', '\u{feff}']);
        !l.is_empty() && !l.starts_with('#')
    })
}

/// A library error as a [`RecipeError`] with the field path at its position.
fn library_error(text: &str, err: &serde_saphyr::Error) -> RecipeError {
    let inner = err.without_snippet();
    let raw = DefaultMessageFormatter.format_message(inner);
    let (line, column) = err
        .location()
        .map_or((None, None), |l| (Some(l.line()), Some(l.column())));
    let index = line.zip(column).map(|(l, c)| (Index::build(text), (l, c)));

    let Classified {
        kind,
        missing,
        message,
        wants_value,
    } = classify(&raw);
    let mut field = None;
    let mut message: Cow<'_, str> = Cow::Owned(message);
    if let Some((index, pos)) = &index {
        match kind {
            RecipeErrorKind::MissingField => {
                // The position is the start of the mapping that lacks the key.
                if let (Some(map), Some(name)) = (index.mapping_at(*pos), missing) {
                    field = Some(join(&map.path, &name));
                }
            }
            RecipeErrorKind::Syntax => {}
            _ => {
                if let Some(entry) = index.node_at(*pos) {
                    if let (true, false, Some(v)) = (wants_value, entry.is_key, &entry.scalar) {
                        message = Cow::Owned(format!("{message}, got `{}`", short(v)));
                    }
                    field = Some(entry.path.clone());
                }
            }
        }
    }
    // DoRA is a LoRA setting in PEFT (`use_dora`), not a method of its own.
    if field.as_deref() == Some("model.peft") && message.contains("variant `dora`") {
        message = Cow::Owned(format!(
            "{message} (DoRA is LoRA with magnitude vectors: `peft: lora` with `dora: true`)"
        ));
    }
    let mut e = match field {
        Some(f) if !f.is_empty() => RecipeError::field(f, kind, message),
        _ => RecipeError::general(kind, message),
    };
    if let (Some(l), Some(c)) = (line, column) {
        e = e.at(l, c);
    }
    e
}

/// A library message, sorted and reworded.
struct Classified {
    kind: RecipeErrorKind,
    /// For missing fields: the missing key.
    missing: Option<String>,
    message: String,
    /// Whether the message should end with the offending scalar (`, got `-2``).
    wants_value: bool,
}

fn classify(raw: &str) -> Classified {
    let raw = raw.trim();
    let lower = raw.to_ascii_lowercase();
    let c = |kind, message: String| Classified {
        kind,
        missing: None,
        message,
        wants_value: false,
    };
    if lower.starts_with("unknown field") {
        return c(
            RecipeErrorKind::UnknownField,
            raw.replacen("unknown field", "unknown key", 1),
        );
    }
    if lower.starts_with("missing field") {
        return Classified {
            missing: raw.split('`').nth(1).map(str::to_owned),
            ..c(RecipeErrorKind::MissingField, "is required".to_owned())
        };
    }
    if lower.starts_with("duplicate mapping key") || lower.starts_with("duplicate component") {
        return c(
            RecipeErrorKind::DuplicateField,
            "appears twice in the same mapping".to_owned(),
        );
    }
    let plain = |m: &str| Classified {
        wants_value: true,
        ..c(RecipeErrorKind::Type, m.to_owned())
    };
    match lower.as_str() {
        "invalid u64" | "invalid u32" | "invalid usize" => {
            return plain("expected a non-negative whole number");
        }
        "invalid i64" => return plain("expected a whole number"),
        "invalid f64" | "invalid f32" => return plain("expected a number"),
        "invalid bool" | "invalid boolean" => return plain("expected true or false"),
        "expected string scalar" => return plain("expected a single value, not a list or mapping"),
        "expected sequence start" => return plain("expected a list"),
        "expected mapping start" => return plain("expected a mapping"),
        _ => {}
    }
    // serde's "invalid type: string \"x\", expected y" → "expected y, got string \"x\"".
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = raw.strip_prefix(prefix)
            && let Some((got, expected)) = rest.split_once(", expected ")
        {
            return c(
                RecipeErrorKind::Type,
                format!("expected {expected}, got {got}"),
            );
        }
    }
    if lower.starts_with("invalid ")
        || lower.starts_with("unknown variant")
        || lower.starts_with("expected ")
        || lower.starts_with("cannot deserialize")
    {
        return c(RecipeErrorKind::Type, lowercase_first(raw));
    }
    c(RecipeErrorKind::Syntax, lowercase_first(raw))
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map_or_else(String::new, |f| f.to_lowercase().chain(c).collect())
}

fn short(s: &str) -> String {
    if s.chars().count() > 40 {
        let mut t: String = s.chars().take(40).collect();
        t.push('…');
        t
    } else {
        s.to_owned()
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// Positions an error found after parsing at its field's value in `text` (or, for an absent
/// field, at the nearest enclosing key that is present).
pub(crate) fn position(text: &str, err: RecipeError) -> RecipeError {
    let Some(field) = err.field.clone() else {
        return err;
    };
    let index = Index::build(text);
    let mut path = field.as_str();
    loop {
        if let Some(e) = index.value_of(path) {
            return err.at(e.line, e.column);
        }
        match path.rfind(['.', '[']) {
            Some(i) => path = &path[..i],
            None => return err,
        }
    }
}

/// Where a node starts and what it is.
#[derive(Debug, Clone)]
struct Entry {
    /// 1-based line.
    line: u64,
    /// 1-based column.
    column: u64,
    /// Dotted path (`training.micro_batch_size`, `model.target_modules[1]`; "" = root).
    path: String,
    /// Whether the node is a mapping key.
    is_key: bool,
    /// Whether the node is a mapping.
    is_mapping: bool,
    /// The scalar's text, for scalars.
    scalar: Option<String>,
}

impl Entry {
    const fn pos(&self) -> (u64, u64) {
        (self.line, self.column)
    }
}

/// Every node's start position and path, in document order (up to the first syntax error).
struct Index(Vec<Entry>);

enum Frame {
    Map {
        path: String,
        expecting_key: bool,
        key: String,
    },
    Seq {
        path: String,
        next: usize,
    },
}

impl Index {
    fn build(text: &str) -> Self {
        let mut entries = Vec::new();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let line = span.start.line() as u64;
            let column = span.start.col() as u64 + 1;
            let (scalar, is_mapping, opens) = match &event {
                Event::Scalar(v, ..) => (Some(v.to_string()), false, false),
                Event::Alias(_) => (None, false, false),
                Event::MappingStart(..) => (None, true, true),
                Event::SequenceStart(..) => (None, false, true),
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    node_done(&mut stack, None);
                    continue;
                }
                _ => continue,
            };
            let (path, is_key) = match stack.last_mut() {
                None => (String::new(), false),
                Some(Frame::Map {
                    path,
                    expecting_key: true,
                    ..
                }) => {
                    let key = scalar.clone().unwrap_or_else(|| "?".to_owned());
                    (join(path, &key), true)
                }
                Some(Frame::Map { path, key, .. }) => (join(path, key), false),
                Some(Frame::Seq { path, next }) => {
                    let p = format!("{path}[{next}]");
                    *next += 1;
                    (p, false)
                }
            };
            entries.push(Entry {
                line,
                column,
                path: path.clone(),
                is_key,
                is_mapping,
                scalar: scalar.clone(),
            });
            if opens {
                stack.push(if is_mapping {
                    Frame::Map {
                        path,
                        expecting_key: true,
                        key: String::new(),
                    }
                } else {
                    Frame::Seq { path, next: 0 }
                });
            } else {
                node_done(&mut stack, scalar);
            }
        }
        Self(entries)
    }

    /// The deepest node starting at `pos`, else the deepest of the last nodes before it.
    fn node_at(&self, pos: (u64, u64)) -> Option<&Entry> {
        let before = self.0.iter().filter(|e| e.pos() <= pos);
        let last = before.clone().map(Entry::pos).max()?;
        before
            .filter(|e| e.pos() == last)
            .max_by_key(|e| depth(&e.path))
    }

    /// The innermost mapping starting at or before `pos`.
    fn mapping_at(&self, pos: (u64, u64)) -> Option<&Entry> {
        self.0
            .iter()
            .filter(|e| e.is_mapping && e.pos() <= pos)
            .max_by_key(|e| (e.pos(), depth(&e.path)))
    }

    /// The value node at `path`, else its key.
    fn value_of(&self, path: &str) -> Option<&Entry> {
        self.0
            .iter()
            .find(|e| !e.is_key && e.path == path)
            .or_else(|| self.0.iter().find(|e| e.is_key && e.path == path))
    }
}

fn depth(path: &str) -> usize {
    path.matches(['.', '[']).count() + usize::from(!path.is_empty())
}

/// Records that the current node of the innermost collection is complete.
fn node_done(stack: &mut [Frame], scalar: Option<String>) {
    if let Some(Frame::Map {
        expecting_key, key, ..
    }) = stack.last_mut()
    {
        if *expecting_key {
            *key = scalar.unwrap_or_else(|| "?".to_owned());
        }
        *expecting_key = !*expecting_key;
    }
}
