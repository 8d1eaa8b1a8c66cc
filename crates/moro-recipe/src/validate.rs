//! Value checks on a [`Recipe`] that the types alone cannot express: ranges, finiteness,
//! and fields that must agree with each other.
//!
//! Checks that need the model (a LoRA rank above the hidden size, a target module the model
//! does not have) are the engine's ([`moro_core::job::Job::validate`]); map its errors back to
//! the file with [`crate::job_error`].

use moro_core::hardware::{HardwareSpec, HwError, parse_hardware_spec};
use moro_core::job::{MAX_BATCH, MAX_SEQ_LEN};

use crate::choices::{Method, Offload, Quantization};
use crate::error::RecipeError;
use crate::recipe::{Recipe, TargetModules};

/// Largest gradient accumulation accepted (the engine's bound).
pub const MAX_GRAD_ACCUM: u64 = 1 << 20;
/// Largest LoRA rank accepted before the model is known.
pub const MAX_LORA_RANK: u64 = 1 << 16;
/// Largest number of GPUs (and tensor / pipeline degree).
pub const MAX_GPUS: u64 = 1 << 16;

fn range(field: &str, v: u64, max: u64, unit: &str) -> Result<(), RecipeError> {
    if v == 0 || v > max {
        return Err(RecipeError::value(
            field,
            format!("must be between 1 and {max}{unit}, got {v}"),
        ));
    }
    Ok(())
}

fn finite(
    field: &str,
    v: Option<f64>,
    ok: impl Fn(f64) -> bool,
    what: &str,
) -> Result<(), RecipeError> {
    match v {
        Some(x) if !x.is_finite() || !ok(x) => Err(RecipeError::value(
            field,
            format!("must be {what}, got {x}"),
        )),
        _ => Ok(()),
    }
}

