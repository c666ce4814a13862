//! Execution profiles (`.ipuprofile`, docs/profile-format.md): per-tile
//! cycles per BSP step split into compute, sync, exchange and host; steps
//! attributed to calls, manifest phases, operations and kernels where the
//! package says; memory per tile by region and category. And the query API
//! (group by kernel, operation, phase, call, step or tile; top N), and an
//! HTML view of all of it (`html`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use ipu_arch::{Region, SYNC_CYCLES};
use ipu_package::Package;
use ipu_sim::StepKind;
use serde::{Deserialize, Serialize};

use crate::members::{self, KernelTiles};
use crate::{RuntimeError, Session};

pub mod html;

/// The value of [`Profile::format`].
pub const FORMAT: &str = "ipuprofile";
/// The profile format version written: 2 added each step's
/// `estimated_cycles`; version 1 files still read.
pub const VERSION: u32 = 2;

/// A whole profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Always "ipuprofile".
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The package's model name.
    pub model: String,
    /// BLAKE3 of the package's manifest (it lists every member's digest,
    /// so it identifies the whole package).
    pub package_digest: String,
    /// The device that ran it.
    pub device: String,
    /// Tiles of the package (per-tile arrays have this length).
    pub tile_count: u32,
    /// Clock used for host link cycles.
    pub clock_hz: u64,
    /// Device cycles at the end of the profiled session.
    pub total_cycles: u64,
    /// The calls made.
    pub calls: Vec<ProfileCall>,
    /// Every BSP step from load on.
    pub steps: Vec<ProfileStep>,
    /// Memory per tile, region and category.
    pub memory: Vec<MemoryEntry>,
    /// Where the memory figures come from: "report.json" or "package images".
    pub memory_source: String,
    /// What could not be attributed, and why.
    pub notes: Vec<String>,
}

/// One call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileCall {
    /// Name.
    pub call: String,
    /// Checkpoint run.
    pub checkpoint: bool,
    /// First step index.
    pub first_step: usize,
    /// One past the last step.
    pub end_step: usize,
    /// Device cycles (excluding host transfers of inputs).
    pub device_cycles: u64,
    /// Host link cycles of inputs and the command word.
    pub host_in_cycles: u64,
    /// Host link cycles of outputs.
    pub host_out_cycles: u64,
}

/// One BSP step of the chip, with per-tile counters (arrays indexed by tile).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileStep {
    /// Step index.
    pub index: usize,
    /// "sync", "host_sync" or "exit".
    pub kind: String,
    /// Chip cycle at which it began.
    pub start_cycle: u64,
    /// Chip cycle at which the next step began.
    pub end_cycle: u64,
    /// The call it belongs to ("load" before the first call).
    pub call: String,
    /// Index within the call.
    pub call_step: usize,
    /// Manifest phase or schedule phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Graph value computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Kernels run and their tiles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelTiles>,
    /// The compiler's estimate of the step's cycles (from `schedule.json`
    /// format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cycles: Option<u64>,
    /// Whether the step ends at a host stop, whose host link cycles count
    /// in the call's device cycles (from `schedule.json`). Absent when
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_stop: bool,
    /// The step's live bytes (from `schedule.json`; absent in packages
    /// from before the compiler's liveness phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<crate::members::StepLive>,
    /// Compute cycles per tile.
    pub compute: Vec<u64>,
    /// Sync cycles per tile (waiting for the slowest tile plus the sync itself).
    pub sync: Vec<u64>,
    /// Exchange cycles per tile.
    pub exchange: Vec<u64>,
    /// Host link cycles per tile (host syncs only).
    pub host: Vec<u64>,
    /// Instructions executed per tile.
    pub instructions: Vec<u64>,
    /// Words sent per tile.
    pub words_sent: Vec<u64>,
    /// Words received per tile.
    pub words_received: Vec<u64>,
}

impl ProfileStep {
    /// The step's device cycles: its length less the host link time at a
    /// host sync, except at a host stop, where the device waits for the
    /// host's writes within the call.
    pub fn device_cycles(&self) -> u64 {
        let host = if self.host_stop {
            0
        } else {
            self.host.iter().copied().max().unwrap_or(0)
        };
        (self.end_cycle - self.start_cycle).saturating_sub(host)
    }
}

/// Bytes of one tile in one region and category.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryEntry {
    /// Tile.
    pub tile: u32,
    /// "region0" or "region1".
    pub region: String,
    /// Category, e.g. "image", "host_io" or the compiler's.
    pub category: String,
    /// Bytes.
    pub bytes: u64,
}

