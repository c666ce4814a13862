//! Verification: device outputs against the host reference, and, when an
//! output is wrong, a checkpoint re-run that names the first operation whose
//! result diverged, the tiles holding the wrong bytes and the kernel that ran
//! there.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use ipu_graph::{analysis, Graph, ValueDef};
use ipu_package::{Package, Placement};
use ipu_reference::{attention_row_atol, compare_with, Comparison, Expected, Tensor, Tolerance};

use crate::members::{self, CallCheckpoints};
use crate::{feeds, open_device, read_package, RunOptions, RuntimeError, Session};

/// What [`verify`] does.
#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// Device, feeds and profile.
    pub run: RunOptions,
    /// Re-run with checkpoints when an output is wrong.
    pub diagnose: bool,
    /// Re-run with checkpoints even when every output passes, and check
    /// every checkpointed value against the whole-graph reference
    /// ([`VerifyReport::checkpoints`]): a package whose `checkpoints.json`
    /// names bytes that no longer hold the value fails here.
    pub check_checkpoints: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            run: RunOptions::default(),
            diagnose: true,
            check_checkpoints: false,
        }
    }
}

/// The check of one tensor.
#[derive(Clone, Debug)]
pub struct TensorCheck {
    /// The tensor (graph value) name.
    pub name: String,
    /// The comparison with the reference.
    pub comparison: Comparison,
    /// Tiles that hold at least one mismatching element's bytes.
    pub bad_tiles: Vec<u32>,
}

/// Where verification localised a failure.
#[derive(Clone, Debug)]
pub struct Diagnosis {
    /// The first graph value (in definition order) that is wrong.
    pub value: String,
    /// Its operation's name (`gemm`, `add`, ...).
    pub operation: String,
    /// Whether the local check (the operation re-evaluated on the device's
    /// own operands) failed; `None` if its operands were not all available.
    pub local_failed: Option<bool>,
    /// The check that failed: local if available, else against the whole-graph reference.
    pub check: TensorCheck,
    /// Kernels that ran on the bad tiles (from `checkpoints.json`).
    pub kernels: Vec<String>,
    /// Every checkpointed value in order, with whether it passed.
    pub trail: Vec<(String, bool)>,
}

/// The result of [`verify`].
#[derive(Clone, Debug)]
pub struct VerifyReport {
    /// The model name.
    pub model: String,
    /// One check per output of the `run` call.
    pub outputs: Vec<TensorCheck>,
    /// The diagnosis, when an output failed and checkpoints allowed one.
    pub diagnosis: Option<Diagnosis>,
    /// Why there is no diagnosis although an output failed.
    pub diagnosis_note: Option<String>,
    /// When an output failed and checkpoints allowed it, or with
    /// [`VerifyOptions::check_checkpoints`]: the compositional check
    /// ([`compositional`]), every checkpointed value and every output
    /// against the exact computation from the nearest values the device
    /// itself produced, in graph order.
    pub compositional: Option<Vec<TensorCheck>>,
    /// With [`VerifyOptions::check_checkpoints`]: every checkpointed value
    /// of the `run` call in graph order, checked against the whole-graph
    /// reference.
    pub checkpoints: Vec<TensorCheck>,
    /// Cycles of the verified calls.
    pub calls: Vec<crate::CallCycles>,
}

impl VerifyReport {
    /// Whether every output (and, when checked, every checkpointed
    /// value) is within tolerance.
    pub fn passed(&self) -> bool {
        self.outputs
            .iter()
            .chain(&self.checkpoints)
            .all(|o| o.comparison.passed())
    }

    /// Whether an output outside the whole-graph tolerance passed the
    /// compositional check: every operation is within the tolerance of the
    /// exact operation applied to the device's own operands, so the output
    /// differs from the whole-graph reference only by how the model
    /// amplifies errors its operands were allowed to have.
    pub fn passed_compositionally(&self) -> bool {
        !self.passed()
            && self
                .compositional
                .as_ref()
                .is_some_and(|c| c.iter().all(|t| t.comparison.passed()))
    }
}

