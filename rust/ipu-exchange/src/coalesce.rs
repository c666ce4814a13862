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
//! Striding. Jobs of one source and destination set and of equal length
//! whose addresses step by one constant at the source and by one constant at
//! each destination (the columns of a transposed block, or one head's rows
//! of a wider matrix) then chain into one strided job: each end moves runs
//! of the jobs' length, a stride apart, which a strided descriptor (two
//! table slots) carries whatever the number of runs. Every run of a chain
//! stays inside one span of its tile ([`Phase::spans`]), so a compiler that
//! moves buffers after scheduling moves whole descriptors.
//!
//! Splitting. A job of `w` words holds its source port and every destination
//! port for `w` consecutive cycles; long jobs make the list scheduler's tail
//! coarse (the last port to finish may have to wait for a whole long job).
//! [`split`] cuts jobs longer than `max_words` into near-equal pieces (whole
//! runs of a strided job). The ISA lets a receive span consecutive sends of
//! one source and a send feed any sub-range, so pieces scheduled back to
//! back are re-merged into single descriptors by `lower`; only pieces the
//! scheduler actually separated cost extra descriptors. The scheduler tries
//! several piece sizes and keeps the best result, so splitting is used
//! exactly when it helps balancing.

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
    /// Words per run: `words` for a contiguous job, else a divisor of it.
    pub run: u32,
    /// Bytes from one run's start to the next: at the source, then at each
    /// destination in `destinations` order; empty for a contiguous job.
    pub strides: Vec<u32>,
}

impl Job {
    /// True when the job moves several runs.
    pub fn is_strided(&self) -> bool {
        self.run < self.words
    }

    /// The byte address of word `word` at end `end` (0: the source, 1 +
    /// i: destination i).
    pub fn address_at(&self, end: usize, word: u32) -> u32 {
        let base = if end == 0 {
            self.source_address
        } else {
            self.destinations[end - 1].address
        };
        if self.is_strided() {
            base + (word / self.run) * self.strides[end] + 4 * (word % self.run)
        } else {
            base + 4 * word
        }
    }

    /// The stride of end `end` as a descriptor carries it: `None` where the
    /// runs are contiguous there (or the job is).
    pub fn stride_at(&self, end: usize) -> Option<crate::lower::Stride> {
        (self.is_strided() && self.strides[end] != 4 * self.run).then(|| crate::lower::Stride {
            run: self.run,
            bytes: self.strides[end],
        })
    }
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
                run: t.words(),
                strides: Vec::new(),
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
                last.run = last.words;
                last.merged += job.merged;
                continue;
            }
        }
        out.push(job);
    }
    stride(out, phase)
}

/// Chains jobs of one source and destination tile set and of one length
/// whose addresses step by a constant at every end into strided jobs. The
/// input is in [`coalesce`]'s order, where such jobs are neighbours by
/// source address; the output keeps that order (a chain sits where its
/// first job sat).
fn stride(jobs: Vec<Job>, phase: &Phase) -> Vec<Job> {
    let span_end = |tile: u32, address: u32| -> Option<u64> {
        match &phase.spans {
            None => Some(u64::MAX),
            Some(spans) => {
                crate::phase::span_end(spans.get(tile as usize)?, address).map(u64::from)
            }
        }
    };
    let mut out: Vec<Job> = Vec::with_capacity(jobs.len());
    // The open chain: its index in `out` and the span ends of its first run
    // at each end (source first).
    let mut open: Option<(usize, Vec<u64>)> = None;
    for job in jobs {
        if let Some((i, ends)) = &open {
            let last = &mut out[*i];
            if chains(last, &job, ends) {
                if !last.is_strided() {
                    last.strides = std::iter::once(job.source_address - last.source_address)
                        .chain(
                            job.destinations
                                .iter()
                                .zip(&last.destinations)
                                .map(|(d, l)| d.address - l.address),
                        )
                        .collect();
                }
                last.words += job.words;
                last.merged += job.merged;
                continue;
            }
        }
        let ends: Option<Vec<u64>> = std::iter::once(span_end(job.source, job.source_address))
            .chain(job.destinations.iter().map(|d| span_end(d.tile, d.address)))
            .collect();
        out.push(job);
        open = ends.map(|e| (out.len() - 1, e));
    }
    out
}

/// True when `b` is the next run of `a` (a contiguous job of `b`'s length,
/// or a strided job of runs of that length), inside the spans that end at
/// `ends` at each end.
fn chains(a: &Job, b: &Job, ends: &[u64]) -> bool {
    if a.source != b.source
        || a.run != b.words
        || b.is_strided()
        || a.destinations.len() != b.destinations.len()
        || a.destinations
            .iter()
            .zip(&b.destinations)
            .any(|(x, y)| x.tile != y.tile)
    {
        return false;
    }
    let runs = a.words / a.run;
    let run_bytes = 4 * a.run as u64;
    let starts = std::iter::once((a.source_address, b.source_address)).chain(
        a.destinations
            .iter()
            .zip(&b.destinations)
            .map(|(x, y)| (x.address, y.address)),
    );
    starts.enumerate().all(|(end, (first, next))| {
        let step = next as u64 as i64 - first as u64 as i64;
        let stride = if a.is_strided() {
            a.strides[end] as i64
        } else {
            step
        };
        // Runs ascend without overlapping, each stride apart, and the new
        // run ends inside the first run's span.
        stride >= run_bytes as i64
            && step == stride * runs as i64
            && next as u64 + run_bytes <= ends[end]
    })
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
/// near-equal pieces (their sizes differ by at most one word; for a strided
/// job, by at most one run, every piece whole runs); `None` keeps every job
/// whole.
pub fn split(jobs: &[Job], max_words: Option<u32>) -> Vec<Piece> {
    let mut out = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.iter().enumerate() {
        // A strided job is cut in units of runs, a contiguous one in words.
        let unit = if job.is_strided() { job.run } else { 1 };
        let units = job.words / unit;
        let n = match max_words {
            Some(m) if m > 0 => job.words.div_ceil(m).min(units),
            _ => 1,
        };
        let (base, extra) = (units / n, units % n);
        let mut offset = 0;
        for i in 0..n {
            let words = (base + u32::from(i < extra)) * unit;
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
