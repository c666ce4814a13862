//! Binary encoding and decoding.
//!
//! Every instruction is one little-endian 32-bit word: bit 31 is the pair bit
//! (set on the first word of a two-instruction bundle), bits 30..24 the opcode
//! and bits 23..0 the operands. Register fields are four bits at bits 23..20
//! (r0), 19..16 (r1), 15..12 (r2) and 11..8 (r3). docs/isa.md lists every
//! opcode and field.

use crate::instr::*;
use crate::reg::{AReg, MReg, Reg};
use crate::IsaError;

/// The pair bit: this word and the next form one bundle.
pub const PAIR_BIT: u32 = 1 << 31;

pub(crate) mod op {
    pub const NOP: u8 = 0x01;
    pub const ALU: u8 = 0x02;
    pub const ALU_IMM: u8 = 0x03;
    pub const SETZI_M: u8 = 0x04;
    pub const SETZI_A: u8 = 0x05;
    pub const SETHI_M: u8 = 0x06;
    pub const SETHI_A: u8 = 0x07;
    pub const MOV_TO_A: u8 = 0x08;
    pub const MOV_TO_M: u8 = 0x09;
    pub const GET: u8 = 0x0A;
    pub const SETSEED: u8 = 0x0B;
    pub const LOAD: u8 = 0x10; // + LoadKind index (5 kinds)
    pub const STORE: u8 = 0x18; // + StoreKind index (4 kinds)
    pub const LDST: u8 = 0x1C; // + LdStKind index (3 kinds)
    pub const BR: u8 = 0x20;
    pub const BR_REL: u8 = 0x21;
    pub const BRZ: u8 = 0x22;
    pub const BRNZ: u8 = 0x23;
    pub const BRNZDEC: u8 = 0x24;
    pub const CALL: u8 = 0x25;
    pub const CALL_REG: u8 = 0x26;
    pub const RPT: u8 = 0x27;
    pub const RPT_IMM: u8 = 0x28;
    pub const EXIT: u8 = 0x29;
    pub const RUN: u8 = 0x30;
    pub const WSYNC: u8 = 0x31;
    pub const SYNC: u8 = 0x32;
    pub const HSYNC: u8 = 0x33;
    pub const XEND: u8 = 0x34;
    pub const XSEND: u8 = 0x35;
    pub const XRECV: u8 = 0x36;
    pub const XTAB: u8 = 0x37;
    pub const FLOAT: u8 = 0x40; // + FloatType index (3 types)
    pub const HRED: u8 = 0x44;
    pub const CVT: u8 = 0x45;
    pub const SHUF: u8 = 0x46;
    pub const AMP: u8 = 0x50; // + AmpMode index (4 modes)
    pub const AMPW: u8 = 0x54;
    pub const AMPCLR: u8 = 0x55;
    pub const AMPSCALE: u8 = 0x56;
}

/// Range of pc-relative branch offsets in bytes (signed 20-bit word count).
pub const BRANCH_OFFSET_RANGE: std::ops::RangeInclusive<i32> = -(1 << 19) * 4..=((1 << 19) - 1) * 4;
/// Largest 20-bit immediate of `setzi`/`sethi`.
pub const IMM20_MAX: u32 = (1 << 20) - 1;
/// Largest hardware-loop body length and immediate count.
pub const RPT_MAX: u16 = 4095;
/// Number of 16-byte chunks in the AMP weight store.
pub const AMPW_CHUNKS: u8 = (AMP_WEIGHT_STORE_BYTES / 16) as u8;

fn index_of<T: PartialEq>(all: &[T], x: &T) -> u32 {
    all.iter().position(|y| y == x).expect("enumerated value") as u32
}

const LOAD_KINDS: [LoadKind; 5] = [
    LoadKind::M32,
    LoadKind::A16,
    LoadKind::A32,
    LoadKind::A64,
    LoadKind::A128,
];
const STORE_KINDS: [StoreKind; 4] = [
    StoreKind::M32,
    StoreKind::A16,
    StoreKind::A32,
    StoreKind::A64,
];
const FLOAT_TYPES: [FloatType; 3] = [FloatType::F16v4, FloatType::F32v2, FloatType::F32];

fn bad(i: &Instruction, why: impl Into<String>) -> IsaError {
    IsaError::BadOperand {
        instruction: format!("{i:?}"),
        reason: why.into(),
    }
}

