//! Transposed ("columns") attention: the layout that keeps the AMP busy
//! when a tile holds few queries and many keys.
//!
//! The row layout (crate::attention) computes S = Q K^T with a tile's 16
//! or so queries as the GEMM's streamed rows: every weight block (of K^T,
//! then of V) serves only those few rows, so the AMP spends as long
//! loading weights as multiplying. Here the tile's keys are the streamed
//! rows instead:
//!
//! 1. `transpose q, v`: every tile of the Q and of the V projection
//!    transposes its result shard (`transpose_f16`), so that the exchange
//!    moves Q^T and V^T as runs of queries and keys (row parts of both
//!    projections and the query blocks start on even rows).
//! 2. a fill step (`fill64`): Q^T's head padding rows, the C
//!    headers, the ones row of V^T, V^T's and P^T's key padding; and a pad
//!    step (`fill_rows`): the head padding of every K row. Where the whole
//!    program is the block and its projections and region 1 holds all
//!    their buffers side by side, the attention's buffers live for the
//!    whole program instead of its phase, their padding is zero from load
//!    (no step writes it), and the initialize call sets the ones row.
//! 3. one exchange step: Q^T runs to every key split of the (head, query
//!    block), K rows (unchanged from the projection) and V^T runs to every
//!    query block of the head, in the split that holds the key.
//! 4. S^T = K Q^T (`gemm_f16` ACC=32: keys as rows, the tile's queries as
//!    one or two column blocks, K = the head padded to 16; the worker grid
//!    of row and column groups chosen by the kernel's formula).
//!    A causal block then masks, on the tiles whose keys some of their
//!    queries may not see, every hidden score of the rows some query sees
//!    with [`MASKED_SCORE`] / scale (`fill32`; [`mask_jobs`]: a row's
//!    hidden queries are a prefix of its columns, one job per partly
//!    hidden row, six jobs to a compute step), and zeroes the P^T rows of
//!    the keys no query of the tile sees, which the column maxima and the
//!    softmax skip ([`visible_rows`]). A query column whose every key of
//!    the split is hidden gets m = MASKED_SCORE and the combine (8.)
//!    weighs that split by exactly zero.
//! 5. `colmax_f16` IN=32 per row job of S^T (six jobs, whatever the GEMM's
//!    grid), then `softmax_cols` IN=32:
//!    the column maximum m (scaled), P^T = f16(exp(t)) with the argument
//!    t = S^T * scale - m formed in f32 and rounded to f16 for the
//!    exponential, written as the next GEMM's weights. (Rounding t moves p
//!    by at most u/e in absolute terms; EXP=32, the exponential in f32,
//!    cost 3,100 more cycles on SigLIP for the same output error: max
//!    1.709e-3 at seed 0 either way, 1.099e-3 against 1.221e-3 at seed 1.)
//! 6. O^T = [V^T; 1] P^T (`gemm_f16` ACC=32): the extra row of ones in the
//!    A operand gives the column sums l = sum_k p in the same pass. Worker
//!    K groups are summed into state slot 0 by `reduce_f32` IN=32 OUT=32;
//!    with one K group O^T stays in the GEMM's C buffer, the state
//!    exchange sends the other splits' rows from there, and `copy64`
//!    moves only the tile's own head columns and l into slot 0.
//! 7. with key splits: every split's tile combines a range of head columns
//!    (`combine_ranges`): it receives those O^T rows, the l row and m of
//!    every other split of its (head, query block) into slots after its
//!    own O^T, d / splits + 1 rows per split where one tile used to
//!    receive every split's whole state. A segment of a segmented model
//!    compiled again after a region-0 overflow keeps that older way (split
//!    0 combines whole rows): its output moves on through a join, whose
//!    region-0 exchange tables grow with every piece of a row.
//! 8. `attention_cols_final` on every split's tile, for its head columns:
//!    out = f16(sum_i a_i O^T_i / sum_i a_i l_i) with a_i = exp(m_i - max
//!    m), written as the part of the rows the host reads as `y`. Its
//!    vertices split queries or head columns, whichever is cheaper (the
//!    kernel recomputes a query pair's factors in every vertex).
//!
//! Where no plan of every head at once fits (long sequences, fewer tiles
//! than heads), the heads may run in rounds (`AttentionPlan::rounds`):
//! steps 2 to 8 once per round, for the round's heads, on the first
//! round's tiles and buffers, each round with output rows of its own.
//!
//! Only for f16 blocks, causal or not, whose head size is a multiple of
//! four (K rows and runs of queries move as 4-byte words; the head padding
//! of a K row is then whole 8-byte items). A causal block's GEMMs compute
//! its hidden scores like the others (the slowest tile, one that sees all
//! of its keys, sets the step either way). Invariants: whatever a GEMM multiplies
//! as padding is a finite value times an exact zero, or zero times zero:
//! Q^T's head padding rows, V^T's and P^T's key padding are zeroed each
//! run, and the head padding of each K row by the pad step. Q^T's query
//! padding columns are not: a column of S^T, P^T and O^T depends only on
//! the same column of Q^T, and no step stores a padding query's column.

use crate::attention::{
    launch_cycles, AttentionBlock, AttentionLayout, AttentionPlan, FillJob, ATTENTION_PHASE,
};
use crate::exchange::{self, BufferRef, BufferTransfer};
use crate::gemm::{
    aligned_ranges, best_split_with, ranges, FormulaCost, GemmCosts, GemmGeometry, ShardLayout,
    WorkerSplit,
};
use crate::library::KernelRequest;
use crate::lower::{
    BufferSpec, HostPlacement, HostTensor, Lowered, RegionReq, StateWord, Step, Vertex,
};
use crate::plan::STANDARD_BUDGET;
use crate::CompileError;
use ipu_graph::Graph;
use std::collections::BTreeMap;

/// The kernels of the column layout with their cost formulas.
#[derive(Clone)]
pub struct ColumnKernels {
    /// `gemm_f16` ACC=32, for both GEMMs: S^T in f32 (an f16 score would
    /// round by 2^-11 of |s * scale|, an absolute error of the exponent
    /// near the maximum) and O^T with l in f32 (sums of probabilities grow
    /// with every key; f16 chains of them tripled the SigLIP error).
    pub gemm: (KernelRequest, FormulaCost),
    /// `reduce_f32` IN=32 OUT=32: O^T's K-group partials summed in f32.
    pub reduce: (KernelRequest, FormulaCost),
    pub colmax: (KernelRequest, FormulaCost),
    pub softmax: (KernelRequest, FormulaCost),
    pub final_: (KernelRequest, FormulaCost),
    pub fill_rows: (KernelRequest, FormulaCost),
    /// `copy64`: O^T from the C buffer into state slot 0 when the O^T
    /// GEMM has one K group (nothing to sum; 8 bytes per issue slot where
    /// `reduce_f32` P = 1 takes 9 slots per 16 bytes).
    pub copy: (KernelRequest, FormulaCost),
    /// `fill32`: a causal block's masked scores ([`mask_jobs`]).
    pub mask: (KernelRequest, FormulaCost),
}

/// Requests for the column layout's own kernels (in [`ColumnKernels`]
/// order); `fill64` and `transpose_f16` come from the row layout's set.
pub fn kernel_requests() -> [KernelRequest; 8] {
    let req = |entry: &str, source: &str, params: &[(&str, i64)]| KernelRequest {
        entry: entry.into(),
        source: source.into(),
        params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    };
    [
        req("gemm_f16", "gemm_f16.S", &[("ACC", 32)]),
        req(
            "reduce_f32",
            "reduce_f32.S",
            &[("EPI", 0), ("IN", 32), ("OUT", 32)],
        ),
        req("colmax_f16", "colmax_f16.S", &[("IN", 32)]),
        req("softmax_cols", "softmax_cols.S", &[("EXP", 16), ("IN", 32)]),
        req("attention_cols_final", "attention_cols_final.S", &[]),
        req("fill_rows", "fill_rows.S", &[]),
        req("copy64", "copy64.S", &[]),
        req("fill32", "fill32.S", &[]),
    ]
}

/// The variables each formula reads, in [`kernel_requests`] order.
pub const FORMULA_VARS: [&[&str]; 8] = [
    &["M", "NCB", "NKB"],
    &["ROWS", "QUADS", "P"],
    &["ROWS", "QUADS"],
    &["ROWS", "QUADS", "W"],
    &["N", "CQ", "QN", "DN"],
    &["ROWS", "ITEMS"],
    &["BYTES"],
    &["N"],
];

/// Whether `block` can take the column layout (f16, one head size that is
/// a multiple of 4; causal or not).
pub fn applies(block: &AttentionBlock) -> bool {
    !block.f32 && block.d.is_multiple_of(4) && block.dv == block.d
}

/// The scaled score a causal mask gives a masked key: finite, so that the
/// column maxima, the exponent `t = s * scale - m` (in f32, then f16) and
/// the combine's factors `exp(m_i - max m)` stay finite, and so low that
/// `exp` of it is exactly zero in f16 and in f32. A query column whose
/// every key of a split is masked gets m = MASKED_SCORE there, and the
/// combine weighs that split's (finite) O^T and l by exactly zero.
pub const MASKED_SCORE: f32 = -30000.0;

/// One `fill32` job of a causal mask: `words` words from key row `row`,
/// column 0, of S^T's row group `group` set to the masked score, or, with
/// `group` None, of P^T set to zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MaskJob {
    group: Option<u32>,
    row: u32,
    words: u32,
}

/// The key rows `0..visible` of a tile's `n` keys `(k0, ..)` that some of
/// its queries `(q0, q1)` see (all of them for a non-causal block): key
/// `k0 + r` is hidden from every query when `k0 + r > q1 - 1 + (sk - sq)`.
/// At least one: a tile whose every key is hidden keeps row 0, masked
/// whole, so that its column maxima are the masked score.
fn visible_rows(b: &AttentionBlock, (_, q1): (u32, u32), (k0, _): (u32, u32), n: u32) -> u32 {
    if !b.causal {
        return n;
    }
    let cut = q1 as i64 + (b.sk as i64 - b.sq as i64) - k0 as i64;
    cut.clamp(1, n.max(1) as i64) as u32
}

/// The causal mask of one tile (keys `(k0, k1)` as S^T's rows, queries
/// `(q0, q1)` as its columns): key `k0 + r` is hidden from query `q0 + c`
/// when `k0 + r > q0 + c + (sk - sq)` (the reference's bottom-right
/// alignment), so row r's masked columns are the prefix
/// `c < k0 + r - q0 - (sk - sq)`, which grows by one a row. Each of the
/// [`visible_rows`] with a masked prefix gets a job of its own (a row
/// masked whole is only ever a wholly hidden tile's row 0). The rows after
/// the visible ones take no part in the column maxima and the softmax,
/// which skip them; their P^T rows are zeroed instead, in at most six jobs
/// of whole rows.
/// Empty for a non-causal block or a tile whose keys every query sees.
fn mask_jobs(
    b: &AttentionBlock,
    s: &Shapes,
    (q0, q1): (u32, u32),
    (k0, k1): (u32, u32),
) -> Vec<MaskJob> {
    if !b.causal {
        return Vec::new();
    }
    let n = k1 - k0;
    let visible = visible_rows(b, (q0, q1), (k0, k1), n);
    let nq = (q1 - q0) as i64;
    let shift = k0 as i64 - q0 as i64 - (b.sk as i64 - b.sq as i64);
    let mut jobs = Vec::new();
    for (g, &(r0, r1)) in s.st.1.row_groups.iter().enumerate() {
        for r in r0..r1.min(visible) {
            let words = (shift + r as i64).clamp(0, nq) as u32;
            if words > 0 {
                jobs.push(MaskJob {
                    group: Some(g as u32),
                    row: r,
                    words,
                });
            }
        }
    }
    if visible < n {
        let pt_words = s.pv.2.rs_b / 4;
        for (a, z) in ranges(n - visible, (n - visible).min(ipu_arch::WORKER_CONTEXTS)) {
            if z > a {
                jobs.push(MaskJob {
                    group: None,
                    row: visible + a,
                    words: (z - a) * pt_words,
                });
            }
        }
    }
    jobs
}

/// The column-maxima and softmax jobs of a tile ([`Shapes::st_jobs`])
/// over its visible rows only ([`visible_rows`]).
fn visible_st_jobs(s: &Shapes, visible: u32) -> Vec<StJob> {
    s.st_jobs()
        .into_iter()
        .filter(|j| j.r0 < visible)
        .map(|j| StJob {
            r1: j.r1.min(visible),
            ..j
        })
        .collect()
}

/// The column maxima's and the softmax's cycles over `jobs` (with their
/// launches), as [`step_cycles`] counts them.
fn colmax_softmax_cycles(
    (colmax, softmax): (&mut FormulaCost, &mut FormulaCost),
    jobs: &[StJob],
) -> (u64, u64) {
    let job_rows = jobs.iter().map(|j| j.r1 - j.r0).max().unwrap_or(0) as i64;
    let quads = jobs.iter().map(|j| j.q1 - j.q0).max().unwrap_or(0) as i64;
    let launch = launch_cycles(jobs.len() as u64);
    (
        colmax.eval(&[("ROWS", job_rows), ("QUADS", quads)]) + launch,
        softmax.eval(&[
            ("ROWS", job_rows),
            ("QUADS", quads),
            ("W", StJob::partial_maxima(jobs) as i64),
        ]) + launch,
    )
}

/// A column-maxima and softmax job over S^T: rows `r0..r1` of the S^T
/// GEMM's row group `g`, quads `q0..q1` of the tile's query columns, in
/// column group `c`. The colmax jobs of one column group write its partial
/// maxima, which each of its softmax jobs folds: splitting the columns
/// as well as the rows pays each quad's fold (2 bundles per partial
/// maximum) and the rest of its head once per worker over fewer quads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StJob {
    g: u32,
    r0: u32,
    r1: u32,
    c: u32,
    q0: u32,
    q1: u32,
}

impl StJob {
    /// The partial maxima each softmax job of `jobs` folds: the jobs of
    /// its column group (every group has the same rows).
    fn partial_maxima(jobs: &[StJob]) -> u32 {
        let groups = jobs.iter().map(|j| j.c + 1).max().unwrap_or(1);
        (jobs.len() as u32).div_ceil(groups)
    }
}

