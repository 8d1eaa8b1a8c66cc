//! [`JobSettings`]: a job as it was asked for, every setting optional, and the one place
//! where the defaults are applied ([`JobSettings::resolve`]).
//!
//! Flags, a moro.yaml and a validation row each say some settings and leave the rest out.
//! They become a `JobSettings` each; [`JobSettings::or`] layers them (flags over the
//! recipe), and [`JobSettings::resolve`] fills what nobody said, with defaults that may
//! depend on the other settings (a QLoRA job on the hf stack checkpoints; a full fine-tune
//! trains bf16 weights). So the same intent gives the same [`Job`], whichever way it came.

use super::{
    Attention, FsdpApi, Job, JobError, KvDtype, Liger, LossImpl, Method, Offload, Optimizer,
    Padding, Parallel, PeftConfig, PeftKind, Precision, Quantization, Sharding, Stack, Targets,
    Versions, VisionTraining,
};
use crate::stack::{DefaultCheckpointing, DefaultPrecision};

/// The settings of a job that were given; `None` is "not said", never a value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSettings {
    /// `method`. Default: `qlora` with a quantized base, else `lora`.
    pub method: Option<Method>,
    /// `quantization`. Default: `nf4-dq` for QLoRA, else `none`.
    pub quantization: Option<Quantization>,
    /// `peft`. Default: `lora`.
    pub peft: Option<PeftKind>,
    /// `lora_rank`. Default: 16.
    pub lora_rank: Option<u64>,
    /// `lora_alpha`. Default: 2 × the rank (PEFT's examples and moro's recipes).
    pub lora_alpha: Option<f64>,
    /// `lora_dropout`. Default: 0.05.
    pub lora_dropout: Option<f64>,
    /// `target_modules`. Default: the seven attention and MLP projections.
    pub target_modules: Option<Targets>,
    /// `dora`. Default: false.
    pub dora: Option<bool>,
    /// IA³'s `feedforward_modules`. Default: PEFT's (the MLP's down projection).
    pub feedforward_modules: Option<Targets>,
    /// Prompt and prefix tuning's `num_virtual_tokens`. Default: 20.
    pub virtual_tokens: Option<u64>,
    /// LoKr's `decompose_factor`. Default: PEFT's −1 (factors near the square root).
    pub decompose_factor: Option<u64>,
    /// BOFT's `boft_block_size`. Default: PEFT's 4.
    pub boft_block_size: Option<u64>,
    /// BOFT's `boft_n_butterfly_factor`. Default: PEFT's 1.
    pub boft_n_butterfly_factor: Option<u64>,
    /// `micro_batch_size`. Default: 1.
    pub micro_batch_size: Option<u64>,
    /// `max_seq_length`. Default: 2048.
    pub seq_len: Option<u64>,
    /// `gradient_accumulation_steps`. Default: 1.
    pub grad_accum: Option<u64>,
    /// Packing or padding. Default: packed.
    pub padding: Option<Padding>,
    /// `optimizer`. Default: `adamw_torch_fused` (the HF Trainer's with torch ≥ 2.8).
    pub optimizer: Option<Optimizer>,
    /// `gradient_checkpointing`. Default: the stack's ([`default_checkpointing`]).
    pub gradient_checkpointing: Option<bool>,
    /// `optimizer_in_backward`. Default: false.
    pub optimizer_in_backward: Option<bool>,
    /// `attention`. Default: `sdpa` (transformers' default implementation).
    pub attention: Option<Attention>,
    /// `precision`. Default: the stack's and method's ([`default_precision`]).
    pub precision: Option<Precision>,
    /// `stack`. Default: `litgpt` for lit-gpt's adapters, else `hf`.
    pub stack: Option<Stack>,
    /// `loss`. Default: the stack's ([`Job::loss_impl`]).
    pub loss: Option<LossImpl>,
    /// `kv_cache_dtype`. Default: fp32 for fp32 jobs, else the 16-bit compute dtype.
    pub kv_dtype: Option<KvDtype>,
    /// `parallel.gpus`: GPUs in all (data × tensor × pipeline parallel). Default: 1, or the
    /// count the hardware names (set by the caller that knows it).
    pub gpus: Option<u64>,
    /// `parallel.tensor_parallel`. Default: 1.
    pub tensor_parallel: Option<u64>,
    /// `parallel.pipeline_parallel`. Default: 1.
    pub pipeline_parallel: Option<u64>,
    /// `parallel.strategy`. Default: none (DDP).
    pub sharding: Option<Sharding>,
    /// `parallel.offload`. Default: none.
    pub offload: Option<Offload>,
    /// `parallel.nodes`. Default: 1.
    pub nodes: Option<u64>,
    /// `parallel.reduce_bucket_size`. Default: DeepSpeed's `"auto"`.
    pub reduce_bucket: Option<u64>,
    /// `parallel.fsdp_version`. Default: the stack's ([`crate::stack::StackProfile::fsdp_api`]).
    pub fsdp_version: Option<FsdpApi>,
    /// `training.versions`. Default: current releases.
    pub versions: Option<Versions>,
    /// `training.images_per_sample`. Default: 1 on a vision-language model, else 0.
    pub images_per_sample: Option<u64>,
    /// `training.image_size` as (width, height). Default: the processor's own square, or
    /// 1024 × 1024 where it resizes dynamically ([`crate::vision::VisionSpec::default_image_size`]).
    pub image_size: Option<(u64, u64)>,
    /// `training.pan_and_scan`: Gemma 3's pan-and-scan crops. Default: off, as
    /// `Gemma3Processor` has it.
    pub pan_and_scan: Option<bool>,
    /// `training.vision`. Default: frozen.
    pub vision: Option<VisionTraining>,
    /// `training.liger` / `training.liger_kernels`: Liger's kernels. Default: none.
    pub liger: Option<Liger>,
    /// `training.compile`: `torch.compile` of the model. Default: false.
    pub compile: Option<bool>,
    /// `training.activation_offload`: checkpoints offloaded to host memory. Default: false.
    pub activation_offload: Option<bool>,
    /// `training.num_layers`: how many of the last decoder layers train, `Some(None)` for
    /// all. Default: the stack's (MLX's 16; every layer elsewhere).
    pub adapted_layers: Option<Option<u64>>,
    /// `training.target_len`: an encoder-decoder model's target tokens per sample.
    /// Default: `seq_len`.
    pub target_len: Option<u64>,
    /// `training.max_new_tokens`: the tokens an inference job generates, the last of
    /// `max_seq_length`.
    pub new_tokens: Option<u64>,
}

