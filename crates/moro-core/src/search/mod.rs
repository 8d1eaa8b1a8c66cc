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

pub mod alternatives;
mod judge;
mod layout;
mod margin;
mod ordered;
mod rank;
mod space;

pub use judge::*;
pub use layout::*;
pub use margin::*;
pub use rank::*;
pub use space::*;

use serde::Serialize;

use crate::estimate::Estimate;
use crate::job::{Job, Method, Optimizer, Precision, Quantization};
use crate::model::ModelSpec;

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

/// Searches `space` for the best configuration of `model` that fits `caps`.
///
/// For each sequence length (longest first), the rests of configuration are visited in the
/// order of their best possible key (the key at their largest micro batch, which no fitting
/// micro batch exceeds); the visit stops once [`RUNNERS_UP`] + 1 distinct recipes are held and
/// no rest left can outrank the last of them. When nothing fits every rest is estimated, so
/// the closest configuration is the smallest of the whole space as judged without the step
/// trace (within 3 % of the smallest estimated in full, `tests/search.rs`). Configurations
/// are judged without keeping their estimates; the ones reported are estimated again in
/// full, from the step traces their probes replayed (a cache of this search's own).
#[must_use]
pub fn search(model: &ModelSpec, space: &Space, caps: &Caps) -> Outcome {
    search_cached(model, space, caps, Some(&EstimateCache::default()))
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
    search_recipes(model, space, caps, cache, RUNNERS_UP + 1)
}

/// [`search_cached`] for the best configuration alone (no runners-up): the visit stops once
/// no rest left can outrank it, and only it is estimated in full. The same best as
/// [`search`]'s.
#[must_use]
pub fn search_best(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    cache: Option<&EstimateCache>,
) -> Option<Candidate> {
    search_recipes(model, space, caps, cache, 1).best
}

/// The search, holding at most `recipes` distinct recipes (the best and its runners-up).
fn search_recipes(
    model: &ModelSpec,
    space: &Space,
    caps: &Caps,
    cache: Option<&EstimateCache>,
    recipes: usize,
) -> Outcome {
    let mut evaluated = 0usize;
    let mut closest: Option<Probe> = None;
    let objective = space.objective;
    // The best configuration of each distinct recipe, best first, at most `recipes`:
    // the same selection as sorting every fitting configuration and keeping the first of
    // each shape.
    let mut top: Vec<([u64; KEY_LEN], Config)> = Vec::new();
    for &seq_len in &space.seq_lens {
        let rests = space.rests(seq_len);
        // Each layout's largest micro batch: a handful of layouts for tens of thousands of
        // rests.
        let mut largest: Vec<(Layout, u64)> = Vec::new();
        let uppers: Vec<[u64; KEY_LEN]> = rests
            .iter()
            .map(|r| {
                let b = match largest.iter().find(|l| l.0 == r.layout) {
                    Some(l) => l.1,
                    None => {
                        let b = space.micro_batches(&r.layout).first().copied().unwrap_or(1);
                        largest.push((r.layout, b));
                        b
                    }
                };
                key(
                    objective,
                    &Config {
                        micro_batch: b,
                        ..*r
                    },
                )
            })
            .collect();
        // Best first; a stable sort of their indices keeps the enumeration's order among
        // equals and moves four bytes a rest, not the key and the configuration.
        let mut order: Vec<u32> = (0..u32::try_from(rests.len()).unwrap_or(u32::MAX)).collect();
        order.sort_by(|&a, &b| uppers[b as usize].cmp(&uppers[a as usize]));
        let visit = |i: usize| {
            let rest = rests[order[i] as usize];
            let mut v = Visit {
                best: None,
                evaluated: 0,
                closest: None,
            };
            v.best = largest_fitting_batch(space, rest, &mut |c| {
                v.evaluated += 1;
                let p = probe(model, space, caps, c, cache)?;
                keep_closest(&mut v.closest, p);
                Some(p)
            });
            v
        };
        // The rests are estimated ahead on `space.workers` threads and read in order, so the
        // outcome is the one visit would give.
        ordered::visit_in_order(order.len(), space.workers, visit, |turn| {
            let v = match turn {
                ordered::Turn::Next(i) => {
                    let upper = uppers[order[i] as usize];
                    return if top.len() >= recipes && top.last().is_some_and(|(k, _)| upper < *k) {
                        std::ops::ControlFlow::Break(())
                    } else {
                        std::ops::ControlFlow::Continue(())
                    };
                }
                ordered::Turn::Done(v) => v,
            };
            evaluated += v.evaluated;
            if let Some(p) = v.closest {
                keep_closest(&mut closest, p);
            }
            if let Some(c) = v.best {
                keep_top(&mut top, key(objective, &c), c, recipes);
            }
            std::ops::ControlFlow::Continue(())
        });
        // The sequence length is the first key of every objective.
        if !top.is_empty() {
            break;
        }
    }
    let mut it = top
        .into_iter()
        .filter_map(|(_, c)| evaluate_cached(model, space, caps, c, cache).ok());
    let best = it.next();
    let closest = match (&best, closest) {
        (None, Some(p)) => evaluate_cached(model, space, caps, p.config, cache).ok(),
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

/// One rest of configuration visited: its largest fitting configuration, the
/// configurations estimated and the closest to fitting among them.
struct Visit {
    best: Option<Config>,
    evaluated: usize,
    closest: Option<Probe>,
}

/// Keeps `p` as the closest to fitting if it is closer than the one held (the first of
/// equals stays).
fn keep_closest(closest: &mut Option<Probe>, p: Probe) {
    if closest
        .as_ref()
        .is_none_or(|x| (p.host_fits, p.headroom) > (x.host_fits, x.headroom))
    {
        *closest = Some(p);
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
/// `recipes` shapes).
fn keep_top(top: &mut Vec<([u64; KEY_LEN], Config)>, k: [u64; KEY_LEN], c: Config, recipes: usize) {
    let shape = Shape::of(&c);
    if let Some(i) = top.iter().position(|(_, x)| Shape::of(x) == shape) {
        if top[i].0 >= k {
            return;
        }
        top.remove(i);
    }
    let at = top.partition_point(|(x, _)| *x > k);
    top.insert(at, (k, c));
    top.truncate(recipes);
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
