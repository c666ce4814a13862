//! The ipu21 machine model.
//!
//! Every number here is a contract shared by the simulator (which must never be
//! faster than the machine) and the compiler's cost model (which estimates the
//! same cycles). The project copy of the table lives in `docs/machine-model.md`;
//! the test `machine_model_doc_matches_constants` fails if the two drift apart.

/// Tiles on one ipu21 chip.
pub const TILES_PER_CHIP: u32 = 1472;
/// Tile clock of a C600 card, used only to convert cycles to seconds.
pub const CLOCK_HZ_C600: u64 = 1_500_000_000;
/// Tile clock of a Bow-2000.
pub const CLOCK_HZ_BOW2000: u64 = 1_850_000_000;

/// SRAM bytes per tile (624 KiB).
pub const TILE_SRAM_BYTES: u32 = 638_976;
/// First SRAM address of a tile.
pub const SRAM_BASE: u32 = 0x4C000;
/// One past the last SRAM address of a tile.
pub const SRAM_END: u32 = 0xE8000;
/// Region 0 (standard memory): instructions may only be fetched from here.
pub const REGION0_BASE: u32 = 0x4C000;
/// End of region 0, which is also the start of region 1.
pub const REGION0_END: u32 = 0x80000;
/// Region 1 (interleaved memory): 128-bit loads are legal only here.
pub const REGION1_BASE: u32 = 0x80000;
/// End of region 1.
pub const REGION1_END: u32 = 0xE8000;
/// Bytes in one memory element of standard memory.
pub const STANDARD_ELEMENT_BYTES: u32 = 16 * 1024;
/// Bytes in one memory element of interleaved memory (two banks of 16 KiB).
pub const INTERLEAVED_ELEMENT_BYTES: u32 = 2 * 16 * 1024;

/// Worker contexts per tile (the supervisor is a seventh context).
pub const WORKER_CONTEXTS: u32 = 6;
/// Issue slots that the contexts share round-robin.
pub const ISSUE_SLOTS: u32 = 6;
/// Cycles between two bundles of one context: a context issues at most once per round.
pub const CONTEXT_ISSUE_INTERVAL: u32 = 6;

/// `kind` of an `xtab` send descriptor (docs/isa.md, section 6).
pub const XTAB_SEND_KIND: u32 = u32::MAX;
/// `kind` of an `xtab` stride prefix: the next descriptor moves runs of
/// `run` words, each `bytes` after the previous run's start.
pub const XTAB_STRIDE_KIND: u32 = u32::MAX - 1;

/// Bytes a load may move from standard memory in one instruction.
pub const LOAD_BYTES_STANDARD: u32 = 8;
/// Bytes a load may move from interleaved memory in one instruction.
pub const LOAD_BYTES_INTERLEAVED: u32 = 16;
/// Bytes a store may move in one instruction.
pub const STORE_BYTES: u32 = 8;

/// f16 lanes of one non-AMP vector instruction (64-bit data path).
pub const VECTOR_F16_LANES: u32 = 4;
/// f32 lanes of one non-AMP vector instruction.
pub const VECTOR_F32_LANES: u32 = 2;

/// AMP multiply-accumulates per tile cycle, f16 inputs and f16 accumulation.
pub const AMP_MACS_F16_F16: u32 = 64;
/// AMP multiply-accumulates per tile cycle, f16 inputs and f32 accumulation.
pub const AMP_MACS_F16_F32: u32 = 32;
/// AMP multiply-accumulates per tile cycle, f32 inputs.
pub const AMP_MACS_F32: u32 = 16;
/// AMP multiply-accumulates per tile cycle, fp8 (F143) inputs and f16 accumulation.
pub const AMP_MACS_FP8_F16: u32 = 128;
/// AMP accumulator registers per context.
pub const AMP_ACCUMULATORS: u32 = 16;

/// Bytes a tile may send into the exchange per cycle.
pub const EXCHANGE_SEND_BYTES_PER_CYCLE: u32 = 4;
/// Bytes a tile may receive from the exchange per cycle.
pub const EXCHANGE_RECV_BYTES_PER_CYCLE: u32 = 4;
/// Bytes a tile may send per cycle on the paired bus while its partner sends nothing.
pub const EXCHANGE_PAIRED_SEND_BYTES_PER_CYCLE: u32 = 8;