#[derive(Deserialize)]
struct ReportMemory {
    memory: Vec<MemoryEntry>,
}

fn region_name(address: u32) -> &'static str {
    match Region::of(address) {
        Some(Region::Standard) => "region0",
        Some(Region::Interleaved) => "region1",
        None => "outside",
    }
}

/// Adds `[address, address+len)` to `out` split at the region boundary.
fn add_range(
    out: &mut BTreeMap<(u32, String, String), u64>,
    tile: u32,
    category: &str,
    address: u32,
    len: u64,
) {
    let end = address as u64 + len;
    let boundary = ipu_arch::REGION1_BASE as u64;
    let mut pieces = vec![];
    if (address as u64) < boundary && end > boundary {
        pieces.push((address, boundary - address as u64));
        pieces.push((ipu_arch::REGION1_BASE, end - boundary));
    } else {
        pieces.push((address, len));
    }
    for (a, l) in pieces {
        *out.entry((tile, region_name(a).to_string(), category.to_string()))
            .or_insert(0) += l;
    }
}

fn memory_of(package: &Package, notes: &mut Vec<String>) -> (Vec<MemoryEntry>, String) {
    if let Some(bytes) = package.members.get("report.json") {
        match serde_json::from_slice::<ReportMemory>(bytes) {
            Ok(r) => {
                let mut m = r.memory;
                m.sort();
                return (m, "report.json".to_string());
            }
            Err(e) => notes.push(format!(
                "report.json has no usable `memory` list ({e}); memory derived from the package images"
            )),
        }
    }
    let mut out = BTreeMap::new();
    for (&tile, image) in &package.tiles {
        for s in &image.segments {
            add_range(&mut out, tile, "image", s.address, s.bytes.len() as u64);
        }
    }
    // Host exchange buffers: each placed byte range once per tile and address.
    let mut io = BTreeSet::new();
    for call in &package.info.calls {
        for t in call.inputs.iter().chain(&call.outputs) {
            for p in &t.placements {
                io.insert((p.tile, p.address, p.bytes));
            }
        }
    }
    for (tile, address, bytes) in io {
        add_range(&mut out, tile, "host_io", address, bytes as u64);
    }
    for t in 0..package.info.tile_count {
        add_range(
            &mut out,
            t,
            "host_command",
            package.info.host.command_address,
            4,
        );
    }
    let m = out
        .into_iter()
        .map(|((tile, region, category), bytes)| MemoryEntry {
            tile,
            region,
            category,
            bytes,
        })
        .collect();
    (m, "package images".to_string())
}

