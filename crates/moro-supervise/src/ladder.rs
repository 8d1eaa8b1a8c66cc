//! The heal ladder: which change to make to a [`Job`] after it ran out of memory.
//!
//! Pure: jobs in, a job out; predictions come from a closure the caller hands in.
//!
//! The five levels, in order of least harm to the result (issue 5 §2):
//! 1. turn on Liger's kernels where the caller says the job takes them
//!    ([`LadderContext::liger`]): the same step computed with less memory (no logits tensor,
//!    fused norms and activations; docs/liger-kernels.md); then divide `micro_batch_size` by
//!    its smallest prime factor (halve it when even) and multiply
//!    `gradient_accumulation_steps` by the same factor, so the effective batch stays exactly
//!    the same, down to a micro-batch of 1;
//! 2. turn on gradient checkpointing;
//! 3. switch the optimizer to bitsandbytes' paged 8-bit AdamW (from AdamW in any of its
//!    32-bit or unpaged 8-bit forms; Lion 32-bit goes to Lion 8-bit instead; Adafactor and SGD
//!    already hold less state than 8-bit AdamW and are left alone);
//! 4. load the base model in 4-bit NF4 with double quantization (QLoRA) unless it is 4-bit
//!    already. A LoRA job becomes QLoRA. **A full fine-tune becomes QLoRA too** (with the
//!    job's LoRA settings): the issue lists this as the fourth level, and it is the last
//!    change that keeps training the same data at the same length; it changes what is
//!    trained, which the heal message says plainly;
//! 5. cut `max_seq_length` to the smallest power of two ≥ the dataset's p99 length when that is
//!    known and shorter, else to the longest of the dataset's lower percentile lengths (p95,
//!    p90, from a recipe sized on the data) that is shorter, else halve it (never below
//!    [`MIN_SEQ_LEN`]), and halve the LoRA rank (never below 1). This level may repeat; once
//!    the length is below the dataset's p99 the message warns that longer samples are
//!    truncated.
//!
//! [`next_heal`] walks these steps cumulatively from the job that failed: the first step is
//! applied, then the next on top of it, and so on; each candidate is re-estimated and the
//! first one predicted to fit the budget is taken, so candidates predicted not to fit are
//! passed over (a micro-batch 8 that OOMs may go straight to 2). When the estimator cannot
//! judge a candidate (no prediction or no budget) that candidate is taken, one step at a time.
//! When **no** candidate is predicted to fit, the smallest single step is taken anyway and the
//! heal says so: the prediction has already been wrong once (the run did not fit although
//! it may have been predicted to), so trying the least harmful change beats giving up.
//!
//! Inference jobs are not healed.

use moro_core::job::{Job, Liger, Method, Optimizer, Quantization};
use moro_core::units::human;

/// Shortest `max_seq_length` level 5 will cut to.
pub const MIN_SEQ_LEN: u64 = 128;

/// Largest gradient accumulation level 1 will produce (the limit `Job::validate` enforces).
const MAX_GRAD_ACCUM: u64 = 1 << 20;

/// What the ladder needs besides the job.
pub struct LadderContext<'a> {
    /// Predicted peak device bytes for a job, or `None` when it cannot say.
    pub estimate: &'a dyn Fn(&Job) -> Option<u64>,
    /// Device bytes available to the run, when known.
    pub budget: Option<u64>,
    /// Bytes added to every prediction (the largest under-prediction seen on this machine).
    pub margin: u64,
    /// The dataset's 99th-percentile sample length in tokens, when known.
    pub dataset_p99: Option<u64>,
    /// Lengths at the dataset's lower percentiles (p95, p90), where known: the cuts level 5
    /// makes before it halves blindly.
    pub dataset_shorter: &'a [u64],
    /// Whether the job takes Liger's kernels (its stack, model and loss do: the caller
    /// validates the job with them on), so level 1 may turn them on.
    pub liger: bool,
}

