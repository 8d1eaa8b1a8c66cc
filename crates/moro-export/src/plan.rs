//! [`Plan`]: the recipe with every default applied, read once for all formats, and the
//! warnings that hold whatever the format (tensor parallelism, an unknown LoRA target, ...).

use moro_core::job::{DEFAULT_TARGETS, Job, Liger, LossImpl, PeftConfig, PeftKind, Targets};
use moro_core::model::ModelSpec;
use moro_recipe::Recipe;
use moro_recipe::TrainingSection;
use moro_recipe::choices::{Attention, Method, Offload, Precision, Quantization, Strategy};

use crate::ExportError;

/// File name of the DeepSpeed config a trainer config points at.
pub(crate) const DS_CONFIG_NAME: &str = "ds_config.json";
/// File name of the accelerate config a launch command points at.
pub(crate) const ACCELERATE_CONFIG_NAME: &str = "accelerate.yaml";
/// File name of the DeepSpeed launcher's hostfile in multi-node launch commands.
pub(crate) const HOSTFILE_NAME: &str = "hostfile";
/// The rendezvous port multi-node launch commands name: torchrun's and accelerate's default
/// (`--master_port` 29500 in torch.distributed.run; `main_process_port` falls back to 29500 in
/// accelerate's `prepare_multi_gpu_env`).
pub(crate) const MASTER_PORT: u64 = 29500;

/// How the job is spread over GPUs, as the launchers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dist {
    /// One GPU.
    Single,
    /// DDP over `n` GPUs.
    Ddp { n: u64 },
    /// DeepSpeed ZeRO over `n` GPUs.
    Zero {
        n: u64,
        stage: u8,
        offload_optimizer: bool,
        offload_params: bool,
    },
    /// FSDP over `n` GPUs.
    Fsdp {
        n: u64,
        strategy: Strategy,
        offload_params: bool,
        /// `FullyShardedDataParallel` (1) or `fully_shard` (2).
        version: moro_core::job::FsdpApi,
    },
}

impl Dist {
    pub(crate) const fn gpus(self) -> u64 {
        match self {
            Self::Single => 1,
            Self::Ddp { n } | Self::Zero { n, .. } | Self::Fsdp { n, .. } => n,
        }
    }

    /// Whether parameters are sharded (QLoRA then stores 4-bit weights in the compute dtype).
    pub(crate) const fn shards_params(self) -> bool {
        matches!(self, Self::Zero { stage: 3, .. })
            || matches!(
                self,
                Self::Fsdp {
                    strategy: Strategy::FsdpFullShard | Strategy::FsdpHybridShard,
                    ..
                }
            )
    }
}

/// The recipe, resolved.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) model: Option<&'a ModelSpec>,
    /// Recipe name (or the base model id), for headers.
    pub(crate) name: String,
    pub(crate) base: String,
    pub(crate) method: Method,
    pub(crate) quant: Quantization,
    pub(crate) adapter: PeftConfig,
    pub(crate) t: &'a TrainingSection,
    /// `training.precision`, resolved (the stack's and method's default when unsaid).
    pub(crate) precision: Precision,
    /// `training.gradient_checkpointing`, resolved.
    pub(crate) checkpointing: bool,
    pub(crate) loss: LossImpl,
    /// Liger's kernels: the recipe's, or its fused loss alone ([`Plan::liger_kernels`]).
    pub(crate) liger: Liger,
    /// `training.compile`: the Trainer's `torch_compile`.
    pub(crate) compile: bool,
    /// `training.optimizer`, resolved (the stack's default when unsaid).
    pub(crate) optimizer: moro_recipe::choices::Optimizer,
    /// `training.activation_offload`, resolved.
    pub(crate) activation_offload: bool,
    /// `training.num_layers`, resolved: the last this many layers train, `None` all.
    pub(crate) adapted_layers: Option<u64>,
    /// `training.gradient_accumulation_steps` and `micro_batch_size` as the engine read them.
    pub(crate) grad_accum: u64,
    pub(crate) dist: Dist,
    /// `parallel.reduce_bucket_size` (DeepSpeed); `None`: "auto".
    pub(crate) reduce_bucket: Option<u64>,
    /// Nodes the GPUs span (`parallel.nodes`; 1 for one GPU). Divides [`Dist::gpus`].
    pub(crate) nodes: u64,
    pub(crate) output_dir: String,
    pub(crate) warnings: Vec<String>,
}

