//! [`Recipe`] ⇄ [`Job`]: the file's view and the engine's view of the same run.
//!
//! [`Recipe::settings`] is what the file says, for the CLI to layer its flags over and resolve
//! once; [`Recipe::to_job`] resolves it alone. [`Recipe::from_job`] writes every engine
//! setting explicitly (so a generated moro.yaml does not depend on defaults that may change),
//! plus the [`TrainingExtras`] the engine does not use. Job → Recipe → Job is the identity,
//! except for longest-first padding (lit-gpt's 2023 scripts, measured rows only), which comes
//! back as padded.

use moro_core::job::{Job, JobError, JobSettings, Liger, Padding, Parallel, PeftKind};

use crate::choices::{LrScheduler, Method};
use crate::error::RecipeError;
use crate::recipe::{
    LayerCount, LibraryVersions, ModelSection, ParallelSection, Recipe, TrainingSection,
};

/// Training settings that do not change memory but belong in a recipe (for exports and
/// `moro run`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainingExtras {
    /// The recipe's version (`version:`).
    pub version: Option<String>,
    /// `training.auto_heal`.
    pub auto_heal: bool,
    /// `training.learning_rate`.
    pub learning_rate: Option<f64>,
    /// `training.num_epochs`.
    pub num_epochs: Option<f64>,
    /// `training.warmup_ratio`.
    pub warmup_ratio: Option<f64>,
    /// `training.weight_decay`.
    pub weight_decay: Option<f64>,
    /// `training.lr_scheduler`.
    pub lr_scheduler: Option<LrScheduler>,
    /// `training.dataset`.
    pub dataset: Option<String>,
    /// `training.output_dir`.
    pub output_dir: Option<String>,
}

impl Recipe {
    /// A recipe for `base_model_id` with every engine setting of `job` written out.
    ///
    /// LoRA fields are written for LoRA/QLoRA jobs, and for other methods only when they differ
    /// from the defaults (so the round trip keeps them). `parallel:` is written only for more
    /// than one GPU or a non-default layout. `hardware:` and `prediction:` are left empty for the
    /// caller to fill.
    #[must_use]
    pub fn from_job(
        name: impl Into<String>,
        base_model_id: impl Into<String>,
        job: &Job,
        extras: TrainingExtras,
    ) -> Self {
        let lora = &job.adapter;
        let write_lora = job.method.is_peft();
        let peft = job.method.is_peft() && job.adapter.method != PeftKind::Lora;
        let model = ModelSection {
            base: base_model_id.into(),
            method: Some(job.method.into()),
            quantization: Some(job.quantization.into()),
            lora_rank: write_lora.then_some(lora.rank),
            lora_alpha: write_lora.then_some(lora.alpha),
            lora_dropout: write_lora.then_some(lora.dropout),
            target_modules: write_lora.then(|| lora.targets.clone().into()),
            dora: write_lora.then_some(lora.dora),
            peft: peft.then(|| job.adapter.method.into()),
            feedforward_modules: (job.adapter.method == PeftKind::Ia3)
                .then(|| lora.feedforward.clone().map(Into::into))
                .flatten(),
            virtual_tokens: (write_lora && job.adapter.method.uses_virtual_tokens())
                .then_some(lora.virtual_tokens),
            decompose_factor: (write_lora && job.adapter.method == PeftKind::LoKr)
                .then_some(lora.decompose_factor)
                .flatten(),
            boft_block_size: (write_lora && job.adapter.method == PeftKind::Boft)
                .then_some(lora.block_size)
                .flatten(),
            boft_n_butterfly_factor: (write_lora && job.adapter.method == PeftKind::Boft)
                .then_some(lora.butterfly_factor)
                .flatten(),
        };
        let training = TrainingSection {
            micro_batch_size: job.micro_batch_size,
            gradient_accumulation_steps: job.grad_accum,
            max_seq_length: job.seq_len,
            optimizer: Some(job.optimizer.into()),
            gradient_checkpointing: Some(job.gradient_checkpointing),
            auto_heal: extras.auto_heal,
            precision: Some(job.precision.into()),
            attention: job.attention.into(),
            stack: job.stack.into(),
            loss: job.loss.map(Into::into),
            packing: job.padding == Padding::Packed,
            kv_cache_dtype: Some(job.kv_dtype.into()),
            learning_rate: extras.learning_rate,
            num_epochs: extras.num_epochs,
            warmup_ratio: extras.warmup_ratio,
            weight_decay: extras.weight_decay,
            lr_scheduler: extras.lr_scheduler,
            dataset: extras.dataset,
            output_dir: extras.output_dir,
            versions: LibraryVersions::from_versions(&job.versions),
            optimizer_in_backward: job.optimizer_in_backward,
            liger: job.liger == Liger::ALL,
            liger_kernels: (job.liger.any() && job.liger != Liger::ALL)
                .then(|| job.liger.names().into_iter().map(str::to_owned).collect()),
            compile: job.compile,
            // Said when on, or when the stack would otherwise turn it on.
            activation_offload: (job.activation_offload
                || job.stack.profile().offloads_by_default())
            .then_some(job.activation_offload),
            // Said on the stack that has it, whatever the value.
            num_layers: job
                .stack
                .profile()
                .default_adapted_layers
                .map(|_| LayerCount::from_layers(job.adapted_layers)),
            images_per_sample: (job.images.per_sample > 0).then_some(job.images.per_sample),
            image_size: (job.images.per_sample > 0)
                .then(|| format!("{}x{}", job.images.width, job.images.height)),
            pan_and_scan: job.images.pan_and_scan,
            vision: (job.vision != moro_core::job::VisionTraining::Frozen)
                .then(|| job.vision.into()),
            target_len: job.target_len,
            max_new_tokens: job.new_tokens,
        };
        let p = &job.parallel;
        let parallel = (*p != Parallel::single()).then(|| ParallelSection {
            gpus: Some(p.gpus()),
            strategy: p.sharding.into(),
            tensor_parallel: p.tensor_parallel,
            pipeline_parallel: p.pipeline,
            offload: p.offload.into(),
            nodes: p.nodes,
            reduce_bucket_size: p.reduce_bucket,
            // Written when it is not what the stack would choose.
            fsdp_version: (p.sharding.is_fsdp()
                && p.fsdp != moro_core::job::FsdpApi::default_for(job.stack, &job.versions))
            .then_some(p.fsdp.version()),
        });
        Self {
            name: Some(name.into()),
            version: extras.version,
            model,
            training,
            parallel,
            hardware: None,
            prediction: None,
            data: None,
        }
    }

