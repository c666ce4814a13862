//! The `plan` phase of a segment's driver ([`crate::plan_and_lower`]):
//! each GEMM's setup (geometry, kernels, formulas, how it accumulates and
//! what it weighs), then its front of candidate plans, searched one of
//! three ways: a chain's GEMMs jointly (shared rows, an exchange hand-off
//! or a streamed consumer), an attention's projections beside the best
//! attention candidate that leaves them room, or independent GEMMs each
//! on its own (streamed when K does not fit whole); and last the
//! operation reports with each retained finalist logged.

use crate::attention::{self, AttentionBlock, AttentionKernels, AttentionPlan};
use crate::gemm::GemmGeometry;
use crate::library::KernelLibrary;
use crate::{
    f16_chain_blocks, fuse, gemm, gemm_f32_kernel, gemm_fp8_kernel, gemm_kernel, kernel_formula,
    lower, note_missing_f16_sum, plan, plan_exchanged_chain, plan_joint_chain, reduce_kernel,
    reduce_request_f16_partials, stream, stream_min_k_parts, streamed_projections,
    transposed_reduce_request, use_f32_fallback, whole_k_projection_cycles, Accumulation,
    AccumulationMode, CompileError, CompileOptions, GemmSetup, HostInputs, OperationReport,
    PlanFront, PlannedGemm, SegmentLimits, COARSE_GELU_MIN_READER_K, F16_ACCUMULATION_MAX_K,
    F16_CHAIN_MIN_BLOCKS, PROJECTIONS_OVER_ASSUMPTION_MIN, TRANSPOSED_REDUCE_ROW_ALIGN,
};
use ipu_graph::Graph;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// What a segment's GEMMs plan with: the graph and options, the fused
/// groups and attention blocks, the segment's limits and how its join
/// moves operands, and the region-1 shares the driver has settled.
#[derive(Clone, Copy)]
pub(crate) struct GemmContext<'a> {
    pub graph: &'a Graph,
    pub options: &'a CompileOptions,
    pub groups: &'a [fuse::Group],
    pub blocks: &'a [AttentionBlock],
    /// The segment's tiles, when this is a segment of a segmented model.
    pub tile_count_override: Option<u32>,
    pub limits: SegmentLimits,
    /// See [`crate::SegmentContext`].
    pub requantised: &'a BTreeSet<String>,
    pub device_inputs: &'a [String],
    pub sole_block_segment: bool,
    pub weights_joined: bool,
    /// Whether the join moves the weights from their homes (joined and
    /// not capped).
    pub weights_moved: bool,
    pub weight_caps: Option<&'a BTreeMap<String, u64>>,
    /// Region 1 less what the segment reserves.
    pub region1: u64,
    /// Each GEMM's share of region 1.
    pub share: u64,
    /// The tiles each group plans over.
    pub group_tiles: u32,
    /// Independent GEMMs on the same tiles, their buffers side by side.
    pub shares_tiles: bool,
    /// An attention's projections on fewer tiles than there are of them.
    pub shared_projections: bool,
    /// A GEMM reads an earlier group's result.
    pub chained: bool,
}

