//! Phase `lower`: tile work. Every tile gets its buffers (sizes, region and
//! element needs, zero-initialised ranges), every call its steps of vertex
//! calls with state blocks whose words are constants or buffer addresses
//! (resolved after `place_storage`), and every host tensor its placements
//! (buffer offsets, resolved to addresses the same way).
//!
//! A call is a sequence of [`Step`]s. A step is a compute set (vertices
//! started together, then `wsync`) or an exchange step
//! ([`crate::exchange::ExchangeStep`]: transfers between (tile, buffer,
//! offset) pairs, scheduled here by `ipu-exchange` on a synthetic layout,
//! resolved to placed addresses and checked after `place_storage`, emitted
//! as `sync; xtab; xend` on every tile). Today the one exchange is a GEMM
//! chain's hand-off when the consumer has its own plan
//! ([`PlannedGemm::a_by_exchange`]).

use crate::exchange::{self, ExchangeStep};
use crate::fuse::{Group, Source};
use crate::gemm::{best_split, GemmGeometry, ShardLayout};
use crate::kernels::GEMM_STATE_WORDS;
use crate::library::KernelRequest;
use crate::map_tiles::ShardOnTile;
use crate::plan::GemmPlan;
use crate::CompileError;
use ipu_graph::{DType, Graph, TensorType};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Which memory a buffer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RegionReq {
    /// Region 1 (128-bit and `ld2x64` loads).
    Interleaved,
    /// Region 0.
    Standard,
    /// Either.
    Any,
}

/// One tile buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// `value.role`, e.g. `c.a`; unique on the tile.
    pub name: String,
    pub bytes: u32,
    /// Power of two.
    pub align: u32,
    pub region: RegionReq,
    /// Needs interleaved memory elements no other such buffer touches.
    pub exclusive_element: bool,
    /// Byte ranges `[start, end)` that must hold zeros when the package is
    /// loaded (padding the kernels multiply; never written afterwards).
    pub zero: Vec<(u32, u32)>,
    /// Memory category in the report (e.g. "gemm_operand", "gemm_result").
    pub category: String,
    /// `Some(phase)`: the buffer is live only during that phase of the run
    /// call and may share memory with buffers of other phases (region 1
    /// only, never zero at load: the phase's fill steps set what must be
    /// zero); `None`: live for the whole program.
    pub scratch: Option<u32>,
    /// `Some(s)`: the buffer is live only while segment `s` of a segmented
    /// model runs ([`crate::segment::join`]), and may share memory with the
    /// buffers of other segments (never zero at load); its scratch phase,
    /// if any, is one of that segment's. `None`: no such limit.
    pub lifetime: Option<u32>,
    /// `Some(s)`: only the compute steps of segment `s` run kernels on the
    /// buffer (set by [`crate::segment::join`]; exchange steps may move
    /// its bytes at any time). Element-exclusive buffers whose kernels run
    /// in different segments may share memory elements: only the operands
    /// of one kernel's combined load and store must be apart. `None`: any
    /// step's kernels.
    pub kernel_segment: Option<u32>,
}

/// A vertex state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateWord {
    Const(u32),
    /// The address of byte `offset` of buffer `buffer` (an index into the tile's buffers).
    Addr {
        buffer: usize,
        offset: u32,
    },
}

/// The operands of one `gemm_f16` or `gemm_fp8` vertex (docs/kernels.md,
/// device/gemm_f16.S): where A, B and the two C buffers start, their row
/// strides, the partials word `z` (a zero buffer, or 0 for the accumulate
/// mode) and the shape in rows, K blocks and column blocks.
pub struct GemmVertex {
    pub a: StateWord,
    pub rs_a: u32,
    pub b: StateWord,
    pub rs_b: u32,
    pub ca: StateWord,
    pub cb: StateWord,
    pub rs_c: u32,
    pub z: StateWord,
    pub m: u32,
    pub nkb: u32,
    pub ncb: u32,
}

impl GemmVertex {
    /// The vertex state in the kernels' word order, with `gemm_fp8`'s
    /// product scale (a signed word) last for an fp8 GEMM.
    pub fn state(self, g: &GemmGeometry) -> Vec<StateWord> {
        let mut state = vec![
            self.a,
            StateWord::Const(self.rs_a),
            self.b,
            StateWord::Const(self.rs_b),
            self.ca,
            self.cb,
            StateWord::Const(self.rs_c),
            self.z,
            StateWord::Const(self.m),
            StateWord::Const(self.nkb),
            StateWord::Const(self.ncb),
        ];
        if let Some(scale) = g.fp8_scale {
            state.push(StateWord::Const(scale as u32));
        }
        state
    }
}

/// One vertex call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vertex {
    /// Reference-counted, so that copies of a vertex share it: joins and
    /// retries copy every step several times, and copying each request's
    /// strings and parameter map with it took a tenth of a segmented
    /// model's peak memory (GPT-2 block: 1.76 -> 1.60 GB).
    pub kernel: Arc<KernelRequest>,
    pub state: Vec<StateWord>,
}

/// A compute set: per tile, vertices that run together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The graph value computed.
    pub operation: String,
    /// Free text, e.g. "gemm c".
    pub phase: String,
    /// The vertices each tile runs; shared, not copied, by the steps that
    /// rerun this one (a device loop's later iterations), since a deep
    /// loop would otherwise copy every vertex state once per iteration.
    pub tiles: Arc<BTreeMap<u32, Vec<Vertex>>>,
    /// The cost model's cycles for the step (slowest tile).
    pub estimated_cycles: u64,
    /// The cost model's cycles of each tile, where the step's producer
    /// costed its tiles one by one ([`Step::put_tile`]); a tile missing
    /// here takes `estimated_cycles`. Tiles do not wait for each other
    /// between compute sets, so a BSP step's compute lasts as long as its
    /// busiest tile's own steps, not the sum of each step's slowest tile:
    /// a K^T transpose on one tile beside attention rows on another are
    /// not one after the other (a batched attention over inputs on 3 tiles
    /// was estimated 9.5% high when each step charged its slowest tile to
    /// all of its tiles).
    pub tile_cycles: Arc<BTreeMap<u32, u64>>,
    /// An exchange step (then `tiles` is empty): every tile runs `sync`,
    /// `xtab` of its table, `xend`.
    pub exchange: Option<ExchangeStep>,
    /// A host stop (then `tiles` is empty and there is no exchange): every
    /// tile waits for its workers and runs `hsync`, where the host writes
    /// the call's inputs of this stop ([`CallProgram::streamed`]) and
    /// resumes the device. Like an exchange it ends a BSP step.
    pub host_stop: bool,
    /// Which supervisor cost `estimated_cycles` includes around the step's
    /// vertices.
    pub launch: Launch,
}

