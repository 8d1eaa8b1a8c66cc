//! FSDP details checked by hand.

use moro_core::catalog;
use moro_core::estimate::Regime;
use moro_core::estimate::parallel::Sharded;
use moro_core::job::{Job, Method, Parallel, Sharding};

/// The root FSDP unit (embeddings, final norm, lm_head) stays gathered from forward to the
/// end of backward, and the all-gather fills a buffer of the whole unit beside the local
/// shard: every GPU holds all of it, whatever the GPU count (the rank traces of
/// `validation/oracle-traces/fsdp-llama-3.2-1b.jsonl` list the whole root unsharded at the
/// peak, at 2 and 4 ranks, LoRA and full). Mistral-7B's root: 2 × 32,000 × 4,096 + 4,096
/// parameters in bf16 = 524,296,192 bytes.
#[test]
fn the_root_unit_stays_gathered_whole() {
    let m = catalog::load(catalog::find("mistralai/Mistral-7B-v0.1").expect("catalog")).unwrap();
    let gathered_root = |n: u64, method: Method| {
        let mut job = Job {
            method,
            parallel: Parallel {
                data_parallel: n,
                sharding: Sharding::FsdpFullShard,
                ..Parallel::single()
            },
            ..Job::default()
        };
        job.adapter.targets = moro_core::targets::resolve(&m, &job.adapter.targets);
        let r = Regime::resolve(&m, &job);
        Sharded::new(&m, &job, &r).gathered_root
    };
    let root: u64 = (2 * 32_000 * 4096 + 4096) * 2;
    for n in [2, 4] {
        assert_eq!(gathered_root(n, Method::Adapters), root);
        // A full fine-tune's root is gathered in MixedPrecision's 16-bit.
        assert_eq!(gathered_root(n, Method::Full), root);
    }
}

/// Full fine-tuning: FSDP's root unit gets its gradient through one split backward of its
/// flat parameter, which waits for the embedding's gradient (the last one). litgpt's
/// gemma-2b keeps lm_head apart from wte: a root of 2 × 256,000 × 2,048 + 2,048
/// parameters. lm_head's bf16 gradient (1,048,576,000 bytes) is held, unsharded, through
/// the backward; at its end the pieces and their concatenation (2 × 2,097,156,096 bytes)
/// coexist. litgpt's config-hub table measured 17.43 GB (max allocated) for gemma-2b full
/// on 4 A10G; before this term moro said 14.3 GB (−18 %).
#[test]
fn full_fine_tuning_assembles_the_root_gradient_at_the_end_of_backward() {
    let m = catalog::load(catalog::find("google/gemma-2b").expect("catalog")).unwrap();
    let mut m = m;
    // litgpt unties (as `estimate` does for `--stack litgpt`).
    m.tie_word_embeddings = false;
    let job = Job {
        method: Method::Full,
        precision: moro_core::job::Precision::Bf16,
        stack: moro_core::job::Stack::Litgpt,
        parallel: Parallel {
            data_parallel: 4,
            sharding: Sharding::FsdpFullShard,
            ..Parallel::single()
        },
        ..Job::default()
    };
    let r = Regime::resolve(&m, &job);
    let s = Sharded::new(&m, &job, &r);
    assert_eq!(s.head_grads, 256_000 * 2_048 * 2);
    assert_eq!(s.root_grad_assembly, 2 * (2 * 256_000 * 2_048 + 2_048) * 2);
    // Under PEFT the root is frozen: nothing to assemble.
    let mut lora = job.clone();
    lora.method = Method::Adapters;
    lora.adapter.targets = moro_core::targets::resolve(&m, &lora.adapter.targets);
    let r = Regime::resolve(&m, &lora);
    assert_eq!(Sharded::new(&m, &lora, &r).root_grad_assembly, 0);
}

/// A unit's gradient comes out of one split backward of its flat parameter: at the end of
/// the unit's backward its pieces and their concatenation coexist. StableLM-Alpha-3B's
/// GPT-NeoX block: qkv 4,096 × 12,288 (+ bias), dense 4,096² (+ bias), the MLP 4,096 ×
/// 16,384 both ways (+ biases), two LayerNorms: 201,379,840 parameters, 16 of them with the
/// embeddings making the catalog's 3,637,321,728. Under Lightning (`use_orig_params=True`)
/// a LoRA block's flat parameter mixes frozen and LoRA weights and requires grad as a
/// whole: two bf16 blocks' worth; litgpt's 2-GPU LoRA row went from −5.9 % to +0.1 %.
/// Under HF's PEFT wrapping only the adapters' units have gradients.
#[test]
fn a_units_gradient_is_assembled_from_its_views() {
    let m = catalog::load(catalog::find("stabilityai/stablelm-base-alpha-3b").expect("catalog"))
        .unwrap();
    let block: u64 = 4_096 * 12_288
        + 12_288
        + 4_096 * 4_096
        + 4_096
        + 2 * 4_096 * 16_384
        + 16_384
        + 4_096
        + 4 * 4_096;
    assert_eq!(16 * block + 2 * 50_688 * 4_096 + 2 * 4_096, 3_637_321_728);
    let buffers = |method: Method, stack: moro_core::job::Stack| {
        let mut job = Job {
            method,
            stack,
            precision: moro_core::job::Precision::Bf16,
            parallel: Parallel {
                data_parallel: 2,
                sharding: Sharding::FsdpFullShard,
                ..Parallel::single()
            },
            ..Job::default()
        };
        job.adapter.targets = moro_core::targets::resolve(&m, &job.adapter.targets);
        let r = Regime::resolve(&m, &job);
        let s = Sharded::new(&m, &job, &r);
        assert_eq!(s.comm_buffers, 0, "only in backward");
        assert_eq!(s.backward_buffers, 0, "not in the loss's backward");
        s.unit_grad_assembly
    };
    use moro_core::job::Stack;
    assert_eq!(buffers(Method::Adapters, Stack::Litgpt), 2 * block * 2);
    assert_eq!(buffers(Method::Full, Stack::Hf), 2 * block * 2);
    assert!(buffers(Method::Adapters, Stack::Hf) < 2 * block * 2 / 50);
}