/// Each group's setup for planning ([`PlannedGemm`]), in group order.
pub(crate) fn setups(
    cx: &GemmContext,
    library: &mut KernelLibrary,
) -> Result<Vec<PlannedGemm>, CompileError> {
    let GemmContext {
        graph,
        options,
        groups,
        blocks,
        tile_count_override,
        requantised,
        device_inputs,
        weights_joined,
        weights_moved,
        weight_caps,
        share,
        shares_tiles,
        ..
    } = *cx;
    let mut planned = Vec::new();
    for group in groups {
        let node = graph.node(group.gemm);
        let (a, b) = (graph.ty(node.args[0]), graph.ty(node.args[1]));
        let result = graph.value(node.result);
        let k = a.shape.dims()[1] as u32;
        let f32_result = lower::gemm_acc32(result.ty.dtype);
        let fp8_scale = match (a.dtype, b.dtype) {
            (
                ipu_graph::DType::Fp8 { scale_log2: sa },
                ipu_graph::DType::Fp8 { scale_log2: sb },
            ) => Some(sa as i32 + sb as i32),
            _ => None,
        };
        // f32 operands (the graph gives them an f32 result) multiply
        // on `gemm_f32`, accumulating in f32 whatever the option says.
        let f32_operands = a.dtype == ipu_graph::DType::F32;
        if fp8_scale.is_some() && f32_result {
            return Err(CompileError::Unsupported {
                value: result.name.clone(),
                operation: "gemm".into(),
                reason: "an fp8 GEMM accumulates in f16 on the AMP, and operands with scales outside -14..=8 cannot be widened to f16 (`widen`); an f32 result of it is not lowered".into(),
            });
        }
        // How this GEMM accumulates (see [`Accumulation`]).
        let projection = blocks.iter().any(|b| {
            [b.q, b.k, b.v]
                .iter()
                .any(|&g| groups[g].gemm == group.gemm)
        });
        // In the GEMM's own K blocks (32 products for fp8: the same
        // 256-product chains in half as many blocks).
        let k_block = gemm::k_block(fp8_scale.is_some());
        let chain_blocks = f16_chain_blocks(k) * 16 / k_block;
        let chains_possible = !f32_result
            && chain_blocks * k_block >= F16_CHAIN_MIN_BLOCKS * 16
            && k.div_ceil(k_block) <= ipu_arch::WORKER_CONTEXTS * chain_blocks;
        // A result that is re-quantised to fp8 (through its bias and
        // GELU) turns any difference from the reference's exactly
        // rounded value into a whole fp8 step where it sits near a
        // rounding boundary: short sums, which Auto would keep in one
        // f16 chain, accumulate in f32 for it (random fp8 MLPs with
        // hidden widths of 35 to 114 flipped activations so; see
        // `COARSE_GELU_MIN_READER_K` for its GELU).
        let requantised_value = requantised.contains(&graph.value(group.result()).name);
        let requantised_result = fp8_scale.is_none() && requantised_value;
        let mode = match options.accumulation {
            _ if f32_operands => AccumulationMode::F32,
            Accumulation::F16 => AccumulationMode::F16,
            Accumulation::F32 => AccumulationMode::F32,
            Accumulation::Auto if requantised_result && k <= F16_ACCUMULATION_MAX_K => {
                AccumulationMode::F32
            }
            Accumulation::Auto if k <= F16_ACCUMULATION_MAX_K => AccumulationMode::F16,
            Accumulation::Auto if chains_possible => AccumulationMode::F16Chains,
            Accumulation::Auto => AccumulationMode::F32,
        };
        let a_param = graph.value(node.args[0]).def == ipu_graph::ValueDef::Param;
        // K^T (row layout), Q^T and V^T (column layout) move as runs of
        // keys or queries in 4-byte words.
        let row_align = if projection { 2 } else { 1 };
        let mut setup = |mode: AccumulationMode| -> Result<_, CompileError> {
            let f16_accumulation = mode != AccumulationMode::F32;
            let chains = mode == AccumulationMode::F16Chains;
            // An f16-accumulated GEMM (an fp8 one always is) with an
            // epilogue, a GEMM consumer or an attention block reading
            // it sums its f16 partials in the reduce step (IN=16), and
            // so does one whose K is cut into bounded f16 chains.
            // Unbounded f16 projections of an attention block keep
            // their single chain without a reduce step.
            let reduce_f16 = !f32_result
                && (chains
                    || (group.needs_reduce_step()
                        && (fp8_scale.is_some() || (f16_accumulation && blocks.is_empty()))));
            let acc32 = fp8_scale.is_none()
                && !reduce_f16
                && (f32_result || group.needs_reduce_step() || !f16_accumulation);
            let geometry = GemmGeometry {
                m: a.shape.dims()[0] as u32,
                k,
                n: b.shape.dims()[1] as u32,
                acc32,
                f16_result: !f32_result,
                row_align,
                fp8_scale,
                f32_operands,
                reduce_f16,
                max_chain_blocks: if chains { chain_blocks } else { u32::MAX },
                f32_reduce_step: f32_result && group.needs_reduce_step(),
            };
            let request = if fp8_scale.is_some() {
                gemm_fp8_kernel()
            } else if f32_operands {
                gemm_f32_kernel()
            } else {
                gemm_kernel(geometry.acc32)
            };
            let reduce_request = if geometry.reduce_f16 {
                // A result re-quantised to fp8 takes the f16 GELU
                // like one that feeds a GEMM (fp8 SigLIP MLP: its
                // producer's reduce step 23,892 -> 7,644 estimated
                // cycles; max error 0.052 against atol 0.078), when
                // the reading GEMM's sums are long enough
                // ([`COARSE_GELU_MIN_READER_K`]).
                let coarse_reader = (group.feeds_gemm || requantised_value)
                    && geometry.n >= COARSE_GELU_MIN_READER_K;
                Some(reduce_request_f16_partials(
                    library,
                    group.epilogue(),
                    coarse_reader,
                ))
            } else {
                geometry
                    .acc32
                    .then(|| reduce_kernel(geometry.f16_result, group.epilogue()))
            };
            // The exchange moves whole words, so an input whose rows
            // are not (K = 31 f16) is written by the host to every copy
            // instead (`segment::join`): no copy step to weigh.
            let rows_are_words = |elements: u32| {
                (elements as u64 * geometry.operand_bytes() as u64).is_multiple_of(4)
            };
            let cost = gemm::GemmCosts {
                gemm: kernel_formula(library, &request, &["M", "NCB", "NKB"])?,
                reduce: match &reduce_request {
                    Some(r) => Some(kernel_formula(library, r, &["ROWS", "QUADS", "P"])?),
                    None => None,
                },
                memory_budget: share,
                owns_a: matches!(group.a, fuse::Source::Host(_)),
                // A model of one segment weighs the copy of A, and so
                // does a segment of one GEMM (its A comes from the
                // previous segment's tiles by the join, for example
                // after a cast to fp8: replicated over the column
                // parts' tiles for a whole-K plan, or once into the
                // homes of a streamed one), and so does every GEMM of a
                // segment whose join moves its weights from their homes
                // too (`weights_joined`, `b_joined`): the plans weigh
                // both (ViT block 400,175 -> 363,647 simulated cycles).
                // Other segments' GEMMs weigh neither: weighing A
                // alone, without the weights the join moves beside it,
                // made the ViT block slower (449,111 -> 472,353).
                a_copied: matches!(group.a, fuse::Source::Host(_))
                    && !a_param
                    && rows_are_words(geometry.k)
                    && if tile_count_override.is_none() {
                        options.host_inputs == HostInputs::Once
                    } else {
                        (groups.len() == 1 && blocks.is_empty()) || weights_joined
                    },
                a_joined: tile_count_override.is_some(),
                a_from_segment: matches!(group.a, fuse::Source::Host(a) if device_inputs.contains(&graph.value(a).name)),
                a_copy_shared: false,
                copy_bound: None,
                b_joined: weights_moved,
                b_cap: weight_caps.and_then(|caps| caps.get(&graph.value(group.b).name).copied()),
                // The same for a B that is a host input.
                b_copied: graph.value(group.b).def == ipu_graph::ValueDef::Input
                    && tile_count_override.is_none()
                    && options.host_inputs == HostInputs::Once
                    && rows_are_words(geometry.n),
                transpose: None,
                feeds_gemm: group.feeds_gemm,
                persistent_budget: None,
                a_persistent: geometry.kp() != geometry.k || a_param,
                joint: None,
                reduce_row_align: 1,
                whole_elements: shares_tiles,
            };
            Ok((geometry, (request, reduce_request), cost))
        };
        // Bounded f16 chains need the library's f16-partials reduce; a
        // library without it (or a plan search that finds no split
        // with enough K groups, in the fronts' searches) falls back to
        // f32 accumulation.
        let (geometry, (request, reduce_request), cost, fallback) = match mode {
            AccumulationMode::F16Chains => match setup(mode) {
                Ok((g, r, c)) => (g, r, c, Some(setup(AccumulationMode::F32)?)),
                Err(_) => {
                    let (g, r, c) = setup(AccumulationMode::F32)?;
                    (g, r, c, None)
                }
            },
            _ => {
                let (g, r, c) = setup(mode)?;
                (g, r, c, None)
            }
        };
        // A streamed plan cuts K into K parts, each one f16 chain
        // whose partials the reduce-scatter sums in f32: with four or
        // more, the margin against the tolerance is that of bounded
        // chains (5 sqrt(K / k) >= 10), so Auto may stream in f16.
        let streamed_f16 = (options.accumulation == Accumulation::Auto
            && mode == AccumulationMode::F32
            && fp8_scale.is_none()
            && !f32_result)
            .then(|| setup(AccumulationMode::F16).ok())
            .flatten();
        planned.push((
            geometry,
            (request, reduce_request),
            cost,
            result.name.clone(),
            fallback,
            streamed_f16,
        ));
    }
    Ok(planned)
}