impl<'a> Plan<'a> {
    pub(crate) fn new(
        recipe: &'a Recipe,
        model: Option<&'a ModelSpec>,
    ) -> Result<Self, ExportError> {
        let job: Job = recipe.to_job()?;
        if let Some(m) = model {
            job.validate(m)
                .map_err(|e| ExportError::from(moro_recipe::job_error(&e, None)))?;
        }
        let method = Method::from(job.method);
        let images =
            job.images.per_sample > 0 || job.vision != moro_core::job::VisionTraining::Frozen;
        if model.is_some_and(|m| m.vision.is_some()) || images {
            return Err(ExportError::field(
                "model.base",
                "a vision-language model: the exports write text-only training (no processor, \
                 image collator or `AutoModelForImageTextToText`); `moro estimate` sizes it, \
                 and the trainer's own VLM recipe runs it",
            ));
        }
        if model.is_some_and(|m| m.seq2seq.is_some()) || job.target_len.is_some() {
            return Err(ExportError::field(
                "model.base",
                "an encoder-decoder model: the exports write causal-LM training (no \
                 `AutoModelForSeq2SeqLM`, `Seq2SeqTrainer` or target column); `moro estimate` \
                 sizes it, and transformers' seq2seq examples run it",
            ));
        }
        if method == Method::Inference {
            return Err(ExportError::field(
                "model.method",
                "an inference recipe has nothing to train; exports need full, lora or qlora",
            ));
        }
        let quant = Quantization::from(job.quantization);
        let t = &recipe.training;
        let mut warnings = Vec::new();
        if method == Method::Full && quant != Quantization::None {
            return Err(ExportError::field(
                "model.quantization",
                format!(
                    "full fine-tuning of a {quant} base is not supported by any trainer; use method qlora"
                ),
            ));
        }

        // The resolved layout (its GPU count may come from defaults), in the file's spellings.
        let jp = &job.parallel;
        let n = jp.gpus();
        let strategy = Strategy::from(jp.sharding);
        let offload = Offload::from(jp.offload);
        if jp.tensor_parallel > 1 || jp.pipeline > 1 {
            warnings.push(format!(
                "parallel.tensor_parallel = {} / pipeline_parallel = {}: these trainer configs express \
                 data parallelism only; exported as {n} data-parallel GPUs",
                jp.tensor_parallel, jp.pipeline
            ));
        }
        let dist = match strategy {
            _ if n <= 1 => {
                if strategy != Strategy::None || offload != Offload::None {
                    warnings.push(format!(
                        "parallel.strategy = {} / offload = {} on one GPU: not exported (single-GPU \
                         launch); DeepSpeed offload on one GPU needs parallel.gpus = 1 with a zero strategy \
                         launched by `deepspeed --num_gpus 1`",
                        strategy, offload
                    ));
                }
                Dist::Single
            }
            Strategy::None => {
                if offload != Offload::None {
                    warnings.push(format!(
                        "parallel.offload = {}: DDP cannot offload; use a zero or fsdp strategy",
                        offload
                    ));
                }
                Dist::Ddp { n }
            }
            Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => {
                let stage = match strategy {
                    Strategy::Zero1 => 1,
                    Strategy::Zero2 => 2,
                    _ => 3,
                };
                Dist::Zero {
                    n,
                    stage,
                    offload_optimizer: offload != Offload::None,
                    offload_params: offload == Offload::OptimizerAndParams,
                }
            }
            s @ (Strategy::FsdpFullShard
            | Strategy::FsdpShardGradOp
            | Strategy::FsdpHybridShard) => {
                if offload == Offload::Optimizer {
                    warnings.push(
                        "parallel.offload = optimizer: FSDP offloads parameters, gradients and the \
                         optimizer step together (fsdp_offload_params); exported with offload_params"
                            .to_owned(),
                    );
                }
                Dist::Fsdp {
                    n,
                    strategy: s,
                    offload_params: offload != Offload::None,
                    version: jp.fsdp,
                }
            }
        };
        let nodes = if n <= 1 { 1 } else { jp.nodes.max(1) };
        if n > 8 && nodes == 1 {
            warnings.push(format!(
                "parallel.gpus = {n} on one node: the launch command starts {n} processes on this \
                 machine; for several nodes set parallel.nodes (multi-node launch commands follow)"
            ));
        }

        if jp.reduce_bucket.is_some() && !matches!(dist, Dist::Zero { .. }) {
            warnings.push(format!(
                "parallel.reduce_bucket_size is a DeepSpeed setting; strategy {} does not use it",
                strategy
            ));
        }
        if t.optimizer_in_backward {
            warnings.push(
                "training.optimizer_in_backward: this trainer has no optimizer step in backward \
                 (torchtune's optimizer_in_bwd); exported with a normal step, which keeps every \
                 gradient until the step: estimate without it to size the run"
                    .to_owned(),
            );
        }

        let adapter = job.adapter.clone();
        if let (Some(m), Targets::Names(names)) = (model, &adapter.targets)
            && method != Method::Full
        {
            let known: Vec<&str> = m.linears().map(|(_, l)| l.name.as_str()).collect();
            for n in names {
                if !known.iter().any(|k| k == n) {
                    warnings.push(format!(
                        "model.target_modules: `{n}` is not a Linear of {} (it has {}); PEFT will fail to find it",
                        m.model_type,
                        known.join(", ")
                    ));
                }
            }
        }
        if method == Method::Full && recipe.model.has_lora_fields() {
            warnings.push("model.lora_*: ignored for method full".to_owned());
        }
        if let Some(m) = model
            && m.max_position_embeddings > 0
            && t.max_seq_length > m.max_position_embeddings
        {
            warnings.push(format!(
                "training.max_seq_length = {} exceeds the model's max_position_embeddings = {}",
                t.max_seq_length, m.max_position_embeddings
            ));
        }
        let name = recipe
            .name
            .clone()
            .unwrap_or_else(|| recipe.model.base.clone());
        let output_dir = t
            .output_dir
            .clone()
            .unwrap_or_else(|| default_output_dir(recipe));
        Ok(Self {
            model,
            name,
            base: recipe.model.base.clone(),
            method,
            quant,
            adapter,
            t,
            precision: job.precision.into(),
            checkpointing: job.gradient_checkpointing,
            loss: job.loss_impl(),
            liger: job.liger,
            compile: job.compile,
            optimizer: job.optimizer.into(),
            activation_offload: job.activation_offload,
            adapted_layers: job.adapted_layers,
            grad_accum: job.grad_accum,
            dist,
            reduce_bucket: jp.reduce_bucket,
            nodes,
            output_dir,
            warnings,
        })
    }

