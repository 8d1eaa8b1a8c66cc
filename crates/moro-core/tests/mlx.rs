//! The MLX stack against traces of mlx-lm's own trainer and by hand.
//!
//! `validation/oracle-traces/mlx.jsonl` holds `mx.get_peak_memory()` over one training step
//! of `mlx_lm.tuner.trainer.train` (mlx 0.32.4, mlx-lm 0.32.2) on MLX's CPU backend, with
//! the Metal kernels' vjps for `rms_norm` and `rope` and the unfused loss
//! (`calibration/mlx_trace.py`): catalog models cut to a few layers (and, where the CPU's
//! matmuls are too slow, a 4,096-entry vocabulary), LoRA on every Linear or on q and v,
//! QLoRA on MLX 4- and 8-bit weights, DoRA, checkpointing, 1 to 4 adapted layers and 128 to
//! 2,048 tokens. The LoRA, QLoRA and DoRA rows come out −4.5 % to +15.0 % of the traced peak;
//! the full fine-tunes are left out, as the CPU keeps copies a Mac does not
//! (docs/mlx-memory.md §8.3).

use moro_core::arch::parse_config;
use moro_core::catalog;
use moro_core::estimate::{Component, DeviceProfile, estimate};
use moro_core::job::{
    Job, JobSettings, Method, Optimizer, PeftConfig, Precision, Quantization, Stack, Targets,
    Versions,
};
use moro_core::model::ModelSpec;

const TRACES: &str = include_str!("../../../validation/oracle-traces/mlx.jsonl");

/// The traced model: the catalog's config with the trace's layer count and vocabulary.
fn traced_model(row: &serde_json::Value) -> ModelSpec {
    let entry = catalog::find(row["model"].as_str().unwrap()).expect("in the catalog");
    let mut config: serde_json::Value = serde_json::from_str(entry.config_json).unwrap();
    let text = config
        .get("text_config")
        .is_some_and(serde_json::Value::is_object);
    let c = if text {
        config.get_mut("text_config").unwrap()
    } else {
        &mut config
    };
    c["num_hidden_layers"] = row["layers"].clone();
    c["vocab_size"] = row["vocab"].clone();
    parse_config(serde_json::to_string(&config).unwrap().as_bytes()).expect("parses")
}

fn traced_job(row: &serde_json::Value) -> Job {
    let full = row["method"] == "full";
    let dora = row["method"] == "dora";
    let bits = row["bits"].as_u64().unwrap();
    let quantization = match (bits, row["group"].as_u64().unwrap()) {
        (0, _) => Quantization::None,
        (4, 64) => Quantization::Mlx4,
        (8, 64) => Quantization::Mlx8,
        (4, 32) => Quantization::Mlx4G32,
        (8, 32) => Quantization::Mlx8G32,
        other => panic!("no quantization for {other:?}"),
    };
    let targets = match row["keys"].as_str().unwrap() {
        "all" => Targets::AllLinear,
        keys => Targets::Names(
            keys.split(',')
                .map(|k| k.rsplit('.').next().unwrap().to_owned())
                .collect(),
        ),
    };
    Job {
        method: match (full, bits) {
            (true, _) => Method::Full,
            (false, 0) => Method::Adapters,
            (false, _) => Method::QuantizedAdapters,
        },
        quantization,
        adapter: PeftConfig {
            rank: row["rank"].as_u64().unwrap(),
            dropout: row["dropout"].as_f64().unwrap(),
            targets,
            dora,
            ..PeftConfig::default()
        },
        micro_batch_size: row["batch"].as_u64().unwrap(),
        seq_len: row["seq"].as_u64().unwrap(),
        grad_accum: row["grad_accum"].as_u64().unwrap(),
        optimizer: Optimizer::AdamwTorch,
        gradient_checkpointing: row["grad_checkpoint"].as_bool().unwrap(),
        precision: Precision::Bf16,
        stack: Stack::Mlx,
        adapted_layers: row["num_layers"].as_u64(),
        versions: Versions {
            // The CPU runs the unfused loss, as GPUs did before mlx 0.32.2.
            mlx: (row["loss"] == "unfused").then_some((0, 32, 1)),
            ..Versions::default()
        },
        ..Job::default()
    }
}

fn rows() -> impl Iterator<Item = serde_json::Value> {
    TRACES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
}

#[test]
fn weights_and_trainable_parameters_are_the_traced_ones() {
    for row in rows() {
        let model = traced_model(&row);
        let job = traced_job(&row);
        let est = estimate(&model, &job, &DeviceProfile::default()).unwrap();
        assert_eq!(
            est.trainable_params,
            row["trainable_params"].as_u64().unwrap(),
            "{row}"
        );
        let weights = est.phases[0].component(Component::Weights);
        let traced = row["weights_bytes"].as_u64().unwrap();
        // Quantized weights: MLX pads nothing, so the bytes are exact.
        assert_eq!(weights, traced, "{row}");
    }
}

#[test]
fn the_peak_is_within_the_traced_spread() {
    let mut errors = Vec::new();
    for row in rows().filter(|r| r["method"] != "full") {
        let model = traced_model(&row);
        let job = traced_job(&row);
        let est = estimate(&model, &job, &DeviceProfile::default()).unwrap();
        let traced = row["peak_active_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = (est.peak_allocated_bytes as f64 - traced as f64) / traced as f64;
        errors.push((err, row.to_string(), est.peak_phase));
    }
    for (err, row, phase) in &errors {
        eprintln!("{:+6.1} % {phase:?} {row}", 100.0 * err);
    }
    assert!(
        errors.iter().all(|e| (-0.05..0.16).contains(&e.0)),
        "a traced row outside −5 … +16 %"
    );
    assert!(errors.len() >= 10, "{} traced LoRA rows", errors.len());
}

#[test]
fn weights_by_hand() {
    // Qwen3-8B at 4 bits in groups of 64: every Linear and the untied embedding and lm_head
    // (all input widths divide 64) at 4/8 + 2·2/64 B per weight, norms in bf16.
    let model = catalog::load(catalog::find("Qwen/Qwen3-8B").unwrap()).unwrap();
    let job = JobSettings {
        stack: Some(Stack::Mlx),
        method: Some(Method::QuantizedAdapters),
        ..JobSettings::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(job.quantization, Quantization::Mlx4);
    let est = estimate(&model, &job, &DeviceProfile::default()).unwrap();
    let quantized = model.linear_params() - linear_biases(&model) + 2 * 151_936 * 4096;
    let rest = model.total_params() - quantized;
    let by_hand = quantized / 64 * 36 + rest * 2;
    assert_eq!(est.phases[0].component(Component::Weights), by_hand);
}

fn linear_biases(model: &ModelSpec) -> u64 {
    model
        .linears()
        .filter(|(_, l)| l.bias)
        .map(|(n, l)| n * l.count * l.out_features)
        .sum()
}
