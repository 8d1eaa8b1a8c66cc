//! Saved activations of a decoder layer, built op by op from PyTorch's autograd rules.
//!
//! The rule behind every term (memory-anatomy, preamble): an op saves an input only when
//! the *other* input needs a gradient (`gen_variable_type.py` `guard_for`). A frozen weight
//! therefore does not make `linear` save its input; a trainable one, or a LoRA adapter
//! reading the same input, does. The terms per token and layer:
//!
//! - **norms** (§5): RMSNorm's `pow` saves the fp32 copy of its input (4h; in an fp32
//!   stream the input itself); `weight * normed` saves `normed` only when the norm weight is
//!   trainable. LayerNorm saves its input.
//! - **linear inputs**: a trainable weight saves the input once per input group (q/k/v share
//!   one); under autocast an fp32 input is cast per Linear into an *uncached* bf16 copy
//!   (autocast caches only leaf tensors that require grad: `autocast_mode.cpp`
//!   `cached_cast`). LoRA adapters (§2.3): plain `lora.Linear` casts x to the adapter dtype
//!   (`_cast_input_dtype`), so fp32 adapters under autocast each save a private bf16 copy;
//!   the bnb layer casts only without autocast; `lora_A`'s output (r per adapter) is saved by
//!   `lora_B`; dropout saves a bool mask and gives each adapter a private copy.
//! - **attention** (§5, §8): flash / SDPA save q, k, v, out and an fp32 log-sum-exp (4a);
//!   with a padding mask SDPA expands GQA heads (`repeat_kv`) and the mem-efficient kernel
//!   keeps an additive bias of 2·s per token; eager saves fp32 and bf16 probabilities,
//!   `a·s·(4 + 2)` per token.
//! - **MLP** (§5): SiLU saves its input g, `silu(g)*u` saves silu(g) and u (3 · I);
//!   a 2-matrix MLP saves the activation's input (I).
//!
//! The fake-CUDA oracle (`calibration/README.md`) matches the full-FT bf16 sum of these
//! terms to the byte: `16h + 4ad + 4kd + 4a + 8I` per token per layer.

use crate::job::{Attention, Job, Method, Padding, PeftKind, Quantization};
use crate::model::{
    AttentionKind, EncoderSpec, ExpertGate, LayerGroup, Linear, LinearRole, ModelSpec, NormKind,
};
use crate::stack::{AttentionModule, CompileScope};

use super::Regime;
use super::boft::Boft;
use super::weights::{ADAPTER_PROMPT_LENGTH, ADAPTER_START_LAYER};

mod bart;
mod compiled;
mod cross;
mod gated_delta;
mod gemma3n;
mod mamba;
pub mod seq2seq;
mod unsloth;

/// Activation bytes for one GPU's micro-batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Activations {
    /// Saved bytes of every layer (checkpoints only, under gradient checkpointing).
    all: u64,
    /// Saved bytes of the largest single layer (recomputed under checkpointing).
    pub one_layer: u64,
    /// One layer's checkpoint (its input hidden state).
    pub checkpoint_one: u64,
    /// Final norm, lm_head inputs and cast weight copies saved for backward.
    pub head: u64,
    /// Autocast's cached bf16 copies of fp32 trainable weights, alive from forward into
    /// backward (`cached_cast`; memory-anatomy §6 "Autocast weight cache").
    pub autocast_weight_cache: u64,
    /// The part of [`Self::autocast_weight_cache`] still alive while a layer runs its
    /// backward. Without checkpointing every copy is saved by its `mm`, so all of it. Under
    /// (reentrant) checkpointing the forward runs under `no_grad`: nothing saves the copies,
    /// and the cache, filled anyway (`cached_cast` tests only `requires_grad` and
    /// `is_leaf`), is cleared when the outermost autocast exits, after the loss and before
    /// `backward()` (HF Trainer `training_step`: `with autocast(): loss = compute_loss(...)`,
    /// then `scaler.scale(loss).backward()`). The recompute re-enters autocast per layer
    /// (`CheckpointFunction.backward`), so only the recomputed layer's copies exist.
    pub autocast_weight_cache_backward: u64,
    /// Transient buffers of one layer's backward: FlashAttention's `dq_accum` (fp32),
    /// `softmax_d`, dq/dk/dv and GQA-expanded dk/dv (`flash_api.cpp` `mha_bwd`), or the MLP's
    /// gradient intermediates, whichever is larger, plus the residual gradient.
    /// [DERIVED, memory-anatomy §4]
    pub layer_backward_transient: u64,
    /// Inputs of bitsandbytes 4-bit Linears (< 0.43.2) that the *previous* step still holds
    /// while this step's forward runs. `MatMul4Bit.forward` keeps its input as a plain
    /// `ctx.tensors = (A, B)` attribute rather than through `save_for_backward`
    /// (bitsandbytes/autograd/_functions.py before 9e753741), so autograd never releases it
    /// during backward: it lives as long as the graph does. litgpt's loop variable `loss`
    /// (`finetune/lora.py`: `loss = chunked_cross_entropy(...)`, `fabric.backward(loss / …)`)
    /// keeps that graph until the next step rebinds it after its forward and loss.
    pub previous_step_quantized_inputs: u64,
}

/// Layer checkpoints on the GPU when `job` offloads them ([`Job::activation_offload`]), or
/// `None` when every checkpoint stays ([`crate::stack::ActivationOffload::applies`]).
fn checkpoints_on_gpu(model: &ModelSpec, job: &Job) -> Option<u64> {
    if !(job.activation_offload && job.gradient_checkpointing) {
        return None;
    }
    let how = job.stack.profile().activation_offload?;
    let tokens = job.micro_batch_size * job.seq_len;
    how.applies(job.seq_len, tokens, model.hidden_size)
        .then(|| model.num_layers.min(how.checkpoints_on_gpu()))
}

/// Bytes of layer checkpoints `job` offloads to pinned host memory
/// ([`Job::activation_offload`]): every layer's input but those on the GPU at once.
#[must_use]
pub fn offloaded_checkpoints(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    checkpoints_on_gpu(model, job).map_or(0, |on_gpu| {
        (model.num_layers - on_gpu)
            * r.stream_bytes
            * model.hidden_size
            * job.micro_batch_size
            * job.seq_len
    })
}

/// Bytes per element of an encoder's eager attention probabilities: autocast runs `softmax`
/// in fp32; otherwise the scores take the dtype of the extended attention mask they are added
/// to (the model's, `get_extended_attention_mask`), at least the 16-bit `attn_b`
/// ([`Ctx::encoder_layer_bytes`]).
pub(super) const fn eager_probs_bytes(r: &Regime, attn_b: u64) -> u64 {
    if r.autocast {
        4
    } else if attn_b > r.unquantized_bytes {
        attn_b
    } else {
        r.unquantized_bytes
    }
}

/// Input group of a Linear: which tensor it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    /// q/k/v (and fused qkv, MLA's down projections): the attention norm's output.
    AttnIn,
    /// The attention output projection: SDPA's output (already saved by SDPA).
    AttnOut,
    /// MLP input projections (gate/up/fc1, experts' gate/up): the MLP norm's output.
    MlpIn,
    /// MLP output projection (down/fc2): the product / activation output.
    MlpOut,
    /// MoE router: reads the MLP norm's output; tiny output.
    Router,
}

/// Bytes per element of the ΔW LoHa and LoKr build every forward, as `F.linear` saves it:
/// 16-bit under autocast, else the adapter dtype.
pub(crate) const fn delta_weight_bytes(r: &Regime) -> u64 {
    if r.autocast { 2 } else { r.adapter_bytes }
}

/// What LoHa's, LoKr's and BOFT's first-layer modules would save for their input's gradient
/// (`saves(l)` of each) where nothing asks for it: with the embedding frozen and nothing
/// making it require grad (no checkpointing, with which `enable_input_require_grads` comes), the
/// first layer's hidden state has no gradient until an adapted module upstream in the layer
/// gives it one, so `F.linear(x, ΔW)` keeps no ΔW and `x @ R` no rotation (autograd saves a
/// tensor only for the gradients it will make). Counted only for a text decoder whose every layer is adapted;
/// an attention input read from another projection (MLA's `q_b_proj`) is counted as saved.
fn first_layer_unsaved(
    model: &ModelSpec,
    job: &Job,
    h: u64,
    saves: impl Fn(&Linear) -> u64,
) -> u64 {
    let stage = |g: Group| match g {
        Group::AttnIn => 0,
        Group::AttnOut => 1,
        Group::MlpIn | Group::Router => 2,
        Group::MlpOut => 3,
    };
    let applies = job.method.is_peft()
        && job.adapter.method.first_layer_saves_less()
        && !job.gradient_checkpointing
        && job.adapted_layers.is_none()
        && model.encoder.is_none()
        && model.seq2seq.is_none()
        && model.vision.is_none();
    let Some(first) = model.layers.first().filter(|_| applies) else {
        return 0;
    };
    let adapted: Vec<&Linear> = first.linears.iter().filter(|l| job.adapts(l)).collect();
    let Some(earliest) = adapted.iter().map(|l| stage(group_of(l, h))).min() else {
        return 0;
    };
    adapted
        .iter()
        .filter(|l| {
            let g = group_of(l, h);
            stage(g) == earliest && (g != Group::AttnIn || l.in_features == h)
        })
        .map(|l| saves(l))
        .sum()
}

