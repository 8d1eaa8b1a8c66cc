//! Recipe search: the best training configuration that fits a GPU.
//!
//! Pure: a [`Space`] (built from a [`Request`] and the device's [`Caps`] by [`Space::new`])
//! lists the values of every knob; [`search`] estimates configurations with
//! [`crate::estimate::estimate`], keeps those whose predicted device peak plus a safety
//! [`margin_bytes`] stays under the usable memory, and ranks them by an [`Objective`].
//!
//! The knobs and their values follow issue 3 §2:
//!
//! - method and quantization: full fine-tuning, LoRA on a 16-bit base, QLoRA on an NF4 base
//!   with double quantization ([`QLORA_QUANTIZATION`]);
//! - LoRA rank ([`LORA_RANKS`]), alpha = 2 × rank ([`alpha_for_rank`]), target modules
//!   (attention projections only, or every Linear);
//! - micro batch (powers of two dividing the effective batch) × gradient accumulation
//!   (effective batch / micro batch);
//! - max_seq_length: the requested one, or [`SEQ_LEN_CANDIDATES`];
//! - gradient checkpointing on/off;
//! - optimizer: `adamw_torch_fused`, `adamw_8bit`, `paged_adamw_8bit`;
//! - attention: FlashAttention-2 only where the device supports it, SDPA otherwise (eager is
//!   never proposed: it materializes the a·s² probabilities and is never smaller);
//! - precision: bf16 (mixed and pure) where the device supports it, else fp16-mixed.
//!
//! # Several GPUs
//! With a [`Cluster`] in the request (`--hardware 8xh100-sxm`, `2x8xh100-sxm`), the number of
//! GPUs used and the strategy are knobs too ([`Layout`], [`layouts`]): 1, 2, 4, … GPUs up to
//! a node, then whole nodes up to the cluster; for each count above one, plain data parallel
//! (DDP), DeepSpeed ZeRO-1/2/3, FSDP SHARD_GRAD_OP and FULL_SHARD, HYBRID_SHARD when the GPUs
//! span nodes, then CPU offload of the optimizer (ZeRO-2/3) and of optimizer and parameters
//! (ZeRO-3, FSDP). The effective batch is global: each GPU's share is
//! `effective_batch / data-parallel degree` (rounded up, so at least one sequence per GPU),
//! split into micro batch × accumulation. Among the layouts that fit, the objectives prefer the
//! least communication ([`Layout::comm_cost`]), then more GPUs; see [`quality_key`].
//!
//! # Pruning
//! For a fixed rest-of-configuration the peak is monotone in the micro batch at a fixed
//! gradient-accumulation regime, but the effective batch couples the two: the micro batch
//! equal to the effective batch runs without accumulation, and without accumulation the
//! estimator frees the gradients before the forward pass (`grads_in_fwd`, estimate/mod.rs).
//! So for each rest-of-configuration [`search`] tries that point alone, then binary-searches
//! the accumulating micro batches (all of which keep gradients alive, so monotone). When the
//! sequence length is not fixed it is the first key of both objectives: the longest length at
//! which anything fits ends the search. Tests compare the result with brute force over the
//! whole space.

use serde::Serialize;

use crate::bound::{JobClass, Table};
use crate::estimate::{DeviceProfile, Estimate, add_replayed_steps, estimate_without_replay};
use crate::job::{
    Attention, Job, JobError, MAX_BATCH, Method, Offload, Optimizer, Padding, Parallel, Precision,
    Quantization, Sharding, Stack, Targets,
};
use crate::model::ModelSpec;
use crate::validation::Metric;

/// Smallest safety margin kept free, whatever the prediction ([`crate::bound::DEVICE_FLOOR_BYTES`]).
pub const MARGIN_FLOOR_BYTES: u64 = crate::bound::DEVICE_FLOOR_BYTES;

/// The safety margin of an estimate of `job`: what its device-level upper bound adds
/// ([`crate::bound`]: 95 % of measured runs like it lie under the bound), and never less
/// than [`MARGIN_FLOOR_BYTES`]. A configuration fits when `peak + margin ≤ usable memory`.
#[must_use]
pub fn margin_bytes(est: &Estimate, job: &Job) -> u64 {
    Table::builtin()
        .upper_of(est, job)
        .device
        .saturating_sub(est.peak_device_bytes)
}

/// The rule behind [`margin_bytes`], in words (for recipe headers and `--help`), with the band
/// the bound of the device level (or of `from`, the level that set it) comes from.
#[must_use]
pub fn margin_rule(class: JobClass, from: Metric) -> String {
    let band = Table::builtin().band(from, class);
    format!(
        "fits when the upper bound is within the usable memory: the bound is the predicted {} \
         peak + {}.{}% (and at least 512 MiB over the device peak), at or above {}% of measured \
         runs like this one ({}: {} runs from {} sources)",
        from.as_str(),
        band.upper_permille / 10,
        band.upper_permille % 10,
        band.coverage_percent,
        band.regime,
        band.runs,
        band.sources
    )
}

/// LoRA ranks searched (issue 3 §2: 8 to 128, powers of two).
pub const LORA_RANKS: [u64; 5] = [8, 16, 32, 64, 128];

