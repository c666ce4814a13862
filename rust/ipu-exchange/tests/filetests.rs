//! Data-driven tests: a phase in the text format goes through one check
//! helper, which prints the report and the tables (or the error); the output
//! is an expect-test snapshot (`UPDATE_EXPECT=1 cargo test` refreshes them).

use expect_test::{expect, Expect};
use ipu_exchange::text::{parse_phase, print_tables};
use ipu_exchange::{compile_phase, Options};

fn check(input: &str, expect: Expect) {
    let out = match parse_phase(input) {
        Err(e) => format!("parse error {e}\n"),
        Ok(phase) => match compile_phase(
            &phase,
            &Options {
                rounds: Some(4),
                ..Options::default()
            },
        ) {
            Err(e) => format!("{e}\n"),
            Ok(c) => {
                let r = &c.report;
                format!(
                    "transfers={} jobs={} descriptors={} horizon={} bound={} endpoint={} gap={} exchange_cycles={}\n{}",
                    r.transfers,
                    r.jobs,
                    r.descriptors,
                    r.selected_horizon,
                    r.lower_bound,
                    r.endpoint_lower_bound,
                    r.lower_bound_gap,
                    r.exchange_cycles,
                    print_tables(&c.lowered)
                )
            }
        },
    };
    expect.assert_eq(&out);
}

