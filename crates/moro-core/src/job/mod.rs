//! What is being run: the job an estimate is for.
//!
//! A [`Job`] is plain data: the method, base-weight quantization, LoRA settings, optimizer,
//! precision, shape, attention, loss, training stack and parallelism. The CLI and moro.yaml
//! both build one; [`Job::validate`] checks it against a model before any arithmetic, so the
//! estimator never sees a zero batch or an overflowing shape.

use serde::{Deserialize, Serialize};

use crate::model::ModelSpec;
use crate::stack::DefaultLoss;

pub mod against;
mod boft;
mod gemma3n;
mod liger;
mod recurrent;
pub mod settings;
mod validate;

pub use liger::Liger;
pub use settings::JobSettings;

/// Training (or inference) method: what trains and what the base is stored in. Which
/// adapters train is the job's [`PeftConfig`] (`adapter.method`); `lora` and `qlora` are the
/// names people give the two adapter methods whatever the adapters are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// All parameters trainable.
    Full,
    /// Adapters on a frozen 16/32-bit base (`lora`).
    #[serde(rename = "lora")]
    Adapters,
    /// Adapters on a frozen quantized (bitsandbytes 4-bit by default) base (`qlora`).
    #[serde(rename = "qlora")]
    QuantizedAdapters,
    /// Forward only, with a KV cache.
    Inference,
}

impl Method {
    /// All values, for listings and search.
    pub const ALL: [Self; 4] = [
        Self::Full,
        Self::Adapters,
        Self::QuantizedAdapters,
        Self::Inference,
    ];

    /// The name used on the command line and in moro.yaml.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Method::from(self).as_str()
    }

    /// Whether the job trains adapters (LoRA / QLoRA).
    #[must_use]
    pub const fn is_peft(self) -> bool {
        matches!(self, Self::Adapters | Self::QuantizedAdapters)
    }
}

/// Which parameter-efficient method an adapter job (frozen, possibly quantized base) trains
/// ([`PeftConfig::method`]). Only the litgpt stack models the lit-gpt adapters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeftKind {
    /// LoRA adapters (`adapter` settings apply).
    #[default]
    Lora,
    /// lit-gpt's LLaMA-Adapter (`lit_gpt/adapter.py`, `finetune/adapter.py`): a learned
    /// 10-token prefix (`adapter_wte`) and a zero-init gate per attention layer from layer 2 on.
    #[serde(rename = "adapter")]
    LlamaAdapter,
    /// lit-gpt's LLaMA-Adapter v2 (`lit_gpt/adapter_v2.py`, `finetune/adapter_v2.py`): the
    /// prefix and gate, plus a trainable bias and scale on every Linear (`AdapterV2Linear`)
    /// and trainable norms.
    AdapterV2,
    /// PEFT's IA³ (`tuners/ia3/layer.py`): one trainable vector per targeted Linear that
    /// scales its output, or, for the feedforward modules (`adapter.feedforward`; PEFT's default
    /// for decoders: the MLP's down projection), its input. The `adapter` targets apply.
    Ia3,
    /// PEFT's VeRA (`tuners/vera/layer.py`): frozen random A (r × in) and B (out × r) shared
    /// by every targeted Linear, and trainable vectors `lambda_d` (r) and `lambda_b` (out) per
    /// module. `adapter.rank` is VeRA's r; the `adapter` targets apply.
    Vera,
    /// PEFT's AdaLoRA (`tuners/adalora/layer.py`): LoRA's A and B plus the singular values
    /// `lora_E` (r), allocated at `init_r` (`adapter.rank`) and pruned by masking, never
    /// resized; a `RankAllocator` keeps two fp32 importance scores per adapter element.
    #[serde(rename = "adalora")]
    AdaLora,
    /// PEFT's LoHa (`tuners/loha/layer.py`): per targeted Linear two rank-r factor pairs
    /// whose Hadamard product (`HadaWeight`) is built as a full out × in weight every forward
    /// and applied with `F.linear`, which saves it. `adapter.rank` is LoHa's r.
    #[serde(rename = "loha")]
    LoHa,
    /// PEFT's LoKr (`tuners/lokr/layer.py`): per targeted Linear a Kronecker product
    /// ΔW = w1 ⊗ w2 · scale, w1 (a × c) and w2 (b × d, or w2_a · w2_b at rank r) with
    /// out = a·b and in = c·d from `factorization(dim, decompose_factor)`, built as a full
    /// out × in weight every forward and applied with `F.linear`, which saves it.
    /// `adapter.rank` is LoKr's r, `adapter.decompose_factor` PEFT's `decompose_factor`.
    #[serde(rename = "lokr")]
    LoKr,
    /// PEFT's OFT (`tuners/oft/layer.py`, `OFTRotationModule`): per targeted Linear r
    /// orthogonal blocks of (in / r)², each from the b(b − 1)/2 parameters of a skew-symmetric
    /// matrix through the Cayley–Neumann series (5 terms), rotating the input before the
    /// frozen Linear. `adapter.rank` is OFT's r (the number of blocks).
    Oft,
    /// PEFT's BOFT (`tuners/boft/layer.py`): per targeted Linear `boft_R`, D × (in / b)
    /// skew-symmetric blocks of b × b (D butterfly factors, b the block size), and the
    /// output scale `boft_s`; every forward builds the in × in rotation from them through
    /// the fp32 permutation buffer `boft_P` and rotates the input before the frozen Linear.
    /// `adapter.block_size` and `adapter.butterfly_factor` are PEFT's `boft_block_size` and
    /// `boft_n_butterfly_factor`.
    Boft,
    /// PEFT's LN tuning (`tuners/ln_tuning/layer.py`): a trainable copy of every norm
    /// (PEFT's default targets for decoders: both norms of each layer and the final norm).
    LnTuning,
    /// PEFT's prompt tuning (`tuners/prompt_tuning`): `adapter.virtual_tokens` trainable
    /// embeddings prepended to every sequence, which the frozen model then runs over.
    PromptTuning,
    /// PEFT's prefix tuning (`tuners/prefix_tuning`, `PrefixEncoder` without projection):
    /// `adapter.virtual_tokens` trainable keys and values per layer, passed to the frozen model
    /// as `past_key_values`: every attention reads them after the sequence's own.
    PrefixTuning,
}

impl PeftKind {
    /// All values.
    pub const ALL: [Self; 13] = [
        Self::Lora,
        Self::LlamaAdapter,
        Self::AdapterV2,
        Self::Ia3,
        Self::Vera,
        Self::AdaLora,
        Self::LoHa,
        Self::LoKr,
        Self::Oft,
        Self::Boft,
        Self::LnTuning,
        Self::PromptTuning,
        Self::PrefixTuning,
    ];

