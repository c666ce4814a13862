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
//!   first read its start;
//! - when the stacks of every iteration cannot fit on their weights'
//!   tiles, `spread_weights` stacks one copy of each weight byte, in
//!   items cut to fit the room of their own tile first and then of the
//!   tiles with the most (an exchange step sends the items on other
//!   tiles to their buffers) for as many iterations as
//!   fit, and `stream_weights` has the host write the rest's weights at
//!   host stops: two device loops, the second's body reruns of the
//!   first's (docs/compiler.md, "Device loops").
//!
//! Invariants: the steps of iteration `i` run those of the first
//! iteration of its device loop, and the body's those of iteration 0, in
//! the same order (checked by `lower::verify`); a body parameter's buffers hold
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
    choice: WeightChoice,
) -> Result<Unrolled, CompileError> {
    let WeightChoice {
        weights,
        stream_on_overflow,
        stack_cap,
    } = choice;
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
    // How many iterations the weight stacks hold: all of them, on the
    // tiles of their weight buffers; or (when those cannot fit and the
    // options let the compiler choose) as many as fit spread over the
    // tiles with room, the host streaming the rest's weights.
    let mut streamed_because = None;
    let (stacked, spread) = match weights {
        LoopWeights::Stacked => {
            let overflow = stacks_fit(l, &held, count).err();
            match (overflow, stack_cap) {
                (None, None) => (count, false),
                (Some(e), _) if !stream_on_overflow => return Err(e),
                (overflow, cap) => {
                    let why = match (overflow, cap) {
                        (Some(e), _) => e.to_string(),
                        (None, Some(cap)) if cap < count => format!(
                            "storage found room for the weight stacks of {cap} iterations only"
                        ),
                        (None, _) => "storage found no room for the weight stacks on the tiles of their weights".to_string(),
                    };
                    streamed_because = Some(why);
                    (count.min(cap.unwrap_or(count)), true)
                }
            }
        }
        LoopWeights::Streamed => (0, false),
    };
    let (stacked, stacked_steps) = if spread {
        match spread_weights(
            l,
            t,
            &body_params,
            &mut params,
            &first_params,
            stacked,
            library,
        )? {
            Some((w, stacked)) => (stacked, Some(w)),
            None => (0, None),
        }
    } else if stacked > 0 {
        let w = stack_weights(
            l,
            t,
            &held,
            &body_params,
            &mut params,
            first_params.clone(),
            stacked,
            library,
        )?;
        (stacked, Some(w))
    } else {
        (0, None)
    };
    if let Some(why) = &streamed_because {
        tracing::info!(error = %why, stacked, "the weight stacks do not fit on the tiles of their weights; the stacks spread over the tiles with room hold the first iterations' weights and the host streams the rest");
    }
    let streamed_steps = if stacked < count {
        Some(stream_weights(l, t, first_params, stacked)?)
    } else {
        None
    };
    params.sort_by_key(|p| model.lookup(&p.name).map(|v| v.0));
    l.io[0].0 = params;

    // The back edge is followed by the loop's `rt_next` record.
    back_edge.shift_estimate(NEXT_RECORD_CYCLES as i64);

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
    // than a second copy of the body's records after the loop). The
    // stacked iterations are one device loop and the streamed ones
    // another; each loop's first period is emitted and its later periods
    // rerun it, and the streamed loop's body reruns the stacked loop's
    // (one set of vertex states and exchange tables for both).
    let mut loops = Vec::new();
    let mut streamed = Vec::new();
    // The first run of each body step and of the back edge, once emitted.
    let mut body_runs: Option<usize> = None;
    let parts = [
        stacked_steps.map(|w| (0..stacked, w)),
        streamed_steps.map(|w| (stacked..count, w)),
    ];
    let mut weights_report = Vec::new();
    for (iterations, w) in parts.into_iter().flatten() {
        let WeightSteps {
            first_step,
            index,
            report,
            streamed: stops,
        } = w;
        weights_report.extend(report);
        streamed.extend(stops);
        let start = steps.len();
        let weight_steps = first_step.len();
        let period: Vec<Step> = first_step
            .into_iter()
            .chain(body_steps.iter().cloned())
            .chain(std::iter::once(back_edge.clone()))
            .collect();
        for i in iterations.clone() {
            for (k, s) in period.iter().enumerate() {
                let mut s = s.clone();
                if k < weight_steps {
                    s.operation = t.defined[i][t.params[0]].clone();
                    s.phase = format!("{} {i}", s.phase);
                } else if let Some(name) = t.name_in(&s.operation, i) {
                    s.operation = name.to_string();
                }
                let first_run = match body_runs {
                    Some(b) if k >= weight_steps => b + (k - weight_steps),
                    _ => start + k,
                };
                if first_run != steps.len() {
                    reruns.insert(steps.len(), first_run);
                }
                steps.push(s);
            }
        }
        body_runs.get_or_insert(start + weight_steps);
        loops.push(crate::lower::DeviceLoop {
            start,
            period: period.len(),
            count: iterations.len() as u32,
            index,
        });
    }
    steps.extend(tail);
    run.steps = steps;
    run.reruns = reruns;
    run.loops = loops;
    run.streamed = streamed;

    // The values the body computes hold the last iteration's at the end of
    // the run; a carried value's start holds the final carry, which its
    // own placements name already.
    let last = count - 1;
    l.resident
        .retain(|r| !t.carries.iter().any(|c| c.start == r.name));
    // A carried start that is a call input (the model's `x` carried as `h`)
    // still names placements, which now hold the final carry.
    l.rewritten
        .extend(t.carries.iter().map(|c| c.start.clone()));
    for r in &mut l.resident {
        if let Some(name) = t.name_in(&r.name, last) {
            // A value held transposed keeps that mark under its new name.
            if l.transposed_host.remove(&r.name) {
                l.transposed_host.insert(name.to_string());
            }
            r.name = name.to_string();
        }
    }
    l.resident
        .sort_by_key(|r| model.lookup(&r.name).map(|v| v.0));

    let mut report = json!({
        "line": t.line,
        "count": count,
        "weights": match stacked {
            0 => "streamed",
            s if s == count => "stacked",
            _ => "stacked, then streamed",
        },
        "stacked_iterations": stacked,
        "body_steps": body.len(),
        "carries": carried,
        "estimated_back_edge_cycles": back_edge.estimated_cycles,
    });
    for (k, v) in weights_report {
        report[k] = v;
    }
    if spread {
        report["weight_stacks"] = json!("spread");
    }
    if let Some(why) = streamed_because {
        // Why the stacks left their weights' tiles, and (when they hold
        // fewer than every iteration) why the host streams the rest.
        report[if stacked < count {
            "streamed_because"
        } else {
            "spread_because"
        }] = json!(why);
    }
    Ok(Unrolled { report })
}

