//! Attention blocks: `y = merge_heads(attention(split_heads(q), split_heads(k),
//! split_heads(v)))` where q, k and v are GEMM groups (the projections), or
//! all three host inputs or parameters (in a segmented model also values
//! an earlier segment computes, which arrive as the segment's inputs).
//! Host operands are written once into row pieces on the attention's tiles
//! ([`host_homes`]), which the attention's exchange reads as it reads a
//! projection's result rows.
//!
//! Recognition ([`recognise`]) checks the whole pattern and refuses anything
//! else with the value at fault. Planning ([`plan`]) gives every (head, query
//! block, key split) a tile of its own; the attention runs on the same tiles
//! as the projections, after them, its operands in scratch memory of phase
//! [`ATTENTION_PHASE`] (docs/compiler.md, "Buffer phases"). It picks the
//! query rows per tile, the key splits and the key blocking with the
//! kernels' cycle formulas and receive-bound estimates of the exchanges.
//! Lowering ([`lower`]) appends to the projections' lowered program:
//!
//! 1. `transpose k`: every tile of the K projection transposes its result
//!    shard (`transpose_f16`), so that the exchange moves K^T as runs of
//!    keys (the K projection's row parts have even boundaries, so every run
//!    starts on a 4-byte word).
//! 2. a fill step: O = 0, (m, l) = (-inf, 0) and every padding a GEMM
//!    multiplies, in six equal shares (`fill64` range lists).
//! 3. one exchange step: Q rows of the tile's queries and head (to every key
//!    split), the split's K^T and V (to every query block of the head), into
//!    GEMM operand layouts with the head padded to 16.
//! 4. per key block: S = Q K^T (`gemm_f16` ACC=32), the online softmax
//!    update (`attention_online` PV=1: (m, l), P in f16 and the rescaling
//!    factors), P V (`gemm_f16` ACC=32) and O = O a + P V (`attention_merge`);
//!    or, in a plan whose P V accumulates into O ([`AttentionPlan::acc`]),
//!    the online update with a lazy running maximum that rescales O in
//!    place (`attention_online` ACC=1) and P V added to O by the GEMM's
//!    accumulate mode, with no merge.
//! 5. with key splits: an exchange of the other splits' (O, (m, l)) to
//!    split 0, and one `attention_combine` step per other split.
//! 6. `attention_final` on split 0: out = f16(O / l), the rows the host
//!    reads as `y`.
//!
//! Invariants: every transfer moves whole 4-byte words between 4-aligned
//! offsets (head sizes are even); whatever a GEMM multiplies as padding is
//! zero after the fill step (stale data is left only where it reaches
//! result columns or scores that nothing reads).

use crate::exchange::{self, BufferRef, BufferTransfer};
use crate::fuse::Group;
use crate::gemm::{ranges, FormulaCost, C_HEADER};
use crate::library::KernelRequest;
use crate::lower::{
    BufferSpec, HostPlacement, HostTensor, Lowered, RegionReq, StateWord, Step, Vertex,
};
use crate::plan::STANDARD_BUDGET;
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
    /// Head size of q and k.
    pub d: u32,
    /// Head size of v (and of the result).
    pub dv: u32,
    /// Queries and keys.
    pub sq: u32,
    pub sk: u32,
    pub causal: bool,
    pub scale: f32,
    /// f32 attention (q, k, v and the result f32): the scores and P V on
    /// `gemm_f32` with f32 P (`attention_online` PT=32), an f32 result;
    /// else f16.
    pub f32: bool,
    /// The attention value (`[H, Sq, D]`).
    pub attention: ValueId,
    /// The merged result (`[Sq, H * D]`), a graph output.
    pub result: ValueId,
    /// The K projection's result (for step names).
    pub k_value: ValueId,
    /// For attention over host operands: the q, k and v values (inputs or
    /// parameters of the graph). `q`, `k` and `v` above are then the
    /// pseudo-group indices `groups.len()`, `+ 1` and `+ 2`, under which
    /// [`host_homes`] files their row pieces in `Lowered::group_results`.
    pub host: Option<[ValueId; 3]>,
    /// Which host operands are `[H, S, D]` values read directly (else
    /// `[S, H * D]` values read through `split_heads`).
    pub host_heads_major: [bool; 3],
    /// Over host operands with more heads than tiles, in a model of one
    /// segment: heads of odd size are staged as over projections
    /// ([`AttentionBlock::staged`]), the host writing q and v transposed
    /// too, so that their homes hold several heads; otherwise every home
    /// holds one such head in rows padded to words, which needs a tile per
    /// head.
    pub host_staged: bool,
    /// The result is the attention value itself (`[H, Sq, D]`, a graph
    /// output), not a `merge_heads` of it.
    pub heads_major_result: bool,
    /// Whether the row layout's P V GEMM sums p ([`ones_pays`] decides it
    /// once the kernels' formulas are known): V carries a column of ones
    /// at column `4 * dqv` ([`AttentionBlock::ones_column`]), so P V's
    /// column there is each row's sum of the f16 p it multiplied,
    /// `attention_merge` ONES=1 folds it into l, and `attention_online`
    /// EXP=16 ONES=1 keeps no sums (5 issue slots a quad of keys).
    /// Otherwise f16 attention's online step sums its f16 p with
    /// `f16v4hsum` (EXP=16 ONES=0, 7 slots a quad), and f32 attention
    /// keeps its f32 exponentials and sums (EXP=32).
    pub ones: bool,
}

/// A self-attention block of `heads` heads of `d` over `s` tokens, f16,
/// not causal, over projections (the unit tests' fixture).
#[cfg(test)]
pub(crate) fn test_block(heads: u32, d: u32, s: u32) -> AttentionBlock {
    AttentionBlock {
        q: 0,
        k: 1,
        v: 2,
        heads,
        d,
        dv: d,
        sq: s,
        sk: s,
        causal: false,
        scale: 1.0 / (d as f32).sqrt(),
        f32: false,
        attention: ValueId(0),
        result: ValueId(1),
        k_value: ValueId(2),
        host: None,
        host_heads_major: [false; 3],
        host_staged: false,
        heads_major_result: false,
        ones: false,
    }
}

/// Host byte offset of element (row `r`, column `c`) of the merged view
/// `[rows, heads * d]` of a value of `eb`-byte elements laid out merged
/// or, when `heads_major`, as `[heads, rows, d]` (column `c` is column
/// `c % d` of head `c / d`).
pub fn view_offset(
    heads_major: bool,
    eb: u32,
    (rows, heads, d): (u32, u32, u32),
    r: u32,
    c: u32,
) -> u64 {
    let element = if heads_major {
        ((c / d) as u64 * rows as u64 + r as u64) * d as u64 + (c % d) as u64
    } else {
        r as u64 * heads as u64 * d as u64 + c as u64
    };
    element * eb as u64
}

impl AttentionBlock {
    /// Host byte offset of the result's query `r`, merged column `c`
    /// (a run of columns within one head is contiguous either way).
    pub fn result_offset(&self, r: u32, c: u32) -> u64 {
        view_offset(
            self.heads_major_result,
            self.eb(),
            (self.sq, self.heads, self.dv),
            r,
            c,
        )
    }
    /// Bytes of one element of q, k, v and the result.
    pub fn eb(&self) -> u32 {
        if self.f32 {
            4
        } else {
            2
        }
    }
    /// The head size padded to the AMP's 16 (the scores GEMM's K).
    pub fn dp(&self) -> u32 {
        self.d.div_ceil(16) * 16
    }
    /// Column blocks of 16 keys.
    pub fn key_blocks(&self) -> u32 {
        self.sk.div_ceil(16)
    }
    /// v's head size padded to the AMP's 16 (the P V GEMM's columns).
    pub fn dvp(&self) -> u32 {
        self.dv.div_ceil(16) * 16
    }
    /// Groups of four of v's head columns (the online, merge, final and
    /// combine kernels' DQ: O's width).
    pub fn dqv(&self) -> u32 {
        self.dv.div_ceil(4)
    }
    /// V's column of ones (with [`AttentionBlock::ones`]): the first column
    /// after O's width, so the merge finds its sum where its quads stop.
    pub fn ones_column(&self) -> u32 {
        4 * self.dqv()
    }
    /// The row layout's P V columns (V's row width in a key block): v's
    /// head padded to the AMP's 16, with room for the ones column.
    pub fn pv_cols(&self) -> u32 {
        self.pv_cols_with(self.ones)
    }
    /// [`AttentionBlock::pv_cols`] with the ones column or without.
    fn pv_cols_with(&self, ones: bool) -> u32 {
        if ones {
            (self.ones_column() + 1).div_ceil(16) * 16
        } else {
            self.dvp()
        }
    }
    /// Whether Q and V move transposed: a head of odd size over projections
    /// starts mid-word in the projection's rows, which the exchange cannot
    /// cut, so the projection tiles transpose their Q and V shards (each
    /// head column a whole row, as K^T always is) and the attention tiles
    /// transpose the runs they receive back into rows (`transpose_f16`
    /// reads 2-aligned rows). Over host operands every home holds one
    /// head in rows padded to words instead (`host_homes`).
    pub fn staged(&self) -> bool {
        (self.host.is_none() || self.host_staged)
            && !self.f32
            && (self.d % 2 == 1 || self.dv % 2 == 1)
    }
    /// Multiply-accumulates of Q K^T and P V over all heads.
    pub fn macs(&self) -> u64 {
        self.heads as u64 * self.sq as u64 * self.sk as u64 * (self.d + self.dv) as u64
    }
}

/// Where an attention operand comes from.
#[derive(Clone, Copy)]
enum Operand {
    /// A GEMM group's result (a projection).
    Group(usize),
    /// A host input or parameter `[S, H * D]` read through `split_heads`.
    Host(ValueId),
    /// A host input or parameter `[H, S, D]` read directly.
    HeadsMajor(ValueId),
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
        // Each operand: split_heads of a GEMM group's result, read only
        // here, or of a host input or parameter.
        let mut operand = |arg: ValueId, role: &str| -> Result<(Operand, u32), CompileError> {
            if matches!(graph.value(arg).def, ValueDef::Input | ValueDef::Param) {
                // An `[H, S, D]` input read directly, heads-major.
                let heads = graph.ty(arg).shape.dims().first().copied().unwrap_or(1);
                return Ok((Operand::HeadsMajor(arg), heads as u32));
            }
            let ValueDef::Node(n) = graph.value(arg).def else {
                return Err(err(
                    o,
                    "attention",
                    format!(
                        "operand {role} `{}` must be split_heads of a GEMM result",
                        graph.value(arg).name
                    ),
                ));
            };
            let split = graph.node(n);
            let Op::SplitHeads { heads } = split.op else {
                return Err(err(
                    o,
                    "attention",
                    format!(
                        "operand {role} `{}` must be split_heads of a GEMM result",
                        graph.value(arg).name
                    ),
                ));
            };
            covered.insert(n.0 as usize);
            if is_output(arg) || users(graph, arg).len() != 1 {
                return Err(err(
                    arg,
                    "split_heads",
                    "the split heads must be read by one attention and be no output".into(),
                ));
            }
            let src = split.args[0];
            if matches!(graph.value(src).def, ValueDef::Input | ValueDef::Param) {
                return Ok((Operand::Host(src), heads as u32));
            }
            let g = groups.iter().position(|g| g.result() == src).ok_or_else(|| {
                err(arg, "split_heads", format!("`{}` is not the result of a GEMM (attention takes q, k and v from GEMM projections or from inputs)", graph.value(src).name))
            })?;
            if users(graph, src).len() != 1 || is_output(src) {
                return Err(err(
                    src,
                    "gemm",
                    "a projection feeding attention must have no other reader and be no output"
                        .into(),
                ));
            }
            Ok((Operand::Group(g), heads as u32))
        };
        let (q, heads) = operand(node.args[0], "q")?;
        let (k, _) = operand(node.args[1], "k")?;
        let (v, _) = operand(node.args[2], "v")?;
        let host_heads_major = [q, k, v].map(|x| matches!(x, Operand::HeadsMajor(_)));
        let (q, k, v, host, k_value) = match (q, k, v) {
            (Operand::Group(q), Operand::Group(k), Operand::Group(v)) => {
                if q == k || q == v || k == v {
                    return Err(err(
                        o,
                        "attention",
                        "q, k and v must come from three different projections".into(),
                    ));
                }
                (q, k, v, None, groups[k].result())
            }
            (
                q @ (Operand::Host(_) | Operand::HeadsMajor(_)),
                k @ (Operand::Host(_) | Operand::HeadsMajor(_)),
                v @ (Operand::Host(_) | Operand::HeadsMajor(_)),
            ) => {
                let n = groups.len();
                let value = |x: Operand| match x {
                    Operand::Host(h) | Operand::HeadsMajor(h) => h,
                    Operand::Group(_) => unreachable!("matched host operands"),
                };
                (
                    n,
                    n + 1,
                    n + 2,
                    Some([value(q), value(k), value(v)]),
                    value(k),
                )
            }
            (q, k, v) => {
                let what = |x: Operand| match x {
                    Operand::Group(g) => {
                        format!("the GEMM result `{}`", graph.value(groups[g].result()).name)
                    }
                    Operand::Host(h) | Operand::HeadsMajor(h) => {
                        format!("the input `{}`", graph.value(h).name)
                    }
                };
                return Err(err(
                    o,
                    "attention",
                    format!(
                        "q, k and v must all be GEMM projections or all inputs: q is {}, k is {}, v is {}",
                        what(q),
                        what(k),
                        what(v)
                    ),
                ));
            }
        };
        let qt = &graph.value(node.args[0]).ty;
        let kt = &graph.value(node.args[1]).ty;
        let vt = &graph.value(node.args[2]).ty;
        if !matches!(qt.dtype, DType::F16 | DType::F32) {
            return Err(err(
                o,
                "attention",
                format!("q is {}; attention is lowered for f16 and f32", qt.dtype),
            ));
        }
        if qt.shape.rank() != 3 {
            return Err(err(
                o,
                "attention",
                format!("q has type {qt}; batched attention is not lowered"),
            ));
        }
        let (sq, d) = (qt.shape.dims()[1] as u32, qt.shape.dims()[2] as u32);
        let sk = kt.shape.dims()[1] as u32;
        let dv = vt.shape.dims()[2] as u32;
        // An odd head size is lowered: over inputs every home holds one
        // head in rows padded to whole words (`host_homes`), over
        // projections Q and V move transposed (`AttentionBlock::staged`).
        // The result: one merge_heads, a graph output; or the attention
        // value itself, a graph output read by nothing else.
        let u = users(graph, o);
        let heads_major_result = u.is_empty() && is_output(o);
        let y = if heads_major_result {
            o
        } else {
            let merge = match u.as_slice() {
                [m] if matches!(graph.node(*m).op, Op::MergeHeads) && !is_output(o) => *m,
                _ => return Err(err(
                    o,
                    "attention",
                    "the attention result must be read by exactly one merge_heads, or be a graph output read by nothing else"
                        .into(),
                )),
            };
            covered.insert(merge.0 as usize);
            graph.node(merge).result
        };
        if !is_output(y) || !users(graph, y).is_empty() {
            return Err(err(
                y,
                "merge_heads",
                "the merged attention result must be a graph output read by nothing else".into(),
            ));
        }
        blocks.push(AttentionBlock {
            q,
            k,
            v,
            heads,
            d,
            dv,
            sq,
            sk,
            causal,
            scale: scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32,
            f32: qt.dtype == DType::F32,
            attention: o,
            result: y,
            k_value,
            host,
            host_heads_major,
            host_staged: false,
            heads_major_result,
            ones: false,
        });
    }
    for (i, node) in graph.nodes().iter().enumerate() {
        if matches!(node.op, Op::SplitHeads { .. } | Op::MergeHeads) && !covered.contains(&i) {
            return Err(err(
                node.result,
                node.op.name(),
                "split_heads and merge_heads are lowered only around an attention".into(),
            ));
        }
    }
    if blocks.len() > 1 {
        return Err(err(
            blocks[1].attention,
            "attention",
            "one attention block per model is lowered".into(),
        ));
    }
    Ok(blocks)
}

/// Whether V's ones column pays for f16 attention in the row layout
/// ([`AttentionBlock::ones`]), by the kernels' formulas at a
/// representative tile (up to 128 query rows, key blocks of up to 128
/// keys, after the rows' first block: FIRST = 0): the P V GEMM (`gemm`) with and without the ones column's block,
/// and the online and merge steps (`(online, merge)` of `sums`: EXP=16
/// ONES=0, and of `ones`: EXP=16 ONES=1). Where the head's padding to 16
/// has a spare column the GEMM costs the same and the ones win; a head of
/// 80 pays a sixth block that its five left idle on one worker and wins
/// too; a head of 64's fifth block costs more than the online step's own
/// sums (two issue slots a quad of keys): 1,024 x 128 on 4 tiles ran
/// 5,031,771 cycles with the fifth block and 4,893,381 with the sums.
///
/// With `acc` (the accumulating online kernels' formulas, ONES=0 and
/// ONES=1, [`acc_requests`]) the comparison is without the merge, which
/// plans whose P V accumulates into O ([`AttentionPlan::acc`]) drop
/// whether V carries the ones column or not. Weighing the sums without
/// the merge against the ones with it chose the sums for a head of 80,
/// whose plans over blocks of 256 keys were then slower by the estimates
/// (1,024 tokens of 2 heads on 32 tiles: 600,978 compute cycles against
/// 596,490); the ones without the merge take 567,180.
pub fn ones_pays(
    b: &AttentionBlock,
    gemm: &mut FormulaCost,
    sums: (&mut FormulaCost, &mut FormulaCost),
    ones: (&mut FormulaCost, &mut FormulaCost),
    acc: Option<(FormulaCost, FormulaCost)>,
) -> bool {
    if b.f32 {
        return false;
    }
    let rows = b.sq.min(128);
    let keys = b.sk.min(128);
    let nkb = keys.div_ceil(16);
    let rows_w = rows.div_ceil(rows.min(ipu_arch::WORKER_CONTEXTS)) as i64;
    let dq = b.dqv() as i64;
    // The P V GEMM, the online step and (unless P V accumulates into O)
    // the merge.
    let mut cost = |pv_cols: u32, online: &mut FormulaCost, merge: Option<&mut FormulaCost>| {
        gemm_grid(gemm, rows, pv_cols / 16, nkb).cycles
            + online.eval(&[
                ("ROWS", rows_w),
                ("BK", keys as i64),
                ("BKP", nkb as i64 * 16),
                ("DQ", dq),
                ("FIRST", 0),
            ])
            + merge.map_or(0, |m| m.eval(&[("ROWS", rows_w), ("DQ", dq)]))
    };
    match acc {
        Some((mut acc_sums, mut acc_ones)) => {
            cost(b.pv_cols_with(true), &mut acc_ones, None)
                < cost(b.pv_cols_with(false), &mut acc_sums, None)
        }
        None => {
            cost(b.pv_cols_with(true), ones.0, Some(ones.1))
                < cost(b.pv_cols_with(false), sums.0, Some(sums.1))
        }
    }
}

