//! Vision-language training steps against the fake-CUDA oracle's traces
//! (`calibration/vlm_trace.py`: transformers 5.24, torch 2.15, PEFT 0.21.2; the model built
//! with `AutoModelForImageTextToText.from_config`, fed what its processor produces:
//! `validation/oracle-traces/vlm.jsonl`). Gemma 3 4B, Qwen2.5-VL-3B, Qwen2-VL-2B and
//! LLaVA-1.5-7B, cut to 4 language-model layers and 8 tower layers; the tower frozen (LoRA on
//! the language model only) or trained (full fine-tuning).

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{
    Attention, JobSettings, Method, Optimizer, Precision, Targets, VisionTraining,
};
use moro_core::model::ModelSpec;
use serde_json::Value;

const TRACES: &str = include_str!("../../../validation/oracle-traces/vlm.jsonl");

/// The catalog config cut as the trace's was: `text_layers` language-model layers and
/// `vision_layers` tower blocks.
fn cut(stem: &str, text_layers: u64, vision_layers: u64) -> ModelSpec {
    let entry = catalog::find(&stem.replacen("--", "/", 1)).expect("in the catalog");
    let mut cfg: Value = serde_json::from_str(entry.config_json).expect("json");
    if cfg.get("text_config").is_some() {
        cfg["text_config"]["num_hidden_layers"] = text_layers.into();
    } else {
        cfg["num_hidden_layers"] = text_layers.into();
    }
    let tower_key = if cfg["model_type"]
        .as_str()
        .is_some_and(|t| t.starts_with("qwen2"))
    {
        "depth"
    } else {
        "num_hidden_layers"
    };
    cfg["vision_config"][tower_key] = vision_layers.into();
    moro_core::arch::parse_config(cfg.to_string().as_bytes()).expect("parses")
}

fn settings(trace: &Value) -> JobSettings {
    let j = &trace["job"];
    let n = |k: &str| j[k].as_u64().unwrap();
    let method = match j["method"].as_str().unwrap() {
        "full" => Method::Full,
        _ => Method::Adapters,
    };
    let precision = match j["precision"].as_str().unwrap() {
        "bf16-mixed" => Precision::Bf16Mixed,
        _ => Precision::Bf16,
    };
    let seven = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    JobSettings {
        method: Some(method),
        precision: Some(precision),
        optimizer: Some(Optimizer::AdamwTorchFused),
        attention: Some(Attention::Sdpa),
        gradient_checkpointing: Some(j["grad_ckpt"].as_bool().unwrap()),
        micro_batch_size: Some(n("micro_batch")),
        seq_len: Some(n("text_seq")),
        lora_rank: Some(16),
        lora_alpha: Some(32.0),
        lora_dropout: Some(0.0),
        target_modules: Some(Targets::Names(
            seven.iter().map(|s| (*s).to_owned()).collect(),
        )),
        images_per_sample: Some(n("images_per_sample")),
        image_size: Some((
            j["image_size"][0].as_u64().unwrap(),
            j["image_size"][1].as_u64().unwrap(),
        )),
        vision: Some(if j["train_vision"].as_bool().unwrap() {
            VisionTraining::Trained
        } else {
            VisionTraining::Frozen
        }),
        ..JobSettings::default()
    }
}

/// Within 3 % of every trace at the allocated level.
#[test]
fn allocated_peak_matches_the_traces() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let stem = t["config_name"].as_str().unwrap().trim_end_matches(".json");
        let m = cut(
            stem,
            t["cut"]["text_layers"][0].as_u64().unwrap(),
            t["cut"]["vision_layers"][0].as_u64().unwrap(),
        );
        let job = settings(&t).resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &DeviceProfile::default()).expect("valid job");
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        let label = t["label"].as_str().unwrap();
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
    assert!(checked >= 25, "{checked} traces");
    assert!(failures.is_empty(), "{failures:?}");
}

/// A config of `data/models/` (the catalog), `data/staged/` or `validation/vlm-configs/`, by
/// file stem.
fn config_of(stem: &str) -> Value {
    let dir = env!("CARGO_MANIFEST_DIR");
    let text = ["data/models", "data/staged", "validation/vlm-configs"]
        .iter()
        .find_map(|d| std::fs::read_to_string(format!("{dir}/../../{d}/{stem}.json")).ok())
        .unwrap_or_else(|| panic!("{stem}: no config"));
    serde_json::from_str(&text).expect("json")
}

