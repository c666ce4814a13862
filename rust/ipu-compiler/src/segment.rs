//! Phase `segment`: splits a model that is more than one pattern of GEMM
//! groups and attention blocks into segments that run one after another,
//! and joins their lowered programs.
//!
//! A segment is either a *block* segment (GEMM groups with their fused
//! epilogues, GEMM chains and attention blocks: what [`crate::fuse`] and
//! [`crate::attention`] recognise, planned and lowered as a model of its
//! own) or a *row-wise* segment (layer norms, residual adds, bias adds and
//! GELUs that no GEMM epilogue absorbs, softmaxes, f16/fp8 casts:
//! [`crate::rowwise`]) or a *transpose* segment (device transposes of
//! values computed before it, side by side: [`crate::transpose`]). [`split`]
//! cuts the graph in node order wherever the kind changes, before a GEMM
//! whose A operand is computed in its segment by something other than a
//! GEMM group (an attention block's `merge_heads`) and before a GEMM whose
//! B operand is computed in its segment (a block segment reads a computed B
//! as a device input, placed as it places a host B), so each segment is a
//! graph the pattern it goes to accepts. A value a segment reads from an
//! earlier one becomes an input of its graph (a *device input*); a value a
//! later segment reads becomes an output.
//!
//! [`join`] concatenates the segments' programs on a common tile count and
//! moves every device input with one exchange step before its segment:
//! the producer's output placements and the consumer's input placements
//! both say which bytes of the tensor sit where, so the transfers are their
//! intersections, whatever the two layouts are. Invariants of the joined
//! program: buffer indices and scratch phases are renumbered so that no two
//! segments share one; every buffer that holds a value across segments (an
//! exported value, a parameter, a host input written at the start of the
//! run but read by a later segment) or must be zero at load is persistent;
//! every other buffer lives only while its segment runs
//! ([`crate::lower::BufferSpec::lifetime`]), so the segments' buffers share
//! memory; a device input's destination lives for its whole segment (the
//! exchange that fills it runs before the segment's first step).

use crate::attention::FillJob;
use crate::error::CompileError;
use crate::exchange::{self, BufferRef, BufferTransfer};
use crate::lower::{HostPlacement, HostTensor, HostTensors, Lowered, StateWord, Step};
use ipu_graph::{DType, Graph, NodeId, Op, ValueDef, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// What lowers a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// GEMM groups and attention blocks ([`crate::plan_and_lower`]).
    Blocks,
    /// Row-wise operations ([`crate::rowwise`]).
    Rowwise,
    /// Device transposes of values computed elsewhere
    /// ([`crate::transpose`]).
    Transpose,
}

/// One segment: a graph of its own.
#[derive(Clone, Debug)]
pub struct Segment {
    pub kind: Kind,
    pub graph: Graph,
    /// Inputs of `graph` that earlier segments compute.
    pub device_inputs: Vec<String>,
    /// Outputs of `graph` that the model reads only through casts to fp8
    /// ([`requantised_values`]).
    pub requantised: BTreeSet<String>,
}

/// Values that are not model outputs and whose every reader is a cast to
/// fp8. Their f16 rounding is far below the fp8 step they are re-quantised
/// to (F143 keeps 3 mantissa bits), so a GEMM epilogue producing one may
/// compute its GELU in f16 arithmetic, as for a result that feeds a GEMM
/// (crate::reduce_request_f16_partials).
pub fn requantised_values(graph: &Graph) -> BTreeSet<String> {
    let users = graph.all_users();
    graph
        .nodes()
        .iter()
        .map(|n| n.result)
        .filter(|&v| {
            let readers = &users[v.0 as usize];
            !graph.outputs().contains(&v)
                && !readers.is_empty()
                && readers.iter().all(|&u| {
                    let node = graph.node(u);
                    matches!(node.op, Op::Cast { .. })
                        && matches!(graph.ty(node.result).dtype, DType::Fp8 { .. })
                })
        })
        .map(|v| graph.value(v).name.clone())
        .collect()
}

/// The `add` and `gelu` nodes that are epilogues of GEMM groups
/// (the rule of [`crate::fuse::fuse`]: single-use f16 values after a GEMM,
/// at most one bias add with a host `[N]` operand, then at most one gelu).
fn epilogue_nodes(graph: &Graph) -> BTreeSet<NodeId> {
    let users = graph.all_users();
    let is_output = |v: ValueId| graph.outputs().contains(&v);
    let mut out = BTreeSet::new();
    for node in graph.nodes() {
        if !matches!(node.op, Op::Gemm { .. }) || node.args.len() != 2 {
            continue;
        }
        let b = graph.ty(node.args[1]);
        let Some(&n) = b.shape.dims().last() else {
            continue;
        };
        let (mut last, mut bias, mut gelu) = (node.result, false, false);
        loop {
            let u = &users[last.0 as usize];
            if is_output(last) || u.len() != 1 {
                break;
            }
            let next = graph.node(u[0]);
            if !crate::fuse::epilogue_type(graph, node.result, next.result) {
                break;
            }
            match next.op {
                Op::Add if !bias && !gelu => {
                    let other = if next.args[0] == last {
                        next.args[1]
                    } else {
                        next.args[0]
                    };
                    let host = !matches!(graph.value(other).def, ValueDef::Node(_));
                    if other == last || !host || graph.ty(other).shape.dims() != [n] {
                        break;
                    }
                    bias = true;
                }
                Op::Gelu if !gelu => gelu = true,
                _ => break,
            }
            out.insert(u[0]);
            last = next.result;
        }
    }
    out
}

/// Tiles a GEMM needs at least to run beside others on tiles of its own:
/// its operands and an f32 result in a quarter of region 1 per tile (the
/// planner's buffers are padded, doubled for streaming and kept in whole
/// memory elements, so a quarter is what a plan can count on).
fn gemm_tile_demand(graph: &Graph, id: NodeId) -> u32 {
    let node = graph.node(id);
    let (a, b) = (graph.ty(node.args[0]), graph.ty(node.args[1]));
    let (&[m, k], &[_, n]) = (a.shape.dims(), b.shape.dims()) else {
        return 1;
    };
    let bytes = (m * k) as u64 * a.dtype.size_bytes() as u64
        + (k * n) as u64 * b.dtype.size_bytes() as u64
        + (m * n) as u64 * 4;
    let budget = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64 / 4;
    bytes.div_ceil(budget).max(1) as u32
}

/// Independent GEMMs that may share one tile in a segment ([`split`]):
/// each GEMM's element-exclusive buffers (A and its two C buffers) take
/// 32 KiB interleaved elements of their own, three each, of region 1's
/// thirteen.
pub const SHARED_TILE_GEMMS: u32 = 4;

/// The kind of segment each node of `graph` belongs in, by node index.
pub(crate) fn node_kinds(graph: &Graph) -> Vec<Kind> {
    let epilogues = epilogue_nodes(graph);
    (0..graph.nodes().len())
        .map(|n| kind_of(graph, &epilogues, NodeId(n as u32)))
        .collect()
}

/// The kind of segment node `n` belongs to.
fn kind_of(graph: &Graph, epilogues: &BTreeSet<NodeId>, n: NodeId) -> Kind {
    match graph.node(n).op {
        Op::LayerNorm { .. } | Op::Cast { .. } | Op::Softmax => Kind::Rowwise,
        Op::Transpose => Kind::Transpose,
        Op::Add | Op::Gelu if !epilogues.contains(&n) => Kind::Rowwise,
        _ => Kind::Blocks,
    }
}

