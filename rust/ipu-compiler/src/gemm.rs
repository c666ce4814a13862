//! GEMM geometry shared by planning and lowering: padded sizes, tile shards,
//! the split of a shard over the six workers, and the tile-local layout that
//! device/gemm_f16.S requires (docs/kernels.md).
//!
//! Tile-local layout of a shard of `mt` rows and `nct` column blocks:
//! - A: `mt + 2` rows of `kp` f16 (K padded with zeros to a multiple of 16);
//!   the two extra rows are read by the pipeline's drain and never matter.
//! - B: `kp` rows of `16 * nct` f16 (padding zero), rows `32 * nct` bytes apart.
//! - C (two buffers, the result ends in the first): a 16-byte zero header,
//!   then per worker row group two junk rows followed by the group's rows,
//!   then two trailing rows (read by the drain). Row `r` of row group `g` is
//!   at `16 + (r + 2 (g + 1)) * rs_c`.

use std::collections::HashMap;

/// Bytes of the zero header at the start of each C buffer.
pub const C_HEADER: u32 = 16;

/// Sizes of one GEMM `[m, k] x [k, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmGeometry {
    pub m: u32,
    pub k: u32,
    pub n: u32,
    /// f32 accumulation (the kernel's ACC=32 specialisation).
    pub acc32: bool,
    /// The result the host reads is f16 (else f32).
    pub f16_result: bool,
    /// Row-part boundaries are multiples of this (1, or 2 when the result is
    /// transposed on its tiles and moved as runs of 4-byte words).
    pub row_align: u32,
    /// fp8 operands (`gemm_fp8`: K blocks of 32, one byte per element, f16
    /// accumulation) with this product scale exponent (the sum of the
    /// operands' scales); `None`: f16 operands (`gemm_f16`).
    pub fp8_scale: Option<i32>,
    /// f32 operands (`gemm_f32`: K blocks of 16, four bytes per element,
    /// f32 accumulation and result).
    pub f32_operands: bool,
    /// f16 accumulation whose result still passes the reduce step
    /// (`reduce_f32` IN=16, one partial) for a fused epilogue or a GEMM
    /// consumer's compact rows.
    pub reduce_f16: bool,
    /// The longest f16 accumulation chain, in K blocks, that one partial
    /// may take (`u32::MAX`: unbounded). Shorter chains keep the f16
    /// rounding error of a long K well inside the verification tolerance:
    /// the worker split cuts K into at least `nkb / max_chain_blocks`
    /// groups whose f16 partials the reduce step sums in f32.
    pub max_chain_blocks: u32,
    /// An f32 result that still passes the reduce step (`reduce_f32`
    /// OUT=32, one partial when K is not split) for a fused epilogue or a
    /// GEMM consumer's compact rows; f16 results always do.
    pub f32_reduce_step: bool,
}

impl GemmGeometry {
    /// The fewest worker K groups that keep every f16 chain within
    /// `max_chain_blocks`.
    pub fn min_k_groups(&self) -> u32 {
        self.nkb().div_ceil(self.max_chain_blocks.max(1)).max(1)
    }
    /// K padded to the AMP's weight block (16 rows of f16, 32 of fp8).
    pub fn kp(&self) -> u32 {
        self.nkb() * self.k_block()
    }
    pub fn nkb(&self) -> u32 {
        self.k.div_ceil(self.k_block())
    }
    /// K rows of one AMP weight block.
    pub fn k_block(&self) -> u32 {
        k_block(self.fp8_scale.is_some())
    }
    /// Bytes of one operand element.
    pub fn operand_bytes(&self) -> u32 {
        if self.fp8_scale.is_some() {
            1
        } else if self.f32_operands {
            4
        } else {
            2
        }
    }
    pub fn ncb(&self) -> u32 {
        self.n.div_ceil(16)
    }
    /// Bytes of one element of the result the host reads.
    pub fn result_bytes(&self) -> u32 {
        if self.f16_result {
            2
        } else {
            4
        }
    }
    /// Bytes of the fused bias of one 16-column block: the bias has the
    /// result's type (f16, or f32 for an f32 GEMM).
    pub fn bias_block_bytes(&self) -> u32 {
        16 * self.result_bytes()
    }
    /// Bytes of one element of the GEMM's C buffers.
    pub fn out_bytes(&self) -> u32 {
        if self.acc32 {
            4
        } else {
            2
        }
    }
    /// Whether a split with `k_groups` needs the reduce step: f32 partials of
    /// several K groups to sum, or an f32 accumulation to store as f16.
    pub fn needs_reduce(&self, k_groups: usize) -> bool {
        (self.acc32 && (k_groups > 1 || self.f16_result || self.f32_reduce_step)) || self.reduce_f16
    }
    /// Row ranges of `parts` row parts, boundaries aligned to `row_align`.
    pub fn row_ranges(&self, parts: u32) -> Vec<(u32, u32)> {
        aligned_ranges(self.m, parts, self.row_align)
    }
    /// [`GemmGeometry::row_ranges`]' count and lengths.
    pub fn row_sizes(&self, parts: u32) -> PartSizes {
        PartSizes::aligned(self.m, parts, self.row_align)
    }
    /// Multiply-accumulates of the whole product.
    pub fn macs(&self) -> u64 {
        self.m as u64 * self.k as u64 * self.n as u64
    }
}

