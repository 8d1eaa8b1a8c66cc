//! safetensors headers and sharded indexes, from bytes.
//!
//! The format (<https://github.com/huggingface/safetensors#format>): an 8-byte little-endian
//! `u64` N, then N bytes of UTF-8 JSON mapping each tensor name to
//! `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the end of the
//! header), plus an optional `"__metadata__"` string→string map; the tensor data follows.
//! Only the header is needed to count stored bytes, so callers read or fetch
//! [`needed_prefix_len`] bytes and never the weights.
//!
//! Sharded checkpoints add `model.safetensors.index.json` (transformers'
//! `SAFE_WEIGHTS_INDEX_NAME`): `{"metadata": {"total_size": …}, "weight_map": {tensor: file}}`.
//!
//! The length prefix is parsed here (not by the `safetensors` crate, whose
//! `SafeTensors::read_metadata` needs the whole file); only its [`Dtype`] table is reused.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

pub use safetensors::Dtype;

/// Largest header accepted: 100 MB. The safetensors crate caps headers at the same
/// `MAX_HEADER_SIZE = 100_000_000` (safetensors `src/tensor.rs`), so no valid file is refused.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Largest `model.safetensors.index.json` accepted (100 MB; real ones are well under 1 MB).
pub const MAX_INDEX_LEN: usize = 100_000_000;

/// A safetensors header or index that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// Fewer bytes than the header needs.
    #[error("safetensors file is truncated: the header needs {needed} bytes, only {have} present")]
    Truncated {
        /// Bytes needed (length prefix included).
        needed: u64,
        /// Bytes present.
        have: u64,
    },
    /// The length prefix is larger than [`MAX_HEADER_LEN`].
    #[error("safetensors header length {0} exceeds the 100 MB limit; not a safetensors file?")]
    HeaderTooLarge(u64),
    /// The header is not the JSON the format requires.
    #[error("safetensors header is invalid: {0}")]
    Invalid(String),
    /// The index JSON is invalid.
    #[error("model.safetensors.index.json is invalid: {0}")]
    Index(String),
}

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// Tensor name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Stored dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<u64>,
    /// Stored bytes (`data_offsets[1] - data_offsets[0]`).
    pub byte_len: u64,
}

impl TensorInfo {
    /// Number of stored elements (product of the shape; 1 for a scalar).
    #[must_use]
    pub fn numel(&self) -> u64 {
        // Checked at parse time not to overflow.
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// A parsed safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SafetensorsHeader {
    /// The tensors, in data-offset order.
    pub tensors: Vec<TensorInfo>,
    /// `__metadata__` (non-string values are kept as their JSON text).
    pub metadata: BTreeMap<String, String>,
}

/// Reads the 8-byte little-endian header length, checked against [`MAX_HEADER_LEN`].
///
/// # Errors
/// [`SafetensorsError::Truncated`] with fewer than 8 bytes, [`SafetensorsError::HeaderTooLarge`].
pub fn header_len(prefix: &[u8]) -> Result<u64, SafetensorsError> {
    let Some(bytes) = prefix.get(..8) else {
        return Err(SafetensorsError::Truncated {
            needed: 8,
            have: prefix.len() as u64,
        });
    };
    let mut le = [0u8; 8];
    le.copy_from_slice(bytes);
    let n = u64::from_le_bytes(le);
    if n > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderTooLarge(n));
    }
    Ok(n)
}

/// How many prefix bytes [`parse_header`] needs: 8 while fewer than 8 are known, then
/// `8 + header length`.
///
/// # Errors
/// [`SafetensorsError::HeaderTooLarge`].
pub fn needed_prefix_len(prefix: &[u8]) -> Result<u64, SafetensorsError> {
    if prefix.len() < 8 {
        return Ok(8);
    }
    Ok(8 + header_len(prefix)?)
}

/// Parses a header from a prefix of the file (at least [`needed_prefix_len`] bytes; extra
/// bytes are ignored).
///
/// # Errors
/// See [`SafetensorsError`].
pub fn parse_header(prefix: &[u8]) -> Result<SafetensorsHeader, SafetensorsError> {
    let n = header_len(prefix)?;
    let have = prefix.len() as u64;
    // n <= MAX_HEADER_LEN, so it fits in usize on every supported target.
    let end = usize::try_from(8 + n).map_err(|_| SafetensorsError::HeaderTooLarge(n))?;
    let json = prefix.get(8..end).ok_or(SafetensorsError::Truncated {
        needed: 8 + n,
        have,
    })?;
    parse_header_json(json)
}

