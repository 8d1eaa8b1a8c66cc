//! A GGUF file's own vocabulary (`tokenizer.ggml.*`, llama.cpp `gguf-py/gguf/constants.py`
//! `Keys.Tokenizer`) as the `tokenizer.json` of the fast tokenizer it was converted from,
//! with the `tokenizer_config.json` fields training reads (special tokens, chat template).
//!
//! Two vocabulary types are read, the ones llama.cpp's tests check against the original
//! tokenizers' ids (`models/ggml-vocab-*.gguf` with `.inp` / `.out`):
//!
//! - `llama` (SentencePiece BPE): the vocabulary with byte fallback (`<0x0A>`), merges
//!   recovered from the scores as transformers 5.24.0 recovers them
//!   (`tokenization_utils_base.py` `generate_merges`), and the normalizer of the shipped
//!   Llama 2 and Phi-3 `tokenizer.json`: `▁` prepended to each piece of text between special
//!   tokens (llama.cpp `llm_tokenizer_spm_session::tokenize`: a space before the first
//!   fragment and after each special token, when `tokenizer.ggml.add_space_prefix`), spaces
//!   replaced by `▁`. transformers' own GGUF builder does the same for `phi3`
//!   (`integrations/gguf/gguf_tokenizer_mapping.py` `phi3_tokenizer`).
//! - `gpt2` (byte-level BPE): the vocabulary and merges as stored, split by the
//!   pre-tokenizer `tokenizer.ggml.pre` names (the regexes of llama.cpp `llama-vocab.cpp`
//!   `llm_tokenizer_bpe`, as transformers' `GGUF_PRE_TOKENIZER_SPLITS` spells them), with
//!   Llama 3's `ignore_merges` and Qwen2's NFC normalizer.
//!
//! Tokens typed `CONTROL` (3) are special added tokens, `USER_DEFINED` (4) plain added
//! tokens (transformers `add_gguf_special_tokens`). Other vocabulary types (`bert`, `t5`,
//! `gemma4`, `rwkv`), the Gemma 1–3 SentencePiece files and unknown pre-tokenizers are
//! refused: their ids are not checked here.

use moro_core::formats::gguf::{GgufHeader, GgufValue};
use serde_json::{Map, Value, json};

use crate::DataError;

/// The keys whose arrays a tokenizer needs whole (the header reader keeps other long arrays
/// as counts).
pub const WHOLE_ARRAYS: [&str; 4] = [
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
];

/// `llama_token_type` (llama.cpp `llama-vocab.h`): a control token.
const CONTROL: u64 = 3;
/// A user-defined token.
const USER_DEFINED: u64 = 4;

/// Llama 3's split (`LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split (`LLAMA_VOCAB_PRE_TYPE_QWEN2`; transformers `tokenization_qwen2.py`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split (`LLAMA_VOCAB_PRE_TYPE_QWEN35`; transformers `tokenization_qwen3_5.py`).
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's split (`LLAMA_VOCAB_PRE_TYPE_GPT4O`), also Llama 4's.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a byte-level vocabulary splits text before its merges, by `tokenizer.ggml.pre`.
struct PreTokenizer {
    /// The split regex, or `None` for GPT-2's own (`ByteLevel` with `use_regex`).
    split: Option<&'static str>,
    /// The word is looked up whole before merging (llama.cpp `ignore_merges`).
    ignore_merges: bool,
    /// NFC before splitting (Qwen2's `tokenizer.json`; Qwen3.5's ids in llama.cpp's `.out` are
    /// not composed).
    nfc: bool,
    /// BOS is added unless the file says otherwise (llama.cpp sets `add_bos` for Llama 3).
    adds_bos: bool,
}

