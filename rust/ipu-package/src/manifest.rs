//! `manifest.json`: everything a loader needs to know before touching a tile.

use std::collections::BTreeMap;

use ipu_graph::DType;
use serde::{Deserialize, Serialize};

/// The package format version this crate reads and writes.
pub const FORMAT_VERSION: u32 = 2;
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
    /// Host stops: `hsync`s the call executes on every run before its
    /// final one, at which the host writes the inputs of that stop
    /// ([`StreamTensor::stop`]) and resumes the device (a device loop's
    /// weights streamed per iteration). Absent when zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_stops: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
    /// byte exactly once. Together they cover the whole buffer. Stored as
    /// runs ([`placement_runs`]).
    #[serde(with = "placement_runs")]
    pub placements: Vec<Placement>,
    /// Whether the placements' offsets index the tensor *transposed*: the
    /// row-major buffer of the tensor with its last two dimensions swapped
    /// (every batch element transposed on its own), which the host forms
    /// before writing and undoes after reading ([`transposed_order`],
    /// [`natural_order`]). A GEMM operand the model transposes is held so
    /// on the device. Absent when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub transposed: bool,
    /// For an input: the host stop of its call at which the host writes
    /// it (1 to the call's `host_stops`), or 0 (absent) for before the
    /// call. Inputs of different stops may share placements (each stop's
    /// tensor replaces the previous one). Outputs are read after the call.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stop: u32,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl StreamTensor {
    /// Bytes of the host buffer.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.dtype.size_bytes() as u64
    }
}

/// The element of the transposed buffer (see [`StreamTensor::transposed`])
/// that holds element `index` of the row-major tensor of `shape` (rank at
/// least 2).
pub fn transposed_element(index: u64, shape: &[usize]) -> u64 {
    let n = shape.len();
    let (rows, cols) = (shape[n - 2] as u64, shape[n - 1] as u64);
    let (batch, within) = (index / (rows * cols), index % (rows * cols));
    let (row, col) = (within / cols, within % cols);
    batch * rows * cols + col * rows + row
}

/// The inverse of [`transposed_element`]: the element of the row-major
/// tensor of `shape` that element `index` of the transposed buffer holds.
pub fn natural_element(index: u64, shape: &[usize]) -> u64 {
    let n = shape.len();
    let (rows, cols) = (shape[n - 2] as u64, shape[n - 1] as u64);
    let (batch, within) = (index / (rows * cols), index % (rows * cols));
    // The transposed buffer is [cols, rows] per batch element.
    let (col, row) = (within / rows, within % rows);
    batch * rows * cols + row * cols + col
}

/// `data` (row-major, elements of `element_bytes`) in the transposed order
/// of [`StreamTensor::transposed`].
pub fn transposed_order(data: &[u8], shape: &[usize], element_bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for (i, e) in data.chunks_exact(element_bytes).enumerate() {
        let j = transposed_element(i as u64, shape) as usize * element_bytes;
        out[j..j + element_bytes].copy_from_slice(e);
    }
    out
}

