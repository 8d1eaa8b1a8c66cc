//! The moro.yaml data model: [`Recipe`] and its sections.
//!
//! Field names and nesting are the file format (issue 2 §5, plus the sections moro adds).
//! Unknown keys are an error everywhere. Every optional field documents its default; the
//! defaults of engine settings are taken from [`moro_core::job::Job::default`] so a recipe that
//! omits them means the same as the command line without the flag.

use std::fmt;

use moro_core::job::{Job, JobSettings, Targets, Versions};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::choices::{
    Attention, Backend, KvCacheDtype, Loss, LrScheduler, Method, Offload, Optimizer, Peft,
    Precision, Quantization, Stack, Strategy, Vision,
};
use crate::error::RecipeError;

/// A moro.yaml recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(title = "moro.yaml", extend("$id" = crate::SCHEMA_URL)))]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// A name for the recipe (free text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The recipe's own version (free text, e.g. `0.1.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The model and how its weights are adapted.
    pub model: ModelSection,
    /// Shape, optimizer, precision and the training stack.
    #[serde(default)]
    pub training: TrainingSection,
    /// Multi-GPU layout; absent = one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelSection>,
    /// The hardware the recipe was made for (informational when read back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<HardwareSection>,
    /// What moro predicted when it wrote the recipe (informational when read back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<PredictionSection>,
    /// The dataset `max_seq_length` was sized from, and its token lengths (`moro run` reads
    /// the p99 for the heal ladder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataSection>,
}

/// `model:` — the base model and the adaptation method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Hugging Face model id (`Qwen/Qwen2.5-1.5B`), or a path to a model directory or config.json.
    pub base: String,
    /// Method. Default: `qlora` when `quantization` is set to a quantized type, else `lora`
    /// (as `moro estimate` without `--method`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    /// Base-weight quantization. Default: `nf4-dq` for `qlora`, else `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// LoRA rank r. Default: 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub lora_rank: Option<u64>,
    /// LoRA alpha (scaling = alpha / r). Default: 2 × `lora_rank`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapter input, in [0, 1). Default: 0.05.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_dropout: Option<f64>,
    /// Modules that get adapters: a list of names or `all-linear`. Default: the attention and
    /// MLP projections (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`,
    /// `down_proj`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_modules: Option<TargetModules>,
    /// DoRA (weight-decomposed LoRA). Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dora: Option<bool>,
    /// The parameter-efficient method of a `lora`/`qlora` job: `lora`, PEFT's `ia3`, `vera`,
    /// `adalora`, `loha`, `lokr`, `oft`, `ln-tuning`, `prompt-tuning`, `prefix-tuning`, or
    /// lit-gpt's `adapter` /
    /// `adapter-v2` (`stack: litgpt`). Default: `lora`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peft: Option<Peft>,
    /// IA³'s feedforward modules, whose input (not output) is scaled. Default: PEFT's, the
    /// MLP's down projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedforward_modules: Option<TargetModules>,
    /// Prompt and prefix tuning's virtual tokens (PEFT `num_virtual_tokens`). Default: 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_048_576)))]
    pub virtual_tokens: Option<u64>,
    /// LoKr's `decompose_factor` (PEFT `LoKrConfig`). Default: PEFT's −1, factors near the
    /// square root of each dimension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub decompose_factor: Option<u64>,
    /// BOFT's `boft_block_size` (PEFT `BOFTConfig`). Default: PEFT's 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub boft_block_size: Option<u64>,
    /// BOFT's `boft_n_butterfly_factor` (PEFT `BOFTConfig`). Default: PEFT's 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub boft_n_butterfly_factor: Option<u64>,
}

