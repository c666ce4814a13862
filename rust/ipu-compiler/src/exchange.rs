//! Inter-tile exchange steps: transfers between (tile, buffer, offset)
//! pairs, scheduled by `ipu-exchange` and proven by its independent checker.
//!
//! The tables must exist (with their final sizes) before `place_storage`,
//! which sizes each tile's code and data, but buffer addresses only exist
//! after it. So an exchange step is scheduled once, when it is built (in
//! `lower`, `join`, `loop` or `param_copies`), on a
//! *synthetic* layout: per tile, the buffers a phase touches are packed from
//! `SRAM_BASE` in buffer order with a 16-byte gap between them, so that
//! no descriptor can span two buffers (the gap breaks every contiguity the
//! coalescer or the lowering would merge across). After `place_storage`,
//! [`resolve`] moves each descriptor's address from its synthetic buffer to
//! the placed one (the schedule does not depend on addresses, only on
//! contiguity inside a buffer, which the move preserves), and
//! [`verify_placed`] runs `ipu_exchange::check` on the resolved tables
//! against the phase written with the real addresses. The driver runs it on
//! every exchange step before `emit_code`; the package is never written
//! with unchecked tables.
//!
//! This module builds the GEMM chain hand-off ([`handoff`]): rows of the
//! producer's compact result `d` (on the tiles of its plan) go to the
//! consumer's A buffers (on the tiles of the consumer's plan), every row
//! segment multicast to all consumer tiles that hold that row. The other
//! exchange steps (streamed GEMMs' chunks and reduce-scatters, attention,
//! segment joins, loop back edges, parameter copies) are built by their
//! own phases and scheduled through [`program_step`] or [`schedule_with`].

use crate::gemm::GemmGeometry;
use crate::map_tiles::ShardOnTile;
use crate::plan::GemmPlan;
use crate::CompileError;
use ipu_exchange::lower::slots;
use ipu_exchange::{Descriptor, Destination, Phase, Transfer};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Bytes at `offset` of buffer `buffer` (an index into the tile's buffers) on `tile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BufferRef {
    pub tile: u32,
    pub buffer: usize,
    pub offset: u32,
}

/// One transfer: `bytes` from `source` to every destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferTransfer {
    pub source: BufferRef,
    pub destinations: Vec<BufferRef>,
    pub bytes: u32,
}

/// The scheduler's figures for one step, as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExchangeFigures {
    pub transfers: usize,
    pub descriptors: usize,
    pub initial_horizon: u64,
    pub selected_horizon: u64,
    pub exchange_cycles: u64,
    pub endpoint_lower_bound: u64,
    pub lower_bound: u64,
    pub lower_bound_gap: u64,
}

/// Per tile (index = tile), a step's descriptors with synthetic addresses.
pub type Tables = Arc<Vec<Vec<Descriptor>>>;

/// Synthetic `[base, end)` address range of each touched (tile, buffer).
pub type SyntheticLayout = BTreeMap<(u32, usize), (u32, u32)>;

/// A scheduled exchange step (all `tiles` tiles take part in its sync).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeStep {
    pub tiles: u32,
    /// The transfers, layout and tables are shared, not copied, by the
    /// steps that rerun this one (a device loop's later iterations:
    /// 27 SigLIP layers would otherwise hold 27 copies of every table).
    pub transfers: Arc<Vec<BufferTransfer>>,
    /// Synthetic `[base, end)` of every (tile, buffer) the step touches.
    pub layout: Arc<SyntheticLayout>,
    /// Per tile (index = tile), descriptors with synthetic addresses.
    pub tables: Tables,
    pub figures: ExchangeFigures,
    /// Per tile, the buffer that holds its resolved table in the tile image
    /// ([`attach_tables`]); the supervisor's `xtab` reads it there.
    pub table_buffers: BTreeMap<u32, usize>,
}