    /// The name on the command line and in JSON.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Peft::from(self).as_str()
    }

    /// Parses a name (`lora`, `adapter`, `adapter-v2` / `adapter_v2`).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        crate::vocabulary::Peft::parse(&s).map(Self::from)
    }

    /// Whether this is one of lit-gpt's LLaMA-Adapter variants.
    #[must_use]
    pub const fn is_adapter(self) -> bool {
        matches!(self, Self::LlamaAdapter | Self::AdapterV2)
    }

    /// Whether this is one of PEFT's methods other than LoRA (IA³, VeRA, AdaLoRA, LoHa, LoKr,
    /// OFT, BOFT, LN tuning, prompt and prefix tuning): modelled on one GPU or data parallel,
    /// without sharding.
    #[must_use]
    pub const fn is_other_peft(self) -> bool {
        matches!(
            self,
            Self::Ia3
                | Self::Vera
                | Self::AdaLora
                | Self::LoHa
                | Self::LoKr
                | Self::Oft
                | Self::Boft
                | Self::LnTuning
                | Self::PromptTuning
                | Self::PrefixTuning
        )
    }

    /// Whether the method's tensors sit on the `adapter` targets (LoRA, IA³, VeRA, AdaLoRA,
    /// LoHa, LoKr, OFT, BOFT).
    #[must_use]
    pub const fn uses_targets(self) -> bool {
        matches!(
            self,
            Self::Lora
                | Self::Ia3
                | Self::Vera
                | Self::AdaLora
                | Self::LoHa
                | Self::LoKr
                | Self::Oft
                | Self::Boft
        )
    }

    /// Whether the method's weight-sized tensors are fewer in the first decoder layer
    /// without checkpointing: its input comes from the frozen embedding, so autograd never
    /// needs the input's gradient and skips what only that gradient reads (LoHa's and
    /// LoKr's ΔW, saved by `F.linear` for it; BOFT's rotation, saved by `x @ R`).
    #[must_use]
    pub const fn first_layer_saves_less(self) -> bool {
        matches!(self, Self::LoHa | Self::LoKr | Self::Boft)
    }

    /// Whether the method builds each targeted Linear's full ΔW every forward and
    /// `F.linear(x, ΔW)` saves it (LoHa, LoKr).
    #[must_use]
    pub const fn builds_delta_weight(self) -> bool {
        matches!(self, Self::LoHa | Self::LoKr)
    }

    /// Whether the method drops out its input (`lora_dropout`: LoRA's and AdaLoRA's, VeRA's
    /// `vera_dropout`). PEFT's LoHa and LoKr (`rank_dropout`, `module_dropout`: on the weight
    /// and the whole module), OFT, IA³, LN, prompt and prefix tuning have none, and neither
    /// has lit-gpt's LLaMA-Adapter.
    #[must_use]
    pub const fn drops_out_input(self) -> bool {
        matches!(self, Self::Lora | Self::AdaLora | Self::Vera)
    }

    /// Whether PEFT refuses the method with gradient checkpointing: prefix tuning (0.21.2
    /// `PeftModel._setup_prompt_encoder`: its keys and values travel in a cache that
    /// checkpointing cannot recompute).
    #[must_use]
    pub const fn refuses_checkpointing(self) -> bool {
        matches!(self, Self::PrefixTuning)
    }

    /// Whether the method prepends `adapter.virtual_tokens` of its own (prompt and prefix
    /// tuning).
    #[must_use]
    pub const fn uses_virtual_tokens(self) -> bool {
        matches!(self, Self::PromptTuning | Self::PrefixTuning)
    }
}

/// Storage of the frozen base weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantization {
    /// The load dtype (see [`Precision`]).
    None,
    /// bitsandbytes LLM.int8.
    Int8,
    /// bitsandbytes NF4.
    Nf4,
    /// NF4 with double quantization of the absmax constants.
    Nf4Dq,
    /// bitsandbytes FP4.
    Fp4,
    /// FP4 with double quantization.
    Fp4Dq,
    /// A GPTQ/AWQ-style int4 checkpoint (group size 128, fp16 scales and packed zeros).
    Gptq4,
    /// gpt-oss's MXFP4 experts kept as stored for inference (transformers 5.24
    /// `Mxfp4HfQuantizer` with the triton kernels): 4-bit values in blocks of 32 with one
    /// 8-bit scale each; attention, router, embedding and lm_head stay 16-bit
    /// (`modules_to_not_convert`).
    Mxfp4,
    /// MLX affine storage (`mlx_lm.convert -q`, the `mlx-community/*-2bit` repos): every
    /// Linear and the embedding at 2 bits in groups of 64 ([`AffineQuant`]).
    Mlx2,
    /// MLX affine, 3 bits, groups of 64.
    Mlx3,
    /// MLX affine, 4 bits, groups of 64 (`mlx_lm.convert -q`'s default, the
    /// `mlx-community/*-4bit` repos).
    Mlx4,
    /// MLX affine, 5 bits, groups of 64.
    Mlx5,
    /// MLX affine, 6 bits, groups of 64.
    Mlx6,
    /// MLX affine, 8 bits, groups of 64.
    Mlx8,
    /// MLX affine, 4 bits, groups of 32 (`--q-group-size 32`).
    Mlx4G32,
    /// MLX affine, 8 bits, groups of 32.
    Mlx8G32,
}

/// MLX's affine quantization (mlx 0.32 `ops.cpp` `quantize`): `bits` per weight packed into
/// uint32 words, and per group of `group_size` weights a scale and a bias in the weight's
/// dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AffineQuant {
    /// Bits per weight.
    pub bits: u64,
    /// Weights per scale and bias.
    pub group_size: u64,
}

impl AffineQuant {
    /// Bytes of a `rows × cols` weight whose unquantized dtype has `dtype_bytes`: per row
    /// `cols · bits / 32` uint32 words and a scale and a bias per group
    /// (`{uint32, w.dtype(), w.dtype()}`, mlx `ops.cpp`).
    #[must_use]
    pub const fn bytes(self, rows: u64, cols: u64, dtype_bytes: u64) -> u64 {
        let words = (cols * self.bits).div_ceil(32);
        let groups = cols.div_ceil(self.group_size);
        rows * (words * 4 + groups * 2 * dtype_bytes)
    }
}

