//! device/colmax_f16.S and device/softmax_cols.S on one simulated tile, as
//! the compiler runs them for transposed attention: W colmax_f16 vertices
//! over row ranges of S^T write the partial column maxima, then one or six
//! softmax_cols vertices (row ranges, some possibly empty) fold them and
//! write P^T = exp(S^T * s - m) and, where asked, m as f32.
//!
//! Every result is checked bit for bit against a host emulation of the
//! kernels' documented operation order (the header comments of the two
//! sources): f16 maxima as left folds from -inf with `f16v4max`'s
//! tie rule, `s16 = f16(SCALE)`, `m = f16(mx * s16)`, `t = f16(-m + x *
//! s16)` with one rounding, `p = f16(exp(t))` with exp in f64 and one
//! rounding (docs/isa.md: every f16 result is rounded once from the exact
//! f64 value, through `ipu_isa::numerics::f64_to_f16_bits`). The
//! simulator executes the kernels' machine code; the host only prepares
//! memory and reads it back.
//!
//! Both kernels also run as `-D IN=32` (f32 scores from gemm_f16 ACC=32):
//! f32 maxima folded with `f32v2max`'s tie rule, `m = f32(mx * SCALE)`,
//! `t = f16(f32(-m + x * SCALE))` (one fused f32 rounding, then one f16
//! rounding), `p = f16(exp(t))`, checked bit for bit the same way, plus the
//! accuracy that motivates them: p within 5e-4 of the exact softmax
//! numerator where f16 scores are off by about 1%.
//!
//! softmax_cols also runs as `-D IN=32 -D EXP=32` (the argument and the
//! exponential in f32): `a = f32(-m + x * SCALE)` as with IN=32, `e =
//! f32(exp(a))` (exp in f64, one rounding), `p = f16(e)` (nearest even),
//! checked bit for bit over the same shapes, plus its accuracy: p within
//! about half an f16 ulp of the exact numerator for arguments down to -10,
//! where the f16 argument of EXP=16 is off by several ulps.

mod kernel_common;

use ipu_isa::numerics::{f16_bits_to_f32, f64_to_f16_bits};
use kernel_common::*;

const IN: u32 = 0x80000;
const OUT: u32 = 0xA0000;
const MAXES: u32 = 0xC0000;
/// One 0x100-byte MOUT buffer per softmax vertex (4 * QUADS f32 <= 128 B).
const MOUT: u32 = 0xC1000;
/// Per-vertex SCRATCH far from every OUT row (another memory element).
const SCRATCH_FAR: u32 = 0xD0000;
const POISON: u8 = 0xA5;
const NEG_INF: u16 = 0xFC00;
const F16_NAN: u16 = 0x7E00;
const F32_NEG_INF: u32 = 0xFF80_0000;
const F32_NAN: u32 = 0x7FC0_0000;

fn f16v(bits: u16) -> f64 {
    f16_bits_to_f32(bits) as f64
}

/// `f16v4max` on one lane: NaN if either is NaN, else the second operand
/// only when it is strictly larger (equal values keep the first).
fn max16(a: u16, b: u16) -> u16 {
    let (x, y) = (f16v(a), f16v(b));
    if x.is_nan() || y.is_nan() {
        F16_NAN
    } else if y > x {
        b
    } else {
        a
    }
}

/// colmax_f16 on rows `rows` of `x` ([_, cols] row-major): per column the
/// left fold of `max16` from -inf (after the pipeline's max(-inf, -inf)).
fn emulate_colmax(x: &[u16], cols: usize, rows: std::ops::Range<usize>) -> Vec<u16> {
    (0..cols)
        .map(|c| {
            rows.clone().fold(max16(NEG_INF, NEG_INF), |acc, r| {
                max16(acc, x[r * cols + c])
            })
        })
        .collect()
}

/// softmax_cols's m (f16 bits) per column from the W partial maxima.
fn emulate_m(maxes: &[Vec<u16>], cols: usize, s16: u16) -> Vec<u16> {
    (0..cols)
        .map(|c| {
            let mx = maxes
                .iter()
                .fold(max16(NEG_INF, NEG_INF), |acc, m| max16(acc, m[c]));
            f64_to_f16_bits(f16v(mx) * f16v(s16))
        })
        .collect()
}

/// softmax_cols's p for one element: the fused argument rounded once, then
/// exp in f64 rounded once.
fn emulate_p(x: u16, m: u16, s16: u16) -> u16 {
    let t = f64_to_f16_bits(f16v(m ^ 0x8000) + f16v(x) * f16v(s16));
    f64_to_f16_bits(f16v(t).exp())
}

/// `f32v2max` on one lane: NaN (canonical) if either is NaN, else the
/// second operand only when it is strictly larger.
fn max32(a: u32, b: u32) -> u32 {
    let (x, y) = (f32::from_bits(a), f32::from_bits(b));
    if x.is_nan() || y.is_nan() {
        F32_NAN
    } else if y > x {
        b
    } else {
        a
    }
}

/// colmax_f16 IN=32 on rows `rows` of `x`: per column the left fold of
/// `max32` from -inf.
fn emulate_colmax32(x: &[u32], cols: usize, rows: std::ops::Range<usize>) -> Vec<u32> {
    (0..cols)
        .map(|c| {
            rows.clone()
                .fold(F32_NEG_INF, |acc, r| max32(acc, x[r * cols + c]))
        })
        .collect()
}

/// softmax_cols IN=32's m (f32 bits) per column: the fold of the W partial
/// maxima from -inf, times SCALE with one f32 rounding.
fn emulate_m32(maxes: &[Vec<u32>], cols: usize, scale: f32) -> Vec<u32> {
    (0..cols)
        .map(|c| {
            let mx = maxes.iter().fold(F32_NEG_INF, |acc, m| max32(acc, m[c]));
            let m = f32::from_bits(mx) * scale;
            if m.is_nan() {
                F32_NAN
            } else {
                m.to_bits()
            }
        })
        .collect()
}

