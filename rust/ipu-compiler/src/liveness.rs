//! Phase `liveness`: which buffers hold data some step still needs, at
//! every step of every call, found from the steps themselves; and the
//! independent check that no two buffers live at the same step share
//! memory.
//!
//! Storage placement ([`crate::storage`]) lets buffers share memory when
//! their declared lifetimes (a segment, a scratch phase) say they are
//! never live together. This phase does not read those declarations. It
//! takes a buffer's life from what touches it:
//! - a vertex state word that addresses it (a compute step on its tile);
//! - an exchange transfer that reads or writes it;
//! - the host: a call's inputs are written before its first step, its
//!   outputs read after its last step, and streamed inputs at their host
//!   stop.
//!
//! A buffer lives from the first of those to the last, once an iteration
//! when only device loops' bodies touch it (unless a loop's back edge
//! writes it: a carry). A value the run leaves on the device only for a
//! checkpoint run's diagnosis (`Lowered::resident`) lives to its last use
//! too: a normal run never reads it afterwards, and the checkpoints name
//! it only where its bytes stay intact. These are *always live*:
//! buffers touched by more than one call (parameters, weights the
//! initialize call copies), buffers that must hold zeros from the load on
//! (a call may run many times, and nothing writes the zeros again), and
//! buffers that no step touches (exchange tables and other constants the
//! supervisor reads) unless placement gave them a segment or a scratch
//! phase, which makes them never live. Code, vertex states and the host
//! command word are always live too.
//!
//! [`check`] then asks that no two buffers whose lives meet overlap in
//! memory: a declared lifetime that a step contradicts (a segment's buffer
//! touched by a step of another segment, a scratch phase's buffer read
//! after its phase) fails it even when the storage validator, which reads
//! only the declarations, passes. [`analyse`] gives each BSP step's live
//! bytes, as PopVision's liveness report does for Poplar programs: on the
//! fullest tile (by region and always live or not) and summed over the
//! tiles; the package's `schedule.json` carries them and the profile's
//! HTML view charts them.

use crate::lower::Lowered;
use crate::storage::TileStorage;
use ipu_arch::REGION1_BASE;
use std::collections::BTreeMap;

/// A point of the program: (call, step index in the call).
pub type Point = (usize, usize);

/// One buffer's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Life {
    /// From the load to the end of the program.
    Always,
    /// The points of these spans, each from its first point to its last,
    /// both included; in order and apart. A buffer that only a device
    /// loop's body touches lives in one span per iteration.
    Spans(Vec<(Point, Point)>),
}

impl Life {
    /// Whether the two lives have a point in common.
    pub fn meets(&self, other: &Life) -> bool {
        let (a, b) = match (self, other) {
            (Life::Spans(a), Life::Spans(b)) => (a, b),
            (Life::Spans(x), Life::Always) | (Life::Always, Life::Spans(x)) => {
                return !x.is_empty()
            }
            (Life::Always, Life::Always) => return true,
        };
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if a[i].0 <= b[j].1 && b[j].0 <= a[i].1 {
                return true;
            }
            if a[i].1 < b[j].1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        false
    }

    /// Whether the life holds `p`.
    pub fn holds(&self, p: Point) -> bool {
        match self {
            Life::Always => true,
            Life::Spans(spans) => spans.iter().any(|&(a, b)| a <= p && p <= b),
        }
    }
}

/// What the steps did to one buffer, gathered step by step.
#[derive(Clone)]
struct Touches {
    first: Point,
    last: Point,
    /// The calls that touched it, as a bit set.
    calls: u64,
    /// Touched by a step outside every device loop.
    outside: bool,
    /// Per device loop whose body touched it (an index into all calls'
    /// loops): the first and last offset of its touches within the period.
    loops: Vec<(usize, usize, usize)>,
    /// Written by a loop's back edge (the exchange that ends the period),
    /// so it carries data from one iteration into the next.
    carried: bool,
}

/// Where a step of a call sits: outside every loop, or in loop `l` at
/// `offset` within its period.
#[derive(Clone, Copy)]
enum Place {
    Outside,
    InLoop { l: usize, offset: usize },
}