/// K rows of one AMP weight block: 16 f16 rows, or 32 fp8 ones.
pub fn k_block(fp8: bool) -> u32 {
    if fp8 {
        32
    } else {
        16
    }
}

/// Splits `n` items into `parts` contiguous near-equal ranges, dropping empty ones.
pub fn ranges(n: u32, parts: u32) -> Vec<(u32, u32)> {
    (0..parts)
        .map(|i| {
            (
                (i as u64 * n as u64 / parts as u64) as u32,
                ((i as u64 + 1) * n as u64 / parts as u64) as u32,
            )
        })
        .filter(|(a, b)| b > a)
        .collect()
}

/// A partition of rows (or column blocks) into ranges, with the distinct
/// range lengths in increasing order (shards of equal size cost the same,
/// so the planners evaluate each size once; balanced ranges have at most
/// two lengths).
#[derive(Clone, Debug)]
pub struct Parts {
    pub ranges: Vec<(u32, u32)>,
    pub sizes: PartSizes,
}

impl Parts {
    pub fn new(ranges: Vec<(u32, u32)>) -> Parts {
        let sizes = PartSizes::of_ranges(&ranges);
        Parts { ranges, sizes }
    }
}

/// What the planners' cost models need of a partition: how many non-empty
/// ranges it has and their distinct lengths in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartSizes {
    pub count: u32,
    pub lengths: Vec<u32>,
}

impl PartSizes {
    pub fn of_ranges(ranges: &[(u32, u32)]) -> PartSizes {
        let mut sizes = PartSizes {
            count: 0,
            lengths: Vec::new(),
        };
        for &(a, b) in ranges {
            sizes.add(b - a);
        }
        sizes.lengths.sort_unstable();
        sizes
    }

    /// `PartSizes::of_ranges(&aligned_ranges(n, parts, align))` without
    /// cutting the ranges. A GEMM search visits every row-part count up to
    /// the tile count for each shape it plans (an attention's projections
    /// are planned once per query blocking), and cutting the rows of each
    /// took a quarter of BERT-large's compile at 2048 tokens: here each
    /// boundary `i * n / parts` steps from the last by the quotient and
    /// remainder of `n / parts`, with no division and no allocation.
    pub fn aligned(n: u32, parts: u32, align: u32) -> PartSizes {
        let mut sizes = PartSizes {
            count: 0,
            lengths: Vec::new(),
        };
        if parts == 0 {
            return sizes;
        }
        let (n64, p64, a64) = (n as u64, parts as u64, align.max(1) as u64);
        let (step, rem) = (n64 / p64, n64 % p64);
        if a64 == 1 {
            // `ranges`: every part has `step` or `step + 1` items, `rem`
            // of them the longer; with more parts than items, the empty
            // ones are dropped.
            if step == 0 {
                sizes.count = rem as u32;
                sizes.lengths = if rem > 0 { vec![1] } else { Vec::new() };
            } else {
                sizes.count = parts;
                sizes.lengths = if rem > 0 {
                    vec![step as u32, step as u32 + 1]
                } else {
                    vec![step as u32]
                };
            }
            return sizes;
        }
        // The boundary `aligned_ranges` puts at the exact cut `e` (a mask
        // for the usual power-of-two alignments: a division per boundary
        // was most of this loop's time).
        let mask = a64.is_power_of_two().then(|| !(a64 - 1));
        let round = |e: u64| -> u64 {
            let r = match mask {
                Some(m) => (e + a64 / 2) & m,
                None => (e + a64 / 2) / a64 * a64,
            };
            r.min(n64)
        };
        let (mut exact, mut carry, mut last) = (0u64, 0u64, 0u64);
        for i in 1..=parts {
            let bound = if i == parts {
                n64
            } else {
                exact += step;
                carry += rem;
                if carry >= p64 {
                    exact += 1;
                    carry -= p64;
                }
                round(exact)
            };
            if bound > last {
                sizes.add((bound - last) as u32);
                last = bound;
            }
        }
        sizes.lengths.sort_unstable();
        sizes
    }

    fn add(&mut self, length: u32) {
        if length == 0 {
            return;
        }
        self.count += 1;
        if !self.lengths.contains(&length) {
            self.lengths.push(length);
        }
    }
}

