//! The one-tile kernel harness shared by kernel_layernorm, kernel_cast and
//! kernel_fill_copy: assembles device kernels and a supervisor that runs
//! groups of vertices, links them, loads memory into one simulated tile and
//! runs it to its exit. The simulator executes the kernels' machine code;
//! the host only prepares memory and reads results back.
#![allow(dead_code)]

use ipu_sim::{Chip, ChipConfig, Stop};
use std::path::PathBuf;

pub fn device_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../../device")
}

/// The tests' random inputs: the project's one SplitMix64 (ipu-rng).
pub use ipu_rng::SplitMix64 as Rng;

/// Splits `n` items into at most `parts` near-equal contiguous ranges whose
/// starts are multiples of `align` (empty ranges dropped).
pub fn ranges_aligned(n: usize, parts: usize, align: usize) -> Vec<(usize, usize)> {
    let units = n.div_ceil(align);
    (0..parts)
        .map(|i| {
            (
                (i * units / parts) * align,
                ((i + 1) * units / parts * align).min(n),
            )
        })
        .filter(|(a, b)| b > a)
        .collect()
}

/// One vertex launch: the kernel entry and its state words.
pub struct Launch {
    pub entry: String,
    pub state: Vec<u32>,
}

/// A kernel source with its `-D` definitions.
pub struct Kernel<'a> {
    pub file: &'a str,
    pub defines: &'a [(&'a str, i64)],
}

/// Assembles `kernels` and a supervisor that runs each group of launches
/// concurrently (one `run` per launch, then `wsync`), links them, loads
/// `memory` and runs one tile to its exit. Returns the chip (for reading
/// results) and the tile's compute cycles.
pub fn simulate(
    kernels: &[Kernel],
    groups: &[Vec<Launch>],
    memory: &[(u32, Vec<u8>)],
) -> (Chip, u64) {
    let mut sup = String::from("        .text\n        .globl main\nmain:\n");
    let mut data = String::from("        .data\n        .align 4\n");
    let mut n = 0;
    for group in groups {
        assert!(group.len() <= 6, "at most six workers");
        for launch in group {
            sup.push_str(&format!(
                "        setzi $m2, {}\n        setzi $m3, st{n}\n        run $m2, $m3\n",
                launch.entry
            ));
            let words: Vec<String> = launch.state.iter().map(|w| w.to_string()).collect();
            data.push_str(&format!("st{n}: .word {}\n", words.join(", ")));
            n += 1;
        }
        sup.push_str("        wsync\n");
    }
    sup.push_str("        exit\n");
    sup.push_str(&data);
    let prog = ipu_asm::assemble_source(
        "sup.S",
        &sup,
        std::path::Path::new("."),
        &ipu_asm::Options::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut inputs = vec![ipu_link::Input {
        name: "sup.o".into(),
        object: prog.object,
    }];
    for kernel in kernels {
        let assembly = assemble(kernel.file, kernel.defines).unwrap_or_else(|e| panic!("{e}"));
        inputs.push(ipu_link::Input {
            name: format!("{}.o", kernel.file),
            object: assembly.object,
        });
    }
    let linked = ipu_link::link(&inputs, &ipu_link::LinkOptions::new("main"))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut chip = Chip::new(ChipConfig {
        tiles: 1,
        ..ChipConfig::default()
    });
    for s in &linked.image.segments {
        chip.write(0, s.address, &s.bytes).unwrap();
    }
    for (addr, bytes) in memory {
        chip.write(0, *addr, bytes).unwrap();
    }
    chip.set_entry(0, linked.image.entry).unwrap();
    assert_eq!(chip.run().unwrap_or_else(|e| panic!("{e}")), Stop::Exited);
    let cycles = chip.steps().last().unwrap().tiles[0].compute_cycles;
    (chip, cycles)
}

/// Assembles one device source with `-D` definitions.
pub fn assemble(
    file: &str,
    defines: &[(&str, i64)],
) -> Result<ipu_asm::Assembly, ipu_asm::AsmError> {
    let mut opts = ipu_asm::Options::default();
    for (k, v) in defines {
        opts.defines.insert((*k).into(), *v);
    }
    ipu_asm::assemble_file(&device_dir().join(file), &opts)
}

/// The kernel's declared `.cycles` formula (from the assembled object's
/// metadata) evaluated by the compiler's own evaluator, so that the tests
/// compare the simulator with what the cost model will use.
pub fn declared_cycles(file: &str, defines: &[(&str, i64)], vars: &[(&str, u64)]) -> u64 {
    let assembly = assemble(file, defines).unwrap_or_else(|e| panic!("{e}"));
    let formula = assembly
        .metadata
        .cycles
        .unwrap_or_else(|| panic!("{file} declares no .cycles"));
    let vars: std::collections::BTreeMap<&str, i64> =
        vars.iter().map(|&(k, v)| (k, v as i64)).collect();
    ipu_compiler::formula::evaluate(&formula, &vars)
        .unwrap_or_else(|e| panic!("{file}: .cycles {formula:?}: {e}")) as u64
}

pub fn f16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn read_f16(chip: &Chip, addr: u32, n: usize) -> Vec<u16> {
    chip.peek(0, addr, 2 * n as u32)
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

pub fn read_u32(chip: &Chip, addr: u32, n: usize) -> Vec<u32> {
    chip.peek(0, addr, 4 * n as u32)
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
