//! Exact stored weights (from safetensors headers) applied to an [`Estimate`].
//!
//! The estimator counts the base weights from the config (`params × bytes`, or the
//! quantized layout the job asks for). When the checkpoint's headers are known, the bytes it
//! stores are exact, and for a pre-quantized checkpoint (GPTQ, AWQ, bitsandbytes 4/8-bit,
//! FP8, MXFP4, compressed-tensors) they are what the model holds once loaded.
//! [`loaded_weight_bytes`] says which bytes the job will hold; [`with_stored_weights`]
//! replaces the `Weights` component with them in every phase and recomputes the peak and the
//! three levels the way the estimator does.

use crate::formats::safetensors::StoredWeights;
use crate::job::{Job, Method, Quantization};
use crate::model::ModelSpec;

use super::weights::base_weight_bytes;
use super::{Component, DeviceProfile, Estimate, Regime};

/// Bytes per element of a safetensors dtype name (`Dtype`'s `Debug`), for the float dtypes a
/// checkpoint may be converted from on load.
fn float_width(dtype: &str) -> Option<u64> {
    match dtype {
        "F64" => Some(8),
        "F32" => Some(4),
        "F16" | "BF16" => Some(2),
        _ => None,
    }
}

/// The base-weight bytes the job holds when it loads this checkpoint (unsharded), or `None`
/// when the estimator's own count applies:
///
/// - a pre-quantized checkpoint is held as stored: its stored bytes;
/// - a float checkpoint that the job quantizes on load (QLoRA on a bf16 checkpoint): `None`,
///   the estimator models the quantized layout;
/// - a float checkpoint loaded in the job's dtype: each float dtype's element count (its
///   bytes over its width) times the load width (`param_bytes` for full fine-tuning,
///   `frozen_bytes` otherwise); other dtypes (integer buffers) count as stored.
#[must_use]
pub fn loaded_weight_bytes(stored: &StoredWeights, job: &Job, regime: &Regime) -> Option<u64> {
    if stored.total_bytes == 0 {
        return None;
    }
    if stored.quantization.is_some() {
        return Some(stored.total_bytes);
    }
    if job.quantization != Quantization::None {
        return None;
    }
    let width = if job.method == Method::Full {
        regime.param_bytes
    } else {
        regime.frozen_bytes
    };
    let mut total = 0u64;
    for (dtype, &bytes) in &stored.by_dtype {
        let b = match float_width(dtype) {
            Some(w) => (bytes / w).saturating_mul(width),
            None => bytes,
        };
        total = total.saturating_add(b);
    }
    Some(total)
}

/// `v · num / den` without overflow (`den > 0`).
fn scale(v: u64, num: u64, den: u64) -> u64 {
    let r = u128::from(v) * u128::from(num) / u128::from(den);
    u64::try_from(r).unwrap_or(u64::MAX)
}