/// The supervisor's cost around a compute step depends on what ran before
/// it on the tile (tests/supervisor_runtime.rs measures each case): a
/// call's first compute step pays the command's dispatch and the call's
/// end beside its launches (`plan::supervisor_cycles`), a step after an
/// exchange or a host stop 18 cycles a vertex, and a step after another
/// compute step 12, since its record loads in the shadow of that step's
/// workers (`attention::launch_cycles`). Planners cost a GEMM's steps
/// before they are in order, so each estimate assumes a place;
/// `launches::settle_launches` charges the cost of the step's place in its
/// call instead. `Launch::cycles` (crate::launches) gives each place's cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// The estimate's own launch cost stands (exchange steps, host stops,
    /// and compute steps whose estimates place their launches themselves).
    Own,
    /// The estimate includes `plan::supervisor_cycles(n)` for the step's
    /// `n` vertices on a tile, the cost of a call's first compute step.
    FirstOfCall,
    /// The estimate includes `launches::after_sync_cycles(n)`, the cost of
    /// a step after an exchange or a host stop.
    AfterSync,
    /// The estimate includes `attention::launch_cycles(n)`, the cost of a
    /// step after another compute step on its tiles.
    AfterCompute,
}

impl Step {
    /// A step of `operation` in `phase` with no vertices, no exchange and
    /// no estimate yet, launched on its own; its builder fills them in.
    pub fn empty(operation: String, phase: String) -> Step {
        Step {
            tile_cycles: Default::default(),
            operation,
            phase,
            tiles: Default::default(),
            estimated_cycles: 0,
            exchange: None,
            host_stop: false,
            launch: Launch::Own,
        }
    }

    /// Whether the step ends a BSP step: an exchange (its sync) or a host
    /// stop (its `hsync`).
    pub fn ends_bsp_step(&self) -> bool {
        self.exchange.is_some() || self.host_stop
    }

    /// Gives `tile` its vertices and the cost model's cycles for them,
    /// which raise the step's estimate when the tile is its slowest.
    pub fn put_tile(&mut self, tile: u32, vertices: Vec<Vertex>, cycles: u64) {
        self.charge_tile(tile, cycles);
        Arc::make_mut(&mut self.tiles).insert(tile, vertices);
    }

    /// The step with its tiles renumbered from `first_tile` (a program
    /// lowered on a share of the tiles, put in place beside others).
    pub fn on_tiles_from(mut self, first_tile: u32) -> Step {
        if first_tile > 0 {
            self.tiles = Arc::new(
                self.tiles
                    .iter()
                    .map(|(&t, v)| (t + first_tile, v.clone()))
                    .collect(),
            );
            self.tile_cycles = Arc::new(
                self.tile_cycles
                    .iter()
                    .map(|(&t, &c)| (t + first_tile, c))
                    .collect(),
            );
        }
        self
    }

    /// Sets the cost model's cycles of `tile`'s vertices in the step
    /// (placed apart from them), which raise the step's estimate when the
    /// tile is its slowest.
    pub fn charge_tile(&mut self, tile: u32, cycles: u64) {
        self.estimated_cycles = self.estimated_cycles.max(cycles);
        Arc::make_mut(&mut self.tile_cycles).insert(tile, cycles);
    }

    /// The cost model's cycles of the step on `tile`: its own where the
    /// step has them, never more than the step's estimate.
    pub fn tile_estimate(&self, tile: u32) -> u64 {
        self.tile_cycles
            .get(&tile)
            .map_or(self.estimated_cycles, |&c| c.min(self.estimated_cycles))
    }

    /// Moves the step's estimate and every tile's own by `delta` cycles
    /// (a launch cost settled, a loop record added).
    pub fn shift_estimate(&mut self, delta: i64) {
        let shift = |c: u64| c.saturating_add_signed(delta);
        self.estimated_cycles = shift(self.estimated_cycles);
        if !self.tile_cycles.is_empty() {
            for c in Arc::make_mut(&mut self.tile_cycles).values_mut() {
                *c = shift(*c);
            }
        }
    }
}

/// The program of one call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallProgram {
    pub name: String,
    /// The steps in the order the call runs them.
    pub steps: Vec<Step>,
    /// Steps that run an earlier step of the call again (a device loop's
    /// later iterations, [`crate::loops`]): step index -> the index of the
    /// step whose vertex states and exchange tables it reuses. Such a step
    /// is a copy of that step (only its `operation` names the iteration's
    /// value), so every phase that reads steps sees the call as it runs,
    /// and the ones that lay out memory (`emit_code`, `link`) skip it.
    pub reruns: BTreeMap<usize, usize>,
    /// Device loops: runs of steps that repeat a period of steps, emitted
    /// as one copy of the period between the supervisor's `rt_loop` and
    /// `rt_next` records ([`crate::loops`]).
    pub loops: Vec<DeviceLoop>,
    /// Inputs the host writes at the call's host stops: (stop, tensor),
    /// stop k being the call's k-th host-stop step counted from 1 as the
    /// call runs (a device loop's weights streamed per iteration,
    /// [`crate::loops`]). Different stops' tensors may share placements.
    pub streamed: Vec<(u32, HostTensor)>,
}

impl CallProgram {
    /// The call's steps that are not reruns (each step's vertices and
    /// exchange tables once).
    pub fn first_runs(&self) -> impl Iterator<Item = &Step> {
        self.steps
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.reruns.contains_key(i))
            .map(|(_, s)| s)
    }
}

/// Steps `start..start + period * count` of a call: `count` periods, the
/// later ones reruns of the first, which ends with an exchange step. The
/// tile program runs the first period `count` times with an index word
/// k = 0, 1, ... (`copy64_list` vertices read slot k of their weight
/// stacks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLoop {
    pub start: usize,
    pub period: usize,
    pub count: u32,
    /// Per tile: the buffer of its index word; tiles without one get a
    /// scratch word in their table.
    pub index: BTreeMap<u32, usize>,
}

/// Bytes `host_offset..+bytes` of a host tensor at `buffer_offset` of a tile buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPlacement {
    pub tile: u32,
    pub buffer: usize,
    pub buffer_offset: u32,
    pub host_offset: u64,
    pub bytes: u32,
}

/// A host tensor of a call.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub name: String,
    pub ty: TensorType,
    pub placements: Vec<HostPlacement>,
}

