//! Textual operands, instruction assembly from a mnemonic and operands, and
//! relocations.
//!
//! The assembler tokenises a line into a mnemonic and comma-separated operand
//! texts, parses each operand with [`parse_operand`] and calls
//! [`assemble_instruction`]. An operand naming a symbol yields a [`Fixup`]
//! that the linker resolves with [`apply_relocation`].

use crate::encode::{BRANCH_OFFSET_RANGE, IMM20_MAX};
use crate::instr::*;
use crate::reg::{AReg, MReg, Reg, LR, MZERO};
use crate::IsaError;

/// Addressing of a memory operand as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemMode {
    /// `[$mB]`, `[$mB+imm]`, `[$mB-imm]`.
    Offset(i64),
    /// `[$mB]+=imm`.
    PostInc(i64),
    /// `[$mB+$mI]`.
    Indexed(MReg),
    /// `[$mB]+=$mI`.
    PostIncReg(MReg),
}

/// One parsed operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operand {
    /// `$m0..$m15`, `$lr`, `$mzero`.
    M(MReg),
    /// `$a3`, `$a2:3`, `$a4:7`.
    A(AReg),
    /// Decimal, `0x` hex or `0b` binary, optionally signed.
    Imm(i64),
    /// A name with an optional `+n`/`-n` addend; also special register names for `get`.
    Symbol { name: String, addend: i64 },
    /// A memory operand in brackets.
    Mem { base: MReg, mode: MemMode },
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operand::M(m) => write!(f, "{m}"),
            Operand::A(a) => write!(f, "{a}"),
            Operand::Imm(v) => write!(f, "{v}"),
            Operand::Symbol { name, addend: 0 } => write!(f, "{name}"),
            Operand::Symbol { name, addend } => write!(f, "{name}{addend:+}"),
            Operand::Mem { base, mode } => match mode {
                MemMode::Offset(0) => write!(f, "[{base}]"),
                MemMode::Offset(v) => write!(f, "[{base}{v:+}]"),
                MemMode::PostInc(v) => write!(f, "[{base}]+={v}"),
                MemMode::Indexed(r) => write!(f, "[{base}+{r}]"),
                MemMode::PostIncReg(r) => write!(f, "[{base}]+={r}"),
            },
        }
    }
}

/// Renders an operand (or its absence) for error messages.
struct Shown<T>(T);

impl std::fmt::Display for Shown<Option<&Operand>> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(o) => write!(f, "`{o}`"),
            None => write!(f, "nothing"),
        }
    }
}

