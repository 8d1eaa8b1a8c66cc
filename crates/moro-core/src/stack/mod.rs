//! What a training stack does differently, as data: one [`StackProfile`] per stack.
//!
//! The same "QLoRA, bf16" means different bytes in the HF Trainer, TRL's `SFTTrainer`,
//! Lightning's litgpt and torchtune (memory-anatomy §2.1, §2.2, §3.4; validation/README.md
//! "Stacks differ"): which defaults apply, which dtypes the adapters and the residual stream
//! take, which loss runs, whose model code saves what, how FSDP is wrapped, what is offered
//! and what is refused. The formulas read these fields (through [`crate::job::Stack::profile`]
//! and [`crate::estimate::Regime`]) and never the stack's name; a new stack is a new profile
//! file plus whatever physics is really new. Facts that changed between releases of a stack
//! stay version-gated in [`crate::job::Versions`]; the profile says which gate applies.

mod hf;
mod litgpt;
mod mlx;
mod modules;
mod torchtune;
mod trl;
mod unsloth;

pub use modules::{as_built, with_job};

use crate::job::{Offload, Sharding, Stack};

/// The facts of one training stack.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StackProfile {
    /// Precision when not told: bf16 weights without autocast for every method, or the HF
    /// Trainer's choice ([`crate::job::settings::default_precision`]).
    pub default_precision: DefaultPrecision,
    /// Gradient checkpointing when not told.
    pub default_checkpointing: DefaultCheckpointing,
    /// The loss that runs when not told.
    pub default_loss: DefaultLoss,
    /// Shapes of the loss's logits buffers.
    pub loss_code: LossCode,
    /// The LLaMA-Adapter PEFT family (lit-gpt's `adapter.py`) is this stack's own.
    pub trains_llama_adapter: bool,
    /// Which of PEFT's methods the stack trains (its own LLaMA-Adapter family apart).
    pub peft_methods: PeftMethods,
    /// Whether PEFT's `prepare_model_for_kbit_training` runs on a quantized base.
    pub kbit_prepare: KbitPrepare,
    /// Dtype of the adapters it creates.
    pub adapter_dtype: AdapterDtype,
    /// Under autocast the module, frozen base included, stays fp32 (Lightning's
    /// `MixedPrecision` "bf16-mixed" only adds autocast: litgpt finetune-lora docs).
    pub autocast_keeps_fp32_module: bool,
    /// Fine-tuning never ties lm_head to the embedding (litgpt `GPT.__init__` creates both;
    /// `convert_hf_checkpoint` copies wte into lm_head): the model holds V·h more parameters.
    pub unties_embeddings: bool,
    /// The 4-bit kernel and which Linears it quantizes.
    pub nf4: Nf4Kernel,
    /// Whose attention module runs the forward.
    pub attention_module: AttentionModule,
    /// The model is transformers' own module tree (so its experts are stacked parameters
    /// from transformers 5: [`crate::model::WeightLayout`]); litgpt and torchtune build
    /// their own modules, a Linear per expert as moro describes them.
    pub transformers_modules: bool,
    /// lm_head runs once per chunk of this many tokens (litgpt `lm_head_chunk_size=128`).
    pub lm_head_chunk_tokens: Option<u64>,
    /// The training loop's variable `loss` keeps the previous step's graph until the next
    /// step rebinds it after its forward (litgpt `finetune/lora.py`).
    pub loop_keeps_previous_loss: bool,
    /// The HF Trainer gives `nn.Embedding` 32-bit states under bnb 8-bit optimizers
    /// (`trainer.py`: `register_module_override(module, "weight", {"optim_bits": 32})`),
    /// where its version does ([`crate::job::Versions::trainer_embedding_override`]).
    pub trainer_embedding_override: bool,
    /// DDP keeps a separate copy of all gradients in its buckets
    /// (`gradient_as_bucket_view=False`, the HF Trainer's default).
    pub ddp_bucket_copy: bool,
    /// Under gradient checkpointing a PEFT model's input embeddings require grad
    /// (`model.enable_input_require_grads()`), so the first decoder layer computes its
    /// input's gradient too.
    pub peft_input_grads: bool,
    /// The caching-allocator replay of two training steps models this stack's step
    /// ([`crate::estimate::replay`]).
    pub step_replay: bool,
    /// Layout of the inference KV cache.
    pub kv_cache: KvCacheLayout,
    /// Tensor-parallel generation shards the blocks' Linears only: the embedding and lm_head
    /// are replicated on every device (litgpt `generate/tp.py`).
    pub tp_replicates_embeddings: bool,
    /// How FSDP wraps the model.
    pub fsdp: FsdpWrap,
    /// The FSDP implementation the stack's launcher uses when the job does not say
    /// ([`crate::job::FsdpApi`]).
    pub fsdp_api: crate::job::FsdpApi,
    /// What `torch.compile` compiles.
    pub compile: CompileScope,
    /// How checkpointed layer inputs go to host memory, where the stack can.
    pub activation_offload: Option<ActivationOffload>,
    /// Whose code runs a decoder layer's forward and what it saves.
    pub layer_kernels: LayerKernels,
    /// Its own kernels are Triton's (CUDA and ROCm only).
    pub triton_kernels: bool,
    /// LoRA dropout when not told.
    pub default_lora_dropout: f64,
    /// The optimizer when not told.
    pub default_optimizer: crate::job::Optimizer,
    /// The quantization of a QLoRA job that does not say.
    pub default_quantization: crate::job::Quantization,
    /// LoRA's rank when not told.
    pub default_lora_rank: u64,
    /// LoRA adapts every Linear of the decoder layers when not told which (MLX's
    /// `get_keys_for_lora`), rather than moro's seven Llama projections.
    pub adapts_all_linear: bool,
    /// Decoder layers that train when the job does not say: the last this many (MLX's
    /// `num_layers`), or `None` for all of them.
    pub default_adapted_layers: Option<u64>,
    /// The array framework whose allocator and autodiff the step runs on.
    pub runtime: Runtime,
    /// Layouts on several GPUs the recipe search offers (plain DDP is `Sharding::None`); a hybrid
    /// shard only where the GPUs span nodes.
    pub multi_gpu_layouts: &'static [(Sharding, Offload)],
    /// Layouts with CPU offload the search offers when the cluster allows it.
    pub offload_layouts: &'static [(Sharding, Offload)],
}

