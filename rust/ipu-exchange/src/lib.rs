//! The exchange scheduler of ipu-stack.
//!
//! One exchange phase (a set of transfers between tiles, [`Phase`]) goes
//! through one module per step, driven by [`compile_phase`]:
//! 1. [`phase`]: validation of the input (sizes, tiles, addresses, overlaps);
//! 2. [`coalesce`]: merging of transfers one descriptor can carry, and
//!    splitting of long jobs into pieces;
//! 3. [`schedule`]: start cycles on 4 B/cycle send and receive ports, by an
//!    event-driven list scheduler improved by squeaky-wheel rounds;
//! 4. [`lower`]: per-tile `xtab` descriptor tables (16-byte descriptors,
//!    strided ones behind a 16-byte prefix);
//! 5. [`validate`]: an independent checker that proves from the tables alone
//!    that they perform the phase exactly and obey docs/isa.md section 6;
//! 6. a [`Report`] against the lower bounds of [`bound`], also logged as a
//!    tracing info line in the style of the seed's
//!    `optimized physical exchange schedule` lines.
//!
//! Invariants:
//! - Times are cycles after the exchange phase start `T0` (the end of the
//!   600-cycle sync). Table slot i of a tile issues at `c + i` with
//!   `c` = [`Options::issue_offset`] (default [`XTAB_ISSUE_OFFSET`] = 12, the
//!   standard prologue of [`lower::supervisor_exchange_asm`]); every table
//!   satisfies `start_i >= c + i`.
//! - The same phase and options always give byte-identical tables: no hash
//!   order, thread count or clock influences any decision.
//! - Every table set returned by [`compile_phase`] has passed the checker
//!   (unless [`Options::check`] is turned off).
//! - Bad input yields a [`PhaseError`] naming the transfer, tile and address;
//!   no input makes the crate panic.

pub mod bound;
pub mod coalesce;
pub mod lower;
pub mod phase;
pub mod rng;
pub mod schedule;
pub mod synth;
pub mod text;
pub mod validate;

pub use bound::{bounds, Bounds};
pub use coalesce::{Job, Piece};
pub use lower::{
    Descriptor, LowerError, Lowered, Stride, SEND_KIND, STRIDE_KIND, XTAB_ISSUE_OFFSET,
};
pub use phase::{Destination, Phase, PhaseError, Transfer};
pub use schedule::{Placed, Schedule};
pub use validate::{check, CheckError, CheckSummary};

use rayon::prelude::*;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Options of [`compile_phase`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Cycle after `T0` at which descriptor 0 of every table issues.
    pub issue_offset: u64,
    /// Squeaky-wheel rounds per piece size; `None` picks a number from the
    /// phase size (about 1 M piece placements in total per candidate).
    pub rounds: Option<u32>,
    /// Run the independent checker on the result (on by default; it costs
    /// about as much as one construction).
    pub check: bool,
    /// Phase number used in the log line.
    pub label: u32,
    /// Schedule whole jobs only, never pieces of them: a tile's table then
    /// holds at most one descriptor per transfer it sends or receives (a
    /// phase whose tables must stay small, such as the copies of the
    /// parameters, which live in region 0 for the whole program).
    pub whole_jobs: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            issue_offset: XTAB_ISSUE_OFFSET,
            rounds: None,
            check: true,
            label: 0,
            whole_jobs: false,
        }
    }
}

/// Figures of one scheduled phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Phase number from [`Options::label`].
    pub phase: u32,
    /// Input transfers.
    pub transfers: usize,
    /// Jobs after coalescing.
    pub jobs: usize,
    /// Descriptors over all tables.
    pub descriptors: usize,
    /// Table slots over all tables (a strided descriptor takes two).
    pub slots: usize,
    /// Horizon of the first construction (whole jobs, no bonus), cycles after `T0`.
    pub initial_horizon: u64,
    /// Horizon of the selected schedule, cycles after `T0`.
    pub selected_horizon: u64,
    /// Exchange cycles of the phase under the standard prologue (from `T0` to
    /// the last tile's compute resume; at most 11 more than the horizon).
    pub exchange_cycles: u64,
    /// The endpoint bound in words (max words one tile sends or receives).
    pub endpoint_lower_bound: u64,
    /// The lower bound on the horizon, cycles after `T0` (see [`bound`]).
    pub lower_bound: u64,
    /// `selected_horizon - lower_bound`.
    pub lower_bound_gap: u64,
    /// Piece size of the selected schedule (`None`: whole jobs).
    pub piece_words: Option<u32>,
    /// Rounds that improved the best schedule of the selected candidate.
    pub improvements: u32,
    /// Wall-clock time of validation, scheduling, lowering and checking.
    pub elapsed: Duration,
}