impl Touches {
    /// Records a touch at `p`, a step at `place`; `back_edge` when the
    /// step is a loop's back edge writing the buffer. (Calls past the 64th
    /// share a bit: a package has two.)
    fn add(slot: &mut Option<Touches>, p: Point, place: Place, back_edge: bool) {
        let t = slot.get_or_insert(Touches {
            first: p,
            last: p,
            calls: 0,
            outside: false,
            loops: Vec::new(),
            carried: false,
        });
        t.first = t.first.min(p);
        t.last = t.last.max(p);
        t.calls |= 1u64 << p.0.min(63);
        match place {
            Place::Outside => t.outside = true,
            Place::InLoop { l, offset } => {
                match t.loops.iter_mut().find(|x| x.0 == l) {
                    Some(x) => {
                        x.1 = x.1.min(offset);
                        x.2 = x.2.max(offset);
                    }
                    None => t.loops.push((l, offset, offset)),
                }
                t.carried |= back_edge;
            }
        }
    }
}

/// The buffers one step touches on each tile: (buffer, written by the
/// step's exchange), each once.
type StepTouches = BTreeMap<u32, Vec<(usize, bool)>>;

/// [`StepTouches`] of `step`.
fn step_touches(step: &crate::lower::Step) -> StepTouches {
    let mut out: BTreeMap<u32, std::collections::BTreeSet<(usize, bool)>> = BTreeMap::new();
    for (&tile, vertices) in step.tiles.iter() {
        let set = out.entry(tile).or_default();
        for v in vertices {
            for w in &v.state {
                if let crate::lower::StateWord::Addr { buffer, .. } = *w {
                    set.insert((buffer, false));
                }
            }
        }
    }
    if let Some(x) = &step.exchange {
        for tr in x.transfers.iter() {
            out.entry(tr.source.tile)
                .or_default()
                .insert((tr.source.buffer, false));
            for d in &tr.destinations {
                out.entry(d.tile).or_default().insert((d.buffer, true));
            }
        }
    }
    out.into_iter()
        .map(|(t, set)| (t, set.into_iter().collect()))
        .collect()
}

