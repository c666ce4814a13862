//! Simulator throughput benchmark: every tile runs six workers streaming rows
//! through the AMP (the inner loop of a GEMM), then prints simulated
//! tile-instructions per second and the wall time.
//!
//! Usage: sim-bench [tiles] [rows]

use ipu_isa::build::ProgramBuilder;
use ipu_sim::{Chip, ChipConfig, Stop};
use std::time::Instant;

const CODE: u32 = 0x4C000;
const DATA: u32 = 0x80000;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("integer argument"))
        .collect();
    let tiles = args.first().copied().unwrap_or(64) as u32;
    let rows = args.get(1).copied().unwrap_or(512);
    let mut b = ProgramBuilder::new(CODE);
    // Supervisor: launch six workers, wait, exit.
    b.asm_block(&format!(
        "
        setzi $m2, worker
        setzi $m3, {DATA}
        run $m2, $m3
        run $m2, $m3
        run $m2, $m3
        run $m2, $m3
        run $m2, $m3
        run $m2, $m3
        wsync
        exit
        worker:
        # Worker w streams x from 0x80000 + w * 0x4000 and partials from
        # 0x2008 bytes further (the other bank of the same element), and stores
        # outputs to 0x60000 + w * 0x2000; the last bundle of a row rewinds
        # all three pointers so that the data stays in 32 bytes.
        setzi $m8, 0xC0000
{weights}
        shl $m4, $m1, 14
        setzi $m2, 0x80000
        add $m4, $m4, $m2
        setzi $m3, 0x2008
        add $m5, $m4, $m3
        shl $m6, $m1, 13
        setzi $m3, 0x60000
        add $m6, $m6, $m3
        setzi $m7, 0xFFE8
        setzi $m2, {count}
        rpt $m2, 4
        {{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0 ; ampf16 $a4:5, $a0:1, $a2:3 }}
        {{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0 ; ampf16 $a4:5, $a0:1, $a2:3 }}
        {{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0 ; ampf16 $a4:5, $a0:1, $a2:3 }}
        {{ ld2x64st64 $a0:3, $a4:5, $m4, $m7, 0b010101 ; ampf16 $a4:5, $a0:1, $a2:3 }}
        exit
        ",
        count = rows,
        weights = (0..32)
            .map(|i| format!("ld128 $a8:11, [$m8]+=16\nampw $a8:11, {i}\n"))
            .collect::<String>()
    ))
    .expect("benchmark program assembles");
    let image = b.finish().expect("labels resolve");
    let mut chip = Chip::new(ChipConfig {
        tiles,
        ..ChipConfig::default()
    });
    // Random f16 inputs in [-1, 1) for weights, x and partials, so that the
    // arithmetic takes its usual paths (zeros would take shortcuts).
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut data = vec![0u8; 0x60000];
    for pair in data.chunks_mut(2) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let v = (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        pair.copy_from_slice(&ipu_isa::numerics::f64_to_f16_bits(v).to_le_bytes());
    }
    for t in 0..tiles {
        chip.write(t, DATA, &data[..0x18000]).unwrap();
        chip.write(t, 0xC0000, &data[..512]).unwrap();
        chip.write(t, CODE, &image).unwrap();
        chip.set_entry(t, CODE).unwrap();
    }
    let start = Instant::now();
    let stop = chip.run().unwrap_or_else(|e| panic!("{e}"));
    let wall = start.elapsed().as_secs_f64();
    assert_eq!(stop, Stop::Exited);
    let instructions: u64 = chip
        .steps()
        .iter()
        .flat_map(|s| s.tiles.iter())
        .map(|t| t.instructions)
        .sum();
    let bundles: u64 = chip
        .steps()
        .iter()
        .flat_map(|s| s.tiles.iter())
        .map(|t| t.bundles)
        .sum();
    let macs = tiles as u64 * 6 * rows * 4 * 64;
    println!(
        "tiles {tiles}, rows per worker {rows}, simulated cycles {}",
        chip.cycles()
    );
    println!("bundles {bundles}, instructions {instructions}, AMP MACs {macs}");
    println!(
        "wall {wall:.3} s: {:.2} M bundles/s, {:.2} M instructions/s, {:.2} G MAC/s simulated, {} threads",
        bundles as f64 / wall / 1e6,
        instructions as f64 / wall / 1e6,
        macs as f64 / wall / 1e9,
        rayon::current_num_threads()
    );
}
