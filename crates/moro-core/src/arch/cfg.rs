//! Typed, validating access to the keys of a HF `config.json` object.
//!
//! Every getter names the key it read in its error, prefixed by the sub-object it came from
//! (`text_config.hidden_size`), so a user can find the offending line.

use serde_json::{Map, Value};

use super::ArchError;
use crate::model::Dtype;

/// Largest accepted hidden size. The biggest public dense models use 16–25k (Llama-3.1-405B:
/// 16384); 2^18 leaves room and keeps every product far from `u64` overflow.
pub(crate) const MAX_HIDDEN: u64 = 1 << 18;
/// Largest accepted MLP width (Llama-3.1-405B: 53248).
pub(crate) const MAX_INTERMEDIATE: u64 = 1 << 21;
/// Largest accepted vocabulary (Gemma 3: 262,208 rows).
pub(crate) const MAX_VOCAB: u64 = 1 << 23;
/// Largest accepted number of decoder layers (public models: at most ~130).
pub(crate) const MAX_LAYERS: u64 = 1 << 12;
/// Largest accepted number of attention heads.
pub(crate) const MAX_HEADS: u64 = 1 << 12;
/// Largest accepted head dimension (public models: 64–256).
pub(crate) const MAX_HEAD_DIM: u64 = 1 << 14;
/// Largest accepted number of routed experts (DeepSeek-V3: 256).
pub(crate) const MAX_EXPERTS: u64 = 1 << 14;
/// Largest accepted context length / learned position table.
pub(crate) const MAX_POSITIONS: u64 = 1 << 30;
/// Largest accepted total parameter count, 2^50 (about 1.1e15, over a thousand times the
/// largest public model); keeps byte counts ×16 (Adam states) inside `u64`.
pub(crate) const MAX_TOTAL_PARAMS: u64 = 1 << 50;