/// What a causal tile spends beyond a tile that sees all its keys: its
/// mask steps, less what its column maxima and softmax save on the rows
/// no query sees (negative when they save more).
fn causal_extra_cycles(
    b: &AttentionBlock,
    ck: &mut ColumnKernels,
    s: &Shapes,
    q: (u32, u32),
    k: (u32, u32),
) -> i64 {
    let masks = mask_rounds(mask_jobs(b, s, q, k))
        .iter()
        .map(|r| mask_cycles(r, &mut ck.mask.1))
        .sum::<u64>();
    let visible = visible_rows(b, q, k, k.1 - k.0);
    let kernels = (&mut ck.colmax.1, &mut ck.softmax.1);
    let (cm, sm) = colmax_softmax_cycles(kernels, &visible_st_jobs(s, visible));
    let kernels = (&mut ck.colmax.1, &mut ck.softmax.1);
    let (cm_all, sm_all) = colmax_softmax_cycles(kernels, &s.st_jobs());
    masks as i64 + (cm + sm) as i64 - (cm_all + sm_all) as i64
}

/// A tile's mask jobs in the compute steps that run them: a step starts at
/// most one vertex per worker, so the jobs go six to a step, the longest
/// first (each step then waits for its longest job only once).
fn mask_rounds(mut jobs: Vec<MaskJob>) -> Vec<Vec<MaskJob>> {
    jobs.sort_by_key(|j| std::cmp::Reverse(j.words));
    jobs.chunks(ipu_arch::WORKER_CONTEXTS as usize)
        .map(|c| c.to_vec())
        .collect()
}

/// The cycles of one step of mask jobs (at most six, one per worker): the
/// supervisor starts them 12 cycles apart, each taking `fill32`'s formula.
fn mask_cycles(jobs: &[MaskJob], mask: &mut FormulaCost) -> u64 {
    jobs.iter()
        .enumerate()
        .map(|(i, j)| launch_cycles(i as u64 + 1) + mask.eval(&[("N", j.words as i64)]))
        .max()
        .unwrap_or(0)
}

/// The query ranges of `qb` query blocks (even boundaries: Q^T moves runs
/// of queries as 4-byte words).
pub fn query_ranges(block: &AttentionBlock, qb: u32) -> Vec<(u32, u32)> {
    aligned_ranges(block.sq, qb, 2)
}

/// [`query_ranges`]' count and lengths.
fn query_sizes(block: &AttentionBlock, qb: u32) -> crate::gemm::PartSizes {
    crate::gemm::PartSizes::aligned(block.sq, qb, 2)
}

/// At most how few blocks [`query_ranges`] cuts `sq` queries into when
/// asked for `qb`: all `qb` while each is at least two queries (the exact
/// cuts then lie at least two apart, so their even roundings differ), and
/// past that every even boundary is still hit, about `sq / 2` blocks
/// (tested).
fn least_query_blocks(sq: u32, qb: u32) -> u32 {
    qb.min(sq / 2)
}

/// One tile's shapes: `rows` queries (the layout is sized for the most
/// rows of any tile), `n` keys of its split, `kp` keys of the widest split
/// (padded to 16).
#[derive(Clone, Debug)]
struct Shapes {
    d: u32,
    dp: u32,
    nqc: u32,
    kp: u32,
    /// S^T = K Q^T.
    st: (GemmGeometry, WorkerSplit, ShardLayout),
    /// O^T = [V^T; 1] P^T.
    pv: (GemmGeometry, WorkerSplit, ShardLayout),
    /// Compact buffers (`AttentionPlan::compact`): besides P^T and O^T's
    /// C in the S^T GEMM's buffers, each state slot holds only the rows a
    /// tile combines and the l row right after them ([`Shapes::slot_row`]).
    compact: bool,
    /// Column groups of the column-maxima and softmax jobs
    /// ([`Shapes::st_jobs`]), whichever count the kernels' formulas make
    /// fastest.
    job_col_groups: u32,
}

impl Shapes {
    /// The shapes of a tile with `rows` queries and `n` keys (`kp` the
    /// widest split's, padded), with compact buffers or without.
    fn new(
        b: &AttentionBlock,
        ck: &ColumnKernels,
        (rows, n, kp): (u32, u32, u32),
        compact: bool,
    ) -> Option<Shapes> {
        let (d, dp) = (b.d, b.dp());
        let nqc = rows.div_ceil(16);
        let st_g = GemmGeometry {
            m: n,
            k: dp,
            n: 16 * nqc,
            acc32: true,
            f16_result: false,
            row_align: 1,
            fp8_scale: None,
            f32_operands: false,
            reduce_f16: false,
            max_chain_blocks: u32::MAX,
            f32_reduce_step: false,
        };
        // S^T's worker grid: row groups x column groups of the six
        // workers, whichever the formula makes fastest (more rows per
        // vertex load each weight block for more products; the column
        // maxima and the softmax split rows into six jobs either way).
        let mut gemm = ck.gemm.1.clone();
        let w = ipu_arch::WORKER_CONTEXTS;
        let st_split = (1..=nqc.min(w))
            .map(|cg| WorkerSplit {
                row_groups: ranges(n, n.min(w / cg)),
                col_groups: ranges(nqc, cg),
                k_groups: vec![(0, dp / 16)],
            })
            .min_by_key(|split| {
                let m = split
                    .row_groups
                    .iter()
                    .map(|r| r.1 - r.0)
                    .max()
                    .unwrap_or(0);
                let ncb = split
                    .col_groups
                    .iter()
                    .map(|c| c.1 - c.0)
                    .max()
                    .unwrap_or(0);
                gemm.eval(&[
                    ("M", m as i64),
                    ("NCB", ncb as i64),
                    ("NKB", (dp / 16) as i64),
                ]) + launch_cycles(split.vertices() as u64)
            })
            .expect("at least one column group");
        let st_layout = ShardLayout::new(&st_g, n, nqc, &st_split);
        let pv_g = GemmGeometry {
            m: d + 1,
            k: kp,
            n: 16 * nqc,
            acc32: true,
            f16_result: false,
            row_align: 1,
            fp8_scale: None,
            f32_operands: false,
            reduce_f16: false,
            max_chain_blocks: u32::MAX,
            f32_reduce_step: false,
        };
        let mut costs = GemmCosts {
            memory_budget: u64::MAX / 4,
            owns_a: false,
            ..GemmCosts::new(ck.gemm.1.clone(), Some(ck.reduce.1.clone()))
        };
        let (pv_split, _, _) = best_split_with(&pv_g, d + 1, nqc, &mut costs, u32::MAX)?;
        let pv_layout = ShardLayout::new(&pv_g, d + 1, nqc, &pv_split);
        let mut shapes = Shapes {
            d,
            dp,
            nqc,
            kp,
            st: (st_g, st_split, st_layout),
            pv: (pv_g, pv_split, pv_layout),
            compact,
            job_col_groups: 1,
        };
        // The fewest column groups of the fastest jobs.
        let (mut colmax, mut softmax) = (ck.colmax.1.clone(), ck.softmax.1.clone());
        shapes.job_col_groups = (1..=shapes.most_job_col_groups())
            .min_by_key(|&cg| {
                let (c, s) =
                    colmax_softmax_cycles((&mut colmax, &mut softmax), &shapes.st_jobs_in(cg));
                c + s
            })
            .expect("at least one column group");
        Some(shapes)
    }
    /// The row of a state slot (from the slot's start, in O^T rows) that
    /// holds O^T row `row` for a tile combining head columns `(d0, d1)`:
    /// with compact buffers the rows `[d0, d1)` and then the l row (row
    /// d), otherwise the rows `d0..=d` in place (`row - d0`).
    fn slot_row(&self, (d0, d1): (u32, u32), row: u32) -> u32 {
        if self.compact && row >= d1 {
            d1 - d0 + (row - self.d)
        } else {
            row - d0
        }
    }
    /// Where slot 0 starts in the O^T buffer (see [`Shapes::ot_bytes`]).
    fn slot0(&self, (d0, _): (u32, u32)) -> u32 {
        if self.compact {
            0
        } else {
            d0 * self.pv.2.rs_d()
        }
    }
    fn quads(&self) -> u32 {
        4 * self.nqc
    }
    /// The column-maxima and softmax jobs over S^T ([`StJob`]): the
    /// quads cut into `job_col_groups` column groups, and in each every
    /// row group of the S^T GEMM cut so that six workers share the jobs.
    fn st_jobs(&self) -> Vec<StJob> {
        self.st_jobs_in(self.job_col_groups)
    }
    /// The most column groups the jobs may take: six workers, so at most
    /// as many groups as the S^T GEMM's row groups leave workers for.
    fn most_job_col_groups(&self) -> u32 {
        (ipu_arch::WORKER_CONTEXTS / self.st.1.row_groups.len() as u32)
            .max(1)
            .min(self.quads())
    }
    fn st_jobs_in(&self, col_groups: u32) -> Vec<StJob> {
        let groups = &self.st.1.row_groups;
        let per = (ipu_arch::WORKER_CONTEXTS / (groups.len() as u32 * col_groups)).max(1);
        let mut jobs = Vec::new();
        for (c, (q0, q1)) in ranges(self.quads(), col_groups).into_iter().enumerate() {
            for (g, &(r0, r1)) in groups.iter().enumerate() {
                for (a, z) in ranges(r1 - r0, per) {
                    jobs.push(StJob {
                        g: g as u32,
                        r0: r0 + a,
                        r1: r0 + z,
                        c: c as u32,
                        q0,
                        q1,
                    });
                }
            }
        }
        jobs
    }
    /// K rows (the S^T GEMM's A): `kp + 2` rows of the padded head.
    fn kr_bytes(&self) -> u32 {
        (self.kp + 2) * self.st.2.rs_a
    }
    /// Q^T (the S^T GEMM's B): padded head rows of `16 * nqc` queries.
    fn qt_bytes(&self) -> u32 {
        self.dp * self.st.2.rs_b
    }
    /// V^T with the ones row and the two drain rows (the O^T GEMM's A).
    fn vt_bytes(&self) -> u32 {
        (self.d + 3) * self.pv.2.rs_a
    }
    /// P^T (the O^T GEMM's B): `kp` key rows.
    fn pt_bytes(&self) -> u32 {
        self.kp * self.pv.2.rs_b
    }
    /// The C buffers serve both GEMMs (S^T is dead once P^T is written).
    fn c_bytes(&self) -> u32 {
        self.st.2.c_bytes().max(self.pv.2.c_bytes())
    }
    /// One split's O^T (f32, with the l row).
    fn ot_slot(&self) -> u32 {
        (self.d + 1) * self.pv.2.rs_d()
    }
    /// One split's m: an f32 per query column.
    fn m_slot(&self) -> u32 {
        4 * 16 * self.nqc
    }
    /// The output row stride of a tile that writes head columns `(d0,
    /// d1)`: only its own columns, in 8-byte rows (at least one item).
    fn rs_out(&self, (d0, d1): (u32, u32)) -> u32 {
        (2 * (d1 - d0)).div_ceil(8).max(1) * 8
    }
    fn softmax_scratch(&self) -> u32 {
        16 * self.quads() + 16
    }
    /// One colmax vertex's f32 maxima.
    fn maxes_row(&self) -> u32 {
        16 * self.quads()
    }
    /// One final vertex's scratch: `attention_cols_final` uses it only
    /// with three or more splits (a single item stands in otherwise).
    fn final_scratch(&self, splits: u32) -> u32 {
        if splits >= 3 {
            8 * self.quads() + 16
        } else {
            8
        }
    }
    /// A tile's region-1 buffers as (bytes, element-exclusive): P^T has
    /// one of its own unless the buffers are compact.
    fn region1_buffers(&self) -> Vec<(u32, bool)> {
        let mut buffers = vec![
            (self.kr_bytes(), true),
            (self.vt_bytes(), true),
            (self.c_bytes(), true),
            (self.c_bytes(), true),
            (self.qt_bytes(), false),
        ];
        if !self.compact {
            buffers.push((self.pt_bytes(), false));
        }
        buffers
    }
    /// Region 1 of a tile, `None` when it does not fit; with compact
    /// buffers also when P^T (after the zero header of the dead partials
    /// buffer `c2`, which O^T's K block 0 reads as its zero partials) or
    /// O^T's C buffers do not fit where they go.
    fn region1(&self) -> Option<u64> {
        if self.compact {
            if crate::gemm::C_HEADER + self.pt_bytes() > self.c_bytes() {
                return None;
            }
            self.ot_partials_offset()?;
        }
        crate::storage::region1_footprint(&self.region1_buffers())
    }
    /// Compact buffers: where O^T's second C buffer starts in the S^T
    /// result buffer (`c1`), at the first element boundary past the first
    /// (at offset 0), so that the two share no 32 KiB element, as the
    /// kernel's `ld2x64st64` needs; `None` when `c1` is too small. With
    /// compact buffers `c1` starts on an element boundary (the lowering
    /// aligns it so, which costs no element: an element-exclusive buffer
    /// takes its elements whole); before, the offset left a spare element
    /// for any start, and SAM ViT-H's tiles of 20 queries and 586 keys
    /// missed it by 896 bytes.
    fn ot_partials_offset(&self) -> Option<u32> {
        let e = ipu_arch::INTERLEAVED_ELEMENT_BYTES;
        let ot = self.pv.2.c_bytes();
        let off = ot.div_ceil(e) * e;
        (off + ot <= self.c_bytes()).then_some(off)
    }
    fn region0(&self, rows: u32, splits: u32, distributed: bool) -> u64 {
        let w = ipu_arch::WORKER_CONTEXTS;
        let ranges = self.combine_ranges(splits, distributed);
        let ot = ranges
            .iter()
            .map(|&r| self.ot_bytes(splits, r))
            .max()
            .unwrap_or(0);
        (ot + splits * self.m_slot()
            + rows * self.rs_out(ranges[0])
            + w * (self.maxes_row() + self.softmax_scratch() + self.final_scratch(splits)))
            as u64
    }
    /// Whether O^T stays in the C buffer after its GEMM: one K group (no
    /// partials to sum) and C rows as wide as the slots' rows. Then the
    /// state exchange sends the other splits' rows straight from C and
    /// `copy64` moves into state slot 0 only the rows this tile's final
    /// step reads ([`Shapes::ot_copies`]); otherwise `reduce_f32` sums the
    /// K groups into slot 0 (every row).
    fn ot_stays_in_c(&self) -> bool {
        let (_, split, lay) = &self.pv;
        split.k_groups.len() == 1 && lay.rs_c == lay.rs_d()
    }
    /// The O^T rows `[a, z)` in the C buffer of the O^T GEMM (rows `rs_c`
    /// apart, two drain rows before each row group): (C offset, first row,
    /// rows), one run per row group the range meets.
    fn ot_rows_in_c(&self, (a, z): (u32, u32)) -> Vec<(u32, u32, u32)> {
        let (_, split, lay) = &self.pv;
        split
            .row_groups
            .iter()
            .enumerate()
            .filter_map(|(gi, &(r0, r1))| {
                let (lo, hi) = (a.max(r0), z.min(r1));
                (hi > lo).then(|| (lay.c_row(0, gi as u32, lo), lo, hi - lo))
            })
            .collect()
    }
    /// The O^T rows a tile that combines head columns `r` reads from its
    /// own state: those columns and the l row (row d), as row ranges.
    fn own_state_rows(&self, (d0, d1): (u32, u32)) -> Vec<(u32, u32)> {
        if d1 == d0 {
            Vec::new()
        } else if d1 == self.d {
            vec![(d0, self.d + 1)]
        } else {
            vec![(d0, d1), (self.d, self.d + 1)]
        }
    }
    /// With O^T kept in C ([`Shapes::ot_stays_in_c`]), the `copy64` runs
    /// that move a tile's own rows for head columns `r` (and the l row)
    /// into state slot 0: (C offset, slot offset, bytes), whole rows of
    /// one row group, at most six. The other rows
    /// leave the tile from C in the state exchange, so a tile with 4
    /// splits copies 19 of SigLIP's 73 rows where it used to copy all of
    /// them (the copy took 1,482 cycles). `None` when O^T does not stay
    /// in C.
    fn ot_copies(&self, r: (u32, u32)) -> Option<Vec<(u32, u32, u32)>> {
        if !self.ot_stays_in_c() {
            return None;
        }
        let lay = &self.pv.2;
        let runs: Vec<(u32, u32, u32)> = self
            .own_state_rows(r)
            .into_iter()
            .flat_map(|rows| self.ot_rows_in_c(rows))
            .collect();
        // The fewest rows per copy that cut the runs into at most six.
        let total: u32 = runs.iter().map(|x| x.2).sum();
        let mut per = total.div_ceil(ipu_arch::WORKER_CONTEXTS).max(1);
        while runs.iter().map(|x| x.2.div_ceil(per)).sum::<u32>() > ipu_arch::WORKER_CONTEXTS {
            per += 1;
        }
        let mut out = Vec::new();
        for (c, row, n) in runs {
            let mut k = 0;
            while k < n {
                let m = per.min(n - k);
                let to = self.slot0(r) + self.slot_row(r, row + k) * lay.rs_d();
                out.push((c + k * lay.rs_c, to, m * lay.rs_c));
                k += m;
            }
        }
        Some(out)
    }
    /// The head columns each key split's tile combines and writes: even,
    /// near-equal ranges (empty for splits beyond d / 2).
    fn combine_ranges(&self, splits: u32, distributed: bool) -> Vec<(u32, u32)> {
        if distributed {
            // One range per split, even when the head has fewer column
            // pairs than there are splits: those splits combine nothing
            // (an empty range at the end, as split 0 alone does below).
            let mut r = pair_ranges(0, self.d, splits);
            r.resize(splits as usize, (self.d, self.d));
            r
        } else {
            let mut r = vec![(self.d, self.d); splits as usize];
            r[0] = (0, self.d);
            r
        }
    }
    /// The distance between the state slots of a tile that combines head
    /// columns `(d0, d1)`: slot i holds O^T rows d0..=d (only `[d0, d1)`
    /// and the l row d are written), so that every slot, the tile's own
    /// O^T (slot 0, all rows) included, has the same layout from row d0
    /// on, as `attention_cols_final` reads them. With compact buffers a
    /// slot holds only rows `[d0, d1)` and the l row after them, the
    /// tile's own rows copied into slot 0 alike ([`Shapes::slot_row`]).
    fn state_slot(&self, (d0, d1): (u32, u32)) -> u32 {
        if self.compact {
            (d1 - d0 + 1) * self.pv.2.rs_d()
        } else {
            (self.d - d0 + 1) * self.pv.2.rs_d()
        }
    }
    /// The tile's O^T buffer: its own O^T, then with key splits the other
    /// splits' slots.
    fn ot_bytes(&self, splits: u32, r: (u32, u32)) -> u32 {
        if splits == 1 || r.1 == r.0 {
            self.ot_slot()
        } else {
            self.slot0(r) + splits * self.state_slot(r)
        }
    }
    /// Bytes a tile with head columns `(d0, d1)` receives in the state
    /// exchange: of every other split, those O^T rows, the l row and m.
    fn state_bytes(&self, splits: u32, r: (u32, u32)) -> u64 {
        if r.1 == r.0 {
            return 0;
        }
        (splits as u64 - 1) * (((r.1 - r.0 + 1) * self.pv.2.rs_d() + self.m_slot()) as u64)
    }
    /// The final vertices of a tile that combines head columns `(d0, d1)`
    /// of `rows` queries over `splits` splits, as (first query, queries,
    /// first head column, head columns), and the slowest one's cycles: the
    /// worker grid of head-column groups x query groups with the fewest
    /// cycles (the kernel recomputes a query pair's factors in every
    /// vertex, so with many splits query groups are cheaper).
    fn final_vertices(
        &self,
        final_: &mut FormulaCost,
        rows: u32,
        splits: u32,
        (d0, d1): (u32, u32),
    ) -> (Vec<FinalVertex>, u64) {
        let w = ipu_arch::WORKER_CONTEXTS;
        let mut best: Option<(Vec<FinalVertex>, u64)> = None;
        if d1 == d0 || rows == 0 {
            return (Vec::new(), 0);
        }
        let pairs = (d1 - d0) / 2;
        for dg in 1..=w.min(pairs) {
            let qg = (w / dg).min(rows.div_ceil(2));
            let dparts = pair_ranges(d0, d1, dg);
            let qparts = aligned_ranges(rows, qg, 2);
            let mut vertices = Vec::new();
            let mut slowest = 0;
            for &(q0, q1) in &qparts {
                for &(a, z) in &dparts {
                    if q1 == q0 || z == a {
                        continue;
                    }
                    slowest = slowest.max(final_.eval(&[
                        ("N", splits as i64),
                        ("CQ", self.quads() as i64),
                        ("QN", (q1 - q0) as i64),
                        ("DN", (z - a) as i64),
                    ]));
                    vertices.push((q0, q1 - q0, a, z - a));
                }
            }
            let cycles = slowest + launch_cycles(vertices.len() as u64);
            if best.as_ref().is_none_or(|b| cycles < b.1) {
                best = Some((vertices, cycles));
            }
        }
        best.expect("a non-empty range has a grid")
    }
}

