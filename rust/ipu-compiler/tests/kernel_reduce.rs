//! The reduce vertex (device/reduce_f32.S) on one simulated tile: P f32
//! partials summed in partial order with one f32 rounding per add, then
//! stored as f16 (OUT=16) or f32 (OUT=32), optionally through the fused
//! bias / GELU epilogues, checked bit for bit against a host emulation of
//! the documented operation order (docs/isa.md: f32 ops round once, `mac`
//! is fused, `tanh` is computed in f64 and rounded). The simulator executes
//! the kernel.
//!
//! `IN=16` (f16 partials, each widened exactly to f32, then the same sums)
//! runs through the shared one-tile harness: every P from 1 to 8, edge row
//! and group counts, each output and epilogue, signed zeros, infinities and
//! subnormals, the bytes around the results, and the declared `.cycles`.
//!
//! `TR=1` (IN=16, OUT=16: the result stored transposed, column c's rows
//! consecutive f16 RS_DST apart) is checked against the host emulation and
//! against the simulated `TR=0` result of the same partials, read through
//! the column layout, with every byte between and around the columns
//! guarded; one or six vertices split the rows (odd counts, so vertices
//! share 4-byte words), padded or back-to-back columns.
//!
//! `ACC=16 TR=1` stores blocks of four rows with one `st64` per column
//! where their 8 bytes are 8-aligned and the rest one element at a time:
//! the `acc16_tr_*` tests sweep P, ROWS, QUADS, the alignment of DST (0, 2,
//! 4, 6 mod 8), padded and back-to-back columns and the vertices' row
//! ranges (from multiples of 4, as the compiler splits them, or anywhere),
//! and check the declared `.cycles` of the compiler's layout.

mod kernel_common;

use ipu_isa::numerics::{canonical_f32_bits, f16_bits_to_f32, f32_to_f16_bits};
use ipu_sim::{Chip, ChipConfig, Stop};
use kernel_common::{declared_cycles, ranges_aligned, simulate, Kernel, Launch, Rng};
use std::path::PathBuf;

fn device_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../../device")
}

const SRC: u32 = 0x80000;
const DST: u32 = 0x60000;

fn run(rows: u32, quads: u32, partials: u32, out32: bool, workers: u32, seed: u64) -> u64 {
    run_epi(rows, quads, partials, out32, 0, workers, seed)
}

const BIAS: u32 = 0x70000;

/// The kernel's GELU of an f32 value, operation by operation.
fn gelu_f32(x: f32) -> f32 {
    let (c1, c2) = (0.044715f64 as f32, 0.7978845608028654f64 as f32);
    let t = x * x * x;
    let u = t.mul_add(c1, x) * c2;
    let u = ((u as f64).tanh() as f32 + 1.0) * x;
    u * 0.5
}

/// The epilogue as the kernel computes it, from the f32 sum.
fn epilogue(epi: u32, sum: f32, bias: u16) -> u16 {
    let f16 = |x: f32| f32_to_f16_bits(x);
    let back = |h: u16| f16_bits_to_f32(h);
    let mut h = f16(sum);
    if epi == 1 || epi == 2 {
        h = f16(back(h) + back(bias));
    }
    if epi >= 2 {
        h = f16(gelu_f32(back(h)));
    }
    h
}

/// The OUT=32 epilogue: every value f32, the bias too.
fn epilogue_f32(epi: u32, sum: f32, bias: f32) -> f32 {
    let mut y = sum;
    if epi == 1 || epi == 2 {
        y += bias;
    }
    if epi >= 2 {
        y = gelu_f32(y);
    }
    y
}

fn run_epi(
    rows: u32,
    quads: u32,
    partials: u32,
    out32: bool,
    epi: u32,
    workers: u32,
    seed: u64,
) -> u64 {
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
    let bias32: Vec<f32> = (0..quads * 4).map(|_| next() as f32 / 2.0).collect();
    let bias: Vec<u16> = bias32.iter().map(|&b| f32_to_f16_bits(b)).collect();
    // OUT=32 reads an f32 bias, OUT=16 an f16 one.
    let bias_bytes: Vec<u8> = if out32 {
        bias32.iter().flat_map(|b| b.to_le_bytes()).collect()
    } else {
        bias.iter().flat_map(|b| b.to_le_bytes()).collect()
    };
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
            "st{i}: .word {}, {section}, {partials}, {rs_src}, {}, {rs_dst}, {}, {quads}, {BIAS}\n",
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
    opts.defines.insert("EPI".into(), epi as i64);
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
    chip.write(0, BIAS, &bias_bytes).unwrap();
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
                    epilogue_f32(epi, sum, bias32[e as usize]).to_bits(),
                )
            } else {
                let h = u16::from_le_bytes(row[(2 * e) as usize..][..2].try_into().unwrap());
                (h as u32, epilogue(epi, sum, bias[e as usize]) as u32)
            };
            assert_eq!(
                got, want,
                "rows={rows} quads={quads} P={partials} out32={out32} EPI={epi}: [{r}, {e}] = {got:#x} ({}), expected {want:#x} ({sum})",
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

/// The bias and GELU epilogues (EPI 1 to 3) with an f16 or f32 result, bit
/// for bit against the kernel's operation order on several shapes and
/// worker splits; the declared formula (`2 P + per_quad[EPI]` bundles per
/// group of four) within `ratio` of the simulator on one shape.
fn check_epilogues(out32: bool, per_quad: [u64; 4], ratio: std::ops::Range<f64>) {
    for epi in 1..=3 {
        for &(rows, quads, p) in &[(1, 1, 1), (5, 3, 2), (7, 4, 6)] {
            for workers in [1, 4] {
                run_epi(
                    rows,
                    quads,
                    p,
                    out32,
                    epi,
                    workers,
                    (epi * 1000 + rows * 10 + p) as u64,
                );
            }
        }
        let cycles = run_epi(6, 4, 3, out32, epi, 1, 9);
        let formula = 6 * (8 + 6 * (4 + 4 * (2 * 3 + per_quad[epi as usize])));
        println!("out32={out32} EPI={epi}: simulated {cycles}, .cycles {formula}");
        assert!(
            ratio.contains(&(formula as f64 / cycles as f64)),
            "formula {formula} vs simulated {cycles}"
        );
    }
}

/// OUT=32 with the bias and GELU epilogues (an f32 GEMM's fused bias
/// add and GELU): every value f32, the bias too.
#[test]
fn f32_results_with_bias_and_gelu_epilogues() {
    check_epilogues(true, [0, 10, 30, 27], 0.9..1.1);
}

#[test]
fn fused_bias_and_gelu_epilogues() {
    check_epilogues(false, [0, 16, 40, 32], 0.9..1.15);
}

/// Where the f16 partials start: region 0 (standard memory) and 8- but not
/// 16-aligned, because IN=16 reads with 64-bit loads, which work anywhere.
const SRC16: u32 = 0x7_8008;
/// The byte the result area is filled with before the run: bytes the kernel
/// must not write keep it.
const GUARD: u8 = 0xA5;

/// The distribution of the f16 partials.
#[derive(Clone, Copy, Debug)]
enum Values {
    /// Half uniform in [-4, 4), half any finite f16 (all exponents,
    /// subnormals included), so that f32 sums of far-apart magnitudes round.
    Mixed,
    /// Mostly signed zeros, infinities, the largest finite f16, the smallest
    /// subnormals and +-1: the cases where an exact widening and in-order
    /// f32 sums (not a + 0 identity, not a wider accumulator) show.
    Specials,
    /// Uniform in [-12, 12), one value in eight a signed zero: sums over
    /// GELU's whole interesting range (exp overflow below about -4, the
    /// identity region above about 4) and past it.
    Activations,
}

fn random_f16(rng: &mut Rng, values: Values) -> u16 {
    const SPECIALS: [u16; 10] = [
        0x0000, 0x8000, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x3C00, 0xBC00,
    ];
    let any_finite = |rng: &mut Rng| {
        let bits = rng.next_u64();
        let exponent = (bits >> 16) % 31;
        ((bits & 0x8000) | (exponent << 10) | (bits & 0x3FF)) as u16
    };
    match values {
        Values::Mixed if rng.next_u64() & 1 == 0 => f32_to_f16_bits(rng.uniform(-4.0, 4.0) as f32),
        Values::Mixed => any_finite(rng),
        Values::Specials if !rng.next_u64().is_multiple_of(4) => {
            SPECIALS[(rng.next_u64() % SPECIALS.len() as u64) as usize]
        }
        Values::Specials => any_finite(rng),
        Values::Activations if rng.next_u64().is_multiple_of(8) => {
            if rng.next_u64() & 1 == 0 {
                0x0000
            } else {
                0x8000
            }
        }
        Values::Activations => f32_to_f16_bits(rng.uniform(-12.0, 12.0) as f32),
    }
}

/// Where the result goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// TR=0: result rows of QUADS x 4 elements, RS_DST apart (each padded
    /// by 8 bytes), from DST.
    Rows,
    /// TR=1: result columns of ROWS f16, RS_DST apart, padded to a multiple
    /// of 8 bytes plus 8 more, from an 8-aligned DST (the compiler's layout
    /// of a transposed shard).
    Columns,
    /// TR=1: columns back to back (RS_DST = 2 ROWS, odd row counts make it
    /// 2 mod 4) from a DST that is 2 mod 8: every byte between two columns
    /// belongs to another element, and vertices share 4-byte words.
    ColumnsTight,
    /// TR=1: columns from DST + `lead` (0, 2, 4 or 6: element (0, 0) is
    /// 8-aligned or the first (8 - lead) / 2 rows come before the first
    /// 8-aligned one), padded as [`Layout::Columns`] (RS_DST a multiple of
    /// 8) or back to back (`tight`: RS_DST = 2 ROWS, a multiple of 8 only
    /// when ROWS is a multiple of 4); vertices split the rows into ranges
    /// that start on multiples of `split` (the compiler's split: 4).
    ///
    /// `own`: the OWN word of the `OWN=1` object ([`OwnTr`]).
    ColumnsAt {
        lead: u32,
        tight: bool,
        split: u32,
        own: OwnTr,
    },
    /// TR=0: result rows as [`Layout::Rows`], with the partials, their
    /// sections and the result placed by `Place` (ACC=16's `ld2x64st64`
    /// path needs the partials in region 1 with SECTION = 8 mod 16 and the
    /// result in region 0; other placements take the one-load path).
    RowsAt(Place),
}