impl ModelSection {
    /// A section with only the base model set (every other field takes its default).
    #[must_use]
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            method: None,
            quantization: None,
            lora_rank: None,
            lora_alpha: None,
            lora_dropout: None,
            target_modules: None,
            dora: None,
            peft: None,
            feedforward_modules: None,
            virtual_tokens: None,
            decompose_factor: None,
            boft_block_size: None,
            boft_n_butterfly_factor: None,
        }
    }

    /// Whether any LoRA field is set.
    #[must_use]
    pub const fn has_lora_fields(&self) -> bool {
        self.lora_rank.is_some()
            || self.lora_alpha.is_some()
            || self.lora_dropout.is_some()
            || self.target_modules.is_some()
            || self.dora.is_some()
    }

    /// The method, with the engine's default applied ([`JobSettings::resolve`]).
    #[must_use]
    pub fn effective_method(&self) -> Method {
        self.method_and_quantization().0
    }

    /// The quantization, with the engine's default applied ([`JobSettings::resolve`]).
    #[must_use]
    pub fn effective_quantization(&self) -> Quantization {
        self.method_and_quantization().1
    }

    fn method_and_quantization(&self) -> (Method, Quantization) {
        let s = JobSettings {
            method: self.method.map(Into::into),
            quantization: self.quantization.map(Into::into),
            ..JobSettings::default()
        };
        // Without a parallel layout, resolving cannot fail.
        let job = s.resolve().unwrap_or_default();
        (job.method.into(), job.quantization.into())
    }
}

/// `model.target_modules`: module names, or `all-linear`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetModules {
    /// Every Linear in the decoder layers (PEFT `all-linear`).
    AllLinear,
    /// Modules by name (`q_proj`, `v_proj`, ...).
    Names(Vec<String>),
}

impl TargetModules {
    /// The spelling of [`Self::AllLinear`].
    pub const ALL_LINEAR: &'static str = "all-linear";
}

impl From<TargetModules> for Targets {
    fn from(t: TargetModules) -> Self {
        match t {
            TargetModules::AllLinear => Self::AllLinear,
            TargetModules::Names(v) => Self::Names(v),
        }
    }
}

impl From<Targets> for TargetModules {
    fn from(t: Targets) -> Self {
        match t {
            Targets::AllLinear => Self::AllLinear,
            Targets::Names(v) => Self::Names(v),
        }
    }
}

impl Serialize for TargetModules {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::AllLinear => s.serialize_str(Self::ALL_LINEAR),
            Self::Names(v) => crate::yaml::flow_seq(v, s),
        }
    }
}

