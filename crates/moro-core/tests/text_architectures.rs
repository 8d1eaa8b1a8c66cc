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
                Method::Lora
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
