//! One BOFT module's forward as the allocator sees it (the order of
//! [`crate::estimate::boft`]'s list): the identity, the fp32 block-diagonal matrix and the
//! casts, the two `bmm`s, the products and the rotation, then the rotated input, the
//! Linear's output and its fp32 scaled copy.
//!
//! The tensors a module saves are counted with its layer's saved tensors ([`super::step`]);
//! in a forward that keeps its graph only the others are made here. The sequence follows the
//! real step's allocations (`validation/oracle-traces/step-events-peft-boft.jsonl`).

use crate::model::Linear;

use super::super::boft::Boft;
use super::{Builder, unless_saved};

/// What one BOFT module allocates, in bytes ([`module_forward`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BoftModule {
    /// in × in in x's dtype (the identity), in the matmuls' (the rotation, a product) and
    /// in fp32 (the block-diagonal matrix).
    square: u64,
    square_matmul: u64,
    square_fp32: u64,
    /// D.
    factors: u64,
    /// The rotated input, tokens × in; the Linear's output, tokens × out; its scaled fp32
    /// copy.
    rotated: u64,
    output: u64,
    scaled: u64,
}

impl BoftModule {
    /// Module `l` of a micro-batch of `tokens` tokens.
    #[must_use]
    pub(crate) fn of(l: &Linear, boft: &Boft, tokens: u64) -> Self {
        let square = l.in_features * l.in_features;
        Self {
            square: square * boft.stream,
            square_matmul: square * boft.matmul,
            square_fp32: square * 4,
            factors: boft.factors,
            rotated: tokens * l.in_features * boft.matmul,
            output: tokens * l.out_features * boft.matmul,
            scaled: tokens * l.out_features * 4,
        }
    }
}

/// Emits one BOFT module's forward into `b` for decoder layer `layer`. `keeps_graph`: the
/// forward records what autograd saves (the identity, the permutations' copy, the second
/// `bmm` and the products with two factors or more, the rotation, the Linear's output), so
/// those are left to the layer's saved tensors; otherwise they are made and freed here.
pub(crate) fn module_forward<'m>(
    b: &mut Builder<'m>,
    m: &BoftModule,
    layer: u64,
    keeps_graph: bool,
) {
    let at = Some(layer);
    let d = m.factors;
    let eye = b.module_tensor("BOFT identity", at, unless_saved(keeps_graph, m.square));
    let block_diagonal = b.module_tensor("BOFT block-diagonal (fp32)", at, d * m.square_fp32);
    let permutations = b.module_tensor(
        "BOFT permutations (cast)",
        at,
        unless_saved(keeps_graph, d * m.square),
    );
    let blocks = b.module_tensor("BOFT block-diagonal (cast)", at, d * m.square);
    b.free_made(&[block_diagonal]);
    let first = b.module_tensor("BOFT bmm", at, d * m.square_matmul);
    let batch = b.module_tensor(
        "BOFT butterfly",
        at,
        unless_saved(keeps_graph && d >= 2, d * m.square_matmul),
    );
    b.free_made(&[first]);
    // Each product but the last is saved by the next; every product replaces the one before
    // where nothing saves it.
    let mut product = None;
    for i in 1..d {
        let last = i + 1 == d;
        let next = b.module_tensor(
            "BOFT product",
            at,
            unless_saved(keeps_graph && !last, m.square_matmul),
        );
        b.free_made(&[product.take()]);
        product = next;
    }
    let rotation = b.module_tensor(
        "BOFT rotation",
        at,
        unless_saved(keeps_graph, m.square_matmul),
    );
    let rotated = b.module_tensor("BOFT rotated input", at, m.rotated);
    let output = b.module_tensor("BOFT output", at, unless_saved(keeps_graph, m.output));
    let scaled = b.module_tensor("BOFT scaled output (fp32)", at, m.scaled);
    b.free_made(&[scaled]);
    b.free_made(&[
        rotation,
        blocks,
        batch,
        product,
        rotated,
        output,
        eye,
        permutations,
    ]);
}
