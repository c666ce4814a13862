//! Phase `param_copies`: parameters cross the host link once.
//!
//! A plan often holds a weight several times: a GEMM's B on every row
//! part's tiles (SigLIP's projections keep each 192 x 192 block of a weight
//! on 13 tiles). The host used to write every copy at `initialize`, so a
//! SigLIP weight crossed the host link 13 times (4.85 M host cycles for the
//! three projections where 0.37 M carry every byte once). This phase keeps
//! one copy of every byte as the host's (the first placement in host order
//! at each offset), and the `initialize` call starts with one exchange step
//! that copies it to the other placements, multicast, before any other
//! step reads them. It is the parameters' counterpart of the run call's
//! input homes (crate::segment, `HostInputs::Once`), and runs under the
//! same option.
//!
//! What stays with the host: a placement that is not whole 4-byte words
//! (the exchange moves words), one that overlaps the host's copy only in
//! part, and the parameters whose copies would give some tile more than
//! [`MAX_TABLE_ENTRIES`] transfers (their descriptors live in region 0
//! for the whole program; the step is scheduled in whole transfers, never
//! pieces, so a tile holds at most one descriptor per transfer it takes
//! part in). Invariants: the host still writes every byte of
//! every parameter at least once; every placement the host no longer
//! writes is written by the step from bytes the host wrote, before any
//! other step of `initialize`; the step passes ipu-exchange's checker like
//! every other exchange step.

use crate::exchange::{self, BufferTransfer};
use crate::lower::{HostPlacement, Lowered, Step};
use crate::segment::{transfers_between, word_aligned};
use crate::CompileError;
use std::collections::{BTreeMap, BTreeSet};

/// The most transfers (sent or received) a tile takes part in for the
/// parameters' copies: 256 descriptors are 4 KiB of region 0.
pub const MAX_TABLE_ENTRIES: u32 = 256;

/// What the phase did, for the log and the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ParamCopies {
    /// Parameters whose extra copies the exchange step writes.
    pub copied: Vec<String>,
    /// Parameters held more than once whose copies stay with the host.
    pub host_written: Vec<String>,
    /// Bytes the host writes at `initialize`, before and after.
    pub host_bytes_before: u64,
    pub host_bytes_after: u64,
    /// Transfers of the step, and its cost-model cycles (0 without a step).
    pub transfers: usize,
    pub step_cycles: u64,
}

/// Rewrites `l`'s `initialize` call as the module documentation says.
pub fn copy_on_device(l: &mut Lowered) -> Result<ParamCopies, CompileError> {
    let mut report = ParamCopies::default();
    let Some(call) = l.calls.iter().position(|c| c.name == "initialize") else {
        return Ok(report);
    };
    let host_bytes = |l: &Lowered| -> u64 {
        l.io[call]
            .0
            .iter()
            .flat_map(|t| &t.placements)
            .map(|p| p.bytes as u64)
            .sum()
    };
    report.host_bytes_before = host_bytes(l);
    let transfers = plan_copies(&mut l.io[call].0, &mut report);
    report.host_bytes_after = host_bytes(l);
    if transfers.is_empty() {
        return Ok(report);
    }
    report.transfers = transfers.len();
    // Whole jobs: pieces would multiply the descriptors that
    // MAX_TABLE_ENTRIES bounds (the step runs once, at initialize).
    let mut x = exchange::schedule_with(l.tile_count, transfers, l.exchange_steps(), true)?;
    exchange::attach_tables(&mut x, &mut l.buffers, "xtab_init");
    report.step_cycles = exchange::step_cycles(&x.figures);
    let step = Step {
        tile_cycles: Default::default(),
        operation: "initialize".into(),
        phase: format!("copy parameters {}", report.copied.join(", ")),
        tiles: Default::default(),
        estimated_cycles: report.step_cycles,
        exchange: Some(x),
        host_stop: false,
        launch: crate::lower::Launch::Own,
    };
    l.calls[call].steps.insert(0, step);
    Ok(report)
}

/// Keeps one host copy of every byte of each of `tensors` (their
/// placements shrink to it) and returns the transfers that copy it to the
/// other placements, recording in `report` which parameters were copied
/// and which stay host-written (see the module documentation; also the
/// streamed weights of a device loop, crate::loops).
pub(crate) fn plan_copies(
    tensors: &mut [crate::lower::HostTensor],
    report: &mut ParamCopies,
) -> Vec<BufferTransfer> {
    let mut entries: BTreeMap<u32, u32> = BTreeMap::new();
    let mut transfers: Vec<BufferTransfer> = Vec::new();
    for t in tensors.iter_mut() {
        let (sources, moved) = split_copies(&t.placements);
        if moved.is_empty() {
            if sources.len() < t.placements.len() {
                report.host_written.push(t.name.clone());
            }
            continue;
        }
        // split_copies moves only word-aligned placements inside the
        // host's word-aligned copy, so this succeeds; were it to fail, the
        // host writing every copy is still correct, and the log says why.
        let mine = match transfers_between(
            &t.name,
            &sources,
            &moved,
            crate::segment::row_bytes(&t.ty),
        ) {
            Ok(mine) => mine,
            Err(e) => {
                tracing::warn!(parameter = %t.name, reason = %e, "parameter copies stay with the host");
                report.host_written.push(t.name.clone());
                continue;
            }
        };
        let mut added: BTreeMap<u32, u32> = BTreeMap::new();
        for x in &mine {
            *added.entry(x.source.tile).or_default() += 1;
            for d in &x.destinations {
                *added.entry(d.tile).or_default() += 1;
            }
        }
        let over = added
            .iter()
            .any(|(tile, n)| entries.get(tile).copied().unwrap_or(0) + n > MAX_TABLE_ENTRIES);
        if over {
            report.host_written.push(t.name.clone());
            continue;
        }
        for (tile, n) in added {
            *entries.entry(tile).or_default() += n;
        }
        transfers.extend(mine);
        let gone: BTreeSet<HostPlacement> = moved.into_iter().collect();
        t.placements.retain(|p| !gone.contains(p));
        report.copied.push(t.name.clone());
    }
    transfers
}

