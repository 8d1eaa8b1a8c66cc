//! The caching allocator's reserve and the logits buffers, against hand calculations and
//! the H200 measurements in `validation/h200/`.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, Estimate, Phase, estimate};
use moro_core::job::{Job, Method, Optimizer, PeftConfig, Precision};
use moro_core::model::ModelSpec;

const GIB: u64 = 1 << 30;

fn model(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("in catalog")).expect("parses")
}

/// The H200 LoRA base job: r16 on the seven projections, bf16-mixed, fused AdamW,
/// non-reentrant checkpointing, micro-batch 1 × 2048.
fn lora_job(m: &ModelSpec, seq: u64) -> Job {
    let mut j = Job {
        method: Method::Adapters,
        // The default LoRA: r16, alpha 32, the seven projections; the H200 job ran no dropout.
        adapter: PeftConfig {
            dropout: 0.0,
            ..PeftConfig::default()
        },
        micro_batch_size: 1,
        seq_len: seq,
        optimizer: Optimizer::AdamwTorchFused,
        precision: Precision::Bf16Mixed,
        gradient_checkpointing: true,
        ..Job::default()
    };
    j.adapter.targets = moro_core::targets::resolve(m, &j.adapter.targets);
    j
}

fn run(m: &ModelSpec, j: &Job) -> Estimate {
    estimate(m, j, &DeviceProfile::for_compute_capability(Some((9, 0)))).expect("valid job")
}

/// The largest buffer of a LoRA step is the loss's fp32 logits, T · V · 4 bytes
/// (`largest_freed_block`, the floor of the reserve where the step is not replayed). The
/// H200's LoRA step is traced op by op and its replay is the reserve: for 512 / 2,048 /
/// 4,096 tokens the H200 measured reserved − allocated 0.64 / 1.24 / 2.25 GiB, the replay
/// gives 0.61 / 1.13 / 1.92 (the fake-CUDA oracle's own sequence replays, without cuBLAS's
/// workspaces, to 0.40 / 1.16 / 1.95), and the old block floor 0.25 / 0.98 / 1.96.
#[test]
fn lora_reserve_is_the_replay_of_its_step() {
    let m = model("meta-llama/Llama-3.1-8B");
    let measured = [(512, 0.64), (2048, 1.24), (4096, 2.25)];
    for (seq, gap) in measured {
        let e = run(&m, &lora_job(&m, seq));
        assert_eq!(e.largest_freed_block, seq * 128_256 * 4, "seq {seq}");
        assert!(e.reserve_from_replay, "seq {seq}");
        let reserve = (e.peak_reserved_bytes - e.peak_allocated_bytes) as f64 / GIB as f64;
        assert!(
            reserve <= gap + 0.05 && reserve >= gap - 0.35,
            "seq {seq}: {reserve} vs {gap}"
        );
    }
}

/// A full fine-tune frees its gradients every step (`zero_grad(set_to_none=True)`): the
/// largest is the embedding's, V · h in the parameter dtype (bf16 here: 128256 · 4096 · 2).
#[test]
fn full_fine_tune_block_is_the_embedding_gradient() {
    let m = model("meta-llama/Llama-3.1-8B");
    let j = Job {
        method: Method::Full,
        micro_batch_size: 1,
        seq_len: 64,
        optimizer: Optimizer::AdamwTorchFused,
        precision: Precision::Bf16,
        gradient_checkpointing: true,
        ..Job::default()
    };
    let e = run(&m, &j);
    // The loss block at 64 tokens (64 · 128256 · 4 = 31 MiB) is smaller than the gradient.
    assert_eq!(e.largest_freed_block, 128_256 * 4096 * 2);
    // Before torch 2.0 `zero_grad()` zeroed gradients in place: only the loss block is freed.
    let old = Job {
        versions: moro_core::job::Versions {
            torch: Some((1, 13)),
            ..moro_core::job::Versions::default()
        },
        ..j
    };
    assert_eq!(run(&m, &old).largest_freed_block, 64 * 128_256 * 4);
    // With gradient accumulation the later micro-batches' fresh gradients are added into
    // `.grad` and dropped, whatever the torch version: the embedding's block again.
    let accumulating = Job {
        grad_accum: 4,
        ..old
    };
    assert_eq!(
        run(&m, &accumulating).largest_freed_block,
        128_256 * 4096 * 2
    );
}

