//! The pictures of an estimate and of a fit table (`--svg`, and `moro serve`'s page): the
//! numbers come from the same resolved job and the same estimator; `moro-chart` draws them.

use moro_chart::{Breakdown, FitTable, LineChart, Panel, Segment, Series};
use moro_core::estimate::Estimate;
use moro_core::job::{Attention, Job, Method};

use crate::setup::JobSetup;
use crate::verdict::judge;

/// The most points a sweep draws.
const SWEEP_POINTS: usize = 9;

/// The device peak of `job`, a variation of `setup`'s job whose estimate is `est`: `est`'s
/// own peak for the job itself, else a new estimate; `None` where the job is refused, by the
/// model or by the hardware (FlashAttention on a GPU without it), as [`crate::setup`] refuses
/// it.
fn peak_of(setup: &JobSetup, est: &Estimate, job: &Job) -> Option<u64> {
    if *job == setup.job {
        return Some(est.peak_device_bytes);
    }
    let spec = &setup.model.spec;
    job.validate(spec).ok()?;
    let device = setup
        .target
        .as_ref()
        .and_then(|t| t.hardware.devices.first());
    moro_core::job::against::check(job, spec, device).ok()?;
    let e = moro_core::estimate::estimate(spec, job, &setup.profile).ok()?;
    Some(crate::resolve::apply_stored(&setup.model, job, &setup.profile, e).peak_device_bytes)
}

/// Powers of two from `lo` up to `hi` with `at` among them, at most [`SWEEP_POINTS`].
fn doubling(lo: u64, hi: u64, at: u64) -> Vec<u64> {
    let mut xs: Vec<u64> = std::iter::successors(Some(lo.max(1)), |x| x.checked_mul(2))
        .take_while(|x| *x <= hi)
        .collect();
    xs.push(at);
    xs.sort_unstable();
    xs.dedup();
    let i = xs.iter().position(|x| *x == at).unwrap_or(0);
    let start = i
        .saturating_sub(SWEEP_POINTS / 2)
        .min(xs.len().saturating_sub(SWEEP_POINTS));
    xs.into_iter().skip(start).take(SWEEP_POINTS).collect()
}

/// Where a sweep's axis ends: twice the larger of the GPU's memory and the job's own peak.
fn ceiling(setup: &JobSetup, est: &Estimate) -> Option<u64> {
    let gpu = capacity(setup).map_or(0, |c| c.1);
    Some(gpu.max(est.peak_device_bytes).saturating_mul(2)).filter(|c| *c > 0)
}

/// The GPU's name and memory, when the job names one.
fn capacity(setup: &JobSetup) -> Option<(String, u64)> {
    let t = setup.target.as_ref()?;
    Some((t.display(), t.memory_bytes()?))
}

/// The stacked bar of the peak's components at the device level.
pub(crate) fn breakdown(setup: &JobSetup, est: &Estimate) -> Panel {
    let memory = setup
        .target
        .as_ref()
        .and_then(crate::hw::Target::memory_bytes);
    let judged = judge(est, &setup.job, memory);
    Breakdown {
        title: format!(
            "{}: {} — peak {} GiB at {}",
            setup.model.id,
            setup.job.method.as_str(),
            moro_chart::gib(est.peak_device_bytes),
            est.peak_phase.as_str()
        ),
        segments: est
            .components
            .iter()
            .map(|(c, b)| Segment {
                label: c.as_str().replace('_', " "),
                bytes: *b,
            })
            .collect(),
        bound: Some(judged.upper.device),
        capacity: capacity(setup),
    }
    .panel()
}

/// Peak against sequence length: the job's attention, flash attention and eager attention
/// (its quadratic score matrix), each once.
pub(crate) fn against_seq_len(setup: &JobSetup, est: &Estimate) -> Panel {
    let job = &setup.job;
    let hi = setup
        .model
        .spec
        .max_position_embeddings
        .max(job.seq_len)
        .min(job.seq_len.saturating_mul(8).max(16_384));
    let xs = doubling(512.min(job.seq_len), hi, job.seq_len);
    let mut kinds = vec![job.attention];
    for other in [Attention::Flash, Attention::Eager] {
        if !kinds.contains(&other) {
            kinds.push(other);
        }
    }
    let series = kinds
        .into_iter()
        .map(|a| Series {
            name: format!("{} attention", a.as_str()),
            points: xs
                .iter()
                .map(|&x| {
                    let mut j = job.clone();
                    j.seq_len = x;
                    j.attention = a;
                    (x, peak_of(setup, est, &j))
                })
                .collect(),
        })
        .filter(|s: &Series| s.points.iter().any(|p| p.1.is_some()))
        .collect();
    LineChart {
        title: "peak (device) against sequence length".into(),
        x_label: if job.method == Method::Inference {
            "context, tokens".into()
        } else {
            "sequence length, tokens".into()
        },
        series,
        capacity: capacity(setup),
        marked: Some(job.seq_len),
        ceiling: ceiling(setup, est),
    }
    .panel()
}

/// Peak against micro batch, 1 to 64.
pub(crate) fn against_micro_batch(setup: &JobSetup, est: &Estimate) -> Panel {
    let job = &setup.job;
    let xs = doubling(1, 64.max(job.micro_batch_size), job.micro_batch_size);
    let points = xs
        .iter()
        .map(|&x| {
            let mut j = job.clone();
            j.micro_batch_size = x;
            (x, peak_of(setup, est, &j))
        })
        .collect();
    LineChart {
        title: "peak (device) against micro batch".into(),
        x_label: if job.method == Method::Inference {
            "concurrent sequences".into()
        } else {
            "micro batch, sequences".into()
        },
        series: vec![Series {
            name: format!("{} tokens", job.seq_len),
            points,
        }],
        capacity: capacity(setup),
        marked: Some(job.micro_batch_size),
        ceiling: ceiling(setup, est),
    }
    .panel()
}

/// The whole picture of an estimate: the bar, then both sweeps.
pub(crate) fn estimate_svg(setup: &JobSetup, est: &Estimate) -> String {
    moro_chart::document(&[
        breakdown(setup, est),
        against_seq_len(setup, est),
        against_micro_batch(setup, est),
    ])
}

/// The fit table as a picture.
pub(crate) fn fit_svg(
    title: String,
    rows: &[crate::commands::fit::FitRow],
    not: &[String],
) -> String {
    let table = FitTable {
        title,
        rows: rows
            .iter()
            .map(|r| moro_chart::FitRow {
                label: format!("{} × {}", r.gpus, r.name),
                detail: match r.total_usd_per_hour {
                    Some(p) => format!("{}, ${p:.2}/h", r.strategy),
                    None => r.strategy.clone(),
                },
                peak: r.peak_device_bytes,
                bound: r.peak_upper_bytes,
                memory: r.memory_bytes,
            })
            .collect(),
        does_not_fit: not.to_vec(),
    };
    moro_chart::document(&[table.panel()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_keeps_the_job_and_at_most_nine_points() {
        assert_eq!(doubling(512, 4096, 3000), [512, 1024, 2048, 3000, 4096]);
        let xs = doubling(1, 1 << 20, 4);
        assert_eq!(xs.len(), SWEEP_POINTS);
        assert!(xs.contains(&4));
        assert_eq!(xs[0], 1);
    }
}
