//! Pure parsers for weight-file headers: safetensors (single files and sharded indexes) and
//! GGUF.
//!
//! Every parser here takes bytes (`&[u8]`) that the caller read from a file or fetched with an
//! HTTP `Range` request; none opens files or sockets. Hostile input (a header length of 2^63,
//! a truncated file, JSON nested a million deep, a GGUF array of 2^60 elements, a wrong magic)
//! is a one-line error: lengths and counts are checked against the bytes actually present
//! before anything is allocated, so memory stays bounded by the input size.

pub mod gguf;
pub mod safetensors;

/// Inputs kept from fuzzing (`fuzz/`, cargo-fuzz): each parser runs over them the way the
/// fuzz targets do and must return, not panic.
#[cfg(test)]
mod fuzz_regressions {
    use super::{gguf, safetensors};

    /// Every file in `dir`, in order.
    fn files(dir: &str) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        out.sort();
        out
    }

    /// The libFuzzer corpus of `target` (`fuzz/corpus/`, minimized), which the suite replays
    /// in debug builds, where integer overflow panics.
    fn corpus(target: &str) -> Vec<Vec<u8>> {
        files(&format!(
            "{}/../../fuzz/corpus/{target}",
            env!("CARGO_MANIFEST_DIR")
        ))
    }

    /// The regression inputs kept here, then `target`'s corpus.
    fn inputs(kind: &str, target: &str) -> Vec<Vec<u8>> {
        let mut out = files(&format!(
            "{}/src/formats/testdata/fuzz/{kind}",
            env!("CARGO_MANIFEST_DIR")
        ));
        out.extend(corpus(target));
        out
    }

    #[test]
    fn gguf_inputs() {
        let inputs = inputs("gguf", "gguf_header");
        assert!(inputs.len() >= 100);
        for data in inputs {
            let Ok(h) = gguf::parse_header(&data) else {
                continue;
            };
            let _ = (h.weight_bytes(), h.bytes_by_type(), gguf::arch(&h));
            let _ = gguf::gguf_inference_estimate(&h, &gguf::GgufInferenceParams::default());
            let p = gguf::GgufInferenceParams {
                ctx_size: 0,
                n_gpu_layers: 1,
                flash_attn: false,
                swa_full: true,
                ..gguf::GgufInferenceParams::default()
            };
            let _ = gguf::gguf_inference_estimate(&h, &p);
        }
    }

    #[test]
    fn config_json_inputs() {
        let inputs = corpus("config_json");
        assert!(inputs.len() >= 100, "{} inputs", inputs.len());
        for data in inputs {
            if let Ok(spec) = crate::arch::parse_config(&data) {
                let _ = spec.total_params();
            }
        }
    }

    #[test]
    fn safetensors_inputs() {
        let inputs = inputs("safetensors", "safetensors_header");
        assert!(inputs.len() >= 100);
        for data in inputs {
            let _ = safetensors::needed_prefix_len(&data);
            if let Ok(h) = safetensors::parse_header(&data) {
                let w = safetensors::stored_weights(&h.tensors, None);
                let _ = safetensors::check_params(w.params_estimate, 1_000_000);
            }
            if let Ok(idx) = safetensors::parse_index(&data) {
                let _ = idx.shard_files();
            }
        }
    }
}