impl<'de> Deserialize<'de> for TargetModules {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TargetModules;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`all-linear` or a list of module names")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TargetModules, E> {
                if s == TargetModules::ALL_LINEAR {
                    Ok(TargetModules::AllLinear)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(s), &self))
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TargetModules, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    v.push(s);
                }
                Ok(TargetModules::Names(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// `training:` — shape, optimizer, precision, stack, and the hyper-parameters exports need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TrainingSection {
    /// Sequences per GPU per step (inference: concurrent sequences). Default: 1.
    #[serde(default = "defaults::micro_batch_size")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub micro_batch_size: u64,
    /// Micro-batches accumulated per optimizer step. Default: 1.
    #[serde(default = "defaults::gradient_accumulation_steps")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_048_576)))]
    pub gradient_accumulation_steps: u64,
    /// Tokens per sequence (inference: prompt + generated context). Default: 2048.
    #[serde(default = "defaults::max_seq_length")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 16_777_216)))]
    pub max_seq_length: u64,
    /// Optimizer (HF Trainer `optim` name). Default: the stack's (`adamw_torch_fused`;
    /// Unsloth's notebooks' `adamw_8bit` on the unsloth stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<Optimizer>,
    /// Gradient checkpointing. Default: the stack's: on for `trl` (`SFTConfig`), on for QLoRA
    /// on `hf` (PEFT's `prepare_model_for_kbit_training`), else off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_checkpointing: Option<bool>,
    /// Let `moro run` recover from out-of-memory by walking the heal ladder. Default: false.
    #[serde(default)]
    pub auto_heal: bool,
    /// Precision. Default: `bf16` (bf16 weights, no fp32 master copy) for full fine-tuning,
    /// inference and the `litgpt`/`torchtune` stacks; `bf16-mixed` (fp32 adapters under bf16
    /// autocast, the HF Trainer's `bf16=True`) for LoRA and QLoRA on `hf`/`trl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// Attention implementation. Default: `sdpa`.
    #[serde(default = "defaults::attention")]
    pub attention: Attention,
    /// Training stack. Default: `hf`.
    #[serde(default = "defaults::stack")]
    pub stack: Stack,
    /// Loss implementation. Default: the stack's own (`standard` for hf, `chunked-nll` for trl,
    /// `chunked` for litgpt and torchtune).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Loss>,
    /// Packed (or padding-free) batches: every sequence fills `max_seq_length` with no
    /// attention mask. false = right-padded with a mask. Default: true.
    #[serde(default = "defaults::packing")]
    pub packing: bool,
    /// KV-cache storage (inference). Default: `f32` for `fp32` jobs, else `f16` (the 16-bit
    /// compute dtype).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Peak learning rate. No effect on memory. Default: the exporter's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
    /// Epochs (may be fractional). No effect on memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_epochs: Option<f64>,
    /// Share of steps used for warmup, in [0, 1]. No effect on memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_ratio: Option<f64>,
    /// Weight decay. No effect on memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// Learning-rate schedule (HF `lr_scheduler_type`). No effect on memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_scheduler: Option<LrScheduler>,
    /// Dataset: a Hugging Face dataset id or a local path (for exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// Where the trainer writes checkpoints (for exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<String>,
    /// Library versions of the stack, where allocation changed between releases. Default:
    /// current releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<LibraryVersions>,
    /// Step each parameter as soon as its gradient is ready and free the gradient (torchtune's
    /// `optimizer_in_bwd: True`); needs `gradient_accumulation_steps: 1`. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optimizer_in_backward: bool,
    /// Liger Kernel (the HF Trainer's and TRL's `use_liger_kernel: true`): every kernel
    /// Liger has for the model (RMSNorm, SwiGLU/GeGLU, RoPE, fused linear cross-entropy).
    /// Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub liger: bool,
    /// Only these Liger kernels, by Liger's names: `rms_norm`, `swiglu`, `rope`,
    /// `fused_linear_cross_entropy` (axolotl's `liger_*` keys). Default: all of them when
    /// `liger` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liger_kernels: Option<Vec<String>>,
    /// `torch.compile` the model, as the HF Trainer's `torch_compile: true` does (traced for
    /// Llama, Mistral, Qwen2/3, Phi-3 and Gemma 2 layers). Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compile: bool,
    /// Offload the checkpointed layer inputs to host memory (torchtune's
    /// `enable_activation_offloading: True`, Unsloth's `"unsloth"` checkpointing; needs
    /// gradient checkpointing). Default: the stack's (on for unsloth when checkpointing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_offload: Option<bool>,
    /// How many of the last decoder layers train, or `all`: mlx_lm's `num_layers` (mlx stack
    /// only). Default: the stack's (16 on mlx).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_layers: Option<LayerCount>,
    /// Images per sample (vision-language models). Default: 1 on a vision-language model,
    /// else 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(max = 1024)))]
    pub images_per_sample: Option<u64>,
    /// Image size before the processor resizes it, `WIDTHxHEIGHT` (e.g. `1280x720`).
    /// Default: the processor's own square, or 1024x1024 for dynamic resolution (Qwen-VL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_size: Option<String>,
    /// Gemma 3's pan-and-scan (`do_pan_and_scan: true`): images of an exaggerated aspect
    /// ratio also go in as 2 to 4 crops. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pan_and_scan: bool,
    /// What trains in the vision tower and projector: `frozen`, `adapted` (the LoRA targets
    /// reach the tower's Linears) or `trained` (full fine-tuning). Default: `frozen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<Vision>,
    /// Target tokens per sample of an encoder-decoder model (T5, mT5): the labels the
    /// decoder reads, `max_target_length` in transformers' seq2seq examples;
    /// `max_seq_length` is the encoder's. Default: `max_seq_length`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 16_777_216)))]
    pub target_len: Option<u64>,
    /// Tokens an inference job generates one at a time (transformers' `max_new_tokens`),
    /// the last of `max_seq_length`: the prompt is the rest. Default: none, the whole
    /// context prefilled at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 16_777_216)))]
    pub max_new_tokens: Option<u64>,
}

/// `training.num_layers`: a count, or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum LayerCount {
    /// The last this many layers.
    Last(u64),
    /// Every layer.
    All(AllLayers),
}

/// The word `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum AllLayers {
    /// Every layer (mlx_lm's `-1`).
    #[serde(rename = "all")]
    All,
}

impl LayerCount {
    /// The engine's value: `None` for every layer.
    #[must_use]
    pub const fn layers(self) -> Option<u64> {
        match self {
            Self::Last(n) => Some(n),
            Self::All(_) => None,
        }
    }