impl Quantization {
    /// All values.
    pub const ALL: [Self; 16] = [
        Self::None,
        Self::Int8,
        Self::Nf4,
        Self::Nf4Dq,
        Self::Fp4,
        Self::Fp4Dq,
        Self::Gptq4,
        Self::Mxfp4,
        Self::Mlx4,
        Self::Mlx8,
        Self::Mlx2,
        Self::Mlx3,
        Self::Mlx5,
        Self::Mlx6,
        Self::Mlx4G32,
        Self::Mlx8G32,
    ];

    /// The value named `s`, or by one of its aliases ([`crate::vocabulary::Quantization`]).
    #[must_use]
    pub fn from_name(s: &str) -> Option<Self> {
        crate::vocabulary::Quantization::parse(s).map(Self::from)
    }

    /// The name on the command line and in moro.yaml.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Quantization::from(self).as_str()
    }

    /// MLX's affine storage, if this is it.
    #[must_use]
    pub const fn mlx(self) -> Option<AffineQuant> {
        let (bits, group_size) = match self {
            Self::Mlx2 => (2, 64),
            Self::Mlx3 => (3, 64),
            Self::Mlx4 => (4, 64),
            Self::Mlx5 => (5, 64),
            Self::Mlx6 => (6, 64),
            Self::Mlx8 => (8, 64),
            Self::Mlx4G32 => (4, 32),
            Self::Mlx8G32 => (8, 32),
            _ => return None,
        };
        Some(AffineQuant { bits, group_size })
    }

    /// Whether this is a bitsandbytes 4-bit type.
    #[must_use]
    pub const fn is_bnb4(self) -> bool {
        matches!(self, Self::Nf4 | Self::Nf4Dq | Self::Fp4 | Self::Fp4Dq)
    }

    /// Whether the absmax constants are double-quantized.
    #[must_use]
    pub const fn double_quant(self) -> bool {
        matches!(self, Self::Nf4Dq | Self::Fp4Dq)
    }
}

impl Serialize for Quantization {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Quantization {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown quantization `{name}`")))
    }
}

/// Which Linear modules get LoRA adapters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Targets {
    /// Every Linear in the decoder layers (PEFT `all-linear`: all but the output layer).
    AllLinear,
    /// Modules by name (`q_proj`, `v_proj`, ...).
    Names(Vec<String>),
}

impl Targets {
    /// Whether a Linear named `name` is targeted.
    #[must_use]
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::AllLinear => true,
            Self::Names(v) => v.iter().any(|n| n == name),
        }
    }
}

/// The default LoRA targets: the attention and MLP projections of a Llama-style decoder.
pub const DEFAULT_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The parameter-efficient method a LoRA / QLoRA job trains, and its settings (PEFT's
/// `PeftConfig` of that method: `LoraConfig`, `IA3Config`, `OFTConfig`, ...). Each setting
/// applies to the methods its doc names; the others ignore it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeftConfig {
    /// The method: LoRA, one of PEFT's others, or (litgpt only) a lit-gpt LLaMA-Adapter.
    #[serde(default)]
    pub method: PeftKind,
    /// Rank r (LoRA and its kin; OFT's block count; AdaLoRA's `init_r`).
    pub rank: u64,
    /// Alpha (scaling = alpha / r); no effect on memory.
    pub alpha: f64,
    /// Dropout probability on the adapter input.
    pub dropout: f64,
    /// Targeted modules.
    pub targets: Targets,
    /// DoRA (weight-decomposed LoRA).
    pub dora: bool,
    /// IA³'s feedforward modules, whose input (not output) the vector scales; `None`: PEFT's
    /// default for decoders, the MLP's down projection (the Linears reading the MLP's
    /// intermediate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedforward: Option<Targets>,
    /// Prompt and prefix tuning's virtual tokens (`num_virtual_tokens`).
    #[serde(default)]
    pub virtual_tokens: u64,
    /// LoKr's `decompose_factor`; `None` is PEFT's −1 (factors near the square root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decompose_factor: Option<u64>,
    /// BOFT's `boft_block_size`; `None` is PEFT's 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    /// BOFT's `boft_n_butterfly_factor`; `None` is PEFT's 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub butterfly_factor: Option<u64>,
}

impl PeftConfig {
    /// BOFT's block size b (PEFT's default 4).
    #[must_use]
    pub fn boft_block_size(&self) -> u64 {
        self.block_size.unwrap_or(4)
    }

    /// BOFT's butterfly factors D (PEFT's default 1).
    #[must_use]
    pub fn boft_butterfly_factor(&self) -> u64 {
        self.butterfly_factor.unwrap_or(1)
    }
}

impl Default for PeftConfig {
    fn default() -> Self {
        Self {
            method: PeftKind::Lora,
            rank: 16,
            alpha: 32.0,
            dropout: 0.05,
            targets: Targets::Names(DEFAULT_TARGETS.map(str::to_owned).to_vec()),
            dora: false,
            feedforward: None,
            virtual_tokens: 20,
            decompose_factor: None,
            block_size: None,
            butterfly_factor: None,
        }
    }
}

/// Optimizer, named as the HF Trainer's `optim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// `torch.optim.AdamW`, foreach implementation (a bare AdamW on CUDA).
    AdamwTorch,
    /// `torch.optim.AdamW(fused=True)`; the HF Trainer default with torch ≥ 2.8.
    AdamwTorchFused,
    /// bitsandbytes 8-bit AdamW.
    Adamw8bit,
    /// bitsandbytes paged 8-bit AdamW.
    PagedAdamw8bit,
    /// bitsandbytes paged 32-bit AdamW.
    PagedAdamw32bit,
    /// HF Adafactor.
    Adafactor,
    /// bitsandbytes Lion, 32-bit.
    Lion32bit,
    /// bitsandbytes Lion, 8-bit.
    Lion8bit,
    /// SGD without momentum.
    Sgd,
    /// SGD with momentum.
    SgdMomentum,
}

impl Optimizer {
    /// All values.
    pub const ALL: [Self; 10] = [
        Self::AdamwTorch,
        Self::AdamwTorchFused,
        Self::Adamw8bit,
        Self::PagedAdamw8bit,
        Self::PagedAdamw32bit,
        Self::Adafactor,
        Self::Lion32bit,
        Self::Lion8bit,
        Self::Sgd,
        Self::SgdMomentum,
    ];

    /// The HF Trainer `optim` name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Optimizer::from(self).as_str()
    }

    /// Whether states live in CUDA managed memory outside PyTorch's counters.
    #[must_use]
    pub const fn is_paged(self) -> bool {
        matches!(self, Self::PagedAdamw8bit | Self::PagedAdamw32bit)
    }

    /// Whether bitsandbytes implements it (its 8-bit, paged and Lion optimizers).
    #[must_use]
    pub const fn is_bitsandbytes(self) -> bool {
        matches!(
            self,
            Self::Adamw8bit
                | Self::PagedAdamw8bit
                | Self::PagedAdamw32bit
                | Self::Lion32bit
                | Self::Lion8bit
        )
    }
}

