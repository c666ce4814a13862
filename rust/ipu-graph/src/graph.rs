//! The graph: values in definition order, operation nodes and outputs.

use std::collections::BTreeMap;
use std::fmt;

use crate::ops::{infer, Op, TypeError};
use crate::types::TensorType;

/// Index of a value in [`Graph::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// Index of an operation node in [`Graph::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// How a value comes into being.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// Supplied by the host with every "run" call.
    Input,
    /// A weight, uploaded once by the "initialize" call.
    Param,
    /// The result of an operation node.
    Node(NodeId),
}

/// A named, typed SSA value.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Unique name within the graph.
    pub name: String,
    /// Element type and shape.
    pub ty: TensorType,
    /// Where it comes from.
    pub def: ValueDef,
}

/// An operation applied to earlier values, defining one result value.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The operation and its attributes.
    pub op: Op,
    /// Operands, in the order the operation documents.
    pub args: Vec<ValueId>,
    /// The value it defines.
    pub result: ValueId,
}

/// A model graph.
///
/// Invariants (kept by the builder methods, checked by [`crate::verify`] for
/// graphs assembled with [`Graph::from_parts`]): value names are unique
/// identifiers; every operand is defined before the node that uses it, so
/// `values` and `nodes` are both in a topological order; every node's result
/// type is what [`infer`] gives for its operands; outputs are distinct and
/// there is at least one.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    name: String,
    values: Vec<Value>,
    nodes: Vec<Node>,
    outputs: Vec<ValueId>,
    by_name: BTreeMap<String, ValueId>,
}

/// Why a builder call was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum GraphError {
    /// The name is not an identifier (`[A-Za-z_][A-Za-z0-9_.]*`).
    InvalidName(String),
    /// A value with this name exists already.
    Redefinition(String),
    /// A shape has a zero dimension.
    ZeroDimension {
        /// The value being declared.
        name: String,
        /// Its type.
        ty: TensorType,
    },
    /// An operand id does not name an existing value.
    UnknownValue(ValueId),
    /// The operation rejects its operands.
    Type {
        /// The value the operation would define.
        name: String,
        /// Why.
        error: TypeError,
    },
    /// The value is already an output.
    DuplicateOutput(String),
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphError::InvalidName(n) => {
                write!(f, "`{n}` is not a valid name (expected a letter or _ then letters, digits, _ or .)")
            }
            GraphError::Redefinition(n) => write!(f, "value `{n}` is already defined"),
            GraphError::ZeroDimension { name, ty } => {
                write!(
                    f,
                    "value `{name}` has type {ty}: dimensions must be at least 1"
                )
            }
            GraphError::UnknownValue(id) => write!(f, "value id {} does not exist", id.0),
            GraphError::Type { name, error } => write!(f, "defining `{name}`: {error}"),
            GraphError::DuplicateOutput(n) => write!(f, "value `{n}` is already an output"),
        }
    }
}

impl std::error::Error for GraphError {}

/// Whether `name` is a valid value or model identifier.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

