//! The exchange phase: checks every tile's sends and receives against the
//! rules of docs/isa.md (section 6) and moves the words.
//!
//! All sends read memory as it was when the exchange phase began: no tile
//! stores during the phase, and a receive may not overlap a send source of
//! its own tile, so the order in which receives are written cannot matter.

use crate::error::{FaultKind, SimError};
use crate::tile::{Tile, Transfer, SUPERVISOR};
use ipu_arch::{SRAM_BASE, SRAM_END};
use rayon::prelude::*;

/// Sends of one tile sorted by start: (start, words, address).
type SendList = Vec<(u64, u32, u32)>;

/// Receives of one tile resolved to (destination, bytes).
type Writes = Vec<(u32, Vec<u8>)>;

fn range_ok(t: &Transfer) -> bool {
    t.address.is_multiple_of(4)
        && t.address >= SRAM_BASE
        && (t.address as u64 + 4 * t.words as u64) <= SRAM_END as u64
}

fn fault(tile: &Tile, t: &Transfer, kind: FaultKind) -> SimError {
    tile.fault(Some(SUPERVISOR), Some(t.pc), kind)
}

/// Validates the transfers of one tile on its own (ports, ranges, sources).
fn check_tile(tile: &Tile, tiles: &[Tile]) -> Result<SendList, SimError> {
    let mut sends: Vec<&Transfer> = tile
        .transfers
        .iter()
        .filter(|t| t.source.is_none())
        .collect();
    let mut recvs: Vec<&Transfer> = tile
        .transfers
        .iter()
        .filter(|t| t.source.is_some())
        .collect();
    for t in tile.transfers.iter() {
        if !range_ok(t) {
            return Err(fault(
                tile,
                t,
                FaultKind::BadTransferRange {
                    address: t.address,
                    words: t.words,
                },
            ));
        }
    }
    sends.sort_by_key(|t| (t.start, t.address));
    recvs.sort_by_key(|t| (t.start, t.address));
    for w in sends.windows(2) {
        if w[0].start + w[0].words as u64 > w[1].start {
            return Err(fault(
                tile,
                w[1],
                FaultKind::SendPortOverlap {
                    first_start: w[0].start,
                    second_start: w[1].start,
                },
            ));
        }
    }
    for w in recvs.windows(2) {
        if w[0].start + w[0].words as u64 > w[1].start {
            return Err(fault(
                tile,
                w[1],
                FaultKind::RecvPortOverlap {
                    first_start: w[0].start,
                    second_start: w[1].start,
                },
            ));
        }
    }
    // Receive destinations must not overlap this tile's send sources.
    let mut src_ranges: Vec<(u32, u32)> = sends
        .iter()
        .map(|t| (t.address, t.address + 4 * t.words))
        .collect();
    src_ranges.sort_unstable();
    // prefix_end[i] = the largest end among the first i + 1 ranges by start.
    let prefix_end: Vec<u32> = src_ranges
        .iter()
        .scan(0u32, |m, s| {
            *m = (*m).max(s.1);
            Some(*m)
        })
        .collect();
    for r in &recvs {
        let (lo, hi) = (r.address, r.address + 4 * r.words);
        let idx = src_ranges.partition_point(|s| s.0 < hi);
        if idx > 0 && prefix_end[idx - 1] > lo {
            return Err(fault(
                tile,
                r,
                FaultKind::ReceiveOverwritesSend { address: r.address },
            ));
        }
        let src = r.source.unwrap();
        if src as usize >= tiles.len() || !tiles[src as usize].active {
            return Err(fault(tile, r, FaultKind::BadSourceTile { source: src }));
        }
    }
    Ok(sends
        .iter()
        .map(|t| (t.start, t.words, t.address))
        .collect())
}

/// Gathers the bytes of one receive from its source's sends.
fn gather(
    tile: &Tile,
    r: &Transfer,
    src_tile: &Tile,
    sends: &SendList,
) -> Result<Vec<u8>, SimError> {
    let mut out = Vec::with_capacity(4 * r.words as usize);
    let mut cycle = r.start;
    let end = r.start + r.words as u64;
    // First send whose end is after `cycle`.
    let mut i = sends.partition_point(|s| s.0 + s.1 as u64 <= cycle);
    while cycle < end {
        let Some(&(s_start, s_words, s_addr)) = sends.get(i) else {
            return Err(fault(
                tile,
                r,
                FaultKind::NoSourceWord {
                    source: r.source.unwrap(),
                    cycle,
                },
            ));
        };
        if s_start > cycle {
            return Err(fault(
                tile,
                r,
                FaultKind::NoSourceWord {
                    source: r.source.unwrap(),
                    cycle,
                },
            ));
        }
        let s_end = s_start + s_words as u64;
        let take_end = s_end.min(end);
        let from = s_addr + 4 * (cycle - s_start) as u32;
        let bytes = 4 * (take_end - cycle) as u32;
        let data = src_tile
            .read_bytes(from, bytes)
            .expect("send ranges are validated");
        out.extend_from_slice(data);
        cycle = take_end;
        i += 1;
    }
    Ok(out)
}

/// Checks and performs the exchange of one phase. Returns, per tile, the
/// cycle (relative to the phase start) at which its last transfer ends.
pub(crate) fn resolve(tiles: &mut [Tile]) -> Result<Vec<u64>, SimError> {
    let checked: Vec<Result<SendList, SimError>> = tiles
        .par_iter()
        .map(|t| {
            if t.active {
                check_tile(t, tiles)
            } else {
                Ok(Vec::new())
            }
        })
        .collect();
    let mut sends = Vec::with_capacity(tiles.len());
    for c in checked {
        sends.push(c?);
    }
    let gathered: Vec<Result<Writes, SimError>> = tiles
        .par_iter()
        .map(|t| {
            let mut out = Vec::new();
            for r in t.transfers.iter().filter(|r| r.source.is_some()) {
                let src = r.source.unwrap() as usize;
                out.push((r.address, gather(t, r, &tiles[src], &sends[src])?));
            }
            Ok(out)
        })
        .collect();
    let mut writes = Vec::with_capacity(tiles.len());
    for g in gathered {
        writes.push(g?);
    }
    tiles
        .par_iter_mut()
        .zip(writes.into_par_iter())
        .for_each(|(t, ws)| {
            for (addr, data) in ws {
                t.write_bytes(addr, &data)
                    .expect("receive ranges are validated");
            }
        });
    Ok(tiles
        .iter()
        .map(|t| {
            t.transfers
                .iter()
                .map(|x| x.start + x.words as u64)
                .max()
                .unwrap_or(0)
        })
        .collect())
}