/// Numeric precision of weights and compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// Weights (and trainable weights) in bf16, no autocast ("pure bf16", litgpt `bf16-true`).
    Bf16,
    /// fp32 trainable weights under bf16 autocast (HF Trainer `bf16=True`).
    Bf16Mixed,
    /// fp32 trainable weights under fp16 autocast (HF Trainer `fp16=True`).
    Fp16Mixed,
    /// Everything fp32.
    Fp32,
}

impl Precision {
    /// All values.
    pub const ALL: [Self; 4] = [Self::Bf16, Self::Bf16Mixed, Self::Fp16Mixed, Self::Fp32];

    /// The name on the command line and in moro.yaml.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Precision::from(self).as_str()
    }

    /// Whether autocast is on.
    #[must_use]
    pub const fn autocast(self) -> bool {
        matches!(self, Self::Bf16Mixed | Self::Fp16Mixed)
    }
}

/// Attention implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// FlashAttention-2.
    Flash,
    /// `torch.nn.functional.scaled_dot_product_attention` (flash / mem-efficient backends).
    Sdpa,
    /// Eager attention: materializes the a·s² probabilities. With the litgpt stack, which
    /// has no eager path, this is SDPA's math kernel (what lit-gpt ran for multi-query
    /// models before it expanded their k/v heads, or with the flash and memory-efficient
    /// backends disabled).
    Eager,
}

impl Attention {
    /// The name on the command line and in moro.yaml.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Attention::from(self).as_str()
    }
}

/// The training stack: libraries allocate differently (validation/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stack {
    /// transformers Trainer + PEFT + bitsandbytes (+ accelerate).
    Hf,
    /// TRL `SFTTrainer` (current: chunked NLL loss, bf16 LoRA on quantized models).
    Trl,
    /// Lightning litgpt (chunked cross-entropy, bf16 adapters, pure bf16).
    Litgpt,
    /// torchtune (chunked cross-entropy, bf16 adapters).
    Torchtune,
    /// Unsloth's `FastLanguageModel` on TRL (its fused LoRA kernels, fused cross-entropy and
    /// host-offloaded checkpoints).
    Unsloth,
    /// Apple's MLX, `mlx_lm.lora` (its lazy graph, fp32 adapters on the last layers,
    /// MLX-quantized bases; docs/mlx-memory.md).
    Mlx,
}

impl Stack {
    /// All values.
    pub const ALL: [Self; 6] = [
        Self::Hf,
        Self::Trl,
        Self::Litgpt,
        Self::Torchtune,
        Self::Unsloth,
        Self::Mlx,
    ];

    /// The name on the command line and in moro.yaml.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Stack::from(self).as_str()
    }
}

/// How the loss is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossImpl {
    /// Full logits + `F.cross_entropy` (transformers `ForCausalLMLoss`).
    Standard,
    /// transformers 4.46-4.48: as `Standard`, plus an fp32 `shift_logits.contiguous()` copy
    /// in the forward pass.
    StandardLegacy,
    /// Model code that shifts the logits with a `.contiguous()` copy and takes
    /// `CrossEntropyLoss` in their own dtype (no fp32 upcast): GPT-2-era code such as
    /// GPT-BigCode and Qwen-1.
    StandardNoUpcast,
    /// TRL ≥ 1.7 `chunked_nll`: lm_head applied in 256-token checkpointed chunks.
    ChunkedNll,
    /// litgpt / torchtune chunked cross-entropy (logits in chunks, fp32 upcast per chunk).
    Chunked,
    /// Fused linear cross-entropy (Liger, cut-cross-entropy): no T·V buffer.
    Fused,
}

impl LossImpl {
    /// The name moro.yaml's `training.loss` gives it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        crate::vocabulary::Loss::from(self).as_str()
    }
}

/// Whether every sample fills `seq_len` or batches are padded to their longest sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Padding {
    /// Packed or padding-free: no attention mask.
    Packed,
    /// Right-padded, with an attention mask: to `seq_len`, or each batch to its own longest
    /// sample (TRL, axolotl and LLaMA-Factory's collators) with `seq_len` the longest. The
    /// estimate is the longest batch's; over a run of varying lengths the cache climbs
    /// (docs/memory-anatomy.md §17).
    Padded,
    /// Each batch padded to its own longest sample, with the longest sample put in the first
    /// batch so that an out-of-memory shows at step 1 (lit-gpt's 2023 `finetune/*.py`:
    /// `get_longest_seq_length` and the longest sample swapped to index 0). `seq_len` is
    /// that longest batch; it has no earlier step of its size whose buffers could still be
    /// alive.
    #[serde(rename = "longest_first")]
    LongestFirst,
}

impl Padding {
    /// Whether the model receives an attention mask.
    #[must_use]
    pub const fn has_mask(self) -> bool {
        !matches!(self, Self::Packed)
    }
}

/// How the job is spread over GPUs (one GPU: [`Parallel::single`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parallel {
    /// Data-parallel (sharding) degree.
    pub data_parallel: u64,
    /// Tensor-parallel degree.
    pub tensor_parallel: u64,
    /// Pipeline / sequential layer-placement degree (layers split over GPUs, no data parallel).
    pub pipeline: u64,
    /// Sharding strategy over the data-parallel group.
    pub sharding: Sharding,
    /// CPU offload of optimizer states (and with ZeRO-3/FSDP, parameters).
    pub offload: Offload,
    /// Nodes (hosts) the GPUs span, each with `gpus() / nodes` of them; divides
    /// [`Parallel::gpus`]. Default 1 (absent from JSON written before it existed, and left
    /// out of JSON when 1). It matters to FSDP HYBRID_SHARD, whose shard group is one node
    /// ([`Parallel::hybrid_shard_group`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub nodes: u64,
    /// DeepSpeed's `zero_optimization.reduce_bucket_size` in elements; `None` is `"auto"`,
    /// which the HF integration fills with `hidden_size * hidden_size`
    /// (`integrations/deepspeed.py` `trainer_config_process`). ZeRO-1/2 allocate two such
    /// buffers for every backward (`stage_1_and_2.py` `backward`, with `overlap_comm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reduce_bucket: Option<u64>,
    /// The FSDP implementation when the sharding is FSDP's ([`FsdpApi`]), resolved from the
    /// stack when not given; FSDP1 (and meaningless) otherwise.
    #[serde(default, skip_serializing_if = "FsdpApi::is_fsdp1")]
    pub fsdp: FsdpApi,
}

