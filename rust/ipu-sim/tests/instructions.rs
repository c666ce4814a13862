//! Semantics and issue cost of every non-control instruction, through one
//! data-driven check helper. Expected values come from references written
//! here (f64 math rounded with the `half` crate, native f32, a brute-force
//! F143 table), not from the simulator's own numerics.

mod common;
use common::*;
use ipu_isa::{AluOp, FloatOp, FloatType};

/// One test case: a worker runs `setup`, then the instruction `op`, then
/// `after` (which stores results); memory must then hold `expect`. The same
/// program with `op` repeated 8 times must take exactly 7 * 6 * `slots`
/// more cycles.
struct Case {
    name: String,
    setup: String,
    op: String,
    after: String,
    inputs: Vec<(u32, Vec<u8>)>,
    expect: Vec<(u32, Vec<u8>)>,
    slots: u64,
}

fn check(c: &Case) {
    let body = |n: usize| {
        format!(
            "{}\n{}\n{}\nexit\n",
            c.setup,
            vec![c.op.as_str(); n].join("\n"),
            c.after
        )
    };
    let chip = run_one(&workers_program(&body(1), 1), &c.inputs)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    for (addr, bytes) in &c.expect {
        let got = chip.peek(0, *addr, bytes.len() as u32).unwrap();
        assert_eq!(&got, bytes, "{}: memory at {addr:#x}", c.name);
    }
    let chip8 = run_one(&workers_program(&body(8), 1), &c.inputs)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let delta = compute_cycles(&chip8, 0, 0) - compute_cycles(&chip, 0, 0);
    assert_eq!(delta, 7 * 6 * c.slots, "{}: issue cost", c.name);
}

fn case(name: impl Into<String>, setup: &str, op: &str, after: &str) -> Case {
    Case {
        name: name.into(),
        setup: setup.into(),
        op: op.into(),
        after: after.into(),
        inputs: vec![],
        expect: vec![],
        slots: 1,
    }
}

fn h(x: f64) -> f64 {
    f16_rne(x)
}
fn hb(x: f64) -> u16 {
    f16_rne_bits(x)
}

fn ref_f16(op: FloatOp, a: f64, b: f64, d: f64) -> u16 {
    match op {
        FloatOp::Add => hb(a + b),
        FloatOp::Sub => hb(a - b),
        FloatOp::Mul => hb(a * b),
        FloatOp::Mac => hb(d + a * b),
        FloatOp::Max => hb(if b > a { b } else { a }),
        FloatOp::Min => hb(if b < a { b } else { a }),
        FloatOp::CmpEq => {
            if a == b {
                0xFFFF
            } else {
                0
            }
        }
        FloatOp::CmpLt => {
            if a < b {
                0xFFFF
            } else {
                0
            }
        }
        FloatOp::CmpLe => {
            if a <= b {
                0xFFFF
            } else {
                0
            }
        }
        FloatOp::Abs => hb(a.abs()),
        FloatOp::Neg => hb(-a),
        FloatOp::Exp => hb(a.exp()),
        FloatOp::Recip => hb(1.0 / a),
        FloatOp::Rsqrt => hb(1.0 / a.sqrt()),
        FloatOp::Tanh => hb(a.tanh()),
        FloatOp::Sqrt => hb(a.sqrt()),
    }
}

fn ref_f32(op: FloatOp, a: f32, b: f32, d: f32) -> u32 {
    let t = |x: f64| (x as f32).to_bits();
    match op {
        FloatOp::Add => (a + b).to_bits(),
        FloatOp::Sub => (a - b).to_bits(),
        FloatOp::Mul => (a * b).to_bits(),
        FloatOp::Mac => a.mul_add(b, d).to_bits(),
        FloatOp::Max => (if b > a { b } else { a }).to_bits(),
        FloatOp::Min => (if b < a { b } else { a }).to_bits(),
        FloatOp::CmpEq => {
            if a == b {
                u32::MAX
            } else {
                0
            }
        }
        FloatOp::CmpLt => {
            if a < b {
                u32::MAX
            } else {
                0
            }
        }
        FloatOp::CmpLe => {
            if a <= b {
                u32::MAX
            } else {
                0
            }
        }
        FloatOp::Abs => a.abs().to_bits(),
        FloatOp::Neg => (-a).to_bits(),
        FloatOp::Exp => t((a as f64).exp()),
        FloatOp::Recip => t(1.0 / a as f64),
        FloatOp::Rsqrt => t(1.0 / (a as f64).sqrt()),
        FloatOp::Tanh => t((a as f64).tanh()),
        FloatOp::Sqrt => t((a as f64).sqrt()),
    }
}

