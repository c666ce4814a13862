//! The GEMM vertex (device/gemm_f16.S) on one simulated tile: random inputs,
//! both accumulation specialisations, edge shapes, every worker split, checked
//! bit for bit against a host emulation of the AMP's documented rounding order
//! (docs/isa.md) and, independently, against ipu-reference's f64 GEMM within
//! the documented tolerance. The simulator executes the kernel's machine code;
//! the host only prepares memory and reads results back.
//!
//! Measured cycles are printed beside the calibration formula
//! `294 + ceil(K/16) * ceil(C/16) * (4M + 160)` and the kernel's own
//! `.cycles` estimate.

use ipu_compiler::kernels::{GemmState, GEMM_STATE_WORDS};
use ipu_isa::numerics::{f16_bits_to_f32, f64_to_f16_bits};
use ipu_sim::{Chip, ChipConfig, Stop};
use std::path::PathBuf;

fn device_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../../device")
}

/// The tests' random inputs: the project's one SplitMix64 (ipu-rng).
use ipu_rng::SplitMix64 as Rng;

/// A random f16 in [-1, 1), as bits.
fn random_f16(rng: &mut Rng) -> u16 {
    f64_to_f16_bits(rng.uniform(-1.0, 1.0))
}

fn f16v(bits: u16) -> f64 {
    f16_bits_to_f32(bits) as f64
}

/// Addresses of the test layout; A, CA and CB start in different 32 KiB
/// interleaved elements and are small enough never to reach the next one.
const A_ADDR: u32 = 0x80000;
const CA_ADDR: u32 = 0x98000;
const CB_ADDR: u32 = 0xB0000;
const B_ADDR: u32 = 0xC8000;

struct Case {
    m: usize,
    k: usize,
    n: usize,
    acc32: bool,
    /// (row groups, column groups); each worker gets one (row group, column group).
    split: (usize, usize),
    /// Accumulate mode (Z = 0): the first K block adds to a running sum
    /// already in the C buffer the vertex reads first.
    accumulate: bool,
}

struct Outcome {
    cycles: u64,
    estimate: u64,
}

/// Splits `n` items into `parts` near-equal contiguous ranges.
fn ranges(n: usize, parts: usize) -> Vec<(usize, usize)> {
    (0..parts)
        .map(|i| (i * n / parts, (i + 1) * n / parts))
        .filter(|(a, b)| b > a)
        .collect()
}

/// The AMP's f16/f32 accumulation emulated in the documented order: per
/// phase, products summed in increasing k, plus the accumulator, plus the
/// partial (for the phase's columns), rounded once.
fn emulate(case: &Case, a: &[u16], b: &[u16], initial: &[f64]) -> Vec<f64> {
    let (m, k, n) = (case.m, case.k, case.n);
    let kp = k.div_ceil(16) * 16;
    let (phases, rows_per_phase, lanes) = if case.acc32 { (8, 2, 2) } else { (4, 4, 4) };
    let round = |v: f64| {
        if case.acc32 {
            v as f32 as f64
        } else {
            f16v(f64_to_f16_bits(v))
        }
    };
    let av = |i: usize, kk: usize| if kk < k { f16v(a[i * k + kk]) } else { 0.0 };
    let bv = |kk: usize, j: usize| if kk < k { f16v(b[kk * n + j]) } else { 0.0 };
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let col = j % 16;
            let mut partial = initial[i * n + j];
            for kb in 0..kp / 16 {
                let mut acc = 0f64;
                for p in 0..phases {
                    let mut s = 0f64;
                    for r in 0..rows_per_phase {
                        let kk = kb * 16 + p * rows_per_phase + r;
                        s += bv(kk, j) * av(i, kk);
                    }
                    s += acc;
                    if (lanes * p..lanes * p + lanes).contains(&col) {
                        s += partial;
                    }
                    acc = round(s);
                }
                partial = acc;
            }
            out[i * n + j] = partial;
        }
    }
    out
}

