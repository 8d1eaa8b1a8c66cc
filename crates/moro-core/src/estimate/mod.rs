//! The peak-memory model.
//!
//! [`estimate`] turns a [`ModelSpec`], a [`Job`] and a [`DeviceProfile`] into an [`Estimate`]:
//! the bytes at the peak of a training step (or of inference), broken into components, the
//! phase of the step where the peak happens, and three levels:
//!
//! 1. **allocated**: tensors, as `torch.cuda.max_memory_allocated` counts them;
//! 2. **reserved**: plus the caching allocator's cached-but-free blocks
//!    (`torch.cuda.max_memory_reserved`);
//! 3. **device**: plus the CUDA context and memory outside PyTorch's allocator (bitsandbytes'
//!    paged optimizer states, NCCL), as nvidia-smi shows it.
//!
//! The peak is the maximum over the phases of a step, never the sum of every component's
//! own maximum. The byte counts come from `docs/memory-anatomy.md` (the code citations there
//! are repeated on each formula below); see [`activations`] for the per-layer model,
//! [`weights`] for storage, [`optimizer`] for optimizer states, [`loss`] for the logits
//! buffers and [`parallel`] for sharding.

pub mod activations;
pub mod batches;
pub mod boft;
pub mod dora;
pub mod inference;
pub mod load;
pub mod loss;
pub mod mlx;
pub mod optimizer;
pub mod parallel;
pub mod rank;
pub mod recurrent;
pub mod regime;
pub mod replay;
pub mod stored;
pub mod streams;
pub mod trace;
pub mod vision;
pub mod weights;

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobError, LossImpl, Method, Sharding};
use crate::model::ModelSpec;
use crate::units::{MIB, round_up};

pub use regime::Regime;

/// What the device adds to the tensor bytes. Defaults come from
/// [`DeviceProfile::for_compute_capability`]; `moro calibrate` measures them per machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// cuBLAS workspace per handle/stream (PyTorch `CublasHandlePool.cpp`
    /// `parseChosenWorkspaceSize`: 32 MiB on sm90+, `4096·1024·2 + 16·1024·8` = 8.125 MiB
    /// otherwise).
    pub cublas_workspace_bytes: u64,
    /// CUDA context plus loaded kernels, outside PyTorch's counters. stas00's
    /// ml-engineering measured 0.47 GiB (lazy loading, which PyTorch sets itself in
    /// `CUDAHooks::init`) to 0.92 GiB (every kernel loaded) on an A100. A training step loads
    /// most kernel families (cuBLAS GEMMs of many shapes, attention, norms, optimizer,
    /// NCCL), so moro takes the loaded figure: a device-level prediction should not come in
    /// under what nvidia-smi shows. Measured on an H200 (torch 2.11, CUDA 13,
    /// `validation/h200/machine.json`): 610 MiB bare, 758 MiB after training steps
    /// (`moro calibrate` stores the machine's own figure).
    pub cuda_context_bytes: u64,
    /// Fraction of the churning (non-resident) allocations that the caching allocator keeps
    /// reserved on top of them at the peak (fragmentation: freed blocks of the wrong size).
    /// memory-anatomy §7: "several percent up to ~15%" without expandable segments. On an
    /// H200 the runs whose reserve this ratio sets (no checkpointing: long churn) measured
    /// 0.04–0.09, median 0.051; the others are set by the largest freed block
    /// ([`allocated_and_reserve`]). `moro calibrate` measures it per machine.
    pub reserve_ratio: f64,
    /// NCCL / torch.distributed buffers per GPU when more than one GPU takes part
    /// (ml-engineering: "~1-2GiB … the more GPUs the higher"). [UNVERIFIED]
    pub nccl_bytes: u64,
    /// A systematic correction in bytes learned on this machine (`moro calibrate`,
    /// `moro run` under-predictions), added at the allocated level.
    pub offset_bytes: i64,
    /// SDPA's flash backend runs here: compute capability 8.0 or newer (PyTorch
    /// `sdp_utils.cpp` `check_flash_attention_hardware_support`). Without it SDPA takes the
    /// mem-efficient kernel, which refuses grouped KV heads (`check_batch_size_and_num_heads_dense`
    /// without GQA support), so a grouped-KV model's attention runs the math kernel.
    #[serde(default = "flash_sdpa_default")]
    pub flash_sdpa: bool,
    /// The PyTorch backend the job runs on: its allocator, and what lies outside it.
    #[serde(default)]
    pub backend: Backend,
}

/// The PyTorch device backend of a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// CUDA, and ROCm, whose HIP caching allocator is CUDA's
    /// ([`crate::caching_allocator`]).
    #[default]
    Cuda,
    /// Apple's Metal Performance Shaders (`device="mps"`): heaps of PyTorch's MPS allocator
    /// ([`crate::mps_allocator`]), no CUDA context, no cuBLAS workspace, no FlashAttention;
    /// SDPA runs its math kernel in training (`_fused_sdp_choice` has no MPS kernel in torch
    /// 2.15, and `_scaled_dot_product_attention_math_for_mps` has no backward).
    Mps,
}

const fn flash_sdpa_default() -> bool {
    true
}

impl Default for DeviceProfile {
    fn default() -> Self {
        Self::for_compute_capability(Some((8, 0)))
    }
}

impl DeviceProfile {
    /// Whether `job`'s attention runs PyTorch SDPA's math kernel here: SDPA in training on
    /// MPS (without grad MPS has a kernel of its own), or without the
    /// flash backend ([`Self::flash_sdpa`]) on grouped KV heads, which transformers 5.25
    /// passes with `enable_gqa` (`use_gqa_in_sdpa`, no mask) and the mem-efficient kernel
    /// refuses.
    #[must_use]
    pub fn sdpa_math_kernel(&self, model: &ModelSpec, job: &Job) -> bool {
        job.attention == crate::job::Attention::Sdpa
            && match self.backend {
                Backend::Mps => self.runs_on_mps(job.stack) && job.method != Method::Inference,
                Backend::Cuda => !self.flash_sdpa && model.num_kv_heads < model.num_heads,
            }
    }

    /// Apple's MPS ([`Backend::Mps`]): the caching allocator's reserve ratio where no step is
    /// replayed, and nothing outside PyTorch's allocator that moro knows the size of
    /// (MPSGraph's own buffers are Metal's, counted by `driver_allocated_memory()` only).
    #[must_use]
    pub fn mps() -> Self {
        Self {
            cublas_workspace_bytes: 0,
            cuda_context_bytes: 0,
            nccl_bytes: 0,
            flash_sdpa: false,
            backend: Backend::Mps,
            ..Self::default()
        }
    }

    /// Whether a job of `stack` runs on PyTorch's MPS here (MLX on the same GPU does not).
    #[must_use]
    pub fn runs_on_mps(&self, stack: crate::job::Stack) -> bool {
        self.backend == Backend::Mps && stack.profile().runtime != crate::stack::Runtime::Mlx
    }

