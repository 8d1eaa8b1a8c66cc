//! Lightning litgpt: its own model code (fused qkv, causal attention, chunked lm_head),
//! Fabric's precision plugins and FSDP wrapping.

use super::{
    AdapterDtype, AttentionModule, CompileScope, DefaultCheckpointing, DefaultLoss,
    DefaultPrecision, FsdpWrap, KbitPrepare, KvCacheLayout, LayerKernels, LossCode, Nf4Kernel,
    PeftMethods, StackProfile,
};
use crate::job::{Offload, Optimizer, Sharding};

/// The litgpt stack.
pub(super) const PROFILE: StackProfile = StackProfile {
    default_precision: DefaultPrecision::PureBf16,
    default_checkpointing: DefaultCheckpointing::Off,
    default_loss: DefaultLoss::Chunked,
    loss_code: LossCode::Litgpt,
    trains_llama_adapter: true,
    peft_methods: PeftMethods::Lora,
    kbit_prepare: KbitPrepare::Never,
    adapter_dtype: AdapterDtype::ModelDtype,
    autocast_keeps_fp32_module: true,
    unties_embeddings: true,
    nf4: Nf4Kernel::LightningBitsandbytes,
    attention_module: AttentionModule::LitgptFusedQkv,
    transformers_modules: false,
    lm_head_chunk_tokens: Some(crate::estimate::loss::LITGPT_CHUNK),
    loop_keeps_previous_loss: true,
    trainer_embedding_override: false,
    ddp_bucket_copy: false,
    peft_input_grads: false,
    step_replay: false,
    kv_cache: KvCacheLayout::Litgpt,
    tp_replicates_embeddings: true,
    fsdp_api: crate::job::FsdpApi::Fsdp1,
    fsdp: FsdpWrap::Lightning,
    compile: CompileScope::Untraced,
    activation_offload: None,
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
    offload_layouts: &[],
};
