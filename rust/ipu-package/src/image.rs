//! The per-tile image: what the loader writes into one tile's SRAM, and where
//! the tile starts executing.
//!
//! Binary layout, all integers little-endian (docs/package-format.md):
//!
//! ```text
//! offset  size  field
//! 0       8     magic "IPUTIMG\0"
//! 8       2     version (1)
//! 10      2     flags (0; reserved)
//! 12      4     tile
//! 16      4     entry pc
//! 20      4     segment count
//! 24      ...   segments: address u32, length u32, `length` bytes, then
//!               zero padding to a multiple of 4 bytes
//! ```
//!
//! Invariants: segments are non-empty, sorted by address, do not overlap and
//! lie inside tile SRAM; the entry pc is 4-byte aligned, in region 0 (the only
//! region instructions are fetched from) and inside a segment; nothing follows
//! the last segment.

use std::fmt;

use ipu_arch::{Region, SRAM_BASE, SRAM_END};

/// The first eight bytes of every tile image.
pub const IMAGE_MAGIC: &[u8; 8] = b"IPUTIMG\0";
/// The tile image format version this crate reads and writes.
pub const IMAGE_VERSION: u16 = 1;
const HEADER_BYTES: usize = 24;

/// Bytes to place at one SRAM address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First SRAM address.
    pub address: u32,
    /// Contents.
    pub bytes: Vec<u8>,
}

impl Segment {
    /// One past the last address.
    pub fn end(&self) -> u64 {
        self.address as u64 + self.bytes.len() as u64
    }
}

/// The image of one tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileImage {
    /// Tile number.
    pub tile: u32,
    /// Address of the first supervisor instruction.
    pub entry_pc: u32,
    /// Memory contents, sorted by address.
    pub segments: Vec<Segment>,
}

/// What is wrong with a tile image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageError {
    /// The data ends before a field it needs.
    Truncated {
        /// What was being read.
        field: String,
        /// Byte offset of that field.
        offset: usize,
    },
    /// The magic is not `IPUTIMG\0`.
    BadMagic,
    /// Another version.
    UnsupportedVersion(u16),
    /// Reserved flags are set.
    ReservedFlags(u16),
    /// A segment has no bytes.
    EmptySegment {
        /// Its index.
        index: usize,
    },
    /// A segment lies (partly) outside SRAM.
    OutOfSram {
        /// Its index.
        index: usize,
        /// First address.
        address: u32,
        /// One past the last.
        end: u64,
    },
    /// Segments out of order or overlapping.
    Overlap {
        /// The later segment's index.
        index: usize,
        /// Its address.
        address: u32,
        /// Where the previous segment ends.
        previous_end: u64,
    },
    /// Padding bytes are not zero.
    NonZeroPadding {
        /// The segment index.
        index: usize,
    },
    /// Bytes after the last segment.
    TrailingBytes(usize),
    /// The entry pc is misaligned, outside region 0 or outside every segment.
    BadEntry {
        /// The entry pc.
        entry_pc: u32,
        /// Why.
        reason: &'static str,
    },
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::Truncated { field, offset } => {
                write!(f, "truncated: the image ends inside {field} at byte {offset}")
            }
            ImageError::BadMagic => write!(f, "bad magic (expected \"IPUTIMG\\0\")"),
            ImageError::UnsupportedVersion(v) => {
                write!(f, "unsupported tile image version {v} (this reader supports {IMAGE_VERSION})")
            }
            ImageError::ReservedFlags(x) => write!(f, "reserved flags {x:#06x} are set"),
            ImageError::EmptySegment { index } => write!(f, "segment {index} is empty"),
            ImageError::OutOfSram { index, address, end } => write!(
                f,
                "segment {index} at {address:#07x}..{end:#07x} lies outside tile SRAM {SRAM_BASE:#07x}..{SRAM_END:#07x}"
            ),
            ImageError::Overlap {
                index,
                address,
                previous_end,
            } => write!(
                f,
                "segment {index} at {address:#07x} starts before the previous segment ends at {previous_end:#07x} (segments must be sorted and disjoint)"
            ),
            ImageError::NonZeroPadding { index } => write!(f, "segment {index} has non-zero padding"),
            ImageError::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the last segment"),
            ImageError::BadEntry { entry_pc, reason } => write!(f, "entry pc {entry_pc:#07x} {reason}"),
        }
    }
}

