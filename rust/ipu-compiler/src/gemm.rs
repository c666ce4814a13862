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

use std::collections::BTreeMap;

/// Bytes of the zero header at the start of each C buffer.
pub const C_HEADER: u32 = 16;

/// Sizes of one GEMM `[m, k] x [k, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmGeometry {
    pub m: u32,
    pub k: u32,
    pub n: u32,
    /// f32 accumulation (the kernel's ACC=32 specialisation).
    pub acc32: bool,
    /// f32 accumulation converted to an f16 result by a cast step.
    pub cast_f16: bool,
}

impl GemmGeometry {
    /// K padded to the AMP's 16.
    pub fn kp(&self) -> u32 {
        self.k.div_ceil(16) * 16
    }
    pub fn nkb(&self) -> u32 {
        self.k.div_ceil(16)
    }
    pub fn ncb(&self) -> u32 {
        self.n.div_ceil(16)
    }
    /// Bytes of one element of the result the host reads.
    pub fn result_bytes(&self) -> u32 {
        if self.acc32 && !self.cast_f16 {
            4
        } else {
            2
        }
    }
    /// Bytes of one element of the GEMM's C buffers.
    pub fn out_bytes(&self) -> u32 {
        if self.acc32 {
            4
        } else {
            2
        }
    }
    /// Multiply-accumulates of the whole product.
    pub fn macs(&self) -> u64 {
        self.m as u64 * self.k as u64 * self.n as u64
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

/// How a tile's shard is shared by its workers: every (row group, column
/// group) pair is one vertex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSplit {
    /// Tile-local row ranges.
    pub row_groups: Vec<(u32, u32)>,
    /// Tile-local column-block ranges.
    pub col_groups: Vec<(u32, u32)>,
}

impl WorkerSplit {
    pub fn vertices(&self) -> usize {
        self.row_groups.len() * self.col_groups.len()
    }
}

/// The tile-local layout of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub rows: u32,
    pub col_blocks: u32,
    pub row_groups: u32,
    pub rs_a: u32,
    pub rs_b: u32,
    pub rs_c: u32,
    pub kp: u32,
}

impl ShardLayout {
    pub fn new(g: &GemmGeometry, rows: u32, col_blocks: u32, row_groups: u32) -> ShardLayout {
        ShardLayout {
            rows,
            col_blocks,
            row_groups,
            rs_a: g.kp() * 2,
            rs_b: col_blocks * 32,
            rs_c: col_blocks * 16 * g.out_bytes(),
            kp: g.kp(),
        }
    }
    pub fn a_bytes(&self) -> u32 {
        (self.rows + 2) * self.rs_a
    }
    pub fn b_bytes(&self) -> u32 {
        self.kp * self.rs_b
    }
    /// The f16 result of a cast step: rows of `16 * col_blocks` f16, compact.
    pub fn d_bytes(&self) -> u32 {
        self.rows * self.rs_d()
    }
    pub fn rs_d(&self) -> u32 {
        self.col_blocks * 32
    }
    pub fn c_bytes(&self) -> u32 {
        C_HEADER + (self.rows + 2 * self.row_groups + 2) * self.rs_c
    }
    /// Byte offset in a C buffer of tile-local row `r`, which belongs to row group `g`.
    pub fn c_row(&self, g: u32, r: u32) -> u32 {
        C_HEADER + (r + 2 * (g + 1)) * self.rs_c
    }
}

/// Evaluates a per-vertex cycle cost for (rows, column blocks, K blocks).
pub trait VertexCost {
    fn cycles(&mut self, m: u32, ncb: u32, nkb: u32) -> u64;
}

/// A memo over a kernel's declared formula.
pub struct FormulaCost {
    pub formula: String,
    pub memo: BTreeMap<Vec<i64>, u64>,
}

impl FormulaCost {
    pub fn new(formula: String) -> FormulaCost {
        FormulaCost {
            formula,
            memo: BTreeMap::new(),
        }
    }

    /// The formula's value for `vars` (never negative).
    pub fn eval(&mut self, vars: &[(&str, i64)]) -> u64 {
        let key: Vec<i64> = vars.iter().map(|v| v.1).collect();
        let formula = &self.formula;
        *self.memo.entry(key).or_insert_with(|| {
            let vars: BTreeMap<&str, i64> = vars.iter().copied().collect();
            // The formula was checked when the kernel was loaded.
            crate::formula::evaluate(formula, &vars)
                .unwrap_or(i64::MAX)
                .max(0) as u64
        })
    }
}

impl VertexCost for FormulaCost {
    fn cycles(&mut self, m: u32, ncb: u32, nkb: u32) -> u64 {
        self.eval(&[("M", m as i64), ("NCB", ncb as i64), ("NKB", nkb as i64)])
    }
}

/// The slowest cast vertex of a split (the same split as the GEMM's).
pub fn cast_cycles(split: &WorkerSplit, cost: &mut FormulaCost) -> u64 {
    split
        .row_groups
        .iter()
        .flat_map(|r| split.col_groups.iter().map(move |c| (r, c)))
        .map(|(r, c)| {
            cost.eval(&[
                ("ROWS", (r.1 - r.0) as i64),
                ("QUADS", 4 * (c.1 - c.0) as i64),
            ])
        })
        .max()
        .unwrap_or(0)
}

/// The worker split of a `rows` x `col_blocks` shard with the fewest
/// estimated cycles (the slowest vertex), ties broken by fewer vertices.
pub fn best_split(
    rows: u32,
    col_blocks: u32,
    nkb: u32,
    cost: &mut dyn VertexCost,
) -> (WorkerSplit, u64) {
    let mut best: Option<(u64, usize, WorkerSplit)> = None;
    for cg in 1..=col_blocks.min(6) {
        for rg in 1..=rows.min(6 / cg) {
            let split = WorkerSplit {
                row_groups: ranges(rows, rg),
                col_groups: ranges(col_blocks, cg),
            };
            let slowest = split
                .row_groups
                .iter()
                .flat_map(|r| split.col_groups.iter().map(move |c| (r, c)))
                .map(|(r, c)| cost.cycles(r.1 - r.0, c.1 - c.0, nkb))
                .max()
                .unwrap_or(0);
            let key = (slowest, split.vertices());
            if best.as_ref().is_none_or(|(c, v, _)| key < (*c, *v)) {
                best = Some((slowest, split.vertices(), split));
            }
        }
    }
    let (cycles, _, split) = best.expect("a shard has at least one row and one column block");
    (split, cycles)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Linear;
    impl VertexCost for Linear {
        fn cycles(&mut self, m: u32, ncb: u32, nkb: u32) -> u64 {
            6 * (14 + ncb as u64 * (9 + nkb as u64 * (4 * m as u64 + 51)))
        }
    }

    #[test]
    fn ranges_cover_and_balance() {
        assert_eq!(ranges(10, 3), vec![(0, 3), (3, 6), (6, 10)]);
        assert_eq!(ranges(2, 4), vec![(0, 1), (1, 2)]);
    }

    #[test]
    fn splits_prefer_balance() {
        let (s, _) = best_split(33, 2, 3, &mut Linear);
        assert_eq!(s.vertices(), 6);
        assert_eq!(s.col_groups.len(), 2);
        let (s, _) = best_split(100, 12, 3, &mut Linear);
        assert_eq!((s.row_groups.len(), s.col_groups.len()), (1, 6));
        let (s, _) = best_split(1, 1, 1, &mut Linear);
        assert_eq!(s.vertices(), 1);
    }
}
