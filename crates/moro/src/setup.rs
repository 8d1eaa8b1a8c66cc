//! One job, resolved once: flags, a moro.yaml, the hardware and this machine's calibration
//! profile and corrections become one [`JobSetup`] before a command runs.
//!
//! The order (ripgrep's two phases: raw arguments first, then one resolution):
//!
//! 1. the recipe's [`JobSettings`], with the flags' layered over them;
//! 2. the hardware: `--hardware`/`--memory`, else the recipe's `hardware:` section; a count
//!    there (`8xh100-sxm`) is the GPU count when neither `--gpus` nor `parallel.gpus` says;
//! 3. [`JobSettings::resolve`]: every unsaid setting at its one default;
//! 4. the model, the job checked against it, its LoRA targets bound;
//! 5. the device profile: the GPU's, then this machine's calibration profile and
//!    `corrections.json` ([`machine_profile`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use anyhow::Result;
use moro_core::estimate::{DeviceProfile, Estimate};
use moro_core::hardware::Device;
use moro_core::job::{Job, JobSettings};

use crate::commands::recipe::LoadedRecipe;
use crate::error::user;
use crate::hw::Target;
use crate::resolve::{self, HubArgs, Resolved};

/// A job resolved for a command.
#[derive(Debug, Clone)]
pub(crate) struct JobSetup {
    /// The model.
    pub(crate) model: Resolved,
    /// The job: defaults applied once, checked against the model, LoRA targets bound.
    pub(crate) job: Job,
    /// The hardware it is judged against, when one was named.
    pub(crate) target: Option<Target>,
    /// The estimator's device profile, with this machine's calibration and corrections.
    pub(crate) profile: DeviceProfile,
    /// What the profile folded in (or could not read), for the command to print its way.
    pub(crate) notes: Option<String>,
}

/// What a command was given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobInputs<'a> {
    /// A recipe, when one was named.
    pub(crate) recipe: Option<&'a LoadedRecipe>,
    /// `--model`, over the recipe's `model.base`.
    pub(crate) model: Option<&'a str>,
    /// The job flags' settings, over the recipe's.
    pub(crate) flags: &'a JobSettings,
    /// The hardware named on the command line, over the recipe's `hardware:` section.
    pub(crate) target: Option<&'a Target>,
    /// Hub options.
    pub(crate) hub: &'a HubArgs,
}

impl JobInputs<'_> {
    /// The hardware: the command line's, else the recipe's.
    fn target(&self) -> Option<Target> {
        self.target
            .cloned()
            .or_else(|| self.recipe.and_then(LoadedRecipe::target))
    }

    /// The settings of flags over recipe, with the GPU count of the hardware when neither
    /// says one.
    fn settings(&self, target: Option<&Target>) -> JobSettings {
        let recipe = self.recipe.map(|r| r.settings.clone()).unwrap_or_default();
        let mut s = self.flags.clone().or(recipe);
        if s.gpus.is_none()
            && let Some(t) = target
        {
            let n = t.hardware.devices.len() as u64;
            if n > 1 {
                s.gpus = Some(n);
            }
        }
        s
    }
}

