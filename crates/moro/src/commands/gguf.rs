//! `moro gguf`: what llama.cpp allocates to run a GGUF model (weights on the GPU and the
//! host, KV cache, compute buffer), from the file's header alone.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use moro_core::formats::gguf::{
    GgmlType, GgufHeader, GgufInferenceEstimate, GgufInferenceParams, arch, gguf_inference_estimate,
};
use moro_core::job::Method;
use moro_core::units::MIB;
use serde::Serialize;

use crate::commands::estimate::EstimateArgs;
use crate::error::{user, user_hint};
use crate::output::{Table, gib, json, note, size, stdout};
use crate::resolve::{self, HubArgs};

/// What the CUDA context takes outside llama.cpp's buffers (driver state, cuBLAS handle,
/// loaded kernels): about 0.3–0.5 GiB on current drivers with lazy module loading; the middle
/// is used for the fit check. [APPROXIMATE]
const CUDA_CONTEXT_BYTES: u64 = 384 * MIB;

/// KV cache types llama.cpp accepts for `--cache-type-k/-v` (`common/arg.cpp`
/// `kv_cache_types`).
const CACHE_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
];

fn parse_cache_type(s: &str) -> Result<GgmlType, String> {
    CACHE_TYPES
        .iter()
        .find(|t| t.eq_ignore_ascii_case(s.trim()))
        .and_then(|t| GgmlType::from_name(t))
        .ok_or_else(|| {
            format!(
                "unknown KV cache type `{s}`; use {}",
                CACHE_TYPES.join(", ")
            )
        })
}

fn parse_flash_attn(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "auto" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("`{s}`: use on, off or auto")),
    }
}

/// Arguments of `moro gguf`.
#[derive(Debug, Args)]
pub(crate) struct GgufArgs {
    /// A .gguf file (or a directory holding one), or a Hub repo id with --file.
    pub(crate) model: String,
    /// The .gguf file in the Hub repo given as MODEL (only its header is fetched).
    #[arg(long, value_name = "NAME.gguf")]
    pub(crate) file: Option<String>,
    /// Context size (llama.cpp `--ctx-size`); 0 = the model's training context.
    #[arg(long, short = 'c', value_name = "N", default_value_t = 4096)]
    pub(crate) ctx_size: u64,
    /// Logical batch size (`--batch-size`).
    #[arg(long, short = 'b', value_name = "N", default_value_t = 2048)]
    pub(crate) batch: u64,
    /// Physical batch size (`--ubatch-size`).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub(crate) ubatch: u64,
    /// Layers offloaded to the GPU (`--n-gpu-layers`); default all, output layer included.
    /// Layers left out count on the host.
    #[arg(long, alias = "ngl", value_name = "N", allow_negative_numbers = true)]
    pub(crate) n_gpu_layers: Option<i64>,
    /// K cache type (`--cache-type-k`): f16, q8_0, q4_0, ...
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_cache_type)]
    pub(crate) cache_type_k: GgmlType,
    /// V cache type (`--cache-type-v`); a quantized V cache needs flash attention.
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_cache_type)]
    pub(crate) cache_type_v: GgmlType,
    /// Flash attention (`--flash-attn`): on, off, or auto (on, as llama.cpp decides on CUDA).
    #[arg(
        long,
        value_name = "on|off|auto",
        num_args = 0..=1,
        default_value = "auto",
        default_missing_value = "on",
        value_parser = parse_flash_attn
    )]
    pub(crate) flash_attn: bool,
    /// Full-size KV cache for sliding-window layers (`--swa-full`).
    #[arg(long)]
    pub(crate) swa_full: bool,
    /// Memory available on the GPU (`24GiB`): say whether it fits.
    #[arg(long, conflicts_with = "hardware", allow_hyphen_values = true)]
    pub(crate) memory: Option<String>,
    /// Hardware: `detect`, a preset (`rtx-4090`), a GPU name.
    #[arg(long)]
    pub(crate) hardware: Option<String>,
    /// Never use the network (as HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub(crate) offline: bool,
    /// Hub revision of MODEL (branch, tag or commit).
    #[arg(long, value_name = "REV")]
    pub(crate) revision: Option<String>,
    /// Print one JSON object (sizes in bytes) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--n-gpu-layers`: negative or absent = all (`u64::MAX`).