/// The kernels of an attention block with their cycle formulas.
pub struct AttentionKernels {
    pub gemm: (KernelRequest, FormulaCost),
    pub online: (KernelRequest, FormulaCost),
    pub merge: (KernelRequest, FormulaCost),
    /// The kernels of plans whose P V accumulates into O
    /// ([`AttentionPlan::acc`]): present when the block can take them and
    /// the library has them.
    pub acc: Option<AccKernels>,
    /// The options take only row plans that accumulate
    /// ([`crate::CompileOptions::attention_accumulate`]).
    pub acc_only: bool,
    pub final_: (KernelRequest, FormulaCost),
    pub fill: (KernelRequest, FormulaCost),
    pub transpose: (KernelRequest, FormulaCost),
    pub combine: (KernelRequest, FormulaCost),
    /// V's ones column, a strided item a key row ([`AttentionBlock::ones`]).
    pub fill_rows: (KernelRequest, FormulaCost),
    /// The column layout's kernels, when the library has them all and the
    /// block can take that layout.
    pub columns: Option<crate::attention_cols::ColumnKernels>,
}

/// `attention_online` ACC=1 and the `attention_final` that goes with it
/// ([`acc_requests`]), with their formulas.
pub struct AccKernels {
    pub online: (KernelRequest, FormulaCost),
    pub final_: (KernelRequest, FormulaCost),
}

impl AttentionKernels {
    /// The online and final kernels of a plan whose P V accumulates into
    /// O (`acc`, [`AttentionPlan::acc`]) or of one with the merge.
    /// [`plan`] offers accumulating plans only with [`AttentionKernels::acc`].
    #[allow(clippy::type_complexity)]
    fn online_and_final(
        &mut self,
        acc: bool,
    ) -> (
        &mut (KernelRequest, FormulaCost),
        &mut (KernelRequest, FormulaCost),
    ) {
        match (acc, self.acc.as_mut()) {
            (true, Some(a)) => (&mut a.online, &mut a.final_),
            (true, None) => unreachable!("a plan that accumulates into O without its kernels"),
            (false, _) => (&mut self.online, &mut self.final_),
        }
    }
}

/// Requests for the kernels of `block`.
pub fn kernel_requests(block: &AttentionBlock) -> [KernelRequest; 8] {
    let [online, merge] = online_and_merge_requests(block, block.ones);
    // f32: the scores and P V on gemm_f32, P in f32. The f16 requests
    // name ACC and OUT too: a library holds both specialisations, and a
    // request must tell them apart.
    let (gemm, out, transpose) = if block.f32 {
        (request("gemm_f32", "gemm_f32.S", &[]), 32, "transpose_f32")
    } else {
        (
            request("gemm_f16", "gemm_f16.S", &[("ACC", 32)]),
            16,
            "transpose_f16",
        )
    };
    [
        gemm,
        online,
        merge,
        request(
            "attention_final",
            "attention_final.S",
            &[("OUT", out), ("ONES", 0)],
        ),
        request("fill64", "fill64.S", &[]),
        request(transpose, &format!("{transpose}.S"), &[]),
        request("attention_combine", "attention_combine.S", &[]),
        request("fill_rows", "fill_rows.S", &[]),
    ]
}

/// The online and merge kernels of `block` with V's ones column or
/// without ([`AttentionBlock::ones`], which [`ones_pays`] weighs by both
/// pairs' formulas): f32 attention's take f32 exponentials and sums.
pub fn online_and_merge_requests(block: &AttentionBlock, ones: bool) -> [KernelRequest; 2] {
    let causal = ("CAUSAL", block.causal as i64);
    let (pt, exp, ones) = if block.f32 {
        (32, 32, 0)
    } else {
        (16, 16, ones as i64)
    };
    // ACC=0: the library also holds these online kernels with ACC=1
    // ([`acc_requests`]).
    let online = [
        causal,
        ("PV", 1),
        ("PT", pt),
        ("EXP", exp),
        ("ONES", ones),
        ("ACC", 0),
    ];
    [
        request("attention_online", "attention_online.S", &online),
        request("attention_merge", "attention_merge.S", &[("ONES", ones)]),
    ]
}

/// The online and final kernels of a plan whose P V accumulates into O
/// ([`AttentionPlan::acc`]) for a block with V's ones column or without
/// (`ones`, f16 blocks only): `attention_online` ACC=1, a lazy running
/// maximum that rescales O in place (with the ones column l is O's column
/// 4 DQ, which it rescales too), with f16 P from f16 exponentials (EXP=16)
/// or, for f32 blocks, f32 P (PT=32); and `attention_final`, which with
/// ONES=1 reads l there.
pub fn acc_requests(block: &AttentionBlock, ones: bool) -> [KernelRequest; 2] {
    let ones = (ones && !block.f32) as i64;
    let (pt, exp, out) = if block.f32 {
        (32, 32, 32)
    } else {
        (16, 16, 16)
    };
    [
        request(
            "attention_online",
            "attention_online.S",
            &[
                ("CAUSAL", block.causal as i64),
                ("PV", 1),
                ("PT", pt),
                ("EXP", exp),
                ("ONES", ones),
                ("ACC", 1),
            ],
        ),
        request(
            "attention_final",
            "attention_final.S",
            &[("OUT", out), ("ONES", ones)],
        ),
    ]
}

fn request(entry: &str, source: &str, params: &[(&str, i64)]) -> KernelRequest {
    KernelRequest {
        entry: entry.into(),
        source: source.into(),
        params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

/// The variables each kernel's formula reads.
pub const FORMULA_VARS: [&[&str]; 8] = [
    &["M", "NCB", "NKB"],
    &["ROWS", "BK", "BKP", "DQ", "FIRST"],
    &["ROWS", "DQ"],
    &["ROWS", "DQ"],
    &["N", "COUNT"],
    &["ROWS", "COLS"],
    &["ROWS", "DQ"],
    &["ROWS", "ITEMS"],
];

/// How a tile lays out its queries and keys (docs/compiler.md, "Attention").
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionLayout {
    /// Queries as the GEMMs' streamed rows, flash updates per key block
    /// (this module).
    Rows,
    /// Keys as the streamed rows: S^T = K Q^T, a softmax down columns,
    /// O^T = [V^T; 1] P^T (crate::attention_cols).
    Columns,
}

impl AttentionLayout {
    /// The layout's name in reports and options (`rows`, `columns`).
    pub fn name(self) -> &'static str {
        match self {
            AttentionLayout::Rows => "rows",
            AttentionLayout::Columns => "columns",
        }
    }
    /// The layout that is not this one.
    pub fn other(self) -> AttentionLayout {
        match self {
            AttentionLayout::Rows => AttentionLayout::Columns,
            AttentionLayout::Columns => AttentionLayout::Rows,
        }
    }
}

/// The chosen partition of an attention block.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AttentionPlan {
    pub layout: AttentionLayout,
    /// Query blocks per head (one tile each).
    pub query_blocks: u32,
    /// Most query rows on a tile.
    pub rows: u32,
    /// The key splits: the keys of one (head, query block) are split over
    /// this many tiles, whose flash states a combine step folds together.
    /// Rows layout: ranges of 16-key column blocks; columns layout: ranges
    /// of keys, each starting on an even key
    /// (`crate::attention_cols::key_ranges`).
    pub key_splits: Vec<(u32, u32)>,
    /// Columns layout, causal: how many of `key_splits` each query block
    /// takes, its leading splits that hold a key some query of the block
    /// sees (the others would only compute masked scores). Empty: every
    /// block takes every split.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub block_splits: Vec<u32>,
    /// The key blocks of the first split, processed one after the other
    /// (every split has as many, near-equal); the columns layout takes
    /// each split's keys as one block (its padded 16-key blocks).
    pub key_blocks: Vec<(u32, u32)>,
    pub tiles: u32,
    /// Estimated cycles of the attention's compute steps (slowest tile).
    pub compute_cycles: u64,
    /// Receive-bound cycles of the exchange into one attention tile.
    pub exchange_bound_cycles: u64,
    /// Estimated cycles of the projections on the remaining tiles.
    pub projection_cycles: u64,
    /// Estimated cycles of the attention's first compute step on each of
    /// its tiles (the reset of its state and padding), which runs right
    /// after the projections on the first of their tiles; the projections'
    /// shares weigh it (`plan::side_by_side_shares`). Not reported.
    #[serde(skip)]
    pub prefix_cycles: u64,
    pub region1_bytes: u64,
    pub region0_bytes: u64,
    /// Column layout with key splits: every split's tile combines a range
    /// of head columns (else split 0 combines them all).
    pub distributed_combine: bool,
    /// Rounds of heads (row layout, fewer tiles than heads): round `r`
    /// runs heads `r * round_heads ..` ([`AttentionPlan::round_heads`])
    /// on the same tiles, one after the other. 1 otherwise (not reported).
    #[serde(skip_serializing_if = "is_one")]
    pub rounds: u32,
    /// Column layout only, where no other column plan fits: P^T written
    /// into the S^T GEMM's dead partials buffer and O^T's two C buffers
    /// into the S^T result once the softmax has read it
    /// (`crate::attention_cols`, "Compact buffers"). Reported only when
    /// set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub compact: bool,
    /// Set by the compile that plans the projections on the tiles this
    /// plan leaves, when their plans' estimate came out above twice
    /// `projection_cycles` and more than `PROJECTIONS_OVER_ASSUMPTION_MIN`
    /// above it: those cycles. The compiler then also compiles the model
    /// with the projections in segments of their own and keeps the faster
    /// estimate (`compile_from`). Reported only when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projections_planned_over: Option<u64>,
    /// Row layout: the key blocks of every split move in this many chunks
    /// of consecutive blocks, each by an exchange step of its own right
    /// before its blocks' compute steps, so that a tile holds one chunk's
    /// K^T and V at a time ([`AttentionPlan::chunk_ranges`]); the online
    /// softmax carries (O, (m, l)) from chunk to chunk as from block to
    /// block. A long sequence on few tiles has no other plan: its split's
    /// keys would not fit a tile. 1 otherwise (not reported).
    #[serde(skip_serializing_if = "is_one")]
    pub key_chunks: u32,
    /// Row layout: the rounds run query blocks of a head on the same
    /// tiles, `tiles / splits` (head, query block) units a round (else
    /// rounds are of whole heads). Reported only when set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub query_rounds: bool,
    /// Row layout: P V accumulates into O on the AMP (`gemm_f16`'s or,
    /// for f32 blocks, `gemm_f32`'s accumulate mode), O in a C buffer of region 1 in the
    /// P V GEMM's layout (with V's ones column, l in O's column 4 DQ), and
    /// the online step (`attention_online` ACC=1) keeps O scaled to a lazy
    /// running maximum itself, so no merge step runs. Else O lives in
    /// region 0 and `attention_merge` forms O a + P V after every key
    /// block. Reported only when set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub acc: bool,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl AttentionPlan {
    /// The query ranges of the query blocks.
    pub fn query_ranges(&self, block: &AttentionBlock) -> Vec<(u32, u32)> {
        match self.layout {
            // Received as runs of Q^T rows, staged query blocks start on
            // even queries (4-byte words).
            AttentionLayout::Rows if block.staged() => even_ranges(block.sq, self.query_blocks),
            AttentionLayout::Rows => ranges(block.sq, self.query_blocks),
            AttentionLayout::Columns => {
                crate::attention_cols::query_ranges(block, self.query_blocks)
            }
        }
    }
    /// The key splits query block `query_block` takes: the first this many
    /// of `key_splits`.
    pub fn splits_of(&self, query_block: u32) -> u32 {
        self.block_splits
            .get(query_block as usize)
            .copied()
            .unwrap_or(self.key_splits.len() as u32)
    }
    /// The tiles of one head: every query block's splits.
    pub fn tiles_per_head(&self) -> u32 {
        (0..self.query_blocks).map(|b| self.splits_of(b)).sum()
    }
    /// The tile of head `h`, query block `b`, key split `s`: heads one
    /// after the other, in each the query blocks' splits in order
    /// (`(h * query_blocks + b) * splits + s` when every block takes every
    /// split).
    pub fn tile(&self, head: u32, query_block: u32, split: u32) -> u32 {
        debug_assert!(split < self.splits_of(query_block));
        if self.block_splits.is_empty() {
            return (head * self.query_blocks + query_block) * self.key_splits.len() as u32 + split;
        }
        let before: u32 = self.block_splits[..query_block as usize].iter().sum();
        head * self.tiles_per_head() + before + split
    }
    /// The key blocks of split `split` (as many as `key_blocks`).
    pub fn blocks_of(&self, split: usize) -> Vec<(u32, u32)> {
        let (c0, c1) = self.key_splits[split];
        ranges(c1 - c0, self.key_blocks.len() as u32)
            .into_iter()
            .map(|(a, z)| (c0 + a, c0 + z))
            .collect()
    }
    /// The key chunks' ranges of key block indices (into
    /// [`AttentionPlan::blocks_of`], the same for every split).
    pub fn chunk_ranges(&self) -> Vec<(u32, u32)> {
        ranges(self.key_blocks.len() as u32, self.key_chunks.max(1))
    }
    /// The column blocks of split `split`'s chunk `chunk`.
    pub fn chunk_columns(&self, split: usize, chunk: usize) -> (u32, u32) {
        let blocks = self.blocks_of(split);
        let (b0, b1) = self.chunk_ranges()[chunk];
        (blocks[b0 as usize].0, blocks[b1 as usize - 1].1)
    }
    /// The column blocks of the widest chunk of any split: what a tile's
    /// K^T and V hold at once (the widest split with one chunk).
    pub fn chunk_cb(&self) -> u32 {
        widest_block_and_chunk(
            &self.key_splits,
            self.key_blocks.len() as u32,
            self.key_chunks.max(1),
        )
        .1
    }
    /// A plan of this partition with no costs, one round, one key chunk:
    /// what the tests of the tile numbering and the chunks start from.
    #[cfg(test)]
    pub(crate) fn partition_only(
        layout: AttentionLayout,
        (query_blocks, rows): (u32, u32),
        key_splits: Vec<(u32, u32)>,
        block_splits: Vec<u32>,
        key_blocks: Vec<(u32, u32)>,
        tiles: u32,
    ) -> AttentionPlan {
        AttentionPlan {
            layout,
            query_blocks,
            rows,
            key_splits,
            block_splits,
            key_blocks,
            tiles,
            compute_cycles: 0,
            exchange_bound_cycles: 0,
            projection_cycles: 0,
            prefix_cycles: 0,
            region1_bytes: 0,
            region0_bytes: 0,
            distributed_combine: false,
            rounds: 1,
            compact: false,
            projections_planned_over: None,
            key_chunks: 1,
            query_rounds: false,
            acc: false,
        }
    }
    /// Heads per round (all of them in one round).
    pub fn round_heads(&self, block: &AttentionBlock) -> u32 {
        block.heads.div_ceil(self.rounds.max(1))
    }
    pub fn total_cycles(&self) -> u64 {
        self.compute_cycles + self.exchange_bound_cycles + self.projection_cycles
    }
}

/// Byte sizes of one attention tile's buffers.
#[derive(Clone, Copy, Debug)]
struct TileLayout {
    rows: u32,
    split_cb: u32,
    /// P V accumulates into O ([`AttentionPlan::acc`]): O in a C buffer
    /// of region 1, P and V a column block wider for the zero K block that
    /// odd key blocks take ([`pv_k_blocks`]), no factors.
    acc: bool,

    rs_q: u32,
    rs_kt: u32,
    rs_v: u32,
    rs_s: u32,
    rs_pv: u32,
    rs_p: u32,
    rs_o: u32,
    rs_out: u32,
    /// With [`AttentionBlock::staged`]: the row strides of the received
    /// Q^T (a row per head column, the block's queries) and V^T (the
    /// split's keys), and their row counts; 0 rows otherwise.
    rs_qt: u32,
    rs_vt: u32,
    qt_rows: u32,
    vt_rows: u32,
}

impl TileLayout {
    /// `block_cb`: column blocks of the widest key block; `split_cb`: of
    /// the widest key split; `acc`: P V accumulates into O.
    fn new(b: &AttentionBlock, rows: u32, block_cb: u32, split_cb: u32, acc: bool) -> TileLayout {
        let eb = b.eb();
        TileLayout {
            rows,
            split_cb,
            acc,
            rs_q: b.dp() * eb,
            rs_kt: split_cb * 16 * eb,
            rs_v: b.pv_cols() * eb,
            rs_s: block_cb * 16 * 4,
            rs_pv: b.pv_cols() * 4,
            rs_p: pv_k_blocks(block_cb, acc) * 16 * eb,
            rs_o: 16 * b.dqv() + 8,
            rs_out: 4 * eb * b.dqv() + 8,
            rs_qt: transposed_row_stride(rows, 2),
            rs_vt: transposed_row_stride(split_cb * 16, 2),
            qt_rows: if b.staged() { b.d } else { 0 },
            vt_rows: if b.staged() { b.dv } else { 0 },
        }
    }
    fn qt_bytes(&self) -> u32 {
        self.qt_rows * self.rs_qt
    }
    fn vt_bytes(&self) -> u32 {
        self.vt_rows * self.rs_vt
    }
    fn q_bytes(&self) -> u32 {
        (self.rows + 2) * self.rs_q
    }
    fn kt_bytes(&self, b: &AttentionBlock) -> u32 {
        b.dp() * self.rs_kt
    }
    /// With `acc` a column block of rows more, zeros or finite, which the
    /// zero K block of the chunk's last key block reads when it is odd.
    fn v_bytes(&self, _b: &AttentionBlock) -> u32 {
        (self.split_cb + self.acc as u32) * 16 * self.rs_v
    }
    /// Both C buffers serve the scores GEMM and then the P V GEMM (with
    /// `acc`, `s_partial` as the buffer P V's K blocks alternate with O):
    /// a zero header, two junk rows before each of up to
    /// [`ROW_GROUPS_MAX`] worker row groups' rows ([`c_row`]), two drain
    /// rows.
    fn c_bytes(&self) -> u32 {
        C_HEADER + (self.rows + 2 * ROW_GROUPS_MAX + 2) * self.rs_s.max(self.rs_pv)
    }
    /// With `acc`, O's buffer: the P V GEMM's C layout, the header unused
    /// (the accumulate mode reads no zero word).
    fn o_acc_bytes(&self) -> u32 {
        C_HEADER + (self.rows + 2 * ROW_GROUPS_MAX + 2) * self.rs_pv
    }
    /// Bytes of a row of O: in P V's C buffers with `acc`, else in region
    /// 0; a key split's state moves as such rows.
    fn o_row_bytes(&self) -> u32 {
        if self.acc {
            self.rs_pv
        } else {
            self.rs_o
        }
    }
    fn p_bytes(&self) -> u32 {
        (self.rows + 2) * self.rs_p
    }
    fn region1(&self, b: &AttentionBlock) -> Option<u64> {
        let mut buffers = vec![
            (self.q_bytes(), true),
            (self.c_bytes(), true),
            (self.c_bytes(), true),
            (self.p_bytes(), true),
            (self.kt_bytes(b), false),
            (self.v_bytes(b), false),
            (self.qt_bytes(), false),
            (self.vt_bytes(), false),
        ];
        if self.acc {
            buffers.push((self.o_acc_bytes(), true));
        }
        crate::storage::region1_footprint(&buffers)
    }
    /// Region 0: O (unless it accumulates in region 1), (m, l), factors
    /// (likewise), the output rows, scratch, and the other splits' states
    /// a combining tile receives.
    fn region0(&self, splits: u32) -> u64 {
        let r = self.rows as u64;
        let own = if self.acc {
            8 * r
        } else {
            r * self.rs_o as u64 + 12 * r
        };
        let others = (splits as u64 - 1) * r * (self.o_row_bytes() as u64 + 8);
        own + others + r * self.rs_out as u64 + 64
    }
}

