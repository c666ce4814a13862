//! The compiler-supplied package members the runtime reads (docs/runtime.md):
//! `model.ipug`, `checkpoints.json`, `schedule.json`, `symbols.json`.
//! Each parser checks the member against the manifest and the graph and
//! names the member and entry at fault.

use std::collections::{BTreeMap, BTreeSet};

use ipu_arch::{SRAM_BASE, SRAM_END};
use ipu_graph::Graph;
use ipu_package::{Package, Placement};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;

/// Member name of the model text.
pub const MODEL_MEMBER: &str = "model.ipug";
/// Member name of the checkpoint map.
pub const CHECKPOINTS_MEMBER: &str = "checkpoints.json";
/// Member name of the step schedule.
pub const SCHEDULE_MEMBER: &str = "schedule.json";
/// Member name of the code symbols.
pub const SYMBOLS_MEMBER: &str = "symbols.json";
/// The command-word bit that requests a checkpoint run.
pub const CHECKPOINT_FLAG: u32 = 0x8000_0000;

fn bad(member: &str, message: String) -> RuntimeError {
    RuntimeError::Member {
        member: member.to_string(),
        message,
    }
}

/// The package's model graph, if it carries `model.ipug`.
pub fn model(package: &Package) -> Result<Option<Graph>, RuntimeError> {
    let Some(bytes) = package.members.get(MODEL_MEMBER) else {
        return Ok(None);
    };
    let text = std::str::from_utf8(bytes)
        .map_err(|e| bad(MODEL_MEMBER, format!("not UTF-8 text: {e}")))?;
    ipu_graph::parse(MODEL_MEMBER, text)
        .map(Some)
        .map_err(|e| bad(MODEL_MEMBER, e.to_string()))
}

/// A kernel and the tiles that ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelTiles {
    /// Kernel (symbol) name.
    pub kernel: String,
    /// Tiles that ran it.
    pub tiles: Vec<u32>,
}

/// `checkpoints.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoints {
    /// 1.
    pub format_version: u32,
    /// Per call.
    pub calls: Vec<CallCheckpoints>,
}

/// The checkpoints of one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallCheckpoints {
    /// The call's name.
    pub call: String,
    /// Extra host syncs the call executes when the checkpoint flag is set.
    pub stops: u32,
    /// Values readable at the stops.
    pub values: Vec<CheckpointValue>,
}

/// Where one graph value can be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointValue {
    /// The graph value.
    pub value: String,
    /// The stop (1..=stops + 1) at which the placements hold it.
    pub stop: u32,
    /// Its bytes on the device (stored as placement runs).
    #[serde(with = "ipu_package::placement_runs")]
    pub placements: Vec<Placement>,
    /// Kernels that computed it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelTiles>,
    /// Whether the placements index the value transposed (as
    /// `ipu_package::StreamTensor::transposed`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub transposed: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl CallCheckpoints {
    /// The kernels that ran on `tile` for `value`.
    pub fn kernels_on<'v>(&self, value: &'v CheckpointValue, tile: u32) -> Vec<&'v str> {
        value
            .kernels
            .iter()
            .filter(|k| k.tiles.contains(&tile))
            .map(|k| k.kernel.as_str())
            .collect()
    }
}

