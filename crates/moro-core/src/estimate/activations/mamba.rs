//! Saved activations of a Mamba-2 mixer ([`crate::model::SsmSpec`]) on transformers' torch
//! path: `GraniteMoeHybridMambaLayer.forward` → `causal_conv1d_fn` → `mamba2_scan_forward` →
//! `mamba2_chunk_scan` → `GraniteMoeHybridRMSNormGated` (transformers 5.25
//! `models/granitemoehybrid/modeling_granitemoehybrid.py`), which runs when `mamba_ssm` is
//! not installed. Traced in `validation/oracle-traces/hybrid.jsonl`.
//!
//! With `b` sequences of `S` tokens, `S'` = `S` rounded up to whole chunks of `l`, `c` = `S'/l`
//! chunks, `h` heads of `p` channels (`I = h·p`), `n` states, `g` groups, and `e` the
//! einsums' element size (fp32 after the scan's `.float()`; bf16 under autocast, which runs
//! `einsum`'s `bmm` in bf16), one sequence saves:
//!
//! - **chunk × chunk scores** (`h·S'·l` elements each): `L = exp(segment_sum(A))` in fp32,
//!   saved by `exp` and by `G * L`; `G = einsum(C, B)` (`e`), saved by that product; `M`
//!   (or autocast's bf16 copy of it), saved by the `Y_diag` einsum's `bmm`: `(4 + 2e)·h·S'·l`.
//! - **per-head states** (`S'·h·n` each): B repeated to every head and padded (fp32, saved
//!   by `B * decay_states`), and the four contiguous einsum operands built from C, B and
//!   `B_decay`: `(4 + 4e)·S'·h·n`.
//! - **per-head values** (`I` per token): `hidden_states.float()` (saved by the multiply by
//!   `dt`), the two einsum copies of x and `C_times_states` (saved by the multiply with
//!   `state_decay_out`): `4·S·I + 3e·S'·I`.
//! - **the gated norm** (fp32, `I` per token): the concatenated scan output, the gate's
//!   fp32 copy and its `silu`, their product (saved by `pow` and the `rsqrt` multiply):
//!   `16·S·I`.
//! - **chunk states**: `cat([previous_states, states])` and the einsum's copy of `states`:
//!   `e·h·p·n·(2c + 1)`.
//! - **the convolution**: its input, `in_proj`'s whole output (`o·S·(2I + 2gn + h)`, saved
//!   by `conv1d`), and its output over `S + k − 1` positions (saved by `silu`).
//! - **time steps** (`S·h`): `dt + dt_bias` and `softplus` in the projection's dtype and
//!   `dt[..., None].float()`; under autocast `softplus` runs in fp32, three fp32 tensors.
//! - **small**: `exp` of the per-chunk cumulative decay twice (`8·h·S'`), the inter-chunk
//!   decay (`4·h·(c+1)²`), the gated norm's `rsqrt` (`4·S·g`), the two boolean masks of each
//!   `segment_sum` (`2·l² + 2·(c+1)²`).
//!
//! A full fine-tune also saves what `D`, `A_log` and the gated norm's weight need: the padded
//! fp32 x for `D` (`4·S'·I`), the normalized product for the norm weight (`4·S·I`) and,
//! without autocast, `dt.float()` for `A` (`4·S·h`).

use super::Ctx;
use crate::job::Method;
use crate::model::SsmSpec;

impl Ctx<'_> {
    /// Saved bytes per token of one Mamba-2 mixer's scan, convolution and gated norm (its
    /// Linears' inputs are [`Self::linear_inputs`]'), rounded up from the sequence's bytes.
    pub(super) fn mamba_core(&self, ssm: &SsmSpec) -> u64 {
        let tokens = self.job.seq_len.max(1);
        self.mamba_sequence(ssm).div_ceil(tokens)
    }

    /// Saved bytes of one sequence (the module doc's terms).
    fn mamba_sequence(&self, ssm: &SsmSpec) -> u64 {
        let s = self.job.seq_len;
        let l = ssm.chunk.max(1);
        let chunks = s.div_ceil(l);
        let padded = chunks * l;
        let (h, p, n, g) = (ssm.heads, ssm.head_dim, ssm.state, ssm.groups);
        let inner = ssm.inner();
        let autocast = self.r.autocast;
        let e = if autocast { 2 } else { 4 };
        let o = self.linear_out_bytes(self.r.stream_bytes);

        let scores = (4 + 2 * e) * h * padded * l;
        let states_per_head = (4 + 4 * e) * padded * h * n;
        let values = 4 * s * inner + 3 * e * padded * inner;
        let gated_norm = 16 * s * inner;
        let chunk_states = e * h * p * n * (2 * chunks + 1);
        let conv =
            o * s * ssm.in_proj_width() + o * ssm.conv_channels() * (s + ssm.conv_kernel - 1);
        let time_steps = if autocast {
            12 * s * h
        } else {
            (2 * o + 4) * s * h
        };
        let small = 8 * h * padded
            + 4 * h * (chunks + 1) * (chunks + 1)
            + 4 * s * g
            + 2 * l * l
            + 2 * (chunks + 1) * (chunks + 1);
        let full = if self.job.method == Method::Full {
            4 * padded * inner + 4 * s * inner + if autocast { 0 } else { 4 * s * h }
        } else {
            0
        };
        scores
            + states_per_head
            + values
            + gated_norm
            + chunk_states
            + conv
            + time_steps
            + small
            + full
    }
}
