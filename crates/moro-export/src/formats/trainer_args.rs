//! Settings every transformers-Trainer-based format shares, and the warnings about them.

use moro_core::job::{Liger, LossImpl};
use moro_recipe::choices::{LrScheduler, Method, Quantization, Stack};

use super::*;
use crate::plan::{DS_CONFIG_NAME, Dist, Plan};
use crate::value::Map;

/// Learning rate when the recipe has none.
/// The stacks the HF Trainer's family (the Trainer, TRL, axolotl, LLaMA-Factory) runs as
/// moro models them.
pub(super) const HF_STACKS: &[Stack] = &[Stack::Hf, Stack::Trl];

pub(super) const fn default_lr(method: Method) -> f64 {
    match method {
        Method::Full => 1e-5,
        _ => 2e-4,
    }
}

pub(super) fn lr_scheduler(p: &Plan<'_>) -> &'static str {
    p.t.lr_scheduler.map_or("cosine", LrScheduler::as_str)
}

pub(super) fn epochs(p: &Plan<'_>) -> f64 {
    p.t.num_epochs.unwrap_or(1.0)
}

/// HF TrainingArguments fields shared by the HF, TRL, Unsloth and LLaMA-Factory exports.
pub(super) fn hf_training_args(p: &Plan<'_>, m: &mut Map, warnings: &mut Vec<String>) {
    m.set("output_dir", &p.output_dir);
    m.set("per_device_train_batch_size", p.t.micro_batch_size);
    m.set(
        "gradient_accumulation_steps",
        p.t.gradient_accumulation_steps,
    );
    m.set("num_train_epochs", epochs(p));
    m.set(
        "learning_rate",
        p.t.learning_rate.unwrap_or_else(|| default_lr(p.method)),
    );
    m.set("lr_scheduler_type", lr_scheduler(p));
    m.set_opt("warmup_steps", p.warmup_steps());
    if p.t.warmup_ratio == Some(1.0) {
        warnings.push(
            "training.warmup_ratio = 1: transformers reads warmup_steps ≥ 1 as a step count; not exported"
                .to_owned(),
        );
    }
    m.set_opt("weight_decay", p.t.weight_decay);
    let (optim, optim_args) = p.hf_optim();
    m.set("optim", optim);
    m.set_opt("optim_args", optim_args);
    let (bf16, fp16) = p.amp();
    m.set("bf16", bf16);
    m.set("fp16", fp16);
    m.set("gradient_checkpointing", p.checkpointing);
    if p.checkpointing {
        let mut k = Map::new();
        k.set("use_reentrant", false);
        m.set("gradient_checkpointing_kwargs", k);
    }
    let liger = p.liger_kernels();
    if liger.any() {
        m.set("use_liger_kernel", true);
        if liger != Liger::ALL {
            m.set("liger_kernel_config", liger_kernel_config(liger));
        }
    }
    if p.compile {
        // transformers `Trainer._wrap_model`: `torch.compile(model)` with the default backend.
        m.set("torch_compile", true);
    }
    if matches!(p.dist, Dist::Zero { .. }) {
        m.set("deepspeed", DS_CONFIG_NAME);
    }
    m.set("logging_steps", LOGGING_STEPS);
    m.set("save_strategy", "epoch");
    m.set("report_to", "none");
}

/// The loss a transformers-Trainer-based format computes, with a warning when the recipe
/// asked for one it cannot express.
pub(super) fn hf_loss_warning(p: &Plan<'_>, trainer: &str, warnings: &mut Vec<String>) {
    match p.loss {
        LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast | LossImpl::Fused => {}
        LossImpl::ChunkedNll => warnings.push(format!(
            "training.loss = chunked-nll (TRL's chunked loss): {trainer} computes the full-logits loss, \
             which needs more memory than predicted"
        )),
        LossImpl::Chunked => warnings.push(format!(
            "training.loss = chunked (litgpt/torchtune): {trainer} computes the full-logits loss, which \
             needs more memory than predicted"
        )),
    }
}

/// A warning when the recipe was planned on a stack other than `own`, the trainer's.
pub(super) fn stack_warning(
    p: &Plan<'_>,
    trainer: &str,
    own: &[Stack],
    warnings: &mut Vec<String>,
) {
    if !own.contains(&p.t.stack) {
        warnings.push(format!(
            "training.stack = {}: the recipe was planned for another training stack; {trainer} allocates differently",
            p.t.stack
        ));
    }
}

pub(super) fn quant_gptq_note(p: &Plan<'_>, trainer: &str, warnings: &mut Vec<String>) {
    if p.quant == Quantization::GptqInt4 {
        warnings.push(format!(
            "model.quantization = gptq-int4: {trainer} reads the GPTQ settings from the checkpoint's \
             quantization_config; model.base must be a GPTQ checkpoint"
        ));
    }
}

/// `TrainingArguments.liger_kernel_config`: the keywords `_apply_liger_kernel_to_instance`
/// passes to the model's `apply_liger_kernel_to_*`, which keeps those its signature has
/// (liger-kernel 0.8.5 `monkey_patch.py`): `swiglu` for SwiGLU models, `geglu` for Gemma's.
fn liger_kernel_config(liger: Liger) -> Map {
    let mut k = Map::new();
    k.set("rope", liger.rope);
    k.set("rms_norm", liger.rms_norm);
    k.set("swiglu", liger.glu);
    k.set("geglu", liger.glu);
    k.set("cross_entropy", false);
    k.set(
        "fused_linear_cross_entropy",
        liger.fused_linear_cross_entropy,
    );
    k
}