/// Gives every tile a buffer (`name`, standard memory) for its table of
/// `step`, whose resolved descriptors `link` writes into the tile image:
/// the tables never pass through assembly text.
pub fn attach_tables(
    step: &mut ExchangeStep,
    buffers: &mut BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
    name: &str,
) {
    for (&tile, bufs) in buffers.iter_mut() {
        let slots = step.tables.get(tile as usize).map_or(0, |t| slots(t)) as u32;
        bufs.push(table_buffer(name, slots));
        step.table_buffers.insert(tile, bufs.len() - 1);
    }
}

/// Schedules `transfers` as exchange step `label`, gives every tile its
/// table buffer (`xtab<label>`) and returns the program step, costed by
/// [`step_cycles`].
pub fn program_step(
    tiles: u32,
    transfers: Vec<BufferTransfer>,
    label: u32,
    buffers: &mut BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
    operation: String,
    phase: String,
) -> Result<crate::lower::Step, CompileError> {
    let mut x = schedule(tiles, transfers, label)?;
    attach_tables(&mut x, buffers, &format!("xtab{label}"));
    Ok(crate::lower::Step {
        estimated_cycles: step_cycles(&x.figures),
        exchange: Some(x),
        ..crate::lower::Step::empty(operation, phase)
    })
}

/// An exchange step whose schedule [`schedule_pending`] makes later, so that
/// a caller that builds several independent steps (a segmented model's
/// joins) schedules them side by side: its program step and its table
/// buffers already hold their places, so every buffer index is what
/// [`program_step`] would have given.
pub struct PendingStep {
    /// The program step's index in its caller's step list.
    pub index: usize,
    tiles: u32,
    transfers: Vec<BufferTransfer>,
    label: u32,
    /// Per tile, its table buffer (bytes set once the schedule is known).
    table_buffers: BTreeMap<u32, usize>,
}

/// [`program_step`] without its schedule: the step (with no exchange yet)
/// and, per tile, a table buffer `xtab<label>`, in the order
/// [`attach_tables`] adds them; [`schedule_pending`] completes both.
pub fn pending_step(
    tiles: u32,
    transfers: Vec<BufferTransfer>,
    label: u32,
    buffers: &mut BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
    operation: String,
    phase: String,
    index: usize,
) -> (crate::lower::Step, PendingStep) {
    let name = format!("xtab{label}");
    let mut table_buffers = BTreeMap::new();
    for (&tile, bufs) in buffers.iter_mut() {
        bufs.push(table_buffer(&name, 0));
        table_buffers.insert(tile, bufs.len() - 1);
    }
    let step = crate::lower::Step::empty(operation, phase);
    let pending = PendingStep {
        index,
        tiles,
        transfers,
        label,
        table_buffers,
    };
    (step, pending)
}

/// Pushes a [`pending_step`]'s program step onto `steps` and its schedule
/// onto `pending`, with its index where it now stands, for callers that
/// make their exchange steps before they know their places.
pub fn push_pending(
    steps: &mut Vec<crate::lower::Step>,
    pending: &mut Vec<PendingStep>,
    (step, mut p): (crate::lower::Step, PendingStep),
) {
    p.index = steps.len();
    pending.push(p);
    steps.push(step);
}

/// Schedules the `pending` steps in parallel and completes them in `steps`
/// and their table buffers in `buffers`: the same steps and buffers as
/// [`program_step`] one after another (the first failure in order is the
/// error).
pub fn schedule_pending(
    mut pending: Vec<PendingStep>,
    steps: &mut [crate::lower::Step],
    buffers: &mut BTreeMap<u32, Vec<crate::lower::BufferSpec>>,
) -> Result<(), CompileError> {
    use rayon::prelude::*;
    let scheduled: Vec<Result<ExchangeStep, CompileError>> = pending
        .par_iter_mut()
        .map(|p| schedule(p.tiles, std::mem::take(&mut p.transfers), p.label))
        .collect();
    for (p, x) in pending.into_iter().zip(scheduled) {
        let mut x = x?;
        for (&tile, &b) in &p.table_buffers {
            let slots = x.tables.get(tile as usize).map_or(0, |t| slots(t)) as u32;
            buffers.get_mut(&tile).expect("a tile of the step")[b].bytes = table_bytes_of(slots);
        }
        x.table_buffers = p.table_buffers;
        let step = &mut steps[p.index];
        step.estimated_cycles = step_cycles(&x.figures);
        step.exchange = Some(x);
    }
    Ok(())
}

