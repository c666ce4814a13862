//! The `plan_attention` phase of a segment's driver
//! ([`crate::plan_and_lower`]): whether each attention block's V carries a
//! ones column, the block's kernels with their cycle formulas, and the
//! ranked attention plans (both layouts, unless the options force one),
//! of which the retained finalists are logged.

use crate::attention::{self, AccKernels, AttentionBlock, AttentionKernels, AttentionPlan};
use crate::library::{KernelLibrary, KernelRequest};
use crate::{
    attention_cols, fuse, kernel_formula, plan, Accumulation, CompileError, CompileOptions,
    SegmentLimits,
};
use ipu_graph::Graph;
use serde_json::json;

/// Decides for each f16 block whether V carries a ones column
/// ([`AttentionBlock::ones`]): it picks the block's online and merge
/// kernels, by their formulas and the P V GEMM's ([`attention::ones_pays`]):
/// without the merge step where the library has the accumulating plans'
/// kernels and the options do not rule those plans out (`accumulate`,
/// [`crate::CompileOptions::attention_accumulate`]), with it otherwise.
pub(crate) fn choose_ones_columns(
    library: &mut KernelLibrary,
    blocks: &mut [AttentionBlock],
    accumulate: Option<bool>,
) -> Result<(), CompileError> {
    for b in blocks.iter_mut().filter(|b| !b.f32) {
        let gemm = &attention::kernel_requests(b)[0];
        let mut gemm = kernel_formula(library, gemm, attention::FORMULA_VARS[0])?;
        let mut pair = |ones| -> Result<_, CompileError> {
            let [online, merge] = attention::online_and_merge_requests(b, ones);
            Ok((
                kernel_formula(library, &online, attention::FORMULA_VARS[1])?,
                kernel_formula(library, &merge, attention::FORMULA_VARS[2])?,
            ))
        };
        let (mut online_sums, mut merge_sums) = pair(false)?;
        let (mut online_ones, mut merge_ones) = pair(true)?;
        let mut acc_online = |ones| {
            let [online, _] = attention::acc_requests(b, ones);
            kernel_formula(library, &online, attention::FORMULA_VARS[1]).ok()
        };
        let acc = match accumulate {
            Some(false) => None,
            _ => acc_online(false).zip(acc_online(true)),
        };
        b.ones = attention::ones_pays(
            b,
            &mut gemm,
            (&mut online_sums, &mut merge_sums),
            (&mut online_ones, &mut merge_ones),
            acc,
        );
    }
    Ok(())
}

/// The kernels of `b` with their cycle formulas, the column layout's too
/// when the block can take that layout and the library has every one of
/// them (else the report's `would_help` names the one it lacks); the
/// online kernel of plans that accumulate P V into O unless `accumulate`
/// ([`crate::CompileOptions::attention_accumulate`]) rules them out, and
/// an options error when it asks for them and the library lacks them.
pub(crate) fn attention_kernels(
    graph: &Graph,
    library: &mut KernelLibrary,
    b: &AttentionBlock,
    accumulate: Option<bool>,
    would_help: &mut Vec<serde_json::Value>,
) -> Result<AttentionKernels, CompileError> {
    let value = &graph.value(b.attention).name;
    let requests = attention::kernel_requests(b);
    let mut f = Vec::new();
    for (r, vars) in requests.iter().zip(attention::FORMULA_VARS) {
        f.push((r.clone(), kernel_formula(library, r, vars)?));
    }
    let mut it = f.into_iter();
    let mut next = || it.next().expect("eight kernels");
    // The online and final kernels of plans whose P V accumulates into O
    // (f16 or f32 blocks alike), when the library has them.
    let acc = match accumulate {
        Some(false) => None,
        forced => match acc_formulas(library, &attention::acc_requests(b, b.ones)) {
            Ok(kernels) => Some(kernels),
            Err(lacking) if forced == Some(true) => {
                let (r, e) = *lacking;
                return Err(CompileError::Options {
                    message: format!("attention_merge=accumulate for `{value}`: the kernel library lacks {r} ({e})"),
                });
            }
            Err(lacking) => {
                let (r, e) = *lacking;
                lacking_kernel(
                    value,
                    (&r, &e),
                    "the kernel library lacks a kernel that lets P V accumulate into O; planning with a merge step",
                    "the row layout's P V accumulates into O with it, without a merge step after every key block",
                    would_help,
                );
                None
            }
        },
    };
    // The column layout's kernels, when the block can take that
    // layout and the library has every one of them.
    let columns = if attention_cols::applies(b) {
        let mut c = Vec::new();
        for (r, vars) in attention_cols::kernel_requests()
            .iter()
            .zip(attention_cols::FORMULA_VARS)
        {
            match kernel_formula(library, r, vars) {
                Ok(formula) => c.push((r.clone(), formula)),
                Err(e) => {
                    // A library that lacks one of these kernels
                    // (a Bazel library once left out fill32) costs
                    // the attention its faster layout, so the log
                    // warns and the report names the kernel.
                    lacking_kernel(
                        value,
                        (r, &e),
                        "the kernel library lacks a kernel of the column attention layout; planning without that layout",
                        "the column attention layout (keys as the GEMMs' streamed rows) needs it; without it the attention takes the row layout",
                        would_help,
                    );
                    break;
                }
            }
        }
        (c.len() == attention_cols::FORMULA_VARS.len()).then(|| {
            let mut it = c.into_iter();
            let mut next = || it.next().expect("eight kernels");
            attention_cols::ColumnKernels {
                gemm: next(),
                reduce: next(),
                colmax: next(),
                softmax: next(),
                final_: next(),
                fill_rows: next(),
                copy: next(),
                mask: next(),
            }
        })
    } else {
        None
    };
    Ok(attention::AttentionKernels {
        gemm: next(),
        online: next(),
        merge: next(),
        acc,
        acc_only: accumulate == Some(true),
        final_: next(),
        fill: next(),
        transpose: next(),
        combine: next(),
        fill_rows: next(),
        columns,
    })
}

