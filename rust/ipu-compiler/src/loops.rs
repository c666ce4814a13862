//! Phase `loop`: a `repeat` block compiled once and run as a device loop.
//!
//! The parser expands a `repeat` block into every iteration's statements
//! and says which values each iteration defined ([`ipu_graph::Repeat`]).
//! Compiled as written, N layers take N times the code, vertex states,
//! exchange tables and buffers, and a full-size layer stack does not fit
//! region 0 (docs/STATUS.md). So [`template`] builds the graph that
//! `compile` plans instead: the statements before the block, the block's
//! first iteration (its carried results named as the statements after the
//! block read them) and the statements after it, with segment cuts at the
//! ends of the body so that the body is whole segments.
//!
//! [`unroll`] then makes that one compiled body the loop of the run call:
//! - every buffer the host writes for the first iteration's parameters
//!   (resident weights, or their one-copy homes when the joins move
//!   weights) gets a *weight stack*, one slot per iteration, into which the
//!   host writes every iteration's parameters; each iteration starts with
//!   one `copy64_list` step from slot k into those buffers;
//! - the run call lists every iteration's steps, [copy, body, back edge],
//!   the later ones *reruns* of the first's
//!   ([`crate::lower::CallProgram::reruns`]), and all of them are one
//!   [`crate::lower::DeviceLoop`], which `emit_code` writes once between
//!   the supervisor's `rt_loop` and `rt_next` records: code, vertex
//!   states, exchange tables and program table do not grow with the count;
//! - the *back edge* exchange step moves each carried value from where the
//!   body leaves it to where the body reads its starting value (the first
//!   iteration's input, host-written or exported by the statements before
//!   the block), so the next iteration reads its carry exactly as the
//!   first read its start.
//!
//! Invariants: the steps of iteration `i` are those of iteration 0 in the
//! same order (checked by `lower::verify`); a body parameter's buffers hold
//! nothing but its bytes, zeros and padding (checked here), so copying its
//! bytes and zero ranges from the slot restores what the host would have
//! written; the carried value's start is read by nothing after the block
//! and is not a parameter or an output, since the back edge overwrites it;
//! values the body computes keep the last iteration's names (checkpoints
//! and profiles name them as the model does).

use crate::error::CompileError;
use crate::library::{KernelLibrary, KernelRequest};
use crate::lower::{
    BufferSpec, HostPlacement, HostTensor, Lowered, RegionReq, StateWord, Step, Vertex,
};
use ipu_graph::{Graph, NodeId, Repeat, ValueDef};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// The graph that `compile` plans for a model with a loop, and what
/// [`unroll`] needs to turn its body into the loop.
#[derive(Clone, Debug)]
pub struct Template {
    /// Before the block, its first iteration, after it.
    pub graph: Graph,
    /// Nodes of `graph` that start a segment: the body's first node and
    /// the first node after it.
    pub cuts: BTreeSet<NodeId>,
    /// The body's result names in `graph`.
    pub body: BTreeSet<String>,
    /// The `repeat` statement's line and iteration count.
    pub line: usize,
    pub count: usize,
    /// Per iteration, the model's names of the values it defines, aligned
    /// (entry `j` is one statement of the body).
    pub defined: Vec<Vec<String>>,
    /// Entries of `defined` that are parameters.
    pub params: Vec<usize>,
    /// The carried values: the entry of `defined` that computes each, the
    /// name the template gives the first iteration's result (the carried
    /// name, as the statements after the block read it) and the value the
    /// first iteration starts from.
    pub carries: Vec<Carry>,
}

#[derive(Clone, Debug)]
pub struct Carry {
    pub entry: usize,
    pub name: String,
    pub start: String,
}

impl Template {
    /// The model's name of template value `name` in iteration `i`, for
    /// names the body defines (others are the same in every iteration).
    fn name_in(&self, name: &str, i: usize) -> Option<&str> {
        let entry = match self.carries.iter().find(|c| c.name == name) {
            Some(c) => c.entry,
            None => self.defined[0].iter().position(|d| d == name)?,
        };
        Some(&self.defined[i][entry])
    }
}

