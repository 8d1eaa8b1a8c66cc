//! A Llama-style decoder layer op by op (LoRA and QLoRA adapters, or every weight trained),
//! as the step trace allocates it ([`super::step`]): transformers 5.25
//! `LlamaDecoderLayer.forward` (`LlamaRMSNorm`, `apply_rotary_pos_emb`, the attention —
//! SDPA's flash kernel, flash-attn 2.8's, SDPA's math kernel where the GPU has no flash
//! backend, or eager —, `LlamaMLP`) with PEFT 0.21 `lora.Linear.forward` (fp32 adapters under
//! bf16 autocast, with or without dropout, or on a bf16 model without autocast), and the
//! backward autograd runs for it, in the order the fake-CUDA oracle records
//! (`calibration/step_events.py --desc`).
//!
//! Each adapted projection makes its frozen matmul's output, PEFT's fp32 cast of the input
//! (`_cast_input_dtype`), dropout's output and mask, autocast's 16-bit copies of `lora_A`
//! and `lora_B` and its 16-bit cast of that input, the two adapter matmuls, the scaling and
//! the sum (without autocast every adapter tensor is fp32 and the sum is cast back). Its backward
//! computes the adapter branch first (the scaled gradient, `lora_B`'s and `lora_A`'s weight
//! gradients and their fp32 casts, the input gradient through both casts), then the frozen
//! matmul's input gradient; gradients reaching one tensor from several modules are summed
//! out of place as they arrive (autograd's input buffer). The same forward runs three ways:
//! with autograd (its saved tensors kept), under `no_grad` (checkpointing's first forward:
//! each tensor freed at its last use) and as non-reentrant checkpointing's recompute,
//! which stops once the last saved tensor exists (`torch.utils.checkpoint`, early stop).
//!
//! On bitsandbytes 4-bit weights (classic QLoRA: PEFT's `prepare_model_for_kbit_training`
//! leaves the residual stream and the norms fp32) each projection is bitsandbytes 0.50
//! `Linear4bit` under PEFT 0.21 `lora.bnb.Linear4bit` ([`four_bit_forward`]): the input's
//! cast to bf16, the weight dequantized around the matmul (in the backward too), the output
//! cast back and cloned; SDPA reads autocast's bf16 casts of q, k and v. As TRL's
//! `SFTTrainer` prepares them (TRL f2cd577: no preparation, the adapters cast to bf16) the
//! stream is bf16, nothing is cast, and `lora_A` saves its 16-bit input itself. Where the
//! stack makes the input embeddings require grad under checkpointing (TRL's
//! `enable_input_require_grads`), the first layer computes its input's gradient too.
//!
//! Prompt tuning (PEFT 0.21 `PeftModelForCausalLM.forward`: the prompt's embedding
//! concatenated before the sequence's) runs the same layer with no adapter, over the
//! prompt's tokens too; the layer's input needs a gradient from the first layer on.
//!
//! On a 16-bit stream the model's final norm runs op by op too ([`final_norm_forward`]),
//! its backward from lm_head's input gradient before the last layer's.
//!
//! IA³ (PEFT 0.21 `ia3.Linear.forward`, fp32 `ia3_l`) scales a projection's output, or a
//! feedforward module's input, by `1 * ia3_l`: 16-bit activations times the fp32 vector make
//! fp32 products, cast back to 16 bits ([`scaled_forward`], [`Backward::scaled_linear`]).
//! Where no adapter or scaling trains in q's or k's projection, a layer whose input needs no
//! gradient drops the attention kernel's gradient of it at once.
//!
//! VeRA (PEFT 0.21 `vera.Linear.forward`, fp32 vectors and shared matrices, under autocast)
//! runs each adapted projection's input through autocast's copies of the sliced shared
//! matrices and scales each matmul's output by its fp32 vector ([`vera_forward`],
//! [`Backward::vera_linear`]).
//!
//! Liger's kernels (liger-kernel 0.8.5, as the Trainer applies them) replace the norms, RoPE
//! and the MLP's activation: `LigerRMSNorm` saves its input itself and writes the input's
//! gradient into the incoming one, RoPE rotates q and k in place, and SwiGLU writes its
//! gradients into the gate's and up's saved outputs.
//!
//! A full fine-tune of a bf16 model without autocast runs the same layer with every
//! projection and norm trainable and no adapters: each projection saves its 16-bit input for
//! its weight's gradient, each norm its 16-bit cast, and the backward makes each weight's
//! gradient where `MmBackward` (or, with a bias, `AddmmBackward`) does.
//!
//! Cut this way, the replayed reserve of the H200's LoRA runs follows the oracle's
//! (`crates/moro-core/tests/step_trace.rs`), which the coarser cut of the layer's saved
//! bytes did not: its temporaries (a 16-bit projection input's fp32 copy is twice the
//! input) are what later tensors split.

use crate::job::{Attention, Job, Method, Padding, PeftKind, Quantization};
use crate::model::{AttentionKind, ModelSpec, NormKind};

use super::super::weights::{self, NF4_BLOCK};
use super::super::{Component, DeviceProfile, Regime};
use super::params::Param;
use super::{Builder, Tensor};

/// The seven projections in forward order (the default LoRA targets).
const NAMES: [&str; 7] = crate::job::DEFAULT_TARGETS;
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const O: usize = 3;
const GATE: usize = 4;
const UP: usize = 5;
const DOWN: usize = 6;

/// Whether the op-level layer models `job`'s decoder layers: LoRA without DoRA with fp32
/// adapters, on unquantized 16-bit weights (under bf16 autocast, or without it and without
/// dropout; SDPA, flash-attn or eager attention) or on bitsandbytes 4-bit weights under
/// bf16 autocast with SDPA or flash-attn, after PEFT's `prepare_model_for_kbit_training`
/// (classic QLoRA) or as TRL prepares them (bf16 stream, norms and adapters); prompt
/// tuning on unquantized 16-bit weights (its embedding in any dtype: no layer reads it); IA³
/// with fp32 vectors on unquantized 16-bit weights; or
/// a full fine-tune of a bf16 model without autocast (SDPA, flash-attn or eager); and a
/// Llama, Mistral, Qwen2 or Qwen3 layer (RMSNorm, the seven projections one Linear each, q,
/// k or v adapted).
#[must_use]
pub(super) fn models(model: &ModelSpec, job: &Job, r: &Regime) -> bool {
    let frozen_16_bit = job.method == Method::Adapters
        && job.quantization == Quantization::None
        && r.stream_bytes == 2
        && r.frozen_bytes == 2
        && matches!(
            job.attention,
            Attention::Sdpa | Attention::Flash | Attention::Eager
        );
    let dense = frozen_16_bit && r.adapter_bytes == 4;
    // Classic QLoRA: fp32 stream, norms and adapters after `prepare_model_for_kbit_training`;
    // TRL's: no preparation, the stream and norms bf16, the adapters cast to bf16.
    let classic =
        r.kbit_prepare && r.stream_bytes == 4 && r.unquantized_bytes == 4 && r.adapter_bytes == 4;
    let trl =
        !r.kbit_prepare && r.stream_bytes == 2 && r.unquantized_bytes == 2 && r.adapter_bytes == 2;
    let four_bit = job.method == Method::QuantizedAdapters
        && matches!(
            job.quantization,
            Quantization::Nf4 | Quantization::Nf4Dq | Quantization::Fp4 | Quantization::Fp4Dq
        )
        && (classic || trl)
        && r.bnb_lora_layer
        && !r.quantized_saves_input
        && r.dequant_bytes == 2
        && !r.quantize_lm_head
        && r.autocast
        && matches!(job.attention, Attention::Sdpa | Attention::Flash);
    // A full fine-tune of a bf16 model without autocast (every Linear and norm trains).
    let full = job.method == Method::Full
        && job.quantization == Quantization::None
        && r.param_bytes == 2
        && r.stream_bytes == 2
        && !r.autocast
        && matches!(
            job.attention,
            Attention::Sdpa | Attention::Flash | Attention::Eager
        );
    let lora = (dense || four_bit)
        && job.adapter.method == PeftKind::Lora
        && !job.adapter.dora
        && (r.autocast || job.adapter.dropout == 0.0)
        && model
            .layers
            .first()
            .is_some_and(|g| g.linears.iter().take(3).any(|l| job.adapts(l)));
    // Prompt tuning: the frozen layers, whose input (the prompt's embedding and the
    // sequence's) needs a gradient from the first layer on.
    let prompt = frozen_16_bit && job.adapter.method == PeftKind::PromptTuning;
    // IA³ with fp32 vectors: `mul` promotes the 16-bit activations to fp32 and `.to` casts
    // them back, under autocast or without it (neither op is on its lists).
    let ia3 = frozen_16_bit && r.adapter_bytes == 4 && job.adapter.method == PeftKind::Ia3;
    // VeRA with fp32 vectors and shared matrices under autocast.
    let vera =
        frozen_16_bit && r.adapter_bytes == 4 && r.autocast && job.adapter.method == PeftKind::Vera;
    // Liger's RMSNorm, SwiGLU and RoPE (liger-kernel 0.8.5, the Trainer's instance patch)
    // are traced under LoRA, QLoRA and full fine-tunes; under the other methods the layers
    // stay coarse.
    let liger = job.liger.rms_norm || job.liger.glu || job.liger.rope;
    (lora || full || !liger && (prompt || ia3 || vera))
        && job.padding == Padding::Packed
        && llama_style(model)
}

/// Whether `model`'s decoder layers are transformers' Llama, Mistral, Qwen2 or Qwen3 layer:
/// RMSNorm, the seven projections one Linear each, RoPE by halves, dense, full or sliding
/// attention. OLMo-2's post-norms and whole-width q/k norms, Granite's multipliers and
/// SmolLM3's layers without RoPE run other ops.
#[must_use]
pub(super) fn llama_style(model: &ModelSpec) -> bool {
    matches!(
        model.model_type.as_str(),
        "llama" | "mistral" | "qwen2" | "qwen3"
    ) && model.norm == NormKind::RmsNorm
        && model.gated_mlp
        && !model.rope_by_concat
        && !model.fp32_norms
        && !model.attention_output_gate
        && !model.attn_softcapping
        && !model.attention_sinks
        && model.mla.is_none()
        && model.num_heads.is_multiple_of(model.num_kv_heads.max(1))
        && model.layers.iter().all(|g| {
            !g.moe
                && matches!(
                    g.attention,
                    AttentionKind::Full | AttentionKind::Sliding { .. }
                )
                && g.linears.len() == NAMES.len()
                && g.linears
                    .iter()
                    .zip(NAMES)
                    .all(|(l, n)| l.name == n && l.count == 1)
        })
}

/// What a tensor of the forward is to the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Freed in the forward.
    Temp,
    /// Kept for the backward when autograd records; else freed at its last use.
    Saved,
    /// Autocast's copy of an fp32 weight: cached until the forward leaves autocast, and
    /// kept for the backward when autograd records.
    Cached,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Alloc {
        bytes: u64,
        name: &'static str,
        module: Option<usize>,
        kind: Kind,
    },
    Free(usize),
    /// The last use of a saved tensor in the forward.
    Release(usize),
    /// An op saves a parameter (a frozen matmul's weight) before it computes: where the
    /// last save is one, checkpointing's recompute stops there.
    Pack,
}

/// The SMs liger-kernel's RMSNorm backward gives a row of partial weight gradients each
/// (`sm_count`, `ops/rms_norm.py`): an H100 SXM's or H200's 132 (an H100 PCIe has 114, an
/// A100 108, an RTX 4090 128; the rows are fp32, 4·h bytes each, freed within the norm's
/// backward).
const LIGER_SM_COUNT: u64 = 132;

/// One layer's forward as events over numbered tensors.
#[derive(Debug, Default)]
struct Tape {
    evs: Vec<Ev>,
    kinds: Vec<Kind>,
}

impl Tape {
    fn alloc(
        &mut self,
        bytes: u64,
        name: &'static str,
        module: Option<usize>,
        kind: Kind,
    ) -> usize {
        self.evs.push(Ev::Alloc {
            bytes,
            name,
            module,
            kind,
        });
        self.kinds.push(kind);
        self.kinds.len() - 1
    }
    fn temp(&mut self, bytes: u64, name: &'static str) -> usize {
        self.alloc(bytes, name, None, Kind::Temp)
    }
    fn saved(&mut self, bytes: u64, name: &'static str, module: Option<usize>) -> usize {
        self.alloc(bytes, name, module, Kind::Saved)
    }
    fn free(&mut self, i: usize) {
        self.evs.push(Ev::Free(i));
    }
    fn release(&mut self, i: usize) {
        debug_assert!(
            self.kinds[i] != Kind::Temp,
            "a temporary is freed, not released"
        );
        self.evs.push(Ev::Release(i));
    }
    fn pack(&mut self) {
        self.evs.push(Ev::Pack);
    }
    /// The last use of `i` in the forward: a temporary is freed, a saved tensor released.
    fn last_use(&mut self, i: usize) {
        if self.kinds[i] == Kind::Temp {
            self.free(i);
        } else {
            self.release(i);
        }
    }
}

