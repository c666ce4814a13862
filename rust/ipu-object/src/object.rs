//! The relocatable object: what one assembly produces and the linker consumes.

use crate::codec::{Reader, Writer};
use crate::FormatError;
use ipu_arch::TILE_SRAM_BYTES;
use ipu_isa::RelocKind;
use std::collections::BTreeSet;

/// First bytes of every object file.
pub const OBJECT_MAGIC: [u8; 8] = *b"IPUOBJ\0\0";
/// Version of the object format this crate reads and writes.
pub const OBJECT_VERSION: u32 = 1;

/// Largest section alignment an object may request.
const MAX_ALIGN: u32 = 1 << 16;
/// Section index that marks an undefined symbol in the binary format.
const UNDEFINED: u32 = u32::MAX;

/// What a section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionKind {
    /// Bundles only (the linker checks that every word decodes).
    Code,
    /// Initialised data.
    Data,
    /// Zero-initialised data: a size, no bytes.
    Bss,
}

/// Where the linker may place a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegionConstraint {
    /// Wherever the linker puts data by default (standard memory).
    Any,
    /// Region 0 (standard memory); code must be here.
    Standard,
    /// Region 1 (interleaved memory), e.g. operands of 128-bit loads.
    Interleaved,
}

/// Visibility of a symbol across objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Binding {
    Local,
    Global,
}

/// What a symbol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SymbolKind {
    /// Unknown (undefined references).
    NoType,
    Function,
    Data,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub kind: SectionKind,
    /// Power of two, at least 4 for code.
    pub align: u32,
    pub region: RegionConstraint,
    /// Size in bytes (for code and data equal to `bytes.len()`).
    pub size: u32,
    /// Contents; empty for bss.
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    /// Index of the defining section, `None` for an undefined (external) symbol.
    pub section: Option<u32>,
    pub offset: u32,
    pub binding: Binding,
    pub kind: SymbolKind,
    pub size: u32,
}

/// A patch of the 32-bit word at `offset` of `section` with the address of
/// `symbol` (an index into [`Object::symbols`]) plus `addend`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocation {
    pub section: u32,
    pub offset: u32,
    pub kind: RelocKind,
    pub symbol: u32,
    pub addend: i64,
}

/// A relocatable object. Relocations are sorted by (section, offset).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Object {
    pub sections: Vec<Section>,
    pub symbols: Vec<Symbol>,
    pub relocations: Vec<Relocation>,
}

fn kind_code(k: SectionKind) -> u8 {
    match k {
        SectionKind::Code => 0,
        SectionKind::Data => 1,
        SectionKind::Bss => 2,
    }
}
fn region_code(r: RegionConstraint) -> u8 {
    match r {
        RegionConstraint::Any => 0,
        RegionConstraint::Standard => 1,
        RegionConstraint::Interleaved => 2,
    }
}
fn binding_code(b: Binding) -> u8 {
    match b {
        Binding::Local => 0,
        Binding::Global => 1,
    }
}
fn symkind_code(k: SymbolKind) -> u8 {
    match k {
        SymbolKind::NoType => 0,
        SymbolKind::Function => 1,
        SymbolKind::Data => 2,
    }
}
fn reloc_code(k: RelocKind) -> u8 {
    match k {
        RelocKind::Abs20 => 0,
        RelocKind::PcRel20 => 1,
        RelocKind::Abs32 => 2,
    }
}

impl std::fmt::Display for SectionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SectionKind::Code => "code",
            SectionKind::Data => "data",
            SectionKind::Bss => "bss",
        })
    }
}

impl std::fmt::Display for RegionConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RegionConstraint::Any => "any",
            RegionConstraint::Standard => "region0",
            RegionConstraint::Interleaved => "region1",
        })
    }
}

impl Object {
    /// The index of the symbol called `name`.
    pub fn symbol_index(&self, name: &str) -> Option<usize> {
        self.symbols.iter().position(|s| s.name == name)
    }

