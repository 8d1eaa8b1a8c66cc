//! The Unsloth stack against hand calculations from its code (unsloth 2026.8.19,
//! unsloth_zoo 2026.8.13; docs/unsloth-memory.md).

use moro_core::catalog;
use moro_core::estimate::activations::{Activations, offloaded_checkpoints};
use moro_core::estimate::loss::Loss;
use moro_core::estimate::{DeviceProfile, Regime, estimate};
use moro_core::job::{Attention, Job, JobSettings, Method, Optimizer, Stack};
use moro_core::model::ModelSpec;

fn model(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("in catalog")).expect("parses")
}

fn unsloth(method: Method, seq: u64, batch: u64) -> Job {
    JobSettings {
        stack: Some(Stack::Unsloth),
        method: Some(method),
        seq_len: Some(seq),
        micro_batch_size: Some(batch),
        ..JobSettings::default()
    }
    .resolve()
    .expect("resolves")
}

/// What a user gets without saying more: `get_peft_model`'s LoRA dropout 0 (so the fused
/// kernels run), the notebooks' 8-bit AdamW, checkpoints offloaded to host memory, fp32
/// adapters under bf16 autocast, the fused cross-entropy.
#[test]
fn its_defaults_are_unsloths() {
    let job = unsloth(Method::QuantizedAdapters, 2048, 2);
    assert_eq!(job.adapter.dropout, 0.0);
    assert_eq!(job.optimizer, Optimizer::Adamw8bit);
    assert!(job.gradient_checkpointing && job.activation_offload);
    assert!(job.unsloth_kernels());
    assert_eq!(job.loss_impl(), moro_core::job::LossImpl::Fused);
    let plain = JobSettings {
        activation_offload: Some(false),
        stack: Some(Stack::Unsloth),
        ..JobSettings::default()
    }
    .resolve()
    .unwrap();
    assert!(plain.gradient_checkpointing && !plain.activation_offload);
}

/// One recomputed Llama-3.1-8B layer with FlashAttention (h = 4,096, kv = 1,024,
/// I = 14,336, 32 heads): two norm outputs, the post-attention residual, q, the attention
/// output, k, v, gate and up in bf16, two fp32 inverse RMS and the log-sum-exp per head:
/// 2·(3·4096 + 2·4096 + 2·1024 + 2·14336) + 4·(32 + 2) = 102,536 B per token. SDPA's
/// transposed output adds the reshape's copy `LoRA_W` saves (2·4,096).
#[test]
fn a_layer_saves_what_its_kernels_save() {
    let m = model("meta-llama/Llama-3.1-8B");
    for (attention, by_hand) in [
        (Attention::Flash, 102_536),
        (Attention::Sdpa, 102_536 + 8192),
    ] {
        let job = Job {
            attention,
            ..unsloth(Method::QuantizedAdapters, 2048, 1)
        };
        let r = Regime::resolve(&m, &job);
        let a = Activations::new(&m, &job, &r, 1);
        assert_eq!(a.one_layer / 2048, by_hand, "{attention:?}");
    }
}

/// The fused cross-entropy keeps `grad_inputs` (T·h bf16) and, per chunk, its 16-bit
/// logits and their gradient; one chunk while T·V fp32 fits 4 GiB, else a multiple of
/// four: 2 × 2,048 tokens of Llama-3.1-8B is one chunk (2.0 GB), 8 × 2,048 is 8.4 GB, two
/// targets, rounded up to four chunks.
#[test]
fn the_fused_loss_keeps_the_input_gradient_and_chunks_its_logits() {
    let m = model("meta-llama/Llama-3.1-8B");
    let v = 128_256;
    for (batch, chunks) in [(2, 1), (8, 4)] {
        let job = unsloth(Method::QuantizedAdapters, 2048, batch);
        let r = Regime::resolve(&m, &job);
        let l = Loss::new(&m, &job, &r, 1);
        let t = batch * 2048;
        assert_eq!(l.forward_peak, t * 4096 * 2);
        assert_eq!(l.forward_transient, 4 * (t / chunks) * v, "batch {batch}");
    }
}

/// `"unsloth"` checkpointing keeps the last layer's input and two reload buffers on the
/// GPU and the other 29 of Llama-3.1-8B's 32 layer inputs in pinned host memory; it
/// checkpoints plainly below 512 tokens.
#[test]
fn checkpoints_go_to_host_memory() {
    let m = model("meta-llama/Llama-3.1-8B");
    let job = unsloth(Method::QuantizedAdapters, 2048, 2);
    let r = Regime::resolve(&m, &job);
    let t = 4096;
    assert_eq!(offloaded_checkpoints(&m, &job, &r), 29 * t * 4096 * 2);
    assert_eq!(
        Activations::new(&m, &job, &r, 1).all_layers(),
        3 * t * 4096 * 2
    );
    let e = estimate(&m, &job, &DeviceProfile::default()).unwrap();
    assert_eq!(e.host_bytes, 29 * t * 4096 * 2);
    let short = unsloth(Method::QuantizedAdapters, 256, 2);
    let r = Regime::resolve(&m, &short);
    assert_eq!(offloaded_checkpoints(&m, &short, &r), 0);
    assert_eq!(
        Activations::new(&m, &short, &r, 1).all_layers(),
        32 * 512 * 4096 * 2
    );
}

/// `UNSLOTH_RETURN_LOGITS=1` (`loss: standard`): the 16-bit logits and an fp32 log-sum-exp
/// per row and 65,536-wide vocabulary chunk, the gradient written into the logits' buffer:
/// 2 × 2,048 tokens of Llama-3.1-8B, 2·t·V + 4·t·2 by hand.
#[test]
fn the_full_logits_path_keeps_the_logits_once() {
    let m = model("meta-llama/Llama-3.1-8B");
    let job = Job {
        loss: Some(moro_core::job::LossImpl::Standard),
        ..unsloth(Method::QuantizedAdapters, 2048, 2)
    };
    job.validate(&m).expect("modelled");
    let r = Regime::resolve(&m, &job);
    let l = Loss::new(&m, &job, &r, 1);
    let t = 4096;
    assert_eq!(l.forward_peak, 2 * t * 128_256 + 4 * t * 2);
    assert_eq!(l.backward_peak, l.forward_peak);
}