/// ACC=16 TR=1's partial 0 (state word OWN of the `OWN=1` object: a tile's
/// own piece of a transposed reduce-scatter where its GEMM left it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OwnTr {
    /// The `OWN=0` object, whose state has no OWN word.
    Off,
    /// The `OWN=1` object with OWN = 0: partial 0 at SRC.
    Zero,
    /// The `OWN=1` object with partial 0 at [`OWN`] (partials 1.. at SRC +
    /// p SECTION, SRC's slot 0 filled with NaNs that must not be read).
    At,
}

impl Layout {
    /// Whether the result is stored transposed (TR=1).
    fn transposed(self) -> bool {
        !matches!(self, Layout::Rows | Layout::RowsAt(_))
    }
}

/// Where [`Layout::RowsAt`] puts the partials and the result, and how its
/// vertices split the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    /// The partials from [`SRC1`] in region 1 (interleaved memory), not
    /// from [`SRC16`] in region 0.
    src_region1: bool,
    /// SECTION = ROWS x RS_SRC rounded up to a multiple of 16, plus this:
    /// 8 (or 8 + a multiple of 16) makes SECTION = 8 mod 16, so that
    /// partials i and i + 1 lie in different banks; a multiple of 16 puts
    /// them in the same bank. A pad of 12 KiB or more spreads the partials
    /// over several 32 KiB elements (pairs straddle element boundaries);
    /// small pads keep small shapes' partials in one element.
    section_pad: u32,
    /// The result from [`DST1`] in region 1, not from [`DST`] in region 0.
    dst_region1: bool,
    /// The vertices split the columns in blocks of four groups (16
    /// columns, the compiler's column groups), each vertex taking all
    /// rows, instead of splitting the rows.
    split_columns: bool,
    /// The partials placed so that the last group of the last partial's
    /// last row ends where tile memory ends (0xE8000): a read past it
    /// faults in the simulator (`src_region1` must be set).
    src_at_end: bool,
    /// Partial 0 at [`OWN`] (state word OWN, PAIRS=1: a tile's own piece
    /// where a reduce-scatter left it), partials 1.. at SRC + p SECTION,
    /// and SRC's slot 0 filled with NaNs that must not be read.
    own: bool,
}

/// The compiler's placement of an ACC=16 TR=0 gather: partials in region 1
/// with SECTION = 8 mod 16, the result in region 0.
const FAST: Place = Place {
    src_region1: true,
    section_pad: 8,
    dst_region1: false,
    split_columns: false,
    src_at_end: false,
    own: false,
};

/// Where [`Layout::RowsAt`] puts the partials in region 1: 8- but not
/// 16-aligned, at the start of an interleaved element.
const SRC1: u32 = 0x8_0008;
/// Where [`Place::own`] puts partial 0: region 1, in another element than
/// the partials from [`SRC1`] and in the bank partial 0 would have there
/// (OWN = SRC mod 16, as the kernel requires).
const OWN: u32 = 0xC_0008;
/// Where [`Layout::RowsAt`] puts a result in region 1 (after the largest
/// partials the tests place from [`SRC1`]).
const DST1: u32 = 0xE_0000;

/// One IN=16 run: the shape, the kernel parameters, the worker split.
#[derive(Clone, Copy, Debug)]
struct Case16 {
    rows: u32,
    quads: u32,
    partials: u32,
    out32: bool,
    epi: u32,
    workers: u32,
    values: Values,
    layout: Layout,
    /// ACC=16: the partials summed in f16 (needs OUT=16; EPI=2 needs
    /// TR=0), the epilogue in f16 ([`epilogue_f16`]).
    acc16: bool,
    seed: u64,
}

impl Case16 {
    /// An ACC=16 case (f16 partials summed in f16, f16 result) of `partials`
    /// partials of `rows` x `quads` quads: no epilogue, one vertex, mixed
    /// values, result rows, seed 0; tests override what they vary.
    fn acc16(rows: u32, quads: u32, partials: u32) -> Case16 {
        Case16 {
            rows,
            quads,
            partials,
            out32: false,
            epi: 0,
            workers: 1,
            values: Values::Mixed,
            layout: Layout::Rows,
            acc16: true,
            seed: 0,
        }
    }
}

/// The sum as the kernel computes it: partial 0 widened exactly, then one
/// f32 add per further partial in partial order, NaN results canonical.
fn sum_f16_partials(partials: impl Iterator<Item = u16>) -> f32 {
    partials
        .map(f16_bits_to_f32)
        .reduce(|sum, x| f32::from_bits(canonical_f32_bits(sum + x)))
        .expect("P >= 1")
}

/// The ACC=16 sum as the kernel computes it: s = p0, then s = f16(s + p)
/// for each further partial in partial order, NaN results canonical
/// (0x7E00). `half`'s f16 add rounds the f32 sum of the two operands to f16,
/// which is the correctly rounded f16 sum like the simulator's `f16v4add`
/// ([`half_f16_add_is_the_simulators_f16v4add`] checks it).
fn sum_f16_partials_in_f16(partials: impl Iterator<Item = u16>) -> u16 {
    partials
        .map(half::f16::from_bits)
        .reduce(|sum, x| {
            let s = sum + x;
            if s.is_nan() {
                half::f16::from_bits(0x7E00)
            } else {
                s
            }
        })
        .expect("P >= 1")
        .to_bits()
}

/// One f16v4 op as the device rounds it: the exact (f64) result rounded
/// once to nearest even, NaN canonical (docs/isa.md).
fn f16_round(x: f64) -> u16 {
    ipu_isa::numerics::f64_to_f16_bits(x)
}

fn f16_value(h: u16) -> f64 {
    f16_bits_to_f32(h) as f64
}

/// The f16 constants of the ACC=16 GELU (device/reduce_f32.S): c2 =
/// f16(-2 sqrt(2/pi)) and c3 = f16(-2 sqrt(2/pi) * 0.044715).
const GELU16_C2: u16 = 0xBE62;
const GELU16_C3: u16 = 0xAC91;

/// The ACC=16 GELU of the f16 value `b`, in the documented op order, every
/// op rounded once to f16 (exp and recip computed in f64, rounded once).
fn gelu_f16(b: u16) -> u16 {
    let b_ = f16_value(b);
    let t = f16_round(b_ * b_);
    let u = f16_round(f16_value(GELU16_C2) + f16_value(GELU16_C3) * f16_value(t));
    let w = f16_round(b_ * f16_value(u));
    let e = f16_round(f16_value(w).exp());
    let d = f16_round(f16_value(e) + 1.0);
    let r = f16_round(1.0 / f16_value(d));
    f16_round(b_ * f16_value(r))
}

/// The ACC=16 epilogue of the f16 sum `s`: EPI=0 stores it, EPI=1
/// f16(s + bias), EPI=2 the GELU of that.
fn epilogue_f16(epi: u32, s: u16, bias: u16) -> u16 {
    match epi {
        0 => s,
        1 => f16_round(f16_value(s) + f16_value(bias)),
        2 => gelu_f16(f16_round(f16_value(s) + f16_value(bias))),
        _ => unreachable!("ACC=16 has EPI 0..2"),
    }
}

/// The tanh-form GELU in f64, in the sigmoid form the kernel evaluates.
fn gelu_f64(x: f64) -> f64 {
    let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * z).exp())
}

/// Runs `case` on one simulated tile, checks every result bit for bit and
/// every guard byte, and returns the tile's compute cycles.
fn run_in16(case: Case16) -> u64 {
    run_in16_result(case).0
}

