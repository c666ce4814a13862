//! Phase `place_storage`: addresses of every buffer on every tile, and the
//! independent validator of the result.
//!
//! Tile memory map:
//! - region 0 from its base: the linked code and vertex states (their size
//!   comes from a dry-run link of the tile program), then standard-memory
//!   buffers;
//! - the last 16 bytes of region 0: the host command word
//!   ([`COMMAND_ADDRESS`]), the same address on every tile;
//! - region 1: first the buffers that need memory elements of their own
//!   (operands of one `ld2x64st64`: its loads and its store must hit
//!   different 32 KiB elements), each starting on an element boundary, then
//!   the other interleaved buffers.
//!
//! All buffers live for the whole program (no reuse across operations yet),
//! so there are no lifetimes to check beyond disjointness.

use crate::error::CompileError;
use crate::lower::{BufferSpec, RegionReq};
use ipu_arch::{
    Region, INTERLEAVED_ELEMENT_BYTES, REGION0_BASE, REGION0_END, REGION1_BASE, REGION1_END,
};

/// The host command word (docs/host-protocol.md).
pub const COMMAND_ADDRESS: u32 = REGION0_END - 16;
/// Bytes reserved at the top of region 0 for the command word.
pub const COMMAND_RESERVE: u32 = 16;

/// Where a tile's buffers went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileStorage {
    pub tile: u32,
    /// Code and vertex states: `[REGION0_BASE, code_end)`.
    pub code_end: u32,
    /// Address of each buffer, indexed like the tile's buffer list.
    pub addresses: Vec<u32>,
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Bytes of region 1 used by `buffers` = (bytes, needs own elements),
/// allocated as [`place`] does, or `None` if they do not fit.
pub fn region1_footprint(buffers: &[(u32, bool)]) -> Option<u64> {
    let mut cursor = REGION1_BASE as u64;
    for &(bytes, exclusive) in buffers.iter().filter(|b| b.1) {
        let _ = exclusive;
        cursor = align_up(cursor, INTERLEAVED_ELEMENT_BYTES as u64) + bytes as u64;
    }
    for &(bytes, _) in buffers.iter().filter(|b| !b.1) {
        cursor = align_up(cursor, 16) + bytes as u64;
    }
    (cursor <= REGION1_END as u64).then_some(cursor - REGION1_BASE as u64)
}

/// Places `buffers` on `tile` after `code_bytes` of code and states.
pub fn place(
    tile: u32,
    buffers: &[BufferSpec],
    code_bytes: u32,
) -> Result<TileStorage, CompileError> {
    let mut addresses = vec![0u32; buffers.len()];
    let code_end = align_up(REGION0_BASE as u64 + code_bytes as u64, 16);
    let r0_limit = (COMMAND_ADDRESS) as u64;
    let overflow =
        |region: &'static str, needed: u64, available: u64, which: &dyn Fn(&BufferSpec) -> bool| {
            let mut largest: Vec<(String, u64)> = buffers
                .iter()
                .filter(|b| which(b))
                .map(|b| (b.name.clone(), b.bytes as u64))
                .collect();
            if region == "region 0 (standard)" {
                largest.push(("code and vertex states".into(), code_bytes as u64));
            }
            largest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            largest.truncate(5);
            CompileError::OutOfMemory {
                tile,
                region,
                needed,
                available,
                largest,
            }
        };
    if code_end > r0_limit {
        return Err(overflow(
            "region 0 (standard)",
            code_end - REGION0_BASE as u64,
            r0_limit - REGION0_BASE as u64,
            &|b| b.region == RegionReq::Standard,
        ));
    }
    // Region 1: element-exclusive buffers on element boundaries, then the rest.
    let mut r1 = REGION1_BASE as u64;
    let mut r0 = code_end;
    for (i, b) in buffers.iter().enumerate() {
        if b.region == RegionReq::Interleaved && b.exclusive_element {
            let start = align_up(r1, INTERLEAVED_ELEMENT_BYTES as u64);
            addresses[i] = start as u32;
            r1 = start + b.bytes as u64;
        }
    }
    for (i, b) in buffers.iter().enumerate() {
        if b.region == RegionReq::Interleaved && !b.exclusive_element {
            let start = align_up(r1, b.align as u64);
            addresses[i] = start as u32;
            r1 = start + b.bytes as u64;
        }
    }
    if r1 > REGION1_END as u64 {
        return Err(overflow(
            "region 1 (interleaved)",
            r1 - REGION1_BASE as u64,
            (REGION1_END - REGION1_BASE) as u64,
            &|b| b.region == RegionReq::Interleaved,
        ));
    }
    for (i, b) in buffers.iter().enumerate() {
        if matches!(b.region, RegionReq::Standard | RegionReq::Any) {
            let start = align_up(r0, b.align as u64);
            addresses[i] = start as u32;
            r0 = start + b.bytes as u64;
        }
    }
    if r0 > r0_limit {
        return Err(overflow(
            "region 0 (standard)",
            r0 - REGION0_BASE as u64,
            r0_limit - REGION0_BASE as u64,
            &|b| matches!(b.region, RegionReq::Standard | RegionReq::Any),
        ));
    }
    Ok(TileStorage {
        tile,
        code_end: code_end as u32,
        addresses,
    })
}