/// The fronts of a chain's GEMMs: with whole rows shared by the chain,
/// each with its own plan and an exchange hand-off, or (two GEMMs) a
/// streamed consumer beside its producer; whichever is fastest, and else
/// the GEMMs sharing region 1 by what each needs. Sets which groups
/// receive A by exchange, the report's chain choice, and whether the
/// joint sharing was tried (for the error when nothing fits).
pub(crate) fn chain_fronts(
    cx: &GemmContext,
    planned: &mut Vec<PlannedGemm>,
    a_by_exchange: &mut Vec<bool>,
    chain_choice: &mut Option<serde_json::Value>,
    joint_tried: &mut bool,
) -> Result<Vec<PlanFront>, CompileError> {
    let GemmContext {
        options,
        groups,
        tile_count_override,
        limits,
        region1,
        ..
    } = *cx;
    let m = planned[0].0.m;
    if let Some(p) = planned.iter().find(|p| p.0.m != m) {
        return Err(CompileError::Unsupported {
            value: p.3.clone(),
            operation: "gemm".into(),
            reason: format!("a model with a GEMM chain must have one row count; this GEMM has {} rows, the first {m}", p.0.m),
        });
    }
    // The setups the shared-rows search plans with. The other
    // candidates below change them (the consumers own their A, a
    // GEMM may fall back to f32, a streamed consumer and its
    // producer take all of region 1 or a joint layout), and
    // `lower` derives every shard's worker split again from its
    // GEMM's setup: when the shared rows win, these go back, or
    // lowering would lay out other splits than the plans counted
    // (a 64 x 48 -> 240 -> 147 MLP on one tile planned its
    // consumer's C buffers with one K group in half of region 1
    // and lowered them with three in all of it, 535,056 bytes).
    let shared_setups: Vec<PlannedGemm> = planned.clone();
    let mut items: Vec<(GemmGeometry, &mut gemm::GemmCosts)> =
        planned.iter_mut().map(|p| (p.0, &mut p.2)).collect();
    let shared = plan::search_chain(&mut items, options.tiles, &options.search);
    let shared_cycles: Option<u64> = shared
        .iter()
        .map(|f| f.0.first().map(|p| p.estimate.compute_cycles))
        .sum();
    // The other candidate: every GEMM with its own plan, the
    // intermediate handed over by an exchange step.
    let consumers: Vec<bool> = groups
        .iter()
        .map(|g| matches!(g.a, fuse::Source::Group(_)))
        .collect();
    let producers: Vec<Option<usize>> = groups
        .iter()
        .map(|g| match g.a {
            fuse::Source::Group(p) => Some(p),
            fuse::Source::Host(_) => None,
        })
        .collect();
    for (p, &c) in planned.iter_mut().zip(&consumers) {
        p.2.owns_a |= c;
    }
    let geometries: Vec<GemmGeometry> = planned.iter().map(|p| p.0).collect();
    // The bounded-f16-chain setups of GEMMs that have an f32
    // fallback, kept in case a fallback below is undone.
    let chain_setups: Vec<Option<GemmSetup>> = planned
        .iter()
        .map(|p| p.4.as_ref().map(|_| (p.0, p.1.clone(), p.2.clone())))
        .collect();
    let mut own: Vec<(Vec<plan::GemmPlan>, usize)> = planned
        .iter_mut()
        .map(|p| {
            let front = plan::search(&p.0, options.tiles, &mut p.2, &options.search);
            if front.0.is_empty() && use_f32_fallback(p) {
                return plan::search(&p.0, options.tiles, &mut p.2, &options.search);
            }
            front
        })
        .collect();
    // A consumer owns its A buffer (memory) but the host never writes it.
    for (front, &c) in own.iter_mut().zip(&consumers) {
        for p in front.0.iter_mut().filter(|_| c) {
            p.estimate.total_cycles -= p.estimate.host_in_cycles;
            p.estimate.host_in_cycles = 0;
        }
    }
    // A two-GEMM chain whose consumer fits no whole-K plan streams
    // the consumer's K (crate::stream) with its A chunks taken from
    // the producer's result tiles; the producer then plans in the
    // region-1 memory the streamed plan leaves.
    let mut streamed_chain = false;
    if groups.len() == 2 && producers[1] == Some(0) && own[1].0.is_empty() {
        planned[1].2.memory_budget = region1;
        let bias = groups[1].bias.is_some();
        let g1 = planned[1].0;
        let streamed = stream::search(
            &g1,
            options.tiles,
            (false, bias),
            1,
            &mut planned[1].2,
            &options.search,
        );
        // Under Auto an f32 consumer may also stream in f16 with at
        // least four K parts (the `streamed_f16` setup of [`setups`]).
        let streamed_f16 = planned[1].5.as_mut().map(|setup| {
            setup.2.memory_budget = region1;
            let g = setup.0;
            stream::search(
                &g,
                options.tiles,
                (false, bias),
                4,
                &mut setup.2,
                &options.search,
            )
        });
        let fronts: Vec<(bool, &(Vec<plan::GemmPlan>, usize))> =
            std::iter::once((false, &streamed))
                .chain(streamed_f16.iter().map(|f| (true, f)))
                .collect();
        let generated: usize = fronts.iter().map(|f| f.1 .1).sum();
        // Every streamed plan (the Pareto front trades cycles for
        // memory in order) is paired with the producer's best plan
        // beside it (the joint region-1 layout, GemmCosts::joint);
        // the pair with the fewest cycles wins. The producer planned in half of region 1
        // above: if its bounded f16 chains did not fit there it
        // fell back to f32, but in what a streamed consumer leaves
        // they may fit, at twice the AMP rate (the SigLIP MLP's
        // producer: 116,778 cycles in f32, 77,196 in chains).
        let producer_chains = chain_setups[0]
            .clone()
            .filter(|_| planned[0].4.is_none())
            .map(|(g, r, mut c)| {
                c.feeds_gemm = false;
                (g, r, c)
            });
        // The consumer receives the producer's result by exchange:
        // it stays in standard memory (lower::PlannedGemm::result_in_place).
        planned[0].2.feeds_gemm = false;
        // The producer may stream too, K split over tiles and its
        // partials reduce-scattered into row pieces that the
        // consumer's chunk steps gather: no tile then holds whole
        // rows of A (a host input is not copied to every column
        // part), at the cost of the reduce-scatter. Its setup is
        // the bounded-chain one when there is one (each K part is
        // one f16 chain: at least four parts, as for a single
        // GEMM), else its own; plans with one K part leave their
        // result in the C buffers, which no consumer reads.
        let stream_setup: Option<GemmSetup> = if planned[0].4.is_some() {
            Some((planned[0].0, planned[0].1.clone(), planned[0].2.clone()))
        } else {
            producer_chains
                .clone()
                .or_else(|| Some((planned[0].0, planned[0].1.clone(), planned[0].2.clone())))
        }
        // In a segment its plans do not see the other segments'
        // weights beside it: `compile` retries without when region
        // 1 overflows. (Its C buffers need no zeros at load, with
        // the segment's fill kernel, so they live only while the
        // segment runs.)
        .filter(|_| {
            matches!(groups[0].a, fuse::Source::Host(_))
                && (tile_count_override.is_none() || limits.streamed_producers)
        });
        let mut stream_setup = stream_setup.map(|(g, r, mut c)| {
            c.memory_budget = region1;
            c.joint = None;
            (g, r, c)
        });
        let producer_bias = groups[0].bias.is_some();
        // Plans with one K part leave their result in the C buffers.
        let split_k = |front: (Vec<plan::GemmPlan>, usize)| {
            let plans: Vec<plan::GemmPlan> = front
                .0
                .into_iter()
                .filter(|p| p.stream.is_some_and(|s| s.k_parts > 1))
                .collect();
            (plans, front.1)
        };
        // Alone, its fastest plan bounds what it can do beside any
        // consumer plan: the search beside one runs only when that
        // bound could win.
        let producer_alone = stream_setup.as_mut().map(|(g, _, c)| {
            split_k(stream::search(
                g,
                options.tiles,
                (true, producer_bias),
                stream_min_k_parts(g, true),
                c,
                &options.search,
            ))
        });
        let producer_bound = producer_alone
            .as_ref()
            .and_then(|f| f.0.first())
            .map(|p| p.estimate.compute_cycles);
        let mut producer_streamed: BTreeMap<stream::Beside, PlanFront> = BTreeMap::new();
        // (cycles, (f16 consumer, streamed index), producer front,
        // chains, the consumer's region 1 as the producer sees it,
        // the streamed producer plan chosen, if any)
        type Joint = (u64, u64, u64);
        type Pairing = (
            u64,
            (bool, usize),
            (Vec<plan::GemmPlan>, usize),
            bool,
            Joint,
            Option<stream::Beside>,
        );
        let mut best: Option<Pairing> = None;
        let candidates = fronts
            .iter()
            .flat_map(|(f16, front)| front.0.iter().enumerate().map(move |(i, c)| ((*f16, i), c)));
        // The producer's best plan beside each consumer footprint
        // (few distinct ones: often repeated).
        let mut producer_beside: BTreeMap<Joint, ((Vec<plan::GemmPlan>, usize), bool)> =
            BTreeMap::new();
        let mut chain_costs = producer_chains.as_ref().map(|c| c.2.clone());
        for (index, candidate) in candidates {
            // The producer's buffers beside this plan's, laid out
            // together as storage::place does.
            let joint = candidate.stream.map_or((0, 0, 0), |s| s.joint_r1);
            let (producer, chains) = producer_beside
                .entry(joint)
                .or_insert_with(|| {
                    let joint = Some(joint);
                    planned[0].2.memory_budget = region1;
                    planned[0].2.joint = joint;
                    let g0 = planned[0].0;
                    let mut producer =
                        plan::search(&g0, options.tiles, &mut planned[0].2, &options.search);
                    let mut chains = false;
                    if let (Some((geometry, _, _)), Some(costs)) =
                        (&producer_chains, chain_costs.as_mut())
                    {
                        costs.memory_budget = region1;
                        costs.joint = joint;
                        let front = plan::search(geometry, options.tiles, costs, &options.search);
                        let faster = |p: &plan::GemmPlan| {
                            producer.0.first().is_none_or(|q| {
                                p.estimate.compute_cycles < q.estimate.compute_cycles
                            })
                        };
                        if front.0.first().is_some_and(faster) {
                            producer = front;
                            chains = true;
                        }
                    }
                    (producer, chains)
                })
                .clone();
            // The fastest streamed producer plan that fits beside
            // this consumer plan (fronts are in cycle order).
            let whole_k = producer.0.first().map(|p| p.estimate.compute_cycles);
            let beside = stream::Beside {
                joint_r1: joint,
                standard: candidate.estimate.peak_standard_bytes,
            };
            let could_win = producer_bound.is_some_and(|b| {
                whole_k.is_none_or(|w| b < w)
                    && best
                        .as_ref()
                        .is_none_or(|x| b + candidate.estimate.compute_cycles < x.0)
            });
            let streamed_producer = match (could_win, stream_setup.as_mut()) {
                (true, Some((g, _, c))) => producer_streamed
                    .entry(beside)
                    .or_insert_with(|| {
                        split_k(stream::search_fit(
                            g,
                            options.tiles,
                            (true, producer_bias),
                            stream_min_k_parts(g, true),
                            stream::Fit::Beside(beside),
                            c,
                            &options.search,
                        ))
                    })
                    .0
                    .first()
                    .map(|p| p.estimate.compute_cycles),
                _ => None,
            };
            let (producer_cycles, streamed_beside) = match (whole_k, streamed_producer) {
                (Some(w), Some(s)) if s < w => (s, Some(beside)),
                (Some(w), _) => (w, None),
                (None, Some(s)) => (s, Some(beside)),
                (None, None) => continue,
            };
            let total = producer_cycles + candidate.estimate.compute_cycles;
            if best.as_ref().is_none_or(|b| total < b.0) {
                best = Some((total, index, producer, chains, joint, streamed_beside));
            }
        }
        if let Some((_, (f16, index), mut producer, mut chains, joint, streamed_beside)) = best {
            if let (Some(beside), Some(setup)) = (streamed_beside, stream_setup) {
                // The streamed producer replaces the whole-K front
                // (its setup and plans).
                let (front, generated) = producer_streamed
                    .remove(&beside)
                    .expect("searched beside this plan");
                let streamed_costs = setup.2.clone();
                let was_chain_setup = planned[0].4.is_none() && producer_chains.is_some();
                if was_chain_setup {
                    // The f32 setup stays the fallback, as for chains.
                    let (g, r, c) = setup;
                    let f32_costs = std::mem::replace(&mut planned[0].2, c);
                    planned[0].4 = Some((planned[0].0, planned[0].1.clone(), f32_costs));
                    planned[0].0 = g;
                    planned[0].1 = r;
                } else {
                    planned[0].2 = streamed_costs;
                }
                producer = (front, generated);
                chains = false;
                tracing::info!(
                    value = %planned[0].3,
                    k_parts = producer.0[0].stream.map_or(1, |s| s.k_parts),
                    "the producer streams K split over tiles; the consumer gathers its row pieces"
                );
            }
            let mut front = fronts[usize::from(f16)].1 .0.clone();
            if f16 {
                let (geometry, requests, costs) = planned[1]
                    .5
                    .take()
                    .expect("an f16 front comes from its setup");
                planned[1].0 = geometry;
                planned[1].1 = requests;
                planned[1].2 = costs;
                tracing::info!(
                    value = %planned[1].3,
                    "the streamed consumer accumulates in f16, one chain per K part"
                );
            }
            if let (true, Some((geometry, requests, mut costs))) = (chains, producer_chains) {
                costs.memory_budget = region1;
                costs.joint = Some(joint);
                let f32_costs = std::mem::replace(&mut planned[0].2, costs);
                let f32_setup = (planned[0].0, planned[0].1.clone(), f32_costs);
                planned[0].0 = geometry;
                planned[0].1 = requests;
                planned[0].4 = Some(f32_setup);
                tracing::info!(
                    value = %planned[0].3,
                    "the producer takes bounded f16 chains in what the streamed consumer leaves"
                );
            } else if streamed_beside.is_none() {
                planned[0].2.memory_budget = region1;
                planned[0].2.joint = Some(joint);
            }
            tracing::info!(
                consumer = %planned[1].3,
                streamed_candidates = generated,
                streamed_front_index = index,
                consumer_exclusive_bytes = joint.0,
                consumer_persistent_bytes = joint.1,
                consumer_phase_bytes = joint.2,
                producer_plans = producer.0.len(),
                "chain: the consumer streams K; the producer plans in what is left"
            );
            let chosen = front.remove(index);
            front.insert(0, chosen);
            own = vec![producer, (front, generated)];
            streamed_chain = true;
        }
        if !streamed_chain {
            tracing::info!(
                consumer = %planned[1].3,
                streamed_candidates = streamed.1,
                streamed_plans = streamed.0.len(),
                "chain: no streamed plan of the consumer leaves the producer a plan"
            );
        }
    }
    let exchanged = if streamed_chain {
        let total = own.iter().map(|f| f.0[0].estimate.compute_cycles).sum();
        Some((total, vec![0, 0]))
    } else {
        plan_exchanged_chain(&geometries, &producers, &own)?
    };
    let use_exchange = match (&exchanged, shared_cycles) {
        (Some(x), Some(s)) => x.0 < s,
        (Some(_), None) => true,
        (None, _) => false,
    };
    // A streamed pairing competes as the exchange candidate: the
    // shared rows may still be faster, and then they are chosen.
    let chosen = match (use_exchange, streamed_chain) {
        (true, true) => "streamed",
        (true, false) => "exchange",
        (false, _) => "shared_rows",
    };
    *chain_choice = Some(json!({
        "shared_rows_estimated_cycles": shared_cycles,
        "exchange_estimated_cycles": exchanged.as_ref().map(|x| x.0),
        "chosen": chosen,
    }));
    tracing::info!(
        shared_rows_estimated_cycles = shared_cycles.unwrap_or(0),
        exchange_estimated_cycles = exchanged.as_ref().map_or(0, |x| x.0),
        chosen,
        "chain hand-off candidates"
    );
    // Neither candidate found plans with each GEMM in an equal
    // share of region 1 (nor a streamed consumer): the chain then
    // shares region 1 by what each GEMM needs (plan_joint_chain).
    let joint = if exchanged.is_none() && shared_cycles.is_none() && groups.len() >= 2 {
        *joint_tried = true;
        plan_joint_chain(&shared_setups, &producers, options.tiles, &options.search)?
    } else {
        None
    };
    let fronts = if let Some(j) = joint {
        let chosen = if j.exchange {
            "exchange"
        } else {
            "shared_rows"
        };
        *chain_choice = Some(json!({
            "shared_rows_estimated_cycles": (!j.exchange).then_some(j.cycles),
            "exchange_estimated_cycles": j.exchange.then_some(j.cycles),
            "chosen": chosen,
            "region1": "joint",
        }));
        tracing::info!(
            estimated_cycles = j.cycles,
            candidates = j.candidates,
            chosen,
            "chain: no plans in equal shares of region 1; the GEMMs share it by what each needs"
        );
        *planned = j.planned;
        let candidates = j.candidates;
        let fronts = j
            .plans
            .into_iter()
            .zip(&consumers)
            .map(|(mut p, &consumer)| {
                if j.exchange && consumer {
                    // A consumer owns its A buffer but the host
                    // never writes it.
                    p.estimate.total_cycles -= p.estimate.host_in_cycles;
                    p.estimate.host_in_cycles = 0;
                }
                (vec![p], candidates)
            })
            .collect();
        if j.exchange {
            *a_by_exchange = consumers;
        }
        fronts
    } else if let (true, Some((_, choice))) = (use_exchange, exchanged) {
        *a_by_exchange = consumers;
        own.into_iter()
            .zip(choice)
            .map(|((mut front, n), i)| {
                // The chosen plan goes first; the rest keep their order.
                let chosen = front.remove(i);
                front.insert(0, chosen);
                // Its A operand comes from other tiles, not the host.
                (front, n)
            })
            .collect()
    } else {
        *planned = shared_setups;
        for (p, &c) in planned.iter_mut().zip(&consumers) {
            p.2.owns_a &= !c;
        }
        shared
    };
    Ok(fronts)
}

