//! Saved activations of an encoder-decoder model (T5, mT5), block by block.
//!
//! transformers 5.25 `models/t5/modeling_t5.py` under SDPA, the tensors each op keeps for
//! backward by PyTorch's rules (an op saves an input only when the other needs a gradient),
//! checked tensor by tensor on the fake-CUDA oracle (`calibration/seq2seq_trace.py
//! --per-block`, `validation/oracle-traces/seq2seq.jsonl`). Per token of the block's stack:
//!
//! - `T5LayerNorm`: `hidden_states.to(torch.float32)` is saved by `pow` (4h; in an fp32
//!   stream the input itself), `rsqrt` its output (4); `x * rsqrt` saves x, the residual
//!   stream tensor the block already counts. A trainable norm weight also keeps what it
//!   multiplies: the `.to(weight.dtype)` copy of a 16-bit weight (2h) or the fp32 product.
//! - The residual stream: each sub-block's `hidden_states + dropout(...)` is the next norm's
//!   saved input (two per encoder block, three per decoder block).
//! - `nn.Dropout` (`dropout_rate > 0`): a 1-byte mask for each sub-block's output and the
//!   feed-forward's hidden state.
//! - Attention: SDPA gets `position_bias` as a float mask, so it runs the memory-efficient
//!   kernel, which saves q, k, v, the output and an fp32 log-sum-exp per head and token
//!   (`_scaled_dot_product_efficient_attention`); `create_position_bias_mask` makes the mask
//!   contiguous per call: the encoder's permuted bias is copied in every block (`a · S²`
//!   bias elements), the decoder's causal `torch.where` too (`a · T²`). The cross-attention's
//!   zero bias is made once and passes as it is. With a padding mask the encoder's and the
//!   cross-attention's `torch.where(mask, bias, min)` are per sample (`b · a · S²`,
//!   `b · a · T · S`). `o` reads SDPA's output.
//! - Linear inputs, LoRA's casts and `lora_A` outputs as for decoder layers
//!   ([`Ctx::linear_inputs`]); the cross-attention's k and v read the encoder's output, one
//!   tensor for every decoder block: a trainable weight's saved input counts once, an
//!   adapter's private copy once per block.
//! - Feed-forward: `relu` saves its output; `gated-gelu`'s `NewGELUActivation` keeps the
//!   `pow` input, `tanh`'s output, `1 + tanh`, `0.5 * x` and its own output, and the gate
//!   product keeps `wi_1`'s output. Under autocast `pow` runs in fp32, so its cast input,
//!   `tanh`, `1 + tanh` and the activation's output are fp32. The dropout's output (its
//!   `.to(wo.weight.dtype)` copy) is `wo`'s input.

use super::{Activations, Ctx};
use crate::job::Method;
use crate::model::{FeedForward, LayerGroup, Linear, Seq2SeqSpec};

/// The per-block parts that do not depend on the tokens' count: `(per encoder token,
/// per decoder token, per encoder token per decoder block, shared per encoder token)`.
struct Blocks {
    encoder: u64,
    decoder: u64,
    cross_kv: u64,
    cross_kv_shared: u64,
}

