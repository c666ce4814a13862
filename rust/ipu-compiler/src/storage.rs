//! Phase `place_storage`: addresses of every buffer on every tile, and the
//! independent validator of the result.
//!
//! Tile memory map:
//! - region 0 from its base: the linked code and vertex states (their size
//!   comes from a dry-run link of the tile program), then standard-memory
//!   buffers;
//! - the last 16 bytes of region 0: the host command word
//!   ([`COMMAND_ADDRESS`]), the same address on every tile;
//! - region 1, first fit: the buffers that live for the whole program,
//!   then each segment's own buffers, then each of its scratch phases'; in
//!   every set first the buffers that need memory elements of their own
//!   (operands of one `ld2x64st64`: its loads and its store must hit
//!   different 32 KiB elements), which never touch an element of another
//!   such buffer live with them, while other buffers may fill the rest of
//!   their elements.
//!
//! Buffers live for the whole program unless they are scratch buffers of a
//! phase of the run call ([`BufferSpec::scratch`]) or live in one segment
//! ([`BufferSpec::lifetime`]): phases and segments run one after the other,
//! so their region-1 buffers share memory, and the validator allows overlap
//! only between buffers never live together.
//!
//! [`region1_footprint`], the planners' model of region 1, still stacks
//! each exclusive buffer from a fresh element: an upper bound on what first
//! fit needs for one set, so a plan that fits it fits here. Both take a
//! set's exclusive buffers in the same order ([`exclusive_last_waste`]):
//! only the last one's unused element tail is free for other buffers, so
//! the one that would waste the most goes last. (A random-model test found
//! a GEMM whose 33,408-byte A, placed first, took two elements where the
//! planner had counted it last: region 1 overflowed by 13,168 bytes.)

use crate::error::CompileError;
use crate::lower::{BufferSpec, RegionReq};
use ipu_arch::{
    Region, INTERLEAVED_ELEMENT_BYTES, REGION0_BASE, REGION0_END, REGION1_BASE, REGION1_END,
};
use std::collections::{BTreeMap, BTreeSet};

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

/// The order key of an element-exclusive buffer of `bytes` within its set:
/// the bytes its last element leaves unused. Sorted ascending (stably), the
/// buffer that wastes the most comes last, where its tail is not wasted.
pub fn exclusive_last_waste(bytes: u32) -> u64 {
    let element = INTERLEAVED_ELEMENT_BYTES as u64;
    align_up(bytes as u64, element) - bytes as u64
}

/// Bytes of region 1 used by `buffers` = (bytes, needs own elements),
/// allocated as [`place`] does, or `None` if they do not fit.
pub fn region1_footprint(buffers: &[(u32, bool)]) -> Option<u64> {
    let mut cursor = REGION1_BASE as u64;
    let mut exclusive: Vec<u32> = buffers.iter().filter(|b| b.1).map(|b| b.0).collect();
    exclusive.sort_by_key(|&b| exclusive_last_waste(b));
    for bytes in exclusive {
        cursor = align_up(cursor, INTERLEAVED_ELEMENT_BYTES as u64) + bytes as u64;
    }
    for &(bytes, _) in buffers.iter().filter(|b| !b.1) {
        cursor = align_up(cursor, 16) + bytes as u64;
    }
    (cursor <= REGION1_END as u64).then_some(cursor - REGION1_BASE as u64)
}

/// Whether region 1 of a tile with `buffers` surely holds `extra` more
/// buffers ((bytes, element-exclusive)) beside them, with
/// [`REGION1_SPARE`] left for what later phases add: by
/// [`region1_footprint`]'s upper bound, every phase and segment of the
/// tile side by side. For phases that choose where a buffer goes before
/// storage places it.
pub fn region1_holds(buffers: &[BufferSpec], extra: &[(u32, bool)]) -> bool {
    let all: Vec<(u32, bool)> = buffers
        .iter()
        .filter(|b| b.region == RegionReq::Interleaved)
        .map(|b| (b.bytes, b.exclusive_element))
        .chain(extra.iter().copied())
        .collect();
    region1_footprint(&all)
        .is_some_and(|f| f + REGION1_SPARE <= (REGION1_END - REGION1_BASE) as u64)
}

