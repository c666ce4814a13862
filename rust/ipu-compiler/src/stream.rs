//! Streamed GEMMs: plans and lowering for a GEMM whose operands do not fit
//! beside each other on the tiles with K whole (the 4096^3 GEMM).
//!
//! The tiles form a grid of `row_parts x col_parts x k_parts`; tile
//! `(i, j, l)` computes the product of row part `i`, column part `j` over
//! K part `l`, accumulating it over the part's K in chunks of
//! `chunk_blocks` K blocks. The operands live once on the chip, in *home*
//! buffers: in K part `l`, A chunk `(i, s)` on tile `(i, s mod col_parts,
//! l)` and B chunk `(s, j)` on tile `(s mod row_parts, j, l)`. Chunk `s` is
//! one exchange step, which multicasts every A chunk to its row of tiles
//! and every B chunk to its column (all K parts at once), and one compute
//! step, whose `gemm_f16` vertices add the chunk's product to the running
//! sum in the C buffers (the kernel's accumulate mode, state word Z = 0,
//! from the second chunk on).
//!
//! Then the result: with one K part, f16 accumulation leaves it in `c`, f32
//! accumulation runs the reduce step as in a whole-K plan. With several K
//! parts, the partials are reduce-scattered: tile `(i, j, l)` receives row
//! piece `l` of every partial of its block (its own by a transfer to
//! itself, so that `reduce_f32` sees P uniformly spaced sections) into its
//! `c_partial` buffer, dead once the last chunk is summed (after the C
//! header, [`c_partial_bytes`]), and sums them with the epilogue into its
//! result rows.
//!
//! Invariants the lowering relies on (checked by `lower::verify`,
//! `storage::validate` and the exchange checker like any other program):
//! - every vertex's running sum ends in the `c` buffer: a vertex that runs
//!   `T` K blocks in all starts in `c` when `T` is odd, else in
//!   `c_partial`, and every block moves the sum to the other buffer;
//! - home chunks have the receive buffers' row stride, so each chunk moves
//!   as one contiguous transfer; padding (K beyond the model's, columns
//!   beyond N, the short last chunk) is zero in the homes from load time
//!   and never written, so padded products add exact zeros.

use crate::exchange::{self, BufferRef, BufferTransfer};
use crate::fuse::Source;
use crate::gemm::{
    aligned_ranges, best_split_with, ranges, shard_sizes, GemmCosts, GemmGeometry, ShardLayout,
    WorkerSplit,
};
use crate::lower::{
    push_coalesced, BufferSpec, GemmVertex, GroupResult, HostPlacement, HostTensor, Launch,
    PlannedGemm, RegionReq, StateWord, Step, Vertex,
};
use crate::plan::{pareto_front, Estimate, GemmPlan, SearchBudget, StreamShape, STANDARD_BUDGET};
use crate::storage::region1_footprint;
use crate::CompileError;
use ipu_arch::{host_transfer_cycles, CLOCK_HZ_C600, SYNC_CYCLES};
use ipu_graph::Graph;
use std::collections::{BTreeMap, HashMap};

/// Bytes of region 1.
const REGION1_BYTES: u64 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;

/// Chunk sizes (K blocks) the search tries.
const CHUNK_BLOCKS: [u32; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];

/// K-part counts the search tries.
const K_PARTS: [u32; 8] = [1, 2, 3, 4, 6, 8, 12, 16];

/// The scratch phase of a plan with several K parts, after
/// [`StreamPhases::After`]'s base: the chunk buffers (the reduce-scatter
/// gathers into the dead `c_partial`, [`c_partial_bytes`]).
const CHUNK_PHASE: u32 = 1;

/// Scratch phases one streamed GEMM with several K parts uses.
pub const PHASES: u32 = 1;

/// Region-0 bytes of one compute step's program on a tile (an upper
/// bound): per vertex its state (11 words, 12 with `gemm_fp8`'s SCALE) and
/// a program-table entry, plus the step's own record.
fn program_bytes(g: &GemmGeometry, vertices: u64) -> u64 {
    let words = crate::kernels::GEMM_STATE_WORDS as u64 + g.fp8_scale.is_some() as u64;
    vertices * (4 * words + 24) + 64
}

/// K-block ranges of the K groups for a chunk of `w` blocks: always
/// `groups` entries (a group may get none when `w < groups`).
fn k_ranges(w: u32, groups: u32) -> Vec<(u32, u32)> {
    (0..groups)
        .map(|i| (i * w / groups, (i + 1) * w / groups))
        .collect()
}

/// The K-block range of every K part.
fn k_parts(g: &GemmGeometry, kp: u32) -> Vec<(u32, u32)> {
    ranges(g.nkb(), kp)
}

/// K blocks `[b0, b1)` of chunk `s` of the K part `part` (empty past its end).
fn chunk(part: (u32, u32), ch: u32, s: u32) -> (u32, u32) {
    let b0 = (part.0 + s * ch).min(part.1);
    (b0, (b0 + ch).min(part.1))
}

/// Chunks of the longest K part: the step count.
fn step_count(g: &GemmGeometry, kp: u32, ch: u32) -> u32 {
    k_parts(g, kp)
        .iter()
        .map(|p| (p.1 - p.0).div_ceil(ch))
        .max()
        .unwrap_or(1)
}

/// The chunk geometry: the GEMM with K cut to one chunk (what a tile's
/// receive buffers and worker split see).
fn chunk_geometry(g: &GemmGeometry, ch: u32) -> GemmGeometry {
    GemmGeometry {
        k: ch.min(g.nkb()) * g.k_block(),
        ..*g
    }
}

/// How many row parts share the home of one B chunk, each holding a piece
/// of its K rows: with fewer chunks than row parts, chunk `s` lives on row
/// parts `s * share ..` of its column; otherwise every row part `i` holds
/// whole chunks `s = i (mod row parts)` (share 1). Whole chunks on the
/// first row parts put every projection's weights on the same few tiles:
/// SAM ViT-H's three 1280-wide projections held 61,440 bytes of B each on
/// tile 0 and none on most tiles.
fn b_home_share(part_steps: u32, row_parts: u32) -> u32 {
    (row_parts / part_steps.max(1)).max(1)
}

/// The K rows `[lo, hi)` of piece `p` of `share` of a chunk of `rows` rows.
fn b_piece(rows: u32, share: u32, p: u32) -> (u32, u32) {
    (rows * p / share, rows * (p + 1) / share)
}

/// The piece of a B chunk that row part `i` is home to when chunks are cut
/// into pieces (`b_home_share` above 1): (chunk, first K row, end K row)
/// within the chunk; `None` when row parts hold whole chunks, or for a row
/// part that holds no piece.
fn b_home_piece(part: (u32, u32), ch: u32, kb: u32, rp: u32, i: u32) -> Option<(u32, u32, u32)> {
    let part_steps = (part.1 - part.0).div_ceil(ch);
    let share = b_home_share(part_steps, rp);
    let s = i / share;
    if share == 1 || s >= part_steps {
        return None;
    }
    let (b0, b1) = chunk(part, ch, s);
    let (lo, hi) = b_piece((b1 - b0) * kb, share, i % share);
    Some((s, lo, hi))
}

/// Whether A's homes are spread: in a segment, whose join writes A into
/// its homes by exchange, every column tile of a row part holds a share of
/// every chunk's rows (its row piece, [`pieces`] with no alignment: empty
/// when the row part has fewer rows than column tiles), so that the
/// join's receipt is
/// spread over all of them; otherwise (the host writes the homes) tile `j`
/// holds the whole chunks `s = j (mod col_parts)`. Either way a chunk step
/// receives each chunk whole on every column tile. (The ViT block's Q, K
/// and V, 3 chunks over 12 column tiles: the join's step received each
/// home's 14 KB chunk on 3 tiles of 12.)
fn spread_homes(costs: &GemmCosts) -> bool {
    costs.a_joined
}

/// Whether chunk 0 of A reaches the tiles' `a` receive buffers straight
/// from the segment's join (beside the spread homes of the later chunks)
/// instead of by an exchange step of its own from a home: A is a value an
/// earlier segment computed (`GemmCosts::a_from_segment`: a model input
/// may be written by the host, whose copy into the scratch `a` would have
/// to outlive the earlier segments), its homes are spread, B is resident
/// (chunk steps then move only A), and chunk 0 of every K part holds only
/// the model's K (its padding columns must be zero, which homes are from
/// load but a scratch `a` is not, and the join writes only real bytes).
/// The ViT block's one-step plans then receive their A once, not into a
/// home and again from it, and multi-step ones save chunk 0's sync.
fn chunk0_joined(
    g: &GemmGeometry,
    kp: u32,
    ch: u32,
    b_resident: bool,
    host_a: bool,
    costs: &GemmCosts,
) -> bool {
    host_a
        && spread_homes(costs)
        && costs.a_from_segment
        && b_resident
        && k_parts(g, kp).iter().all(|&part| {
            let (_, b1) = chunk(part, ch, 0);
            b1 * g.k_block() <= g.k
        })
}

/// The slowest vertex of a compute step over a chunk of `w` blocks, with
/// the supervisor's launches.
fn step_compute(costs: &mut GemmCosts, split: &WorkerSplit, w: u32) -> u64 {
    let kg = split.k_groups.len() as u32;
    let mut slowest = 0;
    let mut vertices = 0;
    for r in &split.row_groups {
        for c in &split.col_groups {
            for k in k_ranges(w, kg) {
                if k.1 == k.0 {
                    continue;
                }
                vertices += 1;
                slowest = slowest.max(costs.gemm.eval(&[
                    ("M", (r.1 - r.0) as i64),
                    ("NCB", (c.1 - c.0) as i64),
                    ("NKB", (k.1 - k.0) as i64),
                ]));
            }
        }
    }
    if vertices == 0 {
        return 0;
    }
    // Every chunk's compute step follows its exchange step
    // (`lower::Launch::AfterSync`).
    slowest + Launch::AfterSync.cycles(vertices)
}

/// The cost model's cycles for one exchange step that receives (and sends)
/// at most `bytes` per tile: the sync, the receive port's words with the
/// scheduler's tolerance of 1/32 above its bound, and the step's prologue.
fn exchange_estimate(bytes: u64) -> u64 {
    let words = bytes.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
    SYNC_CYCLES + words + words / 32 + 40
}

/// Row pieces of a block of `rows` rows for the reduce-scatter over `kp`
/// K parts (a piece may be empty when `rows < kp`), their bounds rounded to
/// multiples of `align` rows (the geometry's row alignment: a projection's
/// result rows are transposed in pairs).
fn pieces(rows: u32, kp: u32, align: u32) -> Vec<(u32, u32)> {
    let align = align.max(1) as u64;
    let bound = |l: u32| -> u32 {
        if l >= kp {
            return rows;
        }
        let exact = l as u64 * rows as u64 / kp as u64;
        (((exact + align / 2) / align) * align).min(rows as u64) as u32
    };
    (0..kp).map(|l| (bound(l), bound(l + 1))).collect()
}

/// Rows of the largest piece ([`pieces`]): a gathered section's rows.
fn piece_rows(rows: u32, kp: u32, align: u32) -> u32 {
    pieces(rows, kp, align)
        .iter()
        .map(|p| p.1 - p.0)
        .max()
        .unwrap_or(0)
}

/// Bytes between the gathered sections of the reduce-scatter of a tile
/// with `rows` rows over `kp` K parts: the largest piece's rows
/// ([`piece_rows`]); with f16 partials (not `g.acc32`) 8 bytes more when
/// that is a multiple of 16, so that partials i and i + 1 sit in different
/// banks of interleaved memory and `reduce_f32` ACC=16 can load both with
/// one `ld2x64st64` (docs/kernels.md). f32 partials keep 16-byte sections:
/// `reduce_f32` IN=32 reads them with `ld128`.
fn gather_section(g: &GemmGeometry, rows: u32, kp: u32, rs_c: u32) -> u32 {
    let bytes = piece_rows(rows, kp, g.row_align) * rs_c;
    if !g.acc32 && bytes.is_multiple_of(16) {
        bytes + 8
    } else {
        bytes
    }
}