impl Ctx<'_> {
    /// Saved bytes per token of one `T5LayerNorm` beyond its input.
    fn t5_norm(&self) -> u64 {
        let h = self.m.hidden_size;
        let s = self.r.stream_bytes;
        let fp32_copy = if s == 4 { 0 } else { 4 * h };
        let weight = if self.job.method == Method::Full {
            if self.r.param_bytes == 4 {
                4 * h
            } else {
                2 * h
            }
        } else {
            0
        };
        fp32_copy + 4 + weight
    }

    /// One SDPA call's saved q, k (when `with_kv`), v and output, and its log-sum-exp, per
    /// query token.
    fn t5_attention_core(&self, with_kv: bool) -> u64 {
        let o = self.linear_out_bytes(self.r.stream_bytes);
        let b = self.attn_bytes(o);
        let n = self.m.q_width();
        let kv = if with_kv { 2 * b * n } else { 0 };
        b * n + kv + b * n + 4 * self.m.num_heads
    }

    /// The feed-forward's activation, gate and dropout, per token (Linear inputs apart).
    fn t5_feed_forward(&self, s2s: &Seq2SeqSpec) -> u64 {
        let o = self.linear_out_bytes(self.r.stream_bytes);
        let f = s2s.d_ff;
        let mask = if s2s.dropout { f } else { 0 };
        match s2s.feed_forward {
            // `relu` saves its output, `gelu` its input: one hidden state either way.
            FeedForward::Relu | FeedForward::Gelu => o * f + mask,
            FeedForward::GatedGeluNew => {
                // `pow` is in autocast's fp32 list: the GELU's polynomial runs in fp32.
                let p = if self.r.autocast { 4 } else { o };
                // pow's input, tanh, 1 + tanh, 0.5·x, the GELU's output, wi_1's output.
                3 * p * f + o * f + p.max(o) * f + o * f + mask
            }
        }
    }

    /// Whether `l` saves the very tensor it reads (rather than a private copy): a trainable
    /// weight reading it in its own dtype, or an adapter with no cast and no dropout.
    pub(super) fn reads_input_itself(&self, l: &Linear, xb: u64) -> bool {
        let job = self.job;
        let r = self.r;
        if job.method == Method::Full {
            return !(r.autocast && xb == 4);
        }
        if r.quantized_saves_input {
            return true;
        }
        job.method.is_peft()
            && job.adapts(l)
            && job.adapter.dropout == 0.0
            && self.adapter_cast_bytes(xb).is_none()
    }

    fn t5_blocks(&self, s2s: &Seq2SeqSpec) -> Blocks {
        let m = self.m;
        let h = m.hidden_size;
        let s = self.r.stream_bytes;
        let mask_h = if s2s.dropout { h } else { 0 };
        let group = |linears: &[Linear]| LayerGroup {
            count: 1,
            linears: linears.to_vec(),
            other_params: 0,
            attention: crate::model::AttentionKind::Full,
            moe: false,
        };
        let dec = &m.layers[1].linears;
        let (self_attn, cross, ff) = (&dec[..4], &dec[4..8], &dec[8..]);
        let ff_inputs = self.linear_inputs(&group(ff), true);
        // Without dropout the activation's output is `wo`'s input: a trainable `wo`
        // saves the tensor the activation already keeps.
        let ff_shared = if !s2s.dropout
            && s2s.feed_forward == FeedForward::Relu
            && ff
                .last()
                .is_some_and(|wo| self.reads_input_itself(wo, self.linear_out_bytes(s)))
        {
            self.linear_out_bytes(s) * s2s.d_ff
        } else {
            0
        };
        let ff_bytes = ff_inputs + self.t5_feed_forward(s2s) - ff_shared;
        let encoder = 2 * (self.t5_norm() + s * h + mask_h)
            + self.linear_inputs(&group(&m.layers[0].linears[..4]), true)
            + self.t5_attention_core(true)
            + ff_bytes;
        let cross_q_o = [cross[0].clone(), cross[3].clone()];
        let decoder = 3 * (self.t5_norm() + s * h + mask_h)
            + self.linear_inputs(&group(self_attn), true)
            + self.t5_attention_core(true)
            + self.linear_inputs(&group(&cross_q_o), true)
            + self.t5_attention_core(false)
            + ff_bytes;
        // The cross-attention's k and v over the encoder's tokens: their outputs (saved by
        // SDPA) and what they keep of the encoder's output.
        let kv = [cross[1].clone(), cross[2].clone()];
        let kv_inputs = self.linear_inputs(&group(&kv), true);
        let shared = if kv.iter().any(|l| self.reads_input_itself(l, s)) {
            s * h
        } else {
            0
        };
        let o = self.linear_out_bytes(s);
        Blocks {
            encoder,
            decoder,
            cross_kv: kv_inputs - shared + 2 * self.attn_bytes(o) * m.q_width(),
            cross_kv_shared: shared,
        }
    }
}