/// Encodes lane values as memory bytes.
type Encoder = fn(&[f64]) -> Vec<u8>;

/// (instruction, loaded registers, pointers after, (store address, unused)).
type LdStCase<'a> = (&'a str, Vec<u32>, [u32; 3], (u32, u32));

const STORE_OUT: &str = "setzi $m2, 0x90000";

#[test]
fn float_operations() {
    let mut rng = Rng(1);
    for ty in [FloatType::F16v4, FloatType::F32v2, FloatType::F32] {
        for op in FloatOp::ALL {
            for trial in 0..6 {
                let lanes = match ty {
                    FloatType::F16v4 => 4,
                    FloatType::F32v2 => 2,
                    FloatType::F32 => 1,
                };
                let positive = matches!(op, FloatOp::Sqrt | FloatOp::Rsqrt | FloatOp::Recip);
                let gen = |rng: &mut Rng| {
                    let v = if positive {
                        rng.uniform(0.05, 6.0)
                    } else {
                        rng.uniform(-4.0, 4.0)
                    };
                    match ty {
                        FloatType::F16v4 => h(v),
                        _ => v as f32 as f64,
                    }
                };
                let a: Vec<f64> = (0..lanes).map(|_| gen(&mut rng)).collect();
                // Some equal lanes so that compares and max/min see ties.
                let b: Vec<f64> = (0..lanes)
                    .map(|l| {
                        if trial % 3 == 0 && l == 0 {
                            a[0]
                        } else {
                            gen(&mut rng)
                        }
                    })
                    .collect();
                let d: Vec<f64> = (0..lanes).map(|_| gen(&mut rng)).collect();
                let (enc, expect): (Encoder, Vec<u8>) = match ty {
                    FloatType::F16v4 => (
                        f16s,
                        (0..4)
                            .flat_map(|l| ref_f16(op, a[l], b[l], d[l]).to_le_bytes())
                            .collect(),
                    ),
                    _ => (
                        f32s,
                        (0..lanes)
                            .flat_map(|l| {
                                ref_f32(op, a[l] as f32, b[l] as f32, d[l] as f32).to_le_bytes()
                            })
                            .collect(),
                    ),
                };
                let (ld, st, regs) = if ty == FloatType::F32 {
                    ("ld32", "st32", ["$a0", "$a2", "$a4"])
                } else {
                    ("ld64", "st64", ["$a0:1", "$a2:3", "$a4:5"])
                };
                let text = if op.is_unary() {
                    format!("{}{} {}, {}", ty.prefix(), op.suffix(), regs[2], regs[0])
                } else {
                    format!(
                        "{}{} {}, {}, {}",
                        ty.prefix(),
                        op.suffix(),
                        regs[2],
                        regs[0],
                        regs[1]
                    )
                };
                let mut c = case(
                    format!("{text} a={a:?} b={b:?} d={d:?}"),
                    &format!(
                        "{ld} {}, [$m0]\n{ld} {}, [$m0+8]\n{ld} {}, [$m0+16]",
                        regs[0], regs[1], regs[2]
                    ),
                    &text,
                    &format!("{STORE_OUT}\n{st} {}, [$m2]", regs[2]),
                );
                let mut input = enc(&a);
                input.resize(8, 0);
                let mut bb = enc(&b);
                bb.resize(8, 0);
                let mut dd = enc(&d);
                dd.resize(8, 0);
                input.extend(bb);
                input.extend(dd);
                c.inputs = vec![(IN, input)];
                c.expect = vec![(OUT, expect)];
                c.slots = if op.is_transcendental() && ty != FloatType::F32 {
                    2
                } else {
                    1
                };
                check(&c);
            }
        }
    }
}