/// Cycles of one global BSP sync; every exchange phase is preceded by one.
pub const SYNC_CYCLES: u64 = 600;
/// Supervisor cycles to launch one vertex (worker) call.
pub const VERTEX_LAUNCH_CYCLES: u64 = 11;
/// Effective host link bandwidth each way, bytes per second.
pub const HOST_LINK_BYTES_PER_SECOND: u64 = 32_000_000_000;

/// Peak f16 FLOP of the whole chip per cycle: 1472 tiles x 64 MAC x 2.
pub const CHIP_F16_FLOP_PER_CYCLE: u64 = TILES_PER_CHIP as u64 * AMP_MACS_F16_F16 as u64 * 2;

/// Memory region of an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    /// Region 0: standard memory, the only place instructions are fetched from.
    Standard,
    /// Region 1: interleaved memory, the only place 128-bit loads may read.
    Interleaved,
}

impl Region {
    /// The region holding `address`, or `None` when it lies outside tile SRAM.
    pub fn of(address: u32) -> Option<Region> {
        match address {
            REGION0_BASE..REGION0_END => Some(Region::Standard),
            REGION1_BASE..REGION1_END => Some(Region::Interleaved),
            _ => None,
        }
    }

    /// The half-open address range of the region.
    pub fn range(self) -> std::ops::Range<u32> {
        match self {
            Region::Standard => REGION0_BASE..REGION0_END,
            Region::Interleaved => REGION1_BASE..REGION1_END,
        }
    }

    /// Bytes in one memory element of this region.
    pub fn element_bytes(self) -> u32 {
        match self {
            Region::Standard => STANDARD_ELEMENT_BYTES,
            Region::Interleaved => INTERLEAVED_ELEMENT_BYTES,
        }
    }

    /// The memory element index of an address within its region; a load and a
    /// store in one cycle must hit different elements.
    pub fn element_of(address: u32) -> Option<(Region, u32)> {
        let region = Region::of(address)?;
        Some((
            region,
            (address - region.range().start) / region.element_bytes(),
        ))
    }
}

/// Host exchange cycles to move `bytes` over the host link at `clock_hz`.
pub fn host_transfer_cycles(bytes: u64, clock_hz: u64) -> u64 {
    // cycles = bytes / (link_bytes_per_second / clock_hz), rounded up so that the
    // model is never faster than the link.
    (bytes * clock_hz).div_ceil(HOST_LINK_BYTES_PER_SECOND)
}

/// Exchange cycles for one transfer of `bytes` through a 4 B/cycle port.
pub fn exchange_transfer_cycles(bytes: u64) -> u64 {
    bytes.div_ceil(EXCHANGE_SEND_BYTES_PER_CYCLE as u64)
}

/// The compute lower bound of a program with `flop` useful floating-point
/// operations: no chip does more than [`CHIP_F16_FLOP_PER_CYCLE`] per cycle.
pub fn compute_bound_cycles(flop: u64, tiles: u32) -> u64 {
    let per_cycle = tiles as u64 * AMP_MACS_F16_F16 as u64 * 2;
    flop.div_ceil(per_cycle)
}

/// The compute lower bound of a program whose f16 products run partly at
/// the f16-accumulation rate ([`AMP_MACS_F16_F16`] a tile cycle) and
/// partly at the f32-accumulation rate ([`AMP_MACS_F16_F32`]): products a
/// result's precision keeps in f32 accumulation cannot run at the f16
/// peak, so this floor, not [`compute_bound_cycles`], is what such a
/// program can approach.
pub fn mixed_accumulation_bound_cycles(f16_acc_macs: u64, f32_acc_macs: u64, tiles: u32) -> u64 {
    let tiles = tiles as u64;
    f16_acc_macs.div_ceil(tiles * AMP_MACS_F16_F16 as u64)
        + f32_acc_macs.div_ceil(tiles * AMP_MACS_F16_F32 as u64)
}