    /// The section called `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// Checks every structural rule of the format (see docs/object-format.md).
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |m: String| FormatError::invalid("object", m);
        let mut names = BTreeSet::new();
        for (i, s) in self.sections.iter().enumerate() {
            check_section(s).map_err(|m| bad(format!("section {i} `{}`: {m}", s.name)))?;
            if !names.insert(s.name.as_str()) {
                return Err(bad(format!("section name `{}` appears twice", s.name)));
            }
        }
        let mut names = BTreeSet::new();
        for (i, s) in self.symbols.iter().enumerate() {
            check_symbol(s, &self.sections)
                .map_err(|m| bad(format!("symbol {i} `{}`: {m}", s.name)))?;
            if !names.insert(s.name.as_str()) {
                return Err(bad(format!("symbol name `{}` appears twice", s.name)));
            }
        }
        let mut previous: Option<(u32, u32)> = None;
        for (i, r) in self.relocations.iter().enumerate() {
            check_relocation(r, &self.sections, self.symbols.len())
                .map_err(|m| bad(format!("relocation {i}: {m}")))?;
            if let Some(p) = previous {
                if p >= (r.section, r.offset) {
                    return Err(bad(format!(
                        "relocation {i}: not sorted by (section, offset) or two patch one word (section {}, offset {:#x})",
                        r.section, r.offset
                    )));
                }
            }
            previous = Some((r.section, r.offset));
        }
        Ok(())
    }

    /// Serialises the object after validating it, so that no invalid object
    /// is ever written.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        self.validate()?;
        let mut w = Writer::default();
        w.bytes.extend_from_slice(&OBJECT_MAGIC);
        w.u32(OBJECT_VERSION);
        w.u32(self.sections.len() as u32);
        for s in &self.sections {
            w.str(&s.name);
            w.u8(kind_code(s.kind));
            w.u8(region_code(s.region));
            w.u32(s.align);
            w.u32(s.size);
            w.blob(&s.bytes);
        }
        w.u32(self.symbols.len() as u32);
        for s in &self.symbols {
            w.str(&s.name);
            w.u32(s.section.unwrap_or(UNDEFINED));
            w.u32(s.offset);
            w.u8(binding_code(s.binding));
            w.u8(symkind_code(s.kind));
            w.u32(s.size);
        }
        w.u32(self.relocations.len() as u32);
        for r in &self.relocations {
            w.u32(r.section);
            w.u32(r.offset);
            w.u8(reloc_code(r.kind));
            w.u32(r.symbol);
            w.i64(r.addend);
        }
        Ok(w.bytes)
    }

    /// Reads and validates an object. Never panics; errors give the byte
    /// offset of the field at fault.
    pub fn from_bytes(bytes: &[u8]) -> Result<Object, FormatError> {
        let mut r = Reader::new("object", bytes);
        let magic = r.take(8, "magic")?;
        if magic != OBJECT_MAGIC {
            return Err(r.err(0, "bad magic (not an ipu21 object)"));
        }
        let version = r.u32("version")?;
        if version != OBJECT_VERSION {
            return Err(r.err(
                8,
                format!("unsupported version {version} (this toolchain reads {OBJECT_VERSION})"),
            ));
        }
        let mut obj = Object::default();
        // Minimum encoded sizes per entry bound the counts before allocation.
        let n = r.count("section count", 18)?;
        for i in 0..n {
            let at = r.pos;
            let name = r.str("section name")?;
            let kat = r.pos;
            let kind = match r.u8("section kind")? {
                0 => SectionKind::Code,
                1 => SectionKind::Data,
                2 => SectionKind::Bss,
                k => return Err(r.err(kat, format!("section {i} `{name}`: unknown kind {k}"))),
            };
            let rat = r.pos;
            let region = match r.u8("section region")? {
                0 => RegionConstraint::Any,
                1 => RegionConstraint::Standard,
                2 => RegionConstraint::Interleaved,
                k => return Err(r.err(rat, format!("section {i} `{name}`: unknown region {k}"))),
            };
            let align = r.u32("section alignment")?;
            let size = r.u32("section size")?;
            let bytes = r.blob("section bytes")?.to_vec();
            let s = Section {
                name,
                kind,
                align,
                region,
                size,
                bytes,
            };
            check_section(&s).map_err(|m| r.err(at, format!("section {i} `{}`: {m}", s.name)))?;
            if obj.sections.iter().any(|o| o.name == s.name) {
                return Err(r.err(at, format!("section name `{}` appears twice", s.name)));
            }
            obj.sections.push(s);
        }
        let n = r.count("symbol count", 18)?;
        for i in 0..n {
            let at = r.pos;
            let name = r.str("symbol name")?;
            let section = match r.u32("symbol section")? {
                UNDEFINED => None,
                s => Some(s),
            };
            let offset = r.u32("symbol offset")?;
            let bat = r.pos;
            let binding = match r.u8("symbol binding")? {
                0 => Binding::Local,
                1 => Binding::Global,
                b => return Err(r.err(bat, format!("symbol {i} `{name}`: unknown binding {b}"))),
            };
            let kat = r.pos;
            let kind = match r.u8("symbol kind")? {
                0 => SymbolKind::NoType,
                1 => SymbolKind::Function,
                2 => SymbolKind::Data,
                k => return Err(r.err(kat, format!("symbol {i} `{name}`: unknown kind {k}"))),
            };
            let size = r.u32("symbol size")?;
            let s = Symbol {
                name,
                section,
                offset,
                binding,
                kind,
                size,
            };
            check_symbol(&s, &obj.sections)
                .map_err(|m| r.err(at, format!("symbol {i} `{}`: {m}", s.name)))?;
            obj.symbols.push(s);
        }
        let mut names = BTreeSet::new();
        for s in &obj.symbols {
            if !names.insert(s.name.as_str()) {
                return Err(r.err(0, format!("symbol name `{}` appears twice", s.name)));
            }
        }
        let n = r.count("relocation count", 21)?;
        for i in 0..n {
            let at = r.pos;
            let section = r.u32("relocation section")?;
            let offset = r.u32("relocation offset")?;
            let kat = r.pos;
            let kind = match r.u8("relocation kind")? {
                0 => RelocKind::Abs20,
                1 => RelocKind::PcRel20,
                2 => RelocKind::Abs32,
                k => return Err(r.err(kat, format!("relocation {i}: unknown kind {k}"))),
            };
            let symbol = r.u32("relocation symbol")?;
            let addend = r.i64("relocation addend")?;
            let rel = Relocation {
                section,
                offset,
                kind,
                symbol,
                addend,
            };
            check_relocation(&rel, &obj.sections, obj.symbols.len())
                .map_err(|m| r.err(at, format!("relocation {i}: {m}")))?;
            if let Some(p) = obj.relocations.last() {
                if (p.section, p.offset) >= (section, offset) {
                    return Err(r.err(
                        at,
                        format!(
                            "relocation {i}: not sorted by (section, offset) or two patch one word"
                        ),
                    ));
                }
            }
            obj.relocations.push(rel);
        }
        r.finish()?;
        Ok(obj)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn check_section(s: &Section) -> Result<(), String> {
    if !valid_name(&s.name) {
        return Err("name is empty or has spaces or control characters".into());
    }
    if !s.align.is_power_of_two() || s.align > MAX_ALIGN {
        return Err(format!(
            "alignment {} is not a power of two up to {MAX_ALIGN}",
            s.align
        ));
    }
    if s.size > TILE_SRAM_BYTES {
        return Err(format!(
            "size {} exceeds tile memory ({TILE_SRAM_BYTES} bytes)",
            s.size
        ));
    }
    match s.kind {
        SectionKind::Bss => {
            if !s.bytes.is_empty() {
                return Err("bss section carries bytes".into());
            }
        }
        _ => {
            if s.bytes.len() != s.size as usize {
                return Err(format!(
                    "size {} but {} bytes of contents",
                    s.size,
                    s.bytes.len()
                ));
            }
        }
    }
    if s.kind == SectionKind::Code && (!s.size.is_multiple_of(4) || s.align < 4) {
        return Err("code size must be a multiple of 4 and alignment at least 4".into());
    }
    Ok(())
}

fn check_symbol(s: &Symbol, sections: &[Section]) -> Result<(), String> {
    if !valid_name(&s.name) {
        return Err("name is empty or has spaces or control characters".into());
    }
    match s.section {
        None => {
            if s.binding != Binding::Global || s.offset != 0 || s.size != 0 {
                return Err("an undefined symbol must be global with offset 0 and size 0".into());
            }
        }
        Some(i) => {
            let sec = sections
                .get(i as usize)
                .ok_or_else(|| format!("section index {i} out of range"))?;
            if s.offset as u64 + s.size as u64 > sec.size as u64 {
                return Err(format!(
                    "offset {:#x} + size {} beyond the end of section `{}` ({} bytes)",
                    s.offset, s.size, sec.name, sec.size
                ));
            }
        }
    }
    Ok(())
}

fn check_relocation(r: &Relocation, sections: &[Section], symbols: usize) -> Result<(), String> {
    let sec = sections
        .get(r.section as usize)
        .ok_or_else(|| format!("section index {} out of range", r.section))?;
    if sec.kind == SectionKind::Bss {
        return Err(format!("patches bss section `{}`", sec.name));
    }
    if !r.offset.is_multiple_of(4) || r.offset as u64 + 4 > sec.size as u64 {
        return Err(format!(
            "offset {:#x} is not a 4-aligned word inside section `{}` ({} bytes)",
            r.offset, sec.name, sec.size
        ));
    }
    if r.symbol as usize >= symbols {
        return Err(format!("symbol index {} out of range", r.symbol));
    }
    if r.kind == RelocKind::PcRel20 && sec.kind != SectionKind::Code {
        return Err(format!(
            "PcRel20 relocation in non-code section `{}`",
            sec.name
        ));
    }
    Ok(())
}
