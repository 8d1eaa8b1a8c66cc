//! FSDP details checked by hand.

use moro_core::catalog;
use moro_core::estimate::Regime;
use moro_core::estimate::parallel::Sharded;
use moro_core::job::{Job, Method, Parallel, Sharding};

/// Under PEFT the root FSDP unit (embeddings, final norm, lm_head: frozen) stays unsharded
/// from forward to the end of backward, so every GPU holds the other ranks' shares of it:
/// (N−1)/N of it. Mistral-7B's root: 2 × 32,000 × 4,096 + 4,096 parameters in bf16 =
/// 524,296,192 bytes; from 2 to 4 GPUs the gathered share grows by 3/4 − 1/2 = 1/4 of it,
/// while one decoder layer's unit is the same size.
#[test]
fn peft_root_unit_stays_gathered() {
    let m = catalog::load(catalog::find("mistralai/Mistral-7B-v0.1").expect("catalog")).unwrap();
    let gathered = |n: u64, method: Method| {
        let mut job = Job {
            method,
            parallel: Parallel {
                data_parallel: n,
                sharding: Sharding::FsdpFullShard,
                ..Parallel::single()
            },
            ..Job::default()
        };
        job.lora.targets = moro_core::targets::resolve(&m, &job.lora.targets);
        let r = Regime::resolve(&m, &job);
        Sharded::new(&m, &job, &r).gathered_params
    };
    let root: u64 = (2 * 32_000 * 4096 + 4096) * 2;
    assert_eq!(
        gathered(4, Method::Lora) - gathered(2, Method::Lora),
        root / 4
    );
    // Full fine-tuning frees the root through its gradient hooks: no such term.
    assert_eq!(gathered(4, Method::Full), gathered(2, Method::Full));
}