/// softmax_cols IN=32's p for one element: the f32 argument from one fused
/// multiply-add onto -m, rounded to f16, then exp in f64 rounded once.
fn emulate_p32(x: u32, m: u32, scale: f32) -> u16 {
    let a = f32::from_bits(x).mul_add(scale, -f32::from_bits(m));
    let t = f64_to_f16_bits(a as f64);
    f64_to_f16_bits(f16v(t).exp())
}

/// softmax_cols IN=32 EXP=32's p for one element: the same f32 argument,
/// its exponential in f32 (computed in f64, rounded once to f32), then that
/// f32 rounded to f16 (nearest even).
fn emulate_p32_exp32(x: u32, m: u32, scale: f32) -> u16 {
    let a = f32::from_bits(x).mul_add(scale, -f32::from_bits(m));
    let e = (a as f64).exp() as f32;
    f64_to_f16_bits(e as f64)
}

/// The scores' precision and the exponential's: which specialisation of
/// both kernels runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    /// The default objects (IN=16): f16 scores and maxima.
    F16,
    /// `-D IN=32`: f32 scores and maxima, the exponent argument rounded to
    /// f16 (softmax_cols EXP=16, its default).
    F32,
    /// colmax_f16 `-D IN=32`, softmax_cols `-D IN=32 -D EXP=32`: the
    /// argument and the exponential in f32.
    F32Exp32,
}

impl Input {
    fn bytes(self) -> usize {
        match self {
            Input::F16 => 2,
            Input::F32 | Input::F32Exp32 => 4,
        }
    }
    /// colmax_f16's definitions.
    fn defines(self) -> &'static [(&'static str, i64)] {
        match self {
            Input::F16 => &[],
            Input::F32 | Input::F32Exp32 => &[("IN", 32)],
        }
    }
    /// Bytes of poisoned padding after each input row: the rows' stride
    /// is the smallest the kernels take beyond the row (softmax_cols IN=32
    /// EXP=16 loads a quad with one `ld128`: a multiple of 16).
    fn stride_pad(self) -> usize {
        match self {
            Input::F32 => 16,
            Input::F16 | Input::F32Exp32 => 8,
        }
    }
    /// softmax_cols's definitions.
    fn softmax_defines(self) -> &'static [(&'static str, i64)] {
        match self {
            Input::F32Exp32 => &[("IN", 32), ("EXP", 32)],
            _ => self.defines(),
        }
    }
}

/// How the inputs are drawn.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Uniform in (-spread, spread).
    Uniform(f64),
    /// Magnitudes over many binades, signs mixed, with specials: the
    /// largest finite f16 (both signs), +0, -0, repeated values, and whole
    /// columns of one value or of mixed zeros. With f32 scores the
    /// magnitudes span 2^-40..2^40 and the specials include +-1e30 and
    /// +-3e38 (a scaled maximum far beyond f16, differences that overflow
    /// f32 to -inf).
    Wild,
    /// f32 only: every value within a few f16 ulps below its column's
    /// base value (itself uniform in (-spread, spread)), so t is small and
    /// its f32 rounding is what decides the last bits of p.
    Near(f64),
    /// f32 only: each column's values uniform in (base - width, base], the
    /// base uniform in (-spread, spread): scaled arguments from 0 down to
    /// about -width * scale.
    Band { spread: f64, width: f64 },
}

#[derive(Clone, Copy, Debug)]
struct Case {
    rows: usize,
    quads: usize,
    /// colmax_f16 vertices (at most `rows` of them get rows).
    w: usize,
    /// softmax_cols vertices: 1, or 6 on the ranges i * rows / 6 (which may
    /// be empty: such a vertex only writes MOUT, if given one).
    workers: usize,
    scale: f32,
    input: Input,
    values: Values,
    in_place: bool,
    /// SCRATCH in OUT's memory element: the kernel must take its slow path.
    scratch_near_out: bool,
    /// MOUT for every vertex (own buffers) instead of only the last one.
    mout_all: bool,
    seed: u64,
}

fn draw(rng: &mut Rng, values: Values, cols: usize, rows: usize) -> Vec<u16> {
    let mut x: Vec<u16> = (0..rows * cols)
        .map(|_| match values {
            Values::Uniform(spread) => f64_to_f16_bits(rng.uniform(-spread, spread)),
            Values::Near(_) | Values::Band { .. } => {
                unreachable!("Near and Band are drawn as f32 only")
            }
            Values::Wild => {
                let k = rng.next_u64() % 20;
                match k {
                    0 => 0x7BFF,               // 65504
                    1 => 0xFBFF,               // -65504
                    2 => 0x8000,               // -0
                    3 => 0x0000,               // +0
                    4 => f64_to_f16_bits(1.5), // repeated value
                    _ => {
                        let mag = rng.uniform(-16.0, 15.0).exp2();
                        let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
                        f64_to_f16_bits(sign * mag)
                    }
                }
            }
        })
        .collect();
    if let Values::Wild = values {
        // Column 0: one repeated value; column 1 (if any): zeros of both
        // signs only, so the tie rule decides the maximum's sign.
        for r in 0..rows {
            x[r * cols] = f64_to_f16_bits(-2.25);
            if cols > 1 {
                x[r * cols + 1] = if rng.next_u64() & 1 == 0 { 0x8000 } else { 0 };
            }
        }
    }
    x
}

