//! Search runs, and what would fit when nothing does: a smaller model, more memory, more GPUs.

use moro_core::model::ModelSpec;
use moro_core::search::alternatives::alternatives as core_alternatives;
pub(crate) use moro_core::search::alternatives::{
    FIT_GPU_COUNTS, best_fitting, best_of, run_search,
};
use moro_core::search::{Caps, Request};
use serde::Serialize;

use super::target::{caps_of_device, layout_of};
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

/// Looks for what would fit ([`moro_core::search::alternatives::alternatives`], with this
/// machine's calibration profile on each catalog GPU) and describes each configuration.
pub(crate) fn alternatives(
    model_id: &str,
    spec: &ModelSpec,
    request: &Request,
    target: &Target,
    caps: &Caps,
) -> Alternatives {
    // The job's own GPUs count too: `--gpus 2 --memory 24GiB` names one device of two.
    let have = (target.hardware.devices.len() as u64).max(request.parallel.gpus());
    let found = core_alternatives(model_id, spec, request, have, caps, &caps_of_device);
    Alternatives {
        smaller_model: found.smaller_model.map(|(id, parameters, best)| AltModel {
            id: id.to_owned(),
            parameters,
            configuration: describe(&best.job),
            peak_device_bytes: best.estimate.peak_device_bytes,
        }),
        larger_gpu: found.larger_gpu.map(|(preset, memory_bytes, best)| AltGpu {
            preset,
            memory_bytes,
            configuration: describe(&best.job),
            peak_device_bytes: best.estimate.peak_device_bytes,
        }),
        more_gpus: found.more_gpus.map(|(gpus, best)| AltGpus {
            gpus,
            strategy: layout_of(&best.job).strategy_text(),
            configuration: describe(&best.job),
            peak_device_bytes: best.estimate.peak_device_bytes,
        }),
    }
}
