//! `moro estimate`: the peak memory of one job, by component, at three levels.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::bound::Verdict;
use moro_core::estimate::{Backend, Component, DeviceProfile, Estimate};
use moro_core::job::{Job, Method, Sharding};
use serde::Serialize;

use crate::jobargs::JobArgs;
use crate::output::{Table, bar, gib, json, size, stdout, thousands};
use crate::resolve;
use crate::verdict::{Judged, band_text, judge, verdict_text};

/// Arguments of `moro estimate`.
#[derive(Debug, Args)]
pub(crate) struct EstimateArgs {
    /// A moro.yaml to estimate (`moro estimate moro.yaml`); flags override its values and
    /// its `hardware:` section is used unless --hardware/--memory is given.
    pub(crate) recipe: Option<std::path::PathBuf>,
    /// Model: a Hugging Face id (`Qwen/Qwen2.5-7B`), a config.json or a model directory.
    #[arg(long, short)]
    pub(crate) model: Option<String>,
    #[command(flatten)]
    pub(crate) job: JobArgs,
    /// Memory available per GPU (`24GiB`, `80GB`): say whether it fits and the headroom.
    #[arg(long, conflicts_with = "hardware", allow_hyphen_values = true)]
    pub(crate) memory: Option<String>,
    /// Hardware: `detect`, a preset (`rtx-4090`, `a100-sxm4-80gb`), a GPU name, `8xh100-sxm`.
    #[arg(long)]
    pub(crate) hardware: Option<String>,
    /// PyTorch's device backend: cuda or mps (Apple GPUs; `--device mps --memory 24GiB` is
    /// an Apple GPU that may use 24 GiB) [default: the hardware's]
    #[arg(long, value_name = "BACKEND", value_parser = crate::jobargs::parse_backend)]
    pub(crate) device: Option<Backend>,
    /// Print one JSON object (sizes in bytes) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) hub: resolve::HubArgs,
    /// Estimate at the sequence length of this dataset's --percentile (tokenized with the
    /// model's tokenizer and chat template) instead of --seq-len.
    #[arg(long, value_name = "FILE", conflicts_with = "seq_len")]
    pub(crate) dataset: Option<std::path::PathBuf>,
    /// The percentile of the dataset's lengths to estimate at.
    #[arg(long, default_value = "99", value_name = "P", requires = "dataset")]
    pub(crate) percentile: f64,
    /// Training: also replay micro-batches of these token lengths, in this order (a run of
    /// batches of varying length; --seq-len defaults to the longest), and say what the run
    /// needs; with --trace, write that run's allocations.
    #[arg(long, value_name = "TOKENS,...", value_delimiter = ',', value_parser = crate::jobargs::parse_count, conflicts_with = "dataset")]
    pub(crate) batch_lengths: Vec<u64>,
    #[command(flatten)]
    pub(crate) data: crate::commands::data::DatasetArgs,
    /// Also draw the estimate as an SVG picture into FILE (written atomically): the
    /// components against the GPU's memory, and the peak against sequence length (flash vs
    /// eager attention) and micro batch.
    #[arg(long, value_name = "FILE")]
    pub(crate) svg: Option<std::path::PathBuf>,
    /// Also write the step's allocations and frees, in order, into FILE as JSON lines
    /// (written atomically): loading and two optimizer steps, each tensor named with its
    /// module, layer, component, phase and bytes (with --batch-lengths, that run). One-GPU
    /// full fine-tuning, LoRA (and DoRA, IA³, VeRA, LoHa, LoKr, OFT, LN, prompt and prefix
    /// tuning) and QLoRA of dense models on the hf and trl stacks, and generation
    /// (--max-new-tokens) with transformers' cache.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<std::path::PathBuf>,
}