impl LadderContext<'_> {
    /// The prediction for `job`, including the margin.
    #[must_use]
    pub fn predict(&self, job: &Job) -> Option<u64> {
        (self.estimate)(job).map(|p| p.saturating_add(self.margin))
    }
}

/// Whether the chosen candidate is predicted to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Predicted peak ≤ budget.
    Predicted,
    /// No prediction or no budget: taken without judging.
    Unknown,
    /// Nothing on the ladder is predicted to fit; the smallest step was taken anyway.
    NothingFits,
}

/// A field the ladder changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `liger`.
    Liger,
    /// `micro_batch_size`.
    MicroBatch,
    /// `gradient_accumulation_steps`.
    GradAccum,
    /// `gradient_checkpointing`.
    GradientCheckpointing,
    /// `optimizer`.
    Optimizer,
    /// `method`.
    Method,
    /// `quantization`.
    Quantization,
    /// `max_seq_length`.
    SeqLen,
    /// `lora_rank`.
    LoraRank,
}

impl Field {
    /// The ladder level that changes this field.
    #[must_use]
    pub const fn level(self) -> u8 {
        match self {
            Self::Liger | Self::MicroBatch | Self::GradAccum => 1,
            Self::GradientCheckpointing => 2,
            Self::Optimizer => 3,
            Self::Method | Self::Quantization => 4,
            Self::SeqLen | Self::LoraRank => 5,
        }
    }

    /// The moro.yaml key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Self::Liger => "liger",
            Self::MicroBatch => "micro_batch_size",
            Self::GradAccum => "gradient_accumulation_steps",
            Self::GradientCheckpointing => "gradient_checkpointing",
            Self::Optimizer => "optimizer",
            Self::Method => "method",
            Self::Quantization => "quantization",
            Self::SeqLen => "max_seq_length",
            Self::LoraRank => "lora_rank",
        }
    }
}

/// One field's old and new value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The field.
    pub field: Field,
    /// Value before, as written in moro.yaml.
    pub before: String,
    /// Value after.
    pub after: String,
}

/// A heal: the new job and why.
#[derive(Debug, Clone)]
pub struct Heal {
    /// The job to run next.
    pub job: Job,
    /// The highest ladder level used.
    pub level: u8,
    /// The fields changed, in ladder order.
    pub changes: Vec<Change>,
    /// Prediction (with margin) for the job that failed.
    pub predicted_before: Option<u64>,
    /// Prediction (with margin) for the new job.
    pub predicted_after: Option<u64>,
    /// Whether the new job is predicted to fit.
    pub fit: Fit,
    /// How many intermediate candidates were predicted not to fit and passed over.
    pub passed_over: usize,
    /// A note for the user (truncation below the dataset's p99, a method change).
    pub warning: Option<String>,
}

/// Why no heal is possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoHeal {
    /// Every level is already at its floor.
    Exhausted,
    /// Inference jobs are not healed.
    Inference,
}

impl std::fmt::Display for NoHeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Exhausted => "nothing left to change on the heal ladder",
            Self::Inference => "inference jobs are not healed",
        })
    }
}

impl Heal {
    /// The full description: `micro_batch_size 8→2, gradient_accumulation_steps 1→4 (effective
    /// batch 8 kept)`.
    #[must_use]
    pub fn description(&self) -> String {
        let mut parts: Vec<String> = self
            .changes
            .iter()
            .map(|c| format!("{} {}→{}", c.field.key(), c.before, c.after))
            .collect();
        if self.changes.iter().any(|c| c.field == Field::MicroBatch) {
            let eff = self
                .job
                .micro_batch_size
                .saturating_mul(self.job.grad_accum);
            if let Some(last) = parts
                .iter_mut()
                .rfind(|p| p.starts_with("gradient_accumulation_steps"))
            {
                last.push_str(&format!(" (effective batch {eff} kept)"));
            }
        }
        parts.join(", ")
    }

