//! One estimate, and 100,000 estimates over a grid of jobs (issue 2 §9: one estimate should
//! take microseconds). `cargo bench -p moro-core --bench estimate`.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Job, Method, Optimizer, Quantization};
use moro_core::model::ModelSpec;

fn main() {
    divan::main();
}

fn model(id: &str) -> ModelSpec {
    match catalog::find(id).and_then(|e| catalog::load(e).ok()) {
        Some(m) => m,
        None => std::process::exit(1),
    }
}

/// QLoRA on every Linear, NF4 with double quantization, checkpointing.
fn qlora(seq_len: u64) -> Job {
    let mut job = Job {
        method: Method::QuantizedAdapters,
        quantization: Quantization::Nf4Dq,
        seq_len,
        gradient_checkpointing: true,
        ..Job::default()
    };
    job.adapter.targets = moro_core::job::Targets::AllLinear;
    job
}

/// One QLoRA estimate of a dense 7B model (its two training steps replayed through the
/// allocator model: a few milliseconds), and of a 128-expert MoE (the largest layer lists).
#[divan::bench(args = ["Qwen/Qwen2.5-7B", "Qwen/Qwen3-235B-A22B", "deepseek-ai/DeepSeek-V3"])]
fn one(bencher: divan::Bencher, id: &str) {
    let m = model(id);
    let job = qlora(2048);
    let profile = DeviceProfile::default();
    bencher.bench(|| estimate(divan::black_box(&m), divan::black_box(&job), &profile));
}

/// One estimate that replays a model load through the allocator model: torchtune 0.1's
/// QLoRA build of a 7B and a 70B model with torchao 0.1 (32 and 80 layers of quantize /
/// clone / load; the cost grows with the layers).
#[divan::bench(args = ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf"], sample_count = 10)]
fn torchtune_nf4_load(bencher: divan::Bencher, id: &str) {
    let m = model(id);
    let job = Job {
        stack: moro_core::job::Stack::Torchtune,
        versions: moro_core::job::Versions {
            torchao: Some((0, 1)),
            torchtune: None,
            ..moro_core::job::Versions::default()
        },
        ..qlora(512)
    };
    let profile = DeviceProfile::default();
    bencher.bench(|| estimate(divan::black_box(&m), divan::black_box(&job), &profile));
}

/// One estimate that replays DeepSpeed ZeRO-3's setup and two steps through the allocator
/// model: full fine-tuning on 16 GPUs of a 70B dense model and of a 671B MoE (its
/// partitions in up to thousands of tensors; the cost grows with their count and the
/// churn's blocks, at most 2,048).
#[divan::bench(args = ["meta-llama/Llama-3.1-70B", "deepseek-ai/DeepSeek-V3"], sample_count = 10)]
fn zero3_setup_and_step(bencher: divan::Bencher, id: &str) {
    let m = model(id);
    let job = Job {
        method: Method::Full,
        seq_len: 4096,
        gradient_checkpointing: true,
        parallel: moro_core::job::Parallel {
            data_parallel: 16,
            sharding: moro_core::job::Sharding::Zero3,
            ..moro_core::job::Parallel::single()
        },
        ..Job::default()
    };
    let profile = DeviceProfile::default();
    bencher.bench(|| estimate(divan::black_box(&m), divan::black_box(&job), &profile));
}

/// One full fine-tune estimate, which replays two training steps' allocations through the
/// allocator model (every parameter, gradient and state; each layer's saved tensors): a
/// 0.5B, an 8B and a 70B dense model with checkpointing; the cost grows with the layers
/// (milliseconds, where every other estimate takes microseconds).
#[divan::bench(args = ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"], sample_count = 10)]
fn full_fine_tune_replay(bencher: divan::Bencher, id: &str) {
    let m = model(id);
    let job = Job {
        method: Method::Full,
        seq_len: 2048,
        gradient_checkpointing: true,
        ..Job::default()
    };
    let profile = DeviceProfile::default();
    bencher.bench(|| estimate(divan::black_box(&m), divan::black_box(&job), &profile));
}

