//! GGUF headers, from bytes, and a llama.cpp-style inference memory estimate.
//!
//! Layout (ggml `docs/gguf.md`; reader `ggml/src/gguf.cpp`), all little-endian:
//! magic `GGUF`, `u32` version (2 or 3; version 1 used 32-bit counts and is refused),
//! `u64` tensor count, `u64` key-value count, the key-values (`gguf_string` key, `u32` value
//! type, value; strings are a `u64` length and the bytes; arrays are a `u32` element type, a
//! `u64` count and the elements), the tensor infos (name, `u32` n_dims ≤ 4, `u64` dims, `u32` ggml type, `u64`
//! offset into the data section), then padding to `general.alignment` (default 32) and the
//! tensor data.
//!
//! Every count is checked against the bytes that remain before anything is allocated or
//! looped over: a count that cannot fit is reported as [`GgufError::Truncated`] with the
//! minimum size it implies, so a caller holding only a prefix of the file can fetch more, and a
//! caller holding the whole file gets a clear error. Arrays longer than [`MAX_KEPT_ARRAY`]
//! elements (token lists, merges) are walked and counted but not kept.

use std::collections::BTreeSet;

use serde::Serialize;

/// `GGUF` as the first four bytes (`GGUF_MAGIC`, gguf.cpp).
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Default data alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`, gguf.h).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Most dimensions a tensor has (`GGML_MAX_DIMS`, ggml.h).
pub const MAX_DIMS: u32 = 4;

/// Arrays with more elements than this keep only their length.
pub const MAX_KEPT_ARRAY: u64 = 4096;

/// Deepest array nesting accepted (real files nest at most 2: arrays of arrays are not
/// written by gguf-py, but the format allows them).
pub const MAX_NESTING: u32 = 8;

/// Largest `block_count` accepted; real models have fewer than 1000 layers, and the estimate
/// allocates per-layer vectors.
pub const MAX_LAYERS: u64 = 65_536;

/// A GGUF header that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {0:?}, expected \"GGUF\"")]
    BadMagic(String),
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {0}; only versions 2 and 3 are read")]
    Version(u32),
    /// The bytes end before the header does (or a count claims more than the bytes hold).
    #[error(
        "GGUF header is truncated or corrupt: {what} needs at least {needed} bytes, only {have} present"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Minimum total bytes (from the start of the file) needed to go on.
        needed: u64,
        /// Bytes present.
        have: u64,
    },
    /// Structurally invalid content.
    #[error("GGUF header is invalid: {0}")]
    Invalid(String),
}

/// Metadata value types (`enum gguf_type`, gguf.h).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub enum GgufValue {
    /// `GGUF_TYPE_UINT8` (0).
    U8(u8),
    /// `GGUF_TYPE_INT8` (1).
    I8(i8),
    /// `GGUF_TYPE_UINT16` (2).
    U16(u16),
    /// `GGUF_TYPE_INT16` (3).
    I16(i16),
    /// `GGUF_TYPE_UINT32` (4).
    U32(u32),
    /// `GGUF_TYPE_INT32` (5).
    I32(i32),
    /// `GGUF_TYPE_FLOAT32` (6).
    F32(f32),
    /// `GGUF_TYPE_BOOL` (7).
    Bool(bool),
    /// `GGUF_TYPE_STRING` (8); invalid UTF-8 is replaced.
    String(String),
    /// `GGUF_TYPE_ARRAY` (9).
    Array(GgufArray),
    /// `GGUF_TYPE_UINT64` (10).
    U64(u64),
    /// `GGUF_TYPE_INT64` (11).
    I64(i64),
    /// `GGUF_TYPE_FLOAT64` (12).
    F64(f64),
}

/// A metadata array.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufArray {
    /// Element type id.
    pub elem_type: u32,
    /// Number of elements.
    pub len: u64,
    /// The elements, or empty when `len > MAX_KEPT_ARRAY`.
    pub values: Vec<GgufValue>,
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    #[must_use]
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(u64::from(v)),
            Self::U16(v) => Some(u64::from(v)),
            Self::U32(v) => Some(u64::from(v)),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            Self::Bool(v) => Some(u64::from(v)),
            _ => None,
        }
    }

    /// The value as a float, when numeric.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(f64::from(v)),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(f64::from(v)),
            Self::I16(v) => Some(f64::from(v)),
            Self::I32(v) => Some(f64::from(v)),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string.
    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
}

/// A ggml tensor type with its block layout.
///
/// Block sizes and bytes per block are ggml's `type_traits` (`ggml/src/ggml.c`), from the
/// block structs of `ggml/src/ggml-common.h`, as mirrored by llama.cpp's `gguf-py` 0.19.0
/// `GGML_QUANT_SIZES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct GgmlType {
    /// `enum ggml_type` value.
    pub id: u32,
    /// Name as ggml prints it (`q4_K`, `f16`, ...), lowercase as llama.cpp's
    /// `--cache-type-k` takes them.
    pub name: &'static str,
    /// Elements per block.
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
}

/// `QK_K`, the super-block size of the k-quants and i-quants (ggml-common.h).
const QK_K: u64 = 256;

