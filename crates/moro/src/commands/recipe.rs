//! `moro recipe generate` and `moro recipe check`: the zero-OOM recipe, and the CI gate.
//!
//! The search is `moro_core::search` (pure); this module resolves the model and hardware,
//! turns the winner into a moro.yaml ([`build_recipe`]), writes it atomically, and, when
//! nothing fits, looks for what would: a smaller model of the same family, a GPU with more
//! memory, more GPUs ([`alternatives`]). [`load`] and [`LoadedRecipe::target`] are shared
//! with `moro estimate FILE`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::bound::JobClass;
use moro_core::catalog;
use moro_core::estimate::Estimate;
use moro_core::hardware::{Device, Hardware, HardwareSpec, Vendor, parse_hardware_spec};
use moro_core::job::{Job, JobSettings, Method, Stack};
use moro_core::model::ModelSpec;
use moro_core::search::{
    Candidate, Caps, Cluster, Layout, MethodChoice, Objective, Outcome, Request, Space,
    margin_rule, search,
};
use moro_recipe::{Components, HardwareSection, PredictionSection, Recipe, TrainingExtras};
use serde::Serialize;

use crate::error::{user, user_hint};
use crate::hw::Target;
use crate::jobargs::parse_stack;
use crate::output::{Table, gib, json, note, stdout};
use crate::resolve;

fn parse_method_choice(s: &str) -> Result<MethodChoice, String> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(MethodChoice::Auto),
        "full" => Ok(MethodChoice::Only(Method::Full)),
        "lora" => Ok(MethodChoice::Only(Method::Lora)),
        "qlora" => Ok(MethodChoice::Only(Method::Qlora)),
        _ => Err(format!(
            "unknown method `{s}`; use auto, full, lora or qlora"
        )),
    }
}

fn parse_objective(s: &str) -> Result<Objective, String> {
    match s.to_ascii_lowercase().as_str() {
        "quality" => Ok(Objective::Quality),
        "speed" => Ok(Objective::Speed),
        _ => Err(format!("unknown objective `{s}`; use quality or speed")),
    }
}

fn parse_positive(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1, got 0".to_owned()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("`{s}` is not a positive whole number")),
    }
}

/// Arguments of `moro recipe generate`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  moro recipe generate --model Qwen/Qwen2.5-1.5B --hardware detect \
    --output ./moro.yaml\n\nExit codes: 0 written, 1 nothing fits (the closest configuration \
    and what would fit are printed), 2 invalid input."
)]
pub(crate) struct GenerateArgs {
    /// Model: a Hugging Face id (`Qwen/Qwen2.5-7B`), a config.json or a model directory.
    #[arg(long, short)]
    pub(crate) model: String,
    /// Hardware: `detect`, a preset (`rtx-4090`, `apple-m3-max-64gb`), a GPU name, a size
    /// (`24GiB`), `N×preset` (one node; above 8, nodes of 8) or a cluster `NODES×GPUS×preset`
    /// (`2x8xh100-sxm`). With several GPUs the search also chooses how many to use and the
    /// strategy (DDP, ZeRO-1/2/3, FSDP, offload), preferring the least communication that
    /// fits.
    #[arg(long, default_value = "detect")]
    pub(crate) hardware: String,
    /// Write the recipe here (atomically); without it the YAML goes to stdout.
    #[arg(long, short)]
    pub(crate) output: Option<PathBuf>,
    /// Overwrite an existing --output file.
    #[arg(long)]
    pub(crate) force: bool,
    /// Method: auto (full, LoRA or QLoRA, whichever ranks best and fits), full, lora, qlora.
    #[arg(long, default_value = "auto", value_parser = parse_method_choice)]
    pub(crate) method: MethodChoice,
    /// Sequence length in tokens; without it (and without --dataset) the longest of 8192,
    /// 4096, 2048, 1024 that fits.
    #[arg(long, visible_alias = "max-seq-length", value_parser = parse_positive, conflicts_with = "dataset")]
    pub(crate) seq_len: Option<u64>,
    /// Size the sequence length from this dataset (.jsonl, .json, .csv), tokenized with the
    /// model's tokenizer and chat template: `max_seq_length` is its --percentile length.
    #[arg(long, value_name = "FILE")]
    pub(crate) dataset: Option<PathBuf>,
    /// The percentile of the dataset's lengths `max_seq_length` is set to.
    #[arg(long, default_value = "99", value_name = "P", requires = "dataset")]
    pub(crate) percentile: f64,
    #[command(flatten)]
    pub(crate) data: crate::commands::data::DatasetArgs,
    /// Sequences per optimizer step (micro batch × gradient accumulation) [default: 16].
    #[arg(long, value_parser = parse_positive)]
    pub(crate) effective_batch: Option<u64>,
    /// Training stack: hf, trl, litgpt, torchtune, unsloth, mlx [default: mlx on an Apple GPU,
    /// else hf].
    #[arg(long, value_parser = parse_stack)]
    pub(crate) stack: Option<Stack>,
    /// What to optimize, after the longest context that fits (when --seq-len is not given):
    /// quality (method > adapters > precision > GPU layout > rank > no checkpointing > batch >
    /// optimizer > attention) or speed (no offload > more GPUs > no checkpointing > less
    /// communication > batch > method > attention > optimizer).
    #[arg(long, default_value = "quality", value_parser = parse_objective)]
    pub(crate) objective: Objective,
    /// Host RAM available for CPU offload (`2TiB`): offloading configurations whose
    /// offloaded states need more are rejected. Without it the need is only reported.
    #[arg(long, value_parser = parse_host_memory)]
    pub(crate) host_memory: Option<u64>,
    /// Print one JSON object (sizes in bytes) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Arguments of `moro recipe check`.
#[derive(Debug, Args)]
#[command(
    after_help = "Exit codes: 0 fits (the upper bound is within the usable memory), 1 does not \
    fit or uncertain (the prediction fits, its bound does not), 2 invalid recipe or input \
    (usable as a CI gate)."
)]
pub(crate) struct CheckArgs {
    /// The recipe.
    pub(crate) file: PathBuf,
    /// Hardware to check against [default: the recipe's `hardware:` section].
    #[arg(long)]
    pub(crate) hardware: Option<String>,
    /// Print one JSON object (sizes in bytes) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A recipe read from a file.
#[derive(Debug, Clone)]
pub(crate) struct LoadedRecipe {
    /// The path as given.
    pub(crate) path: String,
    /// The file's text.
    pub(crate) text: String,
    /// The parsed recipe.
    pub(crate) recipe: Recipe,
    /// What it says of the job (for flags to layer over, then [`crate::setup::resolve`]).
    pub(crate) settings: JobSettings,
}

/// Reads and validates a recipe file; errors carry the path, line and column (exit 2).
pub(crate) fn load(path: &Path) -> Result<LoadedRecipe> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| user(format!("cannot read `{shown}`: {e}")))?;
    LoadedRecipe::from_bytes(shown, &bytes)
}

