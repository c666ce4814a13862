//! Lower bounds on the horizon of a phase, valid for every schedule that the
//! ISA allows (not only for the ones this crate produces).
//!
//! Times are cycles after the exchange phase start `T0`. With an issue
//! offset `c` (descriptor i of a tile's table issues at cycle `c + i`):
//! - a tile's send port moves one word per cycle from cycle `c` on, so the
//!   phase lasts at least `c + words sent`; likewise for words received;
//! - a tile that both sends and receives has two first descriptors, one
//!   issued at `c + 1` or later, so the phase lasts at least
//!   `c + 1 + min(words sent, words received)`;
//! - a tile whose table needs at least `D` descriptors has one issued at
//!   `c + D - 1` or later, and it moves at least one word, so the phase lasts
//!   at least `c + D`. A send descriptor covers one contiguous source range,
//!   so `D` counts at least the maximal contiguous runs of the union of the
//!   tile's send sources; a receive descriptor writes one contiguous range
//!   from one source, so `D` counts at least the maximal runs of the tile's
//!   destination ranges that are contiguous and come from one source.

use crate::phase::Phase;

/// The bounds of one phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The endpoint bound in words: the most words any tile sends or receives
    /// (the figure the seed logs as `endpoint_lower_bound`).
    pub endpoint_words: u64,
    /// The bound on the horizon in cycles after `T0`: max over tiles of
    /// `c + max(words sent, words received, descriptors needed,
    /// 1 + min(words sent, words received) when both are positive)`; 0 when the
    /// phase is empty.
    pub horizon: u64,
    /// A tile attaining `horizon` (the lowest such tile).
    pub critical_tile: u32,
}

/// Computes [`Bounds`] for a validated phase and issue offset `c`.
pub fn bounds(phase: &Phase, issue_offset: u64) -> Bounds {
    let n = phase.tiles as usize;
    let mut sent = vec![0u64; n];
    let mut received = vec![0u64; n];
    let mut send_ranges: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n];
    // (address, end, source) of every destination range of a tile.
    let mut recv_ranges: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); n];
    for t in &phase.transfers {
        sent[t.source as usize] += t.words() as u64;
        send_ranges[t.source as usize].push((t.source_address, t.source_address + t.bytes));
        for d in &t.destinations {
            received[d.tile as usize] += t.words() as u64;
            recv_ranges[d.tile as usize].push((d.address, d.address + t.bytes, t.source));
        }
    }
    let mut best = Bounds {
        endpoint_words: 0,
        horizon: 0,
        critical_tile: 0,
    };
    for tile in 0..n {
        let endpoint = sent[tile].max(received[tile]);
        best.endpoint_words = best.endpoint_words.max(endpoint);
        if endpoint == 0 {
            continue;
        }
        let s = &mut send_ranges[tile];
        s.sort_unstable();
        let mut send_runs = 0u64;
        let mut reach = 0u32;
        for &(lo, hi) in s.iter() {
            if send_runs == 0 || lo > reach {
                send_runs += 1;
            }
            reach = reach.max(hi);
        }
        let r = &mut recv_ranges[tile];
        r.sort_unstable();
        let recv_runs = r
            .iter()
            .enumerate()
            .filter(|&(i, x)| i == 0 || !(r[i - 1].1 == x.0 && r[i - 1].2 == x.2))
            .count() as u64;
        // A tile that sends and receives issues two first descriptors, one of
        // them at `c + 1` or later, so one port starts a cycle late.
        let both = if sent[tile] > 0 && received[tile] > 0 {
            sent[tile].min(received[tile]) + 1
        } else {
            0
        };
        let h = issue_offset + endpoint.max(send_runs + recv_runs).max(both);
        if h > best.horizon {
            best.horizon = h;
            best.critical_tile = tile as u32;
        }
    }
    best
}
