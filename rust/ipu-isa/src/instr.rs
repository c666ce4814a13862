//! The instruction and bundle types, their slot classes, register usage and
//! issue costs.

use crate::reg::{AReg, MReg, Reg};
use crate::IsaError;

/// Integer ALU operations (`$m` registers, memory/control/integer slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AluOp {
    Add,
    Sub,
    Mul,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Sar,
    CmpEq,
    CmpNe,
    CmpUlt,
    CmpSlt,
    MinS,
    MaxS,
}

impl AluOp {
    pub const ALL: [AluOp; 15] = [
        AluOp::Add,
        AluOp::Sub,
        AluOp::Mul,
        AluOp::And,
        AluOp::Or,
        AluOp::Xor,
        AluOp::Shl,
        AluOp::Shr,
        AluOp::Sar,
        AluOp::CmpEq,
        AluOp::CmpNe,
        AluOp::CmpUlt,
        AluOp::CmpSlt,
        AluOp::MinS,
        AluOp::MaxS,
    ];
    pub fn mnemonic(self) -> &'static str {
        match self {
            AluOp::Add => "add",
            AluOp::Sub => "sub",
            AluOp::Mul => "mul",
            AluOp::And => "and",
            AluOp::Or => "or",
            AluOp::Xor => "xor",
            AluOp::Shl => "shl",
            AluOp::Shr => "shr",
            AluOp::Sar => "sar",
            AluOp::CmpEq => "cmpeq",
            AluOp::CmpNe => "cmpne",
            AluOp::CmpUlt => "cmpult",
            AluOp::CmpSlt => "cmpslt",
            AluOp::MinS => "min",
            AluOp::MaxS => "max",
        }
    }
    /// Whether the 12-bit immediate form zero-extends (logical operations,
    /// shifts and the unsigned compare) rather than sign-extends.
    pub fn imm_zero_extended(self) -> bool {
        matches!(
            self,
            AluOp::And
                | AluOp::Or
                | AluOp::Xor
                | AluOp::Shl
                | AluOp::Shr
                | AluOp::Sar
                | AluOp::CmpUlt
        )
    }
    /// The legal range of the immediate form.
    pub fn imm_range(self) -> std::ops::RangeInclusive<i32> {
        if self.imm_zero_extended() {
            0..=4095
        } else {
            -2048..=2047
        }
    }
    /// The operation on 32-bit values; shifts use the low five bits of `b`.
    pub fn eval(self, a: u32, b: u32) -> u32 {
        match self {
            AluOp::Add => a.wrapping_add(b),
            AluOp::Sub => a.wrapping_sub(b),
            AluOp::Mul => a.wrapping_mul(b),
            AluOp::And => a & b,
            AluOp::Or => a | b,
            AluOp::Xor => a ^ b,
            AluOp::Shl => a << (b & 31),
            AluOp::Shr => a >> (b & 31),
            AluOp::Sar => ((a as i32) >> (b & 31)) as u32,
            AluOp::CmpEq => (a == b) as u32,
            AluOp::CmpNe => (a != b) as u32,
            AluOp::CmpUlt => (a < b) as u32,
            AluOp::CmpSlt => ((a as i32) < (b as i32)) as u32,
            AluOp::MinS => (a as i32).min(b as i32) as u32,
            AluOp::MaxS => (a as i32).max(b as i32) as u32,
        }
    }
}

/// Float operations shared by the `f16v4` (pairs, four f16 lanes), `f32v2`
/// (pairs, two f32 lanes) and `f32` (single register) families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FloatOp {
    Add,
    Sub,
    Mul,
    Max,
    Min,
    CmpEq,
    CmpLt,
    CmpLe,
    /// `d += a * b`, rounded once.
    Mac,
    Abs,
    Neg,
    Exp,
    Recip,
    Rsqrt,
    Tanh,
    Sqrt,
}