/// The framework a stack's step runs on: it decides what is kept for backward, how memory is
/// counted and what the device adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// PyTorch on CUDA or ROCm: autograd's saved tensors, the caching allocator, the CUDA
    /// context.
    Torch,
    /// MLX on Metal: a lazy graph whose arrays live while a backward node needs them, a buffer
    /// cache outside the peak it reports (`mx.get_peak_memory`), no context
    /// ([`crate::estimate::mlx`]).
    Mlx,
}

/// Precision when the job does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultPrecision {
    /// bf16 weights, no autocast, for every method (litgpt `--precision bf16-true`,
    /// torchtune's `dtype: bf16`).
    PureBf16,
    /// The HF Trainer's `bf16=True`: full fine-tunes train the weights in the dtype they
    /// load in (transformers 5 `dtype="auto"`), PEFT's fp32 adapters under bf16 autocast.
    Trainer,
}

/// Gradient checkpointing when the job does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultCheckpointing {
    /// Always on (TRL's `SFTConfig.gradient_checkpointing`: "Defaults to True").
    On,
    /// On where `prepare_model_for_kbit_training(use_gradient_checkpointing=True)` runs:
    /// QLoRA on a bitsandbytes base (GPTQ checkpoints skip it).
    WithKbitPrepare,
    /// Off.
    Off,
}

/// The loss a stack runs when the job does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultLoss {
    /// The model code's own loss (transformers `ForCausalLMLoss`, with the fp32 shifted copy
    /// of 4.46–4.48; GPT-2-era model code without the upcast).
    ModelCode,
    /// TRL's `SFTTrainer`: `chunked_nll` from TRL 1.7, else the model code's loss.
    SftTrainer,
    /// The stack's own chunked cross-entropy.
    Chunked,
    /// The stack's own fused linear cross-entropy (Unsloth's `unsloth_fused_ce_loss`).
    Fused,
}

/// The logits buffers of a stack's loss where they differ from transformers'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossCode {
    /// transformers' (and TRL's) loss code.
    Transformers,
    /// litgpt: a list of 128-token bf16 logit chunks cast to fp32 by Fabric, then
    /// `chunked_cross_entropy`.
    Litgpt,
    /// torchtune: `self.output(h).float()` for the standard loss (0.1), and
    /// `CEWithChunkedOutputLoss` over 8 chunks.
    Torchtune,
    /// Unsloth: `unsloth_fused_ce_loss` for the fused loss.
    Unsloth,
    /// MLX: `nn.losses.cross_entropy` on 16-bit logits ([`crate::estimate::mlx`]).
    Mlx,
}