/// Checks a placement independently of how [`place`] computed it: every
/// buffer inside SRAM and its region, aligned, disjoint from the others, the
/// code and the command word; element-exclusive buffers in pairwise disjoint
/// memory elements.
pub fn validate(storage: &TileStorage, buffers: &[BufferSpec]) -> Result<(), String> {
    let t = storage.tile;
    if storage.addresses.len() != buffers.len() {
        return Err(format!(
            "tile {t}: {} addresses for {} buffers",
            storage.addresses.len(),
            buffers.len()
        ));
    }
    let mut spans: Vec<(u64, u64, String)> = vec![
        (
            REGION0_BASE as u64,
            storage.code_end as u64,
            "code and vertex states".into(),
        ),
        (
            COMMAND_ADDRESS as u64,
            (COMMAND_ADDRESS + COMMAND_RESERVE) as u64,
            "host command word".into(),
        ),
    ];
    for (b, &a) in buffers.iter().zip(&storage.addresses) {
        let end = a as u64 + b.bytes as u64;
        if b.bytes == 0 {
            return Err(format!("tile {t}: buffer `{}` is empty", b.name));
        }
        let region = Region::of(a)
            .ok_or_else(|| format!("tile {t}: buffer `{}` at {a:#x} is outside SRAM", b.name))?;
        if end > region.range().end as u64 {
            return Err(format!(
                "tile {t}: buffer `{}` at {a:#x}..{end:#x} crosses the end of {region:?} memory",
                b.name
            ));
        }
        let want = match b.region {
            RegionReq::Interleaved => Some(Region::Interleaved),
            RegionReq::Standard => Some(Region::Standard),
            RegionReq::Any => None,
        };
        if want.is_some_and(|w| w != region) {
            return Err(format!(
                "tile {t}: buffer `{}` at {a:#x} is in {region:?} memory, not {:?}",
                b.name, b.region
            ));
        }
        if a % b.align != 0 {
            return Err(format!(
                "tile {t}: buffer `{}` at {a:#x} is not {}-aligned",
                b.name, b.align
            ));
        }
        spans.push((a as u64, end, format!("buffer `{}`", b.name)));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(format!(
                "tile {t}: {} ({:#x}..{:#x}) overlaps {} ({:#x}..{:#x})",
                w[0].2, w[0].0, w[0].1, w[1].2, w[1].0, w[1].1
            ));
        }
    }
    let elements = |a: u32, bytes: u32| {
        let first = (a - REGION1_BASE) / INTERLEAVED_ELEMENT_BYTES;
        let last = (a + bytes - 1 - REGION1_BASE) / INTERLEAVED_ELEMENT_BYTES;
        first..=last
    };
    let exclusive: Vec<(&BufferSpec, u32)> = buffers
        .iter()
        .zip(storage.addresses.iter().copied())
        .filter(|(b, _)| b.exclusive_element)
        .collect();
    for (i, &(b1, a1)) in exclusive.iter().enumerate() {
        if Region::of(a1) != Some(Region::Interleaved) {
            return Err(format!(
                "tile {t}: buffer `{}` needs its own interleaved elements but is at {a1:#x}",
                b1.name
            ));
        }
        for &(b2, a2) in &exclusive[i + 1..] {
            let (e1, e2) = (elements(a1, b1.bytes), elements(a2, b2.bytes));
            if e1.start() <= e2.end() && e2.start() <= e1.end() {
                return Err(format!(
                    "tile {t}: buffers `{}` (elements {e1:?}) and `{}` (elements {e2:?}) share an interleaved memory element",
                    b1.name, b2.name
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(name: &str, bytes: u32, region: RegionReq, exclusive: bool) -> BufferSpec {
        BufferSpec {
            name: name.into(),
            bytes,
            align: 16,
            region,
            exclusive_element: exclusive,
            zero: vec![],
            category: "test".into(),
        }
    }

    #[test]
    fn places_and_validates() {
        let bufs = vec![
            buf("a", 40_000, RegionReq::Interleaved, true),
            buf("c0", 100, RegionReq::Interleaved, true),
            buf("b", 5000, RegionReq::Interleaved, false),
            buf("s", 64, RegionReq::Standard, false),
        ];
        let s = place(3, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        assert_eq!(s.addresses[0], REGION1_BASE);
        assert_eq!(s.addresses[1], REGION1_BASE + 2 * INTERLEAVED_ELEMENT_BYTES);
        // The validator catches what a broken placer would do.
        let mut bad = s.clone();
        bad.addresses[1] = REGION1_BASE + 40_000 + 16;
        assert!(validate(&bad, &bufs)
            .unwrap_err()
            .contains("share an interleaved memory element"));
        let mut bad = s.clone();
        bad.addresses[2] = bad.addresses[1] + 16;
        assert!(validate(&bad, &bufs).unwrap_err().contains("overlaps"));
        let mut bad = s.clone();
        bad.addresses[3] = REGION0_BASE + 16;
        assert!(validate(&bad, &bufs).unwrap_err().contains("overlaps"));
        let mut bad = s;
        bad.addresses[0] = REGION0_BASE + 0x4000;
        assert!(validate(&bad, &bufs)
            .unwrap_err()
            .contains("not Interleaved"));
    }

    #[test]
    fn out_of_memory_names_tile_and_consumers() {
        let bufs = vec![
            buf("big_a", 300_000, RegionReq::Interleaved, true),
            buf("big_c", 200_000, RegionReq::Interleaved, true),
        ];
        let e = place(7, &bufs, 1000).unwrap_err().to_string();
        assert!(e.starts_with("tile 7: region 1 (interleaved) needs"), "{e}");
        assert!(e.contains("big_a 300000 B; big_c 200000 B;"), "{e}");
    }
}