impl FloatOp {
    pub const ALL: [FloatOp; 16] = [
        FloatOp::Add,
        FloatOp::Sub,
        FloatOp::Mul,
        FloatOp::Max,
        FloatOp::Min,
        FloatOp::CmpEq,
        FloatOp::CmpLt,
        FloatOp::CmpLe,
        FloatOp::Mac,
        FloatOp::Abs,
        FloatOp::Neg,
        FloatOp::Exp,
        FloatOp::Recip,
        FloatOp::Rsqrt,
        FloatOp::Tanh,
        FloatOp::Sqrt,
    ];
    pub fn suffix(self) -> &'static str {
        match self {
            FloatOp::Add => "add",
            FloatOp::Sub => "sub",
            FloatOp::Mul => "mul",
            FloatOp::Max => "max",
            FloatOp::Min => "min",
            FloatOp::CmpEq => "cmpeq",
            FloatOp::CmpLt => "cmplt",
            FloatOp::CmpLe => "cmple",
            FloatOp::Mac => "mac",
            FloatOp::Abs => "abs",
            FloatOp::Neg => "neg",
            FloatOp::Exp => "exp",
            FloatOp::Recip => "recip",
            FloatOp::Rsqrt => "rsqrt",
            FloatOp::Tanh => "tanh",
            FloatOp::Sqrt => "sqrt",
        }
    }
    /// Unary operations take one source (`d, a`); the others two (`d, a, b`).
    pub fn is_unary(self) -> bool {
        matches!(
            self,
            FloatOp::Abs
                | FloatOp::Neg
                | FloatOp::Exp
                | FloatOp::Recip
                | FloatOp::Rsqrt
                | FloatOp::Tanh
                | FloatOp::Sqrt
        )
    }
    /// Transcendental operations run at half rate on vectors.
    pub fn is_transcendental(self) -> bool {
        matches!(
            self,
            FloatOp::Exp | FloatOp::Recip | FloatOp::Rsqrt | FloatOp::Tanh | FloatOp::Sqrt
        )
    }
}

/// Element type of a float instruction family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FloatType {
    /// Four f16 lanes in a register pair.
    F16v4,
    /// Two f32 lanes in a register pair.
    F32v2,
    /// One f32 in a single register.
    F32,
}

impl FloatType {
    pub fn prefix(self) -> &'static str {
        match self {
            FloatType::F16v4 => "f16v4",
            FloatType::F32v2 => "f32v2",
            FloatType::F32 => "f32",
        }
    }
    /// Registers per operand.
    pub fn width(self) -> u8 {
        match self {
            FloatType::F32 => 1,
            _ => 2,
        }
    }
}

/// Horizontal reductions of a pair to one f32 in a single register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HredOp {
    F16v4Sum,
    F16v4Max,
    F32v2Sum,
    F32v2Max,
}

impl HredOp {
    pub const ALL: [HredOp; 4] = [
        HredOp::F16v4Sum,
        HredOp::F16v4Max,
        HredOp::F32v2Sum,
        HredOp::F32v2Max,
    ];
    pub fn mnemonic(self) -> &'static str {
        match self {
            HredOp::F16v4Sum => "f16v4hsum",
            HredOp::F16v4Max => "f16v4hmax",
            HredOp::F32v2Sum => "f32v2hsum",
            HredOp::F32v2Max => "f32v2hmax",
        }
    }
}

/// Conversions. The fp8 format is F143 (see [`crate::numerics`]); the fp8
/// conversions carry a power-of-two scale exponent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CvtOp {
    /// Pair of f32 to two f16 in one register, round to nearest even.
    F32v2ToF16,
    /// As `F32v2ToF16` with stochastic rounding.
    F32v2ToF16Sr,
    /// Two f16 (one register) to a pair of f32, exact.
    F16v2ToF32,
    /// Four f16 (pair) to four fp8 (one register): fp8 = rne(x * 2^-scale).
    F16v4ToF8,
    /// As `F16v4ToF8` with stochastic rounding.
    F16v4ToF8Sr,
    /// Four fp8 (one register) to four f16 (pair): x = fp8 * 2^scale.
    F8v4ToF16,
    /// f32 to signed 32-bit integer, round to nearest even, saturating, NaN to 0.
    F32ToI32,
    /// Signed 32-bit integer to f32, round to nearest even.
    I32ToF32,
    /// Quad of f32 to four f16 in a pair (lane i from register i), round
    /// to nearest even: as two `F32v2ToF16` in one issue slot, as in the
    /// hardware's ISA (poplibs' popops codelets issue it beside a load in
    /// their pipelined cast loops).
    F32v4ToF16,
}

