//! The ipu21 tile instruction set.
//!
//! This crate is the single definition of the machine code that the
//! assembler emits and the simulator executes: the [`Instruction`] and
//! [`Bundle`] types, their 32-bit binary encoding ([`encode_word`],
//! [`decode_word`], [`encode_bundle`], [`decode_bundle`]), disassembly
//! (`Display`), operand parsing and instruction assembly for the assembler
//! ([`parse_operand`], [`assemble_instruction`]), relocations
//! ([`RelocKind`], [`apply_relocation`]), issue costs
//! ([`Instruction::issue_slots`]) and the number formats ([`numerics`]).
//! docs/isa.md is the reference manual.
//!
//! Invariants:
//! - `decode_word(encode_word(i)?) == Ok(i)` for every valid instruction,
//!   and every word that decodes re-encodes to itself (one meaning per word).
//! - Costs never let a program beat docs/machine-model.md: one bundle per
//!   context per 6 tile cycles, AMP MACs per instruction such that six busy
//!   workers reach exactly the model's peak, 64-bit vector data paths.
//! - No function here panics on user input; errors name the offending
//!   mnemonic, operand or word.

pub mod build;
mod display;
mod encode;
mod instr;
pub mod numerics;
mod parse;
mod reg;

pub use encode::{
    decode_bundle, decode_bundle_bytes, decode_word, encode_bundle, encode_bundle_bytes,
    encode_word, AMPW_CHUNKS, BRANCH_OFFSET_RANGE, IMM20_MAX, PAIR_BIT, RPT_MAX,
};
pub use instr::*;
pub use parse::{
    apply_relocation, assemble_instruction, parse_bundle, parse_instruction, parse_int,
    parse_operand, Assembled, Fixup, MemMode, Operand, RelocKind,
};
pub use reg::{AReg, MReg, Reg, LR, MZERO};

use std::fmt;

/// One line of a disassembly listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisasmLine {
    pub address: u32,
    /// The words of the bundle (or the single undecodable word).
    pub words: Vec<u32>,
    /// The bundle, or why the word does not decode.
    pub bundle: Result<Bundle, IsaError>,
}

impl fmt::Display for DisasmLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex: Vec<String> = self.words.iter().map(|w| format!("{w:08x}")).collect();
        write!(f, "{:#07x}: {:<18}", self.address, hex.join(" "))?;
        match &self.bundle {
            Ok(b) => write!(f, " {b}"),
            Err(e) => write!(f, " <{e}>"),
        }
    }
}

/// Disassembles little-endian code starting at address `base`. A word that
/// does not decode becomes one error line and decoding continues with the
/// next word, so data mixed into code does not stop the listing.
pub fn disassemble(bytes: &[u8], base: u32) -> Vec<DisasmLine> {
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let address = base + 4 * i as u32;
        match decode_bundle(&words[i..]) {
            Ok((b, n)) => {
                out.push(DisasmLine {
                    address,
                    words: words[i..i + n].to_vec(),
                    bundle: Ok(b),
                });
                i += n;
            }
            Err(e) => {
                out.push(DisasmLine {
                    address,
                    words: vec![words[i]],
                    bundle: Err(e),
                });
                i += 1;
            }
        }
    }
    out
}

/// Errors of encoding, decoding, parsing and relocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IsaError {
    /// An instruction value whose operands cannot be encoded.
    BadOperand { instruction: String, reason: String },
    /// Operand text that does not parse.
    BadOperandText { text: String, reason: String },
    /// Operands that do not fit the mnemonic.
    BadSyntax { mnemonic: String, reason: String },
    /// A mnemonic that the ISA does not define.
    UnknownMnemonic(String),
    /// An invalid bundle (slot classes, register write conflicts).
    BadBundle(String),
    /// A word that is not an instruction.
    IllegalInstruction { word: u32, reason: &'static str },
    /// A bundle cut off by the end of the input.
    Truncated,
    /// A relocation whose value does not fit its field.
    RelocationOverflow {
        kind: RelocKind,
        value: i64,
        reason: &'static str,
    },
    /// A label or symbol that is never defined.
    UndefinedSymbol(String),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::BadOperand {
                instruction,
                reason,
            } => write!(f, "cannot encode {instruction}: {reason}"),
            IsaError::BadOperandText { text, reason } => {
                write!(f, "bad operand `{text}`: {reason}")
            }
            IsaError::BadSyntax { mnemonic, reason } => write!(f, "`{mnemonic}`: {reason}"),
            IsaError::UnknownMnemonic(m) => write!(f, "unknown mnemonic `{m}`"),
            IsaError::BadBundle(r) => write!(f, "invalid bundle: {r}"),
            IsaError::IllegalInstruction { word, reason } => {
                write!(f, "illegal instruction word {word:#010x}: {reason}")
            }
            IsaError::Truncated => write!(f, "bundle truncated: its second word is missing"),
            IsaError::RelocationOverflow {
                kind,
                value,
                reason,
            } => {
                write!(f, "relocation {kind:?} with value {value:#x}: {reason}")
            }
            IsaError::UndefinedSymbol(s) => write!(f, "undefined symbol `{s}`"),
        }
    }
}

impl std::error::Error for IsaError {}