/// [`run_in16`], also returning the result matrix as the kernel stored it,
/// read back through the case's layout: `[row][column]` bits (f16 or f32).
fn run_in16_result(case: Case16) -> (u64, Vec<Vec<u32>>) {
    let Case16 {
        rows,
        quads,
        partials,
        out32,
        epi,
        workers,
        values,
        layout,
        acc16,
        seed,
    } = case;
    let mut rng = Rng(seed);
    // Rows padded by 24 bytes and partials by 40: strides that are multiples
    // of 8 but not of 16, which IN=16 allows.
    let rs_src = quads * 8 + 24;
    let (section, src_base, dst) = match layout {
        Layout::RowsAt(place) => (
            (rows * rs_src).next_multiple_of(16) + place.section_pad,
            if place.src_region1 { SRC1 } else { SRC16 },
            if place.dst_region1 { DST1 } else { DST },
        ),
        _ => (rows * rs_src + 40, SRC16, DST),
    };
    // The partials' bytes from src_base: up to the end of the last
    // partial's last group when that must end with tile memory.
    let (src_base, src_bytes) = match layout {
        Layout::RowsAt(Place {
            src_at_end: true,
            src_region1,
            ..
        }) => {
            assert!(src_region1, "the end of tile memory is in region 1");
            let bytes = (partials - 1) * section + (rows - 1) * rs_src + quads * 8;
            (ipu_arch::REGION1_END - bytes, bytes)
        }
        _ => (src_base, section * partials),
    };
    let ob = if out32 { 4 } else { 2 };
    assert!(!layout.transposed() || !out32, "TR=1 stores f16");
    // The guarded area starts GUARD_LEAD bytes before the result; `dst0` is
    // where element (0, 0) goes, `element(r, c)` its byte offset from `dst`.
    const GUARD_LEAD: u32 = 16;
    let (rs_dst, dst0) = match layout {
        Layout::Rows | Layout::RowsAt(_) => (quads * 4 * ob + 8, dst),
        Layout::Columns => ((2 * rows).next_multiple_of(8) + 8, DST),
        Layout::ColumnsTight => (2 * rows, DST + 2),
        Layout::ColumnsAt { lead, tight, .. } => {
            assert!(lead < 8 && lead % 2 == 0, "lead {lead}");
            if tight {
                (2 * rows, DST + lead)
            } else {
                ((2 * rows).next_multiple_of(8) + 8, DST + lead)
            }
        }
    };
    let element = |r: u32, c: u32| match layout {
        Layout::Rows | Layout::RowsAt(_) => dst0 - dst + r * rs_dst + c * ob,
        Layout::Columns | Layout::ColumnsTight | Layout::ColumnsAt { .. } => {
            dst0 - dst + c * rs_dst + 2 * r
        }
    };
    let dst_extent = match layout {
        Layout::Rows | Layout::RowsAt(_) => rows * rs_dst,
        Layout::Columns | Layout::ColumnsTight | Layout::ColumnsAt { .. } => {
            dst0 - dst + quads * 4 * rs_dst
        }
    };
    let split = match layout {
        Layout::ColumnsAt { split, .. } => split as usize,
        _ => 1,
    };
    // The placed-rows layouts exercise the two-partials-per-load object
    // (PAIRS=1): its fast path where the placement allows, its one-load
    // fallback where not.
    let pairs = acc16 && epi == 0 && matches!(layout, Layout::RowsAt(_));
    let own_tr = match layout {
        Layout::ColumnsAt { own, .. } => own,
        _ => OwnTr::Off,
    };
    assert!(
        own_tr == OwnTr::Off || acc16,
        "{case:?}: OWN=1 needs ACC=16"
    );
    let own = match layout {
        Layout::RowsAt(place) => place.own,
        _ => own_tr == OwnTr::At,
    };
    assert!(
        !own || pairs || own_tr == OwnTr::At,
        "{case:?}: OWN is a word of PAIRS=1 and OWN=1 only"
    );
    let own_word_present = pairs || own_tr != OwnTr::Off;
    let elements = (quads * 4) as usize;
    let at = |p: u32, r: u32, e: usize| ((p * rows + r) as usize) * elements + e;
    let partial_values: Vec<u16> = (0..partials as usize * rows as usize * elements)
        .map(|_| random_f16(&mut rng, values))
        .collect();
    let bias: Vec<u16> = (0..elements)
        .map(|_| f32_to_f16_bits(rng.uniform(-2.0, 2.0) as f32))
        .collect();
    let mut src = vec![0u8; (section * partials) as usize];
    let mut own_bytes = vec![0u8; if own { (rows * rs_src) as usize } else { 0 }];
    for p in 0..partials {
        for r in 0..rows {
            for e in 0..elements {
                let value = partial_values[at(p, r, e)].to_le_bytes();
                let byte = (p * section + r * rs_src) as usize + 2 * e;
                if own && p == 0 {
                    own_bytes[(r * rs_src) as usize + 2 * e..][..2].copy_from_slice(&value);
                    src[byte..byte + 2].copy_from_slice(&0xFFFFu16.to_le_bytes());
                } else {
                    src[byte..byte + 2].copy_from_slice(&value);
                }
            }
        }
    }
    let dst_bytes = dst_extent + 64;
    src.truncate(src_bytes as usize);
    let src_end = src_base + src_bytes;
    assert!(
        src_end <= dst - GUARD_LEAD || dst + dst_bytes <= src_base,
        "{case:?}: the partials overlap the result"
    );
    assert!(
        !own || (src_end <= OWN
            && (OWN + rows * rs_src <= dst - GUARD_LEAD || dst + dst_bytes <= OWN)),
        "{case:?}: partial 0 at OWN overlaps the other partials or the result"
    );
    // PAIRS=1 and OWN=1 read a tenth word: partial 0's own address, or 0.
    let own_word = |offset: u32| if own { OWN + offset } else { 0 };
    let launches: Vec<Launch> = match layout {
        Layout::RowsAt(Place {
            split_columns: true,
            ..
        }) => ranges_aligned(quads as usize, workers as usize, 4)
            .into_iter()
            .map(|(q0, q1)| Launch {
                entry: "reduce_f32".into(),
                state: vec![
                    src_base + 8 * q0 as u32,
                    section,
                    partials,
                    rs_src,
                    dst + element(0, 4 * q0 as u32),
                    rs_dst,
                    rows,
                    (q1 - q0) as u32,
                    BIAS + 8 * q0 as u32,
                ]
                .into_iter()
                .chain(own_word_present.then(|| own_word(8 * q0 as u32)))
                .collect(),
            })
            .collect(),
        _ => ranges_aligned(rows as usize, workers as usize, split)
            .into_iter()
            .map(|(r0, r1)| Launch {
                entry: "reduce_f32".into(),
                state: vec![
                    src_base + r0 as u32 * rs_src,
                    section,
                    partials,
                    rs_src,
                    dst + element(r0 as u32, 0),
                    rs_dst,
                    (r1 - r0) as u32,
                    quads,
                    BIAS,
                ]
                .into_iter()
                .chain(own_word_present.then(|| own_word(r0 as u32 * rs_src)))
                .collect(),
            })
            .collect(),
    };
    assert!(
        !acc16 || (!out32 && (epi <= 1 || (epi == 2 && !layout.transposed()))),
        "ACC=16 stores the f16 sum, EPI=2 untransposed"
    );
    let defines = [
        ("IN", 16),
        ("OUT", if out32 { 32 } else { 16 }),
        ("EPI", epi as i64),
        ("TR", if layout.transposed() { 1 } else { 0 }),
        ("ACC", if acc16 { 16 } else { 32 }),
        ("PAIRS", pairs as i64),
        ("OWN", (own_tr != OwnTr::Off) as i64),
    ];
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "reduce_f32.S",
            defines: &defines,
        }],
        &[launches],
        &[
            (src_base, src),
            (OWN, own_bytes),
            (BIAS, kernel_common::f16_bytes(&bias)),
            (
                dst - GUARD_LEAD,
                vec![GUARD; (GUARD_LEAD + dst_bytes) as usize],
            ),
        ],
    );
    let area = chip
        .peek(0, dst - GUARD_LEAD, GUARD_LEAD + dst_bytes)
        .unwrap();
    let out = &area[GUARD_LEAD as usize..];
    // Which bytes of the area hold a result element: all others must keep
    // the guard (row and column padding, the bytes before and after).
    let mut is_result = vec![false; area.len()];
    let mut result = vec![vec![0u32; elements]; rows as usize];
    for r in 0..rows {
        for e in 0..elements {
            let byte = element(r, e as u32) as usize;
            is_result[GUARD_LEAD as usize + byte..][..ob as usize].fill(true);
            let sum = sum_f16_partials((0..partials).map(|p| partial_values[at(p, r, e)]));
            let (got, want) = if acc16 {
                (
                    u16::from_le_bytes(out[byte..][..2].try_into().unwrap()) as u32,
                    epilogue_f16(
                        epi,
                        sum_f16_partials_in_f16((0..partials).map(|p| partial_values[at(p, r, e)])),
                        bias[e],
                    ) as u32,
                )
            } else if out32 {
                (
                    u32::from_le_bytes(out[byte..][..4].try_into().unwrap()),
                    sum.to_bits(),
                )
            } else {
                (
                    u16::from_le_bytes(out[byte..][..2].try_into().unwrap()) as u32,
                    epilogue(epi, sum, bias[e]) as u32,
                )
            };
            assert_eq!(
                got,
                want,
                "{case:?}: [{r}, {e}] = {got:#x}, expected {want:#x} (sum {sum:e} of {:04x?})",
                (0..partials)
                    .map(|p| partial_values[at(p, r, e)])
                    .collect::<Vec<_>>()
            );
            result[r as usize][e] = got;
        }
    }
    let stray: Vec<i64> = (0..area.len())
        .filter(|&i| !is_result[i] && area[i] != GUARD)
        .map(|i| i as i64 - GUARD_LEAD as i64)
        .collect();
    assert!(
        stray.is_empty(),
        "{case:?}: bytes outside the result written (offsets from DST): {stray:?}"
    );
    (cycles, result)
}

/// Edge shapes: one row or group, more rows than workers, uneven splits.
const SHAPES: [(u32, u32); 5] = [(1, 1), (2, 3), (7, 1), (13, 5), (6, 9)];

#[test]
fn in16_sums_f16_partials_bit_exactly() {
    for partials in 1..=8 {
        for (i, &(rows, quads)) in SHAPES.iter().enumerate() {
            for out32 in [false, true] {
                for workers in [1, 6] {
                    run_in16(Case16 {
                        rows,
                        quads,
                        partials,
                        out32,
                        epi: 0,
                        workers,
                        values: Values::Mixed,
                        layout: Layout::Rows,
                        acc16: false,
                        seed: (partials * 100 + i as u32 * 10 + workers) as u64,
                    });
                }
            }
        }
    }
}

#[test]
fn in16_signed_zeros_infinities_and_subnormals() {
    for partials in 1..=8 {
        for out32 in [false, true] {
            run_in16(Case16 {
                rows: 9,
                quads: 4,
                partials,
                out32,
                epi: 0,
                workers: 3,
                values: Values::Specials,
                layout: Layout::Rows,
                acc16: false,
                seed: 7000 + partials as u64,
            });
        }
    }
}

#[test]
fn in16_fused_bias_and_gelu_epilogues() {
    for epi in 1..=3 {
        for partials in [1, 2, 5, 8] {
            for &(rows, quads) in &[(1, 1), (5, 3), (7, 4)] {
                for (workers, values) in [(1, Values::Mixed), (4, Values::Specials)] {
                    run_in16(Case16 {
                        rows,
                        quads,
                        partials,
                        out32: false,
                        epi,
                        workers,
                        values,
                        layout: Layout::Rows,
                        acc16: false,
                        seed: (epi * 1000 + partials * 100 + rows * 10 + quads) as u64,
                    });
                }
            }
        }
    }
}

/// One worker (so the tile's cycles are one vertex's), the formula the
/// compiler reads from the object, evaluated by the compiler's evaluator.
#[test]
fn in16_cycles_match_the_declared_formula() {
    let variants = [(false, 0), (true, 0), (false, 1), (false, 2), (false, 3)];
    let mut outside = Vec::new();
    for (out32, epi) in variants {
        for &(rows, quads, partials) in &[(6, 4, 1), (6, 4, 6), (10, 8, 2), (4, 16, 8)] {
            let simulated = run_in16(Case16 {
                rows,
                quads,
                partials,
                out32,
                epi,
                workers: 1,
                values: Values::Mixed,
                layout: Layout::Rows,
                acc16: false,
                seed: 1,
            });
            let defines = [
                ("IN", 16),
                ("OUT", if out32 { 32 } else { 16 }),
                ("EPI", epi as i64),
            ];
            check_formula(
                &mut outside,
                format!("IN=16 out32={out32} EPI={epi} rows={rows} quads={quads} P={partials}"),
                &defines,
                (rows, quads, partials),
                simulated,
            );
        }
    }
    assert_formulas_hold(&outside);
}

