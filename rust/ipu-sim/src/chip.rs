//! The chip: tiles, BSP phases, host access and counters.

use crate::error::{FaultKind, SimError};
use crate::exchange;
use crate::tile::{PhaseCounters, PhaseEnd, SymbolMap, Tile, SUPERVISOR};
use ipu_arch::{host_transfer_cycles, CLOCK_HZ_C600, SYNC_CYCLES, TILES_PER_CHIP};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct ChipConfig {
    /// Tiles on the simulated chip (1..=1472).
    pub tiles: u32,
    /// Most bundles one tile may issue in one phase before the run faults
    /// (catches contexts that never finish).
    pub step_limit: u64,
    /// Clock used only to convert host link bandwidth into cycles.
    pub clock_hz: u64,
}

impl Default for ChipConfig {
    fn default() -> Self {
        ChipConfig {
            tiles: TILES_PER_CHIP,
            step_limit: 200_000_000,
            clock_hz: CLOCK_HZ_C600,
        }
    }
}

/// Why [`Chip::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every active tile executed `exit`.
    Exited,
    /// Every active tile reached `hsync`: the host may read and write memory,
    /// then call [`Chip::run`] again.
    HostSync,
}

/// How a BSP step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// `sync` followed by an exchange phase.
    Sync,
    /// `hsync` (host exchange).
    HostSync,
    /// The final phase, ended by `exit`.
    Exit,
}

/// Counters of one tile in one BSP step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileStep {
    /// Cycles from the step start to the issue of `sync`/`hsync`/`exit` (inclusive).
    pub compute_cycles: u64,
    /// Cycles waiting for the slowest tile plus the sync itself (and, for a
    /// host sync, the host transfer).
    pub sync_cycles: u64,
    /// Cycles from the end of the sync until compute resumes.
    pub exchange_cycles: u64,
    /// Bundles issued (all contexts).
    pub bundles: u64,
    /// Instructions executed (not counting `nop`).
    pub instructions: u64,
    /// 4-byte words sent and received in the exchange phase.
    pub words_sent: u64,
    pub words_received: u64,
}

/// One BSP step of the whole chip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    pub kind: StepKind,
    /// Chip cycle at which the step began: the previous step's end, or
    /// after a host sync the first resume (a tile that left the previous
    /// exchange early counts its compute from its own resume, earlier).
    pub start_cycle: u64,
    /// Chip cycle at which the next step begins (the latest resume of any tile).
    pub end_cycle: u64,
    /// Indexed by tile; inactive tiles have zero counters.
    pub tiles: Vec<TileStep>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Ready,
    AtHostSync { resume_base: u64 },
    Finished,
}

/// A simulated ipu21 chip.
pub struct Chip {
    config: ChipConfig,
    tiles: Vec<Tile>,
    entries: Vec<Option<u32>>,
    phase_start: Vec<u64>,
    state: State,
    host_bytes: u64,
    steps: Vec<StepRecord>,
    pending: Vec<TileStep>,
    /// The end cycle of the latest completed step, shared with whoever
    /// watches a long run from another thread ([`Chip::progress`]).
    progress: Arc<AtomicU64>,
}

impl std::fmt::Debug for Chip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chip")
            .field("tiles", &self.config.tiles)
            .field("state", &self.state)
            .field("steps", &self.steps.len())
            .field("cycles", &self.cycles())
            .finish()
    }
}

fn kind_name(e: &PhaseEnd) -> &'static str {
    match e {
        PhaseEnd::Sync { .. } => "sync",
        PhaseEnd::Hsync { .. } => "hsync",
        PhaseEnd::Exit { .. } => "exit",
        PhaseEnd::Xend { .. } => "xend",
    }
}

