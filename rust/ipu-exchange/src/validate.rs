//! The independent checker: proves from the descriptor tables alone that
//! they perform a phase exactly and obey every exchange rule.
//!
//! It shares nothing with the scheduler or the lowering except the
//! [`Descriptor`] type and the phase input, so a bug in either shows up as
//! a checker error (the regalloc2 checker model). It re-derives:
//! - issue: a descriptor in table slot i (after its stride prefix, if any)
//!   starts no earlier than `c + i`;
//! - fields: addresses 4-aligned, every run's range inside SRAM, word counts
//!   and strides' run lengths positive, receive sources that exist;
//! - ports: no two sends (receives) of one tile overlap in time;
//! - sources: every cycle of every receive is covered by a send of the named
//!   source in that cycle; every word sent is received by at least one tile;
//! - memory: no receive writes a byte its own tile sends in the phase;
//! - delivery: the words that land on each tile, traced through the sends
//!   to source tile and address, are exactly the transfers of the phase:
//!   each byte of each destination receives the right source byte once, and
//!   nothing is written anywhere else.

use crate::lower::Descriptor;
use crate::phase::Phase;
use ipu_arch::{SRAM_BASE, SRAM_END, TILES_PER_CHIP};
use rayon::prelude::*;
use std::fmt;

/// A rule that a set of tables breaks; tile and descriptor index (position in
/// the tile's table) name the culprit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// The number of tables differs from the phase's tile count.
    TableCount { tables: usize, tiles: u32 },
    /// Descriptor issued after its start cycle.
    Late {
        tile: u32,
        index: usize,
        start: u32,
        issued: u64,
    },
    /// Zero words.
    Empty { tile: u32, index: usize },
    /// A stride of runs of zero words.
    BadStride {
        tile: u32,
        index: usize,
        run: u32,
        bytes: u32,
    },
    /// Misaligned address or a range outside SRAM.
    BadRange {
        tile: u32,
        index: usize,
        address: u32,
        words: u32,
    },
    /// A receive naming a tile outside the phase.
    BadSource {
        tile: u32,
        index: usize,
        source: u32,
    },
    /// Two sends of one tile overlap in time.
    SendOverlap {
        tile: u32,
        first: usize,
        second: usize,
    },
    /// Two receives of one tile overlap in time.
    RecvOverlap {
        tile: u32,
        first: usize,
        second: usize,
    },
    /// A receive cycle in which the named source sends nothing.
    NoSourceWord {
        tile: u32,
        index: usize,
        source: u32,
        cycle: u64,
    },
    /// A sent word that no tile receives.
    UnreceivedWord { tile: u32, index: usize, cycle: u64 },
    /// A receive that overwrites a send source of its own tile.
    ReceiveOverwritesSend {
        tile: u32,
        index: usize,
        address: u32,
    },
    /// The delivered bytes differ from the phase (first difference by tile and
    /// address): `expected`/`found` are (source tile, source address) of the
    /// word at `address`, `None` when no word should arrive / none arrived.
    Delivery {
        tile: u32,
        address: u32,
        expected: Option<(u32, u32)>,
        found: Option<(u32, u32)>,
    },
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CheckError::*;
        let word = |w: Option<(u32, u32)>| match w {
            Some((t, a)) => format!("the word at {a:#x} of tile {t}"),
            None => "nothing".to_string(),
        };
        match *self {
            TableCount { tables, tiles } => {
                write!(f, "{tables} descriptor tables for a phase of {tiles} tiles")
            }
            Late { tile, index, start, issued } => write!(
                f,
                "tile {tile}, descriptor {index}: starts at cycle {start} but issues at cycle {issued}"
            ),
            Empty { tile, index } => write!(f, "tile {tile}, descriptor {index}: zero words"),
            BadStride { tile, index, run, bytes } => write!(
                f,
                "tile {tile}, descriptor {index}: a stride of runs of {run} words every {bytes} bytes"
            ),
            BadRange { tile, index, address, words } => write!(
                f,
                "tile {tile}, descriptor {index}: {words} words at {address:#x} are misaligned or \
                 leave SRAM ({SRAM_BASE:#x}..{SRAM_END:#x})"
            ),
            BadSource { tile, index, source } => write!(
                f,
                "tile {tile}, descriptor {index}: receives from tile {source}, which is not in the phase"
            ),
            SendOverlap { tile, first, second } => write!(
                f,
                "tile {tile}: sends of descriptors {first} and {second} overlap in time"
            ),
            RecvOverlap { tile, first, second } => write!(
                f,
                "tile {tile}: receives of descriptors {first} and {second} overlap in time"
            ),
            NoSourceWord { tile, index, source, cycle } => write!(
                f,
                "tile {tile}, descriptor {index}: tile {source} sends nothing in cycle {cycle}"
            ),
            UnreceivedWord { tile, index, cycle } => write!(
                f,
                "tile {tile}, descriptor {index}: the word sent in cycle {cycle} reaches no tile"
            ),
            ReceiveOverwritesSend { tile, index, address } => write!(
                f,
                "tile {tile}, descriptor {index}: receive at {address:#x} overwrites a send source \
                 of the same tile"
            ),
            Delivery { tile, address, expected, found } => write!(
                f,
                "tile {tile}, address {address:#x}: expected {} but the tables deliver {}",
                word(expected),
                word(found)
            ),
        }
    }
}