impl Profile {
    /// Builds the profile of a session so far.
    pub fn from_session(session: &Session) -> Result<Profile, RuntimeError> {
        let package = session.package();
        let device = session.device();
        let n = package.info.tile_count as usize;
        let schedule = members::schedule(package)?;
        let mut notes = Vec::new();
        let records = device.steps();
        let clock = device.clock_hz();
        let mut steps = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let tiles = &r.tiles[..n.min(r.tiles.len())];
            let host_bytes = session.host_bytes().get(&i).copied().unwrap_or(0);
            // The simulator adds the host cycles of a host sync when it
            // resumes; the last record has not been resumed yet.
            let resumed = i + 1 < records.len();
            let host_cycles = if r.kind == StepKind::HostSync && resumed {
                ipu_arch::host_transfer_cycles(host_bytes, clock)
            } else {
                0
            };
            let active =
                |t: &ipu_sim::TileStep| t.sync_cycles >= SYNC_CYCLES || t.compute_cycles > 0;
            steps.push(ProfileStep {
                index: i,
                kind: match r.kind {
                    StepKind::Sync => "sync",
                    StepKind::HostSync => "host_sync",
                    StepKind::Exit => "exit",
                }
                .to_string(),
                start_cycle: r.start_cycle,
                end_cycle: r.end_cycle,
                call: "load".to_string(),
                call_step: i,
                phase: None,
                operation: None,
                kernels: Vec::new(),
                estimated_cycles: None,
                host_stop: false,
                live: None,
                compute: tiles.iter().map(|t| t.compute_cycles).collect(),
                sync: tiles
                    .iter()
                    .map(|t| {
                        if active(t) {
                            t.sync_cycles - host_cycles.min(t.sync_cycles)
                        } else {
                            0
                        }
                    })
                    .collect(),
                exchange: tiles.iter().map(|t| t.exchange_cycles).collect(),
                host: tiles
                    .iter()
                    .map(|t| {
                        if active(t) {
                            host_cycles.min(t.sync_cycles)
                        } else {
                            0
                        }
                    })
                    .collect(),
                instructions: tiles.iter().map(|t| t.instructions).collect(),
                words_sent: tiles.iter().map(|t| t.words_sent).collect(),
                words_received: tiles.iter().map(|t| t.words_received).collect(),
            });
        }
        let mut calls = Vec::new();
        for c in session.calls() {
            let call = package.info.calls.iter().find(|k| k.name == c.call);
            let count = c.end_step - c.first_step;
            // Manifest phases, expanded by their superstep counts.
            let mut phases: Vec<String> = Vec::new();
            if let Some(call) = call {
                for p in &call.phases {
                    for _ in 0..p.supersteps {
                        phases.push(p.name.clone());
                    }
                }
            }
            let phases_fit = !c.checkpoint && phases.len() == count;
            if !phases_fit && !phases.is_empty() && !c.checkpoint {
                notes.push(format!(
                    "call `{}`: the manifest's phases have {} supersteps but the run took {count} steps; phases not attributed",
                    c.call,
                    phases.len()
                ));
            }
            let sched = schedule
                .as_ref()
                .and_then(|s| s.calls.iter().find(|k| k.call == c.call));
            let sched_fit = sched.filter(|s| !c.checkpoint && s.steps.len() == count);
            if let (Some(s), None) = (sched, sched_fit) {
                if !c.checkpoint {
                    notes.push(format!(
                        "call `{}`: {} lists {} steps but the run took {count}; operations and kernels not attributed",
                        c.call,
                        members::SCHEDULE_MEMBER,
                        s.steps.len()
                    ));
                }
            }
            for (k, step) in steps[c.first_step..c.end_step].iter_mut().enumerate() {
                step.call = c.call.clone();
                step.call_step = k;
                if phases_fit {
                    step.phase = Some(phases[k].clone());
                }
                if let Some(s) = sched_fit {
                    let e = &s.steps[k];
                    if e.phase.is_some() {
                        step.phase = e.phase.clone();
                    }
                    step.operation = e.operation.clone();
                    step.kernels = e.kernels.clone();
                    step.estimated_cycles = e.estimated_cycles;
                    step.host_stop = e.host_stop;
                    step.live = e.live;
                }
            }
            calls.push(ProfileCall {
                call: c.call.clone(),
                checkpoint: c.checkpoint,
                first_step: c.first_step,
                end_step: c.end_step,
                device_cycles: c.device_cycles,
                host_in_cycles: c.host_in_cycles,
                host_out_cycles: c.host_out_cycles,
            });
        }
        // Steps after the last call (the exit) belong to "exit".
        let last_end = session.calls().last().map_or(0, |c| c.end_step);
        let first_call = session
            .calls()
            .first()
            .map_or(records.len(), |c| c.first_step);
        for step in steps.iter_mut().skip(last_end.max(first_call)) {
            step.call = "exit".to_string();
            step.call_step = step.index - last_end;
        }
        let (memory, memory_source) = memory_of(package, &mut notes);
        let manifest = package.manifest().map_err(|e| RuntimeError::Member {
            member: ipu_package::MANIFEST.to_string(),
            message: e.to_string(),
        })?;
        // The same bytes as the package's manifest.json, so this equals its
        // manifest.json.blake3 member.
        let mut manifest_text =
            serde_json::to_string_pretty(&manifest).expect("manifests serialise");
        manifest_text.push('\n');
        let package_digest = blake3::hash(manifest_text.as_bytes()).to_hex().to_string();
        Ok(Profile {
            format: FORMAT.to_string(),
            version: VERSION,
            model: package.info.model.clone(),
            package_digest,
            device: device.describe(),
            tile_count: package.info.tile_count,
            clock_hz: clock,
            total_cycles: device.cycles(),
            calls,
            steps,
            memory,
            memory_source,
            notes,
        })
    }

    /// The profile as JSON text (deterministic: fields in declaration
    /// order, maps sorted).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string(self).expect("profiles serialise");
        s.push('\n');
        s
    }

    /// Writes the profile file.
    pub fn write(&self, path: &Path) -> Result<(), RuntimeError> {
        std::fs::write(path, self.to_json()).map_err(|error| RuntimeError::Io {
            path: path.display().to_string(),
            error,
        })?;
        tracing::info!(path = %path.display(), steps = self.steps.len(), "wrote execution profile");
        Ok(())
    }

    /// Reads and checks a profile file.
    pub fn read(path: &Path) -> Result<Profile, RuntimeError> {
        let io = |error| RuntimeError::Io {
            path: path.display().to_string(),
            error,
        };
        let text = std::fs::read_to_string(path).map_err(io)?;
        let p: Profile = serde_json::from_str(&text).map_err(|e| RuntimeError::Profile {
            path: path.display().to_string(),
            message: format!("not an ipuprofile: {e}"),
        })?;
        if p.format != FORMAT || !(1..=VERSION).contains(&p.version) {
            return Err(RuntimeError::Profile {
                path: path.display().to_string(),
                message: format!(
                    "format `{}` version {} is not {FORMAT} version 1 to {VERSION}",
                    p.format, p.version
                ),
            });
        }
        let n = p.tile_count as usize;
        for s in &p.steps {
            for (name, v) in [
                ("compute", &s.compute),
                ("sync", &s.sync),
                ("exchange", &s.exchange),
                ("host", &s.host),
                ("instructions", &s.instructions),
                ("words_sent", &s.words_sent),
                ("words_received", &s.words_received),
            ] {
                if v.len() != n {
                    return Err(RuntimeError::Profile {
                        path: path.display().to_string(),
                        message: format!(
                            "step {}: `{name}` has {} entries for {n} tiles",
                            s.index,
                            v.len()
                        ),
                    });
                }
            }
        }
        Ok(p)
    }

    /// Groups the profile's cycles by `by`, largest first, at most `top` rows.
    pub fn query(&self, by: GroupBy, top: Option<usize>) -> Vec<QueryRow> {
        let mut rows: BTreeMap<String, Acc> = BTreeMap::new();
        for s in &self.steps {
            let wall = s.end_cycle - s.start_cycle;
            let tiles = 0..self.tile_count as usize;
            match by {
                GroupBy::Tile => {
                    for t in tiles {
                        let a = rows.entry(format!("tile {t:04}")).or_default();
                        let total = s.compute[t] + s.sync[t] + s.exchange[t] + s.host[t];
                        a.add_tile(s, t);
                        a.cycles += total;
                        if total > 0 {
                            a.steps += 1;
                        }
                    }
                }
                GroupBy::Kernel => {
                    let mut covered = BTreeSet::new();
                    let mut groups: Vec<(String, Vec<usize>)> = s
                        .kernels
                        .iter()
                        .map(|k| {
                            let ts: Vec<usize> = k
                                .tiles
                                .iter()
                                .map(|&t| t as usize)
                                .filter(|&t| t < self.tile_count as usize)
                                .collect();
                            covered.extend(ts.iter().copied());
                            (k.kernel.clone(), ts)
                        })
                        .collect();
                    let rest: Vec<usize> = tiles
                        .filter(|t| !covered.contains(t) && s.compute[*t] > 0)
                        .collect();
                    if !rest.is_empty() {
                        groups.push(("(no kernel)".to_string(), rest));
                    }
                    for (name, ts) in groups {
                        let a = rows.entry(name).or_default();
                        a.cycles += ts.iter().map(|&t| s.compute[t]).max().unwrap_or(0);
                        a.steps += 1;
                        for t in ts {
                            a.add_tile(s, t);
                        }
                    }
                }
                _ => {
                    let key = match by {
                        GroupBy::Operation => {
                            s.operation.clone().unwrap_or_else(|| "(none)".to_string())
                        }
                        GroupBy::Phase => s.phase.clone().unwrap_or_else(|| "(none)".to_string()),
                        GroupBy::Call => s.call.clone(),
                        GroupBy::Step => format!("step {:05} {} {}", s.index, s.call, s.kind),
                        GroupBy::Tile | GroupBy::Kernel => unreachable!("handled above"),
                    };
                    let a = rows.entry(key).or_default();
                    a.cycles += wall;
                    a.steps += 1;
                    if let Some(e) = s.estimated_cycles {
                        let (est, device) = a.estimated.get_or_insert((0, 0));
                        *est += e;
                        *device += s.device_cycles();
                    }
                    for t in tiles {
                        a.add_tile(s, t);
                    }
                }
            }
        }
        let mut out: Vec<QueryRow> = rows
            .into_iter()
            .map(|(key, a)| QueryRow {
                key,
                cycles: a.cycles,
                compute: a.compute,
                sync: a.sync,
                exchange: a.exchange,
                host: a.host,
                steps: a.steps,
                tiles: a.tiles.len() as u64,
                estimated: a.estimated,
            })
            .collect();
        out.sort_by(|a, b| b.cycles.cmp(&a.cycles).then_with(|| a.key.cmp(&b.key)));
        if let Some(n) = top {
            out.truncate(n);
        }
        out
    }
}