/// A JSON object with the path prefix used in error messages.
#[derive(Clone, Copy)]
pub(crate) struct Cfg<'a> {
    map: &'a Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Cfg<'a> {
    /// Wraps a top-level object.
    pub(crate) const fn new(map: &'a Map<String, Value>) -> Self {
        Self { map, prefix: "" }
    }

    /// Wraps a sub-object (`text_config`), whose errors are prefixed `prefix.`.
    pub(crate) const fn nested(map: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Self { map, prefix }
    }

    /// The full name of a key, for errors.
    pub(crate) fn name(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    /// An error about `key`.
    pub(crate) fn err(&self, key: &str, problem: impl Into<String>) -> ArchError {
        ArchError::Field {
            field: self.name(key),
            problem: problem.into(),
        }
    }

    /// The raw value; JSON `null` counts as absent (HF writes `"sliding_window": null`).
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is written at all, even as `null`.
    pub(crate) fn has_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Whether `key` is present and not null.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// A non-negative integer, when present. Integral floats (`4096.0`) are accepted.
    pub(crate) fn opt_uint(&self, key: &str) -> Result<Option<u64>, ArchError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        as_uint(v).map(Some).map_err(|p| self.err(key, p))
    }

    /// A positive integer at most `max`, when present.
    pub(crate) fn opt_dim(&self, key: &str, max: u64) -> Result<Option<u64>, ArchError> {
        match self.opt_uint(key)? {
            None => Ok(None),
            Some(0) => Err(self.err(key, "must be positive (got 0)")),
            Some(n) if n > max => Err(self.err(key, format!("must be at most {max} (got {n})"))),
            Some(n) => Ok(Some(n)),
        }
    }

    /// A required positive integer at most `max`.
    pub(crate) fn dim(&self, key: &str, max: u64) -> Result<u64, ArchError> {
        self.opt_dim(key, max)?
            .ok_or_else(|| self.err(key, "is missing"))
    }

    /// A positive integer at most `max`, or `default` when absent.
    pub(crate) fn dim_or(&self, key: &str, default: u64, max: u64) -> Result<u64, ArchError> {
        Ok(self.opt_dim(key, max)?.unwrap_or(default))
    }

    /// The first present key of `keys` (HF attribute aliases such as `n_embd`/`hidden_size`),
    /// required, positive and at most `max`. A missing value is reported under `keys[0]`.
    pub(crate) fn dim_any(&self, keys: &[&str], max: u64) -> Result<u64, ArchError> {
        for key in keys {
            if let Some(n) = self.opt_dim(key, max)? {
                return Ok(n);
            }
        }
        Err(self.err(keys.first().copied().unwrap_or("?"), "is missing"))
    }

    /// A non-negative integer at most `max`, or `default` when absent (zero allowed:
    /// `first_k_dense_replace`, `n_shared_experts`).
    pub(crate) fn uint_or(&self, key: &str, default: u64, max: u64) -> Result<u64, ArchError> {
        match self.opt_uint(key)? {
            None => Ok(default),
            Some(n) if n > max => Err(self.err(key, format!("must be at most {max} (got {n})"))),
            Some(n) => Ok(n),
        }
    }

    /// A boolean, or `default` when absent.
    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool, ArchError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.err(key, "must be true or false")),
        }
    }

    /// A string, when present.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ArchError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(self.err(key, "must be a string")),
        }
    }

    /// A list of non-negative integers (`mlp_only_layers`), empty when absent.
    pub(crate) fn uint_list(&self, key: &str) -> Result<Vec<u64>, ArchError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| as_uint(v).map_err(|p| self.err(key, format!("entries {p}"))))
                .collect(),
            Some(_) => Err(self.err(key, "must be a list of integers")),
        }
    }

    /// A list of strings (`layer_types`), when present.
    pub(crate) fn opt_str_list(&self, key: &str) -> Result<Option<Vec<&'a str>>, ArchError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| self.err(key, "must be a list of strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(self.err(key, "must be a list of strings")),
        }
    }

    /// A sub-object (`text_config`), when present.
    pub(crate) fn opt_object(
        &self,
        key: &str,
    ) -> Result<Option<&'a Map<String, Value>>, ArchError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(self.err(key, "must be an object")),
        }
    }

    /// The checkpoint dtype: `torch_dtype` (transformers < 4.56) or `dtype` (newer), else
    /// `default`.
    pub(crate) fn dtype_or(&self, default: Dtype) -> Result<Dtype, ArchError> {
        for key in ["torch_dtype", "dtype"] {
            if let Some(s) = self.opt_str(key)? {
                return Dtype::from_hf(s)
                    .ok_or_else(|| self.err(key, format!("has an unsupported dtype `{s}`")));
            }
        }
        Ok(default)
    }

    /// Whether the dtype keys are present (used to fall back to a parent object's).
    pub(crate) fn has_dtype(&self) -> bool {
        self.has("torch_dtype") || self.has("dtype")
    }
}

/// A JSON value as a non-negative integer; the error is the problem text.
fn as_uint(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                return Ok(u);
            }
            if n.as_i64().is_some_and(|i| i < 0) {
                return Err(format!("must not be negative (got {n})"));
            }
            match n.as_f64() {
                Some(f) if f < 0.0 => Err(format!("must not be negative (got {n})")),
                // 2^53: the largest float below which every integer is exact.
                Some(f) if f.fract() == 0.0 && f <= 9_007_199_254_740_992.0 =>
                {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    Ok(f as u64)
                }
                _ => Err(format!("must be an integer (got {n})")),
            }
        }
        _ => Err("must be an integer".to_owned()),
    }
}

/// `a · b`, or an error naming `field` on overflow.
pub(crate) fn mul(a: u64, b: u64, field: &str) -> Result<u64, ArchError> {
    a.checked_mul(b).ok_or_else(|| ArchError::Field {
        field: field.to_owned(),
        problem: "makes a tensor size overflow".to_owned(),
    })
}

/// `a + b`, or an error naming `field` on overflow.
pub(crate) fn add(a: u64, b: u64, field: &str) -> Result<u64, ArchError> {
    a.checked_add(b).ok_or_else(|| ArchError::Field {
        field: field.to_owned(),
        problem: "makes a tensor size overflow".to_owned(),
    })
}
