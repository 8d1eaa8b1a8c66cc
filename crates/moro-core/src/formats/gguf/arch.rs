//! The architecture fields llama.cpp reads from a GGUF header (`llama-model.cpp`
//! `load_hparams`).

use serde::Serialize;

use super::{GgufError, GgufHeader, GgufValue, MAX_LAYERS};

/// The architecture fields llama.cpp reads (`llama-model.cpp` `load_hparams`), per layer
/// where GGUF allows arrays.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufArch {
    /// `general.architecture`.
    pub architecture: String,
    /// `{arch}.block_count`.
    pub block_count: u64,
    /// `{arch}.embedding_length` (n_embd).
    pub embedding_length: u64,
    /// `{arch}.attention.head_count`, per layer.
    pub head_count: Vec<u64>,
    /// `{arch}.attention.head_count_kv`, per layer (defaults to `head_count`; 0 for layers
    /// without attention, as in hybrid recurrent models).
    pub head_count_kv: Vec<u64>,
    /// `{arch}.attention.key_length` (default n_embd / n_head).
    pub key_length: u64,
    /// `{arch}.attention.value_length` (default n_embd / n_head).
    pub value_length: u64,
    /// `{arch}.context_length` (training context).
    pub context_length: Option<u64>,
    /// `{arch}.feed_forward_length`, largest over layers.
    pub feed_forward_length: Option<u64>,
    /// `{arch}.attention.sliding_window` (n_swa).
    pub sliding_window: Option<u64>,
    /// Which layers use the sliding window (all `false` when none or unknown).
    pub swa_layers: Vec<bool>,
    /// Whether the model has a sliding window whose layer pattern moro does not know (then
    /// all layers are counted as full attention, an overestimate).
    pub swa_pattern_unknown: bool,
    /// `{arch}.rope.dimension_count`.
    pub rope_dimension_count: Option<u64>,
    /// `{arch}.rope.freq_base`.
    pub rope_freq_base: Option<f64>,
    /// `{arch}.rope.scaling.type`.
    pub rope_scaling_type: Option<String>,
    /// `{arch}.rope.scaling.factor`.
    pub rope_scaling_factor: Option<f64>,
    /// `{arch}.rope.scaling.original_context_length`.
    pub rope_original_context_length: Option<u64>,
    /// `{arch}.expert_count`.
    pub expert_count: Option<u64>,
    /// `{arch}.expert_used_count`.
    pub expert_used_count: Option<u64>,
    /// `{arch}.expert_feed_forward_length`.
    pub expert_feed_forward_length: Option<u64>,
    /// Vocabulary: `{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`, else
    /// `ne[1]` of `output.weight` / `token_embd.weight`.
    pub vocab_size: u64,
}

/// Sliding-window layer patterns llama.cpp hard-codes per architecture when the GGUF has no
/// `{arch}.attention.sliding_window_pattern` (llama.cpp `src/llama-model.cpp`,
/// `hparams.set_swa_pattern(n)` as of b6000, July 2025): layer `il` is SWA iff
/// `il % n < n - 1`.
const SWA_PATTERNS: &[(&str, u64)] = &[
    ("gemma2", 2),
    ("gemma3", 6),
    ("gemma3n", 5),
    ("cohere2", 4),
    ("llama4", 4),
    ("gpt-oss", 2),
    ("exaone4", 4),
];

