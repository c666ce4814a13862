//! The reduce vertex (device/reduce_f32.S) on one simulated tile: P f32
//! partials summed in partial order with one f32 rounding per add, then
//! stored as f16 (OUT=16) or f32 (OUT=32), checked bit for bit against a host
//! emulation of that order. The simulator executes the kernel.

use ipu_isa::numerics::{f16_bits_to_f32, f32_to_f16_bits};
use ipu_sim::{Chip, ChipConfig, Stop};
use std::path::PathBuf;

fn device_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../../device")
}

const SRC: u32 = 0x80000;
const DST: u32 = 0x60000;

fn run(rows: u32, quads: u32, partials: u32, out32: bool, workers: u32, seed: u64) -> u64 {
    let mut x = seed;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0
    };
    // Source rows are padded by 32 bytes and partials by 48 so that strides matter.
    let rs_src = quads * 16 + 32;
    let section = rows * rs_src + 48;
    let ob = if out32 { 4 } else { 2 };
    let rs_dst = quads * 4 * ob + 8;
    let values: Vec<f32> = (0..partials * rows * quads * 4)
        .map(|_| next() as f32)
        .collect();
    let mut src = vec![0u8; (section * partials) as usize];
    for p in 0..partials {
        for r in 0..rows {
            for e in 0..quads * 4 {
                let v = values[((p * rows + r) * quads * 4 + e) as usize];
                let at = (p * section + r * rs_src + e * 4) as usize;
                src[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    // Workers split the rows; each gets its own state.
    let parts: Vec<(u32, u32)> = (0..workers)
        .map(|w| (w * rows / workers, (w + 1) * rows / workers))
        .filter(|(a, b)| b > a)
        .collect();
    let mut sup =
        String::from("        .text\n        .globl main\nmain:\n        setzi $m2, reduce_f32\n");
    let mut data = String::from("        .data\n        .align 4\n");
    for (i, &(r0, r1)) in parts.iter().enumerate() {
        sup.push_str(&format!("        setzi $m3, st{i}\n        run $m2, $m3\n"));
        data.push_str(&format!(
            "st{i}: .word {}, {section}, {partials}, {rs_src}, {}, {rs_dst}, {}, {quads}\n",
            SRC + r0 * rs_src,
            DST + r0 * rs_dst,
            r1 - r0
        ));
    }
    sup.push_str("        wsync\n        exit\n");
    sup.push_str(&data);
    let prog = ipu_asm::assemble_source(
        "sup.S",
        &sup,
        std::path::Path::new("."),
        &ipu_asm::Options::default(),
    )
    .unwrap();
    let mut opts = ipu_asm::Options::default();
    opts.defines
        .insert("OUT".into(), if out32 { 32 } else { 16 });
    let kernel = ipu_asm::assemble_file(&device_dir().join("reduce_f32.S"), &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    let linked = ipu_link::link(
        &[
            ipu_link::Input {
                name: "sup.o".into(),
                object: prog.object,
            },
            ipu_link::Input {
                name: "reduce.o".into(),
                object: kernel.object,
            },
        ],
        &ipu_link::LinkOptions::new("main"),
    )
    .unwrap();
    let mut chip = Chip::new(ChipConfig {
        tiles: 1,
        ..ChipConfig::default()
    });
    for s in &linked.image.segments {
        chip.write(0, s.address, &s.bytes).unwrap();
    }
    chip.write(0, SRC, &src).unwrap();
    chip.set_entry(0, linked.image.entry).unwrap();
    assert_eq!(chip.run().unwrap_or_else(|e| panic!("{e}")), Stop::Exited);
    for r in 0..rows {
        let row = chip.peek(0, DST + r * rs_dst, quads * 4 * ob).unwrap();
        for e in 0..quads * 4 {
            let mut sum = 0f32;
            for p in 0..partials {
                let v = values[((p * rows + r) * quads * 4 + e) as usize];
                sum = if p == 0 { v } else { sum + v };
            }
            let (got, want) = if out32 {
                (
                    u32::from_le_bytes(row[(4 * e) as usize..][..4].try_into().unwrap()),
                    sum.to_bits(),
                )
            } else {
                let h = u16::from_le_bytes(row[(2 * e) as usize..][..2].try_into().unwrap());
                (h as u32, f32_to_f16_bits(sum) as u32)
            };
            assert_eq!(
                got, want,
                "rows={rows} quads={quads} P={partials} out32={out32}: [{r}, {e}] = {got:#x} ({}), expected {want:#x} ({sum})",
                if out32 { f32::from_bits(got) } else { f16_bits_to_f32(got as u16) }
            );
        }
    }
    chip.steps().last().unwrap().tiles[0].compute_cycles
}

#[test]
fn sums_partials_bit_exactly() {
    for &(rows, quads, p) in &[(1, 1, 1), (3, 2, 1), (5, 3, 2), (7, 4, 6), (12, 1, 3)] {
        for out32 in [false, true] {
            for workers in [1, 3, 6] {
                run(
                    rows,
                    quads,
                    p,
                    out32,
                    workers,
                    (rows * 100 + quads * 10 + p) as u64,
                );
            }
        }
    }
}

#[test]
fn cycles_match_the_declared_formula() {
    for &(rows, quads, p) in &[(6, 4, 6), (10, 8, 1), (4, 16, 3)] {
        let cycles = run(rows, quads, p, false, 1, 1);
        let formula = 6 * (8 + rows as u64 * (3 + quads as u64 * (2 * p as u64 + 7)));
        println!("rows={rows} quads={quads} P={p}: simulated {cycles}, .cycles {formula}");
        let ratio = formula as f64 / cycles as f64;
        assert!(
            (0.9..1.15).contains(&ratio),
            "formula {formula} vs simulated {cycles}"
        );
    }
}