/// The JSON document of `moro estimate --json`.
#[derive(Debug, Serialize)]
pub(crate) struct EstimateJson<'a> {
    pub(crate) model: ModelJson<'a>,
    pub(crate) job: &'a Job,
    pub(crate) peak_allocated_bytes: u64,
    pub(crate) peak_reserved_bytes: u64,
    pub(crate) peak_device_bytes: u64,
    pub(crate) peak_phase: &'static str,
    pub(crate) components: serde_json::Map<String, serde_json::Value>,
    pub(crate) phases: Vec<PhaseJson>,
    pub(crate) total_params: u64,
    pub(crate) trainable_params: u64,
    pub(crate) host_bytes: u64,
    /// What the job's setup (model load, DeepSpeed ZeRO-3 engine and step) leaves in
    /// PyTorch's cache: a floor under the reserved level.
    pub(crate) load_reserved_bytes: u64,
    /// The fragmentation of the replayed training steps: a floor under the reserve.
    pub(crate) replayed_fragmentation_bytes: u64,
    /// New segments the optimizer step's temporaries need on top of the forward and
    /// backward's reserved level.
    pub(crate) step_segments_bytes: u64,
    /// Wholly free segments a generation leaves cached beyond the reserved level, where the
    /// GPU has room for them.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) idle_cache_bytes: u64,
    /// A sharded job's rank, its bytes by part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rank: Option<moro_core::estimate::rank::RankParts>,
    /// The upper bound on each level, the band it comes from and the verdict.
    #[serde(flatten)]
    pub(crate) bound: Judged,
    pub(crate) memory_bytes: Option<u64>,
    /// The verdict is `fits`: the bound is within the memory.
    pub(crate) fits: Option<bool>,
    /// Memory − predicted device peak (negative: over).
    pub(crate) headroom_bytes: Option<i64>,
    /// When the job does not fit or is uncertain: what would fit instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) suggestions: Option<crate::commands::suggest::Suggestions>,
    /// The attention runs SDPA's math kernel on the target (no flash backend and grouped KV
    /// heads, or MPS); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) sdpa_math_kernel: bool,
    /// The PyTorch backend where it is not CUDA's (`"mps"`: the levels are the MPS
    /// allocator's, read by `torch.accelerator`); absent for CUDA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) backend: Option<Backend>,
    /// `--dataset` with padded batches: a run of its batches, replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) run_of_batches: Option<&'a RunJson>,
}

/// A run of a dataset's batches, each padded to its longest sample, replayed through the
/// step trace (docs/memory-anatomy.md §17).
#[derive(Debug, Serialize)]
pub(crate) struct RunJson {
    /// Batches replayed.
    pub(crate) batches: usize,
    /// How they were chosen.
    pub(crate) order: RunOrder,
    /// The longest batch's tokens per sample.
    pub(crate) longest_tokens: u64,
    /// The most bytes at once in segments holding a tensor: what must fit.
    pub(crate) needed_bytes: u64,
    /// `max_memory_reserved` at the end of the run where the GPU has room: the needed bytes
    /// and the blocks shorter batches left wholly free.
    pub(crate) reserved_bytes: u64,
}

/// Where a run's batch lengths came from.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RunOrder {
    /// `--dataset`: drawn shuffled from its samples, each its longest, the last the longest.
    Drawn,
    /// `--batch-lengths`, in the order given.
    Given,
}

/// The run's lines: what it needs against the estimate's reserved level, and where the
/// cache climbs; a warning where it needs more than `memory` (given where the estimate
/// fits).
fn run_text(r: &RunJson, est: &Estimate, memory: Option<u64>) -> String {
    // The context and what sits outside PyTorch's allocator, as the estimate adds them.
    let with_context = r.needed_bytes
        + est
            .peak_device_bytes
            .saturating_sub(est.peak_reserved_bytes);
    let which = match r.order {
        RunOrder::Drawn => format!(
            "{} of the dataset's batches replayed (shuffled, each padded to its longest, the \
             last {} tokens)",
            r.batches, r.longest_tokens
        ),
        RunOrder::Given => format!(
            "{} batches replayed in the order given (the longest {} tokens)",
            r.batches, r.longest_tokens
        ),
    };
    let mut out = format!(
        "\nrun     {which}: the segments holding a tensor peak at {} GiB, {} GiB with the \
         context; PyTorch's cache climbs to {} GiB where the GPU has room \
         (docs/memory-anatomy.md §17)\n",
        gib(r.needed_bytes),
        gib(with_context),
        gib(r.reserved_bytes)
    );
    if let Some(m) = memory
        && with_context > m
    {
        out.push_str(&format!(
            "warning: a run of these batches needs more than the GPU's {} GiB: it can run out \
             of memory after its first steps\n",
            gib(m)
        ));
    }
    out
}

#[derive(Debug, Serialize)]
pub(crate) struct ModelJson<'a> {
    pub(crate) id: &'a str,
    pub(crate) source: &'a str,
    pub(crate) model_type: &'a str,
    pub(crate) parameters: u64,
    /// What the checkpoint stores (safetensors headers), when read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stored_weights: Option<&'a moro_core::formats::safetensors::StoredWeights>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PhaseJson {
    pub(crate) phase: &'static str,
    pub(crate) allocated_bytes: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
const fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Headroom of `est` on a GPU of `memory` bytes (negative: does not fit).
pub(crate) fn headroom(est: &Estimate, memory: u64) -> i64 {
    let m = i64::try_from(memory).unwrap_or(i64::MAX);
    let p = i64::try_from(est.peak_device_bytes).unwrap_or(i64::MAX);
    m - p
}

