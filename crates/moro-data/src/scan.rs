//! One pass over a dataset: rows streamed from the reader in chunks, each chunk tokenized on
//! all cores, only the lengths kept.

use std::io::BufRead;
use std::ops::ControlFlow;

use rayon::prelude::*;
use serde_json::Value;

use crate::rows::read_rows;
use crate::{DataError, FileFormat, ModelTokenizer, Position, Shape};

/// Rows tokenized together (enough to keep every core busy, few enough to stay small).
const CHUNK: usize = 4096;
/// Malformed rows kept with their message; the rest are counted.
const KEEP_MALFORMED: usize = 50;

/// How to read the dataset.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// The shape, or `None` to recognise it from the first row.
    pub shape: Option<Shape>,
    /// The field holding the text or the conversation (`--field`).
    pub field: Option<String>,
    /// A malformed row is an error, not a counted and reported row.
    pub strict: bool,
    /// Read at most this many rows.
    pub limit: Option<u64>,
}

/// A row that is not a sample of the dataset's shape, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Malformed {
    pub at: Position,
    pub message: String,
}

/// The lengths of every sample, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Scan {
    pub shape: Shape,
    /// Each sample's tokens.
    pub tokens: Vec<u32>,
    /// Each sample's prompt tokens, where the shape has a prompt (same order as `tokens`).
    pub prompt: Option<Vec<u32>>,
    /// The first malformed rows.
    pub malformed: Vec<Malformed>,
    pub malformed_count: u64,
}

/// Reads, recognises and tokenizes the dataset; `progress` is called with the rows done.
pub fn scan<R: BufRead>(
    reader: R,
    format: FileFormat,
    tokenizer: &ModelTokenizer,
    options: &ScanOptions,
    progress: impl FnMut(u64),
) -> Result<Scan, DataError> {
    scan_rows(
        |each| read_rows(format, reader, each),
        tokenizer,
        options,
        progress,
    )
}

/// A row source: calls its argument with every row in order until told to stop.
pub type RowSink<'a> = dyn FnMut(Result<crate::Row, DataError>) -> ControlFlow<()> + 'a;

/// [`scan`] over any source of rows (a Parquet file, a reader of another format).
pub fn scan_rows(
    source: impl FnOnce(&mut RowSink<'_>) -> Result<(), DataError>,
    tokenizer: &ModelTokenizer,
    options: &ScanOptions,
    mut progress: impl FnMut(u64),
) -> Result<Scan, DataError> {
    let mut state = State {
        shape: options.shape.clone(),
        tokens: Vec::new(),
        prompt: Vec::new(),
        has_prompt: None,
        malformed: Vec::new(),
        malformed_count: 0,
        fatal: None,
    };
    // Rows and unreadable lines in file order, so malformed rows are listed in order.
    let mut chunk: Vec<(Position, Result<Value, String>)> = Vec::with_capacity(CHUNK);
    let mut read = 0u64;
    source(&mut |row| {
        if options.limit.is_some_and(|l| read >= l) {
            return ControlFlow::Break(());
        }
        read += 1;
        match row {
            Ok(row) => chunk.push((row.at, Ok(row.value))),
            Err(e) => chunk.push((e.at.unwrap_or(Position::Line(read)), Err(e.message))),
        }
        if chunk.len() == CHUNK {
            state.run(&chunk, tokenizer, options);
            chunk.clear();
            progress(read);
        }
        if state.fatal.is_some() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    if state.fatal.is_none() {
        state.run(&chunk, tokenizer, options);
        progress(read);
    }
    if let Some(e) = state.fatal {
        return Err(e);
    }
    let Some(shape) = state.shape else {
        return Err(DataError::new("the dataset has no rows").hint(if state.malformed_count > 0 {
            "every row is malformed; see the first with --strict"
        } else {
            "a dataset is one JSON object per line (.jsonl), a JSON array (.json) or a CSV with a header row"
        }));
    };
    if state.tokens.is_empty() {
        return Err(DataError::new(format!(
            "no row of the dataset is a sample ({} malformed; the first: {}: {})",
            state.malformed_count,
            state
                .malformed
                .first()
                .map_or_else(String::new, |m| m.at.to_string()),
            state.malformed.first().map_or("", |m| m.message.as_str()),
        )));
    }
    Ok(Scan {
        shape,
        prompt: state.has_prompt.unwrap_or(false).then_some(state.prompt),
        tokens: state.tokens,
        malformed: state.malformed,
        malformed_count: state.malformed_count,
    })
}

struct State {
    shape: Option<Shape>,
    tokens: Vec<u32>,
    prompt: Vec<u32>,
    has_prompt: Option<bool>,
    malformed: Vec<Malformed>,
    malformed_count: u64,
    fatal: Option<DataError>,
}

impl State {
    fn malformed(&mut self, at: Position, message: String, strict: bool) {
        if strict {
            self.fatal.get_or_insert_with(|| {
                DataError::new(message.clone())
                    .at(at)
                    .hint("without --strict, malformed rows are counted and listed")
            });
            return;
        }
        self.malformed_count += 1;
        if self.malformed.len() < KEEP_MALFORMED {
            self.malformed.push(Malformed { at, message });
        }
    }

    fn run(
        &mut self,
        chunk: &[(Position, Result<Value, String>)],
        tokenizer: &ModelTokenizer,
        options: &ScanOptions,
    ) {
        if chunk.is_empty() || self.fatal.is_some() {
            return;
        }
        if self.shape.is_none()
            && let Some((at, Ok(first))) = chunk.iter().find(|(_, r)| r.is_ok())
        {
            match Shape::detect(first, options.field.as_deref()) {
                Some(s) => self.shape = Some(s),
                None => {
                    self.fatal = Some(unknown_shape(*at, first, options.field.as_deref()));
                    return;
                }
            }
        }
        let Some(shape) = self.shape.clone() else {
            for (at, row) in chunk {
                if let Err(message) = row {
                    self.malformed(*at, message.clone(), options.strict);
                }
            }
            return;
        };
        let measured: Vec<Result<_, String>> = chunk
            .par_iter()
            .map(|(_, row)| {
                let value = row.as_ref().map_err(Clone::clone)?;
                shape.sample(value).and_then(|s| tokenizer.measure(&s))
            })
            .collect();
        for ((at, _), m) in chunk.iter().zip(measured) {
            match m {
                Ok(l) => {
                    self.tokens.push(l.tokens);
                    self.prompt.push(l.prompt.unwrap_or(0));
                    *self.has_prompt.get_or_insert(l.prompt.is_some()) &= l.prompt.is_some();
                }
                Err(message) => self.malformed(*at, message, options.strict),
            }
            if self.fatal.is_some() {
                return;
            }
        }
    }
}

fn unknown_shape(at: Position, value: &Value, field: Option<&str>) -> DataError {
    let keys: Vec<&str> = value
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let what = if value.is_object() {
        format!(
            "keys: {}",
            if keys.is_empty() {
                "none".to_owned()
            } else {
                keys.join(", ")
            }
        )
    } else {
        "it is not a JSON object".to_owned()
    };
    let message = match field {
        Some(f) => format!("the first row's `{f}` is neither text nor a list of turns ({what})"),
        None => format!("cannot tell the dataset's shape from its first row ({what})"),
    };
    DataError::new(message).at(at).hint(format!(
        "choose it with --format ({}) and --field NAME",
        Shape::NAMES.join(", ")
    ))
}
