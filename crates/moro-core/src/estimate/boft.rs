//! BOFT's memory: what each adapted Linear builds and saves every forward.
//!
//! PEFT `tuners/boft/layer.py` `Linear.forward` from 0.20.0 (main from June 2026, commit
//! 64a9867, which reports itself as 0.19.2.dev0; 0.21.2 the same), per module, with D
//! butterfly factors and x in its own dtype:
//!
//! - `torch.eye(in)` in x's dtype, saved by `butterfly_oft_mat @ boft_rotation`;
//! - the block-diagonal matrix of the Cayley blocks, (D, in, in) in fp32 (`FastBlockDiag`,
//!   or `torch.block_diag` without the CUDA extension), cast to x's dtype (`.to(x)`: the fp32
//!   one is then dropped) and kept until the forward returns;
//! - `self.boft_P.to(x)`: a copy of the permutations in x's dtype, saved by both `bmm`s;
//! - `bmm(block_diag, Pᵀ)` (dropped by the next `bmm`) and `bmm(P, ·)`, (D, in, in); with
//!   D ≥ 2 the second is saved by the products `batch[i] @ mat`, each of which but the last
//!   is saved by the next; with D = 1 it is kept until the forward returns;
//! - the rotation `mat @ eye`, in × in, saved by `x @ boft_rotation` for x's gradient (none
//!   in the first layer without checkpointing: [`crate::job::PeftKind::first_layer_saves_less`]);
//! - `x @ boft_rotation` (dropped), the frozen Linear's output, saved by `result * boft_scale`,
//!   and that product in fp32 (`boft_scale` is an fp32 parameter), cast back to x's dtype.
//!
//! Under autocast with an fp32 x (a 4-bit base after `prepare_model_for_kbit_training`) each
//! matmul casts its fp32 inputs to 16 bits and saves those casts, the permutations once for
//! each `bmm`.
//!
//! `validation/oracle-traces/step-events-peft-boft.jsonl` and `step-events-peft-qlora.jsonl`
//! record these on fake tensors (with D = 2 through a stand-in for the CUDA extension's
//! output). PEFT uses D = 1 whatever the config says when the extension does not build
//! (`update_layer`); moro takes the config's D.

use super::regime::Regime;
use crate::job::{Job, PeftKind};
use crate::model::{Linear, ModelSpec};

/// One BOFT job's element sizes and factor count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Boft {
    /// D, the butterfly factors.
    pub(crate) factors: u64,
    /// Bytes per element of x, the identity and the cast copies (`.to(x)`).
    pub(crate) stream: u64,
    /// Bytes per element of the `bmm` and `mm` outputs: 16-bit under autocast, else x's.
    pub(crate) matmul: u64,
    /// Copies of the permutations the `bmm`s save: one (`boft_P.to(x)`, saved by both), or
    /// under autocast with an fp32 x (a 4-bit base after `prepare_model_for_kbit_training`)
    /// two, autocast's 16-bit casts of `Pᵀ` and `P`, one for each `bmm`.
    pub(crate) permutation_copies: u64,
}

impl Boft {
    #[must_use]
    pub(crate) fn new(job: &Job, r: &Regime) -> Self {
        Self {
            factors: job.adapter.boft_butterfly_factor().max(1),
            stream: r.stream_bytes,
            matmul: if r.autocast { 2 } else { r.stream_bytes },
            permutation_copies: if r.autocast && r.stream_bytes != 2 {
                2
            } else {
                1
            },
        }
    }

    /// The saved bytes of module `l` that do not grow with the tokens: the identity, the
    /// permutations' copies, with D ≥ 2 the second `bmm`'s output and all products but the
    /// last, and the rotation, each in the matmuls' dtype (under autocast the 16-bit casts
    /// are what is saved).
    #[must_use]
    pub(crate) fn saved(&self, l: &Linear) -> u64 {
        let square = l.in_features * l.in_features;
        let d = self.factors;
        let butterfly = if d >= 2 { 2 * d - 2 } else { 0 };
        square * self.matmul * (1 + self.permutation_copies * d + butterfly) + self.rotation(l)
    }

    /// The rotation `x @ boft_rotation` saves, in × in.
    #[must_use]
    pub(crate) const fn rotation(&self, l: &Linear) -> u64 {
        l.in_features * l.in_features * self.matmul
    }

    /// The most a module's backward holds beyond what it saved, for the widest adapted
    /// module: the rotation's gradient and the product's, less the rotation freed between
    /// them; then the permutation products' gradients, their fp32 cast for the Cayley blocks,
    /// as what was saved is freed.
    #[must_use]
    pub(crate) fn backward_transient(&self, model: &ModelSpec, job: &Job) -> u64 {
        widest_square(model, job) * self.factors * self.matmul
    }

    /// The forward's transients of module `l` at their most: the fp32 block-diagonal
    /// matrix beside its cast, then the cast beside both `bmm` outputs (the second is saved
    /// with D ≥ 2).
    #[must_use]
    pub(crate) fn forward_peak(&self, l: &Linear) -> u64 {
        let square = l.in_features * l.in_features;
        let d = self.factors;
        let first = d * square * (4 + self.stream);
        let outputs = if d >= 2 { 1 } else { 2 };
        let second = d * square * (self.stream + outputs * self.matmul);
        first.max(second)
    }
}

/// in × in of the adapted Linear with the widest input.
fn widest_square(model: &ModelSpec, job: &Job) -> u64 {
    model
        .linears()
        .filter(|(_, l)| job.adapts(l))
        .map(|(_, l)| l.in_features * l.in_features)
        .max()
        .unwrap_or(0)
}

/// The largest transient of one adapted module's forward (and of its recompute under
/// checkpointing); 0 for other methods.
#[must_use]
pub fn forward_transient(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    if !job.method.is_peft() || job.adapter.method != PeftKind::Boft {
        return 0;
    }
    let boft = Boft::new(job, r);
    model
        .linears()
        .filter(|(_, l)| job.adapts(l))
        .map(|(_, l)| boft.forward_peak(l))
        .max()
        .unwrap_or(0)
}