/// A lower bound on the cycles of any BSP program that computes the f16
/// GEMM `[m, k] x [k, n]` on `tiles` tiles at the f16 AMP peak, with f16
/// operands and f16 partial sums (2 bytes each), when the operands' and the
/// result's homes are spread evenly over the tiles.
///
/// Why: under BSP a tile computes or exchanges, never both, so a tile's
/// cycles are at least its products at 64 a cycle plus what it receives at
/// 4 bytes a cycle. A tile whose products are the set V of (i, j, k) needs
/// the elements of A, B and of partial sums of C that V projects onto; by
/// the Loomis-Whitney inequality |V|^2 <= |A_V| |B_V| |C_V|, so it touches
/// at least 3 |V|^(2/3) of them. It receives all of them but those homed on
/// it (each element of A, B and C is homed once; a partial sum it computes
/// for an output homed elsewhere is received by that output's home, which
/// counts it in the same sum). With the products evenly spread (the bound
/// only grows when a tile does more) every tile receives at least
/// `3 V^(2/3) - (mk + kn + mn) / tiles` elements with `V = mkn / tiles`.
pub fn gemm_bsp_bound_cycles(m: u64, k: u64, n: u64, tiles: u32) -> u64 {
    let v = (m * k * n) as f64 / tiles as f64;
    let homes = (m * k + k * n + m * n) as f64 / tiles as f64;
    let received = (3.0 * v.powf(2.0 / 3.0) - homes).max(0.0) * 2.0;
    let compute = v / AMP_MACS_F16_F16 as f64;
    (compute + received / EXCHANGE_RECV_BYTES_PER_CYCLE as f64).floor() as u64
}

/// Calibration formulas measured on C600 hardware by the existing stack. The
/// simulator's kernels may beat them, but never past the ceilings above.
pub mod calibration {
    /// Interleaved f16 GEMM on one tile: M rows, K inner, C output columns.
    pub fn gemm_f16_cycles(m: u64, k: u64, c: u64) -> u64 {
        294 + k.div_ceil(16) * c.div_ceil(16) * (4 * m + 160)
    }

    /// f16 reduction of `partials` partials of `n` elements.
    pub fn reduce_f16_cycles(partials: u64, n: u64) -> u64 {
        282 + 6 * n.div_ceil(48) * (9 + 6 * (partials.max(1) - 1))
    }