/// Replaces the base weights of `est` (made by [`super::estimate`] for `model`, `job` and
/// `device`) with `loaded_bytes`, the unsharded bytes the job holds (see
/// [`loaded_weight_bytes`]).
///
/// Each phase's `Weights` is scaled by `loaded_bytes / assumed`, where `assumed` is the
/// estimator's own unsharded count, so sharding and tensor parallelism keep their split.
/// The peak phase, the allocated level (with the device's offset), the allocator reserve
/// (from the churn of the new peak phase and `device.reserve_ratio`) and the device level are
/// recomputed as the estimator computes them; memory outside the allocator and the CUDA
/// context are kept. With `loaded_bytes` equal to `assumed` the estimate is unchanged.
#[must_use]
pub fn with_stored_weights(
    mut est: Estimate,
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
    loaded_bytes: u64,
) -> Estimate {
    // As `estimate` does.
    let (built, job) = crate::stack::with_job(model, job);
    let (model, job) = (built.as_ref(), job.as_ref());
    let assumed = base_weight_bytes(model, job, &est.regime);
    if assumed == 0 || assumed == loaded_bytes {
        return est;
    }
    for phase in &mut est.phases {
        for c in &mut phase.components {
            if c.0 == Component::Weights {
                c.1 = scale(c.1, loaded_bytes, assumed);
            }
        }
    }
    if est.phases.is_empty() {
        return est;
    }
    let outside = est.component(Component::OutsideAllocator);
    let context = est.component(Component::CudaContext);
    super::set_levels(&mut est, device, outside, context);
    est
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::estimate;
    use crate::units::MIB;

    fn model() -> ModelSpec {
        crate::catalog::load(
            crate::catalog::find("meta-llama/Llama-3.1-8B").expect("catalog entry"),
        )
        .expect("catalog spec")
    }

    fn stored(by: &[(&str, u64)], quantization: Option<&'static str>) -> StoredWeights {
        StoredWeights {
            total_bytes: by.iter().map(|x| x.1).sum(),
            by_dtype: by.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            params_estimate: 0,
            quantization,
        }
    }

    #[test]
    fn same_bytes_change_nothing() {
        let m = model();
        let d = DeviceProfile::default();
        for method in [Method::Adapters, Method::Full, Method::Inference] {
            let job = Job {
                method,
                ..Job::default()
            };
            let est = estimate(&m, &job, &d).expect("estimate");
            let assumed = base_weight_bytes(&m, &job, &est.regime);
            let again = with_stored_weights(est.clone(), &m, &job, &d, assumed);
            assert_eq!(again, est);
        }
    }

    #[test]
    fn weights_shift_every_level_by_the_difference() {
        let m = model();
        let d = DeviceProfile::default();
        let job = Job {
            method: Method::Inference,
            ..Job::default()
        };
        let est = estimate(&m, &job, &d).expect("estimate");
        let assumed = base_weight_bytes(&m, &job, &est.regime);
        // 64 MiB fewer: weights are resident, so the allocated level drops by exactly that
        // and the reserve stays within one 2 MiB rounding.
        let less = assumed - 64 * MIB;
        let e = with_stored_weights(est.clone(), &m, &job, &d, less);
        assert_eq!(e.component(Component::Weights), less);
        assert_eq!(e.peak_allocated_bytes, est.peak_allocated_bytes - 64 * MIB);
        let gap = |x: &Estimate| x.peak_reserved_bytes - x.peak_allocated_bytes;
        assert!(gap(&e).abs_diff(gap(&est)) <= 2 * MIB);
        assert_eq!(
            e.peak_device_bytes - e.peak_reserved_bytes,
            est.peak_device_bytes - est.peak_reserved_bytes
        );
        for p in &e.phases {
            let w = p
                .components
                .iter()
                .find(|c| c.0 == Component::Weights)
                .map_or(0, |c| c.1);
            assert_eq!(w, less, "{:?}", p.phase);
        }
        let total: u64 = e.components.iter().map(|c| c.1).sum();
        assert_eq!(total, e.peak_device_bytes);
    }

    #[test]
    fn which_bytes_the_job_holds() {
        let lora = Job::default();
        let r = Regime::resolve(&model(), &lora);
        // A GPTQ checkpoint is held as stored, whatever the job's dtype.
        let gptq = stored(&[("I32", 1000), ("F16", 200)], Some("gptq"));
        assert_eq!(loaded_weight_bytes(&gptq, &lora, &r), Some(1200));
        // An fp32 checkpoint loaded in 16-bit: half its float bytes; integer buffers as
        // stored.
        let f32 = stored(&[("F32", 4000), ("I64", 16)], None);
        assert_eq!(r.frozen_bytes, 2);
        assert_eq!(loaded_weight_bytes(&f32, &lora, &r), Some(2000 + 16));
        // QLoRA on a float checkpoint: the estimator's NF4 layout applies.
        let qlora = Job {
            quantization: Quantization::Nf4Dq,
            ..Job::default()
        };
        assert_eq!(loaded_weight_bytes(&f32, &qlora, &r), None);
        assert_eq!(loaded_weight_bytes(&stored(&[], None), &lora, &r), None);
    }
}
