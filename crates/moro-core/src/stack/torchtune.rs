//! torchtune: its recipes and model code, torchao's NF4 for QLoRA, FSDP full shard.

use super::{
    ActivationOffload, AdapterDtype, AttentionModule, CompileScope, DefaultCheckpointing,
    DefaultLoss, DefaultPrecision, FsdpWrap, KbitPrepare, KvCacheLayout, LayerKernels, LossCode,
    Nf4Kernel, PeftMethods, StackProfile,
};
use crate::job::{Offload, Optimizer, Sharding};

/// The torchtune stack.
pub(super) const PROFILE: StackProfile = StackProfile {
    default_precision: DefaultPrecision::PureBf16,
    default_checkpointing: DefaultCheckpointing::Off,
    default_loss: DefaultLoss::Chunked,
    loss_code: LossCode::Torchtune,
    trains_llama_adapter: false,
    peft_methods: PeftMethods::LoraAndDora,
    kbit_prepare: KbitPrepare::Never,
    adapter_dtype: AdapterDtype::ModelDtype,
    autocast_keeps_fp32_module: false,
    unties_embeddings: false,
    nf4: Nf4Kernel::Torchao,
    attention_module: AttentionModule::TorchtuneExpandedKv,
    transformers_modules: false,
    lm_head_chunk_tokens: None,
    loop_keeps_previous_loss: false,
    trainer_embedding_override: false,
    ddp_bucket_copy: false,
    peft_input_grads: false,
    step_replay: false,
    kv_cache: KvCacheLayout::Preallocated,
    tp_replicates_embeddings: false,
    fsdp_api: crate::job::FsdpApi::Fsdp2,
    fsdp: FsdpWrap::PerUnit,
    compile: CompileScope::Layers,
    activation_offload: Some(ActivationOffload::Torchtune),
    layer_kernels: LayerKernels::Model,
    triton_kernels: false,
    default_lora_dropout: 0.05,
    default_optimizer: Optimizer::AdamwTorchFused,
    default_quantization: crate::job::Quantization::Nf4Dq,
    default_lora_rank: 16,
    adapts_all_linear: false,
    default_adapted_layers: None,
    runtime: super::Runtime::Torch,
    multi_gpu_layouts: &[(Sharding::FsdpFullShard, Offload::None)],
    offload_layouts: &[(Sharding::FsdpFullShard, Offload::OptimizerAndParams)],
};
