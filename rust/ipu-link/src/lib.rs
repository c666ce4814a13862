//! The ipu21 linker: relocatable [`Object`]s to one [`TileImage`].
//!
//! Steps, each in its own function: build the global symbol table (duplicate
//! definitions are errors), find the live sections from the entry and kept
//! symbols (dead-section removal; undefined symbols are reported only when a
//! live section needs them), place sections by region, apply relocations with
//! `ipu_isa::apply_relocation`, check the result (every code word decodes),
//! and build the image and its map.
//!
//! Placement: code and region-0 data are laid out from `base` (region 0);
//! data without a region constraint follows them, or starts at `data_base`
//! when given; region-1 (interleaved) sections start at `interleaved_base`.
//! Within an area, sections keep input order (object, then section), data
//! before bss. Bss is materialised as zero bytes in the image.
//!
//! Invariants: the output is deterministic (input order only, no hash
//! maps); code is never placed outside region 0; a linked image always passes
//! [`TileImage::validate`]; errors name the objects, sections, offsets,
//! symbols and regions at fault.

use ipu_arch::{Region, REGION0_BASE, REGION0_END, REGION1_BASE, REGION1_END, SRAM_BASE, SRAM_END};
use ipu_isa::{apply_relocation, decode_bundle_bytes, RelocKind, PAIR_BIT};
pub use ipu_object::TileImage;
use ipu_object::{
    Binding, ImageSymbol, Object, RegionConstraint, SectionKind, Segment, SymbolKind,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fmt::Write as _;

/// One input object and the name used for it in messages (its path).
#[derive(Clone, Debug)]
pub struct Input {
    pub name: String,
    pub object: Object,
}

#[derive(Clone, Debug)]
pub struct LinkOptions {
    /// The entry symbol (a global code symbol).
    pub entry: String,
    /// More symbols whose sections must be kept.
    pub keep: Vec<String>,
    /// Start of code (region 0).
    pub base: u32,
    /// Start of unconstrained data; `None` places it after code.
    pub data_base: Option<u32>,
    /// Start of interleaved (region-1) sections.
    pub interleaved_base: u32,
    /// Remove sections not reachable from the entry and kept symbols.
    pub gc_sections: bool,
}

impl LinkOptions {
    pub fn new(entry: &str) -> Self {
        LinkOptions {
            entry: entry.to_string(),
            keep: Vec::new(),
            base: REGION0_BASE,
            data_base: None,
            interleaved_base: REGION1_BASE,
            gc_sections: true,
        }
    }
}

/// A section named by object and section name, for messages.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SectionRef {
    pub object: String,
    pub section: String,
}

impl fmt::Display for SectionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.object, self.section)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkError {
    NoInputs,
    UndefinedEntry {
        symbol: String,
    },
    UndefinedSymbol {
        symbol: String,
        at: SectionRef,
        offset: u32,
    },
    DuplicateSymbol {
        symbol: String,
        first: String,
        second: String,
    },
    CodeOutsideRegion0 {
        at: SectionRef,
    },
    BadAddress {
        what: &'static str,
        address: u32,
        reason: String,
    },
    RegionOverflow {
        area: String,
        needed: u64,
        available: u64,
        largest: Vec<(SectionRef, u32)>,
    },
    Overlap {
        first: String,
        second: String,
    },
    RelocationOutOfRange {
        at: SectionRef,
        offset: u32,
        kind: RelocKind,
        symbol: String,
        value: i64,
        reason: String,
    },
    InvalidCode {
        at: SectionRef,
        offset: u32,
        reason: String,
    },
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LinkError::*;
        match self {
            NoInputs => write!(f, "no input objects"),
            UndefinedEntry { symbol } => write!(f, "entry symbol `{symbol}` is not defined by any object (or is not global)"),
            UndefinedSymbol { symbol, at, offset } => write!(f, "undefined symbol `{symbol}` referenced from {at} at offset {offset:#x}"),
            DuplicateSymbol { symbol, first, second } => write!(f, "duplicate symbol `{symbol}`: defined in {first} and in {second}"),
            CodeOutsideRegion0 { at } => write!(f, "code section {at} requests region 1, but instructions are fetched from region 0 only"),
            BadAddress { what, address, reason } => write!(f, "{what} {address:#x}: {reason}"),
            RegionOverflow { area, needed, available, largest } => {
                write!(f, "{area} overflows: {needed} bytes needed, {available} available; largest sections:")?;
                for (s, n) in largest {
                    write!(f, " {s} {n} bytes;")?;
                }
                Ok(())
            }
            Overlap { first, second } => write!(f, "{first} overlaps {second}"),
            RelocationOutOfRange { at, offset, kind, symbol, value, reason } => write!(f, "relocation {kind:?} at {at}+{offset:#x} to `{symbol}` (value {value:#x}): {reason}"),
            InvalidCode { at, offset, reason } => write!(f, "code section {at} at offset {offset:#x} does not decode after relocation: {reason}"),
        }
    }
}

