//! Disassembly: `Display` prints instructions and bundles in the assembly
//! syntax that [`crate::parse_instruction`] and [`crate::parse_bundle`] read back.

use crate::instr::*;
use std::fmt;

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            AddrMode::Offset(0) => write!(f, "[{}]", self.base),
            AddrMode::Offset(v) if v < 0 => write!(f, "[{}-{}]", self.base, -(v as i64)),
            AddrMode::Offset(v) => write!(f, "[{}+{}]", self.base, v),
            AddrMode::PostInc(v) => write!(f, "[{}]+={}", self.base, v),
            AddrMode::Indexed(r) => write!(f, "[{}+{}]", self.base, r),
            AddrMode::PostIncReg(r) => write!(f, "[{}]+={}", self.base, r),
        }
    }
}

fn rel(off: i32) -> String {
    if off < 0 {
        format!("{off}")
    } else {
        format!("+{off}")
    }
}

impl fmt::Display for Instruction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Instruction::*;
        match *self {
            Nop => write!(f, "nop"),
            Alu { op, d, a, b } => write!(f, "{} {d}, {a}, {b}", op.mnemonic()),
            AluImm { op, d, a, imm } => write!(f, "{} {d}, {a}, {imm}", op.mnemonic()),
            Setzi { d, imm } => write!(f, "setzi {d}, {imm:#x}"),
            Sethi { d, imm } => write!(f, "sethi {d}, {imm:#x}"),
            MovToA { d, a } => write!(f, "mov {d}, {a}"),
            MovToM { d, a } => write!(f, "mov {d}, {a}"),
            Get { d, sreg } => write!(f, "get {d}, {}", sreg.name()),
            SetSeed { a, b } => write!(f, "setseed {a}, {b}"),
            Load { kind, d, addr } => write!(f, "{} {d}, {addr}", kind.mnemonic()),
            Store { kind, s, addr } => write!(f, "{} {s}, {addr}", kind.mnemonic()),
            LdSt {
                kind,
                d,
                s,
                base,
                stride,
                pace,
            } => {
                write!(
                    f,
                    "{} {d}, {s}, {base}, {stride}, {pace:#08b}",
                    kind.mnemonic()
                )
            }
            Br { a } => write!(f, "br {a}"),
            BrRel { offset } => write!(f, "br {}", rel(offset)),
            Brz { a, offset } => write!(f, "brz {a}, {}", rel(offset)),
            Brnz { a, offset } => write!(f, "brnz {a}, {}", rel(offset)),
            Brnzdec { a, offset } => write!(f, "brnzdec {a}, {}", rel(offset)),
            Call { offset } => write!(f, "call {}", rel(offset)),
            CallReg { a } => write!(f, "call {a}"),
            Rpt { count, len } => write!(f, "rpt {count}, {len}"),
            RptImm { count, len } => write!(f, "rpt {count}, {len}"),
            Exit => write!(f, "exit"),
            Run { entry, state } => write!(f, "run {entry}, {state}"),
            Wsync => write!(f, "wsync"),
            Sync => write!(f, "sync"),
            Hsync => write!(f, "hsync"),
            Xend => write!(f, "xend"),
            Xsend { addr, words, start } => write!(f, "xsend {addr}, {words}, {start}"),
            Xrecv {
                addr,
                words,
                src,
                start,
            } => write!(f, "xrecv {addr}, {words}, {src}, {start}"),
            Xtab { table, count } => write!(f, "xtab {table}, {count}"),
            Float { ty, op, d, a, b } => {
                if op.is_unary() {
                    write!(f, "{}{} {d}, {a}", ty.prefix(), op.suffix())
                } else {
                    write!(f, "{}{} {d}, {a}, {b}", ty.prefix(), op.suffix())
                }
            }
            Hred { op, d, a } => write!(f, "{} {d}, {a}", op.mnemonic()),
            Cvt { op, d, a, scale } => {
                if op.has_scale() {
                    write!(f, "{} {d}, {a}, {scale}", op.mnemonic())
                } else {
                    write!(f, "{} {d}, {a}", op.mnemonic())
                }
            }
            Shuf { op, d, a, b } => {
                if op.shape().2 {
                    write!(f, "{} {d}, {a}, {b}", op.mnemonic())
                } else {
                    write!(f, "{} {d}, {a}", op.mnemonic())
                }
            }
            Amp { mode, d, x, p } => write!(f, "{} {d}, {x}, {p}", mode.mnemonic()),
            AmpW { a, index } => write!(f, "ampw {a}, {index}"),
            AmpClr => write!(f, "ampclr"),
            AmpScale { scale } => write!(f, "ampscale {scale}"),
        }
    }
}

impl fmt::Display for Bundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bundle::Single(i) => i.fmt(f),
            Bundle::Pair { main, arith } => write!(f, "{{ {main} ; {arith} }}"),
        }
    }
}
