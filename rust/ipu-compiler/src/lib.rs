//! The ipu-stack graph compiler: a `.ipug` model to an `.ipupkg` package.
//!
//! [`compile`] is the one driver. It runs the phases in order, one module
//! each, with a tracing span per phase that ends with the seed's line
//! `package build phase finished phase=... elapsed_ms=... success=true`, and
//! a verifier between phases (Cranelift style) that rejects an invalid
//! intermediate result before the next phase consumes it:
//!
//! 1. [`load`]: parse and verify the graph; [`legalize`]: the device graph
//!    (rank-2 GEMMs with untransposed operands) and where its host tensors
//!    sit in the model's. [`widen`]: fp8 GEMMs that must not accumulate in
//!    f16 read their operands cast to f16.
//! 2. [`segment`]: a model that is more than one pattern is cut into
//!    segments; phases 3 to 6 then run per segment (`plan_segments`).
//! 3. [`fuse`]: GEMM groups and attention blocks; refuse what cannot be
//!    lowered, naming the value. `plan_attention` ([`attention::plan`]):
//!    attention candidates.
//! 4. [`plan`]: candidate plans per operation, cost model, Pareto beam, finalists.
//! 5. [`map_tiles`]: shards to physical tiles (verified: one shard per tile).
//! 6. [`lower`]: buffers, vertex calls, exchange steps and host placements
//!    per tile (verified: references inside buffers, tensors covered); each
//!    exchange step is scheduled here by `ipu-exchange` ([`exchange`]).
//! 7. `join` ([`segment::join`]): the segments' programs on all tiles with an
//!    exchange step before each; `loop` ([`loops::unroll`]): a `repeat`
//!    block as a device loop; [`param_copies`]: parameters held more than
//!    once copied on the device from the one copy the host writes.
//! 8. [`storage`] (`place_storage`): addresses (independently validated);
//!    every exchange step's tables, moved to the placed addresses, pass
//!    `ipu_exchange::check` before any code is emitted from them.
//! 9. [`emit`] (`emit_code`): the supervisor program per tile.
//! 10. [`link`]: tile program + kernel objects -> tile image (validated);
//!     then [`launches::settle_launches`] costs each step's launches.
//! 11. [`package`] (`write_package`): manifest, images and members, written atomically.
//!
//! docs/ARCHITECTURE.md ("ipu-compiler") lists the phases with their
//! verifiers and the invariants; docs/compiler.md has the design.
//!
//! Invariants: the same model, options and kernels give byte-identical
//! packages (ordered collections only); user errors are [`CompileError`]s
//! naming the file, value, tile or kernel at fault, never panics.
//!
//! API boundary: [`compile`] with [`CompileOptions`]; the CLI (`ipu compile`)
//! and the Bazel rule call it. Kernels come from a Bazel library index or are
//! assembled on demand from `device/` ([`library::KernelSource`]).

pub mod attention;
pub mod attention_cols;
pub mod emit;
pub mod error;
pub mod exchange;
pub mod formula;
pub mod fuse;
pub mod gemm;
pub mod kernels;
pub mod launches;
pub mod legalize;
pub mod library;
pub mod link;
pub mod liveness;
pub mod load;
pub mod loops;
pub mod lower;
pub mod map_tiles;
pub mod package;
pub mod param_copies;
pub mod plan;
mod plan_attention;
mod plan_gemms;
pub mod rowwise;
pub mod segment;
pub mod storage;
pub mod stream;
pub mod transpose;
pub mod widen;

pub use error::CompileError;
pub use library::KernelSource;
pub use plan::SearchBudget;

use gemm::{FormulaCost, GemmGeometry};
use ipu_graph::analysis;
use library::{KernelLibrary, KernelRequest};
use rayon::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// What to compile and how.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The `.ipug` model.
    pub model: PathBuf,
    /// Tiles the package may use (1..=1472).
    pub tiles: u32,
    /// Where kernel objects come from.
    pub kernels: KernelSource,
    /// Planner limits.
    pub search: SearchBudget,
    /// Where to write the package; `None` keeps it in memory only.
    pub output: Option<PathBuf>,
    /// Accumulation precision of f16 GEMMs.
    pub accumulation: Accumulation,
    /// The attention layout to use; `None` lets the planner choose the
    /// faster estimate.
    pub attention_layout: Option<attention::AttentionLayout>,
    /// Whether row-layout plans of attention (f16 or f32) let P V
    /// accumulate into O without a merge step
    /// ([`attention::AttentionPlan::acc`]): `None` lets the planner choose
    /// (and compiles the other kind too after a retry chain);
    /// `Some(true)` takes only such row plans; `Some(false)` only plans
    /// with the merge.
    pub attention_accumulate: Option<bool>,
    /// How the host writes inputs that the program holds more than once.
    pub host_inputs: HostInputs,
    /// How a `repeat` block is compiled.
    pub repeat: RepeatLowering,
    /// Where a device loop finds each iteration's weights; `None` lets
    /// `compile` choose: weight stacks on the chip, or the host streams
    /// them when the stacks do not fit ([`loops::LoopWeights`]).
    pub loop_weights: Option<loops::LoopWeights>,
}

/// How `compile` lowers a model's `repeat` block ([`loops`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RepeatLowering {
    /// The body compiled once and run as a device loop: its code, vertex
    /// states and exchange tables placed once, each iteration's weights
    /// copied from a weight stack. A block that cannot loop (see
    /// [`loops::template`]), or a loop that finds no fit, is compiled
    /// iteration by iteration, and the report says why.
    #[default]
    Loop,
    /// Every iteration compiled and placed on its own, as the expanded
    /// graph reads.
    Expand,
}

/// How the host writes a model input that the program holds more than
/// once (a GEMM's A on every column part's tiles, the attention input on
/// every projection tile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostInputs {
    /// Once, into a home spread over all tiles (or the one copy a segment
    /// holds), copied to its readers by an exchange step at the start of
    /// the run, as if a previous layer had left it on the device: every
    /// input byte crosses the host link once and the copies count in the
    /// run's device cycles.
    #[default]
    Once,
    /// Once per copy, over the host link (32 GB/s for the whole chip): no
    /// exchange step, but the SigLIP attention's x crosses the link 216
    /// times, about 17 M host cycles for 0.12 M device cycles.
    Replicated,
}

impl CompileOptions {
    /// Options with the default search budget and accumulation, no output file.
    pub fn new(model: impl Into<PathBuf>, tiles: u32, kernels: KernelSource) -> CompileOptions {
        CompileOptions {
            model: model.into(),
            tiles,
            kernels,
            search: SearchBudget::default(),
            output: None,
            accumulation: Accumulation::Auto,
            attention_layout: None,
            attention_accumulate: None,
            host_inputs: HostInputs::Once,
            repeat: RepeatLowering::Loop,
            loop_weights: None,
        }
    }
}

/// How f16 GEMMs with an f16 result accumulate.
///
/// The AMP's f16 mode rounds its accumulators to f16 four times per 16
/// products (docs/isa.md), so the error of one long f16 accumulation grows
/// past the verification tolerance of docs/graph-format.md (for the SigLIP
/// constant check it drifts like the seed log's 1.0430). f32 accumulation
/// runs at half the MAC rate and adds a reduce step (which also sums the
/// partials when K is split over workers), but rounds to f16 once. The
/// middle way runs at the f16 rate: K cut into chains of at most
/// [`F16_CHAIN_MAX_BLOCKS`] blocks, one per worker K group, whose f16
/// partials the reduce step sums in f32 (docs/compiler.md, "Accumulation").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulation {
    /// f16 when K <= [`F16_ACCUMULATION_MAX_K`]; else f16 chains of at most
    /// [`F16_CHAIN_MAX_BLOCKS`] blocks summed in f32 when a whole-K plan
    /// can split K over enough workers; else f32.
    Auto,
    /// Always f16 (fastest; large K may fail verification).
    F16,
    /// Always f32.
    F32,
}

/// The longest reduction that [`Accumulation::Auto`] accumulates in one f16 chain.
pub const F16_ACCUMULATION_MAX_K: u32 = 64;

/// The longest f16 chain (in 16-row K blocks: 256 products) of
/// [`Accumulation::Auto`] for longer K. The rounding error of a chain of
/// `k` products grows like `u k`; cut into `K / k` chains summed in f32 it
/// is about `u sqrt(k K) / 5`, against the tolerance's `u K` (docs/compiler.md).
pub const F16_CHAIN_MAX_BLOCKS: u32 = 16;

/// The shortest chain worth its reduce step: below it (K < 256) Auto
/// accumulates in f32.
pub const F16_CHAIN_MIN_BLOCKS: u32 = 4;

/// The chain length, in blocks, that [`Accumulation::Auto`] allows for a
/// reduction of `k`: at most a quarter of K (so at least four chains, a
/// margin of `5 sqrt(K / k)` >= 10 against the tolerance) and at most
/// [`F16_CHAIN_MAX_BLOCKS`].
pub fn f16_chain_blocks(k: u32) -> u32 {
    (k.div_ceil(16) / 4).min(F16_CHAIN_MAX_BLOCKS)
}

/// The accumulation one GEMM gets (from [`Accumulation`] and its K).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AccumulationMode {
    /// One f16 chain per output (no K groups needed).
    F16,
    /// f16 chains of at most [`F16_CHAIN_MAX_BLOCKS`], summed in f32.
    F16Chains,
    F32,
}

/// One operation's planning outcome, as reported.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OperationReport {
    pub value: String,
    pub operation: String,
    /// [M, K, N].
    pub shape: [u32; 3],
    pub kernel: String,
    pub candidates: usize,
    pub chosen: plan::GemmPlan,
    pub finalists: Vec<plan::GemmPlan>,
}

/// The result of a compile.
pub struct CompileOutput {
    pub package: ipu_package::Package,
    /// The `report.json` member's value.
    pub report: serde_json::Value,
    /// Estimated cycles of the run call's compute (slowest tile, all steps).
    pub estimated_compute_cycles: u64,
    /// Estimated cycles of a whole run call (host I/O, sync, compute).
    pub estimated_run_cycles: u64,
    /// The generated supervisor program of each tile (assembly text).
    pub programs: BTreeMap<u32, String>,
}

/// The source file and specialisation of the GEMM vertex.
fn gemm_kernel(acc32: bool) -> KernelRequest {
    KernelRequest {
        entry: "gemm_f16".into(),
        source: "gemm_f16.S".into(),
        params: [("ACC".to_string(), if acc32 { 32 } else { 16 })]
            .into_iter()
            .collect(),
    }
}

/// The f32 GEMM vertex (`ampf32`: f32 operands, accumulation and result).
fn gemm_f32_kernel() -> KernelRequest {
    KernelRequest {
        entry: "gemm_f32".into(),
        source: "gemm_f32.S".into(),
        params: BTreeMap::new(),
    }
}

/// The fp8 GEMM vertex (f16 accumulation, run-time product scale).
fn gemm_fp8_kernel() -> KernelRequest {
    KernelRequest {
        entry: "gemm_fp8".into(),
        source: "gemm_fp8.S".into(),
        params: BTreeMap::new(),
    }
}

/// The vertex that sums f32 partials into an f16 (or f32) result.
pub(crate) fn reduce_kernel(f16_result: bool, epilogue: i64) -> KernelRequest {
    KernelRequest {
        entry: "reduce_f32".into(),
        source: "reduce_f32.S".into(),
        // IN is named although 32 is the default: the library also holds
        // IN=16 objects, and a request must match exactly one object.
        params: [
            ("EPI".to_string(), epilogue),
            ("IN".to_string(), 32),
            ("OUT".to_string(), if f16_result { 16 } else { 32 }),
        ]
        .into_iter()
        .collect(),
    }
}

/// The vertex that sums f16 partials (split-K over tiles of an
/// f16-accumulated GEMM, or the one partial of a GEMM with an epilogue)
/// into an f16 result with the epilogue; also the row-wise add, bias and
/// GELU kernel ([`rowwise`]).
pub(crate) fn reduce_kernel_f16_partials(epilogue: i64) -> KernelRequest {
    KernelRequest {
        entry: "reduce_f32".into(),
        source: "reduce_f32.S".into(),
        params: [
            // ACC and TR are named because the library also holds the
            // f16-sum (ACC=16) and transposed-result (TR=1) objects, which
            // would otherwise match this request too.
            ("ACC".to_string(), 32),
            ("EPI".to_string(), epilogue),
            ("IN".to_string(), 16),
            ("OUT".to_string(), 16),
            ("TR".to_string(), 0),
            // PAIRS=1 (two partials per load, ACC=16 EPI=0 only) and
            // OWN=1 (partial 0 at its own address, ACC=16 TR=1) are
            // requested for streamed gathers alone (`own_request`).
            ("PAIRS".to_string(), 0),
            ("OWN".to_string(), 0),
        ]
        .into_iter()
        .collect(),
    }
}

/// The f16-sum request that reads partial 0 at its own address (state word
/// OWN) in place of `request`, for a streamed GEMM's reduce-scatter, which
/// then leaves each tile's own piece where its GEMM wrote it: for the plain
/// f16 sum, the object loading two partials per `ld2x64st64` (`reduce_f32`
/// ACC=16 PAIRS=1; the gathered partials sit 8 mod 16 bytes apart in
/// region 1, `stream::gather_section`, the result rows in region 0;
/// docs/kernels.md, "Two partials per load"), and for the transposed f16
/// sum its OWN=1 twin (ACC=16 TR=1 OWN=1). `None` for any other reduce.
fn own_request(request: &KernelRequest) -> Option<KernelRequest> {
    let sum = reduce_kernel_f16_sum();
    let transposed_sum = transposed_reduce_request(&sum)?;
    let key = if *request == sum {
        "PAIRS"
    } else if *request == transposed_sum {
        "OWN"
    } else {
        return None;
    };
    let mut own = request.clone();
    own.params.insert(key.into(), 1);
    Some(own)
}

/// The fill kernel (`fill64`: ranges of 8-byte items, each with its own
/// pair of words) that zeroes what a step must find zero each run.
pub(crate) fn fill64_request() -> KernelRequest {
    KernelRequest {
        entry: "fill64".into(),
        source: "fill64.S".into(),
        params: BTreeMap::new(),
    }
}

/// The vertex that sums f16 partials in f16 (`reduce_f32` ACC=16, no
/// epilogue): for partials that are themselves f16 accumulations (bounded
/// chains, K parts of an f16-accumulated GEMM, fp8 GEMMs' worker groups),
/// whose P - 1 extra roundings at the sum's scale are few beside the
/// hundreds each chain made, at a quarter of the f32 sum's arithmetic
/// (docs/compiler.md, "Accumulation").
pub(crate) fn reduce_kernel_f16_sum() -> KernelRequest {
    let mut request = reduce_kernel_f16_partials(0);
    request.params.insert("ACC".into(), 16);
    request
}

/// The shortest sum (the reading GEMM's K: the producer's N) for which a
/// GELU that feeds a GEMM or a cast to fp8 runs in f16 arithmetic (up to
/// ~15 ulps off, [`reduce_request_f16_partials`]). The tolerance's
/// accumulation term grows like sqrt(K), so long sums absorb those errors
/// (the SigLIP MLPs' 4,304 with room: max error 0.052 against 0.078);
/// short ones do not, above all through a re-quantisation to fp8, where a
/// GELU value a few ulps off its reference flips to the next fp8 value
/// near a rounding boundary. Of 30 random fp8 and f16 MLPs that missed
/// or nearly missed the tolerance (hidden widths 35 to 400), 21 pass with
/// the f32 GELU below this width and f32 sums for short re-quantised
/// products, 9 without either.
pub const COARSE_GELU_MIN_READER_K: u32 = 1024;

/// The reduce request for f16 partials with `epilogue`: the f16 sum
/// (ACC=16) when the library has it for that epilogue and the epilogue
/// allows it, else the f32 sum. No epilogue and the bias add (EPI=1: one
/// f16 add, the rounding the graph's f16 sum already has) always allow
/// it; bias + GELU (EPI=2) computes the GELU in f16 arithmetic, up to ~15
/// ulps off where its exponential amplifies roundings (absolute error at
/// most 2.3e-3, docs/kernels.md), so only for a result whose readers are
/// coarser than that (`coarse_reader`): a GEMM, whose long sums average
/// such errors out, or a cast to fp8, whose step is 1/8 of the value; a
/// result the host reads keeps the f32 GELU.
pub(crate) fn reduce_request_f16_partials(
    library: &mut KernelLibrary,
    epilogue: i64,
    coarse_reader: bool,
) -> KernelRequest {
    let mut sum = reduce_kernel_f16_partials(epilogue);
    sum.params.insert("ACC".into(), 16);
    let allowed = match epilogue {
        0 | 1 => true,
        2 => coarse_reader,
        _ => false,
    };
    if allowed && kernel_formula(library, &sum, &["ROWS", "QUADS", "P"]).is_ok() {
        sum
    } else {
        reduce_kernel_f16_partials(epilogue)
    }
}