fn pre_tokenizer(name: Option<&str>) -> Option<PreTokenizer> {
    let p = |split, ignore_merges, nfc, adds_bos| PreTokenizer {
        split,
        ignore_merges,
        nfc,
        adds_bos,
    };
    Some(match name.unwrap_or("default") {
        "default" | "gpt-2" => p(None, false, false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "dbrx" | "falcon3" | "pixtral" => {
            p(Some(LLAMA3_SPLIT), true, false, true)
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" => p(Some(QWEN2_SPLIT), false, true, false),
        "qwen35" => p(Some(QWEN35_SPLIT), false, false, false),
        "gpt-4o" | "llama4" | "minimax-m2" => p(Some(GPT4O_SPLIT), false, false, false),
        _ => return None,
    })
}

/// The vocabulary of a GGUF header as a `tokenizer.json` and the `tokenizer_config.json`
/// fields training reads (`bos_token`, `eos_token`, `unk_token`, `pad_token`,
/// `chat_template`).
///
/// # Errors
/// The header has no vocabulary, one of a type or pre-tokenizer not modelled, or malformed
/// fields (each error names the key).
pub fn tokenizer_files(header: &GgufHeader) -> Result<(Value, Value), DataError> {
    let model = header
        .get("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| {
            DataError::new("the GGUF has no vocabulary (`tokenizer.ggml.model` is missing)")
                .hint("give the model's tokenizer.json")
        })?;
    let tokens = strings(header, "tokenizer.ggml.tokens")?
        .ok_or_else(|| DataError::new("the GGUF has no `tokenizer.ggml.tokens`"))?;
    if tokens.is_empty() {
        return Err(DataError::new("`tokenizer.ggml.tokens` is empty"));
    }
    let types = numbers(header, "tokenizer.ggml.token_type", tokens.len())?;
    let architecture = header.architecture().unwrap_or_default();
    let add_bos_key = flag(header, "tokenizer.ggml.add_bos_token")?;
    let add_eos = flag(header, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let (tokenizer, add_bos) = match model {
        "llama" if architecture.starts_with("gemma") => {
            return Err(unmodelled(&format!(
                "a Gemma SentencePiece vocabulary (`general.architecture` `{architecture}`)"
            )));
        }
        "llama" => {
            let scores = floats(header, "tokenizer.ggml.scores", tokens.len())?;
            let prefix = flag(header, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
            (
                sentencepiece(&tokens, &scores, types.as_deref(), prefix),
                add_bos_key.unwrap_or(true),
            )
        }
        "gpt2" => {
            let pre_name = header.get("tokenizer.ggml.pre").and_then(GgufValue::as_str);
            let pre = pre_tokenizer(pre_name).ok_or_else(|| {
                unmodelled(&format!(
                    "the pre-tokenizer `{}` (`tokenizer.ggml.pre`)",
                    pre_name.unwrap_or_default()
                ))
            })?;
            let merges = strings(header, "tokenizer.ggml.merges")?.ok_or_else(|| {
                DataError::new("a byte-level GGUF vocabulary without `tokenizer.ggml.merges`")
            })?;
            (
                byte_level(&tokens, &merges, types.as_deref(), &pre),
                add_bos_key.unwrap_or(pre.adds_bos),
            )
        }
        other => {
            return Err(unmodelled(&format!(
                "a `{other}` vocabulary (`tokenizer.ggml.model`)"
            )));
        }
    };
    let special = |key: &str| -> Result<Value, DataError> {
        let Some(v) = header.get(key) else {
            return Ok(Value::Null);
        };
        let id = v
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < tokens.len())
            .ok_or_else(|| {
                DataError::new(format!(
                    "`{key}` is not the id of a token of the vocabulary ({} tokens)",
                    tokens.len()
                ))
            })?;
        Ok(Value::String(tokens[id].clone()))
    };
    let bos = special("tokenizer.ggml.bos_token_id")?;
    let eos = special("tokenizer.ggml.eos_token_id")?;
    let mut tokenizer = tokenizer;
    tokenizer["post_processor"] =
        post_processor(header, add_bos.then_some(&bos), add_eos.then_some(&eos));
    let config = json!({
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": special("tokenizer.ggml.unknown_token_id")?,
        "pad_token": special("tokenizer.ggml.padding_token_id")?,
        "chat_template": header
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str),
    });
    Ok((tokenizer, config))
}

fn unmodelled(what: &str) -> DataError {
    DataError::new(format!(
        "{what} is not read from a GGUF yet (its token ids are not checked)"
    ))
    .hint("give the model's tokenizer.json (its Hugging Face directory or Hub id)")
}

fn array<'h>(header: &'h GgufHeader, key: &str) -> Result<Option<&'h [GgufValue]>, DataError> {
    match header.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) if a.values.len() as u64 == a.len => Ok(Some(&a.values)),
        Some(GgufValue::Array(_)) => Err(DataError::new(format!(
            "`{key}` was not read whole (read the header keeping it)"
        ))),
        Some(_) => Err(DataError::new(format!("`{key}` is not an array"))),
    }
}