/// How a layer's forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Autograd records: saved tensors and autocast's copies are kept.
    Grad,
    /// `no_grad` (checkpointing's first forward): every tensor freed at its last use,
    /// autocast's copies cached.
    NoGrad,
    /// Non-reentrant checkpointing's recompute: as [`Mode::Grad`] until the last saved
    /// tensor exists; the temporaries still live then are freed.
    Recompute,
}

/// The saved tensors of one adapted projection.
#[derive(Debug, Clone, Copy)]
struct Adapter {
    /// Autocast's 16-bit copy of `lora_A` (none without autocast).
    a_copy: Option<usize>,
    /// The input's cast `lora_A` reads (16-bit under autocast, else fp32); none where it
    /// reads a 16-bit input as is (a 4-bit layer's).
    x: Option<usize>,
    /// `lora_A`'s output.
    a_out: usize,
    /// Autocast's 16-bit copy of `lora_B` (none without autocast).
    b_copy: Option<usize>,
    /// Dropout's mask, where the input needs a gradient.
    mask: Option<usize>,
}

/// Where IA³ scales a projection (PEFT 0.21 `ia3.Linear.forward`): its output, or, on a
/// feedforward module, its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    Output,
    Input,
}

/// The saved tensors of a projection IA³ scales.
#[derive(Debug, Clone, Copy)]
struct Scaled {
    scale: Scale,
    /// `1 * ia3_l`, saved where the scaled tensor needs a gradient.
    scaling: usize,
    /// What `mul` saves for the scaling's gradient: the frozen matmul's output, or the
    /// input's fp32 copy.
    operand: usize,
    saves_scaling: bool,
}

/// The saved tensors of a projection VeRA adapts ([`vera_forward`]).
#[derive(Debug, Clone, Copy)]
struct Veraed {
    /// Autocast's 16-bit copy of the sliced `vera_A` (kept where the input needs a gradient).
    a: usize,
    /// `vera_A`'s output, kept for `λd`'s gradient.
    a_out: usize,
    /// Autocast's 16-bit copy of the sliced `vera_B`, kept for `λd`'s path.
    b: usize,
    /// `vera_B`'s output, kept for `λb`'s gradient.
    b_out: usize,
}

/// The saved tensors of the projections' adapters, by projection.
#[derive(Debug, Default)]
struct Modules {
    adapters: [Option<Adapter>; 7],
    scaled: [Option<Scaled>; 7],
    vera: [Option<Veraed>; 7],
}

/// What the attention kernel saves.
#[derive(Debug, Clone, Copy)]
enum Attn {
    /// SDPA's flash kernel or the flash-attn package's: its output and log-sum-exp (q, k
    /// and v too, or their 16-bit casts on an fp32 stream), and flash-attn's RNG state.
    Flash {
        out: usize,
        lse: usize,
        rng: Option<usize>,
        casts: Option<(usize, usize, usize)>,
    },
    /// SDPA's math kernel: its scaled q and k, the repeated v and the fp32 softmax.
    Math {
        /// The scaled q as the scores' matmul saved it (its contiguous copy with more than
        /// one sequence).
        qs: usize,
        ks: usize,
        v_rep: usize,
        softmax: usize,
    },
    /// Eager attention: k and v as the products read them (`repeat_kv`'s copies with
    /// grouped KV heads), the fp32 softmax and its 16-bit cast (q too).
    Eager {
        q: usize,
        k_rep: usize,
        v_rep: usize,
        soft: usize,
        probs: usize,
    },
}

/// Where the backward finds what the forward saved.
#[derive(Debug, Clone, Copy)]
struct Roles {
    /// The input norm's fp32 input and `rsqrt` (none in the first layer, whose input needs
    /// no gradient).
    norm1: Option<NormKept>,
    norm2: NormKept,
    /// Qwen3's q and k norms: their fp32 inputs and `rsqrt`, where kept.
    qk_norms: [Option<NormKept>; 2],
    adapters: [Option<Adapter>; 7],
    scaled: [Option<Scaled>; 7],
    vera: [Option<Veraed>; 7],
    /// The 16-bit input each projection saves as is and releases in its backward.
    inputs: [Option<usize>; 7],
    v: usize,
    q_rot: usize,
    k_rot: usize,
    attention: Attn,
    gate: usize,
    /// The activation's output (none under Liger's SwiGLU, which recomputes it).
    act: Option<usize>,
    up: usize,
    output: usize,
}

/// A layer's shapes.
#[derive(Debug, Clone, Copy)]
struct Dims {
    /// Tokens of a micro-batch.
    t: u64,
    b: u64,
    s: u64,
    h: u64,
    q: u64,
    kv: u64,
    i: u64,
    heads: u64,
    head_dim: u64,
    rank: u64,
    /// LoRA adapts the projection.
    adapted: [bool; 7],
    /// IA³ scales the projection.
    scales: [Option<Scale>; 7],
    /// VeRA adapts the projection.
    vera: [bool; 7],
    /// LoRA's dropout is on (`lora_dropout > 0`).
    dropout: bool,
    /// bf16 autocast (else fp32 adapters on a 16-bit model).
    autocast: bool,
    /// Autocast casts fp32 adapters to 16 bits (else they are 16-bit themselves, as TRL
    /// casts a quantized model's trainable parameters).
    adapter_copies: bool,
    /// Eager attention (else SDPA's flash kernel, or flash-attn's with [`Self::flash_attn`]).
    eager: bool,
    /// transformers' `flash_attention_2`: the flash-attn package's kernel.
    flash_attn: bool,
    /// SDPA's math kernel ([`DeviceProfile::flash_sdpa`] false, grouped KV heads): q, k
    /// and v upcast to fp32, the scores and softmax materialized.
    math: bool,
    /// Per-head RMSNorms on q and k (Qwen3).
    qk_norm: bool,
    /// Bytes per element of the residual stream and the norms' outputs: 2, or 4 after
    /// PEFT's `prepare_model_for_kbit_training` casts the embedding and the norms to fp32.
    stream: u64,
    /// The frozen projections are bitsandbytes 4-bit layers ([`FourBit`]).
    four_bit: Option<FourBit>,
    /// A full fine-tune: every projection and norm trains, no adapters.
    full: bool,
    /// Each projection has a bias (Qwen2's q, k and v).
    bias: [bool; 7],
    /// Liger's `LigerRMSNorm` on every norm (Qwen3's q and k norms too).
    liger_norm: bool,
    /// Liger's `LigerSiLUMulFunction` in the MLP.
    liger_glu: bool,
    /// Liger's RoPE, rotating q and k in place.
    liger_rope: bool,
    /// The first layer's input is a leaf: under PEFT the embedding's output made to require
    /// a gradient (`enable_input_require_grads`), not a full fine-tune's (the embedding's
    /// backward made it) or prompt tuning's (the prompt's concatenation made it).
    leaf_input: bool,
}

/// bitsandbytes 0.50 `Linear4bit` under PEFT 0.21 `lora.bnb.Linear4bit`.
#[derive(Debug, Clone, Copy)]
struct FourBit {
    /// Double quantization: the absmax constants are 8-bit, dequantized to fp32 first.
    nested: bool,
}

impl FourBit {
    /// The fp32 absmax of a `numel`-element weight (one per 64-element block), made when a
    /// nested weight is dequantized.
    const fn absmax(self, numel: u64) -> u64 {
        if self.nested {
            4 * numel.div_ceil(NF4_BLOCK)
        } else {
            0
        }
    }
}

impl Dims {
    /// Attention's gradients come in the (batch, heads, tokens) layout (eager attention and
    /// SDPA's math kernel), which the projections' backward copies contiguous.
    const fn heads_first(&self) -> bool {
        self.eager || self.math
    }
    /// Projection `m`'s output needs a gradient even where its input needs none: an adapter
    /// or a scaling trains in it.
    const fn trains_in(&self, m: usize) -> bool {
        self.adapted[m] || self.scales[m].is_some() || self.vera[m]
    }
    const fn width_in(&self, m: usize) -> u64 {
        match m {
            O => self.q,
            DOWN => self.i,
            _ => self.h,
        }
    }
    const fn width_out(&self, m: usize) -> u64 {
        match m {
            Q => self.q,
            K | V => self.kv,
            GATE | UP => self.i,
            _ => self.h,
        }
    }
}

/// The layer's forward program, once for the first layer and once for the rest.
#[derive(Debug)]
pub(super) struct DecoderLayer {
    d: Dims,
    first: (Tape, Roles),
    rest: (Tape, Roles),
    /// Each layer's `lora_A` and `lora_B` per projection (a VeRA module's `λb` and `λd`),
    /// indices into the step's parameters.
    params: Vec<[Option<(usize, usize)>; 7]>,
    /// Each layer's IA³ `ia3_l` per projection.
    scalings: Vec<[Option<usize>; 7]>,
    /// Each layer's trainable weights of a full fine-tune.
    trained: Vec<Trained>,
    /// The final norm's program, on a 16-bit stream.
    head: Option<(Tape, NormKept, usize)>,
}

/// A full fine-tune's weights of one layer, indices into the step's parameters: each
/// projection's (its bias with it) and the two norms'.
#[derive(Debug, Clone, Copy, Default)]
struct Trained {
    linears: [Option<usize>; 7],
    norms: [Option<usize>; 2],
}

/// What an RMSNorm keeps for its backward: its fp32 input (none where that is the layer's
/// input, owned by the step), `rsqrt`, and the 16-bit cast its trainable weight multiplies.
#[derive(Debug, Clone, Copy)]
struct NormKept {
    x: Option<usize>,
    rsqrt: usize,
    cast: Option<usize>,
}

/// `LlamaRMSNorm` over `w`-wide rows (`rows` statistics: one a token, or one a token and
/// head for Qwen3's q and k norms), its fp32 input and `rsqrt` kept where `keep`. On an
/// fp32 stream with an fp32 weight the input is not cast (`input`: its tape number, none
/// for the layer's input) and the output is fp32. The output is of `out` kind.
fn rms_forward(
    tp: &mut Tape,
    d: &Dims,
    keep: bool,
    w: u64,
    rows: u64,
    input: Option<usize>,
    out_kind: Kind,
) -> (Option<NormKept>, usize) {
    let th = d.t * w;
    let kind = if keep { Kind::Saved } else { Kind::Temp };
    if d.liger_norm {
        // liger-kernel 0.8.5 `rms_norm_forward`: `Y` in the input's dtype, then `RSTD`, fp32,
        // one a row; `LigerRMSNormFunction` saves the input itself and `RSTD`.
        let out = tp.alloc(d.stream * th, "LigerRMSNorm output", None, out_kind);
        let rstd = tp.alloc(4 * rows, "LigerRMSNorm rstd", None, kind);
        tp.last_use(rstd);
        let kept = NormKept {
            x: input,
            rsqrt: rstd,
            cast: None,
        };
        return (keep.then_some(kept), out);
    }
    if d.stream == 4 {
        let pow = tp.temp(4 * th, "RMSNorm pow");
        let mean = tp.temp(4 * rows, "RMSNorm mean");
        tp.free(pow);
        let rsqrt = tp.alloc(4 * rows, "RMSNorm rsqrt", None, kind);
        let normed = tp.temp(4 * th, "RMSNorm product");
        tp.last_use(rsqrt);
        let out = tp.alloc(4 * th, "RMSNorm output", None, out_kind);
        tp.free(normed);
        tp.free(mean);
        let kept = NormKept {
            x: input,
            rsqrt,
            cast: None,
        };
        return (keep.then_some(kept), out);
    }
    let x32 = tp.alloc(4 * th, "RMSNorm input fp32", None, kind);
    let pow = tp.temp(4 * th, "RMSNorm pow");
    let mean = tp.temp(4 * rows, "RMSNorm mean");
    tp.free(pow);
    let rsqrt = tp.alloc(4 * rows, "RMSNorm rsqrt", None, kind);
    let normed = tp.temp(4 * th, "RMSNorm product");
    tp.last_use(rsqrt);
    tp.last_use(x32);
    // A trainable weight's `mul` saves the cast for the weight's gradient.
    let trains = d.full && keep;
    let cast_kind = if trains { Kind::Saved } else { Kind::Temp };
    let cast = tp.alloc(2 * th, "RMSNorm cast", None, cast_kind);
    let out = tp.alloc(2 * th, "RMSNorm output", None, out_kind);
    tp.last_use(cast);
    tp.free(normed);
    tp.free(mean);
    let kept = NormKept {
        x: Some(x32),
        rsqrt,
        cast: trains.then_some(cast),
    };
    (keep.then_some(kept), out)
}

