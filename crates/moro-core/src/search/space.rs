//! The space of configurations: what is asked ([`Request`]), what the device can do
//! ([`Caps`]), the values of every knob ([`Space`]) and one point of it ([`Config`]).

use serde::Serialize;

use crate::estimate::DeviceProfile;
use crate::job::{
    Attention, Job, Liger, MAX_BATCH, Method, Optimizer, Padding, Parallel, Precision,
    Quantization, Stack, Targets,
};
use crate::model::ModelSpec;

use super::*;

/// Which adapters a LoRA configuration gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetSet {
    /// The attention projections only ([`ATTENTION_TARGETS`]).
    Attention,
    /// Every Linear of the decoder layers (PEFT `all-linear`).
    AllLinear,
}

impl TargetSet {
    /// Name for display.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Attention => "attention",
            Self::AllLinear => "all-linear",
        }
    }
}

/// What the search optimizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The best model: the knobs in the product's order of leverage (see [`quality_key`]).
    Quality,
    /// The fastest step (see [`speed_key`]).
    Speed,
}

impl Objective {
    /// Name on the command line.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Quality => "quality",
            Self::Speed => "speed",
        }
    }
}

/// Which methods to consider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MethodChoice {
    /// Full, LoRA and QLoRA.
    Auto,
    /// Only this one (must be full, lora or qlora).
    Only(Method),
}

impl MethodChoice {
    /// `auto`, or a method of the vocabulary ([`crate::vocabulary::Method`]), any case.
    /// Which methods a command searches is the command's to check.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        if s == "auto" {
            return Some(Self::Auto);
        }
        crate::vocabulary::Method::parse(&s).map(|m| Self::Only(m.into()))
    }
}

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    /// Methods to consider.
    pub method: MethodChoice,
    /// A fixed sequence length, or `None` for [`SEQ_LEN_CANDIDATES`].
    pub seq_len: Option<u64>,
    /// Sequences per optimizer step, or `None` for [`DEFAULT_EFFECTIVE_BATCH`].
    pub effective_batch: Option<u64>,
    /// Training stack.
    pub stack: Stack,
    /// A fixed multi-GPU layout (one GPU: [`Parallel::single`]), used without a cluster.
    pub parallel: Parallel,
    /// GPUs to choose the count and strategy over ([`layouts`]); `None` keeps `parallel`.
    pub cluster: Option<Cluster>,
    /// The objective.
    pub objective: Objective,
    /// An encoder-decoder model's target tokens per sample ([`Job::target_len`]).
    pub target_len: Option<u64>,
    /// Threads to search on ([`Space::workers`]; 1 by default): how, not what.
    #[serde(skip)]
    pub workers: usize,
}

impl Default for Request {
    fn default() -> Self {
        Self {
            method: MethodChoice::Auto,
            seq_len: None,
            effective_batch: None,
            stack: Stack::Hf,
            parallel: Parallel::single(),
            cluster: None,
            objective: Objective::Quality,
            target_len: None,
            workers: 1,
        }
    }
}

/// What the search needs to know about the device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Caps {
    /// Memory a job may use on one GPU, bytes (the smallest GPU of the set).
    pub usable_bytes: u64,
    /// bf16 arithmetic.
    pub bf16: bool,
    /// FlashAttention-2.
    pub flash_attention: bool,
    /// The estimator's device profile (cuBLAS workspace, CUDA context, ...).
    pub profile: DeviceProfile,
    /// Host RAM of one node the job may fill with offloaded states, compared with
    /// [`Estimate::host_bytes_per_node`]; `None`: not checked (the figure is still reported).
    pub host_bytes: Option<u64>,
    /// bitsandbytes runs here (CUDA and ROCm builds; not Apple's MPS): 4-bit bases and
    /// 8-bit optimizer states are offered only then.
    pub bitsandbytes: bool,
    /// Triton kernels run here (CUDA and ROCm; not Apple's MPS): Liger's kernels are offered
    /// only then.
    pub triton: bool,
}