/// One final vertex: (first query, queries, first head column, head
/// columns).
type FinalVertex = (u32, u32, u32, u32);

/// The keys `[k0, k1)` of `splits` key splits of `sk` keys: near-equal
/// ranges that start on even keys, since the exchange moves V^T's runs of
/// keys as whole words (the last one ends on an odd `sk`). (Splits of whole
/// 16-key blocks, as the row layout takes them, left SigLIP's four splits
/// 176, 192, 176 and 185 keys: the slowest tile's S^T, softmax and K and
/// V^T exchange sized for 192.)
pub fn key_ranges(sk: u32, splits: u32) -> Vec<(u32, u32)> {
    pair_ranges(0, sk.next_multiple_of(2), splits)
        .into_iter()
        .map(|(a, z)| (a, z.min(sk)))
        .collect()
}

/// The key splits each query block of a causal block takes: the leading
/// splits that hold a key some query of the block sees (key `k` is seen by
/// query `q1 - 1` when `k <= q1 - 1 + (sk - sq)`), at least one. Since
/// every block takes a prefix of the same splits, a key run of one split
/// still goes to all its blocks' tiles in one multicast. Empty for a
/// non-causal block (every block takes every split).
pub fn block_splits(
    b: &AttentionBlock,
    qranges: &[(u32, u32)],
    key_splits: &[(u32, u32)],
) -> Vec<u32> {
    if !b.causal {
        return Vec::new();
    }
    qranges
        .iter()
        .map(|&(_, q1)| {
            let last_seen = q1 as i64 - 1 + b.sk as i64 - b.sq as i64;
            let seen = key_splits
                .iter()
                .filter(|&&(k0, _)| k0 as i64 <= last_seen)
                .count() as u32;
            seen.max(1)
        })
        .collect()
}

/// The most keys of any split.
fn widest_split(key_splits: &[(u32, u32)]) -> u32 {
    key_splits.iter().map(|r| r.1 - r.0).max().unwrap_or(1)
}

/// `[a, z)` (even `a` and `z`) cut into `parts` near-equal ranges of whole
/// pairs (empty ones when there are fewer pairs than parts).
fn pair_ranges(a: u32, z: u32, parts: u32) -> Vec<(u32, u32)> {
    ranges((z - a) / 2, parts)
        .into_iter()
        .map(|(p, q)| (a + 2 * p, a + 2 * q))
        .collect()
}

/// The fill job that zeroes P^T's padding keys (rows `n..kp`) of a tile
/// with `n` keys, if it has any: in the fill step (`fill_jobs`), or with
/// compact buffers in a step of its own after the S^T GEMM, which
/// overwrites the partials buffer that P^T shares.
fn pt_padding_jobs(s: &Shapes, t: &TileBuffers, n: u32) -> Vec<FillJob> {
    if n >= s.kp {
        return Vec::new();
    }
    vec![(
        t.pt,
        t.pt_base + n * s.pv.2.rs_b,
        (s.kp - n) * s.pv.2.rs_b,
        0,
        0,
    )]
}

/// The cycles of the step that zeroes P^T's padding keys after the S^T
/// GEMM with compact buffers, on a tile with `n` keys (0 without one).
fn pt_padding_cycles(s: &Shapes, n: u32, fill: &mut FormulaCost) -> u64 {
    let jobs = pt_padding_jobs(s, &TileBuffers::default(), n);
    if !s.compact || jobs.is_empty() {
        return 0;
    }
    let (vertices, slowest) = crate::attention::fill_vertices(&jobs, fill);
    slowest + launch_cycles(vertices.len() as u64)
}

/// `fill64` vertices for `jobs` (`crate::attention::fill_vertices`) and
/// their cycles: the slowest vertex and the launches.
fn fill_work(jobs: &[FillJob], fill: &mut (KernelRequest, FormulaCost)) -> (Vec<Vertex>, u64) {
    let (states, slowest) = crate::attention::fill_vertices(jobs, &mut fill.1);
    let cycles = slowest + launch_cycles(states.len() as u64);
    let kernel = std::sync::Arc::new(fill.0.clone());
    let vertices = states
        .into_iter()
        .map(|state| Vertex {
            kernel: kernel.clone(),
            state,
        })
        .collect();
    (vertices, cycles)
}

/// The fill-step jobs of one tile (buffer indices in `t`), `n` its keys.
fn fill_jobs(s: &Shapes, t: &TileBuffers, n: u32) -> (Vec<FillJob>, Vec<RowJob>) {
    let ones = 0x3C00_3C00u32;
    let mut jobs = vec![
        // Q^T's head padding rows meet K's zeroed head padding: they only
        // need to be finite, and phase 1 may have left any bits there.
        // Its query padding columns need nothing: they only reach S^T's,
        // P^T's and O^T's padding columns, which no step stores.
        (t.qt, s.d * s.st.2.rs_b, (s.dp - s.d) * s.st.2.rs_b, 0, 0),
        (t.c1, 0, crate::gemm::C_HEADER, 0, 0),
        (t.c2, 0, crate::gemm::C_HEADER, 0, 0),
        // The ones row of V^T (padding keys meet P^T's zero rows).
        (t.vt, s.d * s.pv.2.rs_a, s.pv.2.rs_a, ones, ones),
        // The word after the last K row's head (the pad step covers the
        // rows' own padding; the GEMM's drain rows never matter).
        (t.kr, n * s.st.2.rs_a, s.st.2.rs_a, 0, 0),
    ];
    // With compact buffers the S^T GEMM overwrites P^T's padding keys
    // after this step; `pt_padding_jobs` zeroes them after it.
    if !s.compact {
        jobs.extend(pt_padding_jobs(s, t, n));
    }
    jobs.retain(|j| j.2 > 0);
    let mut rows = Vec::new();
    let head_pad = (s.dp - s.d) * 2;
    if head_pad > 0 {
        rows.push(RowJob {
            buffer: t.kr,
            offset: s.d * 2,
            stride: s.st.2.rs_a,
            rows: n,
            items: head_pad / 8,
        });
    }
    // V^T's key padding in each head row: whole 8-byte items from the one
    // that holds key n (the exchange rewrites its real keys afterwards).
    let first = (2 * n) / 8 * 8;
    if first < s.pv.2.rs_a {
        rows.push(RowJob {
            buffer: t.vt,
            offset: first,
            stride: s.pv.2.rs_a,
            rows: s.d,
            items: (s.pv.2.rs_a - first) / 8,
        });
    }
    (jobs, rows)
}

/// `ranges` sorted, with touching or overlapping ones joined.
fn merged_ranges(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (a, z) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(z),
            _ => out.push((a, z)),
        }
    }
    out
}

/// Zero items of equally spaced rows (`fill_rows`).
#[derive(Clone, Copy, Debug)]
struct RowJob {
    buffer: usize,
    offset: u32,
    stride: u32,
    rows: u32,
    items: u32,
}