/// Row alignment of the transposed reduce's vertices (`reduce_f32` ACC=16
/// TR=1 stores blocks of four rows of a column with one `st64` from an
/// 8-aligned destination; docs/kernels.md).
pub(crate) const TRANSPOSED_REDUCE_ROW_ALIGN: u32 = 4;

/// The reduce request that stores `request`'s result transposed (TR=1),
/// for f16 partials without an epilogue or with the bias add (the column
/// attention layout's Q and V projections, biased in the ViT block); `None`
/// for other reduces. Whether the library holds that object is the
/// caller's question (`kernel_formula`): without it the result is
/// transposed on its tiles by `transpose_f16`.
fn transposed_reduce_request(request: &KernelRequest) -> Option<KernelRequest> {
    (request.params.get("IN") == Some(&16)
        && matches!(request.params.get("EPI"), Some(&0) | Some(&1)))
    .then(|| {
        let mut tr = request.clone();
        tr.params.insert("TR".into(), 1);
        tr
    })
}

/// Names the f16-sum object in the report (and the log) when `request`
/// sums f16 partials without an epilogue in f32 for want of it.
fn note_missing_f16_sum(
    library: &mut KernelLibrary,
    request: &KernelRequest,
    value: &str,
    would_help: &mut Vec<serde_json::Value>,
) {
    let sum = reduce_kernel_f16_sum();
    if request.params.get("IN") == Some(&16)
        && request.params.get("EPI") == Some(&0)
        && request.params.get("ACC") == Some(&32)
        && kernel_formula(library, &sum, &["ROWS", "QUADS", "P"]).is_err()
    {
        tracing::info!(
            value,
            kernel = %sum,
            "the kernel library lacks a specialisation that would help"
        );
        would_help.push(json!({
            "kernel": sum.to_string(),
            "value": value,
            "why": "sums the f16 partials in f16 (P + 1 issue slots per four outputs); without it they are summed in f32 (4P + 5)",
        }));
    }
}

/// A kernel's declared cycle formula, checked to evaluate with `vars`.
pub(crate) fn kernel_formula(
    library: &mut KernelLibrary,
    request: &KernelRequest,
    vars: &[&str],
) -> Result<FormulaCost, CompileError> {
    let kernel = library.get(request)?;
    let bad = |message: String| CompileError::KernelLibrary {
        path: PathBuf::from(&kernel.origin),
        message,
    };
    let formula = kernel.metadata.cycles.clone().ok_or_else(|| {
        bad(format!(
            "kernel {request} declares no cycle formula (.cycles)"
        ))
    })?;
    let probe: BTreeMap<&str, i64> = vars.iter().map(|v| (*v, 1)).collect();
    formula::evaluate(&formula, &probe)
        .map_err(|e| bad(format!("kernel {request}: cycle formula: {e}")))?;
    Ok(FormulaCost::new(formula))
}

/// Runs `f` inside the phase span and logs the seed's completion line.
fn phase<T>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, CompileError>,
) -> Result<T, CompileError> {
    let span = tracing::info_span!("ipu_compiler.package.phase", phase = name);
    let _enter = span.enter();
    let start = Instant::now();
    let result = f();
    let elapsed_ms = start.elapsed().as_millis() as u64;
    match &result {
        Ok(_) => tracing::info!(
            phase = name,
            elapsed_ms,
            success = true,
            "package build phase finished"
        ),
        Err(e) => {
            tracing::error!(phase = name, elapsed_ms, success = false, error = %e, "package build phase finished")
        }
    }
    result
}

fn verifier(phase: &'static str, r: Result<(), String>) -> Result<(), CompileError> {
    r.map_err(|message| CompileError::Verifier { phase, message })
}

/// The best combination of per-GEMM plans of a chain whose hand-offs are
/// exchange steps: the few best plans of each GEMM (at most 16
/// combinations), each combination charged its GEMMs' device cycles plus,
/// per hand-off, the exchange step that ipu-exchange schedules for that
/// mapping (the 600-cycle sync and the phase). Returns the total and, per
/// GEMM, the index of its plan in `fronts`; `None` when a GEMM has no plan.
fn plan_exchanged_chain(
    geometries: &[GemmGeometry],
    producers: &[Option<usize>],
    fronts: &[(Vec<plan::GemmPlan>, usize)],
) -> Result<Option<(u64, Vec<usize>)>, CompileError> {
    if fronts.iter().any(|f| f.0.is_empty()) {
        return Ok(None);
    }
    let per_group = (1..=4usize)
        .rev()
        .find(|k| k.pow(fronts.len() as u32) <= 16)
        .unwrap_or(1);
    let mut best: Option<(u64, Vec<usize>)> = None;
    let mut choice = vec![0usize; fronts.len()];
    loop {
        let plans: Vec<&plan::GemmPlan> =
            fronts.iter().zip(&choice).map(|(f, &i)| &f.0[i]).collect();
        let maps: Vec<Vec<map_tiles::ShardOnTile>> =
            plans.iter().map(|p| map_tiles::map_gemm(p)).collect();
        let tiles = maps.iter().flatten().map(|s| s.tile + 1).max().unwrap_or(1);
        let mut total: u64 = plans.iter().map(|p| p.estimate.compute_cycles).sum();
        for (c, p) in producers.iter().enumerate() {
            let Some(p) = *p else { continue };
            let transfers = exchange::handoff(
                (&geometries[p], plans[p], &maps[p]),
                (&geometries[c], plans[c], &maps[c]),
                |_| 0,
                |_| 1,
            );
            // The scheduler logs its `optimized physical exchange schedule`
            // line inside this span, so planning candidates are told apart
            // from the phases the package runs (logged under `lower`).
            let span = tracing::info_span!(
                "ipu_compiler.plan.exchange_candidate",
                consumer = c,
                plans = %format!("{choice:?}")
            );
            let _enter = span.enter();
            let x = exchange::schedule(tiles, transfers, c as u32)?;
            total += exchange::step_cycles(&x.figures);
        }
        if best.as_ref().is_none_or(|b| total < b.0) {
            best = Some((total, choice.clone()));
        }
        // The next combination (odometer order keeps the result deterministic).
        let mut i = 0;
        loop {
            if i == choice.len() {
                return Ok(best);
            }
            choice[i] += 1;
            if choice[i] < per_group.min(fronts[i].0.len()) {
                break;
            }
            choice[i] = 0;
            i += 1;
        }
    }
}

/// Memory budgets [`plan_joint_chain`] tries per GEMM, per row partition
/// (or per search): each is one byte below the previous plan's region-1
/// peak, so every try takes a smaller worker split or partition.
const JOINT_CHAIN_BUDGETS: usize = 32;

/// Combinations of plans whose hand-offs one exchange form of
/// [`plan_joint_chain`] schedules at most, fewest compute cycles first:
/// each schedule runs ipu-exchange, and the hand-off steps cost more than
/// a sync, so the first few combinations decide.
const JOINT_CHAIN_SCHEDULES: usize = 32;

/// A GEMM chain planned with region 1 shared by what each GEMM needs.
struct JointChain {
    /// The consumers' A arrives by exchange steps (else the GEMMs share
    /// rows and each result stays on its tiles as the next GEMM's A).
    exchange: bool,
    /// The GEMMs, with the costs their plans were made with (`lower`
    /// derives every shard's worker split from them again).
    planned: Vec<PlannedGemm>,
    plans: Vec<plan::GemmPlan>,
    /// Estimated device cycles: the GEMMs, and the hand-offs when exchanged.
    cycles: u64,
    candidates: usize,
}

/// The fallback of a GEMM chain (`setups` as the shared-rows search
/// planned them, `producers[i]` the GEMM whose result is GEMM i's A) when
/// neither candidate finds plans with each GEMM in an equal share of
/// region 1: the GEMMs share region 1 by what each needs instead. Tiny
/// chains on one or two tiles need it. A two-GEMM MLP, 79 x 132 -> 192 ->
/// GELU -> 60 on one tile: the producer alone needs 6 elements and its
/// weights, more than half of region 1, while the consumer needs 3 of the
/// 13. A chain of three GEMMs, 14 x 155 -> 164 -> 109 (+ bias) -> 68 on
/// one tile: each third of region 1 is 4.3 elements, and every GEMM's two
/// C buffers (and its A or result) take whole elements of their own, so
/// the first GEMM needs more than its third while the others need less.
///
/// Every GEMM is planned with memory budgets going down from all of
/// region 1, one plan at a time ([`budget_tries`]), its element-exclusive
/// buffers counted in whole elements as `storage::place` lays them out
/// beside the other GEMMs' ([`gemm::GemmCosts::whole_elements`]); the
/// combinations whose summed region-1 and standard peaks fit are ranked by
/// their summed compute cycles ([`joint_chain_choices`]). The sum of the
/// GEMMs' peaks is never below what storage places on any tile, since each
/// peak is its GEMM's largest shard. Both forms compete: shared rows (one
/// row partition, each producer's result in region 1 as its consumer's A)
/// and exchange hand-offs (each GEMM its own plan; the consumers own their
/// A buffers and the producers' results stay in standard memory), the
/// latter with its hand-off steps scheduled. The fewest estimated cycles
/// win. With no combination, the GEMMs with f32 fallbacks fall back and
/// the search runs again.
fn plan_joint_chain(
    setups: &[PlannedGemm],
    producers: &[Option<usize>],
    tiles: u32,
    search: &plan::SearchBudget,
) -> Result<Option<JointChain>, CompileError> {
    let region1 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
    let mut setups = setups.to_vec();
    let m = setups.first().map_or(0, |s| s.0.m);
    for attempt in 0..2 {
        if attempt == 1 {
            // Every GEMM with an f32 fallback falls back (no short circuit).
            let fell_back = setups
                .iter_mut()
                .map(use_f32_fallback)
                .filter(|&f| f)
                .count();
            if fell_back == 0 {
                break;
            }
        }
        let geometries: Vec<GemmGeometry> = setups.iter().map(|s| s.0).collect();
        let mut best: Option<JointChain> = None;
        let mut candidates = 0;
        for exchange in [false, true] {
            let mut planned = setups.clone();
            for (p, producer) in planned.iter_mut().zip(producers) {
                // Beside the other GEMMs, every element-exclusive buffer
                // takes whole elements: each GEMM's budget and peak count
                // them so, and the peaks add up.
                p.2.whole_elements = true;
                p.2.joint = None;
                if exchange {
                    // An exchange hand-off leaves a producer's result in
                    // standard memory (lower::PlannedGemm::result_in_place)
                    // and gives its consumer an A buffer of its own.
                    p.2.feeds_gemm = false;
                    p.2.owns_a |= producer.is_some();
                }
            }
            // Shared rows try every row partition (one column part); the
            // exchange form lets each GEMM search all of its partitions.
            let partitions: Vec<Option<u32>> = if exchange {
                vec![None]
            } else {
                (1..=m.min(tiles)).map(Some).collect()
            };
            for rp in partitions {
                let ladders: Vec<Vec<(plan::GemmPlan, u64)>> = planned
                    .iter_mut()
                    .map(|p| {
                        let g = p.0;
                        budget_tries(&mut p.2, |c| match rp {
                            Some(rp) => plan::evaluate(&g, rp, 1, c),
                            None => plan::search(&g, tiles, c, search).0.into_iter().next(),
                        })
                    })
                    .collect();
                candidates += ladders.iter().map(Vec::len).sum::<usize>();
                let choices = joint_chain_choices(&ladders, region1);
                let limit = if exchange { JOINT_CHAIN_SCHEDULES } else { 1 };
                for choice in choices.into_iter().take(limit) {
                    let plans: Vec<plan::GemmPlan> = choice
                        .iter()
                        .zip(&ladders)
                        .map(|(&i, ladder)| ladder[i].0.clone())
                        .collect();
                    let compute: u64 = plans.iter().map(|p| p.estimate.compute_cycles).sum();
                    // The choices come fewest compute cycles first, and a
                    // hand-off only adds to them.
                    if best.as_ref().is_some_and(|b| b.cycles <= compute) {
                        break;
                    }
                    let cycles = if exchange {
                        let fronts: Vec<PlanFront> =
                            plans.iter().map(|p| (vec![p.clone()], 1)).collect();
                        match plan_exchanged_chain(&geometries, producers, &fronts)? {
                            Some((c, _)) => c,
                            None => continue,
                        }
                    } else {
                        compute
                    };
                    if best.as_ref().is_some_and(|b| b.cycles <= cycles) {
                        continue;
                    }
                    // Each GEMM keeps the budget its plan was made with, so
                    // that `lower` derives the same worker splits.
                    let mut chosen = planned.clone();
                    for ((p, &i), ladder) in chosen.iter_mut().zip(&choice).zip(&ladders) {
                        p.2.memory_budget = ladder[i].1;
                    }
                    best = Some(JointChain {
                        exchange,
                        planned: chosen,
                        plans,
                        cycles,
                        candidates: 0,
                    });
                }
            }
        }
        if let Some(mut b) = best {
            b.candidates = candidates;
            return Ok(Some(b));
        }
    }
    Ok(None)
}

/// The combinations of one plan per GEMM (an index into each GEMM's
/// `ladders`) whose region-1 peaks sum to at most `region1` and whose
/// standard peaks fit [`plan::STANDARD_BUDGET`], fewest summed compute
/// cycles first. A combination that needs no less of either memory than a
/// faster one is left out, which keeps the count small for long chains.
fn joint_chain_choices(ladders: &[Vec<(plan::GemmPlan, u64)>], region1: u64) -> Vec<Vec<usize>> {
    // (compute cycles, region-1 bytes, standard bytes, choice)
    let mut states: Vec<(u64, u64, u64, Vec<usize>)> = vec![(0, 0, 0, Vec::new())];
    for ladder in ladders {
        let mut next = Vec::new();
        for (compute, r1, r0, choice) in &states {
            for (i, (p, _)) in ladder.iter().enumerate() {
                let e = &p.estimate;
                let (r1, r0) = (r1 + e.peak_interleaved_bytes, r0 + e.peak_standard_bytes);
                if r1 <= region1 && r0 <= plan::STANDARD_BUDGET {
                    let mut choice = choice.clone();
                    choice.push(i);
                    next.push((compute + e.compute_cycles, r1, r0, choice));
                }
            }
        }
        next.sort();
        let mut kept: Vec<(u64, u64, u64, Vec<usize>)> = Vec::new();
        for s in next {
            if !kept.iter().any(|k| k.1 <= s.1 && k.2 <= s.2) {
                kept.push(s);
            }
        }
        states = kept;
    }
    states.into_iter().map(|s| s.3).collect()
}

/// The plans `plan_for` makes of one GEMM with memory budgets going down
/// from all of region 1, each with the budget it was made with: each
/// budget is one byte below the previous plan's region-1 peak, so that
/// every plan takes a smaller worker split or partition than the one
/// before (at most [`JOINT_CHAIN_BUDGETS`]).
fn budget_tries(
    costs: &mut gemm::GemmCosts,
    mut plan_for: impl FnMut(&mut gemm::GemmCosts) -> Option<plan::GemmPlan>,
) -> Vec<(plan::GemmPlan, u64)> {
    let mut tries = Vec::new();
    let mut budget = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
    for _ in 0..JOINT_CHAIN_BUDGETS {
        costs.memory_budget = budget;
        let Some(p) = plan_for(costs) else {
            break;
        };
        budget = p.estimate.peak_interleaved_bytes.saturating_sub(1);
        tries.push((p, costs.memory_budget));
    }
    tries
}

/// The run call's device cycles on the program's own structure: a compute
/// step advances only the tiles it runs on (tiles never wait for each other
/// between compute sets), an exchange step first syncs every tile. A
/// compute step advances each tile by that tile's own estimate where its
/// producer costed tiles one by one (`Step::tile_estimate`), else by its
/// slowest tile's (GEMM steps their plan's compute); exchange steps carry
/// their schedule's.
fn timeline_cycles(l: &lower::Lowered) -> u64 {
    let mut clock = vec![0u64; l.tile_count as usize];
    let run = l.calls.iter().filter(|c| c.name == "run");
    // The call's dispatch and end, where no step's estimate holds them.
    clock.fill(run.clone().map(launches::unsettled_dispatch_cycles).sum());
    for step in run.flat_map(|c| &c.steps) {
        if step.ends_bsp_step() {
            let start = clock.iter().copied().max().unwrap_or(0);
            clock.fill(start + step.estimated_cycles);
        } else {
            for &tile in step.tiles.keys() {
                clock[tile as usize] += step.tile_estimate(tile);
            }
        }
    }
    clock.into_iter().max().unwrap_or(0)
}