impl std::error::Error for LinkError {}

/// Where one live section went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub at: SectionRef,
    pub kind: SectionKind,
    pub address: u32,
    pub size: u32,
}

/// The result of a link: the image plus what the map file shows.
#[derive(Clone, Debug)]
pub struct Linked {
    pub image: TileImage,
    pub placements: Vec<Placement>,
    pub discarded: Vec<(SectionRef, u32)>,
    pub entry_symbol: String,
}

type SecId = (usize, usize);

fn sref(inputs: &[Input], (o, s): SecId) -> SectionRef {
    SectionRef {
        object: inputs[o].name.clone(),
        section: inputs[o].object.sections[s].name.clone(),
    }
}

/// Global definitions: name -> (object, symbol index).
fn global_table(inputs: &[Input]) -> Result<BTreeMap<&str, (usize, usize)>, LinkError> {
    let mut globals: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (o, inp) in inputs.iter().enumerate() {
        for (i, s) in inp.object.symbols.iter().enumerate() {
            if s.binding != Binding::Global || s.section.is_none() {
                continue;
            }
            if let Some((po, _)) = globals.insert(&s.name, (o, i)) {
                return Err(LinkError::DuplicateSymbol {
                    symbol: s.name.clone(),
                    first: inputs[po].name.clone(),
                    second: inp.name.clone(),
                });
            }
        }
    }
    Ok(globals)
}

/// The defining (object, section, offset) of symbol `sym` as seen from object `o`.
fn resolve(
    inputs: &[Input],
    globals: &BTreeMap<&str, (usize, usize)>,
    o: usize,
    sym: u32,
) -> Option<(usize, usize, u32)> {
    let s = &inputs[o].object.symbols[sym as usize];
    let (o, s) = match s.section {
        Some(_) => (o, s),
        None => {
            let (go, gi) = *globals.get(s.name.as_str())?;
            (go, &inputs[go].object.symbols[gi])
        }
    };
    Some((o, s.section? as usize, s.offset))
}

/// Live sections: reachable through relocations from the roots.
fn live_sections(
    inputs: &[Input],
    globals: &BTreeMap<&str, (usize, usize)>,
    opts: &LinkOptions,
) -> Result<BTreeSet<SecId>, LinkError> {
    let mut live = BTreeSet::new();
    let mut work: Vec<SecId> = Vec::new();
    let root = |name: &str| -> Result<SecId, LinkError> {
        let (o, i) = globals.get(name).ok_or_else(|| LinkError::UndefinedEntry {
            symbol: name.to_string(),
        })?;
        Ok((
            *o,
            inputs[*o].object.symbols[*i]
                .section
                .expect("globals are defined") as usize,
        ))
    };
    work.push(root(&opts.entry)?);
    for k in &opts.keep {
        work.push(root(k)?);
    }
    if !opts.gc_sections {
        for (o, inp) in inputs.iter().enumerate() {
            work.extend((0..inp.object.sections.len()).map(|s| (o, s)));
        }
    }
    while let Some(id) = work.pop() {
        if !live.insert(id) {
            continue;
        }
        let (o, s) = id;
        for r in inputs[o]
            .object
            .relocations
            .iter()
            .filter(|r| r.section as usize == s)
        {
            match resolve(inputs, globals, o, r.symbol) {
                Some((to, ts, _)) => work.push((to, ts)),
                None => {
                    return Err(LinkError::UndefinedSymbol {
                        symbol: inputs[o].object.symbols[r.symbol as usize].name.clone(),
                        at: sref(inputs, id),
                        offset: r.offset,
                    })
                }
            }
        }
    }
    Ok(live)
}