/// HF Adafactor's step holds two fp32 copies of its largest parameter (`grad**2 + eps`,
/// then `_approx_sq_grad`), BERT-large's word embedding: 30,522 · 1,024 · 4 = 125,018,112 B
/// each, which no activation block holds. With gradient accumulation one lands in the last
/// micro-batch's freed gradient of that embedding (the same size), the other in a new
/// 2 MiB-rounded segment of 125,829,120 B; without it, both do. The HF docs' row
/// (`hf-docs-perf-train-gpu-one-007`, BERT-large, fp16 AMP, checkpointing, V100,
/// nvidia-smi) measured 4,847 MiB with a 1,343 MiB CUDA context: 3,504 MiB reserved.
#[test]
fn adafactor_step_copies_need_new_segments() {
    let m = model("google-bert/bert-large-uncased");
    let j = Job {
        method: Method::Full,
        micro_batch_size: 1,
        seq_len: 512,
        grad_accum: 4,
        optimizer: Optimizer::Adafactor,
        precision: Precision::Fp16Mixed,
        gradient_checkpointing: true,
        attention: moro_core::job::Attention::Eager,
        versions: moro_core::job::Versions {
            torch: Some((1, 10)),
            ..moro_core::job::Versions::default()
        },
        ..Job::default()
    };
    let segment = 125_829_120;
    let e = run(&m, &j);
    assert_eq!(e.step_segments_bytes, segment);
    let single = run(
        &m,
        &Job {
            grad_accum: 1,
            ..j.clone()
        },
    );
    assert_eq!(single.step_segments_bytes, 2 * segment);
    // The floor: the forward and backward's reserved level plus the new segment.
    let fwd_bwd = e
        .phases
        .iter()
        .filter(|p| p.phase != Phase::OptimizerStep)
        .map(moro_core::estimate::PhaseBytes::total)
        .max()
        .unwrap();
    assert!(e.peak_reserved_bytes >= fwd_bwd + segment);
    let reserved_mib = e.peak_reserved_bytes as f64 / (1 << 20) as f64;
    assert!(
        (reserved_mib / 3504.0 - 1.0).abs() < 0.03,
        "reserved {reserved_mib} MiB vs 3,504 measured"
    );
    // Fused AdamW has no step temporaries: no new segment.
    let adamw = run(
        &m,
        &Job {
            optimizer: Optimizer::AdamwTorchFused,
            ..j
        },
    );
    assert_eq!(adamw.step_segments_bytes, 0);
}

/// Gemma 2's `final_logit_softcapping` saves tanh's bf16 output (under autocast) from the
/// forward to the loss backward: exactly T · V · 2 bytes more at the loss backward than the
/// same model without it. The fake-tensor oracle lists it live at the peak
/// (`tanh.default bfloat16 (1, 2048, 256000)`, 1,048,576,000 bytes).
#[test]
fn gemma2_softcapping_keeps_one_more_logits_tensor() {
    let m = model("google/gemma-2-2b");
    assert!(m.logit_softcapping);
    assert!(!model("google/gemma-3-1b-it").logit_softcapping);
    assert!(!model("meta-llama/Llama-3.1-8B").logit_softcapping);
    let j = lora_job(&m, 2048);
    let with = run(&m, &j);
    let without = run(
        &ModelSpec {
            logit_softcapping: false,
            attn_softcapping: false,
            rope_by_concat: false,
            ..m.clone()
        },
        &j,
    );
    let at = |e: &Estimate, p: Phase| {
        e.phases
            .iter()
            .find(|x| x.phase == p)
            .map(moro_core::estimate::PhaseBytes::total)
            .unwrap()
    };
    assert_eq!(
        at(&with, Phase::LossBackward) - at(&without, Phase::LossBackward),
        2048 * 256_000 * 2
    );
    assert_eq!(with.peak_phase, Phase::LossBackward);
}

/// A config that writes `"final_logit_softcapping": null` switches it off.
#[test]
fn softcapping_null_is_off() {
    let mut cfg: serde_json::Value = serde_json::from_slice(
        catalog::find("google/gemma-2-2b")
            .unwrap()
            .config_json
            .as_bytes(),
    )
    .unwrap();
    cfg["final_logit_softcapping"] = serde_json::Value::Null;
    let m = moro_core::arch::parse_config(cfg.to_string().as_bytes()).unwrap();
    assert!(!m.logit_softcapping);
    cfg.as_object_mut()
        .unwrap()
        .remove("final_logit_softcapping");
    let m = moro_core::arch::parse_config(cfg.to_string().as_bytes()).unwrap();
    assert!(m.logit_softcapping, "Gemma2Config's default is 30.0");
}