fn check_m(i: &Instruction, r: MReg) -> Result<(), IsaError> {
    if r.0 < 16 {
        Ok(())
    } else {
        Err(bad(
            i,
            format!("integer register number {} out of range", r.0),
        ))
    }
}

fn check_a(i: &Instruction, r: AReg, width: u8) -> Result<(), IsaError> {
    if !r.is_well_formed() || r.count != width {
        let what = match width {
            1 => "a single float register",
            2 => "an even-aligned float register pair",
            _ => "a 4-aligned float register quad",
        };
        return Err(bad(i, format!("operand {r} must be {what}")));
    }
    Ok(())
}

fn load_width(kind: LoadKind) -> u8 {
    match kind {
        LoadKind::A64 => 2,
        LoadKind::A128 => 4,
        _ => 1,
    }
}

fn store_width(kind: StoreKind) -> u8 {
    match kind {
        StoreKind::A64 => 2,
        _ => 1,
    }
}

fn check_addr(i: &Instruction, a: &Addr) -> Result<(), IsaError> {
    check_m(i, a.base)?;
    match a.mode {
        AddrMode::Offset(v) | AddrMode::PostInc(v) => {
            if !MEM_IMM_RANGE.contains(&v) {
                return Err(bad(
                    i,
                    format!("memory immediate {v} outside {MEM_IMM_RANGE:?}"),
                ));
            }
        }
        AddrMode::Indexed(r) | AddrMode::PostIncReg(r) => check_m(i, r)?,
    }
    Ok(())
}

fn check_offset(i: &Instruction, off: i32) -> Result<(), IsaError> {
    if off % 4 != 0 || !BRANCH_OFFSET_RANGE.contains(&off) {
        return Err(bad(
            i,
            format!("branch offset {off} must be a multiple of 4 in {BRANCH_OFFSET_RANGE:?}"),
        ));
    }
    Ok(())
}