/// Splits `graph` into segments (see the module documentation). A graph
/// that is one block segment is returned as that one segment, unchanged.
/// `split_projections` also cuts between an attention block and the GEMM
/// projections it reads, and between GEMMs that are not a chain. A segment
/// also starts at every node of `cuts` (the ends of a loop body,
/// [`crate::loops`]). In a model without attention, a block segment holds
/// independent GEMMs (which run side by side on tiles of their own) only
/// as far as their [`gemm_tile_demand`] fits `tiles`; with
/// `share_one_tile`, on one tile, up to [`SHARED_TILE_GEMMS`] of them that
/// each need at most a quarter of region 1 share it; without it, on one
/// tile, every GEMM of a chain has a segment of its own as well.
pub fn split(
    graph: &Graph,
    split_projections: bool,
    cuts: &BTreeSet<NodeId>,
    tiles: u32,
    share_one_tile: bool,
) -> Result<Vec<Segment>, CompileError> {
    let epilogues = epilogue_nodes(graph);
    let attention_free = !graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::SplitHeads { .. } | Op::Attention { .. }));
    let users = graph.all_users();
    let is_output = |v: ValueId| graph.outputs().contains(&v);
    // Node lists of the segments, in order.
    let mut parts: Vec<(Kind, Vec<NodeId>)> = Vec::new();
    // The segment that defines each value computed so far.
    let mut defined_in: BTreeMap<ValueId, usize> = BTreeMap::new();
    // Whether the current segment holds an attention block, a GEMM, a
    // chain (a GEMM reading a result of its own segment).
    let mut has_attention = false;
    let mut has_gemm = false;
    let mut has_chain = false;
    // Tiles that the current segment's GEMMs that do not continue a
    // chain need at least ([`gemm_tile_demand`]), and how many of them
    // there are.
    let mut tile_demand = 0u32;
    let mut independent = 0u32;
    for i in 0..graph.nodes().len() {
        let id = NodeId(i as u32);
        let node = graph.node(id);
        let kind = kind_of(graph, &epilogues, id);
        let current = parts.len().checked_sub(1);
        let here = |v: ValueId| current.is_some() && defined_in.get(&v) == current.as_ref();
        let continues_chain = matches!(node.op, Op::Gemm { .. }) && here(node.args[0]);
        let demand = if matches!(node.op, Op::Gemm { .. }) {
            gemm_tile_demand(graph, id)
        } else {
            0
        };
        let cut = match (current.map(|c| parts[c].0), kind) {
            (None, _) => true,
            // A transpose segment transposes values computed before it,
            // side by side: a transpose of one of its own results starts
            // the next.
            (Some(Kind::Transpose), Kind::Transpose) => here(node.args[0]),
            // A GEMM reads a computed B operand as a device input of its
            // segment (placed like a host input, moved there by the
            // join's exchange): a B computed in this segment ends it.
            (Some(Kind::Blocks), Kind::Blocks)
                if matches!(node.op, Op::Gemm { .. }) && here(node.args[1]) =>
            {
                true
            }
            // A GEMM reads its A operand from its own segment only as the
            // result of a GEMM group (a chain).
            // A segment lowers one attention block: a GEMM, `split_heads`
            // or attention after one starts the next segment (independent
            // attention blocks, such as a batched attention's per-sequence
            // blocks, over projections or over inputs).
            (Some(Kind::Blocks), Kind::Blocks)
                if has_attention
                    && matches!(node.op, Op::SplitHeads { .. } | Op::Attention { .. }) =>
            {
                true
            }
            // With `split_projections` an attention's projections end
            // their segment: the attention then reads q, k and v as device
            // inputs in a segment of its own, whose region 1 the
            // projections do not share (`compile`'s fallback when no
            // attention plan leaves the projections room).
            // Each projection, too (a GEMM that does not continue a chain
            // of its segment): a segment of one GEMM has all of region 1
            // and may stream K, where GEMMs side by side share it.
            (Some(Kind::Blocks), Kind::Blocks)
                if split_projections
                    && (matches!(node.op, Op::SplitHeads { .. }) && has_gemm
                        || matches!(node.op, Op::Gemm { .. }) && !here(node.args[0])) =>
            {
                true
            }
            // On one tile without sharing (`compile`'s retry when the
            // shared segment finds no plan or room), a GEMM that continues
            // a chain starts the next segment too: a chain keeps every
            // GEMM's buffers for the whole segment, each element-exclusive
            // one in whole memory elements, which a small two-GEMM chain
            // can overflow on one tile (random seed 531354: 46 x 70 x 340
            // then x 33) where each GEMM alone fits.
            (Some(Kind::Blocks), Kind::Blocks)
                if tiles == 1 && !share_one_tile && attention_free && continues_chain =>
            {
                true
            }
            // A GEMM that does not continue a chain of a segment that
            // holds one starts the next segment. A segment's chains are
            // planned on the same tiles, every GEMM with an equal share of
            // region 1 and its element-exclusive buffers in memory elements
            // of their own: four small chains side by side (a batched
            // GEMM's slices, each read by a GEMM with a batched B) found no
            // plan on any tile count. Each chain has all the tiles instead.
            (Some(Kind::Blocks), Kind::Blocks)
                if has_chain && matches!(node.op, Op::Gemm { .. }) && !continues_chain =>
            {
                true
            }
            // Independent GEMMs run side by side on tiles of their own,
            // each with all of region 1, when there are no more of them
            // than tiles; on shared tiles each has a share of region 1
            // and its element-exclusive buffers in elements of their own,
            // where six per-head projections on 3 tiles found no plan
            // (the staged order of `legalize` puts every head's
            // projections in one segment), and on too few tiles of its
            // own each finds none either (twelve 200 x 384 x 64
            // projections on 16 tiles). A GEMM that would take the
            // segment's GEMMs past the tiles they need starts the next.
            // On one tile, a segment per GEMM pays a join and a sync
            // each, where a few small GEMMs can share the tile in one
            // step (four slices of 9 x 14 x 5: 4,298 cycles shared, 4,820
            // in segments); `compile` retries without sharing when they
            // find no plan there.
            (Some(Kind::Blocks), Kind::Blocks)
                if attention_free
                    && matches!(node.op, Op::Gemm { .. })
                    && !continues_chain
                    && tile_demand > 0
                    && tile_demand + demand > tiles
                    && !(share_one_tile
                        && tiles == 1
                        && demand == 1
                        && tile_demand == independent
                        && independent < SHARED_TILE_GEMMS) =>
            {
                true
            }
            (Some(Kind::Blocks), Kind::Blocks) => {
                matches!(node.op, Op::Gemm { .. })
                    && (here(node.args[0])
                        && graph.def_node(node.args[0]).is_some_and(|d| {
                            !matches!(graph.node(d).op, Op::Gemm { .. })
                                && !epilogues.contains(&d)
                        })
                        // A segment lowers one attention block: a GEMM
                        // after one starts the next segment (independent
                        // attention blocks, such as a batched attention's
                        // per-sequence blocks).
                        || has_attention)
            }
            // A residual add reads both operands from one buffer, into which
            // only a segment input or a value read nowhere else is written.
            // A row-wise segment lowers rows of one count: a result with
            // other rows (the cast of a weight beside that of an activation,
            // `crate::widen`) starts the next.
            (Some(Kind::Rowwise), Kind::Rowwise) => {
                let rows = |v: ValueId| graph.ty(v).shape.dims().first().copied();
                let first = parts[current.expect("a current segment")].1[0];
                (matches!(node.op, Op::Add)
                    && node
                        .args
                        .iter()
                        .any(|&a| here(a) && (users[a.0 as usize].len() != 1 || is_output(a))))
                    || rows(node.result) != rows(graph.node(first).result)
            }
            // A segment lowers one kind of operation.
            _ => true,
        };
        let cut = cut || cuts.contains(&id);
        if cut {
            parts.push((kind, Vec::new()));
            has_attention = false;
            has_gemm = false;
            has_chain = false;
            tile_demand = 0;
            independent = 0;
        }
        if (cut || !continues_chain) && matches!(node.op, Op::Gemm { .. }) {
            tile_demand += demand;
            independent += 1;
        }
        has_attention |= matches!(node.op, Op::Attention { .. });
        has_gemm |= matches!(node.op, Op::Gemm { .. });
        has_chain |= continues_chain && !cut;
        let last = parts.len() - 1;
        parts[last].1.push(id);
        defined_in.insert(node.result, last);
    }
    if parts.len() == 1 && parts[0].0 == Kind::Blocks {
        return Ok(vec![Segment {
            kind: Kind::Blocks,
            graph: graph.clone(),
            device_inputs: Vec::new(),
            requantised: requantised_values(graph),
        }]);
    }
    let graph_err = |e: ipu_graph::GraphError| CompileError::Verifier {
        phase: "segment",
        message: e.to_string(),
    };
    let requantised = requantised_values(graph);
    let mut segments = Vec::new();
    for (si, (kind, nodes)) in parts.iter().enumerate() {
        let mut g = Graph::new(format!("{}.s{si}", graph.name()));
        let mut ids: BTreeMap<ValueId, ValueId> = BTreeMap::new();
        let mut device_inputs = Vec::new();
        for &n in nodes {
            let node = graph.node(n);
            let mut args = Vec::new();
            for &a in &node.args {
                if let Some(&id) = ids.get(&a) {
                    args.push(id);
                    continue;
                }
                let v = graph.value(a);
                let id = match v.def {
                    ValueDef::Param => g.add_param(&v.name, v.ty.clone()),
                    ValueDef::Input => g.add_input(&v.name, v.ty.clone()),
                    ValueDef::Node(_) => {
                        device_inputs.push(v.name.clone());
                        g.add_input(&v.name, v.ty.clone())
                    }
                }
                .map_err(graph_err)?;
                ids.insert(a, id);
                args.push(id);
            }
            let r = g
                .add_op(&graph.value(node.result).name, node.op.clone(), &args)
                .map_err(graph_err)?;
            ids.insert(node.result, r);
        }
        // Outputs: graph outputs and values later segments read.
        for &n in nodes {
            let r = graph.node(n).result;
            let read_later = users[r.0 as usize]
                .iter()
                .any(|u| defined_in[&graph.node(*u).result] != si);
            if is_output(r) || read_later {
                g.add_output(ids[&r]).map_err(graph_err)?;
            }
        }
        let requantised = g
            .outputs()
            .iter()
            .map(|&v| g.value(v).name.clone())
            .filter(|name| requantised.contains(name))
            .collect();
        segments.push(Segment {
            kind: *kind,
            graph: g,
            device_inputs,
            requantised,
        });
    }
    Ok(segments)
}

/// Remaps one segment's buffer indices (per tile) into the joined program.
struct Remap<'a> {
    offset: &'a BTreeMap<u32, usize>,
}

impl Remap<'_> {
    fn buffer(&self, tile: u32, b: usize) -> usize {
        self.offset.get(&tile).copied().unwrap_or(0) + b
    }
    fn placement(&self, p: &HostPlacement) -> HostPlacement {
        HostPlacement {
            buffer: self.buffer(p.tile, p.buffer),
            ..*p
        }
    }
    fn reference(&self, r: &BufferRef) -> BufferRef {
        BufferRef {
            buffer: self.buffer(r.tile, r.buffer),
            ..*r
        }
    }
    /// Whether every buffer index stays as it is (the first segment's).
    fn is_identity(&self) -> bool {
        self.offset.values().all(|&o| o == 0)
    }
    fn step(&self, mut s: Step) -> Step {
        // The first segment's steps (a one-segment model's whole program,
        // with its exchange tables) move unchanged.
        if self.is_identity() {
            return s;
        }
        for (&tile, vertices) in std::sync::Arc::make_mut(&mut s.tiles).iter_mut() {
            for v in vertices {
                for w in v.state.iter_mut() {
                    if let StateWord::Addr { buffer, .. } = w {
                        *buffer = self.buffer(tile, *buffer);
                    }
                }
            }
        }
        if let Some(x) = s.exchange.as_mut() {
            for t in std::sync::Arc::make_mut(&mut x.transfers).iter_mut() {
                t.source = self.reference(&t.source);
                for d in t.destinations.iter_mut() {
                    *d = self.reference(d);
                }
            }
            x.layout = std::sync::Arc::new(
                x.layout
                    .iter()
                    .map(|(&(tile, b), &span)| ((tile, self.buffer(tile, b)), span))
                    .collect(),
            );
            for (tile, b) in x.table_buffers.iter_mut() {
                *b = self.buffer(*tile, *b);
            }
        }
        s
    }
}