/// f32 scores (bits) for `Input::F32`.
fn draw32(rng: &mut Rng, values: Values, cols: usize, rows: usize) -> Vec<u32> {
    let bases: Vec<f64> = (0..cols)
        .map(|_| match values {
            Values::Near(spread) | Values::Band { spread, .. } => rng.uniform(-spread, spread),
            _ => 0.0,
        })
        .collect();
    let mut x: Vec<u32> = (0..rows * cols)
        .map(|i| match values {
            Values::Uniform(spread) => (rng.uniform(-spread, spread) as f32).to_bits(),
            Values::Band { width, .. } => {
                ((bases[i % cols] - rng.uniform(0.0, width)) as f32).to_bits()
            }
            Values::Near(_) => {
                // 0..7 f16 ulps of the base below it, in f32 steps of 1/64
                // ulp: many exact ties with the base, many distinct t.
                let base = bases[i % cols];
                let ulp = (base.abs().max(1e-3)).log2().floor().exp2() * 2f64.powi(-10);
                let steps = (rng.next_u64() % 449) as f64 / 64.0;
                ((base - steps * ulp) as f32).to_bits()
            }
            Values::Wild => {
                let k = rng.next_u64() % 24;
                match k {
                    0 => 1e30f32.to_bits(),
                    1 => (-1e30f32).to_bits(),
                    2 => 0x8000_0000, // -0
                    3 => 0,           // +0
                    4 => 1.5f32.to_bits(),
                    5 => 3e38f32.to_bits(),
                    6 => (-3e38f32).to_bits(),
                    _ => {
                        let mag = rng.uniform(-40.0, 40.0).exp2();
                        let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
                        ((sign * mag) as f32).to_bits()
                    }
                }
            }
        })
        .collect();
    if let Values::Wild = values {
        // As in `draw`: a constant column and a column of mixed zeros.
        for r in 0..rows {
            x[r * cols] = (-2.25f32).to_bits();
            if cols > 1 {
                x[r * cols + 1] = if rng.next_u64() & 1 == 0 {
                    0x8000_0000
                } else {
                    0
                };
            }
        }
    }
    x
}

/// The scores of a case as raw bits widened to u32 (f16 in the low half
/// for `Input::F16`) and as the bytes of one row each.
fn draw_scores(case: &Case, cols: usize) -> (Vec<u32>, Vec<Vec<u8>>) {
    let mut rng = Rng(case.seed);
    match case.input {
        Input::F16 => {
            let x = draw(&mut rng, case.values, cols, case.rows);
            let rows = x.chunks(cols).map(f16_bytes).collect();
            (x.into_iter().map(u32::from).collect(), rows)
        }
        Input::F32 | Input::F32Exp32 => {
            let x = draw32(&mut rng, case.values, cols, case.rows);
            let rows = x
                .chunks(cols)
                .map(|row| row.iter().flat_map(|w| w.to_le_bytes()).collect())
                .collect();
            (x, rows)
        }
    }
}

/// The partial column maxima of rows `rows`, as the case's colmax computes
/// them (bits widened to u32).
fn emulate_maxes(case: &Case, x: &[u32], cols: usize, rows: std::ops::Range<usize>) -> Vec<u32> {
    match case.input {
        Input::F16 => {
            let x16: Vec<u16> = x.iter().map(|&v| v as u16).collect();
            emulate_colmax(&x16, cols, rows)
                .into_iter()
                .map(u32::from)
                .collect()
        }
        Input::F32 | Input::F32Exp32 => emulate_colmax32(x, cols, rows),
    }
}

/// The emulated p of element (row, column).
type ElementP = Box<dyn Fn(usize, usize) -> u16>;

/// Runs colmax_f16 then softmax_cols on one case, checks every written
/// value bit for bit and the untouched bytes, and returns the compute
/// cycles of the whole run (both groups).
fn run_case(case: &Case) -> u64 {
    run_case_chip(case).1
}

