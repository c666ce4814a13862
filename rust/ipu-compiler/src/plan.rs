//! Phase `plan`: candidate plans per operation, a cost model on ipu-arch's
//! numbers and the kernels' declared cycle formulas, memory feasibility, and
//! a Pareto beam search over (cycles, peak bytes) that keeps finalists.
//!
//! A GEMM plan partitions the M rows into `row_parts` and the column blocks
//! into `col_parts`; every (row part, column part) pair is one tile's shard,
//! and K stays whole on the tile (no reduction exchange). The estimate of a
//! plan is the cycles of a "run" call: host writes of the shard operands
//! (inputs are multicast to every tile of their row part), the host sync,
//! the slowest tile's compute (the kernel formula for each worker's vertex,
//! plus the supervisor's launches, and the reduce step when the GEMM
//! accumulates in f32) and the host reads of the results. Plans are ranked
//! by device cycles first: host link cycles are reported, not optimised.

use crate::gemm::{
    ranges, shard_sizes, GemmCosts, GemmGeometry, PartSizes, Partitions, Parts, ShardLayout,
    SplitMemo,
};
use crate::lower::Launch;
use ipu_arch::{host_transfer_cycles, CLOCK_HZ_C600, SYNC_CYCLES};

/// Search limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchBudget {
    /// Plans kept per operation after the Pareto filter (the beam).
    pub beam_width: usize,
    /// Plans logged and reported as finalists.
    pub finalists: usize,
    /// Most candidates generated per operation.
    pub max_candidates: usize,
    /// Streamed plans' B: `None` tries chunks moved from homes and B
    /// resident on every tile; `Some(resident)` only that kind.
    pub stream_b_resident: Option<bool>,
}

impl Default for SearchBudget {
    fn default() -> Self {
        SearchBudget {
            beam_width: 64,
            finalists: 16,
            max_candidates: 200_000,
            stream_b_resident: None,
        }
    }
}

/// The cost model's view of one plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Estimate {
    /// Cycles of the slowest tile's compute (vertex formulas + launches),
    /// the reduce step included.
    pub compute_cycles: u64,
    /// The part of `compute_cycles` spent in the reduce step (sum of K-group
    /// partials and/or f32 -> f16 conversion).
    pub reduce_cycles: u64,
    /// The part of `compute_cycles` that copies A from where the program
    /// holds it once to the tiles that read it (`GemmCosts::a_copied`): an
    /// exchange step of its own, which the join schedules and estimates,
    /// counted here so that plans compare with it.
    pub copy_cycles: u64,
    /// The part of `compute_cycles` that transposes the result on its
    /// tiles (`GemmCosts::transpose`): a compute step of its own, which the
    /// attention's lowering estimates.
    pub transpose_cycles: u64,
    /// Host link cycles of the run call's inputs (every placed copy).
    pub host_in_cycles: u64,
    /// Host link cycles of the outputs.
    pub host_out_cycles: u64,
    /// Host link cycles of the parameters (the initialize call).
    pub params_cycles: u64,
    /// The run call: sync + host in + compute + host out.
    pub total_cycles: u64,
    /// Largest standard-memory (region 0) use on a tile, code excluded.
    pub peak_standard_bytes: u64,
    /// Largest interleaved-memory (region 1) use on a tile, with element rounding.
    pub peak_interleaved_bytes: u64,
    pub active_tiles: u32,
}

/// One GEMM plan.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GemmPlan {
    pub row_parts: u32,
    pub col_parts: u32,
    pub estimate: Estimate,
    /// `Some`: K streams through the tiles in chunks, one exchange step and
    /// one accumulating compute step per chunk (crate::stream); `None`: K
    /// is whole on every tile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamShape>,
}

/// How a streamed plan walks K.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StreamShape {
    /// K blocks (of 16) per chunk; the last chunk may be shorter.
    pub chunk_blocks: u32,
    /// Chunks, i.e. exchange + compute step pairs.
    pub steps: u32,
    /// Tiles that split K and sum their partials (reduce-scatter by rows).
    pub k_parts: u32,
    /// Estimated cycles of all the exchange steps (syncs included).
    pub exchange_cycles: u64,
    /// Every tile keeps all of its B chunks (its K part's rows of its
    /// columns) resident from load time, so the chunk steps move only A.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub b_resident: bool,
    /// Region 1 as another GEMM on the same tiles sees it
    /// ([`crate::gemm::GemmCosts::joint`]): exclusive bytes in whole
    /// elements, other persistent bytes, the largest scratch phase (homes
    /// that spill into region 1 included).
    #[serde(skip)]
    pub joint_r1: (u64, u64, u64),
}

impl GemmPlan {
    /// Row ranges of the row parts.
    pub fn row_ranges(&self, g: &GemmGeometry) -> Vec<(u32, u32)> {
        g.row_ranges(self.row_parts)
    }
    /// Column-block ranges of the column parts.
    pub fn col_ranges(&self, g: &GemmGeometry) -> Vec<(u32, u32)> {
        ranges(g.ncb(), self.col_parts)
    }
}

