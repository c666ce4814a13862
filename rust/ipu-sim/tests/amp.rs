//! AMP streaming products in every mode against a reference that follows
//! docs/isa.md phase by phase (rounding with the `half` crate / f32 casts),
//! and the MAC-rate ceilings measured by the cycle counters.

mod common;
use common::*;
use ipu_isa::AmpMode;

const W_ADDR: u32 = 0xC0000;
const X_ADDR: u32 = 0x80000;
const P_ADDR: u32 = 0xA0008;
const O_ADDR: u32 = 0x60000;

fn f143(b: u8) -> f64 {
    let e = ((b >> 3) & 15) as i32;
    let m = (b & 7) as f64;
    let mag = if e == 0 {
        m / 1024.0
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 8)
    };
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Operand text of the `amp` instruction of a mode.
fn amp_text(mode: AmpMode) -> String {
    match mode {
        AmpMode::F16 | AmpMode::F8 => format!("{} $a4:5, $a0:1, $a2:3", mode.mnemonic()),
        AmpMode::F16F32 => "ampf16f32 $a4:5, $a0, $a2:3".into(),
        AmpMode::F32 => "ampf32 $a4, $a0, $a2".into(),
    }
}

/// A worker that loads the weight block, then streams `rows + 1` rows (the
/// last drains the pipeline) with one `{ ld2x64st64 ; amp }` bundle per
/// phase. Every phase has an 8-byte slot for x, partials and the output.
fn stream_worker(mode: AmpMode, rows: usize, scale: i8) -> String {
    let mut s = format!("ampclr\nampscale {scale}\nsetzi $m8, {W_ADDR}\n");
    for i in 0..mode.weight_block_bytes() / 16 {
        s.push_str(&format!("ld128 $a8:11, [$m8]+=16\nampw $a8:11, {i}\n"));
    }
    // The first bundle stores a garbage pair and the next P stores the
    // (empty) row before row 0, so the output pointer starts P + 1 slots early.
    let out0 = O_ADDR - 8 * (mode.phases() as u32 + 1);
    s.push_str(&format!(
        "setzi $m4, {X_ADDR}\nsetzi $m5, {P_ADDR}\nsetzi $m6, {out0}\n\
         ld64 $a0:1, [$m4]+=8\nld64 $a2:3, [$m5]+=8\n\
         setzi $m2, {}\nrpt $m2, 1\n{{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0 ; {} }}\nst64 $a4:5, [$m6]\nexit\n",
        (rows + 1) * mode.phases(),
        amp_text(mode)
    ));
    s
}

struct Stream {
    w: Vec<u8>,
    x: Vec<u8>,
    p: Vec<u8>,
    expect: Vec<u8>,
}

/// Random inputs and the reference result for `rows` rows.
fn reference(mode: AmpMode, rows: usize, scale: i8, rng: &mut Rng) -> Stream {
    reference_scaled(mode, rows, scale, 1.0, rng)
}