/// Bytes of a tile's `c_partial` buffer: its C layout, or with `kp > 1`
/// K parts enough for the reduce-scatter's `kp` sections of the tile's
/// piece after the C header, wherever that is more. Every running sum ends
/// in `c`, so `c_partial` is dead once the last chunk is summed and the
/// reduce-scatter gathers into it; a gather buffer of its own had to fit
/// beside both C buffers, which kept the 4096^3 GEMM's shards of 372 rows
/// (two 144 KiB C buffers and a 143 KiB gather) out of region 1. The
/// header (the zero word, written at load or by a segment's fill step)
/// stays untouched for the next run.
fn c_partial_bytes(layout: &ShardLayout, kp: u32, section: u32) -> u32 {
    let gather = if kp > 1 {
        crate::gemm::C_HEADER + kp * section
    } else {
        0
    };
    layout.c_bytes().max(gather)
}

/// The reduce of one tile's piece of a reduce-scatter: its slowest
/// vertex's formula cycles, its vertices' (row range, column-block range),
/// the kernel when not the planned one (`reduce_f32` PAIRS=1 or OWN=1), and, when
/// that kernel reads the tile's own piece in `c` (state word OWN), the
/// row group of `c` that holds the piece.
struct PieceReduce {
    slowest: u64,
    parts: Vec<ReducePart>,
    kernel: Option<crate::library::KernelRequest>,
    own_group: Option<u32>,
}

/// The most partials `reduce_f32` reads with partial 0 at OWN.
const OWN_MAX_PARTIALS: u32 = 8;

/// [`PieceReduce`] of K part `l`'s piece on tile `t` (no vertices for an
/// empty piece): the object that reads the own piece in `c`
/// ([`crate::lower::PlannedGemm::reduce_own`]) where its formula says that
/// is faster for this piece, counting the self-transfer it spares, and
/// with OWN when the piece's rows lie in one row group there (rows of one
/// row group are `rs_c` apart; the gather's sections and `c` are both
/// 16-aligned in region 1, as PAIRS=1's OWN needs) and 2 to 8 K parts
/// sum. Untransposed, that object (PAIRS=1) also loads two partials per
/// load where the placement allows (its sections are 8 mod 16 apart,
/// `gather_section`, and its result rows in region 0), so it may pay
/// without OWN too.
fn piece_reduce(
    pg: &mut crate::lower::PlannedGemm,
    g: &GemmGeometry,
    t: &TileWork,
    kp: u32,
    l: u32,
) -> PieceReduce {
    let mt = t.rows.1 - t.rows.0;
    let nct = t.cols.1 - t.cols.0;
    let piece = pieces(mt, kp, g.row_align)[l as usize];
    let rows_here = piece.1 - piece.0;
    let mut chosen = PieceReduce {
        slowest: 0,
        parts: Vec::new(),
        kernel: None,
        own_group: None,
    };
    if rows_here == 0 {
        return chosen;
    }
    // (Without a formula every vertex costs its elements.)
    let row_align = if pg.transposed_result {
        crate::TRANSPOSED_REDUCE_ROW_ALIGN
    } else {
        1
    };
    (chosen.slowest, chosen.parts) =
        reduce_parts(rows_here, nct, kp, pg.costs.reduce.as_mut(), row_align);
    if let Some((own_kernel, formula)) = pg.reduce_own.as_mut() {
        // Both objects read OWN only with 2 to 8 partials (their unrolled
        // paths; a vertex given OWN beyond them faults).
        let own_group = t
            .split
            .row_groups
            .iter()
            .position(|&(g0, g1)| g0 <= piece.0 && piece.1 <= g1)
            .filter(|_| (2..=OWN_MAX_PARTIALS).contains(&kp))
            .map(|gi| gi as u32);
        // The transposed object (OWN=1) differs from the plain one only in
        // reading OWN: without it, it costs more for nothing.
        if pg.transposed_result && own_group.is_none() {
            return chosen;
        }
        let (fast, fast_parts) = reduce_parts(rows_here, nct, kp, Some(formula), row_align);
        // Reading the own piece in `c` also spares the reduce-scatter the
        // piece's words, received at 4 bytes a cycle before the reduce
        // starts: the plain vertex costs them too.
        let self_transfer = if own_group.is_some() {
            (rows_here * t.layout.rs_c).div_ceil(4) as u64
        } else {
            0
        };
        if pg.costs.reduce.is_some() && fast < chosen.slowest + self_transfer {
            chosen = PieceReduce {
                slowest: fast,
                parts: fast_parts,
                kernel: Some(own_kernel.clone()),
                own_group,
            };
        }
    }
    chosen
}

/// The gather section of K part `src`'s piece on the tile of K part `own_l`:
/// its own index, or with `own` (the tile reads its own piece in `c`) the
/// other K parts in K order from section 1, which `reduce_f32` PAIRS=1
/// reads after the own piece (partial 0).
fn gather_slot(src: u32, own_l: u32, own: bool) -> u32 {
    if own && src < own_l {
        src + 1
    } else {
        src
    }
}

/// One reduce vertex of a piece: (row range, column-block range).
type ReducePart = ((u32, u32), (u32, u32));

/// The reduce vertices of a piece of `rows` rows and `col_blocks` column
/// blocks, at most one per worker: the grid of row and column cuts whose
/// slowest vertex is fastest by `reduce`, the kernel's formula over
/// (ROWS, QUADS, P = `kp`) (more row cuts when equal, since each row has
/// its own overhead; without a formula, by elements): a piece of a few
/// rows splits its columns too, rather than leave workers idle. Row cuts
/// fall on multiples of `row_align` (`GemmCosts::reduce_row_align`).
/// Returns the slowest vertex's cycles (0 without a formula) and the
/// vertices.
fn reduce_parts(
    rows: u32,
    col_blocks: u32,
    kp: u32,
    mut reduce: Option<&mut crate::gemm::FormulaCost>,
    row_align: u32,
) -> (u64, Vec<ReducePart>) {
    let mut cost = |rows: u32, quads: u32| -> u64 {
        match reduce.as_mut() {
            Some(f) => f.eval(&[
                ("ROWS", rows as i64),
                ("QUADS", quads as i64),
                ("P", kp as i64),
            ]),
            None => rows as u64 * quads as u64,
        }
    };
    let workers = ipu_arch::WORKER_CONTEXTS;
    let mut best: Option<(u64, Vec<ReducePart>)> = None;
    for r in 1..=workers.min(rows.max(1)) {
        let c = (workers / r).min(col_blocks.max(1));
        let parts: Vec<ReducePart> = aligned_ranges(rows, r, row_align)
            .into_iter()
            .flat_map(|rr| ranges(col_blocks, c).into_iter().map(move |cc| (rr, cc)))
            .collect();
        let slowest = parts
            .iter()
            .map(|(rr, cc)| cost(rr.1 - rr.0, 4 * (cc.1 - cc.0)))
            .max()
            .unwrap_or(0);
        if best.as_ref().is_none_or(|b| slowest <= b.0) {
            best = Some((slowest, parts));
        }
    }
    let (slowest, parts) = best.expect("one worker at least");
    (if reduce.is_some() { slowest } else { 0 }, parts)
}

/// What one shard size costs in one (chunk, K parts) configuration,
/// independent of the grid: computed once per search.
#[derive(Clone, Copy)]
struct ShardCost {
    /// Compute steps of the slowest K part and the reduce step.
    compute: u64,
    reduce: u64,
    /// Region-0 bytes besides the homes, region-1 bytes of the buffers.
    fixed_r0: u64,
    r1: u64,
    /// Bytes of one A chunk row block and one B chunk (home sizes), and
    /// the K rows of a B chunk.
    a_chunk: u64,
    b_chunk: u64,
    b_rows: u64,
    /// Bytes a tile receives per chunk step, and in the reduce-scatter.
    exchange: u64,
    gather: u64,
    /// Region 1 for a GEMM sharing the tiles: [`StreamShape::joint_r1`]
    /// without the homes.
    joint: (u64, u64, u64),
    /// Region-1 bytes of the buffers that outlive the scratch phases.
    persistent_r1: u64,
}

/// Per-search memo of [`shard_cost`], keyed by (rows, column blocks,
/// chunk blocks, K parts, B resident), and of the geometry's partitions;
/// what the search's threads share is in [`SharedMemo`].
pub struct Memo {
    shards: BTreeMap<(u32, u32, u32, u32, bool), Option<ShardCost>>,
    partitions: crate::gemm::Partitions,
    shared: std::sync::Arc<SharedMemo>,
}

/// The memos a search's threads share (results are pure functions of
/// their keys, so which thread computes one first does not matter):
/// worker splits, and the reduce-scatter pieces' reduce, by (piece rows,
/// column blocks, K parts): (slowest vertex, vertices).
#[derive(Default)]
pub struct SharedMemo {
    splits: crate::gemm::SplitMemo,
    reduces: std::sync::Mutex<HashMap<ReduceKey, (u64, usize)>>,
}

/// (piece rows, column blocks, K parts).
type ReduceKey = (u32, u32, u32);

impl Memo {
    pub fn new() -> Memo {
        Memo::sharing(Default::default())
    }

    /// A thread's memo of a search whose threads share `shared`.
    pub fn sharing(shared: std::sync::Arc<SharedMemo>) -> Memo {
        Memo {
            shards: BTreeMap::new(),
            partitions: Default::default(),
            shared,
        }
    }
}

impl Default for Memo {
    fn default() -> Self {
        Memo::new()
    }
}

