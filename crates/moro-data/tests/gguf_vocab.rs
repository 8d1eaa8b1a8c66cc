//! A GGUF's own vocabulary tokenizes as the original Hugging Face tokenizer: llama.cpp keeps,
//! beside each vocabulary-only GGUF, texts (`.inp`) and the ids the model's own tokenizer
//! gives for them (`.out`, `convert_hf_to_gguf_update.py`: `tokenizer.encode(text,
//! add_special_tokens=False)`). `gguf_vocab/fetch_vocabs.sh` brings them.

use std::path::PathBuf;

use common::DAY;
use moro_core::formats::gguf::parse_header_keeping;
use moro_data::ModelTokenizer;
use moro_data::gguf_vocab::WHOLE_ARRAYS;

mod common;

/// The vocabularies checked: SentencePiece (Llama 2, Phi-3) and byte-level BPE with four
/// pre-tokenizers (GPT-2, Llama 3, Qwen2, Qwen3.5).
const VOCABS: [&str; 6] = [
    "phi-3",
    "llama-spm",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "gpt-2",
];

fn vocabs_dir() -> Option<PathBuf> {
    common::fetched(
        "gguf",
        "ggml-vocab-phi-3.gguf",
        "gguf_vocab/fetch_vocabs.sh",
    )
}

fn load(path: &std::path::Path) -> ModelTokenizer {
    let bytes = std::fs::read(path).unwrap();
    let header = parse_header_keeping(&bytes, &WHOLE_ARRAYS).unwrap();
    ModelTokenizer::from_gguf(&header, None, DAY)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn gguf_vocabularies_give_the_original_tokenizers_ids() {
    let Some(dir) = vocabs_dir() else {
        return;
    };
    let mut compared = 0;
    for v in VOCABS {
        let file = dir.join(format!("ggml-vocab-{v}.gguf"));
        let tok = load(&file);
        let inp = std::fs::read_to_string(file.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(file.with_extension("gguf.out")).unwrap();
        // llama.cpp `tests/test-tokenizer-0.cpp`: texts end with the separator line.
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let want: Vec<&str> = out.lines().collect();
        let texts = &texts[..want.len()];
        assert!(texts.len() >= 30, "{v}: {} texts", texts.len());
        for (text, ids) in texts.iter().zip(&want) {
            let want: Vec<u32> = ids.split_whitespace().map(|i| i.parse().unwrap()).collect();
            let got = tok.encode(text, false).unwrap();
            assert_eq!(got, want, "{v}: {text:?}");
            compared += 1;
        }
    }
    assert!(compared >= 180, "{compared} texts");
}
