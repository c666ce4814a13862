//! Structured simulator faults.

use std::fmt;

/// What went wrong. Addresses are tile addresses; cycles of exchange faults
/// are relative to the start of the exchange phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The pc is outside region 0 (instructions are fetched only there) or not 4-aligned.
    BadFetch { pc: u32 },
    /// The word at pc is not an instruction or the bundle is invalid.
    IllegalInstruction { word: u32, reason: String },
    /// An access outside tile SRAM.
    OutOfRange { address: u32, bytes: u32 },
    /// An access not aligned to its size.
    Misaligned { address: u32, bytes: u32 },
    /// A 128-bit load (or a load of `ld2x64st64`) outside interleaved memory.
    NotInterleaved { address: u32 },
    /// A load and a store (or two loads) of one instruction hit the same memory element (bank).
    MemoryConflict { first: u32, second: u32 },
    /// An arithmetic-slot instruction issued by the supervisor.
    FloatInSupervisor,
    /// A supervisor-only instruction issued by a worker.
    SupervisorOnlyInWorker,
    /// A control instruction inside a hardware-loop body.
    ControlInLoopBody,
    /// The tile executed more bundles in one BSP phase than the configured limit.
    StepLimit { limit: u64 },
    /// An `amp` of another mode before `ampclr`.
    AmpModeMismatch { current: String, requested: String },
    /// `sync`/`hsync`/`exit` of the supervisor while workers are still running.
    WorkersStillRunning { running: Vec<u8> },
    /// An exchange instruction outside an exchange phase.
    NotInExchangePhase,
    /// An instruction that is not allowed between `sync` and `xend`.
    NotAllowedInExchangePhase,
    /// An exchange instruction or descriptor issued after its start cycle.
    LateExchange { start: u64, issued: u64 },
    /// An `xtab` stride prefix with runs of zero words, or one that no
    /// descriptor follows (`slot` is its table entry).
    BadStride { slot: u32, run: u32 },
    /// Tiles disagree on how the phase ends (some sync, some hsync or exit).
    SyncMismatch {
        this: &'static str,
        other_tile: u32,
        other: &'static str,
    },
    /// Two sends of one tile overlap in time.
    SendPortOverlap { first_start: u64, second_start: u64 },
    /// Two receives of one tile overlap in time.
    RecvPortOverlap { first_start: u64, second_start: u64 },
    /// A receive cycle in which the named source sends nothing.
    NoSourceWord { source: u32, cycle: u64 },
    /// A receive naming a tile that does not exist or is not running a program.
    BadSourceTile { source: u32 },
    /// A send or receive range outside SRAM or not 4-aligned.
    BadTransferRange { address: u32, words: u32 },
    /// A receive destination overlapping a send source of the same tile in one phase.
    ReceiveOverwritesSend { address: u32 },
}

/// A fault with its location: tile, context, pc, instruction text, BSP step
/// and, when a symbol map was supplied, the symbol at pc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    pub tile: u32,
    /// 0..5 workers, 6 supervisor; `None` for chip-level faults.
    pub context: Option<u8>,
    pub pc: Option<u32>,
    pub instruction: Option<String>,
    pub step: u64,
    pub symbol: Option<String>,
    pub kind: FaultKind,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use FaultKind::*;
        match self {
            BadFetch { pc } => write!(
                f,
                "instruction fetch from {pc:#x}: outside region 0 or misaligned"
            ),
            IllegalInstruction { word, reason } => {
                write!(f, "illegal instruction {word:#010x}: {reason}")
            }
            OutOfRange { address, bytes } => write!(
                f,
                "{bytes}-byte access at {address:#x} is outside tile SRAM"
            ),
            Misaligned { address, bytes } => {
                write!(f, "{bytes}-byte access at {address:#x} is misaligned")
            }
            NotInterleaved { address } => write!(
                f,
                "wide load at {address:#x} is outside interleaved memory (region 1)"
            ),
            MemoryConflict { first, second } => {
                write!(f, "accesses at {first:#x} and {second:#x} hit the same memory element in one cycle")
            }
            FloatInSupervisor => write!(f, "the supervisor does no floating point"),
            SupervisorOnlyInWorker => write!(f, "supervisor-only instruction in a worker"),
            ControlInLoopBody => write!(f, "control instruction inside a hardware-loop (rpt) body"),
            StepLimit { limit } => write!(
                f,
                "more than {limit} bundles in one BSP phase (a context never finishes?)"
            ),
            AmpModeMismatch { current, requested } => {
                write!(
                    f,
                    "{requested} while the AMP is in {current} mode (use ampclr first)"
                )
            }
            WorkersStillRunning { running } => write!(f, "workers {running:?} are still running"),
            NotInExchangePhase => write!(
                f,
                "exchange instruction outside an exchange phase (after sync, before xend)"
            ),
            NotAllowedInExchangePhase => write!(f, "instruction not allowed in the exchange phase"),
            LateExchange { start, issued } => {
                write!(
                    f,
                    "exchange issued at cycle {issued} after its start cycle {start}"
                )
            }
            BadStride { slot, run } => write!(
                f,
                "xtab entry {slot}: a stride prefix (runs of {run} words) needs runs of at least one word and a descriptor after it"
            ),
            SyncMismatch {
                this,
                other_tile,
                other,
            } => {
                write!(
                    f,
                    "this tile ended its phase with {this} but tile {other_tile} with {other}"
                )
            }
            SendPortOverlap {
                first_start,
                second_start,
            } => {
                write!(f, "sends starting at cycles {first_start} and {second_start} overlap on the send port")
            }
            RecvPortOverlap {
                first_start,
                second_start,
            } => {
                write!(f, "receives starting at cycles {first_start} and {second_start} overlap on the receive port")
            }
            NoSourceWord { source, cycle } => write!(
                f,
                "tile {source} sends nothing in cycle {cycle} of this receive"
            ),
            BadSourceTile { source } => write!(
                f,
                "receive names tile {source}, which is not an active tile"
            ),
            BadTransferRange { address, words } => {
                write!(
                    f,
                    "transfer of {words} words at {address:#x} is outside SRAM or not 4-aligned"
                )
            }
            ReceiveOverwritesSend { address } => {
                write!(f, "receive into {address:#x} overlaps a send source of this tile in the same phase")
            }
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tile {}", self.tile)?;
        match self.context {
            Some(6) => write!(f, ", supervisor")?,
            Some(w) => write!(f, ", worker {w}")?,
            None => {}
        }
        if let Some(pc) = self.pc {
            write!(f, ", pc {pc:#x}")?;
        }
        if let Some(s) = &self.symbol {
            write!(f, " <{s}>")?;
        }
        if let Some(i) = &self.instruction {
            write!(f, " `{i}`")?;
        }
        write!(f, ", BSP step {}: {}", self.step, self.kind)
    }
}

impl std::error::Error for SimError {}
