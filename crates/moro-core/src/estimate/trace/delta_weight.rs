//! One LoHa or LoKr module's forward as the allocator sees it: the weight-sized ΔW these
//! methods build from their factors every forward (and every recompute under
//! checkpointing), and the input casts around `F.linear(x, ΔW)`.
//!
//! PEFT 0.21.2 `tuners/lycoris_utils.py` `LycorisLayer.forward` adds
//! `_get_delta_activations(x)` to the base layer's output; that builds ΔW
//! (`get_delta_weight`), casts x to ΔW's dtype (`_cast_input_dtype`) and runs
//! `F.linear(x, ΔW)`:
//!
//! - **LoHa** (`tuners/loha/layer.py` `HadaWeight.forward`): `w1a @ w1b` and `w2a @ w2b`,
//!   their product (the two factors then freed), times the scale: ΔW, out × in in the
//!   matmuls' dtype (16-bit under autocast), which `F.linear` saves;
//! - **LoKr** (`tuners/lokr/layer.py` `make_kron`): `lokr_w2_a @ lokr_w2_b` (saved by
//!   `kron` for `lokr_w1`'s gradient), `torch.kron(w1, w2)` in the adapter dtype (`w1`
//!   promotes it), times the scale (the `kron` then freed); x cast to that dtype; under
//!   autocast `F.linear` casts ΔW and x to 16 bits and saves those copies, else it saves ΔW
//!   and the cast x themselves.
//!
//! The tensors a module saves are counted with its layer's saved tensors ([`super::step`]);
//! in a forward that keeps its graph only the others are made here. The sequences follow
//! the real step's allocations (`validation/oracle-traces/step-events-peft-weight.jsonl`).

use crate::job::{Job, PeftKind};
use crate::model::Linear;

use super::super::{Regime, weights};
use super::{Builder, unless_saved};

/// What one LoHa or LoKr module allocates, in bytes ([`module_forward`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeltaModule {
    /// LoHa: each factor product, their product and ΔW, all out × in in the matmuls' dtype;
    /// `x_cast`, x cast to that dtype where that is a copy.
    Hadamard { weight: u64, x_cast: u64 },
    /// LoKr: `w2`, the product `kron` saves (0 where `lokr_w2` is whole); `kron`, out × in
    /// in the adapter dtype (and ΔW, its scaled copy); `x_cast`, x in the adapter dtype
    /// where that is a copy; under autocast, `weight_copy` and `x_copy`, the 16-bit copies
    /// `F.linear` saves (0 without autocast).
    Kronecker {
        w2: u64,
        kron: u64,
        x_cast: u64,
        weight_copy: u64,
        x_copy: u64,
    },
}

impl DeltaModule {
    /// The module `l` of a micro-batch of `tokens` tokens under `job` and `r`, or `None`
    /// where the method builds no ΔW.
    #[must_use]
    pub(crate) fn of(l: &Linear, job: &Job, r: &Regime, tokens: u64) -> Option<Self> {
        let (i, o) = (l.in_features, l.out_features);
        let ab = r.adapter_bytes;
        let matmul = super::super::activations::delta_weight_bytes(r);
        let xb = r.stream_bytes;
        match job.adapter.method {
            PeftKind::LoHa => Some(Self::Hadamard {
                weight: o * i * matmul,
                x_cast: if xb == matmul { 0 } else { tokens * i * matmul },
            }),
            PeftKind::LoKr => {
                let ((_, b), (_, d)) = weights::lokr_factors(l, job.adapter.decompose_factor);
                let copies = r.autocast && ab != 2;
                Some(Self::Kronecker {
                    w2: if weights::lokr_w2_factored(job.adapter.rank, b, d) {
                        b * d * matmul
                    } else {
                        0
                    },
                    kron: o * i * ab,
                    x_cast: if xb == ab { 0 } else { tokens * i * ab },
                    weight_copy: if copies { o * i * 2 } else { 0 },
                    x_copy: if copies { tokens * i * 2 } else { 0 },
                })
            }
            _ => None,
        }
    }
}

/// Emits one LoHa or LoKr module's forward into `b` for decoder layer `layer`.
/// `keeps_graph`: the forward records what autograd saves (a recompute, or no
/// checkpointing), so the tensors `F.linear` and `kron` save are left to the layer's saved
/// tensors; otherwise (a checkpointed forward under `no_grad`) they are made and freed here.
pub(crate) fn module_forward<'m>(
    b: &mut Builder<'m>,
    m: &DeltaModule,
    layer: u64,
    keeps_graph: bool,
) {
    let at = Some(layer);
    match *m {
        DeltaModule::Hadamard { weight, x_cast } => {
            let first = b.module_tensor("LoHa w1a @ w1b", at, weight);
            let second = b.module_tensor("LoHa w2a @ w2b", at, weight);
            let product = b.module_tensor("LoHa product", at, weight);
            b.free_made(&[first, second]);
            let delta = b.module_tensor("LoHa ΔW", at, unless_saved(keeps_graph, weight));
            b.free_made(&[product]);
            let x = b.module_tensor("LoHa x cast", at, unless_saved(keeps_graph, x_cast));
            b.free_made(&[delta, x]);
        }
        DeltaModule::Kronecker {
            w2,
            kron,
            x_cast,
            weight_copy,
            x_copy,
        } => {
            // Without autocast `F.linear` saves the scaled `kron` (ΔW) and the cast x
            // themselves; with it, their 16-bit copies.
            let saves_own = keeps_graph && weight_copy == 0;
            let w2 = b.module_tensor("LoKr w2", at, unless_saved(keeps_graph, w2));
            let product = b.module_tensor("LoKr kron", at, kron);
            let delta = b.module_tensor("LoKr ΔW", at, unless_saved(saves_own, kron));
            b.free_made(&[product]);
            let x = b.module_tensor("LoKr x cast", at, unless_saved(saves_own, x_cast));
            let delta16 = b.module_tensor(
                "LoKr ΔW (autocast)",
                at,
                unless_saved(keeps_graph, weight_copy),
            );
            let x16 = b.module_tensor("LoKr x (autocast)", at, unless_saved(keeps_graph, x_copy));
            b.free_made(&[delta16, x, delta, x16, w2]);
        }
    }
}
