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

/// How the inputs are drawn.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Uniform in (-spread, spread).
    Uniform(f64),
    /// Magnitudes over many binades, signs mixed, with specials: the
    /// largest finite f16 (both signs), +0, -0, repeated values, and whole
    /// columns of one value or of mixed zeros.
    Wild,
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
            Values::Wild => {
                let k = rng.next() % 20;
                match k {
                    0 => 0x7BFF,               // 65504
                    1 => 0xFBFF,               // -65504
                    2 => 0x8000,               // -0
                    3 => 0x0000,               // +0
                    4 => f64_to_f16_bits(1.5), // repeated value
                    _ => {
                        let mag = rng.uniform(-16.0, 15.0).exp2();
                        let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
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
                x[r * cols + 1] = if rng.next() & 1 == 0 { 0x8000 } else { 0 };
            }
        }
    }
    x
}

/// Runs colmax_f16 then softmax_cols on one case, checks every written
/// value bit for bit and the untouched bytes, and returns the compute
/// cycles of the whole run (both groups).
fn run_case(case: &Case) -> u64 {
    let (rows, quads) = (case.rows, case.quads);
    let cols = 4 * quads;
    let label = format!("{case:?}");
    let mut rng = Rng(case.seed);
    let x = draw(&mut rng, case.values, cols, rows);
    let rs_in = 8 * quads + 8;
    let rs_out = if case.in_place { rs_in } else { rs_in + 16 };
    let out_base = if case.in_place { IN } else { OUT };
    // Input rows with poisoned stride padding and one poisoned row after.
    let mut input = vec![POISON; (rows + 1) * rs_in];
    for r in 0..rows {
        let row = f16_bytes(&x[r * cols..(r + 1) * cols]);
        input[r * rs_in..r * rs_in + row.len()].copy_from_slice(&row);
    }
    let out_bytes = (rows + 1) * rs_out;
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
                MAXES + (i * 8 * quads) as u32,
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
                defines: &[],
            },
            Kernel {
                file: "softmax_cols.S",
                defines: &[],
            },
        ],
        &[colmax, softmax],
        &memory,
    );

    // The partial maxima, then m, p and MOUT.
    let maxes: Vec<Vec<u16>> = col_ranges
        .iter()
        .map(|&(r0, r1)| emulate_colmax(&x, cols, r0..r1))
        .collect();
    for (i, want) in maxes.iter().enumerate() {
        let got = read_f16(&chip, MAXES + (i * 8 * quads) as u32, cols);
        assert_eq!(&got, want, "{label}: colmax vertex {i}");
    }
    let after_maxes = chip.peek(0, MAXES + (w * 8 * quads) as u32, 64).unwrap();
    assert!(
        after_maxes.iter().all(|&b| b == POISON),
        "{label}: colmax wrote past its W x {cols} maxima"
    );
    let s16 = f64_to_f16_bits(case.scale as f64);
    let m = emulate_m(&maxes, cols, s16);
    for r in 0..rows {
        let got = read_f16(&chip, out_base + (r * rs_out) as u32, cols);
        for c in 0..cols {
            let want = emulate_p(x[r * cols + c], m[c], s16);
            assert_eq!(
                got[c],
                want,
                "{label}: p[{r}, {c}] = {:#06x} ({}), emulation {want:#06x} ({}); x {:#06x}, m {:#06x}",
                got[c],
                f16v(got[c]),
                f16v(want),
                x[r * cols + c],
                m[c]
            );
        }
        let pad = chip
            .peek(
                0,
                out_base + (r * rs_out + 2 * cols) as u32,
                (rs_out - 2 * cols) as u32,
            )
            .unwrap();
        assert!(
            pad.iter().all(|&b| b == POISON),
            "{label}: row {r} wrote into its stride padding: {pad:02x?}"
        );
    }
    let past = chip
        .peek(0, out_base + (rows * rs_out) as u32, rs_out as u32)
        .unwrap();
    assert!(
        past.iter().all(|&b| b == POISON),
        "{label}: wrote the row after the last"
    );
    if !case.in_place {
        assert_eq!(
            chip.peek(0, IN, input.len() as u32).unwrap(),
            input,
            "{label}: IN changed"
        );
    }
    let m_f32: Vec<u32> = m.iter().map(|&h| f16_bits_to_f32(h).to_bits()).collect();
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
    }
    cycles
}

