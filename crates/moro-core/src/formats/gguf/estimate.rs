//! llama.cpp's inference allocations for a GGUF model: weights, KV cache, compute buffers.

use serde::Serialize;

use super::*;

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