impl Caps {
    /// Capabilities of a [`crate::hardware::Device`] (its total memory is the usable memory).
    #[must_use]
    pub fn of_device(device: &crate::hardware::Device) -> Self {
        Self {
            usable_bytes: device.total_bytes,
            bf16: device.supports_bf16,
            flash_attention: device.supports_flash_attention,
            profile: DeviceProfile::for_device(device),
            host_bytes: None,
            bitsandbytes: device.vendor != crate::hardware::Vendor::Apple,
            triton: device.vendor != crate::hardware::Vendor::Apple,
        }
    }
}

/// A search that cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    /// A request field is out of range.
    #[error("`{field}`: {message}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The values of every knob.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Space {
    /// Methods, in no particular order.
    pub methods: Vec<Method>,
    /// Sequence lengths, longest first.
    pub seq_lens: Vec<u64>,
    /// Effective batch (global: over every data-parallel GPU).
    pub effective_batch: u64,
    /// GPU layouts, best first ([`layouts`]).
    pub layouts: Vec<Layout>,
    /// LoRA ranks.
    pub ranks: Vec<u64>,
    /// LoRA target sets.
    pub target_sets: Vec<TargetSet>,
    /// Precisions.
    pub precisions: Vec<Precision>,
    /// Gradient checkpointing values.
    pub checkpointing: Vec<bool>,
    /// Optimizers.
    pub optimizers: Vec<Optimizer>,
    /// Attention implementations.
    pub attentions: Vec<Attention>,
    /// Liger's kernels, off and (where the stack and model take them) on.
    pub ligers: Vec<bool>,
    /// Stack (fixed).
    pub stack: Stack,
    /// The request's fixed layout (its tensor and pipeline degrees; the data-parallel degree,
    /// sharding and offload come from each [`Layout`]).
    pub parallel: Parallel,
    /// Objective.
    pub objective: Objective,
    /// Threads the search estimates configurations on ([`Request::workers`]). The outcome is
    /// the same with any number: they only estimate ahead of the order the search reads them
    /// in.
    #[serde(skip)]
    pub workers: usize,
    /// LoRA targets of the attention set, resolved onto this model.
    #[serde(skip)]
    attention_targets: Targets,
    /// The storage of QLoRA's base: a pre-quantized checkpoint's own, else
    /// [`QLORA_QUANTIZATION`](super::QLORA_QUANTIZATION).
    pub qlora_quantization: Quantization,
    /// The images of each sample: a vision-language model's default (one image at the
    /// processor's size, [`crate::job::JobSettings::resolve_for`]), none for a text model.
    pub images: crate::vision::Images,
    /// The stack's trained layers on this model (MLX's 16, or all when the model has fewer).
    pub adapted_layers: Option<u64>,
    /// An encoder-decoder model's target tokens per sample, as requested.
    pub target_len: Option<u64>,
    /// Packed batches, or padded ones for an encoder-decoder model (`DataCollatorForSeq2Seq`
    /// pads each batch and passes the attention mask).
    pub padding: Padding,
}

