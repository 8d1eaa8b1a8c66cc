//! `moro data stats`, `recipe generate --dataset` and `estimate --dataset` on datasets whose
//! token lengths are known by construction: a word-level tokenizer counts one token per word
//! and TRL appends one EOS, so a row of k − 1 words is k tokens.

mod common;

use std::path::Path;

use common::{json_of, moro};
use serde_json::json;

/// A model directory: Qwen2.5-0.5B's config.json (from the catalog) and a word-level
/// tokenizer with `</s>` as EOS and a template that ends each message with `<t>`.
fn model_dir(dir: &Path, template: &str) -> std::path::PathBuf {
    let m = dir.join("model");
    std::fs::create_dir_all(&m).unwrap();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/models/Qwen--Qwen2.5-0.5B.json"
    );
    std::fs::copy(config, m.join("config.json")).unwrap();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 2, "content": "</s>", "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "w": 1, "</s>": 2, "<t>": 3}, "unk_token": "[UNK]"}
    });
    std::fs::write(m.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({"eos_token": "</s>", "chat_template": template});
    std::fs::write(m.join("tokenizer_config.json"), config.to_string()).unwrap();
    m
}

const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }} <t> {% endfor %}{% if add_generation_prompt %}<t>{% endif %}";

fn words(n: usize) -> String {
    vec!["w"; n].join(" ")
}

/// 990 samples of 100 tokens and a tail of 10 of 5,000: the p99 is 100.
fn long_tail(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tail.jsonl");
    let mut text = String::new();
    for i in 0..1000 {
        let k = if i % 100 == 37 { 5000 } else { 100 };
        text.push_str(&format!("{}\n", json!({"text": words(k - 1)})));
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn stats_are_exact_to_the_token() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    long_tail(dir.path());
    let out = moro(dir.path())
        .args([
            "data",
            "stats",
            "tail.jsonl",
            "--model",
            "model",
            "--max-seq-length",
            "1000",
            "--packing",
            "--json",
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    assert_eq!(v["shape"], "text");
    assert_eq!(v["samples"], 1000);
    let s = &v["sequence"];
    assert_eq!(
        (s["p50"].as_u64(), s["p99"].as_u64(), s["max"].as_u64()),
        (Some(100), Some(100), Some(5000))
    );
    // 990 × 100 + 10 × 5,000.
    assert_eq!(s["total_tokens"], 149_000);
    assert_eq!(v["percentile"]["max_seq_length"], 100);
    assert_eq!(v["percentile"]["truncated_samples"], 10);
    // At 1,000: ten samples lose 4,000 tokens each.
    assert_eq!(v["truncation"]["samples"], 10);
    assert_eq!(v["truncation"]["tokens_cut"], 40_000);
    // Packed into 1,000: ten truncated samples fill ten sequences, the 990 of 100 pack ten to
    // a sequence (99); wrapped: ceil(149,000 / 1,000) = 149.
    assert_eq!(v["packing"]["best_fit"], 109);
    assert_eq!(v["packing"]["wrapped"], 149);
}

#[test]
fn stats_text_names_the_shape_and_the_percentile() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    let rows = [(3, 5), (10, 1)];
    let text: String = rows
        .iter()
        .map(|&(u, a)| format!("{}\n", json!({"messages": [{"role": "user", "content": words(u)}, {"role": "assistant", "content": words(a)}]})))
        .collect();
    std::fs::write(dir.path().join("chat.jsonl"), text).unwrap();
    let out = moro(dir.path())
        .args(["data", "stats", "chat.jsonl", "--model", "model"])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.contains("shape      chat messages (field `messages`)"),
        "{out}"
    );
    // whole = u + a + 2, prompt = u + 2: sequences 10 and 13, prompts 5 and 12.
    assert!(
        out.contains("sequence    11.5   10   13   13   13   13"),
        "{out}"
    );
    assert!(
        out.contains("prompt       8.5    5   12   12   12   12"),
        "{out}"
    );
    assert!(
        out.contains("max_seq_length 13 (p99): no sample is longer"),
        "{out}"
    );
}

#[test]
fn recipe_generate_sizes_max_seq_length_from_the_data() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    long_tail(dir.path());
    let out = moro(dir.path())
        .args([
            "recipe",
            "generate",
            "--model",
            "model",
            "--hardware",
            "rtx-4090",
            "--dataset",
            "tail.jsonl",
            "-o",
            "moro.yaml",
        ])
        .assert()
        .code(0)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "max_seq_length 100: the p99 of tail.jsonl; 1000 samples, 10 longer are truncated"
        ),
        "{err}"
    );
    assert!(err.contains("Sort the longest batch first"), "{err}");
    let yaml = std::fs::read_to_string(dir.path().join("moro.yaml")).unwrap();
    assert!(yaml.contains("  max_seq_length: 100\n"), "{yaml}");
    assert!(
        yaml.contains(
            "data:\n  path: tail.jsonl\n  shape: text\n  samples: 1000\n  percentile: 99.0\n"
        ),
        "{yaml}"
    );
    assert!(
        yaml.contains("  p99_tokens: 100\n  max_tokens: 5000\n  truncated_samples: 10\n"),
        "{yaml}"
    );
    // The recipe reads back, and `recipe check` accepts the data section.
    moro(dir.path())
        .args(["recipe", "check", "moro.yaml"])
        .assert()
        .code(0);
    // At p100 the tail is the length.
    let v = json_of(
        &moro(dir.path())
            .args([
                "recipe",
                "generate",
                "--model",
                "model",
                "--hardware",
                "rtx-4090",
                "--dataset",
                "tail.jsonl",
                "--percentile",
                "100",
                "--json",
            ])
            .assert()
            .code(0)
            .get_output()
            .stdout,
    );
    assert_eq!(v["recipe"]["training"]["max_seq_length"], 5000);
    assert_eq!(v["recipe"]["data"]["truncated_samples"], 0);
}

