//! Shared helpers of the simulator tests: program building and chip setup.
#![allow(dead_code)]

use ipu_isa::build::ProgramBuilder;
use ipu_sim::{Chip, ChipConfig, SimError, Stop};

/// Code base (region 0).
pub const CODE: u32 = 0x4C000;
/// Input data (interleaved memory) and the vertex state pointer given to workers.
pub const IN: u32 = 0x80000;
/// Output data (interleaved memory).
pub const OUT: u32 = 0x90000;

/// Random test inputs: the project's one SplitMix64 (ipu-rng). (Not every
/// test binary that includes this module draws random inputs.)
#[allow(unused_imports)]
pub use ipu_rng::SplitMix64 as Rng;

/// Assembles `text` at `CODE`.
pub fn assemble(text: &str) -> Vec<u8> {
    let mut b = ProgramBuilder::new(CODE);
    b.asm_block(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    b.finish().unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// A supervisor that starts `workers` copies of the code at label `worker`
/// (vertex state = `IN`), waits for them and exits, followed by `worker_asm`.
pub fn workers_program(worker_asm: &str, workers: usize) -> String {
    let mut s = format!("setzi $m2, worker\nsetzi $m3, {IN}\n");
    for _ in 0..workers {
        s.push_str("run $m2, $m3\n");
    }
    s.push_str("wsync\nexit\nworker:\n");
    s.push_str(worker_asm);
    s
}

/// Loads `program` and `data` on tile 0 of a one-tile chip and runs it to the end.
pub fn run_one(program: &str, data: &[(u32, Vec<u8>)]) -> Result<Chip, SimError> {
    run_tiles(1, |_| program.to_string(), |_| data.to_vec())
}

/// Runs `program(tile)` with `data(tile)` on every tile of an `n`-tile chip.
pub fn run_tiles(
    n: u32,
    program: impl Fn(u32) -> String,
    data: impl Fn(u32) -> Vec<(u32, Vec<u8>)>,
) -> Result<Chip, SimError> {
    let mut chip = Chip::new(ChipConfig {
        tiles: n,
        step_limit: 1_000_000,
        ..ChipConfig::default()
    });
    for t in 0..n {
        chip.write(t, CODE, &assemble(&program(t))).unwrap();
        for (addr, bytes) in data(t) {
            chip.write(t, addr, &bytes).unwrap();
        }
        chip.set_entry(t, CODE).unwrap();
    }
    assert_eq!(chip.run()?, Stop::Exited);
    Ok(chip)
}

/// Compute cycles of tile `t` in step `s`.
pub fn compute_cycles(chip: &Chip, step: usize, tile: usize) -> u64 {
    chip.steps()[step].tiles[tile].compute_cycles
}

pub fn f16s(v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f64(*x).to_bits().to_le_bytes())
        .collect()
}

pub fn f32s(v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| (*x as f32).to_bits().to_le_bytes())
        .collect()
}

pub fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f16 bits of `x` rounded to nearest even, computed by comparing the
/// neighbours of a candidate in f64. (`half::f16::from_f64` rounds through
/// f32 and so double-rounds some values; this reference does not.)
pub fn f16_rne_bits(x: f64) -> u16 {
    if x.is_nan() {
        return 0x7E00;
    }
    let c = half::f16::from_f64(x).to_bits();
    let mut best: Option<(f64, u16)> = None;
    for cand in [c.wrapping_sub(1), c, c.wrapping_add(1)] {
        let v = half::f16::from_bits(cand);
        // Stay within one sign and skip NaN patterns.
        if v.is_nan() || (cand ^ c) & 0x8000 != 0 {
            continue;
        }
        let d = (v.to_f64() - x).abs();
        best = match best {
            None => Some((d, cand)),
            Some((bd, bc)) if d < bd || (d == bd && cand & 1 == 0 && bc & 1 == 1) => {
                Some((d, cand))
            }
            b => b,
        };
    }
    let (_, bits) = best.unwrap();
    // Overflow: beyond 65504 + half an ulp the result is infinity.
    if x.abs() >= 65520.0 {
        return if x > 0.0 { 0x7C00 } else { 0xFC00 };
    }
    bits
}

/// The f16 value nearest to `x` (ties to even).
pub fn f16_rne(x: f64) -> f64 {
    half::f16::from_bits(f16_rne_bits(x)).to_f64()
}
