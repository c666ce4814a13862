//! Prints a graph in canonical `.ipug` text: one statement per line, in
//! definition order, every result annotated with its type, attributes only
//! when they differ from the default (except `causal` and `epsilon`, which are
//! always shown because a reader should never have to guess them).
//! [`crate::parse`] of the output gives back an equal graph.

use std::fmt::Write;

use crate::graph::{Graph, ValueDef};
use crate::ops::Op;

/// The canonical text of `graph`.
pub fn print(graph: &Graph) -> String {
    let mut out = String::new();
    writeln!(out, "model {}", graph.name()).unwrap();
    for v in graph.values() {
        match v.def {
            ValueDef::Input => writeln!(out, "input {}: {}", v.name, v.ty).unwrap(),
            ValueDef::Param => writeln!(out, "param {}: {}", v.name, v.ty).unwrap(),
            ValueDef::Node(n) => {
                let node = graph.node(n);
                let mut parts: Vec<String> = node
                    .args
                    .iter()
                    .map(|&a| graph.value(a).name.clone())
                    .collect();
                parts.extend(attributes(&node.op));
                writeln!(
                    out,
                    "{}: {} = {}({})",
                    v.name,
                    v.ty,
                    node.op.name(),
                    parts.join(", ")
                )
                .unwrap();
            }
        }
    }
    for &o in graph.outputs() {
        writeln!(out, "output {}", graph.value(o).name).unwrap();
    }
    out
}

/// Formats a float so that it parses back to the same bits: Rust's `{:?}`
/// prints the shortest round-tripping decimal.
fn float(v: f64) -> String {
    format!("{v:?}")
}

fn attributes(op: &Op) -> Vec<String> {
    let mut attrs = Vec::new();
    match op {
        Op::Gemm {
            transpose_a,
            transpose_b,
            out,
        } => {
            if *transpose_a {
                attrs.push("transpose_a=true".to_string());
            }
            if *transpose_b {
                attrs.push("transpose_b=true".to_string());
            }
            if let Some(d) = out {
                attrs.push(format!("out={d}"));
            }
        }
        Op::LayerNorm { epsilon } => attrs.push(format!("epsilon={}", float(*epsilon))),
        Op::SplitHeads { heads } => attrs.push(format!("heads={heads}")),
        Op::Attention { causal, scale } => {
            attrs.push(format!("causal={causal}"));
            if let Some(s) = scale {
                attrs.push(format!("scale={}", float(*s)));
            }
        }
        Op::Cast { to } => attrs.push(format!("to={to}")),
        Op::Add | Op::Gelu | Op::Softmax | Op::MergeHeads | Op::Transpose => {}
    }
    attrs
}