/// Region-1 bytes [`region1_holds`] keeps free (loop stacks and state
/// slots that spill from region 0 come after the phases that ask).
pub const REGION1_SPARE: u64 = 16 * 1024;

/// Places `buffers` on `tile` after `code_bytes` of code and states.
///
/// Region 0 is first placed as if every buffer there lived for the whole
/// program; only a tile whose region 0 then overflows places the buffers
/// of different segments over each other there, so every tile that fits
/// without that keeps its layout (a loop's weight stacks copy on the fast
/// path at the distances that layout gives them from their staging
/// buffers).
pub fn place(
    tile: u32,
    buffers: &[BufferSpec],
    code_bytes: u32,
) -> Result<TileStorage, CompileError> {
    match place_region0_shared(tile, buffers, code_bytes, false) {
        Err(CompileError::OutOfMemory { region, .. })
            if region.starts_with("region 0")
                && buffers.iter().any(|b| {
                    b.lifetime.is_some() && matches!(b.region, RegionReq::Standard | RegionReq::Any)
                }) =>
        {
            place_region0_shared(tile, buffers, code_bytes, true)
        }
        r => r,
    }
}

/// [`place`] with the region-0 buffers of different segments placed over
/// each other (`share`) or apart.
fn place_region0_shared(
    tile: u32,
    buffers: &[BufferSpec],
    code_bytes: u32,
    share: bool,
) -> Result<TileStorage, CompileError> {
    let mut addresses = vec![0u32; buffers.len()];
    let code_end = align_up(REGION0_BASE as u64 + code_bytes as u64, 16);
    let r0_limit = (COMMAND_ADDRESS) as u64;
    let region0_consumers = |which: &dyn Fn(&BufferSpec) -> bool| -> Vec<(String, u64)> {
        buffers
            .iter()
            .filter(|b| which(b))
            .map(|b| (b.name.clone(), b.bytes as u64))
            .chain([("code and vertex states".into(), code_bytes as u64)])
            .collect()
    };
    let overflow =
        |region: &'static str, needed: u64, available: u64, mut largest: Vec<(String, u64)>| {
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
            region0_consumers(&|b| b.region == RegionReq::Standard),
        ));
    }
    // Region 1, first fit: the buffers that live for the whole program,
    // then per segment lifetime (`None` for a program without segments)
    // the segment's own buffers and then each of its scratch phases'; in
    // each set the element-exclusive buffers first. A buffer takes the
    // lowest address where it overlaps no buffer live with it and, if it
    // needs elements of its own, touches no element of an exclusive buffer
    // live with it. Other buffers may fill the rest of an exclusive
    // buffer's elements, and buffers never live together (other segments,
    // other phases) share memory.
    let r0 = code_end;
    let mut order: Vec<usize> = Vec::new();
    let interleaved = |i: &usize| buffers[*i].region == RegionReq::Interleaved;
    let set = |which: &dyn Fn(&BufferSpec) -> bool, order: &mut Vec<usize>| {
        for exclusive in [true, false] {
            let mut members: Vec<usize> = (0..buffers.len())
                .filter(interleaved)
                .filter(|&i| buffers[i].exclusive_element == exclusive && which(&buffers[i]))
                .collect();
            if exclusive {
                members.sort_by_key(|&i| exclusive_last_waste(buffers[i].bytes));
            }
            order.extend(members);
        }
    };
    set(&|b| b.scratch.is_none() && b.lifetime.is_none(), &mut order);
    let lifetimes: std::collections::BTreeSet<Option<u32>> =
        buffers.iter().map(|b| b.lifetime).collect();
    for &life in &lifetimes {
        if life.is_some() {
            set(&|b| b.lifetime == life && b.scratch.is_none(), &mut order);
        }
        let phases: std::collections::BTreeSet<u32> = buffers
            .iter()
            .filter(|b| b.lifetime == life)
            .filter_map(|b| b.scratch)
            .collect();
        for &p in &phases {
            set(&|b| b.lifetime == life && b.scratch == Some(p), &mut order);
        }
    }
    let mut placed: Vec<usize> = Vec::new();
    let mut r1 = REGION1_BASE as u64;
    let mut worst: Option<Liveness> = None;
    for &i in &order {
        let b = &buffers[i];
        let start = first_fit(b, buffers, &placed, &addresses);
        addresses[i] = start as u32;
        placed.push(i);
        let end = start + b.bytes as u64;
        if end > r1 {
            r1 = end;
            worst = Some((b.lifetime, b.scratch));
        }
    }
    if r1 > REGION1_END as u64 {
        return Err(overflow(
            "region 1 (interleaved)",
            r1 - REGION1_BASE as u64,
            (REGION1_END - REGION1_BASE) as u64,
            region1_consumers(buffers, &addresses, worst),
        ));
    }
    // Region 0: the standard buffers and, in buffer order, every buffer
    // that may go anywhere while region 0 has room for it; the others of
    // those follow the interleaved ones in region 1 (a streamed GEMM's
    // operand homes can exceed region 0). A buffer that lives for the
    // whole program goes after every buffer before it; one that lives in
    // a segment goes after the whole program's buffers before it and its
    // own segment's, over other segments' (segments never live together:
    // a segmented attention's Q home shares region 0 with the projection
    // segments' copies of their input). Buffers keep the order they were
    // made in, which later phases rely on (a loop's staging buffers come
    // before its weight stacks, so that their copies take the fast path).
    // A region-0 buffer's segment, when segments share region 0.
    let life = |b: &BufferSpec| if share { b.lifetime } else { None };
    let in_region0 = |b: &BufferSpec| matches!(b.region, RegionReq::Standard | RegionReq::Any);
    let standard = |b: &BufferSpec| {
        if b.region == RegionReq::Standard {
            align_up(b.bytes as u64, b.align as u64) + b.align as u64
        } else {
            0
        }
    };
    // Standard bytes still to place after each buffer that may live with
    // it (for a whole-program buffer, the whole program's and the most of
    // any one segment's): an anywhere buffer never takes the room a later
    // standard one needs.
    let mut standard_after = vec![0u64; buffers.len()];
    {
        let (mut whole, mut by_segment) = (0u64, BTreeMap::<u32, u64>::new());
        for (i, b) in buffers.iter().enumerate().rev() {
            if !in_region0(b) {
                continue;
            }
            standard_after[i] = whole
                + match life(b) {
                    None => by_segment.values().copied().max().unwrap_or(0),
                    Some(s) => by_segment.get(&s).copied().unwrap_or(0),
                };
            match life(b) {
                None => whole += standard(b),
                Some(s) => *by_segment.entry(s).or_default() += standard(b),
            }
        }
    }
    // When region 0 overflows, anywhere buffers that it holds move to
    // region 1 one at a time, each where region 1 still has room: the
    // smallest that covers the overflow, else the largest, and the pass
    // runs again. (In buffer order a large one that fits neither region
    // stayed in region 0 while smaller ones before it, which region 1
    // could hold, took region 0's room: a widened fp8 GEMM on one tile
    // overflowed region 0 by 16,000 bytes with 80,912 free in region 1.)
    // Candidates are the buffers that may live with the one that ends
    // highest: moving another frees nothing there. A buffer moved to
    // region 1 goes above region 1's own buffers, sharing that room only
    // with other segments' moved buffers. A tile that fits at the first
    // pass is placed as before.
    // The whole program's buffers first, then each segment's, each in
    // buffer order.
    let mut region0_order: Vec<usize> = (0..buffers.len())
        .filter(|&i| in_region0(&buffers[i]))
        .collect();
    region0_order.sort_by_key(|&i| (life(&buffers[i]).is_some(), life(&buffers[i]), i));
    let (r0_start, r1_start) = (r0, r1);
    let mut moved = vec![false; buffers.len()];
    loop {
        // Region 0's cursors, and those of region 1 above its own buffers
        // for what moves there: the end of everything placed, of the
        // whole program's buffers and of each segment's; per group,
        // whether one of its buffers found region 0 full (the later ones
        // then follow it to region 1).
        let mut r0 = Cursors::new(r0_start);
        let mut r1 = Cursors::new(r1_start);
        let mut highest: Option<usize> = None;
        let (mut whole_full, mut segment_full) = (false, BTreeSet::<u32>::new());
        for &i in &region0_order {
            let b = &buffers[i];
            let any = b.region == RegionReq::Any;
            let start = align_up(r0.after(life(b)), b.align as u64);
            let full = whole_full || life(b).is_some_and(|s| segment_full.contains(&s));
            let spill =
                any && (moved[i] || full || start + b.bytes as u64 + standard_after[i] > r0_limit);
            let r1_start = align_up(r1.after(life(b)), b.align as u64);
            if spill && r1_start + b.bytes as u64 <= REGION1_END as u64 {
                if !moved[i] {
                    match life(b) {
                        None => whole_full = true,
                        Some(s) => {
                            segment_full.insert(s);
                        }
                    }
                }
                addresses[i] = r1_start as u32;
                r1.placed(life(b), r1_start + b.bytes as u64);
                continue;
            }
            addresses[i] = start as u32;
            if r0.placed(life(b), start + b.bytes as u64) {
                highest = Some(i);
            }
        }
        let top = r0.top;
        if top <= r0_limit {
            break;
        }
        let over = top - r0_limit;
        let fullest = highest.and_then(|h| life(&buffers[h]));
        let live = |b: &BufferSpec| fullest.is_none() || life(b).is_none() || life(b) == fullest;
        let pick = (0..buffers.len())
            .filter(|&i| {
                let b = &buffers[i];
                b.region == RegionReq::Any
                    && live(b)
                    && !moved[i]
                    && (addresses[i] as u64) < REGION1_BASE as u64
                    && align_up(r1.after(life(b)), b.align as u64) + b.bytes as u64
                        <= REGION1_END as u64
            })
            .min_by_key(|&i| {
                let bytes = buffers[i].bytes as u64;
                if bytes >= over {
                    (0, bytes, i)
                } else {
                    (1, u64::MAX - bytes, i)
                }
            });
        match pick {
            Some(i) => moved[i] = true,
            None => {
                return Err(overflow(
                    "region 0 (standard)",
                    top - REGION0_BASE as u64,
                    r0_limit - REGION0_BASE as u64,
                    region0_consumers(&|b| in_region0(b) && live(b)),
                ))
            }
        }
    }
    Ok(TileStorage {
        tile,
        code_end: code_end as u32,
        addresses,
    })
}

