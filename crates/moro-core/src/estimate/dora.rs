//! DoRA's memory: what `DoraLinearLayer.forward` saves and the weight-norm transient it builds
//! every forward.
//!
//! PEFT 0.21.2 `tuners/lora/dora.py` `DoraLinearLayer.forward` with `variants.py`
//! `DoraLinearVariant.forward`; x arrives cast to the adapter dtype (`lora/layer.py`
//! `Linear.forward`: `_cast_input_dtype(x, lora_A.weight.dtype)`):
//!
//! - `get_lora_weight` runs `lora_B(lora_A(torch.eye(in)))` with autograd on, so the in × in
//!   identity and the in × out product live until the forward returns;
//! - `weight = dequantize_module_weight(base).to(x.dtype)` is a new tensor unless the base is
//!   an unquantized weight already in x's dtype; `get_weight_norm` adds
//!   `weight + scaling * lora_weight` (two more in × out) before its norm;
//! - `(mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * scaling` saves
//!   `base_result` and `lora_result` for the magnitude's gradient;
//! - with `lora_dropout > 0` `base_result` is recomputed as `F.linear(dropout(x), weight)`,
//!   which saves that weight: a full out × in copy per adapted module unless it is the base
//!   parameter itself.

use super::regime::Regime;
use crate::job::{Job, Quantization};
use crate::model::{Linear, ModelSpec};

/// Bytes per element of x inside DoRA (and of `lora_result`): the adapter dtype, or bf16
/// when autocast computes the adapter's matmuls.
const fn x_bytes(r: &Regime) -> u64 {
    if r.autocast { 2 } else { r.adapter_bytes }
}

/// Whether `weight.to(x.dtype)` (after dequantizing) is a new tensor rather than the base
/// parameter itself. Under autocast `F.linear` casts the fp32 copy back to bf16: new too.
fn weight_is_copied(job: &Job, r: &Regime) -> bool {
    job.quantization != Quantization::None || r.autocast || r.frozen_bytes != r.adapter_bytes
}

/// Saved bytes per token of one adapted module: `base_result` (the base output, or with
/// dropout the recomputed `F.linear` in x's dtype) and `lora_result`.
#[must_use]
pub fn saved_per_token(job: &Job, r: &Regime, out_features: u64, base_out_bytes: u64) -> u64 {
    let base_result = if job.adapter.dropout > 0.0 {
        x_bytes(r)
    } else {
        base_out_bytes
    };
    out_features * (base_result + x_bytes(r))
}

/// Saved bytes of one adapted module whatever the tokens: with dropout, the weight
/// `F.linear(dropout(x), weight)` keeps for its backward when it is a copy.
#[must_use]
pub fn saved_per_module(job: &Job, r: &Regime, l: &Linear) -> u64 {
    if job.adapter.dropout > 0.0 && weight_is_copied(job, r) {
        l.weight_numel() * x_bytes(r)
    } else {
        0
    }
}

/// The largest transient of one adapted module's forward (and of its recompute under
/// checkpointing): the identity, `lora_weight`, the weight copy (when not saved),
/// `scaling * lora_weight` and the sum (bitsandbytes' dequantized weight is freed by the
/// `.to(x.dtype)` that replaces it).
#[must_use]
pub fn forward_transient(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    if !job.method.is_peft() || !job.adapter.dora {
        return 0;
    }
    let xb = x_bytes(r);
    let copied = weight_is_copied(job, r);
    let copy_transient = u64::from(copied && job.adapter.dropout == 0.0);
    model
        .layers
        .iter()
        .flat_map(|g| g.linears.iter())
        .filter(|l| job.adapts(l))
        .map(|l| {
            let (i, o) = (l.in_features, l.out_features);
            (i * i + i * job.adapter.rank + (3 + copy_transient) * i * o) * xb
        })
        .max()
        .unwrap_or(0)
}
