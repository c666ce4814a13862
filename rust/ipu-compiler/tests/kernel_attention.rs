//! The attention kernels (device/softmax_rows.S, device/attention_online.S,
//! device/attention_final.S) on one simulated tile, checked against f64 host
//! references within documented tolerances, at the edge shapes of the SigLIP
//! workload (17 queries, 19 keys, head sizes 19 and 72) and at whole-head
//! sizes for the cycle figures. The simulator executes the kernels' machine
//! code; the host only prepares memory, reads results back and compares.
//!
//! Tolerances. Every kernel computes in f32 and rounds its output once to
//! f16, so an output `y` must satisfy `|y - ref| <= 2^-11 |ref| + ABS` with
//! the f16 half-ulp 2^-11 (relative) plus a small absolute term for the f32
//! arithmetic before the rounding and for results near zero (ABS = 2^-14,
//! 2^-14 being also the smallest normal f16). The f32 running state (m, l)
//! of the online update is compared with relative tolerance 1e-5.

use ipu_isa::numerics::{f16_bits_to_f32, f64_to_f16_bits};
use ipu_sim::{Chip, ChipConfig, Stop};
use std::path::PathBuf;

fn device_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../../device")
}

/// The tests' random inputs: the project's one SplitMix64 (ipu-rng).
use ipu_rng::SplitMix64 as Rng;

/// A random f16 in [lo, hi), as bits.
fn random_f16(rng: &mut Rng, lo: f64, hi: f64) -> u16 {
    f64_to_f16_bits(rng.uniform(lo, hi))
}

/// Random Q and K in [-2, 2) and V in [-1, 1): `nq` and `nk` rows of `d`.
fn random_qkv(rng: &mut Rng, nq: usize, nk: usize, d: usize) -> (Vec<u16>, Vec<u16>, Vec<u16>) {
    let mut draw = |n: usize, r: f64| (0..n).map(|_| random_f16(rng, -r, r)).collect::<Vec<u16>>();
    let q = draw(nq * d, 2.0);
    let k = draw(nk * d, 2.0);
    let v = draw(nk * d, 1.0);
    (q, k, v)
}

fn f16v(bits: u16) -> f64 {
    f16_bits_to_f32(bits) as f64
}

/// Splits `n` items into `parts` near-equal contiguous ranges.
fn ranges(n: usize, parts: usize) -> Vec<(usize, usize)> {
    (0..parts)
        .map(|i| (i * n / parts, (i + 1) * n / parts))
        .filter(|(a, b)| b > a)
        .collect()
}

/// One vertex launch: the kernel entry and its state words.
struct Launch {
    entry: &'static str,
    state: Vec<u32>,
}