/// One projection on `x`: its output (of `kind`); an adapter's or a scaling's saved tensors
/// go to `saves`. `needs_input`: its input needs a gradient (dropout's mask is then saved).
fn linear_forward(
    tp: &mut Tape,
    d: &Dims,
    m: usize,
    kind: Kind,
    needs_input: bool,
    saves: &mut Modules,
) -> usize {
    if let Some(q4) = d.four_bit {
        let (y, a) = four_bit_forward(tp, d, q4, m, kind, needs_input);
        saves.adapters[m] = a;
        return y;
    }
    if let Some(scale) = d.scales[m] {
        let (y, scaled) = scaled_forward(tp, d, m, scale, kind, needs_input);
        saves.scaled[m] = Some(scaled);
        return y;
    }
    if d.vera[m] {
        let (y, veraed) = vera_forward(tp, d, m, kind, needs_input);
        saves.vera[m] = Some(veraed);
        return y;
    }
    let (i, o, r, t) = (d.width_in(m), d.width_out(m), d.rank, d.t);
    if !d.adapted[m] {
        if needs_input {
            tp.pack();
        }
        return tp.alloc(2 * t * o, "projection output", Some(m), kind);
    }
    let base = tp.alloc(2 * t * o, "frozen matmul output", Some(m), Kind::Temp);
    if !d.autocast {
        // fp32 adapters on a 16-bit model, no autocast: `lora_A` reads the fp32 cast
        // itself, every adapter tensor is fp32, and the sum (16-bit + fp32 promotes to
        // fp32) is cast back to the model's dtype (`result.to(torch_result_dtype)`).
        let x = tp.saved(4 * t * i, "LoRA input fp32", Some(m));
        let a_out = tp.saved(4 * t * r, "lora_A output", Some(m));
        let b_out = tp.temp(4 * t * o, "lora_B output");
        tp.release(a_out);
        let scaled = tp.temp(4 * t * o, "LoRA scaled");
        tp.free(b_out);
        let sum = tp.temp(4 * t * o, "LoRA sum");
        tp.free(scaled);
        tp.free(base);
        tp.release(x);
        let y = tp.alloc(2 * t * o, "LoRA sum cast", Some(m), kind);
        tp.free(sum);
        saves.adapters[m] = Some(Adapter {
            a_copy: None,
            x: Some(x),
            a_out,
            b_copy: None,
            mask: None,
        });
        return y;
    }
    let x32 = tp.alloc(4 * t * i, "LoRA input fp32", Some(m), Kind::Temp);
    let (saved, scaled) = autocast_adapter(tp, d, m, 4, needs_input);
    let y = tp.alloc(2 * t * o, "LoRA sum", Some(m), kind);
    tp.free(scaled);
    tp.free(base);
    tp.free(x32);
    saves.adapters[m] = Some(saved);
    y
}

/// Projection `m` under PEFT 0.21 `ia3.Linear.forward` with an fp32 `ia3_l`: the scaling
/// `1 * ia3_l` first, then on the output the frozen matmul, its fp32 product with the
/// scaling (`mul` promotes) and the cast back (`.to(result_dtype)`), the product and then
/// the matmul's output dropped (`result` reassigned), the scaling at the return; on the
/// input (a feedforward module) the input's fp32 copy (`x.to(ia3_l.dtype)`), the product,
/// its cast back, then the frozen matmul on it, the copy, the scaling and the cast dropped
/// at the return. `mul` keeps the operand the scaling's gradient needs, and the scaling
/// where the other operand needs one (`needs_input`).
fn scaled_forward(
    tp: &mut Tape,
    d: &Dims,
    m: usize,
    scale: Scale,
    kind: Kind,
    needs_input: bool,
) -> (usize, Scaled) {
    let t = d.t;
    let (i, o) = (d.width_in(m), d.width_out(m));
    let width = if scale == Scale::Output { o } else { i };
    let scaling_kind = if needs_input { Kind::Saved } else { Kind::Temp };
    let scaling = tp.alloc(4 * width, "IA³ scaling", Some(m), scaling_kind);
    let (y, operand) = if scale == Scale::Output {
        if needs_input {
            tp.pack();
        }
        let base = tp.saved(2 * t * o, "frozen matmul output", Some(m));
        let product = tp.temp(4 * t * o, "IA³ product");
        let y = tp.alloc(2 * t * o, "IA³ output", Some(m), kind);
        tp.free(product);
        tp.release(base);
        tp.last_use(scaling);
        (y, base)
    } else {
        let x32 = tp.saved(4 * t * i, "IA³ input fp32", Some(m));
        let product = tp.temp(4 * t * i, "IA³ product");
        let cast = tp.temp(2 * t * i, "IA³ scaled input");
        tp.free(product);
        tp.pack();
        let y = tp.alloc(2 * t * o, "projection output", Some(m), kind);
        tp.release(x32);
        tp.last_use(scaling);
        tp.free(cast);
        (y, x32)
    };
    let scaled = Scaled {
        scale,
        scaling,
        operand,
        saves_scaling: needs_input,
    };
    (y, scaled)
}

/// Projection `m` under PEFT 0.21 `vera.Linear.forward` with fp32 `λd`, `λb` and shared
/// `vera_A`, `vera_B` under autocast: the frozen matmul; the input cast to fp32
/// (`_cast_input_dtype`); `F.linear` on the sliced `vera_A` (autocast's 16-bit copy of it,
/// then of the input); `λd` times that (fp32: `mul` promotes); `F.linear` on the sliced
/// `vera_B` (its copy, then the product's); `λb` times that (fp32); the sum with the base
/// output (fp32) and its cast back. Each `mul` keeps the 16-bit operand its vector's gradient
/// needs; `vera_B`'s copy is kept for `λd`'s path, `vera_A`'s where the input needs a
/// gradient.
fn vera_forward(
    tp: &mut Tape,
    d: &Dims,
    m: usize,
    kind: Kind,
    needs_input: bool,
) -> (usize, Veraed) {
    let (i, o, r, t) = (d.width_in(m), d.width_out(m), d.rank, d.t);
    let base = tp.temp(2 * t * o, "frozen matmul output");
    let x32 = tp.temp(4 * t * i, "VeRA input fp32");
    let a_kind = if needs_input { Kind::Saved } else { Kind::Temp };
    let a = tp.alloc(2 * r * i, "vera_A copy", Some(m), a_kind);
    let x16 = tp.temp(2 * t * i, "VeRA input cast");
    let a_out = tp.saved(2 * t * r, "vera_A output", Some(m));
    tp.free(x16);
    tp.last_use(a);
    let by_d = tp.temp(4 * t * r, "λd product");
    tp.release(a_out);
    let b = tp.saved(2 * o * r, "vera_B copy", Some(m));
    let d16 = tp.temp(2 * t * r, "λd product cast");
    let b_out = tp.saved(2 * t * o, "vera_B output", Some(m));
    tp.release(b);
    tp.free(d16);
    tp.free(by_d);
    let by_b = tp.temp(4 * t * o, "λb product");
    tp.release(b_out);
    let sum = tp.temp(4 * t * o, "VeRA sum");
    tp.free(by_b);
    tp.free(base);
    let y = tp.alloc(2 * t * o, "VeRA output", Some(m), kind);
    tp.free(sum);
    tp.free(x32);
    (y, Veraed { a, a_out, b, b_out })
}

/// An adapted projection's adapter branch under autocast, up to its scaled output, on an
/// input of `in_bytes` per element: dropout's output and mask (the mask kept where the
/// input needs a gradient), autocast's 16-bit copies of fp32 `lora_A` and `lora_B`, its
/// 16-bit cast of an fp32 input (a 16-bit input, or its dropout output, is read as is and
/// saved by `lora_A`; the layer records which module releases a shared input, see
/// `layer_forward`), both matmuls and the scaling. Returns the saved tensors and the scaled
/// output.
fn autocast_adapter(
    tp: &mut Tape,
    d: &Dims,
    m: usize,
    in_bytes: u64,
    needs_input: bool,
) -> (Adapter, usize) {
    let (i, o, r, t) = (d.width_in(m), d.width_out(m), d.rank, d.t);
    let cast = in_bytes != 2;
    // `native_dropout` on the input: its output and its mask.
    let dropped = d.dropout.then(|| {
        let out_kind = if cast { Kind::Temp } else { Kind::Saved };
        let out = tp.alloc(in_bytes * t * i, "LoRA dropout", Some(m), out_kind);
        let mask_kind = if needs_input { Kind::Saved } else { Kind::Temp };
        let mask = tp.alloc(t * i, "LoRA dropout mask", Some(m), mask_kind);
        tp.last_use(mask);
        (out, needs_input.then_some(mask))
    });
    let a_copy = d
        .adapter_copies
        .then(|| tp.alloc(2 * r * i, "autocast copy", Some(m), Kind::Cached));
    // What `lora_A` reads: its own (released here at its last forward use), or the input.
    let own = match dropped {
        _ if cast => Some(tp.saved(2 * t * i, "LoRA input", Some(m))),
        Some((out, _)) => Some(out),
        None => None,
    };
    let a_out = tp.saved(2 * t * r, "lora_A output", Some(m));
    if let Some(x) = own {
        tp.release(x);
    }
    if let Some((out, _)) = dropped
        && cast
    {
        tp.free(out);
    }
    let b_copy = d
        .adapter_copies
        .then(|| tp.alloc(2 * o * r, "autocast copy", Some(m), Kind::Cached));
    let b_out = tp.alloc(2 * t * o, "lora_B output", Some(m), Kind::Temp);
    tp.release(a_out);
    let scaled = tp.alloc(2 * t * o, "LoRA scaled", Some(m), Kind::Temp);
    tp.free(b_out);
    let saved = Adapter {
        a_copy,
        x: own,
        a_out,
        b_copy,
        mask: dropped.and_then(|(_, mask)| mask),
    };
    (saved, scaled)
}

/// Bytes per element of projection `m`'s input and output on a 4-bit layer: `o_proj` reads
/// the 16-bit attention output; the others read the stream's dtype, and bitsandbytes casts
/// the matmul's output back to its input's (`Linear4bit.forward`: `.to(inp_dtype)`).
const fn four_bit_dtype(d: &Dims, m: usize) -> u64 {
    if m == O { 2 } else { d.stream }
}

/// Projection `m` on a 4-bit weight: bitsandbytes 0.50 `Linear4bit.forward` (the input cast
/// to the 16-bit compute dtype, `gemm_4bit`'s dequantize-and-`F.linear` fallback with the
/// nested absmax dequantized and offset, the output cast back to the input's dtype) and,
/// adapted, PEFT 0.21 `lora.bnb.Linear4bit.forward` under autocast (the base output cloned,
/// no input cast by PEFT: autocast casts an fp32 input to 16 bits for `lora_A`, a 16-bit
/// input is read as is; the sum in the base output's dtype).
fn four_bit_forward(
    tp: &mut Tape,
    d: &Dims,
    q4: FourBit,
    m: usize,
    kind: Kind,
    needs_input: bool,
) -> (usize, Option<Adapter>) {
    let (i, o, t) = (d.width_in(m), d.width_out(m), d.t);
    let xd = four_bit_dtype(d, m);
    let cast = (xd != 2).then(|| tp.temp(2 * t * i, "4-bit input cast"));
    let absmax = q4.absmax(o * i);
    let nested = (absmax > 0).then(|| {
        (
            tp.temp(absmax, "absmax dequantized"),
            tp.temp(absmax, "absmax offset"),
        )
    });
    let weight = tp.temp(2 * o * i, "dequantized weight");
    let out_kind = if d.adapted[m] || xd != 2 {
        Kind::Temp
    } else {
        kind
    };
    let mm = tp.alloc(2 * t * o, "4-bit matmul output", Some(m), out_kind);
    if let Some((dq, offset)) = nested {
        tp.free(offset);
        tp.free(dq);
    }
    tp.free(weight);
    let result = if xd == 2 {
        mm
    } else {
        let up_kind = if d.adapted[m] { Kind::Temp } else { kind };
        let up = tp.alloc(xd * t * o, "4-bit output cast", Some(m), up_kind);
        tp.free(mm);
        up
    };
    if let Some(c) = cast {
        tp.free(c);
    }
    if !d.adapted[m] {
        return (result, None);
    }
    let clone = tp.temp(xd * t * o, "PEFT clone");
    tp.free(result);
    let (saved, scaled) = autocast_adapter(tp, d, m, xd, needs_input);
    let y = tp.alloc(xd * t * o, "LoRA sum", Some(m), kind);
    tp.free(clone);
    tp.free(scaled);
    (y, Some(saved))
}

/// `apply_rotary_pos_emb` on one of q and k: `x * cos + rotate_half(x) * sin`.
fn rope_forward(tp: &mut Tape, w: u64, kind: Kind) -> usize {
    let by_cos = tp.temp(w, "RoPE x·cos");
    let neg = tp.temp(w / 2, "RoPE neg");
    let cat = tp.temp(w, "RoPE rotate_half");
    tp.free(neg);
    let by_sin = tp.temp(w, "RoPE ·sin");
    tp.free(cat);
    let out = tp.alloc(w, "RoPE output", None, kind);
    tp.free(by_cos);
    tp.free(by_sin);
    out
}