/// The first step of every iteration with weight stacks on the tiles of
/// their weight buffers (the copy step), the loop's index buffers and the
/// report's figures; moves the body's parameters from `first_params` into
/// the stack slots of iterations `0..count` (into `params`).
#[allow(clippy::too_many_arguments)]
fn stack_weights(
    l: &mut Lowered,
    t: &Template,
    held: &BTreeMap<(u32, usize), Vec<(u32, u32)>>,
    body_params: &BTreeSet<&str>,
    params: &mut Vec<HostTensor>,
    first_params: Vec<(usize, HostTensor)>,
    count: usize,
    library: &mut KernelLibrary,
) -> Result<WeightSteps, CompileError> {
    let images = weight_images(l, held, body_params, params)?;
    round_to_words(l, &images);
    let items = stack_items(&images);
    let home: Vec<StackPlace> = items
        .iter()
        .map(|i| StackPlace {
            tile: i.home.0,
            bin: 0,
        })
        .collect();
    let stacks = build_stacks(l, t, &items, &home, params, &first_params, count, true)?;
    let (copy_step, copy_cycles) = copy_step(t, &stacks, library)?;
    let mut slot_bytes: BTreeMap<u32, u32> = BTreeMap::new();
    for (&(tile, _), image) in &images {
        *slot_bytes.entry(tile).or_default() += image.slot;
    }
    let weights_max = slot_bytes.values().copied().max().unwrap_or(0);
    let report = vec![
        ("weight_stack_tiles", json!(slot_bytes.len())),
        ("weight_bytes_per_iteration_max_tile", json!(weights_max)),
        (
            "weight_stack_bytes_max_tile",
            json!(weights_max as u64 * count as u64),
        ),
        (
            "estimated_stack_copy_cycles_per_iteration",
            json!(copy_cycles),
        ),
    ];
    Ok(WeightSteps {
        first_step: copy_step.into_iter().collect(),
        index: stacks.index,
        report,
        streamed: Vec::new(),
    })
}

/// What a weight buffer's stack restores each iteration: its slot bytes
/// (the buffer's size, rounded to 8-byte words) and the 8-byte-word
/// ranges of it that hold parameter bytes or zeros the kernels read.
struct WeightImage {
    slot: u32,
    ranges: Vec<(u32, u32)>,
}

/// The bytes `base..base + len` of a weight buffer `home` (tile, buffer)
/// that one stack holds, slot k of it at k times `len`, and the ranges of
/// the buffer (inside those bytes) that it restores.
struct StackItem {
    home: (u32, usize),
    base: u32,
    len: u32,
    ranges: Vec<(u32, u32)>,
}

/// The stack items of `images`: one per weight buffer, the whole of it.
fn stack_items(images: &BTreeMap<(u32, usize), WeightImage>) -> Vec<StackItem> {
    images
        .iter()
        .map(|(&home, image)| StackItem {
            home,
            base: 0,
            len: image.slot,
            ranges: image.ranges.clone(),
        })
        .collect()
}

