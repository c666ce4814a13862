//! device/fill32.S and device/copy64.S on one simulated tile: every word
//! or byte of the destination checked, the poisoned bytes around it checked
//! untouched, for sizes from zero up, unaligned (4 mod 8) fill starts, one
//! and six vertices, and both copy paths (`ld64st64` when source and
//! destination share no memory element, `ld64` + `st64` when they do);
//! cycles against `.cycles` and the 8 B/cycle store bound.

mod kernel_common;

use kernel_common::*;

const POISON: u8 = 0xA5;
const GUARD: u32 = 64;

/// Fills `n` words at `dst` with `value` over `workers` vertices; checks
/// the words and the guards; returns the compute cycles.
fn fill_case(dst: u32, n: usize, value: u32, workers: usize) -> u64 {
    let label = format!("fill32 dst={dst:#x} n={n} value={value:#x} workers={workers}");
    let launches: Vec<Launch> = ranges_aligned(n, workers, 1)
        .into_iter()
        .map(|(a, b)| Launch {
            entry: "fill32".into(),
            state: vec![dst + 4 * a as u32, (b - a) as u32, value],
        })
        .chain((n == 0).then(|| Launch {
            entry: "fill32".into(),
            state: vec![dst, 0, value],
        }))
        .collect();
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "fill32.S",
            defines: &[],
        }],
        &[launches],
        &[(dst - GUARD, vec![POISON; 4 * n + 2 * GUARD as usize])],
    );
    let words = read_u32(&chip, dst, n);
    for (i, &w) in words.iter().enumerate() {
        assert_eq!(w, value, "{label}: word {i}");
    }
    let before = chip.peek(0, dst - GUARD, GUARD).unwrap();
    let after = chip.peek(0, dst + 4 * n as u32, GUARD).unwrap();
    assert!(
        before.iter().chain(after.iter()).all(|&b| b == POISON),
        "{label}: bytes around the destination changed: {before:02x?} {after:02x?}"
    );
    cycles
}

/// Copies `bytes` from `src` to `dst` over `workers` vertices (ranges of
/// multiples of 8 bytes); checks the copy, the guards and the source;
/// returns the compute cycles.
fn copy_case(src: u32, dst: u32, bytes: usize, workers: usize, seed: u64) -> u64 {
    let label = format!("copy64 src={src:#x} dst={dst:#x} bytes={bytes} workers={workers}");
    let mut rng = Rng(seed);
    let data: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    let launches: Vec<Launch> = ranges_aligned(bytes, workers, 8)
        .into_iter()
        .map(|(a, b)| Launch {
            entry: "copy64".into(),
            state: vec![src + a as u32, dst + a as u32, (b - a) as u32],
        })
        .chain((bytes == 0).then(|| Launch {
            entry: "copy64".into(),
            state: vec![src, dst, 0],
        }))
        .collect();
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "copy64.S",
            defines: &[],
        }],
        &[launches],
        &[
            (src, data.clone()),
            (dst - GUARD, vec![POISON; bytes + 2 * GUARD as usize]),
        ],
    );
    let got = chip.peek(0, dst, bytes as u32).unwrap();
    if let Some(i) = (0..bytes).find(|&i| got[i] != data[i]) {
        panic!(
            "{label}: byte {i} is {:#04x}, source {:#04x}",
            got[i], data[i]
        );
    }
    assert_eq!(
        chip.peek(0, src, bytes as u32).unwrap(),
        data,
        "{label}: source changed"
    );
    let before = chip.peek(0, dst - GUARD, GUARD).unwrap();
    let after = chip.peek(0, dst + bytes as u32, GUARD).unwrap();
    assert!(
        before.iter().chain(after.iter()).all(|&b| b == POISON),
        "{label}: bytes around the destination changed: {before:02x?} {after:02x?}"
    );
    cycles
}

#[test]
fn fill32_writes_exactly_n_words() {
    for &n in &[0usize, 1, 2, 3, 4, 5, 17, 1000] {
        for dst in [0x90000u32, 0x90004, 0x70008, 0x7000C] {
            for workers in [1, 6] {
                fill_case(dst, n, 0x7FC0_1234 ^ n as u32, workers);
            }
        }
    }
}