/// Bytes of one row of a tensor of type `ty` (its last dimension).
pub(crate) fn row_bytes(ty: &ipu_graph::TensorType) -> u64 {
    ty.shape.last().unwrap_or(1) as u64 * ty.dtype.size_bytes() as u64
}

/// The byte ranges `[start, end)` of each (tile, buffer) that `placements`
/// cover, sorted.
fn covered_ranges(placements: &[HostPlacement]) -> BTreeMap<(u32, usize), Vec<(u32, u32)>> {
    let mut ranges: BTreeMap<(u32, usize), Vec<(u32, u32)>> = BTreeMap::new();
    for p in placements {
        ranges
            .entry((p.tile, p.buffer))
            .or_default()
            .push((p.buffer_offset, p.buffer_offset + p.bytes));
    }
    for r in ranges.values_mut() {
        r.sort_unstable();
    }
    ranges
}

/// Whether no range of `ranges` overlaps `[start, end)`.
fn free(ranges: Option<&Vec<(u32, u32)>>, start: u32, end: u32) -> bool {
    ranges.is_none_or(|r| r.iter().all(|&(a, b)| b <= start || a >= end))
}

/// The transfers that move `tensor` from the producer's placements
/// (`from`) to the consumer's (`to`): every consumer byte range from the
/// producer ranges that cover it. A destination tile appears at most once
/// per transfer, so a second slot on one tile gets a transfer of its own.
///
/// `row_bytes` is the bytes of one row of the tensor (its last dimension).
/// When that is not a whole number of 4-byte words (an odd number of f16,
/// or fp8 rows of any width but multiples of four), a piece that ends a
/// row on both sides moves with the padding up to the next word: the
/// exchange moves whole words. That is done only where both buffers have
/// room for it, bytes that no other piece of the tensor holds there (the
/// rows' padding). Every lowering keeps its rows' padding lanes zero
/// (row-wise kernels compute sums of zeros there, GEMMs multiply zero
/// padding of B and add zero padding of the bias), so the consumer's
/// padding stays zero, as its kernels need.
pub(crate) fn transfers_between(
    name: &str,
    from: &[HostPlacement],
    to: &[HostPlacement],
    row_bytes: u64,
) -> Result<Vec<BufferTransfer>, CompileError> {
    let mut sources: Vec<&HostPlacement> = from.iter().collect();
    sources.sort_by_key(|p| p.host_offset);
    let odd_rows = row_bytes > 0 && !row_bytes.is_multiple_of(4);
    let (source_ranges, destination_ranges) = if odd_rows {
        (covered_ranges(from), covered_ranges(to))
    } else {
        Default::default()
    };
    // Per source piece (tile, buffer, offset, bytes): its destinations.
    let mut pieces: BTreeMap<(BufferRef, u32), Vec<BufferRef>> = BTreeMap::new();
    for d in to {
        let (start, end) = (d.host_offset, d.host_offset + d.bytes as u64);
        let mut covered = start;
        let first = sources.partition_point(|p| p.host_offset + (p.bytes as u64) <= start);
        for s in &sources[first..] {
            let (s0, s1) = (s.host_offset, s.host_offset + s.bytes as u64);
            if s0 >= end {
                break;
            }
            let (a, b) = (s0.max(covered), s1.min(end));
            if a >= b {
                continue;
            }
            if a != covered {
                break;
            }
            let (src_off, dst_off, mut bytes) = (
                s.buffer_offset + (a - s0) as u32,
                d.buffer_offset + (a - start) as u32,
                (b - a) as u32,
            );
            // A row's last piece on both sides moves with its padding to
            // the next word where both buffers hold padding there.
            if odd_rows && b % row_bytes == 0 && b == s1 && b == end && bytes % 4 != 0 {
                let padded = bytes.next_multiple_of(4);
                let room = |ranges: &BTreeMap<(u32, usize), Vec<(u32, u32)>>,
                            p: &HostPlacement,
                            off: u32| {
                    free(ranges.get(&(p.tile, p.buffer)), off + bytes, off + padded)
                };
                if room(&source_ranges, s, src_off) && room(&destination_ranges, d, dst_off) {
                    bytes = padded;
                }
            }
            if src_off % 4 != 0 || dst_off % 4 != 0 || bytes % 4 != 0 {
                // Rows that are not whole words, packed without padding
                // or split inside a word: a limit of this compiler, not a
                // bug.
                return Err(CompileError::Unsupported {
                    value: name.to_string(),
                    operation: "exchange".into(),
                    reason: format!(
                        "moving its bytes {a}..{b} from tile {} (offset {src_off}) to tile {} (offset {dst_off}) between segments: the exchange moves whole 4-byte words, and rows of {row_bytes} bytes cross segments only as whole rows into padded rows",
                        s.tile, d.tile
                    ),
                });
            }
            pieces
                .entry((
                    BufferRef {
                        tile: s.tile,
                        buffer: s.buffer,
                        offset: src_off,
                    },
                    bytes,
                ))
                .or_default()
                .push(BufferRef {
                    tile: d.tile,
                    buffer: d.buffer,
                    offset: dst_off,
                });
            covered = b;
        }
        if covered != end {
            return Err(CompileError::CodeGen {
                tile: d.tile,
                message: format!(
                    "`{name}` bytes {covered}..{end} are read here but no earlier segment placed them"
                ),
            });
        }
    }
    let mut out: Vec<BufferTransfer> = Vec::new();
    for ((source, bytes), mut destinations) in pieces {
        destinations.sort();
        // One destination per tile and transfer.
        while !destinations.is_empty() {
            let mut seen = BTreeSet::new();
            let (now, later): (Vec<BufferRef>, Vec<BufferRef>) =
                destinations.into_iter().partition(|d| seen.insert(d.tile));
            let t = BufferTransfer {
                source,
                destinations: now,
                bytes,
            };
            // Pieces are visited in source order: one that continues the
            // previous transfer's source run and every one of its
            // destination runs joins it, so a row-by-row layout on both
            // sides moves as one transfer (one descriptor per tile) instead
            // of one per row.
            match out.last_mut() {
                Some(last) if continues(last, &t) => last.bytes += t.bytes,
                _ => out.push(t),
            }
            destinations = later;
        }
    }
    Ok(out)
}

/// Whether `next` starts where `last` ends, at its source and at each of
/// its destinations (same tiles and buffers, in the same order).
fn continues(last: &BufferTransfer, next: &BufferTransfer) -> bool {
    let after = |r: &BufferRef, other: &BufferRef| {
        r.tile == other.tile && r.buffer == other.buffer && r.offset + last.bytes == other.offset
    };
    after(&last.source, &next.source)
        && last.destinations.len() == next.destinations.len()
        && last
            .destinations
            .iter()
            .zip(&next.destinations)
            .all(|(l, n)| after(l, n))
}

/// Whether every piece of `placements` starts and ends on a 4-byte word,
/// on the host side and in its buffer (what an exchange can move).
pub(crate) fn word_aligned(placements: &[HostPlacement]) -> bool {
    placements.iter().all(|p| {
        p.host_offset.is_multiple_of(4)
            && p.bytes.is_multiple_of(4)
            && p.buffer_offset.is_multiple_of(4)
    })
}

/// Whether `placements` hold every byte of a `total`-byte tensor exactly once.
fn single_copy(placements: &[HostPlacement], total: u64) -> bool {
    let mut runs: Vec<(u64, u64)> = placements
        .iter()
        .map(|p| (p.host_offset, p.host_offset + p.bytes as u64))
        .collect();
    runs.sort_unstable();
    let mut at = 0;
    for (start, end) in runs {
        if start != at {
            return false;
        }
        at = end;
    }
    at == total
}

/// What a home holds (its buffers' category): a parameter, written once by
/// the initialize call, or a host input, written by every run call. An
/// input that its readers hold more than once (a GEMM's A on every column
/// part's tiles) then crosses the host link once and is copied on the
/// device by exchange, which the run's device cycles count, instead of once
/// per copy over the 32 GB/s host link, which they would not.
#[derive(Clone, Copy)]
enum HomeOf {
    Param,
    Input,
}