/// The lowered program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lowered {
    pub tile_count: u32,
    /// Buffers per tile (every tile 0..tile_count has an entry).
    pub buffers: BTreeMap<u32, Vec<BufferSpec>>,
    /// `initialize` then `run`.
    pub calls: Vec<CallProgram>,
    /// Host tensors of each call: (inputs, outputs), indexed like `calls`.
    pub io: Vec<(Vec<HostTensor>, Vec<HostTensor>)>,
    /// Values computed by "run" that are not outputs but stay on the device
    /// until the next call (e.g. a chain's hidden activation), with where
    /// they are (host offsets as if they were outputs).
    pub resident: Vec<HostTensor>,
    /// Where each (group, tile)'s compact f16 result (the reduce step's `d`
    /// buffer) is, for later phases that move it between tiles.
    pub group_results: BTreeMap<(usize, u32), GroupResult>,
    /// Host tensors whose placements index them transposed (their last two
    /// dimensions swapped, as the manifest's `transposed` says): GEMM
    /// operands the model transposes (`legalize`).
    pub transposed_host: std::collections::BTreeSet<String>,
    /// For a joined program ([`crate::segment::join`]), each segment's steps
    /// in the run call: `start..end`, its input exchange step included.
    pub segment_steps: Vec<std::ops::Range<usize>>,
    /// Values whose placements a later step of the run call writes over
    /// without any buffer sharing their memory (a device loop's carried
    /// start, which the back edge overwrites with each iteration's
    /// carry): no checkpoint names them.
    pub rewritten: std::collections::BTreeSet<String>,
}

/// A group's compact result on one tile: rows `rows` and columns
/// `col0..col0 + width` of the result, `row_stride` bytes apart in `buffer`
/// (or, when `transposed`, columns `row_stride` bytes apart, each holding
/// the rows' elements in order and zeros up to the stride).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupResult {
    pub buffer: usize,
    pub row_stride: u32,
    pub rows: (u32, u32),
    pub col0: u32,
    pub width: u32,
    pub transposed: bool,
}

/// Where a group's compact result lives on a tile: (buffer, row stride,
/// global row range).
type ResultOnTile = (usize, u32, (u32, u32));

/// A GEMM node with its chosen plan and mapping.
pub struct PlannedGemm<'a> {
    pub group: &'a Group,
    pub geometry: GemmGeometry,
    pub plan: &'a GemmPlan,
    pub map: &'a [ShardOnTile],
    pub kernel: KernelRequest,
    /// The reduce kernel (f32 accumulation only).
    pub reduce_kernel: Option<KernelRequest>,
    /// For a streamed reduce-scatter of f16 partials: the object that
    /// reads partial 0 at its own address (state word OWN: `reduce_f32`
    /// PAIRS=1, which also loads two partials per `ld2x64st64`, or the
    /// transposed OWN=1) with its formula; a tile's reduce takes it when
    /// its formula beats `reduce_kernel`'s and the self-transfer it spares
    /// (its fixed cost is higher, so small pieces may keep `reduce_kernel`).
    pub reduce_own: Option<(KernelRequest, crate::gemm::FormulaCost)>,
    pub costs: &'a mut crate::gemm::GemmCosts,
    /// A chained GEMM whose A rows arrive by an exchange step from the
    /// producer's tiles (its own plan), rather than staying on the tiles of
    /// a shared row partition.
    pub a_by_exchange: bool,
    /// The result is the A operand of a GEMM on the same tiles (a chain
    /// with shared rows), so it lives in interleaved elements of its own;
    /// otherwise its consumer receives it by exchange and it stays in
    /// standard memory.
    pub result_in_place: bool,
    /// The GEMM runs in scratch phase 1 of the run call: its host-input A
    /// rows (when K needs no padding) and its C buffers share memory with a
    /// later phase; the C headers are zeroed by this fill kernel (with its
    /// estimated cycles for one vertex filling both) before the GEMM.
    pub scratch_fill: Option<(KernelRequest, u64)>,
    /// The reduce step stores the result transposed (`reduce_f32` TR=1):
    /// the Q and V projections of a column-layout attention, whose
    /// exchange moves runs of queries and keys.
    pub transposed_result: bool,
    /// A streamed GEMM that runs side by side with others on disjoint
    /// tiles (an attention's projections): its exchange steps merge with
    /// theirs, and its chunk buffers are scratch of
    /// [`PROJECTION_PHASE`].
    pub side_by_side: bool,
    /// The GEMM belongs to a segment of a segmented model, whose buffers
    /// share memory with the other segments': its C headers are zeroed by
    /// a fill step (`scratch_fill`), even side by side, rather than kept
    /// from load time, so that its C buffers live only in the segment.
    pub in_segment: bool,
}

/// Scratch phase of the projections in a model with attention.
pub const PROJECTION_PHASE: u32 = 1;

/// Appends `p` to `list`, merging it into the last placement when both the
/// host bytes and the buffer bytes continue it.
pub(crate) fn push_coalesced(list: &mut Vec<HostPlacement>, p: HostPlacement) {
    if let Some(last) = list.last_mut() {
        if last.tile == p.tile
            && last.buffer == p.buffer
            && last.buffer_offset + last.bytes == p.buffer_offset
            && last.host_offset + last.bytes as u64 == p.host_offset
            && (last.bytes as u64 + p.bytes as u64) < u32::MAX as u64
        {
            last.bytes += p.bytes;
            return;
        }
    }
    list.push(p);
}