/// The fronts of an attention's projections beside the best attention
/// candidate whose remaining tiles fit every projection (the proxy that
/// ranked the candidates knows no memory), with that candidate.
pub(crate) fn projection_fronts(
    cx: &GemmContext,
    library: &mut KernelLibrary,
    b: &AttentionBlock,
    planned: &mut [PlannedGemm],
    attention_kernels: Option<&AttentionKernels>,
    attention_candidates: &[AttentionPlan],
) -> Result<(AttentionPlan, Vec<PlanFront>), CompileError> {
    let GemmContext {
        graph,
        options,
        groups,
        tile_count_override,
        sole_block_segment,
        weights_joined,
        weights_moved,
        region1,
        group_tiles,
        shared_projections,
        ..
    } = *cx;
    // The best attention candidate whose remaining tiles fit every
    // projection (the proxy that ranked them knows no memory).
    // The projections run first, side by side on shares of the
    // tiles that make the slowest fastest; the attention then uses the same tiles, its buffers
    // sharing memory with the projections' scratch (phases), so the
    // projections' persistent buffers get what the attention leaves.
    let mut chosen = None;
    let element = ipu_arch::INTERLEAVED_ELEMENT_BYTES as u64;
    // With bounded f16 chains first; if no candidate leaves the
    // projections a plan, again with their f32 fallbacks.
    for attempt in 0..2 {
        if attempt == 1 {
            // Every projection falls back (no short circuit).
            let fell_back = planned
                .iter_mut()
                .filter_map(|p| use_f32_fallback(p).then_some(()))
                .count();
            if fell_back == 0 {
                break;
            }
        }
        // The column layout takes the Q and V results transposed
        // from their reduce steps (TR=1, chosen in `plan_and_lower`
        // after this phase), slower than TR=0:
        // those projections are planned with its formula.
        let own_reduce: Vec<Option<gemm::FormulaCost>> =
            planned.iter().map(|p| p.2.reduce.clone()).collect();
        let transpose_formula = attention_kernels.as_ref().map(|k| k.transpose.1.clone());
        let mut transposed_reduce: Vec<Option<gemm::FormulaCost>> = vec![None; planned.len()];
        for g in [b.q, b.v] {
            if let Some(tr) = planned[g].1 .1.as_ref().and_then(transposed_reduce_request) {
                transposed_reduce[g] = kernel_formula(library, &tr, &["ROWS", "QUADS", "P"]).ok();
            }
        }
        for c in attention_candidates {
            let left = region1.saturating_sub(c.region1_bytes) / element * element;
            // Projections sharing the tiles each get a share of
            // what the attention leaves.
            let left = if shared_projections {
                left / planned.len() as u64 / element * element
            } else {
                left
            };
            for (g, p) in planned.iter_mut().enumerate() {
                p.2.persistent_budget = Some(left);
                (p.2.reduce, p.2.reduce_row_align) = match (&c.layout, &transposed_reduce[g]) {
                    (attention::AttentionLayout::Columns, Some(f)) => {
                        (Some(f.clone()), TRANSPOSED_REDUCE_ROW_ALIGN)
                    }
                    _ => (own_reduce[g].clone(), 1),
                };
                // Q and V in the column layout without a
                // transposed reduce are transposed on their tiles
                // (attention_cols::lower), and so is K in the row
                // layout (K^T, attention::lower), and Q and V too
                // there when odd heads are staged: whole-K plans and
                // their shares weigh that step. Streamed plans weigh
                // no transpose, and take shares that leave K^T out:
                // shares that gave K more tiles for it gave K
                // another grid than Q and V, so that the three no
                // longer shared the homes of `x` (e2e_attention's
                // rows_stream 47,571 -> 54,373 cycles, session 30).
                // Unweighed, K^T cost random model 261374 (cross
                // attention, 64 tiles) 900 cycles: K took 5 x 2
                // tiles at an estimated 2,034 cycles and its step ran
                // about 3,600.
                let transposed_on_tiles = (c.layout == attention::AttentionLayout::Columns
                    && (g == b.q || g == b.v)
                    && transposed_reduce[g].is_none())
                    || (c.layout == attention::AttentionLayout::Rows
                        && (g == b.k || (b.staged() && (g == b.q || g == b.v))));
                p.2.transpose = transposed_on_tiles
                    .then(|| transpose_formula.clone())
                    .flatten();
            }
            // In the model's only block segment the join moves the
            // projections' A rows and no weights (those stay where
            // the plans put them): the plans weigh that copy, as a
            // single GEMM's do (fp8 SigLIP attention 115,811 ->
            // 110,591 cycles). With several block segments the join
            // may move the weights too, which the plans do not see
            // (weighing A alone made the ViT block slower: 400,175
            // -> 408,071), so there they weigh nothing.
            // When the join moves the weights too (`weights_joined`),
            // the plans weigh both: a whole-K plan receives its rows
            // and its columns of the weights (the ViT block's
            // projections, 13 x 36 tiles: 50,700 cycles of their
            // join), a streamed one its A homes and its resident
            // chunks of B.
            if tile_count_override.is_some() && (sole_block_segment || weights_joined) {
                for (p, g) in planned.iter_mut().zip(groups) {
                    if matches!(g.a, fuse::Source::Host(_)) {
                        p.2.a_copied = true;
                        p.2.a_joined = true;
                    }
                    p.2.b_joined = weights_moved;
                }
            } else if tile_count_override.is_none() && !shared_projections {
                // Outside segments, projections on disjoint tiles
                // that read one host input need its copy step
                // whatever their plans (the host writes it once):
                // a whole-K plan's rows ride in it without a sync
                // of their own (random model 264324, f32
                // projections on 97 tiles: the 12 x 2 plan, charged
                // that sync, lost to 12 x 1 and ran 9,558 cycles
                // where it runs 8,764). The copies of other host
                // inputs ride in that step too (a cross attention's
                // `x` beside its `kv`: random model 262266).
                let step_runs = groups.iter().any(|g| {
                    matches!(g.a, fuse::Source::Host(_))
                        && groups.iter().filter(|o| o.a == g.a).count() > 1
                });
                for (p, g) in planned.iter_mut().zip(groups) {
                    if p.2.a_copied && matches!(g.a, fuse::Source::Host(_)) && step_runs {
                        p.2.a_copy_shared = true;
                    }
                }
            }
            // Tile shares that make the slowest projection fastest.
            // In a segment the projections' A rows arrive by the
            // join's exchange, which the shares do not weigh (finer
            // row parts receive more per tile: the fp8 SigLIP
            // attention's x8 exchange took 35,000 cycles on them
            // against 16,400 on thirds): there, equal thirds.
            let mut copy_bound = None;
            let shares = if shared_projections {
                vec![options.tiles; planned.len()]
            } else if tile_count_override.is_some() {
                vec![group_tiles; planned.len()]
            } else {
                let mut items: Vec<(&gemm::GemmGeometry, &mut gemm::GemmCosts)> =
                    planned.iter_mut().map(|p| (&p.0, &mut p.2)).collect();
                let prefix = Some((c.tiles, c.prefix_cycles));
                let Some((shares, bound)) =
                    plan::side_by_side_shares(&mut items, options.tiles, &options.search, prefix)
                else {
                    continue;
                };
                copy_bound = Some(bound);
                shares
            };
            // The plans within the shares keep their copies within
            // the bound the shares were chosen with.
            let mut fronts: Vec<(Vec<plan::GemmPlan>, usize)> = planned
                .iter_mut()
                .zip(&shares)
                .map(|(p, &t)| {
                    p.2.copy_bound = copy_bound;
                    let front = plan::search(&p.0, t, &mut p.2, &options.search);
                    p.2.copy_bound = None;
                    front
                })
                .collect();
            // Under caps on resident weights (`b_cap`) whole-K
            // projections may find no plan where streamed ones,
            // whose tiles keep a K part of B, do.
            let whole_k_fits = fronts.iter().all(|f| !f.0.is_empty());
            let capped = planned.iter().any(|p| p.2.b_cap.is_some());
            if whole_k_fits || capped {
                // The projections may stream K split over their
                // tiles instead (a host input in a model of one
                // segment): a tile then receives a K part of its
                // rows of `x`, not whole rows, and the partials'
                // reduce-scatter leaves row pieces, which the
                // attention's exchange takes like any result rows
                // (in the column layout Q and V reduced transposed,
                // TR=1, chosen in `plan_and_lower` after this phase).
                let streamed = ((tile_count_override.is_none() || weights_joined)
                    && !shared_projections
                    && groups.iter().all(|g| matches!(g.a, fuse::Source::Host(_))))
                .then(|| {
                    // The streamed plans weigh no transpose, and
                    // the three share the homes of `x` only on like
                    // grids: their shares leave K's K^T out.
                    let streamed_shares = if c.layout == attention::AttentionLayout::Rows
                        && tile_count_override.is_none()
                    {
                        let kept: Vec<_> =
                            planned.iter_mut().map(|p| p.2.transpose.take()).collect();
                        let mut items: Vec<(&gemm::GemmGeometry, &mut gemm::GemmCosts)> =
                            planned.iter_mut().map(|p| (&p.0, &mut p.2)).collect();
                        let s = plan::side_by_side_shares(
                            &mut items,
                            options.tiles,
                            &options.search,
                            Some((c.tiles, c.prefix_cycles)),
                        )
                        .map(|s| s.0);
                        for (p, t) in planned.iter_mut().zip(kept) {
                            p.2.transpose = t;
                        }
                        s
                    } else {
                        Some(shares.clone())
                    };
                    streamed_shares.and_then(|s| {
                        streamed_projections(planned, &s, (groups, left), &options.search)
                            .map(|(f, cycles)| (f, cycles, s))
                    })
                })
                .flatten();
                let whole_k = if whole_k_fits {
                    whole_k_projection_cycles(&fronts)
                } else {
                    u64::MAX
                };
                let mut shares = shares;
                let mut fit = whole_k_fits;
                let mut projection_estimate = whole_k;
                if let Some((streamed_fronts, cycles, streamed_shares)) = streamed {
                    tracing::info!(
                        whole_k_estimated_cycles = whole_k,
                        streamed_estimated_cycles = cycles,
                        chosen = if cycles < whole_k {
                            "streamed"
                        } else {
                            "whole_k"
                        },
                        "projection plans: whole K with one copy of x, or K split over tiles"
                    );
                    if cycles < whole_k {
                        fronts = streamed_fronts;
                        shares = streamed_shares;
                        fit = true;
                        projection_estimate = cycles;
                    }
                }
                if fit {
                    // The candidates weigh the projections as if
                    // they had their tiles' memory to themselves;
                    // beside a plan that fills region 1 they may
                    // take far longer (the Whisper large encoder's
                    // attention with compact buffers: 254,016
                    // cycles where 108,696 were assumed, 564,818 in
                    // all against 464,547 with the projections in
                    // segments of their own). Such a plan is
                    // marked, and `compile_from` compiles the
                    // segmented model too. Not for a few
                    // thousand cycles: segments add a join and
                    // steps of their own (models/attention_small on
                    // 64 tiles: 2,274 cycles of projections where 90
                    // were assumed, 8,693 in all, segmented 13,556).
                    let mut c = c.clone();
                    if tile_count_override.is_none()
                        && projection_estimate > 2 * c.projection_cycles
                        && projection_estimate - c.projection_cycles
                            > PROJECTIONS_OVER_ASSUMPTION_MIN
                    {
                        c.projections_planned_over = Some(projection_estimate);
                    }
                    chosen = Some((c, fronts, shares));
                    break;
                }
            }
        }
        if chosen.is_some() {
            break;
        }
    }
    let Some((c, fronts, shares)) = chosen else {
        return Err(CompileError::NoFeasiblePlan {
            value: graph.value(b.attention).name.clone(),
            reason: format!(
                "none of {} query blockings leaves tiles on which the projections fit ({} tiles in all)",
                attention_candidates.len(),
                options.tiles
            ),
        });
    };
    crate::plan_attention::log_chosen(&c, Some(&shares));
    Ok((c, fronts))
}

