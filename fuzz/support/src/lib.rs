//! The property checks behind the cargo-fuzz targets of `fuzz/` (issue 3),
//! and the samples that the seed corpus writer (`fuzz-seeds`) shares with
//! them.
//!
//! Each `check_*` function takes arbitrary bytes and panics only when a
//! documented invariant of the crate under test is broken: a panic inside
//! the crate on bad input, a reader accepting bytes it cannot write back, an
//! error without its location, a non-deterministic output. Errors returned
//! for bad input are the expected outcome and are never a failure.
//!
//! The functions are plain Rust so that a crash found by libFuzzer can be
//! replayed with the stable toolchain (`cargo run -p ipu-fuzz-support --bin
//! fuzz-seeds -- --replay TARGET FILE`) and then pinned as a regression case
//! in the crate's own stable fuzz test.

use std::collections::BTreeMap;
use std::io::Read;

use ipu_isa::{
    decode_bundle_bytes, decode_word, disassemble, encode_bundle, encode_word, parse_bundle,
    parse_instruction, PAIR_BIT,
};
use ipu_object::{dump_object, KernelMetadata, Object, TileImage};
use ipu_package::Package;

/// The include files of the assembler filetests, served to every assembler
/// input from memory under the names the filetests use (`-I inc` makes
/// `common.inc` visible without the directory).
const FILETEST_INCLUDES: &[(&str, &str)] = &[
    (
        "inc/common.inc",
        include_str!("../../../rust/ipu-asm/tests/filetests/inc/common.inc"),
    ),
    (
        "common.inc",
        include_str!("../../../rust/ipu-asm/tests/filetests/inc/common.inc"),
    ),
    (
        "inc/bad.inc",
        include_str!("../../../rust/ipu-asm/tests/filetests/inc/bad.inc"),
    ),
    (
        "bad.inc",
        include_str!("../../../rust/ipu-asm/tests/filetests/inc/bad.inc"),
    ),
];

/// An assembler input split into its parts.
#[derive(Clone, Debug)]
pub struct AsmInput {
    /// The main source.
    pub main: String,
    /// In-memory include files by the name `.include` uses.
    pub includes: BTreeMap<String, String>,
    /// `-D` definitions from a first line `# runs: -D K=1 ...` (the first
    /// argument set only), as in the assembler filetests.
    pub options: ipu_asm::Options,
}

/// Splits fuzzer bytes into an assembler input: the bytes are decoded as
/// UTF-8 (invalid sequences become U+FFFD, since the assembler's file reader
/// rejects non-UTF-8 before assembling); NUL characters separate the main
/// source from extra include files named `fuzz1.inc`, `fuzz2.inc`, ...
pub fn asm_input(data: &[u8]) -> AsmInput {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let main = parts.next().unwrap_or("").to_string();
    let mut includes: BTreeMap<String, String> = FILETEST_INCLUDES
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    for (i, part) in parts.enumerate() {
        includes.insert(format!("fuzz{}.inc", i + 1), part.to_string());
    }
    let mut options = ipu_asm::Options::default();
    if let Some(runs) = main.lines().next().and_then(|l| l.strip_prefix("# runs:")) {
        let first = runs.split('|').next().unwrap_or("");
        let mut words = first.split_whitespace();
        while let Some(w) = words.next() {
            if w == "-D" {
                if let Some(Ok((k, v))) = words.next().map(ipu_asm::parse_define) {
                    options.defines.insert(k, v);
                }
            }
        }
    }
    AsmInput {
        main,
        includes,
        options,
    }
}