impl CvtOp {
    pub const ALL: [CvtOp; 9] = [
        CvtOp::F32v2ToF16,
        CvtOp::F32v2ToF16Sr,
        CvtOp::F16v2ToF32,
        CvtOp::F16v4ToF8,
        CvtOp::F16v4ToF8Sr,
        CvtOp::F8v4ToF16,
        CvtOp::F32ToI32,
        CvtOp::I32ToF32,
        CvtOp::F32v4ToF16,
    ];
    pub fn mnemonic(self) -> &'static str {
        match self {
            CvtOp::F32v2ToF16 => "f32v2tof16",
            CvtOp::F32v2ToF16Sr => "f32v2tof16sr",
            CvtOp::F16v2ToF32 => "f16v2tof32",
            CvtOp::F16v4ToF8 => "f16v4tof8",
            CvtOp::F16v4ToF8Sr => "f16v4tof8sr",
            CvtOp::F8v4ToF16 => "f8v4tof16",
            CvtOp::F32ToI32 => "f32toi32",
            CvtOp::I32ToF32 => "i32tof32",
            CvtOp::F32v4ToF16 => "f32v4tof16",
        }
    }
    /// (destination width, source width) in registers.
    pub fn widths(self) -> (u8, u8) {
        match self {
            CvtOp::F32v2ToF16 | CvtOp::F32v2ToF16Sr => (1, 2),
            CvtOp::F16v2ToF32 => (2, 1),
            CvtOp::F16v4ToF8 | CvtOp::F16v4ToF8Sr => (1, 2),
            CvtOp::F8v4ToF16 => (2, 1),
            CvtOp::F32ToI32 | CvtOp::I32ToF32 => (1, 1),
            CvtOp::F32v4ToF16 => (2, 4),
        }
    }
    /// Whether the instruction carries a scale exponent operand.
    pub fn has_scale(self) -> bool {
        matches!(
            self,
            CvtOp::F16v4ToF8 | CvtOp::F16v4ToF8Sr | CvtOp::F8v4ToF16
        )
    }
}

/// Lane shuffles on float registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ShufOp {
    /// `d:d+1` = four copies of the low f16 of `a`.
    F16v4Bcast,
    /// `d:d+1` = two copies of `a`.
    F32v2Bcast,
    /// `d` = low half of `a` | low half of `b` << 16.
    Pack16Lo,
    /// `d` = high half of `a` | high half of `b` << 16.
    Pack16Hi,
    /// `d` = `a` (32-bit move).
    Mov,
    /// `d:d+1` = `a:a+1` (64-bit move).
    Mov64,
}

impl ShufOp {
    pub const ALL: [ShufOp; 6] = [
        ShufOp::F16v4Bcast,
        ShufOp::F32v2Bcast,
        ShufOp::Pack16Lo,
        ShufOp::Pack16Hi,
        ShufOp::Mov,
        ShufOp::Mov64,
    ];
    pub fn mnemonic(self) -> &'static str {
        match self {
            ShufOp::F16v4Bcast => "f16v4bcast",
            ShufOp::F32v2Bcast => "f32v2bcast",
            ShufOp::Pack16Lo => "pack16lo",
            ShufOp::Pack16Hi => "pack16hi",
            ShufOp::Mov => "mov",
            ShufOp::Mov64 => "mov64",
        }
    }
    /// (destination width, source width, has a second source).
    pub fn shape(self) -> (u8, u8, bool) {
        match self {
            ShufOp::F16v4Bcast | ShufOp::F32v2Bcast => (2, 1, false),
            ShufOp::Pack16Lo | ShufOp::Pack16Hi => (1, 1, true),
            ShufOp::Mov => (1, 1, false),
            ShufOp::Mov64 => (2, 2, false),
        }
    }
}

/// The AMP (accumulating matrix product) modes. See docs/isa.md for the
/// phase rules; every mode is exactly at the machine model's MAC rate when
/// six workers each issue one AMP instruction per round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AmpMode {
    /// f16 inputs and weights, f16 accumulation: 64 MAC per instruction.
    F16,
    /// fp8 (F143) inputs and weights, f16 accumulation: 128 MAC per instruction.
    F8,
    /// f16 inputs and weights, f32 accumulation: 32 MAC per instruction.
    F16F32,
    /// f32 inputs and weights, f32 accumulation: 16 MAC per instruction.
    F32,
}