#[test]
fn reductions_shuffles_and_moves() {
    let mut rng = Rng(2);
    for _ in 0..8 {
        let a: Vec<f64> = (0..4).map(|_| h(rng.uniform(-100.0, 100.0))).collect();
        let s: Vec<f64> = (0..2)
            .map(|_| rng.uniform(-100.0, 100.0) as f32 as f64)
            .collect();
        let mut inputs = f16s(&a);
        inputs.extend(f32s(&s));
        let setup = "ld64 $a0:1, [$m0]\nld64 $a2:3, [$m0+8]";
        let f32b = |x: f64| (x as f32).to_bits().to_le_bytes().to_vec();
        let max4 = a.iter().copied().fold(f64::MIN, f64::max);
        let cases = [
            ("f16v4hsum $a4, $a0:1", f32b(a.iter().sum::<f64>())),
            ("f16v4hmax $a4, $a0:1", f32b(max4)),
            ("f32v2hsum $a4, $a2:3", f32b(s[0] + s[1])),
            ("f32v2hmax $a4, $a2:3", f32b(s[0].max(s[1]))),
            ("mov $a4, $a2", f32b(s[0])),
            (
                "pack16lo $a4, $a0, $a1",
                [hb(a[0]).to_le_bytes(), hb(a[2]).to_le_bytes()].concat(),
            ),
            (
                "pack16hi $a4, $a0, $a1",
                [hb(a[1]).to_le_bytes(), hb(a[3]).to_le_bytes()].concat(),
            ),
        ];
        for (op, expect) in cases {
            let mut c = case(op, setup, op, &format!("{STORE_OUT}\nst32 $a4, [$m2]"));
            c.inputs = vec![(IN, inputs.clone())];
            c.expect = vec![(OUT, expect)];
            check(&c);
        }
        let pair_cases = [
            ("f16v4bcast $a4:5, $a0", f16s(&[a[0]; 4])),
            ("f32v2bcast $a4:5, $a2", f32s(&[s[0]; 2])),
            ("mov64 $a4:5, $a2:3", f32s(&s)),
            ("f16v2tof32 $a4:5, $a1", f32s(&[a[2], a[3]])),
        ];
        for (op, expect) in pair_cases {
            let mut c = case(op, setup, op, &format!("{STORE_OUT}\nst64 $a4:5, [$m2]"));
            c.inputs = vec![(IN, inputs.clone())];
            c.expect = vec![(OUT, expect)];
            check(&c);
        }
    }
}

/// Every F143 value, by the format's definition (bias 8, 3 mantissa bits).
fn f143_values() -> Vec<(u8, f64)> {
    (0..=255u8)
        .filter(|b| *b != 0x80)
        .map(|b| {
            let e = ((b >> 3) & 15) as i32;
            let m = (b & 7) as f64;
            let mag = if e == 0 {
                m / 1024.0
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 8)
            };
            (b, if b & 0x80 != 0 { -mag } else { mag })
        })
        .collect()
}

/// Nearest F143 byte by exhaustive search, ties to the even mantissa, saturating.
fn ref_to_f8(x: f64) -> u8 {
    let x = x.clamp(-240.0, 240.0);
    let mut best = (f64::INFINITY, 0u8);
    for (b, v) in f143_values() {
        if v == 0.0 && b != 0 {
            continue;
        }
        let d = (v - x).abs();
        if d < best.0 || (d == best.0 && b & 1 == 0) {
            best = (d, b);
        }
    }
    best.1
}