/// The template of `graph` for `repeat`, or why the block must be compiled
/// iteration by iteration (then `compile` says so in its log).
pub fn template(graph: &Graph, repeat: &Repeat) -> Result<Template, String> {
    let count = repeat.count;
    if count < 2 {
        return Err("it has one iteration".into());
    }
    let defined = &repeat.defined;
    let later: BTreeSet<&str> = defined[1..].iter().flatten().map(String::as_str).collect();
    // The carried values: entry, name, start, and their types must not
    // change from one iteration to the next, or the body would differ.
    let mut carries = Vec::new();
    for (name, start) in &repeat.carries {
        let entry = defined[count - 1]
            .iter()
            .position(|d| d == name)
            .ok_or_else(|| format!("the carried `{name}` is not defined by its last iteration"))?;
        let first = &defined[0][entry];
        let ty = |n: &str| graph.lookup(n).map(|v| graph.ty(v).clone());
        if ty(first) != ty(start) {
            return Err(format!(
                "the carried `{name}` changes type from `{start}` to `{first}`"
            ));
        }
        let start_id = graph
            .lookup(start)
            .ok_or_else(|| format!("no value `{start}`"))?;
        match graph.value(start_id).def {
            ValueDef::Param => {
                return Err(format!(
                    "the carried `{name}` starts from the parameter `{start}`"
                ))
            }
            _ if graph.outputs().contains(&start_id) => {
                return Err(format!(
                    "the carried `{name}` starts from the output `{start}`"
                ))
            }
            _ => {}
        }
        carries.push(Carry {
            entry,
            name: name.clone(),
            start: start.clone(),
        });
    }
    let renamed: BTreeMap<&str, &str> = carries
        .iter()
        .map(|c| (defined[0][c.entry].as_str(), c.name.as_str()))
        .collect();
    let first_iteration: BTreeSet<&str> = defined[0].iter().map(String::as_str).collect();
    let params: Vec<usize> = (0..defined[0].len())
        .filter(|&j| {
            graph
                .lookup(&defined[0][j])
                .is_some_and(|v| graph.value(v).def == ValueDef::Param)
        })
        .collect();
    // Values after the block that read a carried value's start would see
    // the last iteration's carry instead, as the back edge overwrites it.
    let body_end = graph
        .lookup(defined[count - 1].last().expect("a body defines values"))
        .expect("defined values exist")
        .0;
    let err = |e: ipu_graph::GraphError| e.to_string();
    let mut g = Graph::new(graph.name());
    let mut ids = BTreeMap::new();
    let mut body = BTreeSet::new();
    let mut cuts = BTreeSet::new();
    let mut in_body = false;
    for (vi, v) in graph.values().iter().enumerate() {
        let name = v.name.as_str();
        if later.contains(name) {
            continue;
        }
        let new_name = renamed.get(name).copied().unwrap_or(name);
        let id = match v.def {
            ValueDef::Input => g.add_input(new_name, v.ty.clone()).map_err(err)?,
            ValueDef::Param => g.add_param(new_name, v.ty.clone()).map_err(err)?,
            ValueDef::Node(n) => {
                let node = graph.node(n);
                let mut args = Vec::new();
                for a in &node.args {
                    let an = graph.value(*a).name.as_str();
                    if vi as u32 > body_end && carries.iter().any(|c| c.start == an) {
                        return Err(format!(
                            "`{name}` after the block reads `{an}`, where the carried value starts"
                        ));
                    }
                    // The loop leaves the last iteration's values where the
                    // first iteration's were.
                    if vi as u32 > body_end && first_iteration.contains(an) {
                        return Err(format!(
                            "`{name}` after the block reads `{an}` of the first iteration"
                        ));
                    }
                    // After the block, a carried name reads the template's
                    // first iteration (the loop leaves the last one there).
                    let key = if later.contains(an) {
                        if !carries.iter().any(|c| c.name == an) {
                            return Err(format!(
                                "`{name}` reads `{an}`, a value of a later iteration"
                            ));
                        }
                        an
                    } else {
                        renamed.get(an).copied().unwrap_or(an)
                    };
                    args.push(
                        *ids.get(key)
                            .ok_or_else(|| format!("`{name}` reads `{an}` out of order"))?,
                    );
                }
                let here = first_iteration.contains(name);
                if here != in_body {
                    cuts.insert(NodeId(g.nodes().len() as u32));
                    in_body = here;
                }
                if here {
                    body.insert(new_name.to_string());
                }
                g.add_op(new_name, node.op.clone(), &args).map_err(err)?
            }
        };
        ids.insert(new_name, id);
    }
    for &o in graph.outputs() {
        let name = graph.value(o).name.as_str();
        if later.contains(name) && !carries.iter().any(|c| c.name == name) {
            return Err(format!(
                "the output `{name}` is a value of a later iteration"
            ));
        }
        g.add_output(ids[name]).map_err(err)?;
    }
    Ok(Template {
        graph: g,
        cuts,
        body,
        line: repeat.line,
        count,
        defined: defined.clone(),
        params,
        carries,
    })
}

