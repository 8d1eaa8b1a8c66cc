//! Invariants of the memory model (issue 2 §8), checked over random jobs on catalog models.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, Estimate, estimate};
use moro_core::job::{
    Attention, Job, LossImpl, Method, Optimizer, Padding, Precision, Quantization, Stack, Targets,
};
use moro_core::model::ModelSpec;
use proptest::prelude::*;

const MODELS: [&str; 6] = [
    "Qwen/Qwen2.5-0.5B",
    "meta-llama/Llama-3.2-1B-Instruct",
    "mistralai/Mistral-7B-v0.1",
    "google/gemma-2-2b",
    "Qwen/Qwen3-30B-A3B",
    "EleutherAI/pythia-410m",
];

fn model(i: usize) -> ModelSpec {
    let e = catalog::find(MODELS[i % MODELS.len()]).expect("catalog model");
    catalog::load(e).expect("parses")
}

fn est(m: &ModelSpec, j: &Job) -> Estimate {
    let mut j = j.clone();
    j.adapter.targets = moro_core::targets::resolve(m, &j.adapter.targets);
    // PEFT's LoRA on transformers-5 stacked experts refuses dropout (`Job::validate`).
    if m.moe.is_some() {
        j.adapter.dropout = 0.0;
    }
    estimate(m, &j, &DeviceProfile::default()).expect("valid job")
}