impl AmpMode {
    pub const ALL: [AmpMode; 4] = [AmpMode::F16, AmpMode::F8, AmpMode::F16F32, AmpMode::F32];
    pub fn mnemonic(self) -> &'static str {
        match self {
            AmpMode::F16 => "ampf16",
            AmpMode::F8 => "ampf8",
            AmpMode::F16F32 => "ampf16f32",
            AmpMode::F32 => "ampf32",
        }
    }
    /// Rows of the weight block (the contraction depth of one pass).
    pub fn k_rows(self) -> usize {
        match self {
            AmpMode::F8 => 32,
            _ => 16,
        }
    }
    /// Output columns of the weight block.
    pub const COLUMNS: usize = 16;
    /// Phases per input row.
    pub fn phases(self) -> usize {
        match self {
            AmpMode::F16 | AmpMode::F8 => 4,
            AmpMode::F16F32 => 8,
            AmpMode::F32 => 16,
        }
    }
    /// Weight rows consumed per instruction.
    pub fn rows_per_phase(self) -> usize {
        self.k_rows() / self.phases()
    }
    /// Output lanes emitted (and partial sums taken) per instruction.
    pub fn lanes_per_phase(self) -> usize {
        Self::COLUMNS / self.phases()
    }
    /// Multiply-accumulates per instruction.
    pub fn macs(self) -> u32 {
        (self.rows_per_phase() * Self::COLUMNS) as u32
    }
    /// Bytes of one weight element.
    pub fn weight_bytes(self) -> usize {
        match self {
            AmpMode::F8 => 1,
            AmpMode::F16 | AmpMode::F16F32 => 2,
            AmpMode::F32 => 4,
        }
    }
    /// Bytes of the whole weight block.
    pub fn weight_block_bytes(self) -> usize {
        self.k_rows() * Self::COLUMNS * self.weight_bytes()
    }
    /// Register widths of (destination, x input, partial sums).
    pub fn widths(self) -> (u8, u8, u8) {
        match self {
            AmpMode::F16 | AmpMode::F8 => (2, 2, 2),
            AmpMode::F16F32 => (2, 1, 2),
            AmpMode::F32 => (1, 1, 1),
        }
    }
}

/// Bytes of the AMP weight store of one context (the largest block, f32).
pub const AMP_WEIGHT_STORE_BYTES: usize = 1024;

/// Addressing mode of a load or store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddrMode {
    /// `[$mB+imm]`: address = base + imm (imm is a signed 14-bit byte offset).
    Offset(i32),
    /// `[$mB]+=imm`: address = base, then base += imm.
    PostInc(i32),
    /// `[$mB+$mI]`: address = base + index.
    Indexed(MReg),
    /// `[$mB]+=$mI`: address = base, then base += index.
    PostIncReg(MReg),
}

/// Range of the immediate in `Offset` and `PostInc` addressing.
pub const MEM_IMM_RANGE: std::ops::RangeInclusive<i32> = -8192..=8191;

/// A memory operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    pub base: MReg,
    pub mode: AddrMode,
}

/// Loads: the destination register class and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoadKind {
    /// `ld32 $mD`: 4 bytes into an integer register.
    M32,
    /// `ld16 $aD`: 2 bytes, zero-extended into a float register.
    A16,
    /// `ld32 $aD`.
    A32,
    /// `ld64 $aD:D+1`.
    A64,
    /// `ld128 $aD:D+3`: only from interleaved memory.
    A128,
}

impl LoadKind {
    pub fn bytes(self) -> u32 {
        match self {
            LoadKind::A16 => 2,
            LoadKind::M32 | LoadKind::A32 => 4,
            LoadKind::A64 => 8,
            LoadKind::A128 => 16,
        }
    }
    pub fn mnemonic(self) -> &'static str {
        match self {
            LoadKind::A16 => "ld16",
            LoadKind::M32 | LoadKind::A32 => "ld32",
            LoadKind::A64 => "ld64",
            LoadKind::A128 => "ld128",
        }
    }
}

/// Stores: the source register class and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreKind {
    M32,
    A16,
    A32,
    A64,
}

impl StoreKind {
    pub fn bytes(self) -> u32 {
        match self {
            StoreKind::A16 => 2,
            StoreKind::M32 | StoreKind::A32 => 4,
            StoreKind::A64 => 8,
        }
    }
    pub fn mnemonic(self) -> &'static str {
        match self {
            StoreKind::A16 => "st16",
            StoreKind::M32 | StoreKind::A32 => "st32",
            StoreKind::A64 => "st64",
        }
    }
}

