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
//! region instructions are fetched from) and its instruction inside a
//! segment (the layout rules of the linker's images too,
//! [`ipu_object::check_layout`], which both formats share with their
//! [`Segment`] type); nothing follows the last segment.
//!
//! This member format differs from the linker's `tile.img` (ipu-object) in
//! what it carries: the tile number, and no symbol map (a package's symbols
//! are in `symbols.json`, where tiles with the same map share one entry).

use std::fmt;

/// The first eight bytes of every tile image.
pub const IMAGE_MAGIC: &[u8; 8] = b"IPUTIMG\0";
/// The tile image format version this crate reads and writes.
pub const IMAGE_VERSION: u16 = 1;
const HEADER_BYTES: usize = 24;

/// Bytes to place at one SRAM address: the linker's segment type, so that
/// a linked image's segments move into the package as they are.
pub use ipu_object::Segment;

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
    /// The segments or the entry pc break a layout rule
    /// ([`ipu_object::check_layout`], shared with the linker's images).
    Layout(String),
    /// Padding bytes are not zero.
    NonZeroPadding {
        /// The segment index.
        index: usize,
    },
    /// Bytes after the last segment.
    TrailingBytes(usize),
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::Truncated { field, offset } => {
                write!(
                    f,
                    "truncated: the image ends inside {field} at byte {offset}"
                )
            }
            ImageError::BadMagic => write!(f, "bad magic (expected \"IPUTIMG\\0\")"),
            ImageError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "unsupported tile image version {v} (this reader supports {IMAGE_VERSION})"
                )
            }
            ImageError::ReservedFlags(x) => write!(f, "reserved flags {x:#06x} are set"),
            ImageError::Layout(why) => write!(f, "{why}"),
            ImageError::NonZeroPadding { index } => {
                write!(f, "segment {index} has non-zero padding")
            }
            ImageError::TrailingBytes(n) => {
                write!(f, "{n} unexpected bytes after the last segment")
            }
        }
    }
}

impl std::error::Error for ImageError {}

impl TileImage {
    /// Checks the invariants listed in the module documentation.
    pub fn validate(&self) -> Result<(), ImageError> {
        ipu_object::check_layout(self.entry_pc, &self.segments).map_err(ImageError::Layout)
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
