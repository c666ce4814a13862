//! Phase `write_package`: the manifest (host interface, calls with their
//! placements), the tile images and the compiler members the runtime reads
//! (docs/runtime.md): `model.ipug`, `report.json`, `checkpoints.json`,
//! `schedule.json`, `symbols.json`. Every member is built from ordered
//! collections, so the same compile gives byte-identical packages.

use crate::lower::{HostPlacement, HostTensor, Lowered};
use crate::storage::{TileStorage, COMMAND_ADDRESS};
use ipu_package::{
    CallPhase, HostInterface, PackageInfo, PhaseKind, Placement, StreamTensor, StreamingCall,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The compiler version recorded in packages.
pub const COMPILER_VERSION: &str = concat!("ipu-compile ", env!("CARGO_PKG_VERSION"));

/// Manifest placements of a host tensor.
pub fn placements(t: &HostTensor, storage: &BTreeMap<u32, TileStorage>) -> Vec<Placement> {
    t.placements
        .iter()
        .map(|p| Placement {
            tile: p.tile,
            address: storage[&p.tile].addresses[p.buffer] + p.buffer_offset,
            offset: p.host_offset,
            bytes: p.bytes,
        })
        .collect()
}

/// Placements with every host byte once (the first tile that holds it), as
/// checkpoints need (inputs may be placed on several tiles), in tile order.
pub fn unique_placements(list: &[Placement]) -> Vec<Placement> {
    let mut sorted = list.to_vec();
    sorted.sort_unstable_by_key(|p| (p.offset, p.tile, p.address, p.bytes));
    let mut out = Vec::new();
    let mut covered = 0u64;
    for p in sorted {
        let end = p.offset + p.bytes as u64;
        if end <= covered {
            continue;
        }
        let skip = covered.saturating_sub(p.offset);
        out.push(Placement {
            tile: p.tile,
            address: p.address + skip as u32,
            offset: p.offset + skip,
            bytes: (end - p.offset - skip) as u32,
        });
        covered = end;
    }
    // Tile order: a tile's rows then form placement runs in the package.
    out.sort_unstable_by_key(|p| (p.tile, p.address, p.offset, p.bytes));
    out
}

fn stream(l: &Lowered, t: &HostTensor, storage: &BTreeMap<u32, TileStorage>) -> StreamTensor {
    StreamTensor {
        name: t.name.clone(),
        dtype: t.ty.dtype,
        shape: t.ty.shape.dims().to_vec(),
        placements: placements(t, storage),
        transposed: l.transposed_host.contains(&t.name),
        stop: 0,
    }
}

fn host_cycles(tensors: &[HostTensor]) -> u64 {
    let bytes: u64 = tensors
        .iter()
        .flat_map(|t| &t.placements)
        .map(|p: &HostPlacement| p.bytes as u64)
        .sum();
    ipu_arch::host_transfer_cycles(bytes, ipu_arch::CLOCK_HZ_C600)
}

/// The manifest's descriptive part.
pub fn info(
    model: &str,
    l: &Lowered,
    storage: &BTreeMap<u32, TileStorage>,
    report_summary: BTreeMap<String, u64>,
) -> PackageInfo {
    let calls = l
        .calls
        .iter()
        .zip(&l.io)
        .map(|(call, (ins, outs))| {
            let mut phases = vec![CallPhase {
                name: "host to device".into(),
                kind: PhaseKind::HostToDevice,
                supersteps: 0,
                estimated_cycles: Some(host_cycles(ins) + ipu_arch::SYNC_CYCLES),
            }];
            // Each BSP step's superstep is counted once, on the phase that
            // ends it: an exchange, or for the last step (which ends with
            // the call's final host sync) its last compute phase, else the
            // transfer to the host, else the last phase of the call.
            let last = call.steps.iter().rposition(|s| s.ends_bsp_step());
            let tail_compute = call.steps.len() > last.map_or(0, |i| i + 1);
            for (i, step) in call.steps.iter().enumerate() {
                let ends_step = step.ends_bsp_step() || (tail_compute && i + 1 == call.steps.len());
                phases.push(CallPhase {
                    name: step.phase.clone(),
                    kind: if step.exchange.is_some() {
                        PhaseKind::Exchange
                    } else if step.host_stop {
                        PhaseKind::HostToDevice
                    } else {
                        PhaseKind::Compute
                    },
                    supersteps: ends_step as u32,
                    estimated_cycles: Some(step.estimated_cycles),
                });
            }
            if !outs.is_empty() {
                phases.push(CallPhase {
                    name: "device to host".into(),
                    kind: PhaseKind::DeviceToHost,
                    supersteps: (!tail_compute) as u32,
                    estimated_cycles: Some(host_cycles(outs)),
                });
            } else if !tail_compute {
                phases
                    .last_mut()
                    .expect("the host-to-device phase")
                    .supersteps += 1;
            }
            StreamingCall {
                name: call.name.clone(),
                phases,
                inputs: ins
                    .iter()
                    .map(|t| stream(l, t, storage))
                    .chain(call.streamed.iter().map(|(stop, t)| StreamTensor {
                        stop: *stop,
                        ..stream(l, t, storage)
                    }))
                    .collect(),
                outputs: outs.iter().map(|t| stream(l, t, storage)).collect(),
                host_stops: call.steps.iter().filter(|s| s.host_stop).count() as u32,
            }
        })
        .collect();
    PackageInfo {
        compiler_version: COMPILER_VERSION.into(),
        tile_count: l.tile_count,
        model: model.into(),
        host: HostInterface {
            command_address: COMMAND_ADDRESS,
        },
        calls,
        config_writes: vec![],
        report_summary,
    }
}

/// The kernels that `steps` run, one entry per kernel with the tiles that
/// run it in any of the steps (`[{kernel, tiles}]`, both in order).
fn kernels_of<'s>(steps: impl IntoIterator<Item = &'s crate::lower::Step>) -> Vec<Value> {
    let mut by_kernel: BTreeMap<String, std::collections::BTreeSet<u32>> = BTreeMap::new();
    for step in steps {
        for (tile, vertices) in step.tiles.iter() {
            for v in vertices {
                by_kernel
                    .entry(v.kernel.entry.clone())
                    .or_default()
                    .insert(*tile);
            }
        }
    }
    by_kernel
        .into_iter()
        .map(|(k, t)| json!({"kernel": k, "tiles": t.into_iter().collect::<Vec<u32>>()}))
        .collect()
}

