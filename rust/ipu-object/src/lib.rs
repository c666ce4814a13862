//! Relocatable ipu21 objects, kernel metadata and linked tile images.
//!
//! This crate is the data boundary between the assembler (`ipu-asm`), the
//! linker (`ipu-link`), the kernel cache (`ipu-kcache`) and every consumer of
//! linked code (simulator, package writer, runtime). It owns three formats,
//! documented in docs/object-format.md:
//!
//! - [`Object`] (`kernel.o`): sections, symbols and relocations, written by
//!   [`Object::to_bytes`] and read back by [`Object::from_bytes`].
//! - [`KernelMetadata`] (`kernel.json`): what a kernel source declared and
//!   what the assembler measured.
//! - [`TileImage`] (`tile.img`): placed segments, the entry address and the
//!   symbol map, written by [`TileImage::to_bytes`] and read by
//!   [`TileImage::from_bytes`].
//!
//! Invariants:
//! - Serialisation is deterministic: equal values give byte-identical output
//!   (all collections are ordered; no hash-map order reaches an output).
//! - The readers validate every field and never panic on any input; errors
//!   name the byte offset and the field at fault. Every value a reader
//!   accepts passes [`Object::validate`] / [`TileImage::validate`], and every
//!   value those accept round-trips through its binary format unchanged.
//! - Relocation kinds are those of `ipu-isa` ([`RelocKind`]); this crate never
//!   patches instruction words itself.

mod codec;
mod dump;
mod image;
mod metadata;
mod object;

pub use dump::dump_object;
pub use image::{check_layout, ImageSymbol, Segment, TileImage, IMAGE_MAGIC, IMAGE_VERSION};
pub use ipu_isa::RelocKind;
pub use metadata::{KernelMetadata, RegistersUsed};
pub use object::{
    Binding, Object, RegionConstraint, Relocation, Section, SectionKind, Symbol, SymbolKind,
    OBJECT_MAGIC, OBJECT_VERSION,
};

use std::fmt;

/// The version string of the toolchain (assembler, linker and formats). It is
/// part of every kernel-cache key, so bump it whenever generated code or a
/// format changes.
pub const TOOLCHAIN_VERSION: &str = "ipu-toolchain 0.1.1";

/// Why an object or image is malformed. `offset` is the byte offset in the
/// input where the problem was found (for readers), or `None` for a value
/// built in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatError {
    /// What was being read or checked, e.g. "object", "tile image".
    pub what: &'static str,
    /// Byte offset in the input, when reading bytes.
    pub offset: Option<usize>,
    /// The problem, naming the field, section, symbol or value at fault.
    pub message: String,
}

impl FormatError {
    pub(crate) fn at(what: &'static str, offset: usize, message: impl Into<String>) -> Self {
        FormatError {
            what,
            offset: Some(offset),
            message: message.into(),
        }
    }
    pub(crate) fn invalid(what: &'static str, message: impl Into<String>) -> Self {
        FormatError {
            what,
            offset: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(o) => write!(f, "invalid {} at byte {o:#x}: {}", self.what, self.message),
            None => write!(f, "invalid {}: {}", self.what, self.message),
        }
    }
}

impl std::error::Error for FormatError {}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory is written, flushed and renamed over `path`, so readers see
/// either the old file or the complete new one.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{nanos}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