impl Report {
    /// Logs the report at info level.
    pub fn log(&self) {
        tracing::info!(
            phase = self.phase,
            transfers = self.transfers,
            jobs = self.jobs,
            descriptors = self.descriptors,
            slots = self.slots,
            initial_horizon = self.initial_horizon,
            selected_horizon = self.selected_horizon,
            exchange_cycles = self.exchange_cycles,
            endpoint_lower_bound = self.endpoint_lower_bound,
            lower_bound = self.lower_bound,
            lower_bound_gap = self.lower_bound_gap,
            piece_words = self.piece_words.unwrap_or(0),
            improvements = self.improvements,
            elapsed_ms = self.elapsed.as_millis() as u64,
            "optimized physical exchange schedule"
        );
    }
}

/// Everything [`compile_phase`] produces.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// Coalesced jobs (the schedule's pieces index into them).
    pub jobs: Vec<Job>,
    /// The selected schedule.
    pub schedule: Schedule,
    /// Per-tile descriptor tables.
    pub lowered: Lowered,
    /// Figures.
    pub report: Report,
}

/// Any failure of [`compile_phase`]. Lowering and checker errors mean a bug
/// in this crate, and are reported rather than hidden.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExchangeError {
    /// The input phase breaks a rule.
    Phase(PhaseError),
    /// Lowering failed.
    Lower(LowerError),
    /// The checker rejected the tables.
    Check(CheckError),
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::Phase(e) => write!(f, "invalid exchange phase: {e}"),
            ExchangeError::Lower(e) => write!(f, "exchange lowering failed: {e}"),
            ExchangeError::Check(e) => write!(f, "exchange checker rejected the tables: {e}"),
        }
    }
}

impl std::error::Error for ExchangeError {}

/// One candidate of the search: a piece size and its best schedule.
struct Candidate {
    piece_words: Option<u32>,
    search: schedule::Search,
    lowered: Lowered,
}

/// A schedule whose horizon is within `lower bound / GOOD_ENOUGH` of the
/// lower bound ends the search (3.1%): the squeaky-wheel rounds and the
/// other piece sizes rarely gain more and cost minutes on phases of millions
/// of descriptors.
pub const GOOD_ENOUGH: u64 = 32;

/// A phase with strided jobs of [`LARGE_STRIDED_PHASE`] words or more
/// improves its schedules until within `lower bound / STRIDED_GOOD_ENOUGH`
/// of the bound (0.4%), and tries pieces of 1/256 of the endpoint bound
/// too. On SigLIP's attention exchange
/// (bound 14,376) whole jobs end at 14,785 cycles, and pieces of 56 words
/// at 14,553, where its 217,332 transfers as jobs took 14,651 (with 32
/// times the descriptors); pieces of 1/1024 (14 words) reach 14,461 but
/// cost 1.2 s of compile time there and 4.7 s on the ViT block (measured
/// in session 48, not kept there).
pub const STRIDED_GOOD_ENOUGH: u64 = 256;

/// Below this many words of endpoint bound, a phase with strided jobs
/// tries whole jobs and pieces of 1/16 and 1/64 of the bound, improving
/// until its patience runs out: finer pieces there win a few cycles for
/// many more descriptors (32 small ViT layers on 8 tiles: three times the
/// table bytes, which moved the loop's stacks onto the slow copy path).
pub const LARGE_STRIDED_PHASE: u64 = 4096;

/// A phase with strided jobs whose endpoint bound is at least this many
/// words also tries pieces of 1/1024 of it: there a 1% gap is over 160
/// cycles. Whisper large's attention rounds (bound 33,036 cycles): 33,677
/// and 33,417 cycles with pieces of 1/256, 33,324 and 33,309 with pieces
/// of 1/1024, for about a second of compile time each (their 159,000
/// transfers as jobs took 33,230 and 33,188).
pub const LONG_STRIDED_PHASE: u64 = 16 * 1024;

/// On a phase of at least [`LARGE_PHASE_JOBS`] jobs, a whole-job schedule
/// within this many cycles of the lower bound is kept as well, however
/// small the bound: a tenth of the sync that precedes every exchange phase.
/// The piece sizes would cost more compile time there than they can win (the
/// ViT block's two joins of the residual adds, 9,477 jobs and a bound of
/// 1,164 cycles, spent 0.6 s each on pieces that lost to a schedule 48
/// cycles above it), while smaller phases keep trying them, cheaply.
pub const GOOD_ENOUGH_CYCLES: u64 = 64;