    /// The profile of a device: [`Self::mps`] for an Apple GPU, else by compute capability.
    #[must_use]
    pub fn for_device(device: &crate::hardware::Device) -> Self {
        if device.vendor == crate::hardware::Vendor::Apple {
            Self::mps()
        } else {
            Self::for_compute_capability(device.compute_capability)
        }
    }

    /// Defaults for a GPU of the given compute capability (`None`: unknown, treated as sm80).
    #[must_use]
    pub fn for_compute_capability(cc: Option<(u32, u32)>) -> Self {
        let major = cc.map_or(8, |c| c.0);
        let cublas = if major >= 9 {
            32 * MIB
        } else {
            4096 * 1024 * 2 + 16 * 1024 * 8
        };
        Self {
            cublas_workspace_bytes: cublas,
            cuda_context_bytes: 920 * MIB,
            reserve_ratio: 0.08,
            nccl_bytes: 1024 * MIB,
            offset_bytes: 0,
            flash_sdpa: major >= 8,
            backend: Backend::Cuda,
        }
    }
}

/// A named part of the memory at the peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// Base model weights (quantized storage included).
    Weights,
    /// LoRA / DoRA adapter weights.
    Adapters,
    /// Gradients of the trainable parameters.
    Gradients,
    /// Optimizer states (and fp32 master weights where the stack keeps them).
    OptimizerStates,
    /// Saved activations (checkpoints, the layer being recomputed, autocast weight copies).
    Activations,
    /// Logits and the loss buffers.
    LogitsLoss,
    /// KV cache (inference).
    KvCache,
    /// Short-lived buffers: dequantized weights, optimizer-step temporaries, backward
    /// workspaces, cuBLAS workspaces, communication buckets.
    Transients,
    /// Cached but free blocks of the caching allocator (reserved level).
    AllocatorReserve,
    /// Memory outside PyTorch's allocator: paged optimizer states, NCCL (device level).
    OutsideAllocator,
    /// CUDA context (device level).
    CudaContext,
}

impl Component {
    /// Made once and kept for the whole run (weights, adapters, optimizer states, gradients,
    /// KV cache), as opposed to the churn a step allocates and frees: what
    /// [`allocated_and_reserve`] leaves out of the fragmenting bytes.
    #[must_use]
    pub const fn is_resident(self) -> bool {
        matches!(
            self,
            Self::Weights
                | Self::Adapters
                | Self::OptimizerStates
                | Self::Gradients
                | Self::KvCache
        )
    }

    /// Display name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Weights => "weights",
            Self::Adapters => "adapters",
            Self::Gradients => "gradients",
            Self::OptimizerStates => "optimizer_states",
            Self::Activations => "activations",
            Self::LogitsLoss => "logits_loss",
            Self::KvCache => "kv_cache",
            Self::Transients => "transients",
            Self::AllocatorReserve => "allocator_reserve",
            Self::OutsideAllocator => "outside_allocator",
            Self::CudaContext => "cuda_context",
        }
    }
}

/// Moments of a step where the peak can happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Weights loaded, nothing else.
    Load,
    /// A vision-language model's tower runs over the images, before the language model.
    VisionForward,
    /// End of the forward pass (all saved activations alive, loss buffers being built).
    ForwardEnd,
    /// Backward of the loss: every activation alive plus the loss buffers.
    LossBackward,
    /// Backward through the last decoder layer (its transients; the recompute under
    /// gradient checkpointing).
    LayerBackward,
    /// End of backward: all gradients, little else.
    BackwardEnd,
    /// A trained vision tower's backward, after the language model's: every gradient and
    /// the tower's saved tensors.
    VisionBackward,
    /// The optimizer step.
    OptimizerStep,
    /// Inference prefill.
    Prefill,
    /// Inference decoding at full context.
    Decode,
}

impl Phase {
    /// Display name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::VisionForward => "vision_forward",
            Self::ForwardEnd => "forward_end",
            Self::LossBackward => "loss_backward",
            Self::LayerBackward => "layer_backward",
            Self::BackwardEnd => "backward_end",
            Self::VisionBackward => "vision_backward",
            Self::OptimizerStep => "optimizer_step",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// Allocated bytes of one phase, by component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseBytes {
    /// The phase.
    pub phase: Phase,
    /// Components alive in it (allocated level).
    pub components: Vec<(Component, u64)>,
}

impl PhaseBytes {
    /// Total allocated bytes of the phase.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.components.iter().map(|c| c.1).sum()
    }

    /// Bytes of a component in the phase (0 when absent).
    #[must_use]
    pub fn component(&self, c: Component) -> u64 {
        component_bytes(&self.components, c)
    }
}

fn component_bytes(components: &[(Component, u64)], c: Component) -> u64 {
    components.iter().filter(|x| x.0 == c).map(|x| x.1).sum()
}

/// The result of an estimate. All sizes in bytes, per GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Peak of `torch.cuda.max_memory_allocated`.
    pub peak_allocated_bytes: u64,
    /// Peak of `torch.cuda.max_memory_reserved`.
    pub peak_reserved_bytes: u64,
    /// What nvidia-smi shows at the peak.
    pub peak_device_bytes: u64,
    /// Where in the step the peak happens.
    pub peak_phase: Phase,
    /// Components at the peak, all three levels (allocated components, then the allocator
    /// reserve, memory outside the allocator and the CUDA context).
    pub components: Vec<(Component, u64)>,
    /// Every phase considered, allocated level.
    pub phases: Vec<PhaseBytes>,
    /// Host (CPU) memory one GPU process (rank) needs for its offloaded states and
    /// parameters; a node needs this times the ranks it runs ([`Estimate::host_bytes_per_node`]).
    pub host_bytes: u64,
    /// Total parameters of the model.
    pub total_params: u64,
    /// Trainable parameters.
    pub trainable_params: u64,
    /// How the stack was resolved (dtypes, loss, adapter dtype), for display.
    pub regime: Regime,
    /// The largest single buffer a step allocates and frees again (the loss's fp32 logits,
    /// the largest gradient that `zero_grad(set_to_none=True)` frees): the allocator's
    /// reserve keeps a block of this size ([`allocated_and_reserve`]).
    #[serde(default)]
    pub largest_freed_block: u64,
    /// Reserved bytes the job's setup (the model's load, DeepSpeed ZeRO-3's engine and
    /// optimizer step) leaves in PyTorch's cache, a floor under the reserved level
    /// ([`load::load_reserved_bytes`]; 0 where the setup is not modelled to fragment it).
    #[serde(default)]
    pub load_reserved_bytes: u64,
    /// The fragmentation (reserved − allocated peak) of the training steps' allocation
    /// sequence replayed through the caching allocator, a floor under the reserve
    /// ([`replay::step`]; 0 where the sequence is not replayed).
    #[serde(default)]
    pub replayed_fragmentation_bytes: u64,
    /// The replay follows the layers op by op ([`trace::Trace::op_by_op`]): its
    /// fragmentation alone is the reserve, with no ratio or largest-freed-block floor.
    #[serde(default)]
    pub reserve_from_replay: bool,
    /// Cached segments a generation leaves wholly free beyond what it needs (its keys and
    /// values outgrow their blocks a token at a time): on top of the reserved level where
    /// the GPU has room for them, returned by PyTorch where it runs short
    /// ([`replay::ReplayedStep::idle_cache`]).
    #[serde(default)]
    pub idle_cache_bytes: u64,
    /// Bytes of new segments the optimizer step's temporaries need because no block the
    /// forward and backward left in the cache holds them ([`step_segments`]): added to the
    /// forward and backward's reserved level, a floor under the reserved level.
    #[serde(default)]
    pub step_segments_bytes: u64,
    /// FSDP: bytes its own streams' pools reserve and do not use at each phase
    /// ([`streams`]): added to that phase's reserved level.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stream_cached: Vec<(Phase, u64)>,
    /// A sharded job's rank, its bytes by part; `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<rank::RankParts>,
}