/// The body's steps of the run call of `l`, compiled from `template`:
/// the steps of the segments that hold body values (every step when the
/// program is one segment).
pub fn body_steps(l: &Lowered, segments: &[crate::segment::Segment], t: &Template) -> Range<usize> {
    let run = l.calls[1].steps.len();
    if l.segment_steps.is_empty() {
        return 0..run;
    }
    let is_body = |s: &crate::segment::Segment| {
        s.graph
            .nodes()
            .iter()
            .any(|n| t.body.contains(&s.graph.value(n.result).name))
    };
    let first = segments
        .iter()
        .position(is_body)
        .expect("the body has segments");
    let last = segments
        .iter()
        .rposition(is_body)
        .expect("the body has segments");
    l.segment_steps[first].start..l.segment_steps[last].end
}

/// What [`unroll`] did, for the compile report.
pub struct Unrolled {
    pub report: serde_json::Value,
}

fn verifier(message: String) -> CompileError {
    CompileError::Verifier {
        phase: "loop",
        message,
    }
}

/// The placements of host tensor `name` among `tensors`.
fn placements_of<'a>(tensors: &'a [HostTensor], name: &str) -> Option<&'a [HostPlacement]> {
    tensors
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.placements.as_slice())
}

/// Turns the body (`body` of the run call) of a program compiled from
/// `t.graph` into the loop of `t.count` iterations (see the module
/// documentation). `model` orders the host tensors.
pub fn unroll(
    l: &mut Lowered,
    t: &Template,
    body: Range<usize>,
    model: &Graph,
    library: &mut KernelLibrary,
    weights: LoopWeights,
    stream_on_overflow: bool,
) -> Result<Unrolled, CompileError> {
    let count = t.count;
    let tile_count = l.tile_count;
    // The back edge: each carried value from the body's result into the
    // places its start is read from.
    let mut transfers = Vec::new();
    for c in &t.carries {
        let (inputs, outputs) = &l.io[1];
        let from = placements_of(outputs, &c.name)
            .or_else(|| placements_of(&l.resident, &c.name))
            .ok_or_else(|| {
                verifier(format!(
                    "the carried `{}` is not kept after the body",
                    c.name
                ))
            })?;
        let to = placements_of(inputs, &c.start)
            .or_else(|| placements_of(&l.resident, &c.start))
            .ok_or_else(|| {
                verifier(format!(
                    "the carried `{}` starts from `{}`, which the program does not keep",
                    c.name, c.start
                ))
            })?;
        let ty = t
            .graph
            .ty(t.graph.lookup(&c.name).expect("a carried value"));
        transfers.extend(crate::segment::transfers_between(
            &c.name,
            from,
            to,
            crate::segment::row_bytes(ty),
        )?);
    }
    let first_op = t
        .graph
        .nodes()
        .iter()
        .map(|n| t.graph.value(n.result).name.clone())
        .find(|n| t.body.contains(n))
        .expect("a body has nodes");
    let carried: Vec<&str> = t.carries.iter().map(|c| c.name.as_str()).collect();
    let mut back_edge = crate::exchange::program_step(
        tile_count,
        transfers,
        LOOP_LABEL,
        &mut l.buffers,
        first_op.clone(),
        format!("loop: {} to the next iteration", carried.join(", ")),
    )?;
    if let Some(x) = &back_edge.exchange {
        for (&tile, &b) in &x.table_buffers {
            l.buffers.get_mut(&tile).expect("tiles below tile_count")[b].name = "loop.xtab".into();
        }
    }

    // Per tile, the buffers the host writes for the first iteration's
    // parameters (the weight stacks hold them once per iteration, or the
    // host writes them at every iteration).
    let body_params: BTreeSet<&str> = t.params.iter().map(|&j| t.defined[0][j].as_str()).collect();
    let mut params = std::mem::take(&mut l.io[0].0);
    let mut held: BTreeMap<(u32, usize), Vec<(u32, u32)>> = BTreeMap::new();
    let mut first_params = Vec::new();
    for &j in &t.params {
        let name = &t.defined[0][j];
        let i = params
            .iter()
            .position(|p| &p.name == name)
            .ok_or_else(|| verifier(format!("the body's parameter `{name}` has no placements")))?;
        let p = params.remove(i);
        for q in &p.placements {
            held.entry((q.tile, q.buffer))
                .or_default()
                .push((q.buffer_offset, q.buffer_offset + q.bytes));
        }
        first_params.push((j, p));
    }
    // Stacks that cannot fit: the host streams the weights of the same
    // plan instead (`compile` would otherwise plan the model again).
    // Copied or written before the body's first step, the weights must
    // stay put for the whole body.
    for &(tile, b) in held.keys() {
        let spec = &l.buffers[&tile][b];
        if spec.scratch.is_some() || spec.lifetime.is_some() {
            return Err(verifier(format!(
                "tile {tile}: buffer `{}` holds a parameter of the body but lives only in part of the run",
                spec.name
            )));
        }
    }
    let mut streamed_because = None;
    let weights = match weights {
        LoopWeights::Stacked => match stacks_fit(l, &held, count) {
            Ok(()) => LoopWeights::Stacked,
            Err(e) if !stream_on_overflow => return Err(e),
            Err(e) => {
                tracing::info!(error = %e, "the weight stacks do not fit; the host streams the loop's weights");
                streamed_because = Some(e.to_string());
                LoopWeights::Streamed
            }
        },
        LoopWeights::Streamed => LoopWeights::Streamed,
    };
    let WeightSteps {
        first_step,
        index: index_of,
        report: weights_report,
        streamed,
    } = match weights {
        LoopWeights::Streamed => stream_weights(l, t, params, first_params, model)?,
        LoopWeights::Stacked => stack_weights(
            l,
            t,
            &held,
            &body_params,
            params,
            first_params,
            model,
            library,
        )?,
    };

    // The back edge is followed by the loop's `rt_next` record.
    back_edge.estimated_cycles += NEXT_RECORD_CYCLES;

    // The run call: before the block, the iterations, after it.
    let run = &mut l.calls[1];
    let old = std::mem::take(&mut run.steps);
    let mut steps: Vec<Step> = Vec::new();
    let mut reruns = BTreeMap::new();
    let mut suffix = old;
    let tail = suffix.split_off(body.end);
    let body_steps = suffix.split_off(body.start);
    steps.extend(suffix);
    // The iterations: [weights, body, back edge] each (the last back edge
    // moves the final carry to the start's place too, which is cheaper
    // than a second copy of the body's records after the loop). The first
    // period is the loop's; the others rerun its steps.
    let loop_start = steps.len();
    let period: Vec<Step> = first_step
        .iter()
        .cloned()
        .chain(body_steps)
        .chain(std::iter::once(back_edge.clone()))
        .collect();
    let weight_steps = first_step.len();
    for i in 0..count {
        for (k, s) in period.iter().enumerate() {
            let mut s = s.clone();
            if k < weight_steps {
                s.operation = t.defined[i][t.params[0]].clone();
                s.phase = format!("{} {i}", s.phase);
            } else if let Some(name) = t.name_in(&s.operation, i) {
                s.operation = name.to_string();
            }
            if i > 0 {
                reruns.insert(steps.len(), loop_start + k);
            }
            steps.push(s);
        }
    }
    steps.extend(tail);
    run.steps = steps;
    run.reruns = reruns;
    run.loops = vec![crate::lower::DeviceLoop {
        start: loop_start,
        period: period.len(),
        count: count as u32,
        index: index_of,
    }];
    run.streamed = streamed;

    // The values the body computes hold the last iteration's at the end of
    // the run; a carried value's start holds the final carry, which its
    // own placements name already.
    let last = count - 1;
    l.resident
        .retain(|r| !t.carries.iter().any(|c| c.start == r.name));
    for r in &mut l.resident {
        if let Some(name) = t.name_in(&r.name, last) {
            r.name = name.to_string();
        }
    }
    l.resident
        .sort_by_key(|r| model.lookup(&r.name).map(|v| v.0));

    let mut report = json!({
        "line": t.line,
        "count": count,
        "body_steps": body.len(),
        "carries": carried,
        "estimated_back_edge_cycles": back_edge.estimated_cycles,
    });
    for (k, v) in weights_report {
        report[k] = v;
    }
    if let Some(why) = streamed_because {
        report["streamed_because"] = json!(why);
    }
    Ok(Unrolled { report })
}