fn index_text(index: &[usize]) -> String {
    let parts: Vec<String> = index.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn summary_line(name: &str, c: &Comparison) -> String {
    let expected = match c.expected {
        Expected::Constant(v) => format!("{v}"),
        Expected::Range { min, max } => format!("[{min:.6}, {max:.6}]"),
    };
    let first = match &c.first_mismatch {
        Some(m) => format!(
            "{} device={} reference={}",
            index_text(&m.index),
            m.device,
            m.reference
        ),
        None => "none".to_string(),
    };
    format!(
        "`{name}`: checks={} mismatches={} expected={expected} max_error={:.6} at {} first_mismatch={first} cosine={:.6}",
        c.checks,
        c.mismatches,
        c.max_abs_error,
        index_text(&c.max_abs_index),
        c.cosine
    )
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "verification of `{}` {}",
            self.model,
            if self.passed() { "passed" } else { "FAILED" }
        )?;
        for c in self.calls.iter().filter(|c| !c.checkpoint) {
            let streamed = if c.host_stream_cycles > 0 {
                format!(
                    ", {} at the call's host stops, in the device cycles",
                    c.host_stream_cycles
                )
            } else {
                String::new()
            };
            writeln!(
                f,
                "call `{}`: {} device cycles (host link: {} cycles in, {} out{streamed})",
                c.call, c.device_cycles, c.host_in_cycles, c.host_out_cycles
            )?;
        }
        for o in &self.outputs {
            writeln!(f, "output {}", summary_line(&o.name, &o.comparison))?;
            for line in o.comparison.to_string().lines().skip(1) {
                writeln!(f, "{line}")?;
            }
            if !o.bad_tiles.is_empty() {
                writeln!(f, "  tiles holding mismatches: {:?}", o.bad_tiles)?;
            }
        }
        for c in &self.checkpoints {
            writeln!(
                f,
                "checkpoint {} {}",
                if c.comparison.passed() { "ok " } else { "BAD" },
                summary_line(&c.name, &c.comparison)
            )?;
            if !c.bad_tiles.is_empty() {
                writeln!(f, "  tiles holding mismatches: {:?}", c.bad_tiles)?;
            }
        }
        if let Some(d) = &self.diagnosis {
            let how = match d.local_failed {
                Some(true) => "recomputed from the device's own operands, it still differs",
                Some(false) => {
                    "its operands already diverged; it is the first checkpoint outside tolerance"
                }
                None => {
                    "its operands were not checkpointed; compared with the whole-graph reference"
                }
            };
            writeln!(
                f,
                "first diverging operation: `{}` = {}(...) on tiles {:?}, kernel {} ({how})",
                d.value,
                d.operation,
                d.check.bad_tiles,
                if d.kernels.is_empty() {
                    "unknown (checkpoints.json names none)".to_string()
                } else {
                    d.kernels.join(", ")
                }
            )?;
            writeln!(f, "  {}", summary_line(&d.value, &d.check.comparison))?;
            let trail: Vec<String> = d
                .trail
                .iter()
                .map(|(v, ok)| format!("{v}:{}", if *ok { "ok" } else { "BAD" }))
                .collect();
            writeln!(f, "  checkpoints in order: {}", trail.join(" "))?;
        } else if let Some(note) = &self.diagnosis_note {
            writeln!(f, "no diagnosis: {note}")?;
        }
        if let Some(c) = &self.compositional {
            let bad: Vec<&str> = c
                .iter()
                .filter(|t| !t.comparison.passed())
                .map(|t| t.name.as_str())
                .collect();
            let checked: Vec<&str> = c.iter().map(|t| t.name.as_str()).collect();
            if bad.is_empty() {
                writeln!(
                    f,
                    "compositional check passed: each of {} is within the tolerance of the exact computation from the device's own values before it{}",
                    checked.join(", "),
                    if self.passed() {
                        ""
                    } else {
                        ", so the whole-graph difference is the model amplifying errors its operands were allowed"
                    }
                )?;
                if !self.passed() {
                    // What a user can change: GEMMs accumulating in f16
                    // (the compiler's default for long sums, in bounded
                    // chains) leave errors the rule allows one operation
                    // but that a softmax or a causal attention's first
                    // rows pass on undamped.
                    writeln!(
                        f,
                        "  hint: where the model's GEMMs accumulate in f16, compiling with `--option accumulation=f32` brings their results, and what is built on them, closer to the exact values (at up to half the GEMMs' rate)"
                    )?;
                }
            } else {
                writeln!(
                    f,
                    "compositional check FAILED at {} (each checked against the exact computation from the device's own values before it)",
                    bad.join(", ")
                )?;
            }
        }
        Ok(())
    }
}

