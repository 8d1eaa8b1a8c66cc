//! Search runs, and what would fit when nothing does: a smaller model, more memory, more GPUs.

use moro_core::catalog;
use moro_core::hardware::{Device, Vendor};
use moro_core::model::ModelSpec;
use moro_core::search::{Caps, Outcome, Request, Space, search};
use serde::Serialize;

use super::target::{caps_of_device, exact_cluster, layout_of};
use super::text::describe;
use crate::hw::Target;
use crate::output::gib;

/// The "what would fit" lines of [`Alternatives`] (what `recipe generate` prints when nothing
/// fits, and `estimate` when the job does not).
pub(crate) fn alternatives_text(alt: &Alternatives) -> String {
    let mut s = String::from("what would fit:\n");
    let mut any = false;
    if let Some(m) = &alt.smaller_model {
        any = true;
        #[allow(clippy::cast_precision_loss)]
        let b = m.parameters as f64 / 1e9;
        s.push_str(&format!(
            "  a smaller model: {} ({b:.1}B), {}\n",
            m.id, m.configuration
        ));
    }
    if let Some(g) = &alt.larger_gpu {
        any = true;
        s.push_str(&format!(
            "  more memory: --hardware {} ({} GiB), {}\n",
            g.preset,
            gib(g.memory_bytes),
            g.configuration
        ));
    }
    if let Some(g) = &alt.more_gpus {
        any = true;
        s.push_str(&format!(
            "  more GPUs: {} × this GPU with {}, {}\n",
            g.gpus, g.strategy, g.configuration
        ));
    }
    if !any {
        s.push_str(
            "  nothing in the catalog: no smaller model of the family, GPU or GPU count up to 64\n",
        );
    }
    s
}

