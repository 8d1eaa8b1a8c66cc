//! A run of a dataset's batches, each padded to its own longest sample (TRL without packing,
//! axolotl's `pad_to_sequence_len: false`, LLaMA-Factory's `DataCollatorForSeq2Seq`): the
//! shapes change from step to step, and PyTorch's cache keeps what shorter batches left
//! (docs/memory-anatomy.md §17). [`shuffled`] draws the batches of a run from the samples'
//! token lengths; [`run`] replays them through the step trace
//! ([`super::trace::step::replay_over_lengths`]).

use crate::job::Job;
use crate::model::ModelSpec;

use super::trace::Replayed;
use super::{Backend, DeviceProfile, Estimate};

/// The batches of a run [`shuffled`] draws: enough for the cache to climb past what two steps
/// of the longest leave (`tests/varying_lengths.rs` replays 16 to 41), few enough to replay
/// at once.
pub const RUN_BATCHES: usize = 32;

/// The token lengths of `count` micro-batches of `micro_batch` samples from `lengths` (one
/// per sample, in any order), drawn without replacement in a pseudo-random order that is the
/// same on every machine, each batch as long as its longest sample cut to `cap`; the last
/// batch is the longest any draw could make (the data's longest sample, cut to `cap`), so
/// that the run reaches the length the estimate is made at. Empty when there are no samples
/// or `count` is 0.
#[must_use]
pub fn shuffled(lengths: &[u32], micro_batch: u64, cap: u64, count: usize) -> Vec<u64> {
    let Some(&longest) = lengths.iter().max() else {
        return Vec::new();
    };
    if count == 0 {
        return Vec::new();
    }
    let per_batch = usize::try_from(micro_batch.max(1)).unwrap_or(usize::MAX);
    let cut = |l: u32| u64::from(l).min(cap).max(1);
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    let mut state = 0x6d6f_726f_u64;
    let mut out = Vec::with_capacity(count);
    let mut drawn = 0;
    while out.len() + 1 < count && drawn < order.len() {
        let mut batch = 0;
        for _ in 0..per_batch {
            if drawn == order.len() {
                break;
            }
            // Fisher–Yates, one position at a time (Knuth's MMIX multiplier).
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let left = u64::try_from(order.len() - drawn).unwrap_or(u64::MAX);
            let pick = drawn + usize::try_from((state >> 33) % left).unwrap_or(0);
            order.swap(drawn, pick);
            batch = batch.max(cut(lengths[order[drawn]]));
            drawn += 1;
        }
        out.push(batch);
    }
    out.push(cut(longest));
    out
}

/// What a run of batches of these `lengths` needs, replayed through the step trace on the
/// job as the estimate traces it; `None` where the trace does not model the job (see
/// [`super::trace::step::models`]) or on Apple's MPS, whose allocator this does not follow.
#[must_use]
pub fn run(
    est: &Estimate,
    model: &ModelSpec,
    job: &Job,
    device: &DeviceProfile,
    lengths: &[u64],
) -> Option<Replayed> {
    if device.backend == Backend::Mps || job.stack.profile().runtime == crate::stack::Runtime::Mlx {
        return None;
    }
    let (built, job) = crate::stack::with_job(model, job);
    let (job, lengths) = super::with_prompt_tokens_over(job.as_ref(), lengths);
    super::trace::step::replay_over_lengths(built.as_ref(), &job, &est.regime, device, &lengths)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counted by hand: two samples a batch from ten, each batch its longer sample cut to
    /// 100, the last batch the longest sample cut.
    #[test]
    fn batches_are_their_longest_sample_cut_to_the_cap() {
        let lengths = [10, 20, 30, 40, 50, 60, 70, 80, 90, 500];
        let b = shuffled(&lengths, 2, 100, 4);
        assert_eq!(b.len(), 4);
        assert_eq!(b[3], 100, "the longest, cut");
        assert!(b[..3].iter().all(|&l| (20..=100).contains(&l)), "{b:?}");
        // Drawn without replacement: five batches of two use every sample once.
        let all = shuffled(&lengths, 2, 1000, 6);
        assert_eq!(all.len(), 6);
        assert!(all[..5].contains(&500), "{all:?}");
        assert_eq!(all[5], 500);
        // The same order on every call.
        assert_eq!(shuffled(&lengths, 2, 100, 4), b);
        // More batches than the data makes: as many as it makes, then the longest.
        assert_eq!(shuffled(&lengths, 4, 1000, 10).len(), 4);
        assert!(shuffled(&[], 2, 100, 4).is_empty());
        assert!(shuffled(&lengths, 2, 100, 0).is_empty());
    }
}