/// The first step of every iteration with weight stacks (the copy step),
/// the loop's index buffers and the report's figures; moves the body's
/// parameters from `params` into every iteration's stack slot.
#[allow(clippy::too_many_arguments)]
fn stack_weights(
    l: &mut Lowered,
    t: &Template,
    held: &BTreeMap<(u32, usize), Vec<(u32, u32)>>,
    body_params: &BTreeSet<&str>,
    mut params: Vec<HostTensor>,
    first_params: Vec<(usize, HostTensor)>,
    model: &Graph,
    library: &mut KernelLibrary,
) -> Result<WeightSteps, CompileError> {
    let count = t.count;
    let mut copies: BTreeMap<(u32, usize), Vec<(u32, u32)>> = BTreeMap::new();
    // Each weight buffer's slot bytes (its size, rounded to 8-byte words).
    let mut slot_of: BTreeMap<(u32, usize), u32> = BTreeMap::new();
    for (&(tile, b), ranges) in held {
        let spec = &mut l.buffers.get_mut(&tile).expect("tiles below tile_count")[b];
        // The copies restore the parameters' bytes and the zeros the
        // kernels rely on, in 8-byte words (copy64), so nothing else may
        // live in the buffer (other bytes are padding nothing writes).
        let others = l.io.iter().flat_map(|(i, o)| i.iter().chain(o));
        if let Some(other) = others.chain(&l.resident).chain(&params).find(|h| {
            !body_params.contains(h.name.as_str())
                && h.placements.iter().any(|q| (q.tile, q.buffer) == (tile, b))
        }) {
            return Err(verifier(format!(
                "tile {tile}: buffer `{}` holds a parameter of the body and `{}`",
                spec.name, other.name
            )));
        }
        let mut covered: Vec<(u32, u32)> = ranges
            .iter()
            .chain(&spec.zero)
            .map(|&(s, e)| (s / 8 * 8, e.div_ceil(8) * 8))
            .collect();
        covered.sort();
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (s, e) in covered {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        copies.insert((tile, b), merged);
        // copy64 moves multiples of 8 bytes between 8-aligned addresses.
        spec.bytes = spec.bytes.div_ceil(8) * 8;
        spec.align = spec.align.max(8);
        slot_of.insert((tile, b), spec.bytes);
    }
    // One stack per weight buffer (so that storage may place each where
    // it fits, region 0 or above region 1's buffers), slot i of it at
    // i times the buffer's bytes.
    let mut stack_of: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    let mut index_of: BTreeMap<u32, usize> = BTreeMap::new();
    for (&(tile, b), &slot) in &slot_of {
        let bufs = l.buffers.get_mut(&tile).expect("tiles below tile_count");
        let zero = (0..count as u32)
            .flat_map(|i| {
                bufs[b]
                    .zero
                    .iter()
                    .map(move |&(s, e)| (i * slot + s, i * slot + e))
            })
            .collect();
        let bytes = (slot as u64) * count as u64;
        let bytes = u32::try_from(bytes).map_err(|_| {
            verifier(format!(
                "tile {tile}: the weight stack of `{}` for {count} iterations needs {bytes} bytes",
                bufs[b].name
            ))
        })?;
        let name = format!("{}.stack", bufs[b].name);
        bufs.push(BufferSpec {
            name,
            bytes,
            align: 8,
            region: RegionReq::Any,
            exclusive_element: false,
            zero,
            category: "loop_weights".into(),
            scratch: None,
            lifetime: None,
        });
        stack_of.insert((tile, b), bufs.len() - 1);
        // The iteration's index, which copy64_list multiplies by each
        // range's stride and the loop's records zero and advance.
        index_of.entry(tile).or_insert_with(|| {
            bufs.push(BufferSpec {
                name: "loop.index".into(),
                bytes: 4,
                align: 4,
                region: RegionReq::Standard,
                exclusive_element: false,
                zero: vec![],
                category: "loop_weights".into(),
                scratch: None,
                lifetime: None,
            });
            bufs.len() - 1
        });
    }
    // Every iteration's parameters go to their slot.
    for i in 0..count {
        for (j, p) in &first_params {
            let placements = p
                .placements
                .iter()
                .map(|q| HostPlacement {
                    tile: q.tile,
                    buffer: stack_of[&(q.tile, q.buffer)],
                    buffer_offset: i as u32 * slot_of[&(q.tile, q.buffer)] + q.buffer_offset,
                    host_offset: q.host_offset,
                    bytes: q.bytes,
                })
                .collect();
            params.push(HostTensor {
                name: t.defined[i][*j].clone(),
                ty: p.ty.clone(),
                placements,
            });
        }
    }
    params.sort_by_key(|p| model.lookup(&p.name).map(|v| v.0));
    l.io[0].0 = params;

    // The copy step of each iteration: per tile, six `copy64_list`
    // vertices, each an equal share of the tile's bytes (the ranges cut
    // where a share ends).
    let copy = KernelRequest {
        entry: "copy64_list".into(),
        source: "copy64_list.S".into(),
        params: BTreeMap::new(),
    };
    let mut cost = crate::kernel_formula(library, &copy, &["N", "BYTES"])?;
    let workers = ipu_arch::WORKER_CONTEXTS;
    // Per tile, per worker: (buffer, offset, bytes) pieces.
    let mut shares: BTreeMap<u32, Vec<Vec<Piece>>> = BTreeMap::new();
    let mut by_tile: BTreeMap<u32, Vec<Piece>> = BTreeMap::new();
    for (&(tile, b), ranges) in &copies {
        by_tile
            .entry(tile)
            .or_default()
            .extend(ranges.iter().map(|&(s, e)| (b, s, e - s)));
    }
    for (tile, ranges) in by_tile {
        let total: u32 = ranges.iter().map(|r| r.2).sum();
        let share = total.div_ceil(workers * 8) * 8;
        let mut bins: Vec<Vec<Piece>> = vec![Vec::new()];
        let mut room = share;
        for (b, mut at, mut left) in ranges {
            while left > 0 {
                if room == 0 {
                    bins.push(Vec::new());
                    room = share;
                }
                let n = left.min(room);
                bins.last_mut().expect("one bin").push((b, at, n));
                (at, left, room) = (at + n, left - n, room - n);
            }
        }
        bins.retain(|b| !b.is_empty());
        shares.insert(tile, bins);
    }
    // One step serves every iteration: each range reads slot k of its
    // stack, k the tile's index word, which the loop advances by one.
    let copy_step = {
        let mut tiles = BTreeMap::new();
        let mut slowest = 0;
        for (&tile, bins) in &shares {
            let mut vertices = Vec::new();
            for bin in bins {
                let mut state = vec![
                    StateWord::Const(bin.len() as u32),
                    StateWord::Addr {
                        buffer: index_of[&tile],
                        offset: 0,
                    },
                ];
                for &(b, off, bytes) in bin {
                    state.extend([
                        StateWord::Addr {
                            buffer: stack_of[&(tile, b)],
                            offset: off,
                        },
                        StateWord::Const(slot_of[&(tile, b)]),
                        StateWord::Addr {
                            buffer: b,
                            offset: off,
                        },
                        StateWord::Const(bytes),
                    ]);
                }
                let bytes: u32 = bin.iter().map(|p| p.2).sum();
                slowest =
                    slowest.max(cost.eval(&[("N", bin.len() as i64), ("BYTES", bytes as i64)]));
                vertices.push(Vertex {
                    kernel: copy.clone(),
                    state,
                });
            }
            tiles.insert(tile, vertices);
        }
        (!tiles.is_empty()).then(|| Step {
            operation: t.defined[0][t.params[0]].clone(),
            phase: "loop: weights of iteration".into(),
            tiles: std::sync::Arc::new(tiles),
            estimated_cycles: slowest,
            exchange: None,
            host_stop: false,
        })
    };

    let copy_cycles = copy_step.as_ref().map_or(0, |s| s.estimated_cycles);
    let mut slot_bytes: BTreeMap<u32, u32> = BTreeMap::new();
    for (&(tile, _), &bytes) in &slot_of {
        *slot_bytes.entry(tile).or_default() += bytes;
    }
    let weights_max = slot_bytes.values().copied().max().unwrap_or(0);
    let report = vec![
        ("weights", json!("stacked")),
        ("weight_stack_tiles", json!(slot_bytes.len())),
        ("weight_bytes_per_iteration_max_tile", json!(weights_max)),
        (
            "weight_stack_bytes_max_tile",
            json!(weights_max as u64 * count as u64),
        ),
        ("estimated_copy_cycles_per_iteration", json!(copy_cycles)),
    ];
    Ok(WeightSteps {
        first_step: copy_step.into_iter().collect(),
        index: index_of,
        report,
        streamed: Vec::new(),
    })
}

/// A lower bound before storage: the weight stacks (`count` slots of each
/// buffer in `held`, rounded to 8-byte words) and every buffer that lives
/// for the whole program cannot share memory, so stacks that leave a tile
/// no room fail here, without the work of placing them.
fn stacks_fit(
    l: &Lowered,
    held: &BTreeMap<(u32, usize), Vec<(u32, u32)>>,
    count: usize,
) -> Result<(), CompileError> {
    let available =
        (ipu_arch::SRAM_END - ipu_arch::SRAM_BASE) as u64 - crate::storage::COMMAND_RESERVE as u64;
    let tiles: BTreeSet<u32> = held.keys().map(|&(tile, _)| tile).collect();
    for tile in tiles {
        let mut whole: Vec<(String, u64)> = Vec::new();
        for (b, spec) in l.buffers[&tile].iter().enumerate() {
            if spec.scratch.is_some() || spec.lifetime.is_some() {
                continue;
            }
            if held.contains_key(&(tile, b)) {
                let slot = spec.bytes.div_ceil(8) as u64 * 8;
                whole.push((spec.name.clone(), slot));
                whole.push((format!("{}.stack", spec.name), slot * count as u64));
            } else {
                whole.push((spec.name.clone(), spec.bytes as u64));
            }
        }
        let needed: u64 = whole.iter().map(|w| w.1).sum();
        if needed > available {
            whole.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            whole.truncate(5);
            return Err(CompileError::OutOfMemory {
                tile,
                region: "tile memory (the loop's weight stacks and the buffers that live for the whole program)",
                needed,
                available,
                largest: whole,
            });
        }
    }
    Ok(())
}

/// The first step of every iteration with streamed weights: a host stop
/// at which the host writes the iteration's parameters into the places
/// the first iteration's have (so no stacks and no copies: each run
/// moves every iteration's weights over the host link, which the stop's
/// cycles count).
fn stream_weights(
    l: &mut Lowered,
    t: &Template,
    mut params: Vec<HostTensor>,
    first_params: Vec<(usize, HostTensor)>,
    model: &Graph,
) -> Result<WeightSteps, CompileError> {
    params.sort_by_key(|p| model.lookup(&p.name).map(|v| v.0));
    l.io[0].0 = params;
    // The host writes one copy of every byte (the layer norms' parameters
    // and biases are on many tiles) and an exchange step copies it to the
    // others, as `param_copies` does for the initialize call: the host
    // link moves 4 bytes a cycle for the whole chip's 4 per tile.
    let (js, mut tensors): (Vec<usize>, Vec<HostTensor>) = first_params.into_iter().unzip();
    let mut copied = crate::param_copies::ParamCopies::default();
    let transfers = crate::param_copies::plan_copies(&mut tensors, &mut copied);
    let bytes: u64 = tensors
        .iter()
        .flat_map(|p| &p.placements)
        .map(|q| q.bytes as u64)
        .sum();
    let mut streamed = Vec::new();
    for i in 0..t.count {
        for (j, p) in js.iter().zip(&tensors) {
            streamed.push((
                i as u32 + 1,
                HostTensor {
                    name: t.defined[i][*j].clone(),
                    ty: p.ty.clone(),
                    placements: p.placements.clone(),
                },
            ));
        }
    }
    let host = ipu_arch::host_transfer_cycles(bytes, ipu_arch::CLOCK_HZ_C600);
    let mut steps = vec![Step {
        operation: t.defined[0][t.params[0]].clone(),
        phase: "loop: the host writes the weights of iteration".into(),
        tiles: Default::default(),
        estimated_cycles: ipu_arch::SYNC_CYCLES + host + HOST_RECORD_CYCLES,
        exchange: None,
        host_stop: true,
    }];
    let copy_cycles = if transfers.is_empty() {
        0
    } else {
        // Whole jobs, as for the initialize call's copies: the tables
        // stay in region 0 for the whole program.
        let mut x = crate::exchange::schedule_with(l.tile_count, transfers, LOOP_LABEL + 1, true)?;
        crate::exchange::attach_tables(&mut x, &mut l.buffers, "loop.param_xtab");
        let cycles = crate::exchange::step_cycles(&x.figures);
        steps.push(Step {
            operation: t.defined[0][t.params[0]].clone(),
            phase: "loop: copies of the streamed weights of iteration".into(),
            tiles: Default::default(),
            estimated_cycles: cycles,
            exchange: Some(x),
            host_stop: false,
        });
        cycles
    };
    let report = vec![
        ("weights", json!("streamed")),
        ("streamed_bytes_per_iteration", json!(bytes)),
        (
            "estimated_host_stop_cycles_per_iteration",
            json!(steps[0].estimated_cycles),
        ),
        ("copied_on_device", json!(copied.copied)),
        ("estimated_copy_cycles_per_iteration", json!(copy_cycles)),
    ];
    Ok(WeightSteps {
        first_step: steps,
        index: BTreeMap::new(),
        report,
        streamed,
    })
}

/// What starts every iteration: its step (the weights' copy or host stop),
/// the loop's index buffer per tile, the report's figures and the inputs
/// the host writes at the host stops.
struct WeightSteps {
    first_step: Vec<Step>,
    index: BTreeMap<u32, usize>,
    report: Vec<(&'static str, serde_json::Value)>,
    streamed: Vec<(u32, HostTensor)>,
}

/// Where a device loop's body finds each iteration's parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoopWeights {
    /// In weight stacks on the chip, one slot per iteration, copied into
    /// place by a `copy64_list` step that starts each iteration.
    #[default]
    Stacked,
    /// Written by the host at a host stop that starts each iteration:
    /// any depth fits, at the host link's rate.
    Streamed,
}

/// Bytes `offset..offset + bytes` of a tile's buffer `buffer`, copied by
/// one `copy64_list` range: (buffer, offset, bytes).
type Piece = (usize, u32, u32);

/// Cycles of the supervisor's `rt_next` record (14 bundles, one every 6
/// cycles), which follows each back edge in the loop.
const NEXT_RECORD_CYCLES: u64 = 6 * 14;

/// Cycles of the supervisor's `rt_host` record besides its `hsync` (a load
/// and a branch).
const HOST_RECORD_CYCLES: u64 = 6 * 2;

/// The scheduling label of the back edge's exchange step (labels seed the
/// scheduler's tie-breaking; the join numbers its steps from 0).
const LOOP_LABEL: u32 = 0x100_0000;