/// Takes `a`, else `b`, field by field.
macro_rules! layer {
    ($a:ident, $b:ident; $($f:ident),+ $(,)?) => {
        JobSettings { $($f: $a.$f.or($b.$f)),+ }
    };
}

impl JobSettings {
    /// Every setting of `job`, said explicitly.
    #[must_use]
    pub fn said_in_full(job: &Job) -> JobSettings {
        let p = &job.parallel;
        JobSettings {
            method: Some(job.method),
            quantization: Some(job.quantization),
            peft: Some(job.adapter.method),
            lora_rank: Some(job.adapter.rank),
            lora_alpha: Some(job.adapter.alpha),
            lora_dropout: Some(job.adapter.dropout),
            target_modules: Some(job.adapter.targets.clone()),
            dora: Some(job.adapter.dora),
            feedforward_modules: job.adapter.feedforward.clone(),
            virtual_tokens: Some(job.adapter.virtual_tokens),
            decompose_factor: job.adapter.decompose_factor,
            boft_block_size: job.adapter.block_size,
            boft_n_butterfly_factor: job.adapter.butterfly_factor,
            micro_batch_size: Some(job.micro_batch_size),
            seq_len: Some(job.seq_len),
            grad_accum: Some(job.grad_accum),
            padding: Some(job.padding),
            optimizer: Some(job.optimizer),
            gradient_checkpointing: Some(job.gradient_checkpointing),
            optimizer_in_backward: Some(job.optimizer_in_backward),
            attention: Some(job.attention),
            precision: Some(job.precision),
            stack: Some(job.stack),
            loss: job.loss,
            kv_dtype: Some(job.kv_dtype),
            gpus: Some(p.gpus()),
            tensor_parallel: Some(p.tensor_parallel),
            pipeline_parallel: Some(p.pipeline),
            sharding: Some(p.sharding),
            offload: Some(p.offload),
            nodes: Some(p.nodes),
            reduce_bucket: p.reduce_bucket,
            fsdp_version: p.sharding.is_fsdp().then_some(p.fsdp),
            versions: Some(job.versions),
            images_per_sample: Some(job.images.per_sample),
            image_size: Some((job.images.width, job.images.height)),
            pan_and_scan: Some(job.images.pan_and_scan),
            vision: Some(job.vision),
            liger: Some(job.liger),
            compile: Some(job.compile),
            activation_offload: Some(job.activation_offload),
            adapted_layers: Some(job.adapted_layers),
            target_len: job.target_len,
            new_tokens: job.new_tokens,
        }
    }