/// Sequence lengths tried, longest first, when the request does not fix one (issue 3 §4).
pub const SEQ_LEN_CANDIDATES: [u64; 4] = [8192, 4096, 2048, 1024];

/// Effective batch (sequences per optimizer step) when the request gives none. moro's own
/// default: a micro batch of up to 16 without accumulation, or accumulation down to 16 × 1.
pub const DEFAULT_EFFECTIVE_BATCH: u64 = 16;

/// The base storage QLoRA recipes use: NF4 with double quantization, the QLoRA paper's
/// setting (Dettmers et al. 2023, §3) and PEFT's documented recipe.
pub const QLORA_QUANTIZATION: Quantization = Quantization::Nf4Dq;

/// Optimizers searched, best quality first: 32-bit fused AdamW (the HF Trainer default with
/// torch ≥ 2.8), bitsandbytes 8-bit AdamW, its paged variant (states can spill to host).
pub const OPTIMIZERS: [Optimizer; 3] = [
    Optimizer::AdamwTorchFused,
    Optimizer::Adamw8bit,
    Optimizer::PagedAdamw8bit,
];

/// LoRA alpha for a rank: alpha = 2r, the common practice (`lora_alpha = 2 × r` in the
/// product's recipes, issue 3 §2).
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub const fn alpha_for_rank(rank: u64) -> f64 {
    2.0 * rank as f64
}

/// The attention projections, as role names [`crate::targets::resolve`] maps onto every
/// architecture (`q_proj` → `c_attn` on GPT-2, `query_key_value` on BLOOM, ...).
pub const ATTENTION_TARGETS: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];

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

/// The GPUs a multi-GPU search may use: `nodes` × `gpus_per_node` of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Cluster {
    /// Nodes (machines).
    pub nodes: u64,
    /// GPUs in each node.
    pub gpus_per_node: u64,
    /// Use every GPU of the cluster (`moro fit` asks whether exactly this many suffice);
    /// `false` lets the search also try fewer ([`gpu_counts`]).
    pub exact: bool,
    /// Whether CPU offload layouts are searched (they need host RAM:
    /// [`Estimate::host_bytes`]).
    pub offload: bool,
}

impl Cluster {
    /// Every GPU of one node of `gpus` GPUs, the search free to use fewer.
    #[must_use]
    pub const fn node(gpus: u64) -> Self {
        Self {
            nodes: 1,
            gpus_per_node: gpus,
            exact: false,
            offload: true,
        }
    }

    /// All GPUs.
    #[must_use]
    pub const fn gpus(&self) -> u64 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

/// GPU counts a search over `cluster` tries, fewest first: powers of two below one node, the
/// node, then 2, 4, … whole nodes and all of them. With `exact`, only all of them.
#[must_use]
pub fn gpu_counts(cluster: &Cluster) -> Vec<u64> {
    let g = cluster.gpus_per_node.max(1);
    let nodes = cluster.nodes.max(1);
    if cluster.exact {
        return vec![g.saturating_mul(nodes)];
    }
    let mut v: Vec<u64> = (0..63).map(|k| 1u64 << k).take_while(|&c| c < g).collect();
    let mut m = 1;
    while m < nodes {
        v.push(g * m);
        m *= 2;
    }
    v.push(g.saturating_mul(nodes));
    v
}

/// How one configuration spreads over GPUs: the count, the sharding strategy and the CPU
/// offload. One GPU is [`Layout::SINGLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Layout {
    /// GPUs used (data-parallel degree × the request's tensor and pipeline degrees).
    pub gpus: u64,
    /// Nodes those GPUs span.
    pub nodes: u64,
    /// Sharding strategy over the data-parallel GPUs.
    pub sharding: Sharding,
    /// CPU offload.
    pub offload: Offload,
}

impl Layout {
    /// One GPU, nothing sharded or offloaded.
    pub const SINGLE: Self = Self {
        gpus: 1,
        nodes: 1,
        sharding: Sharding::None,
        offload: Offload::None,
    };

    /// The communication a layout costs, smaller is less (issue 6 §3: "preferring the least
    /// communication that fits"): `5 × offload level + sharding level`, where
    ///
    /// - sharding: 0 one GPU or DDP (one all-reduce of the gradients per step); 1 ZeRO-1 (the
    ///   same volume, reduce-scatter + all-gather); 2 ZeRO-2 / FSDP SHARD_GRAD_OP (gradients
    ///   reduce-scattered per bucket during backward); 3 ZeRO-3 / FSDP FULL_SHARD within one
    ///   node, or HYBRID_SHARD (full shard within each node, replicas across nodes: the
    ///   parameter all-gathers stay on NVLink); 4 ZeRO-3 / FULL_SHARD across nodes (every
    ///   layer's all-gather, forward and backward, crosses the network);
    /// - offload: 0 none; 1 optimizer states (the step runs on the CPU and every gradient and
    ///   updated parameter crosses PCIe); 2 optimizer and parameters (the parameters too,
    ///   every forward and backward).
    ///
    /// Any offload costs more than any sharding: CPU Adam and PCIe are an order of magnitude
    /// slower than NVLink collectives.
    #[must_use]
    pub const fn comm_cost(&self) -> u64 {
        let across = self.nodes > 1;
        let shard = match self.sharding {
            Sharding::None => 0,
            Sharding::Zero1 => 1,
            Sharding::Zero2 | Sharding::FsdpShardGradOp => 2,
            Sharding::FsdpHybridShard => 3,
            Sharding::Zero3 | Sharding::FsdpFullShard => {
                if across {
                    4
                } else {
                    3
                }
            }
        };
        let off = match self.offload {
            Offload::None => 0,
            Offload::Optimizer => 1,
            Offload::OptimizerAndParams => 2,
        };
        5 * off + shard
    }

