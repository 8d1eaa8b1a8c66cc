//! `torch.compile` against traces of AOTAutograd's partitioner and measured H200 rows.
//!
//! `validation/oracle-traces/compile.jsonl` holds what Inductor's partitioner saves per
//! decoder layer (`calibration/compile_trace.py`, torch 2.15, transformers 5.25, PEFT 0.21.2,
//! fake tensors on a CPU) for five architectures: Llama-3.1-8B, Mistral-7B (the same
//! shapes), Qwen3-8B (q/k norms), Phi-3-mini (fused qkv and gate/up projections) and
//! gemma-2-2b (four norms, soft-capped eager attention), each as a bf16 full fine-tune, a
//! bf16-mixed LoRA and a bf16-mixed full fine-tune (fp32 weights); Llama-3.1-8B also as a
//! bf16 LoRA without autocast and with LoRA dropout 0.05 (each adapter's mask and copy are
//! saved: random ops are never recomputed).
//!
//! By hand, Llama-3.1-8B bf16 full, per token and layer: layer input and o_proj output
//! (2·2h), the two norms' outputs the projections read (2·2h), two fp32 `rsqrt` (8), q, k,
//! v and flash's output (2·(2·4096 + 2·1024)) with its fp32 log-sum-exp (4·32), gate, up
//! and their product (3·2·14336): 139,400 B, the trace's figure.

use moro_core::catalog;
use moro_core::estimate::Regime;
use moro_core::estimate::activations::Activations;
use moro_core::estimate::loss::Loss;
use moro_core::job::{Attention, Job, LoraConfig, Method, Optimizer, Precision, Targets};
use moro_core::model::ModelSpec;

const TRACES: &str = include_str!("../../../validation/oracle-traces/compile.jsonl");

fn model(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("in catalog")).expect("parses")
}

/// A trace row's job, compiled or not.
fn traced_job(row: &serde_json::Value, compile: bool) -> Job {
    let lora = row["method"] == "lora";
    Job {
        method: if lora { Method::Lora } else { Method::Full },
        lora: LoraConfig {
            rank: row["lora_r"].as_u64().unwrap_or(16),
            alpha: 32.0,
            dropout: row["lora_dropout"].as_f64().unwrap_or(0.0),
            targets: Targets::AllLinear,
            ..LoraConfig::default()
        },
        micro_batch_size: row["B"].as_u64().unwrap(),
        seq_len: row["T"].as_u64().unwrap(),
        precision: if row["precision"] == "bf16" {
            Precision::Bf16
        } else {
            Precision::Bf16Mixed
        },
        attention: if row["attn"] == "eager" {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
        optimizer: Optimizer::AdamwTorch,
        gradient_checkpointing: false,
        compile,
        ..Job::default()
    }
}

fn rows(case: &str) -> Vec<serde_json::Value> {
    TRACES
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .filter(|r| r["case"] == case)
        .collect()
}

fn per_layer_per_token(m: &ModelSpec, job: &Job) -> f64 {
    let acts = Activations::new(m, job, &Regime::resolve(m, job), 1);
    acts.one_layer as f64 / (job.micro_batch_size * job.seq_len) as f64
}

/// Every layer, compiled and eager, within 0.5 % of its trace (the largest gap is 64 B per
/// token; the flash kernel's 8-byte philox state is not modelled).
#[test]
fn compiled_layers_save_what_the_partitioner_saves() {
    let rows = rows("layer");
    assert!(rows.len() >= 15, "{} traced layers", rows.len());
    let mut models = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for row in &rows {
        let id = row["model"].as_str().unwrap().replacen("--", "/", 1);
        let m = model(&id);
        models.insert(row["dims"]["model_type"].as_str().unwrap().to_owned());
        let what = format!("{id} {} {}", row["precision"], row["method"]);
        for (compile, side) in [(true, "compiled"), (false, "eager")] {
            let job = traced_job(row, compile);
            job.validate(&m).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let ours = per_layer_per_token(&m, &job);
            let traced = row[side]["per_layer_per_token"].as_f64().unwrap();
            let err = (ours - traced) / traced;
            if err.abs() > 0.005 {
                wrong.push(format!(
                    "{what} {side}: {ours:.0} B/token per layer vs traced {traced:.0} ({:+.1} %)",
                    100.0 * err
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(models.len() >= 4, "architectures traced: {models:?}");
}

/// The traced loss head: Inductor keeps the 16-bit logits (and two fp32 per-row values and
/// the shifted labels, 16 B); eager keeps `log_softmax`'s fp32 output.
#[test]
fn the_compiled_loss_keeps_the_16_bit_logits_only() {
    for row in rows("loss") {
        let id = row["model"].as_str().unwrap().replacen("--", "/", 1);
        let m = model(&id);
        let job = traced_job(&row, true);
        let r = Regime::resolve(&m, &job);
        let t = job.micro_batch_size * job.seq_len;
        let loss = Loss::new(&m, &job, &r, 1);
        let lm_head_input = if job.method == Method::Full {
            2 * m.hidden_size
        } else {
            0
        };
        let traced = row["compiled"]["per_layer_per_token"].as_f64().unwrap();
        let ours = (loss.forward_peak / t + lm_head_input + 16) as f64;
        assert!(
            (ours - traced).abs() < 1.0,
            "{id} {}: {ours} vs traced {traced}",
            row["method"]
        );
    }
}