#[test]
fn estimate_at_the_datas_percentile() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    long_tail(dir.path());
    let at = |p: &str| {
        let v = json_of(
            &moro(dir.path())
                .args([
                    "estimate",
                    "--model",
                    "model",
                    "--method",
                    "lora",
                    "--dataset",
                    "tail.jsonl",
                    "--percentile",
                    p,
                    "--json",
                ])
                .assert()
                .code(0)
                .get_output()
                .stdout,
        );
        v["job"]["seq_len"].as_u64().unwrap()
    };
    assert_eq!(at("99"), 100);
    assert_eq!(at("99.5"), 5000);
    moro(dir.path())
        .args([
            "estimate",
            "--model",
            "model",
            "--dataset",
            "tail.jsonl",
            "--seq-len",
            "512",
        ])
        .assert()
        .code(2);
}

/// `estimate --dataset --padded`: a run of the dataset's batches, each padded to its longest
/// sample, is replayed (docs/memory-anatomy.md §17). 1,000 samples of 21 to 220 tokens (each
/// length five times) at the p99, 218: 32 batches, the last the longest; the run reaches it,
/// so what its segments hold is at least the estimate's allocated level, and the cache with
/// the blocks shorter batches left is at least that. Packed batches, all of one length, get
/// no run.
#[test]
fn a_padded_estimate_replays_a_run_of_the_datasets_batches() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    let mut text = String::new();
    for i in 0..1000 {
        text.push_str(&format!("{}\n", json!({"text": words(20 + i % 200)})));
    }
    std::fs::write(dir.path().join("varied.jsonl"), text).unwrap();
    let args = [
        "estimate",
        "--model",
        "model",
        "--method",
        "lora",
        "--micro-batch-size",
        "2",
        "--dataset",
        "varied.jsonl",
    ];
    let run = |extra: &[&str]| {
        moro(dir.path())
            .args([&args[..], extra].concat())
            .assert()
            .code(0)
            .get_output()
            .clone()
    };
    let v = json_of(&run(&["--padded", "--json"]).stdout);
    assert_eq!(v["job"]["seq_len"], 218);
    let r = &v["run_of_batches"];
    assert_eq!(r["batches"], 32);
    assert_eq!(r["longest_tokens"], 218);
    let needed = r["needed_bytes"].as_u64().unwrap();
    assert!(needed >= v["peak_allocated_bytes"].as_u64().unwrap(), "{v}");
    assert!(r["reserved_bytes"].as_u64().unwrap() >= needed, "{v}");
    let text = String::from_utf8(run(&["--padded"]).stdout).unwrap();
    assert!(
        text.contains("run     32 of the dataset's batches replayed (shuffled, each padded to its longest, the last 218 tokens)"),
        "{text}"
    );
    let packed = json_of(&run(&["--json"]).stdout);
    assert!(packed.get("run_of_batches").is_none(), "{packed}");
    // Two GPUs: the step trace follows one; the note says the batches are not replayed.
    let two = run(&["--padded", "--gpus", "2", "--json"]);
    assert!(json_of(&two.stdout).get("run_of_batches").is_none());
    assert!(
        String::from_utf8_lossy(&two.stderr).contains("the batches are not replayed"),
        "{}",
        String::from_utf8_lossy(&two.stderr)
    );
}