impl Estimate {
    /// Host memory a node running `ranks` GPU processes of this job needs for offload.
    #[must_use]
    pub const fn host_bytes_per_node(&self, ranks: u64) -> u64 {
        self.host_bytes
            .saturating_mul(if ranks == 0 { 1 } else { ranks })
    }

    /// Bytes of a component at the peak (0 when absent).
    #[must_use]
    pub fn component(&self, c: Component) -> u64 {
        component_bytes(&self.components, c)
    }

    /// Bytes of a component in one phase of the step (0 when the phase or the component is
    /// absent).
    #[must_use]
    pub fn phase_component(&self, phase: Phase, c: Component) -> u64 {
        self.phases
            .iter()
            .filter(|p| p.phase == phase)
            .flat_map(|p| p.components.iter())
            .filter(|x| x.0 == c)
            .map(|x| x.1)
            .sum()
    }
}

/// Estimates the peak memory of `job` on `model` per GPU.
///
/// # Errors
/// The job is invalid for the model ([`Job::validate`]).
pub fn estimate(
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) -> Result<Estimate, JobError> {
    // Built once here; the two steps find nothing left to build.
    let (built, job) = crate::stack::with_job(model, job);
    let mut est = estimate_without_replay(&built, &job, device)?;
    add_replayed_steps(&mut est, &built, &job, device);
    Ok(est)
}

/// Reads `est`, an [`estimate_without_replay`] of `job`, off the job's step trace where
/// the trace models it ([`replay::step`]): the phases, their components and the peak from
/// the trace, the reserve from its replay. What turns the bound into [`estimate`]'s result
/// without estimating again.
pub fn add_replayed_steps(
    est: &mut Estimate,
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) {
    let step = replayed_step(est, model, job, device);
    add_replayed_step(est, device, step.as_ref());
}

/// The step trace of `job` read for the estimate ([`replay::step`]; `None` where the trace
/// does not model the job), for an [`estimate_without_replay`] `est` of it. It depends on
/// the device only through its cuBLAS workspace ([`DeviceProfile::cublas_workspace_bytes`]).
#[must_use]
pub fn replayed_step(
    est: &Estimate,
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) -> Option<replay::ReplayedStep> {
    traced_step(est, model, job, device, replay::step)
}

/// [`replayed_step`] without the replay ([`replay::step_floor`]): where the layers are
/// traced op by op, [`add_replayed_step`] with it gives a floor under the estimate.
#[must_use]
pub fn replayed_step_floor(
    est: &Estimate,
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) -> Option<replay::ReplayedStep> {
    traced_step(est, model, job, device, replay::step_floor)
}

fn traced_step(
    est: &Estimate,
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
    read: fn(&ModelSpec, &Job, &Regime, &DeviceProfile) -> Option<replay::ReplayedStep>,
) -> Option<replay::ReplayedStep> {
    if job.stack.profile().runtime == crate::stack::Runtime::Mlx {
        return None;
    }
    let (built, job) = crate::stack::with_job(model, job);
    let (model, job) = (built.as_ref(), job.as_ref());
    let with_images = vision::with_image_tokens(model, job);
    read(
        model,
        &with_prompt_tokens(&with_images),
        &est.regime,
        device,
    )
}

/// `job` as the model runs it under prompt tuning, which prepends its virtual tokens to
/// every sequence (PEFT 0.21.2 `PeftModelForCausalLM.forward`: `torch.cat((prompts,
/// inputs_embeds), dim=1)`, labels prefixed with -100): the frozen model runs, and computes
/// logits, over them too. Any other job as it is.
#[must_use]
pub fn with_prompt_tokens(job: &Job) -> std::borrow::Cow<'_, Job> {
    if job.method.is_peft() && job.adapter.method == crate::job::PeftKind::PromptTuning {
        std::borrow::Cow::Owned(Job {
            seq_len: job.seq_len + job.adapter.virtual_tokens,
            ..job.clone()
        })
    } else {
        std::borrow::Cow::Borrowed(job)
    }
}

/// [`with_prompt_tokens`] for a run of micro-batches of `lengths` tokens: the job, and each
/// length with the prompt's tokens.
#[must_use]
pub fn with_prompt_tokens_over<'j>(
    job: &'j Job,
    lengths: &[u64],
) -> (std::borrow::Cow<'j, Job>, Vec<u64>) {
    let prompted = with_prompt_tokens(job);
    let prompt = prompted.seq_len - job.seq_len;
    let lengths = lengths.iter().map(|l| l + prompt).collect();
    (prompted, lengths)
}

/// Whether the step trace follows `job`'s decoder layers op by op
/// ([`trace::step::op_by_op`]), on the model and job as the estimate traces them.
#[must_use]
pub fn layers_op_by_op(model: &ModelSpec, job: &Job, regime: &Regime) -> bool {
    if job.stack.profile().runtime == crate::stack::Runtime::Mlx {
        return false;
    }
    let (built, job) = crate::stack::with_job(model, job);
    let (model, job) = (built.as_ref(), job.as_ref());
    trace::step::op_by_op(model, &vision::with_image_tokens(model, job), regime)
}

/// Re-levels `est` from its step trace ([`replayed_step`]): the trace's phases replace the
/// formulas', and its replayed fragmentation floors the reserve. No change for `None`.
pub fn add_replayed_step(
    est: &mut Estimate,
    device: &DeviceProfile,
    step: Option<&replay::ReplayedStep>,
) {
    let Some(step) = step else {
        return;
    };
    est.phases.clone_from(&step.phases);
    est.replayed_fragmentation_bytes = step.fragmentation;
    est.reserve_from_replay = step.reserve_from_replay;
    est.idle_cache_bytes = step.idle_cache;
    let outside = est.component(Component::OutsideAllocator);
    let context = est.component(Component::CudaContext);
    set_levels(est, device, outside, context);
}

