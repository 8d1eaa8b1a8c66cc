//! `moro fit --method inference`: for each GPU class, the fewest GPUs (1, 2, 4, 8, tensor
//! parallel within one node, the way vLLM and TGI split a model that one GPU cannot hold;
//! Apple Silicon: one) on which the model serves one sequence of the context, judged on the
//! upper bound as every other fit. Without `--seq-len`, the longest of 8192, 4096, 2048 and
//! 1024 (within the model's positions) that fits.

use moro_core::bound::Verdict;
use moro_core::job::{JobSettings, Method, Stack};
use moro_core::model::ModelSpec;

use super::fit::{FitRow, price_of};
use crate::commands::recipe::caps_of_device;

/// Tensor-parallel degrees tried, within one node.
const TP_DEGREES: [u64; 4] = [1, 2, 4, 8];

/// The contexts tried when none is asked, longest first.
const CONTEXTS: [u64; 4] = [8192, 4096, 2048, 1024];

/// One row per GPU class that serves it, and the classes that do not even as 8.
pub(crate) fn rows(
    spec: &ModelSpec,
    seq_len: Option<u64>,
    stack: Stack,
) -> (Vec<FitRow>, Vec<String>) {
    let contexts: Vec<u64> = match seq_len {
        Some(s) => vec![s],
        None => CONTEXTS
            .into_iter()
            .filter(|c| spec.max_position_embeddings == 0 || *c <= spec.max_position_embeddings)
            .collect(),
    };
    let mut fits = Vec::new();
    let mut not = Vec::new();
    for p in moro_core::hardware::presets() {
        let Some(device) = p.to_device(None) else {
            continue;
        };
        let degrees: &[u64] = if p.vendor == moro_core::hardware::Vendor::Apple {
            &[1]
        } else {
            &TP_DEGREES
        };
        let row = degrees.iter().find_map(|&n| {
            contexts
                .iter()
                .find_map(|&ctx| serve_on(spec, p, &device, n, ctx, stack))
        });
        match row {
            Some(r) => fits.push(r),
            None => not.push(p.id.clone()),
        }
    }
    (fits, not)
}

/// The row for `n` GPUs of preset `p` at context `ctx`, when it fits.
fn serve_on(
    spec: &ModelSpec,
    p: &moro_core::hardware::GpuModel,
    device: &moro_core::hardware::Device,
    n: u64,
    ctx: u64,
    stack: Stack,
) -> Option<FitRow> {
    let settings = JobSettings {
        method: Some(Method::Inference),
        seq_len: Some(ctx),
        micro_batch_size: Some(1),
        stack: Some(stack),
        gpus: (n > 1).then_some(n),
        tensor_parallel: (n > 1).then_some(n),
        ..JobSettings::default()
    };
    let job = settings.resolve().ok()?;
    job.validate(spec).ok()?;
    moro_core::job::against::check(&job, spec, Some(device)).ok()?;
    let caps = caps_of_device(device);
    let (usable, profile) = (caps.usable_bytes, caps.profile);
    let est = moro_core::estimate::estimate(spec, &job, &profile).ok()?;
    let judged = crate::verdict::judge(&est, &job, Some(usable));
    if judged.verdict != Some(Verdict::Fits) {
        return None;
    }
    let price = price_of(&p.id);
    let strategy = if n == 1 {
        "one GPU".to_owned()
    } else {
        format!("tensor parallel ×{n}")
    };
    #[allow(clippy::cast_precision_loss)]
    Some(FitRow {
        preset: p.id.clone(),
        name: device.name.clone(),
        vendor: p.vendor.as_str(),
        memory_bytes: usable,
        gpus: n,
        configuration: format!(
            "inference, {ctx} tokens, batch 1, {}, {} attention, {strategy}",
            job.precision.as_str(),
            job.attention.as_str()
        ),
        strategy,
        price_usd_per_hour: price,
        total_usd_per_hour: price.map(|v| v * n as f64),
        total_memory_bytes: usable.saturating_mul(n),
        seq_len: ctx,
        micro_batch_size: 1,
        gradient_accumulation_steps: 1,
        gradient_checkpointing: false,
        peak_device_bytes: est.peak_device_bytes,
        peak_upper_bytes: judged.upper.device,
        headroom_bytes: i64::try_from(usable).unwrap_or(i64::MAX)
            - i64::try_from(est.peak_device_bytes).unwrap_or(i64::MAX),
        host_bytes: 0,
        job,
        with_offload: None,
    })
}