    /// The Liger kernels a Trainer-based export turns on: the recipe's, or, for a
    /// `loss: fused` recipe without them, Liger's fused linear cross-entropy alone.
    pub(crate) fn liger_kernels(&self) -> Liger {
        if self.liger.any() {
            self.liger
        } else if self.loss == LossImpl::Fused {
            Liger {
                fused_linear_cross_entropy: true,
                ..Liger::default()
            }
        } else {
            Liger::default()
        }
    }

    /// Whether the GPUs span several nodes.
    pub(crate) const fn multi_node(&self) -> bool {
        self.nodes > 1
    }

    /// GPUs (processes) on each node.
    pub(crate) const fn gpus_per_node(&self) -> u64 {
        self.dist.gpus() / self.nodes
    }

    pub(crate) fn is_peft(&self) -> bool {
        matches!(self.method, Method::Lora | Method::Qlora)
    }

    /// PEFT's methods other than LoRA: only the TRL script writes their configs
    /// ([`crate::formats::trl`]); `format` writes LoRA adapters.
    pub(crate) fn require_lora(&self, format: &str) -> Result<(), ExportError> {
        if self.is_peft() && self.adapter.method != PeftKind::Lora {
            return Err(ExportError::field(
                "model.peft",
                format!(
                    "`{}`: the {format} export writes LoRA adapters; `--to trl` writes PEFT's \
                     config for this method",
                    self.adapter.method.as_str()
                ),
            ));
        }
        Ok(())
    }

