//! The `moro` command line: glue between the pure core (`moro-core`) and the outside world
//! (files, environment, GPUs, processes, the network).
//!
//! Exit codes: 0 success (and "fits": the upper bound is within the memory), 1 "does not
//! fit" or "uncertain" (the prediction fits, its bound does not) / no configuration fits, 2
//! invalid input or a runtime error. `moro run` exits with the child's final exit code.

mod charts;
mod commands;
mod error;
mod hw;
mod jobargs;
mod output;
mod profile;
mod resolve;
mod serve;
mod setup;
mod tokenizer;
mod verdict;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Predict peak GPU memory of LLM fine-tuning and inference before touching a GPU.
#[derive(Debug, Parser)]
#[command(name = "moro", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Predict the peak memory of a job, broken down by component.
    Estimate(commands::estimate::EstimateArgs),
    /// Compare predictions with measured runs (validation/measured.jsonl schema).
    Validate(commands::validate::ValidateArgs),
    /// List the models in the embedded catalog.
    Models(commands::models::ModelsArgs),
    /// Show the GPUs on this machine.
    Hardware(commands::hardware::HardwareArgs),
    /// Work with moro.yaml recipes.
    #[command(subcommand)]
    Recipe(RecipeCommand),
    /// Run a training command from a moro.yaml, healing out-of-memory failures.
    Run(commands::run::RunArgs),
    /// Measure this machine's GPU and store a calibration profile that estimates use.
    Calibrate(commands::calibrate::CalibrateArgs),
    /// The hardware tier table (largest model per GPU class), computed by the recipe search.
    Tiers(commands::tiers::TiersArgs),
    /// Which GPU classes fit a model, a method and a context, cheapest first.
    Fit(commands::fit::FitArgs),
    /// What llama.cpp allocates to run a GGUF model: GPU and host weights, KV cache, compute
    /// buffer.
    Gguf(commands::gguf::GgufArgs),
    /// Read a fine-tuning dataset: its token lengths with the model's tokenizer.
    #[command(subcommand)]
    Data(commands::data::DataCommand),
    /// The calculator as a local web page (and its JSON API), on 127.0.0.1.
    Serve(serve::ServeArgs),
    Completions(CompletionsArgs),
}

/// Print a shell completion script (e.g. `moro completions bash > ~/.local/share/bash-completion/completions/moro`).
#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell: bash, zsh, fish, powershell or elvish.
    shell: clap_complete::Shell,
}

/// `moro recipe ...`.
#[derive(Debug, Subcommand)]
enum RecipeCommand {
    /// Write the recipe in a trainer's own format (axolotl, LLaMA-Factory, TRL, HF Trainer,
    /// Unsloth, DeepSpeed, accelerate).
    Export(commands::export::ExportArgs),
    /// Search the configurations that fit the hardware and write the best as moro.yaml.
    Generate(Box<commands::recipe::GenerateArgs>),
    /// Validate a moro.yaml and say whether it fits (exit 0 fits, 1 does not, 2 invalid).
    Check(commands::recipe::CheckArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return error::report_clap(&e, json_asked(std::env::args_os())),
    };
    let result = match &cli.command {
        Command::Estimate(a) => commands::estimate::run(a),
        Command::Validate(a) => commands::validate::run(a),
        Command::Models(a) => commands::models::run(a),
        Command::Hardware(a) => commands::hardware::run(a),
        Command::Recipe(RecipeCommand::Export(a)) => commands::export::run_export(a),
        Command::Run(a) => commands::run::run(a),
        Command::Calibrate(a) => commands::calibrate::run(a),
        Command::Recipe(RecipeCommand::Generate(a)) => commands::recipe::run_generate(a),
        Command::Recipe(RecipeCommand::Check(a)) => commands::recipe::run_check(a),
        Command::Tiers(a) => commands::tiers::run(a),
        Command::Fit(a) => commands::fit::run(a),
        Command::Gguf(a) => commands::gguf::run(a),
        Command::Data(c) => commands::data::run(c),
        Command::Serve(a) => serve::run(a),
        Command::Completions(a) => {
            use clap::CommandFactory;
            clap_complete::generate(a.shell, &mut Cli::command(), "moro", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => error::report(&e, cli.command.json()),
    }
}

/// Whether the command line asks for `--json` (before a `--`), for an error clap finds
/// before any command knows.
fn json_asked(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

impl Command {
    /// Whether the command was asked for JSON (its errors are JSON too).
    const fn json(&self) -> bool {
        match self {
            Self::Estimate(a) => a.json,
            Self::Validate(a) => a.json,
            Self::Models(a) => a.json,
            Self::Hardware(a) => a.json,
            Self::Recipe(RecipeCommand::Export(a)) => a.json,
            Self::Recipe(RecipeCommand::Generate(a)) => a.json,
            Self::Recipe(RecipeCommand::Check(a)) => a.json,
            Self::Calibrate(a) => a.json,
            Self::Tiers(a) => a.json,
            Self::Fit(a) => a.json,
            Self::Gguf(a) => a.json,
            Self::Data(c) => c.json(),
            Self::Run(_) | Self::Serve(_) | Self::Completions(_) => false,
        }
    }
}