/// Placements as the package stores them: runs (docs/package-format.md).
fn placements_json(list: &[Placement]) -> Value {
    serde_json::to_value(ipu_package::placement_runs::to_runs(list))
        .expect("placement runs serialise")
}

/// `checkpoints.json`: every value still intact at each call's final hsync
/// (no extra stops: operands and results live for the whole program): the
/// call's inputs, the parameters, its outputs and, for "run", the results
/// of fused groups that stay on the device. Values fused inside a group
/// (e.g. the pre-bias GEMM result) never exist in memory and are absent.
pub fn checkpoints(l: &Lowered, storage: &BTreeMap<u32, TileStorage>) -> Value {
    use rayon::prelude::*;
    let params = &l.io[0].0;
    let overwritten = overwritten_by_run(l, storage);
    // Each call's checkpointed tensors in order: (tensor, computed by the
    // call). "run" can read the parameters too.
    let listed: Vec<Vec<(&HostTensor, bool)>> = l
        .calls
        .iter()
        .zip(&l.io)
        .map(|(call, (ins, outs))| {
            let run = call.name == "run";
            let mut seen = std::collections::BTreeSet::new();
            let resident = ins
                .iter()
                .chain(if run { params.iter() } else { [].iter() })
                .filter(|t| !(run && l.rewritten.contains(&t.name)))
                .filter(|t| seen.insert(t.name.clone()))
                .map(|t| (t, false));
            let computed = outs
                .iter()
                .chain(if run { l.resident.iter() } else { [].iter() })
                .map(|t| (t, true));
            resident.chain(computed).collect()
        })
        .collect();
    // A value is checkpointed at the end of its call (stop 1), so only
    // from bytes that nothing written later in the call reuses; at the end
    // of `initialize` nothing else has run yet. A value left without a
    // whole intact copy is not checkpointed at all: the diagnosis would
    // otherwise compare bytes that hold another buffer's data. The key says
    // whether the filter removes anything, so that a parameter whose bytes
    // stay intact is reduced once for both calls (a SigLIP weight has
    // 580,608 placements), and the distinct lists are reduced in parallel.
    // Indexed by tile and buffer (placements number in the millions).
    let is_lost = |p: &HostPlacement| overwritten[p.tile as usize].get(p.buffer) == Some(&true);
    let addresses: Vec<&[u32]> = (0..l.tile_count)
        .map(|t| storage.get(&t).map_or(&[][..], |s| &s.addresses[..]))
        .collect();
    let key = |t: &HostTensor, run: bool| (t.name.clone(), run && t.placements.iter().any(is_lost));
    let keys: Vec<Vec<(String, bool)>> = l
        .calls
        .iter()
        .zip(&listed)
        .map(|(call, list)| {
            list.iter()
                .map(|&(t, _)| key(t, call.name == "run"))
                .collect()
        })
        .collect();
    let mut distinct: BTreeMap<(String, bool), &HostTensor> = BTreeMap::new();
    for (list, ks) in listed.iter().zip(&keys) {
        for (&(t, _), k) in list.iter().zip(ks) {
            distinct.entry(k.clone()).or_insert(t);
        }
    }
    let distinct: Vec<(&(String, bool), &&HostTensor)> = distinct.iter().collect();
    let reduced: BTreeMap<(String, bool), Option<Vec<Placement>>> = distinct
        .par_iter()
        .map(|&(k, t)| {
            let kept: Vec<Placement> = t
                .placements
                .iter()
                .filter(|p| !k.1 || !is_lost(p))
                .map(|p| Placement {
                    tile: p.tile,
                    address: addresses[p.tile as usize][p.buffer] + p.buffer_offset,
                    offset: p.host_offset,
                    bytes: p.bytes,
                })
                .collect();
            let unique = unique_placements(&kept);
            let covered: u64 = unique.iter().map(|p| p.bytes as u64).sum();
            (k.clone(), (covered == t.ty.bytes()).then_some(unique))
        })
        .collect();
    let calls: Vec<Value> = l
        .calls
        .iter()
        .zip(listed.iter().zip(&keys))
        .map(|(call, (list, ks))| {
            let mut values = Vec::new();
            for (&(t, computed), k) in list.iter().zip(ks) {
                let Some(p) = &reduced[k] else {
                    continue;
                };
                let mut v = json!({"value": t.name, "stop": 1, "placements": placements_json(p)});
                if l.transposed_host.contains(&t.name) {
                    v["transposed"] = json!(true);
                }
                if computed {
                    let steps = call.steps.iter().filter(|s| s.operation == t.name);
                    v["kernels"] = Value::Array(kernels_of(steps));
                }
                values.push(v);
            }
            json!({"call": call.name, "stops": 0, "values": values})
        })
        .collect();
    json!({"format_version": 1, "calls": calls})
}