    /// The short form for the final summary: `micro_batch 8→2`, `gradient checkpointing on`.
    #[must_use]
    pub fn short(&self) -> String {
        let mut parts = Vec::new();
        let mut quant_said = false;
        for c in &self.changes {
            match c.field {
                Field::Liger => parts.push("Liger's kernels on".to_owned()),
                Field::MicroBatch => parts.push(format!("micro_batch {}→{}", c.before, c.after)),
                Field::GradAccum => {}
                Field::GradientCheckpointing => parts.push("gradient checkpointing on".to_owned()),
                Field::Optimizer => parts.push(format!("optimizer {}", c.after)),
                Field::Method | Field::Quantization => {
                    if !quant_said {
                        quant_said = true;
                        if self
                            .changes
                            .iter()
                            .any(|c| c.field == Field::Method && c.before == "full")
                        {
                            parts.push("full fine-tune → QLoRA (4-bit NF4 base)".to_owned());
                        } else {
                            parts.push("base model in 4-bit NF4 (QLoRA)".to_owned());
                        }
                    }
                }
                Field::SeqLen => parts.push(format!("max_seq_length {}→{}", c.before, c.after)),
                Field::LoraRank => parts.push(format!("LoRA rank {}→{}", c.before, c.after)),
            }
        }
        parts.join(", ")
    }

    /// Whether a checkpoint written before this heal can be resumed after it. Trainers
    /// restore the optimizer state and the adapter (or full model) weights: a different
    /// optimizer or LoRA rank, or a full fine-tune turned into adapters, makes those
    /// incompatible, so the run starts afresh. LoRA → QLoRA keeps the adapters' shapes.
    #[must_use]
    pub fn resume_compatible(&self) -> bool {
        !self.changes.iter().any(|c| match c.field {
            Field::Optimizer | Field::LoraRank => true,
            Field::Method => c.before == Method::Full.as_str(),
            _ => false,
        })
    }

    /// One line on the prediction: `predicted peak 30.10 GiB → 18.20 GiB (budget 22.00 GiB)`.
    #[must_use]
    pub fn prediction_line(&self, budget: Option<u64>) -> Option<String> {
        let after = self.predicted_after?;
        let before = self.predicted_before.map_or_else(|| "?".to_owned(), human);
        let budget = budget
            .map(|b| format!(" (budget {})", human(b)))
            .unwrap_or_default();
        Some(format!(
            "predicted peak {before} → {}{budget}",
            human(after)
        ))
    }
}

/// The next change for a job that ran out of memory.
///
/// # Errors
/// [`NoHeal`] when nothing is left to change.
pub fn next_heal(job: &Job, ctx: &LadderContext<'_>) -> Result<Heal, NoHeal> {
    if job.method == Method::Inference {
        return Err(NoHeal::Inference);
    }
    let predicted_before = ctx.predict(job);
    let mut cur = job.clone();
    let mut first: Option<(Job, Option<u64>)> = None;
    let mut passed_over = 0;
    while let Some(next) = single_step(&cur, ctx.liger, ctx.dataset_p99, ctx.dataset_shorter) {
        cur = next;
        let pred = ctx.predict(&cur);
        if first.is_none() {
            first = Some((cur.clone(), pred));
        }
        let fit = match (pred, ctx.budget) {
            (Some(p), Some(b)) if p <= b => Some(Fit::Predicted),
            (None, _) | (_, None) => Some(Fit::Unknown),
            _ => None,
        };
        if let Some(fit) = fit {
            return Ok(make_heal(
                job,
                cur,
                predicted_before,
                pred,
                fit,
                passed_over,
                ctx.dataset_p99,
            ));
        }
        passed_over += 1;
    }
    let (job2, pred) = first.ok_or(NoHeal::Exhausted)?;
    Ok(make_heal(
        job,
        job2,
        predicted_before,
        pred,
        Fit::NothingFits,
        0,
        ctx.dataset_p99,
    ))
}

