//! BART (`bart`): counted as transformers 5.25 builds it, and its training step against the
//! step traced on fake CUDA tensors (`calibration/seq2seq_trace.py --matrix seq2seq-bart`,
//! `validation/oracle-traces/seq2seq-bart.jsonl`: torch 2.15, transformers 5.25, PEFT 0.21.2).

use moro_core::arch::parse_config;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Attention, JobSettings, Method, Optimizer, Padding, Precision, Targets};
use serde_json::Value;

const BASE: &str = include_str!("../../../validation/seq2seq-configs/bart-base.json");
const TRACES: &str = include_str!("../../../validation/oracle-traces/seq2seq-bart.jsonl");

/// `sum(p.numel())` of `BartForConditionalGeneration(config)` on the meta device: bart-base
/// 139,420,416 and `BartConfig()`'s bart-large 406,291,456, the two checkpoints' counts.
#[test]
fn parameter_counts_are_transformers() {
    let base = parse_config(BASE.as_bytes()).expect("parses");
    assert_eq!(base.total_params(), 139_420_416);
    let large = parse_config(br#"{"model_type": "bart"}"#).expect("parses");
    assert_eq!(large.total_params(), 406_291_456);
}

fn oracle_device() -> DeviceProfile {
    DeviceProfile {
        cublas_workspace_bytes: 0,
        ..DeviceProfile::default()
    }
}

fn settings(t: &Value) -> JobSettings {
    let j = &t["job"];
    let n = |k: &str| j[k].as_u64().unwrap();
    let lora = &j["lora"];
    JobSettings {
        method: Some(match j["method"].as_str().unwrap() {
            "full" => Method::Full,
            _ => Method::Lora,
        }),
        precision: Some(match j["precision"].as_str().unwrap() {
            "bf16-mixed" => Precision::Bf16Mixed,
            _ => Precision::Bf16,
        }),
        optimizer: Some(Optimizer::AdamwTorch),
        attention: Some(Attention::Sdpa),
        gradient_checkpointing: Some(j["grad_ckpt"].as_bool().unwrap()),
        micro_batch_size: Some(n("micro_batch")),
        seq_len: Some(n("seq_len")),
        target_len: Some(n("target_len")),
        padding: Some(if j["padded"].as_bool().unwrap() {
            Padding::Padded
        } else {
            Padding::Packed
        }),
        lora_rank: lora["r"].as_u64(),
        lora_alpha: lora["alpha"].as_f64(),
        lora_dropout: lora["dropout"].as_f64(),
        target_modules: lora["targets"]
            .as_array()
            .map(|v| Targets::Names(v.iter().map(|s| s.as_str().unwrap().to_owned()).collect())),
        ..JobSettings::default()
    }
}

/// Every traced step (full and LoRA, bf16 and bf16-mixed, with checkpointing, with a
/// padding mask): moro's allocated peak within 3 %.
#[test]
fn training_steps_match_their_traces() {
    let m = parse_config(BASE.as_bytes()).expect("parses");
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let label = t["label"].as_str().unwrap();
        let job = settings(&t).resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &oracle_device()).expect("valid job");
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        eprintln!(
            "{label}: {:+.2} % (moro {} at {}, oracle {want} at {})",
            err * 100.0,
            e.peak_allocated_bytes,
            e.peak_phase.as_str(),
            t["measured"]["peak_at"]["phase"]
        );
        if err.abs() > 0.03 {
            failures.push(format!("{label}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert_eq!(checked, 9);
    assert!(failures.is_empty(), "{failures:?}");
}

const GENERATE: &str =
    include_str!("../../../validation/oracle-traces/seq2seq-bart-generate.jsonl");

/// Generation as `generate` runs it (`calibration/seq2seq_trace.py --generate`: the encoder
/// once, then greedy decoder steps with an `EncoderDecoderCache`; bf16 weights): the peak
/// within 1 % of every trace, the encoder's within 2 %.
#[test]
fn generation_matches_its_traces() {
    let m = parse_config(BASE.as_bytes()).expect("parses");
    let mut checked = 0;
    for line in GENERATE.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let n = |k: &str| t[k].as_u64().unwrap();
        let job = JobSettings {
            method: Some(Method::Inference),
            precision: Some(Precision::Bf16),
            micro_batch_size: Some(n("batch")),
            seq_len: Some(n("seq_len")),
            target_len: Some(n("new_tokens")),
            padding: Some(if t["padded"].as_bool().unwrap() {
                Padding::Padded
            } else {
                Padding::Packed
            }),
            ..JobSettings::default()
        }
        .resolve_for(&m)
        .expect("resolves");
        let e = estimate(&m, &job, &oracle_device()).expect("valid job");
        let label = t["label"].as_str().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let rel = |got: u64, want: u64| got as f64 / want as f64 - 1.0;
        let peak = rel(e.peak_allocated_bytes, n("peak_allocated_bytes"));
        let prefill = e
            .phases
            .iter()
            .find(|p| p.phase == moro_core::estimate::Phase::Prefill)
            .map(moro_core::estimate::PhaseBytes::total)
            .unwrap();
        let encoder = rel(prefill, n("encoder_peak_bytes"));
        eprintln!(
            "{label}: peak {:+.2} %, encoder {:+.2} %",
            peak * 100.0,
            encoder * 100.0
        );
        assert!(peak.abs() <= 0.01, "{label}: peak {peak}");
        assert!(encoder.abs() <= 0.02, "{label}: encoder {encoder}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}