/// See [`GOOD_ENOUGH_CYCLES`].
pub const LARGE_PHASE_JOBS: usize = 4096;

/// The piece sizes tried: whole jobs, and pieces of 1/16 and 1/64 of the
/// endpoint bound when some job is longer than that; with strided jobs
/// also 1/256 on phases of [`LARGE_STRIDED_PHASE`] words or more, and
/// 1/1024 from [`LONG_STRIDED_PHASE`] words (see [`compile_phase`]).
fn piece_sizes(jobs: &[Job], endpoint_words: u64, strided: bool) -> Vec<Option<u32>> {
    let longest = jobs.iter().map(|j| j.words).max().unwrap_or(0);
    let mut sizes = vec![None];
    let divisors: &[u64] = match strided {
        false => &[16, 64],
        true if endpoint_words < LARGE_STRIDED_PHASE => &[16, 64],
        true if endpoint_words < LONG_STRIDED_PHASE => &[16, 64, 256],
        true => &[16, 64, 256, 1024],
    };
    for &div in divisors {
        let m = (endpoint_words / div).max(4) as u32;
        if m < longest && !sizes.contains(&Some(m)) {
            sizes.push(Some(m));
        }
    }
    sizes
}

/// Whether a whole-job schedule of `horizon` cycles ends the search of a
/// phase of `jobs` jobs whose lower bound is `bound` ([`GOOD_ENOUGH`],
/// [`GOOD_ENOUGH_CYCLES`]).
fn good_enough(horizon: u64, bound: u64, jobs: usize) -> bool {
    let slack = if jobs >= LARGE_PHASE_JOBS {
        (bound / GOOD_ENOUGH).max(GOOD_ENOUGH_CYCLES)
    } else {
        bound / GOOD_ENOUGH
    };
    horizon <= bound + slack
}