#[test]
fn unsupported_input_width_is_a_clear_error() {
    let Err(err) = kernel_common::assemble("reduce_f32.S", &[("IN", 8)]) else {
        panic!("IN=8 must not assemble");
    };
    let message = err.to_string();
    assert!(
        message.contains("IN must be 16 (f16 partials) or 32 (f32 partials)")
            && message.contains("reduce_f32.S"),
        "{message}"
    );
}

/// TR=1 against TR=0 on the simulator: the same partials reduced by both
/// specialisations, the TR=1 result read through its column layout must be
/// the TR=0 result bit for bit (each run is also checked against the host
/// emulation and its guard bytes inside [`run_in16_result`]).
fn assert_transposed_matches_rows(case: Case16) {
    let (_, rows) = run_in16_result(Case16 {
        layout: Layout::Rows,
        ..case
    });
    let (_, columns) = run_in16_result(case);
    assert_eq!(columns, rows, "{case:?}: TR=1 differs from the TR=0 result");
}

/// Every P from 1 to 8, the edge shapes (odd row counts, one row, one
/// group), one vertex or six splitting the rows (so that two vertices write
/// the two halves of one 4-byte word), padded and back-to-back columns,
/// from a DST that is 0, 2, 4 or 6 mod 8 (six vertices then split on
/// multiples of 4, as the compiler will, or anywhere).
#[test]
fn tr_stores_the_in16_result_transposed_bit_exactly() {
    for partials in 1..=8 {
        for (i, &(rows, quads)) in SHAPES.iter().enumerate() {
            for layout in [
                Layout::Columns,
                Layout::ColumnsTight,
                Layout::ColumnsAt {
                    lead: 4,
                    tight: false,
                    split: 4,
                    own: OwnTr::Off,
                },
                Layout::ColumnsAt {
                    lead: 6,
                    tight: true,
                    split: 1,
                    own: OwnTr::Off,
                },
            ] {
                for workers in [1, 6] {
                    assert_transposed_matches_rows(Case16 {
                        rows,
                        quads,
                        partials,
                        out32: false,
                        epi: 0,
                        workers,
                        values: Values::Mixed,
                        layout,
                        acc16: false,
                        seed: (9000 + partials * 100 + i as u32 * 10 + workers) as u64,
                    });
                }
            }
        }
    }
}

#[test]
fn tr_signed_zeros_infinities_and_subnormals() {
    for partials in 1..=8 {
        for layout in [Layout::Columns, Layout::ColumnsTight] {
            assert_transposed_matches_rows(Case16 {
                rows: 9,
                quads: 4,
                partials,
                out32: false,
                epi: 0,
                workers: 3,
                values: Values::Specials,
                layout,
                acc16: false,
                seed: 17000 + partials as u64,
            });
        }
    }
}

#[test]
fn tr_with_fused_bias_and_gelu_epilogues() {
    for epi in 1..=3 {
        for partials in [1, 2, 5, 8] {
            for &(rows, quads) in &[(1, 1), (5, 3), (7, 4)] {
                for (workers, values, layout) in [
                    (1, Values::Mixed, Layout::Columns),
                    (6, Values::Specials, Layout::ColumnsTight),
                ] {
                    assert_transposed_matches_rows(Case16 {
                        rows,
                        quads,
                        partials,
                        out32: false,
                        epi,
                        workers,
                        values,
                        layout,
                        acc16: false,
                        seed: (20000 + epi * 1000 + partials * 100 + rows * 10 + quads) as u64,
                    });
                }
            }
        }
    }
}

/// One vertex, the declared TR=1 formula evaluated by the compiler's
/// evaluator, within 3% of the simulator for every EPI.
#[test]
fn tr_cycles_match_the_declared_formula() {
    let mut outside = Vec::new();
    for epi in 0..=3 {
        for &(rows, quads, partials) in &[(6, 4, 1), (6, 4, 6), (21, 4, 6), (10, 8, 2), (4, 16, 8)]
        {
            let simulated = run_in16(Case16 {
                rows,
                quads,
                partials,
                out32: false,
                epi,
                workers: 1,
                values: Values::Mixed,
                layout: Layout::Columns,
                acc16: false,
                seed: 1,
            });
            check_formula(
                &mut outside,
                format!("TR=1 EPI={epi} rows={rows} quads={quads} P={partials}"),
                &[("IN", 16), ("EPI", epi as i64), ("TR", 1)],
                (rows, quads, partials),
                simulated,
            );
        }
    }
    assert_formulas_hold(&outside);
}

/// The shape of issue 5: ROWS 122 split over six vertices, QUADS 4, P 6.
/// The tile's cycles (six vertices at once, plus the supervisor's launches)
/// for TR=0 and TR=1, and the declared per-vertex figure for the largest
/// share (21 rows): TR=1 must cost little more than TR=0 and stay within 5%
/// of its formula.
#[test]
fn tr_cost_on_the_attention_shape() {
    let case = |layout| Case16 {
        rows: 122,
        quads: 4,
        partials: 6,
        out32: false,
        epi: 0,
        workers: 6,
        values: Values::Mixed,
        layout,
        acc16: false,
        seed: 122,
    };
    let rows_cycles = run_in16(case(Layout::Rows));
    let columns_cycles = run_in16(case(Layout::Columns));
    let share = ranges_aligned(122, 6, 1)
        .iter()
        .map(|(a, b)| (b - a) as u64)
        .max()
        .unwrap();
    let vars = [("ROWS", share), ("QUADS", 4), ("P", 6)];
    let declared_rows = declared_cycles("reduce_f32.S", &[("IN", 16)], &vars);
    let declared_columns = declared_cycles("reduce_f32.S", &[("IN", 16), ("TR", 1)], &vars);
    println!(
        "ROWS 122 / 6 vertices, QUADS 4, P 6: TR=0 simulated {rows_cycles} (.cycles {declared_rows} for {share} rows), TR=1 simulated {columns_cycles} (.cycles {declared_columns})"
    );
    let ratio = declared_columns as f64 / columns_cycles as f64;
    assert!(
        (0.95..1.05).contains(&ratio),
        "TR=1 .cycles {declared_columns} vs simulated {columns_cycles}"
    );
    assert!(
        columns_cycles < rows_cycles + rows_cycles / 20,
        "TR=1 {columns_cycles} costs 5% or more over TR=0 {rows_cycles}"
    );
}

#[test]
fn tr_needs_f16_partials_and_f16_results() {
    for (defines, what) in [
        (&[("TR", 1)][..], "IN=32"),
        (&[("TR", 1), ("IN", 16), ("OUT", 32)][..], "OUT=32"),
        (&[("TR", 2), ("IN", 16)][..], "TR=2"),
    ] {
        let Err(err) = kernel_common::assemble("reduce_f32.S", defines) else {
            panic!("{what} with TR must not assemble");
        };
        let message = err.to_string();
        assert!(
            message
                .contains("TR must be 0 or 1, and TR=1 (transposed result) needs IN=16 and OUT=16")
                && message.contains("reduce_f32.S"),
            "{what}: {message}"
        );
    }
}

/// Objects record TR=0 when it is not given, so a request naming TR=0
/// matches the untransposed objects only.
#[test]
fn objects_record_the_default_tr() {
    for (defines, tr) in [(&[("IN", 16)][..], 0), (&[("IN", 16), ("TR", 1)][..], 1)] {
        let assembly = kernel_common::assemble("reduce_f32.S", defines).unwrap();
        assert_eq!(
            assembly.metadata.parameters.get("TR"),
            Some(&tr),
            "{defines:?}"
        );
    }
}