#[test]
fn conversions() {
    let mut rng = Rng(3);
    for trial in 0..10 {
        let scale: i32 = [0, 2, -3, 5][trial % 4];
        let a: Vec<f64> = (0..4)
            .map(|_| h(rng.uniform(-300.0, 300.0) * 2f64.powi(scale - 4)))
            .collect();
        let s: Vec<f64> = (0..2)
            .map(|_| rng.uniform(-70000.0, 70000.0) as f32 as f64)
            .collect();
        let mut inputs = f16s(&a);
        inputs.extend(f32s(&s));
        let fp8: Vec<u8> = a.iter().map(|x| ref_to_f8(x * 2f64.powi(-scale))).collect();
        inputs.extend(&fp8);
        inputs.extend([0u8; 4]);
        let i32v = rng.next_u64() as u32 as i32 >> (rng.next_u64() % 20);
        inputs.extend(i32v.to_le_bytes());
        let setup =
            "ld64 $a0:1, [$m0]\nld64 $a2:3, [$m0+8]\nld32 $a6, [$m0+16]\nld32 $a7, [$m0+24]";
        let st32 = format!("{STORE_OUT}\nst32 $a4, [$m2]");
        let st64 = format!("{STORE_OUT}\nst64 $a4:5, [$m2]");
        let f8dec = |b: u8| {
            f143_values()
                .into_iter()
                .find(|(x, _)| *x == b)
                .map(|(_, v)| v)
                .unwrap()
        };
        let cases: Vec<(String, &str, Vec<u8>)> = vec![
            (
                "f32v2tof16 $a4, $a2:3".into(),
                &st32,
                [
                    half::f16::from_f32(s[0] as f32).to_bits(),
                    half::f16::from_f32(s[1] as f32).to_bits(),
                ]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            ),
            (
                // The quad (s0, s1, a0, a1): two f32 that round, two f16
                // widened exactly that come back unchanged.
                "f32v4tof16 $a4:5, $a8:11".into(),
                &st64,
                [
                    half::f16::from_f32(s[0] as f32).to_bits(),
                    half::f16::from_f32(s[1] as f32).to_bits(),
                    half::f16::from_f64(a[0]).to_bits(),
                    half::f16::from_f64(a[1]).to_bits(),
                ]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            ),
            (format!("f16v4tof8 $a4, $a0:1, {scale}"), &st32, fp8.clone()),
            (
                format!("f8v4tof16 $a4:5, $a6, {scale}"),
                &st64,
                f16s(
                    &fp8.iter()
                        .map(|b| f8dec(*b) * 2f64.powi(scale))
                        .collect::<Vec<_>>(),
                ),
            ),
            (
                "f32toi32 $a4, $a2".into(),
                &st32,
                ((s[0] as f32).round_ties_even() as i32)
                    .to_le_bytes()
                    .to_vec(),
            ),
            (
                "i32tof32 $a4, $a7".into(),
                &st32,
                (i32v as f32).to_bits().to_le_bytes().to_vec(),
            ),
        ];
        let quad_setup = format!("{setup}\nld64 $a8:9, [$m0+8]\nf16v2tof32 $a10:11, $a0");
        for (op, after, expect) in cases {
            let setup = if op.contains("$a8:11") {
                &quad_setup
            } else {
                setup
            };
            let mut c = case(op.clone(), setup, &op, after);
            c.inputs = vec![(IN, inputs.clone())];
            c.expect = vec![(OUT, expect)];
            check(&c);
        }
        // Stochastic variants: issue cost here, statistics in `stochastic_rounding`.
        for op in ["f32v2tof16sr $a4, $a2:3", "f16v4tof8sr $a4, $a0:1, 1"] {
            let mut c = case(op, setup, op, &st32);
            c.inputs = vec![(IN, inputs.clone())];
            check(&c);
        }
    }
}

#[test]
fn stochastic_rounding() {
    // x = 1 + 0.3 ulp(f16): 1000 conversions should round up about 30% of the
    // time, and the same seed must give the same bits.
    let x = 1.0f32 + 0.3 / 1024.0;
    let worker = "
        setzi $m4, 0x90000
        setzi $m5, 7
        setzi $m6, 0
        setseed $m5, $m6
        ld64 $a2:3, [$m0]
        rpt 500, 1
        { st32 $a4, [$m4]+=4 ; f32v2tof16sr $a4, $a2:3 }
        st32 $a4, [$m4]+=4
        exit
    ";
    let inputs = vec![(IN, f32s(&[x as f64, x as f64]))];
    let a = run_one(&workers_program(worker, 1), &inputs).unwrap();
    let b = run_one(&workers_program(worker, 1), &inputs).unwrap();
    let bytes = a.peek(0, OUT + 4, 2000).unwrap();
    assert_eq!(
        bytes,
        b.peek(0, OUT + 4, 2000).unwrap(),
        "deterministic for one seed"
    );
    let halves: Vec<u16> = bytes
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert!(
        halves.iter().all(|h| *h == 0x3C00 || *h == 0x3C01),
        "only the two neighbours"
    );
    let ups = halves.iter().filter(|h| **h == 0x3C01).count() as f64 / halves.len() as f64;
    assert!((ups - 0.3).abs() < 0.05, "round-up fraction {ups}");
}

fn ref_alu(op: AluOp, a: u32, b: u32) -> u32 {
    match op {
        AluOp::Add => a.wrapping_add(b),
        AluOp::Sub => a.wrapping_sub(b),
        AluOp::Mul => (a as u64 * b as u64) as u32,
        AluOp::And => a & b,
        AluOp::Or => a | b,
        AluOp::Xor => a ^ b,
        AluOp::Shl => ((a as u64) << (b % 32)) as u32,
        AluOp::Shr => a >> (b % 32),
        AluOp::Sar => ((a as i32) >> (b % 32)) as u32,
        AluOp::CmpEq => u32::from(a == b),
        AluOp::CmpNe => u32::from(a != b),
        AluOp::CmpUlt => u32::from(a < b),
        AluOp::CmpSlt => u32::from((a as i32) < (b as i32)),
        AluOp::MinS => {
            if (a as i32) < (b as i32) {
                a
            } else {
                b
            }
        }
        AluOp::MaxS => {
            if (a as i32) > (b as i32) {
                a
            } else {
                b
            }
        }
    }
}

