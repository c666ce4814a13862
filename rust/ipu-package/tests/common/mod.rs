//! A realistic sample package shared by the package tests.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;

use ipu_graph::DType;
use ipu_package::*;

/// Four tiles running a small "run" call and an "initialize" call.
pub fn sample() -> Package {
    let mut tiles = BTreeMap::new();
    for tile in 0..4u32 {
        let code: Vec<u8> = (0..64u32).map(|i| (i * 7 + tile) as u8).collect();
        tiles.insert(
            tile,
            TileImage {
                tile,
                entry_pc: 0x4C000,
                segments: vec![
                    Segment {
                        address: 0x4C000,
                        bytes: code,
                    },
                    Segment {
                        address: 0x80000,
                        bytes: vec![tile as u8; 13],
                    },
                ],
            },
        );
    }
    let x = StreamTensor {
        name: "x".into(),
        dtype: DType::F16,
        shape: vec![4, 8],
        placements: (0..4)
            .map(|t| Placement {
                tile: t,
                address: 0x90000,
                offset: t as u64 * 16,
                bytes: 16,
            })
            .collect(),
        transposed: false,
        stop: 0,
    };
    let w = StreamTensor {
        name: "w".into(),
        dtype: DType::Fp8 { scale_log2: -4 },
        shape: vec![8, 8],
        // The whole weight is multicast to every tile.
        placements: (0..4)
            .map(|t| Placement {
                tile: t,
                address: 0xA0000,
                offset: 0,
                bytes: 64,
            })
            .collect(),
        transposed: false,
        stop: 0,
    };
    let y = StreamTensor {
        name: "y".into(),
        dtype: DType::F16,
        shape: vec![4, 8],
        placements: (0..4)
            .map(|t| Placement {
                tile: t,
                address: 0xB0000,
                offset: t as u64 * 16,
                bytes: 16,
            })
            .collect(),
        transposed: false,
        stop: 0,
    };
    let phase = |name: &str, kind, steps, cycles| CallPhase {
        name: name.into(),
        kind,
        supersteps: steps,
        estimated_cycles: cycles,
    };
    Package {
        info: PackageInfo {
            compiler_version: "ipu-compile 0.1.0".into(),
            tile_count: 4,
            model: "sample".into(),
            host: HostInterface {
                command_address: 0x4C000,
            },
            calls: vec![
                StreamingCall {
                    name: "initialize".into(),
                    phases: vec![phase("upload weights", PhaseKind::HostToDevice, 1, None)],
                    inputs: vec![w],
                    outputs: vec![],
                    host_stops: 0,
                },
                StreamingCall {
                    name: "run".into(),
                    phases: vec![
                        phase("upload x", PhaseKind::HostToDevice, 1, Some(700)),
                        phase("gemm", PhaseKind::Compute, 1, Some(1234)),
                        phase("download y", PhaseKind::DeviceToHost, 1, Some(650)),
                    ],
                    inputs: vec![x],
                    outputs: vec![y],
                    host_stops: 0,
                },
            ],
            config_writes: vec![
                ConfigWrite {
                    tile: None,
                    register: "SYNC_GROUP".into(),
                    value: 1,
                },
                ConfigWrite {
                    tile: Some(3),
                    register: "EXCHANGE_TABLE".into(),
                    value: 0x7F000,
                },
            ],
            report_summary: BTreeMap::from([
                ("compute_bound_cycles".into(), 1),
                ("estimated_cycles".into(), 2584),
            ]),
        },
        tiles,
        members: BTreeMap::from([
            ("report.json".into(), b"{\"cycles\": 2584}\n".to_vec()),
            ("symbols/tile0000.txt".into(), b"0x4c000 main\n".to_vec()),
        ]),
    }
}

/// A tar archive of the given members, built like the writer builds one.
pub fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut header = tar::Header::new_ustar();
        header.set_path(name).unwrap();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append(&header, *bytes).unwrap();
    }
    builder.into_inner().unwrap()
}

/// The members of an archive, in order.
pub fn members_of(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut archive = tar::Archive::new(tar);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// The seeded PRNG of the fuzz test (the other test binaries that share
/// this module do not use it).
#[allow(unused_imports)]
pub use ipu_rng::SplitMix64 as Rng;