/// The `assembler` target. Properties:
/// - assembling never panics;
/// - an error names `file:line:column: error:`;
/// - an object the assembler returns serialises, reads back equal, and a
///   second assembly of the same input gives the same bytes;
/// - its metadata survives JSON;
/// - linking it from its first entry either fails with an error or gives an
///   image that validates and round-trips through the image format.
pub fn check_assembler(data: &[u8]) {
    let input = asm_input(data);
    let assemble = || {
        ipu_asm::assemble_source_in_memory("fuzz.S", &input.main, &input.includes, &input.options)
    };
    let a = match assemble() {
        Ok(a) => a,
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains(": error: "),
                "error without a location: {text}"
            );
            return;
        }
    };
    let bytes = a
        .object
        .to_bytes()
        .unwrap_or_else(|e| panic!("the assembler built an invalid object: {e}"));
    assert_eq!(
        Object::from_bytes(&bytes).as_ref(),
        Ok(&a.object),
        "assembled object does not read back"
    );
    let again = assemble().expect("the same input assembled once");
    assert_eq!(
        again.object.to_bytes().ok(),
        Some(bytes),
        "not deterministic"
    );
    assert_eq!(
        KernelMetadata::from_json(&a.metadata.to_json())
            .ok()
            .as_ref(),
        Some(&a.metadata),
        "metadata does not survive JSON"
    );
    let _ = dump_object(&a.object);
    if let Some(entry) = a.metadata.entries.first() {
        let inputs = [ipu_link::Input {
            name: "fuzz.o".to_string(),
            object: a.object.clone(),
        }];
        if let Ok(linked) = ipu_link::link(&inputs, &ipu_link::LinkOptions::new(entry)) {
            let image = &linked.image;
            image
                .validate()
                .unwrap_or_else(|e| panic!("linked image does not validate: {e}"));
            let image_bytes = image.to_bytes().expect("a valid image serialises");
            assert_eq!(
                TileImage::from_bytes(&image_bytes).as_ref(),
                Ok(image),
                "linked image does not read back"
            );
        }
    }
}

/// The `object_reader` target: the same bytes go to every reader of
/// ipu-object and to the ipu-isa decoder. Properties:
/// - no reader panics; errors of the binary readers start with `invalid`;
/// - a value a binary reader accepts validates and writes back to exactly
///   the bytes read (the formats are canonical);
/// - accepted metadata JSON survives a second round;
/// - every 32-bit word that decodes re-encodes to itself (pair bit aside)
///   and its disassembly parses back to the same instruction; every bundle
///   that decodes re-encodes to its words and parses back from its text.
pub fn check_object_reader(data: &[u8]) {
    match Object::from_bytes(data) {
        Ok(o) => {
            o.validate()
                .unwrap_or_else(|e| panic!("accepted object does not validate: {e}"));
            assert_eq!(
                o.to_bytes().ok().as_deref(),
                Some(data),
                "object not canonical"
            );
            let _ = dump_object(&o);
        }
        Err(e) => assert!(e.to_string().starts_with("invalid object"), "{e}"),
    }
    match TileImage::from_bytes(data) {
        Ok(i) => {
            i.validate()
                .unwrap_or_else(|e| panic!("accepted image does not validate: {e}"));
            assert_eq!(
                i.to_bytes().ok().as_deref(),
                Some(data),
                "image not canonical"
            );
            for (name, s) in &i.symbols {
                let _ = i.symbolize(s.address);
                let _ = i.bytes_at(s.address, s.size);
                assert_eq!(i.symbol(name), Some(s.address));
            }
            let _ = i.loaded_bytes();
        }
        Err(e) => assert!(e.to_string().starts_with("invalid"), "{e}"),
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(m) = KernelMetadata::from_json(text) {
            assert_eq!(
                KernelMetadata::from_json(&m.to_json()).ok().as_ref(),
                Some(&m),
                "metadata does not survive JSON"
            );
        }
    }
    for chunk in data.chunks_exact(4) {
        let w = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        if let Ok(i) = decode_word(w) {
            assert_eq!(encode_word(&i), Ok(w & !PAIR_BIT), "{i}");
            let text = i.to_string();
            assert_eq!(parse_instruction(&text), Ok(i), "`{text}` from {w:#010x}");
        }
    }
    let mut at = 0;
    while at + 4 <= data.len() {
        match decode_bundle_bytes(&data[at..]) {
            Ok((b, n)) => {
                let words: Vec<u32> = data[at..at + n]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                assert_eq!(encode_bundle(&b).as_ref(), Ok(&words), "{b}");
                assert_eq!(parse_bundle(&b.to_string()).as_ref(), Ok(&b), "{b}");
                at += n;
            }
            Err(_) => at += 4,
        }
    }
    for line in disassemble(data, ipu_arch::REGION0_BASE) {
        let _ = line.to_string();
    }
}

