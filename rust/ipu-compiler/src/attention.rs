//! Attention blocks: `y = merge_heads(attention(split_heads(q), split_heads(k),
//! split_heads(v)))` where q, k and v are GEMM groups (the projections).
//!
//! Recognition ([`recognise`]) checks the whole pattern and refuses anything
//! else with the value at fault. Planning ([`plan`]) gives every (head, query
//! block) pair a tile of its own, after the tiles of the projections, and
//! picks the query block size and the key blocking with the kernels' cycle
//! formulas, a receive-bound estimate of the exchange and an estimate of the
//! projections on the tiles left. Lowering ([`lower`]) appends to the
//! projections' lowered program:
//!
//! 1. `transpose k`: every tile of the K projection transposes its result
//!    shard (`transpose_f16`), so that the exchange moves K^T as runs of
//!    keys (the K projection's row parts have even boundaries, so every run
//!    starts on a 4-byte word); the same step resets each attention tile's
//!    running state (`fill64`: O = 0, (m, l) = (-inf, 0)).
//! 2. one exchange step: Q rows of the tile's queries and head, and the
//!    whole head's K^T and V (multicast to every query block of the head),
//!    into zero-padded GEMM operand layouts (head size padded to 16).
//! 3. per key block: S = Q K^T (`gemm_f16` ACC=32), the online softmax
//!    update (`attention_online` PV=1: (m, l), P in f16 and the rescaling
//!    factors), P V (`gemm_f16` ACC=32) and O = O a + P V (`attention_merge`).
//! 4. `attention_final`: out = f16(O / l), the rows the host reads as `y`.
//!
//! Invariants: every transfer moves whole 4-byte words between 4-aligned
//! offsets (head sizes are even); padding that a GEMM multiplies is zero at
//! load and never written with anything but zeros.

use crate::exchange::{self, BufferRef, BufferTransfer};
use crate::fuse::Group;
use crate::gemm::{ranges, FormulaCost, C_HEADER};
use crate::library::KernelRequest;
use crate::lower::{BufferSpec, HostPlacement, HostTensor, Lowered, RegionReq, StateWord, Step, Vertex};
use crate::plan::{supervisor_cycles, STANDARD_BUDGET};
use crate::CompileError;
use ipu_graph::{DType, Graph, NodeId, Op, ValueDef, ValueId};
use std::collections::BTreeMap;

/// Scratch phase of the attention's operands and scores.
pub const ATTENTION_PHASE: u32 = 2;

/// One recognised attention block.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionBlock {
    /// Group indices of the q, k and v projections.
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub heads: u32,
    /// Head size.
    pub d: u32,
    /// Queries and keys.
    pub sq: u32,
    pub sk: u32,
    pub causal: bool,
    pub scale: f32,
    /// The attention value (`[H, Sq, D]`).
    pub attention: ValueId,
    /// The merged result (`[Sq, H * D]`), a graph output.
    pub result: ValueId,
    /// The K projection's result (for step names).
    pub k_value: ValueId,
}

impl AttentionBlock {
    /// The head size padded to the AMP's 16 (the scores GEMM's K).
    pub fn dp(&self) -> u32 {
        self.d.div_ceil(16) * 16
    }
    /// Groups of four head columns (the online and merge kernels' DQ).
    pub fn dq(&self) -> u32 {
        self.d.div_ceil(4)
    }
    /// Column blocks of 16 keys.
    pub fn key_blocks(&self) -> u32 {
        self.sk.div_ceil(16)
    }
    /// Multiply-accumulates of Q K^T and P V over all heads.
    pub fn macs(&self) -> u64 {
        2 * self.heads as u64 * self.sq as u64 * self.sk as u64 * self.d as u64
    }
}

fn users(graph: &Graph, v: ValueId) -> Vec<NodeId> {
    (0..graph.nodes().len() as u32)
        .map(NodeId)
        .filter(|&n| graph.node(n).args.contains(&v))
        .collect()
}

