//! What a decoder layer saves for backward under Unsloth's kernels, per token
//! (unsloth 2026.8.19 `kernels/fast_lora.py`, `kernels/rms_layernorm.py`,
//! `kernels/rope_embedding.py`, `utils/attention_dispatch.py`; docs/unsloth-memory.md §3).
//!
//! - `Fast_RMS_Layernorm` saves its input (no copy) and one fp32 inverse RMS per row; its
//!   output is the next matmul's saved input.
//! - `LoRA_QKV` saves the norm's output and the adapters themselves; `LoRA_W` (o_proj) the
//!   attention output, which the attention kernel saves too; `LoRA_MLP` the norm's output,
//!   the gate and the up projections (the activation product is freed after the down
//!   projection). The 4-bit weights are dequantized again in backward, never saved.
//! - RoPE runs in place and saves nothing; FlashAttention saves q, k, v, its output and an
//!   fp32 log-sum-exp per head; PyTorch's SDPA (with `enable_gqa`) the same, and its
//!   transposed output is copied by the reshape `LoRA_W` saves.
//! - Qwen3's q and k norms run the same RMSNorm kernel.

use crate::job::Attention;
use crate::model::LayerGroup;

use super::Ctx;

impl Ctx<'_> {
    /// Saved bytes per token of one decoder layer under Unsloth's fused LoRA kernels. The
    /// layer's input, which the first norm saves, is counted here only without
    /// checkpointing (with it, the input is the checkpoint).
    pub(super) fn unsloth_layer_bytes(&self, g: &LayerGroup) -> u64 {
        let m = self.m;
        let b = self.attn_bytes(self.r.compute_bytes);
        let h = m.hidden_size;
        let q = m.q_width();
        let kv = m.kv_width();
        let i = m.active_intermediate(g.moe);
        let heads = m.num_heads;
        // Norm outputs (two), the post-attention residual, q, k, v, the attention output,
        // gate and up; two fp32 inverse RMS and the log-sum-exp per head.
        let mut bytes = b * (3 * h + 2 * q + 2 * kv + 2 * i) + 4 * (heads + 2);
        if !self.job.gradient_checkpointing {
            bytes += b * h;
        }
        if self.job.attention == Attention::Sdpa {
            bytes += b * q;
        }
        if m.qk_norm {
            bytes += b * (q + kv) + 4 * (heads + m.num_kv_heads);
        }
        bytes
    }
}