fn ngl(n: Option<i64>) -> u64 {
    match n {
        Some(n) if n >= 0 => n.unsigned_abs(),
        _ => u64::MAX,
    }
}

/// The JSON document of `moro gguf --json`.
#[derive(Debug, Serialize)]
struct GgufJson<'a> {
    file: &'a str,
    architecture: &'a str,
    block_count: u64,
    context_length: Option<u64>,
    weight_bytes: u64,
    weight_bytes_by_type: BTreeMap<&'static str, u64>,
    params: &'a GgufInferenceParams,
    #[serde(flatten)]
    estimate: &'a GgufInferenceEstimate,
    cuda_context_bytes: u64,
    device_bytes: u64,
    memory_bytes: Option<u64>,
    fits: Option<bool>,
    headroom_bytes: Option<i64>,
}

pub(crate) fn run(args: &GgufArgs) -> Result<ExitCode> {
    let params = GgufInferenceParams {
        ctx_size: args.ctx_size,
        n_batch: args.batch.max(1),
        n_ubatch: args.ubatch.max(1),
        n_gpu_layers: ngl(args.n_gpu_layers),
        type_k: args.cache_type_k,
        type_v: args.cache_type_v,
        flash_attn: args.flash_attn,
        swa_full: args.swa_full,
    };
    let hub = HubArgs {
        offline: args.offline,
        revision: args.revision.clone(),
        exact_weights: false,
    };
    let target = crate::hw::resolve(args.hardware.as_deref(), args.memory.as_deref())?;
    let (label, header) = resolve::gguf_header(&args.model, args.file.as_deref(), &hub)?;
    report(&label, &header, &params, target.as_ref(), args.json)
}

/// `moro estimate --model FILE.gguf`: the same estimate, from the estimate flags
/// (`--seq-len` is the context).
pub(crate) fn from_estimate(args: &EstimateArgs, model: &str) -> Result<ExitCode> {
    match args.job.method {
        Some(Method::Inference) => {}
        None => note("note: a .gguf file runs in llama.cpp: estimating inference"),
        Some(m) => {
            return Err(user_hint(
                format!(
                    "`{model}` is a GGUF file (llama.cpp): moro estimates it for inference, not \
                     {}",
                    m.as_str()
                ),
                "use --method inference or `moro gguf FILE`; for training, point --model at \
                 the safetensors model (directory or Hub id)",
            ));
        }
    }
    if args.job.micro_batch_size.is_some_and(|b| b > 1) {
        note("note: the llama.cpp estimate is for one sequence; --micro-batch-size is ignored");
    }
    let params = GgufInferenceParams {
        ctx_size: args.job.seq_len.unwrap_or(4096),
        ..GgufInferenceParams::default()
    };
    let target = crate::hw::resolve(args.hardware.as_deref(), args.memory.as_deref())?;
    let (label, header) = resolve::gguf_header(model, None, &args.hub)?;
    report(&label, &header, &params, target.as_ref(), args.json)
}