/// A geometry's row partitions ([`GemmGeometry::row_ranges`], as their
/// [`PartSizes`]) and column-block partitions ([`ranges`]) by part count,
/// each cut once (a search visits the same part counts for many shapes).
#[derive(Default)]
pub struct Partitions {
    rows: HashMap<u32, PartSizes>,
    cols: HashMap<u32, Parts>,
}

impl Partitions {
    /// `g`'s rows in `row_parts` and column blocks in `col_parts` (`g` is
    /// the same geometry for every call on one value).
    pub fn grid(
        &mut self,
        g: &GemmGeometry,
        row_parts: u32,
        col_parts: u32,
    ) -> (&PartSizes, &Parts) {
        let rows = self
            .rows
            .entry(row_parts)
            .or_insert_with(|| remembered_row_sizes(g, row_parts));
        let cols = self
            .cols
            .entry(col_parts)
            .or_insert_with(|| Parts::new(ranges(g.ncb(), col_parts)));
        (rows, cols)
    }
}

/// Row sizes remembered per thread: [`Partitions`] lives for one search,
/// and an attention's projections are searched again for every query
/// blocking with the same rows, whose every row-part count up to the tile
/// count is then cut again (a tenth of BERT-large's compile at 2048 tokens
/// even without cutting the ranges). The sizes are a pure function of
/// their key, so the memo changes no result; it is emptied when it holds
/// `ROW_SIZE_MEMO_ENTRIES`, which bounds its memory to a few megabytes per
/// thread.
fn remembered_row_sizes(g: &GemmGeometry, row_parts: u32) -> PartSizes {
    const ROW_SIZE_MEMO_ENTRIES: usize = 1 << 16;
    thread_local! {
        static MEMO: std::cell::RefCell<HashMap<(u32, u32, u32), PartSizes>> =
            std::cell::RefCell::new(HashMap::new());
    }
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        let key = (g.m, g.row_align, row_parts);
        if let Some(sizes) = memo.get(&key) {
            return sizes.clone();
        }
        if memo.len() >= ROW_SIZE_MEMO_ENTRIES {
            memo.clear();
        }
        let sizes = g.row_sizes(row_parts);
        memo.insert(key, sizes.clone());
        sizes
    })
}

/// The distinct (rows, column blocks) shard sizes of a grid, in increasing
/// order.
pub fn shard_sizes(rows: &PartSizes, cols: &PartSizes) -> Vec<(u32, u32)> {
    rows.lengths
        .iter()
        .flat_map(|&r| cols.lengths.iter().map(move |&c| (r, c)))
        .collect()
}

/// Like [`ranges`], with every inner boundary rounded to a multiple of
/// `align` (ranges that become empty are dropped).
pub fn aligned_ranges(n: u32, parts: u32, align: u32) -> Vec<(u32, u32)> {
    if align <= 1 {
        return ranges(n, parts);
    }
    let bound = |i: u32| -> u32 {
        if i >= parts {
            return n;
        }
        let exact = i as u64 * n as u64 / parts as u64;
        (((exact + align as u64 / 2) / align as u64) * align as u64).min(n as u64) as u32
    };
    (0..parts)
        .map(|i| (bound(i), bound(i + 1)))
        .filter(|(a, b)| b > a)
        .collect()
}

/// How a tile's shard is shared by its workers: every (row group, column
/// group, K group) triple is one GEMM vertex; with several K groups each
/// accumulates its own f32 partial, and one reduce vertex per (row group,
/// column group) sums them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSplit {
    /// Tile-local row ranges.
    pub row_groups: Vec<(u32, u32)>,
    /// Tile-local column-block ranges.
    pub col_groups: Vec<(u32, u32)>,
    /// K-block ranges.
    pub k_groups: Vec<(u32, u32)>,
}

impl WorkerSplit {
    pub fn vertices(&self) -> usize {
        self.row_groups.len() * self.col_groups.len() * self.k_groups.len()
    }
    pub fn reduce_vertices(&self) -> usize {
        self.reduce_parts().len()
    }
    /// The reduce step's vertices: every (row group, column group) pair's
    /// rows split further so that all six workers take part. Each item is
    /// (row group index, row range, column-block range); a range never
    /// crosses a row group, whose rows are contiguous in the C buffers.
    pub fn reduce_parts(&self) -> Vec<ReducePart> {
        self.reduce_parts_aligned(1)
    }
    /// [`WorkerSplit::reduce_parts`] with the cuts inside a row group on
    /// multiples of `align` tile rows, so that every vertex but a row
    /// group's first starts on one.
    pub fn reduce_parts_aligned(&self, align: u32) -> Vec<ReducePart> {
        let pairs = (self.row_groups.len() * self.col_groups.len()) as u32;
        let per_pair = (ipu_arch::WORKER_CONTEXTS / pairs.max(1)).max(1);
        let mut out = Vec::new();
        for (gi, &(r0, r1)) in self.row_groups.iter().enumerate() {
            let bound = |i: u32| -> u32 {
                if i >= per_pair {
                    return r1;
                }
                let exact = r0 as u64 + i as u64 * (r1 - r0) as u64 / per_pair as u64;
                if i == 0 || align <= 1 {
                    return exact as u32;
                }
                let a = align as u64;
                (((exact + a / 2) / a) * a).clamp(r0 as u64, r1 as u64) as u32
            };
            for &c in &self.col_groups {
                for i in (0..per_pair).filter(|&i| bound(i + 1) > bound(i)) {
                    out.push((gi, (bound(i), bound(i + 1)), c));
                }
            }
        }
        out
    }
}

