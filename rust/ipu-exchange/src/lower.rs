//! Lowering: per-tile `xtab` descriptor tables from a schedule.
//!
//! A descriptor is 16 bytes, four little-endian u32: `{kind, address, words,
//! start}`, kind = [`SEND_KIND`] for a send, else the source tile of a
//! receive; `start` is in cycles after the exchange phase start `T0`. A
//! strided descriptor is preceded by a 16-byte prefix `{STRIDE_KIND, run,
//! bytes, 0}`: its words are still one per cycle from `start`, but word i is
//! at `address + (i / run) * bytes + 4 * (i % run)` (runs of `run` words,
//! each `bytes` after the previous one's start). The prefix takes an issue
//! slot of its own, so a strided descriptor counts as two slots.
//!
//! Each piece becomes one send descriptor on its source tile and one receive
//! descriptor on each destination tile, strided on the sides where a strided
//! job's runs are not contiguous. Descriptors are then merged where the ISA
//! lets one descriptor do the work of two: consecutive sends of a tile that
//! are back to back in time and continue each other in memory (contiguously
//! or as more runs of a strided descriptor), and consecutive receives of a
//! tile from one source that do the same (a receive may span consecutive
//! sends of its source). A strided descriptor never leaves the span of the
//! phase ([`crate::Phase::spans`]) that holds its first byte.
//! A table lists the tile's descriptors sorted by (start, sends first,
//! address). The entry at slot i issues at `c + i`, where `c` is the issue
//! offset of the standard supervisor prologue ([`XTAB_ISSUE_OFFSET`]);
//! lowering checks `start >= c + slot` of every descriptor and fails
//! otherwise.
//!
//! The standard prologue ([`supervisor_exchange_asm`]) is `sync`, two
//! `setzi` (table address and count), `xtab`, `xend`. The supervisor owns all
//! issue slots in the exchange phase and issues once per
//! `CONTEXT_ISSUE_INTERVAL` cycles, so `xtab` issues at cycle
//! `2 * CONTEXT_ISSUE_INTERVAL = 12` after `T0`, `xend` at
//! `12 + 6 * max(1, ceil(D / 6))` for `D` slots, and the tile resumes
//! compute at `max(xend + 6, end of its last transfer)`
//! ([`Lowered::exchange_cycles`]).

use crate::coalesce::Job;
use crate::schedule::Schedule;
use ipu_arch::CONTEXT_ISSUE_INTERVAL;
use std::fmt;

/// `kind` of a send descriptor.
pub const SEND_KIND: u32 = ipu_arch::XTAB_SEND_KIND;
/// `kind` of the prefix entry that makes the next descriptor strided.
pub const STRIDE_KIND: u32 = ipu_arch::XTAB_STRIDE_KIND;
/// Bytes of one descriptor.
pub const DESCRIPTOR_BYTES: usize = 16;
/// Cycle (after `T0`) at which the standard prologue issues `xtab`.
pub const XTAB_ISSUE_OFFSET: u64 = 2 * CONTEXT_ISSUE_INTERVAL as u64;

/// How a strided descriptor spreads its words over memory: runs of `run`
/// words, each starting `bytes` after the previous run's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stride {
    /// Words per run (at least 1).
    pub run: u32,
    /// Bytes from one run's first word to the next run's (a multiple of 4).
    pub bytes: u32,
}

/// One `xtab` descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Descriptor {
    /// [`SEND_KIND`], or the source tile of a receive.
    pub kind: u32,
    /// Byte address on this tile (send source or receive destination) of
    /// the first word.
    pub address: u32,
    /// Words moved, one per cycle.
    pub words: u32,
    /// First cycle after `T0`.
    pub start: u32,
    /// `None`: the words are contiguous from `address`; otherwise their runs.
    pub stride: Option<Stride>,
}

impl Descriptor {
    /// A contiguous descriptor.
    pub fn plain(kind: u32, address: u32, words: u32, start: u32) -> Descriptor {
        Descriptor {
            kind,
            address,
            words,
            start,
            stride: None,
        }
    }