/// `fill_rows` vertices for `jobs`: the six workers shared in proportion
/// to each job's bundles, a job's rows cut into that many ranges. Returns
/// the vertices' states and the slowest vertex's formula cycles.
fn row_job_vertices(jobs: &[RowJob], ck: &mut ColumnKernels) -> (Vec<Vec<StateWord>>, u64) {
    let w = ipu_arch::WORKER_CONTEXTS;
    let cost = |j: &RowJob| (j.items * (6 + j.rows)) as u64;
    let total: u64 = jobs.iter().map(cost).sum();
    let mut left = w;
    let mut out = Vec::new();
    let mut slowest = 0;
    for (i, j) in jobs.iter().enumerate() {
        let share = if i + 1 == jobs.len() {
            left
        } else {
            ((cost(j) * w as u64).div_ceil(total.max(1)) as u32)
                .clamp(1, left.saturating_sub((jobs.len() - i - 1) as u32).max(1))
        };
        left = left.saturating_sub(share);
        for (r0, r1) in ranges(j.rows, share.min(j.rows)) {
            slowest = slowest.max(
                ck.fill_rows
                    .1
                    .eval(&[("ROWS", (r1 - r0) as i64), ("ITEMS", j.items as i64)]),
            );
            out.push(vec![
                StateWord::Addr {
                    buffer: j.buffer,
                    offset: j.offset + r0 * j.stride,
                },
                StateWord::Const(j.stride),
                StateWord::Const(r1 - r0),
                StateWord::Const(j.items),
                StateWord::Const(0),
                StateWord::Const(0),
            ]);
        }
    }
    (out, slowest)
}

/// Estimated cycles of every compute step of one tile with `rows`
/// queries, `n` keys and `splits` key splits, in lowering order: fill,
/// pad, S^T, colmax, softmax, O^T, reduce, final (the last only on split 0).
fn step_cycles(
    fill: &mut FormulaCost,
    ck: &mut ColumnKernels,
    s: &Shapes,
    rows: u32,
    n: u32,
    splits: u32,
    distributed: bool,
) -> Vec<u64> {
    let w = ipu_arch::WORKER_CONTEXTS as u64;
    let dummy = TileBuffers::default();
    let (jobs, row_jobs) = fill_jobs(s, &dummy, n);
    let items: u32 = jobs.iter().map(|j| j.2 / 8).sum();
    let per = items.div_ceil(w as u32) as i64;
    let fill_c = fill.eval(&[
        ("N", (jobs.len() as u64).div_ceil(w) as i64 + 1),
        ("COUNT", per),
    ]) + launch_cycles(w);
    let (pads, pad_slowest) = row_job_vertices(&row_jobs, ck);
    let pad_c = if pads.is_empty() {
        0
    } else {
        pad_slowest + launch_cycles(pads.len() as u64)
    };
    let sts = &s.st.1;
    let st_m = sts.row_groups.iter().map(|r| r.1 - r.0).max().unwrap_or(0) as i64;
    let st_ncb = sts.col_groups.iter().map(|c| c.1 - c.0).max().unwrap_or(0) as i64;
    let st_c = ck
        .gemm
        .1
        .eval(&[("M", st_m), ("NCB", st_ncb), ("NKB", (s.dp / 16) as i64)])
        + launch_cycles(sts.vertices() as u64);
    let kernels = (&mut ck.colmax.1, &mut ck.softmax.1);
    let (colmax_c, softmax_c) = colmax_softmax_cycles(kernels, &s.st_jobs());
    let mut costs = GemmCosts {
        memory_budget: u64::MAX / 4,
        owns_a: false,
        ..GemmCosts::new(ck.gemm.1.clone(), Some(ck.reduce.1.clone()))
    };
    let (pv_gemm, mut pv_reduce) = costs.split_cycles(&s.pv.0, &s.pv.1);
    let mut moves = s.pv.1.reduce_vertices();
    // With one K group the reduce step only moves O^T from the C buffer
    // into state slot 0: copies of the rows the tile reads itself (the
    // slowest tile's), or a reduce with P = 1.
    if s.ot_stays_in_c() {
        let mut slowest = (0, 0);
        for r in s.combine_ranges(splits, distributed) {
            let copies = s.ot_copies(r).unwrap_or_default();
            let c = copies
                .iter()
                .map(|c| ck.copy.1.eval(&[("BYTES", c.2 as i64)]))
                .max()
                .unwrap_or(0);
            let with_launch = c + launch_cycles(copies.len() as u64);
            if with_launch > slowest.0 + launch_cycles(slowest.1 as u64) {
                slowest = (c, copies.len());
            }
        }
        (pv_reduce, moves) = slowest;
    } else if s.pv.1.k_groups.len() == 1 {
        for (_, r, c) in s.pv.1.reduce_parts() {
            pv_reduce = pv_reduce.max(ck.reduce.1.eval(&[
                ("ROWS", (r.1 - r.0) as i64),
                ("QUADS", 4 * (c.1 - c.0) as i64),
                ("P", 1),
            ]));
        }
    }
    let pv_c = pv_gemm + launch_cycles(s.pv.1.vertices() as u64);
    let reduce_c = pv_reduce
        + if moves > 0 {
            launch_cycles(moves as u64)
        } else {
            0
        };
    let final_c = s
        .combine_ranges(splits, distributed)
        .into_iter()
        .map(|r| s.final_vertices(&mut ck.final_.1, rows, splits, r).1)
        .max()
        .unwrap_or(0);
    vec![
        fill_c, pad_c, st_c, colmax_c, softmax_c, pv_c, reduce_c, final_c,
    ]
}

/// Column-layout candidates for `block` over at most `tiles` tiles (see
/// crate::attention::plan, which merges them with the row layout's).
pub fn plan(
    block: &AttentionBlock,
    tiles: u32,
    fill: &mut FormulaCost,
    ck: &mut ColumnKernels,
    projection_cycles: u64,
    distributed: bool,
    region1_cap: u64,
) -> Vec<AttentionPlan> {
    if !applies(block) {
        return Vec::new();
    }
    // Compact buffers and rounds only where no plan of every head at once
    // with buffers of their own fits (long sequences: each score takes 10
    // bytes of region 1 a tile with its own P^T, 8 without), so the plans
    // that fit otherwise are unchanged.
    let mut search = |compact: bool, rounds: u32| {
        candidates(
            block,
            tiles,
            (&mut *fill, &mut *ck),
            projection_cycles,
            distributed,
            (compact, rounds),
            region1_cap,
        )
    };
    let plans = search(false, 1);
    if !plans.is_empty() {
        return plans;
    }
    // Otherwise compact buffers, and heads in rounds on the same tiles
    // (with or without compact buffers): the fewest rounds with a plan.
    // Each round's heads have twice the tiles or more, and the estimates
    // choose: Pythia-410M's attention at 2048 causal tokens runs 400,364
    // cycles in two rounds where every head at once with compact buffers
    // ran 414,833; a non-causal one of that size has twice the scores a
    // tile and no plan of every head at once. (More rounds only shrink a
    // tile's scores further, which an attempt that plans the projections
    // on the same tiles takes for the room it leaves them, although the
    // projections in a segment of their own run faster: 576,760 cycles in
    // two rounds there against an estimated 660,747 in three.)
    let mut plans = search(true, 1);
    for rounds in 2..=block.heads {
        if block.heads.div_ceil(rounds) == block.heads.div_ceil(rounds - 1) {
            continue;
        }
        let before = plans.len();
        plans.extend(search(false, rounds));
        plans.extend(search(true, rounds));
        if plans.len() > before {
            break;
        }
    }
    plans
}

/// The candidates of [`plan`] with compact buffers or without (with them,
/// query blocks of up to 128 rows, where the others stop at 64), the heads
/// in `rounds` rounds on the same tiles (`AttentionPlan::rounds`).
fn candidates(
    block: &AttentionBlock,
    tiles: u32,
    (fill, ck): (&mut FormulaCost, &mut ColumnKernels),
    projection_cycles: u64,
    distributed: bool,
    (compact, rounds): (bool, u32),
    region1_cap: u64,
) -> Vec<AttentionPlan> {
    let mut out = Vec::new();
    let ncb = block.key_blocks();
    let most_rows = if compact { 128 } else { 64 };
    let round_heads = block.heads.div_ceil(rounds);
    for splits in (1u32..=8).filter(|&s| s <= ncb) {
        let key_splits = key_ranges(block.sk, splits);
        let n = widest_split(&key_splits);
        let kp = n.div_ceil(16) * 16;
        let mut seen = std::collections::BTreeSet::new();
        for qb in 1..=block.sq {
            // Most counts are ruled out before their ranges are cut
            // (cutting every count's made this loop quadratic in the
            // queries): every query block takes a tile per head of a round
            // (one per key split without a causal mask), so a count whose
            // least number of blocks needs more tiles than there are is
            // skipped first; then one whose widest block exceeds what a
            // tile takes or repeats a width already planned.
            let tiles_per_block = round_heads * if block.causal { 1 } else { splits };
            if tiles_per_block * least_query_blocks(block.sq, qb) > tiles {
                continue;
            }
            let sizes = query_sizes(block, qb);
            let rows = sizes.lengths.last().copied().unwrap_or(0);
            if rows > most_rows || seen.contains(&rows) || tiles_per_block * sizes.count > tiles {
                continue;
            }
            let qr = query_ranges(block, qb);
            let per_block = block_splits(block, &qr, &key_splits);
            let per_head = if per_block.is_empty() {
                qr.len() as u32 * splits
            } else {
                per_block.iter().sum()
            };
            let attention_tiles = round_heads * per_head;
            if attention_tiles > tiles {
                continue;
            }
            seen.insert(rows);
            let Some(s) = Shapes::new(block, ck, (rows, n, kp), compact) else {
                continue;
            };
            if compact && !s.ot_stays_in_c() {
                continue;
            }
            let Some(r1) = s.region1().filter(|&r1| r1 <= region1_cap) else {
                continue;
            };
            // Every round's output rows stay for the host.
            let r0 = s.region0(rows, splits, distributed)
                + (rounds as u64 - 1)
                    * (rows * s.rs_out(s.combine_ranges(splits, distributed)[0])) as u64;
            if r0 > STANDARD_BUDGET / 2 {
                continue;
            }
            let steps = step_cycles(fill, ck, &s, rows, n, splits, distributed);
            // A causal block's tiles beyond one that sees all its keys:
            // the slowest's mask steps less its skipped rows.
            let taken = |qi: usize| per_block.get(qi).map_or(splits, |&t| t) as usize;
            let mask = qr
                .iter()
                .enumerate()
                .flat_map(|(qi, &q)| key_splits[..taken(qi)].iter().map(move |&k| (q, k)))
                .map(|(q, k)| causal_extra_cycles(block, ck, &s, q, k).max(0) as u64)
                .max()
                .unwrap_or(0);
            let narrowest = key_splits.iter().map(|r| r.1 - r.0).min().unwrap_or(n);
            let compute: u64 =
                steps.iter().sum::<u64>() + mask + pt_padding_cycles(&s, narrowest, fill);
            // Every tile receives its queries' Q^T, its split's K rows and
            // V^T; with splits, every tile that combines head columns
            // receives the other splits' O^T rows of them, l and m.
            let received = (rows as u64 + 2 * n as u64) * block.d as u64 * 2;
            let mut exchange = ipu_arch::SYNC_CYCLES
                + received.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
            if splits > 1 {
                let state = s
                    .combine_ranges(splits, distributed)
                    .into_iter()
                    .map(|r| s.state_bytes(splits, r))
                    .max()
                    .unwrap_or(0);
                exchange += ipu_arch::SYNC_CYCLES
                    + state.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
            }
            // Each round runs every step again on the same tiles.
            let (compute, exchange) = (compute * rounds as u64, exchange * rounds as u64);
            out.push(AttentionPlan {
                layout: AttentionLayout::Columns,
                query_blocks: qr.len() as u32,
                rows,
                key_splits: key_splits.clone(),
                block_splits: per_block,
                key_blocks: vec![(0, kp / 16)],
                tiles: attention_tiles,
                compute_cycles: compute,
                exchange_bound_cycles: exchange,
                projection_cycles,
                prefix_cycles: steps[0] + steps[1],
                region1_bytes: r1,
                region0_bytes: r0,
                distributed_combine: distributed,
                rounds,
                compact,
                projections_planned_over: None,
                key_chunks: 1,
                query_rounds: false,
                acc: false,
            });
        }
    }
    out
}

/// Buffers of one attention tile (indices into its buffer list).
#[derive(Clone, Copy, Debug, Default)]
struct TileBuffers {
    kr: usize,
    qt: usize,
    vt: usize,
    pt: usize,
    /// Where P^T starts in `pt`: 0, or with compact buffers the zero
    /// header's end in `c2`.
    pt_base: u32,
    c1: usize,
    c2: usize,
    maxes: usize,
    sm_scratch: usize,
    ot: usize,
    m: usize,
    out: usize,
    fin_scratch: usize,
}

/// One tile of the attention: head, query block, key split, its buffers.
struct AttTile {
    h: u32,
    qi: u32,
    ks: u32,
    n: u32,
    bufs: TileBuffers,
    /// The operands' padding is zero from load (see `lower`), so the run
    /// has no fill or pad vertices on the tile and the initialize call
    /// sets V^T's ones row.
    padding_from_load: bool,
}

