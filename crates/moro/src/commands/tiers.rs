//! `moro tiers`: the product's hardware tier table, computed by the recipe search.
//!
//! For each tier (catalog presets standing for it) and each family (Qwen2.5, Llama-3.x), the
//! largest catalog model for which `moro recipe generate` finds a fitting recipe (quality
//! objective, method auto, context 8192 → 1024), with its method, LoRA rank/alpha, context
//! and predicted peak.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::catalog;
use moro_core::hardware::{HardwareSpec, parse_hardware_spec};
use moro_core::model::ModelSpec;
use moro_core::search::{Candidate, Request};
use serde::Serialize;

use crate::commands::recipe::{caps_of, run_search};
use crate::hw::Target;
use crate::output::{Table, gib, json, stdout};

/// The product's tiers and the presets that stand for them: the smallest (binding) card of
/// each named range. A100 80GB reports 81920 MiB and H100 SXM 81559 MiB, so the H100 binds
/// the cloud tier; the RTX 4090 (24564 MiB) binds the 24 GB tier against the 3090 (24576).
pub(crate) const TIERS: &[(&str, &[&str])] = &[
    ("RTX 3060/4060 12 GB", &["rtx-3060-12gb"]),
    (
        "RTX 4070/4070 Ti 12–16 GB",
        &["rtx-4070-ti", "rtx-4070-ti-super"],
    ),
    ("RTX 3090/4090 24 GB", &["rtx-4090"]),
    (
        "Apple Silicon M2/M3/M4 16–64 GB",
        &["apple-m4-16gb", "apple-m3-max-64gb"],
    ),
    ("Cloud A100/H100 80 GB", &["h100-sxm"]),
];

/// The families of the product's table: display name and catalog id prefixes. Instruct
/// entries whose base is also embedded are skipped as duplicates.
pub(crate) const FAMILIES: &[(&str, &[&str])] = &[
    ("Qwen2.5", &["Qwen/Qwen2.5-"]),
    ("Llama-3.x", &["meta-llama/Llama-3."]),
];

/// Arguments of `moro tiers`.
#[derive(Debug, Args)]
pub(crate) struct TiersArgs {
    /// Print one JSON object (sizes in bytes) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One cell of the table.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TierCell {
    pub(crate) tier: &'static str,
    pub(crate) preset: &'static str,
    pub(crate) usable_bytes: u64,
    pub(crate) family: &'static str,
    /// The largest model that fits, if any.
    pub(crate) model: Option<&'static str>,
    pub(crate) parameters: Option<u64>,
    pub(crate) method: Option<&'static str>,
    pub(crate) lora_rank: Option<u64>,
    pub(crate) lora_alpha: Option<f64>,
    pub(crate) seq_len: Option<u64>,
    pub(crate) micro_batch_size: Option<u64>,
    pub(crate) gradient_checkpointing: Option<bool>,
    pub(crate) peak_device_bytes: Option<u64>,
}

