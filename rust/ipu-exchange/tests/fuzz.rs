//! Fuzzing: random phases are scheduled and checked, and every mutation of a
//! valid table set that changes what it does must be caught by the checker.

use ipu_exchange::rng::SplitMix64;
use ipu_exchange::{
    check, compile_phase, synth, Descriptor, Options, Report, SEND_KIND, XTAB_ISSUE_OFFSET,
};

fn options() -> Options {
    Options {
        rounds: Some(4),
        ..Options::default()
    }
}

#[test]
fn random_phases_schedule_check_and_stay_near_the_bound() {
    let mut rng = SplitMix64(0x5EED);
    for case in 0..300 {
        let tiles = rng.range(1, 24) as u32;
        let transfers = rng.range(0, 80) as u32;
        let max_words = [1, 4, 40, 300][case % 4];
        let phase = synth::random(&mut rng, tiles, transfers, max_words, 4);
        let compiled =
            compile_phase(&phase, &options()).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let r = &compiled.report;
        // The checker ran inside compile_phase; run it again to get its view.
        let summary = check(&phase, &compiled.lowered.tables, XTAB_ISSUE_OFFSET).unwrap();
        assert_eq!(summary.horizon, r.selected_horizon, "case {case}");
        assert!(
            r.selected_horizon >= r.lower_bound,
            "case {case}: beat the lower bound"
        );
        assert!(r.selected_horizon <= r.initial_horizon, "case {case}");
        let words: u64 = phase
            .transfers
            .iter()
            .map(|t| t.words() as u64 * t.destinations.len() as u64)
            .sum();
        assert_eq!(summary.words_delivered, words, "case {case}");
    }
}

/// With `whole_jobs` no transfer is cut into pieces: a tile's table holds
/// at most one descriptor per transfer it sends or receives (what callers
/// that bound their tables' size count), and the tables still pass the
/// checker. Without it some of these phases are cut.
#[test]
fn whole_jobs_keep_one_descriptor_per_transfer_and_tile() {
    let mut rng = SplitMix64(0xB0A7);
    let mut cut_without = 0;
    for case in 0..120 {
        let tiles = rng.range(2, 24) as u32;
        let transfers = rng.range(1, 60) as u32;
        let phase = synth::random(&mut rng, tiles, transfers, 300, 4);
        let whole = Options {
            whole_jobs: true,
            ..options()
        };
        let compiled = compile_phase(&phase, &whole).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(compiled.report.piece_words, None, "case {case}");
        check(&phase, &compiled.lowered.tables, XTAB_ISSUE_OFFSET).unwrap();
        let mut entries = vec![0usize; tiles as usize];
        for t in &phase.transfers {
            entries[t.source as usize] += 1;
            for d in &t.destinations {
                entries[d.tile as usize] += 1;
            }
        }
        for (tile, table) in compiled.lowered.tables.iter().enumerate() {
            assert!(
                table.len() <= entries[tile],
                "case {case}: tile {tile} holds {} descriptors for {} transfers",
                table.len(),
                entries[tile]
            );
        }
        let cut = compile_phase(&phase, &options()).unwrap();
        cut_without += usize::from(cut.report.piece_words.is_some());
    }
    assert!(cut_without > 0, "no phase here is cut without whole_jobs");
}

#[test]
fn same_phase_gives_identical_tables_in_any_input_order() {
    let mut rng = SplitMix64(7);
    let phase = synth::random(&mut rng, 16, 120, 60, 3);
    let a = compile_phase(&phase, &options()).unwrap();
    let mut shuffled = phase.clone();
    shuffled.transfers.reverse();
    let b = compile_phase(&shuffled, &options()).unwrap();
    let bytes = |c: &ipu_exchange::Compiled| {
        (0..phase.tiles)
            .flat_map(|t| c.lowered.table_bytes(t))
            .collect::<Vec<u8>>()
    };
    assert_eq!(bytes(&a), bytes(&b));
    // And across thread counts: the candidates run on rayon.
    let pool = rayon_pool(1);
    let c = pool.install(|| compile_phase(&phase, &options()).unwrap());
    assert_eq!(bytes(&a), bytes(&c));
}

