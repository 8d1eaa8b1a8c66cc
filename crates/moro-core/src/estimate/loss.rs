//! Logits and loss buffers (memory-anatomy §3).

use crate::job::{Job, LossImpl, Method, Padding};
use crate::model::ModelSpec;
use crate::stack::{CompileScope, LossCode};

use super::Regime;

/// TRL's chunk of tokens for `chunked_nll` (`_CHUNKED_LM_HEAD_CHUNK_SIZE = 256`).
pub const TRL_CHUNK: u64 = 256;
/// litgpt's `lm_head_chunk_size=128` in its fine-tuning scripts.
pub const LITGPT_CHUNK: u64 = 128;

/// Loss-side bytes at each moment of a step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Loss {
    /// Held at the end of the forward pass.
    pub forward_peak: u64,
    /// Short-lived in the forward pass (per-chunk buffers).
    pub forward_transient: u64,
    /// Held at the backward of the loss.
    pub backward_peak: u64,
    /// Short-lived in the loss backward.
    pub backward_transient: u64,
    /// Still held while the last decoder layer runs its backward.
    pub after_backward: u64,
    /// The largest single buffer the loss allocates and frees every step (the fp32 logits,
    /// or one chunk's): the caching allocator's reserve keeps a block of this size
    /// ([`super::allocated_and_reserve`]).
    pub largest_block: u64,
    /// Zero gradients autograd materializes, at the start of a compiled backward, for the
    /// graph's outputs the loss does not reach: the key/value cache ([`compiled_tangents`]).
    /// Each layer's are freed as its backward runs.
    pub output_tangents: u64,
    /// The logits' gradient a compiled backward keeps to its end when lm_head's weight is a
    /// tied embedding: Inductor adds lm_head's weight gradient to the lookup's in one
    /// `addmm(embedding_grad, grad_logitsᵀ, x)` after the last layer (torch 2.15, the
    /// traced backward of a tied Llama).
    pub held_for_tied_grad: u64,
    /// The chunks' logit gradients still waiting when lm_head's backward starts: with the
    /// output projected chunk by chunk before any loss runs (torchtune's
    /// `chunked_output`), every chunk's loss node is newer than every projection, and the
    /// autograd engine runs the newest ready node first (`ReadyQueue`, by sequence number),
    /// so all the losses' backward runs before the first projection's.
    pub held_at_head_backward: u64,
}

impl Loss {
    /// An encoder's sequence-classification loss over `logits` = b · `num_labels` elements
    /// (`BertForSequenceClassification`: `CrossEntropyLoss()(logits.view(-1, num_labels),
    /// labels.view(-1))`, no vocabulary): the classifier's logits (2 B under autocast, else
    /// the stream dtype), `log_softmax`'s saved fp32 output (autocast runs it in fp32), and
    /// in backward the nll and log_softmax gradients. Bytes per sequence, not per token.
    fn classification(logits: u64, r: &Regime) -> Self {
        let o = if r.autocast { 2 } else { r.stream_bytes };
        Self {
            forward_peak: logits * (o + 4),
            forward_transient: 0,
            backward_peak: logits * 12,
            backward_transient: 0,
            after_backward: 0,
            largest_block: logits * 4,
            output_tangents: 0,
            held_for_tied_grad: 0,
            held_at_head_backward: 0,
        }
    }

    /// transformers' `ForCausalLMLoss` inside a graph `torch.compile` partitions and Inductor
    /// generates (torch 2.15; traced on CPU with Inductor's own code generation,
    /// docs/torch-compile.md "Loss head"): the `.float()` upcast, `log_softmax` and the
    /// one-hot `nll_loss_backward` (Inductor's `optimize_scatter_upon_const_tensor`) fuse into
    /// reductions and one pointwise kernel, so no fp32 logits exist. The forward keeps the
    /// 16-bit logits, the graph's output and saved for backward. The backward adds the zero
    /// gradient autograd materializes for that output (`CompiledFunction` is an
    /// `autograd.Function` with `materialize_grads`) and the 16-bit logits gradient: three
    /// logits-sized tensors. A Gemma 2 final softcap leaves the pre-cap `mm` output as a
    /// forward transient.
    fn compiled(model: &ModelSpec, job: &Job, r: &Regime, tv: u64) -> Self {
        let logits = tv * if r.autocast { 2 } else { r.compute_bytes };
        let tied = job.method == Method::Full && model.tie_word_embeddings;
        Self {
            forward_peak: logits,
            forward_transient: if model.logit_softcapping { logits } else { 0 },
            backward_peak: 3 * logits,
            backward_transient: 0,
            after_backward: 0,
            largest_block: logits,
            output_tangents: compiled_tangents(model, job, r),
            held_for_tied_grad: if tied { logits } else { 0 },
            held_at_head_backward: 0,
        }
    }