/// SDPA's math kernel (`_scaled_dot_product_attention_math`, torch 2.15, with
/// `allow_fp16_bf16_reduction_math_sdp` off as by default) on 16-bit q, k and v, causal: q,
/// k and v upcast to fp32, q scaled by √scale, the causal mask built (`ones().tril()` as
/// bools, then fp32 by `where`), with grouped KV heads (`enable_gqa`) k and v repeated to
/// every head (else the fp32 v is what the product with v saves), k scaled, the fp32
/// scores, the mask added, the softmax, its 16-bit copy (returned and dropped), the product
/// with v and its cast back; then transformers' contiguous
/// transpose (of `o_input_kind`: `o_proj` saves it where its weight or a 4-bit `lora_A`
/// reads it). On an fp32 stream autocast's 16-bit casts of q, k and v come first and go
/// when the kernel returns. Returns what the backward reads and the output `o_proj` reads.
fn math_forward(tp: &mut Tape, d: &Dims, cast_qkv: bool, o_input_kind: Kind) -> (Attn, usize) {
    let t = d.t;
    let scores = d.b * d.heads * d.s * d.s;
    let casts = cast_qkv.then(|| {
        [
            tp.temp(2 * t * d.q, "q cast"),
            tp.temp(2 * t * d.kv, "k cast"),
            tp.temp(2 * t * d.kv, "v cast"),
        ]
    });
    let grouped = d.kv < d.q;
    // With more than one sequence `matmul` copies the scaled q to fold the batch into
    // bmm's, and saves the copy; k and v too where they are not repeated (the repeats are
    // contiguous, the projections' transposed views are not).
    let batched = d.b > 1;
    let copies = batched && !grouped;
    let q32 = tp.temp(4 * t * d.q, "q fp32");
    let k32 = tp.temp(4 * t * d.kv, "k fp32");
    let v32 = if grouped || copies {
        tp.temp(4 * t * d.kv, "v fp32")
    } else {
        tp.saved(4 * t * d.kv, "v fp32", None)
    };
    let qs_kind = if batched { Kind::Temp } else { Kind::Saved };
    let qs = tp.alloc(4 * t * d.q, "q scaled", None, qs_kind);
    let ones = tp.temp(d.s * d.s, "causal ones");
    let tril = tp.temp(d.s * d.s, "causal tril");
    tp.free(ones);
    let zero = tp.temp(4, "mask scalar");
    let inf = tp.temp(4, "mask scalar");
    let mask = tp.temp(4 * d.s * d.s, "causal mask");
    tp.free(inf);
    tp.free(zero);
    tp.free(tril);
    let k_rep = grouped.then(|| tp.temp(4 * t * d.q, "k repeated"));
    let v_rep = if grouped {
        tp.saved(4 * t * d.q, "v repeated", None)
    } else {
        v32
    };
    let ks = if copies {
        tp.temp(4 * t * d.q, "k scaled")
    } else {
        tp.saved(4 * t * d.q, "k scaled", None)
    };
    let q_copy = batched.then(|| tp.saved(4 * t * d.q, "q scaled (bmm copy)", None));
    let k_copy = copies.then(|| tp.saved(4 * t * d.q, "k scaled (bmm copy)", None));
    let raw = tp.temp(4 * scores, "attention scores");
    if let Some(c) = q_copy {
        tp.release(c);
    }
    if let Some(c) = k_copy {
        tp.free(ks);
        tp.release(c);
    } else {
        tp.release(ks);
    }
    let masked = tp.temp(4 * scores, "scores masked");
    tp.free(raw);
    let softmax = tp.saved(4 * scores, "softmax", None);
    tp.free(masked);
    let returned = tp.temp(2 * scores, "softmax returned");
    let v_saved = if copies {
        tp.saved(4 * t * d.q, "v (bmm copy)", None)
    } else {
        v_rep
    };
    let out32 = tp.temp(4 * t * d.q, "attention output fp32");
    let out16 = tp.temp(2 * t * d.q, "attention output");
    tp.free(out32);
    tp.release(softmax);
    if let Some(k) = k_rep {
        tp.free(k);
    }
    tp.release(v_saved);
    tp.last_use(qs);
    for x in [mask, v32, k32, q32, returned] {
        if x != v_saved {
            tp.free(x);
        }
    }
    for x in casts.into_iter().flatten() {
        tp.free(x);
    }
    let o_input = tp.alloc(
        2 * t * d.q,
        "attention output (contiguous)",
        None,
        o_input_kind,
    );
    tp.free(out16);
    (
        Attn::Math {
            qs: q_copy.unwrap_or(qs),
            ks: k_copy.unwrap_or(ks),
            v_rep: v_saved,
            softmax,
        },
        o_input,
    )
}

/// transformers 5.25 `_is_packed_sequence` on one sequence's `s` int64 position ids, before
/// the flash-attn call: `arange + position_ids.min()`, minus the ids, `abs`, `sum`, `bool`,
/// read on the host (the arange and its minimum freed after the sum, the bool after it is
/// read).
fn packed_sequence_check(tp: &mut Tape, s: u64) {
    let arange = tp.temp(8 * s, "arange");
    let min = tp.temp(8, "position ids min");
    let increasing = tp.temp(8 * s, "increasing positions");
    tp.free(arange);
    tp.free(min);
    let diff = tp.temp(8 * s, "positions difference");
    let abs = tp.temp(8 * s, "positions abs");
    tp.free(diff);
    let sum = tp.temp(8, "positions sum");
    tp.free(abs);
    let packed = tp.temp(1, "packed");
    tp.free(sum);
    tp.free(increasing);
    tp.free(packed);
}

fn layer_forward(d: &Dims, first: bool) -> (Tape, Roles) {
    let mut tp = Tape::default();
    let tp = &mut tp;
    let t = d.t;
    // On an fp32 stream SDPA reads autocast's 16-bit casts of q, k and v, which it saves
    // instead of them.
    let cast_qkv = d.stream == 4;
    // A 4-bit layer's `lora_A` on a 16-bit stream without dropout saves its input as is,
    // and so does a trainable projection (for its weight's gradient): the first norm's
    // output (q, k and v), the second's (gate and up), `gate·up` (down). The one whose
    // backward runs last (q, then k, then v; gate, then up) releases it.
    let reads_input = d.full || d.four_bit.is_some() && d.stream == 2 && !d.dropout;
    let owner = |ms: &[usize]| {
        ms.iter()
            .copied()
            .find(|&m| d.full || d.adapted[m])
            .filter(|_| reads_input)
    };
    let (qkv_owner, mlp_owner, down_owner) =
        (owner(&[Q, K, V]), owner(&[GATE, UP]), owner(&[DOWN]));
    // Under SDPA's math kernel `o_proj` reads a copy of the attention's output that nothing
    // else saves (the flash kernel saves its output, which `o_proj` then shares).
    let o_owner = owner(&[O]).filter(|_| d.math);
    let held = |o: Option<usize>| if o.is_some() { Kind::Saved } else { Kind::Temp };
    let (norm1, x1) = rms_forward(tp, d, !first, d.h, t, None, held(qkv_owner));
    let mut saves = Modules::default();
    // Qwen3 normalizes q and k per head right after their projections
    // (`Qwen3Attention.forward`), the projection's output freed once normalized; the norm
    // keeps its input where that needs a gradient.
    // On an fp32 stream the norm saves the projection's output itself, not an fp32 copy.
    let mut qk_norms = [None, None];
    let keep_q = !first || d.trains_in(Q);
    let norm_saves = |keep: bool| {
        if d.qk_norm && (d.stream == 4 || d.liger_norm) && keep {
            Kind::Saved
        } else {
            Kind::Temp
        }
    };
    // Eager attention with grouped KV heads saves `repeat_kv`'s copies, not k and v.
    // `matmul` folds (batch, heads) into bmm's batch: a view with one sequence, a copy (which
    // the bmm saves instead) of q, k and v in their (batch, tokens, heads) layout otherwise.
    let repeated = d.eager && d.kv < d.q;
    let copied = d.eager && d.b > 1;
    let kv_kind = if repeated || copied || cast_qkv || d.math {
        Kind::Temp
    } else {
        Kind::Saved
    };
    let q_kind = if copied || cast_qkv || d.math {
        Kind::Temp
    } else {
        Kind::Saved
    };
    let keep_k = !first || d.trains_in(K);
    // Liger's RoPE rotates q and k where they are (`rope_forward`: the transposes undo the
    // projections' own, `contiguous` copies nothing): what the attention saves is then the
    // projection's output, or its q or k norm's.
    let rotated_in_place = |kind: Kind| if d.liger_rope { kind } else { Kind::Temp };
    let (q_out, k_out) = if d.liger_rope && !d.qk_norm {
        (q_kind, kv_kind)
    } else {
        (norm_saves(keep_q), norm_saves(keep_k))
    };
    let (normed_q, normed_k) = (rotated_in_place(q_kind), rotated_in_place(kv_kind));
    let q = linear_forward(tp, d, Q, q_out, !first, &mut saves);
    let q = if d.qk_norm {
        let (kept, normed) = rms_forward(tp, d, keep_q, d.q, t * d.heads, Some(q), normed_q);
        tp.last_use(q);
        qk_norms[0] = kept;
        normed
    } else {
        q
    };
    let k = linear_forward(tp, d, K, k_out, !first, &mut saves);
    let k = if d.qk_norm {
        let heads = d.kv / d.head_dim.max(1);
        let (kept, normed) = rms_forward(tp, d, keep_k, d.kv, t * heads, Some(k), normed_k);
        tp.last_use(k);
        qk_norms[1] = kept;
        normed
    } else {
        k
    };
    let v = linear_forward(tp, d, V, kv_kind, !first, &mut saves);
    let (q_rot, k_rot) = if d.liger_rope {
        (q, k)
    } else {
        let q_rot = rope_forward(tp, d.stream * t * d.q, q_kind);
        let k_rot = rope_forward(tp, d.stream * t * d.kv, kv_kind);
        tp.free(q);
        tp.free(k);
        (q_rot, k_rot)
    };
    let (attention, o_input) = if d.eager {
        // transformers 5.25 `eager_attention_forward`: `repeat_kv`'s copies, q·kᵀ, its
        // scaling and mask, the fp32 softmax and its cast (p = 0 dropout makes nothing),
        // the product with v and its contiguous transpose.
        let scores = d.b * d.heads * d.s * d.s;
        let repeat = repeated.then(|| {
            (
                tp.saved(2 * t * d.q, "repeat_kv k", None),
                tp.saved(2 * t * d.q, "repeat_kv v", None),
            )
        });
        let q_in = if copied {
            tp.saved(2 * t * d.q, "q (bmm copy)", None)
        } else {
            q_rot
        };
        let k_rep = match repeat {
            Some((k_rep, _)) => k_rep,
            None if copied => tp.saved(2 * t * d.kv, "k (bmm copy)", None),
            None => k_rot,
        };
        let qk = tp.temp(2 * scores, "attention scores");
        tp.release(q_in);
        tp.release(k_rep);
        let scaled = tp.temp(2 * scores, "scores scaled");
        tp.free(qk);
        let masked = tp.temp(2 * scores, "scores masked");
        tp.free(scaled);
        let up = tp.temp(4 * scores, "scores fp32");
        let soft = tp.saved(4 * scores, "softmax", None);
        tp.free(up);
        let probs = tp.saved(2 * scores, "attention probabilities", None);
        tp.release(soft);
        tp.free(masked);
        let v_rep = match repeat {
            Some((_, v_rep)) => v_rep,
            None if copied => tp.saved(2 * t * d.kv, "v (bmm copy)", None),
            None => v,
        };
        let pv = tp.temp(2 * t * d.q, "probabilities · v");
        tp.release(v_rep);
        let out = tp.temp(2 * t * d.q, "attention output");
        tp.free(pv);
        let eager = Attn::Eager {
            q: q_in,
            k_rep,
            v_rep,
            soft,
            probs,
        };
        (eager, out)
    } else if d.math {
        math_forward(tp, d, cast_qkv, held(o_owner))
    } else {
        // `_scaled_dot_product_flash_attention`, or flash-attn 2.8 `mha_fwd` (one split at
        // training shapes): the output and the log-sum-exp (of the 16-bit casts autocast,
        // or transformers' `fa_peft_integration_check`, makes of fp32 q, k and v), and
        // flash-attn's two-int64 RNG state.
        let casts = cast_qkv.then(|| {
            (
                tp.saved(2 * t * d.q, "q cast", None),
                tp.saved(2 * t * d.kv, "k cast", None),
                tp.saved(2 * t * d.kv, "v cast", None),
            )
        });
        if d.flash_attn && d.b == 1 {
            packed_sequence_check(tp, d.s);
        }
        let out = tp.saved(2 * t * d.q, "SDPA output", None);
        let lse = tp.saved(4 * d.b * d.heads * d.s, "SDPA logsumexp", None);
        tp.release(lse);
        let rng = d.flash_attn.then(|| {
            let rng = tp.saved(16, "flash-attn RNG state", None);
            tp.release(rng);
            rng
        });
        if let Some((qc, kc, vc)) = casts {
            tp.release(qc);
            tp.release(kc);
            tp.release(vc);
        }
        (
            Attn::Flash {
                out,
                lse,
                rng,
                casts,
            },
            out,
        )
    };
    let o = linear_forward(tp, d, O, Kind::Temp, true, &mut saves);
    if d.eager {
        tp.free(o_input);
        if copied {
            tp.free(q_rot);
        }
        if repeated || copied {
            tp.free(k_rot);
            tp.free(v);
        }
    } else {
        for x in [o_input, q_rot, k_rot, v] {
            tp.last_use(x);
        }
    }
    tp.last_use(x1);
    // On an fp32 stream, or under Liger's norm, the second norm saves its input, this sum,
    // itself.
    let r1_kind = if d.stream == 4 || d.liger_norm {
        Kind::Saved
    } else {
        Kind::Temp
    };
    let r1 = tp.alloc(d.stream * t * d.h, "residual", None, r1_kind);
    tp.free(o);
    let (norm2, x2) = rms_forward(tp, d, true, d.h, t, Some(r1), held(mlp_owner));
    let norm2 = norm2.unwrap_or(NormKept {
        x: None,
        rsqrt: 0,
        cast: None,
    });
    let gate = linear_forward(tp, d, GATE, Kind::Saved, true, &mut saves);
    let (act, up, product) = if d.liger_glu {
        // liger-kernel 0.8.5 `LigerSiLUMulFunction`: the output `empty_like(gate)`; gate's
        // and up's outputs saved, the activation never made.
        let up = linear_forward(tp, d, UP, Kind::Saved, true, &mut saves);
        let product = tp.alloc(
            d.stream * t * d.i,
            "LigerSiLUMul output",
            None,
            held(down_owner),
        );
        tp.release(gate);
        tp.release(up);
        (None, up, product)
    } else {
        let act = tp.saved(d.stream * t * d.i, "activation", None);
        tp.release(gate);
        let up = linear_forward(tp, d, UP, Kind::Saved, true, &mut saves);
        let product = tp.alloc(d.stream * t * d.i, "gate·up", None, held(down_owner));
        tp.release(act);
        tp.release(up);
        (Some(act), up, product)
    };
    let down = linear_forward(tp, d, DOWN, Kind::Temp, true, &mut saves);
    tp.last_use(product);
    tp.last_use(x2);
    let output = tp.temp(d.stream * t * d.h, "layer output");
    tp.free(down);
    tp.last_use(r1);
    // Eager attention returns its probabilities, which the decoder layer holds (`_`) until
    // it returns.
    if let Attn::Eager { probs, .. } = attention {
        tp.release(probs);
    }
    let mut inputs = [None; 7];
    for (m, owner, x) in [
        (Q, qkv_owner, x1),
        (K, qkv_owner, x1),
        (V, qkv_owner, x1),
        (O, o_owner, o_input),
        (GATE, mlp_owner, x2),
        (UP, mlp_owner, x2),
        (DOWN, down_owner, product),
    ] {
        inputs[m] = (owner == Some(m)).then_some(x);
        // A 4-bit layer's `lora_A` saves that shared input: its owner releases it.
        if let Some(a) = saves.adapters[m].as_mut() {
            a.x = a.x.or(inputs[m]);
        }
    }
    let roles = Roles {
        norm1,
        norm2,
        qk_norms,
        inputs,
        adapters: saves.adapters,
        scaled: saves.scaled,
        vera: saves.vera,
        v,
        q_rot,
        k_rot,
        attention,
        gate,
        act,
        up,
        output,
    };
    (std::mem::take(tp), roles)
}