    /// Whether the base is loaded by bitsandbytes in 4 bits.
    pub(crate) fn bnb4(&self) -> bool {
        matches!(
            self.quant,
            Quantization::Nf4 | Quantization::Nf4Dq | Quantization::Fp4 | Quantization::Fp4Dq
        )
    }

    pub(crate) fn int8(&self) -> bool {
        self.quant == Quantization::Int8
    }

    /// bitsandbytes `bnb_4bit_quant_type`.
    pub(crate) fn bnb_quant_type(&self) -> &'static str {
        match self.quant {
            Quantization::Fp4 | Quantization::Fp4Dq => "fp4",
            _ => "nf4",
        }
    }

    pub(crate) fn double_quant(&self) -> bool {
        matches!(self.quant, Quantization::Nf4Dq | Quantization::Fp4Dq)
    }

    /// The compute / load dtype as a torch name.
    pub(crate) fn torch_dtype(&self) -> &'static str {
        match self.precision {
            Precision::Fp16Mixed => "float16",
            Precision::Fp32 => "float32",
            // Full fine-tuning under autocast keeps fp32 master weights: load in fp32.
            Precision::Bf16Mixed if self.method == Method::Full => "float32",
            Precision::Bf16 | Precision::Bf16Mixed => "bfloat16",
        }
    }

    /// HF Trainer `bf16` / `fp16` flags (autocast; under DeepSpeed, its precision mode).
    pub(crate) fn amp(&self) -> (bool, bool) {
        match self.precision {
            Precision::Bf16Mixed => (true, false),
            // DeepSpeed has no pure-bf16 mode: `bf16` turns on its bf16 mode (16-bit params and
            // gradients, fp32 master partitions: what the estimate models, moro-core
            // `estimate/parallel.rs`); without it the engine trains in fp32.
            Precision::Bf16 if self.deepspeed() => (true, false),
            Precision::Fp16Mixed => (false, true),
            Precision::Bf16 | Precision::Fp32 => (false, false),
        }
    }

    /// Whether DeepSpeed runs the job (ZeRO-1/2/3).
    pub(crate) const fn deepspeed(&self) -> bool {
        matches!(self.dist, Dist::Zero { .. })
    }

    /// HF `attn_implementation`.
    pub(crate) fn hf_attention(&self) -> &'static str {
        match self.t.attention {
            Attention::Flash => "flash_attention_2",
            Attention::Sdpa => "sdpa",
            Attention::Eager => "eager",
        }
    }

    /// HF `optim` and `optim_args`: moro's names are HF's, except SGD with momentum, which HF
    /// spells `sgd` with `optim_args="momentum=0.9"`.
    pub(crate) fn hf_optim(&self) -> (&'static str, Option<&'static str>) {
        use moro_recipe::choices::Optimizer as O;
        match self.optimizer {
            O::SgdMomentum => ("sgd", Some("momentum=0.9")),
            o => (o.as_str(), None),
        }
    }

    /// LoRA target names, `all-linear` spelled out from the model (or the default projections).
    pub(crate) fn target_names(&self) -> (Vec<String>, bool) {
        match &self.adapter.targets {
            Targets::Names(v) => (v.clone(), false),
            Targets::AllLinear => match self.model {
                Some(m) => {
                    let mut names: Vec<String> = Vec::new();
                    for (_, l) in m.linears() {
                        if !names.contains(&l.name) {
                            names.push(l.name.clone());
                        }
                    }
                    (names, false)
                }
                None => (
                    DEFAULT_TARGETS.iter().map(|s| (*s).to_owned()).collect(),
                    true,
                ),
            },
        }
    }

    /// LoRA alpha: an integer when it is one (PEFT, axolotl and LLaMA-Factory type it `int`).
    pub(crate) fn alpha(&self) -> crate::Value {
        let a = self.adapter.alpha;
        if a.fract() == 0.0 && a.abs() < 1e15 {
            #[allow(clippy::cast_possible_truncation)]
            crate::Value::Int(a as i64)
        } else {
            crate::Value::Float(a)
        }
    }

    pub(crate) fn all_linear(&self) -> bool {
        self.adapter.targets == Targets::AllLinear
    }

    /// Warmup as transformers ≥ 5 takes it: `warmup_steps` below 1 is a ratio.
    pub(crate) fn warmup_steps(&self) -> Option<f64> {
        self.t.warmup_ratio.filter(|r| *r > 0.0 && *r < 1.0)
    }

    /// Dataset for exports: the recipe's, else the trainer's own example (with a warning).
    pub(crate) fn dataset_or(&self, example: &str, warnings: &mut Vec<String>) -> String {
        match &self.t.dataset {
            Some(d) => d.clone(),
            None => {
                warnings.push(format!(
                    "training.dataset is not set; the export trains on `{example}` (the trainer's example dataset)"
                ));
                example.to_owned()
            }
        }
    }

    /// A header: what made the file and from what.
    pub(crate) fn header(&self, what: &str) -> Vec<String> {
        vec![
            format!(
                "{what}, written by moro {} from recipe `{}`.",
                env!("CARGO_PKG_VERSION"),
                self.name
            ),
            "Edit the recipe and export again rather than editing this file.".to_owned(),
        ]
    }

    /// The decoder-layer class FSDP wraps, for the model types whose class name is known.
    pub(crate) fn decoder_layer_class(&self) -> Option<&'static str> {
        let m = self.model?;
        Some(match m.model_type.as_str() {
            "llama" => "LlamaDecoderLayer",
            "mistral" => "MistralDecoderLayer",
            "mixtral" => "MixtralDecoderLayer",
            "qwen2" => "Qwen2DecoderLayer",
            "qwen3" => "Qwen3DecoderLayer",
            "qwen3_moe" => "Qwen3MoeDecoderLayer",
            "gemma" => "GemmaDecoderLayer",
            "gemma2" => "Gemma2DecoderLayer",
            "gemma3_text" | "gemma3" => "Gemma3DecoderLayer",
            "phi3" => "Phi3DecoderLayer",
            "phi" => "PhiDecoderLayer",
            "olmo2" => "Olmo2DecoderLayer",
            "gpt_neox" => "GPTNeoXLayer",
            "gpt2" => "GPT2Block",
            "falcon" => "FalconDecoderLayer",
            "stablelm" => "StableLmDecoderLayer",
            _ => return None,
        })
    }
}

/// The output directory an export writes when the recipe names none:
/// `outputs/<model name>-<method>`, the name reduced to characters safe in a path.
#[must_use]
pub fn default_output_dir(recipe: &Recipe) -> String {
    let slug: String = recipe
        .model
        .base
        .rsplit('/')
        .next()
        .unwrap_or("model")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "outputs/{slug}-{}",
        recipe.model.effective_method().as_str()
    )
}
