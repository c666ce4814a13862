//! A complete f16 GEMM kernel written against the ISA (six workers, AMP
//! streaming with `ld2x64st64`, partial sums chained through interleaved
//! memory), checked bit for bit against a phase-faithful reference and for
//! cycles against the machine model's calibration formula and compute bound.

mod common;
use common::*;

const K: usize = 32;
const C: usize = 32;
const X_BASE: u32 = 0x80000; // X[M + 2][K] f16, interleaved element 0
const T_BASE: u32 = 0x88000; // intermediate partial sums, element 1
const W_BASE: u32 = 0x98000; // weight blocks (kb, cb) of 16 x 16, element 3
const Z_BASE: u32 = 0xA0000; // 16 zero bytes, element 4
const S_BASE: u32 = 0x70000; // scratch for pipeline-fill stores (standard)
const Y_BASE: u32 = 0x60000; // Y[M][C] f16 (standard)

fn t_block(w: usize, cb: usize, mw: usize) -> u32 {
    T_BASE + ((w * 2 + cb) * ((mw + 2) * 32 + 64)) as u32
}

/// The code of one worker (`$m1` = worker index is folded in by the host:
/// each worker gets its own entry so that addresses are immediates).
fn worker_code(w: usize, mw: usize) -> String {
    let mut s = String::new();
    for cb in 0..C / 16 {
        for kb in 0..K / 16 {
            let row0 = w * mw;
            let x0 = X_BASE + (row0 * K * 2 + kb * 32) as u32;
            let (p0, p_code) = if kb == 0 {
                (Z_BASE, 3)
            } else {
                (t_block(w, cb, mw), 0)
            };
            let last = kb == K / 16 - 1;
            let (out, out_stride) = if last {
                (Y_BASE + (row0 * C * 2 + cb * 32) as u32, C * 2)
            } else {
                (t_block(w, cb, mw), 32)
            };
            let jump_x = K * 2 - 24;
            let jump_out = out_stride - 24;
            let wblk = W_BASE + ((kb * 2 + cb) * 512) as u32;
            s.push_str(&format!(
                "ampclr\nsetzi $m8, {wblk}\nld128 $a8:11, [$m8]+=16\n"
            ));
            for i in 1..32 {
                s.push_str(&format!(
                    "{{ ld128 $a8:11, [$m8]+=16 ; ampw $a8:11, {} }}\n",
                    i - 1
                ));
            }
            s.push_str("ampw $a8:11, 31\n");
            // Pace per position in a row: x jumps after its 4th chunk (pos 2), the
            // output pointer after the 4th output (pos 0); kb = 0 reads one zero pair.
            let pace = |pos: usize, out_code: u32| -> u32 {
                let x = if pos == 2 { 1 } else { 0 };
                let o = if pos == 0 { out_code } else { 0 };
                x | (p_code << 2) | (o << 4)
            };
            s.push_str(&format!(
                "setzi $m4, {x0}\nsetzi $m5, {p0}\nsetzi $m6, {S_BASE}\nsethi $m7, {}\nor $m7, $m7, {jump_x}\n\
                 ld64 $a0:1, [$m4]+=8\nld64 $a2:3, [$m5]+={}\n",
                jump_out << 4,
                if kb == 0 { 0 } else { 8 }
            ));
            // Pipeline fill: five bundles whose stores go to scratch (no increment).
            for i in 0..5 {
                let p = (pace(i % 4, 0) & 0b1111) | (3 << 4);
                s.push_str(&format!(
                    "{{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, {p} ; ampf16 $a4:5, $a0:1, $a2:3 }}\n"
                ));
            }
            s.push_str(&format!("setzi $m6, {out}\nsetzi $m2, {mw}\nrpt $m2, 4\n"));
            for pos in [1, 2, 3, 0] {
                s.push_str(&format!(
                    "{{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, {} ; ampf16 $a4:5, $a0:1, $a2:3 }}\n",
                    pace(pos, 2)
                ));
            }
        }
    }
    s.push_str("exit\n");
    s
}

fn program(m: usize) -> String {
    let mw = m / 6;
    let mut s = String::new();
    for w in 0..6 {
        s.push_str(&format!("setzi $m2, worker{w}\nrun $m2, $m3\n"));
    }
    s.push_str("wsync\nexit\n");
    for w in 0..6 {
        s.push_str(&format!("worker{w}:\n{}", worker_code(w, mw)));
    }
    s
}

