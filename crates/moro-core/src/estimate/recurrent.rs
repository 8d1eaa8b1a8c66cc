//! Inference of Mamba-2 layers ([`crate::model::SsmSpec`]) on transformers' torch path
//! (transformers 5.25 `modeling_granitemoehybrid.py`: `causal_conv1d_forward`,
//! `mamba2_scan_forward`, `mamba2_chunk_scan`), traced in
//! `validation/oracle-traces/hybrid-prefill.jsonl`.

use crate::model::{AttentionKind, ModelSpec, SsmSpec};

/// Bytes of the recurrent state `batch` sequences keep in place of a KV cache: per Mamba-2
/// layer the convolution's last `conv_kernel` inputs over every channel, in the model's
/// dtype (`cache.update_conv_state`), and the scan's final state, `heads × head_dim ×
/// state`, in the fp32 the chunk scan computes it in (`return_final_states`). It does not
/// grow with the context.
#[must_use]
pub fn state_bytes(model: &ModelSpec, batch: u64, elem: u64, tp: u64) -> u64 {
    let Some(ssm) = &model.ssm else { return 0 };
    let layers: u64 = model
        .layers
        .iter()
        .filter(|g| g.attention == AttentionKind::Recurrent)
        .map(|g| g.count)
        .sum();
    let per_layer = elem * ssm.conv_channels() * ssm.conv_kernel + 4 * ssm.inner() * ssm.state;
    layers * batch * per_layer / tp.max(1)
}

/// The widest moment of one Mamba-2 layer's prefill of `batch` sequences of `seq` tokens,
/// `elem` bytes per activation element: `mamba2_chunk_scan` keeps its locals to the end, so
/// at the `Y_diag` einsum the fp32 chunk × chunk tensors `L`, `G`, `M` and `M`'s contiguous
/// copy are alive (`4·h·S'·l` each, `S'` the padded length), with three per-head state
/// tensors (`4·S'·h·n`: B and C repeated and padded, and an einsum operand), four fp32
/// per-channel tensors (`4·S'·I`: the chunked x, the `D` residual, x's einsum copy and
/// `Y_diag`), and outside the scan `in_proj`'s output, the convolved x, B and C, and the
/// layer's input, residual and normed stream.
#[must_use]
pub fn prefill_bytes(ssm: &SsmSpec, hidden: u64, batch: u64, seq: u64, elem: u64) -> u64 {
    let l = ssm.chunk.max(1);
    let padded = seq.div_ceil(l) * l;
    let (h, n) = (ssm.heads, ssm.state);
    let scan = 16 * h * padded * l + 12 * padded * h * n + 16 * padded * ssm.inner();
    let outside = elem * seq * (ssm.in_proj_width() + ssm.conv_channels() + 3 * hidden);
    batch * (scan + outside)
}