/// See [`Instruction::validate`].
pub(crate) fn validate(i: &Instruction) -> Result<(), IsaError> {
    use Instruction::*;
    match *i {
        Nop | Exit | Wsync | Sync | Hsync | Xend | AmpClr => {}
        Alu { d, a, b, .. } => {
            check_m(i, d)?;
            check_m(i, a)?;
            check_m(i, b)?;
        }
        AluImm { op, d, a, imm } => {
            check_m(i, d)?;
            check_m(i, a)?;
            if !op.imm_range().contains(&imm) {
                return Err(bad(
                    i,
                    format!(
                        "immediate {imm} outside {:?} for `{}`",
                        op.imm_range(),
                        op.mnemonic()
                    ),
                ));
            }
        }
        Setzi { d, imm } | Sethi { d, imm } => {
            match d {
                Reg::M(m) => check_m(i, m)?,
                Reg::A(a) => check_a(i, a, 1)?,
            }
            if imm > IMM20_MAX {
                return Err(bad(i, format!("immediate {imm:#x} does not fit 20 bits")));
            }
        }
        MovToA { d, a } => {
            check_a(i, d, 1)?;
            check_m(i, a)?;
        }
        MovToM { d, a } => {
            check_m(i, d)?;
            check_a(i, a, 1)?;
        }
        Get { d, .. } => check_m(i, d)?,
        SetSeed { a, b } => {
            check_m(i, a)?;
            check_m(i, b)?;
        }
        Load { kind, d, addr } => {
            match (kind, d) {
                (LoadKind::M32, Reg::M(m)) => check_m(i, m)?,
                (LoadKind::M32, _) => {
                    return Err(bad(
                        i,
                        "ld32 into an integer register needs an $m destination",
                    ))
                }
                (_, Reg::A(a)) => check_a(i, a, load_width(kind))?,
                (_, Reg::M(_)) => {
                    return Err(bad(
                        i,
                        format!("{} needs a float register destination", kind.mnemonic()),
                    ))
                }
            }
            check_addr(i, &addr)?;
        }
        Store { kind, s, addr } => {
            match (kind, s) {
                (StoreKind::M32, Reg::M(m)) => check_m(i, m)?,
                (StoreKind::M32, _) => {
                    return Err(bad(i, "st32 of an integer register needs an $m source"))
                }
                (_, Reg::A(a)) => check_a(i, a, store_width(kind))?,
                (_, Reg::M(_)) => {
                    return Err(bad(
                        i,
                        format!("{} needs a float register source", kind.mnemonic()),
                    ))
                }
            }
            check_addr(i, &addr)?;
        }
        LdSt {
            kind,
            d,
            s,
            base,
            stride,
            pace,
        } => {
            check_a(i, d, kind.dest_width())?;
            check_a(i, s, 2)?;
            check_m(i, stride)?;
            let n = kind.address_registers();
            if base.0 + n > 15 {
                return Err(bad(
                    i,
                    format!("address registers {base}..+{n} run past $m14"),
                ));
            }
            if pace >= 1 << (2 * n) {
                return Err(bad(
                    i,
                    format!("pace {pace:#b} has codes beyond the {n} address registers"),
                ));
            }
        }
        Br { a } | CallReg { a } => check_m(i, a)?,
        BrRel { offset } | Call { offset } => check_offset(i, offset)?,
        Brz { a, offset } | Brnz { a, offset } | Brnzdec { a, offset } => {
            check_m(i, a)?;
            check_offset(i, offset)?;
        }
        Rpt { count, len } => {
            check_m(i, count)?;
            if len == 0 || len > RPT_MAX {
                return Err(bad(
                    i,
                    format!("loop body length {len} outside 1..={RPT_MAX}"),
                ));
            }
        }
        RptImm { count, len } => {
            if count > RPT_MAX || len == 0 || len > RPT_MAX {
                return Err(bad(
                    i,
                    format!(
                        "loop count {count} / length {len} outside 0..={RPT_MAX} / 1..={RPT_MAX}"
                    ),
                ));
            }
        }
        Run { entry, state } => {
            check_m(i, entry)?;
            check_m(i, state)?;
        }
        Xsend { addr, words, start } => {
            for r in [addr, words, start] {
                check_m(i, r)?;
            }
        }
        Xrecv {
            addr,
            words,
            src,
            start,
        } => {
            for r in [addr, words, src, start] {
                check_m(i, r)?;
            }
        }
        Xtab { table, count } => {
            check_m(i, table)?;
            check_m(i, count)?;
        }
        Float { ty, op, d, a, b } => {
            let w = ty.width();
            check_a(i, d, w)?;
            check_a(i, a, w)?;
            check_a(i, b, w)?;
            if op.is_unary() && b != a {
                return Err(bad(
                    i,
                    "unary float operation: the unused second source must equal the first",
                ));
            }
        }
        Hred { d, a, .. } => {
            check_a(i, d, 1)?;
            check_a(i, a, 2)?;
        }
        Cvt { op, d, a, scale } => {
            let (dw, sw) = op.widths();
            check_a(i, d, dw)?;
            check_a(i, a, sw)?;
            if !op.has_scale() && scale != 0 {
                return Err(bad(i, format!("`{}` takes no scale", op.mnemonic())));
            }
        }
        Shuf { op, d, a, b } => {
            let (dw, sw, two) = op.shape();
            check_a(i, d, dw)?;
            check_a(i, a, sw)?;
            check_a(i, b, sw)?;
            if !two && b != a {
                return Err(bad(
                    i,
                    "one-source shuffle: the unused second source must equal the first",
                ));
            }
        }
        Amp { mode, d, x, p } => {
            let (dw, xw, pw) = mode.widths();
            check_a(i, d, dw)?;
            check_a(i, x, xw)?;
            check_a(i, p, pw)?;
        }
        AmpW { a, index } => {
            check_a(i, a, 4)?;
            if index >= AMPW_CHUNKS {
                return Err(bad(
                    i,
                    format!("weight chunk {index} outside 0..{AMPW_CHUNKS}"),
                ));
            }
        }
        AmpScale { .. } => {}
    }
    Ok(())
}

