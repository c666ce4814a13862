//! The linked tile image: what a loader writes into one tile's SRAM.

use crate::codec::{Reader, Writer};
use crate::object::SymbolKind;
use crate::FormatError;
use ipu_arch::{Region, SRAM_BASE, SRAM_END};
use std::collections::BTreeMap;

/// First bytes of every tile image file.
pub const IMAGE_MAGIC: [u8; 8] = *b"IPUIMG\0\0";
/// Version of the image format.
pub const IMAGE_VERSION: u32 = 1;

/// Bytes to load at `address` (bss is materialised as zeros). The linker's
/// images and the package's tile members (`ipu_package::TileImage`) both
/// hold these, checked by [`check_layout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub address: u32,
    pub bytes: Vec<u8>,
}

impl Segment {
    /// One past the last address.
    pub fn end(&self) -> u64 {
        self.address as u64 + self.bytes.len() as u64
    }
}

/// The layout rules every loadable tile image keeps, whatever its file
/// format: segments non-empty, inside tile SRAM, sorted and disjoint; the
/// entry pc 4-byte aligned, in region 0 (the only region instructions are
/// fetched from) and with its instruction inside one segment. The error
/// names the segment or the entry pc.
pub fn check_layout(entry_pc: u32, segments: &[Segment]) -> Result<(), String> {
    let mut previous_end = 0u64;
    for (i, s) in segments.iter().enumerate() {
        if s.bytes.is_empty() {
            return Err(format!("segment {i} is empty"));
        }
        if s.address < SRAM_BASE || s.end() > SRAM_END as u64 {
            return Err(format!(
                "segment {i} at {:#07x}..{:#07x} lies outside tile SRAM {SRAM_BASE:#07x}..{SRAM_END:#07x}",
                s.address,
                s.end()
            ));
        }
        if (s.address as u64) < previous_end {
            return Err(format!(
                "segment {i} at {:#07x} starts before the previous segment ends at {previous_end:#07x} (segments must be sorted and disjoint)",
                s.address
            ));
        }
        previous_end = s.end();
    }
    let why = if !entry_pc.is_multiple_of(4) {
        "is not 4-byte aligned"
    } else if Region::of(entry_pc) != Some(Region::Standard) {
        "is outside region 0, the only region instructions are fetched from"
    } else if !segments
        .iter()
        .any(|s| s.address <= entry_pc && entry_pc as u64 + 4 <= s.end())
    {
        "lies in no segment"
    } else {
        return Ok(());
    };
    Err(format!("entry pc {entry_pc:#07x} {why}"))
}

/// One entry of the image's symbol map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSymbol {
    pub address: u32,
    pub size: u32,
    pub kind: SymbolKind,
}

/// A linked tile program. Segments are sorted by address, non-empty, do not
/// overlap and lie inside tile SRAM; the entry lies in region 0 inside a
/// segment. The symbol map holds every global symbol of the linked objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileImage {
    pub entry: u32,
    pub segments: Vec<Segment>,
    pub symbols: BTreeMap<String, ImageSymbol>,
}

impl TileImage {
    /// The address of a symbol.
    pub fn symbol(&self, name: &str) -> Option<u32> {
        self.symbols.get(name).map(|s| s.address)
    }

    /// `len` bytes at `address` if a single segment holds them all.
    pub fn bytes_at(&self, address: u32, len: u32) -> Option<&[u8]> {
        self.segments.iter().find_map(|s| {
            let start = address.checked_sub(s.address)? as usize;
            s.bytes.get(start..start.checked_add(len as usize)?)
        })
    }

    /// Total bytes loaded.
    pub fn loaded_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes.len() as u64).sum()
    }

    /// The symbol whose [address, address + size) holds `address` (for
    /// fault reports); the nearest preceding symbol when none covers it.
    pub fn symbolize(&self, address: u32) -> Option<(&str, u32)> {
        let mut best: Option<(&str, u32)> = None;
        for (name, s) in &self.symbols {
            if s.address <= address && best.is_none_or(|(_, a)| address - s.address < address - a) {
                best = Some((name, s.address));
            }
        }
        best.map(|(n, a)| (n, address - a))
    }

    pub fn validate(&self) -> Result<(), FormatError> {
        check(self).map_err(|m| FormatError::invalid("tile image", m))
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        self.validate()?;
        let mut w = Writer::default();
        w.bytes.extend_from_slice(&IMAGE_MAGIC);
        w.u32(IMAGE_VERSION);
        w.u32(self.entry);
        w.u32(self.segments.len() as u32);
        for s in &self.segments {
            w.u32(s.address);
            w.blob(&s.bytes);
        }
        w.u32(self.symbols.len() as u32);
        for (name, s) in &self.symbols {
            w.str(name);
            w.u32(s.address);
            w.u32(s.size);
            w.u8(match s.kind {
                SymbolKind::NoType => 0,
                SymbolKind::Function => 1,
                SymbolKind::Data => 2,
            });
        }
        Ok(w.bytes)
    }

    /// Reads and validates an image; never panics.
    pub fn from_bytes(bytes: &[u8]) -> Result<TileImage, FormatError> {
        let mut r = Reader::new("tile image", bytes);
        if r.take(8, "magic")? != IMAGE_MAGIC {
            return Err(r.err(0, "bad magic (not an ipu21 tile image)"));
        }
        let version = r.u32("version")?;
        if version != IMAGE_VERSION {
            return Err(r.err(
                8,
                format!("unsupported version {version} (this toolchain reads {IMAGE_VERSION})"),
            ));
        }
        let entry = r.u32("entry")?;
        let n = r.count("segment count", 8)?;
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            let address = r.u32("segment address")?;
            let at = r.pos;
            let bytes = r.blob("segment bytes")?;
            if bytes.len() as u64 > (SRAM_END - SRAM_BASE) as u64 {
                return Err(r.err(at, "segment larger than tile memory"));
            }
            segments.push(Segment {
                address,
                bytes: bytes.to_vec(),
            });
        }
        let n = r.count("symbol count", 13)?;
        let mut symbols = BTreeMap::new();
        for _ in 0..n {
            let at = r.pos;
            let name = r.str("symbol name")?;
            let address = r.u32("symbol address")?;
            let size = r.u32("symbol size")?;
            let kat = r.pos;
            let kind = match r.u8("symbol kind")? {
                0 => SymbolKind::NoType,
                1 => SymbolKind::Function,
                2 => SymbolKind::Data,
                k => return Err(r.err(kat, format!("symbol `{name}`: unknown kind {k}"))),
            };
            if let Some(prev) = symbols.keys().next_back() {
                if *prev >= name {
                    return Err(r.err(at, format!("symbol `{name}` out of order or repeated")));
                }
            }
            symbols.insert(
                name,
                ImageSymbol {
                    address,
                    size,
                    kind,
                },
            );
        }
        r.finish()?;
        let image = TileImage {
            entry,
            segments,
            symbols,
        };
        check(&image).map_err(|m| FormatError::at("tile image", 0, m))?;
        Ok(image)
    }
}

fn check(img: &TileImage) -> Result<(), String> {
    check_layout(img.entry, &img.segments)?;
    for (name, s) in &img.symbols {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("symbol name {name:?} is empty or has spaces"));
        }
        if (s.address as u64) < SRAM_BASE as u64
            || s.address as u64 + s.size as u64 > SRAM_END as u64
        {
            return Err(format!(
                "symbol `{name}` [{:#x}, +{}) lies outside tile SRAM",
                s.address, s.size
            ));
        }
    }
    Ok(())
}
