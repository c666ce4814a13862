//! A small program builder over [`Instruction`], for tests and tools that need
//! machine code before (or without) the assembler. It lays bundles out from a
//! base address, resolves labels through the same relocations a linker uses,
//! and returns the little-endian bytes.

use crate::instr::{Bundle, Instruction};
use crate::parse::{apply_relocation, assemble_instruction, parse_operand, Fixup, RelocKind};
use crate::IsaError;
use std::collections::BTreeMap;

/// Builds a code image starting at `base`.
#[derive(Clone, Debug)]
pub struct ProgramBuilder {
    base: u32,
    words: Vec<u32>,
    labels: BTreeMap<String, u32>,
    fixups: Vec<(usize, Fixup)>,
}

impl ProgramBuilder {
    pub fn new(base: u32) -> ProgramBuilder {
        ProgramBuilder {
            base,
            words: Vec::new(),
            labels: BTreeMap::new(),
            fixups: Vec::new(),
        }
    }

    /// Address of the next bundle.
    pub fn here(&self) -> u32 {
        self.base + 4 * self.words.len() as u32
    }

    /// Defines `name` at the current address (an error if already defined).
    pub fn label(&mut self, name: &str) -> Result<&mut Self, IsaError> {
        if self.labels.insert(name.to_string(), self.here()).is_some() {
            return Err(IsaError::BadSyntax {
                mnemonic: name.into(),
                reason: "label defined twice".into(),
            });
        }
        Ok(self)
    }

    /// Defines a label at an external address (data symbols, other images).
    pub fn define(&mut self, name: &str, address: u32) -> &mut Self {
        self.labels.insert(name.to_string(), address);
        self
    }

    /// Appends a bundle.
    pub fn bundle(&mut self, b: Bundle) -> Result<&mut Self, IsaError> {
        self.words.extend(crate::encode::encode_bundle(&b)?);
        Ok(self)
    }

    /// Appends a single instruction.
    pub fn ins(&mut self, i: Instruction) -> Result<&mut Self, IsaError> {
        self.bundle(Bundle::Single(i))
    }

    /// Appends a main-slot and an arithmetic-slot instruction as one bundle.
    pub fn pair(&mut self, main: Instruction, arith: Instruction) -> Result<&mut Self, IsaError> {
        self.bundle(Bundle::Pair { main, arith })
    }

    fn assemble_text(&self, text: &str) -> Result<(Instruction, Option<Fixup>), IsaError> {
        let text = text.trim();
        let (m, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        let ops = rest
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(parse_operand)
            .collect::<Result<Vec<_>, _>>()?;
        let a = assemble_instruction(m, &ops)?;
        Ok((a.instruction, a.fixup))
    }

    /// Appends one line of assembly: an instruction or `{ main ; arith }`.
    /// Symbol operands refer to labels of this builder.
    pub fn asm(&mut self, line: &str) -> Result<&mut Self, IsaError> {
        let t = line.trim();
        if let Some(inner) = t.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let (m, a) = inner.split_once(';').ok_or_else(|| IsaError::BadSyntax {
                mnemonic: t.into(),
                reason: "bundle needs `main ; arith`".into(),
            })?;
            let (mi, mf) = self.assemble_text(m)?;
            let (ai, af) = self.assemble_text(a)?;
            let at = self.words.len();
            self.pair(mi, ai)?;
            if let Some(f) = mf {
                self.fixups.push((at, f));
            }
            if let Some(f) = af {
                self.fixups.push((at + 1, f));
            }
        } else {
            let (i, f) = self.assemble_text(t)?;
            let at = self.words.len();
            self.ins(i)?;
            if let Some(f) = f {
                self.fixups.push((at, f));
            }
        }
        Ok(self)
    }

    /// Appends several lines (blank lines and `#` comments are skipped;
    /// `name:` defines a label).
    pub fn asm_block(&mut self, text: &str) -> Result<&mut Self, IsaError> {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_suffix(':') {
                self.label(name.trim())?;
            } else {
                self.asm(line)?;
            }
        }
        Ok(self)
    }

    /// Appends a raw 32-bit data word.
    pub fn word(&mut self, w: u32) -> &mut Self {
        self.words.push(w);
        self
    }

    /// Resolves labels and returns the little-endian image.
    pub fn finish(&self) -> Result<Vec<u8>, IsaError> {
        let mut words = self.words.clone();
        for (at, f) in &self.fixups {
            let target = *self
                .labels
                .get(&f.symbol)
                .ok_or_else(|| IsaError::UndefinedSymbol(f.symbol.clone()))?;
            let place = self.base + 4 * *at as u32;
            words[*at] = apply_relocation(f.kind, words[*at], place, target as i64 + f.addend)?;
        }
        Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    /// The address of a label.
    pub fn address_of(&self, name: &str) -> Option<u32> {
        self.labels.get(name).copied()
    }
}

/// Relocation kinds re-exported for builder users.
pub type Reloc = RelocKind;
