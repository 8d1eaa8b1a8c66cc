//! Buffers a previous step leaves alive, checked against hand calculations.

use moro_core::catalog;
use moro_core::estimate::{Component, DeviceProfile, Estimate, Phase, estimate};
use moro_core::job::{
    Job, Method, Optimizer, Padding, PeftConfig, Precision, Quantization, Stack, Targets, Versions,
};
use moro_core::model::ModelSpec;

fn mistral() -> ModelSpec {
    catalog::load(catalog::find("mistralai/Mistral-7B-v0.1").expect("in catalog")).expect("parses")
}

/// litgpt's Mistral-7B QLoRA config (config_hub/finetune/mistral-7b/qlora.yaml): q and v
/// adapters, micro-batch 2 × 512, bf16-true, bnb 0.42 (litgpt's pin in 2024).
fn litgpt_qlora(padding: Padding, bnb: (u32, u32, u32)) -> Job {
    Job {
        method: Method::QuantizedAdapters,
        quantization: Quantization::Nf4,
        adapter: PeftConfig {
            rank: 32,
            alpha: 16.0,
            dropout: 0.05,
            targets: Targets::Names(vec!["query".into(), "value".into()]),
            ..PeftConfig::default()
        },
        micro_batch_size: 2,
        seq_len: 512,
        grad_accum: 4,
        optimizer: Optimizer::PagedAdamw32bit,
        precision: Precision::Bf16,
        stack: Stack::Litgpt,
        padding,
        versions: Versions {
            bitsandbytes: Some(bnb),
            ..Versions::default()
        },
        ..Job::default()
    }
}

fn run(m: &ModelSpec, j: &Job) -> Estimate {
    let mut j = j.clone();
    j.adapter.targets = moro_core::targets::resolve(m, &j.adapter.targets);
    estimate(m, &j, &DeviceProfile::default()).expect("valid job")
}

fn forward_end_activations(e: &Estimate) -> u64 {
    e.phase_component(Phase::ForwardEnd, Component::Activations)
}

/// bitsandbytes < 0.43.2 keeps each 4-bit matmul's input in `ctx.tensors`; litgpt's `loss`
/// keeps the previous step's graph, so those inputs are alive through the next forward.
/// By hand for Mistral-7B (h 4096, MLP 14336, 32 layers, 1024 tokens, bf16): attention norm
/// output, attention output, MLP norm output (2·4096 each) and the SiLU product (2·14336)
/// per token and layer, plus lm_head's input (2·4096) once.
#[test]
fn litgpt_keeps_the_previous_steps_4bit_inputs() {
    let m = mistral();
    let steady = run(&m, &litgpt_qlora(Padding::Padded, (0, 42, 0)));
    let first = run(&m, &litgpt_qlora(Padding::LongestFirst, (0, 42, 0)));
    let tokens = 2 * 512;
    let hand = tokens * (32 * (3 * 2 * 4096 + 2 * 14336) + 2 * 4096);
    assert_eq!(
        forward_end_activations(&steady) - forward_end_activations(&first),
        hand
    );
    // 0.43.2 saves only the packed weight: nothing to keep.
    let fixed = run(&m, &litgpt_qlora(Padding::Padded, (0, 43, 2)));
    let fixed_first = run(&m, &litgpt_qlora(Padding::LongestFirst, (0, 43, 2)));
    assert_eq!(
        forward_end_activations(&fixed),
        forward_end_activations(&fixed_first)
    );
    assert!(steady.peak_allocated_bytes > fixed.peak_allocated_bytes + hand);
}

/// The HF Trainer drops the loss after `training_step`: no step-to-step retention there.
#[test]
fn hf_trainer_keeps_nothing_from_the_previous_step() {
    let m = mistral();
    let mut a = litgpt_qlora(Padding::Padded, (0, 42, 0));
    a.stack = Stack::Hf;
    let mut b = a.clone();
    b.padding = Padding::LongestFirst;
    assert_eq!(
        run(&m, &a).peak_allocated_bytes,
        run(&m, &b).peak_allocated_bytes
    );
}

/// litgpt under bf16-mixed (fp32 weights, autocast) with a frozen lm_head: each 128-token
/// chunk of `lm_head_chunk_size=128` casts the fp32 weight to bf16 anew (autocast caches only
/// leaves that require grad) and its `mm` keeps that copy for backward. StableLM-3B's head is
/// 50,688 × 4,096: 1,034 tokens make 9 chunks, 128 tokens one, so 8 more copies of
/// 2 × 50,688 × 4,096 bytes.
#[test]
fn litgpt_chunked_head_keeps_one_weight_copy_per_chunk() {
    use moro_core::estimate::Regime;
    use moro_core::estimate::activations::Activations;
    let m = catalog::load(catalog::find("stabilityai/stablelm-base-alpha-3b").expect("catalog"))
        .unwrap();
    assert_eq!((m.vocab_size, m.hidden_size), (50_688, 4096));
    let cache = |seq_len: u64| {
        let mut j = Job {
            method: Method::Adapters,
            precision: Precision::Bf16Mixed,
            stack: Stack::Litgpt,
            seq_len,
            adapter: PeftConfig {
                targets: Targets::Names(vec!["query".into(), "value".into()]),
                ..PeftConfig::default()
            },
            ..Job::default()
        };
        j.adapter.targets = moro_core::targets::resolve(&m, &j.adapter.targets);
        let r = Regime::resolve(&m, &j);
        Activations::new(&m, &j, &r, 1).autocast_weight_cache
    };
    assert_eq!(cache(1034) - cache(128), 8 * 2 * 50_688 * 4096);
}