/// The life of every buffer of every tile (indexed like
/// [`Lowered::buffers`]).
pub fn lives(l: &Lowered) -> BTreeMap<u32, Vec<Life>> {
    use rayon::prelude::*;
    // Every call's loops, numbered across calls: (call, loop).
    let loops: Vec<(usize, &crate::lower::DeviceLoop)> = l
        .calls
        .iter()
        .enumerate()
        .flat_map(|(c, call)| call.loops.iter().map(move |lp| (c, lp)))
        .collect();
    // Per call: where each step sits, and each step's touches, computed
    // once per step that is not a rerun (a rerun touches what the step it
    // repeats touched: a 27-layer loop would otherwise walk every vertex
    // state 27 times).
    let places: Vec<Vec<Place>> = l
        .calls
        .iter()
        .enumerate()
        .map(|(c, call)| {
            let mut places = vec![Place::Outside; call.steps.len()];
            for (n, &(lc, lp)) in loops.iter().enumerate() {
                if lc != c {
                    continue;
                }
                for k in 0..lp.count as usize {
                    for offset in 0..lp.period {
                        if let Some(p) = places.get_mut(lp.start + k * lp.period + offset) {
                            *p = Place::InLoop { l: n, offset };
                        }
                    }
                }
            }
            places
        })
        .collect();
    let step_touch: Vec<BTreeMap<usize, StepTouches>> = l
        .calls
        .iter()
        .map(|call| {
            let firsts: Vec<usize> = (0..call.steps.len())
                .filter(|i| !call.reruns.contains_key(i))
                .collect();
            firsts
                .par_iter()
                .map(|&i| (i, step_touches(&call.steps[i])))
                .collect()
        })
        .collect();
    // The host's touches per tile: (buffer, point).
    let mut host: BTreeMap<u32, Vec<(usize, Point)>> = BTreeMap::new();
    for (c, call) in l.calls.iter().enumerate() {
        let Some(last) = call.steps.len().checked_sub(1) else {
            continue;
        };
        let (inputs, outputs) = &l.io[c];
        let mut put = |t: &crate::lower::HostTensor, i: usize| {
            for p in &t.placements {
                host.entry(p.tile).or_default().push((p.buffer, (c, i)));
            }
        };
        for t in inputs {
            put(t, 0);
        }
        for t in outputs {
            put(t, last);
        }
        let mut stops = 0u32;
        for (i, step) in call.steps.iter().enumerate() {
            if step.host_stop {
                stops += 1;
                for (stop, t) in &call.streamed {
                    if *stop == stops {
                        put(t, i);
                    }
                }
            }
        }
    }
    let tiles: Vec<(&u32, &Vec<crate::lower::BufferSpec>)> = l.buffers.iter().collect();
    tiles
        .par_iter()
        .map(|&(&tile, bufs)| {
            let mut touches: Vec<Option<Touches>> = vec![None; bufs.len()];
            for &(b, p) in host.get(&tile).into_iter().flatten() {
                if let Some(slot) = touches.get_mut(b) {
                    Touches::add(slot, p, places[p.0][p.1], false);
                }
            }
            for (c, call) in l.calls.iter().enumerate() {
                for (i, (step, &place)) in call.steps.iter().zip(&places[c]).enumerate() {
                    let original = call.reruns.get(&i).copied().unwrap_or(i);
                    let Some(here) = step_touch[c].get(&original).and_then(|t| t.get(&tile)) else {
                        continue;
                    };
                    let back_edge = match place {
                        Place::InLoop { l, offset } => {
                            offset + 1 == loops[l].1.period && step.exchange.is_some()
                        }
                        Place::Outside => false,
                    };
                    for &(b, written) in here {
                        if let Some(slot) = touches.get_mut(b) {
                            Touches::add(slot, (c, i), place, written && back_edge);
                        }
                    }
                }
            }
            let lives = touches
                .into_iter()
                .enumerate()
                .map(|(i, t)| {
                    let Some(t) = t else {
                        // No step touches it: a constant the supervisor
                        // reads (an exchange table, a loop's index word)
                        // when it lives for the whole program; nothing at
                        // all when placement gave it a segment or a
                        // scratch phase (a layer norm's row scratch on a
                        // tile whose plan never splits its rows).
                        let b = &bufs[i];
                        return if b.lifetime.is_some() || b.scratch.is_some() {
                            Life::Spans(Vec::new())
                        } else {
                            Life::Always
                        };
                    };
                    if t.calls.count_ones() != 1 || !bufs[i].zero.is_empty() {
                        return Life::Always;
                    }
                    // Only device loops' bodies touch it and it carries
                    // nothing between iterations: it lives in each
                    // iteration from its first touch there to its last.
                    let mut spans: Vec<(Point, Point)> =
                        if !t.outside && !t.carried && !t.loops.is_empty() {
                            t.loops
                                .iter()
                                .flat_map(|&(n, lo, hi)| {
                                    let (c, lp) = loops[n];
                                    (0..lp.count as usize).map(move |k| {
                                        let base = lp.start + k * lp.period;
                                        ((c, base + lo), (c, base + hi))
                                    })
                                })
                                .collect()
                        } else {
                            vec![(t.first, t.last)]
                        };
                    spans.sort();
                    Life::Spans(spans)
                })
                .collect();
            (tile, lives)
        })
        .collect()
}