fn group_of(l: &Linear, h: u64) -> Group {
    // `proj`: Qwen-VL's vision blocks.
    const ATTN_OUT: [&str; 7] = ["o_proj", "dense", "c_proj", "out_proj", "wo", "o", "proj"];
    const MLP_OUT: [&str; 6] = ["down_proj", "dense_4h_to_h", "c_proj", "fc2", "w2", "down"];
    match l.role {
        LinearRole::Router => Group::Router,
        // A tower's Linears are given their attention and MLP roles before its activations
        // are built (`super::vision::tower_model`); none sits in a language-model layer.
        LinearRole::Vision => Group::MlpIn,
        LinearRole::Attention => {
            if ATTN_OUT.contains(&l.name.as_str()) && l.out_features == h {
                Group::AttnOut
            } else {
                Group::AttnIn
            }
        }
        LinearRole::Mlp | LinearRole::Expert | LinearRole::SharedExpert => {
            if MLP_OUT.contains(&l.name.as_str()) || (l.out_features == h && l.in_features != h) {
                Group::MlpOut
            } else {
                Group::MlpIn
            }
        }
    }
}

/// Whether lit-gpt runs the model's blocks with a parallel residual (`Block.forward`:
/// `x = self.mlp(n_2) + h + x`, the MLP reading a norm of the layer input) rather than a
/// sequential one (`x = h + x; x = self.mlp(self.norm_2(x)) + x`): `Config.parallel_residual`
/// in `lit_gpt/config.py` is true for the GPT-NeoX family (Pythia, StableLM-Alpha,
/// RedPajama-INCITE), Falcon and Phi, false for the Llama family.
fn parallel_residual(m: &ModelSpec) -> bool {
    matches!(
        m.model_type.as_str(),
        "gpt_neox" | "falcon" | "RefinedWeb" | "RefinedWebModel" | "phi" | "gptj"
    )
}

/// The widest input among a layer's (non-expert) Linears of group `grp`: the width of the
/// tensor the group reads; `None` when the layer has no such Linear.
fn group_width(g: &LayerGroup, h: u64, grp: Group) -> Option<u64> {
    g.linears
        .iter()
        .filter(|l| l.role != LinearRole::Expert && group_of(l, h) == grp)
        .map(|l| l.in_features)
        .max()
}

/// Shape inputs of the per-layer formula.
struct Ctx<'a> {
    m: &'a ModelSpec,
    job: &'a Job,
    r: &'a Regime,
    tp: u64,
}

