//! Coalescing: merge transfers that one descriptor per tile can carry, and
//! split long jobs into pieces the scheduler may place independently.
//!
//! Merging. Two transfers merge into one job when they have the same source
//! tile and the same destination tile set, and the second one's bytes follow
//! the first one's bytes both at the source and at every destination. The
//! merged job moves exactly the same bytes to the same places, with one send
//! descriptor and one receive descriptor per destination instead of two.
//! Merging is always good: it never lengthens any port's busy time and it
//! lowers the descriptor count that the issue constraint charges.
//!
//! Splitting. A job of `w` words holds its source port and every destination
//! port for `w` consecutive cycles; long jobs make the list scheduler's tail
//! coarse (the last port to finish may have to wait for a whole long job).
//! [`split`] cuts jobs longer than `max_words` into near-equal pieces. The
//! ISA lets a receive span consecutive sends of one source and a send feed
//! any sub-range, so pieces scheduled back to back are re-merged into single
//! descriptors by `lower`; only pieces the scheduler actually separated cost
//! extra descriptors. The scheduler tries several piece sizes and keeps the
//! best result, so splitting is used exactly when it helps balancing.

use crate::phase::{Destination, Phase};

/// A coalesced transfer: one or more input transfers merged end to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Sending tile.
    pub source: u32,
    /// Byte address of the first word on the source tile.
    pub source_address: u32,
    /// Destinations sorted by tile.
    pub destinations: Vec<Destination>,
    /// Words (4-byte cycles of every port involved).
    pub words: u32,
    /// Input transfers merged into this job.
    pub merged: u32,
}

/// Merges the transfers of a (validated) phase into jobs. The result is in a
/// canonical order (source, destination tiles, source address), independent
/// of the input order of the transfers.
pub fn coalesce(phase: &Phase) -> Vec<Job> {
    let mut jobs: Vec<Job> = phase
        .transfers
        .iter()
        .map(|t| {
            let mut destinations = t.destinations.clone();
            destinations.sort_unstable();
            Job {
                source: t.source,
                source_address: t.source_address,
                destinations,
                words: t.words(),
                merged: 1,
            }
        })
        .collect();
    // Sorting by (source, destination tiles, source address, destination
    // addresses) puts every mergeable pair next to each other.
    jobs.sort_unstable_by(|a, b| {
        a.source
            .cmp(&b.source)
            .then_with(|| {
                a.destinations
                    .iter()
                    .map(|d| d.tile)
                    .cmp(b.destinations.iter().map(|d| d.tile))
            })
            .then_with(|| a.source_address.cmp(&b.source_address))
            .then_with(|| a.destinations.cmp(&b.destinations))
            .then_with(|| a.words.cmp(&b.words))
    });
    let mut out: Vec<Job> = Vec::with_capacity(jobs.len());
    for job in jobs {
        if let Some(last) = out.last_mut() {
            if mergeable(last, &job) {
                last.words += job.words;
                last.merged += job.merged;
                continue;
            }
        }
        out.push(job);
    }
    out
}

/// True when `b` continues `a` at the source and at every destination.
fn mergeable(a: &Job, b: &Job) -> bool {
    let bytes = 4 * a.words;
    a.source == b.source
        && a.source_address + bytes == b.source_address
        && a.destinations.len() == b.destinations.len()
        && a.destinations
            .iter()
            .zip(&b.destinations)
            .all(|(x, y)| x.tile == y.tile && x.address + bytes == y.address)
}

/// A piece of a job: words `offset..offset + words` of job `job`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Piece {
    /// Index into the job list.
    pub job: u32,
    /// First word of the piece within the job.
    pub offset: u32,
    /// Words of the piece.
    pub words: u32,
}

/// Cuts every job longer than `max_words` into `ceil(words / max_words)`
/// near-equal pieces (their sizes differ by at most one word); `None` keeps
/// every job whole.
pub fn split(jobs: &[Job], max_words: Option<u32>) -> Vec<Piece> {
    let mut out = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.iter().enumerate() {
        let n = match max_words {
            Some(m) if m > 0 => job.words.div_ceil(m),
            _ => 1,
        };
        let (base, extra) = (job.words / n, job.words % n);
        let mut offset = 0;
        for i in 0..n {
            let words = base + u32::from(i < extra);
            out.push(Piece {
                job: j as u32,
                offset,
                words,
            });
            offset += words;
        }
    }
    out
}