/// As `reference` with x and partials multiplied by `magnitude` (to reach
/// subnormal and overflowing f16 results).
fn reference_scaled(
    mode: AmpMode,
    rows: usize,
    scale: i8,
    magnitude: f64,
    rng: &mut Rng,
) -> Stream {
    let (kr, phases, rpp, lpp) = (
        mode.k_rows(),
        mode.phases(),
        mode.rows_per_phase(),
        mode.lanes_per_phase(),
    );
    let round = |v: f64| match mode {
        AmpMode::F16 | AmpMode::F8 => f16_rne(v),
        _ => v as f32 as f64,
    };
    // Weights and inputs as (bytes, values).
    let mut w_bytes = Vec::new();
    let mut w = vec![0f64; kr * 16];
    for v in w.iter_mut() {
        match mode {
            AmpMode::F8 => {
                let b = (rng.next_u64() % 256) as u8;
                let b = if b == 0x80 { 0 } else { b };
                *v = f143(b);
                w_bytes.push(b);
            }
            AmpMode::F16 | AmpMode::F16F32 => {
                let h = half::f16::from_f64(rng.uniform(-1.0, 1.0));
                *v = h.to_f64();
                w_bytes.extend(h.to_bits().to_le_bytes());
            }
            AmpMode::F32 => {
                let f = rng.uniform(-1.0, 1.0) as f32;
                *v = f as f64;
                w_bytes.extend(f.to_bits().to_le_bytes());
            }
        }
    }
    let slot_bytes = |vals: Vec<u8>| {
        let mut v = vals;
        v.resize(8, 0);
        v
    };
    let (mut xb, mut pb, mut ob) = (Vec::new(), Vec::new(), Vec::new());
    let mut prev = vec![0f64; 16];
    let mut acc = vec![0f64; 16];
    for r in 0..=rows {
        let last = r == rows;
        for ph in 0..phases {
            // Output slot: the previous row's lanes of this phase.
            let mut o = Vec::new();
            for l in 0..lpp {
                let v = prev[ph * lpp + l];
                match mode {
                    AmpMode::F16 | AmpMode::F8 => o.extend(f16_rne_bits(v).to_le_bytes()),
                    _ => o.extend((v as f32).to_bits().to_le_bytes()),
                }
            }
            if r > 0 {
                if mode == AmpMode::F32 {
                    // The 8-byte store also writes the unused register $a5 (= 0).
                    o.resize(8, 0);
                }
                ob.extend(slot_bytes(o));
            }
            // Inputs of this phase.
            let mut xs = Vec::new();
            let mut xbytes = Vec::new();
            for _ in 0..rpp {
                let (v, bytes) = if last {
                    (0.0, vec![0u8; mode.weight_bytes()])
                } else {
                    match mode {
                        AmpMode::F8 => {
                            let b = (rng.next_u64() % 256) as u8;
                            let b = if b == 0x80 { 0 } else { b };
                            (f143(b), vec![b])
                        }
                        AmpMode::F16 | AmpMode::F16F32 => {
                            let h = half::f16::from_f64(rng.uniform(-2.0, 2.0) * magnitude);
                            (h.to_f64(), h.to_bits().to_le_bytes().to_vec())
                        }
                        AmpMode::F32 => {
                            let f = rng.uniform(-2.0, 2.0) as f32;
                            (f as f64, f.to_bits().to_le_bytes().to_vec())
                        }
                    }
                };
                xs.push(
                    v * if mode == AmpMode::F8 {
                        2f64.powi(scale as i32)
                    } else {
                        1.0
                    },
                );
                xbytes.extend(bytes);
            }
            xb.extend(slot_bytes(xbytes));
            let mut parts = Vec::new();
            let mut pbytes = Vec::new();
            for _ in 0..lpp {
                let v = if last {
                    0.0
                } else {
                    rng.uniform(-4.0, 4.0) * magnitude
                };
                match mode {
                    AmpMode::F16 | AmpMode::F8 => {
                        let h = half::f16::from_f64(v);
                        parts.push(h.to_f64());
                        pbytes.extend(h.to_bits().to_le_bytes());
                    }
                    _ => {
                        parts.push(v as f32 as f64);
                        pbytes.extend((v as f32).to_bits().to_le_bytes());
                    }
                }
            }
            pb.extend(slot_bytes(pbytes));
            for c in 0..16 {
                let mut prod = 0.0;
                for j in 0..rpp {
                    prod += w[(rpp * ph + j) * 16 + c] * xs[j];
                }
                let mut s = acc[c] + prod;
                if (ph * lpp..ph * lpp + lpp).contains(&c) {
                    s += parts[c - ph * lpp];
                }
                acc[c] = round(s);
            }
        }
        prev = std::mem::replace(&mut acc, vec![0f64; 16]);
    }
    Stream {
        w: w_bytes,
        x: xb,
        p: pb,
        expect: ob,
    }
}

#[test]
fn streaming_products_match_the_reference_in_every_mode() {
    let mut rng = Rng(10);
    for mode in AmpMode::ALL {
        for (rows, scale) in [(1usize, 0i8), (5, -2), (9, 3)] {
            let scale = if mode == AmpMode::F8 { scale } else { 0 };
            let s = reference(mode, rows, scale, &mut rng);
            let data = vec![
                (W_ADDR, s.w.clone()),
                (X_ADDR, s.x.clone()),
                (P_ADDR, s.p.clone()),
            ];
            let chip = run_one(
                &workers_program(&stream_worker(mode, rows, scale), 1),
                &data,
            )
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            let got = chip.peek(0, O_ADDR, s.expect.len() as u32).unwrap();
            assert_eq!(got, s.expect, "{mode:?} rows {rows}");
        }
    }
}