/// `half`'s f16 add (the host emulation of ACC=16) against the simulator's
/// `f16v4add`, which rounds the exact (f64) sum once to nearest even with
/// `ipu_isa::numerics::f64_to_f16_bits` (rust/ipu-sim/src/fpu.rs, `f16_op`):
/// `half` rounds the f32 sum to f16, and since f32 has 24 >= 2 * 11 + 2
/// significand bits that double rounding is innocuous for addition. Every
/// f16 (NaNs aside) against a stride through all of them, the specials and
/// every subnormal; NaN results compare as NaN (the device's is canonical).
#[test]
fn half_f16_add_is_the_simulators_f16v4add() {
    let is_nan = |h: u16| h & 0x7C00 == 0x7C00 && h & 0x3FF != 0;
    let seconds: Vec<u16> = (0..=u16::MAX)
        .step_by(251)
        .chain(0..0x400)
        .chain(0x8000..0x8400)
        .chain([
            0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x0400, 0x8400,
        ])
        .filter(|&h| !is_nan(h))
        .collect();
    let mut mismatches = Vec::new();
    for a in (0..=u16::MAX).filter(|&h| !is_nan(h)) {
        for &b in &seconds {
            let exact = f16_bits_to_f32(a) as f64 + f16_bits_to_f32(b) as f64;
            let device = ipu_isa::numerics::f64_to_f16_bits(exact);
            let host = (half::f16::from_bits(a) + half::f16::from_bits(b)).to_bits();
            if host != device && !(is_nan(host) && device == 0x7E00) {
                mismatches.push((a, b, host, device));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches (a, b, half, f16v4add), first: {:04x?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(8)]
    );
}

/// ACC=16 on the edge shapes, every P from 1 to 8 (unrolled) and some past
/// it (the generic loop), one vertex or six splitting the rows (odd row
/// counts), TR=0 and both TR=1 layouts: bit for bit against the f16 host
/// emulation, every byte around the result guarded.
#[test]
fn acc16_sums_f16_partials_in_f16_bit_exactly() {
    for partials in (1..=10).chain([13, 17]) {
        for (i, &(rows, quads)) in SHAPES.iter().enumerate() {
            for layout in [Layout::Rows, Layout::Columns, Layout::ColumnsTight] {
                for workers in [1, 6] {
                    run_in16(Case16 {
                        workers,
                        layout,
                        seed: (30000 + partials * 100 + i as u32 * 10 + workers) as u64,
                        ..Case16::acc16(rows, quads, partials)
                    });
                }
            }
        }
    }
}

/// Signed zeros (-0 + -0 stays -0, +0 + -0 is +0), infinities (inf - inf
/// is the canonical NaN), overflow of the largest finite f16, subnormals;
/// TR=1 against the simulated TR=0 result of the same partials.
#[test]
fn acc16_signed_zeros_infinities_and_subnormals() {
    for partials in (1..=9).chain([12]) {
        run_in16(Case16 {
            workers: 3,
            values: Values::Specials,
            seed: 37000 + partials as u64,
            ..Case16::acc16(9, 4, partials)
        });
        for layout in [Layout::Columns, Layout::ColumnsTight] {
            assert_transposed_matches_rows(Case16 {
                workers: 3,
                values: Values::Specials,
                layout,
                seed: 38000 + partials as u64,
                ..Case16::acc16(9, 4, partials)
            });
        }
    }
}

/// ACC=16 TR=1's four-row blocks (docs/kernels.md): every P from 1 to 10
/// and 13, 17 (past 8 the generic one-row loop), ROWS 1..13 and 61, QUADS
/// 1..5 and 16, and in rotation over those: element (0, 0) 8-aligned or 2, 4,
/// 6 mod 8 (three, two or one head rows on the one-row path), padded
/// columns (RS_DST a multiple of 8) or back-to-back ones (RS_DST = 2 ROWS: a
/// multiple of 8 only for ROWS a multiple of 4), one vertex, six with row
/// ranges starting on multiples of 4 (the compiler's split) or six starting
/// anywhere (vertices sharing 4-byte words and 8-byte blocks' neighbours).
/// Bit for bit against the f16 host emulation, every byte around and
/// between the columns guarded. Without and with the bias (EPI=1, whose
/// blocks take P = 2..8 and whose rotation starts elsewhere).
#[test]
fn acc16_tr_four_row_blocks_bit_exactly() {
    for epi in [0, 1] {
        let mut i = 3 * epi;
        for partials in (1..=10).chain([13, 17]) {
            for rows in (1..=13).chain([61]) {
                for quads in [1, 2, 3, 4, 5, 16] {
                    let (workers, split) = [(1, 1), (6, 4), (6, 1)][(i / 8 % 3) as usize];
                    run_in16(Case16 {
                        epi,
                        workers,
                        layout: Layout::ColumnsAt {
                            lead: 2 * (i % 4),
                            tight: i / 4 % 2 == 1,
                            split,
                            own: OwnTr::Off,
                        },
                        seed: 50000 + 10000 * epi as u64 + i as u64,
                        ..Case16::acc16(rows, quads, partials)
                    });
                    i += 1;
                }
            }
        }
    }
}

/// The four-row blocks on signed zeros, infinities (inf - inf: the
/// canonical NaN), the largest finite f16 and subnormals, from every DST
/// alignment, one vertex or several, without and with the bias: TR=1
/// against the simulated TR=0 result of the same partials.
#[test]
fn acc16_tr_four_row_blocks_on_specials() {
    for epi in [0, 1] {
        for partials in (1..=9).chain([12]) {
            for (rows, quads, lead, workers, split) in [
                (12, 4, 0, 1, 1),
                (13, 3, 6, 3, 4),
                (24, 2, 0, 6, 4),
                (10, 5, 2, 6, 1),
                (8, 4, 4, 2, 4),
            ] {
                assert_transposed_matches_rows(Case16 {
                    epi,
                    workers,
                    values: Values::Specials,
                    layout: Layout::ColumnsAt {
                        lead,
                        tight: false,
                        split,
                        own: OwnTr::Off,
                    },
                    seed: 57000 + 1000 * epi as u64 + partials as u64 * 10 + lead as u64,
                    ..Case16::acc16(rows, quads, partials)
                });
            }
        }
    }
}

/// ACC=16 TR=1 in the compiler's layout (element (0, 0) 8-aligned, RS_DST a
/// multiple of 8; back-to-back columns of a multiple of 4 rows qualify too),
/// one vertex: the declared formula within 3% of the simulator with fewer
/// than four rows (no block), a multiple of 4, and 1..3 rows past one (on
/// the one-row path), one group and many, P 1..8 and 9 (the generic
/// one-row loop).
#[test]
fn acc16_tr_four_row_cycles_match_the_declared_formula() {
    let mut outside = Vec::new();
    for partials in [1, 2, 3, 4, 6, 8, 9] {
        for rows in [1, 3, 4, 5, 7, 8, 13, 21, 61] {
            for quads in [1, 4, 16] {
                for tight in [false, true] {
                    if tight && rows % 4 != 0 {
                        continue;
                    }
                    let simulated = run_in16(Case16 {
                        layout: Layout::ColumnsAt {
                            lead: 0,
                            tight,
                            split: 1,
                            own: OwnTr::Off,
                        },
                        seed: 3,
                        ..Case16::acc16(rows, quads, partials)
                    });
                    check_formula(
                        &mut outside,
                        format!("ACC=16 TR=1 rows={rows} quads={quads} P={partials} tight={tight}"),
                        &[("IN", 16), ("ACC", 16), ("TR", 1)],
                        (rows, quads, partials),
                        simulated,
                    );
                }
            }
        }
    }
    assert_formulas_hold(&outside);
}

/// ACC=16 TR=1 with partial 0 from its own address (`OWN=1`, state word
/// OWN: a transposed reduce-scatter reads the tile's own piece where its
/// GEMM left it). Every P from 2 to 8, ROWS 1..13 and 61, QUADS 1..5 and
/// 16, in rotation element (0, 0) 8-aligned or 2, 4, 6 mod 8 (head rows on
/// the one-row path), padded or back-to-back columns, one vertex or six
/// (row ranges from multiples of 4, or anywhere): bit for bit against the
/// host emulation with SRC's slot 0 full of NaNs that must not be read.
/// The same object with OWN = 0 sums partial 0 at SRC for every P (1..10,
/// 13, 17: the generic loop too). One-vertex runs in the compiler's layout
/// within 3% of the declared formula, with and without OWN.
#[test]
fn acc16_tr_partial_zero_from_its_own_address() {
    let mut outside = Vec::new();
    let mut i = 0u32;
    for partials in (1..=10).chain([13, 17]) {
        for rows in (1..=13).chain([61]) {
            for quads in [1, 2, 3, 4, 5, 16] {
                let (workers, split) = [(1, 1), (6, 4), (6, 1)][(i / 8 % 3) as usize];
                let own = if (2..=8).contains(&partials) && !i.is_multiple_of(3) {
                    OwnTr::At
                } else {
                    OwnTr::Zero
                };
                let lead = if workers == 1 && i.is_multiple_of(5) {
                    0
                } else {
                    2 * (i % 4)
                };
                let tight = i / 4 % 2 == 1 && rows % 4 == 0;
                let simulated = run_in16(Case16 {
                    workers,
                    layout: Layout::ColumnsAt {
                        lead,
                        tight,
                        split,
                        own,
                    },
                    seed: 81000 + i as u64,
                    ..Case16::acc16(rows, quads, partials)
                });
                if workers == 1 && lead == 0 {
                    check_formula(
                        &mut outside,
                        format!(
                            "ACC=16 TR=1 OWN=1 rows={rows} quads={quads} P={partials} {own:?} tight={tight}"
                        ),
                        &[("IN", 16), ("ACC", 16), ("TR", 1), ("OWN", 1)],
                        (rows, quads, partials),
                        simulated,
                    );
                }
                i += 1;
            }
        }
    }
    assert_formulas_hold(&outside);
}

/// A transposed OWN vertex the kernel cannot serve (P = 1: nothing to
/// gather; P > 8: the generic loop, which steps without OWN) faults rather
/// than sum the NaNs at SRC.
#[test]
fn acc16_tr_own_partial_outside_two_to_eight_partials_faults() {
    for partials in [1, 9] {
        let run = std::panic::catch_unwind(|| {
            run_in16(Case16 {
                layout: Layout::ColumnsAt {
                    lead: 0,
                    tight: false,
                    split: 1,
                    own: OwnTr::At,
                },
                seed: 9,
                ..Case16::acc16(8, 2, partials)
            })
        });
        let message = run
            .err()
            .and_then(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            })
            .unwrap_or_default();
        assert!(
            message.contains("4-byte access at 0x0 is outside tile SRAM"),
            "P={partials}: expected the deliberate fault, got {message:?}"
        );
    }
}

/// The ACC=16 formulas against the simulator (one vertex): the sum alone
/// with TR=0 (in the layout its formula describes: partials in region 1,
/// SECTION = 8 mod 16, the result in region 0) and TR=1, the bias (EPI=1)
/// and bias + GELU (EPI=2) epilogues with TR=0; unrolled and generic P,
/// one and many groups per row, within 3%.
#[test]
fn acc16_cycles_match_the_declared_formula() {
    let shapes = [
        (6, 4, 1),
        (6, 4, 2),
        (6, 4, 6),
        (21, 4, 6),
        (10, 8, 4),
        (4, 16, 8),
        (6, 4, 9),
        (5, 6, 17),
    ];
    // The epilogues also at the SigLIP MLP's shape and a one-group row.
    let epilogue_shapes = [(8, 12, 6), (3, 1, 5)];
    let mut outside = Vec::new();
    for (epi, layout, values, seed) in [
        (0, Layout::RowsAt(FAST), Values::Mixed, 1),
        (0, Layout::Columns, Values::Mixed, 1),
        (1, Layout::Rows, Values::Activations, 2),
        (2, Layout::Rows, Values::Activations, 2),
    ] {
        let tr = if layout.transposed() { 1 } else { 0 };
        let extra: &[(u32, u32, u32)] = if epi > 0 { &epilogue_shapes } else { &[] };
        for &(rows, quads, partials) in shapes.iter().chain(extra) {
            let simulated = run_in16(Case16 {
                epi,
                values,
                layout,
                seed,
                ..Case16::acc16(rows, quads, partials)
            });
            check_formula(
                &mut outside,
                format!("ACC=16 EPI={epi} TR={tr} rows={rows} quads={quads} P={partials}"),
                &[
                    ("IN", 16),
                    ("ACC", 16),
                    ("EPI", epi as i64),
                    ("TR", tr),
                    ("PAIRS", matches!(layout, Layout::RowsAt(_)) as i64),
                ],
                (rows, quads, partials),
                simulated,
            );
        }
    }
    assert_formulas_hold(&outside);
}

/// The shape of issue 5 (ROWS 122 over six vertices, QUADS 4, P 6) with f16
/// and f32 sums, TR=0 and TR=1: the tile's cycles, and the ACC=16 formula
/// for the largest share within 5% of the simulated tile. TR=0 splits the
/// rows anywhere (21 rows at most), with the partials and the result where
/// its formula expects them (two partials per load); TR=1 as the compiler
/// will, on multiples of 4 from an 8-aligned DST (22 rows at most: five
/// four-row blocks and two rows on the one-row path), where it must cost
/// under 10% more than TR=0 with one load per partial (the same P + 1
/// bundles per group). Split anywhere, TR=1's vertices start with up to
/// three rows on the one-row path; that must still beat the one-row path
/// alone on the same split (back-to-back columns, RS_DST = 244, not a
/// multiple of 8) by 10%.
#[test]
fn acc16_cost_on_the_attention_shape() {
    let case = |layout, acc16| Case16 {
        rows: 122,
        quads: 4,
        partials: 6,
        out32: false,
        epi: 0,
        workers: 6,
        values: Values::Mixed,
        layout,
        acc16,
        seed: 122,
    };
    let largest_share = |split| {
        ranges_aligned(122, 6, split)
            .iter()
            .map(|(a, b)| (b - a) as u64)
            .max()
            .unwrap()
    };
    let compilers_split = Layout::ColumnsAt {
        lead: 0,
        tight: false,
        split: 4,
        own: OwnTr::Off,
    };
    let mut acc16_cycles = Vec::new();
    for (layout, tr, split) in [(Layout::RowsAt(FAST), 0, 1), (compilers_split, 1, 4)] {
        let share = largest_share(split);
        let vars = [("ROWS", share), ("QUADS", 4), ("P", 6)];
        let f32_sums = run_in16(case(layout, false));
        let f16_sums = run_in16(case(layout, true));
        let declared = declared_cycles(
            "reduce_f32.S",
            &[("IN", 16), ("ACC", 16), ("TR", tr), ("PAIRS", 1 - tr)],
            &vars,
        );
        println!(
            "ROWS 122 / 6 vertices (ranges from multiples of {split}), QUADS 4, P 6, TR={tr}: ACC=32 simulated {f32_sums}, ACC=16 simulated {f16_sums} (.cycles {declared} for {share} rows)"
        );
        let ratio = declared as f64 / f16_sums as f64;
        assert!(
            (0.95..1.05).contains(&ratio),
            "TR={tr}: ACC=16 .cycles {declared} vs simulated {f16_sums}"
        );
        // The main slot bounds ACC=16 (P + 1 bundles per group, TR=1 the
        // same in four-row blocks) where ACC=32 is bound by its arithmetic
        // (4P + 5, TR=1 4P + 6).
        assert!(
            5 * f16_sums < 2 * f32_sums,
            "TR={tr}: ACC=16 {f16_sums} is not under 40% of ACC=32 {f32_sums}"
        );
        acc16_cycles.push(f16_sums);
    }
    let columns = acc16_cycles[1];
    let one_load = run_in16(case(Layout::Rows, true));
    println!(
        "ROWS 122 / 6 vertices, QUADS 4, P 6, ACC=16 TR=0 with one load per partial (partials in region 0): simulated {one_load}"
    );
    assert!(
        10 * columns < 11 * one_load,
        "ACC=16 TR=1 {columns} costs 10% or more over TR=0 with one load per partial {one_load}"
    );
    let anywhere = run_in16(case(Layout::Columns, true));
    let one_row_only = run_in16(case(Layout::ColumnsTight, true));
    println!(
        "ROWS 122 / 6 vertices (ranges from any row), QUADS 4, P 6, ACC=16 TR=1: simulated {anywhere}; the one-row path alone (RS_DST = 244): {one_row_only}"
    );
    assert!(
        10 * anywhere < 9 * one_row_only,
        "ACC=16 TR=1 split anywhere {anywhere} is not 10% under the one-row path {one_row_only}"
    );
}

/// One vertex of ROWS 10, QUADS 16, P 6 (two four-row blocks and two rows)
/// and of ROWS 13, QUADS 8, P 3 (three blocks and a row) from an 8-aligned
/// DST with padded columns, against the one-row path alone on the same
/// partials (back-to-back columns from DST + 2, RS_DST = 2 ROWS, not a
/// multiple of 8), each run checked bit for bit: the blocks' P + 1 bundles
/// per group against the one-row path's P + 4 must save at least 20% (P 6)
/// or 30% (P 3) of the cycles.
#[test]
fn acc16_tr_blocks_against_the_one_row_path() {
    for (rows, quads, partials, percent) in [(10, 16, 6, 80), (13, 8, 3, 70)] {
        let case = |layout| Case16 {
            layout,
            seed: 1016,
            ..Case16::acc16(rows, quads, partials)
        };
        let blocks = run_in16(case(Layout::Columns));
        let one_row = run_in16(case(Layout::ColumnsTight));
        let declared = declared_cycles(
            "reduce_f32.S",
            &[("IN", 16), ("ACC", 16), ("TR", 1)],
            &[
                ("ROWS", rows as u64),
                ("QUADS", quads as u64),
                ("P", partials as u64),
            ],
        );
        println!(
            "ROWS {rows}, QUADS {quads}, P {partials}, one vertex, ACC=16 TR=1: simulated {blocks} (.cycles {declared}); the one-row path alone: {one_row}"
        );
        assert!(
            100 * blocks < percent * one_row,
            "ROWS {rows} QUADS {quads} P {partials}: {blocks} is not under {percent}% of the one-row path's {one_row}"
        );
    }
}

/// [`FAST`] with 12 KiB more per section: the partials spread over several
/// 32 KiB elements, pairs i, i + 1 straddling element boundaries.
const FAST_SPREAD: Place = Place {
    section_pad: 0x3008,
    ..FAST
};

/// An ACC=16 TR=0 EPI=0 case on `place`, one vertex or `workers` splitting
/// the rows or (`place.split_columns`) the columns.
fn rows_case(
    rows: u32,
    quads: u32,
    partials: u32,
    workers: u32,
    place: Place,
    seed: u64,
) -> Case16 {
    Case16 {
        workers,
        layout: Layout::RowsAt(place),
        seed,
        ..Case16::acc16(rows, quads, partials)
    }
}

/// The declared `.cycles` of ACC=16 TR=0 EPI=0 for one vertex.
fn acc16_rows_declared(rows: u32, quads: u32, partials: u32) -> u64 {
    declared_cycles(
        "reduce_f32.S",
        &[("IN", 16), ("ACC", 16), ("TR", 0), ("PAIRS", 1)],
        &[
            ("ROWS", rows as u64),
            ("QUADS", quads as u64),
            ("P", partials as u64),
        ],
    )
}

/// ACC=16 TR=0 with two partials per load (docs/kernels.md, "Two partials
/// per load"): every P from 1 to 10 and 13, 17 (past 8 the generic loop),
/// ROWS 1..13 and 61, QUADS 1..5 and 16 (the three classes of QUADS: 1, 2,
/// 3 or more), in rotation one vertex, six splitting the rows (uneven and
/// odd shares) or six splitting the columns in blocks of four groups (the
/// compiler's 16-column groups), with SECTION = 8 mod 16 and the partials
/// in one element (small shapes) or spread over several. Every shape also
/// runs on a placement that must take the one-load path, in rotation:
/// SECTION a multiple of 16 (partials in one element, or spread), the
/// result in region 1, or the partials in region 0. Bit for bit against the
/// f16 host emulation, every byte around and between the result rows
/// guarded (the harness), so that neither path writes outside the ROWS x 4
/// QUADS results, nor stores a value that is not the last result.
///
/// That the fast placements do take the two-partial path: one-vertex runs
/// of P <= 8 must simulate within 3% of the declared formula (which
/// describes that path), and their one-load twins (the same partials and
/// shape on the rotation's one-load placement) must cost more wherever the
/// vertex has at least 8 groups (P >= 2) or 16 (P = 1).
#[test]
fn acc16_rows_two_partials_per_load_bit_exactly() {
    let mut i = 0u32;
    let mut outside = Vec::new();
    let mut compared = 0;
    for partials in (1..=10).chain([13, 17]) {
        for rows in (1..=13).chain([61]) {
            for quads in [1, 2, 3, 4, 5, 16] {
                let (workers, split_columns) =
                    [(1, false), (6, false), (6, true)][(i % 3) as usize];
                let fast = Place {
                    split_columns,
                    ..[FAST, FAST_SPREAD][(i / 3 % 2) as usize]
                };
                let slow = [
                    Place {
                        section_pad: 16,
                        ..fast
                    },
                    Place {
                        section_pad: 0x3000,
                        ..fast
                    },
                    Place {
                        dst_region1: true,
                        ..fast
                    },
                    Place {
                        src_region1: false,
                        ..fast
                    },
                ][(i / 2 % 4) as usize];
                let seed = 60000 + i as u64;
                let cycles = run_in16(rows_case(rows, quads, partials, workers, fast, seed));
                let slow_cycles = run_in16(rows_case(rows, quads, partials, workers, slow, seed));
                if workers == 1 && partials <= 8 {
                    check_formula(
                        &mut outside,
                        format!("ACC=16 TR=0 rows={rows} quads={quads} P={partials} {fast:?}"),
                        &[("IN", 16), ("ACC", 16), ("TR", 0), ("PAIRS", 1)],
                        (rows, quads, partials),
                        cycles,
                    );
                    if rows * quads >= if partials == 1 { 16 } else { 8 } {
                        assert!(
                            cycles < slow_cycles,
                            "rows={rows} quads={quads} P={partials}: {fast:?} {cycles} cycles, not under the one-load path's {slow_cycles} ({slow:?})"
                        );
                        compared += 1;
                    }
                }
                i += 1;
            }
        }
    }
    assert_formulas_hold(&outside);
    assert!(compared > 100, "{compared} comparisons");
}

/// The two-partial path on signed zeros (-0 + -0 stays -0, +0 + -0 is
/// +0), infinities (inf - inf is the canonical NaN), overflow of the
/// largest finite f16 and subnormals, every P up to 9 and 12, each class
/// of QUADS, split over the rows or the columns: bit for bit against the
/// host emulation, and equal to the one-load path's result.
#[test]
fn acc16_rows_two_partials_per_load_on_specials() {
    for partials in (1..=9).chain([12]) {
        for (rows, quads, workers, place) in [
            (9, 4, 3, FAST),
            (5, 1, 1, FAST_SPREAD),
            (7, 2, 2, FAST),
            (
                6,
                12,
                3,
                Place {
                    split_columns: true,
                    ..FAST_SPREAD
                },
            ),
        ] {
            let case = |place| Case16 {
                values: Values::Specials,
                ..rows_case(
                    rows,
                    quads,
                    partials,
                    workers,
                    place,
                    37000 + partials as u64,
                )
            };
            let (_, fast) = run_in16_result(case(place));
            let (_, slow) = run_in16_result(case(Place {
                section_pad: 16,
                ..place
            }));
            assert_eq!(fast, slow, "rows={rows} quads={quads} P={partials}");
        }
    }
}

/// Nothing past the partials is read, on either path for P <= 8: the last
/// group of the last partial's last row ends where tile memory ends
/// (0xE8000), so that a load past it faults. Every P up to 8, each class of
/// QUADS, one vertex or six splitting the rows or the columns (the last
/// vertex reaches the end), SECTION = 8 mod 16 (two partials per load) and
/// 0 mod 16 (one load per partial).
#[test]
fn acc16_rows_read_nothing_past_the_partials() {
    for partials in 1..=8 {
        for (rows, quads, workers, split_columns) in [
            (1, 1, 1, false),
            (3, 1, 1, false),
            (2, 2, 1, false),
            (5, 3, 1, false),
            (7, 4, 1, false),
            (13, 5, 6, false),
            (4, 16, 6, true),
        ] {
            for section_pad in [8, 16] {
                let place = Place {
                    section_pad,
                    split_columns,
                    src_at_end: true,
                    ..FAST
                };
                run_in16(rows_case(
                    rows,
                    quads,
                    partials,
                    workers,
                    place,
                    9000 + partials as u64,
                ));
            }
        }
    }
}

/// The two-partial path against the one-load path on the same partials
/// (SECTION a multiple of 16 instead of 8 mod 16), one vertex of ROWS 21,
/// QUADS 8 and the six vertices of ROWS 62 x QUADS 48 split by columns (12
/// column groups of 16, two per vertex), P 4 (3 bundles per group instead
/// of 5) and P 6 (5 instead of 7): at least 20% fewer cycles, and the
/// one-vertex run within 3% of the declared formula.
#[test]
fn acc16_rows_two_partials_per_load_against_one_load() {
    let mut failures = Vec::new();
    for partials in [4, 6] {
        for (rows, quads, workers, split_columns) in [(21, 8, 1, false), (62, 48, 6, true)] {
            let fast = Place {
                split_columns,
                ..FAST
            };
            let seed = 4862;
            let pairs = run_in16(rows_case(rows, quads, partials, workers, fast, seed));
            let one_load = run_in16(rows_case(
                rows,
                quads,
                partials,
                workers,
                Place {
                    section_pad: 16,
                    ..fast
                },
                seed,
            ));
            let vertex_quads = quads / workers;
            let declared = acc16_rows_declared(rows, vertex_quads, partials);
            println!(
                "ACC=16 TR=0 ROWS {rows}, QUADS {quads} over {workers} vertices ({vertex_quads} each), P {partials}: two partials per load {pairs} cycles (.cycles {declared} per vertex), one load per partial {one_load} ({:.1}% less)",
                100.0 * (1.0 - pairs as f64 / one_load as f64)
            );
            if 5 * pairs > 4 * one_load {
                failures.push(format!(
                    "P {partials} ROWS {rows} QUADS {quads}: {pairs} is not 20% under {one_load}"
                ));
            }
            let ratio = declared as f64 / pairs as f64;
            if workers == 1 && !(0.97..1.03).contains(&ratio) {
                failures.push(format!(
                    "P {partials} ROWS {rows} QUADS {quads}: declared {declared} vs simulated {pairs}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Partial 0 from its own address (state word OWN, PAIRS=1): the tile's
/// own piece of a reduce-scatter read where its GEMM left it, so that the
/// exchange need not copy it into the gather. Every P from 1 to 8, each
/// class of QUADS, one vertex or six splitting the rows or the columns,
/// the partials in one element or spread over several: bit for bit against
/// the host emulation (partial 0 first, SRC's slot 0 full of NaNs that
/// must not be read), and one-vertex runs within 3% of the declared
/// formula.
#[test]
fn acc16_rows_partial_zero_from_its_own_address() {
    let mut outside = Vec::new();
    let mut i = 0u32;
    for partials in 1..=8 {
        for (rows, quads) in [(1, 1), (3, 2), (7, 3), (13, 5), (21, 8), (4, 16)] {
            let (workers, split_columns) = [(1, false), (6, false), (6, true)][(i % 3) as usize];
            let place = Place {
                split_columns,
                own: true,
                ..[FAST, FAST_SPREAD][(i / 3 % 2) as usize]
            };
            let seed = 71000 + i as u64;
            let cycles = run_in16(rows_case(rows, quads, partials, workers, place, seed));
            if workers == 1 {
                check_formula(
                    &mut outside,
                    format!("ACC=16 TR=0 OWN rows={rows} quads={quads} P={partials} {place:?}"),
                    &[("IN", 16), ("ACC", 16), ("TR", 0), ("PAIRS", 1)],
                    (rows, quads, partials),
                    cycles,
                );
            }
            i += 1;
        }
    }
    assert_formulas_hold(&outside);
}

/// OWN where the two-partial path cannot run (SECTION a multiple of 16:
/// the one-load path, which reads partial 0 at SRC) is a broken contract:
/// the vertex faults instead of summing the NaNs at SRC.
#[test]
#[should_panic(expected = "4-byte access at 0x0 is outside tile SRAM")]
fn acc16_rows_own_partial_off_the_fast_path_faults() {
    run_in16(rows_case(
        5,
        3,
        4,
        1,
        Place {
            section_pad: 16,
            own: true,
            ..FAST
        },
        5,
    ));
}

#[test]
fn acc16_needs_f16_partials_f16_results_and_untransposed_epilogues() {
    for (defines, what) in [
        (&[("ACC", 16)][..], "IN=32"),
        (&[("ACC", 16), ("IN", 16), ("OUT", 32)][..], "OUT=32"),
        (&[("ACC", 16), ("IN", 16), ("EPI", 3)][..], "EPI=3"),
        (
            &[("ACC", 16), ("IN", 16), ("EPI", 2), ("TR", 1)][..],
            "EPI=2 TR=1",
        ),
        (&[("ACC", 8), ("IN", 16)][..], "ACC=8"),
    ] {
        let Err(err) = kernel_common::assemble("reduce_f32.S", defines) else {
            panic!("{what} with ACC must not assemble");
        };
        let message = err.to_string();
        assert!(
            message.contains(
                "ACC must be 32 (f32 sums) or 16 (f16 sums), and ACC=16 needs IN=16, OUT=16 and EPI 0, 1 or 2 (EPI=2 with TR=0)"
            ) && message.contains("reduce_f32.S"),
            "{what}: {message}"
        );
    }
}

/// PAIRS=1 (two partials per load) exists for ACC=16 EPI=0 TR=0 only; the
/// error names the file and the rule.
#[test]
fn pairs_needs_acc16_without_epilogue_or_transpose() {
    for (defines, what) in [
        (&[("IN", 16), ("PAIRS", 1)][..], "ACC=32"),
        (
            &[("ACC", 16), ("IN", 16), ("TR", 1), ("PAIRS", 1)][..],
            "TR=1",
        ),
        (
            &[("ACC", 16), ("IN", 16), ("EPI", 1), ("PAIRS", 1)][..],
            "EPI=1",
        ),
        (&[("ACC", 16), ("IN", 16), ("PAIRS", 2)][..], "PAIRS=2"),
    ] {
        let Err(err) = kernel_common::assemble("reduce_f32.S", defines) else {
            panic!("{what} with PAIRS must not assemble");
        };
        let message = err.to_string();
        assert!(
            message.contains("PAIRS must be 0 or 1, and PAIRS=1 (two partials per load) needs ACC=16, EPI=0 and TR=0")
                && message.contains("reduce_f32.S"),
            "{what}: {message}"
        );
    }
    // Objects record PAIRS=0 by default, so requests can tell them apart.
    let assembly = kernel_common::assemble("reduce_f32.S", &[("ACC", 16), ("IN", 16)]).unwrap();
    assert_eq!(assembly.metadata.parameters.get("PAIRS"), Some(&0));
}

/// ACC=16 with the bias (EPI=1) and bias + GELU (EPI=2) epilogues on the
/// edge shapes, every P from 1 to 8 (unrolled) and past it (the generic
/// loop), one vertex or six splitting the rows: bit for bit against the
/// host emulation of the documented f16 op order, pre-activations over
/// GELU's whole range (exp overflow, identity region), every byte around
/// the result guarded.
#[test]
fn acc16_bias_and_gelu_epilogues_bit_exactly() {
    for epi in [1, 2] {
        for partials in (1..=10).chain([13]) {
            for (i, &(rows, quads)) in SHAPES.iter().enumerate() {
                for workers in [1, 6] {
                    for values in [Values::Mixed, Values::Activations] {
                        run_in16(Case16 {
                            epi,
                            workers,
                            values,
                            seed: (40000 + epi * 1000 + partials * 100 + i as u32 * 10 + workers)
                                as u64,
                            ..Case16::acc16(rows, quads, partials)
                        });
                    }
                }
            }
        }
    }
}

/// ACC=16 EPI=1 TR=1 (the bias add with the result stored transposed, for
/// the column attention layout's biased Q and V projections): the edge
/// shapes, every P from 1 to 8 (unrolled) and past it (the generic loop),
/// one vertex or six splitting the rows anywhere (vertices sharing 4-byte
/// words), padded columns or back-to-back ones, element (0, 0) at any even
/// offset: bit for bit against the host emulation, every byte around and
/// between the columns guarded, and against the simulated TR=0 result of
/// the same partials.
#[test]
fn acc16_bias_stored_transposed_bit_exactly() {
    let mut i = 0u32;
    for partials in (1..=10).chain([13]) {
        for &(rows, quads) in SHAPES.iter() {
            let layout = match i % 4 {
                0 => Layout::Columns,
                1 => Layout::ColumnsTight,
                k => Layout::ColumnsAt {
                    lead: 2 * k,
                    tight: k == 3,
                    split: 1,
                    own: OwnTr::Off,
                },
            };
            for workers in [1, 6] {
                run_in16(Case16 {
                    epi: 1,
                    workers,
                    layout,
                    seed: 60000 + i as u64 * 10 + workers as u64,
                    ..Case16::acc16(rows, quads, partials)
                });
            }
            assert_transposed_matches_rows(Case16 {
                epi: 1,
                workers: 3,
                values: if i.is_multiple_of(2) {
                    Values::Specials
                } else {
                    Values::Mixed
                },
                layout,
                seed: 61000 + i as u64,
                ..Case16::acc16(rows, quads, partials)
            });
            i += 1;
        }
    }
}

/// ACC=16 EPI=1 TR=1, one vertex: the declared formula within 3% of the
/// simulator (one group and many, one row and many, fewer than four rows,
/// blocks with and without tail rows, P 1..8 and past 8). Against TR=0
/// (`P + 2` bundles a group, what the compiler weighs against a TR=0
/// reduce and a `transpose_f16` step): rows on the one-row path (P = 1,
/// P > 8, fewer than four rows, the tail after the blocks) cost at most
/// three bundles a group more, and the blocks of four rows at most one
/// bundle a block row more (`4P + 8` a block of four groups), the
/// set-up's 36 bundles aside.
#[test]
fn acc16_bias_transposed_cycles_match_the_declared_formula() {
    let mut outside = Vec::new();
    for partials in [1, 2, 3, 4, 5, 6, 7, 8, 9, 12] {
        for &(rows, quads) in &[(6, 4), (13, 5), (21, 4), (8, 16), (3, 5), (4, 1), (1, 3)] {
            let case = Case16 {
                epi: 1,
                layout: Layout::Columns,
                seed: 5,
                ..Case16::acc16(rows, quads, partials)
            };
            let simulated = run_in16(case);
            check_formula(
                &mut outside,
                format!("ACC=16 EPI=1 TR=1 rows={rows} quads={quads} P={partials}"),
                &[("IN", 16), ("ACC", 16), ("EPI", 1), ("TR", 1)],
                (rows, quads, partials),
                simulated,
            );
            let untransposed = run_in16(Case16 {
                layout: Layout::Rows,
                ..case
            });
            let blocks = (2..=8).contains(&partials) && rows >= 4;
            let one_row = if blocks { rows % 4 } else { rows };
            let bound = untransposed + 6 * (3 * (one_row * quads) as u64 + rows as u64 / 4 + 36);
            assert!(
                simulated <= bound,
                "rows={rows} quads={quads} P={partials}: TR=1 {simulated} against TR=0 {untransposed} (at most {bound})"
            );
        }
    }
    assert_formulas_hold(&outside);
}

/// Signed zeros, infinities (inf + bias, inf - inf, GELU of -inf: the
/// canonical NaN), the largest finite f16 and subnormals through both
/// epilogues.
#[test]
fn acc16_epilogues_on_signed_zeros_infinities_and_subnormals() {
    for epi in [1, 2] {
        for partials in (1..=9).chain([12]) {
            run_in16(Case16 {
                epi,
                workers: 3,
                values: Values::Specials,
                seed: 47000 + epi as u64 * 100 + partials as u64,
                ..Case16::acc16(9, 4, partials)
            });
        }
    }
}

/// The host emulation of the f16 GELU on the values where its op order
/// shows: -0 stays -0, large positive inputs are the identity, exp
/// overflow flushes to -0, infinities.
#[test]
fn gelu_f16_emulation_on_its_edges() {
    let cases = [
        (0x0000, 0x0000),
        (0x8000, 0x8000),
        (f32_to_f16_bits(300.0), f32_to_f16_bits(300.0)),
        (f32_to_f16_bits(20.0), f32_to_f16_bits(20.0)),
        (f32_to_f16_bits(-20.0), 0x8000),
        (f32_to_f16_bits(-5.0), 0x8000),
        (0x7C00, 0x7C00),
        (0xFC00, 0x7E00),
        (0x7E00, 0x7E00),
    ];
    for (b, want) in cases {
        assert_eq!(gelu_f16(b), want, "gelu_f16({b:#06x})");
    }
    // Between the flush and the identity the f16 GELU is a small negative
    // value for negative inputs and just under b for positive ones.
    let y = f16_value(gelu_f16(f32_to_f16_bits(-3.0)));
    assert!(y < 0.0 && y > -0.01, "gelu(-3) = {y}");
    let y = f16_value(gelu_f16(f32_to_f16_bits(1.0)));
    assert!((y - 0.8412).abs() < 2e-3, "gelu(1) = {y}");
}

/// For information (docs/kernels.md): the f16 GELU's error against the f64
/// value of the same (tanh-form) formula over every finite f16 input in
/// [-10, 10], in units of the f16 spacing at the f64 value (2^-24 below
/// 2^-14). The sanity bounds: outside the exp-overflow flush (w <= 11.09,
/// b > -4.05 about) w carries three roundings of relative size 2^-11 at
/// |w| <= 11.1, so exp amplifies them to a relative error of at most about
/// 3 * 11.1 * 2^-11 = 1.6% of the result (about 17 f16 spacings of 2^-10
/// relative), plus the roundings of e, d, r and y: 64 spacings is a safe
/// bound; inside the flush the result is -0 and the error is the f64 value
/// itself, under 1e-4 in absolute terms.
#[test]
fn gelu_f16_accuracy_over_all_f16_in_minus_10_to_10() {
    let spacing = |x: f64| {
        let a = x.abs();
        if a < 2f64.powi(-14) {
            2f64.powi(-24)
        } else {
            2f64.powi(a.log2().floor() as i32 - 10)
        }
    };
    let (mut worst_ulps, mut worst_ulps_at) = (0f64, 0f64);
    let (mut worst_abs, mut worst_abs_at) = (0f64, 0f64);
    let (mut worst_flushed, mut flush_from) = (0f64, f64::NEG_INFINITY);
    for h in 0..=u16::MAX {
        let b = f16_value(h);
        if !b.is_finite() || !(-10.0..=10.0).contains(&b) {
            continue;
        }
        let y = f16_value(gelu_f16(h));
        let exact = gelu_f64(b);
        let err = (y - exact).abs();
        if err > worst_abs {
            (worst_abs, worst_abs_at) = (err, b);
        }
        if y == 0.0 && b < -1.0 {
            // The exp overflow flush: only the absolute error means anything.
            worst_flushed = worst_flushed.max(err);
            flush_from = flush_from.max(b);
            continue;
        }
        let ulps = err / spacing(exact);
        if ulps > worst_ulps {
            (worst_ulps, worst_ulps_at) = (ulps, b);
        }
    }
    println!(
        "f16 GELU vs f64 (same tanh form), all finite f16 in [-10, 10]: max {worst_ulps:.2} f16 ulps (at b = {worst_ulps_at}) outside the flush; flush (y = -0) for b <= {flush_from}, max abs error there {worst_flushed:.3e}; max abs error overall {worst_abs:.3e} (at b = {worst_abs_at})"
    );
    assert!(worst_ulps < 64.0, "{worst_ulps} ulps at {worst_ulps_at}");
    assert!(
        worst_flushed < 1e-4,
        "flushed values up to {worst_flushed:e}"
    );
    assert!(flush_from < -3.9, "the flush starts at {flush_from}");
}

/// Objects record ACC=32 when it is not given (so existing requests, which
/// do not name ACC, would also match an ACC=16 object unless they name
/// ACC=32: docs/kernels.md), and ACC=16 with its TR.
#[test]
fn objects_record_the_default_acc() {
    for (defines, acc, tr) in [
        (&[][..], 32, 0),
        (&[("IN", 16)][..], 32, 0),
        (&[("IN", 16), ("TR", 1)][..], 32, 1),
        (&[("IN", 16), ("ACC", 16)][..], 16, 0),
        (&[("IN", 16), ("ACC", 16), ("TR", 1)][..], 16, 1),
    ] {
        let assembly = kernel_common::assemble("reduce_f32.S", defines).unwrap();
        let params = &assembly.metadata.parameters;
        assert_eq!(
            (params.get("ACC"), params.get("TR")),
            (Some(&acc), Some(&tr)),
            "{defines:?}"
        );
    }
}

/// Records in `outside` a `reduce_f32.S` specialisation (`defines`) whose
/// declared `.cycles` for (ROWS, QUADS, P) is 3% or more off `simulated`.
/// Fails naming every case whose declared cycles were off by 3% or more
/// (collected by [`check_formula`]).
fn assert_formulas_hold(outside: &[String]) {
    assert!(
        outside.is_empty(),
        "declared cycles off by 3% or more:\n{}",
        outside.join("\n")
    );
}

fn check_formula(
    outside: &mut Vec<String>,
    label: String,
    defines: &[(&str, i64)],
    (rows, quads, partials): (u32, u32, u32),
    simulated: u64,
) {
    let declared = declared_cycles(
        "reduce_f32.S",
        defines,
        &[
            ("ROWS", rows as u64),
            ("QUADS", quads as u64),
            ("P", partials as u64),
        ],
    );
    println!("{label}: simulated {simulated}, .cycles {declared}");
    let ratio = declared as f64 / simulated as f64;
    if !(0.97..1.03).contains(&ratio) {
        outside.push(format!(
            "{label}: .cycles {declared} vs simulated {simulated}"
        ));
    }
}
