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

mod arch;
mod estimate;
mod writer;

pub use arch::*;
pub use estimate::*;
pub use writer::*;

#[cfg(test)]
mod tests;