/// Parses the JSON part of a header (the N bytes after the length prefix).
///
/// # Errors
/// [`SafetensorsError::Invalid`]: not JSON (serde_json's nesting limit of 128 applies), wrong
/// field types, an unknown dtype, offsets that do not match shape × dtype.
pub fn parse_header_json(json: &[u8]) -> Result<SafetensorsHeader, SafetensorsError> {
    if json.len() as u64 > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderTooLarge(json.len() as u64));
    }
    // The format allows trailing spaces as padding (the writer pads to 8 bytes).
    let raw: RawHeader =
        serde_json::from_slice(json).map_err(|e| SafetensorsError::Invalid(one_line(&e)))?;
    let mut tensors = Vec::with_capacity(raw.tensors.len());
    let mut offsets = Vec::with_capacity(raw.tensors.len());
    for (name, t) in raw.tensors {
        let dtype: Dtype = serde_json::from_value(serde_json::Value::String(t.dtype.clone()))
            .map_err(|_| {
                SafetensorsError::Invalid(format!(
                    "tensor `{name}` has unknown dtype `{}`",
                    t.dtype
                ))
            })?;
        let [begin, end] = t.data_offsets;
        let byte_len = end.checked_sub(begin).ok_or_else(|| {
            SafetensorsError::Invalid(format!("tensor `{name}` has data_offsets [{begin}, {end}]"))
        })?;
        let bits = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|numel| numel.checked_mul(dtype.bitsize() as u64))
            .ok_or_else(|| {
                SafetensorsError::Invalid(format!("tensor `{name}` shape overflows u64"))
            })?;
        if bits.div_ceil(8) != byte_len {
            return Err(SafetensorsError::Invalid(format!(
                "tensor `{name}`: shape {:?} of {dtype:?} needs {} bytes but data_offsets span {byte_len}",
                t.shape,
                bits.div_ceil(8)
            )));
        }
        offsets.push(begin);
        tensors.push(TensorInfo {
            name,
            dtype,
            shape: t.shape,
            byte_len,
        });
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (offsets[i], i));
    let mut sorted: Vec<Option<TensorInfo>> = tensors.into_iter().map(Some).collect();
    let tensors = order.into_iter().filter_map(|i| sorted[i].take()).collect();
    Ok(SafetensorsHeader {
        tensors,
        metadata: raw.metadata,
    })
}

fn one_line(e: &serde_json::Error) -> String {
    e.to_string().replace('\n', " ")
}

#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

