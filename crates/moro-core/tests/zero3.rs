//! DeepSpeed ZeRO-3's gathered parameters, checked by hand.

use moro_core::catalog;
use moro_core::estimate::Regime;
use moro_core::estimate::parallel::{Zero3Live, zero3_live_params};
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