fn make_heal(
    before: &Job,
    after: Job,
    predicted_before: Option<u64>,
    predicted_after: Option<u64>,
    fit: Fit,
    passed_over: usize,
    p99: Option<u64>,
) -> Heal {
    let changes = diff(before, &after);
    let level = changes.iter().map(|c| c.field.level()).max().unwrap_or(1);
    let mut warnings = Vec::new();
    if before.method == Method::Full && after.method != Method::Full {
        warnings.push(format!(
            "this turns the full fine-tune into QLoRA (LoRA rank {}): only adapters are trained",
            after.adapter.rank
        ));
    }
    if let Some(p) = p99
        && after.seq_len < p
        && after.seq_len < before.seq_len
    {
        warnings.push(format!(
            "max_seq_length {} is below the dataset's p99 of {p} tokens: longer samples are \
             truncated",
            after.seq_len
        ));
    }
    Heal {
        job: after,
        level,
        changes,
        predicted_before,
        predicted_after,
        fit,
        passed_over,
        warning: if warnings.is_empty() {
            None
        } else {
            Some(warnings.join("; "))
        },
    }
}

/// The fields that differ between two jobs, in ladder order.
#[must_use]
pub fn diff(a: &Job, b: &Job) -> Vec<Change> {
    let mut out = Vec::new();
    let mut push = |field, before: String, after: String| {
        if before != after {
            out.push(Change {
                field,
                before,
                after,
            });
        }
    };
    push(Field::Liger, liger_value(a.liger), liger_value(b.liger));
    push(
        Field::MicroBatch,
        a.micro_batch_size.to_string(),
        b.micro_batch_size.to_string(),
    );
    push(
        Field::GradAccum,
        a.grad_accum.to_string(),
        b.grad_accum.to_string(),
    );
    push(
        Field::GradientCheckpointing,
        on_off(a.gradient_checkpointing),
        on_off(b.gradient_checkpointing),
    );
    push(
        Field::Optimizer,
        a.optimizer.as_str().to_owned(),
        b.optimizer.as_str().to_owned(),
    );
    push(
        Field::Method,
        a.method.as_str().to_owned(),
        b.method.as_str().to_owned(),
    );
    push(
        Field::Quantization,
        a.quantization.as_str().to_owned(),
        b.quantization.as_str().to_owned(),
    );
    push(Field::SeqLen, a.seq_len.to_string(), b.seq_len.to_string());
    if a.method.is_peft() && b.method.is_peft() {
        push(
            Field::LoraRank,
            a.adapter.rank.to_string(),
            b.adapter.rank.to_string(),
        );
    }
    out
}

/// `liger` as moro.yaml writes it: `true` for every kernel, else the kernels' names.
fn liger_value(l: Liger) -> String {
    if l == Liger::ALL {
        "true".to_owned()
    } else if l.any() {
        l.names().join(",")
    } else {
        "false".to_owned()
    }
}

fn on_off(b: bool) -> String {
    if b { "on" } else { "off" }.to_owned()
}