/// [`estimate`] without the step trace ([`replay`]): the phases from the formulas. Where
/// the trace models the job it replaces them and sets the reserve; over every validation
/// row the two device levels are within 1.4 % where the trace is lower (its replay mostly
/// raises the reserve). Microseconds for every job: the recipe search rules a configuration
/// out on it before paying for the trace ([`add_replayed_steps`]).
///
/// # Errors
/// The job is invalid for the model ([`Job::validate`]).
pub fn estimate_without_replay(
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
) -> Result<Estimate, JobError> {
    let (built, job) = crate::stack::with_job(model, job);
    let (model, job) = (built.as_ref(), job.as_ref());
    job.validate(model)?;
    let with_images = vision::with_image_tokens(model, job);
    let job: &Job = &with_images;
    let prompted = with_prompt_tokens(job);
    let job: &Job = &prompted;
    let regime = Regime::resolve(model, job);
    if job.stack.profile().runtime == crate::stack::Runtime::Mlx {
        return Ok(finish_mlx(
            model,
            &regime,
            mlx::training_phases(model, job, &regime),
        ));
    }
    let par = parallel::Sharded::new(model, job, &regime);
    let step = if job.method == Method::Inference {
        StepPhases {
            phases: inference::phases(model, job, &regime, device, &par),
            held_recomputed_inputs: 0,
            largest_freed_block: 0,
            step_segments: 0,
            backward_end_at_root: false,
        }
    } else {
        training_phases(model, job, &regime, device, &par)
    };
    Ok(finish(model, job, &regime, device, &par, step))
}

/// Adds a vision tower's share ([`vision::step`]) to a training step's phases: its forward
/// before the language model's, its saved tensors through the language model's forward and
/// backward, and its own backward after them, with every gradient alive.
///
/// `tower_grads`: the trained tower's and projector's gradients, made by the tower's own
/// backward after the language model's: not yet there at the end of the language model's
/// backward (the tied embedding's out-of-place sum, the oracle's peak op for Qwen3-VL's full
/// fine-tune).
fn add_vision(phases: &mut Vec<PhaseBytes>, v: &vision::VisionStep, cublas: u64, tower_grads: u64) {
    if *v == vision::VisionStep::default() {
        return;
    }
    if tower_grads > 0 {
        let before = phases
            .iter()
            .find(|p| p.phase == Phase::ForwardEnd)
            .map_or(0, |p| p.component(Component::Gradients));
        for p in phases.iter_mut().filter(|p| p.phase == Phase::BackwardEnd) {
            if let Some(g) = p
                .components
                .iter_mut()
                .find(|(c, _)| *c == Component::Gradients)
            {
                g.1 = g.1.saturating_sub(tower_grads).max(before);
            }
        }
    }
    let resident = |p: &PhaseBytes| -> Vec<(Component, u64)> {
        p.components
            .iter()
            .filter(|(c, _)| {
                matches!(
                    c,
                    Component::Weights | Component::Adapters | Component::OptimizerStates
                )
            })
            .copied()
            .collect()
    };
    for p in phases.iter_mut() {
        let saved = match p.phase {
            Phase::ForwardEnd | Phase::LossBackward | Phase::LayerBackward | Phase::BackwardEnd => {
                v.saved + v.pixels
            }
            _ => 0,
        };
        if saved > 0
            && let Some(a) = p
                .components
                .iter_mut()
                .find(|(c, _)| *c == Component::Activations)
        {
            a.1 += saved;
        }
    }
    let Some(forward) = phases.iter().find(|p| p.phase == Phase::ForwardEnd) else {
        return;
    };
    let grads_in_fwd = forward.component(Component::Gradients);
    let mut tower_forward = resident(forward);
    tower_forward.extend([
        (Component::Gradients, grads_in_fwd),
        (Component::Activations, v.pixels),
        (Component::Transients, cublas + v.forward_transient),
    ]);
    let backward = phases
        .iter()
        .find(|p| p.phase == Phase::OptimizerStep)
        .map(|step| {
            let mut c = resident(step);
            // A trained tower's backward frees its saved tensors block by block as it makes
            // their gradients: its widest moment is its start (every saved tensor, none of
            // its gradients) or its end (every gradient, nothing saved).
            let grads = step.component(Component::Gradients);
            let (grads, saved) = if tower_grads > 0 && v.saved > tower_grads {
                (grads.saturating_sub(tower_grads), v.saved)
            } else if tower_grads > 0 {
                (grads, 0)
            } else {
                (grads, v.saved)
            };
            c.extend([
                (Component::Gradients, grads),
                (Component::Activations, v.pixels + saved + v.one_layer),
                (Component::Transients, cublas + v.backward_transient),
            ]);
            c
        });
    phases.insert(
        1,
        PhaseBytes {
            phase: Phase::VisionForward,
            components: tower_forward,
        },
    );
    if let Some(components) = backward.filter(|_| v.saved > 0) {
        let at = phases
            .iter()
            .position(|p| p.phase == Phase::OptimizerStep)
            .unwrap_or(phases.len());
        phases.insert(
            at,
            PhaseBytes {
                phase: Phase::VisionBackward,
                components,
            },
        );
    }
}

/// A step's phases, and what its allocations leave to the caching allocator.
struct StepPhases {
    phases: Vec<PhaseBytes>,
    /// Bytes FSDP1's hooks hold at the end of backward ([`parallel::fsdp1_holds_recomputed_inputs`]).
    held_recomputed_inputs: u64,
    /// [`largest_freed_block`].
    largest_freed_block: u64,
    /// [`step_segments`].
    step_segments: u64,
    /// The end of backward is FSDP's root unit's backward (its layers resharded), not the
    /// first layer's ([`streams::Streams::at`]).
    backward_end_at_root: bool,
}

