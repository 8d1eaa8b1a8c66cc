//! `moro fit`: the three-question framework (how big, full or PEFT, what context) → for each
//! GPU class of the catalog, the fewest GPUs (1, 2, 4, 8, then nodes of 8 up to 64) and the
//! strategy the recipe search picks for them, cheapest first.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::catalog;
use moro_core::model::ModelSpec;
use moro_core::search::{MethodChoice, Objective, Request};
use serde::Serialize;

use crate::commands::recipe::{
    FIT_GPU_COUNTS, best_fitting, caps_of, describe, exact_cluster, layout_of,
};
use crate::error::{user, user_hint};
use crate::hw::Target;
use crate::jobargs::parse_stack;
use crate::output::{Table, gib, json, stdout};
use crate::resolve;

/// On-demand cloud prices in US$ per GPU-hour, from `docs/hardware-detection.md` §6
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

/// US$ per GPU-hour of a preset, where [`PRICES_USD_PER_HOUR`] has it.
pub(crate) fn price_of(preset: &str) -> Option<f64> {
    PRICES_USD_PER_HOUR
        .iter()
        .find(|(id, _)| *id == preset)
        .map(|(_, v)| *v)
}

/// Catalog families `--model-size` picks from: the dense Llama-style architectures, as Meta
/// and Qwen publish them (not fine-tunes or distillations named after another model).
const SIZE_MODEL_TYPES: [&str; 3] = ["qwen2", "qwen3", "llama"];
const SIZE_ORGS: [&str; 2] = ["meta-llama/", "Qwen/"];

/// The smallest vocabulary `--model-size` takes as today's: Llama 3 has 128,256 entries,
/// Qwen2 to Qwen3 151,936 or 152,064, where Llama 2 and its 2023 relatives had 32,000. The
/// vocabulary sets the logits' memory, the largest single block of a long-context step, so a
/// size stands for a model with a current tokenizer.
const CURRENT_VOCAB: u64 = 100_000;