/// By tile and buffer, whether a buffer that lives later in the `run` call
/// may reuse the buffer's bytes, so that at the end of the call they need not hold
/// what was written there. Buffers share memory only across scratch phases
/// (which run in increasing order within a segment) and across segment
/// lifetimes (in increasing order); a buffer live for the whole program
/// shares with none. Of two overlapping buffers the later one survives; an
/// overlap of two buffers with the same lifetime and phase (which the
/// storage validator refuses) counts as overwriting both.
fn overwritten_by_run(l: &Lowered, storage: &BTreeMap<u32, TileStorage>) -> Vec<Vec<bool>> {
    let mut out: Vec<Vec<bool>> = vec![Vec::new(); l.tile_count as usize];
    for (&tile, buffers) in &l.buffers {
        if let Some(st) = storage.get(&tile) {
            out[tile as usize] = overwritten_on_tile(buffers, &st.addresses);
        }
    }
    out
}

/// [`overwritten_by_run`] on one tile: by buffer, whether a buffer that
/// lives later in the `run` call may reuse its bytes, with the buffers at
/// `addresses`.
pub(crate) fn overwritten_on_tile(
    buffers: &[crate::lower::BufferSpec],
    addresses: &[u32],
) -> Vec<bool> {
    let mut lost = vec![false; buffers.len()];
    let span = |i: usize| {
        let a = addresses[i] as u64;
        (a, a + buffers[i].bytes as u64)
    };
    // Run order of a buffer's life: its segment, then its phase.
    let order = |i: usize| (buffers[i].lifetime, buffers[i].scratch);
    let mut by_start: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].bytes > 0)
        .collect();
    by_start.sort_by_key(|&i| span(i));
    for (n, &i) in by_start.iter().enumerate() {
        let (_, end) = span(i);
        for &j in &by_start[n + 1..] {
            let (start_j, _) = span(j);
            if start_j >= end {
                break;
            }
            match order(i).cmp(&order(j)) {
                std::cmp::Ordering::Less => {
                    lost[i] = true;
                }
                std::cmp::Ordering::Greater => {
                    lost[j] = true;
                }
                std::cmp::Ordering::Equal => {
                    lost[i] = true;
                    lost[j] = true;
                }
            }
        }
    }
    lost
}