/// Lowers the GEMMs (in graph order) of a graph that `load` accepted.
pub fn lower(
    graph: &Graph,
    tile_count: u32,
    gemms: &mut [PlannedGemm],
) -> Result<Lowered, CompileError> {
    let mut buffers: BTreeMap<u32, Vec<BufferSpec>> =
        (0..tile_count).map(|t| (t, Vec::new())).collect();
    let mut inputs: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut params: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut outputs: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut resident: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut steps = Vec::new();
    // The compact result buffer `d` of each (group, tile): (buffer, row stride, rows).
    let mut results: BTreeMap<(usize, u32), ResultOnTile> = BTreeMap::new();
    let mut group_results: BTreeMap<(usize, u32), GroupResult> = BTreeMap::new();
    // Per group already lowered: geometry, plan and mapping (for hand-offs).
    let mut handoff_views: Vec<(GemmGeometry, GemmPlan, Vec<ShardOnTile>)> = Vec::new();
    let mut gemms_results = Vec::new();
    let mut exchange_label = 0u32;
    // Scratch phases taken by the streamed GEMMs lowered so far.
    let mut stream_phases = 0u32;
    // The pending steps of streamed GEMMs that run side by side (an
    // attention's projections), merged after the last of them.
    let mut side_by_side: Vec<Vec<crate::stream::Pending>> = Vec::new();
    let mut a_homes = crate::stream::AHomes::new();
    for (gi_group, pg) in gemms.iter_mut().enumerate() {
        if let Some(shape) = pg.plan.stream {
            // K streams through the tiles in chunks (crate::stream); its A
            // comes from the host or from the producer's result tiles, and
            // its reduced result may be a later streamed GEMM's A.
            let a_from = match pg.group.a {
                Source::Group(p) => Some(
                    group_results
                        .iter()
                        .filter(|((g, _), _)| *g == p)
                        .map(|(&(_, tile), &r)| (tile, r))
                        .collect(),
                ),
                Source::Host(_) => None,
            };
            let mut pending = Vec::new();
            let streamed_results = crate::stream::lower(
                graph,
                pg,
                crate::stream::Sink {
                    buffers: &mut buffers,
                    inputs: &mut inputs,
                    params: &mut params,
                    outputs: &mut outputs,
                    resident: &mut resident,
                    steps: &mut pending,
                    a_from,
                    a_homes: &mut a_homes,
                    phases: if pg.side_by_side {
                        crate::stream::StreamPhases::Shared(PROJECTION_PHASE)
                    } else {
                        crate::stream::StreamPhases::After(stream_phases)
                    },
                },
            )?;
            if pg.side_by_side {
                side_by_side.push(pending);
            } else {
                crate::stream::emit(
                    pending,
                    tile_count,
                    &mut buffers,
                    &mut steps,
                    &mut exchange_label,
                )?;
                if shape.k_parts > 1 {
                    stream_phases += crate::stream::PHASES;
                }
            }
            for (tile, r) in streamed_results {
                group_results.insert((gi_group, tile), r);
            }
            handoff_views.push((pg.geometry, pg.plan.clone(), pg.map.to_vec()));
            gemms_results.push(pg.group.result());
            continue;
        }
        let node = graph.node(pg.group.gemm);
        let value = graph.value(node.result).name.clone();
        let result_value = pg.group.result();
        let result_name = graph.value(result_value).name.clone();
        let (a_id, b_id) = (node.args[0], node.args[1]);
        let g = pg.geometry;
        let (k, n, ob) = (g.k, g.n, g.out_bytes());
        // Bytes of one A or B element (fp8 1, f16 2).
        let eb = g.operand_bytes();
        let rows = pg.plan.row_ranges(&g);
        let cols = pg.plan.col_ranges(&g);
        let fused: Vec<&str> = pg.group.values[1..]
            .iter()
            .map(|&v| graph.value(v).name.as_str())
            .collect();
        let mut step = Step {
            tile_cycles: Default::default(),
            operation: result_name.clone(),
            phase: if fused.is_empty() {
                format!("gemm {value}")
            } else {
                format!("gemm {value} (epilogue {})", fused.join(", "))
            },
            tiles: Default::default(),
            estimated_cycles: pg.plan.estimate.compute_cycles
                - pg.plan.estimate.reduce_cycles
                - pg.plan.estimate.copy_cycles
                - pg.plan.estimate.transpose_cycles,
            exchange: None,
            host_stop: false,
            launch: Launch::FirstOfCall,
        };
        // The A buffer of each consumer tile of an exchanged hand-off.
        let mut a_buffers: BTreeMap<u32, usize> = BTreeMap::new();
        let mut reduce_step = Step {
            tile_cycles: Default::default(),
            operation: result_name.clone(),
            phase: format!("reduce {result_name}"),
            tiles: Default::default(),
            estimated_cycles: pg.plan.estimate.reduce_cycles,
            exchange: None,
            host_stop: false,
            launch: Launch::AfterCompute,
        };
        let mut fill_step = Step {
            tile_cycles: Default::default(),
            operation: result_name.clone(),
            phase: format!("zero {value} C headers"),
            tiles: Default::default(),
            estimated_cycles: pg.scratch_fill.as_ref().map_or(0, |f| f.1),
            exchange: None,
            host_stop: false,
            launch: Launch::Own,
        };
        let host_tensor = |id| HostTensor {
            name: graph.value(id).name.clone(),
            ty: graph.value(id).ty.clone(),
            placements: Vec::new(),
        };
        let kind_of = |id| graph.value(id).def == ipu_graph::ValueDef::Param;
        for shard in pg.map {
            let (r0, r1) = rows[shard.row_part as usize];
            let (c0, c1) = cols[shard.col_part as usize];
            let (mt, nct) = (r1 - r0, c1 - c0);
            let (split, _, _) = best_split(&g, mt, nct, pg.costs)
                .expect("the plan's shards have a split that fits (plan checked it)");
            let layout = ShardLayout::new(&g, mt, nct, &split);
            // The plan counted this shard's region 1 with the split its
            // costs give; lowering takes the split from the same costs, so
            // the buffers below are what the plan counted (a planner that
            // changes a GEMM's costs after planning it breaks this, and
            // storage then overflows what the plan said fits).
            debug_assert!(
                pg.costs
                    .region1_bytes(&layout)
                    .is_some_and(|b| b <= pg.plan.estimate.peak_interleaved_bytes),
                "{value}: the shard's buffers exceed the plan's region-1 estimate"
            );
            let tile_bufs = buffers
                .get_mut(&shard.tile)
                .expect("tiles below tile_count");
            let width = (c1 * 16).min(n) - c0 * 16;
            let pad_a = g.kp() != k;
            let pad_b = pad_a || width != nct * 16;
            let header = vec![(0, crate::gemm::C_HEADER)];
            let buf =
                |role: &str, bytes, exclusive, zero: Vec<(u32, u32)>, category: &str| BufferSpec {
                    name: format!("{value}.{role}"),
                    bytes,
                    align: 16,
                    region: RegionReq::Interleaved,
                    exclusive_element: exclusive,
                    zero,
                    category: category.into(),
                    scratch: None,
                    lifetime: None,
                    kernel_segment: None,
                };
            // A: the host operand's rows, or the producing group's result,
            // which the joint plan put on this tile with the same rows.
            let scratch = pg.scratch_fill.is_some();
            let ia = match pg.group.a {
                Source::Host(a) => {
                    let mut spec = buf(
                        "a",
                        layout.a_bytes(),
                        true,
                        if pad_a {
                            vec![(0, layout.a_bytes())]
                        } else {
                            vec![]
                        },
                        "gemm_operand",
                    );
                    // Host inputs are written at the start of every run, so
                    // their rows are phase-1 scratch; params (written once)
                    // and padded rows (zeros from the image) stay.
                    if scratch && !pad_a && !kind_of(a) {
                        spec.scratch = Some(PROJECTION_PHASE);
                    }
                    tile_bufs.push(spec);
                    tile_bufs.len() - 1
                }
                Source::Group(_) if pg.a_by_exchange => {
                    // Filled by the exchange step; the two drain rows are
                    // never written, so they start as zeros.
                    tile_bufs.push(buf(
                        "a",
                        layout.a_bytes(),
                        true,
                        vec![(mt * layout.rs_a, layout.a_bytes())],
                        "gemm_operand",
                    ));
                    a_buffers.insert(shard.tile, tile_bufs.len() - 1);
                    tile_bufs.len() - 1
                }
                Source::Group(p) => {
                    let &(id, rs, prows) = results
                        .get(&(p, shard.tile))
                        .expect("a chained GEMM runs on the tiles of its producer");
                    assert_eq!(
                        (rs, prows),
                        (layout.rs_a, (r0, r1)),
                        "chained layouts agree by construction"
                    );
                    id
                }
            };
            tile_bufs.push(buf(
                "b",
                layout.b_bytes(),
                false,
                if pad_b {
                    vec![(0, layout.b_bytes())]
                } else {
                    vec![]
                },
                "gemm_weight",
            ));
            let ib = tile_bufs.len() - 1;
            let c_spec = |role: &str, category: &str| {
                let mut b = buf(role, layout.c_bytes(), true, header.clone(), category);
                if scratch {
                    b.zero.clear();
                    b.scratch = Some(PROJECTION_PHASE);
                }
                b
            };
            tile_bufs.push(c_spec("c", "gemm_result"));
            let ic = tile_bufs.len() - 1;
            tile_bufs.push(c_spec("c_partial", "gemm_partials"));
            let it = tile_bufs.len() - 1;
            if let Some((fill, _)) = &pg.scratch_fill {
                std::sync::Arc::make_mut(&mut fill_step.tiles)
                    .insert(shard.tile, vec![c_header_fill(fill, [ic, it])]);
            }
            // The fused bias: the tile's columns, padding zero so that padded
            // result columns stay exact zeros (a chained GEMM multiplies them).
            let bias_buffer = pg.group.bias.map(|bias| {
                tile_bufs.push(BufferSpec {
                    name: format!("{value}.bias"),
                    bytes: nct * g.bias_block_bytes(),
                    align: 16,
                    region: RegionReq::Standard,
                    exclusive_element: false,
                    zero: vec![(0, nct * g.bias_block_bytes())],
                    category: "bias".into(),
                    scratch: None,
                    lifetime: None,
                    kernel_segment: None,
                });
                (bias, tile_bufs.len() - 1)
            });

            let mut vertices = Vec::new();
            for (gi, &(lr0, lr1)) in split.row_groups.iter().enumerate() {
                for &(cg0, cg1) in &split.col_groups {
                    for (j, &(kb0, kb1)) in split.k_groups.iter().enumerate() {
                        // K block 0 of the group writes the buffer that, after
                        // its nkb blocks, holds the group's result: always `c`.
                        let (first, second) = if (kb1 - kb0) % 2 == 1 {
                            (ic, it)
                        } else {
                            (it, ic)
                        };
                        let c_off = layout.c_row(j as u32, gi as u32, lr0) + cg0 * 16 * ob;
                        let state = GemmVertex {
                            a: StateWord::Addr {
                                buffer: ia,
                                offset: lr0 * layout.rs_a + kb0 * g.k_block() * g.operand_bytes(),
                            },
                            rs_a: layout.rs_a,
                            b: StateWord::Addr {
                                buffer: ib,
                                offset: kb0 * g.k_block() * layout.rs_b
                                    + cg0 * 16 * g.operand_bytes(),
                            },
                            rs_b: layout.rs_b,
                            ca: StateWord::Addr {
                                buffer: first,
                                offset: c_off,
                            },
                            cb: StateWord::Addr {
                                buffer: second,
                                offset: c_off,
                            },
                            rs_c: layout.rs_c,
                            z: StateWord::Addr {
                                buffer: second,
                                offset: 0,
                            },
                            m: lr1 - lr0,
                            nkb: kb1 - kb0,
                            ncb: cg1 - cg0,
                        }
                        .state(&g);
                        vertices.push(Vertex {
                            kernel: std::sync::Arc::new(pg.kernel.clone()),
                            state,
                        });
                    }
                }
            }
            std::sync::Arc::make_mut(&mut step.tiles).insert(shard.tile, vertices);

            // f32 accumulation: sum the K groups' partials (and convert to
            // f16 for an f16 result) into the compact result buffer `d`.
            let mut result_buffer = (ic, None);
            if g.needs_reduce(split.k_groups.len()) {
                let reduce = pg
                    .reduce_kernel
                    .clone()
                    .expect("f32 accumulation comes with a reduce kernel");
                let id = tile_bufs.len();
                // The result buffer, and how the reduce step writes it.
                let (row_stride, dst, bias) = if pg.transposed_result {
                    // Columns of the result, each padded with zeros to 8
                    // bytes (the layout `transpose_f16` would make).
                    let rs_t = (mt * 2).div_ceil(8) * 8;
                    let zero: Vec<(u32, u32)> = (0..nct * 16)
                        .map(|c| (c * rs_t + mt * 2, (c + 1) * rs_t))
                        .filter(|z| z.0 < z.1)
                        .collect();
                    tile_bufs.push(BufferSpec {
                        name: format!("{value}.d_transposed"),
                        bytes: nct * 16 * rs_t,
                        align: 8,
                        region: RegionReq::Any,
                        exclusive_element: false,
                        zero,
                        category: "gemm_result".into(),
                        scratch: None,
                        lifetime: None,
                        kernel_segment: None,
                    });
                    // The bias, when the group has one, is added by the
                    // same step (`reduce_f32` EPI=1 TR=1).
                    (
                        rs_t,
                        ReduceDst::Transposed(rs_t),
                        bias_buffer.map(|(_, b)| b),
                    )
                } else {
                    // A result that a later GEMM on these tiles streams as its
                    // A operand lives in interleaved elements of its own, with
                    // the two rows the consumer's drain reads.
                    let feeds = pg.group.feeds_gemm && pg.result_in_place;
                    tile_bufs.push(BufferSpec {
                        name: format!("{value}.d"),
                        bytes: layout.d_bytes() + if feeds { 2 * layout.rs_d() } else { 0 },
                        align: 16,
                        region: if feeds {
                            RegionReq::Interleaved
                        } else {
                            RegionReq::Standard
                        },
                        exclusive_element: feeds,
                        zero: vec![],
                        category: "gemm_result".into(),
                        scratch: None,
                        lifetime: None,
                        kernel_segment: None,
                    });
                    results.insert((gi_group, shard.tile), (id, layout.rs_d(), (r0, r1)));
                    result_buffer = (id, Some(layout.rs_d()));
                    (layout.rs_d(), ReduceDst::Rows, bias_buffer.map(|(_, b)| b))
                };
                group_results.insert(
                    (gi_group, shard.tile),
                    GroupResult {
                        buffer: id,
                        row_stride,
                        rows: (r0, r1),
                        col0: c0 * 16,
                        width,
                        transposed: pg.transposed_result,
                    },
                );
                let reduces = reduce_vertices(&reduce, &g, (&layout, &split), (ic, id), dst, bias);
                std::sync::Arc::make_mut(&mut reduce_step.tiles).insert(shard.tile, reduces);
            }

            // Host placements: A rows (host operands), B rows of the tile's
            // columns, the bias, result rows (graph outputs).
            if let Source::Host(_) = pg.group.a {
                let a_t = (if kind_of(a_id) {
                    &mut params
                } else {
                    &mut inputs
                })
                .entry(graph.value(a_id).name.clone())
                .or_insert_with(|| host_tensor(a_id));
                for r in 0..mt {
                    push_coalesced(
                        &mut a_t.placements,
                        HostPlacement {
                            tile: shard.tile,
                            buffer: ia,
                            buffer_offset: r * layout.rs_a,
                            host_offset: (r0 + r) as u64 * k as u64 * eb as u64,
                            bytes: k * eb,
                        },
                    );
                }
            }
            if let Some((bias, b)) = bias_buffer {
                let t = (if kind_of(bias) {
                    &mut params
                } else {
                    &mut inputs
                })
                .entry(graph.value(bias).name.clone())
                .or_insert_with(|| host_tensor(bias));
                t.placements.push(HostPlacement {
                    tile: shard.tile,
                    buffer: b,
                    buffer_offset: 0,
                    host_offset: c0 as u64 * g.bias_block_bytes() as u64,
                    bytes: width * g.result_bytes(),
                });
            }
            let b_t = (if kind_of(b_id) {
                &mut params
            } else {
                &mut inputs
            })
            .entry(graph.value(b_id).name.clone())
            .or_insert_with(|| host_tensor(b_id));
            for kk in 0..k {
                push_coalesced(
                    &mut b_t.placements,
                    HostPlacement {
                        tile: shard.tile,
                        buffer: ib,
                        buffer_offset: kk * layout.rs_b,
                        host_offset: (kk as u64 * n as u64 + c0 as u64 * 16) * eb as u64,
                        bytes: width * eb,
                    },
                );
            }
            // Transposed results feed attention only (never an output); the
            // package lists them transposed for diagnosis (checkpoints.json).
            if pg.transposed_result {
                if let Some(r) = group_results.get(&(gi_group, shard.tile)) {
                    let rows = graph.ty(result_value).shape.dims()[0] as u32;
                    let c_t = resident
                        .entry(result_name.clone())
                        .or_insert_with(|| host_tensor(result_value));
                    c_t.placements
                        .extend(transposed_result_placements(shard.tile, r, rows));
                }
                continue;
            }
            // Results that are not outputs stay resident on the device; the
            // package lists where (checkpoints.json) for diagnosis.
            let target = if graph.outputs().contains(&result_value) {
                &mut outputs
            } else {
                &mut resident
            };
            let c_t = target
                .entry(result_name.clone())
                .or_insert_with(|| host_tensor(result_value));
            let rb = g.result_bytes();
            for (gi, &(lr0, lr1)) in split.row_groups.iter().enumerate() {
                for r in lr0..lr1 {
                    let (buffer, buffer_offset) = match result_buffer {
                        (id, Some(rs_d)) => (id, r * rs_d),
                        (id, None) => (id, layout.c_row(0, gi as u32, r)),
                    };
                    push_coalesced(
                        &mut c_t.placements,
                        HostPlacement {
                            tile: shard.tile,
                            buffer,
                            buffer_offset,
                            host_offset: ((r0 + r) as u64 * n as u64 + c0 as u64 * 16) * rb as u64,
                            bytes: width * rb,
                        },
                    );
                }
            }
        }
        if let (Source::Group(p), true) = (pg.group.a, pg.a_by_exchange) {
            let transfers = {
                let (producer, consumer) = (&handoff_views[p], &*pg);
                exchange::handoff(
                    (&producer.0, &producer.1, &producer.2),
                    (&consumer.geometry, consumer.plan, consumer.map),
                    |t| results[&(p, t)].0,
                    |t| a_buffers[&t],
                )
            };
            steps.push(exchange::program_step(
                tile_count,
                transfers,
                exchange_label,
                &mut buffers,
                result_name.clone(),
                format!(
                    "exchange {} -> {value}.a",
                    graph.value(gemms_results[p]).name
                ),
            )?);
            exchange_label += 1;
        }
        handoff_views.push((g, pg.plan.clone(), pg.map.to_vec()));
        gemms_results.push(result_value);
        if !fill_step.tiles.is_empty() {
            steps.push(fill_step);
        }
        steps.push(step);
        if !reduce_step.tiles.is_empty() {
            steps.push(reduce_step);
        }
    }
    if !side_by_side.is_empty() {
        let merged = crate::stream::merge(side_by_side);
        crate::stream::emit(
            merged,
            tile_count,
            &mut buffers,
            &mut steps,
            &mut exchange_label,
        )?;
    }
    let mut l = Lowered::two_calls(
        graph,
        tile_count,
        buffers,
        (vec![], steps),
        HostTensors {
            params,
            inputs,
            outputs,
            resident,
        },
    );
    l.group_results = group_results;
    l.transposed_host.extend(
        gemms
            .iter()
            .filter(|pg| pg.transposed_result)
            .map(|pg| graph.value(pg.group.result()).name.clone()),
    );
    Ok(l)
}