/// Tiles whose placements hold at least one element outside tolerance
/// (placements that index the value `transposed` hold its elements in that
/// order).
fn bad_tiles(
    device: &Tensor,
    reference: &Tensor,
    (tol, row_atol): (Tolerance, Option<&[f64]>),
    (placements, transposed): (&[Placement], bool),
) -> Vec<u32> {
    let size = device.dtype().size_bytes() as u64;
    let mut tiles = BTreeSet::new();
    let mut sorted: Vec<&Placement> = placements.iter().collect();
    sorted.sort_by_key(|p| p.offset);
    // No placement longer than this starts before `start - longest` and
    // still reaches `start`: each element looks only at the placements
    // around it (scanning them all for every mismatching element took 13
    // of the 15 minutes a 16-head SigLIP-size model's diagnosis ran).
    let longest = sorted.iter().map(|p| p.bytes as u64).max().unwrap_or(0);
    for (i, (&d, &r)) in device.data().iter().zip(reference.data()).enumerate() {
        if tol.accepts_with(d, r, row_atol.map_or(0.0, |a| a[i])) {
            continue;
        }
        let at = if transposed {
            ipu_package::transposed_element(i as u64, device.shape().dims())
        } else {
            i as u64
        };
        let (start, end) = (at * size, (at + 1) * size);
        let before_end = sorted.partition_point(|p| p.offset < end);
        for p in sorted[..before_end].iter().rev() {
            if p.offset + longest <= start {
                break;
            }
            if start < p.offset + p.bytes as u64 {
                tiles.insert(p.tile);
            }
        }
    }
    tiles.into_iter().collect()
}

/// Compares one value under the rule (`reduction`, `requantised`) and, in
/// the whole-graph check of an attention's result, each query row's own
/// atol where larger (`row_atol`, [`ipu_reference::attention_row_atol`]).
fn check(
    name: &str,
    device: &Tensor,
    reference: &Tensor,
    (reduction, requantised, row_atol): (u64, &[f64], Option<&[f64]>),
    placements: (&[Placement], bool),
) -> Result<TensorCheck, RuntimeError> {
    let tol =
        Tolerance::for_output_requantised(device.dtype(), reduction, reference.data(), requantised);
    let comparison = compare_with(device, reference, tol, row_atol)
        .map_err(|e| RuntimeError::Verify(format!("`{name}`: {e}")))?;
    let bad = if comparison.passed() {
        Vec::new()
    } else {
        bad_tiles(device, reference, (tol, row_atol), placements)
    };
    Ok(TensorCheck {
        name: name.to_string(),
        comparison,
        bad_tiles: bad,
    })
}

/// Verifies a package file.
pub fn verify(package_path: &Path, options: &VerifyOptions) -> Result<VerifyReport, RuntimeError> {
    verify_package(read_package(package_path)?, options)
}

