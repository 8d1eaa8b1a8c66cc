//! Apple's MLX: `mlx_lm.lora` (mlx-lm 0.32, mlx 0.32; docs/mlx-memory.md).

use super::{
    AdapterDtype, CompileScope, DefaultCheckpointing, DefaultLoss, DefaultPrecision, KbitPrepare,
    LossCode, PeftMethods, Runtime, StackProfile,
};
use crate::job::{Optimizer, Quantization};

/// The MLX stack.
pub(super) const PROFILE: StackProfile = StackProfile {
    // The model computes in the dtype it was saved in (bf16 for mlx-community models); MLX
    // has no autocast.
    default_precision: DefaultPrecision::PureBf16,
    // `grad_checkpoint: False` (`CONFIG_DEFAULTS`).
    default_checkpointing: DefaultCheckpointing::Off,
    // `trainer.default_loss`: `nn.losses.cross_entropy` on the full logits.
    default_loss: DefaultLoss::ModelCode,
    loss_code: LossCode::Mlx,
    kbit_prepare: KbitPrepare::Never,
    adapter_dtype: AdapterDtype::Fp32,
    transformers_modules: false,
    compile: CompileScope::Untraced,
    activation_offload: None,
    // `lora_parameters: {dropout: 0.0}`.
    default_lora_dropout: 0.0,
    // `optimizer: adam`: states `zeros_like` the parameter, the memory of PyTorch's AdamW.
    default_optimizer: Optimizer::AdamwTorch,
    // `mlx_lm.convert -q`: 4 bits, groups of 64.
    default_quantization: Quantization::Mlx4,
    // `lora_parameters: {rank: 8, …}`; no `keys`: every Linear of the block (mlx-lm
    // `16ca0b3`, 2025-09-30; q and v only before).
    default_lora_rank: 8,
    adapts_all_linear: true,
    // `num_layers: 16`.
    default_adapted_layers: Some(16),
    runtime: Runtime::Mlx,
    // One Mac: `mlx.launch` data parallel is not modelled.
    multi_gpu_layouts: &[],
    offload_layouts: &[],
    // `mlx_lm.lora`'s own LoRA and DoRA (`fine_tune_type`), not PEFT's.
    peft_methods: PeftMethods::LoraAndDora,
    ..super::hf::PROFILE
};
