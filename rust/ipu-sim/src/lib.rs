//! The ipu21 chip simulator.
//!
//! A [`Chip`] holds up to 1472 tiles with 624 KiB of SRAM each at the
//! addresses of docs/machine-model.md. The host loads bytes
//! ([`Chip::write`]), sets supervisor entry points ([`Chip::set_entry`]) and
//! calls [`Chip::run`], which executes the encoded machine code of
//! `ipu-isa` until every tile exits or reaches a host sync.
//!
//! Invariants:
//! - Results come only from executing the machine code: the interpreter
//!   decodes each region-0 word once (a per-tile cache, invalidated by stores
//!   into code) and executes bundles; nothing computes a kernel result in Rust.
//! - Timing follows docs/isa.md and the machine model: six round-robin issue
//!   slots, one bundle per context per 6 cycles, AMP at exactly the model's MAC
//!   rates, 600-cycle syncs, exchange ports of 4 bytes per cycle, host link
//!   cycles from `ipu_arch::host_transfer_cycles`. No program can beat a ceiling.
//! - Tiles run in parallel (rayon) between syncs; each tile is a sequential,
//!   cycle-ordered interpreter, so results and counters are identical for any
//!   thread count.
//! - Faults are [`SimError`] values naming tile, context, pc, instruction,
//!   BSP step and symbol; user programs cannot make the simulator panic.

mod amp;
mod chip;
mod error;
mod exchange;
mod fpu;
mod tile;

pub use chip::{Chip, ChipConfig, StepKind, StepRecord, Stop, TileStep};
pub use error::{FaultKind, SimError};
pub use tile::{SymbolMap, SUPERVISOR};
