//! How a training stack lays out dtypes for a job: the facts every formula below depends on.
//!
//! The same "QLoRA, bf16" means different bytes in different stacks (memory-anatomy §2.1,
//! §2.2, §3.4 and validation/README.md "Stacks differ"). [`Regime::resolve`] makes those
//! choices explicit once, so the formulas stay free of stack conditionals.

use serde::{Deserialize, Serialize};

use crate::job::{Job, LossImpl, Method, Precision, Quantization};
use crate::model::ModelSpec;
use crate::stack::{AdapterDtype, KbitPrepare, Nf4Kernel};

/// The resolved dtypes and switches of a job on its stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Regime {
    /// Bytes per element of trainable parameters (full FT: 4 under AMP/fp32, 2 pure bf16).
    pub param_bytes: u64,
    /// Bytes per element of frozen, unquantized base weights.
    pub frozen_bytes: u64,
    /// Bytes per element of the modules a quantized model keeps unquantized (embeddings,
    /// lm_head, norms, biases): fp32 after PEFT's `prepare_model_for_kbit_training`
    /// (`other.py`: "param.data = param.data.to(torch.float32)"), else the load dtype.
    pub unquantized_bytes: u64,
    /// Bytes per element of the residual stream between layers (fp32 when the embedding
    /// output is fp32: fp32 weights under autocast, or after the kbit upcast).
    pub stream_bytes: u64,
    /// Bytes per element of matmul outputs (2 under autocast or pure 16-bit, else 4).
    pub compute_bytes: u64,
    /// Bytes per element of LoRA weights: PEFT casts adapters to fp32
    /// (`cast_adapter_dtype`, `autocast_adapter_dtype=True`); TRL ≥ 0.26 casts trainable
    /// params of quantized models to bf16 (`sft_trainer.py`); litgpt and torchtune keep them
    /// in the model dtype.
    pub adapter_bytes: u64,
    /// Autocast on.
    pub autocast: bool,
    /// PEFT's `prepare_model_for_kbit_training` was applied (classic QLoRA).
    pub kbit_prepare: bool,
    /// lm_head is a frozen fp32 weight (after the kbit upcast, not cast back).
    pub frozen_fp32_head: bool,
    /// Whether lm_head is quantized too (Lightning's bitsandbytes plugin replaces every
    /// Linear, lm_head included).
    pub quantize_lm_head: bool,
    /// The loss implementation.
    pub loss: LossImpl,
    /// Trainable parameters.
    pub trainable_params: u64,
    /// Whether PEFT wraps a bitsandbytes layer (`lora.bnb.Linear4bit`: no input cast under
    /// autocast) rather than a plain `nn.Linear` (`_cast_input_dtype` always).
    pub bnb_lora_layer: bool,
    /// Quantized 4-bit matmuls save their input for backward (bitsandbytes < 0.43.2).
    pub quantized_saves_input: bool,
    /// Bytes per element of the dequantization transient of a 4-bit matmul: the weight in
    /// the dtype it was quantized from, plus its cast to the compute dtype when they differ.
    /// Lightning's `_Linear4bit` (litgpt) quantizes from `.half()`, so bnb's
    /// `dequantize_4bit(...).to(A.dtype)` makes an fp16 and a bf16 copy (4 B/element).
    pub dequant_bytes: u64,
    /// HF Trainer gives `nn.Embedding` 32-bit states under bnb 8-bit optimizers
    /// (`trainer.py`: `register_module_override(module, "weight", {"optim_bits": 32})`).
    pub embedding_states_32bit: bool,
    /// Autocast keeps bf16 copies of fp32 trainable weights during forward and backward
    /// (off when DeepSpeed or FSDP hand the layers already-16-bit parameters).
    pub autocast_weight_copies: bool,
    /// DDP (HF Trainer) keeps a separate copy of all gradients in its buckets
    /// (`gradient_as_bucket_view=False` default).
    pub ddp_bucket_copy: bool,
}