impl Ctx<'_> {
    /// Bytes of a (non-quantized or quantized) Linear's output for a given input dtype.
    /// Under autocast an `nn.Linear` returns bf16; a bitsandbytes 4-bit Linear returns its
    /// *input* dtype (`Linear4bit.forward`: `.to(inp_dtype)`, memory-anatomy §1.2).
    fn linear_out_bytes(&self, input_bytes: u64) -> u64 {
        let quantized_base = self.job.method != Method::Full && self.r.bnb_lora_layer;
        if quantized_base {
            input_bytes
        } else if self.r.autocast {
            2
        } else {
            input_bytes
        }
    }

    /// Prefix tuning's virtual tokens (0 for every other method).
    fn prefix_tokens(&self) -> u64 {
        if self.job.method.is_peft() && self.job.adapter.method == PeftKind::PrefixTuning {
            self.job.adapter.virtual_tokens
        } else {
            0
        }
    }

    /// Saved bytes per sequence and layer of prefix tuning's own keys and values: the cache
    /// concatenates them before the sequence's (`DynamicLayer.update`: `torch.cat`), and the
    /// attention saves the result, expanded to every head by `repeat_kv` when SDPA or eager
    /// attention gets a mask (transformers `sdpa_attention_forward` passes `enable_gqa` only
    /// without one).
    fn prefix_kv_per_sequence(&self) -> u64 {
        let prefix = self.prefix_tokens();
        if prefix == 0 {
            return 0;
        }
        let tp = self.tp.max(1);
        let width = match self.job.attention {
            Attention::Flash => self.m.kv_width(),
            Attention::Sdpa | Attention::Eager => self.m.q_width(),
        } / tp;
        let o = self.linear_out_bytes(self.r.stream_bytes);
        2 * prefix * width * self.attn_bytes(o)
    }

    /// Bytes per element of attention tensors SDPA saves (autocast casts to bf16).
    fn attn_bytes(&self, qkv_bytes: u64) -> u64 {
        if self.r.autocast { 2 } else { qkv_bytes }
    }

    /// Saved bytes per token of `q_norm` and `k_norm` ([`ModelSpec::qk_norm`]; Gemma 3 traced
    /// in `validation/oracle-traces/gemma3-layers.jsonl`), with `o`
    /// bytes per element of the q/k projections' outputs. transformers 5.24
    /// `Qwen3RMSNorm.forward`: `hidden_states.to(torch.float32)` is saved by `pow` and by the
    /// multiply with `torch.rsqrt(variance + eps)` (one fp32 storage, `PowBackward0` /
    /// `MulBackward0`), the `rsqrt` (one fp32 per head) by `RsqrtBackward0`; a trainable norm
    /// weight (full fine-tune) also saves `hidden_states.to(input_dtype)`. RoPE's multiplies
    /// save only cos and sin (traces: `validation/oracle-traces/qwen3-no-checkpointing.jsonl`).
    /// Liger's RMSNorm, where the Trainer's patch reaches these norms
    /// ([`crate::job::Liger::patches_qk_norm`]), saves the input and the `rstd` only.
    fn qk_norm_bytes(&self, o: u64) -> u64 {
        let tp = self.tp.max(1);
        let width = (self.m.q_width() + self.m.kv_width()) / tp;
        let heads = (self.m.num_heads + self.m.num_kv_heads) / tp;
        if self.job.liger.rms_norm && crate::job::Liger::patches_qk_norm(&self.m.model_type) {
            // `LigerRMSNorm` saves its input and one fp32 `rstd` per row, one row per head.
            return o * width + 4 * heads;
        }
        // Gemma 3's norms stay fp32 through `output * (1.0 + self.weight.float())`
        // (`ModelSpec::fp32_norms`): the product saves the fp32 normalized input.
        let weight_grad = match (self.job.method == Method::Full, self.m.fp32_norms) {
            (false, _) => 0,
            (true, true) => 4 * width,
            (true, false) => o * width,
        };
        4 * width + 4 * heads + weight_grad
    }

    /// Bytes per element of the private copy a LoRA adapter makes of an input of `xb`
    /// bytes per element, or `None` when it reads the input as it is: plain `lora.Linear`
    /// casts x to the adapter dtype (`_cast_input_dtype`), and under autocast fp32 adapters
    /// (or an fp32 input) get autocast's uncached bf16 copy; the bnb layer casts only
    /// without autocast.
    fn adapter_cast_bytes(&self, xb: u64) -> Option<u64> {
        let r = self.r;
        if r.autocast {
            let plain_cast = !r.bnb_lora_layer && r.adapter_bytes == 4;
            (plain_cast || xb == 4).then_some(2)
        } else {
            (xb != r.adapter_bytes).then_some(r.adapter_bytes)
        }
    }

    fn norms_per_layer(g: &LayerGroup, m: &ModelSpec) -> u64 {
        if g.attention == AttentionKind::Recurrent {
            // `input_layernorm` and `post_attention_layernorm`; the mixer's gated norm is
            // part of its core ([`Self::mamba_core`]).
            return 2;
        }
        let per = match m.norm {
            NormKind::RmsNorm => m.hidden_size,
            NormKind::LayerNorm => 2 * m.hidden_size,
        };
        (g.other_params / per.max(1)).clamp(1, 4)
    }

    /// Saved Linear inputs of one layer, per token: each input group once when a trainable
    /// weight reads it (autocast's uncached casts and LoRA's dropout/cast copies per module),
    /// plus LoRA's `lora_A` outputs and DoRA's saved results. `out_saved_elsewhere`: the
    /// attention output projection reads a tensor the attention kernel already saves (SDPA,
    /// FA2), so it is not counted again.
    fn linear_inputs(&self, g: &LayerGroup, out_saved_elsewhere: bool) -> u64 {
        let m = self.m;
        let job = self.job;
        let r = self.r;
        let tp = self.tp.max(1);
        let h = m.hidden_size;
        let s = r.stream_bytes;
        let full = job.method == Method::Full;
        let peft = job.method.is_peft();
        let litgpt = job.stack.profile().attention_module == AttentionModule::LitgptFusedQkv;
        let mut bytes = 0u64;
        let o = self.linear_out_bytes(s);
        let attn_b = self.attn_bytes(o);
        // A Mamba-2 mixer's `out_proj` reads `scan_output.to(dtype)`, the gated norm's
        // output cast to the layer input's dtype.
        let recurrent = g.attention == AttentionKind::Recurrent;
        let group_input_bytes = |grp: Group| match grp {
            Group::AttnIn | Group::MlpIn | Group::Router => s,
            Group::AttnOut if recurrent => s,
            Group::AttnOut => attn_b,
            Group::MlpOut => o,
        };
        let dropout = peft && job.adapter.dropout > 0.0;
        let ab = if r.autocast { 2 } else { r.adapter_bytes };
        for grp in [Group::AttnIn, Group::AttnOut, Group::MlpIn, Group::MlpOut] {
            let xb = group_input_bytes(grp);
            let mut shared = false;
            let mut private = 0u64;
            // litgpt's `LoRAQKVLinear` is one fused module: one dropout (mask + copy) serves
            // every enabled q/k/v slice.
            let mut fused_dropout_done = false;
            let mut stacked_gathered = false;
            for l in g.linears.iter().filter(|l| group_of(l, h) == grp) {
                if l.role == LinearRole::Expert && m.experts_see_every_token {
                    // Counted with the experts' own tensors ([`Self::every_token_experts`]).
                    continue;
                }
                let k_in = l.in_features;
                // Tokens reaching the module: experts see top-k copies per token.
                let mult = match l.role {
                    LinearRole::Expert => l.active,
                    _ => 1,
                };
                let sharded = if matches!(grp, Group::AttnOut | Group::MlpOut) {
                    k_in / tp
                } else {
                    k_in
                };
                if r.quantized_saves_input && l.role != LinearRole::Expert {
                    shared = true;
                }
                if full {
                    if r.autocast && xb == 4 {
                        private += 2 * sharded * mult;
                    } else {
                        shared = true;
                    }
                    if l.role == LinearRole::Expert {
                        // Each expert gathers its tokens into a new tensor it saves; stacked
                        // experts gather once for the group (`grouped_mm_experts_forward`).
                        let module = job.is_module(l);
                        if module || !stacked_gathered {
                            private += sharded * xb * mult;
                        }
                        stacked_gathered |= !module;
                        shared = false;
                    }
                }
                if peft
                    && job.adapter.method.uses_targets()
                    && job.adapts(l)
                    && job.adapts_stacked(l)
                {
                    // A LoRA-wrapped stack (`ParamWrapper`): the merged weight requires grad,
                    // so `grouped_mm` saves its input, gathered once for gate and up; no
                    // adapter runs on the tokens (the merged weights: `Activations::new`).
                    if grp == Group::MlpOut || !stacked_gathered {
                        private += sharded * xb * mult;
                    }
                    stacked_gathered = true;
                    continue;
                }
                if peft && job.adapter.method.uses_targets() && job.adapts(l) {
                    let adapter_out = l.out_features / tp * mult;
                    match job.adapter.method {
                        PeftKind::Ia3 if super::weights::ia3_feedforward(m, job, l) => {
                            // `x = x.to(ia3_l.dtype)`; `x * ia3_scaling` saves that copy
                            // (`ia3/layer.py` `Linear.forward`); the frozen base saves none.
                            if xb == r.adapter_bytes {
                                shared = true;
                            } else {
                                private += sharded * mult * r.adapter_bytes;
                            }
                            continue;
                        }
                        PeftKind::Ia3 => {
                            // `result * ia3_scaling` saves the base output.
                            bytes += adapter_out * o;
                            continue;
                        }
                        PeftKind::Vera => {
                            // `lambda_d * F.linear(x, A)` and `lambda_b * F.linear(·, B)` save
                            // the r- and out-wide projections (`vera/layer.py`); the frozen
                            // A and B save no input.
                            bytes += (job.adapter.rank * mult + adapter_out) * ab;
                            continue;
                        }
                        // `(x @ (A·E)ᵀ @ Bᵀ) * scaling / ranknum`: `div` saves its out-wide
                        // dividend (`adalora/layer.py`) where `ranknum` requires grad
                        // ([`crate::job::Versions::adalora_saves_dividend`]).
                        PeftKind::AdaLora if job.versions.adalora_saves_dividend() => {
                            bytes += adapter_out * ab;
                        }
                        // `result * boft_scale` saves the base output (`boft/layer.py`
                        // `Linear.forward`); `x @ boft_rotation` saves x, as read.
                        PeftKind::Boft => bytes += adapter_out * o,
                        _ => {}
                    }
                    let cast_copy = if job.adapter.method == PeftKind::Boft {
                        None
                    } else if job.adapter.method == PeftKind::LoHa {
                        // `_cast_input_dtype(x, ΔW.dtype)`: LoHa's ΔW is already the
                        // matmuls' dtype, so a 16-bit x under autocast is read as it is.
                        let d = delta_weight_bytes(r);
                        (xb != d).then_some(d)
                    } else {
                        self.adapter_cast_bytes(xb)
                    };
                    let fused_qkv = litgpt && grp == Group::AttnIn;
                    match (cast_copy, dropout) {
                        (_, true) if fused_qkv && fused_dropout_done => {}
                        (Some(cb), d) => {
                            private += sharded * mult * (cb + u64::from(d));
                            fused_dropout_done = d;
                        }
                        (None, true) => {
                            private += sharded * mult * (xb + 1);
                            fused_dropout_done = true;
                        }
                        (None, false) => {
                            if l.role == LinearRole::Expert {
                                private += sharded * xb * mult;
                            } else {
                                shared = true;
                            }
                        }
                    }
                    // lora_A's output, saved by lora_B (LoHa has none: `F.linear(x, ΔW)`
                    // saves the cast input and its weight, counted per layer; nor OFT: its
                    // `einsum` saves the cast input and the blocks).
                    if !(job.adapter.method.builds_delta_weight()
                        || matches!(job.adapter.method, PeftKind::Oft | PeftKind::Boft))
                    {
                        bytes += job.adapter.rank * ab * mult * l.count.min(1);
                    }
                    if job.adapter.dora {
                        bytes +=
                            super::dora::saved_per_token(job, r, l.out_features / tp, o) * mult;
                    }
                }
            }
            // The attention output is saved by SDPA already.
            if shared && (grp != Group::AttnOut || !out_saved_elsewhere) {
                let width = match grp {
                    Group::MlpOut => {
                        g.linears
                            .iter()
                            .filter(|l| group_of(l, h) == Group::MlpOut)
                            .map(|l| l.in_features)
                            .max()
                            .unwrap_or(0)
                            / tp
                    }
                    Group::AttnOut if recurrent => {
                        group_width(g, h, Group::AttnOut).unwrap_or(0) / tp
                    }
                    Group::AttnOut => m.q_width() / tp,
                    _ => h,
                };
                bytes += width * xb;
            }
            bytes += private;
        }

        bytes
    }

    /// Saved bytes per token of one post-LN encoder layer (transformers `BertLayer`; RoBERTa's
    /// layers are copies of it), op by op:
    ///
    /// - Linear inputs as for decoders ([`Self::linear_inputs`]); the attention output
    ///   projection reads `context_layer.permute(0, 2, 1, 3).contiguous()` (eager) or the
    ///   transposed-and-reshaped SDPA output, a copy no kernel saves, so it counts.
    /// - `BertSelfOutput` / `BertOutput`: `LayerNorm(dropout(dense(x)) + input_tensor)`:
    ///   `native_layer_norm` saves its input (the residual sum, promoted to the fp32 stream
    ///   when the sublayer output is 16-bit) and fp32 `mean` and `rstd` (8 B per token), and
    ///   each `nn.Dropout` a 1-byte mask (`_fused_dropout` / `native_dropout` backward takes
    ///   the mask): `2·(s·h + 8) + 2h` with dropout.
    /// - eager `BertSelfAttention`: `transpose_for_scores` views go through `torch.matmul`,
    ///   which `reshape`s the permuted q, kᵀ and v into contiguous `bmm` operands (copies,
    ///   `LinearAlgebra.cpp` `matmul`) that `bmm` saves: 3·o·h. `attention_scores +
    ///   attention_mask` adds the extended mask, cast to the model's dtype
    ///   (`get_extended_attention_mask`: `.to(dtype=self.dtype)`), so 16-bit scores of an
    ///   fp32 model are promoted to fp32, and autocast runs `softmax` in fp32 anyway: the
    ///   probabilities are `p` = 4 B under autocast, else the model's dtype. `softmax` saves
    ///   its output (p·a·s); dropout on the probabilities saves a mask (a·s) and its output
    ///   is what `matmul(probs, v)` saves (p·a·s, or autocast's fp16 copy, 2·a·s).
    /// - SDPA (`BertSdpaSelfAttention`, transformers ≥ 4.41): q, k, v, out and the fp32
    ///   log-sum-exp (4a), dropout inside the kernel (a seed only).
    /// - `BertIntermediate`: `hidden_act` (GELU) saves its input, o·I; `BertOutput.dense`
    ///   saves GELU's output (a Linear input, above).
    ///
    /// Full FT, fp32, eager, dropout on: `34h + 8I + 9·a·s + 16` per token; fp16 autocast:
    /// `26h + 4I + 7·a·s + 16` (q, k, v cast their fp32 input separately, 3·2h).
    fn encoder_layer_bytes(&self, g: &LayerGroup, enc: &EncoderSpec) -> u64 {
        let m = self.m;
        let r = self.r;
        let tp = self.tp.max(1);
        let h = m.hidden_size;
        let s = r.stream_bytes;
        let o = self.linear_out_bytes(s);
        let attn_b = self.attn_bytes(o);
        let a = m.num_heads / tp;
        let ad = m.q_width() / tp;
        let kd = m.kv_width() / tp;
        let seq = self.job.seq_len;

        // Post-LN norms and the hidden dropouts.
        let mut bytes = 2 * (s.max(o) * h + 8);
        if enc.hidden_dropout {
            bytes += 2 * h;
        }
        bytes += self.linear_inputs(g, false);

        // Attention core.
        bytes += match self.job.attention {
            Attention::Eager => {
                let p = eager_probs_bytes(r, attn_b);
                // q, k, v contiguous copies and the saved softmax output.
                let mut b = attn_b * (ad + 2 * kd) + p * a * seq;
                if enc.attention_dropout {
                    b += a * seq * (1 + if r.autocast { 2 } else { p });
                } else if r.autocast && p == 4 {
                    b += 2 * a * seq;
                }
                b
            }
            Attention::Sdpa | Attention::Flash => attn_b * (2 * ad + 2 * kd) + 4 * a,
        };

        // GELU saves its input.
        bytes + o * (m.intermediate_size / tp)
    }

    /// Saved bytes per token of one layer of group `g`.
    #[allow(clippy::too_many_lines)]
    fn layer_bytes(&self, g: &LayerGroup) -> u64 {
        let m = self.m;
        let job = self.job;
        let r = self.r;
        let tp = self.tp.max(1);
        let h = m.hidden_size;
        let s = r.stream_bytes;
        let full = job.method == Method::Full;
        let peft = job.method.is_peft();
        let litgpt = job.stack.profile().attention_module == AttentionModule::LitgptFusedQkv;

        // Norms.
        let n_norms = Self::norms_per_layer(g, m);
        // `weight * normed` saves `normed` for a trainable weight: in the stream dtype, or
        // fp32 when the weights stay fp32 (`ModelSpec::fp32_norms`).
        let normed = if m.fp32_norms { 4 } else { s };
        let per_norm = match m.norm {
            // `LigerRMSNorm` (liger-kernel 0.8.5 `ops/rms_norm.py`) saves its input and one
            // fp32 `rstd` per row, whether or not its weight trains.
            NormKind::RmsNorm if job.liger.rms_norm => s * h + 4,
            NormKind::RmsNorm => 4 * h + if full { normed * h } else { 0 },
            NormKind::LayerNorm => s * h,
        };
        // A parallel-residual block (GPT-NeoX `use_parallel_residual`, Falcon's
        // `ln_attn`/`ln_mlp`) normalizes the same layer input twice: LayerNorm's saved input is
        // one tensor (transformers `GPTNeoXLayer.forward`: `self.mlp(
        // self.post_attention_layernorm(hidden_states))`).
        let shared_input = m.norm == NormKind::LayerNorm && n_norms >= 2 && parallel_residual(m);
        let mut bytes = if shared_input {
            (n_norms - 1) * per_norm
        } else {
            n_norms * per_norm
        };
        if peft
            && job.adapter.method == PeftKind::LnTuning
            && !(job.liger.rms_norm && m.norm == NormKind::RmsNorm)
        {
            // A trainable norm weight: `self.weight * hidden_states.to(input_dtype)` saves the
            // normalized input for the weight's gradient (transformers `LlamaRMSNorm`).
            bytes += n_norms * h * s;
        }

        // Linear inputs, per group.
        let o = self.linear_out_bytes(s);
        let attn_b = self.attn_bytes(o);
        // SDPA and FlashAttention save their output, which o_proj reads unless RoPE's
        // layout makes it a copy; eager attention's `matmul(probs, v)` saves only its inputs.
        let recurrent = g.attention == AttentionKind::Recurrent;
        // Qwen3-Next's output gate multiplies the attention output first: `o_proj` reads the
        // product.
        let out_saved = !recurrent
            && !m.attention_output_gate
            && (litgpt || (job.attention != Attention::Eager && !m.rope_by_concat));
        bytes += self.linear_inputs(g, out_saved);
        if m.qk_norm {
            bytes += self.qk_norm_bytes(o);
        }

        // Attention core.
        let a = m.num_heads / tp;
        let ad = m.q_width() / tp;
        let kd = m.kv_width() / tp;
        // litgpt trains with causal attention only (no padding mask is passed to SDPA).
        // Prefix tuning's keys outnumber the queries: transformers builds a mask
        // (`create_causal_mask` with the cache's length) whatever the padding.
        let prefix = self.prefix_tokens();
        let padded = (job.padding.has_mask() || prefix > 0) && !litgpt;
        let seq = job.seq_len;
        bytes += match job.attention {
            _ if recurrent => match (&m.ssm, &m.gated_delta_net) {
                (Some(ssm), _) => self.mamba_core(ssm),
                (None, Some(gdn)) => self.gated_delta_core(gdn),
                (None, None) => 0,
            },
            _ if litgpt => {
                let mut b = self.litgpt_attention_core(attn_b);
                // LoRA on a subset of q/k/v: `zero_pad`'s `index_copy` saves its (copied)
                // source, the enabled slices' widths.
                if peft {
                    let qkv: Vec<&Linear> = g
                        .linears
                        .iter()
                        .filter(|l| group_of(l, h) == Group::AttnIn)
                        .collect();
                    let enabled: Vec<&&Linear> = qkv.iter().filter(|l| job.adapts(l)).collect();
                    if !enabled.is_empty() && enabled.len() < qkv.len() {
                        b += attn_b * enabled.iter().map(|l| l.out_features / tp).sum::<u64>();
                    }
                }
                b
            }
            Attention::Flash | Attention::Sdpa => {
                let kv = if (padded && job.attention == Attention::Sdpa) || self.expands_kv() {
                    ad
                } else {
                    kd
                };
                let mut b = attn_b * (2 * ad + 2 * kv) + 4 * a;
                if padded && job.attention == Attention::Sdpa {
                    // mem-efficient kernel's additive mask: (b, 1, s, s + prefix) in query
                    // dtype per layer, 2·(s + prefix) bytes per token [DERIVED,
                    // memory-anatomy §5].
                    b += 2 * (seq + prefix);
                }
                if padded && job.attention == Attention::Flash {
                    // `_upad_input` / `_pad_input` copies: a second copy of out.
                    b += attn_b * ad;
                }
                b
            }
            Attention::Eager if m.attention_sinks => self.eager_sinks_core(attn_b),
            Attention::Eager => {
                // q, repeat_kv-expanded k and v, fp32 softmax + bf16 probs; Gemma 2's
                // soft cap adds `tanh`'s saved output.
                let capped = if m.attn_softcapping { attn_b } else { 0 };
                attn_b * 3 * ad + a * (seq + prefix) * (4 + attn_b + capped)
            }
        };

        if !litgpt {
            bytes += self.fused_qkv_view(g);
        }
        if m.attention_output_gate && !recurrent {
            // `attn_output.reshape(...)`, a copy of SDPA's transposed output, and
            // `sigmoid(gate)` (its output, from a copy of `q_proj`'s gate half), both saved by
            // their product (transformers 5.25 `Qwen3NextAttention.forward`).
            bytes += 2 * attn_b * ad;
        }

        if g.moe && m.expert_gate.is_some() {
            return bytes + self.fused_experts_bytes(o);
        }
        if g.moe
            && m.experts_see_every_token
            && let Some(moe) = &m.moe
        {
            // The shared expert's gated MLP, and every routed expert on every token.
            let shared = moe.shared_intermediate_size / tp;
            return bytes + 3 * o * shared + self.every_token_experts(moe, o);
        }

        // MLP core.
        let i_act = m.active_intermediate(g.moe) / tp;
        let mlp_o = o;
        bytes += if m.gated_mlp && job.liger.glu && !g.moe {
            // `LigerSiLUMulFunction` / `LigerGELUMulFunction` (liger-kernel 0.8.5
            // `ops/swiglu.py`, `ops/geglu.py`) save the gate and up projections and
            // recompute the activation in backward.
            2 * mlp_o * i_act
        } else if m.gated_mlp {
            3 * mlp_o * i_act
        } else {
            mlp_o * i_act
        };
        if g.moe
            && let Some(moe) = &m.moe
        {
            // Router probabilities (fp32 softmax over experts) and the weighted expert
            // outputs `expert_out * routing_weight` (saves expert_out: k·h).
            bytes += 4 * moe.num_experts + moe.experts_per_token * h * mlp_o;
        }
        bytes
    }

    /// Saved bytes per token of a MoE block whose experts all run on every token
    /// ([`ModelSpec::experts_see_every_token`]; transformers 5.25 `Llama4TextMoe.forward`,
    /// `Llama4TextExperts.forward`, `Llama4Router.forward`), `o` bytes per element of the
    /// `bmm` outputs: the router's top-k indices and its fp32 `sigmoid` output; the
    /// `repeat` of the normed input for every expert, which the multiply by the scores
    /// saves (the scores require grad whenever the layer's input does); the `gate_up`
    /// product, kept whole by `act_fn(gate)` and `up * act`, which saves the activation too.
    /// A full fine-tune's `bmm`s also save their inputs for the expert stacks' gradients:
    /// the scaled copy and `up * act`.
    fn every_token_experts(&self, moe: &crate::model::MoeSpec, o: u64) -> u64 {
        let tp = self.tp.max(1);
        let e = moe.num_experts;
        let i = moe.expert_intermediate_size / tp;
        let h = self.m.hidden_size;
        let s = self.r.stream_bytes;
        let router = 8 * moe.experts_per_token + 4 * e + e * o;
        let saved = e * (h * s + 3 * i * o);
        let weights_grads = if self.job.method == Method::Full {
            e * (h * s + i * o)
        } else {
            0
        };
        router + saved + weights_grads
    }

    /// Saved bytes per token of eager attention with sinks ([`ModelSpec::attention_sinks`];
    /// transformers 5.24 `gpt_oss` `eager_attention_forward`), `attn_b` bytes per element of
    /// q, k and v: the rotated q and the `repeat_kv` copies of k and v (saved by the two
    /// `matmul`s); `cat([scores, sinks])` promotes to the sinks' dtype, whose softmax output
    /// is saved (`a · (s + 1)`) and, when that is wider than v, its cast to v's dtype too;
    /// the row maxima's int64 indices (`combined.max(dim=-1)`) are saved by `MaxBackward`.
    fn eager_sinks_core(&self, attn_b: u64) -> u64 {
        let tp = self.tp.max(1);
        let a = self.m.num_heads / tp;
        let ad = self.m.q_width() / tp;
        let sinks = if self.job.method == Method::Full {
            self.r.param_bytes
        } else {
            self.r.frozen_bytes
        };
        let probs = attn_b.max(sinks);
        let cast = if probs > attn_b { attn_b } else { 0 };
        let scores = (self.job.seq_len + self.prefix_tokens() + 1) * a;
        attn_b * 3 * ad + scores * (probs + cast) + 8 * a
    }

    /// Saved bytes per token of a fused MoE block ([`ModelSpec::expert_gate`]), `o` bytes
    /// per element of the expert outputs, following transformers 5.24
    /// `integrations/moe.py` `grouped_mm_experts_forward` for each of the `k` routed copies
    /// of a token: the `gate_up` output (`2I`, kept whole by the clamps' saved views), then
    /// [`ExpertGate::ClampedSwiglu`]'s clamp, sigmoid, `glu` and `up + 1` outputs (`4I`), and
    /// the down projection's output, saved by its multiply with the routing weight (`h`).
    /// The router (`GptOssTopKRouter`) saves its top-k indices, the sort permutation, the
    /// token index `perm // k` and the inverse permutation (int64 each), and the top-k
    /// softmax and its permuted copy. A trainable router also saves its input; the
    /// experts' gathered inputs are [`Self::linear_inputs`]'.
    fn fused_experts_bytes(&self, o: u64) -> u64 {
        let m = self.m;
        let tp = self.tp.max(1);
        let Some(moe) = &m.moe else { return 0 };
        let k = moe.experts_per_token;
        let i = moe.expert_intermediate_size / tp;
        let gate = match m.expert_gate {
            Some(ExpertGate::ClampedSwiglu) | None => 6 * i,
        };
        let router = k * (4 * 8 + 2 * o);
        let full = if self.job.method == Method::Full {
            // The router's input, and `sort`'s sorted values (int64).
            m.hidden_size * self.r.stream_bytes + 8 * k
        } else {
            0
        };
        k * (gate + m.hidden_size) * o + router + full
    }

    /// Saved bytes per token of litgpt's attention core (flash / SDPA), `attn_b` bytes per
    /// element. litgpt `CausalSelfAttention`: q, k, v are views of the fused qkv output after
    /// `split`; GQA models `expand` + `reshape` k and v to all heads (copies) before SDPA; MHA
    /// and MQA keep a view of qkv that SDPA saves, keeping the whole fused output alive.
    /// Saved: (MHA/MQA) qkv + rotated q, k + out; (GQA) q, k, v at full heads + out; plus the
    /// fp32 log-sum-exp per head.
    ///
    /// litgpt has no eager attention: `Attention::Eager` is SDPA's math kernel
    /// (`_scaled_dot_product_attention_math`, `attention.cpp`). It scales q by √scale (a new
    /// tensor), and `matmul` expands and `reshape`s the k and v operands to all heads
    /// (copies, `LinearAlgebra.cpp` `matmul`) that its `bmm`s save with the bf16 softmax
    /// output, `a·s` per token; nothing keeps the fused qkv output alive. Saved: 3·ad + a·s
    /// elements per token.
    fn litgpt_attention_core(&self, attn_b: u64) -> u64 {
        let m = self.m;
        let tp = self.tp.max(1);
        let a = m.num_heads / tp;
        let ad = m.q_width() / tp;
        let kd = m.kv_width() / tp;
        let kv_heads = m.num_kv_heads;
        if self.job.attention == Attention::Eager {
            return attn_b * (3 * ad + a * self.job.seq_len);
        }
        (if kv_heads == m.num_heads || kv_heads == 1 {
            attn_b * (ad + 2 * kd) + attn_b * 3 * ad
        } else {
            attn_b * 4 * ad
        }) + 4 * a
    }

    /// Saved bytes per token of layer `idx` (in group `g`) of a lit-gpt LLaMA-Adapter job,
    /// and the part of them that bitsandbytes' 4-bit matmuls hold as their inputs
    /// (`ctx.tensors`, bnb < 0.43.2), for [`Activations::previous_step_quantized_inputs`].
    ///
    /// Every base weight is frozen, so a Linear saves nothing for its own weight; what is
    /// saved is what the adapter's parameters and the graph reaching them need
    /// (`gen_variable_type.py`: an input is saved only when the other input needs a
    /// gradient). lit-gpt @0f021f3a (the commit that added the adapter resource table),
    /// `lit_gpt/adapter.py`, `lit_gpt/adapter_v2.py`, `lit_gpt/model.py`:
    ///
    /// - **v1, layers before `adapter_start_layer`**: nothing in them requires grad (the
    ///   embedding and every weight are frozen): nothing saved, not even by bnb
    ///   (`MatMul4Bit.forward` keeps `(A, B)` only `if any(ctx.needs_input_grad[:2])`).
    /// - **v1, the start layer**: the graph begins at `y + self.gating_factor * ay`, which
    ///   saves `ay`, the prefix attention's output (its inputs, q and the cached no-grad
    ///   `ak`/`av`, need no gradient, so that SDPA saves nothing). Then the attention output
    ///   reaches `proj` (bnb saves it) and, in a sequential block (`x = h + x`), `norm_2` and
    ///   the MLP save as usual; a parallel-residual block (`x = mlp(n_2) + h + x`) feeds the
    ///   MLP from the no-grad layer input, so its MLP saves nothing.
    /// - **later layers (v1) and every layer (v2)**: the norms (RMSNorm: the fp32 copy of its
    ///   input `x.float()` saved by `x * x`; LayerNorm: its input, which in a parallel block
    ///   both norms read, so it is saved once), the attention core
    ///   ([`Self::litgpt_attention_core`]), the MLP core, bnb's inputs, and from
    ///   `adapter_start_layer` on the prefix attention: its output `ay` (saved by the gate's
    ///   mul and by SDPA) and SDPA's fp32 log-sum-exp (mem-efficient kernel, chosen because
    ///   of the `amask` passed with it) — or with a micro-batch above 1, whose q batch differs
    ///   from the prefix's batch of 1, the math kernel's bf16 softmax over the prefix
    ///   (torch 2.1 `sdp_utils.cpp` kernel choice [DERIVED; a few hundred bytes per token
    ///   either way]). The sum
    ///   `y + gating * ay` is a new tensor, the `proj` input that bnb saves (without a prefix
    ///   `proj` reads a view of SDPA's output).
    /// - **v2 extras**: `AdapterV2Linear.forward` returns `adapter_scale * (linear(x) +
    ///   adapter_bias)`; the mul saves its input (the pre-scale output, `out_features` per
    ///   token, for `adapter_scale`'s gradient) on every Linear. Norm weights are trainable:
    ///   RMSNorm's `self.weight * x_normed` saves the fp32 `x_normed` (LayerNorm saves the
    ///   same tensors either way). In layer 0 the input (the frozen embedding's output) needs
    ///   no gradient, so RMSNorm does not save its fp32 copy there.
    #[allow(clippy::too_many_lines)]
    fn adapter_layer(&self, g: &LayerGroup, idx: u64) -> (u64, u64) {
        let m = self.m;
        let r = self.r;
        let tp = self.tp.max(1);
        let h = m.hidden_size;
        let s = r.stream_bytes;
        let c = self.linear_out_bytes(s);
        let ad = m.q_width() / tp;
        let a = m.num_heads / tp;
        let v2 = self.job.adapter.method == PeftKind::AdapterV2;
        let start = ADAPTER_START_LAYER;
        let parallel = parallel_residual(m);
        let bnb = r.quantized_saves_input;
        let has_prefix = idx >= start;
        // The layer input requires grad.
        let live_in = if v2 { idx > 0 } else { idx > start };
        // q requires grad: the main attention's SDPA saves.
        let attn_live = v2 || live_in;
        // The MLP input requires grad.
        let mlp_live = v2 || live_in || (idx == start && !parallel);
        if !(v2 || has_prefix) {
            return (0, 0);
        }
        let norm = |input_live: bool| match m.norm {
            NormKind::RmsNorm => (if input_live { 4 * h } else { 0 }) + if v2 { 4 * h } else { 0 },
            NormKind::LayerNorm => {
                if input_live || v2 {
                    s * h
                } else {
                    0
                }
            }
        };
        let n_norms = Self::norms_per_layer(g, m);
        let width = |grp: Group| group_width(g, h, grp).unwrap_or(0);
        let mut saved = 0u64;
        // bnb-held inputs, and the part of them already saved by another op.
        let mut held = 0u64;
        let mut shared = 0u64;
        // Attention half.
        if attn_live {
            saved += norm(live_in);
            if bnb {
                held += width(Group::AttnIn) * s;
            }
            saved += self.litgpt_attention_core(self.attn_bytes(c));
        }
        if has_prefix {
            saved += c * ad;
            if attn_live {
                saved += if self.job.micro_batch_size == 1 {
                    4 * a
                } else {
                    c * a * ADAPTER_PROMPT_LENGTH
                };
            }
        }
        if bnb {
            let proj_in = width(Group::AttnOut) / tp * c;
            held += proj_in;
            // Without a prefix, proj reads a view of SDPA's (saved) output.
            if !has_prefix {
                shared += proj_in;
            }
        }
        // MLP half.
        if mlp_live {
            if n_norms >= 2 {
                let norm2_in_live = if parallel { live_in } else { true };
                // In a parallel block `norm_2` reads the layer input `x` that `norm_1` read:
                // a LayerNorm saves that same tensor (RMSNorm saves its own fp32 copy).
                let same_input = parallel && attn_live && m.norm == NormKind::LayerNorm;
                if !same_input {
                    saved += norm(norm2_in_live);
                }
                if bnb {
                    held += width(Group::MlpIn) * s;
                }
            }
            if bnb {
                held += width(Group::MlpOut) / tp * c;
            }
            let i_act = m.active_intermediate(g.moe) / tp;
            saved += if m.gated_mlp {
                3 * c * i_act
            } else {
                c * i_act
            };
        }
        // v2: every AdapterV2Linear saves its pre-scale output.
        if v2 {
            saved += c * g
                .linears
                .iter()
                .map(|l| {
                    let mult = if l.role == LinearRole::Expert {
                        l.active
                    } else {
                        l.count
                    };
                    l.out_features * mult
                })
                .sum::<u64>()
                / tp;
        }
        (saved + held - shared, held)
    }

    /// Bytes per token of the distinct input tensors of one layer's quantized Linears (the
    /// tensors bitsandbytes' `MatMul4Bit` holds in `ctx.tensors`): the attention norm's
    /// output (shared by q/k/v and, with one shared norm, by the MLP), the attention output,
    /// the MLP norm's output and the MLP activation's output.
    fn quantized_inputs(&self, g: &LayerGroup) -> u64 {
        let h = self.m.hidden_size;
        let tp = self.tp.max(1);
        let s = self.r.stream_bytes;
        let o = self.linear_out_bytes(s);
        let shared_norm = Self::norms_per_layer(g, self.m) == 1;
        let mut bytes = 0;
        for grp in [Group::AttnIn, Group::AttnOut, Group::MlpIn, Group::MlpOut] {
            let Some(width) = group_width(g, h, grp) else {
                continue;
            };
            bytes += match grp {
                Group::AttnIn => width * s,
                Group::MlpIn if shared_norm => 0,
                Group::MlpIn | Group::Router => width * s,
                Group::AttnOut => width / tp * self.attn_bytes(o),
                Group::MlpOut => width / tp * o,
            };
        }
        bytes
    }

    /// Whether the layer's routed experts are transformers 5's stacked weights, run by
    /// `grouped_mm` ([`Job::is_module`]).
    fn stacked_experts(&self, g: &LayerGroup) -> bool {
        g.linears
            .iter()
            .any(|l| l.role == LinearRole::Expert && !self.job.is_module(l))
    }

    /// The attention module copies k and v to every head before the kernel
    /// ([`AttentionModule::TorchtuneExpandedKv`]).
    pub(super) fn expands_kv(&self) -> bool {
        self.job.stack.profile().attention_module == AttentionModule::TorchtuneExpandedKv
    }

    /// Backward transient of one layer, per token.
    fn layer_backward(&self, g: &LayerGroup) -> u64 {
        let tp = self.tp.max(1);
        let m = self.m;
        let ad = m.q_width() / tp;
        let kd = m.kv_width() / tp;
        let o = self.linear_out_bytes(self.r.stream_bytes);
        let attn = match self.job.attention {
            Attention::Flash | Attention::Sdpa => 12 * ad + 4 * kd,
            // SDPA's math kernel (litgpt): the gradients of the bf16 probabilities and of
            // the scores, and of the expanded q, k, v.
            Attention::Eager
                if self.job.stack.profile().attention_module == AttentionModule::LitgptFusedQkv =>
            {
                let b = self.attn_bytes(o);
                b * (3 * ad + 2 * (m.num_heads / tp) * self.job.seq_len)
            }
            Attention::Eager => 3 * 2 * ad + 8 * (m.num_heads / tp) * self.job.seq_len,
        };
        // Routed experts run (and back-propagate) one after another on their own tokens
        // (transformers' MoE loop over `self.experts`), so one expert's gradient buffers are
        // live at a time: top-k/E of the tokens on average.
        let mlp = match (&m.moe, g.moe) {
            // Every expert back-propagates every token at once: at `up * act`'s backward
            // the product's gradient and the two it makes (E·I each) are alive (traced,
            // `validation/oracle-traces/llama4.jsonl`).
            (Some(moe), true) if m.experts_see_every_token => {
                (3 * o * moe.num_experts * moe.expert_intermediate_size)
                    .max(3 * o * moe.shared_intermediate_size)
            }
            // transformers 5.25's `grouped_mm_experts_forward` (`integrations/moe.py`) runs
            // every routed copy at once. Its widest moment, in the recompute of a
            // checkpointed layer and again in its backward, holds three k·h tensors beyond
            // what the layer saves: the gathered inputs, the weighted outputs and their
            // re-ordered copy; in backward, the re-order's gradient and the two products of
            // the weighting's (traced, `validation/oracle-traces/hybrid.jsonl`). The shared
            // expert runs apart from them.
            (Some(moe), true) if self.stacked_experts(g) => {
                (3 * o * moe.experts_per_token * m.hidden_size)
                    .max(3 * o * moe.shared_intermediate_size)
            }
            (Some(moe), true) => {
                let e = moe.num_experts.max(1);
                3 * o * (moe.experts_per_token * moe.expert_intermediate_size).div_ceil(e)
                    + 3 * o * moe.shared_intermediate_size
            }
            _ => 3 * o * m.active_intermediate(g.moe),
        } / tp;
        attn.max(mlp) + 2 * self.r.stream_bytes * m.hidden_size
    }
}