/// Appends the attention block to `l` in the column layout (see the module
/// documentation).
#[allow(clippy::too_many_arguments)]
pub fn lower(
    graph: &Graph,
    block: &AttentionBlock,
    plan: &AttentionPlan,
    transpose: &mut (KernelRequest, FormulaCost),
    fill: &mut (KernelRequest, FormulaCost),
    ck: &mut ColumnKernels,
    l: &mut Lowered,
    exchange_label: u32,
    whole_program: bool,
) -> Result<(), CompileError> {
    let b = block;
    let name = graph.value(b.attention).name.clone();
    let y_name = graph.value(b.result).name.clone();
    let compute_step = |phase: String| Step::empty(name.clone(), phase);
    let d = b.d;
    let qranges = plan.query_ranges(b);
    let splits = plan.key_splits.len() as u32;
    let n_widest = widest_split(&plan.key_splits);
    let kp = n_widest.div_ceil(16) * 16;
    let split_keys = |ks: u32| -> (u32, u32) {
        let (k0, k1) = plan.key_splits[ks as usize];
        (k0, k1 - k0)
    };
    let bad = |message: String| CompileError::Verifier {
        phase: "lower",
        message,
    };
    // One layout for every tile (sized for the most rows and keys); the
    // steps use each tile's own rows and keys.
    let shapes = Shapes::new(b, ck, (plan.rows, n_widest, kp), plan.compact)
        .ok_or_else(|| bad(format!("attention {name}: no worker split of O^T")))?;
    let spec =
        |role: &str, bytes: u32, region: RegionReq, exclusive: bool, category: &str| BufferSpec {
            name: format!("{name}.{role}"),
            bytes,
            align: if region == RegionReq::Interleaved {
                16
            } else {
                8
            },
            region,
            exclusive_element: exclusive,
            zero: vec![],
            category: category.into(),
            scratch: None,
            lifetime: None,
            kernel_segment: None,
        };
    // The operands' and scores' buffers are scratch of the attention's
    // phase, so that they may share memory with the projections' phase-1
    // buffers, and then every run zeroes their padding again (the fill
    // and pad steps, about 1,300 cycles on SigLIP). Where the whole
    // program is this block and its projections, and region 1 holds them
    // all side by side (`storage::region1_holds`), they live for the
    // whole program instead and their padding is zero from load: no step
    // writes it (the exchange writes the
    // operands' real elements, the softmax P^T's real keys, the GEMMs C
    // after its header). V^T's ones row, which no step writes either, is
    // set once by the initialize call.
    let attention_region1 = shapes.region1_buffers();
    // Compact buffers (see `Shapes::region1`): O^T's second C
    // buffer in c1 at this offset, P^T in c2 after its zero header.
    let ot_partials = if plan.compact {
        let off = shapes.ot_partials_offset().ok_or_else(|| {
            bad(format!(
                "attention {name}: O^T's C buffers do not fit the S^T result buffer"
            ))
        })?;
        Some(off)
    } else {
        None
    };
    let keeps_padding = |bufs: &[BufferSpec]| {
        whole_program && crate::storage::region1_holds(bufs, &attention_region1)
    };
    // With heads in rounds (`AttentionPlan::rounds`) the heads of every
    // round take the first round's tiles and buffers, one round after the
    // other.
    let rounds = plan.rounds.max(1);
    let round_heads = plan.round_heads(b);
    let tile_of = |h: u32, qi: u32, ks: u32| plan.tile(h % round_heads, qi, ks);
    let mut tiles: BTreeMap<u32, AttTile> = BTreeMap::new();
    for h in 0..round_heads {
        for qi in 0..qranges.len() as u32 {
            // A causal block's tiles: the splits that hold a key some of
            // its queries see.
            let splits = plan.splits_of(qi);
            for ks in 0..splits {
                let tile = plan.tile(h, qi, ks);
                let (_, n) = split_keys(ks);
                let s = &shapes;
                let bufs = l
                    .buffers
                    .get_mut(&tile)
                    .expect("attention tiles are below tile_count");
                let padding_from_load = keeps_padding(bufs);
                let scratch = |mut s: BufferSpec| {
                    if !padding_from_load {
                        s.scratch = Some(ATTENTION_PHASE);
                    }
                    s
                };
                let mut push = |spec: BufferSpec| {
                    bufs.push(spec);
                    bufs.len() - 1
                };
                // Every tile combines a range of head columns: m slots for
                // every split (its own in slot 0), and compact O^T slots.
                let slots = splits;
                let range = s.combine_ranges(splits, plan.distributed_combine)[ks as usize];
                let mut t = TileBuffers {
                    kr: push(scratch(spec(
                        "k_rows",
                        s.kr_bytes(),
                        RegionReq::Interleaved,
                        true,
                        "attention_operand",
                    ))),
                    vt: push(scratch(spec(
                        "v_t",
                        s.vt_bytes(),
                        RegionReq::Interleaved,
                        true,
                        "attention_operand",
                    ))),
                    c1: push(scratch(BufferSpec {
                        align: if plan.compact {
                            ipu_arch::INTERLEAVED_ELEMENT_BYTES
                        } else {
                            16
                        },
                        ..spec(
                            "c",
                            s.c_bytes(),
                            RegionReq::Interleaved,
                            true,
                            "attention_scores",
                        )
                    })),
                    c2: push(scratch(spec(
                        "c_partial",
                        s.c_bytes(),
                        RegionReq::Interleaved,
                        true,
                        "attention_scores",
                    ))),
                    qt: push(scratch(spec(
                        "q_t",
                        s.qt_bytes(),
                        RegionReq::Interleaved,
                        false,
                        "attention_operand",
                    ))),
                    pt: if plan.compact {
                        usize::MAX
                    } else {
                        push(scratch(spec(
                            "p_t",
                            s.pt_bytes(),
                            RegionReq::Interleaved,
                            false,
                            "attention_scores",
                        )))
                    },
                    pt_base: 0,
                    maxes: push(spec(
                        "colmax",
                        ipu_arch::WORKER_CONTEXTS * s.maxes_row(),
                        RegionReq::Standard,
                        false,
                        "attention_state",
                    )),
                    sm_scratch: push(spec(
                        "softmax_scratch",
                        ipu_arch::WORKER_CONTEXTS * s.softmax_scratch(),
                        RegionReq::Standard,
                        false,
                        "attention_state",
                    )),
                    // The state slots go to region 0 when it has room;
                    // a segment's exchange tables may leave it none, and
                    // every reader (copy64, reduce_f32's DST, the
                    // exchange, attention_cols_final) takes any region.
                    ot: push(spec(
                        "o_t",
                        s.ot_bytes(splits, range),
                        RegionReq::Any,
                        false,
                        "attention_state",
                    )),
                    m: push(spec(
                        "m",
                        slots * s.m_slot(),
                        RegionReq::Any,
                        false,
                        "attention_state",
                    )),
                    out: push(spec(
                        "out",
                        plan.rows * s.rs_out(range),
                        RegionReq::Standard,
                        false,
                        "attention_result",
                    )),
                    fin_scratch: push(spec(
                        "final_scratch",
                        ipu_arch::WORKER_CONTEXTS * s.final_scratch(splits),
                        RegionReq::Standard,
                        false,
                        "attention_state",
                    )),
                };
                if plan.compact {
                    t.pt = t.c2;
                    t.pt_base = crate::gemm::C_HEADER;
                }
                if padding_from_load {
                    let (jobs, rows) = fill_jobs(s, &t, n);
                    let mut zero: BTreeMap<usize, Vec<(u32, u32)>> = BTreeMap::new();
                    for (buffer, offset, bytes, lo, hi) in jobs {
                        if (lo, hi) == (0, 0) {
                            zero.entry(buffer)
                                .or_default()
                                .push((offset, offset + bytes));
                        }
                    }
                    for r in rows {
                        let ranges = zero.entry(r.buffer).or_default();
                        ranges.extend((0..r.rows).map(|i| {
                            let a = r.offset + i * r.stride;
                            (a, a + 8 * r.items)
                        }));
                    }
                    for (buffer, ranges) in zero {
                        bufs[buffer].zero = merged_ranges(ranges);
                    }
                }
                tiles.insert(
                    tile,
                    AttTile {
                        h,
                        qi,
                        ks,
                        n,
                        bufs: t,
                        padding_from_load,
                    },
                );
            }
        }
    }

    // A later round's tiles: the first round's buffers, but output rows of
    // their own, which the host reads at the end of the call.
    let mut round_tiles = vec![tiles];
    for round in 1..rounds {
        let mut next = BTreeMap::new();
        for (&tile, at) in &round_tiles[0] {
            let h = at.h + round * round_heads;
            if h >= b.heads {
                continue;
            }
            let bufs = l
                .buffers
                .get_mut(&tile)
                .expect("attention tiles are below tile_count");
            let mut out = bufs[at.bufs.out].clone();
            out.name = format!("{name}.out_round{round}");
            bufs.push(out);
            next.insert(
                tile,
                AttTile {
                    h,
                    qi: at.qi,
                    ks: at.ks,
                    n: at.n,
                    bufs: TileBuffers {
                        out: bufs.len() - 1,
                        ..at.bufs
                    },
                    padding_from_load: at.padding_from_load,
                },
            );
        }
        round_tiles.push(next);
    }

    // Step 1: Q^T and V^T on the Q and V projections' tiles. A tile may
    // hold a home of q and one of v (attention over inputs,
    // `attention::host_homes`): a step starts at most six vertices per
    // tile, so those V transposes take a second step (compute steps need
    // no sync between them); a home that is both q's and v's (attention
    // straight over one input) is transposed once.
    let mut prep = compute_step(format!("transpose {name} q and v (Q^T, V^T)"));
    let mut prep_v = compute_step(format!("transpose {name} v (V^T) beside q"));
    // (group, tile) -> (transposed buffer, row stride)
    let mut transposed: BTreeMap<(usize, u32), (usize, u32)> = BTreeMap::new();
    let sources: Vec<(usize, u32, crate::lower::GroupResult)> = l
        .group_results
        .iter()
        .filter(|((g, _), _)| *g == b.q || *g == b.v)
        .map(|(&(g, t), &r)| (g, t, r))
        .collect();
    for (g, tile, r) in sources {
        if r.transposed {
            // Already transposed by the projection's reduce step (TR=1).
            transposed.insert((g, tile), (r.buffer, r.row_stride));
            continue;
        }
        let same_home_as_q = g == b.v && l.group_results.get(&(b.q, tile)) == Some(&r);
        if let Some(&shared) = transposed.get(&(b.q, tile)).filter(|_| same_home_as_q) {
            transposed.insert((g, tile), shared);
            continue;
        }
        let what = if g == b.q { "q" } else { "v" };
        let (tb, rs, vertices, cycles) = crate::attention::transpose_shard(
            l,
            tile,
            (&r, 2),
            &format!("{name}.{what}_transposed"),
            if g == b.q { "Q" } else { "V" },
            transpose,
        )?;
        transposed.insert((g, tile), (tb, rs));
        let step = if prep.tiles.contains_key(&tile) {
            &mut prep_v
        } else {
            &mut prep
        };
        step.put_tile(tile, vertices, cycles);
    }

    let mut steps = Vec::new();
    // The rounds' exchange steps, scheduled side by side once every round
    // is built (each round's are as long to schedule as its compute steps
    // are to build: Llama-2-7B's 11 rounds at 2048 tokens ~2 s each).
    let mut pending = Vec::new();
    for step in [prep, prep_v] {
        if !step.tiles.is_empty() {
            steps.push(step);
        }
    }
    let mut ones_step = compute_step(format!("set {name} V^T ones row"));
    let mut y = HostTensor {
        name: y_name,
        ty: graph.value(b.result).ty.clone(),
        placements: Vec::new(),
    };
    let mut label = exchange_label;
    // A tile's shapes and step estimates depend only on its queries and
    // keys: a few distinct pairs for all the tiles of every round.
    let mut by_shape: BTreeMap<(u32, u32, u32), (Shapes, Vec<u64>)> = BTreeMap::new();
    for (round, tiles) in round_tiles.into_iter().enumerate() {
        let round = round as u32;
        let (h_lo, h_hi) = (
            round * round_heads,
            ((round + 1) * round_heads).min(b.heads),
        );
        // Each round's steps name its heads.
        let heads = if rounds > 1 {
            format!(" (heads {h_lo}..{h_hi})")
        } else {
            String::new()
        };
        let compute_step = |phase: String| compute_step(format!("{phase}{heads}"));
        // Step 2: the fills and the K rows' head padding.
        // A tile that keeps its padding from load has only V^T's ones row to
        // set, which no step of the run writes either: the initialize call
        // sets it once, beside the parameters.
        let mut fill_step = compute_step(format!("reset {name} padding"));
        let mut pad_step = compute_step(format!("pad {name} K rows"));
        for (&tile, at) in &tiles {
            // The first round's ones row serves every round.
            if at.padding_from_load && round > 0 {
                continue;
            }
            let (mut jobs, mut row_jobs) = fill_jobs(&shapes, &at.bufs, at.n);
            if at.padding_from_load {
                jobs.retain(|j| (j.3, j.4) != (0, 0));
                row_jobs.clear();
            }
            let (vertices, cycles) = fill_work(&jobs, fill);
            let step = if at.padding_from_load {
                &mut ones_step
            } else {
                &mut fill_step
            };
            step.put_tile(tile, vertices, cycles);
            let (pads, slowest) = row_job_vertices(&row_jobs, ck);
            if !pads.is_empty() {
                let cycles = slowest + launch_cycles(pads.len() as u64);
                pad_step.put_tile(
                    tile,
                    pads.into_iter()
                        .map(|state| Vertex {
                            kernel: std::sync::Arc::new(ck.fill_rows.0.clone()),
                            state,
                        })
                        .collect(),
                    cycles,
                );
            }
        }

        // Step 3: the exchange of Q^T, K rows and V^T.
        let qblock_of = |r: u32| -> usize {
            qranges
                .iter()
                .position(|&(a, z)| (a..z).contains(&r))
                .expect("query ranges cover the queries")
        };
        let split_of = |key: u32| -> u32 {
            (0..splits)
                .find(|&ks| {
                    let (k0, n) = split_keys(ks);
                    (k0..k0 + n).contains(&key)
                })
                .expect("the splits cover the keys")
        };
        let rs_k = shapes.st.2.rs_a;
        let rs_qt = shapes.st.2.rs_b;
        let rs_vt = shapes.pv.2.rs_a;
        let mut transfers = Vec::new();
        for (&(g, tile), r) in &l.group_results {
            if g == b.k {
                // K rows cut at head boundaries: a key's head segment goes to
                // every query block of the head, in the key's split.
                for row in r.rows.0..r.rows.1 {
                    let ks = split_of(row);
                    let k0 = split_keys(ks).0;
                    let mut c = r.col0;
                    while c < r.col0 + r.width {
                        let h = c / d;
                        let e = ((h + 1) * d).min(r.col0 + r.width);
                        if !(h_lo..h_hi).contains(&h) {
                            c = e;
                            continue;
                        }
                        let destinations = (0..qranges.len() as u32)
                            .filter(|&qi| ks < plan.splits_of(qi))
                            .map(|qi| {
                                let dst = tile_of(h, qi, ks);
                                BufferRef {
                                    tile: dst,
                                    buffer: tiles[&dst].bufs.kr,
                                    offset: (row - k0) * rs_k + (c - h * d) * 2,
                                }
                            })
                            .collect();
                        transfers.push(BufferTransfer {
                            source: BufferRef {
                                tile,
                                buffer: r.buffer,
                                offset: (row - r.rows.0) * r.row_stride + (c - r.col0) * 2,
                            },
                            destinations,
                            bytes: (e - c) * 2,
                        });
                        c = e;
                    }
                }
            } else if g == b.q || g == b.v {
                let (tb, rs) = transposed[&(g, tile)];
                let (r0, r1) = r.rows;
                for c in 0..r.width {
                    let gc = r.col0 + c;
                    let (h, j) = (gc / d, gc % d);
                    if !(h_lo..h_hi).contains(&h) {
                        continue;
                    }
                    // Rows a..z of transposed row c (a run of queries or keys;
                    // one that ends on the odd last row takes the zero after it).
                    let run = |a: u32, z: u32, destinations| BufferTransfer {
                        source: BufferRef {
                            tile,
                            buffer: tb,
                            offset: c * rs + (a - r0) * 2,
                        },
                        destinations,
                        bytes: ((z - a) * 2).div_ceil(4) * 4,
                    };
                    if g == b.q {
                        // Runs of the column's queries, cut at query blocks, to
                        // every key split of the block.
                        let mut a = r0;
                        while a < r1 {
                            let qi = qblock_of(a);
                            let (q0, q1) = qranges[qi];
                            let z = r1.min(q1);
                            let destinations = (0..plan.splits_of(qi as u32))
                                .map(|ks| {
                                    let dst = tile_of(h, qi as u32, ks);
                                    BufferRef {
                                        tile: dst,
                                        buffer: tiles[&dst].bufs.qt,
                                        offset: j * rs_qt + (a - q0) * 2,
                                    }
                                })
                                .collect();
                            transfers.push(run(a, z, destinations));
                            a = z;
                        }
                    } else {
                        // Runs of the column's keys, cut at the splits, to every
                        // query block of the head.
                        for ks in 0..splits {
                            let (k0, n) = split_keys(ks);
                            let (a, z) = (r0.max(k0), r1.min(k0 + n));
                            if a >= z {
                                continue;
                            }
                            let destinations = (0..qranges.len() as u32)
                                .filter(|&qi| ks < plan.splits_of(qi))
                                .map(|qi| {
                                    let dst = tile_of(h, qi, ks);
                                    BufferRef {
                                        tile: dst,
                                        buffer: tiles[&dst].bufs.vt,
                                        offset: j * rs_vt + (a - k0) * 2,
                                    }
                                })
                                .collect();
                            transfers.push(run(a, z, destinations));
                        }
                    }
                }
            }
        }
        crate::attention::check_word_aligned(&transfers)?;
        // Its index in `steps` is set where it is pushed.
        let xstep = exchange::pending_step(
            l.tile_count,
            transfers,
            label,
            &mut l.buffers,
            name.clone(),
            format!("exchange q^T, k, v^T -> {name}{heads}"),
            0,
        );
        label += 1;

        // Steps 4 to 7: S^T, the column softmax, O^T and its reduce.
        let mut st = compute_step(format!("{name} scores S^T = K Q^T"));
        let mut pt_pad = compute_step(format!("zero {name} P^T key padding"));
        let mut mk: Vec<Step> = Vec::new();
        let masked_score = (MASKED_SCORE / b.scale).to_bits();
        let mut cm = compute_step(format!("{name} column maxima"));
        let mut sm = compute_step(format!("{name} softmax down columns"));
        let mut pv = compute_step(format!("{name} O^T = [V^T; 1] P^T"));
        let mut rd = compute_step(format!("{name} sum of O^T partials"));
        let scale = b.scale.to_bits();
        for (&tile, at) in &tiles {
            let t = at.bufs;
            let rows = qranges[at.qi as usize].1 - qranges[at.qi as usize].0;
            let splits = plan.splits_of(at.qi);
            let (s, est) = match by_shape.entry((rows, at.n, splits)) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let s = Shapes::new(b, ck, (plan.rows, at.n, kp), plan.compact).ok_or_else(
                        || {
                            bad(format!(
                                "attention {name}: no worker split of O^T on tile {tile}"
                            ))
                        },
                    )?;
                    let est = step_cycles(
                        &mut fill.1,
                        ck,
                        &s,
                        rows,
                        at.n,
                        splits,
                        plan.distributed_combine,
                    );
                    e.insert((s, est))
                }
            };
            // Its steps' estimates (the slowest tile sets each step's).
            for (step, e) in [
                (&mut st, est[2]),
                (&mut cm, est[3]),
                (&mut sm, est[4]),
                (&mut pv, est[5]),
                (&mut rd, est[6]),
            ] {
                step.charge_tile(tile, e);
            }
            let gemm_vertex = |g: &GemmGeometry,
                               lay: &ShardLayout,
                               (j, gi): (u32, u32),
                               (lr0, lr1): (u32, u32),
                               (cg0, cg1): (u32, u32),
                               (kb0, kb1): (u32, u32),
                               (a, bb, b_base): (usize, usize, u32),
                               ot: bool| {
                // K block 0 writes the buffer that holds the result after the
                // group's blocks: always c1 (as in crate::lower), at its start.
                // O^T with compact buffers keeps its partials in c1 too, past
                // the result's elements, and reads the zero partials of K
                // block 0 from c2's header (P^T follows it there).
                let compact_ot = ot_partials.filter(|_| ot);
                let result = (t.c1, 0);
                let partials = compact_ot.map_or((t.c2, 0), |off| (t.c1, off));
                let (first, second) = if (kb1 - kb0) % 2 == 1 {
                    (result, partials)
                } else {
                    (partials, result)
                };
                // K block 0's zero partials: the second buffer's header, or with
                // compact buffers the header of c2, which O^T does not use.
                let zero = if compact_ot.is_some() {
                    (t.c2, 0)
                } else {
                    (second.0, 0)
                };
                let c_off = lay.c_row(j, gi, lr0) + cg0 * 16 * g.out_bytes();
                Vertex {
                    kernel: std::sync::Arc::new(ck.gemm.0.clone()),
                    state: vec![
                        StateWord::Addr {
                            buffer: a,
                            offset: lr0 * lay.rs_a + kb0 * 32,
                        },
                        StateWord::Const(lay.rs_a),
                        StateWord::Addr {
                            buffer: bb,
                            offset: b_base + kb0 * 16 * lay.rs_b + cg0 * 32,
                        },
                        StateWord::Const(lay.rs_b),
                        StateWord::Addr {
                            buffer: first.0,
                            offset: first.1 + c_off,
                        },
                        StateWord::Addr {
                            buffer: second.0,
                            offset: second.1 + c_off,
                        },
                        StateWord::Const(lay.rs_c),
                        StateWord::Addr {
                            buffer: zero.0,
                            offset: zero.1,
                        },
                        StateWord::Const(lr1 - lr0),
                        StateWord::Const(kb1 - kb0),
                        StateWord::Const(cg1 - cg0),
                    ],
                }
            };
            let (stg, sts, stl) = &s.st;
            let nkb = s.dp / 16;
            std::sync::Arc::make_mut(&mut st.tiles).insert(
                tile,
                sts.row_groups
                    .iter()
                    .enumerate()
                    .flat_map(|(gi, &rg)| {
                        sts.col_groups.iter().map(move |&cg| {
                            gemm_vertex(
                                stg,
                                stl,
                                (0, gi as u32),
                                rg,
                                cg,
                                (0, nkb),
                                (t.kr, t.qt, 0),
                                false,
                            )
                        })
                    })
                    .collect(),
            );
            let pad_jobs = pt_padding_jobs(s, &t, at.n);
            if s.compact && !pad_jobs.is_empty() {
                let (vertices, cycles) = fill_work(&pad_jobs, fill);
                pt_pad.put_tile(tile, vertices, cycles);
            }
            let masks = mask_jobs(
                b,
                s,
                qranges[at.qi as usize],
                plan.key_splits[at.ks as usize],
            );
            for (k, round) in mask_rounds(masks).into_iter().enumerate() {
                if mk.len() == k {
                    mk.push(compute_step(format!("{name} causal mask {}", k + 1)));
                }
                let step = &mut mk[k];
                step.charge_tile(tile, mask_cycles(&round, &mut ck.mask.1));
                std::sync::Arc::make_mut(&mut step.tiles).insert(
                    tile,
                    round
                        .iter()
                        .map(|j| Vertex {
                            kernel: std::sync::Arc::new(ck.mask.0.clone()),
                            state: match j.group {
                                Some(g) => vec![
                                    StateWord::Addr {
                                        buffer: t.c1,
                                        offset: stl.c_row(0, g, j.row),
                                    },
                                    StateWord::Const(j.words),
                                    StateWord::Const(masked_score),
                                ],
                                None => vec![
                                    StateWord::Addr {
                                        buffer: t.pt,
                                        offset: t.pt_base + j.row * s.pv.2.rs_b,
                                    },
                                    StateWord::Const(j.words),
                                    StateWord::Const(0),
                                ],
                            },
                        })
                        .collect(),
                );
            }
            // A causal tile's column maxima and softmax skip the key rows no
            // query of it sees (their P^T rows were zeroed by the mask steps).
            let visible = visible_rows(
                b,
                qranges[at.qi as usize],
                plan.key_splits[at.ks as usize],
                at.n,
            );
            let jobs = visible_st_jobs(s, visible);
            if visible < at.n {
                let kernels = (&mut ck.colmax.1, &mut ck.softmax.1);
                let (cm_c, sm_c) = colmax_softmax_cycles(kernels, &jobs);
                cm.charge_tile(tile, cm_c);
                sm.charge_tile(tile, sm_c);
            }
            // Each column group's partial maxima: one row of its quads
            // per colmax job of the group, the groups one after the other
            // (at most the six rows of all quads that the buffer holds).
            let w_group = StJob::partial_maxima(&jobs);
            let maxes_at = |j: &StJob, i: u32| 16 * (w_group * j.q0 + i * (j.q1 - j.q0));
            let index_in_group =
                |ji: usize| jobs[..ji].iter().filter(|o| o.c == jobs[ji].c).count();
            std::sync::Arc::make_mut(&mut cm.tiles).insert(
                tile,
                jobs.iter()
                    .enumerate()
                    .map(|(ji, j)| Vertex {
                        kernel: std::sync::Arc::new(ck.colmax.0.clone()),
                        state: vec![
                            StateWord::Addr {
                                buffer: t.c1,
                                offset: stl.c_row(0, j.g, j.r0) + 16 * j.q0,
                            },
                            StateWord::Const(stl.rs_c),
                            StateWord::Const(j.r1 - j.r0),
                            StateWord::Const(j.q1 - j.q0),
                            StateWord::Addr {
                                buffer: t.maxes,
                                offset: maxes_at(j, index_in_group(ji) as u32),
                            },
                        ],
                    })
                    .collect(),
            );
            std::sync::Arc::make_mut(&mut sm.tiles).insert(
                tile,
                jobs.iter()
                    .enumerate()
                    .map(|(ji, j)| Vertex {
                        kernel: std::sync::Arc::new(ck.softmax.0.clone()),
                        state: vec![
                            StateWord::Addr {
                                buffer: t.c1,
                                offset: stl.c_row(0, j.g, j.r0) + 16 * j.q0,
                            },
                            StateWord::Const(stl.rs_c),
                            StateWord::Addr {
                                buffer: t.pt,
                                offset: t.pt_base + j.r0 * s.pv.2.rs_b + 8 * j.q0,
                            },
                            StateWord::Const(s.pv.2.rs_b),
                            StateWord::Const(j.r1 - j.r0),
                            StateWord::Const(j.q1 - j.q0),
                            StateWord::Addr {
                                buffer: t.maxes,
                                offset: maxes_at(j, 0),
                            },
                            StateWord::Const(w_group),
                            StateWord::Const(scale),
                            // The group's first job writes its quads' m.
                            if index_in_group(ji) == 0 {
                                StateWord::Addr {
                                    buffer: t.m,
                                    offset: 16 * j.q0,
                                }
                            } else {
                                StateWord::Const(0)
                            },
                            StateWord::Addr {
                                buffer: t.sm_scratch,
                                offset: ji as u32 * s.softmax_scratch(),
                            },
                        ],
                    })
                    .collect(),
            );
            let (pvg, pvs, pvl) = &s.pv;
            let mut pv_vertices = Vec::new();
            for (gi, &rg) in pvs.row_groups.iter().enumerate() {
                for &cg in &pvs.col_groups {
                    for (j, &kg) in pvs.k_groups.iter().enumerate() {
                        pv_vertices.push(gemm_vertex(
                            pvg,
                            pvl,
                            (j as u32, gi as u32),
                            rg,
                            cg,
                            kg,
                            (t.vt, t.pt, t.pt_base),
                            true,
                        ));
                    }
                }
            }
            std::sync::Arc::make_mut(&mut pv.tiles).insert(tile, pv_vertices);
            let own = s.combine_ranges(splits, plan.distributed_combine)[at.ks as usize];
            let moves = match s.ot_copies(own) {
                Some(copies) => copies
                    .into_iter()
                    .map(|(from, to, bytes)| Vertex {
                        kernel: std::sync::Arc::new(ck.copy.0.clone()),
                        state: vec![
                            StateWord::Addr {
                                buffer: t.c1,
                                offset: from,
                            },
                            StateWord::Addr {
                                buffer: t.ot,
                                offset: to,
                            },
                            StateWord::Const(bytes),
                        ],
                    })
                    .collect(),
                None => crate::lower::reduce_vertices(
                    &ck.reduce.0,
                    pvg,
                    (pvl, pvs),
                    (t.c1, t.ot),
                    crate::lower::ReduceDst::Rows,
                    None,
                ),
            };
            std::sync::Arc::make_mut(&mut rd.tiles).insert(tile, moves);
        }
        for step in [fill_step, pad_step] {
            if !step.tiles.is_empty() {
                steps.push(step);
            }
        }
        exchange::push_pending(&mut steps, &mut pending, xstep);
        steps.push(st);
        // With compact buffers, the tiles whose split has padding keys zero
        // their P^T rows once the S^T GEMM is done with the buffer they share;
        // the others spend nothing there.
        if !pt_pad.tiles.is_empty() {
            for &tile in tiles.keys() {
                if !pt_pad.tiles.contains_key(&tile) {
                    pt_pad.charge_tile(tile, 0);
                }
            }
            steps.push(pt_pad);
        }
        // A tile without mask jobs in a mask step spends nothing there.
        for step in &mut mk {
            for &tile in tiles.keys() {
                if !step.tiles.contains_key(&tile) {
                    step.charge_tile(tile, 0);
                }
            }
        }
        steps.extend(mk);
        steps.extend([cm, sm, pv, rd]);

        // Step 8: every split's tile that combines head columns [d0, d1)
        // receives, of every other split of its (head, query block), those O^T
        // rows, the l row and m, into slot j + 1 for a split j below its own,
        // slot j above it (its own state is slot 0: the O^T buffer's first
        // rows and m slot 0). Slots are `state_slot` apart from row d0 on.
        // A causal block's tiles combine its own splits only.
        let combine_of = |at: &AttTile| {
            shapes.combine_ranges(plan.splits_of(at.qi), plan.distributed_combine)[at.ks as usize]
        };
        if splits > 1 {
            let (rs_d, lrow) = (shapes.pv.2.rs_d(), d);
            let mut moves = Vec::new();
            for (&tile, at) in &tiles {
                let r @ (d0, d1) = combine_of(at);
                if d1 == d0 {
                    continue;
                }
                let state_slot = shapes.state_slot(r);
                for j in (0..plan.splits_of(at.qi)).filter(|&j| j != at.ks) {
                    let slot = if j < at.ks { j + 1 } else { j };
                    let src = tile_of(at.h, at.qi, j);
                    let s_bufs = tiles[&src].bufs;
                    let mut mv =
                        |buffer: usize, offset: u32, dst_buffer: usize, dst: u32, bytes: u32| {
                            moves.push(BufferTransfer {
                                source: BufferRef {
                                    tile: src,
                                    buffer,
                                    offset,
                                },
                                destinations: vec![BufferRef {
                                    tile,
                                    buffer: dst_buffer,
                                    offset: dst,
                                }],
                                bytes,
                            });
                        };
                    let base = shapes.slot0(r) + slot * state_slot;
                    if shapes.ot_stays_in_c() {
                        // From the source's C buffer, a run per row group.
                        for rows in shapes.own_state_rows(r) {
                            for (c, row, n) in shapes.ot_rows_in_c(rows) {
                                let dst = base + shapes.slot_row(r, row) * rs_d;
                                mv(s_bufs.c1, c, at.bufs.ot, dst, n * rs_d);
                            }
                        }
                    } else if shapes.compact {
                        return Err(bad(format!(
                            "attention {name}: compact state slots need O^T kept in its C buffer"
                        )));
                    } else if d1 == lrow {
                        // The l row follows the last head column: one run,
                        // from the source's O^T rows in place (its slot 0)
                        // to the slot's rows from d0 on (`base` is the
                        // slot's row d0; until session 52 this added d0
                        // rows again, past the buffer's end on every tile
                        // that combines columns from d0 > 0 with O^T
                        // summed from several K groups).
                        mv(
                            s_bufs.ot,
                            d0 * rs_d,
                            at.bufs.ot,
                            base + shapes.slot_row(r, d0) * rs_d,
                            (d1 - d0 + 1) * rs_d,
                        );
                    } else {
                        mv(
                            s_bufs.ot,
                            d0 * rs_d,
                            at.bufs.ot,
                            base + shapes.slot_row(r, d0) * rs_d,
                            (d1 - d0) * rs_d,
                        );
                        mv(
                            s_bufs.ot,
                            lrow * rs_d,
                            at.bufs.ot,
                            base + shapes.slot_row(r, lrow) * rs_d,
                            rs_d,
                        );
                    }
                    mv(
                        s_bufs.m,
                        0,
                        at.bufs.m,
                        slot * shapes.m_slot(),
                        shapes.m_slot(),
                    );
                }
            }
            let x = exchange::pending_step(
                l.tile_count,
                moves,
                label,
                &mut l.buffers,
                name.clone(),
                format!("exchange {name} key-split states{heads}"),
                0,
            );
            exchange::push_pending(&mut steps, &mut pending, x);
            label += 1;
        }

        // Step 9: the combine and normalisation, and the output rows.
        let mut fin = compute_step(format!("{name} combine and normalise"));
        let s = &shapes;
        for (&tile, at) in &tiles {
            let (d0, d1) = combine_of(at);
            if d1 == d0 {
                continue;
            }
            let splits = plan.splits_of(at.qi);
            let t = at.bufs;
            let (q0, q1) = qranges[at.qi as usize];
            let rows = q1 - q0;
            let (vertices, cycles) = s.final_vertices(&mut ck.final_.1, rows, splits, (d0, d1));
            // The slots from row d0 on: head columns relative to d0, and so
            // are the output rows, which hold only this tile's columns.
            let split_bytes = s.state_slot((d0, d1));
            let rs_out = s.rs_out((d0, d1));
            fin.charge_tile(tile, cycles);
            std::sync::Arc::make_mut(&mut fin.tiles).insert(
                tile,
                vertices
                    .iter()
                    .enumerate()
                    .map(|(w, &(qa, qn, da, dn))| Vertex {
                        kernel: std::sync::Arc::new(ck.final_.0.clone()),
                        state: vec![
                            StateWord::Addr {
                                buffer: t.ot,
                                offset: s.slot0((d0, d1)) + 4 * qa,
                            },
                            StateWord::Const(s.pv.2.rs_d()),
                            StateWord::Const(split_bytes),
                            StateWord::Const(splits),
                            StateWord::Addr {
                                buffer: t.m,
                                offset: 4 * qa,
                            },
                            StateWord::Const(s.slot_row((d0, d1), d)),
                            StateWord::Const(s.quads()),
                            StateWord::Const(qn),
                            StateWord::Const(da - d0),
                            StateWord::Const(dn),
                            StateWord::Addr {
                                buffer: t.out,
                                offset: qa * rs_out,
                            },
                            StateWord::Const(rs_out),
                            StateWord::Addr {
                                buffer: t.fin_scratch,
                                offset: w as u32 * s.final_scratch(splits),
                            },
                        ],
                    })
                    .collect(),
            );
            for r in 0..rows {
                y.placements.push(HostPlacement {
                    tile,
                    buffer: t.out,
                    buffer_offset: r * rs_out,
                    host_offset: b.result_offset(q0 + r, at.h * d + d0),
                    bytes: (d1 - d0) * 2,
                });
            }
        }
        steps.push(fin);
    }
    exchange::schedule_pending(pending, &mut steps, &mut l.buffers)?;
    y.placements.sort();
    l.calls[1].steps.extend(steps);
    if !ones_step.tiles.is_empty() {
        let init = l
            .calls
            .iter()
            .position(|c| c.name == "initialize")
            .ok_or_else(|| bad("a program without an initialize call".into()))?;
        l.calls[init].steps.push(ones_step);
    }
    l.io[1].1.push(y);
    l.io[1]
        .1
        .sort_by_key(|t| graph.lookup(&t.name).map(|id| id.0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The planner skips query-block counts by this bound before cutting
    /// them: it must never exceed the blocks actually cut.
    #[test]
    fn least_query_blocks_is_a_lower_bound() {
        for sq in 1..400 {
            for qb in 1..=sq + 3 {
                let cut = aligned_ranges(sq, qb, 2).len() as u32;
                assert!(
                    least_query_blocks(sq, qb) <= cut,
                    "{sq} queries in {qb} blocks: {cut} cut"
                );
            }
        }
    }

    fn kernels() -> ColumnKernels {
        let k = |entry: &str, formula: &str| {
            (
                KernelRequest {
                    entry: entry.into(),
                    source: format!("{entry}.S"),
                    params: Default::default(),
                },
                FormulaCost::new(formula.into()),
            )
        };
        // The kernels' declared formulas (device/*.S) for the shapes used.
        ColumnKernels {
            gemm: k("gemm_f16", "6 * (22 + NCB * (15 + NKB * (8 * M + 47)))"),
            reduce: k("reduce_f32", "6 * (8 + ROWS * (3 + QUADS * (2 * P + 7)))"),
            colmax: k("colmax_f16", "6 * (12 + QUADS * (6 + 2 * ROWS))"),
            softmax: k("softmax_cols", "6 * (25 + QUADS * (12 + 2 * W + 8 * ROWS))"),
            final_: k(
                "attention_cols_final",
                "6 * (29 + ((QN + 1) / 2) * (16 + 10 * (DN / 2)))",
            ),
            fill_rows: k("fill_rows", "6 * (10 + ITEMS * (6 + ROWS))"),
            mask: k("fill32", "6 * (12 + N / 2)"),
            copy: k("copy64", "6 * (28 + BYTES / 8)"),
        }
    }

    fn siglip() -> AttentionBlock {
        crate::attention::test_block(16, 72, 729)
    }

    #[test]
    fn applies_to_f16_heads_of_whole_quads_causal_or_not() {
        let mut b = siglip();
        assert!(applies(&b));
        b.d = 18;
        assert!(!applies(&b), "head 18: K rows would not move as words");
        b.d = 72;
        b.causal = true;
        assert!(applies(&b), "causal: the mask steps");
        b.f32 = true;
        assert!(!applies(&b), "f32 attention takes the row layout");
    }

    /// A causal block's query blocks take exactly the key splits that
    /// hold a key one of their queries sees (at least one), and the tiles
    /// of (head, block, split) are numbered 0..tiles, each once.
    #[test]
    fn causal_blocks_take_exactly_the_splits_their_queries_see() {
        for (sq, sk, qb, splits) in [
            (1024u32, 1024u32, 32u32, 6u32),
            (34, 34, 5, 3),
            (8, 600, 1, 8),
            (40, 600, 6, 8),
            (35, 600, 6, 8),
            (64, 301, 9, 5),
            // A split that starts on the one key the block's last query
            // sees beyond the block's own (sk - sq = 1).
            (10, 11, 5, 5),
            (600, 40, 7, 3),
            (729, 729, 23, 4),
        ] {
            let mut b = siglip();
            (b.sq, b.sk, b.causal, b.heads) = (sq, sk, true, 3);
            let qr = query_ranges(&b, qb);
            let kr = key_ranges(sk, splits);
            let taken = block_splits(&b, &qr, &kr);
            assert_eq!(taken.len(), qr.len());
            // Query q sees key k when k <= q + (sk - sq): a block takes a
            // split iff one of its queries sees one of the split's keys,
            // and at least one split (whose keys are then all masked).
            let sees = |q: u32, k: u32| k as i64 <= q as i64 + sk as i64 - sq as i64;
            for (&(q0, q1), &t) in qr.iter().zip(&taken) {
                for (ks, &(k0, k1)) in kr.iter().enumerate() {
                    let seen = (q0..q1).any(|q| (k0..k1).any(|k| sees(q, k)));
                    assert_eq!(
                        (ks as u32) < t,
                        seen || ks == 0,
                        "{sq}x{sk}: queries {q0}..{q1}, keys {k0}..{k1}, {t} splits"
                    );
                }
            }
            assert_eq!(*taken.last().unwrap(), splits);
            // The tiles of (head, block, split) are 0..tiles, each once.
            let plan = AttentionPlan {
                distributed_combine: true,
                ..AttentionPlan::partition_only(
                    AttentionLayout::Columns,
                    (qr.len() as u32, qr.iter().map(|r| r.1 - r.0).max().unwrap()),
                    kr.clone(),
                    taken.clone(),
                    vec![(0, 1)],
                    b.heads * taken.iter().sum::<u32>(),
                )
            };
            let mut seen_tiles = BTreeSet::new();
            for h in 0..b.heads {
                for qi in 0..qr.len() as u32 {
                    for ks in 0..plan.splits_of(qi) {
                        assert!(seen_tiles.insert(plan.tile(h, qi, ks)));
                    }
                }
            }
            assert_eq!(seen_tiles, (0..plan.tiles).collect());
            // A non-causal block takes every split.
            b.causal = false;
            assert!(block_splits(&b, &qr, &kr).is_empty());
        }
    }

    /// Every score the causal mask must hide among a tile's visible rows
    /// is written, no score a query sees is, and nothing outside the
    /// tile's S^T rows; the rows after the visible ones are hidden from
    /// every query, and their P^T rows are zeroed whole. Checked word by
    /// word over every (query block, key split) of a few shapes, self- and
    /// cross-attention, against the reference's rule (key j is hidden from
    /// query i when j > i + sk - sq).
    #[test]
    fn causal_mask_jobs_write_exactly_the_hidden_scores() {
        let ck = kernels();
        for (sq, sk, qb, splits) in [
            (200u32, 200u32, 8u32, 4u32),
            (34, 34, 5, 3),
            (8, 600, 1, 8),
            (729, 729, 23, 4),
        ] {
            let mut b = siglip();
            (b.sq, b.sk, b.causal) = (sq, sk, true);
            let qr = query_ranges(&b, qb);
            let kr = key_ranges(sk, splits);
            let n = widest_split(&kr);
            let rows = qr.iter().map(|r| r.1 - r.0).max().unwrap();
            for &(q0, q1) in &qr {
                for &(k0, k1) in &kr {
                    // A tile's shapes, as `lower` makes them: its split's keys.
                    let s =
                        Shapes::new(&b, &ck, (rows, k1 - k0, n.div_ceil(16) * 16), false).unwrap();
                    let rs = s.st.2.rs_c / 4;
                    let pt_words = s.pv.2.rs_b / 4;
                    let jobs = mask_jobs(&b, &s, (q0, q1), (k0, k1));
                    let visible = visible_rows(&b, (q0, q1), (k0, k1), k1 - k0);
                    assert!(visible >= 1 && visible <= k1 - k0);
                    let (mut scores, mut probs) = (BTreeSet::new(), BTreeSet::new());
                    for j in &jobs {
                        assert!(j.words > 0);
                        match j.group {
                            Some(g) => {
                                let at = s.st.2.c_row(0, g, j.row) / 4;
                                scores.extend(at..at + j.words);
                            }
                            None => {
                                let at = j.row * pt_words;
                                probs.extend(at..at + j.words);
                            }
                        }
                    }
                    let hidden = |r: u32, c: u32| k0 + r > q0 + c + (sk - sq);
                    for (g, &(r0, r1)) in s.st.1.row_groups.iter().enumerate() {
                        for r in r0..r1 {
                            let at = s.st.2.c_row(0, g as u32, r) / 4;
                            if r >= visible {
                                assert!(
                                    (0..q1 - q0).all(|c| hidden(r, c)),
                                    "{sq} {sk}: row {r} is seen"
                                );
                                let p = r * pt_words;
                                assert!(
                                    (p..p + pt_words).all(|w| probs.contains(&w)),
                                    "{sq} {sk}: P^T row {r}"
                                );
                                continue;
                            }
                            for c in 0..q1 - q0 {
                                let w = scores.contains(&(at + c));
                                assert!(
                                    !hidden(r, c) || w,
                                    "{sq} {sk}: query {} key {} unmasked",
                                    q0 + c,
                                    k0 + r
                                );
                                assert!(
                                    hidden(r, c) || !w,
                                    "{sq} {sk}: query {} key {} masked",
                                    q0 + c,
                                    k0 + r
                                );
                            }
                        }
                    }
                    // Nothing beyond the first and last S^T and P^T rows.
                    if let (Some(lo), Some(hi)) = (scores.first(), scores.last()) {
                        let groups = &s.st.1.row_groups;
                        let first = s.st.2.c_row(0, 0, groups[0].0) / 4;
                        let g = groups.len() - 1;
                        let last = s.st.2.c_row(0, g as u32, groups[g].1 - 1) / 4 + rs;
                        assert!(first <= *lo && *hi < last, "{sq} {sk}: {jobs:?}");
                    }
                    if let Some(hi) = probs.last() {
                        assert!(*hi < (k1 - k0) * pt_words, "{sq} {sk}: {jobs:?}");
                    }
                    if k1 - 1 <= q0 + (sk - sq) {
                        assert!(jobs.is_empty(), "every key visible");
                    }
                }
            }
        }
    }

    #[test]
    fn query_blocks_start_on_even_queries_and_cover_them() {
        let b = siglip();
        for qb in [1, 7, 46, 365] {
            let r = query_ranges(&b, qb);
            assert_eq!(r.first().unwrap().0, 0);
            assert_eq!(r.last().unwrap().1, 729);
            assert!(
                r.windows(2).all(|w| w[0].1 == w[1].0 && w[1].0 % 2 == 0),
                "{r:?}"
            );
        }
    }

    #[test]
    fn siglip_shapes_fit_with_the_ones_row() {
        let b = siglip();
        let ck = kernels();
        let s = Shapes::new(&b, &ck, (16, 368, 368), false).unwrap();
        assert!(s.region1().is_some());
        assert!(s.region0(16, 2, true) <= STANDARD_BUDGET / 2);
        // O^T: the head, then the ones row, accumulated in f32.
        assert_eq!(s.pv.0.m, 73);
        assert!(s.pv.0.acc32 && !s.pv.0.reduce_f16);
        assert!(s.pv.1.vertices() <= ipu_arch::WORKER_CONTEXTS as usize);
        // S^T: keys as rows over six row groups, the head padded to 80.
        assert_eq!(s.st.1.row_groups.len(), 6);
        assert_eq!(s.st.2.rs_a, 160);
    }

    #[test]
    fn st_jobs_cover_every_score_once_on_six_workers() {
        let ck = kernels();
        let b = siglip();
        for (rows, n) in [(16u32, 368u32), (32, 192), (64, 96), (50, 5), (2, 1)] {
            let s = Shapes::new(&b, &ck, (rows, n, n.div_ceil(16) * 16), false).unwrap();
            assert!(s.st.1.vertices() <= 6);
            // Every column-group count the planner may choose.
            let most = s.most_job_col_groups();
            assert!((1..=most).contains(&s.job_col_groups));
            for cg in 1..=most {
                let jobs = s.st_jobs_in(cg);
                assert!(!jobs.is_empty() && jobs.len() <= 6, "{rows} {n}: {jobs:?}");
                let mut seen = vec![0u32; (n * s.quads()) as usize];
                for j in &jobs {
                    let (g0, g1) = s.st.1.row_groups[j.g as usize];
                    assert!(
                        g0 <= j.r0 && j.r0 < j.r1 && j.r1 <= g1,
                        "{rows} {n}: {jobs:?}"
                    );
                    assert!(j.q0 < j.q1 && j.q1 <= s.quads(), "{rows} {n}: {jobs:?}");
                    for r in j.r0..j.r1 {
                        for q in j.q0..j.q1 {
                            seen[(r * s.quads() + q) as usize] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{rows} {n}: {jobs:?}");
                // Every column group has the same rows, so every softmax
                // job folds the same number of partial maxima.
                let w = StJob::partial_maxima(&jobs);
                for c in 0..cg {
                    assert_eq!(jobs.iter().filter(|j| j.c == c).count() as u32, w);
                }
            }
        }
    }

    /// With compact buffers O^T's two C buffers live in the S^T result
    /// buffer `c1`, which the lowering starts on an element boundary: the
    /// partials start on the first boundary past the result, so the two
    /// share no 32 KiB element, and both end inside `c1`. SAM ViT-H's
    /// tiles (80-wide heads, 20 to 32 queries, 586 keys) fit only so: one
    /// element more, which any start of `c1` would need, passes its end.
    #[test]
    fn compact_ot_buffers_share_no_element_inside_an_aligned_c1() {
        let ck = kernels();
        let e = ipu_arch::INTERLEAVED_ELEMENT_BYTES;
        let mut sam = siglip();
        (sam.d, sam.dv, sam.sq, sam.sk) = (80, 80, 4096, 4096);
        for (b, rows, n) in [(&sam, 20u32, 586u32), (&sam, 32, 512), (&siglip(), 96, 192)] {
            let s = Shapes::new(b, &ck, (rows, n, n.div_ceil(16) * 16), true).unwrap();
            let ot = s.pv.2.c_bytes();
            let off = s
                .ot_partials_offset()
                .unwrap_or_else(|| panic!("{rows} {n}"));
            assert_eq!(off % e, 0);
            assert!(
                ot <= off && off + ot <= s.c_bytes(),
                "{rows} {n}: {off} {ot}"
            );
            // From an element-aligned c1, the result's last element comes
            // before the partials' first.
            assert!((ot - 1) / e < off / e);
            if b.d == 80 && rows == 20 {
                assert!(off + e + ot > s.c_bytes());
            }
            assert!(s.region1().is_some(), "{rows} {n}");
        }
    }

    #[test]
    fn own_rows_are_copied_once_and_sent_rows_come_from_c() {
        // O^T in one K group stays in C: each tile copies only the rows
        // its final step reads (its head columns and l), in at most six
        // copies, each within one row group at that group's C offsets,
        // and every other split's rows for it leave the source's C from
        // the same places.
        let ck = kernels();
        let b = siglip();
        for (rows, n, splits) in [(32u32, 192u32, 4u32), (16, 96, 2), (50, 96, 6), (64, 96, 1)] {
            let s = Shapes::new(&b, &ck, (rows, n, n), false).unwrap();
            assert!(s.ot_stays_in_c(), "{rows} {n}");
            let (_, split, lay) = &s.pv;
            // The C offset of O^T row r, from the layout's definition: two
            // drain rows before each row group.
            let c_of = |r: u32| {
                let g = split
                    .row_groups
                    .iter()
                    .position(|g| g.0 <= r && r < g.1)
                    .unwrap() as u32;
                crate::gemm::C_HEADER + (r + 2 * (g + 1)) * lay.rs_c
            };
            let group_of = |r: u32| split.row_groups.iter().position(|g| g.0 <= r && r < g.1);
            for distributed in [true, false] {
                for r in s.combine_ranges(splits, distributed) {
                    let copies = s.ot_copies(r).unwrap();
                    assert!(copies.len() <= 6, "{copies:?}");
                    let mut copied = Vec::new();
                    for (c, slot, bytes) in copies {
                        assert_eq!(slot % lay.rs_d(), 0);
                        let first = slot / lay.rs_d();
                        let count = bytes / lay.rs_c;
                        assert!(count > 0 && bytes % lay.rs_c == 0);
                        assert_eq!(c, c_of(first));
                        assert!((first..first + count).all(|x| group_of(x) == group_of(first)));
                        copied.extend(first..first + count);
                    }
                    copied.sort_unstable();
                    let mut wanted: Vec<u32> = if r.0 == r.1 {
                        Vec::new()
                    } else {
                        (r.0..r.1).chain([72]).collect()
                    };
                    wanted.dedup();
                    assert_eq!(copied, wanted, "{rows} {splits} {r:?}");
                    // The exchange's sources: the same rows, by runs.
                    let mut sent = Vec::new();
                    for rr in s.own_state_rows(r) {
                        for (c, first, count) in s.ot_rows_in_c(rr) {
                            assert_eq!(c, c_of(first));
                            assert!((first..first + count).all(|x| group_of(x) == group_of(first)));
                            sent.extend(first..first + count);
                        }
                    }
                    assert_eq!(sent, wanted);
                }
            }
        }
    }

    #[test]
    fn combine_vertices_cover_every_output_once() {
        let mut ck = kernels();
        let b = siglip();
        for (rows, splits) in [(16u32, 1u32), (16, 2), (32, 4), (50, 6), (17, 3), (64, 8)] {
            let s = Shapes::new(&b, &ck, (rows, 96, 96), false).unwrap();
            let ranges = s.combine_ranges(splits, true);
            assert_eq!(ranges.len() as u32, splits);
            assert_eq!(ranges.first().unwrap().0, 0);
            assert_eq!(ranges.last().unwrap().1, 72);
            let mut seen = vec![0u32; (rows * 72) as usize];
            for (i, &r) in ranges.iter().enumerate() {
                assert!(r.0 % 2 == 0 && r.1 % 2 == 0 && r.0 <= r.1);
                if i > 0 {
                    assert_eq!(ranges[i - 1].1, r.0);
                }
                let (vertices, cycles) = s.final_vertices(&mut ck.final_.1, rows, splits, r);
                assert!(vertices.len() <= 6 && cycles > 0, "{rows} {splits} {r:?}");
                for (qa, qn, da, dn) in vertices {
                    // OT and M move by 4 bytes per query: 8-aligned needs
                    // even first queries; head columns come in pairs.
                    assert!(qa % 2 == 0 && da % 2 == 0 && dn % 2 == 0 && dn > 0 && qn > 0);
                    for q in qa..qa + qn {
                        for dd in da..da + dn {
                            seen[(q * 72 + dd) as usize] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "rows {rows} splits {splits}");
        }
    }

    #[test]
    fn row_jobs_share_six_workers_and_cover_every_row_once() {
        let mut ck = kernels();
        for (k_rows, v_rows) in [(368, 72), (368, 0), (5, 72), (1, 1)] {
            let mut jobs = vec![RowJob {
                buffer: 0,
                offset: 144,
                stride: 160,
                rows: k_rows,
                items: 2,
            }];
            if v_rows > 0 {
                jobs.push(RowJob {
                    buffer: 1,
                    offset: 720,
                    stride: 736,
                    rows: v_rows,
                    items: 2,
                });
            }
            let (vertices, slowest) = row_job_vertices(&jobs, &mut ck);
            assert!(vertices.len() <= 6 && slowest > 0, "{k_rows} {v_rows}");
            for (i, j) in jobs.iter().enumerate() {
                let rows: u32 = vertices
                    .iter()
                    .filter(|v| matches!(v[0], StateWord::Addr { buffer, .. } if buffer == i))
                    .map(|v| match v[2] {
                        StateWord::Const(r) => r,
                        _ => unreachable!(),
                    })
                    .sum();
                assert_eq!(rows, j.rows, "job {i} of ({k_rows}, {v_rows})");
            }
        }
    }

    #[test]
    fn key_ranges_cover_the_keys_from_even_starts_within_two_keys() {
        for sk in [1u32, 2, 3, 19, 33, 600, 729, 730] {
            for splits in (1u32..=8).filter(|&s| 2 * s <= sk.max(2)) {
                let r = key_ranges(sk, splits);
                assert_eq!(r.len() as u32, splits, "{sk} keys, {splits} splits");
                assert_eq!((r[0].0, r.last().unwrap().1), (0, sk));
                assert!(r.windows(2).all(|w| w[0].1 == w[1].0));
                assert!(r.iter().all(|&(a, z)| a % 2 == 0 && z > a), "{r:?}");
                let counts: Vec<u32> = r.iter().map(|&(a, z)| z - a).collect();
                let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                assert!(hi - lo <= 2, "{sk} keys, {splits} splits: {counts:?}");
            }
        }
        // SigLIP: 182 or 183 keys per split where 16-key blocks gave 192.
        let r = key_ranges(729, 4);
        assert_eq!(widest_split(&r), 183, "{r:?}");
    }

    #[test]
    fn siglip_candidates_include_two_and_four_key_splits() {
        let b = siglip();
        let mut ck = kernels();
        let mut fill = FormulaCost::new("6 * (3 + 8 * N + COUNT)".into());
        for distributed in [false, true] {
            let plans = plan(
                &b,
                1472,
                &mut fill,
                &mut ck,
                0,
                distributed,
                (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64,
            );
            assert!(plans.iter().all(|p| p.layout == AttentionLayout::Columns
                && p.tiles <= 1472
                && p.distributed_combine == distributed));
            for (rows, splits) in [(16, 2), (32, 4)] {
                assert!(plans
                    .iter()
                    .any(|p| p.rows == rows && p.key_splits.len() == splits && p.tiles == 1472));
            }
            // Combining on split 0 receives whole states there: the
            // distributed combine's exchange is smaller with four splits.
            let four = plans
                .iter()
                .find(|p| p.rows == 32 && p.key_splits.len() == 4)
                .unwrap();
            if distributed {
                assert!(four.exchange_bound_cycles < 19_000, "{four:?}");
            } else {
                assert!(four.exchange_bound_cycles > 21_000, "{four:?}");
            }
        }
    }
}
