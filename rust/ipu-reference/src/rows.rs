//! The tolerance rule applied to each query row of an attention's result.
//!
//! The rule ([`crate::compare`]) scales its absolute term with the rms of
//! the whole output, which stands for the magnitude of the terms whose
//! rounding errors add up. Each query row of an attention is a computation
//! of its own, a weighted average of value rows, and its magnitude differs
//! from row to row: a causal query that sees one key returns that key's
//! value row, while a query that averages hundreds of keys is several times
//! smaller. The device's error in such a row is that of the value rows it
//! averages (V's projection error, and the scores' through the softmax),
//! so a tolerance scaled by the whole output's rms, which the many averaged
//! rows make small, fails a device whose every operation is within the
//! rule (docs/STATUS.md, issue 5 item 9: the BERT-large causal attention,
//! 40 of 524,288 outputs of query rows 0 and 1 up to 1.09 times outside
//! it, while the compositional check passes).
//!
//! [`attention_row_atol`] gives each element of an attention's result the
//! rule's atol computed from its own query row (the rms of that head's row
//! of the result), and the whole-graph check takes the larger of that and
//! the whole output's atol ([`crate::Tolerance::accepts_with`]). Rows of
//! the output's typical size keep their check; only rows larger than the
//! output's rms get more room, in proportion to their size. A wrong mask,
//! key or head moves a row by the size of the values themselves, far
//! beyond the rule's `u sqrt(K)` share of it (tests/compare.rs).

use ipu_graph::{Graph, Op, ValueDef, ValueId};

use crate::compare::Tolerance;
use crate::tensor::Tensor;

/// For value `id` of `graph` when it is an attention's result or that
/// result with its heads merged, and `reference` a reference of that value:
/// per element, the rule's atol for the element's query row alone (its
/// head's `D` values: contiguous in both layouts), with the longest
/// reduction and the re-quantisations (`rule`) that the check uses for the
/// whole value. `None` for any other value.
pub fn attention_row_atol(
    graph: &Graph,
    id: ValueId,
    reference: &Tensor,
    (reduction, requantised): (u64, &[f64]),
) -> Option<Vec<f64>> {
    let ValueDef::Node(n) = graph.value(id).def else {
        return None;
    };
    let result = match graph.node(n).op {
        Op::Attention { .. } => id,
        Op::MergeHeads => {
            let inner = graph.node(n).args[0];
            match graph.value(inner).def {
                ValueDef::Node(m) if matches!(graph.node(m).op, Op::Attention { .. }) => inner,
                _ => return None,
            }
        }
        _ => return None,
    };
    // A head's query row is the last axis of the attention's result, and
    // merging the heads keeps each such row contiguous (`[S, H*D]`).
    let row = graph.ty(result).shape.last().unwrap_or(1).max(1);
    let mut atol = Vec::with_capacity(reference.data().len());
    for r in reference.data().chunks(row) {
        let t = Tolerance::for_output_requantised(reference.dtype(), reduction, r, requantised);
        atol.extend(std::iter::repeat_n(t.atol, r.len()));
    }
    Some(atol)
}