const fn one() -> u64 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
const fn is_one(n: &u64) -> bool {
    *n == 1
}

impl Parallel {
    /// One GPU, no sharding.
    #[must_use]
    pub const fn single() -> Self {
        Self {
            data_parallel: 1,
            tensor_parallel: 1,
            pipeline: 1,
            sharding: Sharding::None,
            offload: Offload::None,
            nodes: 1,
            reduce_bucket: None,
            fsdp: FsdpApi::Fsdp1,
        }
    }

    /// GPUs used.
    #[must_use]
    pub const fn gpus(&self) -> u64 {
        self.data_parallel * self.tensor_parallel * self.pipeline
    }

    /// GPUs on each node: [`Parallel::gpus`] over [`Parallel::nodes`] (at least 1).
    #[must_use]
    pub const fn gpus_per_node(&self) -> u64 {
        let n = self.gpus() / if self.nodes == 0 { 1 } else { self.nodes };
        if n == 0 { 1 } else { n }
    }

    /// The data-parallel ranks FSDP HYBRID_SHARD shards over: those of one node.
    ///
    /// PyTorch's `torch.distributed.fsdp.ShardingStrategy.HYBRID_SHARD`: "Apply `FULL_SHARD`
    /// within a node, and replicate parameters across nodes" (FSDP API docs,
    /// `torch/distributed/fsdp/api.py`); the default intra-node process group is built from
    /// `torch.cuda.device_count()` ranks per node (`_init_intra_and_inter_node_groups` in
    /// `torch/distributed/fsdp/_init_utils.py`). So the group is the data-parallel degree
    /// over the node count: 8 for 16 GPUs on 2 nodes of 8, 16 for 16 GPUs on one node.
    #[must_use]
    pub const fn hybrid_shard_group(&self) -> u64 {
        let dp = if self.data_parallel == 0 {
            1
        } else {
            self.data_parallel
        };
        let nodes = if self.nodes == 0 { 1 } else { self.nodes };
        let g = dp / nodes;
        if g == 0 { 1 } else { g }
    }
}

impl Default for Parallel {
    fn default() -> Self {
        Self::single()
    }
}

/// Sharding strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Plain DDP (or one GPU).
    None,
    /// DeepSpeed ZeRO-1: optimizer states sharded.
    Zero1,
    /// DeepSpeed ZeRO-2: + gradients sharded.
    Zero2,
    /// DeepSpeed ZeRO-3: + parameters sharded.
    Zero3,
    /// FSDP FULL_SHARD (≈ ZeRO-3).
    FsdpFullShard,
    /// FSDP SHARD_GRAD_OP (≈ ZeRO-2).
    FsdpShardGradOp,
    /// FSDP HYBRID_SHARD: full shard inside a node, replicate across nodes.
    FsdpHybridShard,
}

impl Sharding {
    /// One of FSDP's strategies.
    #[must_use]
    pub const fn is_fsdp(self) -> bool {
        matches!(
            self,
            Self::FsdpFullShard | Self::FsdpShardGradOp | Self::FsdpHybridShard
        )
    }
}

/// Which FSDP implementation shards the job: PyTorch's `FullyShardedDataParallel` wrapper
/// (FSDP1: flat parameters, gathered on an unshard stream) or `fully_shard` (FSDP2:
/// per-parameter sharding, its all-gather output made on a copy-in stream). accelerate's
/// `fsdp_version` (default 1, `accelerate/utils/dataclasses.py` 1.16); torchtune's
/// distributed recipes call `fully_shard` from 0.3 (pytorch/torchtune#1287); Lightning's
/// `FSDPStrategy` wraps with FSDP1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsdpApi {
    /// `torch.distributed.fsdp.FullyShardedDataParallel`.
    #[default]
    Fsdp1,
    /// `torch.distributed.fsdp.fully_shard`.
    Fsdp2,
}

impl FsdpApi {
    /// accelerate's `fsdp_version`.
    #[must_use]
    pub const fn version(self) -> u64 {
        match self {
            Self::Fsdp1 => 1,
            Self::Fsdp2 => 2,
        }
    }

    /// The implementation `stack` wraps with at `versions` when the job does not say
    /// ([`crate::stack::StackProfile::fsdp_api`], [`Versions::torchtune_wraps_with_fsdp1`]).
    #[must_use]
    pub fn default_for(stack: Stack, versions: &Versions) -> Self {
        let api = stack.profile().fsdp_api;
        if api == Self::Fsdp2 && versions.torchtune_wraps_with_fsdp1() {
            Self::Fsdp1
        } else {
            api
        }
    }

    /// From accelerate's `fsdp_version` (1 or 2).
    #[must_use]
    pub const fn from_version(v: u64) -> Option<Self> {
        match v {
            1 => Some(Self::Fsdp1),
            2 => Some(Self::Fsdp2),
            _ => None,
        }
    }

    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
    fn is_fsdp1(&self) -> bool {
        *self == Self::Fsdp1
    }
}

/// What is offloaded to host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    /// Nothing.
    None,
    /// Optimizer states (and fp32 master weights).
    Optimizer,
    /// Optimizer states and parameters (ZeRO-3 / FSDP only).
    OptimizerAndParams,
}

/// KV-cache storage for inference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// Same as the compute dtype (bf16/fp16).
    F16,
    /// fp8 KV cache.
    F8,
    /// fp32 KV cache (fp32 models).
    F32,
}

impl KvDtype {
    /// Bytes per cached element.
    #[must_use]
    pub const fn bytes(self) -> u64 {
        match self {
            Self::F16 => 2,
            Self::F8 => 1,
            Self::F32 => 4,
        }
    }
}

/// Library versions of the stack, where allocation behaviour changed between releases.
/// `None` means a current release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Versions {
    /// transformers `(major, minor)`.
    pub transformers: Option<(u32, u32)>,
    /// bitsandbytes `(major, minor, patch)`.
    pub bitsandbytes: Option<(u32, u32, u32)>,
    /// TRL `(major, minor)`.
    pub trl: Option<(u32, u32)>,
    /// PyTorch `(major, minor)`.
    #[serde(default)]
    pub torch: Option<(u32, u32)>,
    /// torchao `(major, minor)` (torchtune's NF4 weights).
    #[serde(default)]
    pub torchao: Option<(u32, u32)>,
    /// torchtune `(major, minor)`.
    #[serde(default)]
    pub torchtune: Option<(u32, u32)>,
    /// MLX `(major, minor, patch)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlx: Option<(u32, u32, u32)>,
    /// PEFT `(major, minor)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peft: Option<(u32, u32)>,
}