/// Builds the phase list of a training step, the largest buffer the step frees
/// ([`largest_freed_block`]) and the new segments its optimizer step needs
/// ([`step_segments`]).
fn training_phases(
    model: &ModelSpec,
    job: &Job,
    regime: &Regime,
    device: &DeviceProfile,
    par: &parallel::Sharded,
) -> StepPhases {
    let w = par.weights;
    let adapters = par.adapters;
    let grads = par.grads;
    let states = par.states_on_gpu;
    // With gradient accumulation > 1, the gradients of earlier micro-batches stay alive
    // through the next forward and backward (the Trainer zeroes them only after the
    // optimizer step; with GA = 1 `zero_grad(set_to_none=True)` frees them first). Before
    // torch 2.0, `zero_grad()` zeroed them in place instead: alive all the time.
    let grads_in_fwd = if job.grad_accum > 1 || job.versions.zero_grad_keeps_grads() {
        grads
    } else {
        0
    };

    let acts = activations::Activations::new(model, job, regime, par.tp);
    let head = loss::Loss::new(model, job, regime, par.tp);
    // cuBLAS keeps one workspace per (handle, stream); the autograd engine runs CUDA
    // backward on its own thread, so forward and backward each own one.
    // [DERIVED, memory-anatomy §7]
    let cublas = 2 * device.cublas_workspace_bytes;
    let dequant = weights::dequant_transient(model, job, regime);
    // DoRA's weight-norm transient (BOFT's rotation) exists in each adapted module's
    // forward, before the logits, and again in the recompute under checkpointing.
    let module_forward =
        dora::forward_transient(model, job, regime) + boft::forward_transient(model, job, regime);
    let module_recompute = if job.gradient_checkpointing {
        module_forward
    } else {
        0
    };
    let comm = par.comm_buffers;
    // DeepSpeed ZeRO-1/2's gradient buckets exist from `backward()` to its end only.
    let comm_bwd = comm + par.backward_buffers;
    let unit = par.gathered_params;
    let unit_at_loss = par.gathered_at_loss;

    let base = |extra: Vec<(Component, u64)>| {
        let mut c = vec![
            (Component::Weights, w),
            (Component::Adapters, adapters),
            (Component::OptimizerStates, states),
        ];
        c.extend(extra);
        c
    };

    let mut phases = Vec::new();
    phases.push(PhaseBytes {
        phase: Phase::Load,
        components: base(vec![]),
    });

    // Sequential layer placement (pipeline) splits the layers and their activations.
    let all_layers = acts.all_layers() / job.parallel.pipeline.max(1);
    // End of forward: activations + the forward loss buffers.
    phases.push(PhaseBytes {
        phase: Phase::ForwardEnd,
        components: base(vec![
            (Component::Gradients, grads_in_fwd),
            (
                Component::Activations,
                all_layers
                    + acts.head
                    + acts.autocast_weight_cache
                    + acts.previous_step_quantized_inputs / job.parallel.pipeline.max(1),
            ),
            (Component::LogitsLoss, head.forward_peak),
            (
                Component::Transients,
                cublas
                    + dequant
                        .max(head.forward_transient)
                        .max(module_forward.saturating_sub(head.forward_peak))
                    + comm
                    + unit_at_loss,
            ),
        ]),
    });
    // Backward of the loss: all activations still alive, the loss's backward buffers.
    let saved_at_loss = all_layers + acts.head + acts.autocast_weight_cache;
    let loss_backward = base(vec![
        (Component::Gradients, grads_in_fwd),
        (Component::Activations, saved_at_loss),
        (Component::LogitsLoss, head.backward_peak),
        (
            Component::Transients,
            // A quantized lm_head is dequantized again for its backward.
            cublas
                + head.backward_transient
                + head.output_tangents
                + if regime.quantize_lm_head { dequant } else { 0 }
                + comm_bwd
                + unit_at_loss,
        ),
    ]);
    // A chunked output's first projection backward, after every chunk's loss backward
    // ([`loss::Loss::held_at_head_backward`]): a trainable lm_head's gradient, and the next
    // chunk's gradient of the same weight before the engine adds it in (two V·h), next to
    // the chunks' logit gradients and the hidden state's gradient.
    let head_backward = base(vec![
        (Component::Gradients, grads_in_fwd.max(par.head_grads)),
        (Component::Activations, saved_at_loss),
        (Component::LogitsLoss, head.held_at_head_backward),
        (
            Component::Transients,
            cublas
                + par.head_grads
                + job.micro_batch_size * job.seq_len * model.hidden_size * regime.stream_bytes
                + comm_bwd
                + unit_at_loss,
        ),
    ]);
    let sum = |v: &[(Component, u64)]| v.iter().map(|(_, b)| b).sum::<u64>();
    phases.push(PhaseBytes {
        phase: Phase::LossBackward,
        components: if head.held_at_head_backward > 0 && sum(&head_backward) > sum(&loss_backward) {
            head_backward
        } else {
            loss_backward
        },
    });
    // A tied embedding receives two gradients (lm_head's, already in `.grad`, and the
    // lookup's dense `embedding_dense_backward` output); autograd sums them out of place, so
    // the incoming V·h gradient and the V·h sum coexist with `.grad` (the oracle peaks at
    // `step2.backward:add.Tensor` for tied models).
    // A fused linear cross-entropy instead hands back lm_head's gradient as the plain
    // buffer it filled in forward (liger-kernel 0.8.5 `fused_linear_cross_entropy_forward`:
    // `grad_weight`), a dense tensor the engine's input buffer owns alone, so the lookup's
    // gradient is added into it in place (`torch/csrc/autograd/input_buffer.cpp`
    // `can_accumulate_inplace`): only the incoming V·h exists. The H200 rows agree at both
    // ends (validation/h200/settings.jsonl, tied Llama-3.2-1B: with Liger one copy fits
    // 9.77 GiB; eager, one copy would come in 1.4–1.9 % under). The oracle's fake tensors are
    // a tensor subclass, which that check always sends out of place.
    let tied_copies = if job.loss_impl() == LossImpl::Fused {
        1
    } else {
        2
    };
    let tied_add = if job.method == Method::Full && model.tie_word_embeddings {
        tied_copies * model.embedding_params() * regime::grad_bytes(job, regime) / par.tp.max(1)
            + head.held_for_tied_grad
    } else {
        0
    };
    // An encoder-decoder's tied `shared` weight gets the decoder embedding's gradient
    // between the two stacks' backward, while the encoder's activations are all alive: the
    // sum with lm_head's gradient is that moment's transient (traced, T5 v1.0 full
    // fine-tunes: the peak is that `add`).
    let between_stacks = if model.seq2seq.is_some() { tied_add } else { 0 };
    // Backward through the last layer: under checkpointing its activations are recomputed
    // (the checkpoints of every layer plus one full layer); the layer's backward transients.
    // lm_head's gradient (full FT) already exists.
    let layer_acts = if job.gradient_checkpointing {
        all_layers + acts.one_layer
    } else {
        all_layers
    };
    phases.push(PhaseBytes {
        phase: Phase::LayerBackward,
        components: base(vec![
            (Component::Gradients, grads_in_fwd.max(par.head_grads)),
            (
                Component::Activations,
                layer_acts + acts.autocast_weight_cache_backward,
            ),
            (Component::LogitsLoss, head.after_backward),
            (
                Component::Transients,
                cublas
                    + acts.layer_backward_transient.max(between_stacks)
                    + head.output_tangents
                    + dequant.max(module_recompute)
                    + comm_bwd
                    + par.unit_grad_assembly
                    + unit,
            ),
        ]),
    });
    // End of backward: all gradients exist while the first layer's saved activations
    // (recomputed under checkpointing) and its backward transients are still alive.
    let first_layer = acts.one_layer;
    // autocast's weight copies are saved by each layer's matmuls and released as backward
    // passes them: none are left at the end.
    // FSDP1's hooks keep every finished layer's checkpoint and its input gradient (one
    // checkpoint's size each) until backward ends ([`parallel::fsdp1_holds_recomputed_inputs`]).
    let held_inputs = if par.holds_recomputed_inputs {
        (model.num_layers / job.parallel.pipeline.max(1)).saturating_sub(1) * acts.checkpoint_one
    } else {
        0
    };
    let first_layer_moment = |grads: u64, tied: u64| {
        vec![
            (Component::Gradients, grads),
            (
                Component::Activations,
                first_layer + acts.checkpoint_one + held_inputs,
            ),
            (
                Component::Transients,
                cublas
                    + held_inputs
                    + acts.layer_backward_transient.max(tied)
                    + dequant.max(module_recompute)
                    + comm_bwd
                    + par.unit_grad_assembly
                    + unit,
            ),
        ]
    };
    let (end, backward_end_at_root) = if par.root_grads > 0 {
        // FSDP, full fine-tuning: the root unit's sharded gradient exists only after its
        // reduce-scatter, which follows its assembly; until then lm_head's gradient waits
        // unsharded (`head_grads`). The first layer's backward, then the root's: the layers
        // are resharded and their activations freed, the root still gathered; a tied
        // embedding's two gradients, their sum and the waiting lm_head piece coexist
        // (`add.Tensor` at the peak of the rank traces), then the root's flat gradient is
        // concatenated.
        let layer_grads = grads.saturating_sub(par.root_grads);
        let in_layer = first_layer_moment(layer_grads + par.head_grads, 0);
        // The tied sum is of two 16-bit V·h gradients, each one lm_head piece.
        let tied_root = if model.tie_word_embeddings {
            2 * par.head_grads
        } else {
            0
        };
        let in_root = vec![
            (Component::Gradients, layer_grads + par.head_grads),
            (
                Component::Transients,
                cublas
                    + par.gathered_root
                    + par
                        .root_grad_assembly
                        .saturating_sub(par.head_grads)
                        .max(tied_root),
            ),
        ];
        let sum = |v: &[(Component, u64)]| v.iter().map(|(_, b)| b).sum::<u64>();
        if sum(&in_root) > sum(&in_layer) {
            (in_root, true)
        } else {
            (in_layer, false)
        }
    } else {
        // An untied embedding's gradient comes after the first layer's backward
        // (`embedding_dense_backward`, the oracle's peak op for full fine-tunes): while that
        // layer's activations are alive it does not exist yet, and once it is computed they
        // are gone.
        let embedding_grad = if job.method == Method::Full
            && !model.tie_word_embeddings
            && model.encoder.is_none()
            && job.parallel.sharding == Sharding::None
            && !job.optimizer_in_backward
        {
            (model.embedding_params() * regime::grad_bytes(job, regime) / par.tp.max(1)).min(grads)
        } else {
            0
        };
        let in_layer =
            first_layer_moment(grads - embedding_grad, tied_add.max(par.root_grad_assembly));
        let at_embedding = vec![
            (Component::Gradients, grads),
            (Component::Transients, cublas + comm_bwd),
        ];
        let sum = |v: &[(Component, u64)]| v.iter().map(|(_, b)| b).sum::<u64>();
        let end = if embedding_grad > 0 && sum(&at_embedding) > sum(&in_layer) {
            at_embedding
        } else {
            in_layer
        };
        (end, false)
    };
    phases.push(PhaseBytes {
        phase: Phase::BackwardEnd,
        components: base(end),
    });
    // Optimizer step.
    phases.push(PhaseBytes {
        phase: Phase::OptimizerStep,
        components: base(vec![
            (Component::Gradients, grads),
            (
                Component::Transients,
                cublas / 2 + par.step_transient + par.step_comm,
            ),
        ]),
    });
    // The vision tower's forward, saved tensors and backward (`job`'s images and batch are
    // the tower's whatever the language model's sequence became).
    let tower_grads = match &model.vision {
        Some(v)
            if job.method == Method::Full
                && job.vision == crate::job::VisionTraining::Trained
                && job.parallel.sharding == Sharding::None =>
        {
            (v.params() - v.idle_params) * regime::grad_bytes(job, regime) / par.tp.max(1)
        }
        _ => 0,
    };
    add_vision(
        &mut phases,
        &vision::step(model, job, regime),
        cublas,
        tower_grads,
    );
    StepPhases {
        backward_end_at_root,
        held_recomputed_inputs: 2 * held_inputs,
        step_segments: step_segments(model, job, regime, par, &phases, head.largest_block),
        largest_freed_block: largest_freed_block(model, job, regime, &head, par.tp),
        phases,
    }
}

