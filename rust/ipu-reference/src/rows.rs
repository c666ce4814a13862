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
//! the whole output's atol ([`crate::Tolerance::accepts_with`]). Values
//! computed row by row from such rows (the heads merged, the output
//! projection, a bias or residual add, GELU, a layer norm; [`attention_rows`])
//! have rows of the same varying sizes and are checked alike, per row of
//! their last axis: a causal attention layer's output projection failed at
//! 15 of 524,288 outputs of query row 0 at BERT-large size without it.
//! Rows of the output's typical size keep their check; only rows larger
//! than the output's rms get more room, in proportion to their size. A
//! wrong mask, key or head moves a row by the size of the values
//! themselves, far beyond the rule's `u sqrt(K)` share of it
//! (tests/compare.rs).

use ipu_graph::{Graph, Op, ValueDef, ValueId};

use crate::compare::Tolerance;
use crate::tensor::Tensor;

/// For value `id` of `graph` whose rows descend from an attention's query
/// rows ([`attention_rows`]), and `reference` a reference of that value:
/// per element, the rule's atol for the element's row alone, with the
/// longest reduction and the re-quantisations (`rule`) that the check uses
/// for the whole value. `None` for any other value.
pub fn attention_row_atol(
    graph: &Graph,
    id: ValueId,
    reference: &Tensor,
    (reduction, requantised): (u64, &[f64]),
) -> Option<Vec<f64>> {
    let row = attention_rows(graph)[id.0 as usize]?;
    let mut atol = Vec::with_capacity(reference.data().len());
    for r in reference.data().chunks(row) {
        let t = Tolerance::for_output_requantised(reference.dtype(), reduction, r, requantised);
        atol.extend(std::iter::repeat_n(t.atol, r.len()));
    }
    Some(atol)
}

/// For every value of `graph` (indexed like [`Graph::values`]), the length
/// of its rows when each row is a computation of its own that descends from
/// an attention's query rows, else `None`:
/// - an attention's result: a head's query row, its `D` values;
/// - that result with its heads merged (`[S, H*D]`): still each head's `D`
///   values, which merging keeps contiguous;
/// - a value computed row by row from such a value: the output projection
///   (`gemm` with it as the untransposed A: row i of the product reads row
///   i of A only), `add` with it as either operand (a bias, a residual),
///   `gelu`, `cast`, `layernorm` and `softmax`: its last axis.
///
/// Anything else (a transposed A, heads split again, a value that reads
/// several rows) keeps the whole value's rms.
pub fn attention_rows(graph: &Graph) -> Vec<Option<usize>> {
    let mut rows: Vec<Option<usize>> = Vec::with_capacity(graph.values().len());
    // Definition order is a topological order, so operands come first.
    for value in graph.values() {
        let last = value.ty.shape.last().unwrap_or(1).max(1);
        let row = match value.def {
            ValueDef::Input | ValueDef::Param => None,
            ValueDef::Node(n) => {
                let node = graph.node(n);
                let from = |i: usize| rows[node.args[i].0 as usize].is_some();
                match node.op {
                    Op::Attention { .. } => Some(last),
                    Op::MergeHeads => match graph.value(node.args[0]).def {
                        ValueDef::Node(m) if matches!(graph.node(m).op, Op::Attention { .. }) => {
                            rows[node.args[0].0 as usize]
                        }
                        _ => None,
                    },
                    Op::Gemm {
                        transpose_a: false, ..
                    } if from(0) => Some(last),
                    Op::Add if from(0) || from(1) => Some(last),
                    Op::Gelu | Op::Cast { .. } | Op::LayerNorm { .. } | Op::Softmax if from(0) => {
                        Some(last)
                    }
                    _ => None,
                }
            }
        };
        rows.push(row);
    }
    rows
}