#[test]
fn malformed_rows_are_listed_and_strict_makes_them_fatal() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    std::fs::write(
        dir.path().join("d.jsonl"),
        "{\"text\": \"w w\"}\n{\"text\": 3}\n{broken\n",
    )
    .unwrap();
    let out = moro(dir.path())
        .args(["data", "stats", "d.jsonl", "--model", "model"])
        .assert()
        .code(0)
        .get_output()
        .clone();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "malformed rows: 2\n  line 2: `text` is a number, not a string\n  line 3: not JSON"
        ),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 malformed rows not counted"));
    let out = moro(dir.path())
        .args([
            "data", "stats", "d.jsonl", "--model", "model", "--strict", "--json",
        ])
        .assert()
        .code(2)
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    assert_eq!(
        v["error"]["message"],
        "d.jsonl: line 2: `text` is a number, not a string"
    );
}

#[test]
fn a_template_that_raises_is_named_with_the_row() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    let row = json!({"messages": [{"role": "system", "content": "w"}, {"role": "user", "content": "w"}, {"role": "assistant", "content": "w"}]});
    std::fs::write(dir.path().join("d.jsonl"), format!("{row}\n")).unwrap();
    let out = moro(dir.path())
        .args(["data", "stats", "d.jsonl", "--model", "model", "--strict"])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8_lossy(&out);
    assert!(
        err.contains("error: d.jsonl: line 1: the chat template raised: System role not supported"),
        "{err}"
    );
}

#[test]
fn bad_input_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = model_dir(dir.path(), TEMPLATE);
    let run = |args: &[&str]| {
        let out = moro(dir.path())
            .args(args)
            .assert()
            .code(2)
            .get_output()
            .stderr
            .clone();
        String::from_utf8_lossy(&out).into_owned()
    };
    std::fs::write(dir.path().join("blob.bin"), [0u8, 159, 146, 150]).unwrap();
    let e = run(&["data", "stats", "blob.bin", "--model", "model"]);
    assert!(
        e.contains("error: blob.bin: not a dataset moro reads"),
        "{e}"
    );
    std::fs::write(
        dir.path().join("qa.jsonl"),
        "{\"question\": \"w\", \"answer\": \"w\"}\n",
    )
    .unwrap();
    let e = run(&["data", "stats", "qa.jsonl", "--model", "model"]);
    assert!(e.contains("error: qa.jsonl: line 1: cannot tell the dataset's shape from its first row (keys: question, answer)"), "{e}");
    assert!(e.contains("hint: choose it with --format"), "{e}");
    let e = run(&[
        "data", "stats", "qa.jsonl", "--model", "model", "--format", "tabular",
    ]);
    assert!(
        e.contains("error: --format `tabular` is not a dataset shape"),
        "{e}"
    );
    let e = run(&["data", "stats", "missing.jsonl", "--model", "model"]);
    assert!(e.contains("error: missing.jsonl: "), "{e}");
    std::fs::write(m.join("tokenizer.json"), "{\"model\": 1}").unwrap();
    let e = run(&["data", "stats", "qa.jsonl", "--model", "model"]);
    assert!(e.contains("tokenizer.json does not load"), "{e}");
    let e = run(&[
        "data",
        "stats",
        "qa.jsonl",
        "--model",
        "model",
        "--percentile",
        "0",
    ]);
    assert!(e.contains("--percentile 0 is not a percentage"), "{e}");
    let e = run(&[
        "data",
        "stats",
        "qa.jsonl",
        "--model",
        "model",
        "--exact-weights",
    ]);
    assert!(e.contains("--exact-weights applies to estimates"), "{e}");
    let e = run(&["data", "stats", "qa.jsonl", "--model", "Qwen/Qwen2.5-7B"]);
    assert!(e.contains("not in the Hugging Face cache"), "{e}");
}

