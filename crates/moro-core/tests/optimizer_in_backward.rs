//! torchtune's `optimizer_in_bwd`: one parameter's gradient at a time.

use moro_core::catalog;
use moro_core::estimate::{Component, DeviceProfile, Phase, estimate};
use moro_core::job::{Job, Method, Optimizer, Precision, Stack};

fn job(in_backward: bool) -> Job {
    Job {
        method: Method::Full,
        precision: Precision::Bf16,
        optimizer: Optimizer::PagedAdamw32bit,
        stack: Stack::Torchtune,
        micro_batch_size: 4,
        seq_len: 2048,
        gradient_checkpointing: true,
        optimizer_in_backward: in_backward,
        ..Job::default()
    }
}

/// Llama-2-7B's largest parameters are its embedding and output matrices, 32,000 × 4,096 in
/// bf16: 262,144,000 bytes. With the step in backward that is all the gradient memory once
/// backward is done; without it, every parameter's bf16 gradient (2 × 6,738,415,616 bytes).
#[test]
fn gradients_are_one_parameter_at_a_time() {
    let m = catalog::load(catalog::find("meta-llama/Llama-2-7b-hf").expect("catalog")).unwrap();
    let grads_at_end = |j: &Job| {
        estimate(&m, j, &DeviceProfile::default())
            .unwrap()
            .phase_component(Phase::OptimizerStep, Component::Gradients)
    };
    assert_eq!(grads_at_end(&job(true)), 32_000 * 4096 * 2);
    assert_eq!(grads_at_end(&job(false)), 2 * 6_738_415_616);
}

#[test]
fn it_cannot_accumulate() {
    let m = catalog::load(catalog::find("meta-llama/Llama-2-7b-hf").expect("catalog")).unwrap();
    let mut j = job(true);
    j.grad_accum = 2;
    let e = estimate(&m, &j, &DeviceProfile::default()).unwrap_err();
    assert_eq!(e.field, "optimizer_in_backward");
}