fn job_strategy() -> impl Strategy<Value = Job> {
    (
        prop::sample::select(vec![
            Method::Full,
            Method::Adapters,
            Method::QuantizedAdapters,
        ]),
        prop::sample::select(vec![
            Optimizer::AdamwTorch,
            Optimizer::AdamwTorchFused,
            Optimizer::Adamw8bit,
            Optimizer::PagedAdamw8bit,
            Optimizer::Adafactor,
            Optimizer::SgdMomentum,
        ]),
        prop::sample::select(vec![Precision::Bf16, Precision::Bf16Mixed, Precision::Fp32]),
        prop::sample::select(vec![Attention::Sdpa, Attention::Eager, Attention::Flash]),
        prop::sample::select(vec![Stack::Hf, Stack::Trl, Stack::Litgpt, Stack::Torchtune]),
        any::<bool>(),
        any::<bool>(),
        1u64..=8,
        prop::sample::select(vec![128u64, 512, 1024, 2048]),
        prop::sample::select(vec![4u64, 16, 64]),
        1u64..=4,
    )
        .prop_map(
            |(method, optimizer, precision, attention, stack, gc, padded, b, s, r, ga)| {
                let mut j = Job {
                    method,
                    optimizer,
                    precision,
                    attention,
                    stack,
                    gradient_checkpointing: gc,
                    padding: if padded {
                        Padding::Padded
                    } else {
                        Padding::Packed
                    },
                    micro_batch_size: b,
                    seq_len: s,
                    grad_accum: ga,
                    ..Job::default()
                };
                j.adapter.rank = r;
                j.quantization = if method == Method::QuantizedAdapters {
                    Quantization::Nf4Dq
                } else {
                    Quantization::None
                };
                j
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    })]

    /// More tokens never take less memory. The tensors (allocated level) grow with them; the
    /// device level grows too, except by fragmentation: a full fine-tune's replayed steps
    /// (`estimate::replay`) can leave fewer holes when larger blocks fit the cache better, as
    /// PyTorch's allocator does (Pythia-410M, 4 × 128 → 4 × 256 tokens: 1.41 → 0.89 GiB), so
    /// the device level may dip by at most the smaller job's replayed fragmentation. Likewise
    /// the new segments the optimizer step's temporaries need (`estimate::step_segments`):
    /// wider activation blocks can hold them once the tokens grow.
    #[test]
    fn monotone_in_batch_and_sequence(i in 0usize..6, j in job_strategy()) {
        let m = model(i);
        let base = est(&m, &j);
        let mut more_b = j.clone();
        more_b.micro_batch_size += 1;
        let mut more_s = j.clone();
        more_s.seq_len *= 2;
        prop_assert!(est(&m, &more_b).peak_allocated_bytes >= base.peak_allocated_bytes);
        prop_assert!(est(&m, &more_s).peak_allocated_bytes >= base.peak_allocated_bytes);
        let slack = base.replayed_fragmentation_bytes + base.step_segments_bytes;
        prop_assert!(est(&m, &more_s).peak_device_bytes + slack >= base.peak_device_bytes);
        prop_assert!(est(&m, &more_b).peak_device_bytes + slack >= base.peak_device_bytes);
        if slack == 0 {
            prop_assert!(est(&m, &more_s).peak_device_bytes >= base.peak_device_bytes);
        }
    }

    /// LoRA never takes more than full fine-tuning of the same model, shape and stack.
    /// Three exceptions are physics, not bugs, and are excluded: with `lora_dropout > 0` every
    /// adapter keeps a private dropout copy and mask of its input; and PEFT's fp32 adapters
    /// on a pure-bf16 model (no autocast) cast their input to a private fp32 copy each
    /// (`_cast_input_dtype`), which the fake-CUDA oracle confirms (its `B-lora-bf16` runs)
    /// and which can exceed the one shared bf16 input a trainable Linear saves.
    #[test]
    fn lora_at_most_full(i in 0usize..6, j in job_strategy()) {
        prop_assume!(!(j.precision == Precision::Bf16 && matches!(j.stack, Stack::Hf | Stack::Trl)));
        // A third: with an optimizer that keeps (almost) no state — Adafactor's factored
        // moments, SGD without momentum — and no gradients alive at the forward peak, full
        // fine-tuning holds nothing LoRA does not, while LoRA adds its adapters and their
        // `lora_A` outputs (when every Linear is adapted it saves the same inputs).
        prop_assume!(!matches!(j.optimizer, Optimizer::Adafactor | Optimizer::Sgd));
        // A fourth: litgpt under bf16-mixed runs lm_head in 128-token chunks, and a frozen
        // fp32 head is cast to bf16 anew for every chunk (autocast caches only weights that
        // require grad), each copy saved for backward; full fine-tuning's trainable head is
        // cast once. Measured: lit-gpt's LoRA docs rows (`tests/retention.rs`).
        prop_assume!(!(j.stack == Stack::Litgpt && j.precision == Precision::Bf16Mixed));
        let m = model(i);
        // A fifth: PEFT's LoRA on transformers-5 stacked experts (`ParamWrapper`) builds the
        // merged expert weight W + B·A and grouped-mm saves it for backward, one per layer
        // without checkpointing (`estimate::activations::stacked_lora`, the oracle's MoE
        // traces): as large as the frozen experts, more than full fine-tuning's gradients
        // and 8-bit states at the forward peak (Qwen3-30B-A3B, fp32, 2 × 2048 tokens).
        prop_assume!(
            !(m.moe.is_some()
                && matches!(j.stack, Stack::Hf | Stack::Trl)
                && !j.gradient_checkpointing)
        );
        let mut lora = j.clone();
        lora.method = Method::Adapters;
        lora.quantization = Quantization::None;
        lora.adapter.dropout = 0.0;
        let mut full = j.clone();
        full.method = Method::Full;
        full.quantization = Quantization::None;
        prop_assert!(est(&m, &lora).peak_device_bytes <= est(&m, &full).peak_device_bytes);
    }

    /// Checkpointing never raises the peak by more than one checkpoint. A full fine-tune
    /// whose peak is the first layer's backward (every gradient made) holds the same saved
    /// tensors either way, there recomputed, plus that layer's checkpoint, the embedding's
    /// output, which no op of an unchecked layer keeps (its norm saves the fp32 upcast):
    /// Mistral-7B, bf16, 2 × 512 tokens, 8 MiB more with checkpointing.
    #[test]
    fn checkpointing_never_raises_the_peak(i in 0usize..6, j in job_strategy()) {
        let m = model(i);
        let mut on = j.clone();
        on.gradient_checkpointing = true;
        let mut off = j.clone();
        off.gradient_checkpointing = false;
        let checkpoint = j.micro_batch_size * j.seq_len * m.hidden_size * 4;
        prop_assert!(
            est(&m, &on).peak_allocated_bytes
                <= est(&m, &off).peak_allocated_bytes + checkpoint
        );
    }
}

/// 4-bit weights ≤ 8-bit ≤ 16-bit, for every catalog model.
#[test]
fn weight_bytes_shrink_with_bits() {
    for e in catalog::entries() {
        let m = catalog::load(e).expect("parses");
        // Stack `trl` keeps the unquantized modules in bf16 (no PEFT fp32 upcast), so only
        // the storage of the quantized Linears differs.
        let weights = |q: Quantization, method: Method| {
            let j = Job {
                method,
                quantization: q,
                stack: Stack::Trl,
                // Within every catalog model's learned positions (GPT-2: 1,024).
                seq_len: 512,
                ..Job::default()
            };
            est(&m, &j).component(moro_core::estimate::Component::Weights)
        };
        let w16 = weights(Quantization::None, Method::Adapters);
        let w8 = weights(Quantization::Int8, Method::QuantizedAdapters);
        let w4 = weights(Quantization::Nf4, Method::QuantizedAdapters);
        let w4dq = weights(Quantization::Nf4Dq, Method::QuantizedAdapters);
        assert!(
            w4dq <= w4 && w4 <= w8 && w8 <= w16,
            "{}: {w4dq} {w4} {w8} {w16}",
            e.id
        );
    }
}