/// Verifies a package in memory: runs `initialize` (if present) and `run`,
/// compares `run`'s outputs with the reference evaluation of `model.ipug`.
pub fn verify_package(
    package: Package,
    options: &VerifyOptions,
) -> Result<VerifyReport, RuntimeError> {
    let graph = members::model(&package)?.ok_or_else(|| {
        RuntimeError::Verify(format!(
            "the package has no `{}` member (the compiler embeds the model text there)",
            members::MODEL_MEMBER
        ))
    })?;
    let run_call = package
        .info
        .calls
        .iter()
        .find(|c| c.name == "run")
        .cloned()
        .ok_or_else(|| RuntimeError::Verify("the package has no `run` call".to_string()))?;
    let checkpoints = members::checkpoints(&package, &graph)?;
    let feeds = feeds::make_feeds(&package, Some(&graph), &options.run.feeds)?;
    // The reference sees exactly the graph's inputs and params.
    let graph_feeds: BTreeMap<String, Tensor> = feeds
        .iter()
        .filter(|(k, _)| {
            graph
                .lookup(k)
                .is_some_and(|id| matches!(graph.value(id).def, ValueDef::Input | ValueDef::Param))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let reference = ipu_reference::evaluate_all(&graph, &graph_feeds).map_err(|e| {
        RuntimeError::Verify(format!(
            "reference evaluation of {}: {e}",
            members::MODEL_MEMBER
        ))
    })?;
    let reduction = analysis::max_reduction_length(&graph);
    let requantised = ipu_reference::requantisations(&graph);

    let run_session =
        |checkpointed: bool| -> Result<(crate::CallOutput, Vec<crate::CallCycles>), RuntimeError> {
            let (device, lock) = open_device(&options.run.device, package.info.tile_count)?;
            let mut session = Session::load(device, package.clone(), lock)?;
            session.set_progress(options.run.progress.clone());
            let mut last = None;
            for call in &package.info.calls {
                if call.name != "initialize" && call.name != "run" {
                    continue;
                }
                let inputs = feeds::for_call(&package, &call.name, &feeds);
                let cp = checkpoints
                    .as_ref()
                    .and_then(|c| c.calls.iter().find(|k| k.call == call.name));
                let out = match (checkpointed && call.name == "run", cp) {
                    (true, Some(cp)) => {
                        session.call_with_checkpoints(&call.name, &inputs, cp, &graph)?
                    }
                    _ => session.call(&call.name, &inputs)?,
                };
                if call.name == "run" {
                    last = Some(out);
                }
            }
            if !checkpointed {
                if let Some(path) = &options.run.profile {
                    crate::profile::Profile::from_session(&session)?.write(path)?;
                }
            }
            let calls = session.calls().to_vec();
            session.close()?;
            Ok((last.expect("the run call exists"), calls))
        };

    let (out, calls) = run_session(false)?;
    let mut outputs = Vec::new();
    for t in &run_call.outputs {
        let id = graph.lookup(&t.name).ok_or_else(|| {
            RuntimeError::Verify(format!(
                "output `{}` of the run call is not a value of {}",
                t.name,
                members::MODEL_MEMBER
            ))
        })?;
        let row_atol = attention_row_atol(
            &graph,
            id,
            &reference[id.0 as usize],
            (reduction, &requantised),
        );
        let c = check(
            &t.name,
            &out.outputs[&t.name],
            &reference[id.0 as usize],
            (reduction, &requantised, row_atol.as_deref()),
            (&t.placements, t.transposed),
        )?;
        tracing::info!(
            output = %t.name,
            checks = c.comparison.checks,
            mismatches = c.comparison.mismatches,
            max_error = c.comparison.max_abs_error,
            "verified output"
        );
        outputs.push(c);
    }
    let mut report = VerifyReport {
        model: graph.name().to_string(),
        outputs,
        diagnosis: None,
        diagnosis_note: None,
        compositional: None,
        checkpoints: Vec::new(),
        calls,
    };
    let run_checkpoints = checkpoints
        .as_ref()
        .and_then(|c| c.calls.iter().find(|k| k.call == "run"));
    let device_outputs: Vec<(&str, &Tensor, &[Placement], bool)> = run_call
        .outputs
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                &out.outputs[&t.name],
                &t.placements[..],
                t.transposed,
            )
        })
        .collect();
    if options.check_checkpoints {
        let Some(cp) = run_checkpoints else {
            return Err(RuntimeError::Verify(format!(
                "the package has no {} entry for the `run` call, so there are no checkpoints to check",
                members::CHECKPOINTS_MEMBER
            )));
        };
        let (cp_out, _) = run_session(true)?;
        // Graph definition order, as the diagnosis walks them.
        for (i, v) in graph.values().iter().enumerate() {
            let Some(entry) = cp.values.iter().find(|e| e.value == v.name) else {
                continue;
            };
            let row_atol = attention_row_atol(
                &graph,
                ipu_graph::ValueId(i as u32),
                &reference[i],
                (reduction, &requantised),
            );
            let c = check(
                &v.name,
                &cp_out.checkpoints[&v.name],
                &reference[i],
                (reduction, &requantised, row_atol.as_deref()),
                (&entry.placements, entry.transposed),
            )?;
            tracing::info!(
                value = %v.name,
                checks = c.comparison.checks,
                mismatches = c.comparison.mismatches,
                max_error = c.comparison.max_abs_error,
                "checked checkpoint"
            );
            report.checkpoints.push(c);
        }
        report.compositional = Some(compositional(
            &graph,
            &graph_feeds,
            cp,
            &cp_out.checkpoints,
            &device_outputs,
            (reduction, &requantised),
        )?);
    }
    if report.passed() || !options.diagnose {
        return Ok(report);
    }
    let Some(cp) = run_checkpoints else {
        report.diagnosis_note = Some(format!(
            "the package has no {} entry for the `run` call, so intermediate values cannot be read",
            members::CHECKPOINTS_MEMBER
        ));
        return Ok(report);
    };
    tracing::info!("an output is wrong; re-running with checkpoints after every operation");
    let (cp_out, _) = run_session(true)?;
    report.diagnosis = diagnose(&graph, &graph_feeds, &reference, cp, &cp_out.checkpoints)?;
    report.compositional = Some(compositional(
        &graph,
        &graph_feeds,
        cp,
        &cp_out.checkpoints,
        &device_outputs,
        (reduction, &requantised),
    )?);
    if report.diagnosis.is_none() {
        report.diagnosis_note = Some(
            "every checkpointed value is within tolerance; the error arises after the last checkpoint"
                .to_string(),
        );
    }
    Ok(report)
}