fn word(opcode: u8, operands: u32) -> u32 {
    ((opcode as u32) << 24) | (operands & 0x00FF_FFFF)
}
fn r0(r: u8) -> u32 {
    (r as u32 & 15) << 20
}
fn r1(r: u8) -> u32 {
    (r as u32 & 15) << 16
}
fn r2(r: u8) -> u32 {
    (r as u32 & 15) << 12
}
fn r3(r: u8) -> u32 {
    (r as u32 & 15) << 8
}
fn off20(offset: i32) -> u32 {
    ((offset / 4) as u32) & 0xF_FFFF
}
fn reg_num(r: Reg) -> u8 {
    match r {
        Reg::M(m) => m.0,
        Reg::A(a) => a.first,
    }
}
fn addr_bits(a: &Addr) -> u32 {
    r1(a.base.0)
        | match a.mode {
            AddrMode::Offset(v) => (v as u32) & 0x3FFF,
            AddrMode::PostInc(v) => (1 << 14) | ((v as u32) & 0x3FFF),
            AddrMode::Indexed(r) => (2 << 14) | ((r.0 as u32) << 10),
            AddrMode::PostIncReg(r) => (3 << 14) | ((r.0 as u32) << 10),
        }
}

/// Encodes one instruction as a word with the pair bit clear.
pub fn encode_word(i: &Instruction) -> Result<u32, IsaError> {
    validate(i)?;
    use Instruction::*;
    Ok(match *i {
        Nop => word(op::NOP, 0),
        Alu { op: o, d, a, b } => word(
            op::ALU,
            r0(d.0) | r1(a.0) | r2(b.0) | index_of(&AluOp::ALL, &o),
        ),
        AluImm { op: o, d, a, imm } => word(
            op::ALU_IMM,
            r0(d.0) | r1(a.0) | (index_of(&AluOp::ALL, &o) << 12) | (imm as u32 & 0xFFF),
        ),
        Setzi { d, imm } => word(
            if matches!(d, Reg::M(_)) {
                op::SETZI_M
            } else {
                op::SETZI_A
            },
            r0(reg_num(d)) | imm,
        ),
        Sethi { d, imm } => word(
            if matches!(d, Reg::M(_)) {
                op::SETHI_M
            } else {
                op::SETHI_A
            },
            r0(reg_num(d)) | imm,
        ),
        MovToA { d, a } => word(op::MOV_TO_A, r0(d.first) | r1(a.0)),
        MovToM { d, a } => word(op::MOV_TO_M, r0(d.0) | r1(a.first)),
        Get { d, sreg } => word(op::GET, r0(d.0) | index_of(&SpecialReg::ALL, &sreg)),
        SetSeed { a, b } => word(op::SETSEED, r0(a.0) | r1(b.0)),
        Load { kind, d, addr } => word(
            op::LOAD + index_of(&LOAD_KINDS, &kind) as u8,
            r0(reg_num(d)) | addr_bits(&addr),
        ),
        Store { kind, s, addr } => word(
            op::STORE + index_of(&STORE_KINDS, &kind) as u8,
            r0(reg_num(s)) | addr_bits(&addr),
        ),
        LdSt {
            kind,
            d,
            s,
            base,
            stride,
            pace,
        } => word(
            op::LDST + index_of(&LdStKind::ALL, &kind) as u8,
            r0(d.first) | r1(s.first) | r2(base.0) | r3(stride.0) | pace as u32,
        ),
        Br { a } => word(op::BR, r0(a.0)),
        BrRel { offset } => word(op::BR_REL, off20(offset)),
        Brz { a, offset } => word(op::BRZ, r0(a.0) | off20(offset)),
        Brnz { a, offset } => word(op::BRNZ, r0(a.0) | off20(offset)),
        Brnzdec { a, offset } => word(op::BRNZDEC, r0(a.0) | off20(offset)),
        Call { offset } => word(op::CALL, off20(offset)),
        CallReg { a } => word(op::CALL_REG, r0(a.0)),
        Rpt { count, len } => word(op::RPT, r0(count.0) | len as u32),
        RptImm { count, len } => word(op::RPT_IMM, ((count as u32) << 12) | len as u32),
        Exit => word(op::EXIT, 0),
        Run { entry, state } => word(op::RUN, r0(entry.0) | r1(state.0)),
        Wsync => word(op::WSYNC, 0),
        Sync => word(op::SYNC, 0),
        Hsync => word(op::HSYNC, 0),
        Xend => word(op::XEND, 0),
        Xsend { addr, words, start } => word(op::XSEND, r0(addr.0) | r1(words.0) | r2(start.0)),
        Xrecv {
            addr,
            words,
            src,
            start,
        } => word(
            op::XRECV,
            r0(addr.0) | r1(words.0) | r2(src.0) | r3(start.0),
        ),
        Xtab { table, count } => word(op::XTAB, r0(table.0) | r1(count.0)),
        Float { ty, op: o, d, a, b } => {
            let b = if o.is_unary() { 0 } else { b.first };
            word(
                op::FLOAT + index_of(&FLOAT_TYPES, &ty) as u8,
                r0(d.first) | r1(a.first) | r2(b) | index_of(&FloatOp::ALL, &o),
            )
        }
        Hred { op: o, d, a } => word(
            op::HRED,
            r0(d.first) | r1(a.first) | index_of(&HredOp::ALL, &o),
        ),
        Cvt { op: o, d, a, scale } => word(
            op::CVT,
            r0(d.first) | r1(a.first) | (index_of(&CvtOp::ALL, &o) << 8) | (scale as u8 as u32),
        ),
        Shuf { op: o, d, a, b } => {
            let b = if o.shape().2 { b.first } else { 0 };
            word(
                op::SHUF,
                r0(d.first) | r1(a.first) | r2(b) | index_of(&ShufOp::ALL, &o),
            )
        }
        Amp { mode, d, x, p } => word(
            op::AMP + index_of(&AmpMode::ALL, &mode) as u8,
            r0(d.first) | r1(x.first) | r2(p.first),
        ),
        AmpW { a, index } => word(op::AMPW, r1(a.first) | index as u32),
        AmpClr => word(op::AMPCLR, 0),
        AmpScale { scale } => word(op::AMPSCALE, scale as u8 as u32),
    })
}

