//! Generation traced token by token (`estimate/trace/generate.rs`) against the sequences
//! transformers' model and `generate`'s own tensors make on fake CUDA tensors
//! (`calibration/generate_events.py --matrix`): each replayed through the same allocator
//! model from the reset after loading.

mod support;

use moro_core::estimate::Regime;
use moro_core::estimate::trace::generate;
use moro_core::job::{Attention, Job, JobSettings, Method, Precision, Stack};
use moro_core::model::ModelSpec;
use serde_json::Value;
use support::{oracle_device, replay_compact_needed, replay_trace_after_load};

const EVENTS: &str = include_str!("../../../validation/oracle-traces/generate-events.jsonl");

fn job_of(v: &Value) -> (ModelSpec, Job) {
    let m = moro_core::arch::parse_config(v["config"].to_string().as_bytes()).expect("parses");
    let (prompt, new) = (
        v["prompt"].as_u64().unwrap(),
        v["new_tokens"].as_u64().unwrap(),
    );
    let settings = JobSettings {
        method: Some(Method::Inference),
        precision: Some(Precision::Bf16),
        stack: Some(Stack::Hf),
        attention: Some(Attention::Sdpa),
        micro_batch_size: v["batch"].as_u64(),
        seq_len: Some(prompt + new),
        new_tokens: Some(new),
        ..JobSettings::default()
    };
    let job = settings.resolve_for(&m).expect("resolves");
    (m, job)
}

#[allow(clippy::cast_precision_loss)]
fn rel(a: u64, b: u64) -> f64 {
    a as f64 / b as f64 - 1.0
}

/// Every recorded generation: moro's trace, replayed, within 0.5 % of the recorded one's
/// allocated peak and within 2 % of its reserved and needed peaks.
#[test]
fn generation_traces_match_the_recorded_ones() {
    let mut checked = 0;
    for line in EVENTS.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let label = v["label"].as_str().unwrap();
        let (m, job) = job_of(&v);
        let device = oracle_device();
        let regime = Regime::resolve(&m, &job);
        let trace = generate::trace(&m, &job, &regime, &device).expect("generation is traced");
        let ours = replay_trace_after_load(&trace);
        let theirs = replay_compact_needed(&v);
        let errs = [
            rel(ours.0, theirs.0),
            rel(ours.1, theirs.1),
            rel(ours.2, theirs.2),
        ];
        eprintln!(
            "{label}: allocated {:+.3} %, reserved {:+.3} %, needed {:+.3} % \
             (oracle {} / {} / {} MiB)",
            errs[0] * 100.0,
            errs[1] * 100.0,
            errs[2] * 100.0,
            theirs.0 >> 20,
            theirs.1 >> 20,
            theirs.2 >> 20
        );
        assert!(errs[0].abs() <= 0.005, "{label}: allocated {errs:?}");
        assert!(
            errs[1].abs() <= 0.02 && errs[2].abs() <= 0.02,
            "{label}: {errs:?}"
        );
        checked += 1;
    }
    assert_eq!(checked, 6);
}

const MOE: &str = include_str!("../../../validation/oracle-traces/generate-moe.jsonl");

/// A MoE model decoding a batch (`calibration/generate_events.py --matrix-moe`): the
/// estimate's allocated level, from its formulas, within 1 % of the recorded peak, which is
/// the decode step's gathered expert weights (`batched_mm`) on top of the weights and cache.
#[test]
fn moe_decoding_gathers_each_tokens_experts() {
    let mut checked = 0;
    for line in MOE.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let label = v["label"].as_str().unwrap();
        let (m, job) = job_of(&v);
        let e = moro_core::estimate::estimate(&m, &job, &oracle_device()).expect("estimates");
        let want = v["peak_allocated_bytes"].as_u64().unwrap();
        let err = rel(e.peak_allocated_bytes, want);
        eprintln!(
            "{label}: {:+.3} % at {} (oracle {} MiB)",
            err * 100.0,
            e.peak_phase.as_str(),
            want >> 20
        );
        assert!(err.abs() <= 0.01, "{label}: {err:+.4}");
        checked += 1;
    }
    assert_eq!(checked, 3);
}