/// The ggml type table: (id, name, block size, bytes per block). Removed types (4, 5: Q4_2/3;
/// 31–33: Q4_0_4_4/4_8/8_8; 36–38: IQ4_NL_4_4/4_8/8_8) are not listed; llama.cpp refuses
/// them too.
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "f32", 1, 4),
    (1, "f16", 1, 2),
    (2, "q4_0", 32, 2 + 16),
    (3, "q4_1", 32, 2 + 2 + 16),
    (6, "q5_0", 32, 2 + 4 + 16),
    (7, "q5_1", 32, 2 + 2 + 4 + 16),
    (8, "q8_0", 32, 2 + 32),
    (9, "q8_1", 32, 4 + 4 + 32),
    (10, "q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    (11, "q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    (12, "q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    (13, "q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    (14, "q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    (15, "q8_K", QK_K, 4 + QK_K + QK_K / 8),
    (16, "iq2_xxs", QK_K, 2 + QK_K / 4),
    (17, "iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32),
    (18, "iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8),
    (19, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16),
    (20, "iq4_nl", 32, 2 + 16),
    (21, "iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    (22, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16),
    (23, "iq4_xs", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    (24, "i8", 1, 1),
    (25, "i16", 1, 2),
    (26, "i32", 1, 4),
    (27, "i64", 1, 8),
    (28, "f64", 1, 8),
    (29, "iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    (30, "bf16", 1, 2),
    (34, "tq1_0", QK_K, 2 + 4 * 13),
    (35, "tq2_0", QK_K, 2 + 64),
    (39, "mxfp4", 32, 1 + 16),
    (40, "nvfp4", 64, 4 + 32),
    (41, "q1_0", 128, 2 + 16),
];

impl GgmlType {
    /// `f32`.
    pub const F32: Self = Self {
        id: 0,
        name: "f32",
        block_size: 1,
        type_size: 4,
    };
    /// `f16` (llama.cpp's default KV cache type).
    pub const F16: Self = Self {
        id: 1,
        name: "f16",
        block_size: 1,
        type_size: 2,
    };
    /// `q8_0`.
    pub const Q8_0: Self = Self {
        id: 8,
        name: "q8_0",
        block_size: 32,
        type_size: 34,
    };
    /// `q4_0`.
    pub const Q4_0: Self = Self {
        id: 2,
        name: "q4_0",
        block_size: 32,
        type_size: 18,
    };

    /// Looks a type up by its `enum ggml_type` id.
    #[must_use]
    pub fn from_id(id: u32) -> Option<Self> {
        GGML_TYPES
            .iter()
            .find(|t| t.0 == id)
            .map(|&(id, name, block_size, type_size)| Self {
                id,
                name,
                block_size,
                type_size,
            })
    }

    /// Looks a type up by name, case-insensitively (`q8_0`, `F16`, `Q4_K`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        GGML_TYPES
            .iter()
            .find(|t| t.1.eq_ignore_ascii_case(name.trim()))
            .and_then(|t| Self::from_id(t.0))
    }

    /// Whether it is a block-quantized type.
    #[must_use]
    pub const fn is_quantized(self) -> bool {
        self.block_size > 1
    }

    /// Bytes of a row of `ne0` elements (`ggml_row_size`: `type_size * ne0 / block_size`),
    /// `None` if `ne0` is not a multiple of the block size or on overflow.
    #[must_use]
    pub fn row_size(self, ne0: u64) -> Option<u64> {
        if !ne0.is_multiple_of(self.block_size) {
            return None;
        }
        (ne0 / self.block_size).checked_mul(self.type_size)
    }
}

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GgufTensorInfo {
    /// Name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (`ne[0]` is the row length).
    pub dims: Vec<u64>,
    /// Type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Data bytes (`ggml_nbytes` of a contiguous tensor: `row_size(ne0) · ne1 · ne2 · ne3`).
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// The decoder layer the tensor belongs to (`blk.{i}.…`), if any.
    #[must_use]
    pub fn layer(&self) -> Option<u64> {
        self.name
            .strip_prefix("blk.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Key-value metadata, in file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensor infos, in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Data alignment (`general.alignment` or 32).
    pub alignment: u64,
    /// Offset of the data section (the header size, padded to the alignment).
    pub data_offset: u64,
}

impl GgufHeader {
    /// A metadata value by key.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`.
    #[must_use]
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    /// Sum of all tensors' data bytes.
    #[must_use]
    pub fn weight_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.n_bytes))
    }

    /// Data bytes per ggml type name, largest first (shows the mixture of a `Q4_K_M` file).
    #[must_use]
    pub fn bytes_by_type(&self) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = Vec::new();
        for t in &self.tensors {
            match out.iter_mut().find(|(n, _)| *n == t.ggml_type.name) {
                Some((_, b)) => *b = b.saturating_add(t.n_bytes),
                None => out.push((t.ggml_type.name, t.n_bytes)),
            }
        }
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        out
    }

    /// A tensor by name.
    #[must_use]
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn truncated(&self, what: &str, more: u64) -> GgufError {
        GgufError::Truncated {
            what: what.to_owned(),
            needed: (self.pos as u64).saturating_add(more),
            have: self.buf.len() as u64,
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        // n <= remaining, which fits in usize.
        let n = usize::try_from(n).map_err(|_| self.truncated(what, n))?;
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        Ok(String::from_utf8_lossy(self.take(n, what)?).into_owned())
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
        let need = count.saturating_mul(min_size);
        if need > self.remaining() {
            return Err(self.truncated(&format!("{what} ({count} entries)"), need));
        }
        Ok(())
    }
}

/// Smallest encoding of a value of type `t` (for count checks).
const fn min_value_size(t: u32) -> u64 {
    match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        // array: element type + count
        9 => 12,
        _ => 1,
    }
}

/// Reads a value of type `t`; an array is kept whole when `whole`, else only up to
/// [`MAX_KEPT_ARRAY`] elements.
fn read_value(
    r: &mut Reader<'_>,
    t: u32,
    key: &str,
    depth: u32,
    whole: bool,
) -> Result<GgufValue, GgufError> {
    let what = format!("value of `{key}`");
    Ok(match t {
        0 => GgufValue::U8(r.array::<1>(&what)?[0]),
        1 => GgufValue::I8(i8::from_le_bytes(r.array(&what)?)),
        2 => GgufValue::U16(u16::from_le_bytes(r.array(&what)?)),
        3 => GgufValue::I16(i16::from_le_bytes(r.array(&what)?)),
        4 => GgufValue::U32(u32::from_le_bytes(r.array(&what)?)),
        5 => GgufValue::I32(i32::from_le_bytes(r.array(&what)?)),
        6 => GgufValue::F32(f32::from_le_bytes(r.array(&what)?)),
        7 => match r.array::<1>(&what)?[0] {
            0 => GgufValue::Bool(false),
            1 => GgufValue::Bool(true),
            b => return Err(GgufError::Invalid(format!("`{key}`: bool byte {b}"))),
        },
        8 => GgufValue::String(r.string(&what)?),
        9 => {
            if depth >= MAX_NESTING {
                return Err(GgufError::Invalid(format!(
                    "`{key}`: arrays nested deeper than {MAX_NESTING}"
                )));
            }
            let elem_type = r.u32(&what)?;
            if elem_type > 12 {
                return Err(GgufError::Invalid(format!(
                    "`{key}`: unknown array element type {elem_type}"
                )));
            }
            let len = r.u64(&what)?;
            r.check_count(len, min_value_size(elem_type), &format!("array `{key}`"))?;
            let keep = len <= MAX_KEPT_ARRAY || whole;
            let mut values = Vec::new();
            if keep {
                // At most MAX_KEPT_ARRAY up front: a whole array grows as its elements are
                // read, each one bytes the file really holds.
                values.reserve(usize::try_from(len.min(MAX_KEPT_ARRAY)).unwrap_or(0));
            }
            for _ in 0..len {
                let v = skip_or_read(r, elem_type, key, depth + 1, keep)?;
                if let Some(v) = v {
                    values.push(v);
                }
            }
            GgufValue::Array(GgufArray {
                elem_type,
                len,
                values,
            })
        }
        10 => GgufValue::U64(u64::from_le_bytes(r.array(&what)?)),
        11 => GgufValue::I64(i64::from_le_bytes(r.array(&what)?)),
        12 => GgufValue::F64(f64::from_le_bytes(r.array(&what)?)),
        other => {
            return Err(GgufError::Invalid(format!(
                "`{key}`: unknown value type {other}"
            )));
        }
    })
}

/// Reads a value, or for large arrays' elements only skips over it (fixed-size types in one
/// step, strings by their length).
fn skip_or_read(
    r: &mut Reader<'_>,
    t: u32,
    key: &str,
    depth: u32,
    keep: bool,
) -> Result<Option<GgufValue>, GgufError> {
    if keep {
        return read_value(r, t, key, depth, false).map(Some);
    }
    match t {
        8 => {
            let n = r.u64(key)?;
            r.take(n, &format!("string in `{key}`"))?;
        }
        9 => {
            read_value(r, t, key, depth, false)?;
        }
        7 => {
            if r.array::<1>(key)?[0] > 1 {
                return Err(GgufError::Invalid(format!(
                    "`{key}`: bool byte out of range"
                )));
            }
        }
        _ => {
            r.take(min_value_size(t), key)?;
        }
    }
    Ok(None)
}

/// Parses a GGUF header from a prefix of the file (the whole file works too).
///
/// # Errors
/// [`GgufError::Truncated`] (fetch at least `needed` bytes and retry; if the file is not that
/// long it is corrupt), or another [`GgufError`].
pub fn parse_header(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    parse_header_keeping(bytes, &[])
}

/// [`parse_header`], keeping the arrays of the keys in `whole` at every length (a tokenizer's
/// `tokenizer.ggml.tokens` and `merges`); each element was checked to fit in the bytes.
///
/// # Errors
/// As [`parse_header`].
pub fn parse_header_keeping(bytes: &[u8], whole: &[&str]) -> Result<GgufHeader, GgufError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let magic = r.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic(
            String::from_utf8_lossy(&magic).into_owned(),
        ));
    }
    let version = r.u32("version")?;
    if version != 2 && version != 3 {
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            return Err(GgufError::Invalid(
                "big-endian GGUF files are not supported".into(),
            ));
        }
        return Err(GgufError::Version(version));
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("key-value count")?;
    // A key-value is at least an 8-byte key length, a 4-byte type and a 1-byte value.
    r.check_count(n_kv, 13, "metadata")?;
    let mut metadata = Vec::new();
    let mut keys = BTreeSet::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..n_kv {
        let key = r.string("metadata key")?;
        let t = r.u32("metadata value type")?;
        let value = read_value(&mut r, t, &key, 0, whole.contains(&key.as_str()))?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::Invalid(format!("duplicate key `{key}`")));
        }
        if key == "general.alignment" {
            alignment = match value {
                GgufValue::U32(a) if a != 0 && a.is_power_of_two() => u64::from(a),
                _ => {
                    return Err(GgufError::Invalid(
                        "`general.alignment` must be a power-of-two u32".into(),
                    ));
                }
            };
        }
        metadata.push((key, value));
    }
    // A tensor info is at least: name length 8, n_dims 4, type 4, offset 8.
    r.check_count(n_tensors, 24, "tensor infos")?;
    let mut tensors = Vec::new();
    let mut names = BTreeSet::new();
    for _ in 0..n_tensors {
        let name = r.string("tensor name")?;
        let n_dims = r.u32("tensor dims")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::Invalid(format!(
                "tensor `{name}` has {n_dims} dimensions; at most {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(MAX_DIMS as usize);
        for _ in 0..n_dims {
            dims.push(r.u64("tensor dims")?);
        }
        let type_id = r.u32("tensor type")?;
        let offset = r.u64("tensor offset")?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            GgufError::Invalid(format!("tensor `{name}` has unknown ggml type {type_id}"))
        })?;
        // gguf.cpp refuses element counts above INT64_MAX.
        let numel = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| i64::try_from(n).is_ok());
        let ne0 = dims.first().copied().unwrap_or(1);
        let rows = dims.iter().skip(1).try_fold(1u64, |a, &d| a.checked_mul(d));
        let n_bytes = match (numel, ggml_type.row_size(ne0), rows) {
            (Some(_), Some(row), Some(rows)) => row.checked_mul(rows),
            _ => None,
        }
        .ok_or_else(|| {
            GgufError::Invalid(format!(
                "tensor `{name}`: shape {dims:?} does not fit {} blocks of {}",
                ggml_type.name, ggml_type.block_size
            ))
        })?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::Invalid(format!(
                "tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(GgufError::Invalid(format!("duplicate tensor `{name}`")));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        });
    }
    let data_offset = (r.pos as u64).div_ceil(alignment).saturating_mul(alignment);
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

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

/// llama.cpp run settings that drive its allocations (`llama-cli`/`llama-server` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GgufInferenceParams {
    /// `--ctx-size`; 0 = the model's `context_length`.
    pub ctx_size: u64,
    /// `--batch-size` (logical batch, default 2048).
    pub n_batch: u64,
    /// `--ubatch-size` (physical batch, default 512).
    pub n_ubatch: u64,
    /// `--n-gpu-layers`; values above `block_count` also offload the output layer
    /// (`u64::MAX` = everything).
    pub n_gpu_layers: u64,
    /// `--cache-type-k` (default f16).
    pub type_k: GgmlType,
    /// `--cache-type-v` (default f16; a quantized V cache needs flash attention).
    pub type_v: GgmlType,
    /// `--flash-attn`.
    pub flash_attn: bool,
    /// `--swa-full`: full-size cache for sliding-window layers.
    pub swa_full: bool,
}