/// The bytes of a table of `slots` slots (16 each: a descriptor, or a
/// strided descriptor's prefix; at least one slot's room).
fn table_bytes_of(slots: u32) -> u32 {
    (16 * slots).max(16)
}

/// The memory category of exchange table buffers, whose contents the
/// tile image holds.
pub const TABLE_CATEGORY: &str = "exchange_tables";

/// A tile's table buffer for an exchange step, in standard memory.
fn table_buffer(name: &str, slots: u32) -> crate::lower::BufferSpec {
    crate::lower::BufferSpec {
        name: name.to_string(),
        bytes: table_bytes_of(slots),
        align: 8,
        region: crate::lower::RegionReq::Any,
        exclusive_element: false,
        zero: vec![],
        category: TABLE_CATEGORY.into(),
        scratch: None,
        lifetime: None,
        kernel_segment: None,
    }
}

/// The bytes of `tile`'s resolved table (little-endian words, strided
/// descriptors behind their prefixes).
pub fn table_bytes(step: &ExchangeStep, tile: u32, address_of: impl Fn(usize) -> u32) -> Vec<u8> {
    ipu_exchange::lower::encode_table(&resolve(step, tile, address_of))
}

/// Cycles the cost model charges for an exchange step: the 600-cycle sync,
/// the phase from `T0` to the last tile's compute resume under the standard
/// prologue, and one supervisor bundle after `xend` (the runtime's `br` to
/// the next record; docs/runtime.md, "The supervisor runtime").
pub fn step_cycles(figures: &ExchangeFigures) -> u64 {
    ipu_arch::SYNC_CYCLES + figures.exchange_cycles + ipu_arch::CONTEXT_ISSUE_INTERVAL as u64
}

/// Transfers that hand a chain's intermediate from the producer's result
/// buffers to the consumer's A buffers: row `r`, column blocks `cb0..cb1`
/// of a producer tile (`prod_buffer(tile)`, compact rows of `16 * nct`
/// elements, f16 or f32) go to byte `(r - r0) * e kp + 16 e cb0` (`e` the
/// element's bytes) of the A buffer
/// (`cons_buffer(tile)`) of every consumer tile whose rows `r0..` hold `r`.
/// Whole column blocks move (their padding columns are zeros, which the
/// consumer's K padding needs).
pub fn handoff(
    producer: (&GemmGeometry, &GemmPlan, &[ShardOnTile]),
    consumer: (&GemmGeometry, &GemmPlan, &[ShardOnTile]),
    prod_buffer: impl Fn(u32) -> usize,
    cons_buffer: impl Fn(u32) -> usize,
) -> Vec<BufferTransfer> {
    let (pg, pp, pmap) = producer;
    let (cg, cp, cmap) = consumer;
    let prows = pp.row_ranges(pg);
    let pcols = pp.col_ranges(pg);
    let crows = cp.row_ranges(cg);
    let (rs_a, eb) = (cg.kp() * cg.operand_bytes(), cg.operand_bytes());
    let mut out = Vec::new();
    for shard in pmap {
        let (p0, p1) = prows[shard.row_part as usize];
        let (cb0, cb1) = pcols[shard.col_part as usize];
        let rs_d = (cb1 - cb0) * 16 * pg.result_bytes();
        for r in p0..p1 {
            let destinations: Vec<BufferRef> = cmap
                .iter()
                .filter_map(|c| {
                    let (r0, r1) = crows[c.row_part as usize];
                    (r0..r1).contains(&r).then(|| BufferRef {
                        tile: c.tile,
                        buffer: cons_buffer(c.tile),
                        offset: (r - r0) * rs_a + cb0 * 16 * eb,
                    })
                })
                .collect();
            if destinations.is_empty() {
                continue;
            }
            out.push(BufferTransfer {
                source: BufferRef {
                    tile: shard.tile,
                    buffer: prod_buffer(shard.tile),
                    offset: (r - p0) * rs_d,
                },
                destinations,
                bytes: rs_d,
            });
        }
    }
    out
}

