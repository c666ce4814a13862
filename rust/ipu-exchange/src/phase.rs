//! The input of the scheduler: one exchange phase, and its validation.
//!
//! A phase is a set of transfers. Each transfer moves `bytes` (a multiple of 4)
//! from one source tile's SRAM to one address on each of a set of destination
//! tiles (a multicast when there are several). Validation enforces every rule
//! of docs/isa.md section 6 that depends only on addresses, so that a phase
//! that validates can always be scheduled and run without an address fault.

use ipu_arch::{SRAM_BASE, SRAM_END, TILES_PER_CHIP};
use std::fmt;

/// One receiving end of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Destination {
    /// Receiving tile.
    pub tile: u32,
    /// Byte address on the receiving tile (4-aligned).
    pub address: u32,
}

/// One transfer of a phase.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// Caller's identifier, unique within the phase; used in error messages.
    pub id: u32,
    /// Sending tile.
    pub source: u32,
    /// Byte address of the data on the sending tile (4-aligned).
    pub source_address: u32,
    /// Receiving tiles and addresses; at least one, each tile at most once.
    pub destinations: Vec<Destination>,
    /// Bytes moved; a positive multiple of 4.
    pub bytes: u32,
}

impl Transfer {
    /// Words (4-byte port cycles) of the transfer.
    pub fn words(&self) -> u32 {
        self.bytes / 4
    }
}

/// One exchange phase: transfers between the first `tiles` tiles of a chip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Phase {
    /// Tiles of the chip taking part (tile numbers are `0..tiles`).
    pub tiles: u32,
    /// The transfers, in any order.
    pub transfers: Vec<Transfer>,
    /// Where strided descriptors may reach: `None` anywhere; otherwise, per
    /// tile (index = tile), sorted disjoint byte ranges `[start, end)`, and
    /// every strided descriptor lies inside the range that holds its first
    /// byte (a tile without ranges gets contiguous descriptors only). A
    /// compiler that schedules against provisional addresses and moves each
    /// buffer afterwards gives its buffers' ranges, so that no descriptor
    /// reaches from one buffer into another.
    pub spans: Option<Vec<Vec<(u32, u32)>>>,
}

/// A phase that breaks a rule; every variant names the transfer and tile at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PhaseError {
    /// The tile count is 0 or larger than a chip.
    TileCount { tiles: u32 },
    /// Two transfers share an id.
    DuplicateId { id: u32 },
    /// A transfer of zero bytes or of a byte count that is not a multiple of 4.
    BadSize { id: u32, bytes: u32 },
    /// A transfer with no destination.
    NoDestinations { id: u32 },
    /// A source or destination tile outside `0..tiles`.
    TileOutOfRange { id: u32, tile: u32, tiles: u32 },
    /// One tile named twice as a destination of one transfer: a tile has one
    /// receive port, so it cannot take the same words twice in the same cycles.
    DuplicateDestination { id: u32, tile: u32 },
    /// An address that is not 4-aligned.
    Misaligned { id: u32, tile: u32, address: u32 },
    /// A byte range that leaves tile SRAM.
    OutsideSram {
        id: u32,
        tile: u32,
        address: u32,
        bytes: u32,
    },
    /// Two receives of one tile write overlapping bytes.
    ReceiveOverlap {
        tile: u32,
        first: u32,
        second: u32,
        address: u32,
    },
    /// Spans of a tile ([`Phase::spans`]) that are empty, unsorted or
    /// overlapping: `start..end` is the first bad one.
    BadSpans { tile: u32, start: u32, end: u32 },
    /// A receive overwrites bytes that its own tile sends in the same phase
    /// (the simulator forbids it so that the result cannot depend on timing).
    ReceiveOverwritesSend {
        tile: u32,
        receive: u32,
        send: u32,
        address: u32,
    },
}

impl fmt::Display for PhaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PhaseError::*;
        match *self {
            TileCount { tiles } => {
                write!(f, "phase has {tiles} tiles; expected 1 to {TILES_PER_CHIP}")
            }
            DuplicateId { id } => write!(f, "transfer id {id} is used twice"),
            BadSpans { tile, start, end } => write!(
                f,
                "tile {tile}: span {start:#x}..{end:#x} is empty or overlaps or precedes the span before it"
            ),
            BadSize { id, bytes } => {
                write!(
                    f,
                    "transfer {id}: {bytes} bytes is not a positive multiple of 4"
                )
            }
            NoDestinations { id } => write!(f, "transfer {id} has no destination"),
            TileOutOfRange { id, tile, tiles } => {
                write!(
                    f,
                    "transfer {id}: tile {tile} does not exist (phase has {tiles} tiles)"
                )
            }
            DuplicateDestination { id, tile } => {
                write!(
                    f,
                    "transfer {id}: tile {tile} is named twice as a destination"
                )
            }
            Misaligned { id, tile, address } => {
                write!(
                    f,
                    "transfer {id}: address {address:#x} on tile {tile} is not 4-aligned"
                )
            }
            OutsideSram {
                id,
                tile,
                address,
                bytes,
            } => write!(
                f,
                "transfer {id}: {bytes} bytes at {address:#x} on tile {tile} leave SRAM \
                 ({SRAM_BASE:#x}..{SRAM_END:#x})"
            ),
            ReceiveOverlap {
                tile,
                first,
                second,
                address,
            } => write!(
                f,
                "tile {tile}: receives of transfers {first} and {second} overlap at {address:#x}"
            ),
            ReceiveOverwritesSend {
                tile,
                receive,
                send,
                address,
            } => write!(
                f,
                "tile {tile}: the receive of transfer {receive} at {address:#x} overwrites the \
                 source of transfer {send} sent in the same phase"
            ),
        }
    }
}