/// The least harmful single change to `job`, or `None` when every level is at its floor;
/// `liger`: whether the job takes Liger's kernels ([`LadderContext::liger`]).
#[must_use]
pub fn single_step(
    job: &Job,
    liger: bool,
    dataset_p99: Option<u64>,
    dataset_shorter: &[u64],
) -> Option<Job> {
    let mut j = job.clone();
    // Level 1: Liger's kernels first; they change no hyper-parameter.
    if liger && j.liger != Liger::ALL {
        j.liger = Liger::ALL;
        return Some(j);
    }
    // Level 1 (not with the optimizer step in backward, which cannot accumulate).
    if j.micro_batch_size > 1 && !j.optimizer_in_backward {
        let p = smallest_prime_factor(j.micro_batch_size);
        if let Some(accum) = j.grad_accum.checked_mul(p).filter(|a| *a <= MAX_GRAD_ACCUM) {
            j.micro_batch_size /= p;
            j.grad_accum = accum;
            return Some(j);
        }
    }
    // Level 2 (not where PEFT refuses checkpointing).
    let refused = j.method.is_peft() && j.adapter.method.refuses_checkpointing();
    if !(j.gradient_checkpointing || refused) {
        j.gradient_checkpointing = true;
        return Some(j);
    }
    // Level 3: bitsandbytes' 8-bit states, on the stacks that run on PyTorch.
    let torch = j.stack.profile().runtime == moro_core::stack::Runtime::Torch;
    let opt = match j.optimizer {
        _ if !torch => None,
        Optimizer::AdamwTorch
        | Optimizer::AdamwTorchFused
        | Optimizer::Adamw8bit
        | Optimizer::PagedAdamw32bit => Some(Optimizer::PagedAdamw8bit),
        Optimizer::Lion32bit => Some(Optimizer::Lion8bit),
        Optimizer::PagedAdamw8bit
        | Optimizer::Adafactor
        | Optimizer::Lion8bit
        | Optimizer::Sgd
        | Optimizer::SgdMomentum => None,
    };
    if let Some(o) = opt {
        j.optimizer = o;
        return Some(j);
    }
    // Level 4: a 4-bit base in the stack's own storage (NF4 with double quantization; MLX's
    // 4-bit on the mlx stack).
    let four_bit = j.quantization.is_bnb4()
        || j.quantization == Quantization::Gptq4
        || j.quantization.mlx().is_some_and(|a| a.bits <= 4);
    if !four_bit {
        j.quantization = j.stack.profile().default_quantization;
        j.method = Method::QuantizedAdapters;
        return Some(j);
    }
    // Level 5.
    let shorter = dataset_shorter
        .iter()
        .copied()
        .filter(|&t| t < j.seq_len && t >= MIN_SEQ_LEN)
        .max();
    let seq = match (dataset_p99.map(u64::next_power_of_two), shorter) {
        (Some(t), _) if t < j.seq_len && t >= MIN_SEQ_LEN => t,
        (_, Some(t)) => t,
        _ if j.seq_len / 2 >= MIN_SEQ_LEN => j.seq_len / 2,
        _ => j.seq_len,
    };
    let rank = if j.method.is_peft() && j.adapter.rank > 1 {
        j.adapter.rank / 2
    } else {
        j.adapter.rank
    };
    if seq == j.seq_len && rank == j.adapter.rank {
        return None;
    }
    j.seq_len = seq;
    j.adapter.rank = rank;
    Some(j)
}

