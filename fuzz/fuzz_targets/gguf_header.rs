//! GGUF header reader, architecture fields and the llama.cpp estimate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moro_core::formats::gguf::{self, GgmlType, GgufInferenceParams};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = gguf::parse_header(data) else { return };
    let _ = h.weight_bytes();
    let _ = h.bytes_by_type();
    let _ = gguf::arch(&h);
    let _ = gguf::gguf_inference_estimate(&h, &GgufInferenceParams::default());
    let p = GgufInferenceParams {
        ctx_size: 0,
        n_batch: 1,
        n_ubatch: 4096,
        n_gpu_layers: 1,
        type_k: GgmlType::Q8_0,
        type_v: GgmlType::Q4_0,
        flash_attn: false,
        swa_full: true,
    };
    let _ = gguf::gguf_inference_estimate(&h, &p);
});