/// What would fit when nothing does.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Alternatives {
    /// The largest smaller catalog model of the same family (org and `model_type`) that fits.
    pub(crate) smaller_model: Option<AltModel>,
    /// The smallest catalog GPU with more memory on which it fits.
    pub(crate) larger_gpu: Option<AltGpu>,
    /// The fewest GPUs of this kind (2 to 64, nodes of 8, the strategy searched) on which
    /// it fits.
    pub(crate) more_gpus: Option<AltGpus>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AltModel {
    pub(crate) id: String,
    pub(crate) parameters: u64,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct AltGpu {
    pub(crate) preset: String,
    pub(crate) memory_bytes: u64,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct AltGpus {
    pub(crate) gpus: u64,
    pub(crate) strategy: String,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
}

/// Runs the search; `None` when the request is invalid for this model.
pub(crate) fn run_search(spec: &ModelSpec, request: &Request, caps: &Caps) -> Option<Outcome> {
    let space = Space::new(spec, request, caps).ok()?;
    Some(search(spec, &space, caps))
}

/// The best configuration of `request` on `caps`, or `None` at once when nothing can fit
/// (no closest configuration is looked for: `moro fit` only needs the ones that fit).
pub(crate) fn best_fitting(
    spec: &ModelSpec,
    request: &Request,
    caps: &Caps,
    cache: &moro_core::search::EstimateCache,
) -> Option<moro_core::search::Candidate> {
    let space = Space::new(spec, request, caps).ok()?;
    if !moro_core::search::can_fit_cached(spec, &space, caps, Some(cache)) {
        return None;
    }
    moro_core::search::search_cached(spec, &space, caps, Some(cache)).best
}

/// Catalog models of the same family as `model_id`/`spec` with fewer parameters, largest
/// first (ties: the nearest name). Family: the same organisation (id prefix) and the same
/// `model_type`.
pub(crate) fn smaller_family_models(
    model_id: &str,
    spec: &ModelSpec,
) -> Vec<(&'static str, ModelSpec)> {
    let org = model_id
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let params = spec.total_params();
    let mut out: Vec<(&'static str, ModelSpec)> = catalog::entries()
        .iter()
        .filter(|e| {
            e.id.split('/')
                .next()
                .unwrap_or_default()
                .eq_ignore_ascii_case(&org)
        })
        .filter_map(|e| catalog::load(e).ok().map(|s| (e.id, s)))
        .filter(|(_, s)| s.model_type == spec.model_type && s.total_params() < params)
        .collect();
    // Among equal sizes (Qwen2-7B and Qwen2.5-7B), the one whose name shares the longest
    // prefix with the model asked about: its own generation.
    let shared = |id: &str| {
        id.chars()
            .zip(model_id.chars())
            .take_while(|(a, b)| a.eq_ignore_ascii_case(b))
            .count()
    };
    out.sort_by_key(|(id, s)| {
        (
            std::cmp::Reverse(s.total_params()),
            std::cmp::Reverse(shared(id)),
        )
    });
    out
}

/// NVIDIA catalog GPUs (the estimator models CUDA) as devices, smallest memory first.
pub(crate) fn nvidia_presets() -> Vec<(String, Device)> {
    let mut v: Vec<(String, Device)> = moro_core::hardware::presets()
        .iter()
        .filter(|p| p.vendor == Vendor::Nvidia)
        .filter_map(|p| p.to_device(None).map(|d| (p.id.clone(), d)))
        .collect();
    v.sort_by_key(|(_, d)| d.total_bytes);
    v
}

/// Looks for what would fit: a smaller model of the family, a GPU with more memory, more
/// GPUs of this kind (2 to 64, the strategy searched).
pub(crate) fn alternatives(
    model_id: &str,
    spec: &ModelSpec,
    request: &Request,
    target: &Target,
    caps: &Caps,
) -> Alternatives {
    let mut alt = Alternatives::default();
    for (id, s) in smaller_family_models(model_id, spec) {
        if let Some(best) = run_search(&s, request, caps).and_then(|o| o.best) {
            alt.smaller_model = Some(AltModel {
                id: id.to_owned(),
                parameters: s.total_params(),
                configuration: describe(&best.job),
                peak_device_bytes: best.estimate.peak_device_bytes,
            });
            break;
        }
    }
    for (id, d) in nvidia_presets() {
        if d.total_bytes <= caps.usable_bytes {
            continue;
        }
        let c = caps_of_device(&d);
        if let Some(best) = run_search(spec, request, &c).and_then(|o| o.best) {
            alt.larger_gpu = Some(AltGpu {
                preset: id,
                memory_bytes: d.total_bytes,
                configuration: describe(&best.job),
                peak_device_bytes: best.estimate.peak_device_bytes,
            });
            break;
        }
    }
    let have = target.hardware.devices.len() as u64;
    for gpus in FIT_GPU_COUNTS.into_iter().filter(|g| *g > have) {
        let req = Request {
            cluster: exact_cluster(gpus, true),
            ..request.clone()
        };
        if let Some(best) = run_search(spec, &req, caps).and_then(|o| o.best) {
            alt.more_gpus = Some(AltGpus {
                gpus,
                strategy: layout_of(&best.job).strategy_text(),
                configuration: describe(&best.job),
                peak_device_bytes: best.estimate.peak_device_bytes,
            });
            break;
        }
    }
    alt
}

/// GPU counts `moro fit` and the "more GPUs" alternative try: up to a node of 8, then nodes
/// of 8.
pub(crate) const FIT_GPU_COUNTS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_family_is_same_org_and_type() {
        let e = catalog::find("Qwen/Qwen2.5-72B").unwrap();
        let spec = catalog::load(e).unwrap();
        let v = smaller_family_models(e.id, &spec);
        assert!(!v.is_empty());
        assert!(
            v.iter()
                .all(|(id, s)| id.starts_with("Qwen/") && s.model_type == "qwen2")
        );
        assert!(
            v.windows(2)
                .all(|w| w[0].1.total_params() >= w[1].1.total_params())
        );
        assert_eq!(v[0].0, "Qwen/Qwen2.5-32B");
    }
}