    /// The settings of this recipe that [`Job`] does not carry.
    #[must_use]
    pub fn extras(&self) -> TrainingExtras {
        let t = &self.training;
        TrainingExtras {
            version: self.version.clone(),
            auto_heal: t.auto_heal,
            learning_rate: t.learning_rate,
            num_epochs: t.num_epochs,
            warmup_ratio: t.warmup_ratio,
            weight_decay: t.weight_decay,
            lr_scheduler: t.lr_scheduler,
            dataset: t.dataset.clone(),
            output_dir: t.output_dir.clone(),
        }
    }

    /// The settings this recipe says; what it leaves out stays unsaid, for flags or
    /// [`JobSettings::resolve`] to fill.
    ///
    /// # Errors
    /// An invalid value ([`Recipe::validate`]), named by its field path, without a position.
    pub fn settings(&self) -> Result<JobSettings, RecipeError> {
        self.validate()?;
        let m = &self.model;
        let t = &self.training;
        let p = self.parallel.as_ref();
        Ok(JobSettings {
            method: m.method.map(Into::into),
            quantization: m.quantization.map(Into::into),
            peft: m.peft.map(Into::into),
            lora_rank: m.lora_rank,
            lora_alpha: m.lora_alpha,
            lora_dropout: m.lora_dropout,
            target_modules: m.target_modules.clone().map(Into::into),
            dora: m.dora,
            feedforward_modules: m.feedforward_modules.clone().map(Into::into),
            virtual_tokens: m.virtual_tokens,
            decompose_factor: m.decompose_factor,
            boft_block_size: m.boft_block_size,
            boft_n_butterfly_factor: m.boft_n_butterfly_factor,
            micro_batch_size: Some(t.micro_batch_size),
            seq_len: Some(t.max_seq_length),
            grad_accum: Some(t.gradient_accumulation_steps),
            padding: Some(if t.packing {
                Padding::Packed
            } else {
                Padding::Padded
            }),
            optimizer: t.optimizer.map(Into::into),
            gradient_checkpointing: t.gradient_checkpointing,
            optimizer_in_backward: Some(t.optimizer_in_backward),
            attention: Some(t.attention.into()),
            precision: t.precision.map(Into::into),
            stack: Some(t.stack.into()),
            loss: t.loss.map(Into::into),
            kv_dtype: t.kv_cache_dtype.map(Into::into),
            gpus: p.and_then(|p| p.gpus),
            tensor_parallel: p.map(|p| p.tensor_parallel),
            pipeline_parallel: p.map(|p| p.pipeline_parallel),
            sharding: p.map(|p| p.strategy.into()),
            offload: p.map(|p| p.offload.into()),
            nodes: p.map(|p| p.nodes),
            reduce_bucket: p.and_then(|p| p.reduce_bucket_size),
            fsdp_version: p
                .and_then(|p| p.fsdp_version)
                .and_then(moro_core::job::FsdpApi::from_version),
            versions: t
                .versions
                .as_ref()
                .map(LibraryVersions::to_versions)
                .transpose()?,
            images_per_sample: t.images_per_sample,
            image_size: t
                .image_size
                .as_deref()
                .map(moro_core::vision::parse_image_size)
                .transpose()
                .map_err(|e| RecipeError::value("training.image_size", e))?,
            pan_and_scan: t.pan_and_scan.then_some(true),
            vision: t.vision.map(Into::into),
            liger: match &t.liger_kernels {
                Some(_) if t.liger => {
                    return Err(RecipeError::value(
                        "training.liger_kernels",
                        "names some kernels while `liger: true` asks for all; keep one of them",
                    ));
                }
                Some(names) => Some(
                    Liger::from_names(names)
                        .map_err(|e| RecipeError::value("training.liger_kernels", e))?,
                ),
                None => t.liger.then_some(Liger::ALL),
            },
            compile: t.compile.then_some(true),
            activation_offload: t.activation_offload,
            adapted_layers: t.num_layers.map(LayerCount::layers),
            target_len: t.target_len,
            new_tokens: t.max_new_tokens,
        })
    }