#[test]
fn copy64_copies_exactly_on_both_paths() {
    for &bytes in &[0usize, 8, 16, 24, 800, 8192] {
        for workers in [1, 6] {
            // Different interleaved elements: the ld64st64 path.
            copy_case(0x90000, 0xA0000, bytes, workers, bytes as u64);
            // One interleaved element: the ld64 + st64 path.
            copy_case(0x90000, 0x94000, bytes, workers, bytes as u64 + 1);
            // Standard memory to interleaved and one standard element.
            copy_case(0x70000, 0xB0008, bytes, workers, bytes as u64 + 2);
            copy_case(
                0x74000,
                0x76000,
                bytes.min(0x1F00),
                workers,
                bytes as u64 + 3,
            );
        }
    }
}

/// Ranges that share a memory element at their boundary but lie at least
/// an element apart never load and store in one element in a bundle of the
/// fast loop (its load and the previous bundle's store are DST - SRC - 8
/// bytes apart), so they take it; a hair closer they must not (the fast
/// loop would fault there).
#[test]
fn copy64_takes_the_fast_path_for_ranges_an_element_apart() {
    let bytes = 0x3000;
    let disjoint = copy_case(0x70000, 0xB0000, bytes, 1, 1);
    // Standard memory (16 KiB elements): the source ends in element 0x1D,
    // where the destination starts, 0x4800 bytes on; and the other way.
    let apart = copy_case(0x72000, 0x76800, bytes, 1, 2);
    let below = copy_case(0x76800, 0x72000, bytes, 1, 3);
    // Interleaved memory (32 KiB elements): exactly an element apart, and
    // 8 bytes closer.
    let interleaved = copy_case(0x94000, 0x9C008, 0x6000, 1, 4);
    let close = copy_case(0x94000, 0x9C000, 0x6000, 1, 5);
    let interleaved_disjoint = copy_case(0x90000, 0xB0000, 0x6000, 1, 6);
    println!(
        "copy64 {bytes} bytes: disjoint {disjoint}, an element apart {apart} and {below}; \
         0x6000 interleaved: disjoint {interleaved_disjoint}, an element apart {interleaved}, 8 bytes closer {close}"
    );
    // The distance test costs a dozen bundles beside the element keys.
    for fast in [apart, below] {
        assert!(fast <= disjoint + 6 * 16, "{fast} against {disjoint}");
    }
    assert!(interleaved <= interleaved_disjoint + 6 * 16);
    assert!(close as f64 > 1.8 * interleaved as f64, "{close}");
}

#[test]
fn copy64_paths_and_fill32_cycles_against_declared_and_bounds() {
    let per_worker = 8192u64;
    let bytes = 6 * per_worker as usize;
    let fast = copy_case(0x90000, 0xB0000, bytes, 6, 1);
    // Each vertex's source and destination in one 32 KiB element.
    let launches: Vec<Launch> = (0..6u32)
        .map(|w| Launch {
            entry: "copy64".into(),
            state: vec![
                0x80000 + 0x8000 * w,
                0x84000 + 0x8000 * w,
                per_worker as u32,
            ],
        })
        .collect();
    let copy = Kernel {
        file: "copy64.S",
        defines: &[],
    };
    let slow = simulate(&[copy], &[launches], &[]).1;
    let estimate = declared_cycles("copy64.S", &[], &[("BYTES", per_worker)]);
    let bound = (bytes / 8) as u64;
    println!(
        "copy64 {bytes} bytes on 6 workers: fast path {fast} cycles, slow path {slow}, .cycles (fast) {estimate}, bound {bound}"
    );
    assert!(fast >= bound && slow >= bound);
    assert!(
        slow as f64 > 1.8 * fast as f64,
        "the slow path ran for the fast case"
    );
    let ratio = estimate as f64 / fast as f64;
    assert!(
        (0.85..1.2).contains(&ratio),
        "estimate {estimate} vs {fast}"
    );

    let n = 6 * 2048;
    let cycles = fill_case(0x90000, n, 1, 6);
    let estimate = declared_cycles("fill32.S", &[], &[("N", (n / 6) as u64)]);
    let bound = (4 * n / 8) as u64;
    println!("fill32 {n} words on 6 workers: {cycles} cycles, .cycles {estimate}, bound {bound}");
    assert!(cycles >= bound);
    let ratio = estimate as f64 / cycles as f64;
    assert!(
        (0.85..1.2).contains(&ratio),
        "estimate {estimate} vs {cycles}"
    );
}

