//! Saved activations of a cross-attention decoder layer ([`AttentionKind::Cross`]; transformers
//! 5.25 `MllamaCrossAttentionDecoderLayer`, `MllamaTextCrossAttention`), traced in
//! `validation/oracle-traces/vlm-mllama.jsonl`.
//!
//! The text side, per token, is a decoder layer's without k and v: the two norms, `q_proj`'s
//! and `o_proj`'s inputs, `q_norm`'s fp32 copy and `rsqrt`, SDPA's q, output and log-sum-exp,
//! the MLP; a full fine-tune's gates (`cross_attn_attn_gate.tanh() * h`) save their input.
//!
//! The vision side, per sample, over its `V` vision states (every image's tiles): `k_proj`'s
//! and `v_proj`'s inputs as any Linear's (a LoRA adapter's cast copy and its `lora_A`
//! output), `k_norm`'s fp32 copy and `rsqrt`, and k and v as SDPA saves them. The layer
//! always passes its cross-attention mask, so SDPA runs the mem-efficient kernel and
//! transformers repeats k and v to every query head first (`repeat_kv`; `use_gqa_in_sdpa`
//! only without a mask). The mask itself is one tensor for every such layer
//! ([`super::super::vision::step`]).
//!
//! Without images transformers skips these layers (`MllamaTextModel.forward`: `continue`
//! when there are no cross-attention states): they save nothing.

use super::Ctx;
use crate::job::Method;
use crate::model::{AttentionKind, LayerGroup, LinearRole};

impl Ctx<'_> {
    /// Vision states each sample's cross-attention layers read.
    pub(super) fn cross_states_per_sample(&self) -> u64 {
        self.m.vision.as_ref().map_or(0, |v| {
            v.cross_states_per_image() * self.job.images.per_sample
        })
    }

    /// Saved bytes per text token of one cross-attention layer (the vision side's bytes
    /// spread over the sample's tokens, rounded up).
    pub(super) fn cross_layer_bytes(&self, g: &LayerGroup) -> u64 {
        let m = self.m;
        let job = self.job;
        let r = self.r;
        let tp = self.tp.max(1);
        let h = m.hidden_size;
        let s = r.stream_bytes;
        let full = job.method == Method::Full;
        let o = self.linear_out_bytes(s);
        let attn_b = self.attn_bytes(o);
        let a = m.num_heads / tp;
        let kvh = m.num_kv_heads / tp;
        let ad = m.q_width() / tp;
        let kd = m.kv_width() / tp;
        let is_kv = |name: &str| matches!(name, "k_proj" | "v_proj");

        // Text side, per token.
        let per_norm = 4 * h + if full { s * h } else { 0 };
        let text_only = LayerGroup {
            linears: g
                .linears
                .iter()
                .filter(|l| !(l.role == LinearRole::Attention && is_kv(&l.name)))
                .cloned()
                .collect(),
            attention: AttentionKind::Full,
            ..g.clone()
        };
        let q_norm = 4 * ad + 4 * a + if full { o * ad } else { 0 };
        let sdpa = 2 * attn_b * ad + 4 * a;
        let gates = if full { 2 * o * h } else { 0 };
        let mlp = 3 * o * m.intermediate_size / tp;
        let text =
            2 * per_norm + self.linear_inputs(&text_only, true) + q_norm + sdpa + gates + mlp;

        // Vision side, per sample.
        let states = self.cross_states_per_sample();
        let ab = if r.autocast { 2 } else { r.adapter_bytes };
        let mut kv_inputs = 0;
        for l in g
            .linears
            .iter()
            .filter(|l| l.role == LinearRole::Attention && is_kv(&l.name))
        {
            if job.method.is_peft() && job.adapts(l) {
                kv_inputs += self
                    .adapter_cast_bytes(o)
                    .map_or(0, |cb| cb * l.in_features);
                kv_inputs += job.adapter.rank * ab;
            }
        }
        let k_norm = 4 * kd + 4 * kvh + if full { o * kd } else { 0 };
        let kv_width = if kvh < a { ad } else { kd };
        let vision = states * (kv_inputs + k_norm + 2 * attn_b * kv_width);
        text + vision.div_ceil(job.seq_len.max(1))
    }

    /// Backward transient per text token of one cross-attention layer: a self-attention
    /// layer's, plus the gradients of the repeated k and v over the vision states.
    pub(super) fn cross_backward(&self) -> u64 {
        let tp = self.tp.max(1);
        let o = self.linear_out_bytes(self.r.stream_bytes);
        let ad = self.m.q_width() / tp;
        (2 * o * ad * self.cross_states_per_sample()).div_ceil(self.job.seq_len.max(1))
    }
}
