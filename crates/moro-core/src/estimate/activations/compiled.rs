//! What a decoder layer saves for backward under `torch.compile` (Inductor's default
//! partitioner), per token.
//!
//! AOTAutograd's min-cut partitioner (torch 2.15 `torch/_functorch/partitioners.py`
//! `min_cut_rematerialization_partition`, run by Inductor's `partition_fn`) saves what it
//! may not recompute (matmul and attention outputs, reductions more than 4× smaller than
//! their input, random ops) and recomputes pointwise chains from the smallest saved
//! tensor. For a pre-norm decoder layer that means, per token (docs/torch-compile.md,
//! traced with `calibration/compile_trace.py` on Llama-3.1-8B, Qwen3-8B,
//! Mistral-7B, Phi-3-mini and gemma-2-2b; `validation/oracle-traces/compile.jsonl`):
//!
//! - each norm's input (the residual stream before a pre-norm; the matmul output before a
//!   post-norm) and its fp32 `rsqrt`; the fp32 upcast and `x·rsqrt` are recomputed;
//! - one copy of each Linear group's input when a trainable weight or an adapter reads
//!   it (autocast's bf16 cast, or PEFT's cast for fp32 adapters, shared by the group);
//! - the attention kernel's q, k, v, output and log-sum-exp, as eager; LoRA on the output
//!   projection adds its own bf16 copy of the attention output; Gemma 2's eager attention
//!   keeps two 16-bit score tensors per head, not eager's three (one fp32);
//! - gate and up outputs (the activation is recomputed) and, for a trainable reader, the
//!   down projection's input;
//! - q/k norms: the q and k projections' outputs and one `rsqrt` per head;
//! - `lora_A`'s outputs, as eager.

use crate::job::{Attention, Method, PeftKind};
use crate::model::LayerGroup;

use super::{Ctx, Group, group_of};

impl Ctx<'_> {
    /// Saved bytes per token of one dense decoder layer under `torch.compile`
    /// (`crate::job::Job::validate` admits only the layers this covers).
    pub(super) fn compiled_layer_bytes(&self, g: &LayerGroup) -> u64 {
        let m = self.m;
        let job = self.job;
        let r = self.r;
        let tp = self.tp.max(1);
        let h = m.hidden_size;
        let s = r.stream_bytes;
        let o = self.linear_out_bytes(s);
        let attn_b = self.attn_bytes(o);
        let full = job.method == Method::Full;
        let peft = job.method.is_peft();

        // Norm inputs: two pre-norms read the residual stream; Gemma 2's post-norms read
        // the o_proj and down_proj outputs.
        let norms = Self::norms_per_layer(g, m);
        let pre = norms.min(2);
        let mut bytes = pre * s * h + (norms - pre) * o * h + 4 * norms;

        // Linear inputs, one copy per group (with dropout, one mask and copy per adapter).
        let adapter_in = if r.autocast { 2 } else { r.adapter_bytes };
        // PEFT's `_cast_input_dtype` casts an adapter's input to fp32 adapters' dtype, which
        // autocast casts back: a new tensor even in the input's dtype (as eager).
        let casts = if r.autocast {
            r.adapter_bytes == 4
        } else {
            attn_b != r.adapter_bytes
        };
        // SDPA and FlashAttention save their output; eager attention saves only its inputs.
        let kernel_saves_out = job.attention != Attention::Eager;
        let dropout = peft && job.adapter.dropout > 0.0;
        let a = m.num_heads / tp;
        let ad = m.q_width() / tp;
        let kd = m.kv_width() / tp;
        let i_act = m.active_intermediate(false) / tp;
        for grp in [Group::AttnIn, Group::AttnOut, Group::MlpIn, Group::MlpOut] {
            let width = match grp {
                Group::AttnIn | Group::MlpIn | Group::Router => h,
                Group::AttnOut => ad,
                Group::MlpOut => i_act,
            };
            let adapted = g
                .linears
                .iter()
                .filter(|l| group_of(l, h) == grp && peft && job.adapts(l))
                .map(|l| l.count)
                .sum::<u64>();
            // A full fine-tune's o_proj reads the attention kernel's saved output; an adapter
            // reads its own cast of it.
            let own_copy = match grp {
                Group::AttnOut if kernel_saves_out => adapted > 0 && casts,
                _ => full || adapted > 0,
            };
            if dropout && adapted > 0 {
                bytes += adapted * width * (adapter_in + 1);
                if full {
                    bytes += width * o;
                }
            } else if own_copy {
                let b = if full { o } else { adapter_in };
                bytes += width * b;
            }
            bytes += adapted * job.adapter.rank * adapter_in;
        }

        if m.qk_norm {
            let width = (m.q_width() + m.kv_width()) / tp;
            let heads = (m.num_heads + m.num_kv_heads) / tp;
            bytes += o * width + 4 * heads;
        }

        // Attention core.
        let seq = job.seq_len;
        bytes += match job.attention {
            // Gemma 2 (`attn_logit_softcapping`): q, `repeat_kv`'s k and v, two 16-bit
            // score-sized `bmm` results (the cap, mask and softmax are recomputed from them),
            // three fp32 values and a fully-masked flag per row and head.
            Attention::Eager => 3 * attn_b * ad + 2 * attn_b * a * seq + 13 * a,
            // A padding mask sends SDPA to the mem-efficient kernel, which takes k and v
            // expanded to every head (transformers `use_gqa_in_sdpa`); the mask is shared.
            Attention::Sdpa if job.padding.has_mask() => attn_b * 4 * ad + 4 * a,
            Attention::Sdpa | Attention::Flash if self.expands_kv() => attn_b * 4 * ad + 4 * a,
            Attention::Sdpa | Attention::Flash => attn_b * (2 * ad + 2 * kd) + 4 * a,
        };
        bytes += self.fused_qkv_view(g);

        // Gated MLP: gate and up outputs.
        bytes + 2 * o * i_act
    }
}