/// [`run_case`], also returning the chip to read results from.
fn run_case_chip(case: &Case) -> (ipu_sim::Chip, u64) {
    let (rows, quads) = (case.rows, case.quads);
    let cols = 4 * quads;
    let elem = case.input.bytes();
    let label = format!("{case:?}");
    let (x, x_rows) = draw_scores(case, cols);
    let rs_in = elem * cols + case.input.stride_pad();
    let rs_out = if case.in_place { rs_in } else { rs_in + 16 };
    let out_base = if case.in_place { IN } else { OUT };
    let maxes_row = elem * cols;
    // Input rows with poisoned stride padding and one poisoned row after.
    let mut input = vec![POISON; (rows + 1) * rs_in];
    for (r, row) in x_rows.iter().enumerate() {
        input[r * rs_in..r * rs_in + row.len()].copy_from_slice(row);
    }
    let out_bytes = (rows + 1) * rs_out;
    // What OUT's region held before the run: every byte the kernel must
    // leave alone keeps it.
    let out_before = if case.in_place {
        input.clone()
    } else {
        vec![POISON; out_bytes]
    };
    let scratch_base = if case.scratch_near_out {
        // After OUT's poisoned extra row, inside OUT's 32 KiB element.
        let s = out_base + out_bytes as u32 + 0x40;
        assert!((s + 0x600 - 0x80000) / 0x8000 == (out_base - 0x80000) / 0x8000);
        s
    } else {
        SCRATCH_FAR
    };
    let mut memory = vec![
        (IN, input.clone()),
        (MAXES, vec![POISON; 0x800]),
        (MOUT, vec![POISON; 0x600]),
        (scratch_base, vec![POISON; 0x600]),
    ];
    if !case.in_place {
        memory.push((OUT, vec![POISON; out_bytes]));
    }

    let col_ranges = ranges_aligned(rows, case.w, 1);
    let w = col_ranges.len();
    let colmax: Vec<Launch> = col_ranges
        .iter()
        .enumerate()
        .map(|(i, &(r0, r1))| Launch {
            entry: "colmax_f16".into(),
            state: vec![
                IN + (r0 * rs_in) as u32,
                rs_in as u32,
                (r1 - r0) as u32,
                quads as u32,
                MAXES + (i * maxes_row) as u32,
            ],
        })
        .collect();
    let soft_ranges: Vec<(usize, usize)> = (0..case.workers)
        .map(|i| (i * rows / case.workers, (i + 1) * rows / case.workers))
        .collect();
    let mout_of = |i: usize| -> u32 {
        if case.mout_all || i + 1 == case.workers {
            MOUT + 0x100 * i as u32
        } else {
            0
        }
    };
    let softmax: Vec<Launch> = soft_ranges
        .iter()
        .enumerate()
        .map(|(i, &(r0, r1))| Launch {
            entry: "softmax_cols".into(),
            state: vec![
                IN + (r0 * rs_in) as u32,
                rs_in as u32,
                out_base + (r0 * rs_out) as u32,
                rs_out as u32,
                (r1 - r0) as u32,
                quads as u32,
                MAXES,
                w as u32,
                case.scale.to_bits(),
                mout_of(i),
                scratch_base + 0x100 * i as u32,
            ],
        })
        .collect();
    let (chip, cycles) = simulate(
        &[
            Kernel {
                file: "colmax_f16.S",
                defines: case.input.defines(),
            },
            Kernel {
                file: "softmax_cols.S",
                defines: case.input.softmax_defines(),
            },
        ],
        &[colmax, softmax],
        &memory,
    );

    // The partial maxima, then m, p and MOUT.
    let maxes: Vec<Vec<u32>> = col_ranges
        .iter()
        .map(|&(r0, r1)| emulate_maxes(case, &x, cols, r0..r1))
        .collect();
    for (i, want) in maxes.iter().enumerate() {
        let addr = MAXES + (i * maxes_row) as u32;
        let got: Vec<u32> = match case.input {
            Input::F16 => read_f16(&chip, addr, cols)
                .into_iter()
                .map(u32::from)
                .collect(),
            Input::F32 | Input::F32Exp32 => read_u32(&chip, addr, cols),
        };
        assert_eq!(&got, want, "{label}: colmax vertex {i}");
    }
    let after_maxes = chip.peek(0, MAXES + (w * maxes_row) as u32, 64).unwrap();
    assert!(
        after_maxes.iter().all(|&b| b == POISON),
        "{label}: colmax wrote past its W x {cols} maxima"
    );
    // m as f32 bits (MOUT) and each element's p.
    let s16 = f64_to_f16_bits(case.scale as f64);
    let (m_f32, p_of): (Vec<u32>, ElementP) = match case.input {
        Input::F16 => {
            let maxes16: Vec<Vec<u16>> = maxes
                .iter()
                .map(|v| v.iter().map(|&b| b as u16).collect())
                .collect();
            let m = emulate_m(&maxes16, cols, s16);
            let m_f32 = m.iter().map(|&h| f16_bits_to_f32(h).to_bits()).collect();
            let x = x.clone();
            (
                m_f32,
                Box::new(move |r, c| emulate_p(x[r * cols + c] as u16, m[c], s16)),
            )
        }
        Input::F32 => {
            let m = emulate_m32(&maxes, cols, case.scale);
            let (x, mm, scale) = (x.clone(), m.clone(), case.scale);
            (
                m,
                Box::new(move |r, c| emulate_p32(x[r * cols + c], mm[c], scale)),
            )
        }
        Input::F32Exp32 => {
            let m = emulate_m32(&maxes, cols, case.scale);
            let (x, mm, scale) = (x.clone(), m.clone(), case.scale);
            (
                m,
                Box::new(move |r, c| emulate_p32_exp32(x[r * cols + c], mm[c], scale)),
            )
        }
    };
    for r in 0..rows {
        let got = read_f16(&chip, out_base + (r * rs_out) as u32, cols);
        for c in 0..cols {
            let want = p_of(r, c);
            assert_eq!(
                got[c],
                want,
                "{label}: p[{r}, {c}] = {:#06x} ({}), emulation {want:#06x} ({}); x {:#010x}, m \
                 (f32) {:#010x}",
                got[c],
                f16v(got[c]),
                f16v(want),
                x[r * cols + c],
                m_f32[c]
            );
        }
        // The rest of the row (stride padding; in place with f32 scores
        // also the input bytes past the row's f16 output) is untouched.
        let start = r * rs_out + 2 * cols;
        let rest = chip
            .peek(0, out_base + start as u32, (rs_out - 2 * cols) as u32)
            .unwrap();
        assert!(
            rest == out_before[start..(r + 1) * rs_out],
            "{label}: row {r} wrote past its {cols} outputs: {rest:02x?}"
        );
    }
    let past = chip
        .peek(0, out_base + (rows * rs_out) as u32, rs_out as u32)
        .unwrap();
    assert!(
        past == out_before[rows * rs_out..],
        "{label}: wrote the row after the last"
    );
    if !case.in_place {
        assert_eq!(
            chip.peek(0, IN, input.len() as u32).unwrap(),
            input,
            "{label}: IN changed"
        );
    }
    for i in 0..case.workers {
        let buf = MOUT + 0x100 * i as u32;
        let got = chip.peek(0, buf, 0x100).unwrap();
        if mout_of(i) != 0 {
            assert_eq!(
                read_u32(&chip, buf, cols),
                m_f32,
                "{label}: MOUT of vertex {i}"
            );
            assert!(
                got[4 * cols..].iter().all(|&b| b == POISON),
                "{label}: vertex {i} wrote past its MOUT"
            );
        } else {
            assert!(
                got.iter().all(|&b| b == POISON),
                "{label}: MOUT buffer {i} written though its vertex had MOUT = 0"
            );
        }
        // SCRATCH: the vertex owns 8 * QUADS + 16 bytes, no more.
        let own = 8 * quads + 16;
        let scratch = chip
            .peek(
                0,
                scratch_base + 0x100 * i as u32 + own as u32,
                0x100 - own as u32,
            )
            .unwrap();
        assert!(
            scratch.iter().all(|&b| b == POISON),
            "{label}: vertex {i} wrote past its {own} SCRATCH bytes"
        );
    }
    (chip, cycles)
}

/// The scales: 1/sqrt(72) (SigLIP's head), 1, and 0.1 (not an f16 value:
/// s16 rounds).
const SCALES: [f32; 3] = [0.117_851_13, 1.0, 0.1];