/// The newer vision-language models against their traced steps (`calibration/vlm_trace.py`,
/// transformers 5.25, the released processor settings): `vlm-idefics3.jsonl`, SmolVLM-256M
/// whole (LoRA on the language model with the tower frozen, with and without checkpointing;
/// full fine-tuning with the tower trained) and SmolVLM (2B) cut to 4 language and 8 tower
/// layers; `vlm-qwen3.jsonl`, Qwen3-VL-4B cut to 4 and 8 (LoRA at 640×480, LoRA with
/// checkpointing at 1280×720, full with the tower trained) and Qwen3-VL-30B-A3B cut to 2 and
/// 4; `vlm-mistral3.jsonl`, Mistral Small 3.1 cut to 4 language and 4 tower layers (LoRA at
/// 640×480, LoRA with checkpointing at 1024×768) and to 2 and 4 (full, tower trained). A
/// traced Idefics3 text holds no `<image>` placeholder, which moro's sequence length
/// counts: one token more. Within 3 % at the allocated level.
#[test]
fn newer_vlms_match_their_traces() {
    let mut checked = 0;
    for (traces, placeholder) in [
        (
            include_str!("../../../validation/oracle-traces/vlm-idefics3.jsonl"),
            1,
        ),
        (
            include_str!("../../../validation/oracle-traces/vlm-qwen3.jsonl"),
            0,
        ),
        (
            include_str!("../../../validation/oracle-traces/vlm-mistral3.jsonl"),
            0,
        ),
    ] {
        for line in traces.lines() {
            let t: Value = serde_json::from_str(line).expect("trace");
            let stem = t["config_name"].as_str().unwrap().trim_end_matches(".json");
            let mut cfg = config_of(stem);
            let tower_key = if cfg["vision_config"].get("depth").is_some() {
                "depth"
            } else {
                "num_hidden_layers"
            };
            // A cut run names its layers (`[kept, of]`); the others ran whole.
            if let Some(n) = t["cut"]["text_layers"][0].as_u64() {
                cfg["text_config"]["num_hidden_layers"] = n.into();
            }
            if let Some(n) = t["cut"]["vision_layers"][0].as_u64() {
                cfg["vision_config"][tower_key] = n.into();
            }
            let m = moro_core::arch::parse_config(cfg.to_string().as_bytes()).expect("parses");
            let mut s = settings(&t);
            s.seq_len = s.seq_len.map(|n| n + placeholder);
            if cfg["model_type"] == "qwen3_vl_moe" {
                // The trace's LoRA regex names modules: the stacked experts are parameters,
                // so it adapts the attention only (its trainable count says so).
                s.target_modules = Some(Targets::Names(
                    ["q_proj", "k_proj", "v_proj", "o_proj"]
                        .iter()
                        .map(|n| (*n).to_owned())
                        .collect(),
                ));
            }
            let job = s.resolve_for(&m).expect("resolves");
            let e = estimate(&m, &job, &DeviceProfile::default()).expect("valid job");
            let label = t["label"].as_str().unwrap();
            // The trace counts what requires grad; moro what gets a gradient: a cut tower's
            // idle deepstack mergers differ.
            let idle = if t["job"]["method"] == "full" {
                m.vision.as_ref().map_or(0, |v| v.idle_params)
            } else {
                0
            };
            assert_eq!(
                e.trainable_params + idle,
                t["params"]["trainable"].as_u64().unwrap(),
                "{label}"
            );
            let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
            #[allow(clippy::cast_precision_loss)]
            let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
            eprintln!("{label}: {:+.2} %", err * 100.0);
            assert!(err.abs() <= 0.03, "{label}: {:+.2} %", err * 100.0);
            checked += 1;
        }
    }
    assert_eq!(checked, 11);
}