#[test]
fn a_dataset_repository_in_the_hub_cache_is_read_by_its_train_split() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../moro-data/tests/fixtures");
    let repo = dir.path().join("hub/datasets--org--chat");
    let snap = repo.join("snapshots/0123abc/data");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abc").unwrap();
    // train: 200 text rows of 1…200 tokens (make_parquet.py); test: not read.
    std::fs::copy(
        fixtures.join("text.parquet"),
        snap.join("train-00000-of-00001.parquet"),
    )
    .unwrap();
    std::fs::copy(
        fixtures.join("alpaca.parquet"),
        snap.join("test-00000-of-00001.parquet"),
    )
    .unwrap();
    let v = json_of(
        &moro(dir.path())
            .env("HF_HUB_CACHE", dir.path().join("hub"))
            .args(["data", "stats", "org/chat", "--model", "model", "--json"])
            .assert()
            .code(0)
            .get_output()
            .stdout,
    );
    assert_eq!(v["file_format"], "Parquet");
    assert_eq!(v["samples"], 200);
    assert_eq!(v["sequence"]["p99"], 198);
    let e = moro(dir.path())
        .env("HF_HUB_CACHE", dir.path().join("hub"))
        .args(["data", "stats", "org/absent", "--model", "model"])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(
        String::from_utf8_lossy(&e).contains("no dataset `org/absent` in the Hugging Face cache")
    );
}

#[test]
fn a_dataset_in_the_datasets_cache_is_read_from_its_arrow_files() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path(), TEMPLATE);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../moro-data/tests/fixtures");
    let prepared = dir.path().join("datasets/org___chat/default/0.0.0/4f3c2a");
    std::fs::create_dir_all(&prepared).unwrap();
    // make_fixtures.py's messages (10, 13 and 43 tokens) as the train split's stream.
    std::fs::copy(
        fixtures.join("messages.arrow"),
        prepared.join("chat-train.arrow"),
    )
    .unwrap();
    std::fs::copy(
        fixtures.join("messages.arrow"),
        prepared.join("chat-test.arrow"),
    )
    .unwrap();
    let v = json_of(
        &moro(dir.path())
            .env("HF_HUB_CACHE", dir.path().join("hub"))
            .env("HF_DATASETS_CACHE", dir.path().join("datasets"))
            .args(["data", "stats", "org/chat", "--model", "model", "--json"])
            .assert()
            .code(0)
            .get_output()
            .stdout,
    );
    assert_eq!(v["file_format"], "Arrow");
    assert_eq!(v["samples"], 3);
    assert_eq!(v["sequence"]["max"], 43);
}

