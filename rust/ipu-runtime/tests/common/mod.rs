//! Hand-built packages for the runtime tests, made with the real toolchain
//! (ipu-asm, ipu-link, ipu-package): a two-tile program that follows
//! docs/host-protocol.md and docs/runtime.md (checkpoint flag), computing
//!
//! ```text
//! model add_chain
//! input x: f32[2, 8]
//! param b: f32[2, 8]
//! y = add(x, b)
//! z = add(y, y)
//! output z
//! ```
//!
//! Tile t holds row t of every value. Each operation is one vertex (worker
//! kernel `add_f32`: out = a + b over f32 pairs) followed by a BSP `sync`.
//! The broken variant runs `add_f32_short` (which drops the last pair) for
//! `z` on tile 1, a kernel bug verification must pin on `z`, tile 1.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use ipu_graph::DType;
use ipu_package::{
    CallPhase, HostInterface, Package, PackageInfo, PhaseKind, Placement, Segment, StreamTensor,
    StreamingCall, TileImage,
};

pub const X: u32 = 0x80000;
pub const B: u32 = 0x80040;
pub const Y: u32 = 0x80080;
pub const Z: u32 = 0x800C0;
pub const CMD: u32 = 0x80200;
pub const ROW_BYTES: u32 = 32;

pub const MODEL: &str = "model add_chain
input x: f32[2, 8]
param b: f32[2, 8]
y: f32[2, 8] = add(x, b)
z: f32[2, 8] = add(y, y)
output z
";

fn kernel(name: &str, pairs_minus: i32) -> String {
    format!(
        "
        .section .text.{name}, code
        .globl {name}
{name}:
        ld32 $m2, [$m0]
        ld32 $m3, [$m0+4]
        ld32 $m4, [$m0+8]
        ld32 $m5, [$m0+12]
        add $m5, $m5, -{pairs_minus}
{name}_loop:
        ld64 $a0:1, [$m2]+=8
        ld64 $a2:3, [$m3]+=8
        f32v2add $a4:5, $a0:1, $a2:3
        st64 $a4:5, [$m4]+=8
        brnzdec $m5, {name}_loop
        exit
"
    )
}

fn supervisor(kernel_z: &str) -> String {
    format!(
        "
        .text
        .globl main
main:
idle:   hsync
        setzi $m1, {CMD}
        ld32 $m2, [$m1]
        add $m3, $m2, 1
        brz $m3, done
        shr $m4, $m2, 31
        shl $m5, $m2, 1
        shr $m5, $m5, 1
        brz $m5, idle
        setzi $m6, add_f32
        setzi $m7, state_y
        run $m6, $m7
        wsync
        brz $m4, no_stop
        hsync
no_stop:
        sync
        xend
        setzi $m6, {kernel_z}
        setzi $m7, state_z
        run $m6, $m7
        wsync
        br idle
done:   exit

        .data
        .align 4
        .globl state_y
state_y: .word {X}, {B}, {Y}, 4
        .globl state_z
state_z: .word {Y}, {Y}, {Z}, 4
"
    )
}

fn assemble(name: &str, text: &str) -> ipu_link::Input {
    let out = ipu_asm::assemble_source(name, text, Path::new("."), &ipu_asm::Options::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    ipu_link::Input {
        name: name.to_string(),
        object: out.object,
    }
}

/// Links the program of one tile; returns the package image and its symbols.
pub fn tile_program(tile: u32, kernel_z: &str) -> (TileImage, Vec<serde_json::Value>) {
    let inputs = [
        assemble("main.S", &supervisor(kernel_z)),
        assemble("add_f32.S", &kernel("add_f32", 1)),
        assemble("add_f32_short.S", &kernel("add_f32_short", 2)),
    ];
    let mut opts = ipu_link::LinkOptions::new("main");
    opts.keep = vec!["add_f32".to_string(), "add_f32_short".to_string()];
    opts.data_base = Some(0x80100);
    let linked = ipu_link::link(&inputs, &opts).unwrap_or_else(|e| panic!("{e}"));
    let image = TileImage {
        tile,
        entry_pc: linked.image.entry,
        segments: linked
            .image
            .segments
            .iter()
            .map(|s| Segment {
                address: s.address,
                bytes: s.bytes.clone(),
            })
            .collect(),
    };
    let symbols = linked
        .image
        .symbols
        .iter()
        .map(|(name, s)| serde_json::json!({"name": name, "address": s.address, "size": s.size}))
        .collect();
    (image, symbols)
}

fn rows(name: &str, address: u32, tiles: u32) -> StreamTensor {
    StreamTensor {
        name: name.to_string(),
        dtype: DType::F32,
        shape: vec![2, 8],
        placements: (0..2)
            .map(|t| Placement {
                tile: t % tiles,
                address,
                offset: (t * ROW_BYTES) as u64,
                bytes: ROW_BYTES,
            })
            .collect(),
        transposed: false,
        stop: 0,
    }
}

/// What to put in the test package.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Run the short kernel for `z` on tile 1.
    pub broken: bool,
    /// Include checkpoints.json.
    pub checkpoints: bool,
    /// Include model.ipug.
    pub model: bool,
    /// Include schedule.json and symbols.json.
    pub schedule: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            broken: false,
            checkpoints: true,
            model: true,
            schedule: true,
        }
    }
}

