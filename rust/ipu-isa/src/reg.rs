//! Registers of a tile context.
//!
//! Every context (the supervisor and each of the six workers) owns sixteen
//! 32-bit integer/address registers `$m0..$m15` and sixteen 32-bit float
//! registers `$a0..$a15`. `$m15` always reads zero (`$mzero`) and `$m14` is the
//! link register written by `call` (`$lr`). Float registers are used singly
//! (`$a3`), as even-aligned pairs holding 64 bits (`$a2:3`) or as 4-aligned
//! quads holding 128 bits (`$a4:7`).

use std::fmt;

/// The always-zero integer register.
pub const MZERO: MReg = MReg(15);
/// The link register written by `call`.
pub const LR: MReg = MReg(14);

/// An integer/address register `$m0..$m15`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MReg(pub u8);

/// A float register operand: `count` consecutive registers starting at
/// `first` (1 = single, 2 = pair, 4 = quad). Pairs start at an even register
/// and quads at a multiple of four.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AReg {
    pub first: u8,
    pub count: u8,
}

impl AReg {
    /// A single float register.
    pub const fn single(n: u8) -> AReg {
        AReg { first: n, count: 1 }
    }
    /// An even-aligned pair `$a{n}:{n+1}`.
    pub const fn pair(n: u8) -> AReg {
        AReg { first: n, count: 2 }
    }
    /// A 4-aligned quad `$a{n}:{n+3}`.
    pub const fn quad(n: u8) -> AReg {
        AReg { first: n, count: 4 }
    }
    /// Whether the register numbers are in range and aligned to the width.
    pub fn is_well_formed(self) -> bool {
        matches!(self.count, 1 | 2 | 4)
            && self.first < 16
            && self.first.is_multiple_of(self.count)
            && self.first + self.count <= 16
    }
    /// The registers covered, as a bit mask over `$a0..$a15`.
    pub fn mask(self) -> u16 {
        (((1u32 << self.count) - 1) << self.first) as u16
    }
}

/// Either register class, for instructions that accept both (`setzi`, `ld32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reg {
    M(MReg),
    A(AReg),
}

impl fmt::Display for MReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            15 => write!(f, "$mzero"),
            14 => write!(f, "$lr"),
            n => write!(f, "$m{n}"),
        }
    }
}

impl fmt::Display for AReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 1 {
            write!(f, "$a{}", self.first)
        } else {
            write!(f, "$a{}:{}", self.first, self.first + self.count - 1)
        }
    }
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reg::M(m) => m.fmt(f),
            Reg::A(a) => a.fmt(f),
        }
    }
}