fn align_up(x: u64, a: u32) -> u64 {
    x.div_ceil(a as u64) * a as u64
}

struct Area {
    name: String,
    start: u32,
    limit: u32,
    sections: Vec<SecId>,
}

fn check_base(what: &'static str, address: u32, region: Option<Region>) -> Result<(), LinkError> {
    let bad = |reason: String| {
        Err(LinkError::BadAddress {
            what,
            address,
            reason,
        })
    };
    if !(SRAM_BASE..SRAM_END).contains(&address) {
        return bad(format!("outside tile SRAM [{SRAM_BASE:#x}, {SRAM_END:#x})"));
    }
    if !address.is_multiple_of(4) {
        return bad("not 4-byte aligned".into());
    }
    if let Some(r) = region {
        if Region::of(address) != Some(r) {
            let range = r.range();
            return bad(format!(
                "must lie in {r:?} memory [{:#x}, {:#x})",
                range.start, range.end
            ));
        }
    }
    Ok(())
}

/// Assigns addresses to live sections.
fn place(
    inputs: &[Input],
    live: &BTreeSet<SecId>,
    opts: &LinkOptions,
) -> Result<BTreeMap<SecId, u32>, LinkError> {
    check_base("--base", opts.base, Some(Region::Standard))?;
    check_base(
        "--interleaved-base",
        opts.interleaved_base,
        Some(Region::Interleaved),
    )?;
    if let Some(d) = opts.data_base {
        check_base("--data-base", d, None)?;
    }
    let mut main = Area {
        name: "region 0 (code and standard data)".into(),
        start: opts.base,
        limit: REGION0_END,
        sections: vec![],
    };
    let mut data = opts.data_base.map(|d| Area {
        name: format!("data area at {d:#x}"),
        start: d,
        limit: if Region::of(d) == Some(Region::Standard) {
            REGION0_END
        } else {
            REGION1_END
        },
        sections: vec![],
    });
    let mut inter = Area {
        name: "region 1 (interleaved)".into(),
        start: opts.interleaved_base,
        limit: REGION1_END,
        sections: vec![],
    };
    // Code first, then data, then bss within each area.
    for pass in [SectionKind::Code, SectionKind::Data, SectionKind::Bss] {
        for &(o, s) in live {
            let sec = &inputs[o].object.sections[s];
            if sec.kind != pass {
                continue;
            }
            let area = match (sec.kind, sec.region) {
                (SectionKind::Code, RegionConstraint::Interleaved) => {
                    return Err(LinkError::CodeOutsideRegion0 {
                        at: sref(inputs, (o, s)),
                    })
                }
                (SectionKind::Code, _) | (_, RegionConstraint::Standard) => &mut main,
                (_, RegionConstraint::Interleaved) => &mut inter,
                (_, RegionConstraint::Any) => data.as_mut().unwrap_or(&mut main),
            };
            area.sections.push((o, s));
        }
    }
    let mut addresses = BTreeMap::new();
    let mut spans = Vec::new();
    for area in [Some(&main), data.as_ref(), Some(&inter)]
        .into_iter()
        .flatten()
    {
        let mut at = area.start as u64;
        for &id in &area.sections {
            let sec = &inputs[id.0].object.sections[id.1];
            at = align_up(at, sec.align);
            addresses.insert(id, at as u32);
            at += sec.size as u64;
        }
        if at > area.limit as u64 {
            let mut largest: Vec<(SectionRef, u32)> = area
                .sections
                .iter()
                .map(|&id| (sref(inputs, id), inputs[id.0].object.sections[id.1].size))
                .collect();
            largest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            largest.truncate(3);
            return Err(LinkError::RegionOverflow {
                area: area.name.clone(),
                needed: at - area.start as u64,
                available: (area.limit - area.start) as u64,
                largest,
            });
        }
        if at > area.start as u64 {
            spans.push((area.name.clone(), area.start as u64, at));
        }
    }
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if a.1 < b.2 && b.1 < a.2 {
                return Err(LinkError::Overlap {
                    first: format!("{} [{:#x}, {:#x})", a.0, a.1, a.2),
                    second: format!("{} [{:#x}, {:#x})", b.0, b.1, b.2),
                });
            }
        }
    }
    Ok(addresses)
}

