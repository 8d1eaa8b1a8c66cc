//! TRL's `chunked_nll` loss, tensor by tensor: `SFTTrainer`'s default from TRL 1.7
//! (`trl/trainer/sft_trainer.py` `_chunked_cross_entropy_loss` and `_chunk`, read at
//! 1.10.0.dev0, commit f2cd577).
//!
//! The forward stops at the final norm's output. Its shifted tokens (`hidden[..., :-1, :]`,
//! copied by `reshape` when the batch has several rows) are gathered into label order
//! (`hidden[order]`, kept: every chunk's checkpoint saves a view of it), then each 256-token
//! chunk runs `_chunk` under non-reentrant checkpointing, saving nothing: `h.float()`,
//! `w.float()` (an fp32 copy of the whole `lm_head`, unless it is fp32), under autocast the
//! 16-bit casts `mm` takes of both, the chunk's logits (16-bit under autocast, else fp32),
//! `log_softmax`'s fp32 input and output, and the entropy's `exp` and product.
//!
//! The backward visits the chunks last to first. Each recomputes `_chunk` keeping what `mm`
//! saves (the weight's matmul copy; the input's too when the head trains), then makes the
//! `nll_loss` and `log_softmax` gradients, the logits' gradient in their dtype, the input's
//! gradient cast back to the hidden state's dtype, and a trainable head's weight gradient
//! (the matmul's, then cast to the weight's dtype). `hidden[start:end]`'s backward returns
//! a zero tensor of the whole gathered size per chunk, which the autograd engine adds out of
//! place into the running sum, as it does the head's gradients; `hidden[order]`'s and the
//! shift's backwards then make the hidden state's gradient.
//!
//! `crates/moro-core/tests/step_trace.rs` holds this to TRL's code run on fake CUDA tensors
//! (`calibration/trl_trace.py`).

use super::super::Component;
use super::{Builder, Tensor};

/// Tokens per chunk (`_CHUNKED_LM_HEAD_CHUNK_SIZE`).
pub(crate) const CHUNK_TOKENS: u64 = 256;

/// The shapes and dtypes of one micro-batch's chunked loss.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkedNll {
    /// Rows of the micro-batch.
    pub(super) batch: u64,
    /// Tokens of the micro-batch, before the shift.
    pub(super) tokens: u64,
    pub(super) hidden: u64,
    pub(super) vocab: u64,
    /// Bytes per element of the final norm's output.
    pub(super) stream_bytes: u64,
    /// Bytes per element of `lm_head`'s weight.
    pub(super) weight_bytes: u64,
    /// Under autocast: `mm` casts both operands to 16 bits.
    pub(super) autocast: bool,
    /// The head trains (a full fine-tune): its weight gradient, and `mm` saves its input.
    pub(super) head_trains: bool,
    /// Gemma 2's final soft cap: `softcap * tanh(logits / softcap)` per chunk.
    pub(super) softcap: bool,
    /// Autocast caches the head's 16-bit copy (an fp32 leaf that trains): the forward's
    /// chunks reuse the cached one instead of casting.
    pub(super) weight_copy_cached: bool,
}

/// What a chunk's recompute keeps for its backward.
struct Recomputed<'m> {
    saved: Vec<Tensor<'m>>,
    log_probs: Tensor<'m>,
}

impl ChunkedNll {
    /// Shifted tokens: one position fewer per row.
    const fn shifted(&self) -> u64 {
        self.tokens - self.batch
    }

    /// The chunks' token counts in forward order (the last may be shorter).
    fn chunks(&self) -> Vec<u64> {
        let n = self.shifted();
        (0..n.div_ceil(CHUNK_TOKENS))
            .map(|i| CHUNK_TOKENS.min(n - i * CHUNK_TOKENS))
            .collect()
    }

    const fn logit_bytes(&self) -> u64 {
        if self.autocast { 2 } else { 4 }
    }