/// Which parameter-efficient methods a stack trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeftMethods {
    /// Every method of the PEFT library (the stack builds its model with `get_peft_model`).
    Peft,
    /// LoRA and DoRA of the stack's own (torchtune 0.x `torchtune/modules/peft/`: `lora.py`,
    /// `dora.py`; `mlx_lm.lora`'s `fine_tune_type`).
    LoraAndDora,
    /// LoRA only (litgpt `litgpt/lora.py`, no DoRA).
    Lora,
}

impl PeftMethods {
    /// Whether a stack with these methods trains `kind` (with DoRA where `dora`).
    #[must_use]
    pub fn trains(self, kind: crate::job::PeftKind, dora: bool) -> bool {
        use crate::job::PeftKind;
        match self {
            Self::Peft => true,
            Self::LoraAndDora => kind == PeftKind::Lora,
            Self::Lora => kind == PeftKind::Lora && !dora,
        }
    }

    /// The methods in words, for a message.
    #[must_use]
    pub const fn in_words(self) -> &'static str {
        match self {
            Self::Peft => "PEFT's methods",
            Self::LoraAndDora => "LoRA and DoRA",
            Self::Lora => "LoRA (no DoRA)",
        }
    }
}

/// Whether `prepare_model_for_kbit_training` runs on a quantized base (PEFT `other.py`:
/// non-quantized parameters upcast to fp32, checkpointing on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KbitPrepare {
    /// Always on a bitsandbytes base, unsharded.
    Always,
    /// Only in TRL's releases before `SFTTrainer` stopped calling it
    /// ([`crate::job::Versions::trl_legacy_kbit`]); later ones cast the trainable
    /// parameters of quantized models to bf16 instead.
    SftTrainerLegacy,
    /// Never.
    Never,
}

/// Dtype of the adapters a stack creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterDtype {
    /// PEFT's `autocast_adapter_dtype=True` upcast to fp32.
    PeftFp32,
    /// The model's own dtype (litgpt, torchtune).
    ModelDtype,
    /// float32 whatever the model's dtype, with no autocast (MLX's `LoRALinear`:
    /// `mx.random.uniform`/`mx.zeros` in the default dtype).
    Fp32,
}

/// The 4-bit kernel of a stack's QLoRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nf4Kernel {
    /// bitsandbytes `Linear4bit` on every Linear but lm_head, dequantized to the compute
    /// dtype.
    Bitsandbytes,
    /// Lightning's bitsandbytes plugin: every Linear, lm_head included, quantized from
    /// `.half()`, so `dequantize_4bit(...).to(A.dtype)` makes an fp16 and a bf16 copy
    /// (4 B per element).
    LightningBitsandbytes,
    /// torchao's `NF4Tensor` on the base weight of each `LoRALinear` only (torchtune
    /// `lora.py`: `to_nf4(linear.weight) if self._quantize_base`); eager
    /// `get_original_weight` builds int64 indices and bf16 pieces, ~14 B per element.
    /// [DERIVED]
    Torchao,
}

/// Whose attention module the forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionModule {
    /// transformers' attention classes: separate q/k/v projections, the padding mask passed
    /// to the kernel, eager attention as its own softmax.
    Transformers,
    /// litgpt's `CausalSelfAttention`: one fused qkv Linear (`LoRAQKVLinear` under LoRA),
    /// causal only (no padding mask), and `Attention::Eager` as SDPA's math kernel.
    LitgptFusedQkv,
    /// torchtune's `MultiHeadAttention`: separate q/k/v projections, and with grouped-query
    /// attention k and v `expand`ed and reshaped to every head (copies the kernel saves)
    /// before SDPA (torchtune 0.1–0.6 `modules/attention.py`; traced, torchtune 0.4:
    /// `validation/oracle-traces/compile-torchtune.jsonl`).
    TorchtuneExpandedKv,
}

/// How a stack offloads checkpointed layer inputs to host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationOffload {
    /// torchtune's `OffloadActivations` (`enable_activation_offloading`), off unless asked.
    Torchtune,
    /// Unsloth's `"unsloth"` gradient checkpointing (unsloth_zoo 2026.8
    /// `gradient_checkpointing.py` `UnslothCheckpointFunction`), its default: each layer's
    /// input copied to its own pinned host buffer on a side stream, the last layer's input
    /// kept, and the backward reloading into one or two persistent GPU buffers (two when
    /// more than 512 MiB is free); plain checkpointing below 512 tokens of
    /// `max_seq_length` or 2²⁰ elements of hidden state (docs/unsloth-memory.md §2).
    Unsloth,
}

