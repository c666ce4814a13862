//! Writing, reading and validating packages.

mod common;

use expect_test::expect;
use ipu_package::*;

#[test]
fn round_trip_is_lossless_and_deterministic() {
    let p = common::sample();
    let bytes = p.to_bytes().unwrap();
    assert_eq!(bytes, p.to_bytes().unwrap(), "same package, same bytes");
    assert_eq!(&bytes[..4], &[0x28, 0xB5, 0x2F, 0xFD], "a zstd frame");
    assert_eq!(Package::from_bytes(&bytes).unwrap(), p);
    // Host stops and the inputs written at them survive the round trip.
    let mut q = p.clone();
    q.info.calls[1].host_stops = 2;
    let mut again = q.info.calls[1].inputs[0].clone();
    again.name = "x.1".into();
    again.stop = 2;
    q.info.calls[1].inputs.push(again);
    let bytes = q.to_bytes().unwrap();
    assert_eq!(Package::from_bytes(&bytes).unwrap(), q);
}

/// The archive streams into the compressor with its size pledged before
/// the first byte: the frame must hold exactly `to_tar()`, with that size in
/// its header, for members of every length modulo the 512-byte blocks
/// (an empty one too).
#[test]
fn the_compressed_stream_is_the_archive_with_its_size_pledged() {
    for extra in [0usize, 1, 511, 512, 513, 4096 + 7] {
        let mut p = common::sample();
        p.members.insert("notes.txt".into(), vec![b'n'; extra]);
        let bytes = p.to_bytes().unwrap();
        let tar = p.to_tar().unwrap();
        let size = zstd::zstd_safe::get_frame_content_size(&bytes).unwrap();
        assert_eq!(size, Some(tar.len() as u64), "member of {extra} bytes");
        assert_eq!(zstd::stream::decode_all(bytes.as_slice()).unwrap(), tar);
    }
}