/// Where the next buffer of a region goes in buffer order: after every
/// buffer placed before it if it lives for the whole program, else after
/// the whole program's and its own segment's (segments never live
/// together).
struct Cursors {
    /// The end of everything placed.
    top: u64,
    /// The end of the whole program's buffers placed so far.
    whole: u64,
    /// The end of each segment's buffers placed so far.
    segment: BTreeMap<u32, u64>,
}

impl Cursors {
    fn new(base: u64) -> Self {
        Cursors {
            top: base,
            whole: base,
            segment: BTreeMap::new(),
        }
    }
    /// Where a buffer of `lifetime` may start (before alignment).
    fn after(&self, lifetime: Option<u32>) -> u64 {
        match lifetime {
            None => self.top,
            Some(s) => self.whole.max(self.segment.get(&s).copied().unwrap_or(0)),
        }
    }
    /// Records a buffer of `lifetime` ending at `end`; whether it ends
    /// higher than any before it.
    fn placed(&mut self, lifetime: Option<u32>, end: u64) -> bool {
        match lifetime {
            None => self.whole = end,
            Some(s) => {
                self.segment.insert(s, end);
            }
        }
        let higher = end > self.top;
        self.top = self.top.max(end);
        higher
    }
}

/// The interleaved memory elements (indices from [`REGION1_BASE`]) that
/// `bytes` bytes at `address` touch.
fn elements(address: u64, bytes: u64) -> (u64, u64) {
    let e = INTERLEAVED_ELEMENT_BYTES as u64;
    let base = REGION1_BASE as u64;
    ((address - base) / e, (address + bytes - 1 - base) / e)
}