/// What one layer's forward left: the tensors the backward reads, by tape number.
#[derive(Debug, Default)]
pub(super) struct Kept<'m> {
    live: Vec<Option<Tensor<'m>>>,
    /// The layer's input, where its first norm saves it ([`DecoderLayer::saves_input`]).
    input: Option<Tensor<'m>>,
    /// Checkpointing's recompute made them: a backward function unpacks them as locals and
    /// drops them when it returns, before its outputs are reduced to their inputs' shapes
    /// and before its incoming gradient (else autograd frees them after both).
    recomputed: bool,
    /// The layer's input under checkpointing, freed once the first norm's fp32 input, the
    /// last tensor the recompute saved that the backward reads, is dropped
    /// ([`DecoderLayer::hold_checkpoint`]).
    checkpoint: Option<Tensor<'m>>,
    checkpoint_after: Option<usize>,
}

impl<'m> Kept<'m> {
    fn take(&mut self, i: usize) -> Option<Tensor<'m>> {
        self.live.get_mut(i).and_then(Option::take)
    }
    /// Holds the layer's input until its first norm's backward.
    pub(super) const fn hold_input(&mut self, input: Tensor<'m>) {
        self.input = Some(input);
    }
    /// Holds a checkpointed layer's input until its recomputed tensors are read.
    pub(super) const fn hold_checkpoint(&mut self, input: Tensor<'m>) {
        self.checkpoint = Some(input);
    }
    /// Every tensor still held, in tape order.
    pub(super) fn into_rest(self) -> Vec<Tensor<'m>> {
        self.live
            .into_iter()
            .flatten()
            .chain(self.input)
            .chain(self.checkpoint)
            .collect()
    }
}

/// What a layer's backward needs of the step: its parameters, where their gradients go.
pub(super) struct Grads<'a, 'm> {
    pub(super) ps: &'a [Param<'m>],
    pub(super) slots: &'a mut [Option<Tensor<'m>>],
    pub(super) bytes: u64,
}

/// Runs `tape` in `mode` as layer `layer`'s (none: the final norm): its tensors by tape
/// number (those still held), autocast's copies a `no_grad` forward caches, and how many
/// tensors it made (a recompute stops after the last save).
fn run<'m>(
    tape: &Tape,
    b: &mut Builder<'m>,
    layer: Option<u64>,
    mode: Mode,
) -> (Vec<Option<Tensor<'m>>>, Vec<Tensor<'m>>, usize) {
    let mut live: Vec<Option<Tensor<'m>>> = vec![None; tape.kinds.len()];
    let mut cached = Vec::new();
    let stop = match mode {
        Mode::Recompute => tape
            .evs
            .iter()
            .rposition(|e| {
                matches!(e, Ev::Pack) || matches!(e, Ev::Alloc { kind, .. } if *kind != Kind::Temp)
            })
            .map_or(tape.evs.len(), |p| p + 1),
        _ => tape.evs.len(),
    };
    let mut n = 0;
    for e in &tape.evs[..stop] {
        match *e {
            Ev::Alloc {
                bytes,
                name,
                module,
                kind,
            } => {
                let component = if kind == Kind::Temp {
                    Component::Transients
                } else {
                    Component::Activations
                };
                let t = b.alloc_in(name, module.map(|m| NAMES[m]), layer, component, bytes, 1);
                if kind == Kind::Cached && mode == Mode::NoGrad {
                    cached.push(t);
                } else {
                    live[n] = Some(t);
                }
                n += 1;
            }
            Ev::Free(i) => {
                if let Some(t) = live[i].take() {
                    b.free(t);
                }
            }
            Ev::Release(i) => {
                if mode == Mode::NoGrad
                    && let Some(t) = live[i].take()
                {
                    b.free(t);
                }
            }
            Ev::Pack => {}
        }
    }
    (live, cached, n)
}

/// The final norm (`LlamaModel.norm`) on a 16-bit stream: the layers' RMSNorm on the last
/// layer's output, its fp32 input and `rsqrt` kept; its output is what lm_head reads,
/// which saves it where lm_head's weight trains (a full fine-tune, whose norm weight saves
/// its 16-bit cast too).
fn final_norm_forward(d: &Dims) -> (Tape, NormKept, usize) {
    let mut tp = Tape::default();
    let out_kind = if d.full { Kind::Saved } else { Kind::Temp };
    let (kept, out) = rms_forward(&mut tp, d, true, d.h, d.t, None, out_kind);
    (tp, kept.expect("a norm told to keep keeps"), out)
}

impl DecoderLayer {
    /// The layer program of `job` on `model` (see [`models`]); `ps` the step's parameters,
    /// `ranges` each layer's.
    pub(super) fn new(
        model: &ModelSpec,
        job: &Job,
        r: &Regime,
        device: &DeviceProfile,
        ps: &[Param<'_>],
        ranges: &[std::ops::Range<usize>],
    ) -> Self {
        // The seven projections of a layer (every layer's are the same, [`llama_style`]).
        let linears = NAMES.map(|n| {
            model
                .layers
                .first()
                .and_then(|g| g.linears.iter().find(|l| l.name == n))
        });
        let peft = |kind: PeftKind, l: &crate::model::Linear| {
            job.method.is_peft() && job.adapter.method == kind && job.adapts(l)
        };
        let adapted = linears.map(|l| l.is_some_and(|l| peft(PeftKind::Lora, l)));
        let vera = linears.map(|l| l.is_some_and(|l| peft(PeftKind::Vera, l)));
        let scales = linears.map(|l| {
            l.filter(|l| peft(PeftKind::Ia3, l)).map(|l| {
                if weights::ia3_feedforward(model, job, l) {
                    Scale::Input
                } else {
                    Scale::Output
                }
            })
        });
        let d = Dims {
            t: job.micro_batch_size * job.seq_len,
            b: job.micro_batch_size,
            s: job.seq_len,
            h: model.hidden_size,
            q: model.q_width(),
            kv: model.num_kv_heads * model.head_dim,
            i: model.intermediate_size,
            heads: model.num_heads,
            head_dim: model.head_dim,
            rank: job.adapter.rank,
            adapted,
            scales,
            vera,
            dropout: job.adapter.dropout > 0.0,
            autocast: r.autocast,
            adapter_copies: r.autocast && r.adapter_bytes == 4,
            eager: job.attention == Attention::Eager,
            flash_attn: job.attention == Attention::Flash,
            math: device.sdpa_math_kernel(model, job),
            qk_norm: model.qk_norm,
            stream: r.stream_bytes,
            four_bit: (job.quantization != Quantization::None).then_some(FourBit {
                nested: job.quantization.double_quant(),
            }),
            full: job.method == Method::Full,
            bias: linears.map(|l| l.is_some_and(|l| l.bias)),
            liger_norm: job.liger.rms_norm,
            liger_glu: job.liger.glu,
            liger_rope: job.liger.rope,
            leaf_input: job.method != Method::Full && job.adapter.method != PeftKind::PromptTuning,
        };
        // Parameter `p` of projection `name` in a layer's range of the step's parameters.
        let find = |range: &std::ops::Range<usize>, name: &str, p: &str| {
            range
                .clone()
                .find(|&j| ps[j].module == Some(name) && ps[j].name == p)
        };
        let params = ranges
            .iter()
            .map(|range| {
                NAMES.map(|n| {
                    find(range, n, "lora_A")
                        .zip(find(range, n, "lora_B"))
                        .or_else(|| {
                            find(range, n, "vera_lambda_b").zip(find(range, n, "vera_lambda_d"))
                        })
                })
            })
            .collect();
        let scalings = ranges
            .iter()
            .map(|range| NAMES.map(|n| find(range, n, "ia3_l")))
            .collect();
        let trained = ranges
            .iter()
            .map(|range| {
                let trains = |j: &usize| ps[*j].trainable;
                let mut norms = range
                    .clone()
                    .filter(|&j| ps[j].name == "norm")
                    .filter(trains);
                Trained {
                    linears: NAMES.map(|n| find(range, n, "weight").filter(trains)),
                    norms: [norms.next(), norms.next()],
                }
            })
            .collect();
        Self {
            d,
            // With the input embeddings requiring grad (a full fine-tune's embedding trains;
            // transformers and TRL make them under checkpointing; prompt tuning's prompt
            // trains), the first layer computes its input's gradient like any other.
            first: layer_forward(
                &d,
                !(d.full
                    || job.adapter.method == PeftKind::PromptTuning
                    || job.gradient_checkpointing && job.stack.profile().peft_input_grads),
            ),
            rest: layer_forward(&d, false),
            params,
            scalings,
            trained,
            head: (d.stream == 2 || d.liger_norm).then(|| final_norm_forward(&d)),
        }
    }

    /// Whether a layer's first norm saves the layer's input itself (an fp32 stream: no
    /// cast), which must then live until that norm's backward ([`Kept::hold_input`]).
    pub(super) const fn saves_input(&self) -> bool {
        self.d.stream == 4 || self.d.liger_norm
    }

    /// Whether the final norm is traced op by op ([`Self::norm_forward`]).
    pub(super) const fn traces_final_norm(&self) -> bool {
        self.head.is_some()
    }

    /// The final norm's forward on the last layer's output: what it keeps and its output
    /// (none off a 16-bit stream).
    pub(super) fn norm_forward<'m>(&self, b: &mut Builder<'m>) -> Option<(Kept<'m>, Tensor<'m>)> {
        let (tape, _, output) = self.head.as_ref()?;
        let (mut live, _, _) = run(tape, b, None, Mode::Grad);
        let out = live[*output].take()?;
        let kept = Kept {
            live,
            ..Kept::default()
        };
        Some((kept, out))
    }

