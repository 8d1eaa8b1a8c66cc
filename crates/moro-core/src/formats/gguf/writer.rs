//! A minimal GGUF writer, and the small models built with it that tests use.

use super::*;

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