#[test]
fn archive_layout_is_canonical() {
    let tar = common::sample().to_tar().unwrap();
    let mut archive = tar::Archive::new(tar.as_slice());
    let listing: Vec<String> = archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let h = e.header();
            format!(
                "{} size={} mode={:o} uid={} gid={} mtime={} user={:?}",
                e.path().unwrap().display(),
                h.size().unwrap(),
                h.mode().unwrap(),
                h.uid().unwrap(),
                h.gid().unwrap(),
                h.mtime().unwrap(),
                h.username().unwrap().unwrap_or("")
            )
        })
        .collect();
    expect![[r#"
        [
            "manifest.json size=4423 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "manifest.json.blake3 size=65 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "report.json size=17 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "symbols/tile0000.txt size=13 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "tiles/0000.img size=120 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "tiles/0001.img size=120 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "tiles/0002.img size=120 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
            "tiles/0003.img size=120 mode=644 uid=0 gid=0 mtime=0 user=\"\"",
        ]
    "#]]
    .assert_debug_eq(&listing);
}

#[test]
fn manifest_text() {
    let tar = common::sample().to_tar().unwrap();
    let (name, json) = &common::members_of(&tar)[0];
    assert_eq!(name, "manifest.json");
    expect![[r#"
        {
          "format_version": 2,
          "compiler_version": "ipu-compile 0.1.0",
          "target": "ipu21",
          "tile_count": 4,
          "model": "sample",
          "host": {
            "command_address": 311296
          },
          "calls": [
            {
              "name": "initialize",
              "phases": [
                {
                  "name": "upload weights",
                  "kind": "host_to_device",
                  "supersteps": 1
                }
              ],
              "inputs": [
                {
                  "name": "w",
                  "dtype": "fp8<-4>",
                  "shape": [
                    8,
                    8
                  ],
                  "placements": [
                    {
                      "tile": 0,
                      "address": 655360,
                      "offset": 0,
                      "bytes": 64
                    },
                    {
                      "tile": 1,
                      "address": 655360,
                      "offset": 0,
                      "bytes": 64
                    },
                    {
                      "tile": 2,
                      "address": 655360,
                      "offset": 0,
                      "bytes": 64
                    },
                    {
                      "tile": 3,
                      "address": 655360,
                      "offset": 0,
                      "bytes": 64
                    }
                  ]
                }
              ],
              "outputs": []
            },
            {
              "name": "run",
              "phases": [
                {
                  "name": "upload x",
                  "kind": "host_to_device",
                  "supersteps": 1,
                  "estimated_cycles": 700
                },
                {
                  "name": "gemm",
                  "kind": "compute",
                  "supersteps": 1,
                  "estimated_cycles": 1234
                },
                {
                  "name": "download y",
                  "kind": "device_to_host",
                  "supersteps": 1,
                  "estimated_cycles": 650
                }
              ],
              "inputs": [
                {
                  "name": "x",
                  "dtype": "f16",
                  "shape": [
                    4,
                    8
                  ],
                  "placements": [
                    {
                      "tile": 0,
                      "address": 589824,
                      "offset": 0,
                      "bytes": 16
                    },
                    {
                      "tile": 1,
                      "address": 589824,
                      "offset": 16,
                      "bytes": 16
                    },
                    {
                      "tile": 2,
                      "address": 589824,
                      "offset": 32,
                      "bytes": 16
                    },
                    {
                      "tile": 3,
                      "address": 589824,
                      "offset": 48,
                      "bytes": 16
                    }
                  ]
                }
              ],
              "outputs": [
                {
                  "name": "y",
                  "dtype": "f16",
                  "shape": [
                    4,
                    8
                  ],
                  "placements": [
                    {
                      "tile": 0,
                      "address": 720896,
                      "offset": 0,
                      "bytes": 16
                    },
                    {
                      "tile": 1,
                      "address": 720896,
                      "offset": 16,
                      "bytes": 16
                    },
                    {
                      "tile": 2,
                      "address": 720896,
                      "offset": 32,
                      "bytes": 16
                    },
                    {
                      "tile": 3,
                      "address": 720896,
                      "offset": 48,
                      "bytes": 16
                    }
                  ]
                }
              ]
            }
          ],
          "config_writes": [
            {
              "register": "SYNC_GROUP",
              "value": 1
            },
            {
              "tile": 3,
              "register": "EXCHANGE_TABLE",
              "value": 520192
            }
          ],
          "report_summary": {
            "compute_bound_cycles": 1,
            "estimated_cycles": 2584
          },
          "tiles": [
            {
              "tile": 0,
              "file": "tiles/0000.img",
              "size": 120,
              "blake3": "a7024a809a28755601c12be6e3fec2dbe634ced0fe507f24b53d12239d4ec15c"
            },
            {
              "tile": 1,
              "file": "tiles/0001.img",
              "size": 120,
              "blake3": "d39fabe772ae136791403abb6d9d9b307e3e81302136fce806183bb02426ed53"
            },
            {
              "tile": 2,
              "file": "tiles/0002.img",
              "size": 120,
              "blake3": "6449d1fea981fbfc37e680ea2ab122405b4be30ed7212ef09f9a636383f4b742"
            },
            {
              "tile": 3,
              "file": "tiles/0003.img",
              "size": 120,
              "blake3": "6269c67325d3ed9864abf04f215b059bdd8a3fb6d9c1e0c8cdaa740ddf4e562d"
            }
          ],
          "members": [
            {
              "name": "report.json",
              "size": 17,
              "blake3": "d6f8288ced7f6cb215826ceca4f74eec8e77454e4b9431666d04ceda4d7f1b3b"
            },
            {
              "name": "symbols/tile0000.txt",
              "size": 13,
              "blake3": "fadda2284148fc262c6e5b501ef9063547ee7a4154e929278229ab05c0d007e9"
            }
          ]
        }
    "#]]
    .assert_eq(std::str::from_utf8(json).unwrap());
}

#[test]
fn write_is_atomic_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.ipupkg");
    let p = common::sample();
    p.write(&path).unwrap();
    assert_eq!(Package::read(&path).unwrap(), p);
    let first = std::fs::read(&path).unwrap();
    p.write(&path).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        first,
        "rewriting gives identical bytes"
    );

    // A package that fails validation leaves the existing file untouched.
    let mut bad = p.clone();
    bad.info.tile_count = 0;
    let err = bad.write(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        "manifest.json: tile_count 0 is outside 1..=1472"
    );
    assert_eq!(std::fs::read(&path).unwrap(), first);
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("model.ipupkg")]);

    let missing = dir.path().join("no/such/dir/model.ipupkg");
    assert!(p
        .write(&missing)
        .unwrap_err()
        .to_string()
        .contains("no/such/dir/model.ipupkg"));
    assert!(Package::read(&missing)
        .unwrap_err()
        .to_string()
        .contains("no/such/dir/model.ipupkg"));
}

