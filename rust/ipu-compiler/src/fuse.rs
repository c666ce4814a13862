//! Phase `fuse`: groups every GEMM with the elementwise operations that
//! follow it (a bias `add` with a `[N]` parameter or input, then `gelu`, of
//! the GEMM's f16 or f32 result type), so that they run as the epilogue of
//! the GEMM's reduce step instead of as passes of their own. Every other operation must belong to a group; what
//! cannot be grouped is refused with the value and the reason.
//!
//! A group's result is its last operation's value. It may be a graph output
//! and/or the A operand of later GEMMs (a chain, e.g. an MLP); in a chain
//! every group is planned with the same row partition and whole rows per
//! tile, so the rows a GEMM reads are on the tile that produced them.

use crate::error::CompileError;
use ipu_graph::{DType, Graph, NodeId, Op, ValueDef, ValueId};

/// Where a GEMM's A operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A host input or parameter.
    Host(ValueId),
    /// The result of an earlier group (index into the group list).
    Group(usize),
}

/// A GEMM and its fused epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub gemm: NodeId,
    pub a: Source,
    /// The B operand (a host input or parameter).
    pub b: ValueId,
    /// The bias operand of a fused `add`.
    pub bias: Option<ValueId>,
    /// Whether a `gelu` is fused.
    pub gelu: bool,
    /// Every value the group defines, in order (the last is its result).
    pub values: Vec<ValueId>,
    /// Whether later GEMMs read the result on the device.
    pub feeds_gemm: bool,
    /// Whether an attention block reads the result (through `split_heads`):
    /// it moves to the attention tiles from the compact layout of the
    /// reduce step ([`crate::attention`]).
    pub feeds_attention: bool,
}

impl Group {
    pub fn result(&self) -> ValueId {
        *self
            .values
            .last()
            .expect("a group defines at least its GEMM")
    }
    /// The epilogue code of `reduce_f32` (docs/kernels.md).
    pub fn epilogue(&self) -> i64 {
        match (self.bias.is_some(), self.gelu) {
            (false, false) => 0,
            (true, false) => 1,
            (true, true) => 2,
            (false, true) => 3,
        }
    }
    /// Whether the group needs the reduce step (and so f32 accumulation):
    /// an epilogue to apply, or a result that a later GEMM reads in the
    /// compact layout the reduce step writes.
    pub fn needs_reduce_step(&self) -> bool {
        self.epilogue() != 0 || self.feeds_gemm || self.feeds_attention
    }
}

fn users(graph: &Graph, v: ValueId) -> Vec<NodeId> {
    (0..graph.nodes().len() as u32)
        .map(NodeId)
        .filter(|&n| graph.node(n).args.contains(&v))
        .collect()
}

/// Whether `value`, an add or GELU after the GEMM whose result is
/// `gemm_result`, has a type the reduce step's epilogues compute: the
/// GEMM's result type, f16 (f32 arithmetic rounded to f16 where the graph
/// stores it) or f32 (`reduce_f32` OUT=32, with an f32 bias).
pub(crate) fn epilogue_type(graph: &Graph, gemm_result: ValueId, value: ValueId) -> bool {
    let dtype = graph.value(value).ty.dtype;
    matches!(dtype, DType::F16 | DType::F32) && dtype == graph.value(gemm_result).ty.dtype
}