/// A tensor's home: its bytes in equal 4-byte-aligned chunks over all
/// tiles (one persistent buffer per tile that holds some). The bytes are
/// laid out in the order of the copies the segment reads (`to`: each
/// destination buffer's pieces in buffer order, every host byte once), so
/// that a destination buffer is a few contiguous runs of the homes and its
/// exchange a few transfers, not one per weight row.
fn home(
    of: HomeOf,
    t: &HostTensor,
    to: &[HostPlacement],
    tile_count: u32,
    buffers: &mut BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
) -> Vec<HostPlacement> {
    let category = match of {
        HomeOf::Param => "param_home",
        HomeOf::Input => "input_home",
    };
    let total = t.ty.bytes();
    // The home order: host runs (offset, bytes) as the destinations hold
    // them, each host byte at its first appearance, then any byte no
    // destination reads, in host order.
    let mut order: Vec<&HostPlacement> = to.iter().collect();
    order.sort_by_key(|p| (p.tile, p.buffer, p.buffer_offset));
    let mut covered: BTreeMap<u64, u64> = BTreeMap::new();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut take = |start: u64, end: u64, runs: &mut Vec<(u64, u64)>| {
        // The parts of start..end no earlier run took.
        let mut at = start;
        let overlapping: Vec<(u64, u64)> = covered
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            if s > at {
                runs.push((at, s - at));
            }
            at = at.max(e);
        }
        if at < end {
            runs.push((at, end - at));
        }
        // Merge start..end into the covered set.
        let (mut s0, mut e0) = (start, end);
        let merged: Vec<u64> = covered
            .range(..=end)
            .filter(|(_, &e)| e >= start)
            .map(|(&s, _)| s)
            .collect();
        for s in merged {
            let e = covered.remove(&s).expect("listed above");
            s0 = s0.min(s);
            e0 = e0.max(e);
        }
        covered.insert(s0, e0);
    };
    for p in order {
        take(p.host_offset, p.host_offset + p.bytes as u64, &mut runs);
    }
    take(0, total, &mut runs);
    let chunk = total.div_ceil(tile_count as u64).div_ceil(4) * 4;
    let mut out = Vec::new();
    let mut runs = runs.into_iter();
    let mut pending: Option<(u64, u64)> = None;
    for tile in 0..tile_count {
        let start = tile as u64 * chunk;
        if start >= total {
            break;
        }
        let bytes = chunk.min(total - start) as u32;
        let bufs = buffers.get_mut(&tile).expect("tiles below tile_count");
        bufs.push(crate::lower::BufferSpec {
            name: format!("{}.home", t.name),
            bytes,
            align: 8,
            region: crate::lower::RegionReq::Any,
            exclusive_element: false,
            zero: vec![],
            category: category.into(),
            scratch: None,
            lifetime: None,
            kernel_segment: None,
        });
        let buffer = bufs.len() - 1;
        // Fill this chunk with the next runs, splitting one at its end.
        let mut filled = 0u32;
        while filled < bytes {
            let Some((h, n)) = pending.take().or_else(|| runs.next()) else {
                break;
            };
            let part = n.min((bytes - filled) as u64);
            out.push(HostPlacement {
                tile,
                buffer,
                buffer_offset: filled,
                host_offset: h,
                bytes: part as u32,
            });
            filled += part as u32;
            if part < n {
                pending = Some((h + part, n - part));
            }
        }
    }
    out
}

/// Which parameter copies [`join`] moves from one-copy homes at the start
/// of their segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamMoves {
    /// None: every copy is written by the host and stays.
    Resident,
    /// Interleaved copies that need no zeros at load (so that the
    /// segments' weight buffers share memory).
    Unzeroed,
    /// Every interleaved copy; those with zero padding stay persistent,
    /// their zeros from load time, and only their bytes move. A device
    /// loop's weights ([`crate::loops`]): its weight stacks then mirror
    /// the homes, one copy of each weight, not every replica.
    Interleaved,
}