/// The activations of an encoder-decoder `job`: `seq_len` encoder tokens and
/// [`crate::job::Job::target_tokens`] decoder tokens per sample.
pub(super) fn activations(ctx: &Ctx<'_>, s2s: &Seq2SeqSpec) -> Activations {
    if s2s.family == crate::model::Seq2SeqFamily::Bart {
        return super::bart::activations(ctx, s2s);
    }
    let m = ctx.m;
    let job = ctx.job;
    let r = ctx.r;
    let b = job.micro_batch_size;
    let (src, tgt) = (job.seq_len, job.target_tokens());
    let (te, td) = (b * src, b * tgt);
    let h = m.hidden_size;
    let s = r.stream_bytes;
    let a = m.num_heads;
    let blocks = ctx.t5_blocks(s2s);
    let o = ctx.linear_out_bytes(s);
    let bias_b = ctx.attn_bytes(o);
    // The position-bias masks each block makes: without a padding mask the bias broadcasts
    // over the batch; with one (`training.padding: padded`, `DataCollatorForSeq2Seq`) the
    // encoder's `torch.where(mask, bias, min)` and the cross-attention's are per sample.
    let padded = job.padding == crate::job::Padding::Padded;
    let per = if padded { b } else { 1 };
    let enc_mask = per * a * src * src * bias_b;
    let cross_mask = if padded {
        b * a * tgt * src * bias_b
    } else {
        0
    };
    // UMT5's cross-attention makes its own zero bias in every layer
    // (`UMT5Attention.forward`: `torch.zeros((1, n_heads, seq_length, key_length))`), which
    // SDPA saves as its mask; T5's is made once.
    let own_cross_bias = if s2s.per_layer_bias && !padded {
        a * tgt * src * bias_b
    } else {
        0
    };
    let dec_mask = a * tgt * tgt * bias_b + tgt * tgt + cross_mask + own_cross_bias;
    let enc_block = blocks.encoder * te + enc_mask;
    let dec_block = blocks.decoder * td + blocks.cross_kv * te + dec_mask;
    let full = job.method == Method::Full;
    let mask_h = if s2s.dropout { h } else { 0 };
    // Outside the blocks: each stack's embedding dropout (mask and the first block's input),
    // final norm and dropout; the encoder's output as the cross-attention's k and v keep it;
    // lm_head's input when lm_head trains (T5 v1.0's `* d_model ** -0.5` makes it a tensor
    // of its own).
    let stack_ends = 2 * mask_h + s * h + ctx.t5_norm();
    let lm_head_input = if full { s * h } else { 0 };
    let head = (stack_ends + s * h) * td
        + stack_ends * te
        + blocks.cross_kv_shared * te
        + lm_head_input * td;
    let (all, ckpt_one) = if job.gradient_checkpointing {
        // Each block's checkpoint is its input; the encoder's output and the position
        // biases every block receives are one tensor each (UMT5's blocks make their own).
        let biases = if s2s.per_layer_bias {
            0
        } else {
            a * src * src * bias_b + a * tgt * (tgt + src) * bias_b
        };
        let shared = s * h * te + biases;
        (
            s2s.encoder_layers * s * h * te + s2s.decoder_layers * s * h * td + shared,
            s * h * te.max(td),
        )
    } else {
        (
            s2s.encoder_layers * enc_block + s2s.decoder_layers * dec_block,
            s * h * te.max(td),
        )
    };
    let (autocast_weight_cache, autocast_weight_cache_backward) = weight_caches(ctx);
    // One block's backward: the feed-forward's gradients (three of its hidden states) or
    // the attention's (dq, dk, dv and the output's), plus the residual gradient.
    let f = s2s.d_ff;
    let n = m.q_width();
    let backward = (3 * o * f).max(4 * bias_b * n) + 2 * s * h;
    Activations {
        all,
        one_layer: enc_block.max(dec_block),
        checkpoint_one: ckpt_one,
        head,
        autocast_weight_cache,
        autocast_weight_cache_backward,
        layer_backward_transient: backward * te.max(td),
        previous_step_quantized_inputs: 0,
    }
}

/// Autocast's bf16 copies of fp32 trainable weights in an encoder-decoder, cached for the
/// forward: every matmul weight of a full fine-tune (the Linears and lm_head), or the
/// adapters; and the part alive in backward (under checkpointing only the recomputed
/// block's).
pub(super) fn weight_caches(ctx: &Ctx<'_>) -> (u64, u64) {
    let (m, job, r) = (ctx.m, ctx.job, ctx.r);
    let full_fp32 = job.method == Method::Full && r.autocast && r.param_bytes == 4;
    let cache = if full_fp32 {
        2 * (m.linear_params() + m.vocab_size * m.hidden_size)
    } else if job.method.is_peft() && r.autocast && r.adapter_bytes == 4 {
        2 * r.trainable_params
    } else {
        0
    };
    (cache, super::weight_cache_in_backward(m, job, cache, 1))
}
