//! PyTorch on Apple's MPS: the estimate's levels are its step trace replayed through the MPS
//! allocator model, with nothing outside it.

use moro_core::catalog;
use moro_core::estimate::trace::{Op, step};
use moro_core::estimate::{Component, DeviceProfile, Regime, estimate};
use moro_core::job::{Job, Method, Optimizer, PeftConfig, Precision};
use moro_core::model::ModelSpec;
use moro_core::mps_allocator::{MpsAllocator, MpsHandle};

fn model(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("in catalog")).expect("parses")
}

fn job(m: &ModelSpec, method: Method, checkpointing: bool) -> Job {
    let mut j = Job {
        method,
        adapter: PeftConfig {
            dropout: 0.0,
            ..PeftConfig::default()
        },
        micro_batch_size: 1,
        seq_len: 1024,
        optimizer: Optimizer::AdamwTorchFused,
        precision: Precision::Bf16Mixed,
        gradient_checkpointing: checkpointing,
        ..Job::default()
    };
    j.adapter.targets = moro_core::targets::resolve(m, &j.adapter.targets);
    j
}

/// The heaps the MPS allocator holds at the peak when `events` run through it.
fn heaps(t: &moro_core::estimate::trace::Trace<'_>) -> (u64, u64) {
    let mut a = MpsAllocator::new();
    let mut live: Vec<Option<MpsHandle>> = Vec::new();
    for e in &t.events {
        let i = e.tensor as usize;
        match e.op {
            Op::Alloc => {
                if live.len() <= i {
                    live.resize(i + 1, None);
                }
                live[i] = Some(a.malloc(e.bytes));
            }
            Op::Free => {
                if let Some(h) = live[i].take() {
                    a.free(h);
                }
            }
        }
    }
    (a.peak_allocated(), a.peak_reserved())
}

/// LoRA with and without checkpointing and a full fine-tune of an MHA and a GQA model: the
/// reserved level is the heaps of the step replayed through the MPS allocator, nothing is
/// outside PyTorch's allocator, and no cuBLAS workspace or CUDA context is counted.
#[test]
fn the_reserved_level_is_the_mps_heaps() {
    let mps = DeviceProfile::mps();
    for id in ["meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B"] {
        let m = model(id);
        for (method, ckpt) in [
            (Method::Adapters, true),
            (Method::Adapters, false),
            (Method::Full, true),
        ] {
            let j = job(&m, method, ckpt);
            let est = estimate(&m, &j, &mps).expect("valid job");
            let regime = Regime::resolve(&m, &j);
            let t = step::trace(&m, &j, &regime, &mps).expect("traced");
            let (_, reserved) = heaps(&t);
            let what = format!("{id} {method:?} checkpointing {ckpt}");
            assert_eq!(est.peak_reserved_bytes, reserved, "{what}");
            assert_eq!(est.peak_device_bytes, est.peak_reserved_bytes, "{what}");
            assert_eq!(est.component(Component::CudaContext), 0, "{what}");
            assert!(
                t.events.iter().all(|e| e.bytes > 0 || e.op == Op::Free),
                "{what}: an empty allocation"
            );
            // Heaps are 8 MiB, 32 MiB, 1 GiB or a tensor's own rounded to 2 MiB.
            assert!(reserved.is_multiple_of(2 << 20), "{what}");
        }
    }
}