/// device/fill64.S: a list of ranges, each with its own word pair, filled
/// and nothing else written (poisoned guards between and around the ranges);
/// the cycles against `.cycles`.
#[test]
fn fill64_fills_each_range_with_its_pair() {
    let base = 0x80000u32;
    // (offset from base, items, lo, hi); gaps of poison between ranges.
    let ranges: [(u32, u32, u32, u32); 4] = [
        (0, 37, 0, 0),
        (37 * 8 + 24, 5, 0xFF80_0000, 0),
        (37 * 8 + 24 + 5 * 8 + 16, 0, 7, 7),
        (37 * 8 + 24 + 5 * 8 + 32, 300, 0x1234_5678, 0x9ABC_DEF0),
    ];
    let end = ranges[3].0 + 300 * 8;
    let mut state = vec![ranges.len() as u32];
    for &(off, n, lo, hi) in &ranges {
        state.extend([base + off, n, lo, hi]);
    }
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "fill64.S",
            defines: &[],
        }],
        &[vec![Launch {
            entry: "fill64".into(),
            state,
        }]],
        &[(base - GUARD, vec![POISON; (end + 2 * GUARD) as usize])],
    );
    let words = read_u32(&chip, base - GUARD, ((end + 2 * GUARD) / 4) as usize);
    let poison = u32::from_le_bytes([POISON; 4]);
    for (i, &w) in words.iter().enumerate() {
        let addr = i as u32 * 4;
        let at = addr as i64 - GUARD as i64;
        let want = ranges
            .iter()
            .find(|r| at >= r.0 as i64 && at < (r.0 + 8 * r.1) as i64)
            .map(|r| if (at - r.0 as i64) % 8 == 0 { r.2 } else { r.3 })
            .unwrap_or(poison);
        assert_eq!(w, want, "word at base{at:+}");
    }
    let declared = declared_cycles("fill64.S", &[], &[("N", 4), ("COUNT", 342)]);
    println!(
        "fill64 4 ranges 342 items: simulated {cycles} cycles, .cycles {declared}, bound {}",
        342
    );
    assert!(
        cycles >= 342
            && (declared as f64) > 0.9 * cycles as f64
            && (declared as f64) < 1.1 * cycles as f64
    );
}

/// device/fill_rows.S: the same items of equally spaced rows, split over
/// vertices by rows as the compiler does, nothing else written (poison
/// between the rows' items); the cycles against `.cycles`.
#[test]
fn fill_rows_fills_the_items_of_every_row() {
    let base = 0x80000u32;
    let (stride, rows, items) = (160u32, 368u32, 2u32);
    let (lo, hi) = (0x3C00_3C00u32, 0x0000_3C00u32);
    let first = 144u32;
    let end = rows * stride;
    let parts = ranges_aligned(rows as usize, 6, 1);
    let launches: Vec<Launch> = parts
        .iter()
        .map(|&(r0, r1)| Launch {
            entry: "fill_rows".into(),
            state: vec![
                base + first + r0 as u32 * stride,
                stride,
                (r1 - r0) as u32,
                items,
                lo,
                hi,
            ],
        })
        .collect();
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "fill_rows.S",
            defines: &[],
        }],
        &[launches],
        &[(base - GUARD, vec![POISON; (end + 2 * GUARD) as usize])],
    );
    let words = read_u32(&chip, base - GUARD, ((end + 2 * GUARD) / 4) as usize);
    let poison = u32::from_le_bytes([POISON; 4]);
    for (i, &w) in words.iter().enumerate() {
        let at = i as i64 * 4 - GUARD as i64;
        let in_row = at.rem_euclid(stride as i64) - first as i64;
        let row = at.div_euclid(stride as i64);
        let want = if at >= 0 && row < rows as i64 && (0..8 * items as i64).contains(&in_row) {
            if in_row % 8 == 0 {
                lo
            } else {
                hi
            }
        } else {
            poison
        };
        assert_eq!(w, want, "word at base{at:+}");
    }
    // The supervisor's six launches are part of `cycles`: compare the
    // slowest vertex's formula plus the launch spacing of docs/runtime.md.
    let per_vertex = parts.iter().map(|r| r.1 - r.0).max().unwrap() as u64;
    let declared = declared_cycles(
        "fill_rows.S",
        &[],
        &[("ROWS", per_vertex), ("ITEMS", items as u64)],
    ) + 12 * 5
        + 6;
    println!("fill_rows {rows} rows x {items} items on six vertices: simulated {cycles} cycles, .cycles + launches {declared}");
    assert!(
        (declared as f64) > 0.85 * cycles as f64 && (declared as f64) < 1.15 * cycles as f64,
        "declared {declared} vs simulated {cycles}"
    );
}