/// On strided phases the coarsest piece size that reaches the target is
/// chosen and the finer sizes' searches stop when it does, at whatever
/// moment the threads reach that point: the tables must not depend on it.
#[test]
fn strided_phases_give_identical_tables_on_any_thread_count() {
    let mut rng = SplitMix64(54);
    let mut reached = 0;
    for case in 0..24 {
        let phase = match case % 3 {
            0 => synth::scatter(8, 100 + 20 * case, 1200),
            _ => synth::strided(&mut rng, 9, 30, 12, [2, 5, 17][case as usize % 3]),
        };
        let bytes = |c: &ipu_exchange::Compiled| {
            (0..phase.tiles)
                .flat_map(|t| c.lowered.table_bytes(t))
                .collect::<Vec<u8>>()
        };
        let one = rayon_pool(1).install(|| compile_phase(&phase, &Options::default()).unwrap());
        let four = rayon_pool(4).install(|| compile_phase(&phase, &Options::default()).unwrap());
        assert_eq!(bytes(&one), bytes(&four), "case {case}");
        assert_eq!(
            one.report,
            Report {
                elapsed: one.report.elapsed,
                ..four.report.clone()
            },
            "case {case}"
        );
        reached += usize::from(one.report.lower_bound_gap == 0 && one.report.piece_words.is_some());
    }
    assert!(reached > 0, "no phase here reaches its bound with pieces");
}

fn rayon_pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// Mutations that change what a table set does (never a no-op).
fn mutate(tables: &mut [Vec<Descriptor>], rng: &mut SplitMix64, tiles: u32) -> String {
    let nonempty: Vec<usize> = (0..tables.len())
        .filter(|&t| !tables[t].is_empty())
        .collect();
    let tile = nonempty[rng.below(nonempty.len() as u64) as usize];
    let table = &mut tables[tile];
    let i = rng.below(table.len() as u64) as usize;
    let d = &mut table[i];
    let before = *d;
    let what = match rng.below(12) {
        0 => {
            d.start += 1;
            "start + 1"
        }
        1 if d.start > 0 => {
            d.start -= 1;
            "start - 1"
        }
        2 if !d.is_send() => {
            d.words += 1;
            "receive words + 1"
        }
        3 if d.words > 1 => {
            d.words -= 1;
            "words - 1"
        }
        4 => {
            d.address += 4;
            "address + 4"
        }
        5 if !d.is_send() && tiles > 1 => {
            d.kind = (d.kind + 1) % tiles;
            "other source"
        }
        6 if !d.is_send() => {
            d.kind = SEND_KIND;
            "receive turned into a send"
        }
        9 if d.stride.is_some_and(|s| d.words > s.run) => {
            d.stride.as_mut().unwrap().bytes += 4;
            "stride + 4 bytes"
        }
        10 if d.stride.is_some_and(|s| d.words > s.run && s.run > 1) => {
            d.stride.as_mut().unwrap().run -= 1;
            "run - 1 word"
        }
        11 if d.stride.is_some() => {
            d.stride = None;
            "stride dropped"
        }
        7 => {
            table.remove(i);
            return format!("tile {tile}: dropped descriptor {i} ({before})");
        }
        _ => {
            let copy = table[i];
            table.insert(i, copy);
            return format!("tile {tile}: duplicated descriptor {i} ({before})");
        }
    };
    format!("tile {tile}: descriptor {i} ({before}): {what}")
}

#[test]
fn the_checker_catches_every_mutation() {
    let mut rng = SplitMix64(0xC0FFEE);
    let mut caught = 0;
    for case in 0..200 {
        let tiles = rng.range(2, 12) as u32;
        let transfers = rng.range(1, 40) as u32;
        // Every other case has strided blocks.
        let phase = if case % 2 == 0 {
            synth::random(&mut rng, tiles, transfers, 24, 3)
        } else {
            synth::strided(&mut rng, tiles, 1 + transfers / 4, 8, 6)
        };
        let compiled = compile_phase(&phase, &options()).unwrap();
        let c = XTAB_ISSUE_OFFSET;
        let mut tables = compiled.lowered.tables.clone();
        let what = mutate(&mut tables, &mut rng, tiles);
        match check(&phase, &tables, c) {
            Ok(_) => panic!("case {case}: mutation not caught: {what}"),
            Err(e) => {
                // Errors render as one line naming the tile.
                assert!(e.to_string().contains("tile"), "{e}");
                caught += 1;
            }
        }
    }
    assert_eq!(caught, 200);
}