/// Finds every attention block and checks that each `split_heads`,
/// `attention` and `merge_heads` belongs to one.
pub fn recognise(graph: &Graph, groups: &[Group]) -> Result<Vec<AttentionBlock>, CompileError> {
    let err = |v: ValueId, op: &str, reason: String| CompileError::Unsupported {
        value: graph.value(v).name.clone(),
        operation: op.to_string(),
        reason,
    };
    let is_output = |v: ValueId| graph.outputs().contains(&v);
    let mut blocks = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        let Op::Attention { causal, scale } = node.op else {
            continue;
        };
        let o = node.result;
        covered.insert(i);
        // Each operand: split_heads of a GEMM group's result, read only here.
        let mut operand = |arg: ValueId, role: &str| -> Result<(usize, u32), CompileError> {
            let ValueDef::Node(n) = graph.value(arg).def else {
                return Err(err(o, "attention", format!("operand {role} `{}` must be split_heads of a GEMM result", graph.value(arg).name)));
            };
            let split = graph.node(n);
            let Op::SplitHeads { heads } = split.op else {
                return Err(err(o, "attention", format!("operand {role} `{}` must be split_heads of a GEMM result", graph.value(arg).name)));
            };
            covered.insert(n.0 as usize);
            if is_output(arg) || users(graph, arg).len() != 1 {
                return Err(err(arg, "split_heads", "the split heads must be read by one attention and be no output".into()));
            }
            let src = split.args[0];
            let g = groups.iter().position(|g| g.result() == src).ok_or_else(|| {
                err(arg, "split_heads", format!("`{}` is not the result of a GEMM (attention takes q, k and v from GEMM projections)", graph.value(src).name))
            })?;
            if users(graph, src).len() != 1 || is_output(src) {
                return Err(err(src, "gemm", "a projection feeding attention must have no other reader and be no output".into()));
            }
            Ok((g, heads as u32))
        };
        let (q, heads) = operand(node.args[0], "q")?;
        let (k, _) = operand(node.args[1], "k")?;
        let (v, _) = operand(node.args[2], "v")?;
        if q == k || q == v || k == v {
            return Err(err(o, "attention", "q, k and v must come from three different projections".into()));
        }
        let qt = &graph.value(node.args[0]).ty;
        let kt = &graph.value(node.args[1]).ty;
        let vt = &graph.value(node.args[2]).ty;
        if qt.dtype != DType::F16 {
            return Err(err(o, "attention", format!("q is {}; attention is lowered for f16", qt.dtype)));
        }
        if qt.shape.rank() != 3 {
            return Err(err(o, "attention", format!("q has type {qt}; batched attention is not lowered")));
        }
        let (sq, d) = (qt.shape.dims()[1] as u32, qt.shape.dims()[2] as u32);
        let sk = kt.shape.dims()[1] as u32;
        if vt.shape.dims()[2] as u32 != d {
            return Err(err(o, "attention", format!("v's head size {} differs from q's {d}", vt.shape.dims()[2])));
        }
        if d % 2 != 0 {
            return Err(err(o, "attention", format!("head size {d} is odd; the exchange moves 4-byte words, so heads must start on them (even head sizes are lowered)")));
        }
        // The result: one merge_heads, a graph output.
        let u = users(graph, o);
        let merge = match u.as_slice() {
            [m] if matches!(graph.node(*m).op, Op::MergeHeads) && !is_output(o) => *m,
            _ => {
                return Err(err(o, "attention", "the attention result must be read by exactly one merge_heads and be no output".into()))
            }
        };
        covered.insert(merge.0 as usize);
        let y = graph.node(merge).result;
        if !is_output(y) || !users(graph, y).is_empty() {
            return Err(err(y, "merge_heads", "the merged attention result must be a graph output read by nothing else".into()));
        }
        blocks.push(AttentionBlock {
            q,
            k,
            v,
            heads,
            d,
            sq,
            sk,
            causal,
            scale: scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32,
            attention: o,
            result: y,
            k_value: groups[k].result(),
        });
    }
    for (i, node) in graph.nodes().iter().enumerate() {
        if matches!(node.op, Op::SplitHeads { .. } | Op::MergeHeads) && !covered.contains(&i) {
            return Err(err(node.result, node.op.name(), "split_heads and merge_heads are lowered only around an attention".into()));
        }
    }
    if blocks.len() > 1 {
        return Err(err(blocks[1].attention, "attention", "one attention block per model is lowered".into()));
    }
    Ok(blocks)
}

/// The kernels of an attention block with their cycle formulas.
pub struct AttentionKernels {
    pub gemm: (KernelRequest, FormulaCost),
    pub online: (KernelRequest, FormulaCost),
    pub merge: (KernelRequest, FormulaCost),
    pub final_: (KernelRequest, FormulaCost),
    pub fill: (KernelRequest, FormulaCost),
    pub transpose: (KernelRequest, FormulaCost),
}

/// Requests for the kernels of `block`.
pub fn kernel_requests(block: &AttentionBlock) -> [KernelRequest; 6] {
    let req = |entry: &str, source: &str, params: &[(&str, i64)]| KernelRequest {
        entry: entry.into(),
        source: source.into(),
        params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    };
    [
        req("gemm_f16", "gemm_f16.S", &[("ACC", 32)]),
        req(
            "attention_online",
            "attention_online.S",
            &[("CAUSAL", block.causal as i64), ("PV", 1)],
        ),
        req("attention_merge", "attention_merge.S", &[]),
        req("attention_final", "attention_final.S", &[]),
        req("fill64", "fill64.S", &[]),
        req("transpose_f16", "transpose_f16.S", &[]),
    ]
}

/// The variables each kernel's formula reads.
pub const FORMULA_VARS: [&[&str]; 6] = [
    &["M", "NCB", "NKB"],
    &["ROWS", "BK", "BKP", "DQ"],
    &["ROWS", "DQ"],
    &["ROWS", "DQ"],
    &["COUNT"],
    &["ROWS", "COLS"],
];