/// Host placements of a transposed result (`reduce_f32` TR=1) on `tile`:
/// one per result column, the run of its rows, at offsets of the model's
/// `[rows, N]` value with its two axes swapped (`transposed` in
/// checkpoints.json).
pub(crate) fn transposed_result_placements(
    tile: u32,
    r: &GroupResult,
    rows: u32,
) -> impl Iterator<Item = HostPlacement> + '_ {
    debug_assert!(r.transposed);
    let (r0, r1) = r.rows;
    (0..r.width).map(move |c| HostPlacement {
        tile,
        buffer: r.buffer,
        buffer_offset: c * r.row_stride,
        host_offset: ((r.col0 + c) as u64 * rows as u64 + r0 as u64) * 2,
        bytes: (r1 - r0) * 2,
    })
}

/// A program's host tensors by name, in any order.
#[derive(Default)]
pub(crate) struct HostTensors {
    pub params: BTreeMap<String, HostTensor>,
    pub inputs: BTreeMap<String, HostTensor>,
    pub outputs: BTreeMap<String, HostTensor>,
    pub resident: BTreeMap<String, HostTensor>,
}

impl HostTensors {
    /// Adds `placements` to tensor `t`'s entry in `map` (created from `t`).
    pub fn place(
        map: &mut BTreeMap<String, HostTensor>,
        t: &HostTensor,
        placements: impl IntoIterator<Item = HostPlacement>,
    ) {
        map.entry(t.name.clone())
            .or_insert_with(|| HostTensor {
                name: t.name.clone(),
                ty: t.ty.clone(),
                placements: Vec::new(),
            })
            .placements
            .extend(placements);
    }
}