    /// Whether the strategy is DeepSpeed's.
    #[must_use]
    pub const fn is_deepspeed(&self) -> bool {
        matches!(
            self.sharding,
            Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3
        )
    }

    /// The strategy in words: `DDP`, `ZeRO-3 + optimizer offload`, `FSDP FULL_SHARD`, ...
    #[must_use]
    pub fn strategy_text(&self) -> String {
        self.strategy_words(false)
    }

    /// [`Self::strategy_text`] in fewer letters, for narrow tables: `FSDP full + offload`.
    #[must_use]
    pub fn strategy_short(&self) -> String {
        self.strategy_words(true)
    }

    fn strategy_words(&self, short: bool) -> String {
        let s = match (self.gpus, self.sharding, short) {
            (1, Sharding::None, _) => "one GPU",
            (_, Sharding::None, _) => "DDP",
            (_, Sharding::Zero1, _) => "ZeRO-1",
            (_, Sharding::Zero2, _) => "ZeRO-2",
            (_, Sharding::Zero3, _) => "ZeRO-3",
            (_, Sharding::FsdpFullShard, false) => "FSDP FULL_SHARD",
            (_, Sharding::FsdpShardGradOp, false) => "FSDP SHARD_GRAD_OP",
            (_, Sharding::FsdpHybridShard, false) => "FSDP HYBRID_SHARD",
            (_, Sharding::FsdpFullShard, true) => "FSDP full",
            (_, Sharding::FsdpShardGradOp, true) => "FSDP grad-op",
            (_, Sharding::FsdpHybridShard, true) => "FSDP hybrid",
        };
        let off = match (self.offload, self.is_deepspeed(), short) {
            (Offload::None, _, _) => "",
            (Offload::Optimizer, true, false) => " + optimizer offload",
            (Offload::OptimizerAndParams, true, false) => " + optimizer and parameter offload",
            (Offload::Optimizer, true, true) => " + opt. offload",
            (Offload::OptimizerAndParams, true, true) => " + offload",
            // FSDP's CPUOffload moves parameters, gradients and the optimizer step together.
            (_, false, false) => " + CPU offload",
            (_, false, true) => " + offload",
        };
        format!("{s}{off}")
    }
}

/// The layouts a request searches, best first by [`Layout::comm_cost`] then more GPUs.
///
/// Without a cluster: the request's fixed `parallel` layout alone. With one, for each count
/// of [`gpu_counts`]: one GPU plain; above one, per stack:
///
/// - hf, trl (the HF Trainer launches DeepSpeed and FSDP through accelerate): DDP, ZeRO-1,
///   ZeRO-2, FSDP SHARD_GRAD_OP, ZeRO-3, FSDP FULL_SHARD, FSDP HYBRID_SHARD when the GPUs span
///   nodes; ZeRO-2 and ZeRO-3 with the optimizer offloaded; ZeRO-3 and FSDP FULL_SHARD with
///   optimizer and parameters offloaded (offload only with [`Cluster::offload`]);
/// - torchtune (its distributed recipes always shard with FSDP2, `fsdp_cpu_offload`
///   optional): FSDP FULL_SHARD, with and without CPU offload;
/// - litgpt (Fabric's `FSDPStrategy`, full shard, no offload in its fine-tuning scripts):
///   FSDP FULL_SHARD.
#[must_use]
pub fn layouts(request: &Request) -> Vec<Layout> {
    let Some(cluster) = request.cluster.filter(|c| c.gpus() > 1 || c.exact) else {
        let p = &request.parallel;
        return vec![Layout {
            gpus: p.gpus().max(1),
            nodes: p.nodes.max(1),
            sharding: p.sharding,
            offload: p.offload,
        }];
    };
    let g = cluster.gpus_per_node.max(1);
    let mut out = Vec::new();
    for n in gpu_counts(&cluster) {
        if n <= 1 {
            out.push(Layout::SINGLE);
            continue;
        }
        let nodes = n.div_ceil(g);
        let l = |sharding, offload| Layout {
            gpus: n,
            nodes,
            sharding,
            offload,
        };
        let profile = request.stack.profile();
        let offload = if cluster.offload {
            profile.offload_layouts
        } else {
            &[]
        };
        out.extend(
            profile
                .multi_gpu_layouts
                .iter()
                .chain(offload)
                .filter(|(s, _)| *s != Sharding::FsdpHybridShard || nodes > 1)
                .map(|&(s, o)| l(s, o)),
        );
    }
    out.sort_by_key(|l| (l.comm_cost(), std::cmp::Reverse(l.gpus)));
    out
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
}