#[derive(Default)]
struct Acc {
    cycles: u64,
    compute: u64,
    sync: u64,
    exchange: u64,
    host: u64,
    steps: u64,
    tiles: BTreeSet<usize>,
    estimated: Option<(u64, u64)>,
}

impl Acc {
    fn add_tile(&mut self, s: &ProfileStep, t: usize) {
        self.compute += s.compute[t];
        self.sync += s.sync[t];
        self.exchange += s.exchange[t];
        self.host += s.host[t];
        if s.compute[t] + s.sync[t] + s.exchange[t] + s.host[t] > 0 {
            self.tiles.insert(t);
        }
    }
}

/// What to group by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// Kernel (from `schedule.json`).
    Kernel,
    /// Graph operation (from `schedule.json`).
    Operation,
    /// Phase (manifest phases, or `schedule.json`).
    Phase,
    /// Call.
    Call,
    /// Each BSP step.
    Step,
    /// Tile.
    Tile,
}

impl std::str::FromStr for GroupBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "kernel" => GroupBy::Kernel,
            "operation" | "op" => GroupBy::Operation,
            "phase" => GroupBy::Phase,
            "call" => GroupBy::Call,
            "step" => GroupBy::Step,
            "tile" => GroupBy::Tile,
            other => {
                return Err(format!(
                    "unknown grouping `{other}` (expected kernel, operation, phase, call, step or tile)"
                ))
            }
        })
    }
}