impl Default for GgufInferenceParams {
    /// llama.cpp `common/common.h` defaults: `n_ctx = 4096`, `n_batch = 2048`,
    /// `n_ubatch = 512`, f16 KV cache; all layers offloaded, flash attention on (its `auto`
    /// setting enables it on CUDA).
    fn default() -> Self {
        Self {
            ctx_size: 4096,
            n_batch: 2048,
            n_ubatch: 512,
            n_gpu_layers: u64::MAX,
            type_k: GgmlType::F16,
            type_v: GgmlType::F16,
            flash_attn: true,
            swa_full: false,
        }
    }
}

/// What llama.cpp allocates for a GGUF model, split between GPU and host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GgufInferenceEstimate {
    /// KV cells per full-attention layer (the context padded as llama.cpp pads it).
    pub kv_size: u64,
    /// KV cells per sliding-window layer.
    pub kv_size_swa: u64,
    /// Decoder layers on the GPU.
    pub n_layers_offloaded: u64,
    /// Whether the output layer (`output.weight`, `output_norm`) is on the GPU.
    pub output_on_gpu: bool,
    /// Weights of offloaded layers (plus the output layer when offloaded).
    pub gpu_weights_bytes: u64,
    /// Weights left on the host (token embeddings always; non-offloaded layers).
    pub host_weights_bytes: u64,
    /// K and V cache of the offloaded layers.
    pub kv_cache_bytes: u64,
    /// K and V cache of the layers on the host.
    pub kv_cache_host_bytes: u64,
    /// GPU compute buffer (an approximation; see [`gguf_inference_estimate`]).
    pub compute_buffer_bytes: u64,
    /// `gpu_weights_bytes + kv_cache_bytes + compute_buffer_bytes` (no CUDA context).
    pub total_gpu_bytes: u64,
}