impl std::fmt::Display for Shown<&Operand> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`", self.0)
    }
}

/// How a linker patches a symbol value into an instruction or data word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RelocKind {
    /// Bits 19..0 of the word = value (unsigned, must fit 20 bits): `setzi`.
    Abs20,
    /// Bits 19..0 of the word = (value - place) / 4 (signed 20 bits; the
    /// difference must be a multiple of 4): `br`, `brz`, `brnz`, `brnzdec`, `call`.
    PcRel20,
    /// The whole little-endian word = value (data: vertex state, tables).
    Abs32,
}

/// A symbol reference left for the linker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fixup {
    pub kind: RelocKind,
    pub symbol: String,
    pub addend: i64,
}

/// Result of [`assemble_instruction`]: the instruction with zero in any
/// symbol field, and the fixup for that field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembled {
    pub instruction: Instruction,
    pub fixup: Option<Fixup>,
}

/// Patches `word` (the 32-bit word at address `place`) with `value` for a
/// relocation of `kind`. The pair bit and opcode of instruction words are kept.
pub fn apply_relocation(
    kind: RelocKind,
    word: u32,
    place: u32,
    value: i64,
) -> Result<u32, IsaError> {
    match kind {
        RelocKind::Abs20 => {
            if !(0..=IMM20_MAX as i64).contains(&value) {
                return Err(IsaError::RelocationOverflow {
                    kind,
                    value,
                    reason: "does not fit 20 unsigned bits",
                });
            }
            Ok((word & !0xF_FFFF) | value as u32)
        }
        RelocKind::PcRel20 => {
            let delta = value - place as i64;
            if delta % 4 != 0 {
                return Err(IsaError::RelocationOverflow {
                    kind,
                    value,
                    reason: "target is not 4-byte aligned",
                });
            }
            if !(*BRANCH_OFFSET_RANGE.start() as i64..=*BRANCH_OFFSET_RANGE.end() as i64)
                .contains(&delta)
            {
                return Err(IsaError::RelocationOverflow {
                    kind,
                    value,
                    reason: "branch target out of range",
                });
            }
            Ok((word & !0xF_FFFF) | (((delta / 4) as u32) & 0xF_FFFF))
        }
        RelocKind::Abs32 => {
            if !(i32::MIN as i64..=u32::MAX as i64).contains(&value) {
                return Err(IsaError::RelocationOverflow {
                    kind,
                    value,
                    reason: "does not fit 32 bits",
                });
            }
            Ok(value as u32)
        }
    }
}

fn operand_err(text: &str, reason: impl Into<String>) -> IsaError {
    IsaError::BadOperandText {
        text: text.to_string(),
        reason: reason.into(),
    }
}

/// Parses an integer literal: decimal, `0x..`, `0b..`, with optional sign and `_` separators.
pub fn parse_int(text: &str) -> Option<i64> {
    let t = text.trim().replace('_', "");
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b.to_string()),
        None => (false, t.strip_prefix('+').unwrap_or(&t).to_string()),
    };
    let v = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if let Some(b) = body.strip_prefix("0b").or_else(|| body.strip_prefix("0B")) {
        i64::from_str_radix(b, 2).ok()?
    } else if !body.is_empty() && body.chars().all(|c| c.is_ascii_digit()) {
        body.parse::<i64>().ok()?
    } else {
        return None;
    };
    Some(if neg { -v } else { v })
}

fn parse_reg(text: &str) -> Result<Operand, IsaError> {
    let t = text.trim();
    match t {
        "$lr" => return Ok(Operand::M(LR)),
        "$mzero" => return Ok(Operand::M(MZERO)),
        _ => {}
    }
    let num = |s: &str| -> Result<u8, IsaError> {
        s.parse::<u8>()
            .ok()
            .filter(|n| *n < 16)
            .ok_or_else(|| operand_err(t, "register number must be 0..15"))
    };
    if let Some(n) = t.strip_prefix("$m") {
        return Ok(Operand::M(MReg(num(n)?)));
    }
    if let Some(body) = t.strip_prefix("$a") {
        let a = match body.split_once(':') {
            None => AReg::single(num(body)?),
            Some((lo, hi)) => {
                let (lo, hi) = (num(lo)?, num(hi)?);
                if hi < lo {
                    return Err(operand_err(t, "register range runs backwards"));
                }
                AReg {
                    first: lo,
                    count: hi - lo + 1,
                }
            }
        };
        if !a.is_well_formed() {
            return Err(operand_err(t, "float register ranges are pairs ($a2:3, even first) or quads ($a4:7, first a multiple of 4)"));
        }
        return Ok(Operand::A(a));
    }
    Err(operand_err(
        t,
        "unknown register (expected $m0..$m15, $lr, $mzero or $a0..$a15)",
    ))
}

fn is_symbol_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '.'
}

fn parse_symbol(t: &str) -> Result<Operand, IsaError> {
    // name, or name+n, or name-n
    let split = t
        .char_indices()
        .skip(1)
        .find(|(_, c)| *c == '+' || *c == '-')
        .map(|(i, _)| i);
    let (name, addend) = match split {
        Some(i) => {
            let add = parse_int(&t[i..])
                .ok_or_else(|| operand_err(t, "symbol addend must be an integer"))?;
            (&t[..i], add)
        }
        None => (t, 0),
    };
    let name = name.trim();
    if name.is_empty()
        || !name.starts_with(is_symbol_start)
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$')
    {
        return Err(operand_err(
            t,
            "not a register, integer, symbol or memory operand",
        ));
    }
    Ok(Operand::Symbol {
        name: name.to_string(),
        addend,
    })
}

/// Parses one operand text.
pub fn parse_operand(text: &str) -> Result<Operand, IsaError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(operand_err(text, "empty operand"));
    }
    if t.starts_with('$') {
        return parse_reg(t);
    }
    if let Some(rest) = t.strip_prefix('[') {
        let close = rest
            .find(']')
            .ok_or_else(|| operand_err(t, "missing `]`"))?;
        let inside = rest[..close].trim();
        let after = rest[close + 1..].trim();
        let (base_txt, off) = match inside.find(['+', '-']) {
            Some(i) => (&inside[..i], Some(&inside[i..])),
            None => (inside, None),
        };
        let base = match parse_reg(base_txt)? {
            Operand::M(m) => m,
            _ => return Err(operand_err(t, "memory base must be an $m register")),
        };
        let mut mode = match off {
            None => MemMode::Offset(0),
            Some(o) => {
                let body = o[1..].trim();
                if body.starts_with('$') {
                    if o.starts_with('-') {
                        return Err(operand_err(t, "register index cannot be negated"));
                    }
                    match parse_reg(body)? {
                        Operand::M(m) => MemMode::Indexed(m),
                        _ => return Err(operand_err(t, "memory index must be an $m register")),
                    }
                } else {
                    MemMode::Offset(
                        parse_int(o)
                            .ok_or_else(|| operand_err(t, "memory offset must be an integer"))?,
                    )
                }
            }
        };
        if !after.is_empty() {
            let inc = after
                .strip_prefix("+=")
                .ok_or_else(|| operand_err(t, "expected `+=` after `]`"))?
                .trim();
            if mode != MemMode::Offset(0) {
                return Err(operand_err(t, "post-increment needs a plain `[$mB]` base"));
            }
            mode = if inc.starts_with('$') {
                match parse_reg(inc)? {
                    Operand::M(m) => MemMode::PostIncReg(m),
                    _ => return Err(operand_err(t, "increment register must be an $m register")),
                }
            } else {
                MemMode::PostInc(
                    parse_int(inc).ok_or_else(|| operand_err(t, "increment must be an integer"))?,
                )
            };
        }
        return Ok(Operand::Mem { base, mode });
    }
    if let Some(v) = parse_int(t) {
        return Ok(Operand::Imm(v));
    }
    parse_symbol(t)
}

/// Splits `mnemonic op, op, ...` into the mnemonic and operand texts.
fn split_line(line: &str) -> (&str, Vec<&str>) {
    let line = line.trim();
    match line.split_once(char::is_whitespace) {
        None => (line, vec![]),
        Some((m, rest)) => {
            let ops = rest
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            (m, ops)
        }
    }
}

/// Parses and assembles one instruction written as text (no symbols).
pub fn parse_instruction(line: &str) -> Result<Instruction, IsaError> {
    let (m, ops) = split_line(line);
    let ops = ops
        .into_iter()
        .map(parse_operand)
        .collect::<Result<Vec<_>, _>>()?;
    let a = assemble_instruction(m, &ops)?;
    if let Some(f) = a.fixup {
        return Err(IsaError::BadOperandText {
            text: f.symbol,
            reason: "symbols need the assembler".into(),
        });
    }
    Ok(a.instruction)
}

/// Parses a bundle: one instruction, or `{ main ; arith }`.
pub fn parse_bundle(line: &str) -> Result<Bundle, IsaError> {
    let t = line.trim();
    if let Some(inner) = t.strip_prefix('{') {
        let inner = inner
            .strip_suffix('}')
            .ok_or_else(|| operand_err(t, "bundle must end with `}`"))?;
        let (m, a) = inner
            .split_once(';')
            .ok_or_else(|| operand_err(t, "bundle needs `main ; arith`"))?;
        let b = Bundle::Pair {
            main: parse_instruction(m)?,
            arith: parse_instruction(a)?,
        };
        b.validate()?;
        Ok(b)
    } else {
        Ok(Bundle::Single(parse_instruction(t)?))
    }
}

struct Ctx<'a> {
    mnemonic: &'a str,
    ops: &'a [Operand],
}

impl Ctx<'_> {
    fn err(&self, reason: impl Into<String>) -> IsaError {
        IsaError::BadSyntax {
            mnemonic: self.mnemonic.to_string(),
            reason: reason.into(),
        }
    }
    fn count(&self, n: usize) -> Result<(), IsaError> {
        if self.ops.len() != n {
            return Err(self.err(format!("expects {n} operands, got {}", self.ops.len())));
        }
        Ok(())
    }
    fn m(&self, i: usize) -> Result<MReg, IsaError> {
        match self.ops.get(i) {
            Some(Operand::M(m)) => Ok(*m),
            o => {
                let other = Shown(o);
                Err(self.err(format!(
                    "operand {} must be an $m register, got {other}",
                    i + 1
                )))
            }
        }
    }
    fn a(&self, i: usize, width: u8) -> Result<AReg, IsaError> {
        match self.ops.get(i) {
            Some(Operand::A(a)) if a.count == width => Ok(*a),
            o => {
                let other = Shown(o);
                Err(self.err(format!(
                    "operand {} must be a float register {}, got {other}",
                    i + 1,
                    match width {
                        1 => "($aN)",
                        2 => "pair ($aN:N+1)",
                        _ => "quad ($aN:N+3)",
                    }
                )))
            }
        }
    }
    fn imm(&self, i: usize) -> Result<i64, IsaError> {
        match self.ops.get(i) {
            Some(Operand::Imm(v)) => Ok(*v),
            o => {
                let other = Shown(o);
                Err(self.err(format!("operand {} must be an integer, got {other}", i + 1)))
            }
        }
    }
    fn imm_in(&self, i: usize, lo: i64, hi: i64) -> Result<i64, IsaError> {
        let v = self.imm(i)?;
        if !(lo..=hi).contains(&v) {
            return Err(self.err(format!("operand {} = {v} outside {lo}..={hi}", i + 1)));
        }
        Ok(v)
    }
    fn mem(&self, i: usize) -> Result<Addr, IsaError> {
        match self.ops.get(i) {
            Some(Operand::Mem { base, mode }) => {
                let small = |v: i64| -> Result<i32, IsaError> {
                    if (*MEM_IMM_RANGE.start() as i64..=*MEM_IMM_RANGE.end() as i64).contains(&v) {
                        Ok(v as i32)
                    } else {
                        Err(self.err(format!("memory immediate {v} outside {MEM_IMM_RANGE:?}")))
                    }
                };
                let mode = match mode {
                    MemMode::Offset(v) => AddrMode::Offset(small(*v)?),
                    MemMode::PostInc(v) => AddrMode::PostInc(small(*v)?),
                    MemMode::Indexed(r) => AddrMode::Indexed(*r),
                    MemMode::PostIncReg(r) => AddrMode::PostIncReg(*r),
                };
                Ok(Addr { base: *base, mode })
            }
            o => {
                let other = Shown(o);
                Err(self.err(format!(
                    "operand {} must be a memory operand [..], got {other}",
                    i + 1
                )))
            }
        }
    }
    /// A pc-relative target: an integer byte offset or a symbol.
    fn target(&self, i: usize) -> Result<(i32, Option<Fixup>), IsaError> {
        match self.ops.get(i) {
            Some(Operand::Imm(v)) => {
                let r = *BRANCH_OFFSET_RANGE.start() as i64..=*BRANCH_OFFSET_RANGE.end() as i64;
                if v % 4 != 0 || !r.contains(v) {
                    return Err(self.err(format!(
                        "branch offset {v} must be a multiple of 4 in {r:?}"
                    )));
                }
                Ok((*v as i32, None))
            }
            Some(Operand::Symbol { name, addend }) => Ok((
                0,
                Some(Fixup {
                    kind: RelocKind::PcRel20,
                    symbol: name.clone(),
                    addend: *addend,
                }),
            )),
            o => {
                let other = Shown(o);
                Err(self.err(format!(
                    "operand {} must be a branch target, got {other}",
                    i + 1
                )))
            }
        }
    }
}

fn alu_op(m: &str) -> Option<AluOp> {
    AluOp::ALL.iter().copied().find(|o| o.mnemonic() == m)
}

/// Assembles one instruction from its mnemonic and parsed operands.
pub fn assemble_instruction(mnemonic: &str, operands: &[Operand]) -> Result<Assembled, IsaError> {
    use Instruction::*;
    let c = Ctx {
        mnemonic,
        ops: operands,
    };
    let done = |i: Instruction| -> Result<Assembled, IsaError> {
        i.validate()?;
        Ok(Assembled {
            instruction: i,
            fixup: None,
        })
    };
    let with = |i: Instruction, f: Option<Fixup>| -> Result<Assembled, IsaError> {
        i.validate()?;
        Ok(Assembled {
            instruction: i,
            fixup: f,
        })
    };
    if let Some(op) = alu_op(mnemonic) {
        c.count(3)?;
        let (d, a) = (c.m(0)?, c.m(1)?);
        return match &operands[2] {
            Operand::M(b) => done(Alu { op, d, a, b: *b }),
            Operand::Imm(v) => {
                let r = op.imm_range();
                if !(*r.start() as i64..=*r.end() as i64).contains(v) {
                    return Err(c.err(format!("immediate {v} outside {r:?}")));
                }
                done(AluImm {
                    op,
                    d,
                    a,
                    imm: *v as i32,
                })
            }
            o => {
                let other = Shown(o);
                Err(c.err(format!(
                    "operand 3 must be an $m register or an integer, got {other}"
                )))
            }
        };
    }
    for ty in [FloatType::F32v2, FloatType::F16v4, FloatType::F32] {
        if let Some(suffix) = mnemonic.strip_prefix(ty.prefix()) {
            if let Some(op) = FloatOp::ALL.iter().copied().find(|o| o.suffix() == suffix) {
                let w = ty.width();
                return if op.is_unary() {
                    c.count(2)?;
                    let a = c.a(1, w)?;
                    done(Float {
                        ty,
                        op,
                        d: c.a(0, w)?,
                        a,
                        b: a,
                    })
                } else {
                    c.count(3)?;
                    done(Float {
                        ty,
                        op,
                        d: c.a(0, w)?,
                        a: c.a(1, w)?,
                        b: c.a(2, w)?,
                    })
                };
            }
        }
    }
    if let Some(op) = HredOp::ALL
        .iter()
        .copied()
        .find(|o| o.mnemonic() == mnemonic)
    {
        c.count(2)?;
        return done(Hred {
            op,
            d: c.a(0, 1)?,
            a: c.a(1, 2)?,
        });
    }
    if let Some(op) = CvtOp::ALL
        .iter()
        .copied()
        .find(|o| o.mnemonic() == mnemonic)
    {
        let (dw, sw) = op.widths();
        let scale = if op.has_scale() {
            c.count(3)?;
            c.imm_in(2, -128, 127)? as i8
        } else {
            c.count(2)?;
            0
        };
        return done(Cvt {
            op,
            d: c.a(0, dw)?,
            a: c.a(1, sw)?,
            scale,
        });
    }
    if let Some(mode) = AmpMode::ALL
        .iter()
        .copied()
        .find(|o| o.mnemonic() == mnemonic)
    {
        c.count(3)?;
        let (dw, xw, pw) = mode.widths();
        return done(Amp {
            mode,
            d: c.a(0, dw)?,
            x: c.a(1, xw)?,
            p: c.a(2, pw)?,
        });
    }
    if let Some(kind) = LdStKind::ALL
        .iter()
        .copied()
        .find(|o| o.mnemonic() == mnemonic)
    {
        c.count(5)?;
        let pace = c.imm_in(4, 0, 63)? as u8;
        return done(LdSt {
            kind,
            d: c.a(0, kind.dest_width())?,
            s: c.a(1, 2)?,
            base: c.m(2)?,
            stride: c.m(3)?,
            pace,
        });
    }
    match mnemonic {
        "nop" => {
            c.count(0)?;
            done(Nop)
        }
        "mov" => {
            c.count(2)?;
            match (&operands[0], &operands[1]) {
                (Operand::M(d), Operand::M(a)) => done(Alu {
                    op: AluOp::Or,
                    d: *d,
                    a: *a,
                    b: MZERO,
                }),
                (Operand::A(d), Operand::M(a)) => done(MovToA { d: *d, a: *a }),
                (Operand::M(d), Operand::A(a)) => done(MovToM { d: *d, a: *a }),
                (Operand::A(d), Operand::A(a)) => done(Shuf {
                    op: ShufOp::Mov,
                    d: *d,
                    a: *a,
                    b: *a,
                }),
                _ => Err(c.err("expects two registers")),
            }
        }
        "mov64" | "f16v4bcast" | "f32v2bcast" | "pack16lo" | "pack16hi" => {
            let op = ShufOp::ALL
                .iter()
                .copied()
                .find(|o| o.mnemonic() == mnemonic)
                .unwrap();
            let (dw, sw, two) = op.shape();
            if two {
                c.count(3)?;
                done(Shuf {
                    op,
                    d: c.a(0, dw)?,
                    a: c.a(1, sw)?,
                    b: c.a(2, sw)?,
                })
            } else {
                c.count(2)?;
                let a = c.a(1, sw)?;
                done(Shuf {
                    op,
                    d: c.a(0, dw)?,
                    a,
                    b: a,
                })
            }
        }
        "setzi" | "sethi" => {
            c.count(2)?;
            let d = match &operands[0] {
                Operand::M(m) => Reg::M(*m),
                Operand::A(a) => Reg::A(*a),
                o => {
                    let other = Shown(o);
                    return Err(c.err(format!("operand 1 must be a register, got {other}")));
                }
            };
            let mk = |imm: u32| {
                if mnemonic == "setzi" {
                    Setzi { d, imm }
                } else {
                    Sethi { d, imm }
                }
            };
            match &operands[1] {
                Operand::Imm(v) => {
                    if !(0..=IMM20_MAX as i64).contains(v) {
                        return Err(
                            c.err(format!("immediate {v:#x} does not fit 20 unsigned bits"))
                        );
                    }
                    done(mk(*v as u32))
                }
                Operand::Symbol { name, addend } if mnemonic == "setzi" => with(
                    mk(0),
                    Some(Fixup {
                        kind: RelocKind::Abs20,
                        symbol: name.clone(),
                        addend: *addend,
                    }),
                ),
                o => {
                    let other = Shown(o);
                    Err(c.err(format!(
                        "operand 2 must be a 20-bit integer or (setzi) a symbol, got {other}"
                    )))
                }
            }
        }
        "get" => {
            c.count(2)?;
            let sreg = match &operands[1] {
                Operand::Symbol { name, addend: 0 } => {
                    SpecialReg::ALL.iter().copied().find(|s| s.name() == name)
                }
                Operand::Imm(v) => SpecialReg::ALL.get(*v as usize).copied(),
                _ => None,
            }
            .ok_or_else(|| {
                c.err("operand 2 must be tile_id, context_id, cycle_lo, cycle_hi or bsp_step")
            })?;
            done(Get { d: c.m(0)?, sreg })
        }
        "setseed" => {
            c.count(2)?;
            done(SetSeed {
                a: c.m(0)?,
                b: c.m(1)?,
            })
        }
        "ld16" | "ld32" | "ld64" | "ld128" => {
            c.count(2)?;
            let addr = c.mem(1)?;
            let (kind, d) = match (mnemonic, &operands[0]) {
                ("ld32", Operand::M(m)) => (LoadKind::M32, Reg::M(*m)),
                ("ld32", _) => (LoadKind::A32, Reg::A(c.a(0, 1)?)),
                ("ld16", _) => (LoadKind::A16, Reg::A(c.a(0, 1)?)),
                ("ld64", _) => (LoadKind::A64, Reg::A(c.a(0, 2)?)),
                _ => (LoadKind::A128, Reg::A(c.a(0, 4)?)),
            };
            done(Load { kind, d, addr })
        }
        "st16" | "st32" | "st64" => {
            c.count(2)?;
            let addr = c.mem(1)?;
            let (kind, s) = match (mnemonic, &operands[0]) {
                ("st32", Operand::M(m)) => (StoreKind::M32, Reg::M(*m)),
                ("st32", _) => (StoreKind::A32, Reg::A(c.a(0, 1)?)),
                ("st16", _) => (StoreKind::A16, Reg::A(c.a(0, 1)?)),
                _ => (StoreKind::A64, Reg::A(c.a(0, 2)?)),
            };
            done(Store { kind, s, addr })
        }
        "br" => {
            c.count(1)?;
            if let Operand::M(a) = operands[0] {
                return done(Br { a });
            }
            let (offset, f) = c.target(0)?;
            with(BrRel { offset }, f)
        }
        "ret" => {
            c.count(0)?;
            done(Br { a: LR })
        }
        "call" => {
            c.count(1)?;
            if let Operand::M(a) = operands[0] {
                return done(CallReg { a });
            }
            let (offset, f) = c.target(0)?;
            with(Call { offset }, f)
        }
        "brz" | "brnz" | "brnzdec" => {
            c.count(2)?;
            let a = c.m(0)?;
            let (offset, f) = c.target(1)?;
            let i = match mnemonic {
                "brz" => Brz { a, offset },
                "brnz" => Brnz { a, offset },
                _ => Brnzdec { a, offset },
            };
            with(i, f)
        }
        "rpt" => {
            c.count(2)?;
            let len = c.imm_in(1, 1, crate::encode::RPT_MAX as i64)? as u16;
            match &operands[0] {
                Operand::M(count) => done(Rpt { count: *count, len }),
                _ => done(RptImm {
                    count: c.imm_in(0, 0, crate::encode::RPT_MAX as i64)? as u16,
                    len,
                }),
            }
        }
        "exit" | "wsync" | "sync" | "hsync" | "xend" | "ampclr" => {
            c.count(0)?;
            done(match mnemonic {
                "exit" => Exit,
                "wsync" => Wsync,
                "sync" => Sync,
                "hsync" => Hsync,
                "xend" => Xend,
                _ => AmpClr,
            })
        }
        "run" => {
            c.count(2)?;
            done(Run {
                entry: c.m(0)?,
                state: c.m(1)?,
            })
        }
        "xsend" => {
            c.count(3)?;
            done(Xsend {
                addr: c.m(0)?,
                words: c.m(1)?,
                start: c.m(2)?,
            })
        }
        "xrecv" => {
            c.count(4)?;
            done(Xrecv {
                addr: c.m(0)?,
                words: c.m(1)?,
                src: c.m(2)?,
                start: c.m(3)?,
            })
        }
        "xtab" => {
            c.count(2)?;
            done(Xtab {
                table: c.m(0)?,
                count: c.m(1)?,
            })
        }
        "ampw" => {
            c.count(2)?;
            done(AmpW {
                a: c.a(0, 4)?,
                index: c.imm_in(1, 0, 255)? as u8,
            })
        }
        "ampscale" => {
            c.count(1)?;
            done(AmpScale {
                scale: c.imm_in(0, -128, 127)? as i8,
            })
        }
        _ => Err(IsaError::UnknownMnemonic(mnemonic.to_string())),
    }
}