impl Space {
    /// The space for `request` on a device with `caps`, for `model`.
    ///
    /// # Errors
    /// A zero or oversized sequence length or effective batch, or a method that is not a
    /// training method.
    pub fn new(model: &ModelSpec, request: &Request, caps: &Caps) -> Result<Self, SearchError> {
        let invalid = |field, message: String| Err(SearchError::Invalid { field, message });
        if request.stack.profile().triton_kernels && !caps.triton {
            return invalid(
                "stack",
                format!(
                    "the {} stack's kernels are Triton kernels, which run on CUDA and ROCm, not \
                     on this GPU",
                    request.stack.as_str()
                ),
            );
        }
        let methods = match request.method {
            MethodChoice::Auto => vec![Method::Full, Method::Adapters, Method::QuantizedAdapters],
            MethodChoice::Only(Method::Inference) => {
                return invalid(
                    "method",
                    "recipes are for training; use full, lora, qlora or auto".to_owned(),
                );
            }
            MethodChoice::Only(m) => vec![m],
        };
        let seq_lens = match request.seq_len {
            Some(s) if s == 0 || s > crate::job::MAX_SEQ_LEN => {
                return invalid(
                    "seq_len",
                    format!(
                        "must be between 1 and {} tokens, got {s}",
                        crate::job::MAX_SEQ_LEN
                    ),
                );
            }
            Some(s) if model.position_embeddings > 0 && s > model.position_embeddings => {
                return invalid(
                    "seq_len",
                    format!(
                        "{} has {} learned positions: at most {} tokens, got {s}",
                        model.model_type, model.position_embeddings, model.position_embeddings
                    ),
                );
            }
            Some(s) => vec![s],
            None => {
                // Lengths above the model's context are not trained on; a model with a shorter
                // context than every candidate gets its own context.
                let max = model.max_position_embeddings;
                let fit: Vec<u64> = SEQ_LEN_CANDIDATES
                    .into_iter()
                    .filter(|&s| max == 0 || s <= max)
                    .collect();
                if fit.is_empty() { vec![max] } else { fit }
            }
        };
        let effective_batch = request.effective_batch.unwrap_or(DEFAULT_EFFECTIVE_BATCH);
        if effective_batch == 0 || effective_batch > 1 << 20 {
            return invalid(
                "effective_batch",
                format!("must be between 1 and {}, got {effective_batch}", 1 << 20),
            );
        }
        // A pre-quantized checkpoint trains adapters over its own storage only.
        let methods = match model.prequantized {
            Some(q) if request.method == MethodChoice::Only(Method::Full) => {
                return invalid(
                    "method",
                    format!(
                        "the checkpoint stores {} weights (`quantization_config`), which a full \
                         fine-tune cannot train; use lora or qlora, or its 16-bit base model",
                        q.as_str()
                    ),
                );
            }
            Some(_) => vec![Method::QuantizedAdapters],
            None => methods,
        };
        let profile = request.stack.profile();
        // MLX quantizes with its own kernels, which run wherever MLX does.
        let mlx = profile.runtime == crate::stack::Runtime::Mlx;
        let methods: Vec<Method> = if caps.bitsandbytes || mlx {
            methods
        } else {
            methods
                .into_iter()
                .filter(|m| *m != Method::QuantizedAdapters)
                .collect()
        };
        if methods.is_empty() {
            let message = if model.prequantized.is_some() {
                "the checkpoint stores bitsandbytes weights (`quantization_config`), which do \
                 not load on this device (Apple GPUs: no bitsandbytes); use its 16-bit base model"
            } else {
                "QLoRA needs bitsandbytes, which does not run on this device (Apple GPUs); \
                 use lora or full"
            };
            return invalid("method", message.to_owned());
        }
        let optimizers: Vec<Optimizer> = if mlx {
            vec![profile.default_optimizer]
        } else {
            OPTIMIZERS
                .iter()
                .copied()
                .filter(|o| {
                    caps.bitsandbytes
                        || !matches!(o, Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit)
                })
                .collect()
        };
        // MLX has no autocast: the model trains in its own 16-bit dtype.
        let precisions = if mlx {
            vec![Precision::Bf16]
        } else if caps.bf16 {
            vec![Precision::Bf16Mixed, Precision::Bf16]
        } else {
            vec![Precision::Fp16Mixed]
        };
        // Attention sinks have no SDPA path, and FlashAttention 2 drops them (transformers
        // 5.24 passes `s_aux` to FA3 and FA4 kernels only): eager is what runs them.
        let flash_model = model.vision.as_ref().is_none_or(|v| v.flash_attention);
        let attentions = if mlx {
            vec![Attention::Sdpa]
        } else if model.attention_sinks {
            vec![Attention::Eager]
        } else if caps.flash_attention && flash_model {
            vec![Attention::Flash, Attention::Sdpa]
        } else {
            vec![Attention::Sdpa]
        };
        let names = ATTENTION_TARGETS.iter().map(|s| (*s).to_owned()).collect();
        // Liger's kernels where the job takes them (transformers' modules, a model
        // liger-kernel patches: `Job::validate`) and Triton runs.
        let liger_probe = Job {
            stack: request.stack,
            liger: Liger::ALL,
            ..Job::default()
        };
        let ligers = if caps.triton && liger_probe.validate(model).is_ok() {
            vec![false, true]
        } else {
            vec![false]
        };
        Ok(Self {
            methods,
            seq_lens,
            effective_batch,
            layouts: layouts(request),
            ranks: LORA_RANKS.to_vec(),
            target_sets: vec![TargetSet::Attention, TargetSet::AllLinear],
            precisions,
            checkpointing: vec![false, true],
            optimizers,
            attentions,
            ligers,
            stack: request.stack,
            parallel: if request.cluster.is_some() {
                Parallel::single()
            } else {
                request.parallel.clone()
            },
            objective: request.objective,
            workers: request.workers.max(1),
            attention_targets: crate::targets::resolve(
                &crate::stack::as_built(model, request.stack.profile()),
                &Targets::Names(names),
            ),
            qlora_quantization: model.prequantized.unwrap_or(if mlx {
                profile.default_quantization
            } else {
                QLORA_QUANTIZATION
            }),
            adapted_layers: profile
                .default_adapted_layers
                .map(|n| n.min(model.num_layers)),
            images: model
                .vision
                .as_ref()
                .map_or_else(Default::default, crate::vision::VisionSpec::default_images),
            target_len: request.target_len,
            padding: if model.seq2seq.is_some() {
                Padding::Padded
            } else {
                Padding::Packed
            },
        })
    }

