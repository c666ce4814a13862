//! device/attention_combine.S on one simulated tile: two partial flash
//! attention states of one query block (over two key ranges) fold into the
//! state of the whole range, checked against the f64 combination of the
//! same f32 inputs; rows where the second range saw no key (m2 = -inf) stay
//! unchanged; one and six vertices; cycles against `.cycles`.

mod kernel_common;

use kernel_common::*;

const O: u32 = 0x80000;
const O2: u32 = 0x90000;
const ML: u32 = 0x60000;
const ML2: u32 = 0x61000;

fn read_f32(chip: &ipu_sim::Chip, addr: u32, n: usize) -> Vec<f32> {
    read_u32(chip, addr, n)
        .into_iter()
        .map(f32::from_bits)
        .collect()
}

/// Combines random states of `rows` rows with `dq` quads over `workers`
/// vertices; checks O, m and l; returns the compute cycles.
fn combine_case(rows: usize, dq: usize, workers: usize, seed: u64) -> u64 {
    let mut rng = Rng(seed);
    let cols = 4 * dq;
    let rs = (16 * dq + 8) as u32;
    let mut o = vec![0f32; rows * (rs as usize / 4)];
    let mut o2 = o.clone();
    let mut ml = Vec::new();
    let mut ml2 = Vec::new();
    for i in 0..rows {
        for c in 0..cols {
            o[i * rs as usize / 4 + c] = rng.uniform(-3.0, 3.0) as f32;
            o2[i * rs as usize / 4 + c] = rng.uniform(-3.0, 3.0) as f32;
        }
        ml.extend([rng.uniform(-4.0, 4.0) as f32, rng.uniform(0.5, 20.0) as f32]);
        // Every third row saw no key of the second range.
        if i % 3 == 2 {
            ml2.extend([f32::NEG_INFINITY, 0.0]);
            for c in 0..cols {
                o2[i * rs as usize / 4 + c] = 0.0;
            }
        } else {
            ml2.extend([rng.uniform(-4.0, 4.0) as f32, rng.uniform(0.5, 20.0) as f32]);
        }
    }
    let launches: Vec<Launch> = ranges_aligned(rows, workers, 1)
        .into_iter()
        .map(|(a, b)| Launch {
            entry: "attention_combine".into(),
            state: vec![
                O + a as u32 * rs,
                rs,
                ML + 8 * a as u32,
                O2 + a as u32 * rs,
                rs,
                ML2 + 8 * a as u32,
                (b - a) as u32,
                dq as u32,
            ],
        })
        .collect();
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "attention_combine.S",
            defines: &[],
        }],
        &[launches],
        &[
            (O, f32_bytes(&o)),
            (O2, f32_bytes(&o2)),
            (ML, f32_bytes(&ml)),
            (ML2, f32_bytes(&ml2)),
        ],
    );
    let got_o = read_f32(&chip, O, o.len());
    let got_ml = read_f32(&chip, ML, 2 * rows);
    for i in 0..rows {
        let (m1, l1, m2, l2) = (
            ml[2 * i] as f64,
            ml[2 * i + 1] as f64,
            ml2[2 * i] as f64,
            ml2[2 * i + 1] as f64,
        );
        let m = m1.max(m2);
        let (a, b) = ((m1 - m).exp(), (m2 - m).exp());
        let l = l1 * a + l2 * b;
        let close = |got: f32, want: f64, what: &str| {
            assert!(
                (got as f64 - want).abs() <= 4e-7 * want.abs().max(1.0),
                "rows={rows} dq={dq} workers={workers}: {what} of row {i}: device {got}, f64 {want}"
            );
        };
        assert_eq!(got_ml[2 * i] as f64, m, "m of row {i}");
        close(got_ml[2 * i + 1], l, "l");
        for c in 0..cols {
            let k = i * rs as usize / 4 + c;
            close(
                got_o[k],
                o[k] as f64 * a + o2[k] as f64 * b,
                &format!("O[{c}]"),
            );
        }
        // The padding word after the row is untouched.
        assert_eq!(got_o[i * rs as usize / 4 + cols], 0.0);
    }
    cycles
}

#[test]
fn combines_two_ranges_against_f64() {
    for &(rows, dq, workers) in &[(1, 1, 1), (5, 5, 1), (17, 18, 6), (6, 18, 6), (32, 18, 6)] {
        combine_case(rows, dq, workers, rows as u64 * 31 + dq as u64);
    }
}

#[test]
fn combine_cycles_against_declared() {
    let (rows, dq) = (32, 18);
    let simulated = combine_case(rows, dq, 6, 5);
    let declared = declared_cycles(
        "attention_combine.S",
        &[],
        &[("ROWS", 6), ("DQ", dq as u64)],
    );
    // Bound: O and O2 are read and O written once, 8 bytes per bundle, six
    // workers issuing one bundle per cycle between them.
    let bound = (3 * rows * 16 * dq / 8) as u64;
    println!("attention_combine rows={rows} dq={dq}: simulated {simulated} cycles, .cycles (6 rows per vertex) {declared}, bound {bound}");
    assert!(simulated >= bound);
    assert!(
        (declared as f64) > 0.85 * simulated as f64 && (declared as f64) < 1.15 * simulated as f64,
        "declared {declared} vs simulated {simulated}"
    );
}