impl Lowered {
    /// The number of exchange steps in every call so far: the label of the
    /// next one (it names the step's tables and its scheduler log line).
    pub fn exchange_steps(&self) -> u32 {
        self.calls
            .iter()
            .flat_map(|c| &c.steps)
            .filter(|s| s.exchange.is_some())
            .count() as u32
    }

    /// The program of an `initialize` and a `run` call with these steps;
    /// its tensors in graph order, so that the manifest follows the model.
    pub(crate) fn two_calls(
        graph: &Graph,
        tile_count: u32,
        buffers: BTreeMap<u32, Vec<BufferSpec>>,
        (initialize, run): (Vec<Step>, Vec<Step>),
        tensors: HostTensors,
    ) -> Lowered {
        let order = |m: BTreeMap<String, HostTensor>| -> Vec<HostTensor> {
            let mut v: Vec<HostTensor> = m.into_values().collect();
            v.sort_by_key(|t| graph.lookup(&t.name).map(|id| id.0));
            v
        };
        Lowered {
            tile_count,
            buffers,
            calls: vec![
                CallProgram {
                    name: "initialize".into(),
                    steps: initialize,
                    reruns: BTreeMap::new(),
                    loops: Vec::new(),
                    streamed: Vec::new(),
                },
                CallProgram {
                    name: "run".into(),
                    steps: run,
                    reruns: BTreeMap::new(),
                    loops: Vec::new(),
                    streamed: Vec::new(),
                },
            ],
            io: vec![
                (order(tensors.params), vec![]),
                (order(tensors.inputs), order(tensors.outputs)),
            ],
            resident: order(tensors.resident),
            group_results: BTreeMap::new(),
            transposed_host: Default::default(),
            segment_steps: Vec::new(),
            rewritten: Default::default(),
        }
    }
}