impl Versions {
    /// From mlx 0.32.2 `nn.losses.cross_entropy` runs the fused `mx.fast.cross_entropy` on a
    /// GPU (`use_fast`), which keeps only the logits for its backward; before, the shifted
    /// logits, their softmax and the scattered target gradient
    /// ([`crate::estimate::mlx::UNFUSED_LOSS_COPIES`]).
    #[must_use]
    pub fn mlx_fused_cross_entropy(&self) -> bool {
        self.mlx.is_none_or(|v| v >= (0, 32, 2))
    }

    /// Why this PEFT release refuses DoRA (`use_dora=True`), on a quantized base where
    /// `quantized`; `None` where it takes it (or the release is unknown). DoRA came in 0.9.0
    /// (#1474); there its bitsandbytes layers raise "does not support DoRA yet", and QDoRA
    /// came in 0.10.0 (#1518).
    #[must_use]
    pub fn peft_refuses_dora(&self, quantized: bool) -> Option<&'static str> {
        match self.peft? {
            v if v < (0, 9) => Some("DoRA came in PEFT 0.9.0"),
            v if quantized && v < (0, 10) => Some(
                "PEFT 0.9's bitsandbytes layers raise \"does not support DoRA yet\"; DoRA on a \
                 quantized base came in 0.10.0",
            ),
            _ => None,
        }
    }

    /// From PEFT 0.21 AdaLoRA's `ranknum` requires grad once `get_peft_model` returns (0.19.1
    /// and 0.20.0 leave it frozen, as `AdaLoraLayer.update_layer` sets it; checked by
    /// building each release's model), so `… / ranknum` saves its out-wide dividend for
    /// `ranknum`'s gradient.
    #[must_use]
    pub fn adalora_saves_dividend(&self) -> bool {
        self.peft.is_none_or(|v| v >= (0, 21))
    }

    /// bitsandbytes before 0.43.2 saved each 4-bit matmul's input for backward
    /// (`ctx.tensors = (A, B)`); commit 9e753741 "fix QLoRA mem bug: delete useless buffered
    /// activation" (#1270), first released in 0.43.2, saves only the packed weight.
    #[must_use]
    pub fn bnb4_saves_input(&self) -> bool {
        self.bitsandbytes.is_some_and(|v| v < (0, 43, 2))
    }

    /// TRL before 0.26 prepared quantized models itself: PEFT's
    /// `prepare_model_for_kbit_training` (fp32 upcast), fp32 adapters, then (with `bf16`)
    /// `peft_module_casting_to_bf16`, which casts embeddings and lm_head back to bf16 and
    /// keeps norms in fp32 (`trl/trainer/sft_trainer.py`, `utils.py` at v0.13.0). From 0.26
    /// SFTTrainer casts the trainable parameters of quantized models to bf16 and never calls
    /// the PEFT upcast.
    #[must_use]
    pub fn trl_legacy_kbit(&self) -> bool {
        self.trl.is_some_and(|v| v < (0, 26))
    }

    /// Before PyTorch 2.0, `Module.zero_grad` and `Optimizer.zero_grad` defaulted to
    /// `set_to_none=False` (torch 2.0 release notes: "`set_to_none=True` is now the
    /// default"): the HF Trainer's `model.zero_grad()` after each optimizer step zeroes the
    /// `.grad` tensors in place, so every gradient stays allocated through the next forward
    /// and backward, whatever the gradient accumulation.
    #[must_use]
    pub fn zero_grad_keeps_grads(&self) -> bool {
        self.torch.is_some_and(|v| v < (2, 0))
    }

    /// torchao before 0.2 found each weight's nearest NF4 code over all `n × 16`
    /// candidates at once (`NF4Tensor.quantize_tensor_nearest`: `(value - nf4).abs()`); 0.2
    /// quantizes in chunks of 1024² elements ("perform in chunks", #196, 2024-05-01).
    /// torchtune 0.1.x pins torchao 0.1.
    #[must_use]
    pub fn torchao_unchunked_nf4(&self) -> bool {
        self.torchao.is_some_and(|v| v < (0, 2))
    }

    /// The HF Trainer gives `nn.Embedding` weights 32-bit states under bitsandbytes 8-bit
    /// optimizers only since it creates those optimizers itself (`optim="adamw_bnb_8bit"`,
    /// transformers PR #15622, first released in 4.19); before, a bnb optimizer was built by
    /// the user and passed in `optimizers=(...)`, with no override.
    #[must_use]
    pub fn trainer_embedding_override(&self) -> bool {
        self.transformers.is_none_or(|v| v >= (4, 19))
    }

    /// torchtune's distributed recipes wrapped with FSDP1 (`FullyShardedDataParallel`)
    /// before 0.3; `fully_shard` (FSDP2) from 0.3 (pytorch/torchtune#1287, the full
    /// fine-tune's recipe, the last to move).
    #[must_use]
    pub fn torchtune_wraps_with_fsdp1(&self) -> bool {
        self.torchtune.is_some_and(|v| v < (0, 3))
    }

    /// torchtune's recipes before 0.3 kept a `.contiguous()` copy of the shifted fp32 logits
    /// alive through backward (`logits = logits[..., :-1, :].contiguous()`,
    /// `recipes/full_finetune_single_device.py` at v0.2.1); 0.3 shifts the labels instead
    /// (`torch.hstack((labels[..., 1:], self.ignore_labels_cache[...]))`) and `del logits`
    /// after the loss.
    #[must_use]
    pub fn torchtune_shifted_logits_copy(&self) -> bool {
        self.torchtune.is_some_and(|v| v < (0, 3))
    }

    /// TRL 1.7 made `chunked_nll` the default SFT loss (commit b58947c).
    #[must_use]
    pub fn trl_chunked_loss(&self) -> bool {
        self.trl.is_none_or(|v| v >= (1, 7))
    }

    /// transformers 4.46–4.48 computed the loss on a `.contiguous()` fp32 copy of the
    /// shifted logits (removed by PR #35646, merged 2025-01-13, first released in 4.49).
    #[must_use]
    pub fn shift_logits_copy(&self) -> bool {
        self.transformers
            .is_some_and(|v| ((4, 46)..(4, 49)).contains(&v))
    }

    /// Before 4.52 the model's layer loop checkpointed each decoder layer from outside,
    /// `self._gradient_checkpointing_func(decoder_layer.__call__, …)` (modeling_llama.py at
    /// 4.51.3), with `use_reentrant=True` when not told (`gradient_checkpointing_enable`), so
    /// under FSDP1 the reentrant checkpoint wraps the FSDP unit and its recompute runs FSDP's
    /// pre-forward on a detached leaf input. From 4.52 `GradientCheckpointingLayer.__call__`
    /// (modeling_layers.py; Llama, Mistral and Qwen2 in 4.52, the rest in 4.53 by PR #38913)
    /// checkpoints inside the unit.
    #[must_use]
    pub fn reentrant_checkpoint_wraps_layer_unit(&self) -> bool {
        self.transformers.is_some_and(|v| v < (4, 52))
    }
}