/// Joins the segments' programs (each lowered with `tile_count` tiles) into
/// one, with an exchange step before each segment that moves its device
/// inputs from where earlier segments left them (and, per `stream_params`,
/// its GEMM weights from their one copy spread over all tiles, so that the
/// segments' weight buffers share memory; with
/// `input_homes`, its host inputs from their one copy: the first segment
/// that holds an input once is where the host writes it, and an input no
/// segment holds once gets a home spread over all tiles).
///
/// With `zero_fill` (the `fill64` kernel and its formula), a segment's
/// buffers that need zeros (padding a GEMM multiplies: a padded A, the
/// drain rows of an exchanged A) and that neither the host writes nor
/// another segment reads are zeroed by a fill step at the start of their
/// segment instead of holding their zeros from load time, so that they
/// share memory with the other segments' buffers like every other buffer
/// of a segment (without it they live for the whole program: expanded
/// iterations of a stack of MLP layers on a few tiles held every layer's
/// A buffers at once and overflowed region 1).
pub fn join(
    graph: &Graph,
    segments: &[Segment],
    parts: Vec<Lowered>,
    tile_count: u32,
    stream_params: ParamMoves,
    input_homes: bool,
    zero_fill: Option<&mut (crate::library::KernelRequest, crate::gemm::FormulaCost)>,
) -> Result<Lowered, CompileError> {
    let transposed_host: BTreeSet<String> = parts
        .iter()
        .flat_map(|p| p.transposed_host.iter().cloned())
        .collect();
    let mut buffers: BTreeMap<u32, Vec<crate::lower::BufferSpec>> =
        (0..tile_count).map(|t| (t, Vec::new())).collect();
    let mut init_steps = Vec::new();
    let mut run_steps: Vec<Step> = Vec::new();
    // The join's own exchange steps, scheduled together after the loop.
    let mut pending: Vec<exchange::PendingStep> = Vec::new();
    let mut params: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut inputs: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut outputs: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut resident: BTreeMap<String, HostTensor> = BTreeMap::new();
    // Where each value a segment exported is (joined buffer indices).
    let mut exported: BTreeMap<String, Vec<HostPlacement>> = BTreeMap::new();
    // (tile, buffer) that must stay persistent.
    let mut persistent: BTreeSet<(u32, usize)> = BTreeSet::new();
    // (tile, buffer) live for the whole of their segment (no scratch phase).
    let mut whole_segment: BTreeSet<(u32, usize)> = BTreeSet::new();
    // The segment of every buffer (None: added by the join).
    let mut segment_of: BTreeMap<(u32, usize), u32> = BTreeMap::new();
    // With `stream_params`, each parameter's one copy spread over all tiles.
    let mut homes: BTreeMap<String, Vec<HostPlacement>> = BTreeMap::new();
    // With `input_homes`, where the host writes each input (its one copy).
    let mut input_home_of: BTreeMap<String, Vec<HostPlacement>> = BTreeMap::new();
    // The segments that read each host input.
    let mut readers: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (si, part) in parts.iter().enumerate() {
        for t in part
            .io
            .get(1)
            .map(|(i, _)| i.as_slice())
            .unwrap_or_default()
        {
            readers.entry(t.name.clone()).or_default().push(si);
        }
    }
    let read_later =
        |name: &str, si: usize| readers.get(name).is_some_and(|r| r.iter().any(|&j| j > si));
    let mut phase_base = 0u32;
    let mut label = 0u32;
    let is_output = |name: &str| {
        graph
            .lookup(name)
            .is_some_and(|v| graph.outputs().contains(&v))
    };
    let mut segment_steps = Vec::new();
    for (si, (segment, part)) in segments.iter().zip(parts).enumerate() {
        let segment_start = run_steps.len();
        if part.tile_count != tile_count {
            return Err(CompileError::Verifier {
                phase: "segment",
                message: format!(
                    "segment {si} was lowered for {} tiles, the program has {tile_count}",
                    part.tile_count
                ),
            });
        }
        let offset: BTreeMap<u32, usize> = buffers.iter().map(|(&t, b)| (t, b.len())).collect();
        let remap = Remap { offset: &offset };
        let mut max_phase = 0;
        for (tile, bufs) in part.buffers {
            let joined = buffers.get_mut(&tile).expect("tiles below tile_count");
            for mut b in bufs {
                if let Some(p) = b.scratch.as_mut() {
                    max_phase = max_phase.max(*p);
                    *p += phase_base;
                }
                segment_of.insert((tile, joined.len()), si as u32);
                joined.push(b);
            }
        }
        // The segment's first scratch phase runs first: a buffer of it that
        // an exchange fills before the segment's first step keeps its phase.
        let first_phase = (max_phase > 0).then_some(phase_base + 1);
        let starts_segment = |buffers: &BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
                              p: &HostPlacement| {
            first_phase.is_some() && buffers[&p.tile][p.buffer].scratch == first_phase
        };
        // Moves `to`'s bytes from `from` in the segment's exchange step;
        // `to`'s buffers then live for the whole segment (unless they are
        // of its first scratch phase, which is live from its start anyway).
        let fill_before_segment = |transfers: &mut Vec<BufferTransfer>,
                                   whole_segment: &mut BTreeSet<(u32, usize)>,
                                   buffers: &BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
                                   name: &str,
                                   row_bytes: u64,
                                   from: &[HostPlacement],
                                   to: &[HostPlacement]|
         -> Result<(), CompileError> {
            transfers.extend(transfers_between(name, from, to, row_bytes)?);
            whole_segment.extend(
                to.iter()
                    .filter(|p| !starts_segment(buffers, p))
                    .map(|p| (p.tile, p.buffer)),
            );
            Ok(())
        };
        phase_base += max_phase + 1;
        let (seg_params, seg_inputs, seg_outputs) = {
            let mut calls = part.io.into_iter();
            let (p, _) = calls.next().unwrap_or_default();
            let (i, o) = calls.next().unwrap_or_default();
            (p, i, o)
        };
        // The device inputs' exchange step, before the segment's steps.
        let mut transfers = Vec::new();
        let mut homed = Vec::new();
        for t in seg_inputs {
            let placements: Vec<HostPlacement> =
                t.placements.iter().map(|p| remap.placement(p)).collect();
            if segment.device_inputs.contains(&t.name) {
                let from = exported
                    .get(&t.name)
                    .ok_or_else(|| CompileError::Verifier {
                        phase: "segment",
                        message: format!(
                            "segment {si} reads `{}`, which no earlier segment exported",
                            t.name
                        ),
                    })?;
                fill_before_segment(
                    &mut transfers,
                    &mut whole_segment,
                    &buffers,
                    &t.name,
                    row_bytes(&t.ty),
                    from,
                    &placements,
                )?;
                continue;
            }
            // The exchange moves whole words: an input whose pieces start
            // or end inside a word (rows of an odd number of f16, such as
            // K = 65) cannot be copied from a home, so the host writes
            // every copy of it, as under `HostInputs::Replicated`.
            let copyable = word_aligned(&placements)
                && input_home_of.get(&t.name).is_none_or(|h| word_aligned(h));
            if input_homes && copyable {
                // The input's first single copy is its home (the host
                // writes it there, and later readers copy it by exchange);
                // an input that no segment holds once gets a home of its
                // own spread over all tiles.
                let home = match input_home_of.get(&t.name) {
                    Some(home) => Some(home.clone()),
                    None if !single_copy(&placements, t.ty.bytes()) => {
                        let home = home(HomeOf::Input, &t, &placements, tile_count, &mut buffers);
                        HostTensors::place(&mut inputs, &t, home.iter().cloned());
                        input_home_of.insert(t.name.clone(), home.clone());
                        Some(home)
                    }
                    None => None,
                };
                if let Some(home) = home {
                    fill_before_segment(
                        &mut transfers,
                        &mut whole_segment,
                        &buffers,
                        &t.name,
                        row_bytes(&t.ty),
                        &home,
                        &placements,
                    )?;
                    homed.push(t.name.clone());
                    continue;
                }
                // Written at the start of the run: it outlives the earlier
                // segments' phases, and the later segments that read it.
                if si > 0 || read_later(&t.name, si) {
                    persistent.extend(placements.iter().map(|p| (p.tile, p.buffer)));
                }
                input_home_of.insert(t.name.clone(), placements.clone());
                HostTensors::place(&mut inputs, &t, placements);
                continue;
            }
            // A host input a later segment reads is written at the start of
            // the run, so it must outlive the earlier segments' phases.
            if si > 0 {
                persistent.extend(placements.iter().map(|p| (p.tile, p.buffer)));
            }
            HostTensors::place(&mut inputs, &t, placements);
        }
        let mut streamed = Vec::new();
        for t in seg_params {
            // Written once, by the initialize call.
            let mut placements: Vec<HostPlacement> =
                t.placements.iter().map(|p| remap.placement(p)).collect();
            if stream_params != ParamMoves::Resident {
                // Interleaved copies (that need no zeros at load, unless
                // every interleaved copy moves) come from the parameter's
                // home by exchange at the start of the segment.
                let (moved, kept): (Vec<HostPlacement>, Vec<HostPlacement>) =
                    placements.into_iter().partition(|p| {
                        let b = &buffers[&p.tile][p.buffer];
                        b.region == crate::lower::RegionReq::Interleaved
                            && (b.zero.is_empty() || stream_params == ParamMoves::Interleaved)
                    });
                placements = kept;
                if !moved.is_empty() {
                    let home = homes.entry(t.name.clone()).or_insert_with(|| {
                        home(HomeOf::Param, &t, &moved, tile_count, &mut buffers)
                    });
                    fill_before_segment(
                        &mut transfers,
                        &mut whole_segment,
                        &buffers,
                        &t.name,
                        row_bytes(&t.ty),
                        home,
                        &moved,
                    )?;
                    streamed.push(t.name.clone());
                }
            }
            persistent.extend(placements.iter().map(|p| (p.tile, p.buffer)));
            HostTensors::place(&mut params, &t, placements);
        }
        if !transfers.is_empty() {
            let names = segment
                .device_inputs
                .iter()
                .chain(&homed)
                .chain(&streamed)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let first = segment
                .graph
                .nodes()
                .first()
                .map(|n| segment.graph.value(n.result).name.clone())
                .unwrap_or_default();
            // Scheduled after the loop, all of the join's steps side by
            // side (the GPT-2 block's two largest take ~0.35 s each).
            let (step, p) = exchange::pending_step(
                tile_count,
                transfers,
                label,
                &mut buffers,
                first,
                format!("exchange {names} -> segment {si}"),
                run_steps.len(),
            );
            run_steps.push(step);
            pending.push(p);
            label += 1;
        }
        for call in part.calls {
            let steps = call.steps.into_iter().map(|s| remap.step(s));
            if call.name == "initialize" {
                init_steps.extend(steps);
            } else {
                for s in steps {
                    if s.exchange.is_some() {
                        label += 1;
                    }
                    run_steps.push(s);
                }
            }
        }
        for t in seg_outputs {
            let placements: Vec<HostPlacement> =
                t.placements.iter().map(|p| remap.placement(p)).collect();
            persistent.extend(placements.iter().map(|p| (p.tile, p.buffer)));
            exported.insert(t.name.clone(), placements.clone());
            let target = if is_output(&t.name) {
                &mut outputs
            } else {
                &mut resident
            };
            target.insert(t.name.clone(), HostTensor { placements, ..t });
        }
        for t in part.resident {
            let placements = t.placements.iter().map(|p| remap.placement(p)).collect();
            resident.insert(t.name.clone(), HostTensor { placements, ..t });
        }
        segment_steps.push(segment_start..run_steps.len());
    }
    // Before the zero fills, which insert steps.
    exchange::schedule_pending(pending, &mut run_steps, &mut buffers)?;
    if let Some(fill) = zero_fill {
        let host_written: BTreeSet<(u32, usize)> = params
            .values()
            .chain(inputs.values())
            .chain(outputs.values())
            .chain(resident.values())
            .flat_map(|t| t.placements.iter().map(|p| (p.tile, p.buffer)))
            .chain(homes.values().flatten().map(|p| (p.tile, p.buffer)))
            .collect();
        let mut fills: BTreeMap<u32, BTreeMap<u32, Vec<FillJob>>> = BTreeMap::new();
        for (&tile, bufs) in buffers.iter_mut() {
            for (i, b) in bufs.iter_mut().enumerate() {
                let key = (tile, i);
                let Some(&si) = segment_of.get(&key) else {
                    continue;
                };
                let items = whole_items(&b.zero, b.bytes);
                let refillable = !b.zero.is_empty()
                    && b.scratch.is_none()
                    && b.align >= 8
                    && b.category != exchange::TABLE_CATEGORY
                    && !persistent.contains(&key)
                    && !host_written.contains(&key)
                    && items.is_some();
                if refillable {
                    let ranges = fills.entry(si).or_default().entry(tile).or_default();
                    b.zero.clear();
                    ranges.extend(
                        items
                            .expect("checked")
                            .into_iter()
                            .map(|(a, z)| (i, a, z - a, 0, 0)),
                    );
                }
            }
        }
        // Each segment's fill step goes before its first step (its
        // device inputs' exchange writes around the zeros it sets), the
        // later segments' steps one further on.
        for (&si, tiles) in fills.iter().rev() {
            let step = zero_fill_step(fill, si, tiles);
            let at = segment_steps[si as usize].start;
            run_steps.insert(at, step);
            segment_steps[si as usize].end += 1;
            for r in &mut segment_steps[si as usize + 1..] {
                *r = r.start + 1..r.end + 1;
            }
        }
    }
    // Lifetimes: persistent buffers and those that must be zero at load
    // live for the whole program; every other buffer of a segment lives
    // only while it runs, so segments share memory, in region 0 as in
    // region 1. Exchange tables are image contents: they stay
    // (`link::tile_image` refuses contents for a buffer that does not).
    for (&tile, bufs) in buffers.iter_mut() {
        for (i, b) in bufs.iter_mut().enumerate() {
            let key = (tile, i);
            let Some(&si) = segment_of.get(&key) else {
                continue;
            };
            let shared = b.category != exchange::TABLE_CATEGORY;
            b.kernel_segment = Some(si);
            if persistent.contains(&key) || !b.zero.is_empty() || !shared {
                b.scratch = None;
                b.lifetime = None;
            } else {
                if whole_segment.contains(&key) {
                    b.scratch = None;
                }
                b.lifetime = Some(si);
            }
        }
    }
    // Table buffers are named after their step's position in the run.
    let mut n = 0;
    for s in &run_steps {
        if let Some(x) = &s.exchange {
            for (&tile, &b) in &x.table_buffers {
                buffers.get_mut(&tile).expect("tiles below tile_count")[b].name =
                    format!("xtab{n}");
            }
            n += 1;
        }
    }
    for (name, home) in homes {
        params
            .get_mut(&name)
            .expect("a streamed parameter has its tensor")
            .placements
            .extend(home);
    }
    let mut joined = Lowered::two_calls(
        graph,
        tile_count,
        buffers,
        (init_steps, run_steps),
        HostTensors {
            params,
            inputs,
            outputs,
            resident,
        },
    );
    // Host tensors a part placed transposed (attention over inputs) stay
    // so: the join copies bytes by their host offsets, which follow the
    // same order on both sides.
    joined.transposed_host = transposed_host;
    joined.segment_steps = segment_steps;
    Ok(joined)
}

/// The zero ranges `zero` of a buffer of `bytes` widened to whole 8-byte
/// items (what `fill64` stores), merged where they meet; `None` when an
/// item would pass the buffer's end. Widening is sound for the buffers
/// [`join`] refills: the fill runs before every other step of their
/// segment, and such a buffer holds nothing from before the segment (it
/// shares memory with the other segments' buffers), so every byte of it
/// that the segment reads and that is not padding is written after the
/// fill. A K^T of 445 keys, rows padded to 448, has 6 bytes of padding
/// after each row's 890.
fn whole_items(zero: &[(u32, u32)], bytes: u32) -> Option<Vec<(u32, u32)>> {
    let mut items: Vec<(u32, u32)> = zero
        .iter()
        .filter(|(a, z)| a < z)
        .map(|&(a, z)| (a / 8 * 8, z.div_ceil(8) * 8))
        .collect();
    if items.iter().any(|&(_, z)| z > bytes) {
        return None;
    }
    items.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(items.len());
    for (a, z) in items {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(z),
            _ => merged.push((a, z)),
        }
    }
    Some(merged)
}

