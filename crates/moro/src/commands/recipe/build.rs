//! The moro.yaml of a search winner: [`build_recipe`] and its `prediction:` section.

use moro_core::estimate::Estimate;
use moro_core::search::Candidate;
use moro_recipe::{Components, HardwareSection, PredictionSection, Recipe, TrainingExtras};

use super::target::preset_of;
use crate::hw::Target;

/// The moro.yaml of a search winner, with `hardware:` and `prediction:` filled in.
pub(crate) fn build_recipe(
    model_id: &str,
    target: &Target,
    cand: &Candidate,
    usable_bytes: u64,
) -> Recipe {
    let name = format!(
        "{} {}",
        model_id.rsplit('/').next().unwrap_or(model_id),
        cand.job.method.as_str()
    );
    // Generated recipes turn on the 5-level out-of-memory recovery of `moro run`, as the
    // product's moro.yaml does (`auto_heal: true`).
    let extras = TrainingExtras {
        auto_heal: true,
        ..TrainingExtras::default()
    };
    let mut recipe = Recipe::from_job(name, model_id, &cand.job, extras);
    let first = target.hardware.devices.first();
    recipe.hardware = Some(HardwareSection {
        name: first.map(|d| d.name.clone()),
        preset: preset_of(target),
        memory_bytes: target.memory_bytes(),
        count: target.hardware.devices.len().max(1) as u64,
        detected: target.detected,
        // A preset says its maker; an Apple GPU named by its memory needs saying.
        device: first
            .filter(|d| {
                d.vendor == moro_core::hardware::Vendor::Apple && preset_of(target).is_none()
            })
            .map(|_| moro_recipe::choices::Backend::Mps),
    });
    recipe.prediction = Some(prediction_section(
        &cand.estimate,
        cand.margin_bytes,
        usable_bytes,
    ));
    recipe
}

fn prediction_section(est: &Estimate, margin: u64, usable: u64) -> PredictionSection {
    PredictionSection {
        peak_allocated_bytes: est.peak_allocated_bytes,
        peak_reserved_bytes: est.peak_reserved_bytes,
        peak_device_bytes: est.peak_device_bytes,
        phase: Some(est.peak_phase.as_str().to_owned()),
        components: est
            .components
            .iter()
            .map(|(c, b)| (c.as_str(), *b))
            .collect::<Components>(),
        headroom_bytes: Some(headroom(usable, est.peak_device_bytes, margin)),
        margin_bytes: Some(margin),
        memory_bytes: Some(usable),
    }
}