pub(crate) fn run(args: &EstimateArgs) -> Result<ExitCode> {
    let loaded = load_recipe(args)?;
    if let Some(m) = model_arg(args, loaded.as_ref())
        && resolve::is_gguf(m)
    {
        if args.svg.is_some() {
            return Err(crate::error::user(
                "--svg: a GGUF model's llama.cpp allocation is not drawn; leave out --svg",
            ));
        }
        return crate::commands::gguf::from_estimate(args, m);
    }
    let (setup, samples) = setup_of(args, loaded.as_ref())?;
    let est = setup.estimate()?;
    let job = &setup.job;
    if !args.batch_lengths.is_empty() && job.method == Method::Inference {
        return Err(crate::error::user(
            "--batch-lengths: applies to training; an inference job's tokens are --seq-len \
             and --max-new-tokens",
        ));
    }
    let lengths = if args.batch_lengths.is_empty() {
        samples
            .filter(|_| job.padding.has_mask() && job.method != Method::Inference)
            .map(|s| {
                let drawn = moro_core::estimate::batches::shuffled(
                    &s,
                    job.micro_batch_size,
                    job.seq_len,
                    moro_core::estimate::batches::RUN_BATCHES,
                );
                (drawn, RunOrder::Drawn)
            })
    } else {
        Some((args.batch_lengths.clone(), RunOrder::Given))
    };
    let run = lengths
        .as_ref()
        .and_then(|(l, order)| run_of_batches(&setup, &est, l, *order));
    if lengths.is_some() && run.is_none() {
        crate::output::note(
            "the batches are not replayed: the step trace follows one GPU's full fine-tuning, \
             LoRA and QLoRA of dense models on the hf and trl stacks",
        );
    }
    if let Some(path) = &args.svg {
        crate::output::write_file(path, crate::charts::estimate_svg(&setup, &est).as_bytes())?;
    }
    if let Some(path) = &args.trace {
        write_trace(path, &setup, &args.batch_lengths)?;
    }
    print(args, &setup, &est, run.as_ref())
}

/// A run of micro-batches of `lengths` tokens, replayed ([`moro_core::estimate::batches`]);
/// `None` where the step trace does not follow the job.
fn run_of_batches(
    setup: &crate::setup::JobSetup,
    est: &Estimate,
    lengths: &[u64],
    order: RunOrder,
) -> Option<RunJson> {
    let replayed = moro_core::estimate::batches::run(
        est,
        &setup.model.spec,
        &setup.job,
        &setup.profile,
        lengths,
    )?;
    Some(RunJson {
        batches: lengths.len(),
        order,
        longest_tokens: lengths.iter().copied().max().unwrap_or(0),
        needed_bytes: replayed.needed,
        reserved_bytes: replayed.reserved,
    })
}

/// Writes the job's step trace as JSON lines, or says which jobs are traced.
fn write_trace(
    path: &std::path::Path,
    setup: &crate::setup::JobSetup,
    lengths: &[u64],
) -> Result<()> {
    let (model, job, profile) = (&setup.model.spec, &setup.job, &setup.profile);
    let trace = if lengths.is_empty() {
        moro_core::estimate::trace::for_job(model, job, profile)
    } else {
        moro_core::estimate::trace::over_lengths(model, job, profile, lengths)
    };
    let trace = trace
        .map_err(|e| crate::error::user(e.to_string()))?
        .ok_or_else(|| {
            crate::error::user(
                "--trace: moro traces one-GPU full fine-tuning, LoRA and QLoRA of dense \
                     models on the hf and trl stacks (PEFT's LoRA, or DoRA, IA³, VeRA, LoHa, \
                     LoKr, OFT, LN, prompt or prefix tuning on an unquantized model; AdamW or \
                     8-bit AdamW, the standard loss, TRL's chunked loss or Liger's; no \
                     torch.compile); this job is not one: leave out --trace",
            )
        })?;
    let mut out = String::new();
    for e in &trace.events {
        out.push_str(&serde_json::to_string(e)?);
        out.push('\n');
    }
    crate::output::write_file(path, out.as_bytes())
}

fn load_recipe(args: &EstimateArgs) -> Result<Option<crate::commands::recipe::LoadedRecipe>> {
    args.recipe
        .as_deref()
        .map(crate::commands::recipe::load)
        .transpose()
}

fn model_arg<'a>(
    args: &'a EstimateArgs,
    loaded: Option<&'a crate::commands::recipe::LoadedRecipe>,
) -> Option<&'a str> {
    args.model
        .as_deref()
        .or_else(|| loaded.map(|l| l.recipe.model.base.as_str()))
}