    /// The LoRA targets of a target set on this model.
    #[must_use]
    pub fn targets(&self, set: TargetSet) -> Targets {
        match set {
            TargetSet::Attention => self.attention_targets.clone(),
            TargetSet::AllLinear => Targets::AllLinear,
        }
    }

    /// The data-parallel degree of a layout (its GPUs over the tensor and pipeline degrees).
    #[must_use]
    pub fn data_parallel(&self, layout: &Layout) -> u64 {
        let split = (self.parallel.tensor_parallel.max(1) * self.parallel.pipeline.max(1)).max(1);
        (layout.gpus / split).max(1)
    }

    /// Sequences each data-parallel GPU processes per optimizer step: the effective batch over
    /// the data-parallel degree, rounded up (at least one per GPU, so with more GPUs than the
    /// effective batch the step holds one sequence per GPU).
    #[must_use]
    pub fn per_gpu_batch(&self, layout: &Layout) -> u64 {
        self.effective_batch
            .div_ceil(self.data_parallel(layout))
            .max(1)
    }

    /// Micro batches of a layout: powers of two dividing [`Space::per_gpu_batch`], largest
    /// first.
    #[must_use]
    pub fn micro_batches(&self, layout: &Layout) -> Vec<u64> {
        let share = self.per_gpu_batch(layout);
        (0..=16)
            .rev()
            .map(|k| 1u64 << k)
            .filter(|b| *b <= MAX_BATCH && share.is_multiple_of(*b))
            .collect()
    }

    /// How many configurations the space holds (every micro batch): the length of
    /// [`super::all_configs`], counted without making them.
    #[must_use]
    pub fn size(&self) -> u64 {
        let peft_knobs = (self.target_sets.len() * self.ranks.len()) as u64;
        let per_method: u64 = self
            .methods
            .iter()
            .map(|m| if m.is_peft() { peft_knobs } else { 1 })
            .sum();
        let others = [
            self.precisions.len(),
            self.checkpointing.len(),
            self.optimizers.len(),
            self.attentions.len(),
            self.ligers.len(),
        ]
        .iter()
        .map(|&n| n as u64)
        .product::<u64>();
        let batches: u64 = self
            .layouts
            .iter()
            .map(|l| self.micro_batches(l).len() as u64)
            .sum();
        self.seq_lens.len() as u64 * per_method * others * batches
    }

    /// Every configuration but the micro batch ("rest of configuration"), with the micro
    /// batch set to 1, for every layout. Full fine-tuning has no LoRA knobs, so it appears
    /// once per combination of the others.
    #[must_use]
    pub fn rests(&self, seq_len: u64) -> Vec<Config> {
        let mut out = Vec::new();
        for &layout in &self.layouts {
            self.push_rests(seq_len, layout, &mut out);
        }
        out
    }

