//! Saved activations of BART ([`Seq2SeqFamily::Bart`]), layer by layer: transformers 5.25
//! `models/bart/modeling_bart.py` under SDPA, checked on the fake-CUDA oracle
//! (`calibration/seq2seq_trace.py --matrix seq2seq-bart`,
//! `validation/oracle-traces/seq2seq-bart.jsonl`). Per token of the layer's stack:
//!
//! - Post-norm sub-layers: each ends `LayerNorm(residual + dropout(x))`; the LayerNorm saves
//!   its input, the sum (promoted to the stream's dtype), and fp32 mean and `rstd` (8 B);
//!   each `nn.Dropout` a 1-byte mask. Autocast runs `layer_norm` in fp32, so under it the
//!   stream is fp32 from `layernorm_embedding` on and every Linear casts its input.
//! - Attention: without a padding mask SDPA gets none (the decoder's causal mask is skipped:
//!   its all-ones padding mask lets `create_causal_mask` use `is_causal`), and the flash
//!   kernel saves q, k, v, the output (which `out_proj` reads as a view) and an fp32
//!   log-sum-exp per head. The cross-attention's k and v run over the encoder's tokens.
//!   A padded batch (`DataCollatorForSeq2Seq`) gives the encoder's self-attention and the
//!   cross-attention a boolean mask (made once); each SDPA call turns it into an additive
//!   mask in the query's dtype, which the mem-efficient kernel saves: `S` elements per
//!   token of the encoder's layers and of the cross-attention.
//! - Feed-forward: `gelu` saves its input (`fc1`'s output); `activation_dropout` a mask and
//!   its output, `fc2`'s input.
//! - Linear inputs, LoRA's casts and `lora_A` outputs as for decoder layers
//!   ([`Ctx::linear_inputs`]).
//!
//! Outside the layers: each stack's `layernorm_embedding` (its input, the sum of the token
//! and position embeddings, and its statistics) and embedding dropout's mask.

use super::{Activations, Ctx};
use crate::job::Method;
use crate::model::{LayerGroup, Linear, Seq2SeqSpec};

/// Per-token parts of BART's layers.
struct Layers {
    encoder: u64,
    decoder: u64,
    /// Per encoder token and decoder layer: the cross-attention's k and v.
    cross_kv: u64,
    /// Per encoder token: the encoder's output when a trainable k or v keeps it.
    cross_kv_shared: u64,
}

impl Ctx<'_> {
    /// Bytes per element of the residual stream after `layernorm_embedding`: fp32 under
    /// autocast (`layer_norm` is in its fp32 list), else the model's.
    fn bart_stream(&self) -> u64 {
        if self.r.autocast {
            4
        } else {
            self.r.stream_bytes
        }
    }

    fn bart_layers(&self, s2s: &Seq2SeqSpec) -> Layers {
        let m = self.m;
        let h = m.hidden_size;
        let n = m.q_width();
        let a = m.num_heads;
        let f = s2s.d_ff;
        let ln = self.bart_stream();
        let stream = Ctx {
            r: &crate::estimate::Regime {
                stream_bytes: ln,
                ..self.r.clone()
            },
            ..*self
        };
        let o = stream.linear_out_bytes(ln);
        let attn_b = stream.attn_bytes(o);
        let group = |linears: &[Linear]| LayerGroup {
            count: 1,
            linears: linears.to_vec(),
            other_params: 0,
            attention: crate::model::AttentionKind::Full,
            moe: false,
        };
        let mask_h = if s2s.dropout { h } else { 0 };
        let mask_f = if s2s.activation_dropout { f } else { 0 };
        // out_proj / fc2 → dropout → residual sum → LayerNorm.
        let tail = mask_h + ln.max(o) * h + 8;
        let lse = 4 * a;
        let ff = o * f + mask_f;
        // A padded batch's additive masks, per query token: over the encoder's tokens.
        let src = self.job.seq_len;
        let mask = if self.job.padding == crate::job::Padding::Padded {
            attn_b * src
        } else {
            0
        };
        let enc = &m.layers[0].linears;
        let encoder =
            2 * tail + 4 * attn_b * n + mask + lse + ff + stream.linear_inputs(&group(enc), true);
        let dec = &m.layers[1].linears;
        let (self_attn, cross, fc) = (&dec[..4], &dec[4..8], &dec[8..]);
        let mut q_side: Vec<Linear> = self_attn.to_vec();
        q_side.extend([cross[0].clone(), cross[3].clone()]);
        q_side.extend(fc.iter().cloned());
        let decoder = 3 * tail
            + 4 * attn_b * n
            + lse
            + 2 * attn_b * n
            + mask
            + lse
            + ff
            + stream.linear_inputs(&group(&q_side), true);
        let kv = [cross[1].clone(), cross[2].clone()];
        let kv_inputs = stream.linear_inputs(&group(&kv), true);
        let shared = if kv.iter().any(|l| stream.reads_input_itself(l, ln)) {
            ln * h
        } else {
            0
        };
        Layers {
            encoder,
            decoder,
            cross_kv: kv_inputs - shared + 2 * attn_b * n,
            cross_kv_shared: shared,
        }
    }
}

/// The activations of a BART `job`: `seq_len` encoder tokens and
/// [`crate::job::Job::target_tokens`] decoder tokens per sample.
pub(super) fn activations(ctx: &Ctx<'_>, s2s: &Seq2SeqSpec) -> Activations {
    let m = ctx.m;
    let job = ctx.job;
    let r = ctx.r;
    let b = job.micro_batch_size;
    let (src, tgt) = (job.seq_len, job.target_tokens());
    let (te, td) = (b * src, b * tgt);
    let h = m.hidden_size;
    let s = r.stream_bytes;
    let ln = ctx.bart_stream();
    let layers = ctx.bart_layers(s2s);
    let full = job.method == Method::Full;
    let mask_h = if s2s.dropout { h } else { 0 };
    // Each stack's `layernorm_embedding` (its input and statistics) and embedding dropout.
    let embed = s * h + 8 + mask_h;
    // A trainable lm_head keeps the decoder's last output.
    let lm_head_input = if full { ln * h } else { 0 };
    // A padded batch's boolean masks, made once: the encoder's and the cross-attention's.
    let masks = if job.padding == crate::job::Padding::Padded {
        b * src * (src + tgt)
    } else {
        0
    };
    let head = embed * (te + td) + layers.cross_kv_shared * te + lm_head_input * td + masks;
    let enc_layer = layers.encoder * te;
    let dec_layer = layers.decoder * td + layers.cross_kv * te;
    let (all, ckpt_one) = if job.gradient_checkpointing {
        // Each layer's checkpoint is its input; the encoder's output is one tensor.
        (
            s2s.encoder_layers * ln * h * te + s2s.decoder_layers * ln * h * td + ln * h * te,
            ln * h * te.max(td),
        )
    } else {
        (
            s2s.encoder_layers * enc_layer + s2s.decoder_layers * dec_layer,
            ln * h * te.max(td),
        )
    };
    let (autocast_weight_cache, autocast_weight_cache_backward) =
        super::seq2seq::weight_caches(ctx);
    let o = ctx.linear_out_bytes(ln);
    let backward = (3 * o * s2s.d_ff).max(4 * ctx.attn_bytes(o) * m.q_width()) + 2 * ln * h;
    Activations {
        all,
        one_layer: enc_layer.max(dec_layer),
        checkpoint_one: ckpt_one,
        head,
        autocast_weight_cache,
        autocast_weight_cache_backward,
        layer_backward_transient: backward * te.max(td),
        previous_step_quantized_inputs: 0,
    }
}