/// Most worker row groups of the row layout's GEMMs: their C buffers keep
/// two junk rows before each group, which the kernel writes (the outputs
/// of its pipeline before row 0) and no other worker may.
const ROW_GROUPS_MAX: u32 = 3;

/// The row layout's worker grid of one GEMM over `rows` query rows,
/// `ncb` column blocks and `nkb` K blocks: row groups (at most
/// [`ROW_GROUPS_MAX`]) times column groups of the six workers, whichever
/// the kernel's formula makes fastest (the fewest row groups of equal
/// cost). With all rows in one group the columns alone split, and a block
/// of 8 column blocks left two of six workers with twice the others' work
/// (2 x 128 rows each); 3 row groups of 2 column groups of 4 blocks take
/// 43 rows each: 26% fewer cycles.
fn gemm_grid(gemm: &mut FormulaCost, rows: u32, ncb: u32, nkb: u32) -> GemmGrid {
    (1..=ROW_GROUPS_MAX.min(rows.max(1)))
        .map(|g| gemm_grid_of(gemm, rows, g, ncb, nkb))
        .min_by_key(|grid| grid.cycles)
        .expect("at least one row group")
}

/// The grid of [`gemm_grid`] with `g` row groups: a GEMM that accumulates
/// into O keeps O's row groups from key block to key block
/// ([`AttentionPlan::acc`]).
fn gemm_grid_of(gemm: &mut FormulaCost, rows: u32, g: u32, ncb: u32, nkb: u32) -> GemmGrid {
    let w = ipu_arch::WORKER_CONTEXTS;
    let row_groups = ranges(rows, g);
    let col_groups = ranges(ncb, ncb.min(w / g).max(1));
    let m = row_groups.iter().map(|r| r.1 - r.0).max().unwrap_or(0) as i64;
    let widest = col_groups.iter().map(|c| c.1 - c.0).max().unwrap_or(0) as i64;
    let cycles = gemm.eval(&[("M", m), ("NCB", widest), ("NKB", nkb as i64)])
        + launch_cycles((row_groups.len() * col_groups.len()) as u64);
    GemmGrid {
        row_groups,
        col_groups,
        cycles,
    }
}

/// The P V GEMM's grid for a key block of `nb` column blocks on `rows`
/// query rows: the fastest for that block, or with `acc` (P V accumulates
/// into O, [`AttentionPlan::acc`]; the widest key block's column blocks)
/// the row groups that are fastest at the widest block, which fix where
/// O's rows lie for every block.
fn pv_grid(
    gemm: &mut FormulaCost,
    b: &AttentionBlock,
    rows: u32,
    nb: u32,
    acc: Option<u32>,
) -> GemmGrid {
    let ncb = b.pv_cols() / 16;
    match acc {
        Some(widest) => {
            let g = gemm_grid(gemm, rows, ncb, widest).row_groups.len() as u32;
            gemm_grid_of(gemm, rows, g, ncb, nb)
        }
        None => gemm_grid(gemm, rows, ncb, nb),
    }
}

/// A row-layout GEMM's worker grid ([`gemm_grid`]): its row groups, its
/// column groups (of column blocks) and its cycles with their launches.
struct GemmGrid {
    row_groups: Vec<(u32, u32)>,
    col_groups: Vec<(u32, u32)>,
    cycles: u64,
}

/// Byte offset in a row-layout C buffer of row `r`, with the rows in
/// `row_groups` (each after its two junk rows) and `rs` bytes a row.
fn c_row(row_groups: &[(u32, u32)], r: u32, rs: u32) -> u32 {
    let g = row_groups
        .iter()
        .position(|&(r0, r1)| r0 <= r && r < r1)
        .expect("a C row lies in one of the GEMM's row groups") as u32;
    C_HEADER + (r + 2 * (g + 1)) * rs
}

/// The K blocks of P V over a key block of `nb` column blocks: with `acc`
/// ([`AttentionPlan::acc`]) an even number, so that the GEMM, which
/// alternates between its C buffers from K block to K block, ends where
/// it began, in O's buffer (its other buffer is `s_partial`, whose scores
/// are dead by then; a second buffer for O of its own would take two
/// more memory elements at 128 rows, which left 2,048 x 512 on 64 tiles
/// only key blocks of half the width). An odd block takes a zero K block:
/// the online step writes P's zeros up to there, and V's rows there are
/// the next block's or zeros, finite either way.
fn pv_k_blocks(nb: u32, acc: bool) -> u32 {
    if acc {
        round_up(nb, 2)
    } else {
        nb
    }
}

/// The attention steps' cycles on a tile with `rows` query rows, whose V
/// buffer holds `hold_cb` column blocks of keys (a key chunk's, or the
/// split's in one chunk): the fill, then four steps a key block (scores,
/// online softmax, P V, merge), then the final normalisation. With `acc`
/// (the widest key block's column blocks, [`pv_grid`]) P V accumulates
/// into O: the online step is `attention_online` ACC=1 and the merge
/// costs nothing (no step runs). The lazy maximum's rescales of O after
/// the first block depend on the data and are not counted (at most a
/// pass over O a row, about the merge's cost, and rare once the maximum
/// has settled). `starts`: `key_blocks[0]` is the rows' first block
/// (FIRST in the online formula: every row starts from m = -inf, where
/// the accumulating vertex with f16 p takes the row's maximum before
/// its p).
fn compute_cycles(
    b: &AttentionBlock,
    k: &mut AttentionKernels,
    rows: u32,
    key_blocks: &[(u32, u32)],
    hold_cb: u32,
    acc: Option<u32>,
    starts: bool,
) -> (u64, Vec<u64>) {
    // The online, merge and final kernels work on O, v's width.
    let dq = b.dqv() as i64;
    let row_parts = ranges(rows, rows.min(6));
    let max_rows = row_parts.iter().map(|r| r.1 - r.0).max().unwrap_or(0) as i64;
    let mut steps = Vec::new();
    let layout = TileLayout::new(b, rows, 1, 1, acc.is_some());
    // The fills (balanced over six workers): O, (m, l), Q, the padding.
    let items = (rows * layout.o_row_bytes()
        + 8 * rows
        + (rows + 4) * layout.rs_q
        + 8 * b.key_blocks() * 32)
        / 8;
    let fill = k
        .fill
        .1
        .eval(&[("N", 3), ("COUNT", items.div_ceil(6) as i64)]);
    // V's ones column in every row of V's buffer, once (a step of its own
    // before the first chunk; later chunks leave the column in place).
    let ones = if b.ones {
        ones_cycles(&mut k.fill_rows.1, hold_cb * 16)
    } else {
        0
    };
    steps.push(fill + launch_cycles(6) + ones);
    for (i, &(c0, c1)) in key_blocks.iter().enumerate() {
        let nb = c1 - c0;
        steps.push(gemm_grid(&mut k.gemm.1, rows, nb, b.dp() / 16).cycles);
        let keys = ((c1 * 16).min(b.sk) - c0 * 16) as i64;
        let nkb_pv = pv_k_blocks(nb, acc.is_some());
        let (online, _) = k.online_and_final(acc.is_some());
        let online = online.1.eval(&[
            ("ROWS", max_rows),
            ("BK", keys),
            ("BKP", nkb_pv as i64 * 16),
            ("DQ", dq),
            ("FIRST", (starts && i == 0) as i64),
        ]);
        steps.push(online + launch_cycles(row_parts.len() as u64));
        steps.push(pv_grid(&mut k.gemm.1, b, rows, nkb_pv, acc).cycles);
        steps.push(match acc {
            Some(_) => 0,
            None => {
                k.merge.1.eval(&[("ROWS", max_rows), ("DQ", dq)])
                    + launch_cycles(row_parts.len() as u64)
            }
        });
    }
    let (_, final_) = k.online_and_final(acc.is_some());
    let fin = final_.1.eval(&[("ROWS", max_rows), ("DQ", dq)]);
    steps.push(fin + launch_cycles(row_parts.len() as u64));
    (steps.iter().sum(), steps)
}

/// `fill_rows` vertices that write f16 1.0 (and three zeros) into the
/// 8-byte item at byte `offset` of `rows` rows `stride` bytes apart of
/// `buffer`, the rows shared by the six workers; and their cycles with
/// the launches.
fn ones_vertices(
    fill_rows: &mut (KernelRequest, FormulaCost),
    buffer: usize,
    offset: u32,
    stride: u32,
    rows: u32,
) -> (Vec<Vertex>, u64) {
    let vertices = row_vertices(rows, &fill_rows.0, |_, r0, r1| {
        vec![
            StateWord::Addr {
                buffer,
                offset: offset + r0 * stride,
            },
            StateWord::Const(stride),
            StateWord::Const(r1 - r0),
            StateWord::Const(1),
            StateWord::Const(F16_ONE as u32),
            StateWord::Const(0),
        ]
    });
    (vertices, ones_cycles(&mut fill_rows.1, rows))
}

/// The bits of f16 1.0.
const F16_ONE: u16 = 0x3C00;

/// The cycles of [`ones_vertices`] over `rows` rows.
fn ones_cycles(fill_rows: &mut FormulaCost, rows: u32) -> u64 {
    let parts = rows.min(ipu_arch::WORKER_CONTEXTS);
    fill_rows.eval(&[("ROWS", rows.div_ceil(parts.max(1)) as i64), ("ITEMS", 1)])
        + launch_cycles(parts as u64)
}