/// device/copy64_list.S: one vertex per worker, each with a list of ranges
/// of sizes from zero up (both copy paths among them), each source its
/// stack's slot k for the index k the state points at; every destination
/// byte checked, the poisoned gaps between the ranges untouched; the
/// cycles against `.cycles` and the 8 B/cycle store bound.
#[test]
fn copy64_list_copies_every_range_of_every_list() {
    let mut rng = Rng(7);
    // Per worker: (source, destination, bytes); sources in interleaved
    // elements of their own (the fast path) except one range per list
    // whose source and destination share an element (the slow path).
    let sizes = [0u32, 8, 24, 800, 2048, 16];
    let mut lists: Vec<Vec<(u32, u32, u32)>> = Vec::new();
    let mut inits: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut expected: Vec<(u32, Vec<u8>)> = Vec::new();
    for w in 0..6u32 {
        let mut list = Vec::new();
        let mut src = 0x80000 + 0x4000 * w;
        let mut dst = 0xB0000 + 0x4000 * w;
        for (k, &bytes) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
            // The third range of each list copies within the source's element.
            let d = if k == 2 { src + 0x1000 } else { dst };
            inits.push((src, data.clone()));
            inits.push((d - GUARD, vec![POISON; (bytes + 2 * GUARD) as usize]));
            expected.push((d, data));
            list.push((src, d, bytes));
            src += bytes + 64;
            if k != 2 {
                dst += bytes + 2 * GUARD;
            }
        }
        lists.push(list);
    }
    // Iteration k = 3 of a loop: each source is given as slot 0 of a
    // stack whose slots are 0x40 * (its range's position + 1) bytes apart,
    // three slots below its place.
    const INDEX_WORD: u32 = 0x70000;
    inits.push((INDEX_WORD, 3u32.to_le_bytes().to_vec()));
    let launches: Vec<Launch> = lists
        .iter()
        .map(|list| {
            let mut state = vec![list.len() as u32, INDEX_WORD];
            for (r, &(s, d, b)) in list.iter().enumerate() {
                let stride = 0x40 * (r as u32 + 1);
                state.extend([s - 3 * stride, stride, d, b]);
            }
            Launch {
                entry: "copy64_list".into(),
                state,
            }
        })
        .collect();
    let (chip, cycles) = simulate(
        &[Kernel {
            file: "copy64_list.S",
            defines: &[],
        }],
        &[launches],
        &inits,
    );
    for (d, data) in &expected {
        assert_eq!(
            &chip.peek(0, *d, data.len() as u32).unwrap(),
            data,
            "range at {d:#x}"
        );
        let before = chip.peek(0, d - GUARD, GUARD).unwrap();
        let after = chip.peek(0, d + data.len() as u32, GUARD).unwrap();
        assert!(
            before.iter().chain(after.iter()).all(|&b| b == POISON),
            "bytes around the range at {d:#x} changed"
        );
    }
    let per_worker: u32 = sizes.iter().sum();
    let declared = declared_cycles(
        "copy64_list.S",
        &[],
        &[("N", sizes.len() as u64), ("BYTES", per_worker as u64)],
    );
    let bound = (6 * per_worker / 8) as u64;
    println!(
        "copy64_list 6 lists of {} ranges, {per_worker} bytes each: simulated {cycles} cycles, .cycles {declared}, bound {bound}",
        sizes.len()
    );
    assert!(cycles >= bound);
    assert!(
        (declared as f64) > 0.85 * cycles as f64 && (declared as f64) < 1.2 * cycles as f64,
        "declared {declared} vs simulated {cycles}"
    );
    // An empty list writes nothing.
    let (chip, _) = simulate(
        &[Kernel {
            file: "copy64_list.S",
            defines: &[],
        }],
        &[vec![Launch {
            entry: "copy64_list".into(),
            state: vec![0, 0x70000],
        }]],
        &[(0x90000, vec![POISON; 64])],
    );
    assert_eq!(chip.peek(0, 0x90000, 64).unwrap(), vec![POISON; 64]);
}