/// Estimates what llama.cpp allocates to run a GGUF model, modelling llama.cpp as of b6000
/// (July 2025) on one CUDA GPU with one sequence (`n_seq_max = 1`).
///
/// - **Placement** (`llama-model.cpp` `load_tensors`): with `ngl` = `n_gpu_layers`, layers
///   `il >= n_layer - min(ngl, n_layer)` go to the GPU; the input layer (`token_embd`,
///   position/type embeddings) always stays on the host; the output layer (`output.weight`,
///   `output_norm`, other non-`blk` tensors) goes to the GPU only when `ngl > n_layer`
///   (llama.cpp counts it as layer `n_layer`, hence `-ngl 99`). With tied embeddings (no
///   `output.weight`) llama.cpp loads `token_embd` a second time as the output
///   (`TENSOR_DUPLICATED`), so its bytes count on the GPU too.
/// - **KV cache** (`llama-kv-cache-unified.cpp`): per layer, K is
///   `ggml_row_size(type_k, n_embd_head_k · n_head_kv(il)) · kv_size` and V likewise with
///   `type_v` (block-quantized types need the row to be a multiple of their block size);
///   layers live on the device of their weights. `kv_size` is the context padded to 256 with
///   flash attention, else 32 (`llama_kv_cache_unified::get_padding`). Sliding-window layers
///   (`llama-kv-cache-unified-iswa.cpp`) get `min(kv_size, pad(n_swa + n_ubatch, pad))` cells
///   unless `--swa-full`.
/// - **Compute buffer**: llama.cpp sizes it by building the worst-case graph (`n_ubatch`
///   tokens, every output, the whole KV cache) and planning it with `ggml_gallocr`, which
///   reuses memory between tensors. That plan cannot be reproduced exactly without the graph,
///   so this is an **approximation** of its peak, all f32 (`t = min(n_ubatch, kv_size)`):
///   `3·n_embd·t·4` (residual stream, normed input, layer output) plus the largest of
///   - attention: `(n_head·d_k + 2·n_head_kv·d_k + n_head·d_v)·t·4`, plus without flash
///     attention the `KQ` scores and their softmax, `2·n_head·kv_size·t·4`;
///   - feed-forward: `3·n_ff·t·4` (gate, up, activation), for MoE
///     `3·n_expert_used·n_ff_exp·t·4 + 2·n_expert·t·4` (router logits, probabilities);
///   - output: `n_vocab·t·4` logits.
///
///   With some weights on the host and `n_ubatch >= 32`, the CUDA backend runs their matrix
///   products on the GPU (`ggml_backend_cuda_offload_op`), copying the weight into the
///   compute buffer: the largest host-resident weight (often `output.weight`) is added.
///   Measured compute buffers are usually within ±25% of this.
///
/// # Errors
/// [`GgufError::Invalid`] for missing architecture fields, a quantized V cache without flash
/// attention (llama.cpp refuses it), or a KV row that is not a multiple of the cache type's
/// block size.
pub fn gguf_inference_estimate(
    h: &GgufHeader,
    p: &GgufInferenceParams,
) -> Result<GgufInferenceEstimate, GgufError> {
    const F32: u64 = 4;
    let a = arch(h)?;
    if p.type_v.is_quantized() && !p.flash_attn {
        return Err(GgufError::Invalid(
            "a quantized V cache requires flash attention (llama.cpp refuses it)".into(),
        ));
    }
    let n_layer = a.block_count;
    let ngl = p.n_gpu_layers.min(n_layer);
    let first_gpu_layer = n_layer - ngl;
    let output_on_gpu = p.n_gpu_layers > n_layer;
    let on_gpu = |layer: Option<u64>, name: &str| match layer {
        Some(il) => il >= first_gpu_layer,
        None if is_input_tensor(name) => false,
        None => output_on_gpu,
    };
    let (mut gpu_w, mut host_w, mut largest_host) = (0u64, 0u64, 0u64);
    for t in &h.tensors {
        if on_gpu(t.layer(), &t.name) {
            gpu_w = gpu_w.saturating_add(t.n_bytes);
        } else {
            host_w = host_w.saturating_add(t.n_bytes);
            if !is_input_tensor(&t.name) {
                largest_host = largest_host.max(t.n_bytes);
            }
        }
    }
    if output_on_gpu
        && h.tensor("output.weight").is_none()
        && let Some(e) = h.tensor("token_embd.weight")
    {
        gpu_w = gpu_w.saturating_add(e.n_bytes);
    }

    let pad = if p.flash_attn { 256 } else { 32 };
    let ctx = if p.ctx_size == 0 {
        a.context_length.unwrap_or(4096)
    } else {
        p.ctx_size
    };
    let kv_size = ctx.div_ceil(pad).saturating_mul(pad);
    let n_ubatch = p.n_ubatch.min(p.n_batch).max(1);
    let kv_size_swa = match a.sliding_window {
        Some(w) if !p.swa_full => {
            kv_size.min(w.saturating_add(n_ubatch).div_ceil(pad).saturating_mul(pad))
        }
        _ => kv_size,
    };
    let (mut kv_gpu, mut kv_host) = (0u64, 0u64);
    for il in 0..n_layer {
        let i = usize::try_from(il).unwrap_or(usize::MAX);
        let n_kv_head = a.head_count_kv.get(i).copied().unwrap_or(0);
        let cells = if a.swa_layers.get(i).copied().unwrap_or(false) {
            kv_size_swa
        } else {
            kv_size
        };
        let row = |t: GgmlType, d: u64| {
            t.row_size(d.saturating_mul(n_kv_head)).ok_or_else(|| {
                GgufError::Invalid(format!(
                    "KV row of {} elements is not a multiple of the {} block size {}",
                    d.saturating_mul(n_kv_head),
                    t.name,
                    t.block_size
                ))
            })
        };
        let bytes = row(p.type_k, a.key_length)?
            .saturating_add(row(p.type_v, a.value_length)?)
            .saturating_mul(cells);
        if il >= first_gpu_layer {
            kv_gpu = kv_gpu.saturating_add(bytes);
        } else {
            kv_host = kv_host.saturating_add(bytes);
        }
    }

    let t = n_ubatch.min(kv_size).max(1);
    let n_head = a.head_count.iter().copied().max().unwrap_or(0);
    let n_head_kv = a.head_count_kv.iter().copied().max().unwrap_or(0);
    let qkvo = n_head
        .saturating_mul(a.key_length)
        .saturating_add(n_head_kv.saturating_mul(a.key_length).saturating_mul(2))
        .saturating_add(n_head.saturating_mul(a.value_length));
    let mut attn = qkvo.saturating_mul(t).saturating_mul(F32);
    if !p.flash_attn {
        attn = attn.saturating_add(
            n_head
                .saturating_mul(kv_size)
                .saturating_mul(t)
                .saturating_mul(F32 * 2),
        );
    }
    let dense_ffn = a.feed_forward_length.unwrap_or(0).saturating_mul(3);
    let moe_ffn = match (a.expert_count, a.expert_used_count) {
        (Some(ne), Some(nu)) if ne > 0 => nu
            .saturating_mul(a.expert_feed_forward_length.unwrap_or(0))
            .saturating_mul(3)
            .saturating_add(ne.saturating_mul(2)),
        _ => 0,
    };
    let ffn = dense_ffn.max(moe_ffn).saturating_mul(t).saturating_mul(F32);
    let out = if output_on_gpu {
        a.vocab_size.saturating_mul(t).saturating_mul(F32)
    } else {
        0
    };
    let any_gpu = ngl > 0 || output_on_gpu;
    let mut compute = if any_gpu {
        attn.max(ffn)
            .max(out)
            .saturating_add(a.embedding_length.saturating_mul(t).saturating_mul(3 * F32))
    } else {
        0
    };
    if host_w > 0 && n_ubatch >= 32 && (any_gpu || largest_host > 0) {
        compute = compute.saturating_add(largest_host);
    }
    let total = gpu_w.saturating_add(kv_gpu).saturating_add(compute);
    Ok(GgufInferenceEstimate {
        kv_size,
        kv_size_swa,
        n_layers_offloaded: ngl,
        output_on_gpu,
        gpu_weights_bytes: gpu_w,
        host_weights_bytes: host_w,
        kv_cache_bytes: kv_gpu,
        kv_cache_host_bytes: kv_host,
        compute_buffer_bytes: compute,
        total_gpu_bytes: total,
    })
}