/// Assembles the kernels and a supervisor that runs each group of launches
/// concurrently (one `run` per launch, then `wsync`), links them, loads
/// `memory` and runs one tile to its exit. Returns the chip (for reading
/// results) and the tile's compute cycles.
fn simulate(
    kernels: &[(&str, &[(&str, i64)])],
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
    for (file, defines) in kernels {
        let mut opts = ipu_asm::Options::default();
        for (k, v) in defines.iter() {
            opts.defines.insert((*k).into(), *v);
        }
        let kernel = ipu_asm::assemble_file(&device_dir().join(file), &opts)
            .unwrap_or_else(|e| panic!("{e}"));
        inputs.push(ipu_link::Input {
            name: format!("{file}.o"),
            object: kernel.object,
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

fn f16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_f16(chip: &Chip, addr: u32, n: usize) -> Vec<u16> {
    chip.peek(0, addr, 2 * n as u32)
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn read_f32(chip: &Chip, addr: u32, n: usize) -> Vec<f32> {
    chip.peek(0, addr, 4 * n as u32)
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The documented f16-output tolerance (module docs).
fn within_f16_tolerance(got: f64, want: f64) -> bool {
    (got - want).abs() <= want.abs() / 2048.0 + 1.0 / 16384.0
}

/// The kernel's declared `.cycles` formula (from the assembled object's
/// metadata) evaluated by the compiler's own evaluator, so that the tests
/// compare the simulator with what the cost model will use.
fn declared_cycles(file: &str, defines: &[(&str, i64)], vars: &[(&str, u64)]) -> u64 {
    let mut opts = ipu_asm::Options::default();
    for (k, v) in defines {
        opts.defines.insert((*k).into(), *v);
    }
    let assembly =
        ipu_asm::assemble_file(&device_dir().join(file), &opts).unwrap_or_else(|e| panic!("{e}"));
    let formula = assembly
        .metadata
        .cycles
        .unwrap_or_else(|| panic!("{file} declares no .cycles"));
    let vars: std::collections::BTreeMap<&str, i64> =
        vars.iter().map(|&(k, v)| (k, v as i64)).collect();
    ipu_compiler::formula::evaluate(&formula, &vars)
        .unwrap_or_else(|e| panic!("{file}: .cycles {formula:?}: {e}")) as u64
}

/// A row stride in bytes for `cols` values of `eb` bytes: a multiple of
/// 8, with 8 spare bytes so that a kernel ignoring the stride would be
/// caught.
fn row_stride(cols: usize, eb: usize) -> usize {
    cols.div_ceil(4) * 4 * eb + 8
}

// ---------------------------------------------------------------- softmax

const SM_IN: u32 = 0x80000;
const SM_OUT: u32 = 0xA0000;
/// Per-worker scratch of softmax_rows (4 * COLS + 16 bytes each; TYPE=32:
/// 4 * COLS + 24).
const SM_SCRATCH: u32 = 0xC0000;
const SM_SCRATCH_BYTES: u32 = 0x1000;

/// Runs softmax_rows on `rows x cols` random inputs (spread `spread`)
/// split over `workers`, checks every output against the f64 softmax and
/// returns the compute cycles: f16 rows, or f32 rows (TYPE=32) checked
/// against the f64 softmax of the f32 inputs within the f32 arithmetic's
/// error. The argument `x s - m` is one fused multiply-add (at most
/// `2^-24 (|x s| + |m|)` absolute, so relative in `e`); the sum has
/// `cols / 2 + 2` roundings per lane of at most `2^-24` of the sum; the
/// reciprocal and the product one each.
fn softmax_case(
    f32_rows: bool,
    (rows, cols): (usize, usize),
    scale: f32,
    spread: f64,
    workers: usize,
    seed: u64,
) -> u64 {
    let mut rng = Rng(seed);
    let eb = if f32_rows { 4 } else { 2 };
    let rs_in = row_stride(cols, eb);
    let rs_out = rs_in + 8;
    assert!(4 * cols + 24 <= SM_SCRATCH_BYTES as usize);
    // Inputs as f64 values of the row type.
    let x: Vec<f64> = (0..rows * cols)
        .map(|_| {
            let v = rng.uniform(-spread, spread);
            if f32_rows {
                v as f32 as f64
            } else {
                f16v(f64_to_f16_bits(v))
            }
        })
        .collect();
    let encode = |v: &[f64]| -> Vec<u8> {
        if f32_rows {
            v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect()
        } else {
            v.iter()
                .flat_map(|&x| f64_to_f16_bits(x).to_le_bytes())
                .collect()
        }
    };
    // Rows padded with poison after COLS (and 8 bytes after the last row,
    // the TYPE=32 over-read): only the values decide the outputs.
    let mut input = vec![0xA5u8; rows * rs_in + 8];
    for r in 0..rows {
        let row = encode(&x[r * cols..(r + 1) * cols]);
        input[r * rs_in..r * rs_in + row.len()].copy_from_slice(&row);
    }
    // Poison the output so that unwritten elements fail.
    let poison = vec![0xFFu8; rows * rs_out];
    let launches: Vec<Launch> = ranges(rows, workers)
        .into_iter()
        .enumerate()
        .map(|(w, (r0, r1))| Launch {
            entry: "softmax_rows",
            state: vec![
                SM_IN + (r0 * rs_in) as u32,
                rs_in as u32,
                SM_OUT + (r0 * rs_out) as u32,
                rs_out as u32,
                (r1 - r0) as u32,
                cols as u32,
                scale.to_bits(),
                SM_SCRATCH + SM_SCRATCH_BYTES * w as u32,
            ],
        })
        .collect();
    let defines: &[(&str, i64)] = if f32_rows { &[("TYPE", 32)] } else { &[] };
    let (chip, cycles) = simulate(
        &[("softmax_rows.S", defines)],
        &[launches],
        &[(SM_IN, input), (SM_OUT, poison)],
    );
    for r in 0..rows {
        let t: Vec<f64> = (0..cols).map(|c| x[r * cols + c] * scale as f64).collect();
        let m = t.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = t.iter().map(|v| (v - m).exp()).sum();
        let at = SM_OUT + (r * rs_out) as u32;
        let bytes = chip.peek(0, at, (rs_out) as u32).unwrap();
        // Nothing between COLS and the row stride is written.
        assert!(
            bytes[eb * cols..].iter().all(|&b| b == 0xFF),
            "softmax {rows}x{cols}: row {r} wrote past its {cols} columns"
        );
        let t_max = t.iter().fold(m.abs(), |a, v| a.max(v.abs()));
        let rel_f32 = 2f64.powi(-24) * (2.0 * (t_max + m.abs()) + cols as f64 + 8.0);
        for c in 0..cols {
            let want = (t[c] - m).exp() / sum;
            let (g, ok) = if f32_rows {
                let b = &bytes[4 * c..4 * c + 4];
                let g = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
                (g, (g - want).abs() <= rel_f32 * want + 1e-38)
            } else {
                let g = f16v(u16::from_le_bytes([bytes[2 * c], bytes[2 * c + 1]]));
                (g, within_f16_tolerance(g, want))
            };
            assert!(
                ok,
                "softmax (f32 rows: {f32_rows}) {rows}x{cols} scale {scale} workers {workers}: y[{r}, {c}] = {g}, f64 reference {want}"
            );
        }
    }
    cycles
}

/// f16 rows and (TYPE=32) f32 rows.
#[test]
fn softmax_rows_matches_f64_reference_on_edge_shapes() {
    for f32_rows in [false, true] {
        for &(rows, cols) in &[(1, 1), (1, 3), (2, 4), (17, 19), (5, 72), (17, 729), (3, 6)] {
            for workers in [1, 6] {
                let seed = (rows * 1000 + cols) as u64;
                softmax_case(f32_rows, (rows, cols), 1.0, 4.0, workers, seed);
            }
        }
        // The attention scale and a wide spread (exponentials underflow to 0).
        softmax_case(f32_rows, (17, 19), 1.0 / (72f32).sqrt(), 60.0, 3, 7);
        softmax_case(f32_rows, (4, 33), 0.5, 30.0, 2, 8);
    }
}

#[test]
fn softmax_rows_cycles_against_bounds() {
    for (f32_rows, &(rows, cols)) in [false, true]
        .into_iter()
        .flat_map(|t| [(6, 729), (48, 72), (17, 19)].iter().map(move |s| (t, s)))
    {
        let cycles = softmax_case(f32_rows, (rows, cols), 1.0, 4.0, 6, 11);
        let per_worker = rows.div_ceil(6) as u64;
        let defines: &[(&str, i64)] = if f32_rows { &[("TYPE", 32)] } else { &[] };
        let estimate = declared_cycles(
            "softmax_rows.S",
            defines,
            &[("ROWS", per_worker), ("COLS", cols as u64)],
        );
        // Lower bounds: the bytes in and out at 8 B/cycle, and the
        // exponentials at the fastest exp rate of the ISA (f16v4exp: four
        // lanes per two issue slots, six workers: 2 per cycle).
        let bytes = (rows * cols * if f32_rows { 8 } else { 4 }) as u64;
        let exps = (rows * cols) as u64;
        let bound = (bytes / 8).max(exps / 2);
        println!(
            "softmax_rows (f32 rows: {f32_rows}) {rows}x{cols}: simulated {cycles} cycles, .cycles {estimate}, lower bound {bound} (bytes/8 = {}, exp/2 = {})",
            bytes / 8,
            exps / 2
        );
        assert!(cycles >= bound);
        let ratio = estimate as f64 / cycles as f64;
        assert!(
            (0.85..1.2).contains(&ratio),
            "estimate {estimate} vs simulated {cycles}"
        );
    }
}

// ------------------------------------------------------ flash attention

const AT_S: u32 = 0x80000;
const AT_V: u32 = 0x90000;
const AT_O: u32 = 0xA0000;
const AT_ML: u32 = 0xB0000;
const AT_OUT: u32 = 0xB8000;
/// Per-worker p scratch of attention_online (0x800 bytes each: BK <= 256).
const AT_PBUF: u32 = 0xC0000;

struct AttentionCase {
    queries: usize,
    keys: usize,
    head: usize,
    block: usize,
    causal: bool,
    /// Sequence index of query row 0 (keys start at 0).
    q0: usize,
    workers: usize,
    seed: u64,
    /// f32 V and result (attention_online VT=32, attention_final OUT=32):
    /// f32 attention.
    f32: bool,
}

/// Runs attention_online over every K/V block and then attention_final,
/// checks the running state (m, l) after the last block and the f16 output
/// against the f64 reference computed from the same f32 scores. Returns
/// the compute cycles of the whole run (every update and the final group).
fn attention_case(case: &AttentionCase) -> u64 {
    let mut rng = Rng(case.seed);
    let (nq, nk, d) = (case.queries, case.keys, case.head);
    let dq = d.div_ceil(4);
    let scale = 1.0 / (d as f32).sqrt();
    // Scores as the f32 output of gemm_f16 ACC=32 would hold them: the f64
    // product of f16 inputs rounded to f32.
    let (q, k, v) = random_qkv(&mut rng, nq, nk, d);
    // V's values: the f16 draws, or f32 values with all their bits.
    let vf: Vec<f32> = if case.f32 {
        (0..nk * d).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()
    } else {
        v.iter().map(|&b| f16_bits_to_f32(b)).collect()
    };
    let s: Vec<f32> = (0..nq * nk)
        .map(|ij| {
            let (i, j) = (ij / nk, ij % nk);
            (0..d)
                .map(|c| f16v(q[i * d + c]) * f16v(k[j * d + c]))
                .sum::<f64>() as f32
        })
        .collect();
    let visible = |i: usize, j: usize| !case.causal || j <= case.q0 + i;

    let blocks: Vec<(usize, usize)> = (0..nk.div_ceil(case.block))
        .map(|b| (b * case.block, ((b + 1) * case.block).min(nk)))
        .collect();
    let eb = if case.f32 { 4 } else { 2 };
    let rs_v = 4 * eb * dq + 8;
    let rs_o = 16 * dq + 8;
    let rs_out = 4 * eb * dq + 8;
    let mut memory = Vec::new();
    let mut v_bytes = vec![0u8; nk * rs_v];
    for j in 0..nk {
        let row = if case.f32 {
            f32_bytes(&vf[j * d..(j + 1) * d])
        } else {
            f16_bytes(&v[j * d..(j + 1) * d])
        };
        v_bytes[j * rs_v..j * rs_v + row.len()].copy_from_slice(&row);
    }
    memory.push((AT_V, v_bytes));
    memory.push((AT_O, vec![0u8; nq * rs_o]));
    let ml: Vec<f32> = (0..nq).flat_map(|_| [f32::NEG_INFINITY, 0.0]).collect();
    memory.push((AT_ML, f32_bytes(&ml)));
    memory.push((AT_OUT, vec![0xFFu8; nq * rs_out]));
    let mut groups = Vec::new();
    let mut s_addr = AT_S;
    for &(k0, k1) in &blocks {
        let bk = k1 - k0;
        let rs_s = 4 * bk + 4;
        let mut block = vec![0u8; nq * rs_s];
        for i in 0..nq {
            let row = f32_bytes(&s[i * nk + k0..i * nk + k1]);
            block[i * rs_s..i * rs_s + row.len()].copy_from_slice(&row);
        }
        memory.push((s_addr, block));
        groups.push(
            ranges(nq, case.workers)
                .into_iter()
                .enumerate()
                .map(|(w, (r0, r1))| Launch {
                    entry: "attention_online",
                    state: vec![
                        s_addr + (r0 * rs_s) as u32,
                        rs_s as u32,
                        AT_V + (k0 * rs_v) as u32,
                        rs_v as u32,
                        AT_O + (r0 * rs_o) as u32,
                        rs_o as u32,
                        AT_ML + (8 * r0) as u32,
                        (r1 - r0) as u32,
                        bk as u32,
                        dq as u32,
                        scale.to_bits(),
                        (case.q0 + r0) as u32,
                        k0 as u32,
                        AT_PBUF + 0x800 * w as u32,
                    ],
                })
                .collect(),
        );
        s_addr += (nq * rs_s).div_ceil(16) as u32 * 16;
    }
    assert!(s_addr <= AT_V, "scores overflow their area");
    groups.push(
        ranges(nq, case.workers)
            .into_iter()
            .map(|(r0, r1)| Launch {
                entry: "attention_final",
                state: vec![
                    AT_O + (r0 * rs_o) as u32,
                    rs_o as u32,
                    AT_ML + (8 * r0) as u32,
                    AT_OUT + (r0 * rs_out) as u32,
                    rs_out as u32,
                    (r1 - r0) as u32,
                    dq as u32,
                ],
            })
            .collect(),
    );
    let online = [("CAUSAL", case.causal as i64), ("VT", 8 * eb as i64)];
    let final_ = [("OUT", 8 * eb as i64)];
    let (chip, total_cycles) = simulate(
        &[
            ("attention_online.S", &online),
            ("attention_final.S", &final_),
        ],
        &groups,
        &memory,
    );
    let label = format!(
        "attention q={nq} k={nk} d={d} block={} causal={} q0={} workers={} f32={}",
        case.block, case.causal, case.q0, case.workers, case.f32
    );
    let ml_got = read_f32(&chip, AT_ML, 2 * nq);
    for i in 0..nq {
        let t: Vec<(usize, f64)> = (0..nk)
            .filter(|&j| visible(i, j))
            .map(|j| (j, s[i * nk + j] as f64 * scale as f64))
            .collect();
        assert!(!t.is_empty(), "{label}: the test gives every row a key");
        let m = t.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = t.iter().map(|x| (x.1 - m).exp()).sum();
        let (gm, gl) = (ml_got[2 * i] as f64, ml_got[2 * i + 1] as f64);
        assert!(
            (gm - m).abs() <= 1e-5 * m.abs().max(1.0) && (gl - l).abs() <= 1e-5 * l,
            "{label}: row {i}: (m, l) = ({gm}, {gl}), f64 reference ({m}, {l})"
        );
        let out: Vec<f64> = if case.f32 {
            read_f32(&chip, AT_OUT + (i * rs_out) as u32, 4 * dq)
                .into_iter()
                .map(f64::from)
                .collect()
        } else {
            read_f16(&chip, AT_OUT + (i * rs_out) as u32, 4 * dq)
                .into_iter()
                .map(f16v)
                .collect()
        };
        for (c, &g) in out.iter().enumerate().take(d) {
            let terms = t
                .iter()
                .map(|&(j, x)| ((x - m).exp(), vf[j * d + c] as f64));
            let want: f64 = terms.clone().map(|(p, v)| p * v).sum::<f64>() / l;
            // f32 results: the f32 exponentials, sums and products err by a
            // few units of 2^-24 of the terms' magnitude (one f16 rounding
            // would be 2^-11 of the value).
            let magnitude: f64 = terms.map(|(p, v)| p * v.abs()).sum::<f64>() / l;
            let within = if case.f32 {
                (g - want).abs() <= 1e-5 * magnitude
            } else {
                within_f16_tolerance(g, want)
            };
            assert!(within, "{label}: out[{i}, {c}] = {g}, f64 reference {want}");
        }
        for (c, &h) in out.iter().enumerate().skip(d) {
            assert_eq!(h, 0.0, "{label}: padding column out[{i}, {c}] must be zero");
        }
    }
    total_cycles
}

#[test]
fn flash_attention_matches_f64_reference_on_edge_shapes() {
    let mut seed = 1;
    for &(queries, keys, head, block) in &[
        (17, 19, 19, 19),
        (17, 19, 72, 19),
        (17, 38, 72, 19),
        (17, 57, 19, 19),
        (1, 1, 1, 1),
        (6, 40, 72, 16),
    ] {
        for causal in [false, true] {
            for workers in [1, 6] {
                for f32 in [false, true] {
                    seed += 1;
                    attention_case(&AttentionCase {
                        queries,
                        keys,
                        head,
                        block,
                        causal,
                        q0: 0,
                        workers,
                        seed,
                        f32,
                    });
                }
            }
        }
    }
}

#[test]
fn causal_offsets_skip_fully_masked_rows_of_a_block() {
    // Queries 20..37 against keys 0..57 in blocks of 19: the third block
    // (keys 38..56) is invisible to every row, the second partly visible.
    for q0 in [0, 5, 20] {
        for f32 in [false, true] {
            attention_case(&AttentionCase {
                queries: 17,
                keys: 57,
                head: 72,
                block: 19,
                causal: true,
                q0,
                workers: 4,
                seed: 100 + q0 as u64,
                f32,
            });
        }
    }
}

#[test]
fn flash_attention_cycles_against_bounds() {
    // One K/V block's update = (run with two equal blocks) - (run with one):
    // the supervisor launch and the final normalisation cancel out.
    for &(queries, block, head, f32) in &[
        (24, 64, 72, false),
        (17, 19, 72, false),
        (12, 128, 72, false),
        (24, 64, 72, true),
        (17, 19, 72, true),
        (12, 128, 18, true),
    ] {
        let run = |blocks: usize| {
            attention_case(&AttentionCase {
                queries,
                keys: blocks * block,
                head,
                block,
                causal: false,
                q0: 0,
                workers: 6,
                seed: 5,
                f32,
            })
        };
        let (one, two) = (run(1), run(2));
        let update = two - one;
        let rows = queries.div_ceil(6) as u64;
        let (bk, dq) = (block as u64, head.div_ceil(4) as u64);
        let vt = if f32 { 32 } else { 16 };
        let estimate = declared_cycles(
            "attention_online.S",
            &[("CAUSAL", 0), ("VT", vt)],
            &[("ROWS", rows), ("BK", bk), ("DQ", dq)],
        );
        // Lower bounds for one update: the P V MACs at the AMP's f32-
        // accumulating rate (32 MAC/cycle) and the exponentials at the
        // fastest exp rate (2 per cycle); the Q K^T product is not counted.
        let macs = (queries * block * head) as u64;
        let exps = (queries * block) as u64;
        let bound = (macs / 32).max(exps / 2);
        println!(
            "attention_online VT={vt} q={queries} block={block} d={head}: simulated {update} cycles per block, .cycles {estimate}, lower bound {bound} (MAC/32 = {}, exp/2 = {}); whole run with one block {one}",
            macs / 32,
            exps / 2
        );
        assert!(update >= bound);
        let ratio = estimate as f64 / update as f64;
        assert!(
            (0.85..1.2).contains(&ratio),
            "estimate {estimate} vs simulated {update}"
        );
    }
}

// ------------------------------------ scores on gemm_f16, end to end

/// The gemm_f16 test layout (as in kernel_gemm.rs): A, CA and CB in
/// different 32 KiB interleaved elements, B after them.
const GE_A: u32 = 0x80000;
const GE_CA: u32 = 0x98000;
const GE_CB: u32 = 0xB0000;
const GE_B: u32 = 0xC8000;
/// The attention buffers of the end-to-end runs (region 0).
const E2_V: u32 = 0x60000;
const E2_O: u32 = 0x68000;
const E2_ML: u32 = 0x70000;
const E2_OUT: u32 = 0x74000;
const E2_PBUF: u32 = 0x78000;
/// PV=1: the rescaling factors, P (A operand of the P V GEMM, its own
/// interleaved element) and V as the GEMM's B operand.
const E2_ALPHA: u32 = 0x7C000;
const E2_P: u32 = 0x88000;
const E2_VB: u32 = 0xD8000;

/// Who sums p in an online step of f16 P on the AMP: the vertex in f32
/// after f32 exponentials (EXP=32), the vertex after f16 exponentials
/// (EXP=16, `f16v4hsum`), or P V's ones column (EXP=16 ONES=1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sums {
    F32,
    F16,
    Ones,
}

/// Flash attention as the compiler will lower it: per K/V block, S = Q K^T
/// on gemm_f16 (ACC=32: f32 scores, K^T as the B operand with the head
/// dimension padded with zeros to a multiple of 16), then attention_online
/// reading S straight from the GEMM's C buffer; at the end attention_final.
/// Checked against the f64 attention of the f16 inputs (no f32 rounding of
/// the scores in the reference). With `f32` the same for f32 attention:
/// f32 Q, K and V, the scores and (PV=1) P V on gemm_f32 with f32 P
/// (`attention_online` PT=32), or P V on the vector unit (VT=32), and an
/// f32 result (`attention_final` OUT=32). `sums` (f16 with PV=1 only but
/// [`Sums::F32`]) picks the online step's exponentials and who sums p, as
/// the compiler does by head width. Returns the compute cycles.
#[allow(clippy::too_many_arguments)]
fn attention_end_to_end(
    queries: usize,
    keys: usize,
    head: usize,
    block: usize,
    causal: bool,
    pv_on_amp: bool,
    f32: bool,
    sums: Sums,
    seed: u64,
) -> u64 {
    assert!(
        sums == Sums::F32 || (pv_on_amp && !f32),
        "f16 exponentials need f16 P V on the AMP"
    );
    let ones = sums == Sums::Ones;
    let mut rng = Rng(seed);
    let (nq, nk, d) = (queries, keys, head);
    let dq = d.div_ceil(4);
    let dp = d.div_ceil(16) * 16;
    let scale = 1.0 / (d as f32).sqrt();
    let (q, k, v) = random_qkv(&mut rng, nq, nk, d);
    // The values: the f16 draws, or f32 values with all their bits.
    let (q, k, v): (Vec<f32>, Vec<f32>, Vec<f32>) = if f32 {
        let mut draw = |n: usize, r: f64| {
            (0..n)
                .map(|_| rng.uniform(-r, r) as f32)
                .collect::<Vec<f32>>()
        };
        (draw(nq * d, 2.0), draw(nk * d, 2.0), draw(nk * d, 1.0))
    } else {
        let values = |x: &[u16]| x.iter().map(|&b| f16_bits_to_f32(b)).collect::<Vec<f32>>();
        (values(&q), values(&k), values(&v))
    };
    let eb = if f32 { 4 } else { 2 };
    // Bytes of values in the run's element type (f16 values convert back
    // to their own bits).
    let bytes = |x: &[f32]| -> Vec<u8> {
        if f32 {
            f32_bytes(x)
        } else {
            let bits: Vec<u16> = x.iter().map(|&y| f64_to_f16_bits(y as f64)).collect();
            f16_bytes(&bits)
        }
    };
    let gemm = if f32 { "gemm_f32" } else { "gemm_f16" };

    // A = Q, rows padded to dp with zeros, two spare rows after the last.
    let rs_a = dp * eb;
    let mut a_mem = vec![0u8; (nq + 2) * rs_a];
    for i in 0..nq {
        let row = bytes(&q[i * d..(i + 1) * d]);
        a_mem[i * rs_a..i * rs_a + row.len()].copy_from_slice(&row);
    }
    let nkb = dp / 16;
    let (first, second) = if nkb % 2 == 1 {
        (GE_CA, GE_CB)
    } else {
        (GE_CB, GE_CA)
    };
    // K block 0 writes `first`; choosing it by the parity of NKB puts the
    // last K block's result in GE_CA whatever the head size.
    let last = GE_CA;
    let rs_v = 4 * eb * dq + 8;
    let rs_o = 16 * dq + 8;
    let rs_out = 4 * eb * dq + 8;
    assert!(
        nk * rs_v <= (E2_O - E2_V) as usize,
        "V ({nk} rows of {rs_v} bytes) overflows its test area"
    );
    let mut v_mem = vec![0u8; nk * rs_v];
    for j in 0..nk {
        let row = bytes(&v[j * d..(j + 1) * d]);
        v_mem[j * rs_v..j * rs_v + row.len()].copy_from_slice(&row);
    }
    let ml: Vec<f32> = (0..nq).flat_map(|_| [f32::NEG_INFINITY, 0.0]).collect();
    let mut memory = vec![
        (GE_A, a_mem),
        (E2_V, v_mem),
        (E2_O, vec![0u8; nq * rs_o]),
        (E2_ML, f32_bytes(&ml)),
        (E2_OUT, vec![0xFFu8; nq * rs_out]),
        (GE_CA, vec![0u8; 8]),
        (GE_CB, vec![0u8; 8]),
    ];
    let mut groups = Vec::new();
    let mut b_addr = GE_B;
    let mut vb_addr = E2_VB;
    // P rows (PV=1): keys padded to 16 for the GEMM, two spare zero rows.
    let bkp_max = block.div_ceil(16) * 16;
    let rs_p = bkp_max * eb;
    memory.push((E2_P, vec![0u8; (nq + 2) * rs_p]));
    for k0 in (0..nk).step_by(block) {
        let k1 = (k0 + block).min(nk);
        let bk = k1 - k0;
        let ncb = bk.div_ceil(16);
        let bkp = ncb * 16;
        // B = K^T of this block: [dp, 16 * ncb], zero padded.
        let rs_b = ncb * 16 * eb;
        let mut b_mem = vec![0u8; dp * rs_b];
        for j in k0..k1 {
            for c in 0..d {
                b_mem[c * rs_b + eb * (j - k0)..][..eb].copy_from_slice(&bytes(&[k[j * d + c]]));
            }
        }
        memory.push((b_addr, b_mem));
        // C rows: a 16-byte zero word, two junk rows, then the nq rows.
        let rs_c = ncb * 16 * 4;
        let c_row0 = (16 + 2 * rs_c) as u32;
        assert!(16 + (nq + 4) * rs_c <= (GE_CB - GE_CA) as usize);
        // One gemm_f16 vertex per column block of 16 keys (at most six).
        assert!(ncb <= 6);
        groups.push(
            (0..ncb)
                .map(|cb| Launch {
                    entry: gemm,
                    state: vec![
                        GE_A,
                        rs_a as u32,
                        b_addr + (cb * 16 * eb) as u32,
                        rs_b as u32,
                        first + c_row0 + (cb * 64) as u32,
                        second + c_row0 + (cb * 64) as u32,
                        rs_c as u32,
                        second,
                        nq as u32,
                        nkb as u32,
                        1,
                    ],
                })
                .collect(),
        );
        b_addr += (dp * rs_b) as u32;
        groups.push(
            ranges(nq, 6)
                .into_iter()
                .enumerate()
                .map(|(w, (r0, r1))| Launch {
                    entry: "attention_online",
                    state: vec![
                        last + c_row0 + (r0 * rs_c) as u32,
                        rs_c as u32,
                        E2_V + (k0 * rs_v) as u32,
                        rs_v as u32,
                        E2_O + (r0 * rs_o) as u32,
                        rs_o as u32,
                        E2_ML + (8 * r0) as u32,
                        (r1 - r0) as u32,
                        bk as u32,
                        dq as u32,
                        scale.to_bits(),
                        r0 as u32,
                        k0 as u32,
                        E2_PBUF + 0x800 * w as u32,
                        E2_P + (r0 * rs_p) as u32,
                        rs_p as u32,
                        bkp as u32,
                        E2_ALPHA + (4 * r0) as u32,
                    ],
                })
                .collect(),
        );
        if pv_on_amp {
            // PV = P V on gemm_f16 ACC=32, one vertex per column block of
            // 16 head columns; B = V of the block padded to [bkp, pv_cols]
            // (with `ones`, column 4 DQ all ones).
            let pv_cols = if ones {
                (4 * dq + 1).div_ceil(16) * 16
            } else {
                dp
            };
            let rs_vb = pv_cols * eb;
            let mut vb = vec![0u8; bkp * rs_vb];
            for j in k0..k1 {
                let row = bytes(&v[j * d..(j + 1) * d]);
                vb[(j - k0) * rs_vb..(j - k0) * rs_vb + row.len()].copy_from_slice(&row);
            }
            if ones {
                for j in 0..bkp {
                    vb[j * rs_vb + 2 * 4 * dq..][..2].copy_from_slice(&0x3C00u16.to_le_bytes());
                }
            }
            memory.push((vb_addr, vb));
            let nkb_v = bkp / 16;
            let (first_v, second_v) = if nkb_v % 2 == 1 {
                (GE_CA, GE_CB)
            } else {
                (GE_CB, GE_CA)
            };
            let rs_cv = pv_cols * 4;
            let cv_row0 = (16 + 2 * rs_cv) as u32;
            assert!(16 + (nq + 4) * rs_cv <= (GE_CB - GE_CA) as usize);
            groups.push(
                (0..pv_cols / 16)
                    .map(|cb| Launch {
                        entry: gemm,
                        state: vec![
                            E2_P,
                            rs_p as u32,
                            vb_addr + (cb * 16 * eb) as u32,
                            rs_vb as u32,
                            first_v + cv_row0 + (cb * 64) as u32,
                            second_v + cv_row0 + (cb * 64) as u32,
                            rs_cv as u32,
                            second_v,
                            nq as u32,
                            nkb_v as u32,
                            1,
                        ],
                    })
                    .collect(),
            );
            vb_addr += (bkp * rs_vb) as u32;
            groups.push(
                ranges(nq, 6)
                    .into_iter()
                    .map(|(r0, r1)| Launch {
                        entry: "attention_merge",
                        state: vec![
                            E2_O + (r0 * rs_o) as u32,
                            rs_o as u32,
                            GE_CA + cv_row0 + (r0 * rs_cv) as u32,
                            rs_cv as u32,
                            E2_ALPHA + (4 * r0) as u32,
                            (r1 - r0) as u32,
                            dq as u32,
                            E2_ML + (8 * r0) as u32,
                        ],
                    })
                    .collect(),
            );
        }
    }
    assert!(vb_addr <= 0xE4000, "V blocks overflow the test layout");
    groups.push(
        ranges(nq, 6)
            .into_iter()
            .map(|(r0, r1)| Launch {
                entry: "attention_final",
                state: vec![
                    E2_O + (r0 * rs_o) as u32,
                    rs_o as u32,
                    E2_ML + (8 * r0) as u32,
                    E2_OUT + (r0 * rs_out) as u32,
                    rs_out as u32,
                    (r1 - r0) as u32,
                    dq as u32,
                ],
            })
            .collect(),
    );
    // f32: V in f32 for the vector unit (VT=32) or P in f32 for gemm_f32
    // (PT=32).
    let wide = 8 * eb as i64;
    let online = [
        ("CAUSAL", causal as i64),
        ("PV", pv_on_amp as i64),
        (if pv_on_amp { "PT" } else { "VT" }, wide),
        ("EXP", if sums == Sums::F32 { 32 } else { 16 }),
        ("ONES", ones as i64),
    ];
    let merge = [("ONES", ones as i64)];
    let gemm_file: (&str, &[(&str, i64)]) = if f32 {
        ("gemm_f32.S", &[])
    } else {
        ("gemm_f16.S", &[("ACC", 32)])
    };
    let (chip, cycles) = simulate(
        &[
            gemm_file,
            ("attention_online.S", &online),
            ("attention_final.S", &[("OUT", wide)]),
            ("attention_merge.S", &merge),
        ],
        &groups,
        &memory,
    );
    // PV=1 rounds p to f16 before the product: at most 2^-11 of
    // sum_j p_j |v_j| / l <= 2^-11 (|v| <= 1) more error (none with f32 P).
    let extra = if pv_on_amp && !f32 { 1.0 / 2048.0 } else { 0.0 };
    for i in 0..nq {
        let s: Vec<(usize, f64)> = (0..nk)
            .filter(|&j| !causal || j <= i)
            .map(|j| {
                let dot: f64 = (0..d)
                    .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                    .sum();
                (j, dot * scale as f64)
            })
            .collect();
        let m = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|x| (x.1 - m).exp()).sum();
        let out: Vec<f64> = if f32 {
            read_f32(&chip, E2_OUT + (i * rs_out) as u32, d)
                .into_iter()
                .map(f64::from)
                .collect()
        } else {
            read_f16(&chip, E2_OUT + (i * rs_out) as u32, d)
                .into_iter()
                .map(f16v)
                .collect()
        };
        for (c, &g) in out.iter().enumerate() {
            let terms = s.iter().map(|&(j, x)| ((x - m).exp(), v[j * d + c] as f64));
            let want = terms.clone().map(|(p, v)| p * v).sum::<f64>() / l;
            // f32: the scores' f32 sums (relative 2^-24 sqrt(D) of
            // sum |q k|, which exp turns into relative error of p) and the
            // f32 sums of p and p v; well inside 10^-5 of the terms'
            // magnitude at these sizes, where one f16 rounding is 5 10^-4.
            let magnitude = terms.map(|(p, v)| p * v.abs()).sum::<f64>() / l;
            let within = if f32 {
                (g - want).abs() <= 1e-5 * magnitude
            } else {
                within_f16_tolerance(g, want)
                    || (g - want).abs() <= want.abs() / 2048.0 + 1.0 / 16384.0 + extra
            };
            assert!(
                within,
                "end to end q={nq} k={nk} d={d} block={block} causal={causal} pv_on_amp={pv_on_amp} f32={f32} {sums:?}: out[{i}, {c}] = {g}, f64 reference {want}"
            );
        }
    }
    cycles
}

#[test]
fn scores_on_gemm_f16_feed_the_online_update() {
    for &(queries, keys, head, block) in &[
        (17, 19, 72, 19),
        (17, 19, 19, 19),
        (17, 38, 72, 19),
        (12, 40, 72, 32),
    ] {
        for causal in [false, true] {
            for (pv_on_amp, sums) in [
                (false, Sums::F32),
                (true, Sums::F32),
                (true, Sums::F16),
                (true, Sums::Ones),
            ] {
                for f32 in [false, true] {
                    if sums != Sums::F32 && f32 {
                        continue;
                    }
                    let cycles = attention_end_to_end(
                        queries,
                        keys,
                        head,
                        block,
                        causal,
                        pv_on_amp,
                        f32,
                        sums,
                        (queries * keys + head) as u64,
                    );
                    println!("end to end q={queries} k={keys} d={head} block={block} causal={causal} pv_on_amp={pv_on_amp} f32={f32} {sums:?}: {cycles} cycles");
                }
            }
        }
    }
}

#[test]
fn invalid_causal_parameter_is_a_clear_assembly_error() {
    let mut opts = ipu_asm::Options::default();
    opts.defines.insert("CAUSAL".into(), 2);
    let err = ipu_asm::assemble_file(&device_dir().join("attention_online.S"), &opts)
        .expect_err("CAUSAL=2 must not assemble")
        .to_string();
    assert!(
        err.contains("attention_online.S") && err.contains("CAUSAL must be 0"),
        "unexpected error: {err}"
    );
}

#[test]
fn final_normalisation_alone() {
    // Random O and l (l > 0), six workers: out = f16(O * recip(l)), or
    // with OUT=32 the f32 product. With ONES=1 l is O's column 4 DQ (a
    // quad after the head's) and the (m, l) pairs hold NaNs, unread.
    for &(rows, head, out32, ones) in &[
        (17usize, 19usize, false, false),
        (12, 72, false, false),
        (1, 1, false, false),
        (17, 19, true, false),
        (12, 72, true, false),
        (1, 1, true, false),
        (17, 19, false, true),
        (12, 72, false, true),
        (12, 64, true, true),
        (1, 1, false, true),
    ] {
        let mut rng = Rng((rows * 100 + head) as u64);
        let dq = head.div_ceil(4);
        let eb = if out32 { 4 } else { 2 };
        let rs_o = 16 * (dq + ones as usize) + 8;
        let rs_out = 4 * eb * dq + 8;
        let o: Vec<f32> = (0..rows * 4 * dq)
            .map(|i| {
                if i % (4 * dq) < head {
                    rng.uniform(-20.0, 20.0) as f32
                } else {
                    0.0
                }
            })
            .collect();
        let l: Vec<f32> = (0..rows).map(|_| rng.uniform(0.5, 40.0) as f32).collect();
        let mut o_mem = vec![0u8; rows * rs_o];
        for i in 0..rows {
            let row = f32_bytes(&o[i * 4 * dq..(i + 1) * 4 * dq]);
            o_mem[i * rs_o..i * rs_o + row.len()].copy_from_slice(&row);
            if ones {
                let at = i * rs_o + 16 * dq;
                o_mem[at..at + 4].copy_from_slice(&l[i].to_le_bytes());
            }
        }
        let ml: Vec<f32> = l
            .iter()
            .flat_map(|&l| if ones { [f32::NAN; 2] } else { [0.0, l] })
            .collect();
        let defines = [("OUT", 8 * eb as i64), ("ONES", ones as i64)];
        let launches = ranges(rows, 6)
            .into_iter()
            .map(|(r0, r1)| Launch {
                entry: "attention_final",
                state: vec![
                    AT_O + (r0 * rs_o) as u32,
                    rs_o as u32,
                    AT_ML + (8 * r0) as u32,
                    AT_OUT + (r0 * rs_out) as u32,
                    rs_out as u32,
                    (r1 - r0) as u32,
                    dq as u32,
                ],
            })
            .collect();
        let (chip, cycles) = simulate(
            &[("attention_final.S", &defines)],
            &[launches],
            &[
                (AT_O, o_mem),
                (AT_ML, f32_bytes(&ml)),
                (AT_OUT, vec![0xFFu8; rows * rs_out]),
            ],
        );
        for i in 0..rows {
            let out: Vec<f64> = if out32 {
                read_f32(&chip, AT_OUT + (i * rs_out) as u32, 4 * dq)
                    .into_iter()
                    .map(f64::from)
                    .collect()
            } else {
                read_f16(&chip, AT_OUT + (i * rs_out) as u32, 4 * dq)
                    .into_iter()
                    .map(f16v)
                    .collect()
            };
            for (c, &g) in out.iter().enumerate() {
                let want = o[i * 4 * dq + c] as f64 / l[i] as f64;
                // f32: a reciprocal and a product, each rounded once.
                let within = if out32 {
                    (g - want).abs() <= want.abs() * 3.0 * f32::EPSILON as f64
                } else {
                    within_f16_tolerance(g, want)
                };
                assert!(
                    within,
                    "final {rows}x{head} OUT={} ONES={ones}: out[{i}, {c}] = {g}, f64 reference {want}",
                    8 * eb
                );
            }
        }
        let estimate = declared_cycles(
            "attention_final.S",
            &defines,
            &[("ROWS", rows.div_ceil(6) as u64), ("DQ", dq as u64)],
        );
        println!(
            "attention_final OUT={} ONES={ones} {rows}x{head}: simulated {cycles} cycles, .cycles {estimate}",
            8 * eb
        );
        let ratio = estimate as f64 / cycles as f64;
        assert!(
            (0.7..1.2).contains(&ratio),
            "estimate {estimate} vs simulated {cycles}"
        );
    }
}

#[test]
fn pv_on_the_amp_is_faster_per_block() {
    // Cycles of one K/V block (S on gemm_f16, the online update and, with
    // PV=1, the P V GEMM and the merge) = run with two blocks - run with one.
    // And the same for f32 attention (S and P V on gemm_f32, 16 MAC/cycle)
    // in blocks of 32 keys (two blocks of f32 V rows fill the test's area).
    for (queries, block, head, f32) in [(24, 64, 72, false), (24, 32, 72, true)] {
        let per_block = |pv_on_amp: bool, sums: Sums| {
            let run = |blocks: usize| {
                attention_end_to_end(
                    queries,
                    blocks * block,
                    head,
                    block,
                    false,
                    pv_on_amp,
                    f32,
                    sums,
                    3,
                )
            };
            run(2) - run(1)
        };
        let (vector, amp) = (per_block(false, Sums::F32), per_block(true, Sums::F32));
        if !f32 {
            // The compiler's f16 schemes: f16 exponentials, p summed by
            // the vertex or by P V's ones column (free at this head of 72).
            let (f16, ones) = (per_block(true, Sums::F16), per_block(true, Sums::Ones));
            println!("one block q={queries} block={block} d={head}: PV=1 EXP=16 {f16} cycles, EXP=16 ONES=1 {ones}, EXP=32 {amp}");
            assert!(
                ones < f16 && f16 < amp,
                "ONES=1 ({ones}) < EXP=16 ({f16}) < EXP=32 ({amp})"
            );
        }
        // Lower bound of one block: Q K^T and P V at the AMP's rate with
        // f32 accumulation (32 MAC/cycle from f16, 16 from f32) with the
        // head padded to 80.
        let rate = if f32 { 16 } else { 32 };
        let bound = (2 * queries * block * 80 / rate) as u64;
        println!(
            "one block q={queries} block={block} d={head} f32={f32}: PV=0 (vector unit) {vector} cycles, PV=1 (AMP) {amp} cycles, lower bound {bound}"
        );
        assert!(amp >= bound && vector >= bound);
        assert!(
            amp < vector,
            "P V on the AMP ({amp}) must beat the vector unit ({vector})"
        );
    }
}

#[test]
fn merge_alone() {
    // Random O, PV and a, six workers: O = f32(O * a + PV) with one
    // rounding; with ONES=1 also l' = f32(l * a + PV[:, 4 DQ]), the sum of
    // p that V's ones column put there.
    for ones in [0i64, 1] {
        for &(rows, head) in &[(17usize, 19usize), (12, 72), (1, 1), (7, 64)] {
            merge_case(ones, rows, head);
        }
    }
}

fn merge_case(ones: i64, rows: usize, head: usize) {
    let mut rng = Rng((rows * 1000 + head) as u64 + 77 * ones as u64);
    let dq = head.div_ceil(4);
    // PV's rows are 16-aligned (the kernel loads a quad with `ld128`) and
    // hold column 4 DQ (the ones column's sums).
    let (rs_o, rs_pv) = (16 * dq + 8, 16 * dq + 32);
    let o: Vec<f32> = (0..rows * 4 * dq)
        .map(|_| rng.uniform(-20.0, 20.0) as f32)
        .collect();
    let pv: Vec<f32> = (0..rows * (4 * dq + 1))
        .map(|_| rng.uniform(-20.0, 20.0) as f32)
        .collect();
    let alpha: Vec<f32> = (0..rows).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
    let ml: Vec<f32> = (0..rows)
        .flat_map(|_| [rng.uniform(-4.0, 4.0) as f32, rng.uniform(0.5, 40.0) as f32])
        .collect();
    let lay = |v: &[f32], w: usize, rs: usize| {
        let mut m = vec![0u8; rows * rs];
        for i in 0..rows {
            let row = f32_bytes(&v[i * w..(i + 1) * w]);
            m[i * rs..i * rs + row.len()].copy_from_slice(&row);
        }
        m
    };
    let launches = ranges(rows, 6)
        .into_iter()
        .map(|(r0, r1)| Launch {
            entry: "attention_merge",
            state: vec![
                AT_O + (r0 * rs_o) as u32,
                rs_o as u32,
                AT_S + (r0 * rs_pv) as u32,
                rs_pv as u32,
                AT_ML + (4 * r0) as u32,
                (r1 - r0) as u32,
                dq as u32,
                AT_OUT + (8 * r0) as u32,
            ],
        })
        .collect();
    let defines: &[(&str, i64)] = &[("ONES", ones)];
    let (chip, cycles) = simulate(
        &[("attention_merge.S", defines)],
        &[launches],
        &[
            (AT_O, lay(&o, 4 * dq, rs_o)),
            (AT_S, lay(&pv, 4 * dq + 1, rs_pv)),
            (AT_ML, f32_bytes(&alpha)),
            (AT_OUT, f32_bytes(&ml)),
        ],
    );
    let state = read_f32(&chip, AT_OUT, 2 * rows);
    for (i, &a) in alpha.iter().enumerate() {
        let got = read_f32(&chip, AT_O + (i * rs_o) as u32, 4 * dq);
        for (c, g) in got.iter().enumerate() {
            // f32v2mac rounds once: the f32 nearest to the exact value.
            let want =
                (o[i * 4 * dq + c] as f64 * a as f64 + pv[i * (4 * dq + 1) + c] as f64) as f32;
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "merge ONES={ones} {rows}x{head}: O[{i}, {c}] = {g}, expected {want}"
            );
        }
        // m is never written; l only with ONES=1, by one fused mac.
        let l = ml[2 * i + 1];
        let want_l = if ones == 1 {
            (l as f64 * a as f64 + pv[i * (4 * dq + 1) + 4 * dq] as f64) as f32
        } else {
            l
        };
        assert_eq!(
            state[2 * i].to_bits(),
            ml[2 * i].to_bits(),
            "merge ONES={ones}: m of row {i}"
        );
        assert_eq!(
            state[2 * i + 1].to_bits(),
            want_l.to_bits(),
            "merge ONES={ones} {rows}x{head}: l of row {i} = {}, expected {want_l}",
            state[2 * i + 1]
        );
    }
    let estimate = declared_cycles(
        "attention_merge.S",
        defines,
        &[("ROWS", rows.div_ceil(6) as u64), ("DQ", dq as u64)],
    );
    println!(
        "attention_merge ONES={ones} {rows}x{head}: simulated {cycles} cycles, .cycles {estimate}"
    );
    let ratio = estimate as f64 / cycles as f64;
    assert!(
        (0.7..1.2).contains(&ratio),
        "estimate {estimate} vs simulated {cycles}"
    );
}

/// The key counts of the online tests: every count modulo 4 (the quad
/// loop, a leftover pair, an odd key) and a few rows.
const ONLINE_SHAPES: [(usize, usize); 13] = [
    (1, 1),
    (1, 2),
    (1, 3),
    (1, 4),
    (2, 5),
    (2, 6),
    (2, 7),
    (3, 16),
    (5, 19),
    (4, 32),
    (2, 64),
    (3, 127),
    (2, 128),
];

/// One `attention_online` PV=1 run on one worker: its scores, the running
/// state it started from, the chip after it and its cycles.
struct OnlineRun {
    s: Vec<f32>,
    ml: Vec<f32>,
    scale: f32,
    bkp: usize,
    rs_p: usize,
    chip: Chip,
    cycles: u64,
}

/// Runs `attention_online` with `defines` on `rows` rows of `bk` random
/// f32 scores (keys padded to 16, S rows 16-aligned in interleaved
/// memory), a running state from an earlier block (m anywhere in the
/// scores' range, l positive) and P filled with NaNs, so that every key
/// and padding column must be written.
fn run_online_alone(rng: &mut Rng, rows: usize, bk: usize, defines: &[(&str, i64)]) -> OnlineRun {
    let ml: Vec<f32> = (0..rows)
        .flat_map(|_| [rng.uniform(-4.0, 4.0) as f32, rng.uniform(0.5, 40.0) as f32])
        .collect();
    run_online_from(rng, rows, bk, defines, ml, None)
}

/// [`run_online_alone`] from the running state `ml`, with O's rows (f32,
/// `dq` quads a row, 16 * `dq` bytes apart) in memory when given.
fn run_online_from(
    rng: &mut Rng,
    rows: usize,
    bk: usize,
    defines: &[(&str, i64)],
    ml: Vec<f32>,
    o: Option<(usize, &[f32])>,
) -> OnlineRun {
    let bkp = bk.div_ceil(16) * 16;
    let rs_s = 4 * bkp + 16;
    // P's rows: f16, or f32 with PT=32.
    let p_bytes = if defines.contains(&("PT", 32)) { 4 } else { 2 };
    let rs_p = p_bytes * bkp;
    let scale = 1.0f32 / 8.0;
    let s: Vec<f32> = (0..rows * bk)
        .map(|_| rng.uniform(-30.0, 30.0) as f32)
        .collect();
    let mut s_mem = vec![0u8; rows * rs_s];
    for i in 0..rows {
        let row = f32_bytes(&s[i * bk..(i + 1) * bk]);
        s_mem[i * rs_s..i * rs_s + row.len()].copy_from_slice(&row);
    }
    let mut memory = vec![
        (GE_CA, s_mem),
        (E2_ML, f32_bytes(&ml)),
        (E2_P, vec![0xFF; rows * rs_p]),
    ];
    let dq = o.map_or(1, |(dq, _)| dq);
    if let Some((_, values)) = o {
        memory.push((E2_O, f32_bytes(values)));
    }
    let launch = Launch {
        entry: "attention_online",
        state: vec![
            GE_CA,
            rs_s as u32,
            E2_V,
            8,
            E2_O,
            // O's rows as `o` holds them (with ONES=1 a quad more than DQ).
            o.map_or(8, |(_, values)| (4 * values.len() / rows) as u32),
            E2_ML,
            rows as u32,
            bk as u32,
            dq as u32,
            scale.to_bits(),
            0,
            0,
            E2_PBUF,
            E2_P,
            rs_p as u32,
            bkp as u32,
            E2_ALPHA,
        ],
    };
    let (chip, cycles) = simulate(&[("attention_online.S", defines)], &[vec![launch]], &memory);
    OnlineRun {
        s,
        ml,
        scale,
        bkp,
        rs_p,
        chip,
        cycles,
    }
}

/// An EXP=16 online vertex's p of score `x` from the maximum `m`:
/// f16(exp(f16(f32(x * scale - m)))), the product of two f32 exact in
/// f64, then each rounding once.
fn f16_p(x: f32, scale: f32, m: f64) -> u16 {
    let arg = (x as f64 * scale as f64 - m) as f32;
    let arg16 = f16v(f64_to_f16_bits(arg as f64));
    f64_to_f16_bits(arg16.exp())
}

/// Checks row `i` of an EXP=16 online run's P bit for bit: the visible
/// keys' p = f16(exp(f16(f32(s * SCALE - m')))) (the product of two f32
/// exact in f64, then each rounding once), zeros up to BKP. Returns the
/// row's sum of the f16 p.
fn check_f16_p(run: &OnlineRun, i: usize, row: &[f32], m_new: f64, what: &str) -> f64 {
    let got = read_f16(&run.chip, E2_P + (i * run.rs_p) as u32, run.bkp);
    let mut sum = 0.0f64;
    for (j, &g) in got.iter().enumerate() {
        let want = row.get(j).map_or(0, |&x| f16_p(x, run.scale, m_new));
        assert_eq!(
            g,
            want,
            "{what}: p[{j}] = {}, expected {}",
            f16v(g),
            f16v(want)
        );
        sum += f16v(g);
    }
    sum
}

/// Checks row `i` of a PT=32 online run's P: the visible keys' p =
/// exp(s * SCALE - m') in f32 (the argument one fused mac, rounded to f32
/// at most 2^-24 of itself, which moves p by that fraction; the
/// exponential rounded once) against the f64 value, zeros up to BKP.
/// Returns the row's sum of the f32 p.
fn check_f32_p(run: &OnlineRun, i: usize, row: &[f32], m_new: f64, what: &str) -> f64 {
    let got = read_f32(&run.chip, E2_P + (i * run.rs_p) as u32, run.bkp);
    let mut sum = 0.0f64;
    for (j, &g) in got.iter().enumerate() {
        match row.get(j) {
            Some(&x) => {
                let arg = x as f64 * run.scale as f64 - m_new;
                let want = arg.exp();
                assert!(
                    (g as f64 - want).abs() <= want * 2f64.powi(-24) * (arg.abs() + 2.0),
                    "{what}: p[{j}] = {g}, f64 {want}"
                );
            }
            None => assert_eq!(g.to_bits(), 0, "{what}: padding p[{j}] = {g}"),
        }
        sum += g as f64;
    }
    sum
}

/// Checks the simulated cycles of an online run against the declared
/// formula: within 2% and 72 cycles (the run's launch, wsync and exit are
/// in the simulated cycles; the formula is exact but for them).
fn check_online_formula(defines: &[(&str, i64)], rows: usize, bk: usize, run: &OnlineRun) {
    check_online_formula_from(defines, rows, bk, run, false);
}

/// [`check_online_formula`] with FIRST (`first`: every row started from
/// m = -inf, the rows' first block), which the formulas of the
/// accumulating vertices with f16 p read.
fn check_online_formula_from(
    defines: &[(&str, i64)],
    rows: usize,
    bk: usize,
    run: &OnlineRun,
    first: bool,
) {
    let estimate = declared_cycles(
        "attention_online.S",
        defines,
        &[
            ("ROWS", rows as u64),
            ("BK", bk as u64),
            ("BKP", run.bkp as u64),
            ("FIRST", first as u64),
        ],
    );
    let cycles = run.cycles;
    println!("attention_online {defines:?} rows={rows} BK={bk}: simulated {cycles} cycles, .cycles {estimate}");
    let off = (estimate as f64 - cycles as f64).abs();
    assert!(
        off <= 0.02 * cycles as f64 + 72.0,
        "{defines:?} rows={rows} BK={bk}: .cycles {estimate} vs simulated {cycles}"
    );
}

/// `attention_online` PV=1 alone on one worker ([`ONLINE_SHAPES`]): p (in
/// P, keys padded to BKP with zeros), the running state (m', l') and the
/// rescaling factor a against an f64 computation from the same f32 scores
/// and state, and the simulated cycles against the declared formula.
#[test]
fn online_pv_update_alone_against_its_formula() {
    for pt in [16, 32] {
        online_pv_case(pt);
    }
}

/// [`online_pv_update_alone_against_its_formula`] with f16 P (PT=16) or
/// f32 P (PT=32, f32 attention).
fn online_pv_case(pt: i64) {
    let mut rng = Rng(7100);
    let defines: &[(&str, i64)] = &[("CAUSAL", 0), ("PV", 1), ("PT", pt)];
    for (rows, bk) in ONLINE_SHAPES {
        let run = run_online_alone(&mut rng, rows, bk, defines);
        let (s, ml, scale, chip) = (&run.s, &run.ml, run.scale, &run.chip);
        let state = read_f32(chip, E2_ML, 2 * rows);
        let alpha = read_f32(chip, E2_ALPHA, rows);
        for i in 0..rows {
            let row = &s[i * bk..(i + 1) * bk];
            let (m, l) = (ml[2 * i] as f64, ml[2 * i + 1] as f64);
            let m_new = row.iter().map(|&x| (x * scale) as f64).fold(m, f64::max);
            let a = (m - m_new).exp();
            let p: Vec<f64> = row
                .iter()
                .map(|&x| (x as f64 * scale as f64 - m_new).exp())
                .collect();
            let l_new = l * a + p.iter().sum::<f64>();
            let close =
                |got: f32, want: f64| (got as f64 - want).abs() <= 1e-6 * want.abs().max(1e-30);
            assert_eq!(
                state[2 * i] as f64,
                m_new,
                "rows={rows} bk={bk}: m' of row {i}"
            );
            assert!(
                close(state[2 * i + 1], l_new),
                "rows={rows} bk={bk}: l' of row {i} = {}, f64 {l_new}",
                state[2 * i + 1]
            );
            assert!(
                close(alpha[i], a),
                "rows={rows} bk={bk}: a of row {i} = {}, f64 {a}",
                alpha[i]
            );
            if pt == 32 {
                let what = format!("PT=32 rows={rows} bk={bk} row {i}");
                check_f32_p(&run, i, row, m_new, &what);
                continue;
            }
            let got = read_f16(chip, E2_P + (i * run.rs_p) as u32, run.bkp);
            for (j, &g) in got.iter().enumerate() {
                let want = p.get(j).copied().unwrap_or(0.0);
                assert!(
                    within_f16_tolerance(f16v(g), want),
                    "rows={rows} bk={bk}: p[{i}, {j}] = {}, f64 {want}",
                    f16v(g)
                );
            }
        }
        check_online_formula(defines, rows, bk, &run);
    }
}

/// `attention_online` PV=1 EXP=16 alone on one worker ([`ONLINE_SHAPES`]),
/// with ONES=1 and ONES=0: m' and a as with the f32 exponentials; p in f16
/// from the f16 exponential of the f16-rounded argument (formed in f32 by
/// one fused mac), bit for bit, with the keys padded to BKP by zeros; l
/// untouched with ONES=1 (P V's ones column sums p), else l a plus the sum
/// of those f16 p; and the simulated cycles against the declared formula.
#[test]
fn online_f16_exponentials_alone_against_their_formula() {
    for ones in [1i64, 0] {
        let mut rng = Rng(7200 + ones as u64);
        let defines: &[(&str, i64)] = &[
            ("CAUSAL", 0),
            ("PV", 1),
            ("PT", 16),
            ("EXP", 16),
            ("ONES", ones),
        ];
        for (rows, bk) in ONLINE_SHAPES {
            let run = run_online_alone(&mut rng, rows, bk, defines);
            let (s, ml, scale, chip) = (&run.s, &run.ml, run.scale, &run.chip);
            let state = read_f32(chip, E2_ML, 2 * rows);
            let alpha = read_f32(chip, E2_ALPHA, rows);
            for i in 0..rows {
                let row = &s[i * bk..(i + 1) * bk];
                let (m, l) = (ml[2 * i] as f64, ml[2 * i + 1]);
                let m_new = row.iter().map(|&x| (x * scale) as f64).fold(m, f64::max);
                let a = (m - m_new).exp();
                assert_eq!(
                    state[2 * i] as f64,
                    m_new,
                    "ONES={ones} rows={rows} bk={bk}: m' of row {i}"
                );
                assert!(
                    (alpha[i] as f64 - a).abs() <= 1e-6 * a.max(1e-30),
                    "ONES={ones} rows={rows} bk={bk}: a of row {i} = {}, f64 {a}",
                    alpha[i]
                );
                let what = format!("ONES={ones} rows={rows} bk={bk}: row {i}");
                let sum = check_f16_p(&run, i, row, m_new, &what);
                if ones == 1 {
                    assert_eq!(
                        state[2 * i + 1].to_bits(),
                        l.to_bits(),
                        "rows={rows} bk={bk}: l of row {i} must be left to the merge"
                    );
                } else {
                    let want = l as f64 * a + sum;
                    assert!(
                        (state[2 * i + 1] as f64 - want).abs() <= 1e-6 * want,
                        "ONES=0 rows={rows} bk={bk}: l' of row {i} = {}, f64 {want}",
                        state[2 * i + 1]
                    );
                }
            }
            check_online_formula(defines, rows, bk, &run);
        }
    }
}

/// `attention_online` ACC=1 (P V accumulates into O, so O's rows are
/// rescaled here) alone on one worker: a row's running maximum moves only
/// when the block's passes it by more than 8, and then O's row and l are
/// rescaled in place by a = exp(m - m'), unless m was -inf (O and l are
/// zero then, so the row is left alone); p in f16 from m' bit for bit as
/// with ONES=0, and l' = l (a) + their sum. Rows of both kinds and rows
/// that start at -inf, over [`ONLINE_SHAPES`]; then the cycles against the
/// declared formula where no maximum moves.
#[test]
fn online_lazy_maximum_rescales_o_in_place() {
    for (pt, ones) in [(16, 0), (16, 1), (32, 0)] {
        lazy_maximum_case(pt, ones);
    }
}

/// [`online_lazy_maximum_rescales_o_in_place`] with f16 P from f16
/// exponentials (PT=16) or f32 P (PT=32, f32 attention), and ONES=0 (l in
/// the state, the vertex's own sums) or ONES=1 (l in O's ones column, the
/// quad after the head's, which a move rescales with O; the state's l is
/// left alone).
fn lazy_maximum_case(pt: i64, ones: i64) {
    let exp = if pt == 32 { 32 } else { 16 };
    let defines: &[(&str, i64)] = &[
        ("CAUSAL", 0),
        ("PV", 1),
        ("PT", pt),
        ("EXP", exp),
        ("ONES", ones),
        ("ACC", 1),
    ];
    let dq = 3;
    // Columns of an O row: the head's, and with ONES=1 a quad holding l.
    let cols = 4 * (dq + ones as usize);
    let mut rng = Rng(7300);
    let (mut moved, mut kept, mut first) = (0, 0, 0);
    // Kept rows whose f16 p summed past 4096 (ONES=0 EXP=16 takes p from
    // m first and checks the row's maximum only then; with ONES=1 the
    // check is on the largest p, which passes 4096 only where m moves).
    let mut checked = 0;
    for (rows, bk) in ONLINE_SHAPES {
        // Row maxima near 3.75 (scores up to 30, scale 1/8): m from -10 to
        // 4 moves for some rows and not for others; every fifth row starts
        // at -inf with l = 0.
        let ml: Vec<f32> = (0..rows)
            .flat_map(|i| {
                if i % 5 == 0 {
                    [f32::NEG_INFINITY, 0.0]
                } else {
                    [
                        rng.uniform(-10.0, 4.0) as f32,
                        rng.uniform(0.5, 40.0) as f32,
                    ]
                }
            })
            .collect();
        let o: Vec<f32> = (0..rows * cols)
            .map(|_| rng.uniform(-2.0, 2.0) as f32)
            .collect();
        let run = run_online_from(&mut rng, rows, bk, defines, ml.clone(), Some((dq, &o)));
        let (s, scale, chip) = (&run.s, run.scale, &run.chip);
        let state = read_f32(chip, E2_ML, 2 * rows);
        let o_after = read_f32(chip, E2_O, rows * cols);
        for i in 0..rows {
            let row = &s[i * bk..(i + 1) * bk];
            let (m, l) = (ml[2 * i], ml[2 * i + 1]);
            let rowmax = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x)) * scale;
            // The vertex takes p from m first; the row's maximum decides
            // only where their sum (ONES=1: the largest) passes 4096, or
            // from -inf.
            let decides = m == f32::NEG_INFINITY || {
                let p: Vec<f64> = row
                    .iter()
                    .map(|&x| match pt {
                        32 => (x as f64 * scale as f64 - m as f64).exp(),
                        _ => f16v(f16_p(x, scale, m as f64)),
                    })
                    .collect();
                if ones == 0 {
                    p.iter().sum::<f64>() > 4096.0
                } else {
                    p.iter().fold(0.0, |a: f64, &b| a.max(b)) > 4096.0
                }
            };
            let moves = decides && m + 8.0 < rowmax;
            let m_new = if moves { rowmax } else { m };
            let rescale = moves && m != f32::NEG_INFINITY;
            let a = if rescale { (m - rowmax).exp() } else { 1.0 };
            match (moves, rescale) {
                (true, true) => moved += 1,
                (true, false) => first += 1,
                _ => kept += 1,
            }
            let what = format!(
                "PT={pt} ONES={ones} rows={rows} bk={bk} row {i} (m {m}, row maximum {rowmax})"
            );
            assert_eq!(state[2 * i], m_new, "{what}: m'");
            for c in 0..cols {
                let (got, before) = (o_after[i * cols + c], o[i * cols + c]);
                if rescale {
                    let want = before as f64 * a as f64;
                    assert!(
                        (got as f64 - want).abs() <= 1e-6 * want.abs().max(1e-30),
                        "{what}: O[{c}] = {got}, {before} x {a} = {want}"
                    );
                } else {
                    assert_eq!(got.to_bits(), before.to_bits(), "{what}: O[{c}] must stay");
                }
            }
            let sum = if pt == 32 {
                check_f32_p(&run, i, row, m_new as f64, &what)
            } else {
                check_f16_p(&run, i, row, m_new as f64, &what)
            };
            if ones == 1 {
                // l is P V's to sum, in O's column; the state's stays.
                assert_eq!(state[2 * i + 1].to_bits(), l.to_bits(), "{what}: l");
                continue;
            }
            checked += (!moves && sum > 4096.0) as u32;
            let want = if rescale {
                l as f64 * a as f64
            } else {
                l as f64
            } + sum;
            assert!(
                (state[2 * i + 1] as f64 - want).abs() <= 1e-6 * want,
                "{what}: l' = {}, f64 {want}",
                state[2 * i + 1]
            );
        }
        // Where no maximum moves and no row's p sum past 4096 (m from 4
        // to 8 above row maxima of at most 3.75), the declared formula.
        let ml = (0..rows)
            .flat_map(|_| [rng.uniform(4.0, 8.0) as f32, rng.uniform(0.5, 40.0) as f32])
            .collect();
        let run = run_online_from(&mut rng, rows, bk, defines, ml, None);
        check_online_formula(defines, rows, bk, &run);
        // Every row's first block, from m = -inf.
        let ml = (0..rows).flat_map(|_| [f32::NEG_INFINITY, 0.0]).collect();
        let run = run_online_from(&mut rng, rows, bk, defines, ml, None);
        check_online_formula_from(defines, rows, bk, &run, true);
    }
    assert!(
        moved > 0 && kept > 0 && first > 0,
        "{moved} moved, {kept} kept, {first} from -inf"
    );
    if ones == 0 {
        assert!(checked > 0, "PT={pt}: no kept row's p summed past 4096");
    }
    // The causal variant assembles (its rows without a visible key leave
    // O, m and l alone and store no factor).
    let causal: Vec<(&str, i64)> = defines
        .iter()
        .map(|&(k, v)| if k == "CAUSAL" { (k, 1) } else { (k, v) })
        .collect();
    assert!(
        declared_cycles(
            "attention_online.S",
            &causal,
            &[("ROWS", 4), ("BK", 32), ("BKP", 32), ("FIRST", 1)]
        ) > 0
    );
}

/// ACC=1 takes f16 P only from the f16 exponentials (f32 P, PT=32, takes
/// f32 ones): the assembler names the parameters at fault otherwise.
#[test]
fn online_acc_needs_f16_exponentials() {
    let mut opts = ipu_asm::Options::default();
    for (k, v) in [("PV", 1), ("PT", 16), ("EXP", 32), ("ACC", 1)] {
        opts.defines.insert(k.into(), v);
    }
    let err = ipu_asm::assemble_file(&device_dir().join("attention_online.S"), &opts)
        .expect_err("ACC=1 with PT=16 and EXP=32 must not assemble")
        .to_string();
    assert!(err.contains("ACC=1 needs EXP=16"), "{err}");
    assert!(err.contains("or PT=32"), "{err}");
}
