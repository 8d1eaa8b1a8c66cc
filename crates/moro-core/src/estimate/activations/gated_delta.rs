//! Saved activations of a gated DeltaNet mixer ([`crate::model::GatedDeltaNetSpec`]) on
//! transformers' torch path: `Qwen3NextGatedDeltaNet.forward` → `causal_conv1d_fn` →
//! `torch_chunk_gated_delta_rule` → `Qwen3NextRMSNormGated` (transformers 5.25
//! `models/qwen3_next/modeling_qwen3_next.py`), which runs when `fla` is not installed.
//! Traced in `validation/oracle-traces/hybrid.jsonl`.
//!
//! With `S` tokens, `S'` = `S` rounded up to whole chunks of `l` (64), `c` = `S'/l` chunks,
//! `h` value heads (q and k repeated to them), `dk` and `dv` the key and value head widths,
//! `V = h·dv`, one sequence saves:
//!
//! - **q, k, v in fp32**: the padded copies (`F.pad`, saved by the products that read them),
//!   and q and k before it, saved by `l2norm`: `4·S'·h·(2dk + dv) + 8·S·h·dk`.
//! - **the UT transform**: `solve_triangular`'s two results, `new_values` and `k_cumdecay`,
//!   and `k_beta`: `4·S'·h·(dv + 2dk)`.
//! - **chunk × chunk** (`h·S'·l` elements each): the two `bmm`s (`k_beta @ kᵀ`, `q @ kᵀ`), the
//!   decay `exp` and the two products with it, fp32 (`20·h·S'·l`); under autocast the `bmm`s
//!   are bf16 and only one product is kept (`12·h·S'·l`).
//! - **the chunk loop** (a Python `for` over the chunks): without autocast the decayed q and k
//!   (`8·S'·h·dk`), each chunk's `v_new` (`4·S'·h·dv`) and each state before its update
//!   (`c · 4·h·dk·dv`); under autocast each chunk's `@` keeps bf16 copies instead: the state
//!   twice, `v_new` twice, `k_cumdecay`'s and q's slices, kᵀ's and the intra-chunk scores'
//!   (`c·4·h·dk·dv + 2·S'·h·(2dv + 3dk + l)`), beside the `bmm` operands' bf16 copies
//!   (`8·S'·h·dk`) and the fp32 states.
//! - **the gated norm**: the output's and the gate's fp32 copies and `silu` (`12·S·V`), and
//!   the normed output (`o·S·V`).
//! - **the convolution**: its input, the concatenated q, k, v (`o·S·(2K + V)`, saved by
//!   `conv1d`), and its output over `S + k − 1` positions (saved by `silu`).
//! - **small**: `l2norm`'s and the gated norm's `rsqrt` (`12·S·h`), the three per-chunk decay
//!   `exp`s (`12·h·S'`), β's `sigmoid` (`o·S·h`), `a.float() + dt_bias` (`4·S·h`), the padded
//!   decay (`4·h·S'`), the causal mask (`l²`).
//!
//! A full fine-tune also saves `softplus`'s output for `A_log` (`4·S·h`) and the normed output
//! for the gated norm's weight (`o·S·V`).

use super::Ctx;
use crate::job::Method;
use crate::model::GatedDeltaNetSpec;

impl Ctx<'_> {
    /// Saved bytes per token of one gated DeltaNet mixer's rule, convolution and gated norm
    /// (its Linears' inputs are [`Self::linear_inputs`]'), rounded up from the sequence's.
    pub(super) fn gated_delta_core(&self, g: &GatedDeltaNetSpec) -> u64 {
        let tokens = self.job.seq_len.max(1);
        self.gated_delta_sequence(g).div_ceil(tokens)
    }

    /// Saved bytes of one sequence (the module doc's terms).
    fn gated_delta_sequence(&self, g: &GatedDeltaNetSpec) -> u64 {
        let s = self.job.seq_len;
        let l = g.chunk.max(1);
        let chunks = s.div_ceil(l);
        let padded = chunks * l;
        let (h, dk, dv) = (g.value_heads, g.key_head_dim, g.value_head_dim);
        let v = g.value_dim();
        let autocast = self.r.autocast;
        let o = self.linear_out_bytes(self.r.stream_bytes);

        let qkv = 4 * padded * h * (2 * dk + dv) + 8 * s * h * dk;
        let ut = 4 * padded * h * (dv + 2 * dk);
        let scores = if autocast { 12 } else { 20 } * h * padded * l;
        let states = chunks * 4 * h * dk * dv;
        let chunk_loop = if autocast {
            states + 2 * padded * h * (2 * dv + 3 * dk + l) + 8 * padded * h * dk
        } else {
            8 * padded * h * dk + 4 * padded * h * dv
        };
        let gated_norm = 12 * s * v + o * s * v;
        let conv = o * s * g.conv_channels() + o * g.conv_channels() * (s + g.conv_kernel - 1);
        let small = 12 * s * h + 12 * h * padded + o * s * h + 4 * s * h + 4 * h * padded + l * l;
        let full = if self.job.method == Method::Full {
            4 * s * h + o * s * v
        } else {
            0
        };
        qkv + ut + scores + states + chunk_loop + gated_norm + conv + small + full
    }
}