/// The synthetic layout of `transfers`: per tile, touched buffers packed
/// from `SRAM_BASE` in buffer order, 16-aligned, 16 bytes apart.
fn synthetic_layout(transfers: &[BufferTransfer]) -> Result<SyntheticLayout, CompileError> {
    let mut extent: BTreeMap<(u32, usize), u32> = BTreeMap::new();
    for t in transfers {
        for r in std::iter::once(&t.source).chain(&t.destinations) {
            let e = extent.entry((r.tile, r.buffer)).or_default();
            *e = (*e).max(r.offset + t.bytes);
        }
    }
    let mut layout = BTreeMap::new();
    let mut next: BTreeMap<u32, u32> = BTreeMap::new();
    for (&(tile, buffer), &bytes) in &extent {
        let base = next.entry(tile).or_insert(ipu_arch::SRAM_BASE);
        let start = *base;
        let end = start + bytes;
        if end > ipu_arch::SRAM_END {
            return Err(CompileError::CodeGen {
                tile,
                message: format!(
                    "the exchange step touches more than {} bytes of buffers on this tile",
                    ipu_arch::SRAM_END - ipu_arch::SRAM_BASE
                ),
            });
        }
        *base = (end + 16).div_ceil(16) * 16;
        layout.insert((tile, buffer), (start, end));
    }
    Ok(layout)
}

/// The phase of `transfers` with addresses from `address`, and `spans`
/// ([`Phase::spans`]).
fn phase_of(
    tiles: u32,
    transfers: &[BufferTransfer],
    address: impl Fn(&BufferRef) -> u32,
    spans: Option<Vec<Vec<(u32, u32)>>>,
) -> Phase {
    Phase {
        tiles,
        spans,
        transfers: transfers
            .iter()
            .enumerate()
            .map(|(id, t)| Transfer {
                id: id as u32,
                source: t.source.tile,
                source_address: address(&t.source),
                destinations: t
                    .destinations
                    .iter()
                    .map(|d| Destination {
                        tile: d.tile,
                        address: address(d),
                    })
                    .collect(),
                bytes: t.bytes,
            })
            .collect(),
    }
}

/// Schedules `transfers` among tiles `0..tiles` (phase number `label` in the
/// log line `optimized physical exchange schedule phase=...`).
pub fn schedule(
    tiles: u32,
    transfers: Vec<BufferTransfer>,
    label: u32,
) -> Result<ExchangeStep, CompileError> {
    schedule_with(tiles, transfers, label, false)
}

/// [`schedule`], with `whole_jobs` never splitting a transfer into pieces
/// (a tile's table then holds at most one descriptor per transfer it takes
/// part in).
pub fn schedule_with(
    tiles: u32,
    transfers: Vec<BufferTransfer>,
    label: u32,
    whole_jobs: bool,
) -> Result<ExchangeStep, CompileError> {
    let layout = synthetic_layout(&transfers)?;
    // Each buffer is a span: `place_storage` moves buffers one by one, so a
    // strided descriptor must not reach from one into the next.
    let mut spans = vec![Vec::new(); tiles as usize];
    for (&(tile, _), &(start, end)) in &layout {
        if let Some(s) = spans.get_mut(tile as usize) {
            s.push((start, end));
        }
    }
    for s in &mut spans {
        s.sort_unstable();
    }
    let phase = phase_of(
        tiles,
        &transfers,
        |r| layout[&(r.tile, r.buffer)].0 + r.offset,
        Some(spans),
    );
    let (tables, figures) = match memo::get(&phase, whole_jobs) {
        Some((tables, figures)) => {
            tracing::debug!(
                phase = label,
                transfers = figures.transfers,
                exchange_cycles = figures.exchange_cycles,
                "exchange schedule reused from an identical phase of this compile"
            );
            (tables, figures)
        }
        None => {
            let (tables, figures) = schedule_phase(&phase, label, whole_jobs)?;
            memo::put(phase, whole_jobs, &tables, figures);
            (tables, figures)
        }
    };
    Ok(ExchangeStep {
        tiles,
        transfers: Arc::new(transfers),
        layout: Arc::new(layout),
        tables,
        figures,
        table_buffers: BTreeMap::new(),
    })
}