/// Links `inputs` into a tile image.
pub fn link(inputs: &[Input], opts: &LinkOptions) -> Result<Linked, LinkError> {
    if inputs.is_empty() {
        return Err(LinkError::NoInputs);
    }
    let globals = global_table(inputs)?;
    let live = live_sections(inputs, &globals, opts)?;
    let addresses = place(inputs, &live, opts)?;
    // Section contents, patched.
    let mut contents: BTreeMap<SecId, Vec<u8>> = BTreeMap::new();
    for &(o, s) in &live {
        let sec = &inputs[o].object.sections[s];
        let bytes = if sec.kind == SectionKind::Bss {
            vec![0; sec.size as usize]
        } else {
            sec.bytes.clone()
        };
        contents.insert((o, s), bytes);
    }
    for &(o, s) in &live {
        let base = addresses[&(o, s)];
        for r in inputs[o]
            .object
            .relocations
            .iter()
            .filter(|r| r.section as usize == s)
        {
            let (to, ts, toff) = resolve(inputs, &globals, o, r.symbol)
                .expect("resolved while marking live sections");
            let symbol = inputs[o].object.symbols[r.symbol as usize].name.clone();
            let value = addresses[&(to, ts)] as i64 + toff as i64 + r.addend;
            let bytes = contents.get_mut(&(o, s)).expect("live");
            let at = r.offset as usize;
            let word = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            let err = |reason: String| LinkError::RelocationOutOfRange {
                at: sref(inputs, (o, s)),
                offset: r.offset,
                kind: r.kind,
                symbol: symbol.clone(),
                value,
                reason,
            };
            if r.kind == RelocKind::PcRel20 && word & PAIR_BIT != 0 {
                return Err(err(
                    "PcRel20 patches a paired word, but control instructions are never paired"
                        .into(),
                ));
            }
            let patched = apply_relocation(r.kind, word, base + r.offset, value)
                .map_err(|e| err(e.to_string()))?;
            bytes[at..at + 4].copy_from_slice(&patched.to_le_bytes());
        }
    }
    // The checker: every live code section decodes completely.
    for (&id, bytes) in &contents {
        if inputs[id.0].object.sections[id.1].kind != SectionKind::Code {
            continue;
        }
        let mut off = 0;
        while off < bytes.len() {
            match decode_bundle_bytes(&bytes[off..]) {
                Ok((_, n)) => off += n,
                Err(e) => {
                    return Err(LinkError::InvalidCode {
                        at: sref(inputs, id),
                        offset: off as u32,
                        reason: e.to_string(),
                    })
                }
            }
        }
    }
    // Segments: sections in address order, adjacent ones merged.
    let mut placed: Vec<(u32, SecId)> = addresses.iter().map(|(id, a)| (*a, *id)).collect();
    placed.sort();
    let mut segments: Vec<Segment> = Vec::new();
    let mut placements = Vec::new();
    for (addr, id) in &placed {
        let sec = &inputs[id.0].object.sections[id.1];
        placements.push(Placement {
            at: sref(inputs, *id),
            kind: sec.kind,
            address: *addr,
            size: sec.size,
        });
        let bytes = &contents[id];
        if bytes.is_empty() {
            continue;
        }
        match segments.last_mut() {
            Some(last) if last.address as u64 + last.bytes.len() as u64 == *addr as u64 => {
                last.bytes.extend_from_slice(bytes)
            }
            _ => segments.push(Segment {
                address: *addr,
                bytes: bytes.clone(),
            }),
        }
    }
    let mut symbols = BTreeMap::new();
    for (name, (o, i)) in &globals {
        let s = &inputs[*o].object.symbols[*i];
        let sec = s.section.expect("globals are defined") as usize;
        if let Some(a) = addresses.get(&(*o, sec)) {
            symbols.insert(
                name.to_string(),
                ImageSymbol {
                    address: a + s.offset,
                    size: s.size,
                    kind: s.kind,
                },
            );
        }
    }
    let (eo, ei) = globals[opts.entry.as_str()];
    let entry_sym = &inputs[eo].object.symbols[ei];
    let entry_sec = &inputs[eo].object.sections[entry_sym.section.expect("defined") as usize];
    if entry_sec.kind != SectionKind::Code || entry_sym.kind == SymbolKind::Data {
        return Err(LinkError::BadAddress {
            what: "entry",
            address: symbols[&opts.entry].address,
            reason: format!("`{}` is not in a code section", opts.entry),
        });
    }
    let image = TileImage {
        entry: symbols[&opts.entry].address,
        segments,
        symbols,
    };
    image.validate().map_err(|e| LinkError::BadAddress {
        what: "image",
        address: image.entry,
        reason: e.to_string(),
    })?;
    let discarded = inputs
        .iter()
        .enumerate()
        .flat_map(|(o, inp)| (0..inp.object.sections.len()).map(move |s| (o, s)))
        .filter(|id| !live.contains(id))
        .map(|id| (sref(inputs, id), inputs[id.0].object.sections[id.1].size))
        .collect();
    Ok(Linked {
        image,
        placements,
        discarded,
        entry_symbol: opts.entry.clone(),
    })
}