    /// The final norm's backward from `g`, lm_head's input gradient (freed): its input's
    /// gradient; `weight`, the norm's weight where it trains, gets its gradient.
    pub(super) fn norm_backward<'m>(
        &self,
        b: &mut Builder<'m>,
        kept: &mut Kept<'m>,
        grads: &mut Grads<'_, 'm>,
        g: Tensor<'m>,
        weight: Option<usize>,
    ) -> Option<Tensor<'m>> {
        let (_, norm, _) = self.head.as_ref()?;
        let mut bw = Backward {
            b,
            d: &self.d,
            layer: None,
            kept,
            grads,
            params: [None; 7],
            scalings: [None; 7],
            trained: Trained::default(),
        };
        Some(if self.d.liger_norm {
            bw.liger_rms(g, *norm, self.d.h, None, weight)
        } else {
            bw.rms(g, *norm, self.d.h, weight)
        })
    }

    /// Under checkpointing, layer `k`'s backward up to the first op that reads a saved
    /// tensor, which starts the recompute: an adapted `down_proj`'s scaled gradient from
    /// `dy` ([`Backward::start`]).
    pub(super) fn start<'m>(
        &self,
        b: &mut Builder<'m>,
        k: usize,
        grads: &mut Grads<'_, 'm>,
        dy: Tensor<'m>,
    ) -> Option<Start<'m>> {
        if !self.d.adapted[DOWN] {
            return None;
        }
        let mut kept = Kept::default();
        let mut bw = Backward {
            b,
            d: &self.d,
            layer: Some(k as u64),
            kept: &mut kept,
            grads,
            params: self.params[k],
            scalings: self.scalings[k],
            trained: self.trained[k],
        };
        Some(bw.start(DOWN, dy, false))
    }

    /// Runs layer `k`'s forward in `mode`. Returns what it keeps for the backward,
    /// autocast's copies cached by a `no_grad` forward, and the layer's output (none from a
    /// recompute).
    pub(super) fn forward<'m>(
        &self,
        b: &mut Builder<'m>,
        k: usize,
        mode: Mode,
    ) -> (Kept<'m>, Vec<Tensor<'m>>, Option<Tensor<'m>>) {
        let (tape, roles) = if k == 0 { &self.first } else { &self.rest };
        let (mut live, cached, n) = run(tape, b, Some(k as u64), mode);
        let output = if mode == Mode::Recompute {
            // The temporaries the recompute made and nothing keeps, newest first.
            for i in (0..n).rev() {
                if tape.kinds[i] == Kind::Temp
                    && let Some(t) = live[i].take()
                {
                    b.free(t);
                }
            }
            None
        } else {
            live[roles.output].take()
        };
        let checkpoint_after = roles.norm1.and_then(|n| n.x);
        let kept = Kept {
            live,
            input: None,
            recomputed: mode == Mode::Recompute,
            checkpoint: None,
            checkpoint_after,
        };
        (kept, cached, output)
    }

    /// Layer `k`'s backward from the gradient `dy` of its output; returns the gradient of
    /// its input (none for the first layer, whose input needs none). `started`: what
    /// [`Self::start`] made before the recompute.
    pub(super) fn backward<'m>(
        &self,
        b: &mut Builder<'m>,
        k: usize,
        kept: &mut Kept<'m>,
        grads: &mut Grads<'_, 'm>,
        dy: Tensor<'m>,
        started: Option<Start<'m>>,
    ) -> Option<Tensor<'m>> {
        let roles = if k == 0 { &self.first.1 } else { &self.rest.1 };
        let mut bw = Backward {
            b,
            d: &self.d,
            layer: Some(k as u64),
            kept,
            grads,
            params: self.params[k],
            scalings: self.scalings[k],
            trained: self.trained[k],
        };
        let d = self.d;
        let (t, s) = (d.t, d.stream);
        // The MLP: down_proj, the product, up_proj, the activation, gate_proj.
        let dp = bw
            .linear(DOWN, roles, dy, false, None, true, started)
            .expect("down_proj's input needs a gradient");
        let sum = if let Some(act) = roles.act {
            let d_up = bw.temp(s * t * d.i);
            let d_act = bw.temp(s * t * d.i);
            bw.free(dp);
            bw.release(roles.up);
            bw.release(act);
            let sum = bw.linear(UP, roles, d_up, true, None, true, None);
            let d_gate = bw.temp(s * t * d.i);
            bw.free(d_act);
            bw.release(roles.gate);
            bw.linear(GATE, roles, d_gate, true, sum, true, None)
        } else {
            // Liger's SwiGLU backward writes gate's and up's gradients into their saved
            // outputs and returns those.
            let d_gate = bw.take(roles.gate);
            let d_up = bw.take(roles.up);
            bw.free(dp);
            let sum = bw.linear(UP, roles, d_up, true, None, true, None);
            bw.linear(GATE, roles, d_gate, true, sum, true, None)
        };
        let norms = bw.trained.norms;
        let dr = bw.norm_into(
            sum.expect("the MLP input's gradient"),
            roles.norm2,
            d.h,
            Some(dy),
            norms[1],
        );
        // Attention: o_proj, SDPA, RoPE, then v, k and q. On an fp32 stream o_proj's
        // 16-bit output takes the residual's gradient cast to 16 bits.
        // In a layer whose input needs no gradient, o_proj's is the residual gradient's last
        // use.
        let last_use = roles.norm1.is_none();
        let (g_o, free_g_o) = if s == 4 {
            (bw.temp(2 * t * d.h), true)
        } else {
            (dr, last_use)
        };
        let d_attn = bw
            .linear(O, roles, g_o, free_g_o, None, true, None)
            .expect("o_proj's input needs a gradient");
        let (dq, dk, dv) = match roles.attention {
            Attn::Flash {
                out,
                lse,
                rng,
                casts,
            } => bw.sdpa(roles, d_attn, [out, lse], rng, casts),
            Attn::Math {
                qs,
                ks,
                v_rep,
                softmax,
            } => bw.math(d_attn, [qs, ks, v_rep, softmax]),
            Attn::Eager {
                q,
                k_rep,
                v_rep,
                soft,
                probs,
            } => bw.eager(d_attn, [q, k_rep, v_rep, soft, probs]),
        };
        // In a layer whose input needs no gradient, q's and k's paths need one only where
        // their projection trains: the kernel's gradient of the other is dropped at once.
        let needs = roles.norm1.is_some();
        let mut needed = |m: usize, g: Tensor<'m>| {
            if needs || d.trains_in(m) {
                Some(g)
            } else {
                bw.free(g);
                None
            }
        };
        let (dq, dk) = (needed(Q, dq), needed(K, dk));
        // On an fp32 stream the kernel read 16-bit casts of q, k and v (autocast's, or
        // `fa_peft_integration_check`'s): their backward, in autograd's order: v, k, q.
        let (dq, dk, dv) = if s == 4 {
            let dv = bw.cast(dv, 4 * t * d.kv);
            let dk = dk.map(|g| bw.cast(g, 4 * t * d.kv));
            (dq.map(|g| bw.cast(g, 4 * t * d.q)), dk, dv)
        } else {
            (dq, dk, dv)
        };
        // Liger's RoPE backward rotates the gradients where they are, in the layout the
        // projections' outputs had: nothing to copy after it either.
        let (dk, dq) = if d.liger_rope {
            (dk, dq)
        } else {
            (
                dk.map(|g| bw.rope(g, s * t * d.kv)),
                dq.map(|g| bw.rope(g, s * t * d.q)),
            )
        };
        // Eager attention's gradients come in the (batch, heads, tokens) layout, and so do
        // RoPE's fp32 ones: each is copied contiguous as its projection's backward reshapes
        // it.
        let dv = bw.contiguous(dv, 2 * t * d.kv);
        let mut sum = bw.linear(V, roles, dv, true, None, needs, None);
        for (m, g, norm, w) in [
            (K, dk, roles.qk_norms[1], d.kv),
            (Q, dq, roles.qk_norms[0], d.q),
        ] {
            let Some(g) = g else { continue };
            let g = match norm {
                Some(kept) => bw.norm_into(g, kept, w, None, None),
                None => g,
            };
            let g = if d.liger_rope {
                g
            } else {
                bw.contiguous_rotated(g, s * t * w)
            };
            sum = bw.linear(m, roles, g, true, sum, needs, None);
        }
        match (roles.norm1, sum) {
            (Some(norm1), Some(sum)) => Some(bw.norm_into(sum, norm1, d.h, Some(dr), norms[0])),
            _ => {
                if s == 4 || !last_use {
                    bw.free(dr);
                }
                None
            }
        }
    }
}

/// What an adapted projection's backward makes before it reads a saved tensor.
#[derive(Debug, Clone, Copy)]
pub(super) struct Start<'m> {
    scaled: Tensor<'m>,
    /// Without autocast: the 16-bit gradient the frozen matmul reads.
    base_grad: Option<Tensor<'m>>,
}

struct Backward<'a, 'b, 'm> {
    b: &'a mut Builder<'m>,
    d: &'a Dims,
    layer: Option<u64>,
    kept: &'a mut Kept<'m>,
    grads: &'a mut Grads<'b, 'm>,
    /// This layer's `lora_A` and `lora_B` per projection (a VeRA module's `λb` and `λd`),
    /// indices into the parameters.
    params: [Option<(usize, usize)>; 7],
    /// This layer's `ia3_l` per projection.
    scalings: [Option<usize>; 7],
    /// This layer's weights where they train.
    trained: Trained,
}