/// Supervisor cycles around the vertices of a call's first compute step
/// under the supervisor runtime (device/supervisor.S): the dispatch of the
/// command and the end of the call (about 16 bundles), then one state load
/// and one `run` (2 issue slots) per vertex. Each supervisor bundle takes 6
/// cycles. Measured by tests/supervisor_runtime.rs.
pub fn supervisor_cycles(vertices: u64) -> u64 {
    6 * (13 + 3 * vertices)
}

/// Region-0 bytes a plan may use for buffers; the rest is left for code,
/// vertex states and the command word.
pub const STANDARD_BUDGET: u64 =
    (ipu_arch::REGION0_END - ipu_arch::REGION0_BASE) as u64 - 24 * 1024;

/// Cost and memory of one (row parts, col parts) candidate; `None` when a
/// shard does not fit tile memory within `costs.memory_budget` bytes.
pub fn evaluate(
    g: &GemmGeometry,
    row_parts: u32,
    col_parts: u32,
    costs: &mut GemmCosts,
) -> Option<GemmPlan> {
    let rows = g.row_sizes(row_parts);
    let cols = Parts::new(ranges(g.ncb(), col_parts));
    evaluate_with(
        g,
        (row_parts, col_parts, &rows, &cols),
        costs,
        &SplitMemo::default(),
    )
}

/// [`evaluate`] of `row_parts` and `col_parts` that
/// [`GemmGeometry::row_ranges`] and [`ranges`] cut into `rows` and
/// `cols`, with a search's memo of worker splits (`costs` unchanged while
/// `memo` lives).
fn evaluate_with(
    g: &GemmGeometry,
    (row_parts, col_parts, rows, cols): (u32, u32, &PartSizes, &Parts),
    costs: &mut GemmCosts,
    memo: &SplitMemo,
) -> Option<GemmPlan> {
    // Aligned row boundaries can leave a part empty: that plan is another
    // plan's duplicate with a wrong part count, so it is no candidate.
    if rows.count != row_parts {
        return None;
    }
    let mut compute = 0u64;
    let mut cast_part = 0u64;
    let mut transpose_part = 0u64;
    let mut peak_r1 = 0u64;
    let mut peak_r0 = 0u64;
    for (mt, nct) in shard_sizes(rows, &cols.sizes) {
        let (split, gemm, reduce) = memo.best_split_with(g, mt, nct, costs, u32::MAX)?;
        let mut tile = gemm + supervisor_cycles(split.vertices() as u64);
        if let Some(t) = costs.transpose.as_mut() {
            let width = (nct * 16).min(g.n);
            let (vertices, slowest) = crate::attention::transpose_shard_slowest(t, mt, width);
            let c = slowest + supervisor_cycles(vertices);
            tile += c;
            transpose_part = transpose_part.max(c);
        }
        let layout = ShardLayout::new(g, mt, nct, &split);
        if g.needs_reduce(split.k_groups.len()) {
            // The reduce step follows the GEMM's step on the tile
            // (`lower::Launch::AfterCompute`).
            let c = reduce + Launch::AfterCompute.cycles(split.reduce_vertices() as u64);
            tile += c;
            cast_part = cast_part.max(c);
            if !costs.feeds_gemm {
                if layout.d_bytes() as u64 > STANDARD_BUDGET {
                    return None;
                }
                peak_r0 = peak_r0.max(layout.d_bytes() as u64);
            }
        }
        compute = compute.max(tile);
        // best_split only returns splits within the budget.
        let r1 = costs.region1_bytes(&layout)?;
        peak_r1 = peak_r1.max(r1);
    }
    // An A held once and copied by exchange (`a_copied`) reaches every
    // column part's tiles in a step of its own: a sync, then each tile
    // receives its rows (the largest row part bounds it, 4 bytes a cycle).
    // With one column part the rows are held once, where they are read.
    // In a segment's join every plan receives its rows (`a_joined`).
    // A copy in a step that runs anyway (`a_copy_shared`) likewise.
    let copied = costs.a_copied && (cols.sizes.count > 1 || costs.a_joined || costs.a_copy_shared);
    // A join that moves the weights too (`b_joined`) delivers each tile's
    // columns of B in the same step as its rows of A.
    let a_bytes = if copied {
        let widest = rows.lengths.last().copied().unwrap_or(0) as u64;
        widest * g.k as u64 * g.operand_bytes() as u64
    } else {
        0
    };
    // A host input B held once and copied reaches every row part's tiles
    // in the same step (batched GEMMs of two inputs).
    let b_copied = costs.b_copied && rows.count > 1;
    let b_bytes = if costs.b_joined || b_copied {
        let widest = cols
            .ranges
            .iter()
            .map(|&(c0, c1)| (c1 * 16).min(g.n) - c0 * 16)
            .max()
            .unwrap_or(0) as u64;
        widest * g.k as u64 * g.operand_bytes() as u64
    } else {
        0
    };
    let copy = if copied || costs.b_joined || b_copied {
        let sync = if costs.a_joined || costs.b_joined || (copied && costs.a_copy_shared) {
            0
        } else {
            SYNC_CYCLES
        };
        sync + (a_bytes + b_bytes).div_ceil(4)
    } else {
        0
    };
    if copied && costs.a_copy_shared && costs.copy_bound.is_some_and(|b| copy > b) {
        return None;
    }
    compute += copy;
    // Host A rows go to every tile of the row part (once, when they are
    // copied by exchange); B columns to every row part. (The ranges cover
    // the rows and columns once each.)
    let in_bytes = if costs.owns_a {
        let copies = if copied { 1 } else { cols.sizes.count as u64 };
        g.m as u64 * g.k as u64 * g.operand_bytes() as u64 * copies
    } else {
        0
    };
    let param_bytes = g.n as u64 * g.k as u64 * g.operand_bytes() as u64 * rows.count as u64;
    let out_bytes = g.m as u64 * g.n as u64 * g.result_bytes() as u64;
    let host_in = host_transfer_cycles(in_bytes, CLOCK_HZ_C600);
    let host_out = host_transfer_cycles(out_bytes, CLOCK_HZ_C600);
    Some(GemmPlan {
        row_parts,
        col_parts,
        stream: None,
        estimate: Estimate {
            compute_cycles: compute,
            reduce_cycles: cast_part,
            copy_cycles: copy,
            transpose_cycles: transpose_part,
            host_in_cycles: host_in,
            host_out_cycles: host_out,
            params_cycles: host_transfer_cycles(param_bytes, CLOCK_HZ_C600),
            total_cycles: SYNC_CYCLES + host_in + compute + host_out,
            peak_standard_bytes: peak_r0,
            peak_interleaved_bytes: peak_r1,
            active_tiles: rows.count * cols.sizes.count,
        },
    })
}

