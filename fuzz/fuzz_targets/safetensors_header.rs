//! safetensors header prefix and sharded index parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moro_core::formats::safetensors;

fuzz_target!(|data: &[u8]| {
    let _ = safetensors::needed_prefix_len(data);
    if let Ok(h) = safetensors::parse_header(data) {
        let w = safetensors::stored_weights(&h.tensors, None);
        let _ = safetensors::check_params(w.params_estimate, 1_000_000);
        let _ = safetensors::stored_weights(&h.tensors, Some(8));
    }
    if let Ok(idx) = safetensors::parse_index(data) {
        let _ = idx.shard_files();
    }
});
