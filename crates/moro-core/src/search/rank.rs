//! Ranking keys: the objectives' orders over configurations.

use crate::job::{Attention, Method, Optimizer, Precision};

use super::*;

/// Number of entries of a ranking key.
pub const KEY_LEN: usize = 14;

/// Largest [`Layout::comm_cost`] (offload of optimizer and parameters across nodes).
const MAX_COMM_COST: u64 = 14;

const fn method_quality(m: Method) -> u64 {
    match m {
        Method::Full => 2,
        Method::Adapters => 1,
        Method::QuantizedAdapters | Method::Inference => 0,
    }
}

const fn optimizer_rank(o: Optimizer) -> u64 {
    match o {
        Optimizer::AdamwTorchFused => 2,
        Optimizer::Adamw8bit => 1,
        _ => 0,
    }
}

/// The `quality` ranking key (compared lexicographically, larger is better), following the
/// product's order of knobs by leverage, method > precision > checkpointing >
/// batch/accumulation > optimizer (issue 3 §2), with the GPU layout after the method and
/// precision (issue 6 §3):
///
/// 1. sequence length, longer first (only varies when not fixed: the data's context is a
///    requirement, not a knob to trade);
/// 2. method: full > LoRA on a 16-bit base > QLoRA (no 4-bit when 16-bit LoRA fits: NF4
///    quantization error reaches the adapters' gradients). A full fine-tune sharded with
///    ZeRO-3 over eight GPUs beats QLoRA on one;
/// 3. LoRA targets: every Linear > attention only. Part of the method's leverage: "LoRA on
///    all linear transformer block layers is required to match full finetuning performance"
///    (QLoRA paper, Dettmers et al. 2023, §4);
/// 4. precision: fp32 master weights under autocast (`bf16-mixed`) > pure bf16;
/// 5. the least communication ([`Layout::comm_cost`]): one GPU or DDP < ZeRO-1 < ZeRO-2 /
///    SHARD_GRAD_OP < ZeRO-3 / FULL_SHARD within a node or HYBRID_SHARD < FULL_SHARD across
///    nodes < optimizer offload < optimizer and parameter offload. The layout changes the
///    speed, not the result, so it ranks below the knobs that change the result (method,
///    adapters, precision) and above those a user trades for speed; ranked above precision
///    it would pick DDP with pure bf16 weights and 8-bit AdamW for a 7B full fine-tune on
///    eight A100s where ZeRO-1 keeps fp32 master weights and 32-bit AdamW;
/// 6. more GPUs, at equal communication (the user's GPUs are used, not left idle);
/// 7. higher LoRA rank. Below precision: the same paper finds the rank matters little once
///    every layer is adapted;
/// 8. no gradient checkpointing > checkpointing (it changes speed, not the result, so it
///    ranks below everything that changes the result);
/// 9. larger micro batch (fewer accumulation steps);
/// 10. optimizer: 32-bit AdamW states > 8-bit > paged 8-bit;
/// 11. FlashAttention-2 > SDPA;
/// 12. DeepSpeed > FSDP at the same communication (ZeRO-2 over SHARD_GRAD_OP, ZeRO-3 over
///     FULL_SHARD: the HF Trainer's most used integration, and the one the published
///     full fine-tuning runs of issue 6 used);
/// 13. without Liger's kernels > with them: they compute the same step (no result changes),
///     but the trainer then needs the `liger-kernel` package, so a recipe turns them on only
///     where they buy one of the knobs above (no checkpointing, a larger micro batch, a
///     better method or precision).
#[must_use]
pub fn quality_key(c: &Config) -> [u64; KEY_LEN] {
    let peft = c.method.is_peft();
    [
        c.seq_len,
        method_quality(c.method),
        u64::from(peft && c.targets == TargetSet::AllLinear),
        u64::from(c.precision != Precision::Bf16),
        MAX_COMM_COST.saturating_sub(c.layout.comm_cost()),
        c.layout.gpus,
        if peft { c.rank } else { 0 },
        u64::from(!c.gradient_checkpointing),
        c.micro_batch,
        optimizer_rank(c.optimizer),
        u64::from(c.attention == Attention::Flash),
        u64::from(c.layout.is_deepspeed()),
        u64::from(!c.liger),
        0,
    ]
}

/// The `speed` ranking key (lexicographic, larger is better):
///
/// 1. sequence length, longer first (as for quality);
/// 2. no CPU offload > optimizer offload > optimizer and parameter offload (the CPU step and
///    PCIe transfers dominate a step);
/// 3. more GPUs (throughput grows with the data-parallel degree);
/// 4. no gradient checkpointing (recomputing the forward costs about a third of a step);
/// 5. less communication ([`Layout::comm_cost`]);
/// 6. larger micro batch (better GPU utilisation per step);
/// 7. method: LoRA > full > QLoRA (LoRA skips the weight-gradient GEMMs, about a third of a
///    step's FLOPs; QLoRA dequantizes every weight in forward and backward);
/// 8. FlashAttention-2 > SDPA;
/// 9. Liger's kernels on (fused norms, activations and loss: fewer kernel launches and no
///    logits round trip; liger-kernel's README reports about 20 % more throughput on
///    Llama-3-8B);
/// 10. optimizer: fused 32-bit > 8-bit > paged 8-bit;
/// 11. then the quality order: targets, rank, precision;
/// 14. DeepSpeed > FSDP at the same communication.
#[must_use]
pub fn speed_key(c: &Config) -> [u64; KEY_LEN] {
    let peft = c.method.is_peft();
    let method = match c.method {
        Method::Adapters => 2,
        Method::Full => 1,
        Method::QuantizedAdapters | Method::Inference => 0,
    };
    let cost = c.layout.comm_cost();
    [
        c.seq_len,
        (MAX_COMM_COST / 5).saturating_sub(cost / 5),
        c.layout.gpus,
        u64::from(!c.gradient_checkpointing),
        MAX_COMM_COST.saturating_sub(cost),
        c.micro_batch,
        method,
        u64::from(c.attention == Attention::Flash),
        u64::from(c.liger),
        optimizer_rank(c.optimizer),
        u64::from(peft && c.targets == TargetSet::AllLinear),
        if peft { c.rank } else { 0 },
        u64::from(c.precision != Precision::Bf16),
        u64::from(c.layout.is_deepspeed()),
    ]
}

/// The ranking key of `c` under `objective`.
#[must_use]
pub fn key(objective: Objective, c: &Config) -> [u64; KEY_LEN] {
    match objective {
        Objective::Quality => quality_key(c),
        Objective::Speed => speed_key(c),
    }
}
