//! `moro recipe export`: a moro.yaml in a trainer's own format.
//!
//! The conversion is `moro_export::export` (pure); this module reads the recipe, looks the
//! base model up in the embedded catalog (for LoRA target checks and FSDP wrap classes),
//! refuses to overwrite files without `--force`, writes every file atomically (temporary file
//! in the same directory, then rename) and prints warnings on stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::catalog;
use moro_core::job::{JobSettings, Stack};
use moro_export::{Export, Format, Options};
use serde::Serialize;

use super::recipe::LoadedRecipe;
use crate::error::{user, user_hint};
use crate::output::{gib, json, note, stdout};

/// Arguments of `moro recipe export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// The recipe to export.
    #[arg(default_value = "moro.yaml", value_name = "RECIPE")]
    pub(crate) recipe: PathBuf,
    /// Target format: axolotl, llamafactory, trl, hf-trainer, unsloth, deepspeed, accelerate.
    #[arg(long = "to", value_name = "FORMAT", value_parser = parse_format)]
    pub(crate) to: Format,
    /// Path of the main file (a directory keeps the default name). Companion files (DeepSpeed
    /// JSON, accelerate YAML) go in the same directory. Default: the current directory.
    #[arg(long, short = 'o', value_name = "PATH")]
    pub(crate) output: Option<PathBuf>,
    /// Overwrite files that exist.
    #[arg(long)]
    pub(crate) force: bool,
    /// Print a JSON object (files written, warnings, launch command) on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Format::ALL.iter().map(|f| f.as_str()).collect();
        format!("unknown format `{s}`; expected one of {}", names.join(", "))
    })
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    format: Format,
    files: Vec<String>,
    warnings: &'a [String],
    launch: &'a str,
    /// The recipe's job on the trainer's own stack, when the recipe was planned on another.
    #[serde(skip_serializing_if = "Option::is_none")]
    on_trainer_stack: Option<&'a OnTrainerStack>,
}

/// The job estimated twice: on the stack the recipe was planned on and on the one the
/// trainer runs (the export keeps the recipe's batch and context, the memory differs).
#[derive(Debug, Serialize)]
struct OnTrainerStack {
    /// The recipe's stack.
    recipe_stack: Stack,
    /// Its predicted device peak and bound, bytes.
    recipe_peak_device_bytes: u64,
    recipe_peak_upper_bytes: u64,
    /// The trainer's stack.
    trainer_stack: Stack,
    /// The predicted device peak and bound there, bytes; absent when that stack refuses
    /// the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    trainer_peak_device_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trainer_peak_upper_bytes: Option<u64>,
    /// Why that stack does not estimate the job.
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
}

/// The stack a format's trainer runs, where moro models it: LLaMA-Factory and the HF Trainer
/// train with transformers' `Trainer`, the TRL and Unsloth scripts with `SFTTrainer` (and
/// Unsloth's kernels), MLX with `mlx_lm.lora`. axolotl's trainer and the launcher configs
/// are not one modelled stack.
fn trainer_stack(format: Format) -> Option<Stack> {
    match format {
        Format::HfTrainer | Format::Llamafactory => Some(Stack::Hf),
        Format::Trl => Some(Stack::Trl),
        Format::Unsloth => Some(Stack::Unsloth),
        Format::Mlx => Some(Stack::Mlx),
        Format::Axolotl | Format::Deepspeed | Format::Accelerate => None,
    }
}

/// The recipe's job on `format`'s stack beside the recipe's own, when they differ.
fn on_trainer_stack(loaded: &LoadedRecipe, format: Format) -> Result<Option<OnTrainerStack>> {
    let Some(trainer) = trainer_stack(format) else {
        return Ok(None);
    };
    let setup = crate::setup::resolve(crate::setup::JobInputs {
        recipe: Some(loaded),
        model: None,
        flags: &JobSettings::default(),
        target: None,
        hub: &crate::resolve::HubArgs::default(),
    })?;
    if setup.job.stack == trainer {
        return Ok(None);
    }
    let judged = |setup: &crate::setup::JobSetup| -> Result<(u64, u64)> {
        let est = setup.estimate()?;
        let upper = crate::verdict::judge(&est, &setup.job, None).peak_upper_bytes;
        Ok((est.peak_device_bytes, upper))
    };
    let (recipe_peak, recipe_upper) = judged(&setup)?;
    let mut out = OnTrainerStack {
        recipe_stack: setup.job.stack,
        recipe_peak_device_bytes: recipe_peak,
        recipe_peak_upper_bytes: recipe_upper,
        trainer_stack: trainer,
        trainer_peak_device_bytes: None,
        trainer_peak_upper_bytes: None,
        refused: None,
    };
    match setup.on_stack(trainer).and_then(|s| judged(&s)) {
        Ok((peak, upper)) => {
            out.trainer_peak_device_bytes = Some(peak);
            out.trainer_peak_upper_bytes = Some(upper);
        }
        Err(e) => out.refused = Some(e.to_string()),
    }
    Ok(Some(out))
}

