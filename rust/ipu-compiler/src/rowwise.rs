//! Row-wise segments ([`crate::segment`]): layer norms, softmaxes over
//! rows, residual adds of two `[M, N]` tensors, bias adds of a host `[N]`
//! vector and GELUs that no GEMM epilogue absorbs, in f16 or f32 (an
//! operation's rows, vectors and result of one type), and casts between
//! f32, f16 and fp8.
//!
//! Plan: the M rows are spread over as many tiles as there are rows (up to
//! the tile count), equal contiguous row ranges; on a tile the rows split
//! over up to six workers. Each operation is one compute step on every
//! tile: `layernorm`, `softmax_rows` (TYPE=16 or 32), `cast`, or
//! `reduce_f32` with f16 partials (IN=16; f32 rows: IN=32 OUT=32, the
//! epilogues in f32), which
//! sums P = 2 partials for a residual add, and with P = 1 applies the bias
//! (EPI 1) or GELU (EPI 3) epilogue; the adds sum in f16 (ACC=16, one
//! rounding of the exact sum) when the library has that object. Element-wise kernels split a row's
//! groups over the workers when a tile has fewer rows than workers; a layer
//! norm on tiles of at most three rows splits each row into slices over the
//! workers when that is cheaper by the kernels' formulas, as three compute
//! steps (`layernorm` STAGE 1: the slices' sums; 2: d = x - mean into
//! the row's f32 scratch and the slices' sums of d^2; 3: the output), the
//! slices' partial sums in a `row_parts` buffer of 48 bytes per row.
//!
//! Storage: every row takes `ceil(N / 4) * 4` elements (the kernels work in
//! groups of four elements; padding lanes start as zeros and only ever hold
//! sums of zeros). f32 rows live in interleaved memory, 16-aligned, where
//! `reduce_f32` IN=32 loads its partials 128 bits at a time. A residual add reads both operands from one *pair*
//! buffer, `a` rows then `b` rows (`reduce_f32`'s SECTION): an operand that
//! is a segment input is delivered there, one computed here is written
//! there by its producer ([`crate::segment::split`] cuts a segment so that
//! such a value has no other reader). Inputs read otherwise have one buffer
//! each; computed values not bound for a pair have their own buffer. Graph
//! parameters (gamma, beta, biases) have a copy on every tile.

use crate::attention::launch_cycles;
use crate::error::CompileError;
use crate::gemm::FormulaCost;
use crate::library::{KernelLibrary, KernelRequest};
use crate::lower::{
    push_coalesced, BufferSpec, HostPlacement, HostTensor, HostTensors, Lowered, RegionReq,
    StateWord, Step, Vertex,
};
use ipu_graph::{DType, Graph, NodeId, Op, ValueDef, ValueId};
use serde_json::json;
use std::collections::BTreeMap;

/// Bytes of one row of `n` elements of `eb` bytes, in groups of four.
fn row_stride(n: u32, eb: u32) -> u32 {
    n.div_ceil(4) * 4 * eb
}

/// Bytes of one element of a row-wise tensor (f32, f16 or fp8).
fn element_bytes(dtype: DType) -> u32 {
    match dtype {
        DType::Fp8 { .. } => 1,
        DType::F32 => 4,
        _ => 2,
    }
}

/// The bits of a format in the `cast` kernel's FROM and TO, and the TYPE
/// of `layernorm` and `softmax_rows`.
fn cast_bits(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => 32,
        DType::F16 => 16,
        DType::Fp8 { .. } => 8,
    }
}

/// How an operation runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Work {
    LayerNorm {
        epsilon: f64,
    },
    /// `reduce_f32` IN=16 with P partials and epilogue EPI.
    Reduce {
        p: u32,
        epi: i64,
    },
    /// `softmax_rows` over each row.
    Softmax,
    /// `cast` between f16 and fp8 (FROM and TO in bits) with the fp8 scale.
    Cast {
        from: i64,
        to: i64,
        scale: i64,
    },
}

/// Where a value's rows are on every tile: buffer `buffer` (a plan-wide
/// index, the same on every tile), row 0 at `section` sections in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Home {
    buffer: usize,
    /// 0 or 1: the first or second half of a pair buffer.
    section: u32,
}

/// A buffer of the plan; its bytes depend on the tile's rows.
#[derive(Clone, Debug)]
struct PlanBuffer {
    name: String,
    /// Row width in elements of the rows it holds (0: a vector).
    n: u32,
    /// Bytes per element.
    eb: u32,
    /// Row blocks (2 for a pair buffer), or a vector of `n` elements.
    sections: u32,
    vector: bool,
    /// Extra bytes after the rows (the layernorm over-read).
    slack: u32,
    category: &'static str,
}

/// The layer-norm kernel: STAGE 0 normalises whole rows, one worker per
/// row; STAGE 1, 2 and 3 are the successive steps of rows split into
/// slices over several workers (partial sums, then d = x - mean with the
/// partial sums of d^2, then the output).
/// TYPE is 16 (f16 rows) or 32 (f32 rows); requests name both parameters,
/// which tell the library's eight objects apart.
pub fn layernorm_request(stage: i64, ty: i64) -> KernelRequest {
    KernelRequest {
        entry: "layernorm".into(),
        source: "layernorm.S".into(),
        params: [("STAGE".to_string(), stage), ("TYPE".to_string(), ty)]
            .into_iter()
            .collect(),
    }
}