#[test]
fn f16_accumulation_handles_subnormal_and_overflowing_results() {
    let mut rng = Rng(12);
    for magnitude in [1e-6, 3e-5, 2e4] {
        let s = reference_scaled(AmpMode::F16, 6, 0, magnitude, &mut rng);
        let data = vec![
            (W_ADDR, s.w.clone()),
            (X_ADDR, s.x.clone()),
            (P_ADDR, s.p.clone()),
        ];
        let chip = run_one(
            &workers_program(&stream_worker(AmpMode::F16, 6, 0), 1),
            &data,
        )
        .unwrap();
        let got = chip.peek(0, O_ADDR, s.expect.len() as u32).unwrap();
        assert_eq!(got, s.expect, "magnitude {magnitude}");
        let halves: Vec<u16> = got
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if magnitude < 1e-4 {
            assert!(
                halves.iter().any(|h| h & 0x7C00 == 0 && h & 0x3FF != 0),
                "some subnormal results"
            );
        } else {
            assert!(
                halves.iter().any(|h| h & 0x7FFF == 0x7C00),
                "some infinities"
            );
        }
    }
}

/// Six workers stream `rows` rows each; returns (tile cycles, MACs done).
fn six_worker_stream(mode: AmpMode, rows: usize) -> (u64, u64) {
    let mut rng = Rng(11);
    let s = reference(mode, rows, 0, &mut rng);
    let data = vec![(W_ADDR, s.w), (X_ADDR, s.x), (P_ADDR, s.p)];
    // All six workers read the same inputs; each writes its own output block.
    let worker = stream_worker(mode, rows, 0).replace(
        &format!("setzi $m6, {}", O_ADDR - 8 * (mode.phases() as u32 + 1)),
        &format!(
            "setzi $m6, {}\nshl $m9, $m1, 11\nadd $m6, $m6, $m9",
            O_ADDR - 8 * (mode.phases() as u32 + 1)
        ),
    );
    let chip = run_one(&workers_program(&worker, 6), &data).unwrap();
    let macs = 6 * ((rows + 1) * mode.phases()) as u64 * mode.macs() as u64;
    (compute_cycles(&chip, 0, 0), macs)
}

#[test]
fn six_workers_stream_at_the_model_peak_and_never_above() {
    for (mode, peak) in [
        (AmpMode::F16, ipu_arch::AMP_MACS_F16_F16),
        (AmpMode::F8, ipu_arch::AMP_MACS_FP8_F16),
        (AmpMode::F16F32, ipu_arch::AMP_MACS_F16_F32),
        (AmpMode::F32, ipu_arch::AMP_MACS_F32),
    ] {
        let rows = 400;
        let (cycles, macs) = six_worker_stream(mode, rows);
        let rate = macs as f64 / cycles as f64;
        assert!(
            rate <= peak as f64,
            "{mode:?}: {rate} MAC/cycle beats the model's {peak}"
        );
        // Only the weight loads and launches are overhead: the stream itself runs at peak.
        assert!(
            rate > 0.85 * peak as f64,
            "{mode:?}: {rate} MAC/cycle, expected near {peak}"
        );
    }
}

#[test]
fn back_to_back_amp_cannot_beat_the_ceiling() {
    // Pure AMP bundles on six workers and on one worker: no program does
    // more than 64 f16 MACs per tile cycle, and one worker runs at 1/6 of it.
    let worker = "ampclr\nrpt 1200, 1\nampf16 $a4:5, $a0:1, $a2:3\nexit\n";
    let six = run_one(&workers_program(worker, 6), &[]).unwrap();
    let one = run_one(&workers_program(worker, 1), &[]).unwrap();
    let (c6, c1) = (compute_cycles(&six, 0, 0), compute_cycles(&one, 0, 0));
    let rate6 = (6 * 1200 * 64) as f64 / c6 as f64;
    let rate1 = (1200 * 64) as f64 / c1 as f64;
    assert!(rate6 <= 64.0 && rate6 > 60.0, "six workers: {rate6}");
    assert!(rate1 <= 64.0 / 6.0 && rate1 > 10.0, "one worker: {rate1}");
    // Exact issue arithmetic: 1200 amp bundles of one worker take 7200 cycles.
    let base = run_one(
        &workers_program("ampclr\nrpt 0, 1\nampf16 $a4:5, $a0:1, $a2:3\nexit\n", 1),
        &[],
    )
    .unwrap();
    assert_eq!(c1 - compute_cycles(&base, 0, 0), 1200 * 6);
}

#[test]
fn the_supervisor_cannot_use_the_amp() {
    let err = run_one("ampf16 $a4:5, $a0:1, $a2:3\nexit\n", &[]).unwrap_err();
    assert_eq!(err.kind, ipu_sim::FaultKind::FloatInSupervisor);
    assert_eq!(err.context, Some(6));
}