/// The part of a full fine-tune's autocast weight cache (`cache`) alive while a layer runs
/// its backward ([`Activations::autocast_weight_cache_backward`]): under checkpointing only
/// the recomputed layer's copies (the largest layer's), else all of it. An adapter job's
/// cache is its adapters', all alive.
fn weight_cache_in_backward(model: &ModelSpec, job: &Job, cache: u64, tp: u64) -> u64 {
    if job.method == Method::Full && job.gradient_checkpointing && cache > 0 {
        let layer = model
            .layers
            .iter()
            .map(LayerGroup::layer_params)
            .max()
            .unwrap_or(0);
        (2 * layer / tp.max(1)).min(cache)
    } else {
        cache
    }
}

/// LoRA on transformers-5 stacked experts ([`Job::adapts_stacked`]), whatever the tokens:
/// `(all layers, one layer, backward transient)`. Every forward, PEFT 0.21's
/// `ParamWrapper._activate_lora` folds the adapters into a new weight of the stack's shape
/// and dtype (`_LoraFactorsProxy`: `baddbmm(W, lhs, rhs, alpha=scaling)`, cached for the
/// forward by `parametrize.cached()`), and `grouped_mm` saves it for backward, with the
/// factors cast to that dtype (`get_delta_factors`) that `baddbmm` saves; all layers keep
/// theirs, one layer at a time under checkpointing. Its gradient, one stack at a time, is
/// the backward's transient, less the merged down stack already released. The stack is 16-bit in LoRA and fp32 in QLoRA (bitsandbytes
/// does not quantize it; k-bit preparation upcasts it).
fn stacked_lora(model: &ModelSpec, job: &Job, r: &Regime, tp: u64) -> (u64, u64, u64) {
    if !job.method.is_peft() {
        return (0, 0, 0);
    }
    let w = if job.quantization == Quantization::None {
        r.frozen_bytes
    } else {
        r.unquantized_bytes
    };
    let tp = tp.max(1);
    let wrapped = |l: &&Linear| job.adapts(l) && job.adapts_stacked(l) && l.count > 1;
    let mut all = 0u64;
    let mut one = 0u64;
    let mut bwd = 0u64;
    for g in &model.layers {
        let mut layer = 0u64;
        let mut up = 0u64;
        let mut down = 0u64;
        for l in g.linears.iter().filter(wrapped) {
            let merged = l.count * l.weight_numel() * w;
            // lora_A r·E × in and lora_B out × r·E (gate and up: 2·out, `gate_up_proj`).
            let is_down = l.out_features == model.hidden_size;
            let b_rows = if is_down {
                l.out_features
            } else {
                2 * l.out_features
            };
            let factors = job.adapter.rank * l.count * (l.in_features + b_rows);
            let casts = if r.adapter_bytes == w { 0 } else { factors * w };
            layer += merged + casts;
            if is_down {
                down += merged;
            } else {
                up += merged;
            }
        }
        all += g.count * layer / tp;
        one = one.max(layer / tp);
        // Backward meets the down stack first: its gradient is new, then its saved merged
        // weight is released before the gate-up stack's gradient exists.
        bwd = bwd.max(down.max(up.saturating_sub(down)) / tp);
    }
    if job.gradient_checkpointing {
        all = 0;
    }
    (all, one, bwd)
}

