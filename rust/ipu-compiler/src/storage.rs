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
//! Buffers live for the whole program unless they are scratch buffers of a
//! phase of the run call ([`BufferSpec::scratch`]): the phases run one after
//! the other, so their region-1 buffers share one area above the persistent
//! ones, and the validator allows overlap only between different phases.

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
    // Region 1: the buffers live for the whole program (element-exclusive
    // ones on element boundaries, then the rest); then, from the next
    // element boundary, each scratch phase's buffers the same way, every
    // phase starting at that boundary (phases never run at the same time).
    let mut r0 = code_end;
    let place_set = |from: u64, which: &dyn Fn(&BufferSpec) -> bool, addresses: &mut Vec<u32>| {
        let mut r1 = from;
        for (i, b) in buffers.iter().enumerate() {
            if b.region == RegionReq::Interleaved && b.exclusive_element && which(b) {
                let start = align_up(r1, INTERLEAVED_ELEMENT_BYTES as u64);
                addresses[i] = start as u32;
                r1 = start + b.bytes as u64;
            }
        }
        for (i, b) in buffers.iter().enumerate() {
            if b.region == RegionReq::Interleaved && !b.exclusive_element && which(b) {
                let start = align_up(r1, b.align as u64);
                addresses[i] = start as u32;
                r1 = start + b.bytes as u64;
            }
        }
        r1
    };
    let mut r1 = place_set(
        REGION1_BASE as u64,
        &|b| b.scratch.is_none() && b.lifetime.is_none(),
        &mut addresses,
    );
    // Above the persistent buffers: per segment lifetime (`None` for a
    // program without segments), the segment's own buffers, then each of
    // its scratch phases from the next element boundary; segments never
    // run at the same time, so they all start at the same base.
    let lifetimes: std::collections::BTreeSet<Option<u32>> =
        buffers.iter().map(|b| b.lifetime).collect();
    let scratch_base = align_up(r1, INTERLEAVED_ELEMENT_BYTES as u64);
    let mut worst: Option<(Option<u32>, Option<u32>)> = None;
    for &life in &lifetimes {
        let own = match life {
            Some(_) => place_set(
                scratch_base,
                &|b| b.lifetime == life && b.scratch.is_none(),
                &mut addresses,
            ),
            None => scratch_base,
        };
        if own > r1 {
            r1 = own;
            worst = Some((life, None));
        }
        let phase_base = align_up(own, INTERLEAVED_ELEMENT_BYTES as u64);
        let phases: std::collections::BTreeSet<u32> = buffers
            .iter()
            .filter(|b| b.lifetime == life)
            .filter_map(|b| b.scratch)
            .collect();
        for &p in &phases {
            let end = place_set(
                phase_base,
                &|b| b.lifetime == life && b.scratch == Some(p),
                &mut addresses,
            );
            if end > r1 {
                r1 = end;
                worst = Some((life, Some(p)));
            }
        }
    }
    if r1 > REGION1_END as u64 {
        return Err(overflow(
            "region 1 (interleaved)",
            r1 - REGION1_BASE as u64,
            (REGION1_END - REGION1_BASE) as u64,
            &|b| {
                b.region == RegionReq::Interleaved
                    && ((b.scratch.is_none() && b.lifetime.is_none())
                        || worst.is_some_and(|(life, phase)| {
                            b.lifetime == life && (b.scratch.is_none() || b.scratch == phase)
                        }))
            },
        ));
    }
    // Region 0: the standard buffers and, in buffer order, every buffer
    // that may go anywhere while region 0 has room for it; the others of
    // those follow the interleaved ones in region 1 (a streamed GEMM's
    // operand homes can exceed region 0).
    // Standard bytes still to place after each buffer: an anywhere buffer
    // never takes the room a later standard one needs.
    let mut standard_after = vec![0u64; buffers.len()];
    let mut acc = 0u64;
    for (i, b) in buffers.iter().enumerate().rev() {
        standard_after[i] = acc;
        if b.region == RegionReq::Standard {
            acc += align_up(b.bytes as u64, b.align as u64) + b.align as u64;
        }
    }
    let mut r0_full = false;
    for (i, b) in buffers.iter().enumerate() {
        let any = b.region == RegionReq::Any;
        if !any && b.region != RegionReq::Standard {
            continue;
        }
        let start = align_up(r0, b.align as u64);
        let spill = any && (r0_full || start + b.bytes as u64 + standard_after[i] > r0_limit);
        if spill && align_up(r1, b.align as u64) + b.bytes as u64 <= REGION1_END as u64 {
            r0_full = true;
            let start = align_up(r1, b.align as u64);
            addresses[i] = start as u32;
            r1 = start + b.bytes as u64;
            continue;
        }
        addresses[i] = start as u32;
        r0 = start + b.bytes as u64;
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

/// A buffer's (segment lifetime, scratch phase).
type Liveness = (Option<u32>, Option<u32>);

/// Whether buffers with these liveness pairs are never live at the same time.
fn never_together(a: Liveness, b: Liveness) -> bool {
    let segments = matches!((a.0, b.0), (Some(x), Some(y)) if x != y);
    let phases = matches!((a.1, b.1), (Some(x), Some(y)) if x != y);
    segments || phases
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
    // Scratch buffers: region 1 only, nothing zero at load; buffers of one
    // segment: nothing zero at load.
    for b in buffers.iter().filter(|b| b.scratch.is_some()) {
        if b.region != RegionReq::Interleaved || !b.zero.is_empty() {
            return Err(format!(
                "tile {t}: scratch buffer `{}` must be in interleaved memory and have no zero-at-load ranges",
                b.name
            ));
        }
    }
    for b in buffers.iter().filter(|b| b.lifetime.is_some()) {
        if !b.zero.is_empty() {
            return Err(format!(
                "tile {t}: buffer `{}` lives in one segment and must have no zero-at-load ranges",
                b.name
            ));
        }
    }
    // Two spans conflict unless they are never live together: buffers of
    // different segments, or scratch buffers of different phases.
    let mut spans: Vec<(u64, u64, String, Liveness)> = spans
        .into_iter()
        .map(|(a, e, n)| (a, e, n, (None, None)))
        .collect();
    for (i, b) in buffers.iter().enumerate() {
        if b.scratch.is_some() || b.lifetime.is_some() {
            let a = storage.addresses[i] as u64;
            let pos = spans
                .iter()
                .position(|s| s.0 == a && s.2 == format!("buffer `{}`", b.name))
                .expect("every buffer has its span");
            spans[pos].3 = (b.lifetime, b.scratch);
        }
    }
    spans.sort();
    for (i, x) in spans.iter().enumerate() {
        for y in &spans[i + 1..] {
            if y.0 >= x.1 {
                break;
            }
            if !never_together(x.3, y.3) {
                return Err(format!(
                    "tile {t}: {} ({:#x}..{:#x}) overlaps {} ({:#x}..{:#x})",
                    x.2, x.0, x.1, y.2, y.0, y.1
                ));
            }
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
            if never_together((b1.lifetime, b1.scratch), (b2.lifetime, b2.scratch)) {
                continue;
            }
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
            scratch: None,
            lifetime: None,
        }
    }

    #[test]
    fn scratch_phases_share_memory_and_persistent_buffers_do_not() {
        let mut bufs = vec![
            buf("w", 40_000, RegionReq::Interleaved, false),
            buf("x1", 100_000, RegionReq::Interleaved, true),
            buf("c1", 100, RegionReq::Interleaved, true),
            buf("k2", 250_000, RegionReq::Interleaved, false),
            buf("q2", 1000, RegionReq::Interleaved, true),
        ];
        bufs[1].scratch = Some(1);
        bufs[2].scratch = Some(1);
        bufs[3].scratch = Some(2);
        bufs[4].scratch = Some(2);
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        // Both phases start on the element after the persistent weights.
        let base = REGION1_BASE + 2 * INTERLEAVED_ELEMENT_BYTES;
        assert_eq!((s.addresses[1], s.addresses[4]), (base, base));
        // Without phases the same buffers do not fit.
        let mut flat = bufs.clone();
        for b in flat.iter_mut() {
            b.scratch = None;
        }
        assert!(place(0, &flat, 1000).is_err());
        // The validator refuses overlap within a phase and with persistent buffers.
        let mut bad = s.clone();
        bad.addresses[2] = bad.addresses[1] + 16;
        assert!(validate(&bad, &bufs).unwrap_err().contains("overlaps"));
        let mut bad = s;
        bad.addresses[3] = REGION1_BASE;
        assert!(validate(&bad, &bufs).unwrap_err().contains("overlaps"));
        // Scratch buffers may not ask for zeros at load.
        let mut zeroed = bufs.clone();
        zeroed[1].zero = vec![(0, 16)];
        let s = place(0, &zeroed, 1000).unwrap();
        assert!(validate(&s, &zeroed).unwrap_err().contains("zero-at-load"));
    }

    #[test]
    fn segments_share_memory_and_their_phases_stack_above_their_own_buffers() {
        // Segment 0: an element-exclusive buffer and a scratch phase;
        // segment 1: a large buffer; a persistent one under both.
        let mut bufs = vec![
            buf("kept", 1000, RegionReq::Interleaved, false),
            buf("s0.a", 200_000, RegionReq::Interleaved, true),
            buf("s0.p", 100_000, RegionReq::Interleaved, true),
            buf("s1.a", 300_000, RegionReq::Interleaved, false),
        ];
        bufs[1].lifetime = Some(0);
        bufs[2].lifetime = Some(0);
        bufs[2].scratch = Some(1);
        bufs[3].lifetime = Some(1);
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        // Both segments start at the element after the persistent buffer;
        // segment 0's phase above its own buffer.
        let base = REGION1_BASE + INTERLEAVED_ELEMENT_BYTES;
        assert_eq!((s.addresses[1], s.addresses[3]), (base, base));
        assert!(s.addresses[2] >= s.addresses[1] + 200_000);
        // In one segment they would not fit.
        let mut one = bufs.clone();
        one[3].lifetime = Some(0);
        assert!(place(0, &one, 1000).is_err());
        // The validator refuses overlap within a segment (a buffer and its
        // own phase) and with persistent buffers.
        let mut bad = s.clone();
        bad.addresses[2] = bad.addresses[1];
        assert!(validate(&bad, &bufs).unwrap_err().contains("overlaps"));
        let mut bad = s.clone();
        bad.addresses[3] = REGION1_BASE;
        assert!(validate(&bad, &bufs).unwrap_err().contains("overlaps"));
        // A buffer that lives in one segment may not ask for zeros at load.
        let mut zeroed = bufs.clone();
        zeroed[3].zero = vec![(0, 16)];
        let s = place(0, &zeroed, 1000).unwrap();
        assert!(validate(&s, &zeroed)
            .unwrap_err()
            .contains("lives in one segment"));
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