fn strings(header: &GgufHeader, key: &str) -> Result<Option<Vec<String>>, DataError> {
    array(header, key)?
        .map(|values| {
            values
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    DataError::new(format!("`{key}` holds a value that is not a string"))
                })
        })
        .transpose()
}

/// An array of one entry per token (`n`), or `None` when the key is absent.
fn per_token<'h>(
    header: &'h GgufHeader,
    key: &str,
    n: usize,
) -> Result<Option<&'h [GgufValue]>, DataError> {
    let values = array(header, key)?;
    if let Some(v) = values.filter(|v| v.len() != n) {
        return Err(DataError::new(format!(
            "`{key}` has {} entries for {n} tokens",
            v.len()
        )));
    }
    Ok(values)
}

/// The token types, or `None` when the key is absent.
fn numbers(header: &GgufHeader, key: &str, n: usize) -> Result<Option<Vec<u64>>, DataError> {
    per_token(header, key, n)?
        .map(|values| {
            values
                .iter()
                .map(GgufValue::as_u64)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| DataError::new(format!("`{key}` holds a value that is not a count")))
        })
        .transpose()
}

/// The scores of a SentencePiece vocabulary (`n` of them, required).
fn floats(header: &GgufHeader, key: &str, n: usize) -> Result<Vec<f64>, DataError> {
    per_token(header, key, n)?
        .ok_or_else(|| DataError::new(format!("a SentencePiece GGUF vocabulary without `{key}`")))?
        .iter()
        .map(|v| v.as_f64().filter(|f| !f.is_nan()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| DataError::new(format!("`{key}` holds a value that is not a number")))
}

fn flag(header: &GgufHeader, key: &str) -> Result<Option<bool>, DataError> {
    match header.get(key) {
        None => Ok(None),
        Some(GgufValue::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(DataError::new(format!("`{key}` is not a bool"))),
    }
}

/// Added tokens: control tokens special, user-defined ones plain, none normalized; `keep`
/// says which a vocabulary can hold.
fn added_tokens(
    tokens: &[String],
    types: Option<&[u64]>,
    keep: impl Fn(&str, bool) -> bool,
) -> Vec<Value> {
    let Some(types) = types else {
        return Vec::new();
    };
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter_map(|(id, (t, &ty))| {
            let special = match ty {
                CONTROL => true,
                USER_DEFINED => false,
                _ => return None,
            };
            keep(t, special).then(|| {
                json!({
                    "id": id, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": special,
                })
            })
        })
        .collect()
}

/// The vocabulary as a map from token to id; a token listed twice keeps its last id (a
/// Python dict built from the list, as transformers builds it).
fn vocab_map(tokens: &[String]) -> Map<String, Value> {
    let mut m = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        m.insert(t.clone(), json!(i));
    }
    m
}

/// SentencePiece BPE with byte fallback; merges from the scores.
fn sentencepiece(tokens: &[String], scores: &[f64], types: Option<&[u64]>, prefix: bool) -> Value {
    let mut normalizers = Vec::new();
    if prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(tokens, types, |_, _| true),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab_map(tokens),
            "merges": merges_from_scores(tokens, scores),
        },
    })
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of a token into two
/// tokens, ordered by the left then right piece's id within the token, then all of them by
/// the token's score, the left piece's and the right piece's length (code points), highest
/// first, ties kept in order.
fn merges_from_scores(tokens: &[String], scores: &[f64]) -> Vec<[String; 2]> {
    use std::collections::HashMap;
    let mut id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut score: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if score.insert(t, scores[i]).is_none() {
            order.push(t);
        }
        id.insert(t, i);
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for t in order {
        let s = score[t];
        let mut local: Vec<(&str, &str)> = t
            .char_indices()
            .skip(1)
            .map(|(at, _)| t.split_at(at))
            .filter(|(l, r)| id.contains_key(l) && id.contains_key(r))
            .collect();
        local.sort_by_key(|(l, r)| (id[l], id[r]));
        merges.extend(local.into_iter().map(|(l, r)| (l, r, s)));
    }
    let chars = |x: &str| x.chars().count();
    merges.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then_with(|| chars(b.0).cmp(&chars(a.0)))
            .then_with(|| chars(b.1).cmp(&chars(a.1)))
    });
    merges
        .into_iter()
        .map(|(l, r, _)| [l.to_owned(), r.to_owned()])
        .collect()
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`, openai/gpt-2 `encoder.py`).
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let code = if printable {
            b as u32
        } else {
            extra += 1;
            255 + extra
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// Byte-level BPE: tokens spelled in GPT-2's byte alphabet (a token with another character
/// is respelled byte by byte, as transformers does), the stored merges.
fn byte_level(
    tokens: &[String],
    merges: &[String],
    types: Option<&[u64]>,
    pre: &PreTokenizer,
) -> Value {
    let table = bytes_to_unicode();
    let alphabet: std::collections::HashSet<char> = table.iter().copied().collect();
    let spelled = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let respelled: Vec<String> = tokens
        .iter()
        .map(|t| {
            if spelled(t) {
                t.clone()
            } else {
                t.bytes().map(|b| table[usize::from(b)]).collect()
            }
        })
        .collect();
    let vocab = vocab_map(&respelled);
    // A control token outside the byte alphabet is a mislabel transformers skips; a
    // user-defined one is added only when the vocabulary spells it as stored.
    let added = added_tokens(tokens, types, |t, special| {
        if special {
            spelled(t)
        } else {
            vocab.contains_key(t)
        }
    });
    let merges: Vec<Value> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((l, r)) => json!([l, r]),
            None => json!([m, ""]),
        })
        .collect();
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match pre.split {
        Some(regex) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]}),
        None => byte_level(true),
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": if pre.nfc { json!({"type": "NFC"}) } else { Value::Null },
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": byte_level(true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": pre.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    })
}

/// BOS before and EOS after each sequence, as `add_bos_token` / `add_eos_token` ask
/// (transformers `TokenizersBackend.update_post_processor`).
fn post_processor(header: &GgufHeader, bos: Option<&Value>, eos: Option<&Value>) -> Value {
    let mut specials = Map::new();
    let mut piece = |t: Option<&Value>, key: &str| -> Option<Value> {
        let name = t?.as_str()?;
        let id = header.get(key)?.as_u64()?;
        specials.insert(
            name.to_owned(),
            json!({"id": name, "ids": [id], "tokens": [name]}),
        );
        Some(json!({"SpecialToken": {"id": name, "type_id": 0}}))
    };
    let first = piece(bos, "tokenizer.ggml.bos_token_id");
    let last = piece(eos, "tokenizer.ggml.eos_token_id");
    if first.is_none() && last.is_none() {
        return Value::Null;
    }
    let sequence = |s: &str| {
        let mut v: Vec<Value> = first.iter().cloned().collect();
        v.push(json!({"Sequence": {"id": s, "type_id": 0}}));
        v.extend(last.iter().cloned());
        v
    };
    let single = sequence("A");
    let mut pair = single.clone();
    pair.extend(sequence("B"));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}
