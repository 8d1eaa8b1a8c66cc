//! The libFuzzer corpora of moro-data's targets (`fuzz/corpus/`, minimized), replayed in a
//! debug build, where integer overflow panics, and held to more than the targets ask: every
//! error that reaches a user is one non-empty line.

use std::cell::Cell;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use moro_core::formats::gguf::parse_header_keeping;
use moro_data::gguf_vocab::WHOLE_ARRAYS;
use moro_data::rows::{read_parquet, read_rows};
use moro_data::{DataError, Date, FileFormat, ModelTokenizer, Shape};

const DAY: Date = Date {
    year: 2026,
    month: 12,
    day: 5,
};

/// Every input of `target`'s corpus, at least `min` of them.
fn corpus(target: &str, min: usize) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../fuzz/corpus/{target}"));
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    out.sort();
    assert!(
        out.len() >= min,
        "{} inputs in {}",
        out.len(),
        dir.display()
    );
    out
}

thread_local! {
    static ERRORS_SEEN: Cell<usize> = const { Cell::new(0) };
}

fn assert_one_line(e: &DataError, input: &Path) {
    ERRORS_SEEN.with(|n| n.set(n.get() + 1));
    let text = e.to_string();
    assert!(
        !e.message.trim().is_empty() && !text.contains('\n'),
        "{}: the error is not one line: {text:?}",
        input.display()
    );
}

/// The errors checked on this test's thread, so a corpus that no longer reaches them fails.
fn errors_seen() -> usize {
    ERRORS_SEEN.with(Cell::get)
}

#[test]
fn dataset_rows_corpus() {
    for (path, data) in corpus("dataset_rows", 1000) {
        for format in [
            FileFormat::Jsonl,
            FileFormat::Json,
            FileFormat::Csv { tab: false },
        ] {
            let mut shape: Option<Shape> = None;
            let read = read_rows(format, data.as_slice(), |row| {
                match row {
                    Ok(row) => {
                        if shape.is_none() {
                            shape = Shape::detect(&row.value, None);
                        }
                        if let Some(s) = &shape {
                            let _ = s.sample(&row.value);
                        }
                    }
                    Err(e) => assert_one_line(&e, &path),
                }
                ControlFlow::Continue(())
            });
            if let Err(e) = read {
                assert_one_line(&e, &path);
            }
        }
        let _ = FileFormat::sniff(&data);
        let read = read_parquet(bytes::Bytes::from(data), |row| {
            if let Err(e) = &row {
                assert_one_line(e, &path);
            }
            ControlFlow::Continue(())
        });
        if let Err(e) = read {
            assert_one_line(&e, &path);
        }
    }
    assert!(errors_seen() > 1000, "{} errors checked", errors_seen());
}

#[test]
fn tokenizer_files_corpus() {
    for (path, data) in corpus("tokenizer_files", 1000) {
        // As the target reads it: the first byte is the length of tokenizer_config.json.
        let Some((&cut, rest)) = data.split_first() else {
            continue;
        };
        let (config, tokenizer) = rest.split_at(usize::from(cut).min(rest.len()));
        match ModelTokenizer::from_bytes(tokenizer, Some(config), None, DAY) {
            Ok(tok) => {
                let _ = tok.encode("Hello world, 日本語 🙂", true);
            }
            Err(e) => assert_one_line(&e, &path),
        }
    }
    assert!(errors_seen() > 100, "{} errors checked", errors_seen());
}

#[test]
fn gguf_vocab_corpus() {
    for (path, data) in corpus("gguf_vocab", 500) {
        let Ok(header) = parse_header_keeping(&data, &WHOLE_ARRAYS) else {
            continue;
        };
        match ModelTokenizer::from_gguf(&header, None, DAY) {
            Ok(tok) => {
                let _ = tok.encode("Hello world, 日本語 🙂 <s>\n\t  x", true);
            }
            Err(e) => assert_one_line(&e, &path),
        }
    }
    assert!(errors_seen() > 100, "{} errors checked", errors_seen());
}