#[test]
fn integer_operations() {
    let mut rng = Rng(4);
    for op in AluOp::ALL {
        for trial in 0..6 {
            let a = rng.next_u64() as u32;
            let b = if trial == 0 {
                a
            } else {
                rng.next_u64() as u32 >> (rng.next_u64() % 32)
            };
            let setup = "ld32 $m4, [$m0]\nld32 $m5, [$m0+4]";
            let after = format!("{STORE_OUT}\nst32 $m6, [$m2]");
            let text = format!("{} $m6, $m4, $m5", op.mnemonic());
            let mut c = case(text.clone(), setup, &text, &after);
            c.inputs = vec![(IN, words(&[a, b]))];
            c.expect = vec![(OUT, words(&[ref_alu(op, a, b)]))];
            check(&c);
            let r = op.imm_range();
            let imm = *r.start() as i64
                + (rng.next_u64() % (*r.end() as i64 - *r.start() as i64 + 1) as u64) as i64;
            let text = format!("{} $m6, $m4, {imm}", op.mnemonic());
            let mut c = case(text.clone(), setup, &text, &after);
            c.inputs = vec![(IN, words(&[a, b]))];
            c.expect = vec![(OUT, words(&[ref_alu(op, a, imm as i32 as u32)]))];
            check(&c);
        }
    }
    let after = format!("{STORE_OUT}\nst32 $m6, [$m2]\nst32 $a6, [$m2+4]");
    let moves = [
        ("setzi $m6, 0xABCDE", 0xABCDEu32, None),
        ("sethi $m6, 0xABCDE", 0xABCDE000, None),
        ("setzi $a6, 0x3C00", 0, Some(0x3C00u32)),
        ("sethi $a6, 0x3F800", 0, Some(0x3F80_0000)),
        ("mov $a6, $m4", 0, Some(0x1234_5678)),
        ("mov $m6, $a5", 0x8765_4321, None),
        ("get $m6, tile_id", 0, None),
        ("get $m6, context_id", 0, None),
        ("mov $m6, $m4", 0x1234_5678, None),
        ("add $mzero, $m4, 5", 0, None),
    ];
    for (op, m6, a6) in moves {
        let setup = "ld32 $m4, [$m0]\nld32 $a5, [$m0+4]\nsetzi $m6, 0\nsetzi $a6, 0";
        let mut c = case(op, setup, op, &after);
        c.inputs = vec![(IN, words(&[0x1234_5678, 0x8765_4321]))];
        c.expect = vec![(OUT, words(&[m6, a6.unwrap_or(0)]))];
        check(&c);
    }
}

#[test]
fn loads_and_stores_with_every_addressing_mode() {
    let data: Vec<u32> = (0..16)
        .map(|i| 0x1111_1111u32.wrapping_mul(i + 1))
        .collect();
    let setup = "mov $m4, $m0\nsetzi $m5, 8\nsetzi $m7, 0x90000";
    // After the access, $a0:3 and the base register are stored at OUT+0x100.
    let after = "st64 $a0:1, [$m7+0x100]\nst64 $a2:3, [$m7+0x108]\nst32 $m4, [$m7+0x110]";
    let cases: Vec<(&str, Vec<u32>, u32)> = vec![
        ("ld32 $a0, [$m4+4]", vec![data[1], 0, 0, 0], IN),
        ("ld32 $a0, [$m4]+=-4", vec![data[0], 0, 0, 0], IN - 4),
        ("ld16 $a0, [$m4+6]", vec![data[1] >> 16, 0, 0, 0], IN),
        ("ld64 $a0:1, [$m4+$m5]", vec![data[2], data[3], 0, 0], IN),
        (
            "ld64 $a0:1, [$m4]+=$m5",
            vec![data[0], data[1], 0, 0],
            IN + 8,
        ),
        (
            "ld128 $a0:3, [$m4+16]",
            vec![data[4], data[5], data[6], data[7]],
            IN,
        ),
        (
            "ld128 $a0:3, [$m4]+=16",
            vec![data[0], data[1], data[2], data[3]],
            IN + 16,
        ),
    ];
    for (op, regs, base) in cases {
        let mut c = case(op, setup, op, after);
        c.inputs = vec![(IN, words(&data))];
        c.expect = vec![(OUT + 0x100, words(&[regs, vec![base]].concat()))];
        check(&c);
    }
    // Stores: $a0:1 / $m6 hold known values; check memory and the base.
    let setup = "setzi $m4, 0x90000\nsetzi $m5, 8\nsetzi $m6, 0xBEEF\nld64 $a0:1, [$m0]\nsetzi $m7, 0x90000";
    let after = "st32 $m4, [$m7+0x110]";
    let cases: Vec<(&str, u32, Vec<u8>, u32)> = vec![
        ("st32 $m6, [$m4+4]", OUT + 4, words(&[0xBEEF]), OUT),
        ("st32 $a1, [$m4]+=12", OUT, words(&[data[1]]), OUT + 12),
        (
            "st16 $a0, [$m4+2]",
            OUT + 2,
            data[0].to_le_bytes()[..2].to_vec(),
            OUT,
        ),
        ("st64 $a0:1, [$m4+$m5]", OUT + 8, words(&data[..2]), OUT),
        ("st64 $a0:1, [$m4]+=$m5", OUT, words(&data[..2]), OUT + 8),
    ];
    for (op, at, bytes, base) in cases {
        let mut c = case(op, setup, op, after);
        c.inputs = vec![(IN, words(&data))];
        c.expect = vec![(at, bytes), (OUT + 0x110, words(&[base]))];
        check(&c);
    }
}