/// The scales: 1/sqrt(72) (SigLIP's head), 1, and 0.1 (not an f16 value:
/// s16 rounds).
const SCALES: [f32; 3] = [0.117_851_13, 1.0, 0.1];

#[test]
fn matches_emulation_on_all_shapes() {
    let mut seed = 100;
    for rows in [1, 2, 7, 61, 368] {
        for quads in [1, 4, 8] {
            for (wi, w) in [1, 3, 6].into_iter().enumerate() {
                for workers in [1, 6] {
                    seed += 1;
                    let values = match seed % 3 {
                        0 => Values::Uniform(6.0),
                        1 => Values::Uniform(3000.0),
                        _ => Values::Wild,
                    };
                    run_case(&Case {
                        rows,
                        quads,
                        w,
                        workers,
                        scale: SCALES[(seed as usize + wi) % 3],
                        values,
                        in_place: seed % 2 == 0,
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
fn slow_path_when_scratch_shares_out_element() {
    // The same results through the 4-slot loop: SCRATCH inside OUT's
    // element rules out `ld64st64`.
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

/// The cycles of one colmax group alone (to split the two kernels' cycles).
fn colmax_only_cycles(case: &Case) -> u64 {
    let cols = 4 * case.quads;
    let rs_in = 8 * case.quads + 8;
    let mut rng = Rng(case.seed);
    let x = draw(&mut rng, case.values, cols, case.rows);
    let mut input = vec![POISON; case.rows * rs_in];
    for r in 0..case.rows {
        let row = f16_bytes(&x[r * cols..(r + 1) * cols]);
        input[r * rs_in..r * rs_in + row.len()].copy_from_slice(&row);
    }
    let launches: Vec<Launch> = ranges_aligned(case.rows, case.w, 1)
        .iter()
        .enumerate()
        .map(|(i, &(r0, r1))| Launch {
            entry: "colmax_f16".into(),
            state: vec![
                IN + (r0 * rs_in) as u32,
                rs_in as u32,
                (r1 - r0) as u32,
                case.quads as u32,
                MAXES + (i * 8 * case.quads) as u32,
            ],
        })
        .collect();
    simulate(
        &[Kernel {
            file: "colmax_f16.S",
            defines: &[],
        }],
        &[launches],
        &[(IN, input)],
    )
    .1
}

#[test]
fn cycles_against_formulas() {
    // (rows, quads, W = colmax vertices = softmax vertices, scratch near
    // OUT). The formulas are per vertex; six vertices run in parallel, so
    // the tile's time is the vertex with the most rows (plus the
    // supervisor's launches, which the 5% allow for on these shapes).
    for &(rows, quads, w, near) in &[
        (368, 4, 6, false),
        (368, 8, 6, false),
        (368, 1, 6, false),
        (61, 4, 1, false),
        (368, 4, 6, true),
    ] {
        let case = Case {
            rows,
            quads,
            w,
            workers: w,
            scale: SCALES[0],
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
            &[],
            &[("ROWS", max_rows), ("QUADS", quads as u64)],
        );
        let softmax_formula = if near {
            // The slow path's count, documented next to `.cycles`.
            6 * (45 + quads as u64 * (10 + w as u64 + 4 * soft_rows))
        } else {
            declared_cycles(
                "softmax_cols.S",
                &[],
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
        // quad writing it.
        let stagger = 24 * (w as u64 - 1);
        let colmax_expect = colmax_formula + stagger;
        let softmax_expect = softmax_formula + stagger + 12 * quads as u64;
        // Lower bounds: every input byte read (colmax) and read + written
        // (softmax) at 8 B per cycle; exp at 4 lanes per 2 slots.
        let bytes = (rows * 8 * quads) as u64;
        println!(
            "{rows} x {quads} quads, W {w}, scratch near OUT {near}: colmax simulated {colmax} \
             vs .cycles {colmax_formula} (+ launches {colmax_expect}); softmax_cols simulated \
             {softmax} vs .cycles {softmax_formula} (+ launches and MOUT {softmax_expect}); \
             bounds: exp {}, bytes {}",
            (rows * quads * 2) as u64,
            2 * bytes / 8
        );
        for (what, sim, formula) in [
            ("colmax_f16", colmax, colmax_expect),
            ("softmax_cols", softmax, softmax_expect),
        ] {
            let ratio = formula as f64 / sim as f64;
            assert!(
                (0.95..=1.05).contains(&ratio),
                "{what} {rows} x {quads} W {w}: .cycles {formula} vs simulated {sim}"
            );
        }
    }
}