/// Tensors of llama.cpp's input layer, which always stays on the CPU (`dev_input`).
fn is_input_tensor(name: &str) -> bool {
    [
        "token_embd.",
        "token_embd_norm.",
        "pos_embd.",
        "token_types.",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// A minimal GGUF writer for tests and fixtures (version 3, little-endian, alignment 32,
/// zero-filled tensor data).
#[derive(Debug, Default, Clone)]
pub struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32)>,
}

impl GgufWriter {
    /// An empty file.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn put_str(buf: &mut Vec<u8>, s: &str) {
        buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        buf.extend_from_slice(s.as_bytes());
    }

    fn key(&mut self, k: &str, t: u32) -> &mut Vec<u8> {
        self.n_kv += 1;
        Self::put_str(&mut self.kv, k);
        self.kv.extend_from_slice(&t.to_le_bytes());
        &mut self.kv
    }

    /// Adds a string value.
    #[must_use]
    pub fn string(mut self, k: &str, v: &str) -> Self {
        let buf = self.key(k, 8);
        Self::put_str(buf, v);
        self
    }

    /// Adds a `u32` value.
    #[must_use]
    pub fn u32(mut self, k: &str, v: u32) -> Self {
        self.key(k, 4).extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Adds an `f32` value.
    #[must_use]
    pub fn f32(mut self, k: &str, v: f32) -> Self {
        self.key(k, 6).extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Adds an array of `u32`.
    #[must_use]
    pub fn u32_array(self, k: &str, v: &[u32]) -> Self {
        self.fixed_array(k, 4, v.iter().map(|x| x.to_le_bytes()))
    }

    /// Adds an array of `f32`.
    #[must_use]
    pub fn f32_array(self, k: &str, v: &[f32]) -> Self {
        self.fixed_array(k, 6, v.iter().map(|x| x.to_le_bytes()))
    }

    /// An array (type 9) of elements of type `elem_type`, each `N` little-endian bytes.
    fn fixed_array<const N: usize>(
        mut self,
        k: &str,
        elem_type: u32,
        v: impl ExactSizeIterator<Item = [u8; N]>,
    ) -> Self {
        let buf = self.key(k, 9);
        buf.extend_from_slice(&elem_type.to_le_bytes());
        buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            buf.extend_from_slice(&x);
        }
        self
    }

    /// Adds an array of strings.
    #[must_use]
    pub fn string_array(mut self, k: &str, v: &[&str]) -> Self {
        let buf = self.key(k, 9);
        buf.extend_from_slice(&8u32.to_le_bytes());
        buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            Self::put_str(buf, s);
        }
        self
    }

    /// Adds raw key-value bytes (type id + encoded value) for malformed-input tests.
    #[must_use]
    pub fn raw(mut self, k: &str, t: u32, value: &[u8]) -> Self {
        self.key(k, t).extend_from_slice(value);
        self
    }

    /// Adds a tensor of the given type and dims (`ne[0]` first).
    #[must_use]
    pub fn tensor(mut self, name: &str, ggml_type: GgmlType, dims: &[u64]) -> Self {
        self.tensors
            .push((name.to_owned(), dims.to_vec(), ggml_type.id));
        self
    }

    /// The file bytes; with `with_data` the zero-filled data section is appended.
    #[must_use]
    pub fn build(&self, with_data: bool) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        let mut offset = 0u64;
        for (name, dims, t) in &self.tensors {
            Self::put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            let ty = GgmlType::from_id(*t).unwrap_or(GgmlType::F32);
            let rows: u64 = dims.iter().skip(1).product();
            let bytes = ty.row_size(dims.first().copied().unwrap_or(1)).unwrap_or(0) * rows;
            offset += bytes.div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        if with_data {
            while !(out.len() as u64).is_multiple_of(DEFAULT_ALIGNMENT) {
                out.push(0);
            }
            out.resize(out.len() + usize::try_from(offset).unwrap_or(0), 0);
        }
        out
    }
}