/// Combined load-and-store instructions for streaming kernels. The address
/// registers are consecutive from `base`; `pace` holds a 2-bit increment code
/// per address register (bits 0-1 for `base`, 2-3 for `base+1`, 4-5 for
/// `base+2`): 0 = natural width, 1 = signed low 16 bits of `stride`, 2 =
/// signed high 16 bits of `stride`, 3 = no increment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LdStKind {
    /// Load 64 bits from `[base]` into `d` (pair), store pair `s` to `[base+1]`.
    Ld64St64,
    /// Load 128 bits from interleaved `[base]` into `d` (quad), store pair `s` to `[base+1]`.
    Ld128St64,
    /// Load 64 bits from interleaved `[base]` into `d` low pair and 64 bits
    /// from interleaved `[base+1]` into `d` high pair, store pair `s` to `[base+2]`.
    Ld2x64St64,
}

impl LdStKind {
    pub const ALL: [LdStKind; 3] = [
        LdStKind::Ld64St64,
        LdStKind::Ld128St64,
        LdStKind::Ld2x64St64,
    ];
    pub fn mnemonic(self) -> &'static str {
        match self {
            LdStKind::Ld64St64 => "ld64st64",
            LdStKind::Ld128St64 => "ld128st64",
            LdStKind::Ld2x64St64 => "ld2x64st64",
        }
    }
    /// Address registers used (consecutive from the base).
    pub fn address_registers(self) -> u8 {
        match self {
            LdStKind::Ld2x64St64 => 3,
            _ => 2,
        }
    }
    /// Width in registers of the load destination.
    pub fn dest_width(self) -> u8 {
        match self {
            LdStKind::Ld64St64 => 2,
            _ => 4,
        }
    }
}

/// Special registers readable with `get`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SpecialReg {
    /// The tile number.
    TileId,
    /// 0..5 for workers, 6 for the supervisor.
    ContextId,
    /// Low 32 bits of the tile cycle counter at issue.
    CycleLo,
    /// High 32 bits of the tile cycle counter at issue.
    CycleHi,
    /// Number of BSP syncs this tile has completed.
    BspStep,
}

impl SpecialReg {
    pub const ALL: [SpecialReg; 5] = [
        SpecialReg::TileId,
        SpecialReg::ContextId,
        SpecialReg::CycleLo,
        SpecialReg::CycleHi,
        SpecialReg::BspStep,
    ];
    pub fn name(self) -> &'static str {
        match self {
            SpecialReg::TileId => "tile_id",
            SpecialReg::ContextId => "context_id",
            SpecialReg::CycleLo => "cycle_lo",
            SpecialReg::CycleHi => "cycle_hi",
            SpecialReg::BspStep => "bsp_step",
        }
    }
}