/// The images of the weight buffers in `held` (per buffer, the byte
/// ranges the body's parameters occupy), after checking that each holds
/// nothing but the body's parameters; the slots are the buffers rounded
/// to 8-byte words, which `copy64_list` moves ([`round_to_words`]).
fn weight_images(
    l: &Lowered,
    held: &BTreeMap<(u32, usize), Vec<(u32, u32)>>,
    body_params: &BTreeSet<&str>,
    params: &[HostTensor],
) -> Result<BTreeMap<(u32, usize), WeightImage>, CompileError> {
    let mut images = BTreeMap::new();
    for (&(tile, b), ranges) in held {
        let others = l.io.iter().flat_map(|(i, o)| i.iter().chain(o));
        let other = others.chain(&l.resident).chain(params).find(|h| {
            !body_params.contains(h.name.as_str())
                && h.placements.iter().any(|q| (q.tile, q.buffer) == (tile, b))
        });
        let spec = &l.buffers[&tile][b];
        // The copies restore the parameters' bytes and the zeros the
        // kernels rely on, in 8-byte words (copy64), so nothing else may
        // live in the buffer (other bytes are padding nothing writes).
        if let Some(other) = other {
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
        images.insert(
            (tile, b),
            WeightImage {
                slot: spec.bytes.div_ceil(8) * 8,
                ranges: merged,
            },
        );
    }
    Ok(images)
}

/// Rounds the weight buffers of `images` to their slots, whole 8-byte
/// words at 8-aligned addresses, which `copy64_list` moves.
fn round_to_words(l: &mut Lowered, images: &BTreeMap<(u32, usize), WeightImage>) {
    for (&(tile, b), image) in images {
        let spec = &mut l.buffers.get_mut(&tile).expect("tiles below tile_count")[b];
        spec.bytes = image.slot;
        spec.align = spec.align.max(8);
    }
}

/// Where the stack of a weight buffer's item lives: on `tile`, and when
/// that is not the buffer's own tile, its slot is copied into a staging
/// buffer there, which an exchange step sends to the weight buffer.
#[derive(Clone, Copy, Debug)]
struct StackPlace {
    tile: u32,
    /// The region it was given room in (0 or 1): storage places buffers
    /// that may go anywhere in region 0 until one does not fit and every
    /// later one in region 1, so a tile's region-0 stacks come first.
    bin: usize,
}

/// The stacks of a loop's weight buffers as built by [`build_stacks`].
struct Stacks {
    /// Per stack tile: the `copy64_list` ranges of each iteration.
    ranges: BTreeMap<u32, Vec<CopyRange>>,
    /// Per stack tile, its index word's buffer.
    index: BTreeMap<u32, usize>,
    /// The staging buffers' moves to the weight buffers.
    transfers: Vec<crate::exchange::BufferTransfer>,
}

/// The stack of the bytes `base..base + len` of a weight buffer: buffer
/// `buffer` of tile `tile`.
#[derive(Clone, Copy, Debug)]
struct StackOf {
    base: u32,
    len: u32,
    tile: u32,
    buffer: usize,
}

/// One range of a `copy64_list` vertex: `bytes` bytes at `from_offset` of
/// slot k of stack buffer `from` (slots `stride` bytes apart) into buffer
/// `to` at `to_offset`.
#[derive(Clone, Copy, Debug)]
struct CopyRange {
    from: usize,
    from_offset: u32,
    stride: u32,
    to: usize,
    to_offset: u32,
    bytes: u32,
}

/// Adds the stacks of `items` where `place` says (slots for iterations
/// `0..count`), their staging buffers and index words; moves every
/// stacked iteration's parameters (`first_params` renamed per iteration)
/// into its slots, in `params`.
#[allow(clippy::too_many_arguments)]
fn build_stacks(
    l: &mut Lowered,
    t: &Template,
    items: &[StackItem],
    place: &[StackPlace],
    params: &mut Vec<HostTensor>,
    first_params: &[(usize, HostTensor)],
    count: usize,
    stacks_apart: bool,
) -> Result<Stacks, CompileError> {
    let mut stacks = Stacks {
        ranges: BTreeMap::new(),
        index: BTreeMap::new(),
        transfers: Vec::new(),
    };
    let push = |l: &mut Lowered, tile: u32, spec: BufferSpec| {
        let bufs = l.buffers.get_mut(&tile).expect("tiles below tile_count");
        bufs.push(spec);
        bufs.len() - 1
    };
    // Per weight buffer, its items' stacks.
    let mut stack_of: BTreeMap<(u32, usize), Vec<StackOf>> = BTreeMap::new();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| place[i].bin);
    let item_name = |l: &Lowered, item: &StackItem| {
        let spec = &l.buffers[&item.home.0][item.home.1];
        if item.len == spec.bytes {
            spec.name.clone()
        } else {
            format!("{}@{}", spec.name, item.base)
        }
    };
    // A stack on another tile than its weight buffer is copied into a
    // staging buffer there, which the exchange sends on. Storage places
    // such buffers in the order they are pushed, so a staging buffer
    // pushed right after its own stack touched the stack's last slot: a
    // `copy64_list` range whose source and destination share a memory
    // element takes the kernel's two-bundle loop (the two ViT layers'
    // copy steps ran 67,002 and 73,755 cycles against about 56,200
    // estimated). Each bin's staging buffers therefore come first,
    // together, and then its stacks in the same order: slot k of item j
    // lies the later items' staging buffers, the earlier items' stacks and
    // its own k slots away from its staging buffer. Only the first slots
    // of the first items can still share an element with their staging
    // buffers, when the bin's staging bytes are fewer than an element's
    // (staging buffers after the stacks brought the last slots that close
    // instead: 32 small ViT layers kept 18 of their 23 stacked copy steps
    // on the slow loop, where this order keeps one). The bytes per bin are
    // the same, so every bin still fits the room `place_stacks` found.
    let mut stack_buf = vec![0usize; items.len()];
    let mut staging_of: Vec<Option<usize>> = vec![None; items.len()];
    for in_bin in order.chunk_by(|&a, &b| place[a].bin == place[b].bin) {
        for &i in in_bin {
            let (item, at) = (&items[i], place[i]);
            if at.tile == item.home.0 {
                continue;
            }
            let name = item_name(l, item);
            staging_of[i] = Some(push(
                l,
                at.tile,
                BufferSpec {
                    name: format!("{name}.staging"),
                    bytes: item.len,
                    align: 8,
                    region: RegionReq::Any,
                    exclusive_element: false,
                    zero: vec![],
                    category: "loop_weights".into(),
                    scratch: None,
                    lifetime: None,
                    kernel_segment: None,
                },
            ));
        }
        for &i in in_bin {
            let (item, at) = (&items[i], place[i]);
            let (tile, b) = item.home;
            let (base, len) = (item.base, item.len);
            let name = item_name(l, item);
            let zero_of: Vec<(u32, u32)> = l.buffers[&tile][b]
                .zero
                .iter()
                .map(|&(s, e)| (s.max(base), e.min(base + len)))
                .filter(|&(s, e)| s < e)
                .map(|(s, e)| (s - base, e - base))
                .collect();
            // One stack per item (so that storage may place each where it
            // fits, region 0 or above region 1's buffers), slot i of it at
            // i times the item's bytes.
            let zero = (0..count as u32)
                .flat_map(|i| {
                    zero_of
                        .iter()
                        .map(move |&(s, e)| (i * len + s, i * len + e))
                })
                .collect();
            let bytes = u32::try_from(len as u64 * count as u64).map_err(|_| {
                verifier(format!(
                    "tile {tile}: the weight stack of `{name}` for {count} iterations needs more than 4 GiB"
                ))
            })?;
            // `stacks_apart` (stacks on their weights' tiles, placed where
            // they fit, not in bins whose room was measured): the stack of
            // a weight buffer outside region 1 goes to region 1 when the
            // tile's region 1 surely holds it. Storage fills region 0 in
            // order, so such a stack would otherwise sit within a memory
            // element's distance of its small weights, where
            // `copy64_list` first tests the elements (about 30 bundles a
            // range) and then, in one element, copies a word per two
            // bundles; its formula, which the copy step's estimate uses,
            // is the far path's.
            let region = if stacks_apart
                && at.tile == tile
                && l.buffers[&tile][b].region != RegionReq::Interleaved
                && crate::storage::region1_holds(&l.buffers[&tile], &[(bytes, false)])
            {
                RegionReq::Interleaved
            } else {
                RegionReq::Any
            };
            let stack = push(
                l,
                at.tile,
                BufferSpec {
                    name: format!("{name}.stack"),
                    bytes,
                    align: 8,
                    region,
                    exclusive_element: false,
                    zero,
                    category: "loop_weights".into(),
                    scratch: None,
                    lifetime: None,
                    kernel_segment: None,
                },
            );
            stack_buf[i] = stack;
            stack_of.entry((tile, b)).or_default().push(StackOf {
                base,
                len,
                tile: at.tile,
                buffer: stack,
            });
            // The iteration's index, which copy64_list multiplies by each
            // range's stride and the loop's records zero and advance.
            if let std::collections::btree_map::Entry::Vacant(entry) = stacks.index.entry(at.tile) {
                let index = push(
                    l,
                    at.tile,
                    BufferSpec {
                        name: "loop.index".into(),
                        bytes: 4,
                        align: 4,
                        region: RegionReq::Standard,
                        exclusive_element: false,
                        zero: vec![],
                        category: "loop_weights".into(),
                        scratch: None,
                        lifetime: None,
                        kernel_segment: None,
                    },
                );
                entry.insert(index);
            }
        }
        for &i in in_bin {
            let (item, at) = (&items[i], place[i]);
            let (tile, b) = item.home;
            let (base, len) = (item.base, item.len);
            // A stack on another tile is copied into its staging buffer,
            // which the exchange sends to the weight buffer.
            let (to, to_base) = match staging_of[i] {
                None => (b, 0),
                Some(staging) => {
                    for &(s, e) in &item.ranges {
                        stacks.transfers.push(crate::exchange::BufferTransfer {
                            source: crate::exchange::BufferRef {
                                tile: at.tile,
                                buffer: staging,
                                offset: s - base,
                            },
                            destinations: vec![crate::exchange::BufferRef {
                                tile,
                                buffer: b,
                                offset: s,
                            }],
                            bytes: e - s,
                        });
                    }
                    (staging, base)
                }
            };
            stacks
                .ranges
                .entry(at.tile)
                .or_default()
                .extend(item.ranges.iter().map(|&(s, e)| CopyRange {
                    from: stack_buf[i],
                    from_offset: s - base,
                    stride: len,
                    to,
                    to_offset: s - to_base,
                    bytes: e - s,
                }));
        }
    }
    // Every stacked iteration's parameters go to their slots (a placement
    // that spans several items is cut at their bounds).
    for i in 0..count {
        for (j, p) in first_params {
            let mut placements = Vec::new();
            for q in &p.placements {
                let Some(parts) = stack_of.get(&(q.tile, q.buffer)) else {
                    continue;
                };
                let (qs, qe) = (q.buffer_offset, q.buffer_offset + q.bytes);
                for &StackOf {
                    base,
                    len,
                    tile,
                    buffer,
                } in parts
                {
                    let (s, e) = (qs.max(base), qe.min(base + len));
                    if s < e {
                        placements.push(HostPlacement {
                            tile,
                            buffer,
                            buffer_offset: i as u32 * len + (s - base),
                            host_offset: q.host_offset + (s - qs) as u64,
                            bytes: e - s,
                        });
                    }
                }
            }
            params.push(HostTensor {
                name: t.defined[i][*j].clone(),
                ty: p.ty.clone(),
                placements,
            });
        }
    }
    Ok(stacks)
}