    /// An encoder-decoder's loss over its target tokens (transformers 5.25
    /// `T5ForConditionalGeneration.forward`, `BartForConditionalGeneration.forward`:
    /// `CrossEntropyLoss()` on `lm_head`'s logits as they come, no upcast). Without autocast
    /// `log_softmax` runs and saves in the logits' dtype: the logits and the
    /// log-probabilities after the forward, the log-probabilities and the two gradients at
    /// the backward. Under autocast `cross_entropy` decomposes: `log_softmax` runs in the
    /// logits' 16-bit dtype and saves its output, `nll_loss` (autocast's fp32 list) saves an
    /// fp32 copy of it; the 16-bit logits are alive to the forward's end, and the peak is
    /// `nll_loss_backward`'s fp32 gradient beside both (traced on T5 and BART: the peak op
    /// of their bf16-mixed steps, with the 16-bit log-probabilities and the fp32 copy
    /// alive). Nothing of it outlives lm_head's backward, which runs before any block's
    /// (traced under checkpointing: the peak is in an encoder block's backward, with none
    /// of it).
    fn seq2seq(job: &Job, r: &Regime, v: u64) -> Self {
        let tv = job.micro_batch_size * job.target_tokens() * v;
        if r.autocast {
            Self {
                forward_peak: 8 * tv,
                forward_transient: 0,
                backward_peak: 10 * tv,
                backward_transient: 0,
                after_backward: 0,
                largest_block: 4 * tv,
                ..Self::default()
            }
        } else {
            let e = r.compute_bytes;
            Self {
                forward_peak: 2 * e * tv,
                forward_transient: 0,
                backward_peak: 3 * e * tv,
                backward_transient: 0,
                after_backward: 0,
                largest_block: e * tv,
                ..Self::default()
            }
        }
    }