/// The chosen partition of an attention block.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AttentionPlan {
    /// Query blocks per head (one tile each).
    pub query_blocks: u32,
    /// Most query rows on a tile.
    pub rows: u32,
    /// Key column-block ranges processed one after the other.
    pub key_blocks: Vec<(u32, u32)>,
    /// The first attention tile; tile `first_tile + h * query_blocks + b`
    /// holds head `h`, query block `b`.
    pub first_tile: u32,
    pub tiles: u32,
    /// Estimated cycles of the attention's compute steps (slowest tile).
    pub compute_cycles: u64,
    /// Receive-bound cycles of the exchange into one attention tile.
    pub exchange_bound_cycles: u64,
    /// Estimated cycles of the projections on the remaining tiles.
    pub projection_cycles: u64,
    pub region1_bytes: u64,
    pub region0_bytes: u64,
}

impl AttentionPlan {
    /// The query ranges of the query blocks.
    pub fn query_ranges(&self, block: &AttentionBlock) -> Vec<(u32, u32)> {
        ranges(block.sq, self.query_blocks)
    }
    pub fn tile(&self, head: u32, query_block: u32) -> u32 {
        self.first_tile + head * self.query_blocks + query_block
    }
    pub fn total_cycles(&self) -> u64 {
        self.compute_cycles + self.exchange_bound_cycles + self.projection_cycles
    }
}

/// Byte sizes of one attention tile's buffers.
#[derive(Clone, Copy, Debug)]
struct TileLayout {
    rows: u32,
    rs_q: u32,
    rs_kt: u32,
    rs_v: u32,
    rs_s: u32,
    rs_pv: u32,
    rs_p: u32,
    rs_o: u32,
    rs_out: u32,
}

impl TileLayout {
    fn new(b: &AttentionBlock, rows: u32, block_cb: u32) -> TileLayout {
        TileLayout {
            rows,
            rs_q: b.dp() * 2,
            rs_kt: b.key_blocks() * 32,
            rs_v: b.dp() * 2,
            rs_s: block_cb * 16 * 4,
            rs_pv: b.dp() * 4,
            rs_p: block_cb * 32,
            rs_o: 16 * b.dq() + 8,
            rs_out: 8 * b.dq() + 8,
        }
    }
    fn q_bytes(&self) -> u32 {
        (self.rows + 2) * self.rs_q
    }
    fn kt_bytes(&self, b: &AttentionBlock) -> u32 {
        b.dp() * self.rs_kt
    }
    fn v_bytes(&self, b: &AttentionBlock) -> u32 {
        b.key_blocks() * 16 * self.rs_v
    }
    /// Both C buffers serve the scores GEMM and then the P V GEMM: a zero
    /// header, two junk rows, the rows, two drain rows.
    fn c_bytes(&self) -> u32 {
        C_HEADER + (self.rows + 4) * self.rs_s.max(self.rs_pv)
    }
    fn p_bytes(&self) -> u32 {
        (self.rows + 2) * self.rs_p
    }
    fn region1(&self, b: &AttentionBlock) -> Option<u64> {
        crate::storage::region1_footprint(&[
            (self.q_bytes(), true),
            (self.c_bytes(), true),
            (self.c_bytes(), true),
            (self.p_bytes(), true),
            (self.kt_bytes(b), false),
            (self.v_bytes(b), false),
        ])
    }
    fn region0(&self) -> u64 {
        let r = self.rows as u64;
        r * self.rs_o as u64 + 8 * r + 4 * r + r * self.rs_out as u64 + 64
    }
}

/// The attention steps' cycles on a tile with `rows` query rows.
fn compute_cycles(
    b: &AttentionBlock,
    k: &mut AttentionKernels,
    rows: u32,
    key_blocks: &[(u32, u32)],
) -> (u64, Vec<u64>) {
    let dq = b.dq() as i64;
    let row_parts = ranges(rows, rows.min(6));
    let max_rows = row_parts.iter().map(|r| r.1 - r.0).max().unwrap_or(0) as i64;
    let mut steps = Vec::new();
    let layout = TileLayout::new(b, rows, 1);
    let fill = k.fill.1.eval(&[("COUNT", (rows * layout.rs_o / 8) as i64)]);
    steps.push(fill + supervisor_cycles(2));
    for &(c0, c1) in key_blocks {
        let nb = c1 - c0;
        let cols = ranges(nb, nb.min(6));
        let widest = cols.iter().map(|c| c.1 - c.0).max().unwrap_or(0) as i64;
        let s = k.gemm.1.eval(&[("M", rows as i64), ("NCB", widest), ("NKB", (b.dp() / 16) as i64)]);
        steps.push(s + supervisor_cycles(cols.len() as u64));
        let keys = ((c1 * 16).min(b.sk) - c0 * 16) as i64;
        let online = k.online.1.eval(&[("ROWS", max_rows), ("BK", keys), ("BKP", nb as i64 * 16), ("DQ", dq)]);
        steps.push(online + supervisor_cycles(row_parts.len() as u64));
        let vcols = ranges(b.dp() / 16, (b.dp() / 16).min(6));
        let vwidest = vcols.iter().map(|c| c.1 - c.0).max().unwrap_or(0) as i64;
        let pv = k.gemm.1.eval(&[("M", rows as i64), ("NCB", vwidest), ("NKB", nb as i64)]);
        steps.push(pv + supervisor_cycles(vcols.len() as u64));
        let merge = k.merge.1.eval(&[("ROWS", max_rows), ("DQ", dq)]);
        steps.push(merge + supervisor_cycles(row_parts.len() as u64));
    }
    let fin = k.final_.1.eval(&[("ROWS", max_rows), ("DQ", dq)]);
    steps.push(fin + supervisor_cycles(row_parts.len() as u64));
    (steps.iter().sum(), steps)
}

