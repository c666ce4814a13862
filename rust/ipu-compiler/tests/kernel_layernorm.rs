//! device/layernorm_f16.S on one simulated tile, checked against the f64
//! layer normalisation of `ipu_reference::ops::layernorm` on random inputs
//! at edge shapes (1x1, 3x5, 17x19, 6x1152 and more), with one and six
//! vertices, in place and not, and its cycles against `.cycles` and a bound.
//!
//! Tolerance. The kernel keeps its statistics in f32 and rounds the output
//! once to f16, so `|y - ref|` may be the f16 half-ulp `2^-11 |ref|` (plus
//! `2^-24` for subnormal results) plus what the f32 arithmetic before the
//! rounding can contribute, bounded from the kernel's operation order:
//! - the mean: `n/4 + n%4` f32 additions of group sums (each rounding at
//!   most `2^-24` of the running sum, which is at most `sum |x|`), then the
//!   multiplication by the rounded `1/n`: `dm <= (n/4 + n%4 + 1) 2^-24
//!   sum|x| / n + 2^-23 |mean|`, which moves `y` by `|gamma| r dm`;
//! - r = rsqrt(var + eps): the variance sums `n` squares in two f32 lanes
//!   (`n/2 + 4` roundings of at most `2^-24` relative), so `r` is off by at
//!   most `eps_r = (n/2 + 6) 2^-25 + 2^-23` relative, moving `y` by
//!   `|t gamma| eps_r` with `t = (x - mean) r`;
//! - d = x - mean, t = d r and the fused multiply-add onto beta round three
//!   times: `2^-22 (|t gamma| + |beta|)`.

mod kernel_common;

use ipu_isa::numerics::{f16_bits_to_f32, f64_to_f16_bits};
use kernel_common::*;

const LN_IN: u32 = 0x80000;
const LN_OUT: u32 = 0xA0000;
const LN_GAMMA: u32 = 0xC0000;
const LN_BETA: u32 = 0xC4000;
/// Per-worker scratch of layernorm_f16 (4 * COLS + 8 bytes each).
const LN_SCRATCH: u32 = 0xC8000;
const LN_SCRATCH_BYTES: u32 = 0x1400;

fn f16v(bits: u16) -> f64 {
    f16_bits_to_f32(bits) as f64
}

struct Case {
    rows: usize,
    cols: usize,
    /// Inputs are `offset + uniform(-spread, spread)`.
    offset: f64,
    spread: f64,
    eps: f32,
    workers: usize,
    in_place: bool,
    seed: u64,
}

/// Runs layernorm_f16 on one random case, checks every output and the
/// untouched bytes after each output row, and returns the compute cycles.
fn layernorm_case(case: &Case) -> u64 {
    let (rows, cols) = (case.rows, case.cols);
    let mut rng = Rng(case.seed);
    let rs_in = cols.div_ceil(4) * 8 + 8;
    let rs_out = if case.in_place { rs_in } else { rs_in + 8 };
    let out_base = if case.in_place { LN_IN } else { LN_OUT };
    assert!(4 * cols + 8 <= LN_SCRATCH_BYTES as usize);
    let x: Vec<u16> = (0..rows * cols)
        .map(|_| f64_to_f16_bits(case.offset + rng.uniform(-case.spread, case.spread)))
        .collect();
    let gamma: Vec<u16> = (0..cols)
        .map(|_| f64_to_f16_bits(rng.uniform(-2.0, 2.0)))
        .collect();
    let beta: Vec<u16> = (0..cols)
        .map(|_| f64_to_f16_bits(rng.uniform(-1.0, 1.0)))
        .collect();
    // Rows are padded with poison so that writes past COLS are caught.
    let mut input = vec![0xA5u8; rows * rs_in];
    for r in 0..rows {
        let row = f16_bytes(&x[r * cols..(r + 1) * cols]);
        input[r * rs_in..r * rs_in + row.len()].copy_from_slice(&row);
    }
    let mut memory = vec![
        (LN_IN, input.clone()),
        (LN_GAMMA, f16_bytes(&gamma)),
        (LN_BETA, f16_bytes(&beta)),
    ];
    if !case.in_place {
        memory.push((LN_OUT, vec![0xA5u8; rows * rs_out]));
    }
    let launches: Vec<Launch> = ranges_aligned(rows, case.workers, 1)
        .into_iter()
        .enumerate()
        .map(|(w, (r0, r1))| Launch {
            entry: "layernorm_f16".into(),
            state: vec![
                LN_IN + (r0 * rs_in) as u32,
                rs_in as u32,
                out_base + (r0 * rs_out) as u32,
                rs_out as u32,
                (r1 - r0) as u32,
                cols as u32,
                LN_GAMMA,
                LN_BETA,
                case.eps.to_bits(),
                LN_SCRATCH + LN_SCRATCH_BYTES * w as u32,
            ],
        })
        .collect();
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "layernorm_f16.S",
            defines: &[],
        }],
        &[launches],
        &memory,
    );
    let label = format!(
        "layernorm {rows}x{cols} offset {} eps {} workers {} in place {}",
        case.offset, case.eps, case.workers, case.in_place
    );
    let xf: Vec<f64> = x.iter().map(|&h| f16v(h)).collect();
    let gf: Vec<f64> = gamma.iter().map(|&h| f16v(h)).collect();
    let bf: Vec<f64> = beta.iter().map(|&h| f16v(h)).collect();
    let reference = ipu_reference::ops::layernorm(&xf, cols, &gf, &bf, case.eps as f64);
    let n = cols as f64;
    for r in 0..rows {
        let row = &xf[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let rstd = 1.0 / (var + case.eps as f64).sqrt();
        let abs_sum: f64 = row.iter().map(|v| v.abs()).sum();
        let adds = (cols / 4 + cols % 4 + 1) as f64;
        let dm = adds * 2f64.powi(-24) * abs_sum / n + 2f64.powi(-23) * mean.abs();
        let eps_r = (n / 2.0 + 6.0) * 2f64.powi(-25) + 2f64.powi(-23);
        let got = read_f16(&chip, out_base + (r * rs_out) as u32, cols);
        for c in 0..cols {
            let want = reference[r * cols + c];
            let tg = ((row[c] - mean) * rstd * gf[c]).abs();
            let tol = want.abs() * 2f64.powi(-11)
                + 2f64.powi(-24)
                + gf[c].abs() * rstd * dm
                + tg * eps_r
                + 2f64.powi(-22) * (tg + bf[c].abs());
            let g = f16v(got[c]);
            assert!(
                (g - want).abs() <= tol,
                "{label}: y[{r}, {c}] = {g} ({:#06x}), f64 reference {want}, tolerance {tol:e}",
                got[c]
            );
        }
        // The bytes between COLS and the row stride are untouched.
        let tail = chip
            .peek(
                0,
                out_base + (r * rs_out + 2 * cols) as u32,
                (rs_out - 2 * cols) as u32,
            )
            .unwrap();
        assert!(
            tail.iter().all(|&b| b == 0xA5),
            "{label}: row {r} wrote past its {cols} columns: {tail:02x?}"
        );
    }
    cycles
}

