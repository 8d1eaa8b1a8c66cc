//! Llama 3.2 Vision (`mllama`): counted as transformers 5.25 builds it, and its training step
//! against the step traced on fake CUDA tensors (`calibration/vlm_trace.py --matrix mllama`,
//! `validation/oracle-traces/vlm-mllama.jsonl`: torch 2.15, transformers 5.25, PEFT 0.21.2).

mod support;

use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{
    Attention, JobSettings, Method, Optimizer, Precision, Targets, VisionTraining,
};
use moro_core::model::{AttentionKind, ModelSpec};
use serde_json::Value;
use support::Peaks;

const CONFIG: &str =
    include_str!("../../../validation/vlm-configs/llama-3.2-11b-vision-shape.json");

fn config(text_layers: Option<u64>, vision_layers: Option<u64>) -> ModelSpec {
    let mut cfg: Value = serde_json::from_str(CONFIG).expect("config");
    if let Some(n) = text_layers {
        cfg["text_config"]["num_hidden_layers"] = n.into();
        let kept: Vec<Value> = cfg["text_config"]["cross_attention_layers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i.as_u64().unwrap() < n)
            .cloned()
            .collect();
        cfg["text_config"]["cross_attention_layers"] = Value::Array(kept);
    }
    if let Some(n) = vision_layers {
        let v = &mut cfg["vision_config"];
        v["num_hidden_layers"] = n.into();
        let kept: Vec<Value> = v["intermediate_layers_indices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i.as_u64().unwrap() < n)
            .cloned()
            .collect();
        v["vision_output_dim"] = (1280 * (kept.len() as u64 + 1)).into();
        v["intermediate_layers_indices"] = Value::Array(kept);
    }
    moro_core::arch::parse_config(cfg.to_string().as_bytes()).expect("parses")
}

/// `sum(p.numel())` of `MllamaForConditionalGeneration(config)` on the meta device:
/// Llama-3.2-11B-Vision's shape is 10,670,220,835 parameters, the count its checkpoint
/// publishes; the traced cut (4 text layers, 8 local tower layers) 2,330,322,709 with a
/// 391,431,699-parameter tower.
#[test]
fn parameter_counts_are_transformers() {
    let m = config(None, None);
    assert_eq!(m.total_params(), 10_670_220_835);
    let cross: u64 = m
        .layers
        .iter()
        .filter(|g| g.attention == AttentionKind::Cross)
        .map(|g| g.count)
        .sum();
    assert_eq!(cross, 8);
    let cut = config(Some(4), Some(8));
    assert_eq!(cut.total_params(), 2_330_322_709);
    assert_eq!(cut.vision.as_ref().unwrap().tower_params(), 391_431_699);
}

const TRACES: &str = include_str!("../../../validation/oracle-traces/vlm-mllama.jsonl");

fn settings(t: &Value) -> JobSettings {
    let j = &t["job"];
    let n = |k: &str| j[k].as_u64().unwrap();
    let seven = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let images = n("images_per_sample");
    JobSettings {
        method: Some(match j["method"].as_str().unwrap() {
            "full" => Method::Full,
            _ => Method::Adapters,
        }),
        precision: Some(match j["precision"].as_str().unwrap() {
            "bf16-mixed" => Precision::Bf16Mixed,
            _ => Precision::Bf16,
        }),
        optimizer: Some(Optimizer::AdamwTorchFused),
        attention: Some(Attention::Sdpa),
        gradient_checkpointing: Some(j["grad_ckpt"].as_bool().unwrap()),
        micro_batch_size: Some(n("micro_batch")),
        seq_len: t["total_seq"].as_u64(),
        lora_rank: Some(16),
        lora_alpha: Some(32.0),
        lora_dropout: Some(0.0),
        target_modules: Some(Targets::Names(
            seven.iter().map(|s| (*s).to_owned()).collect(),
        )),
        images_per_sample: Some(images),
        image_size: (images > 0).then(|| {
            (
                j["image_size"][0].as_u64().unwrap(),
                j["image_size"][1].as_u64().unwrap(),
            )
        }),
        vision: Some(if j["train_vision"].as_bool().unwrap() {
            VisionTraining::Trained
        } else {
            VisionTraining::Frozen
        }),
        ..JobSettings::default()
    }
}

/// Every traced step (LoRA and full; bf16 and bf16-mixed; with checkpointing, which puts the
/// frozen tower's blocks in the autograd graph whole; one or two images, 1120² or 560²; no
/// image at all): moro's allocated peak within 3 %.
#[test]
fn training_steps_match_their_traces() {
    let m = config(Some(4), Some(8));
    let mut peaks = Peaks::default();
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let job = settings(&t).resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &DeviceProfile::default()).expect("valid job");
        peaks.check(t["label"].as_str().unwrap(), &e, &t, -0.03..=0.03);
    }
    peaks.finish(8);
}

