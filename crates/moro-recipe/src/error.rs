//! [`RecipeError`]: one line naming the file, position, field and what is wrong.
//!
//! `moro.yaml:4:14: field `training.micro_batch_size`: must be between 1 and 65536, got 0`.
//! The line and column are kept as fields so a caller can point an editor at them; both are
//! 1-based. Errors found on a [`Recipe`](crate::Recipe) that did not come from text (for
//! example in [`Recipe::to_job`](crate::Recipe::to_job)) have no position.

use std::fmt;

/// What kind of problem a [`RecipeError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecipeErrorKind {
    /// Not valid YAML, or not UTF-8.
    Syntax,
    /// A key moro does not know.
    UnknownField,
    /// A required key is missing.
    MissingField,
    /// A key appears twice in the same mapping.
    DuplicateField,
    /// A value of the wrong type (a string where a number goes, a float where an integer goes).
    Type,
    /// A value of the right type outside its allowed range, or inconsistent with another field.
    Value,
}

/// A recipe that cannot be read or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeError {
    /// Name shown before the position (`moro.yaml` unless set with [`Self::with_source`]).
    pub source_name: String,
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// 1-based column (in characters), when known.
    pub column: Option<u64>,
    /// Dotted path of the field (`training.micro_batch_size`, `model.target_modules[2]`), when
    /// known.
    pub field: Option<String>,
    /// What is wrong, lowercase, one line.
    pub message: String,
    /// The kind of problem.
    pub kind: RecipeErrorKind,
}

impl RecipeError {
    /// An error about a field, without a position yet.
    #[must_use]
    pub fn field(
        field: impl Into<String>,
        kind: RecipeErrorKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            source_name: "moro.yaml".to_owned(),
            line: None,
            column: None,
            field: Some(field.into()),
            message: one_line(&message.into()),
            kind,
        }
    }

    /// An error about a value of a field, without a position yet.
    #[must_use]
    pub fn value(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::field(field, RecipeErrorKind::Value, message)
    }

    /// An error with no field (a syntax error, an empty file).
    #[must_use]
    pub fn general(kind: RecipeErrorKind, message: impl Into<String>) -> Self {
        Self {
            source_name: "moro.yaml".to_owned(),
            line: None,
            column: None,
            field: None,
            message: one_line(&message.into()),
            kind,
        }
    }

    /// Sets the 1-based position.
    #[must_use]
    pub const fn at(mut self, line: u64, column: u64) -> Self {
        self.line = Some(line);
        self.column = Some(column);
        self
    }

    /// Names the file in the message (the CLI passes the path it read).
    #[must_use]
    pub fn with_source(mut self, name: impl Into<String>) -> Self {
        self.source_name = one_line(&name.into());
        self
    }
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source_name)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "field `{}`: ", one_line(field))?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for RecipeError {}

/// Escapes control characters (line breaks included) so a message stays on one line.
pub(crate) fn one_line(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_with_position_and_field() {
        let e =
            RecipeError::value("training.micro_batch_size", "must be at least 1, got 0").at(7, 21);
        assert_eq!(
            e.to_string(),
            "moro.yaml:7:21: field `training.micro_batch_size`: must be at least 1, got 0"
        );
        assert_eq!(
            e.with_source("runs/a.yaml").to_string().split(':').next(),
            Some("runs/a.yaml")
        );
    }

    #[test]
    fn display_without_position_or_field() {
        let e = RecipeError::general(RecipeErrorKind::Syntax, "the file is empty");
        assert_eq!(e.to_string(), "moro.yaml: the file is empty");
    }

    #[test]
    fn messages_stay_on_one_line() {
        let e = RecipeError::value("model.base", "bad\nvalue\u{2028}here");
        assert!(!e.to_string().contains('\n'));
        assert!(!e.to_string().contains('\u{2028}'));
        assert!(e.to_string().contains("bad\\nvalue"));
    }
}