    /// The forward after the final norm: returns the gathered hidden states the chunks'
    /// checkpoints keep until the backward.
    pub(super) fn forward<'m>(&self, b: &mut Builder<'m>) -> Tensor<'m> {
        let (h, sb) = (self.hidden, self.stream_bytes);
        let n = self.shifted();
        let shifted =
            (self.batch > 1).then(|| b.alloc("shifted hidden", Component::LogitsLoss, n * h, sb));
        let gathered = b.alloc("gathered hidden", Component::LogitsLoss, n * h, sb);
        if let Some(s) = shifted {
            b.free(s);
        }
        for c in self.chunks() {
            let r = self.chunk(b, c, false);
            b.free_all(r.saved);
            b.free(r.log_probs);
        }
        gathered
    }

    /// One chunk's `_chunk`: the matmul's operands and logits, `log_softmax`, the entropy's
    /// temporaries. `keep`: the recompute, where `mm`'s saved operands stay.
    fn chunk<'m>(&self, b: &mut Builder<'m>, c: u64, keep: bool) -> Recomputed<'m> {
        let (h, v) = (self.hidden, self.vocab);
        let lb = self.logit_bytes();
        let up = |b: &mut Builder<'m>, name, bytes, from: u64| {
            (from != 4).then(|| b.alloc(name, Component::LogitsLoss, bytes, 4))
        };
        let h32 = up(b, "chunk hidden (fp32)", c * h, self.stream_bytes);
        let w32 = up(b, "lm_head (fp32)", v * h, self.weight_bytes);
        let (h16, w16) = if self.autocast {
            let h16 = b.alloc("chunk hidden (autocast)", Component::LogitsLoss, c * h, 2);
            let w16 = (keep || !self.weight_copy_cached)
                .then(|| b.alloc("lm_head (autocast)", Component::LogitsLoss, v * h, 2));
            (Some(h16), w16)
        } else {
            (None, None)
        };
        let mut logits = b.alloc("chunk logits", Component::LogitsLoss, c * v, lb);
        // Under autocast `mm` takes the 16-bit casts and the fp32 copies go; it saves the
        // weight operand (the input needs its gradient) and, when the head trains, the input.
        let (mm, upcasts) = if self.autocast {
            ([w16, h16], [w32, h32])
        } else {
            ([w32, h32], [None, None])
        };
        b.free_all(upcasts.into_iter().flatten().collect());
        let mut saved = Vec::new();
        for (x, kept) in mm.into_iter().zip([keep, keep && self.head_trains]) {
            match x {
                Some(x) if kept => saved.push(x),
                Some(x) => b.free(x),
                None => {}
            }
        }
        if self.softcap {
            // `tanh` saves its output; the division and the scaling save nothing.
            let scaled = b.alloc("softcap input", Component::LogitsLoss, c * v, lb);
            let tanh = b.alloc("softcap tanh", Component::LogitsLoss, c * v, lb);
            b.free(scaled);
            let capped = b.alloc("capped logits", Component::LogitsLoss, c * v, lb);
            if keep {
                saved.push(tanh);
            } else {
                b.free(tanh);
            }
            b.free(logits);
            logits = capped;
        }
        let upcast =
            (lb != 4).then(|| b.alloc("log_softmax input", Component::LogitsLoss, c * v, 4));
        let log_probs = b.alloc("chunk log_softmax", Component::LogitsLoss, c * v, 4);
        if let Some(x) = upcast {
            b.free(x);
        }
        let exp = b.alloc("entropy exp", Component::LogitsLoss, c * v, 4);
        let product = b.alloc("entropy product", Component::LogitsLoss, c * v, 4);
        b.free(product);
        b.free(exp);
        b.free(logits);
        Recomputed { saved, log_probs }
    }

    /// The loss's backward, chunks last to first, then the gather's and the shift's:
    /// returns the hidden state's gradient. A head that trains gets its gradient summed
    /// into `head_grad` (empty: the sum becomes it).
    pub(super) fn backward<'m>(
        &self,
        b: &mut Builder<'m>,
        gathered: Tensor<'m>,
        head_grad: &mut Option<Tensor<'m>>,
        grad_bytes: u64,
    ) -> Tensor<'m> {
        let (h, v, sb) = (self.hidden, self.vocab, self.stream_bytes);
        let lb = self.logit_bytes();
        let n = self.shifted();
        let mut sum: Option<Tensor<'m>> = None;
        let mut weight_sum: Option<Tensor<'m>> = None;
        for c in self.chunks().into_iter().rev() {
            let r = self.chunk(b, c, true);
            let nll = b.alloc("nll_loss grad", Component::LogitsLoss, c * v, 4);
            let dls = b.alloc("log_softmax grad", Component::LogitsLoss, c * v, 4);
            b.free(r.log_probs);
            b.free(nll);
            let mut dlogits = if lb == 4 {
                dls
            } else {
                let d = b.alloc("chunk logits grad", Component::LogitsLoss, c * v, lb);
                b.free(dls);
                d
            };
            if self.softcap {
                // The scaling's, `tanh`'s and the division's backwards.
                for _ in 0..3 {
                    let d = b.alloc("softcap grad", Component::LogitsLoss, c * v, lb);
                    b.free(dlogits);
                    dlogits = d;
                }
            }
            let dw = self
                .head_trains
                .then(|| b.alloc("lm_head grad (matmul)", Component::Transients, v * h, lb));
            let dh = b.alloc("chunk hidden grad", Component::Transients, c * h, lb);
            b.free_all(r.saved);
            b.free(dlogits);
            if let Some(dw) = dw {
                let dw = via_fp32(b, dw, grad_bytes, "lm_head grad", Component::Gradients);
                weight_sum = Some(add_out_of_place(b, weight_sum, dw, "lm_head grad (sum)"));
            }
            let dh = via_fp32(b, dh, sb, "chunk hidden grad", Component::Transients);
            let whole = b.alloc("gathered hidden grad", Component::Transients, n * h, sb);
            b.free(dh);
            sum = Some(add_out_of_place(
                b,
                sum,
                whole,
                "gathered hidden grad (sum)",
            ));
        }
        if let Some(w) = weight_sum {
            match head_grad {
                None => *head_grad = Some(w),
                // A later micro-batch: AccumulateGrad adds it into `.grad` in place.
                Some(_) => b.free(w),
            }
        }
        b.free(gathered);
        // `hidden[order]`'s backward: zeros, then `index_put` out of place.
        let zeros = b.alloc("gather grad (zeros)", Component::Transients, n * h, sb);
        let scattered = b.alloc("gather grad", Component::Transients, n * h, sb);
        b.free(zeros);
        if let Some(s) = sum {
            b.free(s);
        }
        // The shift's slice backward (and the reshape's copy) at the whole length.
        let unshifted = b.alloc("shift grad", Component::Transients, self.tokens * h, sb);
        b.free(scattered);
        let dhidden = b.alloc("hidden grad", Component::Transients, self.tokens * h, sb);
        b.free(unshifted);
        dhidden
    }
}

