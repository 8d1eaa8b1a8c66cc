//! `moro run`: runs a training command from a moro.yaml and heals it when it runs out of
//! memory.
//!
//! This module is the wiring only: it reads the recipe, resolves the model and the memory
//! budget, and hands `moro-supervise` the hooks it needs (the estimator, the moro.yaml writer,
//! the trainer-config writer). The supervisor streams the child's output, walks the heal
//! ladder, writes `moro.healed.yaml` and `.moro/heal.jsonl`, and reports; `moro run` exits with
//! the child's final exit code.

use std::cell::Cell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::Job;
use moro_core::model::ModelSpec;
use moro_core::units::human;
use moro_export::{Format, Options as ExportOptions};
use moro_recipe::Recipe;
use moro_supervise::{HookError, Hooks, ResumeFlag, RunOptions};

use crate::error::{UserError, user, user_hint};
use crate::hw::Target;
use crate::resolve;

/// Heals when `--max-heals` is not given and the recipe sets `training.auto_heal: true`.
const DEFAULT_MAX_HEALS: u32 = 5;

/// Arguments of `moro run`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    moro run -- python train.py --config {recipe}\n  \
    moro run --memory 24GiB --output-dir out --resume-flag hf -- python train.py {recipe}\n\n\
    `{recipe}` in the command becomes the recipe of the current attempt (yours, then \
    moro.healed.yaml); `{config}` the exported trainer file (with --to). Both are also in \
    MORO_RECIPE and MORO_CONFIG.")]
pub(crate) struct RunArgs {
    /// The recipe to train from. Never written: heals go to moro.healed.yaml beside it.
    #[arg(long, short, default_value = "moro.yaml", value_name = "PATH")]
    pub(crate) recipe: PathBuf,
    /// Export the recipe for this trainer (axolotl, llamafactory, trl, hf-trainer, unsloth,
    /// deepspeed, accelerate) into .moro/ beside the recipe: `{config}` and MORO_CONFIG name
    /// it; heals write `<name>.healed.<ext>` there.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) to: Option<String>,
    /// Most heals before giving up; 0 only detects and reports. Default: 5 when the recipe
    /// sets `training.auto_heal: true`, else 0.
    #[arg(long, value_name = "N")]
    pub(crate) max_heals: Option<u32>,
    /// Memory per GPU for the predictions (`24GiB`, `80GB`). Default: the detected GPU.
    #[arg(
        long,
        value_name = "SIZE",
        conflicts_with = "hardware",
        allow_hyphen_values = true
    )]
    pub(crate) memory: Option<String>,
    /// Hardware for the predictions: a preset (`rtx-4090`), a GPU name, `detect`.
    #[arg(long, value_name = "SPEC")]
    pub(crate) hardware: Option<String>,
    /// Do not probe the GPUs: without --memory/--hardware there is no budget, and each heal
    /// takes one step down the ladder.
    #[arg(long, conflicts_with_all = ["memory", "hardware"])]
    pub(crate) no_detect: bool,
    /// The trainer's output directory, where `checkpoint-N` appear (resume after a heal);
    /// also written into the healed recipe and the export. Default: the recipe's
    /// `training.output_dir`, else (with --to) the export's.
    #[arg(long, value_name = "DIR")]
    pub(crate) output_dir: Option<PathBuf>,
    /// The dataset's 99th-percentile sample length in tokens (where to cut max_seq_length)
    /// [default: the recipe's `data.p99_tokens`, from `recipe generate --dataset`].
    #[arg(long, value_name = "TOKENS")]
    pub(crate) dataset_p99: Option<u64>,
    /// How the trainer resumes from a checkpoint: hf (`--resume_from_checkpoint DIR`),
    /// axolotl (`--resume_from_checkpoint=DIR`), llamafactory (`resume_from_checkpoint=DIR`),
    /// none. Default: axolotl / llamafactory with that --to, else none.
    #[arg(long, value_name = "FLAG", value_parser = ["hf", "axolotl", "llamafactory", "none"])]
    pub(crate) resume_flag: Option<String>,
    /// The training command, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// Everything the hooks need, resolved before the run starts.
struct Prepared {
    recipe: Recipe,
    job: Job,
    spec: ModelSpec,
    device: DeviceProfile,
    budget: Option<u64>,
    /// The job takes Liger's kernels on this hardware ([`takes_liger`]).
    liger_heal: bool,
}