/// 100,000 estimates: 4 methods × 5 batches × 5 lengths × 4 optimizers × 2 checkpointing ×
/// 5 ranks × 25 repeats on a 7B model; the cost should grow linearly with the count.
#[divan::bench(args = [1_000, 10_000, 100_000], sample_count = 3)]
fn grid(bencher: divan::Bencher, n: usize) {
    let m = model("meta-llama/Llama-3.1-8B");
    let profile = DeviceProfile::default();
    let mut jobs = Vec::with_capacity(n);
    'outer: for rep in 0.. {
        for method in [
            Method::Full,
            Method::Adapters,
            Method::QuantizedAdapters,
            Method::Inference,
        ] {
            for b in [1u64, 2, 4, 8, 16] {
                for s in [512u64, 1024, 2048, 4096, 8192] {
                    for opt in [
                        Optimizer::AdamwTorchFused,
                        Optimizer::AdamwTorch,
                        Optimizer::Adamw8bit,
                        Optimizer::PagedAdamw8bit,
                    ] {
                        for gc in [false, true] {
                            let mut j = Job {
                                method,
                                quantization: if method == Method::QuantizedAdapters {
                                    Quantization::Nf4Dq
                                } else {
                                    Quantization::None
                                },
                                micro_batch_size: b,
                                seq_len: s,
                                optimizer: opt,
                                gradient_checkpointing: gc,
                                ..Job::default()
                            };
                            j.adapter.rank = 8 << (rep % 5);
                            jobs.push(j);
                            if jobs.len() == n {
                                break 'outer;
                            }
                        }
                    }
                }
            }
        }
    }
    bencher.bench(|| {
        let mut total = 0u64;
        for j in &jobs {
            if let Ok(e) = estimate(&m, j, &profile) {
                total = total.wrapping_add(e.peak_device_bytes);
            }
        }
        total
    });
}

/// A 70B LoRA job at 4,096 tokens with checkpointing: its layers are traced op by op.
fn lora_70b() -> Job {
    let mut job = Job {
        method: Method::Adapters,
        seq_len: 4096,
        gradient_checkpointing: true,
        ..Job::default()
    };
    job.adapter.targets = moro_core::job::Targets::AllLinear;
    job
}

/// One step trace as an estimate makes it (loading and two optimizer steps, tensor by
/// tensor, without the names `--trace` writes) of a 70B dense model on one GPU (80
/// layers): a full fine-tune (the cost grows with the tensors, about 26 events per Linear),
/// and LoRA and QLoRA, traced op by op (with checkpointing about 720 and 890 events per
/// layer and micro-batch).
#[divan::bench(args = ["qlora", "full", "lora"], sample_count = 20)]
fn step_trace_70b(bencher: divan::Bencher, method: &str) {
    let m = model("meta-llama/Llama-3.1-70B");
    let job = match method {
        "full" => Job {
            method: Method::Full,
            seq_len: 4096,
            gradient_checkpointing: true,
            ..Job::default()
        },
        "lora" => lora_70b(),
        _ => qlora(4096),
    };
    let profile = DeviceProfile::default();
    bencher.bench(|| {
        let (m, job) = (divan::black_box(&m), divan::black_box(&job));
        let regime = moro_core::estimate::Regime::resolve(m, job);
        moro_core::estimate::trace::step::levels(m, job, &regime, &profile, false)
    });
}

/// The whole estimate of the 70B LoRA and QLoRA jobs: the op-by-op trace replayed through
/// the allocator model sets the reserve (the replay is most of the cost).
#[divan::bench(args = ["lora", "qlora"], sample_count = 20)]
fn estimate_70b(bencher: divan::Bencher, method: &str) {
    let m = model("meta-llama/Llama-3.1-70B");
    let job = if method == "lora" {
        lora_70b()
    } else {
        qlora(4096)
    };
    let profile = DeviceProfile::default();
    bencher.bench(|| estimate(divan::black_box(&m), divan::black_box(&job), &profile));
}
