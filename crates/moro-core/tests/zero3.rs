//! DeepSpeed ZeRO-3's gathered parameters, checked by hand.

use moro_core::catalog;
use moro_core::estimate::Regime;
use moro_core::estimate::load::load_reserved_bytes;
use moro_core::estimate::parallel::{
    Zero3Live, zero3_live_params, zero3_partitions, zero3_step_transient, zero3_sub_groups,
    zero12_step_transient,
};
use moro_core::job::{Job, Method, Parallel, Precision, Sharding};

fn live(id: &str, gradient_checkpointing: bool) -> Zero3Live {
    let m = catalog::load(catalog::find(id).expect("catalog")).unwrap();
    let job = Job {
        method: Method::Full,
        precision: Precision::Bf16,
        gradient_checkpointing,
        parallel: Parallel {
            data_parallel: 8,
            sharding: Sharding::Zero3,
            ..Parallel::single()
        },
        ..Job::default()
    };
    let r = Regime::resolve(&m, &job);
    zero3_live_params(&m, &job, &r)
}

/// Llama-2-70B in bf16: h = 8,192, vocab 32,000, 80 layers of q, k, v, o (8,192 × 8,192,
/// 8,192 × 1,024 twice, 8,192 × 8,192) and gate, up, down (8,192 × 28,672): 855,638,016
/// parameters a layer. The prefetch bucket is 0.9 · 8,192² = 60,397,977 elements.
///
/// lm_head (262,144,000 elements) recurs right after its forward: gathered through the loss.
/// A module of the last layer recurs after lm_head twice (524,288,000) and the rest of its
/// layer (at least 855,638,016 − 234,881,024): over the 1e9 reuse distance, so no layer
/// stays gathered. In the layers: the largest module (an MLP matrix, 234,881,024) and the
/// prefetch bucket.
#[test]
fn llama_2_70b_keeps_lm_head_through_the_loss_and_one_module_in_the_layers() {
    let l = live("meta-llama/Llama-2-70b-hf", true);
    assert_eq!(l.in_layers, (234_881_024 + 60_397_977) * 2);
    assert_eq!(l.at_loss, 262_144_000 * 2 + 60_397_977 * 2);
}

/// Small models keep their last layers gathered. Qwen2.5-0.5B: h = 896, vocab 151,936
/// (tied), 24 layers of q (896² + 896 bias), k and v (896 × 128 + 128), o (896²) and gate,
/// up, down (896 × 4,864 = 4,358,144): 14,910,592 elements a layer. lm_head twice is
/// 272,269,312.
///
/// Under checkpointing a module `n` of the `j`-th layer from the end recurs after
/// 272,269,312 + 3·(j−1)·14,910,592 + (14,910,592 − n) elements: every module of layers
/// 1–16 is under 1e9 (layer 16: 943,245,952 + 14,910,592 − n), in layer 17 (987,977,728)
/// only the MLP matrices (n > 2,888,320), and layer 18 starts over it. Without
/// checkpointing (2 passes) layer 24 is 958,224,064 + 14,910,592 − n: all 24 layers stay.
#[test]
fn small_models_keep_their_last_layers_gathered() {
    let ckpt = live("Qwen/Qwen2.5-0.5B", true);
    let no_ckpt = live("Qwen/Qwen2.5-0.5B", false);
    let layer: u64 = 14_910_592;
    let prefetch: u64 = 896 * 896 * 9 / 10;
    let head: u64 = 151_936 * 896;
    assert_eq!(
        ckpt.at_loss,
        head * 2 + (prefetch + 16 * layer + 3 * 4_358_144) * 2
    );
    assert_eq!(no_ckpt.at_loss, head * 2 + (prefetch + 24 * layer) * 2);
}

/// Qwen-1.8B (Qwen-1: h = 2,048, vocab 151,936 untied, 24 layers of `c_attn` 2,048 → 6,144
/// with bias, `c_proj` 2,048², and `w1`, `w2`, `c_proj` 2,048 × 5,504): 311,164,928 for the
/// embedding and for lm_head, 50,599,936 a layer. Full fine-tuning on one GPU, as Qwen's
/// README profiled it with `finetune/ds_config_zero3.json`.
fn qwen_1_8b_one_gpu() -> (moro_core::model::ModelSpec, Job) {
    let m = catalog::load(catalog::find("Qwen/Qwen-1_8B").expect("catalog")).unwrap();
    let job = Job {
        method: Method::Full,
        precision: Precision::Bf16,
        gradient_checkpointing: true,
        parallel: Parallel {
            sharding: Sharding::Zero3,
            ..Parallel::single()
        },
        ..Job::default()
    };
    (m, job)
}