struct RawHeader {
    tensors: Vec<(String, RawTensor)>,
    metadata: BTreeMap<String, String>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeader;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
                let mut out = RawHeader {
                    tensors: Vec::new(),
                    metadata: BTreeMap::new(),
                };
                let mut seen = std::collections::BTreeSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!("duplicate key `{key}`")));
                    }
                    if key == "__metadata__" {
                        let m: Option<BTreeMap<String, serde_json::Value>> = map.next_value()?;
                        for (k, v) in m.unwrap_or_default() {
                            let text = match v {
                                serde_json::Value::String(s) => s,
                                other => other.to_string(),
                            };
                            out.metadata.insert(k, text);
                        }
                    } else {
                        let t: RawTensor = map.next_value().map_err(|e: A::Error| {
                            de::Error::custom(format!("tensor `{key}`: {e}"))
                        })?;
                        out.tensors.push((key, t));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// A parsed `model.safetensors.index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ShardIndex {
    /// Tensor name → shard file name.
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`: stored bytes of all tensors, when present.
    pub total_size: Option<u64>,
}

impl ShardIndex {
    /// The distinct shard file names, sorted.
    #[must_use]
    pub fn shard_files(&self) -> Vec<String> {
        let mut files: Vec<String> = self.weight_map.values().cloned().collect();
        files.sort();
        files.dedup();
        files
    }
}

/// Parses `model.safetensors.index.json`. Shard names must be plain relative file names (no
/// `..`, no absolute path, no backslash), since callers turn them into URLs and cache paths.
///
/// # Errors
/// [`SafetensorsError::Index`].
pub fn parse_index(bytes: &[u8]) -> Result<ShardIndex, SafetensorsError> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        metadata: Option<serde_json::Map<String, serde_json::Value>>,
        weight_map: BTreeMap<String, String>,
    }
    if bytes.len() > MAX_INDEX_LEN {
        return Err(SafetensorsError::Index("larger than 100 MB".into()));
    }
    let raw: Raw =
        serde_json::from_slice(bytes).map_err(|e| SafetensorsError::Index(one_line(&e)))?;
    for file in raw.weight_map.values() {
        if !is_safe_relative_name(file) {
            return Err(SafetensorsError::Index(format!(
                "shard file name `{file}` is not allowed"
            )));
        }
    }
    let total_size = raw
        .metadata
        .as_ref()
        .and_then(|m| m.get("total_size"))
        .and_then(|v| {
            // Some writers store it as a float (`1.2e10`) or a string.
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| *f >= 0.0 && f.is_finite())
                        .map(f64_to_u64)
                })
        });
    Ok(ShardIndex {
        weight_map: raw.weight_map,
        total_size,
    })
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn f64_to_u64(f: f64) -> u64 {
    f as u64
}

/// Whether `name` is a relative path of plain components (`a.safetensors`,
/// `sub/a.safetensors`): no empty, `.` or `..` component, no leading `/`, no backslash, no
/// NUL or control character, at most 255 bytes.
#[must_use]
pub fn is_safe_relative_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('/')
        && !name.contains('\\')
        && !name.chars().any(char::is_control)
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// What a checkpoint stores, summed over all its tensors (all shards).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct StoredWeights {
    /// Stored bytes of all tensors.
    pub total_bytes: u64,
    /// Stored bytes per dtype.
    pub by_dtype: BTreeMap<String, u64>,
    /// Parameters of the unquantized model, counting packed elements as the weights they
    /// stand for and leaving out quantization side tensors (scales, zeros, `absmax`, ...).
    pub params_estimate: u64,
    /// The pre-quantization detected from tensor names and dtypes: `bitsandbytes-4bit`,
    /// `bitsandbytes-8bit`, `gptq`, `awq`, `compressed-tensors`, `fp8`, `mxfp4`, or `None`.
    pub quantization: Option<&'static str>,
}

/// How a tensor counts toward the parameter estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Counts as many parameters as elements × this factor.
    Params(u64),
    /// A quantization side tensor: no parameters.
    Aux,
}

/// Suffixes of quantization side tensors, which hold no model parameters:
/// - bitsandbytes `Params4bit.quant_state.as_dict()` (bitsandbytes `functional.py`
///   `QuantState.as_dict`): `absmax`, `quant_map`, `nested_absmax`, `nested_quant_map`,
///   `quant_state.bitsandbytes__nf4` / `__fp4`; LLM.int8 (`Linear8bitLt._save_to_state_dict`):
///   `SCB`, `weight_format`.
/// - AutoGPTQ / AutoAWQ `QuantLinear` buffers: `qzeros`, `scales`, `g_idx`.
/// - compressed-tensors (`compressed_tensors/compressors`): `weight_scale`,
///   `weight_zero_point`, `weight_g_idx`, `weight_shape`, `input_scale`, `output_scale`.
/// - FP8 checkpoints (DeepSeek-V3, Qwen-FP8): `weight_scale_inv`, `weight_scale`,
///   `input_scale`, `k_scale`, `v_scale`.
/// - MXFP4 (gpt-oss, transformers `integrations/mxfp4.py`): `_scales`.
const AUX_SUFFIXES: &[&str] = &[
    ".absmax",
    ".quant_map",
    ".nested_absmax",
    ".nested_quant_map",
    ".quant_state.bitsandbytes__nf4",
    ".quant_state.bitsandbytes__fp4",
    ".SCB",
    ".weight_format",
    ".qzeros",
    ".scales",
    ".g_idx",
    ".weight_scale",
    ".weight_scale_inv",
    ".weight_zero_point",
    ".weight_g_idx",
    ".weight_shape",
    ".input_scale",
    ".output_scale",
    ".k_scale",
    ".v_scale",
    "_scales",
];

/// Sums what a checkpoint stores. Pass the tensors of every shard.
///
/// Packing rules for the parameter estimate:
/// - GPTQ/AWQ `*.qweight` is `int32` with 32/bits weights per element (AutoGPTQ
///   `QuantLinear.pack`; AutoAWQ `WQLinear_GEMM`); `bits` defaults to 4 (pass the config's
///   `quantization_config.bits` when known). compressed-tensors `*.weight_packed` likewise.
/// - bitsandbytes 4-bit `X.weight` (`uint8`, shape `[n/2, 1]`) packs two 4-bit values per
///   byte, recognised by a sibling `X.weight.quant_state.bitsandbytes__nf4`/`__fp4`
///   (bitsandbytes `Params4bit`).
/// - MXFP4 `*_blocks` (`uint8`) pack two FP4 values per byte (OCP MX spec, as in gpt-oss).
#[must_use]
pub fn stored_weights<'a>(
    tensors: impl IntoIterator<Item = &'a TensorInfo>,
    bits: Option<u64>,
) -> StoredWeights {
    let tensors: Vec<&TensorInfo> = tensors.into_iter().collect();
    let names: std::collections::BTreeSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let bits = bits.filter(|b| (1..=32).contains(b)).unwrap_or(4);
    let mut out = StoredWeights::default();
    let (mut bnb4, mut bnb8, mut qweight, mut g_idx, mut packed, mut fp8, mut mx) =
        (false, false, false, false, false, false, false);
    for t in &tensors {
        out.total_bytes = out.total_bytes.saturating_add(t.byte_len);
        let e = out.by_dtype.entry(format!("{:?}", t.dtype)).or_insert(0);
        *e = e.saturating_add(t.byte_len);
        let n = &t.name;
        let role = if n.ends_with(".qweight") {
            qweight = true;
            Role::Params(32 / bits)
        } else if n.ends_with(".weight_packed") {
            packed = true;
            Role::Params(32 / bits)
        } else if n.ends_with("_blocks") && t.dtype == Dtype::U8 {
            mx = true;
            Role::Params(2)
        } else if AUX_SUFFIXES.iter().any(|s| n.ends_with(s)) {
            if n.ends_with(".g_idx") {
                g_idx = true;
            }
            if n.ends_with(".SCB") {
                bnb8 = true;
            }
            Role::Aux
        } else if names.contains(format!("{n}.quant_state.bitsandbytes__nf4").as_str())
            || names.contains(format!("{n}.quant_state.bitsandbytes__fp4").as_str())
        {
            bnb4 = true;
            Role::Params(2)
        } else {
            if matches!(t.dtype, Dtype::F8_E4M3 | Dtype::F8_E5M2) {
                fp8 = true;
            }
            Role::Params(1)
        };
        if let Role::Params(k) = role {
            out.params_estimate = out
                .params_estimate
                .saturating_add(t.numel().saturating_mul(k));
        }
    }
    out.quantization = if bnb4 {
        Some("bitsandbytes-4bit")
    } else if bnb8 {
        Some("bitsandbytes-8bit")
    } else if packed {
        Some("compressed-tensors")
    } else if qweight && g_idx {
        Some("gptq")
    } else if qweight {
        Some("awq")
    } else if mx {
        Some("mxfp4")
    } else if fp8 {
        Some("fp8")
    } else {
        None
    };
    out
}

/// Result of checking a header's parameter estimate against the config's count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum ParamCheck {
    /// Equal.
    Exact,
    /// Within 1% (GPTQ/AWQ pad in-features to a group multiple; some checkpoints carry
    /// extra buffers such as rotary `inv_freq`).
    Close {
        /// (stored − expected) / expected.
        relative: f64,
    },
    /// Off by more than 1%: wrong config, untied embeddings counted twice, or a checkpoint
    /// with extra heads (MTP layers, vision towers).
    Mismatch {
        /// (stored − expected) / expected.
        relative: f64,
    },
}

/// Compares [`StoredWeights::params_estimate`] with the config's parameter count.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn check_params(stored: u64, expected: u64) -> ParamCheck {
    if stored == expected {
        return ParamCheck::Exact;
    }
    let relative = (stored as f64 - expected as f64) / (expected.max(1) as f64);
    if relative.abs() <= 0.01 {
        ParamCheck::Close { relative }
    } else {
        ParamCheck::Mismatch { relative }
    }
}

/// Serializes a header for tests and fixtures: the 8-byte length, the JSON (padded with
/// spaces to a multiple of 8, as the reference writer does), no data.
#[must_use]
pub fn encode_header(tensors: &[(&str, &str, &[u64])], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned())))
            .collect();
        map.insert("__metadata__".into(), serde_json::Value::Object(m));
    }
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let bits: u64 = serde_json::from_value::<Dtype>(serde_json::Value::String((*dtype).into()))
            .map_or(8, |d| d.bitsize() as u64);
        let len = shape
            .iter()
            .product::<u64>()
            .saturating_mul(bits)
            .div_ceil(8);
        map.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut json = serde_json::Value::Object(map).to_string().into_bytes();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_header_and_counts_bytes() {
        let bytes = encode_header(
            &[
                ("b", "F32", &[2, 3]),
                ("a", "BF16", &[4]),
                ("s", "I64", &[]),
            ],
            &[("format", "pt")],
        );
        assert_eq!(needed_prefix_len(&bytes[..3]).unwrap(), 8);
        assert_eq!(needed_prefix_len(&bytes).unwrap(), bytes.len() as u64);
        let h = parse_header(&bytes).unwrap();
        // Sorted by data offset: b (0..24), a (24..32), s.
        let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b", "a", "s"]);
        assert_eq!(h.tensors[0].byte_len, 24);
        assert_eq!(h.tensors[1].byte_len, 8);
        assert_eq!(h.tensors[2].numel(), 1);
        assert_eq!(h.metadata["format"], "pt");
        let s = stored_weights(&h.tensors, None);
        assert_eq!(s.total_bytes, 24 + 8 + 8);
        assert_eq!(s.by_dtype["F32"], 24);
        assert_eq!(s.by_dtype["BF16"], 8);
        assert_eq!(s.params_estimate, 6 + 4 + 1);
        assert_eq!(s.quantization, None);
    }

    #[test]
    fn hostile_lengths_are_errors() {
        let mut b = (1u64 << 63).to_le_bytes().to_vec();
        b.extend_from_slice(b"{}");
        assert_eq!(
            parse_header(&b),
            Err(SafetensorsError::HeaderTooLarge(1 << 63))
        );
        assert!(matches!(
            needed_prefix_len(&b),
            Err(SafetensorsError::HeaderTooLarge(_))
        ));
        assert!(matches!(
            parse_header(&[1, 2]),
            Err(SafetensorsError::Truncated { .. })
        ));
        let full = encode_header(&[("a", "F16", &[2])], &[]);
        let err = parse_header(&full[..full.len() - 1]).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let depth = 1_000_000;
        let mut json = String::with_capacity(depth * 2 + 10);
        json.push_str("{\"a\":");
        json.extend(std::iter::repeat_n('[', depth));
        json.extend(std::iter::repeat_n(']', depth));
        json.push('}');
        let err = parse_header_json(json.as_bytes()).unwrap_err();
        assert!(matches!(err, SafetensorsError::Invalid(_)), "{err}");
        let mut meta = String::from("{\"__metadata__\":{\"k\":");
        meta.extend(std::iter::repeat_n('[', depth));
        assert!(parse_header_json(meta.as_bytes()).is_err());
        let mut idx = String::from("{\"weight_map\":{},\"metadata\":");
        idx.extend(std::iter::repeat_n('{', depth));
        assert!(parse_index(idx.as_bytes()).is_err());
    }

    #[test]
    fn inconsistent_tensors_are_errors() {
        let bad = |json: &str| parse_header_json(json.as_bytes()).unwrap_err().to_string();
        assert!(
            bad(r#"{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}}"#).contains("needs 6")
        );
        assert!(bad(r#"{"a":{"dtype":"Q9","shape":[3],"data_offsets":[0,4]}}"#).contains("dtype"));
        assert!(
            bad(r#"{"a":{"dtype":"F16","shape":[3],"data_offsets":[9,4]}}"#)
                .contains("data_offsets")
        );
        let huge = format!(
            r#"{{"a":{{"dtype":"F16","shape":[{m},{m}],"data_offsets":[0,4]}}}}"#,
            m = u64::MAX
        );
        assert!(bad(&huge).contains("overflows"));
        assert!(bad(r#"{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}"#).contains("duplicate"));
        assert!(bad("[]").contains("object"));
    }

    #[test]
    fn index_is_parsed_and_names_checked() {
        let idx = parse_index(
            br#"{"metadata":{"total_size":1234},"weight_map":{"a":"m-00002.safetensors","b":"m-00001.safetensors","c":"m-00001.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(idx.total_size, Some(1234));
        assert_eq!(
            idx.shard_files(),
            ["m-00001.safetensors", "m-00002.safetensors"]
        );
        for bad in ["../x", "/etc/passwd", "a/../b", "a\\b", ""] {
            let json = format!(r#"{{"weight_map":{{"a":{}}}}}"#, serde_json::json!(bad));
            assert!(parse_index(json.as_bytes()).is_err(), "{bad}");
        }
        let f = parse_index(br#"{"metadata":{"total_size":1.5e3},"weight_map":{}}"#).unwrap();
        assert_eq!(f.total_size, Some(1500));
    }

    fn t(name: &str, dtype: Dtype, shape: &[u64]) -> TensorInfo {
        let numel: u64 = shape.iter().product();
        TensorInfo {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            byte_len: (numel * dtype.bitsize() as u64).div_ceil(8),
        }
    }

    #[test]
    fn detects_packed_quantization() {
        // A 64x128 Linear in GPTQ 4-bit, group size 32: qweight [64/8, 128] int32.
        let gptq = [
            t("l.qweight", Dtype::I32, &[8, 128]),
            t("l.qzeros", Dtype::I32, &[2, 16]),
            t("l.scales", Dtype::F16, &[2, 128]),
            t("l.g_idx", Dtype::I32, &[64]),
            t("l.bias", Dtype::F16, &[128]),
        ];
        let s = stored_weights(&gptq, None);
        assert_eq!(s.params_estimate, 64 * 128 + 128);
        assert_eq!(s.quantization, Some("gptq"));
        // AWQ: qweight [in, out/8], no g_idx.
        let awq = [
            t("l.qweight", Dtype::I32, &[64, 16]),
            t("l.scales", Dtype::F16, &[2, 128]),
        ];
        let s = stored_weights(&awq, None);
        assert_eq!((s.params_estimate, s.quantization), (64 * 128, Some("awq")));
        // 8-bit GPTQ packs 4 per int32.
        assert_eq!(stored_weights(&awq, Some(8)).params_estimate, 64 * 64);
        // bnb nf4: weight uint8 [n/2, 1] + quant state.
        let bnb = [
            t("l.weight", Dtype::U8, &[4096, 1]),
            t("l.weight.absmax", Dtype::F32, &[128]),
            t("l.weight.quant_map", Dtype::F32, &[16]),
            t("l.weight.quant_state.bitsandbytes__nf4", Dtype::U8, &[100]),
            t("norm.weight", Dtype::BF16, &[64]),
        ];
        let s = stored_weights(&bnb, None);
        assert_eq!(
            (s.params_estimate, s.quantization),
            (8192 + 64, Some("bitsandbytes-4bit"))
        );
        assert_eq!(s.by_dtype["U8"], 4096 + 100);
        let int8 = [
            t("l.weight", Dtype::I8, &[64, 64]),
            t("l.SCB", Dtype::F32, &[64]),
        ];
        let s = stored_weights(&int8, None);
        assert_eq!(
            (s.params_estimate, s.quantization),
            (4096, Some("bitsandbytes-8bit"))
        );
        let fp8 = [
            t("l.weight", Dtype::F8_E4M3, &[256, 256]),
            t("l.weight_scale_inv", Dtype::F32, &[2, 2]),
        ];
        let s = stored_weights(&fp8, None);
        assert_eq!((s.params_estimate, s.quantization), (65536, Some("fp8")));
        let mx = [
            t("e.gate_up_proj_blocks", Dtype::U8, &[2, 64, 2, 16]),
            t("e.gate_up_proj_scales", Dtype::U8, &[2, 64, 2]),
        ];
        let s = stored_weights(&mx, None);
        assert_eq!(
            (s.params_estimate, s.quantization),
            (2 * 64 * 2 * 32, Some("mxfp4"))
        );
    }

    #[test]
    fn param_check() {
        assert_eq!(check_params(100, 100), ParamCheck::Exact);
        assert!(matches!(check_params(1005, 1000), ParamCheck::Close { .. }));
        assert!(matches!(
            check_params(2000, 1000),
            ParamCheck::Mismatch { .. }
        ));
        assert!(matches!(check_params(5, 0), ParamCheck::Mismatch { .. }));
    }
}
