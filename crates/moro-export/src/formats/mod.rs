//! One function per format: [`Plan`] in, files, warnings and a launch command out. One file
//! per trainer; the launchers, the DeepSpeed/accelerate configs and the Trainer arguments they
//! share have files of their own.

mod axolotl;
mod distributed;
mod hf_trainer;
mod launch;
mod llamafactory;
mod mlx;
mod trainer_args;
mod trl;
mod unsloth;

pub(crate) use axolotl::axolotl;
pub(crate) use distributed::{accelerate, deepspeed};
pub(crate) use hf_trainer::hf_trainer;
pub(crate) use llamafactory::llamafactory;
pub(crate) use mlx::mlx;
pub(crate) use trl::trl;
pub(crate) use unsloth::unsloth;

// What the trainers' files share, in reach of each through `super::*`.
use distributed::*;
use launch::*;
use trainer_args::*;
use trl::*;

use crate::ExportFile;
use crate::plan::Plan;
use crate::value::{Map, Value};
use crate::yaml::to_yaml;

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

/// A YAML-configured trainer's export (axolotl, LLaMA-Factory): the config `m` under its
/// header, the launch line and how each node runs it, before the other `files`, with the
/// DeepSpeed config when there is one.
fn yaml_config_out(
    p: &Plan<'_>,
    main: &str,
    m: Map,
    mut header: Vec<String>,
    mut files: Vec<ExportFile>,
    mut w: Vec<String>,
    launch: String,
) -> Out {
    header.push(format!("Run: {launch}"));
    header.extend(node_header(p, Launcher::EachNode));
    w.extend(node_warning(p, Launcher::EachNode));
    files.insert(0, file(main, to_yaml(&Value::Map(m), &header)));
    files.extend(ds_file(p));
    Out {
        files,
        warnings: w,
        launch,
    }
}
