//! Host memory of CPU-offloaded DeepSpeed runs, per rank, against DeepSpeed's own estimator.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Job, Method, Offload, Parallel, Precision, Sharding};

/// DeepSpeed's `estimate_zero3_model_states_mem_needs(total_params, …, num_gpus_per_node=8,
/// cpu_offload=True, cpu_offload_params=True, zero_init=True)` gives
/// `cpu_mem = total_params * 18 * 1.5` for the node; one of its 8 ranks holds an eighth.
/// Llama-2-7B has 6,738,415,616 parameters (docs/model-params.md).
#[test]
fn zero3_full_offload_matches_deepspeeds_estimator_per_rank() {
    let m = catalog::load(catalog::find("meta-llama/Llama-2-7b-hf").expect("catalog")).unwrap();
    let total: u64 = 6_738_415_616;
    assert_eq!(m.total_params(), total);
    let job = Job {
        method: Method::Full,
        precision: Precision::Bf16,
        parallel: Parallel {
            data_parallel: 8,
            sharding: Sharding::Zero3,
            offload: Offload::OptimizerAndParams,
            ..Parallel::single()
        },
        ..Job::default()
    };
    let e = estimate(&m, &job, &DeviceProfile::default()).unwrap();
    let node = total * 18 * 3 / 2;
    assert_eq!(e.host_bytes, node / 8);
    assert_eq!(e.host_bytes_per_node(8), node);
    // Optimizer offload only (`cpu_offload_params=False`, zero_init): 16 B per parameter.
    let mut opt = job.clone();
    opt.parallel.offload = Offload::Optimizer;
    let e = estimate(&m, &opt, &DeviceProfile::default()).unwrap();
    assert_eq!(e.host_bytes, total * 16 * 3 / 2 / 8);
}

/// DeepSpeed ZeRO-1/2 allocate two `reduce_bucket_size` buffers (16-bit) at the start of every
/// backward and release them after it (`stage_1_and_2.py`). Qwen-1.8B (hidden 2,048): the
/// HF "auto" bucket is 2,048² elements; Qwen's own config says 2e8. The backward phases
/// differ by 2 × (2e8 − 2,048²) × 2 bytes; the forward does not see them.
#[test]
fn zero2_gradient_buckets_live_in_backward() {
    use moro_core::estimate::{Component, Phase};
    let m = catalog::load(catalog::find("Qwen/Qwen-1_8B").expect("catalog")).unwrap();
    assert_eq!(m.hidden_size, 2048);
    let phase_bytes = |bucket: Option<u64>, phase: Phase| {
        let mut job = Job {
            method: Method::Adapters,
            parallel: Parallel {
                sharding: Sharding::Zero2,
                reduce_bucket: bucket,
                ..Parallel::single()
            },
            ..Job::default()
        };
        job.adapter.targets = moro_core::targets::resolve(&m, &job.adapter.targets);
        estimate(&m, &job, &DeviceProfile::default())
            .unwrap()
            .phase_component(phase, Component::Transients)
    };
    let auto = 2048 * 2048;
    assert_eq!(
        phase_bytes(Some(200_000_000), Phase::LossBackward)
            - phase_bytes(None, Phase::LossBackward),
        2 * (200_000_000 - auto) * 2
    );
    assert_eq!(
        phase_bytes(Some(200_000_000), Phase::ForwardEnd),
        phase_bytes(None, Phase::ForwardEnd)
    );
}