/// `MllamaImageProcessor` pads every image to 4 tiles of 560² whatever its size (the traces'
/// `pixel_values` are (1, 1, 4, 3, 560, 560) for a 560² and a 1120² image alike); the tower
/// runs 4 × 1,608 positions (1,601 patches and class token, padded to a multiple of 8), the
/// language model keeps just the `<|image|>` token, and each cross-attention layer reads
/// 4 × 1,601 vision states (the traced k and v: (1, 8, 4, 6404, 128)).
#[test]
fn images_become_tiles_as_the_processor_makes_them() {
    let v = config(None, None).vision.unwrap();
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        if t["job"]["images_per_sample"].as_u64() == Some(0) {
            continue;
        }
        let shape: Vec<u64> = t["image_grid"]["pixel_values_shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(shape, [1, 1, 4, 3, 560, 560]);
        let size = &t["job"]["image_size"];
        let s = v
            .tokens
            .shape(size[0].as_u64().unwrap(), size[1].as_u64().unwrap());
        assert_eq!(s.tower_tokens, 4 * 1608);
        assert_eq!(s.added_tokens, 0);
        assert_eq!(t["image_tokens_per_image"], 1);
    }
    assert_eq!(v.cross_states_per_image(), 4 * 1601);
}

/// Generation keeps each cross-attention layer's keys and values of the image: 8 layers ×
/// 6,404 states × (k and v) × 8 heads × 128 × 2 bytes, per image, whatever the context.
#[test]
fn generation_caches_the_images_keys_and_values() {
    let m = config(None, None);
    let peak = |images: u64, context: u64| {
        let job = JobSettings {
            method: Some(Method::Inference),
            seq_len: Some(context),
            images_per_sample: Some(images),
            image_size: (images > 0).then_some((560, 560)),
            ..JobSettings::default()
        }
        .resolve_for(&m)
        .expect("resolves");
        estimate(&m, &job, &DeviceProfile::default())
            .expect("valid")
            .component(moro_core::estimate::Component::KvCache)
    };
    let per_image = 8 * 6404 * 2 * 8 * 128 * 2;
    assert_eq!(peak(1, 4096) - peak(0, 4096), per_image);
    assert_eq!(peak(2, 4096) - peak(1, 4096), per_image);
    // The text's cache: the 32 self-attention layers only.
    assert_eq!(peak(0, 4096), 32 * 4096 * 2 * 8 * 128 * 2);
}

/// Not modelled elsewhere than in transformers' own modules.
#[test]
fn other_stacks_are_refused_by_name() {
    let m = config(None, None);
    let job = JobSettings {
        method: Some(Method::Adapters),
        stack: Some(moro_core::job::Stack::Torchtune),
        images_per_sample: Some(1),
        image_size: Some((560, 560)),
        ..JobSettings::default()
    }
    .resolve_for(&m)
    .expect("resolves");
    assert_eq!(job.validate(&m).unwrap_err().field, "stack");
}
