//! Synthetic phases for tests, fuzzing and the benchmark, shaped like the
//! exchange phases of the attention workload (see docs/exchange.md).
//!
//! Every generator lays data out so that the phase validates: each tile's
//! send sources are packed upward from [`SEND_BASE`] and its receive
//! destinations upward from [`RECV_BASE`], so no two receives overlap and no
//! receive touches a send source.

use crate::phase::{Destination, Phase, Transfer};
use crate::rng::SplitMix64;

/// First address of send sources in synthetic phases.
pub const SEND_BASE: u32 = 0x80000;
/// First address of receive destinations in synthetic phases.
pub const RECV_BASE: u32 = 0xB4000;

/// Builds a phase while handing out addresses.
pub struct PhaseBuilder {
    phase: Phase,
    send_cursor: Vec<u32>,
    recv_cursor: Vec<u32>,
}

impl PhaseBuilder {
    /// An empty phase on `tiles` tiles.
    pub fn new(tiles: u32) -> Self {
        PhaseBuilder {
            phase: Phase {
                tiles,
                transfers: Vec::new(),
                spans: None,
            },
            send_cursor: vec![SEND_BASE; tiles as usize],
            recv_cursor: vec![RECV_BASE; tiles as usize],
        }
    }

    /// Adds a transfer of `words` words from `source` to `destinations`
    /// (distinct tiles) at the next free addresses; returns its id.
    pub fn add(&mut self, source: u32, destinations: &[u32], words: u32) -> u32 {
        let id = self.phase.transfers.len() as u32;
        let bytes = 4 * words;
        let source_address = self.send_cursor[source as usize];
        self.send_cursor[source as usize] += bytes;
        let destinations = destinations
            .iter()
            .map(|&tile| {
                let address = self.recv_cursor[tile as usize];
                self.recv_cursor[tile as usize] += bytes;
                Destination { tile, address }
            })
            .collect();
        self.phase.transfers.push(Transfer {
            id,
            source,
            source_address,
            destinations,
            bytes,
        });
        id
    }

    /// The phase.
    pub fn finish(self) -> Phase {
        self.phase
    }
}

/// All-to-all: every tile sends `per_tile` transfers of `min_words..=max_words`
/// words, one to each of `per_tile` distinct offsets (so every tile also
/// receives `per_tile` transfers).
pub fn all_to_all(tiles: u32, per_tile: u32, min_words: u32, max_words: u32, seed: u64) -> Phase {
    let mut rng = SplitMix64(seed);
    let per_tile = per_tile.min(tiles - 1);
    // Distinct non-zero offsets, chosen by a partial Fisher-Yates shuffle.
    let mut offsets: Vec<u32> = (1..tiles).collect();
    for i in 0..per_tile as usize {
        let j = i + rng.below((offsets.len() - i) as u64) as usize;
        offsets.swap(i, j);
    }
    let mut b = PhaseBuilder::new(tiles);
    for &off in &offsets[..per_tile as usize] {
        for s in 0..tiles {
            let w = rng.range(min_words as u64, max_words as u64) as u32;
            b.add(s, &[(s + off) % tiles], w);
        }
    }
    b.finish()
}

/// Scatter: tile `source` sends `total_words` in `transfers` near-equal
/// transfers, one to each of the next `transfers` tiles.
pub fn scatter(tiles: u32, transfers: u32, total_words: u32) -> Phase {
    let mut b = PhaseBuilder::new(tiles);
    for i in 0..transfers {
        let w = total_words / transfers + u32::from(i < total_words % transfers);
        b.add(0, &[1 + i % (tiles - 1)], w);
    }
    b.finish()
}

/// Gather: `transfers` tiles each send near-equal parts of `total_words` to tile 0.
pub fn gather(tiles: u32, transfers: u32, total_words: u32) -> Phase {
    let mut b = PhaseBuilder::new(tiles);
    for i in 0..transfers {
        let w = total_words / transfers + u32::from(i < total_words % transfers);
        b.add(1 + i % (tiles - 1), &[0], w);
    }
    b.finish()
}

/// Broadcast-like: `transfers` transfers of near-equal parts of `total_words`,
/// from distinct sources, each multicast to `fanout` tiles chosen at random;
/// receivers take random subsets so that the receive loads differ.
pub fn broadcast(tiles: u32, transfers: u32, total_words: u32, fanout: u32, seed: u64) -> Phase {
    let mut rng = SplitMix64(seed);
    let mut b = PhaseBuilder::new(tiles);
    for i in 0..transfers {
        let w = total_words / transfers + u32::from(i < total_words % transfers);
        let source = i % tiles;
        let mut dests: Vec<u32> = Vec::new();
        while (dests.len() as u32) < fanout.min(tiles - 1) {
            let d = rng.below(tiles as u64) as u32;
            if d != source && !dests.contains(&d) {
                dests.push(d);
            }
        }
        b.add(source, &dests, w);
    }
    b.finish()
}