    /// These settings, with `base`'s filling what these leave out (flags over a recipe:
    /// `flags.or(recipe)`).
    #[must_use]
    pub fn or(self, base: Self) -> Self {
        let a = self;
        let b = base;
        layer!(a, b;
            method, quantization, peft, lora_rank, lora_alpha, lora_dropout, target_modules,
            dora, feedforward_modules, virtual_tokens, decompose_factor, boft_block_size,
            boft_n_butterfly_factor, micro_batch_size, seq_len, grad_accum,
            padding, optimizer, gradient_checkpointing, optimizer_in_backward, attention,
            precision, stack, loss, kv_dtype, gpus, tensor_parallel, pipeline_parallel,
            sharding, offload, nodes, reduce_bucket, fsdp_version, versions, images_per_sample, image_size,
            pan_and_scan, vision, liger, compile, activation_offload, adapted_layers, target_len,
            new_tokens,
        )
    }

    /// A setting given for something this job does not do: adapter settings on a full
    /// fine-tune or inference, training settings on inference. Checked on each source on
    /// its own (a flag that changes the method may leave a recipe's adapters unused).
    ///
    /// # Errors
    /// The first such setting, by name.
    pub fn check_used(&self) -> Result<(), JobError> {
        self.check_adapters_used()?;
        if self.method == Some(Method::Inference) {
            let training = [
                ("optimizer", self.optimizer.is_some()),
                (
                    "gradient_accumulation_steps",
                    self.grad_accum.is_some_and(|g| g > 1),
                ),
                (
                    "gradient_checkpointing",
                    self.gradient_checkpointing == Some(true),
                ),
                (
                    "optimizer_in_backward",
                    self.optimizer_in_backward == Some(true),
                ),
                ("liger", self.liger.is_some_and(Liger::any)),
                ("compile", self.compile == Some(true)),
                ("activation_offload", self.activation_offload == Some(true)),
            ];
            if let Some((field, _)) = training.iter().find(|(_, given)| *given) {
                return Err(JobError {
                    field,
                    message: "is a training setting; inference has no backward pass or \
                              optimizer: drop it"
                        .to_owned(),
                });
            }
        }
        Ok(())
    }