/// A job to estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Method.
    pub method: Method,
    /// Base-weight quantization (QLoRA defaults to NF4 with double quant).
    pub quantization: Quantization,
    /// The adapter method and its settings (LoRA / QLoRA jobs).
    pub adapter: PeftConfig,
    /// Micro-batch per GPU (inference: concurrent sequences).
    pub micro_batch_size: u64,
    /// Tokens per sequence (inference: prompt + generated context).
    pub seq_len: u64,
    /// Gradient accumulation steps.
    pub grad_accum: u64,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Gradient checkpointing.
    pub gradient_checkpointing: bool,
    /// Attention implementation.
    pub attention: Attention,
    /// Precision.
    pub precision: Precision,
    /// Training stack.
    pub stack: Stack,
    /// Loss implementation; `None` = the stack's default.
    pub loss: Option<LossImpl>,
    /// Packed or padded batches.
    pub padding: Padding,
    /// Parallelism.
    pub parallel: Parallel,
    /// KV cache dtype (inference).
    pub kv_dtype: KvDtype,
    /// Library versions, for behaviour that changed between releases (default: current).
    #[serde(default)]
    pub versions: Versions,
    /// Optimizer step fused into the backward pass (torchtune `optimizer_in_bwd: True`): each
    /// parameter is stepped in its `register_post_accumulate_grad_hook` and its gradient set
    /// to `None` at once (`torchtune/training/memory.py` `register_optim_in_bwd_hooks`), so
    /// at most one parameter's gradient is alive. Needs gradient accumulation 1.
    #[serde(default)]
    pub optimizer_in_backward: bool,
    /// The images of each sample (vision-language models; none for text models).
    #[serde(default)]
    pub images: crate::vision::Images,
    /// What trains in a vision-language model's tower and projector.
    #[serde(default)]
    pub vision: VisionTraining,
    /// Liger Kernel's kernels patched into the model (none by default).
    #[serde(default, skip_serializing_if = "liger_off")]
    pub liger: Liger,
    /// `torch.compile` of the model (the HF Trainer's `torch_compile=True`, torchtune's
    /// `compile: True`): AOTAutograd's partitioner decides what is saved.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compile: bool,
    /// Checkpointed layer inputs offloaded to host memory (torchtune's
    /// `enable_activation_offloading: True`, Unsloth's `"unsloth"` checkpointing): how,
    /// and how many stay on the GPU, is the stack's [`crate::stack::ActivationOffload`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub activation_offload: bool,
    /// How many decoder layers, the last ones, train (MLX's `num_layers`: `mlx_lm.lora`
    /// adapts, or unfreezes, `model.layers[-num_layers:]`); `None`: every layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapted_layers: Option<u64>,
    /// An encoder-decoder model's target tokens per sample (the labels the decoder reads,
    /// `max_target_length` in transformers' seq2seq examples); `seq_len` is the encoder's.
    /// `None`: as many as `seq_len` ([`Job::target_tokens`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_len: Option<u64>,
    /// The tokens an inference job generates one at a time, the last of `seq_len`
    /// (transformers' `max_new_tokens`; the prompt is the rest). `None`: the whole context
    /// is prefilled at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tokens: Option<u64>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
const fn liger_off(l: &Liger) -> bool {
    !l.any()
}

/// What a vision-language job trains in the vision tower and projector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VisionTraining {
    /// Frozen, no adapters: the usual default (LLaMA-Factory `freeze_vision_tower` and
    /// `freeze_multi_modal_projector`; TRL's VLM recipes target the language model only).
    /// Nothing in the tower needs a gradient, so autograd records none of its forward.
    #[default]
    Frozen,
    /// The LoRA targets also adapt the tower's and projector's matching Linears, as PEFT's
    /// name matching does when `target_modules` is a list or `all-linear` (Unsloth's
    /// `finetune_vision_layers=True`).
    Adapted,
    /// Tower and projector weights train with the language model (a full fine-tune).
    Trained,
}

impl Default for Job {
    fn default() -> Self {
        Self {
            method: Method::Adapters,
            quantization: Quantization::None,
            adapter: PeftConfig::default(),
            micro_batch_size: 1,
            seq_len: 2048,
            grad_accum: 1,
            optimizer: Optimizer::AdamwTorchFused,
            gradient_checkpointing: false,
            attention: Attention::Sdpa,
            precision: Precision::Bf16Mixed,
            stack: Stack::Hf,
            loss: None,
            padding: Padding::Packed,
            parallel: Parallel::single(),
            kv_dtype: KvDtype::F16,
            versions: Versions::default(),
            optimizer_in_backward: false,
            images: crate::vision::Images::default(),
            vision: VisionTraining::Frozen,
            liger: Liger::default(),
            compile: false,
            activation_offload: false,
            adapted_layers: None,
            target_len: None,
            new_tokens: None,
        }
    }
}

/// Largest sequence length moro accepts (tokens): far above any real context, small
/// enough that every product of shapes stays inside `u64`.
pub const MAX_SEQ_LEN: u64 = 1 << 24;
/// Largest micro-batch moro accepts.
pub const MAX_BATCH: u64 = 1 << 16;

/// A job that cannot be estimated, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {message}")]
pub struct JobError {
    /// The offending field, as named in moro.yaml / on the command line.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Job {
    /// The decoder's tokens per sample of an encoder-decoder model: `target_len`, else
    /// `seq_len`.
    #[must_use]
    pub fn target_tokens(&self) -> u64 {
        self.target_len.unwrap_or(self.seq_len)
    }

    /// The tokens per sample in words: `seq_len`, `seq_len → target_len` for an
    /// encoder-decoder's two sequences, or the prompt and the generated tokens.
    #[must_use]
    pub fn tokens_in_words(&self) -> String {
        match (self.target_len, self.new_tokens) {
            (Some(t), _) => format!("{} → {t}", self.seq_len),
            (None, Some(n)) => format!(
                "{} ({} prompt + {n} generated)",
                self.seq_len,
                self.seq_len.saturating_sub(n)
            ),
            (None, None) => self.seq_len.to_string(),
        }
    }