/// Region-1 bytes the projections of a segment with attention leave to the
/// buffers that outlive the segment: the other segments' weights and the
/// values segments pass on, which are placed only when the segments are
/// joined. Without it the projections' f16 chains take the fastest plan of
/// all of region 1 (124-row A shards, 286 KB a tile, on the ViT block) and
/// the join overflows even with every weight streamed; with three
/// interleaved elements left they keep 13 x 36 shards (ViT block 504,479
/// -> 465,281 simulated cycles). The other segments plan with all of it.
const SEGMENT_ATTENTION_REGION1_RESERVE: u64 = 96 * 1024;

/// What planning and lowering one segment (or the whole graph) produced.
pub(crate) struct SegmentLowered {
    pub lowered: lower::Lowered,
    pub tile_count: u32,
    pub operation_reports: Vec<OperationReport>,
    pub would_help: Vec<serde_json::Value>,
    pub chain_choice: Option<serde_json::Value>,
    /// The attention plan's report entry, when the graph has attention.
    pub attention: Option<serde_json::Value>,
    /// With a loop template, the body's steps in the run call
    /// ([`loops::body_steps`]).
    pub loop_body: Option<std::ops::Range<usize>>,
}

/// One GEMM's setup for planning: geometry, kernel requests (product,
/// reduce), cost formulas, value name, and the f32-accumulation setup to
/// fall back to when its bounded f16 chains find no plan.
type PlannedGemm = (
    GemmGeometry,
    (KernelRequest, Option<KernelRequest>),
    gemm::GemmCosts,
    String,
    Option<GemmSetup>,
    // Under Auto, an f32 GEMM's f16 setup for streamed plans with at
    // least four K parts (each K part one f16 chain).
    Option<GemmSetup>,
);
/// A GEMM's plans, best first, and how many candidates its search made.
type PlanFront = (Vec<plan::GemmPlan>, usize);

type GemmSetup = (
    GemmGeometry,
    (KernelRequest, Option<KernelRequest>),
    gemm::GemmCosts,
);

/// Replaces a GEMM's bounded-f16-chain setup by its f32 fallback, keeping
/// the memory budgets and ownership the planning paths have set; false
/// when there is none.
fn use_f32_fallback(p: &mut PlannedGemm) -> bool {
    let Some((geometry, requests, mut costs)) = p.4.take() else {
        return false;
    };
    costs.memory_budget = p.2.memory_budget;
    costs.owns_a = p.2.owns_a;
    costs.persistent_budget = p.2.persistent_budget;
    tracing::info!(value = %p.3, "no plan splits K into short f16 chains; f32 accumulation");
    p.0 = geometry;
    p.1 = requests;
    p.2 = costs;
    true
}

/// The fewest K parts a streamed plan of `g` may have: a K part is one f16
/// chain on its tile, so bounded chains (`Accumulation::Auto`) need at
/// least four, each partial summed by the reduce (`stream::search`);
/// otherwise one, or two when the result must come from the reduce step's
/// rows (`split`: a chain's producer, an attention's projection).
fn stream_min_k_parts(g: &GemmGeometry, split: bool) -> u32 {
    if !g.acc32 && g.max_chain_blocks != u32::MAX {
        4
    } else if split {
        2
    } else {
        1
    }
}

/// The estimated cycles of whole-K projections side by side: the one copy
/// step of `x` (the tile that receives most) and then their compute steps
/// together (the slowest).
fn whole_k_projection_cycles(fronts: &[PlanFront]) -> u64 {
    let chosen = fronts.iter().filter_map(|f| f.0.first());
    let copy = chosen
        .clone()
        .map(|p| p.estimate.copy_cycles)
        .max()
        .unwrap_or(0);
    let compute = chosen
        .map(|p| p.estimate.compute_cycles - p.estimate.copy_cycles)
        .max()
        .unwrap_or(0);
    copy + compute
}

/// Streamed plans for an attention's projections on their tile shares,
/// K split over tiles (`stream::Fit::Phased`: their scratch in the
/// projections' phase, what outlives it within `left` bytes of region 1),
/// all with the same number of chunk steps so that their exchange steps
/// merge one by one (`stream::merge`); the step count whose slowest
/// projection is fastest. Returns the fronts (the chosen plan first) and
/// that slowest projection's estimate, or `None` when some projection has
/// no such plan.
fn streamed_projections(
    planned: &[PlannedGemm],
    shares: &[u32],
    (groups, left): (&[fuse::Group], u64),
    budget: &plan::SearchBudget,
) -> Option<(Vec<PlanFront>, u64)> {
    let fronts: Vec<PlanFront> = planned
        .iter()
        .zip(shares)
        .enumerate()
        .map(|(g, (p, &tiles))| {
            // (Its reduce formula is the one the attention layout takes:
            // Q and V transposed by the reduce, TR=1, in the columns.)
            let mut costs = p.2.clone();
            costs.persistent_budget = None;
            let min_k_parts = stream_min_k_parts(&p.0, true);
            stream::search_fit(
                &p.0,
                tiles,
                (true, groups[g].bias.is_some()),
                min_k_parts,
                stream::Fit::Phased { persistent: left },
                &mut costs,
                budget,
            )
        })
        .collect();
    let steps: std::collections::BTreeSet<u32> = fronts
        .iter()
        .flat_map(|f| f.0.iter().filter_map(|p| p.stream.map(|s| s.steps)))
        .collect();
    // A projection whose result its tiles transpose (the row layout's K^T,
    // staged odd heads' Q^T and V^T) pays that step after its reduce: a
    // tile transposes its row piece (its row part's rows over the K parts)
    // of its column part. The search weighs no transpose, so that the
    // projections keep like grids; the comparison with whole-K plans,
    // which weigh it, must.
    let mut transposes: Vec<Option<gemm::FormulaCost>> =
        planned.iter().map(|p| p.2.transpose.clone()).collect();
    let mut transpose_cycles = |g: usize, p: &plan::GemmPlan| -> u64 {
        let (Some(formula), Some(s)) = (transposes[g].as_mut(), p.stream) else {
            return 0;
        };
        let geometry = &planned[g].0;
        let piece = geometry.m.div_ceil(p.row_parts).div_ceil(s.k_parts);
        let width = (geometry.ncb().div_ceil(p.col_parts) * 16).min(geometry.n);
        let (vertices, slowest) = attention::transpose_shard_slowest(formula, piece, width);
        slowest + attention::launch_cycles(vertices)
    };
    let mut best: Option<(u32, u64)> = None;
    for &n in &steps {
        let slowest = fronts
            .iter()
            .enumerate()
            .map(|(g, f)| {
                f.0.iter()
                    .find(|p| p.stream.is_some_and(|s| s.steps == n))
                    .map(|p| p.estimate.compute_cycles + transpose_cycles(g, p))
            })
            .collect::<Option<Vec<u64>>>()
            .and_then(|c| c.into_iter().max());
        if let Some(c) = slowest {
            if best.is_none_or(|b| c < b.1) {
                best = Some((n, c));
            }
        }
    }
    let (n, cycles) = best?;
    let fronts = fronts
        .into_iter()
        .map(|(plans, generated)| {
            let same: Vec<plan::GemmPlan> = plans
                .into_iter()
                .filter(|p| p.stream.is_some_and(|s| s.steps == n))
                .collect();
            (same, generated)
        })
        .collect();
    Some((fronts, cycles))
}

/// Phases `fuse` to `lower` of a graph of GEMM groups and attention blocks
/// (the whole model, or one segment of it: [`segment`]). With
/// `tile_count_override`, the program spans that many tiles whatever the
/// plans use, so that segments lowered apart can be joined.
fn plan_and_lower(
    graph: &ipu_graph::Graph,
    options: &CompileOptions,
    library: &mut KernelLibrary,
    tile_count_override: Option<u32>,
    context: SegmentContext,
) -> Result<SegmentLowered, CompileError> {
    let SegmentContext {
        limits,
        requantised,
        sole_block_segment,
        weights_joined,
        weight_caps,
        device_inputs,
    } = context;
    let weights_moved = weights_joined && weight_caps.is_none();
    // A segment's streamed plans without resident B ([`compile`]'s retry).
    let homes_only;
    let options = if tile_count_override.is_some() && !limits.resident_b {
        homes_only = CompileOptions {
            search: plan::SearchBudget {
                stream_b_resident: Some(false),
                ..options.search
            },
            ..options.clone()
        };
        &homes_only
    } else {
        options
    };
    // Kernel specialisations the library lacks and a plan would use.
    let mut would_help: Vec<serde_json::Value> = Vec::new();
    let (groups, mut blocks) = phase("fuse", || {
        let groups = fuse::fuse(graph)?;
        let mut blocks = attention::recognise(graph, &groups)?;
        // Host operands of a model of one segment (whose host may write q
        // and v transposed) with more heads than tiles: odd heads are staged
        // as over projections (`AttentionBlock::host_staged`).
        for b in &mut blocks {
            b.host_staged =
                b.host.is_some() && tile_count_override.is_none() && b.heads > options.tiles;
        }
        Ok((groups, blocks))
    })?;
    // Whether each attention block's V carries a ones column decides its
    // online and merge kernels; then the first block's kernels and plans.
    plan_attention::choose_ones_columns(library, &mut blocks, options.attention_accumulate)?;
    let mut attention_kernels = match blocks.first() {
        Some(b) => Some(plan_attention::attention_kernels(
            graph,
            library,
            b,
            options.attention_accumulate,
            &mut would_help,
        )?),
        None => None,
    };
    // An attention block runs on the projections' tiles, after them.
    let mut attention_plan: Option<attention::AttentionPlan> = None;
    let mut attention_candidates: Vec<attention::AttentionPlan> = Vec::new();
    if let (Some(b), Some(k)) = (blocks.first(), attention_kernels.as_mut()) {
        attention_candidates = phase("plan_attention", || {
            plan_attention::plan_attention(
                graph,
                options,
                &groups,
                b,
                k,
                tile_count_override,
                limits,
            )
        })?;
    }
    // Attention over host operands has no projections to plan: the
    // operands' homes and the attention take the tiles.
    if let Some(b) = blocks.first().filter(|b| b.host.is_some()) {
        let kernels = attention_kernels
            .as_mut()
            .expect("an attention block has its kernels");
        return lower_host_attention(
            graph,
            options,
            &groups,
            b,
            kernels,
            &attention_candidates,
            tile_count_override,
            would_help,
        );
    }
    // A chain (a GEMM reading an earlier group's result) is planned jointly:
    // one row partition, whole rows per tile, so no data crosses tiles.
    let chained = groups.iter().any(|g| matches!(g.a, fuse::Source::Group(_)));
    // In a model with attention, the groups (the projections) run side by
    // side on tiles of their own, each with all of region 1. So do the
    // independent GEMMs of a whole model or segment (the slices of a
    // batched GEMM, `legalize`; a segment's projections without attention)
    // when there are no more of them than tiles: on shared tiles each would
    // get a share of region 1, and every GEMM's element-exclusive buffers
    // take memory elements of their own (six 40 x 64 x 48 slices on 64
    // tiles overflowed region 1 that way, and a materialised SigLIP
    // attention's per-head projections found no plan in a third of it).
    // Otherwise every group spans the same tiles and gets an equal share.
    let independent_groups =
        blocks.is_empty() && !chained && groups.len() > 1 && groups.len() as u32 <= options.tiles;
    // With fewer tiles than projections an attention's projections share
    // the tiles, one after the other, each with a share of region 1.
    let shared_projections = !blocks.is_empty() && options.tiles < groups.len() as u32;
    let disjoint_groups = (!blocks.is_empty() && !shared_projections) || independent_groups;
    // Independent GEMMs on the same tiles (more batched slices than tiles)
    // keep all their buffers side by side for the whole program, each
    // slice's element-exclusive ones on memory elements of their own.
    let shares_tiles = !disjoint_groups && !chained && groups.len() > 1;
    // The projections of a segment with attention leave room for what
    // stays in region 1 across segments (see the constant); other
    // segments, and whole models, plan with all of it.
    let reserve = if tile_count_override.is_some() && disjoint_groups {
        SEGMENT_ATTENTION_REGION1_RESERVE.max(limits.region1_reserve)
    } else if tile_count_override.is_some() {
        limits.region1_reserve
    } else {
        0
    };
    let region1 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64 - reserve;
    let share = if disjoint_groups {
        region1
    } else {
        region1.saturating_sub(limits.shared_region1_cut) / groups.len().max(1) as u64
    };
    let group_tiles = if disjoint_groups {
        (options.tiles / groups.len().max(1) as u32).max(1)
    } else {
        options.tiles
    };
    let cx = plan_gemms::GemmContext {
        graph,
        options,
        groups: &groups,
        blocks: &blocks,
        tile_count_override,
        limits,
        requantised,
        device_inputs,
        sole_block_segment,
        weights_joined,
        weights_moved,
        weight_caps,
        region1,
        share,
        group_tiles,
        shares_tiles,
        shared_projections,
        chained,
    };
    // Plan every GEMM, in the shares of region 1 settled above.
    let mut operation_reports: Vec<OperationReport> = Vec::new();
    let mut planned: Vec<PlannedGemm> = Vec::new();
    // Per group: whether its A operand arrives by an exchange step.
    let mut a_by_exchange = vec![false; groups.len()];
    let mut chain_choice: Option<serde_json::Value> = None;
    phase("plan", || {
        planned = plan_gemms::setups(&cx, library)?;
        // Whether a chain's GEMMs were also planned sharing all of region 1
        // (plan_joint_chain), for the error when nothing fits.
        let mut joint_tried = false;
        let fronts = if chained {
            plan_gemms::chain_fronts(
                &cx,
                &mut planned,
                &mut a_by_exchange,
                &mut chain_choice,
                &mut joint_tried,
            )?
        } else if let Some(b) = blocks.first() {
            let (c, fronts) = plan_gemms::projection_fronts(
                &cx,
                library,
                b,
                &mut planned,
                attention_kernels.as_ref(),
                &attention_candidates,
            )?;
            attention_plan = Some(c);
            fronts
        } else {
            plan_gemms::independent_fronts(&cx, library, &mut planned, &mut would_help)
        };
        plan_gemms::operation_reports(&cx, library, &planned, fronts, joint_tried, &mut would_help)
    })
    .map(|reports| operation_reports.extend(reports))?;

    let maps = phase("map_tiles", || {
        let mut maps = Vec::new();
        for r in &operation_reports {
            let mut m = map_tiles::map_gemm(&r.chosen);
            if disjoint_groups {
                // Side by side: each group starts after the tiles of those
                // before it (their shares differ, plan::side_by_side_shares).
                let first = maps
                    .iter()
                    .flat_map(|m: &Vec<map_tiles::ShardOnTile>| m.iter().map(|s| s.tile + 1))
                    .max()
                    .unwrap_or(0);
                for s in m.iter_mut() {
                    s.tile += first;
                }
            }
            verifier("map_tiles", map_tiles::verify(&r.chosen, &m, options.tiles))?;
            maps.push(m);
        }
        Ok(maps)
    })?;
    let mut tile_count = maps
        .iter()
        .flat_map(|m| m.iter().map(|s| s.tile + 1))
        .max()
        .unwrap_or(1);
    // The attention runs on tiles 0.. after the projections (same tiles).
    if let Some(p) = &attention_plan {
        tile_count = tile_count.max(p.tiles);
    }
    if let Some(t) = tile_count_override {
        tile_count = t;
    }

    // In a model with attention the projections' scratch buffers need
    // their C headers zeroed each run (fill64, two 16-byte fills).
    // So do the GEMMs of a segment (crate::segment): their C buffers then
    // share memory with the other segments' buffers.
    let mut segment_fill = None;
    if attention_kernels.is_none() && tile_count_override.is_some() {
        let request = fill64_request();
        let formula = kernel_formula(library, &request, &["N", "COUNT"])?;
        segment_fill = Some((request, formula));
    }
    let scratch_fill = attention_kernels
        .as_mut()
        .map(|k| &mut k.fill)
        .or(segment_fill.as_mut())
        .map(|fill| {
            (
                fill.0.clone(),
                fill.1
                    .eval(&[("N", 2), ("COUNT", (2 * gemm::C_HEADER / 8) as i64)])
                    + attention::launch_cycles(1),
            )
        });
    // The column attention layout takes the Q and V projections' results
    // transposed straight from their reduce steps (`reduce_f32` TR=1) when
    // they sum f16 partials and the library has that specialisation; else
    // it transposes them on their tiles (`transpose_f16`).
    let mut transposed = vec![false; groups.len()];
    if let (Some(b), Some(p)) = (blocks.first(), &attention_plan) {
        if p.layout == attention::AttentionLayout::Columns {
            for g in [b.q, b.v] {
                let Some(tr) = planned[g].1 .1.as_ref().and_then(transposed_reduce_request) else {
                    continue;
                };
                if kernel_formula(library, &tr, &["ROWS", "QUADS", "P"]).is_ok() {
                    operation_reports[g].kernel = format!("{} + {tr}", planned[g].1 .0);
                    planned[g].1 .1 = Some(tr);
                    transposed[g] = true;
                }
            }
        }
    }
    // A streamed GEMM whose K parts' f16 partials are reduce-scattered may
    // sum them with the object that reads each tile's own piece where its
    // GEMM left it (`own_request`: two partials per load, `reduce_f32`
    // PAIRS=1, untransposed; OWN=1 transposed), tile by tile where its
    // formula beats the plain object's and the self-transfer it spares
    // (`lower::PlannedGemm::reduce_own`; 4096^3 GEMM 1,066,589 ->
    // 1,050,407 cycles). The plan was chosen with the plain formula and
    // the self-transfers, an upper bound.
    let owns: Vec<Option<(library::KernelRequest, gemm::FormulaCost)>> = planned
        .iter()
        .zip(&operation_reports)
        .map(|((geometry, (_, reduce), _, _, _, _), report)| {
            let streamed_parts = report.chosen.stream.is_some_and(|s| s.k_parts > 1);
            let request = reduce.as_ref().and_then(own_request)?;
            if !streamed_parts || geometry.acc32 {
                return None;
            }
            let formula = kernel_formula(library, &request, &["ROWS", "QUADS", "P"]).ok()?;
            Some((request, formula))
        })
        .collect();
    let lowered = phase("lower", || {
        let mut gemms: Vec<lower::PlannedGemm> = planned
            .iter_mut()
            .zip(&maps)
            .zip(&operation_reports)
            .zip(&groups)
            .map(
                |((((geometry, (request, reduce), costs, _, _, _), map), report), group)| {
                    lower::PlannedGemm {
                        group,
                        geometry: *geometry,
                        plan: &report.chosen,
                        map,
                        kernel: request.clone(),
                        reduce_kernel: reduce.clone(),
                        reduce_own: None,
                        costs,
                        a_by_exchange: false,
                        result_in_place: true,
                        scratch_fill: scratch_fill.clone(),
                        transposed_result: false,
                        side_by_side: disjoint_groups && report.chosen.stream.is_some(),
                        in_segment: tile_count_override.is_some(),
                    }
                },
            )
            .collect();
        for (((g, &x), &t), p) in gemms
            .iter_mut()
            .zip(&a_by_exchange)
            .zip(&transposed)
            .zip(&owns)
        {
            g.a_by_exchange = x;
            g.transposed_result = t;
            g.reduce_own = p.clone();
        }
        // A producer whose consumer receives its result by exchange keeps
        // the result in standard memory.
        for (c, group) in groups.iter().enumerate() {
            if let (fuse::Source::Group(p), true) = (group.a, a_by_exchange[c]) {
                gemms[p].result_in_place = false;
            }
        }
        let mut l = lower::lower(graph, tile_count, &mut gemms)?;
        if let (Some(b), Some(p), Some(k)) =
            (blocks.first(), &attention_plan, attention_kernels.as_mut())
        {
            let label = l.exchange_steps();
            attention::lower(graph, b, p, k, &mut l, label, tile_count_override.is_none())?;
        }
        verifier("lower", lower::verify(&l))?;
        Ok(l)
    })?;
    let attention = blocks
        .first()
        .zip(attention_plan.as_ref())
        .map(|(b, p)| attention_report(graph, b, p, &attention_candidates, options));
    Ok(SegmentLowered {
        loop_body: None,
        lowered,
        tile_count,
        operation_reports,
        would_help,
        chain_choice,
        attention,
    })
}