/// One reduce vertex: (row group index, row range, column-block range).
pub type ReducePart = (usize, (u32, u32), (u32, u32));

/// The tile-local layout of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub rows: u32,
    pub col_blocks: u32,
    pub row_groups: u32,
    pub k_groups: u32,
    pub rs_a: u32,
    pub rs_b: u32,
    pub rs_c: u32,
    pub kp: u32,
    pub result_bytes: u32,
}

impl ShardLayout {
    pub fn new(g: &GemmGeometry, rows: u32, col_blocks: u32, split: &WorkerSplit) -> ShardLayout {
        ShardLayout {
            rows,
            col_blocks,
            row_groups: split.row_groups.len() as u32,
            k_groups: split.k_groups.len() as u32,
            rs_a: g.kp() * g.operand_bytes(),
            rs_b: col_blocks * 16 * g.operand_bytes(),
            rs_c: col_blocks * 16 * g.out_bytes(),
            kp: g.kp(),
            result_bytes: g.result_bytes(),
        }
    }
    pub fn a_bytes(&self) -> u32 {
        (self.rows + 2) * self.rs_a
    }
    pub fn b_bytes(&self) -> u32 {
        self.kp * self.rs_b
    }
    /// The result of the reduce step: compact rows of `16 * col_blocks` elements.
    pub fn d_bytes(&self) -> u32 {
        self.rows * self.rs_d()
    }
    pub fn rs_d(&self) -> u32 {
        self.col_blocks * 16 * self.result_bytes
    }
    /// Bytes of one K group's section of a C buffer.
    pub fn section(&self) -> u32 {
        (self.rows + 2 * self.row_groups + 2) * self.rs_c
    }
    pub fn c_bytes(&self) -> u32 {
        C_HEADER + self.k_groups * self.section()
    }
    /// Byte offset in a C buffer of tile-local row `r` of row group `g` in
    /// K group `j`'s section.
    pub fn c_row(&self, j: u32, g: u32, r: u32) -> u32 {
        C_HEADER + j * self.section() + (r + 2 * (g + 1)) * self.rs_c
    }
}

/// A kernel's declared formula, parsed once, as the cost model evaluates
/// it.
#[derive(Clone)]
pub struct FormulaCost {
    formula: std::sync::Arc<crate::formula::Formula>,
    scratch: Vec<i64>,
}

impl FormulaCost {
    /// `formula` must parse (`kernel_formula` checks a kernel's before it
    /// gets here; the tests' are literals).
    pub fn new(formula: String) -> FormulaCost {
        let parsed = crate::formula::Formula::parse(&formula)
            .unwrap_or_else(|e| panic!("a checked cycle formula: {e}"));
        FormulaCost {
            formula: std::sync::Arc::new(parsed),
            scratch: Vec::new(),
        }
    }

    /// The formula's value for `vars` (never negative). A variable missing
    /// from `vars` or a division by zero gives `i64::MAX`: no plan then
    /// looks cheap by it.
    pub fn eval(&mut self, vars: &[(&str, i64)]) -> u64 {
        let names = self.formula.variables();
        let mut values = [0i64; 8];
        let mut spilled = Vec::new();
        let values: &mut [i64] = if names.len() <= values.len() {
            &mut values[..names.len()]
        } else {
            spilled.resize(names.len(), 0);
            &mut spilled
        };
        for (value, name) in values.iter_mut().zip(names) {
            match vars.iter().find(|v| v.0 == name) {
                Some(v) => *value = v.1,
                None => return i64::MAX as u64,
            }
        }
        self.formula
            .eval_with(values, &mut self.scratch)
            .unwrap_or(i64::MAX)
            .max(0) as u64
    }
}