impl std::error::Error for CheckError {}

/// What the checker measured on valid tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckSummary {
    /// End of the last transfer, cycles after `T0`.
    pub horizon: u64,
    /// Descriptors over all tiles.
    pub descriptors: usize,
    /// Words written into destination memory over all tiles.
    pub words_delivered: u64,
}

/// A delivered run: `words` words land at `address` on `tile`, taken from
/// `source_address` on `source`. Ordered by destination for comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Run {
    tile: u32,
    address: u32,
    source: u32,
    source_address: u32,
    words: u32,
}

/// Sorts runs by destination and merges neighbours that continue each other
/// at both ends; two sets of runs deliver the same bytes from the same places
/// exactly when their normal forms are equal (provided neither overlaps
/// itself, which [`first_difference`] checks on the found side).
fn normalize(runs: Vec<Run>) -> Vec<Run> {
    // Bucketing by tile first (a counting sort) and then sorting each tile's
    // runs gives the order of one sort of the whole list, in cache-sized
    // slices that sort in parallel (millions of runs on large phases).
    let Some(first) = runs.first().copied() else {
        return runs;
    };
    let tiles = runs.iter().map(|r| r.tile as usize).max().unwrap_or(0) + 1;
    if tiles > runs.len() + TILES_PER_CHIP as usize {
        // Tile numbers out of all proportion (a phase that was never
        // validated): one plain sort, without a bucket per number.
        let mut runs = runs;
        runs.sort_unstable();
        return merge_runs(runs);
    }
    let mut begin = vec![0usize; tiles + 1];
    for r in &runs {
        begin[r.tile as usize + 1] += 1;
    }
    for t in 0..tiles {
        begin[t + 1] += begin[t];
    }
    let mut next = begin.clone();
    let mut bucketed = vec![first; runs.len()];
    for r in runs {
        bucketed[next[r.tile as usize]] = r;
        next[r.tile as usize] += 1;
    }
    let mut slices: Vec<&mut [Run]> = Vec::with_capacity(tiles);
    let mut rest: &mut [Run] = &mut bucketed;
    for t in 0..tiles {
        let (slice, tail) = rest.split_at_mut(begin[t + 1] - begin[t]);
        slices.push(slice);
        rest = tail;
    }
    slices.par_iter_mut().for_each(|s| s.sort_unstable());
    merge_runs(bucketed)
}