/// The shape matrix of both precisions: ROWS x QUADS x W colmax vertices x
/// {1, 6} softmax vertices, with the values, scale, in-place and MOUT
/// choices cycling with the seed.
fn all_shapes(input: Input, first_seed: u64, values_of: impl Fn(u64) -> Values) {
    let mut seed = first_seed;
    for rows in [1, 2, 7, 61, 368] {
        for quads in [1, 4, 8] {
            for (wi, w) in [1, 3, 6].into_iter().enumerate() {
                for workers in [1, 6] {
                    seed += 1;
                    run_case(&Case {
                        rows,
                        quads,
                        w,
                        workers,
                        scale: SCALES[(seed as usize + wi) % 3],
                        input,
                        values: values_of(seed),
                        in_place: seed.is_multiple_of(2),
                        scratch_near_out: false,
                        mout_all: seed % 4 == 1,
                        seed,
                    });
                }
            }
        }
    }
}

#[test]
fn matches_emulation_on_all_shapes() {
    all_shapes(Input::F16, 100, |seed| match seed % 3 {
        0 => Values::Uniform(6.0),
        1 => Values::Uniform(3000.0),
        _ => Values::Wild,
    });
}

#[test]
fn f32_matches_emulation_on_all_shapes() {
    all_shapes(Input::F32, 1100, |seed| match seed % 4 {
        0 => Values::Uniform(6.0),
        1 => Values::Uniform(3000.0),
        2 => Values::Near(300.0),
        _ => Values::Wild,
    });
}

#[test]
fn f32_exp32_matches_emulation_on_all_shapes() {
    all_shapes(Input::F32Exp32, 2100, |seed| match seed % 5 {
        0 => Values::Uniform(6.0),
        1 => Values::Uniform(3000.0),
        2 => Values::Near(300.0),
        3 => Values::Band {
            spread: 250.0,
            width: 85.0,
        },
        _ => Values::Wild,
    });
}

#[test]
fn slow_path_when_scratch_shares_out_element() {
    // The same results through the 4-slot loop: SCRATCH inside OUT's
    // element rules out `ld64st64`. IN=32 has a single loop without
    // `ld64st64`: it must not care where SCRATCH is.
    for input in [Input::F16, Input::F32, Input::F32Exp32] {
        let mut seed = 500;
        for rows in [1, 2, 7, 61] {
            for quads in [1, 4, 8] {
                for in_place in [false, true] {
                    seed += 1;
                    run_case(&Case {
                        rows,
                        quads,
                        w: 6,
                        workers: 6,
                        scale: SCALES[seed as usize % 3],
                        input,
                        values: Values::Wild,
                        in_place,
                        scratch_near_out: true,
                        mout_all: true,
                        seed,
                    });
                }
            }
        }
    }
}

#[test]
fn wide_spread_underflows_to_zero() {
    // Scores spread over the whole f16 range at scale 1: most p are exactly
    // 0 (t = -inf or far below -17), the column maxima give exactly 1.
    let case = Case {
        rows: 61,
        quads: 4,
        w: 6,
        workers: 6,
        scale: 1.0,
        input: Input::F16,
        values: Values::Uniform(60000.0),
        in_place: false,
        scratch_near_out: false,
        mout_all: false,
        seed: 9,
    };
    run_case(&case);
    // The emulation itself: zeros and ones appear (the test above compares
    // the device with it bit for bit).
    let mut rng = Rng(case.seed);
    let x = draw(&mut rng, case.values, 16, 61);
    let maxes = vec![emulate_colmax(&x, 16, 0..61)];
    let s16 = f64_to_f16_bits(1.0);
    let m = emulate_m(&maxes, 16, s16);
    let p: Vec<u16> = (0..61 * 16)
        .map(|i| emulate_p(x[i], m[i % 16], s16))
        .collect();
    assert!(p.iter().filter(|&&v| v == 0).count() > 61 * 16 / 2);
    assert_eq!(p.iter().filter(|&&v| v == 0x3C00).count(), 16);
}

#[test]
fn f32_huge_scores_stay_finite() {
    // f32 scores far beyond f16 (spread 1e6 at scale 1, and 1e30 / 3e38
    // among the wild values): m stays an f32, the arguments go to -inf in
    // f16 (or f32) and p to 0, the maxima give exactly 1, no NaN anywhere;
    // with the exponent argument in f16 (EXP=16) and in f32 (EXP=32).
    for (input, values, seed) in [
        (Input::F32, Values::Uniform(1e6), 19),
        (Input::F32, Values::Wild, 20),
        (Input::F32Exp32, Values::Uniform(1e6), 21),
        (Input::F32Exp32, Values::Wild, 22),
    ] {
        let p_of = match input {
            Input::F32Exp32 => emulate_p32_exp32,
            _ => emulate_p32,
        };
        let case = Case {
            rows: 61,
            quads: 4,
            w: 6,
            workers: 6,
            scale: 1.0,
            input,
            values,
            in_place: false,
            scratch_near_out: false,
            mout_all: true,
            seed,
        };
        run_case(&case);
        let mut rng = Rng(case.seed);
        let x = draw32(&mut rng, case.values, 16, 61);
        let m = emulate_m32(&[emulate_colmax32(&x, 16, 0..61)], 16, 1.0);
        assert!(m.iter().all(|&b| f32::from_bits(b).is_finite()));
        let p: Vec<u16> = (0..61 * 16).map(|i| p_of(x[i], m[i % 16], 1.0)).collect();
        assert!(p.iter().all(|&v| !f16v(v).is_nan()));
        assert!(p.iter().filter(|&&v| v == 0).count() > 61 * 16 / 2);
        assert!(p.iter().filter(|&&v| v == 0x3C00).count() >= 16);
    }
    // 3e38 - (-3e38) overflows f32: t = -inf, p = +0 exactly.
    let big = 3e38f32.to_bits();
    assert_eq!(emulate_p32((-3e38f32).to_bits(), big, 1.0), 0);
    assert_eq!(emulate_p32_exp32((-3e38f32).to_bits(), big, 1.0), 0);
}