/// Writer-side validation: each broken package is refused with a message
/// naming what is wrong.
#[test]
fn invalid_packages_are_refused() {
    let base = common::sample();
    let mut cases: Vec<(&str, Package)> = Vec::new();
    let mut p = base.clone();
    p.info.calls[1].inputs[0].placements[0].tile = 9;
    cases.push(("placement tile", p));
    let mut p = base.clone();
    p.info.calls[1].inputs[0].placements.remove(1);
    cases.push(("uncovered input bytes", p));
    let mut p = base.clone();
    p.info.calls[1].outputs[0].placements[1].offset = 8;
    cases.push(("output placed twice", p));
    let mut p = base.clone();
    p.info.calls[1].outputs[0].placements[3].address = 0xE7FF8;
    cases.push(("placement beyond SRAM", p));
    let mut p = base.clone();
    p.info.calls[1].inputs[0].shape = vec![p.info.calls[1].inputs[0].bytes() as usize / 2];
    p.info.calls[1].inputs[0].transposed = true;
    cases.push(("transposed vector", p));
    let mut p = base.clone();
    p.info.calls[1].inputs[0].stop = 1;
    cases.push(("input at a missing host stop", p));
    let mut p = base.clone();
    p.info.calls[1].host_stops = 1;
    p.info.calls[1].outputs[0].stop = 1;
    cases.push(("output at a host stop", p));
    let mut p = base.clone();
    p.info.calls[1].name = "initialize".into();
    cases.push(("repeated call", p));
    let mut p = base.clone();
    p.info.config_writes[1].tile = Some(4);
    cases.push(("config tile", p));
    let mut p = base.clone();
    p.tiles.get_mut(&2).unwrap().entry_pc = 0x80000;
    cases.push(("entry in region 1", p));
    let mut p = base.clone();
    p.tiles.get_mut(&2).unwrap().segments[1].address = 0x4C020;
    cases.push(("overlapping segments", p));
    let mut p = base.clone();
    p.tiles.get_mut(&1).unwrap().tile = 3;
    cases.push(("image tile mismatch", p));
    let mut p = base.clone();
    p.members.insert("../escape".into(), vec![]);
    cases.push(("member name", p));
    let mut p = base.clone();
    p.members.insert("tiles/extra.img".into(), vec![]);
    cases.push(("reserved name", p));
    let messages: Vec<String> = cases
        .into_iter()
        .map(|(what, p)| format!("{what}: {}", p.to_bytes().unwrap_err()))
        .collect();
    expect![[r#"
        [
            "placement tile: manifest.json: call `run` input `x`: placement 0 is on tile 9, beyond tile_count 4",
            "uncovered input bytes: manifest.json: call `run` input `x`: bytes 16..32 are placed on no tile",
            "output placed twice: manifest.json: call `run` output `y`: bytes 8..16 are placed more than once (an output's bytes must come from one tile)",
            "placement beyond SRAM: manifest.json: call `run` output `y`: placement 3 on tile 3 at 0xe7ff8..+16 lies outside tile SRAM 0x4c000..0xe8000",
            "transposed vector: manifest.json: call `run` input `x`: shape [32] is transposed but has fewer than two dimensions",
            "input at a missing host stop: manifest.json: call `run` input `x`: host stop 1 of a call with 0 host stops",
            "output at a host stop: manifest.json: call `run` output `y`: an output has host stop 1 (outputs are read after the call)",
            "repeated call: manifest.json: call name `initialize` is empty or repeated",
            "config tile: manifest.json: config write 1 (EXCHANGE_TABLE) targets tile 4, beyond tile_count 4",
            "entry in region 1: member `tiles/0002.img`: entry pc 0x80000 is outside region 0, the only region instructions are fetched from",
            "overlapping segments: member `tiles/0002.img`: segment 1 at 0x4c020 starts before the previous segment ends at 0x4c040 (segments must be sorted and disjoint)",
            "image tile mismatch: manifest.json: tiles/0001.img holds the image of tile 3, not tile 1",
            "member name: member `../escape`: names must be relative paths without empty, '.' or '..' components",
            "reserved name: member `tiles/extra.img`: manifest.json, manifest.json.blake3 and tiles/ are reserved for the manifest and tile images",
        ]
    "#]]
    .assert_debug_eq(&messages);
}

/// Reader-side validation on hand-made archives.
#[test]
fn corrupt_archives_are_refused() {
    let good = common::members_of(&common::sample().to_tar().unwrap());
    let find = |name: &str| good.iter().find(|(n, _)| n == name).unwrap().1.clone();
    let manifest = String::from_utf8(find("manifest.json")).unwrap();
    let tile0 = find("tiles/0000.img");
    assert_eq!(good[1].0, "manifest.json.blake3");
    let rest: Vec<(&str, &[u8])> = good[2..]
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    // An archive whose manifest digest member matches `manifest`, so that the
    // reader gets past it to the check under test.
    let with = |manifest: &str, members: &[(&str, &[u8])]| {
        let digest = format!("{}\n", blake3::hash(manifest.as_bytes()).to_hex());
        let mut all: Vec<(&str, &[u8])> = vec![
            ("manifest.json", manifest.as_bytes()),
            ("manifest.json.blake3", digest.as_bytes()),
        ];
        all.extend_from_slice(members);
        common::tar_of(&all)
    };
    let edited = manifest.replace("ipu-compile 0.1.0", "ipu-compile 0.1%0");
    let mut flipped = tile0.clone();
    flipped[30] ^= 1;
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", common::tar_of(&[])),
        (
            "manifest not first",
            common::tar_of(&[rest[0], ("manifest.json", manifest.as_bytes())]),
        ),
        (
            "manifest edited",
            common::tar_of(
                &[
                    &[
                        ("manifest.json", edited.as_bytes()),
                        (good[1].0.as_str(), good[1].1.as_slice()),
                    ],
                    &rest[..],
                ]
                .concat(),
            ),
        ),
        (
            "manifest digest missing",
            common::tar_of(&[&[("manifest.json", manifest.as_bytes())], &rest[..]].concat()),
        ),
        ("bad json", with("{\"format_version\": 2,", &rest)),
        (
            "unknown field",
            with(&manifest.replacen("{", "{\n  \"extra\": 1,", 1), &rest),
        ),
        (
            "future version",
            with(
                &manifest.replace("\"format_version\": 2", "\"format_version\": 3"),
                &rest,
            ),
        ),
        (
            "wrong target",
            with(&manifest.replace("\"ipu21\"", "\"ipu2\""), &rest),
        ),
        (
            "too many tiles",
            with(
                &manifest.replace("\"tile_count\": 4", "\"tile_count\": 1473"),
                &rest,
            ),
        ),
        (
            "bad dtype",
            with(&manifest.replace("\"fp8<-4>\"", "\"bf16\""), &rest),
        ),
        ("missing member", with(&manifest, &rest[1..])),
        (
            "unlisted member",
            with(
                &manifest,
                &[rest.clone(), vec![("notes.txt", b"hi".as_slice())]].concat(),
            ),
        ),
        (
            "duplicate member",
            with(&manifest, &[rest.clone(), vec![rest[0]]].concat()),
        ),
        ("digest mismatch", {
            let mut members = rest.clone();
            let i = members
                .iter()
                .position(|m| m.0 == "tiles/0000.img")
                .unwrap();
            members[i].1 = &flipped;
            with(&manifest, &members)
        }),
        ("size mismatch", {
            let mut members = rest.clone();
            let i = members.iter().position(|m| m.0 == "report.json").unwrap();
            members[i].1 = b"{}";
            with(&manifest, &members)
        }),
        (
            "misnamed tile",
            with(&manifest.replace("tiles/0001.img", "tiles/1.img"), &rest),
        ),
        // Found while writing the package_reader fuzz target (by reading the
        // checks it reaches, then replayed through its manifest mode): the
        // address check added 4 to a u32 and overflowed (a panic).
        (
            "command address at the top",
            with(
                &manifest.replace(
                    "\"command_address\": 311296",
                    "\"command_address\": 4294967292",
                ),
                &rest,
            ),
        ),
        // Found the same way: a run of four billion placements made the
        // reader allocate ~96 GB before any check.
        (
            "huge placement run",
            with(
                &manifest.replacen("\"bytes\": 16", "\"bytes\": 16, \"count\": 4000000000", 1),
                &rest,
            ),
        ),
    ];
    // A symlink member.
    let mut builder = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_path("manifest.json").unwrap();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_link_name("elsewhere").unwrap();
    h.set_size(0);
    h.set_cksum();
    builder.append(&h, std::io::empty()).unwrap();
    cases.push(("symlink", builder.into_inner().unwrap()));
    let messages: Vec<String> = cases
        .iter()
        .map(|(what, tar)| format!("{what}: {}", Package::from_tar(tar).unwrap_err()))
        .collect();
    expect![[r#"
        [
            "empty: the archive is empty (expected manifest.json first)",
            "manifest not first: the first member is `report.json`, expected manifest.json",
            "manifest edited: member `manifest.json`: its blake3 01bc7f679c4407bab5122ec4d6aab125be87d7f737711d005c98409a922b8f5c differs from the digest recorded in manifest.json.blake3, 4914f7d6753e24db85a63e52d5249c610b62ac8f3c6ea0e7502872de68d9bc47",
            "manifest digest missing: member `report.json`: expected manifest.json.blake3 right after manifest.json",
            "bad json: manifest.json: EOF while parsing a value at line 1 column 21",
            "unknown field: manifest.json: unknown field `extra`, expected one of `format_version`, `compiler_version`, `target`, `tile_count`, `model`, `host`, `calls`, `config_writes`, `report_summary`, `tiles`, `members` at line 2 column 9",
            "future version: manifest.json: unsupported package format version 3 (this reader supports 2)",
            "wrong target: manifest.json: unsupported target `ipu2` (expected ipu21)",
            "too many tiles: manifest.json: tile_count 1473 is outside 1..=1472",
            "bad dtype: manifest.json: unknown dtype `bf16` (expected f32, f16, fp8 or fp8<scale> with an integer scale from -128 to 127) at line 23 column 25",
            "missing member: member `report.json` is listed in manifest.json but absent",
            "unlisted member: member `notes.txt` is not listed in manifest.json",
            "duplicate member: member `report.json` appears twice",
            "digest mismatch: member `tiles/0000.img`: blake3 b4a35977b4a638b6fa9254253488140cb1dec7e6620f6af35333e4f09275c5b7 differs from the manifest's a7024a809a28755601c12be6e3fec2dbe634ced0fe507f24b53d12239d4ec15c",
            "size mismatch: member `report.json`: size 2 differs from the manifest's 17",
            "misnamed tile: manifest.json: tile 1 is stored as `tiles/1.img`, expected `tiles/0001.img`",
            "command address at the top: manifest.json: host command address 0xFFFFFFFC is not a 4-aligned word inside tile SRAM (0x4C000..0xE8000)",
            "huge placement run: manifest.json: placement run 0 (tile 0) places 4000000000 x 16 bytes, more than a tile's 638976-byte SRAM at line 114 column 9",
            "symlink: member `manifest.json`: is a Symlink entry, not a regular file",
        ]
    "#]]
    .assert_debug_eq(&messages);
}

#[test]
fn tile_image_errors() {
    let image = common::sample().tiles[&0].clone();
    let bytes = image.encode().unwrap();
    assert_eq!(TileImage::decode(&bytes).unwrap(), image);
    let mutate = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        f(&mut b);
        TileImage::decode(&b).unwrap_err().to_string()
    };
    let messages = vec![
        mutate(&|b| b[0] = b'X'),
        mutate(&|b| b[8] = 2),
        mutate(&|b| b[10] = 1),
        mutate(&|b| b.truncate(30)),
        mutate(&|b| b.push(0)),
        mutate(&|b| {
            let n = b.len();
            b[n - 1] = 0xFF;
        }),
        mutate(&|b| b[16..20].copy_from_slice(&0x4C002u32.to_le_bytes())),
        mutate(&|b| b[16..20].copy_from_slice(&0x4D000u32.to_le_bytes())),
        mutate(&|b| b[24..28].copy_from_slice(&0x1000u32.to_le_bytes())),
        mutate(&|b| b[28..32].copy_from_slice(&0u32.to_le_bytes())),
    ];
    expect![[r#"
        [
            "bad magic (expected \"IPUTIMG\\0\")",
            "unsupported tile image version 2 (this reader supports 1)",
            "reserved flags 0x0001 are set",
            "truncated: the image ends inside segment 0's length at byte 28",
            "1 unexpected bytes after the last segment",
            "segment 1 has non-zero padding",
            "entry pc 0x4c002 is not 4-byte aligned",
            "entry pc 0x4d000 lies in no segment",
            "segment 0 at 0x01000..0x01040 lies outside tile SRAM 0x4c000..0xe8000",
            "truncated: the image ends inside segment 1's 824845084 bytes at byte 40",
        ]
    "#]]
    .assert_debug_eq(&messages);
}

/// A transposed tensor's placements index it with its last two dimensions
/// swapped, each batch element on its own; the host's two orders are
/// inverses, and a transposed flag survives the round trip.
#[test]
fn transposed_orders_are_inverses() {
    let shape = [2, 2, 3];
    let order: Vec<u64> = (0..12).map(|i| transposed_element(i, &shape)).collect();
    assert_eq!(order, [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    for i in 0..12 {
        assert_eq!(natural_element(transposed_element(i, &shape), &shape), i);
    }
    let data: Vec<u8> = (0..24).collect();
    let t = transposed_order(&data, &shape, 2);
    assert_eq!(&t[..6], &[0, 1, 6, 7, 2, 3]);
    assert_eq!(natural_order(&t, &shape, 2), data);
    let mut p = common::sample();
    p.info.calls[0].inputs[0].transposed = true;
    let bytes = p.to_bytes().unwrap();
    assert_eq!(Package::from_bytes(&bytes).unwrap(), p);
}
