//! `moro fit`: the three-question framework (how big, full or PEFT, what context) → which
//! GPU classes of the catalog fit, cheapest first.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::catalog;
use moro_core::model::ModelSpec;
use moro_core::search::{MethodChoice, Objective, Request};
use serde::Serialize;

use crate::commands::recipe::{caps_of, describe, run_search};
use crate::error::{user, user_hint};
use crate::hw::Target;
use crate::jobargs::parse_stack;
use crate::output::{Table, gib, json, stdout};
use crate::resolve;

/// On-demand cloud prices in US$ per GPU-hour, from `shared/docs/hardware-detection.md` §6
/// (the "GPU PRICING DATA (January 2026)" table and the AWS g5 price). Only presets with a
/// single stored figure are listed; T4/L4 (recalled, unverified) and H200 (a range only)
/// are left out. Prices move: these are defaults, dated.
pub(crate) const PRICES_USD_PER_HOUR: &[(&str, f64)] = &[
    ("rtx-3090", 0.44),
    ("rtx-4090", 0.74),
    ("rtx-a6000", 0.79),
    ("a10g", 1.006),
    ("l40s", 1.14),
    ("a100-sxm4-40gb", 1.89),
    ("a100-pcie-80gb", 2.21),
    ("a100-sxm4-80gb", 2.49),
    ("h100-pcie", 3.29),
    ("h100-sxm", 4.29),
];

/// Catalog families `--model-size` picks from: the dense Llama-style architectures.
const SIZE_MODEL_TYPES: [&str; 2] = ["qwen2", "llama"];

fn parse_method_choice(s: &str) -> Result<MethodChoice, String> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(MethodChoice::Auto),
        "full" => Ok(MethodChoice::Only(moro_core::job::Method::Full)),
        "lora" | "peft" => Ok(MethodChoice::Only(moro_core::job::Method::Lora)),
        "qlora" => Ok(MethodChoice::Only(moro_core::job::Method::Qlora)),
        _ => Err(format!(
            "unknown method `{s}`; use auto, full, lora or qlora"
        )),
    }
}

fn parse_positive(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1, got 0".to_owned()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("`{s}` is not a positive whole number")),
    }
}

/// Parses a parameter count such as `7B`, `1.5b`, `500M`.
pub(crate) fn parse_model_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix('b') {
        (n, 1e9)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1e6)
    } else {
        return Err(format!("`{s}` needs a unit: e.g. 7B, 1.5B, 500M"));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size such as 7B"))?;
    if !v.is_finite() || v <= 0.0 || v > 1e5 {
        return Err(format!("`{s}` is out of range"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok((v * mult) as u64)
}

/// The catalog model (qwen2/llama architectures) nearest `params` by ratio.
pub(crate) fn model_of_size(params: u64) -> Option<(&'static str, ModelSpec)> {
    #[allow(clippy::cast_precision_loss)]
    let dist = |p: u64| ((p.max(1) as f64) / (params.max(1) as f64)).ln().abs();
    catalog::entries()
        .iter()
        .filter_map(|e| catalog::load(e).ok().map(|s| (e.id, s)))
        .filter(|(_, s)| SIZE_MODEL_TYPES.contains(&s.model_type.as_str()))
        .min_by(|a, b| dist(a.1.total_params()).total_cmp(&dist(b.1.total_params())))
}

/// Arguments of `moro fit`.
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  moro fit --model-size 7B --method qlora --seq-len 4096")]
pub(crate) struct FitArgs {
    /// Model: a Hugging Face id, a config.json or a model directory.
    #[arg(
        long,
        short,
        conflicts_with = "model_size",
        required_unless_present = "model_size"
    )]
    pub(crate) model: Option<String>,
    /// Or just a size (`7B`, `1.5B`): the catalog's Qwen2/Llama-architecture model nearest it.
    #[arg(long, value_parser = parse_model_size)]
    pub(crate) model_size: Option<u64>,
    /// Full fine-tuning or PEFT: auto, full, lora, qlora.
    #[arg(long, default_value = "auto", value_parser = parse_method_choice)]
    pub(crate) method: MethodChoice,
    /// Context in tokens [default: the longest of 8192, 4096, 2048, 1024 that fits].
    #[arg(long, visible_alias = "max-seq-length", value_parser = parse_positive)]
    pub(crate) seq_len: Option<u64>,
    /// Sequences per optimizer step [default: 16].
    #[arg(long, value_parser = parse_positive)]
    pub(crate) effective_batch: Option<u64>,
    /// Training stack: hf, trl, litgpt, torchtune.
    #[arg(long, default_value = "hf", value_parser = parse_stack)]
    pub(crate) stack: moro_core::job::Stack,
    /// Print one JSON object (sizes in bytes) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FitRow {
    pub(crate) preset: String,
    pub(crate) name: String,
    pub(crate) vendor: &'static str,
    pub(crate) memory_bytes: u64,
    pub(crate) price_usd_per_hour: Option<f64>,
    pub(crate) configuration: String,
    pub(crate) seq_len: u64,
    pub(crate) peak_device_bytes: u64,
    pub(crate) headroom_bytes: i64,
}

#[derive(Debug, Serialize)]
struct FitJson<'a> {
    model: &'a str,
    parameters: u64,
    method: String,
    seq_len: Option<u64>,
    order: &'static str,
    fits: Vec<FitRow>,
    does_not_fit: Vec<String>,
}

