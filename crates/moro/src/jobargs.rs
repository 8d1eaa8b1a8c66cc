//! The job flags shared by `estimate` and `run`: raw clap values, then the [`JobSettings`]
//! they say (layered over a recipe's, then resolved once).

use clap::Args;
use moro_core::job::{
    Attention, FsdpApi, JobSettings, Liger, LossImpl, Method, Offload, Optimizer, Padding,
    PeftKind, Precision, Quantization, Sharding, Stack, Targets, VisionTraining,
};

use moro_recipe::choices;

/// A clap value parser over one of moro.yaml's choices: the same spellings and aliases as the
/// recipe (case-insensitive here), converted to the engine's enum.
macro_rules! choice_parser {
    ($(#[$m:meta])* $vis:vis fn $name:ident($what:literal) -> $choice:ident => $core:ty) => {
        $(#[$m])*
        $vis fn $name(s: &str) -> Result<$core, String> {
            choices::$choice::parse(&s.trim().to_ascii_lowercase())
                .map(Into::into)
                .ok_or_else(|| {
                    format!(
                        "unknown {} `{s}`; use {}",
                        $what,
                        choices::$choice::names()
                    )
                })
        }
    };
}

choice_parser!(fn parse_peft_name("PEFT method") -> Peft => PeftKind);

/// `--peft`, with a pointer to `--dora` for DoRA (LoRA with magnitude vectors, PEFT's
/// `use_dora`, not a method of its own).
fn parse_peft(s: &str) -> Result<PeftKind, String> {
    parse_peft_name(s).map_err(|e| {
        if s.trim().eq_ignore_ascii_case("dora") {
            format!("{e} (DoRA is LoRA with magnitude vectors: `--peft lora --dora`)")
        } else {
            e
        }
    })
}
choice_parser!(fn parse_method("method") -> Method => Method);
choice_parser!(pub(crate) fn parse_quantization("quantization") -> Quantization => Quantization);
choice_parser!(pub(crate) fn parse_optimizer("optimizer") -> Optimizer => Optimizer);
choice_parser!(pub(crate) fn parse_precision("precision") -> Precision => Precision);
choice_parser!(pub(crate) fn parse_attention("attention") -> Attention => Attention);
choice_parser!(pub(crate) fn parse_stack("stack") -> Stack => Stack);
choice_parser!(pub(crate) fn parse_loss("loss") -> Loss => LossImpl);
choice_parser!(pub(crate) fn parse_sharding("strategy") -> Strategy => Sharding);
choice_parser!(fn parse_offload("offload") -> Offload => Offload);
choice_parser!(fn parse_vision("vision setting") -> Vision => VisionTraining);
choice_parser!(pub(crate) fn parse_backend("device backend") -> Backend => moro_core::estimate::Backend);

fn parse_whole(s: &str) -> Result<u64, String> {
    let v: i128 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    if v < 0 {
        return Err(format!("must be 0 or more, got {v}"));
    }
    u64::try_from(v).map_err(|_| format!("`{s}` is too large"))
}

pub(crate) fn parse_count(s: &str) -> Result<u64, String> {
    let v: i128 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    if v <= 0 {
        return Err(format!("must be at least 1, got {v}"));
    }
    u64::try_from(v).map_err(|_| format!("`{s}` is too large"))
}

fn parse_fsdp_version(s: &str) -> Result<FsdpApi, String> {
    s.trim()
        .parse()
        .ok()
        .and_then(FsdpApi::from_version)
        .ok_or_else(|| {
            format!(
                "unknown FSDP version `{}`; use 1 (FullyShardedDataParallel) or 2 (fully_shard)",
                s.trim()
            )
        })
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if !v.is_finite() {
        return Err(format!("`{s}` is not a finite number"));
    }
    Ok(v)
}

/// Flags describing a job.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct JobArgs {
    /// Method: full, lora, qlora or inference [default: lora; qlora with --quantization].
    #[arg(long, value_parser = parse_method, help_heading = "Job")]
    pub(crate) method: Option<Method>,
    /// Base weights: none, int8, nf4, nf4-dq, fp4, fp4-dq, gptq-int4, mxfp4 (gpt-oss
    /// inference), mlx-4bit, mlx-8bit, … (MLX's, on --stack mlx) [qlora default: nf4-dq,
    /// mlx-4bit on mlx; gpt-oss inference: mxfp4].
    #[arg(long, value_parser = parse_quantization, help_heading = "Job")]
    pub(crate) quantization: Option<Quantization>,
    /// PEFT method of a lora/qlora job: lora; PEFT's ia3, vera, loha, lokr and oft (r =
    /// --lora-rank), adalora (init_r = --lora-rank), boft (--boft-block-size), ln-tuning,
    /// prompt-tuning, prefix-tuning; or lit-gpt's adapter / adapter-v2 (LLaMA-Adapter; implies
    /// --stack litgpt) [default: lora].
    #[arg(long, value_parser = parse_peft, help_heading = "Job")]
    pub(crate) peft: Option<PeftKind>,
    /// LoRA rank [default: 16].
    #[arg(long, value_parser = parse_count, help_heading = "LoRA")]
    pub(crate) lora_rank: Option<u64>,
    /// LoRA alpha [default: 2 × rank].
    #[arg(long, value_parser = parse_fraction, help_heading = "LoRA")]
    pub(crate) lora_alpha: Option<f64>,
    /// LoRA dropout [default: 0.05].
    #[arg(long, value_parser = parse_fraction, help_heading = "LoRA")]
    pub(crate) lora_dropout: Option<f64>,
    /// Target modules: comma-separated names, or all-linear [default: the 7 projections].
    #[arg(long, value_delimiter = ',', help_heading = "LoRA")]
    pub(crate) target_modules: Option<Vec<String>>,
    /// Weight-decomposed LoRA (DoRA).
    #[arg(long, help_heading = "LoRA")]
    pub(crate) dora: bool,
    /// IA³'s feedforward modules (their input is scaled), comma-separated [default: the MLP's
    /// down projection, as PEFT].
    #[arg(long, value_delimiter = ',', help_heading = "LoRA")]
    pub(crate) feedforward_modules: Option<Vec<String>>,
    /// Prompt and prefix tuning's virtual tokens (PEFT num_virtual_tokens) [default: 20].
    #[arg(long, value_parser = parse_count, help_heading = "LoRA")]
    pub(crate) virtual_tokens: Option<u64>,
    /// LoKr's decompose_factor (PEFT) [default: -1, factors near the square root].
    #[arg(long, value_parser = parse_count, help_heading = "LoRA")]
    pub(crate) decompose_factor: Option<u64>,
    /// BOFT's boft_block_size (PEFT) [default: 4].
    #[arg(long, value_parser = parse_count, help_heading = "LoRA")]
    pub(crate) boft_block_size: Option<u64>,
    /// BOFT's boft_n_butterfly_factor (PEFT) [default: 1].
    #[arg(long, value_parser = parse_count, help_heading = "LoRA")]
    pub(crate) boft_n_butterfly_factor: Option<u64>,
    /// Micro-batch per GPU (inference: concurrent sequences) [default: 1].
    #[arg(long, visible_alias = "batch-size", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) micro_batch_size: Option<u64>,
    /// Sequence length in tokens (inference: prompt + generated) [default: 2048].
    #[arg(long, visible_alias = "max-seq-length", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) seq_len: Option<u64>,
    /// Target tokens per sample of an encoder-decoder model (T5, mT5): the decoder's labels;
    /// --seq-len is the encoder's [default: --seq-len].
    #[arg(long, visible_alias = "max-target-length", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) target_len: Option<u64>,
    /// Inference: of --seq-len, the tokens generated one at a time after the prompt
    /// (transformers' `max_new_tokens`) [default: none, the whole context prefilled at once].
    #[arg(long, visible_alias = "new-tokens", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) max_new_tokens: Option<u64>,
    /// Images per sample, vision-language models [default: 1 there, else 0].
    #[arg(long, value_parser = parse_whole, help_heading = "Shape")]
    pub(crate) images_per_sample: Option<u64>,
    /// Image size before the processor resizes it, WIDTHxHEIGHT [default: the processor's
    /// own square; 1024x1024 for Qwen-VL's dynamic resolution].
    #[arg(long, value_parser = moro_core::vision::parse_image_size, help_heading = "Shape")]
    pub(crate) image_size: Option<(u64, u64)>,
    /// Gemma 3's pan-and-scan: an image of an exaggerated aspect ratio also goes in as 2 to 4
    /// crops, each encoded like an image (`do_pan_and_scan=True`) [default: off].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help_heading = "Shape")]
    pub(crate) pan_and_scan: Option<bool>,
    /// Vision tower and projector: frozen, adapted (LoRA targets reach them) or trained
    /// (full fine-tuning) [default: frozen].
    #[arg(long, value_parser = parse_vision, help_heading = "Training")]
    pub(crate) vision: Option<VisionTraining>,
    /// Gradient accumulation steps [default: 1].
    #[arg(long, visible_alias = "gradient-accumulation-steps", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) grad_accum: Option<u64>,
    /// Batches are padded with an attention mask, to --seq-len or each to its longest sample
    /// (--seq-len the longest) [default: packed].
    #[arg(long, help_heading = "Shape")]
    pub(crate) padded: bool,
    /// Optimizer, as HF Trainer's `optim` [default: adamw_torch_fused].
    #[arg(long, value_parser = parse_optimizer, help_heading = "Training")]
    pub(crate) optimizer: Option<Optimizer>,
    /// Gradient checkpointing (`--gradient-checkpointing` or `=false`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help_heading = "Training")]
    pub(crate) gradient_checkpointing: Option<bool>,
    /// Step each parameter in backward and free its gradient at once (torchtune's
    /// `optimizer_in_bwd`); needs --grad-accum 1.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help_heading = "Training")]
    pub(crate) optimizer_in_backward: Option<bool>,
    /// Attention: flash, sdpa or eager [default: sdpa]; with --stack litgpt, eager is SDPA's
    /// math kernel.
    #[arg(long, value_parser = parse_attention, help_heading = "Training")]
    pub(crate) attention: Option<Attention>,
    /// Precision: bf16, bf16-mixed, fp16-mixed, fp32 [default: bf16-mixed for LoRA/QLoRA,
    /// bf16 for full fine-tuning and inference].
    #[arg(long, value_parser = parse_precision, help_heading = "Training")]
    pub(crate) precision: Option<Precision>,
    /// Training stack: hf, trl, litgpt, torchtune, unsloth, mlx [default: hf].
    #[arg(long, value_parser = parse_stack, help_heading = "Training")]
    pub(crate) stack: Option<Stack>,
    /// Loss: standard, chunked-nll, chunked, fused [default: the stack's].
    #[arg(long, value_parser = parse_loss, help_heading = "Training")]
    pub(crate) loss: Option<LossImpl>,
    /// Liger Kernel, as `use_liger_kernel=True`: every kernel Liger has for the model
    /// (RMSNorm, SwiGLU/GeGLU, RoPE, fused linear cross-entropy); `--liger=false` turns a
    /// recipe's off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help_heading = "Training")]
    pub(crate) liger: Option<bool>,
    /// Only these Liger kernels, comma-separated: rms_norm, swiglu, rope,
    /// fused_linear_cross_entropy (axolotl's `liger_*` keys).
    #[arg(long, value_parser = parse_liger_kernels, conflicts_with = "liger", help_heading = "Training")]
    pub(crate) liger_kernels: Option<Liger>,
    /// torch.compile the model, as the HF Trainer's `torch_compile` does (traced for Llama,
    /// Mistral, Qwen2/3, Phi-3 and Gemma 2 layers: docs/torch-compile.md).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help_heading = "Training")]
    pub(crate) compile: Option<bool>,
    /// Offload the checkpointed activations to host memory, as torchtune's
    /// `enable_activation_offloading` does (needs gradient checkpointing).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", help_heading = "Training")]
    pub(crate) activation_offload: Option<bool>,
    /// How many of the last decoder layers train, or `all`: mlx_lm's `--num-layers`
    /// [default: 16 on the mlx stack; other stacks train every layer].
    #[arg(long, value_parser = parse_layer_count, help_heading = "Training")]
    pub(crate) num_layers: Option<LayerCount>,
    /// GPUs in all (data × tensor parallel) [default: the count --hardware names, else 1].
    #[arg(long, value_parser = parse_count, help_heading = "Parallel")]
    pub(crate) gpus: Option<u64>,
    /// Sharding strategy: none, zero1, zero2, zero3, fsdp_full_shard, fsdp_shard_grad_op,
    /// fsdp_hybrid_shard.
    #[arg(long, value_parser = parse_sharding, help_heading = "Parallel")]
    pub(crate) strategy: Option<Sharding>,
    /// Tensor-parallel degree.
    #[arg(long, value_parser = parse_count, help_heading = "Parallel")]
    pub(crate) tensor_parallel: Option<u64>,
    /// CPU offload: none, optimizer, optimizer_and_params.
    #[arg(long, value_parser = parse_offload, help_heading = "Parallel")]
    pub(crate) offload: Option<Offload>,
    /// Nodes the GPUs span; divides the GPUs (fsdp_hybrid_shard shards within a node)
    /// [default: 1].
    #[arg(long, value_parser = parse_count, help_heading = "Parallel")]
    pub(crate) nodes: Option<u64>,
    /// DeepSpeed `reduce_bucket_size` in elements, for a config of your own (ZeRO-1/2 hold
    /// two such buffers during backward) [default: "auto", hidden_size²].
    #[arg(long, value_parser = parse_count, help_heading = "Parallel")]
    pub(crate) reduce_bucket_size: Option<u64>,
    /// FSDP implementation, as accelerate's `fsdp_version`: 1 (FullyShardedDataParallel) or
    /// 2 (fully_shard) [default: the stack's: 1 for hf and trl, 2 for torchtune].
    #[arg(long, value_parser = parse_fsdp_version, help_heading = "Parallel")]
    pub(crate) fsdp_version: Option<FsdpApi>,
}

impl JobArgs {
    /// The settings these flags say; what they leave out is left to the recipe, then to
    /// [`JobSettings::resolve`].
    pub(crate) fn settings(&self) -> JobSettings {
        let names =
            |t: &Vec<String>| Targets::Names(t.iter().map(|s| s.trim().to_owned()).collect());
        JobSettings {
            method: self.method,
            quantization: self.quantization,
            peft: self.peft,
            lora_rank: self.lora_rank,
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            target_modules: self.target_modules.as_ref().map(|t| {
                if t.len() == 1 && t[0].trim().eq_ignore_ascii_case("all-linear") {
                    Targets::AllLinear
                } else {
                    names(t)
                }
            }),
            dora: self.dora.then_some(true),
            feedforward_modules: self.feedforward_modules.as_ref().map(names),
            virtual_tokens: self.virtual_tokens,
            decompose_factor: self.decompose_factor,
            boft_block_size: self.boft_block_size,
            boft_n_butterfly_factor: self.boft_n_butterfly_factor,
            micro_batch_size: self.micro_batch_size,
            seq_len: self.seq_len,
            grad_accum: self.grad_accum,
            padding: self.padded.then_some(Padding::Padded),
            optimizer: self.optimizer,
            gradient_checkpointing: self.gradient_checkpointing,
            optimizer_in_backward: self.optimizer_in_backward,
            attention: self.attention,
            precision: self.precision,
            stack: self.stack,
            loss: self.loss,
            kv_dtype: None,
            gpus: self.gpus,
            tensor_parallel: self.tensor_parallel,
            pipeline_parallel: None,
            sharding: self.strategy,
            offload: self.offload,
            nodes: self.nodes,
            reduce_bucket: self.reduce_bucket_size,
            fsdp_version: self.fsdp_version,
            versions: None,
            images_per_sample: self.images_per_sample,
            image_size: self.image_size,
            vision: self.vision,
            liger: match (self.liger_kernels, self.liger) {
                (Some(kernels), _) => Some(kernels),
                (None, Some(true)) => Some(Liger::ALL),
                (None, Some(false)) => Some(Liger::default()),
                (None, None) => None,
            },
            compile: self.compile,
            pan_and_scan: self.pan_and_scan,
            activation_offload: self.activation_offload,
            adapted_layers: self.num_layers.map(|n| n.0),
            target_len: self.target_len,
            new_tokens: self.max_new_tokens,
        }
    }
}

/// `--num-layers`: a count of layers, or `all` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerCount(pub(crate) Option<u64>);

fn parse_layer_count(s: &str) -> Result<LayerCount, String> {
    if s.trim().eq_ignore_ascii_case("all") || s.trim() == "-1" {
        return Ok(LayerCount(None));
    }
    parse_count(s).map(|n| LayerCount(Some(n)))
}

/// `--liger-kernels rms_norm,swiglu,...`.
fn parse_liger_kernels(s: &str) -> Result<Liger, String> {
    let names: Vec<&str> = s.split(',').filter(|n| !n.trim().is_empty()).collect();
    Liger::from_names(&names)
}