/// The allocated level of a peak phase (with the device's learned offset) and the caching
/// allocator's reserve on top of it.
///
/// Resident allocations (weights, adapters, states, gradients, KV cache) are made once and sit
/// in their own segments, rounded to 2 MiB (`kRoundLarge`, CUDACachingAllocator.cpp); the
/// churning rest (activations, loss buffers, transients) fragments the cache by
/// `reserve_ratio` of its size, and never by less than `largest_freed_block`: PyTorch's
/// caching allocator serves a request from the smallest cached block that fits
/// (`get_free_block`: `pool.blocks.lower_bound`) and splits it (`should_split`: a large-pool
/// remainder over 1 MiB), and never merges blocks of different `cudaMalloc` segments. The
/// freed block of the step's largest buffer is the one the next step's smaller requests
/// split once nothing smaller fits, so that buffer's next request finds no whole block and
/// `cudaMalloc`s a new segment of its size. Measured on an H200 (`validation/h200/`, 22
/// checkpointed LoRA and QLoRA runs, fp32 logits blocks of 0.24 to 3.9 GiB): reserved −
/// allocated was 0.6 to 3.8 × the block, median 1.27 (the blocks over 0.9 GiB: 0.6 to 1.5),
/// where `reserve_ratio` alone gave about a quarter of it. Full fine-tunes fragment more
/// (up to 8.4 GiB on the H200) in ways no ratio captures; replaying the step's allocation
/// sequence through a model of the allocator (`calibration/allocsim.py`) reproduces them.
/// The reserved level is never under `load_reserved`, what the model's load left in the
/// cache, and the reserve never under `replayed`, the fragmentation of the step's
/// allocation sequence where [`replay`] generates it; where that sequence follows the
/// layers op by op (`op_by_op`), it alone is the reserve: replayed through the allocator
/// model it is the fake-CUDA oracle's within 0.1 % (`tests/step_trace.rs`).
#[must_use]
pub fn allocated_and_reserve(
    peak: &PhaseBytes,
    device: &DeviceProfile,
    largest_freed_block: u64,
    load_reserved: u64,
    (replayed, op_by_op): (u64, bool),
) -> (u64, u64) {
    let offset = device.offset_bytes;
    let raw = peak.total();
    let allocated = if offset >= 0 {
        raw.saturating_add(offset.unsigned_abs())
    } else {
        raw.saturating_sub(offset.unsigned_abs())
    };
    let resident: u64 = peak
        .components
        .iter()
        .filter(|c| c.0.is_resident())
        .map(|c| c.1)
        .sum();
    let churn = allocated.saturating_sub(resident);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let frag = if op_by_op {
        replayed
    } else {
        ((churn as f64 * device.reserve_ratio.max(0.0)) as u64)
            .max(largest_freed_block)
            .max(replayed)
    };
    // The cache never shrinks below what the load left in it ([`load`]).
    let reserve = round_up(allocated.saturating_add(frag), 2 * MIB).max(load_reserved) - allocated;
    (allocated, reserve)
}