/// The copy step of each iteration: per stack tile, six `copy64_list`
/// vertices, each an equal share of the tile's bytes (the ranges cut
/// where a share ends); one step serves every iteration, each range
/// reading slot k of its stack, k the tile's index word, which the loop
/// advances by one. Also its estimated cycles.
fn copy_step(
    t: &Template,
    stacks: &Stacks,
    library: &mut KernelLibrary,
) -> Result<(Option<Step>, u64), CompileError> {
    let copy = KernelRequest {
        entry: "copy64_list".into(),
        source: "copy64_list.S".into(),
        params: BTreeMap::new(),
    };
    let mut cost = crate::kernel_formula(library, &copy, &["N", "BYTES"])?;
    let workers = ipu_arch::WORKER_CONTEXTS;
    let mut tiles = BTreeMap::new();
    let mut tile_cycles = BTreeMap::new();
    let mut slowest = 0;
    for (&tile, ranges) in &stacks.ranges {
        let total: u32 = ranges.iter().map(|r| r.bytes).sum();
        let share = total.div_ceil(workers * 8) * 8;
        let mut bins: Vec<Vec<CopyRange>> = vec![Vec::new()];
        let mut room = share;
        for r in ranges {
            let (mut done, mut left) = (0, r.bytes);
            while left > 0 {
                if room == 0 {
                    bins.push(Vec::new());
                    room = share;
                }
                let n = left.min(room);
                bins.last_mut().expect("one bin").push(CopyRange {
                    from_offset: r.from_offset + done,
                    to_offset: r.to_offset + done,
                    bytes: n,
                    ..*r
                });
                (done, left, room) = (done + n, left - n, room - n);
            }
        }
        bins.retain(|b| !b.is_empty());
        let mut vertices = Vec::new();
        let mut tile_slowest = 0;
        for bin in bins {
            let mut state = vec![
                StateWord::Const(bin.len() as u32),
                StateWord::Addr {
                    buffer: stacks.index[&tile],
                    offset: 0,
                },
            ];
            for r in &bin {
                state.extend([
                    StateWord::Addr {
                        buffer: r.from,
                        offset: r.from_offset,
                    },
                    StateWord::Const(r.stride),
                    StateWord::Addr {
                        buffer: r.to,
                        offset: r.to_offset,
                    },
                    StateWord::Const(r.bytes),
                ]);
            }
            let bytes: u32 = bin.iter().map(|r| r.bytes).sum();
            tile_slowest =
                tile_slowest.max(cost.eval(&[("N", bin.len() as i64), ("BYTES", bytes as i64)]));
            vertices.push(Vertex {
                kernel: std::sync::Arc::new(copy.clone()),
                state,
            });
        }
        slowest = slowest.max(tile_slowest);
        tile_cycles.insert(tile, tile_slowest);
        tiles.insert(tile, vertices);
    }
    let step = (!tiles.is_empty()).then(|| Step {
        tile_cycles: std::sync::Arc::new(tile_cycles),
        operation: t.defined[0][t.params[0]].clone(),
        phase: "loop: weights of iteration".into(),
        tiles: std::sync::Arc::new(tiles),
        estimated_cycles: slowest,
        exchange: None,
        host_stop: false,
        launch: crate::lower::Launch::Own,
    });
    Ok((step, slowest))
}