fn shard_cost(
    g: &GemmGeometry,
    (mt, nct): (u32, u32),
    ch: u32,
    (kp, b_resident): (u32, bool),
    bias: bool,
    costs: &mut GemmCosts,
    shared: &SharedMemo,
) -> Option<ShardCost> {
    let gc = chunk_geometry(g, ch);
    let ch = gc.nkb();
    let steps = step_count(g, kp, ch);
    let max_kg = if kp > 1 { 1 } else { u32::MAX };
    let (split, _, _) = shared.splits.best_split_with(&gc, mt, nct, costs, max_kg)?;
    let layout = ShardLayout::new(&gc, mt, nct, &split);
    // The slowest K part's steps. Chunks are `ch` blocks but for a part's
    // last (and none past its end): each width is costed once.
    let mut by_width: Vec<(u32, u64)> = Vec::new();
    let mut compute = k_parts(g, kp)
        .iter()
        .map(|&p| {
            (0..steps)
                .map(|s| {
                    let (b0, b1) = chunk(p, ch, s);
                    match by_width.iter().find(|e| e.0 == b1 - b0) {
                        Some(&(_, c)) => c,
                        None => {
                            let c = step_compute(costs, &split, b1 - b0);
                            by_width.push((b1 - b0, c));
                            c
                        }
                    }
                })
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let mut fixed_r0 = steps as u64 * (program_bytes(g, split.vertices() as u64) + 16);
    let (r1, reduce, gather, joint, persistent_r1);
    let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
    let whole = |b: u32| (b as u64).div_ceil(element) * element;
    if kp > 1 {
        // Reduce-scatter: a piece of rows, P = kp partials.
        let piece = piece_rows(mt, kp, g.row_align);
        let f = costs.reduce.as_mut()?;
        let key = (piece, nct, kp);
        let hit = shared
            .reduces
            .lock()
            .expect("not poisoned")
            .get(&key)
            .copied();
        let (slowest, parts) = hit.unwrap_or_else(|| {
            let (slowest, parts) = reduce_parts(piece, nct, kp, Some(f), costs.reduce_row_align);
            let c = (slowest, parts.len());
            shared.reduces.lock().expect("not poisoned").insert(key, c);
            c
        });
        // After the reduce-scatter's exchange (`lower::Launch::AfterSync`).
        reduce = slowest + Launch::AfterSync.cycles(parts as u64);
        fixed_r0 += (piece * layout.rs_d()) as u64 + 128;
        gather = (kp * piece * layout.rs_c) as u64;
        let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
        // The C buffers (and resident B: every chunk of the tile's K part,
        // from load time on) persist, since they span the chunk steps and
        // the reduce-scatter. The gather is `c_partial` (`c_partial_bytes`),
        // so the scratch phase holds only the chunks.
        let c_partial = c_partial_bytes(&layout, kp, gather_section(g, mt, kp, layout.rs_c));
        let mut persistent = vec![(layout.c_bytes(), true), (c_partial, true)];
        if b_resident {
            persistent.push((steps * layout.b_bytes(), false));
        }
        let mut chunks = vec![(layout.a_bytes(), true)];
        if !b_resident {
            chunks.push((layout.b_bytes(), false));
        }
        let scratch = region1_footprint(&chunks)?;
        let persistent = region1_footprint(&persistent)?;
        r1 = persistent.div_ceil(element) * element + scratch;
        persistent_r1 = persistent;
        joint = (
            whole(layout.c_bytes()) + whole(c_partial),
            if b_resident {
                (steps * layout.b_bytes()) as u64
            } else {
                0
            },
            scratch,
        );
    } else {
        reduce = if g.needs_reduce(split.k_groups.len()) {
            let (_, r) = costs.split_cycles(&gc, &split);
            fixed_r0 += layout.d_bytes() as u64;
            // After the last chunk's compute step
            // (`lower::Launch::AfterCompute`).
            r + Launch::AfterCompute.cycles(split.reduce_vertices() as u64)
        } else {
            0
        };
        gather = 0;
        r1 = costs.region1_bytes(&layout)?;
        persistent_r1 = r1;
        joint = (
            2 * whole(layout.c_bytes()) + whole(layout.a_bytes()),
            layout.b_bytes() as u64,
            0,
        );
    }
    compute += reduce;
    if bias {
        fixed_r0 += nct as u64 * g.bias_block_bytes() as u64;
    }
    Some(ShardCost {
        compute,
        reduce,
        fixed_r0,
        r1,
        a_chunk: (mt * layout.rs_a) as u64,
        b_chunk: layout.b_bytes() as u64,
        b_rows: layout.kp as u64,
        exchange: (mt * layout.rs_a + if b_resident { 0 } else { layout.b_bytes() }) as u64,
        gather,
        joint,
        persistent_r1,
    })
}

/// Cost and memory of one streamed candidate (`host_a`: A comes from the
/// host into homes, else from an earlier GEMM's result tiles; `bias`: a
/// fused bias to place), `None` if it does not fit.
pub fn evaluate(
    g: &GemmGeometry,
    (row_parts, col_parts, kp): (u32, u32, u32),
    (ch, b_resident): (u32, bool),
    (host_a, bias): (bool, bool),
    fit: Fit,
    costs: &mut GemmCosts,
    memo: &mut Memo,
) -> Option<GemmPlan> {
    let beside = match fit {
        Fit::Beside(b) => Some(b),
        _ => None,
    };
    let (rows, cols) = memo.partitions.grid(g, row_parts, col_parts);
    if rows.count != row_parts || cols.sizes.count != col_parts || kp > g.nkb() {
        return None;
    }
    let sizes = shard_sizes(rows, &cols.sizes);
    // Several K parts need the reduce kernel (f32 partials, or f16 ones
    // when the library has reduce_f32 IN=16).
    if kp > 1 && costs.reduce.is_none() {
        return None;
    }
    // Resident B is a plan with K parts (each tile's part of B is then a
    // fraction of K; with one part it would be all of K).
    if b_resident && kp == 1 {
        return None;
    }
    let ch = chunk_geometry(g, ch).nkb();
    let steps = step_count(g, kp, ch);
    let (mut compute, mut reduce_part, mut peak_r1, mut peak_r0) = (0u64, 0u64, 0u64, 0u64);
    let (mut exchange_bytes, mut gather_bytes, mut joined_bytes) = (0u64, 0u64, 0u64);
    let mut copied_b_bytes = 0u64;
    let mut joint = (0u64, 0u64, 0u64);
    // Homes per tile: A chunks s = j (mod col_parts), or with spread homes
    // (`spread_homes`) a share of every chunk's rows; B chunks s = i (mod
    // row_parts).
    let spread = spread_homes(costs);
    // Chunk 0 straight into the receive buffers by the join: homes then
    // hold chunks 1.., and no exchange step brings chunk 0.
    let join0 = chunk0_joined(g, kp, ch, b_resident, host_a, costs);
    let home_steps = steps - join0 as u32;
    let a_chunks = if host_a && !spread {
        steps.div_ceil(col_parts) as u64
    } else {
        0
    };
    let b_chunks = if b_resident {
        0
    } else {
        steps.div_ceil(row_parts) as u64
    };
    let b_share = b_home_share(steps, row_parts) as u64;
    for (mt, nct) in sizes {
        let key = (mt, nct, ch, kp, b_resident);
        let c = match memo.shards.get(&key) {
            Some(&c) => c,
            None => {
                let c = shard_cost(
                    g,
                    (mt, nct),
                    ch,
                    (kp, b_resident),
                    bias,
                    costs,
                    &memo.shared,
                );
                memo.shards.insert(key, c);
                c
            }
        };
        let c = c?;
        if b_resident
            && costs
                .b_cap
                .is_some_and(|cap| steps as u64 * c.b_chunk > cap)
        {
            return None;
        }
        // A tile's A home: whole chunks, or its share of every chunk's rows.
        let a_home = if host_a && spread {
            // (The largest share: `pieces` rounds the bounds down.)
            home_steps as u64 * (c.a_chunk / mt.max(1) as u64) * mt.div_ceil(col_parts) as u64
        } else {
            a_chunks * c.a_chunk
        };
        // The homes go to region 0 while it has room, else after the
        // interleaved buffers (storage::place does the same, in this order).
        // (Region 0 beside another GEMM is what that GEMM leaves.)
        let standard = STANDARD_BUDGET.saturating_sub(beside.map_or(0, |b| b.standard));
        let (mut r0, mut r1_end) = (0u64, c.r1);
        let mut spilled = 0;
        // A B home: whole chunks, or the largest piece of one.
        let b_home = if b_share > 1 {
            c.b_rows.div_ceil(b_share) * (c.b_chunk / c.b_rows.max(1))
        } else {
            b_chunks * c.b_chunk
        };
        for home in [a_home, b_home] {
            if r0 + home + c.fixed_r0 <= standard {
                r0 += home;
            } else {
                r1_end += home;
                spilled += home;
            }
        }
        joint = (
            joint.0.max(c.joint.0),
            joint.1.max(c.joint.1),
            joint.2.max(c.joint.2 + spilled),
        );
        r0 += c.fixed_r0;
        if r0 > STANDARD_BUDGET || r1_end > REGION1_BYTES {
            return None;
        }
        if let Fit::Phased { persistent } = fit {
            // Homes that spill into region 1 outlive the phases too.
            if kp == 1 || c.persistent_r1 + spilled > persistent {
                return None;
            }
        }
        if beside.is_some_and(|other| {
            !fits_beside((c.joint.0, c.joint.1, c.joint.2 + spilled), r0, other)
        }) {
            return None;
        }
        compute = compute.max(c.compute);
        reduce_part = reduce_part.max(c.reduce);
        peak_r0 = peak_r0.max(r0);
        peak_r1 = peak_r1.max(r1_end);
        exchange_bytes = exchange_bytes.max(c.exchange);
        gather_bytes = gather_bytes.max(c.gather);
        // What a segment's join delivers to the tile: its A homes, and with
        // the weights moved from their homes (`b_joined`) its resident
        // chunks of B (B homes are region-0 buffers, which the join leaves
        // where the initialize call wrote them).
        let a_joined = if costs.a_copied && costs.a_joined {
            a_home
        } else {
            0
        };
        let b_joined = if costs.b_joined && b_resident {
            steps as u64 * c.b_chunk
        } else {
            0
        };
        // (Chunk 0 in the join is what its exchange step would have
        // received, whether or not the plans weigh the rest of the join.)
        let chunk0 = if join0 { c.a_chunk } else { 0 };
        joined_bytes = joined_bytes.max(a_joined + b_joined + chunk0);
        // A host input B (batched GEMMs of two inputs) that the run holds
        // once reaches every row part's resident chunks by a copy step
        // (`b_copied`, as for whole-K plans); B homes hold it once.
        if costs.b_copied && b_resident && row_parts > 1 && !costs.b_joined {
            copied_b_bytes = copied_b_bytes.max(steps as u64 * c.b_chunk);
        }
    }
    let mut exchange = (steps - join0 as u32) as u64 * exchange_estimate(exchange_bytes);
    // In a segment the join writes A into its homes (what a whole-K plan
    // receives as its rows, plan::evaluate), and B when it moves the
    // weights: in an exchange step that runs anyway, so without a sync of
    // its own.
    exchange += joined_bytes.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64);
    if copied_b_bytes > 0 {
        // In a segment's join the copy rides in the step that runs anyway.
        exchange += if costs.a_joined {
            copied_b_bytes.div_ceil(ipu_arch::EXCHANGE_RECV_BYTES_PER_CYCLE as u64)
        } else {
            exchange_estimate(copied_b_bytes)
        };
    }
    if kp > 1 {
        exchange += exchange_estimate(gather_bytes);
    }
    let in_bytes = if host_a {
        g.m as u64 * g.k as u64 * g.operand_bytes() as u64
    } else {
        0
    };
    let host_in = host_transfer_cycles(in_bytes, CLOCK_HZ_C600);
    let host_out = host_transfer_cycles(
        g.m as u64 * g.n as u64 * g.result_bytes() as u64,
        CLOCK_HZ_C600,
    );
    let device = compute + exchange;
    Some(GemmPlan {
        row_parts,
        col_parts,
        stream: Some(StreamShape {
            chunk_blocks: ch,
            steps,
            k_parts: kp,
            exchange_cycles: exchange,
            b_resident,
            joint_r1: joint,
        }),
        estimate: Estimate {
            compute_cycles: device,
            reduce_cycles: reduce_part,
            copy_cycles: 0,
            transpose_cycles: 0,
            host_in_cycles: host_in,
            host_out_cycles: host_out,
            // Resident B is written to every row part's tiles.
            params_cycles: host_transfer_cycles(
                g.k as u64
                    * g.n as u64
                    * g.operand_bytes() as u64
                    * if b_resident { row_parts as u64 } else { 1 },
                CLOCK_HZ_C600,
            ),
            total_cycles: SYNC_CYCLES + host_in + device + host_out,
            peak_standard_bytes: peak_r0,
            peak_interleaved_bytes: peak_r1,
            active_tiles: row_parts * col_parts * kp,
        },
    })
}

/// What else a streamed plan's tiles hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Nothing else.
    Alone,
    /// Another GEMM's buffers (a chain's streamed producer beside its
    /// streamed consumer).
    Beside(Beside),
    /// An attention's projection: its chunk buffers are scratch of a
    /// phase shared with the other projections, whose memory the
    /// attention reuses afterwards, and
    /// the buffers that outlive it get at most `persistent` bytes of
    /// region 1 (what the attention leaves). Only plans with K parts
    /// (their result is the reduce step's rows).
    Phased { persistent: u64 },
}

/// Another GEMM on the same tiles, as a streamed plan must fit beside it:
/// its region 1 ([`StreamShape::joint_r1`], [`crate::gemm::GemmCosts::joint`])
/// and its region-0 peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Beside {
    pub joint_r1: (u64, u64, u64),
    pub standard: u64,
}

