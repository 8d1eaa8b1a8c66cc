//! Gemma 3n (`gemma3n_text`, `gemma3n`): counted as transformers 5.25 builds it, and its
//! training step against the step traced on fake CUDA tensors (`calibration/moe_trace.py
//! --matrix gemma3n`, `validation/oracle-traces/gemma3n.jsonl`: torch 2.15, transformers
//! 5.25, PEFT 0.21.2).

mod support;

use moro_core::arch::parse_config;
use moro_core::model::ModelSpec;
use serde_json::{Value, json};

const E4B: &str = include_str!("../../../validation/text-configs/gemma-3n-e4b-text-shape.json");

fn text(over: &[(&str, Value)]) -> ModelSpec {
    let mut cfg: Value = serde_json::from_str(E4B).expect("config");
    for (k, v) in over {
        cfg[*k] = v.clone();
    }
    parse_config(cfg.to_string().as_bytes()).expect("parses")
}

/// `sum(p.numel())` on the meta device: `Gemma3nTextConfig()` (E4B's text model),
/// a 4-layer cut mixing sliding and full layers, sparse and dense MLPs of two widths and two
/// KV-sharing layers, and `Gemma3nConfig()` with its vision and audio towers.
#[test]
fn parameter_counts_are_transformers() {
    assert_eq!(text(&[]).total_params(), 6_835_235_568);
    let cut = text(&[
        ("num_hidden_layers", 4.into()),
        (
            "layer_types",
            json!([
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention"
            ]),
        ),
        ("num_kv_shared_layers", 2.into()),
        ("activation_sparsity_pattern", json!([0.95, 0.95, 0.0, 0.0])),
        ("intermediate_size", json!([16384, 8192, 16384, 8192])),
    ]);
    assert_eq!(cut.total_params(), 1_178_177_600);
    let mm = parse_config(br#"{"model_type": "gemma3n"}"#).expect("parses");
    assert_eq!(mm.total_params(), 7_818_517_072);
}

const TRACES: &str = include_str!("../../../validation/oracle-traces/gemma3n.jsonl");

/// The traced 6-layer cut: sliding and full layers, sparse MLPs in the first two (none in
/// the checkpointed cases), the last two reusing keys and values.
fn cut6(t: &Value) -> ModelSpec {
    let label = t["label"].as_str().unwrap();
    let sparse = if label.contains(" dense ") { 0.0 } else { 0.95 };
    let v = t["config"]["vocab_size"].clone();
    text(&[
        ("num_hidden_layers", 6.into()),
        (
            "layer_types",
            json!([
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "sliding_attention",
                "full_attention"
            ]),
        ),
        ("num_kv_shared_layers", 2.into()),
        (
            "activation_sparsity_pattern",
            json!([sparse, sparse, 0.0, 0.0, 0.0, 0.0]),
        ),
        (
            "intermediate_size",
            json!([16384, 16384, 16384, 16384, 16384, 16384]),
        ),
        ("vocab_size_per_layer_input", v.clone()),
        ("vocab_size", v),
    ])
}

/// The traced job.
fn settings(t: &Value) -> moro_core::job::JobSettings {
    use moro_core::job::{Attention, JobSettings, Method, Optimizer, Precision, Targets};
    let j = &t["job"];
    let lora = &j["lora"];
    JobSettings {
        method: Some(if j["method"] == "full" {
            Method::Full
        } else {
            Method::Adapters
        }),
        precision: Some(if j["precision"] == "bf16-mixed" {
            Precision::Bf16Mixed
        } else {
            Precision::Bf16
        }),
        optimizer: Some(if j["optimizer"].as_str().unwrap().contains("fused") {
            Optimizer::AdamwTorchFused
        } else {
            Optimizer::AdamwTorch
        }),
        attention: Some(Attention::Sdpa),
        gradient_checkpointing: j["grad_ckpt"].as_bool(),
        micro_batch_size: j["micro_batch"].as_u64(),
        seq_len: j["seq_len"].as_u64(),
        lora_rank: lora["r"].as_u64(),
        lora_alpha: lora["alpha"].as_f64(),
        lora_dropout: lora["dropout"].as_f64(),
        target_modules: lora["targets"]
            .as_array()
            .map(|v| Targets::Names(v.iter().map(|s| s.as_str().unwrap().to_owned()).collect())),
        ..JobSettings::default()
    }
}

/// Every traced step (LoRA and full; bf16 and bf16-mixed; checkpointed): moro's allocated
/// peak within 3 %.
#[test]
fn training_steps_match_their_traces() {
    let mut peaks = support::Peaks::default();
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let m = cut6(&t);
        let job = settings(&t).resolve_for(&m).expect("resolves");
        let e = moro_core::estimate::estimate(&m, &job, &support::oracle_device()).expect("valid");
        peaks.check(t["label"].as_str().unwrap(), &e, &t, -0.03..=0.03);
    }
    peaks.finish(6);
}