/// The job `args` describe, resolved once (flags over the recipe, the dataset's length),
/// with its notes printed; and the dataset's token lengths, one per sample, when it named
/// one.
pub(crate) fn setup_of(
    args: &EstimateArgs,
    loaded: Option<&crate::commands::recipe::LoadedRecipe>,
) -> Result<(crate::setup::JobSetup, Option<Vec<u32>>)> {
    let model_arg = model_arg(args, loaded);
    let mut given = crate::hw::resolve(args.hardware.as_deref(), args.memory.as_deref())?;
    if let Some(device) = &args.device {
        let target =
            given.or_else(|| loaded.and_then(crate::commands::recipe::LoadedRecipe::target));
        given = Some(crate::hw::on_device(target, *device)?);
    }
    let mut flags = args.job.settings();
    let mut samples = None;
    if let Some(path) = &args.dataset {
        let model = model_arg.ok_or_else(|| {
            crate::error::user(
                "--dataset needs --model (or a recipe): whose tokenizer counts the tokens",
            )
        })?;
        let p = crate::commands::data::parse_percentile(args.percentile)?;
        let m = crate::commands::data::measure(path, model, &args.data, &args.hub)?;
        let tokens = m.at(p).max(1);
        let longer = m.longer_than(tokens);
        crate::output::note(&format!(
            "seq_len {tokens}: the p{} of {} ({} samples, {longer} longer)",
            p.percent_label(),
            path.display(),
            m.sorted.len()
        ));
        flags.seq_len = Some(u64::from(tokens));
        samples = Some(m.sorted);
    }
    if let Some(&longest) = args.batch_lengths.iter().max() {
        match flags.seq_len {
            None => flags.seq_len = Some(longest),
            Some(s) if longest > s => {
                return Err(crate::error::user_hint(
                    format!("--batch-lengths: {longest} tokens is longer than --seq-len {s}"),
                    "leave out --seq-len: it defaults to the longest batch",
                ));
            }
            Some(_) => {}
        }
    }
    let setup = crate::setup::resolve(crate::setup::JobInputs {
        recipe: loaded,
        model: args.model.as_deref(),
        flags: &flags,
        target: given.as_ref(),
        hub: &args.hub,
    })?;
    if let Some(n) = &setup.notes {
        crate::output::note(n);
    }
    Ok((setup, samples))
}

