//! The graph verifier: an independent check of every [`Graph`] invariant.
//!
//! The builder keeps these invariants by construction; the verifier exists for
//! graphs assembled with [`Graph::from_parts`] (by rewriting passes) and as a
//! second opinion in tests, in the way Cranelift verifies its IR between passes.

use std::collections::BTreeMap;
use std::fmt;

use crate::graph::{is_identifier, Graph, ValueDef, ValueId};
use crate::ops::{infer, TypeError};
use crate::types::TensorType;

/// One broken invariant. Messages name the value at fault.
#[derive(Clone, Debug, PartialEq)]
pub enum VerifyError {
    /// The model name is not an identifier.
    InvalidModelName(String),
    /// A value name is not an identifier.
    InvalidName(String),
    /// Two values share a name.
    DuplicateName(String),
    /// A dimension is zero.
    ZeroDimension(String, TensorType),
    /// A value claims a node that does not exist or defines another value.
    BadDefinition(String),
    /// A node's result does not point back at it.
    BadResult(u32),
    /// An operand is not defined before its use (SSA dominance for a DAG).
    UseBeforeDefinition {
        /// The value the node defines.
        user: String,
        /// The operand index.
        operand: usize,
        /// The operand's name, or its id if it does not exist.
        used: String,
    },
    /// The operation rejects its operands.
    Type(String, TypeError),
    /// The recorded type differs from the inferred one.
    WrongType {
        /// The value.
        name: String,
        /// As recorded.
        recorded: TensorType,
        /// As inferred from the operands.
        inferred: TensorType,
    },
    /// The graph has no output.
    NoOutputs,
    /// An output id does not exist.
    UnknownOutput(u32),
    /// A value is listed as an output twice.
    DuplicateOutput(String),
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::InvalidModelName(n) => write!(f, "model name `{n}` is not an identifier"),
            VerifyError::InvalidName(n) => write!(f, "value name `{n}` is not an identifier"),
            VerifyError::DuplicateName(n) => write!(f, "value `{n}` is defined more than once"),
            VerifyError::ZeroDimension(n, t) => {
                write!(f, "value `{n}` has type {t} with a zero dimension")
            }
            VerifyError::BadDefinition(n) => write!(
                f,
                "value `{n}` names a defining node that does not define it"
            ),
            VerifyError::BadResult(i) => write!(
                f,
                "node {i} has a result that does not name it as definition"
            ),
            VerifyError::UseBeforeDefinition {
                user,
                operand,
                used,
            } => {
                write!(
                    f,
                    "`{user}`: operand {operand} (`{used}`) is not defined before its use"
                )
            }
            VerifyError::Type(n, e) => write!(f, "`{n}`: {e}"),
            VerifyError::WrongType {
                name,
                recorded,
                inferred,
            } => write!(
                f,
                "`{name}` is recorded as {recorded} but its operation gives {inferred}"
            ),
            VerifyError::NoOutputs => write!(f, "the graph has no output"),
            VerifyError::UnknownOutput(i) => write!(f, "output id {i} does not exist"),
            VerifyError::DuplicateOutput(n) => write!(f, "`{n}` is an output twice"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// Checks every invariant of `graph`, returning all violations found.
pub fn verify(graph: &Graph) -> Result<(), Vec<VerifyError>> {
    let mut errors = Vec::new();
    if !is_identifier(graph.name()) {
        errors.push(VerifyError::InvalidModelName(graph.name().to_string()));
    }
    let values = graph.values();
    let nodes = graph.nodes();
    let mut seen = BTreeMap::new();
    for (i, v) in values.iter().enumerate() {
        if !is_identifier(&v.name) {
            errors.push(VerifyError::InvalidName(v.name.clone()));
        }
        if seen.insert(v.name.clone(), i).is_some() {
            errors.push(VerifyError::DuplicateName(v.name.clone()));
        }
        if v.ty.shape.dims().contains(&0) {
            errors.push(VerifyError::ZeroDimension(v.name.clone(), v.ty.clone()));
        }
        if let ValueDef::Node(n) = v.def {
            let ok = nodes
                .get(n.0 as usize)
                .is_some_and(|node| node.result == ValueId(i as u32));
            if !ok {
                errors.push(VerifyError::BadDefinition(v.name.clone()));
            }
        }
    }
    let name_of = |id: ValueId| {
        values
            .get(id.0 as usize)
            .map_or_else(|| format!("#{}", id.0), |v| v.name.clone())
    };
    for (i, node) in nodes.iter().enumerate() {
        let result = node.result.0 as usize;
        let defined_here = values
            .get(result)
            .is_some_and(|v| v.def == ValueDef::Node(crate::graph::NodeId(i as u32)));
        if !defined_here {
            errors.push(VerifyError::BadResult(i as u32));
            continue;
        }
        let user = &values[result];
        let mut operands_ok = true;
        for (k, a) in node.args.iter().enumerate() {
            // Values are in definition order, so an operand defined before its
            // user has a smaller index; this also rules out cycles.
            if a.0 as usize >= result {
                errors.push(VerifyError::UseBeforeDefinition {
                    user: user.name.clone(),
                    operand: k,
                    used: name_of(*a),
                });
                operands_ok = false;
            }
        }
        if !operands_ok {
            continue;
        }
        let arg_types: Vec<&TensorType> =
            node.args.iter().map(|a| &values[a.0 as usize].ty).collect();
        match infer(&node.op, &arg_types) {
            Err(e) => errors.push(VerifyError::Type(user.name.clone(), e)),
            Ok(t) if t != user.ty => errors.push(VerifyError::WrongType {
                name: user.name.clone(),
                recorded: user.ty.clone(),
                inferred: t,
            }),
            Ok(_) => {}
        }
    }
    if graph.outputs().is_empty() {
        errors.push(VerifyError::NoOutputs);
    }
    let mut outs = std::collections::BTreeSet::new();
    for o in graph.outputs() {
        if o.0 as usize >= values.len() {
            errors.push(VerifyError::UnknownOutput(o.0));
        } else if !outs.insert(*o) {
            errors.push(VerifyError::DuplicateOutput(name_of(*o)));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}