impl Regime {
    /// Resolves the regime of `job` on `model`.
    #[must_use]
    pub fn resolve(model: &ModelSpec, job: &Job) -> Self {
        let precision = job.precision;
        let profile = job.stack.profile();
        // DeepSpeed trains a 16-bit model without autocast: the HF Trainer sets
        // `native_amp = False` when DeepSpeed is enabled (memory-anatomy §9).
        let autocast =
            precision.autocast() && !crate::estimate::parallel::is_deepspeed(job.parallel.sharding);
        let fp32 = precision == Precision::Fp32;
        let quantized = job.quantization != Quantization::None;
        let method = job.method;

        let (param_bytes, frozen_bytes) = match method {
            Method::Full => match precision {
                Precision::Bf16 => (2, 2),
                Precision::Bf16Mixed | Precision::Fp16Mixed | Precision::Fp32 => (4, 4),
            },
            Method::Adapters | Method::QuantizedAdapters | Method::Inference
                if profile.autocast_keeps_fp32_module && autocast && !quantized =>
            {
                (4, 4)
            }
            Method::Adapters | Method::QuantizedAdapters | Method::Inference => {
                if fp32 {
                    (4, 4)
                } else {
                    (2, 2)
                }
            }
        };

        // Sharded QLoRA (FSDP / ZeRO-3 with a 16-bit quant storage) never calls
        // `prepare_model_for_kbit_training`: TRL's SFTTrainer skips it when
        // `is_sharded_qlora` ("one should never call ... prepare_model_for_kbit_training when
        // doing QLoRA + FSDP / DS-Zero3").
        let sharded_qlora = matches!(
            job.parallel.sharding,
            crate::job::Sharding::FsdpFullShard
                | crate::job::Sharding::FsdpHybridShard
                | crate::job::Sharding::FsdpShardGradOp
                | crate::job::Sharding::Zero3
        );
        let trl_legacy =
            profile.kbit_prepare == KbitPrepare::SftTrainerLegacy && job.versions.trl_legacy_kbit();
        let kbit_prepare = method.is_peft()
            && quantized
            && (profile.kbit_prepare == KbitPrepare::Always || trl_legacy)
            && job.quantization != Quantization::Gptq4
            && !sharded_qlora;
        // Legacy TRL casts embeddings and lm_head back to bf16 after the upcast
        // (`peft_module_casting_to_bf16`); only the norms stay fp32.
        let legacy_recast = trl_legacy && kbit_prepare && !fp32;
        let unquantized_bytes = if kbit_prepare && !legacy_recast {
            4
        } else {
            frozen_bytes
        };

        let adapter_bytes = match profile.adapter_dtype {
            // LN tuning's `deepcopy` of each norm keeps the norm's dtype: PEFT's
            // `autocast_adapter_dtype` upcast leaves it alone (checked on PEFT 0.21.2:
            // `ln_tuning_layers.default.weight` stays bfloat16). So do prompt and prefix
            // tuning's embeddings: the upcast (`_cast_adapter_dtype`) visits tuner layers
            // only (the traced prefix encoder's weight is bfloat16).
            _ if method.is_peft()
                && (job.adapter.method == crate::job::PeftKind::LnTuning
                    || job.adapter.method.uses_virtual_tokens()) =>
            {
                unquantized_bytes
            }
            AdapterDtype::ModelDtype => {
                if fp32 || (profile.autocast_keeps_fp32_module && autocast) {
                    4
                } else {
                    2
                }
            }
            // Sharded QLoRA: `get_peft_model(..., autocast_adapter_dtype=False)` leaves the
            // adapters in the 4-bit layers' compute dtype (TRL v0.13 sft_trainer.py).
            AdapterDtype::PeftFp32 if quantized && sharded_qlora => 2,
            // TRL ≥ 0.26 casts the trainable parameters of quantized models to bf16.
            AdapterDtype::PeftFp32
                if quantized
                    && profile.kbit_prepare == KbitPrepare::SftTrainerLegacy
                    && !trl_legacy =>
            {
                2
            }
            AdapterDtype::PeftFp32 | AdapterDtype::Fp32 => 4,
        };

        // The residual stream takes the embedding's output dtype: fp32 when the embedding
        // weight is fp32 (full FT under AMP, fp32, or after the kbit upcast).
        // DeepSpeed runs a 16-bit model without autocast; FSDP's MixedPrecision all-gathers
        // 16-bit parameters: either way layers compute on 16-bit weights.
        let sharded_16bit = !matches!(job.parallel.sharding, crate::job::Sharding::None)
            && precision != Precision::Fp32;
        let stream_bytes = match method {
            Method::Full if sharded_16bit => 2,
            Method::Full => param_bytes,
            _ if kbit_prepare => 4,
            _ => frozen_bytes,
        };
        let compute_bytes = if autocast || !fp32 { 2 } else { 4 };

        let trainable_params = match method {
            Method::Full => full_trainable_params(model, job),
            Method::Adapters | Method::QuantizedAdapters if job.adapter.method.is_adapter() => {
                crate::estimate::weights::AdapterParams::new(model, job.adapter.method).trainable()
            }
            Method::Adapters | Method::QuantizedAdapters => {
                crate::estimate::weights::lora_params(model, job)
            }
            Method::Inference => 0,
        };

        Self {
            param_bytes,
            frozen_bytes,
            unquantized_bytes,
            stream_bytes,
            compute_bytes,
            adapter_bytes,
            autocast,
            kbit_prepare,
            // Encoders have no lm_head (a small classification head instead).
            frozen_fp32_head: kbit_prepare && !legacy_recast && model.encoder.is_none(),
            quantize_lm_head: quantized
                && profile.nf4 == Nf4Kernel::LightningBitsandbytes
                && model.encoder.is_none(),
            loss: match job.loss {
                // Older model code computes `CrossEntropyLoss` on a `.contiguous()` shifted copy
                // of the logits in their own dtype, with no fp32 upcast: GPT-BigCode's
                // `GPTBigCodeForCausalLM.forward` and Qwen-1's remote `modeling_qwen.py`.
                None if job.loss_is_model_code()
                    && matches!(model.model_type.as_str(), "qwen" | "gpt_bigcode") =>
                {
                    LossImpl::StandardNoUpcast
                }
                _ => job.loss_impl(),
            },
            trainable_params,
            // PEFT's GPTQ LoRA layer (`lora/gptq.py`) casts like the bitsandbytes one: only
            // without autocast.
            bnb_lora_layer: quantized,
            autocast_weight_copies: autocast && !sharded_16bit,
            // torchao's eager `NF4Tensor.get_original_weight` builds two int64 index tensors
            // of n/2 elements (8n bytes together) plus bf16 pieces of n/2 to 2n: ~14 B per
            // element for the largest quantized Linear. [DERIVED]
            dequant_bytes: match profile.nf4 {
                Nf4Kernel::LightningBitsandbytes => 4,
                Nf4Kernel::Torchao => 14,
                Nf4Kernel::Bitsandbytes => compute_bytes,
            },
            quantized_saves_input: quantized
                && job.quantization.is_bnb4()
                && method != Method::Full
                && job.versions.bnb4_saves_input(),
            embedding_states_32bit: profile.trainer_embedding_override
                && job.versions.trainer_embedding_override(),
            ddp_bucket_copy: profile.ddp_bucket_copy,
        }
    }
}

/// Parameters a full fine-tune trains: all of them, less a frozen vision tower and
/// projector ([`crate::job::VisionTraining`]).
#[must_use]
pub fn full_trainable_params(model: &ModelSpec, job: &Job) -> u64 {
    if job.adapted_layers.is_some() || job.stack.profile().runtime == crate::stack::Runtime::Mlx {
        // MLX's `num_layers`: only the last layers unfreeze (`l.unfreeze()` for each of
        // `model.layers[-num_layers:]`), embeddings, final norm and head stay frozen.
        return model
            .layers
            .iter()
            .map(|g| job.trained_share(model, g.count) * g.layer_params())
            .sum();
    }
    if job.vision == crate::job::VisionTraining::Trained {
        model.total_params() - model.vision.as_ref().map_or(0, |v| v.idle_params)
    } else {
        model.total_params() - model.vision_params()
    }
}

/// Bytes per element of the gradients of trainable parameters.
#[must_use]
pub const fn grad_bytes(job: &Job, r: &Regime) -> u64 {
    match job.method {
        Method::Full => r.param_bytes,
        _ => r.adapter_bytes,
    }
}