fn f0(w: u32) -> u8 {
    ((w >> 20) & 15) as u8
}
fn f1(w: u32) -> u8 {
    ((w >> 16) & 15) as u8
}
fn f2(w: u32) -> u8 {
    ((w >> 12) & 15) as u8
}
fn f3(w: u32) -> u8 {
    ((w >> 8) & 15) as u8
}
fn sext(v: u32, bits: u32) -> i32 {
    ((v << (32 - bits)) as i32) >> (32 - bits)
}
fn dec_off20(w: u32) -> i32 {
    sext(w & 0xF_FFFF, 20) * 4
}
fn dec_addr(w: u32) -> Addr {
    let base = MReg(f1(w));
    let imm = sext(w & 0x3FFF, 14);
    let idx = MReg(((w >> 10) & 15) as u8);
    let mode = match (w >> 14) & 3 {
        0 => AddrMode::Offset(imm),
        1 => AddrMode::PostInc(imm),
        2 => AddrMode::Indexed(idx),
        _ => AddrMode::PostIncReg(idx),
    };
    Addr { base, mode }
}

fn pick<T: Copy>(all: &[T], idx: u32, w: u32) -> Result<T, IsaError> {
    all.get(idx as usize)
        .copied()
        .ok_or(IsaError::IllegalInstruction {
            word: w,
            reason: "sub-operation out of range",
        })
}