    /// True for a send.
    pub fn is_send(&self) -> bool {
        self.kind == SEND_KIND
    }

    /// Table entries (issue slots) the descriptor takes: two when strided.
    pub fn slots(&self) -> usize {
        1 + usize::from(self.stride.is_some())
    }

    /// Lowest byte and one past the highest byte the descriptor touches, as
    /// u64 so that no field value overflows.
    pub fn footprint(&self) -> (u64, u64) {
        let a = self.address as u64;
        match self.stride {
            Some(s) if s.run > 0 && self.words > s.run => {
                let last = (self.words - 1) / s.run;
                let tail = self.words - last * s.run;
                (a, a + last as u64 * s.bytes as u64 + 4 * tail as u64)
            }
            _ => (a, a + 4 * self.words as u64),
        }
    }

    /// The table entries of the descriptor: a prefix when strided, then the
    /// descriptor itself.
    pub fn entries(&self) -> impl Iterator<Item = [u32; 4]> {
        let prefix = self.stride.map(|s| [STRIDE_KIND, s.run, s.bytes, 0]);
        prefix
            .into_iter()
            .chain([[self.kind, self.address, self.words, self.start]])
    }
}

/// Issue slots of a table: the count the supervisor passes to `xtab`.
pub fn slots(table: &[Descriptor]) -> usize {
    table.iter().map(Descriptor::slots).sum()
}

impl fmt::Display for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_send() {
            write!(
                f,
                "send {:#x} words={} start={}",
                self.address, self.words, self.start
            )?;
        } else {
            write!(
                f,
                "recv {:#x} words={} start={} from={}",
                self.address, self.words, self.start, self.kind
            )?;
        }
        if let Some(s) = self.stride {
            write!(f, " runs of {} every {:#x}", s.run, s.bytes)?;
        }
        Ok(())
    }
}

/// Encodes a table: 16 bytes per slot.
pub fn encode_table(table: &[Descriptor]) -> Vec<u8> {
    table
        .iter()
        .flat_map(Descriptor::entries)
        .flat_map(|e| e.into_iter().flat_map(u32::to_le_bytes))
        .collect()
}