/// The lowest region-1 address for `b` beside the `placed` buffers (indices
/// into `buffers`, at `addresses`): no byte of a buffer live with it, and
/// for an element-exclusive buffer no element of an exclusive one live
/// with it. The candidates are region 1's base, the ends of those buffers
/// and, for an exclusive buffer, the element boundaries and the addresses
/// that end on one; the end of everything is always among them.
fn first_fit(b: &BufferSpec, buffers: &[BufferSpec], placed: &[usize], addresses: &[u32]) -> u64 {
    let live: Vec<(u64, u64, bool)> = placed
        .iter()
        .map(|&j| &buffers[j])
        .zip(placed.iter().map(|&j| addresses[j] as u64))
        .filter(|(o, _)| !never_together((b.lifetime, b.scratch), (o.lifetime, o.scratch)))
        .map(|(o, a)| {
            (
                a,
                a + o.bytes as u64,
                o.exclusive_element && !kernels_apart(b, o),
            )
        })
        .collect();
    let (bytes, align) = (b.bytes as u64, b.align as u64);
    let mut candidates: Vec<u64> = std::iter::once(REGION1_BASE as u64)
        .chain(live.iter().map(|l| l.1))
        .map(|c| align_up(c, align))
        .collect();
    if b.exclusive_element {
        let e = INTERLEAVED_ELEMENT_BYTES as u64;
        let top = live
            .iter()
            .map(|l| l.1)
            .max()
            .unwrap_or(REGION1_BASE as u64)
            + e;
        let mut boundary = REGION1_BASE as u64;
        while boundary <= align_up(top, e) {
            candidates.push(boundary);
            if boundary >= REGION1_BASE as u64 + bytes {
                candidates.push((boundary - bytes) / align * align);
            }
            boundary += e;
        }
    }
    candidates.sort_unstable();
    candidates.dedup();
    let fits = |a: u64| {
        let mine = elements(a, bytes);
        live.iter().all(|&(s, end, exclusive)| {
            let apart = a + bytes <= s || end <= a;
            let theirs = elements(s, end - s);
            apart && !(b.exclusive_element && exclusive && mine.0 <= theirs.1 && theirs.0 <= mine.1)
        })
    };
    candidates
        .into_iter()
        .filter(|&a| a >= REGION1_BASE as u64)
        .find(|&a| fits(a))
        .expect("the element boundary above every placed buffer always fits")
}