/// Weight stacks spread over the tiles with room, for the first of a
/// loop's iterations when the stacks of every iteration cannot fit on the
/// tiles of their weight buffers: the stacks hold one copy of each
/// weight byte (`param_copies::plan_copies`; an exchange copies the
/// replicated ones), each on its weight buffer's tile when that tile has
/// room and otherwise on the tile with the most, from whose staging
/// buffer the exchange sends it. The number of iterations stacked is the
/// most (up to `most`) for which every stack finds room by a probe of
/// storage; `None` when not even one does.
#[allow(clippy::too_many_arguments)]
fn spread_weights(
    l: &mut Lowered,
    t: &Template,
    body_params: &BTreeSet<&str>,
    params: &mut Vec<HostTensor>,
    first_params: &[(usize, HostTensor)],
    most: usize,
    library: &mut KernelLibrary,
) -> Result<Option<(WeightSteps, usize)>, CompileError> {
    use rayon::prelude::*;
    let (js, mut tensors): (Vec<usize>, Vec<HostTensor>) = first_params.iter().cloned().unzip();
    let mut copied = crate::param_copies::ParamCopies::default();
    let replicas = crate::param_copies::plan_copies(&mut tensors, &mut copied);
    let mut written: BTreeMap<(u32, usize), Vec<(u32, u32)>> = BTreeMap::new();
    for q in tensors.iter().flat_map(|p| &p.placements) {
        written
            .entry((q.tile, q.buffer))
            .or_default()
            .push((q.buffer_offset, q.buffer_offset + q.bytes));
    }
    // The room each tile's regions leave beside its buffers, by a probe
    // of storage with the body's code and states (a dry-run link, as
    // place_storage sizes them), an allowance for what the loop adds to
    // them, and one for the loop's tables.
    crate::load_tile_kernels(l, library)?;
    let code_sizes = crate::link::CodeSizes::default();
    let rooms: BTreeMap<u32, [u64; 2]> = l
        .buffers
        .par_iter()
        .map(|(&tile, bufs)| {
            let code = crate::dry_run_code_bytes(l, tile, library, &code_sizes, "loop")?;
            Ok((tile, storage_room(tile, bufs, code + LOOP_CODE_ALLOWANCE)))
        })
        .collect::<Result<_, CompileError>>()?;
    let images = weight_images(l, &written, body_params, params)?;
    let feasible = |count: usize| place_stacks(&images, &rooms, count);
    // The most iterations whose stacks find room (fewer never need more).
    let (mut lo, mut hi) = (0, most);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if feasible(mid).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let count = lo;
    let Some((items, place)) = (count > 0).then(|| feasible(count)).flatten() else {
        return Ok(None);
    };
    round_to_words(l, &images);
    let one_copy: Vec<(usize, HostTensor)> = js.into_iter().zip(tensors).collect();
    let stacks = build_stacks(l, t, &items, &place, params, &one_copy, count, false)?;
    let (copy_step, copy_cycles) = copy_step(t, &stacks, library)?;
    // An exchange step moves the staged items to their weight buffers;
    // then one copies the replicated weights from the one copy, as for
    // the streamed iterations.
    let remote = items
        .iter()
        .zip(&place)
        .filter(|(item, at)| at.tile != item.home.0)
        .count();
    let mut steps: Vec<Step> = copy_step.into_iter().collect();
    steps.extend(weight_exchange(
        l,
        t,
        stacks.transfers,
        LOOP_LABEL + 2,
        "loop.stack_xtab",
        "loop: stacked weights to their places, iteration",
    )?);
    steps.extend(weight_exchange(
        l,
        t,
        replicas,
        LOOP_LABEL + 3,
        "loop.stack_param_xtab",
        "loop: copies of the stacked weights of iteration",
    )?);
    let exchange_cycles: u64 = steps
        .iter()
        .filter(|s| s.exchange.is_some())
        .map(|s| s.estimated_cycles)
        .sum();
    let mut slot_bytes: BTreeMap<u32, u64> = BTreeMap::new();
    for (item, at) in items.iter().zip(&place) {
        *slot_bytes.entry(at.tile).or_default() += item.len as u64;
    }
    let weights_max = slot_bytes.values().copied().max().unwrap_or(0);
    let report = vec![
        ("weight_stack_tiles", json!(slot_bytes.len())),
        ("weight_bytes_per_iteration_max_tile", json!(weights_max)),
        (
            "weight_stack_bytes_max_tile",
            json!(weights_max * count as u64),
        ),
        ("weight_stack_items_on_other_tiles", json!(remote)),
        ("weight_stack_items", json!(items.len())),
        // Why the stacks hold no more: the room the probe found on all
        // tiles, and what one more iteration takes (its items' bytes,
        // and a staging slot for those on other tiles).
        (
            "weight_stack_room_bytes",
            json!(rooms.values().map(|r| r[0] + r[1]).sum::<u64>()),
        ),
        (
            "weight_stack_bytes_per_iteration",
            json!(items.iter().map(|i| i.len as u64).sum::<u64>()),
        ),
        (
            "estimated_stack_copy_cycles_per_iteration",
            json!(copy_cycles),
        ),
        (
            "estimated_stack_exchange_cycles_per_iteration",
            json!(exchange_cycles),
        ),
    ];
    Ok(Some((
        WeightSteps {
            first_step: steps,
            index: stacks.index,
            report,
            streamed: Vec::new(),
        },
        count,
    )))
}

