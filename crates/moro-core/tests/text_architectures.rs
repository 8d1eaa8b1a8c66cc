//! The text architectures added after the first catalog, against the training step traced
//! on fake CUDA tensors (`../shared/oracle/oracle.py`, transformers 5.24, torch 2.15, PEFT
//! 0.21.2; `validation/oracle-traces/text-architectures.jsonl`): SmolLM3-3B, Granite 3.3 8B
//! and OLMo 3.1 32B, each cut to 4 layers, LoRA (r 16 on the seven projections) and full
//! fine-tuning in bf16 with fused AdamW, 1 × 1024 tokens.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Attention, JobSettings, Method, Optimizer, Precision, Targets};
use serde_json::Value;

const TRACES: &str = include_str!("../../../validation/oracle-traces/text-architectures.jsonl");

/// Within 3 % of every trace at the allocated level.
#[test]
fn allocated_peak_matches_the_traces() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let label = t["label"].as_str().unwrap();
        let (stem, rest) = label.split_once("-L4 ").unwrap();
        let entry = catalog::find(&stem.replacen("--", "/", 1)).expect("in the catalog");
        let mut cfg: Value = serde_json::from_str(entry.config_json).unwrap();
        cfg["num_hidden_layers"] = 4.into();
        for key in ["layer_types", "no_rope_layers"] {
            if let Some(list) = cfg[key].as_array().cloned() {
                cfg[key] = Value::Array(list.into_iter().take(4).collect());
            }
        }
        let m = moro_core::arch::parse_config(cfg.to_string().as_bytes()).expect("parses");
        let seven = [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ];
        let settings = JobSettings {
            method: Some(if rest.starts_with("full") {
                Method::Full
            } else {
                Method::Adapters
            }),
            precision: Some(Precision::Bf16),
            optimizer: Some(Optimizer::AdamwTorchFused),
            attention: Some(Attention::Sdpa),
            gradient_checkpointing: Some(false),
            micro_batch_size: Some(1),
            seq_len: Some(1024),
            lora_rank: Some(16),
            lora_alpha: Some(32.0),
            lora_dropout: Some(0.0),
            target_modules: Some(Targets::Names(
                seven.iter().map(|s| (*s).to_owned()).collect(),
            )),
            ..JobSettings::default()
        };
        let job = settings.resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &DeviceProfile::default()).expect("valid job");
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        eprintln!("{label}: {:+.2} %", err * 100.0);
        if err.abs() > 0.03 {
            failures.push(format!("{label}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert_eq!(checked, 6);
    assert!(failures.is_empty(), "{failures:?}");
}

/// Llama 4's language model (`llama4_text`), counted as transformers 5.25 builds it on the
/// meta device (`Llama4ForCausalLM(Llama4TextConfig(...))`, summed `numel`): Scout's
/// defaults (48 layers, 16 experts every layer) and a 4-layer cut of Maverick's shape (128
/// experts every second layer, no q/k norm), and the multimodal Scout with its tower.
#[test]
fn llama4_counts_as_transformers_builds_it() {
    let scout = moro_core::arch::parse_config(
        br#"{"model_type": "llama4_text", "num_attention_heads": 40}"#,
    )
    .expect("parses");
    assert_eq!(scout.total_params(), 107_769_861_120);
    let maverick = moro_core::arch::parse_config(
        br#"{"model_type": "llama4_text", "num_attention_heads": 40, "num_hidden_layers": 4,
            "interleave_moe_layer_step": 2, "num_local_experts": 128, "use_qk_norm": false}"#,
    )
    .expect("parses");
    assert_eq!(maverick.total_params(), 35_289_216_000);
    // The staged Scout config (`data/staged/`, rebuilt: see its manifest): transformers'
    // `vision_model` 850,960,896 (its `vision_adapter`, 39,845,888, moro counts with the
    // projector) and `multi_modal_projector` 20,971,520.
    let multimodal = moro_core::arch::parse_config(
        include_str!("../../../data/staged/meta-llama--Llama-4-Scout-17B-16E-Instruct.json")
            .as_bytes(),
    )
    .expect("parses");
    assert_eq!(multimodal.total_params(), 108_641_793_536);
    let tower = multimodal.vision.as_ref().expect("a tower");
    assert_eq!(tower.tower_params(), 850_960_896 - 39_845_888);
    assert_eq!(tower.projector_params(), 39_845_888 + 20_971_520);
}

/// Llama 4's language model against its training step on fake CUDA tensors
/// (`validation/oracle-traces/llama4.jsonl`: transformers 5.25, torch 2.15, PEFT 0.21.2;
/// Scout's and Maverick's shapes cut to 4 layers; LoRA r 16 on the seven projections under
/// bf16 autocast with and without checkpointing, full fine-tuning in bf16; fused AdamW,
/// 1 × 512 tokens). Every expert runs on every token, so a MoE layer keeps E copies of its
/// input and of the experts' intermediate: within 2 % at the allocated level.
#[test]
fn llama4_matches_its_traces() {
    let traces = include_str!("../../../validation/oracle-traces/llama4.jsonl");
    let mut checked = 0;
    let mut failures = Vec::new();
    for line in traces.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let label = t["label"].as_str().unwrap();
        let mut cfg = t["config"].clone();
        for (k, v) in t["config_overrides"].as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let m = moro_core::arch::parse_config(cfg.to_string().as_bytes()).expect("parses");
        let full = t["job"]["method"] == "full";
        // The traced model's parameters (LoRA's adapters included).
        let adapters = t["params"]["trainable"].as_u64().unwrap();
        let want_params = t["params"]["total"].as_u64().unwrap();
        assert_eq!(
            m.total_params() + if full { 0 } else { adapters },
            want_params,
            "{label}"
        );
        let settings = JobSettings {
            method: Some(if full { Method::Full } else { Method::Adapters }),
            precision: Some(if full {
                Precision::Bf16
            } else {
                Precision::Bf16Mixed
            }),
            optimizer: Some(Optimizer::AdamwTorchFused),
            attention: Some(Attention::Sdpa),
            gradient_checkpointing: Some(t["job"]["grad_ckpt"].as_bool().unwrap()),
            micro_batch_size: Some(1),
            seq_len: Some(512),
            lora_rank: (!full).then_some(16),
            lora_alpha: (!full).then_some(32.0),
            lora_dropout: (!full).then_some(0.0),
            target_modules: (!full).then(|| {
                Targets::Names(
                    moro_core::job::DEFAULT_TARGETS
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect(),
                )
            }),
            ..JobSettings::default()
        };
        let job = settings.resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &DeviceProfile::default()).expect("valid job");
        // PEFT adapts the attention, the shared expert and the dense MLPs, not the stacks.
        assert_eq!(
            e.trainable_params,
            if full { want_params } else { adapters },
            "{label}"
        );
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        eprintln!("{label}: {:+.2} %", err * 100.0);
        if err.abs() > 0.02 {
            failures.push(format!("{label}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert_eq!(checked, 6);
    assert!(failures.is_empty(), "{failures:?}");
}

/// Llama 4's prefill against the forward traced on fake CUDA tensors
/// (`validation/oracle-traces/llama4-prefill.jsonl`, `calibration/prefill_trace.py`:
/// transformers 5.25, bf16, SDPA, a KV cache, the last position's logits): every expert's
/// copy of the prompt and its intermediate, and past 8,192 tokens the chunked layers' cache
/// kept to one chunk. Within 2 % at the allocated level.
#[test]
fn llama4_prefill_matches_its_traces() {
    let traces = include_str!("../../../validation/oracle-traces/llama4-prefill.jsonl");
    let mut checked = 0;
    for line in traces.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let label = t["label"].as_str().unwrap();
        let m = moro_core::arch::parse_config(t["config"].to_string().as_bytes()).expect("parses");
        let settings = JobSettings {
            method: Some(Method::Inference),
            attention: Some(Attention::Sdpa),
            micro_batch_size: Some(1),
            seq_len: t["seq_len"].as_u64(),
            ..JobSettings::default()
        };
        let job = settings.resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &DeviceProfile::default()).expect("valid job");
        let want = t["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        eprintln!("{label}: {:+.2} %", err * 100.0);
        assert!(err.abs() <= 0.02, "{label}: {:+.2} %", err * 100.0);
        checked += 1;
    }
    assert_eq!(checked, 3);
}