fn parse_method_choice(s: &str) -> Result<MethodChoice, String> {
    MethodChoice::parse(s)
        .ok_or_else(|| format!("unknown method `{s}`; use auto, full, lora, qlora or inference"))
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
        .filter(|(id, s)| {
            SIZE_ORGS.iter().any(|o| id.starts_with(o))
                && SIZE_MODEL_TYPES.contains(&s.model_type.as_str())
                && s.vocab_size >= CURRENT_VOCAB
        })
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
    /// Or just a size (`7B`, `1.5B`): the catalog's Llama/Qwen model with a current
    /// (100k+ entry) vocabulary nearest it.
    #[arg(long, value_parser = parse_model_size)]
    pub(crate) model_size: Option<u64>,
    /// Full fine-tuning or PEFT: auto, full, lora, qlora; or inference (one sequence of the
    /// context, tensor parallel over up to 8 GPUs).
    #[arg(long, default_value = "auto", value_parser = parse_method_choice)]
    pub(crate) method: MethodChoice,
    /// Context in tokens [default: the longest of 8192, 4096, 2048, 1024 that fits].
    #[arg(long, visible_alias = "max-seq-length", value_parser = parse_positive)]
    pub(crate) seq_len: Option<u64>,
    /// Inference: of the context, the tokens generated one at a time after the prompt
    /// (transformers' `max_new_tokens`) [default: none, the whole context prefilled at once].
    #[arg(long, visible_alias = "new-tokens", value_parser = parse_positive)]
    pub(crate) max_new_tokens: Option<u64>,
    /// Sequences per optimizer step [default: 16].
    #[arg(long, value_parser = parse_positive)]
    pub(crate) effective_batch: Option<u64>,
    /// Training stack: hf, trl, litgpt, torchtune, unsloth, mlx.
    #[arg(long, default_value = "hf", value_parser = parse_stack)]
    pub(crate) stack: moro_core::job::Stack,
    /// Host RAM per job for CPU offload (`2TiB`): offloading answers that need more are
    /// rejected. Without it the need is only reported.
    #[arg(long, value_parser = crate::commands::recipe::parse_host_memory)]
    pub(crate) host_memory: Option<u64>,
    /// Print one JSON object (sizes in bytes) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Add the offload alternative and the whole recipe to the table (wider than 100
    /// columns).
    #[arg(long)]
    pub(crate) wide: bool,
    /// Also draw the table as an SVG picture into FILE (written atomically).
    #[arg(long, value_name = "FILE")]
    pub(crate) svg: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FitRow {
    pub(crate) preset: String,
    pub(crate) name: String,
    pub(crate) vendor: &'static str,
    /// Memory of one GPU.
    pub(crate) memory_bytes: u64,
    /// The fewest GPUs of this class on which the job fits.
    pub(crate) gpus: u64,
    /// The strategy the search chose for them (`one GPU`, `DDP`, `ZeRO-3`, ...).
    pub(crate) strategy: String,
    /// US$ per GPU-hour, where the hardware document has a figure.
    pub(crate) price_usd_per_hour: Option<f64>,
    /// `gpus × price_usd_per_hour`.
    pub(crate) total_usd_per_hour: Option<f64>,
    /// `gpus × memory_bytes`.
    pub(crate) total_memory_bytes: u64,
    pub(crate) configuration: String,
    pub(crate) seq_len: u64,
    pub(crate) micro_batch_size: u64,
    pub(crate) gradient_accumulation_steps: u64,
    pub(crate) gradient_checkpointing: bool,
    /// Predicted peak of one GPU.
    pub(crate) peak_device_bytes: u64,
    /// Its upper bound, which "fits" is judged on.
    pub(crate) peak_upper_bytes: u64,
    pub(crate) headroom_bytes: i64,
    /// Host RAM the offloaded states need on each node (0 without offload).
    pub(crate) host_bytes: u64,
    /// The job, for `moro recipe generate --hardware <gpus>x<preset>`.
    pub(crate) job: moro_core::job::Job,
    /// Fewer GPUs of this class with CPU offload, when offload saves GPUs (it needs
    /// `host_bytes` of host RAM and runs the optimizer step on the CPU).
    pub(crate) with_offload: Option<FitOffload>,
}

/// The offload alternative of a [`FitRow`].
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FitOffload {
    pub(crate) gpus: u64,
    pub(crate) strategy: String,
    pub(crate) configuration: String,
    pub(crate) peak_device_bytes: u64,
    pub(crate) host_bytes: u64,
}

#[derive(Debug, Serialize)]
struct FitJson<'a> {
    model: &'a str,
    parameters: u64,
    method: &'a str,
    seq_len: Option<u64>,
    /// Inference: the tokens generated after the prompt, of `seq_len`.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_new_tokens: Option<u64>,
    gpu_counts: [u64; 7],
    order: &'static str,
    fits: &'a [FitRow],
    does_not_fit: &'a [String],
}

