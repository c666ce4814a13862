//! Lowering: per-tile `xtab` descriptor tables from a schedule.
//!
//! A descriptor is 16 bytes, four little-endian u32: `{kind, address, words,
//! start}`, kind = [`SEND_KIND`] for a send, else the source tile of a
//! receive; `start` is in cycles after the exchange phase start `T0`.
//!
//! Each piece becomes one send descriptor on its source tile and one receive
//! descriptor on each destination tile. Descriptors are then merged where the
//! ISA lets one descriptor do the work of two: consecutive sends of a tile
//! that are back to back in time and contiguous in memory, and consecutive
//! receives of a tile from one source that are back to back in time and
//! contiguous in memory (a receive may span consecutive sends of its source).
//! A table lists the tile's descriptors sorted by (start, sends first,
//! address). Descriptor i issues at `c + i`, where `c` is the issue offset
//! of the standard supervisor prologue ([`XTAB_ISSUE_OFFSET`]); lowering
//! checks `start_i >= c + i` and fails otherwise.
//!
//! The standard prologue ([`supervisor_exchange_asm`]) is `sync`, two
//! `setzi` (table address and count), `xtab`, `xend`. The supervisor owns all
//! issue slots in the exchange phase and issues once per
//! `CONTEXT_ISSUE_INTERVAL` cycles, so `xtab` issues at cycle
//! `2 * CONTEXT_ISSUE_INTERVAL = 12` after `T0`, `xend` at
//! `12 + 6 * max(1, ceil(D / 6))` for `D` descriptors, and the tile resumes
//! compute at `max(xend + 6, end of its last transfer)`
//! ([`Lowered::exchange_cycles`]).

use crate::coalesce::Job;
use crate::schedule::Schedule;
use ipu_arch::CONTEXT_ISSUE_INTERVAL;
use std::fmt;

/// `kind` of a send descriptor.
pub const SEND_KIND: u32 = u32::MAX;
/// Bytes of one descriptor.
pub const DESCRIPTOR_BYTES: usize = 16;
/// Cycle (after `T0`) at which the standard prologue issues `xtab`.
pub const XTAB_ISSUE_OFFSET: u64 = 2 * CONTEXT_ISSUE_INTERVAL as u64;

/// One `xtab` descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Descriptor {
    /// [`SEND_KIND`], or the source tile of a receive.
    pub kind: u32,
    /// Byte address on this tile (send source or receive destination).
    pub address: u32,
    /// Words moved, one per cycle.
    pub words: u32,
    /// First cycle after `T0`.
    pub start: u32,
}

impl Descriptor {
    /// True for a send.
    pub fn is_send(&self) -> bool {
        self.kind == SEND_KIND
    }

    /// The 16-byte encoding read by `xtab`.
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        for (i, v) in [self.kind, self.address, self.words, self.start]
            .into_iter()
            .enumerate()
        {
            b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Decodes 16 bytes.
    pub fn from_bytes(b: &[u8; DESCRIPTOR_BYTES]) -> Descriptor {
        let w = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        Descriptor {
            kind: w(0),
            address: w(1),
            words: w(2),
            start: w(3),
        }
    }
}

impl fmt::Display for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_send() {
            write!(
                f,
                "send {:#x} words={} start={}",
                self.address, self.words, self.start
            )
        } else {
            write!(
                f,
                "recv {:#x} words={} start={} from={}",
                self.address, self.words, self.start, self.kind
            )
        }
    }
}

/// Encodes a table.
pub fn encode_table(table: &[Descriptor]) -> Vec<u8> {
    table.iter().flat_map(|d| d.to_bytes()).collect()
}

/// Decodes a table; its length must be a multiple of 16 bytes.
pub fn decode_table(bytes: &[u8]) -> Result<Vec<Descriptor>, LowerError> {
    if !bytes.len().is_multiple_of(DESCRIPTOR_BYTES) {
        return Err(LowerError::TableLength { bytes: bytes.len() });
    }
    Ok(bytes
        .chunks_exact(DESCRIPTOR_BYTES)
        .map(|c| Descriptor::from_bytes(c.try_into().expect("16 bytes")))
        .collect())
}

/// The supervisor exchange code of the standard prologue for a table at
/// `table_address` with `count` descriptors, in ipu-asm syntax. It starts
/// with `sync` and ends after `xend`; `$m1` and `$m2` are clobbered.
pub fn supervisor_exchange_asm(table_address: u32, count: u32) -> String {
    format!("sync\nsetzi $m1, {table_address}\nsetzi $m2, {count}\nxtab $m1, $m2\nxend\n")
}

/// Errors of lowering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LowerError {
    /// A start cycle or address that does not fit a u32 field.
    FieldOverflow { tile: u32, start: u64 },
    /// Descriptor `index` of `tile` would issue after its start cycle.
    Late {
        tile: u32,
        index: usize,
        start: u64,
        issued: u64,
    },
    /// A table byte length that is not a multiple of 16.
    TableLength { bytes: usize },
}

