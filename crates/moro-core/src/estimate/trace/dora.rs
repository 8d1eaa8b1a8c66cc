//! One DoRA module's forward as the allocator sees it: the weight-sized temporaries
//! `DoraLinearLayer.forward` makes every forward (and every recompute under checkpointing)
//! and the token-sized ones of its result.
//!
//! PEFT 0.21.2 `tuners/lora/layer.py` `Linear.forward` casts x to the adapter dtype
//! (`_cast_input_dtype`), then `variants.py` `DoraLinearVariant.forward` calls
//! `tuners/lora/dora.py` `DoraLinearLayer.forward`, in this order:
//!
//! 1. `get_lora_weight`: `torch.eye(in)` in the adapter dtype; under autocast `lora_A`
//!    casts it to 16 bits; what `lora_A` reads (that copy, or the identity itself) is kept
//!    by the graph in a recompute or without checkpointing, and dropped at once by a
//!    checkpointed forward's saved-tensor hooks; `lora_B(lora_A(eye))` is an in × out
//!    matrix in the matmuls' dtype;
//! 2. `lora_weight.to(x.dtype)`: a copy in the adapter dtype where the matmuls ran in 16
//!    bits (the 16-bit product is then freed);
//! 3. `dequantize_module_weight(base).to(x.dtype)`: a copy of the base weight unless it is
//!    already in x's dtype (a 4-bit weight is dequantized to 16 bits first);
//! 4. `get_weight_norm`: `scaling * lora_weight`, then `weight + …`, both weight-sized and
//!    freed once the norm is taken;
//! 5. with `lora_dropout > 0`, `base_result = F.linear(dropout(x), weight)` (under autocast
//!    on a 16-bit copy of the weight copy), where without dropout the base layer's output
//!    serves;
//! 6. the result `(m − 1) · base_result + m · lora_result · scaling` in the adapter dtype
//!    (three token-sized products, their sum), added to the base output out of place;
//!    `lora_weight`, the weight copy and the graph of `lora_weight` die when the function
//!    returns.
//!
//! The sequence follows the real step's allocations for Llama-3.1-8B
//! (`validation/oracle-traces/step-events-h200-dora.jsonl`), the tensors `Activations`
//! counts as saved left out: they are allocated with the layer's saved tensors.

use crate::job::{Job, Quantization};
use crate::model::Linear;

use super::super::Regime;
use super::Builder;

/// What one DoRA module allocates, in bytes ([`module_forward`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DoraModule {
    /// The identity, `in × in` in the adapter dtype.
    eye: u64,
    /// Autocast's 16-bit copy of the identity (0 without autocast or with 16-bit adapters).
    eye_cast: u64,
    /// `lora_B(lora_A(eye))` in the matmuls' dtype.
    product: u64,
    /// `lora_weight.to(x.dtype)` where that is a copy, else 0.
    product_cast: u64,
    /// A 4-bit base weight dequantized to 16 bits, else 0.
    dequantized: u64,
    /// `weight.to(x.dtype)` where that is a copy, else 0.
    weight_copy: u64,
    /// One weight-sized tensor in the adapter dtype (`scaling * lora_weight`, the sum).
    weight_sized: u64,
    /// x cast to the adapter dtype where that is a copy, else 0.
    x_cast: u64,
    /// One token-sized tensor of the result, in the adapter dtype.
    result: u64,
    /// With dropout: `dropout(x)` in the adapter dtype (0 without dropout).
    dropped: u64,
    /// With dropout: autocast's 16-bit copy of the weight `F.linear(dropout(x), weight)`
    /// reads (0 without dropout or autocast).
    weight_cast: u64,
    /// With dropout: `base_result`, recomputed by that `F.linear` (0 without dropout).
    base_result: u64,
}