pub(crate) fn run(args: &RunArgs) -> Result<ExitCode> {
    if args.command.is_empty() {
        return Err(user_hint(
            "no command to run",
            "give it after `--`, e.g. `moro run -- python train.py {recipe}`",
        ));
    }
    let format = args.to.as_deref().map(parse_format).transpose()?;
    let prepared = prepare(args)?;
    let resume = match args.resume_flag.as_deref() {
        Some(flag) => resume_flag(flag),
        None => format.map_or(ResumeFlag::None, format_resume_flag),
    };
    let output_dir = args
        .output_dir
        .as_ref()
        .map(|d| d.to_string_lossy().into_owned())
        .or_else(|| prepared.recipe.training.output_dir.clone())
        .filter(|d| !d.is_empty())
        .or_else(|| format.map(|_| moro_export::default_output_dir(&prepared.recipe)));
    let max_heals = args
        .max_heals
        .unwrap_or(if prepared.recipe.training.auto_heal {
            DEFAULT_MAX_HEALS
        } else {
            0
        });

    let mut opts = RunOptions::new(
        args.command.clone(),
        args.recipe.clone(),
        prepared.job.clone(),
    );
    opts.resume = resume;
    opts.output_dir = output_dir.as_deref().map(PathBuf::from);
    opts.budget = prepared.budget;
    let data = prepared.recipe.data.as_ref();
    opts.dataset_p99 = args.dataset_p99.or_else(|| data.map(|d| d.p99_tokens));
    opts.dataset_shorter = data
        .map(|d| [d.p95_tokens, d.p90_tokens].into_iter().flatten().collect())
        .unwrap_or_default();
    opts.max_heals = max_heals;
    // Unsloth's export drops Liger for its own kernels: turning it on would heal nothing.
    opts.liger_heal = format != Some(Format::Unsloth) && prepared.liger_heal;
    opts.correction =
        crate::profile::config_dir().map(|d| d.join(crate::profile::CORRECTIONS_FILE));
    opts.config = format.map(|f| opts.journal.with_file_name(f.default_file_name()));

    say_plan(args, &prepared, &opts);

    // With an export, the trainer writes where the first attempt's config said, whatever the
    // heals change (the export's default output_dir names the method, which level 4 changes).
    let pinned_output_dir = if format.is_some() {
        output_dir.clone()
    } else {
        args.output_dir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned())
    };
    let recipe_for = |job: &Job| {
        healed_recipe(
            &prepared.recipe,
            &args.recipe,
            job,
            pinned_output_dir.as_deref(),
        )
    };
    let estimate_hook = |job: &Job| predict(&prepared.spec, job, &prepared.device);
    let header = healed_header(&args.recipe);
    let render_recipe = |job: &Job| -> Result<Vec<u8>, HookError> {
        Ok(moro_recipe::to_yaml(&recipe_for(job), &header).into_bytes())
    };
    let warned = Cell::new(false);
    let config_dir = opts
        .config
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let render_config = |job: &Job| -> Result<Vec<u8>, HookError> {
        let Some(format) = format else {
            return Err("no trainer format chosen".into());
        };
        render_export(
            format,
            &recipe_for(job),
            &prepared.spec,
            &config_dir,
            &warned,
        )
    };
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    let hooks = Hooks {
        estimate: &estimate_hook,
        render_recipe: &render_recipe,
        render_config: format.map(|_| &render_config as &dyn Fn(&Job) -> _),
        stdout: &mut stdout,
        stderr: &mut stderr,
    };
    let report = moro_supervise::run(opts, hooks).map_err(supervise_error)?;
    if max_heals == 0
        && args.max_heals.is_none()
        && matches!(report.end, moro_supervise::End::GaveUp { .. })
    {
        say(
            &mut std::io::stderr(),
            "hint: set `training.auto_heal: true` in the recipe, or pass --max-heals N, to let \
             moro heal out-of-memory failures",
        );
    }
    Ok(exit_code(report.exit_code))
}

/// The trainer config for `recipe`: the main file's bytes. Companion files (DeepSpeed JSON,
/// accelerate YAML) are written into `dir`, where the main file refers to them by name; the
/// export's warnings are printed once.
fn render_export(
    format: Format,
    recipe: &Recipe,
    spec: &ModelSpec,
    dir: &Path,
    warned: &Cell<bool>,
) -> Result<Vec<u8>, HookError> {
    let export = moro_export::export(format, recipe, Some(spec), &ExportOptions::default())
        .map_err(|e| format!("--to {format}: {e}"))?;
    if !warned.replace(true) {
        let mut err = std::io::stderr();
        for w in &export.warnings {
            say(&mut err, &format!("warning: --to {format}: {w}"));
        }
    }
    let mut files = export.files.into_iter();
    let main = files
        .next()
        .ok_or_else(|| format!("--to {format}: the export wrote no file"))?;
    for companion in files {
        let path = dir.join(&companion.name);
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
        moro_supervise::journal::write_atomic(&path, companion.content.as_bytes())
            .map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    }
    Ok(main.content.into_bytes())
}