/// Splits a parameter's placements into the host's copy (the first
/// placement in host order at each offset past the bytes already taken)
/// and the placements the exchange can fill from it: whole 4-byte words,
/// every byte in word-aligned placements of the host's copy. Those that
/// can be neither stay with the host too (in the first list).
fn split_copies(placements: &[HostPlacement]) -> (Vec<HostPlacement>, Vec<HostPlacement>) {
    let mut order: Vec<HostPlacement> = placements.to_vec();
    order.sort_by_key(|p| (p.host_offset, p.tile, p.buffer, p.buffer_offset));
    let mut sources: Vec<HostPlacement> = Vec::new();
    let mut rest: Vec<HostPlacement> = Vec::new();
    let mut taken = 0u64;
    for p in order {
        if p.host_offset >= taken {
            taken = p.host_offset + p.bytes as u64;
            sources.push(p);
        } else {
            rest.push(p);
        }
    }
    // `sources` are disjoint and sorted by host offset.
    let covered_by_words = |p: &HostPlacement| -> bool {
        let (start, end) = (p.host_offset, p.host_offset + p.bytes as u64);
        let first = sources.partition_point(|s| s.host_offset + (s.bytes as u64) <= start);
        let mut at = start;
        for s in &sources[first..] {
            if at >= end || s.host_offset > at {
                break;
            }
            if !word_aligned(std::slice::from_ref(s)) {
                return false;
            }
            at = s.host_offset + s.bytes as u64;
        }
        at >= end
    };
    let (moved, kept): (Vec<HostPlacement>, Vec<HostPlacement>) = rest
        .into_iter()
        .partition(|p| p.bytes > 0 && word_aligned(std::slice::from_ref(p)) && covered_by_words(p));
    sources.extend(kept);
    (sources, moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tile: u32, buffer_offset: u32, host_offset: u64, bytes: u32) -> HostPlacement {
        HostPlacement {
            tile,
            buffer: 0,
            buffer_offset,
            host_offset,
            bytes,
        }
    }

    #[test]
    fn the_first_copy_stays_with_the_host_and_the_others_move() {
        // Two copies of 16 bytes: tile 0 in two pieces, tile 1 whole, and
        // tile 2 holding the second half only.
        let p = [
            at(1, 0, 0, 16),
            at(0, 0, 0, 8),
            at(0, 8, 8, 8),
            at(2, 4, 8, 8),
        ];
        let (host, moved) = split_copies(&p);
        assert_eq!(host, vec![at(0, 0, 0, 8), at(0, 8, 8, 8)]);
        assert_eq!(moved, vec![at(1, 0, 0, 16), at(2, 4, 8, 8)]);
    }

    #[test]
    fn odd_and_partly_covered_placements_stay_with_the_host() {
        // Tile 1 overlaps the host's copy but starts inside a piece that
        // is not whole words; tile 2 holds 6 bytes (not whole words);
        // tile 3 reaches past the bytes the first copy holds.
        let p = [
            at(0, 0, 0, 6),
            at(0, 8, 6, 10),
            at(1, 0, 4, 8),
            at(2, 0, 8, 6),
            at(3, 0, 8, 12),
        ];
        let (host, moved) = split_copies(&p);
        assert!(moved.is_empty(), "{moved:?}");
        assert_eq!(host.len(), p.len());
    }

    #[test]
    fn every_byte_keeps_a_host_copy() {
        // Random copies of a 64-byte tensor in word pieces: the host's
        // placements cover every byte, and every moved placement lies in
        // bytes the host writes.
        let mut rng = ipu_rng::SplitMix64(7);
        for _ in 0..200 {
            let mut p = Vec::new();
            for tile in 0..1 + rng.below(4) as u32 {
                let mut h = 0u64;
                while h < 64 {
                    let n = (4 * (1 + rng.below(4))).min(64 - h);
                    p.push(at(tile, h as u32, h, n as u32));
                    h += n;
                }
            }
            let (host, moved) = split_copies(&p);
            assert_eq!(host.len() + moved.len(), p.len());
            let mut bytes = [false; 64];
            for q in &host {
                for b in q.host_offset..q.host_offset + q.bytes as u64 {
                    bytes[b as usize] = true;
                }
            }
            assert!(bytes.iter().all(|&b| b));
            let transfers = transfers_between("w", &host, &moved, 0).unwrap();
            let moved_bytes: u64 = moved.iter().map(|q| q.bytes as u64).sum();
            let sent: u64 = transfers
                .iter()
                .map(|x| x.bytes as u64 * x.destinations.len() as u64)
                .sum();
            assert_eq!(sent, moved_bytes);
        }
    }
}
