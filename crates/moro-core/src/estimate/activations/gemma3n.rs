//! Saved activations of a Gemma 3n layer ([`crate::model::Gemma3nSpec`]; transformers 5.25
//! `Gemma3nTextDecoderLayer.forward`), traced in `validation/oracle-traces/gemma3n.jsonl`.
//! Per token:
//!
//! - **eight `Gemma3nRMSNorm`s** over h (the input, post-attention, pre- and post-feed-forward
//!   norms, AltUp's router norm twice, LAuReL's and the per-layer input's): each keeps
//!   `x.float()` (saved by `pow` and the `rsqrt` product) and its `rsqrt`; a trainable
//!   weight also keeps the fp32 normalized input (`output * weight.float()`).
//! - **q, k and v norms** per head, the same way (`v_norm` has no weight).
//! - **attention**: SDPA's q, output and log-sum-exp, and the layer's own k, v (and k's norm
//!   output). A sliding layer gets a mask, so the mem-efficient kernel with k and v repeated
//!   to every head and an additive mask row per token; a layer that reuses another's keys
//!   and values saves none of its own (a sliding one still its repeated copies).
//! - **the MLP**: gate, up and the GELU's output; a sparse layer's `_gaussian_topk` adds the
//!   `relu`'s output (the gate's output is kept by `std`).
//! - **AltUp**: the innovation repeated to every stream (saved by the product with the
//!   correction coefficients) and the corrected streams (the next layer's input, saved by its
//!   prediction `matmul`); the modality router's fp32 `tanh` twice.
//! - **the per-layer input**: the gate's output (saved by the GELU).
//! - Linear inputs, LoRA's casts and `lora_A` outputs as for other decoders
//!   ([`Ctx::linear_inputs`], over the attention and MLP Linears). A full fine-tune also keeps
//!   the inputs of the small Linears and scales: the router's two normed inputs, the
//!   corrected stream's clone and its scaled copy, LAuReL's rank-wide input, and the
//!   per-layer input's GELU output and product.

use super::Ctx;
use crate::job::Method;
use crate::model::{AttentionKind, Gemma3nGroup, Gemma3nSpec, LayerGroup, LinearRole};

impl Ctx<'_> {
    /// Saved bytes per token of one Gemma 3n layer of group `g`.
    pub(super) fn gemma3n_layer_bytes(
        &self,
        g: &LayerGroup,
        f: Gemma3nGroup,
        spec: &Gemma3nSpec,
    ) -> u64 {
        let m = self.m;
        let full = self.job.method == Method::Full;
        let h = m.hidden_size;
        let (nh, kv) = (m.num_heads, m.num_kv_heads);
        let (ad, kd) = (m.q_width(), m.kv_width());
        let o = self.linear_out_bytes(self.r.stream_bytes);
        let b = self.attn_bytes(o);
        let a = spec.altup;
        let inter = g
            .linears
            .iter()
            .find(|l| l.name == "gate_proj")
            .map_or(m.intermediate_size, |l| l.out_features);
        let weight = |width: u64| if full { 4 * width } else { 0 };

        // Under autocast AltUp's streams are fp32 (the coefficients' products), so four of
        // the eight norms read an fp32 tensor (the sums around attention and LAuReL are two
        // more fp32 tensors they keep) and the streams are kept in fp32 three times over
        // (the repeat, the correction, the stack's cast) beside the matmul's bf16 operand.
        let autocast = self.r.autocast;
        let norms = if autocast { 6 * 4 * h } else { 8 * 4 * h } + 8 * 4 + 8 * weight(h);
        let head_norms = 4 * ad
            + 4 * nh
            + weight(ad)
            + if f.kv_shared {
                0
            } else {
                2 * (4 * kd + 4 * kv) + weight(kd)
            };
        let sliding = matches!(g.attention, AttentionKind::Sliding { .. });
        let kv_saved = match (sliding, f.kv_shared) {
            // Repeated to every head for the mem-efficient kernel, and the mask's row.
            (true, _) => 2 * b * ad + 2 * self.job.seq_len,
            (false, false) => 3 * b * kd,
            (false, true) => 0,
        };
        let attention = 2 * b * ad + 4 * nh + kv_saved;
        let mlp = 3 * o * inter + if f.sparse { o * inter + 4 } else { 0 };
        let altup = if autocast {
            a * h * (3 * 4 + 2)
        } else {
            2 * a * o * h
        } + 8 * a
            + o * a;
        let per_layer = o * spec.ple
            + if full {
                4 * o * h + o * spec.laurel_rank + 2 * o * spec.ple
            } else {
                0
            };
        let main = LayerGroup {
            linears: g
                .linears
                .iter()
                .filter(|l| l.role != LinearRole::Router)
                .cloned()
                .collect(),
            attention: AttentionKind::Full,
            ..g.clone()
        };
        norms + head_norms + attention + mlp + altup + per_layer + self.linear_inputs(&main, true)
    }

    /// Saved bytes per token outside Gemma 3n's layers: AltUp's three unembedding
    /// projections and their magnitude rescaling at the end (two tensors each), and the
    /// per-layer inputs (`L · p` wide, kept by every layer's product) and their scaled copy.
    pub(super) fn gemma3n_outside(&self, spec: &Gemma3nSpec) -> u64 {
        let m = self.m;
        let o = self.linear_out_bytes(self.r.stream_bytes);
        let streams = spec.altup.saturating_sub(1);
        2 * streams * o * m.hidden_size + 4 * o * m.num_layers * spec.ple
    }

    /// Backward transient per token of a Gemma 3n layer beyond a decoder layer's: the
    /// gradient of the down projection's fp32 input (an adapter's cast copy, or a full
    /// fine-tune's fp32 gradient of the product), `I` wide.
    pub(super) fn gemma3n_backward(&self, g: &LayerGroup) -> u64 {
        let inter = g
            .linears
            .iter()
            .find(|l| l.name == "gate_proj")
            .map_or(self.m.intermediate_size, |l| l.out_features);
        4 * inter
    }
}