#[test]
fn one_transfer() {
    check(
        "tiles 2\ntransfer 0: 0 0x80000 -> 1 0x90000 bytes 16\n",
        expect![[r#"
            transfers=1 jobs=1 descriptors=2 horizon=16 bound=16 endpoint=4 gap=0 exchange_cycles=24
            tile 0:
              send 0x80000 words=4 start=12
            tile 1:
              recv 0x90000 words=4 start=12 from=0
        "#]],
    );
}

#[test]
fn adjacent_transfers_coalesce_into_one_descriptor_pair() {
    check(
        "tiles 3
         transfer 1: 0 0x80010 -> 1 0x90010, 2 0xa0010 bytes 16
         transfer 0: 0 0x80000 -> 1 0x90000, 2 0xa0000 bytes 16  # continues into 1
        ",
        expect![[r#"
            transfers=2 jobs=1 descriptors=3 horizon=20 bound=20 endpoint=8 gap=0 exchange_cycles=24
            tile 0:
              send 0x80000 words=8 start=12
            tile 1:
              recv 0x90000 words=8 start=12 from=0
            tile 2:
              recv 0xa0000 words=8 start=12 from=0
        "#]],
    );
}

/// Three rows of 2 words out of 4-word rows on tile 0, to tile 1 (packed)
/// and tile 2 (32 bytes apart).
const COLUMN_BLOCK_ROWS: &str = "tiles 3
         transfer 0: 0 0x80000 -> 1 0x90000, 2 0xa0000 bytes 8
         transfer 1: 0 0x80010 -> 1 0x90008, 2 0xa0020 bytes 8
         transfer 2: 0 0x80020 -> 1 0x90010, 2 0xa0040 bytes 8
";

#[test]
fn rows_of_a_column_block_chain_into_strided_descriptors() {
    // Three rows of 2 words out of 4-word rows at the source (one head's
    // columns of a wider matrix) land contiguously on tile 1 and 32 bytes
    // apart on tile 2: one strided job. Tile 0's send and tile 2's receive
    // are strided (two slots each: the prefix issues at 12, the descriptor
    // at 13, so the whole job starts at 13 and ends a cycle past the
    // bound); tile 1's receive is contiguous. Cut into a piece of two runs
    // and one of one run, the one-run piece needs no prefix and starts at
    // 12, and the strided piece follows at 14: the bound, for three more
    // descriptors (a small phase takes the shortest schedule).
    check(
        COLUMN_BLOCK_ROWS,
        expect![[r#"
            transfers=3 jobs=1 descriptors=6 horizon=18 bound=18 endpoint=6 gap=0 exchange_cycles=24
            tile 0:
              send 0x80020 words=2 start=12
              send 0x80000 words=4 start=14 runs of 2 every 0x10
            tile 1:
              recv 0x90010 words=2 start=12 from=0
              recv 0x90000 words=4 start=14 from=0
            tile 2:
              recv 0xa0040 words=2 start=12 from=0
              recv 0xa0000 words=4 start=14 from=0 runs of 2 every 0x20
        "#]],
    );
}

#[test]
fn a_stride_never_leaves_its_span() {
    // The same rows, but the third lies in another span of tile 0 (another
    // buffer of a compiler that moves buffers after scheduling): two rows
    // chain, the third is a job of its own, and it goes first, needing no
    // prefix.
    check(
        &format!(
            "{COLUMN_BLOCK_ROWS}
         span 0 0x80000 0x80018
         span 0 0x80020 0x80028
         span 1 0x90000 0x90018
         span 2 0xa0000 0xa0048
        "
        ),
        expect![[r#"
            transfers=3 jobs=2 descriptors=6 horizon=18 bound=18 endpoint=6 gap=0 exchange_cycles=24
            tile 0:
              send 0x80020 words=2 start=12
              send 0x80000 words=4 start=14 runs of 2 every 0x10
            tile 1:
              recv 0x90010 words=2 start=12 from=0
              recv 0x90000 words=4 start=14 from=0
            tile 2:
              recv 0xa0040 words=2 start=12 from=0
              recv 0xa0000 words=4 start=14 from=0 runs of 2 every 0x20
        "#]],
    );
}

#[test]
fn two_senders_share_one_receiver_in_turn() {
    check(
        "tiles 3
         transfer 0: 0 0x80000 -> 2 0x90000 bytes 40
         transfer 1: 1 0x80000 -> 2 0x90100 bytes 24
        ",
        expect![[r#"
            transfers=2 jobs=2 descriptors=4 horizon=28 bound=28 endpoint=16 gap=0 exchange_cycles=28
            tile 0:
              send 0x80000 words=10 start=12
            tile 1:
              send 0x80000 words=6 start=22
            tile 2:
              recv 0x90000 words=10 start=12 from=0
              recv 0x90100 words=6 start=22 from=1
        "#]],
    );
}

#[test]
fn swap_between_two_tiles_runs_both_directions_at_once() {
    check(
        "tiles 2
         transfer 0: 0 0x80000 -> 1 0x90000 bytes 32
         transfer 1: 1 0x80000 -> 0 0x90000 bytes 32
        ",
        expect![[r#"
            transfers=2 jobs=2 descriptors=4 horizon=21 bound=21 endpoint=8 gap=0 exchange_cycles=24
            tile 0:
              send 0x80000 words=8 start=12
              recv 0x90000 words=8 start=13 from=1
            tile 1:
              recv 0x90000 words=8 start=12 from=0
              send 0x80000 words=8 start=13
        "#]],
    );
}

#[test]
fn empty_phase() {
    check(
        "tiles 3\n",
        expect![[r#"
            transfers=0 jobs=0 descriptors=0 horizon=0 bound=0 endpoint=0 gap=0 exchange_cycles=24
        "#]],
    );
}

#[test]
fn errors_name_the_transfer_tile_and_address() {
    check(
        "tiles 2\ntransfer 0: 0 0x80002 -> 1 0x90000 bytes 16\n",
        expect![[r#"
            invalid exchange phase: transfer 0: address 0x80002 on tile 0 is not 4-aligned
        "#]],
    );
    check(
        "tiles 2\ntransfer 0: 0 0x80000 -> 3 0x90000 bytes 16\n",
        expect![[r#"
            invalid exchange phase: transfer 0: tile 3 does not exist (phase has 2 tiles)
        "#]],
    );
    check(
        "tiles 2\ntransfer 0: 0 0x80000 -> 1 0x90000 bytes 6\n",
        expect![[r#"
            invalid exchange phase: transfer 0: 6 bytes is not a positive multiple of 4
        "#]],
    );
    check(
        "tiles 2\ntransfer 0: 0 0x80000 -> 1 0xe7ff0 bytes 32\n",
        expect![[r#"
            invalid exchange phase: transfer 0: 32 bytes at 0xe7ff0 on tile 1 leave SRAM (0x4c000..0xe8000)
        "#]],
    );
    check(
        "tiles 3
         transfer 0: 0 0x80000 -> 2 0x90000 bytes 16
         transfer 1: 1 0x80000 -> 2 0x9000c bytes 16
        ",
        expect![[r#"
            invalid exchange phase: tile 2: receives of transfers 0 and 1 overlap at 0x9000c
        "#]],
    );
    check(
        "tiles 2
         transfer 0: 0 0x80000 -> 1 0x90000 bytes 16
         transfer 1: 1 0x90008 -> 0 0x90000 bytes 16
        ",
        expect![[r#"
            invalid exchange phase: tile 1: the receive of transfer 0 at 0x90008 overwrites the source of transfer 1 sent in the same phase
        "#]],
    );
    check(
        "tiles 3\ntransfer 0: 0 0x80000 -> 1 0x90000, 1 0x91000 bytes 16\n",
        expect![[r#"
            invalid exchange phase: transfer 0: tile 1 is named twice as a destination
        "#]],
    );
    check(
        "tiles 2\ntransfer 0: 0 0x80000 -> 1 0x90000 bytes 16\ntransfer 0: 1 0x80000 -> 0 0x90000 bytes 16\n",
        expect![[r#"
            invalid exchange phase: transfer id 0 is used twice
        "#]],
    );
}

#[test]
fn syntax_errors_name_line_and_column() {
    check(
        "tiles 2\ntransfer 0: 0 0x80000 => 1 0x90000 bytes 16\n",
        expect![[r#"
            parse error 2:23: expected `->`, found `=>`
        "#]],
    );
    check(
        "tiles 2\ntransfer 0: 0 0x80000 -> 1 0x90000 bytes\n",
        expect![[r#"
            parse error 2:41: expected a byte count before the end of the line
        "#]],
    );
    check(
        "tile 2\n",
        expect![[r#"
            parse error 1:1: unknown directive `tile`
        "#]],
    );
}
