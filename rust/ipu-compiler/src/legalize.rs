//! Phase `legalize`: rewrites the model graph into the *device graph* that
//! the later phases lower, in which every GEMM is rank 2 with untransposed
//! operands, and records where the device graph's host tensors sit in the
//! model's, so that the package's host interface is the model's own
//! ([`restore_host_tensors`]).
//!
//! - A GEMM whose B is rank 2 and whose A has batch dimensions is one GEMM
//!   over all the batch's rows: A `[..., M, K]` is row-major, so it is the
//!   same bytes as `[B*M, K]` (B the product of the batch dimensions), and
//!   the result `[B*M, N]` the same bytes as `[..., M, N]`. Such *flat*
//!   values flow on through row-wise operations (a bias add with an `[N]`
//!   operand, gelu, layernorm, softmax, cast) and into later GEMMs as A, and
//!   keep their model names.
//! - A GEMM whose B has batch dimensions is one GEMM per batch element of
//!   its result, `c.0`, `c.1`, ... in row-major order of the batch indices
//!   (numpy broadcasting picks each operand's element). An operand's slice
//!   is a host tensor of its own (`a.0`, `b.1`: a contiguous byte range of
//!   the model's tensor) or the matching slice of an earlier sliced value.
//!   Row-wise operations on sliced values run per slice. A computed value
//!   that such a GEMM reads, or that a row-wise operation broadcasts
//!   against a `[M, N]` operand, is computed per batch element from the
//!   start, and so is what it is computed from ([`sliced_values`]).
//! - Batched attention is one block per batch element: every value an
//!   attention block reads, and the batched values behind it, are computed
//!   per element ([`sliced_values`]), host operands are sliced per element
//!   (`x.0`, `x.1`), and the device graph is put in element-major order so
//!   that each element's block is a segment.
//! - A transposed host operand (`transpose_a` or `transpose_b` on an input
//!   or param) becomes a device host tensor `w.t` holding it transposed;
//!   the package marks the model's tensor `transposed` and the host
//!   rearranges it (`ipu_package::transposed_order`).
//! - A transposed operand computed on the device is read through a device
//!   `transpose` of it (`h.t`, one per value however many GEMMs read it
//!   transposed), which [`crate::transpose`] lowers in a segment of its
//!   own. A batched one is transposed per batch element (`h.0.t`, ...;
//!   [`sliced_values`] computes it per element), as is a batched value
//!   under the model's own `transpose`. A device transpose is mapped to
//!   its operand's model tensor, transposed, but never checkpointed: the
//!   operand itself is.
//!
//! A graph without batched or transposed GEMMs or transposes is returned
//! unchanged, so its packages are byte-identical to what they were before
//! this phase. Whatever the device graph cannot express (an operand that
//! would have to be flattened after being computed per element) is
//! refused here with the value and the reason.