impl fmt::Display for LowerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LowerError::FieldOverflow { tile, start } => {
                write!(f, "tile {tile}: start cycle {start} does not fit a descriptor")
            }
            LowerError::Late { tile, index, start, issued } => write!(
                f,
                "tile {tile}: descriptor {index} starts at cycle {start} but issues at cycle {issued}"
            ),
            LowerError::TableLength { bytes } => {
                write!(f, "descriptor table of {bytes} bytes is not a multiple of 16")
            }
        }
    }
}

impl std::error::Error for LowerError {}

/// The tables of one phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lowered {
    /// One table per tile (index = tile), in issue order.
    pub tables: Vec<Vec<Descriptor>>,
    /// Issue offset the tables were checked against.
    pub issue_offset: u64,
}

impl Lowered {
    /// Descriptors over all tiles.
    pub fn descriptors(&self) -> usize {
        self.tables.iter().map(Vec::len).sum()
    }

    /// End of the last transfer (cycles after `T0`).
    pub fn horizon(&self) -> u64 {
        self.tables
            .iter()
            .flatten()
            .map(|d| d.start as u64 + d.words as u64)
            .max()
            .unwrap_or(0)
    }

    /// Exchange cycles of tile `tile` under the standard prologue: from `T0`
    /// to the cycle its supervisor resumes compute.
    pub fn tile_exchange_cycles(&self, tile: u32) -> u64 {
        let table = &self.tables[tile as usize];
        let interval = CONTEXT_ISSUE_INTERVAL as u64;
        let xend = self.issue_offset + interval * (table.len() as u64).div_ceil(interval).max(1);
        let last = table
            .iter()
            .map(|d| d.start as u64 + d.words as u64)
            .max()
            .unwrap_or(0);
        (xend + interval).max(last)
    }

    /// Exchange cycles of the phase under the standard prologue: the largest
    /// [`Lowered::tile_exchange_cycles`]. It equals the horizon whenever the
    /// horizon exceeds `c + 6 * ceil(D / 6) + 6` on every tile, and exceeds
    /// it by at most 11 cycles otherwise.
    pub fn exchange_cycles(&self) -> u64 {
        (0..self.tables.len() as u32)
            .map(|t| self.tile_exchange_cycles(t))
            .max()
            .unwrap_or(0)
    }

    /// The encoded table of `tile`.
    pub fn table_bytes(&self, tile: u32) -> Vec<u8> {
        encode_table(&self.tables[tile as usize])
    }
}

/// Builds the tables of `schedule` for `tiles` tiles, merging descriptors
/// where the ISA allows and checking the issue constraint.
pub fn lower(
    jobs: &[Job],
    schedule: &Schedule,
    tiles: u32,
    issue_offset: u64,
) -> Result<Lowered, LowerError> {
    let n = tiles as usize;
    let mut sends: Vec<Vec<Descriptor>> = vec![Vec::new(); n];
    let mut recvs: Vec<Vec<Descriptor>> = vec![Vec::new(); n];
    for pl in &schedule.placed {
        let job = &jobs[pl.piece.job as usize];
        let start = u32::try_from(pl.start + pl.piece.words as u64)
            .map(|_| pl.start as u32)
            .map_err(|_| LowerError::FieldOverflow {
                tile: job.source,
                start: pl.start,
            })?;
        let offset = 4 * pl.piece.offset;
        sends[job.source as usize].push(Descriptor {
            kind: SEND_KIND,
            address: job.source_address + offset,
            words: pl.piece.words,
            start,
        });
        for d in &job.destinations {
            recvs[d.tile as usize].push(Descriptor {
                kind: job.source,
                address: d.address + offset,
                words: pl.piece.words,
                start,
            });
        }
    }
    let mut tables = Vec::with_capacity(n);
    for tile in 0..n {
        let mut s = std::mem::take(&mut sends[tile]);
        s.sort_unstable_by_key(|d| (d.start, d.address));
        let mut r = std::mem::take(&mut recvs[tile]);
        // Sorting by (source, start) puts each source's receives in time order,
        // so back-to-back receives of one source are neighbours.
        r.sort_unstable_by_key(|d| (d.kind, d.start, d.address));
        let mut table = merge_runs(s);
        table.extend(merge_runs(r));
        table.sort_unstable_by_key(|d| (d.start, !d.is_send(), d.address, d.kind));
        for (i, d) in table.iter().enumerate() {
            let issued = issue_offset + i as u64;
            if (d.start as u64) < issued {
                return Err(LowerError::Late {
                    tile: tile as u32,
                    index: i,
                    start: d.start as u64,
                    issued,
                });
            }
        }
        tables.push(table);
    }
    Ok(Lowered {
        tables,
        issue_offset,
    })
}

/// Merges neighbours of one kind that continue each other in time and memory.
fn merge_runs(list: Vec<Descriptor>) -> Vec<Descriptor> {
    let mut out: Vec<Descriptor> = Vec::with_capacity(list.len());
    for d in list {
        if let Some(last) = out.last_mut() {
            if last.kind == d.kind
                && last.start + last.words == d.start
                && last.address + 4 * last.words == d.address
            {
                last.words += d.words;
                continue;
            }
        }
        out.push(d);
    }
    out
}
