//! Transpose segments ([`crate::segment`]): `transpose(x)` of a rank-2
//! f16 or f32 value, which `legalize` inserts for a GEMM operand that is
//! read transposed but computed on the device (a model may also write it).
//!
//! Plan: the segment's transposes run side by side in one compute step
//! (a round; more transposes than tiles take several rounds), each on a
//! share of the tiles in proportion to its elements. A tile of a transpose
//! holds a range of whole rows of its operand `[M, N]`, an even number of
//! at least [`MIN_ROWS`] unless its share of the tiles needs more each (so
//! that every run it exports starts on a 4-byte word), in rows padded to 8
//! bytes, which the join's exchange fills from the producer's placements.
//! `transpose_f16` or `transpose_f32` (one vertex per range of columns,
//! at most six) writes the tile's block of the result: for each of the N
//! result rows, the run of the tile's r1 - r0 elements, in rows padded to 8
//! bytes with zeros, so that the exchange moves the runs in whole words
//! and a consumer's padding lanes stay zero.
//!
//! Storage: both buffers anywhere (the kernels make no 128-bit loads),
//! live for the segment. The result's runs are its placements: run c of
//! a tile holding rows r0..r1 sits at byte `(c * M + r0) * eb` of the result.

use crate::attention::{transpose_column_ranges, transpose_vertex, transposed_row_stride};
use crate::error::CompileError;
use crate::gemm::FormulaCost;
use crate::library::{KernelLibrary, KernelRequest};
use crate::lower::{
    push_coalesced, BufferSpec, HostPlacement, HostTensor, HostTensors, Lowered, RegionReq,
};
use ipu_graph::{DType, Graph, Op, ValueDef, ValueId};
use serde_json::json;
use std::collections::BTreeMap;

/// Fewest operand rows on a tile unless the tile share needs more: each
/// tile exports one run per result row, so short runs multiply the join's
/// transfers (and the exchange's descriptors) for little compute saved.
pub const MIN_ROWS: u32 = 16;

/// One transpose of the segment and where it runs.
struct Planned {
    operand: ValueId,
    result: ValueId,
    /// Operand rows and columns.
    m: u32,
    n: u32,
    /// Bytes per element (2 or 4).
    eb: u32,
    /// First tile and the row range of each of its tiles.
    first_tile: u32,
    rows: Vec<(u32, u32)>,
    /// The compute step (round) it runs in.
    round: usize,
}

/// Rows per tile for `m` rows on at most `tiles` tiles: even, at least
/// [`MIN_ROWS`] (or all of them), as few tiles as that allows.
fn row_ranges(m: u32, tiles: u32) -> Vec<(u32, u32)> {
    let per_tile = m.div_ceil(tiles.max(1)).max(MIN_ROWS.min(m));
    let per_tile = per_tile.next_multiple_of(2);
    (0..m.div_ceil(per_tile))
        .map(|t| (t * per_tile, ((t + 1) * per_tile).min(m)))
        .collect()
}

/// Tile shares of transposes of `elements` elements on `tile_count` tiles:
/// in proportion to the elements, each at least one, summing to at most
/// `tile_count` (callers pass at most `tile_count` transposes).
pub(crate) fn shares(elements: &[u64], tile_count: u32) -> Vec<u32> {
    let total: u64 = elements.iter().sum::<u64>().max(1);
    let mut shares: Vec<u32> = elements
        .iter()
        .map(|&e| ((tile_count as u64 * e / total) as u32).max(1))
        .collect();
    while shares.iter().sum::<u32>() > tile_count {
        let largest = (0..shares.len())
            .max_by_key(|&i| (shares[i], std::cmp::Reverse(i)))
            .expect("some transposes");
        shares[largest] -= 1;
    }
    shares
}

fn request(eb: u32) -> KernelRequest {
    let entry = if eb == 4 {
        "transpose_f32"
    } else {
        "transpose_f16"
    };
    KernelRequest {
        entry: entry.into(),
        source: format!("{entry}.S"),
        params: BTreeMap::new(),
    }
}