/// The accumulating plans' online and final kernels ([`attention::acc_requests`])
/// with their formulas, or the first one the library lacks.
fn acc_formulas(
    library: &mut KernelLibrary,
    [online, final_]: &[KernelRequest; 2],
) -> Result<AccKernels, Box<(KernelRequest, CompileError)>> {
    let mut formula = |r: &KernelRequest, vars| {
        kernel_formula(library, r, vars)
            .map(|f| (r.clone(), f))
            .map_err(|e| Box::new((r.clone(), e)))
    };
    Ok(AccKernels {
        online: formula(online, attention::FORMULA_VARS[1])?,
        final_: formula(final_, attention::FORMULA_VARS[3])?,
    })
}

/// A kernel the library lacks that a faster plan of attention `value`
/// would use: a warning in the log (`log`) and the report's `would_help`
/// entry, which says `why`.
fn lacking_kernel(
    value: &str,
    (kernel, error): (&KernelRequest, &CompileError),
    log: &str,
    why: &str,
    would_help: &mut Vec<serde_json::Value>,
) {
    tracing::warn!(value = %value, kernel = %kernel, error = %error, "{log}");
    would_help.push(json!({
        "kernel": kernel.to_string(),
        "value": value,
        "why": why,
    }));
}

/// The attention plans of `b` on `options.tiles` tiles, best first, with
/// the segment's limits on regions 0 and 1 (`tile_count_override`: a
/// segment of a segmented model); an error naming the block when none
/// fits, or when the options force a layout it cannot take.
pub(crate) fn plan_attention(
    graph: &Graph,
    options: &CompileOptions,
    groups: &[fuse::Group],
    b: &AttentionBlock,
    k: &mut AttentionKernels,
    tile_count_override: Option<u32>,
    limits: SegmentLimits,
) -> Result<Vec<AttentionPlan>, CompileError> {
    let segment_attention_region0 = limits.attention_region0;
    let macs: u64 = groups
        .iter()
        .map(|g| {
            let node = graph.node(g.gemm);
            let (a, bt) = (graph.ty(node.args[0]), graph.ty(node.args[1]));
            a.shape.dims()[0] as u64 * a.shape.dims()[1] as u64 * bt.shape.dims()[1] as u64
        })
        .max()
        .unwrap_or(0);
    // A proxy for the projections, side by side on equal shares of
    // the tiles: the AMP rate of their accumulation (f16 chains
    // unless f32 is asked for) at the 72% efficiency measured for
    // SigLIP-size projections (docs/compiler.md); the projections
    // themselves are planned exactly once the attention candidate
    // is chosen. It ranks nothing (every candidate gets the same).
    let per_group = groups.len().max(1) as u64;
    let rate = match options.accumulation {
        Accumulation::F32 => ipu_arch::AMP_MACS_F16_F32,
        _ => ipu_arch::AMP_MACS_F16_F16,
    };
    let proxy = (macs * per_group * 100).div_ceil(options.tiles as u64 * rate as u64 * 72);
    // The column layout's key splits each combine a range of head
    // columns, so every split's tile writes part of each output
    // row. A segment's output goes on to the next segment through
    // a join, whose exchange tables (in region 0, which segments
    // do not share) grow with every piece: once a compile has
    // overflowed region 0 (and `compile` cut the attention's share),
    // split 0 combines whole rows instead (the ViT block fits at
    // the first attempt, where the distributed combine saves it
    // 11,100 of 465,281 cycles).
    let distributed_combine =
        tile_count_override.is_none() || segment_attention_region0 >= plan::STANDARD_BUDGET / 2;
    // The attention leaves room in region 1 for region 0's
    // overflow once `compile` has found that it needs some, and
    // region 0 to what outlives it (a segment's joins' exchange
    // tables; the homes of attention over inputs and the code of
    // many rounds and key chunks): see `compile_from`, which cuts
    // this budget when region 0 overflows. Both are at their
    // defaults at the first attempt.
    let region1_cap =
        (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64 - limits.region1_reserve;
    let region0_cap =
        if tile_count_override.is_some() || segment_attention_region0 < plan::STANDARD_BUDGET / 2 {
            segment_attention_region0
        } else {
            u64::MAX
        };
    // Once region 0 has overflowed beside the first attempt's
    // best plan, the other buffers' part of that overflow is the
    // overflow less that plan's region 0 (planned again under the
    // first attempt's limits, which these equal but for the
    // reserve), and each candidate leaves region 1 what its own
    // region 0 adds to it, within the reserve: a fixed reserve
    // sized by the first plan's overflow took region 1 from
    // plans that keep less region 0 (the f32 attention of 1,024
    // tokens on 8 tiles). Only in a model of one segment, whose
    // other buffers are the operands' homes: a segment's joins
    // and neighbours change with every plan (512 tokens of 4
    // heads, projected, on 8 tiles overflowed by 66,664 bytes
    // more than its first plan said).
    let region1 = (ipu_arch::REGION1_END - ipu_arch::REGION1_BASE) as u64;
    let room = match limits.first_region0_overflow {
        Some(over) if limits.region1_reserve > 0 && tile_count_override.is_none() => {
            attention::plan(
                b,
                options.tiles,
                k,
                proxy,
                distributed_combine,
                (region1, region0_cap),
                None,
            )
            .first()
            .map(|first| attention::OverflowRoom {
                others_excess: over as i64 - first.region0_bytes as i64
                    + limits.overflow_slack as i64,
                reserve: limits.region1_reserve,
            })
        }
        _ => None,
    };
    let mut attention_candidates = attention::plan(
        b,
        options.tiles,
        k,
        proxy,
        distributed_combine,
        (
            if room.is_some() { region1 } else { region1_cap },
            region0_cap,
        ),
        room,
    );
    // Both layouts compete on their estimates unless one is asked for.
    if let Some(layout) = options.attention_layout {
        attention_candidates.retain(|c| c.layout == layout);
    }
    // A forced layout the block cannot take is the options' fault:
    // say which option, which value and why.
    if options.attention_layout == Some(attention::AttentionLayout::Columns) && k.columns.is_none()
    {
        let value = &graph.value(b.attention).name;
        return Err(CompileError::Options {
            message: if attention_cols::applies(b) {
                format!("attention_layout=columns for `{value}`: the column layout needs the kernels colmax_f16 IN=32, softmax_cols IN=32, attention_cols_final, fill_rows, copy64 and fill32, which the kernel library lacks")
            } else {
                format!(
                    "attention_layout=columns for `{value}`: the column layout takes f16 attention whose q, k and v heads have one size, a multiple of 4; `{value}` is {} {} with heads of {} (v: {}); the row layout (attention_layout=rows or auto) takes it",
                    if b.causal { "causal" } else { "non-causal" },
                    if b.f32 { "f32" } else { "f16" },
                    b.d,
                    b.dv
                )
            },
        });
    }
    let Some(_) = attention_candidates.first() else {
        let reason = if b.heads > options.tiles {
            format!(
                "{} heads over {} tiles run in rounds, and no round's query blocking fits a tile's memory with its query state, a chunk of its keys' K^T and V and the code of its steps ({} keys)",
                b.heads, options.tiles, b.sk
            )
        } else {
            format!(
                "no query blocking of {} heads x {} queries over at most {} tiles fits a tile's memory with its query state, a chunk of its keys' K^T and V and the code of its steps, in {} rounds at most ({} keys)",
                b.heads,
                b.sq,
                options.tiles,
                attention::MAX_QUERY_ROUNDS,
                b.sk
            )
        };
        return Err(CompileError::NoFeasiblePlan {
            value: graph.value(b.attention).name.clone(),
            reason,
        });
    };
    for (i, c) in attention_candidates
        .iter()
        .take(options.search.finalists)
        .enumerate()
    {
        tracing::info!(
            finalist = i,
            value = %graph.value(b.attention).name,
            layout = ?c.layout,
            query_blocks = c.query_blocks,
            rows = c.rows,
            key_splits = c.key_splits.len(),
            key_blocks = c.key_blocks.len(),
            attention_tiles = c.tiles,
            estimated_cycles = c.total_cycles(),
            estimated_compute_cycles = c.compute_cycles,
            estimated_exchange_cycles = c.exchange_bound_cycles,
            estimated_projection_cycles = c.projection_cycles,
            peak_interleaved_bytes = c.region1_bytes,
            region0_bytes = c.region0_bytes,
            "retained attention-plan finalist"
        );
    }
    Ok(attention_candidates)
}

/// Logs the chosen attention plan with the projections' tile shares, or
/// as over host inputs (no projections) when there are none.
pub(crate) fn log_chosen(c: &AttentionPlan, projection_tiles: Option<&[u32]>) {
    tracing::info!(
        layout = ?c.layout,
        query_blocks = c.query_blocks,
        key_splits = c.key_splits.len(),
        attention_tiles = c.tiles,
        rounds = c.rounds,
        compact = c.compact,
        operands = if projection_tiles.is_some() { "projections" } else { "host inputs" },
        projection_tiles = ?projection_tiles.unwrap_or_default(),
        "attention plan chosen"
    );
}