impl LoadedRecipe {
    /// Parses and validates the bytes of the recipe shown as `shown` in errors.
    pub(crate) fn from_bytes(shown: String, bytes: &[u8]) -> Result<Self> {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let recipe =
            moro_recipe::parse_bytes(bytes).map_err(|e| user(e.with_source(&shown).to_string()))?;
        let settings = recipe
            .settings()
            .map_err(|e| user(e.with_source(&shown).to_string()))?;
        let loaded = Self {
            path: shown,
            text,
            recipe,
            settings,
        };
        loaded
            .settings
            .check_adapters_used()
            .map_err(|e| loaded.job_error(&e))?;
        Ok(loaded)
    }

    /// A job error of this recipe at its line and column.
    pub(crate) fn job_error(&self, e: &moro_core::job::JobError) -> anyhow::Error {
        crate::error::job_at(
            e,
            moro_recipe::job_error(e, Some(&self.text))
                .with_source(&self.path)
                .to_string(),
        )
    }

    /// The hardware the recipe was made for, from its `hardware:` section: the preset (with
    /// the GPU count), else a generic GPU of `memory_bytes`. `None` without either.
    pub(crate) fn target(&self) -> Option<Target> {
        let h = self.recipe.hardware.as_ref()?;
        let count = h.count.max(1);
        if let Some(p) = h.preset.as_deref() {
            let spec = if count > 1 {
                format!("{count}x{p}")
            } else {
                p.to_owned()
            };
            if let Ok(HardwareSpec::Given(hardware)) = parse_hardware_spec(&spec) {
                return Some(Target {
                    hardware,
                    detected: false,
                    spec,
                });
            }
        }
        let bytes = h.memory_bytes?;
        let mut d = Device::generic(bytes);
        if let Some(n) = &h.name {
            d.name.clone_from(n);
        }
        let devices = vec![d; usize::try_from(count).unwrap_or(1)];
        Some(Target {
            hardware: Hardware { devices },
            detected: false,
            spec: format!("{bytes}B"),
        })
    }

    /// Usable memory per GPU the recipe was generated against (`prediction.memory_bytes`).
    pub(crate) fn usable_bytes(&self) -> Option<u64> {
        self.recipe.prediction.as_ref().and_then(|p| p.memory_bytes)
    }
}

/// Search capabilities of a target. Usable memory: the smallest GPU's total, or for
/// detected GPUs what is free on them now (other processes hold the rest). bf16 and
/// FlashAttention only when every GPU has them.
pub(crate) fn caps_of(target: &Target) -> Option<Caps> {
    let devices = &target.hardware.devices;
    let first = devices.first()?;
    let usable = devices
        .iter()
        .map(|d| {
            if target.detected {
                d.free_bytes.unwrap_or(d.total_bytes)
            } else {
                d.total_bytes
            }
        })
        .min()?;
    Some(Caps {
        usable_bytes: usable,
        bf16: devices.iter().all(|d| d.supports_bf16),
        flash_attention: devices.iter().all(|d| d.supports_flash_attention),
        profile: crate::setup::machine_profile(Some(first)).0,
        host_bytes: None,
        bitsandbytes: devices
            .iter()
            .all(|d| d.vendor != moro_core::hardware::Vendor::Apple),
        triton: devices
            .iter()
            .all(|d| d.vendor != moro_core::hardware::Vendor::Apple),
    })
}

/// Search capabilities of one catalog device, with this machine's calibration profile and
/// corrections for that GPU.
pub(crate) fn caps_of_device(d: &Device) -> Caps {
    Caps {
        profile: crate::setup::machine_profile(Some(d)).0,
        ..Caps::of_device(d)
    }
}

/// Parses `--host-memory` (`2TiB`, `1536GiB`).
pub(crate) fn parse_host_memory(s: &str) -> Result<u64, String> {
    moro_core::units::parse_size(s)
}

/// GPUs per node when a GPU count alone is given (`16xh100-sxm`): the common 8-GPU server.
pub(crate) const DEFAULT_GPUS_PER_NODE: u64 = 8;

/// A cluster spec `NODES×GPUS×rest` (`2x8xh100-sxm`): `(nodes, gpus per node, rest)`.
/// `None` for anything else (a preset, `8xh100-sxm`, a list).
pub(crate) fn parse_cluster_spec(spec: &str) -> Option<(u64, u64, &str)> {
    fn count(s: &str) -> Option<(u64, &str)> {
        let s = s.trim_start();
        let digits = s.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = s[..digits].parse().ok()?;
        let rest = s[digits..].trim_start();
        let rest = ['x', 'X', '×', '*']
            .iter()
            .find_map(|sep| rest.strip_prefix(*sep))?;
        (n > 0).then_some((n, rest))
    }
    if spec.contains(',') {
        return None;
    }
    let (nodes, rest) = count(spec)?;
    let (per, rest) = count(rest)?;
    let rest = rest.trim();
    (!rest.is_empty()).then_some((nodes, per, rest))
}

/// Resolves `--hardware`, accepting a cluster spec (`2x8xh100-sxm`, normalized to
/// `16xh100-sxm` for the hardware parser), and the cluster the search may spread over:
/// `None` for one GPU; `N×preset` is one node up to [`DEFAULT_GPUS_PER_NODE`] GPUs, and
/// nodes of that many above it when they divide `N`.
pub(crate) fn resolve_target(spec: &str) -> Result<(Target, Option<Cluster>)> {
    let (target, nodes) = match parse_cluster_spec(spec) {
        Some((nodes, per, rest)) => {
            let total = nodes
                .checked_mul(per)
                .filter(|t| *t <= u64::from(moro_core::hardware::MAX_GPU_COUNT))
                .ok_or_else(|| {
                    user(format!(
                        "--hardware `{spec}`: at most {} GPUs in all",
                        moro_core::hardware::MAX_GPU_COUNT
                    ))
                })?;
            let flat = format!("{total}x{rest}");
            let Some(t) = crate::hw::resolve(Some(&flat), None)? else {
                return Err(user("--hardware: empty value"));
            };
            (t, Some((nodes, per)))
        }
        None => {
            let Some(t) = crate::hw::resolve(Some(spec), None)? else {
                return Err(user("--hardware: empty value"));
            };
            (t, None)
        }
    };
    let n = target.hardware.devices.len() as u64;
    let cluster = match nodes {
        _ if n <= 1 => None,
        Some((nodes, per)) => Some(Cluster {
            nodes,
            gpus_per_node: per,
            exact: false,
            offload: true,
        }),
        None if n > DEFAULT_GPUS_PER_NODE && n.is_multiple_of(DEFAULT_GPUS_PER_NODE) => {
            Some(Cluster {
                nodes: n / DEFAULT_GPUS_PER_NODE,
                gpus_per_node: DEFAULT_GPUS_PER_NODE,
                exact: false,
                offload: true,
            })
        }
        None => Some(Cluster::node(n)),
    };
    Ok((target, cluster))
}