/// The fronts of independent GEMMs, each planned on its own over the
/// group's tiles (a single GEMM with host operands also streamed).
pub(crate) fn independent_fronts(
    cx: &GemmContext,
    library: &mut KernelLibrary,
    planned: &mut [PlannedGemm],
    would_help: &mut Vec<serde_json::Value>,
) -> Vec<PlanFront> {
    let GemmContext {
        options,
        groups,
        group_tiles,
        ..
    } = *cx;
    // A GEMM whose operands do not fit beside each other with K
    // whole on a tile streams K through the tiles in chunks (a
    // single GEMM with host operands; chains and attention
    // projections keep K whole).
    let single = groups.len() == 1 && matches!(groups[0].a, fuse::Source::Host(_));
    // An f16-accumulated streamed GEMM may split K over tiles when
    // the library can sum f16 partials (reduce_f32 IN=16); without
    // it, such plans are not candidates.
    let mut missing_f16_partials = None;
    let f16_partials = match planned.first() {
        Some(p) if single && !p.0.acc32 && p.1 .1.is_none() => {
            let request = reduce_request_f16_partials(library, 0, false);
            match kernel_formula(library, &request, &["ROWS", "QUADS", "P"]) {
                Ok(f) => Some((request, f)),
                Err(_) => {
                    missing_f16_partials = Some(request);
                    None
                }
            }
        }
        _ => None,
    };
    planned
        .iter_mut()
        .map(|p| {
            let mut front = plan::search(&p.0, group_tiles, &mut p.2, &options.search);
            if front.0.is_empty() && use_f32_fallback(p) {
                front = plan::search(&p.0, group_tiles, &mut p.2, &options.search);
            }
            // Streamed plans (K in chunks from homes, or split over
            // tiles) when no whole-K plan fits, and beside the
            // whole-K ones when A is copied from one copy anyway:
            // a K part needs fewer of A's columns on a tile.
            let whole_k = !front.0.is_empty();
            if single && (!whole_k || p.2.a_copied) {
                if !whole_k {
                    if let Some(request) = &missing_f16_partials {
                        tracing::info!(
                            value = %p.3,
                            kernel = %request,
                            "the kernel library lacks a specialisation that would help"
                        );
                        would_help.push(json!({
                            "kernel": request.to_string(),
                            "value": p.3,
                            "why": "the f16 partials of a streamed GEMM whose K is split over tiles are summed by this specialisation; without it the plans keep K on one tile per block",
                        }));
                    }
                }
                let saved = (p.1 .1.clone(), p.2.reduce.clone());
                let bias = groups[0].bias.is_some();
                if let Some((request, formula)) = f16_partials.clone() {
                    p.1 .1 = Some(request);
                    p.2.reduce = Some(formula);
                }
                let min_k_parts = stream_min_k_parts(&p.0, false);
                let streamed = stream::search(
                    &p.0,
                    group_tiles,
                    (true, bias),
                    min_k_parts,
                    &mut p.2,
                    &options.search,
                );
                let cycles = |f: &(Vec<plan::GemmPlan>, usize)| f.0.first().map(|c| c.estimate.compute_cycles);
                if whole_k && cycles(&streamed).is_none_or(|s| Some(s) >= cycles(&front)) {
                    (p.1 .1, p.2.reduce) = saved;
                    return (front.0, front.1 + streamed.1);
                }
                tracing::info!(
                    value = %p.3,
                    candidates = streamed.1,
                    feasible = streamed.0.len(),
                    whole_k_fits = whole_k,
                    "streamed plans (K in chunks over exchange steps)"
                );
                // The f16-partials reduce only runs when K is split.
                if !p.0.acc32
                    && !p.0.reduce_f16
                    && streamed.0.first().and_then(|c| c.stream).is_none_or(|s| s.k_parts == 1)
                {
                    p.1 .1 = None;
                    p.2.reduce = None;
                }
                return (streamed.0, front.1 + streamed.1);
            }
            front
        })
        .collect()
}

