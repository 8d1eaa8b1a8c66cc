//! BART (`bart`): counted as transformers 5.25 builds it, and its training step against the
//! step traced on fake CUDA tensors (`calibration/seq2seq_trace.py --matrix seq2seq-bart`,
//! `validation/oracle-traces/seq2seq-bart.jsonl`: torch 2.15, transformers 5.25, PEFT 0.21.2).

mod support;

use moro_core::arch::parse_config;
use moro_core::estimate::estimate;
use serde_json::Value;
use support::{Peaks, oracle_device, seq2seq_generation, seq2seq_settings};

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

/// Every traced step (full and LoRA, bf16 and bf16-mixed, with checkpointing, with a
/// padding mask): moro's allocated peak within 3 %.
#[test]
fn training_steps_match_their_traces() {
    let m = parse_config(BASE.as_bytes()).expect("parses");
    let mut peaks = Peaks::default();
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let job = seq2seq_settings(&t).resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &oracle_device()).expect("valid job");
        peaks.check(t["label"].as_str().unwrap(), &e, &t, -0.03..=0.03);
    }
    peaks.finish(9);
}

const GENERATE: &str =
    include_str!("../../../validation/oracle-traces/seq2seq-bart-generate.jsonl");

/// Generation as `generate` runs it (`calibration/seq2seq_trace.py --generate`: the encoder
/// once, then greedy decoder steps with an `EncoderDecoderCache`; bf16 weights): the peak
/// within 1 % of every trace, the encoder's within 2 %.
#[test]
fn generation_matches_its_traces() {
    let m = parse_config(BASE.as_bytes()).expect("parses");
    assert_eq!(seq2seq_generation(GENERATE, |_| m.clone(), 0.01, 0.02), 4);
}