#[test]
fn combined_load_store_instructions() {
    let data: Vec<u32> = (0..64)
        .map(|i| 0x0101_0101u32.wrapping_mul(i + 1))
        .collect();
    // $m4 = load pointer, $m5 = second load pointer or the store pointer, $m6 = store pointer.
    // Stride register $m8: low half +32, high half +64.
    let setup = "mov $m4, $m0
        setzi $m9, 0x90000
        setzi $m10, 0x8000
        add $m5, $m0, $m10
        add $m5, $m5, 8
        mov $m6, $m9
        sethi $m8, 0x400
        or $m8, $m8, 0
        setzi $m10, 0x0020
        or $m8, $m8, $m10
        setzi $a4, 0x1234
        setzi $a5, 0x5678";
    let after = "st64 $a0:1, [$m9+0x100]\nst64 $a2:3, [$m9+0x108]\nst32 $m4, [$m9+0x110]\nst32 $m5, [$m9+0x114]\nst32 $m6, [$m9+0x118]";
    let second = 0x8000 / 4 + 2; // word index of IN + 0x8008
    let mut inputs = vec![(IN, words(&data))];
    inputs.push((IN + 0x8008, words(&data[32..40])));
    let _ = second;
    let cases: Vec<LdStCase> = vec![
        // ld64st64: load [$m4] (+8), store to [$m5] (+stride hi = 64).
        (
            "ld64st64 $a0:1, $a4:5, $m4, $m8, 0b1000",
            vec![data[0], data[1], 0, 0],
            [IN + 8, IN + 0x8008 + 64, OUT],
            (IN + 0x8008, 0),
        ),
        // ld128st64: load 16 B, pointer by stride lo (+32); store pointer unchanged (code 3).
        (
            "ld128st64 $a0:3, $a4:5, $m4, $m8, 0b1101",
            vec![data[0], data[1], data[2], data[3]],
            [IN + 32, IN + 0x8008, OUT],
            (IN + 0x8008, 0),
        ),
        // ld2x64st64: load [$m4] and [$m5] (other bank), store [$m6].
        (
            "ld2x64st64 $a0:3, $a4:5, $m4, $m8, 0",
            vec![data[0], data[1], data[32], data[33]],
            [IN + 8, IN + 0x8010, OUT + 8],
            (OUT, 0),
        ),
    ];
    for (op, regs, ptrs, (store_at, _)) in cases {
        let mut c = case(op, setup, op, after);
        c.inputs = inputs.clone();
        let mut expect = vec![(OUT + 0x100, words(&[regs, ptrs.to_vec()].concat()))];
        if store_at == OUT {
            expect.push((OUT, words(&[0x1234, 0x5678])));
        }
        c.expect = expect;
        check(&c);
    }
}

#[test]
fn control_instructions_cost_one_issue_slot() {
    // Each form falls through or jumps to the next bundle, so it can repeat.
    for op in [
        "br +4",
        "brz $mzero, +4",
        "brnz $mzero, +4",
        "brnz $m4, +4",
        "brnzdec $mzero, +4",
        "call +4",
        "nop",
        "setseed $m4, $m5",
    ] {
        let mut c = case(op, "setzi $m4, 1", op, "");
        c.slots = 1;
        check(&c);
    }
}