use crate::error::CompileError;
use crate::lower::{HostPlacement, HostTensor, Lowered};
use ipu_graph::{Graph, Op, TensorType, ValueDef, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Where a device host tensor's bytes sit in the model's tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMap {
    /// The model's value.
    pub name: String,
    /// Its type in the model.
    pub ty: TensorType,
    /// Byte offset in the model's tensor of the device tensor's first
    /// element (a batch slice's start).
    pub offset: u64,
    /// Whether the device tensor holds the model's tensor transposed
    /// (every batch element on its own, as `ipu_package::transposed_order`
    /// lays it out); `offset` is then in that order.
    pub transposed: bool,
}

impl HostMap {
    /// The model tensor's byte offset of the device tensor's byte `d`.
    pub fn model_offset(&self, d: u64) -> u64 {
        if !self.transposed {
            return self.offset + d;
        }
        let es = self.ty.dtype.size_bytes() as u64;
        let e = ipu_package::natural_element((self.offset + d) / es, self.ty.shape.dims());
        e * es + d % es
    }
}

/// The device graph and how its host tensors map onto the model's.
#[derive(Clone, Debug)]
pub struct Legalized {
    pub graph: Graph,
    /// Device values the host reads or writes that differ from the model's
    /// (renamed, retyped, sliced or transposed), by device name.
    pub host: BTreeMap<String, HostMap>,
}

/// Rewrites `model` into its device graph (see the module documentation).
pub fn legalize(model: &Graph) -> Result<Legalized, CompileError> {
    let needed = model.nodes().iter().any(|n| match n.op {
        Op::Gemm {
            transpose_a,
            transpose_b,
            ..
        } => transpose_a || transpose_b || n.args.iter().any(|&a| model.ty(a).shape.rank() > 2),
        Op::SplitHeads { .. } => model.ty(n.args[0]).shape.rank() > 2,
        Op::Attention { .. } | Op::MergeHeads => model.ty(n.args[0]).shape.rank() > 3,
        Op::Transpose => true,
        _ => false,
    });
    if !needed {
        return Ok(Legalized {
            graph: model.clone(),
            host: BTreeMap::new(),
        });
    }
    let mut r = Rewriter {
        model,
        sliced: sliced_values(model),
        slice_of: BTreeMap::new(),
        device: Graph::new(model.name()),
        forms: vec![None; model.values().len()],
        views: BTreeMap::new(),
        transposes: BTreeMap::new(),
        host: BTreeMap::new(),
        names: model.values().iter().map(|v| v.name.clone()).collect(),
    };
    for node in model.nodes() {
        let form = r.node(node)?;
        r.forms[node.result.0 as usize] = Some(form);
    }
    r.record_computed();
    for &out in model.outputs() {
        for id in r.output_values(out)? {
            r.device
                .add_output(id)
                .map_err(|e| r.unsupported(out, "output", e.to_string()))?;
        }
    }
    let graph = if r.slice_of.is_empty() {
        r.device
    } else {
        staged_element_major(&r.device, &r.slice_of)
    };
    Ok(Legalized {
        graph,
        host: r.host,
    })
}

/// `device` with its nodes in staged element-major order. A node's
/// *stage* counts the changes of segment kind ([`crate::segment::Kind`]:
/// GEMMs and attention, row-wise operations, device transposes) on the
/// longest path of computed values into it. Nodes go in stage order, and
/// within a stage in element-major order: first every node computed for
/// the whole batch, then batch element 0's nodes, then 1's, each in the
/// model's order. Segments are contiguous runs of nodes of one kind, so
/// each batch element's run of GEMMs (an attention block, a GEMM chain)
/// becomes a segment of its own, while the elements' row-wise operations
/// and device transposes of one stage share a segment and run side by
/// side: a materialised attention per head (projections, a transpose of
/// K, scores, a softmax, P V) takes 5 segments for any number of heads,
/// where plain element-major order cut 6 per head. The order is
/// topological: a node's stage is at least each operand's, and within a
/// stage whole-batch values never read per-element ones, and a
/// per-element value reads elements of its own index or (broadcast) a
/// lower one.
fn staged_element_major(device: &Graph, slice_of: &BTreeMap<ValueId, usize>) -> Graph {
    let kinds = crate::segment::node_kinds(device);
    let mut stage_of: BTreeMap<ValueId, (usize, crate::segment::Kind)> = BTreeMap::new();
    let mut keys: Vec<(usize, usize, usize)> = Vec::new();
    for (n, node) in device.nodes().iter().enumerate() {
        let kind = kinds[n];
        let stage = node
            .args
            .iter()
            .filter_map(|a| stage_of.get(a))
            .map(|&(s, k)| s + usize::from(k != kind))
            .max()
            .unwrap_or(0);
        stage_of.insert(node.result, (stage, kind));
        let element = slice_of.get(&node.result).map_or(0, |&i| i + 1);
        keys.push((stage, element, n));
    }
    keys.sort();
    let order: Vec<usize> = keys.into_iter().map(|(_, _, n)| n).collect();
    reordered(device, &order)
}

/// `device` with its nodes in `order` (a topological order), every host
/// value declared before its first reader.
fn reordered(device: &Graph, order: &[usize]) -> Graph {
    let mut g = Graph::new(device.name());
    let mut ids: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    let declare = |g: &mut Graph, ids: &mut BTreeMap<ValueId, ValueId>, v: ValueId| {
        if let Some(&id) = ids.get(&v) {
            return id;
        }
        let value = device.value(v);
        let id = match value.def {
            ValueDef::Param => g.add_param(&value.name, value.ty.clone()),
            _ => g.add_input(&value.name, value.ty.clone()),
        }
        .expect("the device graph's names and types are valid");
        ids.insert(v, id);
        id
    };
    for &n in order {
        let node = &device.nodes()[n];
        let args: Vec<ValueId> = node
            .args
            .iter()
            .map(|&a| declare(&mut g, &mut ids, a))
            .collect();
        let id = g
            .add_op(&device.value(node.result).name, node.op.clone(), &args)
            .expect("the device graph's nodes type-check in any topological order");
        ids.insert(node.result, id);
    }
    for &o in device.outputs() {
        let id = declare(&mut g, &mut ids, o);
        g.add_output(id).expect("outputs are distinct");
    }
    g
}

/// Rewrites the lowered program's host tensors (the calls' inputs and
/// outputs, the resident values) from the device graph's to the model's:
/// each placement's host offset moves into the model's tensor, and the
/// device tensors of one model value become one tensor, in the order their
/// first appears. A model tensor that the device holds only transposed
/// keeps its placements in the transposed order, which the manifest says
/// (`transposed`) and the host forms: its placements stay as contiguous
/// as the device tensor's. One held both ways is placed element by
/// element in its own order.
pub fn restore_host_tensors(lowered: &mut Lowered, host: &BTreeMap<String, HostMap>) {
    if host.is_empty() {
        return;
    }
    // A device transpose of a computed value stays on the device between
    // segments like any value, but the value itself is checkpointed where
    // its producer left it: the transposed copy would name it twice.
    lowered
        .resident
        .retain(|t| host.get(&t.name).is_none_or(|m| !m.transposed));
    // Device tensors the lowering itself placed transposed (attention over
    // inputs, an attention's transposed projections) keep their names and
    // their order.
    let prior = std::mem::take(&mut lowered.transposed_host);
    // A transposed projection of a sliced or renamed value (a batch
    // element's) would need its placements moved into the model's order
    // element by element: it is left out of the checkpoints instead (its
    // attention still is checked against the whole-graph reference).
    lowered
        .resident
        .retain(|t| !(prior.contains(&t.name) && host.contains_key(&t.name)));
    let all = lowered
        .io
        .iter()
        .flat_map(|(ins, outs)| ins.iter().chain(outs))
        .chain(&lowered.resident);
    let mut ways: BTreeMap<&str, BTreeSet<bool>> = BTreeMap::new();
    for t in all {
        let (name, transposed) = match host.get(&t.name) {
            Some(m) => (m.name.as_str(), m.transposed),
            None => (t.name.as_str(), prior.contains(&t.name)),
        };
        ways.entry(name).or_default().insert(transposed);
    }
    let transposed: BTreeSet<String> = ways
        .into_iter()
        .filter(|(_, w)| !w.contains(&false))
        .map(|(n, _)| n.to_string())
        .collect();
    for (ins, outs) in &mut lowered.io {
        *ins = restore(ins, host, &transposed);
        *outs = restore(outs, host, &transposed);
    }
    lowered.resident = restore(&lowered.resident, host, &transposed);
    lowered.transposed_host = transposed;
    // A rewritten slice leaves its model tensor without a whole intact copy.
    lowered.rewritten = std::mem::take(&mut lowered.rewritten)
        .into_iter()
        .map(|n| host.get(&n).map_or(n, |m| m.name.clone()))
        .collect();
}

fn restore(
    tensors: &[HostTensor],
    host: &BTreeMap<String, HostMap>,
    transposed: &BTreeSet<String>,
) -> Vec<HostTensor> {
    let mut out: Vec<HostTensor> = Vec::new();
    for t in tensors {
        let (name, ty, placements) = match host.get(&t.name) {
            None => (t.name.clone(), t.ty.clone(), t.placements.clone()),
            Some(m) => (
                m.name.clone(),
                m.ty.clone(),
                t.placements
                    .iter()
                    .flat_map(|p| restore_placement(p, m, transposed.contains(&m.name)))
                    .collect(),
            ),
        };
        match out.iter_mut().find(|o| o.name == name) {
            Some(o) => o.placements.extend(placements),
            None => out.push(HostTensor {
                name,
                ty,
                placements,
            }),
        }
    }
    out
}

/// `p` with its host offset in the model's tensor: in the transposed order
/// when `keep_transposed` (one placement), else in the model's own order,
/// which for a transposed device tensor is one placement per element
/// (consecutive device elements are a column of the model's tensor, one
/// row apart).
fn restore_placement(p: &HostPlacement, m: &HostMap, keep_transposed: bool) -> Vec<HostPlacement> {
    if !m.transposed || keep_transposed {
        return vec![HostPlacement {
            host_offset: m.offset + p.host_offset,
            ..*p
        }];
    }
    let es = m.ty.dtype.size_bytes() as u32;
    debug_assert!(p.host_offset.is_multiple_of(es as u64) && p.bytes.is_multiple_of(es));
    (0..p.bytes / es)
        .map(|i| HostPlacement {
            buffer_offset: p.buffer_offset + i * es,
            host_offset: m.model_offset(p.host_offset + (i * es) as u64),
            bytes: es,
            ..*p
        })
        .collect()
}

/// How a computed model value exists in the device graph.
#[derive(Clone, Debug)]
enum Form {
    /// As the model has it.
    Same(ValueId),
    /// Its batch dimensions flattened into its rows: `[B*M, N]` for the
    /// model's `[..., M, N]`.
    Flat(ValueId),
    /// One device value per batch element (row-major batch order).
    Slices(Vec<ValueId>),
}

/// A host value as an operand wants it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum View {
    /// Batch dimensions flattened into rows (the value itself when rank <= 2).
    Flat,
    /// Its last two axes swapped, batch dimensions flattened.
    Transposed,
    /// One batch element.
    Slice(usize),
    /// One batch element, transposed.
    SliceTransposed(usize),
    /// One element of the dimensions before the last three (an attention
    /// operand `[..., H, S, D]`'s batch element `[H, S, D]`).
    HeadsSlice(usize),
}

struct Rewriter<'g> {
    model: &'g Graph,
    /// Computed values that must exist per batch element ([`sliced_values`]).
    sliced: Vec<bool>,
    /// The batch element of every device value computed per element.
    slice_of: BTreeMap<ValueId, usize>,
    device: Graph,
    forms: Vec<Option<Form>>,
    views: BTreeMap<(ValueId, View), ValueId>,
    /// The device transpose of each device value transposed so far, so
    /// that a value read transposed by several GEMMs is transposed once.
    transposes: BTreeMap<ValueId, ValueId>,
    host: BTreeMap<String, HostMap>,
    names: BTreeSet<String>,
}