/// The compositional check. Each checkpointed value and each output is
/// compared, under the graph's tolerance rule (`rule`: its longest
/// reduction and re-quantisations, as the whole-graph check uses), with the
/// exact computation of its ancestors back to the nearest values the device
/// itself produced (checkpoints) or the host fed ([`nearest_reference`]).
/// When every one passes, every operation (or run of operations between
/// checkpoints) is as accurate as the rule asks of one operation on the
/// operands it was given; an output can still be outside the whole-graph
/// tolerance when the model amplifies its operands' allowed errors (a
/// softmax turns an absolute error of its input into a relative error of
/// its output; attention scores amplify their projections').
fn compositional(
    graph: &Graph,
    feeds: &BTreeMap<String, Tensor>,
    cp: &CallCheckpoints,
    device_values: &BTreeMap<String, Tensor>,
    outputs: &[(&str, &Tensor, &[Placement], bool)],
    rule: (u64, &[f64]),
) -> Result<Vec<TensorCheck>, RuntimeError> {
    let mut checks = Vec::new();
    for (i, v) in graph.values().iter().enumerate() {
        let id = ipu_graph::ValueId(i as u32);
        if !matches!(v.def, ValueDef::Node(_)) {
            continue;
        }
        let (device, placements, transposed) =
            if let Some(o) = outputs.iter().find(|o| o.0 == v.name) {
                (o.1, o.2, o.3)
            } else if let Some(e) = cp.values.iter().find(|e| e.value == v.name) {
                (&device_values[&v.name], &e.placements[..], e.transposed)
            } else {
                continue;
            };
        let Some(reference) = nearest_reference(graph, id, feeds, device_values) else {
            continue;
        };
        let row_atol = attention_row_atol(graph, id, &reference, rule);
        checks.push(check(
            &v.name,
            device,
            &reference,
            (rule.0, rule.1, row_atol.as_deref()),
            (placements, transposed),
        )?);
    }
    Ok(checks)
}