    /// The file's value for the engine's.
    #[must_use]
    pub const fn from_layers(layers: Option<u64>) -> Self {
        match layers {
            Some(n) => Self::Last(n),
            None => Self::All(AllLayers::All),
        }
    }
}

/// `training.versions:` — library versions as `MAJOR.MINOR[.PATCH]` strings (quote them:
/// `"4.50"` is not `4.5`). Absent = a current release.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LibraryVersions {
    /// transformers version (e.g. `"4.47"`; 4.46–4.48 keep an extra fp32 logits copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub transformers: Option<String>,
    /// bitsandbytes version (e.g. `"0.43.1"`; before 0.43.2 4-bit matmuls saved their input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub bitsandbytes: Option<String>,
    /// TRL version (e.g. `"0.25"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub trl: Option<String>,
    /// PyTorch version (e.g. `"1.10"`; before 2.0 `zero_grad()` kept the gradients
    /// allocated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub torch: Option<String>,
    /// torchao version (e.g. `"0.1"`; before 0.2 torchtune's NF4 quantization of each weight
    /// at load used 64 bytes of temporaries per element).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub torchao: Option<String>,
    /// torchtune version (e.g. `"0.2"`; before 0.3 its recipes kept a shifted copy of the
    /// fp32 logits through backward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub torchtune: Option<String>,
    /// MLX version (e.g. `"0.32.1"`; before 0.32.2 the loss's backward kept the shifted
    /// logits, their softmax and the target gradient instead of the fused kernel's one
    /// gradient).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub mlx: Option<String>,
    /// PEFT version (e.g. `"0.20"`; from 0.21 AdaLoRA keeps an output-wide tensor per module
    /// for its `ranknum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"))
    )]
    pub peft: Option<String>,
}

impl LibraryVersions {
    /// The engine's versions.
    ///
    /// # Errors
    /// A version that is not `MAJOR.MINOR[.PATCH]`, naming its field.
    pub fn to_versions(&self) -> Result<Versions, RecipeError> {
        let two = |field: &str, v: &Option<String>| {
            v.as_deref()
                .map(|s| parse_version(field, s).map(|(a, b, _)| (a, b)))
                .transpose()
        };
        Ok(Versions {
            transformers: two("training.versions.transformers", &self.transformers)?,
            bitsandbytes: self
                .bitsandbytes
                .as_deref()
                .map(|s| parse_version("training.versions.bitsandbytes", s))
                .transpose()?,
            trl: two("training.versions.trl", &self.trl)?,
            torch: two("training.versions.torch", &self.torch)?,
            torchao: two("training.versions.torchao", &self.torchao)?,
            torchtune: two("training.versions.torchtune", &self.torchtune)?,
            mlx: self
                .mlx
                .as_deref()
                .map(|s| parse_version("training.versions.mlx", s))
                .transpose()?,
            peft: two("training.versions.peft", &self.peft)?,
        })
    }

    /// The file's spelling of the engine's versions (`None` when all are current).
    #[must_use]
    pub fn from_versions(v: &Versions) -> Option<Self> {
        (*v != Versions::default()).then(|| Self {
            transformers: v.transformers.map(|(a, b)| format!("{a}.{b}")),
            bitsandbytes: v.bitsandbytes.map(|(a, b, c)| format!("{a}.{b}.{c}")),
            trl: v.trl.map(|(a, b)| format!("{a}.{b}")),
            torch: v.torch.map(|(a, b)| format!("{a}.{b}")),
            torchao: v.torchao.map(|(a, b)| format!("{a}.{b}")),
            torchtune: v.torchtune.map(|(a, b)| format!("{a}.{b}")),
            mlx: v.mlx.map(|(a, b, c)| format!("{a}.{b}.{c}")),
            peft: v.peft.map(|(a, b)| format!("{a}.{b}")),
        })
    }
}

