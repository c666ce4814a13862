//! Analyses the compiler and the verification tools need: FLOP counts, bytes
//! per value and reduction lengths.
//!
//! FLOP conventions (documented in docs/graph-format.md): a multiply-add is 2
//! FLOP. `matmul` FLOP are those an AMP unit performs (gemm and the two
//! products inside attention) and are what the compute lower bound divides by
//! the chip's peak. `vector` FLOP are the rest, counted per element: add 1,
//! gelu 8, layernorm 7 (mean, centre, square, variance sum, normalise, scale,
//! shift), softmax 5 (max, subtract, exp, sum, divide), attention's softmax 5
//! per visible score, cast 1, views 0.

use crate::graph::{Graph, Node, ValueId};
use crate::ops::{gemm_operand_dims, Op};
use crate::types::broadcast_shapes;

/// FLOP of an operation or a graph, split by the unit that does them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flops {
    /// Multiply-accumulate FLOP (2 per MAC) of matrix products.
    pub matmul: u64,
    /// Elementwise and reduction FLOP.
    pub vector: u64,
}

impl Flops {
    /// Both kinds together.
    pub fn total(self) -> u64 {
        self.matmul + self.vector
    }
}

impl std::ops::Add for Flops {
    type Output = Flops;
    fn add(self, o: Flops) -> Flops {
        Flops {
            matmul: self.matmul + o.matmul,
            vector: self.vector + o.vector,
        }
    }
}

/// Number of (query, key) pairs attention evaluates per head: all of them, or
/// for causal attention only those where `j <= i + (sk - sq)`.
pub fn attention_pairs(sq: u64, sk: u64, causal: bool) -> u64 {
    if !causal {
        return sq * sk;
    }
    // Query i sees keys 0..=i + (sk - sq), that is i + sk - sq + 1 keys.
    (0..sq).map(|i| i + sk - sq + 1).sum()
}

/// The FLOP of one node.
pub fn node_flops(graph: &Graph, node: &Node) -> Flops {
    let out = graph.ty(node.result);
    let elements = out.shape.elements();
    let arg = |i: usize| graph.ty(node.args[i]);
    match &node.op {
        Op::Gemm {
            transpose_a,
            transpose_b,
            ..
        } => {
            let (ba, m, k) = gemm_operand_dims(&arg(0).shape, *transpose_a);
            let (bb, _, n) = gemm_operand_dims(&arg(1).shape, *transpose_b);
            let batch: u64 = broadcast_shapes(ba, bb)
                .unwrap_or_default()
                .iter()
                .map(|&d| d as u64)
                .product();
            Flops {
                matmul: 2 * batch * (m * k * n) as u64,
                vector: 0,
            }
        }
        Op::Attention { causal, .. } => {
            let q = arg(0).shape.dims();
            let v = arg(2).shape.dims();
            let heads: u64 = q[..q.len() - 2].iter().map(|&d| d as u64).product();
            let (sq, d) = (q[q.len() - 2] as u64, q[q.len() - 1] as u64);
            let (sk, dv) = (v[v.len() - 2] as u64, v[v.len() - 1] as u64);
            let pairs = attention_pairs(sq, sk, *causal);
            Flops {
                matmul: heads * pairs * 2 * (d + dv),
                vector: heads * pairs * 5,
            }
        }
        Op::Add => Flops {
            matmul: 0,
            vector: elements,
        },
        Op::Gelu => Flops {
            matmul: 0,
            vector: 8 * elements,
        },
        Op::LayerNorm { .. } => Flops {
            matmul: 0,
            vector: 7 * elements,
        },
        Op::Softmax => Flops {
            matmul: 0,
            vector: 5 * elements,
        },
        Op::Cast { .. } => Flops {
            matmul: 0,
            vector: elements,
        },
        Op::SplitHeads { .. } | Op::MergeHeads | Op::Transpose => Flops::default(),
    }
}

/// The FLOP of the whole graph.
pub fn graph_flops(graph: &Graph) -> Flops {
    graph
        .nodes()
        .iter()
        .fold(Flops::default(), |acc, n| acc + node_flops(graph, n))
}

/// Bytes of one value, densely packed in its dtype.
pub fn value_bytes(graph: &Graph, id: ValueId) -> u64 {
    graph.ty(id).bytes()
}

/// Bytes of the host inputs, of the parameters and of the outputs: what the
/// "run" and "initialize" calls move over the host link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoBytes {
    /// Inputs of one "run".
    pub inputs: u64,
    /// Parameters uploaded by "initialize".
    pub params: u64,
    /// Outputs of one "run".
    pub outputs: u64,
}

/// The host traffic of a graph.
pub fn io_bytes(graph: &Graph) -> IoBytes {
    let sum = |ids: &[ValueId]| ids.iter().map(|&v| value_bytes(graph, v)).sum();
    IoBytes {
        inputs: sum(&graph.inputs()),
        params: sum(&graph.params()),
        outputs: sum(graph.outputs()),
    }
}

/// The number of products summed into one element of `node`'s result, or 1
/// for operations that do not reduce over products (used to choose
/// comparison tolerances: rounding error grows with this length).
pub fn reduction_length(graph: &Graph, node: &Node) -> u64 {
    match &node.op {
        Op::Gemm { transpose_a, .. } => {
            gemm_operand_dims(&graph.ty(node.args[0]).shape, *transpose_a).2 as u64
        }
        Op::Attention { .. } => {
            let q = graph.ty(node.args[0]).shape.dims();
            let k = graph.ty(node.args[1]).shape.dims();
            (q[q.len() - 1] as u64).max(k[k.len() - 2] as u64)
        }
        Op::LayerNorm { .. } | Op::Softmax => {
            graph.ty(node.result).shape.last().unwrap_or(1) as u64
        }
        _ => 1,
    }
}

/// The longest reduction of any node in the graph; the comparison tolerance
/// rule of ipu-reference scales with it.
pub fn max_reduction_length(graph: &Graph) -> u64 {
    graph
        .nodes()
        .iter()
        .map(|n| reduction_length(graph, n))
        .max()
        .unwrap_or(1)
}