/// Decodes one word (the pair bit is ignored; see [`decode_bundle`]).
pub fn decode_word(w: u32) -> Result<Instruction, IsaError> {
    use Instruction::*;
    let ill = |reason: &'static str| IsaError::IllegalInstruction { word: w, reason };
    let opcode = ((w >> 24) & 0x7F) as u8;
    let a1 = |n: u8| AReg::single(n);
    let a2 = |n: u8| AReg::pair(n);
    let i = match opcode {
        op::NOP => Nop,
        op::ALU => Alu {
            op: pick(&AluOp::ALL, w & 0xFF, w)?,
            d: MReg(f0(w)),
            a: MReg(f1(w)),
            b: MReg(f2(w)),
        },
        op::ALU_IMM => {
            let o = pick(&AluOp::ALL, (w >> 12) & 15, w)?;
            let imm = if o.imm_zero_extended() {
                (w & 0xFFF) as i32
            } else {
                sext(w & 0xFFF, 12)
            };
            AluImm {
                op: o,
                d: MReg(f0(w)),
                a: MReg(f1(w)),
                imm,
            }
        }
        op::SETZI_M => Setzi {
            d: Reg::M(MReg(f0(w))),
            imm: w & 0xF_FFFF,
        },
        op::SETZI_A => Setzi {
            d: Reg::A(a1(f0(w))),
            imm: w & 0xF_FFFF,
        },
        op::SETHI_M => Sethi {
            d: Reg::M(MReg(f0(w))),
            imm: w & 0xF_FFFF,
        },
        op::SETHI_A => Sethi {
            d: Reg::A(a1(f0(w))),
            imm: w & 0xF_FFFF,
        },
        op::MOV_TO_A => MovToA {
            d: a1(f0(w)),
            a: MReg(f1(w)),
        },
        op::MOV_TO_M => MovToM {
            d: MReg(f0(w)),
            a: a1(f1(w)),
        },
        op::GET => Get {
            d: MReg(f0(w)),
            sreg: pick(&SpecialReg::ALL, w & 0xFF, w)?,
        },
        op::SETSEED => SetSeed {
            a: MReg(f0(w)),
            b: MReg(f1(w)),
        },
        o if (op::LOAD..op::LOAD + 5).contains(&o) => {
            let kind = LOAD_KINDS[(o - op::LOAD) as usize];
            let d = match kind {
                LoadKind::M32 => Reg::M(MReg(f0(w))),
                k => Reg::A(AReg {
                    first: f0(w),
                    count: load_width(k),
                }),
            };
            Load {
                kind,
                d,
                addr: dec_addr(w),
            }
        }
        o if (op::STORE..op::STORE + 4).contains(&o) => {
            let kind = STORE_KINDS[(o - op::STORE) as usize];
            let s = match kind {
                StoreKind::M32 => Reg::M(MReg(f0(w))),
                k => Reg::A(AReg {
                    first: f0(w),
                    count: store_width(k),
                }),
            };
            Store {
                kind,
                s,
                addr: dec_addr(w),
            }
        }
        o if (op::LDST..op::LDST + 3).contains(&o) => {
            let kind = LdStKind::ALL[(o - op::LDST) as usize];
            LdSt {
                kind,
                d: AReg {
                    first: f0(w),
                    count: kind.dest_width(),
                },
                s: a2(f1(w)),
                base: MReg(f2(w)),
                stride: MReg(f3(w)),
                pace: (w & 0x3F) as u8,
            }
        }
        op::BR => Br { a: MReg(f0(w)) },
        op::BR_REL => BrRel {
            offset: dec_off20(w),
        },
        op::BRZ => Brz {
            a: MReg(f0(w)),
            offset: dec_off20(w),
        },
        op::BRNZ => Brnz {
            a: MReg(f0(w)),
            offset: dec_off20(w),
        },
        op::BRNZDEC => Brnzdec {
            a: MReg(f0(w)),
            offset: dec_off20(w),
        },
        op::CALL => Call {
            offset: dec_off20(w),
        },
        op::CALL_REG => CallReg { a: MReg(f0(w)) },
        op::RPT => Rpt {
            count: MReg(f0(w)),
            len: (w & 0xFFF) as u16,
        },
        op::RPT_IMM => RptImm {
            count: ((w >> 12) & 0xFFF) as u16,
            len: (w & 0xFFF) as u16,
        },
        op::EXIT => Exit,
        op::RUN => Run {
            entry: MReg(f0(w)),
            state: MReg(f1(w)),
        },
        op::WSYNC => Wsync,
        op::SYNC => Sync,
        op::HSYNC => Hsync,
        op::XEND => Xend,
        op::XSEND => Xsend {
            addr: MReg(f0(w)),
            words: MReg(f1(w)),
            start: MReg(f2(w)),
        },
        op::XRECV => Xrecv {
            addr: MReg(f0(w)),
            words: MReg(f1(w)),
            src: MReg(f2(w)),
            start: MReg(f3(w)),
        },
        op::XTAB => Xtab {
            table: MReg(f0(w)),
            count: MReg(f1(w)),
        },
        o if (op::FLOAT..op::FLOAT + 3).contains(&o) => {
            let ty = FLOAT_TYPES[(o - op::FLOAT) as usize];
            let fop = pick(&FloatOp::ALL, w & 0xFF, w)?;
            let wd = ty.width();
            let a = AReg {
                first: f1(w),
                count: wd,
            };
            let b = if fop.is_unary() {
                a
            } else {
                AReg {
                    first: f2(w),
                    count: wd,
                }
            };
            Float {
                ty,
                op: fop,
                d: AReg {
                    first: f0(w),
                    count: wd,
                },
                a,
                b,
            }
        }
        op::HRED => Hred {
            op: pick(&HredOp::ALL, w & 0xFF, w)?,
            d: a1(f0(w)),
            a: a2(f1(w)),
        },
        op::CVT => {
            let c = pick(&CvtOp::ALL, (w >> 8) & 15, w)?;
            let (dw, sw) = c.widths();
            Cvt {
                op: c,
                d: AReg {
                    first: f0(w),
                    count: dw,
                },
                a: AReg {
                    first: f1(w),
                    count: sw,
                },
                scale: (w & 0xFF) as u8 as i8,
            }
        }
        op::SHUF => {
            let s = pick(&ShufOp::ALL, w & 0xFF, w)?;
            let (dw, sw, two) = s.shape();
            let a = AReg {
                first: f1(w),
                count: sw,
            };
            let b = if two {
                AReg {
                    first: f2(w),
                    count: sw,
                }
            } else {
                a
            };
            Shuf {
                op: s,
                d: AReg {
                    first: f0(w),
                    count: dw,
                },
                a,
                b,
            }
        }
        o if (op::AMP..op::AMP + 4).contains(&o) => {
            let mode = AmpMode::ALL[(o - op::AMP) as usize];
            let (dw, xw, pw) = mode.widths();
            Amp {
                mode,
                d: AReg {
                    first: f0(w),
                    count: dw,
                },
                x: AReg {
                    first: f1(w),
                    count: xw,
                },
                p: AReg {
                    first: f2(w),
                    count: pw,
                },
            }
        }
        op::AMPW => AmpW {
            a: AReg::quad(f1(w)),
            index: (w & 0xFF) as u8,
        },
        op::AMPCLR => AmpClr,
        op::AMPSCALE => AmpScale {
            scale: (w & 0xFF) as u8 as i8,
        },
        0 => return Err(ill("opcode 0 (zeroed memory) is not an instruction")),
        _ => return Err(ill("unknown opcode")),
    };
    // Rejects misaligned register numbers and out-of-range fields, and makes
    // sure that unused bits are zero so that every word has one meaning.
    validate(&i).map_err(|_| ill("operand fields out of range or misaligned"))?;
    if encode_word(&i)? != w & !PAIR_BIT {
        return Err(ill("reserved operand bits are not zero"));
    }
    Ok(i)
}

