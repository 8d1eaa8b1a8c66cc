//! `moro models`: the embedded catalog.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::catalog;
use serde::Serialize;

use crate::output::{Table, json, stdout};

/// Arguments of `moro models`.
#[derive(Debug, Args)]
pub(crate) struct ModelsArgs {
    /// Print a JSON array of `{id, model_type, parameters, ...}`.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Serialize)]
struct Entry {
    id: &'static str,
    model_type: String,
    parameters: u64,
    active_parameters: u64,
    layers: u64,
    hidden_size: u64,
    vocab_size: u64,
    max_position_embeddings: u64,
}

pub(crate) fn run(args: &ModelsArgs) -> Result<ExitCode> {
    let mut entries = Vec::new();
    for e in catalog::entries() {
        let spec = catalog::load(e).map_err(|err| anyhow::anyhow!("catalog `{}`: {err}", e.id))?;
        entries.push(Entry {
            id: e.id,
            model_type: spec.model_type.clone(),
            parameters: spec.total_params(),
            active_parameters: spec.active_params(),
            layers: spec.num_layers,
            hidden_size: spec.hidden_size,
            vocab_size: spec.vocab_size,
            max_position_embeddings: spec.max_position_embeddings,
        });
    }
    entries.sort_by_key(|e| e.id.to_ascii_lowercase());
    if args.json {
        return stdout(&json(&entries)?).map(|()| ExitCode::SUCCESS);
    }
    let mut t = Table::new(
        &[
            "id", "type", "params", "layers", "hidden", "vocab", "context",
        ],
        &[false, false, true, true, true, true, true],
    );
    for e in &entries {
        #[allow(clippy::cast_precision_loss)]
        let p = if e.active_parameters < e.parameters {
            format!(
                "{:.2}B ({:.2}B active)",
                e.parameters as f64 / 1e9,
                e.active_parameters as f64 / 1e9
            )
        } else {
            format!("{:.2}B", e.parameters as f64 / 1e9)
        };
        t.row(vec![
            e.id.to_owned(),
            e.model_type.clone(),
            p,
            e.layers.to_string(),
            e.hidden_size.to_string(),
            e.vocab_size.to_string(),
            e.max_position_embeddings.to_string(),
        ]);
    }
    stdout(&t.render()).map(|()| ExitCode::SUCCESS)
}