/// Resolves the inputs into one job (see the module docs for the order).
pub(crate) fn resolve(inputs: JobInputs<'_>) -> Result<JobSetup> {
    let from_recipe = inputs.recipe.map(|r| r.recipe.model.base.as_str());
    let Some(model_arg) = inputs.model.or(from_recipe) else {
        return Err(crate::error::user_hint(
            "`--model` is required",
            "e.g. `moro estimate --model Qwen/Qwen2.5-7B --method qlora --seq-len 2048`",
        ));
    };
    let model = match (inputs.model, inputs.recipe) {
        (None, Some(r)) => resolve::model_with(model_arg, inputs.hub)
            .map_err(|e| user(format!("{}: field `model.base`: {e}", r.path)))?,
        _ => resolve::model_with(model_arg, inputs.hub)?,
    };
    inputs
        .flags
        .check_used()
        .map_err(|e| crate::error::job(&e))?;
    let target = inputs.target();
    let settings = inputs.settings(target.as_ref());
    let job_error = |e: &moro_core::job::JobError| match inputs.recipe {
        Some(r) => r.job_error(e),
        None => crate::error::job(e),
    };
    let job = settings
        .resolve_for(&model.spec)
        .map_err(|e| job_error(&e))?;
    job.validate(&model.spec).map_err(|e| job_error(&e))?;
    let device = target.as_ref().and_then(|t| t.hardware.devices.first());
    let mut warnings =
        moro_core::job::against::check(&job, &model.spec, device).map_err(|e| job_error(&e))?;
    if let Some(requested) = &settings.target_modules
        && job.method.is_peft()
    {
        for name in moro_core::targets::output_layer_requests(requested) {
            warnings.push(format!(
                "target_modules `{name}`: LoRA on the output layer is not modelled, so the \
                 estimate leaves it out and is low by its r·(hidden + vocabulary) parameters \
                 with their gradients and optimizer states, and by the adapter's \
                 vocabulary-wide output per token"
            ));
        }
    }
    let (profile, profile_notes) = machine_profile(device);
    let warnings = warnings.into_iter().map(|w| format!("warning: {w}"));
    let notes: Vec<String> = warnings.chain(profile_notes).collect();
    let notes = (!notes.is_empty()).then(|| notes.join("\n"));
    Ok(JobSetup {
        model,
        job,
        target,
        profile,
        notes,
    })
}

impl JobSetup {
    /// The same job on `stack`: every setting as resolved here, only the stack changed (what
    /// an export to that stack's trainer writes), checked against the model again.
    pub(crate) fn on_stack(&self, stack: moro_core::job::Stack) -> Result<JobSetup> {
        let settings = JobSettings {
            stack: Some(stack),
            ..JobSettings::said_in_full(&self.job)
        };
        let job = settings
            .resolve_for(&self.model.spec)
            .map_err(|e| crate::error::job(&e))?;
        job.validate(&self.model.spec)
            .map_err(|e| crate::error::job(&e))?;
        Ok(JobSetup {
            job,
            ..self.clone()
        })
    }

    /// The estimate of the job, with the checkpoint's exact stored weights when they were
    /// read.
    pub(crate) fn estimate(&self) -> Result<Estimate> {
        let est = moro_core::estimate::estimate(&self.model.spec, &self.job, &self.profile)
            .map_err(|e| user(e.to_string()))?;
        Ok(resolve::apply_stored(
            &self.model,
            &self.job,
            &self.profile,
            est,
        ))
    }
}

/// The estimator's device profile for `device` (the defaults of its compute capability;
/// none: a generic CUDA GPU), with this machine's calibration profile and corrections
/// (`moro calibrate`, `moro run`) for that GPU folded in, and the note saying so.
///
/// The config directory is read once per GPU name and process: `fit` and `tiers` search
/// every catalog GPU many times.
pub(crate) fn machine_profile(device: Option<&Device>) -> (DeviceProfile, Option<String>) {
    type Seen = HashMap<(Option<String>, Option<(u32, u32)>), (DeviceProfile, Option<String>)>;
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let key = (
        device.map(|d| d.name.clone()),
        device.and_then(|d| d.compute_capability),
    );
    let seen = SEEN.get_or_init(Mutex::default);
    if let Some(hit) = seen.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return hit;
    }
    let mut profile = device.map_or_else(
        || DeviceProfile::for_compute_capability(None),
        DeviceProfile::for_device,
    );
    let notes = crate::profile::apply(&mut profile, key.0.as_deref());
    if let Ok(mut m) = seen.lock() {
        m.insert(key, (profile.clone(), notes.clone()));
    }
    (profile, notes)
}