/// NF4 storage by hand for one Linear (memory-anatomy §1.1): Llama-3-8B's down_proj,
/// n = 4096·14336 = 58,720,256 elements: n/2 packed + 4·n/64 absmax = 33,030,144 bytes
/// (+ the 512 B code block); double quant: n/2 + n/64 + 4·ceil(n/64/256) = 30,291,968 bytes
/// (+ 2 KiB of fixed state).
#[test]
fn nf4_bytes_by_hand() {
    use moro_core::estimate::weights::quantized_linear_bytes;
    use moro_core::model::{Linear, LinearRole};
    let l = Linear::new("down_proj", 14336, 4096, false, LinearRole::Mlp);
    assert_eq!(
        quantized_linear_bytes(&l, Quantization::Nf4),
        33_030_144 + 512
    );
    assert_eq!(
        quantized_linear_bytes(&l, Quantization::Nf4Dq),
        30_291_968 + 2048
    );
}

/// Full fine-tune, pure bf16, fused AdamW: weights 2 B, gradients 2 B and states 4 B per
/// parameter (torch AdamW keeps states in the param dtype), each tensor's bytes rounded up
/// to 512 as PyTorch's caching allocator counts them (`kMinBlockSize`,
/// CUDACachingAllocator.cpp), by hand for Qwen2.5-0.5B: the tied embedding (151,936 × 896),
/// per layer q, k, v with biases (896, 128, 128 outputs), o, gate, up and down (4,864) and
/// two norms, 24 layers, the final norm.
#[test]
fn full_bf16_bytes_by_hand() {
    let m = model(0);
    let p = m.total_params();
    let layer = [
        896 * 896,
        896,
        128 * 896,
        128,
        128 * 896,
        128,
        896 * 896,
        4864 * 896,
        4864 * 896,
        896 * 4864,
        896,
        896,
    ];
    let mut tensors = vec![151_936u64 * 896];
    for _ in 0..24 {
        tensors.extend(layer);
    }
    tensors.push(896);
    assert_eq!(tensors.iter().sum::<u64>(), p);
    let rounded = |bytes_per: u64| -> u64 {
        tensors
            .iter()
            .map(|n| (n * bytes_per).div_ceil(512) * 512)
            .sum()
    };
    let j = Job {
        method: Method::Full,
        precision: Precision::Bf16,
        optimizer: Optimizer::AdamwTorchFused,
        micro_batch_size: 1,
        seq_len: 128,
        ..Job::default()
    };
    let e = est(&m, &j);
    use moro_core::estimate::{Component, Phase};
    let step = e
        .phases
        .iter()
        .find(|ph| ph.phase == Phase::OptimizerStep)
        .expect("step phase");
    let get = |c: Component| {
        step.components
            .iter()
            .filter(|x| x.0 == c)
            .map(|x| x.1)
            .sum::<u64>()
    };
    assert_eq!(get(Component::Weights), rounded(2));
    assert_eq!(get(Component::Gradients), rounded(2));
    assert_eq!(get(Component::OptimizerStates), 2 * rounded(2));
}

/// Per-layer saved activations of a Llama layer, full FT bf16 with flash attention, match
/// `16h + 4ad + 4kd + 4a + 8I` bytes per token (memory-anatomy §5 variant F1, confirmed to
/// the byte by the oracle) plus the two RMSNorms' fp32 `rsqrt` (4 bytes a token each, which
/// the op-level trace keeps and F1 leaves out): the difference between 2 and 1 tokens ×
/// layers.
#[test]
fn llama_layer_activations_by_hand() {
    let m = model(1); // Llama-3.2-1B: h 2048, I 8192, a 32, k 8, d 64
    let (h, i, a, kd, ad) = (2048u64, 8192u64, 32u64, 8 * 64u64, 32 * 64u64);
    let per_token_layer = 16 * h + 4 * ad + 4 * kd + 4 * a + 8 * i + 2 * 4;
    let j = |s: u64| Job {
        method: Method::Full,
        precision: Precision::Bf16,
        attention: Attention::Flash,
        loss: Some(LossImpl::Fused),
        micro_batch_size: 1,
        seq_len: s,
        adapter: moro_core::job::PeftConfig {
            targets: Targets::AllLinear,
            ..Default::default()
        },
        ..Job::default()
    };
    let acts = |s: u64| {
        est(&m, &j(s)).phase_component(
            moro_core::estimate::Phase::ForwardEnd,
            moro_core::estimate::Component::Activations,
        )
    };
    let delta = acts(2048) - acts(1024);
    // the head (final norm: 4h + 2h + 2h per token) grows too, and so do the batch's
    // int64 input_ids and labels
    let head = 8 * h;
    let batch = 2 * 8;
    assert_eq!(
        delta,
        1024 * (m.num_layers * per_token_layer + head + batch)
    );
}