    /// Loss buffers of `job` on `model` (vocabulary split over `tp` GPUs).
    #[must_use]
    pub fn new(model: &ModelSpec, job: &Job, r: &Regime, tp: u64) -> Self {
        if let Some(enc) = &model.encoder {
            return Self::classification(job.micro_batch_size * enc.num_labels, r);
        }
        if model.seq2seq.is_some() {
            return Self::seq2seq(job, r, model.vocab_size / tp.max(1));
        }
        let t = job.micro_batch_size * job.seq_len;
        let v = model.vocab_size / tp.max(1);
        let h = model.hidden_size;
        let tv = t * v;
        let s = r.stream_bytes;
        // Gemma 2's `final_logit_softcapping` (`Gemma2ForCausalLM.forward`: `logits / cap`,
        // `torch.tanh`, `* cap`): tanh saves its output for backward, one more tensor in the
        // logits' dtype (bf16 under autocast) alive from the forward to the loss backward.
        // The oracle shows it live at the peak (`tanh.default bfloat16 (1, 2048, 256000)`).
        let softcap = if model.logit_softcapping {
            tv * if r.autocast { 2 } else { r.compute_bytes }
        } else {
            0
        };
        let torchtune = job.stack.profile().loss_code == LossCode::Torchtune;
        let unsloth = job.stack.profile().loss_code == LossCode::Unsloth;
        if job.compile && job.stack.profile().compile == CompileScope::Model {
            return Self::compiled(model, job, r, tv);
        }
        let shifted_copy = job.versions.torchtune_shifted_logits_copy();
        match r.loss {
            // transformers `ForCausalLMLoss`: `logits.float()` then `F.cross_entropy`
            // (log_softmax saves its fp32 output). Forward: bf16 logits (2) + fp32 copy (4)
            // + log-probs (4) = 10 B per logit; accelerate's `convert_to_fp32` then makes
            // another fp32 copy of the outputs under AMP. Backward: log-probs (4) + the
            // dense nll grad (4) + log_softmax grad (4) = 12 B (memory-anatomy §3.3; the
            // oracle measures 12·T·ΔV between vocabularies).
            // torchtune 0.1: `TransformerDecoder.forward` returns `self.output(h).float()`;
            // the recipe keeps `logits = logits[..., :-1, :].contiguous().transpose(1, 2)`
            // alive through backward: shifted fp32 logits (4) + log-probs (4) in forward,
            // plus the nll and log_softmax gradients (4 + 4) in backward.
            //
            // torchtune ≥ 0.3 shifts the labels, not the logits, and `del logits` after the
            // loss: fp32 logits (4) + log-probs (4) in forward, the log-probs and the two
            // gradients (4 + 4 + 4) in backward. With `compile_loss` (0.3) the compiled
            // `CrossEntropyLoss` saves its fp32 input and one fp32 max and log-sum per row,
            // and its backward makes the logits' fp32 gradient in one kernel: 4 after the
            // forward (the model's bf16 output lives next to its fp32 cast for a moment), 8
            // at the backward (traced, `compile-torchtune.jsonl` case `loss`, chunks 0). Only
            // the LoRA recipes keep it: `full_finetune_single_device.py` (0.3–0.6) calls
            // `training.compile_loss(self._loss_fn)` without taking the compiled module it
            // returns, so a full fine-tune's standard loss runs eagerly (the chunked loss is
            // compiled in place either way).
            LossImpl::Standard if torchtune && shifted_copy => Self {
                forward_peak: 8 * tv,
                forward_transient: 0,
                backward_peak: 16 * tv,
                backward_transient: 0,
                after_backward: 4 * tv,
                largest_block: 4 * tv,
                ..Self::default()
            },
            LossImpl::Standard if torchtune && job.compile && job.method.is_peft() => Self {
                forward_peak: 4 * tv,
                forward_transient: 2 * tv,
                backward_peak: 8 * tv,
                backward_transient: 0,
                after_backward: 2 * tv,
                largest_block: 4 * tv,
                ..Self::default()
            },
            LossImpl::Standard if torchtune => Self {
                forward_peak: 8 * tv,
                forward_transient: 0,
                backward_peak: 12 * tv,
                backward_transient: 0,
                after_backward: 2 * tv,
                largest_block: 4 * tv,
                ..Self::default()
            },
            // No upcast and no autocast: logits (2) + shifted copy (2) + log-probs (2) in
            // forward; log-probs + nll grad + log_softmax grad (2 + 2 + 2) in backward. Under
            // autocast `log_softmax` runs in fp32 and the standard figures apply.
            LossImpl::StandardNoUpcast if !r.autocast => {
                let e = r.compute_bytes;
                Self {
                    forward_peak: 3 * e * tv + softcap,
                    forward_transient: 0,
                    backward_peak: 3 * e * tv + softcap,
                    backward_transient: 0,
                    after_backward: e * tv,
                    largest_block: e * tv,
                    ..Self::default()
                }
            }
            // Unsloth's full-logits path (`UNSLOTH_RETURN_LOGITS=1`; every release before
            // 2024-11): lm_head's 16-bit logits and `Fast_CrossEntropyLoss`, which saves them
            // with an fp32 log-sum-exp per row and per 65,536-wide vocabulary chunk
            // (`MAX_FUSED_SIZE`) and writes the gradient into the logits' own buffer
            // (unsloth 2026.8.19 `kernels/cross_entropy_loss.py`).
            LossImpl::Standard if unsloth => {
                let e = if r.autocast { 2 } else { r.compute_bytes };
                let lse = 4 * t * v.div_ceil(65_536);
                Self {
                    forward_peak: e * tv + lse,
                    forward_transient: 0,
                    backward_peak: e * tv + lse,
                    backward_transient: 0,
                    after_backward: 0,
                    largest_block: e * tv,
                    ..Self::default()
                }
            }
            // transformers `ForCausalLMLoss`: the logits, their fp32 upcast and the saved
            // log-probabilities at the end of the forward; the nll and log_softmax
            // gradients at its backward. Nothing is held once lm_head's backward has run:
            // the Trainer's `compute_loss` returns the loss alone, so the output (and its
            // logits) is dropped before `backward()` (every trace frees the logits'
            // gradient after lm_head's backward, `step-events*.jsonl`).
            LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast => {
                let mut fwd = if r.compute_bytes == 4 && !r.autocast {
                    8
                } else {
                    10
                };
                if r.loss == LossImpl::StandardLegacy {
                    // `shift_logits = logits[..., :-1, :].contiguous()` on the fp32 copy.
                    fwd += 4;
                }
                Self {
                    forward_peak: fwd * tv + softcap,
                    forward_transient: 0,
                    backward_peak: 12 * tv + softcap,
                    backward_transient: 0,
                    after_backward: 0,
                    largest_block: 4 * tv,
                    ..Self::default()
                }
            }
            // TRL ≥ 1.7 `chunked_nll`: no logits tensor; the shifted and gathered hidden
            // states (two T·h copies) are saved; each 256-token chunk runs under
            // checkpoint with `h.float() @ w.float().t()`: ~4 fp32 chunk×V buffers plus an
            // fp32 copy of lm_head (and its bf16 autocast re-cast). [DERIVED, §3.4]
            LossImpl::ChunkedNll => {
                let block = TRL_CHUNK.min(t) * v * 4;
                let chunk = block * 4;
                let w = v * h * if r.autocast { 6 } else { 4 };
                Self {
                    forward_peak: 2 * t * h * s,
                    forward_transient: chunk + w,
                    backward_peak: 2 * t * h * s,
                    backward_transient: chunk + w + t * h * s,
                    after_backward: t * h * s,
                    largest_block: block.max(v * h * 4),
                    ..Self::default()
                }
            }
            // litgpt: the chunked lm_head returns a list of bf16 logit chunks kept alive by
            // the training loop, and `chunked_cross_entropy` runs per chunk in the logits'
            // dtype (bf16 log-probs saved). torchtune's `CEWithChunkedOutputLoss` upcasts each
            // chunk (`logits.float()`), so its saved log-probs are fp32.
            // torchtune `CEWithChunkedOutputLoss` (8 chunks): each bf16 chunk is upcast
            // (`logits.float()`) and its fp32 log-probs saved (4 B/logit); the recipe
            // `del logits` frees the bf16 list before backward.
            // Compiled (`compile_loss` compiles `compute_cross_entropy` only): each chunk's
            // graph saves its bf16 logits and one fp32 max and log-sum per row (traced,
            // `compile-torchtune.jsonl` case `loss`); the upcast and the log-softmax never
            // exist, and the backward makes each chunk's bf16 gradient in one kernel.
            LossImpl::Chunked if torchtune && job.compile => {
                let chunk = t.div_ceil(8) * v;
                Self {
                    forward_peak: 2 * tv,
                    forward_transient: 0,
                    backward_peak: 2 * tv,
                    backward_transient: 2 * chunk,
                    after_backward: 0,
                    largest_block: 2 * chunk,
                    held_at_head_backward: 2 * tv,
                    ..Self::default()
                }
            }
            LossImpl::Chunked if torchtune => {
                let chunk = t.div_ceil(8) * v;
                Self {
                    forward_peak: 6 * tv,
                    forward_transient: 4 * chunk,
                    backward_peak: 4 * tv,
                    backward_transient: 10 * chunk,
                    after_backward: 2 * tv,
                    largest_block: 4 * chunk,
                    held_at_head_backward: 2 * tv,
                    ..Self::default()
                }
            }
            // litgpt: `lm_head_chunk_size=128` returns a list of bf16 chunks, which Fabric's
            // `_FabricModule.forward` → `convert_output` casts to the default dtype, fp32
            // (lightning/fabric/wrappers.py). `chunked_cross_entropy` then saves fp32
            // log-probs per chunk: 8 B per logit held through backward. The loop variable
            // `logits` still holds the previous micro-batch's fp32 list while the next
            // forward builds its own: 4 (previous) + 2 (bf16) + 4 (fp32) at the end of the
            // forward; when the longest batch comes first, no earlier list of its size is
            // held (traced: `calibration/litgpt_trace.py --longest-first`). Backward per
            // chunk: fp32 nll grad, fp32 log_softmax grad, bf16 cast.
            LossImpl::Chunked => {
                let chunk = (LITGPT_CHUNK * job.micro_batch_size).min(t) * v;
                let previous = if job.padding == Padding::LongestFirst {
                    0
                } else {
                    4 * tv
                };
                Self {
                    forward_peak: 6 * tv + previous,
                    forward_transient: 0,
                    backward_peak: 8 * tv,
                    backward_transient: 10 * chunk,
                    after_backward: 4 * tv,
                    largest_block: 4 * chunk,
                    ..Self::default()
                }
            }
            // Unsloth's `unsloth_fused_ce_loss` (unsloth_zoo 2026.8.13
            // `fused_losses/cross_entropy_loss.py`): per chunk, `grad_and_value` of lm_head,
            // the fp32 upcast and the cross-entropy, compiled (`accumulate_chunk`), so the
            // chunk's 16-bit logits and their 16-bit gradient are its transient (as Inductor
            // generates the compiled HF loss, docs/torch-compile.md); kept for backward only
            // `grad_inputs` (T·h) and a trainable lm_head's gradient. One chunk while its
            // fp32 logits fit the 4 GiB target (`get_chunk_size`, the target is also capped
            // at half the free memory), else a multiple of four.
            LossImpl::Fused if unsloth => {
                let grad_w = if job.method == Method::Full {
                    v * h * r.param_bytes
                } else {
                    0
                };
                let chunk = t.div_ceil(unsloth_ce_chunks(t, v)) * v;
                Self {
                    forward_peak: t * h * s + grad_w,
                    forward_transient: 4 * chunk,
                    backward_peak: t * h * s + grad_w,
                    backward_transient: 0,
                    after_backward: t * h * s,
                    largest_block: 2 * chunk,
                    ..Self::default()
                }
            }
            // Liger fused linear cross-entropy: gradients computed in forward; grad_input
            // (T·h) and, when lm_head trains, grad_weight (V·h) stay alive; chunk logits of
            // `next_power_of_2(T / ceil(V/h))` rows (§3.5).
            LossImpl::Fused => {
                let grad_w = if job.method == Method::Full {
                    v * h * r.param_bytes
                } else {
                    0
                };
                let inc = v.div_ceil(h.max(1)).max(1);
                let chunk_rows = t.div_ceil(inc).next_power_of_two();
                let chunk = chunk_rows * v * 4 * 2;
                Self {
                    forward_peak: t * h * 2 + grad_w,
                    forward_transient: chunk,
                    backward_peak: t * h * 2 + grad_w,
                    backward_transient: 0,
                    after_backward: t * h * 2,
                    largest_block: chunk / 2,
                    ..Self::default()
                }
            }
        }
    }
}