/// Every catalog preset the job fits on (ordered by memory, then price), and those it does
/// not fit on.
pub(crate) fn fit_rows(spec: &ModelSpec, request: &Request) -> (Vec<FitRow>, Vec<String>) {
    let mut fits = Vec::new();
    let mut not = Vec::new();
    for p in moro_core::hardware::presets() {
        let Some(d) = p.to_device(None) else { continue };
        let target = Target {
            hardware: moro_core::hardware::Hardware {
                devices: vec![d.clone()],
            },
            detected: false,
            spec: p.id.clone(),
        };
        let Some(caps) = caps_of(&target) else {
            continue;
        };
        match run_search(spec, request, &caps).and_then(|o| o.best) {
            Some(b) => fits.push(FitRow {
                preset: p.id.clone(),
                name: d.name.clone(),
                vendor: p.vendor.as_str(),
                memory_bytes: caps.usable_bytes,
                price_usd_per_hour: PRICES_USD_PER_HOUR
                    .iter()
                    .find(|(id, _)| *id == p.id)
                    .map(|(_, v)| *v),
                configuration: describe(&b.job),
                seq_len: b.job.seq_len,
                peak_device_bytes: b.estimate.peak_device_bytes,
                headroom_bytes: b.headroom_bytes,
            }),
            None => not.push(p.id.clone()),
        }
    }
    // Cheapest first: the memory class is the price proxy every preset has (a card with
    // less memory of the same generation never costs more); within a class the §6 $/h
    // figure, presets without one last.
    fits.sort_by(|a, b| {
        a.memory_bytes.cmp(&b.memory_bytes).then(
            a.price_usd_per_hour
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.price_usd_per_hour.unwrap_or(f64::INFINITY)),
        )
    });
    (fits, not)
}

pub(crate) fn run(args: &FitArgs) -> Result<ExitCode> {
    let (id, spec) = match (&args.model, args.model_size) {
        (Some(m), _) => {
            let r = resolve::model(m)?;
            (r.id, r.spec)
        }
        (None, Some(size)) => {
            let (id, spec) = model_of_size(size)
                .ok_or_else(|| user("--model-size: no catalog model of that size"))?;
            (id.to_owned(), spec)
        }
        (None, None) => {
            return Err(user_hint(
                "`--model` or `--model-size` is required",
                "e.g. moro fit --model-size 7B --method qlora --seq-len 4096",
            ));
        }
    };
    let request = Request {
        method: args.method,
        seq_len: args.seq_len,
        effective_batch: args.effective_batch,
        stack: args.stack,
        parallel: moro_core::job::Parallel::single(),
        objective: Objective::Quality,
    };
    // Reject an invalid request once, with its field, before searching every preset.
    let any = moro_core::hardware::Device::generic(80 * moro_core::units::GIB);
    moro_core::search::Space::new(&spec, &request, &moro_core::search::Caps::of_device(&any))
        .map_err(|e| user(e.to_string()))?;
    let (fits, not) = fit_rows(&spec, &request);
    let method = match args.method {
        MethodChoice::Auto => "auto".to_owned(),
        MethodChoice::Only(m) => m.as_str().to_owned(),
    };
    if args.json {
        let doc = FitJson {
            model: &id,
            parameters: spec.total_params(),
            method,
            seq_len: args.seq_len,
            order: "memory ascending, then $/GPU-hour (hardware-detection.md §6)",
            fits,
            does_not_fit: not,
        };
        stdout(&json(&doc)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    #[allow(clippy::cast_precision_loss)]
    let b = spec.total_params() as f64 / 1e9;
    let mut out = format!(
        "{id} ({b:.2}B parameters), method {method}, context {}\n\n",
        args.seq_len
            .map_or("8192 → 1024".to_owned(), |s| s.to_string())
    );
    if fits.is_empty() {
        out.push_str("no single catalog GPU fits; try --method qlora, a shorter --seq-len, or `moro recipe generate --hardware 8xh100-sxm`\n");
        stdout(&out)?;
        return Ok(ExitCode::from(1));
    }
    let mut t = Table::new(
        &["gpu", "GiB", "$/h", "peak GiB", "recipe"],
        &[false, true, true, true, false],
    );
    for r in &fits {
        t.row(vec![
            r.preset.clone(),
            gib(r.memory_bytes),
            r.price_usd_per_hour
                .map_or("-".to_owned(), |p| format!("{p:.2}")),
            gib(r.peak_device_bytes),
            r.configuration.clone(),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n{} presets fit, {} do not\n",
        fits.len(),
        not.len()
    ));
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_model_size("7B"), Ok(7_000_000_000));
        assert_eq!(parse_model_size("1.5b"), Ok(1_500_000_000));
        assert_eq!(parse_model_size("500M"), Ok(500_000_000));
        assert!(parse_model_size("7").is_err());
        assert!(parse_model_size("-1B").is_err());
        assert!(parse_model_size("NaNB").is_err());
        let (id, _) = model_of_size(7_000_000_000).unwrap();
        assert!(id.contains("7B") || id.contains("7b"), "{id}");
    }

    #[test]
    fn cheaper_classes_first_and_fits_is_monotone_in_memory() {
        let (_, spec) = model_of_size(7_000_000_000).unwrap();
        let req = Request {
            method: MethodChoice::Only(moro_core::job::Method::Qlora),
            seq_len: Some(4096),
            ..Request::default()
        };
        let (fits, not) = fit_rows(&spec, &req);
        assert!(!fits.is_empty());
        assert!(
            fits.windows(2)
                .all(|w| w[0].memory_bytes <= w[1].memory_bytes)
        );
        // Every preset with at least as much memory as a fitting one, the same bf16/FA2
        // support, fits too (the search is monotone in memory).
        let smallest = fits[0].memory_bytes;
        for id in &not {
            let p = moro_core::hardware::preset(id).unwrap();
            let d = p.to_device(None).unwrap();
            assert!(
                d.total_bytes < smallest || !d.supports_bf16 || !d.supports_flash_attention,
                "{id}"
            );
        }
    }
}
