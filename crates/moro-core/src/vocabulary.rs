//! One vocabulary per named choice (method, quantization, optimizer, ...): the canonical
//! spelling, its accepted aliases and a doc line each, declared once.
//!
//! The command line (case-insensitive there), moro.yaml, its JSON schema, the messages that
//! list the choices and the engine's own names ([`crate::job`]'s `as_str`) all read these
//! tables. Each choice converts to and from its engine enum with an exhaustive `match`, so
//! a variant added to the engine fails to compile here until its spelling is given. The
//! spelling is the file format's, not serde's name for the engine enum (the optimizer is
//! written as the HF Trainer's `optim`, e.g. `adamw_8bit`).

use std::fmt;

use crate::job as core;
use serde::{Deserialize, Serialize};

/// Declares a file-format enum, its spellings, and the conversions to the engine's enum.
macro_rules! choice {
    (
        $(#[$meta:meta])*
        $name:ident => $core:ty {
            $(
                $(#[$vmeta:meta])*
                $var:ident = $text:literal $(| $alias:literal)* => $cvar:ident
            ),+ $(,)?
        }
    ) => {
        choice! {
            $(#[$meta])*
            $name {
                $(
                    $(#[$vmeta])*
                    $var = $text $(| $alias)*
                ),+
            }
        }

        impl From<$name> for $core {
            fn from(v: $name) -> Self {
                match v {
                    $($name::$var => <$core>::$cvar,)+
                }
            }
        }

        impl From<$core> for $name {
            fn from(v: $core) -> Self {
                match v {
                    $(<$core>::$cvar => Self::$var,)+
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        $name:ident {
            $(
                $(#[$vmeta:meta])*
                $var:ident = $text:literal $(| $alias:literal)*
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $text $(, alias = $alias)*)]
                $var,
            )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$var),+];

            /// The spelling in moro.yaml.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$var => $text,)+
                }
            }

            /// Parses the spelling in moro.yaml (or one of its accepted aliases). The same
            /// table is the command line's (case-insensitive there) and the schema's.
            #[must_use]
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text $(| $alias)* => Some(Self::$var),)+
                    _ => None,
                }
            }

            /// The canonical spellings, for messages: `a, b or c`.
            #[must_use]
            pub fn names() -> String {
                let all: &[&str] = &[$($text),+];
                match all.split_last() {
                    Some((last, [])) => (*last).to_owned(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

choice! {
    /// Training (or inference) method (`model.method`).
    Method => core::Method {
        /// All parameters trainable.
        Full = "full" => Full,
        /// Adapters (LoRA unless `peft` says otherwise) on a frozen 16/32-bit base.
        Lora = "lora" => Adapters,
        /// Adapters on a frozen quantized base.
        Qlora = "qlora" => QuantizedAdapters,
        /// Forward only, with a KV cache.
        Inference = "inference" => Inference,
    }
}

choice! {
    /// The parameter-efficient method of a `lora`/`qlora` job (`model.peft`).
    Peft => core::PeftKind {
        /// LoRA (PEFT `LoraConfig`).
        Lora = "lora" | "qlora" => Lora,
        /// PEFT's IA³ (`IA3Config`): a vector scaling each target's output, or a
        /// feedforward module's input.
        Ia3 = "ia3" => Ia3,
        /// PEFT's VeRA (`VeraConfig`): shared frozen random projections, trainable vectors.
        Vera = "vera" => Vera,
        /// PEFT's AdaLoRA (`AdaLoraConfig`), `lora_rank` is its `init_r`.
        AdaLora = "adalora" => AdaLora,
        /// PEFT's LoHa (`LoHaConfig`).
        LoHa = "loha" => LoHa,
        /// PEFT's LoKr (`LoKrConfig`), with `decompose_factor`.
        LoKr = "lokr" => LoKr,
        /// PEFT's OFT (`OFTConfig`), `lora_rank` is its number of blocks.
        Oft = "oft" => Oft,
        /// PEFT's BOFT (`BOFTConfig`), with `boft_block_size` and
        /// `boft_n_butterfly_factor`.
        Boft = "boft" => Boft,
        /// PEFT's LN tuning (`LNTuningConfig`).
        LnTuning = "ln-tuning" | "ln_tuning" => LnTuning,
        /// PEFT's prompt tuning (`PromptTuningConfig`), `virtual_tokens` long.
        PromptTuning = "prompt-tuning" | "prompt_tuning" => PromptTuning,
        /// PEFT's prefix tuning (`PrefixTuningConfig`), `virtual_tokens` long.
        PrefixTuning = "prefix-tuning" | "prefix_tuning" => PrefixTuning,
        /// lit-gpt's LLaMA-Adapter (`stack: litgpt`).
        LlamaAdapter = "adapter" | "adapter-v1" | "llama-adapter" => LlamaAdapter,
        /// lit-gpt's LLaMA-Adapter v2 (`stack: litgpt`).
        AdapterV2 = "adapter-v2" | "adapter_v2" | "llama-adapter-v2" => AdapterV2,
    }
}

choice! {
    /// What trains in a vision-language model's tower and projector (`training.vision`).
    Vision => core::VisionTraining {
        /// Frozen, no adapters (the usual default).
        Frozen = "frozen" => Frozen,
        /// The LoRA targets adapt the tower's matching Linears too.
        Adapted = "adapted" => Adapted,
        /// Tower and projector weights train (full fine-tuning).
        Trained = "trained" => Trained,
    }
}

choice! {
    /// Storage of the frozen base weights (`model.quantization`).
    Quantization => core::Quantization {
        /// The load dtype (no quantization).
        None = "none" => None,
        /// bitsandbytes LLM.int8 (`load_in_8bit`).
        Int8 = "int8" => Int8,
        /// bitsandbytes 4-bit NormalFloat (`bnb_4bit_quant_type="nf4"`).
        Nf4 = "nf4" => Nf4,
        /// NF4 with double quantization (`bnb_4bit_use_double_quant=True`).
        Nf4Dq = "nf4-dq" => Nf4Dq,
        /// bitsandbytes 4-bit float.
        Fp4 = "fp4" => Fp4,
        /// FP4 with double quantization.
        Fp4Dq = "fp4-dq" => Fp4Dq,
        /// A GPTQ/AWQ int4 checkpoint (group size 128).
        GptqInt4 = "gptq-int4" | "gptq" => Gptq4,
        /// gpt-oss's MXFP4 experts, kept for inference.
        Mxfp4 = "mxfp4" => Mxfp4,
        /// MLX affine, 4 bits, groups of 64 (`mlx_lm.convert -q`, `mlx-community/*-4bit`).
        Mlx4 = "mlx-4bit" | "mlx-4bit-g64" => Mlx4,
        /// MLX affine, 8 bits, groups of 64.
        Mlx8 = "mlx-8bit" | "mlx-8bit-g64" => Mlx8,
        /// MLX affine, 2 bits, groups of 64.
        Mlx2 = "mlx-2bit" => Mlx2,
        /// MLX affine, 3 bits, groups of 64.
        Mlx3 = "mlx-3bit" => Mlx3,
        /// MLX affine, 5 bits, groups of 64.
        Mlx5 = "mlx-5bit" => Mlx5,
        /// MLX affine, 6 bits, groups of 64.
        Mlx6 = "mlx-6bit" => Mlx6,
        /// MLX affine, 4 bits, groups of 32.
        Mlx4G32 = "mlx-4bit-g32" => Mlx4G32,
        /// MLX affine, 8 bits, groups of 32.
        Mlx8G32 = "mlx-8bit-g32" => Mlx8G32,
    }
}

choice! {
    /// Optimizer, named as the HF Trainer's `optim` (`training.optimizer`).
    Optimizer => core::Optimizer {
        /// `torch.optim.AdamW`, foreach implementation.
        AdamwTorch = "adamw_torch" | "adamw" | "adamw_hf" | "adamw_foreach" => AdamwTorch,
        /// `torch.optim.AdamW(fused=True)`.
        AdamwTorchFused = "adamw_torch_fused" | "adamw_fused" => AdamwTorchFused,
        /// bitsandbytes 8-bit AdamW.
        Adamw8bit = "adamw_8bit" | "adamw_bnb_8bit" | "adam8bit" | "adamw8bit" => Adamw8bit,
        /// bitsandbytes paged 8-bit AdamW.
        PagedAdamw8bit = "paged_adamw_8bit" | "paged_adam_8bit" => PagedAdamw8bit,
        /// bitsandbytes paged 32-bit AdamW.
        PagedAdamw32bit = "paged_adamw_32bit" | "paged_adamw" | "paged_adam_32bit" => PagedAdamw32bit,
        /// HF Adafactor.
        Adafactor = "adafactor" => Adafactor,
        /// bitsandbytes Lion, 32-bit.
        Lion32bit = "lion_32bit" | "lion" => Lion32bit,
        /// bitsandbytes Lion, 8-bit.
        Lion8bit = "lion_8bit" => Lion8bit,
        /// SGD without momentum.
        Sgd = "sgd" => Sgd,
        /// SGD with momentum.
        SgdMomentum = "sgd_momentum" => SgdMomentum,
    }
}

choice! {
    /// Numeric precision of weights and compute (`training.precision`).
    Precision => core::Precision {
        /// Weights and trainable weights in bf16, no autocast.
        Bf16 = "bf16" | "bf16-true" | "bfloat16" => Bf16,
        /// fp32 trainable weights under bf16 autocast (HF Trainer `bf16=True`).
        Bf16Mixed = "bf16-mixed" | "bf16_mixed" => Bf16Mixed,
        /// fp32 trainable weights under fp16 autocast (HF Trainer `fp16=True`).
        Fp16Mixed = "fp16-mixed" | "fp16_mixed" | "fp16" | "16-mixed" => Fp16Mixed,
        /// Everything fp32.
        Fp32 = "fp32" | "32-true" | "float32" => Fp32,
    }
}

choice! {
    /// Attention implementation (`training.attention`).
    Attention => core::Attention {
        /// FlashAttention-2 (HF `attn_implementation="flash_attention_2"`).
        Flash = "flash" | "flash_attention_2" | "fa2" | "flash-attention" => Flash,
        /// PyTorch scaled_dot_product_attention.
        Sdpa = "sdpa" => Sdpa,
        /// Eager attention (materializes the attention probabilities).
        Eager = "eager" => Eager,
    }
}

choice! {
    /// The training stack, since libraries allocate differently (`training.stack`).
    Stack => core::Stack {
        /// transformers Trainer + PEFT + bitsandbytes.
        Hf = "hf" => Hf,
        /// TRL SFTTrainer.
        Trl = "trl" => Trl,
        /// Lightning litgpt.
        Litgpt = "litgpt" => Litgpt,
        /// torchtune.
        Torchtune = "torchtune" => Torchtune,
        /// Unsloth's FastLanguageModel on TRL.
        Unsloth = "unsloth" => Unsloth,
        /// Apple's MLX, `mlx_lm.lora`.
        Mlx = "mlx" | "mlx-lm" | "mlx_lm" => Mlx,
    }
}

choice! {
    /// How the loss is computed (`training.loss`).
    Loss => core::LossImpl {
        /// Full logits + cross-entropy (transformers `ForCausalLMLoss`).
        Standard = "standard" | "hf" => Standard,
        /// As `standard`, plus the fp32 `shift_logits.contiguous()` copy of transformers
        /// 4.46–4.48.
        StandardLegacy = "standard-legacy" => StandardLegacy,
        StandardNoUpcast = "standard-no-upcast" => StandardNoUpcast,
        /// TRL chunked NLL (lm_head in checkpointed chunks).
        ChunkedNll = "chunked-nll" | "chunked_nll" => ChunkedNll,
        /// litgpt / torchtune chunked cross-entropy.
        Chunked = "chunked" => Chunked,
        /// Fused linear cross-entropy (Liger, cut-cross-entropy).
        Fused = "fused" | "liger" | "cce" => Fused,
    }
}

choice! {
    /// PyTorch's device backend (`hardware.device`, `--device`).
    Backend => crate::estimate::Backend {
        /// CUDA (ROCm builds name their GPUs `cuda` too).
        Cuda = "cuda" => Cuda,
        /// Apple's Metal Performance Shaders (`device="mps"`).
        Mps = "mps" => Mps,
    }
}

choice! {
    /// Sharding strategy over the data-parallel GPUs (`parallel.strategy`).
    Strategy => core::Sharding {
        /// Plain DDP (or one GPU).
        None = "none" | "ddp" => None,
        /// DeepSpeed ZeRO-1: optimizer states sharded.
        Zero1 = "zero1" => Zero1,
        /// DeepSpeed ZeRO-2: optimizer states and gradients sharded.
        Zero2 = "zero2" => Zero2,
        /// DeepSpeed ZeRO-3: optimizer states, gradients and parameters sharded.
        Zero3 = "zero3" => Zero3,
        /// FSDP FULL_SHARD.
        FsdpFullShard = "fsdp_full_shard" | "fsdp" | "full_shard" | "fsdp-full-shard" => FsdpFullShard,
        /// FSDP SHARD_GRAD_OP.
        FsdpShardGradOp = "fsdp_shard_grad_op" | "shard_grad_op" | "fsdp-shard-grad-op" => FsdpShardGradOp,
        /// FSDP HYBRID_SHARD.
        FsdpHybridShard = "fsdp_hybrid_shard" | "hybrid_shard" | "fsdp-hybrid-shard" => FsdpHybridShard,
    }
}

impl Strategy {
    /// Whether parameters are sharded (so they can be offloaded).
    #[must_use]
    pub const fn shards_params(self) -> bool {
        matches!(
            self,
            Self::Zero3 | Self::FsdpFullShard | Self::FsdpHybridShard
        )
    }
}

choice! {
    /// What is offloaded to host memory (`parallel.offload`).
    Offload => core::Offload {
        /// Nothing.
        None = "none" => None,
        /// Optimizer states (and fp32 master weights).
        Optimizer = "optimizer" => Optimizer,
        /// Optimizer states and parameters (ZeRO-3 / FSDP full or hybrid shard).
        OptimizerAndParams = "optimizer_and_params" | "optimizer-and-params" | "all" => OptimizerAndParams,
    }
}

choice! {
    /// KV-cache storage for inference (`training.kv_cache_dtype`).
    KvCacheDtype => core::KvDtype {
        /// The compute dtype (bf16 / fp16).
        F16 = "f16" | "bf16" | "fp16" => F16,
        /// fp8.
        F8 = "f8" | "fp8" => F8,
        /// fp32.
        F32 = "f32" | "fp32" => F32,
    }
}

choice! {
    /// Learning-rate schedule, named as the HF Trainer's `lr_scheduler_type`
    /// (`training.lr_scheduler`). No effect on memory; carried for exports.
    LrScheduler {
        /// Linear decay.
        Linear = "linear",
        /// Cosine decay.
        Cosine = "cosine",
        /// Cosine with hard restarts.
        CosineWithRestarts = "cosine_with_restarts",
        /// Cosine decay to a floor.
        CosineWithMinLr = "cosine_with_min_lr",
        /// Polynomial decay.
        Polynomial = "polynomial",
        /// Constant.
        Constant = "constant",
        /// Constant after warmup.
        ConstantWithWarmup = "constant_with_warmup",
        /// Inverse square root.
        InverseSqrt = "inverse_sqrt",
        /// Reduce on plateau.
        ReduceLrOnPlateau = "reduce_lr_on_plateau",
        /// Warmup-stable-decay.
        WarmupStableDecay = "warmup_stable_decay",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_choice_round_trips_through_its_spelling_and_the_engine() {
        for &m in Method::ALL {
            assert_eq!(Method::parse(m.as_str()), Some(m));
            assert_eq!(Method::from(core::Method::from(m)), m);
        }
        for &q in Quantization::ALL {
            assert_eq!(Quantization::parse(q.as_str()), Some(q));
            assert_eq!(Quantization::from(core::Quantization::from(q)), q);
        }
        for &o in Optimizer::ALL {
            assert_eq!(Optimizer::parse(o.as_str()), Some(o));
            let c = core::Optimizer::from(o);
            assert_eq!(Optimizer::from(c), o);
            // The file spells optimizers exactly as the engine's HF names.
            assert_eq!(c.as_str(), o.as_str());
        }
        for &s in Strategy::ALL {
            assert_eq!(Strategy::from(core::Sharding::from(s)), s);
        }
        for &k in KvCacheDtype::ALL {
            assert_eq!(KvCacheDtype::from(core::KvDtype::from(k)), k);
        }
        assert_eq!(
            Optimizer::parse("adamw_bnb_8bit"),
            Some(Optimizer::Adamw8bit)
        );
        assert_eq!(LrScheduler::parse("cosine"), Some(LrScheduler::Cosine));
        assert_eq!(Precision::Bf16Mixed.to_string(), "bf16-mixed");
    }

    #[test]
    fn engine_spellings_match_where_the_engine_has_one() {
        for &q in Quantization::ALL {
            assert_eq!(core::Quantization::from(q).as_str(), q.as_str());
        }
        for &p in Precision::ALL {
            assert_eq!(core::Precision::from(p).as_str(), p.as_str());
        }
        for &s in Stack::ALL {
            assert_eq!(core::Stack::from(s).as_str(), s.as_str());
        }
    }
}