/// Validates, coalesces, schedules, lowers and checks one phase.
pub fn compile_phase(phase: &Phase, options: &Options) -> Result<Compiled, ExchangeError> {
    let started = Instant::now();
    phase.validate().map_err(ExchangeError::Phase)?;
    let c = options.issue_offset;
    let b = bounds(phase, c);
    let jobs = coalesce::coalesce(phase);
    // Strided jobs are far fewer and longer than the transfers they carry
    // (SigLIP's attention exchange: 5,120 jobs for 217,332 transfers), so a
    // whole-job schedule of them is coarser than the transfers' would be:
    // such a phase tries every piece size, down to 1/256 of the endpoint
    // bound on large phases, and improves until within
    // [`STRIDED_GOOD_ENOUGH`] of the bound (small phases: until out of
    // patience) instead of stopping within 1/32 of it.
    let strided = jobs.iter().any(Job::is_strided);
    let sizes = if options.whole_jobs {
        vec![None]
    } else {
        piece_sizes(&jobs, b.endpoint_words, strided)
    };
    let large_strided = strided && b.endpoint_words >= LARGE_STRIDED_PHASE;
    let target = if large_strided {
        b.horizon + b.horizon / STRIDED_GOOD_ENOUGH
    } else if strided {
        b.horizon
    } else {
        b.horizon + b.horizon / GOOD_ENOUGH
    };
    // Index of the coarsest piece size (0: whole jobs) whose schedule has
    // reached `target`, on a phase with strided jobs. There `target` is
    // within the selection's tie slack of the lower bound, so no finer
    // size could beat that schedule by more than the slack: the coarsest
    // size that reaches it is the one chosen, and the searches of finer
    // sizes stop (the 1/1024 pieces of a Llama-2-7B reduce-scatter took
    // 7.1 s of the phase's 8.1 s after the 1/256 pieces had reached it).
    // Which searches stop depends on timing, what is chosen does not.
    let reached = AtomicUsize::new(usize::MAX);
    let attempt = |index: usize,
                   piece_words: Option<u32>|
     -> Result<Option<Candidate>, LowerError> {
        let superseded = || strided && reached.load(Ordering::Relaxed) < index;
        if superseded() {
            return Ok(None);
        }
        let pieces = coalesce::split(&jobs, piece_words);
        let rounds = options
            .rounds
            .unwrap_or_else(|| (1_000_000 / pieces.len().max(1)).clamp(1, 24) as u32);
        let Some(search) =
            schedule::improve(&jobs, &pieces, phase.tiles, c, rounds, target, &superseded)
        else {
            return Ok(None);
        };
        if strided && search.best.horizon <= target {
            reached.fetch_min(index, Ordering::Relaxed);
        }
        let lowered = lower::lower(&jobs, &search.best, phase.tiles, c, phase.spans.as_deref())?;
        Ok(Some(Candidate {
            piece_words,
            search,
            lowered,
        }))
    };
    // Whole jobs first: a schedule close enough to the lower bound
    // ([`good_enough`]) is kept without trying piece sizes (on the SigLIP
    // attention phase, 6 M descriptors, the other candidates cost minutes
    // and found nothing).
    let first = attempt(0, None).map(|c| c.expect("the whole-job search is never superseded"));
    let whole_jobs_suffice = match &first {
        Ok(c) if strided => c.search.best.horizon <= target,
        Ok(c) => good_enough(c.search.best.horizon, b.horizon, jobs.len()),
        Err(_) => false,
    };
    let rest: Vec<(usize, Option<u32>)> = if whole_jobs_suffice {
        Vec::new()
    } else {
        sizes.iter().copied().enumerate().skip(1).collect()
    };
    let mut candidates: Vec<Result<Option<Candidate>, LowerError>> = vec![first.map(Some)];
    candidates.extend(
        rest.par_iter()
            .map(|&(index, piece_words)| attempt(index, piece_words))
            .collect::<Vec<_>>(),
    );
    let candidates: Vec<Option<Candidate>> = candidates
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(ExchangeError::Lower)?;
    let initial_horizon = candidates[0]
        .as_ref()
        .expect("the whole-job search is never superseded")
        .search
        .initial
        .horizon;
    let best = match reached.into_inner() {
        // No size reached the target, so every search finished.
        usize::MAX => {
            let candidates: Vec<Candidate> = candidates.into_iter().flatten().collect();
            // The shortest schedule, fewer slots breaking ties; on a large
            // strided phase every schedule within `bound /
            // STRIDED_GOOD_ENOUGH` of the shortest counts as a tie, so
            // that a cycle or two never buys many more descriptors (the
            // small pieces' schedules of such a phase).
            let shortest = candidates
                .iter()
                .map(|x| x.search.best.horizon)
                .min()
                .expect("at least one candidate");
            let slack = if large_strided {
                b.horizon / STRIDED_GOOD_ENOUGH
            } else {
                0
            };
            let key = |x: &Candidate| {
                let h = x.search.best.horizon;
                (h > shortest + slack, x.lowered.slots(), h)
            };
            candidates
                .into_iter()
                .min_by_key(key)
                .expect("at least one candidate")
        }
        // Only sizes finer than this one can have stopped.
        index => candidates
            .into_iter()
            .nth(index)
            .flatten()
            .expect("the size that reached the target finished its search"),
    };
    if options.check {
        check(phase, &best.lowered.tables, c).map_err(ExchangeError::Check)?;
    }
    let selected_horizon = best.search.best.horizon;
    let report = Report {
        phase: options.label,
        transfers: phase.transfers.len(),
        jobs: jobs.len(),
        descriptors: best.lowered.descriptors(),
        slots: best.lowered.slots(),
        initial_horizon,
        selected_horizon,
        exchange_cycles: best.lowered.exchange_cycles(),
        endpoint_lower_bound: b.endpoint_words,
        lower_bound: b.horizon,
        lower_bound_gap: selected_horizon.saturating_sub(b.horizon),
        piece_words: best.piece_words,
        improvements: best.search.improvements,
        elapsed: started.elapsed(),
    };
    report.log();
    Ok(Compiled {
        jobs,
        schedule: best.search.best,
        lowered: best.lowered,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::{good_enough, GOOD_ENOUGH_CYCLES, LARGE_PHASE_JOBS};

    /// Small phases keep trying piece sizes unless whole jobs are within
    /// 1/32 of the bound; large ones also stop within 64 cycles of it, and
    /// a large bound's 1/32 still applies when it exceeds 64 cycles.
    #[test]
    fn good_enough_is_a_thirty_second_or_64_cycles_on_large_phases() {
        let large = LARGE_PHASE_JOBS;
        let small = LARGE_PHASE_JOBS - 1;
        // The ViT block's residual joins: bound 1,164, whole jobs 1,212.
        assert!(!good_enough(1212, 1164, small));
        assert!(good_enough(1212, 1164, large));
        assert!(good_enough(1164 + GOOD_ENOUGH_CYCLES, 1164, large));
        assert!(!good_enough(1164 + GOOD_ENOUGH_CYCLES + 1, 1164, large));
        // 1/32 of 32,000 is 1,000 cycles, on any phase.
        assert!(good_enough(33_000, 32_000, small));
        assert!(good_enough(33_000, 32_000, large));
        assert!(!good_enough(33_001, 32_000, large));
        // A bound of 100: 3 cycles on a small phase.
        assert!(good_enough(103, 100, small));
        assert!(!good_enough(104, 100, small));
    }
}