const QWEN_EMBED: u64 = 151_936 * 2_048;
const QWEN_LAYER: u64 = 2_048 * 6_144 + 6_144 + 2_048 * 2_048 + 3 * 2_048 * 5_504;
/// The first sub-group: the embedding, 13 layers, and the 14th up to `w2`.
const QWEN_G1: u64 = QWEN_EMBED + 13 * QWEN_LAYER + QWEN_LAYER - 2_048 * 5_504;

/// `_create_fp16_sub_groups` closes a sub-group at the parameter that brings it to 1e9
/// elements: the embedding and 13 layers make 968,964,096; the 14th layer's `c_attn`
/// (12,589,056), `c_proj` (4,194,304), `w1` (11,272,192) and `w2` (11,272,192) cross it at
/// 1,008,291,840. The rest (that layer's `c_proj`, 10 layers and lm_head) is the second.
#[test]
fn sub_groups_close_when_they_reach_1e9_elements() {
    let (m, job) = qwen_1_8b_one_gpu();
    let groups = zero3_sub_groups(&zero3_partitions(&m, &job));
    assert_eq!(
        groups,
        vec![QWEN_G1, 2_048 * 5_504 + 10 * QWEN_LAYER + QWEN_EMBED]
    );
    assert_eq!(groups[0], 1_008_291_840);
    // Under 1e9 elements it is one group (8 ranks: 229,591,040 each).
    let mut eight = job.clone();
    eight.parallel.data_parallel = 8;
    let parts = zero3_partitions(&m, &eight);
    assert_eq!(zero3_sub_groups(&parts).len(), 1);
    assert_eq!(
        zero3_sub_groups(&parts)[0],
        (2 * QWEN_EMBED + 24 * QWEN_LAYER) / 8
    );
}

/// The step's largest temporary is the first sub-group's 16-bit flatten and fp32 copy:
/// 6 × 1,008,291,840 bytes, more than `isinf`'s bool of 1,836,728,320 elements and the
/// embedding gradient's `double()` (8 × 311,164,928).
#[test]
fn the_step_temporary_is_the_largest_sub_group_in_16_and_32_bits() {
    let (m, job) = qwen_1_8b_one_gpu();
    assert_eq!(zero3_step_transient(&m, &job), 6 * QWEN_G1);
    // And it is what the estimate adds at the optimizer step, over 16 bytes a parameter
    // (16-bit weights and gradient buffer, fp32 master, Adam's two moments), with no fp32
    // gradients held between steps.
    let est =
        moro_core::estimate::estimate(&m, &job, &moro_core::estimate::DeviceProfile::default())
            .unwrap();
    let step = est
        .phases
        .iter()
        .find(|p| p.phase == moro_core::estimate::Phase::OptimizerStep)
        .unwrap();
    let persistent = 16 * QWEN_EMBED * 2 + 16 * 24 * QWEN_LAYER;
    let total = step.total();
    assert!(
        total >= persistent + 6 * QWEN_G1 && total < persistent + 6 * QWEN_G1 + (64 << 20),
        "{total}"
    );
}

/// A `cudaMalloc`ed segment for a large request: rounded up to 2 MiB.
fn seg(bytes: u64) -> u64 {
    bytes.div_ceil(2 << 20) * (2 << 20)
}

/// Qwen-1.8B's ZeRO-3 segments other than the norm's `double()` block (see below): the flat
/// 16-bit partitions, the first clone, the fp32 masters, the gradient buffer, Adam's moments,
/// the step's first fp32 gradient copy and `isinf`'s bools.
fn qwen_setup_segments() -> u64 {
    let g1 = QWEN_G1;
    let g2 = 2 * QWEN_EMBED + 24 * QWEN_LAYER - g1;
    let t = g1 + g2;
    seg(2 * t)
        + seg(2 * g1)
        + seg(4 * g1)
        + seg(4 * g2)
        + seg(4 * g1)
        + 2 * seg(4 * g1)
        + 2 * seg(4 * g2)
        + seg(4 * g1)
        + seg(t)
}