/// Runs the scheduler on `phase`: its tables (synthetic addresses) and figures.
fn schedule_phase(
    phase: &Phase,
    label: u32,
    whole_jobs: bool,
) -> Result<(Tables, ExchangeFigures), CompileError> {
    // The scheduler's own check runs on the synthetic addresses; the driver
    // runs the same independent checker on the tables at the placed
    // addresses (`verify_placed`), which are the ones the package carries,
    // so the first check would only cost time (seconds on SigLIP).
    let options = ipu_exchange::Options {
        label,
        check: false,
        whole_jobs,
        ..ipu_exchange::Options::default()
    };
    let compiled =
        ipu_exchange::compile_phase(phase, &options).map_err(|e| CompileError::Verifier {
            phase: "lower",
            message: format!("exchange phase {label}: {e}"),
        })?;
    let r = &compiled.report;
    let figures = ExchangeFigures {
        transfers: r.transfers,
        descriptors: r.descriptors,
        initial_horizon: r.initial_horizon,
        selected_horizon: r.selected_horizon,
        exchange_cycles: r.exchange_cycles,
        endpoint_lower_bound: r.endpoint_lower_bound,
        lower_bound: r.lower_bound,
        lower_bound_gap: r.lower_bound_gap,
    };
    Ok((Arc::new(compiled.lowered.tables), figures))
}

/// Schedules made by the compiles running in this process, by phase.
///
/// A compile plans a segmented model up to three times and joins several
/// mixes of those plans (`lower_segments`); the segments whose plans do
/// not change, and the joins between them, schedule the same phases again
/// (the ViT block: 20 of its 45 phases, 2.5 s of scheduling). A phase is
/// scheduled on synthetic addresses that depend only on the order of the
/// buffers it touches, not on their indices, so a phase of a later pass
/// equals its earlier twin even where buffer indices moved. The scheduler
/// is deterministic, so a reused schedule is the one it would make again;
/// and the driver checks every step's placed tables with the independent
/// checker (`verify_placed`) whether scheduled or reused.
///
/// The memo lives while a compile runs ([`Scope`], held by
/// [`crate::compile`]) and is emptied when the last one ends, so that a
/// process that compiles many models (the test suites) holds no schedules
/// between them; it is also emptied when it holds more than
/// [`MAX_DESCRIPTORS`].
pub mod memo {
    use super::{ExchangeFigures, Tables};
    use ipu_exchange::Phase;
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};

    /// Descriptors (16 bytes each) the memo holds at most.
    pub const MAX_DESCRIPTORS: usize = 8 << 20;

    #[derive(Default)]
    struct Memo {
        scopes: usize,
        descriptors: usize,
        /// By `whole_jobs`, then phase.
        entries: [HashMap<Phase, (Tables, ExchangeFigures)>; 2],
    }

    static MEMO: LazyLock<Mutex<Memo>> = LazyLock::new(Default::default);

    fn memo() -> std::sync::MutexGuard<'static, Memo> {
        // A panic while holding the lock leaves only a map of finished
        // schedules behind, which stays valid.
        MEMO.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the memo while alive.
    pub struct Scope(());

    impl Scope {
        pub fn enter() -> Scope {
            memo().scopes += 1;
            Scope(())
        }
    }

    impl Drop for Scope {
        fn drop(&mut self) {
            let mut m = memo();
            m.scopes -= 1;
            if m.scopes == 0 {
                *m = Memo::default();
            }
        }
    }

    pub(super) fn get(phase: &Phase, whole_jobs: bool) -> Option<(Tables, ExchangeFigures)> {
        let m = memo();
        if m.scopes == 0 {
            return None;
        }
        m.entries[whole_jobs as usize].get(phase).cloned()
    }

    pub(super) fn put(phase: Phase, whole_jobs: bool, tables: &Tables, figures: ExchangeFigures) {
        let mut m = memo();
        if m.scopes == 0 {
            return;
        }
        let descriptors: usize = tables.iter().map(Vec::len).sum();
        if m.descriptors + descriptors > MAX_DESCRIPTORS {
            m.entries = Default::default();
            m.descriptors = 0;
        }
        // Two threads that scheduled the same phase at once insert the
        // same schedule; it is counted once.
        if descriptors <= MAX_DESCRIPTORS
            && m.entries[whole_jobs as usize]
                .insert(phase, (tables.clone(), figures))
                .is_none()
        {
            m.descriptors += descriptors;
        }
    }
}