impl Caps {
    /// Capabilities of a [`crate::hardware::Device`] (its total memory is the usable memory).
    #[must_use]
    pub fn of_device(device: &crate::hardware::Device) -> Self {
        Self {
            usable_bytes: device.total_bytes,
            bf16: device.supports_bf16,
            flash_attention: device.supports_flash_attention,
            profile: DeviceProfile::for_compute_capability(device.compute_capability),
            host_bytes: None,
            bitsandbytes: device.vendor != crate::hardware::Vendor::Apple,
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
    /// Stack (fixed).
    pub stack: Stack,
    /// The request's fixed layout (its tensor and pipeline degrees; the data-parallel degree,
    /// sharding and offload come from each [`Layout`]).
    pub parallel: Parallel,
    /// Objective.
    pub objective: Objective,
    /// LoRA targets of the attention set, resolved onto this model.
    #[serde(skip)]
    attention_targets: Targets,
}

impl Space {
    /// The space for `request` on a device with `caps`, for `model`.
    ///
    /// # Errors
    /// A zero or oversized sequence length or effective batch, or a method that is not a
    /// training method.
    pub fn new(model: &ModelSpec, request: &Request, caps: &Caps) -> Result<Self, SearchError> {
        let invalid = |field, message: String| Err(SearchError::Invalid { field, message });
        let methods = match request.method {
            MethodChoice::Auto => vec![Method::Full, Method::Lora, Method::Qlora],
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
        let methods: Vec<Method> = if caps.bitsandbytes {
            methods
        } else {
            methods
                .into_iter()
                .filter(|m| *m != Method::Qlora)
                .collect()
        };
        if methods.is_empty() {
            return invalid(
                "method",
                "QLoRA needs bitsandbytes, which does not run on this device (Apple GPUs); \
                 use lora or full"
                    .to_owned(),
            );
        }
        let optimizers: Vec<Optimizer> = OPTIMIZERS
            .iter()
            .copied()
            .filter(|o| {
                caps.bitsandbytes || !matches!(o, Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit)
            })
            .collect();
        let precisions = if caps.bf16 {
            vec![Precision::Bf16Mixed, Precision::Bf16]
        } else {
            vec![Precision::Fp16Mixed]
        };
        let attentions = if caps.flash_attention {
            vec![Attention::Flash, Attention::Sdpa]
        } else {
            vec![Attention::Sdpa]
        };
        let names = ATTENTION_TARGETS.iter().map(|s| (*s).to_owned()).collect();
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
            stack: request.stack,
            parallel: if request.cluster.is_some() {
                Parallel::single()
            } else {
                request.parallel.clone()
            },
            objective: request.objective,
            attention_targets: crate::targets::resolve(model, &Targets::Names(names)),
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
                                out.push(Config {
                                    method,
                                    targets,
                                    rank,
                                    precision,
                                    gradient_checkpointing,
                                    optimizer,
                                    attention,
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

    /// The engine job of a configuration.
    #[must_use]
    pub fn job(&self, c: &Config) -> Job {
        let mut job = Job {
            method: c.method,
            quantization: if c.method == Method::Qlora {
                QLORA_QUANTIZATION
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
            padding: Padding::Packed,
            parallel: Parallel {
                data_parallel: self.data_parallel(&c.layout),
                tensor_parallel: self.parallel.tensor_parallel.max(1),
                pipeline: self.parallel.pipeline.max(1),
                sharding: c.layout.sharding,
                offload: c.layout.offload,
                nodes: c.layout.nodes.max(1),
                reduce_bucket: self.parallel.reduce_bucket,
            },
            ..Job::default()
        };
        if c.method.is_peft() {
            job.lora.rank = c.rank;
            job.lora.alpha = alpha_for_rank(c.rank);
            job.lora.targets = self.targets(c.targets);
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
    /// Sequence length.
    pub seq_len: u64,
    /// Micro batch (per GPU).
    pub micro_batch: u64,
    /// GPUs, strategy and offload.
    pub layout: Layout,
}

/// Number of entries of a ranking key.
pub const KEY_LEN: usize = 13;

/// Largest [`Layout::comm_cost`] (offload of optimizer and parameters across nodes).
const MAX_COMM_COST: u64 = 14;

const fn method_quality(m: Method) -> u64 {
    match m {
        Method::Full => 2,
        Method::Lora => 1,
        Method::Qlora | Method::Inference => 0,
    }
}

const fn optimizer_rank(o: Optimizer) -> u64 {
    match o {
        Optimizer::AdamwTorchFused => 2,
        Optimizer::Adamw8bit => 1,
        _ => 0,
    }
}

/// The `quality` ranking key (compared lexicographically, larger is better), following the
/// product's order of knobs by leverage, method > precision > checkpointing >
/// batch/accumulation > optimizer (issue 3 §2), with the GPU layout after the method and
/// precision (issue 6 §3):
///
/// 1. sequence length, longer first (only varies when not fixed: the data's context is a
///    requirement, not a knob to trade);
/// 2. method: full > LoRA on a 16-bit base > QLoRA (no 4-bit when 16-bit LoRA fits: NF4
///    quantization error reaches the adapters' gradients). A full fine-tune sharded with
///    ZeRO-3 over eight GPUs beats QLoRA on one;
/// 3. LoRA targets: every Linear > attention only. Part of the method's leverage: "LoRA on
///    all linear transformer block layers is required to match full finetuning performance"
///    (QLoRA paper, Dettmers et al. 2023, §4);
/// 4. precision: fp32 master weights under autocast (`bf16-mixed`) > pure bf16;
/// 5. the least communication ([`Layout::comm_cost`]): one GPU or DDP < ZeRO-1 < ZeRO-2 /
///    SHARD_GRAD_OP < ZeRO-3 / FULL_SHARD within a node or HYBRID_SHARD < FULL_SHARD across
///    nodes < optimizer offload < optimizer and parameter offload. The layout changes the
///    speed, not the result, so it ranks below the knobs that change the result (method,
///    adapters, precision) and above those a user trades for speed; ranked above precision
///    it would pick DDP with pure bf16 weights and 8-bit AdamW for a 7B full fine-tune on
///    eight A100s where ZeRO-1 keeps fp32 master weights and 32-bit AdamW;
/// 6. more GPUs, at equal communication (the user's GPUs are used, not left idle);
/// 7. higher LoRA rank. Below precision: the same paper finds the rank matters little once
///    every layer is adapted;
/// 8. no gradient checkpointing > checkpointing (it changes speed, not the result, so it
///    ranks below everything that changes the result);
/// 9. larger micro batch (fewer accumulation steps);
/// 10. optimizer: 32-bit AdamW states > 8-bit > paged 8-bit;
/// 11. FlashAttention-2 > SDPA;
/// 12. DeepSpeed > FSDP at the same communication (ZeRO-2 over SHARD_GRAD_OP, ZeRO-3 over
///     FULL_SHARD: the HF Trainer's most used integration, and the one the published
///     full fine-tuning runs of issue 6 used).
#[must_use]
pub fn quality_key(c: &Config) -> [u64; KEY_LEN] {
    let peft = c.method.is_peft();
    [
        c.seq_len,
        method_quality(c.method),
        u64::from(peft && c.targets == TargetSet::AllLinear),
        u64::from(c.precision != Precision::Bf16),
        MAX_COMM_COST.saturating_sub(c.layout.comm_cost()),
        c.layout.gpus,
        if peft { c.rank } else { 0 },
        u64::from(!c.gradient_checkpointing),
        c.micro_batch,
        optimizer_rank(c.optimizer),
        u64::from(c.attention == Attention::Flash),
        u64::from(c.layout.is_deepspeed()),
        0,
    ]
}

/// The `speed` ranking key (lexicographic, larger is better):
///
/// 1. sequence length, longer first (as for quality);
/// 2. no CPU offload > optimizer offload > optimizer and parameter offload (the CPU step and
///    PCIe transfers dominate a step);
/// 3. more GPUs (throughput grows with the data-parallel degree);
/// 4. no gradient checkpointing (recomputing the forward costs about a third of a step);
/// 5. less communication ([`Layout::comm_cost`]);
/// 6. larger micro batch (better GPU utilisation per step);
/// 7. method: LoRA > full > QLoRA (LoRA skips the weight-gradient GEMMs, about a third of a
///    step's FLOPs; QLoRA dequantizes every weight in forward and backward);
/// 8. FlashAttention-2 > SDPA;
/// 9. optimizer: fused 32-bit > 8-bit > paged 8-bit;
/// 10. then the quality order: targets, rank, precision;
/// 13. DeepSpeed > FSDP at the same communication.
#[must_use]
pub fn speed_key(c: &Config) -> [u64; KEY_LEN] {
    let peft = c.method.is_peft();
    let method = match c.method {
        Method::Lora => 2,
        Method::Full => 1,
        Method::Qlora | Method::Inference => 0,
    };
    let cost = c.layout.comm_cost();
    [
        c.seq_len,
        (MAX_COMM_COST / 5).saturating_sub(cost / 5),
        c.layout.gpus,
        u64::from(!c.gradient_checkpointing),
        MAX_COMM_COST.saturating_sub(cost),
        c.micro_batch,
        method,
        u64::from(c.attention == Attention::Flash),
        optimizer_rank(c.optimizer),
        u64::from(peft && c.targets == TargetSet::AllLinear),
        if peft { c.rank } else { 0 },
        u64::from(c.precision != Precision::Bf16),
        u64::from(c.layout.is_deepspeed()),
    ]
}

/// The ranking key of `c` under `objective`.
#[must_use]
pub fn key(objective: Objective, c: &Config) -> [u64; KEY_LEN] {
    match objective {
        Objective::Quality => quality_key(c),
        Objective::Speed => speed_key(c),
    }
}

/// An estimated configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The point of the space.
    pub config: Config,
    /// Its engine job (targets resolved onto the model).
    pub job: Job,
    /// The estimate.
    pub estimate: Estimate,
    /// Safety margin ([`margin_bytes`]).
    pub margin_bytes: u64,
    /// Usable memory − margin − device peak (negative: does not fit).
    pub headroom_bytes: i64,
    /// Whether the offloaded states fit the host RAM ([`Caps::host_bytes`]; true when not
    /// checked).
    pub host_fits: bool,
}

impl Candidate {
    /// Host RAM one node needs for the offloaded states of the ranks it runs.
    #[must_use]
    pub const fn host_bytes_per_node(&self) -> u64 {
        self.estimate
            .host_bytes_per_node(self.job.parallel.gpus_per_node())
    }

    /// The upper bound on the device peak: peak + margin ([`margin_bytes`]).
    #[must_use]
    pub const fn upper_bytes(&self) -> u64 {
        self.estimate
            .peak_device_bytes
            .saturating_add(self.margin_bytes)
    }

    /// The GPU-memory verdict: the bound within the usable memory, only the prediction, or
    /// neither.
    #[must_use]
    pub fn verdict(&self) -> crate::bound::Verdict {
        let margin = i64::try_from(self.margin_bytes).unwrap_or(i64::MAX);
        if self.headroom_bytes >= 0 {
            crate::bound::Verdict::Fits
        } else if self.headroom_bytes.saturating_add(margin) >= 0 {
            crate::bound::Verdict::Uncertain
        } else {
            crate::bound::Verdict::DoesNotFit
        }
    }

    /// Whether the peak plus margin stays within the usable memory (and the offloaded
    /// states within the host RAM, when it is known).
    #[must_use]
    pub const fn fits(&self) -> bool {
        self.headroom_bytes >= 0 && self.host_fits
    }
}

/// The outcome of a search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The best fitting configuration, if any fits.
    pub best: Option<Candidate>,
    /// The next best fitting configurations, best first, each at its largest fitting micro
    /// batch and best optimizer/attention: one per distinct method, adapters, precision,
    /// checkpointing and length (at most [`RUNNERS_UP`]).
    pub runners_up: Vec<Candidate>,
    /// When nothing fits: the configuration with the smallest peak.
    pub closest: Option<Candidate>,
    /// Configurations estimated.
    pub evaluated: usize,
    /// Usable memory searched against.
    pub usable_bytes: u64,
}

impl Outcome {
    /// By how many bytes the closest configuration misses (0 when something fits).
    #[must_use]
    pub fn short_by_bytes(&self) -> u64 {
        match (&self.best, &self.closest) {
            (None, Some(c)) => c.headroom_bytes.min(0).unsigned_abs(),
            _ => 0,
        }
    }
}

/// What makes a runner-up a different recipe rather than the same one with another
/// optimizer or attention kernel: method, adapters, precision, checkpointing, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape(Method, TargetSet, u64, Precision, bool, u64);

impl Shape {
    const fn of(c: &Config) -> Self {
        Self(
            c.method,
            c.targets,
            c.rank,
            c.precision,
            c.gradient_checkpointing,
            c.seq_len,
        )
    }
}

/// Most runners-up an [`Outcome`] lists.
pub const RUNNERS_UP: usize = 5;

/// Estimates one configuration, its replayed steps included.
///
/// # Errors
/// The job is invalid for the model (e.g. a rank above the hidden size).
pub fn evaluate(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    config: Config,
) -> Result<Candidate, JobError> {
    let job = space.job(&config);
    let mut estimate = estimate_without_replay(model, &job, &caps.profile)?;
    add_replayed_steps(&mut estimate, model, &job, &caps.profile);
    let room = Room::of(&Judged::of(&estimate, &job), caps);
    Ok(Candidate {
        config,
        job,
        estimate,
        margin_bytes: room.margin,
        headroom_bytes: room.headroom,
        host_fits: room.host_fits,
    })
}

/// What judging an estimate against a device needs of it.
#[derive(Debug, Clone, Copy)]
struct Judged {
    peak_device_bytes: u64,
    margin: u64,
    host_bytes_per_node: u64,
}

impl Judged {
    fn of(est: &Estimate, job: &Job) -> Self {
        Self {
            peak_device_bytes: est.peak_device_bytes,
            margin: margin_bytes(est, job),
            // The job carries its layout's node count: a node's host RAM holds its ranks'
            // states.
            host_bytes_per_node: est.host_bytes_per_node(job.parallel.gpus_per_node()),
        }
    }
}

/// Estimates kept across the searches of one model and one request on several devices
/// and GPU counts (`moro fit`): an estimate depends on the configuration and the device
/// profile, not on the memory it is judged against, and those searches visit many of the
/// same configurations. Only what judging needs is kept (a few words per configuration).
/// Sharing one cache between searches of different models or requests is a mistake: the
/// key does not name them.
#[derive(Debug, Default)]
pub struct EstimateCache {
    inner: std::sync::Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    /// The distinct device profiles seen, indexed by the keys.
    profiles: Vec<DeviceProfile>,
    entries: std::collections::HashMap<(Config, usize), Cached>,
}

/// One configuration judged before the replayed steps (`None`: not a valid job), and with
/// them once that was needed.
#[derive(Debug, Clone, Copy)]
struct Cached {
    base: Option<Judged>,
    replayed: Option<Judged>,
}

impl EstimateCache {
    fn key(inner: &mut CacheInner, config: Config, profile: &DeviceProfile) -> (Config, usize) {
        let i = inner
            .profiles
            .iter()
            .position(|p| p == profile)
            .unwrap_or_else(|| {
                inner.profiles.push(profile.clone());
                inner.profiles.len() - 1
            });
        (config, i)
    }

    fn get(&self, config: Config, profile: &DeviceProfile) -> Option<Cached> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = Self::key(&mut inner, config, profile);
        inner.entries.get(&key).copied()
    }

    fn put(&self, config: Config, profile: &DeviceProfile, cached: Cached) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = Self::key(&mut inner, config, profile);
        inner.entries.insert(key, cached);
    }
}

/// A configuration judged against the device, its estimate not kept.
#[derive(Debug, Clone, Copy)]
struct Probe {
    config: Config,
    headroom: i64,
    host_fits: bool,
}

impl Probe {
    const fn fits(&self) -> bool {
        self.headroom >= 0 && self.host_fits
    }
}

/// Judges one configuration: on [`estimate_without_replay`], and with the replayed steps
/// only when that fits (they only raise the reserve, so they would rule it out too, and
/// the search probes many that do not fit). `None`: not a valid job.
fn probe(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    config: Config,
    cache: Option<&EstimateCache>,
) -> Option<Probe> {
    let cached = cache.and_then(|c| c.get(config, &caps.profile));
    let mut job = None;
    let mut base_estimate = None;
    let mut entry = cached.unwrap_or_else(|| {
        let j = space.job(&config);
        let est = estimate_without_replay(model, &j, &caps.profile).ok();
        let base = est.as_ref().map(|e| Judged::of(e, &j));
        job = Some(j);
        base_estimate = est;
        Cached {
            base,
            replayed: None,
        }
    });
    let mut room = Room::of(&entry.base?, caps);
    if room.fits() {
        let replayed = match entry.replayed {
            Some(r) => r,
            None => {
                let j = job.unwrap_or_else(|| space.job(&config));
                let mut est = match base_estimate {
                    Some(e) => e,
                    None => estimate_without_replay(model, &j, &caps.profile).ok()?,
                };
                add_replayed_steps(&mut est, model, &j, &caps.profile);
                let r = Judged::of(&est, &j);
                entry.replayed = Some(r);
                r
            }
        };
        room = Room::of(&replayed, caps);
    }
    if let Some(c) = cache
        && cached.is_none_or(|c| c.replayed.is_none() && entry.replayed.is_some())
    {
        c.put(config, &caps.profile, entry);
    }
    Some(Probe {
        config,
        headroom: room.headroom,
        host_fits: room.host_fits,
    })
}

/// An estimate against the capacity: its safety margin, the headroom left after it, and
/// whether the host memory holds what it offloads.
struct Room {
    margin: u64,
    headroom: i64,
    host_fits: bool,
}

impl Room {
    fn of(j: &Judged, caps: &Caps) -> Self {
        let need = j.peak_device_bytes.saturating_add(j.margin);
        let headroom = i128::from(caps.usable_bytes) - i128::from(need);
        let headroom =
            i64::try_from(headroom).unwrap_or(if headroom < 0 { i64::MIN } else { i64::MAX });
        Self {
            margin: j.margin,
            headroom,
            host_fits: caps.host_bytes.is_none_or(|h| j.host_bytes_per_node <= h),
        }
    }

    const fn fits(&self) -> bool {
        self.headroom >= 0 && self.host_fits
    }
}

/// Searches `space` for the best configuration of `model` that fits `caps`.
///
/// For each sequence length (longest first), the rests of configuration are visited in the
/// order of their best possible key (the key at their largest micro batch, which no fitting
/// micro batch exceeds); the visit stops once [`RUNNERS_UP`] + 1 distinct recipes are held and
/// no rest left can outrank the last of them. When nothing fits every rest is estimated, so
/// the closest configuration is the smallest of the whole space. Configurations are judged
/// without keeping their estimates; the ones reported are estimated again in full.
#[must_use]
pub fn search(model: &ModelSpec, space: &Space, caps: &Caps) -> Outcome {
    search_cached(model, space, caps, None)
}

/// [`search`], with estimates shared through `cache` with other searches of the same model
/// and request.
#[must_use]
pub fn search_cached(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    cache: Option<&EstimateCache>,
) -> Outcome {
    let mut evaluated = 0usize;
    let mut closest: Option<Probe> = None;
    let mut eval = |c: Config| -> Option<Probe> {
        evaluated += 1;
        let p = probe(model, space, caps, c, cache)?;
        if closest
            .as_ref()
            .is_none_or(|x| (p.host_fits, p.headroom) > (x.host_fits, x.headroom))
        {
            closest = Some(p);
        }
        Some(p)
    };
    let objective = space.objective;
    // The best configuration of each distinct recipe, best first, at most RUNNERS_UP + 1:
    // the same selection as sorting every fitting configuration and keeping the first of
    // each shape.
    let mut top: Vec<([u64; KEY_LEN], Config)> = Vec::new();
    for &seq_len in &space.seq_lens {
        let mut rests: Vec<([u64; KEY_LEN], Config)> = space
            .rests(seq_len)
            .into_iter()
            .map(|r| {
                let largest = space.micro_batches(&r.layout).first().copied().unwrap_or(1);
                let upper = key(
                    objective,
                    &Config {
                        micro_batch: largest,
                        ..r
                    },
                );
                (upper, r)
            })
            .collect();
        rests.sort_by_key(|r| std::cmp::Reverse(r.0));
        for (upper, rest) in rests {
            if top.len() > RUNNERS_UP && top.last().is_some_and(|(k, _)| upper < *k) {
                break;
            }
            if let Some(c) = largest_fitting_batch(space, rest, &mut eval) {
                keep_top(&mut top, key(objective, &c), c);
            }
        }
        // The sequence length is the first key of every objective.
        if !top.is_empty() {
            break;
        }
    }
    let mut it = top
        .into_iter()
        .filter_map(|(_, c)| evaluate(model, space, caps, c).ok());
    let best = it.next();
    let closest = match (&best, closest) {
        (None, Some(p)) => evaluate(model, space, caps, p.config).ok(),
        _ => None,
    };
    Outcome {
        closest,
        best,
        runners_up: it.collect(),
        evaluated,
        usable_bytes: caps.usable_bytes,
    }
}

/// Whether any configuration of `space` can fit `caps`: a necessary condition, cheap next
/// to [`search`] when nothing fits (which then estimates every rest to find the closest).
///
/// Memory grows with the LoRA rank and the sequence length, checkpointing only lowers it,
/// and among accumulating micro batches the smallest needs least, so each layout, method,
/// target set, precision, optimizer and attention is probed at the smallest rank and
/// sequence length, with checkpointing where the space allows it, at micro batch 1 and
/// without accumulation (which can need less than accumulating: ZeRO's offload keeps
/// accumulation buffers). If none of those fits, nothing does.
#[must_use]
pub fn can_fit(model: &ModelSpec, space: &Space, caps: &Caps) -> bool {
    can_fit_cached(model, space, caps, None)
}

/// [`can_fit`], with estimates shared through `cache` ([`search_cached`]).
#[must_use]
pub fn can_fit_cached(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    cache: Option<&EstimateCache>,
) -> bool {
    let (Some(&seq_len), Some(&rank)) = (space.seq_lens.iter().min(), space.ranks.iter().min())
    else {
        return false;
    };
    let checkpointing = space.checkpointing.iter().any(|&c| c);
    space.rests(seq_len).into_iter().any(|r| {
        if r.gradient_checkpointing != checkpointing || (r.method.is_peft() && r.rank != rank) {
            return false;
        }
        let whole = space.micro_batches(&r.layout).first().copied().unwrap_or(1);
        [1, whole].into_iter().any(|micro_batch| {
            let c = Config { micro_batch, ..r };
            probe(model, space, caps, c, cache).is_some_and(|p| p.fits())
        })
    })
}

/// Adds a fitting candidate to the best-per-shape list (sorted, best first, at most
/// [`RUNNERS_UP`] + 1 shapes).
fn keep_top(top: &mut Vec<([u64; KEY_LEN], Config)>, k: [u64; KEY_LEN], c: Config) {
    let shape = Shape::of(&c);
    if let Some(i) = top.iter().position(|(_, x)| Shape::of(x) == shape) {
        if top[i].0 >= k {
            return;
        }
        top.remove(i);
    }
    let at = top.partition_point(|(x, _)| *x > k);
    top.insert(at, (k, c));
    top.truncate(RUNNERS_UP + 1);
}

/// The configuration with the largest micro batch that fits, for one rest-of-configuration.
///
/// The micro batch equal to the effective batch (no accumulation) is tried alone; the
/// accumulating ones are monotone in memory, so a binary search over them finds the largest
/// that fits.
fn largest_fitting_batch(
    space: &Space,
    rest: Config,
    eval: &mut impl FnMut(Config) -> Option<Probe>,
) -> Option<Config> {
    let with = |b: u64| Config {
        micro_batch: b,
        ..rest
    };
    let mut fits = |b: u64| eval(with(b)).is_some_and(|p| p.fits());
    let batches = &space.micro_batches(&rest.layout); // largest first
    let (&first, accumulating) = batches.split_first()?;
    // Without accumulation (micro batch = effective batch).
    if fits(first) {
        return Some(with(first));
    }
    // Accumulating micro batches, largest first: find the first (largest) that fits.
    // Probe the smallest first: if it does not fit, none does.
    let smallest = *accumulating.last()?;
    if !fits(smallest) {
        return None;
    }
    // Invariant: accumulating[..lo] do not fit; accumulating[hi] fits.
    let (mut lo, mut hi) = (0usize, accumulating.len() - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(accumulating[mid]) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(with(accumulating[hi]))
}

/// Every configuration of the space (all micro batches), for tests and exhaustive listings.
#[must_use]
pub fn all_configs(space: &Space) -> Vec<Config> {
    let mut out = Vec::new();
    for &s in &space.seq_lens {
        for rest in space.rests(s) {
            for b in space.micro_batches(&rest.layout) {
                out.push(Config {
                    micro_batch: b,
                    ..rest
                });
            }
        }
    }
    out
}