/// Bytes of one row's partial sums in a split layer norm: the sums of x,
/// then the sums of d^2, one f32 per slice each, and for f32 rows the sums
/// of d too (the corrected mean, device/layernorm.S).
fn ln_parts_bytes(f32_rows: bool) -> u32 {
    (if f32_rows { 3 } else { 2 }) * 4 * ipu_arch::WORKER_CONTEXTS
}

/// Slices of each row of a layer norm on a tile with `rows` rows of
/// `quads` groups of four: the workers a row can have to itself, at most
/// one slice per group.
fn layernorm_slices(rows: u32, quads: u32) -> u32 {
    (ipu_arch::WORKER_CONTEXTS / rows.max(1)).min(quads).max(1)
}

/// Group ranges of a row's slices: even contiguous shares.
fn slice_groups(quads: u32, slices: u32) -> Vec<(u32, u32)> {
    (0..slices)
        .map(|j| (j * quads / slices, (j + 1) * quads / slices))
        .collect()
}

/// The row softmax kernel on f16 (TYPE 16) or f32 (32) rows.
pub fn softmax_request(ty: i64) -> KernelRequest {
    KernelRequest {
        entry: "softmax_rows".into(),
        source: "softmax_rows.S".into(),
        params: [("TYPE".to_string(), ty)].into_iter().collect(),
    }
}

/// Bytes of a worker's scratch row for `work` on rows of `n` elements of
/// `ty` bits: an f32 row of `d` (layer norm: 4 N + 8 bytes) or of
/// exponentials after the pair (-m, -m) (softmax: 4 N + 16; f32 rows 4 N +
/// 24, with the pair its pipeline writes first), read-ahead included; the
/// layer norm takes the f16 softmax's 4 N + 16, as it always has.
fn scratch_bytes(work: Work, n: u32, ty: i64) -> u32 {
    match work {
        Work::Softmax if ty == 32 => 4 * n + 24,
        _ => 4 * n + 16,
    }
}

/// Whether the operation's kernel takes a per-worker scratch row.
fn needs_scratch(work: Work) -> bool {
    matches!(work, Work::LayerNorm { .. } | Work::Softmax)
}

/// The cast kernel.
pub fn cast_request(from: i64, to: i64, scale: i64) -> KernelRequest {
    KernelRequest {
        entry: "cast".into(),
        source: "cast.S".into(),
        params: [
            ("FROM".to_string(), from),
            ("TO".to_string(), to),
            ("SR".to_string(), 0),
            ("SCALE".to_string(), scale),
        ]
        .into_iter()
        .collect(),
    }
}

/// An empty compute step for `operation`, its tiles' vertices to come.
pub(crate) fn compute_step(operation: String, phase: String) -> Step {
    Step::empty(operation, phase)
}

/// Lowers a row-wise segment graph onto `tile_count` tiles. Returns the
/// program and one report entry per operation.
///
/// Operations that share no rows (per-head softmaxes of a materialised
/// attention, a batch's per-element layer norms) form independent
/// *components*; when there are several and no more of them than tiles,
/// each runs on a share of the tiles of its own, in proportion to its
/// elements, rather than every operation on every tile one after the
/// other: a component's rows then fill its tiles' workers (sixteen
/// 729-row softmaxes took one worker of 729 tiles each, 16 x 15,624
/// cycles, against two rows per worker of 92 tiles), and tiles do not wait
/// for one another between compute steps, so the components' steps simply
/// follow one another in the program.
pub fn lower(
    graph: &Graph,
    tile_count: u32,
    library: &mut KernelLibrary,
) -> Result<(Lowered, Vec<serde_json::Value>), CompileError> {
    let components = components(graph);
    let whole: Vec<NodeId> = (0..graph.nodes().len() as u32).map(NodeId).collect();
    // Every operation on every tile already gives each tile's workers a
    // row each when there are that many rows: shares would then only
    // gather each value on fewer tiles, whose ports the joins into and
    // out of the segment must share (random fp8 attention models on 3 to
    // 5 tiles ran up to 11% longer with their casts side by side).
    let rows = graph
        .nodes()
        .iter()
        .filter_map(|n| graph.ty(n.result).shape.dims().first().copied())
        .max()
        .unwrap_or(0) as u64;
    let workers_busy = rows >= ipu_arch::WORKER_CONTEXTS as u64 * tile_count as u64;
    let parts = if components.len() < 2 || components.len() as u32 > tile_count || workers_busy {
        vec![(whole, tile_count)]
    } else {
        let elements: Vec<u64> = components
            .iter()
            .map(|c| {
                c.iter()
                    .map(|&n| graph.ty(graph.node(n).result).shape.elements())
                    .sum()
            })
            .collect();
        let shares = crate::transpose::shares(&elements, tile_count);
        components.into_iter().zip(shares).collect()
    };
    let mut buffers: BTreeMap<u32, Vec<BufferSpec>> =
        (0..tile_count).map(|t| (t, Vec::new())).collect();
    let mut steps = Vec::new();
    let mut reports = Vec::new();
    let mut tensors = HostTensors::default();
    let mut first_tile = 0;
    for (nodes, share) in parts {
        let part = lower_component(graph, &nodes, share, library)?;
        for (t, specs) in part.buffers {
            buffers.insert(first_tile + t, specs);
        }
        steps.extend(part.steps.into_iter().map(|s| s.on_tiles_from(first_tile)));
        for mut r in part.reports {
            r["first_tile"] = json!(first_tile);
            reports.push(r);
        }
        for (target, from) in [
            (&mut tensors.params, part.tensors.params),
            (&mut tensors.inputs, part.tensors.inputs),
            (&mut tensors.outputs, part.tensors.outputs),
        ] {
            // A vector (gamma, beta, a bias) that several components
            // read has a copy on each one's tiles.
            for t in from.into_values() {
                let placements = t.placements.iter().map(|p| HostPlacement {
                    tile: p.tile + first_tile,
                    ..*p
                });
                HostTensors::place(target, &t, placements);
            }
        }
        first_tile += share;
    }
    Ok((
        Lowered::two_calls(graph, tile_count, buffers, (vec![], steps), tensors),
        reports,
    ))
}