/// What DeepSpeed's setup and step leave in the cache, block by block (G1, G2 the sub-groups,
/// t all trainable elements, w the embedding): the flat 16-bit partitions (2t); per
/// sub-group the `.clone()` (2·G1, freed, then reused by G2's) and the fp32 master (4·G);
/// the zeroed `gradient_buffer` (4·G1) that `grad_partitions_flat_buffer` (2t) later splits;
/// Adam's two moments (8·G); the step's `double()` of the embedding gradient (8w), which
/// the first flatten then reuses, and the first fp32 gradient copy (4·G1), which the second
/// reuses; and `isinf`'s bools (t) on their own stream. The norms' 100,352 elements are
/// not in the sub-groups; Adam's moments of them are spread over the two.
#[test]
fn zero3_setup_and_step_reserve_by_hand() {
    let (m, job) = qwen_1_8b_one_gpu();
    let r = Regime::resolve(&m, &job);
    let hand = qwen_setup_segments() + seg(8 * QWEN_EMBED);
    let floor = load_reserved_bytes(&m, &job, &r, &[]);
    let diff = floor.abs_diff(hand);
    // Adam's moments of the norms (8 × 100,352 bytes) spread over the sub-groups' states.
    assert!(diff <= 8 << 20, "floor {floor}, hand {hand}");
    // Qwen's README: 43.5 GB (nvidia-smi, "likely") for 256 to 2,048 tokens, flat.
    #[allow(clippy::cast_precision_loss)]
    let gb = floor as f64 / 1e9;
    assert!((39.0..41.0).contains(&gb), "{gb:.2} GB");
}

/// At 8,192 tokens the loss's bf16 logits blocks (8,191 × 151,936 × 2 bytes, three alive at
/// its backward) fit in none of the setup's free blocks: three new segments, allocated
/// before the first optimizer step. The step's `double()` of the embedding gradient and
/// the first flatten then fit in two of them, and only its fp32 gradient copy needs a
/// segment of its own.
#[test]
fn large_logits_churn_comes_before_the_step_that_reuses_it() {
    let (m, job) = qwen_1_8b_one_gpu();
    let r = Regime::resolve(&m, &job);
    let logits = 8_191 * 151_936 * 2;
    let hand = qwen_setup_segments() + 3 * seg(logits);
    let floor = load_reserved_bytes(&m, &job, &r, &[logits; 3]);
    assert!(
        floor.abs_diff(hand) <= 8 << 20,
        "floor {floor}, hand {hand}"
    );
    // Churn that fits in the setup's free blocks leaves the floor where it was.
    assert_eq!(
        load_reserved_bytes(&m, &job, &r, &[64 << 20; 8]),
        load_reserved_bytes(&m, &job, &r, &[])
    );
}

/// ZeRO-1/2 make the fp32 gradients at the step too, per parameter group: Qwen2.5-7B full
/// on 8 GPUs. Its embedding and lm_head (152,064 × 3,584 = 544,997,376 each) and 28 layers
/// of q (3,584² + 3,584 bias), k and v (3,584 × 512 + 512 each), o (3,584²) and three MLP
/// matrices (3,584 × 18,944): 7,615,412,224 elements, 951,926,528 a rank. The flatten and its
/// fp32 copy (6 bytes each) outweigh the embedding piece's `double()` (8 × 544,997,376).
#[test]
fn zero1_step_makes_the_fp32_gradients_of_the_partition() {
    let m = catalog::load(catalog::find("Qwen/Qwen2.5-7B").expect("catalog")).unwrap();
    let job = Job {
        method: Method::Full,
        precision: Precision::Bf16,
        parallel: Parallel {
            data_parallel: 8,
            sharding: Sharding::Zero1,
            ..Parallel::single()
        },
        ..Job::default()
    };
    let layer =
        (3_584 * 3_584 + 3_584) + 2 * (3_584 * 512 + 512) + 3_584 * 3_584 + 3 * 3_584 * 18_944;
    let partition = (2 * 152_064 * 3_584 + 28 * layer) / 8;
    assert_eq!(partition, 951_926_528);
    assert_eq!(zero12_step_transient(&m, &job), 6 * partition);
    // With 64 ranks the partition (118,990,816) is smaller than the embedding: a piece is
    // at most the partition, so 8 bytes of it win.
    let mut wide = job.clone();
    wide.parallel.data_parallel = 64;
    assert_eq!(
        zero12_step_transient(&m, &wide),
        8 * (2 * 152_064 * 3_584 + 28 * layer) / 64
    );
}

