//! Unsloth: `FastLanguageModel` with TRL's `SFTTrainer`, its Triton kernels, fused
//! cross-entropy and host-offloaded checkpoints (unsloth 2026.8.19, unsloth_zoo 2026.8.13;
//! docs/unsloth-memory.md).

use super::{
    ActivationOffload, AdapterDtype, AttentionModule, CompileScope, DefaultCheckpointing,
    DefaultLoss, DefaultPrecision, KbitPrepare, LayerKernels, LossCode, StackProfile,
};
use crate::job::{Offload, Optimizer, Sharding};

/// The Unsloth stack: the HF Trainer's where Unsloth leaves it alone.
pub(super) const PROFILE: StackProfile = StackProfile {
    // `dtype=None`: bf16 where the GPU has it; LoRA's A and B cast to fp32 and trained
    // under autocast (`prepare_model_for_training`).
    default_precision: DefaultPrecision::Trainer,
    // `use_gradient_checkpointing="unsloth"` in `from_pretrained` and `get_peft_model`.
    default_checkpointing: DefaultCheckpointing::On,
    default_loss: DefaultLoss::Fused,
    loss_code: LossCode::Unsloth,
    // Embeddings, lm_head and norms stay in the model dtype: no k-bit upcast.
    kbit_prepare: KbitPrepare::Never,
    adapter_dtype: AdapterDtype::PeftFp32,
    attention_module: AttentionModule::Transformers,
    // Unsloth compiles its own kernels and patches; the Trainer's `torch_compile` is not
    // what runs.
    compile: CompileScope::Untraced,
    activation_offload: Some(ActivationOffload::Unsloth),
    layer_kernels: LayerKernels::UnslothFused,
    triton_kernels: true,
    // `get_peft_model(lora_dropout=0)`; its notebooks' `optim="adamw_8bit"`.
    default_lora_dropout: 0.0,
    default_optimizer: Optimizer::Adamw8bit,
    // One GPU, or plain data parallel.
    multi_gpu_layouts: &[(Sharding::None, Offload::None)],
    offload_layouts: &[],
    ..super::hf::PROFILE
};