impl<'m> Backward<'_, '_, 'm> {
    fn temp(&mut self, bytes: u64) -> Tensor<'m> {
        self.b.alloc_in(
            "backward temporary",
            None,
            self.layer,
            Component::Transients,
            bytes,
            1,
        )
    }
    fn free(&mut self, t: Tensor<'m>) {
        self.b.free(t);
    }
    /// Frees a saved tensor at its last use.
    fn release(&mut self, i: usize) {
        if let Some(t) = self.kept.take(i) {
            self.b.free(t);
        }
    }
    /// The layer's input is a leaf ([`Dims::leaf_input`]), which its `AccumulateGrad` holds
    /// until the backward's graph goes, after the layer's backward.
    fn input_is_leaf(&self) -> bool {
        self.layer == Some(0) && self.d.leaf_input
    }
    /// A saved tensor that goes on as a gradient (the backward wrote into it).
    fn take(&mut self, i: usize) -> Tensor<'m> {
        self.kept
            .take(i)
            .expect("a saved tensor is there until its backward")
    }
    /// A parameter's gradient: the first micro-batch's becomes `.grad`; a later one's is
    /// added in place and dropped.
    fn grad(&mut self, p: usize) {
        let g = &mut *self.grads;
        let fresh = super::step::make_grads(self.b, g.ps, std::iter::once(p), g.slots, g.bytes);
        self.b.free_all(fresh);
    }
    /// Adds `x` to the gradient summed so far for one tensor (autograd's input buffer:
    /// the first arrival is kept, each later one summed out of place).
    fn accumulate(&mut self, sum: Option<Tensor<'m>>, x: Tensor<'m>, bytes: u64) -> Tensor<'m> {
        match sum {
            None => x,
            Some(s) => {
                let n = self.temp(bytes);
                self.free(s);
                self.free(x);
                n
            }
        }
    }

    /// The start of adapted projection `m`'s backward from `g`, up to the first op that
    /// reads a saved tensor: the scaled gradient (without autocast, the fp32 cast of `g` it
    /// is made from, dropped, and the 16-bit gradient the frozen matmul then reads; `g`
    /// freed when `free_g`).
    fn start(&mut self, m: usize, g: Tensor<'m>, free_g: bool) -> Start<'m> {
        let (o, t) = (self.d.width_out(m), self.d.t);
        if self.d.four_bit.is_some() && four_bit_dtype(self.d, m) == 4 {
            // The fp32 sum's gradient reaches the 16-bit scaled branch cast to 16 bits.
            let g16 = self.temp(2 * t * o);
            let scaled = self.temp(2 * t * o);
            self.free(g16);
            return Start {
                scaled,
                base_grad: None,
            };
        }
        if self.d.autocast {
            return Start {
                scaled: self.temp(2 * t * o),
                base_grad: None,
            };
        }
        let up = self.temp(4 * t * o);
        if free_g {
            self.free(g);
        }
        let base_grad = self.temp(2 * t * o);
        let scaled = self.temp(4 * t * o);
        self.free(up);
        Start {
            scaled,
            base_grad: Some(base_grad),
        }
    }

    /// Adapted projection `m`'s adapter branch backward from its scaled gradient (freed):
    /// `lora_B`'s weight gradient, the gradient of `lora_A`'s output, `lora_A`'s weight
    /// gradient and, where `needs_input`, the gradient of `lora_A`'s input, cast to fp32 where
    /// `up` (autocast's cast of an fp32 input), then through dropout's mask. Under autocast the
    /// weight gradients are 16-bit matmul outputs whose fp32 casts become `.grad` (16-bit
    /// adapters: they are `.grad`); without it they are fp32 themselves.
    fn adapter_grads(
        &mut self,
        m: usize,
        a: Adapter,
        scaled: Tensor<'m>,
        needs_input: bool,
        up: bool,
    ) -> Option<Tensor<'m>> {
        let d = *self.d;
        let (i, o, r, t) = (d.width_in(m), d.width_out(m), d.rank, d.t);
        let params = self.params[m];
        let e = if d.autocast { 2 } else { 4 };
        let g_b = if a.b_copy.is_some() {
            Some(self.temp(2 * o * r))
        } else {
            if let Some((_, pb)) = params {
                self.grad(pb);
            }
            None
        };
        let g_a_out = self.temp(e * t * r);
        self.free(scaled);
        if let Some(c) = a.b_copy {
            self.release(c);
        }
        self.release(a.a_out);
        let g_a = if let Some(g_b) = g_b {
            if let Some((_, pb)) = params {
                self.grad(pb);
            }
            self.free(g_b);
            Some(self.temp(2 * r * i))
        } else {
            if let Some((pa, _)) = params {
                self.grad(pa);
            }
            None
        };
        let g_x = needs_input.then(|| self.temp(e * t * i));
        self.free(g_a_out);
        if let Some(c) = a.a_copy {
            self.release(c);
        }
        if let Some(x) = a.x {
            self.release(x);
        }
        let (g_x, x_bytes) = match g_x {
            Some(g_x) if up => (Some(self.cast(g_x, 4 * t * i)), 4),
            other => (other, e),
        };
        if let Some(g_a) = g_a {
            if let Some((pa, _)) = params {
                self.grad(pa);
            }
            self.free(g_a);
        }
        // Dropout's backward, through its mask.
        match (g_x, a.mask) {
            (Some(g_x), Some(mask)) => {
                let through = self.temp(x_bytes * t * i);
                self.free(g_x);
                self.release(mask);
                Some(through)
            }
            (g_x, _) => g_x,
        }
    }

    /// Projection `m`'s backward from `g`, freed after the frozen matmul when `free_g`;
    /// its input's gradient summed into `sum` where `needs_input` (else `sum` unchanged).
    /// `started`: what [`Self::start`] made before checkpointing's recompute.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &mut self,
        m: usize,
        roles: &Roles,
        g: Tensor<'m>,
        free_g: bool,
        mut sum: Option<Tensor<'m>>,
        needs_input: bool,
        started: Option<Start<'m>>,
    ) -> Option<Tensor<'m>> {
        let d = *self.d;
        if let Some(q4) = d.four_bit {
            return self.four_bit_linear(q4, m, roles, g, free_g, sum, needs_input, started);
        }
        if let Some(scaled) = roles.scaled[m] {
            return self.scaled_linear(m, scaled, g, free_g, sum, needs_input);
        }
        if let Some(v) = roles.vera[m] {
            return self.vera_linear(m, v, g, free_g, sum, needs_input);
        }
        let (i, t) = (d.width_in(m), d.t);
        if d.full {
            // `MmBackward`: the weight's gradient (it becomes `.grad`), then the input's,
            // then the gradient and the saved input freed; with a bias (`AddmmBackward`)
            // the input's first, the saved input freed before the bias's gradient (a
            // sum, in the weight's tensor here) and the gradient after it.
            let weight = self.trained.linears[m];
            let g_in = if d.bias[m] {
                let g_in = needs_input.then(|| self.temp(2 * t * i));
                if let Some(p) = weight {
                    self.grad(p);
                }
                if let Some(x) = roles.inputs[m] {
                    self.release(x);
                }
                if free_g {
                    self.free(g);
                }
                g_in
            } else {
                if let Some(p) = weight {
                    self.grad(p);
                }
                let g_in = needs_input.then(|| self.temp(2 * t * i));
                let recomputed = self.kept.recomputed;
                if recomputed && let Some(x) = roles.inputs[m] {
                    self.release(x);
                }
                if free_g {
                    self.free(g);
                }
                if !recomputed && let Some(x) = roles.inputs[m] {
                    self.release(x);
                }
                g_in
            };
            if let Some(g_in) = g_in {
                sum = Some(self.accumulate(sum, g_in, 2 * t * i));
            }
            return sum;
        }
        let mut base_grad = None;
        if let Some(a) = roles.adapters[m] {
            let st = match started {
                Some(st) => st,
                None => self.start(m, g, free_g),
            };
            base_grad = st.base_grad;
            // Under autocast the input gradient comes back through its 16-bit cast.
            let g_x32 = self.adapter_grads(m, a, st.scaled, needs_input, d.autocast);
            if let Some(g_x32) = g_x32 {
                let down = self.temp(2 * t * i);
                self.free(g_x32);
                sum = Some(self.accumulate(sum, down, 2 * t * i));
            }
        }
        // The frozen matmul's input gradient, from `g` (or its 16-bit copy).
        let g_in = needs_input.then(|| self.temp(2 * t * i));
        match base_grad {
            Some(b) => self.free(b),
            None if free_g => self.free(g),
            None => {}
        }
        if let Some(g_in) = g_in {
            sum = Some(self.accumulate(sum, g_in, 2 * t * i));
        }
        sum
    }

    /// Projection `m`'s backward under IA³ ([`scaled_forward`]) from `g` (freed where
    /// `free_g`), its input's gradient summed into `sum` where `needs_input`. `MulBackward0`
    /// makes the scaling's product first, then the other operand's (cast to a 16-bit
    /// operand's dtype); the scaling's is summed over the tokens, the saved tensors dropped
    /// (as it returns after a recompute, else after the sum), and `ia3_l`'s gradient comes
    /// last. On the output: `.to`'s fp32 cast of `g` first, the frozen matmul's input
    /// gradient after `mul`; on the input: the matmul's first, cast to fp32, and the input's
    /// gradient cast back after `mul`.
    fn scaled_linear(
        &mut self,
        m: usize,
        s: Scaled,
        g: Tensor<'m>,
        free_g: bool,
        mut sum: Option<Tensor<'m>>,
        needs_input: bool,
    ) -> Option<Tensor<'m>> {
        let d = *self.d;
        let (i, t) = (d.width_in(m), d.t);
        let w = if s.scale == Scale::Output {
            d.width_out(m)
        } else {
            i
        };
        let recomputed = self.kept.recomputed;
        let g32 = if s.scale == Scale::Output {
            let g32 = self.temp(4 * t * w);
            if free_g {
                self.free(g);
            }
            g32
        } else {
            let g16 = self.temp(2 * t * i);
            if free_g {
                self.free(g);
            }
            self.cast(g16, 4 * t * i)
        };
        let for_scaling = self.temp(4 * t * w);
        let for_other = s.saves_scaling.then(|| self.temp(4 * t * w));
        let release = |bw: &mut Self| {
            if recomputed {
                bw.release(s.operand);
                bw.release(s.scaling);
            } else {
                bw.release(s.scaling);
                bw.release(s.operand);
            }
        };
        if recomputed {
            release(self);
        }
        // On the output the other operand is the 16-bit matmul output: its gradient is
        // cast to it inside `mul`'s backward.
        let output_grad = match for_other {
            Some(p) if s.scale == Scale::Output => Some(self.cast(p, 2 * t * w)),
            other => other,
        };
        let summed = self.temp(4 * w);
        self.free(for_scaling);
        self.free(g32);
        if !recomputed {
            release(self);
        }
        let g_in = if s.scale == Scale::Output {
            let g_in = needs_input.then(|| self.temp(2 * t * i));
            if let Some(c) = output_grad {
                self.free(c);
            }
            g_in
        } else {
            output_grad.map(|p| self.cast(p, 2 * t * i))
        };
        if let Some(g_in) = g_in {
            sum = Some(self.accumulate(sum, g_in, 2 * t * i));
        }
        if let Some(p) = self.scalings[m] {
            self.grad(p);
        }
        self.free(summed);
        sum
    }

    /// Projection `m`'s backward under VeRA ([`vera_forward`]) from `g` (freed where
    /// `free_g`), its input's gradient summed into `sum` where `needs_input`: the cast
    /// back's fp32 gradient, the base output's 16-bit share of it, then down the adapter
    /// (`λb`'s `mul`: the operand's gradient, then `λb`'s; `vera_B`'s matmul; the cast; `λd`'s
    /// `mul`; `vera_A`'s matmul and the input's two casts), each saved tensor dropped after
    /// its op, and the frozen matmul's input gradient last.
    fn vera_linear(
        &mut self,
        m: usize,
        v: Veraed,
        g: Tensor<'m>,
        free_g: bool,
        mut sum: Option<Tensor<'m>>,
        needs_input: bool,
    ) -> Option<Tensor<'m>> {
        let d = *self.d;
        let (i, o, r, t) = (d.width_in(m), d.width_out(m), d.rank, d.t);
        let (lambda_b, lambda_d) = self.params[m].unzip();
        let g32 = self.temp(4 * t * o);
        if free_g {
            self.free(g);
        }
        // The base output's share: cast to its 16-bit dtype where the input needs a gradient.
        let g_base = needs_input.then(|| self.temp(2 * t * o));
        // `λb · b_out`, then `λd · a_out`: `MulBackward0` makes the operand's gradient, then
        // the vector's (summed over the tokens); the engine casts the operand's to 16 bits.
        // A recomputed saved operand goes as the function returns, else after the incoming
        // gradient.
        let g_out = self.vector_mul(lambda_b, v.b_out, g32, 4 * t * o);
        // `vera_B`'s matmul, the cast of `λd`'s product.
        let g_d16 = self.temp(2 * t * r);
        self.drop_saved_then(v.b, g_out);
        let g_d = self.cast(g_d16, 4 * t * r);
        let g_a = self.vector_mul(lambda_d, v.a_out, g_d, 4 * t * r);
        match g_base {
            Some(g_base) => {
                let g_x16 = self.temp(2 * t * i);
                self.drop_saved_then(v.a, g_a);
                let g_x32 = self.cast(g_x16, 4 * t * i);
                let g_x = self.cast(g_x32, 2 * t * i);
                sum = Some(self.accumulate(sum, g_x, 2 * t * i));
                let g_in = self.temp(2 * t * i);
                self.free(g_base);
                sum = Some(self.accumulate(sum, g_in, 2 * t * i));
            }
            None => self.free(g_a),
        }
        sum
    }

    /// `MulBackward0` of a trainable fp32 vector (`vector`, a parameter index) times a saved
    /// 16-bit `operand`, from its fp32 incoming gradient `g` (of `bytes`, freed): the
    /// operand's gradient and the vector's, the vector's summed into its `.grad`, the
    /// operand's cast to 16 bits. Returns the operand's.
    fn vector_mul(
        &mut self,
        vector: Option<usize>,
        operand: usize,
        g: Tensor<'m>,
        bytes: u64,
    ) -> Tensor<'m> {
        let for_operand = self.temp(bytes);
        let for_vector = self.temp(bytes);
        if let Some(p) = vector {
            self.grad(p);
        }
        let recomputed = self.kept.recomputed;
        if recomputed {
            self.release(operand);
        }
        self.free(for_vector);
        let cast = self.cast(for_operand, bytes / 2);
        self.free(g);
        if !recomputed {
            self.release(operand);
        }
        cast
    }

    /// The end of a backward function that read the saved tensor `saved` and was handed
    /// `incoming`: a recomputed saved tensor goes as the function returns, before the
    /// incoming gradient; else after it.
    fn drop_saved_then(&mut self, saved: usize, incoming: Tensor<'m>) {
        if self.kept.recomputed {
            self.release(saved);
            self.free(incoming);
        } else {
            self.free(incoming);
            self.release(saved);
        }
    }

    /// A `w`-wide RMSNorm's backward from `g` (freed): its input's gradient, summed into
    /// `acc` where given (the gradient the residual brought to the same tensor; freed).
    ///
    /// On a 16-bit stream the norm's input gradient comes through its fp32 cast
    /// ([`Self::rms`]). On an fp32 stream with an fp32 weight there is no cast: the product
    /// with `rsqrt` and the path through the mean each reach the input as they are made, and
    /// autograd's input buffer sums them (into `acc` at once).
    fn norm_into(
        &mut self,
        g: Tensor<'m>,
        kept: NormKept,
        w: u64,
        acc: Option<Tensor<'m>>,
        weight: Option<usize>,
    ) -> Tensor<'m> {
        let th = self.d.t * w;
        if self.d.liger_norm {
            return self.liger_rms(g, kept, w, acc, weight);
        }
        let NormKept { x, rsqrt, .. } = kept;
        if self.d.stream != 4 {
            let j = self.rms(g, kept, w, weight);
            let Some(acc) = acc else { return j };
            let sum = self.temp(2 * th);
            self.free(acc);
            self.free(j);
            return sum;
        }
        let by_weight = self.temp(4 * th);
        self.free(g);
        let by_x = self.temp(4 * th);
        let by_rsqrt = self.temp(4 * th);
        self.free(by_x);
        self.free(by_weight);
        let first = match acc {
            Some(acc) => {
                let first = self.temp(4 * th);
                self.free(acc);
                self.free(by_rsqrt);
                first
            }
            None => by_rsqrt,
        };
        self.release(rsqrt);
        let div = self.temp(4 * th);
        let pow = self.temp(4 * th);
        let scalar = self.temp(4 * th);
        let through_mean = self.temp(4 * th);
        self.free(scalar);
        self.free(pow);
        self.free(div);
        match x {
            Some(x) => self.release(x),
            None => {
                if let Some(input) = self.kept.input.take() {
                    self.free(input);
                }
            }
        }
        let sum = self.temp(4 * th);
        self.free(first);
        self.free(through_mean);
        sum
    }

    /// liger-kernel 0.8.5 `rms_norm_backward` from `g` (`in_place`: the input's gradient is
    /// written into `g`, which it returns): a trainable weight's gradient from one fp32 row
    /// per SM ([`LIGER_SM_COUNT`]) summed and cast to the weight's dtype; then the saved
    /// input and `RSTD` go (a checkpointed layer's input with its first norm's), and `acc`,
    /// the residual's gradient, is summed in.
    fn liger_rms(
        &mut self,
        g: Tensor<'m>,
        kept: NormKept,
        w: u64,
        acc: Option<Tensor<'m>>,
        weight: Option<usize>,
    ) -> Tensor<'m> {
        if let Some(p) = weight {
            let partial = self.temp(4 * LIGER_SM_COUNT * w);
            if self.grads.bytes == 4 {
                self.grad(p);
            } else {
                let sum = self.temp(4 * w);
                self.grad(p);
                self.free(sum);
            }
            self.free(partial);
        }
        self.release(kept.rsqrt);
        match kept.x {
            Some(x) => self.release(x),
            None if self.input_is_leaf() => {}
            None => {
                if let Some(input) = self.kept.input.take().or(self.kept.checkpoint.take()) {
                    self.free(input);
                }
            }
        }
        let Some(acc) = acc else { return g };
        let sum = self.temp(self.d.stream * self.d.t * w);
        self.free(acc);
        self.free(g);
        sum
    }

    /// A cast of `g` (freed) to `bytes`.
    fn cast(&mut self, g: Tensor<'m>, bytes: u64) -> Tensor<'m> {
        let c = self.temp(bytes);
        self.free(g);
        c
    }

    /// k's or q's gradient after RoPE's backward, copied contiguous (`g` freed): RoPE's
    /// backward sums into a tensor laid out (batch, heads, tokens), so the `transpose` and
    /// `view` that made the projection's output heads-first come back as a `reshape` that
    /// copies (`ViewBackward0`; `clone` in the oracle's records, every kernel and stream).
    fn contiguous_rotated(&mut self, g: Tensor<'m>, bytes: u64) -> Tensor<'m> {
        self.cast(g, bytes)
    }

    /// [`Self::linear`] on a 4-bit layer ([`four_bit_forward`]): the adapter branch as on a
    /// 16-bit layer (its input gradient cast back to fp32 where autocast cast the input),
    /// then, where the input needs a gradient, bitsandbytes' `MatMul4Bit.backward` (the
    /// weight dequantized again, with the nested absmax) between the casts' backwards.
    #[allow(clippy::too_many_arguments)]
    fn four_bit_linear(
        &mut self,
        q4: FourBit,
        m: usize,
        roles: &Roles,
        g: Tensor<'m>,
        free_g: bool,
        mut sum: Option<Tensor<'m>>,
        needs_input: bool,
        started: Option<Start<'m>>,
    ) -> Option<Tensor<'m>> {
        let d = *self.d;
        let (i, o, t) = (d.width_in(m), d.width_out(m), d.t);
        let xd = four_bit_dtype(&d, m);
        if let Some(a) = roles.adapters[m] {
            let st = match started {
                Some(st) => st,
                None => self.start(m, g, false),
            };
            if let Some(g_x) = self.adapter_grads(m, a, st.scaled, needs_input, xd == 4) {
                sum = Some(self.accumulate(sum, g_x, xd * t * i));
            }
        }
        if !needs_input {
            if free_g {
                self.free(g);
            }
            return sum;
        }
        // The output cast's backward, then the matmul's against the dequantized weight.
        let g16 = if xd == 4 {
            let c = self.temp(2 * t * o);
            if free_g {
                self.free(g);
            }
            Some(c)
        } else {
            None
        };
        let absmax = q4.absmax(o * i);
        let absmax = (absmax > 0).then(|| self.temp(absmax));
        let weight = self.temp(2 * o * i);
        if let Some(a) = absmax {
            self.free(a);
        }
        let g_in = self.temp(2 * t * i);
        self.free(weight);
        match g16 {
            Some(c) => self.free(c),
            None if free_g => self.free(g),
            None => {}
        }
        let g_in = if xd == 4 {
            self.cast(g_in, 4 * t * i)
        } else {
            g_in
        };
        Some(self.accumulate(sum, g_in, xd * t * i))
    }

    /// `LlamaRMSNorm`'s backward over `w`-wide rows from `g` (freed): the gradient of its
    /// input, 16-bit.
    fn rms(&mut self, g: Tensor<'m>, kept: NormKept, w: u64, weight: Option<usize>) -> Tensor<'m> {
        let NormKept {
            x: x32,
            rsqrt,
            cast,
        } = kept;
        let th = self.d.t * w;
        let by_weight = self.temp(2 * th);
        if let Some(cast) = cast {
            // A trainable weight: its gradient, the sum over tokens of `g` times the cast.
            let product = self.temp(2 * th);
            if let Some(p) = weight {
                self.grad(p);
            }
            self.free(product);
            self.free(g);
            self.release(cast);
        } else {
            self.free(g);
        }
        let up = self.temp(4 * th);
        self.free(by_weight);
        let by_x = self.temp(4 * th);
        let by_rsqrt = self.temp(4 * th);
        self.free(by_x);
        self.free(up);
        self.release(rsqrt);
        let div = self.temp(4 * th);
        let pow = self.temp(4 * th);
        let scalar = self.temp(4 * th);
        let through_mean = self.temp(4 * th);
        self.free(scalar);
        self.free(pow);
        if self.kept.recomputed {
            // `PowBackward0` drops the recomputed input as it returns, then its incoming
            // gradient; with the layer's last saved tensor unpacked, checkpointing's frame
            // lets the layer's input go.
            if let Some(x32) = x32 {
                self.release(x32);
            }
            self.free(div);
            if x32.is_some()
                && x32 == self.kept.checkpoint_after
                && !self.input_is_leaf()
                && let Some(c) = self.kept.checkpoint.take()
            {
                self.free(c);
            }
        } else {
            self.free(div);
            if let Some(x32) = x32 {
                self.release(x32);
            }
        }
        let sum = self.temp(4 * th);
        self.free(by_rsqrt);
        self.free(through_mean);
        let out = self.temp(2 * th);
        self.free(sum);
        out
    }

    /// The flash kernel's backward: `softmax_d` and the fp32 `dq_accum` (sequence rounded
    /// to 128, head dimension to 32), with grouped KV heads k and v's gradients at the
    /// query heads' count, freed in reverse. PyTorch's `_flash_attention_backward` makes
    /// dq, dk and dv after them; flash-attn 2.8's `FlashAttnFunc.backward` before them
    /// (`empty_like` in Python, then `mha_bwd`, which rounds a head dimension over 128 to
    /// 64).
    fn sdpa(
        &mut self,
        roles: &Roles,
        d_attn: Tensor<'m>,
        [out, lse]: [usize; 2],
        rng: Option<usize>,
        casts: Option<(usize, usize, usize)>,
    ) -> (Tensor<'m>, Tensor<'m>, Tensor<'m>) {
        let d = *self.d;
        let grads = |bw: &mut Self| {
            (
                bw.temp(2 * d.t * d.q),
                bw.temp(2 * d.t * d.kv),
                bw.temp(2 * d.t * d.kv),
            )
        };
        let early = d.flash_attn.then(|| grads(self));
        let s128 = d.s.div_ceil(128) * 128;
        let head_round = if d.flash_attn && d.head_dim > 128 {
            64
        } else {
            32
        };
        let head_dim = d.head_dim.div_ceil(head_round) * head_round;
        let mut ws = vec![
            self.temp(4 * d.b * d.heads * s128),
            self.temp(4 * d.b * s128 * d.heads * head_dim),
        ];
        if d.kv < d.q {
            ws.push(self.temp(2 * d.t * d.q));
            ws.push(self.temp(2 * d.t * d.q));
        }
        let (dq, dk, dv) = match early {
            Some(g) => g,
            None => grads(self),
        };
        for w in ws.into_iter().rev() {
            self.free(w);
        }
        let recomputed = self.kept.recomputed;
        if !recomputed {
            self.free(d_attn);
        }
        let (q, k, v) = casts.unwrap_or((roles.q_rot, roles.k_rot, roles.v));
        for x in [q, k, v, out, lse].into_iter().chain(rng) {
            self.release(x);
        }
        if recomputed {
            self.free(d_attn);
        }
        (dq, dk, dv)
    }

    /// SDPA's math kernel's backward from `g` (freed): the output's fp32 cast, v's and the
    /// scores' gradients, the softmax's, q's and k's (scaled), with grouped KV heads
    /// `repeat_interleave`'s sums back to them, and the casts back to 16 bits. Returns dq,
    /// dk and dv.
    fn math(
        &mut self,
        g: Tensor<'m>,
        [qs, ks, v_rep, softmax]: [usize; 4],
    ) -> (Tensor<'m>, Tensor<'m>, Tensor<'m>) {
        let d = *self.d;
        let scores = d.b * d.heads * d.s * d.s;
        let tq = 4 * d.t * d.q;
        let mut g32 = self.temp(tq);
        self.free(g);
        // With more than one sequence the output's gradient is copied to fold its batch.
        if d.b > 1 {
            g32 = self.cast(g32, tq);
        }
        let g_v_rep = self.temp(tq);
        let g_probs = self.temp(4 * scores);
        self.free(g32);
        self.release(v_rep);
        let g_scores = self.temp(4 * scores);
        self.free(g_probs);
        self.release(softmax);
        let g_ks = self.temp(tq);
        let g_qs = self.temp(tq);
        self.free(g_scores);
        self.release(ks);
        self.release(qs);
        let g_k_rep = self.temp(tq);
        self.free(g_ks);
        // Without grouped heads nothing was repeated: no sums.
        let (g_v, g_k) = if d.kv < d.q {
            let g_v = self.temp(4 * d.t * d.kv);
            self.free(g_v_rep);
            let g_k = self.temp(4 * d.t * d.kv);
            self.free(g_k_rep);
            (g_v, g_k)
        } else {
            (g_v_rep, g_k_rep)
        };
        let g_q = self.temp(tq);
        self.free(g_qs);
        let dv = self.cast(g_v, 2 * d.t * d.kv);
        let dk = self.cast(g_k, 2 * d.t * d.kv);
        let dq = self.cast(g_q, 2 * d.t * d.q);
        (dq, dk, dv)
    }

    /// Eager attention's backward from `g` (freed): v's and the probabilities' gradients,
    /// the softmax's through its casts, the scaling's, q's and k's; with grouped KV heads
    /// `repeat_kv`'s gradients summed back to the KV heads. Returns dq, dk and dv.
    fn eager(
        &mut self,
        g: Tensor<'m>,
        [q, k_rep, v_rep, soft, probs]: [usize; 5],
    ) -> (Tensor<'m>, Tensor<'m>, Tensor<'m>) {
        let d = *self.d;
        let scores = d.b * d.heads * d.s * d.s;
        let tq = 2 * d.t * d.q;
        // With more than one sequence the output's gradient is copied to fold its batch.
        let g = if d.b > 1 {
            let c = self.temp(tq);
            self.free(g);
            c
        } else {
            g
        };
        let g_v = self.temp(tq);
        let g_probs = self.temp(2 * scores);
        self.free(g);
        self.release(v_rep);
        self.release(probs);
        let up = self.temp(4 * scores);
        self.free(g_probs);
        let g_soft = self.temp(4 * scores);
        self.free(up);
        self.release(soft);
        let down = self.temp(2 * scores);
        self.free(g_soft);
        let g_scaled = self.temp(2 * scores);
        self.free(down);
        let g_k = self.temp(tq);
        let g_q = self.temp(tq);
        self.free(g_scaled);
        self.release(k_rep);
        self.release(q);
        if d.kv < d.q {
            let dv = self.temp(2 * d.t * d.kv);
            self.free(g_v);
            let dk = self.temp(2 * d.t * d.kv);
            self.free(g_k);
            (g_q, dk, dv)
        } else {
            (g_q, g_k, g_v)
        }
    }

    /// Under eager attention or SDPA's math kernel, a contiguous copy of `g` (freed); else
    /// `g`.
    fn contiguous(&mut self, g: Tensor<'m>, bytes: u64) -> Tensor<'m> {
        if !self.d.heads_first() {
            return g;
        }
        let c = self.temp(bytes);
        self.free(g);
        c
    }

    /// `apply_rotary_pos_emb`'s backward for one of q and k (`g` freed).
    fn rope(&mut self, g: Tensor<'m>, w: u64) -> Tensor<'m> {
        let by_sin = self.temp(w);
        let neg = self.temp(w / 2);
        let s1 = self.temp(w);
        self.free(neg);
        let s2 = self.temp(w);
        self.free(by_sin);
        let rotated = self.temp(w);
        self.free(s1);
        self.free(s2);
        let by_cos = self.temp(w);
        self.free(g);
        let out = self.temp(w);
        self.free(rotated);
        self.free(by_cos);
        out
    }
}