impl ActivationOffload {
    /// Layer inputs on the GPU at once.
    #[must_use]
    pub const fn checkpoints_on_gpu(self) -> u64 {
        match self {
            // torchtune 0.4 `training/_activation_offloading.py` (`use_streams=True`): the
            // forward stash keeps the last `max_fwd_stash_size = 5` packed tensors, two per
            // checkpointed layer (`_NoopSaveInputs` saves an empty dummy and the input);
            // the backward brings one layer's input back while the previous one waits for
            // its event.
            Self::Torchtune => 2,
            // The last layer's input and two reload buffers.
            Self::Unsloth => 3,
        }
    }

    /// Whether the stack offloads whenever it checkpoints, unless told not to.
    #[must_use]
    pub const fn by_default(self) -> bool {
        matches!(self, Self::Unsloth)
    }

    /// Whether a step of `tokens` tokens (`seq_len` each) and `hidden` wide is offloaded
    /// at all: Unsloth checkpoints plainly below 512 tokens of `max_seq_length` or 2²⁰
    /// elements of hidden state (`apply_unsloth_gradient_checkpointing`,
    /// `UnslothCheckpointFunction`).
    #[must_use]
    pub const fn applies(self, seq_len: u64, tokens: u64, hidden: u64) -> bool {
        match self {
            Self::Torchtune => true,
            Self::Unsloth => seq_len >= 512 && tokens * hidden > 1 << 20,
        }
    }
}

impl StackProfile {
    /// Whether a job of this stack offloads its checkpoints when it checkpoints and says
    /// nothing about offloading.
    #[must_use]
    pub fn offloads_by_default(&self) -> bool {
        self.activation_offload
            .is_some_and(ActivationOffload::by_default)
    }
}

/// Whose code runs a decoder layer and saves its tensors for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKernels {
    /// The model code's modules (transformers', litgpt's, torchtune's).
    Model,
    /// Unsloth's Triton RMSNorm and fused LoRA autograd functions (`LoRA_QKV`, `LoRA_W`,
    /// `LoRA_MLP`: inputs saved, weights dequantized again in backward) where its patch
    /// applies: LoRA without dropout, bias or DoRA (docs/unsloth-memory.md §3).
    UnslothFused,
}

/// What `torch.compile` compiles in a stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileScope {
    /// The whole model (the HF Trainer's `torch_compile`: `model.compile()`); under
    /// gradient checkpointing transformers' layers break the graph and run eagerly
    /// (docs/torch-compile.md).
    Model,
    /// Each decoder layer on its own, checkpointed or not, and the loss
    /// (torchtune 0.4 `training/_compile.py`: `compile_model` compiles every
    /// `TransformerSelfAttentionLayer`, `compile_loss` the loss, only
    /// `compute_cross_entropy` of the chunked one); the embedding, final norm and output
    /// projection stay eager.
    Layers,
    /// Not traced: refused.
    Untraced,
}

/// Layout of the inference KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheLayout {
    /// transformers' `DynamicCache`: every layer's KV heads, grown a token a step by
    /// `torch.cat` (`DynamicLayer.update`).
    Transformers,
    /// torchtune's `KVCache` (`modules/kv_cache.py`): the KV heads over the whole context,
    /// allocated before the prefill (`setup_caches`).
    Preallocated,
    /// litgpt's preallocated `KVCache`.
    Litgpt,
}

/// How FSDP wraps the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsdpWrap {
    /// accelerate's and torchtune's: gradients reduce-scattered per unit, adapters their
    /// own flat parameters.
    PerUnit,
    /// Lightning's (`use_orig_params=True`): a block's frozen and LoRA weights share one flat
    /// parameter that requires grad as a whole (pytorch/pytorch#104690), and accumulation
    /// runs under `fabric.no_backward_sync` (FSDP `no_sync`: whole gradients per block).
    Lightning,
}

impl Stack {
    /// The stack's profile.
    #[must_use]
    pub const fn profile(self) -> &'static StackProfile {
        match self {
            Self::Hf => &hf::PROFILE,
            Self::Trl => &trl::PROFILE,
            Self::Litgpt => &litgpt::PROFILE,
            Self::Torchtune => &torchtune::PROFILE,
            Self::Unsloth => &unsloth::PROFILE,
            Self::Mlx => &mlx::PROFILE,
        }
    }
}

impl Nf4Kernel {
    /// Whether the base is quantized by bitsandbytes (its quantization states ride beside
    /// the packed weights).
    #[must_use]
    pub const fn is_bitsandbytes(self) -> bool {
        !matches!(self, Self::Torchao)
    }
}
