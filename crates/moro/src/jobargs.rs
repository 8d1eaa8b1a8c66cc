//! The job flags shared by `estimate` and `run`: raw clap values, then the [`JobSettings`]
//! they say (layered over a recipe's, then resolved once).

use clap::Args;
use moro_core::job::{
    Attention, JobSettings, LossImpl, Method, Offload, Optimizer, Padding, PeftKind, Precision,
    Quantization, Sharding, Stack, Targets,
};

fn parse_peft(s: &str) -> Result<PeftKind, String> {
    PeftKind::parse(s)
        .ok_or_else(|| format!("unknown PEFT method `{s}`; use lora, ia3, vera, adalora, loha, oft, ln-tuning, prompt-tuning, adapter or adapter-v2"))
}

fn parse_method(s: &str) -> Result<Method, String> {
    Method::ALL
        .into_iter()
        .find(|m| m.as_str() == s.to_ascii_lowercase())
        .ok_or_else(|| format!("unknown method `{s}`; use full, lora, qlora or inference"))
}

pub(crate) fn parse_quantization(s: &str) -> Result<Quantization, String> {
    let l = s.to_ascii_lowercase();
    Quantization::ALL
        .into_iter()
        .find(|q| q.as_str() == l || (l == "gptq" && *q == Quantization::Gptq4))
        .ok_or_else(|| {
            format!(
                "unknown quantization `{s}`; use none, int8, nf4, nf4-dq, fp4, fp4-dq or gptq-int4"
            )
        })
}

