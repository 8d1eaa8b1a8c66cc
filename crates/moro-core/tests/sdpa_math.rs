//! SDPA's math kernel in litgpt (`Attention::Eager` with the litgpt stack), checked against
//! a hand calculation and against the measured lit-gpt run it explains.

use moro_core::catalog;
use moro_core::estimate::{Component, DeviceProfile, Estimate, Phase, estimate};
use moro_core::job::{Attention, Job, Method, PeftConfig, Precision, Stack, Targets};
use moro_core::model::ModelSpec;
use moro_core::validation::{CatalogModels, Status, validate};

fn falcon() -> ModelSpec {
    catalog::load(catalog::find("tiiuae/falcon-7b").expect("in catalog")).expect("parses")
}

/// lit-gpt's Falcon-7B LoRA (finetune/lora.py, 2023): q and v adapters on the fused qkv,
/// micro-batch 1 × 1079 (the longest Alpaca sample), bf16-true, no checkpointing.
fn lora(attention: Attention) -> Job {
    Job {
        method: Method::Adapters,
        adapter: PeftConfig {
            rank: 8,
            alpha: 16.0,
            dropout: 0.05,
            targets: Targets::Names(vec!["query".into(), "value".into()]),
            ..PeftConfig::default()
        },
        micro_batch_size: 1,
        seq_len: 1079,
        precision: Precision::Bf16,
        stack: Stack::Litgpt,
        attention,
        ..Job::default()
    }
}

fn forward_end_activations(m: &ModelSpec, j: &Job) -> u64 {
    let mut j = j.clone();
    j.adapter.targets = moro_core::targets::resolve(m, &j.adapter.targets);
    let e: Estimate = estimate(m, &j, &DeviceProfile::default()).expect("valid job");
    e.phase_component(Phase::ForwardEnd, Component::Activations)
}

/// Falcon-7B: h = 4544, 71 query heads of 64, one k/v head, 32 layers, bf16.
///
/// Flash / memory-efficient kernel, per token and layer: the fused qkv output
/// (4544 + 2·64), the roped q and k and the kernel's output (3·4544), 2 bytes each, and the
/// fp32 log-sum-exp (4·71).
/// Math kernel: the scaled q and the k and v copies expanded to 71 heads (3·4544) and the
/// bf16 softmax output over the 1079 keys (71·1079), 2 bytes each.
#[test]
fn math_kernel_saves_the_probabilities_and_the_expanded_heads() {
    let m = falcon();
    let flash = forward_end_activations(&m, &lora(Attention::Sdpa));
    let math = forward_end_activations(&m, &lora(Attention::Eager));
    let per_token_flash = 2 * (4544 + 2 * 64) + 2 * 3 * 4544 + 4 * 71;
    let per_token_math = 2 * (3 * 4544 + 71 * 1079);
    assert_eq!(
        math - flash,
        (per_token_math - per_token_flash) * 1079 * 32,
        "32 layers × 1079 tokens"
    );
}

/// lit-gpt's "Memory used" for that run was 23.52 GB (its OOM doc, 2023-09); the row is
/// read as SDPA's math kernel because lit-gpt had not yet expanded MQA's k and v.
#[test]
fn the_lit_gpt_falcon_run_is_reproduced() {
    let jsonl = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/measured.jsonl"
    ))
    .expect("measured rows");
    let report = validate(&jsonl, &CatalogModels, false);
    for (id, tokens) in [("litgpt-oom-doc-001", 1079), ("litgpt-oom-doc-002", 256)] {
        let row = report
            .rows
            .iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("{id} is in the file"));
        assert_eq!(row.status, Status::Ok, "{id}");
        let err = row.error.expect("compared");
        assert!(err.abs() < 0.03, "{id} ({tokens} tokens): {err:+.3}");
    }
}
