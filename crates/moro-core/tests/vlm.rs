//! Vision-language models against independent figures: parameter counts by component from
//! transformers' own modules (`validation/vlm-params.json`, meta-device builds), and image
//! tokens from the processors themselves (`validation/vlm-image-tokens.jsonl`, transformers
//! 5.24 image processors run on images of each size).

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, Phase, estimate};
use moro_core::job::{JobSettings, Method, VisionTraining};
use moro_core::model::ModelSpec;
use serde_json::Value;

const PARAMS: &str = include_str!("../../../validation/vlm-params.json");
const TOKENS: &str = include_str!("../../../validation/vlm-image-tokens.jsonl");

fn spec(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("in the catalog")).expect("parses")
}

#[test]
fn towers_and_projectors_count_as_transformers_builds_them() {
    let models: serde_json::Map<String, Value> =
        serde_json::from_str::<Value>(PARAMS).unwrap()["models"]
            .as_object()
            .unwrap()
            .clone();
    assert!(models.len() >= 10);
    for (stem, counts) in &models {
        let m = spec(&stem.replacen("--", "/", 1));
        let v = m.vision.as_ref().expect("a vision tower");
        let want = |k: &str| counts[k].as_u64().unwrap();
        assert_eq!(m.total_params(), want("total"), "{stem} total");
        assert_eq!(v.tower_params(), want("vision_tower"), "{stem} tower");
        assert_eq!(
            v.projector_params(),
            want("multi_modal_projector"),
            "{stem} projector"
        );
        assert_eq!(
            m.embedding_params(),
            want("embed_tokens"),
            "{stem} embedding"
        );
        assert_eq!(m.lm_head_params(), want("lm_head"), "{stem} lm_head");
    }
}

#[test]
fn gemma3_4b_tower_is_keras_hubs_with_vision_difference() {
    // keras-hub gemma3_instruct_4b: 4,299,915,632 with vision, 3,880,099,328 text only.
    assert_eq!(spec("google/gemma-3-4b-it").vision_params(), 419_816_304);
}

/// Tokens an image adds beyond the text's one placeholder, as each processor expands it:
/// Gemma 3 replaces `<start_of_image>` with its full image sequence (the soft tokens and
/// the boundary tokens), LLaVA replaces `<image>` with the patch tokens, Qwen-VL replaces
/// `<|image_pad|>` with the merged patches (its `<|vision_start|>`/`<|vision_end|>` come from
/// the chat template, already text).
#[test]
fn image_tokens_follow_the_processors() {
    let mut checked = 0;
    for line in TOKENS.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        let family = row["model"].as_str().unwrap();
        let profile = row["preprocessor_profile"].as_str().unwrap_or("hub");
        if profile != "hub" {
            // The rows of the image processor class's own defaults (max_pixels 1,003,520) are
            // not what a released checkpoint's preprocessor_config.json loads.
            continue;
        }
        let id = match family {
            "Gemma 3" => "google/gemma-3-4b-it",
            "LLaVA-1.5" => "llava-hf/llava-1.5-7b-hf",
            "Qwen2.5-VL" => "Qwen/Qwen2.5-VL-3B-Instruct",
            "Qwen2-VL" => "Qwen/Qwen2-VL-2B-Instruct",
            _ => continue,
        };
        let n = |k: &str| row[k].as_u64().unwrap();
        let (w, h) = (n("width"), n("height"));
        let placeholders = n("image_tokens");
        let added = match family {
            "Gemma 3" => placeholders + n("extra_tokens") - 1,
            _ => placeholders - 1,
        };
        let v = spec(id).vision.unwrap();
        let shape = v.tokens.shape(w, h);
        assert_eq!(shape.added_tokens, added, "{family} {w}x{h}");
        assert_eq!(
            shape.resized,
            (n("resized_width"), n("resized_height")),
            "{family} {w}x{h} resize"
        );
        if let Some(patches) = row["grid"]["patches"].as_u64() {
            // CLIP's tower also runs its class token (`CLIPVisionEmbeddings`).
            let class = u64::from(family == "LLaVA-1.5");
            assert_eq!(
                shape.tower_tokens,
                patches + class,
                "{family} {w}x{h} patches"
            );
        }
        checked += 1;
    }
    assert!(checked >= 18, "{checked} rows");
}