/// Checks that `placements` cover a `total`-byte buffer exactly once, inside
/// SRAM and on tiles below `tile_count`.
pub(crate) fn check_placements(
    placements: &[Placement],
    total: u64,
    tile_count: u32,
) -> Result<(), String> {
    let mut ranges = Vec::with_capacity(placements.len());
    for (i, p) in placements.iter().enumerate() {
        if p.tile >= tile_count {
            return Err(format!(
                "placement {i} is on tile {}, beyond tile_count {tile_count}",
                p.tile
            ));
        }
        let end = p.offset.checked_add(p.bytes as u64);
        if p.bytes == 0 || end.is_none_or(|e| e > total) {
            return Err(format!(
                "placement {i} covers bytes {}..+{} of a {total}-byte value",
                p.offset, p.bytes
            ));
        }
        if p.address < SRAM_BASE || p.address as u64 + p.bytes as u64 > SRAM_END as u64 {
            return Err(format!(
                "placement {i} at {:#07x}..+{} on tile {} lies outside tile SRAM",
                p.address, p.bytes, p.tile
            ));
        }
        ranges.push((p.offset, p.offset + p.bytes as u64));
    }
    ranges.sort_unstable();
    let mut covered = 0;
    for (start, end) in ranges {
        if start != covered {
            return Err(if start > covered {
                format!("bytes {covered}..{start} are placed on no tile")
            } else {
                format!("bytes {start}..{} are placed twice", covered.min(end))
            });
        }
        covered = end;
    }
    if covered != total {
        return Err(format!("bytes {covered}..{total} are placed on no tile"));
    }
    Ok(())
}

/// Parses and checks `checkpoints.json` against the manifest and the graph.
pub fn checkpoints(package: &Package, graph: &Graph) -> Result<Option<Checkpoints>, RuntimeError> {
    let m = CHECKPOINTS_MEMBER;
    let Some(bytes) = package.members.get(m) else {
        return Ok(None);
    };
    let cp: Checkpoints = serde_json::from_slice(bytes).map_err(|e| bad(m, e.to_string()))?;
    if cp.format_version != 1 {
        return Err(bad(
            m,
            format!(
                "unsupported format_version {} (expected 1)",
                cp.format_version
            ),
        ));
    }
    let mut calls = BTreeSet::new();
    for c in &cp.calls {
        if !package.info.calls.iter().any(|k| k.name == c.call) {
            return Err(bad(
                m,
                format!("call `{}` is not a call of the manifest", c.call),
            ));
        }
        if !calls.insert(c.call.as_str()) {
            return Err(bad(m, format!("call `{}` appears twice", c.call)));
        }
        let mut values = BTreeSet::new();
        for v in &c.values {
            let at = format!("call `{}` value `{}`", c.call, v.value);
            let id = graph
                .lookup(&v.value)
                .ok_or_else(|| bad(m, format!("{at}: no such value in {MODEL_MEMBER}")))?;
            if !values.insert(v.value.as_str()) {
                return Err(bad(m, format!("{at}: listed twice")));
            }
            if v.stop == 0 || v.stop > c.stops + 1 {
                return Err(bad(
                    m,
                    format!("{at}: stop {} is outside 1..={}", v.stop, c.stops + 1),
                ));
            }
            check_placements(
                &v.placements,
                graph.value(id).ty.bytes(),
                package.info.tile_count,
            )
            .map_err(|why| bad(m, format!("{at}: {why}")))?;
        }
    }
    Ok(Some(cp))
}

/// `schedule.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// 1, or 2 with each step's estimated cycles.
    pub format_version: u32,
    /// Per call.
    pub calls: Vec<CallSchedule>,
}

/// The BSP steps of one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallSchedule {
    /// The call.
    pub call: String,
    /// One entry per BSP step.
    pub steps: Vec<ScheduledStep>,
}

impl CallSchedule {
    /// The compiler's estimate of the whole call: its steps' estimates
    /// summed, when every step has one.
    pub fn estimated_cycles(&self) -> Option<u64> {
        self.steps.iter().map(|st| st.estimated_cycles).sum()
    }
}

/// What one BSP step does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledStep {
    /// The graph value being computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Kernels run in the step's compute phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelTiles>,
    /// The compiler's estimate of the step's cycles (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cycles: Option<u64>,
    /// Whether the step ends at a host stop (docs/host-protocol.md), whose
    /// host-link cycles are part of the call's device cycles and of the
    /// estimate. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_stop: bool,
    /// The bytes that hold data some step still needs while the step runs
    /// (the compiler's liveness phase). Absent in packages from before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<StepLive>,
}