/// `value` evaluated exactly from the nearest values before it that the
/// device produced (`device_values`, its checkpoints) or the host fed
/// (`feeds`): the subgraph of its ancestors back to those values.
fn nearest_reference(
    graph: &Graph,
    value: ipu_graph::ValueId,
    feeds: &BTreeMap<String, Tensor>,
    device_values: &BTreeMap<String, Tensor>,
) -> Option<Tensor> {
    reference_from(graph, value, feeds, device_values, true)
}

/// `value` evaluated exactly from values the host fed or the device
/// checkpointed: its own operation over its operands, and with `recurse`
/// the operations of operands that are neither, back to ones that are.
fn reference_from(
    graph: &Graph,
    value: ipu_graph::ValueId,
    feeds: &BTreeMap<String, Tensor>,
    device_values: &BTreeMap<String, Tensor>,
    recurse: bool,
) -> Option<Tensor> {
    if !matches!(graph.value(value).def, ValueDef::Node(_)) {
        return None;
    }
    let mut b = Nearest {
        graph,
        root: value,
        feeds,
        device_values,
        recurse,
        sub: Graph::new("nearest"),
        sub_feeds: BTreeMap::new(),
        done: BTreeMap::new(),
    };
    let id = b.add(value)?;
    b.sub.add_output(id).ok()?;
    let name = graph.value(value).name.clone();
    ipu_reference::evaluate(&b.sub, &b.sub_feeds)
        .ok()?
        .remove(&name)
}

/// The subgraph [`nearest_reference`] builds.
struct Nearest<'a> {
    graph: &'a Graph,
    /// The value checked: computed in the subgraph even when checkpointed.
    root: ipu_graph::ValueId,
    feeds: &'a BTreeMap<String, Tensor>,
    device_values: &'a BTreeMap<String, Tensor>,
    /// Whether operands neither fed nor checkpointed are computed too.
    recurse: bool,
    sub: Graph,
    sub_feeds: BTreeMap<String, Tensor>,
    /// Subgraph value of each graph value added so far.
    done: BTreeMap<u32, ipu_graph::ValueId>,
}

impl Nearest<'_> {
    /// Adds `v`: an input of the subgraph when the host fed it or the
    /// device checkpointed it (the root excepted), else its operation over
    /// its operands, added the same way.
    fn add(&mut self, v: ipu_graph::ValueId) -> Option<ipu_graph::ValueId> {
        if let Some(&id) = self.done.get(&v.0) {
            return Some(id);
        }
        let value = self.graph.value(v);
        let given = match value.def {
            ValueDef::Input | ValueDef::Param => Some(self.feeds.get(&value.name)?),
            ValueDef::Node(_) if v != self.root => self.device_values.get(&value.name),
            ValueDef::Node(_) => None,
        };
        let id = match (given, value.def) {
            (Some(t), _) => {
                let id = self.sub.add_input(&value.name, value.ty.clone()).ok()?;
                self.sub_feeds.insert(value.name.clone(), t.clone());
                id
            }
            (None, ValueDef::Node(n)) if v == self.root || self.recurse => {
                let node = self.graph.node(n);
                let args = node
                    .args
                    .iter()
                    .map(|&a| self.add(a))
                    .collect::<Option<Vec<_>>>()?;
                self.sub.add_op(&value.name, node.op.clone(), &args).ok()?
            }
            (None, _) => return None,
        };
        self.done.insert(v.0, id);
        Some(id)
    }
}