/// The exchange step of a loop's weight steps that makes `transfers`
/// (none when there are none), scheduled as whole jobs as for the
/// initialize call's copies, its tables (`tables`) in region 0 for the
/// whole program.
fn weight_exchange(
    l: &mut Lowered,
    t: &Template,
    transfers: Vec<crate::exchange::BufferTransfer>,
    label: u32,
    tables: &str,
    phase: &str,
) -> Result<Option<Step>, CompileError> {
    if transfers.is_empty() {
        return Ok(None);
    }
    let mut x = crate::exchange::schedule_with(l.tile_count, transfers, label, true)?;
    crate::exchange::attach_tables(&mut x, &mut l.buffers, tables);
    Ok(Some(Step {
        tile_cycles: Default::default(),
        operation: t.defined[0][t.params[0]].clone(),
        phase: phase.into(),
        tiles: Default::default(),
        estimated_cycles: crate::exchange::step_cycles(&x.figures),
        exchange: Some(x),
        host_stop: false,
        launch: crate::lower::Launch::Own,
    }))
}

/// Code and vertex states that a probe of storage adds to a tile's body
/// code for the loop: the weight steps' `copy64_list` code and states,
/// the loop records and the streamed loop's rerun records. Measured on
/// the 27-layer encoders (session 27): 1,216 to 1,864 bytes more than the
/// body's dry-run link with f16 weights, 496 to 576 with fp8 (where the
/// fixed 32 KB that this replaced left the f16 encoder 17.6 MB less room,
/// and a seventh layer none).
const LOOP_CODE_ALLOWANCE: u32 = 4 * 1024;

/// Region-0 bytes a probe keeps free for the exchange tables of the
/// loop's weight steps, which are built after it.
const TABLE_ALLOWANCE: u64 = 6 * 1024;

/// Bytes that buffers placed after `bufs` could take on `tile`, in region
/// 0 and above region 1's buffers (where `storage::place` puts buffers
/// that may go anywhere), by placing `bufs` after `code` bytes of code.
fn storage_room(tile: u32, bufs: &[BufferSpec], code: u32) -> [u64; 2] {
    use ipu_arch::{REGION1_BASE, REGION1_END};
    let Ok(placed) = crate::storage::place(tile, bufs, code) else {
        return [0, 0];
    };
    let (mut r0, mut r1) = (placed.code_end as u64, REGION1_BASE as u64);
    // Once a buffer that may go anywhere spills to region 1, storage puts
    // every later one there too.
    let mut spilled = false;
    for (b, &at) in bufs.iter().zip(&placed.addresses) {
        let end = at as u64 + b.bytes as u64;
        if at >= REGION1_BASE {
            r1 = r1.max(end);
            spilled |= b.region == RegionReq::Any;
        } else {
            r0 = r0.max(end);
        }
    }
    let room0 = if spilled {
        0
    } else {
        (crate::storage::COMMAND_ADDRESS as u64).saturating_sub(r0 + TABLE_ALLOWANCE)
    };
    [room0, (REGION1_END as u64).saturating_sub(r1)]
}