#[test]
fn layernorm_matches_f64_reference_on_edge_shapes() {
    let mut seed = 0;
    for &(rows, cols) in &[(1, 1), (3, 5), (17, 19), (6, 1152), (2, 4), (5, 8), (4, 3)] {
        for workers in [1, 6] {
            seed += 1;
            layernorm_case(&Case {
                rows,
                cols,
                offset: 0.0,
                spread: 3.0,
                eps: 1e-6,
                workers,
                in_place: false,
                seed,
            });
        }
    }
}

#[test]
fn layernorm_offsets_large_eps_and_in_place() {
    // A mean far from zero (the two-pass variance does not cancel), a large
    // epsilon that dominates the variance, and the output over the input.
    layernorm_case(&Case {
        rows: 7,
        cols: 77,
        offset: 24.0,
        spread: 0.5,
        eps: 1e-5,
        workers: 3,
        in_place: false,
        seed: 41,
    });
    layernorm_case(&Case {
        rows: 5,
        cols: 33,
        offset: 0.0,
        spread: 0.1,
        eps: 0.5,
        workers: 2,
        in_place: false,
        seed: 42,
    });
    layernorm_case(&Case {
        rows: 17,
        cols: 19,
        offset: -1.0,
        spread: 4.0,
        eps: 1e-5,
        workers: 6,
        in_place: true,
        seed: 43,
    });
}

#[test]
fn layernorm_constant_row_gives_beta() {
    // var = 0: with COLS a power of two, 1/COLS and so the mean are exact,
    // every d is exactly 0 and y = f16(0 * r * gamma + beta) = beta. (For
    // other COLS the rounded 1/COLS leaves d at a few f32 ulps of x.)
    let cols: usize = 16;
    let rs = cols.div_ceil(4) * 8 + 8;
    let x = vec![f64_to_f16_bits(3.25); cols];
    let gamma: Vec<u16> = (0..cols).map(|c| f64_to_f16_bits(c as f64 - 6.0)).collect();
    let beta: Vec<u16> = (0..cols)
        .map(|c| f64_to_f16_bits(0.125 * c as f64 - 0.5))
        .collect();
    let (chip, _) = simulate(
        &[Kernel {
            file: "layernorm_f16.S",
            defines: &[],
        }],
        &[vec![Launch {
            entry: "layernorm_f16".into(),
            state: vec![
                LN_IN,
                rs as u32,
                LN_OUT,
                rs as u32,
                1,
                cols as u32,
                LN_GAMMA,
                LN_BETA,
                1e-5f32.to_bits(),
                LN_SCRATCH,
            ],
        }]],
        &[
            (LN_IN, f16_bytes(&x)),
            (LN_GAMMA, f16_bytes(&gamma)),
            (LN_BETA, f16_bytes(&beta)),
        ],
    );
    assert_eq!(read_f16(&chip, LN_OUT, cols), beta);
}

#[test]
fn layernorm_cycles_against_bounds() {
    for &(rows, cols) in &[(6, 1152), (12, 72), (17, 19)] {
        let cycles = layernorm_case(&Case {
            rows,
            cols,
            offset: 0.0,
            spread: 3.0,
            eps: 1e-6,
            workers: 6,
            in_place: false,
            seed: 7,
        });
        let per_worker = rows.div_ceil(6) as u64;
        let estimate = declared_cycles(
            "layernorm_f16.S",
            &[],
            &[("ROWS", per_worker), ("COLS", cols as u64)],
        );
        // Lower bound: x in and y out (2 bytes each) at 8 B/cycle.
        let bound = (rows * cols * 4 / 8) as u64;
        println!(
            "layernorm_f16 {rows}x{cols}: simulated {cycles} cycles, .cycles {estimate}, lower bound {bound}"
        );
        assert!(cycles >= bound);
        let ratio = estimate as f64 / cycles as f64;
        assert!(
            (0.85..1.2).contains(&ratio),
            "estimate {estimate} vs simulated {cycles}"
        );
    }
}