/// The forward and backward's churn: what is not resident ([`Component::is_resident`]) in
/// the largest phase before the optimizer step.
fn fwd_bwd_churn(phases: &[PhaseBytes]) -> u64 {
    phases
        .iter()
        .filter(|p| p.phase != Phase::OptimizerStep)
        .map(|p| {
            p.components
                .iter()
                .filter(|c| !c.0.is_resident())
                .map(|c| c.1)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// The forward and backward's churn at their peak, as blocks the allocator sees: the
/// largest freed buffer (the loss's logits, [`largest_freed_block`]) as many times as the
/// churn holds it, the rest as hidden states (`b · s · h`, 16-bit), the size of the
/// layers' saved inputs and most activations. Churn is what is not resident
/// ([`Component::is_resident`]) in the largest phase before the optimizer step.
fn churn_blocks(phases: &[PhaseBytes], largest: u64, unit: u64) -> Vec<u64> {
    let churn = fwd_bwd_churn(phases);
    // At most 1,024 blocks of each kind: a replay's cost stays bounded, and smaller blocks
    // fit in the same holes.
    let unit = unit.max(churn.div_ceil(1024)).max(1);
    let mut out = Vec::new();
    let mut rest = churn;
    if largest > unit {
        out.extend(std::iter::repeat_n(largest, (churn / largest) as usize));
        rest = churn % largest;
    }
    while rest > 0 {
        out.push(rest.min(unit));
        rest -= rest.min(unit);
    }
    out
}

/// Picks the peak phase and adds the reserved and device levels.
fn finish(
    model: &ModelSpec,
    job: &Job,
    regime: &Regime,
    device: &DeviceProfile,
    par: &parallel::Sharded,
    step: StepPhases,
) -> Estimate {
    let StepPhases {
        phases,
        held_recomputed_inputs,
        largest_freed_block,
        step_segments,
        backward_end_at_root,
    } = step;
    // What FSDP's own streams keep cached at each phase ([`streams`]).
    let fsdp_streams = streams::Streams::of(par);
    let side_at = |phase| fsdp_streams.map(|s| s.at(par, job, phase, backward_end_at_root));
    let stream_cached = phases
        .iter()
        .filter_map(|p| {
            let cached = side_at(p.phase)?.cached();
            (cached > 0).then_some((p.phase, cached))
        })
        .collect();
    let side_at_peak = side_at(largest_phase(&phases).phase);
    let churn = if load::replays_steps(job) {
        let hidden_state = job.micro_batch_size * job.seq_len * model.hidden_size * 2
            / job.parallel.tensor_parallel.max(1);
        churn_blocks(&phases, largest_freed_block, hidden_state)
    } else {
        Vec::new()
    };
    let mut outside = par.paged_states;
    // torch.distributed's NCCL communicators and buffers: with several GPUs, and with
    // DeepSpeed or FSDP even on one (they initialise the process group and run their
    // collectives regardless of the world size).
    let distributed =
        job.parallel.gpus() > 1 || job.parallel.sharding != crate::job::Sharding::None;
    if distributed && job.method != Method::Inference {
        outside += device.nccl_bytes;
    } else if distributed {
        outside += device.nccl_bytes / 2;
    }
    let mut est = Estimate {
        peak_allocated_bytes: 0,
        peak_reserved_bytes: 0,
        peak_device_bytes: 0,
        peak_phase: Phase::Load,
        components: vec![],
        phases,
        host_bytes: par.host_bytes + activations::offloaded_checkpoints(model, job, regime),
        total_params: model.total_params(),
        trainable_params: regime.trainable_params,
        regime: regime.clone(),
        largest_freed_block,
        load_reserved_bytes: load::load_reserved_bytes(model, job, regime, &churn),
        replayed_fragmentation_bytes: 0,
        reserve_from_replay: false,
        idle_cache_bytes: 0,
        step_segments_bytes: step_segments,
        stream_cached,
        rank: rank::parts(
            model,
            job,
            regime,
            par,
            held_recomputed_inputs,
            side_at_peak,
        ),
    };
    set_levels(&mut est, device, outside, device.cuda_context_bytes);
    est
}

/// The phase with the most allocated bytes (an empty load phase when there are none).
fn largest_phase(phases: &[PhaseBytes]) -> PhaseBytes {
    phases
        .iter()
        .max_by_key(|p| p.total())
        .cloned()
        .unwrap_or(PhaseBytes {
            phase: Phase::Load,
            components: vec![],
        })
}

/// An MLX step's estimate: the peak of its phases is what `mx.get_peak_memory()` reports
/// (live buffers; MLX's cache of freed buffers is not counted, and `mlx_lm` empties it after
/// every step), and there is no allocator reserve, context or memory outside MLX's
/// allocator to add.
fn finish_mlx(model: &ModelSpec, regime: &Regime, phases: Vec<PhaseBytes>) -> Estimate {
    let peak = largest_phase(&phases);
    let total = peak.total();
    let mut components = peak.components;
    components.retain(|c| c.1 > 0);
    Estimate {
        peak_allocated_bytes: total,
        peak_reserved_bytes: total,
        peak_device_bytes: total,
        peak_phase: peak.phase,
        components,
        phases,
        host_bytes: 0,
        total_params: model.total_params(),
        trainable_params: regime.trainable_params,
        regime: regime.clone(),
        largest_freed_block: 0,
        load_reserved_bytes: 0,
        replayed_fragmentation_bytes: 0,
        reserve_from_replay: false,
        idle_cache_bytes: 0,
        step_segments_bytes: 0,
        stream_cached: Vec::new(),
        rank: None,
    }
}

/// Sets the estimate's peak phase (the largest of its phases), its three levels and the
/// components at the peak, with `outside` bytes outside PyTorch's allocator and the CUDA
/// context: what `estimate` and a re-leveling after changing phase bytes
/// ([`stored::with_stored_weights`]) share.
pub(crate) fn set_levels(est: &mut Estimate, device: &DeviceProfile, outside: u64, context: u64) {
    let peak = largest_phase(&est.phases);
    let levels = |p: &PhaseBytes| {
        allocated_and_reserve(
            p,
            device,
            est.largest_freed_block,
            est.load_reserved_bytes,
            (est.replayed_fragmentation_bytes, est.reserve_from_replay),
        )
    };
    let (allocated, reserve) = levels(&peak);
    let mut reserved = allocated + reserve;
    if est.step_segments_bytes > 0 {
        // The step's temporaries that found no cached block sit in new segments on top of
        // what the forward and backward reserved.
        if let Some(fwd_bwd) = est
            .phases
            .iter()
            .filter(|p| p.phase != Phase::OptimizerStep)
            .max_by_key(|p| p.total())
        {
            let (a, r) = levels(fwd_bwd);
            reserved = reserved.max(a + r + est.step_segments_bytes);
        }
    }
    // FSDP's streams hold blocks the compute stream cannot use: at each phase, on top of
    // what the phase reserves.
    for p in &est.phases {
        let Some(&(_, cached)) = est.stream_cached.iter().find(|c| c.0 == p.phase) else {
            continue;
        };
        let (a, r) = levels(p);
        reserved = reserved.max(a + r + cached);
    }
    let reserve = reserved - allocated;
    let mut components = peak.components;
    components.retain(|c| c.1 > 0);
    components.push((Component::AllocatorReserve, reserve));
    if outside > 0 {
        components.push((Component::OutsideAllocator, outside));
    }
    components.push((Component::CudaContext, context));
    est.peak_allocated_bytes = allocated;
    est.peak_reserved_bytes = reserved;
    est.peak_device_bytes = reserved.saturating_add(outside).saturating_add(context);
    est.peak_phase = peak.phase;
    est.components = components;
}

/// Bytes of new `cudaMalloc` segments the optimizer step's temporaries
/// ([`optimizer::step_temporaries`]) need on one GPU without sharding.
///
/// At the step the cache holds what the forward and backward freed: the loss's largest
/// buffer ([`loss::Loss::largest_block`]); in a full fine-tune with gradient accumulation,
/// the last micro-batch's fresh gradient of the widest parameter (`AccumulateGrad` adds it
/// into `.grad` in place and drops it); and the activations, blocks of at most one
/// micro-batch's MLP-wide tensor. PyTorch serves each request from the smallest cached block
/// that fits and splits it (`get_free_block`, `should_split`, CUDACachingAllocator.cpp); a
/// request no cached block holds `cudaMalloc`s a new segment of its size rounded to 2 MiB
/// (`kRoundLarge`). Adafactor's fp32 copies of the embedding (2 × `V·h·4` B) are larger
/// than any activation: one lands in the fresh gradient's block, the other in a new
/// segment. 0 where [`replay`] models the step (it replays the temporaries itself), and
/// under sharding, tensor parallelism or an optimizer run in backward.
fn step_segments(
    model: &ModelSpec,
    job: &Job,
    regime: &Regime,
    par: &parallel::Sharded,
    phases: &[PhaseBytes],
    loss_block: u64,
) -> u64 {
    if job.method == Method::Inference
        || job.parallel.sharding != Sharding::None
        || par.tp > 1
        || job.optimizer_in_backward
        || replay::models(model, job, regime)
        || trace::step::op_by_op(model, job, regime)
    {
        return 0;
    }
    let temps = optimizer::step_temporaries(model, job, regime);
    if temps.is_empty() {
        return 0;
    }
    let mut free = vec![loss_block];
    if job.method == Method::Full && job.grad_accum > 1 {
        free.push(widest_gradient(model, job, regime, 1));
    }
    let churn = fwd_bwd_churn(phases).saturating_sub(free.iter().sum());
    // The widest activation: an MLP-wide tensor (16-bit under autocast) or the residual
    // stream's hidden state.
    let mlp_bytes = if regime.autocast {
        2
    } else {
        regime.stream_bytes
    };
    let activation = job.micro_batch_size
        * job.seq_len
        * (model.intermediate_size * mlp_bytes).max(model.hidden_size * regime.stream_bytes);
    new_segments(&temps, free, activation, churn)
}

/// Bytes of new segments for `temps` ((how many, bytes of each), alive together) given the
/// cached blocks `free` and `churn` bytes of cached blocks of at most `small` bytes each:
/// best fit, largest request first, a block's remainder over 1 MiB kept
/// ([`step_segments`]).
fn new_segments(temps: &[(u64, u64)], mut free: Vec<u64>, small: u64, mut churn: u64) -> u64 {
    let mut sizes = temps.to_vec();
    sizes.sort_by_key(|t| std::cmp::Reverse(t.1));
    let mut new = 0u64;
    for (n, b) in sizes {
        if b == 0 || n == 0 {
            continue;
        }
        if b <= small {
            let need = n.saturating_mul(b);
            let fits = need.min(churn);
            churn -= fits;
            new = new.saturating_add(round_up(need - fits, 2 * MIB));
            continue;
        }
        let mut left = n;
        while left > 0 {
            let best = free
                .iter()
                .enumerate()
                .filter(|&(_, &f)| f >= b)
                .min_by_key(|&(_, &f)| f)
                .map(|(i, _)| i);
            let Some(i) = best else {
                new = new.saturating_add(left.saturating_mul(round_up(b, 2 * MIB)));
                break;
            };
            let rest = free[i] - b;
            if rest > MIB {
                free[i] = rest;
            } else {
                free.swap_remove(i);
            }
            left -= 1;
        }
    }
    new
}

/// The gradient of a full fine-tune's widest parameter (the embedding or lm_head, `V·h`, or
/// an MLP matrix when wider) per tensor-parallel rank.
fn widest_gradient(model: &ModelSpec, job: &Job, regime: &Regime, tp: u64) -> u64 {
    let widest = model.vocab_size.max(model.intermediate_size);
    widest * model.hidden_size / tp.max(1) * regime::grad_bytes(job, regime)
}

/// The largest buffer a training step allocates and frees: the loss's (see
/// [`loss::Loss::largest_block`]) or, in a full fine-tune without sharded gradients, the
/// largest parameter's gradient (the embedding or lm_head, `V·h`), which
/// `zero_grad(set_to_none=True)` frees after every optimizer step (before torch 2.0 it
/// zeroed them in place: never freed). With gradient accumulation the gradient is freed
/// in every micro-batch regardless: autograd's `AccumulateGrad` adds a later micro-batch's
/// fresh gradient into `.grad` in place (`variable.grad += new_grad`,
/// `torch/csrc/autograd/functions/accumulate_grad.h`) and drops it.
fn largest_freed_block(
    model: &ModelSpec,
    job: &Job,
    regime: &Regime,
    head: &loss::Loss,
    tp: u64,
) -> u64 {
    let grad = if job.method == Method::Full
        && job.parallel.sharding == crate::job::Sharding::None
        && !job.optimizer_in_backward
        && (job.grad_accum > 1 || !job.versions.zero_grad_keeps_grads())
    {
        widest_gradient(model, job, regime, tp)
    } else {
        0
    };
    head.largest_block.max(grad)
}