fn placements_json(address: u32) -> serde_json::Value {
    serde_json::json!([
        {"tile": 0, "address": address, "offset": 0, "bytes": ROW_BYTES},
        {"tile": 1, "address": address, "offset": ROW_BYTES, "bytes": ROW_BYTES}
    ])
}

/// The two-tile add_chain package.
pub fn package(o: Options) -> Package {
    let mut tiles = BTreeMap::new();
    let mut groups = Vec::new();
    for t in 0..2 {
        let kz = if o.broken && t == 1 {
            "add_f32_short"
        } else {
            "add_f32"
        };
        let (image, symbols) = tile_program(t, kz);
        tiles.insert(t, image);
        groups.push(serde_json::json!({"tiles": [t], "symbols": symbols}));
    }
    let z_kernels = if o.broken {
        serde_json::json!([{"kernel": "add_f32", "tiles": [0]}, {"kernel": "add_f32_short", "tiles": [1]}])
    } else {
        serde_json::json!([{"kernel": "add_f32", "tiles": [0, 1]}])
    };
    let mut members = BTreeMap::new();
    if o.model {
        members.insert("model.ipug".to_string(), MODEL.as_bytes().to_vec());
    }
    if o.checkpoints {
        let cp = serde_json::json!({
            "format_version": 1,
            "calls": [{"call": "run", "stops": 1, "values": [
                {"value": "y", "stop": 1, "placements": placements_json(Y),
                 "kernels": [{"kernel": "add_f32", "tiles": [0, 1]}]},
                {"value": "z", "stop": 2, "placements": placements_json(Z), "kernels": z_kernels}
            ]}]
        });
        members.insert(
            "checkpoints.json".to_string(),
            serde_json::to_vec_pretty(&cp).unwrap(),
        );
    }
    if o.schedule {
        let s = serde_json::json!({
            "format_version": 1,
            "calls": [
                {"call": "initialize", "steps": [{"phase": "upload parameters"}]},
                {"call": "run", "steps": [
                    {"operation": "y", "phase": "add y", "kernels": [{"kernel": "add_f32", "tiles": [0, 1]}]},
                    {"operation": "z", "phase": "add z", "kernels": z_kernels}
                ]}
            ]
        });
        members.insert(
            "schedule.json".to_string(),
            serde_json::to_vec_pretty(&s).unwrap(),
        );
        let sym = serde_json::json!({"format_version": 1, "groups": groups});
        members.insert(
            "symbols.json".to_string(),
            serde_json::to_vec(&sym).unwrap(),
        );
    }
    let phase = |name: &str, kind| CallPhase {
        name: name.to_string(),
        kind,
        supersteps: 1,
        estimated_cycles: None,
    };
    Package {
        info: PackageInfo {
            compiler_version: "hand-built test package".to_string(),
            tile_count: 2,
            model: "add_chain".to_string(),
            host: HostInterface {
                command_address: CMD,
            },
            calls: vec![
                StreamingCall {
                    name: "initialize".to_string(),
                    phases: vec![phase("upload parameters", PhaseKind::HostToDevice)],
                    inputs: vec![rows("b", B, 2)],
                    outputs: vec![],
                    host_stops: 0,
                },
                StreamingCall {
                    name: "run".to_string(),
                    phases: vec![
                        phase("add y", PhaseKind::Compute),
                        phase("add z", PhaseKind::Compute),
                    ],
                    inputs: vec![rows("x", X, 2)],
                    outputs: vec![rows("z", Z, 2)],
                    host_stops: 0,
                },
            ],
            config_writes: vec![ipu_package::ConfigWrite {
                tile: None,
                register: "exchange_clock_divider".to_string(),
                value: 1,
            }],
            report_summary: BTreeMap::new(),
        },
        tiles,
        members,
    }
}

/// Writes `package` into `dir` and returns the path.
pub fn write(dir: &Path, name: &str, package: &Package) -> std::path::PathBuf {
    let path = dir.join(name);
    package.write(&path).unwrap();
    path
}