/// The segment's nodes in independent components, each in graph order:
/// two operations are in one component when one reads the other's result
/// or both read the same rows (a host row input has one home). Vectors
/// (gamma, beta, biases) do not join operations: each component's tiles
/// get their own copy.
fn components(graph: &Graph) -> Vec<Vec<NodeId>> {
    let count = graph.nodes().len();
    let mut parent: Vec<usize> = (0..count).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    // The first node that touches each row value (computes or reads it).
    let mut first: BTreeMap<ValueId, usize> = BTreeMap::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        let rows = node
            .args
            .iter()
            .filter(|&&a| graph.ty(a).shape.rank() == 2)
            .chain(std::iter::once(&node.result));
        for &v in rows {
            let j = *first.entry(v).or_insert(i);
            let (a, b) = (root(&mut parent, i), root(&mut parent, j));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut by_root: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
    for i in 0..count {
        let r = root(&mut parent, i);
        by_root.entry(r).or_default().push(NodeId(i as u32));
    }
    by_root.into_values().collect()
}

/// One component's program on tiles `0..tile_count` of its share.
struct Component {
    buffers: BTreeMap<u32, Vec<BufferSpec>>,
    steps: Vec<Step>,
    tensors: HostTensors,
    reports: Vec<serde_json::Value>,
}

/// Lowers the operations `nodes` of a row-wise segment (one component, or
/// the whole segment) onto `tile_count` tiles.
fn lower_component(
    graph: &Graph,
    nodes: &[NodeId],
    tile_count: u32,
    library: &mut KernelLibrary,
) -> Result<Component, CompileError> {
    let err = |v: ValueId, reason: String| CompileError::Unsupported {
        value: graph.value(v).name.clone(),
        operation: graph
            .def_node(v)
            .map_or("input", |n| graph.node(n).op.name())
            .to_string(),
        reason,
    };
    let is_host = |v: ValueId| !matches!(graph.value(v).def, ValueDef::Node(_));
    let users = graph.all_users();
    // Every row tensor: f16 or f32 (or fp8, around a cast) [M, N] with one M.
    let mut m = None;
    let mut row_tensor = |v: ValueId| -> Result<u32, CompileError> {
        let t = graph.ty(v);
        if t.shape.rank() != 2 {
            return Err(err(
                v,
                format!(
                    "has type {t}; row-wise operations are lowered for f16 and f32 [rows, width] tensors (and fp8 ones around a cast)"
                ),
            ));
        }
        let (rows, n) = (t.shape.dims()[0] as u32, t.shape.dims()[1] as u32);
        match m {
            None => m = Some(rows),
            Some(r) if r != rows => {
                return Err(err(
                    v,
                    format!(
                        "has {rows} rows; the other row-wise operations of its segment have {r}"
                    ),
                ))
            }
            _ => {}
        }
        Ok(n)
    };
    let vector = |v: ValueId, n: u32, dtype: DType, role: &str| -> Result<(), CompileError> {
        let t = graph.ty(v);
        if !is_host(v) || t.dtype != dtype || t.shape.dims() != [n as usize] {
            return Err(err(
                v,
                format!("is the {role} of a row-wise operation on {dtype} rows of {n}; it must be a host {dtype}[{n}] input or param, not {t}"),
            ));
        }
        Ok(())
    };

    // The operations: (node, work, row operands, vector operands).
    struct Operation {
        result: ValueId,
        work: Work,
        rows: Vec<ValueId>,
        vectors: Vec<ValueId>,
        n: u32,
    }
    let mut ops = Vec::new();
    for node in nodes.iter().map(|&n| graph.node(n)) {
        let r = node.result;
        let n = row_tensor(r)?;
        let dtype = graph.ty(r).dtype;
        if !matches!(node.op, Op::Cast { .. }) && !matches!(dtype, DType::F16 | DType::F32) {
            return Err(err(
                r,
                format!(
                    "is {dtype}; `{}` is lowered for f16 and f32 [rows, width] tensors",
                    node.op.name()
                ),
            ));
        }
        let op = match node.op {
            Op::Cast { to } => {
                row_tensor(node.args[0])?;
                let from = graph.ty(node.args[0]).dtype;
                let scale = match (from, to) {
                    (DType::F16 | DType::F32, DType::Fp8 { scale_log2 })
                    | (DType::Fp8 { scale_log2 }, DType::F16 | DType::F32) => scale_log2 as i64,
                    (DType::F16, DType::F32) | (DType::F32, DType::F16) => 0,
                    _ => {
                        return Err(err(
                            r,
                            format!("casts from {from} to {to} are not lowered (between f32, f16 and fp8 they are)"),
                        ))
                    }
                };
                Operation {
                    result: r,
                    work: Work::Cast {
                        from: cast_bits(from),
                        to: cast_bits(to),
                        scale,
                    },
                    rows: vec![node.args[0]],
                    vectors: vec![],
                    n,
                }
            }
            Op::LayerNorm { epsilon } => {
                row_tensor(node.args[0])?;
                vector(node.args[1], n, dtype, "gamma")?;
                vector(node.args[2], n, dtype, "beta")?;
                if !(1e-6..=0.5).contains(&epsilon) {
                    return Err(err(
                        r,
                        format!("epsilon {epsilon} is outside the kernel's range 1e-6..=0.5"),
                    ));
                }
                Operation {
                    result: r,
                    work: Work::LayerNorm { epsilon },
                    rows: vec![node.args[0]],
                    vectors: vec![node.args[1], node.args[2]],
                    n,
                }
            }
            Op::Softmax => {
                row_tensor(node.args[0])?;
                Operation {
                    result: r,
                    work: Work::Softmax,
                    rows: vec![node.args[0]],
                    vectors: vec![],
                    n,
                }
            }
            Op::Gelu => {
                row_tensor(node.args[0])?;
                Operation {
                    result: r,
                    work: Work::Reduce { p: 1, epi: 3 },
                    rows: vec![node.args[0]],
                    vectors: vec![],
                    n,
                }
            }
            Op::Add => {
                let (a, b) = (node.args[0], node.args[1]);
                let (ta, tb) = (graph.ty(a), graph.ty(b));
                if ta.shape == tb.shape {
                    row_tensor(a)?;
                    Operation {
                        result: r,
                        work: Work::Reduce { p: 2, epi: 0 },
                        rows: vec![a, b],
                        vectors: vec![],
                        n,
                    }
                } else {
                    // A bias: the [N] operand is the vector.
                    let (rows, bias) = if tb.shape.rank() == 1 { (a, b) } else { (b, a) };
                    row_tensor(rows)?;
                    vector(bias, n, dtype, "bias")?;
                    Operation {
                        result: r,
                        work: Work::Reduce { p: 1, epi: 1 },
                        rows: vec![rows],
                        vectors: vec![bias],
                        n,
                    }
                }
            }
            _ => {
                return Err(err(
                    r,
                    format!("`{}` is not a row-wise operation", node.op.name()),
                ))
            }
        };
        ops.push(op);
    }
    let m = m.unwrap_or(0);
    if m == 0 {
        return Err(CompileError::Verifier {
            phase: "lower",
            message: format!("row-wise segment `{}` has no rows", graph.name()),
        });
    }

    // Buffers and homes.
    let mut plan: Vec<PlanBuffer> = Vec::new();
    let mut homes: BTreeMap<ValueId, Home> = BTreeMap::new();
    // Input slots: (value, home) pairs the exchange or the host fills.
    let mut input_slots: Vec<(ValueId, Home)> = Vec::new();
    let mut vectors: BTreeMap<ValueId, usize> = BTreeMap::new();
    // The pair buffer of each residual add (by result).
    let mut pairs: BTreeMap<ValueId, usize> = BTreeMap::new();
    let name = |v: ValueId| graph.value(v).name.clone();
    for op in &ops {
        if let Work::Reduce { p: 2, .. } = op.work {
            plan.push(PlanBuffer {
                name: format!("{}.pair", name(op.result)),
                n: op.n,
                eb: element_bytes(graph.ty(op.result).dtype),
                sections: 2,
                vector: false,
                slack: 0,
                category: "rowwise_operand",
            });
            let pair = plan.len() - 1;
            pairs.insert(op.result, pair);
            for (section, &a) in op.rows.iter().enumerate() {
                let home = Home {
                    buffer: pair,
                    section: section as u32,
                };
                if is_host(a) {
                    input_slots.push((a, home));
                } else if homes.contains_key(&a)
                    || users[a.0 as usize].len() != 1
                    || graph.outputs().contains(&a)
                {
                    return Err(err(op.result, format!("operand `{}` is read elsewhere too; a residual add reads operands that only it reads (the segmenter cuts before such an add)", name(a))));
                } else {
                    homes.insert(a, home);
                }
            }
        }
    }
    // Layer norms over-read 8 bytes after a row's last group of four (the
    // softmax gets the same slack).
    let over_read: Vec<ValueId> = ops
        .iter()
        .filter(|o| needs_scratch(o.work))
        .map(|o| o.rows[0])
        .collect();
    for op in &ops {
        for &a in &op.rows {
            if is_host(a)
                && !homes.contains_key(&a)
                && !matches!(op.work, Work::Reduce { p: 2, .. })
            {
                plan.push(PlanBuffer {
                    name: format!("{}.in", name(a)),
                    n: op.n,
                    eb: element_bytes(graph.ty(a).dtype),
                    sections: 1,
                    vector: false,
                    slack: if over_read.contains(&a) { 8 } else { 0 },
                    category: "rowwise_operand",
                });
                let home = Home {
                    buffer: plan.len() - 1,
                    section: 0,
                };
                homes.insert(a, home);
                input_slots.push((a, home));
            }
        }
        for &v in &op.vectors {
            vectors.entry(v).or_insert_with(|| {
                plan.push(PlanBuffer {
                    name: name(v),
                    n: op.n,
                    eb: element_bytes(graph.ty(v).dtype),
                    sections: 1,
                    vector: true,
                    slack: 8,
                    category: "rowwise_param",
                });
                plan.len() - 1
            });
        }
        homes.entry(op.result).or_insert_with(|| {
            plan.push(PlanBuffer {
                name: format!("{}.out", name(op.result)),
                n: op.n,
                eb: element_bytes(graph.ty(op.result).dtype),
                sections: 1,
                vector: false,
                slack: if over_read.contains(&op.result) { 8 } else { 0 },
                category: "rowwise_result",
            });
            Home {
                buffer: plan.len() - 1,
                section: 0,
            }
        });
    }
    // The layer norms' and softmaxes' per-worker scratch
    // (`scratch_bytes`), each worker's share 8-aligned.
    let scratch_width = ops
        .iter()
        .filter(|o| needs_scratch(o.work))
        .map(|o| {
            let ty = cast_bits(graph.ty(o.result).dtype);
            scratch_bytes(o.work, o.n, ty)
        })
        .max();
    let scratch = scratch_width.map(|bytes| {
        let per_worker = bytes.div_ceil(8) * 8;
        plan.push(PlanBuffer {
            name: format!("{}.row_scratch", graph.name()),
            n: 0,
            eb: 1,
            sections: ipu_arch::WORKER_CONTEXTS,
            vector: true,
            slack: per_worker * ipu_arch::WORKER_CONTEXTS,
            category: "rowwise_scratch",
        });
        (plan.len() - 1, per_worker)
    });

    // Rows per tile: as many tiles as rows, up to the tile count.
    let used = tile_count.min(m);
    let per_tile = m.div_ceil(used);
    let used = m.div_ceil(per_tile);
    let rows_of = |t: u32| -> (u32, u32) {
        let r0 = (t * per_tile).min(m);
        (r0, ((t + 1) * per_tile).min(m))
    };
    // A layer norm whose tiles hold at most three rows can give each row
    // two or more workers (STAGE 1-3); their partial sums need a few bytes
    // per row.
    let ln_parts_bytes = ln_parts_bytes(ops.iter().any(|o| {
        matches!(o.work, Work::LayerNorm { .. }) && graph.ty(o.result).dtype == DType::F32
    }));
    let ln_parts = (ops.iter().any(|o| matches!(o.work, Work::LayerNorm { .. }))
        && 2 * per_tile <= ipu_arch::WORKER_CONTEXTS)
        .then(|| {
            plan.push(PlanBuffer {
                name: format!("{}.row_parts", graph.name()),
                n: 0,
                eb: 1,
                sections: 1,
                vector: true,
                slack: per_tile * ln_parts_bytes,
                category: "rowwise_scratch",
            });
            plan.len() - 1
        });
    let mut buffers: BTreeMap<u32, Vec<BufferSpec>> =
        (0..tile_count).map(|t| (t, Vec::new())).collect();
    for t in 0..used {
        let (r0, r1) = rows_of(t);
        let rows = r1 - r0;
        let bufs = buffers.get_mut(&t).expect("tiles below tile_count");
        for b in &plan {
            let bytes = if b.vector {
                if b.category == "rowwise_scratch" {
                    b.slack
                } else {
                    row_stride(b.n, b.eb) + b.slack
                }
            } else {
                b.sections * rows * row_stride(b.n, b.eb) + b.slack
            };
            // Padding lanes of rows and vectors start as zeros.
            let padded = b.n % 4 != 0 && b.category != "rowwise_scratch";
            // f32 rows are `reduce_f32` IN=32 partials for an add, a bias
            // or a GELU: 128-bit loads, region 1, 16-aligned.
            let f32_rows = !b.vector && b.eb == 4;
            bufs.push(BufferSpec {
                name: b.name.clone(),
                bytes,
                align: if f32_rows { 16 } else { 8 },
                // The layer norms' scratch in interleaved memory, where a
                // segmented program's segments share memory; rows (often
                // values that outlive their segment) and vectors wherever
                // there is room, so that they do not cost the segments a
                // whole interleaved element.
                region: if b.category == "rowwise_scratch" || f32_rows {
                    RegionReq::Interleaved
                } else {
                    RegionReq::Any
                },
                exclusive_element: false,
                zero: if padded { vec![(0, bytes)] } else { vec![] },
                category: b.category.into(),
                scratch: None,
                lifetime: None,
                kernel_segment: None,
            });
        }
    }

    // Steps.
    let mut formulas: BTreeMap<String, FormulaCost> = BTreeMap::new();
    let mut steps = Vec::new();
    let mut reports = Vec::new();
    for op in &ops {
        // TYPE of `layernorm` and `softmax_rows`: the bits of the result.
        let ty = cast_bits(graph.ty(op.result).dtype);
        if let (Work::LayerNorm { epsilon }, Some(parts)) = (op.work, ln_parts) {
            let quads = op.n / 4;
            let slices = layernorm_slices(per_tile, quads);
            let whole =
                crate::kernel_formula(library, &layernorm_request(0, ty), &["ROWS", "COLS"])?.eval(
                    &[
                        ("ROWS", per_tile.div_ceil(ipu_arch::WORKER_CONTEXTS) as i64),
                        ("COLS", op.n as i64),
                    ],
                ) + launch_cycles(per_tile.min(ipu_arch::WORKER_CONTEXTS) as u64);
            let mut stages = Vec::new();
            for stage in 1..=3 {
                let request = layernorm_request(stage, ty);
                let formula =
                    crate::kernel_formula(library, &request, &["QUADS", "TAIL", "NPARTS"])?;
                stages.push((stage, request, formula));
            }
            // The slowest tile holds `per_tile` rows; its slowest slice
            // has the most groups and, being the last, the tail.
            let widest = slice_groups(quads, slices)
                .iter()
                .map(|g| g.1 - g.0)
                .max()
                .unwrap_or(0);
            let split: u64 = stages
                .iter_mut()
                .map(|(_, _, f)| {
                    f.eval(&[
                        ("QUADS", widest as i64),
                        ("TAIL", (op.n % 4) as i64),
                        ("NPARTS", slices as i64),
                    ]) + launch_cycles((per_tile * slices) as u64)
                })
                .sum();
            if slices >= 2 && split < whole {
                let (sb, sbytes) = scratch.expect("layer norms have scratch");
                let x = homes[&op.rows[0]];
                let out = homes[&op.result];
                let eb = element_bytes(graph.ty(op.result).dtype);
                let stride = row_stride(op.n, eb);
                // Bytes of one group of four.
                let gb = 4 * eb;
                let mut estimated = 0;
                for (stage, request, formula) in &mut stages {
                    let mut step = compute_step(
                        name(op.result),
                        format!("layernorm {} (stage {stage} of 3)", name(op.result)),
                    );
                    for t in 0..used {
                        let (r0, r1) = rows_of(t);
                        let rows = r1 - r0;
                        let slices = layernorm_slices(rows, quads);
                        let groups = slice_groups(quads, slices);
                        let mut vertices = Vec::new();
                        let mut slowest = 0;
                        for r in 0..rows {
                            for (j, &(q0, q1)) in groups.iter().enumerate() {
                                let tail = if j + 1 == groups.len() { op.n % 4 } else { 0 };
                                let at = |h: Home, bytes: u32| StateWord::Addr {
                                    buffer: h.buffer,
                                    offset: h.section * rows * stride + r * stride + bytes,
                                };
                                let vector = |v: ValueId| StateWord::Addr {
                                    buffer: vectors[&v],
                                    offset: q0 * gb,
                                };
                                vertices.push(Vertex {
                                    kernel: std::sync::Arc::new(request.clone()),
                                    state: vec![
                                        at(x, q0 * gb),
                                        at(out, q0 * gb),
                                        StateWord::Const(q1 - q0),
                                        StateWord::Const(tail),
                                        StateWord::Const(op.n),
                                        vector(op.vectors[0]),
                                        vector(op.vectors[1]),
                                        StateWord::Const((epsilon as f32).to_bits()),
                                        StateWord::Addr {
                                            buffer: sb,
                                            offset: r * sbytes + q0 * 16,
                                        },
                                        StateWord::Addr {
                                            buffer: parts,
                                            offset: r * ln_parts_bytes,
                                        },
                                        StateWord::Const(slices),
                                        StateWord::Const(j as u32),
                                    ],
                                });
                                slowest = slowest.max(formula.eval(&[
                                    ("QUADS", (q1 - q0) as i64),
                                    ("TAIL", tail as i64),
                                    ("NPARTS", slices as i64),
                                ]));
                            }
                        }
                        let cycles = slowest + launch_cycles(vertices.len() as u64);
                        step.put_tile(t, vertices, cycles);
                    }
                    estimated += step.estimated_cycles;
                    steps.push(step);
                }
                reports.push(json!({
                    "value": name(op.result),
                    "operation": "layernorm",
                    "shape": [m, op.n],
                    "kernel": format!("layernorm STAGE=1..3 TYPE={ty}"),
                    "tiles": used,
                    "rows_per_tile": per_tile,
                    "slices_per_row": slices,
                    "estimated_cycles": estimated,
                }));
                tracing::info!(
                    value = %name(op.result),
                    kernel = %format!("layernorm STAGE=1..3 TYPE={ty}"),
                    tiles = used,
                    rows_per_tile = per_tile,
                    slices_per_row = slices,
                    estimated_cycles = estimated,
                    whole_row_estimated_cycles = whole,
                    "row-wise operation planned"
                );
                continue;
            }
        }
        let request = match op.work {
            Work::LayerNorm { .. } => layernorm_request(0, ty),
            Work::Softmax => softmax_request(ty),
            // f32 rows: f32 partials, sum and epilogue (IN=32 OUT=32).
            Work::Reduce { epi, .. } if ty == 32 => crate::reduce_kernel(false, epi),
            // A residual add (P = 2) and a bias add sum in f16 when the
            // library has it: one rounding of the exact sum, as the f32 sum
            // rounded to f16 gives (or a rarer double rounding it avoids),
            // at P + 1 issue slots per four outputs instead of 4P + 5.
            Work::Reduce { epi, .. } => crate::reduce_request_f16_partials(library, epi, false),
            Work::Cast { from, to, scale } => cast_request(from, to, scale),
        };
        let vars: &[&str] = match op.work {
            Work::LayerNorm { .. } | Work::Softmax => &["ROWS", "COLS"],
            Work::Reduce { .. } => &["ROWS", "QUADS", "P"],
            Work::Cast { .. } => &["N"],
        };
        let formula = match formulas.entry(request.to_string()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(crate::kernel_formula(library, &request, vars)?)
            }
        };
        // Operand and result row strides (they differ only for a cast).
        let stride = row_stride(op.n, element_bytes(graph.ty(op.rows[0]).dtype));
        let out_stride = row_stride(op.n, element_bytes(graph.ty(op.result).dtype));
        // A cast's workers take whole 8-byte groups (its addresses are
        // 8-aligned and an fp8 vertex owns the words it writes): rows in
        // pairs when a row is not a multiple of 8 bytes.
        let unit = if matches!(op.work, Work::Cast { .. }) && out_stride.min(stride) & 7 != 0 {
            2
        } else {
            1
        };
        let mut step = compute_step(
            name(op.result),
            format!(
                "{} {}",
                graph
                    .node(graph.def_node(op.result).expect("a node's result"))
                    .op
                    .name(),
                name(op.result)
            ),
        );
        for t in 0..used {
            let (r0, r1) = rows_of(t);
            let rows = r1 - r0;
            let quads = op.n.div_ceil(4);
            // Work items (rows w0..w1, groups of four q0..q1): contiguous
            // row ranges, or, for an element-wise kernel on a tile with
            // fewer rows than workers, each row's groups split over the
            // workers (a cast's in 8-byte pieces).
            let elementwise = match op.work {
                Work::Reduce { .. } => true,
                Work::Cast { .. } => unit == 1,
                _ => false,
            };
            let items: Vec<(u32, u32, u32, u32)> =
                if elementwise && rows < ipu_arch::WORKER_CONTEXTS {
                    let per_row = ipu_arch::WORKER_CONTEXTS / rows;
                    let mut chunk = quads.div_ceil(per_row);
                    if matches!(op.work, Work::Cast { .. }) {
                        chunk = chunk.div_ceil(2) * 2;
                    }
                    (0..rows)
                        .flat_map(|r| {
                            (0..quads.div_ceil(chunk))
                                .map(move |j| (r, r + 1, j * chunk, ((j + 1) * chunk).min(quads)))
                        })
                        .collect()
                } else {
                    let units = rows.div_ceil(unit);
                    let workers = units.min(ipu_arch::WORKER_CONTEXTS);
                    (0..workers)
                        .map(|w| {
                            (
                                (w * units / workers * unit).min(rows),
                                ((w + 1) * units / workers * unit).min(rows),
                                0,
                                quads,
                            )
                        })
                        .filter(|i| i.0 < i.1)
                        .collect()
                };
            let section = rows * stride;
            let in_eb = element_bytes(graph.ty(op.rows[0]).dtype);
            let out_eb = element_bytes(graph.ty(op.result).dtype);
            let at_q = |h: Home, row: u32, q: u32| StateWord::Addr {
                buffer: h.buffer,
                offset: h.section * section + row * stride + q * 4 * in_eb,
            };
            let at = |h: Home, row: u32| at_q(h, row, 0);
            let out_at = |row: u32, q: u32| StateWord::Addr {
                buffer: homes[&op.result].buffer,
                offset: homes[&op.result].section * rows * out_stride
                    + row * out_stride
                    + q * 4 * out_eb,
            };
            let out = homes[&op.result];
            let mut vertices = Vec::new();
            let mut slowest = 0;
            for (w, &(w0, w1, q0, q1)) in items.iter().enumerate() {
                let w = w as u32;
                // Elements of a cast: whole rows are contiguous (padding
                // lanes included: the operand's and the result's groups of
                // four line up), part of a row is one run.
                let cast_elements = if (q0, q1) == (0, quads) {
                    (w1 - w0) * quads * 4
                } else {
                    (q1 - q0) * 4
                };
                // layernorm and softmax_rows start alike: IN, RS_IN,
                // OUT, RS_OUT, ROWS, COLS; the worker's scratch row ends both.
                let row_kernel = |middle: Vec<StateWord>| {
                    let (sb, sbytes) = scratch.expect("layer norms and softmaxes have scratch");
                    let mut state = vec![
                        at(homes[&op.rows[0]], w0),
                        StateWord::Const(stride),
                        at(out, w0),
                        StateWord::Const(stride),
                        StateWord::Const(w1 - w0),
                        StateWord::Const(op.n),
                    ];
                    state.extend(middle);
                    state.push(StateWord::Addr {
                        buffer: sb,
                        offset: w * sbytes,
                    });
                    state
                };
                let state = match op.work {
                    Work::LayerNorm { epsilon } => row_kernel(vec![
                        StateWord::Addr {
                            buffer: vectors[&op.vectors[0]],
                            offset: 0,
                        },
                        StateWord::Addr {
                            buffer: vectors[&op.vectors[1]],
                            offset: 0,
                        },
                        StateWord::Const((epsilon as f32).to_bits()),
                    ]),
                    Work::Softmax => row_kernel(vec![StateWord::Const(1f32.to_bits())]),
                    Work::Reduce { p, epi } => vec![
                        match pairs.get(&op.result) {
                            Some(&buffer) => at_q(Home { buffer, section: 0 }, w0, q0),
                            None => at_q(homes[&op.rows[0]], w0, q0),
                        },
                        StateWord::Const(section),
                        StateWord::Const(p),
                        StateWord::Const(stride),
                        out_at(w0, q0),
                        StateWord::Const(stride),
                        StateWord::Const(w1 - w0),
                        StateWord::Const(q1 - q0),
                        if epi == 1 {
                            StateWord::Addr {
                                buffer: vectors[&op.vectors[0]],
                                offset: q0 * 4 * out_eb,
                            }
                        } else {
                            StateWord::Const(0)
                        },
                    ],
                    Work::Cast { .. } => vec![
                        at_q(homes[&op.rows[0]], w0, q0),
                        out_at(w0, q0),
                        StateWord::Const(cast_elements),
                    ],
                };
                let cycles = match op.work {
                    Work::LayerNorm { .. } | Work::Softmax => {
                        formula.eval(&[("ROWS", (w1 - w0) as i64), ("COLS", op.n as i64)])
                    }
                    Work::Reduce { p, .. } => formula.eval(&[
                        ("ROWS", (w1 - w0) as i64),
                        ("QUADS", (q1 - q0) as i64),
                        ("P", p as i64),
                    ]),
                    Work::Cast { .. } => formula.eval(&[("N", cast_elements as i64)]),
                };
                slowest = slowest.max(cycles);
                vertices.push(Vertex {
                    kernel: std::sync::Arc::new(request.clone()),
                    state,
                });
            }
            let cycles = slowest + launch_cycles(vertices.len() as u64);
            step.put_tile(t, vertices, cycles);
        }
        reports.push(json!({
            "value": name(op.result),
            "operation": graph.node(graph.def_node(op.result).expect("a node's result")).op.name(),
            "shape": [m, op.n],
            "kernel": request.to_string(),
            "tiles": used,
            "rows_per_tile": per_tile,
            "estimated_cycles": step.estimated_cycles,
        }));
        tracing::info!(
            value = %name(op.result),
            kernel = %request,
            tiles = used,
            rows_per_tile = per_tile,
            estimated_cycles = step.estimated_cycles,
            "row-wise operation planned"
        );
        steps.push(step);
    }

    // Host tensors: row slots of inputs, vectors on every tile, outputs.
    let host_tensor = |v: ValueId| HostTensor {
        name: name(v),
        ty: graph.ty(v).clone(),
        placements: Vec::new(),
    };
    let mut inputs: BTreeMap<ValueId, HostTensor> = BTreeMap::new();
    let mut params: BTreeMap<ValueId, HostTensor> = BTreeMap::new();
    let rows_placements = |list: &mut Vec<HostPlacement>, v: ValueId, h: Home| {
        let n = graph.ty(v).shape.dims()[1] as u32;
        let eb = element_bytes(graph.ty(v).dtype);
        let stride = row_stride(n, eb);
        for t in 0..used {
            let (r0, r1) = rows_of(t);
            for r in r0..r1 {
                push_coalesced(
                    list,
                    HostPlacement {
                        tile: t,
                        buffer: h.buffer,
                        buffer_offset: h.section * (r1 - r0) * stride + (r - r0) * stride,
                        host_offset: r as u64 * n as u64 * eb as u64,
                        bytes: n * eb,
                    },
                );
            }
        }
    };
    for &(v, h) in &input_slots {
        let target = if graph.value(v).def == ValueDef::Param {
            &mut params
        } else {
            &mut inputs
        };
        let t = target.entry(v).or_insert_with(|| host_tensor(v));
        rows_placements(&mut t.placements, v, h);
    }
    for (&v, &b) in &vectors {
        let target = if graph.value(v).def == ValueDef::Param {
            &mut params
        } else {
            &mut inputs
        };
        let t = target.entry(v).or_insert_with(|| host_tensor(v));
        let bytes = graph.ty(v).bytes() as u32;
        for tile in 0..used {
            t.placements.push(HostPlacement {
                tile,
                buffer: b,
                buffer_offset: 0,
                host_offset: 0,
                bytes,
            });
        }
    }
    let mut outputs = BTreeMap::new();
    for &v in graph
        .outputs()
        .iter()
        .filter(|&&v| ops.iter().any(|o| o.result == v))
    {
        let mut t = host_tensor(v);
        rows_placements(&mut t.placements, v, homes[&v]);
        outputs.insert(t.name.clone(), t);
    }
    let by_name = |m: BTreeMap<ValueId, HostTensor>| -> BTreeMap<String, HostTensor> {
        m.into_values().map(|t| (t.name.clone(), t)).collect()
    };
    let tensors = HostTensors {
        params: by_name(params),
        inputs: by_name(inputs),
        outputs,
        resident: BTreeMap::new(),
    };
    Ok(Component {
        buffers,
        steps,
        tensors,
        reports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Operations join a component through a result they read or rows
    /// they share; vectors (a shared gamma) do not join them.
    #[test]
    fn components_are_joined_by_rows_not_vectors() {
        let g = ipu_graph::parse(
            "t.ipug",
            "model m\ninput s0: f32[5, 8]\ninput s1: f32[7, 8]\ninput a: f16[5, 8]\nparam g: f16[8]\nparam b: f16[8]\np0 = softmax(s0)\np1 = softmax(s1)\nc0 = cast(p0, to=f16)\nn0 = layernorm(a, g, b, epsilon=1e-5)\nc1 = cast(p1, to=f16)\nn1 = layernorm(c0, g, b, epsilon=1e-5)\ne = gelu(a)\noutput c1, n0, n1, e\n",
        )
        .unwrap();
        let names: Vec<Vec<String>> = components(&g)
            .iter()
            .map(|c| {
                c.iter()
                    .map(|&n| g.value(g.node(n).result).name.clone())
                    .collect()
            })
            .collect();
        assert_eq!(
            names,
            [vec!["p0", "c0", "n1"], vec!["p1", "c1"], vec!["n0", "e"]]
        );
    }

    /// Every group of a row lands in exactly one slice, slices are ordered
    /// and nonempty, and a row never gets more slices than its tile's
    /// workers can run side by side.
    #[test]
    fn layer_norm_slices_cover_each_row_once() {
        for rows in 1..=6 {
            for quads in 0..=300 {
                let slices = layernorm_slices(rows, quads);
                assert!(slices >= 1 && rows * slices <= ipu_arch::WORKER_CONTEXTS.max(rows));
                let groups = slice_groups(quads, slices);
                assert_eq!(groups.len() as u32, slices);
                let mut next = 0;
                for &(q0, q1) in &groups {
                    assert_eq!(q0, next, "rows {rows} quads {quads}: {groups:?}");
                    assert!(q1 > q0 || quads == 0, "empty slice: {groups:?}");
                    next = q1;
                }
                assert_eq!(next, quads);
            }
        }
        assert_eq!(layernorm_slices(1, 288), 6);
        assert_eq!(layernorm_slices(2, 288), 3);
        assert_eq!(layernorm_slices(1, 3), 3);
    }
}