/// The `package_reader` target. The first byte selects what the rest is:
/// - 0: an uncompressed package archive for [`Package::from_tar`];
/// - 1: a manifest: the rest becomes `manifest.json` of an archive whose
///   manifest digest member is computed here and whose other members are
///   those of [`sample_package`], so mutations reach the manifest checks
///   instead of stopping at the digest;
/// - 2: a tile image for `ipu_package::TileImage::decode`.
///
/// Compressed packages are not fuzzed here: zstd is the C library, and a
/// small input can legitimately decompress to the 2 GiB the reader allows.
/// Properties: no panic; an accepted package validates and survives
/// writing and reading again; an accepted image re-encodes to the same bytes.
pub fn check_package_reader(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => check_package_tar(rest),
        1 => check_package_tar(&sample_archive_with_manifest(rest)),
        _ => {
            if let Ok(image) = ipu_package::TileImage::decode(rest) {
                image
                    .validate()
                    .unwrap_or_else(|e| panic!("accepted image does not validate: {e}"));
                assert_eq!(
                    image.encode().ok().as_deref(),
                    Some(rest),
                    "image not canonical"
                );
            }
        }
    }
}

fn check_package_tar(tar: &[u8]) {
    match Package::from_tar(tar) {
        Ok(p) => {
            p.validate()
                .unwrap_or_else(|e| panic!("accepted package does not validate: {e}"));
            let again = p.to_tar().expect("a valid package writes");
            assert_eq!(
                Package::from_tar(&again).as_ref().ok(),
                Some(&p),
                "package does not survive writing and reading"
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// The members of an archive, in order (the archive must be well formed).
pub fn archive_members(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    archive
        .entries()
        .expect("a well-formed archive")
        .map(|e| {
            let mut e = e.expect("a well-formed member");
            let name = e
                .path()
                .expect("a member name")
                .to_string_lossy()
                .into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("member data");
            (name, data)
        })
        .collect()
}

/// A tar archive of the given members in order, headers as the package
/// writer makes them.
pub fn tar_of(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut header = tar::Header::new_ustar();
        // A name tar cannot store is left out: the reader then reports the
        // manifest or a member as missing, which is still a useful input.
        if header.set_path(name).is_err() {
            continue;
        }
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append(&header, bytes.as_slice())
            .expect("writing to memory");
    }
    builder.into_inner().expect("writing to memory")
}

/// The archive of [`sample_package`] with `manifest` as its manifest and a
/// matching manifest digest member.
pub fn sample_archive_with_manifest(manifest: &[u8]) -> Vec<u8> {
    use std::sync::OnceLock;
    static MEMBERS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    let rest = MEMBERS.get_or_init(|| {
        let tar = sample_package()
            .to_tar()
            .expect("the sample package is valid");
        archive_members(&tar).into_iter().skip(2).collect()
    });
    let digest = format!("{}\n", blake3::hash(manifest).to_hex());
    let mut members = vec![
        (ipu_package::MANIFEST.to_string(), manifest.to_vec()),
        (
            ipu_package::MANIFEST_DIGEST.to_string(),
            digest.into_bytes(),
        ),
    ];
    members.extend(rest.iter().cloned());
    tar_of(&members)
}

/// A small but complete package: three tiles, an "initialize" and a "run"
/// call with split, multicast and downloaded tensors, config writes and
/// extra members.
pub fn sample_package() -> Package {
    use ipu_graph::DType;
    use ipu_package::*;
    let tiles: BTreeMap<u32, TileImage> = (0..3u32)
        .map(|tile| {
            let image = TileImage {
                tile,
                entry_pc: 0x4C000,
                segments: vec![
                    Segment {
                        address: 0x4C000,
                        bytes: (0..32u32).map(|i| (i * 5 + tile) as u8).collect(),
                    },
                    Segment {
                        address: 0x80000,
                        bytes: vec![tile as u8; 7],
                    },
                ],
            };
            (tile, image)
        })
        .collect();
    let tensor = |name: &str, dtype, shape: Vec<usize>, address, split: bool| StreamTensor {
        name: name.into(),
        dtype,
        shape,
        placements: (0..3)
            .map(|t| Placement {
                tile: t,
                address,
                offset: if split { t as u64 * 8 } else { 0 },
                bytes: if split { 8 } else { 24 },
            })
            .collect(),
        transposed: false,
    };
    let phase = |name: &str, kind, cycles| CallPhase {
        name: name.into(),
        kind,
        supersteps: 1,
        estimated_cycles: cycles,
    };
    Package {
        info: PackageInfo {
            compiler_version: "ipu-compile 0.1.0".into(),
            tile_count: 3,
            model: "fuzz-sample".into(),
            host: HostInterface {
                command_address: 0x4C000,
            },
            calls: vec![
                StreamingCall {
                    name: "initialize".into(),
                    phases: vec![phase("upload w", PhaseKind::HostToDevice, None)],
                    inputs: vec![tensor(
                        "w",
                        DType::Fp8 { scale_log2: -3 },
                        vec![4, 6],
                        0xA0000,
                        false,
                    )],
                    outputs: vec![],
                },
                StreamingCall {
                    name: "run".into(),
                    phases: vec![
                        phase("upload x", PhaseKind::HostToDevice, Some(70)),
                        phase("compute", PhaseKind::Compute, Some(123)),
                        phase("download y", PhaseKind::DeviceToHost, Some(65)),
                    ],
                    // Two rows per tile at consecutive addresses: stored
                    // as one run with a count and steps.
                    inputs: vec![StreamTensor {
                        name: "x".into(),
                        dtype: DType::F16,
                        shape: vec![6, 4],
                        placements: (0..6)
                            .map(|row| Placement {
                                tile: row / 2,
                                address: 0x90000 + 8 * (row % 2),
                                offset: row as u64 * 8,
                                bytes: 8,
                            })
                            .collect(),
                        transposed: false,
                    }],
                    outputs: vec![tensor("y", DType::F32, vec![3, 2], 0xB0000, true)],
                },
            ],
            config_writes: vec![ConfigWrite {
                tile: Some(1),
                register: "EXCHANGE_TABLE".into(),
                value: 0x7F000,
            }],
            report_summary: BTreeMap::from([("estimated_cycles".into(), 258)]),
        },
        tiles,
        members: BTreeMap::from([("report.json".into(), b"{\"cycles\": 258}\n".to_vec())]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_package_is_valid_and_reaches_the_manifest_checks() {
        let p = sample_package();
        let tar = p.to_tar().unwrap();
        assert_eq!(Package::from_tar(&tar).unwrap(), p);
        // The manifest mode rebuilds the same archive from the manifest.
        let members = archive_members(&tar);
        let rebuilt = sample_archive_with_manifest(&members[0].1);
        assert_eq!(Package::from_tar(&rebuilt).unwrap(), p);
        // A manifest edit is judged by the manifest checks, not the digest.
        let text = String::from_utf8(members[0].1.clone()).unwrap();
        assert!(text.contains("\"address_step\": 8"), "a run with steps");
        let edited = text.replace("\"tile_count\": 3", "\"tile_count\": 2");
        assert_ne!(edited, text);
        let err = Package::from_tar(&sample_archive_with_manifest(edited.as_bytes()))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("digest"), "{err}");
    }

    #[test]
    fn asm_input_splits_includes_and_defines() {
        let input = asm_input(b"# runs: -D K=4 | -D K=5\n.include \"fuzz1.inc\"\0nop\n");
        assert_eq!(input.options.defines.get("K"), Some(&4));
        assert_eq!(input.includes["fuzz1.inc"], "nop\n");
        assert!(input.includes.contains_key("inc/common.inc"));
    }

    #[test]
    fn checks_accept_their_own_seeds() {
        check_assembler(b".text\n.globl f\nf:\nnop\nexit\n");
        check_assembler(b".bogus");
        check_object_reader(&[0; 16]);
        let tar = sample_package().to_tar().unwrap();
        let mut input = vec![0];
        input.extend(&tar);
        check_package_reader(&input);
    }
}