pub use ipu_package::StepLive;

/// Parses `schedule.json`.
pub fn schedule(package: &Package) -> Result<Option<Schedule>, RuntimeError> {
    let m = SCHEDULE_MEMBER;
    let Some(bytes) = package.members.get(m) else {
        return Ok(None);
    };
    let s: Schedule = serde_json::from_slice(bytes).map_err(|e| bad(m, e.to_string()))?;
    // Format 2 added each step's estimated cycles.
    if !(1..=2).contains(&s.format_version) {
        return Err(bad(
            m,
            format!(
                "unsupported format_version {} (expected 1 or 2)",
                s.format_version
            ),
        ));
    }
    for c in &s.calls {
        if !package.info.calls.iter().any(|k| k.name == c.call) {
            return Err(bad(
                m,
                format!("call `{}` is not a call of the manifest", c.call),
            ));
        }
        for (i, st) in c.steps.iter().enumerate() {
            for k in &st.kernels {
                if let Some(t) = k.tiles.iter().find(|&&t| t >= package.info.tile_count) {
                    return Err(bad(
                        m,
                        format!(
                            "call `{}` step {i} kernel `{}`: tile {t} is beyond tile_count {}",
                            c.call, k.kernel, package.info.tile_count
                        ),
                    ));
                }
            }
        }
    }
    Ok(Some(s))
}

/// `symbols.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Symbols {
    /// 1.
    pub format_version: u32,
    /// Tiles sharing one symbol table.
    pub groups: Vec<SymbolGroup>,
}

/// One symbol table and the tiles it describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SymbolGroup {
    /// Tiles.
    pub tiles: Vec<u32>,
    /// Symbols.
    pub symbols: Vec<Symbol>,
}

/// A code or data symbol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Symbol {
    /// Name.
    pub name: String,
    /// Address.
    pub address: u32,
    /// Size in bytes.
    pub size: u32,
}

/// Parses `symbols.json` into a simulator symbol map (address -> name) per tile.
pub fn symbols(package: &Package) -> Result<BTreeMap<u32, ipu_sim::SymbolMap>, RuntimeError> {
    let m = SYMBOLS_MEMBER;
    let Some(bytes) = package.members.get(m) else {
        return Ok(BTreeMap::new());
    };
    let s: Symbols = serde_json::from_slice(bytes).map_err(|e| bad(m, e.to_string()))?;
    if s.format_version != 1 {
        return Err(bad(
            m,
            format!(
                "unsupported format_version {} (expected 1)",
                s.format_version
            ),
        ));
    }
    let mut out = BTreeMap::new();
    for (g, group) in s.groups.iter().enumerate() {
        let mut map = ipu_sim::SymbolMap::new();
        for sym in &group.symbols {
            map.insert(sym.address, sym.name.clone());
        }
        for &t in &group.tiles {
            if t >= package.info.tile_count {
                return Err(bad(
                    m,
                    format!(
                        "group {g}: tile {t} is beyond tile_count {}",
                        package.info.tile_count
                    ),
                ));
            }
            if out.insert(t, map.clone()).is_some() {
                return Err(bad(m, format!("group {g}: tile {t} is in two groups")));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_has_an_estimate_only_where_every_step_has_one() {
        let step = |e: Option<u64>| ScheduledStep {
            estimated_cycles: e,
            ..ScheduledStep::default()
        };
        let call = |steps| CallSchedule {
            call: "run".into(),
            steps,
        };
        assert_eq!(
            call(vec![step(Some(600)), step(Some(1_234))]).estimated_cycles(),
            Some(1_834)
        );
        assert_eq!(
            call(vec![step(Some(600)), step(None)]).estimated_cycles(),
            None
        );
        assert_eq!(call(vec![]).estimated_cycles(), Some(0));
    }
}