/// Chunks of Unsloth's fused cross-entropy over `t` tokens and `v` logits each: one while
/// the fp32 logits fit 4 GiB, else the ratio rounded up to a multiple of four
/// (unsloth_zoo 2026.8.13 `get_chunk_size`).
fn unsloth_ce_chunks(t: u64, v: u64) -> u64 {
    let target = 4 << 30;
    let bytes = t * v * 4;
    if bytes <= target {
        1
    } else {
        bytes.div_ceil(target).div_ceil(4) * 4
    }
}

/// The key/value cache's zero gradients in a compiled step without checkpointing: a
/// transformers model keeps `use_cache` from its config while training unless checkpointing
/// turns it off, so each layer's keys and values are outputs of the compiled graph, and the
/// backward receives a materialized zero gradient for each (traced: `aten.zeros` of every
/// layer's key and value shape when the compiled backward starts). A sliding-window layer's
/// cache keeps the window's last tokens (`DynamicSlidingWindowLayer`).
#[must_use]
pub fn compiled_tangents(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    if !job.compile || job.gradient_checkpointing {
        return 0;
    }
    let e = if r.autocast { 2 } else { r.compute_bytes };
    let kv = model.kv_width();
    model
        .layers
        .iter()
        .map(|g| {
            let tokens = g.attention.cached_tokens(job.seq_len);
            g.count * 2 * kv * tokens * e
        })
        .sum::<u64>()
        * job.micro_batch_size
}