/// `tile`'s table with every address moved from its synthetic buffer to
/// the placed one (`address_of(buffer)` on that tile).
pub fn resolve(
    step: &ExchangeStep,
    tile: u32,
    address_of: impl Fn(usize) -> u32,
) -> Vec<Descriptor> {
    let Some(table) = step.tables.get(tile as usize) else {
        return Vec::new();
    };
    // The tile's synthetic spans by start address (disjoint), searched by
    // bisection: SigLIP's tables hold 2.5 M descriptors.
    let mut spans: Vec<(u32, u32, usize)> = step
        .layout
        .range((tile, 0)..=(tile, usize::MAX))
        .map(|(&(_, buffer), &(s, e))| (s, e, buffer))
        .collect();
    spans.sort_unstable();
    table
        .iter()
        .map(|d| {
            // Descriptors never span buffers (the layout's gaps), so the
            // buffer that holds the first byte holds them all.
            let i = spans.partition_point(|&(s, _, _)| s <= d.address);
            match i.checked_sub(1).map(|i| spans[i]) {
                Some((s, e, buffer)) if d.address < e => Descriptor {
                    address: address_of(buffer) + (d.address - s),
                    ..*d
                },
                // Unreachable for tables made by `schedule`; left as is so
                // that the checker reports it rather than a panic.
                _ => *d,
            }
        })
        .collect()
}

/// Runs the independent checker of `ipu-exchange` on `tables` against the
/// step's transfers at the placed addresses (`address_of(tile, buffer)`).
pub fn check_tables(
    step: &ExchangeStep,
    tables: &[Vec<Descriptor>],
    address_of: impl Fn(u32, usize) -> u32,
) -> Result<ipu_exchange::CheckSummary, String> {
    let phase = phase_of(
        step.tiles,
        &step.transfers,
        |r| address_of(r.tile, r.buffer) + r.offset,
        None,
    );
    ipu_exchange::check(&phase, tables, ipu_exchange::XTAB_ISSUE_OFFSET).map_err(|e| e.to_string())
}

