//! Rows of a dataset file, streamed one at a time so a 20 GB file is never held whole: JSON
//! Lines, a JSON array of objects, and CSV with a header row.

use std::io::BufRead;
use std::ops::ControlFlow;

use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde_json::Value;

use crate::{DataError, Position};

/// How a dataset file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// One JSON object per line (`.jsonl`, `.ndjson`).
    Jsonl,
    /// One JSON array of objects (`.json`).
    Json,
    /// Comma-separated values with a header row (`.csv`), or tab-separated (`.tsv`).
    Csv { tab: bool },
    /// Apache Parquet (`.parquet`), the format of the Hub's dataset repositories; read with
    /// [`read_parquet`], which needs a seekable file rather than a stream.
    Parquet,
    /// Arrow IPC (`.arrow`), as the `datasets` library caches what `load_dataset` read: the
    /// streaming format it writes, or the file format.
    Arrow,
}

impl FileFormat {
    /// The format a file name's extension says, if it says one.
    pub fn from_name(name: &str) -> Option<Self> {
        let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "ndjson" => Some(Self::Jsonl),
            "json" => Some(Self::Json),
            "csv" => Some(Self::Csv { tab: false }),
            "tsv" => Some(Self::Csv { tab: true }),
            "parquet" => Some(Self::Parquet),
            "arrow" => Some(Self::Arrow),
            _ => None,
        }
    }

    /// The format the first bytes of a file show: `[` a JSON array, `{` JSON Lines.
    pub fn sniff(head: &[u8]) -> Option<Self> {
        if head.starts_with(b"PAR1") {
            return Some(Self::Parquet);
        }
        if head.starts_with(b"ARROW1") || head.starts_with(&[0xFF, 0xFF, 0xFF, 0xFF]) {
            return Some(Self::Arrow);
        }
        let first = head
            .iter()
            .copied()
            .find(|b| !(b.is_ascii_whitespace() || *b == 0xEF || *b == 0xBB || *b == 0xBF))?;
        match first {
            b'[' => Some(Self::Json),
            b'{' => Some(Self::Jsonl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Jsonl => "JSON Lines",
            Self::Json => "JSON",
            Self::Csv { tab: false } => "CSV",
            Self::Csv { tab: true } => "TSV",
            Self::Parquet => "Parquet",
            Self::Arrow => "Arrow",
        }
    }
}

/// One row: a JSON object (a CSV row becomes one with string values), and where it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub at: Position,
    pub value: Value,
}

/// Calls `each` with every row of `reader` in order, or with the error of a row that cannot
/// be read (a malformed line) so the caller decides whether it is fatal; stops early when
/// `each` breaks. A file that cannot be read on at all (an I/O error, a broken JSON array)
/// is the returned error.
pub fn read_rows<R: BufRead>(
    format: FileFormat,
    reader: R,
    mut each: impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    match format {
        FileFormat::Jsonl => read_jsonl(reader, &mut each),
        FileFormat::Json => read_json_array(reader, &mut each),
        FileFormat::Csv { tab } => read_csv(reader, tab, &mut each),
        FileFormat::Arrow => read_arrow(reader, &mut each),
        FileFormat::Parquet => Err(DataError::new(
            "a Parquet file is read from a file, not a stream (read_parquet)",
        )),
    }
}

/// Every row of an Arrow IPC stream (or file), batch by batch, as JSON objects (arrow-json;
/// null fields left out).
fn read_arrow<R: BufRead>(
    mut reader: R,
    each: &mut impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    let head = reader.fill_buf().map_err(|e| io_error(&e))?;
    if head.starts_with(b"ARROW1") {
        // The file format: its footer indexes the batches, so it needs the whole file.
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(|e| io_error(&e))?;
        let file = arrow_ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| DataError::new(format!("not an Arrow file moro can read: {e}")))?;
        return arrow_batches(file, each);
    }
    let stream = arrow_ipc::reader::StreamReader::try_new(reader, None)
        .map_err(|e| DataError::new(format!("not an Arrow stream moro can read: {e}")))?;
    arrow_batches(stream, each)
}