/// The kernels' cost formulas of one GEMM: the product and, for f32
/// accumulation, the reduce step.
#[derive(Clone)]
pub struct GemmCosts {
    pub gemm: FormulaCost,
    pub reduce: Option<FormulaCost>,
    /// Region-1 bytes this GEMM's buffers may use on a tile.
    pub memory_budget: u64,
    /// Whether the A operand is a buffer of this GEMM (a host operand)
    /// rather than the result of an earlier GEMM on the same tile.
    pub owns_a: bool,
    /// Whether A is a value the program holds once and copies to the
    /// tiles that read it by an exchange step before the GEMM (a host
    /// input under `HostInputs::Once`, or an earlier segment's result):
    /// every tile of a column part then receives its rows of A, which the
    /// plan's device cycles count.
    pub a_copied: bool,
    /// Whether that copy is part of a segment's join (an exchange step the
    /// program runs anyway, crate::segment): then every plan receives its
    /// rows of A in it, with one column part too, and pays no sync of its
    /// own; a streamed plan receives its A homes.
    pub a_joined: bool,
    /// Whether A is a value an earlier segment computed, which the
    /// segment's join always brings by exchange (a model input may be
    /// written by the host instead): a streamed plan may then take its
    /// first chunk straight into its receive buffers in the join
    /// (`stream::chunk0_joined`).
    pub a_from_segment: bool,
    /// Whether that copy rides in an exchange step the program runs anyway
    /// outside any segment's join: an attention's projections on disjoint
    /// tiles that read one host input written once, which one copy step
    /// brings to their tiles whatever their plans. A whole-K plan then
    /// receives its rows of A in that step, with one column part too, and
    /// pays no sync of its own. Streamed plans do not read it: projections
    /// of one input share its homes and copy nothing (`stream::AHomes`).
    pub a_copy_shared: bool,
    /// With `a_copy_shared`: the largest copy, in cycles, a plan may make
    /// in that step. The step lasts as long as the largest copy of all the
    /// GEMMs that share it, so `plan::side_by_side_shares` picks a bound
    /// with the tile shares, and each GEMM's search keeps within it.
    pub copy_bound: Option<u64>,
    /// Whether that join also moves the GEMM's weights from their homes
    /// (`segment::join` with `stream_params`, when the segments' weights
    /// cannot all stay resident): every tile then receives its part of B
    /// in the same exchange step as its A (a whole-K plan its columns of B,
    /// a streamed plan its resident chunks or its B homes), which the
    /// plan's device cycles count.
    pub b_joined: bool,
    /// The most bytes of B a tile may keep resident (a segment's weight
    /// when the segments' weights stay where their plans put them and the
    /// plans that weigh only A's join are capped to leave the others room,
    /// `lower_segments`): a whole-K shard's B, a streamed plan's resident
    /// chunks. `None`: no cap.
    pub b_cap: Option<u64>,
    /// Whether B is a host input (not a parameter) that the run holds once
    /// and copies by exchange to every row part's tiles (`HostInputs::Once`
    /// in a model of one segment): with more than one row part each tile
    /// receives its columns of B in the copy step, beside its rows of A.
    pub b_copied: bool,
    /// The `transpose_f16` formula when the result is transposed on its
    /// tiles after the GEMM (the column attention layout's Q and V, whose
    /// reduce cannot store them transposed: f32 partials, or no TR=1
    /// object): each tile then runs one vertex per range of its result
    /// columns over the workers, which the plan's cycles count.
    pub transpose: Option<FormulaCost>,
    /// Whether the result feeds a later GEMM (and lives in region 1).
    pub feeds_gemm: bool,
    /// Phased placement (a model with attention): the region-1 bytes that
    /// buffers live for the whole program may take (B, and A when it is a
    /// param or padded, `a_persistent`); the others are phase-1 scratch
    /// above them (docs/compiler.md, storage). `None`: everything persists.
    pub persistent_budget: Option<u64>,
    pub a_persistent: bool,
    /// Region 1 shared with another GEMM's buffers, as `storage::place`
    /// lays them out together (every element-exclusive buffer of both on
    /// its own elements first, then the others, then scratch phases from
    /// the next element boundary): (the other's exclusive bytes rounded
    /// up to whole elements, its other persistent bytes, its largest
    /// scratch phase). A chain's producer beside a streamed consumer.
    pub joint: Option<(u64, u64, u64)>,
    /// A streamed plan's reduce vertices start their rows on multiples of
    /// this (`stream::reduce_parts`): 4 for `reduce_f32` ACC=16 TR=1, whose
    /// fast path stores four rows of a column at once from an 8-aligned
    /// destination (its formula assumes that), else 1.
    pub reduce_row_align: u32,
    /// Whether other GEMMs' buffers share this GEMM's tiles for the whole
    /// program (the slices of a batched GEMM when there are more of them
    /// than tiles): `storage::place` gives every element-exclusive buffer of
    /// each its own 32 KiB elements, so the budget is checked with those
    /// rounded up to whole elements ([`GemmCosts::joint_of`]), or the
    /// plan fits its share by bytes and overflows at placement.
    pub whole_elements: bool,
}