/// Plans and lowers a segment of attention over host operands: there are
/// no projections to plan, so the operands' homes
/// (`attention::host_homes`) and the attention take the tiles, with the
/// best of `attention_candidates` as ranked. `would_help` carries the
/// kernel specialisations planning found missing; there are no GEMMs to
/// report.
#[allow(clippy::too_many_arguments)]
fn lower_host_attention(
    graph: &ipu_graph::Graph,
    options: &CompileOptions,
    groups: &[fuse::Group],
    b: &attention::AttentionBlock,
    kernels: &mut attention::AttentionKernels,
    attention_candidates: &[attention::AttentionPlan],
    tile_count_override: Option<u32>,
    would_help: Vec<serde_json::Value>,
) -> Result<SegmentLowered, CompileError> {
    if let Some(g) = groups.first() {
        return Err(CompileError::Unsupported {
            value: graph.value(b.attention).name.clone(),
            operation: "attention".into(),
            reason: format!(
                "attention over inputs is lowered in a segment without GEMMs, and the GEMM `{}` shares its segment",
                graph.value(g.result()).name
            ),
        });
    }
    let c = attention_candidates
        .first()
        .cloned()
        .expect("plan_attention refuses a block without candidates");
    let tile_count = tile_count_override.unwrap_or(c.tiles);
    plan_attention::log_chosen(&c, None);
    let lowered = phase("lower", || {
        let mut buffers: BTreeMap<u32, Vec<lower::BufferSpec>> =
            (0..tile_count).map(|t| (t, Vec::new())).collect();
        let mut tensors = lower::HostTensors::default();
        // In a model of one segment the host writes what the layout
        // transposes (Q and V, or K) transposed, so no step transposes
        // it; a segment's inputs arrive by its join, which moves them
        // as placed, so there they are transposed on their homes.
        let transposed_roles = match (tile_count_override, c.layout) {
            (None, attention::AttentionLayout::Columns) => [true, false, true],
            (None, attention::AttentionLayout::Rows) if b.staged() => [true; 3],
            (None, attention::AttentionLayout::Rows) => [false, true, false],
            (Some(_), _) => [false; 3],
        };
        let (homes, transposed) = attention::host_homes(
            graph,
            b,
            tile_count,
            transposed_roles,
            &mut buffers,
            &mut tensors,
        )?;
        let mut l =
            lower::Lowered::two_calls(graph, tile_count, buffers, (vec![], vec![]), tensors);
        l.group_results = homes;
        l.transposed_host = transposed;
        attention::lower(
            graph,
            b,
            &c,
            kernels,
            &mut l,
            0,
            tile_count_override.is_none(),
        )?;
        verifier("lower", lower::verify(&l))?;
        Ok(l)
    })?;
    Ok(SegmentLowered {
        loop_body: None,
        lowered,
        tile_count,
        operation_reports: Vec::new(),
        would_help,
        chain_choice: None,
        attention: Some(attention_report(
            graph,
            b,
            &c,
            attention_candidates,
            options,
        )),
    })
}

/// The compile report's entry for an attention block: the chosen plan and
/// the retained finalists among its candidates.
fn attention_report(
    graph: &ipu_graph::Graph,
    block: &attention::AttentionBlock,
    chosen: &attention::AttentionPlan,
    candidates: &[attention::AttentionPlan],
    options: &CompileOptions,
) -> serde_json::Value {
    json!({
        "value": graph.value(block.attention).name.clone(),
        "chosen": chosen,
        "finalists": candidates.iter().take(options.search.finalists).collect::<Vec<_>>(),
        "candidates": candidates.len(),
    })
}

/// Phases `segment` to `lower`: a model that is one pattern of GEMM groups
/// and attention blocks is planned and lowered as a whole; any other is
/// split into segments ([`segment`]) that are lowered one by one on all
/// tiles and joined with exchange steps between them.
fn lower_segments(
    graph: &ipu_graph::Graph,
    options: &CompileOptions,
    library: &mut KernelLibrary,
    rowwise_reports: &mut Vec<serde_json::Value>,
    limits: SegmentLimits,
    template: Option<&loops::Template>,
) -> Result<SegmentLowered, CompileError> {
    let no_cuts = Default::default();
    let cuts = template.map_or(&no_cuts, |t| &t.cuts);
    let segments = phase("segment", || {
        segment::split(
            graph,
            limits.split_attention_projections,
            cuts,
            options.tiles,
            limits.share_one_tile,
        )
    })?;
    let input_homes = options.host_inputs == HostInputs::Once;
    if let [only] = segments.as_slice() {
        if only.kind == segment::Kind::Blocks {
            let context = SegmentContext {
                limits,
                requantised: &only.requantised,
                sole_block_segment: true,
                weights_joined: false,
                weight_caps: None,
                device_inputs: &only.device_inputs,
            };
            let mut r = plan_and_lower(graph, options, library, None, context)?;
            // Inputs held more than once are written once and copied by
            // an exchange step: the join of the one segment does that (and
            // moves a loop body's weights from their homes when asked).
            if input_homes && segment::holds_an_input_twice(&r.lowered) || limits.loop_weight_homes
            {
                let tiles = r.lowered.tile_count;
                let moves = if limits.loop_weight_homes {
                    segment::ParamMoves::Interleaved
                } else {
                    segment::ParamMoves::Resident
                };
                r.lowered = phase("join", || {
                    let l = segment::join(
                        graph,
                        &segments,
                        vec![r.lowered],
                        tiles,
                        moves,
                        input_homes,
                        None,
                    )?;
                    verifier("join", lower::verify(&l))?;
                    Ok(l)
                })?;
            }
            r.loop_body = template.map(|t| loops::body_steps(&r.lowered, &segments, t));
            return Ok(r);
        }
    }
    let block_segments = segments
        .iter()
        .filter(|s| s.kind == segment::Kind::Blocks)
        .count();
    // With several block segments the segments' weights usually cannot all
    // stay resident, and the join then moves each segment's weights from
    // their homes when it starts (`segment::join` with `stream_params`), so
    // the plans first weigh those moves (`weights_joined`). When the
    // weights of those plans might stay resident after all, the segments
    // are planned again without weight joins, and those plans are joined
    // with resident weights if that fits; otherwise the first plans are
    // joined with their weights moved, as they assumed. (With one block
    // segment the weights stay resident, as its plans assume.)
    let assume_joined = limits.weight_joins && block_segments > 1;
    let planned = plan_segments(&segments, options, library, limits, assume_joined, None)?;
    let lower_bound_exceeded = |p: &PlannedSegments| {
        let exceeded = segment::resident_weights_exceed(&p.parts);
        if let Some((tile, needed, available)) = exceeded {
            tracing::info!(
                tile,
                needed,
                available,
                "these plans' weights cannot stay resident beside the largest segment's buffers (region 1 bytes, a lower bound)"
            );
        }
        exceeded.is_some()
    };
    // The plans to try with resident weights, in order, and the plans
    // whose weights move when none of those fits. Plans that weighed
    // their weight joins are tried resident too: their buffers are often
    // smaller (streamed projections), and a join that moves nothing costs
    // less than they assumed.
    let mut capped = None;
    // Whether `resident` starts with plans without weight joins that met
    // the lower bound (their join may still overflow).
    let mut again_first = false;
    let (resident, moved) = if limits.loop_weight_homes {
        (vec![], planned)
    } else if !assume_joined {
        (vec![planned.clone()], planned)
    } else if lower_bound_exceeded(&planned) {
        (vec![], planned)
    } else {
        tracing::info!("the segments' weights may stay resident; planning the segments again without weight joins");
        let again = plan_segments(&segments, options, library, limits, false, None)?;
        if lower_bound_exceeded(&again) {
            // The plans that weighed the weights' moves will keep their
            // weights resident, so a plan whose resident B is smaller won
            // by a move that never runs. Plans that weigh A's join alone,
            // each weight capped to its share of the room those plans
            // leave, are the other candidates of each segment (chosen
            // per segment in the join phase below).
            capped = plan_capped(&segments, options, library, limits, &planned);
        } else {
            again_first = true;
        }
        (vec![again, planned.clone()], planned)
    };
    let tiles = options.tiles;
    let (lowered, chosen) = phase("join", || {
        let fill = kernel_formula(library, &fill64_request(), &["N", "COUNT"])
            .ok()
            .map(|f| (fill64_request(), f));
        let join_with =
            |p: &PlannedSegments,
             moves: segment::ParamMoves,
             zero_fill: Option<&mut (library::KernelRequest, gemm::FormulaCost)>| {
                segment::join(
                    graph,
                    &segments,
                    p.parts.clone(),
                    tiles,
                    moves,
                    input_homes,
                    zero_fill,
                )
            };
        // Buffers that need zeros live for the whole program: when the
        // joined program overflows a tile, each segment zeroes its own at
        // its start instead, so that they share memory with the other
        // segments' (the packages that fit keep their zeros from load
        // time, and their cycles; a materialised attention's every segment
        // kept its padded operands on tile 0, where the projections'
        // weights then did not fit). Returns the program that fits, or the
        // first join with its overflow.
        let join_fitting =
            |p: &PlannedSegments,
             moves: segment::ParamMoves|
             -> Result<(lower::Lowered, Option<CompileError>), CompileError> {
                let l = join_with(p, moves, None)?;
                let Some(overflow) = segment::first_overflow(&l) else {
                    return Ok((l, None));
                };
                if let Some(mut f) = fill.clone() {
                    let refilled = join_with(p, moves, Some(&mut f))?;
                    if segment::first_overflow(&refilled).is_none() {
                        tracing::info!(
                            %overflow,
                            "the segments zero their buffers' padding at their start, so that those buffers share memory"
                        );
                        return Ok((refilled, None));
                    }
                }
                Ok((l, Some(overflow)))
            };
        let join_resident = |p: &PlannedSegments| -> Result<Option<lower::Lowered>, CompileError> {
            if lower_bound_exceeded(p) {
                return Ok(None);
            }
            match join_fitting(p, segment::ParamMoves::Resident)? {
                (l, None) => Ok(Some(l)),
                (_, Some(e)) => {
                    tracing::info!(overflow = %e, "the segments' weights do not fit side by side");
                    Ok(None)
                }
            }
        };
        // Per block segment, the capped plans replace the others' where
        // the joined program's estimate says they are faster and it fits
        // (greedily, in segment order: a segment's plans change its joins
        // with its neighbours).
        let mix_capped = |capped: &PlannedSegments| -> Result<Option<(lower::Lowered, PlannedSegments)>, CompileError> {
            let Some(l) = join_resident(&moved)? else {
                return Ok(None);
            };
            let mut best = (timeline_cycles(&l), l, moved.clone());
            for (i, s) in segments.iter().enumerate() {
                if s.kind != segment::Kind::Blocks {
                    continue;
                }
                let mixed = best.2.with_segment_of(capped, i);
                if let Some(l) = join_resident(&mixed)? {
                    let cycles = timeline_cycles(&l);
                    tracing::info!(
                        segment = i,
                        estimated_cycles = cycles,
                        best = best.0,
                        "segment planned weighing only A's join, within its weights' caps"
                    );
                    if cycles < best.0 {
                        best = (cycles, l, mixed);
                    }
                }
            }
            verifier("join", lower::verify(&best.1))?;
            Ok(Some((best.1, best.2)))
        };
        if let Some(capped) = &capped {
            if let Some(r) = mix_capped(capped)? {
                return Ok(r);
            }
        }
        // Every segment's weights stay where its plan put them when that
        // fits beside the other segments; otherwise each weight has one
        // copy spread over all tiles and moves to its segment's tiles when
        // the segment starts. A lower bound on the resident weights' bytes
        // settles most models without the resident join, which schedules
        // every exchange step before its overflow shows. (With capped
        // plans the others were tried above: the plans without weight
        // joins missed the bound, and the weight-moving ones did not fit.)
        for (i, r) in resident
            .into_iter()
            .filter(|_| capped.is_none())
            .enumerate()
        {
            let again = i == 0 && again_first;
            if let Some(l) = join_resident(&r)? {
                // The plans without weight joins fit with resident
                // weights; so may the first plans, which weighed weight
                // moves that then never run. The joined estimates decide
                // (ties keep the plans without weight joins): the BERT-large
                // causal layer's first plans stream its projections, and
                // those without weight joins copy x whole to them, 38,597
                // cycles of exchange: 111,842 -> 87,970 simulated cycles.
                if again {
                    if let Some(first) = join_resident(&moved)? {
                        let (again_cycles, first_cycles) =
                            (timeline_cycles(&l), timeline_cycles(&first));
                        tracing::info!(
                            without_weight_joins = again_cycles,
                            weighing_weight_joins = first_cycles,
                            "both plans fit with resident weights; the faster by the joined estimate"
                        );
                        if first_cycles < again_cycles {
                            verifier("join", lower::verify(&first))?;
                            return Ok((first, moved.clone()));
                        }
                    }
                }
                verifier("join", lower::verify(&l))?;
                return Ok((l, r));
            }
            // The plans without weight joins met the lower bound but do
            // not fit side by side (the GPT-2 block: region 1 of tile 0 by
            // 9,216 bytes): the capped plans are the other candidates
            // here too, as when those plans miss the bound (GPT-2 block
            // 236,020 -> 229,240 cycles, its compile 11.0 -> 13.2 s).
            // `mix_capped` joins the first plans with resident weights
            // first: when that does not fit, the next candidate (the same
            // plans) would not either.
            if again {
                if let Some(c) = plan_capped(&segments, options, library, limits, &moved) {
                    match mix_capped(&c)? {
                        Some(r) => return Ok(r),
                        None => break,
                    }
                }
            }
        }
        tracing::info!("streaming the segments' weights from their homes");
        let moves = if limits.loop_weight_homes {
            segment::ParamMoves::Interleaved
        } else {
            segment::ParamMoves::Unzeroed
        };
        // One that still overflows is placed anyway: storage reports the
        // tile, the bytes and the largest consumers.
        let (l, _) = join_fitting(&moved, moves)?;
        verifier("join", lower::verify(&l))?;
        Ok((l, moved))
    })?;
    let mut operation_reports = Vec::new();
    let mut would_help = Vec::new();
    let (mut chain_choice, mut attention) = (None, None);
    for r in chosen.reports {
        operation_reports.extend(r.operation_reports);
        would_help.extend(r.would_help);
        chain_choice = chain_choice.or(r.chain_choice);
        attention = attention.or(r.attention);
        rowwise_reports.extend(r.rowwise);
    }
    let loop_body = template.map(|t| loops::body_steps(&lowered, &segments, t));
    Ok(SegmentLowered {
        loop_body,
        lowered,
        tile_count: tiles,
        operation_reports,
        would_help,
        chain_choice,
        attention,
    })
}