/// Key blockings whose buffers fit region 1 with `rows` query rows: the
/// fewest blocks and up to two more (smaller score buffers leave more
/// memory to the projections' weights, at the price of more launches).
fn key_blockings(b: &AttentionBlock, rows: u32) -> Vec<(Vec<(u32, u32)>, TileLayout, u64)> {
    let ncb = b.key_blocks();
    let mut out = Vec::new();
    for nblocks in 1..=ncb {
        let blocks = ranges(ncb, nblocks);
        let widest = blocks.iter().map(|c| c.1 - c.0).max().unwrap_or(1);
        let layout = TileLayout::new(b, rows, widest);
        if let Some(r1) = layout.region1(b) {
            if layout.region0() <= STANDARD_BUDGET / 2 {
                out.push((blocks, layout, r1));
                if out.len() == 3 {
                    break;
                }
            }
        }
    }
    out
}

/// Candidate partitions of `block` over at most `tiles` tiles that leave at
/// least `min_left` tiles for the projections, best first.
/// `projection_cycles(tiles)` estimates the projections on the tiles left.
pub fn plan(
    block: &AttentionBlock,
    tiles: u32,
    min_left: u32,
    kernels: &mut AttentionKernels,
    projection_cycles: impl Fn(u32) -> u64,
) -> Vec<AttentionPlan> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for qb in 1..=block.sq {
        let rows = block.sq.div_ceil(qb);
        let attention_tiles = block.heads * qb;
        if attention_tiles + min_left > tiles || !seen.insert(rows) {
            continue;
        }
        for (key_blocks, layout, r1) in key_blockings(block, rows) {
        let (compute, _) = compute_cycles(block, kernels, rows, &key_blocks);
        // Every attention tile receives its head's K^T and V and its Q rows.
        let received = layout.kt_bytes(block) as u64 * block.d as u64 / block.dp() as u64
            + block.sk as u64 * block.d as u64 * 2
            + rows as u64 * block.d as u64 * 2;
        let exchange = ipu_arch::SYNC_CYCLES
            + received.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
        let first_tile = 0;
        out.push(AttentionPlan {
            query_blocks: qb,
            rows,
            key_blocks,
            first_tile,
            tiles: attention_tiles,
            compute_cycles: compute,
            exchange_bound_cycles: exchange,
            projection_cycles: projection_cycles(tiles),
            region1_bytes: r1,
            region0_bytes: layout.region0(),
        });
        }
    }
    out.sort_by_key(|p| (p.total_cycles(), p.tiles, p.key_blocks.len()));
    out
}

/// Buffers of one attention tile (indices into its buffer list).
struct TileBuffers {
    q: usize,
    kt: usize,
    v: usize,
    s: usize,
    s2: usize,
    p: usize,
    o: usize,
    ml: usize,
    alpha: usize,
    out: usize,
    /// Eight bytes per online vertex (its (-m', -m') pair).
    scratch: usize,
}

/// Supervisor cycles around a step of `n` short fill vertices: the last one
/// starts after the others' launches (two `setzi` and a two-slot `run`
/// each, 24 cycles), and `wsync` follows (measured on the simulator; the
/// GEMM planner's [`supervisor_cycles`] also covers the call's dispatch).
pub fn fill_launch_cycles(n: u64) -> u64 {
    24 * n.saturating_sub(1) + 12
}