/// Every feasible (row parts x column parts) candidate within `tiles`, at
/// most `budget.max_candidates` of them generated; returns the feasible
/// plans and the count generated.
fn candidates(
    g: &GemmGeometry,
    tiles: u32,
    costs: &mut GemmCosts,
    budget: &SearchBudget,
) -> (Vec<GemmPlan>, usize) {
    use rayon::prelude::*;
    // The shapes in search order, up to the budget; evaluated in parallel
    // row-part ranges, each with its own copy of the formula memos (they
    // only cache pure results), and gathered in that order, so the result
    // does not depend on the thread count.
    let mut shapes: Vec<(u32, u32)> = Vec::new();
    'outer: for rp in 1..=g.m.min(tiles) {
        for cp in 1..=g.ncb().min(tiles / rp) {
            if shapes.len() >= budget.max_candidates {
                break 'outer;
            }
            shapes.push((rp, cp));
        }
    }
    let generated = shapes.len();
    let chunk = shapes
        .len()
        .div_ceil(4 * rayon::current_num_threads())
        .max(64);
    let memo = SplitMemo::default();
    let out: Vec<GemmPlan> = shapes
        .par_chunks(chunk)
        .map(|part| {
            let mut costs = costs.clone();
            let mut partitions = Partitions::default();
            part.iter()
                .filter_map(|&(rp, cp)| {
                    let (r, c) = partitions.grid(g, rp, cp);
                    evaluate_with(g, (rp, cp, r, c), &mut costs, &memo)
                })
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flatten()
        .collect();
    (out, generated)
}

/// All feasible candidates within the budget, Pareto-filtered over (device
/// cycles, peak bytes), best first, at most `beam_width`.
pub fn search(
    g: &GemmGeometry,
    tiles: u32,
    costs: &mut GemmCosts,
    budget: &SearchBudget,
) -> (Vec<GemmPlan>, usize) {
    let (mut candidates, generated) = self::candidates(g, tiles, costs, budget);
    // Best first: device cycles (what the machine model's bounds compare),
    // then host link cycles, fewer tiles, memory. A copy within the bound
    // of a step shared with other GEMMs costs nothing more (the step lasts
    // as long as the bound whatever this GEMM copies): only the rest of
    // the plan's cycles compare.
    let bounded = costs.a_copy_shared && costs.copy_bound.is_some();
    let key = |p: &GemmPlan| {
        (
            p.estimate.compute_cycles - if bounded { p.estimate.copy_cycles } else { 0 },
            p.estimate.total_cycles,
            p.estimate.active_tiles,
            p.estimate.peak_interleaved_bytes,
            p.row_parts,
        )
    };
    candidates.sort_by_key(key);
    (pareto_front(candidates, budget.beam_width), generated)
}

/// Tile budgets for GEMMs that run side by side on disjoint tiles (an
/// attention block's projections): the budgets under which the slowest
/// GEMM's best plan is as fast as any split of `tiles` allows.
///
/// Why not equal shares: a GEMM's plans come in steps of whole row and
/// column parts, so an equal share often leaves tiles idle that another
/// GEMM could turn into a finer partition (SigLIP's three projections of
/// 216 column blocks took 6 x 72 tiles each out of 490, their slowest
/// tiles doing 122 rows where 7 row parts would do 105), and GEMMs that
/// differ in their reduce step (a transposed result) are not equally fast
/// on equal tiles.
///
/// Every candidate (row parts x column parts within `tiles`) of every GEMM
/// is evaluated once; for each GEMM, the fewest tiles that reach a device
/// time `t` form a staircase, and the smallest `t` whose staircases sum to
/// at most `tiles` wins. The returned budgets are those fewest tiles, so
/// `search` with them finds plans of at most `t`; `None` when some GEMM
/// has no feasible plan.
///
/// Returns the shares and the bound on the shared copies (below), which
/// the GEMMs' searches must keep (`GemmCosts::copy_bound`) to find those
/// plans. The copies of a host input that ride in one exchange step for all the
/// GEMMs (`GemmCosts::a_copy_shared`) last as long as the largest of them,
/// after which each GEMM computes on its own tiles: the time to minimise is
/// the largest copy plus the slowest of the rest, not the slowest sum. So
/// every bound on the copies (each distinct copy a candidate has) gets its
/// own staircases of the rest over the candidates within it, and the bound
/// plus its smallest `t` is the figure compared. Otherwise the GEMM that
/// sets `t` leaves the others the fewest tiles that reach it, on which
/// their copies of the input are larger: random model 262266 (cross
/// attention on 32 tiles) gave V 1 x 11 tiles, whose copy of `kv` made the
/// shared step 1,100 cycles longer than V on 2 x 6.
///
/// `prefix` = (tiles, cycles): work that follows the GEMMs on the first
/// `tiles` tiles (an attention's first step on its tiles, which are the
/// first of the projections'). The GEMMs take the tiles in order, so a
/// GEMM whose first tile is among them pays it too. Without it, a GEMM
/// with time to spare took the fewest tiles that reach the slowest's time,
/// all of them also the attention's: random model 262570 (f32 cross
/// attention on 23 tiles) gave Q 1 x 2 tiles, which then ran 2,619 cycles
/// where the slowest GEMM's ran 2,100.
pub fn side_by_side_shares(
    items: &mut [(&GemmGeometry, &mut GemmCosts)],
    tiles: u32,
    budget: &SearchBudget,
    prefix: Option<(u32, u64)>,
) -> Option<(Vec<u32>, u64)> {
    // Per GEMM: (active tiles, its copy in the shared step, the rest) of
    // every feasible candidate.
    let mut points: Vec<Vec<(u32, u64, u64)>> = Vec::new();
    let others = items.len().saturating_sub(1) as u32;
    for (g, costs) in items.iter_mut() {
        let most = tiles.saturating_sub(others).max(1);
        let shared = costs.a_copy_shared;
        let mut p: Vec<(u32, u64, u64)> = candidates(g, most, costs, budget)
            .0
            .iter()
            .map(|p| {
                let copy = if shared { p.estimate.copy_cycles } else { 0 };
                let e = &p.estimate;
                (e.active_tiles, copy, e.compute_cycles - copy)
            })
            .collect();
        if p.is_empty() {
            return None;
        }
        p.sort_unstable();
        points.push(p);
    }
    let mut bounds: Vec<u64> = points.iter().flatten().map(|p| p.1).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut best: Option<(u64, Vec<u32>, u64)> = None;
    for bound in bounds {
        // Per GEMM, the staircase of strictly faster plans on more tiles
        // among those whose copy is within the bound.
        let stairs: Option<Vec<Vec<(u32, u64)>>> = points
            .iter()
            .map(|p| {
                let mut stair: Vec<(u32, u64)> = Vec::new();
                for &(t, _, c) in p.iter().filter(|p| p.1 <= bound) {
                    if stair.last().is_none_or(|&(_, best)| c < best) {
                        stair.push((t, c));
                    }
                }
                (!stair.is_empty()).then_some(stair)
            })
            .collect();
        let Some(stairs) = stairs else {
            continue;
        };
        if let Some((t, shares)) = smallest_time(&stairs, tiles, prefix) {
            if best.as_ref().is_none_or(|b| bound + t < b.0) {
                best = Some((bound + t, shares, bound));
            }
        }
    }
    best.map(|b| (b.1, b.2))
}

/// The smallest device time `t` that GEMMs side by side reach within
/// `tiles`, given each GEMM's staircase (sorted by tiles with falling
/// cycles) and the `prefix` on the first tiles, and the fewest tiles with
/// which each reaches it.
fn smallest_time(
    stairs: &[Vec<(u32, u64)>],
    tiles: u32,
    prefix: Option<(u32, u64)>,
) -> Option<(u64, Vec<u32>)> {
    let tiles_for = |stair: &[(u32, u64)], t: u64| -> Option<u32> {
        let i = stair.partition_point(|&(_, c)| c > t);
        stair.get(i).map(|&(n, _)| n)
    };
    let extra = prefix.map_or(0, |p| p.1);
    let mut times: Vec<u64> = stairs
        .iter()
        .flatten()
        .flat_map(|&(_, c)| [c, c + extra])
        .collect();
    times.sort_unstable();
    times.dedup();
    // In order, each GEMM's fewest tiles, the prefix's work included when
    // its first tile is among the prefix's.
    let fits = |t: u64| -> Option<Vec<u32>> {
        let mut first = 0;
        let mut shares = Vec::with_capacity(stairs.len());
        for s in stairs {
            let pays = prefix.is_some_and(|(on, _)| first < on);
            let n = tiles_for(s, t.checked_sub(if pays { extra } else { 0 })?)?;
            first += n;
            shares.push(n);
        }
        (first <= tiles).then_some(shares)
    };
    // Without a prefix (or with one on every GEMM) the tiles needed only
    // fall as `t` grows: bisect. A prefix on some GEMMs can break that
    // (fewer tiles for one may put the next on the prefix's): the first
    // `t` that fits, in order.
    match prefix {
        None => {
            let i = times.partition_point(|&t| fits(t).is_none());
            times.get(i).and_then(|&t| fits(t).map(|s| (t, s)))
        }
        Some(_) => times.into_iter().find_map(|t| fits(t).map(|s| (t, s))),
    }
}

/// The Pareto filter over plans sorted best first: a plan is kept only if
/// no earlier (faster) plan uses less memory; at most `beam_width`.
pub fn pareto_front(sorted: Vec<GemmPlan>, beam_width: usize) -> Vec<GemmPlan> {
    let mut front: Vec<GemmPlan> = Vec::new();
    let mut best_memory = u64::MAX;
    for p in sorted {
        let mem = p.estimate.peak_interleaved_bytes + p.estimate.peak_standard_bytes;
        if mem < best_memory || front.is_empty() {
            best_memory = best_memory.min(mem);
            front.push(p);
        }
        if front.len() >= beam_width {
            break;
        }
    }
    front
}

/// Joint plans of a chain of GEMMs with one row count: every GEMM uses the
/// same row parts and whole rows per tile (one column part), so each GEMM
/// finds its A rows on the tile that computed them. Candidates are ranked by
/// the sum of the GEMMs' device cycles; returns, per GEMM, its plans in the
/// joint ranking (the first of each is the chosen joint plan) and the
/// candidate count.
pub fn search_chain(
    items: &mut [(GemmGeometry, &mut GemmCosts)],
    tiles: u32,
    budget: &SearchBudget,
) -> Vec<(Vec<GemmPlan>, usize)> {
    let m = items.first().map_or(0, |i| i.0.m);
    let mut joint: Vec<(u64, u64, Vec<GemmPlan>)> = Vec::new();
    let mut generated = 0usize;
    for rp in 1..=m.min(tiles) {
        if generated >= budget.max_candidates {
            break;
        }
        generated += 1;
        let plans: Option<Vec<GemmPlan>> = items
            .iter_mut()
            .map(|(g, costs)| evaluate(g, rp, 1, costs))
            .collect();
        if let Some(plans) = plans.filter(|_| chain_fits_together(items, rp)) {
            let compute = plans.iter().map(|p| p.estimate.compute_cycles).sum();
            let memory = plans
                .iter()
                .map(|p| p.estimate.peak_interleaved_bytes)
                .sum();
            joint.push((compute, memory, plans));
        }
    }
    joint.sort_by_key(|j| (j.0, j.1, j.2[0].row_parts));
    joint.truncate(budget.beam_width);
    (0..items.len())
        .map(|i| (joint.iter().map(|j| j.2[i].clone()).collect(), generated))
        .collect()
}

/// Whether the GEMMs of a chain with `row_parts` row parts and whole rows
/// per tile fit region 1 together, laid out as `storage::place` does: the
/// element-exclusive buffers of all of them first, each from an element
/// boundary, then the others. Each GEMM fitting its share of region 1 on
/// its own is not enough: alone, its last exclusive buffer shares its
/// last element with its weights, but beside the others' it rounds up to
/// a whole element.
fn chain_fits_together(items: &mut [(GemmGeometry, &mut GemmCosts)], row_parts: u32) -> bool {
    // The GEMMs share the first one's row partition (one row count).
    let Some(rows) = items.first().map(|i| i.0.row_sizes(row_parts)) else {
        return true;
    };
    rows.lengths.iter().all(|&mt| {
        let mut buffers: Vec<(u32, bool)> = Vec::new();
        for (g, costs) in items.iter_mut() {
            // The worker split `evaluate` and `lower` take for this shard.
            let Some((split, _, _)) = crate::gemm::best_split(g, mt, g.ncb(), costs) else {
                return false;
            };
            let layout = ShardLayout::new(g, mt, g.ncb(), &split);
            buffers.extend(costs.region1_buffers(&layout));
        }
        crate::storage::region1_footprint(&buffers).is_some()
    })
}

/// Region 1 of a whole-K plan's tiles as another GEMM on them sees it
/// ([`GemmCosts::joint`]): per component the largest of its shards, each
/// with the worker split `lower` derives from `costs` (`None` when a
/// shard has none).
pub fn whole_k_joint(
    g: &GemmGeometry,
    plan: &GemmPlan,
    costs: &mut GemmCosts,
) -> Option<(u64, u64, u64)> {
    let rows = g.row_sizes(plan.row_parts);
    let cols = PartSizes::aligned(g.ncb(), plan.col_parts, 1);
    let mut joint = (0, 0, 0);
    for (mt, nct) in shard_sizes(&rows, &cols) {
        let (split, _, _) = crate::gemm::best_split(g, mt, nct, costs)?;
        let j = costs.joint_of(&ShardLayout::new(g, mt, nct, &split));
        joint = (joint.0.max(j.0), joint.1.max(j.1), joint.2.max(j.2));
    }
    Some(joint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::FormulaCost;

    /// A projection of SigLIP's shape in bounded f16 chains, its f16
    /// partials summed by `reduce_f32` ACC=16 with the row-major (TR=0) or
    /// the transposed (TR=1) result: the kernels' declared formulas.
    fn projection(m: u32, k: u32, n: u32, transposed: bool) -> (GemmGeometry, GemmCosts) {
        let g = GemmGeometry {
            m,
            k,
            n,
            acc32: false,
            f16_result: true,
            row_align: if transposed { 2 } else { 1 },
            fp8_scale: None,
            f32_operands: false,
            reduce_f16: true,
            max_chain_blocks: 16,
            f32_reduce_step: false,
        };
        let reduce = if transposed {
            "6 * (33 + 6 * ((2 * P) / (P + 9)) + ROWS * (2 + 3 * ((2 * P) / (P + 9)) + QUADS * (P + 4 + 2 * ((2 * P) / (P + 9)))))"
        } else {
            "6 * (29 + 6 * ((2 * P) / (P + 9)) + ROWS * (2 + 3 * ((2 * P) / (P + 9)) + QUADS * (P + 1 + 2 * ((2 * P) / (P + 9)))))"
        };
        let costs = GemmCosts::new(
            FormulaCost::new("6 * (22 + NCB * (14 + NKB * (4 * M + 43)))".into()),
            Some(FormulaCost::new(reduce.into())),
        );
        (g, costs)
    }

    /// The slowest GEMM's best plan when each gets its budget.
    fn slowest(items: &mut [(GemmGeometry, GemmCosts)], budgets: &[u32]) -> u64 {
        let budget = SearchBudget::default();
        items
            .iter_mut()
            .zip(budgets)
            .map(|((g, c), &t)| search(g, t, c, &budget).0[0].estimate.compute_cycles)
            .max()
            .unwrap()
    }

    fn shares(items: &mut [(GemmGeometry, GemmCosts)], tiles: u32) -> Option<Vec<u32>> {
        let mut refs: Vec<(&GemmGeometry, &mut GemmCosts)> =
            items.iter_mut().map(|(g, c)| (&*g, c)).collect();
        side_by_side_shares(&mut refs, tiles, &SearchBudget::default(), None).map(|s| s.0)
    }

    #[test]
    fn siglip_projections_take_unequal_shares() {
        // Q and V (transposed results, the slower reduce) take 7 row parts
        // of 105 rows on 504 tiles each; K keeps 6 x 72 on 432. Equal
        // shares of 490 gave every projection 6 x 72 and left 176 tiles
        // idle.
        let mut items = vec![
            projection(729, 1152, 1152, true),
            projection(729, 1152, 1152, false),
            projection(729, 1152, 1152, true),
        ];
        let s = shares(&mut items, 1472).unwrap();
        assert_eq!(s, vec![504, 432, 504]);
        let unequal = slowest(&mut items, &s);
        let equal = slowest(&mut items, &[490, 490, 490]);
        assert!(unequal < equal, "{unequal} against {equal}");
    }

    #[test]
    fn shares_match_an_exhaustive_search() {
        // The checker: every split of the tiles between two GEMMs, each
        // planned by `search` within its part; no split may beat the
        // shares' slowest GEMM, and the shares must fit.
        for (tiles, a, b) in [
            (24, (40, 64, 96, false), (40, 64, 96, true)),
            (30, (90, 128, 64, false), (50, 64, 160, false)),
            (17, (33, 48, 48, true), (20, 96, 32, false)),
        ] {
            let mut items = vec![
                projection(a.0, a.1, a.2, a.3),
                projection(b.0, b.1, b.2, b.3),
            ];
            let s = shares(&mut items, tiles).unwrap();
            assert!(s.iter().sum::<u32>() <= tiles, "{s:?} over {tiles}");
            let got = slowest(&mut items, &s);
            let best = (1..tiles)
                .map(|t| slowest(&mut items, &[t, tiles - t]))
                .min()
                .unwrap();
            assert_eq!(got, best, "tiles {tiles}: shares {s:?}");
        }
    }

    /// The checkers' optimum: the best `time` of any pair of the two
    /// GEMMs' candidates that fits `tiles` together.
    fn best_pair(
        items: &mut [(GemmGeometry, GemmCosts)],
        tiles: u32,
        time: impl Fn(&GemmPlan, &GemmPlan) -> u64,
    ) -> u64 {
        let budget = SearchBudget::default();
        let all: Vec<Vec<GemmPlan>> = items
            .iter_mut()
            .map(|(g, c)| candidates(g, tiles, c, &budget).0)
            .collect();
        let mut best = u64::MAX;
        for p in &all[0] {
            for q in all[1]
                .iter()
                .filter(|q| q.estimate.active_tiles + p.estimate.active_tiles <= tiles)
            {
                best = best.min(time(p, q));
            }
        }
        best
    }

    /// What the compiler does with GEMMs side by side: their shares of
    /// `tiles` (with `prefix`), then each GEMM's best plan within its share
    /// and the shares' bound on shared copies. Returns the plans, the
    /// shares and the bound.
    fn planned_within_shares(
        items: &mut [(GemmGeometry, GemmCosts)],
        tiles: u32,
        prefix: Option<(u32, u64)>,
    ) -> (Vec<GemmPlan>, Vec<u32>, u64) {
        let budget = SearchBudget::default();
        let mut refs: Vec<(&GemmGeometry, &mut GemmCosts)> =
            items.iter_mut().map(|(g, c)| (&*g, c)).collect();
        let (s, bound) = side_by_side_shares(&mut refs, tiles, &budget, prefix).unwrap();
        assert!(s.iter().sum::<u32>() <= tiles, "{s:?} over {tiles}");
        let plans = items
            .iter_mut()
            .zip(&s)
            .map(|((g, c), &t)| {
                c.copy_bound = Some(bound);
                let plan = search(g, t, c, &budget).0.remove(0);
                c.copy_bound = None;
                plan
            })
            .collect();
        (plans, s, bound)
    }

    #[test]
    fn shared_copies_match_an_exhaustive_search() {
        // Projections whose copies of a host input ride in one step: the
        // step lasts as long as the largest copy, then each GEMM computes
        // on its own tiles. The checker: every pair of candidates within
        // the tiles, timed as the largest copy plus the slowest rest; the
        // shares, with each GEMM searched within them and the bound, must
        // reach the best of them.
        for (tiles, a, b) in [
            (32, (19, 170, 170), (27, 170, 170)),
            (24, (40, 64, 96), (12, 96, 64)),
            (20, (7, 51, 51), (1, 51, 51)),
        ] {
            let mut items = vec![
                projection(a.0, a.1, a.2, false),
                projection(b.0, b.1, b.2, false),
            ];
            for (_, c) in &mut items {
                c.a_copied = true;
                c.a_copy_shared = true;
            }
            let time = |plans: &[&GemmPlan]| {
                let copy = plans.iter().map(|p| p.estimate.copy_cycles).max().unwrap();
                let rest = plans
                    .iter()
                    .map(|p| p.estimate.compute_cycles - p.estimate.copy_cycles)
                    .max()
                    .unwrap();
                copy + rest
            };
            let best = best_pair(&mut items, tiles, |p, q| time(&[p, q]));
            let (chosen, s, bound) = planned_within_shares(&mut items, tiles, None);
            let got = time(&chosen.iter().collect::<Vec<_>>());
            assert_eq!(got, best, "tiles {tiles}: shares {s:?}, bound {bound}");
        }
    }

    #[test]
    fn shares_weigh_work_that_follows_on_the_first_tiles() {
        // An attention's first step runs after the projections on the
        // first `on` tiles, which the GEMMs take in order: a GEMM whose
        // first tile is among them pays it. The checker: every pair of
        // candidates within the tiles, so timed; the shares must reach the
        // best of them, and at least one case must need the prefix.
        let mut needed = false;
        for (tiles, a, b, on, cycles) in [
            (23, (7, 51, 51), (7, 51, 51), 3, 500),
            (24, (40, 64, 96), (12, 96, 64), 5, 900),
            (30, (90, 128, 64), (50, 64, 160), 12, 1500),
            (17, (33, 48, 48), (20, 96, 32), 2, 400),
        ] {
            let mut items = [
                projection(a.0, a.1, a.2, false),
                projection(b.0, b.1, b.2, false),
            ];
            let time = |p: &GemmPlan, q: &GemmPlan| {
                let second = if p.estimate.active_tiles < on {
                    cycles
                } else {
                    0
                };
                (p.estimate.compute_cycles + cycles).max(q.estimate.compute_cycles + second)
            };
            let best = best_pair(&mut items, tiles, time);
            let mut got = Vec::new();
            for prefix in [Some((on, cycles)), None] {
                let (chosen, ..) = planned_within_shares(&mut items, tiles, prefix);
                got.push(time(&chosen[0], &chosen[1]));
            }
            assert_eq!(got[0], best, "tiles {tiles}, prefix {cycles} on {on}");
            needed |= got[1] > best;
        }
        assert!(needed, "no case needed the prefix");
    }

    #[test]
    fn a_join_that_moves_weights_weighs_rows_and_columns() {
        // The ViT block's Q projection on 13 x 36 tiles in its segment: a
        // tile receives its 57 rows of `n1` and its 32 columns of `wq`,
        // 1152 f16 each, in the join's one exchange step (51,264 cycles,
        // the step's endpoint bound), and pays no sync of its own.
        let (g, mut costs) = projection(729, 1152, 1152, false);
        costs.a_copied = true;
        costs.a_joined = true;
        let rows_only = evaluate(&g, 13, 36, &mut costs).unwrap().estimate;
        assert_eq!(rows_only.copy_cycles, 57 * 1152 * 2 / 4);
        costs.b_joined = true;
        let both = evaluate(&g, 13, 36, &mut costs).unwrap().estimate;
        assert_eq!(both.copy_cycles, (57 + 32) * 1152 * 2 / 4);
        assert_eq!(
            both.compute_cycles - both.copy_cycles,
            rows_only.compute_cycles - rows_only.copy_cycles
        );
        // The weights alone (A already where the plan reads it).
        costs.a_copied = false;
        let weights = evaluate(&g, 13, 36, &mut costs).unwrap().estimate;
        assert_eq!(weights.copy_cycles, 32 * 1152 * 2 / 4);
    }

    #[test]
    fn a_copy_in_a_step_that_runs_anyway_pays_no_sync() {
        // Projections of one host input on disjoint tiles: alone, a plan
        // with one column part holds A where the host writes it and one
        // with two pays a copy step (its sync and its rows, 2 x 48 f16 a
        // tile); when the input's copy step runs anyway, both receive
        // their rows in it and neither pays a sync.
        let (g, mut costs) = projection(24, 48, 48, false);
        costs.a_copied = true;
        let rows = 2 * 48 * 2 / 4;
        assert_eq!(
            evaluate(&g, 12, 1, &mut costs)
                .unwrap()
                .estimate
                .copy_cycles,
            0
        );
        assert_eq!(
            evaluate(&g, 12, 2, &mut costs)
                .unwrap()
                .estimate
                .copy_cycles,
            SYNC_CYCLES + rows
        );
        costs.a_copy_shared = true;
        assert_eq!(
            evaluate(&g, 12, 1, &mut costs)
                .unwrap()
                .estimate
                .copy_cycles,
            rows
        );
        assert_eq!(
            evaluate(&g, 12, 2, &mut costs)
                .unwrap()
                .estimate
                .copy_cycles,
            rows
        );
    }

    #[test]
    fn a_host_input_b_weighs_its_copy_to_every_row_part() {
        // A batched GEMM of two inputs: with one row part B is held once,
        // where it is read; with 4 row parts every tile receives its
        // columns of B (16 of them, K = 72 f16) in the copy step.
        let (g, mut costs) = projection(16, 72, 44, false);
        costs.b_copied = true;
        let one = evaluate(&g, 1, 3, &mut costs).unwrap().estimate;
        assert_eq!(one.copy_cycles, 0);
        let four = evaluate(&g, 4, 3, &mut costs).unwrap().estimate;
        assert_eq!(four.copy_cycles, SYNC_CYCLES + 16 * 72 * 2 / 4);
    }

    #[test]
    fn a_result_transposed_on_its_tiles_weighs_the_transpose() {
        // The column attention layout's Q without a transposed reduce: each
        // tile transposes its shard, one vertex per range of result columns
        // (8 rows x 16 columns on 5 x 5 tiles: 3 columns per vertex).
        let (g, mut costs) = projection(40, 64, 80, false);
        let plain = evaluate(&g, 5, 5, &mut costs).unwrap().estimate;
        let formula = "6 * (12 + COLS * (16 + 5 * (ROWS / 4) + 2 * (ROWS - 4 * (ROWS / 4))))";
        costs.transpose = Some(FormulaCost::new(formula.into()));
        let transposed = evaluate(&g, 5, 5, &mut costs).unwrap().estimate;
        assert_eq!(
            transposed.compute_cycles - plain.compute_cycles,
            6 * (12 + 3 * (16 + 5 * 2)) + supervisor_cycles(6)
        );
        assert_eq!(
            transposed.transpose_cycles,
            transposed.compute_cycles - plain.compute_cycles
        );
    }

    #[test]
    fn memoised_candidates_equal_fresh_evaluations() {
        // The search caches partitions and worker splits across its
        // shapes and threads; every candidate must equal `evaluate` of its
        // shape with nothing cached (odd row alignment, a tight memory
        // budget that rejects some splits, and a copied A included).
        for (m, k, n, transposed, budget, copied) in [
            (729, 1152, 1152, true, u64::MAX / 4, false),
            (97, 256, 300, false, 200 * 1024, true),
            (61, 64, 40, true, 100 * 1024, false),
        ] {
            let (g, mut costs) = projection(m, k, n, transposed);
            costs.memory_budget = budget;
            costs.a_copied = copied;
            let (plans, generated) = candidates(&g, 300, &mut costs, &SearchBudget::default());
            assert!(
                !plans.is_empty() && generated >= plans.len(),
                "{m}: {} of {generated}",
                plans.len()
            );
            let mut fresh = Vec::new();
            for rp in 1..=g.m.min(300) {
                for cp in 1..=g.ncb().min(300 / rp) {
                    let mut c = costs.clone();
                    fresh.extend(evaluate(&g, rp, cp, &mut c));
                }
            }
            assert_eq!(plans, fresh, "{m} x {k} x {n}");
        }
    }

    #[test]
    fn shares_refuse_a_gemm_without_plans() {
        // Two GEMMs on one tile: no split gives each a tile.
        let mut items = vec![projection(16, 64, 16, false), projection(16, 64, 16, false)];
        assert!(shares(&mut items, 1).is_none());
        assert_eq!(shares(&mut items, 2), Some(vec![1, 1]));
    }
}