/// The step that zeroes segment `si`'s refilled ranges (see [`join`]):
/// on each tile the ranges' 8-byte items cut into at most six `fill64`
/// vertices of near-equal items (`attention::fill_vertices`).
fn zero_fill_step(
    fill: &mut (crate::library::KernelRequest, crate::gemm::FormulaCost),
    si: u32,
    tiles: &BTreeMap<u32, Vec<FillJob>>,
) -> Step {
    let mut step = Step {
        tile_cycles: Default::default(),
        operation: format!("segment {si}"),
        phase: format!("zero segment {si}'s padding"),
        tiles: Default::default(),
        estimated_cycles: 0,
        exchange: None,
        host_stop: false,
        launch: crate::lower::Launch::FirstOfCall,
    };
    for (&tile, jobs) in tiles {
        let (states, slowest) = crate::attention::fill_vertices(jobs, &mut fill.1);
        let cycles = slowest + crate::plan::supervisor_cycles(states.len() as u64);
        let vertices = states
            .into_iter()
            .map(|state| crate::lower::Vertex {
                kernel: std::sync::Arc::new(fill.0.clone()),
                state,
            })
            .collect();
        step.put_tile(tile, vertices, cycles);
    }
    step
}

/// Whether the run call of `l` holds some host input more than once (or
/// not whole), so that writing it once needs a join.
pub fn holds_an_input_twice(l: &Lowered) -> bool {
    l.io.get(1).is_some_and(|(inputs, _)| {
        inputs
            .iter()
            .any(|t| !single_copy(&t.placements, t.ty.bytes()))
    })
}

/// Code and vertex-state bytes assumed per tile when checking whether a
/// joined program fits before it is linked (the SigLIP attention's tiles
/// link about 20 KiB).
const CODE_ALLOWANCE: u32 = 40 * 1024;

/// A tile on which the segments' weights cannot all stay resident, found
/// without joining: `(tile, needed, available)` interleaved bytes, where
/// `needed` is a lower bound on what a join with resident weights would
/// place in region 1 there: every segment's weights (they live for the
/// whole program), plus the largest that any one segment holds at once
/// besides its weights (its persistent interleaved buffers and its largest
/// scratch phase; element rounding and values that outlive a segment are
/// left out, so the bound never exceeds what the join would need). A join
/// schedules every exchange step before `first_overflow` can tell, so a
/// model whose weights cannot fit skips that join (the ViT block's took
/// about half of its join phase).
pub fn resident_weights_exceed(parts: &[Lowered]) -> Option<(u32, u64, u64)> {
    let available = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
    let (weights, working, _) = resident_region1(parts);
    weights
        .iter()
        .map(|(&tile, &w)| (tile, w + working.get(&tile).copied().unwrap_or(0)))
        .find(|&(_, needed)| needed > available)
        .map(|(tile, needed)| (tile, needed, available))
}

/// Per tile, the region-1 bytes of the segments' weights (interleaved
/// parameter buffers) and of the largest segment's other buffers (its
/// persistent ones and its largest scratch phase); and per (weight, tile)
/// its bytes: what [`resident_weights_exceed`] and
/// [`resident_weight_caps`] weigh.
#[allow(clippy::type_complexity)]
fn resident_region1(
    parts: &[Lowered],
) -> (
    BTreeMap<u32, u64>,
    BTreeMap<u32, u64>,
    BTreeMap<(String, u32), u64>,
) {
    use crate::lower::RegionReq;
    let mut weights: BTreeMap<u32, u64> = BTreeMap::new();
    let mut working: BTreeMap<u32, u64> = BTreeMap::new();
    let mut per_weight: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for part in parts {
        let params: BTreeMap<(u32, usize), &str> = part.io[0]
            .0
            .iter()
            .flat_map(|t| {
                t.placements
                    .iter()
                    .map(|p| ((p.tile, p.buffer), t.name.as_str()))
            })
            .collect();
        for (&tile, bufs) in &part.buffers {
            let mut persistent = 0u64;
            let mut phases: BTreeMap<u32, u64> = BTreeMap::new();
            for (i, b) in bufs.iter().enumerate() {
                if b.region != RegionReq::Interleaved {
                    continue;
                }
                if let Some(name) = params.get(&(tile, i)) {
                    *weights.entry(tile).or_default() += b.bytes as u64;
                    *per_weight.entry((name.to_string(), tile)).or_default() += b.bytes as u64;
                } else if let Some(phase) = b.scratch {
                    *phases.entry(phase).or_default() += b.bytes as u64;
                } else {
                    persistent += b.bytes as u64;
                }
            }
            let held = persistent + phases.values().copied().max().unwrap_or(0);
            let w = working.entry(tile).or_default();
            *w = (*w).max(held);
        }
    }
    (weights, working, per_weight)
}

/// Caps on each weight's resident bytes per tile for plans that weigh
/// only A's join (`lower_segments`), from plans whose weights fit
/// resident (`parts`): each weight's largest bytes on a tile, scaled by
/// the room those plans leave (region 1 less the largest working set,
/// over the weights, on the tightest tile), so that plans within the caps
/// keep the weights' sum within what that working set left.
pub fn resident_weight_caps(parts: &[Lowered]) -> BTreeMap<String, u64> {
    let available = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
    let (weights, working, per_weight) = resident_region1(parts);
    let scale = weights
        .iter()
        .filter(|&(_, &w)| w > 0)
        .map(|(tile, &w)| {
            let room = available.saturating_sub(working.get(tile).copied().unwrap_or(0));
            room as f64 / w as f64
        })
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let mut caps: BTreeMap<String, u64> = BTreeMap::new();
    for ((name, _), bytes) in per_weight {
        let cap = caps.entry(name).or_default();
        *cap = (*cap).max((bytes as f64 * scale) as u64);
    }
    caps
}

