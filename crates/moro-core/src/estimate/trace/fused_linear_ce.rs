//! Liger's fused linear cross-entropy, tensor by tensor: what `use_liger_kernel=True` puts in
//! place of lm_head and transformers' loss (liger-kernel 0.8.5,
//! `transformers/model/loss_utils.py` `LigerForCausalLMLoss` and
//! `ops/fused_linear_cross_entropy.py` `fused_linear_cross_entropy_forward`).
//!
//! The labels are padded by one position to shift them. The forward then makes the input's
//! gradient (`zeros_like` of the final norm's output) and, where lm_head trains, its weight's
//! (`zeros_like(weight)`, which becomes its `.grad`), the per-token losses (fp32) and the
//! mask of counted tokens, and runs the tokens in chunks (`chunk_size`: the power of two at
//! or above `⌈tokens / ⌈V / h⌉⌉`): each chunk's logits, their gradient written in place by
//! the cross-entropy kernel, the input's gradient and the weight's accumulated. Where `mm`
//! can write into a buffer (`_can_use_mm_out`: the input and weight of one dtype, under
//! autocast only the autocast dtype), one chunk-sized logits buffer serves every chunk;
//! otherwise (an fp32 stream and lm_head under bf16 autocast: classic QLoRA) every chunk's
//! `mm`s cast their operands, the whole weight to 16 bits twice a chunk. The backward
//! returns the input's gradient the forward made (the loss's own gradient is 1: no rescale).
//!
//! `crates/moro-core/tests/step_trace.rs` holds this to Liger's own Python run on fake CUDA
//! tensors (`calibration/liger_fake.py`).

use super::super::Component;
use super::{Builder, Tensor};

/// The shapes and dtypes of one micro-batch's fused loss.
#[derive(Debug, Clone, Copy)]
pub(super) struct FusedLinearCe {
    /// Rows of the micro-batch.
    pub(super) batch: u64,
    /// Tokens of the micro-batch.
    pub(super) tokens: u64,
    pub(super) hidden: u64,
    pub(super) vocab: u64,
    /// Bytes per element of the final norm's output.
    pub(super) input_bytes: u64,
    /// Bytes per element of lm_head's weight.
    pub(super) weight_bytes: u64,
    /// The forward runs under 16-bit autocast.
    pub(super) autocast: bool,
}

impl FusedLinearCe {
    /// Whether Liger's loss is traced here for a job whose input and weight have these
    /// dtypes; a trainable head whose `mm` cannot write into a buffer (fp32 master weights
    /// under autocast) is not.
    pub(super) const fn models(&self, head_trains: bool) -> bool {
        self.writes_into_buffer() || !head_trains
    }

    /// `_can_use_mm_out`: one dtype, and under autocast the autocast dtype.
    const fn writes_into_buffer(&self) -> bool {
        self.input_bytes == self.weight_bytes && (!self.autocast || self.input_bytes == 2)
    }

    /// Tokens per chunk: `next_power_of_2(⌈tokens / ⌈V / h⌉⌉)`, at most the tokens.
    fn chunk_tokens(&self) -> u64 {
        let factor = self.vocab.div_ceil(self.hidden.max(1)).max(1);
        self.tokens
            .div_ceil(factor)
            .next_power_of_two()
            .min(self.tokens)
            .max(1)
    }

    /// The forward on the final norm's output: returns the input's gradient, which the
    /// backward hands to the final norm. `head_grads` makes lm_head's gradient (its
    /// `zeros_like`, right after the input's).
    pub(super) fn forward<'m>(
        &self,
        b: &mut Builder<'m>,
        head_grads: impl FnOnce(&mut Builder<'m>),
    ) -> Tensor<'m> {
        let (t, h, v) = (self.tokens, self.hidden, self.vocab);
        let c = Component::LogitsLoss;
        // `F.pad(labels, (0, 1))`, and with several rows `labels[..., 1:].contiguous()`.
        let padded = b.alloc("padded labels", c, t + self.batch, 8);
        let shifted = (self.batch > 1).then(|| b.alloc("shifted labels", c, t, 8));
        let grad_input = b.alloc("FLCE grad_input", c, t * h, self.input_bytes);
        head_grads(b);
        let losses = b.alloc("FLCE losses", c, t, 4);
        let mask = b.alloc("FLCE target mask", c, t, 1);
        b.transient("FLCE token count", None, 8);
        let chunk = self.chunk_tokens();
        if self.writes_into_buffer() {
            b.transient("FLCE chunk logits", None, chunk * v * self.input_bytes);
        } else {
            let mut start = 0;
            while start < t {
                let rows = chunk.min(t - start);
                self.autocast_chunk(b, rows);
                start += rows;
            }
        }
        b.free(mask);
        b.free(losses);
        if let Some(s) = shifted {
            b.free(s);
        }
        b.free(padded);
        grad_input
    }

    /// One chunk where `mm` makes new tensors under autocast: the logits from the 16-bit
    /// casts of the weight and the chunk, then the input's gradient from the logits'
    /// gradient (in the logits' buffer) and the weight cast again, copied into
    /// `grad_input`.
    fn autocast_chunk<'m>(&self, b: &mut Builder<'m>, rows: u64) {
        let (h, v) = (self.hidden, self.vocab);
        let c = Component::LogitsLoss;
        let weight_cast = |b: &mut Builder<'m>| {
            (self.weight_bytes != 2).then(|| b.alloc("lm_head (autocast)", c, v * h, 2))
        };
        let w16 = weight_cast(b);
        let x16 =
            (self.input_bytes != 2).then(|| b.alloc("chunk input (autocast)", c, rows * h, 2));
        let logits = b.alloc("FLCE chunk logits", c, rows * v, 2);
        b.free_made(&[x16, w16]);
        let w16 = weight_cast(b);
        let grad = b.alloc("FLCE chunk input grad", c, rows * h, 2);
        b.free_made(&[w16]);
        b.free(grad);
        b.free(logits);
    }
}