/// Saved bytes of an encoder outside its layers: `(per token, per micro-batch)`.
///
/// - `BertEmbeddings`: the sum of the word, token-type and position lookups goes through
///   `LayerNorm` (saves its input in the stream dtype and fp32 mean/rstd: `s·h + 8`) and
///   dropout (a 1-byte mask); its output is the first layer's input, counted there.
/// - `BertPooler`: `dense(hidden_states[:, 0])`. Without autocast `addmm` saves that view,
///   which keeps the last layer's whole `(b, s, h)` output alive (`s·h` per token); under
///   autocast it saves its own fp16 copy of the `(b, h)` slice. RoBERTa's head drops out
///   the slice first (a new tensor). Then tanh saves its output, dropout a mask, and the
///   classifier its input: `(c + o + 1 + o)·h` per sequence, c the cast copy.
fn encoder_head(model: &ModelSpec, job: &Job, r: &Regime, enc: &EncoderSpec) -> (u64, u64) {
    let h = model.hidden_size;
    let s = r.stream_bytes;
    let o = if r.autocast { 2 } else { s };
    let full = job.method == Method::Full;
    let mut per_token = s * h + 8 + if enc.hidden_dropout { h } else { 0 };
    if enc.pooler_reads_view && full && !r.autocast {
        per_token += s * h;
    }
    let cast = if r.autocast { 2 } else { 0 };
    let per_sequence = (cast + 2 * o + u64::from(enc.hidden_dropout)) * h;
    (per_token, job.micro_batch_size * per_sequence)
}