/// The call's lowered steps grouped by BSP step: every exchange step ends
/// one (its sync starts the exchange phase), as does every host stop, and the steps after the last
/// exchange form the last one, which ends with the call's final host sync
/// (empty when the call ends with an exchange or has no steps). This is how
/// the tile programs run them (docs/runtime.md), so a profile's steps match.
pub fn bsp_steps(call: &crate::lower::CallProgram) -> Vec<&[crate::lower::Step]> {
    let mut out = Vec::new();
    let mut first = 0;
    for (i, step) in call.steps.iter().enumerate() {
        if step.ends_bsp_step() {
            out.push(&call.steps[first..=i]);
            first = i + 1;
        }
    }
    out.push(&call.steps[first..]);
    out
}

/// The cost model's cycles of one BSP step: its compute steps on the
/// slowest tile (each tile runs the steps it has vertices in, one after
/// the other, each for its own estimate, `Step::tile_estimate`), then its
/// exchange step; the call's last step also pays the
/// final host sync. Summed over the run call's steps, with the call's
/// dispatch where no step holds it (`launches::unsettled_dispatch_cycles`,
/// counted in the first), this is the report's `run_compute` estimate (the
/// timeline of `estimated_run_cycles`).
fn bsp_step_estimate(group: &[crate::lower::Step], last: bool) -> u64 {
    let mut per_tile: BTreeMap<u32, u64> = BTreeMap::new();
    let mut exchange = 0;
    for s in group {
        if s.ends_bsp_step() {
            exchange += s.estimated_cycles;
        } else {
            for &tile in s.tiles.keys() {
                *per_tile.entry(tile).or_default() += s.tile_estimate(tile);
            }
        }
    }
    let compute = per_tile.values().copied().max().unwrap_or(0);
    compute + exchange + if last { ipu_arch::SYNC_CYCLES } else { 0 }
}