impl Graph {
    /// An empty graph called `name`.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            values: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
            by_name: BTreeMap::new(),
        }
    }

    /// Assembles a graph from raw parts without checking anything; run
    /// [`crate::verify`] on the result. Passes that rewrite graphs use this.
    pub fn from_parts(
        name: String,
        values: Vec<Value>,
        nodes: Vec<Node>,
        outputs: Vec<ValueId>,
    ) -> Graph {
        let by_name = values
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name.clone(), ValueId(i as u32)))
            .collect();
        Graph {
            name,
            values,
            nodes,
            outputs,
            by_name,
        }
    }

    /// The model name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every value, in definition order.
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// Every operation node, in definition order (a topological order).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The outputs, in declaration order.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// One value.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.0 as usize]
    }

    /// One node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    /// The type of a value.
    pub fn ty(&self, id: ValueId) -> &TensorType {
        &self.value(id).ty
    }

    /// The value called `name`.
    pub fn lookup(&self, name: &str) -> Option<ValueId> {
        self.by_name.get(name).copied()
    }

    /// Ids of the host inputs, in definition order.
    pub fn inputs(&self) -> Vec<ValueId> {
        self.ids_where(|d| d == ValueDef::Input)
    }

    /// Ids of the parameters, in definition order.
    pub fn params(&self) -> Vec<ValueId> {
        self.ids_where(|d| d == ValueDef::Param)
    }

    fn ids_where(&self, keep: impl Fn(ValueDef) -> bool) -> Vec<ValueId> {
        (0..self.values.len() as u32)
            .map(ValueId)
            .filter(|&id| keep(self.value(id).def))
            .collect()
    }

    /// The node defining `id`, if it is an operation result.
    pub fn def_node(&self, id: ValueId) -> Option<NodeId> {
        match self.value(id).def {
            ValueDef::Node(n) => Some(n),
            _ => None,
        }
    }

    /// The nodes that use `id` as an operand, in order, each listed once.
    pub fn users(&self, id: ValueId) -> Vec<NodeId> {
        (0..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|&n| self.node(n).args.contains(&id))
            .collect()
    }

    /// For every value, the nodes that use it (computed in one pass).
    pub fn all_users(&self) -> Vec<Vec<NodeId>> {
        let mut users = vec![Vec::new(); self.values.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            for &a in &node.args {
                let list: &mut Vec<NodeId> = &mut users[a.0 as usize];
                if list.last() != Some(&NodeId(i as u32)) {
                    list.push(NodeId(i as u32));
                }
            }
        }
        users
    }

    /// A topological order of the nodes: every node after the nodes defining
    /// its operands. Computed by Kahn's algorithm (taking the lowest ready index
    /// first), so it is deterministic and equals definition order for graphs
    /// that satisfy the invariants; `None` if the nodes form a cycle or use
    /// undefined values (possible only through [`Graph::from_parts`]).
    pub fn topological_order(&self) -> Option<Vec<NodeId>> {
        let n = self.nodes.len();
        let mut pending = vec![0usize; n];
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in self.nodes.iter().enumerate() {
            for a in &node.args {
                let v = self.values.get(a.0 as usize)?;
                if let ValueDef::Node(d) = v.def {
                    let d = d.0 as usize;
                    if d >= n {
                        return None;
                    }
                    pending[i] += 1;
                    dependents[d].push(i);
                }
            }
        }
        let mut ready: std::collections::BTreeSet<usize> =
            (0..n).filter(|&i| pending[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop_first() {
            order.push(NodeId(i as u32));
            for &d in &dependents[i] {
                pending[d] -= 1;
                if pending[d] == 0 {
                    ready.insert(d);
                }
            }
        }
        (order.len() == n).then_some(order)
    }

    fn declare(
        &mut self,
        name: &str,
        ty: TensorType,
        def: ValueDef,
    ) -> Result<ValueId, GraphError> {
        if !is_identifier(name) {
            return Err(GraphError::InvalidName(name.to_string()));
        }
        if self.by_name.contains_key(name) {
            return Err(GraphError::Redefinition(name.to_string()));
        }
        if ty.shape.dims().contains(&0) {
            return Err(GraphError::ZeroDimension {
                name: name.to_string(),
                ty,
            });
        }
        let id = ValueId(self.values.len() as u32);
        self.values.push(Value {
            name: name.to_string(),
            ty,
            def,
        });
        self.by_name.insert(name.to_string(), id);
        Ok(id)
    }

    /// Declares a host input.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Result<ValueId, GraphError> {
        self.declare(name, ty, ValueDef::Input)
    }

    /// Declares a parameter.
    pub fn add_param(&mut self, name: &str, ty: TensorType) -> Result<ValueId, GraphError> {
        self.declare(name, ty, ValueDef::Param)
    }

    /// Applies `op` to `args`, defining a new value `name` of the inferred type.
    pub fn add_op(&mut self, name: &str, op: Op, args: &[ValueId]) -> Result<ValueId, GraphError> {
        if let Some(&bad) = args.iter().find(|a| a.0 as usize >= self.values.len()) {
            return Err(GraphError::UnknownValue(bad));
        }
        if !is_identifier(name) {
            return Err(GraphError::InvalidName(name.to_string()));
        }
        if self.by_name.contains_key(name) {
            return Err(GraphError::Redefinition(name.to_string()));
        }
        let arg_types: Vec<&TensorType> = args.iter().map(|&a| self.ty(a)).collect();
        let ty = infer(&op, &arg_types).map_err(|error| GraphError::Type {
            name: name.to_string(),
            error,
        })?;
        let node = NodeId(self.nodes.len() as u32);
        let id = self.declare(name, ty, ValueDef::Node(node))?;
        self.nodes.push(Node {
            op,
            args: args.to_vec(),
            result: id,
        });
        Ok(id)
    }

    /// Marks `id` as an output.
    pub fn add_output(&mut self, id: ValueId) -> Result<(), GraphError> {
        if id.0 as usize >= self.values.len() {
            return Err(GraphError::UnknownValue(id));
        }
        if self.outputs.contains(&id) {
            return Err(GraphError::DuplicateOutput(self.value(id).name.clone()));
        }
        self.outputs.push(id);
        Ok(())
    }
}