    fn push_rests(&self, seq_len: u64, layout: Layout, out: &mut Vec<Config>) {
        for &method in &self.methods {
            let lora_knobs: Vec<(TargetSet, u64)> = if method.is_peft() {
                self.target_sets
                    .iter()
                    .flat_map(|t| self.ranks.iter().map(move |r| (*t, *r)))
                    .collect()
            } else {
                vec![(TargetSet::AllLinear, 0)]
            };
            for &(targets, rank) in &lora_knobs {
                for &precision in &self.precisions {
                    for &gradient_checkpointing in &self.checkpointing {
                        for &optimizer in &self.optimizers {
                            for &attention in &self.attentions {
                                for &liger in &self.ligers {
                                    out.push(Config {
                                        method,
                                        targets,
                                        rank,
                                        precision,
                                        gradient_checkpointing,
                                        optimizer,
                                        attention,
                                        liger,
                                        seq_len,
                                        micro_batch: 1,
                                        layout,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The engine job of a configuration.
    #[must_use]
    pub fn job(&self, c: &Config) -> Job {
        let mut job = Job {
            method: c.method,
            quantization: if c.method == Method::QuantizedAdapters {
                self.qlora_quantization
            } else {
                Quantization::None
            },
            micro_batch_size: c.micro_batch,
            seq_len: c.seq_len,
            grad_accum: (self.per_gpu_batch(&c.layout) / c.micro_batch.max(1)).max(1),
            optimizer: c.optimizer,
            gradient_checkpointing: c.gradient_checkpointing,
            attention: c.attention,
            precision: c.precision,
            stack: self.stack,
            loss: None,
            padding: self.padding,
            parallel: Parallel {
                data_parallel: self.data_parallel(&c.layout),
                tensor_parallel: self.parallel.tensor_parallel.max(1),
                pipeline: self.parallel.pipeline.max(1),
                sharding: c.layout.sharding,
                offload: c.layout.offload,
                nodes: c.layout.nodes.max(1),
                reduce_bucket: self.parallel.reduce_bucket,
                // A fixed FSDP layout keeps its implementation; a searched one is the stack's.
                fsdp: match (
                    c.layout.sharding.is_fsdp(),
                    self.parallel.sharding.is_fsdp(),
                ) {
                    (true, true) => self.parallel.fsdp,
                    (true, false) => crate::job::FsdpApi::default_for(
                        self.stack,
                        &crate::job::Versions::default(),
                    ),
                    (false, _) => crate::job::FsdpApi::Fsdp1,
                },
            },
            images: self.images,
            liger: if c.liger {
                Liger::ALL
            } else {
                Liger::default()
            },
            // The stack's own checkpointing (Unsloth's offloads its inputs).
            activation_offload: c.gradient_checkpointing
                && self.stack.profile().offloads_by_default(),
            adapted_layers: self.adapted_layers,
            target_len: self.target_len,
            ..Job::default()
        };
        job.adapter.dropout = self.stack.profile().default_lora_dropout;
        if c.method.is_peft() {
            job.adapter.rank = c.rank;
            job.adapter.alpha = alpha_for_rank(c.rank);
            job.adapter.targets = self.targets(c.targets);
        }
        job
    }
}

/// One point of the space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Config {
    /// Method.
    pub method: Method,
    /// LoRA targets (ignored for full fine-tuning).
    pub targets: TargetSet,
    /// LoRA rank (0 for full fine-tuning).
    pub rank: u64,
    /// Precision.
    pub precision: Precision,
    /// Gradient checkpointing.
    pub gradient_checkpointing: bool,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// Attention.
    pub attention: Attention,
    /// Liger's kernels (every one: the Trainer's `use_liger_kernel`).
    pub liger: bool,
    /// Sequence length.
    pub seq_len: u64,
    /// Micro batch (per GPU).
    pub micro_batch: u64,
    /// GPUs, strategy and offload.
    pub layout: Layout,
}