/// Reads the architecture fields.
///
/// # Errors
/// [`GgufError::Invalid`] when `general.architecture`, `block_count`, `embedding_length` or
/// `head_count` is missing, or `block_count` exceeds [`MAX_LAYERS`].
pub fn arch(h: &GgufHeader) -> Result<GgufArch, GgufError> {
    let a = h
        .architecture()
        .ok_or_else(|| GgufError::Invalid("missing `general.architecture`".into()))?
        .to_owned();
    let key = |s: &str| format!("{a}.{s}");
    let u = |s: &str| h.get(&key(s)).and_then(GgufValue::as_u64);
    let f = |s: &str| h.get(&key(s)).and_then(GgufValue::as_f64);
    let need = |s: &str| {
        u(s).ok_or_else(|| GgufError::Invalid(format!("missing or non-integer `{}`", key(s))))
    };
    let n_layer = need("block_count")?;
    if n_layer > MAX_LAYERS {
        return Err(GgufError::Invalid(format!(
            "`{}` = {n_layer} is implausible",
            key("block_count")
        )));
    }
    let n_embd = need("embedding_length")?;
    // n_layer <= MAX_LAYERS.
    let n = usize::try_from(n_layer).unwrap_or(0);
    let per_layer = |s: &str| -> Result<Option<Vec<u64>>, GgufError> {
        match h.get(&key(s)) {
            None => Ok(None),
            Some(GgufValue::Array(arr)) => {
                if arr.len != n_layer || arr.values.len() != n {
                    return Err(GgufError::Invalid(format!(
                        "`{}` has {} entries for {n_layer} layers",
                        key(s),
                        arr.len
                    )));
                }
                arr.values
                    .iter()
                    .map(|v| {
                        v.as_u64().ok_or_else(|| {
                            GgufError::Invalid(format!("`{}` has a non-integer entry", key(s)))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            }
            Some(v) => v
                .as_u64()
                .map(|x| Some(vec![x; n]))
                .ok_or_else(|| GgufError::Invalid(format!("`{}` is not an integer", key(s)))),
        }
    };
    let head_count = per_layer("attention.head_count")?
        .ok_or_else(|| GgufError::Invalid(format!("missing `{}`", key("attention.head_count"))))?;
    let head_count_kv = per_layer("attention.head_count_kv")?.unwrap_or_else(|| head_count.clone());
    let n_head0 = head_count.iter().copied().find(|&x| x > 0).unwrap_or(0);
    let default_head = n_embd.checked_div(n_head0).unwrap_or(0);
    let feed_forward_length = per_layer("feed_forward_length")?.and_then(|v| v.into_iter().max());
    let sliding_window = u("attention.sliding_window").filter(|&w| w > 0);
    let mut swa_layers = vec![false; n];
    let mut swa_pattern_unknown = false;
    if sliding_window.is_some() {
        let pattern = match h.get(&key("attention.sliding_window_pattern")) {
            Some(GgufValue::Array(arr)) if arr.values.len() == n => {
                for (slot, v) in swa_layers.iter_mut().zip(&arr.values) {
                    *slot = matches!(v, GgufValue::Bool(true));
                }
                None
            }
            Some(v) => v.as_u64(),
            None => SWA_PATTERNS
                .iter()
                .find(|(arch, _)| *arch == a)
                .map(|&(_, p)| p),
        };
        if let Some(p) = pattern {
            for (il, slot) in swa_layers.iter_mut().enumerate() {
                *slot = p > 0 && (il as u64) % p < p - 1;
            }
        } else if !swa_layers.iter().any(|&s| s) {
            swa_pattern_unknown = true;
        }
    }
    let vocab_size = u("vocab_size")
        .or_else(|| match h.get("tokenizer.ggml.tokens") {
            Some(GgufValue::Array(arr)) => Some(arr.len),
            _ => None,
        })
        .or_else(|| {
            ["output.weight", "token_embd.weight"]
                .iter()
                .find_map(|n| h.tensor(n).and_then(|t| t.dims.get(1).copied()))
        })
        .unwrap_or(0);
    Ok(GgufArch {
        block_count: n_layer,
        embedding_length: n_embd,
        key_length: u("attention.key_length").unwrap_or(default_head),
        value_length: u("attention.value_length").unwrap_or(default_head),
        context_length: u("context_length"),
        feed_forward_length,
        sliding_window,
        swa_layers,
        swa_pattern_unknown,
        rope_dimension_count: u("rope.dimension_count"),
        rope_freq_base: f("rope.freq_base"),
        rope_scaling_type: h
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
            .map(Into::into),
        rope_scaling_factor: f("rope.scaling.factor"),
        rope_original_context_length: u("rope.scaling.original_context_length"),
        expert_count: u("expert_count"),
        expert_used_count: u("expert_used_count"),
        expert_feed_forward_length: u("expert_feed_forward_length"),
        head_count,
        head_count_kv,
        vocab_size,
        architecture: a,
    })
}
