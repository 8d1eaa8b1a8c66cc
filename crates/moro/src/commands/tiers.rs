//! `moro tiers`: the product's hardware tier table, computed by the recipe search.
//!
//! For each tier (catalog presets standing for it) and each family (Qwen2.5, Llama-3.x), the
//! largest catalog model for which `moro recipe generate` finds a fitting recipe (quality
//! objective, method auto, context 8192 → 1024), with its method, LoRA rank/alpha, context
//! and predicted peak. Macs are planned on the MLX stack (`mlx_lm.lora`, what people
//! fine-tune with there) within the GPU working-set limit, once per method, so the table says
//! which of QLoRA, LoRA and full fine-tuning each Mac class runs.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::catalog;
use moro_core::hardware::{HardwareSpec, parse_hardware_spec};
use moro_core::job::{Method, Stack};
use moro_core::model::ModelSpec;
use moro_core::search::MethodChoice;
use moro_core::search::{Candidate, Request};
use serde::Serialize;

use crate::commands::recipe::{best_of, caps_of};
use crate::hw::Target;
use crate::output::{Table, gib, json, stdout};

/// The product's tiers and the presets that stand for them: the smallest (binding) card of
/// each named range. A100 80GB reports 81920 MiB and H100 SXM 81559 MiB, so the H100 binds
/// the cloud tier; the RTX 4090 (24564 MiB) binds the 24 GB tier against the 3090 (24576).
pub(crate) const TIERS: &[(&str, &[&str], Stack)] = &[
    ("RTX 3060/4060 12 GB", &["rtx-3060-12gb"], Stack::Hf),
    (
        "RTX 4070/4070 Ti 12–16 GB",
        &["rtx-4070-ti", "rtx-4070-ti-super"],
        Stack::Hf,
    ),
    ("RTX 3090/4090 24 GB", &["rtx-4090"], Stack::Hf),
    ("Mac 16 GB (MLX)", &["apple-m4-16gb"], Stack::Mlx),
    ("Mac 24 GB (MLX)", &["apple-m4-24gb"], Stack::Mlx),
    ("Mac 32 GB (MLX)", &["apple-m4-32gb"], Stack::Mlx),
    ("Mac 64 GB (MLX)", &["apple-m4-max-64gb"], Stack::Mlx),
    ("Mac 128 GB (MLX)", &["apple-m4-max-128gb"], Stack::Mlx),
    // 96 GiB of its 128 GB for the GPU (hardware doc §3.4), PyTorch on ROCm.
    ("Strix Halo 128 GB (ROCm)", &["strix-halo-128gb"], Stack::Hf),
    ("Cloud A100/H100 80 GB", &["h100-sxm"], Stack::Hf),
];

/// Methods searched for a tier: the best of all (`auto`) on CUDA cards; each of QLoRA,
/// LoRA and full fine-tuning on a Mac.
fn methods_of(stack: Stack) -> Vec<MethodChoice> {
    if stack == Stack::Mlx {
        [Method::QuantizedAdapters, Method::Adapters, Method::Full]
            .into_iter()
            .map(MethodChoice::Only)
            .collect()
    } else {
        vec![MethodChoice::Auto]
    }
}

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
    pub(crate) stack: &'static str,
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
    /// The bound on the device peak the cell was judged on (95 % of measured runs like it).
    pub(crate) peak_upper_bytes: Option<u64>,
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
    (tier, preset, stack): (&'static str, &'static str, Stack),
    method: MethodChoice,
    family: &'static str,
    models: &[(&'static str, ModelSpec)],
) -> Option<TierCell> {
    let target = target_of(preset)?;
    let caps = caps_of(&target)?;
    let request = Request {
        stack,
        method,
        workers: super::workers(),
        ..Request::default()
    };
    let found: Option<(&'static str, u64, Candidate)> = models.iter().find_map(|(id, spec)| {
        best_of(spec, &request, &caps).map(|b| (*id, spec.total_params(), b))
    });
    let mut c = TierCell {
        tier,
        preset,
        stack: stack.as_str(),
        usable_bytes: caps.usable_bytes,
        family,
        model: None,
        parameters: None,
        method: match method {
            MethodChoice::Only(m) => Some(m.as_str()),
            MethodChoice::Auto => None,
        },
        lora_rank: None,
        lora_alpha: None,
        seq_len: None,
        micro_batch_size: None,
        gradient_checkpointing: None,
        peak_device_bytes: None,
        peak_upper_bytes: None,
    };
    if let Some((id, params, b)) = found {
        let peft = b.job.method.is_peft();
        c.model = Some(id);
        c.parameters = Some(params);
        c.method = Some(b.job.method.as_str());
        c.lora_rank = peft.then_some(b.job.adapter.rank);
        c.lora_alpha = peft.then_some(b.job.adapter.alpha);
        c.seq_len = Some(b.job.seq_len);
        c.micro_batch_size = Some(b.job.micro_batch_size);
        c.gradient_checkpointing = Some(b.job.gradient_checkpointing);
        c.peak_device_bytes = Some(b.estimate.peak_device_bytes);
        c.peak_upper_bytes = Some(b.upper_bytes());
    }
    Some(c)
}

/// The whole table, one search per (preset, family, model tried), presets in parallel.
pub(crate) fn compute() -> Vec<TierCell> {
    let families: Vec<(&'static str, Vec<(&'static str, ModelSpec)>)> = FAMILIES
        .iter()
        .map(|(name, prefixes)| (*name, family_models(prefixes)))
        .collect();
    let jobs: Vec<(&'static str, &'static str, Stack)> = TIERS
        .iter()
        .flat_map(|(tier, presets, stack)| presets.iter().map(move |p| (*tier, *p, *stack)))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|&job| {
                let families = &families;
                s.spawn(move || {
                    families
                        .iter()
                        .flat_map(|(fam, models)| {
                            methods_of(job.2)
                                .into_iter()
                                .filter_map(move |m| cell(job, m, fam, models))
                        })
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
         effective batch 16, hf stack (Macs: mlx, each method, within the GPU working-set \
         limit); fits = the upper bound (95 % of measured runs like it) within the usable \
         memory\n",
    );
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}
