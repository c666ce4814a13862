//! The f32 and fp8 GEMM vertices (device/gemm_f32.S, device/gemm_fp8.S) on
//! one simulated tile: random inputs from a seeded PRNG, edge shapes (M not
//! a multiple of 4, K not a multiple of the K block, several column blocks),
//! the ACCUMULATE mode (Z = 0) on non-zero partials, the fp8 product scale
//! (including values outside the kernel's table, whose clamp must be exact)
//! and several workers with different shares.
//!
//! Every result is checked bit for bit against a host emulation of the AMP's
//! documented rounding order (docs/isa.md: per phase, products summed in
//! increasing k in f64, plus the accumulator, plus the partial, rounded once
//! to the accumulation type) and, independently, against the f64 product
//! sum within the worst-case error bound of recursive summation (fp8
//! operands are exact values, so the reference is their exact product sum).
//! The simulator executes the kernels' machine code; the host only prepares
//! memory and reads results back.
//!
//! Measured cycles are printed beside the MAC bound (MACs / the AMP rate of
//! the mode) and the kernel's `.cycles` estimate plus the compiler's launch
//! cost, which may not under-estimate the simulator by more than 3%.

mod kernel_common;

use ipu_isa::numerics::{f16_bits_to_f32, f64_to_f16_bits, f64_to_f8, f8_to_f64};
use kernel_common::*;

/// Addresses of the test layout; A, CA and CB start in different 32 KiB
/// interleaved elements and are small enough never to reach the next one.
const A_ADDR: u32 = 0x80000;
const CA_ADDR: u32 = 0x98000;
const CB_ADDR: u32 = 0xB0000;
const B_ADDR: u32 = 0xC8000;
/// Bytes after each C buffer that no vertex may write, and their value.
const GUARD: usize = 64;
const POISON: u8 = 0xA5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    F32,
    Fp8,
}

