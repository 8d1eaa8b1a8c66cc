//! Inference of recurrent layers on transformers' torch paths, traced in
//! `validation/oracle-traces/hybrid-prefill.jsonl`: Mamba-2 ([`SsmSpec`]; transformers 5.25
//! `modeling_granitemoehybrid.py`: `causal_conv1d_forward`, `mamba2_scan_forward`,
//! `mamba2_chunk_scan`) and the gated DeltaNet ([`GatedDeltaNetSpec`];
//! `modeling_qwen3_next.py`: `Qwen3NextGatedDeltaNet.forward`,
//! `torch_chunk_gated_delta_rule`).

use crate::model::{AttentionKind, GatedDeltaNetSpec, ModelSpec, SsmSpec};

/// Bytes of the recurrent state `batch` sequences keep in place of a KV cache: per Mamba-2
/// layer the convolution's last `conv_kernel` inputs over every channel, in the model's
/// dtype (`cache.update_conv_state`), and the scan's final state, `heads × head_dim ×
/// state`, in the fp32 the chunk scan computes it in (`return_final_states`). It does not
/// grow with the context.
///
/// A gated DeltaNet layer keeps the same convolution state over q, k and v and the rule's
/// state, `value heads × key width × value width`, in fp32.
#[must_use]
pub fn state_bytes(model: &ModelSpec, batch: u64, elem: u64, tp: u64) -> u64 {
    let per_layer = match (&model.ssm, &model.gated_delta_net) {
        (Some(ssm), _) => {
            elem * ssm.conv_channels() * ssm.conv_kernel + 4 * ssm.inner() * ssm.state
        }
        (None, Some(g)) => {
            elem * g.conv_channels() * g.conv_kernel
                + 4 * g.value_heads * g.key_head_dim * g.value_head_dim
        }
        (None, None) => return 0,
    };
    let layers: u64 = model
        .layers
        .iter()
        .filter(|g| g.attention == AttentionKind::Recurrent)
        .map(|g| g.count)
        .sum();
    layers * batch * per_layer / tp.max(1)
}

/// The widest moment of one recurrent layer's prefill ([`mamba_prefill`],
/// [`gated_delta_prefill`]), 0 for a model without recurrent layers.
#[must_use]
pub fn prefill_bytes(model: &ModelSpec, batch: u64, seq: u64, elem: u64) -> u64 {
    let h = model.hidden_size;
    match (&model.ssm, &model.gated_delta_net) {
        (Some(ssm), _) => mamba_prefill(ssm, h, batch, seq, elem),
        (None, Some(g)) => gated_delta_prefill(g, h, batch, seq, elem),
        (None, None) => 0,
    }
}

/// The widest moment of one gated DeltaNet layer's prefill of `batch` sequences of `seq`
/// tokens, `elem` bytes per activation element: inside `torch_chunk_gated_delta_rule`'s chunk
/// loop, ten fp32 per-head tensors of the padded length `S'` (the padded q, k and v, the β
/// products, the UT transform's two results, the decayed q and k, the output buffer; five of
/// key width, five of value width) and three chunk × chunk ones (`4·h·S'·l` each: the decay
/// and the two scores); outside it `in_proj_qkvz`'s and `in_proj_ba`'s outputs, the
/// convolved q, k and v, z's reshaped copy, and the layer's input, residual and normed
/// stream. Traced at 1,024 to 16,384 tokens (`validation/oracle-traces/hybrid-prefill.jsonl`).
#[must_use]
pub fn gated_delta_prefill(
    g: &GatedDeltaNetSpec,
    hidden: u64,
    batch: u64,
    seq: u64,
    elem: u64,
) -> u64 {
    let l = g.chunk.max(1);
    let padded = seq.div_ceil(l) * l;
    let h = g.value_heads;
    let rule = 20 * padded * h * (g.key_head_dim + g.value_head_dim) + 12 * h * padded * l;
    let outside = elem
        * seq
        * (2 * g.key_dim()
            + 2 * g.value_dim()
            + 2 * g.value_heads
            + g.conv_channels()
            + g.value_dim()
            + 3 * hidden);
    batch * (rule + outside)
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
pub fn mamba_prefill(ssm: &SsmSpec, hidden: u64, batch: u64, seq: u64, elem: u64) -> u64 {
    let l = ssm.chunk.max(1);
    let padded = seq.div_ceil(l) * l;
    let (h, n) = (ssm.heads, ssm.state);
    let scan = 16 * h * padded * l + 12 * padded * h * n + 16 * padded * ssm.inner();
    let outside = elem * seq * (ssm.in_proj_width() + ssm.conv_channels() + 3 * hidden);
    batch * (scan + outside)
}