/// Whether buffers with region-1 needs `own` ([`StreamShape::joint_r1`])
/// and region-0 peak `standard` fit beside `other`, laid out as
/// `storage::place` does: every element-exclusive buffer of both on its
/// own elements, the other persistent buffers, then the scratch phases of
/// both from the next element boundary, sharing memory (one GEMM runs
/// after the other, so no two of their phases are live together).
fn fits_beside(own: (u64, u64, u64), standard: u64, other: Beside) -> bool {
    let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
    let (exclusive, persistent, phase) = other.joint_r1;
    let fixed = (own.0 + exclusive + own.1 + persistent).div_ceil(element) * element;
    fixed + own.2.max(phase) <= REGION1_BYTES && standard + other.standard <= STANDARD_BUDGET
}

/// Streamed candidates over grids that use at least half of the tiles, the
/// K-part counts of [`K_PARTS`] and the chunk sizes of [`CHUNK_BLOCKS`],
/// Pareto-filtered over (device cycles, peak bytes), best first, at most
/// `beam_width`.
/// `min_k_parts`: the fewest K parts a plan may have (an f16-accumulated
/// plan under `Accumulation::Auto` needs four: each K part is one f16
/// chain, and four chains summed in f32 keep the rounding error a tenth
/// of the tolerance, docs/compiler.md).
pub fn search(
    g: &GemmGeometry,
    tiles: u32,
    (host_a, bias): (bool, bool),
    min_k_parts: u32,
    costs: &mut GemmCosts,
    budget: &SearchBudget,
) -> (Vec<GemmPlan>, usize) {
    search_fit(
        g,
        tiles,
        (host_a, bias),
        min_k_parts,
        Fit::Alone,
        costs,
        budget,
    )
}

/// [`search`] for plans that fit beside what else their tiles hold.
pub fn search_fit(
    g: &GemmGeometry,
    tiles: u32,
    (host_a, bias): (bool, bool),
    min_k_parts: u32,
    fit: Fit,
    costs: &mut GemmCosts,
    budget: &SearchBudget,
) -> (Vec<GemmPlan>, usize) {
    let (mut candidates, generated) =
        candidates(g, tiles, (host_a, bias), min_k_parts, fit, costs, budget);
    candidates.sort_by_key(|p| {
        (
            p.estimate.compute_cycles,
            p.estimate.active_tiles,
            p.estimate.peak_interleaved_bytes + p.estimate.peak_standard_bytes,
            p.row_parts,
            p.stream.map(|s| (s.k_parts, s.chunk_blocks, s.b_resident)),
        )
    });
    (pareto_front(candidates, budget.beam_width), generated)
}

/// Every feasible streamed candidate of [`search_fit`] in search order, and
/// the count of shapes generated.
fn candidates(
    g: &GemmGeometry,
    tiles: u32,
    (host_a, bias): (bool, bool),
    min_k_parts: u32,
    fit: Fit,
    costs: &GemmCosts,
    budget: &SearchBudget,
) -> (Vec<GemmPlan>, usize) {
    use rayon::prelude::*;
    // The shapes in search order, up to the budget.
    let mut shapes: Vec<(u32, u32, u32, u32)> = Vec::new();
    'outer: for kp in K_PARTS
        .iter()
        .copied()
        .filter(|&k| k <= g.nkb() && k >= min_k_parts)
    {
        let grid = tiles / kp;
        let least = (grid / 2).max(1);
        for rp in 1..=g.m.min(grid) {
            let first_cp = least.div_ceil(rp).max(1);
            for cp in first_cp..=g.ncb().min(grid / rp) {
                for ch in CHUNK_BLOCKS.iter().copied().filter(|&c| c <= g.nkb()) {
                    if shapes.len() >= budget.max_candidates {
                        break 'outer;
                    }
                    shapes.push((rp, cp, kp, ch));
                }
            }
        }
    }
    let generated = shapes.len();
    // Evaluated in parallel runs of consecutive shapes, each with its own
    // shard-cost memo and the worker splits shared (caches of pure
    // results), gathered in search order: the same plans for any thread
    // count. Each shape is one candidate with B from homes or resident
    // (only with K parts: evaluate refuses resident B without).
    let chunk = shapes
        .len()
        .div_ceil(4 * rayon::current_num_threads())
        .max(16);
    let shared = std::sync::Arc::new(SharedMemo::default());
    let candidates: Vec<GemmPlan> = shapes
        .par_chunks(chunk)
        .map(|part| {
            let mut costs = costs.clone();
            let mut memo = Memo::sharing(shared.clone());
            let mut out = Vec::new();
            for &(rp, cp, kp, ch) in part {
                for b_resident in [false, true].into_iter().filter(|&r| {
                    budget.stream_b_resident.is_none_or(|only| only == r) && (!r || kp > 1)
                }) {
                    if let Some(p) = evaluate(
                        g,
                        (rp, cp, kp),
                        (ch, b_resident),
                        (host_a, bias),
                        fit,
                        &mut costs,
                        &mut memo,
                    ) {
                        out.push(p);
                    }
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flatten()
        .collect();
    (candidates, generated)
}

/// A step of a streamed GEMM before its exchange is scheduled: GEMMs that
/// run side by side on disjoint tiles merge their exchange steps one by
/// one ([`merge`]), so that none of them waits for another's sync.
pub enum Pending {
    Exchange {
        transfers: Vec<BufferTransfer>,
        operation: String,
        phase: String,
    },
    Compute(Step),
}

/// Where lowering puts what it makes.
pub struct Sink<'s> {
    pub buffers: &'s mut BTreeMap<u32, Vec<BufferSpec>>,
    pub inputs: &'s mut BTreeMap<String, HostTensor>,
    pub params: &'s mut BTreeMap<String, HostTensor>,
    pub outputs: &'s mut BTreeMap<String, HostTensor>,
    pub resident: &'s mut BTreeMap<String, HostTensor>,
    pub steps: &'s mut Vec<Pending>,
    /// For a GEMM whose A is an earlier GEMM's result: where that result
    /// is, per producer tile (its compact rows of whole column blocks).
    pub a_from: Option<Vec<(u32, GroupResult)>>,
    /// The scratch phase of its chunk buffers.
    pub phases: StreamPhases,
    /// A homes of earlier streamed GEMMs, to share (and to add to).
    pub a_homes: &'s mut AHomes,
}

/// A streamed GEMM's A homes by grid shape: (A, row parts, column parts,
/// K parts, chunk blocks).
pub type HomeKey = (ipu_graph::ValueId, u32, u32, u32, u32);

/// One tile's A home: where it is, its size, row stride and the rows of A
/// it holds (a GEMM shares it only when all of these match its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AHome {
    pub tile: u32,
    pub buffer: usize,
    pub bytes: u32,
    pub rs_a: u32,
    pub rows: (u32, u32),
}

/// The A homes of the streamed GEMMs lowered so far, per grid tile
/// `(i, j, l)`: a later GEMM of the same A and grid (an attention's
/// projections of `x`) multicasts its chunks from them instead of homes of
/// its own, so `x` lives once and needs no copy.
pub type AHomes = BTreeMap<HomeKey, BTreeMap<(u32, u32, u32), AHome>>;

/// Scratch phases of a streamed GEMM with several K parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamPhases {
    /// Its own, after `base` (the phases of an earlier streamed GEMM of
    /// the chain): the chunks in `base + 1` (phases run in number order;
    /// buffers of different phases share memory).
    After(u32),
    /// A phase shared with others (an attention's projections, whose
    /// phase the attention's buffers reuse afterwards).
    Shared(u32),
}

impl StreamPhases {
    fn chunk(self) -> u32 {
        match self {
            StreamPhases::After(base) => base + CHUNK_PHASE,
            StreamPhases::Shared(p) => p,
        }
    }
}

impl Sink<'_> {
    /// Appends an exchange step of `transfers`.
    fn push_exchange(&mut self, transfers: Vec<BufferTransfer>, operation: String, phase: String) {
        self.steps.push(Pending::Exchange {
            transfers,
            operation,
            phase,
        });
    }
}

/// Merges the pending steps of GEMMs that run side by side on disjoint
/// tiles: where every list has an exchange step at the same position, one
/// exchange step moves all their transfers; compute steps stay apart (a
/// tile runs only its own, and consecutive compute steps need no sync).
/// Lists of different shapes run one after the other.
pub fn merge(lists: Vec<Vec<Pending>>) -> Vec<Pending> {
    let kinds = |l: &Vec<Pending>| -> Vec<bool> {
        l.iter()
            .map(|p| matches!(p, Pending::Exchange { .. }))
            .collect()
    };
    let aligned = lists.windows(2).all(|w| kinds(&w[0]) == kinds(&w[1]));
    if !aligned || lists.len() < 2 {
        return lists.into_iter().flatten().collect();
    }
    let len = lists[0].len();
    let mut iters: Vec<_> = lists.into_iter().map(|l| l.into_iter()).collect();
    let mut out = Vec::new();
    for _ in 0..len {
        let column: Vec<Pending> = iters
            .iter_mut()
            .map(|i| i.next().expect("aligned lists"))
            .collect();
        if matches!(column[0], Pending::Exchange { .. }) {
            let (mut all, mut operations, mut phases) = (Vec::new(), Vec::new(), Vec::new());
            for p in column {
                if let Pending::Exchange {
                    transfers,
                    operation,
                    phase,
                } = p
                {
                    all.extend(transfers);
                    operations.push(operation);
                    phases.push(phase);
                }
            }
            out.push(Pending::Exchange {
                transfers: multicast(all),
                operation: operations.join(", "),
                phase: phases.join("; "),
            });
        } else {
            out.extend(column);
        }
    }
    out
}

/// Transfers of the same source bytes as one multicast to all their
/// destinations (GEMMs that share A homes read the same chunks: sent once,
/// the source tile's port is not the bound), in first-seen order.
fn multicast(transfers: Vec<BufferTransfer>) -> Vec<BufferTransfer> {
    let mut index: BTreeMap<(BufferRef, u32), usize> = BTreeMap::new();
    let mut out: Vec<BufferTransfer> = Vec::new();
    for t in transfers {
        match index.get(&(t.source, t.bytes)) {
            Some(&i) => out[i].destinations.extend(t.destinations),
            None => {
                index.insert((t.source, t.bytes), out.len());
                out.push(t);
            }
        }
    }
    out
}

/// Schedules the pending exchange steps (labels from `exchange_label` on)
/// and appends every step to `steps`.
pub fn emit(
    pending: Vec<Pending>,
    tile_count: u32,
    buffers: &mut BTreeMap<u32, Vec<BufferSpec>>,
    steps: &mut Vec<Step>,
    exchange_label: &mut u32,
) -> Result<(), CompileError> {
    for p in pending {
        match p {
            Pending::Exchange {
                transfers,
                operation,
                phase,
            } => {
                steps.push(exchange::program_step(
                    tile_count,
                    transfers,
                    *exchange_label,
                    buffers,
                    operation,
                    phase,
                )?);
                *exchange_label += 1;
            }
            Pending::Compute(step) => steps.push(step),
        }
    }
    Ok(())
}

/// Per tile of the grid: its block, K part, buffers and worker split.
struct TileWork {
    tile: u32,
    rows: (u32, u32),
    cols: (u32, u32),
    part: (u32, u32),
    split: WorkerSplit,
    layout: ShardLayout,
    a: usize,
    b: usize,
    c: usize,
    c_partial: usize,
    /// `None` when A comes from an earlier GEMM's tiles or the home is
    /// shared (`a_src`).
    a_home: Option<usize>,
    /// Where this grid tile's A home chunks are (its own home or an
    /// earlier GEMM's of the same A and grid).
    a_src: Option<(u32, usize)>,
    /// `None` when B is resident (`b` holds every chunk).
    b_home: Option<usize>,
    bias: Option<usize>,
}