pub(crate) fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    Optimizer::parse(s).ok_or_else(|| {
        format!(
            "unknown optimizer `{s}`; use one of {}",
            Optimizer::ALL
                .iter()
                .map(|o| o.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

pub(crate) fn parse_precision(s: &str) -> Result<Precision, String> {
    let l = s.to_ascii_lowercase().replace('_', "-");
    let l = match l.as_str() {
        "bf16-true" | "bfloat16" => "bf16".to_owned(),
        "32-true" | "float32" => "fp32".to_owned(),
        "fp16" | "16-mixed" => "fp16-mixed".to_owned(),
        _ => l,
    };
    Precision::ALL
        .into_iter()
        .find(|p| p.as_str() == l)
        .ok_or_else(|| format!("unknown precision `{s}`; use bf16, bf16-mixed, fp16-mixed or fp32"))
}

pub(crate) fn parse_attention(s: &str) -> Result<Attention, String> {
    match s.to_ascii_lowercase().as_str() {
        "flash" | "flash_attention_2" | "fa2" | "flash-attention" => Ok(Attention::Flash),
        "sdpa" => Ok(Attention::Sdpa),
        "eager" => Ok(Attention::Eager),
        _ => Err(format!("unknown attention `{s}`; use flash, sdpa or eager")),
    }
}

pub(crate) fn parse_stack(s: &str) -> Result<Stack, String> {
    Stack::ALL
        .into_iter()
        .find(|x| x.as_str() == s.to_ascii_lowercase())
        .ok_or_else(|| format!("unknown stack `{s}`; use hf, trl, litgpt or torchtune"))
}

pub(crate) fn parse_loss(s: &str) -> Result<LossImpl, String> {
    match s.to_ascii_lowercase().as_str() {
        "standard" | "hf" => Ok(LossImpl::Standard),
        "standard-legacy" => Ok(LossImpl::StandardLegacy),
        "standard-no-upcast" => Ok(LossImpl::StandardNoUpcast),
        "chunked-nll" | "chunked_nll" => Ok(LossImpl::ChunkedNll),
        "chunked" => Ok(LossImpl::Chunked),
        "fused" | "liger" | "cce" => Ok(LossImpl::Fused),
        _ => Err(format!(
            "unknown loss `{s}`; use standard, chunked-nll, chunked or fused"
        )),
    }
}

pub(crate) fn parse_sharding(s: &str) -> Result<Sharding, String> {
    Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
        "none" | "ddp" => Sharding::None,
        "zero1" => Sharding::Zero1,
        "zero2" => Sharding::Zero2,
        "zero3" => Sharding::Zero3,
        "fsdp" | "fsdp_full_shard" | "full_shard" => Sharding::FsdpFullShard,
        "fsdp_shard_grad_op" | "shard_grad_op" => Sharding::FsdpShardGradOp,
        "fsdp_hybrid_shard" | "hybrid_shard" => Sharding::FsdpHybridShard,
        _ => {
            return Err(format!(
                "unknown strategy `{s}`; use none, zero1, zero2, zero3, fsdp_full_shard, \
                 fsdp_shard_grad_op or fsdp_hybrid_shard"
            ));
        }
    })
}

fn parse_offload(s: &str) -> Result<Offload, String> {
    match s.to_ascii_lowercase().replace('-', "_").as_str() {
        "none" => Ok(Offload::None),
        "optimizer" => Ok(Offload::Optimizer),
        "optimizer_and_params" | "all" => Ok(Offload::OptimizerAndParams),
        _ => Err(format!(
            "unknown offload `{s}`; use none, optimizer or optimizer_and_params"
        )),
    }
}

fn parse_count(s: &str) -> Result<u64, String> {
    let v: i128 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number"))?;
    if v <= 0 {
        return Err(format!("must be at least 1, got {v}"));
    }
    u64::try_from(v).map_err(|_| format!("`{s}` is too large"))
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
    /// Base weights: none, int8, nf4, nf4-dq, fp4, fp4-dq, gptq-int4 [qlora default: nf4-dq].
    #[arg(long, value_parser = parse_quantization, help_heading = "Job")]
    pub(crate) quantization: Option<Quantization>,
    /// PEFT method of a lora/qlora job: lora; PEFT's ia3, vera, loha and oft (r = --lora-rank), adalora
    /// (init_r = --lora-rank), ln-tuning, prompt-tuning; or lit-gpt's adapter / adapter-v2
    /// (LLaMA-Adapter; implies --stack litgpt) [default: lora].
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
    /// Prompt tuning's virtual tokens (PEFT num_virtual_tokens) [default: 20].
    #[arg(long, value_parser = parse_count, help_heading = "LoRA")]
    pub(crate) virtual_tokens: Option<u64>,
    /// Micro-batch per GPU (inference: concurrent sequences) [default: 1].
    #[arg(long, visible_alias = "batch-size", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) micro_batch_size: Option<u64>,
    /// Sequence length in tokens (inference: prompt + generated) [default: 2048].
    #[arg(long, visible_alias = "max-seq-length", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) seq_len: Option<u64>,
    /// Gradient accumulation steps [default: 1].
    #[arg(long, visible_alias = "gradient-accumulation-steps", value_parser = parse_count, help_heading = "Shape")]
    pub(crate) grad_accum: Option<u64>,
    /// Batches are padded to --seq-len with an attention mask (default: packed).
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
    /// Training stack: hf, trl, litgpt, torchtune [default: hf].
    #[arg(long, value_parser = parse_stack, help_heading = "Training")]
    pub(crate) stack: Option<Stack>,
    /// Loss: standard, chunked-nll, chunked, fused [default: the stack's].
    #[arg(long, value_parser = parse_loss, help_heading = "Training")]
    pub(crate) loss: Option<LossImpl>,
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
}

impl JobArgs {
    /// The settings these flags say; what they leave out is left to the recipe, then to
    /// [`JobSettings::resolve`].
    pub(crate) fn settings(&self) -> JobSettings {
        let names = |v: &Option<Vec<String>>| {
            v.as_ref().map(|t| {
                if t.len() == 1 && t[0].trim().eq_ignore_ascii_case("all-linear") {
                    Targets::AllLinear
                } else {
                    Targets::Names(t.iter().map(|s| s.trim().to_owned()).collect())
                }
            })
        };
        JobSettings {
            method: self.method,
            quantization: self.quantization,
            peft: self.peft,
            lora_rank: self.lora_rank,
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            target_modules: names(&self.target_modules),
            dora: self.dora.then_some(true),
            feedforward_modules: self
                .feedforward_modules
                .as_ref()
                .map(|t| Targets::Names(t.iter().map(|s| s.trim().to_owned()).collect())),
            virtual_tokens: self.virtual_tokens,
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
            versions: None,
        }
    }
}
