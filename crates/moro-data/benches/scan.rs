//! Tokenizing a dataset: rows per second of `scan` for plain text and for chat messages, at two
//! sizes to show the cost grows linearly (a word-level tokenizer, so the figure is moro's
//! reading, rendering and bookkeeping rather than one vocabulary's BPE).

use std::io::Cursor;

use moro_data::{Date, FileFormat, ModelTokenizer, ScanOptions, scan};
use serde_json::json;

fn main() {
    divan::main();
}

fn tokenizer() -> ModelTokenizer {
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "w": 1, "<t>": 2}, "unk_token": "[UNK]"}
    });
    let config = json!({"chat_template": "{% for m in messages %}<t> {{ m.role }} {{ m.content }} {% endfor %}{% if add_generation_prompt %}<t> assistant{% endif %}"});
    ModelTokenizer::from_bytes(
        tokenizer.to_string().as_bytes(),
        Some(config.to_string().as_bytes()),
        None,
        Date {
            year: 2026,
            month: 12,
            day: 2,
        },
    )
    .expect("tokenizer")
}

fn words(n: usize) -> String {
    vec!["w"; n].join(" ")
}

fn text_rows(n: usize) -> String {
    (0..n)
        .map(|i| format!("{}\n", json!({"text": words(50 + i % 200)})))
        .collect()
}

fn chat_rows(n: usize) -> String {
    (0..n)
        .map(|i| {
            let m = json!({"messages": [{"role": "user", "content": words(20 + i % 50)}, {"role": "assistant", "content": words(30 + i % 150)}]});
            format!("{m}\n")
        })
        .collect()
}

#[divan::bench(args = [10_000, 40_000], sample_count = 10)]
fn text(bencher: divan::Bencher, rows: usize) {
    let tok = tokenizer();
    let data = text_rows(rows);
    bencher
        .counter(divan::counter::ItemsCount::new(rows))
        .bench(|| {
            scan(
                Cursor::new(data.as_bytes()),
                FileFormat::Jsonl,
                &tok,
                &ScanOptions::default(),
                |_| {},
            )
            .expect("scan")
        });
}

#[divan::bench(args = [10_000, 40_000], sample_count = 10)]
fn chat(bencher: divan::Bencher, rows: usize) {
    let tok = tokenizer();
    let data = chat_rows(rows);
    bencher
        .counter(divan::counter::ItemsCount::new(rows))
        .bench(|| {
            scan(
                Cursor::new(data.as_bytes()),
                FileFormat::Jsonl,
                &tok,
                &ScanOptions::default(),
                |_| {},
            )
            .expect("scan")
        });
}