#[test]
fn f32_colmax_nan_infinity_and_ties() {
    // colmax_f16 IN=32 alone on columns with NaN, +-inf, equal values of
    // both zero signs and -inf only: f32v2max's rules, bit for bit.
    let quads = 2;
    let cols = 4 * quads;
    let rows = 9;
    let nan_payload = 0x7FC0_1234u32;
    let mut x = vec![0u32; rows * cols];
    let mut rng = Rng(5);
    for r in 0..rows {
        for c in 0..cols {
            x[r * cols + c] = match c {
                // NaN in the middle: the result is the canonical NaN.
                0 if r == 4 => nan_payload,
                // +inf in the middle wins.
                1 if r == 6 => 0x7F80_0000,
                // -inf only: -inf.
                2 => F32_NEG_INF,
                // +0 first, then -0s: the first (+0) is kept; column 4 the
                // reverse.
                3 => {
                    if r == 0 {
                        0
                    } else {
                        0x8000_0000
                    }
                }
                4 => {
                    if r == 0 {
                        0x8000_0000
                    } else {
                        0
                    }
                }
                _ => ((rng.uniform(-5.0, 5.0)) as f32).to_bits(),
            };
        }
    }
    let (chip, _) = colmax_only(&x, rows, quads, 3, Input::F32);
    for (i, (r0, r1)) in ranges_aligned(rows, 3, 1).into_iter().enumerate() {
        let got = read_u32(&chip, MAXES + (i * 16 * quads) as u32, cols);
        assert_eq!(got, emulate_colmax32(&x, cols, r0..r1), "vertex {i}");
    }
    let all = emulate_colmax32(&x, cols, 0..rows);
    assert_eq!(all[0], F32_NAN);
    assert_eq!(all[1], 0x7F80_0000);
    assert_eq!(all[2], F32_NEG_INF);
    assert_eq!(all[3], 0);
    assert_eq!(all[4], 0x8000_0000);
}