/// Prints the estimate (table or JSON) with suggestions when it does not fit; the exit code
/// says the verdict.
fn print(
    args: &EstimateArgs,
    setup: &crate::setup::JobSetup,
    est: &Estimate,
    run: Option<&RunJson>,
) -> Result<ExitCode> {
    let (model, job, target) = (&setup.model, &setup.job, setup.target.as_ref());
    let memory = target.and_then(crate::hw::Target::memory_bytes);
    let verdict = judge(est, job, memory).verdict;
    let suggestions = match (verdict, target) {
        (Some(Verdict::Uncertain | Verdict::DoesNotFit), Some(t)) => {
            crate::commands::suggest::suggest(&model.id, &model.spec, job, t)
        }
        _ => None,
    };

    let math = setup.profile.sdpa_math_kernel(&model.spec, job);
    if args.json {
        let mut doc = to_json(model, job, est, memory);
        doc.suggestions = suggestions;
        doc.sdpa_math_kernel = math;
        doc.backend = setup.profile.runs_on_mps(job.stack).then_some(Backend::Mps);
        doc.run_of_batches = run;
        stdout(&json(&doc)?)?;
    } else {
        let mut out = render(model, job, est, target, &setup.profile, run);
        if let Some(s) = &suggestions {
            out.push_str(&crate::commands::suggest::text(s));
        }
        stdout(&out)?;
    }
    Ok(match verdict {
        Some(Verdict::Uncertain | Verdict::DoesNotFit) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

pub(crate) fn to_json<'a>(
    model: &'a resolve::Resolved,
    job: &'a Job,
    est: &Estimate,
    memory: Option<u64>,
) -> EstimateJson<'a> {
    let judged = judge(est, job, memory);
    let mut components = serde_json::Map::new();
    for (c, b) in &est.components {
        components.insert(c.as_str().to_owned(), serde_json::Value::from(*b));
    }
    EstimateJson {
        model: ModelJson {
            id: &model.id,
            source: &model.source,
            model_type: &model.spec.model_type,
            parameters: model.spec.total_params(),
            stored_weights: model.stored.as_ref(),
        },
        job,
        peak_allocated_bytes: est.peak_allocated_bytes,
        peak_reserved_bytes: est.peak_reserved_bytes,
        peak_device_bytes: est.peak_device_bytes,
        peak_phase: est.peak_phase.as_str(),
        components,
        phases: est
            .phases
            .iter()
            .map(|p| PhaseJson {
                phase: p.phase.as_str(),
                allocated_bytes: p.total(),
            })
            .collect(),
        total_params: est.total_params,
        trainable_params: est.trainable_params,
        host_bytes: est.host_bytes,
        load_reserved_bytes: est.load_reserved_bytes,
        replayed_fragmentation_bytes: est.replayed_fragmentation_bytes,
        step_segments_bytes: est.step_segments_bytes,
        idle_cache_bytes: est.idle_cache_bytes,
        rank: est.rank,
        fits: judged.verdict.map(|v| v == Verdict::Fits),
        bound: judged,
        memory_bytes: memory,
        headroom_bytes: memory.map(|m| headroom(est, m)),
        suggestions: None,
        sdpa_math_kernel: false,
        backend: None,
        run_of_batches: None,
    }
}

/// The images of a vision-language job, in words: how many, their size, the tokens they add
/// and what trains in the tower; `None` for text models.
pub(crate) fn describe_images(model: &moro_core::model::ModelSpec, job: &Job) -> Option<String> {
    let v = model.vision.as_ref()?;
    let vision = match job.vision {
        moro_core::job::VisionTraining::Frozen => "vision tower frozen",
        moro_core::job::VisionTraining::Adapted => "vision tower adapted",
        moro_core::job::VisionTraining::Trained => "vision tower trained",
    };
    let i = &job.images;
    if i.per_sample == 0 {
        return Some(format!("none (text only), {vision}"));
    }
    let shape = v.tokens.shape(i.width, i.height);
    Some(format!(
        "{} × {}×{} per sample (resized to {}×{}), +{} tokens per sequence, {vision}",
        i.per_sample,
        i.width,
        i.height,
        shape.resized.0,
        shape.resized.1,
        v.added_tokens(i),
    ))
}

fn describe(job: &Job, adapter_bytes: u64) -> String {
    let mut s = job.method.as_str().to_owned();
    if job.quantization != moro_core::job::Quantization::None {
        s.push_str(&format!(" ({})", job.quantization.as_str()));
    }
    let peft = &job.adapter;
    if job.method.is_peft() && peft.method.is_adapter() {
        s.push_str(&format!(", lit-gpt {}", peft.method.as_str()));
    } else if job.method.is_peft() {
        use moro_core::job::PeftKind;
        match peft.method {
            PeftKind::Ia3 | PeftKind::LnTuning => {
                s.push_str(&format!(", PEFT {}", peft.method.as_str()));
            }
            PeftKind::PromptTuning | PeftKind::PrefixTuning => s.push_str(&format!(
                ", PEFT {}, {} virtual tokens",
                peft.method.as_str(),
                peft.virtual_tokens
            )),
            PeftKind::LoKr => s.push_str(&format!(
                ", PEFT lokr r={}, decompose_factor {}",
                peft.rank,
                peft.decompose_factor
                    .map_or_else(|| "-1".to_owned(), |f| f.to_string())
            )),
            PeftKind::Boft => s.push_str(&format!(
                ", PEFT boft blocks of {}, {} butterfly factor{}",
                peft.boft_block_size(),
                peft.boft_butterfly_factor(),
                if peft.boft_butterfly_factor() == 1 {
                    ""
                } else {
                    "s"
                }
            )),
            PeftKind::Vera | PeftKind::AdaLora | PeftKind::LoHa | PeftKind::Oft => {
                s.push_str(&format!(", PEFT {} r={}", peft.method.as_str(), peft.rank));
            }
            _ if peft.dora => s.push_str(&format!(", DoRA r={}", peft.rank)),
            _ => s.push_str(&format!(", r={}", peft.rank)),
        }
    }
    if job.method == Method::Inference {
        match job.target_len {
            Some(t) => s.push_str(&format!(
                ", batch {}, source {} → {t} new tokens",
                job.micro_batch_size, job.seq_len
            )),
            None => s.push_str(&format!(
                ", batch {}, context {}",
                job.micro_batch_size,
                job.tokens_in_words()
            )),
        }
    } else {
        let tokens = job.tokens_in_words();
        s.push_str(&format!(
            ", micro-batch {} × {tokens} tokens, grad-accum {}, {}, {} ({}){}",
            job.micro_batch_size,
            job.grad_accum,
            job.optimizer.as_str(),
            job.precision.as_str(),
            job.precision_in_words(adapter_bytes),
            job.checkpointing_in_words(),
        ));
    }
    s.push_str(&format!(
        ", {} attention, stack {}",
        job.attention.as_str(),
        job.stack.as_str()
    ));
    if job.liger.any() {
        s.push_str(&format!(", Liger ({})", job.liger.names().join(", ")));
    }
    if job.compile {
        s.push_str(", torch.compile");
    }
    if job.parallel.gpus() > 1 {
        s.push_str(&format!(
            ", {} GPUs ({})",
            job.parallel.gpus(),
            crate::commands::recipe::layout_of(job).strategy_text()
        ));
    }
    s
}

/// `profile`: the target's device profile (its backend, whether the job's attention runs
/// SDPA's math kernel there: [`DeviceProfile::sdpa_math_kernel`]).
pub(crate) fn render(
    model: &resolve::Resolved,
    job: &Job,
    est: &Estimate,
    target: Option<&crate::hw::Target>,
    profile: &DeviceProfile,
    run: Option<&RunJson>,
) -> String {
    let math_kernel = profile.sdpa_math_kernel(&model.spec, job);
    let mps = profile.runs_on_mps(job.stack);
    let mut out = String::new();
    #[allow(clippy::cast_precision_loss)]
    let params_b = model.spec.total_params() as f64 / 1e9;
    out.push_str(&format!(
        "model   {} ({}, {params_b:.2}B parameters, from {})\n",
        model.id, model.spec.model_type, model.source
    ));
    if let Some(w) = &model.stored {
        out.push_str(&format!("stored  {}\n", resolve::describe_stored(w)));
    }
    out.push_str(&format!(
        "job     {}\n",
        describe(job, est.regime.adapter_bytes)
    ));
    if math_kernel {
        let why = if mps {
            "on Apple's MPS, training runs SDPA's math kernel"
        } else {
            "this GPU has no SDPA flash kernel: the attention runs SDPA's math kernel"
        };
        let traced = if moro_core::estimate::layers_op_by_op(&model.spec, job, &est.regime) {
            "traced op by op"
        } else {
            "which this estimate leaves out for this job: expect more"
        };
        out.push_str(&format!(
            "note    {why} (fp32 scores and softmax), {traced}\n"
        ));
    }
    if let Some(images) = describe_images(&model.spec, job) {
        out.push_str(&format!("images  {images}\n"));
    }
    if model.spec.seq2seq.is_some() {
        let decoder = if job.method == Method::Inference {
            "tokens generated"
        } else {
            "target tokens into the decoder"
        };
        out.push_str(&format!(
            "tokens  {} into the encoder, {} {decoder}{}; {}\n",
            job.seq_len,
            job.target_tokens(),
            if job.target_len.is_none() {
                " (as many as the encoder's: --target-len sets them)"
            } else {
                ""
            },
            if job.padding == moro_core::job::Padding::Padded {
                "padded batches, with an attention mask"
            } else if job.method == Method::Inference {
                "no padding mask (--padded when the batch's prompts are padded)"
            } else {
                "no padding mask (--padded when batches are padded, as DataCollatorForSeq2Seq \
                 pads them)"
            }
        ));
    }
    out.push_str(&format!(
        "peak    at {} (trainable parameters: {})\n\n",
        est.peak_phase.as_str(),
        est.trainable_params
    ));
    let mut t = Table::new(&["component", "GiB", "share"], &[false, true, false]);
    let total = est.peak_device_bytes.max(1);
    for (c, b) in &est.components {
        if *b == 0 {
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        let frac = *b as f64 / total as f64;
        t.row(vec![c.as_str().replace('_', " "), gib(*b), bar(frac, 24)]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let judged = judge(est, job, target.and_then(crate::hw::Target::memory_bytes));
    let mut lv = Table::new(
        &["level", "GiB", "at most", "what reports it"],
        &[false, true, true, false],
    );
    if job.stack.profile().runtime == moro_core::stack::Runtime::Mlx {
        // MLX reports one level: its live buffers (no cache, no context).
        lv.row(vec![
            "active".into(),
            gib(est.peak_allocated_bytes),
            gib(judged.upper.device),
            "mx.get_peak_memory() (mlx_lm's \"Peak mem\", in GB of 10^9)".into(),
        ]);
    } else {
        // torch 2.15 has no peak counters under `torch.mps`; `torch.accelerator` reads the
        // MPS allocator's.
        let [allocated, reserved, device] = if mps {
            [
                "torch.accelerator.max_memory_allocated()",
                "torch.accelerator.max_memory_reserved()",
                "torch.mps.driver_allocated_memory() (with Metal's own buffers)",
            ]
        } else {
            [
                "torch.cuda.max_memory_allocated()",
                "torch.cuda.max_memory_reserved()",
                "nvidia-smi",
            ]
        };
        lv.row(vec![
            "allocated".into(),
            gib(est.peak_allocated_bytes),
            gib(judged.upper.allocated),
            allocated.into(),
        ]);
        lv.row(vec![
            "reserved".into(),
            gib(est.peak_reserved_bytes),
            gib(judged.upper.reserved),
            reserved.into(),
        ]);
        lv.row(vec![
            "device".into(),
            gib(est.peak_device_bytes),
            gib(judged.upper.device),
            device.into(),
        ]);
    }
    out.push_str(&lv.render());
    out.push_str(&format!(
        "at most: the bound on each level, at or above {}\n",
        band_text(&judged.band)
    ));
    if mps {
        out.push_str(
            "         (runs on CUDA GPUs: no published run on MPS states its peak with its \
             settings)\n",
        );
    }
    if let Some(rank) = &est.rank {
        out.push_str(&render_rank(rank, est));
    }
    if est.host_bytes > 0 {
        let ranks = job.parallel.gpus();
        if ranks > 1 {
            out.push_str(&format!(
                "\nhost memory for offload: {} per GPU process, {} for all {ranks} \
                 (on the nodes that run them)\n",
                size(est.host_bytes),
                size(est.host_bytes_per_node(ranks))
            ));
        } else {
            out.push_str(&format!(
                "\nhost memory for offload: {}\n",
                size(est.host_bytes)
            ));
        }
    }
    // The replay is named where it sets the reserve (it is a floor under the others).
    let replay_sets_reserve = est.replayed_fragmentation_bytes > 0
        && est.replayed_fragmentation_bytes + (2 << 20)
            >= est.component(Component::AllocatorReserve);
    if replay_sets_reserve && mps {
        out.push_str(&format!(
            "\nnote: the reserve is {}: two training steps replayed through PyTorch's MPS \
             allocator, which places tensors in Metal heaps of 8 MiB, 32 MiB and 1 GiB (a \
             tensor of 512 MiB or more in one of its own) and keeps them\n",
            size(est.replayed_fragmentation_bytes)
        ));
    } else if replay_sets_reserve && job.new_tokens.is_some() {
        out.push_str(&format!(
            "\nnote: the reserve is {}: the prefill and every decode step replayed through \
             PyTorch's caching allocator, each layer's keys and values grown a token a step by \
             `torch.cat`\n",
            size(est.replayed_fragmentation_bytes)
        ));
    } else if replay_sets_reserve {
        let why = if est.reserve_from_replay {
            "the layers, traced op by op, free temporaries whose blocks later tensors split"
        } else if job.method == Method::Full {
            "the optimizer's states take the blocks the first backward freed"
        } else if job.adapter.dora {
            "DoRA's weight-sized temporaries, made in every forward, are split by smaller \
             tensors"
        } else {
            "each 4-bit Linear's dequantized weight is freed and split by smaller tensors"
        };
        let is = if est.reserve_from_replay {
            "is"
        } else {
            "is at least"
        };
        out.push_str(&format!(
            "\nnote: the reserve {is} {}, the fragmentation of two training steps replayed \
             through PyTorch's caching allocator ({why})\n",
            size(est.replayed_fragmentation_bytes)
        ));
    } else if job.method == Method::Full
        && job.parallel.sharding == Sharding::None
        && est.replayed_fragmentation_bytes == 0
    {
        // validation/h200: before the replay, the reserved peak of full fine-tunes came in
        // 4–15 % above the ratio model's (the allocated peak did not).
        out.push_str(
            "\nnote: full fine-tunes fragment PyTorch's cache more than this reserve shows \
             (up to 15 % more reserved on an H200); keep headroom, or `moro calibrate`\n",
        );
    }
    if job.new_tokens.is_some()
        && moro_core::estimate::trace::generate::cache_grows_by_copy(job)
        && !est.reserve_from_replay
        && !mps
    {
        out.push_str(&format!(
            "\nnote: the decode steps are summed by formulas, not replayed (the generation trace \
             follows Llama, Mistral and Qwen2/3 models on one GPU with transformers' cache, up \
             to {} layers × generated tokens): blocks the growing keys and values leave in \
             PyTorch's cache are not counted\n",
            thousands(moro_core::estimate::trace::generate::MAX_LAYER_STEPS)
        ));
    }
    if est.idle_cache_bytes >= 64 << 20 {
        // On a known GPU the cache can keep them only up to its memory.
        let room = target
            .and_then(crate::hw::Target::memory_bytes)
            .map(|m| m.saturating_sub(est.peak_device_bytes));
        let shown = room.map_or(est.idle_cache_bytes, |r| r.min(est.idle_cache_bytes));
        let on = if room.is_some() { " on this GPU" } else { "" };
        out.push_str(&format!(
            "\nnote: the growing keys and values leave {} of old blocks wholly free; PyTorch keeps \
             them cached while the GPU has room (max_memory_reserved and nvidia-smi then show up \
             to {} more{on}) and returns them when memory runs short\n",
            size(est.idle_cache_bytes),
            size(shown)
        ));
    }
    if job.method != Method::Inference
        && job.padding.has_mask()
        && !mps
        && job.stack.profile().runtime == moro_core::stack::Runtime::Torch
    {
        // docs/memory-anatomy.md §17: a replay of shuffled lengths, held to the fake-CUDA
        // oracle; `tests/varying_lengths.rs` holds one GPU's runs under the bound.
        let bound = if job.parallel.gpus() == 1 && job.parallel.sharding == Sharding::None {
            "; what partly used blocks add (a few percent) is within \"at most\""
        } else {
            ""
        };
        out.push_str(&format!(
            "\nnote: where padded batches differ in length over a run (TRL, axolotl and \
             LLaMA-Factory pad each to its longest sample), PyTorch keeps the blocks shorter \
             batches left, so max_memory_reserved and nvidia-smi climb above the reserved level \
             here, toward the GPU's memory, and it returns wholly free ones before it runs \
             out{bound} (docs/memory-anatomy.md §17)\n"
        ));
    }
    if est.step_segments_bytes > 0 {
        out.push_str(&format!(
            "\nnote: the optimizer step's temporaries need {} of new segments no cached block \
             holds, on top of what the forward and backward reserved\n",
            size(est.step_segments_bytes)
        ));
    }
    if est.load_reserved_bytes > 0 && est.load_reserved_bytes >= est.peak_reserved_bytes {
        let what = if job.parallel.sharding == Sharding::Zero3 {
            "DeepSpeed ZeRO-3's engine setup and optimizer step left in PyTorch's cache \
             (its flat fp32 partitions, optimizer states and step buffers)"
        } else {
            "loading the model left in PyTorch's cache (torchtune's NF4 build with \
             torchao < 0.2)"
        };
        out.push_str(&format!(
            "\nnote: the reserved level ({}) is what {what}; the step's tensors need less\n",
            size(est.load_reserved_bytes)
        ));
    }
    if est.component(Component::OutsideAllocator) > 0 {
        let distributed = job.parallel.gpus() > 1 || job.parallel.sharding != Sharding::None;
        let paged = job.method != Method::Inference && job.optimizer.is_paged();
        let what = match (paged, distributed) {
            (true, true) => "paged optimizer states and NCCL buffers sit",
            (true, false) => "paged optimizer states sit",
            _ => "NCCL buffers sit",
        };
        out.push_str(&format!(
            "\nnote: {what} outside PyTorch's allocator: nvidia-smi shows them, torch.cuda \
             counters do not\n"
        ));
    }
    if let Some(r) = run {
        let fits = judged.verdict == Some(Verdict::Fits);
        out.push_str(&run_text(
            r,
            est,
            target
                .and_then(crate::hw::Target::memory_bytes)
                .filter(|_| fits),
        ));
    }
    if let Some(t) = target
        && let Some(m) = t.memory_bytes()
    {
        out.push_str(&format!(
            "\n{}\n",
            verdict_text(&judged, est, &t.display(), m)
        ));
    }
    out
}

/// The per-rank section of a sharded job: its bytes by part, and the loading floor of a
/// script that puts the whole model on each GPU before wrapping.
fn render_rank(rank: &moro_core::estimate::rank::RankParts, est: &Estimate) -> String {
    let mut t = Table::new(&["per rank", "GiB", "what"], &[false, true, false]);
    let mut row = |name: &str, bytes: u64, what: String| {
        if bytes > 0 {
            t.row(vec![name.to_owned(), gib(bytes), what]);
        }
    };
    row(
        "weights shard",
        rank.weights_shard,
        if rank.shard_group > 1 {
            format!("this rank's 1/{} of the parameters", rank.shard_group)
        } else {
            "every parameter (not sharded by this strategy)".to_owned()
        },
    );
    row(
        "replicated",
        rank.replicated,
        "4-bit quantization states: not parameters, kept whole on every rank".to_owned(),
    );
    row(
        "gathered layers",
        rank.gathered_layers,
        "the running unit, and the next where FSDP has prefetched it by the peak".to_owned(),
    );
    row(
        "gathered root",
        rank.gathered_root,
        "embeddings, final norm and lm_head, gathered from forward to backward's end".to_owned(),
    );
    row(
        "gradient assembly",
        rank.grad_assembly,
        "a unit's gradient before its reduce-scatter, in backward".to_owned(),
    );
    row(
        "held layer inputs",
        rank.held_recomputed_inputs,
        "finished layers' checkpoints and input gradients FSDP1's hooks keep to backward's \
         end (reentrant checkpointing, transformers < 4.52)"
            .to_owned(),
    );
    row(
        "  on all-gather stream",
        rank.all_gather_stream,
        "of the above, in blocks FSDP's all-gather stream made at the peak".to_owned(),
    );
    row(
        "  on pre-unshard stream",
        rank.pre_unshard_stream,
        "of the above, the gathered units' shards copied back from the host (CPU offload)"
            .to_owned(),
    );
    row(
        "  on reduce-scatter stream",
        rank.reduce_scatter_stream,
        "of the above, the sharded gradients FSDP's reduce-scatter stream made".to_owned(),
    );
    row(
        "stream-held cache",
        rank.stream_cached,
        "cached by FSDP's streams and not in use at the peak (last step's gradients, \
         gathered units): reserved, and no other stream can use it"
            .to_owned(),
    );
    let mut out = format!("\n{}", t.render());
    if rank.whole_model_load > 0 {
        let floor = if rank.whole_model_load > est.peak_allocated_bytes {
            ", more than the step's peak"
        } else {
            ""
        };
        out.push_str(&format!(
            "loading: the model is sharded as it is wrapped (rank 0 loads it on the host); a \
             script that loads it whole onto each GPU first holds {} there{floor}\n",
            size(rank.whole_model_load)
        ));
    }
    out
}