impl Linked {
    /// The map file: placements, discarded sections, symbols and region use.
    pub fn map(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# ipu-ld map ({})", ipu_object::TOOLCHAIN_VERSION);
        let _ = writeln!(out, "entry {} {:#x}", self.entry_symbol, self.image.entry);
        let _ = writeln!(out, "\nsections:");
        for p in &self.placements {
            let region =
                Region::of(p.address).map_or("?".to_string(), |r| format!("{r:?}").to_lowercase());
            let _ = writeln!(
                out,
                "  {:#07x} {:>7} {:<4} {:<11} {}",
                p.address,
                p.size,
                p.kind.to_string(),
                region,
                p.at
            );
        }
        let _ = writeln!(out, "\ndiscarded:");
        for (s, n) in &self.discarded {
            let _ = writeln!(out, "  {s} {n} bytes");
        }
        let _ = writeln!(out, "\nsymbols:");
        let mut syms: Vec<_> = self.image.symbols.iter().collect();
        syms.sort_by_key(|(n, s)| (s.address, n.as_str()));
        for (n, s) in syms {
            let _ = writeln!(out, "  {:#07x} {:>7} {n}", s.address, s.size);
        }
        let _ = writeln!(out, "\nusage:");
        for r in [Region::Standard, Region::Interleaved] {
            let used: u64 = self
                .placements
                .iter()
                .filter(|p| Region::of(p.address) == Some(r))
                .map(|p| p.size as u64)
                .sum();
            let range = r.range();
            let _ = writeln!(
                out,
                "  {:<11} {used} of {} bytes",
                format!("{r:?}").to_lowercase(),
                range.end - range.start
            );
        }
        out
    }
}