/// The first tile whose buffers do not fit (with [`CODE_ALLOWANCE`] of
/// code), as the storage error.
pub fn first_overflow(l: &Lowered) -> Option<CompileError> {
    l.buffers
        .iter()
        .find_map(|(&tile, bufs)| crate::storage::place(tile, bufs, CODE_ALLOWANCE).err())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zero ranges widen to the whole 8-byte items that hold them, merge
    /// where they meet, and cover every byte of the ranges and nothing
    /// past the buffer; a range whose item would pass the end refuses.
    #[test]
    fn zero_ranges_widen_to_whole_items_inside_the_buffer() {
        assert_eq!(
            whole_items(&[(890, 896), (1786, 1792)], 1792),
            Some(vec![(888, 896), (1784, 1792)])
        );
        assert_eq!(
            whole_items(&[(2, 4), (6, 10), (24, 24)], 16),
            Some(vec![(0, 16)])
        );
        assert_eq!(whole_items(&[(8, 13)], 13), None);
        let mut rng = ipu_rng::SplitMix64(62);
        for _ in 0..500 {
            let bytes = 8 * (1 + rng.next_u64() % 40) as u32;
            let zero: Vec<(u32, u32)> = (0..rng.next_u64() % 6)
                .map(|_| {
                    let a = (rng.next_u64() % bytes as u64) as u32;
                    (a, a + (rng.next_u64() % (bytes - a) as u64 + 1) as u32)
                })
                .collect();
            let items = whole_items(&zero, bytes).expect("ends inside a whole-item buffer");
            for w in items.windows(2) {
                assert!(w[0].1 < w[1].0, "{items:?}");
            }
            for &(a, z) in &items {
                assert!(a % 8 == 0 && z % 8 == 0 && a < z && z <= bytes, "{items:?}");
            }
            for &(a, z) in &zero {
                for x in a..z {
                    assert!(
                        items.iter().any(|&(ia, iz)| ia <= x && x < iz),
                        "{x} of {zero:?}"
                    );
                }
            }
        }
    }

    /// The step that zeroes a segment's padding: every 8-byte item of
    /// every range once, in at most six vertices per tile whose items
    /// differ by at most one vertex's share, with the fill kernel's
    /// formula for the slowest.
    #[test]
    fn zero_fill_steps_cover_every_item_once_in_six_vertices() {
        let mut fill = (
            crate::fill64_request(),
            crate::gemm::FormulaCost::new("6 * (3 + 8 * N + COUNT)".into()),
        );
        let mut rng = ipu_rng::SplitMix64(41);
        for _ in 0..200 {
            let mut tiles: BTreeMap<u32, Vec<FillJob>> = BTreeMap::new();
            for tile in 0..(1 + rng.next_u64() % 4) as u32 {
                let ranges = (0..1 + rng.next_u64() % 5)
                    .map(|i| {
                        let a = 8 * (rng.next_u64() % 50) as u32;
                        (i as usize, a, 8 * (1 + rng.next_u64() % 700) as u32, 0, 0)
                    })
                    .collect();
                tiles.insert(tile, ranges);
            }
            let step = zero_fill_step(&mut fill, 3, &tiles);
            assert!(step.phase.contains("segment 3"));
            for (tile, ranges) in &tiles {
                let vertices = &step.tiles[tile];
                assert!(!vertices.is_empty() && vertices.len() <= 6);
                let mut items: BTreeMap<(usize, u32), u32> = BTreeMap::new();
                let mut counts = Vec::new();
                for v in vertices {
                    let StateWord::Const(n) = v.state[0] else {
                        panic!("N first")
                    };
                    assert_eq!(v.state.len(), 1 + 4 * n as usize);
                    let mut count = 0;
                    for r in v.state[1..].chunks(4) {
                        let (StateWord::Addr { buffer, offset }, StateWord::Const(c)) =
                            (&r[0], &r[1])
                        else {
                            panic!("ADDR, COUNT")
                        };
                        assert_eq!((&r[2], &r[3]), (&StateWord::Const(0), &StateWord::Const(0)));
                        for j in 0..*c {
                            *items.entry((*buffer, offset + 8 * j)).or_default() += 1;
                        }
                        count += c;
                    }
                    counts.push(count);
                }
                let mut want: BTreeMap<(usize, u32), u32> = BTreeMap::new();
                for &(b, a, bytes, _, _) in ranges {
                    for at in (a..a + bytes).step_by(8) {
                        *want.entry((b, at)).or_default() += 1;
                    }
                }
                assert_eq!(items, want, "tile {tile}: every item once");
                let per = counts.iter().max().unwrap();
                assert!(counts[..counts.len() - 1].iter().all(|c| c == per));
            }
            assert!(step.estimated_cycles > 0 && step.exchange.is_none());
        }
    }

    /// Re-quantised values: read only by casts to fp8, and not outputs.
    /// The fp8 MLP's GELU output is one (its only reader casts it to
    /// fp8<-2>); a value also read by another operation, an input, or an
    /// output is not; the segment of the GELU's GEMM group carries the name.
    #[test]
    fn requantised_values_are_read_only_by_casts_to_fp8() {
        let text = "model m\ninput x: f16[4, 32]\nparam w1: fp8[32, 16]\nparam w2: fp8[16, 32]\n\
            x8 = cast(x, to=fp8)\nh = gemm(x8, w1)\ng = gelu(h)\ng8 = cast(g, to=fp8<-2>)\n\
            o = gemm(g8, w2)\no16 = gelu(o)\nt = cast(o16, to=fp8)\nu = gelu(o16)\n\
            output t\noutput u\n";
        let graph = ipu_graph::parse("m.ipug", text).unwrap();
        let names: Vec<String> = requantised_values(&graph).into_iter().collect();
        assert_eq!(names, ["g"]);
        let segments = split(&graph, false, &BTreeSet::new(), u32::MAX, false).unwrap();
        let carrying: Vec<Vec<String>> = segments
            .iter()
            .map(|s| s.requantised.iter().cloned().collect())
            .collect();
        assert!(
            carrying.iter().any(|r| r == &["g".to_string()]),
            "the segment that computes g names it: {carrying:?}"
        );
    }

    /// `single_copy` decides which inputs get a home: only placements that
    /// hold every byte exactly once are left where the host writes them.
    #[test]
    fn single_copy_means_every_byte_once() {
        let at = |tile: u32, host_offset: u64, bytes: u32| HostPlacement {
            tile,
            buffer: 0,
            buffer_offset: 0,
            host_offset,
            bytes,
        };
        assert!(single_copy(&[at(1, 8, 8), at(0, 0, 8)], 16));
        // A row on two tiles, a gap, a tensor not covered to its end.
        assert!(!single_copy(&[at(0, 0, 8), at(1, 0, 8), at(2, 8, 8)], 16));
        assert!(!single_copy(&[at(0, 0, 8), at(1, 12, 4)], 16));
        assert!(!single_copy(&[at(0, 0, 8)], 16));
        assert!(!single_copy(&[at(0, 0, 12), at(1, 8, 8)], 16));
    }

    /// A weight [8, 12] f16 read by two row parts (tiles 0-1 and 2-3) as
    /// two column shards each (8 and 4 columns, one piece per weight row):
    /// its home holds every byte once, the homes are balanced, and the
    /// moves into the shards coalesce into a few transfers per shard
    /// instead of one per row, each delivering to both row parts.
    #[test]
    fn a_weight_home_follows_its_readers_and_moves_in_few_transfers() {
        let (rows, cols) = (8u32, 12u32);
        let t = HostTensor {
            name: "w".into(),
            ty: ipu_graph::TensorType::new(ipu_graph::DType::F16, [rows as usize, cols as usize]),
            placements: vec![],
        };
        let mut to = Vec::new();
        for (tile, c0, width) in [(0, 0, 8), (1, 8, 4), (2, 0, 8), (3, 8, 4)] {
            for r in 0..rows {
                to.push(HostPlacement {
                    tile,
                    buffer: 0,
                    buffer_offset: r * width * 2,
                    host_offset: ((r * cols + c0) * 2) as u64,
                    bytes: width * 2,
                });
            }
        }
        let tiles = 4;
        let mut buffers: BTreeMap<u32, Vec<crate::lower::BufferSpec>> =
            (0..tiles).map(|t| (t, Vec::new())).collect();
        let home = home(HomeOf::Param, &t, &to, tiles, &mut buffers);
        let mut bytes = vec![0u32; (rows * cols * 2) as usize];
        for p in &home {
            for b in p.host_offset..p.host_offset + p.bytes as u64 {
                bytes[b as usize] += 1;
            }
        }
        assert!(bytes.iter().all(|&n| n == 1), "{home:?}");
        let sizes: Vec<u32> = (0..tiles).map(|t| buffers[&t][0].bytes).collect();
        assert_eq!(sizes, vec![48; 4]);
        let transfers = transfers_between("w", &home, &to, 0).unwrap();
        // 192 bytes in 48-byte homes: the 128-byte shard comes from three
        // homes, the 64-byte one from two (home 2 holds the end of the
        // first and the start of the second): 5 transfers where rows
        // would take 16.
        assert_eq!(transfers.len(), 5, "{transfers:?}");
        assert!(transfers.iter().all(|t| t.destinations.len() == 2));
        let delivered: u32 = transfers.iter().map(|t| t.bytes).sum();
        assert_eq!(delivered, rows * cols * 2);
    }

    fn kinds(text: &str) -> Vec<(Kind, Vec<String>, Vec<String>)> {
        let g = ipu_graph::parse("t.ipug", text).unwrap();
        split(&g, false, &BTreeSet::new(), u32::MAX, false)
            .unwrap()
            .into_iter()
            .map(|s| {
                let names = s
                    .graph
                    .nodes()
                    .iter()
                    .map(|n| s.graph.value(n.result).name.clone())
                    .collect();
                (s.kind, names, s.device_inputs)
            })
            .collect()
    }

    /// `compile`'s fallback for an attention whose plans leave its
    /// projections no room: each projection and the attention get a
    /// segment of their own, the attention reading q, k and v as device
    /// inputs.
    #[test]
    fn split_projections_gives_each_projection_and_the_attention_a_segment() {
        let text = std::fs::read_to_string(
            std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
                .join("../../models/attention_small.ipug"),
        )
        .unwrap();
        let g = ipu_graph::parse("t.ipug", &text).unwrap();
        assert_eq!(
            split(&g, false, &BTreeSet::new(), u32::MAX, false)
                .unwrap()
                .len(),
            1
        );
        let summary: Vec<String> = split(&g, true, &BTreeSet::new(), u32::MAX, false)
            .unwrap()
            .iter()
            .map(|s| {
                let names: Vec<String> = s
                    .graph
                    .nodes()
                    .iter()
                    .map(|n| s.graph.value(n.result).name.clone())
                    .collect();
                format!(
                    "{:?} {} <- [{}]",
                    s.kind,
                    names.join(" "),
                    s.device_inputs.join(" ")
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                "Blocks q <- []",
                "Blocks k <- []",
                "Blocks v <- []",
                "Blocks qh kh vh o y <- [q k v]",
            ]
        );
    }

    #[test]
    fn a_vit_block_splits_at_the_row_wise_operations_and_after_attention() {
        let text = std::fs::read_to_string(
            std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
                .join("../../models/vit_block_small.ipug"),
        )
        .unwrap();
        let s = kinds(&text);
        let summary: Vec<String> = s
            .iter()
            .map(|(k, names, dev)| format!("{k:?} {} <- [{}]", names.join(" "), dev.join(" ")))
            .collect();
        assert_eq!(
            summary,
            [
                "Rowwise n1 <- []",
                "Blocks q0 q k0 k v0 v qh kh vh oh o <- [n1]",
                "Blocks p0 p <- [o]",
                "Rowwise h n2 <- [p]",
                "Blocks m0 m1 m2 m3 m <- [n2]",
                "Rowwise y <- [h m]",
            ],
        );
    }

    #[test]
    fn cuts_before_a_residual_add_of_a_value_read_elsewhere_and_after_casts() {
        // `n` is read by the add and is an output: the add starts a segment
        // of its own, reading `n` as a device input.
        let s = kinds("model m\ninput x: f16[4, 8]\nparam g: f16[8]\nparam b: f16[8]\nn = layernorm(x, g, b)\nh = add(n, x)\noutput n, h\n");
        let summary: Vec<String> = s
            .iter()
            .map(|(k, names, dev)| format!("{k:?} {} <- [{}]", names.join(" "), dev.join(" ")))
            .collect();
        assert_eq!(summary, ["Rowwise n <- []", "Rowwise h <- [n]"]);
        // A cast is row-wise; the fp8 GEMM after it reads its result.
        let s = kinds("model m\ninput x: f16[4, 64]\nparam w: fp8[64, 32]\nx8 = cast(x, to=fp8)\nh = gemm(x8, w)\noutput h\n");
        let kinds: Vec<Kind> = s.iter().map(|k| k.0).collect();
        assert_eq!(kinds, [Kind::Rowwise, Kind::Blocks]);
        assert_eq!(s[1].2, ["x8"]);
    }

    /// Independent chains each take a segment (a chain's GEMMs share its
    /// tiles; several chains on the same tiles found no plan), while
    /// independent GEMMs that chain nothing stay side by side in one.
    #[test]
    fn independent_chains_take_segments_of_their_own() {
        let s = kinds("model m\ninput a0: f16[4, 8]\ninput a1: f16[4, 8]\nparam b: f16[8, 8]\nparam e: f16[8, 8]\nparam f: f16[8, 8]\nc0 = gemm(a0, b)\nd0 = gemm(c0, e)\nc1 = gemm(a1, b)\nd1 = gemm(c1, e)\nx = gemm(a1, f)\noutput d0, d1, x\n");
        let names: Vec<Vec<String>> = s.iter().map(|k| k.1.clone()).collect();
        assert_eq!(names, [vec!["c0", "d0"], vec!["c1", "d1"], vec!["x"]]);
        let s = kinds("model m\ninput a0: f16[4, 8]\ninput a1: f16[4, 8]\nparam b: f16[8, 8]\nc0 = gemm(a0, b)\nc1 = gemm(a1, b)\noutput c0, c1\n");
        assert_eq!(s.len(), 1);
    }

    /// A GEMM whose B is computed reads it as a device input of a segment
    /// that starts with it (`y`, beside which the independent `z` runs on
    /// tiles of its own); device transposes of values computed earlier
    /// share a segment, a transpose of one of them starts another.
    #[test]
    fn computed_b_operands_and_transposes_take_segments_of_their_own() {
        let s = kinds("model m\ninput x: f16[8, 8]\nparam w: f16[8, 8]\nparam u: f16[8, 8]\nh = gemm(x, w)\ny = gemm(x, h)\nz = gemm(x, u)\ng = transpose(h)\nt = transpose(z)\ntt = transpose(t)\noutput y, g, tt\n");
        let got: Vec<(Kind, Vec<String>)> = s.iter().map(|k| (k.0, k.1.clone())).collect();
        let want: Vec<(Kind, Vec<String>)> = [
            (Kind::Blocks, vec!["h"]),
            (Kind::Blocks, vec!["y", "z"]),
            (Kind::Transpose, vec!["g", "t"]),
            (Kind::Transpose, vec!["tt"]),
        ]
        .into_iter()
        .map(|(k, n)| (k, n.into_iter().map(String::from).collect()))
        .collect();
        assert_eq!(got, want);
    }

    /// A materialised attention written per head is five segments
    /// whatever the number of heads: the device graph's staged order puts
    /// the heads' projections, their K transposes, scores, softmaxes and
    /// P V products side by side (plain element-major order cut six
    /// segments per head), while each head's GEMM chain of a batched MLP
    /// keeps a segment of its own.
    #[test]
    fn per_head_attention_takes_five_segments_for_any_number_of_heads() {
        let segments = |text: &str| -> Vec<(Kind, usize)> {
            let model = ipu_graph::parse("t.ipug", text).unwrap();
            let device = crate::legalize::legalize(&model).unwrap().graph;
            split(&device, false, &BTreeSet::new(), u32::MAX, false)
                .unwrap()
                .iter()
                .map(|s| (s.kind, s.graph.nodes().len()))
                .collect()
        };
        for heads in [1, 3, 16] {
            let text = format!(
                "model m\ninput x: f16[37, 64]\nparam wq: f16[{heads}, 64, 16]\nparam wk: f16[{heads}, 64, 16]\nparam wv: f16[{heads}, 64, 16]\nq = gemm(x, wq)\nk = gemm(x, wk)\nv = gemm(x, wv)\ns = gemm(q, k, transpose_b=true, out=f32)\np = softmax(s)\nph = cast(p, to=f16)\no = gemm(ph, v)\noutput o\n"
            );
            assert_eq!(
                segments(&text),
                [
                    (Kind::Blocks, 3 * heads),
                    (Kind::Transpose, heads),
                    (Kind::Blocks, heads),
                    (Kind::Rowwise, 2 * heads),
                    (Kind::Blocks, heads),
                ],
                "{heads} heads"
            );
        }
        let chains = segments("model m\ninput a: f16[3, 8, 16]\nparam w: f16[3, 16, 8]\nparam u: f16[3, 8, 4]\nh = gemm(a, w)\ny = gemm(h, u)\nz = softmax(y)\noutput z\n");
        assert_eq!(
            chains,
            [
                (Kind::Blocks, 2),
                (Kind::Blocks, 2),
                (Kind::Blocks, 2),
                (Kind::Rowwise, 3)
            ]
        );
    }

    #[test]
    fn a_model_of_one_pattern_is_one_segment() {
        let s = kinds("model m\ninput x: f16[4, 8]\nparam w: f16[8, 8]\nparam b: f16[8]\nh = gemm(x, w)\nz = add(h, b)\noutput z\n");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].0, Kind::Blocks);
    }

    /// A placement: `bytes` of the tensor from `host_offset` at
    /// `buffer_offset` of buffer `buffer` on `tile`.
    fn p(
        tile: u32,
        buffer: usize,
        buffer_offset: u32,
        host_offset: u64,
        bytes: u32,
    ) -> HostPlacement {
        HostPlacement {
            tile,
            buffer,
            buffer_offset,
            host_offset,
            bytes,
        }
    }

    #[test]
    fn transfers_cover_each_consumer_range_from_the_producer_ranges() {
        // Rows of 8 bytes on two tiles, read as one 16-byte range on tile 2
        // and twice on tile 3.
        let from = [p(0, 0, 0, 0, 8), p(1, 0, 8, 8, 8)];
        let to = [p(2, 1, 0, 0, 16), p(3, 0, 0, 4, 8), p(3, 1, 0, 4, 8)];
        let t = transfers_between("x", &from, &to, 8).unwrap();
        let words: u32 = t
            .iter()
            .map(|t| t.bytes * t.destinations.len() as u32)
            .sum();
        assert_eq!(words, 32);
        assert!(t.iter().all(|t| {
            let tiles: BTreeSet<u32> = t.destinations.iter().map(|d| d.tile).collect();
            tiles.len() == t.destinations.len()
        }));
        let e = transfers_between("x", &from, &[p(2, 0, 0, 8, 16)], 8).unwrap_err();
        assert!(e.to_string().contains("bytes 16..24"), "{e}");
        let e = transfers_between("x", &from, &[p(2, 0, 2, 0, 8)], 8).unwrap_err();
        assert!(e.to_string().contains("4-byte words"), "{e}");
    }

    #[test]
    fn rows_of_an_odd_number_of_f16_move_with_their_padding() {
        // Three rows of 3 f16 (6 bytes), padded to 8 bytes on both sides:
        // each row moves as two words, and the rows of one tile continue
        // one another, so they merge into one transfer per source tile.
        let from = [p(0, 0, 0, 0, 6), p(0, 0, 8, 6, 6), p(1, 0, 0, 12, 6)];
        let to = [p(2, 1, 0, 0, 6), p(2, 1, 8, 6, 6), p(2, 1, 16, 12, 6)];
        let t = transfers_between("x", &from, &to, 6).unwrap();
        let moved: Vec<(u32, u32, u32)> = t
            .iter()
            .map(|t| (t.source.tile, t.destinations[0].offset, t.bytes))
            .collect();
        assert_eq!(moved, [(0, 0, 16), (1, 16, 8)]);
        // A packed destination (row 1 right after row 0's 6 bytes) has no
        // padding to take the word's other half: refused, naming the bytes.
        let packed = [p(2, 1, 0, 0, 6), p(2, 1, 6, 6, 6), p(2, 1, 12, 12, 6)];
        let e = transfers_between("x", &from, &packed, 6).unwrap_err();
        assert!(e.to_string().contains("bytes 0..6"), "{e}");
        // Nor does a source whose next row follows without padding.
        let packed_from = [p(0, 0, 0, 0, 6), p(0, 0, 6, 6, 6), p(1, 0, 0, 12, 6)];
        let e = transfers_between("x", &packed_from, &to, 6).unwrap_err();
        assert!(e.to_string().contains("rows of 6 bytes"), "{e}");
        // A piece that ends inside a row never takes padding.
        let half = [p(3, 0, 0, 0, 2), p(4, 0, 0, 2, 4)];
        let e = transfers_between("x", &from, &half, 6).unwrap_err();
        assert!(e.to_string().contains("bytes 0..2"), "{e}");
    }

    /// Two segments on one tile, each with a weight and working buffers:
    /// the bound adds both weights to the larger working set (a part's
    /// persistent buffers plus its largest scratch phase, not the sum of its
    /// phases), and says so only when that exceeds region 1.
    #[test]
    fn resident_weights_bound_adds_every_weight_to_the_largest_working_set() {
        use crate::lower::{BufferSpec, RegionReq};
        let buf = |name: &str, bytes: u32, scratch: Option<u32>| BufferSpec {
            name: name.into(),
            bytes,
            align: 8,
            region: RegionReq::Interleaved,
            exclusive_element: false,
            zero: vec![],
            category: "test".into(),
            scratch,
            lifetime: None,
            kernel_segment: None,
        };
        let part = |weight: u32, persistent: u32, phases: [u32; 2]| Lowered {
            tile_count: 1,
            buffers: [(
                0u32,
                vec![
                    buf("w", weight, None),
                    buf("a", persistent, None),
                    buf("s1", phases[0], Some(1)),
                    buf("s2", phases[1], Some(2)),
                ],
            )]
            .into_iter()
            .collect(),
            calls: vec![],
            io: vec![(
                vec![HostTensor {
                    name: "w".into(),
                    ty: ipu_graph::TensorType::new(DType::F16, [1, 1]),
                    placements: vec![HostPlacement {
                        tile: 0,
                        buffer: 0,
                        buffer_offset: 0,
                        host_offset: 0,
                        bytes: 2,
                    }],
                }],
                vec![],
            )],
            resident: vec![],
            segment_steps: vec![],
            rewritten: Default::default(),
            group_results: BTreeMap::new(),
            transposed_host: Default::default(),
        };
        let region1 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
        // Weights 100 + 50 KB; working sets 200 + max(80, 90) = 290 KB and
        // 10 + 5 = 15 KB: 440 KB > 416 KiB.
        let big = [
            part(100 << 10, 200 << 10, [80 << 10, 90 << 10]),
            part(50 << 10, 10 << 10, [5 << 10, 0]),
        ];
        assert_eq!(resident_weights_exceed(&big), Some((0, 440 << 10, region1)));
        // Without the first weight: 50 + 290 = 340 KB fits (the sum of the
        // first part's phases, 200 + 80 + 90, would be counted by no join).
        let fits = [
            part(0, 200 << 10, [80 << 10, 90 << 10]),
            part(50 << 10, 10 << 10, [5 << 10, 0]),
        ];
        assert_eq!(resident_weights_exceed(&fits), None);
    }
}