/// The note that says what [`OnTrainerStack`] holds.
fn on_trainer_stack_text(o: &OnTrainerStack, format: Format) -> String {
    let planned = format!(
        "note: the recipe was planned on stack {} (predicted {} GiB, bound {} GiB)",
        o.recipe_stack.as_str(),
        gib(o.recipe_peak_device_bytes),
        gib(o.recipe_peak_upper_bytes)
    );
    match (
        o.trainer_peak_device_bytes,
        o.trainer_peak_upper_bytes,
        &o.refused,
    ) {
        (Some(peak), _, _) if peak == o.recipe_peak_device_bytes => format!(
            "{planned}; the {} export runs on stack {}, every other setting kept: the same \
             prediction",
            format.as_str(),
            o.trainer_stack.as_str()
        ),
        (Some(peak), Some(upper), _) => format!(
            "{planned}; the {} export runs on stack {}, every other setting kept: predicted {} \
             GiB, bound {} GiB",
            format.as_str(),
            o.trainer_stack.as_str(),
            gib(peak),
            gib(upper)
        ),
        (_, _, refused) => format!(
            "{planned}; the {} export runs on stack {}, which moro does not estimate for this \
             job: {}",
            format.as_str(),
            o.trainer_stack.as_str(),
            refused.as_deref().unwrap_or("")
        ),
    }
}

/// Runs `moro recipe export`.
pub(crate) fn run_export(args: &ExportArgs) -> Result<ExitCode> {
    let loaded = super::recipe::load(&args.recipe)?;
    let (dir, main_name) = destination(args.output.as_deref(), args.to);
    let export = export_as(&loaded, args.to, Some(main_name))?;
    let paths: Vec<PathBuf> = export.files.iter().map(|f| dir.join(&f.name)).collect();
    if !args.force
        && let Some(p) = paths.iter().find(|p| p.exists())
    {
        return Err(user_hint(
            format!("{} exists; not overwriting it", p.display()),
            "pass --force to overwrite, or --output to write elsewhere",
        ));
    }
    if !dir.as_os_str().is_empty() && !dir.exists() {
        std::fs::create_dir_all(&dir)
            .map_err(|e| user(format!("cannot create {}: {e}", dir.display())))?;
    }
    // The export needs no model; the estimate beside it does (a base moro cannot find
    // offline): the files are written without it.
    let trainer = on_trainer_stack(&loaded, args.to).unwrap_or_else(|e| {
        note(&format!(
            "note: the export is not estimated on its trainer's stack: {e}"
        ));
        None
    });
    for (f, path) in export.files.iter().zip(&paths) {
        crate::output::write_atomic(path, f.content.as_bytes())
            .map_err(|e| user(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(o) = &trainer {
        note(&on_trainer_stack_text(o, args.to));
    }
    report(&export, &paths, args.json, trainer.as_ref())
}

/// `loaded` in `format`, its main file named `main_name` (default: the format's own name);
/// the base model is looked up in the catalog for LoRA target checks and FSDP wrap classes.
pub(crate) fn export_as(
    loaded: &super::recipe::LoadedRecipe,
    format: Format,
    main_name: Option<String>,
) -> Result<Export> {
    let recipe = &loaded.recipe;
    // The catalog's config, or a local config.json the recipe names.
    let model = catalog::find(&recipe.model.base)
        .and_then(|e| catalog::load(e).ok())
        .or_else(|| {
            let path = Path::new(&recipe.model.base);
            path.is_file()
                .then(|| std::fs::read(path).ok())
                .flatten()
                .and_then(|bytes| moro_core::arch::parse_config(&bytes).ok())
        });
    if model.is_none() {
        note(&format!(
            "note: `{}` is not in moro's catalog; LoRA target names are not checked against the model",
            recipe.model.base
        ));
    }
    let options = Options {
        main_file_name: main_name,
    };
    moro_export::export(format, recipe, model.as_ref(), &options)
        .map_err(|e| user(format!("{}: {e}", loaded.path)))
}

/// The directory and main file name for `--output`.
fn destination(output: Option<&Path>, format: Format) -> (PathBuf, String) {
    let default = format.default_file_name().to_owned();
    match output {
        None => (PathBuf::new(), default),
        Some(p) if p.is_dir() || p.as_os_str().to_string_lossy().ends_with('/') => {
            (p.to_path_buf(), default)
        }
        Some(p) => {
            let name = p
                .file_name()
                .map_or(default, |n| n.to_string_lossy().into_owned());
            (p.parent().map(Path::to_path_buf).unwrap_or_default(), name)
        }
    }
}

fn report(
    export: &Export,
    paths: &[PathBuf],
    as_json: bool,
    on_trainer_stack: Option<&OnTrainerStack>,
) -> Result<ExitCode> {
    for w in &export.warnings {
        note(&format!("warning: {w}"));
    }
    let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    if as_json {
        let r = Report {
            format: export.format,
            files,
            warnings: &export.warnings,
            launch: &export.launch,
            on_trainer_stack,
        };
        stdout(&json(&r)?)?;
    } else {
        let mut s = String::new();
        for f in &files {
            s.push_str(&format!("wrote {f}\n"));
        }
        s.push_str(&format!("launch: {}\n", export.launch));
        stdout(&s)?;
    }
    Ok(ExitCode::SUCCESS)
}