fn run_case(case: &Case, seed: u64) -> Outcome {
    let (m, k, n) = (case.m, case.k, case.n);
    let (kp, np) = (k.div_ceil(16) * 16, n.div_ceil(16) * 16);
    let (nkb, ncb) = (kp / 16, np / 16);
    let out_bytes = if case.acc32 { 4 } else { 2 };
    let (rs_a, rs_b, rs_c) = (kp * 2, np * 2, np * out_bytes);
    let mut rng = Rng(seed);
    let a: Vec<u16> = (0..m * k).map(|_| random_f16(&mut rng)).collect();
    let b: Vec<u16> = (0..k * n).map(|_| random_f16(&mut rng)).collect();
    // The running sum of earlier K chunks (zero unless accumulating), in
    // the C buffers' element type.
    let initial: Vec<f64> = (0..m * n)
        .map(|_| {
            let v = if case.accumulate {
                f16v(random_f16(&mut rng))
            } else {
                0.0
            };
            if case.acc32 {
                v as f32 as f64
            } else {
                v
            }
        })
        .collect();

    // Row groups each get two junk rows before them in the C buffers; row i
    // of group g is at row i + 2 (g + 1) of the buffer, after a 16-byte zero word.
    let row_groups = ranges(m, case.split.0);
    let col_groups = ranges(ncb, case.split.1);
    let c_row = |group: usize, row: usize| 16 + (row + 2 * (group + 1)) * rs_c;
    let c_rows_total = m + 2 * row_groups.len() + 2;
    let mut states = Vec::new();
    for (g, &(r0, r1)) in row_groups.iter().enumerate() {
        for &(c0, c1) in &col_groups {
            let col = c0 * 16 * out_bytes;
            let (ca, cb) = (CA_ADDR, CB_ADDR);
            // The last K block must write CA: K block 0 writes CA when NKB is odd.
            let (first, second) = if nkb % 2 == 1 { (ca, cb) } else { (cb, ca) };
            states.push(GemmState {
                a: A_ADDR + (r0 * rs_a) as u32,
                rs_a: rs_a as u32,
                b: B_ADDR + (c0 * 32) as u32,
                rs_b: rs_b as u32,
                c_first: first + (c_row(g, r0) + col) as u32,
                c_second: second + (c_row(g, r0) + col) as u32,
                rs_c: rs_c as u32,
                zero: if case.accumulate { 0 } else { second },
                m: (r1 - r0) as u32,
                nkb: nkb as u32,
                ncb: (c1 - c0) as u32,
            });
        }
    }
    assert!(states.len() <= 6);
    assert!(
        ((m + 2) * rs_a) as u32 <= CA_ADDR - A_ADDR,
        "A too large for the test layout"
    );
    assert!(
        (c_rows_total * rs_c + 16) as u32 <= CB_ADDR - CA_ADDR,
        "C too large for the test layout"
    );

    // Supervisor: run every vertex, wait, exit; the states follow as data.
    let mut sup =
        String::from("        .text\n        .globl main\nmain:\n        setzi $m2, gemm_f16\n");
    for i in 0..states.len() {
        sup.push_str(&format!(
            "        setzi $m3, state{i}\n        run $m2, $m3\n"
        ));
    }
    sup.push_str("        wsync\n        exit\n        .data\n        .align 4\n");
    for (i, s) in states.iter().enumerate() {
        let words: Vec<String> = s.words().iter().map(|w| format!("{w:#x}")).collect();
        assert_eq!(words.len(), GEMM_STATE_WORDS);
        sup.push_str(&format!("state{i}: .word {}\n", words.join(", ")));
    }
    let sup_obj = ipu_asm::assemble_source(
        "supervisor.S",
        &sup,
        std::path::Path::new("."),
        &ipu_asm::Options::default(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{sup}"));
    let mut opts = ipu_asm::Options::default();
    opts.defines
        .insert("ACC".into(), if case.acc32 { 32 } else { 16 });
    let kernel = ipu_asm::assemble_file(&device_dir().join("gemm_f16.S"), &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    let linked = ipu_link::link(
        &[
            ipu_link::Input {
                name: "supervisor.o".into(),
                object: sup_obj.object,
            },
            ipu_link::Input {
                name: "gemm_f16.o".into(),
                object: kernel.object,
            },
        ],
        &ipu_link::LinkOptions::new("main"),
    )
    .unwrap_or_else(|e| panic!("{e}"));

    let mut chip = Chip::new(ChipConfig {
        tiles: 1,
        step_limit: 50_000_000,
        ..ChipConfig::default()
    });
    for seg in &linked.image.segments {
        chip.write(0, seg.address, &seg.bytes).unwrap();
    }
    // A row-major with K padded by zeros, plus two junk rows; B row-major padded.
    let mut a_mem = vec![0u8; (m + 2) * rs_a];
    for i in 0..m {
        for kk in 0..k {
            a_mem[i * rs_a + 2 * kk..][..2].copy_from_slice(&a[i * k + kk].to_le_bytes());
        }
    }
    let mut b_mem = vec![0u8; kp * rs_b];
    for kk in 0..k {
        for j in 0..n {
            b_mem[kk * rs_b + 2 * j..][..2].copy_from_slice(&b[kk * n + j].to_le_bytes());
        }
    }
    // The C buffers start with garbage (NaN patterns) except the zero words:
    // the kernel must neither read stale partials nor depend on zeroed memory.
    let garbage = vec![0xFFu8; c_rows_total * rs_c + 16];
    chip.write(0, A_ADDR, &a_mem).unwrap();
    chip.write(0, B_ADDR, &b_mem).unwrap();
    chip.write(0, CA_ADDR, &garbage).unwrap();
    chip.write(0, CB_ADDR, &garbage).unwrap();
    chip.write(0, CA_ADDR, &[0u8; 8]).unwrap();
    chip.write(0, CB_ADDR, &[0u8; 8]).unwrap();
    if case.accumulate {
        // The running sum is in the buffer K block 0 reads: the one the
        // final block does not write (CB when NKB is odd, else CA).
        let sum_addr = if nkb % 2 == 1 { CB_ADDR } else { CA_ADDR };
        for (g, &(r0, r1)) in row_groups.iter().enumerate() {
            for i in r0..r1 {
                let mut row = Vec::new();
                for j in 0..n {
                    let v = initial[i * n + j];
                    if case.acc32 {
                        row.extend_from_slice(&(v as f32).to_le_bytes());
                    } else {
                        row.extend_from_slice(&f64_to_f16_bits(v).to_le_bytes());
                    }
                }
                chip.write(0, sum_addr + c_row(g, i) as u32, &row).unwrap();
            }
        }
    }
    chip.set_entry(0, linked.image.entry).unwrap();
    let stop = chip
        .run()
        .unwrap_or_else(|e| panic!("m={m} k={k} n={n}: {e}"));
    assert_eq!(stop, Stop::Exited);

    let expect = emulate(case, &a, &b, &initial);
    let mut got = vec![0f64; m * n];
    for (g, &(r0, r1)) in row_groups.iter().enumerate() {
        for i in r0..r1 {
            let row = chip
                .peek(0, CA_ADDR + c_row(g, i) as u32, (n * out_bytes) as u32)
                .unwrap();
            for j in 0..n {
                got[i * n + j] = if case.acc32 {
                    f32::from_le_bytes(row[4 * j..4 * j + 4].try_into().unwrap()) as f64
                } else {
                    f16v(u16::from_le_bytes([row[2 * j], row[2 * j + 1]]))
                };
            }
        }
    }
    for i in 0..m {
        for j in 0..n {
            let (d, e) = (got[i * n + j], expect[i * n + j]);
            assert!(
                d.to_bits() == e.to_bits() || (d == 0.0 && e == 0.0),
                "m={m} k={k} n={n} acc32={} split={:?}: C[{i}, {j}] = {d}, emulated AMP order gives {e}",
                case.acc32,
                case.split
            );
        }
    }
    // Independently: the f64 reference within the documented tolerance.
    let reference: Vec<f64> = (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            (0..k)
                .map(|kk| f16v(a[i * k + kk]) * f16v(b[kk * n + j]))
                .sum::<f64>()
                + initial[idx]
        })
        .collect();
    let dtype = if case.acc32 {
        ipu_graph::DType::F32
    } else {
        ipu_graph::DType::F16
    };
    let tol = ipu_reference::Tolerance::for_output(dtype, k as u64, &reference);
    for (idx, (&d, &r)) in got.iter().zip(&reference).enumerate() {
        assert!(
            tol.accepts(d, r),
            "C[{}, {}] = {d}, reference {r}, tolerance {tol:?}",
            idx / n,
            idx % n
        );
    }
    let cycles = chip.steps().last().unwrap().tiles[0].compute_cycles;
    let per_worker = |s: &GemmState| {
        let per_row = if case.acc32 { 8 } else { 4 };
        let (per_block, fixed) = if case.acc32 { (15, 47) } else { (14, 43) };
        6 * (22 + s.ncb as u64 * (per_block + s.nkb as u64 * (per_row * s.m as u64 + fixed)))
    };
    let estimate = states.iter().map(per_worker).max().unwrap();
    Outcome { cycles, estimate }
}

fn check(m: usize, k: usize, n: usize, acc32: bool, split: (usize, usize)) -> Outcome {
    run_case(
        &Case {
            m,
            k,
            n,
            acc32,
            split,
            accumulate: false,
        },
        (m * 1000003 + k * 1009 + n) as u64,
    )
}

#[test]
fn f16_edge_shapes_every_split() {
    for &(m, k, n) in &[
        (1usize, 16usize, 16usize),
        (1, 1, 1),
        (7, 5, 3),
        (33, 48, 20),
        (17, 100, 37),
        (6, 16, 96),
    ] {
        for split in [(1, 1), (6, 1), (3, 2), (2, 3), (1, 6)] {
            let ncb = n.div_ceil(16usize);
            if split.1 > ncb || split.0 > m {
                continue;
            }
            check(m, k, n, false, split);
        }
    }
}

#[test]
fn f32_accumulation_edge_shapes() {
    for &(m, k, n) in &[
        (1usize, 16usize, 16usize),
        (7, 5, 3),
        (33, 48, 20),
        (13, 70, 40),
    ] {
        for split in [(1, 1), (3, 2), (6, 1)] {
            if split.1 > n.div_ceil(16usize) || split.0 > m {
                continue;
            }
            check(m, k, n, true, split);
        }
    }
}

#[test]
fn accumulate_mode_adds_to_the_running_sum() {
    // Z = 0: K block 0 reads the running sum instead of the zero word, for
    // both accumulations, odd and even K block counts and several splits.
    for &(m, k, n, acc32) in &[
        (7usize, 5usize, 3usize, false),
        (33, 48, 20, false),
        (17, 32, 37, true),
        (13, 70, 40, true),
    ] {
        for split in [(1, 1), (3, 2), (6, 1)] {
            if split.1 > n.div_ceil(16usize) || split.0 > m {
                continue;
            }
            run_case(
                &Case {
                    m,
                    k,
                    n,
                    acc32,
                    split,
                    accumulate: true,
                },
                (m * 7919 + k * 31 + n) as u64,
            );
        }
    }
}

#[test]
fn calibration_shapes_cycles() {
    // One tile, six workers over column blocks: the calibration formula's shapes.
    println!(
        "{:>5} {:>5} {:>5} {:>10} {:>12} {:>12} {:>8}",
        "M", "K", "C", "simulated", "estimate", "calibration", "MAC/cyc"
    );
    for &(m, k, c) in &[(32, 64, 96), (64, 128, 96), (96, 64, 192), (128, 128, 96)] {
        let out = check(m, k, c, false, (1, 6));
        let cal = ipu_arch::calibration::gemm_f16_cycles(m as u64, k as u64, c as u64);
        let macs = (m * k * c) as f64 / out.cycles as f64;
        println!(
            "{m:>5} {k:>5} {c:>5} {:>10} {:>12} {cal:>12} {macs:>8.1}",
            out.cycles, out.estimate
        );
        assert!(
            macs <= ipu_arch::AMP_MACS_F16_F16 as f64,
            "faster than the AMP peak"
        );
        // The vertex's own estimate is within 10% of what the simulator measures.
        let ratio = out.estimate as f64 / out.cycles as f64;
        assert!(
            (0.9..1.1).contains(&ratio),
            "estimate {} vs simulated {}",
            out.estimate,
            out.cycles
        );
    }
}
