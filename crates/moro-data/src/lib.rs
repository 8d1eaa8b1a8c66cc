//! Token lengths of a fine-tuning dataset, measured the way training will tokenize it: rows
//! read from JSONL, JSON or CSV (streamed, any `BufRead`), recognised as one of the common
//! fine-tuning shapes, rendered with the model's chat template and counted with its
//! `tokenizer.json`. [`stats`] turns the lengths into the figures `max_seq_length` is sized
//! from. Files and paths stay with the caller; everything here reads from readers and bytes.

mod contain;
mod error;
pub mod gguf_vocab;
mod parquet_pages;
pub mod rows;
pub mod scan;
pub mod shape;
pub mod stats;
pub mod template;
pub mod tokenizer;

pub use error::{DataError, Position};
pub use rows::{FileFormat, Row};
pub use scan::{Malformed, RowSink, Scan, ScanOptions, scan, scan_rows};
pub use shape::{Part, Sample, Shape};
pub use stats::{Bucket, LengthSummary, Packing, Permille, Truncation};
pub use template::{ChatTemplate, Date, SpecialTokens};
pub use tokenizer::{ModelTokenizer, SampleLengths};