    /// The prompt of an inference job: `seq_len` less the generated tokens.
    #[must_use]
    pub fn prompt_tokens(&self) -> u64 {
        self.seq_len.saturating_sub(self.new_tokens.unwrap_or(0))
    }

    /// Whether PEFT puts an adapter on `l`: a targeted `nn.Linear` module with this job's
    /// library versions ([`crate::model::Linear::is_module`]), or, for LoRA, a weight
    /// stacked from transformers 5 ([`Self::adapts_stacked`]).
    #[must_use]
    pub fn adapts(&self, l: &crate::model::Linear) -> bool {
        self.adapter.targets.matches(&l.name)
            && (self.is_module(l) || self.adapts_stacked(l))
            && (l.role != crate::model::LinearRole::Vision
                || self.vision == VisionTraining::Adapted)
    }

    /// Of a group of `layers` decoder layers, how many train: all of them, or their share of
    /// the last [`Job::adapted_layers`] (groups of a model whose layers differ are taken in
    /// proportion).
    #[must_use]
    pub fn trained_share(&self, model: &crate::model::ModelSpec, layers: u64) -> u64 {
        match self.adapted_layers {
            Some(n) if n < model.num_layers && model.num_layers > 0 => {
                (layers * n).div_ceil(model.num_layers)
            }
            _ => layers,
        }
    }

    /// Whether `l` is an `nn.Linear` module in this job: always on a stack with its own
    /// modules, else with this job's transformers ([`crate::model::Linear::is_module`]).
    #[must_use]
    pub fn is_module(&self, l: &crate::model::Linear) -> bool {
        !self.stack.profile().transformers_modules || l.is_module(&self.versions)
    }

    /// Whether `l` is a transformers-5 stacked expert or router weight that PEFT adapts:
    /// PEFT 0.21 rewrites the transformers-4 names of Mixtral (`w1`, `w3`, `w2`, `gate`) and
    /// of the Qwen2-MoE family (Qwen2/3-MoE, DeepSeek V2/V3: `gate_proj`, `up_proj`,
    /// `down_proj`, `gate`) into `target_parameters` (`utils/transformers_weight_conversion.py`
    /// `_MOE_TARGET_MODULE_MAPPING`), LoRA only, and wraps each stacked parameter in a
    /// `ParamWrapper`. A targeted name is not checked here ([`Self::adapts`]).
    #[must_use]
    pub fn adapts_stacked(&self, l: &crate::model::Linear) -> bool {
        l.layout == crate::model::WeightLayout::StackedFrom5
            && !self.is_module(l)
            && self.adapter.method == PeftKind::Lora
            && !self.adapter.dora
    }

    /// What the precision means for this job's weights, in words: `bf16 weights, no fp32
    /// master copy`, `fp32 adapters under bf16 autocast`. `adapter_bytes` is the adapters'
    /// element size as the estimate resolved it ([`crate::estimate::Regime`]): PEFT keeps
    /// them in fp32 on a bf16 model (`autocast_adapter_dtype=True`), litgpt and torchtune in
    /// the model's dtype.
    #[must_use]
    pub const fn precision_in_words(&self, adapter_bytes: u64) -> &'static str {
        match (self.method, self.precision) {
            (Method::Inference, Precision::Fp32) => "fp32 weights",
            (Method::Inference, Precision::Fp16Mixed) => "fp16 compute",
            (Method::Inference, _) => "bf16 weights",
            (Method::Full, Precision::Bf16) => "bf16 weights, no fp32 master copy",
            (Method::Full, Precision::Bf16Mixed) => "fp32 weights under bf16 autocast",
            (Method::Full, Precision::Fp16Mixed) => "fp32 weights under fp16 autocast",
            (_, Precision::Bf16) if adapter_bytes == 4 => {
                "fp32 adapters on a bf16 model, no autocast"
            }
            (_, Precision::Bf16) => "bf16 adapters, no autocast",
            (_, Precision::Bf16Mixed) if adapter_bytes == 2 => "bf16 adapters under bf16 autocast",
            (_, Precision::Bf16Mixed) => "fp32 adapters under bf16 autocast",
            (_, Precision::Fp16Mixed) => "fp32 adapters under fp16 autocast",
            (_, Precision::Fp32) => "fp32 throughout",
        }
    }

    /// The checkpointing in words for a job line: ", checkpointing", with its inputs
    /// offloaded to host memory, or nothing.
    #[must_use]
    pub const fn checkpointing_in_words(&self) -> &'static str {
        match (self.gradient_checkpointing, self.activation_offload) {
            (false, _) => "",
            (true, false) => ", checkpointing",
            (true, true) => ", checkpointing offloaded to host memory",
        }
    }

    /// Unsloth's fused LoRA kernels run the layers: its patch applies to LoRA without
    /// dropout or DoRA (unsloth 2026.8.19 `FastLlamaModel.patch_peft_model`); otherwise
    /// PEFT's own `Linear.forward` does.
    #[must_use]
    pub fn unsloth_kernels(&self) -> bool {
        self.stack.profile().layer_kernels == crate::stack::LayerKernels::UnslothFused
            && self.method.is_peft()
            && self.adapter.method == PeftKind::Lora
            && !self.adapter.dora
            && self.adapter.dropout == 0.0
    }

    /// The loss the stack uses unless told otherwise.
    #[must_use]
    pub fn loss_impl(&self) -> LossImpl {
        match self.loss {
            Some(l) => l,
            None if self.liger.fused_linear_cross_entropy => LossImpl::Fused,
            None => match self.stack.profile().default_loss {
                DefaultLoss::Chunked => LossImpl::Chunked,
                DefaultLoss::Fused => LossImpl::Fused,
                DefaultLoss::SftTrainer if self.versions.trl_chunked_loss() => LossImpl::ChunkedNll,
                DefaultLoss::ModelCode | DefaultLoss::SftTrainer => {
                    if self.versions.shift_logits_copy() {
                        LossImpl::StandardLegacy
                    } else {
                        LossImpl::Standard
                    }
                }
            },
        }
    }

    /// Whether the loss is left to the model code's own (no `loss` set, and the stack's
    /// default is the model code's at its versions).
    #[must_use]
    pub fn loss_is_model_code(&self) -> bool {
        // The default is the model code's exactly when it resolves to transformers' loss.
        self.loss.is_none()
            && matches!(
                self.loss_impl(),
                LossImpl::Standard | LossImpl::StandardLegacy
            )
    }
}