/// A 2-layer llama-style GGUF (hidden 64, 4 heads, 2 KV heads, vocabulary 100, Q4_0/Q8_0/F32
/// tensors), small enough to compute by hand: the fixture of this module's tests and of the
/// CLI's. `tied`: no `output.weight` (the head reuses `token_embd`).
#[must_use]
pub fn tiny_llama(tied: bool) -> Vec<u8> {
    let tokens: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut w = GgufWriter::new()
        .string("general.architecture", "llama")
        .u32("general.alignment", 32)
        .u32("llama.block_count", 2)
        .u32("llama.context_length", 1024)
        .u32("llama.embedding_length", 64)
        .u32("llama.feed_forward_length", 128)
        .u32("llama.attention.head_count", 4)
        .u32("llama.attention.head_count_kv", 2)
        .u32("llama.rope.dimension_count", 16)
        .f32("llama.rope.freq_base", 10000.0)
        .string_array("tokenizer.ggml.tokens", &tokens)
        .tensor("token_embd.weight", GgmlType::Q8_0, &[64, 100]);
    for il in 0..2 {
        let n = |s: &str| format!("blk.{il}.{s}");
        w = w
            .tensor(&n("attn_norm.weight"), GgmlType::F32, &[64])
            .tensor(&n("attn_q.weight"), GgmlType::Q4_0, &[64, 64])
            .tensor(&n("attn_k.weight"), GgmlType::Q4_0, &[64, 32])
            .tensor(&n("attn_v.weight"), GgmlType::Q8_0, &[64, 32])
            .tensor(&n("attn_output.weight"), GgmlType::Q4_0, &[64, 64])
            .tensor(&n("ffn_norm.weight"), GgmlType::F32, &[64])
            .tensor(&n("ffn_gate.weight"), GgmlType::Q4_0, &[64, 128])
            .tensor(&n("ffn_up.weight"), GgmlType::Q4_0, &[64, 128])
            .tensor(&n("ffn_down.weight"), GgmlType::Q8_0, &[128, 64]);
    }
    w = w.tensor("output_norm.weight", GgmlType::F32, &[64]);
    if !tied {
        w = w.tensor("output.weight", GgmlType::F16, &[64, 100]);
    }
    w.build(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hand computation for `tiny_llama`:
    // token_embd q8_0 [64,100]: 64/32·34 = 68 B/row · 100 = 6800
    // per layer: norms 2·256 = 512; q 64/32·18 = 36 B/row · 64 = 2304; k 36·32 = 1152;
    //   v 68·32 = 2176; o 2304; gate 36·128 = 4608; up 4608; down 128/32·34 = 136 · 64 = 8704
    //   = 512 + 2304 + 1152 + 2176 + 2304 + 4608 + 4608 + 8704 = 26368
    // output_norm 256; output f16 [64,100] = 12800
    const EMBD: u64 = 6800;
    const LAYER: u64 = 26368;
    const OUT: u64 = 256 + 12800;

    #[test]
    fn reads_the_header() {
        let bytes = tiny_llama(false);
        let h = parse_header(&bytes).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.tensors.len(), 1 + 2 * 9 + 2);
        assert_eq!(h.weight_bytes(), EMBD + 2 * LAYER + OUT);
        assert_eq!(h.tensor("blk.1.ffn_down.weight").unwrap().layer(), Some(1));
        assert_eq!(h.tensor("blk.0.attn_q.weight").unwrap().n_bytes, 2304);
        assert_eq!(h.bytes_by_type()[0].0, "q4_0");
        assert!(h.data_offset.is_multiple_of(32) && h.data_offset > 0);
        let a = arch(&h).unwrap();
        assert_eq!(
            (a.block_count, a.embedding_length, a.vocab_size),
            (2, 64, 100)
        );
        assert_eq!(
            (a.head_count.clone(), a.head_count_kv.clone()),
            (vec![4, 4], vec![2, 2])
        );
        assert_eq!((a.key_length, a.value_length), (16, 16));
        assert_eq!(a.context_length, Some(1024));
        assert_eq!(a.rope_freq_base, Some(10000.0));
        assert!(a.swa_layers.iter().all(|s| !s));
        match h.get("tokenizer.ggml.tokens") {
            Some(GgufValue::Array(arr)) => assert_eq!((arr.len, arr.values.len()), (100, 100)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn estimate_matches_hand_computation() {
        let h = parse_header(&tiny_llama(false)).unwrap();
        // ctx 1000 → padded to 1024 (flash attention: 256). n_embd_k_gqa = 16·2 = 32.
        // f16: K row 64 B + V row 64 B = 128 B per cell per layer.
        let p = GgufInferenceParams {
            ctx_size: 1000,
            ..GgufInferenceParams::default()
        };
        let e = gguf_inference_estimate(&h, &p).unwrap();
        assert_eq!(e.kv_size, 1024);
        assert!(e.output_on_gpu);
        assert_eq!(e.gpu_weights_bytes, 2 * LAYER + OUT);
        assert_eq!(e.host_weights_bytes, EMBD);
        assert_eq!(e.kv_cache_bytes, 2 * 1024 * 128);
        // t = 512. attn (FA): (4·16 + 2·2·16 + 4·16)·512·4 = 192·2048 = 393216;
        // ffn: 3·128·512·4 = 786432; out: 100·512·4 = 204800 → max 786432;
        // + 3·64·512·4 = 393216 → 1179648. Host weights (token_embd) are input: not copied.
        assert_eq!(e.compute_buffer_bytes, 786_432 + 393_216);
        assert_eq!(
            e.total_gpu_bytes,
            2 * LAYER + OUT + 2 * 1024 * 128 + 1_179_648
        );

        // q8_0 K and V: rows of 32 elements = one 34-byte block each.
        let q8 = GgufInferenceParams {
            ctx_size: 1000,
            type_k: GgmlType::Q8_0,
            type_v: GgmlType::Q8_0,
            ..GgufInferenceParams::default()
        };
        let e = gguf_inference_estimate(&h, &q8).unwrap();
        assert_eq!(e.kv_cache_bytes, 2 * 1024 * (34 + 34));

        // -ngl 1: layer 1 on the GPU, layer 0 and the output on the host.
        let p1 = GgufInferenceParams {
            ctx_size: 1000,
            n_gpu_layers: 1,
            ..GgufInferenceParams::default()
        };
        let e = gguf_inference_estimate(&h, &p1).unwrap();
        assert!(!e.output_on_gpu);
        assert_eq!(e.gpu_weights_bytes, LAYER);
        assert_eq!(e.host_weights_bytes, EMBD + LAYER + OUT);
        assert_eq!(
            (e.kv_cache_bytes, e.kv_cache_host_bytes),
            (1024 * 128, 1024 * 128)
        );
        // No logits on the GPU; the largest host weight (output.weight, 12800) is copied.
        assert_eq!(e.compute_buffer_bytes, 786_432 + 393_216 + 12_800);

        // -ngl 2 = n_layer: the output stays on the host (llama.cpp needs ngl > n_layer).
        let p2 = GgufInferenceParams {
            n_gpu_layers: 2,
            ..p1
        };
        assert!(!gguf_inference_estimate(&h, &p2).unwrap().output_on_gpu);

        // Without flash attention: pad 32, KQ + softmax 2·4·1024·512·4 = 16 MiB.
        let nofa = GgufInferenceParams {
            ctx_size: 1000,
            flash_attn: false,
            ..GgufInferenceParams::default()
        };
        let e = gguf_inference_estimate(&h, &nofa).unwrap();
        assert_eq!(e.kv_size, 1024);
        assert_eq!(e.compute_buffer_bytes, 393_216 + 16_777_216 + 393_216);
        let bad = GgufInferenceParams {
            type_v: GgmlType::Q8_0,
            ..nofa
        };
        assert!(gguf_inference_estimate(&h, &bad).is_err());
        // q4_0 needs rows that are multiples of 32: 32 is fine; a [16]-wide row would not be.
        assert_eq!(GgmlType::Q4_0.row_size(16), None);
    }

    #[test]
    fn tied_output_is_loaded_twice() {
        let h = parse_header(&tiny_llama(true)).unwrap();
        let e = gguf_inference_estimate(&h, &GgufInferenceParams::default()).unwrap();
        assert_eq!(e.gpu_weights_bytes, 2 * LAYER + 256 + EMBD);
        assert_eq!(e.host_weights_bytes, EMBD);
        // ctx 4096 default.
        assert_eq!(e.kv_size, 4096);
    }

    #[test]
    fn sliding_window_layers() {
        let bytes = GgufWriter::new()
            .string("general.architecture", "gemma3")
            .u32("gemma3.block_count", 12)
            .u32("gemma3.embedding_length", 64)
            .u32("gemma3.attention.head_count", 4)
            .u32("gemma3.attention.head_count_kv", 1)
            .u32("gemma3.attention.key_length", 32)
            .u32("gemma3.attention.value_length", 32)
            .u32("gemma3.attention.sliding_window", 512)
            .build(false);
        let h = parse_header(&bytes).unwrap();
        let a = arch(&h).unwrap();
        // Pattern 6: layers 5 and 11 are global.
        let global: Vec<usize> = (0..12).filter(|&i| !a.swa_layers[i]).collect();
        assert_eq!(global, [5, 11]);
        let p = GgufInferenceParams {
            ctx_size: 8192,
            ..GgufInferenceParams::default()
        };
        let e = gguf_inference_estimate(&h, &p).unwrap();
        // SWA cells: pad(512 + 512, 256) = 1024. Row: 32·1 f16 = 64 B for K and for V.
        assert_eq!(e.kv_size_swa, 1024);
        assert_eq!(e.kv_cache_bytes, (2 * 8192 + 10 * 1024) * 128);
        let full = GgufInferenceParams {
            swa_full: true,
            ..p
        };
        assert_eq!(
            gguf_inference_estimate(&h, &full).unwrap().kv_cache_bytes,
            12 * 8192 * 128
        );
        // An explicit per-layer pattern wins; an unknown arch with a window is flagged.
        let bytes = GgufWriter::new()
            .string("general.architecture", "newarch")
            .u32("newarch.block_count", 2)
            .u32("newarch.embedding_length", 64)
            .u32("newarch.attention.head_count", 4)
            .u32("newarch.attention.sliding_window", 128)
            .build(false);
        assert!(
            arch(&parse_header(&bytes).unwrap())
                .unwrap()
                .swa_pattern_unknown
        );
    }

    #[test]
    fn type_table() {
        let t = |n: &str| GgmlType::from_name(n).unwrap();
        assert_eq!((t("q4_K").block_size, t("Q4_K").type_size), (256, 144));
        assert_eq!(t("q6_k").type_size, 210);
        assert_eq!(t("q2_K").type_size, 84);
        assert_eq!(t("q3_K").type_size, 110);
        assert_eq!(t("q5_K").type_size, 176);
        assert_eq!(t("q8_K").type_size, 292);
        assert_eq!(t("iq4_xs").type_size, 136);
        assert_eq!(t("iq2_xxs").type_size, 66);
        assert_eq!(t("iq1_m").type_size, 56);
        assert_eq!(t("tq1_0").type_size, 54);
        assert_eq!(t("mxfp4").type_size, 17);
        assert_eq!(t("bf16").type_size, 2);
        assert!(GgmlType::from_id(4).is_none() && GgmlType::from_id(31).is_none());
        assert_eq!(GgmlType::from_id(8), Some(GgmlType::Q8_0));
        assert_eq!(GgmlType::from_name("f16"), Some(GgmlType::F16));
        assert_eq!(GgmlType::from_name("q4_0"), Some(GgmlType::Q4_0));
        assert_eq!(GgmlType::from_name("f32"), Some(GgmlType::F32));
    }

    fn prefix() -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b
    }

    #[test]
    fn hostile_headers_are_errors() {
        assert!(matches!(
            parse_header(b"GGML\x03\0\0\0"),
            Err(GgufError::BadMagic(_))
        ));
        assert!(matches!(
            parse_header(b"GG"),
            Err(GgufError::Truncated { .. })
        ));
        let mut v1 = MAGIC.to_vec();
        v1.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(parse_header(&v1), Err(GgufError::Version(1)));
        let mut be = MAGIC.to_vec();
        be.extend_from_slice(&3u32.to_be_bytes());
        assert!(
            parse_header(&be)
                .unwrap_err()
                .to_string()
                .contains("big-endian")
        );
        // 2^60 tensors.
        let mut b = prefix();
        b.extend_from_slice(&(1u64 << 60).to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        let err = parse_header(&b).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
        // An array of 2^60 u8.
        let mut arr = 0u32.to_le_bytes().to_vec();
        arr.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let b = GgufWriter::new().raw("big", 9, &arr).build(false);
        let err = parse_header(&b).unwrap_err();
        assert!(err.to_string().contains("array `big`"), "{err}");
        // Arrays nested 1000 deep.
        let mut nested = Vec::new();
        for _ in 0..1000 {
            nested.extend_from_slice(&9u32.to_le_bytes());
            nested.extend_from_slice(&1u64.to_le_bytes());
        }
        let b = GgufWriter::new().raw("deep", 9, &nested).build(false);
        assert!(parse_header(&b).unwrap_err().to_string().contains("nested"));
        // A string of 2^63 bytes.
        let b = GgufWriter::new()
            .raw("s", 8, &(1u64 << 63).to_le_bytes())
            .build(false);
        assert!(matches!(parse_header(&b), Err(GgufError::Truncated { .. })));
        // Unknown type, bad bool, bad alignment, duplicate key, too many dims, bad block.
        assert!(parse_header(&GgufWriter::new().raw("x", 99, &[0]).build(false)).is_err());
        assert!(parse_header(&GgufWriter::new().raw("x", 7, &[2]).build(false)).is_err());
        assert!(parse_header(&GgufWriter::new().u32("general.alignment", 3).build(false)).is_err());
        assert!(parse_header(&GgufWriter::new().u32("a", 1).u32("a", 2).build(false)).is_err());
        let five = GgufWriter::new()
            .tensor("t", GgmlType::F32, &[1, 1, 1, 1, 1])
            .build(false);
        assert!(
            parse_header(&five)
                .unwrap_err()
                .to_string()
                .contains("dimensions")
        );
        let odd = GgufWriter::new()
            .tensor("t", GgmlType::Q4_0, &[33])
            .build(false);
        assert!(
            parse_header(&odd)
                .unwrap_err()
                .to_string()
                .contains("blocks")
        );
        let huge = GgufWriter::new()
            .tensor("t", GgmlType::F32, &[u64::MAX, 2])
            .build(false);
        assert!(parse_header(&huge).is_err());
        // Every strict prefix of a valid file is a clean Truncated error.
        let full = tiny_llama(false);
        let h = parse_header(&full).unwrap();
        let header_len = usize::try_from(h.data_offset).unwrap();
        for cut in (0..header_len.min(3000)).step_by(7) {
            match parse_header(&full[..cut]) {
                Err(GgufError::Truncated { needed, have, .. }) => {
                    assert!(needed > have && have == cut as u64);
                }
                Ok(_) => assert!(cut >= header_len - 32),
                Err(e) => panic!("cut {cut}: {e}"),
            }
        }
    }

    /// A file written by llama.cpp's own writer (`gguf-py` 0.19.0 `GGUFWriter`): one f16, one
    /// q8_0 and one q4_K tensor, nested and bool arrays, an f64.
    #[test]
    fn reads_a_gguf_py_file() {
        let bytes = include_bytes!("testdata/gguf-py-0.19.0.gguf");
        let h = parse_header(bytes).unwrap();
        assert_eq!(h.architecture(), Some("llama"));
        let bytes_of = |n: &str| h.tensor(n).unwrap().n_bytes;
        assert_eq!(bytes_of("token_embd.weight"), 3 * 32 * 2);
        assert_eq!(bytes_of("blk.0.attn_q.weight"), 32 * 34);
        assert_eq!(bytes_of("blk.0.ffn_up.weight"), 64 * 144);
        assert_eq!(h.tensor("blk.0.ffn_up.weight").unwrap().dims, [256, 64]);
        let end = h
            .tensors
            .iter()
            .map(|t| t.offset + t.n_bytes)
            .max()
            .unwrap();
        assert!(h.data_offset + end <= bytes.len() as u64);
        assert_eq!(h.get("test.f64"), Some(&GgufValue::F64(1.5)));
        match h.get("test.nested") {
            Some(GgufValue::Array(a)) => {
                assert_eq!((a.elem_type, a.len), (9, 2));
                assert!(matches!(&a.values[1], GgufValue::Array(inner) if inner.len == 1));
            }
            other => panic!("{other:?}"),
        }
        let a = arch(&h).unwrap();
        assert_eq!(
            (a.block_count, a.embedding_length, a.vocab_size),
            (1, 32, 3)
        );
        assert_eq!(a.head_count_kv, [1]);
    }

    #[test]
    fn large_arrays_keep_only_their_length() {
        let many: Vec<u32> = (0..5000).collect();
        let b = GgufWriter::new().u32_array("a", &many).build(false);
        match parse_header(&b).unwrap().get("a") {
            Some(GgufValue::Array(arr)) => assert_eq!((arr.len, arr.values.len()), (5000, 0)),
            other => panic!("{other:?}"),
        }
    }
}