impl Ctx<'_> {
    /// Saved bytes per token outside the layers under `torch.compile`: the final norm's input
    /// and `rsqrt`, lm_head's input when lm_head trains, the fp32 positions the backward
    /// recomputes RoPE's cos and sin from (eager saves cos and sin per layer instead), and a
    /// padding mask, once for all layers (common-subexpression elimination merges it).
    pub(super) fn compiled_head_bytes(&self) -> u64 {
        let h = self.m.hidden_size;
        let s = self.r.stream_bytes;
        let lm_head_input = if self.job.method == Method::Full {
            self.linear_out_bytes(s) * h
        } else {
            0
        };
        let mask = if self.job.padding.has_mask() && self.job.attention == Attention::Sdpa {
            2 * self.job.seq_len
        } else {
            0
        };
        s * h + 4 + lm_head_input + 4 + mask
    }
}

impl Ctx<'_> {
    /// A fused q/k/v projection (Phi-3's `qkv_proj`, GPT-NeoX's `query_key_value`: exactly
    /// q, k and v wide; Qwen3-Next's `q_proj`, q and its gate, is none): v is a view of the
    /// projection's output, so the attention kernel, saving v, keeps all of it alive:
    /// o·(q + k) more than separate projections (traced, Phi-3-mini, eager and compiled). An
    /// adapted projection's output (the sum with the adapter's) is kept the same way without
    /// autocast (traced, Phi-3-mini and pythia-410m LoRA in bf16: 18 and 6 MiB a layer at
    /// 1,024 tokens); under autocast, and compiled, the traces save the v slice alone.
    /// Prefix tuning's cache concatenates the prefix to k and v, new tensors that hold
    /// nothing of the projection.
    pub(super) fn fused_qkv_view(&self, g: &LayerGroup) -> u64 {
        let m = self.m;
        let h = m.hidden_size;
        let tp = self.tp.max(1);
        let fused = g.linears.iter().find(|l| {
            group_of(l, h) == Group::AttnIn && l.out_features == m.q_width() + 2 * m.kv_width()
        });
        match fused {
            Some(l)
                if self.job.attention != Attention::Eager
                    && self.job.adapter.method != PeftKind::PrefixTuning
                    && !(self.job.method.is_peft()
                        && self.job.adapts(l)
                        && (self.job.compile || self.r.autocast)) =>
            {
                self.linear_out_bytes(self.r.stream_bytes) * (m.q_width() + m.kv_width()) / tp
            }
            _ => 0,
        }
    }
}