fn report(
    label: &str,
    header: &GgufHeader,
    params: &GgufInferenceParams,
    target: Option<&crate::hw::Target>,
    as_json: bool,
) -> Result<ExitCode> {
    let est = gguf_inference_estimate(header, params).map_err(|e| user(format!("{label}: {e}")))?;
    let a = arch(header).map_err(|e| user(format!("{label}: {e}")))?;
    let device = est.total_gpu_bytes.saturating_add(CUDA_CONTEXT_BYTES);
    let memory = target.and_then(crate::hw::Target::memory_bytes);
    let headroom = memory
        .map(|m| i64::try_from(m).unwrap_or(i64::MAX) - i64::try_from(device).unwrap_or(i64::MAX));
    let fits = headroom.map(|h| h >= 0);
    if as_json {
        let doc = GgufJson {
            file: label,
            architecture: &a.architecture,
            block_count: a.block_count,
            context_length: a.context_length,
            weight_bytes: header.weight_bytes(),
            weight_bytes_by_type: header.bytes_by_type().into_iter().collect(),
            params,
            estimate: &est,
            cuda_context_bytes: CUDA_CONTEXT_BYTES,
            device_bytes: device,
            memory_bytes: memory,
            fits,
            headroom_bytes: headroom,
        };
        stdout(&json(&doc)?)?;
    } else {
        stdout(&render(label, header, params, &est, target, headroom))?;
    }
    Ok(match fits {
        Some(false) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

fn render(
    label: &str,
    header: &GgufHeader,
    p: &GgufInferenceParams,
    est: &GgufInferenceEstimate,
    target: Option<&crate::hw::Target>,
    headroom: Option<i64>,
) -> String {
    let mut out = String::new();
    let total_w = header.weight_bytes();
    let mix: Vec<String> = header
        .bytes_by_type()
        .iter()
        .filter_map(|(t, b)| {
            #[allow(clippy::cast_precision_loss)]
            let pct = *b as f64 * 100.0 / total_w.max(1) as f64;
            (pct >= 0.5).then(|| format!("{t} {pct:.0}%"))
        })
        .take(4)
        .collect();
    let (arch_name, n_layer, swa) = arch(header).map_or_else(
        |_| ("?".to_owned(), 0, false),
        |a| (a.architecture, a.block_count, a.sliding_window.is_some()),
    );
    out.push_str(&format!(
        "model   {label} ({arch_name}, {n_layer} layers, {} of weights: {})\n",
        size(total_w),
        mix.join(", ")
    ));
    let cells = if swa && est.kv_size_swa != est.kv_size {
        format!(
            "{} KV cells, {} on sliding-window layers",
            est.kv_size, est.kv_size_swa
        )
    } else {
        format!("{} KV cells", est.kv_size)
    };
    out.push_str(&format!(
        "run     llama.cpp, context {cells}, batch {}, ubatch {}, {}/{n_layer} layers on the \
         GPU{}, K cache {}, V cache {}, flash attention {}\n\n",
        p.n_batch,
        p.n_ubatch,
        est.n_layers_offloaded,
        if est.output_on_gpu { " + output" } else { "" },
        p.type_k.name,
        p.type_v.name,
        if p.flash_attn { "on" } else { "off" },
    ));
    let mut t = Table::new(&["component", "GiB", "bytes"], &[false, true, true]);
    let mut row = |name: &str, b: u64| t.row(vec![name.to_owned(), gib(b), b.to_string()]);
    row("GPU weights", est.gpu_weights_bytes);
    row("KV cache", est.kv_cache_bytes);
    row("compute buffer", est.compute_buffer_bytes);
    row("total GPU", est.total_gpu_bytes);
    row("host weights", est.host_weights_bytes);
    if est.kv_cache_host_bytes > 0 {
        row("host KV cache", est.kv_cache_host_bytes);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\nnote: nvidia-smi also shows the CUDA context, about 0.3-0.5 GiB outside llama.cpp's \
         buffers (≈ {} GiB in all); the compute buffer is an approximation (±25%)\n",
        gib(est.total_gpu_bytes.saturating_add(CUDA_CONTEXT_BYTES))
    ));
    if let (Some(t), Some(h)) = (target, headroom)
        && let Some(m) = t.memory_bytes()
    {
        let verdict = if h >= 0 { "fits" } else { "does NOT fit" };
        let how = if h >= 0 { "headroom" } else { "over" };
        out.push_str(&format!(
            "\n{verdict} on {} ({} GiB): {} GiB {how}\n",
            t.display(),
            gib(m),
            gib(h.unsigned_abs())
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        assert_eq!(parse_cache_type("Q8_0").unwrap(), GgmlType::Q8_0);
        assert!(parse_cache_type("q4_K").is_err());
        assert_eq!(ngl(None), u64::MAX);
        assert_eq!(ngl(Some(-1)), u64::MAX);
        assert_eq!(ngl(Some(20)), 20);
        assert!(parse_flash_attn("auto").unwrap() && !parse_flash_attn("off").unwrap());
    }
}