/// The prefill (`calibration/prefill_trace.py`, the traced 6-layer cut, bf16): within 3 %,
/// the two KV-sharing layers caching nothing of their own.
#[test]
fn prefill_matches_its_traces() {
    use moro_core::job::{Attention, JobSettings, Method};
    let traces = include_str!("../../../validation/oracle-traces/gemma3n-prefill.jsonl");
    let mut checked = 0;
    for line in traces.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let m = parse_config(t["config"].to_string().as_bytes()).expect("parses");
        let job = JobSettings {
            method: Some(Method::Inference),
            attention: Some(Attention::Sdpa),
            micro_batch_size: Some(1),
            seq_len: t["seq_len"].as_u64(),
            ..JobSettings::default()
        }
        .resolve_for(&m)
        .expect("resolves");
        let e = moro_core::estimate::estimate(&m, &job, &support::oracle_device()).expect("valid");
        let want = t["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        let label = t["label"].as_str().unwrap();
        eprintln!("{label}: {:+.2} %", err * 100.0);
        assert!(err.abs() <= 0.03, "{label}: {:+.2} %", err * 100.0);
        checked += 1;
    }
    assert_eq!(checked, 2);
    // 6 layers, 2 reusing: the other 4 cache k and v (2 heads of 256): the two sliding ones
    // 512 tokens, the full one and the sliding one the shared layers read, all 8,192.
    let m = parse_config(
        traces
            .lines()
            .next()
            .map(|l| {
                let t: Value = serde_json::from_str(l).unwrap();
                t["config"].to_string()
            })
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let kv = moro_core::estimate::inference::kv_cache_bytes(
        &m,
        1,
        8192,
        moro_core::job::KvDtype::F16,
        1,
    );
    assert_eq!(kv, (2 * 512 + 2 * 8192) * 2 * 2 * 256 * 2);
}

/// What was not traced is refused by name: images and audio, QLoRA, attention other than
/// SDPA, other stacks.
#[test]
fn untraced_settings_are_refused_by_name() {
    use moro_core::job::{Attention, JobSettings, Method, Quantization, Stack};
    let m = parse_config(br#"{"model_type": "gemma3n"}"#).expect("parses");
    let base = JobSettings {
        method: Some(Method::Adapters),
        seq_len: Some(1024),
        ..JobSettings::default()
    };
    let field = |s: JobSettings| {
        s.resolve_for(&m)
            .and_then(|j| j.validate(&m).map(|()| j))
            .unwrap_err()
            .field
    };
    assert!(base.clone().resolve_for(&m).unwrap().validate(&m).is_ok());
    let images = JobSettings {
        images_per_sample: Some(1),
        image_size: Some((768, 768)),
        ..base.clone()
    };
    assert_eq!(field(images), "training.images_per_sample");
    let qlora = JobSettings {
        method: Some(Method::QuantizedAdapters),
        quantization: Some(Quantization::Nf4Dq),
        ..base.clone()
    };
    assert_eq!(field(qlora), "quantization");
    let flash = JobSettings {
        attention: Some(Attention::Flash),
        ..base.clone()
    };
    assert_eq!(field(flash), "attention");
    let unsloth = JobSettings {
        stack: Some(Stack::Unsloth),
        ..base
    };
    assert_eq!(field(unsloth), "stack");
}
