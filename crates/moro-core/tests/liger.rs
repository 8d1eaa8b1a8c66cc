//! Liger's kernels against independent figures.
//!
//! Its fused linear cross-entropy and the plain `nn.Linear` + `CrossEntropyLoss` head against
//! liger-kernel's own published memory benchmark (`validation/liger-flce-benchmark.csv`:
//! liger-kernel 0.4.2 on an A100, `max_memory_allocated` over forward and backward of an
//! H 4,096 → V 128,256 bf16 head, BT = 4,096 … 32,768 tokens).
//!
//! The benchmark script (`benchmark_fused_linear_cross_entropy.py`) builds both heads on the
//! GPU (two V × H bf16 weights), one bf16 input [BT, H] that requires grad, and runs ten
//! forward-and-backward iterations without zeroing gradients, so from the second on the
//! weight's and the input's `.grad` exist before the step starts. What is left of each peak
//! after those, by hand, is the head's own memory, which moro's loss model gives:
//!
//! - Liger: the gradients the fused kernel fills in forward (`grad_input` [BT, H],
//!   `grad_weight` [V, H]) and one chunk of `next_power_of_2(BT / ceil(V / H))` rows of
//!   logits at 8 B per element;
//! - torch: 6 B per logit at the loss's backward (bf16 logits, log-probs and their
//!   gradient; no fp32 upcast in this head).
//!
//! Both leave the same 16.3 MiB on every row: two cuBLAS workspaces of an sm80 GPU (torch
//! allocates one per stream; forward and backward run on two), which moro counts separately.

use moro_core::catalog;
use moro_core::estimate::loss::Loss;
use moro_core::estimate::{DeviceProfile, Regime};
use moro_core::job::{Job, LossImpl, Method, Precision};
use moro_core::model::ModelSpec;

const BENCHMARK: &str = include_str!("../../../validation/liger-flce-benchmark.csv");
const MIB: f64 = (1u64 << 20) as f64;

fn head_model() -> ModelSpec {
    // V 128,256 and H 4,096, the benchmark's head.
    let m = catalog::load(catalog::find("meta-llama/Llama-3.1-8B").expect("in catalog"))
        .expect("parses");
    assert_eq!((m.vocab_size, m.hidden_size), (128_256, 4_096));
    m
}

/// The head's own bytes at the peak, by moro's loss model.
fn head_bytes(m: &ModelSpec, tokens: u64, loss: LossImpl) -> u64 {
    let job = Job {
        method: Method::Full,
        precision: Precision::Bf16,
        micro_batch_size: 1,
        seq_len: tokens,
        loss: Some(loss),
        ..Job::default()
    };
    let l = Loss::new(m, &job, &Regime::resolve(m, &job), 1);
    match loss {
        LossImpl::Fused => l.forward_peak + l.forward_transient,
        _ => l.backward_peak,
    }
}

#[test]
fn the_published_head_benchmark_is_reproduced() {
    let m = head_model();
    let (v, h) = (m.vocab_size, m.hidden_size);
    let workspaces = 2 * DeviceProfile::for_compute_capability(Some((8, 0))).cublas_workspace_bytes;
    let mut rows = 0;
    for line in BENCHMARK.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (provider, tokens, measured) = (
            f[1],
            f[7].parse::<u64>().unwrap(),
            f[8].parse::<f64>().unwrap(),
        );
        let loss = match provider {
            "liger" => LossImpl::Fused,
            "huggingface" => LossImpl::StandardNoUpcast,
            other => panic!("provider {other}"),
        };
        // Two heads' weights, the weight's accumulated gradient, the input and its gradient.
        let fixed = 3 * v * h * 2 + 2 * tokens * h * 2;
        let ours = (fixed + head_bytes(&m, tokens, loss) + workspaces) as f64 / MIB;
        let off = ours - measured;
        eprintln!(
            "{provider:<12} BT {tokens:>6}: measured {measured:9.1} MiB, moro {ours:9.1} ({off:+.1})"
        );
        assert!(
            off.abs() < 2.0,
            "{provider} BT {tokens}: {ours:.1} MiB vs measured {measured:.1}"
        );
        rows += 1;
    }
    assert_eq!(rows, 8);
}

/// Qwen3's q and k norms are `LigerRMSNorm` after the Trainer's patch (liger-kernel 0.8.5
/// `apply_liger_kernel_to_qwen3` patches `self_attn.q_norm` and `k_norm` on the instance).
/// By hand, Qwen3-8B LoRA under bf16 autocast, per token and layer, Liger's RMSNorm against
/// transformers': the two layer norms keep their bf16 input (2h) and an fp32 rstd instead of
/// the fp32 upcast (4h), 2·(2·4096 − 4); the q/k norms keep the bf16 projections (2 B) instead
/// of their fp32 upcast (4 B) over 32·128 + 8·128 = 5,120 values: 2·5120. 26,616 B in all.
#[test]
fn liger_rms_norm_reaches_qwen3_q_and_k_norms() {
    use moro_core::estimate::activations::Activations;
    use moro_core::job::Liger;
    let m = catalog::load(catalog::find("Qwen/Qwen3-8B").expect("in catalog")).expect("parses");
    let per_layer = |liger: Liger| {
        let job = Job {
            method: Method::Adapters,
            precision: Precision::Bf16Mixed,
            gradient_checkpointing: false,
            micro_batch_size: 1,
            seq_len: 1024,
            liger,
            ..Job::default()
        };
        Activations::new(&m, &job, &Regime::resolve(&m, &job), 1).one_layer / 1024
    };
    let rms_only = Liger {
        rms_norm: true,
        ..Liger::default()
    };
    assert_eq!(per_layer(Liger::default()) - per_layer(rms_only), 26_616);
}