/// The online softmax step of a causal key block on a tile whose rows are
/// queries `q0..q0 + rows` (counted with the keys before the first query)
/// and whose block holds keys `k0..k0 + bk`, padded to `bkp`: each
/// worker's rows (as `row_vertices` cuts them) at the kernel's per-row
/// cost for the keys each row sees, a row that sees none at its zero P
/// row's (19 issue slots and a store per padded key, `skip_row`). `acc`:
/// the plan accumulates into O; `first`: the rows' first block (FIRST).
fn causal_online_cycles(
    b: &AttentionBlock,
    k: &mut AttentionKernels,
    rows: u32,
    q0: u32,
    (k0, bk, bkp): (u32, u32, u32),
    (acc, first): (bool, bool),
) -> u64 {
    let dq = b.dqv() as i64;
    let parts = ranges(rows, rows.min(ipu_arch::WORKER_CONTEXTS));
    let (online, _) = k.online_and_final(acc);
    // The formula is a vertex's constant plus ROWS times a row's cost.
    let mut eval = |rows: i64, nk: u32| {
        online.1.eval(&[
            ("ROWS", rows),
            ("BK", nk as i64),
            ("BKP", bkp as i64),
            ("DQ", dq),
            ("FIRST", first as i64),
        ])
    };
    let vertex = eval(0, bk);
    let slowest = parts
        .iter()
        .map(|&(r0, r1)| {
            vertex
                + (r0..r1)
                    .map(|r| match (q0 + r + 1).saturating_sub(k0).min(bk) {
                        0 => 6 * (19 + bkp as u64),
                        nk => eval(1, nk) - vertex,
                    })
                    .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    slowest + launch_cycles(parts.len() as u64)
}

/// The (head, query block) of a row-layout unit `u`: numbered head first
/// (`h * query_blocks + qi`), or query block first (`qi * heads + h`) in
/// causal query rounds, so that a round runs the same query blocks of
/// every head (`lower_rows`).
fn unit_head_and_block(u: u32, heads: u32, query_blocks: u32, block_major: bool) -> (u32, u32) {
    if block_major {
        (u % heads, u / heads)
    } else {
        (u / query_blocks, u % query_blocks)
    }
}

/// The units of round `round`, `per_round` a round, `total` in all.
fn round_units(round: u32, per_round: u32, total: u32) -> std::ops::Range<u32> {
    (round * per_round)..((round + 1) * per_round).min(total)
}

/// The chunk (of `chunks`, ranges of key blocks) that holds key block
/// `block`.
fn chunk_of(chunks: &[(u32, u32)], block: usize) -> usize {
    chunks
        .iter()
        .position(|&(b0, b1)| (b0..b1).contains(&(block as u32)))
        .expect("the chunks cover the key blocks")
}

/// Keys that query blocks `blocks` (of `query_ranges`) see: with causal
/// masking those before the last one's last query plus the keys before
/// the first query (`sk - sq`), else all of them. A causal query round of
/// the row layout skips the key blocks from there on (`lower_rows`).
fn visible_keys(
    b: &AttentionBlock,
    query_ranges: &[(u32, u32)],
    blocks: impl Iterator<Item = u32>,
) -> u32 {
    if !b.causal {
        return b.sk;
    }
    let offset = b.sk - b.sq.min(b.sk);
    blocks
        .map(|qi| (query_ranges[qi as usize].1 + offset).min(b.sk))
        .max()
        .unwrap_or(b.sk)
}

/// How many of `key_blocks` (column blocks, in key order) a round whose
/// queries see `visible` keys runs: up to the last that starts before
/// them, at least one.
fn live_key_blocks(key_blocks: &[(u32, u32)], visible: u32) -> usize {
    key_blocks
        .iter()
        .take_while(|kb| kb.0 * 16 < visible)
        .count()
        .max(1)
}

/// Most rounds of query blocks a row plan takes: each round repeats every
/// step, so more would only grow the program for small query blocks.
pub const MAX_QUERY_ROUNDS: u32 = 16;

/// Region-0 bytes of one compute step of the row layout on a tile, its
/// supervisor code and its vertices' states, as measured: a 4096-token
/// attention in 8 key chunks of 4 blocks on 256 tiles holds 43,168 bytes
/// of code and states for its 130 compute steps and its projections.
const STEP_CODE_BYTES: u64 = 320;

/// A key blocking: the blocks of the first split, the chunks they move in
/// ([`AttentionPlan::key_chunks`]), the tile layout and its region-1 bytes.
type Blocking = (Vec<(u32, u32)>, u32, TileLayout, u64);

/// Key blockings of splits at most `split_cb` column blocks wide whose
/// buffers fit region 1 with `rows` query rows: the fewest blocks and up to
/// two more (smaller score buffers leave more memory to the projections'
/// weights, at the price of more launches), each moving in one chunk; for
/// each of `accs` (whether P V accumulates into O, [`AttentionPlan::acc`]),
/// the accumulating ones where they fit too.
///
/// Accumulating plans only join blockings found without them: their
/// region 0 is smaller, so they would fit in one chunk where the merge's
/// plans do not and keep [`plan`]'s second pass (key chunks) from running.
/// 1,024 tokens of 2 heads of 80 on 32 tiles then took 11 blocks of 48
/// keys in one chunk, estimated 676,176 compute cycles, where the second
/// pass finds 596,490 in four chunks.
fn key_blockings(
    b: &AttentionBlock,
    rows: u32,
    first: (u32, u32),
    (split_cb, min_split_cb): (u32, u32),
    splits: u32,
    accs: &[bool],
) -> Vec<Blocking> {
    let mut out = Vec::new();
    let mut found = 0;
    let blocking = |nblocks: u32, acc: bool| -> Option<Blocking> {
        let widest = split_cb.div_ceil(nblocks);
        let layout = TileLayout::new(b, rows, widest, split_cb, acc);
        let r1 = layout.region1(b)?;
        (layout.region0(splits) <= STANDARD_BUDGET / 2).then(|| {
            let blocks = ranges(first.1 - first.0, nblocks)
                .into_iter()
                .map(|(a, z)| (first.0 + a, first.0 + z))
                .collect();
            (blocks, 1, layout, r1)
        })
    };
    for nblocks in 1..=min_split_cb {
        if let Some(merging) = blocking(nblocks, false) {
            if accs.contains(&false) {
                out.push(merging);
            }
            if accs.contains(&true) {
                out.extend(blocking(nblocks, true));
            }
            found += 1;
            if found == 3 {
                break;
            }
        }
    }
    out
}

/// The widest key block and the widest chunk, in column blocks, of
/// `key_splits` each cut into `blocks` near-equal blocks moving in
/// `chunks` near-equal chunks of them ([`AttentionPlan::chunk_columns`]).
fn widest_block_and_chunk(key_splits: &[(u32, u32)], blocks: u32, chunks: u32) -> (u32, u32) {
    let (mut block_cb, mut chunk_cb) = (0, 0);
    for &(c0, c1) in key_splits {
        let split_blocks = ranges(c1 - c0, blocks);
        block_cb = split_blocks
            .iter()
            .map(|r| r.1 - r.0)
            .fold(block_cb, u32::max);
        for (b0, b1) in ranges(blocks, chunks) {
            chunk_cb = chunk_cb.max(split_blocks[b1 as usize - 1].1 - split_blocks[b0 as usize].0);
        }
    }
    (block_cb, chunk_cb)
}

/// Key blocks of 1, 2, 4 or 8 column blocks (and 3, 6, 12 and 16 when
/// `wide`) moving in two or more chunks of 32, 16, 8, 4, 2 or 1 blocks,
/// each whose buffers fit with `rows` query rows. They hold one chunk's
/// K^T and V at a time, so they fit where [`key_blockings`] finds nothing
/// (a long sequence on few tiles), and smaller chunks leave more room to
/// the projections, for a sync and an exchange step per chunk. Staged odd
/// heads take none: their V^T is transposed into V once, after the one
/// exchange.
///
/// Widths that are multiples of six column blocks let the scores GEMM of
/// about 100 query rows run one row group over six column groups, a weight
/// block per 100 rows where blocks of 8 take three row groups, and wider
/// blocks run the merge less often (session 58: 2,048 x 512 over inputs
/// on 64 tiles 5.7% faster with blocks of 12, the f32 attention of 1,024
/// tokens on 8 tiles 7.0% with blocks of 6 in two query rounds).
///
/// Each blocking comes once for each of `accs`: with P V accumulating
/// into O ([`AttentionPlan::acc`]) and without.
fn chunked_blockings(
    b: &AttentionBlock,
    rows: u32,
    key_splits: &[(u32, u32)],
    (first, splits): ((u32, u32), u32),
    wide: bool,
    accs: &[bool],
) -> Vec<Blocking> {
    let mut out = Vec::new();
    if b.staged() {
        return out;
    }
    let widths = key_splits.iter().map(|c| c.1 - c.0);
    let (split_cb, min_split_cb) = (widths.clone().max().unwrap_or(1), widths.min().unwrap_or(1));
    let block_widths: &[u32] = if wide {
        &[1, 2, 3, 4, 6, 8, 12, 16]
    } else {
        &[1, 2, 4, 8]
    };
    for &acc in accs {
        for &width in block_widths {
            let nblocks = split_cb.div_ceil(width);
            // Every split takes `nblocks` nonempty blocks; a wider block than
            // the split is the one-chunk case.
            if nblocks < 2 || nblocks > min_split_cb {
                continue;
            }
            for per_chunk in [32u32, 16, 8, 4, 2, 1] {
                let chunks = nblocks.div_ceil(per_chunk);
                if chunks < 2 {
                    continue;
                }
                let (block_cb, chunk_cb) = widest_block_and_chunk(key_splits, nblocks, chunks);
                let layout = TileLayout::new(b, rows, block_cb, chunk_cb, acc);
                let Some(r1) = layout.region1(b) else {
                    continue;
                };
                if layout.region0(splits) > STANDARD_BUDGET * 7 / 8 {
                    // The state does not depend on the chunks.
                    break;
                }
                // Few blocks give several chunk sizes the same chunks.
                if out.last().is_some_and(|o: &Blocking| {
                    o.0.len() as u32 == nblocks && o.1 == chunks && o.2.acc == acc
                }) {
                    continue;
                }
                let blocks = ranges(first.1 - first.0, nblocks)
                    .into_iter()
                    .map(|(a, z)| (first.0 + a, first.0 + z))
                    .collect();
                out.push((blocks, chunks, layout, r1));
            }
        }
    }
    out
}

/// Region 1 left free for region 0's overflow, sized by each plan's own
/// region 0 (`compile_from`'s reserve step): the program's other buffers
/// on the fullest tile overflowed region 0 by `others_excess` bytes
/// beside the plan that the first attempt ranked best, less that plan's
/// region 0 (negative when they leave the attention some of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverflowRoom {
    pub others_excess: i64,
    /// The most region-1 bytes every other segment leaves free for the
    /// overflow: a plan may need less of it, not more.
    pub reserve: u64,
}

impl OverflowRoom {
    /// Region-1 bytes, in whole memory elements, that a plan holding
    /// `region0` bytes of region 0 leaves free for what storage moves
    /// there out of region 0.
    pub fn needs(&self, region0: u64) -> u64 {
        let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
        let over = (region0 as i64).saturating_add(self.others_excess).max(0) as u64;
        over.div_ceil(element) * element
    }

    /// Whether a plan holding these bytes leaves that room within region
    /// 1 and the reserve.
    pub fn fits(&self, region1: u64, region0: u64) -> bool {
        let needs = self.needs(region0);
        needs <= self.reserve
            && region1 + needs <= (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64
    }
}

/// Candidate partitions of `block` over at most `tiles` tiles, best first:
/// query rows per tile, key splits over tiles (1, 2, 4 or 8) and key
/// blocks. `projection_cycles` (the projections' estimate, the same for
/// every candidate: they run before, on the same tiles) completes each
/// candidate's total.
/// Every candidate holds at most `region1_cap` bytes of region 1 a tile
/// (all of it unless a segment leaves room for what outlives it) and
/// `region0_cap` of region 0 (a segment leaves room for its joins); with
/// `room`, also leaves region 1 what its own region 0 pushes out of
/// region 0 ([`OverflowRoom::fits`]).
pub fn plan(
    block: &AttentionBlock,
    tiles: u32,
    kernels: &mut AttentionKernels,
    projection_cycles: u64,
    distributed_combine: bool,
    (region1_cap, region0_cap): (u64, u64),
    room: Option<OverflowRoom>,
) -> Vec<AttentionPlan> {
    // Plans that repeat their steps (key chunks, query rounds) count their
    // code in region 0 and may take seven eighths of it unless `compile`
    // has cut the attention's share.
    let repeats_cap = if region0_cap >= STANDARD_BUDGET / 2 {
        region0_cap.max(STANDARD_BUDGET * 7 / 8)
    } else {
        region0_cap
    };
    let fits = |p: &AttentionPlan| {
        let cap = if p.key_chunks > 1 || p.query_rounds {
            repeats_cap
        } else {
            region0_cap
        };
        p.region1_bytes <= region1_cap
            && p.region0_bytes <= cap
            && room.is_none_or(|r| r.fits(p.region1_bytes, p.region0_bytes))
    };
    // Blocks of 3, 6, 12 and 16 column blocks join the chunked plans
    // unless the retry chain (`compile_from`) has cut this segment's
    // region 0 or region 1. A segmented model's reserve steps grow a
    // fixed region-1 reserve while region 0 overflows, and a plan of more
    // query rounds holds more code, which no region-1 room takes out of
    // region 0: with them there, a 2-tile model of three attention
    // segments (fuzz seed 26683) went from a plan to a region-0
    // limitation (each segment's code stays for the whole program, so the
    // others' rounds grew with its own), where the narrower widths alone
    // find one. A model of one segment sizes each plan's room by its own
    // region 0 (`room`) and keeps them.
    let unlimited = region1_cap >= (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64
        && region0_cap >= STANDARD_BUDGET / 2;
    let mut out = Vec::new();
    let ncb = block.key_blocks();
    // Row plans with P V accumulating into O compete with those of a
    // merge step where the kernels allow: they keep O in region 1, which
    // few-tile plans may need for their keys.
    let accs: &[bool] = match (kernels.acc.is_some(), kernels.acc_only) {
        (true, true) => &[true],
        (true, false) => &[false, true],
        (false, _) => &[false],
    };
    // The second, "stretched" pass runs only when no row or column plan of
    // the first fits (a long sequence on few tiles): its row plans move
    // their keys in chunks, and with one key split may also run the query
    // blocks of a head in rounds. (As competitors of the first pass's
    // plans they lose where it matters: BERT-large at 2048 tokens took a
    // chunked plan beside its projections, 1,129,672 estimated cycles,
    // where its projections in segments of their own give 963,453.)
    for stretched in [false, true] {
        if stretched {
            let AttentionKernels { fill, columns, .. } = &mut *kernels;
            if let Some(ck) = columns.as_mut() {
                out.extend(crate::attention_cols::plan(
                    block,
                    tiles,
                    &mut fill.1,
                    ck,
                    projection_cycles,
                    distributed_combine,
                    region1_cap,
                ));
            }
            if out.iter().any(fits) {
                break;
            }
        }
        for splits in [1u32, 2, 4, 8].into_iter().filter(|&s| s <= ncb) {
            // Staged odd heads' Q^T rows have a stride by the block's
            // queries, which query rounds would change from round to round.
            for query_rounds in [false, true] {
                if query_rounds && (!stretched || splits > 1 || block.staged()) {
                    continue;
                }
                let key_splits = ranges(ncb, splits);
                let split_cb = key_splits.iter().map(|c| c.1 - c.0).max().unwrap_or(1);
                let min_split_cb = key_splits.iter().map(|c| c.1 - c.0).min().unwrap_or(1);
                let widest_split = *key_splits
                    .iter()
                    .max_by_key(|c| (c.1 - c.0, u32::MAX - c.0))
                    .expect("splits");
                let mut seen = std::collections::BTreeSet::new();
                for qb in 1..=block.sq {
                    // Staged odd heads take query blocks on even queries
                    // (`even_ranges`), at least two queries each so that every
                    // block is nonempty.
                    if block.staged() && qb > (block.sq / 2).max(1) {
                        break;
                    }
                    let rows = if block.staged() {
                        even_ranges(block.sq, qb)
                            .iter()
                            .map(|r| r.1 - r.0)
                            .max()
                            .unwrap_or(1)
                    } else {
                        block.sq.div_ceil(qb)
                    };
                    // With fewer tiles than heads the heads run in rounds on the
                    // same tiles (and only then: with a tile per head one round
                    // is what the plans compare).
                    let per_unit = qb * splits;
                    let (rounds, attention_tiles) = if query_rounds {
                        // Rounds of `attention_tiles` units (head, query block),
                        // one tile each ([`AttentionPlan::rounds`]).
                        let units = block.heads * qb;
                        let rounds = units.div_ceil(tiles);
                        if !(2..=MAX_QUERY_ROUNDS).contains(&rounds) {
                            continue;
                        }
                        (rounds, units.div_ceil(rounds))
                    } else {
                        let rounds = if block.heads > tiles && per_unit <= tiles {
                            block.heads.div_ceil(tiles / per_unit)
                        } else {
                            1
                        };
                        (rounds, block.heads.div_ceil(rounds) * per_unit)
                    };
                    // Rounds keep each (head, query block) on one tile: splitting
                    // its keys over tiles would only add rounds (and a combine).
                    if attention_tiles > tiles || (rounds > 1 && splits > 1) || !seen.insert(rows) {
                        continue;
                    }
                    // The first pass takes the keys in one chunk; the second in
                    // chunks, and with query rounds in either.
                    let whole = if !stretched || query_rounds {
                        key_blockings(
                            block,
                            rows,
                            widest_split,
                            (split_cb, min_split_cb),
                            splits,
                            accs,
                        )
                    } else {
                        Vec::new()
                    };
                    let chunked = if stretched {
                        chunked_blockings(
                            block,
                            rows,
                            &key_splits,
                            (widest_split, splits),
                            unlimited,
                            accs,
                        )
                    } else {
                        Vec::new()
                    };
                    let blockings = whole.into_iter().chain(chunked);
                    for (key_blocks, chunks, layout, r1) in blockings {
                        // With `acc` P V's row groups are those of the
                        // widest block (the cost takes the widest split's).
                        let widest_block = key_blocks.iter().map(|c| c.1 - c.0).max();
                        let acc = widest_block.filter(|_| layout.acc);
                        let (mut compute, per_step) = compute_cycles(
                            block,
                            kernels,
                            rows,
                            &key_blocks,
                            layout.split_cb,
                            acc,
                            true,
                        );
                        // Every attention tile receives its split's K^T and V and
                        // its Q rows; with splits, a combine exchange and steps.
                        let keys = (split_cb * 16).min(block.sk) as u64;
                        let eb = block.eb() as u64;
                        let received = keys * (block.d + block.dv) as u64 * eb
                            + rows as u64 * block.d as u64 * eb;
                        // Each chunk is an exchange step of its own (the chunks'
                        // receives sum to the split's keys).
                        let mut exchange = chunks as u64 * ipu_arch::SYNC_CYCLES
                            + received.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
                        if splits > 1 {
                            let state = (splits as u64 - 1)
                                * rows as u64
                                * (layout.o_row_bytes() as u64 + 8);
                            exchange += ipu_arch::SYNC_CYCLES
                                + state.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
                            let per_vertex = rows.div_ceil(6) as i64;
                            let dq = combine_quads(block, layout.acc) as i64;
                            compute += (splits as u64 - 1)
                                * (kernels.combine.1.eval(&[("ROWS", per_vertex), ("DQ", dq)])
                                    + launch_cycles(rows.min(6) as u64));
                        }
                        // Each round exchanges and computes again; the tiles'
                        // region-0 state serves every round, and each round adds
                        // its result rows. Causal query rounds (one split) run
                        // only their visible key blocks and chunks
                        // (`lower_rows`).
                        let (compute, exchange) = if query_rounds && block.causal {
                            let query_ranges = ranges(block.sq, qb);
                            let chunk_ranges = ranges(key_blocks.len() as u32, chunks);
                            let (mut c, mut x) = (0, 0);
                            for r in 0..rounds {
                                let visible = visible_keys(
                                    block,
                                    &query_ranges,
                                    round_units(r, attention_tiles, block.heads * qb)
                                        .map(|u| unit_head_and_block(u, block.heads, qb, true).1),
                                );
                                let live = live_key_blocks(&key_blocks, visible);
                                let live_chunks = chunk_of(&chunk_ranges, live - 1) + 1;
                                c += per_step[0]
                                    + per_step[1..1 + 4 * live].iter().sum::<u64>()
                                    + per_step[per_step.len() - 1];
                                let last_block = chunk_ranges[live_chunks - 1].1 as usize - 1;
                                let keys_r = (key_blocks[last_block].1 * 16).min(block.sk) as u64;
                                let received_r = keys_r * (block.d + block.dv) as u64 * eb
                                    + rows as u64 * block.d as u64 * eb;
                                x += live_chunks as u64 * ipu_arch::SYNC_CYCLES
                                    + received_r
                                        .div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
                            }
                            (c, x)
                        } else {
                            (compute * rounds as u64, exchange * rounds as u64)
                        };
                        let mut region0 = layout.region0(splits)
                            + (rounds as u64 - 1) * rows as u64 * layout.rs_out as u64;
                        // Key chunks and query rounds repeat the steps of a key
                        // block many times, and every step's code and vertex
                        // states stay in region 0: those plans count them, in
                        // seven eighths of region 0 (the others' few steps
                        // fit in the half of region 0 their state leaves).
                        if chunks > 1 || query_rounds {
                            let per_block = if layout.acc { 3 } else { 4 };
                            let steps = rounds as u64 * (per_block * key_blocks.len() as u64 + 2);
                            region0 += steps * STEP_CODE_BYTES;
                            if region0 > STANDARD_BUDGET * 7 / 8 {
                                continue;
                            }
                        }
                        out.push(AttentionPlan {
                            layout: AttentionLayout::Rows,
                            query_blocks: qb,
                            rows,
                            key_splits: key_splits.clone(),
                            block_splits: Vec::new(),
                            key_blocks: {
                                // The blocks of split 0 (the cost used the widest split).
                                let (c0, c1) = key_splits[0];
                                ranges(c1 - c0, key_blocks.len() as u32)
                                    .into_iter()
                                    .map(|(a, z)| (c0 + a, c0 + z))
                                    .collect()
                            },
                            tiles: attention_tiles,
                            compute_cycles: compute,
                            exchange_bound_cycles: exchange,
                            projection_cycles,
                            prefix_cycles: per_step[0],
                            region1_bytes: r1,
                            region0_bytes: region0,
                            distributed_combine: false,
                            rounds,
                            compact: false,
                            projections_planned_over: None,
                            key_chunks: chunks,
                            query_rounds,
                            acc: layout.acc,
                        });
                    }
                }
            }
        }
    }
    out.retain(fits);
    out.sort_by_key(|p| (p.total_cycles(), p.tiles, p.key_blocks.len()));
    out
}

/// Buffers of one attention tile (indices into its buffer list).
struct TileBuffers {
    q: usize,
    kt: usize,
    v: usize,
    /// Staged odd heads (`AttentionBlock::staged`): the received Q^T and
    /// V^T.
    qt: Option<usize>,
    vt: Option<usize>,
    s: usize,
    s2: usize,
    p: usize,
    /// O: in region 0, or with [`AttentionPlan::acc`] a C buffer in P
    /// V's layout.
    o: usize,
    /// With `acc`: the P V GEMM's row groups, which fix where O's rows
    /// lie in its buffer ([`c_row`]).
    o_acc: Option<Vec<(u32, u32)>>,
    ml: usize,
    /// The online step's rescaling factors for the merge (not with `acc`).
    alpha: Option<usize>,
    out: usize,
    /// Eight bytes per online vertex (its (-m', -m') pair).
    scratch: usize,
    /// On a split-0 tile: (O, (m, l)) received from each other key split.
    others: Vec<(usize, usize)>,
}

/// The quads of O's rows that `attention_combine` folds: v's head, and
/// with the ones column in a plan that accumulates into O
/// ([`AttentionPlan::acc`]) the quad that holds l, which the combine then
/// folds as it folds O (l' = l a + l2 b).
fn combine_quads(b: &AttentionBlock, acc: bool) -> u32 {
    b.dqv() + (acc && b.ones) as u32
}

/// O's rows from row `r0` as the online step (which rescales them with
/// [`AttentionPlan::acc`]), the combine and the final read them: the
/// address of row `r0` and the row stride. With `acc` the rows lie in P
/// V's C layout, junk rows between its row groups, and a vertex's rows
/// (one of six ranges, [`row_vertices`]) nest in one row group, so they
/// are evenly spaced.
fn o_rows(t: &TileBuffers, lay: &TileLayout, r0: u32) -> (StateWord, u32) {
    let buffer = t.o;
    match &t.o_acc {
        Some(o_rows) => (
            StateWord::Addr {
                buffer,
                offset: c_row(o_rows, r0, lay.rs_pv),
            },
            lay.rs_pv,
        ),
        None => (
            StateWord::Addr {
                buffer,
                offset: r0 * lay.rs_o,
            },
            lay.rs_o,
        ),
    }
}

/// One vertex of `kernel` per part of `rows` (at most one per worker), its
/// state `state(worker, first row, end row)`.
fn row_vertices(
    rows: u32,
    kernel: &KernelRequest,
    state: impl Fn(u32, u32, u32) -> Vec<StateWord>,
) -> Vec<Vertex> {
    ranges(rows, rows.min(ipu_arch::WORKER_CONTEXTS))
        .iter()
        .enumerate()
        .map(|(w, &(r0, r1))| Vertex {
            kernel: std::sync::Arc::new(kernel.clone()),
            state: state(w as u32, r0, r1),
        })
        .collect()
}

/// An attention exchange moves whole 4-byte words: the first transfer
/// whose bytes, source or a destination offset is not is a lowering bug.
pub(crate) fn check_word_aligned(transfers: &[BufferTransfer]) -> Result<(), CompileError> {
    for t in transfers {
        let aligned = t.bytes % 4 == 0
            && t.source.offset % 4 == 0
            && t.destinations.iter().all(|x| x.offset % 4 == 0);
        if !aligned {
            return Err(CompileError::Verifier {
                phase: "lower",
                message: format!(
                    "attention transfer from tile {} offset {} ({} bytes) is not word aligned",
                    t.source.tile, t.source.offset, t.bytes
                ),
            });
        }
    }
    Ok(())
}

/// Transposes a projection's result shard of `eb`-byte elements on its
/// tile (`transpose_f16` or `transpose_f32`, one vertex per range of
/// columns) into a new buffer `buffer_name` whose rows (the shard's
/// columns) are padded with zeros to 8 bytes, so that the exchange moves
/// runs of the shard's rows in 4-byte words. `what` names the projection
/// in the error for an f16 shard starting on an odd row. Returns the
/// buffer, its row stride, the vertices and their estimated cycles.
pub(crate) fn transpose_shard(
    l: &mut Lowered,
    tile: u32,
    (r, eb): (&crate::lower::GroupResult, u32),
    buffer_name: &str,
    what: &str,
    transpose: &mut (KernelRequest, FormulaCost),
) -> Result<(usize, u32, Vec<Vertex>, u64), CompileError> {
    let (r0, r1) = r.rows;
    let mt = r1 - r0;
    if eb == 2 && r0 % 2 != 0 {
        return Err(CompileError::Verifier {
            phase: "lower",
            message: format!("{what} projection rows on tile {tile} start at odd row {r0}"),
        });
    }
    let rs = transposed_row_stride(mt, eb);
    let bufs = l.buffers.get_mut(&tile).expect("projection tiles exist");
    let zero: Vec<(u32, u32)> = (0..r.width)
        .map(|c| (c * rs + mt * eb, (c + 1) * rs))
        .filter(|z| z.0 < z.1)
        .collect();
    bufs.push(BufferSpec {
        name: buffer_name.to_string(),
        bytes: r.width * rs,
        align: 8,
        region: RegionReq::Any,
        exclusive_element: false,
        zero,
        category: "attention_operand".into(),
        scratch: None,
        lifetime: None,
        kernel_segment: None,
    });
    let tb = bufs.len() - 1;
    let parts = transpose_column_ranges(r.width);
    let mut slowest = 0;
    let vertices = parts
        .iter()
        .map(|&cols| {
            let (v, cycles) =
                transpose_vertex(transpose, eb, (r.buffer, r.row_stride), (tb, rs), mt, cols);
            slowest = slowest.max(cycles);
            v
        })
        .collect();
    Ok((
        tb,
        rs,
        vertices,
        slowest + launch_cycles(parts.len() as u64),
    ))
}

/// The column ranges of a `width`-column shard that [`transpose_shard`]
/// gives its vertices: one per worker at most.
pub(crate) fn transpose_column_ranges(width: u32) -> Vec<(u32, u32)> {
    ranges(width, width.min(ipu_arch::WORKER_CONTEXTS))
}

/// What [`transpose_shard`] runs on a shard of `rows` x `width`: its
/// vertex count and the slowest vertex's formula cycles (launches left to
/// the caller), for plans that weigh the transpose before lowering.
pub(crate) fn transpose_shard_slowest(
    formula: &mut FormulaCost,
    rows: u32,
    width: u32,
) -> (u64, u64) {
    let parts = transpose_column_ranges(width);
    let slowest = parts
        .iter()
        .map(|&(c0, c1)| formula.eval(&[("ROWS", rows as i64), ("COLS", (c1 - c0) as i64)]))
        .max()
        .unwrap_or(0);
    (parts.len() as u64, slowest)
}

/// One `transpose_f16` (`eb` = 2) or `transpose_f32` (4) vertex: columns
/// `c0..c1` of the matrix of `rows` rows in `(buffer, row stride)` `from`
/// become rows `c0..c1` of `to`; with its estimated cycles.
pub(crate) fn transpose_vertex(
    transpose: &mut (KernelRequest, FormulaCost),
    eb: u32,
    (from, rs_from): (usize, u32),
    (to, rs_to): (usize, u32),
    rows: u32,
    (c0, c1): (u32, u32),
) -> (Vertex, u64) {
    let cycles = transpose
        .1
        .eval(&[("ROWS", rows as i64), ("COLS", (c1 - c0) as i64)]);
    let vertex = Vertex {
        kernel: std::sync::Arc::new(transpose.0.clone()),
        state: vec![
            StateWord::Addr {
                buffer: from,
                offset: c0 * eb,
            },
            StateWord::Const(rs_from),
            StateWord::Addr {
                buffer: to,
                offset: c0 * rs_to,
            },
            StateWord::Const(rs_to),
            StateWord::Const(rows),
            StateWord::Const(c1 - c0),
        ],
    };
    (vertex, cycles)
}

/// Rows of one home of a host operand ([`host_homes`]) unless a third of
/// the tiles needs more each. The attention's exchange moves a home's
/// transposed columns as runs of these rows, one transfer each, so the
/// transfer count (which the scheduler's time follows) falls as homes get
/// taller, while the transpose on the home (`transpose_f16`: 16 bundles
/// per column plus 5 per four rows) stays short because a home holds few
/// heads' columns.
pub const HOST_HOME_ROWS: u32 = 16;

/// Places the host operands of `block` (`block.host`) in pieces, the
/// *homes*, on tiles `0..tile_count`: operand i (q, k, v) starts at tile
/// `i * tile_count / 3`; a home holds an even number of whole rows (at
/// least [`HOST_HOME_ROWS`] unless a third of the tiles needs more each,
/// so that every run of keys or queries the exchange moves starts on a
/// 4-byte word) of a range of whole heads, as few heads as a third of the
/// tiles allows (a home's transpose costs 16 bundles per column: one home
/// of 16 SigLIP rows with all 1152 columns took 41,500 cycles). The host
/// writes each operand once (an input read as several operands once in
/// all), one placement per row of a home; the homes
/// are filed in `group_results` under the block's pseudo-group indices,
/// where the attention's exchange reads them as it reads a projection's
/// result rows. Adds the buffers to `buffers` and the placements to
/// `tensors`.
pub(crate) fn host_homes(
    graph: &Graph,
    block: &AttentionBlock,
    tile_count: u32,
    transposed_roles: [bool; 3],
    buffers: &mut BTreeMap<u32, Vec<BufferSpec>>,
    tensors: &mut crate::lower::HostTensors,
) -> Result<HostHomes, CompileError> {
    let mut results = BTreeMap::new();
    let mut transposed_tensors = std::collections::BTreeSet::new();
    let Some(values) = block.host else {
        return Ok((results, transposed_tensors));
    };
    let third = (tile_count / 3).max(1);
    for (i, (&value, (group, role))) in values
        .iter()
        .zip([(block.q, "q"), (block.k, "k"), (block.v, "v")])
        .enumerate()
    {
        // An input read as several operands (self-attention straight over
        // `x`) is written once: the later operands take the first one's
        // homes.
        if let Some(j) = values[..i].iter().position(|&w| w == value) {
            let earlier = [block.q, block.k, block.v][j];
            let shared: Vec<_> = results
                .iter()
                .filter(|((g, _), _)| *g == earlier)
                .map(|(&(_, tile), &r)| (tile, r))
                .collect();
            for (tile, r) in shared {
                results.insert((group, tile), r);
            }
            continue;
        }
        let rows = if role == "q" { block.sq } else { block.sk };
        let d = if role == "v" { block.dv } else { block.d };
        let eb = block.eb();
        // A value every role of which wants it transposed is written so.
        let transposed = (0..3).all(|j| values[j] != value || transposed_roles[j]);
        // A head of odd size, written as rows, is a home of its own, its
        // rows padded with a zero to whole words, so that the exchange
        // moves it whole; its row pieces are then counted per head (at
        // most one home of an operand per tile), and it needs a tile per
        // head.
        let home_per_head = eb == 2 && d % 2 != 0 && !transposed;
        if home_per_head && block.heads > tile_count {
            return Err(CompileError::NoFeasiblePlan {
                value: graph.value(block.attention).name.clone(),
                reason: format!(
                    "heads of odd size {d} over inputs are written one head per tile (rows padded to whole words), and {} heads run on {tile_count} tiles",
                    block.heads
                ),
            });
        }
        let pieces_max = if home_per_head {
            (tile_count / block.heads).max(1)
        } else {
            third
        };
        let (per_home, heads_per_home) = if home_per_head {
            (home_rows(rows, pieces_max), 1)
        } else {
            let keys = role != "q";
            let shape = home_shape(rows, block.heads, third, keys);
            // On few tiles a third of them cannot hold an operand in
            // homes of region 0's size: its homes then take every tile
            // (from the operand's first, wrapping around), beside the
            // other operands' homes.
            if shape.0 * shape.1 * d * eb > SPREAD_HOMES_ABOVE_BYTES && tile_count > third {
                home_shape(rows, block.heads, tile_count, keys)
            } else {
                shape
            }
        };
        let v = graph.value(value);
        let tensor = HostTensor {
            name: v.name.clone(),
            ty: v.ty.clone(),
            placements: Vec::new(),
        };
        let map = if v.def == ValueDef::Param {
            &mut tensors.params
        } else {
            &mut tensors.inputs
        };
        let first = i as u32 * tile_count / 3;
        let mut home = 0u32;
        for r0 in (0..rows).step_by(per_home as usize) {
            let r1 = (r0 + per_home).min(rows);
            for h0 in (0..block.heads).step_by(heads_per_home as usize) {
                let h1 = (h0 + heads_per_home).min(block.heads);
                let width = (h1 - h0) * d;
                // Rows of whole words, or, transposed, columns (runs of
                // rows) of whole 8-byte words as `transpose_shard` writes
                // them; the padding is zero from load and never written.
                let (lines, line_bytes) = if transposed {
                    (width, (r1 - r0) * eb)
                } else {
                    (r1 - r0, width * eb)
                };
                let row_stride = round_up(line_bytes, if transposed { 8 } else { 4 });
                let tile = (first + home) % tile_count;
                home += 1;
                let bufs = buffers.entry(tile).or_default();
                bufs.push(BufferSpec {
                    name: format!("{}.{role}_home{r0}_{h0}", v.name),
                    bytes: lines * row_stride,
                    align: 8,
                    region: RegionReq::Any,
                    exclusive_element: false,
                    zero: (0..lines)
                        .map(|r| (r * row_stride + line_bytes, (r + 1) * row_stride))
                        .filter(|z| z.0 < z.1)
                        .collect(),
                    category: "attention_operand".into(),
                    scratch: None,
                    lifetime: None,
                    kernel_segment: None,
                });
                let buffer = bufs.len() - 1;
                let placements: Vec<HostPlacement> = if transposed {
                    // The host writes the tensor transposed (its last two
                    // axes swapped): column c of the merged view, either
                    // layout, is the run of rows at (c * rows + r) * eb.
                    transposed_tensors.insert(v.name.clone());
                    (h0 * d..h1 * d)
                        .map(|c| HostPlacement {
                            tile,
                            buffer,
                            buffer_offset: (c - h0 * d) * row_stride,
                            host_offset: (c as u64 * rows as u64 + r0 as u64) * eb as u64,
                            bytes: (r1 - r0) * eb,
                        })
                        .collect()
                } else {
                    // Each row's run of each head (contiguous in either
                    // layout).
                    let heads_major = block.host_heads_major[i];
                    let mut coalesced = Vec::new();
                    for r in r0..r1 {
                        for h in h0..h1 {
                            crate::lower::push_coalesced(
                                &mut coalesced,
                                HostPlacement {
                                    tile,
                                    buffer,
                                    buffer_offset: (r - r0) * row_stride + (h - h0) * d * eb,
                                    host_offset: view_offset(
                                        heads_major,
                                        eb,
                                        (rows, block.heads, d),
                                        r,
                                        h * d,
                                    ),
                                    bytes: d * eb,
                                },
                            );
                        }
                    }
                    coalesced
                };
                crate::lower::HostTensors::place(map, &tensor, placements);
                let previous = results.insert(
                    (group, tile),
                    crate::lower::GroupResult {
                        buffer,
                        row_stride,
                        rows: (r0, r1),
                        col0: h0 * d,
                        width,
                        transposed,
                    },
                );
                assert!(
                    previous.is_none(),
                    "at most one home of an operand per tile ({} homes on {tile_count} tiles)",
                    home
                );
            }
        }
    }
    Ok((results, transposed_tensors))
}

/// Bytes of one home above which an operand's homes spread over every
/// tile instead of a third of them ([`host_homes`]): a quarter of region
/// 0's budget, so that the three operands' homes and the attention's state
/// fit beside each other.
const SPREAD_HOMES_ABOVE_BYTES: u32 = (STANDARD_BUDGET / 4) as u32;

/// The fewest rows of a home (even, at least [`HOST_HOME_ROWS`] unless the
/// operand has fewer) with which `rows` rows fit `pieces` homes.
fn home_rows(rows: u32, pieces: u32) -> u32 {
    round_up(rows.div_ceil(pieces).max(HOST_HOME_ROWS).min(rows), 2)
}

/// The (rows, heads) of one home when an operand of `rows` rows and
/// `heads` heads is cut into at most `pieces` homes: the shape that makes
/// the largest home smallest, and of those the tallest (fewer transfers).
/// The home and its transposed copy both stay on the home's tile, so its
/// size is what the tile pays: Llama-2-7B's q (2048 rows, 32 heads) on 490
/// tiles took homes of 16 rows of 11 heads (45,056 bytes) on 384 of them
/// with the fewest rows first, and takes 34 rows of 4 heads (34,816 bytes)
/// on 488 this way.
fn home_shape(rows: u32, heads: u32, pieces: u32, keys: bool) -> (u32, u32) {
    let lowest = home_rows(rows, pieces);
    let mut best: Option<(u64, u32, u32)> = None;
    // Keys' homes may hold all of an odd row count (homes hold even rows,
    // so the tallest is a row taller than the operand): without it, 589
    // keys of 4 heads on 4 tiles took homes of 296 rows of 2 heads, and
    // each key chunk's rows sat on two tiles that sent them for all four
    // heads (3.5% of seed 23654's cycles). Queries keep the shorter homes:
    // a round's query blocks of one head then come from several tiles.
    let tallest = if keys { round_up(rows, 2) } else { rows };
    for p in (lowest..=tallest.max(lowest)).step_by(2) {
        let groups = (pieces / rows.div_ceil(p)).min(heads);
        if groups == 0 {
            continue;
        }
        let hp = heads.div_ceil(groups);
        let size = p.min(rows) as u64 * hp as u64;
        // Taller homes come later, so a tie goes to them.
        if best.is_none_or(|(s, _, _)| size <= s) {
            best = Some((size, p, hp));
        }
    }
    let (_, p, hp) = best.expect("the lowest rows fit the pieces");
    (p, hp)
}

/// What [`host_homes`] places: the homes by (pseudo-group, tile), and the
/// host tensors it writes transposed.
pub(crate) type HostHomes = (
    BTreeMap<(usize, u32), crate::lower::GroupResult>,
    std::collections::BTreeSet<String>,
);

/// Per tile, the (buffer, row stride) of a projection shard's transpose.
type TransposedShards = BTreeMap<u32, (usize, u32)>;

/// Splits `n` items into `parts` contiguous ranges whose starts are even,
/// near-equal, dropping empty ones.
fn even_ranges(n: u32, parts: u32) -> Vec<(u32, u32)> {
    let cut = |i: u32| if i >= parts { n } else { (i * n / parts) & !1 };
    (0..parts)
        .map(|i| (cut(i), cut(i + 1)))
        .filter(|(a, z)| z > a)
        .collect()
}

/// The row stride of a shard of `rows` rows of `eb`-byte elements
/// transposed by [`transpose_shard`]: each of its rows (a column of the
/// shard) padded with zeros to 8 bytes.
pub(crate) fn transposed_row_stride(rows: u32, eb: u32) -> u32 {
    round_up(rows * eb, 8)
}

/// One range to fill: (buffer, offset, bytes, lo, hi).
pub type FillJob = (usize, u32, u32, u32, u32);

/// `fill64` vertex states for `jobs`: the items cut into six equal shares,
/// one vertex (a list of ranges) per share. Returns the states and the
/// slowest vertex's formula cycles.
pub fn fill_vertices(jobs: &[FillJob], fill: &mut FormulaCost) -> (Vec<Vec<StateWord>>, u64) {
    let total: u32 = jobs.iter().map(|r| r.2 / 8).sum();
    let share = total.div_ceil(ipu_arch::WORKER_CONTEXTS).max(1);
    let mut vertices: Vec<Vec<StateWord>> = Vec::new();
    let mut current: Vec<StateWord> = Vec::new();
    let (mut in_current, mut ranges_in_current) = (0u32, 0u32);
    let mut slowest = 0u64;
    for &(buffer, offset, bytes, lo, hi) in jobs {
        let mut done = 0;
        while done < bytes / 8 {
            let take = (bytes / 8 - done).min(share - in_current);
            current.extend([
                StateWord::Addr {
                    buffer,
                    offset: offset + 8 * done,
                },
                StateWord::Const(take),
                StateWord::Const(lo),
                StateWord::Const(hi),
            ]);
            ranges_in_current += 1;
            in_current += take;
            done += take;
            if in_current == share {
                slowest = slowest.max(fill.eval(&[
                    ("N", ranges_in_current as i64),
                    ("COUNT", in_current as i64),
                ]));
                let mut state = vec![StateWord::Const(ranges_in_current)];
                state.append(&mut current);
                vertices.push(state);
                in_current = 0;
                ranges_in_current = 0;
            }
        }
    }
    if ranges_in_current > 0 {
        slowest = slowest.max(fill.eval(&[
            ("N", ranges_in_current as i64),
            ("COUNT", in_current as i64),
        ]));
        let mut state = vec![StateWord::Const(ranges_in_current)];
        state.append(&mut current);
        vertices.push(state);
    }
    (vertices, slowest)
}

/// Supervisor cycles around a compute step of `n` vertices inside a call,
/// under the supervisor runtime (device/supervisor.S, docs/runtime.md): the
/// step's record loads its entry and states in the shadow of the previous
/// step's workers, so after the `wsync` the `run`s follow 12 cycles apart and
/// the last worker's first issue lags its `run` by up to 6 cycles (slot
/// alignment). Measured by tests/supervisor_runtime.rs; the GEMM planner's
/// `plan::supervisor_cycles` covers a call's first step, which also pays
/// the dispatch.
pub fn launch_cycles(n: u64) -> u64 {
    12 * n.saturating_sub(1) + 6
}

fn round_up(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

/// Appends the attention block to `l` (see the module documentation).
/// `exchange_label` numbers the exchange step in the scheduler's log.
/// `whole_program`: `l` is the whole program, not a segment's (whose
/// buffers live only while the segment runs), so the column layout may
/// keep its operands' padding from load (`attention_cols::lower`).
#[allow(clippy::too_many_arguments)]
pub fn lower(
    graph: &Graph,
    block: &AttentionBlock,
    plan: &AttentionPlan,
    kernels: &mut AttentionKernels,
    l: &mut Lowered,
    exchange_label: u32,
    whole_program: bool,
) -> Result<(), CompileError> {
    if plan.layout == AttentionLayout::Columns {
        let AttentionKernels {
            fill,
            columns,
            transpose,
            ..
        } = kernels;
        let ck = columns.as_mut().ok_or_else(|| CompileError::Verifier {
            phase: "lower",
            message: "a column-layout attention plan without the column kernels".into(),
        })?;
        return crate::attention_cols::lower(
            graph,
            block,
            plan,
            transpose,
            fill,
            ck,
            l,
            exchange_label,
            whole_program,
        );
    }
    // With fewer tiles than heads the heads run in rounds on the same
    // tiles, one after the other (`AttentionPlan::rounds`).
    for round in 0..plan.rounds.max(1) {
        let label = if round == 0 {
            exchange_label
        } else {
            l.exchange_steps()
        };
        lower_rows(graph, block, plan, kernels, l, label, round)?;
    }
    Ok(())
}

/// Round `round` of a row-layout attention: its heads on tiles
/// `0..plan.tiles`. The first round transposes K on its homes and every
/// later one reads those transposes; a later round's tiles reuse the
/// first's buffers (the fill step resets the state each round) except the
/// result rows, which the host reads at the end of the call.
fn lower_rows(
    graph: &Graph,
    block: &AttentionBlock,
    plan: &AttentionPlan,
    kernels: &mut AttentionKernels,
    l: &mut Lowered,
    exchange_label: u32,
    round: u32,
) -> Result<(), CompileError> {
    let b = block;
    // A round runs `plan.tiles / splits` units (head, query block), unit
    // `h * query_blocks + b`, in order: whole heads when the heads are
    // more than the tiles, query blocks of a head otherwise
    // ([`AttentionPlan::rounds`]).
    // Causal query rounds number their units query block first
    // (`qi * heads + h`), so that a round runs the same query blocks of
    // every head and the key blocks after its last query are hidden from
    // all its tiles: the round skips them (below).
    let splits = plan.key_splits.len() as u32;
    let per_round = plan.tiles / splits;
    let units = round_units(round, per_round, b.heads * plan.query_blocks);
    let block_major = b.causal && plan.query_rounds;
    let unit_of = |h: u32, qi: u32| -> u32 {
        if block_major {
            qi * b.heads + h
        } else {
            h * plan.query_blocks + qi
        }
    };
    let head_and_block = |u: u32| unit_head_and_block(u, b.heads, plan.query_blocks, block_major);
    // The tile of (global head h, query block, split) in this round, if
    // the round runs that unit.
    let unit_tile = |h: u32, qi: u32, ks: u32| -> Option<u32> {
        let u = unit_of(h, qi);
        units.contains(&u).then(|| (u - units.start) * splits + ks)
    };
    let name = graph.value(b.attention).name.clone();
    let y_name = graph.value(b.result).name.clone();
    let compute_step = |phase: String| Step::empty(name.clone(), phase);
    // q and k's head size (the scores' K) and v's (O's columns).
    let (d, dp, dv, dq) = (b.d, b.dp(), b.dv, b.dqv());
    let qranges = plan.query_ranges(b);
    // The column blocks of keys a tile's K^T and V hold at once: its
    // widest chunk (its split with one chunk).
    let hold_cb = plan.chunk_cb();
    let chunks = plan.chunk_ranges();
    let widest = (0..plan.key_splits.len())
        .flat_map(|k| plan.blocks_of(k))
        .map(|c| c.1 - c.0)
        .max()
        .unwrap_or(1);
    // The first key of split `ks` and its key count.
    let split_keys = |ks: u32| -> (u32, u32) {
        let (c0, c1) = plan.key_splits[ks as usize];
        (c0 * 16, (c1 * 16).min(b.sk) - c0 * 16)
    };
    let mut tiles: BTreeMap<u32, (u32, u32, u32, TileBuffers, TileLayout)> = BTreeMap::new();
    let spec = |role: &str,
                bytes: u32,
                region: RegionReq,
                exclusive: bool,
                zero: Vec<(u32, u32)>,
                category: &str| BufferSpec {
        name: format!("{name}.{role}"),
        bytes,
        align: if region == RegionReq::Interleaved {
            16
        } else {
            8
        },
        region,
        exclusive_element: exclusive,
        zero,
        category: category.into(),
        scratch: None,
        lifetime: None,
        kernel_segment: None,
    };
    for u in units.clone() {
        let (h, qi) = head_and_block(u);
        let (q0, q1) = qranges[qi as usize];
        for ks in 0..splits {
            let tile = unit_tile(h, qi, ks).expect("a unit of the round");
            let rows = q1 - q0;
            let lay = TileLayout::new(b, rows, widest, hold_cb, plan.acc);
            // Query rounds give a tile query blocks of different sizes
            // from round to round, in the buffers of the first: they
            // hold the most rows of any block (the strides do not
            // depend on the rows).
            let alloc = if plan.query_rounds {
                TileLayout::new(b, plan.rows, widest, hold_cb, plan.acc)
            } else {
                lay
            };
            let bufs = l
                .buffers
                .get_mut(&tile)
                .expect("attention tiles are below tile_count");
            // A later round's tile (the same query block and split)
            // takes the first round's buffer of each name.
            let mut push = |s: BufferSpec| {
                if round > 0 {
                    if let Some(i) = bufs.iter().position(|x| x.name == s.name) {
                        debug_assert_eq!(bufs[i].bytes, s.bytes, "{}", s.name);
                        return i;
                    }
                }
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
            let q = push(scratch(spec(
                "q",
                alloc.q_bytes(),
                RegionReq::Interleaved,
                true,
                vec![],
                "attention_operand",
            )));
            let kt = push(scratch(spec(
                "kt",
                lay.kt_bytes(b),
                RegionReq::Interleaved,
                false,
                vec![],
                "attention_operand",
            )));
            let v = push(scratch(spec(
                "v",
                lay.v_bytes(b),
                RegionReq::Interleaved,
                false,
                vec![],
                "attention_operand",
            )));
            // Staged odd heads: the received Q^T and V^T, transposed
            // into q and v after the exchange.
            let staged = |role: &str, bytes: u32| {
                (bytes > 0).then(|| {
                    scratch(spec(
                        role,
                        bytes,
                        RegionReq::Interleaved,
                        false,
                        vec![],
                        "attention_operand",
                    ))
                })
            };
            let qt = staged("qt", lay.qt_bytes()).map(&mut push);
            let vt = staged("vt", lay.vt_bytes()).map(&mut push);
            let s = push(scratch(spec(
                "s",
                alloc.c_bytes(),
                RegionReq::Interleaved,
                true,
                vec![],
                "attention_scores",
            )));
            let s2 = push(scratch(spec(
                "s_partial",
                alloc.c_bytes(),
                RegionReq::Interleaved,
                true,
                vec![],
                "attention_scores",
            )));
            let p = push(scratch(spec(
                "p",
                alloc.p_bytes(),
                RegionReq::Interleaved,
                true,
                vec![],
                "attention_scores",
            )));
            // O accumulating on the AMP lives in a C buffer of the P V
            // GEMM, scratch of the attention like the scores.
            let (o, o_acc) = if plan.acc {
                let o = push(scratch(spec(
                    "o_acc",
                    alloc.o_acc_bytes(),
                    RegionReq::Interleaved,
                    true,
                    vec![],
                    "attention_state",
                )));
                let o_rows = pv_grid(&mut kernels.gemm.1, b, rows, widest, Some(widest)).row_groups;
                (o, Some(o_rows))
            } else {
                let o = push(spec(
                    "o",
                    alloc.rows * lay.rs_o,
                    RegionReq::Standard,
                    false,
                    vec![],
                    "attention_state",
                ));
                (o, None)
            };
            let ml = push(spec(
                "ml",
                alloc.rows * 8,
                RegionReq::Standard,
                false,
                vec![],
                "attention_state",
            ));
            let alpha = (!plan.acc).then(|| {
                push(spec(
                    "alpha",
                    alloc.rows * 4,
                    RegionReq::Standard,
                    false,
                    vec![],
                    "attention_state",
                ))
            });
            // Every round's result rows stay for the host.
            let out_role = if round == 0 {
                "out".to_string()
            } else {
                format!("out_round{round}")
            };
            let out = push(spec(
                &out_role,
                rows * lay.rs_out,
                RegionReq::Standard,
                false,
                vec![],
                "attention_result",
            ));
            let scratch = push(spec(
                "scratch",
                8 * alloc.rows.min(6),
                RegionReq::Standard,
                false,
                vec![],
                "attention_state",
            ));
            // The combining tile (split 0) receives the other splits' states.
            let others: Vec<(usize, usize)> = if ks == 0 {
                (1..splits)
                    .map(|j| {
                        (
                            push(spec(
                                &format!("o_split{j}"),
                                rows * lay.o_row_bytes(),
                                RegionReq::Standard,
                                false,
                                vec![],
                                "attention_state",
                            )),
                            push(spec(
                                &format!("ml_split{j}"),
                                rows * 8,
                                RegionReq::Standard,
                                false,
                                vec![],
                                "attention_state",
                            )),
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            };
            tiles.insert(
                tile,
                (
                    h,
                    qi,
                    ks,
                    TileBuffers {
                        q,
                        kt,
                        v,
                        qt,
                        vt,
                        s,
                        s2,
                        p,
                        o,
                        o_acc,
                        ml,
                        alpha,
                        out,
                        scratch,
                        others,
                    },
                    lay,
                ),
            );
        }
    }

    // Step 1: K^T on the K projection's tiles (and, for staged odd heads,
    // Q^T and V^T on theirs: a step each, since on few tiles one tile
    // holds shards of several projections and a step starts at most six
    // vertices per tile); reset of the running state. Returns the
    // (buffer, row stride) of each shard's transpose by tile, and the step.
    let mut transpose_group = |l: &mut Lowered,
                               g: usize,
                               what: &str,
                               phase: String|
     -> Result<(TransposedShards, Step), CompileError> {
        let mut step = compute_step(phase);
        let buffer_name = format!("{name}.{what}_transposed");
        let results: Vec<(u32, crate::lower::GroupResult)> = l
            .group_results
            .iter()
            .filter(|((gg, _), _)| *gg == g)
            .map(|(&(_, t), &r)| (t, r))
            .collect();
        let mut src = BTreeMap::new();
        for (tile, r) in results {
            if r.transposed {
                // Written transposed by the host (`host_homes`).
                src.insert(tile, (r.buffer, r.row_stride));
                continue;
            }
            if round > 0 {
                // The first round's transpose.
                let i = l.buffers[&tile]
                    .iter()
                    .position(|x| x.name == buffer_name)
                    .expect("the first round transposed the shard");
                src.insert(
                    tile,
                    (i, transposed_row_stride(r.rows.1 - r.rows.0, b.eb())),
                );
                continue;
            }
            let (tb, rs, vertices, cycles) = transpose_shard(
                l,
                tile,
                (&r, b.eb()),
                &buffer_name,
                &what.to_uppercase(),
                &mut kernels.transpose,
            )?;
            src.insert(tile, (tb, rs));
            step.put_tile(tile, vertices, cycles);
        }
        Ok((src, step))
    };
    let (kt_src, prep) = transpose_group(
        l,
        b.k,
        "k",
        format!("transpose {} (K^T)", graph.value(b.k_value).name),
    )?;
    let mut qt_src = TransposedShards::new();
    let mut vt_src = TransposedShards::new();
    let mut staged_preps = Vec::new();
    if b.staged() {
        for (g, what, src) in [(b.q, "q", &mut qt_src), (b.v, "v", &mut vt_src)] {
            let (transposed, step) = transpose_group(
                l,
                g,
                what,
                format!("transpose {name} {what} (staged odd heads)"),
            )?;
            *src = transposed;
            staged_preps.push(step);
        }
    }
    // The fills of every attention tile: its ranges cut into six equal
    // shares of items, one `fill64` vertex (a list of ranges) per worker.
    let mut fill_step = compute_step(format!("reset {name} state and padding"));
    for (&tile, &(_, _, ks, ref t, lay)) in &tiles {
        let rows = lay.rows;
        // (buffer, offset, bytes, lo, hi)
        // O = 0: its rows in region 0, or with `acc` the rows of each P V
        // row group in O's C buffer (the junk rows between them reach no
        // row of O).
        let mut ranges_to_fill: Vec<FillJob> = match &t.o_acc {
            Some(o_rows) => o_rows
                .iter()
                .map(|&(r0, r1)| {
                    (
                        t.o,
                        c_row(o_rows, r0, lay.rs_pv),
                        (r1 - r0) * lay.rs_pv,
                        0,
                        0,
                    )
                })
                .collect(),
            None => vec![(t.o, 0, rows * lay.rs_o, 0, 0)],
        };
        ranges_to_fill.extend([
            (t.ml, 0, rows * 8, f32::NEG_INFINITY.to_bits(), 0),
            (t.q, 0, lay.q_bytes(), 0, 0),
            (t.s, 0, C_HEADER, 0, 0),
            (t.s2, 0, C_HEADER, 0, 0),
            (t.p, rows * lay.rs_p, 2 * lay.rs_p, 0, 0),
        ]);
        if dp > d {
            ranges_to_fill.push((t.kt, d * lay.rs_kt, (dp - d) * lay.rs_kt, 0, 0));
        }
        // V rows past the split's keys in its last chunk (the GEMM
        // multiplies them by P's zero columns, so they must not hold NaN
        // or infinity; an earlier chunk's keys there are finite). With
        // `acc` an odd key block's zero K block ([`pv_k_blocks`]) reads the
        // column block after its own, past its chunk's keys when it is the
        // chunk's last: so from the keys of the split's shortest chunk on,
        // a column block further than V's chunks reach. The fill comes
        // before every chunk's exchange, which writes what longer chunks
        // hold there.
        let chunk_keys_of = |c: usize| {
            let (c0, c1) = plan.chunk_columns(ks as usize, c);
            let (k0, n) = split_keys(ks);
            (c1 * 16).min(k0 + n) - c0 * 16
        };
        let keys = if plan.acc {
            (0..chunks.len()).map(chunk_keys_of).min().expect("a chunk")
        } else {
            chunk_keys_of(chunks.len() - 1)
        };
        let v_rows = (hold_cb + plan.acc as u32) * 16;
        if v_rows > keys {
            ranges_to_fill.push((t.v, keys * lay.rs_v, (v_rows - keys) * lay.rs_v, 0, 0));
        }
        let (vertices, slowest) = fill_vertices(&ranges_to_fill, &mut kernels.fill.1);
        let cycles = slowest + launch_cycles(vertices.len() as u64);
        fill_step.put_tile(
            tile,
            vertices
                .into_iter()
                .map(|state| Vertex {
                    kernel: std::sync::Arc::new(kernels.fill.0.clone()),
                    state,
                })
                .collect(),
            cycles,
        );
    }
    // V's ones column (f16 attention, [`AttentionBlock::ones`]) in every
    // row the tile's V buffer holds: the exchange writes only v's head
    // columns and the staged transposes only O's width, so the column
    // stays through the key chunks; a step of its own after the fills,
    // whose zeros of the last chunk's spare rows it must follow.
    let mut ones_step = compute_step(format!("set {name} V ones column"));
    if b.ones {
        for (&tile, &(_, _, _, ref t, lay)) in &tiles {
            let (vertices, cycles) = ones_vertices(
                &mut kernels.fill_rows,
                t.v,
                b.ones_column() * b.eb(),
                lay.rs_v,
                hold_cb * 16,
            );
            ones_step.put_tile(tile, vertices, cycles);
        }
    }

    // Step 2: the exchange of Q, K^T and V, one step per key chunk (Q
    // with the first).
    let qblock_of = |r: u32| -> (u32, u32) {
        let i = qranges
            .iter()
            .position(|&(a, z)| (a..z).contains(&r))
            .expect("query ranges cover the queries");
        (i as u32, qranges[i].0)
    };
    // Segments of columns [c0, c0 + w) by head: (head, first col, last col).
    let segments = |c0: u32, w: u32, d: u32| -> Vec<(u32, u32, u32)> {
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
    // The keys `k0..k1` of split `ks`'s chunk `c`.
    let chunk_keys = |ks: u32, c: usize| -> (u32, u32) {
        let (c0, c1) = plan.chunk_columns(ks as usize, c);
        (c0 * 16, (c1 * 16).min(b.sk))
    };
    // A causal round's queries see the keys before `visible_keys` (the
    // round's last query plus the offset of keys before the first query):
    // the key blocks from the first that starts there on every split, and
    // the chunks that hold only such blocks, are hidden from all the
    // round's tiles and skipped (their exchange and their four steps). The
    // online kernel masks what the live blocks hide.
    let offset_causal = b.sk - b.sq.min(b.sk);
    let visible = visible_keys(b, &qranges, units.clone().map(|u| head_and_block(u).1));
    let live_blocks = (0..plan.key_splits.len())
        .map(|ks| live_key_blocks(&plan.blocks_of(ks), visible))
        .max()
        .expect("a split at least");
    let live_chunks = chunk_of(&chunks, live_blocks - 1) + 1;
    let mut chunk_transfers: Vec<Vec<BufferTransfer>> = vec![Vec::new(); live_chunks];
    let split_of = |key: u32| -> u32 {
        (0..splits)
            .find(|&ks| {
                let (k0, n) = split_keys(ks);
                (k0..k0 + n).contains(&key)
            })
            .expect("the splits cover the keys")
    };
    // Bytes of an element of q, k and v.
    let eb = b.eb();
    // Rows of a projection's result cut at head boundaries, each segment to
    // `dests(row, head)` (buffer offsets of the head's column 0 there).
    let row_segments = |transfers: &mut Vec<BufferTransfer>,
                        tile: u32,
                        r: &crate::lower::GroupResult,
                        d: u32,
                        dests: &dyn Fn(u32, u32) -> Vec<BufferRef>| {
        for row in r.rows.0..r.rows.1 {
            for (h, s0, s1) in segments(r.col0, r.width, d) {
                let destinations: Vec<BufferRef> = dests(row, h)
                    .into_iter()
                    .map(|x| BufferRef {
                        offset: x.offset + (s0 - h * d) * eb,
                        ..x
                    })
                    .collect();
                if destinations.is_empty() {
                    // Another round's head or query block, or another
                    // chunk's key.
                    continue;
                }
                transfers.push(BufferTransfer {
                    source: BufferRef {
                        tile,
                        buffer: r.buffer,
                        offset: (row - r.rows.0) * r.row_stride + (s0 - r.col0) * eb,
                    },
                    destinations,
                    // A whole head of odd size takes the zero padding
                    // after it along (`host_homes`: a home of one such
                    // head has rows padded to words; the destinations'
                    // rows are padded to 16 columns).
                    bytes: round_up((s1 - s0) * eb, 4),
                });
            }
        }
    };
    // Runs of a transposed shard's rows (one per result column, its
    // elements the shard's rows: queries or keys), cut at `cuts` (query
    // blocks or key splits, which start on even rows as the shard's rows
    // do, so every run starts on a word; a run that ends at the last, odd
    // row takes the zero after it along), each to `dests(head, cut)`: the
    // (tile, buffer, row stride) of the head's transposed rows there.
    let transposed_runs =
        |transfers: &mut Vec<BufferTransfer>,
         tile: u32,
         r: &crate::lower::GroupResult,
         (src, rs): (usize, u32),
         width: u32,
         cuts: &[(u32, u32)],
         dests: &dyn Fn(u32, u32) -> Vec<(u32, usize, u32)>| {
            let (r0, r1) = r.rows;
            for (ci, &(p0, p1)) in cuts.iter().enumerate() {
                let (a, z) = (r0.max(p0), r1.min(p1));
                if a >= z {
                    continue;
                }
                for c in 0..r.width {
                    let gc = r.col0 + c;
                    let (h, j) = (gc / width, gc % width);
                    let destinations: Vec<BufferRef> = dests(h, ci as u32)
                        .into_iter()
                        .map(|(dst, buffer, rs_t)| BufferRef {
                            tile: dst,
                            buffer,
                            offset: j * rs_t + (a - p0) * eb,
                        })
                        .collect();
                    if destinations.is_empty() {
                        // Another round's head or query blocks.
                        continue;
                    }
                    transfers.push(BufferTransfer {
                        source: BufferRef {
                            tile,
                            buffer: src,
                            offset: c * rs + (a - r0) * eb,
                        },
                        destinations,
                        bytes: round_up((z - a) * eb, 4),
                    });
                }
            }
        };
    // The tile of (head, query block, split), the buffer `pick` chooses
    // there and its row stride, if this round runs that unit.
    type Pick = fn(&TileBuffers, &TileLayout) -> (usize, u32);
    let unit_buffer = |h: u32, qi: u32, ks: u32, pick: Pick| -> Option<(u32, usize, u32)> {
        let dst = unit_tile(h, qi, ks)?;
        let (buffer, stride) = pick(&tiles[&dst].3, &tiles[&dst].4);
        Some((dst, buffer, stride))
    };
    // Row `row` of that buffer.
    let unit_row = |h: u32, qi: u32, ks: u32, pick: Pick, row: u32| -> Option<BufferRef> {
        let (tile, buffer, stride) = unit_buffer(h, qi, ks, pick)?;
        Some(BufferRef {
            tile,
            buffer,
            offset: row * stride,
        })
    };
    // The keys of every split's chunk `c`, where K^T and V^T rows are cut.
    let chunk_cuts =
        |c: usize| -> Vec<(u32, u32)> { (0..splits).map(|ks| chunk_keys(ks, c)).collect() };
    for (&(g, tile), r) in &l.group_results {
        // Staged odd heads move in one chunk (`chunked_blockings`).
        let transfers = &mut chunk_transfers[0];
        if b.staged() && g == b.q {
            // Staged odd heads: runs of a Q^T row's queries to every split
            // of their (head, query block).
            transposed_runs(transfers, tile, r, qt_src[&tile], d, &qranges, &|h, qi| {
                (0..splits)
                    .filter_map(|ks| {
                        unit_buffer(h, qi, ks, |t, l| (t.qt.expect("staged"), l.rs_qt))
                    })
                    .collect()
            });
        } else if b.staged() && g == b.v {
            // Staged odd heads: runs of a V^T row's keys to every query
            // block of their (head, split).
            transposed_runs(
                transfers,
                tile,
                r,
                vt_src[&tile],
                dv,
                &chunk_cuts(0),
                &|h, ks| {
                    (0..plan.query_blocks)
                        .filter_map(|qi| {
                            unit_buffer(h, qi, ks, |t, l| (t.vt.expect("staged"), l.rs_vt))
                        })
                        .collect()
                },
            );
        } else if g == b.q {
            // Q rows go to every split of their (head, query block).
            row_segments(transfers, tile, r, d, &|row, h| {
                let (qi, q0) = qblock_of(row);
                (0..splits)
                    .filter_map(|ks| unit_row(h, qi, ks, |t, l| (t.q, l.rs_q), row - q0))
                    .collect()
            });
        } else if g == b.v {
            // A V row goes to every query block of its head, in its split,
            // in the step of its chunk.
            for (c, transfers) in chunk_transfers.iter_mut().enumerate() {
                row_segments(transfers, tile, r, dv, &|row, h| {
                    let ks = split_of(row);
                    let (k0, k1) = chunk_keys(ks, c);
                    if !(k0..k1).contains(&row) {
                        return Vec::new();
                    }
                    (0..plan.query_blocks)
                        .filter_map(|qi| unit_row(h, qi, ks, |t, l| (t.v, l.rs_v), row - k0))
                        .collect()
                });
            }
        } else if g == b.k {
            // A K^T row's keys, cut at the splits' chunks, to every query
            // block of their (head, split), in the step of their chunk.
            for (c, transfers) in chunk_transfers.iter_mut().enumerate() {
                transposed_runs(
                    transfers,
                    tile,
                    r,
                    kt_src[&tile],
                    d,
                    &chunk_cuts(c),
                    &|h, ks| {
                        (0..plan.query_blocks)
                            .filter_map(|qi| unit_buffer(h, qi, ks, |t, l| (t.kt, l.rs_kt)))
                            .collect()
                    },
                );
            }
        }
    }

    // The key chunks' exchange steps (and the split states' below) are
    // scheduled side by side at the end; each one's index in `steps` is
    // set where it is pushed.
    let mut xsteps = Vec::new();
    for (c, transfers) in chunk_transfers.into_iter().enumerate() {
        check_word_aligned(&transfers)?;
        let phase = match (chunks.len(), c) {
            (1, _) => format!("exchange q, k^T, v -> {name}"),
            (_, 0) => format!("exchange q, k^T, v key chunk 0 -> {name}"),
            _ => format!("exchange k^T, v key chunk {c} -> {name}"),
        };
        xsteps.push(exchange::pending_step(
            l.tile_count,
            transfers,
            exchange_label + c as u32,
            &mut l.buffers,
            name.clone(),
            phase,
            0,
        ));
    }
    let mut xsteps = xsteps.into_iter();
    let mut pending = Vec::new();

    // Steps 3 and 4: per key block, then the final normalisation.
    let nkb_s = dp / 16;
    let mut steps = Vec::new();
    steps.extend(
        std::iter::once(prep)
            .chain(staged_preps)
            .filter(|s| !s.tiles.is_empty()),
    );
    steps.push(fill_step);
    if !ones_step.tiles.is_empty() {
        steps.push(ones_step);
    }
    if let Some(x) = xsteps.next() {
        exchange::push_pending(&mut steps, &mut pending, x);
    }
    if b.staged() {
        // Staged odd heads: Q^T into Q's rows and V^T into V's rows, one
        // `transpose_f16` vertex per range of queries or keys (at most
        // three each, so the six run side by side).
        let mut unstage = compute_step(format!("transpose q^T, v^T -> {name} rows"));
        for (&tile, &(_, _, ks, ref t, lay)) in &tiles {
            let keys = split_keys(ks).1;
            let mut vertices = Vec::new();
            let mut slowest = 0;
            for (from, rs_from, rows_in, to, rs_to, cols) in [
                (t.qt, lay.rs_qt, d, t.q, lay.rs_q, lay.rows),
                (t.vt, lay.rs_vt, dv, t.v, lay.rs_v, keys),
            ] {
                let from = from.expect("staged");
                for range in ranges(cols, cols.min(3)) {
                    let (v, cycles) = transpose_vertex(
                        &mut kernels.transpose,
                        2,
                        (from, rs_from),
                        (to, rs_to),
                        rows_in,
                        range,
                    );
                    slowest = slowest.max(cycles);
                    vertices.push(v);
                }
            }
            let cycles = slowest + launch_cycles(vertices.len() as u64);
            unstage.put_tile(tile, vertices, cycles);
        }
        steps.push(unstage);
    }
    let split_blocks: Vec<Vec<(u32, u32)>> = (0..plan.key_splits.len())
        .map(|k| plan.blocks_of(k))
        .collect();
    // With `acc` P V's row groups are those of the widest block on every
    // tile.
    let acc = plan.acc.then_some(widest);
    let (online, _) = kernels.online_and_final(plan.acc);
    let online_kernel = online.0.clone();
    for bi in 0..live_blocks {
        if bi > 0 && chunk_of(&chunks, bi) != chunk_of(&chunks, bi - 1) {
            if let Some(x) = xsteps.next() {
                exchange::push_pending(&mut steps, &mut pending, x);
            }
        }
        let mut sg = compute_step(format!("{name} scores, key block {bi}"));
        let mut on = compute_step(format!("{name} online softmax, key block {bi}"));
        let mut pv = compute_step(format!("{name} P V, key block {bi}"));
        let mut mg = compute_step(format!("{name} merge, key block {bi}"));
        // Each tile's own cycles (its rows and its split's block), a few
        // distinct shapes for all the tiles.
        let mut tile_costs: BTreeMap<(u32, (u32, u32)), Vec<u64>> = BTreeMap::new();
        for (&tile, &(_, qi, ks, ref t, lay)) in &tiles {
            let rows = lay.rows;
            let q0 = qranges[qi as usize].0;
            // This tile's block: global column blocks c0..c1 of keys, k0 its
            // first key, bk its keys; `local` its first column block in the
            // split's K^T and V.
            let (c0, c1) = split_blocks[ks as usize][bi];
            let costs = tile_costs.entry((rows, (c0, c1))).or_insert_with(|| {
                compute_cycles(b, kernels, rows, &[(c0, c1)], hold_cb, acc, bi == 0).1
            });
            // A causal block's rows see fewer of its keys than it holds
            // (none above the diagonal): each worker's rows cost what the
            // keys they see cost.
            let online = if b.causal {
                causal_online_cycles(
                    b,
                    kernels,
                    rows,
                    q0 + offset_causal,
                    (
                        c0 * 16,
                        (c1 * 16).min(b.sk) - c0 * 16,
                        pv_k_blocks(c1 - c0, plan.acc) * 16,
                    ),
                    (plan.acc, bi == 0),
                )
            } else {
                costs[2]
            };
            for (step, cycles) in [(&mut sg, costs[1]), (&mut on, online), (&mut pv, costs[3])] {
                step.charge_tile(tile, cycles);
            }
            if !plan.acc {
                mg.charge_tile(tile, costs[4]);
            }
            let local = c0 - plan.chunk_columns(ks as usize, chunk_of(&chunks, bi)).0;
            let nb = c1 - c0;
            // P V's K blocks (and P's columns the online step writes).
            let nkb_pv = pv_k_blocks(nb, plan.acc);
            let k0 = c0 * 16;
            let bk = (c1 * 16).min(b.sk) - k0;
            // The result of a GEMM with NKB blocks ends in `s` when K block
            // 0 writes `s` for odd NKB and `s_partial` for even NKB; its
            // first K block reads the zero header of the other.
            let zeroed = |nkb: u32| {
                let (first, second) = if nkb % 2 == 1 {
                    (t.s, t.s2)
                } else {
                    (t.s2, t.s)
                };
                (
                    first,
                    second,
                    StateWord::Addr {
                        buffer: second,
                        offset: 0,
                    },
                )
            };
            // Each GEMM's worker grid ([`gemm_grid`]); the online softmax
            // and the merge read its rows where [`c_row`] puts them (their
            // six row ranges nest in two or three row groups).
            let GemmGrid {
                row_groups: s_rows,
                col_groups: s_cols,
                ..
            } = gemm_grid(&mut kernels.gemm.1, rows, nb, nkb_s);
            let GemmGrid {
                row_groups: v_rows,
                col_groups: v_cols,
                ..
            } = pv_grid(&mut kernels.gemm.1, b, rows, nkb_pv, acc);
            // Where P V's K block 0 writes (CA), what it reads as partials
            // (CB) and the zero word (Z): with `acc` `s_partial`, O (the
            // running sum) and the accumulate mode's Z = 0; an even number
            // of K blocks ends in O.
            let pv_buffers = match &t.o_acc {
                Some(o_rows) => {
                    debug_assert_eq!(&v_rows, o_rows, "O's row groups are fixed");
                    debug_assert_eq!(nkb_pv % 2, 0);
                    (t.s2, t.o, StateWord::Const(0))
                }
                None => zeroed(nb),
            };
            // `a`: the A operand's buffer (its row 0 at offset 0); a row
            // group's vertex starts at the group's first row.
            let gemm = |a: usize,
                        rs_a: u32,
                        bb: StateWord,
                        rs_b: u32,
                        (first, second, z): (usize, usize, StateWord),
                        rs_c: u32,
                        (row_groups, g): (&[(u32, u32)], usize),
                        cg0: u32,
                        ncb: u32,
                        nkb: u32| {
                let (r0, r1) = row_groups[g];
                let c_off = c_row(row_groups, r0, rs_c) + cg0 * 64;
                Vertex {
                    kernel: std::sync::Arc::new(kernels.gemm.0.clone()),
                    state: vec![
                        StateWord::Addr {
                            buffer: a,
                            offset: r0 * rs_a,
                        },
                        StateWord::Const(rs_a),
                        bb,
                        StateWord::Const(rs_b),
                        StateWord::Addr {
                            buffer: first,
                            offset: c_off,
                        },
                        StateWord::Addr {
                            buffer: second,
                            offset: c_off,
                        },
                        StateWord::Const(rs_c),
                        z,
                        StateWord::Const(r1 - r0),
                        StateWord::Const(nkb),
                        StateWord::Const(ncb),
                    ],
                }
            };
            std::sync::Arc::make_mut(&mut sg.tiles).insert(
                tile,
                (0..s_rows.len())
                    .flat_map(|g| s_cols.iter().map(move |&c| (g, c)))
                    .map(|(g, (g0, g1))| {
                        gemm(
                            t.q,
                            lay.rs_q,
                            StateWord::Addr {
                                buffer: t.kt,
                                offset: (local + g0) * 16 * eb,
                            },
                            lay.rs_kt,
                            zeroed(nkb_s),
                            lay.rs_s,
                            (&s_rows, g),
                            g0,
                            g1 - g0,
                            nkb_s,
                        )
                    })
                    .collect(),
            );
            std::sync::Arc::make_mut(&mut on.tiles).insert(
                tile,
                row_vertices(rows, &online_kernel, |w, r0, r1| {
                    let (o_word, rs_o) = o_rows(t, &lay, r0);
                    vec![
                        StateWord::Addr {
                            buffer: t.s,
                            offset: c_row(&s_rows, r0, lay.rs_s),
                        },
                        StateWord::Const(lay.rs_s),
                        StateWord::Addr {
                            buffer: t.v,
                            offset: local * 16 * lay.rs_v,
                        },
                        StateWord::Const(lay.rs_v),
                        o_word,
                        StateWord::Const(rs_o),
                        StateWord::Addr {
                            buffer: t.ml,
                            offset: 8 * r0,
                        },
                        StateWord::Const(r1 - r0),
                        StateWord::Const(bk),
                        StateWord::Const(dq),
                        StateWord::Const(b.scale.to_bits()),
                        StateWord::Const(q0 + r0 + offset_causal),
                        StateWord::Const(k0),
                        StateWord::Addr {
                            buffer: t.scratch,
                            offset: 8 * w,
                        },
                        StateWord::Addr {
                            buffer: t.p,
                            offset: r0 * lay.rs_p,
                        },
                        StateWord::Const(lay.rs_p),
                        StateWord::Const(nkb_pv * 16),
                        // ACC=1 writes no factors and reads no ALPHA.
                        match t.alpha {
                            Some(alpha) => StateWord::Addr {
                                buffer: alpha,
                                offset: 4 * r0,
                            },
                            None => StateWord::Const(0),
                        },
                    ]
                }),
            );
            std::sync::Arc::make_mut(&mut pv.tiles).insert(
                tile,
                (0..v_rows.len())
                    .flat_map(|g| v_cols.iter().map(move |&c| (g, c)))
                    .map(|(g, (g0, g1))| {
                        gemm(
                            t.p,
                            lay.rs_p,
                            StateWord::Addr {
                                buffer: t.v,
                                offset: local * 16 * lay.rs_v + g0 * 16 * eb,
                            },
                            lay.rs_v,
                            pv_buffers,
                            lay.rs_pv,
                            (&v_rows, g),
                            g0,
                            g1 - g0,
                            nkb_pv,
                        )
                    })
                    .collect(),
            );
            if let Some(alpha) = t.alpha {
                std::sync::Arc::make_mut(&mut mg.tiles).insert(
                    tile,
                    row_vertices(rows, &kernels.merge.0, |_, r0, r1| {
                        let mut state = vec![
                            StateWord::Addr {
                                buffer: t.o,
                                offset: r0 * lay.rs_o,
                            },
                            StateWord::Const(lay.rs_o),
                            StateWord::Addr {
                                buffer: t.s,
                                offset: c_row(&v_rows, r0, lay.rs_pv),
                            },
                            StateWord::Const(lay.rs_pv),
                            StateWord::Addr {
                                buffer: alpha,
                                offset: 4 * r0,
                            },
                            StateWord::Const(r1 - r0),
                            StateWord::Const(dq),
                        ];
                        if b.ones {
                            // ONES=1: l' = l a + P V's ones column.
                            state.push(StateWord::Addr {
                                buffer: t.ml,
                                offset: 8 * r0,
                            });
                        }
                        state
                    }),
                );
            }
        }
        // The widest split's block bi sets the step's estimate.
        let widest_block = split_blocks
            .iter()
            .map(|v| v[bi])
            .max_by_key(|c| (c.1 - c.0, (c.1 * 16).min(b.sk) - c.0 * 16))
            .expect("at least one split");
        let (_, per_step) = compute_cycles(
            b,
            kernels,
            plan.rows,
            &[widest_block],
            hold_cb,
            acc,
            bi == 0,
        );
        // per_step: [fill, scores, online, pv, merge, final].
        sg.estimated_cycles = per_step[1];
        on.estimated_cycles = per_step[2];
        pv.estimated_cycles = per_step[3];
        mg.estimated_cycles = per_step[4];
        steps.extend([sg, on, pv]);
        // With `acc` P V has added its products to O: no merge.
        if !plan.acc {
            steps.push(mg);
        }
    }
    // Key splits: the other splits' (O, (m, l)) move to split 0 in one
    // exchange step, and split 0 folds them in one after the other.
    if splits > 1 {
        let mut moves = Vec::new();
        for (&tile, &(h, qi, ks, ref t, lay)) in &tiles {
            if ks == 0 {
                continue;
            }
            let dst = unit_tile(h, qi, 0).expect("split 0 of a unit of the round");
            let (o2, ml2) = tiles[&dst].3.others[ks as usize - 1];
            // O's rows, from P V's row groups with `acc` (each group's
            // rows without the junk rows before it), into rows of
            // `o_row_bytes` on split 0.
            let groups = match &t.o_acc {
                Some(o_rows) => o_rows
                    .iter()
                    .map(|&(r0, r1)| (r0, r1, c_row(o_rows, r0, lay.rs_pv)))
                    .collect(),
                None => vec![(0, lay.rows, 0)],
            };
            for (r0, r1, offset) in groups {
                moves.push(BufferTransfer {
                    source: BufferRef {
                        tile,
                        buffer: t.o,
                        offset,
                    },
                    destinations: vec![BufferRef {
                        tile: dst,
                        buffer: o2,
                        offset: r0 * lay.o_row_bytes(),
                    }],
                    bytes: (r1 - r0) * lay.o_row_bytes(),
                });
            }
            moves.push(BufferTransfer {
                source: BufferRef {
                    tile,
                    buffer: t.ml,
                    offset: 0,
                },
                destinations: vec![BufferRef {
                    tile: dst,
                    buffer: ml2,
                    offset: 0,
                }],
                bytes: lay.rows * 8,
            });
        }
        let x = exchange::pending_step(
            l.tile_count,
            moves,
            exchange_label + chunks.len() as u32,
            &mut l.buffers,
            name.clone(),
            format!("exchange {name} key-split states"),
            0,
        );
        exchange::push_pending(&mut steps, &mut pending, x);
        for j in 1..splits {
            let mut cs = compute_step(format!("{name} combine key split {j}"));
            for (&tile, &(_, _, ks, ref t, lay)) in &tiles {
                if ks != 0 {
                    continue;
                }
                let (o2, ml2) = t.others[j as usize - 1];
                std::sync::Arc::make_mut(&mut cs.tiles).insert(
                    tile,
                    row_vertices(lay.rows, &kernels.combine.0, |_, r0, r1| {
                        let (o_word, rs_o) = o_rows(t, &lay, r0);
                        vec![
                            o_word,
                            StateWord::Const(rs_o),
                            StateWord::Addr {
                                buffer: t.ml,
                                offset: 8 * r0,
                            },
                            StateWord::Addr {
                                buffer: o2,
                                offset: r0 * lay.o_row_bytes(),
                            },
                            StateWord::Const(lay.o_row_bytes()),
                            StateWord::Addr {
                                buffer: ml2,
                                offset: 8 * r0,
                            },
                            StateWord::Const(r1 - r0),
                            StateWord::Const(combine_quads(b, plan.acc)),
                        ]
                    }),
                );
            }
            let per_vertex = plan.rows.div_ceil(6) as i64;
            cs.estimated_cycles = kernels.combine.1.eval(&[
                ("ROWS", per_vertex),
                ("DQ", combine_quads(b, plan.acc) as i64),
            ]) + launch_cycles(plan.rows.min(6) as u64);
            steps.push(cs);
        }
    }
    let mut fin = compute_step(format!("{name} final normalisation"));
    // With `acc` the final of [`acc_requests`] (which with the ones column
    // reads l in O's column).
    let (_, final_) = kernels.online_and_final(plan.acc);
    let final_kernel = &final_.0.clone();
    let mut y = HostTensor {
        name: y_name,
        ty: graph.value(b.result).ty.clone(),
        placements: Vec::new(),
    };
    let mut final_costs: BTreeMap<u32, u64> = BTreeMap::new();
    for (&tile, &(h, qi, ks, ref t, lay)) in &tiles {
        if ks != 0 {
            continue;
        }
        let rows = lay.rows;
        let q0 = qranges[qi as usize].0;
        let cycles = *final_costs
            .entry(rows)
            .or_insert_with(|| compute_cycles(b, kernels, rows, &[], 0, acc, false).1[1]);
        fin.charge_tile(tile, cycles);
        std::sync::Arc::make_mut(&mut fin.tiles).insert(
            tile,
            row_vertices(rows, final_kernel, |_, r0, r1| {
                let (o_word, rs_o) = o_rows(t, &lay, r0);
                vec![
                    o_word,
                    StateWord::Const(rs_o),
                    StateWord::Addr {
                        buffer: t.ml,
                        offset: 8 * r0,
                    },
                    StateWord::Addr {
                        buffer: t.out,
                        offset: r0 * lay.rs_out,
                    },
                    StateWord::Const(lay.rs_out),
                    StateWord::Const(r1 - r0),
                    StateWord::Const(dq),
                ]
            }),
        );
        for r in 0..rows {
            y.placements.push(HostPlacement {
                tile,
                buffer: t.out,
                buffer_offset: r * lay.rs_out,
                host_offset: b.result_offset(q0 + r, h * dv),
                bytes: dv * eb,
            });
        }
    }
    let (_, per_step) = compute_cycles(b, kernels, plan.rows, &[], 0, acc, false);
    fin.estimated_cycles = per_step[1];
    steps.push(fin);
    exchange::schedule_pending(pending, &mut steps, &mut l.buffers)?;
    l.calls[1].steps.extend(steps);
    // Rounds add their heads' rows to one output tensor.
    match l.io[1].1.iter_mut().find(|t| t.name == y.name) {
        Some(t) => {
            t.placements.extend(y.placements);
            t.placements.sort();
        }
        None => {
            y.placements.sort();
            l.io[1].1.push(y);
        }
    }
    l.io[1]
        .1
        .sort_by_key(|t| graph.lookup(&t.name).map(|id| id.0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row plan of `splits` over `key_cb` column blocks, `blocks` key
    /// blocks a split, in `chunks` chunks.
    fn chunked_plan(key_cb: u32, splits: u32, blocks: u32, chunks: u32) -> AttentionPlan {
        let key_splits = ranges(key_cb, splits);
        let (c0, c1) = key_splits[0];
        AttentionPlan {
            key_chunks: chunks,
            ..AttentionPlan::partition_only(
                AttentionLayout::Rows,
                (1, 16),
                key_splits,
                Vec::new(),
                ranges(c1 - c0, blocks),
                splits,
            )
        }
    }

    /// A kernel's own `.cycles` formula, as the library gives it.
    fn declared(source: &str, defines: &[(&str, i64)]) -> FormulaCost {
        let mut opts = ipu_asm::Options::default();
        for (k, v) in defines {
            opts.defines.insert((*k).into(), *v);
        }
        let path = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
            .join("../../device")
            .join(source);
        let assembly = ipu_asm::assemble_file(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
        FormulaCost::new(assembly.metadata.cycles.expect("a .cycles formula"))
    }

    /// The row layout's kernels of `b` with their declared formulas.
    fn declared_kernels(b: &AttentionBlock) -> AttentionKernels {
        let declare = |r: KernelRequest| {
            let defines: Vec<(&str, i64)> =
                r.params.iter().map(|(k, &v)| (k.as_str(), v)).collect();
            let cost = declared(&r.source, &defines);
            (r, cost)
        };
        let [gemm, online, merge, final_, fill, transpose, combine, fill_rows] =
            kernel_requests(b).map(declare);
        let [acc_online, acc_final] = acc_requests(b, b.ones).map(declare);
        let acc = Some(AccKernels {
            online: acc_online,
            final_: acc_final,
        });
        AttentionKernels {
            gemm,
            online,
            merge,
            acc,
            acc_only: false,
            final_,
            fill,
            transpose,
            combine,
            fill_rows,
            columns: None,
        }
    }

    /// The step before the first key chunk writes V's ones column into
    /// the rows V's buffer holds (one chunk's), however many keys the
    /// split has: the planner's estimate of it once counted every key of
    /// the split (4,096 keys in chunks of 512: about 4,200 cycles where
    /// the step takes about 600).
    #[test]
    fn the_ones_step_estimate_counts_the_rows_v_holds() {
        let mut b = test_block(2, 72, 4096);
        b.ones = true;
        let mut k = declared_kernels(&b);
        let blocks = |n: u32| -> Vec<(u32, u32)> { (0..n).map(|i| (8 * i, 8 * i + 8)).collect() };
        let prefix = |b: &AttentionBlock, k: &mut AttentionKernels, n: u32, hold_cb: u32| {
            compute_cycles(b, k, 100, &blocks(n), hold_cb, None, true).1[0]
        };
        // A split of 32 key blocks in chunks of 4 holds 32 column blocks.
        assert_eq!(prefix(&b, &mut k, 32, 32), prefix(&b, &mut k, 4, 32));
        let ones = |k: &mut AttentionKernels, rows| ones_cycles(&mut k.fill_rows.1, rows);
        assert_eq!(
            prefix(&b, &mut k, 32, 32) - prefix(&b, &mut k, 32, 4),
            ones(&mut k, 512) - ones(&mut k, 64)
        );
        assert!(ones(&mut k, 512) < ones(&mut k, 4096) / 4);
        b.ones = false;
        let mut k = declared_kernels(&b);
        assert_eq!(prefix(&b, &mut k, 32, 32), prefix(&b, &mut k, 32, 4));
    }

    /// A plan whose P V accumulates into O ([`AttentionPlan::acc`]): no
    /// merge step, the online step dearer than the merging vertex on the
    /// rows' first block and cheaper on later blocks, without the row
    /// maximum's pass (the lazy vertex takes p first), O out of region 0 and in a C
    /// buffer of region 1, P and V a column block wider for an odd key
    /// block's zero K block, which makes P V's K blocks even.
    #[test]
    fn accumulating_plans_drop_the_merge_and_move_o_to_region_1() {
        let b = test_block(2, 64, 1024);
        assert!(!b.ones);
        let mut k = declared_kernels(&b);
        assert!(k.acc.is_some());
        let blocks = [(0, 8), (8, 15)];
        let (merged, merged_steps) = compute_cycles(&b, &mut k, 100, &blocks, 15, None, true);
        let (acc, acc_steps) = compute_cycles(&b, &mut k, 100, &blocks, 15, Some(8), true);
        // [fill, (scores, online, P V, merge) per block, final].
        assert_eq!(acc_steps.len(), merged_steps.len());
        for i in 0..blocks.len() {
            let (m, a) = (
                &merged_steps[1 + 4 * i..5 + 4 * i],
                &acc_steps[1 + 4 * i..5 + 4 * i],
            );
            assert!(m[3] > 0 && a[3] == 0, "block {i}: {m:?} {a:?}");
            assert_eq!(a[0], m[0], "the scores are the same");
            if i == 0 {
                // From m = -inf (FIRST) the lazy vertex takes the row's
                // maximum as the merging one does, and its lazy test, its
                // p-first check and the move: 18 slots a row more.
                assert_eq!(a[1] - m[1], 6 * 17 * 18, "{m:?} {a:?}");
            } else {
                // 17 rows a worker, each without the maximum's pass over
                // 112 keys (56 bundles) and 5 slots, less the zero K
                // block's 16 stores of P's zeros.
                assert_eq!(m[1] - a[1], 6 * 17 * (56 + 5 - 16), "{m:?} {a:?}");
            }
        }
        // The even block's P V is the same GEMM; the odd one pays its
        // zero K block.
        assert_eq!(acc_steps[3], merged_steps[3]);
        assert!(acc_steps[7] > merged_steps[7]);
        assert!(acc < merged, "{acc} vs {merged}");
        assert_eq!(pv_k_blocks(7, true), 8);
        assert_eq!(pv_k_blocks(7, false), 7);
        let (with, without) = (
            TileLayout::new(&b, 100, 8, 15, true),
            TileLayout::new(&b, 100, 8, 15, false),
        );
        assert_eq!(
            without.region0(2) - with.region0(2),
            // O and the factors (4 bytes a row) out; the other split's
            // O received in P V's row width.
            100 * (without.rs_o as u64 + 4) + 100 * (without.rs_o - with.rs_pv) as u64
        );
        assert!(with.region1(&b).unwrap() > without.region1(&b).unwrap());
        assert_eq!(with.v_bytes(&b), without.v_bytes(&b) + 16 * with.rs_v);
        let odd = TileLayout::new(&b, 100, 7, 15, true);
        assert_eq!(odd.rs_p, 8 * 16 * 2);
        // f32 attention accumulates with f32 P, its final writing f32.
        let [online, final_] = acc_requests(&AttentionBlock { f32: true, ..b }, true);
        assert_eq!(online.params["PT"], 32);
        assert_eq!(online.params["ONES"], 0);
        assert_eq!(final_.params["OUT"], 32);
    }

    /// The six row ranges of the online, combine and final vertices each
    /// lie in one of P V's row groups, which [`o_rows`] relies on when O
    /// lives in P V's C layout (junk rows between the groups).
    #[test]
    fn row_vertices_nest_in_the_row_groups() {
        for rows in 1..=300 {
            let parts = ranges(rows, rows.min(ipu_arch::WORKER_CONTEXTS));
            for g in 1..=ROW_GROUPS_MAX.min(rows) {
                let groups = ranges(rows, g);
                for &(r0, r1) in &parts {
                    assert!(
                        groups.iter().any(|&(a, z)| a <= r0 && r1 <= z),
                        "{rows} rows, {g} groups: {r0}..{r1} in {groups:?}"
                    );
                }
            }
        }
    }

    /// The planner offers plans with and without the merge where the
    /// kernels allow both, and ranks them by their estimates: 1,024
    /// tokens of 2 heads of 64 on 8 tiles take one that accumulates.
    #[test]
    fn accumulating_plans_compete_with_merging_ones() {
        let b = test_block(2, 64, 1024);
        let mut k = declared_kernels(&b);
        let region1 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
        let plans = plan(&b, 8, &mut k, 0, false, (region1, u64::MAX), None);
        assert!(plans.iter().any(|p| p.acc) && plans.iter().any(|p| !p.acc));
        assert!(plans[0].acc, "{:#?}", plans[0]);
        k.acc_only = true;
        let plans = plan(&b, 8, &mut k, 0, false, (region1, u64::MAX), None);
        assert!(!plans.is_empty() && plans.iter().all(|p| p.acc));
        k.acc = None;
        let plans = plan(&b, 8, &mut k, 0, false, (region1, u64::MAX), None);
        assert!(!plans.is_empty() && plans.iter().all(|p| !p.acc));
    }

    /// V's ones column where the head's padding has room for it, where
    /// its column block costs the P V GEMM nothing (a head of 80: five
    /// blocks leave a worker idle) and never in f32; the online step's
    /// own sums where the block would cost (a head of 64).
    #[test]
    fn ones_column_where_it_costs_the_p_v_gemm_nothing() {
        let mut gemm = declared("gemm_f16.S", &[("ACC", 32)]);
        let online = |ones| [("PV", 1), ("PT", 16), ("EXP", 16), ("ONES", ones)];
        let mut online_sums = declared("attention_online.S", &online(0));
        let mut online_ones = declared("attention_online.S", &online(1));
        let mut merge_sums = declared("attention_merge.S", &[("ONES", 0)]);
        let mut merge_ones = declared("attention_merge.S", &[("ONES", 1)]);
        let block = |dv: u32, f32: bool| AttentionBlock {
            f32,
            ..test_block(2, dv, 1024)
        };
        for (dv, f32, ones, pv_cols) in [
            (72, false, true, 80),
            (18, false, true, 32),
            (80, false, true, 96),
            (64, false, false, 64),
            (16, false, true, 32),
            (72, true, false, 80),
        ] {
            let mut b = block(dv, f32);
            b.ones = ones_pays(
                &b,
                &mut gemm,
                (&mut online_sums, &mut merge_sums),
                (&mut online_ones, &mut merge_ones),
                None,
            );
            assert_eq!(b.ones, ones, "head of {dv}, f32 {f32}");
            assert_eq!(b.pv_cols(), pv_cols, "head of {dv}, f32 {f32}");
            assert!(!b.ones || b.ones_column() < b.pv_cols());
        }
        // Without the merge (P V accumulating into O) the comparison is
        // of the accumulating online steps, ONES=1 still 2 issue slots a
        // quad of keys cheaper.
        let acc = |ones| {
            declared(
                "attention_online.S",
                &[
                    ("PV", 1),
                    ("PT", 16),
                    ("EXP", 16),
                    ("ONES", ones),
                    ("ACC", 1),
                ],
            )
        };
        for (dv, ones) in [(72, true), (18, true), (80, true), (64, false), (16, true)] {
            let b = block(dv, false);
            let pays = ones_pays(
                &b,
                &mut gemm,
                (&mut online_sums, &mut merge_sums),
                (&mut online_ones, &mut merge_ones),
                Some((acc(0), acc(1))),
            );
            assert_eq!(pays, ones, "head of {dv} without the merge");
        }
    }

    #[test]
    fn overflow_room_is_whole_elements_of_what_a_plan_pushes_out() {
        let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
        let region1 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
        // The other buffers leave the attention 13,120 bytes of region 0
        // (the f32 attention of 1,024 tokens on 8 tiles).
        let room = OverflowRoom {
            others_excess: -13_120,
            reserve: 5 * element,
        };
        assert_eq!(room.needs(0), 0);
        assert_eq!(room.needs(13_120), 0);
        assert_eq!(room.needs(13_121), element);
        assert_eq!(room.needs(13_120 + 4 * element), 4 * element);
        assert_eq!(room.needs(13_121 + 4 * element), 5 * element);
        // 124,552 bytes of region 0 push out 111,432: four elements, and
        // 274,432 of region 1 leave them; 145,216 push out five, which
        // 262,656 of region 1 do not leave (by 512 bytes).
        assert!(room.fits(274_432, 124_552));
        assert!(!room.fits(262_656, 145_216));
        assert!(room.fits(region1 - 5 * element, 145_216));
        // Never more than the reserve the other segments leave.
        assert!(!room.fits(0, 13_121 + 5 * element));
        // Other buffers that overflow alone need room for any plan.
        let alone = OverflowRoom {
            others_excess: 1,
            reserve: element,
        };
        assert_eq!(alone.needs(0), element);
        assert!(!alone.fits(region1 - element + 1, 0));
        assert!(alone.fits(region1 - element, 0));
    }

    #[test]
    fn key_chunks_cover_each_split_in_order() {
        // Uneven splits, blocks and chunks: 67 column blocks in 3 splits
        // of 5 blocks, 1 to 5 chunks.
        for (key_cb, splits, blocks) in [(67, 3, 5), (64, 1, 16), (9, 2, 4)] {
            for chunks in 1..=blocks {
                let plan = chunked_plan(key_cb, splits, blocks, chunks);
                assert_eq!(plan.chunk_ranges().len() as u32, chunks);
                let mut widest = 0;
                for (k, &(s0, s1)) in plan.key_splits.iter().enumerate() {
                    // The chunks of a split are its blocks' columns, in
                    // order, each taken once.
                    let mut next = s0;
                    for c in 0..chunks as usize {
                        let (c0, c1) = plan.chunk_columns(k, c);
                        assert_eq!(c0, next, "{key_cb} {splits} {blocks} {chunks}");
                        assert!(c1 > c0);
                        widest = widest.max(c1 - c0);
                        next = c1;
                    }
                    assert_eq!(next, s1);
                }
                assert_eq!(plan.chunk_cb(), widest);
                if chunks == 1 {
                    let split_cb = plan.key_splits.iter().map(|c| c.1 - c.0).max().unwrap();
                    assert_eq!(plan.chunk_cb(), split_cb);
                }
            }
        }
    }

    #[test]
    fn home_shape_makes_the_largest_home_smallest() {
        // Llama-2-7B's q on a third of 1472 tiles: 34 rows of 4 heads on
        // 61 x 8 = 488 tiles, where the fewest rows took 16 rows of 11
        // heads.
        assert_eq!(home_shape(2048, 32, 490, false), (34, 4));
        // Few rows: one piece of every row, a head each.
        assert_eq!(home_shape(17, 4, 21, false), (16, 1));
        // An odd row count in one home a head: all 589 rows (in 590).
        assert_eq!(home_shape(589, 4, 4, true), (590, 1));
        assert_eq!(home_shape(589, 4, 4, false), (296, 2));
        // Against every shape: the pieces fit and none is smaller.
        for (rows, heads, pieces) in [
            (729, 16, 490),
            (2048, 16, 490),
            (200, 3, 1),
            (4096, 16, 490),
            (589, 4, 4),
            (583, 3, 7),
        ] {
            for keys in [false, true] {
                let (p, hp) = home_shape(rows, heads, pieces, keys);
                assert!(p % 2 == 0 && p >= HOST_HOME_ROWS.min(rows));
                assert!(
                    rows.div_ceil(p) * heads.div_ceil(hp) <= pieces,
                    "{rows} {heads} {pieces}"
                );
                let size = p.min(rows) * hp;
                let tallest = if keys { round_up(rows, 2) } else { rows };
                for q in (HOST_HOME_ROWS.min(rows)..=tallest).step_by(2) {
                    for hq in 1..=heads {
                        if rows.div_ceil(q) * heads.div_ceil(hq) <= pieces {
                            assert!(
                                q.min(rows) * hq >= size,
                                "{rows} {heads} {pieces}: {q} x {hq} < {p} x {hp}"
                            );
                        }
                    }
                }
            }
        }
    }
}