impl Kind {
    fn file(self) -> &'static str {
        match self {
            Kind::F32 => "gemm_f32.S",
            Kind::Fp8 => "gemm_fp8.S",
        }
    }
    fn entry(self) -> &'static str {
        match self {
            Kind::F32 => "gemm_f32",
            Kind::Fp8 => "gemm_fp8",
        }
    }
    /// K rows per weight block.
    fn k_block(self) -> usize {
        match self {
            Kind::F32 => 16,
            Kind::Fp8 => 32,
        }
    }
    /// Bytes of one A or B element.
    fn in_bytes(self) -> usize {
        match self {
            Kind::F32 => 4,
            Kind::Fp8 => 1,
        }
    }
    /// Bytes of one C element.
    fn out_bytes(self) -> usize {
        match self {
            Kind::F32 => 4,
            Kind::Fp8 => 2,
        }
    }
    /// The AMP's MACs per tile cycle in this mode (docs/machine-model.md).
    fn macs_per_cycle(self) -> u32 {
        match self {
            Kind::F32 => ipu_arch::AMP_MACS_F32,
            Kind::Fp8 => ipu_arch::AMP_MACS_FP8_F16,
        }
    }
    /// (phases per row, k rows per phase, output lanes per phase).
    fn amp_shape(self) -> (usize, usize, usize) {
        match self {
            Kind::F32 => (16, 1, 1),
            Kind::Fp8 => (4, 8, 4),
        }
    }
    /// Rounds an exact (f64) phase sum to the accumulation type.
    fn round(self, v: f64) -> f64 {
        match self {
            Kind::F32 => v as f32 as f64,
            Kind::Fp8 => f16_bits_to_f32(f64_to_f16_bits(v)) as f64,
        }
    }
    /// The output element's bits (f32, or f16 in the low half).
    fn out_bits(self, v: f64) -> u32 {
        match self {
            Kind::F32 => ipu_isa::numerics::canonical_f32_bits(v as f32),
            Kind::Fp8 => f64_to_f16_bits(v) as u32,
        }
    }
    fn out_value(self, bits: u32) -> f64 {
        match self {
            Kind::F32 => f32::from_bits(bits) as f64,
            Kind::Fp8 => f16_bits_to_f32(bits as u16) as f64,
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    kind: Kind,
    m: usize,
    k: usize,
    n: usize,
    /// (row groups, column groups); each worker gets one (row group, column group).
    split: (usize, usize),
    /// ACCUMULATE mode: Z = 0 and the partials of K block 0 are C0.
    accumulate: bool,
    /// The fp8 product scale exponent (the state word SCALE); 0 for f32.
    scale: i32,
    /// Extra 8-byte units after every A and C row and 16-byte units after
    /// every B row (strides wider than the padded data).
    pad: usize,
}

impl Case {
    fn new(kind: Kind, m: usize, k: usize, n: usize, split: (usize, usize)) -> Case {
        Case {
            kind,
            m,
            k,
            n,
            split,
            accumulate: false,
            scale: if kind == Kind::Fp8 { -7 } else { 0 },
            pad: 0,
        }
    }
    fn label(&self) -> String {
        format!(
            "{:?} m={} k={} n={} split={:?} accumulate={} scale={} pad={}",
            self.kind, self.m, self.k, self.n, self.split, self.accumulate, self.scale, self.pad
        )
    }
}

/// The inputs of one case: operands as raw element bits and their values.
struct Inputs {
    /// A as element bits (f32 bits, or an F143 byte), row-major [m, k].
    a: Vec<u32>,
    /// B as element bits, row-major [k, n].
    b: Vec<u32>,
    /// C0 (ACCUMULATE mode) as output element bits, row-major [m, n].
    c0: Vec<u32>,
}

impl Inputs {
    fn random(case: &Case, seed: u64) -> Inputs {
        let mut rng = Rng(seed);
        let mut operand = |count: usize, fp8_scale: i32| -> Vec<u32> {
            (0..count)
                .map(|_| {
                    let u = rng.uniform(-1.0, 1.0);
                    match case.kind {
                        Kind::F32 => (u as f32).to_bits(),
                        // F143 codes of u * 2^-fp8_scale: full use of the
                        // mantissa and some subnormals near zero.
                        Kind::Fp8 => f64_to_f8(u, fp8_scale, None) as u32,
                    }
                })
                .collect()
        };
        let a = operand(case.m * case.k, -4);
        let b = operand(case.k * case.n, -3);
        let c0 = if case.accumulate {
            (0..case.m * case.n)
                .map(|_| case.kind.out_bits(rng.uniform(-2.0, 2.0)))
                .collect()
        } else {
            Vec::new()
        };
        Inputs { a, b, c0 }
    }

    /// The value of an operand element (without the fp8 product scale).
    fn value(kind: Kind, bits: u32) -> f64 {
        match kind {
            Kind::F32 => f32::from_bits(bits) as f64,
            Kind::Fp8 => f8_to_f64(bits as u8, 0),
        }
    }
}

/// The AMP emulated in the documented order: per phase, the products summed
/// in increasing k (x scaled by 2^scale in fp8 mode) in f64, plus the
/// accumulator, plus the partial for the phase's columns, rounded once. The
/// partials of K block 0 are C0 (ACCUMULATE mode) or the zero word.
fn emulate(case: &Case, inp: &Inputs) -> Vec<u32> {
    let (m, k, n, kind) = (case.m, case.k, case.n, case.kind);
    let kb_rows = kind.k_block();
    let nkb = k.div_ceil(kb_rows);
    let (phases, rows_per_phase, lanes) = kind.amp_shape();
    let scale = 2f64.powi(case.scale);
    let av = |i: usize, kk: usize| {
        if kk < k {
            Inputs::value(kind, inp.a[i * k + kk]) * if kind == Kind::Fp8 { scale } else { 1.0 }
        } else {
            0.0
        }
    };
    let bv = |kk: usize, j: usize| {
        if kk < k {
            Inputs::value(kind, inp.b[kk * n + j])
        } else {
            0.0
        }
    };
    let mut out = vec![0u32; m * n];
    for i in 0..m {
        for j in 0..n {
            let col = j % 16;
            let mut partial = if case.accumulate {
                kind.out_value(inp.c0[i * n + j])
            } else {
                0.0
            };
            for kb in 0..nkb {
                let mut acc = 0f64;
                for p in 0..phases {
                    let mut s = 0f64;
                    for r in 0..rows_per_phase {
                        let kk = kb * kb_rows + p * rows_per_phase + r;
                        s += bv(kk, j) * av(i, kk);
                    }
                    s += acc;
                    if (lanes * p..lanes * p + lanes).contains(&col) {
                        s += partial;
                    }
                    acc = kind.round(s);
                }
                partial = acc;
            }
            out[i * n + j] = kind.out_bits(partial);
        }
    }
    out
}

struct Outcome {
    cycles: u64,
    /// The largest `.cycles` of the case's vertices (the tile waits for the slowest).
    estimate: u64,
    macs: u64,
}

fn run_case(case: &Case, seed: u64) -> Outcome {
    let (m, k, n, kind) = (case.m, case.k, case.n, case.kind);
    let kb_rows = kind.k_block();
    let (kp, np) = (k.div_ceil(kb_rows) * kb_rows, n.div_ceil(16) * 16);
    let (nkb, ncb) = (kp / kb_rows, np / 16);
    let (ib, ob) = (kind.in_bytes(), kind.out_bytes());
    let rs_a = kp * ib + 8 * case.pad;
    let rs_b = np * ib + 16 * case.pad;
    let rs_c = np * ob + 8 * case.pad;
    let inp = Inputs::random(case, seed);

    // Row groups each get two junk rows before them in the C buffers; row i
    // of group g is at row i + 2 (g + 1) of the buffer, after a 16-byte
    // header whose first 8 bytes are the zero word.
    let row_groups = ranges_aligned(m, case.split.0, 1);
    let col_groups = ranges_aligned(ncb, case.split.1, 1);
    let c_row = |group: usize, row: usize| 16 + (row + 2 * (group + 1)) * rs_c;
    let c_rows_total = m + 2 * row_groups.len() + 2;
    // The last K block must write CA_ADDR: K block 0 writes the state's CA,
    // and the result is in the state's CA when NKB is odd, else in its CB.
    let (first, second) = if nkb % 2 == 1 {
        (CA_ADDR, CB_ADDR)
    } else {
        (CB_ADDR, CA_ADDR)
    };
    let mut launches = Vec::new();
    let mut estimate = 0;
    for (g, &(r0, r1)) in row_groups.iter().enumerate() {
        for &(c0, c1) in &col_groups {
            let col = c0 * 16 * ob;
            let mut state = vec![
                A_ADDR + (r0 * rs_a) as u32,
                rs_a as u32,
                B_ADDR + (c0 * 16 * ib) as u32,
                rs_b as u32,
                first + (c_row(g, r0) + col) as u32,
                second + (c_row(g, r0) + col) as u32,
                rs_c as u32,
                if case.accumulate { 0 } else { second },
                (r1 - r0) as u32,
                nkb as u32,
                (c1 - c0) as u32,
            ];
            if kind == Kind::Fp8 {
                state.push(case.scale as u32);
            }
            let vars = [
                ("M", (r1 - r0) as u64),
                ("NKB", nkb as u64),
                ("NCB", (c1 - c0) as u64),
            ];
            estimate = estimate.max(declared_cycles(kind.file(), &[], &vars));
            launches.push(Launch {
                entry: kind.entry().into(),
                state,
            });
        }
    }
    assert!(
        launches.len() <= 6,
        "{}: more than six vertices",
        case.label()
    );
    assert!(
        ((m + 2) * rs_a) as u32 <= CA_ADDR - A_ADDR,
        "A too large for the test layout"
    );
    assert!(
        (c_rows_total * rs_c + 16 + GUARD) as u32 <= CB_ADDR - CA_ADDR,
        "C too large for the test layout"
    );
    assert!((kp * rs_b) as u32 <= 0xE8000 - B_ADDR, "B too large");

    // A and B row-major with K padded by zeros (and A's two spare rows).
    let mut a_mem = vec![0u8; (m + 2) * rs_a];
    for i in 0..m {
        for kk in 0..k {
            let bits = inp.a[i * k + kk].to_le_bytes();
            a_mem[i * rs_a + ib * kk..][..ib].copy_from_slice(&bits[..ib]);
        }
    }
    let mut b_mem = vec![0u8; kp * rs_b];
    for kk in 0..k {
        for j in 0..n {
            let bits = inp.b[kk * n + j].to_le_bytes();
            b_mem[kk * rs_b + ib * j..][..ib].copy_from_slice(&bits[..ib]);
        }
    }
    // The C buffers start with garbage (NaN patterns) except the zero words:
    // the kernel must neither read stale partials nor depend on zeroed memory.
    // A guard of POISON bytes follows each C buffer.
    let c_bytes = c_rows_total * rs_c + 16;
    let mut garbage = vec![0xFFu8; c_bytes + GUARD];
    garbage[c_bytes..].fill(POISON);
    let mut memory = vec![
        (A_ADDR, a_mem),
        (B_ADDR, b_mem),
        (CA_ADDR, garbage.clone()),
        (CB_ADDR, garbage),
        (CA_ADDR, vec![0u8; 8]),
        (CB_ADDR, vec![0u8; 8]),
    ];
    if case.accumulate {
        // C0 goes where K block 0 reads its partials: the state's CB.
        for (g, &(r0, r1)) in row_groups.iter().enumerate() {
            for i in r0..r1 {
                let row: Vec<u8> = (0..n)
                    .flat_map(|j| inp.c0[i * n + j].to_le_bytes()[..ob].to_vec())
                    .collect();
                memory.push((second + c_row(g, i) as u32, row));
            }
        }
    }
    let (chip, cycles) = simulate(
        &[Kernel {
            file: kind.file(),
            defines: &[],
        }],
        &[launches],
        &memory,
    );

    // Nothing outside the vertices' rows and column blocks (and their junk
    // rows) is written: the zero words, the stride padding of every data
    // row and the guards after the buffers keep their bytes.
    for buffer in [CA_ADDR, CB_ADDR] {
        let bytes = chip.peek(0, buffer, (c_bytes + GUARD) as u32).unwrap();
        assert_eq!(
            &bytes[..8],
            &[0u8; 8],
            "{}: zero word at {buffer:#x} overwritten",
            case.label()
        );
        assert!(
            bytes[c_bytes..].iter().all(|&b| b == POISON),
            "{}: guard after the C buffer at {buffer:#x} overwritten",
            case.label()
        );
        for (g, &(r0, r1)) in row_groups.iter().enumerate() {
            for i in r0..r1 {
                let row = &bytes[c_row(g, i)..c_row(g, i) + rs_c];
                assert!(
                    row[np * ob..].iter().all(|&b| b == 0xFF),
                    "{}: stride padding of C row {i} at {buffer:#x} overwritten",
                    case.label()
                );
            }
        }
    }

    let expect = emulate(case, &inp);
    let mut got = vec![0u32; m * n];
    for (g, &(r0, r1)) in row_groups.iter().enumerate() {
        for i in r0..r1 {
            let row = chip
                .peek(0, CA_ADDR + c_row(g, i) as u32, (n * ob) as u32)
                .unwrap();
            for j in 0..n {
                let mut word = [0u8; 4];
                word[..ob].copy_from_slice(&row[ob * j..ob * j + ob]);
                got[i * n + j] = u32::from_le_bytes(word);
            }
        }
    }
    for i in 0..m {
        for j in 0..n {
            let (d, e) = (got[i * n + j], expect[i * n + j]);
            let (dv, ev) = (kind.out_value(d), kind.out_value(e));
            assert!(
                d == e || (dv == 0.0 && ev == 0.0),
                "{}: C[{i}, {j}] = {dv} ({d:#x}), emulated AMP order gives {ev} ({e:#x})",
                case.label()
            );
        }
    }
    // Independently: the exact f64 product sum (plus C0) within the
    // worst-case error of recursive summation, |C - ref| <= gamma_r *
    // (|C0| + sum_k |a_k b_k| 2^scale) + r * tiny with gamma_r = r u / (1 - r u)
    // for the r roundings an output goes through (one per AMP phase: NKB * 16
    // for f32, NKB * 4 for fp8), u the unit roundoff of the accumulation type
    // and tiny the largest absolute error of rounding a subnormal result.
    // (ipu_reference's statistical rule, u sqrt(K) rms, is too tight for
    // `ampf32`, which rounds after every single product: K = 64 exceeds it.)
    // Skipped where an output could overflow (the emulation covers those).
    let scale = if kind == Kind::Fp8 {
        2f64.powi(case.scale)
    } else {
        1.0
    };
    let (u, tiny) = match kind {
        Kind::F32 => (2f64.powi(-24), 2f64.powi(-150)),
        Kind::Fp8 => (2f64.powi(-11), 2f64.powi(-25)),
    };
    let roundings = (nkb * kind.amp_shape().0) as f64;
    // The f64 additions before each rounding add at most 2^-52 relative.
    let u = u * (1.0 + 2f64.powi(-40));
    let gamma = roundings * u / (1.0 - roundings * u);
    for i in 0..m {
        for j in 0..n {
            let c0 = if case.accumulate {
                kind.out_value(inp.c0[i * n + j])
            } else {
                0.0
            };
            let products = (0..k).map(|kk| {
                Inputs::value(kind, inp.a[i * k + kk])
                    * Inputs::value(kind, inp.b[kk * n + j])
                    * scale
            });
            let (mut reference, mut magnitude) = (c0, c0.abs());
            for p in products {
                reference += p;
                magnitude += p.abs();
            }
            if magnitude >= 60000.0 {
                continue;
            }
            let bound = gamma * magnitude + roundings * tiny;
            let d = kind.out_value(got[i * n + j]);
            assert!(
                (d - reference).abs() <= bound,
                "{}: C[{i}, {j}] = {d}, reference {reference}, error bound {bound:e}",
                case.label()
            );
        }
    }
    Outcome {
        cycles,
        estimate,
        macs: (m * k * n) as u64,
    }
}

fn seed_of(case: &Case) -> u64 {
    (case.m * 1_000_003 + case.k * 1009 + case.n) as u64 ^ ((case.kind as u64) << 40)
}

fn check(case: Case) -> Outcome {
    let seed = seed_of(&case);
    run_case(&case, seed)
}

const SPLITS: [(usize, usize); 5] = [(1, 1), (6, 1), (3, 2), (2, 3), (1, 6)];

/// Every split of the shape that gives each vertex at least one row and one
/// column block.
fn splits_of(m: usize, n: usize) -> impl Iterator<Item = (usize, usize)> {
    SPLITS
        .into_iter()
        .filter(move |s| s.0 <= m && s.1 <= n.div_ceil(16))
}

#[test]
fn f32_edge_shapes_every_split() {
    for &(m, k, n) in &[
        (1usize, 16usize, 16usize),
        (1, 1, 1),
        (7, 5, 3),
        (33, 48, 20),
        (17, 37, 37),
        (6, 16, 96),
        (13, 70, 50),
    ] {
        for split in splits_of(m, n) {
            check(Case::new(Kind::F32, m, k, n, split));
        }
    }
}

#[test]
fn fp8_edge_shapes_every_split() {
    for &(m, k, n) in &[
        (1usize, 32usize, 16usize),
        (1, 1, 1),
        (7, 5, 3),
        (33, 64, 20),
        (17, 100, 37),
        (6, 32, 96),
        (13, 40, 50),
    ] {
        for split in splits_of(m, n) {
            check(Case::new(Kind::Fp8, m, k, n, split));
        }
    }
}

#[test]
fn wide_strides() {
    // Row strides wider than the padded data (A and C by 8 bytes, B by 16).
    for kind in [Kind::F32, Kind::Fp8] {
        for &(m, k, n, split) in &[(9usize, 37usize, 40usize, (3, 2)), (5, 16, 16, (1, 1))] {
            check(Case {
                pad: 1,
                ..Case::new(kind, m, k, n, split)
            });
            check(Case {
                pad: 3,
                accumulate: true,
                ..Case::new(kind, m, k, n, split)
            });
        }
    }
}

#[test]
fn accumulate_mode_adds_the_partials() {
    // Z = 0: K block 0 reads C0 from CB. NKB odd and even (the result then
    // lands in the state's CA and CB respectively), one and several workers.
    for kind in [Kind::F32, Kind::Fp8] {
        let kb = kind.k_block();
        for &(m, k, n) in &[
            (1usize, 1usize, 1usize),
            (7, kb, 3),
            (7, kb + 3, 20),
            (33, 3 * kb - 1, 37),
            (6, 2 * kb, 96),
        ] {
            for split in splits_of(m, n) {
                check(Case {
                    accumulate: true,
                    ..Case::new(kind, m, k, n, split)
                });
            }
        }
    }
}

#[test]
fn fp8_product_scale() {
    // In the table's range the state word sets `ampscale`; outside it the
    // kernel clamps to -64 or 63, which the emulation (using the exact scale)
    // checks gives the same bits: all products vanish below the accumulators'
    // rounding, or every non-zero product sum becomes infinite.
    for scale in [0, -7, 5, -20, -44, -45, -64, -65, -100, 37, 38, 63, 64, 100] {
        for accumulate in [false, true] {
            check(Case {
                scale,
                accumulate,
                ..Case::new(Kind::Fp8, 9, 40, 20, (3, 2))
            });
        }
    }
    // The scale changes the result (the test above would pass for a kernel
    // that ignored it only if the emulation ignored it too).
    let case = |scale| Case {
        scale,
        ..Case::new(Kind::Fp8, 4, 32, 16, (1, 1))
    };
    let inp = Inputs::random(&case(0), 7);
    assert_ne!(emulate(&case(0), &inp), emulate(&case(-3), &inp));
}

#[test]
fn fp8_scale_outside_the_table_is_really_clamped() {
    // Guards the clamp argument of gemm_fp8.S's header: scale -64 leaves the
    // accumulators of C0 untouched, scale 63 makes every non-zero sum infinite.
    let base = Case {
        accumulate: true,
        ..Case::new(Kind::Fp8, 5, 40, 20, (1, 1))
    };
    let inp = Inputs::random(&base, 11);
    let low = emulate(
        &Case {
            scale: -64,
            ..base.clone()
        },
        &inp,
    );
    assert_eq!(low, inp.c0, "scale -64 must leave C0 unchanged");
    let high = emulate(&Case { scale: 63, ..base }, &inp);
    assert!(
        high.iter().all(|&b| b as u16 & 0x7C00 == 0x7C00),
        "scale 63 must overflow every sum"
    );
}

/// (M, K, C) of the machine model's calibration shapes.
const CALIBRATION: [(usize, usize, usize); 4] =
    [(32, 64, 96), (64, 128, 96), (96, 64, 192), (128, 128, 96)];

fn cycles_table(kind: Kind, accumulate: bool) {
    println!(
        "{kind:?} accumulate={accumulate}\n{:>5} {:>5} {:>5} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "M", "K", "C", "simulated", "vertex", "+launch", "MAC bound", "MAC/cyc", "x bound"
    );
    let mut rows = Vec::new();
    // Six workers over column blocks, as the calibration shapes were
    // measured, then one vertex doing a whole shape alone.
    let shapes = CALIBRATION
        .iter()
        .map(|&s| (s, (1, 6)))
        .chain([((29, 70, 40), (1, 1))]);
    for ((m, k, c), split) in shapes {
        let out = check(Case {
            accumulate,
            ..Case::new(kind, m, k, c, split)
        });
        // What the compiler charges for the step: the slowest vertex's
        // `.cycles` plus the supervisor's launches and `wsync`.
        let vertices = (split.0 * split.1) as u64;
        let charged = out.estimate + ipu_compiler::attention::launch_cycles(vertices);
        let bound = out.macs.div_ceil(kind.macs_per_cycle() as u64);
        let rate = out.macs as f64 / out.cycles as f64;
        println!(
            "{m:>5} {k:>5} {c:>5} {:>10} {:>9} {charged:>9} {bound:>9} {rate:>8.1} {:>8.2}",
            out.cycles,
            out.estimate,
            out.cycles as f64 / bound as f64
        );
        rows.push((m, k, c, out.cycles, charged, bound));
    }
    for (m, k, c, cycles, charged, bound) in rows {
        assert!(
            cycles >= bound,
            "{kind:?} {m}x{k}x{c}: {cycles} cycles beat the AMP peak ({bound})"
        );
        // The charge may over-estimate a little but not under-estimate by
        // more than 3%.
        let ratio = charged as f64 / cycles as f64;
        assert!(
            (0.97..1.1).contains(&ratio),
            "{kind:?} {m}x{k}x{c}: charged {charged} vs simulated {cycles}"
        );
    }
}

#[test]
fn f32_calibration_shapes_cycles() {
    cycles_table(Kind::F32, false);
    cycles_table(Kind::F32, true);
}

#[test]
fn fp8_calibration_shapes_cycles() {
    cycles_table(Kind::Fp8, false);
    cycles_table(Kind::Fp8, true);
}