/// Computed values that must exist one per batch element, to a fixed
/// point of two rules:
/// - backwards, from what needs its operands per element: an attention
///   block's batched operands (the compiler lowers attention per
///   sequence), a GEMM's batched operands when its B has batch dimensions
///   (one GEMM per batch element), and the batched operands of a value
///   computed per element (a projection of a batch of sequences is then
///   one GEMM per sequence, not one over all rows);
/// - forwards, to a batched GEMM or row-wise value from an operand computed
///   per element, or from an operand of rank 2 or more whose shape is not
///   the result's (a `[M, N]` or `[1, M, N]` value broadcast over the
///   batch: the rows of a flattened value would not line up with it).
fn sliced_values(model: &Graph) -> Vec<bool> {
    let computed_batched = |a: ValueId| {
        matches!(model.value(a).def, ValueDef::Node(_)) && model.ty(a).shape.rank() > 2
    };
    let mut sliced = vec![false; model.values().len()];
    loop {
        let before = sliced.clone();
        for node in model.nodes() {
            let r = node.result;
            let rowwise = matches!(
                node.op,
                Op::Add | Op::Gelu | Op::LayerNorm { .. } | Op::Softmax | Op::Cast { .. }
            );
            // A device transpose swaps the axes of one rank-2 matrix, so a
            // batched value is transposed batch element by batch element.
            if matches!(node.op, Op::Transpose) && model.ty(r).shape.rank() > 2 {
                sliced[r.0 as usize] = true;
                continue;
            }
            if model.ty(r).shape.rank() <= 2 || !(rowwise || matches!(node.op, Op::Gemm { .. })) {
                continue;
            }
            let batched_b =
                matches!(node.op, Op::Gemm { .. }) && model.ty(node.args[1]).shape.rank() > 2;
            let broadcast = rowwise
                && node.args.iter().any(|&a| {
                    let ty = model.ty(a);
                    ty.shape.rank() >= 2 && ty.shape.dims() != model.ty(r).shape.dims()
                });
            let from_operand = node
                .args
                .iter()
                .any(|&a| computed_batched(a) && sliced[a.0 as usize]);
            if batched_b || broadcast || from_operand {
                sliced[r.0 as usize] = true;
            }
        }
        for node in model.nodes().iter().rev() {
            let r = node.result.0 as usize;
            // A GEMM reading a computed batched operand transposed reads
            // it per element, each element transposed on the device.
            if let Op::Gemm {
                transpose_a,
                transpose_b,
                ..
            } = node.op
            {
                for (&a, t) in node.args.iter().zip([transpose_a, transpose_b]) {
                    if t && computed_batched(a) {
                        sliced[a.0 as usize] = true;
                    }
                }
            }
            let base = match node.op {
                Op::SplitHeads { .. } => Some(2),
                Op::Attention { .. } | Op::MergeHeads => Some(3),
                _ => None,
            };
            let demand = match base {
                Some(rank) => node.args.iter().any(|&a| model.ty(a).shape.rank() > rank),
                None => sliced[r],
            };
            if !demand {
                continue;
            }
            sliced[r] = true;
            for &a in &node.args {
                // Rank-2 operands (weights, a broadcast value) serve every
                // batch element as they are.
                if computed_batched(a) {
                    sliced[a.0 as usize] = true;
                }
            }
        }
        if sliced == before {
            return sliced;
        }
    }
}

/// The batch dimensions of a model type (all but the last two).
fn batch_dims(ty: &TensorType) -> &[usize] {
    let d = ty.shape.dims();
    &d[..d.len().saturating_sub(2)]
}

/// The flat index, in an operand's own batch dimensions `own`, of the
/// result's batch element `index` (of the result's batch dimensions
/// `out`): numpy broadcasting aligns the trailing dimensions and reads
/// index 0 of a dimension of size 1.
fn broadcast_index(index: &[usize], out: &[usize], own: &[usize]) -> usize {
    let skip = out.len() - own.len();
    own.iter().enumerate().fold(0, |flat, (j, &d)| {
        flat * d + if d == 1 { 0 } else { index[skip + j] }
    })
}

/// The multi-index of flat batch element `i` of `dims` (row-major).
fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for (j, &d) in dims.iter().enumerate().rev() {
        index[j] = i % d;
        i /= d;
    }
    index
}