/// Lowers a transpose segment graph onto `tile_count` tiles. Returns the
/// program and one report entry per transpose.
pub fn lower(
    graph: &Graph,
    tile_count: u32,
    library: &mut KernelLibrary,
) -> Result<(Lowered, Vec<serde_json::Value>), CompileError> {
    let name = |v: ValueId| graph.value(v).name.clone();
    let mut planned = Vec::new();
    for node in graph.nodes() {
        let (r, a) = (node.result, node.args[0]);
        let err = |reason: String| CompileError::Unsupported {
            value: name(r),
            operation: node.op.name().to_string(),
            reason,
        };
        if !matches!(node.op, Op::Transpose) {
            return Err(err(
                "is not a transpose; a transpose segment holds only transposes".into(),
            ));
        }
        if matches!(graph.value(a).def, ValueDef::Node(_)) {
            return Err(err(format!(
                "its operand `{}` is computed in the same segment; the segmenter gives a transpose of a transpose a segment of its own",
                name(a)
            )));
        }
        let ty = graph.ty(a);
        let eb = match ty.dtype {
            DType::F16 => 2,
            DType::F32 => 4,
            DType::Fp8 { .. } => {
                return Err(err(format!(
                    "operand `{}` is {ty}; device transposes are lowered for f16 and f32 values (cast an fp8 value to f16 first, or transpose it on the host as an input or param)",
                    name(a)
                )))
            }
        };
        if ty.shape.rank() != 2 {
            return Err(err(format!(
                "operand `{}` has type {ty}; a device transpose takes one [rows, columns] matrix (legalize transposes batched values element by element)",
                name(a)
            )));
        }
        let (m, n) = (ty.shape.dims()[0] as u32, ty.shape.dims()[1] as u32);
        planned.push(Planned {
            operand: a,
            result: r,
            m,
            n,
            eb,
            first_tile: 0,
            rows: Vec::new(),
            round: 0,
        });
    }
    if planned.is_empty() {
        return Err(CompileError::Verifier {
            phase: "lower",
            message: format!("transpose segment `{}` has no transposes", graph.name()),
        });
    }
    // Rounds of at most `tile_count` transposes, tiles shared in each.
    for (round, chunk) in planned.chunks_mut(tile_count as usize).enumerate() {
        let elements: Vec<u64> = chunk.iter().map(|p| p.m as u64 * p.n as u64).collect();
        let mut next = 0;
        for (p, share) in chunk.iter_mut().zip(shares(&elements, tile_count)) {
            p.first_tile = next;
            p.rows = row_ranges(p.m, share);
            p.round = round;
            next += share;
        }
    }

    let mut formulas: BTreeMap<u32, (KernelRequest, FormulaCost)> = BTreeMap::new();
    for p in &planned {
        if let std::collections::btree_map::Entry::Vacant(e) = formulas.entry(p.eb) {
            let request = request(p.eb);
            let formula = crate::kernel_formula(library, &request, &["ROWS", "COLS"])?;
            e.insert((request, formula));
        }
    }
    let mut buffers: BTreeMap<u32, Vec<BufferSpec>> =
        (0..tile_count).map(|t| (t, Vec::new())).collect();
    let rounds = planned.last().map_or(0, |p| p.round + 1);
    let mut steps: Vec<crate::lower::Step> = (0..rounds)
        .map(|round| {
            let names: Vec<String> = planned
                .iter()
                .filter(|p| p.round == round)
                .map(|p| name(p.result))
                .collect();
            crate::rowwise::compute_step(names.join(","), format!("transpose {}", names.join(", ")))
        })
        .collect();
    let mut inputs: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut params: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut outputs: BTreeMap<String, HostTensor> = BTreeMap::new();
    let mut reports = Vec::new();
    for p in &planned {
        let transpose = formulas
            .get_mut(&p.eb)
            .expect("every element size has its formula");
        let in_stride = (p.n * p.eb).next_multiple_of(8);
        let mut operand_placements = Vec::new();
        let mut result_placements = Vec::new();
        let mut slowest = 0;
        for (i, &(r0, r1)) in p.rows.iter().enumerate() {
            let tile = p.first_tile + i as u32;
            let rows = r1 - r0;
            let out_stride = transposed_row_stride(rows, p.eb);
            let bufs = buffers.get_mut(&tile).expect("tiles below tile_count");
            bufs.push(BufferSpec {
                name: format!("{}.in", name(p.result)),
                bytes: rows * in_stride,
                align: 8,
                region: RegionReq::Any,
                exclusive_element: false,
                zero: Vec::new(),
                category: "transpose_operand".into(),
                scratch: None,
                lifetime: None,
                kernel_segment: None,
            });
            let input = bufs.len() - 1;
            // The padding of each result row travels with the row's last
            // run (whole words) into consumers whose kernels need it zero.
            let zero: Vec<(u32, u32)> = (0..p.n)
                .map(|c| (c * out_stride + rows * p.eb, (c + 1) * out_stride))
                .filter(|z| z.0 < z.1)
                .collect();
            bufs.push(BufferSpec {
                name: format!("{}.out", name(p.result)),
                bytes: p.n * out_stride,
                align: 8,
                region: RegionReq::Any,
                exclusive_element: false,
                zero,
                category: "transpose_result".into(),
                scratch: None,
                lifetime: None,
                kernel_segment: None,
            });
            let output = bufs.len() - 1;
            let ranges = transpose_column_ranges(p.n);
            let mut vertices = Vec::with_capacity(ranges.len());
            let mut cycles = 0;
            for &cols in &ranges {
                let (v, c) = transpose_vertex(
                    transpose,
                    p.eb,
                    (input, in_stride),
                    (output, out_stride),
                    rows,
                    cols,
                );
                vertices.push(v);
                cycles = cycles.max(c);
            }
            let cycles = cycles + crate::attention::launch_cycles(vertices.len() as u64);
            slowest = slowest.max(cycles);
            steps[p.round].put_tile(tile, vertices, cycles);
            for r in r0..r1 {
                push_coalesced(
                    &mut operand_placements,
                    HostPlacement {
                        tile,
                        buffer: input,
                        buffer_offset: (r - r0) * in_stride,
                        host_offset: r as u64 * (p.n * p.eb) as u64,
                        bytes: p.n * p.eb,
                    },
                );
            }
            for c in 0..p.n {
                result_placements.push(HostPlacement {
                    tile,
                    buffer: output,
                    buffer_offset: c * out_stride,
                    host_offset: (c as u64 * p.m as u64 + r0 as u64) * p.eb as u64,
                    bytes: rows * p.eb,
                });
            }
        }
        let operand = &graph.value(p.operand);
        let target = if operand.def == ValueDef::Param {
            &mut params
        } else {
            &mut inputs
        };
        target
            .entry(operand.name.clone())
            .or_insert_with(|| HostTensor {
                name: operand.name.clone(),
                ty: operand.ty.clone(),
                placements: Vec::new(),
            })
            .placements
            .extend(operand_placements);
        if graph.outputs().contains(&p.result) {
            result_placements.sort_by_key(|q| q.host_offset);
            outputs.insert(
                name(p.result),
                HostTensor {
                    name: name(p.result),
                    ty: graph.ty(p.result).clone(),
                    placements: result_placements,
                },
            );
        }
        let kernel = transpose.0.to_string();
        reports.push(json!({
            "value": name(p.result),
            "operation": "transpose",
            "shape": [p.m, p.n],
            "kernel": kernel,
            "tiles": p.rows.len(),
            "rows_per_tile": p.rows.first().map_or(0, |r| r.1 - r.0),
            "estimated_cycles": slowest,
        }));
        tracing::info!(
            value = %name(p.result),
            kernel = %kernel,
            tiles = p.rows.len(),
            rows_per_tile = p.rows.first().map_or(0, |r| r.1 - r.0),
            estimated_cycles = slowest,
            "transpose planned"
        );
    }
    let tensors = HostTensors {
        params,
        inputs,
        outputs,
        resident: BTreeMap::new(),
    };
    Ok((
        Lowered::two_calls(graph, tile_count, buffers, (vec![], steps), tensors),
        reports,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row ranges cover the rows once, in order, each starting on an even
    /// row, at least MIN_ROWS long but the last, on at most the share.
    #[test]
    fn row_ranges_cover_the_rows_on_even_starts() {
        for m in 1..200 {
            for tiles in 1..40 {
                let r = row_ranges(m, tiles);
                assert!(r.len() as u32 <= tiles, "m {m} tiles {tiles}: {r:?}");
                let mut next = 0;
                for (i, &(r0, r1)) in r.iter().enumerate() {
                    assert_eq!(r0, next);
                    assert_eq!(r0 % 2, 0);
                    assert!(r1 > r0);
                    if i + 1 < r.len() {
                        assert!(r1 - r0 >= MIN_ROWS.min(m));
                    }
                    next = r1;
                }
                assert_eq!(next, m);
            }
        }
        let siglip_key_rows = row_ranges(729, 92);
        assert_eq!(siglip_key_rows.len(), 46);
        assert_eq!(siglip_key_rows[45], (720, 729));
    }

    /// Shares follow the elements, give every transpose a tile, and never
    /// exceed the tiles.
    #[test]
    fn shares_fit_the_tiles() {
        assert_eq!(shares(&[100, 300], 8), vec![2, 6]);
        assert_eq!(shares(&[1, 1, 1000], 3), vec![1, 1, 1]);
        assert_eq!(shares(&[5; 4], 4), vec![1; 4]);
        assert_eq!(shares(&[1, 1, 1, 10_000], 10), vec![1, 1, 1, 7]);
    }
}
