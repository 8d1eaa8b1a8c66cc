//! `moro recipe generate` and `moro recipe check`: the zero-OOM recipe, and the CI gate.
//!
//! The search is `moro_core::search` (pure); this module resolves the model and hardware,
//! turns the winner into a moro.yaml ([`build_recipe`]), writes it atomically, and, when
//! nothing fits, looks for what would: a smaller model of the same family, a GPU with more
//! memory, more GPUs ([`alternatives`](fn@alternatives)). [`load`] and
//! [`LoadedRecipe::target`] are shared with `moro estimate FILE`.

mod alternatives;
mod build;
mod from_data;
mod json;
mod loaded;
mod target;
mod text;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::bound::JobClass;
use moro_core::job::{JobSettings, Method, Stack};
use moro_core::search::{
    Caps, MethodChoice, Objective, Outcome, Request, Space, margin_rule, search,
};

pub(crate) use alternatives::{
    Alternatives, FIT_GPU_COUNTS, alternatives, alternatives_text, best_fitting, best_of,
    run_search,
};
pub(crate) use build::build_recipe;
pub(crate) use loaded::{LoadedRecipe, load};
pub(crate) use target::{
    caps_of, caps_of_device, exact_cluster, layout_of, parse_host_memory, resolve_target,
};
pub(crate) use text::describe;

use crate::error::{user, user_hint};
use crate::hw::Target;
use crate::jobargs::parse_stack;
use crate::output::{Table, gib, json, note, stdout};
use crate::resolve;
use build::headroom;
use from_data::size_from_data;
use json::{CandidateJson, CheckJson, GenerateJson};
use text::{header, rule, summary_text};

fn parse_method_choice(s: &str) -> Result<MethodChoice, String> {
    match MethodChoice::parse(s) {
        Some(MethodChoice::Only(Method::Inference)) => Err(
            "a recipe trains: use auto, full, lora or qlora (`moro fit --method inference` sizes serving)"
                .to_owned(),
        ),
        None => Err(format!("unknown method `{s}`; use auto, full, lora or qlora")),
        Some(choice) => Ok(choice),
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
    /// PyTorch's device backend: cuda or mps (Apple GPUs; `--device mps --hardware 24GiB` is
    /// an Apple GPU that may use 24 GiB) [default: the hardware's]
    #[arg(long, value_name = "BACKEND", value_parser = crate::jobargs::parse_backend)]
    pub(crate) device: Option<moro_core::estimate::Backend>,
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
    /// Target tokens per sample of an encoder-decoder model (T5, mT5): the decoder's labels;
    /// --seq-len is the encoder's [default: the sequence length].
    #[arg(long, visible_alias = "max-target-length", value_parser = parse_positive)]
    pub(crate) target_len: Option<u64>,
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
    /// PyTorch's device backend: cuda or mps [default: the hardware's].
    #[arg(long, value_name = "BACKEND", value_parser = crate::jobargs::parse_backend)]
    pub(crate) device: Option<moro_core::estimate::Backend>,
    /// Print one JSON object (sizes in bytes) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run_generate(args: &GenerateArgs) -> Result<ExitCode> {
    let model = resolve::model(&args.model)?;
    let (mut target, cluster) = resolve_target(&args.hardware)?;
    if let Some(device) = &args.device {
        target = crate::hw::on_device(Some(target), *device)?;
    }
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
        target_len: args.target_len,
        workers: super::workers(),
    };
    if args.target_len.is_some() && model.spec.seq2seq.is_none() {
        return Err(user_hint(
            format!(
                "--target-len applies to encoder-decoder models (t5, mt5); `{}` reads one \
                 sequence",
                model.id
            ),
            "drop it, and size --seq-len",
        ));
    }
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
        space.size(),
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
                method: moro_core::job::Method::Adapters,
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

pub(crate) fn run_check(args: &CheckArgs) -> Result<ExitCode> {
    let loaded = load(&args.file)?;
    let mut given = match args.hardware.as_deref() {
        Some(h) => crate::hw::resolve(Some(h), None)?,
        None => None,
    };
    if let Some(device) = &args.device {
        given = Some(crate::hw::on_device(
            given.or_else(|| loaded.target()),
            *device,
        )?);
    }
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