/// `schedule.json` (format 2): per call, one entry per BSP step
/// ([`bsp_steps`]) with the graph value its first step computes, its
/// steps' phases, the kernels that ran on which tiles and the cost model's
/// cycles ([`bsp_step_estimate`]), so that a profile attributes each
/// step's cycles and sets them beside the estimate
/// (docs/profile-format.md). `live` gives each step's live bytes
/// ([`crate::liveness::analyse`], indexed like the calls and their BSP
/// steps); a call it lacks gets none.
pub fn schedule(l: &Lowered, live: &[Vec<crate::liveness::StepLive>]) -> Value {
    use rayon::prelude::*;
    // A device loop's later iterations share their first iteration's
    // vertices (`Step::tiles`), so the kernels of a BSP step are listed once
    // per distinct run of vertex maps and cloned for the others (the 27-layer
    // encoder's schedule took 1.3 s listing them step by step).
    let vertex_maps = |group: &[crate::lower::Step]| -> Vec<usize> {
        group
            .iter()
            .map(|s| Arc::as_ptr(&s.tiles) as usize)
            .collect()
    };
    let calls: Vec<Value> = l
        .calls
        .iter()
        .enumerate()
        .map(|(c, call)| {
            let groups = bsp_steps(call);
            let call_live = live.get(c);
            let count = groups.len();
            let mut distinct: BTreeMap<Vec<usize>, &[crate::lower::Step]> = BTreeMap::new();
            for group in &groups {
                distinct.entry(vertex_maps(group)).or_insert(group);
            }
            let kernels: BTreeMap<Vec<usize>, Vec<Value>> = distinct
                .into_par_iter()
                .map(|(key, group)| (key, kernels_of(group)))
                .collect();
            let steps: Vec<Value> = groups
                .into_par_iter()
                .enumerate()
                .map(|(k, group)| {
                    let mut step = serde_json::Map::new();
                    if let Some(first) = group.first() {
                        step.insert("operation".into(), json!(first.operation));
                    }
                    let phase = if group.is_empty() {
                        if call.steps.is_empty() {
                            "host transfer".to_string()
                        } else {
                            "device to host".to_string()
                        }
                    } else {
                        group
                            .iter()
                            .map(|s| s.phase.clone())
                            .collect::<Vec<_>>()
                            .join("; ")
                    };
                    step.insert("phase".into(), json!(phase));
                    step.insert(
                        "kernels".into(),
                        Value::Array(kernels[&vertex_maps(group)].clone()),
                    );
                    // The call's dispatch and end, where no step's
                    // estimate holds them, count in its first BSP step.
                    let dispatch = if k == 0 {
                        crate::launches::unsettled_dispatch_cycles(call)
                    } else {
                        0
                    };
                    step.insert(
                        "estimated_cycles".into(),
                        json!(dispatch + bsp_step_estimate(group, k + 1 == count)),
                    );
                    if group.last().is_some_and(|s| s.host_stop) {
                        step.insert("host_stop".into(), json!(true));
                    }
                    if let Some(v) = call_live.and_then(|v| v.get(k)) {
                        step.insert("live".into(), json!(v));
                    }
                    Value::Object(step)
                })
                .collect();
            json!({"call": call.name, "steps": steps})
        })
        .collect();
    json!({"format_version": 2, "calls": calls})
}

/// A tile's symbols sorted by address: (address, size, name).
type SymbolKey = Vec<(u32, u32, String)>;

/// `symbols.json`: tiles with identical symbol tables share a group.
pub fn symbols(per_tile: &BTreeMap<u32, Vec<(String, u32, u32)>>) -> Value {
    let mut groups: BTreeMap<Vec<(u32, u32, String)>, Vec<u32>> = BTreeMap::new();
    for (tile, syms) in per_tile {
        let mut key: Vec<(u32, u32, String)> =
            syms.iter().map(|(n, a, s)| (*a, *s, n.clone())).collect();
        key.sort();
        groups.entry(key).or_default().push(*tile);
    }
    let mut groups: Vec<(Vec<u32>, SymbolKey)> = groups.into_iter().map(|(k, t)| (t, k)).collect();
    groups.sort();
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(tiles, syms)| {
            json!({"tiles": tiles, "symbols": syms.iter().map(|(a, s, n)| json!({"name": n, "address": a, "size": s})).collect::<Vec<_>>()})
        })
        .collect();
    json!({"format_version": 1, "groups": groups})
}

/// Pretty JSON with a trailing newline.
pub fn json_bytes(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).expect("JSON values serialise");
    s.push('\n');
    s.into_bytes()
}