/// What [`plan_segments`] returns: every segment's lowered part (in
/// order) and the reports of its plans.
#[derive(Clone)]
struct PlannedSegments {
    parts: Vec<lower::Lowered>,
    reports: Vec<SegmentReports>,
}

/// The reports of one segment's plans.
#[derive(Clone, Default)]
struct SegmentReports {
    operation_reports: Vec<OperationReport>,
    would_help: Vec<serde_json::Value>,
    chain_choice: Option<serde_json::Value>,
    attention: Option<serde_json::Value>,
    rowwise: Vec<serde_json::Value>,
}

impl PlannedSegments {
    /// These plans with segment `i`'s taken from `other`.
    fn with_segment_of(&self, other: &PlannedSegments, i: usize) -> PlannedSegments {
        let mut mixed = self.clone();
        mixed.parts[i] = other.parts[i].clone();
        mixed.reports[i] = other.reports[i].clone();
        mixed
    }
}

/// One segment's result in [`plan_segments`].
enum SegmentPart {
    Blocks(SegmentLowered),
    Rowwise(lower::Lowered, Vec<serde_json::Value>),
}

/// Plans and lowers every segment of a segmented model on all tiles
/// (`weights_joined`: the join will move the block segments' weights from
/// their homes, which their plans then weigh; with `weight_caps` the
/// plans weigh only A's join instead, each weight within its cap, for
/// weights that stay resident).
/// The segments planned again weighing A's joins alone, each weight capped
/// to its share of the room the plans `first` (which weighed the weights'
/// moves) leave (`segment::resident_weight_caps`); None, logged, when no
/// plan fits within the caps.
fn plan_capped(
    segments: &[segment::Segment],
    options: &CompileOptions,
    library: &mut KernelLibrary,
    limits: SegmentLimits,
    first: &PlannedSegments,
) -> Option<PlannedSegments> {
    let caps = segment::resident_weight_caps(&first.parts);
    tracing::info!(
        weights = caps.len(),
        "planning the segments again weighing only A's joins, each weight within its share of the room"
    );
    plan_segments(segments, options, library, limits, true, Some(&caps))
        .map_err(|e| tracing::info!(error = %e, "no plans within the caps"))
        .ok()
}

/// Plans and lowers every segment (the `plan_segments` phase: a segmented
/// model runs it up to three times, and its segments' own phases log
/// inside it).
fn plan_segments(
    segments: &[segment::Segment],
    options: &CompileOptions,
    library: &mut KernelLibrary,
    limits: SegmentLimits,
    weights_joined: bool,
    weight_caps: Option<&BTreeMap<String, u64>>,
) -> Result<PlannedSegments, CompileError> {
    phase("plan_segments", || {
        let tiles = options.tiles;
        let block_segments = segments
            .iter()
            .filter(|s| s.kind == segment::Kind::Blocks)
            .count();
        // The segments plan independently of one another (each sees only its
        // own graph and all tiles), so they are planned in parallel, each with
        // a fork of the kernel library; the results are taken in segment order,
        // so the package and the report are those of a sequential run, and the
        // first failing segment's error is the one returned.
        let parent = tracing::Span::current();
        let planned: Vec<Result<(SegmentPart, KernelLibrary), CompileError>> = segments
            .par_iter()
            .enumerate()
            .map(|(index, s)| {
                let mut library = library.fork();
                let outputs: Vec<&str> = s
                    .graph
                    .outputs()
                    .iter()
                    .map(|&v| s.graph.value(v).name.as_str())
                    .collect();
                let span = tracing::info_span!(
                    parent: &parent,
                    "ipu_compiler.segment",
                    segment = index,
                    kind = ?s.kind,
                    outputs = %outputs.join(",")
                );
                let _enter = span.enter();
                let part = match s.kind {
                    segment::Kind::Blocks => {
                        let context = SegmentContext {
                            limits,
                            requantised: &s.requantised,
                            sole_block_segment: block_segments == 1,
                            weights_joined,
                            weight_caps,
                            device_inputs: &s.device_inputs,
                        };
                        let r =
                            plan_and_lower(&s.graph, options, &mut library, Some(tiles), context)?;
                        SegmentPart::Blocks(r)
                    }
                    // Transposes are reported beside the row-wise
                    // operations: one entry per operation, with its kernel,
                    // tiles and estimate.
                    segment::Kind::Rowwise | segment::Kind::Transpose => {
                        let lower_segment = if s.kind == segment::Kind::Rowwise {
                            rowwise::lower
                        } else {
                            transpose::lower
                        };
                        let (l, reports) = phase("lower", || {
                            let (l, reports) = lower_segment(&s.graph, tiles, &mut library)?;
                            verifier("lower", lower::verify(&l))?;
                            Ok((l, reports))
                        })?;
                        SegmentPart::Rowwise(l, reports)
                    }
                };
                Ok((part, library))
            })
            .collect();
        let mut parts = Vec::new();
        let mut reports = Vec::new();
        for result in planned {
            let (part, fork) = result?;
            library.absorb(fork);
            match part {
                SegmentPart::Blocks(r) => {
                    parts.push(r.lowered);
                    reports.push(SegmentReports {
                        operation_reports: r.operation_reports,
                        would_help: r.would_help,
                        chain_choice: r.chain_choice,
                        attention: r.attention,
                        rowwise: Vec::new(),
                    });
                }
                SegmentPart::Rowwise(l, rowwise) => {
                    parts.push(l);
                    reports.push(SegmentReports {
                        rowwise,
                        ..Default::default()
                    });
                }
            }
        }
        Ok(PlannedSegments { parts, reports })
    })
}

/// Compiles `options.model` into a package (and writes it when `output` is set).
///
/// A segmented model's attention plans with at most half of region 0 for
/// its own buffers; the joins between segments put their exchange tables
/// in region 0 too, sized only once they are scheduled. When a tile's
/// region 0 then overflows, the model is compiled again with a quarter of
/// the attention's share (twice at most). The ViT block needed it while
/// its weight joins moved one transfer per weight row (~100 KB of tables
/// beside its 4-split plan's 45 KB of states on split 0).
///
/// A segment's chain may stream its producer (K split over tiles); its
/// plans see only the segment, so when region 1 overflows beside the other
/// segments' weights the model is compiled again with whole-K producers in
/// segments (once), and then, if it still overflows, with streamed GEMMs
/// in segments taking B from its homes instead of keeping it resident
/// (once; unless the options fix that choice).
///
/// When those are spent and region 1 overflowed by less than a tenth of
/// it, GEMMs that share their tiles plan again with the overflow taken off
/// the region they split (`SegmentLimits::shared_region1_cut`, twice at
/// most).
///
/// When all of that leaves a model that widened fp8 GEMMs for precision
/// ([`widen`]: under `accumulation=f32`, or short projections of attention
/// scores) without a fit, it is compiled once more with those GEMMs on
/// `gemm_fp8` (their f16 operand copies and the casts' segments take
/// memory that tiny tile counts lack).
///
/// The report names every such retry (`retries`: the tile, region and
/// bytes that overflowed and what the next attempt changed).
///
/// The package is written to `options.output` once, the one this returns:
/// attempts only validate theirs. (Until session 52 every successful
/// attempt wrote its package, so where `compile_from` compiled the
/// projections in segments too and kept the shared plan, the file held
/// the segmented package beside the shared one's report: 1,024 tokens of
/// 2 heads of 80 on 32 tiles ran 1,090,583 cycles from the file and
/// 1,016,888 as returned.)
pub fn compile(options: &CompileOptions) -> Result<CompileOutput, CompileError> {
    let attempts = CompileOptions {
        output: None,
        ..options.clone()
    };
    let out = compile_attempts(&attempts)?;
    if let Some(path) = &options.output {
        out.package.write(path).map_err(|e| CompileError::Package {
            message: e.to_string(),
        })?;
    }
    Ok(out)
}

/// [`compile`] without writing the package: every attempt and fallback.
fn compile_attempts(options: &CompileOptions) -> Result<CompileOutput, CompileError> {
    // Later planning passes, joins and retries reuse the schedules of the
    // phases they share with earlier ones (`exchange::memo`).
    let _schedules = exchange::memo::Scope::enter();
    let mut retries: Vec<serde_json::Value> = Vec::new();
    if options.repeat == RepeatLowering::Loop && has_repeat(options) {
        // Weight stacks with every fallback, then (when the options leave
        // the choice) the host streaming the weights, then the expansion.
        let streamed = CompileOptions {
            loop_weights: Some(loops::LoopWeights::Streamed),
            ..options.clone()
        };
        let attempts: Vec<(&CompileOptions, &str)> = if options.loop_weights.is_none() {
            vec![
                (options, "the host streams the loop's weights"),
                (
                    &streamed,
                    "the repeat block is compiled iteration by iteration",
                ),
            ]
        } else {
            vec![(
                options,
                "the repeat block is compiled iteration by iteration",
            )]
        };
        for (opts, then) in attempts {
            match compile_widening(opts, true, &mut retries) {
                Err(
                    e @ (CompileError::OutOfMemory { .. }
                    | CompileError::NoFeasiblePlan { .. }
                    | CompileError::Verifier { phase: "loop", .. }),
                ) => {
                    let why = json!({"error": e.to_string(), "then": then});
                    compiling_again(&mut retries, why);
                }
                r => return r,
            }
        }
    }
    let retried = |retries: &[serde_json::Value], error: CompileError| {
        if retries.is_empty() {
            error
        } else {
            CompileError::Retried {
                error: Box::new(error),
                attempts: retries.iter().map(attempt_line).collect(),
            }
        }
    };
    let (out, options) = match compile_widening(options, false, &mut retries) {
        Err(e @ (CompileError::OutOfMemory { .. } | CompileError::NoFeasiblePlan { .. }))
            if options.attention_accumulate.is_none() && has_attention(options) =>
        {
            let (out, forced, forced_retries) = compile_each_merge(options, e, &retries)?;
            retries = forced_retries;
            (out, forced)
        }
        r => (
            r.map_err(|error| retried(&retries, error))?,
            options.clone(),
        ),
    };
    let options = &options;
    // A retry chain after a region overflow narrows the plans by the
    // first attempt's best plan: a plan that accumulates P V into O (less
    // region 0, more region 1) or one with the merge (the reverse) leaves
    // the other kind little room, whatever it would have cost. Where the
    // options leave that choice, the model also compiles with the other
    // kind and the faster estimate is kept (f32 attention of 1,024 tokens
    // on 8 tiles: the inputs' homes overflowed region 0, and the chain
    // from the accumulating plan ended at three query rounds, 3,954,798
    // estimated cycles, where the merging plans' chain kept two,
    // 3,865,538; with the accumulating vertex's p first the three rounds
    // take 3,812,778 and are kept).
    let out = match options
        .attention_accumulate
        .is_none()
        .then(|| other_merge_after_retries(&out.report))
        .flatten()
    {
        None => out,
        Some(accumulate) => {
            let (forced, how) = merge_forced(options, accumulate);
            let why = "the chosen attention plan came out of a retry chain that the first attempt's plan narrowed";
            also_compile(out, &forced, &mut retries, why.into(), &how)
        }
    };
    // The attention candidates are ranked by their own estimates beside a
    // proxy for the projections, which are planned only for the chosen
    // plan. Where the other layout's best candidate is within
    // `LAYOUT_CLOSE_CALL_PERCENT` of it, the projections beside it may decide:
    // the model compiles again in that layout and the faster estimate is
    // kept (models/attention_stream_small on 64 tiles: its row plan,
    // 10,260 estimated cycles against the column plan's 10,432, took
    // projections of 18,620 cycles where the column plan's take 17,360,
    // and ran 30,045 cycles against 27,975).
    let Some(other) = options
        .attention_layout
        .is_none()
        .then(|| close_other_layout(&out.report))
        .flatten()
    else {
        return Ok(out);
    };
    let why = format!(
        "the best {} plan's estimate is within {}% of the chosen {} plan's",
        other.name(),
        LAYOUT_CLOSE_CALL_PERCENT,
        out.report["attention"]["chosen"]["layout"]
            .as_str()
            .unwrap_or("?")
    );
    let forced = CompileOptions {
        attention_layout: Some(other),
        ..options.clone()
    };
    let how = format!("attention_layout={}", other.name());
    Ok(also_compile(out, &forced, &mut retries, why, &how))
}

/// After a compile whose every attempt found no fit (`error`), where
/// the options leave open whether P V accumulates into O: the model
/// compiles once with each kind forced, and the faster that fits is kept
/// with its options (for the layout close call of [`compile_attempts`]).
/// The two kinds weigh region 0 and region 1 the other way round, and
/// every retry of the chain narrowed the plans by the first attempt's
/// choice (four batch entries of 2 heads of 40 over f32 inputs, 236
/// queries and 301 keys, on 4 tiles: every retry from the accumulating
/// plan overflowed region 0, and the merge's own chain fits). When
/// neither fits, the error is the first compile's, with every attempt
/// listed.
fn compile_each_merge(
    options: &CompileOptions,
    error: CompileError,
    retries: &[serde_json::Value],
) -> Result<(CompileOutput, CompileOptions, Vec<serde_json::Value>), CompileError> {
    let mut kept: Option<(CompileOutput, CompileOptions, Vec<serde_json::Value>)> = None;
    let mut all = retries.to_vec();
    for accumulate in [false, true] {
        let (forced, how) = merge_forced(options, accumulate);
        let why = json!({
            "error": error.to_string(),
            "then": format!("the model compiles again with {how}"),
        });
        let mut forced_retries = retries.to_vec();
        compiling_again(&mut forced_retries, why.clone());
        all.push(why);
        match compile_widening(&forced, false, &mut forced_retries) {
            Ok(out) => {
                if kept
                    .as_ref()
                    .is_none_or(|(k, ..)| out.estimated_run_cycles < k.estimated_run_cycles)
                {
                    tracing::info!(
                        alternative = how,
                        run_cycles = out.estimated_run_cycles,
                        "a compile with P V's kind forced fits"
                    );
                    kept = Some((out, forced, forced_retries));
                }
            }
            Err(e) => {
                tracing::info!(alternative = how, error = %e, "no fit with P V's kind forced either");
                all.extend(forced_retries.into_iter().skip(retries.len() + 1));
            }
        }
    }
    kept.ok_or_else(|| CompileError::Retried {
        error: Box::new(error),
        attempts: all.iter().map(attempt_line).collect(),
    })
}

/// `options` with P V's kind forced (accumulating into O, or merging),
/// and that option in words.
fn merge_forced(options: &CompileOptions, accumulate: bool) -> (CompileOptions, String) {
    let forced = CompileOptions {
        attention_accumulate: Some(accumulate),
        ..options.clone()
    };
    let how = format!("attention_merge={}", attention_merge_name(accumulate));
    (forced, how)
}