/// Exactly `gpus` GPUs, in nodes of [`DEFAULT_GPUS_PER_NODE`] above that, CPU offload
/// searched or not.
pub(crate) fn exact_cluster(gpus: u64, offload: bool) -> Option<Cluster> {
    (gpus > 1).then(|| {
        let per = gpus.min(DEFAULT_GPUS_PER_NODE);
        Cluster {
            nodes: gpus.div_ceil(per),
            gpus_per_node: per,
            exact: true,
            offload,
        }
    })
}

/// The layout of a job (for display).
pub(crate) fn layout_of(job: &Job) -> Layout {
    let p = &job.parallel;
    Layout {
        gpus: p.gpus(),
        // The job's own node count; a job that does not give one (1) spans nodes of
        // [`DEFAULT_GPUS_PER_NODE`].
        nodes: if p.nodes > 1 {
            p.nodes
        } else {
            p.gpus().div_ceil(DEFAULT_GPUS_PER_NODE)
        },
        sharding: p.sharding,
        offload: p.offload,
    }
}

/// The catalog preset a recipe names: the hand-typed preset (count stripped), or the
/// detected GPU's catalog id.
fn preset_of(target: &Target) -> Option<String> {
    let first = target.hardware.devices.first()?;
    if !target.detected && !target.spec.contains(',') {
        let spec = target.spec.trim();
        let rest = spec
            .split_once(['x', 'X', '×', '*'])
            .filter(|(n, _)| !n.is_empty() && n.trim().chars().all(|c| c.is_ascii_digit()))
            .map_or(spec, |(_, r)| r.trim());
        if let Ok(HardwareSpec::Given(h)) = parse_hardware_spec(rest)
            && h.devices.first().is_some_and(|d| d.catalog_id.is_some())
        {
            return Some(rest.to_owned());
        }
    }
    first.catalog_id.clone()
}

/// The moro.yaml of a search winner, with `hardware:` and `prediction:` filled in.
pub(crate) fn build_recipe(
    model_id: &str,
    target: &Target,
    cand: &Candidate,
    usable_bytes: u64,
) -> Recipe {
    let name = format!(
        "{} {}",
        model_id.rsplit('/').next().unwrap_or(model_id),
        cand.job.method.as_str()
    );
    // Generated recipes turn on the 5-level out-of-memory recovery of `moro run`, as the
    // product's moro.yaml does (`auto_heal: true`).
    let extras = TrainingExtras {
        auto_heal: true,
        ..TrainingExtras::default()
    };
    let mut recipe = Recipe::from_job(name, model_id, &cand.job, extras);
    let first = target.hardware.devices.first();
    recipe.hardware = Some(HardwareSection {
        name: first.map(|d| d.name.clone()),
        preset: preset_of(target),
        memory_bytes: target.memory_bytes(),
        count: target.hardware.devices.len().max(1) as u64,
        detected: target.detected,
    });
    recipe.prediction = Some(prediction_section(
        &cand.estimate,
        cand.margin_bytes,
        usable_bytes,
    ));
    recipe
}

fn prediction_section(est: &Estimate, margin: u64, usable: u64) -> PredictionSection {
    PredictionSection {
        peak_allocated_bytes: est.peak_allocated_bytes,
        peak_reserved_bytes: est.peak_reserved_bytes,
        peak_device_bytes: est.peak_device_bytes,
        phase: Some(est.peak_phase.as_str().to_owned()),
        components: est
            .components
            .iter()
            .map(|(c, b)| (c.as_str(), *b))
            .collect::<Components>(),
        headroom_bytes: Some(headroom(usable, est.peak_device_bytes, margin)),
        margin_bytes: Some(margin),
        memory_bytes: Some(usable),
    }
}

/// The fit rule of an estimate of `job`, with the band its device bound comes from.
fn rule(est: &Estimate, job: &Job) -> String {
    let from = moro_core::bound::Table::builtin()
        .upper_of(est, job)
        .device_from;
    margin_rule(JobClass::of(job), from)
}

/// usable − margin − peak, saturating into i64.
fn headroom(usable: u64, peak: u64, margin: u64) -> i64 {
    let h = i128::from(usable) - i128::from(peak) - i128::from(margin);
    i64::try_from(h).unwrap_or(if h < 0 { i64::MIN } else { i64::MAX })
}

/// The header comment of a generated recipe.
fn header(
    model: &resolve::Resolved,
    target: &Target,
    request: &Request,
    cand: &Candidate,
    usable: u64,
) -> String {
    #[allow(clippy::cast_precision_loss)]
    let params = model.spec.total_params() as f64 / 1e9;
    format!(
        "Generated by moro {} (`moro recipe generate`): the best configuration by the `{}` \
         objective that fits.\nmodel: {} ({params:.2}B parameters, {})\nhardware: {} ({} GiB \
         usable per GPU{})\nsafety: {}\npredicted {} GiB, bound {} GiB (95 %), usable {} GiB \
         (headroom {} GiB)\n{}`moro recipe check` re-checks it; `moro estimate <this file>` shows \
         the breakdown.",
        env!("CARGO_PKG_VERSION"),
        request.objective.as_str(),
        model.id,
        model.spec.model_type,
        target.display(),
        gib(usable),
        if target.detected {
            ", detected: free memory"
        } else {
            ""
        },
        rule(&cand.estimate, &cand.job),
        gib(cand.estimate.peak_device_bytes),
        gib(cand.estimate.peak_device_bytes + cand.margin_bytes),
        gib(usable),
        gib(cand.headroom_bytes.max(0).unsigned_abs()),
        layout_lines(request, cand),
    )
}

/// The header line of a recipe the search gave Liger's kernels ("" otherwise).
fn liger_line(cand: &Candidate) -> String {
    if cand.job.liger.any() {
        "liger: Liger's kernels compute the same step with less memory (no logits tensor); the \
         trainer's environment needs the liger-kernel package\n"
            .to_owned()
    } else {
        String::new()
    }
}