/// Encodes a bundle into one or two words.
pub fn encode_bundle(b: &Bundle) -> Result<Vec<u32>, IsaError> {
    b.validate()?;
    Ok(match b {
        Bundle::Single(i) => vec![encode_word(i)?],
        Bundle::Pair { main, arith } => vec![encode_word(main)? | PAIR_BIT, encode_word(arith)?],
    })
}

/// Appends the little-endian bytes of a bundle.
pub fn encode_bundle_bytes(b: &Bundle, out: &mut Vec<u8>) -> Result<(), IsaError> {
    for w in encode_bundle(b)? {
        out.extend_from_slice(&w.to_le_bytes());
    }
    Ok(())
}

/// Decodes the bundle starting at `words[0]`; returns it and the words used.
pub fn decode_bundle(words: &[u32]) -> Result<(Bundle, usize), IsaError> {
    let w0 = *words.first().ok_or(IsaError::Truncated)?;
    let first = decode_word(w0)?;
    if w0 & PAIR_BIT == 0 {
        return Ok((Bundle::Single(first), 1));
    }
    let w1 = *words.get(1).ok_or(IsaError::Truncated)?;
    if w1 & PAIR_BIT != 0 {
        return Err(IsaError::IllegalInstruction {
            word: w1,
            reason: "second word of a bundle has the pair bit set",
        });
    }
    let b = Bundle::Pair {
        main: first,
        arith: decode_word(w1)?,
    };
    b.validate()?;
    Ok((b, 2))
}

/// Decodes the bundle at the start of little-endian `bytes`.
pub fn decode_bundle_bytes(bytes: &[u8]) -> Result<(Bundle, usize), IsaError> {
    let word_at = |i: usize| {
        bytes
            .get(4 * i..4 * i + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let mut words = Vec::with_capacity(2);
    if let Some(w) = word_at(0) {
        words.push(w);
        if w & PAIR_BIT != 0 {
            if let Some(w1) = word_at(1) {
                words.push(w1);
            }
        }
    }
    let (b, n) = decode_bundle(&words)?;
    Ok((b, 4 * n))
}