/// Each GEMM's report with its chosen plan (the first of its front), its
/// retained finalists logged; an error naming the GEMM whose front is
/// empty.
pub(crate) fn operation_reports(
    cx: &GemmContext,
    library: &mut KernelLibrary,
    planned: &[PlannedGemm],
    fronts: Vec<PlanFront>,
    joint_tried: bool,
    would_help: &mut Vec<serde_json::Value>,
) -> Result<Vec<OperationReport>, CompileError> {
    let GemmContext {
        graph,
        options,
        groups,
        share,
        group_tiles,
        shares_tiles,
        chained,
        ..
    } = *cx;
    let mut reports = Vec::new();
    for ((geometry, (request, reduce), _, value, _, _), (front, candidates)) in
        planned.iter().zip(fronts)
    {
        if let Some(r) = reduce {
            note_missing_f16_sum(library, r, value, would_help);
        }
        let Some(chosen) = front.first().cloned() else {
            return Err(CompileError::NoFeasiblePlan {
                value: value.clone(),
                reason: format!(
                    "none of {candidates} partitions of [{}, {}] x [{}, {}] over at most {} tiles fits {share} bytes of interleaved memory per tile{}",
                    geometry.m, geometry.k, geometry.k, geometry.n, group_tiles,
                    if chained && joint_tried {
                        format!(
                            " (neither with whole rows per tile for the chain nor with a plan of its own and an exchange hand-off, in equal shares of region 1 or sharing all {} bytes of it)",
                            ipu_arch::REGION1_END - ipu_arch::REGION1_BASE
                        )
                    } else if chained {
                        " (neither with whole rows per tile for the chain nor with a plan of its own and an exchange hand-off)".to_string()
                    } else if shares_tiles {
                        format!(" (its share of region 1 beside the {} other GEMMs on the same tiles, with its element-exclusive buffers in whole 32 KiB memory elements)", groups.len() - 1)
                    } else {
                        String::new()
                    }
                ),
            });
        };
        let finalists: Vec<plan::GemmPlan> = front
            .iter()
            .take(options.search.finalists)
            .cloned()
            .collect();
        for (i, f) in finalists.iter().enumerate() {
            let e = &f.estimate;
            tracing::info!(
                finalist = i,
                value = %value,
                values = graph.values().len(),
                operations = graph.nodes().len(),
                row_parts = f.row_parts,
                col_parts = f.col_parts,
                estimated_cycles = e.total_cycles,
                estimated_compute_cycles = e.compute_cycles,
                estimated_exchange_cycles = f.stream.map_or(0, |s| s.exchange_cycles),
                estimated_copy_cycles = e.copy_cycles,
                k_chunk_blocks = f.stream.map_or(0, |s| s.chunk_blocks),
                k_steps = f.stream.map_or(1, |s| s.steps),
                k_parts = f.stream.map_or(1, |s| s.k_parts),
                exchange_row_bytes = 0,
                peak_standard_bytes = e.peak_standard_bytes,
                peak_interleaved_bytes = e.peak_interleaved_bytes,
                peak_total_bytes = e.peak_standard_bytes + e.peak_interleaved_bytes,
                active_tile_counts = %format!("{{{}}}", e.active_tiles),
                "retained operator-plan finalist"
            );
        }
        reports.push(OperationReport {
            value: value.clone(),
            operation: "gemm".into(),
            shape: [geometry.m, geometry.k, geometry.n],
            kernel: match reduce {
                Some(c) => format!("{request} + {c}"),
                None => request.to_string(),
            },
            candidates,
            chosen,
            finalists,
        });
    }
    Ok(reports)
}