/// One ipu21 instruction. Immediates hold their decoded values; every
/// instruction produced by [`crate::decode_word`] or accepted by
/// [`Instruction::validate`] encodes losslessly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Instruction {
    /// No operation (either slot).
    Nop,
    // ---- integer (memory/control/integer slot) ----
    Alu {
        op: AluOp,
        d: MReg,
        a: MReg,
        b: MReg,
    },
    AluImm {
        op: AluOp,
        d: MReg,
        a: MReg,
        imm: i32,
    },
    /// `setzi d, imm20`: d = imm (zero-extended 20 bits).
    Setzi {
        d: Reg,
        imm: u32,
    },
    /// `sethi d, imm20`: d = imm << 12.
    Sethi {
        d: Reg,
        imm: u32,
    },
    /// `mov $aD, $mA`: copy integer bits into a float register.
    MovToA {
        d: AReg,
        a: MReg,
    },
    /// `mov $mD, $aA`: copy float bits into an integer register.
    MovToM {
        d: MReg,
        a: AReg,
    },
    /// `get $mD, name`.
    Get {
        d: MReg,
        sreg: SpecialReg,
    },
    /// `setseed $mA, $mB`: the context's PRNG state = a | b << 32 (zero becomes a fixed non-zero constant).
    SetSeed {
        a: MReg,
        b: MReg,
    },
    // ---- memory ----
    Load {
        kind: LoadKind,
        d: Reg,
        addr: Addr,
    },
    Store {
        kind: StoreKind,
        s: Reg,
        addr: Addr,
    },
    LdSt {
        kind: LdStKind,
        d: AReg,
        s: AReg,
        base: MReg,
        stride: MReg,
        pace: u8,
    },
    // ---- control ----
    /// `br $mA`: jump to the address in a register.
    Br {
        a: MReg,
    },
    /// `br target`: pc-relative jump; `offset` is in bytes from this instruction.
    BrRel {
        offset: i32,
    },
    /// `brz $mA, target`.
    Brz {
        a: MReg,
        offset: i32,
    },
    /// `brnz $mA, target`.
    Brnz {
        a: MReg,
        offset: i32,
    },
    /// `brnzdec $mA, target`: if a != 0 { a -= 1; jump }.
    Brnzdec {
        a: MReg,
        offset: i32,
    },
    /// `call target`: $lr = next pc, pc-relative jump.
    Call {
        offset: i32,
    },
    /// `call $mA`.
    CallReg {
        a: MReg,
    },
    /// `rpt $mN, len`: run the next `len` issue units `$mN` times.
    Rpt {
        count: MReg,
        len: u16,
    },
    /// `rpt count, len` with an immediate count.
    RptImm {
        count: u16,
        len: u16,
    },
    /// End this context (a worker returns its slot; the supervisor ends the tile program).
    Exit,
    // ---- supervisor only ----
    /// `run $mEntry, $mState`: start a worker.
    Run {
        entry: MReg,
        state: MReg,
    },
    /// `wsync`: wait until every worker has exited.
    Wsync,
    /// `sync`: global BSP sync, then the exchange phase begins.
    Sync,
    /// `hsync`: global sync with the host (host exchange).
    Hsync,
    /// `xend`: end of this tile's exchange program.
    Xend,
    /// `xsend $mAddr, $mWords, $mStart`.
    Xsend {
        addr: MReg,
        words: MReg,
        start: MReg,
    },
    /// `xrecv $mAddr, $mWords, $mSrc, $mStart`.
    Xrecv {
        addr: MReg,
        words: MReg,
        src: MReg,
        start: MReg,
    },
    /// `xtab $mTable, $mCount`: run `count` 16-byte exchange descriptors.
    Xtab {
        table: MReg,
        count: MReg,
    },
    // ---- arithmetic slot (workers only) ----
    Float {
        ty: FloatType,
        op: FloatOp,
        d: AReg,
        a: AReg,
        b: AReg,
    },
    Hred {
        op: HredOp,
        d: AReg,
        a: AReg,
    },
    Cvt {
        op: CvtOp,
        d: AReg,
        a: AReg,
        scale: i8,
    },
    Shuf {
        op: ShufOp,
        d: AReg,
        a: AReg,
        b: AReg,
    },
    Amp {
        mode: AmpMode,
        d: AReg,
        x: AReg,
        p: AReg,
    },
    /// `ampw $aQ, index`: write 16 bytes into the AMP weight store at byte `16 * index`.
    AmpW {
        a: AReg,
        index: u8,
    },
    /// `ampclr`: zero the accumulators, reset the phase and the mode.
    AmpClr,
    /// `ampscale imm`: products of `ampf8` are multiplied by 2^imm.
    AmpScale {
        scale: i8,
    },
}

/// Which slot of a bundle an instruction occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// Memory, control and integer instructions (first word of a bundle).
    Main,
    /// Arithmetic (float and AMP) instructions (second word of a bundle).
    Arith,
    /// `nop` fits both slots.
    Either,
}

/// Which contexts may execute an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContextClass {
    Any,
    SupervisorOnly,
    WorkerOnly,
}

impl Instruction {
    /// The bundle slot of this instruction.
    pub fn slot(&self) -> Slot {
        use Instruction::*;
        match self {
            Nop => Slot::Either,
            Float { .. }
            | Hred { .. }
            | Cvt { .. }
            | Shuf { .. }
            | Amp { .. }
            | AmpW { .. }
            | AmpClr
            | AmpScale { .. } => Slot::Arith,
            _ => Slot::Main,
        }
    }

    /// Which contexts may execute this instruction. The supervisor does no
    /// floating point, so every arithmetic-slot instruction is worker-only.
    pub fn context_class(&self) -> ContextClass {
        use Instruction::*;
        match self {
            Run { .. }
            | Wsync
            | Sync
            | Hsync
            | Xend
            | Xsend { .. }
            | Xrecv { .. }
            | Xtab { .. } => ContextClass::SupervisorOnly,
            _ if self.slot() == Slot::Arith => ContextClass::WorkerOnly,
            _ => ContextClass::Any,
        }
    }