fn smallest_prime_factor(n: u64) -> u64 {
    let mut p = 2;
    while p * p <= n {
        if n.is_multiple_of(p) {
            return p;
        }
        p += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn job() -> Job {
        Job {
            micro_batch_size: 8,
            grad_accum: 2,
            seq_len: 2048,
            optimizer: Optimizer::AdamwTorchFused,
            gradient_checkpointing: false,
            method: Method::Adapters,
            quantization: Quantization::None,
            ..Job::default()
        }
    }

    /// A toy model of memory: weights, optimizer states, activations.
    fn toy(j: &Job) -> Option<u64> {
        let weights = if j.quantization.is_bnb4() { 1200 } else { 4000 };
        let opt = if j.optimizer == Optimizer::PagedAdamw8bit {
            500
        } else {
            2000
        };
        let act =
            j.micro_batch_size * j.seq_len / 1024 * if j.gradient_checkpointing { 64 } else { 256 };
        Some((weights + opt + act + j.adapter.rank * 4) * MIB)
    }

    fn ctx<'a>(est: &'a dyn Fn(&Job) -> Option<u64>, budget: Option<u64>) -> LadderContext<'a> {
        LadderContext {
            estimate: est,
            budget,
            margin: 0,
            dataset_p99: None,
            dataset_shorter: &[],
            liger: false,
        }
    }

    fn unknown(_: &Job) -> Option<u64> {
        None
    }

    #[test]
    fn walks_all_five_levels_in_order_one_step_at_a_time() {
        let c = ctx(&unknown, None);
        let mut j = job();
        let mut levels = Vec::new();
        let mut shorts = Vec::new();
        while let Ok(h) = next_heal(&j, &c) {
            assert_eq!(h.fit, Fit::Unknown);
            levels.push(h.level);
            shorts.push(h.short());
            j = h.job;
        }
        // 8→4→2→1, GC, optimizer, NF4, then level 5 until seq 128 and rank 1.
        assert_eq!(&levels[..6], &[1, 1, 1, 2, 3, 4]);
        assert!(levels[6..].iter().all(|l| *l == 5));
        assert_eq!(shorts[0], "micro_batch 8→4");
        assert_eq!(shorts[3], "gradient checkpointing on");
        assert_eq!(shorts[4], "optimizer paged_adamw_8bit");
        assert_eq!(shorts[5], "base model in 4-bit NF4 (QLoRA)");
        assert_eq!(shorts[6], "max_seq_length 2048→1024, LoRA rank 16→8");
        assert_eq!(j.micro_batch_size, 1);
        assert_eq!(j.grad_accum, 16);
        assert_eq!(j.seq_len, MIN_SEQ_LEN);
        assert_eq!(j.adapter.rank, 1);
        assert_eq!(j.method, Method::QuantizedAdapters);
        assert_eq!(j.quantization, Quantization::Nf4Dq);
        assert_eq!(next_heal(&j, &c).err(), Some(NoHeal::Exhausted));
    }

    /// Where the job takes Liger's kernels they are the first rung: the same micro-batch and
    /// hyper-parameters, resumable; where it does not, the ladder starts at the micro-batch.
    #[test]
    fn liger_is_the_first_rung_where_the_job_takes_it() {
        // Liger's kernels, in the toy: 1 GiB less (no logits tensor).
        let est = |j: &Job| toy(j).map(|b| b - if j.liger.any() { 1024 * MIB } else { 0 });
        let before = toy(&job()).unwrap();
        let mut c = ctx(&est, Some(before - 512 * MIB));
        c.liger = true;
        let h = next_heal(&job(), &c).unwrap();
        assert_eq!(h.fit, Fit::Predicted);
        assert_eq!(h.level, 1);
        assert_eq!(h.job.liger, Liger::ALL);
        assert_eq!(h.job.micro_batch_size, 8);
        assert_eq!(h.short(), "Liger's kernels on");
        assert_eq!(h.description(), "liger false→true");
        assert!(h.resume_compatible());

        c.liger = false;
        let h = next_heal(&job(), &c).unwrap();
        assert_eq!(h.job.liger, Liger::default());
        assert_eq!(h.short(), "micro_batch 8→4");
    }

    /// With the optimizer step in backward, gradients cannot accumulate: the first step is
    /// checkpointing, the micro-batch is left alone.
    #[test]
    fn optimizer_in_backward_skips_level_one() {
        let j = Job {
            micro_batch_size: 4,
            grad_accum: 1,
            optimizer_in_backward: true,
            ..Job::default()
        };
        let n = single_step(&j, false, None, &[]).expect("a step exists");
        assert_eq!((n.micro_batch_size, n.grad_accum), (4, 1));
        assert!(n.gradient_checkpointing);
    }

    /// PEFT refuses prefix tuning with checkpointing: the ladder goes from the micro-batch
    /// straight to the optimizer.
    #[test]
    fn prefix_tuning_skips_checkpointing() {
        let mut j = Job {
            micro_batch_size: 1,
            grad_accum: 8,
            ..job()
        };
        j.adapter.method = moro_core::job::PeftKind::PrefixTuning;
        let n = single_step(&j, false, None, &[]).expect("a step exists");
        assert!(!n.gradient_checkpointing);
        assert_eq!(n.optimizer, Optimizer::PagedAdamw8bit);
    }

    #[test]
    fn level_one_keeps_the_effective_batch() {
        for mb in 1..=300u64 {
            for accum in [1u64, 3, 7] {
                let mut j = Job {
                    micro_batch_size: mb,
                    grad_accum: accum,
                    ..job()
                };
                let eff = mb * accum;
                while j.micro_batch_size > 1 {
                    let Some(n) = single_step(&j, false, None, &[]) else {
                        panic!("no step at mb {mb}")
                    };
                    assert!(n.micro_batch_size < j.micro_batch_size);
                    assert_eq!(
                        n.micro_batch_size * n.grad_accum,
                        eff,
                        "mb {mb} accum {accum}"
                    );
                    j = n;
                }
            }
        }
        let h = next_heal(&job(), &ctx(&unknown, None)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            h.description(),
            "micro_batch_size 8→4, gradient_accumulation_steps 2→4 (effective batch 16 kept)"
        );
    }

    #[test]
    fn odd_micro_batch_is_divided_exactly() {
        let j = Job {
            micro_batch_size: 6,
            grad_accum: 1,
            ..job()
        };
        let a = single_step(&j, false, None, &[]).unwrap_or_else(|| panic!("step"));
        assert_eq!((a.micro_batch_size, a.grad_accum), (3, 2));
        let b = single_step(&a, false, None, &[]).unwrap_or_else(|| panic!("step"));
        assert_eq!((b.micro_batch_size, b.grad_accum), (1, 6));
    }

    /// On the mlx stack the ladder offers what MLX runs: no bitsandbytes optimizer, and MLX's
    /// own 4-bit weights for level 4.
    #[test]
    fn the_mlx_ladder_stays_on_mlx() {
        let mut j = Job {
            stack: moro_core::job::Stack::Mlx,
            method: Method::Full,
            optimizer: Optimizer::AdamwTorch,
            precision: moro_core::job::Precision::Bf16,
            micro_batch_size: 1,
            gradient_checkpointing: true,
            adapted_layers: Some(16),
            ..Job::default()
        };
        while let Some(next) = single_step(&j, false, None, &[]) {
            assert_ne!(next.optimizer, Optimizer::PagedAdamw8bit);
            assert!(!next.quantization.is_bnb4(), "{:?}", next.quantization);
            j = next;
        }
        assert_eq!(j.quantization, Quantization::Mlx4);
        assert_eq!(j.method, Method::QuantizedAdapters);
    }

    #[test]
    fn candidates_predicted_not_to_fit_are_passed_over() {
        // mb8: 4000+2000+4096+64; mb4: 8112; mb2: 7088 (+seq 2048 → 2 units per sample).
        let budget = 7200 * MIB;
        let c = ctx(&toy, Some(budget));
        let h = next_heal(&job(), &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.fit, Fit::Predicted);
        assert_eq!(h.short(), "micro_batch 8→2");
        assert_eq!(h.passed_over, 1);
        assert_eq!(h.level, 1);
        assert!(h.predicted_after.is_some_and(|p| p <= budget));
        assert!(h.predicted_before.is_some_and(|p| p > budget));
    }

    #[test]
    fn a_far_step_crosses_levels_when_needed() {
        // Only the 8-bit optimizer (with mb 1 and GC) gets under 5000 MiB.
        let c = ctx(&toy, Some(5000 * MIB));
        let h = next_heal(&job(), &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.level, 3);
        assert_eq!(
            h.short(),
            "micro_batch 8→1, gradient checkpointing on, optimizer paged_adamw_8bit"
        );
        assert!(!h.resume_compatible());
    }

    #[test]
    fn nothing_fits_takes_the_smallest_step_and_says_so() {
        let c = ctx(&toy, Some(100 * MIB));
        let h = next_heal(&job(), &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.fit, Fit::NothingFits);
        assert_eq!(h.short(), "micro_batch 8→4");
        assert!(h.resume_compatible());
    }

    #[test]
    fn margin_is_added_to_predictions() {
        // Without margin mb4 (8112) fits 8200; with a 200 MiB margin it does not, mb2 does.
        let mut c = ctx(&toy, Some(8200 * MIB));
        assert_eq!(
            next_heal(&job(), &c).map(|h| h.short()).ok().as_deref(),
            Some("micro_batch 8→4")
        );
        c.margin = 200 * MIB;
        assert_eq!(
            next_heal(&job(), &c).map(|h| h.short()).ok().as_deref(),
            Some("micro_batch 8→2")
        );
    }

    #[test]
    fn level_five_uses_the_dataset_p99() {
        let j = Job {
            micro_batch_size: 1,
            gradient_checkpointing: true,
            optimizer: Optimizer::PagedAdamw8bit,
            method: Method::QuantizedAdapters,
            quantization: Quantization::Nf4Dq,
            seq_len: 8192,
            ..job()
        };
        let c = LadderContext {
            estimate: &unknown,
            budget: None,
            margin: 0,
            dataset_p99: Some(700),
            dataset_shorter: &[],
            liger: false,
        };
        let h = next_heal(&j, &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.level, 5);
        assert_eq!(h.short(), "max_seq_length 8192→1024, LoRA rank 16→8");
        assert!(h.warning.is_none());
        let h2 = next_heal(&h.job, &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h2.short(), "max_seq_length 1024→512, LoRA rank 8→4");
        assert!(
            h2.warning
                .as_deref()
                .is_some_and(|w| w.contains("truncated"))
        );
    }

    #[test]
    fn level_five_cuts_to_the_datasets_lower_percentiles_before_halving() {
        // A recipe sized at the data's p99 (1,234 tokens): the power of two above the p99 is
        // longer, so the cuts are the p95 (900), the p90 (610), then halves of 610.
        let j = Job {
            micro_batch_size: 1,
            gradient_checkpointing: true,
            optimizer: Optimizer::PagedAdamw8bit,
            method: Method::QuantizedAdapters,
            quantization: Quantization::Nf4Dq,
            seq_len: 1234,
            ..job()
        };
        let shorter = [900, 610];
        let c = LadderContext {
            estimate: &unknown,
            budget: None,
            margin: 0,
            dataset_p99: Some(1234),
            dataset_shorter: &shorter,
            liger: false,
        };
        let h = next_heal(&j, &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.short(), "max_seq_length 1234→900, LoRA rank 16→8");
        assert!(
            h.warning
                .as_deref()
                .is_some_and(|w| w.contains("p99 of 1234"))
        );
        let h = next_heal(&h.job, &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.short(), "max_seq_length 900→610, LoRA rank 8→4");
        let h = next_heal(&h.job, &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.short(), "max_seq_length 610→305, LoRA rank 4→2");
    }

    #[test]
    fn full_fine_tune_becomes_qlora_at_level_four() {
        let j = Job {
            method: Method::Full,
            micro_batch_size: 1,
            gradient_checkpointing: true,
            optimizer: Optimizer::PagedAdamw8bit,
            ..job()
        };
        let h = next_heal(&j, &ctx(&unknown, None)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.level, 4);
        assert_eq!(h.job.method, Method::QuantizedAdapters);
        assert_eq!(h.short(), "full fine-tune → QLoRA (4-bit NF4 base)");
        assert!(
            h.warning
                .as_deref()
                .is_some_and(|w| w.contains("only adapters"))
        );
        assert!(!h.resume_compatible());
        // Full fine-tunes have no rank to halve at level 5.
        let full5 = Job {
            quantization: Quantization::Gptq4,
            ..j
        };
        let h = next_heal(&full5, &ctx(&unknown, None)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.short(), "max_seq_length 2048→1024");
    }

    #[test]
    fn optimizers_with_little_state_are_kept() {
        for o in [
            Optimizer::Adafactor,
            Optimizer::Sgd,
            Optimizer::PagedAdamw8bit,
        ] {
            let j = Job {
                optimizer: o,
                micro_batch_size: 1,
                gradient_checkpointing: true,
                ..job()
            };
            let h = next_heal(&j, &ctx(&unknown, None)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(h.level, 4, "{o:?}");
        }
        let j = Job {
            optimizer: Optimizer::Lion32bit,
            micro_batch_size: 1,
            gradient_checkpointing: true,
            ..job()
        };
        let h = next_heal(&j, &ctx(&unknown, None)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.job.optimizer, Optimizer::Lion8bit);
    }

    #[test]
    fn inference_is_not_healed() {
        let j = Job {
            method: Method::Inference,
            ..job()
        };
        assert_eq!(
            next_heal(&j, &ctx(&unknown, None)).err(),
            Some(NoHeal::Inference)
        );
    }
}