/// The region-1 buffers live with the placement's highest end (`worst`),
/// each with the bytes it takes: an element-exclusive buffer takes the
/// 32 KiB elements it touches whole from the others of its kind, which is
/// what fills region 1 when many small ones are live together.
fn region1_consumers(
    buffers: &[BufferSpec],
    addresses: &[u32],
    worst: Option<Liveness>,
) -> Vec<(String, u64)> {
    buffers
        .iter()
        .zip(addresses)
        .filter(|(b, _)| {
            b.region == RegionReq::Interleaved
                && worst.is_some_and(|w| !never_together((b.lifetime, b.scratch), w))
        })
        .map(|(b, &a)| {
            if !b.exclusive_element || b.bytes == 0 {
                return (b.name.clone(), b.bytes as u64);
            }
            let (first, last) = elements(a as u64, b.bytes as u64);
            let n = last - first + 1;
            let plural = if n == 1 { "" } else { "s" };
            (
                format!(
                    "{} ({} bytes in {n} element{plural} of its own)",
                    b.name, b.bytes
                ),
                n * INTERLEAVED_ELEMENT_BYTES as u64,
            )
        })
        .collect()
}

/// A buffer's (segment lifetime, scratch phase).
type Liveness = (Option<u32>, Option<u32>);

/// Whether the kernels that use `a` and those that use `b` run in different
/// segments, so that two element-exclusive buffers may share elements.
fn kernels_apart(a: &BufferSpec, b: &BufferSpec) -> bool {
    matches!((a.kernel_segment, b.kernel_segment), (Some(x), Some(y)) if x != y)
}

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
            if never_together((b1.lifetime, b1.scratch), (b2.lifetime, b2.scratch))
                || kernels_apart(b1, b2)
            {
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
            kernel_segment: None,
        }
    }

    /// Persistent element-exclusive buffers (a segmented model's weights
    /// and results) take elements of their own only from those whose
    /// kernels run in the same segment: 20 buffers of 2 KB, two per
    /// segment, fit in two elements' worth of region 1, where with no
    /// segments known they need 20 elements, more than region 1's 13, and
    /// the overflow names each with the elements it takes.
    #[test]
    fn exclusive_buffers_of_different_segments_share_elements() {
        let mut bufs: Vec<BufferSpec> = (0..20)
            .map(|i| buf(&format!("b{i}"), 2048, RegionReq::Interleaved, true))
            .collect();
        let err = place(0, &bufs, 1000).unwrap_err().to_string();
        assert!(
            err.contains("needs 624640 bytes")
                && err.contains("b0 (2048 bytes in 1 element of its own) 32768 B;"),
            "{err}"
        );
        for (i, b) in bufs.iter_mut().enumerate() {
            b.kernel_segment = Some(i as u32 / 2);
        }
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        let e = INTERLEAVED_ELEMENT_BYTES;
        let (first, second) = (s.addresses[0], s.addresses[1]);
        assert_ne!((first - REGION1_BASE) / e, (second - REGION1_BASE) / e);
        assert!(s
            .addresses
            .iter()
            .all(|&a| a + 2048 <= REGION1_BASE + 2 * e));
        // The validator still keeps one segment's pair apart (the first
        // element's buffers end at 20,480 bytes).
        let mut bad = s;
        assert_eq!(bad.addresses[0], REGION1_BASE);
        bad.addresses[1] = REGION1_BASE + 30_000;
        assert!(validate(&bad, &bufs)
            .unwrap_err()
            .contains("share an interleaved memory element"));
    }

    #[test]
    fn scratch_phases_share_memory_and_persistent_buffers_do_not() {
        let mut bufs = vec![
            buf("w", 40_000, RegionReq::Interleaved, false),
            buf("x1", 100_000, RegionReq::Interleaved, true),
            buf("c1", 100, RegionReq::Interleaved, true),
            buf("k2", 300_000, RegionReq::Interleaved, false),
            buf("q2", 1000, RegionReq::Interleaved, true),
        ];
        bufs[1].scratch = Some(1);
        bufs[2].scratch = Some(1);
        bufs[3].scratch = Some(2);
        bufs[4].scratch = Some(2);
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        // Both phases start right after the persistent weights: those need
        // no element of their own, so the phases' exclusive buffers may
        // share the weights' last element.
        let base = REGION1_BASE + 40_000;
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
        // Both segments start right after the persistent buffer; segment
        // 0's phase above its own buffer, on the next element.
        let base = REGION1_BASE + 1008;
        assert_eq!((s.addresses[1], s.addresses[3]), (base, base));
        let next_element = (base + 200_000 - REGION1_BASE).div_ceil(INTERLEAVED_ELEMENT_BYTES)
            * INTERLEAVED_ELEMENT_BYTES
            + REGION1_BASE;
        assert_eq!(s.addresses[2], next_element);
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

    /// Anywhere buffers in buffer order: the large last one fits neither
    /// region 0 after the smaller ones nor region 1's rest, so one of the
    /// smaller ones moves to region 1 (the smallest that covers region
    /// 0's overflow of about 14 KB: `a`) and the large one takes region 0.
    /// A tile that fits at
    /// once is placed as before: the same buffers without the large one.
    #[test]
    fn region0_overflow_moves_anywhere_buffers_to_region1() {
        let mut bufs = vec![
            buf("w", 330_000, RegionReq::Interleaved, false),
            buf("a", 23_000, RegionReq::Any, false),
            buf("b", 46_000, RegionReq::Any, false),
            buf("c", 52_000, RegionReq::Any, false),
            buf("d", 104_000, RegionReq::Any, false),
        ];
        let s = place(0, &bufs, 2_000).unwrap();
        validate(&s, &bufs).unwrap();
        let in_r1 = |s: &TileStorage, i: usize| s.addresses[i] >= REGION1_BASE;
        assert!(!in_r1(&s, 4), "{:x?}", s.addresses);
        assert_eq!(
            (1..4).filter(|&i| in_r1(&s, i)).collect::<Vec<_>>(),
            vec![1],
            "{:x?}",
            s.addresses
        );
        bufs.pop();
        let s = place(0, &bufs, 2_000).unwrap();
        assert!((1..4).all(|i| !in_r1(&s, i)), "{:x?}", s.addresses);
        // Nothing that moves helps: still an error that names region 0.
        bufs.push(buf("e", 200_000, RegionReq::Any, false));
        bufs.push(buf("f", 90_000, RegionReq::Any, false));
        let e = place(0, &bufs, 2_000).unwrap_err().to_string();
        assert!(e.contains("region 0"), "{e}");
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
        // b fills the rest of a's second element.
        assert_eq!(s.addresses[2], REGION1_BASE + 40_000);
        let mut bad = s.clone();
        bad.addresses[1] = REGION1_BASE + 60_000;
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
        assert!(
            e.contains(
                "big_a (300000 bytes in 10 elements of its own) 327680 B; big_c (200000 bytes in 7 elements of its own) 229376 B;"
            ),
            "{e}"
        );
    }
    /// The ViT block's tile 0 with resident weights (session 14): 170,496
    /// bytes of weights, the MLP segment's four element-exclusive C
    /// buffers and a phase's 56,832-byte exclusive A chunk. Placing each
    /// set from a fresh element, exclusive buffers first, needed 450,048
    /// bytes of 425,984; first fit puts the exclusive buffers on elements
    /// of their own but lets the weights share their first, and fits.
    #[test]
    fn first_fit_shares_exclusive_buffers_elements_with_other_buffers() {
        let mut bufs = vec![
            buf("m0.b", 50_688, RegionReq::Interleaved, false),
            buf("m3.b", 73_728, RegionReq::Interleaved, false),
            buf("p0.b", 18_432, RegionReq::Interleaved, false),
            buf("q0.b", 27_648, RegionReq::Interleaved, false),
            buf("m0.c", 33_456, RegionReq::Interleaved, true),
            buf("m0.c_partial", 33_456, RegionReq::Interleaved, true),
            buf("m3.c", 14_608, RegionReq::Interleaved, true),
            buf("m3.c_partial", 14_608, RegionReq::Interleaved, true),
            buf("m3.a", 56_832, RegionReq::Interleaved, true),
            buf("m0.gather", 33_792, RegionReq::Interleaved, false),
        ];
        for b in &mut bufs[4..] {
            b.lifetime = Some(4);
        }
        bufs[8].scratch = Some(11);
        bufs[9].scratch = Some(10);
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        let end = bufs
            .iter()
            .zip(&s.addresses)
            .map(|(b, &a)| a + b.bytes)
            .max()
            .unwrap();
        assert!(end - REGION1_BASE <= 425_984 - 8 * 1024, "ends at {end:#x}");
        // The weights are packed from the base; the first exclusive buffer
        // of the segment (the one wasting least of its last element, m3.c)
        // shares the weights' last element.
        let first = (4..bufs.len())
            .filter(|&i| bufs[i].exclusive_element)
            .min_by_key(|&i| s.addresses[i])
            .unwrap();
        assert_eq!(bufs[first].name, "m3.c");
        assert_eq!(s.addresses[first], REGION1_BASE + 170_496);
    }

    /// Places random `bufs` on tile 0: a placement must validate and
    /// repeat; a refusal must be an overflow (of a region whose name
    /// starts with `refused_in`, when given). Whether they fitted.
    fn placed_or_refused(bufs: &[BufferSpec], refused_in: Option<&str>) -> bool {
        match place(0, bufs, 1000) {
            Ok(s) => {
                validate(&s, bufs).unwrap_or_else(|e| panic!("{e}: {bufs:?}"));
                assert_eq!(place(0, bufs, 1000).ok(), Some(s));
                true
            }
            Err(CompileError::OutOfMemory {
                region,
                needed,
                available,
                ..
            }) => {
                assert!(
                    refused_in.is_none_or(|r| region.starts_with(r)) && needed > available,
                    "{region}: {bufs:?}"
                );
                false
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    /// Region 0 holds the whole program's buffers once and each
    /// segment's own above them, segments sharing that room: a 100 KB
    /// standard buffer of segment 0 and a 120 KB one of segment 1 fit
    /// beside 50 KB of the whole program's where side by side they would
    /// not; an overflow names the fullest segment's buffers and the whole
    /// program's, not another segment's.
    #[test]
    fn segments_share_region0() {
        let mut bufs = vec![
            buf("whole", 50_000, RegionReq::Standard, false),
            buf("s0.a", 100_000, RegionReq::Standard, false),
            buf("s1.b", 120_000, RegionReq::Standard, false),
        ];
        assert!(place(0, &bufs, 1000).is_err());
        bufs[1].lifetime = Some(0);
        bufs[2].lifetime = Some(1);
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        let base = align_up(REGION0_BASE as u64 + 1000, 16) as u32 + 50_000;
        assert_eq!((s.addresses[1], s.addresses[2]), (base, base));
        // Moving one into the other's segment overlaps them: refused.
        let mut bad = bufs.clone();
        bad[2].lifetime = Some(0);
        assert!(validate(&s, &bad).unwrap_err().contains("overlaps"));
        // An anywhere buffer of segment 1 that region 0 cannot hold beside
        // that segment's goes to region 1; segment 0 keeps its place.
        bufs.push(buf("s1.any", 60_000, RegionReq::Any, false));
        bufs[3].lifetime = Some(1);
        let s = place(0, &bufs, 1000).unwrap();
        validate(&s, &bufs).unwrap();
        assert!(s.addresses[3] >= REGION1_BASE);
        assert_eq!(s.addresses[1], base);
        // Segment 1 overflowing with standard buffers names its own.
        bufs[3].region = RegionReq::Standard;
        let err = place(0, &bufs, 1000).unwrap_err().to_string();
        assert!(
            err.contains("needs 231008 bytes")
                && err.contains("s1.b 120000 B")
                && err.contains("whole 50000 B")
                && !err.contains("s0.a"),
            "{err}"
        );
    }

    /// Random region-0 buffers of the whole program and of three
    /// segments: every placement validates and repeats; standard buffers
    /// alone that fit side by side always fit, and often fit where side
    /// by side they would not (segments sharing region 0).
    #[test]
    fn random_region0_segments_validate() {
        let mut rng = ipu_rng::Xoshiro256::seeded(15);
        let available = (COMMAND_ADDRESS as u64) - align_up(REGION0_BASE as u64 + 1000, 16);
        let (mut fitted, mut refused, mut shared) = (0, 0, 0);
        for round in 0..2000 {
            let count = 1 + (rng.next_u64() % 10) as usize;
            let all_standard = round % 2 == 0;
            let bufs: Vec<BufferSpec> = (0..count)
                .map(|i| {
                    let r = rng.next_u64();
                    let region = if all_standard {
                        RegionReq::Standard
                    } else {
                        [RegionReq::Standard, RegionReq::Any, RegionReq::Interleaved]
                            [(r >> 40) as usize % 3]
                    };
                    let mut b = buf(&format!("b{i}"), 16 + (r % 70_000) as u32, region, false);
                    b.align = 1 << (2 + (r >> 24) % 3);
                    b.lifetime = [None, Some(0), Some(1), Some(2)][((r >> 28) % 4) as usize];
                    b
                })
                .collect();
            let fits = placed_or_refused(&bufs, None);
            if fits {
                fitted += 1;
            } else {
                refused += 1;
            }
            if all_standard {
                let side_by_side = bufs
                    .iter()
                    .fold(0u64, |at, b| align_up(at, b.align as u64) + b.bytes as u64);
                assert!(side_by_side > available || fits, "{bufs:?}");
                if side_by_side > available && fits {
                    shared += 1;
                }
            }
        }
        assert!(
            fitted > 500 && refused > 50 && shared > 50,
            "{fitted} fitted, {refused} refused, {shared} fitted only by sharing"
        );
    }

    /// Random tiles (seeded): every placement [`place`] returns passes the
    /// independent [`validate`], the same buffers always get the same
    /// addresses, and a refusal names region 1 with more bytes than it
    /// has. Buffers of two segments, each with scratch phases, beside
    /// persistent ones; a third of them element-exclusive.
    #[test]
    fn random_placements_validate() {
        let mut rng = ipu_rng::Xoshiro256::seeded(14);
        let (mut fitted, mut refused) = (0, 0);
        for _ in 0..2000 {
            let count = 1 + (rng.next_u64() % 14) as usize;
            let bufs: Vec<BufferSpec> = (0..count)
                .map(|i| {
                    let r = rng.next_u64();
                    let bytes = 16 + (r % 90_000) as u32;
                    let mut b = buf(
                        &format!("b{i}"),
                        bytes,
                        RegionReq::Interleaved,
                        (r >> 20).is_multiple_of(3),
                    );
                    b.align = 1 << (2 + (r >> 24) % 3);
                    b.lifetime = [None, Some(0), Some(1)][((r >> 28) % 3) as usize];
                    b.scratch = [None, None, Some(1), Some(2)][((r >> 32) % 4) as usize];
                    b
                })
                .collect();
            if placed_or_refused(&bufs, Some("region 1")) {
                fitted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            fitted > 500 && refused > 50,
            "{fitted} fitted, {refused} refused"
        );
    }
}