/// The fewest GPUs of one preset ([`FIT_GPU_COUNTS`]; Apple Silicon: one) on which the job
/// fits without CPU offload, with the search's strategy for them, and the fewest with
/// offload when that is fewer; `None` when not even 64 fit, offload included.
///
/// Each count is searched without offload, then, until an offloading layout has fitted,
/// with it (the quality objective ranks precision above the layout, so a search allowing
/// offload may pick it over a GPU-resident pure-bf16 configuration).
fn fit_preset(
    spec: &ModelSpec,
    request: &Request,
    p: &moro_core::hardware::GpuModel,
    host_memory: Option<u64>,
    cache: &moro_core::search::EstimateCache,
) -> Option<FitRow> {
    let d = p.to_device(None)?;
    let target = Target {
        hardware: moro_core::hardware::Hardware {
            devices: vec![d.clone()],
        },
        detected: false,
        spec: p.id.clone(),
    };
    let mut caps = caps_of(&target)?;
    caps.host_bytes = host_memory;
    let counts: &[u64] = if p.vendor == moro_core::hardware::Vendor::Apple {
        &[1]
    } else {
        &FIT_GPU_COUNTS
    };
    let price = price_of(&p.id);
    let mut offloaded: Option<(u64, moro_core::search::Candidate)> = None;
    let mut resident: Option<(u64, moro_core::search::Candidate)> = None;
    let best = |n: u64, offload: bool| {
        let req = Request {
            cluster: exact_cluster(n, offload),
            parallel: moro_core::job::Parallel::single(),
            ..request.clone()
        };
        best_fitting(spec, &req, &caps, cache)
    };
    for &n in counts {
        if let Some(b) = best(n, false) {
            resident = Some((n, b));
            break;
        }
        if offloaded.is_none() && n > 1 {
            offloaded = best(n, true).map(|b| (n, b));
        }
    }
    let (main, alt) = match (resident, offloaded) {
        (Some(r), o) => (r, o),
        (None, Some(o)) => (o, None),
        (None, None) => return None,
    };
    let (n, b) = main;
    let with_offload = alt.map(|(gpus, c)| FitOffload {
        gpus,
        strategy: layout_of(&c.job).strategy_text(),
        configuration: describe(&c.job),
        peak_device_bytes: c.estimate.peak_device_bytes,
        host_bytes: c.host_bytes_per_node(),
    });
    #[allow(clippy::cast_precision_loss)]
    Some(FitRow {
        preset: p.id.clone(),
        name: d.name.clone(),
        vendor: p.vendor.as_str(),
        memory_bytes: caps.usable_bytes,
        gpus: n,
        strategy: layout_of(&b.job).strategy_text(),
        price_usd_per_hour: price,
        total_usd_per_hour: price.map(|v| v * n as f64),
        total_memory_bytes: caps.usable_bytes.saturating_mul(n),
        configuration: describe(&b.job),
        seq_len: b.job.seq_len,
        micro_batch_size: b.job.micro_batch_size,
        gradient_accumulation_steps: b.job.grad_accum,
        gradient_checkpointing: b.job.gradient_checkpointing,
        peak_device_bytes: b.estimate.peak_device_bytes,
        peak_upper_bytes: b.upper_bytes(),
        headroom_bytes: b.headroom_bytes,
        host_bytes: b.host_bytes_per_node(),
        job: b.job,
        with_offload,
    })
}