/// Whether the model holds an attention (so that the options' choice of
/// how P V reaches O matters to it).
fn has_attention(options: &CompileOptions) -> bool {
    load::load(&options.model).is_ok_and(|m| {
        m.graph
            .nodes()
            .iter()
            .any(|n| matches!(n.op, ipu_graph::Op::Attention { .. }))
    })
}

/// Compiles the model again under `forced` (the options of `how`, in
/// words) after `out`, recording `why` among the retries, and keeps the
/// faster estimated run; `retries` becomes the kept compile's. Either
/// way the kept package's report names the second compile.
fn also_compile(
    out: CompileOutput,
    forced: &CompileOptions,
    retries: &mut Vec<serde_json::Value>,
    why: String,
    how: &str,
) -> CompileOutput {
    let why = json!({
        "value": out.report["attention"]["value"],
        "error": why,
        "then": format!(
            "the model also compiles with {how} and the faster estimate is kept (this plan's run: {} cycles)",
            out.estimated_run_cycles
        ),
    });
    let mut other_retries = retries.clone();
    compiling_again(&mut other_retries, why.clone());
    let alternative = compile_widening(forced, false, &mut other_retries);
    let (mut kept, is_alternative) = keep_faster(out, alternative, how);
    if is_alternative {
        *retries = other_retries;
    } else {
        retries.push(why.clone());
        match kept.report["retries"].as_array_mut() {
            Some(r) => r.push(why),
            None => kept.report["retries"] = json!([why]),
        }
        kept.package
            .members
            .insert("report.json".to_string(), package::json_bytes(&kept.report));
    }
    kept
}

/// The faster estimated run of `out` and `alternative` (the same model
/// compiled another way, `how`), with a log line saying which is kept;
/// and whether that is the alternative.
fn keep_faster(
    out: CompileOutput,
    alternative: Result<CompileOutput, CompileError>,
    how: &str,
) -> (CompileOutput, bool) {
    match alternative {
        Ok(alt) if alt.estimated_run_cycles < out.estimated_run_cycles => {
            tracing::info!(
                alternative = how,
                alternative_run_cycles = alt.estimated_run_cycles,
                first_run_cycles = out.estimated_run_cycles,
                "kept the alternative compile"
            );
            (alt, true)
        }
        other => {
            tracing::info!(
                alternative = how,
                outcome = %match &other {
                    Ok(alt) => format!("{} run cycles", alt.estimated_run_cycles),
                    Err(e) => e.to_string(),
                },
                first_run_cycles = out.estimated_run_cycles,
                "kept the first compile"
            );
            (out, false)
        }
    }
}

/// Whether P V should accumulate into O (`Some(true)`) or merge
/// (`Some(false)`) in a second compile: the other kind than the chosen
/// row plan's, when the compile retried. The last attempt's finalists
/// need not hold that kind: its region limits came from the first
/// attempt's plan. (A library without the accumulating kernels fails the
/// second compile at planning, and the first is kept.)
fn other_merge_after_retries(report: &serde_json::Value) -> Option<bool> {
    let chosen = &report["attention"]["chosen"];
    let retried = report["retries"].as_array().is_some_and(|r| !r.is_empty());
    (retried && chosen["layout"] == attention::AttentionLayout::Rows.name())
        .then(|| !chosen["acc"].as_bool().unwrap_or(false))
}

/// The `attention_merge` option's value (`ipu compile --option`) that
/// forces [`CompileOptions::attention_accumulate`] to `Some(accumulate)`.
pub fn attention_merge_name(accumulate: bool) -> &'static str {
    if accumulate {
        "accumulate"
    } else {
        "merge"
    }
}

/// How close (percent of the chosen plan's estimate) the other layout's
/// best attention candidate must come for [`compile_attempts`] to compile
/// the model in that layout too.
const LAYOUT_CLOSE_CALL_PERCENT: u64 = 3;

/// The other attention layout, when the report's finalists hold a plan
/// of it whose estimate (compute and exchange) is within
/// [`LAYOUT_CLOSE_CALL_PERCENT`] of the chosen plan's.
fn close_other_layout(report: &serde_json::Value) -> Option<attention::AttentionLayout> {
    let a = &report["attention"];
    let total = |c: &serde_json::Value| {
        Some(c["compute_cycles"].as_u64()? + c["exchange_bound_cycles"].as_u64()?)
    };
    let chosen_layout = a["chosen"]["layout"].as_str()?;
    let chosen = total(&a["chosen"])?;
    let other = [
        attention::AttentionLayout::Rows,
        attention::AttentionLayout::Columns,
    ]
    .into_iter()
    .find(|l| l.name() == chosen_layout)?
    .other();
    let best_other = a["finalists"]
        .as_array()?
        .iter()
        .filter(|c| c["layout"] == other.name())
        .filter_map(total)
        .min()?;
    (best_other * 100 <= chosen * (100 + LAYOUT_CLOSE_CALL_PERCENT)).then_some(other)
}

/// Logs a retry of [`compile`] and records it for the report (and for
/// the error, should every attempt fail).
fn compiling_again(retries: &mut Vec<serde_json::Value>, why: serde_json::Value) {
    tracing::info!(%why, "compiling again");
    retries.push(why);
}

/// One retry of [`compile`] in words: what the attempt hit, then what the
/// next attempt changed.
fn attempt_line(why: &serde_json::Value) -> String {
    let hit = if let Some(e) = why["error"].as_str() {
        match why["value"].as_str() {
            Some(v) if !e.contains(&format!("`{v}`")) => format!("value `{v}`: {e}"),
            _ => e.to_string(),
        }
    } else if let (Some(tile), Some(region), Some(needed)) = (
        why["tile"].as_u64(),
        why["region"].as_str(),
        why["needed_bytes"].as_u64(),
    ) {
        format!("tile {tile}: {region} needs {needed} bytes")
    } else if let Some(after) = why["no_plan_after"].as_str() {
        format!(
            "value `{}`: no plan once {after}",
            why["value"].as_str().unwrap_or("?")
        )
    } else {
        why.to_string()
    };
    match why["then"].as_str() {
        Some(then) => format!("{hit}; then {then}"),
        None => hit,
    }
}

/// Kernels `tile` links, in request order; the supervisor runtime
/// (`emit::runtime_request`) is the one every tile links.
fn tile_kernels(l: &lower::Lowered, tile: u32) -> Vec<KernelRequest> {
    let mut v: Vec<&KernelRequest> = distinct_vertex_maps(l)
        .filter_map(|m| m.get(&tile))
        .flatten()
        .map(|v| &*v.kernel)
        .collect();
    let runtime = emit::runtime_request();
    v.push(&runtime);
    v.sort();
    v.dedup();
    v.into_iter().cloned().collect()
}

/// The steps' vertex maps, each once: a device loop's later iterations
/// share the first iteration's maps (`Arc`), and a deep loop has hundreds
/// of steps, so walking every step's vertices for every tile (and cloning
/// every vertex's request) took seconds where the distinct maps take
/// milliseconds.
fn distinct_vertex_maps(
    l: &lower::Lowered,
) -> impl Iterator<Item = &BTreeMap<u32, Vec<lower::Vertex>>> {
    let mut seen = std::collections::HashSet::new();
    l.calls
        .iter()
        .flat_map(|c| &c.steps)
        .filter(move |s| seen.insert(std::sync::Arc::as_ptr(&s.tiles)))
        .map(|s| &*s.tiles)
}

/// Every kernel some tile of `l` links (the supervisor runtime included),
/// each once.
fn linked_requests(l: &lower::Lowered) -> std::collections::BTreeSet<KernelRequest> {
    let mut requests: std::collections::BTreeSet<KernelRequest> = distinct_vertex_maps(l)
        .flat_map(|m| m.values())
        .flatten()
        .map(|v| &*v.kernel)
        .collect::<std::collections::BTreeSet<&KernelRequest>>()
        .into_iter()
        .cloned()
        .collect();
    requests.insert(emit::runtime_request());
    requests
}

/// Loads every kernel any tile of `l` links, once, so that the per-tile
/// work after it (on all cores) only reads the library.
pub(crate) fn load_tile_kernels(
    l: &lower::Lowered,
    library: &mut KernelLibrary,
) -> Result<(), CompileError> {
    for r in linked_requests(l) {
        library.get(&r)?;
    }
    Ok(())
}

/// Bytes of `tile`'s code and vertex states, by a dry-run link with every
/// buffer at address 0 (their size does not depend on the addresses); the
/// tile's kernels must be loaded ([`load_tile_kernels`]). `phase` names
/// the phase a program the emitter rejects is reported for.
pub(crate) fn dry_run_code_bytes(
    l: &lower::Lowered,
    tile: u32,
    library: &KernelLibrary,
    sizes: &link::CodeSizes,
    phase: &'static str,
) -> Result<u32, CompileError> {
    let dummy = storage::TileStorage {
        tile,
        code_end: 0,
        addresses: vec![0; l.buffers[&tile].len()],
    };
    let text = emit::tile_program(l, tile, &dummy)
        .map_err(|message| CompileError::Verifier { phase, message })?;
    sizes.get(tile, &text, &loaded_kernels(library, l, tile))
}

/// The loaded objects of [`tile_kernels`] (all loaded before storage).
fn loaded_kernels<'a>(
    library: &'a KernelLibrary,
    l: &lower::Lowered,
    tile: u32,
) -> Vec<&'a library::LoadedKernel> {
    tile_kernels(l, tile)
        .iter()
        .map(|r| {
            library
                .loaded(r)
                .expect("every tile's kernels were loaded before storage")
        })
        .collect()
}

/// Bytes of one slot of the weight stacks on `tile`, of a loop whose
/// stacks hold `stacked` iterations (0 when the tile has none).
fn stack_slots(l: &lower::Lowered, tile: u32, stacked: usize) -> u64 {
    l.buffers.get(&tile).map_or(0, |bufs| {
        bufs.iter()
            .filter(|b| b.category == "loop_weights" && b.name.ends_with(".stack"))
            .map(|b| b.bytes as u64)
            .sum::<u64>()
            / stacked.max(1) as u64
    })
}

/// By tile, the buffers that hold a value the run leaves on the device
/// without returning it (`Lowered::resident`: what checkpoints.json names
/// for diagnosis).
fn value_holders(l: &lower::Lowered) -> BTreeMap<u32, std::collections::BTreeSet<usize>> {
    let mut out: BTreeMap<u32, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for p in l.resident.iter().flat_map(|t| &t.placements) {
        out.entry(p.tile).or_default().insert(p.buffer);
    }
    out
}

/// `placed` unless a buffer of `holders` shares its memory with a buffer
/// of a later segment or phase, which would leave the value it holds
/// overwritten at the end of the run: then the tile placed again with
/// those buffers apart (as if live for the whole program), when it has
/// room, so that checkpoints.json can name the value for diagnosis (a
/// batched chain's per-slice intermediate on few tiles had no checkpoint,
/// and the compositional check could not test the GEMM after it).
fn keep_values_intact(
    placed: storage::TileStorage,
    bufs: &[lower::BufferSpec],
    code_bytes: u32,
    holders: Option<&std::collections::BTreeSet<usize>>,
) -> storage::TileStorage {
    let Some(holders) = holders else {
        return placed;
    };
    let lost = package::overwritten_on_tile(bufs, &placed.addresses);
    let reused: Vec<usize> = holders.iter().copied().filter(|&b| lost[b]).collect();
    if reused.is_empty() {
        return placed;
    }
    let mut apart = bufs.to_vec();
    for b in reused {
        apart[b].lifetime = None;
        apart[b].scratch = None;
    }
    storage::place(placed.tile, &apart, code_bytes).unwrap_or(placed)
}

/// Whether `options.model` has a `repeat` block (false when it does not
/// load: its compile reports why).
fn has_repeat(options: &CompileOptions) -> bool {
    load::load(&options.model).is_ok_and(|m| !m.repeats.is_empty())
}

/// [`compile`] with the device loop on or off.
fn compile_widening(
    options: &CompileOptions,
    device_loop: bool,
    retries: &mut Vec<serde_json::Value>,
) -> Result<CompileOutput, CompileError> {
    match compile_with_fallbacks(options, true, device_loop, retries) {
        Err(e @ (CompileError::OutOfMemory { .. } | CompileError::NoFeasiblePlan { .. }))
            if optional_widening(options) =>
        {
            let why = json!({
                "error": e.to_string(),
                "then": "fp8 GEMMs widened for precision stay on gemm_fp8",
            });
            compiling_again(retries, why);
            compile_with_fallbacks(options, false, device_loop, retries)
        }
        r => r,
    }
}

/// [`compile`]'s attempts with `widen_for_precision` fixed.
fn compile_with_fallbacks(
    options: &CompileOptions,
    widen_for_precision: bool,
    device_loop: bool,
    retries: &mut Vec<serde_json::Value>,
) -> Result<CompileOutput, CompileError> {
    let streamed = options.loop_weights == Some(loops::LoopWeights::Streamed);
    let b_free = options.search.stream_b_resident.is_none();
    let mut limits = SegmentLimits {
        attention_region0: plan::STANDARD_BUDGET / 2,
        region1_reserve: 0,
        first_region0_overflow: None,
        overflow_slack: 0,
        streamed_producers: true,
        resident_b: true,
        weight_joins: true,
        shared_region1_cut: 0,
        widen_for_precision,
        split_attention_projections: false,
        device_loop,
        // Streamed weights cross the host link, which moves a thirtieth of
        // what the exchange moves in a cycle: one copy of each weight, in
        // its homes, and the joins move them on the chip.
        loop_weight_homes: streamed,
        loop_weights: options.loop_weights.unwrap_or_default(),
        share_one_tile: true,
    };
    if streamed && b_free {
        limits.resident_b = false;
    }
    compile_from(options, limits, retries)
}

/// The fewest cycles by which an attention's projections, planned on the
/// tiles its plan leaves, must exceed its candidates' assumption before
/// the model with the projections in segments of their own is compiled
/// too (`AttentionPlan::projections_planned_over`).
const PROJECTIONS_OVER_ASSUMPTION_MIN: u64 = 10_000;