/// Decodes a table; its length must be a multiple of 16 bytes, and every
/// stride prefix must be followed by a descriptor.
pub fn decode_table(bytes: &[u8]) -> Result<Vec<Descriptor>, LowerError> {
    if !bytes.len().is_multiple_of(DESCRIPTOR_BYTES) {
        return Err(LowerError::TableLength { bytes: bytes.len() });
    }
    let mut out = Vec::with_capacity(bytes.len() / DESCRIPTOR_BYTES);
    let mut stride = None;
    for (slot, c) in bytes.chunks_exact(DESCRIPTOR_BYTES).enumerate() {
        let w = |i: usize| u32::from_le_bytes(c[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        if w(0) == STRIDE_KIND {
            if stride.is_some() {
                return Err(LowerError::DanglingStride { slot: slot - 1 });
            }
            stride = Some(Stride {
                run: w(1),
                bytes: w(2),
            });
            continue;
        }
        out.push(Descriptor {
            kind: w(0),
            address: w(1),
            words: w(2),
            start: w(3),
            stride: stride.take(),
        });
    }
    if stride.is_some() {
        return Err(LowerError::DanglingStride {
            slot: bytes.len() / DESCRIPTOR_BYTES - 1,
        });
    }
    Ok(out)
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
    /// A stride prefix at `slot` that no descriptor follows.
    DanglingStride { slot: usize },
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
            LowerError::DanglingStride { slot } => {
                write!(f, "the stride prefix at slot {slot} is not followed by a descriptor")
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

    /// Table slots (16-byte entries) over all tiles.
    pub fn slots(&self) -> usize {
        self.tables.iter().map(|t| slots(t)).sum()
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
        let xend = self.issue_offset + interval * (slots(table) as u64).div_ceil(interval).max(1);
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
/// where the ISA allows (strided ones inside `spans`, [`crate::Phase::spans`])
/// and checking the issue constraint.
pub fn lower(
    jobs: &[Job],
    schedule: &Schedule,
    tiles: u32,
    issue_offset: u64,
    spans: Option<&[Vec<(u32, u32)>]>,
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
        let (offset, words) = (pl.piece.offset, pl.piece.words);
        // A piece of a strided job is whole runs; one run is contiguous.
        let strided = |end: usize| job.stride_at(end).filter(|_| words > job.run);
        sends[job.source as usize].push(Descriptor {
            kind: SEND_KIND,
            address: job.address_at(0, offset),
            words,
            start,
            stride: strided(0),
        });
        for (i, d) in job.destinations.iter().enumerate() {
            recvs[d.tile as usize].push(Descriptor {
                kind: job.source,
                address: job.address_at(i + 1, offset),
                words,
                start,
                stride: strided(i + 1),
            });
        }
    }
    let mut tables = Vec::with_capacity(n);
    for tile in 0..n {
        let tile_spans: Option<&[(u32, u32)]> = match spans {
            None => None,
            Some(s) => Some(s.get(tile).map_or(&[], Vec::as_slice)),
        };
        let mut s = std::mem::take(&mut sends[tile]);
        s.sort_unstable_by_key(|d| (d.start, d.address));
        let mut r = std::mem::take(&mut recvs[tile]);
        // Sorting by (source, start) puts each source's receives in time order,
        // so back-to-back receives of one source are neighbours.
        r.sort_unstable_by_key(|d| (d.kind, d.start, d.address));
        let mut table = merge_runs(s, tile_spans);
        table.extend(merge_runs(r, tile_spans));
        table.sort_unstable_by_key(|d| (d.start, !d.is_send(), d.address, d.kind));
        let mut slot = 0;
        for (i, d) in table.iter().enumerate() {
            // The descriptor itself issues in its last slot, after its prefix.
            slot += d.slots();
            let issued = issue_offset + slot as u64 - 1;
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

/// Merges neighbours of one kind that continue each other in time and in
/// memory: contiguously, or as the next runs of a strided descriptor inside
/// one of `spans` (`None`: anywhere; `Some(&[])`: nowhere).
fn merge_runs(list: Vec<Descriptor>, spans: Option<&[(u32, u32)]>) -> Vec<Descriptor> {
    let span_end = |address: u32| -> u64 {
        spans.map_or(u64::MAX, |s| {
            crate::phase::span_end(s, address).map_or(0, u64::from)
        })
    };
    let mut out: Vec<Descriptor> = Vec::with_capacity(list.len());
    for d in list {
        if let Some(last) = out.last_mut() {
            if last.kind == d.kind && last.start + last.words == d.start {
                if let Some(merged) = continued(last, &d) {
                    if merged.stride.is_none() || merged.footprint().1 <= span_end(last.address) {
                        *last = merged;
                        continue;
                    }
                }
            }
        }
        out.push(d);
    }
    out
}

/// `a` and `b` as one descriptor, when `b`'s words continue `a`'s in
/// memory: contiguously, or as further runs of `a`'s stride, whatever the
/// times. Two contiguous descriptors never become one strided one here: the
/// prefix would issue in `a`'s slot and push `a` and every descriptor
/// between the two one slot later, which the schedule did not allow for.
fn continued(a: &Descriptor, b: &Descriptor) -> Option<Descriptor> {
    let words = a.words.checked_add(b.words)?;
    let next = a.footprint().1;
    match (a.stride, b.stride) {
        (None, None) if next == b.address as u64 => Some(Descriptor { words, ..*a }),
        // One more run, or more runs of the same stride, after whole runs.
        (Some(s), bs)
            if a.words.is_multiple_of(s.run)
                && bs.is_none_or(|t| t == s)
                && (bs.is_some() || b.words == s.run)
                && b.address as u64
                    == a.address as u64 + (a.words / s.run) as u64 * s.bytes as u64 =>
        {
            Some(Descriptor { words, ..*a })
        }
        _ => None,
    }
}
