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

/// Bytes to load at `address` (bss is materialised as zeros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub address: u32,
    pub bytes: Vec<u8>,
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
    let mut end = 0u64;
    for (i, s) in img.segments.iter().enumerate() {
        let start = s.address as u64;
        let stop = start + s.bytes.len() as u64;
        if s.bytes.is_empty() {
            return Err(format!("segment {i} at {:#x} is empty", s.address));
        }
        if start < SRAM_BASE as u64 || stop > SRAM_END as u64 {
            return Err(format!(
                "segment {i} [{start:#x}, {stop:#x}) lies outside tile SRAM [{SRAM_BASE:#x}, {SRAM_END:#x})"
            ));
        }
        if start < end {
            return Err(format!(
                "segment {i} at {start:#x} overlaps or precedes the previous segment (which ends at {end:#x})"
            ));
        }
        end = stop;
    }
    if !img.entry.is_multiple_of(4) || Region::of(img.entry) != Some(Region::Standard) {
        return Err(format!(
            "entry {:#x} is not a 4-aligned region-0 address",
            img.entry
        ));
    }
    if img.bytes_at(img.entry, 4).is_none() {
        return Err(format!("entry {:#x} lies in no segment", img.entry));
    }
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