/// The header lines of a multi-GPU recipe: the GPUs and strategy chosen, the rule, the host
/// RAM offload needs, and how to export it.
fn layout_lines(request: &Request, cand: &Candidate) -> String {
    let Some(cluster) = request.cluster else {
        return liger_line(cand);
    };
    let gpus = cand.job.parallel.gpus();
    let nodes = cand.job.parallel.nodes;
    let mut s = format!(
        "parallel: {} of the {} GPUs{} with {} (per-GPU figures above; the effective batch is \
         over all of them)\nstrategy rule: the least communication that fits, DDP < ZeRO-1 < \
         ZeRO-2/SHARD_GRAD_OP < ZeRO-3/FULL_SHARD in a node or HYBRID_SHARD < FULL_SHARD across \
         nodes < optimizer offload < parameter offload; then more GPUs\n",
        gpus,
        cluster.gpus(),
        if nodes > 1 {
            format!(" ({nodes} nodes of {})", cand.job.parallel.gpus_per_node())
        } else {
            String::new()
        },
        layout_of(&cand.job).strategy_text()
    );
    s.push_str(&host_text(cand));
    s.push_str(&liger_line(cand));
    if gpus > 1 {
        s.push_str(
            "`moro recipe export --to deepspeed|accelerate|trl|...` writes the launcher configs \
             and the launch command.\n",
        );
    }
    s
}

/// One line describing a configuration.
pub(crate) fn describe(job: &Job) -> String {
    let mut s = job.method.as_str().to_owned();
    if job.method.is_peft() {
        let t = match &job.lora.targets {
            moro_core::job::Targets::AllLinear => "all-linear".to_owned(),
            moro_core::job::Targets::Names(v) => v.join(","),
        };
        s.push_str(&format!(" r={} α={} on {t}", job.lora.rank, job.lora.alpha));
    }
    if job.method == Method::Qlora {
        s.push_str(&format!(" ({})", job.quantization.as_str()));
    }
    s.push_str(&format!(
        ", {} tokens, micro-batch {} × accum {}, {}, {}, {}{}",
        job.seq_len,
        job.micro_batch_size,
        job.grad_accum,
        job.precision.as_str(),
        job.optimizer.as_str(),
        job.attention.as_str(),
        job.checkpointing_in_words()
    ));
    if job.liger.any() {
        s.push_str(", Liger");
    }
    if job.parallel.gpus() > 1 {
        s.push_str(&format!(
            ", {} GPUs {}",
            job.parallel.gpus(),
            layout_of(job).strategy_text()
        ));
    }
    s
}

/// The host memory line of an offloading configuration ("" without offload).
fn host_text(c: &Candidate) -> String {
    if c.estimate.host_bytes == 0 {
        String::new()
    } else {
        format!(
            "host RAM for the offloaded states: {} GiB per node ({} GiB for each of its {} \
             GPU processes)\n",
            gib(c.host_bytes_per_node()),
            gib(c.estimate.host_bytes),
            c.job.parallel.gpus_per_node()
        )
    }
}

/// The "what would fit" lines of [`Alternatives`] (what `recipe generate` prints when nothing
/// fits, and `estimate` when the job does not).
pub(crate) fn alternatives_text(alt: &Alternatives) -> String {
    let mut s = String::from("what would fit:\n");
    let mut any = false;
    if let Some(m) = &alt.smaller_model {
        any = true;
        #[allow(clippy::cast_precision_loss)]
        let b = m.parameters as f64 / 1e9;
        s.push_str(&format!(
            "  a smaller model: {} ({b:.1}B), {}\n",
            m.id, m.configuration
        ));
    }
    if let Some(g) = &alt.larger_gpu {
        any = true;
        s.push_str(&format!(
            "  more memory: --hardware {} ({} GiB), {}\n",
            g.preset,
            gib(g.memory_bytes),
            g.configuration
        ));
    }
    if let Some(g) = &alt.more_gpus {
        any = true;
        s.push_str(&format!(
            "  more GPUs: {} × this GPU with {}, {}\n",
            g.gpus, g.strategy, g.configuration
        ));
    }
    if !any {
        s.push_str(
            "  nothing in the catalog: no smaller model of the family, GPU or GPU count up to 64\n",
        );
    }
    s
}