/// The stack items of `images` for `count` iterations and where each
/// goes, or `None` if some bytes find no room. Items are cut to fit the
/// room they go to: first each weight buffer's ranges on its own tile, as
/// much as its regions hold (no staging, no exchange), then what is left
/// on the tiles whose regions have the most room, each item with a
/// staging buffer of one slot beside its stack. Cutting to fit loses at
/// most a few words of a region's room, where whole items of a fixed size
/// lost up to an item's stack in every region (1 KB items for 25
/// iterations left 22 MB of the 27-layer fp8 encoder's 447 MB unused).
fn place_stacks(
    images: &BTreeMap<(u32, usize), WeightImage>,
    rooms: &BTreeMap<u32, [u64; 2]>,
    count: usize,
) -> Option<(Vec<StackItem>, Vec<StackPlace>)> {
    let count = count as u64;
    // Each region keeps a few words free for what storage adds beside the
    // stacks after the probe (the loop's 4-byte index word and its
    // alignment).
    let mut room: BTreeMap<u32, [u64; 2]> = rooms
        .iter()
        .map(|(&tile, r)| (tile, r.map(|b| b.saturating_sub(BIN_MARGIN))))
        .collect();
    // The most whole words of which `copies` copies fit in `bytes`.
    let words = |bytes: u64, copies: u64| bytes / copies / 8 * 8;
    let (mut items, mut place) = (Vec::new(), Vec::new());
    let mut left: Vec<((u32, usize), u32, u32)> = Vec::new();
    for (&home, image) in images {
        let own = room.get_mut(&home.0)?;
        for &(s, e) in &image.ranges {
            let mut at = s;
            while at < e {
                let bin = if own[0] >= own[1] { 0 } else { 1 };
                let len = (e - at).min(words(own[bin], count) as u32);
                if len == 0 {
                    break;
                }
                own[bin] -= len as u64 * count;
                items.push(StackItem {
                    home,
                    base: at,
                    len,
                    ranges: vec![(at, at + len)],
                });
                place.push(StackPlace { tile: home.0, bin });
                at += len;
            }
            if at < e {
                left.push((home, at, e));
            }
        }
    }
    // The rest goes to other tiles, an even share of its bytes on each
    // tile with room (a share capped by the tile's room, the others' then
    // larger): the tiles holding them copy and send them in the loop's
    // weight step, so the largest share sets that step. (Giving each item
    // to the tile with the most room left evened the room, not the load:
    // when session 48's smaller exchange tables left tiles 1440-1471 of
    // two SigLIP layers more room, tile 1470 sent 38,128 words in that
    // step instead of 24,238, and the step ran 58,486 cycles, not 40,476.)
    let per_slot = count + 1;
    let total: u64 = left.iter().map(|&(_, at, e)| (e - at) as u64).sum();
    let cap = |r: &[u64; 2]| words(r[0], per_slot) + words(r[1], per_slot);
    let caps: Vec<u64> = room.values().map(cap).collect();
    let share = even_share(&caps, total)?;
    // A second pass over the tiles takes what the shares missed: items
    // that end inside a word leave a tile less room than its cap counted.
    let order: Vec<u32> = room.keys().copied().collect();
    let mut tiles = order
        .iter()
        .map(|&t| (t, share))
        .chain(order.iter().map(|&t| (t, u64::MAX)));
    let mut current: Option<(u32, u64)> = None;
    for (home, mut at, e) in left {
        while at < e {
            // What the current tile takes of the range, in its bin with
            // more room; none (its share spent, or its room) moves on to
            // the next tile.
            let taken = current.map(|(tile, quota)| {
                let r = room[&tile];
                let bin = usize::from(r[0] < r[1]);
                let len = ((e - at) as u64).min(quota).min(words(r[bin], per_slot));
                (tile, quota, bin, len as u32)
            });
            let Some((tile, quota, bin, len)) = taken.filter(|t| t.3 > 0) else {
                let (tile, share) = tiles.next()?;
                current = Some((tile, cap(&room[&tile]).min(share)));
                continue;
            };
            room.get_mut(&tile).expect("a tile with room")[bin] -= len as u64 * per_slot;
            current = Some((tile, quota - len as u64));
            items.push(StackItem {
                home,
                base: at,
                len,
                ranges: vec![(at, at + len)],
            });
            place.push(StackPlace { tile, bin });
            at += len;
        }
    }
    Some((items, place))
}

/// The smallest share (a multiple of 8 bytes) such that tiles holding
/// `min(cap, share)` bytes each hold `total` bytes in all; `None` when
/// all the caps together hold less.
fn even_share(caps: &[u64], total: u64) -> Option<u64> {
    let mut sorted = caps.to_vec();
    sorted.sort_unstable();
    let mut remaining = total;
    for (i, &cap) in sorted.iter().enumerate() {
        let others = (sorted.len() - i) as u64;
        if cap * others >= remaining {
            return Some(remaining.div_ceil(others).div_ceil(8) * 8);
        }
        remaining -= cap;
    }
    (remaining == 0).then_some(0)
}