/// The inverse of [`transposed_order`]: a transposed buffer back in the
/// tensor's row-major order.
pub fn natural_order(data: &[u8], shape: &[usize], element_bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for (i, e) in out.chunks_exact_mut(element_bytes).enumerate() {
        let j = transposed_element(i as u64, shape) as usize * element_bytes;
        e.copy_from_slice(&data[j..j + element_bytes]);
    }
    out
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

/// On disk, a list of placements is a list of runs: `count` placements of
/// `bytes` bytes on `tile`, the i-th at `address + i * address_step` and
/// host offset `offset + i * offset_step` (a weight's rows on a tile are one
/// run instead of a thousand entries). Runs are formed greedily in list
/// order and expand back to exactly the same list, so the order (and the
/// package bytes) stay deterministic. Use with `#[serde(with = ...)]`.
pub mod placement_runs {
    use super::Placement;
    use ipu_arch::TILE_SRAM_BYTES;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    fn one() -> u32 {
        1
    }
    fn is_one(x: &u32) -> bool {
        *x == 1
    }
    fn is_zero(x: &i64) -> bool {
        *x == 0
    }

    /// One run of placements.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Run {
        pub tile: u32,
        pub address: u32,
        pub offset: u64,
        pub bytes: u32,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        pub count: u32,
        #[serde(default, skip_serializing_if = "is_zero")]
        pub address_step: i64,
        #[serde(default, skip_serializing_if = "is_zero")]
        pub offset_step: i64,
    }

    /// The runs of `list`, in order.
    pub fn to_runs(list: &[Placement]) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        for p in list {
            if let Some(r) = runs.last_mut() {
                if r.tile == p.tile && r.bytes == p.bytes {
                    let da = p.address as i64 - r.address as i64;
                    let doff = p.offset as i64 - r.offset as i64;
                    let k = r.count as i64;
                    let fits = if r.count == 1 {
                        true
                    } else {
                        da == k * r.address_step && doff == k * r.offset_step
                    };
                    if fits && r.count < u32::MAX {
                        if r.count == 1 {
                            r.address_step = da;
                            r.offset_step = doff;
                        }
                        r.count += 1;
                        continue;
                    }
                }
            }
            runs.push(Run {
                tile: p.tile,
                address: p.address,
                offset: p.offset,
                bytes: p.bytes,
                count: 1,
                address_step: 0,
                offset_step: 0,
            });
        }
        runs
    }

    /// The placements of `runs`, or a message naming the run that leaves
    /// the address or offset range.
    pub fn from_runs(runs: &[Run]) -> Result<Vec<Placement>, String> {
        let mut out = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            if r.count == 0 {
                return Err(format!("placement run {i} has count 0"));
            }
            // A run puts count x bytes bytes on one tile. More than the
            // tile's SRAM cannot be valid (its placements would overlap or
            // be empty), and refusing it before expanding keeps a few
            // manifest bytes from asking for billions of placements.
            let placed = r.count as u64 * (r.bytes as u64).max(1);
            if placed > TILE_SRAM_BYTES as u64 {
                return Err(format!(
                    "placement run {i} (tile {}) places {} x {} bytes, more than a tile's {TILE_SRAM_BYTES}-byte SRAM",
                    r.tile, r.count, r.bytes
                ));
            }
            for j in 0..r.count as i64 {
                let address = r.address as i64 + j * r.address_step;
                let offset = r.offset as i64 + j * r.offset_step;
                if !(0..=u32::MAX as i64).contains(&address) || offset < 0 {
                    return Err(format!(
                        "placement run {i} (tile {}) leaves the address or offset range at element {j}",
                        r.tile
                    ));
                }
                out.push(Placement {
                    tile: r.tile,
                    address: address as u32,
                    offset: offset as u64,
                    bytes: r.bytes,
                });
            }
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(list: &[Placement], s: S) -> Result<S::Ok, S::Error> {
        to_runs(list).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Placement>, D::Error> {
        let runs = Vec::<Run>::deserialize(d)?;
        from_runs(&runs).map_err(serde::de::Error::custom)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn runs_round_trip_and_compress() {
            let p = |tile, address, offset, bytes| Placement {
                tile,
                address,
                offset,
                bytes,
            };
            let mut list: Vec<Placement> = (0..1152)
                .map(|k| p(7, 0x80000 + 32 * k, 2304 * k as u64, 32))
                .collect();
            list.push(p(7, 0x90000, 5, 32));
            list.push(p(8, 0x90000, 5, 32));
            list.push(p(8, 0x90010, 3, 32));
            list.push(p(8, 0x90000, 1, 32));
            let runs = to_runs(&list);
            assert_eq!(runs.len(), 4, "{runs:?}");
            assert_eq!(runs[0].count, 1152);
            assert_eq!(runs[2].offset_step, -2);
            assert_eq!(from_runs(&runs).unwrap(), list);
            let bad = Run {
                tile: 1,
                address: 4,
                offset: 0,
                bytes: 4,
                count: 3,
                address_step: -4,
                offset_step: 4,
            };
            assert!(from_runs(&[bad]).unwrap_err().contains("run 0 (tile 1)"));
        }
    }
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