    /// GELU on `n` f16 elements.
    pub fn gelu_f16_cycles(n: u64) -> u64 {
        300 + 558 * n.div_ceil(96)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_accumulation_bound_runs_f32_accumulated_products_at_half_rate() {
        // SigLIP attention: the projections at the f16 peak (30,809
        // cycles), the attention's S and P V at the f32-accumulation rate
        // (25,995): 56,804, where the f16 peak alone gives 43,806.
        let f16 = 3 * 729 * 1152 * 1152;
        let f32 = 2 * 16 * 729 * 729 * 72;
        assert_eq!(
            mixed_accumulation_bound_cycles(f16, f32, TILES_PER_CHIP),
            30_809 + 25_995
        );
        assert_eq!(
            mixed_accumulation_bound_cycles(f16 + f32, 0, TILES_PER_CHIP),
            compute_bound_cycles(2 * (f16 + f32), TILES_PER_CHIP)
        );
    }

    #[test]
    fn gemm_bsp_bound_adds_the_receive_bound_to_the_compute_bound() {
        // 4096^3 on the chip: 729,444 cycles of products and 177,382 of
        // receiving (3 V^(2/3) = 388,958 elements, 34,193 of them homed):
        // 906,826 cycles, 80.4% of the f16 peak.
        let b = gemm_bsp_bound_cycles(4096, 4096, 4096, TILES_PER_CHIP);
        assert_eq!(b, 906_826);
        let flop = 2 * 4096u64.pow(3);
        assert!(b > compute_bound_cycles(flop, TILES_PER_CHIP));
        // One tile homes everything and receives nothing.
        assert_eq!(gemm_bsp_bound_cycles(64, 64, 64, 1), 64 * 64 * 64 / 64);
    }

    /// Reads the project's copy of the machine-model table and checks that each
    /// row names the value that the code uses.
    #[test]
    fn machine_model_doc_matches_constants() {
        let dir = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
        let path = std::path::Path::new(&dir).join("../../docs/machine-model.md");
        let doc = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let row = |key: &str| -> String {
            let cell = doc
                .lines()
                .find(|l| l.starts_with(&format!("| {key} |")))
                .unwrap_or_else(|| panic!("{}: no row '{key}'", path.display()))
                .split('|')
                .nth(2)
                .unwrap()
                .trim()
                .to_string();
            strip_thousands_separators(&cell)
        };
        let expect = [
            ("tiles per chip", format!("{TILES_PER_CHIP}")),
            ("SRAM per tile", format!("{TILE_SRAM_BYTES} B (624 KiB), addresses 0x{SRAM_BASE:X} up to 0x{SRAM_END:X}")),
            ("memory regions", format!("region 0 (standard): 0x{REGION0_BASE:X} to 0x{REGION0_END:X}; region 1 (interleaved): 0x{REGION1_BASE:X} to 0x{REGION1_END:X}")),
            ("threads", format!("1 supervisor + {WORKER_CONTEXTS} worker contexts")),
            ("issue model", format!("{ISSUE_SLOTS} issue slots, round-robin; a context issues at most one bundle every {CONTEXT_ISSUE_INTERVAL} cycles")),
            ("load width", format!("{} bits anywhere; {} bits only from interleaved memory", LOAD_BYTES_STANDARD * 8, LOAD_BYTES_INTERLEAVED * 8)),
            ("store width", format!("{} bits", STORE_BYTES * 8)),
            ("vector arithmetic (non-AMP)", format!("64-bit data path: f16 x {VECTOR_F16_LANES} or f32 x {VECTOR_F32_LANES} lanes per instruction")),
            ("AMP, f16 in / f16 accumulate", format!("{AMP_MACS_F16_F16} MAC per tile cycle (128 FLOP)")),
            ("AMP, f16 in / f32 accumulate", format!("{AMP_MACS_F16_F32} MAC per tile cycle")),
            ("AMP, f32", format!("{AMP_MACS_F32} MAC per tile cycle")),
            ("AMP, fp8 (F143) in / f16 accumulate", format!("{AMP_MACS_FP8_F16} MAC per tile cycle")),
            ("AMP accumulator state", format!("{AMP_ACCUMULATORS} accumulator registers per context")),
            ("exchange, per tile", format!("send at most {EXCHANGE_SEND_BYTES_PER_CYCLE} B/cycle and receive at most {EXCHANGE_RECV_BYTES_PER_CYCLE} B/cycle")),
            ("BSP sync", format!("{SYNC_CYCLES} cycles per global sync")),
            ("supervisor kernel launch", format!("{VERTEX_LAUNCH_CYCLES} cycles per vertex call")),
            ("host link", format!("{} GB/s each way (PCIe Gen4 x16, effective)", HOST_LINK_BYTES_PER_SECOND / 1_000_000_000)),
        ];
        for (key, value) in expect {
            assert_eq!(
                row(key),
                value,
                "docs/machine-model.md row '{key}' drifted from ipu-arch"
            );
        }
    }

    /// "638,976" and "638976" are the same number; separators are for readers.
    fn strip_thousands_separators(text: &str) -> String {
        let chars: Vec<char> = text.chars().collect();
        let mut out = String::with_capacity(text.len());
        for (i, &c) in chars.iter().enumerate() {
            let between_digits = i > 0
                && i + 1 < chars.len()
                && chars[i - 1].is_ascii_digit()
                && chars[i + 1].is_ascii_digit();
            if !(c == ',' && between_digits) {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn regions_partition_sram() {
        assert_eq!(SRAM_END - SRAM_BASE, TILE_SRAM_BYTES);
        assert_eq!(Region::of(SRAM_BASE), Some(Region::Standard));
        assert_eq!(Region::of(REGION0_END - 1), Some(Region::Standard));
        assert_eq!(Region::of(REGION1_BASE), Some(Region::Interleaved));
        assert_eq!(Region::of(SRAM_END), None);
        assert_eq!(Region::of(SRAM_BASE - 1), None);
        assert_eq!(
            Region::element_of(0x4C000 + 16 * 1024),
            Some((Region::Standard, 1))
        );
    }

    #[test]
    fn peak_and_bounds() {
        assert_eq!(CHIP_F16_FLOP_PER_CYCLE, 188_416);
        // The SigLIP attention bound quoted in the anchors: 8.25 GFLOP is about 43,800 cycles.
        let flop = 3 * 2 * 729 * 1152 * 1152 + 2 * 2 * 16 * 729 * 729 * 72;
        let bound = compute_bound_cycles(flop, TILES_PER_CHIP);
        assert!((43_700..43_900).contains(&bound), "{bound}");
        assert_eq!(host_transfer_cycles(32_000, 1_500_000_000), 1_500);
        assert_eq!(exchange_transfer_cycles(9), 3);
        assert_eq!(calibration::gemm_f16_cycles(4, 16, 16), 294 + 176);
    }
}