impl Chip {
    /// A chip with `config.tiles` tiles, all memory zero.
    ///
    /// Panics on a tile count outside `1..=TILES_PER_CHIP`; callers with a
    /// count from users use [`Chip::try_new`].
    pub fn new(config: ChipConfig) -> Chip {
        Chip::try_new(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A chip, or an error naming the tile count when it is outside
    /// `1..=TILES_PER_CHIP`.
    pub fn try_new(config: ChipConfig) -> Result<Chip, String> {
        if !(1..=TILES_PER_CHIP).contains(&config.tiles) {
            return Err(format!(
                "a simulated ipu21 has 1..={TILES_PER_CHIP} tiles, not {}",
                config.tiles
            ));
        }
        let n = config.tiles as usize;
        Ok(Chip {
            tiles: (0..config.tiles).map(Tile::new).collect(),
            entries: vec![None; n],
            phase_start: vec![0; n],
            state: State::Ready,
            host_bytes: 0,
            steps: Vec::new(),
            pending: vec![TileStep::default(); n],
            progress: Arc::default(),
            config,
        })
    }

    /// Number of tiles.
    pub fn tile_count(&self) -> u32 {
        self.config.tiles
    }

    fn tile_err(&self, tile: u32, kind: FaultKind) -> SimError {
        SimError {
            tile,
            context: None,
            pc: None,
            instruction: None,
            step: self.steps.len() as u64,
            symbol: None,
            kind,
        }
    }

    fn check_tile(&self, tile: u32) -> Result<(), SimError> {
        if tile >= self.config.tiles {
            return Err(self.tile_err(tile, FaultKind::BadSourceTile { source: tile }));
        }
        Ok(())
    }

    /// Writes bytes into a tile's memory (program loading, or host exchange
    /// while stopped at a host sync, where the bytes are charged to the host link).
    pub fn write(&mut self, tile: u32, address: u32, data: &[u8]) -> Result<(), SimError> {
        self.check_tile(tile)?;
        self.tiles[tile as usize]
            .write_bytes(address, data)
            .map_err(|k| self.tile_err(tile, k))?;
        if matches!(self.state, State::AtHostSync { .. }) {
            self.host_bytes += data.len() as u64;
        }
        Ok(())
    }

    /// Reads bytes from a tile's memory (charged to the host link at a host sync).
    pub fn read(&mut self, tile: u32, address: u32, len: u32) -> Result<Vec<u8>, SimError> {
        self.check_tile(tile)?;
        let v = self.tiles[tile as usize]
            .read_bytes(address, len)
            .map_err(|k| self.tile_err(tile, k))?
            .to_vec();
        if matches!(self.state, State::AtHostSync { .. }) {
            self.host_bytes += len as u64;
        }
        Ok(v)
    }

    /// Reads without charging the host link (debuggers, profilers, tests).
    pub fn peek(&self, tile: u32, address: u32, len: u32) -> Result<Vec<u8>, SimError> {
        self.check_tile(tile)?;
        Ok(self.tiles[tile as usize]
            .read_bytes(address, len)
            .map_err(|k| self.tile_err(tile, k))?
            .to_vec())
    }

    /// Sets the supervisor entry pc of a tile; tiles without an entry take no part in the run.
    pub fn set_entry(&mut self, tile: u32, pc: u32) -> Result<(), SimError> {
        self.check_tile(tile)?;
        self.entries[tile as usize] = Some(pc);
        Ok(())
    }

    /// Supplies a symbol map for a tile, used to name the symbol at pc in faults.
    pub fn set_symbols(&mut self, tile: u32, symbols: Arc<SymbolMap>) -> Result<(), SimError> {
        self.check_tile(tile)?;
        self.tiles[tile as usize].symbols = Some(symbols);
        Ok(())
    }

    /// Completed BSP steps with per-tile counters.
    pub fn steps(&self) -> &[StepRecord] {
        &self.steps
    }

    /// The latest cycle any tile has reached.
    pub fn cycles(&self) -> u64 {
        self.steps.last().map_or(0, |s| s.end_cycle)
    }

    /// A counter of the cycles the run has reached (the end of its latest
    /// completed BSP step), which another thread may read while [`run`]
    /// runs: an interactive front end's progress, as the steps complete.
    ///
    /// [`run`]: Chip::run
    pub fn progress(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.progress)
    }

    fn record_step(&mut self, step: StepRecord) {
        self.progress.store(step.end_cycle, Ordering::Relaxed);
        self.steps.push(step);
    }

    /// Host bytes moved at the current host sync so far.
    pub fn host_bytes_pending(&self) -> u64 {
        self.host_bytes
    }

    /// Runs until every active tile exits or reaches a host sync.
    pub fn run(&mut self) -> Result<Stop, SimError> {
        match self.state {
            State::Finished => return Ok(Stop::Exited),
            State::Ready => {
                for (t, e) in self.tiles.iter_mut().zip(&self.entries) {
                    if let Some(pc) = e {
                        t.start(*pc, 0);
                    }
                }
            }
            State::AtHostSync { resume_base } => {
                let host = host_transfer_cycles(self.host_bytes, self.config.clock_hz);
                self.host_bytes = 0;
                let resume = resume_base + host;
                if let Some(last) = self.steps.last_mut() {
                    for (ts, t) in last.tiles.iter_mut().zip(&self.tiles) {
                        if t.active {
                            ts.sync_cycles += host;
                        }
                    }
                    last.end_cycle = resume;
                }
                self.progress.store(resume, Ordering::Relaxed);
                for (i, t) in self.tiles.iter_mut().enumerate() {
                    if t.active {
                        t.resume_at(resume);
                        self.phase_start[i] = resume;
                    }
                }
            }
        }
        self.state = State::Ready;
        loop {
            let limit = self.config.step_limit;
            let ends: Vec<Option<Result<PhaseEnd, SimError>>> = self
                .tiles
                .par_iter_mut()
                .map(|t| {
                    if t.active && !t.exited {
                        t.counters = PhaseCounters::default();
                        Some(t.run_phase(limit))
                    } else {
                        None
                    }
                })
                .collect();
            let mut first: Option<(u32, PhaseEnd)> = None;
            let mut ends_ok = Vec::with_capacity(ends.len());
            for (i, e) in ends.into_iter().enumerate() {
                let e = match e {
                    None => None,
                    Some(r) => Some(r?),
                };
                if let Some(end) = e {
                    match first {
                        None => first = Some((i as u32, end)),
                        Some((ft, fe)) if kind_name(&fe) != kind_name(&end) => {
                            let t = &self.tiles[i];
                            return Err(t.fault(
                                Some(SUPERVISOR),
                                Some(t.supervisor_pc()),
                                FaultKind::SyncMismatch {
                                    this: kind_name(&end),
                                    other_tile: ft,
                                    other: kind_name(&fe),
                                },
                            ));
                        }
                        _ => {}
                    }
                }
                ends_ok.push(e);
            }
            let Some((_, kind)) = first else {
                self.state = State::Finished;
                return Ok(Stop::Exited);
            };
            let at = |e: &PhaseEnd| match *e {
                PhaseEnd::Sync { at }
                | PhaseEnd::Hsync { at }
                | PhaseEnd::Exit { at }
                | PhaseEnd::Xend { at } => at,
            };
            // Tiles leave an exchange phase at different cycles, and the
            // first to leave starts computing before the phase has ended on
            // the chip. The step begins when the previous one has ended for
            // every tile (or, after a host sync, when the first tile
            // resumes), so that steps are contiguous and their lengths add
            // up to the run's cycles; each tile's counters still run from
            // its own resume.
            let previous_end = self.steps.last().map_or(0, |s| s.end_cycle);
            let start_cycle = self
                .phase_start
                .iter()
                .copied()
                .min()
                .unwrap_or(0)
                .max(previous_end);
            let mut record: Vec<TileStep> = std::mem::take(&mut self.pending);
            record.resize(self.tiles.len(), TileStep::default());
            let latest = ends_ok
                .iter()
                .flatten()
                .map(|e| at(e) + 1)
                .max()
                .unwrap_or(0);
            for (i, e) in ends_ok.iter().enumerate() {
                if let Some(e) = e {
                    let t = &self.tiles[i];
                    record[i].compute_cycles = at(e) + 1 - self.phase_start[i];
                    record[i].bundles = t.counters.bundles;
                    record[i].instructions = t.counters.instructions;
                    record[i].sync_cycles = latest - (at(e) + 1);
                }
            }
            match kind {
                PhaseEnd::Exit { .. } => {
                    self.record_step(StepRecord {
                        kind: StepKind::Exit,
                        start_cycle,
                        end_cycle: latest,
                        tiles: record,
                    });
                    self.pending = vec![TileStep::default(); self.tiles.len()];
                    self.state = State::Finished;
                    return Ok(Stop::Exited);
                }
                PhaseEnd::Hsync { .. } => {
                    let resume_base = latest + SYNC_CYCLES;
                    for (i, r) in record.iter_mut().enumerate() {
                        if ends_ok[i].is_some() {
                            r.sync_cycles += SYNC_CYCLES;
                            self.tiles[i].syncs_done += 1;
                            self.tiles[i].step += 1;
                        }
                    }
                    self.record_step(StepRecord {
                        kind: StepKind::HostSync,
                        start_cycle,
                        end_cycle: resume_base,
                        tiles: record,
                    });
                    self.pending = vec![TileStep::default(); self.tiles.len()];
                    self.state = State::AtHostSync { resume_base };
                    return Ok(Stop::HostSync);
                }
                _ => {}
            }
            // A global sync, then the exchange phase.
            let t0 = latest + SYNC_CYCLES;
            for (i, t) in self.tiles.iter_mut().enumerate() {
                if ends_ok[i].is_some() {
                    record[i].sync_cycles += SYNC_CYCLES;
                    t.syncs_done += 1;
                    t.exchange_mode = true;
                    t.exchange_t0 = t0;
                    t.transfers.clear();
                    t.resume_at(t0);
                }
            }
            let xends: Vec<Option<Result<PhaseEnd, SimError>>> = self
                .tiles
                .par_iter_mut()
                .map(|t| {
                    if t.exchange_mode {
                        t.counters = PhaseCounters::default();
                        Some(t.run_phase(limit))
                    } else {
                        None
                    }
                })
                .collect();
            let mut xend_at = vec![0u64; self.tiles.len()];
            for (i, x) in xends.into_iter().enumerate() {
                if let Some(r) = x {
                    xend_at[i] = at(&r?);
                }
            }
            let ends_rel = exchange::resolve(&mut self.tiles)?;
            let mut end_cycle = t0;
            for (i, t) in self.tiles.iter_mut().enumerate() {
                if !t.exchange_mode {
                    continue;
                }
                let resume =
                    (xend_at[i] + ipu_arch::CONTEXT_ISSUE_INTERVAL as u64).max(t0 + ends_rel[i]);
                t.exchange_mode = false;
                t.resume_at(resume);
                t.step += 1;
                self.phase_start[i] = resume;
                end_cycle = end_cycle.max(resume);
                let r = &mut record[i];
                r.exchange_cycles = resume - t0;
                r.bundles += t.counters.bundles;
                r.instructions += t.counters.instructions;
                for x in &t.transfers {
                    if x.source.is_some() {
                        r.words_received += x.words as u64;
                    } else {
                        r.words_sent += x.words as u64;
                    }
                }
                t.transfers.clear();
            }
            self.record_step(StepRecord {
                kind: StepKind::Sync,
                start_cycle,
                end_cycle,
                tiles: record,
            });
            self.pending = vec![TileStep::default(); self.tiles.len()];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_counts_outside_the_chip_are_errors_naming_the_count() {
        for tiles in [0, TILES_PER_CHIP + 1] {
            let Err(e) = Chip::try_new(ChipConfig {
                tiles,
                ..ChipConfig::default()
            }) else {
                panic!("{tiles} tiles accepted");
            };
            assert!(e.contains(&format!("not {tiles}")), "{e}");
        }
        let chip = Chip::try_new(ChipConfig {
            tiles: TILES_PER_CHIP,
            ..ChipConfig::default()
        })
        .expect("a whole chip");
        assert_eq!(chip.tile_count(), TILES_PER_CHIP);
    }
}