    /// The engine job this recipe describes on its own, every unsaid setting at its default
    /// ([`JobSettings::resolve`]).
    ///
    /// # Errors
    /// An invalid value, named by its field path, without a position.
    pub fn to_job(&self) -> Result<Job, RecipeError> {
        self.settings()?
            .resolve()
            .map_err(|e| RecipeError::value(job_field_path(e.field), e.message))
    }

    /// Whether the recipe trains adapters (its effective method is LoRA or QLoRA).
    #[must_use]
    pub fn is_peft(&self) -> bool {
        matches!(self.model.effective_method(), Method::Lora | Method::Qlora)
    }
}

/// The moro.yaml path of a field named in an engine [`JobError`].
#[must_use]
pub fn job_field_path(field: &str) -> String {
    match field {
        "micro_batch_size"
        | "gradient_accumulation_steps"
        | "max_seq_length"
        | "optimizer"
        | "gradient_checkpointing"
        | "precision"
        | "attention"
        | "stack"
        | "loss"
        | "packing"
        | "optimizer_in_backward"
        | "liger"
        | "liger_kernels"
        | "compile"
        | "activation_offload"
        | "num_layers"
        | "target_len"
        | "max_new_tokens" => {
            format!("training.{field}")
        }
        "lora_rank"
        | "lora_alpha"
        | "lora_dropout"
        | "target_modules"
        | "quantization"
        | "method"
        | "dora"
        | "base"
        | "peft"
        | "virtual_tokens"
        | "decompose_factor"
        | "boft_block_size"
        | "boft_n_butterfly_factor"
        | "feedforward_modules" => {
            format!("model.{field}")
        }
        "parallel.data_parallel" => "parallel.gpus".to_owned(),
        "parallel.reduce_bucket" => "parallel.reduce_bucket_size".to_owned(),
        "parallel.pipeline" => "parallel.pipeline_parallel".to_owned(),
        other => other.to_owned(),
    }
}

/// An engine [`JobError`] (from [`Job::validate`], which knows the model) as a recipe error,
/// positioned in `text` when the recipe came from it.
#[must_use]
pub fn job_error(err: &JobError, text: Option<&str>) -> RecipeError {
    let e = RecipeError::value(job_field_path(err.field), err.message.clone());
    match text {
        Some(text) => crate::yaml::position(text, e),
        None => e,
    }
}