impl std::error::Error for PhaseError {}

fn check_range(id: u32, tile: u32, address: u32, bytes: u32) -> Result<(), PhaseError> {
    if !address.is_multiple_of(4) {
        return Err(PhaseError::Misaligned { id, tile, address });
    }
    if address < SRAM_BASE || address as u64 + bytes as u64 > SRAM_END as u64 {
        return Err(PhaseError::OutsideSram {
            id,
            tile,
            address,
            bytes,
        });
    }
    Ok(())
}

/// The end of the span among `spans` (sorted, disjoint `[start, end)`
/// ranges of one tile, [`Phase::spans`]) that holds `address`, if any.
pub fn span_end(spans: &[(u32, u32)], address: u32) -> Option<u32> {
    let i = spans.partition_point(|&(a, _)| a <= address);
    let (a, e) = spans[..i].last().copied()?;
    (address >= a && address < e).then_some(e)
}

impl Phase {
    /// Checks every address rule; the first error in a deterministic order
    /// (transfer order, then tile order) is returned.
    pub fn validate(&self) -> Result<(), PhaseError> {
        if self.tiles == 0 || self.tiles > TILES_PER_CHIP {
            return Err(PhaseError::TileCount { tiles: self.tiles });
        }
        for (tile, spans) in self.spans.iter().flatten().enumerate() {
            let mut prev_end = 0;
            for &(start, end) in spans {
                if start >= end || start < prev_end {
                    return Err(PhaseError::BadSpans {
                        tile: tile as u32,
                        start,
                        end,
                    });
                }
                prev_end = end;
            }
        }
        let mut ids: Vec<u32> = self.transfers.iter().map(|t| t.id).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(PhaseError::DuplicateId { id: w[0] });
        }
        // Per tile: (start, end, id) of receive ranges and of send ranges.
        let mut recvs: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); self.tiles as usize];
        let mut sends: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); self.tiles as usize];
        for t in &self.transfers {
            let id = t.id;
            if t.bytes == 0 || !t.bytes.is_multiple_of(4) {
                return Err(PhaseError::BadSize { id, bytes: t.bytes });
            }
            if t.destinations.is_empty() {
                return Err(PhaseError::NoDestinations { id });
            }
            let in_range = |tile: u32| {
                if tile < self.tiles {
                    Ok(())
                } else {
                    Err(PhaseError::TileOutOfRange {
                        id,
                        tile,
                        tiles: self.tiles,
                    })
                }
            };
            in_range(t.source)?;
            check_range(id, t.source, t.source_address, t.bytes)?;
            sends[t.source as usize].push((t.source_address, t.source_address + t.bytes, id));
            let mut seen: Vec<u32> = Vec::with_capacity(t.destinations.len());
            for d in &t.destinations {
                in_range(d.tile)?;
                check_range(id, d.tile, d.address, t.bytes)?;
                seen.push(d.tile);
                recvs[d.tile as usize].push((d.address, d.address + t.bytes, id));
            }
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                return Err(PhaseError::DuplicateDestination { id, tile: w[0] });
            }
        }
        for tile in 0..self.tiles as usize {
            let r = &mut recvs[tile];
            r.sort_unstable();
            if let Some(w) = r.windows(2).find(|w| w[0].1 > w[1].0) {
                return Err(PhaseError::ReceiveOverlap {
                    tile: tile as u32,
                    first: w[0].2,
                    second: w[1].2,
                    address: w[1].0,
                });
            }
            // Receives are disjoint and sorted, so one merge-like sweep over
            // the sorted sends finds any receive that overlaps a send.
            let s = &mut sends[tile];
            s.sort_unstable();
            for send in s.iter() {
                let i = r.partition_point(|x| x.1 <= send.0);
                if let Some(x) = r.get(i) {
                    if x.0 < send.1 {
                        return Err(PhaseError::ReceiveOverwritesSend {
                            tile: tile as u32,
                            receive: x.2,
                            send: send.2,
                            address: x.0.max(send.0),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The endpoint lower bound in words: the most words any one tile must
    /// send or receive in this phase (each port moves one word per cycle).
    pub fn endpoint_bound(&self) -> u64 {
        let mut load = vec![(0u64, 0u64); self.tiles as usize];
        for t in &self.transfers {
            load[t.source as usize].0 += t.words() as u64;
            for d in &t.destinations {
                load[d.tile as usize].1 += t.words() as u64;
            }
        }
        load.iter().map(|&(s, r)| s.max(r)).max().unwrap_or(0)
    }
}