    /// Whether the instruction may change the program counter or the
    /// context's run state; such instructions are not allowed inside a
    /// hardware loop body.
    pub fn is_control(&self) -> bool {
        use Instruction::*;
        matches!(
            self,
            Br { .. }
                | BrRel { .. }
                | Brz { .. }
                | Brnz { .. }
                | Brnzdec { .. }
                | Call { .. }
                | CallReg { .. }
                | Rpt { .. }
                | RptImm { .. }
                | Exit
                | Run { .. }
                | Wsync
                | Sync
                | Hsync
                | Xend
                | Xsend { .. }
                | Xrecv { .. }
                | Xtab { .. }
        )
    }

    /// Issue slots the instruction occupies on its context: the context may
    /// issue its next bundle `issue_slots * 6` tile cycles later. Waiting
    /// instructions (`wsync`, `sync`, `hsync`, `xend`, `run` with no free
    /// worker, `xtab`) add their waiting time on top; see docs/isa.md.
    pub fn issue_slots(&self) -> u32 {
        use Instruction::*;
        match self {
            // 11 cycles per vertex launch in the model: two supervisor rounds.
            Run { .. } => ipu_arch::VERTEX_LAUNCH_CYCLES
                .div_ceil(ipu_arch::CONTEXT_ISSUE_INTERVAL as u64) as u32,
            Float { ty, op, .. } if op.is_transcendental() && *ty != FloatType::F32 => 2,
            _ => 1,
        }
    }

    /// Integer registers read (as a bit mask over `$m0..$m15`).
    pub fn m_reads(&self) -> u16 {
        use Instruction::*;
        let bit = |r: MReg| 1u16 << r.0;
        let addr_bits = |a: &Addr| {
            bit(a.base)
                | match a.mode {
                    AddrMode::Indexed(i) | AddrMode::PostIncReg(i) => bit(i),
                    _ => 0,
                }
        };
        match self {
            Alu { a, b, .. } => bit(*a) | bit(*b),
            AluImm { a, .. } => bit(*a),
            MovToA { a, .. } => bit(*a),
            SetSeed { a, b } => bit(*a) | bit(*b),
            Load { addr, .. } => addr_bits(addr),
            Store { s, addr, .. } => {
                addr_bits(addr)
                    | match s {
                        Reg::M(m) => bit(*m),
                        Reg::A(_) => 0,
                    }
            }
            LdSt {
                kind, base, stride, ..
            } => {
                let mut m = bit(*stride);
                for i in 0..kind.address_registers() {
                    m |= bit(MReg(base.0 + i));
                }
                m
            }
            Br { a } | CallReg { a } | Brz { a, .. } | Brnz { a, .. } | Brnzdec { a, .. } => {
                bit(*a)
            }
            Rpt { count, .. } => bit(*count),
            Run { entry, state } => bit(*entry) | bit(*state),
            Xsend { addr, words, start } => bit(*addr) | bit(*words) | bit(*start),
            Xrecv {
                addr,
                words,
                src,
                start,
            } => bit(*addr) | bit(*words) | bit(*src) | bit(*start),
            Xtab { table, count } => bit(*table) | bit(*count),
            _ => 0,
        }
    }

    /// Integer registers written (mask); `$mzero` writes are discarded but still reported.
    pub fn m_writes(&self) -> u16 {
        use Instruction::*;
        let bit = |r: MReg| 1u16 << r.0;
        match self {
            Alu { d, .. } | AluImm { d, .. } | MovToM { d, .. } | Get { d, .. } => bit(*d),
            Setzi { d: Reg::M(d), .. } | Sethi { d: Reg::M(d), .. } => bit(*d),
            Load { d, addr, .. } => {
                let post = match addr.mode {
                    AddrMode::PostInc(_) | AddrMode::PostIncReg(_) => bit(addr.base),
                    _ => 0,
                };
                post | match d {
                    Reg::M(m) => bit(*m),
                    Reg::A(_) => 0,
                }
            }
            Store { addr, .. } => match addr.mode {
                AddrMode::PostInc(_) | AddrMode::PostIncReg(_) => bit(addr.base),
                _ => 0,
            },
            LdSt {
                kind, base, pace, ..
            } => {
                let mut m = 0;
                for i in 0..kind.address_registers() {
                    if (pace >> (2 * i)) & 3 != 3 {
                        m |= bit(MReg(base.0 + i));
                    }
                }
                m
            }
            Brnzdec { a, .. } => bit(*a),
            Call { .. } | CallReg { .. } => bit(crate::reg::LR),
            _ => 0,
        }
    }

