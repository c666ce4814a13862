//! Phase `map_tiles`: which physical tile holds which shard.
//!
//! Shards of one operation are numbered row part major; the mapping assigns
//! them to consecutive tiles from 0. With no exchange between shards (K is
//! whole on each tile) the mapping affects nothing but the host placements;
//! when operations exchange data, this is where mappings get screened by
//! exchange load, as the seed's stack does.

use crate::plan::GemmPlan;

/// One shard of a GEMM and its tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardOnTile {
    pub tile: u32,
    pub row_part: u32,
    pub col_part: u32,
}

/// Shard `(i, j)` goes to tile `i * col_parts + j`.
pub fn map_gemm(plan: &GemmPlan) -> Vec<ShardOnTile> {
    let mut out = Vec::with_capacity((plan.row_parts * plan.col_parts) as usize);
    for i in 0..plan.row_parts {
        for j in 0..plan.col_parts {
            out.push(ShardOnTile {
                tile: i * plan.col_parts + j,
                row_part: i,
                col_part: j,
            });
        }
    }
    out
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
            || !seen_shards.insert((s.row_part, s.col_part))
        {
            return Err(format!(
                "shard ({}, {}) is invalid or mapped twice",
                s.row_part, s.col_part
            ));
        }
    }
    if seen_shards.len() as u32 != plan.row_parts * plan.col_parts {
        return Err(format!(
            "{} of {} shards mapped",
            seen_shards.len(),
            plan.row_parts * plan.col_parts
        ));
    }
    Ok(())
}