/// One `fill64` vertex that zeroes the headers of a GEMM's two C buffers
/// (`crate::gemm::C_HEADER` bytes each), for C buffers that are not zero
/// from load time (scratch or segment-scoped memory).
pub(crate) fn c_header_fill(fill: &KernelRequest, buffers: [usize; 2]) -> Vertex {
    let mut state = vec![StateWord::Const(2)];
    for buffer in buffers {
        state.extend([
            StateWord::Addr { buffer, offset: 0 },
            StateWord::Const(crate::gemm::C_HEADER / 8),
            StateWord::Const(0),
            StateWord::Const(0),
        ]);
    }
    Vertex {
        kernel: std::sync::Arc::new(fill.clone()),
        state,
    }
}

/// The reduce step's vertices of one shard (`WorkerSplit::reduce_parts`):
/// each sums its rows' K-group partials of buffer `c` (sections
/// `layout.section()` apart) into the compact rows of buffer `d`, with the
/// bias of its columns when the group has one.
/// Where a reduce step stores its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceDst {
    /// Compact rows (`ShardLayout::rs_d` apart).
    Rows,
    /// Columns this many bytes apart (`reduce_f32` TR=1).
    Transposed(u32),
}

pub(crate) fn reduce_vertices(
    kernel: &KernelRequest,
    g: &GemmGeometry,
    (layout, split): (&ShardLayout, &crate::gemm::WorkerSplit),
    (c, d): (usize, usize),
    dst: ReduceDst,
    bias: Option<usize>,
) -> Vec<Vertex> {
    // A transposed result's vertices start on multiples of four rows,
    // where `reduce_f32` ACC=16 TR=1 stores four rows of a column at once,
    // unless that makes the largest vertex larger (the kernel's one-row
    // path then costs less than the extra rows: the fp8 SigLIP
    // attention's whole-K Q and V lost 564 cycles with aligned cuts).
    let parts = match dst {
        ReduceDst::Rows => split.reduce_parts(),
        ReduceDst::Transposed(_) => {
            let rows = |p: &[crate::gemm::ReducePart]| p.iter().map(|x| x.1 .1 - x.1 .0).max();
            let any = split.reduce_parts();
            let aligned = split.reduce_parts_aligned(crate::TRANSPOSED_REDUCE_ROW_ALIGN);
            if aligned.len() == any.len() && rows(&aligned) <= rows(&any) {
                aligned
            } else {
                any
            }
        }
    };
    parts
        .into_iter()
        .map(|(gi, (lr0, lr1), (cg0, cg1))| Vertex {
            kernel: std::sync::Arc::new(kernel.clone()),
            state: vec![
                StateWord::Addr {
                    buffer: c,
                    offset: layout.c_row(0, gi as u32, lr0) + cg0 * 16 * g.out_bytes(),
                },
                StateWord::Const(layout.section()),
                StateWord::Const(split.k_groups.len() as u32),
                StateWord::Const(layout.rs_c),
                match dst {
                    ReduceDst::Rows => StateWord::Addr {
                        buffer: d,
                        offset: lr0 * layout.rs_d() + cg0 * 16 * g.result_bytes(),
                    },
                    ReduceDst::Transposed(rs_t) => StateWord::Addr {
                        buffer: d,
                        offset: cg0 * 16 * rs_t + lr0 * g.result_bytes(),
                    },
                },
                StateWord::Const(match dst {
                    ReduceDst::Rows => layout.rs_d(),
                    ReduceDst::Transposed(rs_t) => rs_t,
                }),
                StateWord::Const(lr1 - lr0),
                StateWord::Const(4 * (cg1 - cg0)),
                match bias {
                    Some(b) => StateWord::Addr {
                        buffer: b,
                        offset: cg0 * g.bias_block_bytes(),
                    },
                    None => StateWord::Const(0),
                },
            ],
        })
        .collect()
}