#[test]
fn recipe_generate_cuts_the_datas_length_to_the_models_context() {
    // The same long tail on a model of 1,024 positions: p100 is 5,000 tokens, beyond them.
    let dir = tempfile::tempdir().unwrap();
    let m = model_dir(dir.path(), TEMPLATE);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(1024);
    std::fs::write(m.join("config.json"), config.to_string()).unwrap();
    long_tail(dir.path());
    let out = moro(dir.path())
        .args([
            "recipe",
            "generate",
            "--model",
            "model",
            "--hardware",
            "rtx-4090",
            "--dataset",
            "tail.jsonl",
            "--percentile",
            "100",
            "--json",
        ])
        .assert()
        .code(0)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("max_seq_length 1024: the model's 1024 positions, below the p100 of tail.jsonl (5000 tokens); 1000 samples, 10 longer are truncated"),
        "{err}"
    );
    let v = json_of(&out.stdout);
    assert_eq!(v["recipe"]["training"]["max_seq_length"], 1024);
    assert_eq!(v["recipe"]["data"]["truncated_samples"], 10);
}

/// A GGUF with a SentencePiece vocabulary of its own and a chat template: `<s>`, `</s>`, `▁`,
/// `w` and `▁w` (whose merge the scores give), so a text of n words is n tokens of `▁w`,
/// BOS before (a SentencePiece GGUF adds it) and the EOS TRL appends: n + 2.
fn gguf_vocab(dir: &Path, model: &str) -> std::path::PathBuf {
    use moro_core::formats::gguf::GgufWriter;
    let path = dir.join("tiny.gguf");
    let bytes = GgufWriter::new()
        .string("general.architecture", "llama")
        .string("tokenizer.ggml.model", model)
        .string_array(
            "tokenizer.ggml.tokens",
            &["<unk>", "<s>", "</s>", "\u{2581}", "w", "\u{2581}w"],
        )
        .f32_array("tokenizer.ggml.scores", &[0.0, 0.0, 0.0, -1.0, -2.0, -3.0])
        .u32_array("tokenizer.ggml.token_type", &[2, 3, 3, 1, 1, 1])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .string(
            "tokenizer.chat_template",
            "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
        )
        .build(false);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_gguf_is_its_own_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    gguf_vocab(dir.path(), "llama");
    let mut text = String::new();
    for n in [3, 9, 19] {
        text.push_str(&format!("{}\n", json!({"text": words(n)})));
    }
    std::fs::write(dir.path().join("texts.jsonl"), &text).unwrap();
    let out = moro(dir.path())
        .args([
            "data",
            "stats",
            "texts.jsonl",
            "--model",
            "tiny.gguf",
            "--json",
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    let v = json_of(&out);
    assert_eq!(v["samples"], 3);
    assert_eq!(v["sequence"]["max"], 21, "{v}");
    assert_eq!(v["sequence"]["p50"], 11, "{v}");
    assert!(
        v["tokenizer"]
            .as_str()
            .unwrap_or_default()
            .contains("tiny.gguf"),
        "{v}"
    );
    // A conversation: the GGUF's own template, rendered and encoded without BOS: 4 + 1 + 5 + 1.
    std::fs::write(
        dir.path().join("chat.jsonl"),
        format!("{}\n", json!({"messages": [{"role": "user", "content": words(4)}, {"role": "assistant", "content": words(5)}]})),
    )
    .unwrap();
    let out = moro(dir.path())
        .args([
            "data",
            "stats",
            "chat.jsonl",
            "--model",
            "tiny.gguf",
            "--json",
        ])
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone();
    assert_eq!(json_of(&out)["sequence"]["max"], 11);
    // A vocabulary type moro does not read is one clear error.
    gguf_vocab(dir.path(), "bert");
    let out = moro(dir.path())
        .args(["data", "stats", "texts.jsonl", "--model", "tiny.gguf"])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    let e = String::from_utf8_lossy(&out);
    assert!(
        e.contains("a `bert` vocabulary (`tokenizer.ggml.model`) is not read from a GGUF yet"),
        "{e}"
    );
    assert!(e.contains("hint: give the model's tokenizer.json"), "{e}");
}