impl Activations {
    /// Activations of `job` on `model` with tensor-parallel degree `tp`.
    #[must_use]
    pub fn new(model: &ModelSpec, job: &Job, r: &Regime, tp: u64) -> Self {
        let ctx = Ctx {
            m: model,
            job,
            r,
            tp,
        };
        if let Some(s2s) = &model.seq2seq {
            return seq2seq::activations(&ctx, s2s);
        }
        let t = job.micro_batch_size * job.seq_len;
        let h = model.hidden_size;
        // A layer's checkpoint is its input: Gemma 3n's is every AltUp stream.
        let ckpt = match &model.gemma3n {
            // fp32 under autocast ([`gemma3n`]).
            Some(g) => g.altup * if r.autocast { 4 } else { r.stream_bytes } * h,
            None => r.stream_bytes * h,
        };
        let mut all = 0u64;
        let mut one = 0u64;
        let mut bwd = 0u64;
        let mut retained = 0u64;
        // Only a step preceded by one of its own size meets these: not the first step.
        let held_by_loop = job.stack.profile().loop_keeps_previous_loss
            && r.quantized_saves_input
            && job.padding != Padding::LongestFirst;
        let adapter = job.adapter.method.is_adapter() && job.method.is_peft();
        let scope = job.stack.profile().compile;
        let mut idx = 0u64;
        for (gi, g) in model.layers.iter().enumerate() {
            if adapter {
                // lit-gpt adapters: what a layer saves depends on its index (the prefix and
                // the gate start at `adapter_start_layer`), so each layer is counted.
                for _ in 0..g.count {
                    let (layer, held) = ctx.adapter_layer(g, idx);
                    idx += 1;
                    if held_by_loop {
                        retained += held;
                    }
                    one = one.max(layer);
                    all += if job.gradient_checkpointing && layer > 0 {
                        ckpt
                    } else {
                        layer
                    };
                }
                bwd = bwd.max(ctx.layer_backward(g));
                continue;
            }
            if let Some(spec) = &model.gemma3n {
                let flags = spec
                    .groups
                    .get(gi)
                    .copied()
                    .unwrap_or(crate::model::Gemma3nGroup {
                        kv_shared: false,
                        sparse: false,
                        stores_kv: false,
                    });
                let layer = ctx.gemma3n_layer_bytes(g, flags, spec);
                one = one.max(layer);
                bwd = bwd.max(ctx.layer_backward(g) + ctx.gemma3n_backward(g));
                all += g.count
                    * if job.gradient_checkpointing {
                        ckpt
                    } else {
                        layer
                    };
                continue;
            }
            if g.attention == AttentionKind::Cross {
                // Mllama's cross-attention layers run only with images ([`cross`]).
                if ctx.cross_states_per_sample() == 0 {
                    continue;
                }
                let layer = ctx.cross_layer_bytes(g);
                one = one.max(layer);
                bwd = bwd.max(ctx.layer_backward(g) + ctx.cross_backward());
                all += g.count
                    * if job.gradient_checkpointing {
                        ckpt
                    } else {
                        layer
                    };
                continue;
            }
            if held_by_loop {
                retained += g.count * ctx.quantized_inputs(g);
            }
            // Under checkpointing transformers' layers break the compiled graph and run
            // eagerly (docs/torch-compile.md, "Gradient checkpointing under compile");
            // torchtune's compiled layers are checkpointed whole and recomputed compiled.
            let compiled_layers =
                job.compile && (!job.gradient_checkpointing || scope == CompileScope::Layers);
            let layer = match &model.encoder {
                Some(enc) => ctx.encoder_layer_bytes(g, enc),
                None if compiled_layers => ctx.compiled_layer_bytes(g),
                None if job.unsloth_kernels() => ctx.unsloth_layer_bytes(g),
                None => ctx.layer_bytes(g),
            };
            one = one.max(layer);
            bwd = bwd.max(ctx.layer_backward(g));
            all += g.count
                * if job.gradient_checkpointing {
                    ckpt
                } else {
                    layer
                };
        }
        // Offloading moves each checkpoint to host memory once the stream has copied it.
        if let Some(on_gpu) = checkpoints_on_gpu(model, job) {
            all = all.min(on_gpu * ckpt);
        }
        // Final norm: fp32 copy; trainable weight saves `normed`; lm_head's input is saved
        // when lm_head is trainable (and cast per autocast from an fp32 stream).
        let full = job.method == Method::Full;
        // With Liger's RMSNorm the final norm saves its input and an fp32 `rstd` per row.
        let final_norm =
            if (job.liger.rms_norm || job.unsloth_kernels()) && model.norm == NormKind::RmsNorm {
                r.stream_bytes * h + 4
            } else {
                4 * h + if full { r.stream_bytes * h } else { 0 }
            };
        let mut head = if job.compile && scope == CompileScope::Model {
            ctx.compiled_head_bytes()
        } else {
            final_norm
                + if full { 2 * h } else { 0 }
                + model.gemma3n.as_ref().map_or(0, |g| ctx.gemma3n_outside(g))
        };
        let mut head_fixed = 0u64;
        if adapter && job.adapter.method == PeftKind::AdapterV2 {
            // v2: `ln_f` is trainable (RMSNorm saves the fp32 `x_normed` for its weight), and
            // `lm_head` is an `AdapterV2Linear` whose mul saves the pre-scale logits, each
            // 128-token chunk's until its backward (`lit_gpt/adapter_v2.py`).
            if model.norm == NormKind::RmsNorm {
                head += 4 * h;
            }
            head += ctx.linear_out_bytes(r.stream_bytes) * model.vocab_size / tp.max(1);
        } else if let Some(enc) = &model.encoder {
            (head, head_fixed) = encoder_head(model, job, r, enc);
        }
        if r.quantize_lm_head && r.quantized_saves_input {
            head += r.compute_bytes * h;
            if held_by_loop {
                retained += r.compute_bytes * h;
            }
        }
        if r.frozen_fp32_head && r.autocast {
            // Frozen fp32 lm_head under autocast: `mm` saves the uncached bf16 weight copy
            // for its input's gradient; the bf16 cast of the input is not saved (the frozen
            // weight needs no gradient) and is freed once the logits exist (memory-anatomy
            // §3.3).
            head_fixed += 2 * model.vocab_size * h;
        }
        let autocast_weight_cache = if full && r.autocast_weight_copies && r.param_bytes == 4 {
            // bf16 copies of every matmul weight (lm_head included, embedding excluded).
            let mm = r.trainable_params - model.embedding_params()
                + if model.tie_word_embeddings {
                    model.embedding_params()
                } else {
                    0
                };
            let mm = match &model.encoder {
                // Encoders: every Linear of the layers plus pooler and classifier; the word,
                // position and token-type embeddings and the LayerNorms are no matmul.
                Some(enc) => model.linear_params() + enc.head_params(h),
                None => mm,
            };
            2 * mm / tp
        } else if job.method.is_peft() && r.autocast && r.frozen_bytes == 4 && !r.bnb_lora_layer {
            // Frozen fp32 weights under autocast are cast to bf16 at every matmul without
            // caching (autocast caches only leaves that require grad), and `mm` saves that
            // copy because its input requires grad: 2 B per frozen matmul parameter, for
            // every layer (one layer at a time under checkpointing), plus lm_head.
            let linears: u64 = model
                .layers
                .iter()
                .map(|g| {
                    g.linears
                        .iter()
                        .map(|l| l.count * l.weight_numel())
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0);
            let layers = if job.gradient_checkpointing {
                linears
            } else {
                model
                    .layers
                    .iter()
                    .map(|g| {
                        g.count
                            * g.linears
                                .iter()
                                .map(|l| l.count * l.weight_numel())
                                .sum::<u64>()
                    })
                    .sum()
            };
            // litgpt runs lm_head once per 128-token chunk (`lm_head_chunk_size=128`): every
            // chunk casts the frozen weight again and its `mm` saves that copy until the
            // chunk's backward, so there are as many copies as chunks.
            let head_copies = job
                .stack
                .profile()
                .lm_head_chunk_tokens
                .map_or(1, |c| job.seq_len.div_ceil(c).max(1));
            let head_weight = if model.encoder.is_some() {
                0
            } else {
                model.vocab_size * h * head_copies
            };
            2 * (layers + head_weight) / tp + 2 * r.trainable_params / tp
        } else if job.method.is_peft() && r.autocast && r.adapter_bytes == 4 {
            2 * r.trainable_params / tp
        } else {
            0
        };
        let autocast_weight_cache_backward =
            weight_cache_in_backward(model, job, autocast_weight_cache, tp);
        // LoHa builds each targeted Linear's ΔW = (w1a·w1b) ⊙ (w2a·w2b) · scale (`HadaWeight`)
        // every forward and `F.linear(x, ΔW)` saves it: out × in per module and layer,
        // whatever the tokens (recomputed one layer at a time under
        // checkpointing). `HadaWeight.backward` holds the incoming ΔW gradient, its scaled
        // copy, a factor product and `temp`: four more for the widest module.
        //
        // OFT's Cayley–Neumann series (`OFTRotationModule._cayley_batch`, 5 terms) leaves
        // saved, per targeted Linear: the skew-symmetric `Q_skew`, `Q_squared` and one more
        // power (inputs of the next `bmm`s) and the rotation R (saved by the `einsum`): four
        // r × b × b tensors, b = in / r.
        //
        // Under autocast the ΔW `F.linear` saves is 16-bit: LoHa's products are, and LoKr's
        // fp32 `kron` (its fp32 `lokr_w1` promotes it) is cast by autocast, which saves that
        // copy; `kron` also saves `lokr_w2_a @ lokr_w2_b` for `lokr_w1`'s gradient (PEFT
        // 0.21.2 `tuners/lokr/layer.py` `make_kron`).
        let ab = r.adapter_bytes;
        let db = delta_weight_bytes(r);
        let boft = Boft::new(job, r);
        let fixed = |l: &Linear| -> u64 {
            match job.adapter.method {
                PeftKind::Boft => boft.saved(l),
                PeftKind::LoHa => l.weight_numel() * db,
                PeftKind::LoKr => {
                    let ((_, b), (_, d)) =
                        super::weights::lokr_factors(l, job.adapter.decompose_factor);
                    let w2 = if super::weights::lokr_w2_factored(job.adapter.rank, b, d) {
                        b * d * db
                    } else {
                        0
                    };
                    l.weight_numel() * db + w2
                }
                PeftKind::Oft => 4 * l.in_features * (l.in_features / job.adapter.rank.max(1)) * ab,
                PeftKind::Lora if job.adapter.dora => super::dora::saved_per_module(job, r, l),
                _ => 0,
            }
        };
        let per_module_saves = match job.adapter.method {
            PeftKind::LoHa | PeftKind::LoKr | PeftKind::Oft | PeftKind::Boft => true,
            PeftKind::Lora => job.adapter.dora,
            _ => false,
        };
        let (delta_all, delta_one, delta_bwd) = if job.method.is_peft() && per_module_saves {
            let per_layer = |g: &LayerGroup| -> u64 {
                g.linears
                    .iter()
                    .filter(|l| job.adapts(l))
                    .map(|l| l.count * fixed(l))
                    .sum::<u64>()
                    / tp.max(1)
            };
            let widest = model
                .layers
                .iter()
                .flat_map(|g| g.linears.iter())
                .filter(|l| job.adapts(l))
                .map(|l| l.weight_numel() * ab / tp.max(1))
                .max()
                .unwrap_or(0);
            let one = model.layers.iter().map(per_layer).max().unwrap_or(0);
            let all = if job.gradient_checkpointing {
                0
            } else {
                let unsaved = first_layer_unsaved(model, job, h, |l| {
                    l.count
                        * if job.adapter.method == PeftKind::Boft {
                            boft.rotation(l)
                        } else {
                            fixed(l)
                        }
                });
                model
                    .layers
                    .iter()
                    .map(|g| g.count * per_layer(g))
                    .sum::<u64>()
                    .saturating_sub(unsaved / tp.max(1))
            };
            let bwd = match job.adapter.method {
                PeftKind::LoHa => 4 * widest,
                // `kron`'s backward (`rebuild * scale`, then the two broadcast products
                // it reduces): the incoming ΔW gradient, its scaled copy and one product.
                PeftKind::LoKr => 3 * widest,
                PeftKind::Boft => boft.backward_transient(model, job),
                _ => 0,
            };
            (all, one, bwd)
        } else {
            (0, 0, 0)
        };
        let (stacked_all, stacked_one, stacked_bwd) = stacked_lora(model, job, r, tp);
        // Prefix tuning's keys and values, per sequence and layer (every layer's under
        // checkpointing too: the cache holds them until the forward ends).
        let prefix_kv = job.micro_batch_size * ctx.prefix_kv_per_sequence();
        let delta_all = delta_all + stacked_all;
        let delta_one = delta_one + stacked_one;
        let delta_bwd = delta_bwd.max(stacked_bwd);
        Self {
            all: all * t + delta_all + model.num_layers * prefix_kv,
            one_layer: one * t + delta_one + prefix_kv,
            checkpoint_one: ckpt * t,
            head: head * t + head_fixed / tp,
            autocast_weight_cache,
            autocast_weight_cache_backward,
            layer_backward_transient: (bwd * t).max(delta_bwd),
            previous_step_quantized_inputs: retained * t,
        }
    }

    /// Saved bytes of all layers (checkpoints only under gradient checkpointing).
    #[must_use]
    pub const fn all_layers(&self) -> u64 {
        self.all
    }
}