#[test]
fn f32_scores_keep_p_accurate_near_the_maximum() {
    // Why IN=32 exists: scores around +-250 at scale 1/sqrt(72) (scaled
    // scores near 30). The simulated p must be within 5e-4 of the exact
    // exp(x * scale - max_c x * scale) (f16 rounding of t and of p: at most
    // 2^-11/e + 2^-12 + the f32 roundings), while the same scores rounded
    // to f16 first move the argument by up to 30 * 2^-11 and p by about 1%.
    let (rows, quads) = (61, 4);
    let cols = 4 * quads;
    let case = Case {
        rows,
        quads,
        w: 6,
        workers: 6,
        scale: SCALES[0],
        input: Input::F32,
        values: Values::Near(250.0),
        in_place: false,
        scratch_near_out: false,
        mout_all: false,
        seed: 31,
    };
    let (chip, _) = run_case_chip(&case);
    let (x, _) = draw_scores(&case, cols);
    // OUT's rows as run_case lays them out (not in place).
    let rs_out = 4 * cols + case.input.stride_pad() + 16;
    let scale = case.scale as f64;
    let exact_max: Vec<f64> = (0..cols)
        .map(|c| {
            (0..rows)
                .map(|r| f32::from_bits(x[r * cols + c]) as f64)
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect();
    let m32 = emulate_m32(&[emulate_colmax32(&x, cols, 0..rows)], cols, case.scale);
    let (mut err32, mut err16) = (0f64, 0f64);
    let s16 = f64_to_f16_bits(scale);
    let x16: Vec<u16> = x
        .iter()
        .map(|&b| f64_to_f16_bits(f32::from_bits(b) as f64))
        .collect();
    let m16 = emulate_m(&[emulate_colmax(&x16, cols, 0..rows)], cols, s16);
    for r in 0..rows {
        for c in 0..cols {
            let i = r * cols + c;
            let exact = ((f32::from_bits(x[i]) as f64 - exact_max[c]) * scale).exp();
            let device = read_f16(&chip, OUT + (r * rs_out + 2 * c) as u32, 1)[0];
            assert_eq!(device, emulate_p32(x[i], m32[c], case.scale));
            err32 = err32.max((f16v(device) - exact).abs());
            err16 = err16.max((f16v(emulate_p(x16[i], m16[c], s16)) - exact).abs());
        }
    }
    println!("max |p - exact|: f32 scores {err32:.2e}, f16 scores {err16:.2e}");
    assert!(err32 < 5e-4, "f32 scores: max error {err32}");
    assert!(err16 > 4e-3, "f16 scores unexpectedly accurate: {err16}");
}

/// The spacing of f16 values at magnitude |v| (2^-24 below the smallest
/// normal, 2^-14).
fn f16_ulp(v: f64) -> f64 {
    v.abs().max(2f64.powi(-14)).log2().floor().exp2() * 2f64.powi(-10)
}

#[test]
fn exp32_keeps_p_within_half_an_ulp_down_to_minus_10() {
    // Why EXP=32 exists: scores around +-250 at scale 1/sqrt(72) (scaled
    // maxima near 30), each column spread over 85 below its base, so the
    // arguments run from 0 down to about -10. With EXP=32 the only error
    // beyond p's own f16 rounding (half an ulp) is the f32 argument's (m
    // rounded by 2^-24 |m|, the fused mac by 2^-24 |a|: a few 1e-6 relative
    // in p) and e's f32 rounding (2^-24 relative), thousandths of an f16
    // ulp; with EXP=16 the argument's f16 rounding (up to 2^-11 |t|, 5e-3
    // relative at t = -10) moves p by several ulps.
    let (rows, quads) = (61, 4);
    let cols = 4 * quads;
    let mut worst = Vec::new();
    for input in [Input::F32Exp32, Input::F32] {
        let case = Case {
            rows,
            quads,
            w: 6,
            workers: 6,
            scale: SCALES[0],
            input,
            values: Values::Band {
                spread: 250.0,
                width: 85.0,
            },
            in_place: false,
            scratch_near_out: false,
            mout_all: false,
            seed: 41,
        };
        // run_case_chip checks every p against the emulation bit for bit;
        // here the device's p are compared with the exact numerator.
        let (chip, _) = run_case_chip(&case);
        let (x, _) = draw_scores(&case, cols);
        // OUT's rows as run_case lays them out (not in place).
        let rs_out = 4 * cols + 8 + 16;
        let scale = case.scale as f64;
        let (mut ulps, mut abs, mut lowest, mut sq) = (0f64, 0f64, 0f64, 0f64);
        for c in 0..cols {
            let xs: Vec<f64> = (0..rows)
                .map(|r| f32::from_bits(x[r * cols + c]) as f64)
                .collect();
            let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            for (r, &xv) in xs.iter().enumerate() {
                let arg = (xv - max) * scale;
                let exact = arg.exp();
                let device = f16v(read_f16(&chip, OUT + (r * rs_out + 2 * c) as u32, 1)[0]);
                lowest = lowest.min(arg);
                abs = abs.max((device - exact).abs());
                let e = (device - exact).abs() / f16_ulp(exact);
                ulps = ulps.max(e);
                sq += e * e;
            }
        }
        let rms = (sq / (rows * cols) as f64).sqrt();
        println!(
            "{input:?}: arguments down to {lowest:.2}, max |p - exact| {abs:.2e}, max {ulps:.3} \
             f16 ulp, rms {rms:.3} ulp"
        );
        assert!(lowest < -9.8, "{input:?}: the band reaches only {lowest}");
        worst.push(ulps);
    }
    assert!(worst[0] <= 0.51, "EXP=32: {} f16 ulp from exact", worst[0]);
    assert!(
        worst[1] > 2.0,
        "EXP=16 unexpectedly accurate: {} ulp",
        worst[1]
    );
}

#[test]
fn exp_parameter_checks_and_default() {
    // EXP=32 only with IN=32, EXP only 16 or 32: assembly errors naming
    // the source line.
    for (defines, wants) in [
        (&[("EXP", 32)][..], "EXP=32 needs IN=32"),
        (&[("IN", 32), ("EXP", 8)][..], "EXP must be 16"),
    ] {
        let e = match assemble("softmax_cols.S", defines) {
            Ok(_) => panic!("{defines:?} assembled"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(wants) && e.contains("softmax_cols.S:"), "{e}");
    }
    // Objects built without EXP record its default 16, and are the objects
    // built with EXP=16 named.
    for base in [&[][..], &[("IN", 32)][..]] {
        let default = assemble("softmax_cols.S", base).unwrap();
        let named: Vec<(&str, i64)> = base.iter().copied().chain([("EXP", 16)]).collect();
        let explicit = assemble("softmax_cols.S", &named).unwrap();
        assert_eq!(default.metadata.parameters.get("EXP"), Some(&16));
        assert_eq!(
            default.object.to_bytes().unwrap(),
            explicit.object.to_bytes().unwrap()
        );
    }
}

#[test]
fn library_requests_resolve_to_one_softmax_cols_object_each() {
    // The three softmax_cols objects in the Bazel `kernels` order (default,
    // IN=32, IN=32 EXP=32) behind a library index: each request that names
    // the parameters telling the objects apart loads the object meant for
    // it; a request that fits two objects ({} and {IN: 32}) is an error
    // naming both, whatever the index order.
    use ipu_compiler::library::{KernelLibrary, KernelRequest};
    let dir = std::env::temp_dir().join(format!("softmax_cols_library_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let objects: [(&str, &[(&str, i64)]); 3] = [
        ("softmax_cols", &[]),
        ("softmax_cols_in32", &[("IN", 32)]),
        ("softmax_cols_in32_exp32", &[("IN", 32), ("EXP", 32)]),
    ];
    let mut entries = Vec::new();
    for (name, defines) in objects {
        let a = assemble("softmax_cols.S", defines).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join(format!("{name}.o")), a.object.to_bytes().unwrap()).unwrap();
        std::fs::write(dir.join(format!("{name}.json")), a.metadata.to_json()).unwrap();
        entries.push(format!(
            r#"{{"name": "{name}", "arch": "ipu21", "object": "{name}.o", "metadata": "{name}.json"}}"#
        ));
    }
    let index = dir.join("kernels.library.json");
    std::fs::write(
        &index,
        format!(r#"{{"kernels": [{}]}}"#, entries.join(", ")),
    )
    .unwrap();
    let mut library = KernelLibrary::open(&ipu_compiler::KernelSource::Index(index))
        .unwrap_or_else(|e| panic!("{e}"));
    for (params, ambiguous) in [
        (&[][..], "softmax_cols {"),
        (&[("IN", 32)][..], "softmax_cols_in32 {"),
    ] {
        let request = KernelRequest {
            entry: "softmax_cols".into(),
            source: "softmax_cols.S".into(),
            params: params.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        };
        let err = match library.get(&request) {
            Ok(k) => panic!("{request}: loaded {}, want an error", k.origin),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("matches several objects") && err.contains(ambiguous),
            "{err}"
        );
    }
    for (params, want) in [
        (&[("IN", 16)][..], "softmax_cols.o"),
        (&[("IN", 32), ("EXP", 16)][..], "softmax_cols_in32.o"),
        (&[("IN", 32), ("EXP", 32)][..], "softmax_cols_in32_exp32.o"),
    ] {
        let request = KernelRequest {
            entry: "softmax_cols".into(),
            source: "softmax_cols.S".into(),
            params: params.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        };
        let loaded = library.get(&request).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            loaded.origin.ends_with(want),
            "{request}: loaded {}, want {want}",
            loaded.origin
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// colmax_f16 alone over `x` ([rows, 4 * quads], bits widened to u32) on
/// `w` row ranges, maxima rows at MAXES: the chip and the compute cycles.
fn colmax_only(
    x: &[u32],
    rows: usize,
    quads: usize,
    w: usize,
    input: Input,
) -> (ipu_sim::Chip, u64) {
    let cols = 4 * quads;
    let elem = input.bytes();
    let rs_in = elem * cols + input.stride_pad();
    let mut data = vec![POISON; rows * rs_in];
    for r in 0..rows {
        let row: Vec<u8> = x[r * cols..(r + 1) * cols]
            .iter()
            .flat_map(|&v| match input {
                Input::F16 => (v as u16).to_le_bytes().to_vec(),
                Input::F32 | Input::F32Exp32 => v.to_le_bytes().to_vec(),
            })
            .collect();
        data[r * rs_in..r * rs_in + row.len()].copy_from_slice(&row);
    }
    let launches: Vec<Launch> = ranges_aligned(rows, w, 1)
        .iter()
        .enumerate()
        .map(|(i, &(r0, r1))| Launch {
            entry: "colmax_f16".into(),
            state: vec![
                IN + (r0 * rs_in) as u32,
                rs_in as u32,
                (r1 - r0) as u32,
                quads as u32,
                MAXES + (i * elem * cols) as u32,
            ],
        })
        .collect();
    simulate(
        &[Kernel {
            file: "colmax_f16.S",
            defines: input.defines(),
        }],
        &[launches],
        &[(IN, data), (MAXES, vec![POISON; 0x800])],
    )
}

/// The cycles of one colmax group alone (to split the two kernels' cycles).
fn colmax_only_cycles(case: &Case) -> u64 {
    let (x, _) = draw_scores(case, 4 * case.quads);
    colmax_only(&x, case.rows, case.quads, case.w, case.input).1
}

#[test]
fn cycles_against_formulas() {
    // (input, rows, quads, W = colmax vertices = softmax vertices, scratch
    // near OUT). The formulas are per vertex; six vertices run in
    // parallel, so the tile's time is the vertex with the most rows (plus
    // the supervisor's launches, which the 5% allow for on these shapes).
    for &(input, rows, quads, w, near) in &[
        (Input::F16, 368, 4, 6, false),
        (Input::F16, 368, 8, 6, false),
        (Input::F16, 368, 1, 6, false),
        (Input::F16, 61, 4, 1, false),
        (Input::F16, 368, 4, 6, true),
        (Input::F32, 368, 4, 6, false),
        (Input::F32, 368, 8, 6, false),
        (Input::F32, 368, 1, 6, false),
        (Input::F32, 61, 4, 1, false),
        (Input::F32Exp32, 368, 4, 6, false),
        (Input::F32Exp32, 368, 8, 6, false),
        (Input::F32Exp32, 368, 1, 6, false),
        (Input::F32Exp32, 61, 4, 1, false),
    ] {
        let case = Case {
            rows,
            quads,
            w,
            workers: w,
            scale: SCALES[0],
            input,
            values: Values::Uniform(6.0),
            in_place: true,
            scratch_near_out: near,
            mout_all: false,
            seed: 77,
        };
        let total = run_case(&case);
        let colmax = colmax_only_cycles(&case);
        let softmax = total - colmax;
        let max_rows = ranges_aligned(rows, w, 1)
            .iter()
            .map(|(a, b)| b - a)
            .max()
            .unwrap() as u64;
        let soft_rows = (0..w)
            .map(|i| (i + 1) * rows / w - i * rows / w)
            .max()
            .unwrap() as u64;
        let colmax_formula = declared_cycles(
            "colmax_f16.S",
            input.defines(),
            &[("ROWS", max_rows), ("QUADS", quads as u64)],
        );
        let softmax_formula = if near {
            // The slow path's count, documented next to `.cycles`.
            6 * (45 + quads as u64 * (10 + w as u64 + 4 * soft_rows))
        } else {
            declared_cycles(
                "softmax_cols.S",
                input.softmax_defines(),
                &[
                    ("ROWS", soft_rows),
                    ("QUADS", quads as u64),
                    ("W", w as u64),
                ],
            )
        };
        // What the formulas leave out: the harness's supervisor starts the
        // vertices 24 cycles apart (two `setzi` and a two-slot `run` each),
        // and the last vertex, the one with MOUT, spends 2 more bundles per
        // quad writing it (IN=16; IN=32 stores m either way, and its MOUT
        // vertex's entry is 3 bundles shorter).
        let stagger = 24 * (w as u64 - 1);
        let colmax_expect = colmax_formula + stagger;
        let softmax_expect = match input {
            Input::F16 => softmax_formula + stagger + 12 * quads as u64,
            Input::F32 | Input::F32Exp32 => softmax_formula + stagger,
        };
        // Lower bounds: every input byte read (colmax: f16 8 B, f32 16 B
        // per quad and row at 8 B per cycle); softmax: IN=16 exp at 4
        // lanes per 2 slots, IN=32 the 5 arithmetic slots per quad and row
        // (EXP=32: 8) over six workers.
        let bytes = (rows * 4 * input.bytes() * quads) as u64;
        let soft_bound = match input {
            Input::F16 => (rows * quads * 2) as u64,
            Input::F32 => (rows * quads * 5) as u64,
            Input::F32Exp32 => (rows * quads * 8) as u64,
        };
        println!(
            "{input:?} {rows} x {quads} quads, W {w}, scratch near OUT {near}: colmax simulated \
             {colmax} vs .cycles {colmax_formula} (+ launches {colmax_expect}), bound {}; \
             softmax_cols simulated {softmax} vs .cycles {softmax_formula} (+ launches and \
             MOUT {softmax_expect}), bound {soft_bound}",
            bytes / 8
        );
        for (what, sim, formula) in [
            ("colmax_f16", colmax, colmax_expect),
            ("softmax_cols", softmax, softmax_expect),
        ] {
            let ratio = formula as f64 / sim as f64;
            assert!(
                (0.95..=1.05).contains(&ratio),
                "{what} {input:?} {rows} x {quads} W {w}: .cycles {formula} vs simulated {sim}"
            );
        }
    }
}