/// The Idefics3, SmolVLM and Qwen3-VL configs (`data/staged/`, two Qwen3-VL ones now in the
/// catalog) count what transformers 5.24 builds on the meta device
/// (`data/staged/manifest.jsonl`, `counts.total`).
#[test]
fn idefics3_counts_as_transformers_builds_it() {
    let manifest = include_str!("../../../data/staged/manifest.jsonl");
    let mut checked = 0;
    for line in manifest.lines() {
        let row: Value = serde_json::from_str(line).expect("json");
        if !matches!(
            row["model_type"].as_str(),
            Some("idefics3" | "smolvlm" | "qwen3_vl" | "qwen3_vl_moe")
        ) {
            continue;
        }
        let stem = row["stem"].as_str().unwrap();
        let m =
            moro_core::arch::parse_config(config_of(stem).to_string().as_bytes()).expect("parses");
        assert_eq!(
            m.total_params(),
            row["counts"]["total"].as_u64().unwrap(),
            "{stem}"
        );
        checked += 1;
    }
    assert_eq!(checked, 9);
}

/// `generate`'s prefill with images (`calibration/vlm_trace.py --matrix vlm-prefill`: the
/// prompt and its images under no_grad with a cache, bf16 weights): the tower's forward, then
/// the language model's; within 3 % at the allocated level.
#[test]
fn prefill_with_images_matches_its_traces() {
    let traces = include_str!("../../../validation/oracle-traces/vlm-prefill.jsonl");
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in traces.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let stem = t["config_name"].as_str().unwrap().trim_end_matches(".json");
        let (tl, vl) = (
            t["cut"]["text_layers"][0].as_u64().unwrap(),
            t["cut"]["vision_layers"][0].as_u64().unwrap(),
        );
        let mut cfg = config_of(stem);
        if cfg.get("text_config").is_some() {
            cfg["text_config"]["num_hidden_layers"] = tl.into();
            if let Some(cross) = cfg["text_config"]["cross_attention_layers"]
                .as_array()
                .cloned()
            {
                cfg["text_config"]["cross_attention_layers"] = Value::Array(
                    cross
                        .into_iter()
                        .filter(|i| i.as_u64().unwrap() < tl)
                        .collect(),
                );
            }
        } else {
            cfg["num_hidden_layers"] = tl.into();
        }
        let tower_key = if stem.starts_with("Qwen--Qwen2") {
            "depth"
        } else {
            "num_hidden_layers"
        };
        cfg["vision_config"][tower_key] = vl.into();
        if let Some(ix) = cfg["vision_config"]["intermediate_layers_indices"]
            .as_array()
            .cloned()
        {
            let kept: Vec<Value> = ix
                .into_iter()
                .filter(|i| i.as_u64().unwrap() < vl)
                .collect();
            cfg["vision_config"]["vision_output_dim"] = (1280 * (kept.len() as u64 + 1)).into();
            cfg["vision_config"]["intermediate_layers_indices"] = Value::Array(kept);
        }
        let m = moro_core::arch::parse_config(cfg.to_string().as_bytes()).expect("parses");
        let j = &t["job"];
        let job = JobSettings {
            method: Some(Method::Inference),
            precision: Some(Precision::Bf16),
            attention: Some(Attention::Sdpa),
            micro_batch_size: Some(1),
            seq_len: j["text_seq"].as_u64(),
            images_per_sample: j["images_per_sample"].as_u64(),
            image_size: Some((
                j["image_size"][0].as_u64().unwrap(),
                j["image_size"][1].as_u64().unwrap(),
            )),
            ..JobSettings::default()
        }
        .resolve_for(&m)
        .expect("resolves");
        // The oracle allocates no cuBLAS workspace.
        let device = DeviceProfile {
            cublas_workspace_bytes: 0,
            ..DeviceProfile::default()
        };
        let e = estimate(&m, &job, &device).expect("valid job");
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        let label = t["label"].as_str().unwrap();
        eprintln!(
            "{label}: {:+.2} % (moro {} at {}, oracle {want})",
            err * 100.0,
            e.peak_allocated_bytes,
            e.peak_phase.as_str()
        );
        if err.abs() > 0.03 {
            failures.push(format!("{label}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert_eq!(checked, 6);
    assert!(failures.is_empty(), "{failures:?}");
}