/// One group of a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryRow {
    /// The group's key.
    pub key: String,
    /// Elapsed cycles: step durations for calls, phases, operations and
    /// steps; the slowest tile's compute per step for kernels; the tile's
    /// own total for tiles.
    pub cycles: u64,
    /// Tile-cycles of compute summed over the group's (step, tile) pairs.
    pub compute: u64,
    /// Tile-cycles of sync.
    pub sync: u64,
    /// Tile-cycles of exchange.
    pub exchange: u64,
    /// Tile-cycles of host transfer.
    pub host: u64,
    /// Steps in the group.
    pub steps: u64,
    /// Distinct tiles with nonzero cycles in the group.
    pub tiles: u64,
    /// For call, phase, operation and step groups whose steps carry the
    /// compiler's estimates (`schedule.json` format 2): (the estimates
    /// summed, those steps' device cycles: their lengths less the host
    /// link time at host syncs).
    pub estimated: Option<(u64, u64)>,
}

/// A fixed-width table of query rows. The group column is as wide as its
/// longest key (at least 32 characters): a BSP step's phase names every
/// lowered step it runs, and a fixed width would push its figures out of
/// their columns. Rows with estimates add the estimate and its error
/// against the steps' device cycles.
pub fn render(rows: &[QueryRow]) -> String {
    let w = rows
        .iter()
        .map(|r| r.key.chars().count())
        .max()
        .unwrap_or(0)
        .max(32);
    let mut out = String::new();
    // The estimate columns only when some row has an estimate.
    let estimates = rows.iter().any(|r| r.estimated.is_some());
    let _ = write!(
        out,
        "{:<w$} {:>12} {:>14} {:>14} {:>14} {:>14} {:>6} {:>6}",
        "group", "cycles", "compute", "sync", "exchange", "host", "steps", "tiles"
    );
    if estimates {
        let _ = write!(out, " {:>12} {:>8}", "estimated", "error");
    }
    out.push('\n');
    for r in rows {
        let _ = write!(
            out,
            "{:<w$} {:>12} {:>14} {:>14} {:>14} {:>14} {:>6} {:>6}",
            r.key, r.cycles, r.compute, r.sync, r.exchange, r.host, r.steps, r.tiles
        );
        if let Some((e, device)) = r.estimated {
            let error = if device == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:+.1}%",
                    (e as f64 - device as f64) * 100.0 / device as f64
                )
            };
            let _ = write!(out, " {:>12} {:>8}", e, error);
        }
        out.push('\n');
    }
    out
}