fn round_up(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

/// Appends the attention block to `l` (see the module documentation).
/// `exchange_label` numbers the exchange step in the scheduler's log.
#[allow(clippy::too_many_arguments)]
pub fn lower(
    graph: &Graph,
    block: &AttentionBlock,
    plan: &AttentionPlan,
    kernels: &mut AttentionKernels,
    l: &mut Lowered,
    exchange_label: u32,
) -> Result<u64, CompileError> {
    let b = block;
    let name = graph.value(b.attention).name.clone();
    let y_name = graph.value(b.result).name.clone();
    let (d, dp, dq) = (b.d, b.dp(), b.dq());
    let qranges = plan.query_ranges(b);
    let widest = plan.key_blocks.iter().map(|c| c.1 - c.0).max().unwrap_or(1);
    let mut tiles: BTreeMap<u32, (u32, u32, TileBuffers, TileLayout)> = BTreeMap::new();
    let spec = |role: &str, bytes: u32, region: RegionReq, exclusive: bool, zero: Vec<(u32, u32)>, category: &str| BufferSpec {
        name: format!("{name}.{role}"),
        bytes,
        align: if region == RegionReq::Interleaved { 16 } else { 8 },
        region,
        exclusive_element: exclusive,
        zero,
        category: category.into(),
        scratch: None,
    };
    for h in 0..b.heads {
        for (qi, &(q0, q1)) in qranges.iter().enumerate() {
            let tile = plan.tile(h, qi as u32);
            let rows = q1 - q0;
            let lay = TileLayout::new(b, rows, widest);
            let bufs = l.buffers.get_mut(&tile).expect("attention tiles are below tile_count");
            let mut push = |s: BufferSpec| {
                bufs.push(s);
                bufs.len() - 1
            };
            // The operands and scores are scratch of the attention phase:
            // they share memory with the projections' scratch, so what the
            // GEMMs multiply as padding is zeroed by fills each run (before
            // the exchange writes the data): all of Q (head padding and the
            // two drain rows), the padding rows of K^T (head) and V (keys),
            // the C headers and P's drain rows. Padding columns of V and the
            // key padding of K^T may hold anything: they only reach result
            // columns and scores nothing reads.
            let scratch = |mut b: BufferSpec| {
                b.scratch = Some(ATTENTION_PHASE);
                b
            };
            let q = push(scratch(spec("q", lay.q_bytes(), RegionReq::Interleaved, true, vec![], "attention_operand")));
            let kt = push(scratch(spec("kt", lay.kt_bytes(b), RegionReq::Interleaved, false, vec![], "attention_operand")));
            let v = push(scratch(spec("v", lay.v_bytes(b), RegionReq::Interleaved, false, vec![], "attention_operand")));
            let s = push(scratch(spec("s", lay.c_bytes(), RegionReq::Interleaved, true, vec![], "attention_scores")));
            let s2 = push(scratch(spec("s_partial", lay.c_bytes(), RegionReq::Interleaved, true, vec![], "attention_scores")));
            let p = push(scratch(spec("p", lay.p_bytes(), RegionReq::Interleaved, true, vec![], "attention_scores")));
            let o = push(spec("o", rows * lay.rs_o, RegionReq::Standard, false, vec![], "attention_state"));
            let ml = push(spec("ml", rows * 8, RegionReq::Standard, false, vec![], "attention_state"));
            let alpha = push(spec("alpha", rows * 4, RegionReq::Standard, false, vec![], "attention_state"));
            let out = push(spec("out", rows * lay.rs_out, RegionReq::Standard, false, vec![], "attention_result"));
            let scratch = push(spec("scratch", 8 * rows.min(6), RegionReq::Standard, false, vec![], "attention_state"));
            tiles.insert(tile, (h, qi as u32, TileBuffers { q, kt, v, s, s2, p, o, ml, alpha, out, scratch }, lay));
        }
    }

    // Step 1: K^T on the K projection's tiles; reset of the running state.
    let mut prep = Step {
        operation: name.clone(),
        phase: format!("transpose {} (K^T)", graph.value(b.k_value).name),
        tiles: BTreeMap::new(),
        estimated_cycles: 0,
        exchange: None,
    };
    let k_results: Vec<(u32, crate::lower::GroupResult)> = l
        .group_results
        .iter()
        .filter(|((g, _), _)| *g == b.k)
        .map(|(&(_, t), &r)| (t, r))
        .collect();
    // (tile, kT buffer, row stride) of each K shard.
    let mut kt_src: BTreeMap<u32, (usize, u32)> = BTreeMap::new();
    let mut prep_cycles = 0u64;
    for &(tile, r) in &k_results {
        let (r0, r1) = r.rows;
        let mt = r1 - r0;
        if r0 % 2 != 0 {
            return Err(CompileError::Verifier {
                phase: "lower",
                message: format!("K projection rows on tile {tile} start at odd row {r0}"),
            });
        }
        let rs = round_up(mt * 2, 8);
        let bufs = l.buffers.get_mut(&tile).expect("projection tiles exist");
        let zero: Vec<(u32, u32)> = (0..r.width).map(|c| (c * rs + mt * 2, (c + 1) * rs)).filter(|z| z.0 < z.1).collect();
        bufs.push(BufferSpec {
            name: format!("{name}.k_transposed"),
            bytes: r.width * rs,
            align: 8,
            region: RegionReq::Any,
            exclusive_element: false,
            zero,
            category: "attention_operand".into(),
            scratch: None,
        });
        let ktb = bufs.len() - 1;
        kt_src.insert(tile, (ktb, rs));
        let parts = ranges(r.width, r.width.min(6));
        let mut slowest = 0;
        let vertices = parts
            .iter()
            .map(|&(c0, c1)| {
                slowest = slowest.max(kernels.transpose.1.eval(&[("ROWS", mt as i64), ("COLS", (c1 - c0) as i64)]));
                Vertex {
                    kernel: kernels.transpose.0.clone(),
                    state: vec![
                        StateWord::Addr { buffer: r.buffer, offset: c0 * 2 },
                        StateWord::Const(r.row_stride),
                        StateWord::Addr { buffer: ktb, offset: c0 * rs },
                        StateWord::Const(rs),
                        StateWord::Const(mt),
                        StateWord::Const(c1 - c0),
                    ],
                }
            })
            .collect();
        prep_cycles = prep_cycles.max(slowest + supervisor_cycles(parts.len() as u64));
        prep.tiles.insert(tile, vertices);
    }
    prep.estimated_cycles = prep_cycles;
    // The fills of every attention tile, at most six per compute step.
    let mut fill_steps: Vec<Step> = Vec::new();
    for (&tile, (_, _, t, lay)) in &tiles {
        let rows = lay.rows;
        let fill = |buffer: usize, offset: u32, bytes: u32, lo: u32, hi: u32| (
            Vertex {
                kernel: kernels.fill.0.clone(),
                state: vec![StateWord::Addr { buffer, offset }, StateWord::Const(bytes / 8), StateWord::Const(lo), StateWord::Const(hi)],
            },
            bytes / 8,
        );
        let mut fills = vec![
            fill(t.o, 0, rows * lay.rs_o, 0, 0),
            fill(t.ml, 0, rows * 8, f32::NEG_INFINITY.to_bits(), 0),
            fill(t.q, 0, lay.q_bytes(), 0, 0),
            fill(t.s, 0, C_HEADER, 0, 0),
            fill(t.s2, 0, C_HEADER, 0, 0),
            fill(t.p, rows * lay.rs_p, 2 * lay.rs_p, 0, 0),
        ];
        if dp > d {
            fills.push(fill(t.kt, d * lay.rs_kt, (dp - d) * lay.rs_kt, 0, 0));
        }
        let key_pad = b.key_blocks() * 16 - b.sk;
        if key_pad > 0 {
            fills.push(fill(t.v, b.sk * lay.rs_v, key_pad * lay.rs_v, 0, 0));
        }
        for (i, chunk) in fills.chunks(ipu_arch::WORKER_CONTEXTS as usize).enumerate() {
            if fill_steps.len() <= i {
                fill_steps.push(Step {
                    operation: name.clone(),
                    phase: format!("reset {name} state and padding ({})", i + 1),
                    tiles: BTreeMap::new(),
                    estimated_cycles: 0,
                    exchange: None,
                });
            }
            let slowest = chunk.iter().map(|f| kernels.fill.1.eval(&[("COUNT", f.1 as i64)])).max().unwrap_or(0);
            let st = &mut fill_steps[i];
            st.estimated_cycles = st.estimated_cycles.max(slowest + fill_launch_cycles(chunk.len() as u64));
            st.tiles.insert(tile, chunk.iter().map(|f| f.0.clone()).collect());
        }
    }

    // Step 2: the exchange of Q, K^T and V.
    let head_of = |tile: u32| tiles[&tile].0;
    let _ = head_of;
    let qblock_of = |r: u32| -> (u32, u32) {
        let i = qranges.iter().position(|&(a, z)| (a..z).contains(&r)).expect("query ranges cover the queries");
        (i as u32, qranges[i].0)
    };
    // Segments of columns [c0, c0 + w) by head: (head, first col, last col).
    let segments = |c0: u32, w: u32| -> Vec<(u32, u32, u32)> {
        let mut v = Vec::new();
        let mut c = c0;
        while c < c0 + w {
            let h = c / d;
            let e = ((h + 1) * d).min(c0 + w);
            v.push((h, c, e));
            c = e;
        }
        v
    };
    let mut transfers = Vec::new();
    for (&(g, tile), r) in &l.group_results {
        if g == b.q {
            for row in r.rows.0..r.rows.1 {
                let (qi, q0) = qblock_of(row);
                for (h, s0, s1) in segments(r.col0, r.width) {
                    let dst = plan.tile(h, qi);
                    transfers.push(BufferTransfer {
                        source: BufferRef { tile, buffer: r.buffer, offset: (row - r.rows.0) * r.row_stride + (s0 - r.col0) * 2 },
                        destinations: vec![BufferRef { tile: dst, buffer: tiles[&dst].2.q, offset: (row - q0) * tiles[&dst].3.rs_q + (s0 - h * d) * 2 }],
                        bytes: (s1 - s0) * 2,
                    });
                }
            }
        } else if g == b.v {
            for row in r.rows.0..r.rows.1 {
                for (h, s0, s1) in segments(r.col0, r.width) {
                    let destinations = (0..plan.query_blocks)
                        .map(|qi| {
                            let dst = plan.tile(h, qi);
                            BufferRef { tile: dst, buffer: tiles[&dst].2.v, offset: row * tiles[&dst].3.rs_v + (s0 - h * d) * 2 }
                        })
                        .collect();
                    transfers.push(BufferTransfer {
                        source: BufferRef { tile, buffer: r.buffer, offset: (row - r.rows.0) * r.row_stride + (s0 - r.col0) * 2 },
                        destinations,
                        bytes: (s1 - s0) * 2,
                    });
                }
            }
        } else if g == b.k {
            let (ktb, rs) = kt_src[&tile];
            let (r0, r1) = r.rows;
            let bytes = round_up((r1 - r0) * 2, 4);
            for c in 0..r.width {
                let gc = r.col0 + c;
                let (h, j) = (gc / d, gc % d);
                let destinations = (0..plan.query_blocks)
                    .map(|qi| {
                        let dst = plan.tile(h, qi);
                        BufferRef { tile: dst, buffer: tiles[&dst].2.kt, offset: j * tiles[&dst].3.rs_kt + r0 * 2 }
                    })
                    .collect();
                transfers.push(BufferTransfer { source: BufferRef { tile, buffer: ktb, offset: c * rs }, destinations, bytes });
            }
        }
    }
    for t in &transfers {
        let aligned = t.bytes % 4 == 0 && t.source.offset % 4 == 0 && t.destinations.iter().all(|x| x.offset % 4 == 0);
        if !aligned {
            return Err(CompileError::Verifier {
                phase: "lower",
                message: format!("attention transfer from tile {} offset {} ({} bytes) is not word aligned", t.source.tile, t.source.offset, t.bytes),
            });
        }
    }
    let mut x = exchange::schedule(l.tile_count, transfers, exchange_label)?;
    exchange::attach_tables(&mut x, &mut l.buffers, &format!("xtab{exchange_label}"));
    let exchange_cycles = exchange::step_cycles(&x.figures);
    let xstep = Step {
        operation: name.clone(),
        phase: format!("exchange q, k^T, v -> {name}"),
        tiles: BTreeMap::new(),
        estimated_cycles: exchange_cycles,
        exchange: Some(x),
    };

    // Steps 3 and 4: per key block, then the final normalisation.
    let nkb_s = dp / 16;
    let ncb_v = dp / 16;
    let mut steps = vec![prep];
    steps.extend(fill_steps);
    steps.push(xstep);
    let mut total = steps.iter().map(|s| s.estimated_cycles).sum::<u64>();
    let offset_causal = b.sk - b.sq.min(b.sk);
    for (bi, &(c0, c1)) in plan.key_blocks.iter().enumerate() {
        let nb = c1 - c0;
        let k0 = c0 * 16;
        let bk = (c1 * 16).min(b.sk) - k0;
        let mut sg = Step { operation: name.clone(), phase: format!("{name} scores, key block {bi}"), tiles: BTreeMap::new(), estimated_cycles: 0, exchange: None };
        let mut on = Step { operation: name.clone(), phase: format!("{name} online softmax, key block {bi}"), tiles: BTreeMap::new(), estimated_cycles: 0, exchange: None };
        let mut pv = Step { operation: name.clone(), phase: format!("{name} P V, key block {bi}"), tiles: BTreeMap::new(), estimated_cycles: 0, exchange: None };
        let mut mg = Step { operation: name.clone(), phase: format!("{name} merge, key block {bi}"), tiles: BTreeMap::new(), estimated_cycles: 0, exchange: None };
        for (&tile, (_, qi, t, lay)) in &tiles {
            let rows = lay.rows;
            let q0 = qranges[*qi as usize].0;
            // The result of a GEMM with NKB blocks ends in `s` when K block
            // 0 writes `s` for odd NKB and `s_partial` for even NKB.
            let order = |nkb: u32| if nkb % 2 == 1 { (t.s, t.s2) } else { (t.s2, t.s) };
            let gemm = |a: StateWord, rs_a: u32, bb: StateWord, rs_b: u32, rs_c: u32, cg0: u32, ncb: u32, nkb: u32| {
                let (first, second) = order(nkb);
                let c_off = C_HEADER + 2 * rs_c + cg0 * 64;
                Vertex {
                    kernel: kernels.gemm.0.clone(),
                    state: vec![
                        a,
                        StateWord::Const(rs_a),
                        bb,
                        StateWord::Const(rs_b),
                        StateWord::Addr { buffer: first, offset: c_off },
                        StateWord::Addr { buffer: second, offset: c_off },
                        StateWord::Const(rs_c),
                        StateWord::Addr { buffer: second, offset: 0 },
                        StateWord::Const(rows),
                        StateWord::Const(nkb),
                        StateWord::Const(ncb),
                    ],
                }
            };
            let cols = ranges(nb, nb.min(6));
            sg.tiles.insert(
                tile,
                cols.iter()
                    .map(|&(g0, g1)| {
                        gemm(
                            StateWord::Addr { buffer: t.q, offset: 0 },
                            lay.rs_q,
                            StateWord::Addr { buffer: t.kt, offset: (c0 + g0) * 32 },
                            lay.rs_kt,
                            lay.rs_s,
                            g0,
                            g1 - g0,
                            nkb_s,
                        )
                    })
                    .collect(),
            );
            let row_parts = ranges(rows, rows.min(6));
            on.tiles.insert(
                tile,
                row_parts
                    .iter()
                    .enumerate()
                    .map(|(w, &(r0, r1))| Vertex {
                        kernel: kernels.online.0.clone(),
                        state: vec![
                            StateWord::Addr { buffer: t.s, offset: C_HEADER + (r0 + 2) * lay.rs_s },
                            StateWord::Const(lay.rs_s),
                            StateWord::Addr { buffer: t.v, offset: k0 * lay.rs_v },
                            StateWord::Const(lay.rs_v),
                            StateWord::Addr { buffer: t.o, offset: r0 * lay.rs_o },
                            StateWord::Const(lay.rs_o),
                            StateWord::Addr { buffer: t.ml, offset: 8 * r0 },
                            StateWord::Const(r1 - r0),
                            StateWord::Const(bk),
                            StateWord::Const(dq),
                            StateWord::Const(b.scale.to_bits()),
                            StateWord::Const(q0 + r0 + offset_causal),
                            StateWord::Const(k0),
                            StateWord::Addr { buffer: t.scratch, offset: 8 * w as u32 },
                            StateWord::Addr { buffer: t.p, offset: r0 * lay.rs_p },
                            StateWord::Const(lay.rs_p),
                            StateWord::Const(nb * 16),
                            StateWord::Addr { buffer: t.alpha, offset: 4 * r0 },
                        ],
                    })
                    .collect(),
            );
            let vcols = ranges(ncb_v, ncb_v.min(6));
            pv.tiles.insert(
                tile,
                vcols
                    .iter()
                    .map(|&(g0, g1)| {
                        gemm(
                            StateWord::Addr { buffer: t.p, offset: 0 },
                            lay.rs_p,
                            StateWord::Addr { buffer: t.v, offset: k0 * lay.rs_v + g0 * 32 },
                            lay.rs_v,
                            lay.rs_pv,
                            g0,
                            g1 - g0,
                            nb,
                        )
                    })
                    .collect(),
            );
            mg.tiles.insert(
                tile,
                row_parts
                    .iter()
                    .map(|&(r0, r1)| Vertex {
                        kernel: kernels.merge.0.clone(),
                        state: vec![
                            StateWord::Addr { buffer: t.o, offset: r0 * lay.rs_o },
                            StateWord::Const(lay.rs_o),
                            StateWord::Addr { buffer: t.s, offset: C_HEADER + (r0 + 2) * lay.rs_pv },
                            StateWord::Const(lay.rs_pv),
                            StateWord::Addr { buffer: t.alpha, offset: 4 * r0 },
                            StateWord::Const(r1 - r0),
                            StateWord::Const(dq),
                        ],
                    })
                    .collect(),
            );
        }
        let (_, per_step) = compute_cycles(b, kernels, plan.rows, &[(c0, c1)]);
        // per_step: [fill, scores, online, pv, merge, final].
        sg.estimated_cycles = per_step[1];
        on.estimated_cycles = per_step[2];
        pv.estimated_cycles = per_step[3];
        mg.estimated_cycles = per_step[4];
        total += per_step[1] + per_step[2] + per_step[3] + per_step[4];
        steps.extend([sg, on, pv, mg]);
    }
    let mut fin = Step { operation: name.clone(), phase: format!("{name} final normalisation"), tiles: BTreeMap::new(), estimated_cycles: 0, exchange: None };
    let mut y = HostTensor { name: y_name, ty: graph.value(b.result).ty.clone(), placements: Vec::new() };
    let hd = (b.heads * d) as u64;
    for (&tile, (h, qi, t, lay)) in &tiles {
        let rows = lay.rows;
        let q0 = qranges[*qi as usize].0;
        fin.tiles.insert(
            tile,
            ranges(rows, rows.min(6))
                .iter()
                .map(|&(r0, r1)| Vertex {
                    kernel: kernels.final_.0.clone(),
                    state: vec![
                        StateWord::Addr { buffer: t.o, offset: r0 * lay.rs_o },
                        StateWord::Const(lay.rs_o),
                        StateWord::Addr { buffer: t.ml, offset: 8 * r0 },
                        StateWord::Addr { buffer: t.out, offset: r0 * lay.rs_out },
                        StateWord::Const(lay.rs_out),
                        StateWord::Const(r1 - r0),
                        StateWord::Const(dq),
                    ],
                })
                .collect(),
        );
        for r in 0..rows {
            y.placements.push(HostPlacement {
                tile,
                buffer: t.out,
                buffer_offset: r * lay.rs_out,
                host_offset: ((q0 + r) as u64 * hd + (*h * d) as u64) * 2,
                bytes: d * 2,
            });
        }
    }
    let (_, per_step) = compute_cycles(b, kernels, plan.rows, &[]);
    fin.estimated_cycles = per_step[1];
    total += per_step[1];
    steps.push(fin);
    y.placements.sort();
    l.calls[1].steps.extend(steps);
    l.io[1].1.push(y);
    l.io[1].1.sort_by_key(|t| graph.lookup(&t.name).map(|id| id.0));
    Ok(total)
}
