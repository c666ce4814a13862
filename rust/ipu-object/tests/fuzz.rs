//! Fuzz-style reader tests: valid objects and images are mutated and
//! truncated many times with a seeded PRNG; the readers must return an error
//! or a value, never panic, and every value they accept must re-serialise to
//! exactly the bytes read (the formats are canonical).

use ipu_isa::{encode_word, parse_instruction, RelocKind};
use ipu_object::*;
use std::collections::BTreeMap;

use ipu_rng::SplitMix64 as Rng;

fn code(lines: &[&str]) -> Vec<u8> {
    lines
        .iter()
        .flat_map(|l| {
            encode_word(&parse_instruction(l).unwrap())
                .unwrap()
                .to_le_bytes()
        })
        .collect()
}

fn sample_object() -> Object {
    let text = code(&["setzi $m0, 0", "ld32 $m1, [$m0+4]", "call 0", "exit"]);
    Object {
        sections: vec![
            Section {
                name: ".text".into(),
                kind: SectionKind::Code,
                align: 4,
                region: RegionConstraint::Standard,
                size: text.len() as u32,
                bytes: text,
            },
            Section {
                name: ".data".into(),
                kind: SectionKind::Data,
                align: 8,
                region: RegionConstraint::Interleaved,
                size: 8,
                bytes: vec![1, 2, 3, 4, 0, 0, 0, 0],
            },
            Section {
                name: ".bss".into(),
                kind: SectionKind::Bss,
                align: 8,
                region: RegionConstraint::Any,
                size: 64,
                bytes: vec![],
            },
        ],
        symbols: vec![
            Symbol {
                name: "main".into(),
                section: Some(0),
                offset: 0,
                binding: Binding::Global,
                kind: SymbolKind::Function,
                size: 16,
            },
            Symbol {
                name: "table".into(),
                section: Some(1),
                offset: 0,
                binding: Binding::Local,
                kind: SymbolKind::Data,
                size: 8,
            },
            Symbol {
                name: "ext".into(),
                section: None,
                offset: 0,
                binding: Binding::Global,
                kind: SymbolKind::NoType,
                size: 0,
            },
        ],
        relocations: vec![
            Relocation {
                section: 0,
                offset: 0,
                kind: RelocKind::Abs20,
                symbol: 1,
                addend: 0,
            },
            Relocation {
                section: 0,
                offset: 8,
                kind: RelocKind::PcRel20,
                symbol: 2,
                addend: 0,
            },
            Relocation {
                section: 1,
                offset: 4,
                kind: RelocKind::Abs32,
                symbol: 0,
                addend: -4,
            },
        ],
    }
}

fn sample_image() -> TileImage {
    let mut symbols = BTreeMap::new();
    symbols.insert(
        "main".to_string(),
        ImageSymbol {
            address: 0x4C000,
            size: 16,
            kind: SymbolKind::Function,
        },
    );
    symbols.insert(
        "buf".to_string(),
        ImageSymbol {
            address: 0x80000,
            size: 8,
            kind: SymbolKind::Data,
        },
    );
    TileImage {
        entry: 0x4C000,
        segments: vec![
            Segment {
                address: 0x4C000,
                bytes: code(&["nop", "nop", "nop", "exit"]),
            },
            Segment {
                address: 0x80000,
                bytes: vec![7; 8],
            },
        ],
        symbols,
    }
}

fn mutate(rng: &mut Rng, good: &[u8]) -> Vec<u8> {
    let mut b = good.to_vec();
    for _ in 0..1 + rng.index(4) {
        match rng.index(5) {
            0 => {
                let i = rng.index(b.len());
                b[i] ^= 1 << rng.index(8);
            }
            1 => {
                let i = rng.index(b.len());
                b[i] = rng.next_u64() as u8;
            }
            2 => b.truncate(rng.index(b.len())),
            3 => {
                let i = rng.index(b.len() + 1);
                b.insert(i, rng.next_u64() as u8);
            }
            _ => {
                // Large length or count fields are the classic crash.
                let i = rng.index(b.len().saturating_sub(4));
                if i + 4 <= b.len() {
                    b[i..i + 4]
                        .copy_from_slice(&(rng.next_u64() as u32 | 0x8000_0000).to_le_bytes());
                }
            }
        }
        if b.is_empty() {
            break;
        }
    }
    b
}

#[test]
fn object_reader_survives_mutation() {
    let obj = sample_object();
    let good = obj.to_bytes().unwrap();
    assert_eq!(Object::from_bytes(&good).unwrap(), obj);
    assert_eq!(
        obj.to_bytes().unwrap(),
        good,
        "serialisation is deterministic"
    );
    let mut rng = Rng(0x1234);
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..20_000 {
        let bad = mutate(&mut rng, &good);
        match Object::from_bytes(&bad) {
            Ok(o) => {
                accepted += 1;
                assert_eq!(
                    o.to_bytes().unwrap(),
                    bad,
                    "accepted bytes must be canonical"
                );
            }
            Err(e) => {
                rejected += 1;
                assert!(e.to_string().starts_with("invalid object"), "{e}");
            }
        }
    }
    // Some mutations (e.g. data bytes) stay valid; most must be caught.
    assert!(
        rejected > 10_000 && accepted > 100,
        "accepted {accepted}, rejected {rejected}"
    );
    for n in 0..good.len() {
        assert!(
            Object::from_bytes(&good[..n]).is_err(),
            "truncation to {n} bytes accepted"
        );
    }
}

#[test]
fn image_reader_survives_mutation() {
    let img = sample_image();
    let good = img.to_bytes().unwrap();
    assert_eq!(TileImage::from_bytes(&good).unwrap(), img);
    let mut rng = Rng(0x5678);
    for _ in 0..20_000 {
        let bad = mutate(&mut rng, &good);
        if let Ok(i) = TileImage::from_bytes(&bad) {
            assert_eq!(i.to_bytes().unwrap(), bad);
        }
    }
    for n in 0..good.len() {
        assert!(TileImage::from_bytes(&good[..n]).is_err());
    }
}

#[test]
fn specific_errors_name_offsets() {
    let good = sample_object().to_bytes().unwrap();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(
        Object::from_bytes(&bad).unwrap_err().to_string(),
        "invalid object at byte 0x0: bad magic (not an ipu21 object)"
    );
    let mut bad = good.clone();
    bad[8] = 9;
    assert_eq!(
        Object::from_bytes(&bad).unwrap_err().to_string(),
        "invalid object at byte 0x8: unsupported version 9 (this toolchain reads 1)"
    );
    assert_eq!(
        Object::from_bytes(&good[..20]).unwrap_err().to_string(),
        "invalid object at byte 0xc: section count = 3 cannot fit in the remaining 4 bytes"
    );
    let mut extra = good.clone();
    extra.push(0);
    assert_eq!(
        Object::from_bytes(&extra).unwrap_err().to_string(),
        format!(
            "invalid object at byte {:#x}: 1 trailing bytes after the end",
            good.len()
        )
    );
    let mut o = sample_object();
    o.relocations[0].offset = 2;
    assert_eq!(o.to_bytes().unwrap_err().to_string(), "invalid object: relocation 0: offset 0x2 is not a 4-aligned word inside section `.text` (16 bytes)");
}
