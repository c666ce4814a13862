//! Whole-graph evaluation on the host.

use std::collections::BTreeMap;
use std::fmt;

use ipu_graph::{Graph, Op, TensorType, ValueDef};

use crate::ops;
use crate::tensor::Tensor;

/// Why a graph could not be evaluated.
#[derive(Clone, Debug, PartialEq)]
pub enum EvalError {
    /// An input or parameter has no tensor.
    MissingFeed {
        /// `input` or `param`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Its type.
        ty: TensorType,
    },
    /// A tensor names no input or parameter of the graph.
    UnknownFeed(String),
    /// A tensor's type differs from the declaration.
    FeedType {
        /// The value.
        name: String,
        /// As declared in the graph.
        expected: TensorType,
        /// As given.
        found: TensorType,
    },
}

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalError::MissingFeed { kind, name, ty } => {
                write!(f, "no tensor given for {kind} `{name}`: {ty}")
            }
            EvalError::UnknownFeed(name) => write!(
                f,
                "tensor `{name}` names no input or parameter of the graph"
            ),
            EvalError::FeedType {
                name,
                expected,
                found,
            } => {
                write!(
                    f,
                    "tensor `{name}` is {found} but the graph declares {expected}"
                )
            }
        }
    }
}

impl std::error::Error for EvalError {}

/// Evaluates `graph` given a tensor for every input and parameter (by name);
/// returns every value, indexed like [`Graph::values`]. Each operation
/// computes in f64 and its result is rounded to the result's dtype, which is
/// where the device stores it.
pub fn evaluate_all(
    graph: &Graph,
    feeds: &BTreeMap<String, Tensor>,
) -> Result<Vec<Tensor>, EvalError> {
    for name in feeds.keys() {
        let known = graph
            .lookup(name)
            .is_some_and(|id| matches!(graph.value(id).def, ValueDef::Input | ValueDef::Param));
        if !known {
            return Err(EvalError::UnknownFeed(name.clone()));
        }
    }
    let mut values: Vec<Tensor> = Vec::with_capacity(graph.values().len());
    for value in graph.values() {
        let tensor = match value.def {
            ValueDef::Input | ValueDef::Param => {
                let kind = if value.def == ValueDef::Input {
                    "input"
                } else {
                    "param"
                };
                let t = feeds
                    .get(&value.name)
                    .ok_or_else(|| EvalError::MissingFeed {
                        kind,
                        name: value.name.clone(),
                        ty: value.ty.clone(),
                    })?;
                if t.ty() != value.ty {
                    return Err(EvalError::FeedType {
                        name: value.name.clone(),
                        expected: value.ty.clone(),
                        found: t.ty(),
                    });
                }
                t.clone()
            }
            ValueDef::Node(n) => {
                let node = graph.node(n);
                let args: Vec<&Tensor> = node.args.iter().map(|a| &values[a.0 as usize]).collect();
                let data = apply(&node.op, &args);
                Tensor::new(value.ty.dtype, value.ty.shape.clone(), data)
                    .expect("the verifier guarantees that results have the inferred shape")
            }
        };
        values.push(tensor);
    }
    Ok(values)
}

/// Evaluates `graph` and returns its outputs by name.
pub fn evaluate(
    graph: &Graph,
    feeds: &BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, Tensor>, EvalError> {
    let mut slots: Vec<Option<Tensor>> =
        evaluate_all(graph, feeds)?.into_iter().map(Some).collect();
    Ok(graph
        .outputs()
        .iter()
        .map(|&o| {
            let t = slots[o.0 as usize]
                .take()
                .expect("graph outputs are distinct");
            (graph.value(o).name.clone(), t)
        })
        .collect())
}

fn dims(t: &Tensor) -> &[usize] {
    t.shape().dims()
}

/// The unrounded f64 result of one operation.
fn apply(op: &Op, args: &[&Tensor]) -> Vec<f64> {
    match op {
        Op::Gemm {
            transpose_a,
            transpose_b,
            ..
        } => {
            ops::gemm(
                args[0].data(),
                dims(args[0]),
                args[1].data(),
                dims(args[1]),
                *transpose_a,
                *transpose_b,
            )
            .0
        }
        Op::Add => ops::add(args[0].data(), dims(args[0]), args[1].data(), dims(args[1])).0,
        Op::Gelu => args[0].data().iter().map(|&x| ops::gelu(x)).collect(),
        Op::LayerNorm { epsilon } => {
            let n = args[0].shape().last().unwrap_or(1);
            ops::layernorm(args[0].data(), n, args[1].data(), args[2].data(), *epsilon)
        }
        Op::Softmax => ops::softmax(args[0].data(), args[0].shape().last().unwrap_or(1)),
        Op::SplitHeads { heads } => ops::split_heads(args[0].data(), dims(args[0]), *heads).0,
        Op::MergeHeads => ops::merge_heads(args[0].data(), dims(args[0])).0,
        Op::Transpose => ops::transpose(args[0].data(), dims(args[0])),
        Op::Attention { causal, scale } => {
            let d = args[0].shape().last().unwrap_or(1);
            let scale = Op::attention_scale(*scale, d);
            ops::attention(
                args[0].data(),
                args[1].data(),
                args[2].data(),
                dims(args[0]),
                dims(args[1]),
                dims(args[2]),
                *causal,
                scale,
            )
            .0
        }
        // The evaluator rounds the result to the target dtype.
        Op::Cast { .. } => args[0].data().to_vec(),
    }
}