    /// Float registers read (mask over `$a0..$a15`).
    pub fn a_reads(&self) -> u16 {
        use Instruction::*;
        match self {
            MovToM { a, .. } => a.mask(),
            Store { s: Reg::A(a), .. } => a.mask(),
            LdSt { s, .. } => s.mask(),
            Float { op, d, a, b, .. } => {
                let mut m = a.mask();
                if !op.is_unary() {
                    m |= b.mask();
                }
                if *op == FloatOp::Mac {
                    m |= d.mask();
                }
                m
            }
            Hred { a, .. } | Cvt { a, .. } => a.mask(),
            Shuf { op, a, b, .. } => a.mask() | if op.shape().2 { b.mask() } else { 0 },
            Amp { x, p, .. } => x.mask() | p.mask(),
            AmpW { a, .. } => a.mask(),
            _ => 0,
        }
    }

    /// Float registers written (mask).
    pub fn a_writes(&self) -> u16 {
        use Instruction::*;
        match self {
            Setzi { d: Reg::A(d), .. } | Sethi { d: Reg::A(d), .. } | MovToA { d, .. } => d.mask(),
            Load { d: Reg::A(d), .. } => d.mask(),
            LdSt { d, .. } => d.mask(),
            Float { d, .. } | Hred { d, .. } | Cvt { d, .. } | Shuf { d, .. } | Amp { d, .. } => {
                d.mask()
            }
            _ => 0,
        }
    }

    /// Checks operand ranges, register alignment and widths, so that the
    /// instruction can be encoded. Returns the first problem found.
    pub fn validate(&self) -> Result<(), IsaError> {
        crate::encode::validate(self)
    }
}

/// One issue unit: a single instruction (4 bytes) or a pair of a main-slot
/// and an arithmetic-slot instruction issued together (8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bundle {
    Single(Instruction),
    Pair {
        main: Instruction,
        arith: Instruction,
    },
}

impl Bundle {
    /// Encoded size in bytes.
    pub fn size(&self) -> u32 {
        match self {
            Bundle::Single(_) => 4,
            Bundle::Pair { .. } => 8,
        }
    }
    /// The instructions of the bundle, main slot first.
    pub fn instructions(&self) -> impl Iterator<Item = &Instruction> {
        let (a, b) = match self {
            Bundle::Single(i) => (i, None),
            Bundle::Pair { main, arith } => (main, Some(arith)),
        };
        std::iter::once(a).chain(b)
    }
    /// Issue slots of the bundle: the larger of its instructions' costs.
    pub fn issue_slots(&self) -> u32 {
        self.instructions()
            .map(|i| i.issue_slots())
            .max()
            .unwrap_or(1)
    }
    /// Checks slot classes, operands and that the two instructions of a pair
    /// never write the same register (reads of a bundle happen before its writes).
    pub fn validate(&self) -> Result<(), IsaError> {
        for i in self.instructions() {
            i.validate()?;
        }
        if let Bundle::Pair { main, arith } = self {
            if main.slot() == Slot::Arith {
                return Err(IsaError::BadBundle(format!(
                    "first instruction `{main}` is not a main-slot instruction"
                )));
            }
            if arith.slot() == Slot::Main {
                return Err(IsaError::BadBundle(format!(
                    "second instruction `{arith}` is not an arithmetic-slot instruction"
                )));
            }
            if main.is_control() && *main != Instruction::Nop {
                // Control instructions may pair, but their effects are defined
                // only relative to the whole bundle; keep them single so that
                // hardware-loop and branch rules stay simple.
                return Err(IsaError::BadBundle(format!(
                    "control instruction `{main}` cannot be bundled"
                )));
            }
            let m_conflict = main.m_writes() & arith.m_writes();
            let a_conflict = main.a_writes() & arith.a_writes();
            if m_conflict != 0 || a_conflict != 0 {
                return Err(IsaError::BadBundle(format!(
                    "`{main}` and `{arith}` write the same register"
                )));
            }
        }
        Ok(())
    }
}
