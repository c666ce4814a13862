//! `manifest.json`: everything a loader needs to know before touching a tile.

use std::collections::BTreeMap;

use ipu_graph::DType;
use serde::{Deserialize, Serialize};

/// The package format version this crate reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// The only target architecture.
pub const TARGET: &str = "ipu21";

/// The manifest, serialised as pretty JSON with fields in declaration order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Package format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// The compiler that built the package, e.g. "ipu-compile 0.1.0".
    pub compiler_version: String,
    /// Target architecture ([`TARGET`]).
    pub target: String,
    /// Tiles the program uses: tiles 0..tile_count.
    pub tile_count: u32,
    /// Model name.
    pub model: String,
    /// How the host drives the program (docs/host-protocol.md).
    pub host: HostInterface,
    /// Host streaming calls, e.g. "initialize" and "run".
    pub calls: Vec<StreamingCall>,
    /// Register writes the loader replays before loading tiles, in order.
    pub config_writes: Vec<ConfigWrite>,
    /// Compile report figures (cycles, bounds, bytes), by name.
    pub report_summary: BTreeMap<String, u64>,
    /// One entry per tile image, sorted by tile.
    pub tiles: Vec<TileEntry>,
    /// Every other member (report.json, symbols, ...), sorted by name.
    pub members: Vec<MemberEntry>,
}

/// A host streaming call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamingCall {
    /// Call name, unique in the package.
    pub name: String,
    /// The program phases the call runs, in order.
    pub phases: Vec<CallPhase>,
    /// Tensors the host writes to the device.
    pub inputs: Vec<StreamTensor>,
    /// Tensors the host reads back.
    pub outputs: Vec<StreamTensor>,
}

/// One phase of a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallPhase {
    /// Phase name, e.g. "gemm q" or "exchange 3".
    pub name: String,
    /// What the phase does.
    pub kind: PhaseKind,
    /// BSP supersteps in the phase.
    pub supersteps: u32,
    /// Cycles the compiler's cost model expects, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cycles: Option<u64>,
}

/// What a phase does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseKind {
    /// Host writes into tile memory.
    HostToDevice,
    /// Tile compute.
    Compute,
    /// Tile-to-tile exchange.
    Exchange,
    /// Host reads from tile memory.
    DeviceToHost,
}

/// A named host tensor and where its bytes live on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamTensor {
    /// Name (the graph value's name).
    pub name: String,
    /// Element type, spelled as in .ipug ("f16", "fp8<-3>").
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Byte ranges of the row-major host buffer and their tile addresses.
    /// Inputs may place the same bytes on several tiles; outputs place each
    /// byte exactly once. Together they cover the whole buffer.
    pub placements: Vec<Placement>,
}

impl StreamTensor {
    /// Bytes of the host buffer.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.dtype.size_bytes() as u64
    }
}

/// `bytes` bytes at `offset` of the host buffer live at `address` on `tile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Tile number.
    pub tile: u32,
    /// SRAM address on the tile.
    pub address: u32,
    /// Byte offset in the host buffer.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u32,
}

/// How the host drives the tile programs (docs/host-protocol.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostInterface {
    /// SRAM address, the same on every tile, where the host writes the index
    /// of the call to run (or 0xFFFFFFFF to end) before resuming the device.
    pub command_address: u32,
}

/// The command word that ends a session: every supervisor exits.
pub const EXIT_COMMAND: u32 = 0xFFFF_FFFF;

/// One register write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigWrite {
    /// The tile, or none for a chip-level register.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tile: Option<u32>,
    /// Register name.
    pub register: String,
    /// Value written.
    pub value: u32,
}

/// A tile image member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TileEntry {
    /// Tile number.
    pub tile: u32,
    /// Member name: `tiles/NNNN.img` with the tile number in four digits.
    pub file: String,
    /// Member size in bytes.
    pub size: u64,
    /// BLAKE3 digest of the member, lowercase hex.
    pub blake3: String,
}

/// Any other member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberEntry {
    /// Member name (a relative path).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3 digest, lowercase hex.
    pub blake3: String,
}

/// The member name of a tile's image.
pub fn tile_file(tile: u32) -> String {
    format!("tiles/{tile:04}.img")
}