/// A random phase for fuzzing: `transfers` transfers of 1..=`max_words`
/// words with 1..=`max_fanout` destinations on `tiles` tiles. About one in
/// four transfers continues the previous one (same source and destinations,
/// adjacent addresses) so that coalescing has work to do.
pub fn random(
    rng: &mut SplitMix64,
    tiles: u32,
    transfers: u32,
    max_words: u32,
    max_fanout: u32,
) -> Phase {
    let mut b = PhaseBuilder::new(tiles);
    let mut last: Option<(u32, Vec<u32>)> = None;
    for _ in 0..transfers {
        let w = rng.range(1, max_words as u64) as u32;
        if let Some((s, d)) = last.as_ref().filter(|_| rng.below(4) == 0) {
            let (s, d) = (*s, d.clone());
            b.add(s, &d, w);
            continue;
        }
        let source = rng.below(tiles as u64) as u32;
        let fanout = rng.range(1, max_fanout.min(tiles) as u64) as u32;
        let mut dests: Vec<u32> = Vec::new();
        while (dests.len() as u32) < fanout {
            let d = rng.below(tiles as u64) as u32;
            if !dests.contains(&d) {
                dests.push(d);
            }
        }
        b.add(source, &dests, w);
        last = Some((source, dests));
    }
    b.finish()
}

/// A block of [`strided`]: source, destinations, rows, words a row, and
/// the strides of the source and of each destination.
type Block = (u32, Vec<u32>, u32, u32, Vec<u32>);

/// A random phase of blocks moved row by row, as a compiler moves a head's
/// columns out of a wider matrix or a transposed block's lines into a
/// narrower one: each block is `runs` transfers of one length from one
/// source to one destination set, whose addresses step by a constant at
/// the source and at each destination (a constant that may leave a gap, or
/// none). Every block's rows lie in a span of their own on each tile
/// ([`Phase::spans`]), with a gap after each span; about one in four
/// blocks is placed right after the previous one's span on every tile, so
/// that a stride continued past a span would line up with its rows and
/// only the spans keep them apart. Some blocks are multicast, and some
/// sources send to themselves.
pub fn strided(
    rng: &mut SplitMix64,
    tiles: u32,
    blocks: u32,
    max_runs: u32,
    max_run_words: u32,
) -> Phase {
    let mut b = PhaseBuilder::new(tiles);
    let mut spans: Vec<Vec<(u32, u32)>> = vec![Vec::new(); tiles as usize];
    let mut last: Option<Block> = None;
    for _ in 0..blocks {
        // Either a block that continues the previous block's stride pattern
        // (same tiles, rows, run length and strides) or a fresh one.
        let (source, dests, runs, words, strides) = match last.take().filter(|_| rng.below(4) == 0)
        {
            Some(l) => l,
            None => {
                let source = rng.below(tiles as u64) as u32;
                let fanout = rng.range(1, 3.min(tiles) as u64) as u32;
                let mut dests: Vec<u32> = Vec::new();
                while (dests.len() as u32) < fanout {
                    let d = rng.below(tiles as u64) as u32;
                    if !dests.contains(&d) {
                        dests.push(d);
                    }
                }
                let runs = rng.range(1, max_runs as u64) as u32;
                let words = rng.range(1, max_run_words as u64) as u32;
                // A stride of the run itself (contiguous at that end) or longer.
                let strides: Vec<u32> = (0..=fanout)
                    .map(|_| 4 * (words + rng.below(3) as u32 * rng.range(1, 8) as u32))
                    .collect();
                (source, dests, runs, words, strides)
            }
        };
        let tiles_of = std::iter::once(source).chain(dests.iter().copied());
        let mut starts = Vec::new();
        for (end, tile) in tiles_of.enumerate() {
            let cursor = if end == 0 {
                &mut b.send_cursor[tile as usize]
            } else {
                &mut b.recv_cursor[tile as usize]
            };
            let start = *cursor;
            let bytes = (runs - 1) * strides[end] + 4 * words;
            spans[tile as usize].push((start, start + bytes));
            starts.push(start);
            // The next block on this tile follows right after this span's
            // rows (a continued stride) or after a gap.
            *cursor = start + runs * strides[end] + if rng.below(2) == 0 { 0 } else { 16 };
        }
        for r in 0..runs {
            let id = b.phase.transfers.len() as u32;
            b.phase.transfers.push(Transfer {
                id,
                source,
                source_address: starts[0] + r * strides[0],
                destinations: dests
                    .iter()
                    .enumerate()
                    .map(|(i, &tile)| Destination {
                        tile,
                        address: starts[i + 1] + r * strides[i + 1],
                    })
                    .collect(),
                bytes: 4 * words,
            });
        }
        last = Some((source, dests, runs, words, strides));
    }
    for s in &mut spans {
        s.sort_unstable();
    }
    b.phase.spans = Some(spans);
    b.phase
}