/// Bytes of each region's room that [`place_stacks`] leaves free.
const BIN_MARGIN: u64 = 64;

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
    first_params: Vec<(usize, HostTensor)>,
    first: usize,
) -> Result<WeightSteps, CompileError> {
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
    for i in first..t.count {
        for (j, p) in js.iter().zip(&tensors) {
            streamed.push((
                (i - first) as u32 + 1,
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
        tile_cycles: Default::default(),
        operation: t.defined[0][t.params[0]].clone(),
        phase: "loop: the host writes the weights of iteration".into(),
        tiles: Default::default(),
        estimated_cycles: ipu_arch::SYNC_CYCLES + host + HOST_RECORD_CYCLES,
        exchange: None,
        host_stop: true,
        launch: crate::lower::Launch::Own,
    }];
    let copies = weight_exchange(
        l,
        t,
        transfers,
        LOOP_LABEL + 1,
        "loop.param_xtab",
        "loop: copies of the streamed weights of iteration",
    )?;
    let copy_cycles = copies.as_ref().map_or(0, |s| s.estimated_cycles);
    steps.extend(copies);
    let report = vec![
        ("streamed_bytes_per_iteration", json!(bytes)),
        (
            "estimated_host_stop_cycles_per_iteration",
            json!(steps[0].estimated_cycles),
        ),
        ("copied_on_device", json!(copied.copied)),
        (
            "estimated_replica_copy_cycles_per_iteration",
            json!(copy_cycles),
        ),
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

/// What [`unroll`] may do with a loop's weights.
#[derive(Clone, Copy, Debug)]
pub struct WeightChoice {
    /// Stacked (with the fallbacks below) or streamed.
    pub weights: LoopWeights,
    /// Whether stacks that cannot fit on their weights' tiles spread over
    /// the tiles with room, the host streaming what does not fit there
    /// (else they are an error).
    pub stream_on_overflow: bool,
    /// `Some(n)`: the stacks spread over the tiles at once and hold at
    /// most n iterations (after storage found no room for more).
    pub stack_cap: Option<usize>,
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

/// Cycles of the supervisor's `rt_next` record (14 bundles, one every 6
/// cycles), which follows each back edge in the loop.
const NEXT_RECORD_CYCLES: u64 = 6 * 14;

/// Cycles of the supervisor's `rt_host` record besides its `hsync` (a load
/// and a branch).
const HOST_RECORD_CYCLES: u64 = 6 * 2;

/// The scheduling label of the back edge's exchange step (labels seed the
/// scheduler's tie-breaking; the join numbers its steps from 0).
const LOOP_LABEL: u32 = 0x100_0000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The spread items' share: the smallest word multiple that the caps
    /// hold `total` with, tiles below it full.
    #[test]
    fn even_share_is_the_smallest_that_holds_the_total() {
        assert_eq!(even_share(&[10, 100, 100], 150), Some(72));
        assert_eq!(even_share(&[16, 16], 32), Some(16));
        assert_eq!(even_share(&[8, 8], 24), None);
        assert_eq!(even_share(&[], 0), Some(0));
        for (caps, total) in [
            (vec![0u64, 64, 4096, 4096, 800], 5000u64),
            (vec![1000; 9], 8000),
        ] {
            let share = even_share(&caps, total).unwrap();
            let held = |s: u64| caps.iter().map(|&c| c.min(s)).sum::<u64>();
            assert!(
                held(share) >= total && (share < 8 || held(share - 8) < total),
                "{caps:?} {total}: {share}"
            );
        }
    }

    /// An independent check of a [`place_stacks`] result: the items cover
    /// every image's ranges exactly once, in whole words but at a range's
    /// end, and no region holds more than its room less the margin, each
    /// item taking `count` slots and, away from its weight buffer's tile,
    /// one staging slot more.
    fn check(
        images: &BTreeMap<(u32, usize), WeightImage>,
        rooms: &BTreeMap<u32, [u64; 2]>,
        count: usize,
        (items, place): &(Vec<StackItem>, Vec<StackPlace>),
    ) {
        assert_eq!(items.len(), place.len());
        let mut covered: BTreeMap<(u32, usize), Vec<(u32, u32)>> = BTreeMap::new();
        let mut used: BTreeMap<(u32, usize), u64> = BTreeMap::new();
        for (item, at) in items.iter().zip(place) {
            assert_eq!(item.ranges, vec![(item.base, item.base + item.len)]);
            assert!(item.len > 0);
            let image = &images[&item.home];
            let (s, e) = (item.base, item.base + item.len);
            let range = image
                .ranges
                .iter()
                .find(|r| r.0 <= s && e <= r.1)
                .unwrap_or_else(|| panic!("item {s}..{e} outside the ranges of {:?}", item.home));
            assert!(item.len % 8 == 0 || e == range.1, "item {s}..{e}");
            covered.entry(item.home).or_default().push((s, e));
            let slots = count as u64 + u64::from(at.tile != item.home.0);
            *used.entry((at.tile, at.bin)).or_default() += item.len as u64 * slots;
        }
        for (home, image) in images {
            let mut c = covered.remove(home).unwrap_or_default();
            c.sort();
            let mut merged: Vec<(u32, u32)> = Vec::new();
            for (s, e) in c {
                match merged.last_mut() {
                    Some(last) if last.1 == s => last.1 = e,
                    Some(last) => {
                        assert!(last.1 < s, "{home:?}: items overlap at {s}");
                        merged.push((s, e));
                    }
                    None => merged.push((s, e)),
                }
            }
            assert_eq!(merged, image.ranges, "{home:?}");
        }
        for ((tile, bin), bytes) in used {
            assert!(
                bytes + BIN_MARGIN <= rooms[&tile][bin],
                "tile {tile} region {bin}: {bytes} bytes in {}",
                rooms[&tile][bin]
            );
        }
    }

    /// Random weight buffers (8-aligned ranges) and rooms: every placement
    /// passes [`check`], and a count that finds no room needs more than
    /// the rooms hold less what cutting to fit may lose (the margin and
    /// under a word per copy in each region): fixed-size items lost up to
    /// an item's stack per region.
    #[test]
    fn stacks_cut_to_fit_their_rooms() {
        let mut rng = ipu_rng::SplitMix64(27);
        for case in 0..200 {
            let tiles = rng.range(1, 12) as u32;
            let mut images = BTreeMap::new();
            let mut rooms = BTreeMap::new();
            for tile in 0..tiles {
                rooms.insert(tile, [rng.range(0, 60_000), rng.range(0, 120_000)]);
                for b in 0..rng.range(0, 3) as usize {
                    let mut ranges = Vec::new();
                    let mut at = 0u32;
                    for _ in 0..rng.range(1, 3) {
                        at += 8 * rng.range(0, 100) as u32;
                        let end = at + 8 * rng.range(1, 800) as u32;
                        ranges.push((at, end));
                        at = end + 8;
                    }
                    images.insert((tile, b), WeightImage { slot: at, ranges });
                }
            }
            let total: u64 = images
                .values()
                .flat_map(|i| &i.ranges)
                .map(|r| (r.1 - r.0) as u64)
                .sum();
            let room: u64 = rooms.values().map(|r| r[0] + r[1]).sum();
            let regions = 2 * rooms.len() as u64;
            for count in 1..=12usize {
                match place_stacks(&images, &rooms, count) {
                    Some(placed) => check(&images, &rooms, count, &placed),
                    None => {
                        let c = count as u64;
                        assert!(
                            total * (c + 1) + regions * (BIN_MARGIN + 8 * (c + 1)) > room,
                            "case {case}, {count} iterations: {total} bytes each found no room in {room}"
                        );
                        // Fewer never need more.
                        assert!(place_stacks(&images, &rooms, count + 1).is_none());
                    }
                }
            }
        }
    }
}
