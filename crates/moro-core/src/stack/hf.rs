//! transformers `Trainer` + PEFT + bitsandbytes (+ accelerate).

use super::{
    AdapterDtype, AttentionModule, CompileScope, DefaultCheckpointing, DefaultLoss,
    DefaultPrecision, FsdpWrap, KbitPrepare, KvCacheLayout, LayerKernels, LossCode, Nf4Kernel,
    PeftMethods, Runtime, StackProfile,
};
use crate::job::{Offload, Optimizer, Sharding};

/// DDP, DeepSpeed's stages and FSDP's strategies through accelerate.
pub(super) const MULTI_GPU: &[(Sharding, Offload)] = &[
    (Sharding::None, Offload::None),
    (Sharding::Zero1, Offload::None),
    (Sharding::Zero2, Offload::None),
    (Sharding::FsdpShardGradOp, Offload::None),
    (Sharding::Zero3, Offload::None),
    (Sharding::FsdpFullShard, Offload::None),
    (Sharding::FsdpHybridShard, Offload::None),
];

/// ZeRO-2/3 offload of the optimizer, ZeRO-3 and FSDP offload of parameters too.
pub(super) const OFFLOAD: &[(Sharding, Offload)] = &[
    (Sharding::Zero2, Offload::Optimizer),
    (Sharding::Zero3, Offload::Optimizer),
    (Sharding::Zero3, Offload::OptimizerAndParams),
    (Sharding::FsdpFullShard, Offload::OptimizerAndParams),
];

/// The HF stack.
pub(super) const PROFILE: StackProfile = StackProfile {
    default_precision: DefaultPrecision::Trainer,
    default_checkpointing: DefaultCheckpointing::WithKbitPrepare,
    default_loss: DefaultLoss::ModelCode,
    loss_code: LossCode::Transformers,
    trains_llama_adapter: false,
    peft_methods: PeftMethods::Peft,
    kbit_prepare: KbitPrepare::Always,
    adapter_dtype: AdapterDtype::PeftFp32,
    autocast_keeps_fp32_module: false,
    unties_embeddings: false,
    nf4: Nf4Kernel::Bitsandbytes,
    attention_module: AttentionModule::Transformers,
    transformers_modules: true,
    lm_head_chunk_tokens: None,
    loop_keeps_previous_loss: false,
    trainer_embedding_override: true,
    ddp_bucket_copy: true,
    // transformers 5.25 `activation_checkpointing_enable` calls `enable_input_require_grads`
    // for every model whose main input is `input_ids` (the fix for transformers#42489), and
    // PEFT 0.21's `PeftModel.__init__` calls it for a model already checkpointing, and TRL's
    // `SFTTrainer.__init__` for every PEFT model under checkpointing (TRL f2cd577): the
    // oracle's LoRA steps compute the first layer's input gradient.
    peft_input_grads: true,
    step_replay: true,
    kv_cache: KvCacheLayout::Transformers,
    tp_replicates_embeddings: false,
    fsdp_api: crate::job::FsdpApi::Fsdp1,
    fsdp: FsdpWrap::PerUnit,
    compile: CompileScope::Model,
    activation_offload: None,
    layer_kernels: LayerKernels::Model,
    triton_kernels: false,
    default_lora_dropout: 0.05,
    default_optimizer: Optimizer::AdamwTorchFused,
    default_quantization: crate::job::Quantization::Nf4Dq,
    default_lora_rank: 16,
    adapts_all_linear: false,
    default_adapted_layers: None,
    runtime: Runtime::Torch,
    multi_gpu_layouts: MULTI_GPU,
    offload_layouts: OFFLOAD,
};