impl DoraModule {
    /// The module `l` of a micro-batch of `tokens` tokens under `job` and `r`.
    #[must_use]
    pub(crate) fn of(l: &Linear, job: &Job, r: &Regime, tokens: u64) -> Self {
        let (i, o) = (l.in_features, l.out_features);
        let xa = r.adapter_bytes;
        // Under autocast the adapter's matmuls return 16 bits; without it, the adapter dtype.
        let matmul = if r.autocast { 2 } else { xa };
        let quantized = job.quantization != Quantization::None;
        let base_bytes = if quantized { 2 } else { r.frozen_bytes };
        let dropout = job.adapter.dropout > 0.0;
        Self {
            eye: i * i * xa,
            eye_cast: if r.autocast && xa != 2 { i * i * 2 } else { 0 },
            product: i * o * matmul,
            product_cast: if matmul == xa { 0 } else { i * o * xa },
            dequantized: if quantized { i * o * 2 } else { 0 },
            weight_copy: if base_bytes == xa && !quantized {
                0
            } else {
                i * o * xa
            },
            weight_sized: i * o * xa,
            x_cast: if xa == r.stream_bytes {
                0
            } else {
                tokens * i * xa
            },
            result: tokens * o * xa,
            dropped: if dropout { tokens * i * xa } else { 0 },
            weight_cast: if dropout && r.autocast && xa != 2 {
                i * o * 2
            } else {
                0
            },
            base_result: if dropout { tokens * o * matmul } else { 0 },
        }
    }
}

/// Emits one DoRA module's forward into `b` for decoder layer `layer`. `keeps_graph`: the
/// forward records what autograd saves (a recompute, or no checkpointing), so what
/// `lora_A` reads of the identity (autocast's copy, or the identity itself) lives until the
/// module returns.
pub(crate) fn module_forward<'m>(
    b: &mut Builder<'m>,
    m: &DoraModule,
    layer: u64,
    keeps_graph: bool,
) {
    let layer = Some(layer);
    let mut held = Vec::new();
    let x_cast = b.module_tensor("DoRA x cast", layer, m.x_cast);
    let dropped = b.module_tensor("DoRA dropout(x)", layer, m.dropped);
    let eye = b.module_tensor("DoRA identity", layer, m.eye);
    let eye_cast = b.module_tensor("DoRA identity (autocast)", layer, m.eye_cast);
    if let Some(t) = eye_cast {
        if keeps_graph {
            held.push(t);
        } else {
            b.free(t);
        }
    }
    let product = b.module_tensor("DoRA lora_weight", layer, m.product);
    if let Some(t) = eye {
        // Without a 16-bit copy, `lora_A`'s matmul saves the identity itself.
        if keeps_graph && eye_cast.is_none() {
            held.push(t);
        } else {
            b.free(t);
        }
    }
    match b.module_tensor("DoRA lora_weight cast", layer, m.product_cast) {
        Some(cast) => {
            held.push(cast);
            if let Some(t) = product {
                b.free(t);
            }
        }
        None => held.extend(product),
    }
    let dequantized = b.module_tensor("DoRA dequantized weight", layer, m.dequantized);
    held.extend(b.module_tensor("DoRA weight copy", layer, m.weight_copy));
    if let Some(t) = dequantized {
        b.free(t);
    }
    let scaled = b.module_tensor("DoRA scaling * lora_weight", layer, m.weight_sized);
    let sum = b.module_tensor("DoRA weight + scaled", layer, m.weight_sized);
    for t in [scaled, sum].into_iter().flatten() {
        b.free(t);
    }
    // With dropout, `base_result = F.linear(dropout(x), weight)`; what it saves for its
    // backward is counted with the layer's saved tensors.
    let weight_cast = b.module_tensor("DoRA weight (autocast)", layer, m.weight_cast);
    let base_result = b.module_tensor("DoRA base_result", layer, m.base_result);
    if let Some(t) = weight_cast {
        b.free(t);
    }
    // `(m − 1) · base_result`, `m · lora_result`, `· scaling`, then their sum.
    let first = b.module_tensor("DoRA result", layer, m.result);
    let second = b.module_tensor("DoRA result", layer, m.result);
    let scaled_result = b.module_tensor("DoRA result", layer, m.result);
    if let Some(t) = second {
        b.free(t);
    }
    let dora = b.module_tensor("DoRA result", layer, m.result);
    for t in [first, scaled_result].into_iter().flatten() {
        b.free(t);
    }
    b.free_all(held);
    // `result + result_dora`, out of place, then the cast back to the base output's dtype.
    let out = b.module_tensor("DoRA output", layer, m.result);
    for t in [dora, out, base_result, dropped, x_cast]
        .into_iter()
        .flatten()
    {
        b.free(t);
    }
}