    /// The adapter half of [`Self::check_used`], for sources that always state the
    /// training settings (a moro.yaml's `training:` section has defaults of its own).
    ///
    /// # Errors
    /// The first adapter setting given for a full fine-tune or inference.
    pub fn check_adapters_used(&self) -> Result<(), JobError> {
        let Some(method) = self.method else {
            return Ok(());
        };
        if !method.is_peft() {
            let adapter = [
                ("lora_rank", self.lora_rank.is_some()),
                ("lora_alpha", self.lora_alpha.is_some()),
                ("lora_dropout", self.lora_dropout.is_some()),
                ("target_modules", self.target_modules.is_some()),
                ("dora", self.dora == Some(true)),
                ("peft", self.peft.is_some_and(|p| p != PeftKind::Lora)),
                ("feedforward_modules", self.feedforward_modules.is_some()),
                ("virtual_tokens", self.virtual_tokens.is_some()),
                ("decompose_factor", self.decompose_factor.is_some()),
                ("boft_block_size", self.boft_block_size.is_some()),
                (
                    "boft_n_butterfly_factor",
                    self.boft_n_butterfly_factor.is_some(),
                ),
            ];
            if let Some((field, _)) = adapter.iter().find(|(_, given)| *given) {
                let what = if method == Method::Full {
                    "a full fine-tune trains every weight, with no adapters"
                } else {
                    "inference trains nothing"
                };
                return Err(JobError {
                    field,
                    message: format!(
                        "applies to adapter methods (lora, qlora); {what}: drop it or choose \
                         method lora"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The job, with every setting that was not given at its default.
    ///
    /// # Errors
    /// A GPU count that the tensor × pipeline degree does not divide (`parallel.gpus`), or
    /// a zero degree. Everything else is checked against the model by [`Job::validate`].
    pub fn resolve(&self) -> Result<Job, JobError> {
        let peft = self.peft.unwrap_or_default();
        // The LLaMA-Adapter family runs on the stack that has it.
        let stack = self.stack.unwrap_or_else(|| {
            Stack::ALL
                .into_iter()
                .find(|s| peft.is_adapter() && s.profile().trains_llama_adapter)
                .unwrap_or(Stack::Hf)
        });
        let method = self.method.unwrap_or(match self.quantization {
            Some(q) if q != Quantization::None => Method::QuantizedAdapters,
            _ => Method::Adapters,
        });
        let quantization = self
            .quantization
            .unwrap_or(if method == Method::QuantizedAdapters {
                stack.profile().default_quantization
            } else {
                Quantization::None
            });
        let precision = self
            .precision
            .unwrap_or_else(|| default_precision(stack, method));
        // Where PEFT refuses checkpointing for the method (prefix tuning), the default is off
        // (QLoRA's `prepare_model_for_kbit_training(use_gradient_checkpointing=False)`).
        let gradient_checkpointing = self.gradient_checkpointing.unwrap_or_else(|| {
            default_checkpointing(stack, method, quantization)
                && !(method.is_peft() && peft.refuses_checkpointing())
        });
        let d = PeftConfig::default();
        let profile = stack.profile();
        let rank = self.lora_rank.unwrap_or(profile.default_lora_rank);
        #[allow(clippy::cast_precision_loss)] // ranks are far below 2^52
        let alpha = self.lora_alpha.unwrap_or(2.0 * rank as f64);
        let adapter = PeftConfig {
            method: peft,
            rank,
            alpha,
            // A method without an input dropout has none to default.
            dropout: self.lora_dropout.unwrap_or(if peft.drops_out_input() {
                stack.profile().default_lora_dropout
            } else {
                0.0
            }),
            targets: self
                .target_modules
                .clone()
                .unwrap_or(if profile.adapts_all_linear {
                    crate::job::Targets::AllLinear
                } else {
                    d.targets
                }),
            dora: self.dora.unwrap_or(d.dora),
            feedforward: self.feedforward_modules.clone(),
            virtual_tokens: self.virtual_tokens.unwrap_or(d.virtual_tokens),
            decompose_factor: self.decompose_factor,
            block_size: self.boft_block_size,
            butterfly_factor: self.boft_n_butterfly_factor,
        };
        let versions = self.versions.unwrap_or_default();
        let mut parallel = self.parallel()?;
        if self.fsdp_version.is_some() && !parallel.sharding.is_fsdp() {
            return Err(JobError {
                field: "parallel.fsdp_version",
                message: "applies to the FSDP strategies (fsdp_full_shard, fsdp_shard_grad_op, \
                          fsdp_hybrid_shard): drop it or choose one"
                    .to_owned(),
            });
        }
        if parallel.sharding.is_fsdp() {
            parallel.fsdp = self
                .fsdp_version
                .unwrap_or_else(|| FsdpApi::default_for(stack, &versions));
        }
        let base = Job::default();
        Ok(Job {
            method,
            quantization,
            adapter,
            micro_batch_size: self.micro_batch_size.unwrap_or(base.micro_batch_size),
            seq_len: self.seq_len.unwrap_or(base.seq_len),
            grad_accum: self.grad_accum.unwrap_or(base.grad_accum),
            optimizer: self.optimizer.unwrap_or(stack.profile().default_optimizer),
            gradient_checkpointing,
            attention: self.attention.unwrap_or(base.attention),
            precision,
            stack,
            loss: self.loss,
            padding: self.padding.unwrap_or(base.padding),
            parallel,
            kv_dtype: self.kv_dtype.unwrap_or(if precision == Precision::Fp32 {
                KvDtype::F32
            } else {
                KvDtype::F16
            }),
            versions,
            optimizer_in_backward: self.optimizer_in_backward.unwrap_or(false),
            images: crate::vision::Images {
                per_sample: match (self.images_per_sample, self.image_size) {
                    (Some(n), _) => n,
                    (None, Some(_)) => 1,
                    (None, None) => base.images.per_sample,
                },
                width: self.image_size.map_or(base.images.width, |(w, _)| w),
                height: self.image_size.map_or(base.images.height, |(_, h)| h),
                pan_and_scan: self.pan_and_scan.unwrap_or(false),
            },
            vision: self.vision.unwrap_or(base.vision),
            liger: self.liger.unwrap_or_default(),
            compile: self.compile.unwrap_or(false),
            // Unsloth's `"unsloth"` checkpointing offloads whenever it checkpoints.
            activation_offload: self
                .activation_offload
                .unwrap_or(gradient_checkpointing && stack.profile().offloads_by_default()),
            adapted_layers: self
                .adapted_layers
                .unwrap_or(profile.default_adapted_layers),
            target_len: self.target_len,
            new_tokens: self.new_tokens,
        })
    }

    /// The job for `model`: [`Self::resolve`], then the defaults that depend on the model
    /// (a pre-quantized checkpoint's storage, [`crate::model::ModelSpec::prequantized`]; a
    /// vision-language model's images) and the LoRA targets bound to its modules
    /// ([`crate::targets::resolve`]). A model with
    /// attention sinks runs eager attention unless told otherwise: transformers 5.24 falls
    /// back to eager when SDPA, its default, is not supported (`get_correct_attn_implementation`).
    ///
    /// # Errors
    /// As [`Self::resolve`].
    pub fn resolve_for(&self, model: &crate::model::ModelSpec) -> Result<Job, JobError> {
        // A pre-quantized checkpoint loads in its own storage: QLoRA (or quantized inference)
        // unless the job says otherwise.
        let stored;
        let settings = match model.prequantized {
            Some(q) if self.quantization.is_none() => {
                let method = match self.method {
                    Some(Method::Full) => {
                        return Err(JobError {
                            field: "method",
                            message: format!(
                                "the checkpoint stores {} weights (`quantization_config`), which \
                                 a full fine-tune cannot train; use lora or qlora, or its \
                                 16-bit base model",
                                q.as_str()
                            ),
                        });
                    }
                    // LoRA on quantized weights is QLoRA.
                    Some(Method::Adapters) => Some(Method::QuantizedAdapters),
                    m => m,
                };
                stored = Self {
                    quantization: Some(q),
                    method,
                    ..self.clone()
                };
                &stored
            }
            _ => self,
        };
        let mut job = settings.resolve()?;
        if self.attention.is_none() && model.attention_sinks {
            job.attention = Attention::Eager;
        }
        // Inference keeps a checkpoint's MXFP4 experts (transformers' default,
        // `Mxfp4Config(dequantize=False)`).
        if self.quantization.is_none() && job.method == Method::Inference && model.mxfp4_experts {
            job.quantization = Quantization::Mxfp4;
        }
        if let Some(v) = &model.vision {
            let d = v.default_images();
            if self.images_per_sample.is_none() {
                job.images.per_sample = d.per_sample;
            }
            if self.image_size.is_none() {
                (job.images.width, job.images.height) = (d.width, d.height);
            }
        }
        job.adapter.targets = crate::targets::resolve(
            &crate::stack::as_built(model, job.stack.profile()),
            &job.adapter.targets,
        );
        // PEFT wraps stacked experts in a `ParamWrapper`, which refuses dropout: unless told
        // otherwise, LoRA on them trains without it (an explicit dropout is refused by
        // `Job::validate`).
        if self.lora_dropout.is_none()
            && model
                .linears()
                .any(|(_, l)| job.adapts(l) && job.adapts_stacked(l))
        {
            job.adapter.dropout = 0.0;
        }
        Ok(job)
    }

    /// The layout: `gpus` is the total, split into data × tensor × pipeline parallel.
    fn parallel(&self) -> Result<Parallel, JobError> {
        let err = |field, message: String| Err(JobError { field, message });
        let tp = self.tensor_parallel.unwrap_or(1);
        let pp = self.pipeline_parallel.unwrap_or(1);
        for (field, v) in [("parallel.tensor_parallel", tp), ("parallel.pipeline", pp)] {
            if v == 0 || v > 1 << 16 {
                return err(field, format!("must be between 1 and 65536, got {v}"));
            }
        }
        let model_parallel = tp * pp;
        let gpus = self.gpus.unwrap_or(model_parallel);
        if gpus == 0 || gpus > 1 << 16 {
            return err(
                "parallel.data_parallel",
                format!("must be between 1 and 65536, got {gpus}"),
            );
        }
        if !gpus.is_multiple_of(model_parallel) {
            return err(
                "parallel.data_parallel",
                format!(
                    "{gpus} GPUs in all cannot be split into groups of {model_parallel} \
                     (tensor parallel {tp} × pipeline {pp}); give a multiple of {model_parallel}"
                ),
            );
        }
        Ok(Parallel {
            data_parallel: gpus / model_parallel,
            tensor_parallel: tp,
            pipeline: pp,
            sharding: self.sharding.unwrap_or(Sharding::None),
            offload: self.offload.unwrap_or(Offload::None),
            nodes: self.nodes.unwrap_or(1),
            reduce_bucket: self.reduce_bucket,
            fsdp: FsdpApi::Fsdp1,
        })
    }
}

/// The precision a stack trains in when none is given.
///
/// - litgpt and torchtune load and train in bf16 without autocast (litgpt
///   `--precision bf16-true`, torchtune's `dtype: bf16`).
/// - A full fine-tune (and inference) on hf/trl trains the weights in the dtype they are
///   loaded in: transformers 5 loads `dtype="auto"`, so a bf16 checkpoint stays bf16 and the
///   HF Trainer's `bf16=True` adds autocast over bf16 weights — bf16 weights and AdamW
///   states, no fp32 master copy.
/// - LoRA and QLoRA on hf/trl: PEFT creates the adapters in fp32 and the Trainer's
///   `bf16=True` autocasts (`bf16-mixed`).
#[must_use]
pub const fn default_precision(stack: Stack, method: Method) -> Precision {
    match (stack.profile().default_precision, method) {
        (DefaultPrecision::PureBf16, _) | (_, Method::Full | Method::Inference) => Precision::Bf16,
        _ => Precision::Bf16Mixed,
    }
}

/// Whether a stack checkpoints when not told.
///
/// - TRL's `SFTConfig.gradient_checkpointing`: "Defaults to True".
/// - PEFT's `prepare_model_for_kbit_training(use_gradient_checkpointing=True)`, which the
///   hf stack's QLoRA runs on a bitsandbytes base (GPTQ checkpoints skip it).
#[must_use]
pub fn default_checkpointing(stack: Stack, method: Method, quantization: Quantization) -> bool {
    match stack.profile().default_checkpointing {
        DefaultCheckpointing::On => true,
        DefaultCheckpointing::WithKbitPrepare => {
            method == Method::QuantizedAdapters && quantization != Quantization::Gptq4
        }
        DefaultCheckpointing::Off => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_said_is_the_hf_trainer_lora_job() {
        let job = JobSettings::default().resolve().unwrap();
        assert_eq!(job.method, Method::Adapters);
        assert_eq!(job.precision, Precision::Bf16Mixed);
        assert!(!job.gradient_checkpointing);
        assert_eq!(job.adapter.alpha, 32.0);
        assert_eq!(job.parallel, Parallel::single());
    }

    /// PEFT refuses prefix tuning with checkpointing: QLoRA's default turns it off, and
    /// asking for it is the error `Job::validate` gives.
    #[test]
    fn prefix_tuning_defaults_to_no_checkpointing() {
        let qlora = JobSettings {
            method: Some(Method::QuantizedAdapters),
            peft: Some(PeftKind::PrefixTuning),
            ..JobSettings::default()
        };
        assert!(!qlora.resolve().unwrap().gradient_checkpointing);
        let plain = JobSettings {
            peft: Some(PeftKind::PromptTuning),
            ..qlora.clone()
        };
        assert!(plain.resolve().unwrap().gradient_checkpointing);
    }

    /// `lora_dropout` defaults to the stack's where the method drops out its input (LoRA,
    /// AdaLoRA, VeRA's `vera_dropout`), else to none: PEFT's LoHa has no such dropout.
    #[test]
    fn methods_without_input_dropout_default_to_none() {
        let with = |peft| {
            JobSettings {
                peft: Some(peft),
                ..JobSettings::default()
            }
            .resolve()
            .unwrap()
            .adapter
            .dropout
        };
        assert!((with(PeftKind::Vera) - 0.05).abs() < 1e-12);
        assert!(with(PeftKind::LoHa) == 0.0);
        assert!(with(PeftKind::PromptTuning) == 0.0);
    }

    #[test]
    fn qlora_on_hf_checkpoints_and_quantizes_to_nf4_dq() {
        let s = JobSettings {
            method: Some(Method::QuantizedAdapters),
            ..JobSettings::default()
        };
        let job = s.resolve().unwrap();
        assert_eq!(job.quantization, Quantization::Nf4Dq);
        assert!(job.gradient_checkpointing);
        // A quantized base alone means QLoRA.
        let s = JobSettings {
            quantization: Some(Quantization::Nf4),
            ..JobSettings::default()
        };
        assert_eq!(s.resolve().unwrap().method, Method::QuantizedAdapters);
    }

    #[test]
    fn an_explicit_setting_is_never_replaced() {
        let s = JobSettings {
            method: Some(Method::QuantizedAdapters),
            quantization: Some(Quantization::None),
            gradient_checkpointing: Some(false),
            ..JobSettings::default()
        };
        let job = s.resolve().unwrap();
        // Left for `Job::validate` to refuse, not silently made nf4-dq.
        assert_eq!(job.quantization, Quantization::None);
        assert!(!job.gradient_checkpointing);
    }

    #[test]
    fn gpus_is_the_total_over_tensor_and_pipeline_parallel() {
        let s = JobSettings {
            gpus: Some(8),
            tensor_parallel: Some(2),
            ..JobSettings::default()
        };
        let p = s.resolve().unwrap().parallel;
        assert_eq!((p.data_parallel, p.tensor_parallel, p.gpus()), (4, 2, 8));
        let s = JobSettings {
            gpus: Some(3),
            tensor_parallel: Some(2),
            ..JobSettings::default()
        };
        assert_eq!(s.resolve().unwrap_err().field, "parallel.data_parallel");
    }

    #[test]
    fn layering_keeps_the_upper_settings() {
        let flags = JobSettings {
            seq_len: Some(4096),
            ..JobSettings::default()
        };
        let recipe = JobSettings {
            seq_len: Some(1024),
            micro_batch_size: Some(4),
            ..JobSettings::default()
        };
        let job = flags.or(recipe).resolve().unwrap();
        assert_eq!((job.seq_len, job.micro_batch_size), (4096, 4));
    }

    #[test]
    fn a_job_said_in_full_resolves_to_itself() {
        let mut job = Job {
            method: Method::Full,
            precision: Precision::Fp32,
            kv_dtype: KvDtype::F16,
            ..Job::default()
        };
        job.parallel.data_parallel = 4;
        job.parallel.tensor_parallel = 2;
        assert_eq!(JobSettings::said_in_full(&job).resolve().unwrap(), job);
    }
}