/// Re-evaluates the operation defining `value` on the device's operands
/// (`None` unless every operand was checkpointed or fed by the host).
fn local_reference(
    graph: &Graph,
    value: ipu_graph::ValueId,
    feeds: &BTreeMap<String, Tensor>,
    device_values: &BTreeMap<String, Tensor>,
) -> Option<Tensor> {
    reference_from(graph, value, feeds, device_values, false)
}

fn diagnose(
    graph: &Graph,
    feeds: &BTreeMap<String, Tensor>,
    reference: &[Tensor],
    cp: &CallCheckpoints,
    device_values: &BTreeMap<String, Tensor>,
) -> Result<Option<Diagnosis>, RuntimeError> {
    let global_reduction = analysis::max_reduction_length(graph);
    let requantised = ipu_reference::requantisations(graph);
    let mut trail = Vec::new();
    // Graph definition order is a topological order.
    for (i, v) in graph.values().iter().enumerate() {
        let Some(entry) = cp.values.iter().find(|e| e.value == v.name) else {
            continue;
        };
        let device = &device_values[&v.name];
        let row_atol = attention_row_atol(
            graph,
            ipu_graph::ValueId(i as u32),
            &reference[i],
            (global_reduction, &requantised),
        );
        let global = check(
            &v.name,
            device,
            &reference[i],
            (global_reduction, &requantised, row_atol.as_deref()),
            (&entry.placements, entry.transposed),
        )?;
        let (local_failed, failing) =
            match local_reference(graph, ipu_graph::ValueId(i as u32), feeds, device_values) {
                Some(local_ref) => {
                    let ValueDef::Node(n) = v.def else {
                        unreachable!("local references exist only for nodes")
                    };
                    let k = analysis::reduction_length(graph, graph.node(n));
                    let row_atol = attention_row_atol(
                        graph,
                        ipu_graph::ValueId(i as u32),
                        &local_ref,
                        (k, &[]),
                    );
                    let local = check(
                        &v.name,
                        device,
                        &local_ref,
                        (k, &[], row_atol.as_deref()),
                        (&entry.placements, entry.transposed),
                    )?;
                    let failed = !local.comparison.passed();
                    (Some(failed), if failed { Some(local) } else { None })
                }
                None => (None, (!global.comparison.passed()).then(|| global.clone())),
            };
        let ok = failing.is_none() && global.comparison.passed();
        trail.push((v.name.clone(), ok));
        let failing = match (failing, local_failed) {
            (Some(f), _) => f,
            // Operands already drifted but this op computed them faithfully:
            // only report it if nothing local ever fails (handled below).
            _ => continue,
        };
        let ValueDef::Node(n) = v.def else {
            // A wrong input or parameter on the device: the upload is at fault.
            return Ok(Some(Diagnosis {
                value: v.name.clone(),
                operation: "upload".to_string(),
                local_failed: None,
                kernels: Vec::new(),
                check: failing,
                trail,
            }));
        };
        let mut kernels = BTreeSet::new();
        for &t in &failing.bad_tiles {
            for k in cp.kernels_on(entry, t) {
                kernels.insert(k.to_string());
            }
        }
        // Record the rest of the trail for the report.
        for w in &graph.values()[i + 1..] {
            if let Some(e) = cp.values.iter().find(|e| e.value == w.name) {
                let id = graph.lookup(&w.name).expect("graph value");
                let row_atol = attention_row_atol(
                    graph,
                    id,
                    &reference[id.0 as usize],
                    (global_reduction, &requantised),
                );
                let g = check(
                    &w.name,
                    &device_values[&w.name],
                    &reference[id.0 as usize],
                    (global_reduction, &requantised, row_atol.as_deref()),
                    (&e.placements, e.transposed),
                )?;
                trail.push((w.name.clone(), g.comparison.passed()));
            }
        }
        return Ok(Some(Diagnosis {
            value: v.name.clone(),
            operation: graph.node(n).op.name().to_string(),
            local_failed,
            check: failing,
            kernels: kernels.into_iter().collect(),
            trail,
        }));
    }
    // No operation fails locally: name the first value outside the global tolerance.
    for (name, ok) in &trail {
        if !ok {
            let id = graph.lookup(name).expect("graph value");
            let entry = cp
                .values
                .iter()
                .find(|e| &e.value == name)
                .expect("checkpointed");
            let row_atol = attention_row_atol(
                graph,
                id,
                &reference[id.0 as usize],
                (global_reduction, &requantised),
            );
            let c = check(
                name,
                &device_values[name],
                &reference[id.0 as usize],
                (global_reduction, &requantised, row_atol.as_deref()),
                (&entry.placements, entry.transposed),
            )?;
            let operation = match graph.value(id).def {
                ValueDef::Node(n) => graph.node(n).op.name().to_string(),
                _ => "upload".to_string(),
            };
            let mut kernels = BTreeSet::new();
            for &t in &c.bad_tiles {
                for k in cp.kernels_on(entry, t) {
                    kernels.insert(k.to_string());
                }
            }
            return Ok(Some(Diagnosis {
                value: name.clone(),
                operation,
                local_failed: Some(false),
                check: c,
                kernels: kernels.into_iter().collect(),
                trail: trail.clone(),
            }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipu_graph::{DType, Shape};

    /// `bad_tiles` looks only at the placements around each element; it
    /// must name exactly the tiles a scan of every placement names, with
    /// placements of mixed lengths that overlap (replicated bytes) or
    /// leave gaps, in either element order.
    #[test]
    fn bad_tiles_matches_a_scan_of_every_placement() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        for case in 0..200 {
            let (rows, cols) = (1 + next(9) as usize, 1 + next(13) as usize);
            let n = rows * cols;
            let reference: Vec<f64> = (0..n).map(|i| i as f64).collect();
            let device: Vec<f64> = reference
                .iter()
                .map(|&r| if next(4) == 0 { r + 100.0 } else { r })
                .collect();
            let placements: Vec<Placement> = (0..1 + next(12))
                .map(|t| {
                    let offset = 2 * next(n as u64);
                    Placement {
                        tile: t as u32,
                        address: 0,
                        offset,
                        bytes: 2 * (1 + next((n as u64 * 2 - offset) / 2).min(n as u64)) as u32,
                    }
                })
                .collect();
            let transposed = case % 2 == 1;
            let shape = Shape::new(vec![rows, cols]);
            let d = Tensor::new(DType::F16, shape.clone(), device).unwrap();
            let r = Tensor::new(DType::F16, shape, reference).unwrap();
            let tol = Tolerance::for_output(DType::F16, 1, r.data());
            let fast = bad_tiles(&d, &r, (tol, None), (&placements, transposed));
            let mut scan = BTreeSet::new();
            for (i, (&x, &y)) in d.data().iter().zip(r.data()).enumerate() {
                if tol.accepts_with(x, y, 0.0) {
                    continue;
                }
                let at = if transposed {
                    ipu_package::transposed_element(i as u64, d.shape().dims())
                } else {
                    i as u64
                };
                for p in &placements {
                    if p.offset < 2 * at + 2 && 2 * at < p.offset + p.bytes as u64 {
                        scan.insert(p.tile);
                    }
                }
            }
            assert_eq!(fast, scan.into_iter().collect::<Vec<_>>(), "case {case}");
        }
    }
}