/// Reads the recipe, resolves the model and the budget, and checks the job against the model.
fn prepare(args: &RunArgs) -> Result<Prepared> {
    let path = &args.recipe;
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| {
        let err = user(format!("cannot read the recipe `{shown}`: {e}"));
        if e.kind() == std::io::ErrorKind::NotFound && args.recipe == Path::new("moro.yaml") {
            user_hint(
                format!("cannot read the recipe `{shown}`: {e}"),
                "pass --recipe PATH, or write one with `moro recipe`",
            )
        } else {
            err
        }
    })?;
    let loaded = crate::commands::recipe::LoadedRecipe::from_bytes(shown, &bytes)?;
    // The budget: --memory/--hardware, else the detected GPU, else the recipe's `hardware:`.
    let given = budget_target(args)?;
    let setup = crate::setup::resolve(crate::setup::JobInputs {
        recipe: Some(&loaded),
        model: None,
        flags: &moro_core::job::JobSettings::default(),
        target: given.as_ref(),
        hub: &resolve::HubArgs::default(),
    })?;
    if let Some(notes) = &setup.notes {
        let mut err = std::io::stderr();
        for line in notes.lines() {
            say(&mut err, line);
        }
    }
    // The job must make sense for this model before anything starts.
    if let Err(e) = estimate(&setup.model.spec, &setup.job, &setup.profile) {
        return Err(loaded.job_error(&e));
    }
    let mut device = setup.profile;
    // What moro-supervise reads as its margin (a flat file) is taken back out of the
    // profile, so that it counts once.
    if let Some(dir) = crate::profile::config_dir() {
        let corrections = dir.join(crate::profile::CORRECTIONS_FILE);
        if let Ok(Some(c)) = moro_supervise::journal::read_correction(&corrections) {
            let margin = i64::try_from(c.max_under_prediction_bytes).unwrap_or(i64::MAX);
            device.offset_bytes = device.offset_bytes.saturating_sub(margin);
        }
    }
    let budget = setup.target.as_ref().and_then(Target::memory_bytes);
    let gpu = setup
        .target
        .as_ref()
        .and_then(|t| t.hardware.devices.first());
    let liger_heal = takes_liger(&setup.model.spec, &setup.job, gpu);
    Ok(Prepared {
        recipe: loaded.recipe,
        job: setup.job,
        spec: setup.model.spec,
        device,
        budget,
        liger_heal,
    })
}

/// `--memory` / `--hardware`, else the detected GPU (unless `--no-detect`).
fn budget_target(args: &RunArgs) -> Result<Option<Target>> {
    if let Some(t) = crate::hw::resolve(args.hardware.as_deref(), args.memory.as_deref())? {
        return Ok(Some(t));
    }
    if args.no_detect {
        return Ok(None);
    }
    let found = moro_gpu::detect(&moro_gpu::DetectOptions::default());
    if found.hardware.is_empty() {
        return Ok(None);
    }
    Ok(Some(Target {
        hardware: found.hardware,
        detected: true,
        spec: "detect".to_owned(),
    }))
}

/// Whether `job` takes Liger's kernels, all of them, on `gpu` (its stack patches
/// transformers' modules, liger-kernel patches the model, its loss is Liger's or unset, and
/// Triton runs on the GPU): then the heal ladder may turn them on.
fn takes_liger(spec: &ModelSpec, job: &Job, gpu: Option<&moro_core::hardware::Device>) -> bool {
    let mut with = job.clone();
    with.liger = moro_core::job::Liger::ALL;
    with.validate(spec).is_ok() && moro_core::job::against::check(&with, spec, gpu).is_ok()
}

/// The upper bound on the device peak of `job` (`None` when the estimator cannot say): the
/// heal ladder judges a rung on it, as every "fits" is judged ([`moro_core::bound`]).
fn predict(spec: &ModelSpec, job: &Job, device: &DeviceProfile) -> Option<u64> {
    estimate(spec, job, device)
        .ok()
        .map(|e| moro_core::bound::Table::builtin().upper_of(&e, job).device)
}