/// [`compile_with_fallbacks`]'s attempts from `limits` on.
fn compile_from(
    options: &CompileOptions,
    mut limits: SegmentLimits,
    retries: &mut Vec<serde_json::Value>,
) -> Result<CompileOutput, CompileError> {
    let b_free = options.search.stream_b_resident.is_none();
    // Region 1's fallbacks, in order: whole-K chain producers in segments
    // (what the ViT block on 1400 tiles needs), then streamed producers
    // again but B from its homes (1100 and 1200 tiles, where whole-K
    // producers find no plan), then both. B's fallbacks only when the
    // options leave that choice to the compiler.
    let fallbacks: Vec<(bool, bool, &str)> = [
        (false, true, "chain producers in segments keep K whole"),
        (
            true,
            false,
            "streamed GEMMs in segments take B from its homes, not resident",
        ),
        (
            false,
            false,
            "both: whole-K chain producers, B from its homes",
        ),
    ]
    .into_iter()
    .filter(|&(_, resident_b, _)| resident_b || b_free)
    .collect();
    let mut fallback = 0;
    // The first region-0 overflow of a segment's attention (bytes), and
    // how often region 1's reserve for it has grown.
    let mut region0_overflow: Option<u64> = None;
    let mut reserve_steps = 0;
    let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
    loop {
        match compile_with(options, limits, retries) {
            // The attention's projections, planned on the tiles its plan
            // leaves, took more than twice the cycles its candidates
            // assumed: the model with the projections in segments of their
            // own may run faster. Both compile and the faster estimate
            // wins; the segmented compile's report names this retry.
            Ok(out)
                if !limits.split_attention_projections
                    && out.report["attention"]["chosen"]
                        .get("projections_planned_over")
                        .is_some() =>
            {
                let chosen = &out.report["attention"]["chosen"];
                let why = json!({
                    "value": out.report["attention"]["value"],
                    "error": format!(
                        "the projections beside the attention's plan take an estimated {} cycles, where its candidates assumed {}",
                        chosen["projections_planned_over"], chosen["projection_cycles"]
                    ),
                    "then": format!(
                        "the attention and its projections also plan as segments of their own, and the faster estimate is kept (this plan's run: {} cycles)",
                        out.estimated_run_cycles
                    ),
                });
                let mut segmented_retries = retries.clone();
                compiling_again(&mut segmented_retries, why);
                let mut segmented = limits;
                segmented.split_attention_projections = true;
                let (kept, segments) = keep_faster(
                    out,
                    compile_from(options, segmented, &mut segmented_retries),
                    "the attention and its projections in segments of their own",
                );
                if segments {
                    *retries = segmented_retries;
                }
                return Ok(kept);
            }
            // Cutting the attention's region 0 left it no plan: region 0
            // overflowed with buffers that outlive its segment (weight
            // homes, the values segments pass on). Every segment then
            // leaves the overflow free in region 1, in whole memory
            // elements, where storage moves the anywhere buffers that
            // region 0 cannot hold; the attention plans with its region 0
            // as at first (more rounds of fewer heads where its buffers
            // filled region 1).
            Err(CompileError::NoFeasiblePlan { value, reason })
                if limits.region1_reserve == 0
                    && region0_overflow.is_some()
                    && limits.attention_region0 < plan::STANDARD_BUDGET / 2 =>
            {
                let over = region0_overflow.expect("checked");
                limits.attention_region0 = plan::STANDARD_BUDGET / 2;
                limits.region1_reserve = over.div_ceil(element) * element;
                limits.first_region0_overflow = Some(over);
                reserve_steps = 1;
                let why = json!({
                    "value": value,
                    "error": reason,
                    "then": format!(
                        "every segment leaves {} bytes of region 1 for region 0's overflow ({over} bytes), the attention its region 0 as at first (alone in its model, it leaves only what its own region 0 pushes out)",
                        limits.region1_reserve
                    ),
                });
                compiling_again(retries, why);
            }
            // With a reserve, region 0 still overflowing grows it (twice
            // at most) rather than cutting the attention's region 0, and
            // every attention plan leaves that much more of it free.
            Err(CompileError::OutOfMemory {
                tile,
                region,
                needed,
                available,
                ..
            }) if region.starts_with("region 0")
                && limits.region1_reserve > 0
                && reserve_steps < 3 =>
            {
                let grown = (needed - available).div_ceil(element) * element;
                limits.region1_reserve += grown;
                limits.overflow_slack += grown;
                reserve_steps += 1;
                let why = json!({
                    "tile": tile,
                    "region": region,
                    "needed_bytes": needed,
                    "then": format!("every segment leaves {} bytes of region 1 for region 0's overflow", limits.region1_reserve),
                });
                compiling_again(retries, why);
            }
            // A reserve sized by the first attempt's best plan leaves
            // room only to plans that push out no more region 0 than it:
            // when none of those fits, the reserve grows by an element
            // (within the same three steps), which plans of more region 0
            // may take. 1,024 tokens of 2 heads of 64 over inputs on 4
            // tiles ranked first a plan whose P V accumulates into O
            // (less region 0, more region 1) and found nothing within its
            // overflow's three elements; the plan of four elements runs.
            Err(CompileError::NoFeasiblePlan { value, reason })
                if limits.region1_reserve > 0 && reserve_steps < 3 =>
            {
                limits.region1_reserve += element;
                reserve_steps += 1;
                let why = json!({
                    "value": value,
                    "error": reason,
                    "then": format!("every segment leaves {} bytes of region 1 for region 0's overflow", limits.region1_reserve),
                });
                compiling_again(retries, why);
            }
            // GEMMs sharing one tile that find no plan or room there run
            // in segments of their own instead, the GEMMs of a chain too
            // (`segment::split` without `share_one_tile`).
            Err(e @ (CompileError::OutOfMemory { .. } | CompileError::NoFeasiblePlan { .. }))
                if limits.share_one_tile && shares_one_tile(options) =>
            {
                limits.share_one_tile = false;
                let why = json!({
                    "error": e.to_string(),
                    "then": "the GEMMs run in segments of their own, not sharing the tile (a chain's GEMMs too)",
                });
                compiling_again(retries, why);
            }
            // A loop's weight stacks hold every iteration's copy of the
            // buffers the host writes: when they do not fit beside
            // resident weights, the body's weights move from one-copy
            // homes (whose stacks are a share of the weights per tile).
            Err(e @ CompileError::OutOfMemory { .. })
                if limits.device_loop && !limits.loop_weight_homes =>
            {
                limits.loop_weight_homes = true;
                // Streamed GEMMs' B likewise (a resident B keeps the
                // zeros of its padding from load time, so the join does
                // not move it, and its stack would hold every copy).
                if b_free {
                    limits.resident_b = false;
                }
                let why = json!({
                    "error": e.to_string(),
                    "then": match limits.loop_weights {
                        loops::LoopWeights::Stacked => "the loop's weights move from their homes, whose copies the weight stacks hold",
                        loops::LoopWeights::Streamed => "the loop's weights move from their homes, which the host writes",
                    },
                });
                compiling_again(retries, why);
            }
            // No attention plan leaves the projections room: they go to a
            // segment of their own, and the attention reads q, k and v
            // from it as device inputs.
            Err(CompileError::NoFeasiblePlan { value, reason })
                if !limits.split_attention_projections
                    && reason.contains("leaves tiles on which the projections fit") =>
            {
                limits.split_attention_projections = true;
                let why = json!({
                    "value": value,
                    "error": reason,
                    "then": "the attention and its projections plan as segments of their own",
                });
                compiling_again(retries, why);
            }
            // Plans that weigh their joins' weight moves hold other buffers
            // than those that assume resident weights (the streamed
            // projections' homes, for one): when they do not fit, the
            // model is compiled as before that weighing, with the
            // fallbacks below.
            Err(e @ (CompileError::OutOfMemory { .. } | CompileError::NoFeasiblePlan { .. }))
                if limits.weight_joins && several_block_segments(options) =>
            {
                limits.weight_joins = false;
                let why = json!({
                    "error": e.to_string(),
                    "then": "the segments plan as if their weights stayed resident",
                });
                compiling_again(retries, why);
            }
            Err(CompileError::OutOfMemory {
                tile,
                region,
                needed,
                available,
                ..
            }) if region.starts_with("region 0")
                && limits.region1_reserve == 0
                && limits.attention_region0 > plan::STANDARD_BUDGET / 16 =>
            {
                region0_overflow.get_or_insert(needed - available);
                limits.attention_region0 /= 4;
                retries.push(json!({
                    "tile": tile,
                    "region": region,
                    "needed_bytes": needed,
                    "then": format!("a segment's attention plans with {} bytes of region 0", limits.attention_region0),
                }));
                tracing::info!(
                    tile,
                    needed,
                    attention_region0_bytes = limits.attention_region0,
                    "region 0 overflowed; compiling again with a smaller share for a segment's attention"
                );
            }
            // Region 1 overflowed, or a fallback left a GEMM no plan at all
            // (a whole-K producer that does not fit its share): the next
            // fallback, if there is one.
            Err(e) => {
                let mut why = match &e {
                    CompileError::OutOfMemory {
                        tile,
                        region,
                        needed,
                        ..
                    } if region.starts_with("region 1") => {
                        json!({"tile": tile, "region": region, "needed_bytes": needed})
                    }
                    CompileError::NoFeasiblePlan { value, .. } if fallback > 0 => json!({
                        "value": value,
                        "no_plan_after": retries.last().map(|r| r["then"].clone()),
                    }),
                    _ => return Err(e),
                };
                let Some(&(streamed_producers, resident_b, then)) = fallbacks.get(fallback) else {
                    // The fallbacks are spent: when region 1 overflowed by
                    // less than a tenth of it, GEMMs that share their
                    // tiles plan again with the overflow, in whole memory
                    // elements, taken off their shares (twice at most).
                    let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
                    match e {
                        CompileError::OutOfMemory {
                            region,
                            needed,
                            available,
                            ..
                        } if region.starts_with("region 1")
                            && needed < available + available / 10
                            && limits.shared_region1_cut < 2 * element =>
                        {
                            limits.shared_region1_cut +=
                                (needed - available).div_ceil(element) * element;
                            why["then"] = json!(format!(
                                "GEMMs sharing their tiles split region 1 less {} bytes",
                                limits.shared_region1_cut
                            ));
                            compiling_again(retries, why);
                            continue;
                        }
                        e => return Err(e),
                    }
                };
                fallback += 1;
                (limits.streamed_producers, limits.resident_b) = (streamed_producers, resident_b);
                why["then"] = json!(then);
                compiling_again(retries, why);
            }
            ok => return ok,
        }
    }
}

/// What `widen` widens under `limits`.
fn widen_purpose(limits: SegmentLimits) -> widen::Purpose {
    if limits.widen_for_precision {
        widen::Purpose::All
    } else {
        widen::Purpose::F32Results
    }
}

/// `widen`'s question to the kernel library: is there a cast of fp8 of
/// this scale to f16?
fn widen_casts(library: &mut KernelLibrary) -> impl FnMut(i8) -> bool + '_ {
    |scale| {
        library
            .get(&rowwise::cast_request(8, 16, scale as i64))
            .is_ok()
    }
}

/// `graph` (a legalized model) as `widen` rewrites it for its first
/// compile attempt; `None` when the kernel library does not open or the
/// rewrite fails (the compile says why).
fn widened_fully(options: &CompileOptions, graph: &ipu_graph::Graph) -> Option<widen::Widened> {
    let mut library = KernelLibrary::open(&options.kernels).ok()?;
    let widened = widen::widen(
        graph,
        options.accumulation,
        widen::Purpose::All,
        &mut widen_casts(&mut library),
    );
    widened.ok()
}

/// `options.model` loaded, legalized and widened as its first compile
/// attempt sees it; `None` when any of those fails (the compile reports
/// why).
fn widened_model(options: &CompileOptions) -> Option<widen::Widened> {
    load::load(&options.model)
        .ok()
        .and_then(|m| legalize::legalize(&m.graph).ok())
        .and_then(|l| widened_fully(options, &l.graph))
}

/// Whether `options.model` has fp8 GEMMs that `widen` widens for
/// precision only (false when it does not load: its compile says why).
fn optional_widening(options: &CompileOptions) -> bool {
    widened_model(options).is_some_and(|w| w.gemms.iter().any(|g| g.reason != widen::F32_RESULT))
}

/// Whether `options.model` splits into several block segments (whose
/// plans weigh their joins' weight moves, [`lower_segments`]); false when
/// it does not load (its compile reports why).
fn several_block_segments(options: &CompileOptions) -> bool {
    widened_model(options)
        .and_then(|w| {
            segment::split(&w.graph, false, &Default::default(), options.tiles, true).ok()
        })
        .is_some_and(|s| s.iter().filter(|s| s.kind == segment::Kind::Blocks).count() > 1)
}

/// Whether `options.model`'s independent GEMMs share its one tile in a
/// segment (`segment::split` with `share_one_tile`), which it would split
/// otherwise; false when it does not load (its compile reports why).
fn shares_one_tile(options: &CompileOptions) -> bool {
    if options.tiles != 1 {
        return false;
    }
    let Some(w) = widened_model(options) else {
        return false;
    };
    let count =
        |share| segment::split(&w.graph, false, &Default::default(), 1, share).map(|s| s.len());
    matches!((count(true), count(false)), (Ok(a), Ok(b)) if a != b)
}

/// What [`plan_and_lower`] knows of the model around the graph it plans.
struct SegmentContext<'a> {
    limits: SegmentLimits,
    /// The results the model reads only through casts to fp8
    /// (`segment::requantised_values`).
    requantised: &'a std::collections::BTreeSet<String>,
    /// Whether this is the model's only block segment: the join then moves
    /// no weights (they stay where its plans put them), only A.
    sole_block_segment: bool,
    /// Whether the join moves this segment's weights from their homes
    /// (see [`lower_segments`]): its plans then weigh that move beside A's.
    weights_joined: bool,
    /// Per weight (parameter name): the most bytes of it a tile may keep
    /// resident ([`gemm::GemmCosts::b_cap`]). With caps the plans weigh
    /// only A's join: the weights stay resident.
    weight_caps: Option<&'a BTreeMap<String, u64>>,
    /// The segment's inputs that earlier segments computed (its join
    /// brings them by exchange, whatever `HostInputs` says).
    device_inputs: &'a [String],
}

/// What the plans of a segmented model's segments may use, cut by
/// [`compile`] when a compile overflows tile memory.
#[derive(Clone, Copy, Debug)]
struct SegmentLimits {
    /// Region-0 bytes a segment's attention may plan with.
    attention_region0: u64,
    /// Region-1 bytes every segment leaves free (in whole memory
    /// elements): room for the region-0 buffers that storage moves there
    /// when region 0 overflows, set by `compile` once cutting the
    /// attention's region 0 leaves it no plan (Llama-2-7B's attention at
    /// 1024 tokens: the projections' weight homes and the attention's Q
    /// home beside attention buffers that filled region 1).
    region1_reserve: u64,
    /// Region 0's first overflow (bytes), once the reserve is set: the
    /// attention then sizes what it leaves free in region 1 by its own
    /// region 0 ([`attention::OverflowRoom`]), the first attempt's best
    /// plan telling how much of the overflow was the other buffers'.
    first_region0_overflow: Option<u64>,
    /// Region-1 bytes added to what every attention plan leaves free for
    /// region 0's overflow, and to the reserve, after a placement with the
    /// reserve still overflowed region 0: storage moves whole buffers, so
    /// the room a plan's bytes suggest can fall short by part of one.
    overflow_slack: u64,
    /// Whether a segment's chain may stream its producer.
    streamed_producers: bool,
    /// Whether a segment's streamed GEMMs may keep B resident (a buffer
    /// for the whole program, which the join does not move out of the
    /// way of the other segments as it does the weights of whole-K plans).
    resident_b: bool,
    /// Whether a model with several block segments plans them weighing
    /// the weight moves of their joins first ([`lower_segments`]).
    weight_joins: bool,
    /// Region-1 bytes taken off the total that GEMMs sharing their tiles
    /// split into equal shares: their element-exclusive buffers round up
    /// to memory elements each, which equal byte shares do not see, so a
    /// placement can overflow by a few elements where every plan fit its
    /// share (an attention's three projections on two tiles).
    shared_region1_cut: u64,
    /// Whether `widen` widens fp8 GEMMs for precision, not only those
    /// with an f32 result ([`widen::Purpose`]).
    widen_for_precision: bool,
    /// Whether an attention block and its projections go to segments of
    /// their own (`segment::split`): when no attention plan leaves the
    /// projections room beside it (f32 SigLIP attention: an f32
    /// projection on a third of the tiles needs most of region 1).
    split_attention_projections: bool,
    /// Whether a `repeat` block is compiled once and run as a device loop
    /// ([`loops`]).
    device_loop: bool,
    /// Whether the joins move a loop body's weights from their homes
    /// even where they could stay resident, so that the weight stacks
    /// mirror the homes (one copy of each weight spread over the tiles).
    loop_weight_homes: bool,
    /// Where the loop finds each iteration's weights.
    loop_weights: loops::LoopWeights,
    /// Whether a few small independent GEMMs may share a model's one tile
    /// in a segment (`segment::split`); off again when they find no plan
    /// or no room there.
    share_one_tile: bool,
}