fn job(id: &str, settings: JobSettings) -> (ModelSpec, moro_core::job::Job) {
    let m = spec(id);
    let j = settings.resolve_for(&m).expect("valid");
    (m, j)
}

#[test]
fn images_lengthen_the_sequence_and_default_to_one() {
    let (m, j) = job("Qwen/Qwen2.5-VL-7B-Instruct", JobSettings::default());
    assert_eq!((j.images.per_sample, j.images.width), (1, 1024));
    let one = estimate(&m, &j, &DeviceProfile::default()).unwrap();
    let none = JobSettings {
        images_per_sample: Some(0),
        ..JobSettings::default()
    };
    let (_, j0) = job("Qwen/Qwen2.5-VL-7B-Instruct", none);
    let text = estimate(&m, &j0, &DeviceProfile::default()).unwrap();
    assert!(one.peak_allocated_bytes > text.peak_allocated_bytes);
    let big = JobSettings {
        images_per_sample: Some(2),
        image_size: Some((1920, 1080)),
        ..JobSettings::default()
    };
    let (_, j2) = job("Qwen/Qwen2.5-VL-7B-Instruct", big);
    let two = estimate(&m, &j2, &DeviceProfile::default()).unwrap();
    assert!(two.peak_allocated_bytes > one.peak_allocated_bytes);
}

#[test]
fn a_frozen_tower_trains_nothing_and_a_trained_one_everything() {
    let full = JobSettings {
        method: Some(Method::Full),
        ..JobSettings::default()
    };
    let (m, frozen) = job("google/gemma-3-4b-it", full.clone());
    let e = estimate(&m, &frozen, &DeviceProfile::default()).unwrap();
    assert_eq!(e.trainable_params, m.total_params() - 419_816_304);
    assert!(e.phases.iter().any(|p| p.phase == Phase::VisionForward));
    assert!(!e.phases.iter().any(|p| p.phase == Phase::VisionBackward));
    let trained = JobSettings {
        vision: Some(VisionTraining::Trained),
        ..full
    };
    let (_, t) = job("google/gemma-3-4b-it", trained);
    let et = estimate(&m, &t, &DeviceProfile::default()).unwrap();
    assert_eq!(et.trainable_params, m.total_params());
    assert!(et.phases.iter().any(|p| p.phase == Phase::VisionBackward));
    assert!(et.peak_allocated_bytes > e.peak_allocated_bytes);
}

#[test]
fn vision_settings_a_method_cannot_train_are_refused() {
    let m = spec("Qwen/Qwen2.5-VL-3B-Instruct");
    let trained_lora = JobSettings {
        vision: Some(VisionTraining::Trained),
        ..JobSettings::default()
    };
    let e = trained_lora
        .resolve_for(&m)
        .unwrap()
        .validate(&m)
        .unwrap_err();
    assert_eq!(e.field, "training.vision");
    let text = spec("Qwen/Qwen2.5-7B");
    let images = JobSettings {
        images_per_sample: Some(1),
        ..JobSettings::default()
    };
    let e = images
        .resolve_for(&text)
        .unwrap()
        .validate(&text)
        .unwrap_err();
    assert_eq!(e.field, "training.images_per_sample");
    assert!(e.message.contains("text model"), "{}", e.message);
}

/// The recipe search sizes a vision-language job with the same images `estimate` assumes
/// when none are given, so the recipe it calls safe is the job that runs.
#[test]
fn the_search_sizes_the_default_images() {
    use moro_core::search::{Caps, Request, Space, search};
    let m = spec("Qwen/Qwen2.5-VL-7B-Instruct");
    let gpu = moro_core::hardware::presets()
        .iter()
        .find(|p| p.id == "rtx-4090")
        .and_then(|p| p.to_device(None))
        .expect("rtx-4090");
    let caps = Caps::of_device(&gpu);
    let space = Space::new(&m, &Request::default(), &caps).expect("space");
    let best = search(&m, &space, &caps).best.expect("something fits");
    let (_, by_default) = job("Qwen/Qwen2.5-VL-7B-Instruct", JobSettings::default());
    assert_eq!(best.job.images, by_default.images);
    assert_eq!(best.job.images.per_sample, 1);
    let again = estimate(&m, &best.job, &caps.profile).unwrap();
    assert_eq!(again.peak_device_bytes, best.estimate.peak_device_bytes);
}