impl Recipe {
    /// Checks every value that can be checked without the model.
    ///
    /// # Errors
    /// The first invalid field, named by its dotted path (no position: [`crate::parse`] adds
    /// one).
    pub fn validate(&self) -> Result<(), RecipeError> {
        let m = &self.model;
        if m.base.trim().is_empty() {
            return Err(RecipeError::value(
                "model.base",
                "is empty; name a model id or a path",
            ));
        }
        if let Some(r) = m.lora_rank {
            range("model.lora_rank", r, MAX_LORA_RANK, "")?;
        }
        finite(
            "model.lora_alpha",
            m.lora_alpha,
            |x| x > 0.0,
            "a positive number",
        )?;
        finite(
            "model.lora_dropout",
            m.lora_dropout,
            |x| (0.0..1.0).contains(&x),
            "in [0, 1)",
        )?;
        if let Some(TargetModules::Names(names)) = &m.target_modules {
            if names.is_empty() {
                return Err(RecipeError::value(
                    "model.target_modules",
                    "is empty; list module names or write `all-linear`",
                ));
            }
            for (i, n) in names.iter().enumerate() {
                if n.trim().is_empty() {
                    return Err(RecipeError::value(
                        format!("model.target_modules[{i}]"),
                        "is an empty module name",
                    ));
                }
                if names[..i].contains(n) {
                    return Err(RecipeError::value(
                        format!("model.target_modules[{i}]"),
                        format!("`{n}` is listed twice"),
                    ));
                }
            }
        }
        let method = m.effective_method();
        let quant = m.effective_quantization();
        match method {
            Method::Full if quant != Quantization::None => {
                return Err(RecipeError::value(
                    "model.quantization",
                    format!(
                        "`{quant}` with method `full`: a full fine-tune cannot train quantized \
                         weights; use method `qlora` or quantization `none`"
                    ),
                ));
            }
            Method::Qlora if quant == Quantization::None => {
                return Err(RecipeError::value(
                    "model.quantization",
                    "method `qlora` needs a quantized base (nf4, nf4-dq, fp4, fp4-dq, int8, \
                     gptq-int4)",
                ));
            }
            _ => {}
        }

        let t = &self.training;
        range(
            "training.micro_batch_size",
            t.micro_batch_size,
            MAX_BATCH,
            "",
        )?;
        range(
            "training.gradient_accumulation_steps",
            t.gradient_accumulation_steps,
            MAX_GRAD_ACCUM,
            "",
        )?;
        range(
            "training.max_seq_length",
            t.max_seq_length,
            MAX_SEQ_LEN,
            " tokens",
        )?;
        finite(
            "training.learning_rate",
            t.learning_rate,
            |x| x > 0.0 && x <= 10.0,
            "in (0, 10]",
        )?;
        finite(
            "training.num_epochs",
            t.num_epochs,
            |x| x > 0.0 && x <= 1e6,
            "in (0, 1000000]",
        )?;
        finite(
            "training.warmup_ratio",
            t.warmup_ratio,
            |x| (0.0..=1.0).contains(&x),
            "in [0, 1]",
        )?;
        finite(
            "training.weight_decay",
            t.weight_decay,
            |x| (0.0..=10.0).contains(&x),
            "in [0, 10]",
        )?;
        for (field, v) in [
            ("training.dataset", &t.dataset),
            ("training.output_dir", &t.output_dir),
        ] {
            if v.as_deref().is_some_and(|s| s.trim().is_empty()) {
                return Err(RecipeError::value(
                    field,
                    "is empty; remove the key or give a value",
                ));
            }
        }

        if let Some(v) = &t.versions {
            v.to_versions()?;
        }
        if let Some(p) = &self.parallel {
            if let Some(g) = p.gpus {
                range("parallel.gpus", g, MAX_GPUS, "")?;
            }
            range("parallel.tensor_parallel", p.tensor_parallel, MAX_GPUS, "")?;
            range(
                "parallel.pipeline_parallel",
                p.pipeline_parallel,
                MAX_GPUS,
                "",
            )?;
            range("parallel.nodes", p.nodes, MAX_GPUS, "")?;
            if let Some(b) = p.reduce_bucket_size {
                range("parallel.reduce_bucket_size", b, 1 << 34, " elements")?;
            }
            let model_parallel = p.tensor_parallel * p.pipeline_parallel;
            let gpus = p.gpus.unwrap_or(model_parallel);
            if p.gpus.is_some() && !gpus.is_multiple_of(p.nodes) {
                return Err(RecipeError::value(
                    "parallel.nodes",
                    format!(
                        "{gpus} GPUs cannot be spread evenly over {} nodes; nodes must divide gpus",
                        p.nodes
                    ),
                ));
            }
            if !gpus.is_multiple_of(model_parallel) {
                return Err(RecipeError::value(
                    "parallel.gpus",
                    format!(
                        "{gpus} GPUs cannot be split into groups of tensor_parallel × \
                         pipeline_parallel = {model_parallel}"
                    ),
                ));
            }
            if let Some(v) = p.fsdp_version {
                if moro_core::job::FsdpApi::from_version(v).is_none() {
                    return Err(RecipeError::value(
                        "parallel.fsdp_version",
                        format!("must be 1 or 2 (accelerate's fsdp_version), got {v}"),
                    ));
                }
                if !moro_core::job::Sharding::from(p.strategy).is_fsdp() {
                    return Err(RecipeError::value(
                        "parallel.fsdp_version",
                        format!(
                            "applies to the FSDP strategies, not `{}`: drop it or choose \
                             fsdp_full_shard",
                            p.strategy
                        ),
                    ));
                }
            }
            if p.offload == Offload::OptimizerAndParams && !p.strategy.shards_params() {
                return Err(RecipeError::value(
                    "parallel.offload",
                    format!(
                        "`optimizer_and_params` needs sharded parameters (zero3, \
                         fsdp_full_shard or fsdp_hybrid_shard), not `{}`",
                        p.strategy
                    ),
                ));
            }
        }
        if let Some(h) = &self.hardware {
            if h.memory_bytes == Some(0) {
                return Err(RecipeError::value(
                    "hardware.memory_bytes",
                    "must be above 0",
                ));
            }
            range("hardware.count", h.count, MAX_GPUS, "")?;
            if let Some(p) = &h.preset {
                preset(p)?;
            }
        }
        if let Some(d) = &self.data {
            if !(d.percentile > 0.0 && d.percentile <= 100.0) {
                return Err(RecipeError::value(
                    "data.percentile",
                    format!(
                        "{} is not a percentage above 0 and at most 100",
                        d.percentile
                    ),
                ));
            }
            if d.path.trim().is_empty() {
                return Err(RecipeError::value("data.path", "is empty"));
            }
        }
        Ok(())
    }
}

/// `hardware.preset` names one GPU of the catalog (an id or a name it knows).
fn preset(p: &str) -> Result<(), RecipeError> {
    let message = match parse_hardware_spec(p) {
        Ok(HardwareSpec::Given(h)) if h.devices.len() == 1 => return Ok(()),
        Ok(_) => format!("`{p}` is not one GPU preset; name one such as `rtx-4090`"),
        Err(HwError::Unknown { nearest, .. }) => format!(
            "unknown GPU preset `{p}`; nearest presets: {}",
            nearest.join(", ")
        ),
        Err(HwError::Ambiguous { candidates, .. }) => format!(
            "`{p}` matches several presets ({}); name one",
            candidates.join(", ")
        ),
        Err(HwError::Invalid(m)) => m,
    };
    Err(RecipeError::value("hardware.preset", message))
}