fn compile_with(
    options: &CompileOptions,
    limits: SegmentLimits,
    retries: &[serde_json::Value],
) -> Result<CompileOutput, CompileError> {
    if !(1..=ipu_arch::TILES_PER_CHIP).contains(&options.tiles) {
        return Err(CompileError::Options {
            message: format!(
                "tile count {} is outside 1..={}",
                options.tiles,
                ipu_arch::TILES_PER_CHIP
            ),
        });
    }
    let model = phase("load", || load::load(&options.model))?;
    let legal = phase("legalize", || legalize::legalize(&model.graph))?;
    let mut library = KernelLibrary::open(&options.kernels)?;
    let widened = phase("widen", || {
        let w = widen::widen(
            &legal.graph,
            options.accumulation,
            widen_purpose(limits),
            &mut widen_casts(&mut library),
        )?;
        for g in &w.gemms {
            tracing::info!(value = %g.value, k = g.k, reason = g.reason, "fp8 GEMM runs on gemm_f16 with its operands widened to f16");
        }
        Ok(w)
    })?;
    let graph = &widened.graph;
    // A repeat block compiled once: the plans see the template (the body's
    // first iteration between the statements around the block).
    let template = if !limits.device_loop {
        None
    } else if widened.graph != model.graph {
        tracing::info!("the repeat block is compiled iteration by iteration: legalize or widen changed the graph");
        None
    } else {
        model.repeats.first().and_then(|r| match loops::template(graph, r) {
            Ok(t) => Some(t),
            Err(why) => {
                tracing::info!(line = r.line, %why, "the repeat block is compiled iteration by iteration");
                None
            }
        })
    };
    let planned_graph = template.as_ref().map_or(graph, |t| &t.graph);
    let span = tracing::info_span!(
        "ipu_compiler.package.build",
        tile_count = options.tiles,
        operations = graph.nodes().len()
    );
    let _enter = span.enter();

    let mut rowwise_reports = Vec::new();
    let SegmentLowered {
        mut lowered,
        tile_count,
        operation_reports,
        mut would_help,
        chain_choice,
        attention,
        loop_body,
    } = lower_segments(
        planned_graph,
        options,
        &mut library,
        &mut rowwise_reports,
        limits,
        template.as_ref(),
    )?;
    for (value, scale) in &widened.lacking_casts {
        let cast = rowwise::cast_request(8, 16, *scale as i64);
        tracing::info!(value = %value, kernel = %cast, "the kernel library lacks a specialisation that would help");
        would_help.push(json!({
            "kernel": cast.to_string(),
            "value": value,
            "why": "widens the operands of this short fp8 projection of attention scores to f16, so that it accumulates in f32 (`widen`); without it gemm_fp8 rounds to f16 every eight products",
        }));
    }
    // A loop whose weight stacks hold only some iterations (the bound
    // before storage leaves out scratch buffers and the streamed
    // iterations' tables) compiles from the loop phase again with fewer
    // slots when storage finds no room for them on a tile.
    let before_loop = template.as_ref().map(|_| lowered.clone());
    // `None`: stacks on their weights' tiles when the bound finds room;
    // `Some(n)`: at most n iterations' stacks, spread over the tiles.
    let mut stack_cap: Option<usize> = None;
    // Stacks of the homes that cannot fit spread and stream at once (a
    // deep stack would otherwise go through every fallback first), and
    // stacks storage cannot place compile again from the loop phase; only
    // when the options leave the weights' place to the compiler. Stacks
    // of resident weights first try the homes.
    let may_spread = options.loop_weights.is_none() && limits.loop_weight_homes;
    let mut loop_retries: Vec<serde_json::Value> = Vec::new();
    let mut exchange_reports: Vec<serde_json::Value> = Vec::new();
    let (loop_report, param_copies, storage) = loop {
        let loop_report = match &template {
            Some(t) => Some(phase("loop", || {
                let body = loop_body
                    .clone()
                    .expect("lower_segments finds a template's body");
                let u = loops::unroll(
                    &mut lowered,
                    t,
                    body,
                    graph,
                    &mut library,
                    loops::WeightChoice {
                        weights: limits.loop_weights,
                        stream_on_overflow: may_spread,
                        stack_cap,
                    },
                )?;
                verifier("loop", lower::verify(&lowered))?;
                tracing::info!(report = %u.report, "the repeat block runs as a device loop");
                Ok(u.report)
            })?),
            None => None,
        };
        // Parameters the plans hold more than once cross the host link once,
        // like the run call's inputs, and the initialize call copies them.
        let param_copies = if options.host_inputs == HostInputs::Once {
            phase("param_copies", || {
                let r = param_copies::copy_on_device(&mut lowered)?;
                verifier("param_copies", lower::verify(&lowered))?;
                tracing::info!(
                    copied = r.copied.len(),
                    host_written = r.host_written.len(),
                    host_bytes_before = r.host_bytes_before,
                    host_bytes_after = r.host_bytes_after,
                    transfers = r.transfers,
                    step_cycles = r.step_cycles,
                    "parameters written once by the host and copied by the initialize call"
                );
                Ok(r)
            })?
        } else {
            param_copies::ParamCopies::default()
        };
        // The package's host interface is the model's: device host tensors
        // that legalize renamed, sliced or transposed are written and read at
        // their places in the model's tensors.
        legalize::restore_host_tensors(&mut lowered, &legal.host);
        // The casts `widen` adds are not values of the model, so no checkpoint
        // names them (the diagnosis compares model values with the reference).
        if !widened.gemms.is_empty() {
            lowered
                .resident
                .retain(|t| model.graph.lookup(&t.name).is_some());
        }

        // Every kernel any tile links, loaded once: the per-tile work of
        // place_storage and link then runs on all cores and only reads the
        // library (each tile's result depends on that tile alone, and errors are
        // reported for the lowest tile, so the output stays deterministic).
        load_tile_kernels(&lowered, &mut library)?;
        let placed = phase("place_storage", || {
            let code_sizes = link::CodeSizes::default();
            let mut out = BTreeMap::new();
            let tiles: Vec<(&u32, &Vec<lower::BufferSpec>)> = lowered.buffers.iter().collect();
            let holders = value_holders(&lowered);
            let placed: Vec<Result<storage::TileStorage, CompileError>> = tiles
                .par_iter()
                .map(|&(&tile, bufs)| {
                    let code_bytes =
                        dry_run_code_bytes(&lowered, tile, &library, &code_sizes, "emit_code")?;
                    let s = storage::place(tile, bufs, code_bytes)?;
                    let s = keep_values_intact(s, bufs, code_bytes, holders.get(&tile));
                    verifier("place_storage", storage::validate(&s, bufs))?;
                    Ok(s)
                })
                .collect();
            for s in placed {
                let s = s?;
                out.insert(s.tile, s);
            }
            // Every exchange step's tables, resolved to the placed addresses,
            // must pass ipu-exchange's independent checker before any code is
            // emitted from them.
            for call in &lowered.calls {
                for (si, step) in call.steps.iter().enumerate() {
                    let Some(x) = &step.exchange else { continue };
                    if call.reruns.contains_key(&si) {
                        continue;
                    }
                    let summary =
                        exchange::verify_placed(x, |t, b| out[&t].addresses[b]).map_err(|e| {
                            CompileError::Verifier {
                                phase: "place_storage",
                                message: format!("exchange step `{}`: {e}", step.phase),
                            }
                        })?;
                    let f = &x.figures;
                    exchange_reports.push(json!({
                        "call": call.name,
                        "step": step.phase,
                        "figures": f,
                        "estimated_cycles": step.estimated_cycles,
                        "checked": {"descriptors": summary.descriptors, "horizon": summary.horizon, "words_delivered": summary.words_delivered},
                    }));
                }
            }
            Ok(out)
        });

        let stacked = loop_report
            .as_ref()
            .and_then(|r| r["stacked_iterations"].as_u64())
            .unwrap_or(0) as usize;
        let spread = loop_report
            .as_ref()
            .is_some_and(|r| r["weight_stacks"] == "spread");
        match placed {
            Err(CompileError::OutOfMemory {
                tile,
                needed,
                available,
                ..
            }) if may_spread && stacked > 0 && stack_slots(&lowered, tile, stacked) > 0 => {
                let then = if spread {
                    let slots = stack_slots(&lowered, tile, stacked);
                    // The overflow's slots, but at most half of them at a
                    // time: a region that overflows may have room for fewer.
                    let fewer = (needed.saturating_sub(available).div_ceil(slots).max(1) as usize)
                        .min(stacked.div_ceil(2));
                    let cap = stacked.saturating_sub(fewer);
                    stack_cap = Some(cap);
                    format!("the weight stacks hold {cap} iterations instead of {stacked}")
                } else {
                    stack_cap = Some(stacked);
                    "the weight stacks spread over the tiles with room".to_string()
                };
                let why = json!({
                    "tile": tile,
                    "needed_bytes": needed,
                    "available_bytes": available,
                    "then": then,
                });
                tracing::info!(%why, "compiling again from the loop phase");
                loop_retries.push(why);
                lowered = before_loop.clone().expect("a loop has its lowered program");
                exchange_reports.clear();
            }
            placed => break (loop_report, param_copies, placed?),
        }
    };

    // Every buffer's life from the steps that touch it, and the check that
    // buffers live at the same step never share memory: independent of the
    // lifetimes placement read.
    let live_steps = phase("liveness", || {
        let lives = liveness::lives(&lowered);
        verifier("liveness", liveness::check(&lowered, &storage, &lives))?;
        Ok(liveness::analyse(&lowered, &storage, &lives))
    })?;
    let peak_live = liveness::peak(&lowered, &live_steps);
    if let Some((call, step, live)) = &peak_live {
        tracing::info!(
            call,
            step,
            tile = live.tile,
            live_bytes = live.bytes,
            always_live_bytes = live.always,
            "peak live bytes"
        );
    }

    let kernels_of = |tile: u32| loaded_kernels(&library, &lowered, tile);
    let programs = phase("emit_code", || {
        let tiles: Vec<u32> = lowered.buffers.keys().copied().collect();
        tiles
            .par_iter()
            .map(|&t| {
                let text = emit::tile_program(&lowered, t, &storage[&t]).map_err(|message| {
                    CompileError::Verifier {
                        phase: "emit_code",
                        message,
                    }
                })?;
                Ok((t, text))
            })
            .collect::<Result<BTreeMap<u32, String>, CompileError>>()
    })?;

    let linked = phase("link", || {
        let tiles: Vec<(&u32, &String)> = programs.iter().collect();
        let images: Vec<Result<(u32, link::LinkedTile), CompileError>> = tiles
            .par_iter()
            .map(|&(&tile, text)| {
                let l = link::link_program(tile, text, &kernels_of(tile))?;
                let st = &storage[&tile];
                let tables = lowered
                    .calls
                    .iter()
                    .flat_map(|c| c.first_runs())
                    .filter_map(|s| s.exchange.as_ref())
                    .map(|x| {
                        (
                            x.table_buffers[&tile],
                            exchange::table_bytes(x, tile, |b| st.addresses[b]),
                        )
                    })
                    .collect();
                let lt = link::tile_image(tile, &l, &lowered.buffers[&tile], st, tables)?;
                Ok((tile, lt))
            })
            .collect();
        let mut out = BTreeMap::new();
        for r in images {
            let (tile, lt) = r?;
            out.insert(tile, lt);
        }
        Ok(out)
    })?;

    // Every step's supervisor cost as its place in the call makes it, for
    // the figures, the schedule and the profile's estimates.
    launches::settle_launches(&mut lowered);

    // Figures for the report and the manifest summary.
    let flops = analysis::graph_flops(graph);
    let compute_bound = ipu_arch::compute_bound_cycles(flops.matmul, tile_count);
    let compute_bound_chip = ipu_arch::compute_bound_cycles(flops.matmul, ipu_arch::TILES_PER_CHIP);
    let estimated_exchange: u64 = lowered
        .calls
        .iter()
        .flat_map(|c| &c.steps)
        .filter(|s| s.exchange.is_some())
        .map(|s| s.estimated_cycles)
        .sum();
    // The run's device cycles end with the call's final host sync, which
    // the simulator counts like any other sync (gemm_small's estimate was
    // 31% low without it: 1,254 against 1,813 simulated cycles).
    let estimated_compute = timeline_cycles(&lowered) + ipu_arch::SYNC_CYCLES;
    // Host link cycles of the run call from the placements themselves.
    let host_cycles = |tensors: &[lower::HostTensor]| {
        let bytes: u64 = tensors
            .iter()
            .flat_map(|t| &t.placements)
            .map(|p| p.bytes as u64)
            .sum();
        ipu_arch::host_transfer_cycles(bytes, ipu_arch::CLOCK_HZ_C600)
    };
    let host_in = host_cycles(&lowered.io[1].0);
    let host_out = host_cycles(&lowered.io[1].1);
    let estimated_run = host_in + estimated_compute + host_out;
    let mut memory = Vec::new();
    let mut peak_r0 = 0u64;
    let mut peak_r1 = 0u64;
    for (&tile, bufs) in &lowered.buffers {
        let mut cats: BTreeMap<(&str, String), u64> = BTreeMap::new();
        let code = (linked[&tile].code_end - ipu_arch::REGION0_BASE) as u64;
        *cats
            .entry(("region0", "code_and_state".into()))
            .or_default() += code;
        *cats.entry(("region0", "host_command".into())).or_default() +=
            storage::COMMAND_RESERVE as u64;
        for (b, &a) in bufs.iter().zip(&storage[&tile].addresses) {
            let region = if a >= ipu_arch::REGION1_BASE {
                "region1"
            } else {
                "region0"
            };
            *cats.entry((region, b.category.clone())).or_default() += b.bytes as u64;
        }
        let (mut r0, mut r1) = (0, 0);
        for ((region, category), bytes) in cats {
            if region == "region0" {
                r0 += bytes;
            } else {
                r1 += bytes;
            }
            memory.push(
                json!({"tile": tile, "region": region, "category": category, "bytes": bytes}),
            );
        }
        peak_r0 = peak_r0.max(r0);
        peak_r1 = peak_r1.max(r1);
    }
    let linked_kernels = linked_requests(&lowered);
    let kernels_used: Vec<serde_json::Value> = library
        .used()
        .filter(|k| linked_kernels.contains(&k.request))
        .map(|k| json!({"kernel": k.request.to_string(), "origin": k.origin, "code_bytes": k.metadata.code_bytes, "cycles": k.metadata.cycles}))
        .collect();
    let operations: Vec<&OperationReport> = operation_reports.iter().collect();
    let mut report = json!({
        "format_version": 1,
        "model": graph.name(),
        "tile_count": tile_count,
        "tile_budget": options.tiles,
        "matmul_flop": flops.matmul,
        "compute_bound_cycles": compute_bound,
        "compute_bound_cycles_chip": compute_bound_chip,
        "estimated_cycles": {"run": estimated_run, "run_compute": estimated_compute, "run_exchange": estimated_exchange, "run_host_in": host_in, "run_host_out": host_out},
        "chain_handoff": chain_choice,
        "attention": attention,
        "exchange_steps": exchange_reports,
        "operations": operations,
        "rowwise_operations": rowwise_reports,
        "kernels": kernels_used,
        "specialisations_that_would_help": would_help,
        "peak_standard_bytes": peak_r0,
        "peak_interleaved_bytes": peak_r1,
        "memory": memory,
    });
    // The fullest tile's live bytes at the fullest step (crate `liveness`):
    // beside what placement used, the most any step needs.
    if let Some((call, step, live)) = &peak_live {
        report["peak_live"] = json!({"call": call, "step": step, "live": live});
    }
    // Only a compile that retried names its retries (other reports, and so
    // their packages, stay as they were).
    if !retries.is_empty() || !loop_retries.is_empty() {
        report["retries"] = json!(retries.iter().chain(&loop_retries).collect::<Vec<_>>());
    }
    if !widened.gemms.is_empty() {
        report["widened_fp8_gemms"] = json!(widened.gemms);
    }
    if let Some(l) = loop_report {
        report["device_loop"] = l;
    }
    // Likewise the parameters the initialize call copies.
    if !param_copies.copied.is_empty() || !param_copies.host_written.is_empty() {
        report["param_copies"] = json!(param_copies);
    }
    let summary: BTreeMap<String, u64> = [
        ("active_tiles", tile_count as u64),
        ("compute_bound_cycles", compute_bound),
        ("estimated_compute_cycles", estimated_compute),
        ("estimated_run_cycles", estimated_run),
        ("matmul_flop", flops.matmul),
        ("peak_interleaved_bytes", peak_r1),
        (
            "peak_live_bytes",
            peak_live.as_ref().map_or(0, |p| p.2.bytes),
        ),
        ("peak_standard_bytes", peak_r0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();

    let package = phase("write_package", || {
        let info = package::info(graph.name(), &lowered, &storage, summary);
        let symbols: BTreeMap<u32, Vec<(String, u32, u32)>> = linked
            .iter()
            .map(|(&t, l)| (t, l.symbols.clone()))
            .collect();
        let members: BTreeMap<String, Vec<u8>> = [
            ("model.ipug".to_string(), model.text.clone().into_bytes()),
            ("report.json".to_string(), package::json_bytes(&report)),
            (
                "checkpoints.json".to_string(),
                package::json_bytes(&package::checkpoints(&lowered, &storage)),
            ),
            (
                "schedule.json".to_string(),
                package::json_bytes(&package::schedule(&lowered, &live_steps)),
            ),
            (
                "symbols.json".to_string(),
                package::json_bytes(&package::symbols(&symbols)),
            ),
        ]
        .into_iter()
        .collect();
        let pkg = ipu_package::Package {
            info,
            tiles: linked.iter().map(|(&t, l)| (t, l.image.clone())).collect(),
            members,
        };
        // Every attempt validates its package; `compile` writes the one
        // it keeps.
        pkg.validate().map_err(|e| CompileError::Package {
            message: e.to_string(),
        })?;
        Ok(pkg)
    })?;
    tracing::info!(
        model = graph.name(),
        tile_count,
        estimated_run_cycles = estimated_run,
        estimated_compute_cycles = estimated_compute,
        compute_bound_cycles = compute_bound,
        "package built"
    );
    Ok(CompileOutput {
        package,
        report,
        estimated_compute_cycles: estimated_compute,
        estimated_run_cycles: estimated_run,
        programs,
    })
}