/// A vertex of the compute steps: (row part, column part, K part, row
/// group, column group, K group).
type VertexKey = (u32, u32, u32, usize, usize, usize);

/// Lowers one streamed GEMM: its A from the host (or a param) through
/// homes, or from an earlier GEMM's result tiles (`sink.a_from`). Returns
/// where the reduce step leaves the result, per tile (compact rows (f16, or f32) of
/// whole column blocks, as [`chained_a`] takes them from a producer); empty
/// when the result stays in the C buffers (no reduce step).
pub fn lower(
    graph: &Graph,
    pg: &mut PlannedGemm,
    mut sink: Sink,
) -> Result<Vec<(u32, GroupResult)>, CompileError> {
    let shape = pg.plan.stream.expect("a streamed plan");
    let node = graph.node(pg.group.gemm);
    let value = graph.value(node.result).name.clone();
    let result_value = pg.group.result();
    let result_name = graph.value(result_value).name.clone();
    let a_host = match pg.group.a {
        Source::Host(a) => Some(a),
        Source::Group(_) => None,
    };
    assert_eq!(
        a_host.is_none(),
        sink.a_from.is_some(),
        "a chained streamed GEMM comes with its producer's result tiles"
    );
    let b_id = node.args[1];
    let g = pg.geometry;
    // A chained A is a producer's result rows of the consumer's operand
    // type (`chained_a` moves them as whole column blocks); an fp8 GEMM takes fp8 A, which only a cast
    // (a row-wise segment) makes.
    assert!(
        sink.a_from.is_none() || g.fp8_scale.is_none(),
        "an fp8 GEMM's A does not come straight from a producer GEMM"
    );
    let gc = chunk_geometry(&g, shape.chunk_blocks);
    let (ch, steps, kp) = (shape.chunk_blocks, shape.steps, shape.k_parts);
    let (k, n) = (g.k, g.n);
    // Bytes of one K block of an A row (16 f16 or 32 fp8: 32 bytes
    // either way), of one operand element, and the K rows of a block.
    let (a_block_bytes, eb, kb) = (
        g.k_block() * g.operand_bytes(),
        g.operand_bytes(),
        g.k_block(),
    );
    let rows = pg.plan.row_ranges(&g);
    let cols = pg.plan.col_ranges(&g);
    let parts = k_parts(&g, kp);
    let (rp, cp) = (pg.plan.row_parts, pg.plan.col_parts);
    let phases = sink.phases;
    // Side by side (an attention's projections) the headers keep their
    // zeros from load time, unless the GEMM is in a segment, whose buffers
    // other segments' reuse.
    let header_fill = pg
        .scratch_fill
        .clone()
        .filter(|_| !matches!(phases, StreamPhases::Shared(_)) || pg.in_segment);
    let scratch = |phase| (kp > 1).then_some(phase);
    let spread = spread_homes(pg.costs);
    let join0 = chunk0_joined(&g, kp, ch, shape.b_resident, a_host.is_some(), pg.costs);
    let home_key: Option<HomeKey> = a_host.map(|a| (a, rp, cp, kp, ch));
    let shared_homes = home_key.and_then(|k| sink.a_homes.get(&k).cloned());
    let mut work: BTreeMap<(u32, u32, u32), TileWork> = BTreeMap::new();
    for shard in pg.map {
        let (i, j, l) = (shard.row_part, shard.col_part, shard.k_part);
        let (r0, r1) = rows[i as usize];
        let (c0, c1) = cols[j as usize];
        let part = parts[l as usize];
        let (mt, nct) = (r1 - r0, c1 - c0);
        let max_kg = if kp > 1 { 1 } else { u32::MAX };
        let (split, _, _) = best_split_with(&gc, mt, nct, pg.costs, max_kg)
            .expect("the plan's shards have a split that fits (plan checked it)");
        let layout = ShardLayout::new(&gc, mt, nct, &split);
        let width = (c1 * 16).min(n) - c0 * 16;
        let bufs = sink
            .buffers
            .get_mut(&shard.tile)
            .expect("tiles below tile_count");
        let mut push = |role: &str,
                        bytes: u32,
                        region,
                        exclusive,
                        zero: Vec<(u32, u32)>,
                        category: &str,
                        phase: Option<u32>| {
            bufs.push(BufferSpec {
                name: format!("{value}.{role}"),
                bytes,
                align: 16,
                region,
                exclusive_element: exclusive,
                zero,
                category: category.into(),
                scratch: phase,
                lifetime: None,
                kernel_segment: None,
            });
            bufs.len() - 1
        };
        // The receive buffers. The drain rows of A are never written (their
        // products only reach the C buffers' trailing rows); outside scratch
        // phases they start as zeros anyway.
        let a = push(
            "a",
            layout.a_bytes(),
            RegionReq::Interleaved,
            true,
            if kp > 1 {
                vec![]
            } else {
                vec![(mt * layout.rs_a, layout.a_bytes())]
            },
            "gemm_operand",
            scratch(phases.chunk()),
        );
        let part_steps = (part.1 - part.0).div_ceil(ch);
        let short = !(part.1 - part.0).is_multiple_of(ch);
        let pad_k = g.kp() != k && part.1 == g.nkb();
        // Resident B holds all of the part's chunks for the whole program
        // (the host writes them at initialize; padding stays zero).
        let b_bytes = if shape.b_resident {
            (part_steps * layout.b_bytes()).max(16)
        } else {
            layout.b_bytes()
        };
        let b = push(
            "b",
            b_bytes,
            RegionReq::Interleaved,
            false,
            if shape.b_resident && (pad_k || short || width != nct * 16) {
                vec![(0, b_bytes)]
            } else {
                vec![]
            },
            "gemm_weight",
            if shape.b_resident {
                None
            } else {
                scratch(phases.chunk())
            },
        );
        // The C headers must read zero: from load time, or (in a segment,
        // which has a fill kernel, so that the buffers may share memory
        // with other segments') zeroed by a fill step before the first
        // chunk. An attention's projections (one shared phase) of a model
        // of one segment keep their zeros from load time: the fill would
        // cost a step for nothing.
        let header = if header_fill.is_some() {
            vec![]
        } else {
            vec![(0, crate::gemm::C_HEADER)]
        };
        let c = push(
            "c",
            layout.c_bytes(),
            RegionReq::Interleaved,
            true,
            header.clone(),
            "gemm_result",
            None,
        );
        let c_partial = push(
            "c_partial",
            c_partial_bytes(&layout, kp, gather_section(&g, mt, kp, layout.rs_c)),
            RegionReq::Interleaved,
            true,
            header,
            "gemm_partials",
            None,
        );
        // Homes: zero wherever the host never writes and a kernel reads.
        let a_home_bytes = if spread {
            let (h0, h1) = pieces(mt, cp, 1)[j as usize];
            ((part_steps - join0 as u32) * (h1 - h0) * layout.rs_a).max(16)
        } else {
            let a_count = (j..part_steps).step_by(cp as usize).count() as u32;
            (a_count * mt * layout.rs_a).max(16)
        };
        let b_home_bytes = match b_home_piece(part, ch, kb, rp, i) {
            Some((_, lo, hi)) => (hi - lo) * layout.rs_b,
            None => (i..part_steps).step_by(rp as usize).count() as u32 * layout.b_bytes(),
        }
        .max(16);
        let shared = shared_homes
            .as_ref()
            .and_then(|m| m.get(&(i, j, l)))
            .filter(|h| h.bytes == a_home_bytes && h.rs_a == layout.rs_a && h.rows == (r0, r1))
            .copied();
        let a_home = a_host.filter(|_| shared.is_none()).map(|_| {
            push(
                "a_home",
                a_home_bytes,
                RegionReq::Any,
                false,
                if pad_k || short {
                    vec![(0, a_home_bytes)]
                } else {
                    vec![]
                },
                "gemm_operand_home",
                None,
            )
        });
        let b_home = (!shape.b_resident).then(|| {
            push(
                "b_home",
                b_home_bytes,
                RegionReq::Any,
                false,
                if pad_k || short || width != nct * 16 {
                    vec![(0, b_home_bytes)]
                } else {
                    vec![]
                },
                "gemm_weight_home",
                None,
            )
        });
        let bias = pg.group.bias.map(|_| {
            push(
                "bias",
                nct * g.bias_block_bytes(),
                RegionReq::Standard,
                false,
                vec![(0, nct * g.bias_block_bytes())],
                "bias",
                None,
            )
        });
        work.insert(
            (i, j, l),
            TileWork {
                tile: shard.tile,
                rows: (r0, r1),
                cols: (c0, c1),
                part,
                split,
                layout,
                a,
                b,
                c,
                c_partial,
                a_home,
                a_src: match (shared, a_home) {
                    (Some(h), _) => Some((h.tile, h.buffer)),
                    (None, Some(b)) => Some((shard.tile, b)),
                    (None, None) => None,
                },
                b_home,
                bias,
            },
        );
    }
    // This GEMM's own homes, for a later GEMM of the same A and grid.
    if let Some(key) = home_key {
        let own: BTreeMap<(u32, u32, u32), AHome> = work
            .iter()
            .filter_map(|(&ijl, t)| {
                t.a_home.map(|buffer| {
                    (
                        ijl,
                        AHome {
                            tile: t.tile,
                            buffer,
                            bytes: sink.buffers[&t.tile][buffer].bytes,
                            rs_a: t.layout.rs_a,
                            rows: t.rows,
                        },
                    )
                })
            })
            .collect();
        sink.a_homes.entry(key).or_insert(own);
    }

    // Per vertex: blocks still to run and where its running sum is (none
    // before its first block).
    let mut remaining: BTreeMap<VertexKey, u32> = BTreeMap::new();
    let mut sum_in: BTreeMap<VertexKey, usize> = BTreeMap::new();
    for (&(i, j, l), w) in &work {
        let kg = w.split.k_groups.len() as u32;
        for gi in 0..w.split.row_groups.len() {
            for ci in 0..w.split.col_groups.len() {
                for kj in 0..kg as usize {
                    let total = (0..steps)
                        .map(|s| {
                            let (b0, b1) = chunk(w.part, ch, s);
                            let r = k_ranges(b1 - b0, kg)[kj];
                            r.1 - r.0
                        })
                        .sum();
                    remaining.insert((i, j, l, gi, ci, kj), total);
                }
            }
        }
    }

    if let Some((fill, cycles)) = &header_fill {
        // One fill64 vertex per tile with the two C headers as its ranges.
        let mut step = Step {
            tile_cycles: Default::default(),
            operation: result_name.clone(),
            phase: format!("zero {value} C headers"),
            tiles: Default::default(),
            estimated_cycles: *cycles,
            exchange: None,
            host_stop: false,
            launch: Launch::Own,
        };
        for t in work.values() {
            std::sync::Arc::make_mut(&mut step.tiles).insert(
                t.tile,
                vec![crate::lower::c_header_fill(fill, [t.c, t.c_partial])],
            );
        }
        sink.steps.push(Pending::Compute(step));
    }
    for s in 0..steps {
        // The exchange: in every K part, A chunks along rows, B chunks
        // along columns. (Chunk 0 may come by the join: no exchange step
        // of its own.)
        let mut transfers = Vec::new();
        for l in (0..kp).filter(|_| !(join0 && s == 0)) {
            let (b0, b1) = chunk(parts[l as usize], ch, s);
            if b1 == b0 {
                continue;
            }
            for i in 0..rp {
                if let Some(from) = &sink.a_from {
                    transfers.extend(chained_a(from, &work, (i, l, cp), (b0, b1), a_block_bytes));
                    continue;
                }
                // (source column tile, its home's offset, first row, rows)
                let mt = work[&(i, 0, l)].rows.1 - work[&(i, 0, l)].rows.0;
                let sources: Vec<(u32, u32, u32, u32)> = if spread {
                    pieces(mt, cp, 1)
                        .into_iter()
                        .zip(0..)
                        .map(|((h0, h1), j)| (j, (s - join0 as u32) * (h1 - h0), h0, h1 - h0))
                        .filter(|src| src.3 > 0)
                        .collect()
                } else {
                    vec![(s % cp, (s / cp) * mt, 0, mt)]
                };
                for (hj, home_row, first, count) in sources {
                    let home = &work[&(i, hj, l)];
                    let rs_a = home.layout.rs_a;
                    let (tile, buffer) = home.a_src.expect("a host A has homes");
                    transfers.push(BufferTransfer {
                        source: BufferRef {
                            tile,
                            buffer,
                            offset: home_row * rs_a,
                        },
                        destinations: a_receivers(&work, (i, l, cp), first * rs_a),
                        bytes: count * rs_a,
                    });
                }
            }
            // B: the chunk from its home, or each piece from its own
            // (`b_home_share`), to every row part of the column.
            let share = b_home_share((parts[l as usize].1 - parts[l as usize].0).div_ceil(ch), rp);
            let chunk_rows = (b1 - b0) * g.k_block();
            for j in (0..cp).filter(|_| !shape.b_resident) {
                // (home row part, first row in its home, chunk rows lo..hi)
                let homes: Vec<(u32, u32, u32, u32)> = if share > 1 {
                    (0..share)
                        .map(|p| {
                            let (lo, hi) = b_piece(chunk_rows, share, p);
                            (s * share + p, 0, lo, hi)
                        })
                        .filter(|h| h.3 > h.2)
                        .collect()
                } else {
                    let kp_rows = work[&(s % rp, j, l)].layout.kp;
                    vec![(s % rp, (s / rp) * kp_rows, 0, chunk_rows)]
                };
                for (hi_part, home_row, lo, hi) in homes {
                    let home = &work[&(hi_part, j, l)];
                    let rs_b = home.layout.rs_b;
                    transfers.push(BufferTransfer {
                        source: BufferRef {
                            tile: home.tile,
                            buffer: home.b_home.expect("B chunks move from their homes"),
                            offset: home_row * rs_b,
                        },
                        destinations: (0..rp)
                            .map(|i| {
                                let t = &work[&(i, j, l)];
                                BufferRef {
                                    tile: t.tile,
                                    buffer: t.b,
                                    offset: lo * rs_b,
                                }
                            })
                            .collect(),
                        bytes: (hi - lo) * rs_b,
                    });
                }
            }
        }
        if !(join0 && s == 0) {
            sink.push_exchange(
                transfers,
                result_name.clone(),
                format!("exchange {value} chunk {s}"),
            );
        }

        // The compute step: every vertex adds its chunk's product.
        let mut step = Step {
            tile_cycles: Default::default(),
            operation: result_name.clone(),
            phase: format!("gemm {value} chunk {s}"),
            tiles: Default::default(),
            estimated_cycles: 0,
            exchange: None,
            host_stop: false,
            launch: Launch::AfterSync,
        };
        for (&(i, j, l), t) in &work {
            let (b0, b1) = chunk(t.part, ch, s);
            if b1 == b0 {
                continue;
            }
            let lay = &t.layout;
            let kg = t.split.k_groups.len() as u32;
            let mut vertices = Vec::new();
            for (gi, &(lr0, lr1)) in t.split.row_groups.iter().enumerate() {
                for (ci, &(cg0, cg1)) in t.split.col_groups.iter().enumerate() {
                    for (kj, (q0, q1)) in k_ranges(b1 - b0, kg).into_iter().enumerate() {
                        if q1 == q0 {
                            continue;
                        }
                        let key = (i, j, l, gi, ci, kj);
                        let left = remaining[&key];
                        let other = |b: usize| if b == t.c { t.c_partial } else { t.c };
                        // (written by the first block, read as partials, zero word)
                        let (ca, cb, zero) = match sum_in.get(&key) {
                            None => {
                                let first = if left % 2 == 1 { t.c } else { t.c_partial };
                                (first, other(first), Some(other(first)))
                            }
                            Some(&loc) => (other(loc), loc, None),
                        };
                        let blocks = q1 - q0;
                        sum_in.insert(key, if blocks % 2 == 1 { ca } else { cb });
                        remaining.insert(key, left - blocks);
                        let c_off = lay.c_row(kj as u32, gi as u32, lr0) + cg0 * 16 * g.out_bytes();
                        let state = GemmVertex {
                            a: StateWord::Addr {
                                buffer: t.a,
                                offset: lr0 * lay.rs_a + q0 * a_block_bytes,
                            },
                            rs_a: lay.rs_a,
                            b: StateWord::Addr {
                                buffer: t.b,
                                offset: if shape.b_resident {
                                    s * lay.b_bytes()
                                } else {
                                    0
                                } + q0 * g.k_block() * lay.rs_b
                                    + cg0 * 16 * g.operand_bytes(),
                            },
                            rs_b: lay.rs_b,
                            ca: StateWord::Addr {
                                buffer: ca,
                                offset: c_off,
                            },
                            cb: StateWord::Addr {
                                buffer: cb,
                                offset: c_off,
                            },
                            rs_c: lay.rs_c,
                            z: match zero {
                                Some(buffer) => StateWord::Addr { buffer, offset: 0 },
                                None => StateWord::Const(0),
                            },
                            m: lr1 - lr0,
                            nkb: blocks,
                            ncb: cg1 - cg0,
                        }
                        .state(&g);
                        vertices.push(Vertex {
                            kernel: std::sync::Arc::new(pg.kernel.clone()),
                            state,
                        });
                    }
                }
            }
            step.estimated_cycles =
                step.estimated_cycles
                    .max(step_compute(pg.costs, &t.split, b1 - b0));
            std::sync::Arc::make_mut(&mut step.tiles).insert(t.tile, vertices);
        }
        sink.steps.push(Pending::Compute(step));
    }
    debug_assert!(remaining.values().all(|&r| r == 0));
    debug_assert!(sum_in
        .iter()
        .all(|(key, &b)| b == work[&(key.0, key.1, key.2)].c));

    // Each tile's reduce vertices, chosen before the reduce-scatter: the
    // vertices that load two partials at once (`reduce_f32` PAIRS=1) read
    // the tile's own piece where its GEMM left it (state word OWN), so
    // the exchange does not copy it into the gather.
    let mut reduces: BTreeMap<(u32, u32, u32), PieceReduce> = if kp > 1 {
        work.iter()
            .map(|(&key, t)| (key, piece_reduce(pg, &g, t, kp, key.2)))
            .collect()
    } else {
        BTreeMap::new()
    };

    // With several K parts: the reduce-scatter of the partials into each
    // tile's dead `c_partial`, its sections after the C header (section p
    // holds K part p's piece; with OWN, the other K parts' pieces in K
    // order from section 1, see [`gather_slot`]).
    let gather_base = crate::gemm::C_HEADER;
    if kp > 1 {
        let mut transfers = Vec::new();
        for (&(i, j, l), t) in &work {
            let lay = &t.layout;
            let mt = t.rows.1 - t.rows.0;
            let piece = pieces(mt, kp, g.row_align)[l as usize];
            let section = gather_section(&g, mt, kp, lay.rs_c);
            let own = reduces[&(i, j, l)].own_group.is_some();
            // Rows of the piece, per row group of every source (rows of one
            // row group are contiguous in `c`).
            for src_l in 0..kp {
                if own && src_l == l {
                    continue;
                }
                let slot = gather_slot(src_l, l, own);
                let src = &work[&(i, j, src_l)];
                for (gi, &(g0, g1)) in src.split.row_groups.iter().enumerate() {
                    let (r0, r1) = (g0.max(piece.0), g1.min(piece.1));
                    if r1 <= r0 {
                        continue;
                    }
                    transfers.push(BufferTransfer {
                        source: BufferRef {
                            tile: src.tile,
                            buffer: src.c,
                            offset: src.layout.c_row(0, gi as u32, r0),
                        },
                        destinations: vec![BufferRef {
                            tile: t.tile,
                            buffer: t.c_partial,
                            offset: gather_base + slot * section + (r0 - piece.0) * lay.rs_c,
                        }],
                        bytes: (r1 - r0) * lay.rs_c,
                    });
                }
            }
        }
        sink.push_exchange(
            transfers,
            result_name.clone(),
            format!("exchange {value} partials (reduce-scatter over {kp} K parts)"),
        );
    }

    // The reduce step: f32 accumulation (sum of the worker K groups or of
    // the K parts' partials, f16, epilogue).
    let mut reduce_step = Step {
        tile_cycles: Default::default(),
        operation: result_name.clone(),
        phase: format!("reduce {result_name}"),
        tiles: Default::default(),
        estimated_cycles: 0,
        exchange: None,
        host_stop: false,
        launch: Launch::FirstOfCall,
    };
    let kind_of = |id| graph.value(id).def == ipu_graph::ValueDef::Param;
    let host_tensor = |id| HostTensor {
        name: graph.value(id).name.clone(),
        ty: graph.value(id).ty.clone(),
        placements: Vec::new(),
    };
    let rb = g.result_bytes();
    let mut results = Vec::new();
    // Transposed results feed an attention only: host placements for
    // checkpoints.json after the loop.
    let mut transposed_results = Vec::new();
    for (&(i, j, l), t) in &work {
        let lay = &t.layout;
        let (r0, r1) = t.rows;
        let (c0, c1) = t.cols;
        let mt = r1 - r0;
        let nct = c1 - c0;
        let width = (c1 * 16).min(n) - c0 * 16;
        // The rows this tile delivers, where: (first local row, row count,
        // buffer, offset of the first row, row stride) per run of rows.
        let mut delivered: Vec<(u32, u32, usize, u32, u32)> = Vec::new();
        if kp > 1 {
            let reduce = pg
                .reduce_kernel
                .clone()
                .expect("several K parts come with a reduce kernel");
            let piece = pieces(mt, kp, g.row_align)[l as usize];
            let section = gather_section(&g, mt, kp, lay.rs_c);
            let rows_here = piece.1 - piece.0;
            if rows_here > 0 {
                // The rows, or (`transposed_result`, `reduce_f32` TR=1) the
                // columns, each of the piece's rows padded with zeros to 8
                // bytes (the layout `transpose_f16` would make).
                let rs_t = (rows_here * 2).div_ceil(8) * 8;
                let (bytes, zero, dst_stride) = if pg.transposed_result {
                    let zero: Vec<(u32, u32)> = (0..nct * 16)
                        .map(|c| (c * rs_t + rows_here * 2, (c + 1) * rs_t))
                        .filter(|z| z.0 < z.1)
                        .collect();
                    (nct * 16 * rs_t, zero, rs_t)
                } else {
                    (rows_here * lay.rs_d(), vec![], lay.rs_d())
                };
                let bufs = sink
                    .buffers
                    .get_mut(&t.tile)
                    .expect("tiles below tile_count");
                bufs.push(BufferSpec {
                    name: format!(
                        "{value}.{}",
                        if pg.transposed_result {
                            "d_transposed"
                        } else {
                            "d"
                        }
                    ),
                    bytes,
                    align: 16,
                    region: RegionReq::Standard,
                    exclusive_element: false,
                    zero,
                    category: "gemm_result".into(),
                    scratch: None,
                    lifetime: None,
                    kernel_segment: None,
                });
                let d = bufs.len() - 1;
                let mut vertices = Vec::new();
                let PieceReduce {
                    slowest,
                    parts,
                    kernel,
                    own_group,
                } = reduces
                    .remove(&(i, j, l))
                    .expect("every tile's reduce chosen above");
                // PAIRS=1 and OWN=1 (the only kernels `piece_reduce` picks
                // instead of the planned one) read a tenth word.
                let own_word_present = kernel.is_some();
                let kernel = kernel.unwrap_or_else(|| reduce.clone());
                for ((q0, q1), (cb0, cb1)) in parts {
                    // That word: the own piece's address in `c` (its rows
                    // in one row group, `rs_c` apart), or 0 when the
                    // gather holds it too.
                    let own_word = own_group.map(|gi| StateWord::Addr {
                        buffer: t.c,
                        offset: lay.c_row(0, gi, piece.0 + q0) + cb0 * 16 * g.out_bytes(),
                    });
                    vertices.push(Vertex {
                        kernel: std::sync::Arc::new(kernel.clone()),
                        state: vec![
                            StateWord::Addr {
                                buffer: t.c_partial,
                                offset: gather_base + q0 * lay.rs_c + cb0 * 16 * g.out_bytes(),
                            },
                            StateWord::Const(section),
                            StateWord::Const(kp),
                            StateWord::Const(lay.rs_c),
                            StateWord::Addr {
                                buffer: d,
                                offset: if pg.transposed_result {
                                    cb0 * 16 * rs_t + q0 * 2
                                } else {
                                    q0 * lay.rs_d() + cb0 * 16 * rb
                                },
                            },
                            StateWord::Const(dst_stride),
                            StateWord::Const(q1 - q0),
                            StateWord::Const(4 * (cb1 - cb0)),
                            match t.bias {
                                Some(buffer) => StateWord::Addr {
                                    buffer,
                                    offset: cb0 * g.bias_block_bytes(),
                                },
                                None => StateWord::Const(0),
                            },
                        ]
                        .into_iter()
                        .chain(own_word_present.then(|| own_word.unwrap_or(StateWord::Const(0))))
                        .collect(),
                    });
                }
                let cycles = slowest + Launch::AfterSync.cycles(vertices.len() as u64);
                reduce_step.launch = Launch::AfterSync;
                reduce_step.put_tile(t.tile, vertices, cycles);
                if pg.transposed_result {
                    transposed_results.push((
                        t.tile,
                        GroupResult {
                            buffer: d,
                            row_stride: rs_t,
                            rows: (r0 + piece.0, r0 + piece.1),
                            col0: c0 * 16,
                            width,
                            transposed: true,
                        },
                    ));
                } else {
                    delivered.push((piece.0, rows_here, d, 0, lay.rs_d()));
                }
            }
        } else if g.needs_reduce(t.split.k_groups.len()) {
            let reduce = pg
                .reduce_kernel
                .clone()
                .expect("f32 accumulation comes with a reduce kernel");
            let bufs = sink
                .buffers
                .get_mut(&t.tile)
                .expect("tiles below tile_count");
            bufs.push(BufferSpec {
                name: format!("{value}.d"),
                bytes: lay.d_bytes(),
                align: 16,
                region: RegionReq::Standard,
                exclusive_element: false,
                zero: vec![],
                category: "gemm_result".into(),
                scratch: None,
                lifetime: None,
                kernel_segment: None,
            });
            let d = bufs.len() - 1;
            let reduces = crate::lower::reduce_vertices(
                &reduce,
                &g,
                (lay, &t.split),
                (t.c, d),
                crate::lower::ReduceDst::Rows,
                t.bias,
            );
            let (_, reduce_cycles) = pg.costs.split_cycles(&gc, &t.split);
            let cycles = reduce_cycles + Launch::AfterCompute.cycles(reduces.len() as u64);
            reduce_step.launch = Launch::AfterCompute;
            reduce_step.put_tile(t.tile, reduces, cycles);
            delivered.push((0, mt, d, 0, lay.rs_d()));
        } else {
            for (gi, &(lr0, lr1)) in t.split.row_groups.iter().enumerate() {
                delivered.push((lr0, lr1 - lr0, t.c, lay.c_row(0, gi as u32, lr0), lay.rs_c));
            }
        }

        // Host placements: A rows into the A homes (input or param), B rows
        // into the B homes (initialize), the bias, the result rows.
        let part_steps = (t.part.1 - t.part.0).div_ceil(ch);
        if let (Some(a_id), Some(a_home)) = (a_host, t.a_home) {
            let a_t = (if kind_of(a_id) {
                &mut *sink.params
            } else {
                &mut *sink.inputs
            })
            .entry(graph.value(a_id).name.clone())
            .or_insert_with(|| host_tensor(a_id));
            // Spread homes hold a share of every chunk's rows, else whole
            // chunks s = j (mod cp).
            let ((h0, h1), home_chunks): ((u32, u32), Vec<u32>) = if spread {
                (
                    pieces(mt, cp, 1)[j as usize],
                    (join0 as u32..part_steps).collect(),
                )
            } else {
                ((0, mt), (j..part_steps).step_by(cp as usize).collect())
            };
            for (idx, s) in home_chunks.into_iter().enumerate() {
                let (b0, b1) = chunk(t.part, ch, s);
                let bytes = ((b1 * kb).min(k) - b0 * kb) * eb;
                for r in h0..h1 {
                    push_coalesced(
                        &mut a_t.placements,
                        HostPlacement {
                            tile: t.tile,
                            buffer: a_home,
                            buffer_offset: (idx as u32 * (h1 - h0) + r - h0) * lay.rs_a,
                            host_offset: ((r0 + r) as u64 * k as u64 + (b0 * kb) as u64)
                                * eb as u64,
                            bytes,
                        },
                    );
                }
            }
        }
        // Chunk 0 straight into the receive buffer, by the join (every
        // tile of the row part, also those of GEMMs sharing another's homes).
        if let (true, Some(a_id)) = (join0, a_host) {
            let a_t = sink
                .inputs
                .entry(graph.value(a_id).name.clone())
                .or_insert_with(|| host_tensor(a_id));
            let (b0, b1) = chunk(t.part, ch, 0);
            for r in 0..mt {
                push_coalesced(
                    &mut a_t.placements,
                    HostPlacement {
                        tile: t.tile,
                        buffer: t.a,
                        buffer_offset: r * lay.rs_a,
                        host_offset: ((r0 + r) as u64 * k as u64 + (b0 * kb) as u64) * eb as u64,
                        bytes: (b1 - b0) * kb * eb,
                    },
                );
            }
        }
        let b_t = (if kind_of(b_id) {
            &mut *sink.params
        } else {
            &mut *sink.inputs
        })
        .entry(graph.value(b_id).name.clone())
        .or_insert_with(|| host_tensor(b_id));
        // Resident B: every chunk of the part, at its index; else the
        // chunks this tile is home to, or its piece of one (K rows
        // `lo..hi` of the chunk).
        let piece = t.b_home.and_then(|_| b_home_piece(t.part, ch, kb, rp, i));
        let whole = |s: u32| {
            let (b0, b1) = chunk(t.part, ch, s);
            (s, 0, (b1 - b0) * kb)
        };
        let (b_buffer, b_chunks): (usize, Vec<(u32, u32, u32)>) = match (t.b_home, piece) {
            (Some(home), Some(piece)) => (home, vec![piece]),
            (Some(home), None) => (
                home,
                (i..part_steps).step_by(rp as usize).map(whole).collect(),
            ),
            (None, _) => (t.b, (0..part_steps).map(whole).collect()),
        };
        for (idx, (s, lo, hi)) in b_chunks.into_iter().enumerate() {
            let b0 = chunk(t.part, ch, s).0;
            let first = b0 * kb + lo;
            for kk in first..(b0 * kb + hi).min(k) {
                push_coalesced(
                    &mut b_t.placements,
                    HostPlacement {
                        tile: t.tile,
                        buffer: b_buffer,
                        buffer_offset: idx as u32 * lay.b_bytes() + (kk - first) * lay.rs_b,
                        host_offset: (kk as u64 * n as u64 + c0 as u64 * 16) * eb as u64,
                        bytes: width * eb,
                    },
                );
            }
        }
        if let (Some(bias), Some(b)) = (pg.group.bias, t.bias) {
            let bt = (if kind_of(bias) {
                &mut *sink.params
            } else {
                &mut *sink.inputs
            })
            .entry(graph.value(bias).name.clone())
            .or_insert_with(|| host_tensor(bias));
            bt.placements.push(HostPlacement {
                tile: t.tile,
                buffer: b,
                buffer_offset: 0,
                host_offset: c0 as u64 * g.bias_block_bytes() as u64,
                bytes: width * g.result_bytes(),
            });
        }
        if pg.transposed_result {
            continue;
        }
        let target = if graph.outputs().contains(&result_value) {
            &mut *sink.outputs
        } else {
            &mut *sink.resident
        };
        let c_t = target
            .entry(result_name.clone())
            .or_insert_with(|| host_tensor(result_value));
        for &(first, count, buffer, offset, stride) in &delivered {
            // Reduced rows sit in `d` with the stride of whole column
            // blocks, which is what a consumer's A transfers expect.
            if buffer != t.c && offset == 0 && stride == nct * 16 * rb {
                results.push((
                    t.tile,
                    GroupResult {
                        buffer,
                        row_stride: stride,
                        rows: (r0 + first, r0 + first + count),
                        col0: c0 * 16,
                        width,
                        transposed: false,
                    },
                ));
            }
            for r in 0..count {
                push_coalesced(
                    &mut c_t.placements,
                    HostPlacement {
                        tile: t.tile,
                        buffer,
                        buffer_offset: offset + r * stride,
                        host_offset: ((r0 + first + r) as u64 * n as u64 + c0 as u64 * 16)
                            * rb as u64,
                        bytes: width * rb,
                    },
                );
            }
        }
    }
    if !reduce_step.tiles.is_empty() {
        sink.steps.push(Pending::Compute(reduce_step));
    }
    // Transposed results feed an attention only (never an output); the
    // package lists them transposed for diagnosis (checkpoints.json).
    if !transposed_results.is_empty() {
        let rows = graph.ty(result_value).shape.dims()[0] as u32;
        let c_t = sink
            .resident
            .entry(result_name.clone())
            .or_insert_with(|| host_tensor(result_value));
        for (tile, r) in &transposed_results {
            c_t.placements
                .extend(crate::lower::transposed_result_placements(*tile, r, rows));
        }
    }
    results.extend(transposed_results);
    Ok(results)
}

