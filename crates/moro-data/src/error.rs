//! The one error type of dataset reading: what went wrong, where, and a hint.

use std::fmt;

/// Where in a dataset file a row is: its line (JSONL, CSV), or its place in a JSON array,
/// whose reader does not count lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    /// 1-based line of the file.
    Line(u64),
    /// 1-based record of a JSON array.
    Record(u64),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Line(n) => write!(f, "line {n}"),
            Self::Record(n) => write!(f, "record {n}"),
        }
    }
}

/// A dataset, tokenizer or template that cannot be used, with where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataError {
    pub at: Option<Position>,
    pub message: String,
    pub hint: Option<String>,
}

impl DataError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            at: None,
            message: message.into(),
            hint: None,
        }
    }

    #[must_use]
    pub fn at(mut self, at: Position) -> Self {
        self.at = Some(at);
        self
    }

    #[must_use]
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(at) => write!(f, "{at}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DataError {}