/// Resolves every tile's table and checks the result: what the driver runs
/// on every exchange step after `place_storage`.
pub fn verify_placed(
    step: &ExchangeStep,
    address_of: impl Fn(u32, usize) -> u32 + Sync,
) -> Result<ipu_exchange::CheckSummary, String> {
    use rayon::prelude::*;
    let tables: Vec<Vec<Descriptor>> = (0..step.tiles)
        .into_par_iter()
        .map(|t| resolve(step, t, |b| address_of(t, b)))
        .collect();
    check_tables(step, &tables, address_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two tiles swap 64 bytes and multicast a row to both.
    fn small_step() -> ExchangeStep {
        let r = |tile, buffer, offset| BufferRef {
            tile,
            buffer,
            offset,
        };
        schedule(
            3,
            vec![
                BufferTransfer {
                    source: r(0, 2, 0),
                    destinations: vec![r(1, 0, 32)],
                    bytes: 64,
                },
                BufferTransfer {
                    source: r(1, 1, 64),
                    destinations: vec![r(0, 0, 0), r(2, 5, 0)],
                    bytes: 32,
                },
            ],
            0,
        )
        .unwrap()
    }

    /// Steps scheduled side by side (`pending_step`, `schedule_pending`)
    /// equal the same steps made one after another by `program_step`, and
    /// so do the buffers both give every tile: random phases on 12 tiles
    /// between steps that add buffers of their own.
    #[test]
    fn pending_steps_equal_steps_scheduled_in_order() {
        let mut rng = ipu_rng::SplitMix64(45);
        for case in 0..40 {
            let tiles = 12;
            let fresh = || -> BTreeMap<u32, Vec<crate::lower::BufferSpec>> {
                (0..tiles)
                    .map(|t| (t, vec![table_buffer("own", 0); 3]))
                    .collect()
            };
            let phases: Vec<Vec<BufferTransfer>> = (0..1 + case % 4)
                .map(|_| {
                    (0..1 + rng.next_u64() % 20)
                        .map(|k| {
                            // Sources in buffer 0; each transfer's
                            // destinations at a range of their own in
                            // buffer 1 or 2, so no two receives overlap.
                            let tile = |rng: &mut ipu_rng::SplitMix64| {
                                (rng.next_u64() % tiles as u64) as u32
                            };
                            let source = BufferRef {
                                tile: tile(&mut rng),
                                buffer: 0,
                                offset: 4 * (rng.next_u64() % 16) as u32,
                            };
                            let destinations = (0..1 + rng.next_u64() % 3)
                                .map(|_| tile(&mut rng))
                                .filter(|&t| t != source.tile)
                                .collect::<std::collections::BTreeSet<u32>>()
                                .into_iter()
                                .map(|t| BufferRef {
                                    tile: t,
                                    buffer: 1 + (k % 2) as usize,
                                    offset: 64 * k as u32,
                                })
                                .collect::<Vec<_>>();
                            BufferTransfer {
                                source,
                                destinations,
                                bytes: 4 * (1 + rng.next_u64() % 8) as u32,
                            }
                        })
                        .filter(|t| !t.destinations.is_empty())
                        .collect::<Vec<_>>()
                })
                .filter(|p: &Vec<BufferTransfer>| !p.is_empty())
                .collect();
            // Between steps each tile gains a buffer, as a join's segments
            // add theirs.
            let (mut in_order, mut in_order_steps) = (fresh(), Vec::new());
            for (label, p) in phases.iter().enumerate() {
                in_order_steps.push(
                    program_step(
                        tiles,
                        p.clone(),
                        label as u32,
                        &mut in_order,
                        "op".into(),
                        "x".into(),
                    )
                    .unwrap(),
                );
                in_order
                    .values_mut()
                    .for_each(|b| b.push(table_buffer("seg", 1)));
            }
            let (mut side_by_side, mut steps, mut pending) = (fresh(), Vec::new(), Vec::new());
            for (label, p) in phases.iter().enumerate() {
                let (step, pend) = pending_step(
                    tiles,
                    p.clone(),
                    label as u32,
                    &mut side_by_side,
                    "op".into(),
                    "x".into(),
                    steps.len(),
                );
                steps.push(step);
                pending.push(pend);
                side_by_side
                    .values_mut()
                    .for_each(|b| b.push(table_buffer("seg", 1)));
            }
            schedule_pending(pending, &mut steps, &mut side_by_side).unwrap();
            assert_eq!(steps, in_order_steps, "case {case}");
            assert_eq!(side_by_side, in_order, "case {case}");
        }
    }

    /// Placed addresses unrelated to the synthetic ones.
    fn placed(tile: u32, buffer: usize) -> u32 {
        0x4E000 + 0x1000 * buffer as u32 + 0x100 * tile
    }

    #[test]
    fn resolved_tables_pass_the_checker() {
        let step = small_step();
        let s = verify_placed(&step, placed).unwrap();
        assert_eq!(s.words_delivered, 16 + 8 + 8);
        let t1 = resolve(&step, 1, |b| placed(1, b));
        assert!(t1
            .iter()
            .any(|d| !d.is_send() && d.address == placed(1, 0) + 32));
    }

    #[test]
    fn corrupted_tables_are_rejected() {
        let step = small_step();
        let good: Vec<Vec<Descriptor>> = (0..3)
            .map(|t| resolve(&step, t, |b| placed(t, b)))
            .collect();
        let mutations: [fn(&mut Descriptor); 4] = [
            |d| d.address += 4,
            |d| d.start += 1,
            |d| d.words -= 1,
            |d| {
                d.kind = if d.is_send() {
                    2
                } else {
                    ipu_exchange::SEND_KIND
                }
            },
        ];
        for tile in 0..3 {
            for i in 0..good[tile].len() {
                for m in mutations {
                    let mut bad = good.clone();
                    m(&mut bad[tile][i]);
                    assert!(
                        check_tables(&step, &bad, placed).is_err(),
                        "tile {tile} descriptor {i}: {:?} accepted",
                        bad[tile][i]
                    );
                }
            }
        }
        // A table resolved with the wrong placement is rejected as well.
        let shifted: Vec<Vec<Descriptor>> = (0..3)
            .map(|t| resolve(&step, t, |b| placed(t, b) + 16))
            .collect();
        assert!(check_tables(&step, &shifted, placed).is_err());
    }

    #[test]
    fn the_drivers_check_rejects_a_corrupted_scheduled_table() {
        // `verify_placed` is what `compile` runs after `place_storage`: a
        // step whose scheduled table was damaged never reaches emit_code.
        let mut step = small_step();
        assert!(verify_placed(&step, placed).is_ok());
        let tile = (0..3).find(|&t| !step.tables[t].is_empty()).unwrap();
        Arc::make_mut(&mut step.tables)[tile][0].start += 1;
        let err = verify_placed(&step, placed).unwrap_err();
        assert!(err.contains(&format!("tile {tile}")), "{err}");
        let mut step = small_step();
        Arc::make_mut(&mut step.tables)[1].pop();
        assert!(verify_placed(&step, placed).is_err());
    }

    #[test]
    fn identical_phases_share_one_schedule_within_a_compile() {
        let _compile = memo::Scope::enter();
        let first = small_step();
        // The same phase with every buffer index moved, as in a later
        // planning pass whose earlier segments hold more buffers: its
        // synthetic addresses, and so its phase, are the same.
        let moved = |t: &BufferTransfer, by: usize, bytes: u32| BufferTransfer {
            source: BufferRef {
                buffer: t.source.buffer + by,
                ..t.source
            },
            destinations: t
                .destinations
                .iter()
                .map(|d| BufferRef {
                    buffer: d.buffer + by,
                    ..*d
                })
                .collect(),
            bytes,
        };
        let again = schedule(
            3,
            first
                .transfers
                .iter()
                .map(|t| moved(t, 7, t.bytes))
                .collect(),
            1,
        )
        .unwrap();
        assert!(Arc::ptr_eq(&first.tables, &again.tables));
        assert_eq!(first.figures, again.figures);
        // Its tables resolve against its own buffers and pass the checker.
        verify_placed(&again, placed).unwrap();
        // One transfer shorter: another phase, scheduled anew.
        let other = schedule(
            3,
            first
                .transfers
                .iter()
                .enumerate()
                .map(|(i, t)| moved(t, 7, if i == 0 { t.bytes - 4 } else { t.bytes }))
                .collect(),
            2,
        )
        .unwrap();
        assert!(!Arc::ptr_eq(&first.tables, &other.tables));
        verify_placed(&other, placed).unwrap();
    }

    #[test]
    fn synthetic_buffers_never_touch() {
        let step = small_step();
        let mut prev: Option<(u32, u32)> = None;
        for (&(tile, _), &(s, e)) in step.layout.iter() {
            if let Some((pt, pe)) = prev {
                if pt == tile {
                    assert!(s >= pe + 16);
                }
            }
            assert_eq!(s % 16, 0);
            prev = Some((tile, e));
        }
    }
}
