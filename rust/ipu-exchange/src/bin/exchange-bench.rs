//! Schedules synthetic phases shaped like attention's exchanges and prints,
//! per phase, the horizon beside the lower bound and the time taken.
//!
//! Usage: `exchange-bench [--no-check] [case or phase file...]`; cases:
//! `all-to-all-62k`, `all-to-all-1.2m`, `scatter`, `gather`, `broadcast`,
//! `multicast-16` (default: all). Any other argument is read as a phase in
//! the text format of `ipu_exchange::text` (for example a phase captured from
//! the compiler). `--no-check` skips the checker, as the compiler does. The
//! columns are the fields of `ipu_exchange::Report`, the wall-clock seconds
//! and an FNV-1a hash of all table bytes (equal hashes: identical tables).

use ipu_exchange::{compile_phase, synth, text, Options, Phase};
use std::time::Instant;

fn case(name: &str) -> Option<Phase> {
    let tiles = ipu_arch::TILES_PER_CHIP;
    Some(match name {
        // About 62 k transfers of 20..=50 words: 42 per tile, ~1470 words per tile.
        "all-to-all-62k" => synth::all_to_all(tiles, 42, 20, 50, 1),
        // About 1.2 M transfers of 1..=3 words: 816 per tile.
        "all-to-all-1.2m" => synth::all_to_all(tiles, 816, 1, 3, 2),
        // 1422 transfers, 7680 words out of one tile.
        "scatter" => synth::scatter(tiles, 1422, 7680),
        // 1422 transfers, 7680 words into one tile.
        "gather" => synth::gather(tiles, 1422, 7680),
        // 1422 transfers of 7680 words in total, each multicast to 4 random tiles.
        "broadcast" => synth::broadcast(tiles, 1422, 7680 * 4, 4, 3),
        // 1422 transfers, multicast to 16 random tiles each.
        "multicast-16" => synth::broadcast(tiles, 1422, 1422 * 8, 16, 4),
        _ => return None,
    })
}

const CASES: [&str; 6] = [
    "all-to-all-62k",
    "all-to-all-1.2m",
    "scatter",
    "gather",
    "broadcast",
    "multicast-16",
];

/// A case by name, or else the phase in the file of that name.
fn load(name: &str) -> Result<Phase, String> {
    if let Some(phase) = case(name) {
        return Ok(phase);
    }
    let source = std::fs::read_to_string(name).map_err(|e| {
        format!(
            "`{name}` is neither a case ({}) nor a readable phase file: {e}",
            CASES.join(", ")
        )
    })?;
    text::parse_phase(&source).map_err(|e| format!("{name}:{e}"))
}

/// FNV-1a over every table's bytes, tile by tile.
fn tables_hash(compiled: &ipu_exchange::Compiled) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for tile in 0..compiled.lowered.tables.len() as u32 {
        for b in compiled.lowered.table_bytes(tile) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let check = !args.iter().any(|a| a == "--no-check");
    args.retain(|a| a != "--no-check");
    let names: Vec<&str> = if args.is_empty() {
        CASES.to_vec()
    } else {
        args.iter().map(String::as_str).collect()
    };
    println!(
        "{:<16} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9} {:>9} {:>16}",
        "case",
        "transfers",
        "descript",
        "initial",
        "horizon",
        "bound",
        "endpoint",
        "gap",
        "gap%",
        "seconds",
        "tables"
    );
    for name in names {
        let phase = match load(name) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        };
        let options = Options {
            check,
            ..Options::default()
        };
        let t = Instant::now();
        let compiled = match compile_phase(&phase, &options) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{name}: {e}");
                std::process::exit(1);
            }
        };
        let r = &compiled.report;
        println!(
            "{:<16} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8.3}% {:>9.3} {:016x}",
            name,
            r.transfers,
            r.descriptors,
            r.initial_horizon,
            r.selected_horizon,
            r.lower_bound,
            r.endpoint_lower_bound,
            r.lower_bound_gap,
            100.0 * r.lower_bound_gap as f64 / r.lower_bound.max(1) as f64,
            t.elapsed().as_secs_f64(),
            tables_hash(&compiled)
        );
    }
}