/// Groups the graph's operations (see the module documentation).
pub fn fuse(graph: &Graph) -> Result<Vec<Group>, CompileError> {
    let mut groups: Vec<Group> = Vec::new();
    let mut owner: Vec<Option<usize>> = vec![None; graph.values().len()];
    let err = |v: ValueId, op: &str, reason: String| CompileError::Unsupported {
        value: graph.value(v).name.clone(),
        operation: op.to_string(),
        reason,
    };
    let is_output = |v: ValueId| graph.outputs().contains(&v);
    for (i, node) in graph.nodes().iter().enumerate() {
        let id = NodeId(i as u32);
        let r = node.result;
        if owner[r.0 as usize].is_some() {
            continue;
        }
        // Attention blocks (split_heads, attention, merge_heads) are
        // recognised and checked as a whole by `attention::recognise`.
        if matches!(
            node.op,
            Op::SplitHeads { .. } | Op::Attention { .. } | Op::MergeHeads
        ) {
            continue;
        }
        let Op::Gemm {
            transpose_a,
            transpose_b,
            ..
        } = node.op
        else {
            let reason = if matches!(node.op, Op::Add | Op::Gelu) {
                format!(
                    "`{}` is lowered only directly after a GEMM whose result it alone uses and that is not an output (a bias add with a [N] input or param, then gelu)",
                    node.op.name()
                )
            } else {
                format!(
                    "no lowering for `{}` yet (lowered today: gemm, with a fused bias add and gelu; split_heads, attention and merge_heads of GEMM results)",
                    node.op.name()
                )
            };
            return Err(err(r, node.op.name(), reason));
        };
        if transpose_a || transpose_b {
            return Err(err(r, "gemm", "transposed operands".into()));
        }
        let (a, b) = (node.args[0], node.args[1]);
        for &arg in &[a, b] {
            let t = &graph.value(arg).ty;
            if t.shape.rank() != 2 {
                return Err(err(
                    r,
                    "gemm",
                    format!(
                        "operand `{}` has type {t}; only rank-2 (unbatched) GEMMs are lowered",
                        graph.value(arg).name
                    ),
                ));
            }
            if !matches!(t.dtype, DType::F16 | DType::F32 | DType::Fp8 { .. }) {
                return Err(err(
                    r,
                    "gemm",
                    format!(
                        "operand `{}` is {}; only f16, f32 and fp8 operands are lowered",
                        graph.value(arg).name,
                        t.dtype
                    ),
                ));
            }
        }
        let a_source = match graph.value(a).def {
            ValueDef::Input | ValueDef::Param => Source::Host(a),
            ValueDef::Node(_) => match owner[a.0 as usize] {
                Some(g) if groups[g].result() == a => Source::Group(g),
                _ => {
                    return Err(err(r, "gemm", format!("operand `{}` is computed on the device but is not the result of a GEMM group", graph.value(a).name)))
                }
            },
        };
        if matches!(graph.value(b).def, ValueDef::Node(_)) {
            return Err(err(
                r,
                "gemm",
                format!(
                    "the B operand `{}` must be a host input or param",
                    graph.value(b).name
                ),
            ));
        }
        let n = graph.value(b).ty.shape.dims()[1];
        let mut group = Group {
            gemm: id,
            a: a_source,
            b,
            bias: None,
            gelu: false,
            values: vec![r],
            feeds_gemm: false,
            feeds_attention: false,
        };
        // Follow single-use chains: add(bias) then gelu.
        loop {
            let last = group.result();
            if is_output(last) {
                break;
            }
            let u = users(graph, last);
            if u.len() != 1 {
                break;
            }
            let next = graph.node(u[0]);
            if !epilogue_type(graph, r, next.result) {
                break;
            }
            match next.op {
                Op::Add if group.bias.is_none() && !group.gelu => {
                    let other = if next.args[0] == last {
                        next.args[1]
                    } else {
                        next.args[0]
                    };
                    let t = &graph.value(other).ty;
                    let host = !matches!(graph.value(other).def, ValueDef::Node(_));
                    if other == last || !host || t.shape.dims() != [n] {
                        break;
                    }
                    group.bias = Some(other);
                    group.values.push(next.result);
                }
                Op::Gelu if !group.gelu => {
                    group.gelu = true;
                    group.values.push(next.result);
                }
                _ => break,
            }
        }
        if let Source::Group(g) = group.a {
            groups[g].feeds_gemm = true;
        }
        for &v in &group.values {
            owner[v.0 as usize] = Some(groups.len());
        }
        groups.push(group);
    }
    // Every value inside a group except its result must stay internal.
    for g in groups.iter_mut() {
        for &v in &g.values[..g.values.len() - 1] {
            if is_output(v) {
                return Err(err(
                    v,
                    "output",
                    "an intermediate of a fused GEMM group cannot be an output".into(),
                ));
            }
        }
        let result = g.result();
        for u in users(graph, result) {
            let consumer = graph.node(u);
            if matches!(consumer.op, Op::SplitHeads { .. }) {
                g.feeds_attention = true;
                continue;
            }
            let fine = matches!(consumer.op, Op::Gemm { .. })
                && consumer.args[0] == result
                && consumer.args[1] != result;
            if !fine {
                return Err(err(
                    consumer.result,
                    consumer.op.name(),
                    format!(
                        "reads `{}` in a way no fused group supports",
                        graph.value(result).name
                    ),
                ));
            }
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(text: &str) -> Result<Vec<Group>, String> {
        let g = ipu_graph::parse("t.ipug", text).map_err(|e| e.to_string())?;
        fuse(&g).map_err(|e| e.to_string())
    }

    #[test]
    fn mlp_fuses_into_two_groups() {
        let text = std::fs::read_to_string(
            std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
                .join("../../models/mlp_small.ipug"),
        )
        .unwrap();
        let gs = groups(&text).unwrap();
        assert_eq!(gs.len(), 2);
        assert_eq!((gs[0].epilogue(), gs[0].feeds_gemm), (2, true));
        assert_eq!(
            (gs[1].epilogue(), gs[1].a, gs[1].feeds_gemm),
            (1, Source::Group(0), false)
        );
    }

    #[test]
    fn refusals_name_the_value() {
        let e =
            groups("model m\ninput x: f16[4, 8]\ninput y: f16[4, 8]\nz = add(x, y)\noutput z\n")
                .unwrap_err();
        assert!(e.contains("value `z` (add)"), "{e}");
        let e = groups("model m\ninput x: f16[4, 8]\nparam w: f16[8, 8]\nh = gemm(x, w)\ng = gelu(h)\nz = add(g, h)\noutput z\n").unwrap_err();
        assert!(e.contains("value `g` (gelu)"), "{e}");
        let e = groups("model m\ninput x: f16[8, 8]\nparam w: f16[8, 8]\nh = gemm(x, w)\nz = gemm(w, h)\noutput z\n").unwrap_err();
        assert!(
            e.contains("value `z` (gemm)") && e.contains("B operand `h`"),
            "{e}"
        );
    }
}