fn arrow_batches(
    batches: impl Iterator<Item = Result<arrow_array::RecordBatch, arrow_schema::ArrowError>>,
    each: &mut impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    let mut record = 0u64;
    for batch in batches {
        let batch = batch.map_err(|e| {
            DataError::new(format!("cannot read the Arrow batch: {e}"))
                .at(Position::Record(record + 1))
        })?;
        let mut w = arrow_json::ArrayWriter::new(Vec::new());
        w.write_batches(&[&batch])
            .and_then(|()| w.finish())
            .map_err(|e| {
                DataError::new(format!("cannot convert the Arrow batch: {e}"))
                    .at(Position::Record(record + 1))
            })?;
        let bytes = w.into_inner();
        let rows: Vec<Value> = if bytes.is_empty() {
            Vec::new()
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|e| DataError::new(format!("cannot convert the Arrow batch: {e}")))?
        };
        for value in rows {
            record += 1;
            if each(Ok(Row {
                at: Position::Record(record),
                value,
            }))
            .is_break()
            {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Every row of a Parquet file, row group by row group (parquet's record reader), as JSON:
/// nested lists and structs (a `messages` column) become lists and objects.
///
/// The parquet crate asserts on some inconsistent metadata (negative column offsets) instead
/// of returning an error; such a panic is caught, silently, and is a corrupt-file error.
pub fn read_parquet<R: parquet::file::reader::ChunkReader + 'static>(
    file: R,
    mut each: impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    crate::contain::contained(|| read_parquet_rows(file, &mut each)).unwrap_or_else(|| {
        Err(DataError::new(
            "the Parquet file is corrupt (its metadata is inconsistent)",
        ))
    })
}

fn read_parquet_rows<R: parquet::file::reader::ChunkReader + 'static>(
    file: R,
    each: &mut impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .map_err(|e| DataError::new(format!("not a Parquet file moro can read: {e}")))?;
    crate::parquet_pages::check(&file, &metadata)
        .map_err(|e| DataError::new(format!("the Parquet file is corrupt: {e}")))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| DataError::new(format!("not a Parquet file moro can read: {e}")))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| DataError::new(format!("cannot read the Parquet rows: {e}")))?;
    for (i, row) in rows.enumerate() {
        let at = Position::Record(i as u64 + 1);
        let row = match row {
            Ok(r) => Ok(Row {
                at,
                value: r.to_json_value(),
            }),
            Err(e) => Err(DataError::new(format!("cannot read the row: {e}")).at(at)),
        };
        let failed = row.is_err();
        if each(row).is_break() || failed {
            return Ok(());
        }
    }
    Ok(())
}

fn io_error(e: &std::io::Error) -> DataError {
    DataError::new(format!("cannot read: {e}"))
}

fn read_jsonl<R: BufRead>(
    mut reader: R,
    each: &mut impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| io_error(&e).at(Position::Line(line + 1)))?;
        if n == 0 {
            return Ok(());
        }
        line += 1;
        let mut text: &[u8] = &buf;
        if line == 1 {
            text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = Position::Line(line);
        let row = match serde_json::from_slice::<Value>(text) {
            Ok(value) => Ok(Row { at, value }),
            Err(e) => Err(DataError::new(format!("not JSON: {}", json_reason(&e))).at(at)),
        };
        if each(row).is_break() {
            return Ok(());
        }
    }
}

/// serde_json's message without its own " at line 1 column N" (the line is ours).
fn json_reason(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

fn read_json_array<R: BufRead>(
    reader: R,
    each: &mut impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    struct Records<'a, F>(&'a mut F);
    impl<'de, F: FnMut(Result<Row, DataError>) -> ControlFlow<()>> Visitor<'de> for Records<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of records")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut record = 0u64;
            while let Some(value) = seq.next_element::<Value>()? {
                record += 1;
                let row = Row {
                    at: Position::Record(record),
                    value,
                };
                if (self.0)(Ok(row)).is_break() {
                    // The rest is not read; a caller that stops early wants no more.
                    return Err(serde::de::Error::custom(STOPPED));
                }
            }
            Ok(())
        }
    }
    const STOPPED: &str = "moro: stopped early";
    let mut de = serde_json::Deserializer::from_reader(reader);
    match de.deserialize_seq(Records(each)) {
        Ok(()) => Ok(()),
        Err(e) if e.to_string().starts_with(STOPPED) => Ok(()),
        Err(e) if e.is_io() => Err(DataError::new(format!("cannot read: {e}"))),
        Err(e) => Err(
            DataError::new(format!("not a JSON array of records: {}", json_reason(&e)))
                .at(Position::Line(e.line() as u64))
                .hint(
                    "a .json dataset is one array `[{...}, {...}]`; one object per line is .jsonl",
                ),
        ),
    }
}

fn read_csv<R: BufRead>(
    reader: R,
    tab: bool,
    each: &mut impl FnMut(Result<Row, DataError>) -> ControlFlow<()>,
) -> Result<(), DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(if tab { b'\t' } else { b',' })
        .flexible(false)
        .from_reader(reader);
    let headers = match rdr.headers() {
        Ok(h) => h.clone(),
        Err(e) => {
            return Err(DataError::new(format!("no header row: {e}")).at(Position::Line(1)));
        }
    };
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {
                let line = record.position().map_or(0, csv::Position::line);
                let value: serde_json::Map<String, Value> = headers
                    .iter()
                    .zip(record.iter())
                    .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
                    .collect();
                let row = Row {
                    at: Position::Line(line),
                    value: Value::Object(value),
                };
                if each(Ok(row)).is_break() {
                    return Ok(());
                }
            }
            Err(e) => {
                let line = e.position().map_or(0, csv::Position::line);
                if let csv::ErrorKind::Io(io) = e.kind() {
                    return Err(io_error(io).at(Position::Line(line)));
                }
                let row = Err(DataError::new(format!("bad CSV row: {e}")).at(Position::Line(line)));
                if each(row).is_break() {
                    return Ok(());
                }
                if !matches!(
                    e.kind(),
                    csv::ErrorKind::UnequalLengths { .. } | csv::ErrorKind::Utf8 { .. }
                ) {
                    return Ok(());
                }
            }
        }
    }
}