/// The backward of a cast to fp32 and on to `t`'s dtype (`ToCopyBackward` twice): a new
/// tensor wherever the dtype changes, in `bytes` per element at the end.
fn via_fp32<'m>(
    b: &mut Builder<'m>,
    mut t: Tensor<'m>,
    bytes: u64,
    name: &'static str,
    component: Component,
) -> Tensor<'m> {
    let numel = t.bytes / u64::from(t.dtype_bytes);
    for to in [4, bytes] {
        if u64::from(t.dtype_bytes) != to {
            let cast = b.alloc(name, component, numel, to);
            b.free(t);
            t = cast;
        }
    }
    t
}

/// The autograd engine's input buffer: the first gradient is kept, each later one summed
/// into a new tensor (`input_buffer.cpp` `accumulate` does not add in place into a tensor
/// the sum did not make).
fn add_out_of_place<'m>(
    b: &mut Builder<'m>,
    sum: Option<Tensor<'m>>,
    new: Tensor<'m>,
    name: &'static str,
) -> Tensor<'m> {
    match sum {
        None => new,
        Some(old) => {
            let dtype = u64::from(new.dtype_bytes);
            let s = b.alloc(name, new.component, new.bytes / dtype, dtype);
            b.free(old);
            b.free(new);
            s
        }
    }
}