impl GemmCosts {
    /// Costs with the kernels' formulas `gemm` and `reduce`, all of
    /// region 1 as the budget, A a buffer of this GEMM, nothing copied or
    /// joined: what a GEMM alone on its tiles weighs.
    pub fn new(gemm: FormulaCost, reduce: Option<FormulaCost>) -> GemmCosts {
        GemmCosts {
            gemm,
            reduce,
            memory_budget: (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64,
            owns_a: true,
            a_copied: false,
            a_joined: false,
            a_from_segment: false,
            a_copy_shared: false,
            copy_bound: None,
            b_joined: false,
            b_cap: None,
            b_copied: false,
            transpose: None,
            feeds_gemm: false,
            persistent_budget: None,
            a_persistent: false,
            joint: None,
            reduce_row_align: 1,
            whole_elements: false,
        }
    }

    /// Region-1 bytes of a shard's buffers as `place_storage` allocates them,
    /// or `None` when they cannot fit region 1 at all.
    pub fn region1_bytes(&self, layout: &ShardLayout) -> Option<u64> {
        if let Some((other_exclusive, other_shared, other_phase)) = self.joint {
            let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
            let mut exclusive = vec![layout.c_bytes() as u64, layout.c_bytes() as u64];
            if self.owns_a {
                exclusive.push(layout.a_bytes() as u64);
            }
            if self.feeds_gemm {
                exclusive.push((layout.d_bytes() + 2 * layout.rs_d()) as u64);
            }
            let exclusive: u64 = exclusive
                .iter()
                .map(|b| b.div_ceil(element) * element)
                .sum::<u64>()
                + other_exclusive;
            let persistent = exclusive + layout.b_bytes() as u64 + other_shared;
            let total = if other_phase > 0 {
                persistent.div_ceil(element) * element + other_phase
            } else {
                persistent
            };
            return (total <= (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64)
                .then_some(total);
        }
        if let Some(budget) = self.persistent_budget {
            let mut persistent = vec![(layout.b_bytes(), false)];
            let mut scratch = vec![(layout.c_bytes(), true), (layout.c_bytes(), true)];
            if self.owns_a {
                if self.a_persistent {
                    persistent.push((layout.a_bytes(), true));
                } else {
                    scratch.push((layout.a_bytes(), true));
                }
            }
            let p = crate::storage::region1_footprint(&persistent)?;
            if p > budget {
                return None;
            }
            let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
            let s = crate::storage::region1_footprint(&scratch)?;
            let total = p.div_ceil(element) * element + s;
            return (total <= (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64)
                .then_some(total);
        }
        if self.whole_elements {
            let (exclusive, shared, _) = self.joint_of(layout);
            let total = exclusive + shared;
            return (total <= (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64)
                .then_some(total);
        }
        crate::storage::region1_footprint(&self.region1_buffers(layout))
    }

    /// The region-1 buffers of a shard that keeps all of them for the
    /// whole program, as (bytes, needs elements of its own), in the order
    /// [`GemmCosts::region1_bytes`] counts them: the two C buffers, B, A
    /// when the GEMM owns it, and the compact result when a GEMM on the
    /// same tiles reads it as its A.
    pub fn region1_buffers(&self, layout: &ShardLayout) -> Vec<(u32, bool)> {
        let mut bufs = vec![
            (layout.c_bytes(), true),
            (layout.c_bytes(), true),
            (layout.b_bytes(), false),
        ];
        if self.owns_a {
            bufs.push((layout.a_bytes(), true));
        }
        if self.feeds_gemm {
            bufs.push((layout.d_bytes() + 2 * layout.rs_d(), true));
        }
        bufs
    }

    /// Region 1 of a shard as another GEMM on the same tiles sees it
    /// ([`GemmCosts::joint`]): its element-exclusive buffers
    /// ([`GemmCosts::region1_buffers`]) each rounded up to whole elements,
    /// its other buffers, and no scratch phase (a whole-K GEMM keeps every
    /// buffer for the whole program).
    pub fn joint_of(&self, layout: &ShardLayout) -> (u64, u64, u64) {
        let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
        let (mut exclusive, mut shared) = (0, 0);
        for (bytes, own_elements) in self.region1_buffers(layout) {
            if own_elements {
                exclusive += (bytes as u64).div_ceil(element) * element;
            } else {
                shared += bytes as u64;
            }
        }
        (exclusive, shared, 0)
    }
}

impl GemmCosts {
    /// (slowest GEMM vertex, slowest reduce vertex or 0) of a split.
    pub fn split_cycles(&mut self, g: &GemmGeometry, split: &WorkerSplit) -> (u64, u64) {
        let mut gemm = 0;
        let mut reduce = 0;
        for r in &split.row_groups {
            for c in &split.col_groups {
                for k in &split.k_groups {
                    gemm = gemm.max(self.gemm.eval(&[
                        ("M", (r.1 - r.0) as i64),
                        ("NCB", (c.1 - c.0) as i64),
                        ("NKB", (k.1 - k.0) as i64),
                    ]));
                }
            }
        }
        if g.needs_reduce(split.k_groups.len()) {
            if let Some(f) = self.reduce.as_mut() {
                for (_, r, c) in split.reduce_parts() {
                    reduce = reduce.max(f.eval(&[
                        ("ROWS", (r.1 - r.0) as i64),
                        ("QUADS", 4 * (c.1 - c.0) as i64),
                        ("P", split.k_groups.len() as i64),
                    ]));
                }
            }
        }
        (gemm, reduce)
    }
}

/// The worker split of a `rows` x `col_blocks` shard with the fewest
/// estimated cycles (slowest GEMM vertex + slowest reduce vertex), ties
/// broken by fewer vertices, among the splits whose buffers fit the memory
/// budget (`None` if none does). K groups (split-K over workers) are tried
/// only with f32 accumulation, whose partials the reduce step sums.
pub fn best_split(
    g: &GemmGeometry,
    rows: u32,
    col_blocks: u32,
    costs: &mut GemmCosts,
) -> Option<(WorkerSplit, u64, u64)> {
    best_split_with(g, rows, col_blocks, costs, u32::MAX)
}

/// [`best_split`] with at most `max_k_groups` K groups (1 when the reduce
/// step sums partials of other tiles instead).
pub fn best_split_with(
    g: &GemmGeometry,
    rows: u32,
    col_blocks: u32,
    costs: &mut GemmCosts,
    max_k_groups: u32,
) -> Option<(WorkerSplit, u64, u64)> {
    let mut best: Option<((u64, usize), WorkerSplit, u64, u64)> = None;
    let workers = ipu_arch::WORKER_CONTEXTS;
    for cg in 1..=col_blocks.min(workers) {
        for rg in 1..=rows.min(workers / cg) {
            let max_kg = if (g.acc32 || g.reduce_f16) && costs.reduce.is_some() {
                g.nkb().min(workers / (cg * rg)).min(max_k_groups)
            } else {
                1
            };
            for kg in g.min_k_groups()..=max_kg {
                let split = WorkerSplit {
                    row_groups: ranges(rows, rg),
                    col_groups: ranges(col_blocks, cg),
                    k_groups: ranges(g.nkb(), kg),
                };
                let layout = ShardLayout::new(g, rows, col_blocks, &split);
                if costs
                    .region1_bytes(&layout)
                    .is_none_or(|b| b > costs.memory_budget)
                    || costs.b_cap.is_some_and(|cap| layout.b_bytes() as u64 > cap)
                {
                    continue;
                }
                let (gemm, reduce) = costs.split_cycles(g, &split);
                let key = (gemm + reduce, split.vertices());
                if best.as_ref().is_none_or(|(k, ..)| key < *k) {
                    best = Some((key, split, gemm, reduce));
                }
            }
        }
    }
    best.map(|(_, split, gemm, reduce)| (split, gemm, reduce))
}

/// [`best_split_with`]'s results within one search, whose costs do not
/// change while the memo lives (a search's candidates share a few thousand
/// shard sizes: SigLIP's MLP asked for 605,436 splits). Shared by the
/// search's threads: a result is a pure function of its key, so which
/// thread computes it first does not matter.
#[derive(Default)]
pub struct SplitMemo(std::sync::Mutex<HashMap<SplitKey, BestSplit>>);

/// (geometry, rows, column blocks, most K groups).
type SplitKey = (GemmGeometry, u32, u32, u32);
/// What [`best_split_with`] returns.
type BestSplit = Option<(WorkerSplit, u64, u64)>;

impl SplitMemo {
    /// [`best_split_with`], computed once per geometry and shard.
    pub fn best_split_with(
        &self,
        g: &GemmGeometry,
        rows: u32,
        col_blocks: u32,
        costs: &mut GemmCosts,
        max_k_groups: u32,
    ) -> BestSplit {
        let key = (*g, rows, col_blocks, max_k_groups);
        if let Some(hit) = self.0.lock().expect("not poisoned").get(&key) {
            return hit.clone();
        }
        // Computed outside the lock: another thread may compute the same
        // key meanwhile, with the same result.
        let split = best_split_with(g, rows, col_blocks, costs, max_k_groups);
        self.0
            .lock()
            .expect("not poisoned")
            .insert(key, split.clone());
        split
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(acc32: bool) -> GemmCosts {
        GemmCosts::new(
            FormulaCost::new(if acc32 {
                "6 * (22 + NCB * (15 + NKB * (8 * M + 47)))".into()
            } else {
                "6 * (22 + NCB * (14 + NKB * (4 * M + 43)))".into()
            }),
            acc32.then(|| FormulaCost::new("6 * (8 + ROWS * (3 + QUADS * (2 * P + 7)))".into())),
        )
    }

    fn geometry(m: u32, k: u32, n: u32, acc32: bool) -> GemmGeometry {
        GemmGeometry {
            m,
            k,
            n,
            acc32,
            f16_result: true,
            row_align: 1,
            fp8_scale: None,
            f32_operands: false,
            reduce_f16: false,
            max_chain_blocks: u32::MAX,
            f32_reduce_step: false,
        }
    }

    #[test]
    fn aligned_reduce_parts_cover_each_row_once() {
        for rows in [1u32, 3, 5, 22, 57, 61, 122] {
            for (rg, cg) in [(1u32, 1u32), (2, 1), (1, 2), (3, 2), (6, 1)] {
                let split = WorkerSplit {
                    row_groups: ranges(rows, rg),
                    col_groups: ranges(12, cg),
                    k_groups: vec![(0, 4)],
                };
                for align in [1, 4] {
                    let parts = split.reduce_parts_aligned(align);
                    let mut seen = vec![0u32; (rows * 12) as usize];
                    for &(gi, (a, b), (c0, c1)) in &parts {
                        let (g0, g1) = split.row_groups[gi];
                        assert!(g0 <= a && b <= g1, "{parts:?}");
                        assert!(a == g0 || a % align == 0, "{parts:?}");
                        for r in a..b {
                            for c in c0..c1 {
                                seen[(r * 12 + c) as usize] += 1;
                            }
                        }
                    }
                    assert!(
                        seen.iter().all(|&n| n == 1),
                        "{rows} rows, {rg} x {cg}, align {align}"
                    );
                }
                assert_eq!(split.reduce_parts(), split.reduce_parts_aligned(1));
            }
        }
    }

    #[test]
    fn ranges_cover_and_balance() {
        assert_eq!(ranges(10, 3), vec![(0, 3), (3, 6), (6, 10)]);
        assert_eq!(ranges(2, 4), vec![(0, 1), (1, 2)]);
        assert_eq!(
            aligned_ranges(729, 4, 2),
            vec![(0, 182), (182, 364), (364, 546), (546, 729)]
        );
        assert_eq!(aligned_ranges(5, 4, 2), vec![(0, 2), (2, 4), (4, 5)]);
    }

    /// The search's sizes of a partition are those of the ranges the
    /// lowering cuts, for every small case and aligned or not.
    #[test]
    fn part_sizes_without_cutting_match_the_ranges() {
        for align in [0, 1, 2, 3, 16] {
            for n in 0..200 {
                for parts in 0..230 {
                    let cut = PartSizes::of_ranges(&aligned_ranges(n, parts, align));
                    assert_eq!(
                        PartSizes::aligned(n, parts, align),
                        cut,
                        "n {n}, parts {parts}, align {align}"
                    );
                }
            }
        }
        // Near the largest products the stepping must not overflow.
        let big = PartSizes::aligned(u32::MAX, 1472, 2);
        assert_eq!(
            big,
            PartSizes::of_ranges(&aligned_ranges(u32::MAX, 1472, 2))
        );
    }

    #[test]
    fn splits_prefer_balance() {
        let g = geometry(33, 48, 32, false);
        let (s, _, _) = best_split(&g, 33, 2, &mut costs(false)).unwrap();
        assert_eq!(s.vertices(), 6);
        assert_eq!(s.col_groups.len(), 2);
        let (s, _, _) =
            best_split(&geometry(100, 48, 192, false), 100, 12, &mut costs(false)).unwrap();
        assert_eq!((s.row_groups.len(), s.col_groups.len()), (1, 6));
        let (s, _, _) = best_split(&geometry(1, 16, 16, false), 1, 1, &mut costs(false)).unwrap();
        assert_eq!(s.vertices(), 1);
    }

    #[test]
    fn long_reductions_split_k_over_workers() {
        // 36 rows, one column block, K = 1152: splitting rows over six
        // workers reloads every weight block six times; splitting K does not.
        let g = geometry(36, 1152, 16, true);
        let (s, gemm, reduce) = best_split(&g, 36, 1, &mut costs(true)).unwrap();
        assert_eq!((s.row_groups.len(), s.k_groups.len()), (1, 6), "{s:?}");
        assert!(reduce > 0 && gemm > reduce);
    }

    #[test]
    fn bounded_f16_chains_force_k_groups() {
        // f16 accumulation of K = 1152 in chains of at most 16 blocks: at
        // least five K groups, whatever would be fastest otherwise.
        let mut g = geometry(60, 1152, 32, false);
        g.reduce_f16 = true;
        g.max_chain_blocks = 16;
        let mut c = costs(false);
        c.reduce = Some(FormulaCost::new(
            "6 * (8 + ROWS * (3 + QUADS * (2 * P + 7)))".into(),
        ));
        let (s, _, _) = best_split(&g, 60, 2, &mut c).unwrap();
        assert!(s.k_groups.len() >= 5, "{s:?}");
        assert!(s.k_groups.iter().all(|k| k.1 - k.0 <= 16), "{s:?}");
        // A chain bound no split can meet (more groups than workers).
        g.max_chain_blocks = 8;
        assert!(best_split(&g, 60, 2, &mut c).is_none());
    }
}
