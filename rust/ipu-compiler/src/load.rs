//! Phase `load`: read, parse and verify the model, and check that every
//! operation is one this compiler can lower.

use crate::error::CompileError;
use ipu_graph::{Graph, Op, ValueDef};
use std::path::Path;

/// A loaded model: the verified graph and its canonical text (the package's
/// `model.ipug` member).
pub struct Model {
    pub graph: Graph,
    pub text: String,
}

pub fn load(path: &Path) -> Result<Model, CompileError> {
    let graph = ipu_graph::parse_file(path).map_err(|message| CompileError::Model { message })?;
    if let Err(errors) = ipu_graph::verify(&graph) {
        let message = errors
            .iter()
            .map(|e| format!("{}: {e}", path.display()))
            .collect::<Vec<_>>()
            .join("\n");
        return Err(CompileError::Model { message });
    }
    check_supported(&graph)?;
    let text = ipu_graph::print(&graph);
    Ok(Model { graph, text })
}

/// The operations the pipeline lowers today: a graph of GEMMs whose operands
/// are host inputs or parameters and whose results are graph outputs (each
/// GEMM is its own compute step). Anything else is refused here, with the
/// value and the reason, instead of failing somewhere later.
pub fn check_supported(graph: &Graph) -> Result<(), CompileError> {
    for node in graph.nodes() {
        let v = graph.value(node.result);
        let unsupported = |reason: String| CompileError::Unsupported {
            value: v.name.clone(),
            operation: node.op.name().to_string(),
            reason,
        };
        match &node.op {
            Op::Gemm {
                transpose_a,
                transpose_b,
                ..
            } => {
                if *transpose_a || *transpose_b {
                    return Err(unsupported("transposed operands".into()));
                }
                for &arg in &node.args {
                    let a = graph.value(arg);
                    if a.ty.shape.rank() != 2 {
                        return Err(unsupported(format!(
                            "operand `{}` has type {}; only rank-2 (unbatched) GEMMs are lowered",
                            a.name, a.ty
                        )));
                    }
                    if a.ty.dtype != ipu_graph::DType::F16 {
                        return Err(unsupported(format!(
                            "operand `{}` is {}; only f16 operands are lowered",
                            a.name, a.ty.dtype
                        )));
                    }
                    if matches!(a.def, ValueDef::Node(_)) {
                        return Err(unsupported(format!(
                            "operand `{}` is computed on the device; GEMM operands must be inputs or params until inter-operation layouts land",
                            a.name
                        )));
                    }
                }
                if !graph.outputs().contains(&node.result) {
                    return Err(unsupported(
                        "the result feeds other operations; only GEMMs whose results are outputs are lowered".into(),
                    ));
                }
            }
            other => {
                return Err(unsupported(format!(
                    "no lowering for `{}` yet (lowered today: gemm)",
                    other.name()
                )))
            }
        }
    }
    for &o in graph.outputs() {
        if !matches!(graph.value(o).def, ValueDef::Node(_)) {
            return Err(CompileError::Unsupported {
                value: graph.value(o).name.clone(),
                operation: "output".into(),
                reason: "an input or param listed as an output".into(),
            });
        }
    }
    Ok(())
}