/// For every catalog preset, the fewest GPUs that fit, and the presets on which not even 64
/// GPUs fit. Ordered cheapest first: by total $/hour (GPUs × $/GPU-hour) where the hardware
/// document prices the GPU, then the unpriced by total memory; the classes that fit only with
/// CPU offload come after those that fit in GPU memory (their host RAM is not priced, and can
/// be terabytes). Presets are searched in parallel.
pub(crate) fn fit_rows(
    spec: &ModelSpec,
    request: &Request,
    host_memory: Option<u64>,
) -> (Vec<FitRow>, Vec<String>) {
    let presets = moro_core::hardware::presets();
    let threads = super::workers();
    let chunk = presets.len().div_ceil(threads).max(1);
    // Every preset searches the same model and request: their estimates are shared.
    let cache = moro_core::search::EstimateCache::default();
    let cache = &cache;
    let results: Vec<(String, Option<FitRow>)> = std::thread::scope(|s| {
        let handles: Vec<_> = presets
            .chunks(chunk)
            .map(|ps| {
                s.spawn(move || {
                    ps.iter()
                        .filter(|p| p.to_device(None).is_some())
                        .map(|p| {
                            (
                                p.id.clone(),
                                fit_preset(spec, request, p, host_memory, cache),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut fits = Vec::new();
    let mut not = Vec::new();
    for (id, row) in results {
        match row {
            Some(r) => fits.push(r),
            None => not.push(id),
        }
    }
    order(&mut fits);
    (fits, not)
}

/// Cheapest first: GPU-resident before CPU offload, then by total $/hour where priced, then
/// the unpriced by total memory.
fn order(fits: &mut [FitRow]) {
    fits.sort_by(|a, b| {
        (a.host_bytes > 0).cmp(&(b.host_bytes > 0)).then_with(|| {
            match (a.total_usd_per_hour, b.total_usd_per_hour) {
                (Some(x), Some(y)) => x
                    .total_cmp(&y)
                    .then(a.total_memory_bytes.cmp(&b.total_memory_bytes)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a
                    .total_memory_bytes
                    .cmp(&b.total_memory_bytes)
                    .then(a.preset.cmp(&b.preset)),
            }
        })
    });
}

/// The context asked, or the lengths tried without one.
fn context_text(seq_len: Option<u64>) -> String {
    seq_len.map_or("8192 → 1024".to_owned(), |s| s.to_string())
}

/// What `moro fit` found: the model, and the classes that fit and those that do not.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) id: String,
    pub(crate) spec: ModelSpec,
    pub(crate) method: String,
    pub(crate) fits: Vec<FitRow>,
    pub(crate) not: Vec<String>,
}

impl Found {
    /// The heading of its picture.
    pub(crate) fn title(&self, seq_len: Option<u64>) -> String {
        format!(
            "{}: {}, context {}",
            self.id,
            self.method,
            context_text(seq_len)
        )
    }
}

/// Searches every GPU class for the job `args` describe.
pub(crate) fn find(args: &FitArgs) -> Result<Found> {
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
        cluster: None,
        objective: Objective::Quality,
        target_len: None,
        // The catalog's GPUs are searched in parallel, each search on one thread.
        workers: 1,
    };
    let inference = args.method == MethodChoice::Only(moro_core::job::Method::Inference);
    if let Some(n) = args.max_new_tokens
        && !inference
    {
        return Err(user_hint(
            format!(
                "--max-new-tokens {n}: applies to inference; a training job trains on whole \
                 sequences"
            ),
            "add --method inference, or drop --max-new-tokens",
        ));
    }
    if inference {
        let (mut fits, not) = crate::commands::fit_inference::rows(
            &spec,
            args.seq_len,
            args.max_new_tokens,
            args.stack,
        )?;
        order(&mut fits);
        return Ok(Found {
            id,
            spec,
            method: "inference".to_owned(),
            fits,
            not,
        });
    }
    // Reject an invalid request once, with its field, before searching every preset.
    let any = moro_core::hardware::Device::generic(80 * moro_core::units::GIB);
    moro_core::search::Space::new(&spec, &request, &moro_core::search::Caps::of_device(&any))
        .map_err(|e| user(e.to_string()))?;
    let (fits, not) = fit_rows(&spec, &request, args.host_memory);
    let method = match args.method {
        MethodChoice::Auto => "auto".to_owned(),
        MethodChoice::Only(m) => m.as_str().to_owned(),
    };
    Ok(Found {
        id,
        spec,
        method,
        fits,
        not,
    })
}

pub(crate) fn run(args: &FitArgs) -> Result<ExitCode> {
    let found = find(args)?;
    if let Some(path) = &args.svg {
        let svg = crate::charts::fit_svg(found.title(args.seq_len), &found.fits, &found.not);
        crate::output::write_file(path, svg.as_bytes())?;
    }
    print(args, &found)
}

/// Prints what [`find`] found, as a table or as JSON.
pub(crate) fn print(args: &FitArgs, found: &Found) -> Result<ExitCode> {
    let Found {
        id,
        spec,
        method,
        fits,
        not,
    } = found;
    if args.json {
        let doc = FitJson {
            model: id,
            parameters: spec.total_params(),
            method,
            seq_len: args.seq_len,
            max_new_tokens: args.max_new_tokens,
            gpu_counts: FIT_GPU_COUNTS,
            order: "GPU-resident answers first, CPU-offload-only answers after; each by total \
                    $/hour (GPUs × $/GPU-hour, hardware-detection.md §6) ascending, then the \
                    unpriced GPUs by total memory",
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
        context_text(args.seq_len)
    );
    if fits.is_empty() {
        out.push_str(if method == "inference" {
            "not even 8 GPUs of any catalog class serve it; try a shorter --seq-len\n"
        } else {
            "not even 64 GPUs of any catalog class fit; try --method qlora or a shorter --seq-len\n"
        });
        stdout(&out)?;
        return Ok(ExitCode::from(1));
    }
    out.push_str(&table(
        fits,
        args.wide,
        matches!(args.method, MethodChoice::Only(_)),
    ));
    if method == "inference" {
        out.push_str(&format!(
            "\n{} GPU classes serve it, {} do not even as 8. Cheapest first (GPUs × $/GPU-hour;\n\
             unpriced classes by total memory). Strategy: the fewest GPUs, tensor parallel within\n\
             one node; the longest context tried that fits them. Fits: the upper bound (`at\n\
             most`) within the usable memory; sizes in GiB per GPU.\n",
            fits.len(),
            not.len()
        ));
        stdout(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    out.push_str(&format!(
        "\n{} GPU classes fit, {} do not even as 64. Cheapest first (GPUs × $/GPU-hour; unpriced\n\
         classes by total memory; classes that need CPU offload last). Strategy: the least\n\
         communication that fits without CPU offload. Fits: the upper bound (`at most`, 95 % of\n\
         measured runs like it) within the usable memory. n: GPUs; sizes in GiB per GPU; host:\n\
         RAM per node.{}\n",
        fits.len(),
        not.len(),
        if args.wide {
            ""
        } else {
            " --wide adds the offload alternative and the whole recipe."
        }
    ));
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// The table of `moro fit`: within 100 columns (the recipe in short), or `wide` with the
/// offload alternative and the whole recipe.
fn table(fits: &[FitRow], wide: bool, method_fixed: bool) -> String {
    // Narrow: one decimal (0.1 GiB is finer than the bound's width).
    let size = move |b: u64| {
        if wide {
            gib(b)
        } else {
            format!("{:.1}", moro_core::units::gib(b))
        }
    };
    type Cell<'a> = Box<dyn Fn(&FitRow) -> String + 'a>;
    // (heading, right-aligned, cell); narrow tables leave out the card's memory (it is in
    // its name) and the host column unless a row offloads.
    let mut cols: Vec<(&str, bool, Cell)> = vec![
        ("gpu", false, Box::new(|r: &FitRow| r.preset.clone())),
        (
            if wide { "GPUs" } else { "n" },
            true,
            Box::new(|r: &FitRow| r.gpus.to_string()),
        ),
    ];
    if wide {
        cols.push(("GiB/GPU", true, Box::new(|r: &FitRow| gib(r.memory_bytes))));
    }
    cols.push((
        "$/h",
        true,
        Box::new(|r: &FitRow| {
            r.total_usd_per_hour
                .map_or("-".to_owned(), |p| format!("{p:.2}"))
        }),
    ));
    cols.push((
        "strategy",
        false,
        Box::new(move |r: &FitRow| {
            if wide || r.job.method == moro_core::job::Method::Inference {
                r.strategy.clone()
            } else {
                layout_of(&r.job).strategy_short()
            }
        }),
    ));
    cols.push((
        "peak",
        true,
        Box::new(move |r: &FitRow| size(r.peak_device_bytes)),
    ));
    cols.push((
        "at most",
        true,
        Box::new(move |r: &FitRow| size(r.peak_upper_bytes)),
    ));
    if wide || fits.iter().any(|r| r.host_bytes > 0) {
        cols.push((
            "host",
            true,
            Box::new(move |r: &FitRow| {
                if r.host_bytes == 0 {
                    "-".to_owned()
                } else {
                    size(r.host_bytes)
                }
            }),
        ));
    }
    if wide {
        cols.push((
            "with offload",
            false,
            Box::new(|r: &FitRow| {
                r.with_offload.as_ref().map_or("-".to_owned(), |o| {
                    format!(
                        "{} GPUs, {}, {} GiB/GPU + {} GiB host/node",
                        o.gpus,
                        o.strategy,
                        gib(o.peak_device_bytes),
                        gib(o.host_bytes)
                    )
                })
            }),
        ));
        cols.push((
            "recipe",
            false,
            Box::new(|r: &FitRow| r.configuration.clone()),
        ));
    } else {
        cols.push((
            "recipe",
            false,
            Box::new(move |r: &FitRow| short_recipe(&r.job, !method_fixed)),
        ));
    }
    let heads: Vec<&str> = cols.iter().map(|c| c.0).collect();
    let right: Vec<bool> = cols.iter().map(|c| c.1).collect();
    let mut t = Table::new(&heads, &right);
    for r in fits {
        t.row(cols.iter().map(|c| (c.2)(r)).collect());
    }
    t.render()
}

/// A recipe in a few words: the method (unless the request fixed it), the rank, micro batch
/// × accumulation, checkpointing.
fn short_recipe(job: &moro_core::job::Job, with_method: bool) -> String {
    if job.method == moro_core::job::Method::Inference {
        return format!(
            "{} tokens, batch {}",
            job.tokens_in_words(),
            job.micro_batch_size
        );
    }
    let mut words = Vec::new();
    if with_method {
        words.push(job.method.as_str().to_owned());
    }
    if job.method.is_peft() {
        words.push(format!("r{}", job.adapter.rank));
    }
    words.push(format!("{}×{}", job.micro_batch_size, job.grad_accum));
    if job.gradient_checkpointing {
        words.push("ckpt".to_owned());
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::recipe::best_of;

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
    fn cheapest_first_and_the_fewest_gpus() {
        let (_, spec) = model_of_size(7_000_000_000).unwrap();
        let req = Request {
            method: MethodChoice::Only(moro_core::job::Method::Full),
            seq_len: Some(2048),
            ..Request::default()
        };
        let (fits, _not) = fit_rows(&spec, &req, None);
        assert!(!fits.is_empty());
        // GPU-resident rows first; among them priced rows first, by total $/h; then the
        // unpriced by total memory.
        let resident = fits.iter().take_while(|r| r.host_bytes == 0).count();
        assert!(fits[resident..].iter().all(|r| r.host_bytes > 0));
        let fits = &fits[..resident];
        let priced = fits
            .iter()
            .take_while(|r| r.total_usd_per_hour.is_some())
            .count();
        assert!(
            fits[priced..]
                .iter()
                .all(|r| r.total_usd_per_hour.is_none())
        );
        assert!(fits[..priced].windows(2).all(|w| {
            w[0].total_usd_per_hour.unwrap_or(0.0) <= w[1].total_usd_per_hour.unwrap_or(0.0)
        }));
        assert!(
            fits[priced..]
                .windows(2)
                .all(|w| w[0].total_memory_bytes <= w[1].total_memory_bytes)
        );
        // The count is the fewest: half as many GPUs do not fit.
        for r in fits.iter().filter(|r| r.gpus > 1) {
            let p = moro_core::hardware::preset(&r.preset).unwrap();
            let d = p.to_device(None).unwrap();
            let caps = crate::commands::recipe::caps_of_device(&d);
            let fewer = Request {
                cluster: exact_cluster(r.gpus / 2, r.host_bytes > 0),
                ..req.clone()
            };
            assert!(
                best_of(&spec, &fewer, &caps).is_none(),
                "{} fits on {} GPUs",
                r.preset,
                r.gpus / 2
            );
            assert_eq!(r.job.parallel.gpus(), r.gpus);
        }
        assert!(fits.iter().any(|r| r.preset == "a100-sxm4-80gb"));
        // A 24 GB card needs several, sharded.
        let r = fits.iter().find(|r| r.preset == "rtx-4090").unwrap();
        assert!(r.gpus > 1 && r.strategy != "DDP", "{r:?}");
    }
}