#[test]
fn the_checker_catches_a_late_descriptor_and_a_table_for_a_missing_tile() {
    let phase = synth::all_to_all(4, 3, 2, 5, 9);
    let compiled = compile_phase(&phase, &options()).unwrap();
    let c = 12;
    let mut tables = compiled.lowered.tables.clone();
    // Descriptor 1 of tile 0 issues at c + 1; starting it at c is late.
    tables[0][1].start = c as u32;
    let e = check(&phase, &tables, c).unwrap_err();
    assert!(e.to_string().contains("issues at cycle 13"), "{e}");
    let mut tables = compiled.lowered.tables.clone();
    tables.pop();
    let e = check(&phase, &tables, c).unwrap_err();
    assert_eq!(e.to_string(), "3 descriptor tables for a phase of 4 tiles");
}

/// Blocks moved row by row chain into strided jobs: the tables pass the
/// checker, every strided descriptor stays inside the span that holds its
/// first byte, and the tables take fewer slots than the same phases
/// scheduled with contiguous descriptors only (spans left empty).
#[test]
fn strided_blocks_stay_in_their_spans_and_take_fewer_slots() {
    let mut rng = SplitMix64(0x57_21DE);
    let (mut strided_slots, mut plain_slots, mut strided_descriptors) = (0, 0, 0);
    for case in 0..150 {
        let tiles = rng.range(1, 16) as u32;
        let blocks = rng.range(1, 30) as u32;
        let phase = synth::strided(&mut rng, tiles, blocks, 16, [1, 3, 8, 40][case % 4]);
        let compiled =
            compile_phase(&phase, &options()).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let spans = phase.spans.as_ref().unwrap();
        for (tile, table) in compiled.lowered.tables.iter().enumerate() {
            for d in table.iter().filter(|d| d.stride.is_some()) {
                strided_descriptors += 1;
                let (lo, hi) = d.footprint();
                assert!(
                    spans[tile]
                        .iter()
                        .any(|&(a, e)| a as u64 <= lo && hi <= e as u64),
                    "case {case}: tile {tile}: {d} leaves its span"
                );
            }
        }
        let plain = ipu_exchange::Phase {
            spans: Some(vec![Vec::new(); tiles as usize]),
            ..phase.clone()
        };
        let contiguous = compile_phase(&plain, &options()).unwrap();
        assert!(contiguous
            .lowered
            .tables
            .iter()
            .flatten()
            .all(|d| d.stride.is_none()));
        strided_slots += compiled.report.slots;
        plain_slots += contiguous.report.slots;
        // The encoding round-trips, prefixes included.
        for tile in 0..tiles {
            let bytes = compiled.lowered.table_bytes(tile);
            assert_eq!(
                bytes.len(),
                16 * ipu_exchange::lower::slots(&compiled.lowered.tables[tile as usize])
            );
            assert_eq!(
                ipu_exchange::lower::decode_table(&bytes).unwrap(),
                compiled.lowered.tables[tile as usize]
            );
        }
    }
    assert!(
        strided_descriptors > 500,
        "{strided_descriptors} strided descriptors"
    );
    assert!(
        2 * strided_slots < plain_slots,
        "{strided_slots} slots strided, {plain_slots} contiguous"
    );
}

/// A stride prefix must be followed by a descriptor.
#[test]
fn a_dangling_stride_prefix_does_not_decode() {
    let d = Descriptor {
        stride: Some(ipu_exchange::Stride { run: 2, bytes: 32 }),
        ..Descriptor::plain(SEND_KIND, 0x80000, 8, 20)
    };
    let bytes = ipu_exchange::lower::encode_table(&[d]);
    assert_eq!(bytes.len(), 32);
    assert_eq!(ipu_exchange::lower::decode_table(&bytes).unwrap(), vec![d]);
    let e = ipu_exchange::lower::decode_table(&bytes[..16]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the stride prefix at slot 0 is not followed by a descriptor"
    );
    let twice = [&bytes[..16], &bytes[..]].concat();
    let e = ipu_exchange::lower::decode_table(&twice).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the stride prefix at slot 0 is not followed by a descriptor"
    );
}
