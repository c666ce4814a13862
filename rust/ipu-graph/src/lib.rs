//! The model graph IR of ipu-stack.
//!
//! A model is a shaped SSA graph ([`Graph`]): host inputs, parameters (weights
//! uploaded once by the "initialize" call) and operations ([`Op`]) such as
//! gemm, add, gelu, layernorm, softmax, head views and flash attention. Every
//! value has a name, a dtype ([`DType`]: f32, f16 or fp8 F143 with a
//! power-of-two scale) and a shape.
//!
//! Invariants every [`Graph`] keeps (see [`verify`]): names are unique; operands
//! are defined before use, so definition order is a topological order; each
//! result's type is exactly what [`infer`] computes from its operands; there is
//! at least one output.
//!
//! API boundary: build graphs with the [`Graph`] builder or [`parse`] them from
//! `.ipug` text (docs/graph-format.md); [`print`] gives canonical text such that
//! `parse(print(g)) == g`; [`analysis`] gives FLOP and byte counts. Nothing here
//! computes tensor values: that is ipu-reference (host) and the compiler
//! (device).

// Errors carry both offending types so that messages can show them; they are
// built only on the failure path, so their size costs nothing that matters.
#![allow(clippy::result_large_err)]

pub mod analysis;
mod graph;
mod lexer;
mod ops;
mod parser;
mod printer;
mod types;
mod verify;

pub use graph::{is_identifier, Graph, GraphError, Node, NodeId, Value, ValueDef, ValueId};
pub use ops::{gemm_operand_dims, infer, Op, TypeError, DEFAULT_LAYERNORM_EPSILON};
pub use parser::{
    parse, parse_with_repeats, ParseError, ParseErrorKind, Repeat, KEYWORDS, OPERATIONS,
};
pub use printer::print;
pub use types::{broadcast_shapes, DType, DTypeParseError, Shape, TensorType};
pub use verify::{verify, VerifyError};

use std::fmt::Write;

/// Reads and parses a `.ipug` file; errors name the file.
pub fn parse_file(path: &std::path::Path) -> Result<Graph, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse(&path.display().to_string(), &text).map_err(|e| e.to_string())
}

/// Reads and parses a `.ipug` file with its `repeat` blocks; errors name
/// the file.
pub fn parse_file_with_repeats(path: &std::path::Path) -> Result<(Graph, Vec<Repeat>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse_with_repeats(&path.display().to_string(), &text).map_err(|e| e.to_string())
}

/// A human-readable table of a graph's values, FLOP and bytes, used by the
/// filetests and by `ipu inspect`.
pub fn summary(graph: &Graph) -> String {
    let mut out = String::new();
    let flops = analysis::graph_flops(graph);
    let io = analysis::io_bytes(graph);
    writeln!(
        out,
        "values={} nodes={} inputs={} params={} outputs={}",
        graph.values().len(),
        graph.nodes().len(),
        graph.inputs().len(),
        graph.params().len(),
        graph.outputs().len()
    )
    .unwrap();
    for node in graph.nodes() {
        let f = analysis::node_flops(graph, node);
        let v = graph.value(node.result);
        writeln!(
            out,
            "  {:<12} {:<12} {:<22} bytes={:<10} matmul_flop={:<12} vector_flop={}",
            v.name,
            node.op.name(),
            v.ty.to_string(),
            v.ty.bytes(),
            f.matmul,
            f.vector
        )
        .unwrap();
    }
    writeln!(
        out,
        "total matmul_flop={} vector_flop={} compute_bound_cycles={}",
        flops.matmul,
        flops.vector,
        ipu_arch::compute_bound_cycles(flops.matmul, ipu_arch::TILES_PER_CHIP)
    )
    .unwrap();
    writeln!(
        out,
        "host bytes: inputs={} params={} outputs={}; max reduction length={}",
        io.inputs,
        io.params,
        io.outputs,
        analysis::max_reduction_length(graph)
    )
    .unwrap();
    out
}