/// DeepSpeed's engine casts the whole module, LoRA weights included, to its 16-bit dtype;
/// the fp32 copies are the partitions' master weights. Qwen2.5-7B, LoRA r = 16 on q
/// (3,584 → 3,584) and v (3,584 → 512): 16 × (7,168 + 4,096) = 180,224 a layer,
/// 5,046,272 in 28 layers, 2 bytes each; ZeRO-3 partitions them over its ranks too.
#[test]
fn deepspeed_holds_the_adapters_in_16_bits() {
    let m = catalog::load(catalog::find("Qwen/Qwen2.5-7B").expect("catalog")).unwrap();
    let adapters = |sharding: Sharding, n: u64| {
        let mut job = Job {
            method: Method::Adapters,
            parallel: Parallel {
                data_parallel: n,
                sharding,
                ..Parallel::single()
            },
            ..Job::default()
        };
        job.adapter.rank = 16;
        job.adapter.targets =
            moro_core::job::Targets::Names(vec!["q_proj".into(), "v_proj".into()]);
        job.adapter.targets = moro_core::targets::resolve(&m, &job.adapter.targets);
        let r = Regime::resolve(&m, &job);
        moro_core::estimate::parallel::Sharded::new(&m, &job, &r).adapters
    };
    let lora = 28 * 16 * (2 * 3_584 + 3_584 + 512);
    assert_eq!(lora, 5_046_272);
    assert_eq!(adapters(Sharding::Zero2, 1), lora * 2);
    assert_eq!(adapters(Sharding::Zero3, 8), lora * 2 / 8);
    // Without DeepSpeed PEFT keeps them in fp32 (the HF default).
    assert_eq!(adapters(Sharding::None, 1), lora * 4);
}

/// DeepSpeed's optimizer runs on its fp32 master partitions, so its states do not follow the
/// model's dtype: a bf16 and an fp32 model hold the same optimizer bytes, for 32-bit AdamW
/// (4 + 4 B an element) and for bitsandbytes' 8-bit AdamW (1 + 1 B plus block scales), whose
/// states once came out doubled for a bf16 model.
#[test]
fn deepspeed_states_follow_the_master_weights_not_the_model_dtype() {
    let m = catalog::load(catalog::find("Qwen/Qwen2.5-0.5B").expect("catalog")).unwrap();
    let states = |precision: Precision, optimizer: moro_core::job::Optimizer| {
        let job = Job {
            method: Method::Full,
            precision,
            optimizer,
            parallel: Parallel {
                data_parallel: 4,
                sharding: Sharding::Zero2,
                ..Parallel::single()
            },
            ..Job::default()
        };
        let r = Regime::resolve(&m, &job);
        moro_core::estimate::parallel::Sharded::new(&m, &job, &r).states_on_gpu
    };
    use moro_core::job::Optimizer::{Adamw8bit, AdamwTorchFused};
    let total = m.total_params();
    for opt in [AdamwTorchFused, Adamw8bit] {
        assert_eq!(
            states(Precision::Bf16, opt),
            states(Precision::Fp32, opt),
            "{opt:?}"
        );
    }
    // fp32 master (4) + Adam's two fp32 moments (8), a quarter on each rank.
    assert_eq!(states(Precision::Bf16, AdamwTorchFused), total * 12 / 4);
    // 8-bit: the master weights plus 8-bit moments, the embedding's 32-bit (the HF
    // Trainer's override for `nn.Embedding`): between the master weights alone and 32-bit.
    let eight = states(Precision::Bf16, Adamw8bit);
    let embedding = 151_936 * 896;
    assert!(eight > (total * 4 + embedding * 8) / 4, "{eight}");
    assert!(eight < total * 12 / 4, "{eight}");
}
