//! A dataset whose length distribution is known by construction (a word-level tokenizer: one
//! token per word) comes out exact: counts, percentiles to the token, truncation and packing
//! by hand.

use std::io::Cursor;

use moro_data::stats::{histogram, packing, truncation};
use moro_data::{
    Date, FileFormat, LengthSummary, ModelTokenizer, Position, ScanOptions, Shape, scan,
};
use serde_json::json;

const DAY: Date = Date {
    year: 2026,
    month: 12,
    day: 2,
};

/// One token per whitespace-separated word ("w"), `</s>` as EOS, a ChatML-like template.
fn word_tokenizer(template: Option<&str>) -> ModelTokenizer {
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 2, "content": "</s>", "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "w": 1, "</s>": 2, "<t>": 3}, "unk_token": "[UNK]"}
    });
    let mut config = json!({"eos_token": "</s>"});
    if let Some(t) = template {
        config["chat_template"] = json!(t);
    }
    ModelTokenizer::from_bytes(
        tokenizer.to_string().as_bytes(),
        Some(config.to_string().as_bytes()),
        None,
        DAY,
    )
    .unwrap()
}

/// The scan of JSON Lines `text` with the default options.
fn jsonl(text: impl AsRef<[u8]>, tok: &ModelTokenizer) -> moro_data::Scan {
    scan(
        Cursor::new(text.as_ref()),
        FileFormat::Jsonl,
        tok,
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap()
}

fn words(n: u32) -> String {
    vec!["w"; n as usize].join(" ")
}

/// Lengths 1..=1000 in a scrambled order (a fixed permutation: 7919 is prime to 1000).
fn lengths() -> Vec<u32> {
    (0..1000u32).map(|i| (i * 7919) % 1000 + 1).collect()
}

#[test]
fn text_lengths_are_exact() {
    // Each row is k − 1 words; TRL appends the EOS, so the sample is k tokens.
    let file: String = lengths()
        .iter()
        .map(|&k| format!("{}\n", json!({"text": words(k - 1)})))
        .collect();
    let tok = word_tokenizer(None);
    let s = jsonl(file, &tok);
    assert_eq!(
        s.shape,
        Shape::Text {
            field: "text".into()
        }
    );
    assert_eq!(s.malformed_count, 0);
    let sum = LengthSummary::of(&s.tokens).unwrap();
    // Nearest rank over 1..=1000: the p-th percentile is 10·p.
    assert_eq!(
        (
            sum.count, sum.min, sum.p50, sum.p90, sum.p95, sum.p99, sum.max
        ),
        (1000, 1, 500, 900, 950, 990, 1000)
    );
    assert_eq!(sum.total_tokens, 500_500);
    assert!((sum.mean - 500.5).abs() < 1e-9);
    // At 512: the 488 samples of 513…1000 tokens lose 1 + 2 + … + 488 = 119,316 tokens.
    let t = truncation(&s.tokens, None, 512);
    assert_eq!(
        (t.samples, t.tokens_cut, t.loss_tokens_cut),
        (488, 119_316, 119_316)
    );
    // Wrapped: ceil(500,500 / 1024) = 489 sequences. Best fit decreasing: 1000…513 open 488
    // sequences with 24…511 tokens free, 512 opens one more, 511…24 each fill the sequence
    // with exactly their room, and 23 + 22 + … + 1 = 276 go into 512's: 489.
    let p = packing(&s.tokens, 1024);
    assert_eq!((p.wrapped, p.best_fit), (489, 489));
    let mut sorted = s.tokens.clone();
    sorted.sort_unstable();
    let h = histogram(&sorted);
    // ≤ 64: 64 samples; (64, 128]: 64; (128, 256]: 128; (256, 512]: 256; (512, 1024]: 488.
    let bars: Vec<u64> = h.iter().map(|b| b.samples).collect();
    assert_eq!(bars, vec![64, 64, 128, 256, 488]);
}

#[test]
fn conversations_split_prompt_and_completion() {
    // The template writes each message as its words followed by <t>; the generation prompt is
    // one <t>. A user turn of u words and an answer of a words: whole = u + 1 + a + 1 tokens,
    // prompt = u + 1 + 1.
    let template = "{% for m in messages %}{{ m.content }} <t> {% endfor %}{% if add_generation_prompt %}<t>{% endif %}";
    let tok = word_tokenizer(Some(template));
    let rows = [(3, 5), (10, 1), (1, 40)];
    let file: String = rows
        .iter()
        .map(|&(u, a)| {
            let m = json!({"messages": [{"role": "user", "content": words(u)}, {"role": "assistant", "content": words(a)}]});
            format!("{m}\n")
        })
        .collect();
    let s = jsonl(file, &tok);
    assert_eq!(
        s.shape,
        Shape::Messages {
            field: "messages".into()
        }
    );
    assert_eq!(s.tokens, vec![3 + 5 + 2, 10 + 1 + 2, 1 + 40 + 2]);
    assert_eq!(s.prompt.unwrap(), vec![3 + 2, 10 + 2, 1 + 2]);
}

#[test]
fn alpaca_and_sharegpt_are_recognised() {
    let template = "{% for m in messages %}{{ m.content }} <t> {% endfor %}{% if add_generation_prompt %}<t>{% endif %}";
    let tok = word_tokenizer(Some(template));
    let alpaca = format!(
        "{}\n",
        json!({"instruction": words(2), "input": words(3), "output": words(4)})
    );
    let s = jsonl(alpaca, &tok);
    assert_eq!(s.shape, Shape::Alpaca);
    // user = instruction "\n" input (5 words), then <t>; answer 4 words and <t>.
    assert_eq!(
        (s.tokens[0], s.prompt.as_ref().unwrap()[0]),
        (5 + 1 + 4 + 1, 5 + 1 + 1)
    );
    let sharegpt = json!([{"conversations": [{"from": "human", "value": words(2)}, {"from": "gpt", "value": words(6)}]}]).to_string();
    let s = scan(
        Cursor::new(sharegpt),
        FileFormat::Json,
        &tok,
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap();
    assert_eq!(
        s.shape,
        Shape::ShareGpt {
            field: "conversations".into()
        }
    );
    assert_eq!(s.tokens, vec![2 + 1 + 6 + 1]);
}

#[test]
fn preference_pairs_take_the_longer_answer() {
    let tok = word_tokenizer(None);
    let row = json!({"prompt": words(4), "chosen": words(2), "rejected": words(7)});
    let s = jsonl(format!("{row}\n"), &tok);
    assert_eq!(s.shape, Shape::Preference);
    // prompt 4, the rejected answer 7 + EOS.
    assert_eq!((s.tokens[0], s.prompt.unwrap()[0]), (4 + 8, 4));
}

#[test]
fn malformed_rows_are_reported_with_their_line_and_fatal_under_strict() {
    let tok = word_tokenizer(None);
    let file = "{\"text\": \"w w\"}\n\n{\"text\": 3}\n{not json\n{\"text\": \"w\"}\n";
    let s = jsonl(file, &tok);
    assert_eq!(s.tokens, vec![3, 2]);
    assert_eq!(s.malformed_count, 2);
    assert_eq!(s.malformed[0].at, Position::Line(3));
    assert_eq!(s.malformed[0].message, "`text` is a number, not a string");
    assert_eq!(s.malformed[1].at, Position::Line(4));
    let strict = ScanOptions {
        strict: true,
        ..ScanOptions::default()
    };
    let e = scan(Cursor::new(file), FileFormat::Jsonl, &tok, &strict, |_| {}).unwrap_err();
    assert_eq!(e.to_string(), "line 3: `text` is a number, not a string");
}

#[test]
fn an_unknown_shape_names_the_keys() {
    let tok = word_tokenizer(None);
    let e = scan(
        Cursor::new("{\"question\": \"w\", \"answer\": \"w\"}\n"),
        FileFormat::Jsonl,
        &tok,
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 1: cannot tell the dataset's shape from its first row (keys: question, answer)"
    );
    assert!(e.hint.unwrap().contains("--format"));
    let csv = "question,answer\nw w,w\n";
    let opts = ScanOptions {
        field: Some("question".into()),
        ..ScanOptions::default()
    };
    let s = scan(
        Cursor::new(csv),
        FileFormat::Csv { tab: false },
        &tok,
        &opts,
        |_| {},
    )
    .unwrap();
    assert_eq!(s.tokens, vec![3]);
}

fn parquet(name: &str, tok: &ModelTokenizer) -> moro_data::Scan {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let file = std::fs::File::open(path).unwrap();
    moro_data::scan_rows(
        |each| moro_data::rows::read_parquet(file, each),
        tok,
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap()
}

#[test]
fn parquet_files_as_pyarrow_writes_them() {
    // tests/fixtures/make_fixtures.py: text rows of k − 1 words for k = 1…200 (snappy, row
    // groups of 64), chat messages as a list of structs (zstd), alpaca with a null input.
    let tok = word_tokenizer(None);
    let s = parquet("text.parquet", &tok);
    assert_eq!(
        s.shape,
        Shape::Text {
            field: "text".into()
        }
    );
    let sum = LengthSummary::of(&s.tokens).unwrap();
    // Nearest rank over 1…200: p50 is the 100th, p99 the 198th.
    assert_eq!((sum.count, sum.p50, sum.p99, sum.max), (200, 100, 198, 200));
    let template = "{% for m in messages %}{{ m.content }} <t> {% endfor %}{% if add_generation_prompt %}<t>{% endif %}";
    let tok = word_tokenizer(Some(template));
    let s = parquet("messages.parquet", &tok);
    assert_eq!(
        s.shape,
        Shape::Messages {
            field: "messages".into()
        }
    );
    assert_eq!(s.tokens, vec![10, 13, 43]);
    let s = parquet("alpaca.parquet", &tok);
    assert_eq!(s.shape, Shape::Alpaca);
    // "w w\nw w w" + <t> + 4 + <t>; "w w w w" + <t> + 1 + <t>.
    assert_eq!(s.tokens, vec![11, 7]);
    assert_eq!(s.prompt.unwrap(), vec![7, 6]);
}

fn arrow(name: &str, tok: &ModelTokenizer) -> moro_data::Scan {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    scan(
        file,
        FileFormat::Arrow,
        tok,
        &ScanOptions::default(),
        |_| {},
    )
    .unwrap()
}

#[test]
fn arrow_as_the_datasets_cache_writes_it() {
    // The messages of make_fixtures.py as an IPC stream in batches of 2, the 200 text rows as
    // an Arrow file.
    let template = "{% for m in messages %}{{ m.content }} <t> {% endfor %}{% if add_generation_prompt %}<t>{% endif %}";
    let tok = word_tokenizer(Some(template));
    let s = arrow("messages.arrow", &tok);
    assert_eq!(
        s.shape,
        Shape::Messages {
            field: "messages".into()
        }
    );
    assert_eq!(s.tokens, vec![10, 13, 43]);
    let s = arrow("text-file.arrow", &word_tokenizer(None));
    let sum = LengthSummary::of(&s.tokens).unwrap();
    assert_eq!((sum.count, sum.p50, sum.p99, sum.max), (200, 100, 198, 200));
}

#[test]
fn a_corrupt_parquet_file_is_an_error_not_a_panic() {
    // Found by the dataset_rows fuzz target: metadata with a negative column offset, on which
    // parquet 60 asserts.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fuzz/parquet-negative-column-offset.parquet");
    let bytes = std::fs::read(path).unwrap();
    let r = moro_data::rows::read_parquet(bytes::Bytes::from(bytes), |_| {
        std::ops::ControlFlow::Continue(())
    });
    let e = r.unwrap_err();
    assert!(
        e.message.starts_with("the Parquet file is corrupt")
            || e.message.starts_with("cannot read"),
        "{e}"
    );
}

#[test]
fn a_parquet_page_claiming_gigabytes_is_refused_before_it_is_read() {
    // Found by the dataset_rows fuzz target: 6,772 bytes whose third chunk's page header
    // claims 2^31 - 25 uncompressed bytes (a varint padded with continuation bytes, which
    // parquet 60.1 reads and then reserves, 2.1 GB resident, before decompressing). The
    // check refuses the file before any page is read.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fuzz/parquet-page-claims-2gib.parquet");
    let bytes = std::fs::read(path).unwrap();
    let mut rows = 0;
    let r = moro_data::rows::read_parquet(bytes::Bytes::from(bytes), |_| {
        rows += 1;
        std::ops::ControlFlow::Continue(())
    });
    let e = r.unwrap_err();
    assert!(
        e.message.starts_with("the Parquet file is corrupt: a page"),
        "{e}"
    );
    assert_eq!(rows, 0, "nothing is read from a file that fails the check");

    // The same check by hand: text.parquet (pyarrow) reads whole; with its first page's
    // uncompressed size (bytes 7-8, the varint 0x82 0x42 = zigzag 4,225) raised to 8,191
    // (0xfe 0x7f) it claims more than its column chunk's 4,452 bytes.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text.parquet");
    let mut bytes = std::fs::read(path).unwrap();
    let count = |b: &[u8]| {
        let mut n = 0;
        let r = moro_data::rows::read_parquet(bytes::Bytes::from(b.to_vec()), |_| {
            n += 1;
            std::ops::ControlFlow::Continue(())
        });
        (r, n)
    };
    assert_eq!(count(&bytes).1, 200);
    assert_eq!(bytes[4..9], [0x15, 0x04, 0x15, 0x82, 0x42]);
    bytes[7..9].copy_from_slice(&[0xfe, 0x7f]);
    let (r, n) = count(&bytes);
    assert_eq!(n, 0);
    assert_eq!(
        r.unwrap_err().message,
        "the Parquet file is corrupt: a page claims 8191 uncompressed bytes where its column \
         chunk holds 4452 (and moro reads pages of at most 256 MiB)"
    );
}

#[test]
fn a_malformed_tokenizer_json_is_an_error_not_a_panic() {
    // Found by the tokenizer_files fuzz target (first byte: the config's length, then the
    // config, then tokenizer.json): a decoder tokenizers 0.22 unwraps.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fuzz/tokenizer-malformed-decoder.bin");
    let data = std::fs::read(path).unwrap();
    let at = usize::from(data[0]).min(data.len() - 1);
    let (config, tokenizer) = data[1..].split_at(at);
    let e = ModelTokenizer::from_bytes(tokenizer, Some(config), None, DAY).unwrap_err();
    assert!(
        e.message.starts_with("tokenizer.json does not load")
            || e.message.starts_with("tokenizer_config.json"),
        "{e}"
    );
}