/// Checks that on every tile no two buffers whose lives meet overlap in
/// memory, nor a buffer the code and vertex states or the host command
/// word; the error names the lowest tile that breaks it.
pub fn check(
    l: &Lowered,
    storage: &BTreeMap<u32, TileStorage>,
    lives: &BTreeMap<u32, Vec<Life>>,
) -> Result<(), String> {
    use rayon::prelude::*;
    let tiles: Vec<(&u32, &Vec<crate::lower::BufferSpec>)> = l.buffers.iter().collect();
    let errors: Vec<String> = tiles
        .par_iter()
        .filter_map(|&(&tile, bufs)| {
            check_tile(l, tile, bufs, &storage[&tile], &lives[&tile]).err()
        })
        .collect();
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn check_tile(
    l: &Lowered,
    tile: u32,
    bufs: &[crate::lower::BufferSpec],
    st: &TileStorage,
    life: &[Life],
) -> Result<(), String> {
    let always = Life::Always;
    let mut spans: Vec<(u64, u64, String, &Life)> = vec![
        (
            ipu_arch::REGION0_BASE as u64,
            st.code_end as u64,
            "code and vertex states".into(),
            &always,
        ),
        (
            crate::storage::COMMAND_ADDRESS as u64,
            (crate::storage::COMMAND_ADDRESS + crate::storage::COMMAND_RESERVE) as u64,
            "the host command word".into(),
            &always,
        ),
    ];
    for (i, b) in bufs.iter().enumerate() {
        let a = st.addresses[i] as u64;
        spans.push((
            a,
            a + b.bytes as u64,
            format!("buffer `{}`", b.name),
            &life[i],
        ));
    }
    spans.sort_by(|x, y| (x.0, x.1, &x.2).cmp(&(y.0, y.1, &y.2)));
    for (i, x) in spans.iter().enumerate() {
        for y in &spans[i + 1..] {
            if y.0 >= x.1 {
                break;
            }
            if x.3.meets(y.3) {
                return Err(format!(
                    "tile {tile}: {} ({:#x}..{:#x}, live {}) overlaps {} ({:#x}..{:#x}, live {}) while both hold data a step needs",
                    x.2,
                    x.0,
                    x.1,
                    describe(l, x.3),
                    y.2,
                    y.0,
                    y.1,
                    describe(l, y.3)
                ));
            }
        }
    }
    Ok(())
}

/// A life in words: "always", or the calls and steps it spans.
fn describe(l: &Lowered, life: &Life) -> String {
    let point = |(c, i): Point| {
        let call = l.calls.get(c).map_or("?", |k| k.name.as_str());
        let phase = l
            .calls
            .get(c)
            .and_then(|k| k.steps.get(i))
            .map_or("?", |s| s.phase.as_str());
        format!("`{call}` step {i} ({phase})")
    };
    let span = |&(a, b): &(Point, Point)| {
        if a == b {
            format!("at {}", point(a))
        } else {
            format!("from {} to {}", point(a), point(b))
        }
    };
    match life {
        Life::Always => "always".into(),
        Life::Spans(spans) if spans.len() == 1 => span(&spans[0]),
        Life::Spans(spans) => format!(
            "in {} spans, the first {}",
            spans.len(),
            spans.first().map(span).unwrap_or_default()
        ),
    }
}

/// Live bytes of one BSP step, the record `schedule.json` carries.
pub use ipu_package::StepLive;

/// Each call's BSP steps' live bytes, in the order of
/// [`crate::package::bsp_steps`] (the schedule's steps).
pub fn analyse(
    l: &Lowered,
    storage: &BTreeMap<u32, TileStorage>,
    lives: &BTreeMap<u32, Vec<Life>>,
) -> Vec<Vec<StepLive>> {
    use rayon::prelude::*;
    let tiles: Vec<(&u32, &Vec<crate::lower::BufferSpec>)> = l.buffers.iter().collect();
    l.calls
        .iter()
        .enumerate()
        .map(|(c, call)| {
            // The schedule's BSP steps as ranges of the call's steps.
            let mut first = 0;
            let groups: Vec<std::ops::Range<usize>> = crate::package::bsp_steps(call)
                .iter()
                .map(|g| {
                    first += g.len();
                    first - g.len()..first
                })
                .collect();
            // Per tile, per BSP step: (region 0, region 1, always live) at
            // the tile's fullest step of it.
            let per_tile: Vec<(u32, Vec<Fullest>)> = tiles
                .par_iter()
                .map(|&(&tile, bufs)| {
                    let at = tile_live(c, call.steps.len(), bufs, &storage[&tile], &lives[&tile]);
                    let always = at.always.0 + at.always.1;
                    let fullest = groups
                        .iter()
                        .map(|range| {
                            let (r0, r1) = range
                                .clone()
                                .map(|i| at.by_step[i])
                                .max_by_key(|&(r0, r1)| r0 + r1)
                                .unwrap_or(at.always);
                            (r0, r1, always)
                        })
                        .collect();
                    (tile, fullest)
                })
                .collect();
            groups
                .iter()
                .enumerate()
                .map(|(g, _)| {
                    let mut out = StepLive {
                        tile: 0,
                        bytes: 0,
                        region0: 0,
                        region1: 0,
                        always: 0,
                        all_tiles: 0,
                    };
                    for (tile, fullest) in &per_tile {
                        let (r0, r1, always) = fullest[g];
                        out.all_tiles += r0 + r1;
                        if r0 + r1 > out.bytes {
                            out = StepLive {
                                tile: *tile,
                                bytes: r0 + r1,
                                region0: r0,
                                region1: r1,
                                always,
                                all_tiles: out.all_tiles,
                            };
                        }
                    }
                    out
                })
                .collect()
        })
        .collect()
}

/// The BSP step with the most live bytes on one tile (the first such):
/// (call name, BSP step index in the call, its figures).
pub fn peak(l: &Lowered, steps: &[Vec<StepLive>]) -> Option<(String, usize, StepLive)> {
    let mut best: Option<(&str, usize, &StepLive)> = None;
    for (call, live) in l.calls.iter().zip(steps) {
        for (i, s) in live.iter().enumerate() {
            if best.is_none_or(|b| s.bytes > b.2.bytes) {
                best = Some((call.name.as_str(), i, s));
            }
        }
    }
    best.map(|(call, i, s)| (call.to_string(), i, *s))
}

/// A tile's live bytes at its fullest step of a BSP step: (region 0,
/// region 1, always live).
type Fullest = (u64, u64, u64);

/// One tile's live bytes in one call.
struct TileLive {
    /// Always live: (region 0, region 1), code and the command word
    /// included.
    always: (u64, u64),
    /// Live at each step of the call: (region 0, region 1).
    by_step: Vec<(u64, u64)>,
}

/// The live bytes of a tile with buffers `bufs` at each of the `steps`
/// steps of call `c`.
fn tile_live(
    c: usize,
    steps: usize,
    bufs: &[crate::lower::BufferSpec],
    st: &TileStorage,
    life: &[Life],
) -> TileLive {
    let fixed = (st.code_end - ipu_arch::REGION0_BASE + crate::storage::COMMAND_RESERVE) as u64;
    let mut always = (fixed, 0u64);
    // Each span's bytes join at its first step of the call and leave after
    // its last: a running sum over the steps gives the live bytes.
    let mut delta: Vec<(i64, i64)> = vec![(0, 0); steps + 1];
    for (i, b) in bufs.iter().enumerate() {
        let in_region1 = st.addresses[i] >= REGION1_BASE;
        match &life[i] {
            Life::Always => {
                if in_region1 {
                    always.1 += b.bytes as u64;
                } else {
                    always.0 += b.bytes as u64;
                }
            }
            Life::Spans(spans) => {
                for &(a, z) in spans {
                    if a.0 > c || z.0 < c || steps == 0 {
                        continue;
                    }
                    let from = if a.0 < c { 0 } else { a.1 };
                    let to = if z.0 > c { steps - 1 } else { z.1 };
                    let bytes = b.bytes as i64;
                    let (at_from, after_to) = if in_region1 {
                        ((0, bytes), (0, -bytes))
                    } else {
                        ((bytes, 0), (-bytes, 0))
                    };
                    delta[from].0 += at_from.0;
                    delta[from].1 += at_from.1;
                    delta[to + 1].0 += after_to.0;
                    delta[to + 1].1 += after_to.1;
                }
            }
        }
    }
    let mut running = (0i64, 0i64);
    let by_step = delta[..steps]
        .iter()
        .map(|d| {
            running.0 += d.0;
            running.1 += d.1;
            (always.0 + running.0 as u64, always.1 + running.1 as u64)
        })
        .collect();
    TileLive { always, by_step }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{
        BufferSpec, CallProgram, DeviceLoop, HostPlacement, HostTensor, Launch, RegionReq,
        StateWord, Step, Vertex,
    };
    use std::sync::Arc;

    fn buf(name: &str, bytes: u32) -> BufferSpec {
        BufferSpec {
            name: name.into(),
            bytes,
            align: 16,
            region: RegionReq::Interleaved,
            exclusive_element: false,
            zero: vec![],
            category: "test".into(),
            scratch: None,
            lifetime: None,
            kernel_segment: None,
        }
    }

    /// A compute step on tile 0 whose one vertex addresses `buffers`.
    fn touching(buffers: &[usize]) -> Step {
        Step {
            tile_cycles: Default::default(),
            operation: "v".into(),
            phase: format!("touch {buffers:?}"),
            tiles: Arc::new(
                [(
                    0,
                    vec![Vertex {
                        kernel: Arc::new(crate::library::KernelRequest {
                            entry: "fill64".into(),
                            source: "fill64.S".into(),
                            params: Default::default(),
                        }),
                        state: buffers
                            .iter()
                            .map(|&buffer| StateWord::Addr { buffer, offset: 0 })
                            .collect(),
                    }],
                )]
                .into_iter()
                .collect(),
            ),
            estimated_cycles: 100,
            exchange: None,
            host_stop: false,
            launch: Launch::Own,
        }
    }

    fn tensor(name: &str, buffer: usize) -> HostTensor {
        HostTensor {
            name: name.into(),
            ty: ipu_graph::TensorType {
                dtype: ipu_graph::DType::F16,
                shape: ipu_graph::Shape(vec![8]),
            },
            placements: vec![HostPlacement {
                tile: 0,
                buffer,
                buffer_offset: 0,
                host_offset: 0,
                bytes: 16,
            }],
        }
    }

    /// One tile with buffers 0 `w` (a parameter: initialize's input, read
    /// by run), 1 `x` (run's input), 2 `t` and 3 `u` (temporaries), 4 `y`
    /// (run's output), 5 `z` (zero padding from the load), 6 `table`
    /// (touched by no step); run's steps touch x; x, t; t, u; u, w, y; z.
    fn program() -> Lowered {
        let mut z = buf("z", 64);
        z.zero = vec![(0, 64)];
        let mut l = Lowered {
            tile_count: 1,
            ..Default::default()
        };
        l.buffers.insert(
            0,
            vec![
                buf("w", 256),
                buf("x", 64),
                buf("t", 128),
                buf("u", 128),
                buf("y", 64),
                z,
                buf("table", 32),
            ],
        );
        l.calls.push(CallProgram {
            name: "initialize".into(),
            steps: vec![touching(&[])],
            ..Default::default()
        });
        l.calls.push(CallProgram {
            name: "run".into(),
            steps: vec![
                touching(&[1]),
                touching(&[1, 2]),
                touching(&[2, 3]),
                touching(&[3, 0, 4]),
                touching(&[5]),
            ],
            ..Default::default()
        });
        l.io.push((vec![tensor("w", 0)], vec![]));
        l.io.push((vec![tensor("x", 1)], vec![tensor("y", 4)]));
        l
    }

    fn span(a: Point, b: Point) -> Life {
        Life::Spans(vec![(a, b)])
    }

    #[test]
    fn buffers_live_from_their_first_touch_to_their_last() {
        let lives = lives(&program());
        assert_eq!(
            lives[&0],
            vec![
                Life::Always,
                span((1, 0), (1, 1)),
                span((1, 1), (1, 2)),
                span((1, 2), (1, 3)),
                span((1, 3), (1, 4)),
                Life::Always,
                Life::Always,
            ],
            "w crosses calls, y is read after the call's last step, z holds zeros from the load, \
             and no step touches the table"
        );
    }

    #[test]
    fn an_untouched_buffer_of_a_segment_is_never_live() {
        let mut l = program();
        let mut scratch = buf("s0.row_parts", 48);
        scratch.lifetime = Some(0);
        l.buffers.get_mut(&0).unwrap().push(scratch);
        let lives = lives(&l);
        assert_eq!(lives[&0][7], Life::Spans(vec![]));
        assert!(!lives[&0][7].meets(&Life::Always));
        assert_eq!(lives[&0][6], Life::Always, "the whole program's table");
    }

    #[test]
    fn a_loop_body_buffer_lives_once_an_iteration() {
        let mut l = program();
        // Run's steps 1..5 are two iterations of a period of two, steps 3
        // and 4 reruns of 1 and 2: t (at offsets 0 and 1) lives in each
        // iteration; x, also touched at step 0 outside the loop, lives from
        // step 0 to step 3, which reruns step 1 (the rerun's own vertex
        // list does not count: the device runs the step it repeats). The
        // period ends with an exchange from t into u, which step 1 reads:
        // u carries data into the next iteration and lives throughout.
        let back_edge = Step {
            exchange: Some(crate::exchange::ExchangeStep {
                tiles: 1,
                transfers: Arc::new(vec![crate::exchange::BufferTransfer {
                    source: crate::exchange::BufferRef {
                        tile: 0,
                        buffer: 2,
                        offset: 0,
                    },
                    destinations: vec![crate::exchange::BufferRef {
                        tile: 0,
                        buffer: 3,
                        offset: 0,
                    }],
                    bytes: 16,
                }]),
                layout: Default::default(),
                tables: Default::default(),
                figures: crate::exchange::ExchangeFigures {
                    transfers: 1,
                    descriptors: 0,
                    initial_horizon: 0,
                    selected_horizon: 0,
                    exchange_cycles: 0,
                    endpoint_lower_bound: 0,
                    lower_bound: 0,
                    lower_bound_gap: 0,
                },
                table_buffers: Default::default(),
            }),
            ..touching(&[2])
        };
        let run = &mut l.calls[1];
        run.steps = vec![
            touching(&[1]),
            touching(&[2, 1, 3]),
            back_edge.clone(),
            touching(&[2]),
            back_edge,
        ];
        run.reruns = [(3, 1), (4, 2)].into_iter().collect();
        run.loops.push(DeviceLoop {
            start: 1,
            period: 2,
            count: 2,
            index: Default::default(),
        });
        let lives = lives(&l);
        assert_eq!(
            lives[&0][2],
            Life::Spans(vec![((1, 1), (1, 2)), ((1, 3), (1, 4))])
        );
        assert_eq!(lives[&0][1], span((1, 0), (1, 3)));
        assert_eq!(lives[&0][3], span((1, 1), (1, 4)), "u is carried");
        assert!(!lives[&0][2].meets(&span((1, 0), (1, 0))));
        assert!(lives[&0][2].meets(&span((1, 3), (1, 3))));
    }

    /// Addresses at these offsets into region 1.
    fn in_region1(offsets: &[u32]) -> Vec<u32> {
        offsets.iter().map(|o| REGION1_BASE + o).collect()
    }

    fn placed(addresses: Vec<u32>) -> BTreeMap<u32, TileStorage> {
        [(
            0,
            TileStorage {
                tile: 0,
                code_end: ipu_arch::REGION0_BASE + 1024,
                addresses,
            },
        )]
        .into_iter()
        .collect()
    }

    #[test]
    fn buffers_live_apart_may_share_memory_and_buffers_live_together_may_not() {
        let l = program();
        let lives = lives(&l);
        // x (steps 0-1) and u (steps 2-3) share memory: fine.
        let apart = in_region1(&[0, 512, 1024, 512, 2048, 3072, 4096]);
        check(&l, &placed(apart), &lives).unwrap();
        // t (steps 1-2) over u (steps 2-3): both live at step 2.
        let together = in_region1(&[0, 512, 1024, 1024, 2048, 3072, 4096]);
        let err = check(&l, &placed(together), &lives).unwrap_err();
        assert!(
            err.contains("tile 0: buffer `t`")
                && err.contains("overlaps buffer `u`")
                && err.contains("from `run` step 1 (touch [1, 2]) to `run` step 2 (touch [2, 3])"),
            "{err}"
        );
        // Nothing live may overlap the code.
        let mut over_code = in_region1(&[0, 0, 1024, 2048, 3072, 4096, 5120]);
        over_code[0] = ipu_arch::REGION0_BASE + 512;
        let err = check(&l, &placed(over_code), &lives).unwrap_err();
        assert!(err.contains("code and vertex states"), "{err}");
    }

    #[test]
    fn each_step_counts_its_fullest_tile() {
        let l = program();
        let lives = lives(&l);
        let st = placed(in_region1(&[0, 512, 1024, 512, 2048, 3072, 4096]));
        let steps = analyse(&l, &st, &lives);
        let fixed = 1024 + crate::storage::COMMAND_RESERVE as u64;
        // Always live: the code, the command word, w, z and the table.
        let always = fixed + 256 + 64 + 32;
        let run: Vec<u64> = steps[1].iter().map(|s| s.bytes).collect();
        // The run call is one BSP step (no exchange, no host stop): its
        // fullest step is step 1 (x and t) or 2 (t and u), 192 or 256.
        assert_eq!(run, vec![always + 256]);
        assert_eq!(steps[1][0].always, always);
        assert_eq!(
            peak(&l, &steps).map(|(c, i, s)| (c, i, s.bytes)),
            Some(("run".to_string(), 0, always + 256))
        );
        assert_eq!(steps[1][0].region0, fixed);
        assert_eq!(
            steps[0],
            vec![StepLive {
                tile: 0,
                bytes: always,
                region0: fixed,
                region1: always - fixed,
                always,
                all_tiles: always,
            }]
        );
    }
}