/// `MAJOR.MINOR[.PATCH]` (a missing patch is 0).
fn parse_version(field: &str, s: &str) -> Result<(u32, u32, u32), RecipeError> {
    let bad = || {
        RecipeError::value(
            field,
            format!("expected a version like \"4.47\" or \"0.43.1\", got `{s}`"),
        )
    };
    let mut parts = s.trim().split('.');
    let mut next = |required: bool| match parts.next() {
        None if !required => Ok(0),
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse().map_err(|_| bad())
        }
        _ => Err(bad()),
    };
    let v = (next(true)?, next(true)?, next(false)?);
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(v)
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            micro_batch_size: defaults::micro_batch_size(),
            gradient_accumulation_steps: defaults::gradient_accumulation_steps(),
            max_seq_length: defaults::max_seq_length(),
            optimizer: None,
            gradient_checkpointing: None,
            auto_heal: false,
            precision: None,
            attention: defaults::attention(),
            stack: defaults::stack(),
            loss: None,
            packing: defaults::packing(),
            kv_cache_dtype: None,
            learning_rate: None,
            num_epochs: None,
            warmup_ratio: None,
            weight_decay: None,
            lr_scheduler: None,
            dataset: None,
            output_dir: None,
            versions: None,
            optimizer_in_backward: false,
            liger: false,
            liger_kernels: None,
            compile: false,
            activation_offload: None,
            num_layers: None,
            images_per_sample: None,
            image_size: None,
            pan_and_scan: false,
            vision: None,
            target_len: None,
            max_new_tokens: None,
        }
    }
}

/// `parallel:` — how the job is spread over GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ParallelSection {
    /// GPUs in all (data × tensor × pipeline parallel). Default: the count the hardware
    /// names (`--hardware 8xh100-sxm`), else tensor_parallel × pipeline_parallel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub gpus: Option<u64>,
    /// Nodes (hosts) the GPUs span, `gpus / nodes` on each; divides `gpus`. The exports write
    /// multi-node launch commands for more than one, and `fsdp_hybrid_shard` shards within a
    /// node. Default: 1 (left out of a written recipe when 1).
    #[serde(default = "defaults::one", skip_serializing_if = "defaults::is_one")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub nodes: u64,
    /// Sharding strategy over the data-parallel GPUs. Default: `none` (DDP).
    #[serde(default = "defaults::strategy")]
    pub strategy: Strategy,
    /// Tensor-parallel degree; divides `gpus`. Default: 1.
    #[serde(default = "defaults::one")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub tensor_parallel: u64,
    /// Pipeline (layer-placement) degree; divides `gpus`. Default: 1.
    #[serde(default = "defaults::one")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub pipeline_parallel: u64,
    /// CPU offload. Default: `none`.
    #[serde(default = "defaults::offload")]
    pub offload: Offload,
    /// DeepSpeed `zero_optimization.reduce_bucket_size` in elements (ZeRO strategies); absent:
    /// `"auto"` (hidden_size², as the HF integration fills it). ZeRO-1/2 hold two such
    /// 16-bit buffers during every backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub reduce_bucket_size: Option<u64>,
    /// The FSDP implementation (FSDP strategies): 1, PyTorch's `FullyShardedDataParallel`,
    /// or 2, `fully_shard`, as accelerate's `fsdp_version` names them. Default: the stack's
    /// (1 for hf and trl, as accelerate; 2 for torchtune from 0.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 2)))]
    pub fsdp_version: Option<u64>,
}

impl Default for ParallelSection {
    fn default() -> Self {
        Self {
            gpus: None,
            strategy: defaults::strategy(),
            tensor_parallel: 1,
            pipeline_parallel: 1,
            offload: defaults::offload(),
            nodes: 1,
            reduce_bucket_size: None,
            fsdp_version: None,
        }
    }
}

/// `hardware:` — the GPU(s) the recipe was made for. Informational when read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HardwareSection {
    /// GPU name (as nvidia-smi prints it, or the catalog's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Catalog preset id (`rtx-4090`, `a100-sxm4-80gb`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Memory of one GPU, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Number of GPUs. Default: 1.
    #[serde(default = "defaults::one")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65536)))]
    pub count: u64,
    /// Whether it was detected on the machine (true) or named by hand (false). Default: false.
    #[serde(default)]
    pub detected: bool,
    /// PyTorch's device backend where the preset does not say it: `mps` makes a GPU named
    /// by its memory alone an Apple GPU. Default: the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Backend>,
}

impl Default for HardwareSection {
    fn default() -> Self {
        Self {
            name: None,
            preset: None,
            memory_bytes: None,
            count: 1,
            detected: false,
            device: None,
        }
    }
}