impl Rewriter<'_> {
    fn unsupported(&self, v: ValueId, operation: &str, reason: String) -> CompileError {
        CompileError::Unsupported {
            value: self.model.value(v).name.clone(),
            operation: operation.to_string(),
            reason,
        }
    }

    /// A name no model or device value has, from `base`.
    fn fresh(&mut self, base: String) -> String {
        let mut name = base;
        while self.names.contains(&name) {
            name.push('_');
        }
        self.names.insert(name.clone());
        name
    }

    fn is_host(&self, v: ValueId) -> bool {
        matches!(self.model.value(v).def, ValueDef::Input | ValueDef::Param)
    }

    /// The device value of host value `v` seen as `view`, declared on first use.
    fn host_view(&mut self, v: ValueId, view: View) -> Result<ValueId, CompileError> {
        if let Some(&id) = self.views.get(&(v, view)) {
            return Ok(id);
        }
        let value = self.model.value(v);
        let (name, ty, def) = (value.name.clone(), value.ty.clone(), value.def);
        let dims = ty.shape.dims().to_vec();
        let es = ty.dtype.size_bytes() as u64;
        let rank = dims.len();
        let (rows, cols) = if rank >= 2 {
            (dims[rank - 2], dims[rank - 1])
        } else {
            (1, dims.first().copied().unwrap_or(1))
        };
        let batch: usize = dims[..rank.saturating_sub(2)].iter().product();
        let map = |offset: u64, transposed: bool| HostMap {
            name: name.clone(),
            ty: ty.clone(),
            offset,
            transposed,
        };
        let slice_bytes = (rows * cols) as u64 * es;
        let (device_name, device_dims, m) = match view {
            View::Flat if rank <= 2 => (name.clone(), dims.clone(), None),
            View::Flat => (name.clone(), vec![batch * rows, cols], Some(map(0, false))),
            View::Transposed => (
                self.fresh(format!("{name}.t")),
                vec![batch * cols, rows],
                Some(map(0, true)),
            ),
            View::Slice(i) => (
                self.fresh(format!("{name}.{i}")),
                vec![rows, cols],
                Some(map(i as u64 * slice_bytes, false)),
            ),
            View::SliceTransposed(i) => (
                self.fresh(format!("{name}.{i}.t")),
                vec![cols, rows],
                Some(map(i as u64 * slice_bytes, true)),
            ),
            View::HeadsSlice(i) => {
                let trailing = dims[rank.saturating_sub(3)..].to_vec();
                let bytes = trailing.iter().product::<usize>() as u64 * es;
                (
                    self.fresh(format!("{name}.{i}")),
                    trailing,
                    Some(map(i as u64 * bytes, false)),
                )
            }
        };
        let device_ty = TensorType::new(ty.dtype, device_dims);
        let id = match def {
            ValueDef::Param => self.device.add_param(&device_name, device_ty),
            _ => self.device.add_input(&device_name, device_ty),
        }
        .map_err(|e| self.unsupported(v, "legalize", e.to_string()))?;
        if let Some(m) = m {
            self.host.insert(device_name, m);
        }
        self.views.insert((v, view), id);
        Ok(id)
    }

    fn form(&self, v: ValueId) -> &Form {
        self.forms[v.0 as usize]
            .as_ref()
            .expect("operands are defined before their users")
    }

    /// `v` with its batch dimensions flattened into rows.
    fn flat(&mut self, v: ValueId, user: ValueId, op: &str) -> Result<ValueId, CompileError> {
        if self.is_host(v) {
            return self.host_view(v, View::Flat);
        }
        match self.form(v).clone() {
            Form::Flat(id) => Ok(id),
            Form::Same(id) if self.model.ty(v).shape.rank() <= 2 => Ok(id),
            Form::Same(_) => Err(self.unsupported(
                user,
                op,
                format!(
                    "operand `{}` ({}) would need its batch dimensions flattened, which is not lowered yet",
                    self.model.value(v).name,
                    self.model.ty(v)
                ),
            )),
            Form::Slices(_) => Err(self.unsupported(
                user,
                op,
                format!(
                    "operand `{}` is computed per batch element and cannot be read as flattened rows yet",
                    self.model.value(v).name
                ),
            )),
        }
    }

    /// Operand `v` of batch element `index` of a result with batch
    /// dimensions `out` (transposed when `transpose`).
    fn slice(
        &mut self,
        v: ValueId,
        (index, out): (&[usize], &[usize]),
        transpose: bool,
        (user, op): (ValueId, &str),
    ) -> Result<ValueId, CompileError> {
        let ty = self.model.ty(v).clone();
        let own = batch_dims(&ty).to_vec();
        if ty.shape.rank() <= 2 {
            // Broadcast over the batch: the whole operand for every element.
            return self.whole(v, transpose, (user, op));
        }
        let i = broadcast_index(index, out, &own);
        if self.is_host(v) {
            let view = if transpose {
                View::SliceTransposed(i)
            } else {
                View::Slice(i)
            };
            return self.host_view(v, view);
        }
        match self.form(v).clone() {
            Form::Slices(ids) if transpose => self.device_transpose(ids[i], user, None),
            Form::Slices(ids) => Ok(ids[i]),
            _ => Err(self.unsupported(
                user,
                op,
                format!(
                    "operand `{}` is computed with its batch dimensions flattened and cannot be read per batch element yet",
                    self.model.value(v).name
                ),
            )),
        }
    }

    /// Operand `v` whole (its batch dimensions flattened), transposed when
    /// `transpose`: a host operand as a transposed host tensor, a computed
    /// one through its device transpose.
    fn whole(
        &mut self,
        v: ValueId,
        transpose: bool,
        (user, op): (ValueId, &str),
    ) -> Result<ValueId, CompileError> {
        if !transpose {
            return self.flat(v, user, op);
        }
        if self.is_host(v) {
            return self.host_view(v, View::Transposed);
        }
        let flat = self.flat(v, user, op)?;
        self.device_transpose(flat, user, None)
    }

    /// The device transpose of device value `id` (rank 2), added on first
    /// use as `transpose(id)` named `name` (or `{id}.t`); it belongs to the
    /// batch element `id` belongs to.
    fn device_transpose(
        &mut self,
        id: ValueId,
        user: ValueId,
        name: Option<&str>,
    ) -> Result<ValueId, CompileError> {
        if let Some(&t) = self.transposes.get(&id) {
            return Ok(t);
        }
        let name = match name {
            Some(n) => n.to_string(),
            None => self.fresh(format!("{}.t", self.device.value(id).name)),
        };
        let t = self.add(user, &name, Op::Transpose, &[id])?;
        if let Some(&i) = self.slice_of.get(&id) {
            self.slice_of.insert(t, i);
        }
        self.transposes.insert(id, t);
        Ok(t)
    }

    fn add(
        &mut self,
        user: ValueId,
        name: &str,
        op: Op,
        args: &[ValueId],
    ) -> Result<ValueId, CompileError> {
        let op_name = op.name();
        self.device
            .add_op(name, op, args)
            .map_err(|e| self.unsupported(user, op_name, format!("in the device graph: {e}")))
    }

    /// Batch element `i`'s device value of model value `r`, named after it.
    fn add_slice(
        &mut self,
        r: ValueId,
        i: usize,
        op: Op,
        args: &[ValueId],
    ) -> Result<ValueId, CompileError> {
        let name = self.fresh(format!("{}.{i}", self.model.value(r).name));
        let id = self.add(r, &name, op, args)?;
        self.slice_of.insert(id, i);
        Ok(id)
    }

    fn node(&mut self, node: &ipu_graph::Node) -> Result<Form, CompileError> {
        let r = node.result;
        let name = self.model.value(r).name.clone();
        let op_name = node.op.name();
        match node.op {
            Op::Gemm {
                transpose_a,
                transpose_b,
                out,
            } => {
                let (a, b) = (node.args[0], node.args[1]);
                let gemm = Op::Gemm {
                    transpose_a: false,
                    transpose_b: false,
                    out,
                };
                // Per batch element when the result must be (it feeds an
                // attention block) or A already is.
                let a_sliced = !self.is_host(a) && matches!(self.form(a), Form::Slices(_));
                let per_element =
                    (self.sliced[r.0 as usize] || a_sliced) && self.model.ty(r).shape.rank() > 2;
                if self.model.ty(b).shape.rank() <= 2 && !per_element {
                    let a_dev = self.whole(a, transpose_a, (r, op_name))?;
                    let b_dev = self.whole(b, transpose_b, (r, op_name))?;
                    let id = self.add(r, &name, gemm, &[a_dev, b_dev])?;
                    return Ok(if self.model.ty(r).shape.rank() > 2 {
                        Form::Flat(id)
                    } else {
                        Form::Same(id)
                    });
                }
                let out_batch = batch_dims(self.model.ty(r)).to_vec();
                let count: usize = out_batch.iter().product();
                let mut ids = Vec::with_capacity(count);
                for i in 0..count {
                    let index = unravel(i, &out_batch);
                    let a_i = self.slice(a, (&index, &out_batch), transpose_a, (r, op_name))?;
                    let b_i = self.slice(b, (&index, &out_batch), transpose_b, (r, op_name))?;
                    ids.push(self.add_slice(r, i, gemm.clone(), &[a_i, b_i])?);
                }
                Ok(Form::Slices(ids))
            }
            Op::Transpose => {
                let a = node.args[0];
                if self.model.ty(a).shape.rank() <= 2 {
                    let id = self.flat(a, r, op_name)?;
                    let t = self.device_transpose(id, r, Some(&name))?;
                    // Transposed earlier for a GEMM under another name, the
                    // host map names the model's value.
                    return Ok(if self.device.value(t).name == name {
                        Form::Same(t)
                    } else {
                        Form::Flat(t)
                    });
                }
                // Batch element by batch element ([`sliced_values`] marks
                // the result and a computed operand per element).
                let out_batch = batch_dims(self.model.ty(r)).to_vec();
                let count: usize = out_batch.iter().product();
                let mut ids = Vec::with_capacity(count);
                for i in 0..count {
                    let index = unravel(i, &out_batch);
                    let id = self.slice(a, (&index, &out_batch), false, (r, op_name))?;
                    ids.push(self.device_transpose(id, r, None)?);
                }
                Ok(Form::Slices(ids))
            }
            Op::Add | Op::Gelu | Op::LayerNorm { .. } | Op::Softmax | Op::Cast { .. } => {
                let computed = |s: &Self, pred: fn(&Form) -> bool| {
                    node.args.iter().any(|&a| !s.is_host(a) && pred(s.form(a)))
                };
                if computed(self, |f| matches!(f, Form::Slices(_)))
                    || (self.sliced[r.0 as usize] && self.model.ty(r).shape.rank() > 2)
                {
                    let out_batch = batch_dims(self.model.ty(r)).to_vec();
                    let count: usize = out_batch.iter().product();
                    let mut ids = Vec::with_capacity(count);
                    for i in 0..count {
                        let index = unravel(i, &out_batch);
                        let mut args = Vec::with_capacity(node.args.len());
                        for &a in &node.args {
                            let ty = self.model.ty(a);
                            // Operands of rank 1 (a bias, gamma, beta)
                            // broadcast to every slice as they are.
                            let id = if ty.shape.rank() <= 1 {
                                self.flat(a, r, op_name)?
                            } else {
                                self.slice(a, (&index, &out_batch), false, (r, op_name))?
                            };
                            args.push(id);
                        }
                        ids.push(self.add_slice(r, i, node.op.clone(), &args)?);
                    }
                    return Ok(Form::Slices(ids));
                }
                let flat = computed(self, |f| matches!(f, Form::Flat(_)))
                    || node
                        .args
                        .iter()
                        .any(|&a| self.is_host(a) && self.model.ty(a).shape.rank() > 2);
                let args = node
                    .args
                    .iter()
                    .map(|&a| self.flat(a, r, op_name))
                    .collect::<Result<Vec<_>, _>>()?;
                let id = self.add(r, &name, node.op.clone(), &args)?;
                Ok(if flat && self.model.ty(r).shape.rank() > 2 {
                    Form::Flat(id)
                } else {
                    Form::Same(id)
                })
            }
            Op::SplitHeads { .. } | Op::Attention { .. } | Op::MergeHeads
                if self.sliced[r.0 as usize] =>
            {
                // One block per batch element: every operand is sliced
                // over the same batch dimensions (no broadcasting here).
                let base = if matches!(node.op, Op::SplitHeads { .. }) {
                    2
                } else {
                    3
                };
                let dims = self.model.ty(node.args[0]).shape.dims().to_vec();
                let batch = dims[..dims.len() - base].to_vec();
                let count: usize = batch.iter().product();
                let mut per_arg = Vec::with_capacity(node.args.len());
                for &a in &node.args {
                    let d = self.model.ty(a).shape.dims().to_vec();
                    let host = self.is_host(a);
                    let ids = match (host, self.forms[a.0 as usize].clone()) {
                        (false, Some(Form::Slices(ids)))
                            if d.len() >= base && d[..d.len() - base] == batch[..] =>
                        {
                            ids
                        }
                        // A host operand: its batch elements as host
                        // tensors of their own (contiguous byte ranges).
                        (true, _) if d.len() == base + batch.len() && d[..batch.len()] == batch[..] => {
                            let mut ids = Vec::with_capacity(count);
                            for i in 0..count {
                                let view = if base == 3 {
                                    View::HeadsSlice(i)
                                } else {
                                    View::Slice(i)
                                };
                                ids.push(self.host_view(a, view)?);
                            }
                            ids
                        }

                        _ => {
                            return Err(self.unsupported(
                                r,
                                op_name,
                                format!(
                                    "operand `{}` ({}) is not computed per batch element like the block's other operands; batched attention needs batched GEMM projections or inputs with the same batch dimensions",
                                    self.model.value(a).name,
                                    self.model.ty(a)
                                ),
                            ))
                        }
                    };
                    per_arg.push(ids);
                }
                let mut ids = Vec::with_capacity(count);
                for i in 0..count {
                    let args: Vec<ValueId> = per_arg.iter().map(|v| v[i]).collect();
                    ids.push(self.add_slice(r, i, node.op.clone(), &args)?);
                }
                Ok(Form::Slices(ids))
            }
            Op::SplitHeads { .. } | Op::Attention { .. } | Op::MergeHeads => {
                let mut args = Vec::with_capacity(node.args.len());
                for &a in &node.args {
                    let id = if self.is_host(a) && self.model.ty(a).shape.rank() <= 2 {
                        self.host_view(a, View::Flat)?
                    } else if !self.is_host(a) && matches!(self.form(a), Form::Same(_)) {
                        let Form::Same(id) = *self.form(a) else {
                            unreachable!()
                        };
                        id
                    } else {
                        return Err(self.unsupported(
                            r,
                            op_name,
                            format!(
                                "operand `{}` ({}) has batch dimensions the block's other operands lack",
                                self.model.value(a).name,
                                self.model.ty(a)
                            ),
                        ));
                    };
                    args.push(id);
                }
                Ok(Form::Same(self.add(r, &name, node.op.clone(), &args)?))
            }
        }
    }

    /// The device values that make up model output `v` (the host map
    /// names their place in it: [`Rewriter::record_computed`]).
    fn output_values(&mut self, v: ValueId) -> Result<Vec<ValueId>, CompileError> {
        if self.is_host(v) {
            return Ok(vec![self.host_view(v, View::Flat)?]);
        }
        Ok(match self.form(v).clone() {
            Form::Same(id) | Form::Flat(id) => vec![id],
            Form::Slices(ids) => ids,
        })
    }

    /// Host-map entries of every flat or sliced computed value.
    fn record_computed(&mut self) {
        for (i, form) in self.forms.iter().enumerate() {
            let v = ValueId(i as u32);
            let value = self.model.value(v);
            // Slices split the value's bytes evenly, in batch order.
            let slice_bytes = match form {
                Some(Form::Slices(ids)) => value.ty.bytes() / ids.len() as u64,
                _ => 0,
            };
            let entry = |offset| HostMap {
                name: value.name.clone(),
                ty: value.ty.clone(),
                offset,
                transposed: false,
            };
            match form {
                Some(Form::Flat(id)) => {
                    self.host
                        .insert(self.device.value(*id).name.clone(), entry(0));
                }
                Some(Form::Slices(ids)) => {
                    for (k, id) in ids.iter().enumerate() {
                        self.host.insert(
                            self.device.value(*id).name.clone(),
                            entry(k as u64 * slice_bytes),
                        );
                    }
                }
                _ => {}
            }
        }
        // A device transpose holds its operand's model tensor (or that
        // tensor's batch element) transposed, which checkpoints and
        // outputs name that way; a model's own transpose keeps the entry
        // made above.
        let transposes: Vec<(ValueId, ValueId)> =
            self.transposes.iter().map(|(&s, &t)| (s, t)).collect();
        for (source, t) in transposes {
            let source_name = self.device.value(source).name.clone();
            let base = match self.host.get(&source_name) {
                Some(m) => m.clone(),
                None => match self.model.lookup(&source_name) {
                    Some(v) => HostMap {
                        name: source_name,
                        ty: self.model.ty(v).clone(),
                        offset: 0,
                        transposed: false,
                    },
                    None => continue,
                },
            };
            let name = self.device.value(t).name.clone();
            if self.model.lookup(&name).is_none() {
                self.host.entry(name).or_insert(HostMap {
                    transposed: !base.transposed,
                    ..base
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn model(name: &str) -> Graph {
        let path = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
            .join("../../models")
            .join(name);
        ipu_graph::parse_file(&path).unwrap()
    }

    fn legal(text: &str) -> Result<Legalized, String> {
        let g = ipu_graph::parse("t.ipug", text).map_err(|e| e.to_string())?;
        legalize(&g).map_err(|e| e.to_string())
    }

    /// The device graph in the text format, then the host map a line each.
    fn check(graph: &Graph, want: Expect) {
        let l = legalize(graph).unwrap();
        ipu_graph::verify(&l.graph).unwrap();
        let mut text = ipu_graph::print(&l.graph);
        for (device, m) in &l.host {
            text.push_str(&format!(
                "host {device} -> {}: {} offset {} transposed {}\n",
                m.name, m.ty, m.offset, m.transposed
            ));
        }
        want.assert_eq(&text);
    }

    /// A batch of sequences through attention: the projections, the
    /// block and the output projection per sequence, element-major, so
    /// that each sequence's block is a segment of its own.
    #[test]
    fn batched_attention_is_one_block_per_sequence() {
        check(
            &model("attention_batched_small.ipug"),
            expect![[r#"
                model attention_batched_small
                input x.0: f16[17, 72]
                param wq: f16[72, 72]
                q.0: f16[17, 72] = gemm(x.0, wq)
                param wk: f16[72, 72]
                k.0: f16[17, 72] = gemm(x.0, wk)
                param wv: f16[72, 72]
                v.0: f16[17, 72] = gemm(x.0, wv)
                qh.0: f16[4, 17, 18] = split_heads(q.0, heads=4)
                kh.0: f16[4, 17, 18] = split_heads(k.0, heads=4)
                vh.0: f16[4, 17, 18] = split_heads(v.0, heads=4)
                o.0: f16[4, 17, 18] = attention(qh.0, kh.0, vh.0, causal=true)
                m.0: f16[17, 72] = merge_heads(o.0)
                param wo.t: f16[72, 72]
                y.0: f16[17, 72] = gemm(m.0, wo.t)
                input x.1: f16[17, 72]
                q.1: f16[17, 72] = gemm(x.1, wq)
                k.1: f16[17, 72] = gemm(x.1, wk)
                v.1: f16[17, 72] = gemm(x.1, wv)
                qh.1: f16[4, 17, 18] = split_heads(q.1, heads=4)
                kh.1: f16[4, 17, 18] = split_heads(k.1, heads=4)
                vh.1: f16[4, 17, 18] = split_heads(v.1, heads=4)
                o.1: f16[4, 17, 18] = attention(qh.1, kh.1, vh.1, causal=true)
                m.1: f16[17, 72] = merge_heads(o.1)
                y.1: f16[17, 72] = gemm(m.1, wo.t)
                output y.0
                output y.1
                host k.0 -> k: f16[2, 17, 72] offset 0 transposed false
                host k.1 -> k: f16[2, 17, 72] offset 2448 transposed false
                host kh.0 -> kh: f16[2, 4, 17, 18] offset 0 transposed false
                host kh.1 -> kh: f16[2, 4, 17, 18] offset 2448 transposed false
                host m.0 -> m: f16[2, 17, 72] offset 0 transposed false
                host m.1 -> m: f16[2, 17, 72] offset 2448 transposed false
                host o.0 -> o: f16[2, 4, 17, 18] offset 0 transposed false
                host o.1 -> o: f16[2, 4, 17, 18] offset 2448 transposed false
                host q.0 -> q: f16[2, 17, 72] offset 0 transposed false
                host q.1 -> q: f16[2, 17, 72] offset 2448 transposed false
                host qh.0 -> qh: f16[2, 4, 17, 18] offset 0 transposed false
                host qh.1 -> qh: f16[2, 4, 17, 18] offset 2448 transposed false
                host v.0 -> v: f16[2, 17, 72] offset 0 transposed false
                host v.1 -> v: f16[2, 17, 72] offset 2448 transposed false
                host vh.0 -> vh: f16[2, 4, 17, 18] offset 0 transposed false
                host vh.1 -> vh: f16[2, 4, 17, 18] offset 2448 transposed false
                host wo.t -> wo: f16[72, 72] offset 0 transposed true
                host x.0 -> x: f16[2, 17, 72] offset 0 transposed false
                host x.1 -> x: f16[2, 17, 72] offset 2448 transposed false
                host y.0 -> y: f16[2, 17, 72] offset 0 transposed false
                host y.1 -> y: f16[2, 17, 72] offset 2448 transposed false
            "#]],
        );
    }

    /// A batched attention straight over host values: each operand's
    /// batch elements are host tensors of their own (contiguous byte
    /// ranges: `[S, H * D]` slices through split_heads, `[H, S, D]` ones
    /// read directly), one block per element.
    #[test]
    fn batched_attention_over_inputs_slices_them() {
        let g = ipu_graph::parse(
            "t.ipug",
            "model m\ninput x: f16[2, 40, 64]\nparam k: f16[2, 4, 40, 16]\nxh = split_heads(x, heads=4)\no = attention(xh, k, xh, causal=false)\noutput o\n",
        )
        .unwrap();
        check(
            &g,
            expect![[r#"
                model m
                input x.0: f16[40, 64]
                xh.0: f16[4, 40, 16] = split_heads(x.0, heads=4)
                param k.0: f16[4, 40, 16]
                o.0: f16[4, 40, 16] = attention(xh.0, k.0, xh.0, causal=false)
                input x.1: f16[40, 64]
                xh.1: f16[4, 40, 16] = split_heads(x.1, heads=4)
                param k.1: f16[4, 40, 16]
                o.1: f16[4, 40, 16] = attention(xh.1, k.1, xh.1, causal=false)
                output o.0
                output o.1
                host k.0 -> k: f16[2, 4, 40, 16] offset 0 transposed false
                host k.1 -> k: f16[2, 4, 40, 16] offset 5120 transposed false
                host o.0 -> o: f16[2, 4, 40, 16] offset 0 transposed false
                host o.1 -> o: f16[2, 4, 40, 16] offset 5120 transposed false
                host x.0 -> x: f16[2, 40, 64] offset 0 transposed false
                host x.1 -> x: f16[2, 40, 64] offset 5120 transposed false
                host xh.0 -> xh: f16[2, 4, 40, 16] offset 0 transposed false
                host xh.1 -> xh: f16[2, 4, 40, 16] offset 5120 transposed false
            "#]],
        );
    }

    #[test]
    fn graphs_without_batched_or_transposed_gemms_stay_as_they_are() {
        for name in [
            "mlp_small.ipug",
            "attention_small.ipug",
            "vit_block_small.ipug",
        ] {
            let g = model(name);
            let l = legalize(&g).unwrap();
            assert_eq!(l.graph, g, "{name}");
            assert!(l.host.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_batched_a_with_a_rank_two_b_is_one_gemm_over_the_batch_rows() {
        check(
            &model("mlp_batched_small.ipug"),
            expect![[r#"
                model mlp_batched_small
                input x: f16[120, 64]
                param w1.t: f16[64, 96]
                h: f16[120, 96] = gemm(x, w1.t)
                param b1: f16[96]
                hb: f16[120, 96] = add(h, b1)
                g: f16[120, 96] = gelu(hb)
                param w2: f16[96, 48]
                o: f16[120, 48] = gemm(g, w2)
                param b2: f16[48]
                y: f16[120, 48] = add(o, b2)
                output y
                host g -> g: f16[3, 40, 96] offset 0 transposed false
                host h -> h: f16[3, 40, 96] offset 0 transposed false
                host hb -> hb: f16[3, 40, 96] offset 0 transposed false
                host o -> o: f16[3, 40, 48] offset 0 transposed false
                host w1.t -> w1: f16[96, 64] offset 0 transposed true
                host x -> x: f16[3, 40, 64] offset 0 transposed false
                host y -> y: f16[3, 40, 48] offset 0 transposed false
            "#]],
        );
    }

    #[test]
    fn a_batched_b_is_one_gemm_per_batch_element_with_broadcasting() {
        check(
            &model("gemm_batched_small.ipug"),
            expect![[r#"
                model gemm_batched_small
                input a.0: f16[40, 64]
                param b.0.t: f16[64, 48]
                c.0: f16[40, 48] = gemm(a.0, b.0.t)
                param bias: f16[48]
                d.0: f16[40, 48] = add(c.0, bias)
                e.0: f16[40, 48] = gelu(d.0)
                param b.1.t: f16[64, 48]
                c.1: f16[40, 48] = gemm(a.0, b.1.t)
                d.1: f16[40, 48] = add(c.1, bias)
                e.1: f16[40, 48] = gelu(d.1)
                param b.2.t: f16[64, 48]
                c.2: f16[40, 48] = gemm(a.0, b.2.t)
                d.2: f16[40, 48] = add(c.2, bias)
                e.2: f16[40, 48] = gelu(d.2)
                input a.1: f16[40, 64]
                c.3: f16[40, 48] = gemm(a.1, b.0.t)
                d.3: f16[40, 48] = add(c.3, bias)
                e.3: f16[40, 48] = gelu(d.3)
                c.4: f16[40, 48] = gemm(a.1, b.1.t)
                d.4: f16[40, 48] = add(c.4, bias)
                e.4: f16[40, 48] = gelu(d.4)
                c.5: f16[40, 48] = gemm(a.1, b.2.t)
                d.5: f16[40, 48] = add(c.5, bias)
                e.5: f16[40, 48] = gelu(d.5)
                output e.0
                output e.1
                output e.2
                output e.3
                output e.4
                output e.5
                host a.0 -> a: f16[2, 1, 40, 64] offset 0 transposed false
                host a.1 -> a: f16[2, 1, 40, 64] offset 5120 transposed false
                host b.0.t -> b: f16[3, 48, 64] offset 0 transposed true
                host b.1.t -> b: f16[3, 48, 64] offset 6144 transposed true
                host b.2.t -> b: f16[3, 48, 64] offset 12288 transposed true
                host c.0 -> c: f16[2, 3, 40, 48] offset 0 transposed false
                host c.1 -> c: f16[2, 3, 40, 48] offset 3840 transposed false
                host c.2 -> c: f16[2, 3, 40, 48] offset 7680 transposed false
                host c.3 -> c: f16[2, 3, 40, 48] offset 11520 transposed false
                host c.4 -> c: f16[2, 3, 40, 48] offset 15360 transposed false
                host c.5 -> c: f16[2, 3, 40, 48] offset 19200 transposed false
                host d.0 -> d: f16[2, 3, 40, 48] offset 0 transposed false
                host d.1 -> d: f16[2, 3, 40, 48] offset 3840 transposed false
                host d.2 -> d: f16[2, 3, 40, 48] offset 7680 transposed false
                host d.3 -> d: f16[2, 3, 40, 48] offset 11520 transposed false
                host d.4 -> d: f16[2, 3, 40, 48] offset 15360 transposed false
                host d.5 -> d: f16[2, 3, 40, 48] offset 19200 transposed false
                host e.0 -> e: f16[2, 3, 40, 48] offset 0 transposed false
                host e.1 -> e: f16[2, 3, 40, 48] offset 3840 transposed false
                host e.2 -> e: f16[2, 3, 40, 48] offset 7680 transposed false
                host e.3 -> e: f16[2, 3, 40, 48] offset 11520 transposed false
                host e.4 -> e: f16[2, 3, 40, 48] offset 15360 transposed false
                host e.5 -> e: f16[2, 3, 40, 48] offset 19200 transposed false
            "#]],
        );
    }

    /// Device names never collide with the model's: a model value already
    /// called `w.t` pushes the transposed view to `w.t_`.
    #[test]
    fn device_names_avoid_the_models_names() {
        let l = legal(
            "model m\ninput x: f16[8, 16]\nparam w: f16[4, 16]\nparam w.t: f16[4, 4]\nh = gemm(x, w, transpose_b=true)\ny = gemm(h, w.t)\noutput y\n",
        )
        .unwrap();
        assert!(l.graph.lookup("w.t_").is_some());
        assert_eq!(l.host["w.t_"].name, "w");
        assert_eq!(
            l.graph.ty(l.graph.lookup("w.t").unwrap()).shape.dims(),
            [4, 4]
        );
    }

    /// A transposed map reads the model's tensor down its columns, batch
    /// element by batch element: device [batch][col][row] is model
    /// [batch][row][col].
    #[test]
    fn transposed_offsets_walk_the_models_columns() {
        let m = HostMap {
            name: "w".into(),
            ty: TensorType::new(ipu_graph::DType::F16, vec![2, 2, 3]),
            offset: 0,
            transposed: true,
        };
        let model_elements: Vec<u64> = (0..12).map(|e| m.model_offset(2 * e) / 2).collect();
        assert_eq!(model_elements, [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]);
        // A slice's offset comes first; fp8 elements are one byte.
        let s = HostMap {
            ty: TensorType::new(ipu_graph::DType::Fp8 { scale_log2: 0 }, vec![2, 2, 3]),
            offset: 6,
            ..m.clone()
        };
        let slice: Vec<u64> = (0..6).map(|e| s.model_offset(e)).collect();
        assert_eq!(slice, [6, 9, 7, 10, 8, 11]);
        // The host forms the same order from the model's tensor
        // (ipu_package::transposed_order): the two maps are inverses.
        for i in 0..12 {
            let device = ipu_package::transposed_element(i, &[2, 2, 3]);
            assert_eq!(m.model_offset(2 * device), 2 * i);
        }
    }

    #[test]
    fn restored_tensors_are_the_models() {
        let ty = |d: &[usize]| TensorType::new(ipu_graph::DType::F16, d.to_vec());
        let host: BTreeMap<String, HostMap> = [
            (
                "w.t".to_string(),
                HostMap {
                    name: "w".into(),
                    ty: ty(&[3, 2]),
                    offset: 0,
                    transposed: true,
                },
            ),
            (
                "c.1".to_string(),
                HostMap {
                    name: "c".into(),
                    ty: ty(&[2, 1, 4]),
                    offset: 8,
                    transposed: false,
                },
            ),
            (
                "c.0".to_string(),
                HostMap {
                    name: "c".into(),
                    ty: ty(&[2, 1, 4]),
                    offset: 0,
                    transposed: false,
                },
            ),
        ]
        .into_iter()
        .collect();
        let p = |tile, host_offset, bytes| HostPlacement {
            tile,
            buffer: 0,
            buffer_offset: 16,
            host_offset,
            bytes,
        };
        let tensor = |name: &str, d: &[usize], placements| HostTensor {
            name: name.into(),
            ty: ty(d),
            placements,
        };
        let out = restore(
            &[
                tensor("c.1", &[1, 4], vec![p(1, 0, 8)]),
                tensor("x", &[4], vec![p(2, 0, 8)]),
                tensor("c.0", &[1, 4], vec![p(0, 0, 8)]),
                // Device w.t is [2, 3]: its second row is w's second column.
                tensor("w.t", &[2, 3], vec![p(3, 6, 6)]),
            ],
            &host,
            &BTreeSet::new(),
        );
        let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["c", "x", "w"]);
        assert_eq!(out[0].ty, ty(&[2, 1, 4]));
        let c: Vec<(u32, u64)> = out[0]
            .placements
            .iter()
            .map(|p| (p.tile, p.host_offset))
            .collect();
        assert_eq!(c, [(1, 8), (0, 0)]);
        let w: Vec<(u32, u64, u32)> = out[2]
            .placements
            .iter()
            .map(|p| (p.buffer_offset, p.host_offset, p.bytes))
            .collect();
        assert_eq!(w, [(16, 2, 2), (18, 6, 2), (20, 10, 2)]);
        // A tensor the device holds only transposed keeps its placements
        // whole, at their offsets in the transposed order.
        let kept = restore(
            &[tensor("w.t", &[2, 3], vec![p(3, 6, 6)])],
            &host,
            &["w".to_string()].into_iter().collect(),
        );
        assert_eq!((kept[0].name.as_str(), kept[0].placements.len()), ("w", 1));
        assert_eq!(
            (
                kept[0].placements[0].host_offset,
                kept[0].placements[0].bytes
            ),
            (6, 6)
        );
    }

    /// Operands computed on the device and read transposed (refused until
    /// session 41): one device transpose per value however many readers
    /// (`h.t` serves `y` and the model's own `t`, which the host map then
    /// names), per batch element for a batched value (`k.0.t`, `k.1.t`,
    /// side by side in the stage after the GEMMs they transpose), mapped
    /// to the operand's model tensor transposed.
    #[test]
    fn computed_operands_read_transposed_get_device_transposes() {
        check(
            &ipu_graph::parse(
                "t.ipug",
                "model m\ninput x: f16[40, 64]\nparam w: f16[64, 48]\nparam v: f16[40, 24]\nh = gemm(x, w)\ny = gemm(h, v, transpose_a=true)\nt = transpose(h)\nparam wk: f16[2, 64, 8]\nk = gemm(x, wk)\nparam q: f16[2, 5, 8]\ns = gemm(q, k, transpose_b=true)\noutput y, t, s\n",
            )
            .unwrap(),
            expect![[r#"
                model m
                input x: f16[40, 64]
                param w: f16[64, 48]
                h: f16[40, 48] = gemm(x, w)
                param wk.0: f16[64, 8]
                k.0: f16[40, 8] = gemm(x, wk.0)
                param wk.1: f16[64, 8]
                k.1: f16[40, 8] = gemm(x, wk.1)
                h.t: f16[48, 40] = transpose(h)
                k.0.t: f16[8, 40] = transpose(k.0)
                k.1.t: f16[8, 40] = transpose(k.1)
                param v: f16[40, 24]
                y: f16[48, 24] = gemm(h.t, v)
                param q.0: f16[5, 8]
                s.0: f16[5, 40] = gemm(q.0, k.0.t)
                param q.1: f16[5, 8]
                s.1: f16[5, 40] = gemm(q.1, k.1.t)
                output y
                output h.t
                output s.0
                output s.1
                host h.t -> t: f16[48, 40] offset 0 transposed false
                host k.0 -> k: f16[2, 40, 8] offset 0 transposed false
                host k.0.t -> k: f16[2, 40, 8] offset 0 transposed true
                host k.1 -> k: f16[2, 40, 8] offset 640 transposed false
                host k.1.t -> k: f16[2, 40, 8] offset 640 transposed true
                host q.0 -> q: f16[2, 5, 8] offset 0 transposed false
                host q.1 -> q: f16[2, 5, 8] offset 80 transposed false
                host s.0 -> s: f16[2, 5, 40] offset 0 transposed false
                host s.1 -> s: f16[2, 5, 40] offset 400 transposed false
                host wk.0 -> wk: f16[2, 64, 8] offset 0 transposed false
                host wk.1 -> wk: f16[2, 64, 8] offset 1024 transposed false
            "#]],
        );
    }

    /// A value a later GEMM with a batched B reads per batch element, and
    /// one broadcast against a `[M, N]` operand, are computed per element
    /// from the start (the forward and backward rules of
    /// [`sliced_values`]): before, the producer was one GEMM over the
    /// batch's flattened rows and the reader was refused. Each element's
    /// GEMM chain stays together; the elements' row-wise adds follow them
    /// side by side ([`staged_element_major`]).
    #[test]
    fn values_read_per_batch_element_are_computed_per_element() {
        check(
            &ipu_graph::parse(
                "t.ipug",
                "model m\ninput x: f16[2, 4, 16]\nparam w: f16[16, 8]\nparam bias: f16[8]\nparam u: f16[2, 8, 6]\nparam r: f16[4, 6]\nh = gemm(x, w)\nhb = add(h, bias)\ny = gemm(hb, u)\nz = add(y, r)\noutput z\n",
            )
            .unwrap(),
            expect![[r#"
                model m
                input x.0: f16[4, 16]
                param w: f16[16, 8]
                h.0: f16[4, 8] = gemm(x.0, w)
                param bias: f16[8]
                hb.0: f16[4, 8] = add(h.0, bias)
                param u.0: f16[8, 6]
                y.0: f16[4, 6] = gemm(hb.0, u.0)
                input x.1: f16[4, 16]
                h.1: f16[4, 8] = gemm(x.1, w)
                hb.1: f16[4, 8] = add(h.1, bias)
                param u.1: f16[8, 6]
                y.1: f16[4, 6] = gemm(hb.1, u.1)
                param r: f16[4, 6]
                z.0: f16[4, 6] = add(y.0, r)
                z.1: f16[4, 6] = add(y.1, r)
                output z.0
                output z.1
                host h.0 -> h: f16[2, 4, 8] offset 0 transposed false
                host h.1 -> h: f16[2, 4, 8] offset 64 transposed false
                host hb.0 -> hb: f16[2, 4, 8] offset 0 transposed false
                host hb.1 -> hb: f16[2, 4, 8] offset 64 transposed false
                host u.0 -> u: f16[2, 8, 6] offset 0 transposed false
                host u.1 -> u: f16[2, 8, 6] offset 96 transposed false
                host x.0 -> x: f16[2, 4, 16] offset 0 transposed false
                host x.1 -> x: f16[2, 4, 16] offset 128 transposed false
                host y.0 -> y: f16[2, 4, 6] offset 0 transposed false
                host y.1 -> y: f16[2, 4, 6] offset 48 transposed false
                host z.0 -> z: f16[2, 4, 6] offset 0 transposed false
                host z.1 -> z: f16[2, 4, 6] offset 48 transposed false
            "#]],
        );
        check(
            &ipu_graph::parse(
                "t.ipug",
                "model m\ninput x: f16[2, 4, 16]\nparam w: f16[16, 8]\nparam r: f16[4, 8]\nh = gemm(x, w)\ny = add(h, r)\ng = gelu(h)\noutput y\noutput g\n",
            )
            .unwrap(),
            expect![[r#"
                model m
                input x.0: f16[4, 16]
                param w: f16[16, 8]
                h.0: f16[4, 8] = gemm(x.0, w)
                input x.1: f16[4, 16]
                h.1: f16[4, 8] = gemm(x.1, w)
                param r: f16[4, 8]
                y.0: f16[4, 8] = add(h.0, r)
                g.0: f16[4, 8] = gelu(h.0)
                y.1: f16[4, 8] = add(h.1, r)
                g.1: f16[4, 8] = gelu(h.1)
                output y.0
                output y.1
                output g.0
                output g.1
                host g.0 -> g: f16[2, 4, 8] offset 0 transposed false
                host g.1 -> g: f16[2, 4, 8] offset 64 transposed false
                host h.0 -> h: f16[2, 4, 8] offset 0 transposed false
                host h.1 -> h: f16[2, 4, 8] offset 64 transposed false
                host x.0 -> x: f16[2, 4, 16] offset 0 transposed false
                host x.1 -> x: f16[2, 4, 16] offset 128 transposed false
                host y.0 -> y: f16[2, 4, 8] offset 0 transposed false
                host y.1 -> y: f16[2, 4, 8] offset 64 transposed false
            "#]],
        );
    }
}