/// usable − margin − peak, saturating into i64.
pub(super) fn headroom(usable: u64, peak: u64, margin: u64) -> i64 {
    let h = i128::from(usable) - i128::from(peak) - i128::from(margin);
    i64::try_from(h).unwrap_or(if h < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use moro_core::catalog;
    use moro_core::estimate::estimate;
    use moro_core::job::Method;
    use moro_core::search::{MethodChoice, Request, margin_bytes};

    use super::super::alternatives::run_search;
    use super::super::loaded::LoadedRecipe;
    use super::super::target::tests::target_of;
    use super::super::target::{caps_of, resolve_target};

    /// generate → YAML → check → estimate for every catalog model on five presets: the job
    /// read back from the text is the searched job, and it predicts the same bytes with the
    /// profile rebuilt from the recipe's `hardware:` section.
    #[test]
    fn every_catalog_model_round_trips_on_five_presets() {
        let presets = [
            "rtx-3060-12gb",
            "rtx-4090",
            "a100-sxm4-80gb",
            "h100-sxm",
            "apple-m3-max-64gb",
            "t4",
        ];
        let mut written = 0;
        let mut nothing = 0;
        for entry in catalog::entries() {
            let spec = catalog::load(entry).unwrap();
            for hw in presets {
                let target = target_of(hw);
                let caps = caps_of(&target).unwrap();
                let request = Request {
                    // Within the learned positions of every catalog model (BERT: 512).
                    seq_len: Some(if spec.position_embeddings > 0 {
                        spec.position_embeddings.min(1024)
                    } else {
                        1024
                    }),
                    ..Request::default()
                };
                let Some(outcome) = run_search(&spec, &request, &caps) else {
                    // A bitsandbytes checkpoint cannot load without bitsandbytes (Apple).
                    if spec.prequantized.is_some() && !caps.bitsandbytes {
                        continue;
                    }
                    panic!("{} on {hw}: request rejected", entry.id)
                };
                let Some(best) = outcome.best else {
                    nothing += 1;
                    assert!(outcome.closest.is_some(), "{} on {hw}", entry.id);
                    continue;
                };
                let recipe = build_recipe(entry.id, &target, &best, caps.usable_bytes);
                let text = moro_recipe::to_yaml(&recipe, "test");
                assert!(text.starts_with(moro_recipe::SCHEMA_LINE));
                let back = moro_recipe::parse(&text)
                    .unwrap_or_else(|e| panic!("{} on {hw}: {e}\n{text}", entry.id));
                let loaded = LoadedRecipe {
                    path: "moro.yaml".into(),
                    text: text.clone(),
                    settings: back.settings().unwrap(),
                    recipe: back,
                };
                let job = loaded.settings.resolve().unwrap();
                assert_eq!(job, best.job, "{} on {hw}", entry.id);
                // The profile and memory come back from the hardware section alone.
                let t2 = loaded.target().expect("hardware section");
                let caps2 = caps_of(&t2).unwrap();
                assert_eq!(caps2.profile, caps.profile, "{} on {hw}", entry.id);
                assert_eq!(loaded.usable_bytes(), Some(caps.usable_bytes));
                let est = estimate(&spec, &job, &caps2.profile).unwrap();
                assert_eq!(
                    est.peak_device_bytes, best.estimate.peak_device_bytes,
                    "{} on {hw}",
                    entry.id
                );
                let p = loaded.recipe.prediction.as_ref().unwrap();
                assert_eq!(p.peak_device_bytes, est.peak_device_bytes);
                assert_eq!(p.peak_allocated_bytes, est.peak_allocated_bytes);
                // check's verdict: fits with the margin.
                let margin = margin_bytes(&est, &job);
                assert!(
                    est.peak_device_bytes + margin <= caps2.usable_bytes.min(caps.usable_bytes)
                );
                written += 1;
            }
        }
        assert!(
            written > catalog::entries().len() * 3,
            "{written} written, {nothing} nothing fits"
        );
    }

    /// Multi-GPU winners round-trip through moro.yaml too: `parallel:` carries the count,
    /// strategy and offload, and the job read back predicts the same bytes.
    #[test]
    fn multi_gpu_recipes_round_trip() {
        let cases = [
            ("Qwen/Qwen2.5-7B", "8xa100-sxm4-80gb", Method::Full),
            (
                "meta-llama/Llama-3.1-70B-Instruct",
                "8xh100-sxm",
                Method::Full,
            ),
            (
                "meta-llama/Llama-3.1-70B-Instruct",
                "2x8xh100-sxm",
                Method::Full,
            ),
            ("Qwen/Qwen2.5-32B", "4xrtx-4090", Method::Adapters),
            ("Qwen/Qwen2.5-1.5B", "2xa100-sxm4-80gb", Method::Full),
        ];
        for (id, hw, method) in cases {
            let spec = catalog::load(catalog::find(id).unwrap()).unwrap();
            let (target, cluster) = resolve_target(hw).unwrap();
            assert!(cluster.is_some(), "{hw}");
            let caps = caps_of(&target).unwrap();
            let request = Request {
                method: MethodChoice::Only(method),
                seq_len: Some(2048),
                cluster,
                ..Request::default()
            };
            let best = super::super::alternatives::best_of(&spec, &request, &caps)
                .unwrap_or_else(|| panic!("{id} on {hw}: nothing fits"));
            let recipe = build_recipe(id, &target, &best, caps.usable_bytes);
            let text = moro_recipe::to_yaml(&recipe, "test");
            let back = moro_recipe::parse(&text).unwrap();
            let job = back.to_job().unwrap();
            assert_eq!(job, best.job, "{id} on {hw}");
            if best.job.parallel.gpus() > 1 {
                assert!(text.contains("\nparallel:\n"), "{text}");
            }
            let est = estimate(&spec, &job, &caps.profile).unwrap();
            assert_eq!(est.peak_device_bytes, best.estimate.peak_device_bytes);
            let loaded = LoadedRecipe {
                path: "moro.yaml".into(),
                text,
                settings: back.settings().unwrap(),
                recipe: back,
            };
            let t2 = loaded.target().unwrap();
            assert_eq!(
                t2.hardware.devices.len(),
                target.hardware.devices.len(),
                "{hw}"
            );
        }
    }
}
