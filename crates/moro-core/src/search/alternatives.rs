//! What would fit when a job does not: a smaller model of the same family, a GPU with more
//! memory, or more GPUs of the same kind, each the best configuration the search finds there.
//!
//! Pure: the caller says how a device becomes [`Caps`] (its calibration profile lives at the
//! edge) and how many GPUs it already has.

use crate::catalog;
use crate::hardware::{Device, Vendor};
use crate::model::ModelSpec;

use super::{Candidate, Caps, Cluster, EstimateCache, Outcome, Request, Space};

/// GPUs per node when a GPU count alone is given (`16xh100-sxm`): the common 8-GPU server.
pub const DEFAULT_GPUS_PER_NODE: u64 = 8;

/// GPU counts `moro fit` and the "more GPUs" alternative try: up to a node of 8, then nodes
/// of 8.
pub const FIT_GPU_COUNTS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Exactly `gpus` GPUs, in nodes of [`DEFAULT_GPUS_PER_NODE`] above that, CPU offload
/// searched when `offload`; `None` for one GPU.
#[must_use]
pub fn exact_cluster(gpus: u64, offload: bool) -> Option<Cluster> {
    (gpus > 1).then(|| {
        let per = gpus.min(DEFAULT_GPUS_PER_NODE);
        Cluster {
            nodes: gpus.div_ceil(per),
            gpus_per_node: per,
            exact: true,
            offload,
        }
    })
}

/// Runs the search; `None` when the request is invalid for this model.
#[must_use]
pub fn run_search(spec: &ModelSpec, request: &Request, caps: &Caps) -> Option<Outcome> {
    let space = Space::new(spec, request, caps).ok()?;
    Some(super::search(spec, &space, caps))
}

/// The best configuration of `request` on `caps` ([`super::search_best`]: no runners-up);
/// `None` when nothing fits or the request is invalid for this model.
#[must_use]
pub fn best_of(spec: &ModelSpec, request: &Request, caps: &Caps) -> Option<Candidate> {
    let space = Space::new(spec, request, caps).ok()?;
    super::search_best(spec, &space, caps, None)
}

/// The best configuration of `request` on `caps`, or `None` at once when nothing can fit
/// (no closest configuration is looked for: `moro fit` only needs the ones that fit).
#[must_use]
pub fn best_fitting(
    spec: &ModelSpec,
    request: &Request,
    caps: &Caps,
    cache: &EstimateCache,
) -> Option<Candidate> {
    let space = Space::new(spec, request, caps).ok()?;
    if !super::can_fit_cached(spec, &space, caps, Some(cache)) {
        return None;
    }
    super::search_best(spec, &space, caps, Some(cache))
}

/// Catalog models of the same family as `model_id`/`spec` with fewer parameters, largest
/// first (ties: the nearest name). Family: the same organisation (id prefix) and the same
/// `model_type`.
#[must_use]
pub fn smaller_family_models(model_id: &str, spec: &ModelSpec) -> Vec<(&'static str, ModelSpec)> {
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
#[must_use]
pub fn nvidia_presets() -> Vec<(String, Device)> {
    let mut v: Vec<(String, Device)> = crate::hardware::presets()
        .iter()
        .filter(|p| p.vendor == Vendor::Nvidia)
        .filter_map(|p| p.to_device(None).map(|d| (p.id.clone(), d)))
        .collect();
    v.sort_by_key(|(_, d)| d.total_bytes);
    v
}

/// What would fit: each the best configuration found there.
#[derive(Debug, Default)]
pub struct Alternatives {
    /// The largest smaller catalog model of the same family that fits: its id, parameters
    /// and best configuration.
    pub smaller_model: Option<(&'static str, u64, Candidate)>,
    /// The smallest NVIDIA catalog GPU with more memory on which it fits: the preset id, its
    /// memory and the best configuration.
    pub larger_gpu: Option<(String, u64, Candidate)>,
    /// The fewest GPUs of this kind (from [`FIT_GPU_COUNTS`], more than the job has) on
    /// which it fits, and the best configuration there.
    pub more_gpus: Option<(u64, Candidate)>,
}

/// Looks for what would fit `request` for `model_id`/`spec`: a smaller model of the family
/// on `caps`, a GPU with more memory (`caps_of` turns a catalog device into its caps), more
/// GPUs of this kind than the `have_gpus` the job has.
#[must_use]
pub fn alternatives(
    model_id: &str,
    spec: &ModelSpec,
    request: &Request,
    have_gpus: u64,
    caps: &Caps,
    caps_of: &dyn Fn(&Device) -> Caps,
) -> Alternatives {
    let mut alt = Alternatives::default();
    for (id, s) in smaller_family_models(model_id, spec) {
        if let Some(best) = run_search(&s, request, caps).and_then(|o| o.best) {
            alt.smaller_model = Some((id, s.total_params(), best));
            break;
        }
    }
    for (id, d) in nvidia_presets() {
        if d.total_bytes <= caps.usable_bytes {
            continue;
        }
        if let Some(best) = run_search(spec, request, &caps_of(&d)).and_then(|o| o.best) {
            alt.larger_gpu = Some((id, d.total_bytes, best));
            break;
        }
    }
    for gpus in FIT_GPU_COUNTS.into_iter().filter(|g| *g > have_gpus) {
        let req = Request {
            cluster: exact_cluster(gpus, true),
            ..request.clone()
        };
        if let Some(best) = run_search(spec, &req, caps).and_then(|o| o.best) {
            alt.more_gpus = Some((gpus, best));
            break;
        }
    }
    alt
}

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
