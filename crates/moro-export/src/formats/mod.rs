//! One function per format: [`Plan`] in, files, warnings and a launch command out. One file
//! per trainer; the launchers, the DeepSpeed/accelerate configs and the Trainer arguments they
//! share have files of their own.

mod axolotl;
mod distributed;
mod hf_trainer;
mod launch;
mod llamafactory;
mod trainer_args;
mod trl;
mod unsloth;

pub(crate) use axolotl::axolotl;
pub(crate) use distributed::{accelerate, deepspeed};
pub(crate) use hf_trainer::hf_trainer;
pub(crate) use llamafactory::llamafactory;
pub(crate) use trl::trl;
pub(crate) use unsloth::unsloth;

// What the trainers' files share, in reach of each through `super::*`.
use distributed::*;
use launch::*;
use trainer_args::*;
use trl::*;

use crate::ExportFile;

/// What a format function returns.
pub(crate) struct Out {
    pub(crate) files: Vec<ExportFile>,
    pub(crate) warnings: Vec<String>,
    pub(crate) launch: String,
}

fn file(name: &str, content: String) -> ExportFile {
    ExportFile {
        name: name.to_owned(),
        content,
    }
}

const LOGGING_STEPS: u64 = 10;

/// `ds_type` for a local data file, from its extension.
fn local_data_type(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    if lower.ends_with(".jsonl") || lower.ends_with(".json") {
        Some("json")
    } else if lower.ends_with(".csv") {
        Some("csv")
    } else if lower.ends_with(".parquet") {
        Some("parquet")
    } else {
        None
    }
}