/// The verifier after `lower`: state words and placements refer to existing
/// buffers and stay inside them; GEMM states have the kernel's word count;
/// every host tensor's placements cover its bytes (outputs exactly once).
pub fn verify(l: &Lowered) -> Result<(), String> {
    for call in &l.calls {
        for (&step, &of) in &call.reruns {
            let (Some(s), Some(o)) = (call.steps.get(step), call.steps.get(of)) else {
                return Err(format!(
                    "call `{}`: step {step} reruns step {of}, and the call has {} steps",
                    call.name,
                    call.steps.len()
                ));
            };
            let same_exchange = match (&s.exchange, &o.exchange) {
                (Some(a), Some(b)) => {
                    a.table_buffers == b.table_buffers && Arc::ptr_eq(&a.tables, &b.tables)
                }
                (None, None) => true,
                _ => false,
            };
            let same_tiles = Arc::ptr_eq(&s.tiles, &o.tiles) || s.tiles == o.tiles;
            if of >= step || call.reruns.contains_key(&of) || !same_tiles || !same_exchange {
                return Err(format!(
                    "call `{}`: step {step} (`{}`) is not a rerun of the earlier step {of} (`{}`)",
                    call.name, s.phase, o.phase
                ));
            }
        }
        let mut after = 0;
        for lp in &call.loops {
            let end = lp.start + lp.period * lp.count as usize;
            let ends_with_exchange = lp.period > 0
                && call
                    .steps
                    .get(lp.start + lp.period - 1)
                    .is_some_and(|s| s.exchange.is_some());
            if lp.start < after || end > call.steps.len() || lp.count == 0 || !ends_with_exchange {
                return Err(format!(
                    "call `{}`: loop of steps {}..{end} ({} periods of {}) overlaps another, leaves the call or does not end with an exchange",
                    call.name, lp.start, lp.count, lp.period
                ));
            }
            // A later period runs what its first period runs (which may
            // itself rerun an earlier loop's steps).
            let runs = |i: usize| call.reruns.get(&i).copied().unwrap_or(i);
            for i in lp.start + lp.period..end {
                let first = lp.start + (i - lp.start) % lp.period;
                if !call.reruns.contains_key(&i) || runs(i) != runs(first) {
                    return Err(format!(
                        "call `{}`: step {i} of a loop is not a rerun of step {first} of its first period",
                        call.name
                    ));
                }
            }
            after = end;
        }
    }
    for call in &l.calls {
        // A rerun runs the vertices of the step it reruns, checked there.
        for step in call.first_runs() {
            for (tile, vertices) in step.tiles.iter() {
                let bufs = l
                    .buffers
                    .get(tile)
                    .ok_or_else(|| format!("step `{}`: tile {tile} has no buffers", step.phase))?;
                if vertices.len() > ipu_arch::WORKER_CONTEXTS as usize {
                    return Err(format!(
                        "step `{}`: tile {tile} starts {} vertices, more than the {} workers",
                        step.phase,
                        vertices.len(),
                        ipu_arch::WORKER_CONTEXTS
                    ));
                }
                for v in vertices {
                    if v.kernel.entry == "gemm_f16" && v.state.len() != GEMM_STATE_WORDS {
                        return Err(format!(
                            "step `{}`: tile {tile}: gemm state has {} words",
                            step.phase,
                            v.state.len()
                        ));
                    }
                    for w in &v.state {
                        if let StateWord::Addr { buffer, offset } = *w {
                            let b = bufs.get(buffer).ok_or_else(|| format!("step `{}`: tile {tile}: state names buffer {buffer}, which does not exist", step.phase))?;
                            if offset >= b.bytes {
                                return Err(format!("step `{}`: tile {tile}: state address {offset} is outside buffer `{}` ({} bytes)", step.phase, b.name, b.bytes));
                            }
                        }
                    }
                }
            }
        }
    }
    for call in &l.calls {
        for step in call.first_runs() {
            let Some(x) = &step.exchange else { continue };
            for t in x.transfers.iter() {
                for r in std::iter::once(&t.source).chain(&t.destinations) {
                    let b = l
                        .buffers
                        .get(&r.tile)
                        .and_then(|b| b.get(r.buffer))
                        .ok_or_else(|| {
                            format!(
                                "step `{}`: a transfer names buffer {} of tile {}, which does not exist",
                                step.phase, r.buffer, r.tile
                            )
                        })?;
                    if r.offset as u64 + t.bytes as u64 > b.bytes as u64 {
                        return Err(format!(
                            "step `{}`: transfer bytes {}..+{} leave buffer `{}` on tile {}",
                            step.phase, r.offset, t.bytes, b.name, r.tile
                        ));
                    }
                }
            }
            if x.tiles != l.tile_count {
                return Err(format!(
                    "step `{}`: exchange among {} tiles, the program has {}",
                    step.phase, x.tiles, l.tile_count
                ));
            }
        }
    }
    for call in &l.calls {
        let stops = call.steps.iter().filter(|s| s.host_stop).count() as u32;
        if let Some(s) = call
            .steps
            .iter()
            .find(|s| s.host_stop && (!s.tiles.is_empty() || s.exchange.is_some()))
        {
            return Err(format!(
                "call `{}`: host stop `{}` runs vertices or an exchange",
                call.name, s.phase
            ));
        }
        if let Some((stop, t)) = call
            .streamed
            .iter()
            .find(|(stop, _)| !(1..=stops).contains(stop))
        {
            return Err(format!(
                "call `{}`: `{}` is written at host stop {stop} of {stops}",
                call.name, t.name
            ));
        }
    }
    let resident: (Vec<HostTensor>, Vec<HostTensor>) = (Vec::new(), l.resident.clone());
    let streamed: Vec<(Vec<HostTensor>, Vec<HostTensor>)> = l
        .calls
        .iter()
        .map(|c| {
            (
                c.streamed.iter().map(|(_, t)| t.clone()).collect(),
                Vec::new(),
            )
        })
        .collect();
    for (ins, outs) in
        l.io.iter()
            .chain(std::iter::once(&resident))
            .chain(&streamed)
    {
        for (t, exactly_once) in ins
            .iter()
            .map(|t| (t, false))
            .chain(outs.iter().map(|t| (t, true)))
        {
            let total = t.ty.bytes();
            let mut spans = Vec::new();
            for p in &t.placements {
                let b = l
                    .buffers
                    .get(&p.tile)
                    .and_then(|b| b.get(p.buffer))
                    .ok_or_else(|| {
                        format!(
                            "tensor `{}`: placement on tile {} names a missing buffer",
                            t.name, p.tile
                        )
                    })?;
                if p.buffer_offset as u64 + p.bytes as u64 > b.bytes as u64 {
                    return Err(format!(
                        "tensor `{}`: placement {}..+{} leaves buffer `{}` on tile {}",
                        t.name, p.buffer_offset, p.bytes, b.name, p.tile
                    ));
                }
                spans.push((p.host_offset, p.host_offset + p.bytes as u64));
            }
            spans.sort_unstable();
            let mut covered = 0;
            for (s, e) in spans {
                if s > covered || (exactly_once && s < covered) {
                    return Err(format!(
                        "tensor `{}`: host bytes near {s} are {}",
                        t.name,
                        if s > covered {
                            "not placed"
                        } else {
                            "placed twice"
                        }
                    ));
                }
                covered = covered.max(e);
            }
            if covered != total {
                return Err(format!(
                    "tensor `{}`: {covered} of {total} bytes placed",
                    t.name
                ));
            }
        }
    }
    Ok(())
}

/// The dtype of a GEMM's result decides the kernel specialisation.
pub fn gemm_acc32(result: DType) -> bool {
    result == DType::F32
}