/// The recipe of a healed job: the user's name, model id, hyper-parameters and hardware
/// section, with every setting of the job written out.
fn healed_recipe(original: &Recipe, path: &Path, job: &Job, output_dir: Option<&str>) -> Recipe {
    let name = original.name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let mut extras = original.extras();
    if let Some(dir) = output_dir {
        extras.output_dir = Some(dir.to_owned());
    }
    let mut healed = Recipe::from_job(name, original.model.base.clone(), job, extras);
    healed.hardware.clone_from(&original.hardware);
    healed
}

fn healed_header(recipe: &Path) -> String {
    format!(
        "Written by `moro run` after an out-of-memory failure: `{}` with the heals in \
         .moro/heal.jsonl applied.\nYour recipe is unchanged; copy this file over it to keep \
         the healed settings.",
        recipe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    )
}

fn resume_flag(flag: &str) -> ResumeFlag {
    match flag {
        "hf" => ResumeFlag::HfTrainer,
        "axolotl" => ResumeFlag::Axolotl,
        "llamafactory" => ResumeFlag::LlamaFactory,
        _ => ResumeFlag::None,
    }
}

/// How the trainer of an export resumes: axolotl and LLaMA-Factory take a flag on their command
/// line; the scripts and JSON files of the other formats do not read one.
fn format_resume_flag(format: Format) -> ResumeFlag {
    match format {
        Format::Axolotl => ResumeFlag::Axolotl,
        Format::Llamafactory => ResumeFlag::LlamaFactory,
        _ => ResumeFlag::None,
    }
}

fn parse_format(s: &str) -> Result<Format> {
    Format::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Format::ALL.iter().map(|f| f.as_str()).collect();
        user(format!(
            "--to: unknown format `{s}`; expected one of {}",
            names.join(", ")
        ))
    })
}

/// Errors that keep the first attempt from starting.
fn supervise_error(e: moro_supervise::Error) -> anyhow::Error {
    match e {
        // Like a shell: a command that cannot be started is 127.
        moro_supervise::Error::Spawn { .. } => {
            let mut u = UserError::new(e.to_string());
            u.code = 127;
            anyhow::Error::new(u)
        }
        moro_supervise::Error::NoConfig => user_hint(
            "the command uses `{config}` but no trainer format was chosen",
            "pass --to FORMAT, or use `{recipe}` for the moro.yaml itself",
        ),
        other => user(other.to_string()),
    }
}

fn exit_code(code: i32) -> ExitCode {
    u8::try_from(code).map_or(ExitCode::FAILURE, ExitCode::from)
}

fn say(w: &mut dyn std::io::Write, msg: &str) {
    let _ = writeln!(w, "moro: {msg}");
}

/// One or two lines before the run: what is predicted and how healing is set up.
fn say_plan(args: &RunArgs, p: &Prepared, opts: &RunOptions) {
    let mut err = std::io::stderr();
    let predicted = predict(&p.spec, &p.job, &p.device);
    let mut line = format!("{}: {}", args.recipe.display(), p.recipe.model.base);
    match (predicted, p.budget) {
        (Some(pred), Some(b)) => {
            let verdict = if pred <= b { "fits" } else { "does not fit" };
            line.push_str(&format!(
                "; predicted peak {} of {} ({verdict})",
                human(pred),
                human(b)
            ));
        }
        (Some(pred), None) => {
            line.push_str(&format!(
                "; predicted peak {} (no memory budget known)",
                human(pred)
            ));
        }
        _ => {}
    }
    say(&mut err, &line);
    let heal = if opts.max_heals == 0 {
        "auto-heal off".to_owned()
    } else {
        format!("auto-heal on (at most {} heals)", opts.max_heals)
    };
    let resume = match (&opts.output_dir, opts.resume) {
        (_, ResumeFlag::None) => String::new(),
        (Some(d), _) => format!("; resumes from checkpoints in `{}`", d.display()),
        (None, _) => "; no --output-dir, so heals restart from the start".to_owned(),
    };
    let data = match (opts.dataset_p99, opts.max_heals) {
        (Some(p99), 1..) => {
            let lower: Vec<String> = opts.dataset_shorter.iter().map(u64::to_string).collect();
            let source = if args.dataset_p99.is_some() {
                "--dataset-p99"
            } else {
                "the recipe's data:"
            };
            if lower.is_empty() {
                format!(
                    "; a shorter max_seq_length keeps the dataset's p99 of {p99} tokens ({source})"
                )
            } else {
                format!(
                    "; a shorter max_seq_length keeps the dataset's p99 of {p99} tokens, then its \
                     p95/p90 lengths {} ({source})",
                    lower.join("/")
                )
            }
        }
        _ => String::new(),
    };
    say(&mut err, &format!("{heal}{resume}{data}"));
}