/// `data:` — the dataset's token lengths with the model's tokenizer (`moro data stats`), and
/// the percentile `training.max_seq_length` was sized from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// The dataset file, as given.
    pub path: String,
    /// Its shape (`messages`, `alpaca`, `sharegpt`, `prompt-completion`, `preference`,
    /// `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    /// Samples counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// The percentile `max_seq_length` was sized from (99 = all but the longest 1 %).
    #[cfg_attr(feature = "schema", schemars(range(min = 0.1, max = 100.0)))]
    pub percentile: f64,
    /// Nearest-rank percentiles and the longest sample, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_tokens: Option<u64>,
    pub p99_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Samples longer than `max_seq_length`, which training truncates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_samples: Option<u64>,
}

/// `prediction:` — moro's prediction when it wrote the recipe, all sizes in bytes.
/// Informational when read back.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PredictionSection {
    /// Peak of tensors (`torch.cuda.max_memory_allocated`).
    pub peak_allocated_bytes: u64,
    /// Peak of the caching allocator's reserve (`torch.cuda.max_memory_reserved`).
    pub peak_reserved_bytes: u64,
    /// Peak device total (what nvidia-smi shows, with the CUDA context).
    pub peak_device_bytes: u64,
    /// Phase of the step where the peak happens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Components at the peak, name → bytes, in the order moro reported them.
    #[serde(default, skip_serializing_if = "Components::is_empty")]
    pub components: Components,
    /// Usable memory minus margin minus the device peak (negative when it does not fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom_bytes: Option<i64>,
    /// Safety margin kept free, from the estimator's measured error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin_bytes: Option<u64>,
    /// Memory the prediction was compared with (one GPU), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// An ordered name → bytes map (a YAML mapping; order is kept, duplicate names are an error).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Components(pub Vec<(String, u64)>);

impl Components {
    /// Whether there are no components.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes of the component `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(n, _)| n == name).map(|&(_, b)| b)
    }
}

impl<S: Into<String>> FromIterator<(S, u64)> for Components {
    fn from_iter<I: IntoIterator<Item = (S, u64)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(n, b)| (n.into(), b)).collect())
    }
}

impl Serialize for Components {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(n, b)| (n, b)))
    }
}

impl<'de> Deserialize<'de> for Components {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Components;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of component name to bytes")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Components, A::Error> {
                let mut v: Vec<(String, u64)> = Vec::new();
                while let Some((name, bytes)) = map.next_entry::<String, u64>()? {
                    if v.iter().any(|(n, _)| *n == name) {
                        return Err(de::Error::custom(format_args!(
                            "duplicate component `{name}`"
                        )));
                    }
                    v.push((name, bytes));
                }
                Ok(Components(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// Defaults of omitted fields, taken from the engine's [`Job::default`].
mod defaults {
    use super::{Attention, Job, Offload, Stack, Strategy};
    use moro_core::job::Padding;

    pub(super) fn micro_batch_size() -> u64 {
        Job::default().micro_batch_size
    }
    pub(super) fn gradient_accumulation_steps() -> u64 {
        Job::default().grad_accum
    }
    pub(super) fn max_seq_length() -> u64 {
        Job::default().seq_len
    }
    pub(super) fn attention() -> Attention {
        Job::default().attention.into()
    }
    pub(super) fn stack() -> Stack {
        Job::default().stack.into()
    }
    pub(super) fn packing() -> bool {
        Job::default().padding == Padding::Packed
    }
    pub(super) fn strategy() -> Strategy {
        Job::default().parallel.sharding.into()
    }
    pub(super) fn offload() -> Offload {
        Job::default().parallel.offload.into()
    }
    pub(super) const fn one() -> u64 {
        1
    }
    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
    pub(super) const fn is_one(n: &u64) -> bool {
        *n == 1
    }
}

#[cfg(feature = "schema")]
mod schema_impls {
    use std::borrow::Cow;

    use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

    use super::{Components, TargetModules};

    impl JsonSchema for TargetModules {
        fn schema_name() -> Cow<'static, str> {
            "TargetModules".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "description": "Modules that get LoRA adapters: `all-linear`, or a list of names.",
                "anyOf": [
                    { "type": "string", "const": "all-linear" },
                    { "type": "array", "items": { "type": "string", "minLength": 1 }, "minItems": 1 }
                ]
            })
        }
    }

    impl JsonSchema for Components {
        fn schema_name() -> Cow<'static, str> {
            "Components".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "type": "object",
                "additionalProperties": { "type": "integer", "minimum": 0 }
            })
        }
    }
}
