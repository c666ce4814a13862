//! Phase `map_tiles`: which physical tile holds which shard.
//!
//! Shards of one operation are numbered row part major; the mapping assigns
//! them to consecutive tiles from 0. No permutation is screened: under the
//! machine model an exchange costs the same whichever tiles talk (no
//! topology; a tile's send to itself holds both of its ports like any
//! other transfer), so relabelling tiles cannot shorten a phase. Where a
//! tile can use bytes it already holds without a transfer, the lowering
//! places them (weight homes in their readers' order, resident B;
//! docs/compiler.md, "Not yet").

use crate::plan::GemmPlan;

/// One shard of a GEMM and its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardOnTile {
    pub tile: u32,
    pub row_part: u32,
    pub col_part: u32,
    /// The K part (0 unless a streamed plan splits K over tiles).
    pub k_part: u32,
}

/// Shard `(i, j)` goes to tile `i * col_parts + j`; with K split over
/// `k` tiles (a streamed plan), shard `(i, j, l)` goes to tile
/// `(i * col_parts + j) * k + l`, the tiles that sum one block side by side.
pub fn map_gemm(plan: &GemmPlan) -> Vec<ShardOnTile> {
    let k = k_parts(plan);
    let mut out = Vec::with_capacity((plan.row_parts * plan.col_parts * k) as usize);
    for i in 0..plan.row_parts {
        for j in 0..plan.col_parts {
            for l in 0..k {
                out.push(ShardOnTile {
                    tile: (i * plan.col_parts + j) * k + l,
                    row_part: i,
                    col_part: j,
                    k_part: l,
                });
            }
        }
    }
    out
}

fn k_parts(plan: &GemmPlan) -> u32 {
    plan.stream.map_or(1, |s| s.k_parts)
}

/// Checks a mapping: every shard once, tiles distinct and below `tiles`.
pub fn verify(plan: &GemmPlan, map: &[ShardOnTile], tiles: u32) -> Result<(), String> {
    let mut seen_tiles = std::collections::BTreeSet::new();
    let mut seen_shards = std::collections::BTreeSet::new();
    for s in map {
        if s.tile >= tiles {
            return Err(format!(
                "shard ({}, {}) on tile {} beyond {tiles} tiles",
                s.row_part, s.col_part, s.tile
            ));
        }
        if !seen_tiles.insert(s.tile) {
            return Err(format!("tile {} holds two shards", s.tile));
        }
        if s.row_part >= plan.row_parts
            || s.col_part >= plan.col_parts
            || s.k_part >= k_parts(plan)
            || !seen_shards.insert((s.row_part, s.col_part, s.k_part))
        {
            return Err(format!(
                "shard ({}, {}, {}) is invalid or mapped twice",
                s.row_part, s.col_part, s.k_part
            ));
        }
    }
    let shards = plan.row_parts * plan.col_parts * k_parts(plan);
    if seen_shards.len() as u32 != shards {
        return Err(format!("{} of {shards} shards mapped", seen_shards.len()));
    }
    Ok(())
}