/// Multimodal Gemma 3 has no FlashAttention path in transformers: a job that asks for it is
/// refused, and the search never picks it.
#[test]
fn gemma3_with_images_runs_no_flash_attention() {
    use moro_core::job::{Attention, against};
    use moro_core::search::{Caps, Request, Space, search};
    let m = spec("google/gemma-3-4b-it");
    let flash = JobSettings {
        attention: Some(Attention::Flash),
        ..JobSettings::default()
    };
    let j = flash.resolve_for(&m).unwrap();
    let e = against::check(&j, &m, None).unwrap_err();
    assert_eq!(e.field, "attention");
    let gpu = moro_core::hardware::presets()
        .iter()
        .find(|p| p.id == "h100-sxm")
        .and_then(|p| p.to_device(None))
        .expect("h100-sxm");
    let caps = Caps::of_device(&gpu);
    let space = Space::new(&m, &Request::default(), &caps).expect("space");
    assert!(!space.attentions.contains(&Attention::Flash));
    let best = search(&m, &space, &caps).best.expect("fits an H100");
    assert_ne!(best.job.attention, Attention::Flash);
}

/// Gemma 3's pan-and-scan (`do_pan_and_scan=True`, the processor's defaults: crops of at
/// least 256 pixels, at most 4, from a 1.2 aspect ratio): the crops `Gemma3ImageProcessor`
/// makes (its `num_crops`, transformers 5.25), the tokens `Gemma3Processor` writes for them
/// (counted with Gemma 3's tokenizer: 798, 1,059 and 1,320 for 2, 3 and 4 crops, 260
/// without), and a tower pass per crop.
#[test]
fn pan_and_scan_crops_follow_the_processor() {
    let m = spec("google/gemma-3-4b-it");
    let v = m.vision.as_ref().unwrap();
    let images = |width, height| moro_core::vision::Images {
        per_sample: 1,
        width,
        height,
        pan_and_scan: true,
    };
    for (w, h, crops) in [
        (896, 896, 0),
        (1280, 720, 2),
        (2000, 500, 4),
        (1200, 1100, 0),
        (600, 1400, 2),
        (3000, 600, 4),
        (500, 300, 0),
        (1024, 768, 2),
    ] {
        assert_eq!(v.crops(&images(w, h)), crops, "{w}x{h}");
    }
    // The sequence's tokens beyond the prompt's one `<start_of_image>`.
    assert_eq!(v.added_tokens(&images(896, 896)), 260 - 1);
    assert_eq!(v.added_tokens(&images(1280, 720)), 798 - 1);
    assert_eq!(v.added_tokens(&images(1200, 400)), 1059 - 1);
    assert_eq!(v.added_tokens(&images(3000, 600)), 1320 - 1);
    // Off, as the processor has it by default: the image alone.
    let off = moro_core::vision::Images {
        pan_and_scan: false,
        ..images(3000, 600)
    };
    assert_eq!(v.added_tokens(&off), 259);
    // The crops go through the tower too: the estimate grows.
    let peak = |pan| {
        let (m, job) = job(
            "google/gemma-3-4b-it",
            JobSettings {
                method: Some(Method::Adapters),
                images_per_sample: Some(1),
                image_size: Some((3000, 600)),
                pan_and_scan: Some(pan),
                ..JobSettings::default()
            },
        );
        estimate(&m, &job, &DeviceProfile::default())
            .unwrap()
            .peak_allocated_bytes
    };
    assert!(peak(true) > peak(false));
    // A processor without it says so.
    let (qwen, qjob) = job(
        "Qwen/Qwen2.5-VL-3B-Instruct",
        JobSettings {
            pan_and_scan: Some(true),
            ..JobSettings::default()
        },
    );
    assert_eq!(
        qjob.validate(&qwen).unwrap_err().field,
        "training.pan_and_scan"
    );
}
