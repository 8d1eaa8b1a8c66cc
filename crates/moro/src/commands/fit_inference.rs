//! `moro fit --method inference`: for each GPU class, the fewest GPUs (1, 2, 4, 8, tensor
//! parallel within one node, the way vLLM and TGI split a model that one GPU cannot hold;
//! Apple Silicon: one) on which the model serves one sequence of the context, judged on the
//! upper bound as every other fit. Without `--seq-len`, the longest of 8192, 4096, 2048 and
//! 1024 (within the model's positions) that fits. With `--max-new-tokens`, the context is the
//! prompt and the tokens generated after it, as `moro estimate` reads the same flags.

use moro_core::bound::Verdict;
use moro_core::estimate::{DeviceProfile, Estimate};
use moro_core::job::{Job, JobSettings, Method, Stack};
use moro_core::model::ModelSpec;

use super::fit::{FitRow, price_of};
use crate::commands::recipe::caps_of_device;
use crate::error::{user, user_hint};
use anyhow::Result;

/// Tensor-parallel degrees tried, within one node.
const TP_DEGREES: [u64; 4] = [1, 2, 4, 8];

/// The contexts tried when none is asked, longest first.
const CONTEXTS: [u64; 4] = [8192, 4096, 2048, 1024];

/// One row per GPU class that serves it, and the classes that do not even as 8; an error
/// where `new_tokens` leaves no prompt in any context.
pub(crate) fn rows(
    spec: &ModelSpec,
    seq_len: Option<u64>,
    new_tokens: Option<u64>,
    stack: Stack,
) -> Result<(Vec<FitRow>, Vec<String>)> {
    let contexts: Vec<u64> = match seq_len {
        Some(s) => {
            // The job's own check, so the message is the one `moro estimate` gives.
            let job = settings(s, new_tokens, stack, 1)
                .resolve()
                .map_err(|e| user(e.to_string()))?;
            job.validate(spec).map_err(|e| user(e.to_string()))?;
            vec![s]
        }
        None => CONTEXTS
            .into_iter()
            .filter(|c| spec.max_position_embeddings == 0 || *c <= spec.max_position_embeddings)
            .filter(|c| new_tokens.is_none_or(|n| n < *c))
            .collect(),
    };
    if contexts.is_empty()
        && let Some(n) = new_tokens
    {
        return Err(user_hint(
            format!(
                "--max-new-tokens {n}: leaves no prompt in any context tried (at most {} \
                 tokens)",
                CONTEXTS[0]
            ),
            "give the context with --seq-len",
        ));
    }
    let mut fits = Vec::new();
    let mut not = Vec::new();
    let mut memo = Estimates::default();
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
                .find_map(|&ctx| serve_on(spec, p, &device, n, ctx, new_tokens, stack, &mut memo))
        });
        match row {
            Some(r) => fits.push(r),
            None => not.push(p.id.clone()),
        }
    }
    Ok((fits, not))
}

/// One sequence of `ctx` tokens (the last `new_tokens` generated) on `n` GPUs, tensor
/// parallel over all of them.
fn settings(ctx: u64, new_tokens: Option<u64>, stack: Stack, n: u64) -> JobSettings {
    JobSettings {
        method: Some(Method::Inference),
        seq_len: Some(ctx),
        new_tokens,
        micro_batch_size: Some(1),
        stack: Some(stack),
        gpus: (n > 1).then_some(n),
        tensor_parallel: (n > 1).then_some(n),
        ..JobSettings::default()
    }
}

/// The estimates made so far, by job and device profile: the catalog's GPUs share a few
/// profiles, and a generation's replay is worth making once.
#[derive(Default)]
struct Estimates(Vec<(Job, DeviceProfile, Option<Estimate>)>);

impl Estimates {
    fn of(&mut self, spec: &ModelSpec, job: &Job, profile: &DeviceProfile) -> Option<Estimate> {
        if let Some((.., e)) = self.0.iter().find(|(j, p, _)| j == job && p == profile) {
            return e.clone();
        }
        let e = moro_core::estimate::estimate(spec, job, profile).ok();
        self.0.push((job.clone(), profile.clone(), e.clone()));
        e
    }
}

/// The row for `n` GPUs of preset `p` at context `ctx`, when it fits.
#[allow(clippy::too_many_arguments)]
fn serve_on(
    spec: &ModelSpec,
    p: &moro_core::hardware::GpuModel,
    device: &moro_core::hardware::Device,
    n: u64,
    ctx: u64,
    new_tokens: Option<u64>,
    stack: Stack,
    memo: &mut Estimates,
) -> Option<FitRow> {
    let job = settings(ctx, new_tokens, stack, n).resolve().ok()?;
    job.validate(spec).ok()?;
    moro_core::job::against::check(&job, spec, Some(device)).ok()?;
    let caps = caps_of_device(device);
    let (usable, profile) = (caps.usable_bytes, caps.profile);
    let est = memo.of(spec, &job, &profile)?;
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
            "inference, {} tokens, batch 1, {}, {} attention, {strategy}",
            job.tokens_in_words(),
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