impl std::error::Error for ImageError {}

impl TileImage {
    /// Checks the invariants listed in the module documentation.
    pub fn validate(&self) -> Result<(), ImageError> {
        let mut previous_end = 0u64;
        for (index, s) in self.segments.iter().enumerate() {
            if s.bytes.is_empty() {
                return Err(ImageError::EmptySegment { index });
            }
            if s.address < SRAM_BASE || s.end() > SRAM_END as u64 {
                return Err(ImageError::OutOfSram {
                    index,
                    address: s.address,
                    end: s.end(),
                });
            }
            if (s.address as u64) < previous_end {
                return Err(ImageError::Overlap {
                    index,
                    address: s.address,
                    previous_end,
                });
            }
            previous_end = s.end();
        }
        let pc = self.entry_pc;
        let reason = if !pc.is_multiple_of(4) {
            Some("is not 4-byte aligned")
        } else if Region::of(pc) != Some(Region::Standard) {
            Some("is outside region 0, the only region instructions are fetched from")
        } else if !self
            .segments
            .iter()
            .any(|s| (s.address as u64..s.end()).contains(&(pc as u64)))
        {
            Some("lies in no segment")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(ImageError::BadEntry {
                entry_pc: pc,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// The binary encoding; the image must be valid.
    pub fn encode(&self) -> Result<Vec<u8>, ImageError> {
        self.validate()?;
        let mut out = Vec::with_capacity(
            HEADER_BYTES
                + self
                    .segments
                    .iter()
                    .map(|s| 8 + s.bytes.len() + 3)
                    .sum::<usize>(),
        );
        out.extend_from_slice(IMAGE_MAGIC);
        out.extend(IMAGE_VERSION.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out.extend(self.tile.to_le_bytes());
        out.extend(self.entry_pc.to_le_bytes());
        out.extend((self.segments.len() as u32).to_le_bytes());
        for s in &self.segments {
            out.extend(s.address.to_le_bytes());
            out.extend((s.bytes.len() as u32).to_le_bytes());
            out.extend(&s.bytes);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        Ok(out)
    }

    /// Decodes and validates an image.
    pub fn decode(data: &[u8]) -> Result<TileImage, ImageError> {
        let mut r = Reader { data, pos: 0 };
        let magic = r.take(8, "the magic")?;
        if magic != IMAGE_MAGIC {
            return Err(ImageError::BadMagic);
        }
        let version = u16::from_le_bytes(r.take(2, "the version")?.try_into().expect("2 bytes"));
        if version != IMAGE_VERSION {
            return Err(ImageError::UnsupportedVersion(version));
        }
        let flags = u16::from_le_bytes(r.take(2, "the flags")?.try_into().expect("2 bytes"));
        if flags != 0 {
            return Err(ImageError::ReservedFlags(flags));
        }
        let tile = r.u32("the tile number")?;
        let entry_pc = r.u32("the entry pc")?;
        let count = r.u32("the segment count")?;
        let mut segments = Vec::new();
        for index in 0..count as usize {
            let address = r.u32(&format!("segment {index}'s address"))?;
            let length = r.u32(&format!("segment {index}'s length"))? as usize;
            let bytes = r
                .take(length, &format!("segment {index}'s {length} bytes"))?
                .to_vec();
            let padding = length.next_multiple_of(4) - length;
            if r.take(padding, &format!("segment {index}'s padding"))?
                .iter()
                .any(|&b| b != 0)
            {
                return Err(ImageError::NonZeroPadding { index });
            }
            segments.push(Segment { address, bytes });
        }
        if r.pos != data.len() {
            return Err(ImageError::TrailingBytes(data.len() - r.pos));
        }
        let image = TileImage {
            tile,
            entry_pc,
            segments,
        };
        image.validate()?;
        Ok(image)
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], ImageError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| ImageError::Truncated {
            field: field.to_string(),
            offset: self.pos,
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self, field: &str) -> Result<u32, ImageError> {
        Ok(u32::from_le_bytes(
            self.take(4, field)?.try_into().expect("4 bytes"),
        ))
    }
}