/// Models of a family, largest first.
fn family_models(prefixes: &[&str]) -> Vec<(&'static str, ModelSpec)> {
    let mut v: Vec<(&'static str, ModelSpec)> = catalog::entries()
        .iter()
        .filter(|e| prefixes.iter().any(|p| e.id.starts_with(p)))
        .filter_map(|e| catalog::load(e).ok().map(|s| (e.id, s)))
        .collect();
    // Same architecture twice (base and instruct): keep the base (shorter id).
    v.sort_by(|a, b| {
        b.1.total_params()
            .cmp(&a.1.total_params())
            .then(a.0.len().cmp(&b.0.len()))
    });
    v.dedup_by(|b, a| a.1.total_params() == b.1.total_params());
    v
}

fn target_of(preset: &str) -> Option<Target> {
    match parse_hardware_spec(preset).ok()? {
        HardwareSpec::Given(hardware) => Some(Target {
            hardware,
            detected: false,
            spec: preset.to_owned(),
        }),
        HardwareSpec::Detect => None,
    }
}

fn cell(
    tier: &'static str,
    preset: &'static str,
    family: &'static str,
    models: &[(&'static str, ModelSpec)],
) -> Option<TierCell> {
    let target = target_of(preset)?;
    let caps = caps_of(&target)?;
    let request = Request::default();
    let found: Option<(&'static str, u64, Candidate)> = models.iter().find_map(|(id, spec)| {
        run_search(spec, &request, &caps)
            .and_then(|o| o.best)
            .map(|b| (*id, spec.total_params(), b))
    });
    let mut c = TierCell {
        tier,
        preset,
        usable_bytes: caps.usable_bytes,
        family,
        model: None,
        parameters: None,
        method: None,
        lora_rank: None,
        lora_alpha: None,
        seq_len: None,
        micro_batch_size: None,
        gradient_checkpointing: None,
        peak_device_bytes: None,
    };
    if let Some((id, params, b)) = found {
        let peft = b.job.method.is_peft();
        c.model = Some(id);
        c.parameters = Some(params);
        c.method = Some(b.job.method.as_str());
        c.lora_rank = peft.then_some(b.job.lora.rank);
        c.lora_alpha = peft.then_some(b.job.lora.alpha);
        c.seq_len = Some(b.job.seq_len);
        c.micro_batch_size = Some(b.job.micro_batch_size);
        c.gradient_checkpointing = Some(b.job.gradient_checkpointing);
        c.peak_device_bytes = Some(b.estimate.peak_device_bytes);
    }
    Some(c)
}

/// The whole table, one search per (preset, family, model tried), presets in parallel.
pub(crate) fn compute() -> Vec<TierCell> {
    let families: Vec<(&'static str, Vec<(&'static str, ModelSpec)>)> = FAMILIES
        .iter()
        .map(|(name, prefixes)| (*name, family_models(prefixes)))
        .collect();
    let jobs: Vec<(&'static str, &'static str)> = TIERS
        .iter()
        .flat_map(|(tier, presets)| presets.iter().map(move |p| (*tier, *p)))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(tier, preset)| {
                let families = &families;
                s.spawn(move || {
                    families
                        .iter()
                        .filter_map(|(fam, models)| cell(tier, preset, fam, models))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

#[derive(Debug, Serialize)]
struct TiersJson {
    objective: &'static str,
    method: &'static str,
    seq_len_candidates: [u64; 4],
    tiers: Vec<TierCell>,
}

pub(crate) fn run(args: &TiersArgs) -> Result<ExitCode> {
    let cells = compute();
    if args.json {
        let doc = TiersJson {
            objective: "quality",
            method: "auto",
            seq_len_candidates: moro_core::search::SEQ_LEN_CANDIDATES,
            tiers: cells,
        };
        stdout(&json(&doc)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(
        &[
            "tier",
            "preset",
            "usable GiB",
            "family",
            "largest model",
            "method",
            "rank/alpha",
            "context",
            "peak GiB",
        ],
        &[false, false, true, false, false, false, false, true, true],
    );
    for c in &cells {
        t.row(vec![
            c.tier.to_owned(),
            c.preset.to_owned(),
            gib(c.usable_bytes),
            c.family.to_owned(),
            c.model.unwrap_or("none fits").to_owned(),
            c.method.unwrap_or("-").to_owned(),
            match (c.lora_rank, c.lora_alpha) {
                (Some(r), Some(a)) => format!("r={r} α={a}"),
                _ => "-".to_owned(),
            },
            c.seq_len.map_or("-".to_owned(), |s| s.to_string()),
            c.peak_device_bytes.map_or("-".to_owned(), gib),
        ]);
    }
    let mut out = t.render();
    out.push_str(
        "\ncomputed by the recipe search: quality objective, method auto, context 8192 → 1024, \
         effective batch 16, hf stack; fits = the upper bound (95 % of measured runs like it) \
         within the usable memory\n",
    );
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}