/// What would fit when nothing does.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Alternatives {
    /// The largest smaller catalog model of the same family (org and `model_type`) that fits.
    pub(crate) smaller_model: Option<AltModel>,
    /// The smallest catalog GPU with more memory on which it fits.
    pub(crate) larger_gpu: Option<AltGpu>,
    /// The fewest GPUs of this kind (2 to 64, nodes of 8, the strategy searched) on which
    /// it fits.
    pub(crate) more_gpus: Option<AltGpus>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AltModel {
    pub(crate) id: String,
    pub(crate) parameters: u64,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct AltGpu {
    pub(crate) preset: String,
    pub(crate) memory_bytes: u64,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct AltGpus {
    pub(crate) gpus: u64,
    pub(crate) strategy: String,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
}

/// Runs the search; `None` when the request is invalid for this model.
pub(crate) fn run_search(spec: &ModelSpec, request: &Request, caps: &Caps) -> Option<Outcome> {
    let space = Space::new(spec, request, caps).ok()?;
    Some(search(spec, &space, caps))
}

/// The best configuration of `request` on `caps`, or `None` at once when nothing can fit
/// (no closest configuration is looked for: `moro fit` only needs the ones that fit).
pub(crate) fn best_fitting(
    spec: &ModelSpec,
    request: &Request,
    caps: &Caps,
    cache: &moro_core::search::EstimateCache,
) -> Option<moro_core::search::Candidate> {
    let space = Space::new(spec, request, caps).ok()?;
    if !moro_core::search::can_fit_cached(spec, &space, caps, Some(cache)) {
        return None;
    }
    moro_core::search::search_cached(spec, &space, caps, Some(cache)).best
}

/// Catalog models of the same family as `model_id`/`spec` with fewer parameters, largest
/// first (ties: the nearest name). Family: the same organisation (id prefix) and the same
/// `model_type`.
pub(crate) fn smaller_family_models(
    model_id: &str,
    spec: &ModelSpec,
) -> Vec<(&'static str, ModelSpec)> {
    let org = model_id
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let params = spec.total_params();
    let mut out: Vec<(&'static str, ModelSpec)> = catalog::entries()
        .iter()
        .filter(|e| {
            e.id.split('/')
                .next()
                .unwrap_or_default()
                .eq_ignore_ascii_case(&org)
        })
        .filter_map(|e| catalog::load(e).ok().map(|s| (e.id, s)))
        .filter(|(_, s)| s.model_type == spec.model_type && s.total_params() < params)
        .collect();
    // Among equal sizes (Qwen2-7B and Qwen2.5-7B), the one whose name shares the longest
    // prefix with the model asked about: its own generation.
    let shared = |id: &str| {
        id.chars()
            .zip(model_id.chars())
            .take_while(|(a, b)| a.eq_ignore_ascii_case(b))
            .count()
    };
    out.sort_by_key(|(id, s)| {
        (
            std::cmp::Reverse(s.total_params()),
            std::cmp::Reverse(shared(id)),
        )
    });
    out
}

/// NVIDIA catalog GPUs (the estimator models CUDA) as devices, smallest memory first.
pub(crate) fn nvidia_presets() -> Vec<(String, Device)> {
    let mut v: Vec<(String, Device)> = moro_core::hardware::presets()
        .iter()
        .filter(|p| p.vendor == Vendor::Nvidia)
        .filter_map(|p| p.to_device(None).map(|d| (p.id.clone(), d)))
        .collect();
    v.sort_by_key(|(_, d)| d.total_bytes);
    v
}

/// Looks for what would fit: a smaller model of the family, a GPU with more memory, more
/// GPUs of this kind (2 to 64, the strategy searched).
pub(crate) fn alternatives(
    model_id: &str,
    spec: &ModelSpec,
    request: &Request,
    target: &Target,
    caps: &Caps,
) -> Alternatives {
    let mut alt = Alternatives::default();
    for (id, s) in smaller_family_models(model_id, spec) {
        if let Some(best) = run_search(&s, request, caps).and_then(|o| o.best) {
            alt.smaller_model = Some(AltModel {
                id: id.to_owned(),
                parameters: s.total_params(),
                configuration: describe(&best.job),
                peak_device_bytes: best.estimate.peak_device_bytes,
            });
            break;
        }
    }
    for (id, d) in nvidia_presets() {
        if d.total_bytes <= caps.usable_bytes {
            continue;
        }
        let c = caps_of_device(&d);
        if let Some(best) = run_search(spec, request, &c).and_then(|o| o.best) {
            alt.larger_gpu = Some(AltGpu {
                preset: id,
                memory_bytes: d.total_bytes,
                configuration: describe(&best.job),
                peak_device_bytes: best.estimate.peak_device_bytes,
            });
            break;
        }
    }
    let have = target.hardware.devices.len() as u64;
    for gpus in FIT_GPU_COUNTS.into_iter().filter(|g| *g > have) {
        let req = Request {
            cluster: exact_cluster(gpus, true),
            ..request.clone()
        };
        if let Some(best) = run_search(spec, &req, caps).and_then(|o| o.best) {
            alt.more_gpus = Some(AltGpus {
                gpus,
                strategy: layout_of(&best.job).strategy_text(),
                configuration: describe(&best.job),
                peak_device_bytes: best.estimate.peak_device_bytes,
            });
            break;
        }
    }
    alt
}

/// GPU counts `moro fit` and the "more GPUs" alternative try: up to a node of 8, then nodes
/// of 8.
pub(crate) const FIT_GPU_COUNTS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

#[derive(Debug, Serialize)]
struct CandidateJson {
    configuration: String,
    gpus: u64,
    strategy: String,
    job: Job,
    peak_device_bytes: u64,
    /// The upper bound on the device peak, which "fits" is judged on.
    peak_upper_bytes: u64,
    margin_bytes: u64,
    headroom_bytes: i64,
    /// fits / uncertain / does_not_fit on the GPU's usable memory.
    verdict: moro_core::bound::Verdict,
    /// Host RAM per GPU process for offloaded states.
    host_bytes: u64,
    /// Host RAM per node (its GPU processes together).
    host_bytes_per_node: u64,
}

impl CandidateJson {
    fn of(c: &Candidate) -> Self {
        Self {
            configuration: describe(&c.job),
            gpus: c.job.parallel.gpus(),
            strategy: layout_of(&c.job).strategy_text(),
            job: c.job.clone(),
            peak_device_bytes: c.estimate.peak_device_bytes,
            peak_upper_bytes: c.upper_bytes(),
            margin_bytes: c.margin_bytes,
            headroom_bytes: c.headroom_bytes,
            verdict: c.verdict(),
            host_bytes: c.estimate.host_bytes,
            host_bytes_per_node: c.host_bytes_per_node(),
        }
    }
}

#[derive(Debug, Serialize)]
struct GenerateJson<'a> {
    model: &'a str,
    hardware: String,
    usable_bytes: u64,
    objective: &'static str,
    margin_rule: String,
    fits: bool,
    output: Option<String>,
    recipe: Option<&'a Recipe>,
    best: Option<CandidateJson>,
    runners_up: Vec<CandidateJson>,
    closest: Option<CandidateJson>,
    short_by_bytes: u64,
    alternatives: Option<Alternatives>,
    evaluated: usize,
}

pub(crate) fn run_generate(args: &GenerateArgs) -> Result<ExitCode> {
    let model = resolve::model(&args.model)?;
    let (target, cluster) = resolve_target(&args.hardware)?;
    let mut caps = caps_of(&target).ok_or_else(|| user("--hardware: no GPU"))?;
    caps.host_bytes = args.host_memory;
    if let Some(n) = crate::setup::machine_profile(target.hardware.devices.first()).1 {
        note(&n);
    }
    let sized = match &args.dataset {
        Some(path) => Some(size_from_data(
            args,
            path,
            model.spec.max_position_embeddings,
        )?),
        None => None,
    };
    // A Mac fine-tunes with mlx_lm.lora (docs/mlx-memory.md).
    let apple = target
        .hardware
        .devices
        .iter()
        .any(|d| d.vendor == moro_core::hardware::Vendor::Apple);
    let stack = args.stack.unwrap_or_else(|| {
        if apple {
            note(
                "planning on the mlx stack (mlx_lm.lora), what Macs fine-tune with; --stack \
                  chooses another",
            );
            Stack::Mlx
        } else {
            Stack::Hf
        }
    });
    let request = Request {
        method: args.method,
        seq_len: sized.as_ref().map_or(args.seq_len, |d| Some(d.chosen)),
        effective_batch: args.effective_batch,
        stack,
        parallel: moro_core::job::Parallel::single(),
        cluster,
        objective: args.objective,
    };
    let space = Space::new(&model.spec, &request, &caps).map_err(|e| crate::error::search(&e))?;
    if let Some(out) = &args.output
        && out.exists()
        && !args.force
    {
        return Err(user_hint(
            format!("`{}` exists", out.display()),
            "pass --force to overwrite it, or choose another --output",
        ));
    }
    note(&format!(
        "searching {} configurations of {} for {} ({} GiB usable)…",
        moro_core::search::all_configs(&space).len(),
        model.id,
        target.display(),
        gib(caps.usable_bytes)
    ));
    let outcome = search(&model.spec, &space, &caps);
    let Some(best) = &outcome.best else {
        return nothing_fits(args, &model, &target, &caps, &request, &outcome);
    };
    let mut recipe = build_recipe(&model.id, &target, best, caps.usable_bytes);
    let mut head = header(&model, &target, &request, best, caps.usable_bytes);
    if let Some(d) = &sized {
        if recipe.training.dataset.is_none() {
            recipe.training.dataset = Some(d.section.path.clone());
        }
        head.push_str(&format!("\n{}", d.header_line()));
        recipe.data = Some(d.section.clone());
    }
    let yaml = moro_recipe::to_yaml(&recipe, &head);
    if let Some(out) = &args.output {
        crate::output::write_atomic(out, yaml.as_bytes())
            .map_err(|e| user(format!("cannot write `{}`: {e}", out.display())))?;
    }
    if args.json {
        let doc = GenerateJson {
            model: &model.id,
            hardware: target.display(),
            usable_bytes: caps.usable_bytes,
            objective: args.objective.as_str(),
            margin_rule: rule(&best.estimate, &best.job),
            fits: true,
            output: args.output.as_ref().map(|p| p.display().to_string()),
            recipe: Some(&recipe),
            best: Some(CandidateJson::of(best)),
            runners_up: outcome.runners_up.iter().map(CandidateJson::of).collect(),
            closest: None,
            short_by_bytes: 0,
            alternatives: None,
            evaluated: outcome.evaluated,
        };
        stdout(&json(&doc)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let summary = summary_text(best, &outcome, caps.usable_bytes);
    match &args.output {
        Some(out) => {
            stdout(&format!("wrote {}\n{summary}", out.display()))?;
        }
        None => {
            stdout(&yaml)?;
            note(&summary);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `max_seq_length` from a dataset: its lengths and the percentile chosen.
struct SizedFromData {
    section: moro_recipe::DataSection,
    chosen: u64,
    /// The model's context, when the percentile's length is beyond it and was cut to it.
    capped_at: Option<u64>,
    /// The percentile's length before that cut.
    uncapped: u64,
}

impl SizedFromData {
    fn header_line(&self) -> String {
        let d = &self.section;
        let sized = match self.capped_at {
            Some(n) => format!(
                "the model's {n} positions, below the p{} of {} ({} tokens)",
                d.percentile, d.path, self.uncapped
            ),
            None => format!("the p{} of {}", d.percentile, d.path),
        };
        format!(
            "max_seq_length {}: {sized}; {} samples, {} longer are truncated. Sort the \
             longest batch first so an out-of-memory shows at step 1, not step 300.",
            self.chosen,
            d.samples.unwrap_or(0),
            d.truncated_samples.unwrap_or(0),
        )
    }
}

/// The percentile's length of the dataset, cut to the model's context `positions` (0: not
/// known) when it is longer: a trainer truncates there anyway, and past it the model was not
/// trained.
fn size_from_data(
    args: &GenerateArgs,
    path: &std::path::Path,
    positions: u64,
) -> Result<SizedFromData> {
    use moro_data::Permille;
    let p = crate::commands::data::parse_percentile(args.percentile)?;
    let m = crate::commands::data::measure(
        path,
        &args.model,
        &args.data,
        &resolve::HubArgs::default(),
    )?;
    let uncapped = m.at(p).max(1);
    let cap = u32::try_from(positions).unwrap_or(u32::MAX);
    let chosen = if positions > 0 {
        uncapped.min(cap)
    } else {
        uncapped
    };
    let truncated = m.longer_than(chosen);
    let at = |q: Permille| u64::from(m.at(q));
    let section = moro_recipe::DataSection {
        path: path.display().to_string(),
        shape: Some(m.scan.shape.name().to_owned()),
        samples: Some(m.sorted.len() as u64),
        percentile: f64::from(p.tenths()) / 10.0,
        p90_tokens: Some(at(Permille::P90)),
        p95_tokens: Some(at(Permille::P95)),
        p99_tokens: at(Permille::P99),
        max_tokens: m.sorted.last().map(|&l| u64::from(l)),
        truncated_samples: Some(truncated),
    };
    let sized = SizedFromData {
        section,
        chosen: u64::from(chosen),
        capped_at: (chosen < uncapped).then_some(positions),
        uncapped: u64::from(uncapped),
    };
    note(&sized.header_line());
    if m.scan.malformed_count > 0 {
        note(&format!(
            "warning: {} malformed rows of {} not counted (`moro data stats` lists them)",
            m.scan.malformed_count,
            path.display()
        ));
    }
    Ok(sized)
}

fn summary_text(best: &Candidate, outcome: &Outcome, usable: u64) -> String {
    let mut s = format!(
        "best    {}\npeak    {} GiB + margin {} GiB of {} GiB usable{} (headroom {} GiB)\n{}",
        describe(&best.job),
        gib(best.estimate.peak_device_bytes),
        gib(best.margin_bytes),
        gib(usable),
        if best.job.parallel.gpus() > 1 {
            " per GPU"
        } else {
            ""
        },
        gib(best.headroom_bytes.max(0).unsigned_abs()),
        host_text(best)
    );
    if !outcome.runners_up.is_empty() {
        s.push_str("runners-up:\n");
        for r in &outcome.runners_up {
            s.push_str(&format!(
                "  {} ({} GiB)\n",
                describe(&r.job),
                gib(r.estimate.peak_device_bytes)
            ));
        }
    }
    s
}

fn nothing_fits(
    args: &GenerateArgs,
    model: &resolve::Resolved,
    target: &Target,
    caps: &Caps,
    request: &Request,
    outcome: &Outcome,
) -> Result<ExitCode> {
    let alt = alternatives(&model.id, &model.spec, request, target, caps);
    let rule_text = outcome.closest.as_ref().map_or_else(
        || {
            let class = JobClass {
                stack: request.stack,
                method: moro_core::job::Method::Lora,
                sharded: false,
            };
            margin_rule(class, moro_core::validation::Metric::Device)
        },
        |c| rule(&c.estimate, &c.job),
    );
    if args.json {
        let doc = GenerateJson {
            model: &model.id,
            hardware: target.display(),
            usable_bytes: caps.usable_bytes,
            objective: args.objective.as_str(),
            margin_rule: rule_text.clone(),
            fits: false,
            output: None,
            recipe: None,
            best: None,
            runners_up: Vec::new(),
            closest: outcome.closest.as_ref().map(CandidateJson::of),
            short_by_bytes: outcome.short_by_bytes(),
            alternatives: Some(alt),
            evaluated: outcome.evaluated,
        };
        stdout(&json(&doc)?)?;
        return Ok(ExitCode::from(1));
    }
    let mut s = format!(
        "nothing fits: no configuration of {} fits {} ({} GiB usable per GPU, {})\n",
        model.id,
        target.display(),
        gib(caps.usable_bytes),
        rule_text
    );
    if let Some(c) = &outcome.closest {
        s.push_str(&format!(
            "closest: {}\n  predicted {} GiB, bound {} GiB: misses by {} GiB\n",
            describe(&c.job),
            gib(c.estimate.peak_device_bytes),
            gib(c.estimate.peak_device_bytes + c.margin_bytes),
            gib(outcome.short_by_bytes())
        ));
    }
    s.push_str(&alternatives_text(&alt));
    stdout(&s)?;
    Ok(ExitCode::from(1))
}

#[derive(Debug, Serialize)]
struct CheckJson<'a> {
    file: &'a str,
    model: &'a str,
    hardware: String,
    configuration: String,
    usable_bytes: u64,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    peak_device_bytes: u64,
    margin_bytes: u64,
    margin_rule: String,
    headroom_bytes: i64,
    /// The upper bound on each level, the band it comes from and the verdict.
    #[serde(flatten)]
    bound: crate::verdict::Judged,
    fits: bool,
    fits_without_margin: bool,
    recorded_peak_device_bytes: Option<u64>,
}

pub(crate) fn run_check(args: &CheckArgs) -> Result<ExitCode> {
    let loaded = load(&args.file)?;
    let given = match args.hardware.as_deref() {
        Some(h) => crate::hw::resolve(Some(h), None)?,
        None => None,
    };
    let setup = crate::setup::resolve(crate::setup::JobInputs {
        recipe: Some(&loaded),
        model: None,
        flags: &JobSettings::default(),
        target: given.as_ref(),
        hub: &resolve::HubArgs::default(),
    })?;
    let Some(target) = setup.target.clone() else {
        return Err(user_hint(
            format!("`{}` has no `hardware:` section", loaded.path),
            "pass --hardware (detect, a preset such as rtx-4090, or a size such as 24GiB)",
        ));
    };
    let caps = caps_of(&target).ok_or_else(|| user("--hardware: no GPU"))?;
    // The recipe's own usable memory (free memory when it was detected) unless the hardware
    // is given on the command line.
    let usable = match (&args.hardware, loaded.usable_bytes()) {
        (None, Some(u)) => u,
        _ => caps.usable_bytes,
    };
    if let Some(n) = &setup.notes {
        note(n);
    }
    let est = setup.estimate()?;
    let (model, job) = (&setup.model, &setup.job);
    let judged = crate::verdict::judge(&est, job, Some(usable));
    let margin = judged.peak_upper_bytes - est.peak_device_bytes;
    let head = headroom(usable, est.peak_device_bytes, margin);
    let fits = head >= 0;
    let fits_raw = est.peak_device_bytes <= usable;
    let recorded = loaded
        .recipe
        .prediction
        .as_ref()
        .map(|p| p.peak_device_bytes);
    if args.json {
        let doc = CheckJson {
            file: &loaded.path,
            model: &model.id,
            hardware: target.display(),
            configuration: describe(job),
            usable_bytes: usable,
            peak_allocated_bytes: est.peak_allocated_bytes,
            peak_reserved_bytes: est.peak_reserved_bytes,
            peak_device_bytes: est.peak_device_bytes,
            margin_bytes: margin,
            margin_rule: rule(&est, job),
            headroom_bytes: head,
            bound: judged.clone(),
            fits,
            fits_without_margin: fits_raw,
            recorded_peak_device_bytes: recorded,
        };
        stdout(&json(&doc)?)?;
    } else {
        let mut t = Table::new(&["", "GiB"], &[false, true]);
        t.row(vec![
            "predicted (device)".into(),
            gib(est.peak_device_bytes),
        ]);
        t.row(vec![
            format!("bound ({} %)", judged.band.coverage_percent),
            gib(est.peak_device_bytes + margin),
        ]);
        t.row(vec!["usable".into(), gib(usable)]);
        let mut s = format!(
            "{}: valid\nmodel   {}\njob     {}\non      {}\n\n{}",
            loaded.path,
            model.id,
            describe(job),
            target.display(),
            t.render()
        );
        if fits {
            s.push_str(&format!(
                "\nfits: the bound is {} GiB under the usable memory\n",
                gib(head.unsigned_abs())
            ));
        } else if fits_raw {
            s.push_str(&format!(
                "\nuncertain: the prediction fits, but the bound is {} GiB over ({}); {} GiB less \
                 makes it safe\n",
                gib(head.unsigned_abs()),
                rule(&est, job),
                gib(head.unsigned_abs())
            ));
        } else {
            s.push_str(&format!(
                "\ndoes NOT fit: {} GiB over\n",
                gib(head.unsigned_abs())
            ));
        }
        if let Some(r) = recorded
            && r != est.peak_device_bytes
        {
            s.push_str(&format!(
                "note: the recipe recorded a peak of {} GiB; this moro predicts {} GiB\n",
                gib(r),
                gib(est.peak_device_bytes)
            ));
        }
        stdout(&s)?;
    }
    Ok(if fits {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use moro_core::estimate::estimate;
    use moro_core::search::margin_bytes;

    fn target_of(spec: &str) -> Target {
        match parse_hardware_spec(spec).unwrap() {
            HardwareSpec::Given(hardware) => Target {
                hardware,
                detected: false,
                spec: spec.to_owned(),
            },
            HardwareSpec::Detect => unreachable!(),
        }
    }

    /// generate → YAML → check → estimate for every catalog model on five presets: the job
    /// read back from the text is the searched job, and it predicts the same bytes with the
    /// profile rebuilt from the recipe's `hardware:` section.
    #[test]
    fn every_catalog_model_round_trips_on_five_presets() {
        let presets = [
            "rtx-3060-12gb",
            "rtx-4090",
            "a100-sxm4-80gb",
            "h100-sxm",
            "apple-m3-max-64gb",
            "t4",
        ];
        let mut written = 0;
        let mut nothing = 0;
        for entry in catalog::entries() {
            let spec = catalog::load(entry).unwrap();
            for hw in presets {
                let target = target_of(hw);
                let caps = caps_of(&target).unwrap();
                let request = Request {
                    // Within the learned positions of every catalog model (BERT: 512).
                    seq_len: Some(if spec.position_embeddings > 0 {
                        spec.position_embeddings.min(1024)
                    } else {
                        1024
                    }),
                    ..Request::default()
                };
                let Some(outcome) = run_search(&spec, &request, &caps) else {
                    // A bitsandbytes checkpoint cannot load without bitsandbytes (Apple).
                    if spec.prequantized.is_some() && !caps.bitsandbytes {
                        continue;
                    }
                    panic!("{} on {hw}: request rejected", entry.id)
                };
                let Some(best) = outcome.best else {
                    nothing += 1;
                    assert!(outcome.closest.is_some(), "{} on {hw}", entry.id);
                    continue;
                };
                let recipe = build_recipe(entry.id, &target, &best, caps.usable_bytes);
                let text = moro_recipe::to_yaml(&recipe, "test");
                assert!(text.starts_with(moro_recipe::SCHEMA_LINE));
                let back = moro_recipe::parse(&text)
                    .unwrap_or_else(|e| panic!("{} on {hw}: {e}\n{text}", entry.id));
                let loaded = LoadedRecipe {
                    path: "moro.yaml".into(),
                    text: text.clone(),
                    settings: back.settings().unwrap(),
                    recipe: back,
                };
                let job = loaded.settings.resolve().unwrap();
                assert_eq!(job, best.job, "{} on {hw}", entry.id);
                // The profile and memory come back from the hardware section alone.
                let t2 = loaded.target().expect("hardware section");
                let caps2 = caps_of(&t2).unwrap();
                assert_eq!(caps2.profile, caps.profile, "{} on {hw}", entry.id);
                assert_eq!(loaded.usable_bytes(), Some(caps.usable_bytes));
                let est = estimate(&spec, &job, &caps2.profile).unwrap();
                assert_eq!(
                    est.peak_device_bytes, best.estimate.peak_device_bytes,
                    "{} on {hw}",
                    entry.id
                );
                let p = loaded.recipe.prediction.as_ref().unwrap();
                assert_eq!(p.peak_device_bytes, est.peak_device_bytes);
                assert_eq!(p.peak_allocated_bytes, est.peak_allocated_bytes);
                // check's verdict: fits with the margin.
                let margin = margin_bytes(&est, &job);
                assert!(
                    est.peak_device_bytes + margin <= caps2.usable_bytes.min(caps.usable_bytes)
                );
                written += 1;
            }
        }
        assert!(
            written > catalog::entries().len() * 3,
            "{written} written, {nothing} nothing fits"
        );
    }

    /// Multi-GPU winners round-trip through moro.yaml too: `parallel:` carries the count,
    /// strategy and offload, and the job read back predicts the same bytes.
    #[test]
    fn multi_gpu_recipes_round_trip() {
        let cases = [
            ("Qwen/Qwen2.5-7B", "8xa100-sxm4-80gb", Method::Full),
            (
                "meta-llama/Llama-3.1-70B-Instruct",
                "8xh100-sxm",
                Method::Full,
            ),
            (
                "meta-llama/Llama-3.1-70B-Instruct",
                "2x8xh100-sxm",
                Method::Full,
            ),
            ("Qwen/Qwen2.5-32B", "4xrtx-4090", Method::Lora),
            ("Qwen/Qwen2.5-1.5B", "2xa100-sxm4-80gb", Method::Full),
        ];
        for (id, hw, method) in cases {
            let spec = catalog::load(catalog::find(id).unwrap()).unwrap();
            let (target, cluster) = resolve_target(hw).unwrap();
            assert!(cluster.is_some(), "{hw}");
            let caps = caps_of(&target).unwrap();
            let request = Request {
                method: MethodChoice::Only(method),
                seq_len: Some(2048),
                cluster,
                ..Request::default()
            };
            let best = run_search(&spec, &request, &caps)
                .and_then(|o| o.best)
                .unwrap_or_else(|| panic!("{id} on {hw}: nothing fits"));
            let recipe = build_recipe(id, &target, &best, caps.usable_bytes);
            let text = moro_recipe::to_yaml(&recipe, "test");
            let back = moro_recipe::parse(&text).unwrap();
            let job = back.to_job().unwrap();
            assert_eq!(job, best.job, "{id} on {hw}");
            if best.job.parallel.gpus() > 1 {
                assert!(text.contains("\nparallel:\n"), "{text}");
            }
            let est = estimate(&spec, &job, &caps.profile).unwrap();
            assert_eq!(est.peak_device_bytes, best.estimate.peak_device_bytes);
            let loaded = LoadedRecipe {
                path: "moro.yaml".into(),
                text,
                settings: back.settings().unwrap(),
                recipe: back,
            };
            let t2 = loaded.target().unwrap();
            assert_eq!(
                t2.hardware.devices.len(),
                target.hardware.devices.len(),
                "{hw}"
            );
        }
    }

    #[test]
    fn cluster_specs() {
        assert_eq!(parse_cluster_spec("2x8xh100-sxm"), Some((2, 8, "h100-sxm")));
        assert_eq!(
            parse_cluster_spec("4 × 8 × a100-sxm4-80gb"),
            Some((4, 8, "a100-sxm4-80gb"))
        );
        assert_eq!(parse_cluster_spec("8xh100-sxm"), None);
        assert_eq!(parse_cluster_spec("h100-sxm"), None);
        assert_eq!(parse_cluster_spec("2x8x"), None);
        assert_eq!(parse_cluster_spec("0x8xh100-sxm"), None);
        assert_eq!(parse_cluster_spec("2x8xh100-sxm,rtx-4090"), None);
        let (t, c) = resolve_target("2x8xh100-sxm").unwrap();
        assert_eq!(t.hardware.devices.len(), 16);
        assert_eq!(t.spec, "16xh100-sxm");
        assert_eq!(preset_of(&t).as_deref(), Some("h100-sxm"));
        let c = c.unwrap();
        assert_eq!((c.nodes, c.gpus_per_node, c.exact), (2, 8, false));
        let (_, c) = resolve_target("16xh100-sxm").unwrap();
        assert_eq!(c.map(|c| (c.nodes, c.gpus_per_node)), Some((2, 8)));
        let (_, c) = resolve_target("8xh100-sxm").unwrap();
        assert_eq!(c.map(|c| (c.nodes, c.gpus_per_node)), Some((1, 8)));
        let (_, c) = resolve_target("h100-sxm").unwrap();
        assert!(c.is_none());
        assert!(resolve_target("1000x8xh100-sxm").is_err());
    }

    #[test]
    fn preset_of_strips_counts_and_keeps_apple_sizes() {
        assert_eq!(
            preset_of(&target_of("rtx-4090")).as_deref(),
            Some("rtx-4090")
        );
        assert_eq!(
            preset_of(&target_of("2xa100-sxm4-80gb")).as_deref(),
            Some("a100-sxm4-80gb")
        );
        assert_eq!(
            preset_of(&target_of("apple-m3-max-64gb")).as_deref(),
            Some("apple-m3-max-64gb")
        );
        assert_eq!(preset_of(&target_of("24GiB")), None);
    }

    #[test]
    fn smaller_family_is_same_org_and_type() {
        let e = catalog::find("Qwen/Qwen2.5-72B").unwrap();
        let spec = catalog::load(e).unwrap();
        let v = smaller_family_models(e.id, &spec);
        assert!(!v.is_empty());
        assert!(
            v.iter()
                .all(|(id, s)| id.starts_with("Qwen/") && s.model_type == "qwen2")
        );
        assert!(
            v.windows(2)
                .all(|w| w[0].1.total_params() >= w[1].1.total_params())
        );
        assert_eq!(v[0].0, "Qwen/Qwen2.5-32B");
    }
}