/// Merges neighbours of sorted runs that continue each other at both ends.
fn merge_runs(runs: Vec<Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    for r in runs {
        if let Some(l) = out.last_mut() {
            if l.tile == r.tile
                && l.source == r.source
                && l.address + 4 * l.words == r.address
                && l.source_address + 4 * l.words == r.source_address
            {
                l.words += r.words;
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// Checks `tables` (index = tile, each in issue order) against `phase`.
pub fn check(
    phase: &Phase,
    tables: &[Vec<Descriptor>],
    issue_offset: u64,
) -> Result<CheckSummary, CheckError> {
    let tiles = phase.tiles;
    if tables.len() != tiles as usize {
        return Err(CheckError::TableCount {
            tables: tables.len(),
            tiles,
        });
    }
    // The phase's side does not look at the tables: it runs beside them.
    let (expected, traced) = rayon::join(
        || expected_runs(phase),
        || trace_tables(tiles, tables, issue_offset),
    );
    let traced = traced?;
    if let Some(e) = first_difference(&expected, &traced.found) {
        return Err(e);
    }
    Ok(CheckSummary {
        horizon: traced.horizon,
        descriptors: tables.iter().map(Vec::len).sum(),
        words_delivered: traced.words_delivered,
    })
}

/// The normalized runs the phase asks for.
fn expected_runs(phase: &Phase) -> Vec<Run> {
    let mut expected: Vec<Run> = Vec::new();
    for t in &phase.transfers {
        for d in &t.destinations {
            expected.push(Run {
                tile: d.tile,
                address: d.address,
                source: t.source,
                source_address: t.source_address,
                words: t.words(),
            });
        }
    }
    normalize(expected)
}

/// What the tables deliver: normalized runs traced to their sources, the
/// horizon and the words written.
struct Traced {
    found: Vec<Run>,
    horizon: u64,
    words_delivered: u64,
}

/// A receive run: (start, end, address, descriptor index, source tile).
type ReceiveRun = (u64, u64, u32, usize, u32);

/// Checks every rule that concerns the tables alone and traces every
/// received word to its source.
fn trace_tables(
    tiles: u32,
    tables: &[Vec<Descriptor>],
    issue_offset: u64,
) -> Result<Traced, CheckError> {
    let mut horizon = 0u64;
    // Per tile: sends as (start, end, address, index), sorted by start, one
    // entry per run of a strided descriptor.
    let mut sends: Vec<Vec<(u64, u64, u32, usize)>> = Vec::with_capacity(tables.len());
    // Per tile: receives as (start, end, address, index, source).
    let mut receives: Vec<Vec<ReceiveRun>> = Vec::with_capacity(tables.len());
    for (tile, table) in tables.iter().enumerate() {
        let tile = tile as u32;
        let mut s = Vec::new();
        let mut r = Vec::new();
        let mut slot = 0usize;
        for (index, d) in table.iter().enumerate() {
            // A strided descriptor issues in the slot after its prefix.
            slot += if d.stride.is_some() { 2 } else { 1 };
            let issued = issue_offset + slot as u64 - 1;
            if (d.start as u64) < issued {
                return Err(CheckError::Late {
                    tile,
                    index,
                    start: d.start,
                    issued,
                });
            }
            if d.words == 0 {
                return Err(CheckError::Empty { tile, index });
            }
            if let Some(st) = d.stride {
                if st.run == 0 {
                    return Err(CheckError::BadStride {
                        tile,
                        index,
                        run: st.run,
                        bytes: st.bytes,
                    });
                }
            }
            if !d.is_send() && d.kind >= tiles {
                return Err(CheckError::BadSource {
                    tile,
                    index,
                    source: d.kind,
                });
            }
            // Run k of a stride starts at address + k * bytes and moves in the
            // cycles after run k - 1.
            let (run, step) = d
                .stride
                .map_or((d.words, 0), |st| (st.run, st.bytes as u64));
            let mut first = 0u32;
            let mut address = d.address as u64;
            while first < d.words {
                let words = run.min(d.words - first);
                let end = address + 4 * words as u64;
                if !address.is_multiple_of(4) || address < SRAM_BASE as u64 || end > SRAM_END as u64
                {
                    return Err(CheckError::BadRange {
                        tile,
                        index,
                        address: address as u32,
                        words,
                    });
                }
                let t0 = d.start as u64 + first as u64;
                let t1 = t0 + words as u64;
                horizon = horizon.max(t1);
                if d.is_send() {
                    s.push((t0, t1, address as u32, index));
                } else {
                    r.push((t0, t1, address as u32, index, d.kind));
                }
                first += words;
                address += step;
            }
        }
        s.sort_unstable();
        r.sort_unstable();
        if let Some(w) = s.windows(2).find(|w| w[0].1 > w[1].0) {
            return Err(CheckError::SendOverlap {
                tile,
                first: w[0].3,
                second: w[1].3,
            });
        }
        if let Some(w) = r.windows(2).find(|w| w[0].1 > w[1].0) {
            return Err(CheckError::RecvOverlap {
                tile,
                first: w[0].3,
                second: w[1].3,
            });
        }
        // Receive destination vs own send sources, by memory address.
        let mut src: Vec<(u64, u64)> = s
            .iter()
            .map(|x| (x.2 as u64, x.2 as u64 + 4 * (x.1 - x.0)))
            .collect();
        src.sort_unstable();
        let mut reach = Vec::with_capacity(src.len());
        let mut m = 0u64;
        for x in &src {
            m = m.max(x.1);
            reach.push(m);
        }
        for x in &r {
            let (lo, hi) = (x.2 as u64, x.2 as u64 + 4 * (x.1 - x.0));
            let i = src.partition_point(|y| y.0 < hi);
            if i > 0 && reach[i - 1] > lo {
                return Err(CheckError::ReceiveOverwritesSend {
                    tile,
                    index: x.3,
                    address: x.2,
                });
            }
        }
        sends.push(s);
        receives.push(r);
    }
    // Trace every receive through its source's sends; collect the cycles in
    // which each source's words are received, to find unreceived words.
    let mut found: Vec<Run> = Vec::new();
    let mut heard: Vec<Vec<(u64, u64)>> = vec![Vec::new(); tiles as usize];
    let mut words_delivered = 0u64;
    for (tile, r) in receives.iter().enumerate() {
        for &(t0, end, address, index, source) in r {
            let src = &sends[source as usize];
            let mut cycle = t0;
            heard[source as usize].push((cycle, end));
            let mut i = src.partition_point(|x| x.1 <= cycle);
            while cycle < end {
                let Some(&(s0, s1, saddr, _)) = src.get(i).filter(|x| x.0 <= cycle) else {
                    return Err(CheckError::NoSourceWord {
                        tile: tile as u32,
                        index,
                        source,
                        cycle,
                    });
                };
                let upto = s1.min(end);
                found.push(Run {
                    tile: tile as u32,
                    address: address + 4 * (cycle - t0) as u32,
                    source,
                    source_address: saddr + 4 * (cycle - s0) as u32,
                    words: (upto - cycle) as u32,
                });
                words_delivered += upto - cycle;
                cycle = upto;
                i += 1;
            }
        }
    }
    for (tile, h) in heard.iter_mut().enumerate() {
        h.sort_unstable();
        let mut j = 0;
        let mut covered = 0u64; // every cycle below `covered` heard so far in the sweep
        for &(s0, s1, _, index) in &sends[tile] {
            let mut cycle = s0;
            while cycle < s1 {
                while j < h.len() && h[j].0 <= cycle {
                    covered = covered.max(h[j].1);
                    j += 1;
                }
                if covered <= cycle {
                    return Err(CheckError::UnreceivedWord {
                        tile: tile as u32,
                        index,
                        cycle,
                    });
                }
                cycle = covered;
            }
        }
    }
    Ok(Traced {
        found: normalize(found),
        horizon,
        words_delivered,
    })
}

/// The first word (by tile, address) where the normalized runs differ, or
/// where `found` writes one address twice.
fn first_difference(expected: &[Run], found: &[Run]) -> Option<CheckError> {
    for w in found.windows(2) {
        if w[0].tile == w[1].tile && w[0].address + 4 * w[0].words > w[1].address {
            return Some(CheckError::Delivery {
                tile: w[1].tile,
                address: w[1].address,
                expected: None,
                found: Some((w[1].source, w[1].source_address)),
            });
        }
    }
    if expected == found {
        return None;
    }
    // Walk both lists word by word from the first differing run.
    let k = expected
        .iter()
        .zip(found)
        .take_while(|(a, b)| a == b)
        .count();
    let (e, f) = (expected.get(k), found.get(k));
    let at = |r: &Run| (r.tile, r.address);
    let (tile, address) = match (e, f) {
        (Some(a), Some(b)) => at(a).min(at(b)),
        (Some(a), None) => at(a),
        (None, Some(b)) => at(b),
        (None, None) => unreachable!("lists differ"),
    };
    let ew = e.and_then(|r| word_at(r, tile, address));
    let fw = f.and_then(|r| word_at(r, tile, address));
    if ew != fw {
        return Some(CheckError::Delivery {
            tile,
            address,
            expected: ew,
            found: fw,
        });
    }
    // The same word starts both runs, so they differ in length: report the
    // first word past the shorter one.
    let (a, b) = (e.expect("a word exists"), f.expect("a word exists"));
    let address = a.address + 4 * a.words.min(b.words);
    Some(CheckError::Delivery {
        tile,
        address,
        expected: word_at(a, tile, address),
        found: word_at(b, tile, address),
    })
}

fn word_at(r: &Run, tile: u32, address: u32) -> Option<(u32, u32)> {
    (r.tile == tile && r.address <= address && address < r.address + 4 * r.words)
        .then(|| (r.source, r.source_address + (address - r.address)))
}

#[cfg(test)]
mod tests {
    use super::{merge_runs, normalize, Run};

    /// Bucketed normalization equals one sort of the whole list followed by
    /// merging, for tiles in range and for absurd tile numbers.
    #[test]
    fn normalize_equals_a_global_sort() {
        let mut rng = crate::rng::SplitMix64(11);
        for case in 0..200 {
            let tiles = if case % 10 == 9 {
                u32::MAX
            } else {
                1 + rng.below(40) as u32
            };
            let runs: Vec<Run> = (0..rng.below(300))
                .map(|_| Run {
                    tile: rng.below(tiles as u64) as u32,
                    // Few addresses and sources, so that runs continue each other.
                    address: 4 * rng.below(64) as u32,
                    source: rng.below(3) as u32,
                    source_address: 4 * rng.below(64) as u32,
                    words: 1 + rng.below(4) as u32,
                })
                .collect();
            let mut sorted = runs.clone();
            sorted.sort_unstable();
            assert_eq!(normalize(runs), merge_runs(sorted), "case {case}");
        }
    }
}