/// The AMP's own arithmetic (docs/isa.md), block by block: the reference.
fn reference(x: &[f64], w: &[f64], m: usize) -> Vec<f64> {
    let mut y = vec![0f64; m * C];
    for cb in 0..C / 16 {
        let mut partial = vec![0f64; m * 16];
        for kb in 0..K / 16 {
            let mut out = vec![0f64; m * 16];
            for r in 0..m {
                let mut acc = [0f64; 16];
                for ph in 0..4 {
                    for (c, a) in acc.iter_mut().enumerate() {
                        let mut prod = 0.0;
                        for j in 0..4 {
                            let k = kb * 16 + 4 * ph + j;
                            prod += w[k * C + cb * 16 + c] * x[r * K + k];
                        }
                        let mut s = *a + prod;
                        if (4 * ph..4 * ph + 4).contains(&c) {
                            s += partial[r * 16 + c];
                        }
                        *a = f16_rne(s);
                    }
                }
                out[r * 16..r * 16 + 16].copy_from_slice(&acc);
            }
            partial = out;
        }
        for r in 0..m {
            y[r * C + cb * 16..r * C + cb * 16 + 16].copy_from_slice(&partial[r * 16..r * 16 + 16]);
        }
    }
    y
}

/// Runs the kernel on random inputs: (cycles, Y, reference Y, X, W).
fn run_gemm(m: usize) -> (u64, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut rng = Rng(99);
    let x: Vec<f64> = (0..m * K)
        .map(|_| f16_rne(rng.uniform(-1.0, 1.0)))
        .collect();
    let w: Vec<f64> = (0..K * C)
        .map(|_| f16_rne(rng.uniform(-1.0, 1.0)))
        .collect();
    // Weight blocks (kb, cb), each W[k][c] row-major 16 x 16.
    let mut wb = Vec::new();
    for kb in 0..K / 16 {
        for cb in 0..C / 16 {
            for k in 0..16 {
                for c in 0..16 {
                    wb.push(w[(kb * 16 + k) * C + cb * 16 + c]);
                }
            }
        }
    }
    let mut xs = x.clone();
    xs.resize((m + 2) * K, 0.0);
    let data = vec![
        (X_BASE, f16s(&xs)),
        (W_BASE, f16s(&wb)),
        (Z_BASE, vec![0u8; 16]),
    ];
    let chip = run_one(&program(m), &data).unwrap_or_else(|e| panic!("{e}"));
    let got = chip.peek(0, Y_BASE, (m * C * 2) as u32).unwrap();
    let y: Vec<f64> = got
        .chunks(2)
        .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
        .collect();
    let want = reference(&x, &w, m);
    (compute_cycles(&chip, 0, 0), y, want, x, w)
}

#[test]
fn gemm_matches_the_reference_and_the_calibration() {
    for m in [96, 384] {
        let (cycles, y, want, x, w) = run_gemm(m);
        assert_eq!(y, want, "M = {m}");
        // Sanity against exact arithmetic: f16 accumulation error stays small.
        for r in 0..m {
            for c in 0..C {
                let exact: f64 = (0..K).map(|k| x[r * K + k] * w[k * C + c]).sum();
                assert!(
                    (y[r * C + c] - exact).abs() < 0.02 * (1.0 + exact.abs()),
                    "row {r} col {c}"
                );
            }
        }
        let bound = (m * K * C) as u64 / ipu_arch::AMP_MACS_F16_F16 as u64;
        let calibration = ipu_arch::calibration::gemm_f16_cycles(m as u64, K as u64, C as u64);
        assert!(
            cycles >= bound,
            "M = {m}: {cycles} cycles beat the compute bound {bound}"
        );
        // A straightforward kernel lands near the hardware measurement.
        let ratio = cycles as f64 / calibration as f64;
        assert!(
            (0.7..1.4).contains(&ratio),
            "M = {m}: {cycles} cycles vs calibration {calibration}"
        );
        eprintln!(
            "GEMM M={m} K={K} C={C}: {cycles} cycles, calibration {calibration}, bound {bound}"
        );
    }
}