/// The `a` receive buffers of row part `i`'s column tiles in K part `l`,
/// at `offset`: where a chunk step multicasts a piece of A.
fn a_receivers(
    work: &BTreeMap<(u32, u32, u32), TileWork>,
    (i, l, cp): (u32, u32, u32),
    offset: u32,
) -> Vec<BufferRef> {
    (0..cp)
        .map(|j| {
            let t = &work[&(i, j, l)];
            BufferRef {
                tile: t.tile,
                buffer: t.a,
                offset,
            }
        })
        .collect()
}

/// The transfers that bring chunk `(b0, b1)` (K blocks) of row part `i`'s
/// A rows, in K part `l`, from an earlier GEMM's result tiles: every row's
/// segment of each producer tile whose columns meet the chunk, multicast to
/// the `cp` tiles of the row part (at the segment's place in their A
/// chunk buffer). Producer results are whole column blocks (padding
/// columns zero), so segments are block-aligned; a block is
/// `block_bytes` of a row (16 f16 or 16 f32: the producer's result type
/// is the consumer's operand type).
fn chained_a(
    from: &[(u32, GroupResult)],
    work: &BTreeMap<(u32, u32, u32), TileWork>,
    (i, l, cp): (u32, u32, u32),
    (b0, b1): (u32, u32),
    block_bytes: u32,
) -> Vec<BufferTransfer> {
    let first = &work[&(i, 0, l)];
    let (r0, r1) = first.rows;
    let rs_a = first.layout.rs_a;
    let mut out = Vec::new();
    for &(tile, res) in from {
        let blocks = res.row_stride / block_bytes;
        let (p0, p1) = (res.col0 / 16, res.col0 / 16 + blocks);
        let (c_lo, c_hi) = (p0.max(b0), p1.min(b1));
        if c_hi <= c_lo {
            continue;
        }
        for r in res.rows.0.max(r0)..res.rows.1.min(r1) {
            out.push(BufferTransfer {
                source: BufferRef {
                    tile,
                    buffer: res.buffer,
                    offset: (r - res.rows.0) * res.row_stride + (c_lo - p0) * block_bytes,
                },
                destinations: a_receivers(
                    work,
                    (i, l, cp),
                    (r - r0) * rs_a + (c_lo - b0) * block_bytes,
                ),
                bytes: (c_hi - c_lo) * block_bytes,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment's join that moves the weights delivers a streamed plan's
    /// resident chunks of B beside its A homes: the ViT block's Q
    /// projection on 13 x 6 x 6 tiles (one chunk step of 12 K blocks)
    /// receives 192 x 192 f16 of `wq` per tile, 18,432 cycles.
    #[test]
    fn a_join_that_moves_weights_weighs_resident_chunks() {
        use crate::gemm::FormulaCost;
        let g = GemmGeometry {
            m: 729,
            k: 1152,
            n: 1152,
            acc32: false,
            f16_result: true,
            row_align: 1,
            fp8_scale: None,
            f32_operands: false,
            reduce_f16: true,
            max_chain_blocks: 16,
            f32_reduce_step: false,
        };
        let mut costs = GemmCosts {
            a_copied: true,
            a_joined: true,
            ..GemmCosts::new(
                FormulaCost::new("6 * (22 + NCB * (14 + NKB * (4 * M + 43)))".into()),
                Some(FormulaCost::new(
                    "6 * (29 + ROWS * (2 + QUADS * (P + 1)))".into(),
                )),
            )
        };
        let exchange = |costs: &mut GemmCosts, b_resident: bool| {
            let p = evaluate(
                &g,
                (13, 6, 6),
                (12, b_resident),
                (true, false),
                Fit::Alone,
                costs,
                &mut Memo::new(),
            )
            .expect("the plan fits");
            p.stream.unwrap().exchange_cycles
        };
        let (resident, homes) = (exchange(&mut costs, true), exchange(&mut costs, false));
        costs.b_joined = true;
        assert_eq!(exchange(&mut costs, true) - resident, 192 * 192 * 2 / 4);
        // B homes are region-0 buffers, which the join leaves in place.
        assert_eq!(exchange(&mut costs, false), homes);
    }

    /// The search shares worker splits and reduce costs between its
    /// threads and keeps partitions and shard costs per thread; every
    /// candidate must equal [`evaluate`] of its shape with a fresh memo
    /// (resident B and homes, several fits, K parts and chunk sizes).
    #[test]
    fn memoised_candidates_equal_fresh_evaluations() {
        use crate::gemm::FormulaCost;
        let g = GemmGeometry {
            m: 97,
            k: 512,
            n: 300,
            acc32: false,
            f16_result: true,
            row_align: 2,
            fp8_scale: None,
            f32_operands: false,
            reduce_f16: true,
            max_chain_blocks: 16,
            f32_reduce_step: false,
        };
        let costs = GemmCosts::new(
            FormulaCost::new("6 * (22 + NCB * (14 + NKB * (4 * M + 43)))".into()),
            Some(FormulaCost::new(
                "6 * (29 + ROWS * (2 + QUADS * (P + 1)))".into(),
            )),
        );
        let budget = SearchBudget::default();
        for fit in [
            Fit::Alone,
            Fit::Phased {
                persistent: 64 * 1024,
            },
        ] {
            let (plans, generated) = candidates(&g, 96, (true, true), 2, fit, &costs, &budget);
            assert!(!plans.is_empty() && plans.len() <= 2 * generated, "{fit:?}");
            let mut fresh = Vec::new();
            for &kp in K_PARTS.iter().filter(|&&k| k <= g.nkb() && k >= 2) {
                let grid = 96 / kp;
                let least = (grid / 2).max(1);
                for rp in 1..=g.m.min(grid) {
                    for cp in least.div_ceil(rp).max(1)..=g.ncb().min(grid / rp) {
                        for &ch in CHUNK_BLOCKS.iter().filter(|&&c| c <= g.nkb()) {
                            for b_resident in [false, true] {
                                fresh.extend(evaluate(
                                    &g,
                                    (rp, cp, kp),
                                    (ch, b_resident),
                                    (true, true),
                                    fit,
                                    &mut costs.clone(),
                                    &mut Memo::new(),
                                ));
                            }
                        }
                    }
                }
            }
            assert_eq!(plans, fresh, "{fit:?}");
        }
    }

    /// Pieces cover the block's rows once, in order, with bounds on the
    /// alignment (a projection's pieces are transposed in row pairs), and
    /// the largest is what the gather sections hold.
    #[test]
    fn pieces_cover_rows_once_on_aligned_bounds() {
        for rows in [1, 2, 7, 10, 57, 122] {
            for kp in [2, 3, 4, 6, 12, 16] {
                for align in [1, 2] {
                    let p = pieces(rows, kp, align);
                    assert_eq!(p.len(), kp as usize);
                    assert_eq!(p[0].0, 0);
                    assert_eq!(p[kp as usize - 1].1, rows);
                    for w in p.windows(2) {
                        assert_eq!(w[0].1, w[1].0, "{rows} rows, {kp} parts: {p:?}");
                    }
                    for &(a, b) in &p {
                        assert!(a <= b);
                        assert!(
                            a % align == 0 || a == rows,
                            "{rows} rows, {kp} parts, align {align}: {p:?}"
                        );
                    }
                    let largest = p.iter().map(|x| x.1 - x.0).max().unwrap();
                    assert_eq!(piece_rows(rows, kp, align), largest);
                    assert!(largest <= rows.div_ceil(kp) + align, "{p:?}");
                }
            }
        }
        // Align 1 keeps the old cut (the MLP's pieces did not move).
        assert_eq!(pieces(10, 4, 1), vec![(0, 2), (2, 5), (5, 7), (7, 10)]);
    }

    /// Spread homes: the column tiles' shares (`pieces` without
    /// alignment) cover every row of a row part once, in order, none more
    /// than a row longer than another (the planner sizes every home by the
    /// largest share), also with fewer rows than column tiles.
    #[test]
    fn home_shares_cover_each_row_once() {
        for mt in [1, 2, 5, 11, 12, 13, 91, 146, 372] {
            for cp in [1, 2, 5, 12, 23, 49] {
                let shares = pieces(mt, cp, 1);
                assert_eq!(shares.len(), cp as usize, "{mt} rows over {cp}");
                assert_eq!(shares[0].0, 0, "{mt} rows over {cp}");
                assert_eq!(shares[cp as usize - 1].1, mt, "{mt} rows over {cp}");
                for w in shares.windows(2) {
                    assert_eq!(w[0].1, w[1].0, "{mt} rows over {cp}: contiguous");
                }
                for (a, b) in &shares {
                    assert!(b - a <= mt.div_ceil(cp), "{mt} rows over {cp}: {a}..{b}");
                }
            }
        }
    }

    /// B homes: every K row of every chunk of a part has exactly one home
    /// row part, pieces when chunks are fewer than row parts (none longer
    /// than the planner's bound, `b_rows.div_ceil(share)`), whole chunks
    /// `s = i (mod rp)` otherwise.
    #[test]
    fn b_homes_hold_each_k_row_once() {
        let kb = 16;
        for (part, ch) in [
            ((0u32, 4u32), 1u32),
            ((0, 80), 16),
            ((3, 80), 16),
            ((0, 72), 3),
            ((0, 256), 8),
            ((0, 5), 4),
        ] {
            let part_steps = (part.1 - part.0).div_ceil(ch);
            for rp in [1, 2, 3, 7, 23, 49, 92] {
                let share = b_home_share(part_steps, rp);
                let mut held = vec![0u32; ((part.1 - part.0) * kb) as usize];
                for i in 0..rp {
                    let chunks: Vec<(u32, u32, u32)> = match b_home_piece(part, ch, kb, rp, i) {
                        Some(piece) => vec![piece],
                        None if share > 1 => vec![],
                        None => (i..part_steps)
                            .step_by(rp as usize)
                            .map(|s| (s, 0, u32::MAX))
                            .collect(),
                    };
                    for (s, lo, hi) in chunks {
                        let (b0, b1) = chunk(part, ch, s);
                        let rows = (b1 - b0) * kb;
                        assert!(
                            hi.min(rows) - lo <= (ch * kb).div_ceil(share),
                            "{part:?} {ch} {rp}"
                        );
                        for r in lo..hi.min(rows) {
                            held[((b0 - part.0) * kb + r) as usize] += 1;
                        }
                    }
                }
                assert!(
                    held.iter().all(|&n| n == 1),
                    "{part:?} chunks of {ch} on {rp} row parts: {held:?}"
                );
            }
        }
    }

    /// The reduce vertices of a piece cover each (row, column block) once,
    /// one per worker at most, and a piece of few rows splits its columns.
    #[test]
    fn reduce_parts_cover_the_piece_once() {
        for (rows, cbs, align) in [1, 2, 5, 6, 10, 14, 61]
            .into_iter()
            .flat_map(|r| [1, 3, 8, 12].map(|c| (r, c)))
            .flat_map(|(r, c)| [1, 4].map(|a| (r, c, a)))
        {
            {
                let parts = reduce_parts(rows, cbs, 2, None, align).1;
                assert!(parts.len() as u32 <= ipu_arch::WORKER_CONTEXTS);
                assert!(
                    parts.iter().all(|p| p.0 .0 % align == 0),
                    "{rows} x {cbs}, align {align}: {parts:?}"
                );
                let mut seen = vec![0u32; (rows * cbs) as usize];
                for ((r0, r1), (c0, c1)) in parts {
                    for r in r0..r1 {
                        for c in c0..c1 {
                            seen[(r * cbs + c) as usize] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{rows} x {cbs}");
            }
        }
        // 10 rows of 12 column blocks: 2 x 3 vertices of 5 x 4, not 6
        // row ranges of up to 2 x 12.
        let parts = reduce_parts(10, 12, 2, None, 1).1;
        let largest = parts
            .iter()
            .map(|(r, c)| (r.1 - r.0) * (c.1 - c.0))
            .max()
            .unwrap();
        assert!(largest < 2 * 12, "{parts:?}");
    }

    /// Merged exchange steps send bytes with one source once, to every
    /// destination; lists of different shapes run one after the other.
    #[test]
    fn merge_multicasts_shared_sources() {
        let at = |tile, buffer| BufferRef {
            tile,
            buffer,
            offset: 0,
        };
        let x = |src, dst| Pending::Exchange {
            transfers: vec![BufferTransfer {
                source: src,
                destinations: vec![dst],
                bytes: 64,
            }],
            operation: "g".into(),
            phase: "p".into(),
        };
        let compute = || {
            Pending::Compute(Step {
                tile_cycles: Default::default(),
                operation: "g".into(),
                phase: "c".into(),
                tiles: Default::default(),
                estimated_cycles: 0,
                exchange: None,
                host_stop: false,
                launch: Launch::Own,
            })
        };
        let merged = merge(vec![
            vec![x(at(0, 0), at(1, 0)), compute()],
            vec![x(at(0, 0), at(2, 0)), compute()],
            vec![x(at(3, 0), at(4, 0)), compute()],
        ]);
        assert_eq!(merged.len(), 4, "one exchange, three compute steps");
        let Pending::Exchange { transfers, .. } = &merged[0] else {
            panic!("the exchange comes first");
        };
        assert_eq!(transfers.len(), 2);
        assert_eq!(transfers[0].destinations, vec![at(1, 0), at(2, 0)]);
        // Different shapes: concatenated.
        let apart = merge(vec![vec![x(at(0, 0), at(1, 0))], vec![compute()]]);
        assert_eq!(apart.len(), 2);
    }
}
